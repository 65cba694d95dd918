"""The cleaner threads, on-demand compaction, stats, metrics and the throttle (REF §6.2,
§6.13-§6.14; ports of REF §7 #39, #43, #50, #57).

Threads run for real (``start_services()`` with two cleaner threads and a short backoff) and the
tests wait on conditions with timeouts; time rules use a fake clock and never sleep. Final
contents after compaction are compared with a plain-Python replay: below the cleaner checkpoint
exactly the latest record of every key remains (keyless records go), at and above it every
record written is still there, byte-identical in key and value.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
import traceback

import pytest

import segstore
import segstore.store_retention as store_retention
from conftest import FakeClock
from segstore import TopicPartition
from segstore.cleaner import CleanerStats, PreCleanStats, Throttler
from segstore.cleaner.cleaner import Cleaner
from segstore.cleaner.service import LogCleaner
from segstore.cleaner.throttler import CHECK_INTERVAL_S
from segstore.errors import (InvalidTopicError, ReadOnlyStoreError, SegstoreError,
                             UnknownTopicOrPartitionError)
from segstore.log import PartitionLog
from keyless import append_batch_unvalidated, append_unvalidated

T0 = 1_700_000_000_000
PER_SEG = 10
CP_NAME = "cleaner-offset-checkpoint"
MB = 1024 * 1024


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def stores(tmp_path):
    """Open stores (closed at teardown, so no cleaner thread outlives its test)."""
    opened = []

    def make(name: str = "store", clock=None, **cfg):
        conf = {k.replace("_", "."): v for k, v in cfg.items()}
        s = segstore.open(str(tmp_path / name), config=conf, clock=clock or FakeClock(T0))
        opened.append(s)
        return s
    yield make
    for s in opened:
        s.close()


def fill(lg, nsegs: int, per_seg: int = PER_SEG, keys: int = PER_SEG, active: int = 3,
         key_prefix: bytes = b"k") -> None:
    """``nsegs`` sealed segments of ``per_seg`` one-record batches (key j % keys), then
    ``active`` records in the active segment; values encode key and offset."""
    for i in range(nsegs * per_seg + active):
        k = key_prefix + b"%d" % ((i % per_seg) % keys)
        lg.append(k + b"|%06d" % lg.log_end_offset, key=k, timestamp_ms=T0 + i)
        if i % per_seg == per_seg - 1 and i < nsegs * per_seg:
            lg.roll()


def records(lg) -> list:
    return [(r.offset, r.key, r.value) for r in lg.iter_records()]


def cp_of(store) -> dict:
    p = os.path.join(store.path, CP_NAME)
    if not os.path.exists(p):
        return {}
    lines = open(p).read().split("\n")
    return {(t, int(q)): int(o) for t, q, o in (ln.split() for ln in lines[2:] if ln)}


def wait_until(pred, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def temp_files(directory: str) -> list:
    return [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]


def disk_sizes(lg) -> dict:
    out = {}
    for name in os.listdir(lg.directory):
        m = re.fullmatch(r"(\d{20})\.log", name)
        if m:
            out[int(m.group(1))] = os.path.getsize(os.path.join(lg.directory, name))
    return dict(sorted(out.items()))


def replay(written: dict, cp: int) -> list:
    """What a fully cleaned log holds, by plain Python: below ``cp`` the latest record of each
    key (keyless ones dropped), from ``cp`` on every record."""
    last = {}
    for o in sorted(written):
        k = written[o][0]
        if o < cp and k is not None:
            last[k] = o
    keep = sorted(set(last.values()) | {o for o in written if o >= cp})
    return [(o, *written[o]) for o in keep]


def cleaner_threads(store) -> list:
    return [t for t in threading.enumerate() if t.name.startswith("segstore-log-cleaner-thread")
            and t in store.cleaner._threads]


# -- two threads, two partitions, appends and reads -------------------------------------------


def test_two_threads_clean_two_partitions_while_others_append_and_read(stores, monkeypatch):
    clock = FakeClock(T0)
    s = stores(clock=clock, log_cleaner_threads=2, log_cleaner_backoff_ms=5)
    # Readers are safe within file.delete.delay.ms (the default: the fake clock never reaches
    # it), as in Kafka; a retired segment is only renamed .deleted while they run.
    s.create_topic("t", 2, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0,
                            "segment.bytes": 3000})
    logs = [s.partition("t", p) for p in range(2)]
    written = {0: {}, 1: {}}

    def write(p: int, n: int, seed: int) -> None:
        rng = random.Random(seed)
        lg = logs[p]
        i = 0
        while i < n:
            batch = rng.choice((1, 1, 1, 4))
            keys, values = [], []
            for _ in range(batch):
                r = rng.random()
                k = None if r < 0.03 else b"k%02d" % min(int(rng.expovariate(0.08)), 70)
                v = None if (k is not None and r > 0.96) else (k or b"-") + b"|%d|%d" % (p, i)
                keys.append(k)
                values.append(v)
                i += 1
            info = append_batch_unvalidated(lg, values, keys, timestamps_ms=[T0 + i] * batch)
            for j in range(batch):
                written[p][info.first_offset + j] = (keys[j], values[j])

    # Both partitions are dirty before the threads start, so each thread gets one.
    for p in range(2):
        write(p, 400, seed=p)
        logs[p].roll()
    # Proof of concurrency: the first filter call of each partition waits for the other's.
    barrier = threading.Barrier(2, timeout=20)
    met, met_lock = [], threading.Lock()
    rounds = {0: 0, 1: 0}
    real_into, real_clean_log = Cleaner._clean_into, LogCleaner.clean_log

    def into(self, lg, source, dest, *a, **kw):
        with met_lock:
            first = lg.partition not in {p for _, p in met}
            if first:
                met.append((threading.current_thread().name, lg.partition))
        if first:
            barrier.wait()
        return real_into(self, lg, source, dest, *a, **kw)

    def clean_log(self, thread_id, ltc, *a, **kw):
        st = real_clean_log(self, thread_id, ltc, *a, **kw)
        if st is not None:
            rounds[ltc.topic_partition.partition] += 1
        return st
    monkeypatch.setattr(Cleaner, "_clean_into", into)
    monkeypatch.setattr(LogCleaner, "clean_log", clean_log)

    stop = threading.Event()
    errors = []
    seen = {0: {}, 1: {}}
    passes = {0: 0, 1: 0}

    def reader(p: int) -> None:
        try:
            while not stop.is_set():
                prev = -1
                for r in logs[p].iter_records():
                    assert r.offset > prev, (p, prev, r.offset)
                    prev = r.offset
                    rec = (r.key, r.value)
                    assert seen[p].setdefault(r.offset, rec) == rec, (p, r.offset)
                    if r.value is not None:
                        assert r.value.startswith((r.key or b"-") + b"|%d|" % p), (p, r)
                passes[p] += 1
        except BaseException:
            errors.append(traceback.format_exc())

    s.start_services()
    readers = [threading.Thread(target=reader, args=(p,), daemon=True) for p in range(2)]
    writers = [threading.Thread(target=write, args=(p, 2500, 10 + p), daemon=True)
               for p in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(120)
        assert not t.is_alive()
    stop.set()
    for t in readers:
        t.join(60)
        assert not t.is_alive()
    assert errors == [], errors[0] if errors else None
    assert min(passes.values()) >= 1
    # The two first rounds ran at the same time, in different threads, on different partitions.
    assert sorted(p for _, p in met) == [0, 1]
    assert len({name for name, _ in met}) == 2
    # Everything written is now sealed; the threads clean it to the end.
    for lg in logs:
        lg.roll()
    mgr = s.cleaner_manager

    def done():
        return all(mgr.describe("t", p)["cleanable_bytes"] == 0
                   and mgr.state(TopicPartition("t", p)) is None for p in range(2))
    wait_until(done, 60, "the cleaner threads to catch up")
    assert mgr.uncleanable == {}
    assert min(rounds.values()) >= 2, rounds
    cps = cp_of(s)
    for p, lg in enumerate(logs):
        assert cps[("t", p)] == lg.segments[-1].base_offset == lg.log_end_offset
        want = replay(written[p], cps[("t", p)])
        got = records(lg)
        assert got == want, (p, "lost:", sorted(set(want) - set(got))[:5],
                             "unexpected:", sorted(set(got) - set(want))[:5])
        for o, rec in seen[p].items():
            assert written[p][o] == rec       # readers only ever saw records that were written
    assert s.metrics()["DeadThreadCount"] == 0
    path = s.path
    s.close()
    with segstore.open(path, clock=clock) as again:
        for p in range(2):
            assert records(again.partition("t", p)) == replay(written[p], cps[("t", p)])
            assert again.partition("t", p).verify() == []


def test_a_thread_reuses_its_map_without_leaking_entries_between_logs(stores):
    """One thread's offset map serves every log it cleans. An entry left over from another
    log's round (key x at a high offset there) must not delete this log's only record of x,
    which sits in its clean section where this round maps nothing."""
    s = stores(log_cleaner_threads=1)
    s.create_topic("a", 1, {"cleanup.policy": "compact"})
    s.create_topic("b", 1, {"cleanup.policy": "compact"})
    a, b = s.partition("a", 0), s.partition("b", 0)
    mgr = s.cleaner_manager

    def clean(lg):
        ltc = mgr.grab_log(lg.topic_partition, force=True)
        assert ltc is not None
        assert s.cleaner.clean_log(0, ltc) is not None
    a.append(b"only-x", key=b"x", timestamp_ms=T0)
    for i in range(20):
        a.append(b"a%d" % i, key=b"c%d" % (i % 4), timestamp_ms=T0)
    a.roll()
    clean(a)                                    # x@0 now lies in a's clean section
    for i in range(500):
        b.append(b"b%d" % i, key=b"x" if i % 50 == 49 else b"y%d" % (i % 7),
                 timestamp_ms=T0)
    b.roll()
    clean(b)                                    # the thread's map: x -> 499 (in b)
    for i in range(600):
        a.append(b"a2-%d" % i, key=b"c%d" % (i % 4), timestamp_ms=T0)
    a.roll()
    clean(a)                                    # maps a's c0..c3 only, up to offset 620
    assert (0, b"x", b"only-x") in records(a)
    assert [k for _, k, _ in records(a)].count(b"x") == 1


# -- an error in one partition ------------------------------------------------------------------


def test_an_error_quarantines_one_partition_and_the_threads_survive(stores, monkeypatch, caplog):
    s = stores(log_cleaner_threads=2, log_cleaner_backoff_ms=5)
    s.create_topic("t", 2, {"cleanup.policy": "compact"})
    good, bad = s.partition("t", 0), s.partition("t", 1)
    fill(good, 4)
    fill(bad, 4)
    bad_before = records(bad)
    sizes = disk_sizes(bad)
    real = Cleaner.build_offset_map

    def build(self, lg, start, end, stats):
        if lg.partition == 1:
            raise RuntimeError("injected failure")
        return real(self, lg, start, end, stats)
    monkeypatch.setattr(Cleaner, "build_offset_map", build)
    caplog.set_level(logging.INFO, logger="segstore.cleaner")
    m0 = s.metrics()
    assert (m0["uncleanable-partitions-count"], m0["uncleanable-bytes"]) == (0, 0)
    s.start_services()
    wait_until(lambda: s.metrics()["uncleanable-partitions-count"] == 1
               and cp_of(s).get(("t", 0)) == 40, what="quarantine and the good clean")
    m = s.metrics()
    assert m["uncleanable-bytes"] == sizes[0] + sizes[10] + sizes[20] + sizes[30]
    assert m["DeadThreadCount"] == 0
    assert list(s.cleaner_manager.uncleanable) == [TopicPartition("t", 1)]
    d = s.cleaner_manager.describe("t", 1)
    assert d["uncleanable"] and d["reason"] == ("uncleanable after an error: RuntimeError: "
                                                "injected failure")
    assert records(bad) == bad_before and temp_files(bad.directory) == []
    assert ("t", 1) not in cp_of(s)
    assert any(r.levelno == logging.ERROR and "t-1" in r.getMessage() for r in caplog.records)
    # The threads are alive and keep cleaning the good partition.
    assert len(cleaner_threads(s)) == 2 and all(t.is_alive() for t in cleaner_threads(s))
    for i in range(2 * PER_SEG):
        good.append(b"more|%d" % i, key=b"k%d" % (i % 3), timestamp_ms=T0)
    good.roll()
    leo = good.log_end_offset
    wait_until(lambda: cp_of(s).get(("t", 0)) == leo, what="the good partition cleaned again")
    assert s.metrics()["uncleanable-partitions-count"] == 1
    # More data in the quarantined partition raises its uncleanable bytes.
    fill(bad, 1, active=0)
    assert s.metrics()["uncleanable-bytes"] == sum(
        v for b, v in disk_sizes(bad).items() if b < bad.segments[-1].base_offset)
    # A quarantine lasts until restart.
    monkeypatch.setattr(Cleaner, "build_offset_map", real)
    path = s.path
    s.close()
    with segstore.open(path) as again:
        assert again.metrics()["uncleanable-partitions-count"] == 0
        assert len(again.compact("t", 1)) == 1


def test_quarantined_partition_is_forgotten_when_its_topic_goes(stores):
    s = stores()
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    fill(s.partition("t", 0), 2)
    s.cleaner_manager.mark_uncleanable(TopicPartition("t", 0), "boom")
    assert s.metrics()["uncleanable-partitions-count"] == 1
    s.delete_topic("t")
    assert s.metrics()["uncleanable-partitions-count"] == 0
    assert s.metrics()["uncleanable-bytes"] == 0


class _Die(BaseException):
    """Not an Exception: what kills a thread (Kafka's interrupted thread, REF #57)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_thread_count_counts_a_thread_killed_by_a_base_exception(stores, monkeypatch):
    s = stores(log_cleaner_threads=2, log_cleaner_backoff_ms=5)
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    fill(s.partition("t", 0), 3)
    real = LogCleaner.try_clean_filthiest_log

    def maybe_die(self, thread_id, now=None):
        if thread_id == 1:
            raise _Die("killed")
        return real(self, thread_id, now)
    monkeypatch.setattr(LogCleaner, "try_clean_filthiest_log", maybe_die)
    assert s.metrics()["DeadThreadCount"] == 0
    s.start_services()
    wait_until(lambda: s.metrics()["DeadThreadCount"] == 1, what="the dead thread")
    by_name = {t.name: t for t in s.cleaner._threads}
    wait_until(lambda: not by_name["segstore-log-cleaner-thread-1"].is_alive())
    assert by_name["segstore-log-cleaner-thread-0"].is_alive()
    wait_until(lambda: cp_of(s).get(("t", 0)) == 30, what="thread 0 still cleaning")
    assert s.metrics()["DeadThreadCount"] == 1


def test_an_exception_in_a_pass_does_not_kill_the_thread(stores, monkeypatch):
    s = stores(log_cleaner_threads=1, log_cleaner_backoff_ms=5)
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    fill(s.partition("t", 0), 3)
    calls = []
    real = LogCleaner.run_compacted_retention

    def broken(self, now=None):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("a failed pass")
        return real(self, now)
    monkeypatch.setattr(LogCleaner, "run_compacted_retention", broken)
    s.start_services()
    wait_until(lambda: len(calls) >= 3, what="more passes after the failure")
    assert s.metrics()["DeadThreadCount"] == 0
    assert all(t.is_alive() for t in s.cleaner._threads)
    assert cp_of(s).get(("t", 0)) == 30


# -- metrics (REF §6.14, #50) ---------------------------------------------------------------------


METRIC_NAMES = {"max-buffer-utilization-percent", "cleaner-recopy-percent",
                "max-clean-time-secs", "max-compaction-delay-secs", "DeadThreadCount",
                "max-dirty-percent", "time-since-last-run-ms", "uncleanable-partitions-count",
                "uncleanable-bytes"}


def test_metrics_are_zero_before_any_round(stores):
    clock = FakeClock(T0)
    s = stores(clock=clock, log_cleaner_threads=2)
    s.create_topic("t", 2, {"cleanup.policy": "compact"})
    fill(s.partition("t", 0), 3)
    m = s.metrics()
    assert METRIC_NAMES <= set(m)
    assert {k: m[k] for k in METRIC_NAMES} == {k: 0 for k in METRIC_NAMES}
    clock.advance(750)
    assert s.metrics()["time-since-last-run-ms"] == 750


def test_metrics_are_the_max_over_threads(stores):
    # 48,000 bytes of dedupe buffer for two threads: 1,000 slots each.
    clock = FakeClock(T0)
    s = stores(clock=clock, log_cleaner_threads=2, log_cleaner_dedupe_buffer_size=48_000)
    s.create_topic("a", 1, {"cleanup.policy": "compact"})
    s.create_topic("b", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01})
    a, b = s.partition("a", 0), s.partition("b", 0)
    fill(a, 4, per_seg=100, keys=100)      # 100 distinct keys
    fill(b, 3, per_seg=300, keys=300)      # 300 distinct keys
    # Thread 0 takes the dirtier log first (a: ratio 1.0, b: 1.0 -- the tie goes either way),
    # thread 1 the other.
    assert s.cleaner.try_clean_filthiest_log(0) is True
    assert s.cleaner.try_clean_filthiest_log(1) is True
    st = s.cleaner.last_stats
    assert sorted(x.topic for x in st.values()) == ["a", "b"]
    util = {x.topic: x.buffer_utilization for x in st.values()}
    assert util == {"a": pytest.approx(0.1), "b": pytest.approx(0.3)}
    m = s.metrics()
    assert m["max-buffer-utilization-percent"] == 30
    read = sum(x.bytes_read for x in st.values())
    written = sum(x.bytes_written for x in st.values())
    assert m["cleaner-recopy-percent"] == int(100 * written / read)
    assert 0 < m["cleaner-recopy-percent"] < 100
    assert m["max-clean-time-secs"] == int(max(x.elapsed_secs for x in st.values()))
    # Exact max-over-threads arithmetic with stats chosen here.
    s.cleaner.last_stats = {
        0: CleanerStats(bytes_read=1000, bytes_written=250, buffer_utilization=0.424,
                        start_time=0, end_time=2_500),
        1: CleanerStats(bytes_read=3000, bytes_written=2000, buffer_utilization=0.871,
                        start_time=10_000, end_time=17_900)}
    s.cleaner.last_pre_clean = {0: PreCleanStats(max_compaction_delay_ms=3_000),
                                1: PreCleanStats(max_compaction_delay_ms=12_345)}
    m = s.metrics()
    assert m["max-buffer-utilization-percent"] == 87
    assert m["cleaner-recopy-percent"] == 56          # 100 * 2250 / 4000
    assert m["max-clean-time-secs"] == 7
    assert m["max-compaction-delay-secs"] == 12
    assert m["max-dirty-percent"] == int(100 * s.cleaner_manager.dirtiest_ratio)


