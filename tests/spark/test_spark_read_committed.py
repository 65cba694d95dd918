"""``kafka.isolation.level`` in the segstore source: the consumer setting Spark's Kafka source
passes through. ``read_committed`` reads up to the last stable offset ("latest" means it, as a
read_committed consumer's endOffsets do) and leaves out aborted transactions' records; the
default, ``read_uncommitted``, reads everything up to the log end.

Expectations are written out from what the test appended (offsets listed by hand).
"""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

import segstore
from segstore.records import ControlRecordType
from segstore.spark import stores
from segstore.spark.options import InvalidOptionError, ReadOptions
from segstore.spark.reader import plan_ranges
from segstore.spark.stream import SegstoreStreamReader
from .test_spark_stream import run_stream, values

pytestmark = pytest.mark.spark
ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT


def fill(lg):
    """Offsets: 0 aborted (txn of 1), 1-2 plain, 3 committed (txn of 2), 4 ABORT marker,
    5 COMMIT marker, 6 plain, 7 open transaction of 3, 8 plain."""
    txn = dict(producer_epoch=0, is_transactional=True)
    lg.append_batch([b"aborted"], producer_id=1, base_sequence=0, **txn)
    lg.append_batch([b"p1", b"p2"])
    lg.append_batch([b"committed"], producer_id=2, base_sequence=0, **txn)
    lg.append_control(ABORT, producer_id=1, producer_epoch=0)
    lg.append_control(COMMIT, producer_id=2, producer_epoch=0)
    lg.append_batch([b"p6"])
    lg.append_batch([b"open"], producer_id=3, base_sequence=0, **txn)
    lg.append_batch([b"p8"])


@pytest.fixture
def root(tmp_path):
    path = str(tmp_path / "store")
    with segstore.open(path) as store:
        store.create_topic("in", 1)
        store.create_topic("out", 1)
        fill(store.partition("in", 0))
    return path


def read(spark, root, **options):
    reader = spark.read.format("segstore").option("subscribe", "in")
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted((r.offset, bytes(r.value)) for r in reader.load(root).collect())


def test_batch_read_committed(spark, root):
    assert read(spark, root, **{"kafka.isolation.level": "read_committed"}) == [
        (1, b"p1"), (2, b"p2"), (3, b"committed"), (6, b"p6")]
    # explicit offsets past the last stable offset still stop there
    assert read(spark, root, **{"kafka.isolation.level": "read_committed",
                                "endingOffsets": '{"in": {"0": 9}}'}) == [
        (1, b"p1"), (2, b"p2"), (3, b"committed"), (6, b"p6")]
    everything = [(0, b"aborted"), (1, b"p1"), (2, b"p2"), (3, b"committed"), (6, b"p6"),
                  (7, b"open"), (8, b"p8")]
    assert read(spark, root) == everything
    assert read(spark, root, **{"kafka.isolation.level": "read_uncommitted"}) == everything


def test_streaming_read_committed_stops_at_the_lso_then_goes_on(spark, root, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    opts = {"subscribe": "in", "startingOffsets": "earliest",
            "kafka.isolation.level": "read_committed"}
    assert run_stream(spark, root, ckpt, opts) == [4]
    assert values(root, "out") == sorted([b"p1", b"p2", b"committed", b"p6"])
    with segstore.open(root) as store:
        store.partition("in", 0).append_control(ABORT, producer_id=3, producer_epoch=0)  # 9
    assert run_stream(spark, root, ckpt, opts) == [1]  # p8; "open" was aborted
    assert values(root, "out") == sorted([b"p1", b"p2", b"committed", b"p6", b"p8"])


@pytest.mark.parametrize("level", ["READ_COMMITTED", "committed", ""])
def test_bad_isolation_level_names_the_option(level):
    with pytest.raises(InvalidOptionError, match="kafka.isolation.level"):
        ReadOptions.parse(CaseInsensitiveDict({"path": "/x", "subscribe": "t",
                                               "kafka.isolation.level": level}), False)


# -- timestamps under read_committed, planned without Spark ----------------------------------

T0 = 1_700_000_000_000


@pytest.fixture
def timed(tmp_path):
    """Offsets 0, 1 plain (T0, T0+1s), 2 an open transaction (T0+2s), 3 plain (T0+3s):
    the last stable offset is 2, the log end 4."""
    path = str(tmp_path / "timed")
    with segstore.open(path) as store:
        store.create_topic("in", 1)
        lg = store.partition("in", 0)
        lg.append_batch([b"p0", b"p1"], timestamps_ms=[T0, T0 + 1000])
        lg.append_batch([b"open"], timestamps_ms=[T0 + 2000], producer_id=3, producer_epoch=0,
                        base_sequence=0, is_transactional=True)
        lg.append_batch([b"p3"], timestamps_ms=[T0 + 3000])
        assert (lg.last_stable_offset, lg.log_end_offset) == (2, 4)
    return path


def plan(path, committed=True, streaming=False, **options):
    """Batch ranges [(start, end)] of in-0, or the stream's initial offset."""
    opts = {"path": path, "subscribe": "in", **{k.lower(): v for k, v in options.items()}}
    if committed:
        opts["kafka.isolation.level"] = "read_committed"
    o = ReadOptions.parse(opts, streaming=streaming)
    if streaming:
        return SegstoreStreamReader(o).initialOffset()["in"]["0"]
    with stores.readonly(path) as store:
        return [(s, e) for _, s, e in plan_ranges(store, o)]


@pytest.mark.parametrize("option", ["startingTimestamp", "startingOffsetsByTimestamp"])
def test_starting_timestamp_matches_only_below_the_lso(timed, option):
    # Kafka's ListOffsets at READ_COMMITTED answers offsets below the last stable offset only:
    # offset 3 (T0+3s) is above it, so it is no match.
    def ts(t):
        return str(t) if option == "startingTimestamp" else '{"in": {"0": %d}}' % t

    latest = {"startingOffsetsByTimestampStrategy": "latest"}
    assert plan(timed, **{option: ts(T0 + 3000)}, **latest) == [(2, 2)]  # the LSO: empty
    assert plan(timed, streaming=True, **{option: ts(T0 + 3000)}, **latest) == 2
    assert plan(timed, **{option: ts(T0 + 2000)}, **latest) == [(2, 2)]  # at the LSO: no match
    assert plan(timed, **{option: ts(T0 + 1000)}) == [(1, 2)]
    assert plan(timed, streaming=True, **{option: ts(T0 + 1000)}) == 1
    for streaming in (False, True):
        with pytest.raises(InvalidOptionError, match=f"{option}.*below its last stable offset"):
            plan(timed, streaming=streaming, **{option: ts(T0 + 3000)})
    # read_uncommitted sees every offset
    assert plan(timed, committed=False, **{option: ts(T0 + 3000)}) == [(3, 4)]
    assert plan(timed, committed=False, streaming=True, **{option: ts(T0 + 2000)}) == 2


@pytest.mark.parametrize("option", ["endingTimestamp", "endingOffsetsByTimestamp"])
def test_ending_timestamp_at_or_above_the_lso_means_latest(timed, option):
    def ts(t):
        return str(t) if option == "endingTimestamp" else '{"in": {"0": %d}}' % t

    assert plan(timed, **{option: ts(T0 + 3000)}) == [(0, 2)]  # no match: latest, the LSO
    assert plan(timed, **{option: ts(T0 + 2000)}) == [(0, 2)]
    assert plan(timed, **{option: ts(T0 + 1000)}) == [(0, 1)]
    assert plan(timed, committed=False, **{option: ts(T0 + 3000)}) == [(0, 3)]
