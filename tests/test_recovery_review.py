"""Review of log loading/recovery (REF §4), retention (REF §5), log start offset, truncation and
checkpoints against Kafka's rules.

The tests marked FINDING fail on the reviewed code: each pins what REF says Kafka does where
segstore does something else. The others pin behaviour that was probed and found to match.
Expectations are derived from REF, not from segstore; files are damaged or written with
``struct``/``zlib`` alone.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib

import pytest

import segstore
from segstore.checkpoint import OffsetCheckpointFile
from segstore.errors import SegstoreError

CLEAN = ".kafka_cleanshutdown"
RP = "recovery-point-offset-checkpoint"
LSO = "log-start-offset-checkpoint"


class Clock:
    def __init__(self, t=1_700_000_000_000):
        self.t = t

    def __call__(self):
        return self.t


def _open(root, clock=None, **cfg):
    s = segstore.open(str(root), clock=clock)
    if "t" not in s.list_topics():
        s.create_topic("t", config=cfg)
    return s


def _seg(root, base, suffix=".log"):
    return os.path.join(str(root), "t-0", f"{base:020d}{suffix}")


def _batch_spans(buf):
    spans, pos = [], 0
    while len(buf) - pos >= 17:
        size = 12 + struct.unpack_from(">i", buf, pos + 8)[0]
        if pos + size > len(buf):
            break
        spans.append((pos, size))
        pos += size
    return spans


def _time_entries(path):
    b = open(path, "rb").read()
    return [struct.unpack_from(">qi", b, i) for i in range(0, len(b), 12)]


def _v0(offset, key, value):
    """A legacy magic-0 log entry (REF §1.10): offset, size, crc32(magic..end), magic, attr,
    key, value."""
    body = (struct.pack(">bb", 0, 0) + struct.pack(">i", len(key)) + key
            + struct.pack(">i", len(value)) + value)
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


# ---------------------------------------------------------------------------------------------
# FINDING 1 (data loss): a legacy segment whose offsets overflow the 32-bit relative range is
# truncated instead of split (REF §4.2 step 6, §4.4, §7 #28, KAFKA-6264).

BIG = 2 ** 31 + 5  # relative to base 0 this does not fit an int32


def _legacy_overflow_dir(root, second_segment):
    os.makedirs(os.path.join(str(root), "t-0"))
    with open(_seg(root, 0), "wb") as f:
        f.write(_v0(0, b"a", b"1") + _v0(1, b"b", b"2") + _v0(BIG, b"c", b"3"))
    if second_segment:
        with open(_seg(root, BIG + 1), "wb") as f:
            f.write(_v0(BIG + 1, b"d", b"4"))


@pytest.mark.parametrize("clean", [True, False], ids=["clean-marker", "unclean"])
def test_legacy_overflowed_last_segment_is_split_not_truncated(tmp_path, clean):
    """Kafka splits the segment on load (LogSegmentOffsetOverflowException -> splitOverflowedSegment)
    and keeps every message; segstore's loader cuts the log file at the overflowing message,
    even after a clean shutdown (loader.py _header_problem -> recover_segment)."""
    _legacy_overflow_dir(tmp_path, second_segment=False)
    if clean:
        open(os.path.join(str(tmp_path), CLEAN), "w").close()
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [(r.offset, r.value) for r in lg.iter_records()] == [
            (0, b"1"), (1, b"2"), (BIG, b"3")]
        assert lg.log_end_offset == BIG + 1


def test_legacy_overflowed_segment_unclean_keeps_later_segments(tmp_path):
    """Unclean open: Kafka splits segment 0 and keeps segment BIG+1; segstore truncates segment 0,
    counts that as lost bytes and deletes every later segment (2 of 4 messages gone)."""
    _legacy_overflow_dir(tmp_path, second_segment=True)
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [r.offset for r in lg.iter_records()] == [0, 1, BIG, BIG + 1]


def test_legacy_overflowed_sealed_segment_is_served_or_reported(tmp_path):
    """Clean open with a later segment: nothing is recovered, reads silently skip offset BIG
    and verify() reports no problem. Kafka would have split the segment at load."""
    _legacy_overflow_dir(tmp_path, second_segment=True)
    open(os.path.join(str(tmp_path), CLEAN), "w").close()
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        served = [r.offset for r in lg.iter_records()]
        assert served == [0, 1, BIG, BIG + 1] or lg.verify() != []


@pytest.mark.parametrize("clean", [True, False], ids=["clean-marker", "unclean"])
def test_legacy_overflow_with_offsets_going_back_is_recovered_not_split(tmp_path, clean):
    """Found by the crash fuzz test (13th session): a file whose first (legacy) batch overflows
    and whose next batch lies at a lower offset made the split build a segment based at the
    first offset holding the lower one, and the open failed (InvalidOffsetError from its time
    index). Offsets that go back are damage: the file is not split, and the open keeps what
    recovery can."""
    os.makedirs(os.path.join(str(tmp_path), "t-0"))
    # hypothesis's example: a v0 message at offset 2^56, then a batch at a lower offset whose
    # timestamp gives the split segment a time index entry below its base
    fuzz = bytes.fromhex(
        "01000000000000000000000f4e3924150000000000016b00000000000000000000000100000038ff"
        "ffffff0234bb927300000000000000000000000000000000000000000000ffffffffffffffffffff"
        "ffffffff000000010c000000010100")
    with open(_seg(tmp_path, 0), "wb") as f:
        f.write(fuzz)
    if clean:
        open(os.path.join(str(tmp_path), CLEAN), "w").close()
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        offsets = [r.offset for r in lg.iter_records()]
        assert offsets == sorted(offsets) and lg.log_end_offset >= len(offsets)
        assert not [n for n in os.listdir(os.path.join(str(tmp_path), "t-0"))
                    if n.endswith((".cleaned", ".swap"))]


# ---------------------------------------------------------------------------------------------
# FINDING 2 (diverges): after a clean reopen the roll-by-time clock restarts at open time
# instead of the first batch's max timestamp (REF §3.3 rule 2; Kafka's loadFirstBatchTimestamp).

def test_time_roll_after_clean_reopen_uses_first_batch_timestamp(tmp_path):
    clock = Clock(1_000_000)
    with _open(tmp_path, clock, **{"segment.ms": 1000}) as s:
        lg = s.partition("t", 0)
        lg.append(b"a", timestamp_ms=1_000_000)
        lg.append(b"b", timestamp_ms=1_000_500)
        assert len(lg.segments) == 1
    clock.t = 1_000_600
    with _open(tmp_path, clock) as s:
        lg = s.partition("t", 0)
        # incoming max timestamp - rollBase (first batch max ts) = 2000 > segment.ms = 1000
        lg.append(b"c", timestamp_ms=1_002_000)
        assert [seg.base_offset for seg in lg.segments] == [0, 2]


def test_time_roll_after_unclean_reopen_uses_first_batch_timestamp(tmp_path):
    """Pinned (matches): the recovery path rebuilds the state and rolls as Kafka does."""
    clock = Clock(1_000_000)
    with _open(tmp_path, clock, **{"segment.ms": 1000}) as s:
        lg = s.partition("t", 0)
        lg.append(b"a", timestamp_ms=1_000_000)
        lg.append(b"b", timestamp_ms=1_000_500)
    os.unlink(os.path.join(str(tmp_path), CLEAN))
    clock.t = 1_000_600
    with _open(tmp_path, clock) as s:
        lg = s.partition("t", 0)
        lg.append(b"c", timestamp_ms=1_002_000)
        assert [seg.base_offset for seg in lg.segments] == [0, 2]


# ---------------------------------------------------------------------------------------------
# FINDING 3 (untyped error, store cannot open): a checkpoint that is not UTF-8 is not treated as
# a read error (REF §4.1: "a read error resets to empty").

@pytest.mark.parametrize("name", [RP, LSO])
def test_non_utf8_checkpoint_is_ignored_like_any_read_error(tmp_path, name):
    with _open(tmp_path) as s:
        for i in range(5):
            s.partition("t", 0).append(b"v%d" % i)
    with open(os.path.join(str(tmp_path), name), "wb") as f:
        f.write(b"\xff\xfe\x00garbage\x80\n")
    with segstore.open(str(tmp_path)) as s:  # UnicodeDecodeError today
        lg = s.partition("t", 0)
        assert (lg.log_start_offset, lg.log_end_offset) == (0, 5)


# ---------------------------------------------------------------------------------------------
# FINDING 4 (cosmetic): the checkpoint reader accepts lines Kafka's CheckpointFile rejects
# (REF §4.5: entries split on runs of whitespace must have exactly 3 fields; a blank line or a
# leading blank gives 1 or 4 fields; Integer.parseInt does not accept " 0").

@pytest.mark.parametrize("text", ["0\n1\n\nt 0 3\n", "0\n1\n t 0 3\n", " 0\n1\nt 0 3\n"],
                         ids=["blank-line", "leading-space", "padded-version"])
def test_checkpoint_lines_kafka_rejects_are_malformed(tmp_path, text):
    p = os.path.join(str(tmp_path), "cp")
    with open(p, "w") as f:
        f.write(text)
    with pytest.raises(SegstoreError):
        OffsetCheckpointFile(p).read()


@pytest.mark.parametrize("text,expected", [
    ("", {}), ("0\n0\n", {}), ("0\n1\nt 0 3 \n", {("t", 0): 3}), ("0\n1\nt\t0\t3\n", {("t", 0): 3})])
def test_checkpoint_lines_kafka_accepts(tmp_path, text, expected):
    """Pinned (matches): empty file, zero entries, trailing blank and tabs are accepted."""
    p = os.path.join(str(tmp_path), "cp")
    with open(p, "w") as f:
        f.write(text)
    assert {tuple(k): v for k, v in OffsetCheckpointFile(p).read().items()} == expected


@pytest.mark.parametrize("text", ["1\n0\n", "0\n2\nt 0 3\n", "0\n1\nt 0\n", "0\n1\nt 0 x\n"])
def test_checkpoint_malformed_is_ignored_by_the_store(tmp_path, text):
    """Pinned (matches): a malformed log-start checkpoint is a read error -> ignored, so the log
    start offset falls back to the first segment's base."""
    with _open(tmp_path) as s:
        lg = s.partition("t", 0)
        for i in range(5):
            lg.append(b"v")
        lg.delete_records(3)
    with open(os.path.join(str(tmp_path), LSO), "w") as f:
        f.write(text)
    with segstore.open(str(tmp_path)) as s:
        assert s.partition("t", 0).log_start_offset == 0


