"""Spark's static data source lookup: ``spark.read.format("segstore")`` without ``register()``.

On its first data source lookup Spark imports every top-level ``pyspark_*`` module it can find
and registers its ``DefaultSource`` under ``DefaultSource.name()`` (SPARK-45917). Importing
this module only imports the source class; pyarrow and the store load inside the tasks.
"""

from segstore.spark.source import SegstoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
