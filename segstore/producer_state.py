"""Producer state: Kafka's ProducerStateManager for one partition (REF §2.5, §3.2, §4.2-§4.3).

Per producer id the state keeps the epoch, the last data batch (last sequence, last offset, its
offset delta), the last timestamp, the coordinator epoch of the last transaction marker and the
first offset of the producer's open transaction (-1 if none). It is updated batch by batch, in
log order, from batch headers alone; only a transaction marker's record is decoded (its key holds
the marker type, its value the coordinator epoch, REF §1.8):

* a data batch with a producer id records the batch; a transactional one opens a transaction at
  its base offset when the producer has none open;
* a COMMIT/ABORT marker closes the producer's transaction. An ABORT of a transaction that held
  data becomes an :class:`AbortedTxn` (producer, first offset, marker offset, last stable offset)
  in the ``.txnindex`` of the segment holding the marker. The last stable offset is Kafka's: the
  first offset of the oldest transaction still open by *another* producer, else marker + 1.
  A marker of a producer with no open transaction completes nothing (Kafka emits no entry for an
  empty transaction).

Appends and recovery use the same batch-by-batch replay, so an appended log and a recovered one
write identical transaction indexes. The first unstable offset is the smallest first offset of
an open transaction; the log's last stable offset is that offset (or the log end offset).

The state is written to and read from Kafka's ``.snapshot`` files (REF §2.5 layout, here in
:meth:`ProducerStateManager.snapshot_bytes`) by :mod:`segstore.producer_snapshots`: at every
roll and clean close, and on open and truncation.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from . import _core
from .errors import CorruptIndexError, CorruptRecordError, InvalidRecordError, is_int
from .records import ControlRecordType
from .transaction_index import AbortedTxn

log = logging.getLogger("segstore.producer_state")

SNAPSHOT_VERSION = 1
SNAPSHOT_HEADER = struct.Struct(">hIi")  # version, CRC-32C of everything after byte 6, count
SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")  # 46 bytes, see ProducerStateEntry field order
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
_INT32_MAX = 0x7FFFFFFF


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: wraps from 2^31-1 to 0."""
    if sequence > _INT32_MAX - increment:
        return increment - (_INT32_MAX - sequence) - 1
    return sequence + increment


@dataclass
class ProducerStateEntry:
    """What the log remembers of one producer (Kafka's ProducerStateEntry with one batch of
    metadata: the last data batch). ``last_data_offset`` is -1 when no data batch of the
    current epoch is known."""

    producer_id: int
    producer_epoch: int = -1
    last_sequence: int = -1
    last_data_offset: int = -1
    last_offset_delta: int = 0
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    def maybe_update_epoch(self, epoch: int) -> None:
        """A new epoch forgets the previous epoch's batch (Kafka's maybeUpdateProducerEpoch)."""
        if epoch != self.producer_epoch:
            self.last_sequence, self.last_data_offset, self.last_offset_delta = -1, -1, 0
            self.producer_epoch = epoch


