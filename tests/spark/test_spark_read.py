"""Batch reads through Spark: Kafka's schema, every read option, headers, pushdown.

Every result is compared with ``PartitionLog.read_columns`` over the offset ranges the options
should select (computed here from the data the tests wrote, not by segstore.spark).
"""

from __future__ import annotations

import json

import pytest

import segstore
import segstore.spark
from segstore.spark.features import FILTER_PUSHDOWN, PYSPARK_VERSION
from segstore.spark.source import SegstoreDataSource
from .sparkcheck import collect, end_offsets, expected, whole

T0 = 1_700_000_000_000
KAFKA_DDL = ("key binary, value binary, topic string, partition int, offset bigint, "
             "timestamp timestamp, timestampType int")
N = 40  # records per partition of "events"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """events (3 partitions; some null keys, tombstones and headers), two metrics topics."""
    path = str(tmp_path_factory.mktemp("read") / "store")
    with segstore.open(path) as store:
        store.create_topic("events", 3)
        store.create_topic("metrics-a", 1)
        store.create_topic("metrics-b", 2)
        for p in range(3):
            lg = store.partition("events", p)
            for i in range(N):
                lg.append(None if i % 11 == 5 else b"v-%d-%d" % (p, i),
                          key=None if i % 7 == 0 else b"k%d" % i,
                          headers=[("h", b"%d" % i), ("n", None)] if i % 3 == 0 else None,
                          timestamp_ms=T0 + i * 1000 + p)
        store.create_topic("trimmed", 1)
        store.partition("trimmed", 0).append_batch([b"t%d" % i for i in range(20)])
        store.partition("trimmed", 0).delete_records(8)  # the log now starts at offset 8
        for t, n in (("metrics-a", 1), ("metrics-b", 2)):
            for p in range(n):
                store.partition(t, p).append_batch([b"m%d" % i for i in range(5)],
                                                   timestamps_ms=[T0] * 5)
    return path


def load(spark, root, **options):
    reader = spark.read.format("segstore")
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load(root)


def test_format_found_without_register_and_schema_is_kafkas(spark, root):
    df = load(spark, root, subscribe="events")
    assert df.schema == spark.createDataFrame([], KAFKA_DDL).schema
    with_headers = load(spark, root, subscribe="events", includeHeaders="true")
    assert with_headers.schema == spark.createDataFrame(
        [], KAFKA_DDL + ", headers array<struct<key:string,value:binary>>").schema


def test_subscribe_reads_every_record_like_read_columns(spark, root):
    got = collect(load(spark, root, subscribe="events"))
    want = expected(root, whole(root, "events"))
    assert len(got["offset"]) == 3 * N
    assert got == want
    assert None in got["key"] and None in got["value"]  # nulls survive as nulls


def test_headers_on_match_read_columns_and_are_null_when_absent(spark, root):
    got = collect(load(spark, root, subscribe="events", includeHeaders="true"))
    want = expected(root, whole(root, "events"), headers=True)
    assert got == want
    assert got["headers"][0] == [{"key": "h", "value": b"0"}, {"key": "n", "value": None}]
    assert got["headers"][1] is None


def test_subscribe_several_topics_and_pattern(spark, root):
    got = collect(load(spark, root, subscribe="metrics-a, metrics-b"))
    assert got == expected(root, whole(root, "metrics-a") + whole(root, "metrics-b"))
    assert collect(load(spark, root, subscribePattern="metrics-.*")) == got
    # Full match, as Java's Pattern.matches: a prefix alone selects nothing.
    assert collect(load(spark, root, subscribePattern="metrics"))["offset"] == []


def test_assign_selects_partitions(spark, root):
    got = collect(load(spark, root, assign={"events": [0, 2]}))
    assert got == expected(root, [("events", 0, 0, N), ("events", 2, 0, N)])


def test_json_offsets_with_earliest_and_latest_markers(spark, root):
    got = collect(load(spark, root, subscribe="events",
                       startingOffsets={"events": {"0": 5, "1": -2, "2": 39}},
                       endingOffsets={"events": {"0": 20, "1": -1, "2": 40}}))
    assert got == expected(root, [("events", 0, 5, 20), ("events", 1, 0, N),
                                  ("events", 2, 39, 40)])


def test_starting_and_ending_timestamp(spark, root):
    # Partition p's record i has timestamp T0 + 1000 i + p: the first record at or after
    # T0 + 10000 is i = 10 everywhere; the ending offset is the first at or after T0 + 30000.
    got = collect(load(spark, root, subscribe="events", startingTimestamp=str(T0 + 10_000),
                       endingTimestamp=str(T0 + 30_000)))
    assert got == expected(root, [("events", p, 10, 30) for p in range(3)])


