"""The row schema of Spark's Kafka source, which the segstore source reproduces exactly.

Columns (ECO §2.1): ``key binary, value binary, topic string, partition int, offset bigint,
timestamp timestamp, timestampType int`` and, only with ``includeHeaders=true``,
``headers array<struct<key:string,value:binary>>``. Every field is nullable, as in the connector.
The Arrow types a ``read()`` must yield are what pyspark's ``to_arrow_schema`` derives from it:
binary with 32-bit offsets, ``timestamp[us, UTC]``, int32 partition and timestampType.
"""

from __future__ import annotations

from .options import InvalidOptionError

KAFKA_DDL = ("key binary, value binary, topic string, partition int, offset bigint, "
             "timestamp timestamp, timestampType int")
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"
COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")


def kafka_schema(include_headers: bool):
    """The ``StructType`` of the source: Kafka's columns, plus ``headers`` when asked for."""
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                                   StructField, StructType, TimestampType)

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def check_schema(schema, include_headers: bool) -> None:
    """Reject a user-specified schema: like Kafka's source, segstore's schema is fixed."""
    expected = kafka_schema(include_headers)
    if schema is None or schema == expected:
        return
    raise InvalidOptionError(
        "the segstore source has a fixed schema (Spark's Kafka source schema) and does not "
        f"accept a user-specified schema: expected <{expected.simpleString()}>, got "
        f"<{schema.simpleString()}>. Remove .schema(...) and select or cast columns after "
        "load()" + ("; add .option('includeHeaders', 'true') for the headers column"
                    if not include_headers and "headers" in schema.fieldNames() else ""))


def arrow_schema(include_headers: bool):
    """The exact ``pyarrow.Schema`` Spark expects of every batch ``read()`` yields."""
    from .features import to_arrow_schema

    return to_arrow_schema(kafka_schema(include_headers))
