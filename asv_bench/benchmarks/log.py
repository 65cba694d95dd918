"""Partition log: ``PartitionLog`` appends and reads against plain ``os.write`` and aiokafka 0.14.

Data (the performance issue's): 1,000,000 records, 16-byte keys, 100-byte values, CreateTime
timestamps, no headers, 1,000 records per uncompressed v2 batch: 126,933,000 bytes of log. Targets
(issue 3), measured against the baseline in the same run:

* ``append_columns``: at least half the throughput of a plain loop of 1 MiB ``os.write`` calls
  writing the same number of bytes (the same log bytes) into a new file on the same filesystem;
* ``append_batch`` from Python lists, one call per 1,000-record slice: at least 1.5x the rate of
  aiokafka's ``DefaultRecordBatchBuilder`` building the same 1,000-record batches (no I/O);
* ``read_columns`` of the whole log, all of it in sealed segments: at least 10x aiokafka's
  parse + ``validate_crc()`` + iterate ``.key``/``.value`` rate on the same batches;
* random single-record reads by offset over a log of at least 1 GiB: reported in reads/s;
* peak memory of ``read_columns``: at most 1.5x the ``nbytes`` of the columns it returns.

As in ``codec.py``, ``time_*`` benchmarks come in pairs (segstore / baseline) and the
``track_ratio_*`` benchmarks time both sides inside one call (best of a few interleaved runs,
garbage collector off) and return ``baseline_time / segstore_time`` (unit "x"; above 1 means
segstore is faster, so the append_columns target is a ratio of at least 0.5).

Where things live: every log is written under asv's cache directory (the benchmarks' working
directory), so the ``os.write`` baseline writes to the same filesystem. The 1M-record read log
(``segment.bytes`` 64 MiB, rolled at the end: two sealed segments plus an empty active one) is
built once by :func:`log_dataset_cache`; the random-read logs (128 MiB and 1 GiB) by
:func:`random_read_cache`. Building the 1 GiB log takes about 5 s and 1.1 GB of disk in the
cache directory (deleted by asv after the run), and the whole ``-b log`` suite runs in about
35 s with ``--quick``, so it runs by default; ``SEGSTORE_BENCH_LARGE=0`` skips it (that variant
then shows "n/a") on machines short of disk or time. The 128 MiB variant always runs.

Fresh state: every timed append starts from a newly created store and topic (and the baseline
from a newly created, empty file): creating them, and closing them afterwards (which fsyncs the
segstore log), is outside the timing on both sides. Each ``read_columns`` run opens the store
read-only first (untimed), so the timing includes faulting the segment maps in; aiokafka gets
one ``bytes`` per batch, already in memory.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import segstore
from segstore.columns import BinaryColumn

from .codec import _aiokafka_decode, _aiokafka_encode
from .common import (
    BASE_TIMESTAMP_MS,
    KEY_SIZE,
    N_RECORDS,
    RECORDS_PER_BATCH,
    SEED,
    VALUE_SIZE,
    best_of_pair_fresh,
    buffer_pool_off,
    bytes_list,
    check_aiokafka_batch,
    header_layout,
    make_record_arrays,
    require_aiokafka,
)

TOPIC = "bench"
READ_SEGMENT_BYTES = 64 * 1024 * 1024
WRITE_CHUNK = 1 << 20                   # the os.write baseline's call size
BUILD_CHUNK = 100_000                   # records per append_columns call while building logs
LARGE_ENV = "SEGSTORE_BENCH_LARGE"
RANDOM_READS = 5_000                    # reads per timed pass
GIB = 1 << 30

_LOG_KEYS_FILE = "log-keys.u8"
_LOG_VALUES_FILE = "log-values.u8"
_READ_STORE = "log-store-1m"


# --------------------------------------------------------------------------------------------
# Building the logs (setup_cache).


def _append_cycled(log, keys, values, timestamps, n_total=None, min_bytes=None):
    """Append ``n_total`` records, or whole 1,000-record batches until the log holds at least
    ``min_bytes``, cycling through the source rows; returns ``(records, bytes written)``.

    Record ``i`` of the log is source row ``i % len(keys)``.
    """
    n_src = len(keys)
    written = done = 0
    while (done < n_total) if n_total is not None else (written < min_bytes):
        lo = done % n_src
        if n_total is not None:
            hi = min(lo + BUILD_CHUNK, n_src, lo + n_total - done)
        else:
            # Size the last chunk from the bytes per record so far (every batch is the same size).
            per_record = written / done if done else VALUE_SIZE + KEY_SIZE
            batches = -(-int((min_bytes - written) / per_record) // RECORDS_PER_BATCH)
            hi = min(lo + BUILD_CHUNK, n_src, lo + max(batches, 1) * RECORDS_PER_BATCH)
        info = log.append_columns(BinaryColumn.from_fixed(values[lo:hi]),
                                  BinaryColumn.from_fixed(keys[lo:hi]), timestamps[lo:hi],
                                  records_per_batch=RECORDS_PER_BATCH)
        if info.first_offset != done or info.num_records != hi - lo:
            raise AssertionError(f"append at {done} landed at {info.first_offset}")
        written += info.size_bytes
        done += hi - lo
    return done, written


def _check_read_back(path: str, keys, values, timestamps, n_records: int, log_bytes: int) -> list:
    """Open read-only, check segment layout and contents; returns ``[(log file, size), ...]``."""
    store = segstore.open(path, readonly=True)
    try:
        log = store.partition(TOPIC, 0)
        segs = log.segments
        if log.log_start_offset != 0 or log.log_end_offset != n_records:
            raise AssertionError(f"offsets [{log.log_start_offset}, {log.log_end_offset})")
        if segs[-1].size != 0 or sum(s.size for s in segs) != log_bytes:
            raise AssertionError("the active segment is not empty, or the sizes do not add up")
        files = [(s.log_path, int(s.size)) for s in segs[:-1]]
        if n_records == len(keys):  # the 1M-record read log: compare every record
            cols = log.read_columns()
            n = len(keys)
            if not (len(cols) == n
                    and np.array_equal(cols.offsets, np.arange(n, dtype=np.int64))
                    and np.array_equal(cols.timestamps_ms, timestamps)
                    and not cols.timestamp_types.any()
                    and cols.keys.valid.all() and cols.values.valid.all()
                    and np.array_equal(cols.keys.offsets, np.arange(n + 1) * KEY_SIZE)
                    and np.array_equal(cols.values.offsets, np.arange(n + 1) * VALUE_SIZE)
                    and np.array_equal(cols.keys.data, keys.reshape(-1))
                    and np.array_equal(cols.values.data, values.reshape(-1))):
                raise AssertionError("read_columns does not return the appended records")
            del cols
        rng = np.random.default_rng(SEED + 1)
        for off in rng.integers(0, n_records, 200).tolist() + [0, n_records - 1]:
            rec = log.read(off, max_records=1)[0]
            src = off % len(keys)
            if (rec.offset != off or rec.key != keys[src].tobytes()
                    or rec.value != values[src].tobytes()
                    or rec.timestamp != int(timestamps[src])):
                raise AssertionError(f"read({off}) returns the wrong record")
        return files
    finally:
        store.close()


def log_dataset_cache(_bench=None) -> dict:
    """asv ``setup_cache``: the 1M-record read log plus the source columns, as files.

    Builds ``log-store-1m/`` (``segment.bytes`` 64 MiB, appended with ``append_columns`` in
    100,000-record calls of 1,000-record batches, then rolled so every segment holding data is
    sealed) and checks it: layout, every record through ``read_columns``, random ``read``s, and
    aiokafka decoding the first and the last batch. Writes the keys and values as raw files.
    """
    keys, values, timestamps = make_record_arrays()
    keys.tofile(_LOG_KEYS_FILE)
    values.tofile(_LOG_VALUES_FILE)
    path = os.path.abspath(_READ_STORE)
    store = segstore.open(path)
    try:
        store.create_topic(TOPIC, 1, {"segment.bytes": READ_SEGMENT_BYTES})
        log = store.partition(TOPIC, 0)
        _, log_bytes = _append_cycled(log, keys, values, timestamps, n_total=N_RECORDS)
        log.roll()
    finally:
        store.close()
    files = _check_read_back(path, keys, values, timestamps, N_RECORDS, log_bytes)
    if len(files) < 2:
        raise AssertionError(f"want at least 2 sealed segments, got {len(files)}")

    # aiokafka must decode the first and the last batch to the source records.
    first_file, last_file = files[0][0], files[-1][0]
    with open(first_file, "rb") as f:
        buf = f.read()
    pos, size = header_layout(buf)
    check_aiokafka_batch(buf[pos[0]:pos[0] + size[0]], keys[:RECORDS_PER_BATCH],
                         values[:RECORDS_PER_BATCH], timestamps[:RECORDS_PER_BATCH], 0)
    with open(last_file, "rb") as f:
        buf = f.read()
    pos, size = header_layout(buf)
    lo = N_RECORDS - RECORDS_PER_BATCH
    check_aiokafka_batch(buf[pos[-1]:pos[-1] + size[-1]], keys[lo:], values[lo:],
                         timestamps[lo:], lo)
    return {"dir": os.getcwd(), "store": path, "files": files, "log_bytes": log_bytes,
            "n_records": N_RECORDS}


log_dataset_cache.timeout = 600


def random_read_cache(_bench=None) -> dict:
    """asv ``setup_cache``: logs of at least 128 MiB (always) and 1 GiB (unless
    ``SEGSTORE_BENCH_LARGE=0``).

    Default topic config (``segment.bytes`` 1 GiB); the 1M source rows are appended cyclically
    (record ``i`` is row ``i % 1M``) and each log is rolled at the end, so all data is sealed.
    """
    keys, values, timestamps = make_record_arrays()
    sizes = {"128MiB": 128 << 20}
    if os.environ.get(LARGE_ENV, "1") != "0":
        sizes["1GiB"] = GIB
    stores = {}
    for name, target in sizes.items():
        path = os.path.abspath(f"log-store-{name}")
        store = segstore.open(path)
        try:
            store.create_topic(TOPIC, 1)
            log = store.partition(TOPIC, 0)
            n, log_bytes = _append_cycled(log, keys, values, timestamps, min_bytes=target)
            log.roll()
        finally:
            store.close()
        if log_bytes < target:
            raise AssertionError(f"{name}: only {log_bytes} bytes")
        _check_read_back(path, keys, values, timestamps, n, log_bytes)
        stores[name] = {"path": path, "n_records": n, "log_bytes": log_bytes}
    return {"dir": os.getcwd(), "stores": stores}


random_read_cache.timeout = 900


# --------------------------------------------------------------------------------------------
# Loading (per benchmark process; memoized because asv re-runs setup before every timed call).

_memo: dict = {}


def _memoized(key, build):
    if key not in _memo:
        _memo[key] = build()
    return _memo[key]


def _load_columns(meta):
    def build():
        n = meta["n_records"]
        keys = np.fromfile(os.path.join(meta["dir"], _LOG_KEYS_FILE),
                           dtype=np.uint8).reshape(n, KEY_SIZE)
        values = np.fromfile(os.path.join(meta["dir"], _LOG_VALUES_FILE),
                             dtype=np.uint8).reshape(n, VALUE_SIZE)
        return keys, values, BASE_TIMESTAMP_MS + np.arange(n, dtype=np.int64)
    return _memoized(("columns", meta["dir"]), build)


def _load_log_bytes(meta) -> bytes:
    """The sealed segments' log files, concatenated: exactly the bytes append_columns writes."""
    def build():
        parts = []
        for path, size in meta["files"]:
            with open(path, "rb") as f:
                parts.append(f.read())
            if len(parts[-1]) != size:
                raise AssertionError(f"{path} is {len(parts[-1])} bytes, want {size}")
        buf = b"".join(parts)
        if len(buf) != meta["log_bytes"]:
            raise AssertionError("the cached log has the wrong size")
        return buf
    return _memoized(("log", meta["dir"]), build)


