"""Adversarial tests of the buffer pool (review of 07b0ca4 and 1727990).

A pooled block is reused by the next decode as soon as its PooledBuffer dies, so anything that
lets the PooledBuffer die (or be duplicated) while memory of the block is still used is a
use-after-free that shows up as another read's data, or a crash. The crash-prone cases run in a
child interpreter so a failure cannot take the test run down.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from segstore import _core, buffer_pool
from segstore.columns import BinaryColumn

N = 20_000          # 2 MB of values: pooled
VALUE = 100
PARALLEL_DEFAULT = 8 << 20


def _encoded(fill: int, n: int = N) -> bytes:
    values = np.full((n, VALUE), fill, dtype=np.uint8)
    return bytes(_core.encode_columns(BinaryColumn.from_fixed(values), None,
                                np.arange(n, dtype=np.int64), records_per_batch=500).data)


def _pooled_buffer(arr):
    """The PooledBuffer under a pooled array (whatever object numpy keeps as its base)."""
    base = arr.base
    return base.obj if isinstance(base, memoryview) else base


@pytest.fixture(autouse=True)
def fresh_pool(fresh_buffer_pool):
    yield
    _core._set_parallel_min_bytes(PARALLEL_DEFAULT)


def _run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))


# -- PooledBuffer objects must not be duplicated -------------------------------------------------

def test_pooled_buffers_cannot_be_pickled_or_copied():
    """Cython's automatic pickling turned the block pointer into bytes (a C string: strlen on
    NULL crashed, on a live block it read to the first zero byte) and unpickled it as a
    pointer into a temporary bytes object, which the copy's deallocator then put in the free
    list (to be written by the next decode) and subtracted from in_use_bytes a second time."""
    out = _run_child("""
        import copy, pickle
        import numpy as np
        from segstore import _core, buffer_pool
        from segstore.columns import BinaryColumn
        values = np.full((20000, 100), 7, dtype=np.uint8)
        buf = bytes(_core.encode_columns(BinaryColumn.from_fixed(values), None,
                                   np.arange(20000, dtype=np.int64)).data)
        cols = _core.decode_columns(buf)
        base = cols.values.data.base
        pb = base.obj if isinstance(base, memoryview) else base
        for what, dup in [("pickle", lambda o: pickle.loads(pickle.dumps(o))),
                          ("copy", copy.copy), ("deepcopy", copy.deepcopy)]:
            for obj in (pb, _core.PooledBuffer()):
                try:
                    dup(obj)
                except TypeError:
                    continue
                print("duplicated by", what)
        assert buffer_pool.stats().in_use_bytes > 0
        del cols, base, pb
        s = buffer_pool.stats()
        assert s.in_use_bytes == 0, s
        print("ok")
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok"], out.stdout


# -- nothing but the PooledBuffer's death returns a block ----------------------------------------

