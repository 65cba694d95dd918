"""Model-based test of the log cleaner together with everything around it: appends (plain,
gzip, tombstones, transactions committed and aborted), the fake clock, compaction rounds (one
round through the manager, or ``store.compact``), retention on ``compact,delete`` topics,
``min.compaction.lag.ms`` / ``max.compaction.lag.ms``, small segments (rolled and grouped),
small offset maps (a round covers part of the dirty section), clean close and reopen, and
crashes: the directory copied while the writer is open, the active segment's batches not yet
durable (unflushed, and not left by an earlier crash) cut to a prefix (maybe with a torn part of
the next one), sometimes in the middle of a cleaner swap (``log_swap.swap_hook`` stops it after
a step), and the copy opened instead.

tests/test_cleaner_oracle.py checks rounds over fixed workloads, tests/test_retention_model.py
retention and crashes without the cleaner; this machine interleaves them. The oracle is plain
Python over every batch appended (never segstore's code), checked after every step:

* every record present is byte-identical to what was appended at its offset; offsets only
  disappear; the log end offset stays, except when a crash cuts unflushed batches, where it is
  the end of the batches kept; the log start only moves forward;
* an offset at or above the log start disappears only in a compaction step, and only as
  Kafka's rules allow (REF §6.8): aborted data; a record of a key with a later, decided,
  non-aborted record of that key below the round's end offset (the new cleaner checkpoint),
  that is at least ``min.compaction.lag.ms`` old at the round's time; a tombstone or marker
  whose stamped delete horizon (seen on its batch by an earlier check) has passed;
* a delete horizon, once stamped, never changes, and is some round's ``now +
  delete.retention.ms``;
* a replay of the read_committed view gives every key the value a replay of the decided,
  non-aborted appends below the last stable offset gives it (keys whose last record is below
  the log start, and tombstoned keys, have none); read_committed never returns aborted data;
  the last stable offset is the oracle's;
* after a ``store.compact()`` without force, no dirty cleanable segment is overdue by
  ``max.compaction.lag.ms``;
* kafka-python's MemoryRecords parses every ``.log`` file (CRCs valid) into exactly the records
  segstore reads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kafka.record.memory_records import MemoryRecords as KpMemoryRecords

import segstore
from conftest import FakeClock, batch_spans, cut_unflushed_tail, v2_header
from segstore import TopicPartition, log_swap
from segstore.records import ControlRecordType
from test_read_model import TXN_PIDS, Model as TxnModel

T0 = 1_700_000_000_000
TOPIC = "t"
TP = TopicPartition(TOPIC, 0)
LONG_MAX = 2**63 - 1
KEYS = 5
ATTR_TXN, ATTR_CONTROL, ATTR_DELETE_HORIZON = 0x10, 0x20, 0x40
COMMIT, ABORT = ControlRecordType.COMMIT, ControlRecordType.ABORT
RC = "read_committed"


class SwapCrash(Exception):
    """Raised by the swap hook: the process 'dies' at that step of a cleaner swap."""


# -- the oracle -------------------------------------------------------------------------------

@dataclass
class MBatch:
    base: int
    last: int
    records: list = field(default_factory=list)  # (offset, key, value, timestamp)
    pid: int = -1
    epoch: int = -1
    seq: int = -1
    txn: bool = False
    marker: Optional[int] = None                  # ControlRecordType of a marker


class Oracle(TxnModel):
    """Every batch appended and not cut by a crash, in log order (``hist``); open transactions
    and the last stable offset as test_read_model's oracle computes them."""

    def add(self, b: MBatch) -> None:
        assert b.base == self.leo
        self.hist.append(b)
        self.leo = b.last + 1

    def cut(self, leo: int) -> None:
        self.hist = [b for b in self.hist if b.last < leo]
        self.leo = leo

    def next_seq(self, pid: int, epoch: int) -> int:
        last = -1
        for b in self.hist:
            if b.pid == pid and b.epoch == epoch and b.marker is None:
                last = b.seq + len(b.records) - 1
        return last + 1

    def classify(self):
        """(records, aborted data offsets, markers, open transactional offsets):
        records = {offset: (key, value, ts)}, markers = {offset: type}."""
        records, aborted, markers, undecided = {}, set(), {}, set()
        pending: dict[int, list] = {}
        for b in self.hist:
            if b.marker is not None:
                markers[b.base] = b.marker
                offs = pending.pop(b.pid, [])
                if b.marker == ABORT:
                    aborted.update(offs)
                continue
            for off, k, v, ts in b.records:
                records[off] = (k, v, ts)
            if b.txn:
                pending.setdefault(b.pid, []).extend(r[0] for r in b.records)
        for offs in pending.values():
            undecided.update(offs)
        return records, aborted, markers, undecided