def _load_batches(meta) -> list:
    """One ``bytes`` per batch of the sealed segments (what aiokafka's DefaultRecordBatch takes)."""
    def build():
        out = []
        for path, _ in meta["files"]:
            with open(path, "rb") as f:
                buf = f.read()
            positions, sizes = header_layout(buf)
            out.extend(buf[p:p + s] for p, s in zip(positions.tolist(), sizes.tolist()))
        if len(out) != meta["n_records"] // RECORDS_PER_BATCH:
            raise AssertionError(f"{len(out)} batches")
        return out
    return _memoized(("batches", meta["dir"]), build)


def _load_lists(meta):
    """``(values, keys, timestamps)`` as Python lists of bytes / int, and 1,000-record slices."""
    def build():
        keys, values, timestamps = _load_columns(meta)
        value_list, key_list, ts_list = bytes_list(values), bytes_list(keys), timestamps.tolist()
        chunks = [(value_list[lo:lo + RECORDS_PER_BATCH], key_list[lo:lo + RECORDS_PER_BATCH],
                   ts_list[lo:lo + RECORDS_PER_BATCH])
                  for lo in range(0, len(value_list), RECORDS_PER_BATCH)]
        return value_list, key_list, ts_list, chunks
    return _memoized(("lists", meta["dir"]), build)