def test_offsets_by_timestamp_and_precedence(spark, root):
    got = collect(load(spark, root, subscribe="events",
                       startingOffsetsByTimestamp={"events": {"0": T0 + 3000, "1": T0,
                                                              "2": T0 + 35_500}},
                       startingOffsets="earliest",  # ignored: by-timestamp takes precedence
                       endingOffsetsByTimestamp={"events": {"0": T0 + 4000, "1": T0 + 99_000,
                                                            "2": T0 + 39_002}}))
    # Partition 1 has no record at T0 + 99000: an ending timestamp without a match is latest.
    assert got == expected(root, [("events", 0, 3, 4), ("events", 1, 0, N),
                                  ("events", 2, 36, 39)])
    # startingTimestamp wins over startingOffsetsByTimestamp.
    both = collect(load(spark, root, subscribe="events", startingTimestamp=str(T0 + 38_000),
                        startingOffsetsByTimestamp={"events": {"0": T0, "1": T0, "2": T0}}))
    assert both == expected(root, [("events", p, 38, N) for p in range(3)])


def test_starting_timestamp_without_match_error_or_latest(spark, root):
    late = str(T0 + 10 ** 9)
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        load(spark, root, subscribe="events", startingTimestamp=late).collect()
    got = collect(load(spark, root, subscribe="events", startingTimestamp=late,
                       startingOffsetsByTimestampStrategy="latest"))
    assert got["offset"] == []


def test_min_partitions_and_max_records_per_partition(spark, root):
    df = load(spark, root, subscribe="events", minPartitions="7")
    assert df.rdd.getNumPartitions() == 6  # as Spark's calculator: 7/3 per partition rounds to 2
    assert collect(df) == expected(root, whole(root, "events"))
    df = load(spark, root, subscribe="events", maxRecordsPerPartition="15")
    assert df.rdd.getNumPartitions() == 9  # 40 records -> 3 pieces of at most 15, per partition
    assert collect(df) == expected(root, whole(root, "events"))


def test_fail_on_data_loss_in_batch_reads(spark, root):
    gone = {"trimmed": {"0": 3}}
    with pytest.raises(Exception, match="log start offset is now 8.*failOnDataLoss"):
        load(spark, root, subscribe="trimmed", startingOffsets=gone).collect()
    got = collect(load(spark, root, subscribe="trimmed", startingOffsets=gone,
                       failOnDataLoss="false"))
    assert got == expected(root, [("trimmed", 0, 8, 20)])
    # Offsets past the end: truncated away as far as the reader can tell.
    with pytest.raises(Exception, match="log end offset is 20"):
        load(spark, root, subscribe="trimmed", endingOffsets={"trimmed": {"0": 25}}).collect()
    got = collect(load(spark, root, subscribe="trimmed", failOnDataLoss="false",
                       endingOffsets={"trimmed": {"0": 25}}))
    assert got == expected(root, [("trimmed", 0, 8, 20)])


def test_user_schema_is_rejected(spark, root):
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("segstore").schema("value binary").option(
            "subscribe", "events").load(root).collect()


@pytest.mark.parametrize("options, fragment", [
    ({"subscribe": "events", "startingOffsets": "latest"}, "startingOffsets"),
    ({"subscribe": "events", "assign": '{"events":[0]}'}, "exactly one of"),
    ({"subscribe": "events", "kafka.bootstrap.servers": "h:9092"}, "kafka.bootstrap.servers"),
    ({"subscribe": "events", "startingOffset": "earliest"}, "unknown option 'startingoffset'.*did you mean 'startingOffsets'"),
    ({"subscribe": "nope"}, "nope"),
])
def test_bad_options_fail_naming_the_option(spark, root, options, fragment):
    with pytest.raises(Exception, match=fragment):
        load(spark, root, **options).collect()


def test_consumer_plumbing_options_are_ignored(spark, root):
    got = collect(load(spark, root, subscribe="metrics-a", groupIdPrefix="x",
                       **{"kafka.group.id": "g", "fetchOffset.numRetries": "3"}))
    assert got == expected(root, whole(root, "metrics-a"))


def test_explicit_register(spark, root):
    segstore.spark.register(spark)
    assert collect(load(spark, root, subscribe="metrics-a")) == expected(
        root, whole(root, "metrics-a"))


# -- filter pushdown ------------------------------------------------------------------------

QUERY = ("partition IN (0, 2) AND offset BETWEEN 4 AND 30 "
         f"AND timestamp >= timestamp_millis({T0 + 12_000}) AND topic = 'events'")
# Rows QUERY selects: partitions 0 and 2, offsets 12..30 (timestamps reach T0 + 12000 at 12).
QUERY_ROWS = [("events", 0, 12, 31), ("events", 2, 12, 31)]

# DataSourceReader.pushFilters and the Filter classes arrived in pyspark 4.1 (SPARK-51271).
filter_pushdown = pytest.mark.skipif(
    not FILTER_PUSHDOWN, reason=f"pyspark {PYSPARK_VERSION} has no filter pushdown (4.1+)")


@pytest.fixture
def pushdown_enabled(spark):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    yield
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_filtered_read_without_pushdown(spark, root):
    assert collect(load(spark, root, subscribe="events").where(QUERY)) == expected(
        root, QUERY_ROWS)


@filter_pushdown
def test_pushdown_gives_the_same_rows(spark, root, pushdown_enabled):
    pushed = collect(load(spark, root, subscribe="events", pushFilters="true").where(QUERY))
    assert pushed == expected(root, QUERY_ROWS)