# -- what the files hold (struct and kafka-python only) ---------------------------------------

def file_view(lg):
    """(data records {offset: (key, value, ts)}, markers present {offset}, batch headers) of
    every segment file, parsed by kafka-python (CRCs checked) and walked with struct."""
    recs, markers, headers = {}, set(), []
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()
        spans = batch_spans(data)
        assert sum(s for _, s in spans) == len(data), seg.log_path
        mr = KpMemoryRecords(data)
        n = 0
        while mr.has_next():
            b = mr.next_batch()
            assert b.validate_crc(), seg.log_path
            h = v2_header(data, spans[n][0])
            headers.append(h)
            if h["attributes"] & ATTR_CONTROL:
                if h["records_count"]:
                    markers.add(h["base_offset"])
            else:
                for r in b:
                    assert r.offset not in recs
                    recs[r.offset] = (r.key, r.value, r.timestamp)
            n += 1
        assert n == len(spans), seg.log_path
    return recs, markers, headers


# -- the state machine ------------------------------------------------------------------------

class CleanerModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="cleaner-model-")
        self.generation = 0
        self.root = os.path.join(self.tmp, "s0")
        self.clock = FakeClock(T0)
        self.oracle = Oracle()
        self.store = None
        self.counter = 0
        self.epochs = {pid: 0 for pid in TXN_PIDS}
        self.horizons: dict[int, int] = {}     # tombstone / marker offset -> stamped horizon
        self.round_nows: set[int] = set()
        self.present: set[int] = set()         # data records and markers seen at the last check
        self.start = 0
        self.rounds: list = []                 # this step's rounds: (now, end bound, lag)
        self.crashed_to: Optional[int] = None  # this step's crash: the log end it kept
        self.cut = None                        # and how many offsets it cut
        self.survived = 0                      # the log end the last crash left: on disk
        self.checkpoint = None                 # cleaner checkpoint after the last check

    def teardown(self):
        log_swap.swap_hook = None
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(slots=st.sampled_from([3, 6, 12, 1000]), load=st.sampled_from([0.75, 0.9]),
                seg_bytes=st.sampled_from([300, 600, 1200]),
                dr=st.sampled_from([0, 3_000, 30_000]),
                lags=st.sampled_from([(0, LONG_MAX), (0, LONG_MAX), (2_000, LONG_MAX),
                                      (0, 5_000), (2_000, 20_000), (20_000, 60_000)]),
                ratio=st.sampled_from([0.0, 0.5]),
                policy=st.sampled_from(["compact", "compact", "compact,delete"]),
                rms=st.sampled_from([-1, 15_000, 120_000]),
                rbytes=st.sampled_from([-1, 1_500, 5_000]))
    def open(self, slots, load, seg_bytes, dr, lags, ratio, policy, rms, rbytes):
        self.min_lag, self.max_lag = lags
        self.dr = dr
        self.store_config = {"log.cleaner.dedupe.buffer.size": 24 * slots,
                             "log.cleaner.io.buffer.load.factor": load}
        self.store = segstore.open(self.root, clock=self.clock, config=self.store_config)
        self.store.create_topic(TOPIC, 1, config={
            "cleanup.policy": policy, "segment.bytes": seg_bytes, "delete.retention.ms": dr,
            "min.compaction.lag.ms": self.min_lag, "max.compaction.lag.ms": self.max_lag,
            "min.cleanable.dirty.ratio": ratio, "retention.ms": rms, "retention.bytes": rbytes})

    @property
    def lg(self):
        return self.store.partition(TOPIC, 0)

    def reopen(self, root):
        self.root = root
        self.store = segstore.open(root, clock=self.clock, config=self.store_config)

    # -- writes -------------------------------------------------------------------------------
    def _records(self, recs, jitter):
        keys, values, stamps = [], [], []
        for k, tomb in recs:
            self.counter += 1
            keys.append(b"k%d" % k)
            values.append(None if tomb else b"v%d" % self.counter + b"x" * (self.counter % 23))
            stamps.append(self.clock.now + jitter)
        return keys, values, stamps

    def _add(self, info, keys, values, stamps, **kw):
        assert info.first_offset == self.oracle.leo
        assert info.last_offset == self.oracle.leo + len(keys) - 1
        recs = [(info.first_offset + i, keys[i], values[i], stamps[i]) for i in range(len(keys))]
        self.oracle.add(MBatch(info.first_offset, info.last_offset, recs, **kw))

    record_lists = st.lists(st.tuples(st.integers(0, KEYS - 1),
                                      st.sampled_from([False, False, False, True])),
                            min_size=1, max_size=4)

    @rule(recs=record_lists, jitter=st.sampled_from([0, 0, -700, 300]),
          codec=st.sampled_from([None, None, "gzip"]))
    def append(self, recs, jitter, codec):
        keys, values, stamps = self._records(recs, jitter)
        info = self.lg.append_batch(values, keys=keys, timestamps_ms=stamps, compression=codec)
        self._add(info, keys, values, stamps)

    @rule(batches=st.lists(st.tuples(record_lists, st.sampled_from([None, None, "gzip"])),
                           min_size=2, max_size=8))
    def append_many(self, batches):
        for recs, codec in batches:
            self.append(recs, 0, codec)

    @rule(pid=st.sampled_from(TXN_PIDS), recs=record_lists,
          codec=st.sampled_from([None, None, "gzip"]))
    def append_txn(self, pid, recs, codec):
        if self.oracle.open_txn_first(pid) is None:
            self.epochs[pid] += 1          # a new transaction at a new epoch: sequence 0
        epoch = self.epochs[pid]
        seq = self.oracle.next_seq(pid, epoch)
        keys, values, stamps = self._records(recs, 0)
        info = self.lg.append_batch(values, keys=keys, timestamps_ms=stamps, compression=codec,
                                    producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                    is_transactional=True)
        self._add(info, keys, values, stamps, pid=pid, epoch=epoch, seq=seq, txn=True)

    @rule(pid=st.sampled_from(TXN_PIDS), abort=st.booleans())
    def end_txn(self, pid, abort):
        if self.oracle.open_txn_first(pid) is None:
            return
        ctype = ABORT if abort else COMMIT
        info = self.lg.append_control(ctype, producer_id=pid, producer_epoch=self.epochs[pid])
        assert info.first_offset == info.last_offset == self.oracle.leo
        self.oracle.add(MBatch(info.first_offset, info.first_offset, pid=pid,
                               epoch=self.epochs[pid], marker=ctype))

    @rule(ms=st.sampled_from([1, 500, 2_500, 10_000, 40_000, 200_000]))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule()
    def roll(self):
        self.lg.roll()

    @rule()
    def flush(self):
        self.lg.flush()

    # -- compaction and retention -------------------------------------------------------------
    @rule(force=st.booleans())
    def one_round(self, force):
        now = self.clock.now
        ltc = self.store.cleaner_manager.grab_log(TP, now, force=force)
        if ltc is None:
            return
        stats = self.store.cleaner.clean_log(-1, ltc, now, raise_errors=True)
        assert stats is not None
        self.round_nows.add(now)
        self.rounds.append((now, stats.end_offset))

    @rule(force=st.booleans())
    def compact(self, force):
        now = self.clock.now
        results = self.store.compact(TOPIC, 0, force=force)
        if results:
            self.round_nows.add(now)
        for stats in results:
            self.rounds.append((now, stats.end_offset))
        if not force:
            self.check_nothing_overdue(now)

    @rule()
    def retention(self):
        report = self.store.enforce_retention(now_ms=self.clock.now)
        assert not report.errors

    # -- restarts -----------------------------------------------------------------------------
    @rule()
    def clean_reopen(self):
        self.store.close()
        self.reopen(self.root)

    @rule(keep=st.integers(0, 5), torn=st.integers(0, 3))
    def crash(self, keep, torn):
        self._crash(keep, torn)

    @rule(step=st.sampled_from(["swap", "deleted", "renamed"]), nth=st.integers(0, 2),
          keep=st.integers(0, 5), torn=st.integers(0, 3))
    def crash_during_swap(self, step, nth, keep, torn):
        """A round that dies after the ``nth`` time its swap reaches ``step`` (REF §2.2): the
        files then are what the loader finds."""
        now = self.clock.now
        ltc = self.store.cleaner_manager.grab_log(TP, now, force=True)
        if ltc is None:
            return
        seen = []

        def hook(s, base):
            if s == step:
                seen.append(base)
                if len(seen) > nth:
                    raise SwapCrash(f"{s} {base}")
        log_swap.swap_hook = hook
        try:
            try:
                self.store.cleaner.clean_log(-1, ltc, now, raise_errors=True)
            except SwapCrash:
                pass
            self.round_nows.add(now)
            # The round's end is not known when it died: its bound is the cleanable range's.
            self.rounds.append((now, ltc.first_uncleanable_offset))
            self._crash(keep, torn)
        finally:
            log_swap.swap_hook = None

    def _crash(self, keep, torn):
        """A power loss now: the directory tree as it is, with the active segment's batches not
        yet durable (at or above the recovery point and the end the last crash left) cut to a
        prefix of ``keep`` (maybe torn inside the next)."""
        self.generation += 1
        new_root = os.path.join(self.tmp, f"s{self.generation}")
        lg = self.lg
        # Durable: below the recovery point (flushed), and also what an earlier power loss left,
        # which was on disk then and has not been rewritten since. The recovery point alone
        # under-states it after an unclean restart: it falls back to the checkpointed one, here
        # often 0 (REF §4.2 step 9: it only advances on a later flush), and a crash then could
        # take batches, such as a marker a round flushed and relied on, that cannot be lost.
        rp = max(lg.recovery_point, self.survived)
        active = lg.segments[-1]
        shutil.copytree(self.root, new_root)
        path = os.path.join(new_root, f"{TOPIC}-0", os.path.basename(active.log_path))
        leo = cut_unflushed_tail(active.log_path, path, rp, keep, torn, self.oracle.leo,
                                 active.base_offset)
        self.store.close()
        shutil.rmtree(self.root)
        self.cut = self.oracle.leo - leo
        self.oracle.cut(leo)
        self.crashed_to = leo
        self.reopen(new_root)
        self.survived = self.lg.log_end_offset

    # -- checks -------------------------------------------------------------------------------
    def check_nothing_overdue(self, now):
        """store.compact() without force cleans every log overdue by max.compaction.lag.ms:
        none of the dirty segments below the cleanable bound has a first batch that old."""
        if self.max_lag == LONG_MAX:
            return
        lg = self.lg
        cp = self.cleaner_checkpoint()
        start = lg.log_start_offset
        first_dirty = cp if cp is not None and start <= cp <= lg.log_end_offset else start
        segs = lg.segments
        bound = min(self.oracle.lso(start), segs[-1].base_offset)
        for s in segs[:-1]:
            if self.min_lag and s.largest_timestamp > now - self.min_lag and \
                    s.base_offset + 1 > first_dirty:
                bound = min(bound, s.base_offset)
                break
        bases = [s.base_offset for s in segs]
        for i, s in enumerate(segs[:-1]):
            end = bases[i + 1]
            if end <= first_dirty or s.base_offset >= bound or end > bound:
                continue
            with open(s.log_path, "rb") as f:
                data = f.read(61)
            if len(data) < 61:
                continue
            first_ts = v2_header(data)["max_timestamp"]
            assert first_ts >= now - self.max_lag, (
                "overdue segment left dirty", s.base_offset, first_ts, now, first_dirty, bound)

    def cleaner_checkpoint(self):
        return self.store.cleaner_manager.all_cleaner_checkpoints().get(TP)

    @invariant()
    def store_agrees_with_the_oracle(self):
        if self.store is None:
            return
        try:
            self._check()
        finally:
            self.rounds = []
            self.crashed_to = None
            self.cut = None

    def _check(self):
        lg, o = self.lg, self.oracle
        assert lg.log_end_offset == o.leo
        start = lg.log_start_offset
        assert start >= self.start, ("log start went back", start, self.start)
        assert start <= o.leo
        assert lg.segments[0].base_offset == start or start == o.leo
        records, aborted, markers, undecided = o.classify()
        got = {r.offset: (r.key, r.value, r.timestamp) for r in lg.iter_records()}
        recs, marks, headers = file_view(lg)
        assert {k: v for k, v in recs.items() if k >= start} == got, "kafka-python disagrees"
        for off, rec in got.items():
            assert records.get(off) == rec, ("not what was appended", off)
        for off in marks:
            assert off in markers, ("not a marker appended", off)
        # Batches are appended batches (compaction keeps base and last offset).
        bounds = {b.base: b.last for b in o.hist}
        for h in headers:
            assert bounds.get(h["base_offset"]) == h["base_offset"] + h["last_offset_delta"], h
        # Delete horizons: stamped by a round at now + delete.retention.ms, never moved.
        batch_of = {}
        for h in headers:
            for off in range(h["base_offset"], h["base_offset"] + h["last_offset_delta"] + 1):
                batch_of[off] = h
        for off in list(got) + list(marks):
            h = batch_of[off]
            if not h["attributes"] & ATTR_DELETE_HORIZON:
                continue
            hz = h["base_timestamp"]
            if off in self.horizons:
                assert hz == self.horizons[off], ("a delete horizon moved", off)
            elif off in marks or got[off][1] is None:
                assert hz - self.dr in self.round_nows, ("horizon of no round", off, hz)
                self.horizons[off] = hz
        # What disappeared, and why.
        now_present = set(got) | set(marks)
        if self.crashed_to is not None:
            self.present = {x for x in self.present if x < self.crashed_to}
        gone = {x for x in self.present - now_present if x >= start}
        assert not (gone and not self.rounds), ("removed without compaction", sorted(gone))
        for off in sorted(gone):
            assert self.removal_allowed(off, records, aborted, markers, undecided), \
                ("removed against the rules", off, records.get(off) or markers.get(off),
                 self.rounds, self.horizons.get(off))
        if os.environ.get("CLEANER_MODEL_EVENTS"):
            from hypothesis import event
            event(f"removed {min(len(gone), 3)}")
            event(f"aborted removed {bool(gone & aborted)}")
            event(f"markers removed {bool(gone & set(markers))}")
            event(f"tombstones removed {any(records.get(x, (0, 1))[1] is None for x in gone)}")
            event(f"retention moved start {start > self.start}")
            event(f"crash cut {self.cut}")
            event(f"segments {min(len(lg.segments), 5)}")
            event(f"horizons {min(len(self.horizons), 3)}")
            event(f"partial round {any(e < lg.segments[-1].base_offset for _, e in self.rounds)}")
        self.present = now_present
        self.start = start
        # read_committed: nothing aborted, nothing at or past the last stable offset, and its
        # replay is the oracle's replay of what is decided and not aborted.
        lso = o.lso(start)
        assert lg.last_stable_offset == lso
        committed = [(r.offset, r.key, r.value) for r in lg.iter_records(isolation_level=RC)]
        for off, _, _ in committed:
            assert off not in aborted and off < lso, ("read_committed returned", off)
        replay = {}
        for _, k, v in committed:
            replay[k] = v
        want = {}
        for off in sorted(records):
            if off < lso and off not in aborted:
                want[records[off][0]] = (off, records[off][1])
        assert {k: v for k, v in replay.items() if v is not None} == \
            {k: v for k, (off, v) in want.items() if off >= start and v is not None}
        for k, (off, v) in want.items():
            if off < start:
                assert k not in replay, ("a key retention removed came back", k)
        # The cleaner's checkpoint is a valid first dirty offset.
        cp = self.cleaner_checkpoint()
        if cp is not None:
            assert cp <= o.leo, cp
            for now, end in self.rounds[-1:]:
                if self.crashed_to is None:
                    assert cp == end, (cp, end)
        assert lg.verify() == []
        # Sealed segments' indexes are trimmed to their entries (a few at these sizes), also
        # those a crash recovery rebuilt.
        for seg in lg.segments[:-1]:
            for path in (seg.offset_index.path, seg.time_index.path):
                assert os.path.getsize(path) <= 1024, ("untrimmed sealed index", path)

    def removal_allowed(self, off, records, aborted, markers, undecided) -> bool:
        if off in aborted:
            return True
        if off in markers:
            return self.horizon_passed(off)
        assert off not in undecided, ("an open transaction's record was removed", off)
        key, value, _ = records[off]
        for now, end in self.rounds:
            if off >= end:
                continue
            for later in range(off + 1, end):
                rec = records.get(later)
                if (rec is not None and rec[0] == key and later not in aborted
                        and later not in undecided
                        and (self.min_lag == 0 or rec[2] <= now - self.min_lag)):
                    return True
        return value is None and self.horizon_passed(off)

    def horizon_passed(self, off) -> bool:
        """A tombstone or marker may go once the horizon stamped on its batch has passed (with
        delete.retention.ms = 0 a stamp and the removal can come in one compact() call)."""
        if not self.rounds:
            return False
        latest = max(now for now, _ in self.rounds)
        if off in self.horizons:
            return self.horizons[off] <= latest
        return self.dr == 0