# --------------------------------------------------------------------------------------------
# Fresh targets and the workloads, shared by the time_ benchmarks and the ratio tracks.

_counter = [0]


def _fresh_name(prefix: str) -> str:
    _counter[0] += 1
    return os.path.abspath(f"{prefix}-{os.getpid()}-{_counter[0]}")


class _FreshLog:
    """A newly created store with one empty topic (default config: no roll within 127 MB)."""

    def __init__(self):
        self.path = _fresh_name("append-store")
        self.store = segstore.open(self.path)
        self.store.create_topic(TOPIC, 1)
        self.log = self.store.partition(TOPIC, 0)

    def close(self):
        try:
            self.store.close()  # flushes (fsyncs) the log: never timed
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


class _FreshFile:
    """A newly created, empty file for the ``os.write`` baseline."""

    def __init__(self):
        self.path = _fresh_name("append-file") + ".bin"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def close(self):
        try:
            os.close(self.fd)
        finally:
            os.unlink(self.path)


def _os_write_loop(fd: int, view: memoryview) -> None:
    """The baseline: ``os.write`` 1 MiB at a time until every byte is written."""
    write = os.write
    pos, end = 0, len(view)
    while pos < end:
        pos += write(fd, view[pos:pos + WRITE_CHUNK])


def _segstore_append_columns(log, values_col, keys_col, timestamps):
    info = log.append_columns(values_col, keys_col, timestamps,
                              records_per_batch=RECORDS_PER_BATCH)
    return info


