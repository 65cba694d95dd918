"""read_committed reads (Kafka's FetchIsolation.TXN_COMMITTED plus the consumer's aborted
transaction filter; REF §3.6): ``read``, ``read_columns`` and ``iter_records`` with
``isolation_level="read_committed"`` return the records below the last stable offset that no
aborted transaction holds, on writable and read-only logs, across rolls, reopenings and the
cleaner.

Oracle: :class:`Replay`, a plain-Python account of what the test appended (every record's
offset, value and transaction, and each transaction's outcome), with Kafka's definitions: the
last stable offset is the first offset of the oldest open transaction (else the log end); a
record is committed-visible when it is below it and its transaction did not abort. No segstore
code is used to compute expectations.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FakeClock, batch_spans, v2_header
from segstore.config import TopicConfig
from segstore.errors import InvalidArgumentError
from segstore.log import PartitionLog
from segstore.records import ControlRecordType

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT
T0 = 1_000_000


def open_log(path, **kw):
    opts = {k: kw.pop(k) for k in ("readonly", "recovery_point", "had_clean_shutdown") if k in kw}
    config = TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})
    return PartitionLog(str(path), "t", 0, config, FakeClock(T0), **opts)


class Replay:
    """What was appended, and Kafka's rules for what read_committed shows."""

    def __init__(self, log):
        self.log = log
        self.records: list[tuple[int, bytes, object]] = []  # offset, value, transaction key
        self.outcome: dict[object, str] = {}  # transaction key -> "open" / "commit" / "abort"
        self.open: dict[int, tuple] = {}  # producer -> (transaction key, first offset)
        self.seq: dict[int, int] = {}
        self.leo = 0
        self.n_txn = 0

    def plain(self, n=1):
        values = [b"plain-%d" % (self.leo + i) for i in range(n)]
        self.log.append_batch(values, headers=[[("h", b"%d" % (self.leo + i))] for i in range(n)])
        self._add(values, None)

    def txn(self, pid, n=1):
        values = [b"txn-%d-%d" % (pid, self.leo + i) for i in range(n)]
        self.log.append_batch(values, producer_id=pid, producer_epoch=0,
                              base_sequence=self.seq.get(pid, 0), is_transactional=True)
        self.seq[pid] = self.seq.get(pid, 0) + n
        if pid not in self.open:
            self.n_txn += 1
            key = (pid, self.n_txn)
            self.open[pid] = (key, self.leo)
            self.outcome[key] = "open"
        self._add(values, self.open[pid][0])

    def idem(self, pid, n=1):
        values = [b"idem-%d-%d" % (pid, self.leo + i) for i in range(n)]
        self.log.append_batch(values, producer_id=pid, producer_epoch=0,
                              base_sequence=self.seq.get(pid, 0))
        self.seq[pid] = self.seq.get(pid, 0) + n
        self._add(values, None)

    def end(self, pid, abort):
        self.log.append_control(ABORT if abort else COMMIT, producer_id=pid, producer_epoch=0)
        if pid in self.open:
            key, _ = self.open.pop(pid)
            self.outcome[key] = "abort" if abort else "commit"
        self.leo += 1  # the marker takes an offset and is never read

    def _add(self, values, key):
        for v in values:
            self.records.append((self.leo, v, key))
            self.leo += 1

    @property
    def lso(self) -> int:
        return min(first for _, first in self.open.values()) if self.open else self.leo

    def committed(self, start=0, end=None) -> list[tuple[int, bytes]]:
        end = self.lso if end is None else min(end, self.lso)
        return [(o, v) for o, v, key in self.records
                if start <= o < end and (key is None or self.outcome[key] != "abort")]

    def uncommitted(self, start=0, end=None) -> list[tuple[int, bytes]]:
        end = self.leo if end is None else end
        return [(o, v) for o, v, _ in self.records if start <= o < end]


