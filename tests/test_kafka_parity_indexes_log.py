"""Kafka test parity, REF §7 items 1-30 (indexes, offset map, segment, log/loader): the edge
cases of Kafka's own tests that the module tests (test_index.py, test_segment.py, test_log.py,
test_recovery_review.py, test_transactions.py, ...) did not check yet. Each test names the item
and the Kafka test it ports.

Expectations come from what the test wrote (Python lists, ``struct`` walks of the files,
conftest helpers), never from the code under test. Time is a fake clock.
"""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest

import segstore
from conftest import batch_spans, legacy_message, rec_tuple
from segstore import _core
from segstore.config import TopicConfig
from segstore.errors import InvalidArgumentError, InvalidOffsetError
from segstore.index import OffsetIndex, TimeIndex
from segstore.log import PartitionLog
from segstore.loader import recover_segment
from segstore.segment import LogSegment

INT32_MAX = 2**31 - 1
T0 = 1_700_000_000_000
OFFSET_DT = np.dtype([("rel", ">i4"), ("pos", ">i4")])


class Clock:
    """A fake millisecond clock."""

    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


def cfg(**kw):
    return TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})


def enc(base, n=1, ts=1000, values=None, codec=0):
    """One v2 batch at ``base``: (bytes, scanned batch rows)."""
    if values is None:
        values = [b"value-%d" % (base + i) for i in range(n)]
    data = _core.encode_batch(values, timestamps_ms=ts, base_offset=base, compression=codec)
    return data, _core.scan_batches(data).batches


def read_offsets(seg, start, max_bytes=10**9):
    rng = seg.read_range(start, max_bytes)
    if rng is None:
        return None
    return [r.offset for r in _core.decode_records(*rng)]


def open_log(path, clock=None, **kw):
    opts = {k: kw.pop(k) for k in ("recovery_point", "had_clean_shutdown") if k in kw}
    return PartitionLog(str(path), "t", 0, cfg(**kw), clock or Clock(), **opts)


def all_records(log):
    return list(log.iter_records())


def snapshot_offsets(directory):
    return sorted(int(n[:20]) for n in os.listdir(directory) if n.endswith(".snapshot"))


# ---------------------------------------------------------------------------------------------
# indexes


def test_read_only_reopen_keeps_an_entry_at_relative_offset_0_position_0(tmp_path):
    """#5, OffsetIndexTest.testReopen: entries (base, 0) and (base+1, 1) read back through a
    read-only index, although the first one is all zero bytes like preallocated padding."""
    path = str(tmp_path / "00000000000000000000.index")
    idx = OffsetIndex(path, 0, 8 * 100)
    idx.append(0, 0)
    idx.append(1, 1)
    idx.close()
    assert open(path, "rb").read() == struct.pack(">iiii", 0, 0, 1, 1)
    ro = OffsetIndex(path, 0, 100, writable=False)
    assert ro.entries == 2 and ro.last_offset == 1
    assert ro.lookup(0) == (0, 0) and ro.lookup(1) == (1, 1) and ro.lookup(50) == (1, 1)
    with pytest.raises(PermissionError):
        ro.append(53, 2)
    # the time index likewise: an entry of timestamp 0 at relative offset 0
    tpath = str(tmp_path / "00000000000000000000.timeindex")
    t = TimeIndex(tpath, 0, 12 * 10)
    t.maybe_append(0, 0)
    t.maybe_append(10, 1)
    t.close()
    tro = TimeIndex(tpath, 0, 12 * 10, writable=False)
    assert tro.entries == 2 and tro.lookup(5) == (0, 0) and tro.last_entry() == (10, 1)


# ---------------------------------------------------------------------------------------------
# segment


@pytest.mark.parametrize("base,offset", [(0, -2**31), (0, -1), (2**31, 0), (100, 10)])
def test_append_below_the_base_is_an_offset_overflow(tmp_path, base, offset):
    """#14, LogSegmentTest.testAppendForLogSegmentOffsetOverflowException's cases below the
    base ("0, -2147483648", "1, 0", "100, 10", "2147483648, 0"): a batch whose offsets lie
    below the segment base cannot be made relative. segstore's encoder refuses negative
    offsets, so the base offset (outside the CRC) is patched in the bytes as a broker's
    follower path could receive it."""
    data = bytearray(_core.encode_batch([b"x"], base_offset=0))
    data[0:8] = struct.pack(">q", offset)
    seg = LogSegment(str(tmp_path), base, cfg(), Clock())
    with pytest.raises(InvalidOffsetError):
        seg.append(bytes(data), _core.scan_batches(bytes(data)).batches)
    assert seg.size == 0 and os.path.getsize(seg.log_path) == 0


