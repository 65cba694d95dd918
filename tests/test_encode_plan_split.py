"""encode_columns' plan shared by two threads, forced onto small inputs: always the one-thread plan.

A long plan is split at k, a multiple of records_per_batch near the middle: the second thread
plans from k as if a batch started there. That is the one-thread plan's rest only when every
batch before k holds exactly records_per_batch records; when max_batch_bytes cut one short, the
rest is planned again. Here the split threshold is lowered to 0 so both cases run on small,
varied columns, and the oracle is the same encode with the split off (the one-thread plan,
itself checked against kafka-python by the codec tests). Bad rows must raise the error the
first bad row in record order gives, whichever thread meets it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segstore import _core
from segstore.columns import BinaryColumn
from segstore.errors import InvalidArgumentError, InvalidRecordError

NEVER = 1 << 62


@pytest.fixture
def split_plan():
    """Every plan of at least one full batch before its middle is split (and the write too)."""
    old = _core._set_plan_split_min_records(0), _core._set_parallel_min_bytes(0)
    yield
    _core._set_plan_split_min_records(old[0])
    _core._set_parallel_min_bytes(old[1])


def _column(lengths, valid=None, rng=None) -> BinaryColumn:
    """A column of cells of these lengths (random bytes with ``rng``, else a byte pattern)."""
    n = len(lengths)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    size = int(offsets[-1])
    data = (rng.integers(0, 256, size, dtype=np.uint8) if rng is not None
            else (np.arange(size) % 251).astype(np.uint8))
    return BinaryColumn(data, offsets, np.ones(n, dtype=np.bool_) if valid is None else valid)


def _columns(rng, n: int, max_len: int):
    """Values and keys with nulls and empty cells, lengths in [0, max_len]."""
    def col(null_share):
        lengths = rng.integers(0, max_len + 1, n)
        valid = rng.random(n) >= null_share
        lengths[~valid] = 0
        return _column(lengths, valid, rng)
    return col(0.1), col(0.2)


def _encode(values, keys, split: bool, **kw):
    old = _core._set_plan_split_min_records(0 if split else NEVER)
    try:
        enc = _core.encode_columns(values, keys, **kw)
    finally:
        _core._set_plan_split_min_records(old)
    return bytes(enc.data), enc.batches


def _assert_same(values, keys, **kw):
    data, table = _encode(values, keys, True, **kw)
    ref_data, ref_table = _encode(values, keys, False, **kw)
    assert table.tolist() == ref_table.tolist()
    assert data == ref_data
    return table


@pytest.mark.usefixtures("split_plan")
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), per_batch=st.integers(1, 40),
       max_len=st.sampled_from([0, 5, 60, 400]),
       max_batch_bytes=st.sampled_from([1 << 20, 2_000, 700, 0]),
       ordered=st.booleans(), varied_ts=st.booleans())
def test_split_plan_gives_the_one_thread_plan(seed, n, per_batch, max_len, max_batch_bytes,
                                              ordered, varied_ts):
    rng = np.random.default_rng(seed)
    values, keys = _columns(rng, n, max_len)
    order = rng.permutation(n)[:int(rng.integers(1, n + 1))] if ordered else None
    ts = (rng.integers(0, 10_000, n) + 1_600_000_000_000) if varied_ts else 1_600_000_000_000
    _assert_same(values, keys, timestamps_ms=ts, records_per_batch=per_batch,
                 max_batch_bytes=max_batch_bytes, order=order)


@pytest.mark.usefixtures("split_plan")
@pytest.mark.parametrize("cut", ["none", "head", "tail", "both"])
def test_batches_cut_by_bytes_before_and_after_the_split(cut):
    """Records of 100 bytes, 10 per batch, 2,000 records (split at 1,000): one 5,000-byte
    value before and/or after the split cuts its batch short by max_batch_bytes."""
    n = 2_000
    lengths = np.full(n, 100)
    if cut in ("head", "both"):
        lengths[333] = 5_000
    if cut in ("tail", "both"):
        lengths[1_555] = 5_000
    values = _column(lengths)
    table = _assert_same(values, None, timestamps_ms=5, records_per_batch=10,
                         max_batch_bytes=3_000)
    counts = table["records_count"].tolist()
    assert sum(counts) == n
    # Each cut adds a batch (and one in the head moves every later batch's start).
    assert (len(counts) == n // 10) == (cut == "none")
    decoded = _core.decode_columns(
        _encode(values, None, True, timestamps_ms=5, records_per_batch=10,
                max_batch_bytes=3_000)[0])
    assert decoded.offsets.tolist() == list(range(n))
    assert decoded.values.lengths.tolist() == lengths.tolist()


@pytest.mark.usefixtures("split_plan")
@pytest.mark.parametrize("where", [3, 150, 299])
def test_bad_order_row_raises_in_either_part(where):
    values, keys = _columns(np.random.default_rng(1), 300, 20)
    order = np.arange(300)
    order[where] = 300
    with pytest.raises(InvalidArgumentError, match="outside"):
        _core.encode_columns(values, keys, 0, records_per_batch=7, order=order)


@pytest.mark.usefixtures("split_plan")
def test_first_bad_row_in_record_order_is_the_one_reported():
    """A bad order row in the second part and a bad span in the first: the first part's
    error (the first bad record) is raised, not the other thread's."""
    values, keys = _columns(np.random.default_rng(2), 300, 20)
    offsets = values.offsets.copy()
    offsets[10] = offsets[11] + 1          # row 10 ends before it starts
    bad = BinaryColumn(values.data, offsets, values.valid)
    order = np.arange(300)
    order[250] = -1
    with pytest.raises(InvalidRecordError, match="offsets"):
        _core.encode_columns(bad, keys, 0, records_per_batch=7, order=order)
    order[5] = -1                          # now a bad order row comes first
    with pytest.raises(InvalidArgumentError, match="outside"):
        _core.encode_columns(bad, keys, 0, records_per_batch=7, order=order)


