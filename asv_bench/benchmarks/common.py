"""Shared, deterministic benchmark data and measuring helpers.

The codec data set is the one named in the performance issue: 1,000,000 records with 16-byte keys
and 100-byte values (random bytes from a seeded numpy RNG), CreateTime timestamps
``BASE_TIMESTAMP_MS + i``, no headers, 1,000 records per uncompressed v2 batch (about 127 MB of
log). :func:`codec_dataset_cache` builds it once per ``asv run`` (every class that uses it as its
``setup_cache`` shares one cache, because asv keys the cache by the function's module and line)
and writes it as raw files into asv's cache directory, which is also the benchmarks' working
directory; each class's ``setup`` then loads only the pieces it needs.

Nothing here is a benchmark: no name starts with ``time_``, ``track_``, ``mem_``, ``peakmem_`` or
``timeraw_``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

import numpy as np

N_RECORDS = 1_000_000
KEY_SIZE = 16
VALUE_SIZE = 100
RECORDS_PER_BATCH = 1_000
BASE_TIMESTAMP_MS = 1_700_000_000_000
SEED = 20261121

_LOG_FILE = "codec-log.bin"
_KEYS_FILE = "codec-keys.u8"
_VALUES_FILE = "codec-values.u8"


def make_record_arrays(n: int = N_RECORDS, seed: int = SEED):
    """``(keys uint8[n, 16], values uint8[n, 100], timestamps int64[n])``, same bytes every run."""
    rng = np.random.default_rng(seed)
    keys = np.frombuffer(rng.bytes(n * KEY_SIZE), dtype=np.uint8).reshape(n, KEY_SIZE)
    values = np.frombuffer(rng.bytes(n * VALUE_SIZE), dtype=np.uint8).reshape(n, VALUE_SIZE)
    timestamps = BASE_TIMESTAMP_MS + np.arange(n, dtype=np.int64)
    return keys, values, timestamps


def header_layout(buf) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``(positions, sizes)`` walked by hand: size = int32 BE at ``position + 8``, plus 12."""
    positions, sizes = [], []
    mv = memoryview(buf)
    pos, end = 0, len(mv)
    while pos + 12 <= end:
        size = int.from_bytes(mv[pos + 8:pos + 12], "big", signed=True) + 12
        if size < 12 + 49 or pos + size > end:
            raise AssertionError(f"bad batch size {size} at position {pos}")
        positions.append(pos)
        sizes.append(size)
        pos += size
    if pos != end:
        raise AssertionError(f"{end - pos} stray bytes after the last batch")
    return np.array(positions, dtype=np.int64), np.array(sizes, dtype=np.int64)


def require_aiokafka():
    """aiokafka's compiled (Cython) v2 record classes, which the issue's ratios are defined against.

    Raises NotImplementedError (asv: benchmark skipped, "n/a") when aiokafka is missing or only its
    pure-Python fallback loaded, because a ratio against the pure classes would mean nothing.
    """
    try:
        from aiokafka.record import default_records
    except ImportError as exc:  # pragma: no cover - the bench extra installs aiokafka
        raise NotImplementedError(f"aiokafka is not installed: {exc}")
    batch_cls = default_records.DefaultRecordBatch
    builder_cls = default_records.DefaultRecordBatchBuilder
    if "_crecords" not in batch_cls.__module__ or "_crecords" not in builder_cls.__module__:
        raise NotImplementedError(
            "aiokafka's Cython record classes are not loaded (AIOKAFKA_NO_EXTENSIONS set, or no "
            "compiled wheel); the ratios are defined against the compiled aiokafka")
    return batch_cls, builder_cls


def check_aiokafka_batch(batch_bytes, keys, values, timestamps, base_offset: int) -> None:
    """Sanity: aiokafka decodes one segstore-written batch to exactly the source records."""
    batch_cls, _ = require_aiokafka()
    batch = batch_cls(bytes(batch_bytes))
    if not batch.validate_crc():
        raise AssertionError(f"aiokafka rejects the CRC of the batch at offset {base_offset}")
    if batch.magic != 2 or batch.compression_type != 0 or batch.base_offset != base_offset:
        raise AssertionError(
            f"unexpected header: magic {batch.magic}, codec {batch.compression_type}, "
            f"base offset {batch.base_offset} (want {base_offset})")
    records = list(batch)
    if len(records) != len(keys):
        raise AssertionError(f"aiokafka decoded {len(records)} records, want {len(keys)}")
    for j, rec in enumerate(records):
        if (rec.offset != base_offset + j or rec.timestamp != int(timestamps[j])
                or rec.key != keys[j].tobytes() or rec.value != values[j].tobytes()
                or rec.headers or rec.timestamp_type != 0):
            raise AssertionError(f"aiokafka decodes record {base_offset + j} differently")


