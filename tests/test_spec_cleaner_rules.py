"""Spec-conformance audit of the cleaner (REF §6.3 - §6.15): rules the other cleaner tests did
not pin down, one test per rule, each named after it.

The §7 ports (test_cleaner.py, test_cleaner_manager.py, test_kafka_parity_cleaner.py) and the
independent model of a round (test_cleaner_review.py) already fix the retain/discard decisions
record by record; the tests here look at what those compare less closely: which timestamp the
max/min compaction lags read, the header fields of rebuilt and empty batches, the delete horizon
a rebuilt batch carries, control batches that are not transaction markers, and the dates of
cleaned segments. Times come from a FakeClock; nothing sleeps.
"""

from __future__ import annotations

import os
import struct

import crc32c
import pytest

import segstore
from conftest import FakeClock, batch_spans, fix_crc, v2_header
from segstore import _core
from segstore.records import ControlRecordType

T0 = 1_700_000_000_000
ATTR_GZIP = 0x01
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40


@pytest.fixture
def clock():
    return FakeClock(T0)


@pytest.fixture
def store(tmp_path, clock):
    # A small offset map: a 128 MiB one is zeroed every round.
    s = segstore.open(str(tmp_path / "s"), clock=clock,
                      config={"log.cleaner.dedupe.buffer.size": 24 * 4096})
    yield s
    s.close()


def compacted(store, **cfg):
    conf = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0,
            "delete.retention.ms": 1000}
    conf.update({k.replace("_", "."): v for k, v in cfg.items()})
    store.create_topic("t", 1, config=conf)
    return store.partition("t", 0)


def batches(lg) -> list[dict]:
    """Every batch header of the log's files, parsed with struct alone."""
    out = []
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()
        for pos, size in batch_spans(data):
            h = v2_header(data, pos)
            h["size"], h["bytes"] = size, data[pos:pos + size]
            h["last_offset"] = h["base_offset"] + h["last_offset_delta"]
            out.append(h)
    return out


def records(lg) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp) for r in lg.iter_records()]


# -- §6.3 LogCleanerManager: the compaction lags ---------------------------------------------------

def test_max_compaction_lag_due_time_is_the_first_batchs_max_timestamp(store, clock):
    """REF §6.3 (KIP-354): a dirty segment's age is its *first batch's* maxTimestamp: not the
    first record's timestamp, not an older batch later in the segment, not the file's mtime."""
    lag = 10_000
    lg = compacted(store, min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=lag)
    # First batch: records at T0 and T0 + 5000, so its maxTimestamp is T0 + 5000.
    lg.append_batch([b"a", b"b"], keys=[b"k0", b"k1"], timestamps_ms=[T0, T0 + 5000])
    lg.append_batch([b"c"], keys=[b"k0"], timestamps_ms=[T0 - 50_000])   # older, not first
    lg.roll()
    lg.segments[0].set_last_modified(T0 - 10 ** 9)                      # mtime: irrelevant
    lg.append_batch([b"d"], keys=[b"k2"], timestamps_ms=[T0 + 6000])   # the active segment
    mgr = store.cleaner_manager
    assert mgr.log_to_clean(lg, None, T0 + 5000 + lag).compaction_delay_ms == 0
    ltc = mgr.log_to_clean(lg, None, T0 + 5000 + lag + 1)
    assert ltc.compaction_delay_ms == 1 and ltc.overdue


def test_max_compaction_lag_skips_first_batch_timestamps_not_above_zero(store, clock):
    """REF §6.3: first-batch timestamps <= 0 are left out (Kafka filters ``_ > 0``); the
    earliest of the others decides."""
    lag = 1000
    lg = compacted(store, min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=lag)
    lg.append_batch([b"a"], keys=[b"k0"], timestamps_ms=[0])        # segment 0: timestamp 0
    lg.roll()
    lg.append_batch([b"b"], keys=[b"k1"], timestamps_ms=[-1])       # segment 1: no timestamp
    lg.roll()
    lg.append_batch([b"c"], keys=[b"k2"], timestamps_ms=[T0 - 3000])  # segment 2
    lg.roll()
    lg.append_batch([b"d"], keys=[b"k3"], timestamps_ms=[T0])         # active
    assert store.cleaner_manager.log_to_clean(lg, None, T0).compaction_delay_ms == 2000


