"""Kafka parity, cleaner and cleaner manager: the edge cases of REF §7 #31-#57 and the §8 pain
points that the ports in test_cleaner.py / test_cleaner_manager.py / test_cleaner_service.py do
not already pin down (the audit's table is in the session's report).

Expectations come from what each test appended: the latest record per key is computed by a
plain replay (:func:`replay`), offsets by hand. Time moves only through a FakeClock.
"""

from __future__ import annotations

import logging
import os

import pytest

from conftest import FakeClock
from segstore import TopicPartition
from segstore.checkpoint import CLEAN_SHUTDOWN_FILE
from segstore.transaction_index import collect_aborted_transactions
from test_cleaner import (T0, abort, all_batches, compacted_topic, kv, last_offsets,
                          last_sequences, make_cleaner, log_to_clean, open_store, records,
                          txn_store, Producer)

TP = TopicPartition("t", 0)


@pytest.fixture
def clock():
    return FakeClock(T0)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


def replay(recs) -> list[tuple]:
    """The compacted result a plain replay gives: the last record of every key, in offset
    order (tombstones included; the caller's horizon has not passed)."""
    last = {}
    for off, k, _ in recs:
        last[k] = off
    return [r for r in recs if last[r[1]] == r[0]]


# -- KAFKA-3587 / KAFKA-3894, #40/#46: the map fills in the middle of a batch -----------------

def test_map_full_inside_a_batch_ends_the_round_inside_it(root, clock):
    """KAFKA-3587/KAFKA-3894 (LogCleanerTest.testPartialSegmentClean, with multi-record batches):
    the map stops at the first keyed record that finds it full, even one whose key is already
    mapped (REF §6.5), so a round's end offset can lie inside a batch; the next round maps from
    there, and the rounds together give the replay's result."""
    st = open_store(root, clock, log_cleaner_dedupe_buffer_size=24 * 4,
                    log_cleaner_io_buffer_load_factor=0.75)          # 3 keys per round
    lg = compacted_topic(st, segment_bytes=1 << 20)
    lg.append_batch([b"a0", b"b1", b"c2", b"a3", b"d4"], keys=[b"a", b"b", b"c", b"a", b"d"])
    lg.append_batch([b"b5", b"e6"], keys=[b"b", b"e"])
    lg.roll()
    original = records(lg)
    rounds = st.compact("t", 0, force=True)
    # a, b, c fill the map; a@3 stops the round (its key is mapped, but the map is full), so
    # the first round ends at 3, inside the first batch: nothing at or above it is dropped.
    # The second maps a@3, d@4, b@5 and stops at e@6, inside the second batch.
    assert [(s.end_offset, s.map_full) for s in rounds] == [(3, True), (6, True), (7, False)]
    assert records(lg) == replay(original) == [(2, b"c", b"c2"), (3, b"a", b"a3"),
                                               (4, b"d", b"d4"), (5, b"b", b"b5"),
                                               (6, b"e", b"e6")]
    b = all_batches(lg)
    assert [(x["base_offset"], x["last_offset_delta"], x["records_count"]) for x in b] == \
        [(0, 4, 3), (5, 1, 2)]


