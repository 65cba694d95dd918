"""Option parsing without a Spark session: every malformed option fails naming the option.

Spark lower-cases option keys before the source sees them; these tests pass them as Spark does.
"""

from __future__ import annotations

import math
import random
import re

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


@pytest.mark.parametrize("value", ["/data/store", '"/ab"', "", "[1]", '{"path": "/a"}',
                                   '["/a", 2]'])
def test_paths_must_be_a_json_list_of_strings(value):
    # Spark's load([a, b]) sets 'paths' to a JSON list; anything else is a typed error naming
    # the option, and a JSON string is not read as a list of characters.
    with pytest.raises(InvalidOptionError, match="'paths' must be a JSON list of strings"):
        ReadOptions.parse({"subscribe": "t", "paths": value}, streaming=False)


def test_paths_as_spark_sets_them():
    assert ReadOptions.parse({"subscribe": "t", "paths": '["/a"]'}, streaming=False).path == "/a"
    with pytest.raises(InvalidOptionError, match="got 2 paths"):
        ReadOptions.parse({"subscribe": "t", "paths": '["/a","/b"]'}, streaming=False)
    with pytest.raises(InvalidOptionError, match="store directory is missing"):
        ReadOptions.parse({"subscribe": "t", "paths": "[]"}, streaming=False)


# Kafka's source reads numbers with Long.parseLong / Integer.parseInt (.toLong / .toInt):
# an optional sign and ASCII digits, nothing around them.
@pytest.mark.parametrize("option, value", [
    ("minPartitions", "1_0"), ("minPartitions", " 4"), ("minPartitions", "4 "),
    ("minPartitions", "2147483648"), ("minPartitions", "+"), ("minPartitions", ""),
    ("minPartitions", "\u0663"), ("minPartitions", "4.0"),
    ("maxRecordsPerPartition", "9223372036854775808"), ("maxRecordsPerPartition", "1e3"),
    ("startingTimestamp", "1_700_000_000_000"), ("startingTimestamp", "5 0"),
    ("endingTimestamp", "5_0"),
])
def test_numbers_are_parsed_as_java_parses_them(option, value):
    # The message names the option and shows the value as given.
    with pytest.raises(InvalidOptionError,
                       match=f"option '{option}' must be an integer.*got {re.escape(repr(value))}"):
        read(subscribe="t", **{option: value})


@pytest.mark.parametrize("option", ["maxOffsetsPerTrigger", "minOffsetsPerTrigger"])
def test_stream_numbers_are_parsed_as_java_parses_them(option):
    with pytest.raises(InvalidOptionError, match=f"option '{option}' must be an integer"):
        read(streaming=True, subscribe="t", **{option: "5_0"})


def test_numbers_java_accepts():
    o = read(subscribe="t", minPartitions="+4", maxRecordsPerPartition="9223372036854775807",
             startingTimestamp="0017")
    assert (o.min_partitions, o.max_records_per_partition) == (4, (1 << 63) - 1)
    assert o.starting.timestamp == 17
    assert read(subscribe="t", minPartitions="2147483647").min_partitions == (1 << 31) - 1


@pytest.mark.parametrize("option", ["startingOffsets", "startingOffsetsByTimestamp",
                                    "endingOffsets"])
@pytest.mark.parametrize("key", ["1_0", " 1", "1 ", "1.0", "\u0661", "2147483648", ""])
def test_json_partition_keys_are_parsed_as_java_parses_them(option, key):
    # Kafka's JsonUtils reads partition keys with Integer.parseInt: "1_0" is no partition 10.
    text = '{"t": {"%s": 5}}' % key
    with pytest.raises(InvalidOptionError, match=f"option '{option}'.*not a partition number"):
        read(subscribe="t", **{option: text})


def test_json_values_must_be_longs():
    with pytest.raises(InvalidOptionError, match="startingOffsets.*64-bit integer"):
        read(subscribe="t", startingOffsets='{"t": {"0": 9223372036854775808}}')
    o = read(subscribe="t", startingOffsets='{"t": {"+1": 9223372036854775807}}')
    assert o.starting.values == {("t", 1): (1 << 63) - 1}


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
    # JavaUtils.timeStringAsMs: trimmed and lower-cased first; negative numbers pass; us
    # truncate toward zero (TimeUnit.convert); a unit overflowing a long saturates.
    assert [duration_ms("d", t) for t in (" 15M\n", "-5s", "1500us", "-1500us", "0",
                                          "9223372036854775807d")] == [
        900_000, -5_000, 1, -1, 0, (1 << 63) - 1]


@pytest.mark.parametrize("value", ["15 m", "5millis", "m", "", "+5s", "1_0s", "1.5s", "5 s",
                                   "5sec", "9223372036854775808", "\u0665s"])
def test_bad_max_trigger_delay_names_the_option(value):
    with pytest.raises(InvalidOptionError, match="option 'maxTriggerDelay' must be a duration"):
        read(streaming=True, subscribe="t", maxTriggerDelay=value)


def test_negative_max_trigger_delay_is_accepted():
    assert read(streaming=True, subscribe="t",
                maxTriggerDelay="-1m").max_trigger_delay_ms == -60_000


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


