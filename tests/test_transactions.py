"""Transactions in a partition log: ``.txnindex`` entries written by ABORT markers (also for
transactions spanning segments), the last stable offset, the producers the cleaner must keep,
and how all of it survives clean and unclean reopening, recovery and truncation (REF §2.5, §3.2,
§3.8, §4.2-§4.3, §6.3, §7 #23, #30).

Oracles: ``.txnindex`` bytes packed by hand with ``struct.pack('>hqqqq', ...)``; expected entries
and last stable offsets from :class:`Model`, Kafka's definition written out independently of
segstore (an ABORT of a transaction with data is an entry ``(pid, first offset, marker offset,
first offset of the oldest transaction open by another producer, else marker + 1)``). Unclean
shutdowns are made by deleting the clean-shutdown marker and the recovery-point checkpoint of a
closed store, or by opening a log with ``had_clean_shutdown=False``.
"""

from __future__ import annotations

import os
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import segstore
from conftest import FakeClock, batch_spans, v2_header
from segstore import _core
from segstore.config import TopicConfig
from segstore.errors import InvalidRecordError
from segstore.log import PartitionLog
from segstore.records import ControlRecordType
from segstore.segment import CLEANED_SUFFIX, LogSegment
from segstore.transaction_index import AbortedTxn, collect_aborted_transactions

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT
T0 = 1_000_000
MARKER = ".kafka_cleanshutdown"
RP_CKPT = "recovery-point-offset-checkpoint"


def packed(*txns) -> bytes:
    return b"".join(struct.pack(">hqqqq", 0, *t) for t in txns)


def open_log(path, clock=None, **kw):
    opts = {k: kw.pop(k) for k in ("readonly", "recovery_point", "had_clean_shutdown") if k in kw}
    config = TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})
    return PartitionLog(str(path), "t", 0, config, clock or FakeClock(T0), **opts)


def txn_files(directory) -> dict[str, bytes]:
    out = {}
    for n in sorted(os.listdir(directory)):
        if n.endswith(".txnindex"):
            with open(os.path.join(directory, n), "rb") as f:
                out[n] = f.read()
    return out


class Model:
    """Kafka's transaction bookkeeping, written from the definitions (no segstore code)."""

    def __init__(self):
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[tuple] = []
        self.leo = 0
        self.last_data: dict[int, int] = {}

    def data(self, pid, n, transactional):
        if pid >= 0:
            if transactional and pid not in self.open:
                self.open[pid] = self.leo
            self.last_data[pid] = self.leo + n - 1
        self.leo += n

    def marker(self, pid, abort):
        offset = self.leo
        first = self.open.pop(pid, None)
        if abort and first is not None:
            others = list(self.open.values())
            self.aborted.append((pid, first, offset, min(others) if others else offset + 1))
        self.last_data.setdefault(pid, -1)
        self.leo += 1

    @property
    def lso(self):
        return min(self.open.values()) if self.open else self.leo


class Driver:
    """Applies the same operations to a log and to the model."""

    def __init__(self, log, model=None):
        self.log, self.model = log, model or Model()
        self.seq: dict[int, int] = {}  # each producer's next sequence, as a producer counts

    def plain(self, n=1):
        self.log.append_batch([b"p" * 20] * n)
        self.model.data(-1, n, False)

    def txn(self, pid, n=1):
        self.log.append_batch([b"t%d" % pid] * n, producer_id=pid, producer_epoch=0,
                              base_sequence=self.seq.get(pid, 0), is_transactional=True)
        self.seq[pid] = self.seq.get(pid, 0) + n  # once the append took them
        self.model.data(pid, n, True)

    def idem(self, pid, n=1):
        self.log.append_batch([b"i%d" % pid] * n, producer_id=pid, producer_epoch=0,
                              base_sequence=self.seq.get(pid, 0))
        self.seq[pid] = self.seq.get(pid, 0) + n
        self.model.data(pid, n, False)

    def end(self, pid, abort):
        info = self.log.append_control(ABORT if abort else COMMIT, producer_id=pid,
                                       producer_epoch=0)
        assert info.first_offset == self.model.leo
        self.model.marker(pid, abort)


