"""Offset index (``.index``) and time index (``.timeindex``): REF §2.3, §2.4, §2.7, §2.8 and the
index behaviours of REF §7 (#1-#9), plus the compiled warm-section search (``_core.index_lookup``)
against ``bisect``.

Expectations come from sorted Python lists and ``struct``/numpy decodes of the files, never from
the code under test.
"""

from __future__ import annotations

import bisect
import os
import random
import struct

import numpy as np
import pytest

from segstore import _core
from segstore.errors import CorruptIndexError, InvalidArgumentError, InvalidOffsetError
from segstore.index import OffsetIndex, TimeIndex

BASE = 45
OFFSET_DT = np.dtype([("rel", ">i4"), ("pos", ">i4")])
TIME_DT = np.dtype([("ts", ">i8"), ("rel", ">i4")])


def offset_index(tmp_path, max_bytes=30 * 8, base=BASE, name="idx.index", **kw):
    return OffsetIndex(str(tmp_path / name), base, max_bytes, **kw)


def time_index(tmp_path, max_bytes=30 * 12, base=BASE, name="idx.timeindex", **kw):
    return TimeIndex(str(tmp_path / name), base, max_bytes, **kw)


def floor_oracle(keys, values, target, default):
    i = bisect.bisect_right(keys, target) - 1
    return default if i < 0 else values[i]


# ---------------------------------------------------------------------------------------------
# offset index


def test_new_index_is_preallocated_to_whole_entries(tmp_path):
    idx = offset_index(tmp_path, max_bytes=8 * 10 + 5)  # rounded down to whole entries
    assert os.path.getsize(idx.path) == 80
    assert idx.max_entries == 10 and idx.entries == 0 and idx.size_bytes == 0
    assert idx.last_offset == BASE


def test_lookup_empty_and_below_first_returns_base_position_0(tmp_path):  # REF §7 #1
    idx = offset_index(tmp_path)
    for target in (0, BASE - 1, BASE, BASE + 1, 10**12):
        assert idx.lookup(target) == (BASE, 0)
    idx.append(BASE + 10, 100)
    idx.append(BASE + 20, 200)
    for target in (0, BASE, BASE + 9):
        assert idx.lookup(target) == (BASE, 0)
    assert idx.lookup(BASE + 10) == (BASE + 10, 100)
    assert idx.lookup(BASE + 19) == (BASE + 10, 100)
    assert idx.lookup(BASE + 20) == (BASE + 20, 200)
    assert idx.lookup(2**40) == (BASE + 20, 200)  # far beyond int32 relative range


def test_random_lookups_match_sorted_list_oracle(tmp_path):  # REF §7 #2
    rnd = random.Random(7)
    idx = offset_index(tmp_path, max_bytes=8 * 3000)
    offsets = sorted(rnd.sample(range(BASE, BASE + 100_000), 2500))
    positions = sorted(rnd.sample(range(0, 10**7), 2500))
    for o, p in zip(offsets, positions):
        idx.append(o, p)
    pairs = list(zip(offsets, positions))
    targets = [rnd.randrange(0, BASE + 100_010) for _ in range(2000)] + offsets[::7]
    targets += [o - 1 for o in offsets[-1030:-1020]] + [o + 1 for o in offsets[-1030:-1020]]
    for t in targets:
        assert idx.lookup(t) == floor_oracle(offsets, pairs, t, (BASE, 0)), t
    for slot in (0, 1, 1234, 2499):  # exact hits return the exact entry
        assert idx.entry(slot) == pairs[slot]
        assert idx.lookup(offsets[slot]) == pairs[slot]


def test_full_index_rejects_append_and_is_full_flips_at_max_entries(tmp_path):  # REF §7 #3
    idx = offset_index(tmp_path, max_bytes=8 * 5)
    for i in range(5):
        assert not idx.is_full()
        idx.append(BASE + i, i * 10)
    assert idx.is_full() and idx.entries == idx.max_entries == 5
    with pytest.raises(InvalidOffsetError):
        idx.append(BASE + 100, 1000)
    assert idx.entries == 5