class CompletedTxn(NamedTuple):
    """A transaction closed by a marker: [first_offset, last_offset = marker offset]."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class _Marker(NamedTuple):
    control_type: int  # ControlRecordType value; -1 (UNKNOWN) for anything unreadable
    coordinator_epoch: int
    timestamp: int


def _read_marker(buf, position: int, size: int) -> Optional[_Marker]:
    """The record of the control batch at ``position``: None for an empty control batch."""
    try:
        recs = _core.decode_records(buf, position, position + size, include_control=True,
                                    validate_crc=False)
    except CorruptRecordError as e:
        log.warning("unreadable control record at position %d: %s", position, e)
        return _Marker(int(ControlRecordType.UNKNOWN), -1, -1)
    if not recs:
        return None
    r = recs[0]
    ctype = ControlRecordType.UNKNOWN
    if r.key is not None and len(r.key) >= 4:
        ctype = _CONTROL_KEY.unpack_from(r.key)[1]
    coord = -1
    if ctype in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        if r.value is None or len(r.value) < 6:
            ctype = ControlRecordType.UNKNOWN
        else:
            coord = _MARKER_VALUE.unpack_from(r.value)[1]
    return _Marker(int(ctype), coord, r.timestamp)


class ProducerStateManager:
    """The producer state of one partition log. Mutated by the log's writer under its lock;
    :meth:`first_unstable_offset` is safe to read from any thread."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerStateEntry] = {}
        self._ongoing: dict[int, int] = {}  # open transactions: first offset -> producer id
        self._first_unstable: Optional[int] = None
        self.map_end_offset = 0  # the next offset the state has seen (Kafka's mapEndOffset)
        self.last_snapshot_offset = 0  # of the last snapshot written or read (lastSnapOffset)

    # -- queries ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._producers)

    def get(self, producer_id: int) -> Optional[ProducerStateEntry]:
        """The entry of ``producer_id`` (the live object: do not change it), or None."""
        return self._producers.get(producer_id)

    @property
    def producers(self) -> dict[int, ProducerStateEntry]:
        """A copy of every entry, by producer id."""
        return {pid: ProducerStateEntry(**vars(e)) for pid, e in self._producers.items()}

    def first_unstable_offset(self) -> Optional[int]:
        """First offset of the oldest open transaction, or None when none is open."""
        return self._first_unstable

    def ongoing_transactions(self) -> dict[int, int]:
        """Open transactions as {first offset: producer id}, oldest first."""
        return dict(sorted(self._ongoing.items()))

    def active_producers(self) -> dict[int, tuple[int, int]]:
        """{producer id: (last data offset or -1, epoch)} (Kafka's lastRecordsOfActiveProducers)."""
        return {pid: (e.last_data_offset, e.producer_epoch) for pid, e in self._producers.items()}

    # -- changes ----------------------------------------------------------------------------
    def clear(self, map_end_offset: int = 0) -> None:
        """Forget every producer (a log truncated fully)."""
        self._producers.clear()
        self._ongoing.clear()
        self._first_unstable = None
        self.map_end_offset = map_end_offset
        self.last_snapshot_offset = 0

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget the producers without an open transaction whose last batch (or marker)
        timestamp is ``expiration_ms`` or more before ``now_ms`` (Kafka's
        removeExpiredProducers); returns their ids."""
        gone = [pid for pid, e in self._producers.items()
                if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms]
        for pid in gone:
            del self._producers[pid]
        return gone

    def _set_ongoing(self, first_offset: int, producer_id: Optional[int]) -> None:
        if producer_id is None:
            self._ongoing.pop(first_offset, None)
        else:
            self._ongoing[first_offset] = producer_id
        self._first_unstable = min(self._ongoing) if self._ongoing else None

    def _last_stable_offset(self, txn: CompletedTxn) -> int:
        # Kafka's lastStableOffset(completedTxn): the oldest transaction still open by another
        # producer bounds what is stable; if there is none, everything up to the marker is.
        others = [first for first, pid in self._ongoing.items() if pid != txn.producer_id]
        return min(others) if others else txn.last_offset + 1

    def validate(self, buf, batches: np.ndarray, check_sequences: bool = True) -> None:
        """Reject an append Kafka's leader would reject (before anything is written): a batch
        of an older producer epoch (fenced), a non-transactional batch while the producer's
        transaction is open, a marker of an older coordinator epoch or of no marker type.
        Sequences are checked as Kafka's leader checks a client's (ProducerAppendInfo.
        checkSequence): a data batch needs one, a new epoch starts at 0, and within an epoch
        each batch follows the last; an unknown producer may start anywhere. A retried batch
        is found first by :meth:`find_duplicate`."""
        rows = _producer_rows(batches)
        if rows is None:
            return
        # pid -> (epoch, coordinator epoch, open txn, last sequence)
        seen: dict[int, tuple[int, int, bool, int]] = {}
        for b in rows:
            pid, epoch = int(b["producer_id"]), int(b["producer_epoch"])
            cur = self._producers.get(pid)
            state = seen.get(pid) or ((cur.producer_epoch, cur.coordinator_epoch,
                                       cur.current_txn_first_offset >= 0, cur.last_sequence)
                                      if cur else (-1, -1, False, -1))
            cur_epoch, coord_epoch, open_txn, last_seq = state
            if epoch < cur_epoch:
                raise InvalidRecordError(
                    f"producer {pid} is fenced: epoch {epoch} is older than its current epoch "
                    f"{cur_epoch}")
            if int(b["attributes"]) & _ATTR_CONTROL:
                marker = _read_marker(buf, int(b["position"]), int(b["size"]))
                if marker is None:
                    continue
                if marker.control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
                    raise InvalidRecordError(
                        f"control batch of producer {pid} is not a COMMIT or ABORT marker")
                if marker.coordinator_epoch < coord_epoch:
                    raise InvalidRecordError(
                        f"transaction marker of producer {pid} has coordinator epoch "
                        f"{marker.coordinator_epoch}, older than {coord_epoch}")
                seen[pid] = (epoch, marker.coordinator_epoch, False,
                             last_seq if epoch == cur_epoch else -1)
            else:
                transactional = bool(int(b["attributes"]) & _ATTR_TRANSACTIONAL)
                if open_txn and not transactional:
                    raise InvalidRecordError(
                        f"non-transactional batch of producer {pid} while its transaction is open")
                base_seq = int(b["base_sequence"])
                if check_sequences:
                    _check_sequence(pid, epoch, base_seq, cur_epoch, last_seq)
                seen[pid] = (epoch, coord_epoch, open_txn or transactional,
                             increment_sequence(base_seq, int(b["last_offset_delta"])))

    def find_duplicate(self, batches: np.ndarray) -> Optional[tuple[int, int, int]]:
        """Kafka's findDuplicateBatch: when an append is a data batch its producer already
        wrote (same epoch and sequences as its last batch: a retry after a lost
        acknowledgement), ``(first offset, last offset, max timestamp)`` it got then, and
        nothing is written; None otherwise. Only the last batch of each producer is known
        (Kafka keeps five in memory, one in its snapshots)."""
        rows = _producer_rows(batches)
        if rows is None:
            return None
        for b in rows:
            if int(b["attributes"]) & _ATTR_CONTROL:
                continue
            e = self._producers.get(int(b["producer_id"]))
            delta = int(b["last_offset_delta"])
            if (e is None or e.last_data_offset < 0 or e.last_sequence < 0
                    or int(b["producer_epoch"]) != e.producer_epoch
                    or delta != e.last_offset_delta
                    or increment_sequence(int(b["base_sequence"]), delta) != e.last_sequence):
                continue
            if len(batches) != 1:
                raise InvalidRecordError(
                    f"a batch producer {e.producer_id} already wrote (sequences up to "
                    f"{e.last_sequence}) is retried together with other batches")
            return e.last_data_offset - delta, e.last_data_offset, e.last_timestamp
        return None

    def update(self, buf, batches: np.ndarray, segment=None) -> list[AbortedTxn]:
        """Replay batches (headers as scanned from ``buf``) in order. Aborted transactions that
        complete here are returned and, given ``segment``, appended to its ``.txnindex``."""
        aborted: list[AbortedTxn] = []
        rows = _producer_rows(batches)
        if rows is not None:
            for b in rows:
                txn = self._update_one(buf, b)
                if txn is None:
                    continue
                if txn.is_aborted:
                    entry = AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                                       self._last_stable_offset(txn))
                    if segment is not None:
                        segment.txn_index.append(entry)
                    aborted.append(entry)
                self._set_ongoing(txn.first_offset, None)  # Kafka's completeTxn
        if len(batches):
            self.map_end_offset = int(batches["last_offset"][-1]) + 1
        return aborted

    def _update_one(self, buf, b) -> Optional[CompletedTxn]:
        pid = int(b["producer_id"])
        entry = self._producers.get(pid)
        if entry is None:
            entry = self._producers[pid] = ProducerStateEntry(pid)
        epoch = int(b["producer_epoch"])
        if int(b["attributes"]) & _ATTR_CONTROL:
            marker = _read_marker(buf, int(b["position"]), int(b["size"]))
            if marker is None:
                return None  # an empty control batch: its transaction was cleaned away
            if marker.control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
                log.warning("ignoring control batch of type %d of producer %d at offset %d",
                            marker.control_type, pid, int(b["base_offset"]))
                return None
            entry.maybe_update_epoch(epoch)
            first = entry.current_txn_first_offset
            entry.current_txn_first_offset = -1
            entry.coordinator_epoch = marker.coordinator_epoch
            entry.last_timestamp = marker.timestamp
            if first < 0:
                return None  # an empty transaction: nothing to complete
            return CompletedTxn(pid, first, int(b["base_offset"]),
                                marker.control_type == ControlRecordType.ABORT)
        delta = int(b["last_offset_delta"])
        entry.maybe_update_epoch(epoch)
        base_seq = int(b["base_sequence"])
        entry.last_sequence = -1 if base_seq < 0 else increment_sequence(base_seq, delta)
        entry.last_data_offset = int(b["last_offset"])
        entry.last_offset_delta = delta
        entry.last_timestamp = int(b["max_timestamp"])
        if int(b["attributes"]) & _ATTR_TRANSACTIONAL and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = int(b["base_offset"])
            self._set_ongoing(entry.current_txn_first_offset, pid)
        return None

    # -- rebuilding -------------------------------------------------------------------------
    @classmethod
    def rebuild(cls, segments, *, start: Optional["ProducerStateManager"] = None,
                from_offset: int = 0, rewrite_txn_index=(),
                fill_missing_txn_index: bool = False,
                log_end_offset: Optional[int] = None) -> "ProducerStateManager":
        """Replay the batch headers of the segments in order, from ``start`` (a snapshot's
        state, default empty) and only the batches at or after ``from_offset`` (its offset).
        Segments whose base offset is in ``rewrite_txn_index`` (their index was reset by
        recovery) get the aborted transactions completed in them appended; with
        ``fill_missing_txn_index`` so does any segment replayed whole that has no ``.txnindex``
        file although aborted transactions complete in it. ``log_end_offset``, when the caller
        knows it, spares looking it up; a snapshot at it leaves nothing to replay."""
        psm = cls() if start is None else start
        rewrite = set(rewrite_txn_index)
        end = log_end_offset
        if end is not None and from_offset >= end:
            segments = ()  # a clean close's snapshot at the log end: no header is read
        for i, seg in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1].base_offset <= from_offset:
                continue  # wholly below the snapshot
            buf, batches = seg.read_batch_headers()
            if len(batches) and from_offset > seg.base_offset:
                batches = batches[batches["last_offset"] >= from_offset]
            if not len(batches):
                continue
            if seg.base_offset in rewrite:
                psm.update(buf, batches, seg)
                continue
            aborted = psm.update(buf, batches)
            if (aborted and fill_missing_txn_index and seg.base_offset >= from_offset
                    and not seg.txn_index.exists):
                log.warning("writing the %d aborted transactions missing from %s", len(aborted),
                            seg.txn_index.path)
                for t in aborted:
                    seg.txn_index.append(t)
        if end is None and segments:
            end = segments[-1].read_next_offset()
        if end is not None:
            psm.map_end_offset = max(psm.map_end_offset, end)
        return psm

    # -- snapshots --------------------------------------------------------------------------
    def snapshot_bytes(self) -> bytes:
        """The state in Kafka's producer snapshot layout (version 1, REF §2.5)."""
        body = bytearray(struct.pack(">i", len(self._producers)))
        for pid in sorted(self._producers):
            e = self._producers[pid]
            body += SNAPSHOT_ENTRY.pack(pid, e.producer_epoch, e.last_sequence, e.last_data_offset,
                                        e.last_offset_delta, e.last_timestamp,
                                        e.coordinator_epoch, e.current_txn_first_offset)
        crc = _core.crc32c(bytes(body))
        return struct.pack(">hI", SNAPSHOT_VERSION, crc) + bytes(body)

    @classmethod
    def from_snapshot_bytes(cls, data: bytes, path: str = "<snapshot>") -> "ProducerStateManager":
        """Parse a snapshot; CorruptIndexError on a bad version, CRC or length.

        As Kafka's readSnapshot: the schema read needs ``count`` whole entries but never checks
        that they end the file, and the CRC covers every byte after byte 6; so bytes after the
        entries are accepted when the CRC covers them (and refused by it otherwise)."""
        if len(data) < SNAPSHOT_HEADER.size:
            raise CorruptIndexError(f"producer snapshot {path} is too short ({len(data)} bytes)")
        version, crc, count = SNAPSHOT_HEADER.unpack_from(data)
        end = SNAPSHOT_HEADER.size + count * SNAPSHOT_ENTRY.size
        if count < 0 or len(data) < end:
            raise CorruptIndexError(f"producer snapshot {path}: {count} entries do not fit in "
                                    f"{len(data)} bytes")
        if version != SNAPSHOT_VERSION:
            raise CorruptIndexError(f"producer snapshot {path} has unknown version {version}")
        if _core.crc32c(data[6:]) != crc:
            raise CorruptIndexError(f"producer snapshot {path} fails its CRC check")
        psm = cls()
        for fields in SNAPSHOT_ENTRY.iter_unpack(data[SNAPSHOT_HEADER.size:end]):
            e = ProducerStateEntry(*fields)
            if e.last_data_offset < 0:
                # Kafka keeps the batch (last sequence, offset delta) only when last_offset >= 0;
                # without one its entry reports sequence -1 and delta 0 (ProducerStateEntry)
                e.last_sequence, e.last_offset_delta = -1, 0
            psm._producers[e.producer_id] = e
            if e.current_txn_first_offset >= 0:
                psm._set_ongoing(e.current_txn_first_offset, e.producer_id)
        return psm


