"""Spec conformance of log loading and crash recovery: REF §4.1-§4.5 and §2.2.

One test per rule, each named after it. Rules already pinned elsewhere (the temp-file pass in
test_recovery_review.py, the swap crash matrix in crash/test_swap_crash.py, the marker after a
lazy open in test_lazy_logs.py, splitting) are not repeated here. Expectations come from REF;
files are damaged or inspected with ``struct`` and ``os`` alone.
"""

from __future__ import annotations

import os
import shutil
import struct

import pytest

import segstore
from segstore.checkpoint import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT,
                                 RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile)
from segstore.errors import OffsetOutOfRangeError
from segstore.records import ControlRecordType, TopicPartition

from conftest import FakeClock, batch_spans

BATCH = 71          # bytes of one single-record batch of a 3-byte value, no key
PER_SEGMENT = 10    # batches per segment with segment.bytes = 10 * BATCH


def _dir(root) -> str:
    return os.path.join(str(root), "t-0")


def _path(root, base, suffix=".log") -> str:
    return os.path.join(_dir(root), f"{base:020d}{suffix}")


def _store(root, n=30, clock=None, **cfg):
    """A closed store whose topic t has ``n`` one-record batches, 10 per segment, with
    timestamps 1000 + offset."""
    cfg.setdefault("segment.bytes", PER_SEGMENT * BATCH)
    with segstore.open(str(root), clock=clock or FakeClock()) as s:
        s.create_topic("t", config=cfg)
        lg = s.partition("t", 0)
        for i in range(n):
            lg.append(b"%03d" % i, timestamp_ms=1000 + i)
    return str(root)


def _unclean(root, recovery_point=None) -> None:
    """As after a crash: no marker; optionally a recovery-point checkpoint for t-0."""
    os.unlink(os.path.join(str(root), CLEAN_SHUTDOWN_FILE))
    if recovery_point is not None:
        _write_checkpoint(root, RECOVERY_POINT_CHECKPOINT, {TopicPartition("t", 0): recovery_point})


def _write_checkpoint(root, name, offsets) -> None:
    lines = [f"{tp.topic} {tp.partition} {o}" for tp, o in offsets.items()]
    with open(os.path.join(str(root), name), "w") as f:
        f.write("0\n%d\n%s" % (len(lines), "".join(x + "\n" for x in lines)))


def _values(lg) -> list:
    return [r.value for r in lg.iter_records()]


def _time_entries(path) -> list:
    """(timestamp, offset relative to the segment's base) of a ``.timeindex`` file."""
    b = open(path, "rb").read()
    return [struct.unpack_from(">qi", b, i) for i in range(0, len(b), 12)]