def test_read_and_write_bytes_match_the_segments(stores):
    """REF #31/#39: bytes read = the source segments' sizes, bytes written = the cleaned
    segments' sizes; messages read/written and keyless records counted."""
    s = stores()
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    lg = s.partition("t", 0)
    fill(lg, 4, active=2)
    for i in range(5):
        append_unvalidated(lg, b"nokey%d" % i, timestamp_ms=T0)
    lg.roll()
    before = disk_sizes(lg)
    (st,) = s.compact("t")
    after = disk_sizes(lg)
    sealed = [x for x in before if x < 40]
    assert st.bytes_read == sum(before[x] for x in sealed) + before[40]
    assert st.messages_read == 40 + 2 + 5
    assert st.invalid_messages_read == 5
    assert st.bytes_written == sum(v for x, v in after.items() if x < lg.segments[-1].base_offset)
    assert st.messages_written == len([r for r in records(lg) if r[0] < st.end_offset])
    assert st.end_offset == 47


# -- the summary (REF §6.13) ----------------------------------------------------------------------


def test_kafka_summary_is_logged(stores, caplog):
    s = stores(log_cleaner_threads=1)
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    lg = s.partition("t", 0)
    fill(lg, 4, per_seg=300, keys=100)
    for i in range(7):
        append_unvalidated(lg, b"nokey", timestamp_ms=T0)   # keyless: the WARN line
    lg.roll()
    caplog.set_level(logging.INFO, logger="segstore.cleaner")
    assert s.cleaner.try_clean_filthiest_log(0)
    st = s.cleaner.last_stats[0]
    msgs = [r.getMessage() for r in caplog.records if r.name == "segstore.cleaner"]
    summary = [m for m in msgs if m.startswith("\n\tLog cleaner thread ")]
    assert len(summary) == 1
    lines = summary[0].split("\n")
    assert lines[0] == "" and lines[-1] == "" and len(lines) == 10
    body = lines[1:-1]
    num = r"[\d,]+\.\d"
    pats = [
        r"\tLog cleaner thread 0 cleaned log t-0 \(dirty section = \[0, 1210\]\)",
        rf"\t({num}) MB of log processed in ({num}) seconds \(({num}) MB/sec\)\.",
        rf"\tIndexed ({num}) MB in (\d+\.\d) seconds \(({num}) Mb/sec, (\d+\.\d)% of total time\)",
        r"\tBuffer utilization: (\d+\.\d)%",
        rf"\tCleaned ({num}) MB in (\d+\.\d) seconds \(({num}) Mb/sec, (\d+\.\d)% of total time\)",
        rf"\tStart size: ({num}) MB \(([\d,]+) messages\)",
        rf"\tEnd size: ({num}) MB \(([\d,]+) messages\)",
        r"\t(\d+\.\d)% size reduction \((\d+\.\d)% fewer messages\)",
    ]
    got = [re.fullmatch(p, line) for p, line in zip(pats, body)]
    assert all(got), list(zip(pats, body))
    assert got[1].group(1) == f"{st.bytes_read / MB:,.1f}"
    assert got[3].group(1) == f"{100 * st.buffer_utilization:.1f}"
    # 1,210 messages read (grouped with a comma), 100 keys survive.
    assert got[5].group(2) == "1,210" and got[6].group(2) == "100"
    assert got[7].group(2) == f"{100 * (1 - 100 / 1210):.1f}"
    assert got[7].group(1) == f"{100 * (1 - st.bytes_written / st.bytes_read):.1f}"
    assert st.messages_read == 1210 and st.messages_written == 100
    warns = [r for r in caplog.records if r.levelno == logging.WARNING
             and r.getMessage() == "\tFound 7 invalid messages during compaction."]
    assert len(warns) == 1
    for line in ("Beginning cleaning of log t-0", "Building offset map for t-0...",
                 "Offset map for log t-0 complete."):
        assert line in msgs
    assert any(m.startswith("Swapping in cleaned segment ") and m.endswith(" in log t-0")
               for m in msgs)