# ---------------------------------------------------------------------------------------------
# FINDING 5 (kept as a deliberate difference): Kafka's ListOffsets by timestamp searches only the
# first segment whose largest timestamp is >= the target (REF §3.7); segstore goes on to later
# segments when that segment's matching records all lie below the log start offset.

def test_offset_for_time_goes_past_a_segment_whose_matches_were_deleted(tmp_path):
    """A deliberate difference (docs/concepts.md): Kafka answers "none" here, since segment 0
    is the first whose largest timestamp reaches 400 and its only match (offset 1) lies below
    the log start offset; segstore returns the first later match, offset 4."""
    with _open(tmp_path) as s:
        lg = s.partition("t", 0)
        for ts in (100, 500, 200, 300):
            lg.append(b"v", timestamp_ms=ts)
        lg.roll()
        lg.append(b"w", timestamp_ms=600)
        lg.delete_records(2)  # the ts=500 record (offset 1) is now below the log start offset
        got = lg.offset_for_time(400)
        assert (got.offset, got.timestamp) == (4, 600)
        assert (lg.offset_for_time(150).offset, lg.offset_for_time(150).timestamp) == (2, 200)
        assert lg.offset_for_time(601) is None


# ---------------------------------------------------------------------------------------------
# FINDING 6 (cosmetic): with preallocate=true the first segment of a partition (and the empty
# segment the loader creates at the log start offset) is not preallocated (REF §2.7).

