"""PartitionLog: appends, reads, rolls, offsets by timestamp, truncation, flushing, reopening,
recovery, read-only readers (REF §3, §4.2-§4.3, behaviours #19, #26, #27 of REF §7).

Oracles: what the test appended (kept in Python lists), kafka-python's MemoryRecords for the
``.log`` bytes, ``struct``/numpy decodes of ``.index`` / ``.timeindex`` files. Time is a fake clock.

Read-only readers run in a forked child (:func:`run_forked`): a reader that touches a page of a
file the writer shrank dies of SIGBUS, and that must fail one test, not kill the test run.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
import traceback

import numpy as np
import pytest
from kafka.record.memory_records import MemoryRecords as KpMemoryRecords
from kafka.record.memory_records import MemoryRecordsBuilder as KpMemoryRecordsBuilder

from conftest import batch_spans, check_columns, columns_tuples, rec_tuple, v2_header
from segstore import _core
from segstore.columns import BinaryColumn
from segstore.config import TopicConfig
from segstore.errors import (InvalidArgumentError, InvalidOffsetError, InvalidRecordError, OffsetOutOfRangeError,
                             ReadOnlyStoreError, RecordTooLargeError, StoreClosedError)
from segstore.log import PartitionLog

T0 = 1_700_000_000_000
OFFSET_DT = np.dtype([("rel", ">i4"), ("pos", ">i4")])
TIME_DT = np.dtype([("ts", ">i8"), ("rel", ">i4")])
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
    """A fake millisecond clock."""

    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


def topic_config(**kw):
    return TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})


def open_log(path, clock=None, **kw):
    config = kw.pop("config", None)
    opts = {k: kw.pop(k) for k in ("readonly", "recovery_point", "log_start_offset",
                                   "had_clean_shutdown") if k in kw}
    return PartitionLog(str(path), "t", 0, config or topic_config(**kw), clock or Clock(), **opts)


def all_records(log, start=None):
    """Every record from ``start`` (default: log start) to the log end, by repeated read()."""
    out = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        recs = log.read(offset)
        assert recs, offset
        out += recs
        offset = recs[-1].offset + 1
    return out


def tuples(records):
    return [rec_tuple(r) for r in records]


def run_forked(fn, timeout=30):
    """Run ``fn()`` in a forked child; return its (picklable) result. A crash fails the test."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        faulthandler.disable()  # a crash is reported by the parent, without a traceback dump
        signal.alarm(timeout)
        try:
            result = ("ok", fn())
        except BaseException:
            result = ("error", traceback.format_exc())
        try:
            data = pickle.dumps(result)
        except Exception:
            data = pickle.dumps(("error", f"unpicklable result {result!r:.200}"))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        pytest.fail(f"child process died with {signal.Signals(os.WTERMSIG(status)).name}")
    kind, value = pickle.loads(data)
    if kind == "error":
        pytest.fail("child process raised:\n" + value)
    return value


def check_directory(directory, expected):
    """Every ``.log`` parses in kafka-python into exactly ``expected`` (offset, ts, key, value,
    headers) tuples, and every index entry points at the batch holding its offset."""
    got = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".log"):
            continue
        base = int(name[:20])
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        batches = []  # (position, base offset, last offset, max timestamp)
        records = KpMemoryRecords(data)
        pos = 0
        while records.has_next():
            batch = records.next_batch()
            assert batch.validate_crc()
            batches.append((pos, batch.base_offset, batch.last_offset, batch.max_timestamp))
            pos += batch.size_in_bytes
            for r in batch:
                got.append((r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]))
        assert pos == len(data), name  # no trailing bytes
        if batches:
            assert batches[0][1] >= base
        idx_path = os.path.join(directory, name[:20] + ".index")
        if os.path.exists(idx_path):
            entries = np.fromfile(idx_path, dtype=OFFSET_DT)
            assert (np.diff(entries["rel"]) > 0).all()
            by_pos = {p: (b, last) for p, b, last, _ in batches}
            for rel, p in entries.tolist():
                assert p in by_pos, (name, rel, p)
                b, last = by_pos[p]
                assert b <= base + rel <= last, (name, rel, p)
        tidx_path = os.path.join(directory, name[:20] + ".timeindex")
        if os.path.exists(tidx_path):
            entries = np.fromfile(tidx_path, dtype=TIME_DT)
            assert (np.diff(entries["ts"]) > 0).all() and (np.diff(entries["rel"]) >= 0).all()
            for ts, rel in entries.tolist():
                upto = [b for b in batches if b[1] <= base + rel]
                assert upto and upto[-1][2] == base + rel, (name, ts, rel)  # a batch's last offset
                assert max(b[3] for b in upto) == ts, (name, ts, rel)  # max timestamp so far
            if len(entries) and batches:  # the final entry written on roll/close
                assert entries["ts"][-1] == max(b[3] for b in batches)
    assert got == expected


# ---------------------------------------------------------------------------------------------
# append / read round trips


def test_append_round_trip_and_metadata(tmp_path):
    clock = Clock()
    log = open_log(tmp_path / "t-0", clock)
    md = log.append(b"v0", key=b"k0", headers=[("h1", b"x"), ("h2", None)], timestamp_ms=T0 + 5)
    assert (md.topic, md.partition, md.offset, md.timestamp) == ("t", 0, 0, T0 + 5)
    assert (md.serialized_key_size, md.serialized_value_size, md.serialized_header_size) == \
        (2, 2, 5)
    md = log.append(None, key=b"tombstone")
    assert md.offset == 1 and md.timestamp == clock.t and md.serialized_value_size == -1
    log.append(b"", key=b"", headers=[])
    log.append("text", key="k\u00e9y")
    assert log.log_end_offset == 4
    assert tuples(log.read(0)) == [
        (0, T0 + 5, 0, b"k0", b"v0", [("h1", b"x"), ("h2", None)]),
        (1, clock.t, 0, b"tombstone", None, []),
        (2, clock.t, 0, b"", b"", []),
        (3, clock.t, 0, "k\u00e9y".encode(), b"text", []),
    ]
    r = log.read(3)[0]
    assert (r.topic, r.partition, r.leader_epoch) == ("t", 0, 0)


