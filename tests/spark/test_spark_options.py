"""Option parsing without a Spark session: every malformed option fails naming the option.

Spark lower-cases option keys before the source sees them; these tests pass them as Spark does.
"""

from __future__ import annotations

import pytest

from segstore.spark.options import (InvalidOptionError, ReadOptions, WriteOptions,
                                    duration_ms)
from segstore.spark.offsets import prorate, split_ranges
from segstore import TopicPartition


def read(streaming=False, **options):
    opts = {"path": "/data/store", **options}
    return ReadOptions.parse({k.lower(): v for k, v in opts.items()}, streaming=streaming)


def test_defaults_follow_kafka():
    batch = read(subscribe="a,b")
    assert batch.subscribe == ("a", "b")
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    assert batch.fail_on_data_loss and not batch.include_headers and not batch.push_filters
    stream = read(streaming=True, subscribe="a")
    assert stream.starting.kind == "latest"
    assert stream.max_trigger_delay_ms == 15 * 60 * 1000


def test_parsed_values():
    o = read(assign='{"t": [2, 0, 2]}', startingOffsets='{"t": {"0": 5, "2": -2}}',
             endingOffsets='{"t": {"0": 9, "2": -1}}', failOnDataLoss="FALSE",
             includeHeaders="true", minPartitions="4", maxRecordsPerPartition="100")
    assert o.assign == {"t": (0, 2)}
    assert o.starting.values == {("t", 0): 5, ("t", 2): -2}
    assert o.ending.values == {("t", 0): 9, ("t", 2): -1}
    assert not o.fail_on_data_loss and o.include_headers
    assert (o.min_partitions, o.max_records_per_partition) == (4, 100)
    s = read(streaming=True, subscribePattern="t.*", maxOffsetsPerTrigger="10",
             minOffsetsPerTrigger="3", maxTriggerDelay="30s")
    assert (s.max_offsets_per_trigger, s.min_offsets_per_trigger, s.max_trigger_delay_ms) == (
        10, 3, 30_000)


def test_timestamp_precedence():
    o = read(subscribe="t", startingTimestamp="5", startingOffsetsByTimestamp='{"t":{"0":1}}',
             startingOffsets="earliest", endingOffsetsByTimestamp='{"t":{"0":9}}')
    assert (o.starting.kind, o.starting.timestamp) == ("timestamp", 5)
    assert (o.ending.kind, o.ending.values) == ("timestamps", {("t", 0): 9})