def _segstore_append_batch(log, chunks):
    """One ``append_batch`` per 1,000-record slice of Python lists (pre-sliced, untimed)."""
    append_batch = log.append_batch
    for values, keys, timestamps in chunks:
        append_batch(values, keys, timestamps_ms=timestamps)


def _segstore_read_columns(log):
    return log.read_columns()


def _open_read_log(meta):
    store = segstore.open(meta["store"], readonly=True)
    return store, store.partition(TOPIC, 0)


def _evict_segments(meta) -> None:
    """Drop the store's log files from the page cache (they are clean: written and synced)."""
    for path, _ in meta["files"]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _close_attrs(obj, *names) -> None:
    """Close and forget ``obj.<name>`` for each name set (teardown also runs after a skip)."""
    for name in names:
        thing = obj.__dict__.pop(name, None)
        if thing is not None:
            thing.close()


def _ratio(t_baseline, t_segstore):
    return round(t_baseline / t_segstore, 3)


# --------------------------------------------------------------------------------------------
# Wall time, in pairs.


class AppendColumns:
    """Append the 1M records (126.9 MB) with ``append_columns`` vs ``os.write`` of the same bytes.

    ``setup`` runs before every timed call (asv re-runs it): a new store with an empty topic and
    a new empty file; ``teardown`` closes (and, for segstore, fsyncs) and deletes both.
    """

    setup_cache = log_dataset_cache
    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0
    timeout = 300

    def setup(self, meta):
        keys, values, self.timestamps = _load_columns(meta)
        self.keys_col = BinaryColumn.from_fixed(keys)
        self.values_col = BinaryColumn.from_fixed(values)
        self.view = memoryview(_load_log_bytes(meta))
        self.target = _FreshLog()
        self.file = _FreshFile()

    def teardown(self, meta):
        _close_attrs(self, "target", "file")

    def time_append_columns_segstore(self, meta):
        _segstore_append_columns(self.target.log, self.values_col, self.keys_col, self.timestamps)

    def time_os_write_same_bytes(self, meta):
        _os_write_loop(self.file.fd, self.view)