def kafka_get_ranges(ranges, min_partitions=None, max_records=None):
    """Spark's KafkaOffsetRangeCalculator.getRanges, transcribed (the oracle)."""
    def java_round(x):  # Math.round: floor(x + 0.5), exact at halves
        return math.floor(x) + (1 if x - math.floor(x) >= 0.5 else 0)

    def part_count(size, total, min_parts):
        return max(java_round(size / total * min_parts), 1)

    def divide(parts, tp, start, until):
        out, remaining = [], until - start
        for part in range(parts):
            this = remaining // (parts - part)
            remaining -= this
            end = min(start + this, until)
            out.append((tp, start, end))
            start = end
        return out

    offset_ranges = [r for r in ranges if r[2] - r[1] > 0]
    if ((min_partitions is None or len(offset_ranges) >= min_partitions)
            and max_records is None):
        return offset_ranges
    divided = offset_ranges
    if max_records is not None:
        divided = [r for tp, s, e in offset_ranges
                   for r in divide(math.ceil((e - s) / max_records), tp, s, e) if r[2] > r[1]]
    if min_partitions is None or min_partitions <= len(divided):
        return divided
    total = sum(e - s for _, s, e in divided)
    unsplit = [(tp, e - s) for tp, s, e in divided
               if part_count(e - s, total, min_partitions) == 1]
    unsplit_tps = {tp for tp, _ in unsplit}
    split_total = total - sum(size for _, size in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for tp, s, e in divided:
        parts = 1 if tp in unsplit_tps else part_count(e - s, split_total, split_min)
        out.extend(divide(parts, tp, s, e))
    return [r for r in out if r[2] > r[1]]


def tps(n):
    return [TopicPartition("t", p) for p in range(n)]


def test_min_partitions_sets_small_ranges_aside_as_spark_does():
    # Small ranges stay whole and leave the big one minPartitions - #small pieces, not
    # minPartitions of its own (which over-split: 7 and 20 pieces before).
    small_and_big = [(tp, 0, 1) for tp in tps(3)] + [(TopicPartition("t", 3), 0, 100)]
    pieces = split_ranges(small_and_big, min_partitions=5)
    assert len(pieces) == 5
    assert [(s, e) for tp, s, e in pieces if tp.partition == 3] == [(0, 50), (50, 100)]
    nine_small = [(tp, 0, 1) for tp in tps(9)] + [(TopicPartition("t", 9), 0, 1000)]
    assert len(split_ranges(nine_small, min_partitions=12)) == 12
    # Each share rounds on its own, with Java's half-up rounding: Spark may plan more or
    # fewer pieces than asked.
    assert len(split_ranges([(tp, 0, 50) for tp in tps(2)], min_partitions=5)) == 6  # 2.5 -> 3
    assert len(split_ranges([(tp, 0, 40) for tp in tps(3)], min_partitions=7)) == 6  # 2.33 -> 2
    # The last pieces absorb the rounding, as getDividedPartition does.
    assert split_ranges([(tps(1)[0], 0, 6)], min_partitions=4) == [
        (tps(1)[0], a, b) for a, b in [(0, 1), (1, 2), (2, 4), (4, 6)]]


def test_max_records_then_min_partitions_as_spark_does():
    a, b = tps(2)
    # maxRecordsPerPartition cuts first (a: 2 pieces of 5); minPartitions then shares out
    # the rest: b (3/13 of 6 rounds to 1) stays whole, each piece of a gets 2.5 -> 3 of 5.
    assert split_ranges([(a, 0, 10), (b, 0, 3)], min_partitions=6, max_records=5) == [
        (a, 0, 1), (a, 1, 3), (a, 3, 5), (a, 5, 6), (a, 6, 8), (a, 8, 10), (b, 0, 3)]
    # Enough pieces after the cap: minPartitions splits nothing more.
    assert split_ranges([(a, 0, 10), (b, 0, 10)], min_partitions=3, max_records=4) == [
        (a, 0, 3), (a, 3, 6), (a, 6, 10), (b, 0, 3), (b, 3, 6), (b, 6, 10)]


@pytest.mark.parametrize("seed", range(40))
def test_split_ranges_matches_sparks_calculator(seed):
    rnd = random.Random(seed)
    ranges = []
    for tp in tps(rnd.randint(1, 8)):
        start = rnd.randint(0, 1000)
        ranges.append((tp, start, start + rnd.choice([0, 1, 2, 3, rnd.randint(1, 5000)])))
    min_partitions = rnd.choice([None, 1, 2, 5, 8, 13, 30, 100])
    max_records = rnd.choice([None, None, 1, 7, 100, 1000])
    expected = kafka_get_ranges(ranges, min_partitions, max_records)
    assert split_ranges(ranges, min_partitions, max_records) == expected


def test_prorate_splits_by_backlog_and_never_starves():
    a, b, c = (TopicPartition("t", i) for i in range(3))
    start = {a: 0, b: 100, c: 7}
    latest = {a: 90, b: 110, c: 8}
    end = prorate(start, latest, 20)
    assert end[a] == 0 + 17  # floor(20 * 90/101)
    assert end[b] == 100 + 1  # floor(20 * 10/101) = 1
    assert end[c] == 8  # a share below one rounds up: small partitions are not starved
    assert prorate(start, latest, 1000) == latest


def test_global_timestamps_are_trimmed_first_as_spark_does():
    # getKafkaOffsetRangeLimit reads them as params(key).trim.toLong.
    opts = ReadOptions.parse({"path": "/s", "subscribe": "t", "startingTimestamp": " 5\n",
                              "endingTimestamp": "\t7 "}, streaming=False)
    assert (opts.starting.timestamp, opts.ending.timestamp) == (5, 7)
