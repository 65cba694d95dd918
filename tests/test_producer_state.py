"""ProducerStateManager on its own: how batches and transaction markers change producer entries,
open transactions, the first unstable offset and the aborted-transaction entries (REF §2.5,
§3.2, §4.3), append validation, and Kafka's producer snapshot layout.

Inputs are batches made by ``_core``'s encoders; expectations come from Kafka's rules written out
by hand (ProducerAppendInfo / ProducerStateManager.lastStableOffset), snapshots are checked
against bytes packed with ``struct`` and checksummed by the ``crc32c`` package.
"""

from __future__ import annotations

import os
import struct

import crc32c
import pytest

from conftest import fix_crc
from segstore import _core
from segstore.errors import CorruptIndexError, InvalidRecordError
from segstore.producer_snapshots import (list_snapshots, snapshot_path, take_snapshot,
                                         write_snapshot)
from segstore.producer_state import ProducerStateEntry, ProducerStateManager, increment_sequence
from segstore.records import ControlRecordType
from segstore.transaction_index import AbortedTxn, TransactionIndex

T0 = 1_700_000_000_000
ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT


def data(base, n=1, pid=-1, epoch=-1, seq=-1, txn=False, ts=T0):
    return _core.encode_batch([b"v%d" % i for i in range(n)], timestamps_ms=[ts + i for i in range(n)],
                              base_offset=base, producer_id=pid, producer_epoch=epoch,
                              base_sequence=seq, is_transactional=txn)


def marker(base, kind, pid, epoch=0, coord=0, ts=T0):
    return _core.encode_control_batch(kind, producer_id=pid, producer_epoch=epoch,
                                      coordinator_epoch=coord, base_offset=base, timestamp_ms=ts)


def control_of_type(base, control_type, pid, epoch=0):
    """A marker batch whose key names another control type (bytes 68-69, REF §1.8, §9)."""
    b = bytearray(marker(base, COMMIT, pid, epoch))
    assert b[65] == 0x08 and b[66:70] == b"\x00\x00\x00\x01"  # key length 4, version 0, type 1
    struct.pack_into(">h", b, 68, control_type)
    fix_crc(b)
    return bytes(b)


def empty_control(base, pid, epoch=0):
    """A control batch the cleaner emptied: 61-byte header, zero records (REF §6.8)."""
    b = bytearray(marker(base, ABORT, pid, epoch)[:61])
    struct.pack_into(">i", b, 8, 61 - 12)
    struct.pack_into(">i", b, 57, 0)
    fix_crc(b)
    return bytes(b)


def feed(psm, *batches, segment=None):
    buf = b"".join(batches)
    return psm.update(buf, _core.scan_batches(buf).batches, segment)


def check(psm, *batches):
    buf = b"".join(batches)
    psm.validate(buf, _core.scan_batches(buf).batches)


class FakeSegment:
    def __init__(self, path):
        self.txn_index = TransactionIndex(path)


def test_data_batch_updates_the_entry():
    psm = ProducerStateManager()
    assert feed(psm, data(100, n=3, pid=5, epoch=2, seq=10)) == []
    e = psm.get(5)
    assert (e.producer_epoch, e.last_sequence, e.last_data_offset, e.last_offset_delta,
            e.last_timestamp, e.coordinator_epoch, e.current_txn_first_offset) == \
        (2, 12, 102, 2, T0 + 2, -1, -1)
    assert psm.active_producers() == {5: (102, 2)}
    assert psm.first_unstable_offset() is None and psm.map_end_offset == 103
    feed(psm, data(103, n=2, pid=5, epoch=2, seq=13, ts=T0 - 50))
    assert (psm.get(5).last_sequence, psm.get(5).last_data_offset, psm.get(5).last_timestamp) == \
        (14, 104, T0 - 49)