def test_delayed_partitions_line(stores, caplog):
    clock = FakeClock(T0)
    s = stores(clock=clock, log_cleaner_threads=1)
    s.create_topic("t", 1, {"cleanup.policy": "compact", "max.compaction.lag.ms": 1000,
                            "min.cleanable.dirty.ratio": 1.0})
    fill(s.partition("t", 0), 2)
    clock.now = T0 + 1000 + 250       # the first batch (timestamp T0) is 250 ms overdue
    caplog.set_level(logging.INFO, logger="segstore.cleaner")
    assert s.cleaner.try_clean_filthiest_log(0)
    msgs = [r.getMessage() for r in caplog.records]
    assert "\tCleanable partitions: 1, Delayed partitions: 1, max delay: 250" in msgs


def test_full_map_logs_the_buffer_that_would_have_covered_the_dirty_section(stores, caplog):
    # 24 * 40 bytes: 40 slots, 36 entries at load factor 0.9; the dirty section has 100 keys.
    s = stores(log_cleaner_dedupe_buffer_size=24 * 40, log_cleaner_threads=1)
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    lg = s.partition("t", 0)
    fill(lg, 4, per_seg=50, keys=50, key_prefix=b"a", active=0)
    for i in range(50):
        lg.append(b"x", key=b"b%d" % i, timestamp_ms=T0)
    lg.roll()
    caplog.set_level(logging.INFO, logger="segstore.cleaner")
    assert s.cleaner.try_clean_filthiest_log(0)
    st = s.cleaner.last_stats[0]
    assert st.map_full and st.end_offset < 253
    assert st.wanted_buffer_bytes is not None
    assert any(f"a dedupe buffer of {st.wanted_buffer_bytes} bytes" in r.getMessage()
               for r in caplog.records)
    # That size is enough: a store with it cleans the same dirty section in one round.
    s2 = stores("s2", log_cleaner_dedupe_buffer_size=st.wanted_buffer_bytes)
    s2.create_topic("t", 1, {"cleanup.policy": "compact"})
    lg2 = s2.partition("t", 0)
    fill(lg2, 4, per_seg=50, keys=50, key_prefix=b"a", active=0)
    for i in range(50):
        lg2.append(b"x", key=b"b%d" % i, timestamp_ms=T0)
    lg2.roll()
    (st2,) = s2.compact("t")
    assert not st2.map_full and st2.end_offset == lg2.segments[-1].base_offset
    # ... and not wildly more than needed (100 keys at load factor 0.9, 24-byte slots).
    assert st.wanted_buffer_bytes <= 2 * 24 * 112


