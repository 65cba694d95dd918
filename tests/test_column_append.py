"""append_columns in pipelined chunks (segstore.column_append): same log as one call, all or
nothing on bad input, rolls and indexes intact. CHUNK_BYTES is shrunk so small data spans many
chunks."""

from __future__ import annotations

import numpy as np
import pytest

import segstore
from segstore import _core, column_append
from segstore.columns import BinaryColumn
from segstore.errors import InvalidRecordError, RecordTooLargeError

T0 = 1_700_000_000_000


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(column_append, "CHUNK_BYTES", 3000)


def columns(n: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    vals = [None if i % 11 == 4 else bytes(rng.integers(0, 256, int(rng.integers(0, 60)),
                                                       dtype=np.uint8)) for i in range(n)]
    keys = [None if i % 7 == 1 else b"key-%d" % (i % 50) for i in range(n)]
    ts = T0 + rng.integers(-1000, 1000, n)
    return vals, keys, ts


def open_log(root, **config):
    store = segstore.open(str(root), clock=lambda: T0 + 5)
    store.create_topic("t", 1, config=config)
    return store, store.partition("t", 0)


def log_bytes(lg) -> bytes:
    return b"".join(open(s.log_path, "rb").read() for s in lg.segments)


def test_chunk_rows_chooses_whole_batches_and_falls_back_for_small_or_huge(small_chunks):
    vals, keys, _ = columns(2000)
    v, k = BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys)
    per = column_append.chunk_rows(v, k, 10, 1 << 20)
    assert per % 10 == 0 and 10 <= per < 2000
    assert column_append.chunk_rows(v, k, 5000, 1 << 20) == 2000  # one batch: one call
    # A record that might not fit a batch on its own: the one-call path decides.
    assert column_append.chunk_rows(v, k, 10, 100) == 2000


@pytest.mark.parametrize("ts_kind", ["array", "scalar", "none"])
def test_chunked_append_writes_what_one_call_writes(tmp_path, small_chunks, monkeypatch, ts_kind):
    vals, keys, ts = columns(3000)
    v, k = BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys)
    t = {"array": ts, "scalar": T0 + 9, "none": None}[ts_kind]
    store, lg = open_log(tmp_path / "chunked")
    lg.append_batch([b"first"], keys=[b"k"], timestamps_ms=[T0])
    info = lg.append_columns(v, k, t, records_per_batch=16)
    monkeypatch.setattr(column_append, "CHUNK_BYTES", 1 << 40)
    store2, one = open_log(tmp_path / "one")
    one.append_batch([b"first"], keys=[b"k"], timestamps_ms=[T0])
    info2 = one.append_columns(v, k, t, records_per_batch=16)
    assert info == info2
    assert (info.first_offset, info.last_offset, info.num_records) == (1, 3000, 3000)
    assert log_bytes(lg) == log_bytes(one)
    recs = lg.read(1, max_bytes=1 << 30)
    want_ts = {"array": ts.tolist(), "scalar": [T0 + 9] * 3000, "none": [T0 + 5] * 3000}[ts_kind]
    assert [(r.offset, r.key, r.value, r.timestamp) for r in recs] == [
        (1 + i, keys[i], vals[i], want_ts[i]) for i in range(3000)]
    store.close()
    store2.close()


def test_chunked_append_rolls_segments_and_indexes_every_offset(tmp_path, small_chunks):
    vals, keys, ts = columns(4000)
    store, lg = open_log(tmp_path, **{"segment.bytes": 20_000, "index.interval.bytes": 512})
    lg.append_columns(BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys), ts,
                      records_per_batch=8)
    assert len(lg.segments) > 5 and lg.log_end_offset == 4000
    for off in range(0, 4000, 37):
        (rec,) = lg.read(off, max_bytes=1)[:1]
        assert (rec.offset, rec.value) == (off, vals[off])
    store.close()
    store = segstore.open(str(tmp_path))
    lg = store.partition("t", 0)
    assert [r.value for r in lg.iter_records()] == vals
    for seg in lg.segments:
        assert seg.verify() == []  # no problems found in the log or its indexes
    store.close()


