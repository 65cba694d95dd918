"""LogSegment: appends with Kafka's sparse index rule (REF §2.6), reads (§2.8, §3.6), truncation
(§3.8), roll conditions (§3.3), preallocation (§2.7), recovery (§4.3) and the segment behaviours
of REF §7 (#14-#22, #24).

Expected index entries come from a pure-Python port of the sparse rule; expected file contents
from ``struct`` walks of the bytes (conftest helpers), not from the code under test.
"""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest

from conftest import HUGE_PAGE_ADVICE_SHOWS, batch_spans, map_vm_flags, v2_header
from segstore import _core
from segstore.config import TopicConfig
from segstore.errors import CorruptRecordError, InvalidOffsetError, RecordTooLargeError
from segstore.loader import recover_segment
from segstore.segment import MAX_SEGMENT_BYTES, LogSegment, segment_paths

INT32_MAX = 2**31 - 1


class Clock:
    """A fake millisecond clock."""

    def __init__(self, t=1_000_000):
        self.t = t

    def __call__(self):
        return self.t


def cfg(**kw):
    return TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})


def enc(base, n=1, ts=1000, values=None, deltas=None, codec=0):
    """One v2 batch at ``base``: (bytes, scanned BATCH_DTYPE rows)."""
    if values is None:
        values = [b"value-%d" % (base + i) for i in range(n)]
    data = _core.encode_batch(values, timestamps_ms=ts, base_offset=base, offset_deltas=deltas,
                              compression=codec)
    return data, _core.scan_batches(data).batches


def concat(parts):
    """Several (bytes, batches) pairs as one append (positions made relative to the join)."""
    data = b"".join(p[0] for p in parts)
    return data, _core.scan_batches(data).batches


def segment(tmp_path, base=0, clock=None, config=None, **kw):
    return LogSegment(str(tmp_path), base, config or cfg(), clock or Clock(), **kw)


def read_offsets(seg, start, max_bytes=10**9, min_one=True):
    rng = seg.read_range(start, max_bytes, min_one_message=min_one)
    if rng is None:
        return None
    buf, s, e = rng
    return [r.offset for r in _core.decode_records(buf, s, e)]


def sparse_oracle(batches, interval, state=None):
    """REF §2.6 per batch. ``batches``: (position, size, last_offset, max_timestamp)."""
    since, max_ts, off_max, last_time = state or (0, -1, None, -1)
    offs, times = [], []
    for pos, size, last, mts in batches:
        if mts > max_ts:
            max_ts, off_max = mts, last
        if since > interval:
            offs.append((last, pos))
            if max_ts > last_time:
                times.append((max_ts, off_max))
                last_time = max_ts
            since = 0
        since += size
    return offs, times, (since, max_ts, off_max, last_time)


def index_entries(seg):
    o = seg.offset_index.entries_array()
    t = seg.time_index.entries_array()
    return ([(seg.base_offset + int(r), int(p)) for r, p in zip(o["rel"], o["pos"])],
            [(int(ts), seg.base_offset + int(r)) for ts, r in zip(t["ts"], t["rel"])])


# ---------------------------------------------------------------------------------------------
# appends and the sparse index rule


def test_first_batch_never_indexed_then_every_batch_past_interval(tmp_path):
    seg = segment(tmp_path, base=100, config=cfg(index_interval_bytes=0))
    seg.append(*enc(100, 3, ts=50))
    assert seg.offset_index.entries == 0 and seg.time_index.entries == 0  # first batch: never
    seg.append(*enc(103, 2, ts=60))
    seg.append(*enc(105, 4, ts=55))
    offs, times = index_entries(seg)
    first_size = len(enc(100, 3, ts=50)[0])
    # entry = (last offset of the append, start position of the append)
    assert offs[0] == (104, first_size)
    assert offs[1][0] == 108
    assert times == [(60, 104)]  # 55 is not larger than 60: no time entry for the third batch