# -- store.compact ---------------------------------------------------------------------------------


def test_force_cleans_below_the_min_ratio(stores):
    s = stores()
    s.create_topic("t", 2, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.5})
    logs = [s.partition("t", p) for p in range(2)]
    for lg in logs:
        fill(lg, 4)
    with open(os.path.join(s.path, CP_NAME), "w") as f:
        f.write("0\n2\nt 0 30\nt 1 30\n")       # ratio 1/4 each
    before = [records(lg) for lg in logs]
    assert s.compact() == [] and s.compact("t") == [] and s.compact("t", 0) == []
    assert [records(lg) for lg in logs] == before
    (st,) = s.compact("t", 0, force=True)
    assert st.forced and (st.topic, st.partition, st.end_offset) == ("t", 0, 40)
    assert cp_of(s) == {("t", 0): 40, ("t", 1): 30}
    # The map covered [30, 40): every key k0..k9 is there, so only 30..39 and the active
    # segment's records remain below the log end.
    assert [o for o, _, _ in records(logs[0])] == list(range(30, 43))
    assert records(logs[1]) == before[1]


def test_force_on_an_eligible_log_is_not_marked_forced(stores):
    s = stores()
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    fill(s.partition("t", 0), 3)
    (st,) = s.compact("t", force=True)
    assert not st.forced


