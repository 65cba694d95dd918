"""Spec conformance: the segstore source and sink against Spark's Kafka connector conventions.

One test per rule of /work/shared/docs/ecosystem-notes.md (ECO) §2.1 (row schema), §2.2 (read
options), §2.3 (sink) and the data source API constraints of §1.3, §1.5 and §1.7. Most rules are
checked on the planning functions directly (options, offsets, reader/stream planning, the sink's
schema check and router), without a Spark job; Kafka's behaviour is quoted from
``KafkaSourceProvider`` / ``KafkaOffsetReaderAdmin`` / ``KafkaWriter`` where a rule is subtle.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict, InputPartition

import segstore
from segstore import TopicPartition
from segstore.errors import InvalidRecordError, UnknownTopicOrPartitionError
from segstore.spark import stores
from segstore.spark.encode import BatchRouter, InputLayout, TopicInfo
from segstore.spark.offsets import (DataLossError, from_json, resolve_end, resolve_start,
                                    select_partitions, split_ranges, to_json)
from segstore.spark.options import InvalidOptionError, ReadOptions, WriteOptions
from segstore.spark.reader import OffsetRangePartition, plan_ranges, read_range
from segstore.spark.schema import arrow_schema, kafka_schema
from segstore.spark.source import SegstoreDataSource
from segstore.spark.writer import check_input_schema

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
N = 10  # records per partition of "ev"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """ev: 2 partitions of N records (record i at T0 + 1000 i); lat: LogAppendTime; gone:
    log start moved to 4; comp: compacted, with gaps inside its offsets."""
    path = str(tmp_path_factory.mktemp("spec") / "store")
    with segstore.open(path) as st:
        st.create_topic("ev", 2)
        for p in range(2):
            lg = st.partition("ev", p)
            for i in range(N):
                lg.append(b"v%d" % i, key=b"k%d" % i,
                          headers=[("h", b"x")] if i == 1 else None,
                          timestamp_ms=T0 + i * 1000)
        st.create_topic("lat", 1, config={"message.timestamp.type": "LogAppendTime"})
        st.partition("lat", 0).append(b"v", key=b"k", timestamp_ms=5)
        st.create_topic("gone", 1)
        st.partition("gone", 0).append_batch([b"g%d" % i for i in range(8)])
        st.partition("gone", 0).delete_records(4)
        st.create_topic("comp", 1, config={"cleanup.policy": "compact"})
        lg = st.partition("comp", 0)
        for i in range(12):
            lg.append(b"c%d" % i, key=b"k%d" % (i % 3))
        lg.roll()
        st.compact("comp", 0, force=True)
    return path


def parse(streaming=False, **options):
    """ReadOptions as Spark hands them over (lower-cased keys), with the store path."""
    opts = {"path": "/data/store", **options}
    return ReadOptions.parse({k.lower(): v for k, v in opts.items()}, streaming=streaming)


def source(path, **options):
    return SegstoreDataSource(CaseInsensitiveDict({"path": path, **{
        k: v if isinstance(v, str) else json.dumps(v) for k, v in options.items()}}))


def plan(path, **options):
    opts = ReadOptions.parse({"path": path, **{
        k.lower(): v if isinstance(v, str) else json.dumps(v) for k, v in options.items()}},
        streaming=False)
    with stores.readonly(path) as st:
        return plan_ranges(st, opts)


def ev(p):
    return TopicPartition("ev", p)


# -- §2.2 read options: keys, keywords, strategies ------------------------------------------

def test_option_keys_are_case_insensitive():
    """ECO §2.2 "all keys case-insensitive": any spelling of a key is the option."""
    o = ReadOptions.parse({"PATH": "/s", "SubscribePATTERN": "a.*", "STARTINGOFFSETS": "earliest",
                           "failondataloss": "false", "IncludeHeaders": "TRUE",
                           "MINPARTITIONS": "3"}, streaming=False)
    assert (o.path, o.subscribe_pattern, o.starting.kind) == ("/s", "a.*", "earliest")
    assert (o.fail_on_data_loss, o.include_headers, o.min_partitions) == (False, True, 3)


def test_offset_keywords_are_case_insensitive_and_trimmed():
    """ECO §2.2 startingOffsets / endingOffsets: Kafka trims the value and lower-cases the
    keywords (getKafkaOffsetRangeLimit); the strategy is upper-cased (Enumeration.withName)."""
    o = parse(subscribe="t", startingOffsets=" EARLIEST ", endingOffsets="Latest\n",
              startingOffsetsByTimestampStrategy="LATEST")
    assert (o.starting.kind, o.ending.kind, o.starting_strategy) == ("earliest", "latest",
                                                                     "latest")
    assert parse(True, subscribe="t", startingOffsets=" LaTeSt").starting.kind == "latest"
    assert parse(subscribe="t", startingOffsetsByTimestampStrategy="Error").starting_strategy \
        == "error"


@pytest.mark.parametrize("names", [("subscribe", "assign"), ("subscribePattern", "assign"),
                                   ("subscribe", "subscribePattern"),
                                   ("subscribe", "subscribePattern", "assign"), ()])
def test_exactly_one_of_subscribe_subscribe_pattern_and_assign(names):
    """ECO §2.2 "exactly one of assign/subscribe/subscribePattern": none or several is a
    validation error (Kafka's validateGeneralOptions), in batch and streaming queries."""
    values = {"subscribe": "t", "subscribePattern": "t", "assign": '{"t":[0]}'}
    for streaming in (False, True):
        with pytest.raises(InvalidOptionError, match="exactly one of"):
            parse(streaming, **{n: values[n] for n in names})


def test_lower_precedence_offset_options_are_not_validated():
    """ECO §2.2 precedence: startingTimestamp > startingOffsetsByTimestamp > startingOffsets
    (and the same for ending). Kafka never reads the losing options, so a value that would be
    an error on its own ('latest' as a batch start, 'earliest' as an end, bad JSON) is not."""
    o = parse(subscribe="t", startingTimestamp="5", startingOffsets="latest",
              endingTimestamp="9", endingOffsets="earliest")
    assert (o.starting.kind, o.ending.kind) == ("timestamp", "timestamp")
    o = parse(subscribe="t", startingOffsetsByTimestamp='{"t":{"0":5}}', startingOffsets="{bad",
              endingOffsetsByTimestamp='{"t":{"0":9}}', endingOffsets='{"t":{"0":-2}}')
    assert (o.starting.kind, o.ending.kind) == ("timestamps", "timestamps")


def test_specific_start_offset_after_specific_end_offset_is_an_error():
    """ECO §2.2 startingOffsets/endingOffsets JSON: Spark 4.1+ (checkOffsetLimitValidity,
    UNRESOLVED_START_OFFSET_GREATER_THAN_END_OFFSET) refuses a partition whose given start is
    above its given end when the query is built, whatever failOnDataLoss says; -2 / -1 are
    markers and are not compared."""
    for fail in ("true", "false"):
        with pytest.raises(InvalidOptionError, match="t-0.*5.*3"):
            parse(subscribe="t", startingOffsets='{"t":{"0":5,"1":0}}',
                  endingOffsets='{"t":{"0":3,"1":-1}}', failOnDataLoss=fail)
    o = parse(subscribe="t", startingOffsets='{"t":{"0":-2,"1":4}}',
              endingOffsets='{"t":{"0":3,"1":-1}}')
    assert o.ending.values == {("t", 0): 3, ("t", 1): -1}


def test_specific_start_timestamp_after_end_timestamp_is_an_error():
    """ECO §2.2 startingOffsetsByTimestamp/endingOffsetsByTimestamp: the same check for the
    per-partition timestamps (checkOffsetLimitValidity compares them before resolution)."""
    with pytest.raises(InvalidOptionError, match="t-0"):
        parse(subscribe="t", startingOffsetsByTimestamp='{"t":{"0":2000}}',
              endingOffsetsByTimestamp='{"t":{"0":1000}}')
    o = parse(subscribe="t", startingOffsetsByTimestamp='{"t":{"0":1000}}',
              endingOffsetsByTimestamp='{"t":{"0":1000}}')
    assert o.starting.values == o.ending.values


def test_min_offsets_above_max_offsets_is_an_error_in_batch_reads_too():
    """ECO §2.2 minOffsetsPerTrigger: Kafka compares it with maxOffsetsPerTrigger in
    validateGeneralOptions, which batch queries run too; only then are both ignored."""
    with pytest.raises(InvalidOptionError, match="minOffsetsPerTrigger"):
        parse(subscribe="t", minOffsetsPerTrigger="5", maxOffsetsPerTrigger="2")
    o = parse(subscribe="t", minOffsetsPerTrigger="2", maxOffsetsPerTrigger="5")
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger) == (None, None)