def expected_by_segment(log, aborted):
    segs = log.segments
    out = {}
    for i, s in enumerate(segs):
        nxt = segs[i + 1].base_offset if i + 1 < len(segs) else 2**62
        out[s.base_offset] = [AbortedTxn(*t) for t in aborted if s.base_offset <= t[2] < nxt]
    return out


def check_against_model(log, model):
    assert log.log_end_offset == model.leo
    assert log.last_stable_offset == model.lso
    for s in log.segments:
        assert s.txn_index.all() == expected_by_segment(log, model.aborted)[s.base_offset]
    assert {p: v[0] for p, v in log.active_producers().items()} == model.last_data


# ---------------------------------------------------------------------------------------------
# appends


def test_abort_writes_kafkas_txnindex_entry(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append(b"plain")
    assert log.last_stable_offset == 1 == log.log_end_offset
    log.append_batch([b"a", b"b"], producer_id=1, producer_epoch=0, base_sequence=0,
                     is_transactional=True)
    assert log.last_stable_offset == 1  # the open transaction's first offset
    log.append_batch([b"c"], producer_id=2, producer_epoch=0, base_sequence=0,
                     is_transactional=True)
    assert log.last_stable_offset == 1
    assert log.append_control(ABORT, producer_id=1, producer_epoch=0).first_offset == 4
    assert log.last_stable_offset == 3  # producer 2's transaction is still open
    path = log.active_segment.txn_index_path
    with open(path, "rb") as f:
        assert f.read() == packed((1, 1, 4, 3))
    log.append_control(COMMIT, producer_id=2, producer_epoch=0)
    assert log.last_stable_offset == 6 == log.log_end_offset
    with open(path, "rb") as f:
        assert f.read() == packed((1, 1, 4, 3))  # a commit adds nothing
    assert log.active_segment.collect_aborted(0, 100) == [AbortedTxn(1, 1, 4, 3)]
    assert log.active_segment.collect_aborted(5, 100) == []
    # the marker batches are Kafka's: control + transactional, producer fields, one record
    with open(log.active_segment.log_path, "rb") as f:
        data = f.read()
    headers = [v2_header(data, p) for p, _ in batch_spans(data)]
    assert [(h["base_offset"], h["attributes"], h["producer_id"], size) for h, (_, size) in
            zip(headers, batch_spans(data))][-2:] == [(4, 0x30, 1, 78), (5, 0x30, 2, 78)]


def test_log_without_transactions_has_no_txnindex_and_empty_snapshots(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=300)
    for i in range(20):
        log.append(b"v%d" % i)
    log.append_batch([b"x"], producer_id=-1)
    assert log.last_stable_offset == log.log_end_offset == 21
    assert log.active_producers() == {}
    bases = [s.base_offset for s in log.segments]
    log.close()
    names = os.listdir(tmp_path / "t-0")
    assert not [n for n in names if n.endswith(".txnindex")]
    # Kafka's snapshots: one per roll (at the new base) and one at close, empty here
    snaps = sorted(n for n in names if n.endswith(".snapshot"))
    assert snaps == ["%020d.snapshot" % o for o in bases[1:] + [21]]
    for n in snaps:
        assert (tmp_path / "t-0" / n).read_bytes() == struct.pack(
            ">hIi", 1, crc32c.crc32c(struct.pack(">i", 0)), 0)


def test_transaction_spanning_segments(tmp_path):  # REF §7 #23, #36
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    d = Driver(log)
    d.txn(1)                      # offset 0: producer 1 opens in the first segment
    d.txn(2, n=2)                 # 1-2
    for _ in range(12):
        d.plain()
    d.idem(3)
    d.txn(1)
    d.end(2, abort=False)
    for _ in range(8):
        d.plain()
    d.end(1, abort=True)          # the ABORT lands segments later
    d.txn(4)
    d.end(4, abort=True)
    segs = log.segments
    assert len(segs) >= 4
    marker_seg = next(s for s in segs if s.read_next_offset() > d.model.aborted[0][2])
    assert marker_seg is not segs[0]
    assert d.model.aborted[0] == (1, 0, d.model.aborted[0][2], d.model.aborted[0][2] + 1)
    check_against_model(log, d.model)
    with open(marker_seg.txn_index_path, "rb") as f:
        assert f.read() == packed(*[t for t in d.model.aborted
                                    if t[2] < marker_seg.read_next_offset()])
    # only the segments holding ABORT markers have a file
    assert [s.base_offset for s in segs if os.path.exists(s.txn_index_path)] == \
        sorted({s.base_offset for s in segs for t in d.model.aborted
                if s.base_offset <= t[2] < s.read_next_offset()})
    # the first segment's range overlaps the transaction aborted later (Kafka's log-level walk)
    assert segs[0].collect_aborted(0, segs[1].base_offset) == []
    assert collect_aborted_transactions(segs, 0, segs[1].base_offset) == \
        [AbortedTxn(*d.model.aborted[0])]
    assert collect_aborted_transactions(segs, segs[1].base_offset, log.log_end_offset) == \
        [AbortedTxn(*t) for t in d.model.aborted]


def test_last_stable_offset_with_open_transactions(tmp_path):  # REF §6.3, §7 #56
    log = open_log(tmp_path / "t-0")
    d = Driver(log)
    d.plain(3)
    d.txn(7)          # 3
    d.plain(2)
    d.txn(8, n=3)     # 6-8
    assert log.last_stable_offset == 3
    d.end(7, abort=False)
    assert log.last_stable_offset == 6
    d.txn(7)          # 10: a new transaction of producer 7
    d.end(8, abort=True)
    assert log.last_stable_offset == 10
    assert log.active_segment.txn_index.all() == [AbortedTxn(8, 6, 11, 10)]
    # the first unstable offset never goes below the log start offset
    log.delete_records(12)
    assert log.last_stable_offset == 12
    d.end(7, abort=False)
    assert log.last_stable_offset == log.log_end_offset == 13


def test_active_producers_are_kafkas_last_records(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_batch([b"a", b"b"], producer_id=1, producer_epoch=0, base_sequence=0)
    log.append_batch([b"c"], producer_id=2, producer_epoch=3, base_sequence=0,
                     is_transactional=True)
    log.append(b"plain")
    log.append_control(COMMIT, producer_id=2, producer_epoch=3)
    log.append_control(ABORT, producer_id=5, producer_epoch=1)  # a marker without data
    assert log.active_producers() == {1: (1, 0), 2: (2, 3), 5: (-1, 1)}
    log.append_control(ABORT, producer_id=2, producer_epoch=4)  # an epoch bump by a marker
    assert log.active_producers()[2] == (-1, 4)
    assert log.active_segment.txn_index.all() == []  # no transaction had data


def test_rejected_appends_write_nothing(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_batch([b"a"], producer_id=1, producer_epoch=2, base_sequence=0,
                     is_transactional=True)
    size = log.active_segment.size
    with pytest.raises(InvalidRecordError, match="fenced"):
        log.append_batch([b"old"], producer_id=1, producer_epoch=1, base_sequence=0)
    with pytest.raises(InvalidRecordError, match="fenced"):
        log.append_control(ABORT, producer_id=1, producer_epoch=1)
    with pytest.raises(InvalidRecordError, match="transaction is open"):
        log.append_batch([b"plain"], producer_id=1, producer_epoch=2, base_sequence=1)
    assert log.log_end_offset == 1 and log.active_segment.size == size
    assert log.last_stable_offset == 0
    log.append_control(ABORT, producer_id=1, producer_epoch=2)
    assert log.active_segment.txn_index.all() == [AbortedTxn(1, 0, 1, 2)]


def test_log_append_time_markers_stay_control_batches(tmp_path):
    log = open_log(tmp_path / "t-0", message_timestamp_type="LogAppendTime")
    clock = log.clock
    log.append_batch([b"a"], producer_id=1, producer_epoch=0, base_sequence=0,
                     is_transactional=True)
    clock.advance(5)
    log.append_control(ABORT, producer_id=1, producer_epoch=0, coordinator_epoch=3)
    staged = _core.encode_batch([b"b"], timestamps_ms=1, producer_id=2, producer_epoch=0,
                                base_sequence=0, is_transactional=True) + \
        _core.encode_control_batch(ABORT, producer_id=2, producer_epoch=0, timestamp_ms=1)
    clock.advance(5)
    log.append_records(staged)
    with open(log.active_segment.log_path, "rb") as f:
        data = f.read()
    for pos, size in batch_spans(data):
        h = v2_header(data, pos)
        assert h["crc"] == crc32c.crc32c(data[pos + 21:pos + size])
        assert h["attributes"] & 0x08  # LogAppendTime
    markers = [v2_header(data, p) for p, _ in batch_spans(data)][1::2]
    assert [(m["attributes"], m["max_timestamp"]) for m in markers] == \
        [(0x38, T0 + 5), (0x38, T0 + 10)]
    assert log.active_segment.txn_index.all() == [AbortedTxn(1, 0, 1, 2), AbortedTxn(2, 2, 3, 4)]
    assert log.active_producers() == {1: (0, 0), 2: (2, 0)}


def test_staged_batches_and_markers_in_one_append(tmp_path):
    log = open_log(tmp_path / "t-0")
    staged = b"".join([
        _core.encode_batch([b"a"], timestamps_ms=1, producer_id=1, producer_epoch=0,
                           base_sequence=0, is_transactional=True),
        _core.encode_batch([b"b", b"c"], timestamps_ms=1, producer_id=2, producer_epoch=0,
                           base_sequence=0, is_transactional=True),
        _core.encode_control_batch(ABORT, producer_id=1, producer_epoch=0, timestamp_ms=1),
        _core.encode_control_batch(ABORT, producer_id=2, producer_epoch=0, timestamp_ms=1),
    ])
    log.append(b"first")
    log.append_records(staged)
    # batch by batch, as recovery replays them: producer 2 was open at the first ABORT
    assert log.active_segment.txn_index.all() == [AbortedTxn(1, 1, 4, 2), AbortedTxn(2, 2, 5, 6)]
    assert log.last_stable_offset == 6


# ---------------------------------------------------------------------------------------------
# cleaned segments


def test_cleaned_segment_txn_index_is_swapped_in(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    d = Driver(log)
    d.txn(1)
    for _ in range(6):
        d.plain()
    d.end(1, abort=True)
    for _ in range(6):
        d.plain()
    old = log.segments[:-1]
    assert len(old) >= 2
    cleaned = LogSegment(log.directory, old[0].base_offset, log.config, log.clock,
                         suffix=CLEANED_SUFFIX)
    entry = AbortedTxn(*d.model.aborted[0])
    cleaned.txn_index.append(entry)
    assert cleaned.txn_index_path.endswith(".txnindex.cleaned")
    with open(cleaned.txn_index_path, "rb") as f:
        assert f.read() == packed(d.model.aborted[0])
    for s in old:  # copy the data over verbatim: only the file protocol matters here
        _, b = s.read_batch_headers()
        cleaned.append(s.buffer(s.size)[:s.size], b)
    cleaned.on_become_inactive()
    cleaned.flush()
    log.replace_segments([cleaned], old)
    new = log.segments[0]
    assert new is cleaned and new.txn_index_path.endswith("00000000000000000000.txnindex")
    assert new.txn_index.all() == [entry]
    assert new.collect_aborted(0, log.log_end_offset) == [entry]
    names = os.listdir(log.directory)
    assert "00000000000000000000.txnindex" in names
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]


# ---------------------------------------------------------------------------------------------
# reopening


def build(path, segment_bytes=400, **kw):
    log = open_log(path, segment_bytes=segment_bytes, **kw)
    d = Driver(log)
    d.txn(1)
    d.txn(2, n=2)
    for _ in range(10):
        d.plain()
    d.idem(3, n=2)
    d.end(2, abort=True)
    d.txn(1)
    for _ in range(6):
        d.plain()
    d.end(1, abort=True)
    d.txn(2)
    d.txn(4)
    d.end(4, abort=True)   # producer 2 is still open: the last stable offset stays at it
    for _ in range(5):
        d.plain()
    return log, d


def test_clean_reopen_reads_the_snapshot(tmp_path):  # REF §2.5, §4.2 step 11
    log, d = build(tmp_path / "t-0")
    check_against_model(log, d.model)
    before = txn_files(tmp_path / "t-0")
    producers = log.active_producers()
    log.close()
    snap = tmp_path / "t-0" / ("%020d.snapshot" % d.model.leo)
    assert snap.exists()
    with open(snap, "rb") as f:
        raw = f.read()
    version, crc, count = struct.unpack_from(">hIi", raw)
    assert (version, count, len(raw)) == (1, 4, 10 + 4 * 46)
    assert crc == crc32c.crc32c(raw[6:])
    entries = {e[0]: e for e in struct.iter_unpack(">qhiqiqiq", raw[10:])}
    assert entries[2][7] == d.model.open[2]  # producer 2's open transaction
    assert all(entries[p][7] == -1 for p in (1, 3, 4))
    again = open_log(tmp_path / "t-0", segment_bytes=400)
    assert again.load_result.recovered_segments == 0
    assert snap.read_bytes() == raw  # kept, as Kafka keeps it: it holds the state at its offset
    assert again.active_producers() == producers
    assert again.last_stable_offset == d.model.lso < d.model.leo
    assert txn_files(tmp_path / "t-0") == before
    # the transaction opened before the reopen aborts with its original first offset
    d.log = again
    d.plain()
    d.end(2, abort=True)
    check_against_model(again, d.model)


def test_clean_shutdown_without_snapshot_starts_empty(tmp_path):  # REF §7 #30
    log, d = build(tmp_path / "t-0")
    log.close()
    for n in os.listdir(tmp_path / "t-0"):
        if n.endswith(".snapshot"):
            os.unlink(tmp_path / "t-0" / n)
    # Kafka's rule: a clean shutdown without any snapshot means no producer state to rebuild
    again = open_log(tmp_path / "t-0", segment_bytes=400)
    assert again.active_producers() == {} and again.last_stable_offset == again.log_end_offset
    # a stray snapshot (not at a segment base, below the last one) does not count: Kafka's
    # removeStraySnapshots deletes it and the log is replayed
    again.close()
    for n in os.listdir(tmp_path / "t-0"):
        if n.endswith(".snapshot"):
            os.unlink(tmp_path / "t-0" / n)
    stray = tmp_path / "t-0" / ("%020d.snapshot" % 3)
    assert 3 not in [s.base_offset for s in again.segments]
    stray.write_bytes(struct.pack(">hIi", 1, crc32c.crc32c(struct.pack(">i", 0)), 0))
    third = open_log(tmp_path / "t-0", segment_bytes=400)
    assert not stray.exists()
    check_against_model(third, d.model)


def test_damaged_snapshot_falls_back_to_replay(tmp_path):
    log, d = build(tmp_path / "t-0")
    log.close()
    snap = tmp_path / "t-0" / ("%020d.snapshot" % d.model.leo)
    raw = bytearray(snap.read_bytes())
    raw[-1] ^= 0xFF
    snap.write_bytes(bytes(raw))
    again = open_log(tmp_path / "t-0", segment_bytes=400)
    check_against_model(again, d.model)


def unclean_store(root, clock, *, drop_txn_indexes=True):
    """Close a store, then make its next open unclean (no marker, no recovery point)."""
    for name in (MARKER, RP_CKPT):
        os.unlink(os.path.join(root, name))
    d = os.path.join(root, "t-0")
    for n in os.listdir(d):
        if n.endswith(".snapshot") or (drop_txn_indexes and n.endswith(".txnindex")):
            os.unlink(os.path.join(d, n))


def test_unclean_store_reopen_rebuilds_txn_indexes(tmp_path):  # REF §4.3, §7 #23
    root, clock = str(tmp_path / "store"), FakeClock(T0)
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"segment.bytes": 400})
        log = s.partition("t", 0)
        d = Driver(log)
        d.txn(1)
        d.txn(2, n=2)
        for _ in range(10):
            d.plain()
        d.end(2, abort=True)
        d.txn(1)
        for _ in range(6):
            d.plain()
        d.end(1, abort=True)
        d.txn(5)
        check_against_model(log, d.model)
        before = txn_files(log.directory)
        producers = log.active_producers()
        assert len(before) >= 2
    unclean_store(root, clock)
    assert txn_files(os.path.join(root, "t-0")) == {}
    with segstore.open(root, clock=clock) as s:
        log = s.partition("t", 0)
        assert log.load_result.recovered_segments == len(log.segments)
        assert txn_files(log.directory) == before  # byte for byte
        assert log.active_producers() == producers
        assert log.last_stable_offset == d.model.lso
        d.log = log
        d.end(5, abort=True)
        check_against_model(log, d.model)


def test_recovery_above_recovery_point_sees_transactions_of_earlier_segments(tmp_path):
    log, d = build(tmp_path / "t-0")
    before = txn_files(tmp_path / "t-0")
    segs = log.segments
    marker_base = max(s.base_offset for s in segs if s.base_offset <= d.model.aborted[1][2])
    assert d.model.aborted[1][1] < marker_base  # started in an earlier segment
    log.close()
    os.unlink(segs[[s.base_offset for s in segs].index(marker_base)].txn_index_path)
    for n in os.listdir(tmp_path / "t-0"):
        if n.endswith(".snapshot"):
            os.unlink(tmp_path / "t-0" / n)
    again = open_log(tmp_path / "t-0", segment_bytes=400, had_clean_shutdown=False,
                     recovery_point=marker_base)
    assert again.load_result.recovered_segments == sum(s.base_offset >= marker_base
                                                       for s in again.segments)
    assert txn_files(tmp_path / "t-0") == before
    check_against_model(again, d.model)


def test_missing_txn_index_below_recovery_point_is_written_again(tmp_path):
    log, d = build(tmp_path / "t-0")
    before = txn_files(tmp_path / "t-0")
    first = min(before)
    log.close()
    os.unlink(tmp_path / "t-0" / first)
    # Snapshots would start the replay past the first segment (Kafka does not notice a missing
    # .txnindex either); without them the whole log is replayed, which writes it again.
    for n in os.listdir(tmp_path / "t-0"):
        if n.endswith(".snapshot"):
            os.unlink(tmp_path / "t-0" / n)
    # only the last segment is above the recovery point; the first is replayed, not recovered
    again = open_log(tmp_path / "t-0", segment_bytes=400, had_clean_shutdown=False,
                     recovery_point=d.model.leo)
    assert again.load_result.recovered_segments == 1
    assert txn_files(tmp_path / "t-0") == before
    check_against_model(again, d.model)


def test_corrupt_txn_index_is_recovered_on_a_clean_open(tmp_path):  # REF §4.2 phase 5
    log, d = build(tmp_path / "t-0")
    before = txn_files(tmp_path / "t-0")
    name = min(before)
    log.close()
    with open(tmp_path / "t-0" / name, "ab") as f:
        f.write(b"\x00" * 7)
    again = open_log(tmp_path / "t-0", segment_bytes=400)
    assert again.load_result.recovered_segments >= 1
    assert txn_files(tmp_path / "t-0") == before
    check_against_model(again, d.model)


def test_torn_abort_marker_reopens_the_transaction(tmp_path):
    log = open_log(tmp_path / "t-0")
    d = Driver(log)
    d.plain()
    d.txn(1, n=2)
    path = log.active_segment.log_path
    d.end(1, abort=True)
    assert log.last_stable_offset == 4
    log.close()
    with open(path, "r+b") as f:  # the marker was not written completely
        f.truncate(os.path.getsize(path) - 10)
    again = open_log(tmp_path / "t-0", had_clean_shutdown=False)
    assert again.log_end_offset == 3 and again.last_stable_offset == 1
    assert again.active_segment.txn_index.all() == []
    assert os.path.getsize(again.active_segment.txn_index_path) == 0
    again.append_control(ABORT, producer_id=1, producer_epoch=0)
    assert again.active_segment.txn_index.all() == [AbortedTxn(1, 1, 3, 4)]


# ---------------------------------------------------------------------------------------------
# truncation


def test_truncate_below_abort_marker_reopens_the_transaction(tmp_path):  # REF §3.8
    log, d = build(tmp_path / "t-0")
    last = d.model.aborted[-1]  # producer 4: (4, 25, 26, 24), producer 2 open at 24
    marker_seg = next(s for s in log.segments if s.base_offset <= last[2] < s.read_next_offset())
    log.truncate_to(last[2])
    assert log.log_end_offset == last[2]
    with open(marker_seg.txn_index_path, "rb") as f:
        assert f.read() == packed(*[t for t in d.model.aborted[:-1]
                                    if t[2] >= marker_seg.base_offset])
    assert log.last_stable_offset == min(last[3], last[1])  # 4 and 2 are open again
    assert log.active_producers()[4] == (last[1], 0)
    # truncating below the start of producer 4's transaction forgets it
    log.truncate_to(last[1])
    assert 4 not in log.active_producers()
    assert log.last_stable_offset == last[3]  # producer 2's transaction, open since then
    # the reopened transaction can be aborted again
    log.append_control(ABORT, producer_id=2, producer_epoch=0)
    assert log.active_segment.txn_index.all()[-1] == AbortedTxn(2, last[3], last[1], last[1] + 1)


def test_truncate_across_segments_drops_their_entries(tmp_path):
    log, d = build(tmp_path / "t-0")
    first_abort = d.model.aborted[0]
    log.truncate_to(first_abort[2])
    assert sum(len(s.txn_index.all()) for s in log.segments) == 0
    assert log.last_stable_offset == 0  # producers 1 and 2 are open from the start again
    assert sorted(log.active_producers()) == [1, 2, 3]
    log.append_control(ABORT, producer_id=2, producer_epoch=0)
    assert log.segments[-1].txn_index.all() == [AbortedTxn(2, 1, first_abort[2], 0)]


def test_truncate_fully_forgets_every_producer(tmp_path):
    log, d = build(tmp_path / "t-0")
    log.truncate_fully_and_start_at(500)
    assert log.active_producers() == {} and log.last_stable_offset == 500
    log.close()
    # every older snapshot went; the close wrote an empty one at the new log end
    assert [n for n in os.listdir(tmp_path / "t-0") if n.endswith(".snapshot")] == [
        "%020d.snapshot" % 500]
    assert (tmp_path / "t-0" / ("%020d.snapshot" % 500)).read_bytes()[6:] == b"\0\0\0\0"
    again = open_log(tmp_path / "t-0", segment_bytes=400)
    assert again.active_producers() == {} and again.last_stable_offset == 500


def test_segment_truncate_truncates_its_txn_index(tmp_path):
    log = open_log(tmp_path / "t-0")
    d = Driver(log)
    for pid in (1, 2, 3):
        d.txn(pid)
        d.end(pid, abort=True)
    seg = log.active_segment
    assert [t.last_offset for t in seg.txn_index.all()] == [1, 3, 5]
    seg.truncate_to(3)
    assert [t.last_offset for t in seg.txn_index.all()] == [1]
    assert os.path.getsize(seg.txn_index_path) == 34


# ---------------------------------------------------------------------------------------------
# read-only stores


def test_read_only_store_replays_producer_state(tmp_path):
    root, clock = str(tmp_path / "store"), FakeClock(T0)
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"segment.bytes": 400})
        log = s.partition("t", 0)
        d = Driver(log)
        d.txn(1)
        d.plain(3)
        d.txn(2)
        d.end(1, abort=True)
        with segstore.open(root, readonly=True) as ro:
            rlog = ro.partition("t", 0)
            assert rlog.last_stable_offset == 4
            assert rlog.active_producers() == {1: (0, 0), 2: (4, 0)}
            d.end(2, abort=False)
            assert rlog.last_stable_offset == rlog.log_end_offset == 7
            assert collect_aborted_transactions(rlog.segments, 0, 7) == [AbortedTxn(1, 0, 5, 4)]


