"""Model-based test of one store where the features meet: a compacted topic (``compact`` or
``compact,delete``) and sometimes a ``delete`` topic beside it, small segments and indexes (so
segments roll often, also on a full index), the fake clock, appends of every kind (append_batch,
append_records of pre-encoded batches, append_columns split by records and bytes), keyed records
and tombstones, transactions committed and aborted, roll, flush, retention (enforce_retention
and tick), on-demand compaction, delete_records, truncate_to, clean close and reopen, and power
losses (the directory copied while the writer is open, each partition's unflushed batches cut
to a prefix, maybe torn, and the copy opened).

tests/test_read_model.py, test_retention_model.py, test_cleaner_model.py and
test_cleaner_oracle.py cover reads, retention and the cleaner mostly apart; the point here is
their interactions (truncation and log start changes of a compacted log, a crash after
delete_records or truncation, compaction of a log whose start is inside a cleaned segment, two
topics in one store with one set of checkpoint files). The oracle is plain Python over every
batch appended (test_cleaner_model's Oracle: batches, transactions, last stable offset), never
segstore's code. After every step, for each topic:

* the log end offset is the oracle's: it moves back only by truncate_to (to where the data
  left ends) or by a crash (the end of the batches kept); the log start moves forward except
  by truncate_to (to below it) and by a crash, which may only reopen at
  max(checkpointed log start, first segment base);
* every record read is byte-identical (key, value, timestamp) to what was appended at its
  offset; kafka-python parses every ``.log`` file into the same records;
* ``delete`` topic: exactly every data record appended in [log start, log end) is read;
* compacted topic: an offset at or above the log start disappears only in a compaction step
  and only as Kafka's rules allow (REF §6.8; test_cleaner_model's rules: aborted data, a record
  with a later decided record of its key below the round's end and older than
  min.compaction.lag.ms, a tombstone or marker whose stamped horizon passed); an offset
  appears only when appended, or after a crash when the log start fell back to its checkpoint;
  a replay of the read_committed records gives every key the value of its latest decided,
  non-aborted record (so the latest record of a key is never removed);
* read_committed returns no aborted and nothing at or past the last stable offset, which is
  the oracle's; for the delete topic it returns exactly what the oracle says;
* read() consumed from the log start with small max_bytes gives the same records as
  iter_records, in strictly increasing offsets; read_columns gives them too (both levels);
* offset_for_time(ts) is the first record read (log order) at or after the log start whose
  timestamp is at least ts; EARLIEST / LATEST are the log start / end;
* after compact(): no record of a key is left below the key's latest decided, non-aborted
  record below the last round's end (a round cleans every segment from the first);
* every record carries the header its append gave it (none from append_columns) and the
  topic's timestamp type (LogAppendTime topics: the clock at the append);
* producer state: active_producers() is each producer's epoch and last data offset at that
  epoch, as the oracle replays them (idempotent producers retry their last batch, which is not
  written again; transactional ones keep their epoch across transactions). After a truncation
  into a range a round cleaned, a producer with batches there is taken as unknown (Kafka
  rebuilds its state from the batches the cleaner kept) until its next epoch;
* a read-only store opened beside the writer (reopened with it) has the same log end and, from
  the later of the two log starts, the same records and read_committed offsets; its last
  stable offset is the oracle's for its own log start;
* the cleaner checkpoint is at most the log end; store.verify() finds nothing.

The compacted topic's config is altered between steps (cleanup.policy, also to delete for a
while, segment.bytes, delete.retention.ms, min.cleanable.dirty.ratio).

Left out: cleaner threads and crashes inside a cleaner swap (test_cleaner_model does those),
segment.index.bytes / segment.ms / min.compaction.lag.ms alterations, more than one partition
per topic, producer expiration (the clock never moves a day), exact retention choices
(test_retention_model checks them; here only that the start moves forward and records below it
go), and after a truncation below data a round cleaned the latest-value check is loose for keys
whose latest record lies below the truncation point (what the round removed is gone for good,
as after Kafka's unclean leader election).

Deterministic by default; STORE_MODEL_RANDOM=1 with STORE_MODEL_EXAMPLES / STORE_MODEL_STEPS
explores further.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from typing import Optional

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import segstore
from conftest import FakeClock, batch_spans, cut_unflushed_tail, v2_header
from segstore import TopicPartition, _core
from segstore.columns import BinaryColumn
from segstore.errors import RecordTooLargeError
from segstore.records import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ControlRecordType
from test_cleaner_model import ATTR_CONTROL, ATTR_DELETE_HORIZON, MBatch, Oracle, file_view
from test_read_model import IDEMPOTENT_PID, TXN_PIDS

T0 = 1_700_000_000_000
COMPACTED, DELETE = "c", "d"
KEYS = 5
LONG_MAX = 2**63 - 1
COMMIT, ABORT = ControlRecordType.COMMIT, ControlRecordType.ABORT
RC = "read_committed"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"


def file_batches(lg) -> list[tuple[int, int, int]]:
    """(segment base, batch base offset, batch last offset) of every batch in the files."""
    out = []
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()
        for pos, _ in batch_spans(data):
            h = v2_header(data, pos)
            out.append((seg.base_offset, h["base_offset"],
                        h["base_offset"] + h["last_offset_delta"]))
    return out


def struct_view(lg):
    """(markers present {offset}, batch headers, whether kafka-python can parse every batch:
    it has no lz4, zstd or snappy here) of every segment file, with struct alone."""
    markers, headers, parseable = set(), [], True
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()
        spans = batch_spans(data)
        assert sum(n for _, n in spans) == len(data), seg.log_path
        for pos, _ in spans:
            h = v2_header(data, pos)
            headers.append(h)
            if h["attributes"] & ATTR_CONTROL:
                if h["records_count"]:
                    markers.add(h["base_offset"])
            elif h["attributes"] & 7 not in (0, 1):
                parseable = False
    return markers, headers, parseable


def lso_bounds(t, start) -> tuple[int, int]:
    """The last stable offset with every open transaction of the oracle, and with only those
    of producers whose state is known (exactly the oracle's when none is unsure)."""
    def over(pids):
        o = t.oracle
        firsts = [f for f in (o.open_txn_first(p) for p in pids) if f is not None]
        return min(max(min(firsts), start), o.leo) if firsts else o.leo
    return over(TXN_PIDS), over([p for p in TXN_PIDS if p not in t.unsure])


def lg_first_base(lg) -> int:
    return lg.segments[0].base_offset


def read_offset_checkpoint(path) -> dict:
    """{(topic, partition): offset} of a Kafka offset checkpoint file (plain text)."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return {}
    out = {}
    for line in lines[2:]:
        if line.strip():
            t, p, o = line.split()
            out[(t, int(p))] = int(o)
    return out


def headers_for(keys, values) -> list:
    """Every appended record but append_columns' carries one header derived from its key and
    value, so a check can tell what it must be."""
    return [[("h", b"h:" + (v if v is not None else (k or b""))[:8])] for k, v in zip(keys, values)]


def header_of(t, r) -> tuple:
    if r.offset in t.no_headers:
        return ()
    return (("h", b"h:" + (r.value if r.value is not None else (r.key or b""))[:8]),)


class TopicState:
    """The oracle and what the last check saw, for one single-partition topic."""

    def __init__(self, name: str, compact: bool, append_time: bool = False):
        self.name = name
        self.compact = compact
        self.append_time = append_time   # message.timestamp.type=LogAppendTime
        self.no_headers: set[int] = set()  # offsets appended without headers (append_columns)
        self.tp = TopicPartition(name, 0)
        self.oracle = Oracle()
        self.epochs = {pid: 0 for pid in TXN_PIDS + (IDEMPOTENT_PID,)}
        self.unsure: set[int] = set()    # producers whose state a truncation may have lost
        self.present: set[int] = set()   # data and marker offsets >= the log start, last check
        self.start = 0                   # log start at the last check
        self.leo = 0                     # log end at the last check
        self.horizons: dict[int, int] = {}
        self.survived = 0                # the log end the last crash left: durable
        self.rounds: list = []           # this step's compaction rounds: (now, end offset)
        self.round_end_max = 0           # highest end offset of any round
        self.compromised_below = 0       # a truncation cut records a round may have relied on
        self.crash_start: Optional[int] = None   # this step's crash: the log start expected
        self.truncated_to: Optional[int] = None  # this step's truncation: the new log end

    def cut(self, leo: int) -> None:
        self.oracle.cut(leo)
        self.present = {x for x in self.present if x < leo}
        self.horizons = {x: h for x, h in self.horizons.items() if x < leo}
        self.no_headers = {x for x in self.no_headers if x < leo}
        self.survived = min(self.survived, leo)


class StoreModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="store-model-")
        self.generation = 0
        self.root = os.path.join(self.tmp, "s0")
        self.clock = FakeClock(T0)
        self.store = None
        self.ro = None
        self.counter = 0
        self.topics: list[TopicState] = []
        self.round_horizons: set[int] = set()   # each round's now + delete.retention.ms
        self.steps = 0

    def teardown(self):
        if self.ro is not None:
            self.ro.close()
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(policy=st.sampled_from(["compact", "compact", "compact,delete"]),
                seg_bytes=st.sampled_from([300, 600, 1200]),
                index_bytes=st.sampled_from([24, 48, 4096]),
                interval=st.sampled_from([0, 100, 4096]),
                dr=st.sampled_from([0, 3_000, 30_000]),
                lags=st.sampled_from([(0, LONG_MAX), (0, LONG_MAX), (2_000, LONG_MAX),
                                      (0, 5_000), (2_000, 20_000)]),
                ratio=st.sampled_from([0.0, 0.5]),
                rms=st.sampled_from([-1, 15_000, 120_000]),
                rbytes=st.sampled_from([-1, 1_500, 5_000]),
                slots=st.sampled_from([4, 12, 1000]),
                two_topics=st.sampled_from([True, True, False]),
                append_time=st.sampled_from([None, None, None, COMPACTED, DELETE]))
    def open(self, policy, seg_bytes, index_bytes, interval, dr, lags, ratio, rms, rbytes, slots,
             two_topics, append_time):
        self.min_lag, self.max_lag = lags
        self.dr = dr
        self.compacting = True
        self.store_config = {"log.cleaner.dedupe.buffer.size": 24 * slots}
        self.store = segstore.open(self.root, clock=self.clock, config=self.store_config)
        lat = {"message.timestamp.type": "LogAppendTime"}
        common = {"segment.bytes": seg_bytes, "segment.index.bytes": index_bytes,
                  "index.interval.bytes": interval, "retention.ms": rms,
                  "retention.bytes": rbytes}
        self.store.create_topic(COMPACTED, 1, config={
            **common, "cleanup.policy": policy, "delete.retention.ms": dr,
            "min.compaction.lag.ms": self.min_lag, "max.compaction.lag.ms": self.max_lag,
            "min.cleanable.dirty.ratio": ratio, **(lat if append_time == COMPACTED else {})})
        self.topics.append(TopicState(COMPACTED, True, append_time == COMPACTED))
        if two_topics:
            self.store.create_topic(DELETE, 1, config={
                **common, "cleanup.policy": "delete", **(lat if append_time == DELETE else {})})
            self.topics.append(TopicState(DELETE, False, append_time == DELETE))
        self.open_follower()

    def open_follower(self):
        """A read-only store on the writer's directory, kept open while the writer works."""
        if self.ro is not None:
            self.ro.close()
        self.ro = segstore.open(self.root, readonly=True)

    def lg(self, t: TopicState):
        return self.store.partition(t.name, 0)

    def topic(self, i: int) -> TopicState:
        return self.topics[i % len(self.topics)]

    def reopen(self, root):
        self.root = root
        self.store = segstore.open(root, clock=self.clock, config=self.store_config)
        self.open_follower()

    # -- writes -------------------------------------------------------------------------------
    def _records(self, t, recs, jitter):
        keys, values, stamps = [], [], []
        for k, tomb in recs:
            self.counter += 1
            key = None if (k < 0 and not t.compact) else b"k%d" % abs(k)
            keys.append(key)
            values.append(None if tomb and key is not None
                          else b"v%d" % self.counter + b"x" * (self.counter % 13))
            stamps.append(self.clock.now if t.append_time else self.clock.now + jitter)
        return keys, values, stamps

    def _add_from_files(self, t, info, keys, values, stamps, **kw):
        """Record an append of ``keys``/``values`` at the log end as the batches the files
        hold (append_records and append_columns decide their own batch boundaries)."""
        o = t.oracle
        assert info.first_offset == o.leo, (info, o.leo)
        assert info.last_offset == o.leo + len(keys) - 1, (info, o.leo, len(keys))
        bounds = [(b, last) for _, b, last in file_batches(self.lg(t)) if b >= o.leo]
        assert bounds and bounds[0][0] == o.leo and bounds[-1][1] == info.last_offset, bounds
        for base, last in bounds:
            recs = [(off, keys[off - info.first_offset], values[off - info.first_offset],
                     stamps[off - info.first_offset]) for off in range(base, last + 1)]
            o.add(MBatch(base, last, recs, **kw))

    record_lists = st.lists(st.tuples(st.integers(-1, KEYS - 1),
                                      st.sampled_from([False, False, False, True])),
                            min_size=1, max_size=4)
    codecs = st.sampled_from([None, None, None, "gzip", "lz4", "zstd", "snappy"])
    which = st.integers(0, 3)

    @rule(which=which, recs=record_lists, jitter=st.sampled_from([0, 0, -700, 300]),
          codec=codecs)
    def append(self, which, recs, jitter, codec):
        t = self.topic(which)
        keys, values, stamps = self._records(t, recs, jitter)
        info = self.lg(t).append_batch(values, keys=keys, headers=headers_for(keys, values),
                                       timestamps_ms=stamps, compression=codec)
        self._add_from_files(t, info, keys, values, stamps)

    @rule(which=which, batches=st.lists(st.tuples(record_lists, codecs), min_size=2,
                                         max_size=6))
    def append_many(self, which, batches):
        for recs, codec in batches:
            self.append(which, recs, 0, codec)

    @rule(which=which, batches=st.lists(st.tuples(record_lists, codecs), min_size=1,
                                         max_size=3))
    def append_records(self, which, batches):
        """Pre-encoded batches (base offsets 0: the log rewrites them) in one call."""
        t = self.topic(which)
        data, all_keys, all_values, all_stamps = b"", [], [], []
        for recs, codec in batches:
            keys, values, stamps = self._records(t, recs, 0)
            data += bytes(_core.encode_batch(values, keys, headers_for(keys, values), stamps,
                                             base_offset=0, compression=codec or 0))
            all_keys += keys
            all_values += values
            all_stamps += stamps
        lg = self.lg(t)
        try:
            info = lg.append_records(data)
        except RecordTooLargeError:
            # A batch over segment.bytes: refused whole, nothing written.
            assert lg.log_end_offset == t.oracle.leo
            return
        self._add_from_files(t, info, all_keys, all_values, all_stamps)

    @rule(which=which, recs=st.lists(st.tuples(st.integers(0, KEYS - 1),
                                                st.sampled_from([False, False, True]),
                                                st.integers(0, 60)), min_size=1, max_size=14),
          per_batch=st.integers(1, 5), jitter=st.sampled_from([0, -300, 200]))
    def append_columns(self, which, recs, per_batch, jitter):
        t = self.topic(which)
        keys, values, stamps = [], [], []
        for k, tomb, pad in recs:
            self.counter += 1
            keys.append(b"k%d" % k)
            values.append(None if tomb else b"c%d:" % self.counter + b"y" * pad)
            stamps.append(self.clock.now if t.append_time
                          else self.clock.now + jitter * (self.counter % 3 - 1))
        info = self.lg(t).append_columns(BinaryColumn.from_pylist(values),
                                         BinaryColumn.from_pylist(keys), stamps,
                                         records_per_batch=per_batch)
        t.no_headers.update(range(info.first_offset, info.last_offset + 1))
        self._add_from_files(t, info, keys, values, stamps)

    def _producer_epoch(self, t, pid, bump):
        """The client's epoch for ``pid``: bumped on request, and after a truncation that may
        have lost the state the log keeps for it (an open transaction is then ended, as the
        coordinator fences a producer: ABORT at the new epoch)."""
        if pid in t.unsure or bump:
            t.epochs[pid] += 1
            t.unsure.discard(pid)
            if t.oracle.open_txn_first(pid) is not None:
                self._marker(t, pid, ABORT)
        return t.epochs[pid]

    @rule(which=which, pid=st.sampled_from(TXN_PIDS), recs=record_lists, codec=codecs,
          bump=st.sampled_from([False, False, True]))
    def append_txn(self, which, pid, recs, codec, bump):
        """A transactional batch: the producer keeps its epoch across transactions (its
        sequence goes on) unless bumped."""
        t = self.topic(which)
        o = t.oracle
        epoch = self._producer_epoch(t, pid, bump and o.open_txn_first(pid) is None)
        seq = o.next_seq(pid, epoch)
        keys, values, stamps = self._records(t, recs, 0)
        info = self.lg(t).append_batch(values, keys=keys, headers=headers_for(keys, values),
                                       timestamps_ms=stamps,
                                       compression=codec, producer_id=pid, producer_epoch=epoch,
                                       base_sequence=seq, is_transactional=True)
        self._add_from_files(t, info, keys, values, stamps, pid=pid, epoch=epoch, seq=seq,
                             txn=True)

    @rule(which=which, recs=record_lists, codec=codecs, retry=st.booleans())
    def append_idempotent(self, which, recs, codec, retry):
        """An idempotent producer's batch, sometimes sent twice (a retry: not written again)."""
        t = self.topic(which)
        pid = IDEMPOTENT_PID
        epoch = self._producer_epoch(t, pid, False)
        seq = t.oracle.next_seq(pid, epoch)
        keys, values, stamps = self._records(t, recs, 0)
        kw = dict(keys=keys, headers=headers_for(keys, values), timestamps_ms=stamps,
                  compression=codec, producer_id=pid,
                  producer_epoch=epoch, base_sequence=seq)
        info = self.lg(t).append_batch(values, **kw)
        self._add_from_files(t, info, keys, values, stamps, pid=pid, epoch=epoch, seq=seq)
        if retry:
            again = self.lg(t).append_batch(values, **kw)
            assert (again.first_offset, again.last_offset, again.size_bytes) == \
                (info.first_offset, info.last_offset, 0), (again, info)

    def _marker(self, t, pid, ctype):
        info = self.lg(t).append_control(ctype, producer_id=pid, producer_epoch=t.epochs[pid])
        assert info.first_offset == info.last_offset == t.oracle.leo
        t.oracle.add(MBatch(info.first_offset, info.first_offset, pid=pid,
                            epoch=t.epochs[pid], marker=ctype))

    @rule(which=which, pid=st.sampled_from(TXN_PIDS), abort=st.booleans())
    def end_txn(self, which, pid, abort):
        t = self.topic(which)
        if t.oracle.open_txn_first(pid) is None:
            return
        if pid in t.unsure:
            self._producer_epoch(t, pid, False)   # fenced: ABORT at a new epoch
            return
        self._marker(t, pid, ABORT if abort else COMMIT)

    @rule(ms=st.sampled_from([1, 500, 2_500, 10_000, 40_000, 200_000]))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule(which=which)
    def roll(self, which):
        self.lg(self.topic(which)).roll()

    @rule(which=which)
    def flush(self, which):
        self.lg(self.topic(which)).flush()

    # -- removing data ------------------------------------------------------------------------
    @rule(force=st.booleans(), everything=st.booleans())
    def compact(self, force, everything):
        t = self.topics[0]
        now = self.clock.now
        if not self.compacting:
            assert self.store.compact(force=force) == []
            return
        if everything:
            results = self.store.compact(force=force)
        else:
            results = self.store.compact(COMPACTED, 0, force=force)
        if results:
            self.round_horizons.add(now + self.dr)
        for stats in results:
            t.rounds.append((now, stats.end_offset))
            t.round_end_max = max(t.round_end_max, stats.end_offset)
        if results:
            self.check_compacted_up_to(t, max(s.end_offset for s in results))

    @rule()
    def compact_forced(self):
        self.compact(True, False)

    def check_compacted_up_to(self, t, end):
        """After rounds up to ``end`` (a round cleans every segment from the first to its
        end, with the latest offset of each key of its dirty section): no record of a key
        is left below the key's latest decided, non-aborted record below ``end``."""
        records, aborted, _, undecided = t.oracle.classify()
        latest = {}
        for off in sorted(records):
            if off < end and off not in aborted and off not in undecided:
                latest[records[off][0]] = off
        lg = self.lg(t)
        if end <= lg.log_start_offset:
            return
        for r in lg.iter_records(lg.log_start_offset, end):
            assert r.offset >= latest.get(r.key, -1), \
                ("compaction left an older record of a key", t.name, r.offset, r.key,
                 latest.get(r.key), end)

    @rule(policy=st.sampled_from(["compact", "compact,delete", "delete"]),
          seg_bytes=st.sampled_from([None, 300, 600, 1200]),
          dr=st.sampled_from([None, 0, 3_000, 30_000]),
          ratio=st.sampled_from([None, 0.0, 0.5]))
    def alter_compacted(self, policy, seg_bytes, dr, ratio):
        """alter_topic_config of the compacted topic: its policy (for a while not compacted
        at all), segment size, tombstone retention and dirty ratio."""
        new = {"cleanup.policy": policy}
        if seg_bytes is not None:
            new["segment.bytes"] = seg_bytes
        if dr is not None:
            new["delete.retention.ms"] = dr
            self.dr = dr
        if ratio is not None:
            new["min.cleanable.dirty.ratio"] = ratio
        self.store.alter_topic_config(COMPACTED, new)
        self.compacting = "compact" in policy

    @rule()
    def retention(self):
        report = self.store.enforce_retention(now_ms=self.clock.now)
        assert not report.errors

    @rule()
    def tick(self):
        self.store.tick()

    @rule(which=which, frac=st.floats(0, 1))
    def delete_records(self, which, frac):
        t = self.topic(which)
        lg = self.lg(t)
        start, leo = lg.log_start_offset, lg.log_end_offset
        o = start + int((leo - start) * frac)
        assert lg.delete_records(o) == max(o, start)

    @rule(back=st.integers(0, 12))
    def truncate_compacted(self, back):
        self.truncate_to(0, back)

    @rule(which=which, back=st.integers(0, 12))
    def truncate_to(self, which, back):
        t = self.topic(which)
        lg = self.lg(t)
        segs = lg.segments
        o = max(lg.log_end_offset - back, max(lg.log_start_offset - 2, 0))
        if o >= lg.log_end_offset:
            return
        if o < segs[0].base_offset:
            leo = o
        else:
            kept_seg = max(s.base_offset for s in segs if s.base_offset <= o)
            ends = [last + 1 for sb, _, last in file_batches(lg)
                    if sb == kept_seg and last < o]
            leo = max(ends, default=kept_seg)
        lg.truncate_to(o)
        assert lg.log_end_offset == leo, (o, lg.log_end_offset, leo)
        if t.compact and leo < t.round_end_max:
            # The truncation may cut the later record (or the ABORT marker) a round relied on
            # to drop an older one: what the round removed is gone for good (as after Kafka's
            # unclean leader election), so keys whose latest record is below here are checked
            # loosely from now on.
            t.compromised_below = max(t.compromised_below, leo)
        if t.compact:
            # The producer state is rebuilt from the batches left below the new end, and a
            # round kept only each producer's last batch of its time (REF §6.8): a producer
            # with batches in the cleaned range may come back older, or unknown, as in Kafka.
            t.unsure |= {b.pid for b in t.oracle.hist
                         if b.pid >= 0 and b.base < t.round_end_max and b.last < leo}
        t.cut(leo)
        if o < segs[0].base_offset:
            # truncate_fully_and_start_at: the producers are forgotten with the segments.
            t.oracle.hist = []
        t.truncated_to = leo

    # -- restarts -----------------------------------------------------------------------------
    @rule()
    def clean_reopen(self):
        self.store.close()
        self.reopen(self.root)

    @rule(keep=st.integers(0, 5), torn=st.integers(0, 3))
    def crash(self, keep, torn):
        """A power loss now: the directory tree as it is, with each partition's active
        segment's batches not yet durable (at or above its recovery point and the end the
        last crash left) cut to a prefix of ``keep`` (maybe torn inside the next)."""
        self.generation += 1
        new_root = os.path.join(self.tmp, f"s{self.generation}")
        shutil.copytree(self.root, new_root)
        cuts = {}
        for t in self.topics:
            lg = self.lg(t)
            rp = max(lg.recovery_point, t.survived)
            active = lg.segments[-1]
            path = os.path.join(new_root, f"{t.name}-0", os.path.basename(active.log_path))
            leo = cut_unflushed_tail(active.log_path, path, rp, keep, torn, t.oracle.leo,
                                     active.base_offset)
            cuts[t.name] = leo
        checkpointed = read_offset_checkpoint(os.path.join(new_root, LOG_START_CHECKPOINT))
        self.store.close()
        shutil.rmtree(self.root)
        self.reopen(new_root)
        for t in self.topics:
            leo = cuts[t.name]
            t.cut(leo)
            lg = self.lg(t)
            ck = checkpointed.get((t.name, 0), 0)
            if ck > leo:
                # The log ends below its checkpointed start: recovery starts an empty log there.
                t.oracle.hist = []
                t.oracle.leo = ck
                t.crash_start = ck
            else:
                t.crash_start = max(ck, lg.segments[0].base_offset)
            t.survived = lg.log_end_offset

    # -- checks -------------------------------------------------------------------------------
    @invariant()
    def store_agrees_with_the_model(self):
        if self.store is None:
            return
        self.steps += 1
        try:
            for t in self.topics:
                self._check(t)
            assert self.store.verify() == []
        finally:
            for t in self.topics:
                t.rounds = []
                t.crash_start = None
                t.truncated_to = None

    def _check(self, t: TopicState):
        lg, o = self.lg(t), t.oracle
        leo = lg.log_end_offset
        assert leo == o.leo, (t.name, leo, o.leo)
        if t.truncated_to is None and t.crash_start is None:
            assert leo >= t.leo, ("log end went back", t.name, leo, t.leo)
        start = lg.log_start_offset
        if t.crash_start is not None:
            assert start == t.crash_start, ("log start after a crash", t.name, start,
                                            t.crash_start)
        elif t.truncated_to is not None:
            assert start >= min(t.start, t.truncated_to), (t.name, start, t.start)
        else:
            assert start >= t.start, ("log start went back", t.name, start, t.start)
        assert start <= leo
        assert lg.segments[0].base_offset <= start

        records, aborted, markers, undecided = o.classify()
        got_recs = list(lg.iter_records())
        offs = [r.offset for r in got_recs]
        assert offs == sorted(set(offs)), ("offsets not strictly increasing", t.name)
        got = {r.offset: (r.key, r.value, r.timestamp) for r in got_recs}
        marks, headers, parseable = struct_view(lg)
        if parseable:
            recs, marks2, _ = file_view(lg)
            assert marks2 == marks
            assert {k: v for k, v in recs.items() if k >= start} == got, "kafka-python disagrees"
        for r in got_recs:
            assert tuple(tuple(h) for h in r.headers) == header_of(t, r), \
                ("headers", t.name, r.offset, r.headers)
            assert r.timestamp_type == (1 if t.append_time else 0), (t.name, r)
        for off, rec in got.items():
            assert off >= start
            assert records.get(off) == rec, ("not what was appended", t.name, off, rec,
                                             records.get(off))
        for off in marks:
            assert off in markers, ("not a marker appended", t.name, off)
        bounds = {b.base: b.last for b in o.hist}
        for h in headers:
            assert bounds.get(h["base_offset"]) == h["base_offset"] + h["last_offset_delta"], h

        # What appeared and disappeared since the last check.
        now_present = set(got) | {m for m in marks if m >= start}
        appeared = now_present - t.present
        for off in appeared:
            assert off >= t.leo or (t.crash_start is not None and off < t.start) or \
                t.truncated_to is not None and off >= t.truncated_to, \
                ("an offset appeared", t.name, off, t.leo, t.start)
        gone = {x for x in t.present - now_present if x >= start}
        if not t.compact:
            assert not gone, ("removed from a delete topic", t.name, sorted(gone))
            want = {off: r for off, r in records.items() if off >= start}
            assert got == want, ("delete topic: not every record", t.name)
        else:
            self._check_compacted(t, lg, start, got, marks, headers, gone, records, aborted,
                                  markers, undecided)
        if os.environ.get("STORE_MODEL_EVENTS"):
            from hypothesis import event
            event(f"{t.name}: removed {min(len(gone), 3)}")
            event(f"{t.name}: segments {min(len(lg.segments), 6)}")
            event(f"{t.name}: start moved {start > t.start}")
            event(f"{t.name}: crash cut {t.crash_start is not None and leo < t.leo}")
            event(f"{t.name}: crash start fell back {t.crash_start is not None and start < t.start}")
            event(f"{t.name}: truncated {t.truncated_to is not None}")
            event(f"{t.name}: truncated into cleaned {t.compromised_below > 0}")
            event(f"{t.name}: open txn {o.lso(start) < leo}")
            event(f"{t.name}: start inside first segment {start > lg.segments[0].base_offset}")
        t.present = now_present
        t.start = start
        t.leo = leo

        # read_committed: nothing aborted or at or past the last stable offset. A producer
        # whose state a truncation may have lost (t.unsure) may or may not hold it back.
        lso = lg.last_stable_offset
        lo, hi = lso_bounds(t, start)
        assert lo <= lso <= hi, (t.name, lso, lo, hi)
        committed = list(lg.iter_records(isolation_level=RC))
        for r in committed:
            assert r.offset not in aborted and r.offset < lso, ("read_committed", t.name,
                                                                r.offset)
        if not t.compact:
            want = [off for off in sorted(records) if start <= off < lso and off not in aborted]
            assert [r.offset for r in committed] == want, ("read_committed", t.name)
        else:
            replay = {}
            for r in committed:
                replay[r.key] = r.value
            latest = {}
            for off in sorted(records):
                if off < lso and off not in aborted and off not in undecided:
                    latest[records[off][0]] = (off, records[off][1])
            for k, (off, v) in latest.items():
                if off < start:
                    assert k not in replay, ("a key below the log start came back", k)
                elif off < t.compromised_below:
                    continue
                else:
                    assert replay.get(k) == v, ("latest value of a key", t.name, k, off, v,
                                                replay.get(k))
            for k in replay:
                if replay[k] is not None and not t.compromised_below:
                    assert k in latest, ("a key with no decided record", t.name, k)

        self._check_reads(t, lg, start, leo, got_recs, committed)
        # Producer state: each producer's epoch (its last batch's, marker or data) and the last
        # offset of its data at that epoch (Kafka clears it when the epoch changes).
        want_producers = {}
        for b in o.hist:
            if b.pid < 0:
                continue
            ep, last = want_producers.get(b.pid, (-1, None))[::-1]
            if b.epoch != ep:
                ep, last = b.epoch, -1
            if b.marker is None:
                last = b.last
            want_producers[b.pid] = (last, ep)
        have = lg.active_producers()
        for pid in t.unsure:
            want_producers.pop(pid, None)
            have.pop(pid, None)
        assert have == want_producers, ("producer state", t.name, have, want_producers)
        self._check_follower(t, start, leo, got_recs)
        cp = self.store.cleaner_manager.all_cleaner_checkpoints().get(t.tp)
        if cp is not None:
            assert cp <= leo, ("cleaner checkpoint past the log end", t.name, cp, leo)

    def _check_follower(self, t, start, leo, got_recs):
        """The read-only store sees the writer's log: same end, same last stable offset and
        the same records from the writer's log start (its own start may lag behind: it reads
        the checkpoint, not the writer's memory)."""
        ro = self.ro.partition(t.name, 0)
        assert ro.log_end_offset == leo, ("follower's log end", t.name, ro.log_end_offset, leo)
        ro_start = ro.log_start_offset
        assert lg_first_base(self.lg(t)) <= ro_start <= leo, ("follower's log start", t.name,
                                                               ro_start, start)
        frm = max(start, ro_start)
        want = [(r.offset, r.key, r.value, r.timestamp, tuple(r.headers)) for r in got_recs
                if r.offset >= frm]
        have = [(r.offset, r.key, r.value, r.timestamp, tuple(r.headers))
                for r in ro.iter_records(frm)]
        assert have == want, ("follower's records", t.name)
        lo, hi = lso_bounds(t, ro_start)
        assert lo <= ro.last_stable_offset <= hi, \
            ("follower's last stable offset", t.name, ro.last_stable_offset, lo, hi)
        cols = ro.read_columns(frm, isolation_level=RC)
        assert cols.offsets.tolist() == [r.offset for r in self.lg(t).iter_records(
            frm, isolation_level=RC)], ("follower's read_committed", t.name)

    def _check_compacted(self, t, lg, start, got, marks, headers, gone, records, aborted,
                         markers, undecided):
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
            if off in t.horizons:
                assert hz == t.horizons[off], ("a delete horizon moved", off)
            elif off in marks or got[off][1] is None:
                assert hz in self.round_horizons, ("horizon of no round", off, hz)
                t.horizons[off] = hz
        assert not (gone and not t.rounds), ("removed without compaction", sorted(gone))
        for off in sorted(gone):
            assert self.removal_allowed(t, off, records, aborted, markers, undecided), \
                ("removed against the rules", off, records.get(off) or markers.get(off),
                 t.rounds, t.horizons.get(off))

    def removal_allowed(self, t, off, records, aborted, markers, undecided) -> bool:
        if off in aborted:
            return True
        if off in markers:
            return self.horizon_passed(t, off)
        assert off not in undecided, ("an open transaction's record was removed", off)
        key, value, _ = records[off]
        for now, end in t.rounds:
            if off >= end:
                continue
            for later in range(off + 1, end):
                rec = records.get(later)
                if (rec is not None and rec[0] == key and later not in aborted
                        and later not in undecided
                        and (self.min_lag == 0 or rec[2] <= now - self.min_lag)):
                    return True
        return value is None and self.horizon_passed(t, off)

    def horizon_passed(self, t, off) -> bool:
        if not t.rounds:
            return False
        latest = max(now for now, _ in t.rounds)
        if off in t.horizons:
            return t.horizons[off] <= latest
        return self.dr == 0

    def _check_reads(self, t, lg, start, leo, got_recs, committed):
        rnd = random.Random(self.steps * 7919 + leo)
        want = [(r.offset, r.key, r.value, r.timestamp) for r in got_recs]
        # read(): consumed from the log start with a small max_bytes, strictly increasing.
        for level, exp in (("read_uncommitted", want),
                           (RC, [(r.offset, r.key, r.value, r.timestamp) for r in committed])):
            pos, out = start, []
            for _ in range(len(exp) + 2):
                recs = lg.read(pos, max_bytes=rnd.choice([1, 150, 1 << 20]),
                               isolation_level=level)
                if not recs:
                    break
                out += [(r.offset, r.key, r.value, r.timestamp) for r in recs]
                pos = recs[-1].offset + 1
            assert out == exp, ("read() consumption", t.name, level)
            cols = lg.read_columns(isolation_level=level)
            assert list(zip(cols.offsets.tolist(), cols.keys.to_pylist(),
                            cols.values.to_pylist(), cols.timestamps_ms.tolist())) == exp, \
                ("read_columns", t.name, level)
            if exp:
                a = rnd.randint(start, leo)
                b = rnd.randint(a, leo)
                cols = lg.read_columns(a, b, isolation_level=level)
                assert cols.offsets.tolist() == [r[0] for r in exp if a <= r[0] < b], \
                    ("read_columns range", t.name, level, a, b)
        # offset_for_time: the first record read (log order) with a timestamp at least ts.
        stamps = sorted({r[3] for r in want})
        qs = rnd.sample(stamps, min(3, len(stamps))) + [self.clock.now - 5_000,
                                                        self.clock.now + 10_000]
        for q in qs:
            q = max(q + rnd.choice([-1, 0, 0, 1]), 0)
            hit = next((r for r in want if r[3] >= q), None)
            res = lg.offset_for_time(q)
            assert (None if res is None else (res.offset, res.timestamp)) == \
                (None if hit is None else (hit[0], hit[3])), ("offset_for_time", t.name, q)
        assert lg.offset_for_time(EARLIEST_TIMESTAMP)[:2] == (start, -1)
        assert lg.offset_for_time(LATEST_TIMESTAMP)[:2] == (leo, -1)


StoreModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("STORE_MODEL_EXAMPLES", 40)),
    stateful_step_count=int(os.environ.get("STORE_MODEL_STEPS", 40)), deadline=None,
    derandomize=not os.environ.get("STORE_MODEL_RANDOM"), database=None)
