"""Model-based test of PartitionLog's read paths (read, read_columns, iter_records,
offset_for_time, the log start / end / last stable offsets), for the writer and for a read-only
follower of the same directory.

The oracle is Kafka's rules written out in plain Python over a list of the batches the test
appended (nothing of segstore is used to compute an expectation; batch sizes come from walking
the segment files with conftest's struct-only helpers):

* every append takes consecutive offsets; a COMMIT/ABORT marker takes one and is never returned;
* read_uncommitted returns every data record in [log start, log end);
* the last stable offset is the first offset of the oldest open transaction (clamped to
  [log start, log end]), else the log end; read_committed returns the records below it, without
  the transactional batches of a producer whose transaction holding them ended with ABORT;
* read(offset, max_records, max_bytes): a prefix of what is due from offset, at most
  max_records, at least one record when any is due, and past the first batch no more than
  max_bytes of batches; [] only when nothing is due;
* truncate_to(o) removes every batch holding an offset >= o (segstore ends the log where the
  data left ends); below the first segment it starts an empty log at o; delete_records raises
  the log start; deleting segments (retention) raises it to the first segment kept.

A read-only PartitionLog has no log-start checkpoint: its log start is the first segment's base.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from conftest import FakeClock, batch_spans, v2_header
from segstore.columns import BinaryColumn
from segstore.config import TopicConfig
from segstore.errors import OffsetOutOfRangeError
from segstore.log import PartitionLog
from segstore.records import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP,
                              ControlRecordType)

COMMIT, ABORT = ControlRecordType.COMMIT, ControlRecordType.ABORT
T0 = 1_700_000_000_000  # the clock (so every marker's timestamp); records are later
TS_SPAN = 400
RU, RC = "read_uncommitted", "read_committed"
TXN_PIDS = (1, 2, 3)
IDEMPOTENT_PID = 9


@dataclass
class Batch:
    base: int
    last: int
    pid: int = -1
    epoch: int = -1
    txn: bool = False
    marker: Optional[int] = None  # ControlRecordType of a marker, None for data
    seq: int = -1
    records: list = field(default_factory=list)  # (offset, key, value, timestamp, headers)
    deleted: bool = False  # its segment was deleted (retention): gone from the files


# -- the oracle -------------------------------------------------------------------------------

class Model:
    def __init__(self):
        self.hist: list[Batch] = []  # every batch not truncated, in log order
        self.start = 0  # the writer's log start offset
        self.leo = 0
        self.seg0 = 0  # first segment's base: the read-only log's start

    def files(self):
        return [b for b in self.hist if not b.deleted]

    def next_seq(self, pid, epoch):
        """The base sequence the log accepts from ``pid`` at ``epoch``: its epoch is its last
        batch's (marker or data), whose sequence restarts at 0 with each new epoch."""
        cur, last = -1, -1
        for b in self.hist:
            if b.pid != pid:
                continue
            if b.epoch != cur:
                cur, last = b.epoch, -1
            if b.marker is None:
                last = b.seq + len(b.records) - 1
        return last + 1 if epoch == cur else 0

    def open_txn_first(self, pid) -> Optional[int]:
        first = None
        for b in self.hist:
            if b.pid != pid:
                continue
            if b.marker is not None:
                first = None
            elif b.txn and first is None:
                first = b.base
        return first

    def lso(self, start):
        firsts = [f for f in (self.open_txn_first(p) for p in TXN_PIDS) if f is not None]
        if not firsts:
            return self.leo
        return min(max(min(firsts), start), self.leo)

    def aborted(self, i) -> bool:
        b = self.hist[i]
        if not b.txn or b.marker is not None:
            return False
        for c in self.hist[i + 1:]:
            if c.pid == b.pid and c.marker is not None:
                return c.marker == ABORT
        return False  # still open

    def expected(self, start, level):
        end = self.leo if level == RU else self.lso(start)
        out = []
        for i, b in enumerate(self.hist):
            if b.deleted or b.marker is not None:
                continue
            if level == RC and self.aborted(i):
                continue
            out.extend(r for r in b.records if start <= r[0] < end)
        return out

    def truncate(self, o):
        if o >= self.leo:
            return
        if o < self.seg0:
            self.hist, self.start, self.leo, self.seg0 = [], o, o, o
            return
        self.hist = [b for b in self.hist if b.last < o]
        files = self.files()
        self.leo = files[-1].last + 1 if files else self.seg0
        self.start = min(self.start, self.leo)