def test_first_segment_is_preallocated(tmp_path):
    with _open(tmp_path, **{"preallocate": True, "segment.bytes": 1 << 20}) as s:
        s.partition("t", 0)
        assert os.path.getsize(_seg(tmp_path, 0)) == 1 << 20


# ---------------------------------------------------------------------------------------------
# FINDING 7 (untyped error): a stray non-numeric ``*.log`` file in a partition directory makes
# opening the store raise a bare ValueError (loader.py _base_offset).

@pytest.mark.parametrize("name", ["foo.log", "foo.log.swap"])
def test_non_numeric_log_file_is_a_typed_error_or_ignored(tmp_path, name):
    with _open(tmp_path) as s:
        s.partition("t", 0).append(b"v")
    open(os.path.join(str(tmp_path), "t-0", name), "w").close()
    try:
        with segstore.open(str(tmp_path)) as s:
            assert s.partition("t", 0).log_end_offset == 1
    except SegstoreError:
        pass


# ---------------------------------------------------------------------------------------------
# Pinned behaviour that matches REF.

def test_time_index_entries_follow_max_timestamp_rules_on_roll_and_recovery(tmp_path):
    """REF §2.4/§2.6/§4.3: first batch never indexed; entry = (max ts so far, last offset of the
    *first* batch reaching it); equal/smaller timestamps skipped; final entry on roll only if
    larger. Recovery rebuilds the same entries."""
    with _open(tmp_path, **{"index.interval.bytes": 0}) as s:
        lg = s.partition("t", 0)
        for ts in (100, 300, 300, 200, 50):
            lg.append(b"v", timestamp_ms=ts)
        lg.roll()
        lg.append(b"w", timestamp_ms=10)
    assert _time_entries(_seg(tmp_path, 0, ".timeindex")) == [(300, 1)]
    assert _time_entries(_seg(tmp_path, 5, ".timeindex")) == [(10, 0)]
    os.unlink(os.path.join(str(tmp_path), CLEAN))
    with open(os.path.join(str(tmp_path), RP), "w") as f:
        f.write("0\n1\nt 0 0\n")
    with segstore.open(str(tmp_path)) as s:
        assert s.partition("t", 0).load_result.recovered_segments == 2
    assert _time_entries(_seg(tmp_path, 0, ".timeindex")) == [(300, 1)]
    assert _time_entries(_seg(tmp_path, 5, ".timeindex")) == [(10, 0)]