@pytest.mark.parametrize("bad", [BASE + 3, BASE + 2])
def test_append_offset_not_above_last_fails(tmp_path, bad):  # REF §7 #3
    idx = offset_index(tmp_path)
    idx.append(BASE + 1, 0)
    idx.append(BASE + 3, 10)
    with pytest.raises(InvalidOffsetError):
        idx.append(bad, 20)
    assert idx.entries == 2 and idx.last_offset == BASE + 3


def test_truncate_to_semantics(tmp_path):  # REF §7 #4
    idx = offset_index(tmp_path)
    offsets = [BASE + 2 * i for i in range(1, 11)]  # BASE+2 .. BASE+20
    for i, o in enumerate(offsets):
        idx.append(o, i * 100)

    idx.truncate_to(BASE + 50)  # beyond the last entry: no-op
    assert idx.entries == 10 and idx.last_offset == BASE + 20

    idx.truncate_to(BASE + 20)  # equal to an entry: drops it and the later ones
    assert idx.entries == 9 and idx.last_offset == BASE + 18
    assert idx.lookup(BASE + 20) == (BASE + 18, 800)

    idx.truncate_to(BASE + 13)  # between entries: keeps the floor
    assert idx.entries == 6 and idx.last_offset == BASE + 12
    assert idx.lookup(BASE + 13) == (BASE + 12, 500)

    idx.append(BASE + 13, 555)  # appends work after a truncation
    assert idx.lookup(BASE + 100) == (BASE + 13, 555)

    idx.truncate_to(BASE)  # full truncate
    assert idx.entries == 0 and idx.lookup(BASE + 10) == (BASE, 0)
    idx.truncate_to(0)  # below the base as well
    assert idx.entries == 0
    idx.append(BASE + 1, 7)
    assert idx.lookup(BASE + 5) == (BASE + 1, 7)


def test_reopen_after_close_restores_entries_and_lookups(tmp_path):  # REF §7 #5
    rnd = random.Random(3)
    idx = offset_index(tmp_path, max_bytes=8 * 100)
    offsets = sorted(rnd.sample(range(BASE, BASE + 5000), 60))
    for i, o in enumerate(offsets):
        idx.append(o, i * 64)
    idx.close()
    assert os.path.getsize(idx.path) == 60 * 8  # trimmed to its valid entries
    raw = np.fromfile(idx.path, dtype=OFFSET_DT)
    pairs = [(o, i * 64) for i, o in enumerate(offsets)]
    assert list(zip((raw["rel"] + BASE).tolist(), raw["pos"].tolist())) == pairs

    again = offset_index(tmp_path, max_bytes=8 * 100)
    assert again.entries == 60 and again.last_offset == offsets[-1]
    for t in range(BASE - 2, BASE + 5002, 13):
        assert again.lookup(t) == floor_oracle(offsets, pairs, t, (BASE, 0))
    again.close()

    ro = offset_index(tmp_path, writable=False)
    assert ro.entries == 60 and ro.lookup(offsets[10]) == (offsets[10], 640)
    with pytest.raises(PermissionError):  # a read-only index rejects appends
        ro.append(offsets[-1] + 1, 0)
    with pytest.raises(PermissionError):
        ro.resize(8 * 1000)


def test_readonly_view_of_preallocated_index_ignores_zero_padding(tmp_path):
    idx = offset_index(tmp_path, max_bytes=8 * 50)
    for i in range(3):
        idx.append(BASE + 1 + 2 * i, 100 * (i + 1))
    idx.flush()
    assert os.path.getsize(idx.path) == 400  # still preallocated, zeros after 3 entries
    ro = offset_index(tmp_path, writable=False)
    assert ro.entries == 3
    assert ro.lookup(BASE + 100) == (BASE + 5, 300) and ro.lookup(BASE) == (BASE, 0)
    t = time_index(tmp_path, max_bytes=12 * 50)
    t.maybe_append(10, BASE + 1)
    t.maybe_append(20, BASE + 3)
    t.flush()
    tro = time_index(tmp_path, writable=False)
    assert tro.entries == 2 and tro.lookup(10**6) == (20, BASE + 3)