def test_append_metadata_sizes_are_utf8_bytes_for_str(tmp_path):
    log = open_log(tmp_path / "t-0")
    md = log.append("\u00e9\u00e9", key="\u043a", headers=[("\u00e9", "\u00e9".encode())])
    assert (md.serialized_key_size, md.serialized_value_size, md.serialized_header_size) == \
        (2, 4, 4)


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_append_batch_round_trip_all_codecs(tmp_path, codec):
    rnd = random.Random(str(codec))
    log = open_log(tmp_path / "t-0", segment_bytes=6000, index_interval_bytes=300)
    expected = []
    for b in range(40):
        n = rnd.randint(1, 8)
        vals = [None if rnd.random() < 0.1 else
                (b"payload-%d-" % b) * rnd.randint(0, 20) + os.urandom(rnd.randint(0, 60))
                for _ in range(n)]
        keys = [None if rnd.random() < 0.3 else b"key-%d" % rnd.randint(0, 9) for _ in range(n)]
        heads = [[("h", b"%d" % i)] if i % 2 else [] for i in range(n)]
        stamps = [T0 + rnd.randint(-1000, 1000) for _ in range(n)]
        info = log.append_batch(vals, keys, heads, stamps, compression=codec)
        assert info.last_offset - info.first_offset + 1 == n == info.num_records
        assert info.max_timestamp == max(stamps)
        expected += [(info.first_offset + i, stamps[i], 0, keys[i], vals[i], heads[i])
                     for i in range(n)]
    assert len(log.segments) > 1
    assert tuples(all_records(log)) == expected
    codec_id = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
    for seg in log.segments:
        buf = bytes(seg.buffer()[:seg.size]) if seg.size else b""
        assert {v2_header(buf, p)["attributes"] & 7 for p, _ in batch_spans(buf)} <= {codec_id}


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_topic_compression_type_applies(tmp_path, codec):
    log = open_log(tmp_path / "t-0", compression_type=codec)
    log.append_batch([b"a" * 100] * 10)
    buf = bytes(log.active_segment.buffer()[:log.active_segment.size])
    assert v2_header(buf)["attributes"] & 7 == {"gzip": 1, "zstd": 4}[codec]
    assert [r.value for r in log.read(0)] == [b"a" * 100] * 10


def test_append_columns_round_trip(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=5000)
    n = 700
    vals = BinaryColumn.from_pylist([None if i % 11 == 0 else b"v" * (i % 37) for i in range(n)])
    keys = BinaryColumn.from_pylist([None if i % 5 == 0 else b"key-%d" % i for i in range(n)])
    stamps = T0 + np.arange(n, dtype=np.int64) * 3
    info = log.append_columns(vals, keys, stamps, records_per_batch=7)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, n - 1, n)
    assert len(log.segments) > 2
    recs = all_records(log)
    assert [r.value for r in recs] == vals.to_pylist()
    assert [r.key for r in recs] == keys.to_pylist()
    assert [r.timestamp for r in recs] == stamps.tolist()
    # one timestamp for all, keys omitted
    info = log.append_columns(BinaryColumn.from_pylist([b"x", b"y"]), timestamps_ms=T0)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in log.read(n)] == \
        [(n, None, b"x", T0), (n + 1, None, b"y", T0)]


def test_append_columns_rejects_bad_input(tmp_path):
    log = open_log(tmp_path / "t-0")
    with pytest.raises(InvalidRecordError):
        log.append_columns([b"a"])
    with pytest.raises(InvalidRecordError):
        log.append_columns(BinaryColumn.from_pylist([b"a"]), keys=[b"k"])
    with pytest.raises(InvalidRecordError):
        log.append_columns(BinaryColumn.from_pylist([]))
    assert log.log_end_offset == 0