def rec_tuple(r):
    return (r.offset, r.key, r.value, r.timestamp, tuple(r.headers))


def file_batch_sizes(path) -> dict:
    """{base offset: size} of every batch in the directory's .log files (struct only)."""
    sizes = {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(path, name), "rb") as f:
            data = f.read()
        for pos, size in batch_spans(data):
            sizes[v2_header(data, pos)["base_offset"]] = size
    return sizes


# -- the state machine ------------------------------------------------------------------------

class ReadModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="read-model-")
        self.path = os.path.join(self.tmp, "t-0")
        self.m = Model()
        self.clock = FakeClock(T0)
        self.counter = 0
        self.steps = 0
        self.epochs = {pid: 0 for pid in TXN_PIDS + (IDEMPOTENT_PID,)}  # the clients' epochs
        self.lg = self.ro = None

    def teardown(self):
        for lg in (self.lg, self.ro):
            if lg is not None:
                lg.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(seg_bytes=st.sampled_from([500, 800, 1500]),
                index_bytes=st.sampled_from([40, 4096]),
                interval=st.sampled_from([0, 150, 4096]))
    def open(self, seg_bytes, index_bytes, interval):
        self.cfg = TopicConfig.from_dict({"segment.bytes": seg_bytes,
                                          "segment.index.bytes": index_bytes,
                                          "index.interval.bytes": interval})
        self.lg = PartitionLog(self.path, "t", 0, self.cfg, self.clock)
        self.ro = PartitionLog(self.path, "t", 0, TopicConfig.from_dict({}), self.clock,
                               readonly=True)

    # -- writes -------------------------------------------------------------------------------
    def _make(self, n, sizes, ts, with_keys, with_headers):
        vals, keys, hdrs = [], [], []
        for i in range(n):
            self.counter += 1
            v = b"v%d:" % self.counter + b"x" * sizes[i % len(sizes)]
            vals.append(v)
            keys.append(b"k%d" % (self.counter % 5) if with_keys else None)
            hdrs.append([("h", b"%d" % self.counter)] if with_headers else [])
        tss = [T0 + 1 + t for t in ts[:n]] + [T0 + 1] * (n - len(ts))
        return vals, keys, hdrs, tss

    def _add(self, info, n, vals, keys, hdrs, tss, **kw):
        m = self.m
        assert info.first_offset == m.leo and info.last_offset == m.leo + n - 1
        recs = [(m.leo + i, keys[i], vals[i], tss[i], tuple((k, v) for k, v in hdrs[i]))
                for i in range(n)]
        m.hist.append(Batch(m.leo, m.leo + n - 1, records=recs, **kw))
        m.leo += n

    data_args = dict(n=st.integers(1, 5), sizes=st.lists(st.integers(0, 50), min_size=1,
                                                        max_size=3),
                     ts=st.lists(st.integers(0, TS_SPAN), min_size=1, max_size=5),
                     with_keys=st.booleans(), with_headers=st.booleans(),
                     codec=st.sampled_from(["none", "none", "gzip", "lz4", "zstd", "snappy"]))

    @rule(**data_args)
    def append_plain(self, n, sizes, ts, with_keys, with_headers, codec):
        vals, keys, hdrs, tss = self._make(n, sizes, ts, with_keys, with_headers)
        info = self.lg.append_batch(vals, keys, hdrs, tss, compression=codec)
        self._add(info, n, vals, keys, hdrs, tss)

    @rule(pid=st.sampled_from(TXN_PIDS + TXN_PIDS + (IDEMPOTENT_PID,)), **data_args)
    def append_producer(self, pid, n, sizes, ts, with_keys, with_headers, codec):
        txn = pid != IDEMPOTENT_PID
        epoch = self.epochs[pid]
        seq = self.m.next_seq(pid, epoch)
        vals, keys, hdrs, tss = self._make(n, sizes, ts, with_keys, with_headers)
        info = self.lg.append_batch(vals, keys, hdrs, tss, compression=codec, producer_id=pid,
                                    producer_epoch=epoch, base_sequence=seq, is_transactional=txn)
        self._add(info, n, vals, keys, hdrs, tss, pid=pid, epoch=epoch, txn=txn, seq=seq)

    @rule(pid=st.sampled_from(TXN_PIDS), **data_args)
    def append_txn(self, pid, n, sizes, ts, with_keys, with_headers, codec):
        self.append_producer(pid, n, sizes, ts, with_keys, with_headers, codec)

    @rule(pick=st.integers(0, 2), abort=st.sampled_from([True, True, False]))
    def end_open_txn(self, pick, abort):
        open_ = [p for p in TXN_PIDS if self.m.open_txn_first(p) is not None]
        if open_:
            self.marker(open_[pick % len(open_)], abort, 0, 1)

    @rule(pid=st.sampled_from(TXN_PIDS), abort=st.sampled_from([True, True, False]),
          only_open=st.integers(0, 4), bump=st.integers(0, 5))
    def marker(self, pid, abort, only_open, bump):
        m = self.m
        if only_open and m.open_txn_first(pid) is None:
            return  # mostly markers of open transactions; sometimes of none (empty)
        if not bump:  # the coordinator fences the producer: ABORT at the next epoch
            self.epochs[pid] += 1
            abort = True
        ctype = ABORT if abort else COMMIT
        info = self.lg.append_control(ctype, producer_id=pid, producer_epoch=self.epochs[pid])
        assert info.first_offset == m.leo == info.last_offset
        m.hist.append(Batch(m.leo, m.leo, pid=pid, epoch=self.epochs[pid], marker=ctype))
        m.leo += 1

    @rule(n=st.integers(1, 12), per_batch=st.integers(1, 4), size=st.integers(0, 30))
    def append_columns(self, n, per_batch, size):
        vals = []
        for _ in range(n):
            self.counter += 1
            vals.append(b"c%d:" % self.counter + b"y" * size)
        info = self.lg.append_columns(BinaryColumn.from_pylist(vals), None, [T0 + 1] * n,
                                      records_per_batch=per_batch)
        m = self.m
        assert info.first_offset == m.leo and info.last_offset == m.leo + n - 1
        for i in range(0, n, per_batch):
            chunk = vals[i:i + per_batch]
            recs = [(m.leo + j, None, v, T0 + 1, ()) for j, v in enumerate(chunk)]
            m.hist.append(Batch(m.leo, m.leo + len(chunk) - 1, records=recs))
            m.leo += len(chunk)

    @rule()
    def roll(self):
        self.lg.roll()

    @rule(back=st.integers(0, 12))
    def truncate_to(self, back):
        o = max(self.m.leo - back, max(self.m.seg0 - 2, 0))
        self.lg.truncate_to(o)
        self.m.truncate(o)

    @rule(frac=st.floats(0, 1))
    def delete_records(self, frac):
        m = self.m
        o = m.start + int((m.leo - m.start) * frac)
        assert self.lg.delete_records(o) == max(o, m.start)
        m.start = max(o, m.start)

    @precondition(lambda self: self.lg is not None and len(self.lg.segments) > 1)
    @rule(k=st.integers(1, 4))
    def delete_segments(self, k):
        segs = self.lg.segments
        k = min(k, len(segs) - 1)
        new_base = segs[k].base_offset
        self.lg.delete_segments(list(segs[:k]))
        m = self.m
        for b in m.hist:
            if b.base < new_base:
                b.deleted = True
        m.seg0 = new_base
        m.start = min(max(m.start, new_base), m.leo)

    @rule(clean=st.booleans(), frac=st.floats(0, 1))
    def reopen_writer(self, clean, frac):
        self.lg.close()
        rp = int(self.m.leo * frac)
        self.lg = PartitionLog(self.path, "t", 0, self.cfg, self.clock, recovery_point=rp,
                               log_start_offset=self.m.start, had_clean_shutdown=clean)

    @rule()
    def new_follower(self):
        self.ro.close()
        self.ro = PartitionLog(self.path, "t", 0, TopicConfig.from_dict({}), self.clock,
                               readonly=True)

    # -- checks -------------------------------------------------------------------------------
    @invariant()
    def reads_agree_with_the_model(self):
        if self.lg is None:
            return
        self.steps += 1
        rnd = random.Random(self.steps * 7919 + self.m.leo)
        assert self.lg.segments[0].base_offset == self.m.seg0
        sizes = file_batch_sizes(self.path)
        batches = self.m.files()
        assert sorted(sizes) == [b.base for b in batches], "the files hold the model's batches"
        where = {}
        for i, b in enumerate(batches):
            for r in b.records:
                where[r[0]] = i
        ctx = (batches, [sizes[b.base] for b in batches], where)
        if os.environ.get("READ_MODEL_EVENTS"):
            from hypothesis import event
            m = self.m
            event(f"segments={min(len(self.lg.segments), 4)}")
            event(f"aborted in files={any(m.aborted(i) for i, b in enumerate(m.hist) if not b.deleted)}")
            event(f"lso<leo={m.lso(m.start) < m.leo}")
            event(f"start>seg0={m.start > m.seg0}")
            event(f"deleted={any(b.deleted for b in m.hist)}")
        self.check_log(self.lg, self.m.start, ctx, rnd, "writer")
        self.check_log(self.ro, self.m.seg0, ctx, rnd, "follower")

    def check_log(self, lg, start, ctx, rnd, who):
        m = self.m
        assert lg.log_start_offset == start, who
        assert lg.log_end_offset == m.leo, who
        assert lg.last_stable_offset == m.lso(start), who
        for off in (start - 1, m.leo + 1):
            if off < 0:
                continue
            for level in (RU, RC):
                with pytest.raises(OffsetOutOfRangeError):
                    lg.read(off, isolation_level=level)
                with pytest.raises(OffsetOutOfRangeError):
                    lg.read_columns(off, isolation_level=level)
        for level in (RU, RC):
            exp = m.expected(start, level)
            # Whole-log consumption by repeated reads, with a few limits.
            limits = [(None, 1 << 20)] + rnd.sample(
                [(1, 1 << 20), (None, 0), (2, 1), (3, 200), (None, 300), (7, 150), (None, 90)], 2)
            for mr, mb in limits:
                self.consume(lg, start, level, mr, mb, exp, ctx, who)
            # Reads from arbitrary offsets.
            for _ in range(3):
                o = rnd.randint(start, m.leo)
                mr, mb = rnd.choice([(None, 1 << 20), (1, 100), (None, 120), (4, 1)])
                self.check_read(lg, o, level, mr, mb, exp, ctx, who)
            # iter_records, whole and a range.
            assert [rec_tuple(r) for r in lg.iter_records(isolation_level=level)] == exp, \
                (who, level)
            a = rnd.randint(start, m.leo)
            b = rnd.randint(a, m.leo)
            got = [rec_tuple(r) for r in lg.iter_records(a, b, isolation_level=level)]
            assert got == [r for r in exp if a <= r[0] < b], (who, level, a, b)
            # read_columns: whole, with headers, a range with max_records.
            self.check_columns(lg.read_columns(isolation_level=level), exp, who, level)
            cols = lg.read_columns(include_headers=True, isolation_level=level)
            assert [tuple(h) for h in cols.headers.to_pylist()] == [r[4] for r in exp], \
                (who, level)
            k = rnd.randint(0, 6)
            self.check_columns(lg.read_columns(a, b, max_records=k, isolation_level=level),
                               [r for r in exp if a <= r[0] < b][:k], who, level, (a, b, k))
        # offset_for_time: the first data record at or after the log start with a timestamp at
        # or after the one asked (markers carry T0, before every record's).
        data = [r for b in ctx[0] if b.marker is None for r in b.records if r[0] >= start]
        for q in rnd.sample(range(T0 + 1, T0 + TS_SPAN + 3), 3):
            hit = next((r for r in data if r[3] >= q), None)
            res = lg.offset_for_time(q)
            assert (None if res is None else (res.offset, res.timestamp)) == \
                (None if hit is None else (hit[0], hit[3])), (who, q)
        assert lg.offset_for_time(EARLIEST_TIMESTAMP)[:2] == (start, -1), who
        assert lg.offset_for_time(LATEST_TIMESTAMP)[:2] == (m.leo, -1), who
        # MAX_TIMESTAMP: the first record (of the segments: Kafka does not bound it by the log
        # start) with the largest timestamp; a marker's is T0.
        every = [(b.base, T0) if b.marker is not None else r for b in ctx[0]
                 for r in (b.records or [None])]
        res = lg.offset_for_time(MAX_TIMESTAMP)
        if not every:
            assert res is None, who
        else:
            top = max(r[1] if len(r) == 2 else r[3] for r in every)
            first = next(r for r in every if (r[1] if len(r) == 2 else r[3]) == top)
            assert res[:2] == (first[0], top), who

    @staticmethod
    def check_columns(cols, exp, who, level, extra=None):
        got = list(zip(cols.offsets.tolist(), cols.keys.to_pylist(), cols.values.to_pylist(),
                       cols.timestamps_ms.tolist()))
        assert got == [r[:4] for r in exp], (who, level, extra)

    def check_read(self, lg, o, level, mr, mb, exp, ctx, who):
        recs = lg.read(o, max_records=mr, max_bytes=mb, isolation_level=level)
        due = [r for r in exp if r[0] >= o]
        got = [rec_tuple(r) for r in recs]
        what = (who, level, o, mr, mb)
        if not due:
            assert got == [], what
            return got
        assert got, ("[] while records are due",) + what
        assert got == due[:len(got)], what
        if mr is not None:
            assert len(got) <= mr, what
        batches, sizes, where = ctx
        i, j = where[got[0][0]], where[got[-1][0]]
        if i != j:
            assert sum(sizes[i:j + 1]) <= mb, ("max_bytes exceeded",) + what
        return got

    def consume(self, lg, start, level, mr, mb, exp, ctx, who):
        pos, out = start, []
        for _ in range(len(exp) + 2):
            got = self.check_read(lg, pos, level, mr, mb, exp, ctx, who)
            if not got:
                assert out == exp, (who, level, mr, mb)
                return
            out.extend(got)
            pos = got[-1][0] + 1
        raise AssertionError(f"{who} {level}: consuming did not end ({mr}, {mb})")