def test_segment_append_truncate_loop_rereads_the_first_of_two(tmp_path):
    """#16, LogSegmentTest.testTruncate: 30 rounds of appending offsets o and o+1, truncating
    to o+1 and reading back exactly the batch at o; the next round appends o+1 again."""
    seg = LogSegment(str(tmp_path), 40, cfg(index_interval_bytes=10), Clock())
    offset = 40
    for _ in range(30):
        first, second = enc(offset, values=[b"hello"]), enc(offset + 1, values=[b"hello"])
        seg.append(*first)
        seg.append(*second)
        assert read_offsets(seg, offset) == [offset, offset + 1]
        seg.truncate_to(offset + 1)
        buf, s, e = seg.read_range(offset, 10_000)
        assert bytes(buf[s:e]) == first[0]  # exactly the first batch, byte for byte
        assert seg.read_next_offset() == offset + 1
        offset += 1
    with open(seg.log_path, "rb") as f:
        assert f.read() == b"".join(enc(o, values=[b"hello"])[0] for o in range(40, 70))


def test_segment_truncate_below_base_empties_it_and_resets_the_roll_clock(tmp_path):
    """#16, LogSegmentTest.testTruncateFull: truncateTo(0) on a segment based at 40 empties
    it, restarts the time waited for a roll, frees both indexes and takes offset 40 again."""
    clock = Clock(0)
    config = cfg(index_interval_bytes=0, segment_index_bytes=8 * 2, segment_ms=1000)
    seg = LogSegment(str(tmp_path), 40, config, clock)
    seg.append(*enc(40, 2, ts=10))
    seg.append(*enc(42, 1, ts=20))
    seg.append(*enc(43, 1, ts=30))
    assert seg.offset_index.is_full() and seg.time_index.is_full()
    clock.t = 500
    seg.truncate_to(0)
    assert seg.size == 0 and seg.read_range(0, 1024) is None
    assert not seg.offset_index.is_full() and not seg.time_index.is_full()
    seg.append(*enc(40, 2, ts=-1))  # the same offsets again
    assert read_offsets(seg, 0) == [40, 41]
    # waited since the truncation, not since the creation: 999 ms is not past segment.ms
    clock.t = 1499
    assert not seg.should_roll(10, -1, 42, 1000, clock())
    clock.t = 1501
    assert seg.should_roll(10, -1, 42, 1000, clock())


def test_truncating_a_reopened_empty_segment_restarts_its_roll_clock(tmp_path):
    """#17, LogSegmentTest.testTruncateEmptySegment: a follower truncates a reopened, empty
    segment (to 57, past its end): its indexes get room again and the time waited for a roll
    restarts at the truncation (Kafka resets the create time whenever the log is empty after a
    truncateTo), so the first batch without timestamps appended later rolls by that time."""
    clock = Clock(0)
    config = cfg(segment_ms=300_000, segment_index_bytes=8 * 10)
    LogSegment(str(tmp_path), 0, config, clock).close()
    reopened = LogSegment(str(tmp_path), 0, config, clock)
    assert os.path.getsize(reopened.offset_index.path) == 0
    assert os.path.getsize(reopened.time_index.path) == 0
    clock.t = 500
    assert reopened.truncate_to(57) == 0
    assert not reopened.offset_index.is_full() and not reopened.time_index.is_full()
    assert reopened.created_ms == 500  # time waited for roll: 0
    assert not reopened.should_roll(1024, -1, 100, 300_000, clock())
    clock.t = 500 + 300_001  # past segment.ms, but an empty segment never rolls by time
    assert not reopened.should_roll(1024, -1, 100, 300_000, clock())
    assert reopened.should_roll(1024, -1, INT32_MAX + 200, 300_000, clock())
    reopened.append(*enc(0, ts=-1))
    # rolls by the time waited since the truncation (500), not since the reopen (0)
    assert not reopened.should_roll(10, -1, 1, 300_000, 500 + 300_000)
    assert reopened.should_roll(10, -1, 1, 300_000, 500 + 300_001)
    reopened.close()