def test_append_records_assigns_offsets_and_validates(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append(b"first")
    data = _core.encode_batch([b"a", b"b"], timestamps_ms=T0, base_offset=999) + \
        _core.encode_batch([b"c"], timestamps_ms=T0, base_offset=5)
    info = log.append_records(data)
    assert (info.first_offset, info.last_offset) == (1, 3)
    assert [(r.offset, r.value) for r in log.read(1)] == [(1, b"a"), (2, b"b"), (3, b"c")]
    bad = bytearray(_core.encode_batch([b"x"], timestamps_ms=T0))
    bad[-1] ^= 1  # CRC mismatch
    with pytest.raises(Exception):
        log.append_records(bytes(bad))
    with pytest.raises(InvalidRecordError):
        log.append_records(data[:-3])  # torn
    assert log.log_end_offset == 4


# ---------------------------------------------------------------------------------------------
# read rules (REF §3.6)


def _filled(tmp_path, batches=30, per=4, **kw):
    kw.setdefault("segment_bytes", 1200)
    log = open_log(tmp_path / "t-0", **kw)
    for b in range(batches):
        log.append_batch([b"value-%03d" % (b * per + i) for i in range(per)],
                         timestamps_ms=[T0 + b * per + i for i in range(per)])
    return log


def test_read_out_of_range_rules(tmp_path):
    log = _filled(tmp_path)
    leo = log.log_end_offset
    assert leo == 120 and len(log.segments) > 3
    assert log.read(leo) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(leo + 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1)
    log.delete_records(10)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(9)
    assert log.read(10)[0].offset == 10
    with pytest.raises(OffsetOutOfRangeError):
        log.read_columns(9)
    empty = open_log(tmp_path / "e-0")
    assert empty.read(0) == [] and len(empty.read_columns()) == 0
    with pytest.raises(OffsetOutOfRangeError):
        empty.read(1)


def test_read_starts_mid_batch_and_limits(tmp_path):
    log = _filled(tmp_path)
    recs = log.read(6)
    assert recs[0].offset == 6 and [r.offset for r in recs] == list(range(6, 6 + len(recs)))
    assert [r.offset for r in log.read(6, max_records=3)] == [6, 7, 8]
    assert log.read(6, max_records=0) == []
    # max_bytes below one batch still returns that whole batch (min one batch)
    assert [r.offset for r in log.read(5, max_bytes=1)] == [5, 6, 7]
    assert [r.offset for r in log.read(0, max_bytes=0)] == [0, 1, 2, 3]
    batch_size = batch_spans(bytes(log.segments[0].buffer()[:log.segments[0].size]))[0][1]
    assert [r.offset for r in log.read(0, max_bytes=2 * batch_size)] == list(range(8))
    # across segment boundaries
    second = log.segments[1].base_offset
    recs = log.read(second - 2, max_bytes=10**6)
    assert [r.offset for r in recs] == list(range(second - 2, second - 2 + len(recs)))
    assert recs[-1].offset >= second


def test_read_columns_equals_concatenated_reads(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=1500, index_interval_bytes=100)
    rnd = random.Random(9)
    for b in range(60):
        n = rnd.randint(1, 5)
        log.append_batch([None if rnd.random() < 0.1 else os.urandom(rnd.randint(0, 40))
                          for _ in range(n)],
                         [b"k%d" % rnd.randint(0, 3) for _ in range(n)],
                         [[("a", b"1")] * rnd.randint(0, 2) for _ in range(n)],
                         [T0 + rnd.randint(0, 100) for _ in range(n)],
                         compression=rnd.choice([None, "gzip", "lz4"]))
    assert len(log.segments) > 5
    leo = log.log_end_offset
    bases = [s.base_offset for s in log.segments]
    for start in sorted({0, 1, leo - 1, leo} | set(bases) | {b - 1 for b in bases[1:]}
                        | {rnd.randrange(leo) for _ in range(5)}):
        cols = log.read_columns(start, include_headers=True)
        check_columns(cols)
        assert columns_tuples(cols) == tuples(all_records(log, start)), start
    for start, end in [(0, 7), (bases[1] - 1, bases[3] + 1), (leo - 3, leo + 50)]:
        want = [t for t in tuples(all_records(log, start)) if t[0] < end]
        assert columns_tuples(log.read_columns(start, end, include_headers=True)) == want
    assert columns_tuples(log.read_columns(3, max_records=10), with_headers=False) == \
        [t[:5] + (None,) for t in tuples(all_records(log, 3))[:10]]


# ---------------------------------------------------------------------------------------------
# offsets by timestamp (REF §3.7, §7 #19)


def test_offset_for_time_special_targets(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=600, index_interval_bytes=64)
    assert log.offset_for_time(-2).offset == 0 and log.offset_for_time(-1).offset == 0
    assert log.offset_for_time(-3) is None and log.offset_for_time(T0) is None
    stamps = [50, 70, 60, 90, 90, 20, 90, 30]
    for i, ts in enumerate(stamps):
        log.append_batch([b"a", b"b"], timestamps_ms=[T0 + ts - 5, T0 + ts])
    assert len(log.segments) > 1
    assert log.offset_for_time(-1) == (16, -1, None)
    assert log.offset_for_time(-2) == (0, -1, None)
    # max timestamp: the first record carrying it (ties: first segment, first batch)
    assert log.offset_for_time(-3) == (7, T0 + 90, None)
    log.delete_records(3)
    assert log.offset_for_time(-2) == (3, -1, None)
    with pytest.raises(InvalidOffsetError):
        log.offset_for_time(-7)


def test_offset_for_time_matches_oracle(tmp_path):
    rnd = random.Random(4)
    for trial in range(6):
        log = open_log(tmp_path / f"t-{trial}", segment_bytes=rnd.choice([400, 1000, 10**6]),
                       index_interval_bytes=rnd.choice([0, 90, 4096]))
        recs = []
        for b in range(rnd.randint(5, 40)):
            n = rnd.randint(1, 4)
            stamps = [T0 + rnd.randint(0, 2000) for _ in range(n)]
            info = log.append_batch([b"x"] * n, timestamps_ms=stamps)
            recs += list(zip(range(info.first_offset, info.last_offset + 1), stamps))
        if trial % 2:
            log.delete_records(rnd.randrange(len(recs)))
        start = log.log_start_offset
        targets = [T0 - 1, T0, T0 + 2001, T0 + 10**6] + [t for _, t in recs] + \
            [T0 + rnd.randint(0, 2001) for _ in range(30)]
        for target in targets:
            hits = [(o, t) for o, t in recs if t >= target and o >= start]
            want = min(hits) if hits else None
            got = log.offset_for_time(target)
            assert (None if got is None else (got.offset, got.timestamp)) == want, (trial, target)
        assert log.offset_for_time(0).offset == start  # before the first: the first visible
        assert log.offset_for_time(T0 + 10**9) is None  # after the last: none


# ---------------------------------------------------------------------------------------------
# truncation and deletion (REF §3.8)


def test_truncate_inside_batch_removes_whole_batch(tmp_path):
    log = _filled(tmp_path, index_interval_bytes=50)
    expected = tuples(all_records(log))
    log.truncate_to(50)  # batch [48..51]
    assert log.log_end_offset == 48
    assert tuples(all_records(log)) == expected[:48]
    log.truncate_to(1000)  # at/after the end: no-op
    log.truncate_to(48)
    assert log.log_end_offset == 48
    info = log.append_batch([b"new-a", b"new-b"], timestamps_ms=T0)
    assert (info.first_offset, info.last_offset) == (48, 49)
    assert [r.value for r in log.read(47)] [-2:] == [b"new-a", b"new-b"]
    log.close()
    check_directory(tmp_path / "t-0", [t[:2] + t[3:] for t in expected[:48]]
                    + [(48, T0, None, b"new-a", []), (49, T0, None, b"new-b", [])])


def test_truncate_at_segment_boundary(tmp_path):
    log = _filled(tmp_path)
    bases = [s.base_offset for s in log.segments]
    expected = tuples(all_records(log))
    log.truncate_to(bases[2])
    assert log.log_end_offset == bases[2]
    assert [s.base_offset for s in log.segments] == bases[:3]
    assert log.active_segment.size == 0
    names = os.listdir(tmp_path / "t-0")
    assert not any(n.startswith("%020d" % b) for b in bases[3:] for n in names)
    assert tuples(all_records(log)) == expected[:bases[2]]
    log.append(b"after", timestamp_ms=T0)
    assert len(log.segments) == 3 and log.read(bases[2])[0].value == b"after"
    assert not log.active_segment.offset_index.is_full()
    assert not log.active_segment.time_index.is_full()


def test_truncate_below_first_segment_truncates_fully(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=600)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset) == (100, 100)
    for i in range(20):
        log.append(b"x%d" % i, timestamp_ms=T0)
    assert log.segments[0].base_offset == 100
    log.truncate_to(40)
    assert (log.log_start_offset, log.log_end_offset) == (40, 40)
    assert [s.base_offset for s in log.segments] == [40]
    assert sorted(os.listdir(tmp_path / "t-0")) == ["%020d%s" % (40, s) for s in
                                                   (".index", ".log", ".timeindex")]
    assert log.read(40) == []
    log.append(b"y", timestamp_ms=T0)
    assert log.read(40)[0].value == b"y"
    with pytest.raises(InvalidOffsetError):
        log.truncate_to(-1)
    with pytest.raises(InvalidOffsetError):
        log.truncate_fully_and_start_at(-5)


