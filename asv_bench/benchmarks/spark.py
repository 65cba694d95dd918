"""Spark integration: the ``segstore`` data source against the ceiling of any Python source/sink.

Data (the Spark issue's): 1,000,000 records with 16-byte keys and 100-byte values (the shared
``common.make_record_arrays`` bytes), in a topic of 2 partitions, one Spark task each
(``local[2]``). Targets, as same-run ratios ``baseline_time / segstore_time`` (unit "x"; 1.0
means equal throughput, so the target is a ratio of at least 0.8):

* ``spark.read.format("segstore")`` then ``count()`` and an aggregate (``count``,
  ``sum(length(value))``, ``max(offset)``) against a Python data source that yields the very
  same Arrow batches from memory: ``read()`` of the baseline memory-maps an Arrow IPC file of
  the batches segstore's reader produced (zero-copy, in the page cache), so its cost is only
  what every Python source pays (worker start, Arrow transfer to the JVM, Spark's work);
* ``df.write.format("segstore")`` of the same 1M records (cached in Spark) into a 4-partition
  topic, commit included (staging, append with offset assignment, fsync), against an Arrow
  writer that iterates its input and discards it. Before every timed write (either side) the
  page cache is synced, untimed, so no run pays for the previous run's writeback;
* (report) the same discarding writer against a raw file writer that writes the Arrow buffers
  it receives, untouched, as segstore's staging writes its files (4 MiB ``writev`` calls,
  writeback started every MiB, one ``fdatasync``), with no encoding and no commit: what
  putting 124 MB durably into files costs on the machine, the ceiling of the ratio above;
  and (report) segstore's writer against that raw file writer, the share of segstore's own
  work (routing, encoding, the commit).

Each ratio is the best of five interleaved runs after three untimed warm-up runs per side (the
JVM's JIT and Spark's Python workers settle over the first jobs). Every timed write starts from
a fresh store or directory, created untimed. The baselines are defined in this module and
pickled by value, so Spark's Python workers need no path to it.
The suite needs pyspark, pyarrow and Java; without them the benchmarks show "n/a".
"""

from __future__ import annotations

import os
import shutil
import sys

from .common import best_of_pair_fresh, make_record_arrays

N_RECORDS = 1_000_000
WARMUP_RUNS = 3
SOURCE_PARTITIONS = 2
SINK_PARTITIONS = 4
_STORE = "spark-store"


def _require_spark() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise NotImplementedError(f"pyspark/pyarrow missing: {exc}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise NotImplementedError("no Java runtime for Spark")


def spark_dataset_cache(_bench=None) -> dict:
    """asv ``setup_cache``: the 1M-record store and an Arrow IPC copy of its Spark batches."""
    _require_spark()
    import pyarrow as pa

    import segstore
    from segstore.columns import BinaryColumn
    from segstore.spark.reader import read_range
    from segstore.spark.schema import arrow_schema

    keys, values, timestamps = make_record_arrays(N_RECORDS)
    root = os.path.abspath(_STORE)
    shutil.rmtree(root, ignore_errors=True)
    half = N_RECORDS // SOURCE_PARTITIONS
    with segstore.open(root) as store:
        store.create_topic("bench", SOURCE_PARTITIONS, config={"segment.bytes": 64 << 20})
        for p in range(SOURCE_PARTITIONS):
            rows = slice(p * half, (p + 1) * half)
            store.partition("bench", p).append_columns(
                BinaryColumn.from_fixed(values[rows]), BinaryColumn.from_fixed(keys[rows]),
                timestamps[rows])
    ipc = []
    for p in range(SOURCE_PARTITIONS):
        path = os.path.abspath(f"spark-bench-{p}.arrow")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, arrow_schema(False)) as w:
            for batch in read_range(root, "bench", p, 0, half, include_headers=False,
                                    fail_on_data_loss=True):
                w.write_batch(batch)
        ipc.append(path)
    return {"store": root, "ipc": ipc, "n_records": N_RECORDS}