def test_change_file_suffixes_does_not_create_index_files_never_opened(tmp_path):
    """#21, LogSegmentTest.testChangeFileSuffixes: renaming a segment whose indexes were never
    opened does not create them; they appear, under the new suffix, when first used.

    (segstore deliberately creates a *new* segment's index files at once, since a new segment
    is about to be appended to; laziness applies to segments opened from disk.)"""
    LogSegment(str(tmp_path), 40, cfg(), Clock()).close()
    for n in ("%020d.index" % 40, "%020d.timeindex" % 40):
        os.unlink(tmp_path / n)  # e.g. a segment from a dump that shipped only .log files
    seg = LogSegment(str(tmp_path), 40, cfg(), Clock())
    seg.change_file_suffixes("", ".deleted")
    assert sorted(os.listdir(tmp_path)) == ["%020d.log.deleted" % 40]
    assert seg.log_path.endswith("%020d.log.deleted" % 40)
    assert seg.offset_index.path.endswith("%020d.index.deleted" % 40)
    assert seg.time_index.path.endswith("%020d.timeindex.deleted" % 40)
    assert sorted(os.listdir(tmp_path)) == [
        "%020d.index.deleted" % 40, "%020d.log.deleted" % 40, "%020d.timeindex.deleted" % 40]


def test_recovery_after_nonsense_written_from_inside_a_batch_to_the_end(tmp_path):
    """#22, LogSegmentTest.testRecoveryWithCorruptMessage: random bytes from 0-14 bytes into
    a random batch (so also over its offset and length fields) to the end of the file; recovery
    keeps exactly the batches before it."""
    rnd = random.Random(22)
    for trial in range(10):
        d = tmp_path / str(trial)
        d.mkdir()
        seg = LogSegment(str(d), 0, cfg(index_interval_bytes=10), Clock())
        for i in range(20):
            seg.append(*enc(i, values=[str(i).encode()], ts=-1))
        seg.close()
        path = d / ("%020d.log" % 0)
        data = bytearray(path.read_bytes())
        spans = batch_spans(data)
        k = rnd.randrange(20)
        pos = spans[k][0] + rnd.randrange(15)
        data[pos:] = bytes(rnd.getrandbits(8) for _ in range(len(data) - pos))
        path.write_bytes(bytes(data))
        again = LogSegment(str(d), 0, cfg(index_interval_bytes=10), Clock())
        recover_segment(again, again.config)
        assert [int(o) for o in again.scan(0).batches["last_offset"]] == list(range(k)), trial
        assert again.size == spans[k][0] == os.path.getsize(path)
        again.close()


def test_split_copies_batches_up_to_the_first_whose_offset_overflows(tmp_path):
    """#25, LogSegmentTest.testAppendFromFile: a legacy file holding offsets 0, 500 (a message
    over 1 MiB, Kafka's copy chunk) and 2^31 - 1 + 6 is split on load into a segment of the first
    two batches, byte for byte, and one of the last."""
    d = tmp_path / "t-0"
    d.mkdir()
    batches = [legacy_message(1, 0, None, bytes(1024), timestamp=T0),
               legacy_message(1, 500, None, bytes(1024 * 1024 + 1), timestamp=T0),
               legacy_message(1, INT32_MAX + 5, None, bytes(1024), timestamp=T0)]
    (d / ("%020d.log" % 0)).write_bytes(b"".join(batches))
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [seg.base_offset for seg in lg.segments] == [0, INT32_MAX + 5]
        assert [r.offset for r in lg.iter_records()] == [0, 500, INT32_MAX + 5]
        assert lg.verify() == []
    assert (d / ("%020d.log" % 0)).read_bytes() == batches[0] + batches[1]
    assert (d / ("%020d.log" % (INT32_MAX + 5))).read_bytes() == batches[2]


# ---------------------------------------------------------------------------------------------
# log / loader


def test_corrupt_log_garbage_on_active_log_and_index_recovers_records(tmp_path):
    """#26, UnifiedLogTest/LogLoaderTest.testCorruptLog: 10 rounds of 50-99 appends
    (segment.bytes 1000, index.interval.bytes 1), then 1-1024 random bytes appended to the
    active .log and .index; an unclean reopen from recovery point 50 gives back every record
    (key, value, timestamp) and the log end offset."""
    rnd = random.Random(26)
    for trial in range(10):
        d = tmp_path / f"t-{trial}"
        log = open_log(d, segment_bytes=1000, index_interval_bytes=1)
        n = 50 + rnd.randrange(50)
        for i in range(n):
            log.append(b"value-%d" % rnd.getrandbits(32), key=b"key-%d" % i,
                       timestamp_ms=T0 + rnd.randrange(10**6))
        expected = [rec_tuple(r) for r in all_records(log)]
        active = log.active_segment.base_offset
        log.close()
        for suffix in (".log", ".index"):
            with open(d / ("%020d%s" % (active, suffix)), "ab") as f:
                f.write(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 1024))))
        again = open_log(d, segment_bytes=1000, index_interval_bytes=1,
                         had_clean_shutdown=False, recovery_point=50)
        assert again.log_end_offset == n, trial
        assert [rec_tuple(r) for r in all_records(again)] == expected, trial
        assert again.verify() == []
        again.close()


