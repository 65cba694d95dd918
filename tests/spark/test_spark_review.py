"""Review of the segstore Spark source/sink against Spark's Kafka source and sink.

The first tests reproduce problems found in review and fail on the reviewed code; the ones
under "pinned" hold behaviour that was checked and matched Spark's Kafka connector.
"""

from __future__ import annotations

import json
import random

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql import functions as F
from pyspark.sql.datasource import CaseInsensitiveDict

import segstore
from segstore.spark.features import ADMISSION_CONTROL, FILTER_PUSHDOWN, PYSPARK_VERSION
from segstore.spark.options import InvalidOptionError, ReadOptions
from segstore.spark.source import SegstoreDataSource
from .sparkcheck import records

pytestmark = pytest.mark.spark

# The option is refused on pyspark 4.0, which has no filter pushdown (test_spark_options tests
# that refusal); the pushdown tests need 4.1+.
needs_pushdown = pytest.mark.skipif(
    not FILTER_PUSHDOWN, reason=f"pyspark {PYSPARK_VERSION} has no filter pushdown (4.1+)")

T0 = 1_700_000_000_000


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "store")
    with segstore.open(path) as st:
        st.create_topic("ev", 2)
        for p in range(2):
            lg = st.partition("ev", p)
            for i in range(10):
                lg.append(b"v%d" % i, key=b"k%d" % i, timestamp_ms=T0 + i * 1000)
        st.create_topic("out", 3)
    return path


@pytest.fixture
def pushdown(spark):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    yield
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def load(spark, root, stream=False, **options):
    reader = (spark.readStream if stream else spark.read).format("segstore")
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load(root)


def offsets(df):
    return sorted((r.topic, r.partition, r.offset)
                  for r in df.select("topic", "partition", "offset").collect())


def stream_options(**options):
    return CaseInsensitiveDict({k.lower(): v for k, v in options.items()})


# -- problems found -------------------------------------------------------------------------

@pytest.mark.parametrize("where", [
    "timestamp >= timestamp_millis(-1)",    # pushed bound -1 ms = Kafka's LATEST marker: 0 rows
    "timestamp > timestamp_millis(-4)",     # pushed bound -3 ms = MAX_TIMESTAMP marker: 2 rows
    "timestamp >= '1900-01-01'",            # InvalidOffsetError: unsupported timestamp
])
@needs_pushdown
def test_pushed_timestamp_bound_before_the_epoch_gives_the_rows_spark_would(spark, store,
                                                                             pushdown, where):
    # Every record is from 2023, so every one of these filters keeps all 20 rows. The pushed
    # lower bound goes to offset_for_time(), which reads negative ms as ListOffsets specs.
    plain = offsets(load(spark, store, subscribe="ev").where(where))
    assert len(plain) == 20
    assert offsets(load(spark, store, subscribe="ev", pushFilters="true").where(where)) == plain


def test_topic_option_overrides_a_topic_column_of_any_type(spark, store):
    # Kafka's sink: topicExpression = topic.map(Literal(_)).getOrElse(<column, must be string>)
    # so with the option the column is ignored whatever its type (ECO §2.3).
    df = spark.createDataFrame([(1, "a"), (2, "b")], "topic int, value string")
    df.write.format("segstore").mode("append").option("topic", "out").save(store)
    assert sorted(v for _, _, v, _ in records(store, "out")) == [b"a", b"b"]


@pytest.mark.parametrize("pattern", ["", "   "])
def test_an_empty_subscribe_pattern_is_an_error_naming_the_option(pattern, store):
    # Kafka: "Pattern to subscribe is empty as specified value for option 'subscribePattern'"
    # (KafkaSourceProvider.validateGeneralOptions trims the pattern first). segstore reads
    # nothing, silently.
    with pytest.raises(InvalidOptionError, match="subscribePattern"):
        ReadOptions.parse(stream_options(path=store, subscribePattern=pattern), streaming=False)


def test_subscribe_pattern_is_trimmed_like_kafkas(spark, store):
    # Kafka: SubscribePatternStrategy(caseInsensitiveParams("subscribepattern").trim()).
    assert len(offsets(load(spark, store, subscribePattern=" ev "))) == 20


def test_min_offsets_per_trigger_above_max_is_rejected(store):
    # Kafka: "The value of minOffsetPerTrigger(20) is higher than the maxOffsetsPerTrigger(15)"
    # (validateStreamOptions; KafkaMicroBatchSourceSuite "bad source options").
    with pytest.raises(InvalidOptionError, match="minOffsetsPerTrigger"):
        ReadOptions.parse(stream_options(path=store, subscribe="ev", minOffsetsPerTrigger="20",
                                         maxOffsetsPerTrigger="15"), streaming=True)


def test_max_trigger_delay_accepts_sparks_time_units(store):
    # Kafka parses maxTriggerDelay with Utils.timeStringAsMs, whose units include "us".
    opts = ReadOptions.parse(stream_options(path=store, subscribe="ev", minOffsetsPerTrigger="5",
                                            maxTriggerDelay="2000us"), streaming=True)
    assert opts.max_trigger_delay_ms == 2


