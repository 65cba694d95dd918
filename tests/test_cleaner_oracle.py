"""Compaction against plain-Python oracles (issue 6, "Tests": the oracle and KAFKA-8522).

Random workloads (hypothesis, the conftest profile): skewed keys, tombstones, keyless records,
headers, gzip and plain batches, several segments, offset maps too small for one round, rounds
run one at a time with the FakeClock moving between them so delete horizons pass sometimes.
After every round:

* every retained record is byte-identical (key, value, headers, timestamp) to the record
  appended at its offset; offsets only disappear, never change; the log end offset stays;
* replaying the log gives every key the value a replay of the original log gives it: a key whose
  last record is a value still has that record; a key whose last record is a tombstone has
  nothing but that tombstone, or nothing at all once the tombstone's horizon has passed;
* a tombstone is stamped with ``now + delete.retention.ms`` by the first round that reads its
  batch, keeps that horizon, is never dropped before it and is dropped by the first round at or
  after it that reaches it;
* every batch is one of the appended batches (same base and last offset), and kafka-python
  parses every segment file (CRCs, records) into exactly segstore's view.

KIP-280 strategies are checked against a replay with the strategy's rule, and the KAFKA-8522
scenario (a quiet log with tombstones in its first segments) with a scripted timeline.
"""

from __future__ import annotations

import math
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords as KpMemoryRecords

import segstore
from conftest import FakeClock, batch_spans, v2_header
from segstore import TopicPartition
from segstore.producer_state import ProducerStateManager
from segstore.records import ControlRecordType
from segstore.transaction_index import collect_aborted_transactions
from keyless import append_batch_unvalidated

T0 = 1_700_000_000_000
TP = TopicPartition("t", 0)
DR = 10_000                         # delete.retention.ms of the generated topics
ATTR_DELETE_HORIZON = 0x40

# Hypothesis: the conftest profile, capped so a default run stays well under a minute (the
# "dev" profile runs its full count).
_PROFILE = settings()
EXAMPLES = (_PROFILE.max_examples if os.environ.get("HYPOTHESIS_PROFILE") == "dev"
            else min(_PROFILE.max_examples, 40))
oracle_settings = settings(max_examples=EXAMPLES, deadline=None,
                           suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture])

# Keys 0..6 with a zipf-like skew (key j drawn with probability ~ 1 / 2^j), or no key.
skewed_key = st.integers(1, 127).map(lambda u: 6 - int(math.log2(u)))
key_st = st.one_of(st.none(), skewed_key, skewed_key, skewed_key, skewed_key)
value_st = st.one_of(st.none(), st.binary(max_size=12), st.binary(max_size=12))
header_st = st.lists(st.tuples(st.sampled_from(["h", "v", "trace"]),
                               st.one_of(st.none(), st.binary(max_size=6))), max_size=2)
record_st = st.tuples(key_st, value_st, header_st, st.integers(-500, 500))
batch_st = st.tuples(st.lists(record_st, min_size=1, max_size=5),
                     st.sampled_from(["none", "none", "gzip"]), st.booleans())