def read_all(log, start, max_records=None, max_bytes=1 << 20, level="read_committed"):
    """Read from ``start`` like a consumer: each call continues after the last record."""
    out, offset = [], start
    for _ in range(10_000):
        recs = log.read(offset, max_records=max_records, max_bytes=max_bytes,
                        isolation_level=level)
        if not recs:
            return out
        assert all(a.offset < b.offset for a, b in zip(recs, recs[1:]))
        assert recs[0].offset >= offset
        out.extend((r.offset, r.value) for r in recs)
        offset = recs[-1].offset + 1
    raise AssertionError("the read never reached the end")


def check(log, replay, starts=None):
    """Every read API at read_committed against the replay, from several starts."""
    assert log.last_stable_offset == replay.lso
    starts = starts if starts is not None else sorted({0, replay.leo // 3, replay.leo // 2,
                                                       replay.lso, replay.leo})
    for s in starts:
        want = replay.committed(s)
        assert read_all(log, s) == want
        assert read_all(log, s, max_records=1) == want
        assert read_all(log, s, max_records=3, max_bytes=1) == want
        assert [(r.offset, r.value) for r in log.iter_records(
            s, isolation_level="read_committed")] == want
        cols = log.read_columns(s, isolation_level="read_committed")
        assert list(zip(cols.offsets.tolist(), cols.values.to_pylist())) == want
        hcols = log.read_columns(s, include_headers=True, isolation_level="read_committed")
        assert list(zip(hcols.offsets.tolist(), hcols.values.to_pylist())) == want
        # chunked as Spark's reader reads: an empty chunk means the end of the range
        chunks, pos = [], s
        while True:
            c = log.read_columns(pos, max_records=2, isolation_level="read_committed")
            if not len(c):
                break
            chunks += list(zip(c.offsets.tolist(), c.values.to_pylist()))
            pos = int(c.offsets[-1]) + 1
        assert chunks == want
        heads = hcols.headers.to_pylist()
        assert heads == [[("h", b"%d" % o)] if v.startswith(b"plain") else []
                         for o, v in want]
        # read_uncommitted is unchanged: every data record up to the log end
        assert read_all(log, s, level="read_uncommitted") == replay.uncommitted(s)


def mixed(log):
    r = Replay(log)
    r.txn(1)                 # 0       aborted later
    r.plain(2)               # 1-2
    r.txn(2, n=2)            # 3-4     committed later
    r.idem(3)                # 5
    r.txn(1, n=3)            # 6-8     (still producer 1's first transaction)
    r.end(1, abort=True)     # 9
    r.plain()                # 10
    r.end(2, abort=False)    # 11
    r.txn(1)                 # 12      a new transaction, committed
    r.txn(4)                 # 13      open at the end: the last stable offset stays here
    r.txn(1, n=2)            # 14-15
    r.end(1, abort=False)    # 16
    r.plain(3)               # 17-19
    return r


def test_read_committed_skips_aborted_and_stops_at_the_lso(tmp_path):
    log = open_log(tmp_path / "t-0")
    r = mixed(log)
    assert r.lso == 13 and r.leo == 20
    check(log, r)
    assert [o for o, _ in r.committed()] == [1, 2, 3, 4, 5, 10, 12]
    # at or past the last stable offset a committed read is empty (Kafka's rule 2)
    for offset in (13, 15, 20):
        assert log.read(offset, isolation_level="read_committed") == []
        assert len(log.read_columns(offset, isolation_level="read_committed")) == 0
    # once producer 4 commits, everything below the log end is visible
    r.end(4, abort=False)
    check(log, r)


def test_read_committed_across_segments_and_reopen(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=300)
    r = mixed(log)
    r.end(4, abort=True)
    for _ in range(3):
        r = _more(r)
    assert len(log.segments) > 5
    check(log, r)
    log.close()
    again = open_log(tmp_path / "t-0", segment_bytes=300)
    r.log = again
    check(again, r)
    again.close()
    unclean = open_log(tmp_path / "t-0", segment_bytes=300, had_clean_shutdown=False)
    check(unclean, r)
    unclean.close()


