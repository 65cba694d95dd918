"""The buffer pool: large column arrays come from kept blocks, never from one still in use.

The oracle is the encoder's input columns: every decode, pooled or not, must return exactly
them, however blocks are reused, evicted or released while other arrays stay alive.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

import segstore
from segstore import _core, buffer_pool
from segstore.columns import BinaryColumn
from segstore.errors import InvalidConfigError

N = 100_000         # 10 MB of values and 1.6 MB of keys are pooled; 800 KB columns are not
KEY, VALUE = 16, 100


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n, KEY), dtype=np.uint8)
    values = rng.integers(0, 256, (n, VALUE), dtype=np.uint8)
    ts = 1_700_000_000_000 + np.arange(n, dtype=np.int64)
    buf = bytes(_core.encode_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys),
                               ts, records_per_batch=1000).data)
    buffer_pool.release()   # the encoder's own pooled output block: tests count from empty
    return buf, keys, values, ts


def _check(cols, keys, values, ts):
    n = len(ts)
    assert cols.offsets.tolist() == list(range(n))
    assert np.array_equal(cols.timestamps_ms, ts)
    assert np.array_equal(cols.keys.data.reshape(n, KEY), keys)
    assert np.array_equal(cols.values.data.reshape(n, VALUE), values)
    assert cols.values.offsets[-1] == n * VALUE


def _pooled(arr) -> bool:
    """Whether an array's memory belongs to a pooled block (through views and memoryviews)."""
    base = arr
    while base is not None:
        if isinstance(base, _core.PooledBuffer):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


pytestmark = pytest.mark.usefixtures("fresh_buffer_pool")


def test_second_decode_reuses_the_freed_blocks():
    buf, keys, values, ts = _data()
    start = buffer_pool.stats()                            # the counts are the process's
    cols = _core.decode_columns(buf)
    _check(cols, keys, values, ts)
    assert _pooled(cols.values.data) and _pooled(cols.keys.data)
    first = buffer_pool.stats()
    assert first.misses - start.misses >= 2 and first.in_use_bytes >= N * (KEY + VALUE)
    del cols
    freed = buffer_pool.stats()
    assert freed.in_use_bytes == first.in_use_bytes - freed.free_bytes == 0
    assert freed.free_blocks == first.misses - start.misses  # every block was kept
    cols = _core.decode_columns(buf)
    _check(cols, keys, values, ts)
    again = buffer_pool.stats()
    assert again.misses == first.misses                    # nothing new was mapped
    assert again.hits - first.hits == freed.free_blocks    # every kept block was reused
    assert again.free_bytes == 0


def test_live_arrays_are_never_handed_out_again():
    buf_a, keys_a, values_a, ts_a = _data(seed=1)
    buf_b, keys_b, values_b, ts_b = _data(seed=2)
    a = _core.decode_columns(buf_a)
    values_view = a.values.data[:1000]          # a slice keeps the whole block alive
    keep = values_view.copy()
    del a
    b = _core.decode_columns(buf_b)
    c = _core.decode_columns(buf_b)
    _check(b, keys_b, values_b, ts_b)
    _check(c, keys_b, values_b, ts_b)
    assert np.array_equal(values_view, keep)
    # Writing into one result never shows through another.
    b.values.data[:] = 0
    _check(c, keys_b, values_b, ts_b)


def test_arrow_buffers_keep_their_block():
    buf, keys, values, ts = _data(seed=3)
    cols = _core.decode_columns(buf)
    arrow = pa.py_buffer(cols.values.data)
    expected = bytes(arrow)
    del cols
    for _ in range(3):
        _core.decode_columns(_data(seed=4)[0])
    assert bytes(arrow) == expected


def test_pickled_arrays_are_plain_copies():
    buf, keys, values, ts = _data(seed=5)
    cols = _core.decode_columns(buf)
    back = pickle.loads(pickle.dumps(cols.values.data))
    del cols
    _core.decode_columns(_data(seed=6)[0])
    assert np.array_equal(back.reshape(N, VALUE), values)


def test_limit_zero_turns_pooling_off_and_unmaps_kept_blocks():
    buf, keys, values, ts = _data()
    del_me = _core.decode_columns(buf)
    del del_me
    assert buffer_pool.stats().free_bytes > 0
    assert buffer_pool.set_limit(0) == buffer_pool.DEFAULT_LIMIT
    assert buffer_pool.stats().free_bytes == 0
    before = buffer_pool.stats()
    cols = _core.decode_columns(buf)
    _check(cols, keys, values, ts)
    assert buffer_pool.stats().misses == before.misses  # plain numpy arrays
    assert not _pooled(cols.values.data)


def test_the_pool_keeps_at_most_its_limit():
    buf, keys, values, ts = _data()
    cols = [_core.decode_columns(buf) for _ in range(4)]
    in_use = buffer_pool.stats().in_use_bytes
    buffer_pool.set_limit(in_use // 3)
    del cols
    stats = buffer_pool.stats()
    assert 0 < stats.free_bytes <= in_use // 3
    assert stats.in_use_bytes == 0
    assert buffer_pool.release() == stats.free_bytes
    assert buffer_pool.stats().free_bytes == 0


def test_release_leaves_arrays_in_use_alone():
    buf, keys, values, ts = _data()
    cols = _core.decode_columns(buf)
    buffer_pool.release()
    _check(cols, keys, values, ts)
    assert buffer_pool.stats().in_use_bytes > 0


def test_concurrent_decodes_and_frees_stay_exact():
    datasets = [_data(n=20_000 + 5_000 * i, seed=10 + i) for i in range(4)]
    errors = []

    def work(i):
        try:
            for round_ in range(6):
                buf, keys, values, ts = datasets[(i + round_) % len(datasets)]
                _check(_core.decode_columns(buf), keys, values, ts)
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert buffer_pool.stats().in_use_bytes == 0


def test_read_columns_uses_the_pool(tmp_path):
    buf, keys, values, ts = _data(seed=7)
    with segstore.open(tmp_path / "store") as store:
        store.create_topic("t", 1)
        log = store.partition("t", 0)
        log.append_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys),
                           timestamps_ms=ts)
        _check(log.read_columns(), keys, values, ts)
        before = buffer_pool.stats()
        _check(log.read_columns(), keys, values, ts)
        assert buffer_pool.stats().hits > before.hits