def test_log_start_checkpoint_beyond_log_end_deletes_every_segment(tmp_path):
    """REF §4.2 step 8: LEO < logStartOffsetCheckpoint -> delete all, empty segment there."""
    with _open(tmp_path, **{"segment.bytes": 200}) as s:
        lg = s.partition("t", 0)
        for i in range(10):
            lg.append(b"x%d" % i, timestamp_ms=1000 + i)
        assert len(lg.segments) > 1
    with open(os.path.join(str(tmp_path), LSO), "w") as f:
        f.write("0\n1\nt 0 25\n")
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert (lg.log_start_offset, lg.log_end_offset) == (25, 25)
        assert [seg.base_offset for seg in lg.segments] == [25]
        assert lg.append(b"y").offset == 25
    assert sorted(n for n in os.listdir(os.path.join(str(tmp_path), "t-0")) if n.endswith(".log")) \
        == [f"{25:020d}.log"]


def test_unclean_recovery_starts_at_the_segment_holding_the_recovery_point(tmp_path):
    """REF §4.2 step 7: segments overlapping [recoveryPoint, inf) are recovered, i.e. from the
    floor segment of the recovery point, so damage *below* the recovery point but inside that
    segment is cut, later segments deleted; damage in an earlier segment is left alone."""
    with _open(tmp_path, **{"segment.bytes": 10 * 71}) as s:
        lg = s.partition("t", 0)
        for i in range(30):
            lg.append(b"%03d" % i, timestamp_ms=1000 + i)
        assert [seg.base_offset for seg in lg.segments] == [0, 10, 20]
    os.unlink(os.path.join(str(tmp_path), CLEAN))
    with open(os.path.join(str(tmp_path), RP), "w") as f:
        f.write("0\n1\nt 0 15\n")
    for base, n in ((0, 3), (10, 1)):  # flip a payload byte of offsets 3 and 11
        p = _seg(tmp_path, base)
        buf = bytearray(open(p, "rb").read())
        pos, size = _batch_spans(buf)[n]
        buf[pos + size - 2] ^= 0xFF
        open(p, "wb").write(bytes(buf))
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [seg.base_offset for seg in lg.segments] == [0, 10]
        assert lg.log_end_offset == 11
        assert lg.recovery_point == 11
        assert os.path.getsize(_seg(tmp_path, 0)) == 10 * 71  # below: not recovered