@pytest.mark.parametrize("interval", [0, 100, 700, 4096])
def test_sparse_rule_matches_oracle_over_many_appends(tmp_path, interval):
    rnd = random.Random(interval)
    seg = segment(tmp_path, base=1000, config=cfg(index_interval_bytes=interval))
    expected_batches = []
    nxt, pos = 1000, 0
    for _ in range(60):
        group = []
        for _ in range(rnd.choice([1, 1, 2, 3])):
            n = rnd.randint(1, 6)
            ts = [rnd.randint(0, 5000) for _ in range(n)]
            data, b = enc(nxt, n, ts=ts, values=[os.urandom(rnd.randint(0, 300)) for _ in range(n)])
            group.append((data, b))
            expected_batches.append((pos, len(data), nxt + n - 1, max(ts)))
            nxt += n
            pos += len(data)
        seg.append(*concat(group))
    offs, times, (_, max_ts, off_max, _) = sparse_oracle(expected_batches, interval)
    assert index_entries(seg) == (offs, times)
    assert seg.max_timestamp_so_far == max_ts and seg.offset_of_max_timestamp == off_max
    assert seg.size == pos and seg.read_next_offset() == nxt

    # recovery rebuilds exactly the same entries (REF §4.3: same rule per batch)
    before = index_entries(seg)
    assert recover_segment(seg, seg.config) == 0
    assert index_entries(seg) == before


def test_core_sparse_index_matches_oracle():
    rnd = random.Random(5)
    for _ in range(40):
        interval = rnd.choice([0, 1, 50, 500, 4096])
        parts = [enc(10 * i, rnd.randint(1, 3), ts=rnd.randint(-1, 1000),
                     values=[b"x" * rnd.randint(0, 400)] * 1) for i in range(rnd.randint(1, 30))]
        data, batches = concat(parts)
        rows = [(int(b["position"]) + 77, int(b["size"]), int(b["last_offset"]),
                 int(b["max_timestamp"])) for b in batches]
        state = (rnd.randint(0, 5000), rnd.randint(-1, 500), 3, rnd.choice([-1, 200, 600]))
        offs, times, (since, max_ts, off_max, _) = sparse_oracle(rows, interval, state)
        got = _core.sparse_index(batches, 0, 77, interval, state[0], state[1], state[2], state[3])
        assert [(int(r), int(p)) for r, p in zip(got[0]["rel"], got[0]["pos"])] == offs
        assert [(int(t), int(r)) for t, r in zip(got[1]["ts"], got[1]["rel"])] == times
        assert got[2:] == (since, max_ts, off_max)
        assert got[0].dtype == np.dtype([("rel", ">i4"), ("pos", ">i4")])


def test_append_writes_exact_bytes_at_the_end(tmp_path):
    seg = segment(tmp_path)
    parts = [enc(0, 3), enc(3, 1, codec=1), enc(4, 5, ts=[1, 2, 3, 4, 5])]
    for p in parts:
        seg.append(*p)
    with open(seg.log_path, "rb") as f:
        assert f.read() == b"".join(p[0] for p in parts)
    assert seg.size == sum(len(p[0]) for p in parts)


@pytest.mark.skipif(not HUGE_PAGE_ADVICE_SHOWS,
                    reason="Linux with transparent huge pages only: MADV_HUGEPAGE in smaps")
def test_read_map_asks_for_huge_folios(tmp_path):
    """Reads map the log with MADV_HUGEPAGE ('hg' in the mapping's VmFlags): pages faulted in
    from disk then arrive as huge folios, and later maps of the file fault far less."""
    seg = segment(tmp_path)
    seg.append(*enc(0, 3))
    buf = seg.buffer()
    assert bytes(buf[:seg.size]) == open(seg.log_path, "rb").read()
    (flags,) = map_vm_flags(seg.log_path)
    assert "hg" in flags and "rd" in flags and "wr" not in flags


@pytest.mark.parametrize("base", [0, 40, 2**31 + 10, 2**40])
def test_offset_overflow_both_signs(tmp_path, base):  # REF §7 #14
    seg = segment(tmp_path, base=base)
    if base > 0:
        with pytest.raises(InvalidOffsetError):
            seg.append(*enc(base - 1))
    with pytest.raises(InvalidOffsetError):
        seg.append(*enc(base + INT32_MAX + 1))
    with pytest.raises(InvalidOffsetError):  # a batch whose *last* offset overflows
        seg.append(*enc(base + INT32_MAX - 1, 3))
    assert seg.size == 0
    seg.append(*enc(base))
    seg.append(*enc(base + INT32_MAX))  # the largest relative offset fits
    assert seg.read_next_offset() == base + INT32_MAX + 1