class AppendBatch:
    """Append the 1M records from Python lists, one batch per 1,000 records, vs aiokafka's builder.

    aiokafka builds the same 1,000-record batches in memory (no I/O); segstore encodes, assigns
    offsets, writes the segment and updates its indexes. A new store per timed call.
    """

    setup_cache = log_dataset_cache
    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0
    timeout = 300

    def setup(self, meta):
        _, self.builder_cls = require_aiokafka()
        self.value_list, self.key_list, self.ts_list, self.chunks = _load_lists(meta)
        self.target = _FreshLog()

    def teardown(self, meta):
        _close_attrs(self, "target")

    def time_append_batch_segstore(self, meta):
        _segstore_append_batch(self.target.log, self.chunks)

    def time_build_aiokafka(self, meta):
        _aiokafka_encode(self.builder_cls, self.value_list, self.key_list, self.ts_list)


class ReadColumns:
    """Read the whole 1M-record log (two sealed segments) vs aiokafka parsing the same batches.

    segstore: ``read_columns()`` on a store opened read-only just before (untimed); CRCs are
    validated. aiokafka: parse, ``validate_crc()``, iterate touching ``.key`` and ``.value``.
    """

    setup_cache = log_dataset_cache
    number = 1
    repeat = (3, 10, 10.0)
    warmup_time = 0
    timeout = 300

    def setup(self, meta):
        self.batch_cls, _ = require_aiokafka()
        self.batches = _load_batches(meta)
        self.store, self.log = _open_read_log(meta)

    def teardown(self, meta):
        _close_attrs(self, "store")

    def time_read_columns_segstore(self, meta):
        _segstore_read_columns(self.log)

    def time_decode_aiokafka(self, meta):
        _aiokafka_decode(self.batch_cls, self.batches)


# --------------------------------------------------------------------------------------------
# Ratios (baseline time / segstore time, best of interleaved runs inside one call).


class RatioAppend:
    """Append ratios on the full 1M-record data set.

    Targets: ``append_columns`` >= 0.5x of ``os.write`` (half its throughput or better);
    ``append_batch`` >= 1.5x aiokafka's builder.
    """

    setup_cache = log_dataset_cache
    unit = "x"
    timeout = 300
    repeats = 5

    def setup(self, meta):
        _, self.builder_cls = require_aiokafka()

    def track_ratio_append_columns_vs_os_write(self, meta):
        keys, values, timestamps = _load_columns(meta)
        keys_col, values_col = BinaryColumn.from_fixed(keys), BinaryColumn.from_fixed(values)
        view = memoryview(_load_log_bytes(meta))

        def make_os_write():
            target = _FreshFile()
            return (lambda: _os_write_loop(target.fd, view)), target.close

        def make_segstore():
            target = _FreshLog()

            def run():
                info = _segstore_append_columns(target.log, values_col, keys_col, timestamps)
                if info.size_bytes != len(view):  # same byte count as the baseline (cheap check)
                    raise AssertionError(f"append_columns wrote {info.size_bytes} bytes")
            return run, target.close

        t_os, t_segstore = best_of_pair_fresh(make_os_write, make_segstore, self.repeats)
        return _ratio(t_os, t_segstore)

    def track_ratio_append_batch_vs_aiokafka(self, meta):
        value_list, key_list, ts_list, chunks = _load_lists(meta)

        def make_aiokafka():
            return (lambda: _aiokafka_encode(self.builder_cls, value_list, key_list, ts_list)), None

        def make_segstore():
            target = _FreshLog()
            return (lambda: _segstore_append_batch(target.log, chunks)), target.close

        t_aiokafka, t_segstore = best_of_pair_fresh(make_aiokafka, make_segstore, 3)
        return _ratio(t_aiokafka, t_segstore)