def _producer_rows(batches: np.ndarray) -> Optional[np.ndarray]:
    """The v2 batches that carry a producer id, or None (all others leave the state alone).
    Every append asks, so a single batch is checked with scalar reads (a vector comparison on
    a structured array costs microseconds)."""
    n = len(batches)
    if n == 1:
        if int(batches["producer_id"][0]) >= 0 and int(batches["magic"][0]) >= 2:
            return batches
        return None
    if n == 0:
        return None
    pids = batches["producer_id"]
    if pids.max() < 0:
        return None
    return batches[(pids >= 0) & (batches["magic"] >= 2)]


def stamp_log_append_time(batch: bytearray, now: int) -> bytearray:
    """Mark a v2 batch LogAppendTime in place (attribute bit 3, maxTimestamp = ``now``) and give
    it a fresh CRC; used for control batches, whose bytes cannot be re-encoded as data."""
    attrs = struct.unpack_from(">h", batch, 21)[0] | 0x08
    struct.pack_into(">h", batch, 21, attrs)
    struct.pack_into(">q", batch, 35, now)
    struct.pack_into(">I", batch, 17, _core.crc32c(bytes(batch[21:])))
    return batch


__all__ = ["AbortedTxn", "CompletedTxn", "ProducerStateEntry", "ProducerStateManager",
           "increment_sequence", "stamp_log_append_time", "check_producer_fields",
           "check_marker_fields", "in_sequence"]