def _more(r):
    r.txn(5, n=2)
    r.plain()
    r.txn(6)
    r.end(5, abort=True)
    r.idem(7, n=2)
    r.end(6, abort=False)
    return r


def test_read_committed_on_a_read_only_log(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=300)
    r = mixed(log)
    ro = open_log(tmp_path / "t-0", readonly=True)
    check(ro, r)
    r.end(4, abort=True)  # the writer goes on; the reader sees it on its next read
    _more(r)
    check(ro, r)
    ro.close()


def test_a_transaction_aborted_after_the_bound_is_still_left_out(tmp_path):
    # producer 1 aborts at 4, after producer 2 opened a transaction at 2: the bound is 2, and
    # the ABORT marker of the records below it lies past it (its .txnindex entry too)
    log = open_log(tmp_path / "t-0")
    r = Replay(log)
    r.txn(1)        # 0
    r.plain()       # 1
    r.txn(2)        # 2
    r.txn(1)        # 3
    r.end(1, abort=True)  # 4
    assert r.lso == 2
    check(log, r, starts=[0, 1, 2])
    assert r.committed() == [(1, b"plain-1")]


def test_aborted_records_cut_by_max_records_do_not_hide_later_ones(tmp_path):
    # a decode limited to max_records may see only aborted records; the read goes on past
    # them within the segment instead of skipping the rest of it
    log = open_log(tmp_path / "t-0")
    r = Replay(log)
    r.txn(1, n=5)
    r.plain(2)
    r.txn(1)
    r.plain()
    r.end(1, abort=True)
    r.plain(2)
    for n in (1, 2, 4, 6):
        assert read_all(log, 0, max_records=n) == r.committed()
    assert [x.offset for x in log.read(0, max_records=2, isolation_level="read_committed")] == [5, 6]


def test_a_read_cut_by_max_records_finishes_its_segment_before_the_next(tmp_path):
    # records 0-1 aborted, 2-6 plain in the first segment, 8-10 in the second: a read of 3
    # records decodes 0, 1, 2 and keeps 2; it must go on with 3, not with the next segment
    log = open_log(tmp_path / "t-0")
    r = Replay(log)
    r.txn(1, n=2)
    r.plain(5)
    r.end(1, abort=True)
    log.roll()
    r.plain(3)
    got = log.read(0, max_records=3, isolation_level="read_committed")
    assert [x.offset for x in got] == [2, 3, 4]
    assert read_all(log, 0, max_records=3) == r.committed()


def test_read_columns_max_records_counts_only_returned_records(tmp_path):
    # aborted batches are never decoded, so a chunked reader (Spark's) never gets an empty
    # chunk before the end of its range
    log = open_log(tmp_path / "t-0")
    r = Replay(log)
    r.txn(1, n=3)
    r.plain(3)
    r.end(1, abort=True)
    cols = log.read_columns(0, max_records=2, isolation_level="read_committed")
    assert cols.offsets.tolist() == [3, 4]
    assert log.read_columns(0, end_offset=5, isolation_level="read_committed").offsets.tolist() \
        == [3, 4]


def test_after_compaction_read_committed_matches_the_replay(tmp_path):
    # the cleaner removes aborted transactions' records itself; a committed read after it
    # shows the latest committed value of each key
    import segstore
    with segstore.open(str(tmp_path / "s"), clock=FakeClock(T0)) as s:
        s.create_topic("t", config={"cleanup.policy": "compact", "segment.bytes": 400})
        log = s.partition("t", 0)
        for i in range(6):
            log.append_batch([b"k%d" % i], keys=[b"key%d" % (i % 3)])              # 0-5
        log.append_batch([b"t"], keys=[b"key1"], producer_id=9, producer_epoch=0,
                         base_sequence=0, is_transactional=True)                   # 6
        log.append_control(ABORT, producer_id=9, producer_epoch=0)                 # 7
        log.append_batch([b"last"], keys=[b"key0"])                                # 8
        log.roll()

        def committed():
            return [(x.offset, x.value) for x in log.iter_records(isolation_level="read_committed")]

        assert committed() == [(i, b"k%d" % i) for i in range(6)] + [(8, b"last")]
        s.compact("t", force=True)
        assert committed() == [(4, b"k4"), (5, b"k5"), (8, b"last")]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["plain", "txn", "idem", "commit", "abort", "roll"]),
                          st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=40),
       st.integers(0, 2**32 - 1))
