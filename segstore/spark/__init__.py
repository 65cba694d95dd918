"""segstore for PySpark: the ``segstore`` data source and distributed compaction.

``spark.read.format("segstore")`` works without any call here once segstore is installed (Spark
finds ``pyspark_segstore.DefaultSource``); :func:`register` registers the source explicitly,
e.g. on a session that looked up data sources before segstore was installed. Rows follow Spark's
Kafka source schema and options; writes are exactly-once (see ``docs/spark.md``).
"""

from __future__ import annotations

from .compact import compact
from .offsets import DataLossError
from .options import InvalidOptionError
from .source import SegstoreDataSource

__all__ = ["SegstoreDataSource", "register", "compact", "DataLossError", "InvalidOptionError"]


def register(spark) -> None:
    """Register the ``segstore`` format with ``spark`` (a SparkSession).

    Where Spark already found ``pyspark_segstore.DefaultSource`` (this same class), pyspark 4.0
    refuses to register the name again with ``DATA_SOURCE_ALREADY_EXISTS``; the format is then
    already there and nothing is left to do. Later versions replace the registration.
    """
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(SegstoreDataSource)
    except AnalysisException as e:
        # Only static registrations are refused (a second dynamic one replaces the first), and
        # the static module for this name is pyspark_segstore.
        if e.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