# Deterministic by default; CLEANER_MODEL_RANDOM=1 with CLEANER_MODEL_EXAMPLES /
# CLEANER_MODEL_STEPS explores further.
CleanerModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("CLEANER_MODEL_EXAMPLES", 100)),
    stateful_step_count=int(os.environ.get("CLEANER_MODEL_STEPS", 50)), deadline=None,
    derandomize=not os.environ.get("CLEANER_MODEL_RANDOM"), database=None)
TestCleanerModel = CleanerModel.TestCase


# -- regressions the model found, reduced -------------------------------------------------------

def _store(tmp_path, clock, **topic):
    store = segstore.open(str(tmp_path / "s"), clock=clock)
    store.create_topic(TOPIC, 1, config={"cleanup.policy": "compact", "segment.bytes": 1 << 20,
                                         "min.cleanable.dirty.ratio": 0.0, **topic})
    return store, store.partition(TOPIC, 0)


def test_an_aborted_compressed_batch_that_is_not_its_producers_last_is_dropped(tmp_path):
    # An aborted batch is dropped whole (DELETE), so the cleaner did not decompress it, but the
    # filter kernel refused a compressed batch without its records: the round failed with
    # "a compressed batch needs its decompressed records" and the partition was quarantined.
    # Only when the producer wrote again later (else its last batch is kept as a header).
    store, lg = _store(tmp_path, FakeClock(T0))
    try:
        lg.append_batch([b"a", b"b"], keys=[b"k", b"k"], compression="gzip", producer_id=1,
                        producer_epoch=1, base_sequence=0, is_transactional=True)
        lg.append_control(ABORT, producer_id=1, producer_epoch=1)
        lg.roll()
        lg.append_batch([b"c"], keys=[b"k"], producer_id=1, producer_epoch=2,
                        base_sequence=0, is_transactional=True)
        lg.append_control(COMMIT, producer_id=1, producer_epoch=2)
        lg.roll()
        stats = store.compact(TOPIC, 0, force=True)
        assert len(stats) == 1 and stats[0].end_offset == 5
        assert [(r.offset, r.value) for r in lg.iter_records()] == [(3, b"c")]
        assert store.metrics()["uncleanable-partitions-count"] == 0
        assert lg.verify() == []
    finally:
        store.close()