def test_complete_output_mode_is_accepted_like_kafkas_sink(spark, store, tmp_path):
    # Kafka's sink supports Append, Update and Complete (KafkaTable's write builder is
    # SupportsTruncate with truncate() = this: complete mode appends the whole result table
    # each batch). segstore refuses complete, and its message suggests 'update', which Spark
    # then refuses for this Python sink ("segstore does not support Update mode").
    counts = (load(spark, store, stream=True, subscribe="ev", startingOffsets="earliest")
              .groupBy("partition").count()
              .select(F.col("partition").cast("string").alias("key"),
                      F.col("count").cast("string").alias("value")))
    query = (counts.writeStream.format("segstore").outputMode("complete")
             .option("topic", "out").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start(store))
    query.awaitTermination()
    assert query.exception() is None
    assert sorted(v for _, _, v, _ in records(store, "out")) == [b"10", b"10"]


# -- pinned: checked and matching Spark's Kafka connector -----------------------------------

def test_murmur2_parity_for_empty_unicode_and_binary_keys(spark, store):
    keys = [b"", "ü".encode(), b"\x00", bytes(range(256)), b"long key " * 20]
    df = spark.createDataFrame([(bytearray(k), b"v") for k in keys], "key binary, value binary")
    df.write.format("segstore").mode("append").option("topic", "out").save(store)
    got = records(store, "out")
    assert len(got) == len(keys)
    for p, key, _, _ in got:
        assert p == (murmur2(key) & 0x7FFFFFFF) % 3


@needs_pushdown
def test_pushdown_equals_no_pushdown_on_unordered_timestamps_and_compacted_gaps(
        spark, tmp_path, pushdown):
    root = str(tmp_path / "rnd")
    rnd = random.Random(7)
    with segstore.open(root) as st:
        st.create_topic("r", 2, config={"segment.bytes": "2000", "index.interval.bytes": "100"})
        st.create_topic("cc", 1, config={"cleanup.policy": "compact", "segment.bytes": "2000"})
        for p in range(2):
            for i in range(150):
                st.partition("r", p).append(b"v%d" % i, key=b"k%d" % rnd.randrange(20),
                                            timestamp_ms=T0 + rnd.randrange(100_000))
        for i in range(150):
            st.partition("cc", 0).append(b"v%d" % i, key=b"k%d" % rnd.randrange(10),
                                         timestamp_ms=T0 + i * 100)
        st.compact(force=True)
        st.partition("r", 1).delete_records(30)
    for where in [f"timestamp >= timestamp_millis({T0 + 40_000})",
                  f"timestamp > timestamp_millis({T0 + 7_000}) AND offset < 120",
                  f"timestamp = timestamp_millis({T0 + 5_000})",
                  "offset BETWEEN 20 AND 60 AND partition IN (1)", "topic LIKE 'c%'",
                  "offset IN (3, 31, 140) OR partition = 0"]:
        plain = offsets(load(spark, root, subscribe="r,cc").where(where))
        assert offsets(load(spark, root, subscribe="r,cc", pushFilters="true",
                            minPartitions="5").where(where)) == plain, where


@pytest.mark.parametrize("options, fragment", [
    ({"startingOffsetsByTimestamp": {"ev": {"0": T0}}}, "missing ev-1"),
    ({"endingOffsets": {"ev": {"0": 5}}}, "missing ev-1"),
    ({"startingOffsets": {"ev": {"0": 1, "1": 1, "2": 1}}}, "not selected ev-2"),
    ({"startingOffsets": {"ev": {"0": -1, "1": -2}}}, "not allowed in a batch query"),
    ({"endingOffsets": {"ev": {"0": -2, "1": -1}}}, "-2 = earliest is not allowed"),
])
def test_per_partition_json_rules(spark, store, options, fragment):
    with pytest.raises(Exception, match=fragment):
        load(spark, store, subscribe="ev", **options).collect()


def test_stream_skips_a_deleted_topic_without_fail_on_data_loss(tmp_path):
    root = str(tmp_path / "s")
    with segstore.open(root) as st:
        st.create_topic("a", 1)
        st.create_topic("b", 1)
        st.partition("a", 0).append_batch([b"x"] * 4)
        st.partition("b", 0).append_batch([b"y"] * 3)
    ds = SegstoreDataSource(stream_options(path=root, subscribePattern="a|b",
                                           startingOffsets="earliest", failOnDataLoss="false"))
    reader = ds.streamReader(ds.schema())

    def latest(start):  # the read-limit protocol of 4.2+, or the plain call of 4.0 and 4.1
        if ADMISSION_CONTROL:
            from pyspark.sql.streaming.datasource import ReadAllAvailable
            return reader.latestOffset(start, ReadAllAvailable())
        return reader.latestOffset()

    end = latest(reader.initialOffset())
    assert end == {"a": {"0": 4}, "b": {"0": 3}}
    with segstore.open(root) as st:
        st.delete_topic("b")
    assert latest(end) == {"a": {"0": 4}}