def test_trim_and_resize(tmp_path):  # REF §7 #9, §2.7
    idx = offset_index(tmp_path, max_bytes=8 * 10)
    for i in range(4):
        idx.append(BASE + i, i)
    assert idx.resize(8 * 10) is False  # same size: no change
    assert idx.resize(8 * 10 + 3) is False  # rounds to the same size
    assert idx.resize(8 * 20) is True
    assert os.path.getsize(idx.path) == 160 and idx.max_entries == 20
    assert [idx.entry(i) for i in range(4)] == [(BASE + i, i) for i in range(4)]
    assert idx.resize(8 * 6) is True and idx.max_entries == 6
    assert idx.resize(8) is True and idx.max_entries == 4  # never below the valid entries
    assert [idx.entry(i) for i in range(4)] == [(BASE + i, i) for i in range(4)]
    assert idx.is_full()
    idx.resize(8 * 10)
    idx.trim_to_valid_size()
    assert os.path.getsize(idx.path) == 32 and idx.is_full()
    idx.reset(8 * 12)
    assert idx.entries == 0 and idx.max_entries == 12 and os.path.getsize(idx.path) == 96
    assert idx.lookup(BASE + 3) == (BASE, 0)


def test_offset_index_sanity_check(tmp_path):  # REF §7 #6
    idx = offset_index(tmp_path)
    idx.append(BASE, 0)  # only entry with relative offset 0 passes
    idx.sanity_check()
    idx.append(BASE + 5, 100)
    idx.sanity_check(log_size=200)
    with pytest.raises(CorruptIndexError):  # last entry points past the log end
        idx.sanity_check(log_size=50)
    idx.close()

    bad_len = tmp_path / "badlen.index"
    bad_len.write_bytes(struct.pack(">ii", 1, 0) + b"\x00\x00\x00")  # not a multiple of 8
    with pytest.raises(CorruptIndexError):
        OffsetIndex(str(bad_len), BASE, 80).sanity_check()

    below = tmp_path / "below.index"  # last offset below the base offset
    below.write_bytes(struct.pack(">ii", 2, 0) + struct.pack(">ii", -1, 10))
    with pytest.raises(CorruptIndexError):
        OffsetIndex(str(below), BASE, 80).sanity_check()

    zeros = tmp_path / "zeros.index"  # an untrimmed, zero-padded file
    zeros.write_bytes(struct.pack(">ii", 3, 10) + bytes(8 * 5))
    z = OffsetIndex(str(zeros), BASE, 80)
    with pytest.raises(CorruptIndexError):
        z.sanity_check()
    assert z.valid_prefix() == 1


def test_entries_array_and_bulk_append(tmp_path):
    idx = offset_index(tmp_path)
    arr = np.zeros(3, dtype=OFFSET_DT)
    arr["rel"] = [1, 4, 9]
    arr["pos"] = [10, 40, 90]
    idx.append_entries(arr)
    got = idx.entries_array()
    assert got["rel"].tolist() == [1, 4, 9] and got["pos"].tolist() == [10, 40, 90]
    assert idx.lookup(BASE + 5) == (BASE + 4, 40)
    big = np.zeros(100, dtype=OFFSET_DT)
    big["rel"] = np.arange(100, 200)
    with pytest.raises(InvalidOffsetError):  # would overflow the file
        idx.append_entries(big)
    assert idx.entries == 3


# ---------------------------------------------------------------------------------------------
# time index