def test_temp_file_pass_on_open(tmp_path):
    """REF §2.2/§4.2 phase 1: .deleted and .cleaned go (not *.checkpoint.deleted), orphan
    indexes go, a lone .swap whose replaced segment is gone is completed."""
    with _open(tmp_path, **{"segment.bytes": 10 * 71}) as s:
        lg = s.partition("t", 0)
        for i in range(20):
            lg.append(b"%03d" % i, timestamp_ms=1000 + i)
    d = os.path.join(str(tmp_path), "t-0")
    shutil.copy(_seg(tmp_path, 10), _seg(tmp_path, 30, ".log.cleaned"))  # above the swap
    shutil.copy(_seg(tmp_path, 0), _seg(tmp_path, 0, ".log.deleted"))
    open(os.path.join(d, "00000000000000000005-0000000001.checkpoint.deleted"), "w").close()
    open(_seg(tmp_path, 99, ".index"), "wb").close()
    # segment 10 was replaced by an identical .swap whose old files were already renamed away
    os.rename(_seg(tmp_path, 10), _seg(tmp_path, 10, ".log.swap"))
    for suf in (".index", ".timeindex"):
        os.unlink(_seg(tmp_path, 10, suf))
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [r.value for r in lg.iter_records()] == [b"%03d" % i for i in range(20)]
    names = set(os.listdir(d))
    assert "00000000000000000005-0000000001.checkpoint.deleted" in names
    assert not any(n.endswith((".cleaned", ".swap", ".log.deleted")) for n in names)
    assert f"{99:020d}.index" not in names


def test_retention_rolls_first_then_log_start_equals_log_end_and_persists(tmp_path):
    """REF §5: all segments expired -> roll first, log start = LEO; written at close; an
    unclean reopen with a stale log-start checkpoint still starts at the surviving segment."""
    clock = Clock(10_000)
    with _open(tmp_path, clock, **{"retention.ms": 1000, "segment.bytes": 10 * 71}) as s:
        lg = s.partition("t", 0)
        for i in range(15):
            lg.append(b"%03d" % i, timestamp_ms=1000 + i)
        rep = s.enforce_retention(now_ms=5000)
        assert rep[("t", 0)].rolled
        assert (lg.log_start_offset, lg.log_end_offset) == (15, 15)
        assert [seg.base_offset for seg in lg.segments] == [15]
    assert "t 0 15" in open(os.path.join(str(tmp_path), LSO)).read()
    with open(os.path.join(str(tmp_path), LSO), "w") as f:
        f.write("0\n1\nt 0 0\n")  # stale
    os.unlink(os.path.join(str(tmp_path), CLEAN))
    with segstore.open(str(tmp_path), clock=clock) as s:
        lg = s.partition("t", 0)
        assert (lg.log_start_offset, lg.log_end_offset) == (15, 15)


# Splitting an overflowed legacy segment (FINDING 1's fix, REF §4.4): compressed wrappers, the
# copied files' mtime, and damaged files that are left to recovery instead.

def _legacy_wrapper(magic, offsets, values, codec=1):
    """A gzip wrapper as a broker stores it: its own offset is the last inner offset (outside
    the CRC); inner offsets are absolute (magic 0) or 0..n-1 relative to it (magic 1).
    kafka-python's producer-side builder leaves the wrapper offset at 0."""
    from kafka.record.legacy_records import LegacyRecordBatchBuilder
    b = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i, (off, v) in enumerate(zip(offsets, values)):
        b.append(off if magic == 0 else i, timestamp=1_000 if magic else None, key=None,
                 value=v)
    return struct.pack(">q", offsets[-1]) + bytes(b.build())[8:]