def test_compact_argument_errors(stores):
    s = stores()
    s.create_topic("d", 1, {"cleanup.policy": "delete"})
    s.create_topic("c", 2, {"cleanup.policy": "compact"})
    with pytest.raises(InvalidTopicError) as e:
        s.compact("d")
    assert isinstance(e.value, SegstoreError) and isinstance(e.value, ValueError)
    with pytest.raises(InvalidTopicError):
        s.compact("d", 0, force=True)
    with pytest.raises(InvalidTopicError):
        s.compact(partition=0)
    with pytest.raises(UnknownTopicOrPartitionError):
        s.compact("nope")
    with pytest.raises(UnknownTopicOrPartitionError):
        s.compact("c", 2)
    path = s.path
    fill(s.partition("c", 0), 2)
    s.close()
    with segstore.open(path, readonly=True) as ro:
        with pytest.raises(ReadOnlyStoreError):
            ro.compact("c")


def test_compact_without_arguments_skips_other_policies(stores):
    s = stores()
    s.create_topic("d", 1, {"cleanup.policy": "delete"})
    s.create_topic("c", 1, {"cleanup.policy": "compact"})
    s.create_topic("cd", 1, {"cleanup.policy": "compact,delete", "retention.ms": -1})
    for t in ("d", "c", "cd"):
        fill(s.partition(t, 0), 2)
    d_before = records(s.partition("d", 0))
    stats = s.compact()
    assert sorted(st.topic for st in stats) == ["c", "cd"]
    assert records(s.partition("d", 0)) == d_before