TestStoreModel = StoreModel.TestCase


# -- regressions the model found, reduced -------------------------------------------------------

@pytest.mark.parametrize("delay", [0, 60_000])
def test_a_read_only_follower_sees_a_segment_the_cleaner_replaced(tmp_path, delay):
    # A cleaning round swaps a sealed segment for its cleaned copy under the same name. The
    # follower checked the files it held for replacement only when the listing of segments
    # had changed (a roll, a deletion), else only the active segment's: it went on reading
    # the old file, records the cleaner had removed (offset 0 here), until the next roll.
    store = segstore.open(str(tmp_path), clock=FakeClock(T0))
    ro = None
    try:
        store.create_topic("t", 1, config={"cleanup.policy": "compact",
                                           "min.cleanable.dirty.ratio": 0.0,
                                           "file.delete.delay.ms": delay})
        lg = store.partition("t", 0)
        lg.append_batch([b"a"], keys=[b"k"])
        lg.append_batch([b"b"], keys=[b"k"])
        lg.roll()
        lg.append_batch([b"c"], keys=[b"x"])
        ro = segstore.open(str(tmp_path), readonly=True)
        follower = ro.partition("t", 0)
        assert [r.offset for r in follower.read(0)] == [0, 1, 2]
        store.compact("t", 0, force=True)
        assert [r.offset for r in lg.read(0)] == [1, 2]
        assert [r.offset for r in follower.read(0)] == [1, 2]
        assert follower.read_columns().offsets.tolist() == [1, 2]
    finally:
        if ro is not None:
            ro.close()
        store.close()


