"""Retention (REF §5): the time, size and log-start-offset rules, policies, the report, dry runs,
delayed deletion, the retention service in ``tick()``, unclean restarts (REF §7 #29) and readers
(threads in this process, a ``readonly=True`` store in another process) while segments go.

Expectations are computed here from REF §5's rules over the sizes and timestamps the tests chose;
time only moves through a fake clock and nothing sleeps. Every record's value, key and timestamp
are derived from its offset, so a reader can tell a torn or misplaced record from a good one.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import traceback
from collections import namedtuple

import pytest

import segstore
from conftest import FakeClock
from segstore import TopicPartition, _core
from segstore.config import TopicConfig
from segstore.errors import OffsetOutOfRangeError, ReadOnlyStoreError
from segstore.retention import (LOG_START_OFFSET, RETENTION_BYTES, RETENTION_MS,
                                DeletedSegment, PartitionRetention, RetentionReport,
                                deletable_segments, plan_retention)

T0 = 1_700_000_000_000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = ".kafka_cleanshutdown"
TP = TopicPartition("t", 0)


@pytest.fixture
def clock():
    return FakeClock(T0)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


def value(offset: int) -> bytes:
    return b"value-%08d" % offset


def key(offset: int) -> bytes:
    return b"k%d" % offset


def ts_of(offset: int) -> int:
    return T0 + offset


def check_record(r, offset: int) -> None:
    """A record is exactly the one written at ``offset`` (not torn, not misplaced)."""
    assert (r.offset, r.key, r.value) == (offset, key(offset), value(offset)), (r, offset)


def build(store, topic="t", partition=0, segments=((T0,),), empty_active=False):
    """Append one record per timestamp; ``segments`` is a list of timestamp lists, one per segment
    (the log rolls between them). Returns the log."""
    lg = store.partition(topic, partition)
    for i, stamps in enumerate(segments):
        for ts in stamps:
            off = lg.log_end_offset
            lg.append(value(off), key=key(off), timestamp_ms=ts)
        if i + 1 < len(segments) or empty_active:
            lg.roll()
    return lg


def names(lg):
    return sorted(os.listdir(lg.directory))


def log_files(lg):
    return sorted(n for n in os.listdir(lg.directory) if n.endswith(".log"))


def deleted_files(lg):
    return sorted(n for n in os.listdir(lg.directory) if n.endswith(".deleted"))


def offsets(lg):
    return [r.offset for r in lg.iter_records()]


def run_py(code: str, *args, timeout=60):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# The pure rules over stand-in segments
# ---------------------------------------------------------------------------------------------

Seg = namedtuple("Seg", "base_offset size largest_timestamp")


def segs(*specs):
    """``(base, size, largest_ts)`` triples -> stand-in segments."""
    return [Seg(*s) for s in specs]


def cfg(**kw):
    return TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})


def plan(segments, config, now=T0, start=None, leo=None, **kw):
    start = segments[0].base_offset if start is None else start
    leo = segments[-1].base_offset + 10 if leo is None else leo
    return [(s.base_offset, why) for s, why in
            plan_retention(segments, start, leo, config, now, **kw)]


def test_time_rule_is_strictly_older_than_retention_ms():
    s = segs((0, 100, T0 - 1000), (10, 100, T0 - 999), (20, 100, T0))
    c = cfg(retention_ms=999)
    # age 1000 > 999 goes; age 999 is not > 999 and stops the scan
    assert plan(s, c) == [(0, RETENTION_MS)]
    assert plan(s, cfg(retention_ms=998)) == [(0, RETENTION_MS), (10, RETENTION_MS)]
    assert plan(s, cfg(retention_ms=1000)) == []
    assert plan(s, cfg(retention_ms=-1), now=T0 + 10**12) == []  # -1: forever


def test_time_rule_equal_timestamps_expire_together():
    s = segs((0, 100, T0), (10, 100, T0), (20, 100, T0), (30, 100, T0 + 5))
    assert plan(s, cfg(retention_ms=100), now=T0 + 100) == []
    assert plan(s, cfg(retention_ms=100), now=T0 + 101) == [
        (0, RETENTION_MS), (10, RETENTION_MS), (20, RETENTION_MS)]


def test_time_rule_stops_at_first_segment_that_is_not_old_enough():
    # out-of-order timestamps: the third segment is old, but the second stops the scan
    s = segs((0, 100, T0), (10, 100, T0 + 10_000), (20, 100, T0), (30, 100, T0))
    assert plan(s, cfg(retention_ms=1000), now=T0 + 5000) == [(0, RETENTION_MS)]


def test_time_rule_retention_ms_zero():
    s = segs((0, 100, T0 - 1), (10, 100, T0))
    assert plan(s, cfg(retention_ms=0), now=T0) == [(0, RETENTION_MS)]


def test_future_timestamps_never_expire_and_warn(caplog):
    s = segs((0, 100, T0 + 60_000), (10, 100, T0 - 10**9))
    with caplog.at_level(logging.WARNING, logger="segstore.retention"):
        assert plan(s, cfg(retention_ms=0), now=T0, topic_partition=TP) == []
    warnings = [r for r in caplog.records if r.name == "segstore.retention"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    msg = warnings[0].getMessage()
    assert "t-0" in msg and "future" in msg and str(T0 + 60_000) in msg
    # ... and still never old enough while it stays in the future
    assert plan(s, cfg(retention_ms=0), now=T0 + 59_999) == []
    assert plan(s, cfg(retention_ms=0), now=T0 + 60_001) == [(0, RETENTION_MS), (10, RETENTION_MS)]


def test_size_rule_exactly_at_the_limit_deletes_nothing():
    s = segs((0, 100, T0), (10, 100, T0), (20, 50, T0))
    assert plan(s, cfg(retention_bytes=250)) == []      # size == retention.bytes: diff 0
    assert plan(s, cfg(retention_bytes=251)) == []      # below the limit: rule off
    assert plan(s, cfg(retention_bytes=-1)) == []       # off


def test_size_rule_deletes_while_the_rest_stays_at_or_above_the_limit():
    s = segs((0, 100, T0), (10, 100, T0), (20, 50, T0))
    assert plan(s, cfg(retention_bytes=150)) == [(0, RETENTION_BYTES)]            # diff 100
    assert plan(s, cfg(retention_bytes=149)) == [(0, RETENTION_BYTES)]            # diff 101
    assert plan(s, cfg(retention_bytes=51)) == [(0, RETENTION_BYTES)]             # diff 199
    assert plan(s, cfg(retention_bytes=50)) == [(0, RETENTION_BYTES), (10, RETENTION_BYTES)]
    # retention.bytes 0: every segment, the active one included (the caller rolls first)
    assert plan(s, cfg(retention_bytes=0)) == [
        (0, RETENTION_BYTES), (10, RETENTION_BYTES), (20, RETENTION_BYTES)]


def test_size_rule_stops_at_a_segment_too_big_for_what_is_left():
    s = segs((0, 10, T0), (10, 500, T0), (20, 10, T0), (30, 10, T0))
    # size 530, limit 400: diff 130; 10 fits (120 left), 500 does not -> stop, 20 and 30 stay
    assert plan(s, cfg(retention_bytes=400)) == [(0, RETENTION_BYTES)]


def test_log_start_offset_rule():
    s = segs((0, 100, T0), (10, 100, T0), (20, 100, T0), (30, 100, T0))
    c = cfg(retention_ms=-1)
    assert plan(s, c, start=0) == []
    assert plan(s, c, start=9) == []                       # inside the first segment
    assert plan(s, c, start=10) == [(0, LOG_START_OFFSET)]  # next.base <= start
    assert plan(s, c, start=25) == [(0, LOG_START_OFFSET), (10, LOG_START_OFFSET)]
    # the last segment has no next: the start-offset rule never takes it
    assert plan(s, c, start=40, leo=40) == [(0, LOG_START_OFFSET), (10, LOG_START_OFFSET),
                                            (20, LOG_START_OFFSET)]


def test_last_segment_is_never_deleted_while_empty():
    s = segs((0, 100, T0 - 10**6), (10, 0, T0 - 10**6))
    assert plan(s, cfg(retention_ms=1), leo=10) == [(0, RETENTION_MS)]
    assert plan(s, cfg(retention_bytes=0), leo=10) == [(0, RETENTION_BYTES)]
    # an empty segment that is not the last one can go
    s = segs((0, 0, T0 - 10**6), (5, 100, T0 - 10**6), (10, 100, T0))
    assert plan(s, cfg(retention_ms=1), leo=20) == [(0, RETENTION_MS), (5, RETENTION_MS)]


def test_high_watermark_bounds_deletion():
    s = segs((0, 100, T0 - 10**6), (10, 100, T0 - 10**6), (20, 100, T0 - 10**6))
    always = lambda seg, nxt: True  # noqa: E731
    bases = lambda found: [x.base_offset for x in found]  # noqa: E731
    assert bases(deletable_segments(s, always, 30)) == [0, 10, 20]
    assert bases(deletable_segments(s, always, 30, high_watermark=29)) == [0, 10]
    assert bases(deletable_segments(s, always, 30, high_watermark=20)) == [0, 10]
    assert bases(deletable_segments(s, always, 30, high_watermark=19)) == [0]
    assert deletable_segments([], always, 0) == []


def test_rules_run_in_kafka_order_each_over_what_is_left():
    # start offset 10 removes segment 0 first; the size rule then sees 300 bytes, not 400
    s = segs((0, 100, T0), (10, 100, T0), (20, 100, T0), (30, 100, T0))
    c = cfg(retention_bytes=200, retention_ms=10**9)
    assert plan(s, c, start=10) == [(0, LOG_START_OFFSET), (10, RETENTION_BYTES)]
    # then the time rule over what the size rule left
    s = segs((0, 100, T0 - 5000), (10, 100, T0 - 5000), (20, 100, T0 - 5000), (30, 100, T0))
    c = cfg(retention_bytes=300, retention_ms=1000)
    assert plan(s, c, start=10) == [(0, LOG_START_OFFSET), (10, RETENTION_MS),
                                    (20, RETENTION_MS)]


@pytest.mark.parametrize("policy, expected", [
    ("delete", [(0, LOG_START_OFFSET), (10, RETENTION_BYTES), (20, RETENTION_MS)]),
    ("compact,delete", [(0, LOG_START_OFFSET), (10, RETENTION_BYTES), (20, RETENTION_MS)]),
    ("delete,compact", [(0, LOG_START_OFFSET), (10, RETENTION_BYTES), (20, RETENTION_MS)]),
    ("compact", [(0, LOG_START_OFFSET)]),
    ("", [(0, LOG_START_OFFSET)]),
])
def test_policies_choose_the_rules(policy, expected):
    # 0: below the log start offset; 10: over retention.bytes; 20: older than retention.ms
    s = segs((0, 100, T0), (10, 100, T0), (20, 100, T0 - 5000), (30, 100, T0))
    c = cfg(cleanup_policy=policy, retention_bytes=200, retention_ms=1000)
    assert plan(s, c, start=10) == expected


# ---------------------------------------------------------------------------------------------
# A store: deleting, the report, rolling, dry runs
# ---------------------------------------------------------------------------------------------

def open_store(root, clock, **config):
    return segstore.open(root, clock=clock, config=config or None)


def test_time_retention_on_a_store(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000, "file.delete.delay.ms": 5000})
        lg = build(s, segments=[[T0, T0 + 10], [T0 + 20, T0 + 500], [T0 + 2000, T0 + 2001]])
        sizes = [seg.size for seg in lg.segments]
        clock.now = T0 + 1501  # segment 0 (largest 10) and 1 (largest 500) are past 1000 ms
        report = s.enforce_retention()
        assert isinstance(report, RetentionReport) and not report.dry_run
        assert report.now_ms == T0 + 1501
        p = report[("t", 0)]
        assert isinstance(p, PartitionRetention)
        assert p.topic_partition == TP and p.cleanup_policy == ("delete",)
        assert [(d.base_offset, d.end_offset, d.size_bytes, d.largest_timestamp, d.reason)
                for d in p.deleted] == [(0, 2, sizes[0], T0 + 10, RETENTION_MS),
                                        (2, 4, sizes[1], T0 + 500, RETENTION_MS)]
        assert p.segments_deleted == 2 and p.bytes_deleted == sizes[0] + sizes[1]
        assert (p.old_log_start_offset, p.log_start_offset, p.log_end_offset) == (0, 4, 6)
        assert not p.rolled
        assert report.segments_deleted == 2 and report.bytes_deleted == p.bytes_deleted
        assert lg.log_start_offset == 4 and [x.base_offset for x in lg.segments] == [4]
        assert offsets(lg) == [4, 5]
        assert s.beginning_offsets([TP]) == {TP: 4}
        # the files are renamed, not yet deleted
        assert log_files(lg) == ["00000000000000000004.log"]
        for base in (0, 2):
            for suffix in (".log", ".index", ".timeindex"):
                assert f"{base:020d}{suffix}.deleted" in names(lg)
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(3)
        # a second pass at the same time finds nothing
        again = s.enforce_retention()
        assert again.segments_deleted == 0 and again[TP].log_start_offset == 4
    with segstore.open(root, clock=clock) as s:
        lg = s.partition("t", 0)
        assert lg.log_start_offset == 4 and offsets(lg) == [4, 5]
        assert not deleted_files(lg)


def test_all_segments_expired_rolls_first_and_keeps_one_empty_segment(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000})
        lg = build(s, segments=[[T0], [T0 + 1], [T0 + 2, T0 + 3]])
        assert lg.log_end_offset == 4
        clock.now = T0 + 10_000
        report = s.enforce_retention()
        p = report[TP]
        assert [d.base_offset for d in p.deleted] == [0, 1, 2] and p.rolled
        assert p.deleted[-1].end_offset == 4
        assert lg.log_start_offset == lg.log_end_offset == 4 == p.log_start_offset
        (only,) = lg.segments
        assert only.base_offset == 4 and only.size == 0
        assert log_files(lg) == ["00000000000000000004.log"]
        assert list(lg.iter_records()) == [] and lg.read(4) == []
        assert "rolled first" in str(p)
        # the empty active segment is never deleted, however old the clock says it is
        clock.advance(10**9)
        assert s.enforce_retention().segments_deleted == 0
        assert lg.append(value(4), key=key(4), timestamp_ms=clock.now).offset == 4
        assert offsets(lg) == [4]
    with segstore.open(root, clock=clock) as s:
        assert s.partition("t", 0).log_start_offset == 4 and offsets(s.partition("t", 0)) == [4]


def test_expired_sealed_segments_with_empty_active_segment_need_no_roll(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000})
        lg = build(s, segments=[[T0], [T0 + 1]], empty_active=True)
        active = lg.segments[-1]
        assert active.size == 0 and active.base_offset == 2
        clock.now = T0 + 10_000
        p = s.enforce_retention()[TP]
        assert [d.base_offset for d in p.deleted] == [0, 1] and not p.rolled
        assert lg.segments == (active,)  # the same empty segment, not a new one
        assert lg.log_start_offset == lg.log_end_offset == 2


def test_size_retention_on_a_store(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", num_partitions=2)
        lg = build(s, segments=[[T0], [T0], [T0], [T0]])
        size = lg.size_bytes
        seg_size = lg.segments[0].size
        assert all(x.size == seg_size for x in lg.segments)
        s.alter_topic_config("t", {"retention.bytes": size})  # exactly at the limit
        assert s.enforce_retention().segments_deleted == 0
        s.alter_topic_config("t", {"retention.bytes": size - 1})  # a segment would undershoot
        assert s.enforce_retention().segments_deleted == 0
        s.alter_topic_config("t", {"retention.bytes": size - seg_size})
        report = s.enforce_retention()
        assert [(d.base_offset, d.reason) for d in report[TP].deleted] == [(0, RETENTION_BYTES)]
        assert report[("t", 1)].deleted == ()   # the empty partition: nothing
        assert lg.size_bytes == size - seg_size
        s.alter_topic_config("t", {"retention.bytes": seg_size})
        assert [d.base_offset for d in s.enforce_retention()[TP].deleted] == [1, 2]
        assert lg.log_start_offset == 3 and offsets(lg) == [3]
        s.alter_topic_config("t", {"retention.bytes": 0})
        p = s.enforce_retention()[TP]
        assert p.rolled and lg.log_start_offset == lg.log_end_offset == 4


def test_log_start_offset_retention_after_delete_records(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"cleanup.policy": "compact"})
        lg = build(s, segments=[[T0] * 3, [T0] * 3, [T0] * 3])
        assert lg.delete_records(7) == 7
        p = s.enforce_retention()[TP]
        assert [(d.base_offset, d.reason) for d in p.deleted] == [(0, LOG_START_OFFSET),
                                                                  (3, LOG_START_OFFSET)]
        # the log start offset stays where delete_records put it (above the first segment base)
        assert lg.log_start_offset == 7 == p.log_start_offset
        assert [x.base_offset for x in lg.segments] == [6] and offsets(lg) == [7, 8]


@pytest.mark.parametrize("policy, deleted", [
    ("delete", [0, 3, 6]), ("compact,delete", [0, 3, 6]), ("compact", [0]), ("", [0])])
def test_policies_on_a_store(root, clock, policy, deleted):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"cleanup.policy": policy, "retention.ms": 1000})
        lg = build(s, segments=[[T0] * 3, [T0] * 3, [T0] * 3, [T0 + 10**6]])
        lg.delete_records(3)
        clock.now = T0 + 5000
        assert [d.base_offset for d in s.enforce_retention()[TP].deleted] == deleted
        assert lg.log_start_offset == deleted[-1] + 3


def test_include_compacted_false_skips_compacted_logs(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("c", config={"cleanup.policy": "compact,delete", "retention.ms": 10})
        s.create_topic("d", config={"retention.ms": 10})
        build(s, "c", segments=[[T0], [T0 + 10**6]])
        build(s, "d", segments=[[T0], [T0 + 10**6]])
        clock.now = T0 + 1000
        report = s.enforce_retention(include_compacted=False)
        assert set(report.partitions) == {TopicPartition("d", 0)}
        assert report.segments_deleted == 1
        assert s.enforce_retention()[("c", 0)].segments_deleted == 1


def test_dry_run_changes_nothing_and_predicts_the_real_pass(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", num_partitions=2, config={"retention.ms": 1000})
        build(s, partition=0, segments=[[T0], [T0 + 1], [T0 + 2]])
        build(s, partition=1, segments=[[T0], [T0 + 5000]])
        lg = s.partition("t", 0)
        before = {p: (names(s.partition("t", p)), s.partition("t", p).segments,
                      s.partition("t", p).log_start_offset) for p in (0, 1)}
        clock.now = T0 + 4000
        dry = s.enforce_retention(dry_run=True)
        assert dry.dry_run and dry.segments_deleted == 4
        assert dry[TP].rolled and dry[TP].log_start_offset == 3
        assert dry[("t", 1)].log_start_offset == 1
        after = {p: (names(s.partition("t", p)), s.partition("t", p).segments,
                     s.partition("t", p).log_start_offset) for p in (0, 1)}
        assert after == before
        assert s.metrics()["pending-deletes"] == 0
        text = str(dry)
        assert text.startswith("retention dry run") and "would delete 4 segments" in text
        real = s.enforce_retention()
        assert real.partitions == dry.partitions  # the same per-partition results
        assert lg.log_start_offset == 3


def test_readonly_store_allows_only_dry_runs(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000})
        build(s, segments=[[T0], [T0 + 10**6]])
    with segstore.open(root, readonly=True, clock=clock) as ro:
        with pytest.raises(ReadOnlyStoreError):
            ro.enforce_retention()
        clock.now = T0 + 5000
        dry = ro.enforce_retention(dry_run=True)
        assert [d.base_offset for d in dry[TP].deleted] == [0]
        assert log_files(ro.partition("t", 0)) == ["00000000000000000000.log",
                                                   "00000000000000000001.log"]


def test_report_contents_and_str(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", num_partitions=3, config={"retention.ms": 1000})
        s.create_topic("u", config={"retention.bytes": 0})
        build(s, "t", 0, segments=[[T0], [T0 + 100], [T0 + 10**6]])
        lg_u = build(s, "u", 0, segments=[[T0]])
        build(s, "t", 2, segments=[[T0 + 10**6]])
        clock.now = T0 + 2000
        report = s.enforce_retention()
        assert set(report.partitions) == {TopicPartition("t", p) for p in range(3)} | {
            TopicPartition("u", 0)}
        assert set(report.changed) == {TP, TopicPartition("u", 0)}
        assert report.errors == {}
        u = report[("u", 0)]
        assert u.rolled and u.deleted[0].reason == RETENTION_BYTES and lg_u.log_start_offset == 1
        assert report.segments_deleted == 3
        assert report.bytes_deleted == sum(p.bytes_deleted for p in report.partitions.values())
        text = str(report)
        lines = text.splitlines()
        assert lines[0] == (f"retention pass at {T0 + 2000} ms: deleted 3 segments "
                            f"({report.bytes_deleted} bytes) from 2 of 4 partitions")
        assert lines[1].startswith("  t-0: 2 segments, ") and "log start offset 0 -> 2" in lines[1]
        assert lines[2].startswith("    00000000000000000000: offsets [0, 1), ")
        assert f"retention.ms (largest timestamp {T0}, 2000 ms old)" in lines[2]
        assert f"largest timestamp {T0 + 100}, 1900 ms old" in lines[3]
        assert lines[4].startswith("  u-0: 1 segment, ") and "rolled first" in lines[4]
        assert lines[5].endswith("retention.bytes")
        assert len(lines) == 6  # partitions with nothing deleted are left out
        assert str(report[("t", 1)]) == "t-1: nothing to delete, log start offset 0"
        d = DeletedSegment(5, 9, 100, -1, LOG_START_OFFSET)
        assert d.describe() == "00000000000000000005: offsets [5, 9), 100 bytes, below the log start offset"


def test_segment_without_timestamps_uses_the_file_mtime(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000})
        lg = build(s, segments=[[-1, -1], [T0 + 10**6]])
        first = lg.segments[0]
        assert first.max_timestamp_so_far == -1
        os.utime(first.log_path, ns=(T0 * 10**6, T0 * 10**6))
        clock.now = T0 + 1000
        assert s.enforce_retention().segments_deleted == 0
        clock.now = T0 + 1001
        p = s.enforce_retention()[TP]
        assert [(d.base_offset, d.largest_timestamp) for d in p.deleted] == [(0, T0)]


def test_alter_config_takes_effect_at_the_next_pass(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": -1})
        lg = build(s, segments=[[T0], [T0 + 1], [T0 + 2], [T0 + 10**6]])
        clock.now = T0 + 10**5
        assert s.enforce_retention().segments_deleted == 0
        s.alter_topic_config("t", {"cleanup.policy": "compact", "retention.ms": 10})
        assert s.enforce_retention().segments_deleted == 0   # compact: no time rule
        s.alter_topic_config("t", {"cleanup.policy": "compact,delete"})
        assert [d.base_offset for d in s.enforce_retention()[TP].deleted] == [0, 1, 2]
        assert lg.log_start_offset == 3
        # back to forever; new old data stays
        s.alter_topic_config("t", delete=["retention.ms", "cleanup.policy"])
        assert s.topic_config("t").retention_ms == 604_800_000
        assert s.enforce_retention().segments_deleted == 0
    with segstore.open(root, clock=clock) as s:  # the altered config persisted
        assert s.topic_config("t").cleanup_policy == ("delete",)


def test_a_reader_holding_a_segment_keeps_reading_it(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000})
        lg = build(s, segments=[[T0] * 5, [T0 + 10**6] * 5])
        held = lg.segments[0]
        buf, start, end = held.read_range(0, 1 << 20)
        clock.now = T0 + 5000
        assert s.enforce_retention().segments_deleted == 1
        assert held.log_path.endswith(".log.deleted")
        for r, off in zip(_core.decode_records(buf, start, end), range(5)):
            check_record(r, off)
        # and through the segment object, after the rename
        buf2, start2, end2 = held.read_range(2, 1 << 20)
        assert [r.offset for r in _core.decode_records(buf2, start2, end2, min_offset=2)] == [2, 3, 4]
        # the log itself: below the new start offset is out of range, from it works
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(2)
        for r in lg.read(lg.log_start_offset):
            check_record(r, r.offset)


# ---------------------------------------------------------------------------------------------
# Delayed deletion and the retention service
# ---------------------------------------------------------------------------------------------

def test_deleted_files_go_only_after_file_delete_delay(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000, "file.delete.delay.ms": 5000})
        lg = build(s, segments=[[T0], [T0], [T0 + 10**6]])
        clock.now = t = T0 + 2000
        assert s.enforce_retention().segments_deleted == 2
        gone = [f"{b:020d}{x}.deleted" for b in (0, 1) for x in (".index", ".log", ".timeindex")]
        assert deleted_files(lg) == sorted(gone)
        assert s.metrics()["pending-deletes"] == 2
        s.tick(now_ms=t + 4999)
        assert deleted_files(lg) == sorted(gone)
        s.tick(now_ms=t + 5000)
        assert deleted_files(lg) == []
        assert s.metrics()["pending-deletes"] == 0
        assert log_files(lg) == ["00000000000000000002.log"]


def test_close_removes_pending_deleted_files(root, clock):
    with open_store(root, clock) as s:
        s.create_topic("t", config={"retention.ms": 1000, "file.delete.delay.ms": 10**9})
        lg = build(s, segments=[[T0], [T0 + 10**6]])
        clock.now = T0 + 2000
        s.enforce_retention()
        assert deleted_files(lg)
    assert not [n for n in os.listdir(os.path.join(root, "t-0")) if n.endswith(".deleted")]


def test_tick_runs_retention_every_check_interval(root, clock):
    opened = clock.now
    with open_store(root, clock, **{"log.retention.check.interval.ms": 10_000}) as s:
        s.create_topic("t", config={"retention.ms": 1000, "file.delete.delay.ms": 0})
        lg = build(s, segments=[[T0 - 5000], [T0 + 15_000], [T0 + 10**6]])
        s.tick(now_ms=opened + 9_999)       # first pass: one interval (< 30 s) after opening
        assert lg.log_start_offset == 0
        s.tick(now_ms=opened + 10_000)
        assert lg.log_start_offset == 1
        assert not deleted_files(lg)         # delay 0: the same tick removed the files
        # segment 1 expires at T0 + 16_001, but the next pass is due at opened + 20_000
        s.tick(now_ms=T0 + 17_000)
        assert lg.log_start_offset == 1
        s.tick(now_ms=opened + 20_000)
        assert lg.log_start_offset == 2


def test_first_retention_pass_at_most_30s_after_open(root, clock):
    opened = clock.now
    with open_store(root, clock) as s:  # default interval: 300 s
        s.create_topic("t", config={"retention.ms": 1000})
        lg = build(s, segments=[[T0 - 5000], [T0 + 10**6]])
        s.tick(now_ms=opened + 29_999)
        assert lg.log_start_offset == 0
        s.tick(now_ms=opened + 30_000)
        assert lg.log_start_offset == 1


def test_a_failing_partition_does_not_stop_the_pass(root, clock, caplog, monkeypatch):
    with open_store(root, clock) as s:
        s.create_topic("a", config={"retention.ms": 10})
        s.create_topic("b", config={"retention.ms": 10})
        build(s, "a", segments=[[T0], [T0 + 10**6]])
        lb = build(s, "b", segments=[[T0], [T0 + 10**6]])
        la = s.partition("a", 0)

        def broken(*a, **k):
            raise OSError("disk on fire")
        monkeypatch.setattr(la, "delete_segments", broken)
        clock.now = T0 + 1000
        with caplog.at_level(logging.ERROR, logger="segstore.store"):
            report = s.enforce_retention()
        assert report.errors == {TopicPartition("a", 0): "OSError: disk on fire"}
        assert "a-0: failed: OSError: disk on fire" in str(report)
        assert lb.log_start_offset == 1
        assert any("retention of a-0 failed" in r.getMessage() for r in caplog.records)


def test_retention_and_delete_topic_do_not_deadlock(root, clock):
    """Retention holds a log's lock while it hands segments to the store's delete queue (the
    store's lock); delete_topic holds the store's lock while it closes the logs (their locks).
    The pass takes the store's lock first, so the two cannot wait for each other."""
    s = open_store(root, clock)
    s.create_topic("t", config={"retention.ms": 10})
    lg = build(s, segments=[[T0], [T0 + 10**6]])
    clock.now = T0 + 1000
    in_retire, done = threading.Event(), threading.Event()
    real = lg._delete_later

    def slow_delete_later(seg, delay_ms):
        in_retire.set()
        threading.Event().wait(0.3)  # let delete_topic reach for the locks meanwhile
        real(seg, delay_ms)
    lg._delete_later = slow_delete_later
    reports = []
    t1 = threading.Thread(target=lambda: reports.append(s.enforce_retention()), daemon=True)
    t2 = threading.Thread(target=lambda: (in_retire.wait(10), s.delete_topic("t"), done.set()),
                          daemon=True)
    t1.start()
    t2.start()
    t1.join(10)
    t2.join(10)
    # On a deadlock the store stays open (closing it would hang too): the test just fails.
    assert not t1.is_alive() and not t2.is_alive(), "deadlock between retention and delete_topic"
    try:
        assert done.is_set() and reports[0].segments_deleted == 1
        assert s.list_topics() == [] and not os.path.exists(os.path.join(root, "t-0"))
    finally:
        s.close()


def test_start_services_runs_retention_in_the_background(root, clock):
    config = {"log.retention.check.interval.ms": 1000, "log.flush.scheduler.interval.ms": 50}
    s = open_store(root, clock, **config)
    try:
        s.create_topic("t", config={"retention.ms": 1000, "file.delete.delay.ms": 0})
        lg = build(s, segments=[[T0], [T0 + 10**6]])
        ran = threading.Event()
        real = s.enforce_retention

        def spy(*a, **k):
            report = real(*a, **k)
            if report.segments_deleted:
                ran.set()
            return report
        s.enforce_retention = spy
        clock.advance(5000)
        s.start_services()
        assert ran.wait(10), "the service thread never ran retention"
        assert lg.log_start_offset == 1
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# REF §7 #29: segments deleted by retention do not come back after an unclean restart
# ---------------------------------------------------------------------------------------------

CRASH_AFTER_RETENTION = """
    import json, os, sys, segstore
    root, now, checkpoint_first = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    s = segstore.open(root, clock=lambda: now)
    s.create_topic("t", config={"retention.ms": 1000, "file.delete.delay.ms": 10**9})
    lg = s.partition("t", 0)
    for seg in range(5):
        for i in range(4):
            off = lg.log_end_offset
            ts = now - 10_000 if seg < 3 else now
            lg.append(b"value-%08d" % off, key=b"k%d" % off, timestamp_ms=ts)
        lg.roll()
    lg.flush()
    if checkpoint_first:
        s.write_checkpoints()        # a log-start checkpoint that predates the deletion
    report = s.enforce_retention()
    print(json.dumps({"deleted": [d.base_offset for d in report[("t", 0)].deleted],
                      "start": lg.log_start_offset, "end": lg.log_end_offset}))
    sys.stdout.flush()
    os._exit(0)  # no close: no marker, no checkpoints, the .deleted files stay on disk
"""


@pytest.mark.parametrize("checkpoint_first", [False, True])
def test_retention_deletions_survive_an_unclean_restart(root, clock, checkpoint_first):
    r = run_py(CRASH_AFTER_RETENTION, root, str(T0), "1" if checkpoint_first else "0")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"deleted": [0, 4, 8], "start": 12, "end": 20}
    d = os.path.join(root, "t-0")
    assert not os.path.exists(os.path.join(root, MARKER))
    left = sorted(os.listdir(d))
    assert "00000000000000000000.log.deleted" in left and "00000000000000000008.log.deleted" in left
    with segstore.open(root, clock=clock) as s:
        lg = s.partition("t", 0)
        assert not deleted_files(lg)                 # leftovers removed on open
        assert log_files(lg) == ["00000000000000000012.log", "00000000000000000016.log",
                                 "00000000000000000020.log"]
        assert lg.log_start_offset == 12
        got = list(lg.iter_records())
        assert [r.offset for r in got] == list(range(12, 20))
        for rec in got:
            check_record(rec, rec.offset)
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(0)
        assert lg.append(value(20), key=key(20)).offset == 20
    with segstore.open(root, clock=clock) as s:  # and again after a clean close
        assert s.partition("t", 0).log_start_offset == 12
        assert offsets(s.partition("t", 0)) == list(range(12, 21))