# -- truncation and deletion during a round ------------------------------------------------------


def _grouped_store(stores):
    """A log whose 4 sealed segments each form their own cleaning group."""
    s = stores()
    s.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": 900})
    lg = s.partition("t", 0)
    fill(lg, 4)
    assert list(disk_sizes(lg)) == [0, 10, 20, 30, 40]
    return s, lg


@pytest.mark.parametrize("at_call", [1, 3])
def test_truncation_during_a_round_aborts_it(stores, monkeypatch, at_call):
    """REF #43: a truncation while a round filters aborts it and leaves no .cleaned files;
    groups swapped before it stay cleaned, nothing else changes, nothing is checkpointed."""
    s, lg = _grouped_store(stores)
    pre = records(lg)
    real = Cleaner._clean_into
    calls = []

    def truncating(self, lg_, source, dest, *a, **kw):
        calls.append(source.base_offset)
        if len(calls) == at_call:
            assert temp_files(lg_.directory)            # a .cleaned segment is being written
            lg_.truncate_to(35)
        return real(self, lg_, source, dest, *a, **kw)
    monkeypatch.setattr(Cleaner, "_clean_into", truncating)
    assert s.compact("t") == []
    assert calls == [0, 10, 20][:at_call]
    assert temp_files(lg.directory) == []
    assert cp_of(s) == {}
    assert s.cleaner_manager.state(lg.topic_partition) is None
    assert s.cleaner_manager.uncleanable == {}
    # Group [0, 10) was swapped before the truncation at call 3 (its keys all recur later, so
    # it is empty now); [10, 20) was written and waiting to be swapped in while [20, 30) was
    # filtered (its fsyncs run meanwhile), so it went with the round. The rest is the log as
    # truncated.
    swapped = 10 if at_call == 3 else 0
    assert records(lg) == [r for r in pre if swapped <= r[0] < 35]
    assert lg.verify() == []
    monkeypatch.setattr(Cleaner, "_clean_into", real)
    assert len(s.compact("t")) == 1


def test_truncation_just_before_the_swap_is_refused(stores, monkeypatch):
    s, lg = _grouped_store(stores)
    pre = records(lg)
    real = PartitionLog.replace_segments

    def truncate_then_swap(self, new, old, **kw):
        self.truncate_to(35)
        return real(self, new, old, **kw)
    monkeypatch.setattr(PartitionLog, "replace_segments", truncate_then_swap)
    assert s.compact("t") == []
    assert temp_files(lg.directory) == []
    assert records(lg) == [r for r in pre if r[0] < 35]
    assert cp_of(s) == {}