def _tree(root) -> dict:
    """Every file under ``root``: its size, mtime and bytes (what a read-only open must not
    change)."""
    out = {}
    for d, _, files in os.walk(str(root)):
        for n in files:
            p = os.path.join(d, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[os.path.relpath(p, str(root))] = (st.st_size, st.st_mtime_ns, f.read())
    return out


# -- §2.2 / §4.2 phases 1-4: temporary files --------------------------------------------------

def test_swap_at_or_above_the_lowest_cleaned_is_discarded_and_originals_kept(tmp_path):
    """REF §2.2, §4.2 phase 1: a ``.swap`` whose base offset is >= the smallest ``.cleaned``
    offset belongs to a replace that never finished step 2; it is deleted (not completed), the
    ``.cleaned`` files go, and the original segments stay."""
    root = _store(tmp_path)
    # A replace of segments 10 and 20 interrupted in step 2: 20 renamed to .swap (high to low),
    # 10 still .cleaned. The .swap holds a "cleaned" copy missing its first batch.
    seg20 = open(_path(root, 20), "rb").read()
    with open(_path(root, 20, ".log.swap"), "wb") as f:
        f.write(seg20[BATCH:])
    shutil.copy(_path(root, 10), _path(root, 10, ".log.cleaned"))
    with segstore.open(root) as s:
        assert _values(s.partition("t", 0)) == [b"%03d" % i for i in range(30)]
    names = os.listdir(_dir(root))
    assert not any(n.endswith((".swap", ".cleaned")) for n in names)


def test_swap_completion_deletes_the_replaced_files_in_its_range_and_nothing_else(tmp_path):
    """REF §2.2, §4.2 phases 2-4: with no ``.cleaned`` left, every non-swap file whose offset
    lies in [min swap base, max swap next offset) is deleted (indexes and snapshots too) and the
    ``.swap`` loses its suffix; files outside the range stay."""
    root = _store(tmp_path)
    # A cleaned segment at 0 replacing segments 0 and 10 (offsets 0-19), keeping every 2nd batch.
    buf = open(_path(root, 0), "rb").read() + open(_path(root, 10), "rb").read()
    spans = batch_spans(buf)
    with open(_path(root, 0, ".log.swap"), "wb") as f:
        f.write(b"".join(buf[p:p + n] for p, n in spans[1::2]))
    open(_path(root, 10, ".snapshot"), "wb").close()   # in range: goes with its segment
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert [seg.base_offset for seg in lg.segments] == [0, 20]
        assert _values(lg) == [b"%03d" % i for i in range(1, 20, 2)] + \
            [b"%03d" % i for i in range(20, 30)]
    names = set(os.listdir(_dir(root)))
    assert f"{10:020d}.log" not in names and f"{10:020d}.index" not in names
    assert f"{10:020d}.snapshot" not in names
    assert f"{20:020d}.log" in names


def test_orphan_time_and_transaction_index_files_are_deleted(tmp_path):
    """REF §4.2 phase 5: any index file (``.index``, ``.timeindex``, ``.txnindex``) without its
    ``.log`` is deleted as orphaned."""
    root = _store(tmp_path)
    for suffix in (".timeindex", ".txnindex"):
        open(_path(root, 99, suffix), "wb").close()
    with segstore.open(root) as s:
        s.partition("t", 0)
    names = set(os.listdir(_dir(root)))
    assert f"{99:020d}.timeindex" not in names and f"{99:020d}.txnindex" not in names


# -- §4.2 phase 5: indexes missing or corrupt -------------------------------------------------

def test_missing_offset_index_below_the_recovery_point_is_rebuilt_after_a_clean_shutdown(
        tmp_path):
    """REF §4.2 phase 5: a segment whose offset index is missing (NoSuchFile) is recovered at
    load, whatever the recovery point; the rebuilt index is sparse like the original."""
    root = _store(tmp_path, **{"index.interval.bytes": BATCH * 3})
    want = open(_path(root, 0, ".index"), "rb").read()
    assert want  # the sparse rule gave it entries
    os.unlink(_path(root, 0, ".index"))
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.load_result.recovered_segments == 1
        assert [r.value for r in lg.read(5, max_records=1)] == [b"005"]
    assert open(_path(root, 0, ".index"), "rb").read() == want


def test_corrupt_offset_index_below_the_recovery_point_is_rebuilt_at_first_use(tmp_path):
    """REF §4.2 phase 5 (after KAFKA-7283 the offset index is checked lazily) and
    architecture.md "Lazy segment files": a corrupt offset index of a segment below the
    recovery point is not trusted; it is rebuilt when first used and reads stay right."""
    root = _store(tmp_path, **{"index.interval.bytes": BATCH * 3})
    want = open(_path(root, 0, ".index"), "rb").read()
    bad = bytearray(want)
    bad[0:4] = struct.pack(">i", 7)        # relative offset 7 at the position of offset 3
    bad[8:12] = struct.pack(">i", 2)        # and entries out of order
    open(_path(root, 0, ".index"), "wb").write(bytes(bad))
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.recovery_point == 30
        assert [r.value for r in lg.read(4, max_records=1)] == [b"004"]
    assert open(_path(root, 0, ".index"), "rb").read() == want


def test_missing_time_index_gives_correct_time_lookups(tmp_path):
    """REF §4.2 phase 5: a missing ``.timeindex`` is created; lookups by time still find the
    right offset in that segment."""
    root = _store(tmp_path)
    os.unlink(_path(root, 10, ".timeindex"))
    with segstore.open(root) as s:
        r = s.partition("t", 0).offset_for_time(1015)
        assert (r.offset, r.timestamp) == (15, 1015)


# -- §4.2 phases 7-9: recovery, the log end and the recovery point -----------------------------

def test_recovery_point_stays_at_the_checkpoint_after_an_unclean_recovery_without_loss(
        tmp_path):
    """REF §4.2 step 9: after an unclean shutdown the new recovery point is
    min(checkpointed recovery point, log end): recovery does not advance it."""
    root = _store(tmp_path)
    _unclean(root, recovery_point=15)
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.log_end_offset == 30
        assert lg.recovery_point == 15
        assert lg.load_result.recovered_segments == 2   # segments 10 and 20


def test_recovery_point_is_the_log_end_after_a_clean_shutdown(tmp_path):
    """REF §4.2 step 9: after a clean shutdown the recovery point is the log end offset, even
    when the checkpoint says less; nothing is recovered."""
    root = _store(tmp_path)
    _write_checkpoint(root, RECOVERY_POINT_CHECKPOINT, {TopicPartition("t", 0): 3})
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert (lg.recovery_point, lg.log_end_offset) == (30, 30)
        assert lg.load_result.recovered_segments == 0


def test_a_partition_without_a_recovery_checkpoint_entry_is_recovered_from_its_start(
        tmp_path):
    """REF §4.1: no checkpoint entry means recovery point 0, so after an unclean shutdown every
    segment is recovered (damage in the first one is cut and later segments deleted)."""
    root = _store(tmp_path)
    _unclean(root)
    _write_checkpoint(root, RECOVERY_POINT_CHECKPOINT, {TopicPartition("other", 0): 0})
    p = _path(root, 0)
    buf = bytearray(open(p, "rb").read())
    buf[5 * BATCH - 2] ^= 0xFF          # a payload byte of offset 4: its CRC fails
    open(p, "wb").write(bytes(buf))
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.log_end_offset == 4
        assert [seg.base_offset for seg in lg.segments] == [0]
        assert lg.recovery_point == 0


def test_unknown_partitions_in_checkpoints_are_ignored_and_not_written_back(tmp_path):
    """REF §4.5 and §4.1: checkpoint entries of partitions the store does not host change
    nothing at the open; the next checkpoint write lists the store's own logs only (as
    Kafka's LogManager writes the logs of the directory)."""
    root = _store(tmp_path)
    ghost = TopicPartition("ghost", 3)
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
        _write_checkpoint(root, name, {TopicPartition("t", 0): 0 if "start" in name else 30,
                                       ghost: 12})
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert (lg.log_start_offset, lg.log_end_offset) == (0, 30)
        assert s.list_topics() == ["t"]
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
        assert set(OffsetCheckpointFile(os.path.join(root, name)).read()) == \
            {TopicPartition("t", 0)}
    assert not os.path.exists(os.path.join(root, "ghost-3"))


def test_no_segment_left_creates_an_empty_one_at_the_log_start_checkpoint(tmp_path):
    """REF §4.2 step 8: a partition directory with no segment at all gets an empty segment at
    the checkpointed log start offset (not at 0)."""
    root = _store(tmp_path)
    for n in os.listdir(_dir(root)):
        if n[:20].isdigit():
            os.unlink(os.path.join(_dir(root), n))
    _write_checkpoint(root, LOG_START_OFFSET_CHECKPOINT, {TopicPartition("t", 0): 42})
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert [seg.base_offset for seg in lg.segments] == [42]
        assert (lg.log_start_offset, lg.log_end_offset) == (42, 42)
        assert lg.append(b"x").offset == 42


def test_an_empty_active_segment_is_kept_and_sets_the_log_end(tmp_path):
    """REF §4.2 step 8 (LEO = readNextOffset of the last segment, its base when empty): an
    empty active segment after a roll is kept as the active one, clean or unclean."""
    root = _store(tmp_path, n=20)
    with segstore.open(root) as s:
        s.partition("t", 0).roll()
    assert os.path.getsize(_path(root, 20)) == 0
    _unclean(root, recovery_point=20)
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert [seg.base_offset for seg in lg.segments] == [0, 10, 20]
        assert lg.log_end_offset == 20
        assert lg.append(b"x").offset == 20


def test_log_start_offset_is_the_larger_of_checkpoint_and_first_segment_base(tmp_path):
    """REF §4.2 step 11: logStartOffset = max(checkpoint, first segment base)."""
    root = _store(tmp_path)
    tp = TopicPartition("t", 0)
    for n in os.listdir(_dir(root)):               # retention removed segment 0 meanwhile
        if n.startswith(f"{0:020d}."):
            os.unlink(os.path.join(_dir(root), n))
    _write_checkpoint(root, LOG_START_OFFSET_CHECKPOINT, {tp: 3})
    with segstore.open(root) as s:
        assert s.partition("t", 0).log_start_offset == 10
    _write_checkpoint(root, LOG_START_OFFSET_CHECKPOINT, {tp: 17})
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.log_start_offset == 17
        assert _values(lg)[0] == b"017"


# -- §4.3: LogSegment.recover() ---------------------------------------------------------------

def test_recovery_cuts_a_partial_trailing_batch_and_rebuilds_the_time_index(tmp_path):
    """REF §4.3 steps 2-4: a torn last batch is truncated away; the log end follows."""
    root = _store(tmp_path, n=25)
    _unclean(root, recovery_point=20)
    p = _path(root, 20)
    with open(p, "r+b") as f:
        f.truncate(5 * BATCH - 20)
    with segstore.open(root, clock=FakeClock()) as s:   # a fake clock: no roll by age
        lg = s.partition("t", 0)
        assert lg.log_end_offset == 24
        assert lg.load_result.truncated_bytes == BATCH - 20
        assert lg.append(b"new").offset == 24
    assert os.path.getsize(p) == 5 * BATCH  # 4 old batches and the new one


def test_recovery_stops_at_a_batch_whose_offsets_go_backwards(tmp_path):
    """REF §4.3 (and architecture.md "Reads never trust what they cannot check"): a batch whose
    base offset is not above the previous batch's last offset (base offset lies outside the
    CRC) ends the valid prefix."""
    root = _store(tmp_path, n=25)
    _unclean(root, recovery_point=20)
    p = _path(root, 20)
    buf = bytearray(open(p, "rb").read())
    struct.pack_into(">q", buf, 3 * BATCH, 21)     # offset 23's batch claims offset 21
    open(p, "wb").write(bytes(buf))
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.log_end_offset == 23
        assert _values(lg)[-1] == b"022"


def test_recovery_writes_the_final_time_index_entry_of_a_recovered_segment(tmp_path):
    """REF §4.3 step 4: recover() appends the final time-index entry (max timestamp, its
    offset) before trimming, so the file on disk gives the segment's largest timestamp even if
    the process dies before a clean close (Kafka reads largestTimestamp from that entry)."""
    root = _store(tmp_path, **{"index.interval.bytes": 1 << 20})   # no sparse time entries
    _unclean(root, recovery_point=0)
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert lg.load_result.recovered_segments == 3
        # Still open: what recovery itself left on disk for the sealed segments.
        assert _time_entries(_path(root, 0, ".timeindex")) == [(1009, 9)]
        assert _time_entries(_path(root, 10, ".timeindex")) == [(1019, 9)]   # relative


def test_recovery_drops_the_producer_state_and_aborted_txns_of_cut_data(tmp_path):
    """REF §4.3 step 2 and §4.2 step 11: the transaction index is rebuilt by the replay of what
    recovery kept; a producer and an aborted transaction that lived only in the cut bytes are
    gone, and snapshots above the new log end are deleted."""
    clock = FakeClock()
    root = str(tmp_path)
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t")
        lg = s.partition("t", 0)
        lg.append_batch([b"a", b"b"], producer_id=7, producer_epoch=0, base_sequence=0,
                        is_transactional=True)
        lg.append_control(ControlRecordType.ABORT, producer_id=7, producer_epoch=0)
        kept = os.path.getsize(_path(root, 0))
        lg.append_batch([b"c"], producer_id=9, producer_epoch=0, base_sequence=0,
                        is_transactional=True)
        lg.append_control(ControlRecordType.ABORT, producer_id=9, producer_epoch=0)
    txn_before = open(_path(root, 0, ".txnindex"), "rb").read()
    assert len(txn_before) == 2 * 34
    _unclean(root, recovery_point=0)
    p = _path(root, 0)
    buf = bytearray(open(p, "rb").read())
    buf[-2] ^= 0xFF                              # the second ABORT marker's CRC fails
    open(p, "wb").write(bytes(buf))
    with segstore.open(root, clock=clock) as s:
        lg = s.partition("t", 0)
        assert lg.log_end_offset == 4            # data, marker, then producer 9's batch kept
        assert 9 in lg.active_producers()        # its transaction is open again
        assert lg.last_stable_offset == 3
        assert os.path.getsize(p) >= kept
    assert open(_path(root, 0, ".txnindex"), "rb").read() == txn_before[:34]
    snaps = [int(n[:20]) for n in os.listdir(_dir(root)) if n.endswith(".snapshot")]
    assert max(snaps) <= 4


# -- §4.1: the marker, and read-only opens ----------------------------------------------------

def test_marker_is_deleted_at_a_writable_open_before_any_log_loads(tmp_path, monkeypatch):
    """REF §4.1 (KAFKA-10471): the marker is deleted as the writable open starts, so a crash
    during loading counts as unclean next time."""
    root = _store(tmp_path)
    _unclean(root)
    open(os.path.join(root, CLEAN_SHUTDOWN_FILE), "wb").close()
    seen = []
    from segstore import log as log_mod
    real = log_mod.PartitionLog.__init__

    def init(self, *a, **kw):
        seen.append(os.path.exists(os.path.join(root, CLEAN_SHUTDOWN_FILE)))
        real(self, *a, **kw)

    monkeypatch.setattr(log_mod.PartitionLog, "__init__", init)
    with segstore.open(root) as s:
        s.partition("t", 0)
        assert not os.path.exists(os.path.join(root, CLEAN_SHUTDOWN_FILE))
    assert seen == [False]


def test_a_readonly_open_of_a_crashed_directory_writes_nothing(tmp_path):
    """REF §4.1/§4.2 against design §1.7: a read-only open runs none of the loader's writes.
    With no marker, leftovers of every kind (``.deleted``, ``.cleaned``, a ``.swap`` above
    them, orphan indexes), a missing and a corrupt index, a torn tail and stale checkpoints,
    reading every partition and every accessor changes no file."""
    root = _store(tmp_path, n=25, **{"index.interval.bytes": BATCH * 2})
    _unclean(root, recovery_point=3)
    shutil.copy(_path(root, 0), _path(root, 0, ".log.deleted"))
    shutil.copy(_path(root, 10), _path(root, 10, ".log.cleaned"))
    shutil.copy(_path(root, 20), _path(root, 20, ".log.swap"))
    open(_path(root, 99, ".index"), "wb").close()
    os.unlink(_path(root, 10, ".index"))
    idx = bytearray(open(_path(root, 0, ".index"), "rb").read())
    idx[0:4] = struct.pack(">i", 8)
    open(_path(root, 0, ".index"), "wb").write(bytes(idx))
    with open(_path(root, 20), "r+b") as f:
        f.truncate(5 * BATCH - 10)
    before = _tree(tmp_path)
    with segstore.open(root, readonly=True) as s:
        lg = s.partition("t", 0)
        assert _values(lg)[:5] == [b"000", b"001", b"002", b"003", b"004"]
        lg.offset_for_time(1012)
        lg.read(12, max_records=2)
        lg.last_stable_offset, lg.active_producers(), s.verify()
    assert _tree(tmp_path) == before


def test_a_readonly_open_with_the_log_start_checkpoint_past_the_log_end_deletes_nothing(
        tmp_path):
    """REF §4.2 step 8 is a writer's: a read-only open of a log whose checkpointed log start
    lies past its log end deletes no segment and reports an empty log at its log end
    (start = end); the next writable open applies step 8 (see architecture.md, read-only
    readers)."""
    root = _store(tmp_path, n=20)
    _write_checkpoint(root, LOG_START_OFFSET_CHECKPOINT, {TopicPartition("t", 0): 25})
    before = _tree(tmp_path)
    with segstore.open(root, readonly=True) as s:
        lg = s.partition("t", 0)
        assert (lg.log_start_offset, lg.log_end_offset) == (20, 20)
        assert lg.read(20) == []
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(0)
    assert _tree(tmp_path) == before
    with segstore.open(root) as s:
        lg = s.partition("t", 0)
        assert (lg.log_start_offset, lg.log_end_offset) == (25, 25)