def test_truncate_fully_and_start_at(tmp_path):
    log = _filled(tmp_path)
    log.truncate_fully_and_start_at(5000)
    assert (log.log_start_offset, log.log_end_offset) == (5000, 5000)
    assert [s.base_offset for s in log.segments] == [5000]
    assert sorted(os.listdir(tmp_path / "t-0"))[0].startswith("%020d" % 5000)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0)
    log.append(b"z", timestamp_ms=T0)
    assert log.read(5000)[0].offset == 5000
    log.truncate_fully_and_start_at(5000)  # same base as the current segment
    assert log.log_end_offset == 5000 and log.read(5000) == []
    log.append(b"again", timestamp_ms=T0)
    log.close()
    again = open_log(tmp_path / "t-0")
    assert [(r.offset, r.value) for r in again.read(5000)] == [(5000, b"again")]


def test_delete_records(tmp_path):
    log = _filled(tmp_path)
    assert log.delete_records(37) == 37
    assert log.log_start_offset == 37
    with pytest.raises(OffsetOutOfRangeError):
        log.read(36)
    assert [r.offset for r in all_records(log)] == list(range(37, 120))
    assert log.delete_records(10) == 37  # never moves backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(121)
    assert log.delete_records(120) == 120
    assert log.read(120) == []
    assert log.offset_for_time(T0) is None
    log.truncate_to(21)  # below the log start offset: the start follows the end down
    assert (log.log_start_offset, log.log_end_offset) == (20, 20)
    assert log.read(20) == []
    assert log.append(b"back", timestamp_ms=T0).offset == 20
    assert [(r.offset, r.value) for r in log.read(20)] == [(20, b"back")]


# ---------------------------------------------------------------------------------------------
# rolling


def test_roll_on_segment_bytes_many_segments(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=700, index_interval_bytes=100)
    expected = []
    for i in range(200):
        v = b"r%03d" % i * (1 + i % 7)
        log.append(v, key=b"k", timestamp_ms=T0 + i)
        expected.append((i, T0 + i, b"k", v, []))
    segs = log.segments
    assert len(segs) >= 15
    for a, b in zip(segs, segs[1:]):
        assert a.size <= 700
        assert b.base_offset == a.read_next_offset()  # no gaps, no overlaps
    assert [r.value for r in all_records(log)] == [e[3] for e in expected]
    log.close()
    check_directory(tmp_path / "t-0", expected)


def test_roll_by_time_with_record_timestamps_and_jitter(tmp_path):
    clock = Clock()
    log = open_log(tmp_path / "t-0", clock, segment_ms=1000)
    log.append(b"a", timestamp_ms=T0)
    log.append(b"b", timestamp_ms=T0 + 1000)  # waited == segment.ms: no roll
    assert len(log.segments) == 1
    log.append(b"c", timestamp_ms=T0 + 1001)
    assert [s.base_offset for s in log.segments] == [0, 2]
    clock.t += 10**7  # wall clock irrelevant with timestamps
    log.append(b"d", timestamp_ms=T0 + 1002)
    assert len(log.segments) == 2

    jlog = open_log(tmp_path / "j-0", clock, segment_ms=1000, segment_jitter_ms=900)
    jitters = set()
    for i in range(6):
        start = T0 + 10**6 * i
        jlog.append(b"x", timestamp_ms=start)  # (after the first round) rolls by time
        seg = jlog.active_segment
        assert seg.rolling_based_timestamp == start and seg.base_offset == 3 * i
        j = seg.roll_jitter_ms
        assert 0 <= j < 900
        jitters.add(j)
        jlog.append(b"y", timestamp_ms=start + 1000 - j)
        assert jlog.active_segment is seg
        jlog.append(b"z", timestamp_ms=start + 1000 - j + 1)
        assert jlog.active_segment is not seg
    assert len(jitters) > 1  # drawn per segment


def test_roll_by_time_without_timestamps_uses_clock(tmp_path):
    clock = Clock()
    log = open_log(tmp_path / "t-0", clock, segment_ms=500)
    log.append(b"a", timestamp_ms=-1)
    clock.t += 500
    log.append(b"b", timestamp_ms=-1)
    assert len(log.segments) == 1
    clock.t += 1
    log.append(b"c", timestamp_ms=-1)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_explicit_roll(tmp_path):
    log = open_log(tmp_path / "t-0")
    first = log.active_segment
    assert log.roll() is first  # empty active segment: no-op
    log.append_batch([b"a", b"b"], timestamps_ms=T0)
    seg = log.roll()
    assert seg.base_offset == 2 and [s.base_offset for s in log.segments] == [0, 2]
    assert log.roll() is seg and len(log.segments) == 2
    assert os.path.getsize(first.offset_index.path) == 0  # the old segment was trimmed
    assert os.path.getsize(first.time_index.path) == 12
    log.append(b"c", timestamp_ms=T0)
    assert [(r.offset, r.value) for r in all_records(log)] == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_compacted_topic_rolls_at_max_compaction_lag(tmp_path):
    log = open_log(tmp_path / "t-0", cleanup_policy="compact", segment_ms=10**6,
                   max_compaction_lag_ms=100)
    log.append(b"a", key=b"k", timestamp_ms=T0)
    log.append(b"b", key=b"k", timestamp_ms=T0 + 101)
    assert len(log.segments) == 2


def test_roll_when_index_full(tmp_path):
    log = open_log(tmp_path / "t-0", segment_index_bytes=16, index_interval_bytes=0)
    for i in range(12):
        log.append(b"v%d" % i, timestamp_ms=T0 + i)
    assert len(log.segments) > 3
    assert [r.offset for r in all_records(log)] == list(range(12))
    log.close()
    check_directory(tmp_path / "t-0", [(i, T0 + i, None, b"v%d" % i, []) for i in range(12)])


