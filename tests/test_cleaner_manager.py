"""LogCleanerManager (REF §6.3; ports of REF §7 #51-#56 and part of #57).

Cleanable ranges, dirty ratios and LogToClean byte counts are checked against hand sums of the
segment files' sizes on disk (not the segments' own counters); selection by dirty ratio, the
skipping of uncleanable, in-progress and paused partitions, bad checkpoints, the active segment,
min/max.compaction.lag.ms (a fake clock; nothing sleeps), the LSO bound, the state machine
(None / InProgress / Aborted / Paused(n)) including an abort from another thread while a round
runs, deletable_logs, the ``cleaner-offset-checkpoint`` file in Kafka's text format, segstore's
deadline scheduling (overdue logs first, most overdue first) and ``describe()``.

Every test log is built from segments of identical shape (the same number of records with values
of the same length, closed with ``roll()``), so each sealed segment has the same size and ratios
such as 1/4 and 2/4 are exact.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import pytest

import segstore
from conftest import FakeClock
from segstore import TopicPartition
from segstore.cleaner import LogCleanerManager
from segstore.cleaner.cleaner import Cleaner
from segstore.errors import CleaningAbortedError, InvalidOffsetError, SegstoreError
from segstore.records import ControlRecordType

T0 = 1_700_000_000_000
PER_SEG = 10        # records per sealed segment
SEG_STEP = 100      # ms between the first records of consecutive segments
CP_NAME = "cleaner-offset-checkpoint"


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def clock():
    return FakeClock(T0 + 10 * SEG_STEP)


@pytest.fixture
def store(tmp_path, clock):
    s = segstore.open(str(tmp_path / "store"), clock=clock)
    yield s
    s.close()


def ts(seg: int, j: int) -> int:
    """Timestamp of record ``j`` of sealed segment ``seg`` (its largest is ts(seg, PER_SEG-1))."""
    return T0 + seg * SEG_STEP + j


def fill(lg, nsegs: int, active: int = 3, keys: int = PER_SEG) -> None:
    """``nsegs`` sealed segments of PER_SEG one-record batches, then ``active`` records in the
    active segment. Record j of segment i: key k<j % keys>, value of a fixed length."""
    base = lg.log_end_offset
    for i in range(nsegs):
        for j in range(PER_SEG):
            lg.append(b"v%04d" % (base + i * PER_SEG + j), key=b"k%d" % (j % keys),
                      timestamp_ms=ts(i, j))
        lg.roll()
    for j in range(active):
        lg.append(b"v%04d" % (base + nsegs * PER_SEG + j), key=b"k%d" % (j % keys),
                  timestamp_ms=ts(nsegs, j))


def disk_sizes(lg) -> dict:
    """{base offset: size of <base>.log on disk}, from the directory listing."""
    out = {}
    for name in os.listdir(lg.directory):
        m = re.fullmatch(r"(\d{20})\.log", name)
        if m:
            out[int(m.group(1))] = os.path.getsize(os.path.join(lg.directory, name))
    return dict(sorted(out.items()))


def write_cp(store, entries: dict) -> None:
    """Write cleaner-offset-checkpoint by hand in Kafka's format."""
    lines = ["0", str(len(entries))] + [f"{t} {p} {o}" for (t, p), o in sorted(entries.items())]
    with open(os.path.join(store.path, CP_NAME), "w") as f:
        f.write("\n".join(lines) + "\n")


def read_cp_text(store) -> str:
    p = os.path.join(store.path, CP_NAME)
    if not os.path.exists(p):
        return ""
    with open(p) as f:
        return f.read()


def compacted(store, name: str, partitions: int = 1, **cfg) -> list:
    conf = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.2}
    conf.update({k.replace("_", "."): v for k, v in cfg.items()})
    store.create_topic(name, partitions, conf)
    return [store.partition(name, p) for p in range(partitions)]


def records(lg) -> list:
    return [(r.offset, r.key, r.value) for r in lg.iter_records()]