def test_topic_deletion_during_a_round(stores, monkeypatch):
    s = stores(log_cleaner_threads=1, log_cleaner_backoff_ms=5)
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    s.create_topic("u", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01})
    fill(s.partition("t", 0), 4)
    mgr = s.cleaner_manager
    tp = TopicPartition("t", 0)
    started = threading.Event()
    real = Cleaner._clean_into

    def held(self, lg, source, dest, *a, **kw):
        if lg.topic == "t" and not started.is_set():
            started.set()
            wait_until(lambda: mgr.state(tp) == "Aborted", 20, "the abort")
        return real(self, lg, source, dest, *a, **kw)
    monkeypatch.setattr(Cleaner, "_clean_into", held)
    s.start_services()
    assert started.wait(20)
    s.delete_topic("t")
    assert s.list_topics() == ["u"]
    assert not [n for n in os.listdir(s.path) if n.startswith("t-")]
    assert ("t", 0) not in cp_of(s)
    assert mgr.state(tp) is None and mgr.uncleanable == {}
    assert s.metrics()["DeadThreadCount"] == 0
    assert all(t.is_alive() for t in s.cleaner._threads)
    fill(s.partition("u", 0), 2)
    wait_until(lambda: cp_of(s).get(("u", 0)) == 20, what="the other topic cleaned")


def test_close_during_a_round_aborts_it_cleanly(stores, monkeypatch):
    """Shutting the cleaner down aborts a round in progress: its .cleaned files go, the log and
    the checkpoint stay as they were, and the store reopens with the same records."""
    s = stores(log_cleaner_threads=1, log_cleaner_backoff_ms=5)
    s.create_topic("t", 1, {"cleanup.policy": "compact"})
    lg = s.partition("t", 0)
    fill(lg, 4)
    pre = records(lg)
    started = threading.Event()
    real = Cleaner._clean_into

    def held(self, lg_, source, dest, *a, **kw):
        if not started.is_set():
            started.set()
            wait_until(lambda: s.cleaner._stop.is_set(), 20, "the shutdown")
        return real(self, lg_, source, dest, *a, **kw)
    monkeypatch.setattr(Cleaner, "_clean_into", held)
    s.start_services()
    assert started.wait(20)
    path = s.path
    s.close()
    assert not s.cleaner.running
    assert temp_files(os.path.join(path, "t-0")) == []
    assert not os.path.exists(os.path.join(path, CP_NAME)) or cp_of(s) == {}
    monkeypatch.setattr(Cleaner, "_clean_into", real)
    with segstore.open(path) as again:
        assert records(again.partition("t", 0)) == pre
        assert [st.end_offset for st in again.compact("t")] == [40]


# -- the throttle (REF §6.2) -----------------------------------------------------------------------


