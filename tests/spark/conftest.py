"""Spark tests: one shared ``local[2]`` session for the whole run (JVM start-up is the cost).

Every test in this directory is marked ``spark``. Workers run the interpreter running pytest
(``PYSPARK_PYTHON``), so they import this checkout's segstore, pyarrow and numpy.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need pyspark (pip install .[spark])")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.spark)

# The shared ``spark`` session fixture lives in tests/conftest.py (docs examples use it too).
