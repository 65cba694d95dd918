"""Which build of the compiled core is under test.

``make test`` runs the byte-level suites a second time against the debug build (Cython bounds,
wraparound and initialization checks on) with ``PYTHONPATH=build/debug SEGSTORE_EXPECT_DEBUG=1``.
This guards that run: it must really import the debug extension, and the normal run must not.
"""

import os
from pathlib import Path

from segstore import _core

EXPECT_DEBUG = os.environ.get("SEGSTORE_EXPECT_DEBUG", "") not in ("", "0")
DEBUG_DIR = Path(__file__).resolve().parent.parent / "build" / "debug"


def test_build_flavour_is_the_expected_one():
    assert _core.DEBUG_BUILD is EXPECT_DEBUG


def test_extension_location_matches_the_flavour():
    location = Path(_core.__file__).resolve()
    assert (DEBUG_DIR in location.parents) is EXPECT_DEBUG, location