def test_offset_gap_rolls_with_compressed_batches_and_index_files_stay_above_base(tmp_path):
    """#27, UnifiedLogTest.testOverCompactedLogRecoveryMultiRecord: gzip batches whose offsets
    jump by more than 2^31 - 1 roll at max(next offset, log end); after the close every .index
    file, read with struct, has entries >= its base only, and a recovering reopen agrees.

    (segstore assigns offsets itself, so the gap is inside a batch: offset deltas, not a
    follower's batch at a far offset.)"""
    d = tmp_path / "t-0"
    log = open_log(d, segment_bytes=1000, index_interval_bytes=1)
    log.append_batch([b"v1"], keys=[b"k1"], timestamps_ms=T0)
    gap = _core.encode_batch([b"v3", b"v4"], [b"k3", b"k4"], timestamps_ms=T0, compression=1,
                             offset_deltas=[0, INT32_MAX])
    log.append_records(gap)  # offsets 1 and 2^31: 2^31 cannot be relative to base 0
    assert [s.base_offset for s in log.segments] == [0, 1]
    for i in range(2):  # 2^31 + 1 is too far from base 1: a roll at max(2^31 + 1, LEO)
        log.append_records(_core.encode_batch([b"v%d" % (5 + 2 * i), b"v%d" % (6 + 2 * i)],
                                              timestamps_ms=T0, compression=1))
    assert [s.base_offset for s in log.segments] == [0, 1, INT32_MAX + 2]
    expected = [(r.offset, r.key, r.value) for r in all_records(log)]
    assert [o for o, _, _ in expected] == [0, 1, INT32_MAX + 1] + [INT32_MAX + 2 + i
                                                                  for i in range(4)]
    log.close()
    index_files = sorted(n for n in os.listdir(d) if n.endswith(".index"))
    assert index_files == ["%020d.index" % b for b in (0, 1, INT32_MAX + 2)]
    for name in index_files:
        raw = np.fromfile(d / name, dtype=OFFSET_DT)
        assert (raw["rel"] >= 0).all() and (raw["rel"] <= INT32_MAX).all(), name
    again = open_log(d, segment_bytes=1000, index_interval_bytes=1, had_clean_shutdown=False,
                     recovery_point=0)
    assert [(r.offset, r.key, r.value) for r in all_records(again)] == expected
    assert again.verify() == []


BIG = 2**31 + 5


def _legacy_overflow_dir(root):
    """Segment 0 with offsets 0, 1 and BIG (v0, so it must be split in two), then BIG + 1."""
    d = os.path.join(str(root), "t-0")
    os.makedirs(d)
    with open(os.path.join(d, "%020d.log" % 0), "wb") as f:
        f.write(legacy_message(0, 0, b"a", b"1") + legacy_message(0, 1, b"b", b"2")
                + legacy_message(0, BIG, b"c", b"3"))
    with open(os.path.join(d, "%020d.log" % (BIG + 1)), "wb") as f:
        f.write(legacy_message(0, BIG + 1, b"d", b"4"))
    return d


def _open_crashing_at(root, crash_at, how):
    """Open the store with the ``crash_at`` rename failing the second time it is made: an
    OSError (``how="error"``, the split's own clean-up runs) or the process dying there
    (``how="kill"``, in a forked child: nothing runs after it)."""
    real = LogSegment.change_file_suffixes
    seen = []

    def crashing(self, old, new):
        if (old, new) == crash_at:
            seen.append(self.base_offset)
            if len(seen) == 2:
                if how == "kill":
                    os._exit(0)
                raise OSError("crash")
        return real(self, old, new)

    if how == "error":
        LogSegment.change_file_suffixes = crashing
        try:
            with pytest.raises(OSError, match="crash"):
                segstore.open(str(root))
        finally:
            LogSegment.change_file_suffixes = real
        return
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only at the crash point
        code = 3
        try:
            LogSegment.change_file_suffixes = crashing
            segstore.open(str(root))
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@pytest.mark.parametrize("how", ["error", "kill"])
@pytest.mark.parametrize("crash_at", [(".cleaned", ".swap"), (".swap", "")],
                         ids=["some-swap", "partly-renamed"])