@pytest.mark.parametrize("streaming, options, option", [
    (False, {}, "subscribe"),
    (False, {"subscribe": "a", "subscribePattern": "a"}, "subscribePattern"),
    (False, {"subscribe": " , "}, "subscribe"),
    (False, {"subscribe": "bad/name"}, "subscribe"),
    (False, {"subscribePattern": "("}, "subscribePattern"),
    (False, {"assign": "[1]"}, "assign"),
    (False, {"assign": '{"t": []}'}, "assign"),
    (False, {"assign": '{"t": [-1]}'}, "assign"),
    (False, {"subscribe": "t", "startingOffsets": "latest"}, "startingOffsets"),
    (False, {"subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "startingOffsets"),
    (False, {"subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "startingOffsets"),
    (False, {"subscribe": "t", "startingOffsets": "{nope"}, "startingOffsets"),
    (False, {"subscribe": "t", "endingOffsets": "earliest"}, "endingOffsets"),
    (False, {"subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "endingOffsets"),
    (False, {"subscribe": "t", "startingTimestamp": "soon"}, "startingTimestamp"),
    (False, {"subscribe": "t", "endingTimestamp": "-5"}, "endingTimestamp"),
    (False, {"subscribe": "t", "startingOffsetsByTimestamp": '{"t": {"0": -3}}'},
     "startingOffsetsByTimestamp"),
    (False, {"subscribe": "t", "startingOffsetsByTimestampStrategy": "first"},
     "startingOffsetsByTimestampStrategy"),
    (False, {"subscribe": "t", "failOnDataLoss": "yes"}, "failOnDataLoss"),
    (False, {"subscribe": "t", "includeHeaders": "1"}, "includeHeaders"),
    (False, {"subscribe": "t", "minPartitions": "0"}, "minPartitions"),
    (False, {"subscribe": "t", "maxRecordsPerPartition": "many"}, "maxRecordsPerPartition"),
    (False, {"subscribe": "t", "kafka.security.protocol": "SSL"}, "kafka.security.protocol"),
    (False, {"subscribe": "t", "kafka.bootstrap.servers": "h:1"}, "kafka.bootstrap.servers"),
    (True, {"subscribe": "t", "endingOffsets": "latest"}, "endingOffsets"),
    (True, {"subscribe": "t", "maxOffsetsPerTrigger": "-1"}, "maxOffsetsPerTrigger"),
    (True, {"subscribe": "t", "maxTriggerDelay": "5 fortnights"}, "maxTriggerDelay"),
])
def test_bad_read_options(streaming, options, option):
    with pytest.raises(InvalidOptionError, match=option.lower() if option.startswith("kafka")
                       else option):
        read(streaming=streaming, **options)


def test_missing_path_and_several_paths():
    with pytest.raises(InvalidOptionError, match="load\\(path\\)"):
        ReadOptions.parse({"subscribe": "t"}, streaming=False)
    with pytest.raises(InvalidOptionError, match="one store directory"):
        ReadOptions.parse({"subscribe": "t", "paths": '["/a", "/b"]'}, streaming=False)


def test_stream_only_options_are_ignored_by_batch_reads():
    assert read(subscribe="t", maxOffsetsPerTrigger="5").max_offsets_per_trigger is None


def test_write_options():
    w = WriteOptions.parse({"path": "file:/tmp/x", "topic": "t", "lockTimeoutMs": "50"},
                           streaming=False)
    assert (w.path, w.topic, w.lock_timeout_ms) == ("/tmp/x", "t", 50)
    with pytest.raises(InvalidOptionError, match="checkpointLocation"):
        WriteOptions.parse({"path": "/x"}, streaming=True)
    for key in ("kafka.key.serializer", "kafka.value.serializer"):
        with pytest.raises(InvalidOptionError, match=key):
            WriteOptions.parse({"path": "/x", key: "x"}, streaming=False)
    with pytest.raises(InvalidOptionError, match="topic"):
        WriteOptions.parse({"path": "/x", "topic": "a b"}, streaming=False)
    with pytest.raises(InvalidOptionError, match="subscribe"):
        WriteOptions.parse({"path": "/x", "subscribe": "t"}, streaming=False)


def test_durations():
    assert [duration_ms("d", t) for t in ("15m", "30s", "500ms", "2h", "1d", "250", "3min")] == [
        900_000, 30_000, 500, 7_200_000, 86_400_000, 250, 180_000]


def test_split_ranges():
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    assert split_ranges([(a, 0, 10), (b, 5, 5)]) == [(a, 0, 10)]
    assert split_ranges([(a, 0, 10)], max_records=4) == [(a, 0, 3), (a, 3, 6), (a, 6, 10)]
    pieces = split_ranges([(a, 0, 90), (b, 0, 10)], min_partitions=5)
    assert len(pieces) == 5
    assert sum(1 for p in pieces if p[0] == b) == 1  # every range keeps at least one piece
    assert sorted((s, e) for tp, s, e in pieces if tp == a)[-1][1] == 90
    # Never more pieces than records.
    assert split_ranges([(a, 0, 2)], min_partitions=5) == [(a, 0, 1), (a, 1, 2)]


def test_prorate_splits_by_backlog_and_never_starves():
    a, b, c = (TopicPartition("t", i) for i in range(3))
    start = {a: 0, b: 100, c: 7}
    latest = {a: 90, b: 110, c: 8}
    end = prorate(start, latest, 20)
    assert end[a] == 0 + 17  # floor(20 * 90/101)
    assert end[b] == 100 + 1  # floor(20 * 10/101) = 1
    assert end[c] == 8  # a share below one rounds up: small partitions are not starved
    assert prorate(start, latest, 1000) == latest