def test_first_round_of_a_mid_batch_map_drops_nothing_above_its_end(root, clock):
    """#40 by hand: the first round of the case above, alone. Records above the map's latest
    offset are retained whatever the map says of their keys (REF §6.8's offset > latestOffset
    row), and the round's checkpoint is the offset inside the batch."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=1 << 20)
    lg.append_batch([b"a0", b"b1", b"c2", b"a3", b"d4"], keys=[b"a", b"b", b"c", b"a", b"d"])
    lg.roll()
    before = records(lg)
    cleaner = make_cleaner(clock, slots=4, load_factor=0.75)
    end, stats = cleaner.clean(log_to_clean(st, lg, 0, T0), T0)
    assert (end, stats.map_full, cleaner.offset_map.latest_offset) == (3, True, 2)
    assert records(lg) == before
    end, stats = cleaner.clean(log_to_clean(st, lg, end, T0), T0)
    assert (end, stats.map_full) == (5, False)
    assert records(lg) == replay(before)


# -- KAFKA-13727: partial cleaning and the transaction index ----------------------------------

def test_partial_round_keeps_the_index_entry_of_an_abort_beyond_the_map(root, clock):
    """KAFKA-13727 (LogCleanerTest.testAbortedTxnSpanningSegmentsWithPartialClean family): the
    map fills before an aborted transaction that lies in the same segment, further on. The
    round rewrites that whole segment, so it must still know the transaction is aborted: its
    data goes (the producer's last batch stays as an empty header), its ABORT marker and its
    .txnindex entry stay, and a read_committed reader never sees the aborted values."""
    st, lg = txn_store(root, clock, segment_bytes=1 << 20)
    for k in (0, 1, 2):
        lg.append_batch([kv(k)], keys=[kv(k)])                      # 0, 1, 2
    p = Producer(lg, 1)
    p([7])                                                           # 3, aborted
    p([8])                                                           # 4, aborted
    abort(lg, 1)                                                     # 5
    lg.append_batch([b"late"], keys=[kv(0)])                         # 6
    lg.roll()
    entry = [(t.producer_id, t.first_offset, t.last_offset)
             for t in collect_aborted_transactions(lg.segments, 0, lg.log_end_offset)]
    assert entry == [(1, 3, 5)]
    cleaner = make_cleaner(clock, slots=3, load_factor=0.75)         # 2 keys: ends at 2
    end, stats = cleaner.clean(log_to_clean(st, lg, 0, T0), T0)
    assert stats.map_full and end == 2
    assert [(t.producer_id, t.first_offset, t.last_offset)
            for t in collect_aborted_transactions(lg.segments, 0, lg.log_end_offset)] == entry
    assert last_offsets(lg) == [0, 1, 2, 4, 5, 6]     # batch 3 gone, 4 an empty header
    assert [b["records_count"] for b in all_batches(lg)] == [1, 1, 1, 0, 1, 1]
    assert last_sequences(lg) == {1: 1}
    committed = [(r.offset, r.key) for r in lg.iter_records(isolation_level="read_committed")]
    assert committed == [(0, kv(0)), (1, kv(1)), (2, kv(2)), (6, kv(0))]
    assert kv(7) not in [r.key for r in lg.iter_records()]
    # The rounds that follow finish the job the same way.
    cleaner.clean(log_to_clean(st, lg, end, T0), T0)
    assert [(r.offset, r.key) for r in lg.iter_records(isolation_level="read_committed")] == \
        [(1, kv(1)), (2, kv(2)), (6, kv(0))]


# -- KAFKA-6854: whole batches dropped must not look like a buffer too small ------------------

def test_whole_aborted_batches_through_small_chunks_do_not_grow_buffers(root, clock, caplog,
                                                                        monkeypatch):
    """KAFKA-6854 (LogCleanerTest.testDeletedBatchesWithNoMessagesRead at chunk scale): with a
    4 KiB read chunk, chunks made only of aborted batches that are dropped whole write
    nothing; that is progress, not a batch too large for the buffer (no growth, no error)."""
    from segstore.cleaner import cleaner as cleaner_mod
    monkeypatch.setattr(cleaner_mod, "MIN_CHUNK", 4096)
    monkeypatch.setattr(cleaner_mod, "OUTPUT_GATHER", 0)
    st, lg = txn_store(root, clock, segment_bytes=1 << 20)
    st.close()
    st = open_store(root, clock, log_cleaner_io_buffer_size=4096)
    lg = st.partition("t", 0)
    p = Producer(lg, 1)
    for i in range(200):
        p([i % 50, 50 + i % 50])                 # ~80 bytes a batch: ~50 per chunk
    abort(lg, 1)
    lg.append_batch([b"kept"], keys=[b"kept"])
    lg.roll()
    assert lg.segments[0].size > 4 * 4096
    with caplog.at_level(logging.INFO, logger="segstore.cleaner"):
        [stats] = st.compact("t", 0, force=True)
    assert not [r for r in caplog.records if r.getMessage().startswith("Growing")]
    assert stats.end_offset == lg.log_end_offset
    # Only the producer's last (empty) batch, the marker and the plain record are left.
    assert [b["records_count"] for b in all_batches(lg)] == [0, 1, 1]
    assert [r.key for r in lg.iter_records()] == [b"kept"]


# -- #52: a log start offset inside the active segment ----------------------------------------

def test_log_start_offset_inside_the_active_segment(root, clock):
    """#52, LogCleanerManagerTest.testLogStartOffsetLargerThanActiveSegmentBaseOffset: one
    segment, its log start raised to 2, checkpoint 0: the first dirty offset is the log start
    (the checkpoint is rewritten), the first uncleanable offset is not below it, nothing is
    cleanable and nothing is cleaned, even by force."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=1 << 20)
    for k in (0, 0, 0):
        lg.append_batch([kv(k)], keys=[kv(k)])
    assert len(lg.segments) == 1
    assert lg.delete_records(2) == 2
    mgr = st.cleaner_manager
    mgr.update_checkpoints(update=(TP, 0))
    first_dirty, uncleanable, force = mgr.cleanable_offsets(lg, 0, T0)
    assert (first_dirty, uncleanable, force) == (2, 2, True)
    ltc = mgr.log_to_clean(lg, 0, T0)
    assert ltc.cleanable_bytes == 0 and ltc.cleanable_ratio == 0.0
    assert mgr.all_cleaner_checkpoints() == {TP: 2}
    assert mgr.grab_filthiest_compacted_log() is None
    assert st.compact("t", 0, force=True) == []
    assert records(lg) == [(2, kv(0), kv(0))]


# -- #34: duplicates after cleaning and reload --------------------------------------------------

def resend(lg, pid, keys, seq=0):
    """Re-send one idempotent batch exactly as first sent (a retry after a lost ack)."""
    return lg.append_batch([kv(k) for k in keys], keys=[kv(k) for k in keys], producer_id=pid,
                           producer_epoch=0, base_sequence=seq)


def unclean_without_snapshots(root, directory):
    """As after a crash that also lost the producer snapshots: the open must rebuild the
    producer state from the (cleaned) segments. (After a clean shutdown Kafka, like segstore,
    would trust the missing snapshots and start with no producers: REF §7 #30.)"""
    for n in os.listdir(directory):
        if n.endswith(".snapshot"):
            os.remove(os.path.join(directory, n))
    os.remove(os.path.join(root, CLEAN_SHUTDOWN_FILE))


@pytest.mark.parametrize("snapshots", ["kept", "lost in a crash"])
def test_duplicate_check_after_cleaning(root, clock, snapshots):
    """#34, LogCleanerTest.testDuplicateCheckAfterCleaning, the half test_cleaner.py's port
    leaves out: after cleaning and a reload (from the producer snapshots, or rebuilt from the
    cleaned segments alone), re-sending each producer's last batch is found a duplicate and
    answered with its original offsets, nothing written; also once producer 1's batch was
    emptied to a header by a second round."""
    st, lg = txn_store(root, clock)
    sent = {1: [1, 2, 3], 2: [3, 1, 4], 3: [1, 4]}
    for pid, keys in sent.items():
        resend(lg, pid, keys)
    lg.roll()
    make_cleaner(clock).clean(log_to_clean(st, lg, 0, T0), T0)
    assert last_offsets(lg) == [2, 5, 7]

    def reload():
        nonlocal st, lg
        directory = lg.directory
        st.close()
        if snapshots != "kept":
            unclean_without_snapshots(root, directory)
        st = open_store(root, clock)
        lg = st.partition("t", 0)

    def check_duplicates(expected):
        leo, before = lg.log_end_offset, records(lg)
        for pid, (first, last) in expected.items():
            info = resend(lg, pid, sent[pid])
            assert (info.first_offset, info.last_offset) == (first, last), pid
        assert lg.log_end_offset == leo and records(lg) == before

    reload()
    check_duplicates({1: (0, 2), 2: (3, 5), 3: (6, 7)})
    sent[4] = [2]
    resend(lg, 4, sent[4])
    lg.roll()
    make_cleaner(clock).clean(log_to_clean(st, lg, 0, T0), T0)
    assert last_offsets(lg) == [2, 5, 7, 8]
    assert all_batches(lg)[0]["records_count"] == 0          # producer 1's: a header now
    assert last_sequences(lg) == {1: 2, 2: 2, 3: 1, 4: 0}
    reload()
    check_duplicates({1: (0, 2), 2: (3, 5), 3: (6, 7), 4: (8, 8)})
    st.close()


# -- KAFKA-19895: a quarantine lasts until reopen (or a forced retry) --------------------------

def test_quarantine_outlives_a_config_change_until_a_forced_retry(root, clock, monkeypatch):
    """KAFKA-19895: as in Kafka, a partition whose cleaning failed stays uncleanable whatever
    its config becomes (the cleaner and compacted retention skip it); segstore's documented
    way out without a reopen is a forced compact(), which retries and, when it succeeds, lifts
    the quarantine (docs/compaction.md, "Uncleanable partitions")."""
    from segstore.cleaner.cleaner import Cleaner
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=1 << 20)
    for k in (0, 1, 0, 1):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    real = Cleaner.build_offset_map

    def broken(self, *a, **kw):
        raise RuntimeError("injected failure")
    monkeypatch.setattr(Cleaner, "build_offset_map", broken)
    with pytest.raises(RuntimeError):
        st.compact("t", 0)
    mgr = st.cleaner_manager
    assert TP in mgr.uncleanable
    monkeypatch.setattr(Cleaner, "build_offset_map", real)
    st.alter_topic_config("t", set={"min.cleanable.dirty.ratio": 0.01})
    assert TP in mgr.uncleanable
    assert mgr.grab_filthiest_compacted_log() is None
    assert [tp for tp, _ in mgr.deletable_logs()] == []
    assert st.compact("t", 0) == [] and st.compact() == []
    assert st.metrics()["uncleanable-partitions-count"] == 1
    [stats] = st.compact("t", 0, force=True)
    assert stats.end_offset == 4
    assert TP not in mgr.uncleanable and st.metrics()["uncleanable-partitions-count"] == 0
    assert records(lg) == [(2, kv(0), kv(0)), (3, kv(1), kv(1))]