def test_an_append_past_a_segments_int32_positions_is_refused(tmp_path):
    """Kafka's FileRecords.append check: a segment's index holds int32 positions, so no append
    may take its file past 2**31 - 1 bytes (they would wrap negative). Rolls keep appends
    below it; a cleaned group whose rebuilt batches grew is what could reach it."""
    seg = segment(tmp_path, config=cfg(index_interval_bytes=1))   # every batch indexed
    first = enc(0)
    seg.append(*first)
    data, batches = enc(1, 3)
    seg.size = MAX_SEGMENT_BYTES - len(data) + 1   # as if the file were that long already
    with pytest.raises(RecordTooLargeError, match="too large for segment"):
        seg.append(data, batches)
    assert seg.size == MAX_SEGMENT_BYTES - len(data) + 1
    assert os.path.getsize(seg.log_path) == len(first[0]) and seg.offset_index.entries == 0
    seg.size -= 1   # exactly fits: its last byte at position 2**31 - 2 (a sparse file)
    seg.append(data, batches)
    assert seg.size == MAX_SEGMENT_BYTES == os.path.getsize(seg.log_path)
    assert seg.offset_index.entries_array()["pos"].tolist() == [MAX_SEGMENT_BYTES - len(data)]


# ---------------------------------------------------------------------------------------------
# reading


def test_reads(tmp_path):  # REF §7 #15
    seg = segment(tmp_path, base=40, config=cfg(index_interval_bytes=1))
    assert seg.read_range(40, 1000) is None  # empty segment
    assert seg.translate_offset(40) is None
    parts = [enc(50, 5), enc(60, 5), enc(70, 5)]  # gaps 55-59 and 65-69
    for p in parts:
        seg.append(*p)
    sizes = [len(p[0]) for p in parts]
    assert read_offsets(seg, 75) is None  # start beyond the last offset
    assert read_offsets(seg, 40) == list(range(50, 55)) + list(range(60, 65)) + list(range(70, 75))
    assert read_offsets(seg, 57)[0] == 60  # start in a gap: the next batch
    assert seg.read_range(57, 10**6)[1] == sizes[0]
    assert seg.read_range(62, 10**6)[1] == sizes[0]  # inside a batch: that batch's start
    assert seg.read_range(74, 10**6)[1:] == (sizes[0] + sizes[1], sum(sizes))
    # max size smaller than the first batch: the whole batch with min-one-message ...
    assert seg.read_range(53, 1)[1:] == (0, sizes[0])
    # ... a truncated slice (first entry incomplete) without it
    # Kafka would return a 10-byte cut slice; segstore's ranges end on batch boundaries.
    assert seg.read_range(53, 10, min_one_message=False) is None
    assert seg.read_range(53, 0, min_one_message=False) is None
    # exactly two batches
    assert seg.read_range(50, sizes[0] + sizes[1])[1:] == (0, sizes[0] + sizes[1])
    assert seg.read_range(50, 10**6, max_position=sizes[0])[1:] == (0, sizes[0])
    # end_offset: no batch starting at or after it; one holding offsets below it is kept
    assert seg.read_range(50, 10**6, end_offset=60)[1:] == (0, sizes[0])
    assert seg.read_range(50, 10**6, end_offset=57)[1:] == (0, sizes[0])  # in a gap
    assert seg.read_range(50, 10**6, end_offset=61)[1:] == (0, sizes[0] + sizes[1])
    assert seg.read_range(62, 10**6, end_offset=61)[1:] == (sizes[0], sizes[0] + sizes[1])


def test_reads_stop_before_damage_they_do_not_need(tmp_path):
    """translate_offset and read_range raise for a damaged batch only when they need it."""
    seg = segment(tmp_path)
    parts = [enc(0, 2), enc(2, 2), enc(4, 2)]
    for p in parts:
        seg.append(*p)
    damaged = len(parts[0][0]) + len(parts[1][0])
    with open(seg.log_path, "r+b") as f:  # an unknown magic in the third batch
        f.seek(damaged + 16)
        f.write(b"\x07")
    assert int(seg.translate_offset(3)["position"]) == len(parts[0][0])
    assert seg.read_range(0, 1)[1:] == (0, len(parts[0][0]))
    assert seg.read_range(0, damaged)[1:] == (0, damaged)
    assert seg.read_range(0, 10**6, end_offset=4)[1:] == (0, damaged)
    for reaching in (lambda: seg.translate_offset(4), lambda: seg.read_range(0, damaged + 1),
                     lambda: seg.read_range(0, 10**6, end_offset=5)):
        with pytest.raises(CorruptRecordError) as e:
            reaching()
        assert (e.value.file, e.value.position) == (seg.log_path, damaged)