# Deterministic by default (the same examples every run); READ_MODEL_RANDOM=1 with more
# READ_MODEL_EXAMPLES / READ_MODEL_STEPS explores further (800 x 40 took 9 minutes).
ReadModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("READ_MODEL_EXAMPLES", 30)),
    stateful_step_count=int(os.environ.get("READ_MODEL_STEPS", 25)), deadline=None,
    derandomize=not os.environ.get("READ_MODEL_RANDOM"), database=None)
TestReadModel = ReadModel.TestCase


# -- regressions the model found, reduced -------------------------------------------------------

def _open(path, **cfg):
    return PartitionLog(str(path), "t", 0, TopicConfig.from_dict(cfg), FakeClock(T0))


def _follower(path):
    return PartitionLog(str(path), "t", 0, TopicConfig.from_dict({}), FakeClock(T0),
                        readonly=True)


@pytest.mark.parametrize("level", [RU, RC])
def test_read_whose_max_bytes_ends_inside_a_segment_does_not_go_on_to_the_next(tmp_path, level):
    # Segment 0 holds a small batch and a big one, segment 1 a small one. max_bytes fits the two
    # small batches but not the big one: the read returned offsets 0 and 2, skipping 1 (its
    # range stopped inside segment 0 and the loop went on to segment 1 with the bytes left).
    lg = _open(tmp_path / "a")
    small = lg.append_batch([b"a"]).size_bytes
    lg.append_batch([b"b" * 200])
    lg.roll()
    lg.append_batch([b"c"])
    got = [r.offset for r in lg.read(0, max_bytes=2 * small, isolation_level=level)]
    assert got == [0]
    # The same when the big batch starts a segment of its own (the range of that segment was
    # None, taken for "nothing here" and skipped).
    lg = _open(tmp_path / "b")
    lg.append_batch([b"a"])
    lg.roll()
    lg.append_batch([b"b" * 200])
    lg.roll()
    lg.append_batch([b"c"])
    got = [r.offset for r in lg.read(0, max_bytes=2 * small, isolation_level=level)]
    assert got == [0]
    # Consuming with that max_bytes gets every record, in order.
    pos, out = 0, []
    while recs := lg.read(pos, max_bytes=2 * small, isolation_level=level):
        out += [r.offset for r in recs]
        pos = recs[-1].offset + 1
    assert out == [0, 1, 2]