def test_sequence_wraps_like_kafka():
    assert increment_sequence(2**31 - 1, 1) == 0
    assert increment_sequence(2**31 - 2, 2) == 0 and increment_sequence(2**31 - 2, 3) == 1
    assert increment_sequence(5, 0) == 5 and increment_sequence(5, 4) == 9
    psm = ProducerStateManager()
    feed(psm, data(0, n=3, pid=1, epoch=0, seq=2**31 - 2))
    assert psm.get(1).last_sequence == 0
    feed(psm, data(3, n=2, pid=2, epoch=0))  # no sequence: -1
    assert psm.get(2).last_sequence == -1


def test_batches_without_producer_leave_the_state_alone():
    psm = ProducerStateManager()
    assert feed(psm, data(0, n=4), data(4, n=2)) == []
    assert len(psm) == 0 and psm.active_producers() == {} and psm.map_end_offset == 6


def test_transactions_open_at_their_first_batch_and_commit_writes_nothing(tmp_path):
    psm = ProducerStateManager()
    seg = FakeSegment(str(tmp_path / "t.txnindex"))
    feed(psm, data(0, n=3, pid=1, epoch=0, seq=0, txn=True), data(3, pid=1, epoch=0, seq=3, txn=True),
         data(4, pid=2, epoch=0, seq=0, txn=True), data(5, pid=3, epoch=0, seq=0), segment=seg)
    assert psm.get(1).current_txn_first_offset == 0  # the second batch does not move it
    assert psm.ongoing_transactions() == {0: 1, 4: 2}
    assert psm.first_unstable_offset() == 0
    assert feed(psm, marker(6, COMMIT, 1, coord=4, ts=T0 + 99), segment=seg) == []
    e = psm.get(1)
    assert (e.current_txn_first_offset, e.coordinator_epoch, e.last_timestamp,
            e.last_data_offset, e.last_sequence) == (-1, 4, T0 + 99, 3, 3)
    assert psm.first_unstable_offset() == 4
    assert not os.path.exists(tmp_path / "t.txnindex")  # a commit leaves no entry


def test_abort_entry_and_kafkas_last_stable_offset(tmp_path):
    psm = ProducerStateManager()
    seg = FakeSegment(str(tmp_path / "t.txnindex"))
    feed(psm, data(0, pid=1, epoch=0, txn=True), data(2, pid=2, epoch=0, txn=True),
         data(4, n=2, pid=3, epoch=0, txn=True), segment=seg)
    # the oldest transaction still open by another producer bounds the stable offsets
    assert feed(psm, marker(6, ABORT, 2), segment=seg) == [AbortedTxn(2, 2, 6, 0)]
    assert psm.first_unstable_offset() == 0
    assert feed(psm, marker(7, ABORT, 1), segment=seg) == [AbortedTxn(1, 0, 7, 4)]
    assert psm.first_unstable_offset() == 4
    # nothing else open: everything up to the marker is stable (marker + 1)
    assert feed(psm, marker(8, ABORT, 3), segment=seg) == [AbortedTxn(3, 4, 8, 9)]
    assert psm.first_unstable_offset() is None
    with open(tmp_path / "t.txnindex", "rb") as f:
        assert f.read() == b"".join(struct.pack(">hqqqq", 0, *t) for t in
                                    [(2, 2, 6, 0), (1, 0, 7, 4), (3, 4, 8, 9)])


def test_own_open_transaction_does_not_bound_its_abort():
    psm = ProducerStateManager()
    feed(psm, data(0, pid=1, epoch=0, txn=True), data(1, pid=2, epoch=0, txn=True))
    assert feed(psm, marker(2, ABORT, 2)) == [AbortedTxn(2, 1, 2, 0)]
    feed(psm, data(3, pid=2, epoch=0, txn=True))  # a new transaction after the abort
    assert psm.ongoing_transactions() == {0: 1, 3: 2}
    assert feed(psm, marker(4, ABORT, 1)) == [AbortedTxn(1, 0, 4, 3)]


def test_marker_without_open_transaction_completes_nothing():
    psm = ProducerStateManager()
    assert feed(psm, marker(0, ABORT, 9, epoch=3, coord=2)) == []
    e = psm.get(9)
    assert (e.producer_epoch, e.coordinator_epoch, e.last_data_offset, e.last_sequence) == \
        (3, 2, -1, -1)
    assert psm.active_producers() == {9: (-1, 3)}