def test_read_next_offset(tmp_path):  # REF §7 #20
    seg = segment(tmp_path, base=40, config=cfg(index_interval_bytes=1))
    assert seg.read_next_offset() == 40
    seg.append(*enc(50, 3))
    assert seg.read_next_offset() == 53
    seg.append(*enc(53, 2, deltas=[0, 9]))  # offsets 53 and 62
    assert seg.read_next_offset() == 63
    for i in range(20):
        seg.append(*enc(63 + 2 * i, 2))
    assert seg.read_next_offset() == 103


# ---------------------------------------------------------------------------------------------
# truncation


def test_truncate_in_gap_removes_later_batch(tmp_path):  # REF §7 #16
    seg = segment(tmp_path, base=40, config=cfg(index_interval_bytes=1))
    seg.append(*enc(50, 3))
    seg.append(*enc(60, 3))
    first = len(enc(50, 3)[0])
    assert seg.truncate_to(55) == len(enc(60, 3)[0])
    assert seg.size == first and seg.read_next_offset() == 53
    assert read_offsets(seg, 40) == [50, 51, 52]
    assert seg.offset_index.entries == 0
    with open(seg.log_path, "rb") as f:
        assert f.read() == enc(50, 3)[0]


def test_truncate_to_base_empties_and_allows_reappend(tmp_path):  # REF §7 #16
    clock = Clock(1000)
    seg = segment(tmp_path, base=40, clock=clock,
                  config=cfg(index_interval_bytes=0, segment_index_bytes=8 * 3, segment_ms=100))
    for i in range(3):  # time index: 2 slots, full at 1 entry; offset index: 3 slots
        seg.append(*enc(40 + i, 1, ts=5000 + i if i < 2 else 5001))
    assert seg.offset_index.entries == 2 and seg.time_index.is_full()
    assert seg.should_roll(10, 5003, 43, 100, clock())
    clock.t = 9000
    assert seg.truncate_to(40) > 0
    assert seg.size == 0 and seg.read_next_offset() == 40
    assert seg.offset_index.entries == 0 and seg.time_index.entries == 0
    assert not seg.offset_index.is_full() and not seg.time_index.is_full()
    assert seg.created_ms == 9000 and seg.rolling_based_timestamp is None  # roll clock reset
    assert not seg.should_roll(10, -1, 41, 100, clock())
    for i in range(3):  # the same offsets can be appended again
        seg.append(*enc(40 + i, 1, ts=100 + i))
    assert read_offsets(seg, 40) == [40, 41, 42]
    assert seg.max_timestamp_so_far == 102
    assert seg.rolling_based_timestamp == 100


def test_truncated_reopened_empty_segment_does_not_roll(tmp_path):  # REF §7 #17
    clock = Clock(0)
    config = cfg(segment_ms=1000, segment_index_bytes=8 * 10)
    seg = segment(tmp_path, base=40, clock=clock, config=config)
    seg.close()  # trims both indexes to zero entries
    clock.t = 5000
    again = segment(tmp_path, base=40, clock=clock, config=config)
    again.truncate_to(40)
    clock.t = 50_000  # well past segment.ms
    assert not again.should_roll(1024, -1, 100, 1000, clock())
    # ... but a roll is still required when the next offset cannot be made relative
    assert again.should_roll(1024, -1, 40 + INT32_MAX + 1, 1000, clock())
    assert again.should_roll(1024, -1, 39, 1000, clock())
    again.close()


def test_truncate_at_end_of_reopened_segment_resizes_indexes(tmp_path):
    clock = Clock(0)
    config = cfg(index_interval_bytes=0, segment_ms=10**9)
    seg = segment(tmp_path, base=0, clock=clock, config=config)
    for i in range(5):
        seg.append(*enc(i, 1, ts=10 + i))
    seg.close()
    again = segment(tmp_path, base=0, clock=clock, config=config)
    assert again.offset_index.is_full()  # reopened at its trimmed length
    assert again.truncate_to(5) == 0  # nothing at or above 5
    assert not again.should_roll(100, 20, 6, 10**9, clock())