def test_time_index_lookups(tmp_path):  # REF §7 #7
    t = time_index(tmp_path)
    assert t.lookup(0) == (-1, BASE) and t.lookup(10**12) == (-1, BASE)
    assert t.last_entry() == (-1, BASE)
    entries = [(1000 + 10 * i, BASE + 3 * i) for i in range(1, 21)]
    for ts, off in entries:
        t.maybe_append(ts, off)
    keys = [ts for ts, _ in entries]
    for target in range(900, 1250, 3):
        assert t.lookup(target) == floor_oracle(keys, entries, target, (-1, BASE)), target
    assert t.lookup(1009) == (-1, BASE)  # below the first entry
    assert t.lookup(1010) == entries[0]


@pytest.mark.parametrize("make", [offset_index, time_index])
def test_an_entry_past_the_last_is_refused(tmp_path, make):
    """Kafka's TimeIndexTest.testEntryOverflow: asking for an entry the index does not hold
    (an empty index's first, or one past the last) is an error, not the zero padding there."""
    idx = make(tmp_path)
    for slot in (0, -1):
        with pytest.raises(InvalidArgumentError, match="which has 0 entries"):
            idx.entry(slot)
    if isinstance(idx, TimeIndex):
        idx.maybe_append(1000, BASE + 1)
    else:
        idx.append(BASE + 1, 0)
    assert idx.entry(0)[0 if isinstance(idx, OffsetIndex) else 1] == BASE + 1
    with pytest.raises(InvalidArgumentError, match="no entry 1 in"):
        idx.entry(1)


def test_time_index_equal_timestamp_skipped_smaller_rejected(tmp_path):
    t = time_index(tmp_path)
    t.maybe_append(100, BASE + 1)
    t.maybe_append(100, BASE + 5)  # equal timestamp: silently skipped
    assert t.entries == 1 and t.last_entry() == (100, BASE + 1)
    with pytest.raises(InvalidOffsetError):  # smaller timestamp
        t.maybe_append(99, BASE + 6)
    with pytest.raises(InvalidOffsetError):  # smaller offset
        t.maybe_append(200, BASE)
    t.maybe_append(200, BASE + 1)  # same offset, larger timestamp is allowed (non-decreasing)
    assert t.entries == 2
    raw = np.fromfile(t.path, dtype=TIME_DT, count=2)
    assert raw["ts"].tolist() == [100, 200] and (raw["rel"] + BASE).tolist() == [BASE + 1] * 2


def test_time_index_reserves_one_slot(tmp_path):  # REF §7 #7, §2.4
    t = time_index(tmp_path, max_bytes=12 * 5)
    assert t.max_entries == 5
    for i in range(4):
        assert not t.is_full()
        t.maybe_append(10 + i, BASE + i)
    assert t.is_full() and t.entries == 4  # full at max_entries - 1
    with pytest.raises(InvalidOffsetError):
        t.maybe_append(100, BASE + 10)
    with pytest.raises(InvalidOffsetError):  # smaller offset fails even with skip_full_check
        t.maybe_append(100, BASE + 1, skip_full_check=True)
    t.maybe_append(100, BASE + 10, skip_full_check=True)  # the reserved slot
    assert t.entries == 5 and t.last_entry() == (100, BASE + 10)
    with pytest.raises(InvalidOffsetError):  # no room at all any more
        t.maybe_append(200, BASE + 11, skip_full_check=True)
    t.maybe_append(100, BASE + 11, skip_full_check=True)  # equal timestamp: skipped, no error
    assert t.entries == 5


def test_time_index_truncate_to(tmp_path):  # REF §7 #7
    t = time_index(tmp_path)
    for i in range(10):
        t.maybe_append(100 * (i + 1), BASE + 2 * i)
    t.truncate_to(BASE + 100)
    assert t.entries == 10
    t.truncate_to(BASE + 8)  # drops entries with offset >= 8
    assert t.entries == 4 and t.last_entry() == (400, BASE + 6)
    t.truncate_to(BASE + 7)
    assert t.entries == 4
    t.maybe_append(450, BASE + 7)
    assert t.lookup(460) == (450, BASE + 7)
    t.truncate_to(BASE)
    assert t.entries == 0 and t.lookup(10**9) == (-1, BASE)