class FakeTime:
    def __init__(self, t: float = 100.0):
        self.t = t
        self.sleeps = []

    def time(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_throttler_sleeps_the_excess_of_each_period():
    ft = FakeTime()
    th = Throttler(1000, time=ft.time, sleep=ft.sleep)
    ft.t += 0.125
    th.maybe_throttle(500)            # inside the first 300 ms: no check
    assert ft.sleeps == []
    ft.t += 0.375                     # 0.5 s, 1000 bytes: twice the rate
    th.maybe_throttle(500)
    assert ft.sleeps == [pytest.approx(0.5)]   # 1000 bytes / 1000 B/s - 0.5 s
    assert th.total_sleep_s == pytest.approx(0.5)
    ft.t += 0.5                       # a new period from after the sleep: 400 B in 0.5 s
    th.maybe_throttle(400)
    assert len(ft.sleeps) == 1
    th.maybe_throttle(0)
    th.maybe_throttle(-5)
    ft.t += 0.25
    th.maybe_throttle(100)            # 0.25 s into the new period: no check yet
    assert len(ft.sleeps) == 1


def test_throttler_holds_the_rate_exactly_over_many_periods():
    ft = FakeTime(0.0)
    th = Throttler(1000, time=ft.time, sleep=ft.sleep)
    start = ft.t
    total = 0
    for _ in range(300):              # offered: 375 B every 0.125 s = 3000 B/s
        ft.t += 0.125
        th.maybe_throttle(375)
        total += 375
    # Every third call closes a period of 1125 B in 0.375 s and sleeps to 1.125 s.
    assert len(ft.sleeps) == 100
    assert all(x == pytest.approx(0.75) for x in ft.sleeps)
    assert total / (ft.t - start) == pytest.approx(1000)


def test_throttler_unlimited_by_default_never_sleeps():
    ft = FakeTime()
    th = Throttler(1.7976931348623157e308, time=ft.time, sleep=ft.sleep)
    for _ in range(10):
        ft.t += CHECK_INTERVAL_S
        th.maybe_throttle(10 ** 12)
    assert ft.sleeps == [] and th.unlimited


def test_cleaning_counts_every_byte_read_and_written_through_one_shared_throttle(stores):
    s = stores(log_cleaner_threads=2, log_cleaner_io_max_bytes_per_second=2000.0)
    assert s.cleaner.throttler.bytes_per_second == 2000.0
    ft = FakeTime()
    counted = []

    def ticking_time():               # each look at the clock moves it on by 50 ms
        ft.t += 0.05
        return ft.t

    class Recording(Throttler):
        def maybe_throttle(self, nbytes):
            counted.append(nbytes)
            super().maybe_throttle(nbytes)
    s.cleaner.throttler = Recording(2000.0, time=ticking_time, sleep=ft.sleep)
    start = ft.t
    s.create_topic("t", 2, {"cleanup.policy": "compact"})
    for p in range(2):
        fill(s.partition("t", p), 4, per_seg=50)
    assert s.cleaner.worker(0, s.partition("t", 0)).throttler is \
        s.cleaner.worker(1, s.partition("t", 1)).throttler
    assert s.cleaner.try_clean_filthiest_log(0) and s.cleaner.try_clean_filthiest_log(1)
    stats = list(s.cleaner.last_stats.values())
    assert len(stats) == 2
    # Bytes read for the map, read by the filter and written, all counted once.
    assert sum(counted) == sum(x.map_bytes_read + x.bytes_read + x.bytes_written for x in stats)
    assert len(ft.sleeps) >= 2        # throttled inside the rounds (on the fake clock only)
    ft.t += 1.0
    s.cleaner.throttler.maybe_throttle(1)   # close the last period
    assert (sum(counted) + 1) / (ft.t - start) <= 2000.0 * (1 + 1e-9)


# -- retention of compacted logs runs from the cleaner threads (REF §6.2 step 2) ---------------


def test_retention_of_compacted_logs_runs_from_the_cleaner_threads(stores, monkeypatch):
    clock = FakeClock(T0)
    s = stores(clock=clock, log_cleaner_threads=1, log_cleaner_backoff_ms=5,
               log_retention_check_interval_ms=1000)
    s.create_topic("cd", 2, {"cleanup.policy": "compact,delete", "retention.ms": 1000,
                             "min.cleanable.dirty.ratio": 1.0})
    s.create_topic("d", 1, {"cleanup.policy": "delete", "retention.ms": 1000})
    for lg in (s.partition("cd", 0), s.partition("cd", 1), s.partition("d", 0)):
        fill(lg, 3)
    s.cleaner_manager.mark_uncleanable(TopicPartition("cd", 1), "boom")
    calls = []
    real = store_retention._enforce_retention

    def spy(lg, now, **kw):
        calls.append((lg.topic, lg.partition, threading.current_thread().name))
        return real(lg, now, **kw)
    monkeypatch.setattr(store_retention, "_enforce_retention", spy)
    clock.advance(60_000)              # every record is past retention.ms: all segments go
    s.start_services()
    wait_until(lambda: s.partition("cd", 0).log_start_offset == 33
               and s.partition("d", 0).log_start_offset == 33, what="retention of both")
    cd0 = {name for t, p, name in calls if (t, p) == ("cd", 0)}
    d0 = {name for t, p, name in calls if (t, p) == ("d", 0)}
    assert cd0 and all(n.startswith("segstore-log-cleaner-thread") for n in cd0)
    assert d0 == {"segstore-services"}
    # A quarantined compacted partition gets no retention from anyone.
    assert not [c for c in calls if c[:2] == ("cd", 1)]
    assert s.partition("cd", 1).log_start_offset == 0


def test_deleting_a_topic_during_a_compacted_retention_pass_does_not_wait_for_it(tmp_path,
                                                                                 monkeypatch):
    """A cleaner thread's retention pass over compacted logs marks them in progress, then
    takes the store's lock for each; delete_topic holds that lock while it waits for its logs
    to leave the in-progress state. The pass must give them back, not wait for the lock
    (both waited until the abort's timeout, then delete_topic raised TimeoutError)."""
    from segstore.cleaner.manager import LogCleanerManager
    clock = FakeClock()
    store = segstore.open(str(tmp_path / "s"), clock=clock)
    try:
        store.create_topic("t", 1, {"cleanup.policy": "compact"})
        store.partition("t", 0).append_batch([b"v"], keys=[b"k"])
        entered, main_holds_lock = threading.Event(), threading.Event()
        real_retention = store.cleaner._retention
        real_abort = LogCleanerManager.abort_and_pause_cleaning

        def retention(logs, now):
            entered.set()
            assert main_holds_lock.wait(10)
            real_retention(logs, now)

        def abort(self, tp, timeout_s=60.0):
            main_holds_lock.set()
            real_abort(self, tp, timeout_s=5.0)   # the old deadlock ends here, not in 60 s

        monkeypatch.setattr(store.cleaner, "_retention", retention)
        monkeypatch.setattr(LogCleanerManager, "abort_and_pause_cleaning", abort)
        pass_thread = threading.Thread(target=store.cleaner.run_compacted_retention,
                                       args=(clock.now,))
        pass_thread.start()
        assert entered.wait(10)
        store.delete_topic("t")
        pass_thread.join(10)
        assert not pass_thread.is_alive()
        assert store.list_topics() == []
        assert store.cleaner.manager.all_cleaner_checkpoints() == {}
    finally:
        store.close()