def test_truncation_recomputes_largest_timestamp_and_next_offset(tmp_path):  # REF §7 #18
    seg = segment(tmp_path, base=0, config=cfg(index_interval_bytes=1))
    stamps = [300, 100, 900, 200, 500]
    for i, ts in enumerate(stamps):
        seg.append(*enc(2 * i, 2, ts=[ts, ts - 50]))
    assert seg.max_timestamp_so_far == 900 and seg.offset_of_max_timestamp == 5
    seg.truncate_to(5)  # removes the batch [4, 5] holding 900 and all later ones
    assert seg.read_next_offset() == 4
    assert seg.max_timestamp_so_far == 300 and seg.offset_of_max_timestamp == 1
    assert seg.largest_timestamp == 300
    _, times = index_entries(seg)
    assert all(off < 4 for _, off in times)
    seg.truncate_to(3)
    assert seg.read_next_offset() == 2 and seg.max_timestamp_so_far == 300


def test_truncate_while_mapped_keeps_readers_safe(tmp_path):
    seg = segment(tmp_path, base=0)
    for i in range(10):
        seg.append(*enc(i, 1))
    buf, s, e = seg.read_range(0, 10**6)  # a reader holding the old mapping
    old = bytes(buf[s:e])
    seg.truncate_to(5)
    assert bytes(buf[s:e]) == old  # the old mapping still reads the old bytes
    assert read_offsets(seg, 0) == [0, 1, 2, 3, 4]
    assert os.path.getsize(seg.log_path) == seg.size
    seg.append(*enc(5, 1, values=[b"new"]))
    assert _core.decode_records(*seg.read_range(5, 100))[0].value == b"new"


# ---------------------------------------------------------------------------------------------
# roll conditions (REF §3.3)


def test_should_roll_by_size(tmp_path):
    seg = segment(tmp_path, config=cfg(segment_bytes=500))
    assert not seg.should_roll(500, 0, 0, 10**9, 0)  # empty segment, exactly fits
    seg.append(*enc(0, 1, values=[b"x" * 100]))
    room = 500 - seg.size
    assert not seg.should_roll(room, 1000, 1, 10**9, 0)
    assert seg.should_roll(room + 1, 1000, 1, 10**9, 0)


def test_should_roll_by_time_uses_first_batch_max_timestamp(tmp_path):
    clock = Clock(10**9)
    seg = segment(tmp_path, clock=clock, config=cfg(segment_ms=1000))
    assert not seg.should_roll(10, 10**7, 0, 1000, clock())  # empty: never by time
    seg.append(*enc(0, 2, ts=[5000, 5200]))  # roll base = max timestamp of the first batch
    seg.append(*enc(2, 1, ts=9999))
    assert seg.rolling_based_timestamp == 5200
    assert not seg.should_roll(10, 6200, 3, 1000, clock())  # waited == segment.ms: not yet
    assert seg.should_roll(10, 6201, 3, 1000, clock())
    clock.t += 10**6  # the wall clock does not matter when records have timestamps
    assert not seg.should_roll(10, 5300, 3, 1000, clock())


def test_should_roll_by_time_without_timestamps_uses_clock(tmp_path):
    clock = Clock(10_000)
    seg = segment(tmp_path, clock=clock, config=cfg(segment_ms=1000))
    seg.append(*enc(0, 1, ts=-1))
    clock.t = 11_000
    assert not seg.should_roll(10, -1, 1, 1000, clock())
    clock.t = 11_001
    assert seg.should_roll(10, -1, 1, 1000, clock())


def test_should_roll_with_jitter(tmp_path):
    jitters = set()
    for i in range(30):
        d = tmp_path / str(i)
        d.mkdir()
        seg = segment(d, config=cfg(segment_ms=1000, segment_jitter_ms=700))
        j = seg.roll_jitter_ms
        assert 0 <= j < 700
        jitters.add(j)
        seg.append(*enc(0, 1, ts=0))
        assert not seg.should_roll(10, 1000 - j, 1, 1000, 0)
        assert seg.should_roll(10, 1000 - j + 1, 1, 1000, 0)
        seg.close()
    assert len(jitters) > 1  # drawn per segment
    capped = segment(tmp_path / "0", base=99, config=cfg(segment_ms=10, segment_jitter_ms=10**6))
    assert 0 <= capped.roll_jitter_ms < 10  # min(segment.jitter.ms, segment.ms)
    no_jitter = segment(tmp_path / "1", base=99, config=cfg(segment_ms=10))
    assert no_jitter.roll_jitter_ms == 0


