"""Spark tests: one shared ``local[2]`` session for the whole run (JVM start-up is the cost).

Every test in this directory is marked ``spark``. Workers run the interpreter running pytest
(``PYSPARK_PYTHON``), so they import this checkout's segstore, pyarrow and numpy.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need pyspark (pip install .[spark])")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    """The shared SparkSession (local[2], no UI, 2 shuffle partitions)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("segstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