def test_offset_gaps_force_roll_at_overflow(tmp_path):  # REF §7 #27
    log = open_log(tmp_path / "t-0", index_interval_bytes=0)
    big = 2**31 - 2
    b1 = _core.encode_batch([b"a", b"b"], timestamps_ms=T0, base_offset=77, offset_deltas=[0, big])
    b2 = _core.encode_batch([b"c", b"d"], timestamps_ms=T0 + 1, base_offset=3,
                            offset_deltas=[0, 5])
    b3 = _core.encode_batch([b"e", b"f"], timestamps_ms=T0 + 2, offset_deltas=[0, 2**31 - 1])
    info = log.append_records(b1)
    assert (info.first_offset, info.last_offset) == (0, big)  # relative offset big fits
    assert len(log.segments) == 1
    info = log.append_records(b2)
    assert (info.first_offset, info.last_offset) == (big + 1, big + 6)
    assert [s.base_offset for s in log.segments] == [0, big + 1]  # roll at max(next, LEO)
    log.append_records(b3)
    assert [s.base_offset for s in log.segments] == [0, big + 1, big + 7]
    expected = [(0, b"a"), (big, b"b"), (big + 1, b"c"), (big + 6, b"d"), (big + 7, b"e"),
                (big + 7 + 2**31 - 1, b"f")]
    assert [(r.offset, r.value) for r in all_records(log)] == expected
    assert log.log_end_offset == big + 7 + 2**31
    # a start in a gap reads on from the next offset present (across segments)
    assert [(r.offset, r.value) for r in log.read(5)] == expected[1:]
    assert [(r.offset, r.value) for r in log.read(big + 2)] == expected[3:]
    assert [(r.offset, r.value) for r in log.read(big + 8)] == expected[5:]
    for seg in log.segments:
        assert seg.offset_index.last_offset >= seg.base_offset
        assert seg.time_index.last_entry()[1] >= seg.base_offset
    log.close()
    check_directory(tmp_path / "t-0", [(o, T0 + (o > big) + (o > big + 6), None, v, [])
                                       for o, v in expected])
    again = open_log(tmp_path / "t-0", had_clean_shutdown=False)
    assert [(r.offset, r.value) for r in all_records(again)] == expected


def test_multi_batch_append_spanning_relative_overflow(tmp_path):  # REF §7 #27
    top = 2**31 - 1
    data = _core.encode_batch([b"a", b"b"], timestamps_ms=T0, offset_deltas=[0, top]) + \
        _core.encode_batch([b"c", b"d"], timestamps_ms=T0)

    def scenario():
        log = open_log(tmp_path / "t-0")
        info = log.append_records(data)
        return ((info.first_offset, info.last_offset), [s.base_offset for s in log.segments],
                [(r.offset, r.value) for r in all_records(log)])

    span, bases, recs = run_forked(scenario, timeout=3)  # a hang dies of SIGALRM
    assert span == (0, top + 2) and bases == [0, top + 1]
    assert recs == [(0, b"a"), (top, b"b"), (top + 1, b"c"), (top + 2, b"d")]


def test_preallocated_log_rolls_trim_and_reopen(tmp_path):  # REF §7 #24
    log = open_log(tmp_path / "t-0", segment_bytes=3000, preallocate=True)
    expected = []
    for i in range(60):
        log.append(b"p%02d" % i * 30, timestamp_ms=T0 + i)
        expected.append((i, T0 + i, None, b"p%02d" % i * 30, []))
    segs = log.segments
    assert len(segs) > 2
    for seg in segs[:-1]:  # rolled segments are trimmed to their data
        assert os.path.getsize(seg.log_path) == seg.size < 3000
    assert os.path.getsize(segs[-1].log_path) >= segs[-1].size
    assert [r.value for r in all_records(log)] == [e[3] for e in expected]
    log.close()
    check_directory(tmp_path / "t-0", expected)
    again = open_log(tmp_path / "t-0", segment_bytes=3000, preallocate=True)
    assert [s.size for s in again.segments] == [s.size for s in segs]
    assert [r.value for r in all_records(again)] == [e[3] for e in expected]
    again.roll()
    again.append(b"tail", timestamp_ms=T0)  # then "crash": the new active file stays preallocated
    assert os.path.getsize(again.active_segment.log_path) == 3000
    crashed = open_log(tmp_path / "t-0", segment_bytes=3000, preallocate=True,
                       had_clean_shutdown=False, recovery_point=0)
    assert crashed.log_end_offset == 61
    assert [r.value for r in all_records(crashed)] == [e[3] for e in expected] + [b"tail"]


def test_record_too_large(tmp_path):
    log = open_log(tmp_path / "t-0", max_message_bytes=500)
    log.append(b"x" * 400)
    with pytest.raises(RecordTooLargeError):
        log.append(b"x" * 500)
    with pytest.raises(RecordTooLargeError):
        log.append_batch([b"x" * 100] * 5)
    assert log.log_end_offset == 1 and log.active_segment.size < 500
    small = open_log(tmp_path / "s-0", segment_bytes=200)
    with pytest.raises(RecordTooLargeError):  # larger than a whole segment
        small.append(b"y" * 300)
    assert small.log_end_offset == 0


# ---------------------------------------------------------------------------------------------
# timestamps, flushing, lifecycle


def test_log_append_time(tmp_path):
    clock = Clock(T0 + 12345)
    log = open_log(tmp_path / "t-0", clock, message_timestamp_type="LogAppendTime")
    info = log.append_batch([b"a", b"b"], timestamps_ms=[1, 2])
    assert info.max_timestamp == T0 + 12345
    md = log.append(b"c", timestamp_ms=5)
    assert md.timestamp == T0 + 12345
    clock.t += 10
    log.append_columns(BinaryColumn.from_pylist([b"d"]), timestamps_ms=7)
    recs = log.read(0)
    assert [(r.timestamp, r.timestamp_type) for r in recs] == \
        [(T0 + 12345, 1)] * 3 + [(T0 + 12355, 1)]
    cols = log.read_columns()
    assert cols.timestamps_ms.tolist() == [T0 + 12345] * 3 + [T0 + 12355]
    assert cols.timestamp_types.tolist() == [1] * 4
    assert log.offset_for_time(T0 + 12346) == (3, T0 + 12355, None)
    assert log.offset_for_time(3) == (0, T0 + 12345, None)


def test_flush_messages_advances_recovery_point(tmp_path):
    log = open_log(tmp_path / "t-0", flush_messages=5)
    points = []
    for i in range(12):
        log.append(b"x")
        points.append(log.recovery_point)
    assert points == [0, 0, 0, 0, 5, 5, 5, 5, 5, 10, 10, 10]
    log.flush()
    assert log.recovery_point == 12