@pytest.mark.parametrize("parallel_min, expected", [(NEVER, 0), (0, 2)])
def test_plan_is_split_only_when_the_write_is(monkeypatch, parallel_min, expected):
    """Below the write's two-thread threshold the caller may be using the other core
    (append_columns encodes a chunk while it writes the last one): no thread is asked for."""
    real, calls = _core._second_core, []

    def spy(fn, *args):
        calls.append(fn.__name__)
        return real(fn, *args)

    monkeypatch.setattr(_core, "_second_core", spy)
    old = _core._set_plan_split_min_records(0), _core._set_parallel_min_bytes(parallel_min)
    try:
        values, keys = _columns(np.random.default_rng(3), 1_000, 50)
        _core.encode_columns(values, keys, 0, records_per_batch=10)
    finally:
        _core._set_plan_split_min_records(old[0])
        _core._set_parallel_min_bytes(old[1])
    assert len(calls) == expected
    if expected:
        assert calls == ["plan_tail", "write"]


@pytest.mark.usefixtures("split_plan")
@pytest.mark.parametrize("n, per_batch, max_batch_bytes, big_at", [
    (2, 1, 0, None),          # k = 1: one record per batch on either side
    (2, 1, 1 << 20, None),
    (8, 4, 1 << 20, None),    # n = 2 * per_batch: k = per_batch
    (9, 4, 1 << 20, None),    # one record past it
    (200, 10, 0, None),       # max_batch_bytes 0: every batch holds one record
    (200, 10, 1_500, 99),     # a record over max_batch_bytes just before k = 100
    (200, 10, 1_500, 100),    # ... and at k
    (200, 10, 1_500, 101),
])
def test_split_edge_cases(n, per_batch, max_batch_bytes, big_at):
    lengths = np.full(n, 50)
    if big_at is not None:
        lengths[big_at] = 2_000
    values = _column(lengths)
    keys = BinaryColumn.from_fixed(np.arange(n, dtype=">u4").view(np.uint8).reshape(n, 4))
    table = _assert_same(values, keys, timestamps_ms=np.arange(n) * 3, records_per_batch=per_batch,
                         max_batch_bytes=max_batch_bytes)
    assert sum(table["records_count"].tolist()) == n


@pytest.mark.usefixtures("split_plan")
def test_order_with_repeated_rows_longer_than_the_columns():
    values, keys = _columns(np.random.default_rng(4), 50, 30)
    order = np.random.default_rng(5).integers(0, 50, 400)
    _assert_same(values, keys, timestamps_ms=7, records_per_batch=9, max_batch_bytes=900,
                 order=order)
