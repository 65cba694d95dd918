"""Streaming: micro-batch sizes, checkpoints, failOnDataLoss after retention, new partitions,
admission control, and the sink's exactly-once commits when Spark replays a batch id.

End-to-end queries stream from one segstore topic into another (both sides under test); the
admission-control rules are also driven directly on the reader, with a fake trigger clock.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

import segstore
from segstore.spark import stream as stream_module
from segstore.spark.features import ADMISSION_CONTROL, PYSPARK_VERSION, STREAM_ARROW_WRITER
from segstore.spark.options import WriteOptions
from segstore.spark.source import SegstoreDataSource
from segstore.spark.writer import (SegstoreRowStreamWriter, SegstoreStreamWriter,
                                   check_input_schema, make_stream_writer)
from .sparkcheck import records

if ADMISSION_CONTROL:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

OLD = 1_600_000_000_000  # 2020: far past any retention.ms below

# Read limits and latestOffset(start, limit) arrived in pyspark 4.2 (admission control); 4.0 and
# 4.1 call latestOffset() without arguments. Tests of one protocol only are marked; the
# unmarked ones hold on every version.
admission_control = pytest.mark.skipif(
    not ADMISSION_CONTROL,
    reason=f"pyspark {PYSPARK_VERSION} has no admission control (read limits, 4.2+)")
legacy_protocol = pytest.mark.skipif(
    ADMISSION_CONTROL,
    reason=f"pyspark {PYSPARK_VERSION} calls latestOffset(start, limit), not latestOffset()")


def run_stream(spark, root, checkpoint, source_options, out_topic="out", available_now=True):
    """One run from segstore into ``out_topic``; input rows per batch.

    ``Trigger.AvailableNow`` by default; else a processing-time trigger that runs until the
    source has nothing new (``processAllAvailable``), then stops.
    """
    reader = spark.readStream.format("segstore")
    for k, v in source_options.items():
        reader = reader.option(k, v)
    writer = (reader.load(root).select("key", "value").writeStream.format("segstore")
              .option("topic", out_topic).option("checkpointLocation", checkpoint))
    if available_now:
        query = writer.trigger(availableNow=True).start(root)
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="0 seconds").start(root)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def values(root, topic):
    return sorted(v for _, _, v, _ in records(root, topic))


@pytest.fixture
def root(tmp_path):
    path = str(tmp_path / "store")
    with segstore.open(path) as store:
        store.create_topic("in", 1)
        store.create_topic("out", 2)
    return path


@admission_control
def test_available_now_batch_sizes_resume_and_exactly_once_sink(spark, root, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"a%d" % i for i in range(25)])
    opts = {"subscribe": "in", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "10"}
    assert run_stream(spark, root, ckpt, opts) == [10, 10, 5]
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"b%d" % i for i in range(12)])
    # Restarted from the checkpoint: only the 12 new records, still 10 per batch.
    assert run_stream(spark, root, ckpt, opts) == [10, 2]
    assert values(root, "out") == sorted([b"a%d" % i for i in range(25)]
                                         + [b"b%d" % i for i in range(12)])
    assert run_stream(spark, root, ckpt, opts) == []


def test_max_offsets_per_trigger_with_a_processing_time_trigger(spark, root, tmp_path):
    # Every version caps micro-batches here: 4.2+ through ReadMaxRows, 4.0/4.1 in the reader,
    # which learns where a restarted query stands from Spark's partitions(offset, offset).
    ckpt = str(tmp_path / "ckpt")
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"a%d" % i for i in range(25)])
    opts = {"subscribe": "in", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "10"}
    assert run_stream(spark, root, ckpt, opts, available_now=False) == [10, 10, 5]
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"b%d" % i for i in range(12)])
    assert run_stream(spark, root, ckpt, opts, available_now=False) == [10, 2]
    assert values(root, "out") == sorted([b"a%d" % i for i in range(25)]
                                         + [b"b%d" % i for i in range(12)])
    assert run_stream(spark, root, ckpt, opts, available_now=False) == []


@legacy_protocol
def test_available_now_reads_one_batch_per_run_before_admission_control(spark, root, tmp_path):
    # pyspark 4.0/4.1 ask an AvailableNow source for latestOffset() once per run: the run is one
    # micro-batch, capped by maxOffsetsPerTrigger when it is set (docs/spark.md says so).
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"a%d" % i for i in range(25)])
    capped = {"subscribe": "in", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "10"}
    ckpt = str(tmp_path / "capped")
    assert run_stream(spark, root, ckpt, capped) == [10]
    assert run_stream(spark, root, ckpt, capped) == [10]   # resumes at offset 10
    assert run_stream(spark, root, ckpt, capped) == [5]
    assert run_stream(spark, root, ckpt, capped) == []
    everything = {"subscribe": "in", "startingOffsets": "earliest"}
    assert run_stream(spark, root, str(tmp_path / "all"), everything) == [25]
    assert values(root, "out") == sorted([b"a%d" % i for i in range(25)] * 2)


def test_starting_offsets_default_to_latest(spark, root, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"old"] * 3)
    assert run_stream(spark, root, ckpt, {"subscribe": "in"}) == []
    with segstore.open(root) as store:
        store.partition("in", 0).append_batch([b"new1", b"new2"])
    assert run_stream(spark, root, ckpt, {"subscribe": "in"}) == [2]
    assert values(root, "out") == [b"new1", b"new2"]


def test_new_partitions_are_read_from_earliest(spark, root, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    with segstore.open(root) as store:
        store.create_topic("dyn-a", 1)
        store.partition("dyn-a", 0).append_batch([b"a0", b"a1"])
    opts = {"subscribePattern": "dyn-.*", "startingOffsets": "latest"}
    assert run_stream(spark, root, ckpt, opts) == []
    with segstore.open(root) as store:
        store.partition("dyn-a", 0).append(b"a2")
        store.create_topic("dyn-b", 2)
        store.partition("dyn-b", 1).append_batch([b"b0", b"b1", b"b2"])
    assert sum(run_stream(spark, root, ckpt, opts)) == 4
    assert values(root, "out") == [b"a2", b"b0", b"b1", b"b2"]


def old_records(root, first, count):
    with segstore.open(root) as store:
        if "r" not in store.list_topics():
            store.create_topic("r", 1, config={"segment.bytes": 300,
                                               "retention.ms": 86_400_000,
                                               "file.delete.delay.ms": 0})
        lg = store.partition("r", 0)
        for i in range(first, first + count):
            lg.append(b"old%d" % i, timestamp_ms=OLD + i)


def recent_records_then_retention(root) -> int:
    now = int(time.time() * 1000)
    with segstore.open(root) as store:
        lg = store.partition("r", 0)
        lg.append_batch([b"new%d" % i for i in range(5)], timestamps_ms=[now] * 5)
        store.enforce_retention(now_ms=now)
        return lg.log_start_offset


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss_after_retention(spark, root, tmp_path, fail):
    ckpt = str(tmp_path / "ckpt")
    opts = {"subscribe": "r", "startingOffsets": "earliest"}
    old_records(root, 0, 8)
    assert run_stream(spark, root, ckpt, opts) == [8]  # the checkpoint now says offset 8
    old_records(root, 8, 22)
    start = recent_records_then_retention(root)
    assert 8 < start < 35  # retention deleted offsets the stream has not read yet
    opts["failOnDataLoss"] = "true" if fail else "false"
    if fail:
        with pytest.raises(Exception, match="failOnDataLoss"):
            run_stream(spark, root, ckpt, opts)
        assert len(values(root, "out")) == 8
    else:
        assert run_stream(spark, root, ckpt, opts) == [35 - start]
        with segstore.open(root, readonly=True) as store:
            kept = [r.value for r in store.partition("r", 0).iter_records()]
        assert len(kept) == 35 - start
        assert values(root, "out") == sorted([b"old%d" % i for i in range(8)] + kept)


# -- the reader's rules without Spark ---------------------------------------------------------

def reader_for(root, **options):
    opts = CaseInsensitiveDict({"path": root, **options})
    ds = SegstoreDataSource(opts)
    return ds.streamReader(ds.schema())


@pytest.fixture
def three(tmp_path):
    path = str(tmp_path / "three")
    with segstore.open(path) as store:
        store.create_topic("s", 3)
        for p, n in enumerate((90, 10, 1)):
            store.partition("s", p).append_batch([b"x"] * n)
    return path


@admission_control
def test_max_rows_split_by_backlog(three):
    r = reader_for(three, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="20")
    start = r.initialOffset()
    assert start == {"s": {"0": 0, "1": 0, "2": 0}}
    assert r.getDefaultReadLimit() == ReadMaxRows(20)
    end = r.latestOffset(start, ReadMaxRows(20))
    assert end == {"s": {"0": 17, "1": 1, "2": 1}}  # 20*90/101, 20*10/101, and >= 1
    ranges = [(p.partition, p.start, p.end) for p in r.partitions(start, end)]
    assert ranges == [(0, 0, 17), (1, 0, 1), (2, 0, 1)]
    assert r.latestOffset(end, ReadAllAvailable()) == {"s": {"0": 90, "1": 10, "2": 1}}
    assert r.partitions(end, end) == []


def test_legacy_protocol_without_arguments(three):
    # pyspark 4.0/4.1: latestOffset() with no arguments, the cap applied by the reader.
    r = reader_for(three, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="20")
    first = r.latestOffset()
    assert first == {"s": {"0": 17, "1": 1, "2": 1}}  # 20 split by backlog, as with ReadMaxRows
    second = r.latestOffset()
    assert second == {"s": {"0": 34, "1": 3, "2": 1}}  # from the first end: 73, 9, 0 left
    ends = [second]
    while True:
        end = r.latestOffset()
        if end == ends[-1]:
            break
        ends.append(end)
    assert ends[-1] == {"s": {"0": 90, "1": 10, "2": 1}}
    steps = [sum(b["s"].values()) - sum(a["s"].values()) for a, b in zip(ends, ends[1:])]
    assert steps and all(0 < n <= 20 + 3 for n in steps)  # +1 per partition: none starves


def test_legacy_protocol_resumes_where_spark_says_the_query_stands(three):
    # A restarted 4.0/4.1 query: Spark calls partitions(offset, offset) with the checkpointed
    # position before the first latestOffset(); the reader must go on from there, not from
    # startingOffsets.
    r = reader_for(three, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="10")
    pos = {"s": {"0": 50, "1": 10, "2": 1}}
    assert r.partitions(pos, pos) == []
    assert r.latestOffset() == {"s": {"0": 60, "1": 10, "2": 1}}
    # A replayed batch (its end not yet committed) also sets the position.
    r = reader_for(three, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="5")
    r.partitions({"s": {"0": 0, "1": 0, "2": 0}}, {"s": {"0": 40, "1": 5, "2": 1}})
    assert r.latestOffset() == {"s": {"0": 44, "1": 6, "2": 1}}


def test_legacy_protocol_min_offsets_wait_for_max_trigger_delay(three, monkeypatch):
    clock = [10_000_000]
    monkeypatch.setattr(stream_module, "now_ms", lambda: clock[0])
    r = reader_for(three, subscribe="s", startingOffsets="latest", minOffsetsPerTrigger="5",
                   maxTriggerDelay="1m")
    start = r.latestOffset()  # first call: the delay has passed; nothing new
    assert start == {"s": {"0": 90, "1": 10, "2": 1}}
    with segstore.open(three) as store:
        store.partition("s", 1).append_batch([b"y"] * 3)
    clock[0] += 1000
    assert r.latestOffset() == start  # 3 < 5 and only 1 s waited
    clock[0] += 60_000
    assert r.latestOffset()["s"]["1"] == 13  # maxTriggerDelay passed
    with segstore.open(three) as store:
        store.partition("s", 2).append_batch([b"z"] * 5)
    clock[0] += 1
    assert r.latestOffset()["s"]["2"] == 6  # 5 new >= 5: no wait


@admission_control
def test_min_offsets_wait_for_max_trigger_delay(three, monkeypatch):
    clock = [10_000_000]
    monkeypatch.setattr(stream_module, "now_ms", lambda: clock[0])
    r = reader_for(three, subscribe="s", startingOffsets="latest", minOffsetsPerTrigger="5",
                   maxTriggerDelay="1m")
    assert r.getDefaultReadLimit() == ReadMinRows(5)
    start = r.initialOffset()
    assert r.latestOffset(start, ReadMinRows(5)) == start  # first call: the delay has passed
    with segstore.open(three) as store:
        store.partition("s", 1).append_batch([b"y"] * 3)
    clock[0] += 1000
    assert r.latestOffset(start, ReadMinRows(5)) == start  # 3 < 5 and only 1 s waited
    clock[0] += 60_000
    assert r.latestOffset(start, ReadMinRows(5))["s"]["1"] == 13  # maxTriggerDelay passed
    with segstore.open(three) as store:
        store.partition("s", 2).append_batch([b"z"] * 5)
    clock[0] += 1
    assert r.latestOffset(start, ReadMinRows(5))["s"]["2"] == 6  # 8 >= 5: no wait


@pytest.fixture
def held(tmp_path, monkeypatch):
    """A pattern stream over ev-a (3 records) past its first batch, minOffsetsPerTrigger 100
    holding the next one back for an hour; returns (reader, position, clock)."""
    path = str(tmp_path / "held")
    with segstore.open(path) as store:
        store.create_topic("ev-a", 1)
        store.partition("ev-a", 0).append_batch([b"x"] * 3)
        store.create_topic("ev-gone", 1)
    clock = [10_000_000]
    monkeypatch.setattr(stream_module, "now_ms", lambda: clock[0])
    r = reader_for(path, subscribePattern="ev-.*", startingOffsets="earliest",
                   minOffsetsPerTrigger="100", maxTriggerDelay="1h", failOnDataLoss="true")
    pos = {"ev-a": {"0": 3}, "ev-gone": {"0": 0}}
    return r, path, pos, clock


def appear_and_vanish(path):
    with segstore.open(path) as store:
        store.create_topic("ev-b", 1)  # new and empty: the backlog stays below 100
        store.delete_topic("ev-gone")


@admission_control
def test_held_back_batch_ends_at_its_start_when_partitions_change(held):
    # Kafka's KafkaMicroBatchStream.latestOffset returns the start offsets themselves while
    # minOffsetsPerTrigger delays a batch; new and vanished partitions wait for the batch.
    r, path, pos, clock = held
    assert r.latestOffset({"ev-a": {"0": 0}}, ReadMinRows(100)) == pos  # first batch goes
    appear_and_vanish(path)
    clock[0] += 1000
    assert r.latestOffset(pos, ReadMinRows(100)) == pos  # no batch: Spark plans nothing
    clock[0] += 3_600_000  # maxTriggerDelay passed: the batch goes, the vanished one counts
    with pytest.raises(segstore.spark.DataLossError, match="ev-gone-0"):
        r.latestOffset(pos, ReadMinRows(100))


def test_held_back_batch_ends_at_its_start_before_admission_control(held):
    r, path, pos, clock = held
    r.partitions(pos, pos)  # how pyspark 4.0/4.1 tell a restarted query where it stands
    assert r.latestOffset() == pos  # the first trigger: the delay has passed, nothing new
    appear_and_vanish(path)
    clock[0] += 1000
    assert r.latestOffset() == pos


def test_negative_max_trigger_delay_never_holds_back(three, monkeypatch):
    monkeypatch.setattr(stream_module, "now_ms", lambda: 10_000_000)
    r = reader_for(three, subscribe="s", startingOffsets="latest", minOffsetsPerTrigger="5",
                   maxTriggerDelay="-1s")
    r.latestOffset()
    with segstore.open(three) as store:
        store.partition("s", 1).append_batch([b"y"])
    assert r.latestOffset()["s"]["1"] == 11  # 1 < 5, yet the delay has always passed


@admission_control
def test_available_now_never_passes_its_target(three):
    r = reader_for(three, subscribe="s", startingOffsets="earliest")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    with segstore.open(three) as store:
        store.partition("s", 0).append_batch([b"late"] * 4)
        store.create_topic("s2", 1)
    assert r.latestOffset(start, ReadAllAvailable()) == {"s": {"0": 90, "1": 10, "2": 1}}


def test_partitions_apply_fail_on_data_loss(three):
    with segstore.open(three) as store:
        store.partition("s", 0).delete_records(50)
    start, end = {"s": {"0": 10}}, {"s": {"0": 60}}
    strict = reader_for(three, subscribe="s", failOnDataLoss="true")
    with pytest.raises(segstore.spark.DataLossError, match="failOnDataLoss"):
        strict.partitions(start, end)
    lenient = reader_for(three, subscribe="s", failOnDataLoss="false")
    assert [(p.start, p.end) for p in lenient.partitions(start, end)] == [(50, 60)]


def test_stream_options_rejected_or_required(root):
    with pytest.raises(segstore.spark.InvalidOptionError, match="endingOffsets"):
        reader_for(root, subscribe="in", endingOffsets="latest")


# -- the sink's exactly-once commits without Spark ------------------------------------------

def sink(root, ckpt):
    from pyspark.sql.types import StringType, StructField, StructType

    ds = SegstoreDataSource(CaseInsensitiveDict(
        {"path": root, "topic": "out", "checkpointLocation": ckpt}))
    return ds.streamWriter(StructType([StructField("value", StringType())]), False)


def task(writer, vals):
    """One task's write of ``vals``, given as Spark gives it to this writer: Arrow batches
    (pyspark 4.1+) or Rows (4.0)."""
    if isinstance(writer, SegstoreRowStreamWriter):
        from pyspark.sql import Row

        return writer.write(iter([Row(value=v) for v in vals]))
    return writer.write(iter([pa.record_batch({"value": pa.array(vals)})]))


def row_writer_args(root, ckpt, *fields):
    """(options, layout, input schema) of a stream sink with input columns ``fields``
    (name, type) pairs; ``topic string, value string`` when none are given."""
    from pyspark.sql.types import StringType, StructField, StructType

    opts = WriteOptions.parse(CaseInsensitiveDict(
        {"path": root, "checkpointLocation": ckpt}), streaming=True)
    schema = StructType([StructField(n, t) for n, t in fields or [("topic", StringType()),
                                                                ("value", StringType())]])
    return opts, check_input_schema(schema, opts), schema


def test_the_stream_writer_takes_what_this_pyspark_hands_it():
    expected = SegstoreStreamWriter if STREAM_ARROW_WRITER else SegstoreRowStreamWriter
    assert expected is not None
    assert isinstance(make_stream_writer(*row_writer_args("/nowhere", "/ckpt")), expected)


def test_row_stream_writer_writes_what_the_arrow_writer_writes(root, tmp_path):
    # pyspark 4.0's stream writers get Rows; the Row writer (constructed here on any version)
    # must land the same records as the Arrow path: string and binary columns, null values
    # and keys, headers, explicit partitions and per-row topics.
    from pyspark.sql import Row
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructField,
                                   StructType)

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    fields = [("topic", StringType()), ("key", BinaryType()), ("value", StringType()),
              ("partition", IntegerType()), ("headers", ArrayType(header)),
              ("ignored", IntegerType())]
    rows = [Row(topic="out", key=b"k1", value="v1", partition=1,
                headers=[Row(key="h", value=b"x"), Row(key="n", value=None)], ignored=7),
            Row(topic="out", key=None, value=None, partition=0, headers=None, ignored=8),
            Row(topic="in", key=b"k2", value="v2", partition=None, headers=[], ignored=9)]
    w = SegstoreRowStreamWriter(*row_writer_args(root, str(tmp_path / "ckpt"), *fields))
    w.commit([w.write(iter(rows[:2])), w.write(iter(rows[2:]))], 0)
    assert records(root, "out") == [(0, None, None, []),
                                    (1, b"k1", b"v1", [("h", b"x"), ("n", None)])]
    assert records(root, "in") == [(0, b"k2", b"v2", [])]


def test_stream_sink_commits_each_batch_id_once(root, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    w = sink(root, ckpt)
    w.commit([task(w, ["a", "b"])], 0)
    # Spark replays batch 0 (it stopped before its own commit log said so): nothing new lands.
    w.commit([task(w, ["a", "b"])], 0)
    assert values(root, "out") == [b"a", b"b"]
    # A restarted query builds new writers; the record of committed batches is in the store.
    w2 = sink(root, ckpt)
    w2.commit([task(w2, ["a", "b"])], 0)
    w2.commit([task(w2, ["c"]), task(w2, ["d"])], 1)
    assert values(root, "out") == [b"a", b"b", b"c", b"d"]
    # Aborted batch: its staging goes, nothing lands.
    w2.abort([task(w2, ["e"]), None], 2)
    assert values(root, "out") == [b"a", b"b", b"c", b"d"]
    # Another checkpoint location is another query: its batch 0 is new.
    w3 = sink(root, str(tmp_path / "other"))
    w3.commit([task(w3, ["f"])], 0)
    assert values(root, "out") == [b"a", b"b", b"c", b"d", b"f"]
    with open(w2_ledger(root, ckpt)) as f:
        assert json.load(f)["lastBatchId"] == 1


def w2_ledger(root, ckpt):
    from segstore.commit_ledger import CommitLedger
    from segstore.spark.options import normalize_location

    return CommitLedger(root, normalize_location(ckpt)).path