def test_time_index_reopen_and_resize(tmp_path):  # REF §7 #5, #9
    t = time_index(tmp_path, max_bytes=12 * 8)
    for i in range(5):
        t.maybe_append(1000 + i, BASE + i)
    assert t.resize(12 * 8) is False
    assert t.resize(12 * 16) is True and t.max_entries == 16
    assert [t.entry(i) for i in range(5)] == [(1000 + i, BASE + i) for i in range(5)]
    t.close()
    assert os.path.getsize(t.path) == 60
    again = time_index(tmp_path, max_bytes=12 * 8)
    assert again.entries == 5 and again.last_entry() == (1004, BASE + 4)
    assert again.lookup(1002) == (1002, BASE + 2)


def test_time_index_sanity_check(tmp_path):  # REF §7 #8
    def write(name, entries, extra=b""):
        p = tmp_path / name
        p.write_bytes(b"".join(struct.pack(">qi", ts, rel) for ts, rel in entries) + extra)
        return TimeIndex(str(p), BASE, 12 * 10)

    write("ok.timeindex", [(5, 0)]).sanity_check()
    write("ok2.timeindex", [(5, 0), (6, 3), (9, 3)]).sanity_check()
    with pytest.raises(CorruptIndexError):  # last timestamp < first timestamp
        write("ts.timeindex", [(50, 0), (40, 1)]).sanity_check()
    with pytest.raises(CorruptIndexError):  # last offset below base
        write("off.timeindex", [(50, 0), (60, -2)]).sanity_check()
    with pytest.raises(CorruptIndexError):  # length not a multiple of 12
        write("len.timeindex", [(50, 0)], extra=b"\x01\x02").sanity_check()


# ---------------------------------------------------------------------------------------------
# compiled lookup


@pytest.mark.parametrize("time", [False, True])
def test_core_index_lookup_matches_bisect(time):
    rng = np.random.default_rng(11 + time)
    warm = 8192 // (12 if time else 8)
    sizes = [0, 1, 2, 3, 50, warm - 1, warm, warm + 1, warm + 2, warm + 3, 2 * warm, 5000]
    for n in sizes:
        pool = np.unique(rng.integers(0, 10**7, size=3 * n + 3))  # distinct candidates
        keys = np.sort(rng.choice(pool, size=n, replace=False)).astype(np.int64)
        if time:
            keys = keys * 1000 + 1_600_000_000_000
            arr = np.zeros(n, dtype=TIME_DT)
            arr["ts"] = keys
        else:
            arr = np.zeros(n, dtype=OFFSET_DT)
            arr["rel"] = keys
        buf = arr.tobytes() + b"\xff" * 40  # trailing junk beyond ``entries`` must be ignored
        kl = keys.tolist()
        first_hot = max(0, n - 1 - warm)
        targets = rng.integers(-5, (kl[-1] if kl else 10) + 5, 300).tolist()
        for s in {0, first_hot, max(first_hot - 1, 0), min(first_hot + 1, max(n - 1, 0)), n - 1}:
            if 0 <= s < n:
                targets += [kl[s] - 1, kl[s], kl[s] + 1]
        for target in targets:
            expected = bisect.bisect_right(kl, target) - 1
            assert _core.index_lookup(buf, n, target, time) == expected, (n, target)


def test_core_index_lookup_rejects_entries_beyond_buffer():
    with pytest.raises(ValueError):
        _core.index_lookup(b"\x00" * 16, 3, 1, False)
    with pytest.raises(ValueError):
        _core.index_lookup(b"\x00" * 16, -1, 1, False)
    with pytest.raises(ValueError):
        _core.index_lookup(b"\x00" * 24, 3, 1, True)