class RatioRead:
    """``read_columns`` of the whole log vs aiokafka parse + CRC + iterate; target >= 10x."""

    setup_cache = log_dataset_cache
    unit = "x"
    timeout = 300
    repeats = 7   # the pool needs a run or two to settle; both sides get the same runs

    def setup(self, meta):
        self.batch_cls, _ = require_aiokafka()
        self.batches = _load_batches(meta)

    def _ratio_vs_aiokafka(self, meta):
        def make_aiokafka():
            return (lambda: _aiokafka_decode(self.batch_cls, self.batches)), None

        def make_segstore():
            store, log = _open_read_log(meta)
            return (lambda: _segstore_read_columns(log)), store.close

        t_aiokafka, t_segstore = best_of_pair_fresh(make_aiokafka, make_segstore, self.repeats)
        return _ratio(t_aiokafka, t_segstore)

    def track_ratio_read_columns_vs_aiokafka(self, meta):
        return self._ratio_vs_aiokafka(meta)

    def track_ratio_read_columns_unpooled_vs_aiokafka(self, meta):
        """The same with segstore's buffer pool off: every output array in fresh memory (the
        first read of a process; the track above is the steady state of repeated reads)."""
        with buffer_pool_off():
            return self._ratio_vs_aiokafka(meta)


def reread_dataset_cache(_bench=None) -> dict:
    """asv ``setup_cache`` of :class:`RatioReadReread`: the same log, built apart, so that
    evicting and rereading it leaves the other classes' page cache as their writes left it."""
    return log_dataset_cache(_bench)


class RatioReadReread:
    """``read_columns`` vs aiokafka after the segments left the page cache and were read back
    through a store's map (untimed): what a pipeline rereading older data sees. The page cache
    then holds the files as the map's faults brought them in; their folio size sets what every
    later map of them costs (segment_files.read_map)."""

    setup_cache = reread_dataset_cache
    unit = "x"
    timeout = 300
    setup = RatioRead.setup
    repeats = RatioRead.repeats
    _ratio_vs_aiokafka = RatioRead._ratio_vs_aiokafka

    def track_ratio_read_columns_reread_vs_aiokafka(self, meta):
        _evict_segments(meta)
        store, log = _open_read_log(meta)
        try:
            log.read_columns()  # reads the files back from disk, through segstore's map
        finally:
            store.close()
        return self._ratio_vs_aiokafka(meta)


# --------------------------------------------------------------------------------------------
# Random single-record reads.


class RandomReads:
    """Random ``read(offset, max_records=1)`` calls over a sealed log, in reads per second.

    ``log_size``: "128MiB" always runs; "1GiB" (the issue's size, about 8.5M records) unless
    ``SEGSTORE_BENCH_LARGE=0`` (then "n/a"). ``handle``: a read-only store, or the writer.
    Each pass reads 5,000 offsets drawn uniformly (seeded); the result is the best of 3 passes
    (garbage collector off). The logs were just written, so they are in the page cache.
    """

    setup_cache = random_read_cache
    params = (["128MiB", "1GiB"], ["readonly", "writer"])
    param_names = ["log_size", "handle"]
    unit = "reads/s"
    timeout = 300
    passes = 3

    def setup(self, meta, log_size, handle):
        info = meta["stores"].get(log_size)
        if info is None:
            raise NotImplementedError(f"the {log_size} log is not built when {LARGE_ENV}=0")
        self.store = segstore.open(info["path"], readonly=handle == "readonly")
        self.log = self.store.partition(TOPIC, 0)
        rng = np.random.default_rng(SEED + 2)
        self.offsets = rng.integers(0, info["n_records"],
                                    (self.passes, RANDOM_READS)).tolist()
        for off in self.offsets[0][:3]:
            if self.log.read(off, max_records=1)[0].offset != off:
                raise AssertionError(f"read({off}) returns another offset")

    def teardown(self, meta, log_size, handle):
        _close_attrs(self, "store")

    def _rate(self, **kwargs):
        read = self.log.read
        best = float("inf")
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for offsets in self.offsets:
                t0 = time.perf_counter()
                for off in offsets:
                    read(off, max_records=1, **kwargs)
                best = min(best, time.perf_counter() - t0)
        finally:
            if gc_was_enabled:
                gc.enable()
        return round(RANDOM_READS / best)

    def track_random_reads_per_second(self, meta, log_size, handle):
        """``read(offset, max_records=1)``: default ``max_bytes`` (1 MiB), as a fetch would."""
        return self._rate()

    def track_random_reads_per_second_one_batch(self, meta, log_size, handle):
        """``read(offset, max_records=1, max_bytes=1)``: only the batch holding the offset."""
        return self._rate(max_bytes=1)


