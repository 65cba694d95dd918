"""Streamed column output (_stream_out.pxi), forced onto small logs.

Column decodes whose output outgrows the caches write it through per-array staging buffers and
non-temporal stores: short keys and values are staged in 32-byte steps (reading a little past
their end, never past the record region), long ones in whole lines straight from the source, and
the partial lines at each stream's ends with plain stores. Each test compares the streamed
columns with the plain-store decode of the same bytes and with the object decoder, over lengths
on both sides of every step (32-byte copies, the 256-byte short limit, the 320-byte slack, the
1 KiB stage, the 32-record chunk of fixed-width fields).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import (batch_spans, check_columns, columns_tuples, guarded_copy, rec_tuple,
                      run_in_child)
from segstore import _core

# Lengths next to each threshold of the stream writer.
EDGE_LENGTHS = [0, 1, 31, 32, 33, 63, 64, 65, 255, 256, 257, 319, 320, 321, 959, 960, 1023,
                1024, 1025, 4095, 4096, 4097, 20_000]

MODES = {
    "one thread": (1 << 62, 0.0),
    "two threads": (0, 0.0),
    "one-pass tail": (0, 0.4),
    "all tail": (0, 0.99),
    "predicted": (0, 0.0),   # runs of like batches placed by predicted sizes
}


@pytest.fixture(params=list(MODES))
def mode(request):
    min_bytes, share = MODES[request.param]
    old = (_core._set_parallel_min_bytes(min_bytes), _core._set_tail_share(share),
           _core._set_stream_min_bytes(1 << 62),
           _core._set_predict_sizes(request.param == "predicted"))
    yield request.param
    _core._set_parallel_min_bytes(old[0])
    _core._set_tail_share(old[1])
    _core._set_stream_min_bytes(old[2])
    _core._set_predict_sizes(old[3])


def _decode_both(buf, **kw):
    """(plain-store columns, streamed columns) of one decode."""
    _core._set_stream_min_bytes(1 << 62)
    plain = _core.decode_columns(buf, **kw)
    _core._set_stream_min_bytes(0)
    try:
        streamed = _core.decode_columns(buf, **kw)
    finally:
        _core._set_stream_min_bytes(1 << 62)
    return plain, streamed


def _assert_same(a, b):
    check_columns(a)
    check_columns(b)
    for x, y in [(a.offsets, b.offsets), (a.timestamps_ms, b.timestamps_ms),
                 (a.timestamp_types, b.timestamp_types)]:
        assert np.array_equal(x, y)
    for ca, cb in [(a.keys, b.keys), (a.values, b.values)]:
        assert np.array_equal(ca.offsets, cb.offsets)
        assert np.array_equal(ca.valid, cb.valid)
        assert ca.data.tobytes() == cb.data.tobytes()


def _log(lengths, key_lengths=None, per_batch=7, seed=0) -> bytes:
    """Batches of records with the given value lengths (None: a null value)."""
    rng = np.random.default_rng(seed)
    key_lengths = key_lengths or [int(rng.integers(0, 40)) for _ in lengths]
    parts, base = [], 0
    for i in range(0, len(lengths), per_batch):
        vl, kl = lengths[i:i + per_batch], key_lengths[i:i + per_batch]
        values = [None if n is None else rng.bytes(n) for n in vl]
        keys = [None if n is None else rng.bytes(n) for n in kl]
        parts.append(_core.encode_batch(values, keys, None,
                                        [1_000 + base + j for j in range(len(vl))],
                                        base_offset=base))
        base += len(vl)
    return b"".join(parts)


@pytest.mark.parametrize("per_batch", [1, 5, 33])
def test_every_length_edge_streams_like_plain_stores(mode, per_batch):
    lengths = EDGE_LENGTHS * 3 + [None, 0, None]
    keys = [n if n is None else n % 300 for n in reversed(lengths)]
    buf = _log(lengths, keys, per_batch)
    plain, streamed = _decode_both(buf)
    _assert_same(plain, streamed)
    assert columns_tuples(streamed, False) == [rec_tuple(r)[:5] + (None,)
                                               for r in _core.decode_records(buf)]


@pytest.mark.parametrize("n", [1, 31, 32, 33, 64, 65, 1000])
def test_record_counts_around_the_fixed_width_chunk(mode, n):
    """The fixed-width fields go out 32 records at a time; counts around that step, split
    over threads at batch boundaries that fall anywhere in a chunk."""
    buf = _log([(i * 37) % 150 for i in range(n)], per_batch=3)
    plain, streamed = _decode_both(buf)
    _assert_same(plain, streamed)
    assert len(streamed) == n


def test_offset_bounds_and_multi_source_decodes_stream_too(mode):
    buf = _log([(i * 53) % 700 for i in range(200)], per_batch=9)
    for lo, hi in [(0, 200), (13, 150), (101, 102)]:
        plain, streamed = _decode_both(buf, min_offset=lo, end_offset=hi)
        _assert_same(plain, streamed)
        assert list(streamed.offsets) == list(range(lo, hi))
    half = batch_spans(buf)[11][0]
    sources = [(buf, 0, half, "a.log"), (buf, half, len(buf), "b.log")]
    _core._set_stream_min_bytes(0)
    try:
        multi = _core.decode_columns_multi(sources)
    finally:
        _core._set_stream_min_bytes(1 << 62)
    plain, _ = _decode_both(buf)
    _assert_same(plain, multi)


def _guarded_decode():
    """Child process: a log whose last record ends one byte (its header count) before an
    inaccessible page, values of every short length; the 32-byte staged copies must not read
    past the record region."""
    _core._set_stream_min_bytes(0)
    for name, (min_bytes, share) in MODES.items():
        _core._set_parallel_min_bytes(min_bytes)
        _core._set_tail_share(share)
        _core._set_predict_sizes(name == "predicted")
        for last in range(0, 70):
            buf = _log([5, 200, 31, last], [3, 0, 17, last % 20], per_batch=2, seed=last)
            cols = _core.decode_columns(guarded_copy(buf))
            assert cols.values.data[cols.values.offsets[-2]:].tobytes() == \
                _core.decode_records(buf)[-1].value


def test_staged_copies_never_read_past_the_buffer():
    proc = run_in_child(__file__, "_guarded_decode")
    assert proc.returncode == 0, proc.stderr[-3000:]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.one_of(st.none(), st.integers(0, 1500)), min_size=1, max_size=120),
       per_batch=st.integers(1, 40), seed=st.integers(0, 1000))
def test_random_lengths_stream_like_plain_stores(mode, lengths, per_batch, seed):
    buf = _log(lengths, per_batch=per_batch, seed=seed)
    plain, streamed = _decode_both(buf)
    _assert_same(plain, streamed)


def test_pooled_arrays_stream_and_fresh_ones_do_not_change_the_result(mode):
    """Arrays of 64 KiB or more come from the buffer pool; the first decode gets fresh memory
    (plain stores), the next ones reuse it (streamed): every one decodes the same."""
    buf = _log([(i * 97) % 400 for i in range(6000)], per_batch=50)
    plain, _ = _decode_both(buf)
    _core._set_stream_min_bytes(0)
    try:
        for _ in range(3):
            _assert_same(plain, _core.decode_columns(buf))
    finally:
        _core._set_stream_min_bytes(1 << 62)