def test_min_compaction_lag_reads_largest_timestamps_of_dirty_segments_only(store, clock):
    """REF §6.3: a sealed segment bounds the range when its *largest* timestamp is younger
    than min.compaction.lag.ms, wherever that record sits in it; segments before the first
    dirty offset are not looked at."""
    lag = 1000
    lg = compacted(store, min_compaction_lag_ms=lag)
    # Segment 0 (cleaned below): young. Segment 1: old first batch, young one in the middle.
    lg.append_batch([b"a"], keys=[b"k0"], timestamps_ms=[T0])
    lg.roll()
    lg.append_batch([b"b"], keys=[b"k1"], timestamps_ms=[T0 - 10 * lag])
    lg.append_batch([b"c"], keys=[b"k2"], timestamps_ms=[T0 - 1])
    lg.append_batch([b"d"], keys=[b"k3"], timestamps_ms=[T0 - 10 * lag])
    lg.roll()
    lg.append_batch([b"e"], keys=[b"k4"], timestamps_ms=[T0 - 10 * lag])
    lg.roll()
    lg.append_batch([b"f"], keys=[b"k5"], timestamps_ms=[T0])            # active, base 5
    mgr = store.cleaner_manager
    # From offset 0, segment 0 itself is young: nothing is cleanable.
    assert mgr.log_to_clean(lg, None, T0 + lag - 1).first_uncleanable_offset == 0
    # From offset 1, segment 0 no longer counts; segment 1 is young until T0 - 1 + lag.
    assert mgr.log_to_clean(lg, 1, T0 - 1 + lag - 1).first_uncleanable_offset == 1
    ltc = mgr.log_to_clean(lg, 1, T0 - 1 + lag)
    assert (ltc.uncleanable_offset, ltc.first_uncleanable_offset) == (5, 5)


def test_min_compaction_lag_of_a_segment_without_timestamps_goes_by_its_mtime(store, clock):
    """REF §6.3 with LogSegment.largestTimestamp: a segment none of whose records has a
    timestamp is as old as its file's last modification."""
    lag = 1000
    lg = compacted(store, min_compaction_lag_ms=lag)
    lg.append_batch([b"a", b"b"], keys=[b"k0", b"k0"], timestamps_ms=[-1, -1])
    lg.roll()
    lg.append_batch([b"c"], keys=[b"k1"], timestamps_ms=[-1])
    lg.segments[0].set_last_modified(T0 - 100)
    mgr = store.cleaner_manager
    assert mgr.log_to_clean(lg, None, T0 - 100 + lag - 1).cleanable_bytes == 0
    assert mgr.log_to_clean(lg, None, T0 - 100 + lag).cleanable_bytes == lg.segments[0].size


# -- §6.8 cleanInto: rebuilt batches and the delete horizon ----------------------------------------

def test_rebuilt_batch_without_tombstones_starts_at_its_first_retained_timestamp(store, clock):
    """REF §6.8 (buildRetainedRecordsInto): a batch rebuilt with no tombstone gets no delete
    horizon; its baseTimestamp is the first retained record's timestamp and its maxTimestamp
    the largest retained one, the absolute timestamps unchanged."""
    lg = compacted(store)
    lg.append_batch([b"a", b"b", b"c"], keys=[b"k0", b"k1", b"k2"],
                    timestamps_ms=[T0 - 300, T0 - 100, T0 - 200])
    lg.append_batch([b"a2"], keys=[b"k0"], timestamps_ms=[T0 - 500])
    lg.roll()
    store.compact("t", 0, force=True)
    b = batches(lg)[0]
    assert (b["base_offset"], b["last_offset"], b["records_count"]) == (0, 2, 2)
    assert b["attributes"] == 0                     # no horizon bit: nothing to delete later
    assert (b["base_timestamp"], b["max_timestamp"]) == (T0 - 100, T0 - 100)
    assert [(o, k, t) for o, k, _, t in records(lg)] == \
        [(1, b"k1", T0 - 100), (2, b"k2", T0 - 200), (3, b"k0", T0 - 500)]