# -- §2.2 offsets against a store --------------------------------------------------------------

def test_resolved_start_after_end_is_an_error_whatever_fail_on_data_loss(root):
    """ECO §2.2 startingOffsets: a start that resolves above the end (an offset past the log
    end with endingOffsets latest, or a timestamp start after an offset end) is Kafka's
    RESOLVED_START_OFFSET_GREATER_THAN_END_OFFSET (an assertion before 4.1), never an empty
    range and never a failOnDataLoss matter."""
    for fail in ("true", "false"):
        with pytest.raises(InvalidOptionError, match="ev-0"):
            plan(root, subscribe="ev", startingOffsets={"ev": {"0": N + 5, "1": 0}},
                 failOnDataLoss=fail)
        with pytest.raises(InvalidOptionError, match="ev-1"):
            plan(root, subscribe="ev", startingTimestamp=str(T0 + 6000),
                 endingOffsets={"ev": {"0": 8, "1": 3}}, failOnDataLoss=fail)
    # Equal is an empty range, not an error.
    assert plan(root, subscribe="ev", startingOffsets={"ev": {"0": N, "1": 0}}) == [
        (ev(0), N, N), (ev(1), 0, N)]


def test_fail_on_data_loss_below_the_log_start(root):
    """ECO §2.2 failOnDataLoss: offsets below the log start (retention, DeleteRecords) fail by
    default and are skipped with false."""
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        plan(root, subscribe="gone", startingOffsets={"gone": {"0": 1}})
    assert plan(root, subscribe="gone", startingOffsets={"gone": {"0": 1}},
                failOnDataLoss="false") == [(TopicPartition("gone", 0), 4, 8)]