@pytest.mark.skipif(FILTER_PUSHDOWN, reason=f"pyspark {PYSPARK_VERSION} has filter pushdown")
def test_pushdown_option_needs_pyspark_4_1(spark, root):
    with pytest.raises(Exception, match="'pushFilters' needs filter pushdown.*pyspark 4.1"):
        load(spark, root, subscribe="events", pushFilters="true").where("offset > 3").collect()


@filter_pushdown
def test_pushdown_prunes_partitions_and_offsets(root):
    from pyspark.sql.datasource import (EqualTo, GreaterThanOrEqual, In, IsNotNull,
                                        LessThanOrEqual, StringStartsWith)
    import datetime as dt

    ds = SegstoreDataSource({"path": root, "subscribe": "events", "pushfilters": "true"})
    reader = ds.reader(ds.schema())
    ts = dt.datetime.fromtimestamp((T0 + 12_000) / 1000, tz=dt.timezone.utc)
    filters = [IsNotNull(("partition",)), In(("partition",), [0, 2]),
               GreaterThanOrEqual(("offset",), 4), LessThanOrEqual(("offset",), 30),
               GreaterThanOrEqual(("timestamp",), ts), EqualTo(("topic",), "events"),
               StringStartsWith(("value",), "v")]
    remaining = list(reader.pushFilters(filters))
    # Timestamps are not monotonic in a log and value is not indexed: Spark keeps those.
    assert [id(f) for f in remaining] == [id(filters[4]), id(filters[6])]
    ranges = [(p.topic, p.partition, p.start, p.end) for p in reader.partitions()]
    assert ranges == QUERY_ROWS
    # Without the option the plain reader plans every partition in full.
    plain = ds.__class__({"path": root, "subscribe": "events"}).reader(ds.schema())
    assert [(p.partition, p.start, p.end) for p in plain.partitions()] == [
        (p, 0, N) for p in range(3)]


@filter_pushdown
def test_pushdown_option_needs_the_spark_conf(spark, root):
    with pytest.raises(Exception, match="filterPushdown"):
        load(spark, root, subscribe="events", pushFilters="true").where("offset > 3").collect()


def test_read_is_unaffected_by_a_live_writer(spark, root):
    # A writable store held open in this process: tasks open their own read-only views.
    with segstore.open(root) as store:
        store.partition("metrics-a", 0).append(b"late")
        got = collect(load(spark, root, subscribe="metrics-a"))
    assert got["value"][-1] == b"late" and len(got["value"]) == end_offsets(root, "metrics-a")[0]


def test_a_timestamp_beyond_sparks_microseconds_is_an_error_not_a_wrapped_value(tmp_path):
    """ms * 1000 must not wrap around int64: Spark's Kafka source fails on such a record too."""
    from segstore.errors import InvalidRecordError
    from segstore.spark.reader import read_range

    root = str(tmp_path / "ts")
    limit = (2**63 - 1) // 1000
    with segstore.open(root) as store:
        store.create_topic("t", 1)
        store.partition("t", 0).append(b"edge", timestamp_ms=limit)
        store.partition("t", 0).append(b"beyond", timestamp_ms=limit + 1)
    [edge] = read_range(root, "t", 0, 0, 1, include_headers=False, fail_on_data_loss=True)
    assert edge.column("timestamp").cast("int64").to_pylist() == [limit * 1000]
    with pytest.raises(InvalidRecordError, match=f"offset 1 of t-0 has timestamp {limit + 1}"):
        list(read_range(root, "t", 0, 0, 2, include_headers=False, fail_on_data_loss=True))


@pytest.mark.parametrize("fail_on_data_loss", [False, True])
def test_retention_during_a_read_task_is_data_loss_not_a_crash(tmp_path, fail_on_data_loss):
    """The log start moves past a task's position between two of its chunks (another process
    deletes segments): the read goes on from the new start, or raises DataLossError, as the
    same gap found before the read would."""
    from segstore.spark.offsets import DataLossError
    from segstore.spark.reader import read_range

    root = str(tmp_path / "r")
    with segstore.open(root) as store:
        store.create_topic("r", 1, config={"segment.bytes": 20000, "file.delete.delay.ms": 0})
        for i in range(0, 10000, 100):
            store.partition("r", 0).append_batch([b"v%d" % j for j in range(i, i + 100)])
    batches = read_range(root, "r", 0, 0, 10000, include_headers=False,
                         fail_on_data_loss=fail_on_data_loss)
    first = next(batches)
    read = first.column("offset").to_pylist()
    with segstore.open(root) as store:  # meanwhile, in another process
        store.partition("r", 0).delete_records(6000)
        store.enforce_retention()  # removes the segments wholly below 6000
        start = store.partition("r", 0).segments[0].base_offset
    assert read[-1] + 1 < start  # the task's next chunk starts below what remains
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=f"from offset {read[-1] + 1}"):
            list(batches)
        return
    rest = [o for b in batches for o in b.column("offset").to_pylist()]
    assert rest == list(range(rest[0], 10000)) and read[-1] + 1 < start <= rest[0] <= 6000
