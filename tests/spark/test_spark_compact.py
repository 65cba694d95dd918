"""Distributed compaction: Spark tasks running the cleaner give what ``store.compact`` gives.

Two stores receive identical data; one is compacted in this process with ``store.compact``, the
other through ``segstore.spark.compact``; the surviving records and the cleaner's counters must
match, with the cleaner's clock fixed on both sides.
"""

from __future__ import annotations

import pytest

import segstore
import segstore.spark
from segstore.spark.compact import plan


NOW = 1_700_000_000_000


def fill(path):
    with segstore.open(path) as store:
        store.create_topic("users", 3, config={"cleanup.policy": "compact",
                                               "segment.bytes": 2048})
        store.create_topic("calm", 1, config={"cleanup.policy": "compact"})
        store.create_topic("plain", 1)
        for i in range(900):
            key = b"user-%d" % (i % 60)
            store.append("users", None if i % 89 == 0 else b"address-%d" % i, key=key,
                         timestamp_ms=NOW - 100_000 + i)
        store.append("calm", b"only", key=b"k", timestamp_ms=NOW - 1)


def contents(path, topic):
    with segstore.open(path, readonly=True) as store:
        return {p: [(r.offset, r.key, r.value) for r in store.partition(topic, p).iter_records()]
                for p in store.partitions_for(topic)}


COUNTERS = ["messages_read", "messages_written", "bytes_read", "bytes_written",
            "map_messages_read", "first_dirty_offset", "end_offset"]


def test_spark_compaction_matches_store_compact(spark, tmp_path):
    local, distributed = str(tmp_path / "local"), str(tmp_path / "distributed")
    fill(local)
    fill(distributed)
    with segstore.open(local) as store:
        expected = store.compact(now_ms=NOW)
    df = segstore.spark.compact(spark, distributed, now_ms=NOW)
    rows = df.collect()
    assert contents(distributed, "users") == contents(local, "users")
    assert contents(distributed, "calm") == contents(local, "calm")
    assert sorted((r.topic, r.partition, *[r[c] for c in COUNTERS]) for r in rows) == sorted(
        (s.topic, s.partition, *[getattr(s, c) for c in COUNTERS]) for s in expected)
    assert {r.topic for r in rows} == {"users"}  # "calm" had nothing cleanable
    assert sum(r.messages_read for r in rows) > sum(r.messages_written for r in rows) > 0
    assert all(0 < r.buffer_utilization <= 1 and r.elapsed_secs >= 0 for r in rows)
    # Nothing left to do: a second run plans no task and returns an empty frame.
    assert plan(distributed, now_ms=NOW) == []
    assert segstore.spark.compact(spark, distributed, now_ms=NOW).count() == 0
    # Once delete.retention.ms (a day) has passed, the tombstones kept above are purged.
    later = NOW + 2 * 86_400_000
    with_tombstones = sorted({("users", p) for p, recs in contents(local, "users").items()
                              if any(v is None for _, _, v in recs)})
    assert with_tombstones and plan(distributed, now_ms=later) == with_tombstones
    with segstore.open(local) as store:
        purged = store.compact(now_ms=later)
    rows = segstore.spark.compact(spark, distributed, now_ms=later).collect()
    assert len(rows) == len(purged) > 0
    assert contents(distributed, "users") == contents(local, "users")
    assert all(v is not None for recs in contents(local, "users").values() for _, _, v in recs)


def test_force_and_topic_selection(spark, tmp_path):
    path = str(tmp_path / "store")
    fill(path)
    with segstore.open(path) as store:
        store.compact(now_ms=NOW)  # clean everything that is eligible
        store.partition("users", 0).append_batch([b"late"], keys=[b"user-1"],
                                                 timestamps_ms=[NOW])
        store.partition("users", 0).roll()
    assert segstore.spark.compact(spark, path, topics="users", now_ms=NOW).count() == 0
    forced = segstore.spark.compact(spark, path, topics=["users"], force=True, now_ms=NOW)
    rows = forced.collect()
    assert [(r.topic, r.partition, r.forced) for r in rows] == [("users", 0, True)]
    values = [v for _, k, v in contents(path, "users")[0] if k == b"user-1"]
    assert values == [b"late"]
    with pytest.raises(segstore.errors.InvalidTopicError, match="cleanup.policy"):
        segstore.spark.compact(spark, path, topics="plain")
    with pytest.raises(segstore.errors.UnknownTopicOrPartitionError):
        segstore.spark.compact(spark, path, topics="nope")


def sizes(path, topic):
    with segstore.open(path, readonly=True) as store:
        return [store.partition(topic, p).size_bytes for p in store.partitions_for(topic)]


def test_tasks_wait_for_the_writer_lock_and_name_it(spark, tmp_path):
    path = str(tmp_path / "store")
    fill(path)
    before = sizes(path, "users")
    with segstore.open(path):  # the driver holds the lock: tasks must give up, not hang
        with pytest.raises(Exception, match="lockTimeoutMs"):
            segstore.spark.compact(spark, path, now_ms=NOW, lock_timeout_ms=300)
        assert sizes(path, "users") == before  # nothing was cleaned meanwhile
    # Tasks of the failed job still waiting when the lock came free may have cleaned their
    # partition; a new run cleans whatever is left, and then nothing remains to do.
    rounds = segstore.spark.compact(spark, path, now_ms=NOW).count()
    assert 1 <= rounds <= 3
    assert plan(path, now_ms=NOW) == []
    assert sum(sizes(path, "users")) < sum(before)
