"""Shared test configuration: hypothesis profiles and a few byte-level helpers.

Profiles: ``ci`` (default; no deadline, modest example counts) and ``dev`` (many examples), chosen
with ``HYPOTHESIS_PROFILE=dev``. The helpers are deliberately independent of segstore: they walk
batch boundaries and describe records with ``struct`` alone, so tests never use the code under test
to compute their expectations.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import sys
import struct
import zlib

import crc32c as _crc32c_pkg
from hypothesis import HealthCheck, settings
import pytest

settings.register_profile(
    "ci", deadline=None, max_examples=40, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "dev", deadline=None, max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The 61-byte v2 header (REF §9): baseOffset, length, leaderEpoch, magic, crc, attributes,
# lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, count.
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
V2_FIELDS = ("base_offset", "length", "partition_leader_epoch", "magic", "crc", "attributes",
             "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id",
             "producer_epoch", "base_sequence", "records_count")


def batch_spans(buf) -> list[tuple[int, int]]:
    """``(position, size)`` of every complete batch, walking the int32 size fields (any magic)."""
    spans, pos, n = [], 0, len(buf)
    while n - pos >= 17:
        size = 12 + struct.unpack_from(">i", buf, pos + 8)[0]
        if pos + size > n:
            break
        spans.append((pos, size))
        pos += size
    return spans


def v2_header(buf, pos: int = 0) -> dict:
    """The v2 header at ``pos`` as a dict keyed like segstore's BATCH_DTYPE fields."""
    return dict(zip(V2_FIELDS, V2_HEADER.unpack_from(buf, pos)))


def cut_unflushed_tail(src_log: str, dst_log: str, durable: int, keep: int, torn: int,
                       log_end: int, segment_base: int) -> int:
    """A power loss in a model test: truncate ``dst_log`` (a copy of the active segment
    ``src_log``) so that of the batches at or above ``durable`` (not yet fsynced) only the
    first ``keep`` survive, the next one torn ``torn`` quarters in. Returns the log end offset
    the cut leaves (``log_end`` when every batch survives)."""
    with open(src_log, "rb") as f:
        data = f.read()
    spans = batch_spans(data)
    heads = [v2_header(data, p) for p, _ in spans]
    unflushed = [i for i, h in enumerate(heads) if h["base_offset"] >= durable]
    if not unflushed:
        return log_end
    kept = unflushed[0] + min(keep, len(unflushed))
    length = sum(s for _, s in spans[:kept])
    if kept < len(spans) and torn:
        length += spans[kept][1] * torn // 4
    with open(dst_log, "r+b") as f:
        f.truncate(length)
    if kept == len(spans):
        return log_end
    return (heads[kept - 1]["base_offset"] + heads[kept - 1]["last_offset_delta"] + 1
            if kept else segment_base)


def fix_crc(buf: bytearray, pos: int = 0) -> None:
    """Recompute the CRC-32C of the v2 batch at ``pos`` in place (after a deliberate edit)."""
    size = 12 + struct.unpack_from(">i", buf, pos + 8)[0]
    struct.pack_into(">I", buf, pos + 17, _crc32c_pkg.crc32c(bytes(buf[pos + 21:pos + size])))


def rec_tuple(r) -> tuple:
    """A decoded ConsumerRecord as ``(offset, timestamp, timestamp_type, key, value, headers)``."""
    return (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, [tuple(h) for h in r.headers])


def columns_tuples(cols, with_headers: bool = True) -> list[tuple]:
    """RecordColumns as the same tuples as :func:`rec_tuple` (headers None when not decoded)."""
    n = len(cols)
    heads = cols.headers.to_pylist() if with_headers else [None] * n
    return list(zip(cols.offsets.tolist(), cols.timestamps_ms.tolist(),
                    cols.timestamp_types.tolist(), cols.keys.to_pylist(),
                    cols.values.to_pylist(), heads))


def check_columns(cols) -> None:
    """Structural invariants of a RecordColumns result (dtypes, shapes, Arrow offsets, nulls)."""
    import numpy as np
    from segstore.columns import BinaryColumn, HeaderColumn, RecordColumns

    def check_binary(col):
        assert isinstance(col, BinaryColumn)
        assert col.offsets.dtype == np.int64 and col.offsets.shape == (len(col) + 1,)
        assert col.valid.dtype == np.bool_ and col.data.dtype == np.uint8
        assert col.offsets[0] == 0 and bool(np.all(np.diff(col.offsets) >= 0))
        assert col.offsets[-1] <= len(col.data)
        assert not np.any(col.lengths[~col.valid]), "null slots must have length 0"

    assert isinstance(cols, RecordColumns)
    n = len(cols)
    assert cols.offsets.dtype == np.int64 and cols.offsets.shape == (n,)
    assert cols.timestamps_ms.dtype == np.int64 and cols.timestamps_ms.shape == (n,)
    assert cols.timestamp_types.dtype == np.int8 and cols.timestamp_types.shape == (n,)
    assert len(cols.keys) == n and len(cols.values) == n
    check_binary(cols.keys)
    check_binary(cols.values)
    if cols.headers is not None:
        assert isinstance(cols.headers, HeaderColumn) and len(cols.headers) == n
        check_binary(cols.headers.keys)
        check_binary(cols.headers.values)
        assert cols.headers.offsets[0] == 0 and cols.headers.offsets[-1] == len(cols.headers.keys)