def test_a_group_whose_indexes_were_full_is_cleaned_into_one_segment(tmp_path):
    # Grouping bounds a group by its segments' index bytes (Kafka's groupSegmentsBySize), but
    # the cleaned segment is indexed batch by batch, where a source segment's first batch had
    # no entry: merging a cleaned segment whose offset index was full (3 entries of 24 bytes)
    # with the next one (1 batch, no entry) needed 4 entries, and the round failed with
    # "index ....index.cleaned is full", leaving the partition uncleanable until restart.
    store = segstore.open(str(tmp_path), clock=FakeClock(T0))
    try:
        store.create_topic("t", 1, config={"cleanup.policy": "compact",
                                           "min.cleanable.dirty.ratio": 0.0,
                                           "segment.index.bytes": 24,
                                           "index.interval.bytes": 0})
        lg = store.partition("t", 0)

        def app(i):
            lg.append_batch([b"v%d" % i], keys=[b"k%d" % i], timestamps_ms=[T0])
        for i in range(5):
            app(i)                  # two batches a segment: the time index is then full
        lg.roll()
        app(5)
        assert len(store.compact("t", 0, force=True)) == 1
        assert [s.base_offset for s in lg.segments] == [0, 4, 5]
        assert lg.segments[0].offset_index.entries == 3     # full
        app(6)
        lg.roll()
        app(7)
        assert len(store.compact("t", 0, force=True)) == 1
        assert [s.base_offset for s in lg.segments] == [0, 5, 7]
        assert store.metrics()["uncleanable-partitions-count"] == 0
        assert [r.offset for r in lg.iter_records()] == list(range(8))
        assert lg.offset_for_time(T0)[:2] == (0, T0)
        assert store.verify() == []
    finally:
        store.close()
    store = segstore.open(str(tmp_path))
    try:
        assert store.verify() == []
        assert [r.offset for r in store.partition("t", 0).iter_records()] == list(range(8))
    finally:
        store.close()