def test_segments_recovered_after_a_crash_have_trimmed_indexes(tmp_path):
    # Recovery rebuilt a segment's indexes into files preallocated to segment.index.bytes and
    # left them so: after a crash every sealed segment at or above the recovery point had two
    # 10 MiB index files until a clean close (REF §4.3 step 4 trims them).
    clock = FakeClock(T0)
    root = tmp_path / "s"
    store, lg = _store(tmp_path, clock)
    for i in range(3):
        lg.append_batch([b"v%d" % i], keys=[b"k%d" % i])
        lg.roll()
    lg.append_batch([b"v3"], keys=[b"k3"])
    shutil.copytree(root, tmp_path / "crashed")    # no clean shutdown, no checkpoints
    store.close()
    store = segstore.open(str(tmp_path / "crashed"), clock=clock)
    try:
        lg = store.partition(TOPIC, 0)
        assert [s.base_offset for s in lg.segments] == [0, 1, 2, 3]
        for seg in lg.segments[:-1]:
            assert os.path.getsize(seg.offset_index.path) == 0
            assert os.path.getsize(seg.time_index.path) <= 12
        assert [r.value for r in lg.iter_records()] == [b"v0", b"v1", b"v2", b"v3"]
        assert lg.offset_for_time(T0)[:1] == (0,)
        lg.append_batch([b"v4"], keys=[b"k4"])        # the active segment's are preallocated
        assert lg.verify() == []
    finally:
        store.close()


