"""The map helper (segstore/cleaner/map_helper.py): a lone cleaner thread maps the later part of
the dirty section on a second thread into a side map, then merges it in.

Oracles: the same map built in one pass in order (every key's offset, size, latest offset,
counters, what was read), and the cleaned segment files of a round without the helper, byte
for byte; the compaction oracle tests run again with the helper forced on small logs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import segstore
import test_cleaner_oracle as oracle_tests
from conftest import FakeClock
from segstore import _core
from segstore.cleaner import Cleaner, CleanerStats, Throttler, map_helper
from segstore.columns import BinaryColumn
from segstore.errors import CleaningAbortedError, InvalidArgumentError
from keyless import append_batch_unvalidated

T0 = 1_700_000_000_000


@pytest.fixture
def helper_on_small_logs(monkeypatch):
    """The helper takes any dirty section of two segments or more; counts its uses."""
    monkeypatch.setattr(map_helper, "MIN_BYTES", 0)
    uses = []
    submit = map_helper.submit

    def counting_submit(fn, *args):
        uses.append(fn)
        return submit(fn, *args)

    monkeypatch.setattr(map_helper, "submit", counting_submit)
    return uses


# -- OffsetMap.merge_from ----------------------------------------------------------------------

def _digest_keys(n, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(rng.integers(0, 40))) for _ in range(n)]


def test_merge_equals_one_map_built_in_order():
    keys = _digest_keys(3000)
    rng = np.random.default_rng(2)
    order = [keys[i] for i in rng.integers(0, len(keys), 20_000)]   # repeats: updates
    whole = _core.OffsetMap(24 * 100_000)
    early, late = _core.OffsetMap(24 * 100_000), _core.OffsetMap(24 * 50_000)
    cut = 12_345
    for off, k in enumerate(order):
        whole.put(k, 1000 + off)
        (early if off < cut else late).put(k, 1000 + off)
    lookups, probes = early.lookups + late.lookups, early.probes + late.probes
    early.merge_from(late)
    assert (early.lookups, early.probes) == (lookups, probes)   # (get() counts lookups too)
    assert early.size == whole.size == len(set(order))
    assert early.latest_offset == whole.latest_offset == 1000 + len(order) - 1
    assert all(early.get(k) == whole.get(k) for k in keys)
    assert early.get(b"never put") == -1
    assert late.size == len(set(order[cut:]))   # the merged map is left as it was


def test_merge_grows_the_probed_table_and_keeps_the_larger_latest_offset():
    big, small = _core.OffsetMap(24 * 1_000_000), _core.OffsetMap(24 * 1_000_000)
    big.put(b"a", 5)
    for i in range(200_000):                       # past the 65,536-slot first table
        small.put(b"k%d" % i, 100 + i)
    small.update_latest_offset(4)                  # smaller than big's: big's stays
    before = big.table_slots
    big.merge_from(small)
    assert big.size == 200_001 and big.table_slots > before
    assert big.get(b"a") == 5 and big.get(b"k199999") == 100 + 199_999
    assert big.latest_offset == 5


def test_merge_refuses_strategy_maps_itself_and_a_union_that_does_not_fit():
    plain = _core.OffsetMap(24 * 100)
    for strategy, header in (("timestamp", None), ("header", "v")):
        other = _core.OffsetMap(32 * 100, strategy=strategy, header_key=header)
        with pytest.raises(ValueError, match="offset-strategy"):
            plain.merge_from(other)
        with pytest.raises(ValueError, match="offset-strategy"):
            other.merge_from(plain)
    with pytest.raises(ValueError, match="itself"):
        plain.merge_from(plain)
    tiny, many = _core.OffsetMap(24 * 10), _core.OffsetMap(24 * 100)
    for i in range(50):
        many.put(b"x%d" % i, i)
    with pytest.raises(OverflowError, match="full"):
        tiny.merge_from(many)


def _halves(keys, cut, seed=3, n=20_000):
    rng = np.random.default_rng(seed)
    order = [keys[i] for i in rng.integers(0, len(keys), n)]
    whole = _core.OffsetMap(24 * 100_000)
    early, late = _core.OffsetMap(24 * 100_000), _core.OffsetMap(24 * 50_000)
    for off, k in enumerate(order):
        whole.put(k, 1000 + off)
        (early if off < cut else late).put(k, 1000 + off)
    return whole, early, late


def test_merge_lookups_on_two_threads_then_inserts_equal_merge_from():
    keys = _digest_keys(4000, seed=5)

    def maps():
        whole, early, late = _halves(keys[:3000], 10_000)
        for i, k in enumerate(keys[3000:]):    # keys only the later map has: inserts
            late.put(k, 50_000 + i)
            whole.put(k, 50_000 + i)
        return whole, early, late

    whole, early, late = maps()
    _, serial, late_again = maps()
    serial.merge_from(late_again)
    _, e3, l3 = maps()   # get() counts lookups: asked of a third pair
    lacking = sum(e3.get(k) == -1 and l3.get(k) != -1 for k in keys)
    early_size = early.size
    mid = late.table_slots // 2
    with ThreadPoolExecutor(2) as pool:        # the lookups of both halves at once
        first = pool.submit(early.merge_lookup, late, 0, mid)
        second = pool.submit(early.merge_lookup, late, mid)
        a, b = first.result(), second.result()
    assert len(a[3]) + len(b[3]) == lacking >= 1000   # exactly the keys early lacked
    assert early.size == early_size                   # lookups insert nothing
    early.merge_insert(late, a, b)
    assert early.size == serial.size == whole.size
    assert all(early.get(k) == serial.get(k) == whole.get(k) for k in keys)
    assert (early.lookups, early.probes, early.latest_offset) == (
        serial.lookups, serial.probes, serial.latest_offset)


def test_merge_insert_after_the_table_changed_probes_again():
    keys = _digest_keys(3000, seed=7)
    for change in ("grow", "put"):
        small, late = _core.OffsetMap(24 * 1_000_000), _core.OffsetMap(24 * 1_000_000)
        for i, k in enumerate(keys):
            late.put(k, 10_000 + i)
        small.put(b"first", 1)
        found = small.merge_lookup(late)
        assert len(found[3]) == len(set(keys)) and found[4] == 0
        if change == "grow":                   # every entry re-placed: the slots are stale
            for i in range(40_000):
                small.put(b"g%d" % i, 2)
        else:                                  # slots only filled: a taken one probes again
            for k in keys[:100]:
                small.put(k + b"x", 3)
        small.merge_insert(late, found)
        assert all(small.get(k) == late.get(k) for k in keys)
        assert small.get(b"first") == 1


def test_merge_lookup_rejects_bad_ranges_and_a_stale_slot_is_probed_for_again():
    early, late = _core.OffsetMap(24 * 1000), _core.OffsetMap(24 * 1000)
    late.put(b"k", 5)
    with pytest.raises(ValueError, match="outside"):
        early.merge_lookup(late, 0, late.table_slots + 1)
    with pytest.raises(ValueError, match="outside"):
        early.merge_lookup(late, 10, 5)
    _, _, layout, rows, drained = early.merge_lookup(late)
    assert drained == 0 and len(rows) == 1
    for slot in (1 << 40, -7):                 # out of range: Kafka's put finds the slot
        bad = rows.copy()
        bad[0, 3] = slot
        early.merge_insert(late, (early, late, layout, bad, 0))
    assert early.get(b"k") == 5 and early.size == 1
    other = _core.OffsetMap(24 * 1000)
    found = other.merge_lookup(late)
    with pytest.raises(ValueError, match="same two maps"):
        early.merge_insert(late, found)          # another map's lookups
    with pytest.raises(ValueError, match="same two maps"):
        other.merge_insert(early, found)


def test_a_drained_merge_leaves_the_later_map_empty_and_reusable():
    keys = _digest_keys(3000, seed=9)
    whole, early, late = _halves(keys, 8_000)
    table = late.table_slots
    early.merge_from(late, drain=True)
    assert all(early.get(k) == whole.get(k) for k in keys)
    assert (late.size, late.lookups, late.probes, late.latest_offset) == (0, 0, 0, -1)
    assert all(late.get(k) == -1 for k in keys)   # every slot zeroed
    late.clear(table, keep_pages=True)
    for i, k in enumerate(keys[:500]):
        late.put(k, i)
    assert late.size == len(set(keys[:500])) and late.get(keys[0]) == keys.index(keys[0])
    # Lookups that drain only part of a map leave its count alone (a caller's mistake, but
    # nothing breaks): the entries read are gone, the rest stay.
    part = _core.OffsetMap(24 * 1000)
    half = part.merge_lookup(late, 0, late.table_slots // 2, drain=True)
    part.merge_insert(late, half)
    assert late.size == len(set(keys[:500]))
    assert sum(late.get(k) != -1 for k in set(keys[:500])) == late.size - half[4]


# -- where the dirty section is split ------------------------------------------------------------

Seg = namedtuple("Seg", "base_offset size")


def _segs(n, records=1000, size=1 << 20):
    return [Seg(i * records, size) for i in range(n)]


def test_split_point_takes_the_last_segments_up_to_the_later_share(monkeypatch):
    monkeypatch.setattr(map_helper, "MIN_BYTES", 0)
    segs = _segs(10)
    k = map_helper.split_point(segs, 0, 10_000, 1_000_000, 1_000_000)
    assert k == 5                    # 5 of 10 equal segments: 50% <= 55% < 60%
    sizes = [s.size for s in segs]
    assert sum(sizes[k:]) <= map_helper.LATER_SHARE * sum(sizes) < sum(sizes[k - 1:])


def test_split_point_declines_what_could_change_the_result(monkeypatch):
    monkeypatch.setattr(map_helper, "MIN_BYTES", 0)
    segs = _segs(10)
    # The dirty section holds as many offsets as the map's max_desired_size: it could fill.
    assert map_helper.split_point(segs, 0, 10_000, 10_000, 1_000_000) is None
    assert map_helper.split_point(segs, 0, 10_000, 10_001, 1_000_000) == 5
    # The later part must fit the side map by its offsets: fewer than 3,000 here takes two
    # segments (20% of the bytes, just enough); fewer than 2,000 one, which is too little.
    assert map_helper.split_point(segs, 0, 10_000, 1_000_000, 3_000) == 8
    assert map_helper.split_point(segs, 0, 10_000, 1_000_000, 2_000) is None
    assert map_helper.split_point(segs[:1], 0, 1000, 1_000_000, 1_000_000) is None
    monkeypatch.setattr(map_helper, "MIN_BYTES", 64 << 20)
    assert map_helper.split_point(segs, 0, 10_000, 1_000_000, 1_000_000) is None


def test_the_filter_is_shared_from_two_groups_and_min_bytes(monkeypatch):
    monkeypatch.setattr(map_helper, "MIN_BYTES", 0)
    assert map_helper.filter_worth_splitting([10, 10])
    assert not map_helper.filter_worth_splitting([100])
    monkeypatch.setattr(map_helper, "MIN_BYTES", 1000)
    assert not map_helper.filter_worth_splitting([10] * 10)
    assert map_helper.filter_worth_splitting([500, 500])


# -- a map build and a round with and without the helper ---------------------------------------

def _store(root, clock, n_records=60_000, n_keys=5_000, seed=3, gzip=True, gzip_last=False,
           **topic):
    store = segstore.open(str(root), clock=clock)
    config = {"cleanup.policy": "compact", "segment.bytes": 200_000, "delete.retention.ms": 0,
              "min.cleanable.dirty.ratio": 0.0, **topic}
    store.create_topic("t", 1, config=config)
    lg = store.partition("t", 0)
    rng = np.random.default_rng(seed)
    for lo in range(0, n_records, 5_000):
        idx = rng.integers(0, n_keys, 5_000)
        keys = [b"key-%d" % i if i % 97 else None for i in idx]          # some keyless
        values = [None if i % 13 == 0 else b"v%d-%d" % (i, lo) for i in idx]  # tombstones
        append_batch_unvalidated(lg, values, keys=keys, timestamps_ms=[clock.now] * len(idx),
                        compression="gzip" if gzip and (lo % 20_000 == 0 or gzip_last and
                                                        lo + 5_000 >= n_records) else None)
        clock.advance(10)
    lg.roll()
    return store, lg


def _cleaner(helper):
    c = Cleaner(0, _core.OffsetMap(24 * 200_000), 1 << 20, Throttler(float("inf")), lambda: T0)
    c.map_helper = helper
    return c


def _build(cleaner, lg):
    end = lg.segments[-1].base_offset
    stats = CleanerStats()
    cleaner.build_offset_map(lg, 0, end, stats)
    return stats


def test_map_build_with_the_helper_equals_one_pass(tmp_path, helper_on_small_logs):
    store, lg = _store(tmp_path / "s", FakeClock(T0))
    try:
        one, two = _cleaner(False), _cleaner(True)
        s1, s2 = _build(one, lg), _build(two, lg)
        assert len(helper_on_small_logs) == 1   # the later part and half the merge
        m1, m2 = one.offset_map, two.offset_map
        assert m2.lookups == m1.lookups   # every key read counted once, either way
        assert (m2.size, m2.latest_offset) == (m1.size, m1.latest_offset)
        assert all(m2.get(b"key-%d" % i) == m1.get(b"key-%d" % i) for i in range(5_000))
        assert (s2.map_messages_read, s2.map_bytes_read) == (s1.map_messages_read,
                                                              s1.map_bytes_read)
        assert two._crc_checked == one._crc_checked
        # The helper is free again, and the side map gave its pages back.
        assert map_helper.try_acquire()
        map_helper.release()
        assert map_helper.side_map(two.offset_map.load_factor).size == 0
    finally:
        store.close()


def _log_files(lg):
    out = {}
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            out[os.path.basename(seg.log_path)] = f.read()
    return out


def test_a_round_with_the_helper_writes_the_same_segments(tmp_path, helper_on_small_logs):
    results = []
    for helper in (False, True):
        clock = FakeClock(T0)
        store, lg = _store(tmp_path / f"s{helper}", clock)
        try:
            store.cleaner.worker(-1, lg).map_helper = helper
            stats = store.compact("t", 0, force=True, now_ms=clock.now)
            results.append((_log_files(lg), [(s.messages_read, s.messages_written)
                                             for s in stats]))
        finally:
            store.close()
    assert len(helper_on_small_logs) >= 1
    assert results[0] == results[1]


def _round(root, helper, **kw):
    """One forced round of a fresh store; (log files, per-round counts, cleaned dir names)."""
    clock = FakeClock(T0)
    store, lg = _store(root, clock, **kw)
    try:
        store.cleaner.worker(-1, lg).map_helper = helper
        stats = store.compact("t", 0, force=True, now_ms=clock.now)
        leftovers = sorted(n for n in os.listdir(lg.directory)
                           if n.endswith((".cleaned", ".swap")))
        return (_log_files(lg), [(s.messages_read, s.messages_written, s.bytes_read,
                                  s.bytes_written, s.segments_cleaned, s.segments_written)
                                 for s in stats], leftovers)
    finally:
        store.close()


def _record_helper_groups(monkeypatch) -> list:
    """The log file names of the groups Cleaner.write_unsealed is called with on the helper
    thread (recorded before the call)."""
    names = []
    real = Cleaner.write_unsealed

    def recording(self, lg, group, *a, **k):
        if threading.get_ident() != threading.main_thread().ident:
            names.extend(os.path.basename(seg.log_path) for seg in group)
        return real(self, lg, group, *a, **k)

    monkeypatch.setattr(Cleaner, "write_unsealed", recording)
    return names


def _helper_filtered(uses) -> int:
    return sum(getattr(fn, "__name__", "") == "write_later" for fn in uses)


def test_the_helper_filters_later_plain_groups_to_the_same_bytes(tmp_path,
                                                                 helper_on_small_logs):
    without = _round(tmp_path / "a", False, gzip=False)
    with_helper = _round(tmp_path / "b", True, gzip=False)
    assert _helper_filtered(helper_on_small_logs) == 1
    assert with_helper == without and without[2] == []


@pytest.mark.parametrize("held", ["helper", "cleaner thread"])
def test_the_threads_share_the_groups_from_both_ends_whatever_each_costs(
        tmp_path, monkeypatch, helper_on_small_logs, held):
    """One thread is held at its first group until the other has cleaned three: the other
    takes on more groups. Whatever the interleaving, the cleaner thread's groups are a prefix
    of the round's, the helper's the rest, each cleaned once, and the bytes are those of a
    round on one thread."""
    without = _round(tmp_path / "a", False, gzip=False)
    main = threading.main_thread().ident
    real = Cleaner.write_unsealed
    order = {"main": [], "helper": []}
    three_done = threading.Event()

    def write_unsealed(self, lg, group, *a, **k):
        mine = "main" if threading.get_ident() == main else "helper"
        waiting = ("helper" if held == "helper" else "main") == mine
        if waiting and not order[mine]:
            assert three_done.wait(60), "the other thread never cleaned three groups"
        order[mine].append(group[0].base_offset)
        result = real(self, lg, group, *a, **k)
        if not waiting and len(order[mine]) == 3:
            three_done.set()
        return result

    monkeypatch.setattr(Cleaner, "write_unsealed", write_unsealed)
    with_helper = _round(tmp_path / "b", True, gzip=False)
    assert _helper_filtered(helper_on_small_logs) == 1
    assert with_helper == without
    front, back = order["main"], sorted(order["helper"])
    other = back if held == "cleaner thread" else front
    assert len(other) >= 3 and len(order["main"]) >= 1 and len(order["helper"]) >= 1
    assert order["helper"] == sorted(order["helper"], reverse=True)   # from the last one back
    assert front == sorted(front) and max(front) < min(back)           # prefix, then the rest
    assert len(set(front + back)) == len(front + back)


def test_groups_with_batches_the_kernel_cannot_decide_are_not_split(tmp_path, monkeypatch,
                                                                   helper_on_small_logs):
    """A compressed batch in the last group (as transactional or producer batches would):
    the helper, which takes groups from the last one back, leaves it and every group to the
    cleaner thread (the map may still be split), and the bytes are the same."""
    without = _round(tmp_path / "a", False, n_records=60_000, gzip=True, gzip_last=True)
    helper_groups = _record_helper_groups(monkeypatch)
    with_helper = _round(tmp_path / "b", True, n_records=60_000, gzip=True, gzip_last=True)
    assert _helper_filtered(helper_on_small_logs) == 1 and helper_groups == []
    assert with_helper == without


def _failing_in_helper(monkeypatch, method):
    """Make Cleaner.<method> raise when it runs on the helper thread."""
    real = getattr(Cleaner, method)
    main = threading.get_ident()

    def failing(self, *a, **k):
        if threading.get_ident() != main:
            raise OSError("disk full (injected) on the helper")
        return real(self, *a, **k)

    monkeypatch.setattr(Cleaner, method, failing)


@pytest.mark.parametrize("where", ["helper", "main"])
def test_a_failed_split_round_leaves_the_log_as_it_was(tmp_path, monkeypatch,
                                                       helper_on_small_logs, where):
    """An error on either thread fails the round: no .cleaned file stays, every segment the
    round did not swap in is untouched, and the next round cleans as one without the split
    would."""
    clock = FakeClock(T0)
    store, lg = _store(tmp_path / "s", clock, gzip=False)
    try:
        before, want = _log_files(lg), _table(lg)
        if where == "helper":
            _failing_in_helper(monkeypatch, "write_unsealed")
        else:
            real = Cleaner.write_unsealed
            calls = []

            def failing_second(self, *a, **k):
                if threading.get_ident() == threading.main_thread().ident:
                    calls.append(1)
                    if len(calls) == 2:
                        # Once the helper has a group of its own (it starts a thread wake-up
                        # later, and this thread no longer waits on fsyncs between groups).
                        deadline = time.monotonic() + 10
                        while not helper_groups and time.monotonic() < deadline:
                            time.sleep(0.0005)
                        raise OSError("disk full (injected) on the cleaner thread")
                return real(self, *a, **k)

            monkeypatch.setattr(Cleaner, "write_unsealed", failing_second)
        helper_groups = _record_helper_groups(monkeypatch)
        with pytest.raises(OSError, match="injected"):
            store.cleaner.clean_log(-1, store.cleaner_manager.grab_log(lg.topic_partition,
                                                                       clock.now, force=True),
                                    clock.now, raise_errors=True)
        assert _helper_filtered(helper_on_small_logs) == 1
        names = os.listdir(lg.directory)
        assert not [n for n in names if n.endswith((".cleaned", ".swap"))], names
        after = _log_files(lg)
        # The groups the helper took were never swapped in: byte for byte as before.
        later = [n for n in helper_groups if n in before]
        assert later and all(after.get(n) == before[n] for n in later), later
        assert _table(lg) == want          # nothing lost: swapped groups are whole
        monkeypatch.undo()
        stats = store.compact("t", 0, force=True, now_ms=clock.now)
        assert stats and stats[0].segments_cleaned > 0
        assert _table(lg) == want
    finally:
        store.close()


def _table(lg) -> dict:
    """key -> value of every key whose last record is not a tombstone (a replay)."""
    last = {}
    for r in lg.iter_records():
        if r.key is not None:
            last[r.key] = r.value
    return {k: v for k, v in last.items() if v is not None}


def test_a_busy_helper_means_one_pass(tmp_path, helper_on_small_logs):
    store, lg = _store(tmp_path / "s", FakeClock(T0))
    try:
        one, two = _cleaner(False), _cleaner(True)
        _build(one, lg)
        assert map_helper.try_acquire()       # another round has the helper
        try:
            _build(two, lg)
        finally:
            map_helper.release()
        assert helper_on_small_logs == []
        assert two.offset_map.size == one.offset_map.size
        assert all(two.offset_map.get(b"key-%d" % i) == one.offset_map.get(b"key-%d" % i)
                   for i in range(5_000))
    finally:
        store.close()


def test_an_abort_seen_by_the_helper_stops_the_build(tmp_path, helper_on_small_logs):
    """check_done raising on the helper thread fails the build on the cleaner's thread, after
    both halves stopped; the helper is free and the side map empty afterwards."""
    store, lg = _store(tmp_path / "s", FakeClock(T0))
    try:
        c = _cleaner(True)
        main = threading.get_ident()

        def check_done(tp):
            if threading.get_ident() != main:
                raise CleaningAbortedError("aborted while the helper maps")

        c.check_done = check_done
        with pytest.raises(CleaningAbortedError, match="helper maps"):
            _build(c, lg)
        assert len(helper_on_small_logs) == 1
        assert map_helper.try_acquire()
        map_helper.release()
        c.check_done = lambda tp: None
        _build(c, lg)                          # the next round maps normally
        assert c.offset_map.size > 0
    finally:
        store.close()


def test_an_abort_on_the_cleaner_thread_releases_the_helper_waiting_to_merge(
        tmp_path, monkeypatch, helper_on_small_logs):
    """The cleaner thread's part fails after the helper's ended: the helper, waiting at the
    meeting before the merge, stops there; the side map's pages go back (it was not
    drained), the helper is free and the next build maps normally."""
    store, lg = _store(tmp_path / "s", FakeClock(T0))
    try:
        c = _cleaner(True)
        main = threading.get_ident()
        calls = []
        helper_arrived = threading.Event()
        helper_saw = []
        real_arrive, real_wait = map_helper.Meeting.arrive, map_helper.Meeting.wait_for

        def arrive(self, who, ok):
            real_arrive(self, who, ok)
            if who == 1 and ok:
                helper_arrived.set()

        def wait_for(self, who, check=lambda: None):
            seen = real_wait(self, who, check)
            if threading.get_ident() != main:
                helper_saw.append(seen)
            return seen

        monkeypatch.setattr(map_helper.Meeting, "arrive", arrive)
        monkeypatch.setattr(map_helper.Meeting, "wait_for", wait_for)

        def check_done(tp):
            if threading.get_ident() == main:
                calls.append(1)
                if len(calls) == 3:
                    # Only once the helper has mapped its part and waits at the meeting.
                    assert helper_arrived.wait(60), "the helper never finished its part"
                    raise CleaningAbortedError("aborted on the cleaner thread")

        c.check_done = check_done
        with pytest.raises(CleaningAbortedError, match="cleaner thread"):
            _build(c, lg)
        assert len(helper_on_small_logs) == 1
        assert helper_saw == [False]   # it waited, learnt the other part failed, stopped
        assert map_helper.try_acquire()
        map_helper.release()
        assert map_helper.side_map(c.offset_map.load_factor).size == 0
        c.check_done = lambda tp: None
        one = _cleaner(False)
        _build(c, lg)
        _build(one, lg)
        assert c.offset_map.size == one.offset_map.size > 0
    finally:
        store.close()


def test_spin_wait_sees_another_threads_store_and_times_out():
    flags = np.zeros(2, dtype=np.int64)
    assert _core.spin_wait(flags, 1, 0.001) == 0          # nobody sets it: times out
    timer = threading.Timer(0.01, lambda: _core.spin_set(flags, 1, 7))
    timer.start()
    assert _core.spin_wait(flags, 1, 5.0) == 7
    timer.join()
    with pytest.raises(InvalidArgumentError, match="outside the 2 flags"):
        _core.spin_wait(flags, 2, 0.001)
    with pytest.raises(InvalidArgumentError, match="outside the 2 flags"):
        _core.spin_set(flags, -1, 1)


def test_a_meeting_reports_how_the_other_part_went(monkeypatch):
    monkeypatch.setattr(map_helper, "SPIN_SECONDS", 0.0)   # the sleeping path too
    m = map_helper.Meeting()
    threading.Timer(0.02, lambda: m.arrive(1, False)).start()
    assert m.wait_for(1) is False
    m.arrive(0, True)
    assert m.wait_for(0) is True
    late = map_helper.Meeting()

    def cancelled():
        raise map_helper.HelperCancelled("cancelled")

    with pytest.raises(map_helper.HelperCancelled):
        late.wait_for(0, cancelled)                      # nobody comes: check() ends the wait


def test_only_a_lone_cleaner_thread_takes_the_helper(tmp_path):
    for threads, expected in ((1, map_helper.spare_core()), (2, False)):
        store = segstore.open(str(tmp_path / f"s{threads}"),
                              config={"log.cleaner.threads": threads})
        try:
            store.create_topic("t", 1, config={"cleanup.policy": "compact"})
            lg = store.partition("t", 0)
            assert store.cleaner.worker(0, lg).map_helper is expected
        finally:
            store.close()


def test_oracle_workloads_with_the_helper(tmp_path_factory, helper_on_small_logs):
    """The compaction oracle (replay, byte-identical records, horizons, kafka-python) with the
    helper taking every dirty section it may (a few to a few dozen rounds per run, as the
    examples drawn allow; the tests above take it deterministically)."""
    oracle_tests.test_random_workloads_against_a_replay(tmp_path_factory)


def test_transactional_oracle_with_the_helper(tmp_path_factory, helper_on_small_logs):
    """The transactional oracle with the helper allowed (few of these workloads roll often
    enough to take it)."""
    oracle_tests.test_transactional_workloads_against_a_committed_replay(tmp_path_factory)


# -- the review's cases: interrupts, errors before the split starts, the plain walk ---------------

def test_an_interrupt_while_the_cleaner_thread_waits_stops_the_helper_first(
        tmp_path, monkeypatch, helper_on_small_logs):
    """Ctrl-C (SIGINT) while the round runs: the helper is cancelled and waited for, its
    .cleaned files are deleted, and only then does KeyboardInterrupt leave compact(); the
    helper is free and the log reads as before."""
    import signal

    clock = FakeClock(T0)
    store, lg = _store(tmp_path / "s", clock, gzip=False)
    try:
        want = _table(lg)
        real = Cleaner.write_unsealed
        main = threading.get_ident()

        def interrupting(self, lg_, group, *a, **k):
            if threading.get_ident() != main:
                signal.pthread_kill(main, signal.SIGINT)   # to the waiting cleaner thread
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:    # until the cancel reaches this thread
                    self.check_done(lg_.topic_partition)
                    time.sleep(0.001)
                raise AssertionError("the helper was never cancelled")
            return real(self, lg_, group, *a, **k)

        monkeypatch.setattr(Cleaner, "write_unsealed", interrupting)
        # Python leaves SIGINT ignored when it starts ignored (a suite run in the background
        # by a non-interactive shell): Ctrl-C's KeyboardInterrupt is what this test is about.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                store.compact("t", 0, force=True, now_ms=clock.now)
        finally:
            signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
        assert _helper_filtered(helper_on_small_logs) == 1
        assert map_helper.try_acquire()
        map_helper.release()
        # None of the helper's files (the later half's groups) is left. The interrupt may
        # land on the cleaner thread anywhere, also between creating its own .cleaned file
        # and the code that deletes it on errors: that one the loader deletes on the next
        # open, as after a crash.
        half = lg.segments[len(lg.segments) // 2].base_offset
        left = [n for n in os.listdir(lg.directory) if n.endswith((".cleaned", ".swap"))]
        assert all(int(n.split(".")[0]) < half for n in left), left
        assert _table(lg) == want
        directory = lg.directory
    finally:
        store.close()
    store = segstore.open(str(tmp_path / "s"), clock=clock)
    try:
        # The log loads at its first use (the open was clean), and its loader deletes them.
        assert _table(store.partition("t", 0)) == want
        assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
    finally:
        store.close()


def test_a_helper_that_cannot_start_means_one_pass(tmp_path, monkeypatch, helper_on_small_logs):
    """No thread can be started (interpreter shutdown): the round maps and filters in one
    pass and cleans the same bytes; an error while setting the split up frees the helper."""
    monkeypatch.setattr(map_helper, "submit", lambda fn, *a: (_ for _ in ()).throw(
        RuntimeError("cannot schedule new futures after interpreter shutdown")))
    assert _round(tmp_path / "a", True, gzip=False) == _round(tmp_path / "b", False, gzip=False)
    monkeypatch.setattr(Cleaner, "_clean_split", lambda *a, **k: (_ for _ in ()).throw(
        MemoryError("no memory for the sibling's buffer")))
    with pytest.raises(MemoryError):
        _round(tmp_path / "c", True, gzip=False)
    assert map_helper.try_acquire()
    map_helper.release()


def _segment_of(tmp_path, name, batches):
    store = segstore.open(str(tmp_path / name), clock=FakeClock(T0))
    store.create_topic("t", 1)
    lg = store.partition("t", 0)
    for batch in batches:
        batch(lg)
    lg.roll()
    return store, lg.segments[0]


@pytest.mark.parametrize("kind, plain", [
    ("plain", True), ("gzip", False), ("producer", False), ("transactional", False),
    ("control", False), ("empty", True)])
def test_plain_segments_are_told_apart(tmp_path, kind, plain):
    def values(lg, **k):
        lg.append_batch([b"v1", b"v2"], keys=[b"a", b"b"], **k)

    batches = {
        "plain": [values, values],
        "gzip": [values, lambda lg: values(lg, compression="gzip")],
        "producer": [values, lambda lg: values(lg, producer_id=7, producer_epoch=0,
                                               base_sequence=0)],
        "transactional": [values, lambda lg: values(lg, producer_id=7, producer_epoch=0,
                                                    base_sequence=0, is_transactional=True)],
        "control": [lambda lg: values(lg, producer_id=7, producer_epoch=0, base_sequence=0,
                                      is_transactional=True),
                    lambda lg: lg.append_control(1, producer_id=7, producer_epoch=0)],
        "empty": [],
    }[kind]
    store, seg = _segment_of(tmp_path, kind, batches)
    try:
        assert _cleaner(True)._plain_segment(seg) is plain
    finally:
        store.close()


def test_the_plain_walk_allocates_nothing_per_batch(tmp_path):
    """A segment of 50,000 one-record batches: telling it plain allocates no header arrays
    (the walk is compiled and keeps nothing)."""
    import tracemalloc

    store = segstore.open(str(tmp_path / "s"), clock=FakeClock(T0))
    store.create_topic("t", 1)
    lg = store.partition("t", 0)
    one = BinaryColumn.from_pylist([b"v"] * 50_000)
    lg.append_columns(one, one, T0, records_per_batch=1)
    lg.roll()
    seg = lg.segments[0]
    try:
        c = _cleaner(True)
        tracemalloc.start()
        assert c._plain_segment(seg)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 256 << 10, peak
        assert _core.plain_batches(seg.buffer(seg.size), 0, seg.size) == (seg.size, True)
        assert _core.plain_batches(seg.buffer(seg.size), 0, seg.size - 1)[1] is True
    finally:
        store.close()