def test_log_append_time_stamps_every_chunk(tmp_path, small_chunks):
    vals, keys, ts = columns(2000)
    store, lg = open_log(tmp_path, **{"message.timestamp.type": "LogAppendTime"})
    lg.append_columns(BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys), ts,
                      records_per_batch=16)
    recs = lg.read(0, max_bytes=1 << 30)
    assert len(recs) == 2000
    assert {(r.timestamp, r.timestamp_type) for r in recs} == {(T0 + 5, 1)}
    store.close()


def bad_offsets(col: BinaryColumn, row: int) -> BinaryColumn:
    off = col.offsets.copy()
    off[row] = off[row + 1] + 1  # decreasing: the encoder would reject this row
    return BinaryColumn(col.data, off, col.valid)


@pytest.mark.parametrize("damage", ["values", "keys", "timestamps", "key_count"])
def test_bad_input_anywhere_appends_nothing(tmp_path, small_chunks, damage):
    vals, keys, ts = columns(3000)
    v, k = BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys)
    if damage == "values":
        v = bad_offsets(v, 2900)
    elif damage == "keys":
        k = bad_offsets(k, 2950)
    elif damage == "timestamps":
        ts = ts[:-1]
    else:
        k = BinaryColumn.from_pylist(keys[:-1])
    store, lg = open_log(tmp_path)
    with pytest.raises(InvalidRecordError):
        lg.append_columns(v, k, ts, records_per_batch=16)
    assert lg.log_end_offset == 0 and lg.segments[-1].size == 0
    store.close()


def test_a_record_too_large_late_in_the_columns_appends_nothing(tmp_path, small_chunks):
    vals, keys, ts = columns(3000)
    vals[2999] = b"x" * 5000
    store, lg = open_log(tmp_path, **{"max.message.bytes": 4000})
    with pytest.raises(RecordTooLargeError):
        lg.append_columns(BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys), ts,
                          records_per_batch=16)
    assert lg.log_end_offset == 0
    store.close()


def test_an_encoding_failure_in_a_later_chunk_stops_cleanly(tmp_path, small_chunks, monkeypatch):
    """Should a later chunk fail anyway (say, out of memory), the chunks before it stay
    appended as whole batches and the log stays consistent and writable."""
    vals, keys, ts = columns(3000)
    real = _core.encode_columns
    calls = []

    def flaky(*args, **kw):
        calls.append(kw["base_offset"])
        if len(calls) == 3:
            raise MemoryError("injected")
        return real(*args, **kw)

    monkeypatch.setattr(_core, "encode_columns", flaky)
    store, lg = open_log(tmp_path)
    with pytest.raises(MemoryError):
        lg.append_columns(BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys), ts,
                          records_per_batch=16)
    leo = lg.log_end_offset
    assert leo == calls[2]  # exactly the first two chunks
    assert [r.value for r in lg.read(0, max_bytes=1 << 30)] == vals[:leo]
    monkeypatch.setattr(_core, "encode_columns", real)
    lg.append_batch([b"after"], timestamps_ms=[T0])
    assert lg.read(leo, max_bytes=1)[0].value == b"after"
    store.close()


def test_concurrent_chunked_appends_to_two_partitions(tmp_path, small_chunks):
    """Appends from two threads share the encoder pool; each log gets exactly its records."""
    import threading

    store = segstore.open(str(tmp_path), clock=lambda: T0)
    store.create_topic("t", 2)
    data = {p: columns(2500, seed=p + 10) for p in (0, 1)}
    errors = []

    def append(p):
        try:
            vals, keys, ts = data[p]
            lg = store.partition("t", p)
            for _ in range(3):
                lg.append_columns(BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(keys),
                                  ts, records_per_batch=16)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=append, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for p in (0, 1):
        vals, keys, _ = data[p]
        recs = list(store.partition("t", p).iter_records())
        assert [(r.offset, r.key, r.value) for r in recs] == [
            (i, keys[i % 2500], vals[i % 2500]) for i in range(7500)]
    store.close()