def test_compaction_gaps_are_not_data_loss(root):
    """ECO §2.2 failOnDataLoss: "out of range" means below the log start offset; offsets a
    compaction removed inside the log are skipped silently, as a consumer skips them."""
    with segstore.open(root, readonly=True) as st:
        lg = st.partition("comp", 0)
        start, end = lg.log_start_offset, lg.log_end_offset
        kept = lg.read_columns(start, end).offsets.tolist()
    assert len(kept) < end - start  # the fixture did leave gaps
    got = [o for b in read_range(root, "comp", 0, start, end, include_headers=False,
                                 fail_on_data_loss=True) for o in b.column("offset").to_pylist()]
    assert got == kept


def test_json_offsets_must_name_every_selected_partition_in_streams_too(root):
    """ECO §2.2 startingOffsets JSON: Kafka asserts the JSON names exactly the assigned
    partitions (KAFKA_START_OFFSET_DOES_NOT_MATCH_ASSIGNED) for a stream's first offset too."""
    ds = source(root, subscribe="ev", startingOffsets={"ev": {"0": 1}})
    with pytest.raises(InvalidOptionError, match="missing ev-1"):
        ds.streamReader(ds.schema()).initialOffset()


def test_stream_json_markers_resolve_to_earliest_and_latest(root):
    """ECO §2.2 startingOffsets JSON in a stream: -2 = earliest, -1 = latest, others as given."""
    ds = source(root, subscribePattern="ev|gone",
                startingOffsets={"ev": {"0": -1, "1": 3}, "gone": {"0": -2}})
    assert ds.streamReader(ds.schema()).initialOffset() == {"ev": {"0": N, "1": 3},
                                                            "gone": {"0": 4}}


def test_strategy_error_or_latest_per_partition(root):
    """ECO §2.2 startingOffsetsByTimestampStrategy: with 'error' (default) a partition with no
    record that new fails; with 'latest' only that partition starts at its end."""
    ts = parse(subscribe="ev", startingOffsetsByTimestamp=json.dumps(
        {"ev": {"0": T0 + 2500, "1": T0 + N * 1000}}))
    with segstore.open(root, readonly=True) as st:
        tps = select_partitions(st, ts)
        with pytest.raises(InvalidOptionError, match="startingOffsetsByTimestampStrategy"):
            resolve_start(st, tps, ts.starting, "error")
        assert resolve_start(st, tps, ts.starting, "latest") == {ev(0): 3, ev(1): N}