def test_truncation_leaves_no_stale_index_entries_for_a_read_only_log(tmp_path):
    # An entry (last offset, position) per batch but the first: (2, p2), (3, p3), (4, p4).
    # Truncation dropped entries by count only, leaving them in the file. The batches appended
    # after it were indexed over the first slots, (1, ..) then (3, ..), and the dropped (4, p4)
    # after them still looked ordered: a read-only log (which takes the file's run of ordered
    # entries) looked up p4, now inside the big batch's zeros, and its last_stable_offset (and
    # so a read_committed read) failed with "batch size field is smaller than the minimum of
    # 14 bytes".
    lg = _open(tmp_path, **{"index.interval.bytes": 0})
    lg.append_batch([b"a", b"b"])
    for v in (b"c", b"d", b"e"):
        lg.append_batch([v * 30])
    lg.truncate_to(0)
    lg.append_batch([b"x"])
    lg.append_batch([b"y"])
    lg.append_batch([bytes(60), bytes(60)])
    ro = _follower(tmp_path)
    assert ro.log_end_offset == lg.log_end_offset == 4
    assert ro.last_stable_offset == 4
    for level in (RU, RC):
        assert [r.value for r in ro.read(0, isolation_level=level)] == \
            [r.value for r in lg.read(0)]
        assert [r.offset for r in ro.read(3, isolation_level=level)] == [3]


def test_read_only_offset_for_time_sees_batches_appended_after_its_first_look(tmp_path):
    # A read-only segment kept the largest timestamp it read first: once the writer appended
    # later timestamps, offset_for_time skipped the segment (None) and MAX_TIMESTAMP pointed
    # at the old maximum; both for the active segment and for one rolled since.
    lg = _open(tmp_path)
    lg.append_batch([b"a"], timestamps_ms=[T0 + 1])
    ro = _follower(tmp_path)
    assert ro.offset_for_time(T0 + 1)[:2] == (0, T0 + 1)
    lg.append_batch([b"b"], timestamps_ms=[T0 + 50])
    assert ro.offset_for_time(T0 + 50)[:2] == (1, T0 + 50)
    assert ro.offset_for_time(MAX_TIMESTAMP)[:2] == (1, T0 + 50)
    lg.append_batch([b"c"], timestamps_ms=[T0 + 90])
    lg.roll()
    lg.append_batch([b"d"], timestamps_ms=[T0 + 2])
    assert ro.offset_for_time(T0 + 60)[:2] == (2, T0 + 90)
    assert ro.offset_for_time(MAX_TIMESTAMP)[:2] == (2, T0 + 90)
