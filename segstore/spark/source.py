"""``SegstoreDataSource``: the ``segstore`` format for Spark (batch and streaming, read and write).

Spark builds one instance per query from the options (never override ``__init__``), asks it for
the schema and for readers and writers in short-lived planning workers, and pickles those to the
tasks. Every method here only validates options and returns plain-data objects.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from .features import FILTER_PUSHDOWN, PYSPARK_VERSION
from .options import InvalidOptionError, ReadOptions, WriteOptions
from .schema import check_schema, kafka_schema


class SegstoreDataSource(DataSource):
    """Spark's Kafka source and sink, over a segstore directory instead of a broker.

    ``spark.read.format("segstore").option("subscribe", "t").load(path)`` gives Kafka's row
    schema; ``df.write.format("segstore").mode("append").save(path)`` appends exactly once;
    ``readStream`` / ``writeStream`` work the same way. See ``docs/spark.md`` for every option.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``segstore``."""
        return "segstore"

    def _include_headers(self) -> bool:
        # Spark's options mapping is case-insensitive; a plain dict (tests, direct use) may not be.
        raw = {k.lower(): v for k, v in dict(self.options).items()}.get("includeheaders", "false")
        value = str(raw).strip().lower()
        if value not in ("true", "false"):
            raise InvalidOptionError(
                f"option 'includeHeaders' must be 'true' or 'false', got {raw!r}")
        return value == "true"

    def schema(self):
        """Kafka's source schema (with ``headers`` only when ``includeHeaders`` is true)."""
        return kafka_schema(self._include_headers())

    def reader(self, schema):
        """A batch reader; the pushdown variant with ``pushFilters=true``."""
        from .reader import SegstorePushdownReader, SegstoreReader

        opts = ReadOptions.parse(self.options, streaming=False)
        check_schema(schema, opts.include_headers)
        if opts.push_filters and not FILTER_PUSHDOWN:
            raise InvalidOptionError(
                "option 'pushFilters' needs filter pushdown for Python data sources, which "
                f"pyspark 4.1 added; this is pyspark {PYSPARK_VERSION}. Remove the option: "
                "Spark then applies every filter itself")
        return SegstorePushdownReader(opts) if opts.push_filters else SegstoreReader(opts)

    def streamReader(self, schema):
        """A micro-batch stream reader with admission control and ``Trigger.AvailableNow``."""
        from .stream import SegstoreStreamReader

        opts = ReadOptions.parse(self.options, streaming=True)
        check_schema(schema, opts.include_headers)
        if opts.push_filters:
            raise InvalidOptionError("option 'pushFilters' applies to batch reads only")
        return SegstoreStreamReader(opts)

    def writer(self, schema, overwrite: bool):
        """An exactly-once batch writer (``mode("append")``; overwrite is refused)."""
        from .writer import SegstoreWriter, check_input_schema, check_topic

        if overwrite:
            raise InvalidOptionError(
                "mode('overwrite') is not supported: a segstore topic is an append-only log. "
                "Use mode('append'); to replace a topic's contents, delete and recreate the "
                "topic with segstore first")
        opts = WriteOptions.parse(self.options, streaming=False)
        layout = check_input_schema(schema, opts)
        return SegstoreWriter(opts, layout, check_topic(opts))

    def streamWriter(self, schema, overwrite: bool):
        """A streaming writer that commits each micro-batch exactly once, even on replay."""
        from .writer import check_input_schema, check_topic, make_stream_writer

        # overwrite: output mode 'complete'. Like Kafka's sink (whose truncate() does
        # nothing), each micro-batch's whole result table is appended to the log.
        opts = WriteOptions.parse(self.options, streaming=True)
        layout = check_input_schema(schema, opts)
        check_topic(opts)
        return make_stream_writer(opts, layout, schema)