def test_should_roll_when_an_index_is_full(tmp_path):
    # 24 bytes: 3 offset entries; 2 time entries, full at 1 (one slot reserved)
    seg = segment(tmp_path, config=cfg(segment_index_bytes=24, index_interval_bytes=0))
    seg.append(*enc(0, 1, ts=1))
    assert not seg.should_roll(10, 1, 1, 10**9, 0)
    seg.append(*enc(1, 1, ts=2))
    assert seg.time_index.is_full() and not seg.offset_index.is_full()
    assert seg.should_roll(10, 2, 2, 10**9, 0)

    seg2 = segment(tmp_path, base=100, config=cfg(segment_index_bytes=8, index_interval_bytes=0))
    seg2.append(*enc(100, 1, ts=-1))
    seg2.append(*enc(101, 1, ts=-1))  # no timestamps: no time entry, one offset entry
    assert seg2.offset_index.is_full() and not seg2.time_index.is_full()
    assert seg2.should_roll(10, 5, 102, 10**9, 0)


def test_should_roll_on_relative_offset_overflow(tmp_path):
    seg = segment(tmp_path, base=1000)
    seg.append(*enc(1000))
    assert not seg.should_roll(10, 1000, 1000 + INT32_MAX, 10**9, 0)
    assert seg.should_roll(10, 1000, 1000 + INT32_MAX + 1, 10**9, 0)
    assert seg.should_roll(10, 1000, 999, 10**9, 0)


def test_on_become_inactive_writes_final_time_entry_and_trims(tmp_path):
    seg = segment(tmp_path, config=cfg(index_interval_bytes=10**6))
    seg.append(*enc(0, 2, ts=[10, 70]))
    seg.append(*enc(2, 2, ts=[90, 20]))
    seg.append(*enc(4, 1, ts=30))
    assert seg.time_index.entries == 0
    seg.on_become_inactive()
    assert os.path.getsize(seg.offset_index.path) == 0
    assert os.path.getsize(seg.time_index.path) == 12
    raw = np.fromfile(seg.time_index.path, dtype=[("ts", ">i8"), ("rel", ">i4")])
    assert raw.tolist() == [(90, 3)]  # max timestamp, last offset of its batch


# ---------------------------------------------------------------------------------------------
# files


def test_change_file_suffixes_renames_every_file(tmp_path):  # REF §7 #21
    seg = segment(tmp_path, base=7)
    seg.append(*enc(7, 3))
    paths = segment_paths(str(tmp_path), 7)
    before = sorted(os.listdir(tmp_path))
    assert before == sorted(os.path.basename(p) for k, p in paths.items() if k != ".txnindex")
    seg.change_file_suffixes("", ".deleted")
    assert sorted(os.listdir(tmp_path)) == [n + ".deleted" for n in before]  # no txnindex made
    assert seg.log_path.endswith(".log.deleted") and seg.suffix == ".deleted"
    assert read_offsets(seg, 7) == [7, 8, 9]  # still readable
    seg.change_file_suffixes(".deleted", "")
    assert sorted(os.listdir(tmp_path)) == before
    with pytest.raises(ValueError):
        seg.change_file_suffixes(".swap", "")
    seg.delete_files()
    assert os.listdir(tmp_path) == []


def test_preallocated_segment(tmp_path):  # REF §7 #24
    config = cfg(segment_bytes=1 << 20, preallocate=True)
    seg = segment(tmp_path, base=0, config=config, preallocate=True)
    assert os.path.getsize(seg.log_path) == 1 << 20 and seg.size == 0
    parts = [enc(0, 10, values=[b"a" * 100] * 10), enc(10, 5, codec=1)]
    for p in parts:
        seg.append(*p)
    expected_size = sum(len(p[0]) for p in parts)
    assert seg.size == expected_size and os.path.getsize(seg.log_path) == 1 << 20
    assert read_offsets(seg, 0) == list(range(15)) and seg.read_next_offset() == 15
    seg.close()
    assert os.path.getsize(seg.log_path) == expected_size  # trimmed on close
    again = segment(tmp_path, base=0, config=config, preallocate=True)
    assert again.size == expected_size and again.read_next_offset() == 15
    assert read_offsets(again, 3) == list(range(15))
    with open(again.log_path, "rb") as f:
        data = f.read()
    assert [v2_header(data, p)["base_offset"] for p, _ in batch_spans(data)] == [0, 10]
    again.close()