# -- KAFKA-6388: an empty active segment whose index holds no entries --------------------------

def test_empty_active_segment_with_a_trimmed_index_takes_appends_after_reopen(root, clock):
    """KAFKA-6388: a clean close trims an empty active segment's index files to nothing (max
    entries 0, "full"); after the reopen, appends must neither fail on a full index nor try to
    roll onto a segment of the same base offset ("already exists"): the active segment gets
    room again, and indexes fill and roll as usual."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=1 << 20, segment_index_bytes=24,
                         index_interval_bytes=1)
    lg.append_batch([b"v"], keys=[b"k"])
    lg.roll()
    base = lg.segments[-1].base_offset
    st.close()
    assert os.path.getsize(os.path.join(lg.directory, "%020d.index" % base)) == 0
    st = open_store(root, clock)
    lg = st.partition("t", 0)
    assert lg.segments[-1].base_offset == base and lg.segments[-1].size == 0
    for i in range(8):
        lg.append_batch([b"v%d" % i], keys=[b"k"])
    assert [r.offset for r in lg.iter_records()] == list(range(9))
    assert lg.segments[0].base_offset == 0 and lg.segments[1].base_offset == base
    assert len(lg.segments) > 2                   # the tiny indexes still roll segments
    assert len({s.base_offset for s in lg.segments}) == len(lg.segments)
    st.close()
    st = open_store(root, clock)
    assert [r.offset for r in st.partition("t", 0).iter_records()] == list(range(9))


# -- KAFKA-5829: a corrupt index does not cost the producer snapshots --------------------------

def test_a_corrupt_index_is_rebuilt_without_deleting_producer_snapshots(root, clock):
    """KAFKA-5829: the open rebuilds the damaged offset index of the first segment (below the
    recovery point, after a clean shutdown) and leaves every producer snapshot as it was,
    instead of dropping them all and replaying the whole log."""
    st = open_store(root, clock)
    lg = compacted_topic(st, cleanup_policy="delete", segment_bytes=1 << 20,
                         index_interval_bytes=1)
    seq = 0
    for _ in range(4):
        for _ in range(5):
            lg.append_batch([b"v"], keys=[b"k"], producer_id=1, producer_epoch=0,
                            base_sequence=seq)
            seq += 1
        lg.roll()
    directory = lg.directory
    st.close()

    def snapshots():
        out = {}
        for n in sorted(os.listdir(directory)):
            if n.endswith(".snapshot"):
                with open(os.path.join(directory, n), "rb") as f:
                    out[n] = f.read()
        return out
    before = snapshots()
    assert len(before) == 4
    with open(os.path.join(directory, "%020d.index" % 0), "r+b") as f:
        f.write(b"\xff" * 16)                     # entries out of order: a corrupt index
    st = open_store(root, clock)
    lg = st.partition("t", 0)
    assert lg.verify() == []                       # rebuilt
    assert snapshots() == before
    assert lg.active_producers() == {1: (19, 0)}
    assert [r.offset for r in lg.read(3, max_records=2)] == [3, 4]
    st.close()
