"""A buffer written to between the counting and filling passes of a column decode (or encode).

Column decode counts the selected records and bytes of each batch, sizes the arrays by those
counts, then parses the batches again to fill them. A caller's ``bytearray`` (or a writable
mapping another process writes) can change in between; the fill must then stop with a
CorruptRecordError, never write past the arrays or leave slots unwritten. The core's test hook
``_set_between_passes`` rewrites the buffer at exactly that moment. The twin logs below share
their batch framing (sizes, offsets, record counts): only lengths inside the records differ,
so the scan of the changed buffer would find the same batches.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from conftest import (batch_spans, check_columns, columns_tuples, rec_tuple,
                      rewritten_between_passes)
from segstore import _core
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError, InvalidRecordError

N_BATCHES = 6
PER_BATCH = 5


def _batch(base: int, keys, values, headers=None, deltas=None) -> bytes:
    return _core.encode_batch(values, keys, headers, [1_000 + i for i in range(len(values))],
                              base_offset=base, offset_deltas=deltas)


def _record_batch(b: int, kind: str, changed: bool) -> bytes:
    """Batch ``b`` of a twin log. Changed, its records move bytes between two fields."""
    base = b * PER_BATCH
    if kind == "keys":      # value bytes become key bytes: more key bytes than counted
        klen = 10 if changed else 4
        return _batch(base, [b"k" * klen] * PER_BATCH, [b"v" * (24 - klen)] * PER_BATCH)
    if kind == "headers":   # header value bytes become header key bytes
        hkey = "hhh" if changed else "h"
        headers = [[(hkey, b"x" * (8 - len(hkey)))]] * PER_BATCH
        return _batch(base, [b"k"] * PER_BATCH, [b"v" * 20] * PER_BATCH, headers)
    if kind == "fewer":     # offset deltas move: fewer records from the start offset on
        deltas = [0, 1, 3, 4, 5] if changed else [0, 2, 3, 4, 5]
        return _batch(base, [b"k"] * PER_BATCH, [b"v" * 20] * PER_BATCH, deltas=deltas)
    raise ValueError(kind)


def _twin_logs(kind: str, changed: int, n_batches: int = N_BATCHES) -> tuple[bytes, bytes]:
    """(log as counted, log as filled): batch ``changed`` differs, with the same framing."""
    before = [_record_batch(b, kind, False) for b in range(n_batches)]
    after = list(before)
    after[changed] = _record_batch(changed, kind, True)
    a, b = before[changed], after[changed]
    # Same header but for the CRC (bytes 17-21): same size, offsets, count and timestamps.
    assert a != b and len(a) == len(b) and a[:17] == b[:17] and a[21:61] == b[21:61]
    return b"".join(before), b"".join(after)


@pytest.fixture(params=["one thread", "two threads", "one-pass tail", "one-pass tail streamed",
                        "two threads streamed"])
def split(request):
    """Run the decode on one thread, or force the two-thread split (with or without the
    one-pass tail, with or without streamed stores) onto these small logs."""
    min_bytes, share = {"one thread": (1 << 62, 0.0), "two threads": (0, 0.0),
                        "one-pass tail": (0, 0.4), "one-pass tail streamed": (0, 0.4),
                        "two threads streamed": (0, 0.0)}[request.param]
    old_min = _core._set_parallel_min_bytes(min_bytes)
    old_share = _core._set_tail_share(share)
    old_stream = _core._set_stream_min_bytes(0 if "streamed" in request.param else 1 << 62)
    # The counting pass's fill: placed by predicted sizes, a changed batch is only a wrong
    # prediction, and the decode counts the changed bytes (test_decode_predicted.py).
    old_predict = _core._set_predict_sizes(False)
    yield request.param.replace(" streamed", "")
    _core._set_parallel_min_bytes(old_min)
    _core._set_tail_share(old_share)
    _core._set_stream_min_bytes(old_stream)
    _core._set_predict_sizes(old_predict)


def _expect_changed(err, buf, changed: int, file=None) -> None:
    assert "changed during decode" in err.value.reason
    assert err.value.position == batch_spans(buf)[changed][0]
    assert err.value.file == file


@pytest.mark.parametrize("changed", [0, 2])
@pytest.mark.parametrize("kind,headers", [("keys", False), ("keys", True), ("headers", True)])
def test_a_changed_batch_raises_instead_of_writing_past_its_place(split, kind, headers, changed):
    # Batches 0 and 2 lie in the head of the one-pass-tail split (the tail is the last 40%).
    before, after = _twin_logs(kind, changed)
    buf = bytearray(before)
    with rewritten_between_passes(buf, after) as done:
        with pytest.raises(CorruptRecordError) as err:
            _core.decode_columns(buf, include_headers=headers, file="seg.log")
    assert done
    _expect_changed(err, before, changed, "seg.log")
    # The decoder is intact: the changed bytes decode on their own, like the object decoder.
    cols = _core.decode_columns(buf, include_headers=headers)
    check_columns(cols)
    assert columns_tuples(cols, headers) == [
        rec_tuple(r) if headers else rec_tuple(r)[:5] + (None,) for r in _core.decode_records(buf)]


@pytest.mark.parametrize("kind,headers", [("keys", False), ("keys", True), ("headers", True)])
def test_the_last_batch_changed_cannot_write_past_the_arrays(split, kind, headers):
    """The last batch's place ends where the arrays end: without the capacity check its extra
    key bytes would be written past them (in the one-pass tail its CRC catches the change)."""
    last = N_BATCHES - 1
    before, after = _twin_logs(kind, last)
    buf = bytearray(before)
    with rewritten_between_passes(buf, after):
        with pytest.raises(CorruptRecordError) as err:
            _core.decode_columns(buf, include_headers=headers)
    assert err.value.position == batch_spans(before)[last][0]
    if split == "one-pass tail" and not headers:
        assert err.value.reason == "CRC mismatch"   # the tail is checked as it is copied
    else:
        assert "changed during decode" in err.value.reason


def test_a_changed_tail_without_crc_checks_is_decoded_as_it_is_now():
    """The one-pass tail is sized by an upper bound (its batches' counts and bytes), not by a
    count: what it finds when it copies fits, and is returned as found."""
    old_min, old_share = _core._set_parallel_min_bytes(0), _core._set_tail_share(0.4)
    try:
        before, after = _twin_logs("keys", N_BATCHES - 1)
        buf = bytearray(before)
        with rewritten_between_passes(buf, after):
            cols = _core.decode_columns(buf, validate_crc=False)
    finally:
        _core._set_parallel_min_bytes(old_min)
        _core._set_tail_share(old_share)
    check_columns(cols)
    assert columns_tuples(cols, False) == [rec_tuple(r)[:5] + (None,)
                                           for r in _core.decode_records(after)]


def test_fewer_records_than_counted_raise_rather_than_leave_slots_unwritten(split):
    before, after = _twin_logs("fewer", 0)
    buf = bytearray(before)
    with rewritten_between_passes(buf, after):
        with pytest.raises(CorruptRecordError) as err:
            # Counted: offsets 2-5 of the first batch; filled: 3-5 only.
            _core.decode_columns(buf, min_offset=2)
    _expect_changed(err, before, 0)


@pytest.mark.parametrize("max_records", [2 * PER_BATCH + 2, 3 * PER_BATCH])
def test_the_batch_max_records_cuts_short_is_checked_too(split, max_records):
    before, after = _twin_logs("keys", 2)
    buf = bytearray(before)
    with rewritten_between_passes(buf, after):
        with pytest.raises(CorruptRecordError) as err:
            _core.decode_columns(buf, max_records=max_records)
    _expect_changed(err, before, 2)


def test_decode_columns_multi_names_the_changed_source(split):
    before, after = _twin_logs("keys", 3)
    bufs = [bytearray(before) for _ in range(3)]
    sources = [(b, 0, None, f"{i:020d}.log") for i, b in enumerate(bufs)]
    with rewritten_between_passes(bufs[1], after):
        with pytest.raises(CorruptRecordError) as err:
            _core.decode_columns_multi(sources, include_headers=True)
    _expect_changed(err, before, 3, f"{1:020d}.log")


def test_an_unchanged_buffer_decodes_with_the_hook_set(split):
    before, _ = _twin_logs("keys", 2)
    buf = bytearray(before)
    calls = []
    old = _core._set_between_passes(lambda: calls.append(1))
    try:
        cols = _core.decode_columns(buf, include_headers=True)
    finally:
        _core._set_between_passes(old)
    assert calls == [1]
    assert columns_tuples(cols) == [rec_tuple(r) for r in _core.decode_records(before)]


# ----------------------------------------------------------------------------------------------
# encode_columns plans every batch's size from the columns, then writes them (the same hook runs
# between): columns written to meanwhile must not make it write past its output.

def _columns(n: int = 40):
    """Values, keys and timestamps; the values' data runs 16 bytes past the last value (so a
    value can grow and still lie inside it)."""
    packed = BinaryColumn.from_pylist([b"v%03d" % i * 3 for i in range(n)])
    values = BinaryColumn(np.concatenate([packed.data, np.zeros(16, np.uint8)]),
                          packed.offsets.copy(), packed.valid)
    keys = BinaryColumn.from_pylist([b"key-%02d" % i for i in range(n)])
    return values, keys, 1_000 + np.arange(n, dtype=np.int64)


@contextlib.contextmanager
def calling_between_passes(fn):
    old = _core._set_between_passes(fn)
    try:
        yield
    finally:
        _core._set_between_passes(old)


@pytest.mark.parametrize("change", ["longer value", "value past the data", "shorter value",
                                    "later timestamp", "order out of range",
                                    "first row out of range"])
def test_columns_changed_during_encode_raise(split, change):
    values, keys, ts = _columns()
    order = np.arange(len(ts), dtype=np.int64)
    last = len(ts) - 1    # in the last batch: its end is the output's end

    def rewrite():
        if change == "longer value":       # 4 more bytes, still inside the data
            values.offsets[last + 1] += 4
        elif change == "value past the data":
            values.offsets[last + 1] += 17
        elif change == "shorter value":    # the batch would leave bytes unwritten
            values.offsets[last + 1] -= 4
        elif change == "later timestamp":  # a longer timestamp delta varint
            ts[last] += 1 << 40
        elif change == "order out of range":
            order[last] = 1 << 40
        else:                              # the row a batch takes its base timestamp from
            order[32] = -1

    with calling_between_passes(rewrite):
        with pytest.raises(InvalidRecordError, match="changed during encode_columns"):
            _core.encode_columns(values, keys, ts, records_per_batch=8, order=order)


def test_unchanged_columns_encode_with_the_hook_set(split):
    values, keys, ts = _columns()
    calls = []
    with calling_between_passes(lambda: calls.append(1)):
        res = _core.encode_columns(values, keys, ts, records_per_batch=8)
    assert calls == [1]
    assert [rec_tuple(r)[:5] for r in _core.decode_records(res.data)] == [
        (i, int(ts[i]), 0, keys[i], values[i]) for i in range(len(ts))]


def test_order_cannot_pick_a_row_whose_offsets_point_outside_the_data():
    """With ``order``, unpicked rows are never looked at: the column's first and last offsets
    bound nothing, so every picked row is checked against the data's length."""
    data = np.frombuffer(b"abcde", dtype=np.uint8).copy()
    values = BinaryColumn(data, np.array([0, 100_000, 5], dtype=np.int64),
                          np.array([True, True]))
    with pytest.raises(InvalidRecordError, match="point outside the data"):
        _core.encode_columns(values, None, 0, order=[0])
    keys = BinaryColumn(data, np.array([0, 5, -3], dtype=np.int64), np.array([True, True]))
    with pytest.raises(InvalidRecordError, match="point outside the data"):
        _core.encode_columns(BinaryColumn.from_pylist([b"a", b"b"]), keys, 0, order=[1])