# ---------------------------------------------------------------------------------------------
# recovery (REF §4.3, §7 #22)


def _recovery_segment(tmp_path, n=30):
    seg = segment(tmp_path, base=0, config=cfg(index_interval_bytes=200))
    for i in range(n):
        seg.append(*enc(3 * i, 3, ts=[1000 + i, 2000 + i, 500], codec=i % 2))
    return seg


def test_recovery_repairs_garbage_indexes(tmp_path):  # REF §7 #22
    seg = _recovery_segment(tmp_path)
    want = index_entries(seg)
    for idx in (seg.offset_index, seg.time_index):
        idx._mm[: idx.entries * idx.entry_size] = os.urandom(idx.entries * idx.entry_size)
    assert recover_segment(seg, seg.config) == 0
    # Recovery also appends the final time-index entry (REF §4.3 step 4), as a roll does.
    want[1].append((seg.max_timestamp_so_far, seg.offset_of_max_timestamp))
    assert want[1][-1] == (2029, 89)
    assert index_entries(seg) == want
    assert read_offsets(seg, 45)[0] == 45


def test_recovery_after_random_corruption_keeps_batches_before(tmp_path):  # REF §7 #22
    rnd = random.Random(1)
    for trial in range(12):
        d = tmp_path / str(trial)
        d.mkdir()
        seg = _recovery_segment(d)
        seg.close()
        path = os.path.join(str(d), "%020d.log" % 0)
        data = bytearray(open(path, "rb").read())
        spans = batch_spans(data)
        k = rnd.randrange(len(spans))
        pos, size = spans[k]
        # anywhere in the batch but baseOffset / partitionLeaderEpoch (outside the CRC)
        off = rnd.choice([o for o in range(size) if not (o < 8 or 12 <= o < 16)])
        data[pos + off] ^= 0xFF
        open(path, "wb").write(data)
        again = segment(d, base=0, config=cfg(index_interval_bytes=200))
        recover_segment(again, again.config)
        assert again.size == pos, (trial, k, off)
        assert again.read_next_offset() == 3 * k
        assert os.path.getsize(path) == pos
        if k:
            assert read_offsets(again, 0) == list(range(3 * k))
        again.close()


def test_a_reader_opening_a_released_segment_during_a_rename_finds_its_file(tmp_path,
                                                                            monkeypatch):
    """Retention renames a segment's files .deleted while readers may reopen it (a sealed
    segment's files are released after its roll). A reopen between the rename and the
    segment's new path used to fail with FileNotFoundError (seen under load in
    test_retention's reader threads); it now waits for the rename and opens the new name."""
    seg = segment(tmp_path)
    data, batches = enc(0, 3)
    seg.append(data, batches)
    seg.release_files()
    renamed, go_on, reader_at_lock = threading.Event(), threading.Event(), threading.Event()

    class SignallingLock:
        """The segment's lock, telling when the reader thread reaches it."""
        def __init__(self, lock):
            self._inner = lock

        def __enter__(self):
            if threading.current_thread().name == "reader":
                reader_at_lock.set()
            self._inner.acquire()
            return self

        def __exit__(self, *exc):
            self._inner.release()

    seg._lock = SignallingLock(seg._lock)
    real_replace = os.replace

    def paused_replace(src, dst):
        real_replace(src, dst)
        if dst.endswith(".log.deleted"):
            renamed.set()
            assert go_on.wait(30)

    monkeypatch.setattr(os, "replace", paused_replace)
    renamer = threading.Thread(target=seg.change_file_suffixes, args=("", ".deleted"))
    renamer.start()
    assert renamed.wait(30)
    got = []
    reader = threading.Thread(target=lambda: got.append(bytes(seg.buffer(seg.size)[:len(data)])),
                              name="reader")
    reader.start()
    assert reader_at_lock.wait(30)
    go_on.set()
    renamer.join(30)
    reader.join(30)
    assert not renamer.is_alive() and not reader.is_alive()
    assert got == [data] and seg.log_path.endswith(".log.deleted")