def legacy_message(magic, offset, key, value, timestamp=None, attributes=0) -> bytes:
    """One v0/v1 log entry built by hand (REF §1.10):
    offset int64 | size int32 | crc uint32 (zlib, magic..end) | magic | attributes | [timestamp
    int64, v1 only] | key length int32 (-1 null) | key | value length int32 (-1 null) | value."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def legacy_wrapper(magic, inner_offsets, records, wrapper_offset, wrapper_ts=None, lat=False):
    """A gzip wrapper message (null key) whose value is the inner entries of ``(ts, key, value)``.

    Inner offsets are absolute for v0 and relative (0..n-1, gaps allowed) for v1; the wrapper's
    offset is the last inner absolute offset; a v1 wrapper's timestamp defaults to the max.
    """
    if magic == 1 and wrapper_ts is None:
        wrapper_ts = max(ts for ts, _, _ in records)
    inner = b"".join(legacy_message(magic, o, k, v, ts)
                     for o, (ts, k, v) in zip(inner_offsets, records))
    attributes = 1 | (0x08 if lat else 0)
    return legacy_message(magic, wrapper_offset, None, gzip.compress(inner, mtime=0), wrapper_ts,
                          attributes)


# Whether a map's MADV_HUGEPAGE shows ("hg" in its VmFlags): Linux with transparent huge pages.
HUGE_PAGE_ADVICE_SHOWS = (os.path.exists("/proc/self/smaps")
                          and os.path.isdir("/sys/kernel/mm/transparent_hugepage")
                          and hasattr(__import__("mmap"), "MADV_HUGEPAGE"))


def map_vm_flags(path) -> list:
    """VmFlags of each of this process's maps of the file at ``path`` (/proc/self/smaps)."""
    path = os.path.realpath(path)
    found, current = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's first line
                current = len(head) >= 6 and " ".join(head[5:]) == path
            elif head and head[0] == "VmFlags:" and current:
                found.append(head[1:])
    return found


def map_rss_kib(address: int) -> int:
    """Resident kB of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    import re
    with open("/proc/self/smaps") as f:
        text = f.read()
    for m in re.finditer(r"^([0-9a-f]+)-([0-9a-f]+) .*\n((?:[A-Z]\w*:.*\n)+)", text, re.M):
        if int(m.group(1), 16) <= address < int(m.group(2), 16):
            return int(re.search(r"^Rss:\s+(\d+) kB", m.group(3), re.M).group(1))
    raise AssertionError(f"no mapping holds {address:#x}")


def guarded_copy(data) -> memoryview:
    """``data`` (bytes-like) copied into anonymous memory that ends where an inaccessible page
    begins (Linux, through ctypes): code reading one byte past its end gets SIGSEGV, so a test
    using it runs in a child process (:func:`run_in_child`)."""
    import ctypes
    import mmap

    data = memoryview(data).cast("B")
    page = mmap.PAGESIZE
    npages = max(1, -(-data.nbytes // page))
    mm = mmap.mmap(-1, (npages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.mprotect(ctypes.c_void_p(base + npages * page), page, 0) != 0:  # PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect")
    start = npages * page - data.nbytes
    mm[start:start + data.nbytes] = data
    return memoryview(mm)[start:start + data.nbytes]


def run_in_child(test_file: str, function: str):
    """Run ``function()`` of the test module ``test_file`` in a fresh interpreter with this
    process's environment: a crash there (a read past a guarded buffer) fails only the test."""
    import subprocess

    here, module = os.path.split(os.path.abspath(test_file))
    code = (f"import sys; sys.path.insert(0, {here!r}); "
            f"import {module[:-3]} as m; m.{function}()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)


class FakeClock:
    """Milliseconds that move only when a test says so (the store's injectable clock)."""

    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@contextlib.contextmanager
def core_settings(**knobs):
    """Set the compiled core's test and tuning knobs for a block (``parallel_min_bytes=0``
    calls ``_core._set_parallel_min_bytes(0)``), restoring each one after."""
    from segstore import _core
    old = {}
    try:
        for name, value in knobs.items():
            old[name] = getattr(_core, "_set_" + name)(value)
        yield
    finally:
        for name, value in old.items():
            getattr(_core, "_set_" + name)(value)


@contextlib.contextmanager
def rewritten_between_passes(buf: bytearray, new: bytes):
    """Overwrite ``buf`` in place with ``new`` (same length) just before the next column
    decode's fill pass (after its counting pass, or its prediction of sizes)."""
    from segstore import _core
    done = []

    def hook():
        if not done:
            buf[:] = new
            done.append(True)

    old = _core._set_between_passes(hook)
    try:
        yield done
    finally:
        _core._set_between_passes(old)


@pytest.fixture
def fresh_buffer_pool():
    """segstore's buffer pool at its default limit and empty, restored and emptied after.

    Earlier tests' garbage is collected first: a pooled array held only by a reference cycle
    (a stored exception's traceback, say) stays in use until the collector runs, and these
    tests count the bytes in use."""
    import gc

    from segstore import buffer_pool
    gc.collect()
    old = buffer_pool.set_limit(buffer_pool.DEFAULT_LIMIT)
    buffer_pool.release()
    yield
    buffer_pool.set_limit(old)
    buffer_pool.release()


@pytest.fixture(scope="session")
def spark():
    """The shared SparkSession (local[2], no UI, 2 shuffle partitions): tests/spark and the
    docs/spark.md examples."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("segstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