def test_read_committed_matches_the_replay(tmp_path_factory, ops, seed):
    path = tmp_path_factory.mktemp("rc") / "t-0"
    log = open_log(path, segment_bytes=350)
    r = Replay(log)
    for op, pid, n in ops:
        if op == "plain":
            r.plain(n)
        elif op == "txn":
            r.txn(pid, n)
        elif op == "idem":
            if pid in r.open:
                continue  # Kafka refuses a non-transactional batch inside a transaction
            r.idem(pid, n)
        elif op == "roll":
            log.roll()
        else:
            r.end(pid, abort=op == "abort")
    rng = random.Random(seed)
    starts = sorted({0, r.lso, r.leo, rng.randint(0, r.leo), rng.randint(0, r.leo)})
    check(log, r, starts=starts)
    ro = open_log(path, readonly=True)
    check(ro, r, starts=starts[:2])
    ro.close()
    log.close()


@pytest.mark.parametrize("level", ["READ_COMMITTED", "committed", None, 1, b"read_committed"])
def test_bad_isolation_level(tmp_path, level):
    log = open_log(tmp_path / "t-0")
    log.append(b"x")
    for call in (lambda: log.read(0, isolation_level=level),
                 lambda: log.read_columns(0, isolation_level=level),
                 lambda: list(log.iter_records(0, isolation_level=level))):
        with pytest.raises(InvalidArgumentError, match="isolation_level"):
            call()


def test_column_filter_keeps_arrow_layout():
    from segstore.columns import BinaryColumn, HeaderColumn, RecordColumns
    keys = BinaryColumn.from_pylist([b"a", None, b"ccc", b""])
    vals = BinaryColumn.from_pylist([b"1", b"22", None, b"4444"])
    hk = BinaryColumn.from_pylist([b"x", b"y", b"z"])
    hv = BinaryColumn.from_pylist([b"1", None, b"3"])
    heads = HeaderColumn(np.array([0, 2, 2, 3, 3], dtype=np.int64), hk, hv)
    cols = RecordColumns(np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64) * 10,
                         np.zeros(4, dtype=np.int8), keys, vals, heads, "t", 0)
    keep = np.array([False, True, True, False])
    f = cols.filter(keep)
    assert f.offsets.tolist() == [1, 2] and f.timestamps_ms.tolist() == [10, 20]
    assert f.keys.to_pylist() == [None, b"ccc"] and f.values.to_pylist() == [b"22", None]
    assert f.headers.to_pylist() == [[], [("z", b"3")]]
    assert f.keys.offsets[0] == 0 and f.keys.data.tobytes() == b"ccc"
    assert len(cols.filter(np.zeros(4, dtype=bool))) == 0
    with pytest.raises(Exception, match="bool array"):
        cols.filter(np.array([1, 0, 1, 0]))


def test_a_read_only_log_replays_once_per_state(tmp_path, monkeypatch):
    # a chunked reader (Spark's) asks for the committed view once per chunk: the replay of the
    # batch headers runs again only when the writer changed the log
    import segstore.log_reads as log_reads
    calls = []
    real = log_reads.replayed_view
    monkeypatch.setattr(log_reads, "replayed_view", lambda d, st: calls.append(1) or real(d, st))
    log = open_log(tmp_path / "t-0", segment_bytes=300)
    r = mixed(log)
    ro = open_log(tmp_path / "t-0", readonly=True)
    pos, got = 0, []
    while True:
        c = ro.read_columns(pos, max_records=1, isolation_level="read_committed")
        if not len(c):
            break
        got += c.offsets.tolist()
        pos = got[-1] + 1
    assert got == [o for o, _ in r.committed()] and len(got) > 3
    assert len(calls) == 1
    r.end(4, abort=False)  # the writer moves on: the next read replays again and sees it
    assert ro.read_columns(pos, isolation_level="read_committed").offsets.tolist() == \
        [o for o, _ in r.committed(pos)]
    assert len(calls) == 2
    ro.close()