def test_flush_ms_with_fake_clock(tmp_path):
    clock = Clock()
    log = open_log(tmp_path / "t-0", clock, flush_ms=1000)
    log.append(b"a")
    clock.t += 999
    log.append(b"b")
    log.maybe_flush()
    assert log.recovery_point == 0
    clock.t += 1
    log.maybe_flush()
    assert log.recovery_point == 2


def test_roll_flushes_old_segments(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=300)
    for i in range(10):
        log.append(b"x" * 50)
    assert log.recovery_point == log.active_segment.base_offset > 0


def test_roll_syncs_the_sealed_segment_it_moves_the_recovery_point_past(tmp_path, monkeypatch):
    """The loader recovers only segments at or above the recovery point, so a roll (which moves
    it to the new segment) must have put the old segment's log and trimmed indexes on disk,
    though it also closes the old segment's descriptor and drops its index maps."""
    synced = set()
    real_fsync = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.add((st.st_ino, st.st_size))  # what this call made durable
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log = open_log(tmp_path / "t-0", segment_bytes=300)
    for i in range(10):
        log.append(b"x" * 50)
    sealed = log.segments[:-1]
    assert sealed and log.recovery_point == log.active_segment.base_offset
    for seg in sealed:
        for path in (seg.log_path, *seg._index_paths):
            st = os.stat(path)
            assert (st.st_ino, st.st_size) in synced, f"{path} was never synced as it is"


def test_close_and_reopen_keeps_everything(tmp_path):
    log = _filled(tmp_path, index_interval_bytes=80)
    log.append(b"last", key=b"k", headers=[("h", b"v")], timestamp_ms=T0 - 5)
    expected = tuples(all_records(log))
    bases = [s.base_offset for s in log.segments]
    log.close()
    log.close()  # idempotent
    for op in (lambda: log.read(0), lambda: log.append(b"x"), lambda: log.read_columns(),
               lambda: log.offset_for_time(T0), lambda: log.truncate_to(1),
               lambda: log.append_batch([b"x"]), lambda: log.delete_records(1)):
        with pytest.raises(StoreClosedError):
            op()
    check_directory(tmp_path / "t-0", [t[:2] + t[3:] for t in expected])
    again = open_log(tmp_path / "t-0", segment_bytes=1200)
    assert [s.base_offset for s in again.segments] == bases
    assert again.log_end_offset == 121 and tuples(all_records(again)) == expected
    assert again.offset_for_time(T0 + 50).offset == 50
    assert again.offset_for_time(-3) == (119, T0 + 119, None)
    again.append(b"more", timestamp_ms=T0)
    assert again.read(121)[0].value == b"more"


def test_clean_reopen_recovers_nothing(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=200)
    for i in range(12):
        log.append(b"x" * 20)
    log.close()
    sizes = {n: os.path.getsize(tmp_path / "t-0" / n) for n in os.listdir(tmp_path / "t-0")}
    again = open_log(tmp_path / "t-0", segment_bytes=200)
    assert len(again.segments) == 6
    assert again.load_result.recovered_segments == 0
    for seg in again.segments[:-1]:
        assert seg.offset_index.file_size == sizes[os.path.basename(seg.offset_index.path)]


def test_recovery_of_garbage_in_active_log_and_index(tmp_path):  # REF §7 #26
    log = open_log(tmp_path / "t-0", segment_bytes=2000, index_interval_bytes=64)
    for i in range(100):
        log.append(b"val%d" % i, key=b"k%d" % i, headers=[("n", b"%d" % i)], timestamp_ms=T0 + i)
    expected = tuples(all_records(log))
    leo = log.log_end_offset
    active = log.active_segment.base_offset
    log.close()
    rnd = random.Random(2)
    with open(tmp_path / "t-0" / ("%020d.log" % active), "ab") as f:
        f.write(bytes(rnd.getrandbits(8) for _ in range(300)))
    with open(tmp_path / "t-0" / ("%020d.index" % active), "ab") as f:
        f.write(bytes(rnd.getrandbits(8) for _ in range(64)))
    again = open_log(tmp_path / "t-0", segment_bytes=2000, index_interval_bytes=64,
                     had_clean_shutdown=False, recovery_point=0)
    assert again.load_result.truncated_bytes == 300
    assert again.log_end_offset == leo and again.recovery_point == 0
    assert tuples(all_records(again)) == expected
    again.append(b"next", timestamp_ms=T0)
    assert again.read(leo)[0].value == b"next"
    again.close()
    check_directory(tmp_path / "t-0", [t[:2] + t[3:] for t in expected] +
                    [(leo, T0, None, b"next", [])])


BUG_EMPTY_INDEX = ("BUG: a zero-length .index is re-preallocated on open, so the loader recovers "
                   "(and truncates) the segment before the unclean-shutdown pass, which then sees "
                   "no lost bytes and keeps the later segments: the log is left with a hole")


@pytest.mark.parametrize("interval", [50, 4096])
def test_unclean_reopen_truncates_corrupt_batch_and_drops_later_segments(tmp_path, interval):
    log = open_log(tmp_path / "t-0", segment_bytes=1000, index_interval_bytes=interval)
    for i in range(60):
        log.append(b"v%02d" % i * 5, timestamp_ms=T0 + i)
    bases = [s.base_offset for s in log.segments]
    log.close()
    path = tmp_path / "t-0" / ("%020d.log" % bases[1])
    data = bytearray(path.read_bytes())
    spans = batch_spans(data)
    pos, _ = spans[3]
    data[pos + 30] ^= 0x55  # corrupt the 4th batch of the second segment (CRC mismatch)
    path.write_bytes(data)
    again = open_log(tmp_path / "t-0", segment_bytes=1000, index_interval_bytes=interval,
                     had_clean_shutdown=False, recovery_point=bases[1])
    assert [s.base_offset for s in again.segments] == bases[:2]
    assert sorted(again.load_result.deleted_segments) == bases[2:]
    assert again.log_end_offset == bases[1] + 3
    assert [r.value for r in all_records(again)] == [b"v%02d" % i * 5 for i in range(bases[1] + 3)]
    names = sorted(os.listdir(tmp_path / "t-0"))
    assert [n for n in names if not n.endswith(".snapshot")][-1].startswith("%020d" % bases[1])
    # producer snapshots: none past the new end; the open took one at it (Kafka's rebuild)
    assert max(int(n[:20]) for n in names if n.endswith(".snapshot")) == again.log_end_offset