def wait_until(pred, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


# -- LogToClean: ranges, bytes, ratio (REF #42, #52, §6.3) ---------------------------------------


def test_segments_have_equal_sizes(store):
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    sizes = disk_sizes(lg)
    assert list(sizes) == [0, 10, 20, 30, 40]
    assert len({sizes[b] for b in (0, 10, 20, 30)}) == 1
    assert sizes[40] > 0  # the active segment holds records too


@pytest.mark.parametrize("checkpoint", [None, 0, 15, 20, 30, 39])
def test_log_to_clean_bytes_and_ratio_match_hand_sums(store, clock, checkpoint):
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    s = disk_sizes(lg)
    mgr = store.cleaner_manager
    ltc = mgr.log_to_clean(lg, checkpoint, clock())
    first_dirty = 0 if checkpoint is None else checkpoint
    # clean = segments with base < first dirty; cleanable = segments from the one holding the
    # first dirty offset up to the active segment (a partially cleaned one counts in both).
    clean = {None: 0, 0: 0, 15: s[0] + s[10], 20: s[0] + s[10], 30: s[0] + s[10] + s[20],
             39: s[0] + s[10] + s[20] + s[30]}[checkpoint]
    cleanable = {None: s[0] + s[10] + s[20] + s[30], 0: s[0] + s[10] + s[20] + s[30],
                 15: s[10] + s[20] + s[30], 20: s[20] + s[30], 30: s[30], 39: s[30]}[checkpoint]
    assert ltc.first_dirty_offset == first_dirty
    assert ltc.first_uncleanable_offset == 40       # the active segment's base
    assert ltc.clean_bytes == clean
    assert ltc.cleanable_bytes == cleanable
    assert ltc.total_bytes == clean + cleanable     # the active segment is not counted
    assert ltc.cleanable_ratio == pytest.approx(cleanable / (clean + cleanable))
    assert ltc.compaction_delay_ms == 0 and not ltc.need_compaction_now
    if checkpoint is not None:
        write_cp(store, {("t", 0): checkpoint})
    d = mgr.describe("t", 0)
    assert (d["first_dirty_offset"], d["first_uncleanable_offset"], d["clean_bytes"],
            d["cleanable_bytes"]) == (first_dirty, 40, clean, cleanable)
    assert d["dirty_ratio"] == pytest.approx(ltc.cleanable_ratio)


def test_checkpoint_beyond_log_end_resets_to_log_start_and_is_rewritten(store, caplog):
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    write_cp(store, {("t", 0): 999})
    caplog.set_level(logging.WARNING, logger="segstore.cleaner")
    ltc = store.cleaner_manager.grab_filthiest_compacted_log()
    assert ltc is not None and ltc.first_dirty_offset == 0
    assert read_cp_text(store) == "0\n1\nt 0 0\n"
    assert any("999" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("policy, warns", [("compact", True), ("compact,delete", False)])
def test_checkpoint_below_log_start_resets_to_log_start(store, caplog, policy, warns):
    (lg,) = compacted(store, "t", cleanup_policy=policy, retention_ms=-1)
    fill(lg, 4)
    assert lg.delete_records(15) == 15
    write_cp(store, {("t", 0): 5})
    s = disk_sizes(lg)
    caplog.set_level(logging.WARNING, logger="segstore.cleaner")
    ltc = store.cleaner_manager.grab_filthiest_compacted_log()
    assert ltc is not None
    assert ltc.first_dirty_offset == 15
    assert read_cp_text(store) == "0\n1\nt 0 15\n"
    # first dirty 15 lies inside segment 10: it counts as clean and as cleanable.
    assert ltc.clean_bytes == s[0] + s[10]
    assert ltc.cleanable_bytes == s[10] + s[20] + s[30]
    warned = [r for r in caplog.records
              if r.levelno == logging.WARNING and "resetting" in r.getMessage()]
    assert bool(warned) == warns  # Kafka suppresses it for compact,delete below the start


def test_valid_checkpoint_is_not_rewritten(store):
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    write_cp(store, {("t", 0): 20})
    path = os.path.join(store.path, CP_NAME)
    os.utime(path, (1, 1))
    assert store.cleaner_manager.grab_filthiest_compacted_log().first_dirty_offset == 20
    assert os.stat(path).st_mtime == 1
    assert read_cp_text(store) == "0\n1\nt 0 20\n"


def test_active_segment_is_never_cleanable(store, clock):
    (lg, lg1) = compacted(store, "t", 2, min_cleanable_dirty_ratio=0.0)
    fill(lg, 4, active=6)
    assert lg.log_end_offset == 46
    write_cp(store, {("t", 0): 43})   # points into the active segment
    mgr = store.cleaner_manager
    ltc = mgr.log_to_clean(lg, 43, clock())
    assert ltc.first_dirty_offset == 43
    assert ltc.cleanable_bytes == 0
    assert ltc.first_uncleanable_offset == 40
    # A one-segment log: everything is in the active segment.
    for i in range(50):
        lg1.append(b"x", key=b"k%d" % (i % 3), timestamp_ms=T0)
    assert len(lg1.segments) == 1
    d = mgr.describe("t", 1)
    assert d["cleanable_bytes"] == 0 and d["eligible"] is False
    assert d["reason"].startswith("nothing cleanable")
    assert mgr.grab_filthiest_compacted_log() is None
    assert mgr.state(TopicPartition("t", 0)) is None and mgr.state(TopicPartition("t", 1)) is None
    # Forcing does not reach into the active segment either.
    before = records(lg1)
    assert store.compact("t", 1, force=True) == []
    assert records(lg1) == before


def test_min_compaction_lag_bounds_the_range(store, clock):
    lag = 1000
    (lg,) = compacted(store, "t", min_compaction_lag_ms=lag)
    fill(lg, 4)
    s = disk_sizes(lg)
    mgr = store.cleaner_manager
    # Largest timestamps: segment i -> ts(i, 9). A sealed segment is cleanable only when its
    # largest timestamp <= now - lag; the first younger one bounds the range.
    clock.now = ts(0, 9) + lag - 1            # even segment 0 is too young
    assert mgr.log_to_clean(lg, None, clock()).cleanable_bytes == 0
    assert mgr.grab_filthiest_compacted_log() is None
    assert store.compact() == []             # REF #57: nothing is cleaned before the min lag
    clock.now = ts(1, 9) + lag                # segments 0 and 1 are old enough, 2 is not
    ltc = mgr.log_to_clean(lg, None, clock())
    assert ltc.uncleanable_offset == 20 and ltc.first_uncleanable_offset == 20
    assert ltc.cleanable_bytes == s[0] + s[10]
    clock.now = ts(2, 9) + lag                # ... and now segment 2
    ltc = mgr.log_to_clean(lg, None, clock())
    assert ltc.first_uncleanable_offset == 30
    assert ltc.cleanable_bytes == s[0] + s[10] + s[20]
    # A clean at this time stops at offset 30 and leaves segment 30 on as it was.
    seg30 = open(os.path.join(lg.directory, "%020d.log" % 30), "rb").read()
    stats = store.compact("t")
    assert [st.end_offset for st in stats] == [30]
    assert read_cp_text(store) == "0\n1\nt 0 30\n"
    assert open(os.path.join(lg.directory, "%020d.log" % 30), "rb").read() == seg30
    offs = [o for o, _, _ in records(lg)]
    assert offs[-13:] == list(range(30, 43))           # nothing at/after 30 went
    assert offs[:-13] == list(range(20, 30))           # below 30 only the latest per key


def test_open_transaction_bounds_the_range(store, clock):
    """REF #56: the last stable offset bounds the cleanable range (rounded to its segment)."""
    (lg,) = compacted(store, "t")
    fill(lg, 2, active=0)
    lg.append_batch([b"t1", b"t2"], [b"a", b"b"], producer_id=7, producer_epoch=0,
                    base_sequence=0, is_transactional=True, timestamps_ms=[ts(2, 0)] * 2)
    fill(lg, 2, active=2)        # segments 20 (holds the open txn at 20), 32, 42(active)
    assert lg.last_stable_offset == 20
    s = disk_sizes(lg)
    mgr = store.cleaner_manager
    ltc = mgr.log_to_clean(lg, None, clock())
    assert ltc.uncleanable_offset == 20 and ltc.first_uncleanable_offset == 20
    assert ltc.cleanable_bytes == s[0] + s[10]
    lg.append_control(ControlRecordType.COMMIT, producer_id=7, producer_epoch=0)
    assert lg.last_stable_offset == lg.log_end_offset
    bases = list(disk_sizes(lg))
    ltc = mgr.log_to_clean(lg, None, clock())
    assert ltc.first_uncleanable_offset == bases[-1]
    s = disk_sizes(lg)
    assert ltc.cleanable_bytes == sum(s[b] for b in bases[:-1])


def test_max_compaction_lag_makes_a_log_eligible_at_ratio_one(store, clock):
    """REF #57 (part): min.cleanable.dirty.ratio = 1.0 never lets the ratio qualify; the max
    lag does, exactly once the oldest dirty batch is older than max.compaction.lag.ms."""
    lag = 10_000
    (lg,) = compacted(store, "t", min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=lag)
    fill(lg, 4)
    mgr = store.cleaner_manager
    earliest = ts(0, 0)                 # first batch of the first dirty segment
    clock.now = earliest + lag          # cleanUntil == earliest: not overdue yet
    assert mgr.log_to_clean(lg, None, clock()).compaction_delay_ms == 0
    assert mgr.grab_filthiest_compacted_log() is None
    assert store.compact() == []
    assert mgr.describe("t", 0)["eligible"] is False
    clock.now = earliest + lag + 7_500
    ltc = mgr.log_to_clean(lg, None, clock())
    assert ltc.compaction_delay_ms == 7_500 and ltc.need_compaction_now
    assert ltc.cleanable_ratio == 1.0
    d = mgr.describe("t", 0)
    assert d["eligible"] is True and d["compaction_delay_ms"] == 7_500
    assert d["reason"] == "overdue: 7500 ms past max.compaction.lag.ms"
    got = mgr.grab_filthiest_compacted_log()
    assert got is not None and got.topic_partition == TopicPartition("t", 0)
    pre = mgr.last_pre_clean_stats
    assert (pre.delayed_partitions, pre.max_compaction_delay_ms) == (1, 7_500)
    assert store.cleaner.metrics()["max-compaction-delay-secs"] == 7
    mgr.done_cleaning(got.topic_partition, None)
    stats = store.compact()
    assert [st.end_offset for st in stats] == [40]
    # Cleaned: nothing dirty is left before the active segment, so it is no longer overdue.
    assert mgr.log_to_clean(lg, 40, clock()).compaction_delay_ms == 0
    assert mgr.grab_filthiest_compacted_log() is None


def test_max_compaction_lag_rolls_the_active_segment_so_it_can_be_cleaned(store, clock):
    """REF §6.3/§3.3: data cannot hide in the active segment past max.compaction.lag.ms: the
    next append rolls it, and the rolled data is then overdue and cleaned."""
    lag = 5_000
    (lg,) = compacted(store, "t", max_compaction_lag_ms=lag, min_cleanable_dirty_ratio=1.0)
    clock.now = T0
    for i in range(30):
        lg.append(b"v%02d" % i, key=b"k%d" % (i % 3), timestamp_ms=T0)
    assert len(lg.segments) == 1
    assert store.cleaner_manager.grab_filthiest_compacted_log() is None
    clock.now = T0 + lag + 1
    lg.append(b"late", key=b"k0", timestamp_ms=clock.now)
    assert [sg.base_offset for sg in lg.segments] == [0, 30]
    ltc = store.cleaner_manager.grab_filthiest_compacted_log()
    assert ltc is not None and ltc.compaction_delay_ms == 1
    store.cleaner_manager.done_cleaning(ltc.topic_partition, None)
    assert [st.end_offset for st in store.compact("t")] == [30]
    assert [(o, k) for o, k, _ in records(lg)] == [(27, b"k0"), (28, b"k1"), (29, b"k2"),
                                                    (30, b"k0")]


def test_delay_counts_only_dirty_segments(store, clock):
    lag = 10_000
    (lg,) = compacted(store, "t", min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=lag)
    fill(lg, 4)
    clock.now = ts(3, 0) + lag + 50    # segments 0..2 are older still, but they are clean
    ltc = store.cleaner_manager.log_to_clean(lg, 30, clock())
    assert ltc.compaction_delay_ms == 50


# -- selection (REF #51) --------------------------------------------------------------------------


def _three_ratios(store):
    """c-0: ratio 1/4 (checkpoint 30), c-1: 4/4, c-2: 2/4 (checkpoint 20); d-0 delete policy."""
    logs = compacted(store, "c", 3)
    for lg in logs:
        fill(lg, 4)
    store.create_topic("d", 1)
    fill(store.partition("d", 0), 4)
    write_cp(store, {("c", 0): 30, ("c", 2): 20})
    return logs


def test_filthiest_selected_by_ratio(store):
    _three_ratios(store)
    mgr = store.cleaner_manager
    got = []
    dirtiest = []
    while (ltc := mgr.grab_filthiest_compacted_log()) is not None:
        got.append((ltc.topic_partition.partition, ltc.cleanable_ratio))
        dirtiest.append(store.metrics()["max-dirty-percent"])
        assert mgr.state(ltc.topic_partition) == "InProgress"
    assert got == [(1, 1.0), (2, 0.5), (0, 0.25)]
    # max-dirty-percent: the dirtiest candidate of each selection (in-progress logs excluded).
    assert dirtiest == [100, 50, 25]
    assert mgr.state(TopicPartition("d", 0)) is None   # a delete-policy log is never picked


def test_ratio_must_be_strictly_greater_than_min(store):
    logs = _three_ratios(store)
    store.alter_topic_config("c", {"min.cleanable.dirty.ratio": 0.5})
    mgr = store.cleaner_manager
    assert mgr.grab_filthiest_compacted_log().topic_partition.partition == 1
    assert mgr.grab_filthiest_compacted_log() is None  # c-2 has exactly 0.5
    assert mgr.describe("c", 2)["reason"] == "dirty ratio 0.500 <= min.cleanable.dirty.ratio 0.5"
    assert len(logs) == 3


def test_uncleanable_in_progress_and_paused_logs_are_skipped(store):
    _three_ratios(store)
    mgr = store.cleaner_manager
    mgr.mark_uncleanable(TopicPartition("c", 1), "RuntimeError: boom")
    first = mgr.grab_filthiest_compacted_log()
    assert first.topic_partition == TopicPartition("c", 2)
    mgr.abort_and_pause_cleaning(TopicPartition("c", 0))       # idle: paused at once
    assert mgr.grab_filthiest_compacted_log() is None          # c-2 in progress, c-0 paused
    mgr.resume_cleaning(TopicPartition("c", 0))
    assert mgr.grab_filthiest_compacted_log().topic_partition == TopicPartition("c", 0)
    assert mgr.grab_filthiest_compacted_log() is None


def test_nothing_eligible_returns_none(store):
    logs = compacted(store, "c", 3, min_cleanable_dirty_ratio=0.9)
    fill(logs[0], 4)
    fill(logs[1], 4)
    write_cp(store, {("c", 0): 20, ("c", 1): 10})  # ratios 0.5 and 0.75
    # c-2 is empty: total bytes 0, not a candidate at all.
    mgr = store.cleaner_manager
    assert mgr.grab_filthiest_compacted_log() is None
    assert all(mgr.state(lg.topic_partition) is None for lg in logs)
    assert mgr.dirtiest_ratio == pytest.approx(0.75)
    assert mgr.last_pre_clean_stats.cleanable_partitions == 0


def test_selection_error_is_reported_and_others_still_selected(store, monkeypatch):
    logs = _three_ratios(store)
    mgr = store.cleaner_manager
    real = LogCleanerManager.log_to_clean

    def broken(self, lg, checkpoint, now):
        if lg.partition == 1:
            raise RuntimeError("unreadable segment")
        return real(self, lg, checkpoint, now)
    monkeypatch.setattr(LogCleanerManager, "log_to_clean", broken)
    with pytest.raises(RuntimeError):
        mgr.grab_filthiest_compacted_log()
    seen = []
    ltc = mgr.grab_filthiest_compacted_log(on_error=lambda tp, e: seen.append((tp, str(e))))
    assert seen == [(TopicPartition("c", 1), "unreadable segment")]
    assert ltc.topic_partition == TopicPartition("c", 2)
    assert len(logs) == 3


# -- deadline scheduling (segstore beyond Kafka) ---------------------------------------------------


def test_overdue_logs_are_served_first_most_overdue_first(store, clock):
    """More overdue logs than one thread can clean per selection: each grab/clean/done cycle of
    a single thread must pick the most overdue log first, and every overdue log before any
    dirtier log that is not overdue; then the rest by dirty ratio."""
    lag = 60_000
    # Overdue logs: low dirty ratio (1/4, below min ratio 0.5), different ages of their oldest
    # dirty batch. Partition p's log starts at T0 + offset_p.
    ages = {0: 3000, 1: 9000, 2: 1000, 3: 6000}
    store.create_topic("late", 4, {"cleanup.policy": "compact", "max.compaction.lag.ms": lag,
                                   "min.cleanable.dirty.ratio": 0.5})
    store.create_topic("dirty", 2, {"cleanup.policy": "compact",
                                    "min.cleanable.dirty.ratio": 0.5})
    for p, age in ages.items():
        lg = store.partition("late", p)
        for i in range(4):
            for j in range(PER_SEG):
                lg.append(b"v%04d" % (i * PER_SEG + j), key=b"k%d" % j,
                          timestamp_ms=T0 + i * SEG_STEP + j - age)
            lg.roll()
        lg.append(b"active", key=b"k0", timestamp_ms=T0)
    for p in range(2):
        fill(store.partition("dirty", p), 4)
    cps = {("late", p): 30 for p in ages}      # only segment 30 is dirty in the late logs
    cps[("dirty", 0)] = 10                      # ratio 3/4
    write_cp(store, cps)                        # dirty-1: ratio 4/4
    # Segment 30's first batch of late-p has timestamp T0 + 300 - age_p.
    clock.now = T0 + 300 + lag + 1
    delays = {p: clock.now - lag - (T0 + 300 - a) for p, a in ages.items()}
    assert sorted(delays.values()) == [1001, 3001, 6001, 9001]
    mgr = store.cleaner_manager
    order = []
    while (ltc := mgr.grab_filthiest_compacted_log()) is not None:
        order.append((ltc.topic_partition.topic, ltc.topic_partition.partition,
                      ltc.compaction_delay_ms))
        if ltc.topic_partition.topic == "late":
            assert mgr.last_pre_clean_stats.overdue[0] == ltc.topic_partition
        store.cleaner.clean_log(0, ltc)          # one thread: clean it, checkpoint, done
        assert mgr.state(ltc.topic_partition) is None
    assert order == [("late", 1, 9001), ("late", 3, 6001), ("late", 0, 3001),
                     ("late", 2, 1001), ("dirty", 1, 0), ("dirty", 0, 0)]
    # Each was cleaned up to its active segment.
    assert read_cp_text(store) == ("0\n6\ndirty 0 40\ndirty 1 40\nlate 0 40\nlate 1 40\n"
                                   "late 2 40\nlate 3 40\n")


def test_an_overdue_log_needs_cleanable_bytes(store, clock):
    """Overdue but nothing cleanable (an open transaction at the log's first offset holds the
    whole range back): not selected, whatever the delay."""
    lag = 60_000
    (lg,) = compacted(store, "t", max_compaction_lag_ms=lag, min_cleanable_dirty_ratio=0.5)
    lg.append_batch([b"t"], [b"a"], producer_id=9, producer_epoch=0, base_sequence=0,
                    is_transactional=True, timestamps_ms=[T0])
    fill(lg, 3)
    assert lg.last_stable_offset == 0
    clock.now = T0 + 10 * lag
    mgr = store.cleaner_manager
    ltc = mgr.log_to_clean(lg, None, clock())
    assert ltc.compaction_delay_ms > 0 and ltc.cleanable_bytes == 0
    assert mgr.grab_filthiest_compacted_log() is None
    d = mgr.describe("t", 0)
    assert d["eligible"] is False and d["reason"].startswith("nothing cleanable")


# -- states (REF §6.3 table, #54) ------------------------------------------------------------------


def test_pause_counts_and_resume_errors(store):
    (lg,) = compacted(store, "t")
    fill(lg, 2)
    tp = lg.topic_partition
    mgr = store.cleaner_manager
    assert mgr.state(tp) is None
    with pytest.raises(InvalidOffsetError) as e:
        mgr.resume_cleaning(tp)                 # not paused
    assert isinstance(e.value, SegstoreError)
    mgr.abort_and_pause_cleaning(tp)
    assert mgr.state(tp) == ("Paused", 1)
    mgr.abort_and_pause_cleaning(tp)
    assert mgr.state(tp) == ("Paused", 2)
    mgr.resume_cleaning(tp)
    assert mgr.state(tp) == ("Paused", 1)
    assert mgr.grab_filthiest_compacted_log() is None
    assert mgr.deletable_logs() == []
    mgr.resume_cleaning(tp)
    assert mgr.state(tp) is None
    with pytest.raises(InvalidOffsetError):
        mgr.resume_cleaning(tp)
    ltc = mgr.grab_filthiest_compacted_log()
    assert mgr.state(tp) == "InProgress"
    with pytest.raises(InvalidOffsetError):
        mgr.resume_cleaning(tp)                 # resuming a running round is an error too
    assert mgr.state(tp) == "InProgress"
    mgr.done_cleaning(tp, 20)
    assert mgr.state(tp) is None
    assert read_cp_text(store) == "0\n1\nt 0 20\n"
    assert ltc is not None


def test_abort_cleaning_returns_to_no_state(store):
    (lg,) = compacted(store, "t")
    fill(lg, 2)
    mgr = store.cleaner_manager
    mgr.abort_cleaning(lg.topic_partition)
    assert mgr.state(lg.topic_partition) is None
    mgr.abort_and_pause_cleaning(lg.topic_partition)
    mgr.abort_cleaning(lg.topic_partition)      # Paused(1) -> Paused(2) -> Paused(1)
    assert mgr.state(lg.topic_partition) == ("Paused", 1)


def _abort_in_thread(mgr, tp):
    box = {}

    def run():
        try:
            mgr.abort_and_pause_cleaning(tp, timeout_s=10)
            box["state"] = mgr.state(tp)
        except BaseException as e:  # reported to the test thread
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_abort_of_a_running_round_waits_until_done_cleaning(store):
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    tp = lg.topic_partition
    mgr = store.cleaner_manager
    assert mgr.grab_filthiest_compacted_log().topic_partition == tp
    mgr.check_cleaning_aborted(tp)              # not aborted: no error
    t, box = _abort_in_thread(mgr, tp)
    wait_until(lambda: mgr.state(tp) == "Aborted", what="Aborted")
    t.join(0.05)  # the aborting thread must stay blocked until the round ends
    assert t.is_alive() and not box
    with pytest.raises(CleaningAbortedError):
        mgr.check_cleaning_aborted(tp)
    mgr.done_cleaning(tp, 40)                   # the round ends: Aborted -> Paused(1)
    t.join(10)
    assert not t.is_alive() and box == {"state": ("Paused", 1)}
    assert read_cp_text(store) == ""            # an aborted round checkpoints nothing
    mgr.resume_cleaning(tp)
    assert mgr.state(tp) is None


def test_abort_of_a_retention_pass_pauses_at_done_deleting(store):
    (lg,) = compacted(store, "t")
    fill(lg, 2)
    tp = lg.topic_partition
    mgr = store.cleaner_manager
    assert [x for x, _ in mgr.deletable_logs()] == [tp]
    assert mgr.state(tp) == "InProgress"
    t, box = _abort_in_thread(mgr, tp)
    wait_until(lambda: mgr.state(tp) == "Aborted", what="Aborted")
    mgr.done_deleting([tp])
    t.join(10)
    assert box == {"state": ("Paused", 1)}
    mgr.resume_cleaning(tp)
    assert mgr.state(tp) is None


def test_abort_and_pause_times_out_when_the_round_never_ends(store):
    (lg,) = compacted(store, "t")
    fill(lg, 2)
    mgr = store.cleaner_manager
    mgr.grab_filthiest_compacted_log()
    with pytest.raises(TimeoutError):
        mgr.abort_and_pause_cleaning(lg.topic_partition, timeout_s=0.05)
    assert mgr.state(lg.topic_partition) == "Aborted"
    mgr.done_cleaning(lg.topic_partition, 20)
    assert mgr.state(lg.topic_partition) == ("Paused", 1)


def test_abort_from_another_thread_while_a_real_round_runs(store, monkeypatch):
    """The round notices the abort at its next check, deletes its .cleaned files and ends
    Paused(1): the log is unchanged, nothing is checkpointed, nothing is uncleanable."""
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    tp = lg.topic_partition
    before = records(lg)
    files_before = sorted(os.listdir(lg.directory))
    mgr = store.cleaner_manager
    started = threading.Event()
    real = Cleaner._clean_into

    def slow(self, lg_, source, dest, *a, **kw):
        if not started.is_set():
            started.set()
            wait_until(lambda: mgr.state(tp) == "Aborted", what="the abort")
            assert any(n.endswith(".cleaned") for n in os.listdir(lg_.directory))
        return real(self, lg_, source, dest, *a, **kw)
    monkeypatch.setattr(Cleaner, "_clean_into", slow)
    ltc = mgr.grab_filthiest_compacted_log()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("stats", store.cleaner.clean_log(0, ltc)),
                         daemon=True)
    t.start()
    assert started.wait(10)
    mgr.abort_and_pause_cleaning(tp, timeout_s=10)
    t.join(10)
    assert not t.is_alive()
    assert out == {"stats": None}
    assert mgr.state(tp) == ("Paused", 1)
    assert mgr.uncleanable == {}
    assert read_cp_text(store) == ""
    assert records(lg) == before
    assert sorted(os.listdir(lg.directory)) == files_before
    mgr.resume_cleaning(tp)
    assert [st.end_offset for st in store.compact("t")] == [40]


def test_topic_deletion_forgets_state_quarantine_and_checkpoint(store):
    a, = compacted(store, "a")
    c0, c1 = compacted(store, "c", 2)
    for lg in (a, c0, c1):
        fill(lg, 2)
    assert len(store.compact()) == 3
    assert read_cp_text(store) == "0\n3\na 0 20\nc 0 20\nc 1 20\n"
    mgr = store.cleaner_manager
    mgr.mark_uncleanable(c1.topic_partition, "boom")
    mgr.abort_and_pause_cleaning(c0.topic_partition)
    store.delete_topic("c")
    assert read_cp_text(store) == "0\n1\na 0 20\n"
    assert mgr.state(TopicPartition("c", 0)) is None
    assert mgr.uncleanable == {}
    assert store.metrics()["uncleanable-partitions-count"] == 0


# -- deletable logs (REF #53) ----------------------------------------------------------------------


def test_deletable_logs_are_compacted_in_no_state_and_cleanable(store):
    for name, policy in (("c", "compact"), ("cd", "compact,delete"), ("d", "delete")):
        store.create_topic(name, 1, {"cleanup.policy": policy})
    store.create_topic("e", 3, {"cleanup.policy": "compact"})
    mgr = store.cleaner_manager
    mgr.mark_uncleanable(TopicPartition("e", 0), "boom")
    mgr.abort_and_pause_cleaning(TopicPartition("e", 1))
    got = sorted(tp for tp, _ in mgr.deletable_logs())
    assert got == [TopicPartition("c", 0), TopicPartition("cd", 0), TopicPartition("e", 2)]
    assert all(mgr.state(tp) == "InProgress" for tp in got)
    assert mgr.deletable_logs() == []           # all taken
    assert mgr.grab_filthiest_compacted_log() is None
    mgr.done_deleting(got)
    assert all(mgr.state(tp) is None for tp in got)
    assert mgr.state(TopicPartition("e", 1)) == ("Paused", 1)


# -- the checkpoint file (REF §4.5, #55) -----------------------------------------------------------


def test_checkpoint_file_after_done_cleaning(store):
    a, = compacted(store, "a")
    fill(a, 3)
    b0, b1 = compacted(store, "b", 2)
    fill(b0, 2)
    fill(b1, 4)
    write_cp(store, {("ghost", 0): 7})          # a partition that no longer exists
    mgr = store.cleaner_manager
    ltc = mgr.grab_filthiest_compacted_log()
    mgr.done_cleaning(ltc.topic_partition, 17)
    first = ltc.topic_partition
    assert read_cp_text(store) == f"0\n1\n{first.topic} {first.partition} 17\n"
    mgr.done_cleaning(TopicPartition("b", 0), 99)  # not in progress: nothing written
    assert read_cp_text(store) == f"0\n1\n{first.topic} {first.partition} 17\n"
    store.compact()
    assert read_cp_text(store) == "0\n3\na 0 30\nb 0 20\nb 1 40\n"
    assert not [n for n in os.listdir(store.path) if n.endswith(".tmp")]


def test_maybe_truncate_checkpoint_only_lowers(store):
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    mgr = store.cleaner_manager
    write_cp(store, {("t", 0): 40})
    mgr.maybe_truncate_checkpoint(lg.topic_partition, 25)
    assert read_cp_text(store) == "0\n1\nt 0 25\n"
    mgr.maybe_truncate_checkpoint(lg.topic_partition, 30)
    assert read_cp_text(store) == "0\n1\nt 0 25\n"


def test_truncation_below_the_checkpoint_lowers_it(store):
    """REF §6.3/#55 (Kafka's maybeTruncateCheckpoint): after truncating a log below its cleaner
    checkpoint, data appended again between the truncation point and the old checkpoint is
    dirty, not clean; otherwise its duplicate keys are never compacted away."""
    (lg,) = compacted(store, "t")
    fill(lg, 4)
    store.compact("t")
    assert read_cp_text(store) == "0\n1\nt 0 40\n"
    lg.truncate_to(25)
    leo = lg.log_end_offset
    assert leo <= 25
    # Append past the old checkpoint again: every segment repeats keys k0..k9.
    fill(lg, 5)
    assert lg.log_end_offset > 40
    assert store.cleaner_manager.describe("t", 0)["first_dirty_offset"] <= leo
    store.compact("t")
    cp = int(read_cp_text(store).split()[-1])
    clean_keys = [k for o, k, _ in records(lg) if o < cp]
    assert len(clean_keys) == len(set(clean_keys)), "duplicate keys in the clean section"


def test_unreadable_checkpoint_file_is_ignored(store, caplog):
    (lg,) = compacted(store, "t")
    fill(lg, 2)
    with open(os.path.join(store.path, CP_NAME), "w") as f:
        f.write("garbage\n")
    caplog.set_level(logging.WARNING, logger="segstore.cleaner")
    assert store.cleaner_manager.all_cleaner_checkpoints() == {}
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert [st.end_offset for st in store.compact()] == [20]
    assert read_cp_text(store) == "0\n1\nt 0 20\n"


def test_checkpoint_survives_reopen(tmp_path, clock):
    path = str(tmp_path / "s")
    with segstore.open(path, clock=clock) as s:
        (lg,) = compacted(s, "t")
        fill(lg, 3)
        s.compact()
    with segstore.open(path, clock=clock) as s:
        assert s.cleaner_manager.describe("t", 0)["first_dirty_offset"] == 30
        assert s.cleaner_manager.grab_filthiest_compacted_log() is None


# -- describe() ----------------------------------------------------------------------------------


def test_describe_fields(store, clock):
    (lg,) = compacted(store, "t", min_cleanable_dirty_ratio=0.3)
    fill(lg, 4, active=5)
    write_cp(store, {("t", 0): 10})
    s = disk_sizes(lg)
    d = store.cleaner_manager.describe("t", 0)
    want = {
        "topic": "t", "partition": 0, "segments": 5, "size_bytes": sum(s.values()),
        "log_start_offset": 0, "log_end_offset": 45, "first_dirty_offset": 10,
        "first_uncleanable_offset": 40, "clean_bytes": s[0],
        "cleanable_bytes": s[10] + s[20] + s[30], "dirty_ratio": pytest.approx(0.75),
        "min_cleanable_ratio": 0.3, "compaction_delay_ms": 0,
        "max_compaction_lag_ms": 2 ** 63 - 1, "eligible": True,
        "reason": "dirty ratio 0.750 > min.cleanable.dirty.ratio 0.3", "uncleanable": False,
        "state": None}
    assert {k: d.get(k) for k in want} == want  # (describe may carry more fields)


def test_describe_reasons(store, clock):
    store.create_topic("d", 1, {"cleanup.policy": "delete"})
    fill(store.partition("d", 0), 2)
    (u, s, n, low, ok) = compacted(store, "c", 5, min_cleanable_dirty_ratio=0.6)
    for lg in (u, s, low, ok):
        fill(lg, 4)
    fill(n, 0, active=5)
    write_cp(store, {("c", 3): 20})              # ratio 0.5
    mgr = store.cleaner_manager
    mgr.mark_uncleanable(u.topic_partition, "RuntimeError: boom")
    mgr.abort_and_pause_cleaning(s.topic_partition)
    reasons = {p: mgr.describe("c", p) for p in range(5)}
    assert mgr.describe("d", 0)["reason"] == "cleanup.policy is delete, not compact"
    assert mgr.describe("d", 0)["eligible"] is False
    assert reasons[0]["reason"] == "uncleanable after an error: RuntimeError: boom"
    assert reasons[0]["uncleanable"] is True and reasons[0]["eligible"] is False
    assert reasons[1]["reason"] == "cleaning state is ('Paused', 1)"
    assert reasons[1]["state"] == ("Paused", 1) and reasons[1]["eligible"] is False
    assert reasons[2]["reason"].startswith("nothing cleanable")
    assert reasons[3]["reason"] == "dirty ratio 0.500 <= min.cleanable.dirty.ratio 0.6"
    assert reasons[4]["reason"] == "dirty ratio 1.000 > min.cleanable.dirty.ratio 0.6"
    assert [reasons[p]["eligible"] for p in range(5)] == [False, False, False, False, True]
    ltc = mgr.grab_filthiest_compacted_log()
    assert ltc.topic_partition == ok.topic_partition
    assert mgr.describe("c", 4)["reason"] == "cleaning state is InProgress"