def test_crash_at_the_second_rename_of_a_split_recovers_every_key(tmp_path, crash_at, how):
    """#28, LogLoaderTest.testRecoveryAfterCrashDuringSplitPhase2/5: the split makes two
    segments; a crash (an I/O error, or the process dying) at the *second* .cleaned -> .swap
    rename (one .swap, one .cleaned) or at the second .swap -> log rename (one renamed, one
    still .swap) recovers to the same keys, with no leftover temporary file."""
    _legacy_overflow_dir(tmp_path)
    _open_crashing_at(tmp_path, crash_at, how)
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [(r.offset, r.key, r.value) for r in lg.iter_records()] == [
            (0, b"a", b"1"), (1, b"b", b"2"), (BIG, b"c", b"3"), (BIG + 1, b"d", b"4")]
        assert [seg.base_offset for seg in lg.segments] == [0, BIG, BIG + 1]
        assert lg.verify() == []
    left = os.listdir(os.path.join(str(tmp_path), "t-0"))
    assert not [n for n in left if n.endswith((".cleaned", ".swap", ".deleted"))]


def test_a_split_segment_is_not_split_again(tmp_path):
    """#28, LocalLog.splitOverflowedSegment's require(segment.hasOverflow): after the split,
    reopening leaves the files alone, and asking to split a segment without overflow is an
    InvalidArgumentError that changes nothing."""
    from segstore.segment_split import split_overflowed_segment
    d = _legacy_overflow_dir(tmp_path)
    with segstore.open(str(tmp_path)):
        pass
    files = {n: os.stat(os.path.join(d, n)).st_ino for n in os.listdir(d) if ".log" in n}
    assert sorted(files) == ["%020d.log" % b for b in (0, BIG, BIG + 1)]
    with segstore.open(str(tmp_path)) as s:
        assert [seg.base_offset for seg in s.partition("t", 0).segments] == [0, BIG, BIG + 1]
    assert {n: os.stat(os.path.join(d, n)).st_ino for n in os.listdir(d) if ".log" in n} == files
    seg = LogSegment(d, 0, cfg(), Clock())
    before = sorted(os.listdir(d))
    with pytest.raises(InvalidArgumentError):
        split_overflowed_segment(seg, cfg(), Clock())
    assert sorted(os.listdir(d)) == before
    assert read_offsets(seg, 0) == [0, 1]
    seg.close()


def test_clean_shutdown_without_snapshots_writes_empty_ones_and_truncation_uses_them(tmp_path):
    """#30, LogLoaderTest.testSkipTruncateAndReloadIfNewMessageFormatAndCleanShutdown and
    UnifiedLog.rebuildProducerState: a clean shutdown that left no snapshot loads no producer
    state and, instead of scanning, writes empty snapshots at the last two segment bases and
    the log end, so that a truncation into the last segment reloads from them rather than
    replaying the whole log."""
    d = tmp_path / "t-0"
    log = open_log(d, segment_bytes=400)
    for i in range(30):
        log.append_batch([b"x" * 20], producer_id=7, producer_epoch=0, base_sequence=i)
    bases = [s.base_offset for s in log.segments]
    leo = log.log_end_offset
    assert len(bases) >= 3 and bases[-1] < leo
    log.close()
    for n in os.listdir(d):
        if n.endswith(".snapshot"):
            os.unlink(d / n)
    again = open_log(d, segment_bytes=400)
    assert again.active_producers() == {}
    assert snapshot_offsets(d) == [bases[-2], bases[-1], leo]
    for o in snapshot_offsets(d):  # empty: version 1, CRC, count 0
        raw = (d / ("%020d.snapshot" % o)).read_bytes()
        assert len(raw) == 10 and struct.unpack_from(">h", raw)[0] == 1
        assert struct.unpack_from(">i", raw, 6)[0] == 0
    again.truncate_to(bases[-1])
    # reloaded from the empty snapshot at the new end: still no producer, no replay of the log
    assert again.active_producers() == {}
    assert snapshot_offsets(d) == [bases[-2], bases[-1]]