# ---------------------------------------------------------------------------------------------
# Readers while retention deletes segments under them
# ---------------------------------------------------------------------------------------------

def _append_range(lg, n):
    first = lg.log_end_offset
    offs = range(first, first + n)
    lg.append_batch([value(o) for o in offs], [key(o) for o in offs], None,
                    [ts_of(o) for o in offs])


class Readers:
    """Reader threads iterating ``lg`` (``per_kind`` with read(), as many with iter_records())
    until stopped.

    Allowed: OffsetOutOfRangeError for a position below the new log start offset, after which
    reading from ``log_start_offset`` must work. Anything else, or any record that is not the one
    written at its offset, is recorded in ``errors`` (with its traceback).
    """

    def __init__(self, lg, per_kind: int = 2):
        self.lg = lg
        self.stop = threading.Event()
        self.progress = threading.Event()
        self.errors: list = []
        self.stats = {"records": 0, "out_of_range": 0, "restarts_ok": 0}
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self._by_read, self._by_iter) * per_kind]

    def __enter__(self):
        # Four busy readers hold the GIL for the whole 5 ms switch interval every time the
        # writer gives it up for a syscall; a shorter interval keeps the test's time bounded.
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        sys.setswitchinterval(self._interval)
        assert not any(t.is_alive() for t in self.threads)

    def step(self):
        """Let the readers make some progress before the next deletion (bounded wait)."""
        self.progress.clear()
        self.progress.wait(1.0)

    def _count(self, key, n=1):
        with self._lock:
            self.stats[key] += n
        self.progress.set()

    def _guard(self, fn):
        try:
            fn()
        except BaseException:  # noqa: BLE001 - reported by the test
            self.errors.append(traceback.format_exc())

    def _restart(self, pos):
        lg = self.lg
        for _ in range(1000):
            start = lg.log_start_offset
            assert pos < start, f"OffsetOutOfRangeError at {pos}, but the log starts at {start}"
            try:
                recs = lg.read(start, max_records=1)
            except OffsetOutOfRangeError:
                pos = start   # it moved again meanwhile
                continue
            assert recs and recs[0].offset >= start
            check_record(recs[0], recs[0].offset)
            self._count("restarts_ok")
            return start
        raise AssertionError("could not read from the log start offset")

    def _by_read(self):
        lg = self.lg
        pos = lg.log_start_offset
        while not self.stop.is_set():
            try:
                recs = lg.read(pos, max_records=7, max_bytes=300)
            except OffsetOutOfRangeError:
                self._count("out_of_range")
                pos = self._restart(pos)
                continue
            for i, r in enumerate(recs):
                check_record(r, pos + i)
            self._count("records", len(recs))
            pos = pos + len(recs) if recs else lg.log_start_offset

    def _by_iter(self):
        lg = self.lg
        while not self.stop.is_set():
            start = expect = lg.log_start_offset
            try:
                for r in lg.iter_records(start):
                    check_record(r, expect)
                    expect += 1
                    if expect % 8 == 0:
                        self._count("records", 8)
                    if self.stop.is_set():
                        break
            except OffsetOutOfRangeError:
                self._count("out_of_range")
                self._restart(expect)