def test_epoch_bump_forgets_the_last_batch():
    psm = ProducerStateManager()
    feed(psm, data(0, n=2, pid=4, epoch=0, seq=0, txn=True), marker(2, ABORT, 4, epoch=1))
    assert psm.active_producers() == {4: (-1, 1)}  # Kafka's maybeUpdateProducerEpoch
    assert psm.get(4).last_sequence == -1 and psm.get(4).last_offset_delta == 0
    feed(psm, data(3, pid=4, epoch=2, seq=0))
    assert psm.active_producers() == {4: (3, 2)}


def test_empty_control_batch_changes_nothing():
    psm = ProducerStateManager()
    assert feed(psm, empty_control(0, pid=6, epoch=2)) == []
    assert psm.active_producers() == {6: (-1, -1)}  # registered, as Kafka's update() does
    feed(psm, data(1, pid=7, epoch=0, txn=True), empty_control(2, pid=7))
    assert psm.first_unstable_offset() == 1 and psm.get(7).current_txn_first_offset == 1


def test_other_control_types_are_ignored_by_replay_and_rejected_on_append():
    psm = ProducerStateManager()
    feed(psm, data(0, pid=1, epoch=0, txn=True))
    leader_change = control_of_type(1, ControlRecordType.LEADER_CHANGE, pid=1)
    assert feed(psm, leader_change) == []
    assert psm.first_unstable_offset() == 0
    with pytest.raises(InvalidRecordError, match="not a COMMIT or ABORT"):
        check(psm, control_of_type(2, ControlRecordType.LEADER_CHANGE, pid=1))


def test_validate_rejects_what_kafkas_leader_rejects():
    psm = ProducerStateManager()
    feed(psm, data(0, pid=1, epoch=3, seq=0, txn=True), marker(1, COMMIT, 1, epoch=3, coord=5),
         data(2, pid=2, epoch=0, seq=0, txn=True))
    before = psm.producers
    check(psm, data(3, pid=1, epoch=3, seq=1), data(4, pid=1, epoch=4, seq=0, txn=True),
          data(5, pid=9, epoch=0, seq=7), data(6), marker(7, ABORT, 2, coord=0))
    with pytest.raises(InvalidRecordError, match="fenced"):
        check(psm, data(3, pid=1, epoch=2))
    with pytest.raises(InvalidRecordError, match="fenced"):
        check(psm, marker(3, ABORT, 1, epoch=2))
    with pytest.raises(InvalidRecordError, match="coordinator epoch"):
        check(psm, marker(3, ABORT, 1, epoch=3, coord=4))
    with pytest.raises(InvalidRecordError, match="transaction is open"):
        check(psm, data(3, pid=2, epoch=0))
    with pytest.raises(InvalidRecordError, match="transaction is open"):  # opened in the append
        check(psm, data(3, pid=1, epoch=3, seq=1, txn=True), data(4, pid=1, epoch=3, seq=2))
    with pytest.raises(InvalidRecordError, match="fenced"):  # bumped earlier in the append
        check(psm, data(3, pid=9, epoch=5, seq=0), data(4, pid=9, epoch=4, seq=0))
    check(psm, marker(3, COMMIT, 2), data(4, pid=2, epoch=0, seq=1))  # closed first: fine
    # Sequences (Kafka's checkSequence): one is needed, a new epoch starts at 0, and within
    # an epoch each batch follows the last (pid 2 is at 0).
    with pytest.raises(InvalidRecordError, match="invalid sequence number -1"):
        check(psm, data(3, pid=9, epoch=0))
    with pytest.raises(InvalidRecordError, match="epoch 1 is new"):
        check(psm, marker(3, COMMIT, 2), data(4, pid=2, epoch=1, seq=3))
    with pytest.raises(InvalidRecordError, match="2 does not follow 0"):
        check(psm, marker(3, COMMIT, 2), data(4, pid=2, epoch=0, seq=2))
    assert psm.producers == before  # validation changes nothing