# ---------------------------------------------------------------------------------------------
# on-disk format checked by kafka-python


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_log_files_parse_in_kafka_python_and_indexes_point_at_batches(tmp_path, codec):
    rnd = random.Random(str(codec))
    log = open_log(tmp_path / "t-0", segment_bytes=3000, index_interval_bytes=150)
    expected = []
    for b in range(120):
        n = rnd.randint(1, 4)
        keys = [b"k%d" % rnd.randint(0, 99) for _ in range(n)]
        vals = [os.urandom(rnd.randint(0, 120)) for _ in range(n)]
        heads = [[("h", b"%d" % b)] for _ in range(n)]
        stamps = [T0 + rnd.randint(0, 10**5) for _ in range(n)]
        info = log.append_batch(vals, keys, heads, stamps, compression=codec)
        expected += [(info.first_offset + i, stamps[i], keys[i], vals[i], heads[i])
                     for i in range(n)]
    assert len(log.segments) > 5
    log.close()
    check_directory(tmp_path / "t-0", expected)


def _kafka_python_directory(path, files=3, batches=4, per=5, gzip_every=2):
    path.mkdir()
    expected, off = [], 0
    for _ in range(files):
        base, out = off, bytearray()
        for b in range(batches):
            builder = KpMemoryRecordsBuilder(magic=2, compression_type=int(b % gzip_every == 1),
                                             batch_size=1 << 20)
            for _ in range(per):
                rec = (off, T0 + off * 7 % 50, b"k%d" % off, b"v%d" % off * 3, [("h", b"%d" % off)])
                builder.append(timestamp=rec[1], key=rec[2], value=rec[3], headers=rec[4])
                expected.append(rec)
                off += 1
            builder.close()
            buf = bytearray(builder.buffer())
            _core.set_base_offset(buf, 0, off - per)
            out += buf
        (path / ("%020d.log" % base)).write_bytes(bytes(out))
    return expected


def test_kafka_python_written_directory_opens_and_reads(tmp_path):
    expected = _kafka_python_directory(tmp_path / "k-0")
    log = open_log(tmp_path / "k-0", index_interval_bytes=60)
    assert [s.base_offset for s in log.segments] == [0, 20, 40]
    assert log.log_end_offset == 60
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
            for r in all_records(log)] == expected
    cols = log.read_columns(include_headers=True)
    assert cols.values.to_pylist() == [e[3] for e in expected]
    for ts in (T0, T0 + 13, T0 + 49):
        want = min(e[0] for e in expected if e[1] >= ts)
        assert log.offset_for_time(ts).offset == want
    log.append(b"segstore", timestamp_ms=T0)
    log.close()
    check_directory(tmp_path / "k-0", expected + [(60, T0, None, b"segstore", [])])
    again = open_log(tmp_path / "k-0")
    assert again.log_end_offset == 61 and again.read(60)[0].value == b"segstore"


# ---------------------------------------------------------------------------------------------
# read-only readers


def test_readonly_rejects_mutations(tmp_path):
    w = _filled(tmp_path)
    ro = open_log(tmp_path / "t-0", readonly=True)
    assert ro.log_end_offset == 120 and len(all_records(ro)) == 120
    for op in (lambda: ro.append(b"x"), lambda: ro.append_batch([b"x"]),
               lambda: ro.append_columns(BinaryColumn.from_pylist([b"x"])),
               lambda: ro.append_records(_core.encode_batch([b"x"])),
               lambda: ro.truncate_to(0), lambda: ro.truncate_fully_and_start_at(0),
               lambda: ro.delete_records(1), lambda: ro.roll(), lambda: ro.flush()):
        with pytest.raises(ReadOnlyStoreError):
            op()
    # three files per segment and the producer snapshots of the writer's rolls
    assert w.log_end_offset == 120 and len(os.listdir(tmp_path / "t-0")) == 4 * len(w.segments) - 1
    ro.close()
    with pytest.raises(StoreClosedError):
        ro.read(0)


def test_readonly_on_missing_directory_is_empty(tmp_path):
    ro = open_log(tmp_path / "nothing-0", readonly=True)
    assert ro.log_end_offset == 0 and ro.read(0) == [] and ro.segments == ()
    assert not (tmp_path / "nothing-0").exists()


def test_readonly_sees_appends_to_active_segment(tmp_path):
    w = _filled(tmp_path, batches=5, segment_bytes=10**6)
    w.close()

    def reader():
        ro = open_log(tmp_path / "t-0", readonly=True)
        seen = [(ro.log_end_offset, len(all_records(ro)))]
        w2 = open_log(tmp_path / "t-0", segment_bytes=10**6)
        for b in range(10):
            w2.append_batch([b"more-%d" % (b * 3 + i) for i in range(3)],
                            timestamps_ms=T0 + 100 + b)
            seen.append((ro.log_end_offset, len(all_records(ro))))
        return seen, [r.value for r in ro.read(48)], ro.offset_for_time(T0 + 109).offset

    seen, tail, by_time = run_forked(reader)
    assert seen == [(20 + 3 * b, 20 + 3 * b) for b in range(11)]
    assert tail == [b"more-28", b"more-29"] and by_time == 47


def test_readonly_sees_appends_and_rolls_after_open_closed_writer(tmp_path):
    """The reader opens on a cleanly closed directory (trimmed indexes)."""
    w = _filled(tmp_path, batches=5)
    w.close()

    def reader():
        ro = open_log(tmp_path / "t-0", readonly=True)
        seen = [ro.log_end_offset]
        w2 = open_log(tmp_path / "t-0", segment_bytes=1200)
        for b in range(40):
            w2.append_batch([b"more-%d" % (b * 3 + i) for i in range(3)], timestamps_ms=T0)
            if b % 10 == 9:
                seen.append(ro.log_end_offset)
        out = (seen, len(w2.segments), len(ro.segments),
               [(r.offset, r.value) for r in all_records(ro)])
        w2.close()
        return out

    seen, wsegs, rsegs, recs = run_forked(reader)
    assert seen == [20, 50, 80, 110, 140] and wsegs == rsegs > 2
    assert [o for o, _ in recs] == list(range(140))
    assert [v for _, v in recs[20:]] == [b"more-%d" % i for i in range(120)]