def test_reader_threads_while_retention_deletes(root, clock):
    """Readers iterate while retention deletes the segments under them, oldest first, one pass
    after another: no torn or misplaced record, no error but OffsetOutOfRangeError below the
    new log start offset."""
    with open_store(root, clock) as s:
        s.create_topic("t", config={"segment.bytes": 200, "retention.ms": 1000,
                                    "file.delete.delay.ms": 10**12})
        lg = s.partition("t", 0)
        for _ in range(80):             # one 4-record batch per segment
            _append_range(lg, 4)
        assert len(lg.segments) == 80
        deleted = 0
        with Readers(lg) as readers:
            for k in range(70):
                # segment k holds offsets 4k..4k+3; its largest timestamp is T0 + 4k + 3
                clock.now = T0 + 1000 + 4 * k + 4
                readers.step()
                p = s.enforce_retention()[TP]
                deleted += p.segments_deleted
                assert p.log_start_offset == 4 * (k + 1)
        assert readers.errors == [], readers.errors[0]
        assert deleted == 70 and lg.log_start_offset == 280
        assert readers.stats["records"] > 0
        assert [r.offset for r in lg.iter_records()] == list(range(280, 320))


def test_reader_threads_while_appends_roll_and_retention_deletes(root, clock):
    """As above, with an appender rolling new segments and retention.bytes deleting old ones."""
    with open_store(root, clock) as s:
        s.create_topic("t", config={"segment.bytes": 600, "retention.bytes": 6000,
                                    "retention.ms": -1, "file.delete.delay.ms": 10**12})
        lg = s.partition("t", 0)
        for _ in range(40):
            _append_range(lg, 5)
        deleted = 0
        with Readers(lg, per_kind=1) as readers:
            for i in range(60):
                _append_range(lg, 10)
                clock.advance(1)
                readers.step()
                deleted += s.enforce_retention().segments_deleted
        assert readers.errors == [], readers.errors[0]
        assert deleted > 30
        assert lg.size_bytes <= 6000 + 600
        assert readers.stats["records"] > 0
        for r in lg.iter_records():
            check_record(r, r.offset)