def test_a_crash_that_loses_a_commit_marker_does_not_leave_its_compaction_behind(tmp_path):
    # pid 2's transaction holds a later value of k0; its COMMIT lands in the active segment,
    # above the recovery point (not flushed). A round then cleans the sealed segment: with the
    # transaction decided (last stable offset 3) it drops k0's value at offset 0 and fsyncs
    # the cleaned segment. Before the fix a power loss could then take the unflushed marker:
    # the transaction open again, and k0's committed value gone for good (an ABORT leaving k0
    # with nothing, though nothing ever deleted it). Kafka bounds the cleaner by the high
    # watermark (replicated data); segstore's round flushes the log first, so the marker it
    # relies on is durable before the compaction is, and a power loss (which takes only
    # what is above the recovery point) cannot separate them.
    clock = FakeClock(T0)
    store, lg = _store(tmp_path, clock)
    lg.append_batch([b"v0"], keys=[b"k0"])
    lg.append_batch([b"v1"], keys=[b"k0"], producer_id=2, producer_epoch=0, base_sequence=0,
                    is_transactional=True)
    lg.roll()                                       # flushes up to 2
    lg.append_control(COMMIT, producer_id=2, producer_epoch=0)
    assert lg.recovery_point == 2 and lg.last_stable_offset == 3
    store.compact(TOPIC, 0, force=True)
    assert [r.offset for r in lg.iter_records()] == [1]
    assert lg.recovery_point == 3                  # the marker was flushed with the round
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "s", crashed)       # the power loss: only what is above the
    store.close()                                  # recovery point may go, here nothing
    store = segstore.open(str(crashed), clock=clock)
    try:
        lg = store.partition(TOPIC, 0)
        assert (lg.log_end_offset, lg.last_stable_offset) == (3, 3)
        # What was committed: k0 = v1, kept by the compaction and by the marker alike.
        assert {r.key: r.value for r in lg.iter_records(isolation_level=RC)} == {b"k0": b"v1"}
    finally:
        store.close()