spark_dataset_cache.timeout = 900


def _baselines():
    """The in-memory source, the discarding sink and the raw file sink (classes built here,
    pickled by value)."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                        InputPartition, WriterCommitMessage)

    from segstore.spark.schema import kafka_schema

    class Done(WriterCommitMessage):
        pass

    class MemoryReader(DataSourceReader):
        def __init__(self, files):
            self.files = files

        def partitions(self):
            return [InputPartition(f) for f in self.files]

        def read(self, partition):
            import pyarrow as pa

            reader = pa.ipc.open_file(pa.memory_map(partition.value))
            return (reader.get_batch(i) for i in range(reader.num_record_batches))

    class DiscardWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return Done()

    class RawFileWriter(DataSourceArrowWriter):
        """The floor of any durable file sink: each task writes the Arrow buffers it receives,
        untouched, to one file in ``directory``, as segstore's staging writes (4 MiB
        ``writev`` calls, the writeback of every MiB started at once, one ``fdatasync`` at
        the end). No encoding, no routing, no commit."""

        def __init__(self, directory):
            self.directory = directory

        def write(self, iterator):
            import uuid

            # The staging's own writev loop and writeback start: the same I/O, nothing else.
            from segstore.spark.staging import (COALESCE_BYTES, WRITEBACK_BYTES, start_writeback,
                                                writev_all)

            fd = os.open(os.path.join(self.directory, uuid.uuid4().hex),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                pending, pending_bytes, written, started = [], 0, 0, 0
                for batch in iterator:
                    for column in batch.columns:
                        bufs = [memoryview(b).cast("B") for b in column.buffers() if b is not None]
                        pending.extend(bufs)
                        pending_bytes += sum(b.nbytes for b in bufs)
                    if pending_bytes >= COALESCE_BYTES:
                        writev_all(fd, pending)
                        written += pending_bytes
                        pending, pending_bytes = [], 0
                        if written - started >= WRITEBACK_BYTES:
                            start_writeback(fd, started, written - started)
                            started = written
                writev_all(fd, pending)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            return Done()

    class MemorySource(DataSource):
        """Yields pre-built Arrow batches from memory-mapped IPC files (option ``files``);
        writes discard their input, or with option ``rawDir`` go to :class:`RawFileWriter`."""

        @classmethod
        def name(cls):
            return "segstore_bench_memory"

        def schema(self):
            return kafka_schema(False)

        def reader(self, schema):
            return MemoryReader(self.options["files"].split(","))

        def writer(self, schema, overwrite):
            if "rawDir" in self.options:
                return RawFileWriter(self.options["rawDir"])
            return DiscardWriter()

    return MemorySource


def _session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import segstore.spark

    spark = (SparkSession.builder.master(f"local[{SOURCE_PARTITIONS}]")
             .appName("segstore-bench").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", str(SOURCE_PARTITIONS))
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    segstore.spark.register(spark)  # asv's working directory hides pyspark_segstore
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(_baselines())
    return spark


def _read_query(df) -> tuple:
    from pyspark.sql import functions as F

    n = df.count()
    row = df.agg(F.count("*"), F.sum(F.length("value")), F.max("offset")).collect()[0]
    return n, tuple(row)


class SparkRead:
    """``spark.read.format("segstore")`` + count + aggregate vs the in-memory ceiling; >= 0.8."""

    setup_cache = spark_dataset_cache
    unit = "x"
    timeout = 900
    repeats = 5

    def setup(self, meta):
        _require_spark()
        self.spark = _session()
        self.memory = (self.spark.read.format("segstore_bench_memory")
                       .option("files", ",".join(meta["ipc"])).load())
        self.segstore = (self.spark.read.format("segstore").option("subscribe", "bench")
                         .load(meta["store"]))
        # Warm-up (untimed: the JVM's JIT settles over the first few jobs) and the check that
        # both sides compute the same answer.
        for _ in range(WARMUP_RUNS):
            a, b = _read_query(self.memory), _read_query(self.segstore)
        if a != b or a[0] != meta["n_records"]:
            raise AssertionError(f"memory source {a} and segstore {b} disagree")

    def teardown(self, meta):
        self.spark.stop()

    def track_ratio_read_count_aggregate_vs_memory_source(self, meta):
        t_memory, t_segstore = best_of_pair_fresh(
            lambda: ((lambda: _read_query(self.memory)), None),
            lambda: ((lambda: _read_query(self.segstore)), None), self.repeats)
        return t_memory / t_segstore


class SparkWrite:
    """``df.write.format("segstore")`` (exactly-once commit) vs a discarding writer; >= 0.8."""

    setup_cache = spark_dataset_cache
    unit = "x"
    timeout = 900
    repeats = 5

    def setup(self, meta):
        _require_spark()
        self.spark = _session()
        self.df = (self.spark.read.format("segstore_bench_memory")
                   .option("files", ",".join(meta["ipc"])).load()
                   .select("key", "value").cache())
        if self.df.count() != meta["n_records"]:
            raise AssertionError("cached input has the wrong size")
        self.target = os.path.abspath("spark-sink")
        for _ in range(WARMUP_RUNS):  # untimed: the JVM's JIT settles over the first jobs
            self._discard()
            for make in (self._make_segstore, self._make_raw):
                run, cleanup = make()
                run()
                cleanup()

    def teardown(self, meta):
        self.df.unpersist()
        self.spark.stop()

    def _discard(self):
        self.df.write.format("segstore_bench_memory").mode("append").save()

    def _make_discard(self):
        os.sync()  # untimed: no run pays for the previous run's dirty-page writeback
        return self._discard, None

    def _make_segstore(self):
        import segstore

        shutil.rmtree(self.target, ignore_errors=True)
        with segstore.open(self.target) as store:
            store.create_topic("sink", SINK_PARTITIONS)
        os.sync()  # untimed, as for the baseline

        def run():
            (self.df.write.format("segstore").mode("append").option("topic", "sink")
             .save(self.target))

        def check():
            with segstore.open(self.target, readonly=True) as store:
                n = sum(store.partition("sink", p).log_end_offset for p in range(SINK_PARTITIONS))
            shutil.rmtree(self.target, ignore_errors=True)
            if n != N_RECORDS:
                raise AssertionError(f"the sink holds {n} records, not {N_RECORDS}")
        return run, check

    def _make_raw(self):
        raw = self.target + "-raw"
        shutil.rmtree(raw, ignore_errors=True)
        os.makedirs(raw)
        os.sync()  # untimed, as for the others

        def run():
            (self.df.write.format("segstore_bench_memory").mode("append").option("rawDir", raw)
             .save())

        def check():
            size = sum(os.path.getsize(os.path.join(raw, n)) for n in os.listdir(raw))
            shutil.rmtree(raw, ignore_errors=True)
            if size < N_RECORDS * 116:  # 16-byte keys, 100-byte values, plus offsets
                raise AssertionError(f"the raw sink wrote {size} bytes")
        return run, check

    def track_ratio_write_vs_discarding_writer(self, meta):
        t_discard, t_segstore = best_of_pair_fresh(self._make_discard, self._make_segstore,
                                                   self.repeats)
        return t_discard / t_segstore

    def track_ratio_raw_file_writer_vs_discarding_writer(self, meta):
        """(report) What writing the same bytes durably costs on this machine, with no
        encoding and no commit: the ceiling of segstore's ratio above."""
        t_discard, t_raw = best_of_pair_fresh(self._make_discard, self._make_raw, self.repeats)
        return t_discard / t_raw

    def track_ratio_write_vs_raw_file_writer(self, meta):
        """(report) segstore's writer against the raw file writer: what routing, encoding
        and the exactly-once commit cost on top of the durable writes themselves."""
        t_raw, t_segstore = best_of_pair_fresh(self._make_raw, self._make_segstore,
                                               self.repeats)
        return t_raw / t_segstore