def test_ending_timestamp_without_match_is_latest(root):
    """ECO §2.2 endingTimestamp: one timestamp for every partition; no match = latest (the
    strategy option applies to starting offsets only)."""
    o = parse(subscribe="ev", endingTimestamp=str(T0 + 10 ** 9),
              startingOffsetsByTimestampStrategy="error")
    with segstore.open(root, readonly=True) as st:
        assert resolve_end(st, select_partitions(st, o), o.ending) == {ev(0): N, ev(1): N}
    o = parse(subscribe="ev", endingTimestamp=str(T0 + 4500))
    with segstore.open(root, readonly=True) as st:
        assert resolve_end(st, select_partitions(st, o), o.ending) == {ev(0): 5, ev(1): 5}


def test_min_partitions_does_not_split_when_there_are_enough_ranges():
    """ECO §2.2 minPartitions: a hint; Kafka's KafkaOffsetRangeCalculator splits nothing when
    the non-empty ranges already number minPartitions, and drops empty ranges first."""
    a, b, c = (TopicPartition("t", i) for i in range(3))
    ranges = [(a, 0, 1000), (b, 0, 1), (c, 5, 5)]
    assert split_ranges(ranges, min_partitions=2) == [(a, 0, 1000), (b, 0, 1)]
    assert len(split_ranges(ranges, min_partitions=3)) == 3


def test_new_stream_partition_not_starting_at_zero_is_data_loss(tmp_path):
    """ECO §2.2 failOnDataLoss / "newly discovered partitions start at earliest": Kafka reads a
    partition that appeared during the query from its earliest offset and reports data loss
    when that is not 0 (ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO): records were written
    and deleted before the query saw them."""
    path = str(tmp_path / "s")
    with segstore.open(path) as st:
        st.create_topic("a", 1)
    ds = source(path, subscribePattern="a|b", startingOffsets="earliest")
    reader = ds.streamReader(ds.schema())
    start = reader.initialOffset()
    with segstore.open(path) as st:
        st.create_topic("b", 1)
        st.partition("b", 0).append_batch([b"x"] * 5)
        st.partition("b", 0).delete_records(2)
    end = {"a": {"0": 0}, "b": {"0": 5}}
    with pytest.raises(DataLossError, match="b-0"):
        reader.partitions(start, end)
    lenient = source(path, subscribePattern="a|b", startingOffsets="earliest",
                     failOnDataLoss="false")
    got = lenient.streamReader(lenient.schema()).partitions(start, end)
    assert [(p.topic, p.start, p.end) for p in got] == [("b", 2, 5)]


# -- §2.1 schema and what read() yields ------------------------------------------------------

