"""Review of the producer-snapshot and read_committed work (session 13).

Expectations are hand-derived from Kafka's rules (REF §3.6, §3.8, §4.2 step 11): the last stable
offset is the first offset of the oldest open transaction (at least the log start offset), else
the log end; read_committed returns the records below it whose transaction did not abort.
"""

from __future__ import annotations

from conftest import FakeClock
from segstore.config import TopicConfig
from segstore.log import PartitionLog
from segstore.records import ControlRecordType

ABORT = ControlRecordType.ABORT
T0 = 1_700_000_000_000


def open_log(path, **kw):
    return PartitionLog(str(path), "t", 0, TopicConfig.from_dict({}), FakeClock(T0), **kw)


def txn(lg, value, pid=7, seq=0):
    lg.append_batch([value], producer_id=pid, producer_epoch=0, base_sequence=seq,
                    is_transactional=True)


def values(recs):
    return [r.value for r in recs]


def committed_read_racing(lg, how, writer):
    """The values a read_committed ``read`` or ``read_columns`` of ``lg`` from 0 returns when
    ``writer(lg)`` runs between the read taking the log's state and reading the last stable
    offset (forced by running it from inside the read, once)."""
    orig, fired = lg._take_fresh_crc, []

    def writer_runs_now():
        if not fired:
            fired.append(1)
            writer(lg)
        return orig()

    lg._take_fresh_crc = writer_runs_now
    try:
        if how == "read":
            got = values(lg.read(0, isolation_level="read_committed"))
        else:
            got = list(lg.read_columns(0, isolation_level="read_committed").values.to_pylist())
    finally:
        lg._take_fresh_crc = orig
    assert fired
    return got


def test_read_committed_racing_a_roll_and_an_abort_never_returns_aborted_records(tmp_path):
    # The writer rolls and appends the ABORT between the reader taking the log's state and
    # reading the last stable offset. The ABORT's .txnindex entry is in a segment the reader's
    # state does not hold; the bound read after it already lets the aborted records through.
    def roll_and_abort(lg):
        lg.roll()
        lg.append_control(ABORT, producer_id=7, producer_epoch=0)

    for how in ("read", "read_columns"):
        lg = open_log(tmp_path / how)
        lg.append_batch([b"p0"])
        txn(lg, b"a1")
        lg.append_batch([b"p2"])
        got = committed_read_racing(lg, how, roll_and_abort)
        assert b"a1" not in got, got
        assert values(lg.read(0, isolation_level="read_committed")) == [b"p0", b"p2"]
        lg.close()


def build_retention_deleted_txn_start(lg):
    """Producer 7 opens a transaction at 0; its segment is deleted by retention."""
    txn(lg, b"a0")       # 0: opens the transaction
    lg.append_batch([b"p1"])
    lg.roll()            # segment 2
    lg.append_batch([b"p2"])
    lg.append_batch([b"p3"])
    lg.delete_records(2)
    lg.delete_segments([lg.segments[0]])


def test_truncate_after_a_checkpoint_and_retention_keeps_a_transaction_open(tmp_path):
    # A truncation that leaves no snapshot at or below its target must write one at the new end,
    # as Kafka's rebuildProducerState does; otherwise, once retention deletes the segment holding
    # the transaction's first batch, the next truncation rebuilds from the remaining segments and
    # forgets the open transaction (the last stable offset jumps to the log end).
    lg = open_log(tmp_path)
    txn(lg, b"a0")           # 0: opens producer 7's transaction
    lg.append_batch([b"p1"])
    for v in (b"p2", b"p3"):
        lg.roll()            # snapshots 2, 3
        lg.append_batch([v])
    lg.roll()                # snapshot 4
    lg.flush()
    lg.delete_old_snapshots()  # keeps 3 and 4 (as write_checkpoints does)
    lg.truncate_to(2)        # removes 3 and 4: no snapshot left
    assert lg.last_stable_offset == 0
    lg.append_batch([b"q2"])
    lg.append_batch([b"q3"])
    lg.delete_records(2)
    lg.delete_segments([lg.segments[0]])  # the segment with the transaction's first batch
    assert lg.last_stable_offset == 2
    lg.truncate_to(3)
    assert lg.last_stable_offset == 2  # the transaction is still open
    assert lg.read(2, isolation_level="read_committed") == []
    lg.close()


def test_read_only_log_knows_a_transaction_opened_in_a_deleted_segment(tmp_path):
    lg = open_log(tmp_path)
    build_retention_deleted_txn_start(lg)
    assert lg.last_stable_offset == 2
    assert lg.read(2, isolation_level="read_committed") == []
    ro = open_log(tmp_path, readonly=True, log_start_offset=2)
    assert ro.last_stable_offset == 2
    assert ro.read(2, isolation_level="read_committed") == []
    assert list(ro.iter_records(isolation_level="read_committed")) == []
    assert len(ro.read_columns(2, isolation_level="read_committed")) == 0
    # ... and its ABORT later hides the producer's remaining records (none here) but not others.
    lg.append_control(ABORT, producer_id=7, producer_epoch=0)
    assert values(ro.read(2, isolation_level="read_committed")) == [b"p2", b"p3"]
    assert values(lg.read(2, isolation_level="read_committed")) == [b"p2", b"p3"]
    ro.close()
    lg.close()


def test_read_committed_racing_a_new_transaction_stops_before_it(tmp_path):
    # The writer opens a transaction after the reader took the log's state: its records are
    # past that state, and the bound read afterwards stops there too.
    def open_a_transaction(lg):
        txn(lg, b"t1")
        lg.roll()
        lg.append_batch([b"p2"])

    for how in ("read", "read_columns"):
        lg = open_log(tmp_path / how)
        lg.append_batch([b"p0"])
        assert committed_read_racing(lg, how, open_a_transaction) == [b"p0"]
        assert values(lg.read(0, isolation_level="read_committed")) == [b"p0"]
        lg.close()