READONLY_READER = """
    import json, os, sys, time
    import segstore
    from segstore.errors import OffsetOutOfRangeError
    root, stop_file = sys.argv[1], sys.argv[2]
    stats = {"records": 0, "out_of_range": 0, "restarts_ok": 0, "passes": 0, "errors": []}
    deadline = time.monotonic() + 30
    ro = segstore.open(root, readonly=True)
    lg = ro.partition("t", 0)
    def check(r, off):
        want = (off, b"k%d" % off, b"value-%08d" % off)
        if (r.offset, r.key, r.value) != want:
            raise AssertionError(f"read {(r.offset, r.key, r.value)!r}, want {want!r}")
    pos = lg.log_start_offset
    ready = False
    try:
        while time.monotonic() < deadline:
            if os.path.exists(stop_file):
                break
            try:
                recs = lg.read(pos, max_records=5, max_bytes=200)
            except OffsetOutOfRangeError:
                stats["out_of_range"] += 1
                start = lg.log_start_offset
                if not pos < start:
                    raise AssertionError(f"out of range at {pos}, log start {start}")
                pos = start
                continue
            for i, r in enumerate(recs):
                check(r, pos + i)
            stats["records"] += len(recs)
            if recs:
                pos += len(recs)
            else:
                stats["passes"] += 1
                pos = lg.log_start_offset
            if not ready:
                print("ready", flush=True)
                ready = True
    except BaseException as e:
        stats["errors"].append(repr(e))
    if not ready:
        print("ready", flush=True)
    print(json.dumps(stats), flush=True)
    ro.close()
"""


def test_readonly_reader_process_while_retention_deletes(root, tmp_path):
    clock = FakeClock(T0)
    stop_file = str(tmp_path / "stop")
    with open_store(root, clock) as s:
        s.create_topic("t", config={"segment.bytes": 500, "retention.bytes": 3000,
                                    "retention.ms": -1, "file.delete.delay.ms": 0})
        lg = s.partition("t", 0)
        for _ in range(30):
            _append_range(lg, 4)
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(READONLY_READER), root,
                                 stop_file], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            deleted = 0
            for _ in range(250):
                _append_range(lg, 3)
                clock.advance(1)
                deleted += s.enforce_retention().segments_deleted
                s.tick()  # delay 0: the .deleted files are unlinked right away
            open(stop_file, "w").close()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        stats = json.loads(out.strip().splitlines()[-1])
        assert stats["errors"] == [], (stats, err)
        assert stats["records"] > 0
        assert deleted > 50
        assert not deleted_files(lg)