def test_releasing_the_array_base_does_not_free_the_block():
    """np.frombuffer made a memoryview the array's base; memoryview.release() on it dropped the
    last reference to the PooledBuffer while the array still pointed into its block, so the
    next decode wrote into the array (and an eviction unmapped it under the array)."""
    out = _run_child("""
        import numpy as np
        from segstore import _core, buffer_pool
        from segstore.columns import BinaryColumn
        def enc(fill):
            values = np.full((20000, 100), fill, dtype=np.uint8)
            return bytes(_core.encode_columns(BinaryColumn.from_fixed(values), None,
                                        np.arange(20000, dtype=np.int64)).data)
        arr = _core.decode_columns(enc(7)).values.data
        base = arr.base
        if hasattr(base, "release"):
            base.release()
        del base
        other = _core.decode_columns(enc(9))
        assert (arr == 7).all(), "the array's block was handed to another decode"
        del other
        buffer_pool.release()
        assert (arr == 7).all()
        print("ok")
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok"], out.stdout


@pytest.mark.parametrize("how", ["slice", "view", "asarray", "memoryview", "arrow", "reshape",
                                 "strided", "np_array_nocopy", "from_buffers"])
def test_every_derived_view_keeps_its_block(how):
    """Derived views and exports hold the block after the columns and the array are gone."""
    cols = _core.decode_columns(_encoded(7))
    arr = cols.values.data
    derive = {
        "slice": lambda a: a[10:],
        "view": lambda a: a.view(np.int8),
        "asarray": lambda a: np.asarray(a),
        "memoryview": lambda a: memoryview(a),
        "arrow": lambda a: pa.py_buffer(a),
        "reshape": lambda a: a.reshape(N, VALUE),
        "strided": lambda a: a[::3],
        "np_array_nocopy": lambda a: np.array(a, copy=False),
        "from_buffers": lambda a: pa.Array.from_buffers(pa.uint8(), len(a), [None, pa.py_buffer(a)]),
    }[how]
    derived = derive(arr)
    del cols, arr
    gc.collect()
    assert buffer_pool.stats().in_use_bytes > 0
    other = [_core.decode_columns(_encoded(9)) for _ in range(2)]
    buffer_pool.release()
    data = np.asarray(derived.to_numpy(zero_copy_only=True) if how == "from_buffers"
                      else memoryview(derived) if how == "arrow" else derived)
    assert (data.view(np.uint8) == 7).all()
    del other
    del derived, data
    gc.collect()
    assert buffer_pool.stats().in_use_bytes == 0


def test_accounting_is_exact_through_many_reuses():
    """in_use_bytes and free_bytes add up to what was mapped and kept, always."""
    bufs = [_encoded(i, n=N + 3000 * i) for i in range(4)]
    live = []
    rng = np.random.default_rng(0)
    for _ in range(40):
        if live and rng.random() < 0.5:
            live.pop(int(rng.integers(len(live))))
        else:
            live.append(_core.decode_columns(bufs[int(rng.integers(4))]))
        s = buffer_pool.stats()
        pooled = {id(_pooled_buffer(a)): _pooled_buffer(a) for c in live
                  for a in (c.values.data, c.offsets, c.timestamps_ms, c.values.offsets)
                  if a.base is not None}
        # every pooled block is a whole number of pages and counted once
        assert s.in_use_bytes % _core_page() == 0
        assert s.in_use_bytes >= sum(memoryview(pb).nbytes for pb in pooled.values())
        assert s.free_bytes <= s.limit_bytes and s.free_blocks <= 64
        del pooled
    live.clear()
    s = buffer_pool.stats()
    assert s.in_use_bytes == 0
    assert buffer_pool.release() == s.free_bytes
    assert buffer_pool.stats().free_bytes == 0 and buffer_pool.stats().free_blocks == 0


def _core_page() -> int:
    import mmap
    return mmap.PAGESIZE


def test_huge_limits_are_accepted_or_refused_cleanly():
    assert buffer_pool.set_limit((1 << 63) - 1) == buffer_pool.DEFAULT_LIMIT
    cols = _core.decode_columns(_encoded(3))
    assert (cols.values.data == 3).all()
    del cols
    with pytest.raises((OverflowError, ValueError)):
        buffer_pool.set_limit(1 << 64)
    assert buffer_pool.limit() == (1 << 63) - 1


def test_lowering_the_limit_below_a_live_block_unmaps_it_at_release():
    cols = _core.decode_columns(_encoded(5))
    in_use = buffer_pool.stats().in_use_bytes
    buffer_pool.set_limit(1)
    del cols
    s = buffer_pool.stats()
    assert s.free_bytes == 0 and s.free_blocks == 0 and s.in_use_bytes == 0, (s, in_use)


# -- fork -----------------------------------------------------------------------------------------

def test_a_forked_child_decodes_with_two_threads():
    """The second decode thread does not exist in a forked child, but the executor object that
    ran it does: the child's first parallel decode (>= 8 MB, two or more batches) queued its
    half behind a thread that would never take it, and waited forever. (multiprocessing
    forks by default on Linux up to Python 3.13.)"""
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    buf = _encoded(4, n=100_000)   # 10 MB: a two-thread decode
    cols = _core.decode_columns(buf)   # the parent starts its decode thread
    assert (cols.values.data == 4).all()
    kept = buffer_pool.stats()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            # The inherited blocks: the live one still holds the parent's data, and a new
            # decode in the child (pooled or not) is right.
            again = _core.decode_columns(buf)
            code = 0 if ((again.values.data == 4).all() and (cols.values.data == 4).all()
                         and buffer_pool.stats().in_use_bytes >= kept.in_use_bytes) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's column decode hung")
        time.sleep(0.02)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's pool is untouched by what the child did.
    assert buffer_pool.stats().in_use_bytes == kept.in_use_bytes
    assert (cols.values.data == 4).all()


# -- an interrupted two-thread decode ------------------------------------------------------------

class _Interrupted:
    """A future whose result() is interrupted (as Ctrl-C interrupts a wait) before the work
    finishes."""

    def __init__(self, fut):
        self.fut = fut

    def result(self):
        raise KeyboardInterrupt


def _late_second_core(names, gate, futures):
    """A stand-in for ``_core._second_core``: kernels named in ``names`` run on the real second
    thread only once ``gate`` is set (their futures go to ``futures``), and the caller's wait
    for them is interrupted at once (KeyboardInterrupt); anything else runs as usual."""
    real = _core._second_core

    def second_core(fn, *args):
        if getattr(fn, "__name__", "") not in names:
            return real(fn, *args)

        def late(*a):
            gate.wait(20)
            fn(*a)
        futures.append(real(late, *args))
        return _Interrupted(futures[-1])
    return second_core


def test_an_interrupted_decode_keeps_its_arrays_until_its_thread_is_done(monkeypatch):
    """When the wait for the second thread's fill is interrupted, the decode unwinds and drops
    its output arrays while that thread still writes into them through raw pointers: their
    blocks went back to the pool, the next decode got them, and the late writes landed in its
    result (or, for an evicted or unpooled block, in unmapped memory)."""
    old_min = _core._set_parallel_min_bytes(0)        # always two threads
    gate = threading.Event()
    futures = []
    real = _core._second_core
    second_core = _late_second_core(("fill", "fill_tail", "fill_back"), gate, futures)

    monkeypatch.setattr(_core, "_second_core", second_core)
    try:
        with pytest.raises(KeyboardInterrupt):
            _core.decode_columns(_encoded(7))
    finally:
        monkeypatch.setattr(_core, "_second_core", real)
    # The next decode runs on one thread (the decode thread is busy with the late fill).
    _core._set_parallel_min_bytes(1 << 62)
    try:
        other = _core.decode_columns(_encoded(9))
    finally:
        _core._set_parallel_min_bytes(old_min)
    gate.set()
    futures[0].result(timeout=20)
    assert (other.values.data == 9).all(), "a late write of the interrupted decode landed here"
    del other
    gc.collect()
    assert buffer_pool.stats().in_use_bytes == 0


def test_an_interrupted_encode_keeps_its_inputs_and_output_until_its_thread_is_done(monkeypatch):
    """The same for encode_columns: the late writer reads the columns' arrays through raw
    pointers and writes the pooled output block, so both must outlive the interrupted call
    even when the caller drops everything."""
    import weakref
    old_min = _core._set_parallel_min_bytes(0)        # always two threads
    gate = threading.Event()
    futures = []
    real = _core._second_core
    second_core = _late_second_core(("write",), gate, futures)

    values = np.full((N, VALUE), 5, dtype=np.uint8)
    col = BinaryColumn.from_fixed(values)
    data_ref = weakref.ref(col.data)
    monkeypatch.setattr(_core, "_second_core", second_core)
    try:
        with pytest.raises(KeyboardInterrupt):
            _core.encode_columns(col, None, np.arange(N, dtype=np.int64), records_per_batch=500)
    finally:
        monkeypatch.setattr(_core, "_second_core", real)
        _core._set_parallel_min_bytes(old_min)
    try:
        del col, values                                # the caller drops its columns ...
        gc.collect()
        assert data_ref() is not None                  # ... but the late writer still holds them
        assert buffer_pool.stats().in_use_bytes > 0    # and its output block is not free
    finally:
        gate.set()
        futures[0].result(timeout=20)
    futures.clear()
    gc.collect()
    assert data_ref() is None
    assert buffer_pool.stats().in_use_bytes == 0