def test_readonly_sees_appends_and_rolls_of_open_writer(tmp_path):
    """Same process: the reader opens while the writer's active index is preallocated, then
    the writer appends and rolls (trimming that index)."""
    def scenario():
        w = open_log(tmp_path / "t-0", segment_bytes=2000, index_interval_bytes=64)
        for i in range(30):
            w.append(b"value-%d" % i, timestamp_ms=T0 + i)
        ro = open_log(tmp_path / "t-0", readonly=True)
        first = (ro.log_end_offset, [r.value for r in ro.read(25)])
        for i in range(30, 120):
            w.append(b"value-%d" % i, timestamp_ms=T0 + i)
        return (first, len(w.segments), len(ro.segments), ro.log_end_offset,
                [(r.offset, r.value) for r in all_records(ro)], ro.offset_for_time(T0 + 77))

    first, wsegs, rsegs, leo, recs, by_time = run_forked(scenario)
    assert first == (30, [b"value-%d" % i for i in range(25, 30)])
    assert wsegs == rsegs > 2 and leo == 120
    assert recs == [(i, b"value-%d" % i) for i in range(120)]
    assert by_time.offset == 77


def test_tailing_readonly_reader_memory_is_bounded(tmp_path):
    import resource

    def scenario():
        w = open_log(tmp_path / "t-0", segment_bytes=2000)
        ro = open_log(tmp_path / "t-0", readonly=True)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for i in range(400):  # ~25 rolls, the reader refreshing after every append
            w.append(b"x" * 50, timestamp_ms=T0)
            assert ro.log_end_offset == i + 1
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        return len(ro.segments), grown_kib

    nsegs, grown_kib = run_forked(scenario)
    assert nsegs > 20
    assert grown_kib < 100 * 1024, f"reader grew by {grown_kib // 1024} MiB over {nsegs} segments"


def test_readonly_follows_writer_truncation(tmp_path):
    w = _filled(tmp_path, batches=5, segment_bytes=10**6)
    ro = open_log(tmp_path / "t-0", readonly=True)
    assert len(ro.read(0)) == 20
    w.read(0)  # the writer maps its active segment: truncation rewrites the file
    w.truncate_to(8)  # a batch edge: batches hold 4 records each
    w.append_batch([b"new-1", b"new-2"], timestamps_ms=T0)
    assert ro.log_end_offset == 8 + 2
    assert [r.value for r in ro.read(6)] == [b"value-006", b"value-007", b"new-1", b"new-2"]


WRITER = textwrap.dedent(r"""
    import sys
    from segstore.config import TopicConfig
    from segstore.log import PartitionLog
    directory, total, prealloc = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    config = TopicConfig.from_dict({"segment.bytes": 12000, "index.interval.bytes": 200,
                                    "preallocate": prealloc})
    log = PartitionLog(directory, "t", 0, config, lambda: 1_700_000_000_000)
    print("ready", log.log_end_offset, flush=True)
    sys.stdin.readline()  # wait until the reader is open
    i = log.log_end_offset
    while i < total:
        n = min(1 + i % 4, total - i)
        log.append_batch([b"value-%d" % j for j in range(i, i + n)],
                         timestamps_ms=[1_700_000_000_000 + j for j in range(i, i + n)])
        i += n
    log.close()
    print("done", i, flush=True)
""")


@pytest.mark.parametrize("preallocate", [False, True])
def test_writer_subprocess_and_readonly_reader(tmp_path, preallocate):
    """A writer process appends and rolls while this side reads read-only: every read is a
    gap-free prefix of what was written, and nothing raises."""
    directory = tmp_path / "t-0"
    w = open_log(directory, segment_bytes=12000, index_interval_bytes=200,
                 preallocate=preallocate)
    for i in range(50):
        w.append(b"value-%d" % i, timestamp_ms=T0 + i)
    w.close()
    total = 3000
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(total),
                             str(int(preallocate))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    try:
        assert proc.stdout.readline().split() == [b"ready", b"50"]

        def reader():
            ro = open_log(directory, readonly=True)  # the writer's active segment is open
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            nxt, reads, leos = 0, 0, []
            deadline = time.monotonic() + 8
            while len(ro.segments) < 2 and time.monotonic() < deadline:
                leos.append(ro.log_end_offset)  # tail the end until the writer has rolled once
            while nxt < total and time.monotonic() < deadline:
                leo = ro.log_end_offset
                leos.append(leo)
                if nxt < leo:
                    recs = ro.read(nxt, max_bytes=4096)
                    reads += 1
                    offs = [r.offset for r in recs]
                    assert offs == list(range(nxt, nxt + len(offs))), (nxt, offs[:5])
                    assert [r.value for r in recs] == [b"value-%d" % o for o in offs]
                    nxt += len(offs)
                if reads % 25 == 0 and nxt:  # the prefix never changes
                    again = ro.read_columns(0, nxt)
                    assert again.offsets.tolist() == list(range(nxt))
            return nxt, reads, leos, len(ro.segments)

        nxt, reads, leos, nsegs = run_forked(reader)
    finally:
        out, err = proc.communicate(input=b"go\n", timeout=60)  # never leave the writer waiting
    assert proc.returncode == 0, err.decode()
    assert out.split() == [b"done", str(total).encode()]
    assert nxt == total and nsegs > 3
    assert leos == sorted(leos)  # the log end offset never goes backwards
    assert reads > 1
    final = open_log(directory)
    assert [r.value for r in all_records(final)] == [b"value-%d" % i for i in range(total)]
    final.close()
    check_directory(directory, [(i, T0 + i, None, b"value-%d" % i, []) for i in range(total)])


# ---------------------------------------------------------------------------------------------
# bad input


def test_bad_input(tmp_path):
    log = _filled(tmp_path, batches=3)
    with pytest.raises(InvalidRecordError):
        log.append(123)
    with pytest.raises(InvalidRecordError):
        log.append(b"x", key=4.5)
    with pytest.raises(InvalidRecordError):
        log.append(b"x", headers=[(1, b"v")])
    with pytest.raises(InvalidRecordError):
        log.append_batch([])
    with pytest.raises(InvalidRecordError):
        log.append_records(b"\x00\x01")
    with pytest.raises(InvalidRecordError):
        log.append_records(b"")
    with pytest.raises(TypeError):
        log.read("0")
    with pytest.raises(TypeError):
        log.read(1.0)
    with pytest.raises(TypeError):
        log.read(True)
    with pytest.raises(InvalidArgumentError):  # a ValueError too
        log.read(0, max_records=-1)
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        log.read(0, max_bytes=-1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-3)
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(-1)
    with pytest.raises(InvalidOffsetError):
        log.truncate_to(-1)
    assert log.log_end_offset == 12 and len(all_records(log)) == 12
    assert log.read(np.int64(4))[0].offset == 4