# --------------------------------------------------------------------------------------------
# Memory.


class ReadColumnsMemory:
    """Peak RSS of the benchmark process around ``read_columns`` of the whole 1M-record log.

    ``peakmem_read_columns_baseline`` only opens the store read-only (the same setup); subtract
    it. RSS counts the segment pages ``read_columns`` maps in (about 127 MB) as well as the
    result (151 MB of arrays).
    """

    setup_cache = log_dataset_cache
    timeout = 300

    def setup(self, meta):
        self.store, self.log = _open_read_log(meta)

    def teardown(self, meta):
        _close_attrs(self, "store")

    def peakmem_read_columns_baseline(self, meta):
        pass

    def peakmem_read_columns(self, meta):
        _segstore_read_columns(self.log)


# Run in a fresh interpreter: open read-only, reset the RSS high-water mark, read the whole log,
# report the peak RSS increase and the result's size. The high-water mark comes from
# /proc/self/status (VmHWM), reset with /proc/self/clear_refs: ru_maxrss alone is not usable here,
# because a child started with vfork + exec (as subprocess does) inherits its parent's peak RSS
# in ru_maxrss, so "after - before" can read 0.
_PEAK_CHILD = r"""
import gc, json, resource, sys
import segstore

def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, _, v in (l.partition(":") for l in f)
                if k in ("VmRSS", "VmHWM", "RssFile")}

store = segstore.open(sys.argv[1], readonly=True)
log = store.partition(sys.argv[2], 0)
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
s0 = status()
maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
cols = log.read_columns()
s1 = status()
maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_delta": s1["VmHWM"] - s0["VmRSS"], "nbytes": cols.nbytes,
                  "records": len(cols), "file_delta": s1["RssFile"] - s0["RssFile"],
                  "hwm_reset": s0["VmHWM"] - s0["VmRSS"] < (1 << 20),
                  "ru_maxrss_delta": maxrss1 - maxrss0}))
"""


def _peak_child(meta) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(segstore.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]]
                                                  if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, meta["store"], TOPIC],
                         env=env, check=True, capture_output=True, text=True, timeout=240)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["records"] != meta["n_records"]:
        raise AssertionError(f"the child read {res['records']} records")
    if not res["hwm_reset"]:
        raise AssertionError("could not reset the child's RSS high-water mark")
    return res


class RatioReadColumnsMemory:
    """Peak RSS increase of ``read_columns`` divided by the result's ``nbytes``; target <= 1.5x.

    Measured in a fresh Python process that opens the store read-only, resets its RSS high-water
    mark, calls ``read_columns()`` and reports ``VmHWM`` minus the RSS before the call; the lower
    of 2 runs. ``..._excluding_mapped_file`` subtracts the growth of the child's
    file-backed RSS (the segment pages mapped in, measured after the call): a lower bound for the
    anonymous-memory part of the peak.
    """

    setup_cache = log_dataset_cache
    unit = "x"
    timeout = 300
    runs = 2

    def _results(self, meta):
        key = ("peak", meta["dir"])
        if key not in _memo:
            _memo[key] = [_peak_child(meta) for _ in range(self.runs)]
        return _memo[key]

    def track_read_columns_peak_ratio(self, meta):
        return round(min(r["peak_delta"] / r["nbytes"] for r in self._results(meta)), 3)

    def track_read_columns_peak_ratio_excluding_mapped_file(self, meta):
        return round(min((r["peak_delta"] - r["file_delta"]) / r["nbytes"]
                         for r in self._results(meta)), 3)
