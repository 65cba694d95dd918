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
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

import segstore
from segstore.spark import stream as stream_module
from segstore.spark.source import SegstoreDataSource
from .sparkcheck import records

OLD = 1_600_000_000_000  # 2020: far past any retention.ms below


def run_stream(spark, root, checkpoint, source_options, out_topic="out"):
    """One Trigger.AvailableNow run from segstore into ``out_topic``; input rows per batch."""
    reader = spark.readStream.format("segstore")
    for k, v in source_options.items():
        reader = reader.option(k, v)
    query = (reader.load(root).select("key", "value").writeStream.format("segstore")
             .option("topic", out_topic).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(root))
    query.awaitTermination()
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
    r = reader_for(three, subscribe="s", startingOffsets="earliest", maxOffsetsPerTrigger="50")
    first = r.latestOffset()
    assert sum(first["s"].values()) <= 50 + 3
    second = r.latestOffset()
    assert all(second["s"][p] >= first["s"][p] for p in first["s"])
    while r.latestOffset() != second:
        second = r._last_end
    assert second == {"s": {"0": 90, "1": 10, "2": 1}}


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
    return writer.write(iter([pa.record_batch({"value": pa.array(vals)})]))


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
    from segstore.spark.ledger import CommitLedger
    from segstore.spark.options import normalize_location

    return CommitLedger(root, normalize_location(ckpt)).path