def codec_dataset_cache(_bench=None) -> dict:
    """asv ``setup_cache`` (shared): build, check and store the 1M-record codec data set.

    Encodes with ``segstore._core.encode_columns(..., records_per_batch=1000)``, checks the batch
    layout three ways (encoder's table, ``scan_batches`` with CRC validation, header walked by
    hand), checks that aiokafka decodes the first and last batch to the source records, then
    writes ``codec-log.bin`` / ``codec-keys.u8`` / ``codec-values.u8`` into the cache directory.
    Returns small metadata only (asv pickles it for every benchmark process).
    """
    from segstore import _core
    from segstore.columns import BinaryColumn

    keys, values, timestamps = make_record_arrays()
    enc = _core.encode_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys),
                               timestamps, records_per_batch=RECORDS_PER_BATCH)
    buf = enc.data
    positions = np.asarray(enc.batches["position"], dtype=np.int64)
    sizes = np.asarray(enc.batches["size"], dtype=np.int64)
    n_batches = -(-N_RECORDS // RECORDS_PER_BATCH)

    hand_positions, hand_sizes = header_layout(buf)
    scan = _core.scan_batches(buf, validate_crc=True)
    if not (len(positions) == n_batches
            and np.array_equal(positions, hand_positions) and np.array_equal(sizes, hand_sizes)
            and np.array_equal(np.asarray(scan.batches["position"], dtype=np.int64), positions)
            and np.array_equal(np.asarray(scan.batches["size"], dtype=np.int64), sizes)
            and scan.valid_end == len(buf) and not scan.torn):
        raise AssertionError("encode_columns / scan_batches / header walk disagree on the layout")

    for b in (0, n_batches - 1):
        lo, hi = b * RECORDS_PER_BATCH, min((b + 1) * RECORDS_PER_BATCH, N_RECORDS)
        p, s = int(positions[b]), int(sizes[b])
        check_aiokafka_batch(buf[p:p + s], keys[lo:hi], values[lo:hi], timestamps[lo:hi], lo)

    with open(_LOG_FILE, "wb") as f:
        f.write(buf)
    keys.tofile(_KEYS_FILE)
    values.tofile(_VALUES_FILE)
    return {
        "dir": os.getcwd(),
        "n_records": N_RECORDS,
        "log_bytes": len(buf),
        "positions": positions.tolist(),
        "sizes": sizes.tolist(),
    }


# asv reads setup_cache's timeout from the function itself.
codec_dataset_cache.timeout = 600


def load_log(meta: dict) -> bytes:
    """The whole encoded log as one ``bytes`` object."""
    with open(os.path.join(meta["dir"], _LOG_FILE), "rb") as f:
        buf = f.read()
    if len(buf) != meta["log_bytes"]:
        raise AssertionError("cached log has the wrong size")
    return buf


def load_columns(meta: dict):
    """``(keys uint8[n, 16], values uint8[n, 100], timestamps int64[n])`` as cached."""
    n = meta["n_records"]
    keys = np.fromfile(os.path.join(meta["dir"], _KEYS_FILE), dtype=np.uint8).reshape(n, KEY_SIZE)
    values = np.fromfile(os.path.join(meta["dir"], _VALUES_FILE),
                         dtype=np.uint8).reshape(n, VALUE_SIZE)
    return keys, values, BASE_TIMESTAMP_MS + np.arange(n, dtype=np.int64)


def split_batches(buf: bytes, meta: dict) -> list[bytes]:
    """One ``bytes`` object per batch (what aiokafka's ``DefaultRecordBatch`` is given)."""
    return [buf[p:p + s] for p, s in zip(meta["positions"], meta["sizes"])]


def crc_slices(buf: bytes, meta: dict) -> list[memoryview]:
    """Per batch, a memoryview of the CRC-covered bytes ``[position + 21, position + size)``."""
    mv = memoryview(buf)
    return [mv[p + 21:p + s] for p, s in zip(meta["positions"], meta["sizes"])]


def bytes_list(matrix: np.ndarray) -> list[bytes]:
    """Each row of a fixed-width uint8 matrix as its own ``bytes`` object."""
    width = matrix.shape[1]
    flat = matrix.tobytes()
    return [flat[i:i + width] for i in range(0, len(flat), width)]


@contextlib.contextmanager
def buffer_pool_off():
    """Column outputs in fresh memory, as without segstore's buffer pool (restored after)."""
    from segstore import buffer_pool
    old = buffer_pool.set_limit(0)
    try:
        yield
    finally:
        buffer_pool.set_limit(old)


def best_of_pair(fa, fb, repeat: int = 3, *, collector: bool = False) -> tuple[float, float]:
    """Best wall time (perf_counter) of ``fa()`` and of ``fb()``, runs interleaved a, b, a, b, ...

    The garbage collector is off while timing, as in asv's own ``time_`` benchmarks, unless
    ``collector`` is true (what a long-running consumer process sees).
    """
    best_a = best_b = float("inf")
    gc_was_enabled = gc.isenabled()
    gc.enable() if collector else gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fa()
            t1 = time.perf_counter()
            fb()
            t2 = time.perf_counter()
            best_a = min(best_a, t1 - t0)
            best_b = min(best_b, t2 - t1)
            gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    return best_a, best_b


def best_of_pair_fresh(make_a, make_b, repeat: int = 3) -> tuple[float, float]:
    """Like :func:`best_of_pair`, but every run starts from fresh state, prepared untimed.

    ``make_a()`` / ``make_b()`` prepare one run and return ``(run, cleanup)``: only ``run()`` is
    timed, ``cleanup()`` (which may be None) runs right after it, also untimed. Runs are
    interleaved a, b, a, b, ... with the garbage collector off while timing.
    """
    best_a = best_b = float("inf")
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for make, side in ((make_a, 0), (make_b, 1)):
                run, cleanup = make()
                try:
                    gc.collect()
                    t0 = time.perf_counter()
                    run()
                    elapsed = time.perf_counter() - t0
                finally:
                    if cleanup is not None:
                        cleanup()
                if side == 0:
                    best_a = min(best_a, elapsed)
                else:
                    best_b = min(best_b, elapsed)
    finally:
        if gc_was_enabled:
            gc.enable()
    return best_a, best_b
