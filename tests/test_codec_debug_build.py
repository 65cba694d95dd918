"""Which build of the compiled core is under test.

``make test`` runs the byte-level suites a second time against the debug build (Cython bounds,
wraparound and initialization checks on) with ``PYTHONPATH=build/debug SEGSTORE_EXPECT_DEBUG=1``.
This guards that run: it must really import the debug extension, and the normal run must not.
"""

import os
from pathlib import Path

import pytest

from segstore import _core

EXPECT_DEBUG = os.environ.get("SEGSTORE_EXPECT_DEBUG", "") not in ("", "0")
DEBUG_DIR = Path(__file__).resolve().parent.parent / "build" / "debug"


def test_build_flavour_is_the_expected_one():
    assert _core.DEBUG_BUILD is EXPECT_DEBUG


def test_extension_location_matches_the_flavour():
    location = Path(_core.__file__).resolve()
    assert (DEBUG_DIR in location.parents) is EXPECT_DEBUG, location


EXPECT_ASAN = os.environ.get("SEGSTORE_EXPECT_ASAN", "") not in ("", "0")
ASAN_DIR = Path(__file__).resolve().parent.parent / "build" / "asan"


def test_asan_run_imports_the_asan_build():
    """``make test-asan`` (``SEGSTORE_EXPECT_ASAN=1``) must really run the AddressSanitizer
    build from build/asan, not the optimized one beside the sources (an ASan build may also
    be made in place by hand: other runs assert nothing about it)."""
    if not EXPECT_ASAN:
        pytest.skip("not the ASan run")
    assert _core.ASAN_BUILD is True
    assert not _core.DEBUG_BUILD
    assert ASAN_DIR in Path(_core.__file__).resolve().parents, _core.__file__