@pytest.mark.parametrize("bad", [-1, 1.5, "1", True, 1 << 63, 1 << 64])
def test_set_limit_rejects_bad_values(bad):
    with pytest.raises((TypeError, ValueError)):
        buffer_pool.set_limit(bad)


def test_limit_from_the_environment():
    assert buffer_pool._limit_from_env({}) == buffer_pool.DEFAULT_LIMIT
    assert buffer_pool._limit_from_env({buffer_pool.ENV_LIMIT: " 0 "}) == 0
    assert buffer_pool._limit_from_env({buffer_pool.ENV_LIMIT: "1048576"}) == 1 << 20
    for bad in ("-5", "lots", "1e9", str(1 << 63), str(1 << 64)):
        with pytest.raises(InvalidConfigError, match=buffer_pool.ENV_LIMIT):
            buffer_pool._limit_from_env({buffer_pool.ENV_LIMIT: bad})


def test_environment_limit_applies_at_import():
    env = dict(os.environ, **{buffer_pool.ENV_LIMIT: "12345"})
    out = subprocess.run([sys.executable, "-c",
                          "from segstore import buffer_pool; print(buffer_pool.limit())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "12345"


def test_header_columns_come_from_the_pool_too():
    rng = np.random.default_rng(8)
    n = 24_000   # 16,000 header values of 100 bytes: 1.6 MB, pooled
    values = [rng.bytes(8) for _ in range(n)]
    headers = [[("trace", rng.bytes(100)), ("empty", None)] if i % 3 else [] for i in range(n)]
    buf = b"".join(
        _core.encode_batch(values[lo:lo + 1000], headers=headers[lo:lo + 1000], base_offset=lo)
        for lo in range(0, n, 1000))
    expected = [list(r.headers) for r in _core.decode_records(buf)]
    for _ in range(2):
        before = buffer_pool.stats()
        cols = _core.decode_columns(buf, include_headers=True)
        assert cols.headers.to_pylist() == expected
        after = buffer_pool.stats()
        assert after.hits + after.misses > before.hits + before.misses  # header values pooled
        del cols
    assert buffer_pool.stats().hits > 0


def test_encoder_output_comes_from_the_pool_read_only():
    rng = np.random.default_rng(21)
    values = rng.integers(0, 256, (N, VALUE), dtype=np.uint8)
    ts = np.arange(N, dtype=np.int64)
    col = BinaryColumn.from_fixed(values)
    buffer_pool.release()
    first = _core.encode_columns(col, None, ts, records_per_batch=1000)
    assert isinstance(first.data, memoryview) and first.data.readonly
    with pytest.raises(TypeError):
        first.data[0] = 1
    expected = bytes(first.data)
    stats = buffer_pool.stats()
    assert stats.in_use_bytes >= len(expected) and stats.misses >= 1
    del first
    assert buffer_pool.stats().free_bytes >= len(expected)   # the block was kept...
    again = _core.encode_columns(col, None, ts, records_per_batch=1000)
    assert buffer_pool.stats().hits == stats.hits + 1        # ...and the next encode reused it
    assert again.data == expected
    cols = _core.decode_columns(again.data)
    assert np.array_equal(cols.values.data.reshape(N, VALUE), values)
    # A view of the output keeps the block alive after the result is gone.
    view = again.data[100:200]
    del again, cols
    assert bytes(view) == expected[100:200]


def test_small_encoder_output_is_plain_memory():
    before = buffer_pool.stats()   # whatever other tests still hold: only the change counts
    enc = _core.encode_columns(BinaryColumn.from_fixed(np.zeros((10, 4), dtype=np.uint8)), None, 5)
    after = buffer_pool.stats()
    assert isinstance(enc.data, memoryview) and isinstance(enc.data.obj, bytes)
    assert (after.in_use_bytes, after.hits + after.misses) == \
        (before.in_use_bytes, before.hits + before.misses)


def test_encoder_output_outlives_its_memoryview_while_anything_reads_it():
    """A caller may release() the returned memoryview (or leave a ``with`` block over it):
    numpy arrays, Arrow buffers and slices taken from it keep the pooled block, so the next
    encode never writes under them."""
    def encode(fill):
        values = np.full((20_000, VALUE), fill, dtype=np.uint8)
        return _core.encode_columns(BinaryColumn.from_fixed(values), None,
                                    np.arange(20_000, dtype=np.int64))

    buffer_pool.release()
    enc = encode(1)
    expected = bytes(enc.data)
    with enc.data as view:
        arr = np.frombuffer(view, dtype=np.uint8)
        arrow = pa.py_buffer(view[:1000])
        tail = view[-1000:]
    enc.data.release()
    del enc, view
    assert buffer_pool.stats().free_blocks == 0   # still viewed: not back in the pool
    others = [encode(2) for _ in range(3)]
    assert arr.tobytes() == expected
    assert arrow.to_pybytes() == expected[:1000] and bytes(tail) == expected[-1000:]
    assert all(bytes(o.data) != expected for o in others)
    del arr, arrow, tail
    assert buffer_pool.stats().free_blocks == 1   # the last reader gone: the block is kept