def kafka_snapshot(entries) -> bytes:
    """Kafka's producer snapshot (REF §2.5) packed by hand: version 1, CRC-32C of the rest."""
    body = struct.pack(">i", len(entries)) + b"".join(struct.pack(">qhiqiqiq", *e) for e in entries)
    return struct.pack(">hI", 1, crc32c.crc32c(body)) + body


def snapshot_state():
    psm = ProducerStateManager()
    feed(psm, marker(0, COMMIT, 3, epoch=0, coord=5, ts=T0 + 1),
         data(5, n=3, pid=7, epoch=1, seq=2, txn=True, ts=T0))
    return psm


def test_snapshot_bytes_are_kafkas_layout():
    psm = snapshot_state()
    expected = kafka_snapshot([(3, 0, -1, -1, 0, T0 + 1, 5, -1),
                               (7, 1, 4, 7, 2, T0 + 2, -1, 5)])
    assert psm.snapshot_bytes() == expected
    assert len(expected) == 10 + 2 * 46
    assert ProducerStateManager().snapshot_bytes() == kafka_snapshot([])


def test_snapshot_round_trip():
    psm = snapshot_state()
    back = ProducerStateManager.from_snapshot_bytes(psm.snapshot_bytes())
    assert back.producers == psm.producers
    assert back.producers[7] == ProducerStateEntry(7, 1, 4, 7, 2, T0 + 2, -1, 5)
    assert back.ongoing_transactions() == {5: 7} and back.first_unstable_offset() == 5
    assert back.active_producers() == {3: (-1, 0), 7: (7, 1)}
    # a snapshot written by Kafka (hand-packed) loads the same way
    kafka = ProducerStateManager.from_snapshot_bytes(
        kafka_snapshot([(11, 2, 9, 40, 0, T0, 1, -1), (12, 0, 0, 41, 0, T0, -1, 41)]))
    assert kafka.active_producers() == {11: (40, 2), 12: (41, 0)}
    assert kafka.first_unstable_offset() == 41


@pytest.mark.parametrize("damage", ["crc", "version", "short", "count", "tiny"])
def test_damaged_snapshots_are_rejected(damage):
    good = bytearray(snapshot_state().snapshot_bytes())
    if damage == "crc":
        good[20] ^= 1
    elif damage == "version":
        struct.pack_into(">h", good, 0, 2)
    elif damage == "short":
        good = good[:-1]
        struct.pack_into(">I", good, 2, crc32c.crc32c(bytes(good[6:])))
    elif damage == "count":
        struct.pack_into(">i", good, 6, 3)
        struct.pack_into(">I", good, 2, crc32c.crc32c(bytes(good[6:])))
    else:
        good = good[:5]
    with pytest.raises(CorruptIndexError):
        ProducerStateManager.from_snapshot_bytes(bytes(good), "x.snapshot")


def test_write_snapshot_files(tmp_path):
    d = str(tmp_path)
    psm = snapshot_state()
    path = write_snapshot(psm, d, 8)
    assert path == snapshot_path(d, 8) == os.path.join(d, "00000000000000000008.snapshot")
    with open(path, "rb") as f:
        assert f.read() == psm.snapshot_bytes()
    assert psm.last_snapshot_offset == 8
    # Kafka's takeSnapshot: nothing at or below the last snapshot's offset; older ones stay
    assert take_snapshot(psm, d, 8) is None and take_snapshot(psm, d, 3) is None
    take_snapshot(psm, d, 9)
    assert list(list_snapshots(d)) == [8, 9] and sorted(os.listdir(d)) == [
        "00000000000000000008.snapshot", "00000000000000000009.snapshot"]
    # an empty state is written too (Kafka's snapshots at every roll hold no producers then)
    empty = ProducerStateManager()
    assert take_snapshot(empty, d, 10) == snapshot_path(d, 10)
    assert open(snapshot_path(d, 10), "rb").read() == kafka_snapshot([])


def test_clear():
    psm = snapshot_state()
    psm.clear(42)
    assert len(psm) == 0 and psm.first_unstable_offset() is None and psm.map_end_offset == 42
    assert psm.ongoing_transactions() == {}