phase_st = st.tuples(st.lists(batch_st, max_size=6), st.booleans(),
                     st.sampled_from([0, 0, DR // 2, DR, 3 * DR]), st.integers(0, 3))
config_st = st.fixed_dictionaries({
    "slots": st.integers(2, 40),
    "load_factor": st.sampled_from([0.75, 0.9]),
    "segment_bytes": st.sampled_from([450, 700, 1500]),
})


# -- reading the log ---------------------------------------------------------------------------

def current(lg) -> list[tuple]:
    """(offset, key, value, headers, timestamp) of every record, as segstore reads them."""
    return [(r.offset, r.key, r.value, [tuple(h) for h in r.headers], r.timestamp)
            for r in lg.iter_records()]


def file_view(lg) -> tuple[list, list]:
    """kafka-python's data records of every segment file and the v2 headers (struct) of every
    batch."""
    recs, headers = [], []
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()
        mr = KpMemoryRecords(data)
        n = 0
        while mr.has_next():
            b = mr.next_batch()
            assert b.validate_crc(), seg.log_path
            if not b.is_control_batch:
                recs += [(r.offset, r.key, r.value, [tuple(h) for h in r.headers], r.timestamp)
                         for r in b]
            n += 1
        spans = batch_spans(data)
        assert len(spans) == n and (not spans or sum(s for _, s in spans) == len(data))
        headers += [v2_header(data, p) for p, _ in spans]
    return recs, headers


def one_round(store, now):
    """One cleaning round of the partition, as store.compact runs them (None: nothing to do)."""
    ltc = store.cleaner_manager.grab_log(TP, now, force=True)
    if ltc is None:
        return None
    stats = store.cleaner.clean_log(-1, ltc, now, raise_errors=True)
    assert stats is not None
    return stats


# -- the offset-strategy oracle ----------------------------------------------------------------

class Oracle:
    """What was appended, and what compaction may do with it."""

    def __init__(self):
        self.orig: dict[int, tuple] = {}      # offset -> (key, value, headers, ts)
        self.batches: dict[int, int] = {}     # base offset -> last offset
        self.latest: dict[bytes, int] = {}    # key -> offset of its last record
        self.horizons: dict[int, int] = {}    # tombstone offset -> horizon seen on it
        self.leo = 0
        self.present: set[int] = set()

    def appended(self, info, recs) -> None:
        assert info.first_offset == self.leo
        self.batches[info.first_offset] = info.last_offset
        for i, (k, v, h, ts) in enumerate(recs):
            off = info.first_offset + i
            self.orig[off] = (k, v, [tuple(x) for x in h], ts)
            self.present.add(off)
            if k is not None:
                self.latest[k] = off
        self.leo = info.last_offset + 1

    def check(self, lg, now: int, stats=None) -> None:
        cur = current(lg)
        offs = [r[0] for r in cur]
        assert offs == sorted(set(offs))
        assert lg.log_end_offset == self.leo and lg.log_start_offset == 0
        for off, k, v, h, ts in cur:                      # byte-identical survivors
            assert (k, v, h, ts) == self.orig[off], off
        assert set(offs) <= self.present                   # offsets only disappear
        gone = self.present - set(offs)
        self.present = set(offs)
        by_key: dict = {}
        for off, k, v, _, _ in cur:
            by_key.setdefault(k, []).append(off)
        for k, last in self.latest.items():
            if self.orig[last][1] is not None:
                assert last in self.present, (k, last)    # the latest value is never lost
            elif last not in self.present:
                # A dropped final tombstone takes its key with it, and only after its horizon.
                assert k not in by_key, (k, by_key.get(k))
                if last in gone:
                    assert last in self.horizons and self.horizons[last] <= now, (k, last)
        # Indexes of the cleaned segments: a read from any offset starts at the first record at
        # or after it; a full check of every segment finds nothing.
        assert lg.verify() == []
        for o in range(0, self.leo, max(1, self.leo // 7)):
            nxt = next((x for x in offs if x >= o), None)
            got = lg.read(o, max_records=1) if nxt is not None else []
            assert [r.offset for r in got][:1] == ([nxt] if nxt is not None else []), o
        # Delete horizons (KIP-534).
        recs, headers = file_view(lg)
        assert recs == cur                                 # kafka-python agrees with segstore
        for b in headers:
            assert self.batches.get(b["base_offset"]) == b["base_offset"] + b["last_offset_delta"]
        batch_of = {}
        for b in headers:
            for off in range(b["base_offset"], b["base_offset"] + b["last_offset_delta"] + 1):
                batch_of[off] = b
        end = stats.end_offset if stats is not None else 0
        for off, k, v, _, _ in cur:
            if v is not None or k is None:
                continue
            b = batch_of[off]
            if b["attributes"] & ATTR_DELETE_HORIZON:
                h = b["base_timestamp"]
                if off in self.horizons:
                    assert h == self.horizons[off], off   # a horizon never moves
                else:
                    assert stats is not None and h == now + DR, (off, h, now)
                    self.horizons[off] = h
            if stats is not None and off < end:
                # Read by this round: stamped, and kept only because its horizon is ahead.
                assert b["attributes"] & ATTR_DELETE_HORIZON, off
                assert self.horizons[off] > now, (off, self.horizons[off], now)

    def final_offsets(self, now: int) -> list[int]:
        """After every record has been cleaned at ``now``: the latest record of every key,
        minus final tombstones whose horizon had passed."""
        out = []
        for k, last in self.latest.items():
            if self.orig[last][1] is None and self.horizons.get(last, now + 1) <= now:
                continue
            out.append(last)
        return sorted(out)


def open_compacted(root, clock, cfg, strategy="offset", header=None):
    bpe = 24 if strategy == "offset" else 32
    store = segstore.open(root, clock=clock, config={
        "log.cleaner.dedupe.buffer.size": bpe * cfg["slots"],
        "log.cleaner.io.buffer.load.factor": cfg["load_factor"]})
    topic = {"cleanup.policy": "compact", "segment.bytes": cfg["segment_bytes"],
             "delete.retention.ms": DR, "min.cleanable.dirty.ratio": 0.0,
             "compaction.strategy": strategy}
    if header:
        topic["compaction.strategy.header"] = header
    store.create_topic("t", 1, config=topic)
    return store, store.partition("t", 0)


def append(lg, oracle, clock, batch) -> None:
    recs, codec, _ = batch
    keys = [None if k is None else b"k%d" % k for k, _, _, _ in recs]
    values = [v for _, v, _, _ in recs]
    headers = [h for _, _, h, _ in recs]
    stamps = [clock.now + d for _, _, _, d in recs]
    info = append_batch_unvalidated(lg, values, keys=keys, headers=headers, timestamps_ms=stamps,
                           compression=codec)
    oracle.appended(info, list(zip(keys, values, headers, stamps)))


@oracle_settings
@given(cfg=config_st, phases=st.lists(phase_st, min_size=1, max_size=4))
def test_random_workloads_against_a_replay(tmp_path_factory, cfg, phases):
    root = str(tmp_path_factory.mktemp("oracle") / "store")
    clock = FakeClock(T0)
    store, lg = open_compacted(root, clock, cfg)
    oracle = Oracle()
    try:
        for batches, roll, advance, rounds in phases:
            for batch in batches:
                append(lg, oracle, clock, batch)
                if batch[2]:
                    lg.roll()
            if roll:
                lg.roll()
            clock.advance(advance)
            for _ in range(rounds):
                stats = one_round(store, clock.now)
                oracle.check(lg, clock.now, stats)
                if stats is None:
                    break
        # Finally clean everything (the active segment too, once rolled) at one time.
        lg.roll()
        for _ in range(200):
            stats = one_round(store, clock.now)
            oracle.check(lg, clock.now, stats)
            if stats is None:
                break
        else:
            pytest.fail("cleaning never finished")
        assert [r[0] for r in current(lg)] == oracle.final_offsets(clock.now)
        # Past every horizon, one more pass (over new data) leaves only the latest values.
        clock.advance(DR)
        info = lg.append_batch([b"filler"], keys=[b"filler"], timestamps_ms=[clock.now])
        oracle.appended(info, [(b"filler", b"filler", [], clock.now)])
        lg.roll()
        while True:
            stats = one_round(store, clock.now)
            oracle.check(lg, clock.now, stats)
            if stats is None:
                break
        want = sorted(last for last in oracle.latest.values() if oracle.orig[last][1] is not None)
        assert [r[0] for r in current(lg)] == want == oracle.final_offsets(clock.now)
        # What was cleaned is what a reopened store reads (and recovers nothing from).
        before = current(lg)
        store.close()
        store = segstore.open(root, clock=clock)
        lg = store.partition("t", 0)
        assert current(lg) == before and lg.log_end_offset == oracle.leo
        assert lg.verify() == []
    finally:
        store.close()


# -- KIP-280 strategies ------------------------------------------------------------------------

def strategy_value(strategy: str, rec) -> float:
    k, v, headers, ts = rec
    if strategy == "timestamp":
        return ts
    for name, val in headers:
        if name == "v":
            return struct.unpack(">q", val)[0] if val is not None and len(val) == 8 else -math.inf
    return -math.inf


def int64_header(x: int):
    return ("v", struct.pack(">q", x))


strategy_record_st = st.tuples(
    skewed_key, value_st,
    st.one_of(st.just([]), st.tuples(st.integers(-3, 3)).map(lambda t: [int64_header(t[0])]),
              st.just([("v", b"1234")]), st.just([("v", None)]),
              st.tuples(st.integers(-3, 3)).map(lambda t: [("h", b"x"), int64_header(t[0])])),
    st.integers(-3, 3))
strategy_batch_st = st.tuples(st.lists(strategy_record_st, min_size=1, max_size=4),
                              st.sampled_from(["none", "gzip"]), st.booleans())


@oracle_settings
@given(strategy=st.sampled_from(["timestamp", "header"]), cfg=config_st,
       batches=st.lists(strategy_batch_st, min_size=1, max_size=12))
def test_strategies_against_a_replay(tmp_path_factory, strategy, cfg, batches):
    """After every record has been cleaned, each key keeps exactly the record with the highest
    (strategy value, offset): timestamp, or the int64 header "v" (records without an 8-byte
    "v" lose to those with one); past the horizons winning tombstones go too."""
    root = str(tmp_path_factory.mktemp("strategy") / "store")
    clock = FakeClock(T0)
    store, lg = open_compacted(root, clock, cfg, strategy, "v" if strategy == "header" else None)
    oracle = Oracle()
    try:
        for batch in batches:
            append(lg, oracle, clock, batch)
            if batch[2]:
                lg.roll()
        lg.roll()
        winners = {}
        for off in sorted(oracle.orig):
            rec = oracle.orig[off]
            if rec[0] is None:
                continue
            best = winners.get(rec[0])
            if best is None or (strategy_value(strategy, rec), off) >= \
                    (strategy_value(strategy, oracle.orig[best]), best):
                winners[rec[0]] = off
        for _ in range(200):
            stats = one_round(store, clock.now)
            if stats is None:
                break
        cur = current(lg)
        for off, k, v, h, ts in cur:
            assert (k, v, h, ts) == oracle.orig[off]
        assert [r[0] for r in cur] == sorted(winners.values())
        recs, _ = file_view(lg)
        assert recs == cur
        clock.advance(DR)
        lg.append_batch([b"filler"], keys=[b"filler"], headers=[[int64_header(0)]])
        lg.roll()
        while one_round(store, clock.now) is not None:
            pass
        cur = current(lg)
        assert [r[0] for r in cur[:-1]] == sorted(o for o in winners.values()
                                                  if oracle.orig[o][1] is not None)
    finally:
        store.close()


# -- KAFKA-8522 --------------------------------------------------------------------------------

def test_tombstones_of_a_quiet_log_go_once_their_horizon_passes(tmp_path):
    """KAFKA-8522: a low-traffic compacted log with tombstones in its first segments, cleaned
    again and again as a record trickles in every ten minutes (each makes the log overdue by
    max.compaction.lag.ms once it is older than that, so no force is needed). Kafka's
    pre-KIP-534 rule kept such tombstones forever (the merged segment's mtime kept moving);
    with per-batch horizons they are gone in the first cleaning at or after (their first
    cleaning + delete.retention.ms), and not before."""
    hour, minute = 3_600_000, 60_000
    clock = FakeClock(T0)
    store = segstore.open(str(tmp_path / "store"), clock=clock,
                          config={"log.cleaner.dedupe.buffer.size": 24 * 1000})
    store.create_topic("t", 1, config={"cleanup.policy": "compact", "delete.retention.ms": hour,
                                       "max.compaction.lag.ms": 5 * minute,
                                       "segment.bytes": 1 << 20})
    lg = store.partition("t", 0)
    for i in range(10):
        lg.append_batch([b"v%d" % i], keys=[b"k%d" % i])
    lg.roll()
    lg.append_batch([None] * 5, keys=[b"k%d" % i for i in range(5)])
    lg.roll()
    tombstones = set(range(10, 15))
    clock.advance(30 * minute)
    first_clean = clock.now
    assert store.compact()                       # overdue: cleaned without force
    seen = []
    for step in range(20):
        present = {r.offset for r in lg.iter_records() if r.value is None}
        seen.append((clock.now, present))
        if clock.now < first_clean + hour:
            assert present == tombstones, (step, clock.now - first_clean)
        else:
            assert present == set(), (step, clock.now - first_clean)
        lg.append_batch([b"trickle-%d" % step], keys=[b"k9"])
        lg.roll()
        assert store.compact() == []                 # too young to be due, not dirty enough
        clock.advance(10 * minute)
        assert store.compact(), step
    # The values of the deleted keys went in the first cleaning; the live ones stay.
    keys = {r.key for r in lg.iter_records()}
    assert keys == {b"k5", b"k6", b"k7", b"k8", b"k9"}
    assert [v for t, v in seen if t >= first_clean + hour][0] == set()
    store.close()


# -- transactions --------------------------------------------------------------------------------
#
# Transactional producers 1-3 (data, COMMIT, ABORT), plain and idempotent (producer 9) writes,
# segments rolled anywhere (also inside transactions, so markers and their .txnindex entries land
# in later segments, other groups or the active segment). After every round, the read-committed
# view (records outside every aborted
# transaction listed by the current .txnindex files, as a consumer filters them) replays to the
# same key -> value map as the committed records of the original log; aborted data never becomes
# visible; the producer state a reload rebuilds from the cleaned log (last sequence, last data
# offset, epoch, open transactions) is the state before cleaning.


txn_op_st = st.one_of(
    st.tuples(st.just("data"), st.integers(1, 3),
              st.lists(st.tuples(skewed_key, st.booleans()), min_size=1, max_size=3)),
    st.tuples(st.just("commit"), st.integers(1, 3)),
    st.tuples(st.just("abort"), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.just(0),
              st.lists(st.tuples(skewed_key, st.booleans()), min_size=1, max_size=3)),
    st.tuples(st.just("idempotent"), st.just(9),
              st.lists(st.tuples(skewed_key, st.booleans()), min_size=1, max_size=3)),
    st.tuples(st.just("roll"), st.just(0)),
    st.tuples(st.just("clean"), st.sampled_from([0, DR // 2, DR]), st.integers(1, 2)),
)


def producer_state(segments) -> tuple:
    m = ProducerStateManager.rebuild(segments)
    return ({pid: (e.last_sequence, e.last_data_offset, e.producer_epoch)
             for pid, e in m.producers.items()}, m.first_unstable_offset())


def committed_view(recs, aborted_ranges) -> dict:
    """key -> last value over records outside the aborted ranges [(pid, first, last)]."""
    out = {}
    for off, k, v, pid in recs:
        if k is None or any(p == pid and a <= off <= b for p, a, b in aborted_ranges):
            continue
        out[k] = v
    return {k: v for k, v in out.items() if v is not None}


@oracle_settings
@given(cfg=config_st, ops=st.lists(txn_op_st, max_size=25))
def test_transactional_workloads_against_a_committed_replay(tmp_path_factory, cfg, ops):
    root = str(tmp_path_factory.mktemp("txn") / "store")
    clock = FakeClock(T0)
    cfg = dict(cfg, segment_bytes=1 << 20)          # rolls only where the workload says
    store, lg = open_compacted(root, clock, cfg)
    orig: dict[int, tuple] = {}                     # offset -> (key, value, producer id)
    aborted: list[tuple] = []                       # (pid, first data offset, marker offset)
    open_txn: dict[int, int] = {}                   # pid -> first offset
    txn_data: dict[int, list] = {}
    seq = {1: 0, 2: 0, 3: 0, 9: 0}

    def write(pid, recs, transactional):
        keys = [b"k%d" % k for k, _ in recs]
        values = [None if tomb else b"v%d-%d" % (lg.log_end_offset, i)
                  for i, (_, tomb) in enumerate(recs)]
        kw = {}
        if pid:
            kw = dict(producer_id=pid, producer_epoch=0, base_sequence=seq[pid],
                      is_transactional=transactional)
            seq[pid] += len(recs)
        info = append_batch_unvalidated(lg, values, keys=keys, **kw)
        for i in range(len(recs)):
            orig[info.first_offset + i] = (keys[i], values[i], pid or -1)
        return info

    def check(stats=None):
        cur = [(r.offset, r.key, r.value) for r in lg.iter_records()]
        for off, k, v in cur:
            assert (k, v) == orig[off][:2], off
        assert lg.log_end_offset == leo[0]
        index = [(t.producer_id, t.first_offset, t.last_offset)
                 for t in collect_aborted_transactions(lg.segments, 0, lg.log_end_offset)]
        stable = lg.last_stable_offset
        got = committed_view([(o, k, v, orig[o][2]) for o, k, v in cur if o < stable], index)
        want = committed_view([(o, k, v, p) for o, (k, v, p) in sorted(orig.items())
                               if o < stable], aborted)
        assert got == want
        # Every aborted record still in the log is covered by an index entry.
        for off, _, _ in cur:
            pid = orig[off][2]
            if any(p == pid and a <= off <= b for p, a, b in aborted):
                assert any(p == pid and a <= off <= b for p, a, b in index), off
        assert producer_state(lg.segments) == before_state[0]
        recs, _ = file_view(lg)
        assert [r[:3] for r in recs] == cur
        assert lg.verify() == []

    leo = [0]
    before_state = [None]
    try:
        for op in ops:
            kind, arg = op[0], op[1]
            if kind == "data":
                info = write(arg, op[2], True)
                open_txn.setdefault(arg, info.first_offset)
                txn_data.setdefault(arg, []).append(info)
            elif kind in ("commit", "abort"):
                if arg not in open_txn:
                    continue
                ctype = ControlRecordType.COMMIT if kind == "commit" else ControlRecordType.ABORT
                info = lg.append_control(ctype, producer_id=arg, producer_epoch=0)
                if kind == "abort":
                    aborted.append((arg, open_txn[arg], info.first_offset))
                del open_txn[arg]
                txn_data.pop(arg, None)
            elif kind == "plain":
                write(0, op[2], False)
            elif kind == "idempotent":
                write(9, op[2], False)
            elif kind == "roll":
                lg.roll()                   # also inside transactions: markers land later
            else:
                leo[0] = lg.log_end_offset
                before_state[0] = producer_state(lg.segments)
                clock.advance(arg)
                for _ in range(op[2]):
                    stats = one_round(store, clock.now)
                    check(stats)
                    if stats is None:
                        break
        for pid in list(open_txn):
            info = lg.append_control(ControlRecordType.ABORT, producer_id=pid, producer_epoch=0)
            aborted.append((pid, open_txn.pop(pid), info.first_offset))
        lg.roll()
        leo[0] = lg.log_end_offset
        before_state[0] = producer_state(lg.segments)
        assert before_state[0][1] is None
        for now in (clock.now, clock.now + DR, clock.now + DR):
            for _ in range(100):
                stats = one_round(store, now)
                check(stats)
                if stats is None:
                    break
            lg.append_batch([b"tick"], keys=[b"tick"])
            orig[lg.log_end_offset - 1] = (b"tick", b"tick", -1)
            lg.roll()
            leo[0] = lg.log_end_offset
            before_state[0] = producer_state(lg.segments)
    finally:
        store.close()