def _check_sequence(pid: int, epoch: int, base_seq: int, cur_epoch: int, last_seq: int) -> None:
    if base_seq < 0:
        raise InvalidRecordError(f"invalid sequence number {base_seq} in a batch of producer "
                                 f"{pid}: an idempotent batch needs one")
    if epoch != cur_epoch:
        if base_seq != 0 and cur_epoch != -1:
            raise InvalidRecordError(
                f"out of order sequence number for producer {pid}: epoch {epoch} is new, its "
                f"first batch must have sequence 0, not {base_seq}")
    elif not in_sequence(last_seq, base_seq):
        raise InvalidRecordError(
            f"out of order sequence number for producer {pid} at epoch {epoch}: {base_seq} "
            f"does not follow {last_seq}")


def has_producer_batches(batches: np.ndarray) -> bool:
    """Whether any of ``batches`` (v2 headers) carries a producer id, i.e. changes the state."""
    rows = _producer_rows(batches)
    return rows is not None and len(rows) > 0


def check_producer_fields(producer_id, producer_epoch, base_sequence,
                          is_transactional=False, control: bool = False) -> None:
    """A batch's producer fields as Kafka's header holds them (int64, int16, int32) and as its
    record builder allows them (MemoryRecordsBuilder.validateProducerState), or
    InvalidRecordError naming the field."""
    if is_transactional is not False and is_transactional is not True \
            and not isinstance(is_transactional, np.bool_):
        # Any other truthy value ("false", 1.5) would write a transactional batch.
        raise InvalidRecordError(f"is_transactional must be a bool, got {is_transactional!r}")
    if type(producer_id) is type(producer_epoch) is type(base_sequence) is int \
            and producer_id == producer_epoch == base_sequence == -1 \
            and not is_transactional and not control:
        return  # the defaults: no producer (every plain append)
    for name, value, bits in (("producer_id", producer_id, 64),
                              ("producer_epoch", producer_epoch, 16),
                              ("base_sequence", base_sequence, 32)):
        if not is_int(value) or not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            raise InvalidRecordError(f"{name} must be an int of {bits} signed bits, got {value!r}")
    if producer_id < -1:
        raise InvalidRecordError(f"producer_id must be -1 (none) or a producer id >= 0, got "
                                 f"{producer_id}")
    if producer_id == -1:
        if is_transactional or control:
            raise InvalidRecordError("a transactional batch or marker needs a producer_id >= 0")
        return
    if producer_epoch < 0:
        raise InvalidRecordError(f"producer {producer_id} needs a producer_epoch >= 0, got "
                                 f"{producer_epoch}")
    if base_sequence < 0 and not control:
        raise InvalidRecordError(f"producer {producer_id} needs a base_sequence >= 0, got "
                                 f"{base_sequence}")


def check_marker_fields(control_type, producer_id, producer_epoch, coordinator_epoch) -> None:
    """``append_control``'s arguments, or InvalidRecordError naming the bad one (Kafka: "End
    transaction marker requires a valid producerId")."""
    if not is_int(control_type) or control_type not in (ControlRecordType.ABORT,
                                                        ControlRecordType.COMMIT):
        raise InvalidRecordError(f"control_type must be ControlRecordType.ABORT (0) or COMMIT "
                                 f"(1), got {control_type!r}")
    if not is_int(coordinator_epoch) or not -(1 << 31) <= coordinator_epoch < 1 << 31:
        raise InvalidRecordError(f"coordinator_epoch must be an int of 32 signed bits, got "
                                 f"{coordinator_epoch!r}")
    check_producer_fields(producer_id, producer_epoch, -1, control=True)


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    """Kafka's ProducerStateEntry.inSequence: the next batch follows ``last_sequence``
    (wrapping from 2^31-1 to 0)."""
    return next_sequence == last_sequence + 1 or (next_sequence == 0
                                                  and last_sequence == _INT32_MAX)