def test_rebuilt_batch_keeps_its_existing_delete_horizon(store, clock):
    """REF §6.8: a batch that already has a horizon keeps it when a later cleaning rebuilds it
    (a record superseded meanwhile); a new horizon is stamped only on a batch without one."""
    dr = 60_000
    lg = compacted(store, delete_retention_ms=dr)
    lg.append_batch([b"a", None], keys=[b"k0", b"k1"], timestamps_ms=[T0 - 2, T0 - 1])
    lg.roll()
    store.compact("t", 0, force=True)                 # stamps T0 + dr
    first = batches(lg)[0]
    assert first["attributes"] & ATTR_DELETE_HORIZON and first["base_timestamp"] == T0 + dr
    clock.advance(dr // 2)
    lg.append_batch([b"a2"], keys=[b"k0"], timestamps_ms=[clock.now])
    lg.roll()
    store.compact("t", 0, force=True)                 # k0 superseded: the batch is rebuilt
    b = batches(lg)[0]
    assert (b["base_offset"], b["last_offset"], b["records_count"]) == (0, 1, 1)
    assert b["attributes"] & ATTR_DELETE_HORIZON
    assert b["base_timestamp"] == T0 + dr             # not now + dr
    assert b["max_timestamp"] == T0 - 1
    assert records(lg)[0] == (1, b"k1", None, T0 - 1)
    clock.now = T0 + dr
    lg.append_batch([b"x"], keys=[b"k9"])
    lg.roll()
    store.compact("t", 0, force=True)
    assert [k for _, k, _, _ in records(lg)] == [b"k0", b"k9"]


def test_log_append_time_batch_stamped_with_a_horizon_keeps_its_append_time(store, clock):
    """REF §6.8 / §1.5: stamping a LogAppendTime batch moves its baseTimestamp to the horizon
    but keeps maxTimestamp, the append time every record reports."""
    dr = 5000
    lg = compacted(store, delete_retention_ms=dr, message_timestamp_type="LogAppendTime")
    lg.append_batch([b"a", None], keys=[b"k0", b"k1"])      # appended at T0
    lg.roll()
    clock.advance(10)
    store.compact("t", 0, force=True)
    b = batches(lg)[0]
    assert b["attributes"] == ATTR_LOG_APPEND_TIME | ATTR_DELETE_HORIZON
    assert (b["base_timestamp"], b["max_timestamp"]) == (T0 + 10 + dr, T0)
    assert [(o, t) for o, _, _, t in records(lg)] == [(0, T0), (1, T0)]


def test_tombstones_of_v2_batches_ignore_the_segment_mtime_rule(store, clock):
    """REF §6.10: the legacy rule (a segment's mtime against the last clean segment's mtime
    minus delete.retention.ms) is for magic 0/1 only; a v2 tombstone in a segment dated long
    before that horizon is kept and stamped by its first cleaning."""
    dr = 1000
    lg = compacted(store, delete_retention_ms=dr)
    lg.append_batch([b"a"], keys=[b"k0"])
    lg.roll()
    store.compact("t", 0, force=True)                  # a clean section, dated T0
    lg.append_batch([None], keys=[b"k1"], timestamps_ms=[T0 - 10 ** 9])
    lg.roll()
    lg.segments[1].set_last_modified(T0 - 10 ** 9)     # legacy rule: "discarding deletes"
    clock.advance(1)
    store.compact("t", 0, force=True)
    assert [(o, k, v) for o, k, v, _ in records(lg)] == [(0, b"k0", b"a"), (1, b"k1", None)]
    tomb = batches(lg)[-1]
    assert tomb["attributes"] & ATTR_DELETE_HORIZON and tomb["base_timestamp"] == T0 + 1 + dr


def test_empty_header_of_a_producers_last_batch(store, clock):
    """REF §6.8: a live producer's last batch whose records all go stays as a 61-byte header:
    same offsets, producer fields, leader epoch and transactional flag, codec none, no
    horizon bit (though the batch had one), baseTimestamp -1, maxTimestamp kept, 0 records."""
    dr = 1000
    lg = compacted(store, delete_retention_ms=dr)
    lg.append_batch([b"a", None], keys=[b"k0", b"k1"], timestamps_ms=[T0 - 7, T0 - 5],
                    compression="gzip", producer_id=5, producer_epoch=3, base_sequence=0,
                    is_transactional=True)
    lg.append_control(ControlRecordType.COMMIT, producer_id=5, producer_epoch=3)
    lg.append_batch([b"a2"], keys=[b"k0"], timestamps_ms=[T0])
    lg.roll()
    # Producer 5's last data batch is the gzip one (offsets 0-1): retained even when empty.
    before = batches(lg)[0]
    store.compact("t", 0, force=True)      # k0 superseded; the tombstone stamped
    b = batches(lg)[0]
    assert b["attributes"] == ATTR_GZIP | ATTR_TRANSACTIONAL | ATTR_DELETE_HORIZON
    assert b["records_count"] == 1
    clock.advance(dr)                      # past the horizon: the tombstone goes too
    lg.append_batch([b"z"], keys=[b"k9"])
    lg.roll()
    store.compact("t", 0, force=True)
    e = batches(lg)[0]
    assert (e["base_offset"], e["last_offset"]) == (before["base_offset"], before["last_offset"])
    assert (e["size"], e["records_count"], e["base_timestamp"]) == (61, 0, -1)
    assert e["max_timestamp"] == before["max_timestamp"] == T0 - 5
    assert e["attributes"] == ATTR_TRANSACTIONAL
    assert (e["producer_id"], e["producer_epoch"], e["base_sequence"]) == (5, 3, 0)
    assert e["partition_leader_epoch"] == before["partition_leader_epoch"]
    assert struct.unpack_from(">I", e["bytes"], 17)[0] == crc32c.crc32c(e["bytes"][21:])
    assert 0 not in [o for o, _, _, _ in records(lg)]


def _leader_change_batch(offset: int) -> bytes:
    """A KRaft LEADER_CHANGE control batch (type 2, no producer): a COMMIT marker's bytes with
    the key's type and the producer fields patched."""
    b = bytearray(_core.encode_control_batch(ControlRecordType.COMMIT, producer_id=0,
                                             producer_epoch=0, base_offset=offset,
                                             timestamp_ms=T0))
    assert b[66:70] == b"\x00\x00\x00\x01"          # the control key: version 0, type COMMIT
    b[69] = ControlRecordType.LEADER_CHANGE
    struct.pack_into(">qhi", b, 43, -1, -1, -1)     # producerId, producerEpoch, baseSequence
    fix_crc(b)
    return bytes(b)


def test_non_marker_control_batches_are_always_retained(store, clock):
    """REF §6.8/§6.9: a control batch other than COMMIT/ABORT is never discardable: it is
    copied verbatim by every cleaning, never stamped with a horizon, never removed."""
    lg = compacted(store, delete_retention_ms=1000)
    lg.append_batch([b"a"], keys=[b"k0"])
    lg.append_records(_leader_change_batch(0), origin="replication")
    lg.append_batch([b"a2"], keys=[b"k0"])
    lg.roll()
    original = [b for b in batches(lg) if b["attributes"] & ATTR_CONTROL]
    assert len(original) == 1
    for _ in range(3):
        store.compact("t", 0, force=True)
        clock.advance(10_000)
        lg.append_batch([b"f"], keys=[b"filler"])
        lg.roll()
    control = [b for b in batches(lg) if b["attributes"] & ATTR_CONTROL]
    assert [c["bytes"] for c in control] == [original[0]["bytes"]]


def test_marker_of_an_emptied_transaction_is_stamped_then_dropped_at_its_horizon(store, clock):
    """REF §6.8 (containsMarkerForEmptyTxn) and §6.9: a COMMIT marker stays unstamped through
    the cleaning that drops its transaction's data (that pass traversed the data); the next
    cleaning finds no data, so it rebuilds the marker's batch with a horizon of now +
    delete.retention.ms; the marker survives a cleaning at horizon - 1 and goes at the
    horizon (it is not its producer's last batch: a later transaction follows)."""
    dr = 5000
    lg = compacted(store, delete_retention_ms=dr)

    def txn(key, value, seq):
        lg.append_batch([value], keys=[key], producer_id=7, producer_epoch=0,
                        base_sequence=seq, is_transactional=True)
        return lg.append_control(ControlRecordType.COMMIT, producer_id=7,
                                 producer_epoch=0).first_offset

    def marker_batch():
        return [b for b in batches(lg) if b["base_offset"] == marker]

    def clean_at(now):
        clock.now = now
        lg.append_batch([b"f"], keys=[b"filler"])
        lg.roll()
        store.compact("t", 0, force=True)

    marker = txn(b"k0", b"a", 0)                     # data 0, marker 1
    lg.append_batch([b"a2"], keys=[b"k0"])          # 2: supersedes the transaction's data
    txn(b"k1", b"b", 1)                              # 3, 4: the producer's later transaction
    lg.roll()
    unstamped = marker_batch()[0]["bytes"]
    store.compact("t", 0, force=True)               # the data goes; the marker is kept as is
    assert 0 not in [o for o, _, _, _ in records(lg)]
    assert [b["bytes"] for b in marker_batch()] == [unstamped]
    clean_at(T0 + 1)                                 # no data left: stamped
    [m] = marker_batch()
    assert m["records_count"] == 1
    assert m["attributes"] == ATTR_TRANSACTIONAL | ATTR_CONTROL | ATTR_DELETE_HORIZON
    assert m["base_timestamp"] == T0 + 1 + dr
    clean_at(T0 + 1 + dr - 1)
    assert len(marker_batch()) == 1
    clean_at(T0 + 1 + dr)
    assert marker_batch() == []


# -- §6.7 cleanSegments ----------------------------------------------------------------------------

def test_cleaned_segment_takes_the_last_source_segments_mtime(store, clock):
    """REF §6.7 step 4: the segment a group is cleaned into is dated like the group's last
    source segment (retention by time and the legacy horizon go by it), not by the cleaning."""
    lg = compacted(store, segment_bytes=1 << 20)
    for i in range(3):
        lg.append_batch([b"v%d" % i], keys=[b"k%d" % (i % 2)])
        lg.roll()
    for i, seg in enumerate(lg.segments[:3]):
        seg.set_last_modified(T0 - 1000 * (10 - i))
    last_mtime = lg.segments[2].last_modified_ms
    clock.advance(50_000)
    store.compact("t", 0, force=True)
    assert [s.base_offset for s in lg.segments] == [0, 3]   # one group, one output segment
    assert lg.segments[0].last_modified_ms == last_mtime
    assert int(os.stat(lg.segments[0].log_path).st_mtime * 1000) == last_mtime


# -- segstore's purge rounds (design §5: tombstones never survive forever) -------------------------

def test_purge_round_is_due_only_for_what_a_round_can_remove(tmp_path, clock):
    """REF §6.3/§6.8 with segstore's purge rounds: a round removes a past-horizon tombstone
    only at offsets it maps or below the first dirty offset. A partial round (full map) leaves
    the first dirty offset inside a segment whose later tombstone it stamped; when that
    segment becomes uncleanable (min.compaction.lag.ms raised), no round can reach the
    tombstone, so the log is not due for a purge (it was picked again after every round, each
    rewriting the log unchanged). Once the segment is cleanable again, a round removes it."""
    st = segstore.open(str(tmp_path / "s"), clock=clock,
                       config={"log.cleaner.dedupe.buffer.size": 24 * 4,
                               "log.cleaner.io.buffer.load.factor": 0.75})   # 3 keys a round
    try:
        st.create_topic("t", 1, config={"cleanup.policy": "compact", "delete.retention.ms": 1000,
                                        "min.cleanable.dirty.ratio": 0.99})
        lg = st.partition("t", 0)
        for i in range(3):
            lg.append_batch([b"v"], keys=[b"k%d" % i], timestamps_ms=[T0])
        lg.append_batch([None], keys=[b"k9"], timestamps_ms=[T0])   # 3: past the full map
        lg.roll()
        lg.append_batch([b"x"], keys=[b"k0"], timestamps_ms=[T0])   # the active segment
        mgr = st.cleaner_manager
        ltc = mgr.grab_log(("t", 0), clock.now, force=True)   # one round (compact runs more)
        stats = st.cleaner.clean_log(-1, ltc, clock.now, raise_errors=True)
        assert (stats.map_full, stats.end_offset) == (True, 3)
        assert batches(lg)[3]["attributes"] & ATTR_DELETE_HORIZON  # stamped beyond the map
        st.alter_topic_config("t", set={"min.compaction.lag.ms": 10_000})
        clock.now = T0 + 2000                                       # horizon passed
        assert mgr.log_to_clean(lg, 3, clock.now).first_uncleanable_offset == 0
        assert mgr.grab_filthiest_compacted_log(clock.now) is None
        assert st.compact("t", 0) == []
        st.alter_topic_config("t", delete=["min.compaction.lag.ms"])
        [stats] = st.compact("t", 0)
        assert stats.end_offset == 4
        # The tombstone went; k0 at 4 is in the active segment, so k0 at 0 stays.
        assert [(o, k) for o, k, _, _ in records(lg)] == \
            [(0, b"k0"), (1, b"k1"), (2, b"k2"), (4, b"k0")]
        assert mgr.grab_filthiest_compacted_log(clock.now) is None
    finally:
        st.close()