# ---------------------------------------------------------------------------------------------
# appended == recovered, against the model


OPS = st.lists(st.tuples(st.sampled_from(["plain", "txn", "idem", "commit", "abort", "roll"]),
                         st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=40)


@settings(max_examples=25)
@given(ops=OPS)
def test_appends_and_recovery_write_the_same_indexes(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("prop") / "t-0"
    log = open_log(path, segment_bytes=350)
    d = Driver(log)
    for op, pid, n in ops:
        if op == "plain":
            d.plain(n)
        elif op == "txn":
            d.txn(pid, n)
        elif op == "idem":
            if pid in d.model.open:
                with pytest.raises(InvalidRecordError):
                    d.idem(pid, n)
                continue
            d.idem(pid, n)
        elif op == "roll":
            log.roll()
        else:
            d.end(pid, abort=op == "abort")
        assert log.last_stable_offset == d.model.lso
    check_against_model(log, d.model)
    before = txn_files(path)
    producers = log.active_producers()
    log.close()
    for n in os.listdir(path):
        if n.endswith((".txnindex", ".snapshot")):
            os.unlink(path / n)
    again = open_log(path, segment_bytes=350, had_clean_shutdown=False)
    assert txn_files(path) == before
    assert again.active_producers() == producers
    check_against_model(again, d.model)
    again.close()


def test_verify_reports_a_damaged_txn_index(tmp_path):
    log, d = build(tmp_path / "t-0")
    assert log.verify() == []
    names = sorted(os.listdir(tmp_path / "t-0"))
    seg = next(s for s in log.segments if os.path.exists(s.txn_index_path))
    with open(seg.txn_index_path, "ab") as f:
        f.write(b"\x01\x02\x03")
    problems = log.verify()
    assert [(p.file, p.position) for p in problems] == [(seg.txn_index_path, 0)]
    assert "not a multiple" in problems[0].message
    assert sorted(os.listdir(tmp_path / "t-0")) == names  # no file created by checking


def test_verify_reports_a_damaged_producer_snapshot(tmp_path):
    log, d = build(tmp_path / "t-0")
    assert log.verify() == []
    snaps = sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".snapshot"))
    assert snaps  # one per roll
    path = str(tmp_path / "t-0" / snaps[-1])
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 1
    open(path, "wb").write(bytes(raw))
    problems = log.verify()
    assert [(p.file, p.position) for p in problems] == [(path, 0)]
    assert "CRC" in problems[0].message
    assert open(path, "rb").read() == bytes(raw)  # reported, not repaired