def test_schema_types_and_nullability():
    """ECO §2.1: Kafka's column types, every field nullable; headers only with includeHeaders,
    as array<struct<key:string,value:binary>>; Arrow types binary/int32/int64/timestamp[us,UTC]."""
    s = kafka_schema(False)
    assert s.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,"
                                "offset:bigint,timestamp:timestamp,timestampType:int>")
    h = kafka_schema(True)
    assert h.fieldNames()[-1] == "headers"
    assert h["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    assert all(f.nullable for f in h.fields)
    assert h["headers"].dataType.containsNull
    assert all(f.nullable for f in h["headers"].dataType.elementType.fields)
    a = arrow_schema(True)
    assert [str(f.type) for f in a][:7] == ["binary", "binary", "string", "int32", "int64",
                                           "timestamp[us, tz=UTC]", "int32"]
    assert all(f.nullable for f in a)


def test_read_batches_have_sparks_arrow_schema_and_kafka_timestamp_types(root):
    """ECO §2.1 and §1.3: every yielded batch equals Spark's expected Arrow schema exactly;
    timestampType is 0 for CreateTime and 1 for LogAppendTime; timestamps are ms in a us type;
    a record without headers has a null headers cell, not []."""
    for topic, tstype in (("ev", 0), ("lat", 1)):
        for headers in (False, True):
            batches = list(read_range(root, topic, 0, 0, 2 if topic == "ev" else 1,
                                      include_headers=headers, fail_on_data_loss=True))
            assert batches and all(b.schema.equals(arrow_schema(headers)) for b in batches)
            rows = pa.Table.from_batches(batches).to_pylist()
            assert {r["timestampType"] for r in rows} == {tstype}
            assert all(r["timestamp"].microsecond % 1000 == 0 for r in rows)
            if headers and topic == "ev":
                assert [r["headers"] for r in rows] == [None, [{"key": "h", "value": b"x"}]]
    ev0 = list(read_range(root, "ev", 0, 0, 1, include_headers=False, fail_on_data_loss=True))
    assert ev0[0].column("timestamp").cast(pa.int64()).to_pylist() == [T0 * 1000]


# -- §1.3 / §1.5 data source API contracts ---------------------------------------------------

def test_batch_partitions_is_a_list_of_input_partitions(root):
    """ECO §1.3: partitions() must return a list of InputPartition (a tuple or generator is
    DATA_SOURCE_TYPE_MISMATCH); no range at all is an empty list."""
    ds = source(root, subscribe="ev", minPartitions="3")
    parts = ds.reader(ds.schema()).partitions()
    assert type(parts) is list and len(parts) == 4  # Spark's rounding: 1.5 pieces each -> 2
    assert all(isinstance(p, InputPartition) for p in parts)
    empty = source(root, subscribe="ev", startingOffsets={"ev": {"0": N, "1": N}})
    assert empty.reader(empty.schema()).partitions() == []


def test_stream_partitions_between_equal_offsets_is_empty(root):
    """ECO §1.5: partitions(start, end) may be called with start == end and must then return
    an empty list."""
    ds = source(root, subscribe="ev", startingOffsets="earliest")
    reader = ds.streamReader(ds.schema())
    start = reader.initialOffset()
    assert reader.partitions(start, start) == []


def test_stream_offsets_are_kafka_json_and_survive_a_json_round_trip(root):
    """ECO §1.5 "offsets are JSON": Kafka's shape {"topic": {"0": n}} with string partition
    keys, so Spark's json.dumps/json.loads round trip changes nothing."""
    ds = source(root, subscribePattern="ev|gone", startingOffsets="earliest")
    reader = ds.streamReader(ds.schema())
    start = reader.initialOffset()
    assert start == {"ev": {"0": 0, "1": 0}, "gone": {"0": 4}}
    assert json.loads(json.dumps(start)) == start
    tps = {ev(0): 7, ev(1): 3}
    assert from_json(json.loads(json.dumps(to_json(tps)))) == tps
    parts = reader.partitions(json.loads(json.dumps(start)),
                              json.loads(json.dumps({"ev": {"0": 2, "1": 0}, "gone": {"0": 4}})))
    assert parts == [OffsetRangePartition("ev", 0, 0, 2)]


# -- §2.3 sink --------------------------------------------------------------------------------

def _schema(ddl):
    """A StructType from "name type, ..." (the few types these tests use; no session needed)."""
    from pyspark.sql import types as T

    headers = lambda v: T.ArrayType(T.StructType([  # noqa: E731
        T.StructField("key", T.StringType()), T.StructField("value", v)]))
    kinds = {"string": T.StringType(), "binary": T.BinaryType(), "int": T.IntegerType(),
             "bigint": T.LongType(), "double": T.DoubleType(),
             "array<struct<key:string,value:binary>>": headers(T.BinaryType()),
             "array<struct<key:string,value:string>>": headers(T.StringType())}
    return T.StructType([T.StructField(name, kinds[kind]) for name, kind in
                         (f.strip().split(" ", 1) for f in ddl.split(", "))])


@pytest.mark.parametrize("ddl, topic, fragment", [
    ("key string", "t", "required attribute 'value' not found"),
    ("value int", "t", "value attribute type must be a string or binary"),
    ("value binary, key int", "t", "key attribute type must be a string or binary"),
    ("value binary, topic binary", None, "topic attribute type must be a string"),
    ("value binary", None, "topic option required"),
    ("value binary, partition bigint", "t", "partition attribute type must be an int"),
    ("value binary, headers array<struct<key:string,value:string>>", "t",
     "headers attribute type must be array<struct<key:string,value:binary>>"),
])
def test_sink_column_types_are_checked_at_planning(ddl, topic, fragment):
    """ECO §2.3: value required (string/binary), key string/binary, topic string unless the
    topic option is set, partition int, headers array<struct<key:string,value:binary>>; the
    error names the attribute and the allowed types."""
    with pytest.raises(InvalidOptionError, match=fragment):
        check_input_schema(_schema(ddl), WriteOptions(path="/s", topic=topic))


def test_sink_accepts_kafkas_column_types():
    """ECO §2.3 / §1.7: key and value may be string or binary; headers, topic and partition
    optional; other columns are ignored."""
    lay = check_input_schema(_schema(
        "key string, value binary, topic string, partition int, extra double, "
        "headers array<struct<key:string,value:binary>>"), WriteOptions(path="/s"))
    assert lay == InputLayout(value="value", key="key", headers="headers", topic="topic",
                              partition="partition")
    lay = check_input_schema(_schema("value string, topic int"), WriteOptions(path="/s",
                                                                              topic="t"))
    assert (lay.value, lay.key, lay.topic) == ("value", None, None)


def test_sink_topic_option_is_trimmed():
    """ECO §2.3 topic option: Kafka's sink takes options.get("topic").map(_.trim)."""
    assert WriteOptions.parse({"path": "/s", "topic": " t \n"}, streaming=False).topic == "t"


def _router(layout, topic_option=None, partitions=3):
    info = TopicInfo(partitions=partitions, max_batch_bytes=1 << 20,
                     max_message_bytes=1 << 20, codec=0)
    return BatchRouter(layout, topic_option, lambda topic: info)


def test_sink_topic_option_overrides_a_null_topic_column():
    """ECO §2.3 "the topic option overrides the column": even a null topic cell is fine then."""
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b"], "topic": [None, "other"]})
    routed = list(_router(InputLayout(value="value"), "t").route(batch))
    assert {t for t, _, _, _ in routed} == {"t"} and sum(n for *_, n in routed) == 2


def test_sink_null_topic_without_the_option_is_an_error():
    """ECO §2.3: without the topic option a null topic cell fails the write (Kafka's
    KAFKA_NULL_TOPIC_IN_DATA)."""
    batch = pa.RecordBatch.from_pydict({"value": [b"a"], "topic": pa.array([None], pa.string())})
    with pytest.raises(InvalidRecordError, match="null topic"):
        list(_router(InputLayout(value="value", topic="topic")).route(batch))


def test_sink_partition_out_of_range_is_an_error_and_null_uses_the_partitioner():
    """ECO §2.3 partition: an explicit partition must exist; null means the partitioner
    (murmur2 of the key here)."""
    lay = InputLayout(value="value", key="key", partition="partition")
    bad = pa.RecordBatch.from_pydict({"value": [b"a"], "key": [b"k"],
                                      "partition": pa.array([3], pa.int32())})
    with pytest.raises(UnknownTopicOrPartitionError, match="partition 3"):
        list(_router(lay, "t").route(bad))
    neg = pa.RecordBatch.from_pydict({"value": [b"a"], "key": [b"k"],
                                      "partition": pa.array([-1], pa.int32())})
    with pytest.raises(UnknownTopicOrPartitionError, match="partition -1"):
        list(_router(lay, "t").route(neg))
    from kafka.partitioner.default import murmur2

    ok = pa.RecordBatch.from_pydict({"value": [b"a", b"b"], "key": [b"foo", b"foo"],
                                     "partition": pa.array([None, 0], pa.int32())})
    got = sorted(p for _, p, _, _ in _router(lay, "t").route(ok))
    assert (murmur2(b"foo") & 0x7FFFFFFF) % 3 == 2
    assert got == [0, 2]


# -- restart from a checkpoint (one real stream) ----------------------------------------------

def test_restarted_stream_ignores_starting_offsets(spark, tmp_path):
    """ECO §2.2 startingOffsets "only used for a new query; restarts resume from the
    checkpoint": a restart with startingOffsets=earliest does not read old records again."""
    path = str(tmp_path / "store")
    with segstore.open(path) as st:
        st.create_topic("in", 1)
        st.create_topic("out", 1)
        st.partition("in", 0).append_batch([b"old"] * 3)
    ckpt = os.path.join(str(tmp_path), "ckpt")

    def run(starting):
        query = (spark.readStream.format("segstore").option("subscribe", "in")
                 .option("startingOffsets", starting).load(path).select("value")
                 .writeStream.format("segstore").option("topic", "out")
                 .option("checkpointLocation", ckpt).trigger(availableNow=True).start(path))
        query.awaitTermination()

    run("latest")
    with segstore.open(path) as st:
        st.partition("in", 0).append_batch([b"new"] * 2)
    run("earliest")
    with segstore.open(path, readonly=True) as st:
        lg = st.partition("out", 0)
        assert lg.read_columns(0, lg.log_end_offset).values.to_pylist() == [b"new", b"new"]
