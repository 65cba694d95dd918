"""Producer-state snapshots at segment rolls (Kafka's ProducerStateManager, REF §2.5, §4.2 step 11,
§7 #30): what the log must remember of a producer after retention deleted all of its batches.

Kafka takes a producer snapshot ``<20-digit offset>.snapshot`` at every roll (named after the new
segment's base offset, written even when no producer is known) and at shutdown. Loading
(``truncateAndReload``) first deletes the snapshots above the target offset and those at or below
the log start offset, then loads the newest snapshot left (a corrupt one is deleted and the next
older one tried) and replays the batches after it. ``truncate_to`` does the same with the
truncation offset as target; retention renames away the snapshots of the segments it deletes.
Producer entries are never dropped because the log start offset moved (KIP-360, Kafka >= 2.5;
only ``producer.id.expiration.ms``, 1 day, expires them: every test here stays well below a day
of clock time). So after retention deleted every batch of a producer, a truncation or an unclean
reopen still knows its epoch (it stays fenced), its last sequence and batch (a retry is found, a
gap refused) and its open transaction (it holds the last stable offset back).

Oracles are independent of segstore: a plain-Python replay of Kafka's ProducerAppendInfo rules over
the batches each test appended (:func:`kafka_state`), snapshot files parsed here with ``struct``
and checked with the ``crc32c`` package, ``.txnindex`` entries packed with ``struct``. Crashes are
simulated either by copying the live store directory (a power cut: no shutdown snapshot, no clean
shutdown marker; the store deletes its marker when it opens) or by deleting the clean-shutdown
marker of a closed store. The clock is injected; nothing sleeps.

Expected to FAIL on the code this file was written against (segstore writes a snapshot only at a
clean close and deletes snapshots once read; docs/architecture.md, "Producer state", known gap):
  test_unclean_reopen_after_retention_remembers_the_producer (all 4 cases),
  test_truncate_after_retention_remembers_the_producer (both cases),
  test_unclean_reopen_keeps_a_transaction_opened_in_a_deleted_segment (both cases),
  test_roll_snapshots_hold_the_producer_state_at_each_segment_base,
  test_roll_snapshot_is_written_even_when_no_producer_is_known,
  test_truncate_to_removes_the_snapshots_above_the_offset,
  test_retention_removes_the_snapshots_of_deleted_segments_only,
  test_corrupt_newest_snapshot_falls_back_to_an_older_one,
  test_torn_tail_ignores_snapshots_above_the_new_log_end,
  test_random_operations_match_kafkas_producer_state (every seed).
Expected to pass today (guards for the new snapshot code):
  test_unclean_reopen_keeps_an_open_transaction_of_a_surviving_segment,
  test_corrupt_snapshot_without_retention_rebuilds_from_the_log.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from dataclasses import dataclass
from typing import Optional

import crc32c
import pytest

import segstore
from conftest import FakeClock
from segstore.errors import InvalidRecordError
from segstore.records import ControlRecordType

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT
T0 = 1_700_000_000_000
TOPIC = "t"
MARKER = ".kafka_cleanshutdown"
RP_CKPT = "recovery-point-offset-checkpoint"
# Small index files: copying a live store (a simulated crash) copies the preallocated indexes.
BASE_TOPIC_CONFIG = {"segment.index.bytes": 8192}


# ---------------------------------------------------------------------------------------------
# The oracle: Kafka's producer state, replayed from what a test appended


@dataclass
class Batch:
    """One appended batch as the test wrote it (pid -1: no producer)."""

    base: int
    n: int
    pid: int = -1
    epoch: int = -1
    seq: int = -1
    txn: bool = False
    marker: Optional[int] = None  # ControlRecordType of a COMMIT/ABORT marker
    coord: int = -1
    ts: int = -1

    @property
    def last(self) -> int:
        return self.base + self.n - 1


def kafka_state(batches) -> dict:
    """Kafka's producer entries after ``batches`` (in log order), as
    ``{pid: (epoch, last_seq, last_offset, offset_delta, timestamp, coordinator_epoch,
    current_txn_first_offset)}`` (the snapshot entry's field order after the producer id).

    ProducerAppendInfo: a new epoch forgets the batch metadata; a data batch records its last
    sequence, last offset, offset delta and max timestamp and opens a transaction when it is
    transactional and none is open; a COMMIT/ABORT marker records the coordinator epoch and its
    timestamp and closes the transaction."""
    st: dict[int, list] = {}
    for b in batches:
        if b.pid < 0:
            continue
        e = st.setdefault(b.pid, [-1, -1, -1, 0, -1, -1, -1])
        if b.epoch != e[0]:
            e[0], e[1], e[2], e[3] = b.epoch, -1, -1, 0
        if b.marker is not None:
            e[4], e[5], e[6] = b.ts, b.coord, -1
        else:
            e[1], e[2], e[3], e[4] = b.seq + b.n - 1, b.last, b.n - 1, b.ts
            if b.txn and e[6] < 0:
                e[6] = b.base
    return {p: tuple(e) for p, e in st.items()}


def active_of(state) -> dict:
    """What ``active_producers()`` reports: {pid: (last data offset or -1, epoch)}."""
    return {p: (e[2], e[0]) for p, e in state.items()}


def lso_of(state, log_start: int, leo: int) -> int:
    """Kafka's last stable offset (HW = LEO): the first offset of the oldest open transaction,
    raised to the log start offset (maybeIncrementFirstUnstableOffset), else the log end."""
    opened = [e[6] for e in state.values() if e[6] >= 0]
    if not opened:
        return leo
    return min(max(min(opened), log_start), leo)


# ---------------------------------------------------------------------------------------------
# Snapshot files, parsed independently (REF §2.5)

SNAP_HEADER = struct.Struct(">hIi")       # version, CRC-32C of bytes 6.., count
SNAP_ENTRY = struct.Struct(">qhiqiqiq")   # pid, epoch, last seq, last offset, delta, ts, coord, txn


def parse_snapshot(raw: bytes) -> dict:
    """{pid: (epoch, last_seq, last_offset, offset_delta, timestamp, coord, txn_first)}; asserts
    the version, the CRC-32C and the length."""
    assert len(raw) >= SNAP_HEADER.size, f"snapshot of {len(raw)} bytes"
    version, crc, count = SNAP_HEADER.unpack_from(raw, 0)
    assert version == 1
    assert crc == crc32c.crc32c(raw[6:]), "snapshot CRC-32C mismatch"
    assert count >= 0 and len(raw) == SNAP_HEADER.size + count * SNAP_ENTRY.size
    out = {}
    for i in range(count):
        pid, *rest = SNAP_ENTRY.unpack_from(raw, SNAP_HEADER.size + i * SNAP_ENTRY.size)
        assert pid not in out, f"producer {pid} twice in one snapshot"
        out[pid] = tuple(rest)
    return out


def snapshot_files(directory) -> dict:
    """{offset: path} of the ``<20 digits>.snapshot`` files (other suffixes, e.g. a
    ``.snapshot.deleted`` awaiting its delayed delete, are not snapshots)."""
    out = {}
    for n in os.listdir(directory):
        stem, dot, suffix = n.partition(".")
        if suffix == "snapshot" and len(stem) == 20 and stem.isdigit():
            out[int(stem)] = os.path.join(str(directory), n)
    return out


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# A store, a log and the batches appended to it


def open_store(root, clock, topic_config=None):
    s = segstore.open(str(root), clock=clock)
    if TOPIC not in s.list_topics():
        s.create_topic(TOPIC, config={**BASE_TOPIC_CONFIG, **(topic_config or {})})
    return s


class Driver:
    """Appends to one partition and keeps the batches, so the expected producer state at any
    offset is a replay (batches deleted by retention stay in the history: Kafka keeps their
    producers)."""

    def __init__(self, tmp_path, clock=None, topic_config=None):
        self.tmp_path = tmp_path
        self.clock = clock or FakeClock(T0)
        self.root = str(tmp_path / "store0")
        self.generation = 0
        self.store = open_store(self.root, self.clock, topic_config)
        self.batches: list[Batch] = []
        self.leo = 0
        self.log_start = 0

    @property
    def log(self):
        return self.store.partition(TOPIC, 0)

    @property
    def directory(self) -> str:
        return self.log.directory

    def state(self, upto: Optional[int] = None) -> dict:
        upto = self.leo if upto is None else upto
        return kafka_state(b for b in self.batches if b.base < upto)

    def bases(self) -> list:
        return [s.base_offset for s in self.log.segments]

    # -- appends ------------------------------------------------------------------------------
    def plain(self, n: int = 1) -> Batch:
        info = self.log.append_batch([b"plain"] * n)
        return self._took(info, Batch(self.leo, n, ts=self.clock()))

    def data(self, pid: int, n: int = 1, *, txn: bool = False, epoch: Optional[int] = None,
             seq: Optional[int] = None) -> Batch:
        """A data batch of ``pid``; by default at its current epoch (0 for a new producer) and
        with the next sequence (0 for a new epoch), as a well-behaved producer sends it."""
        cur = self.state().get(pid)
        if epoch is None:
            epoch = cur[0] if cur else 0
        if seq is None:
            seq = cur[1] + 1 if cur and cur[0] == epoch else 0
        info = self.log.append_batch([b"p%d-%d" % (pid, i) for i in range(n)], producer_id=pid,
                                     producer_epoch=epoch, base_sequence=seq,
                                     is_transactional=txn)
        return self._took(info, Batch(self.leo, n, pid, epoch, seq, txn, ts=self.clock()))

    def end(self, pid: int, control_type: int, coord: int = 0) -> Batch:
        epoch = self.state()[pid][0]
        info = self.log.append_control(control_type, producer_id=pid, producer_epoch=epoch,
                                       coordinator_epoch=coord)
        return self._took(info, Batch(self.leo, 1, pid, epoch, -1, True, control_type, coord,
                                      self.clock()))

    def _took(self, info, b: Batch) -> Batch:
        assert (info.first_offset, info.last_offset) == (b.base, b.last)
        self.batches.append(b)
        self.leo = b.last + 1
        return b

    # -- removing -----------------------------------------------------------------------------
    def delete_records(self, offset: int) -> None:
        """DeleteRecords, then a retention pass (which deletes the segments below it)."""
        self.log.delete_records(offset)
        self.log_start = max(self.log_start, offset)
        self.store.enforce_retention()  # retention.ms, when set, may take more
        start = self.log.log_start_offset
        assert self.log_start <= start <= self.leo
        self.log_start = start

    def retention(self) -> None:
        """A retention pass at the clock's time; the log start offset is where it left it."""
        self.store.enforce_retention()
        start = self.log.log_start_offset
        assert self.log_start <= start <= self.leo
        self.log_start = start

    def truncate(self, offset: int) -> None:
        assert offset in {b.base for b in self.batches} | {self.leo}  # a batch boundary
        self.log.truncate_to(offset)
        self.batches = [b for b in self.batches if b.base < offset]
        self.leo = min(self.leo, offset)

    # -- restarts -----------------------------------------------------------------------------
    def crash(self) -> None:
        """A power cut now: the directory as it is on disk, opened by a new store. The live
        store deleted its clean-shutdown marker when it opened, and nothing wrote a shutdown
        snapshot, so the copy is opened as after an unclean shutdown."""
        self.generation += 1
        copy = str(self.tmp_path / f"store{self.generation}")
        shutil.copytree(self.root, copy, ignore=shutil.ignore_patterns(".lock"))
        assert not os.path.exists(os.path.join(copy, MARKER))
        self.store.close()  # the crashed process; its directory is not looked at again
        self.root = copy
        self.store = open_store(copy, self.clock)

    def close(self) -> None:
        self.store.close()

    def open(self, *, unclean: bool = False, drop_recovery_point: bool = False) -> None:
        """Open the closed store again; ``unclean`` deletes the clean-shutdown marker first."""
        if unclean:
            os.unlink(os.path.join(self.root, MARKER))
        if drop_recovery_point:
            os.unlink(os.path.join(self.root, RP_CKPT))
        self.store = open_store(self.root, self.clock)

    def reopen(self, mode: str) -> None:
        if mode == "crash":
            self.crash()
        else:
            self.close()
            self.open(unclean=mode == "unclean", drop_recovery_point=False)

    # -- checks -------------------------------------------------------------------------------
    def check(self, where: str = "") -> None:
        lg = self.log
        st = self.state()
        assert lg.log_end_offset == self.leo, where
        assert lg.log_start_offset == self.log_start, where
        assert lg.active_producers() == active_of(st), where
        assert lg.last_stable_offset == lso_of(st, self.log_start, self.leo), where


@pytest.fixture
def drivers():
    made = []
    yield made
    for d in made:
        try:
            d.store.close()
        except Exception:
            pass


def driver(drivers, tmp_path, **kw) -> Driver:
    d = Driver(tmp_path, **kw)
    drivers.append(d)
    return d


def assert_fenced_and_in_sequence(d: Driver, pid: int, epoch: int, last_seq: int,
                                  last_offset: int, last_n: int) -> None:
    """Kafka's leader checks against a remembered producer (ProducerAppendInfo): a retry of its
    last batch is a duplicate (the first append's offsets, nothing written), an older epoch is
    fenced, a sequence gap is refused, the next sequence is taken."""
    lg = d.log
    leo = lg.log_end_offset
    retry = lg.append_batch([b"p%d-%d" % (pid, i) for i in range(last_n)], producer_id=pid,
                            producer_epoch=epoch, base_sequence=last_seq - last_n + 1)
    assert (retry.first_offset, retry.last_offset) == (last_offset - last_n + 1, last_offset)
    assert lg.log_end_offset == leo  # the duplicate was not written again
    with pytest.raises(InvalidRecordError):  # a zombie of an older epoch is fenced
        lg.append_batch([b"zombie"], producer_id=pid, producer_epoch=epoch - 1,
                        base_sequence=last_seq + 1)
    with pytest.raises(InvalidRecordError):  # out of order: a gap after the last sequence
        lg.append_batch([b"gap"], producer_id=pid, producer_epoch=epoch,
                        base_sequence=last_seq + 2)
    assert lg.log_end_offset == leo
    b = d.data(pid, 2, epoch=epoch, seq=last_seq + 1)  # the next sequence is accepted
    assert lg.active_producers()[pid] == (b.last, epoch)
    d.check("after the producer continued")


# ---------------------------------------------------------------------------------------------
# Layout shared by tests 1 and 2: producer P's batches only in the first segment


P, Q = 7, 11
P_EPOCH = 3
RETENTION_MS = 300_000


def build_p_then_more(d: Driver, extra_segments: int = 1) -> dict:
    """Segment 0: P's three idempotent batches (epoch 3, sequences 0..5) among plain ones, at
    T0. Then, 10 minutes later, a segment of plain batches and ``extra_segments`` more. Returns
    the segment bases and P's last batch."""
    d.plain(2)                                    # 0-1
    d.data(P, 2, epoch=P_EPOCH, seq=0)            # 2-3
    d.data(P, 3, epoch=P_EPOCH)                   # 4-6
    last = d.data(P, 1, epoch=P_EPOCH)            # 7, sequence 5
    d.plain()                                     # 8
    bases = []
    d.clock.advance(2 * RETENTION_MS)
    for _ in range(1 + extra_segments):
        d.log.roll()
        bases.append(d.leo)
        d.plain()
        d.plain()
    assert d.bases() == [0] + bases
    return {"bases": bases, "p_last": last}


def delete_p_segment(d: Driver, how: str, first_kept: int) -> None:
    """Delete segment 0 (every batch of P) by retention.ms or by DeleteRecords."""
    if how == "time":
        d.retention()
    else:
        d.delete_records(first_kept)
    assert d.bases()[0] == first_kept and d.log_start == first_kept
    assert all(b.last < first_kept for b in d.batches if b.pid == P)


# ---------------------------------------------------------------------------------------------
# 1. unclean reopen after retention deleted every batch of P


@pytest.mark.parametrize("reopen", ["crash", "unclean"])
@pytest.mark.parametrize("how", ["time", "delete_records"])
def test_unclean_reopen_after_retention_remembers_the_producer(drivers, tmp_path, how, reopen):
    cfg = {"retention.ms": RETENTION_MS} if how == "time" else {}
    d = driver(drivers, tmp_path, topic_config=cfg)
    lay = build_p_then_more(d)  # segments 0, 9, 11: the snapshot at 11 (> log start 9) has P
    delete_p_segment(d, how, lay["bases"][0])
    d.check("after retention")  # in memory the producer is still known (passes today)
    # "crash": no shutdown snapshot, Kafka loads the roll snapshot at 11 and replays 11..13;
    # "unclean": a closed store whose marker was deleted, Kafka loads the close's snapshot at 13
    d.reopen(reopen)
    assert d.log.load_result.recovered_segments > 0  # it was opened as unclean
    assert d.log.active_producers().get(P) == (lay["p_last"].last, P_EPOCH)
    d.check("after the unclean reopen")
    last = lay["p_last"]
    assert_fenced_and_in_sequence(d, P, P_EPOCH, last.seq + last.n - 1, last.last, last.n)


# ---------------------------------------------------------------------------------------------
# 2. truncate_to after retention deleted every batch of P


@pytest.mark.parametrize("how", ["time", "delete_records"])
def test_truncate_after_retention_remembers_the_producer(drivers, tmp_path, how):
    cfg = {"retention.ms": RETENTION_MS} if how == "time" else {}
    d = driver(drivers, tmp_path, topic_config=cfg)
    lay = build_p_then_more(d, extra_segments=2)  # segments 0, 9, 11, 13; log end 15
    b1, b2, b3 = lay["bases"]
    delete_p_segment(d, how, b1)
    # The target lies above the roll snapshot at 11, the newest one that truncateAndReload
    # keeps (it drops those above the target and those at or below the log start offset 9):
    # Kafka reloads P from it. (A target in 9..10 would leave Kafka no snapshot to load.)
    target = b2 + 1
    d.truncate(target)
    assert d.bases() == [b1, b2]
    assert d.log.active_producers().get(P) == (lay["p_last"].last, P_EPOCH)
    d.check("after truncate_to")
    assert all(off <= target for off in snapshot_files(d.directory))
    last = lay["p_last"]
    assert_fenced_and_in_sequence(d, P, P_EPOCH, last.seq + last.n - 1, last.last, last.n)


# ---------------------------------------------------------------------------------------------
# 3. open transactions and the last stable offset across an unclean reopen


def test_unclean_reopen_keeps_an_open_transaction_of_a_surviving_segment(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    d.plain(3)                                    # 0-2
    d.plain()                                     # 3
    d.log.roll()                                  # segment 4
    d.plain()                                     # 4
    first = d.data(P, 2, txn=True)                # 5-6: P's transaction starts here
    d.plain()                                     # 7
    d.log.roll()                                  # segment 8
    d.data(P, 1, txn=True)                        # 8
    d.plain()                                     # 9
    d.delete_records(4)                           # segment 0 (Q's batches) goes
    assert d.bases() == [4, 8]
    assert d.log.last_stable_offset == first.base
    d.crash()
    assert d.log.last_stable_offset == first.base == 5
    d.check("after the crash")
    d.end(P, COMMIT)
    assert d.log.last_stable_offset == d.log.log_end_offset == 11
    d.check("after the commit")


@pytest.mark.parametrize("end", [COMMIT, ABORT], ids=["commit", "abort"])
def test_unclean_reopen_keeps_a_transaction_opened_in_a_deleted_segment(drivers, tmp_path, end):
    d = driver(drivers, tmp_path, topic_config={"retention.ms": RETENTION_MS})
    d.plain()                                     # 0
    first = d.data(P, 1, txn=True)                # 1: P's transaction starts in segment 0
    d.plain()                                     # 2
    d.clock.advance(2 * RETENTION_MS)
    d.log.roll()                                  # segment 3
    d.plain()                                     # 3
    d.data(P, 2, txn=True)                        # 4-5: the same transaction goes on
    d.log.roll()                                  # segment 6
    d.plain()                                     # 6
    d.plain()                                     # 7
    d.retention()                                 # segment 0 expires
    assert d.bases() == [3, 6] and d.log_start == 3
    # The transaction is open since offset 1, below the log start: Kafka reports the log start
    # offset as the last stable offset, not the first offset of the batches left (4).
    assert d.log.last_stable_offset == 3
    d.crash()
    assert d.log.last_stable_offset == 3
    d.check("after the crash")
    marker = d.end(P, end)
    assert d.log.last_stable_offset == d.log.log_end_offset == marker.last + 1
    d.check("after the marker")
    txn_index = read_bytes(d.log.active_segment.txn_index_path) \
        if os.path.exists(d.log.active_segment.txn_index_path) else b""
    if end == ABORT:  # the aborted transaction's first offset is where it began (REF §2.5)
        assert txn_index == struct.pack(">hqqqq", 0, P, first.base, marker.base, marker.base + 1)
    else:
        assert txn_index == b""


# ---------------------------------------------------------------------------------------------
# 4. snapshot files on disk, in Kafka's layout


def build_rolls_with_producers(d: Driver) -> list:
    """Rolls while no producer is known, then while idempotent and transactional producers
    write, commit, abort and bump an epoch. Returns the bases of the rolled segments."""
    rolled = []

    def roll():
        d.clock.advance(1_000)
        d.log.roll()
        rolled.append(d.leo)

    d.plain(3)                           # no producer known yet
    roll()
    d.data(1, 2)                         # producer 1: idempotent, epoch 0
    d.data(2, 1, txn=True)               # producer 2: a transaction left open over the roll
    d.clock.advance(7)
    d.data(1, 3)
    roll()
    d.data(2, 2, txn=True)
    d.data(3, 1, txn=True, epoch=4)      # producer 3, epoch 4
    d.end(2, COMMIT, coord=5)
    d.clock.advance(3)
    d.data(1, 1)
    roll()
    d.end(3, ABORT, coord=2)
    d.data(1, 2, epoch=1, seq=0)         # producer 1 bumps its epoch
    d.data(2, 1, txn=True)               # producer 2 opens another transaction
    roll()
    d.plain()
    roll()                               # nothing changed since the last roll
    return rolled


def test_roll_snapshots_hold_the_producer_state_at_each_segment_base(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    rolled = build_rolls_with_producers(d)
    assert d.bases() == [0] + rolled
    files = snapshot_files(d.directory)
    # every roll while producers were known left a snapshot named after the new segment
    with_producers = [b for b in rolled if d.state(b)]
    assert with_producers == rolled[1:]
    missing = [b for b in with_producers if b not in files]
    assert not missing, f"no snapshot at rolled segment bases {missing}; files: {sorted(files)}"
    # every snapshot file is Kafka's layout and holds the state as of its offset
    for off, path in sorted(files.items()):
        assert off in rolled, f"snapshot at {off}, not at a segment base, before any shutdown"
        assert parse_snapshot(read_bytes(path)) == d.state(off), f"snapshot {off}"
    # a transaction open at a roll is in that roll's snapshot with its first offset
    assert parse_snapshot(read_bytes(files[rolled[1]]))[2][6] == 5
    d.check()


def test_roll_snapshot_is_written_even_when_no_producer_is_known(drivers, tmp_path):
    # Kafka's roll() takes a snapshot whatever the producer map holds (an empty one says "no
    # producer before this offset", so a later load needs not replay the segments below it).
    d = driver(drivers, tmp_path)
    rolled = build_rolls_with_producers(d)
    files = snapshot_files(d.directory)
    assert sorted(files) == rolled
    assert parse_snapshot(read_bytes(files[rolled[0]])) == {}


# ---------------------------------------------------------------------------------------------
# 5. truncation, retention and corrupt snapshots


def test_truncate_to_removes_the_snapshots_above_the_offset(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    rolled = build_rolls_with_producers(d)  # segments 0, 3, 9, 14, 18, 19
    b1, b2, b3 = rolled[:3]
    target = next(b.base for b in d.batches if b2 < b.base < b3)
    d.truncate(target)
    files = snapshot_files(d.directory)
    above = sorted(off for off in files if off > target)
    assert not above, f"snapshots above {target} left: {above}"
    # those below it stay (the log start offset is 0); an empty one is not required here
    assert {b for b in (b1, b2) if d.state(b)} <= set(files), \
        f"roll snapshots below {target} missing; files: {sorted(files)}"
    for off, path in files.items():
        assert parse_snapshot(read_bytes(path)) == d.state(off)
    d.check("after truncate_to")
    # the state goes on from the truncation point: a new roll snapshots it, not the old one
    d.data(2, 1, txn=True)
    d.end(2, ABORT)
    d.log.roll()
    snap = snapshot_files(d.directory).get(d.leo)
    assert snap is not None
    assert parse_snapshot(read_bytes(snap)) == d.state()
    d.check("after appending past the truncation point")


def test_retention_removes_the_snapshots_of_deleted_segments_only(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    rolled = build_rolls_with_producers(d)  # segments 0, 3, 9, 14, 18, 19
    assert {b for b in rolled if d.state(b)} <= set(snapshot_files(d.directory))
    d.delete_records(rolled[1])  # segments 0 and 3 go; 9 becomes the first
    assert d.bases() == rolled[1:]
    files = snapshot_files(d.directory)
    assert not [off for off in files if off < d.log_start], sorted(files)
    # the snapshots of surviving segments above the log start offset stay, unchanged
    for off in rolled[2:]:
        assert off in files, f"snapshot {off} of a surviving segment was removed"
        assert parse_snapshot(read_bytes(files[off])) == d.state(off)
    d.check("after retention")
    d.crash()
    d.check("after a crash")


def test_corrupt_newest_snapshot_falls_back_to_an_older_one(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    lay = build_p_then_more(d, extra_segments=2)  # segments 0, 9, 11, 13
    d.data(Q, 1)                                  # Q at 15, after the newest roll snapshot
    delete_p_segment(d, "delete_records", lay["bases"][0])
    copy_root = str(tmp_path / "crashed")
    shutil.copytree(d.root, copy_root, ignore=shutil.ignore_patterns(".lock"))
    part = os.path.join(copy_root, f"{TOPIC}-0")
    files = snapshot_files(part)
    assert files and max(files) == lay["bases"][-1], f"snapshots on disk: {sorted(files)}"
    newest = files[max(files)]
    raw = bytearray(read_bytes(newest))
    raw[-1] ^= 0x5A
    with open(newest, "wb") as f:
        f.write(bytes(raw))
    d.store.close()
    d.root = copy_root
    d.store = open_store(copy_root, d.clock)
    # Kafka deletes the corrupt snapshot and loads the one at 11 (P) and replays 11..16 (Q)
    assert d.log.active_producers().get(P) == (lay["p_last"].last, P_EPOCH)
    d.check("after the reopen")
    for off, path in snapshot_files(d.directory).items():
        body = read_bytes(path)
        assert body != bytes(raw), "the corrupt snapshot is still there"
        assert parse_snapshot(body) == d.state(off)


def test_corrupt_snapshot_without_retention_rebuilds_from_the_log(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    build_rolls_with_producers(d)
    d.data(1, 1)
    d.close()
    for path in snapshot_files(os.path.join(d.root, f"{TOPIC}-0")).values():
        raw = bytearray(read_bytes(path))
        raw[7] ^= 0xFF  # inside the CRC-covered count/entries
        with open(path, "wb") as f:
            f.write(bytes(raw))
    d.open(unclean=True)
    d.check("after the reopen")
    for off, path in snapshot_files(d.directory).items():
        assert parse_snapshot(read_bytes(path)) == d.state(off)


# ---------------------------------------------------------------------------------------------
# 6. a torn tail after a crash


def test_torn_tail_ignores_snapshots_above_the_new_log_end(drivers, tmp_path):
    d = driver(drivers, tmp_path)
    d.data(P, 3, epoch=P_EPOCH)                   # 0-2: P, epoch 3
    d.plain()                                     # 3
    d.log.roll()                                  # segment 4
    d.plain()                                     # 4
    first = d.data(Q, 1, txn=True)                # 5: Q's transaction
    d.plain()                                     # 6
    d.log.roll()                                  # segment 7
    d.plain()                                     # 7
    d.data(Q, 2, txn=True)                        # 8-9
    commit = d.end(Q, COMMIT)                     # 10: the last batch
    d.delete_records(4)                           # segment 0 (P) goes
    assert d.log.last_stable_offset == d.leo == 11
    d.close()  # the shutdown snapshot at 11 says Q's transaction is committed
    os.unlink(os.path.join(d.root, MARKER))
    os.unlink(os.path.join(d.root, RP_CKPT))
    part = os.path.join(d.root, f"{TOPIC}-0")
    seg = os.path.join(part, f"{7:020d}.log")
    with open(seg, "r+b") as f:  # the marker was torn: its last bytes never reached the disk
        f.truncate(os.path.getsize(seg) - 5)
    d.batches.remove(commit)
    d.leo = commit.base
    d.open()
    assert d.log.log_end_offset == 10
    above = [off for off in snapshot_files(d.directory) if off > 10]
    assert not above, f"snapshots above the log end offset 10 left: {above}"
    assert d.log.last_stable_offset == first.base == 5  # Q's transaction is open again
    assert d.log.active_producers().get(P) == (2, P_EPOCH)
    d.check("after the torn reopen")
    for off, path in snapshot_files(d.directory).items():
        assert parse_snapshot(read_bytes(path)) == d.state(off)
    d.end(Q, ABORT)
    d.check("after aborting the reopened transaction")


# ---------------------------------------------------------------------------------------------
# 7. random operations against the model


class SnapshotBook:
    """The snapshots a Kafka broker is sure to hold (a subset of those it may hold), to tell
    which truncations and reloads have one outcome in Kafka whatever else it kept:

    * each roll writes one at the new segment's base;
    * a checkpoint of the recovery points (periodic, and at shutdown) deletes those below
      min(segment below the recovery point, second-to-last segment): conservatively, every one
      below the second-to-last segment's base;
    * retention deletes those of the deleted segments, truncation those above the target;
    * a reload deletes those above the log end and at or below the log start offset, and
      snapshots that are not at a segment base (except the newest, when above every base):
      conservatively, every one not at a segment base.
    """

    def __init__(self):
        self.offsets: set[int] = set()

    def rolled(self, new_bases) -> None:
        self.offsets |= set(new_bases)

    def checkpointed(self, bases) -> None:
        floor = bases[-2] if len(bases) >= 2 else bases[-1]
        self.offsets = {o for o in self.offsets if o >= floor}

    def kept_from(self, first_base: int) -> None:
        self.offsets = {o for o in self.offsets if o >= first_base}

    def truncated(self, target: int) -> None:
        self.offsets = {o for o in self.offsets if o <= target}

    def reloaded(self, bases, log_start: int, leo: int) -> None:
        self.offsets = {o for o in self.offsets if log_start < o <= leo and o in set(bases)}

    def usable(self, log_start: int, target: int) -> bool:
        return any(log_start < o <= target for o in self.offsets)


class RandomRun:
    PIDS = {1: False, 2: True, 3: True}  # producer id -> transactional

    def __init__(self, d: Driver, rnd: random.Random):
        self.d, self.rnd = d, rnd
        self.book = SnapshotBook()
        self.ops = 0
        self.skipped = 0

    # the outcome of a reload to ``target`` is Kafka's whatever snapshot it loads when a sure
    # snapshot lies in (log start, target], or when a replay from the log start offset (Kafka
    # with no snapshot) and from the first segment (segstore today) give the full history's
    # state: then all of them equal the model's.
    def unambiguous(self, target: int, shutdown_snapshot: bool = False) -> bool:
        d = self.d
        if shutdown_snapshot and target > d.log_start:
            return True
        if self.book.usable(d.log_start, target):
            return True
        full = d.state(target)
        first = d.bases()[0]
        from_segments = kafka_state(b for b in d.batches if first <= b.base < target)
        from_start = kafka_state(b for b in d.batches if b.last >= d.log_start and b.base < target)
        return from_segments == full == from_start

    def step(self) -> str:
        d, rnd = self.d, self.rnd
        d.clock.advance(rnd.choice([1, 50, 1_000, 20_000]))
        before = d.bases()
        op = rnd.choices(
            ["data", "marker", "plain", "roll", "delete_records", "retention", "truncate",
             "clean", "crash", "unclean", "zombie"],
            [30, 8, 8, 8, 3, 3, 5, 2, 3, 2, 3])[0]
        if op == "data":
            pid = rnd.choice(list(self.PIDS))
            txn = self.PIDS[pid]
            cur = d.state().get(pid)
            if cur and cur[6] < 0 and rnd.random() < 0.15:  # a new epoch, not mid-transaction
                d.data(pid, rnd.randint(1, 3), txn=txn, epoch=cur[0] + 1, seq=0)
            else:
                d.data(pid, rnd.randint(1, 3), txn=txn)
        elif op == "marker":
            open_ = [p for p, e in d.state().items() if e[6] >= 0]
            known = [p for p in d.state() if self.PIDS[p]]
            if not open_ and not known:
                return self.skip()
            pid = rnd.choice(open_ or known)  # mostly closes a transaction; else an empty one
            coord = max(0, d.state()[pid][5]) + rnd.randint(0, 1)
            d.end(pid, rnd.choice([COMMIT, ABORT]), coord=coord)
        elif op == "plain":
            d.plain(rnd.randint(1, 2))
        elif op == "roll":
            d.log.roll()
        elif op == "delete_records":
            d.delete_records(rnd.randint(d.log_start, d.leo))
            self.book.kept_from(d.bases()[0])
        elif op == "retention":
            d.clock.advance(rnd.choice([10_000, 40_000, 70_000]))
            d.retention()
            self.book.kept_from(d.bases()[0])
        elif op == "truncate":
            targets = sorted({b.base for b in d.batches if d.log_start <= b.base < d.leo
                              and b.base >= d.bases()[0]})
            targets = [t for t in targets if self.unambiguous(t)]
            if not targets:
                return self.skip()
            t = rnd.choice(targets)
            d.truncate(t)
            self.book.truncated(t)
        elif op in ("clean", "unclean"):
            if not self.unambiguous(d.leo, shutdown_snapshot=True):
                return self.skip()
            self.book.checkpointed(d.bases())
            d.close()
            d.open(unclean=op == "unclean")
            self.book.reloaded(d.bases(), d.log_start, d.leo)
        elif op == "crash":
            # the periodic checkpoint ran before the crash (the log start offset is durable)
            d.store.write_checkpoints()
            self.book.checkpointed(d.bases())
            if not self.unambiguous(d.leo):
                return self.skip()
            d.crash()
            self.book.reloaded(d.bases(), d.log_start, d.leo)
        elif op == "zombie":
            known = [(p, e) for p, e in d.state().items() if e[0] >= 1]
            if not known:
                return self.skip()
            pid, e = rnd.choice(known)
            with pytest.raises(InvalidRecordError):
                d.log.append_batch([b"zombie"], producer_id=pid, producer_epoch=e[0] - 1,
                                   base_sequence=0, is_transactional=self.PIDS[pid])
            with pytest.raises(InvalidRecordError):
                d.log.append_batch([b"gap"], producer_id=pid, producer_epoch=e[0],
                                   base_sequence=e[1] + 2, is_transactional=self.PIDS[pid])
        after = d.bases()
        self.book.rolled(b for b in after if b > max(before))
        self.book.kept_from(after[0])
        self.ops += 1
        return op

    def skip(self) -> str:
        self.skipped += 1
        return "skipped"


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_operations_match_kafkas_producer_state(drivers, tmp_path, seed):
    clock = FakeClock(T0)
    d = driver(drivers, tmp_path, clock=clock,
               topic_config={"segment.bytes": 700, "retention.ms": 60_000})
    run = RandomRun(d, random.Random(seed))
    history = []
    for i in range(90):
        op = run.step()
        history.append(op)
        d.check(f"seed {seed} step {i} ({op}); ops so far: {history}")
    assert clock() - T0 < 86_400_000  # below producer.id.expiration.ms: nothing expires
    # the run did what it is for: producers forgotten by retention, reloads and truncations
    assert {"crash", "truncate"} <= set(history), history