@pytest.mark.parametrize("first_crash", ["after the round", "inside the round's swap"])
def test_a_crash_keeps_what_an_earlier_crash_left_though_the_recovery_point_fell_back(
        first_crash):
    # The model (not segstore) was wrong here. A round flushes pid 1's COMMIT (the active
    # segment's only batch) and drops k0's older committed value; a power loss keeps it all.
    # The unclean restart then sets the recovery point to the checkpointed one (none written
    # yet: 0, REF §4.2 step 9), so the model's crash rule took the marker for unflushed, and a
    # second power loss cut it: the transaction open again and k0's value gone, though the
    # marker had been on disk since before the first crash.
    m = CleanerModel()
    try:
        m.open(slots=1000, load=0.75, seg_bytes=1200, dr=0, lags=(0, LONG_MAX), ratio=0.0,
               policy="compact", rms=-1, rbytes=-1)
        m.append([(0, False)], 0, None)                 # k0 at 0
        m.append_txn(1, [(0, False)], None)             # k0 at 1, pid 1
        m.roll()                                        # flushed up to 2
        m.end_txn(1, False)                             # COMMIT at 2, above the recovery point
        m.store_agrees_with_the_oracle()
        if first_crash == "after the round":
            m.compact(True)
            m.store_agrees_with_the_oracle()
            m.crash(5, 0)
        else:
            m.crash_during_swap("renamed", 0, 5, 0)
        m.store_agrees_with_the_oracle()
        assert [r.offset for r in m.lg.iter_records()] == [1]
        assert (m.lg.recovery_point, m.lg.log_end_offset) == (0, 3)
        m.crash(0, 0)                                   # nothing above 3 to cut
        m.store_agrees_with_the_oracle()
        assert {r.key: r.value for r in m.lg.iter_records(isolation_level=RC)} == \
            {b"k0": m.oracle.hist[1].records[0][2]}
    finally:
        m.teardown()