def test_store_end_offsets_by_isolation_level(tmp_path):
    import segstore
    from segstore.records import TopicPartition
    with segstore.open(str(tmp_path / "s"), clock=FakeClock(T0)) as s:
        s.create_topic("t", 2)
        r = mixed(s.partition("t", 0))
        s.partition("t", 1).append(b"x")
        tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
        assert s.end_offsets(tps) == {tps[0]: r.leo, tps[1]: 1}
        assert s.end_offsets(tps, isolation_level="read_committed") == {tps[0]: r.lso, tps[1]: 1}
        with pytest.raises(InvalidArgumentError, match="isolation_level"):
            s.end_offsets(tps, isolation_level="committed")


def _damaged_reopen(tmp_path, edit):
    """A closed log of [plain 0] [txn p1: 1] [txn p2: 2-3] [ABORT p1: 4] [COMMIT p2: 5]
    [plain 6], with ``edit(buf, spans)`` applied to its segment file, reopened cleanly (no
    recovery: the damage stays for the reads to meet)."""
    path = tmp_path / "t-0"
    log = open_log(path)
    r = Replay(log)
    r.plain()
    r.txn(1)
    r.txn(2, n=2)
    r.end(1, abort=True)
    r.end(2, abort=False)
    r.plain()
    leo = log.log_end_offset
    log.close()
    seg = path / "00000000000000000000.log"
    buf = bytearray(seg.read_bytes())
    edit(buf, batch_spans(buf))
    seg.write_bytes(bytes(buf))
    return open_log(path, recovery_point=leo, had_clean_shutdown=True)


@pytest.mark.parametrize("damage", ["aborted batch's value", "committed batch's producer id"])
def test_a_damaged_batch_among_aborted_ones_raises_not_vanishes(tmp_path, damage):
    """Aborted batches are skipped without decoding, but only once their CRC passes: a bit
    flip inside one, or one in a committed batch's producer id that makes it look like part of
    the aborted transaction, raises CorruptRecordError naming the file and position instead of
    reading as nothing."""
    from segstore.errors import CorruptRecordError

    def edit(buf, spans):
        if damage == "aborted batch's value":
            pos, size = spans[1]  # producer 1's aborted batch
            buf[pos + size - 2] ^= 0x40
        else:
            pos, size = spans[2]  # producer 2's committed batch: claim producer 1
            assert v2_header(buf, pos)["producer_id"] == 2
            struct.pack_into(">q", buf, pos + 43, 1)
        return pos

    where = {}
    log = _damaged_reopen(tmp_path, lambda buf, spans: where.setdefault("pos", edit(buf, spans)))
    for read in (lambda: log.read(0, isolation_level="read_committed"),
                 lambda: log.read_columns(0, isolation_level="read_committed"),
                 lambda: list(log.iter_records(0, isolation_level="read_committed"))):
        with pytest.raises(CorruptRecordError) as e:
            read()
        assert "00000000000000000000.log" in str(e.value) and str(where["pos"]) in str(e.value)
    # what comes before the damage still reads
    assert [x.offset for x in log.read(0, max_records=1, isolation_level="read_committed")] == [0]
    assert log.read_columns(0, max_records=1, isolation_level="read_committed").offsets.tolist() \
        == [0]
    log.close()


def test_intact_aborted_batches_are_still_skipped_after_a_clean_reopen(tmp_path):
    log = _damaged_reopen(tmp_path, lambda buf, spans: None)
    assert [x.offset for x in log.read(0, isolation_level="read_committed")] == [0, 2, 3, 6]
    assert log.read_columns(0, isolation_level="read_committed").offsets.tolist() == [0, 2, 3, 6]
    log.close()