@pytest.mark.parametrize("magic", [0, 1])
def test_split_starts_a_segment_at_a_compressed_wrappers_first_inner_offset(tmp_path, magic):
    os.makedirs(os.path.join(str(tmp_path), "t-0"))
    first = _legacy_wrapper(magic, [0, 1], [b"a", b"b"])
    wrapper = _legacy_wrapper(magic, [BIG, BIG + 1, BIG + 2], [b"c", b"d", b"e"])
    with open(_seg(tmp_path, 0), "wb") as f:
        f.write(first + wrapper)
    os.utime(_seg(tmp_path, 0), (1_600_000_000, 1_600_000_000))
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [(r.offset, r.value) for r in lg.iter_records()] == [
            (0, b"a"), (1, b"b"), (BIG, b"c"), (BIG + 1, b"d"), (BIG + 2, b"e")]
        assert [seg.base_offset for seg in lg.segments] == [0, BIG]
        assert lg.verify() == []
        # The copies keep the bytes and the age of the original.
        assert open(_seg(tmp_path, 0), "rb").read() == first
        assert open(_seg(tmp_path, BIG), "rb").read() == wrapper
        assert os.stat(_seg(tmp_path, 0)).st_mtime == 1_600_000_000
        lg.append(b"f")
        assert lg.log_end_offset == BIG + 4
    assert sorted(os.listdir(os.path.join(str(tmp_path), "t-0")))[:6] == [
        f"{0:020d}.index", f"{0:020d}.log", f"{0:020d}.timeindex",
        f"{BIG:020d}.index", f"{BIG:020d}.log", f"{BIG:020d}.timeindex"]


def test_a_damaged_overflowed_segment_is_not_split(tmp_path):
    """Only whole, CRC-valid files are split: a bad CRC leaves the file to recovery, which
    keeps what precedes the damage."""
    _legacy_overflow_dir(tmp_path, second_segment=False)
    data = bytearray(open(_seg(tmp_path, 0), "rb").read())
    data[-1] ^= 0xFF  # the last message's value: its CRC no longer matches
    open(_seg(tmp_path, 0), "wb").write(bytes(data))
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [r.offset for r in lg.iter_records()] == [0, 1]
        assert [seg.base_offset for seg in lg.segments] == [0]


def test_a_v2_offset_past_the_range_is_damage_not_split(tmp_path):
    """A v2 batch's base offset is outside its CRC: one past the segment's range is a damaged
    field, truncated by recovery as before, never split."""
    from segstore import _core
    os.makedirs(os.path.join(str(tmp_path), "t-0"))
    with open(_seg(tmp_path, 0), "wb") as f:
        f.write(_core.encode_batch([b"a"], base_offset=0)
                + _core.encode_batch([b"b"], base_offset=BIG))
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [r.offset for r in lg.iter_records()] == [0]
        assert [seg.base_offset for seg in lg.segments] == [0]


@pytest.mark.parametrize("crash_at", [(".cleaned", ".swap"), ("", ".deleted"), (".swap", "")])
def test_a_crash_during_the_split_loses_nothing(tmp_path, monkeypatch, crash_at):
    """The split swaps with REF §2.2's protocol: a crash at any rename leaves files the next
    open completes (``.swap`` kept, the old segment dropped) or rolls back (``.cleaned``
    dropped, the split done again)."""
    from segstore.segment import LogSegment
    _legacy_overflow_dir(tmp_path, second_segment=True)
    real = LogSegment.change_file_suffixes

    def crashing(self, old, new):
        if (old, new) == crash_at:
            raise OSError("crash")
        return real(self, old, new)
    monkeypatch.setattr(LogSegment, "change_file_suffixes", crashing)
    with pytest.raises(OSError, match="crash"):
        segstore.open(str(tmp_path))
    monkeypatch.undo()
    with segstore.open(str(tmp_path)) as s:
        lg = s.partition("t", 0)
        assert [(r.offset, r.value) for r in lg.iter_records()] == [
            (0, b"1"), (1, b"2"), (BIG, b"3"), (BIG + 1, b"4")]
        assert lg.verify() == []


def test_verify_reports_an_overflowed_segment_a_reader_cannot_split(tmp_path):
    """A read-only store splits nothing: verify() names the overflow."""
    _legacy_overflow_dir(tmp_path, second_segment=True)
    open(os.path.join(str(tmp_path), CLEAN), "w").close()
    with segstore.open(str(tmp_path)) as s:  # writable: split, so nothing to report
        assert s.partition("t", 0).verify() == []
    _legacy_overflow_dir(tmp_path / "again", second_segment=True)
    shutil.copytree(os.path.join(str(tmp_path), ".segstore"),
                    os.path.join(str(tmp_path / "again"), ".segstore"))
    with segstore.open(str(tmp_path / "again"), readonly=True) as r:
        problems = r.partition("t", 0).verify()
        assert [p.message for p in problems] == ["offsets past the segment's 32-bit relative range"]
        assert problems[0].file.endswith(f"{0:020d}.log")