def test_delete_records_keeps_producer_state(tmp_path):  # REF §7 #30
    log = open_log(tmp_path / "t-0")
    log.append_batch([b"a"], producer_id=1, producer_epoch=0, base_sequence=0)
    log.append_batch([b"b"], producer_id=2, producer_epoch=0, base_sequence=0)
    log.append_batch([b"c"], producer_id=3, producer_epoch=0, base_sequence=0,
                     is_transactional=True)
    log.delete_records(2)  # mid-segment
    producers = log.active_producers()
    assert producers == {1: (0, 0), 2: (1, 0), 3: (2, 0)}
    assert log.last_stable_offset == 2
    log.close()
    clean = open_log(tmp_path / "t-0")  # from the snapshot
    assert clean.active_producers() == producers
    clean.close()
    unclean = open_log(tmp_path / "t-0", had_clean_shutdown=False)  # replays the whole segment
    assert unclean.active_producers() == producers


def test_abort_in_a_segment_rolled_during_the_same_append(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=400)
    staged = [_core.encode_batch([b"t" * 30], timestamps_ms=1, producer_id=1, producer_epoch=0,
                                 base_sequence=0, is_transactional=True)]
    staged += [_core.encode_batch([b"p" * 30], timestamps_ms=1) for _ in range(12)]
    staged.append(_core.encode_control_batch(ABORT, producer_id=1, producer_epoch=0,
                                             timestamp_ms=1))
    info = log.append_records(b"".join(staged))
    assert info.last_offset == 13 and len(log.segments) >= 3
    with_entries = [s for s in log.segments if s.txn_index.all()]
    assert [s.txn_index.all() for s in with_entries] == [[AbortedTxn(1, 0, 13, 14)]]
    assert with_entries[0] is log.segments[-1] and with_entries[0].base_offset > 0
