"""Appending numpy columns to a partition log, encoded and written in pipelined chunks.

``PartitionLog.append_columns`` hands its columns here. A small append is encoded in one call
and written. A large one is cut into chunks of about ``CHUNK_BYTES`` of log: while the log
thread writes and indexes chunk ``i``, a worker thread encodes chunk ``i + 1`` (both release the
GIL). Each chunk is encoded straight at the offsets it will get, so nothing is patched after
encoding, and the encoded chunk is still in the CPU cache when it is written. No log-sized
buffer is ever allocated.

An append is all or nothing for bad input: everything a later chunk could reject (column
offsets, field sizes, timestamps, a record too large for a batch) is checked before the first
chunk is written; input that could produce a too-large batch takes the one-call path, which
rejects it before writing anything.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from . import _core
from .columns import BinaryColumn
from .errors import InvalidRecordError, is_int

# Big enough that most of a chunk's write covers whole 2 MiB-aligned ranges of the file, which
# the page cache then holds as huge folios (later maps of the segment fault far less; 4 MiB
# chunks left 35% of a 1M-record log that way, 8 MiB 83%); small enough that two chunks in
# flight stay in the last-level cache.
CHUNK_BYTES = 8 << 20
RECORD_OVERHEAD_MAX = 32  # length, attributes, deltas and field lengths as varints, header count
BATCH_OVERHEAD = 61
MAX_FIELD = (1 << 31) - 1

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _encoder_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # An append keeps one encode in flight; a worker per core lets appends to
            # different partitions from several threads encode at the same time.
            _pool = ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 2),
                                       thread_name_prefix="segstore-append")
        return _pool


def _checked_lengths(col: BinaryColumn, what: str) -> np.ndarray:
    """Per-row byte lengths, after the checks encode_columns would make row by row."""
    off = col.offsets
    if len(off) and (off[0] < 0 or off[-1] > len(col.data)):
        raise InvalidRecordError(f"{what}.offsets point outside {what}.data")
    lengths = np.diff(off)
    if len(lengths) and (lengths.min() < 0 or lengths.max() > MAX_FIELD):
        raise InvalidRecordError("column offsets are not increasing or a value exceeds 2 GiB")
    return lengths


def chunk_rows(values: BinaryColumn, keys: Optional[BinaryColumn], records_per_batch: int,
               max_batch_bytes: int) -> int:
    """Rows per chunk (a multiple of ``records_per_batch``), or ``len(values)`` when the append
    should be one call: it is small, or some record might not fit a batch on its own."""
    if not is_int(records_per_batch) or not 1 <= records_per_batch < 1 << 31:
        raise InvalidRecordError(f"records_per_batch must be a positive int (at most 2**31 - 1), "
                                 f"got {records_per_batch!r}")
    n = len(values)
    if keys is not None and len(keys) != n:
        # Checked here: the encoder sees each chunk's rows of both columns, the same number.
        raise InvalidRecordError(f"{len(keys)} keys for {n} values")
    if n <= records_per_batch:
        return n
    lengths = _checked_lengths(values, "values")
    total = int(lengths.sum())
    if keys is not None:
        lengths = lengths + _checked_lengths(keys, "keys")
        total += int(keys.offsets[-1] - keys.offsets[0])
    if int(lengths.max()) + RECORD_OVERHEAD_MAX + BATCH_OVERHEAD > max_batch_bytes:
        return n
    per_row = total / n + RECORD_OVERHEAD_MAX
    if per_row * n <= 2 * CHUNK_BYTES:
        return n
    batches = max(1, int(CHUNK_BYTES / (per_row * records_per_batch)))
    return batches * records_per_batch


def _rows(col: Optional[BinaryColumn], lo: int, hi: int) -> Optional[BinaryColumn]:
    if col is None:
        return None
    return BinaryColumn(col.data, col.offsets[lo:hi + 1], col.valid[lo:hi])


def append_columns(lg, values: BinaryColumn, keys: Optional[BinaryColumn], timestamps_ms,
                   records_per_batch: int, codec: int):
    """Append the columns to ``lg`` (a writable PartitionLog); its AppendInfo."""
    from .log import AppendInfo

    config = lg.config
    max_batch = min(config.max_message_bytes, config.segment_bytes)
    n = len(values)
    per = chunk_rows(values, keys, records_per_batch, max_batch)
    if timestamps_ms is not None and not is_int(timestamps_ms):
        timestamps_ms = _core.timestamp_array(timestamps_ms)
        if len(timestamps_ms) != n:
            raise InvalidRecordError(f"{len(timestamps_ms)} timestamps for {n} values")
    with lg._lock, lg._going_offline_on_io_error():  # encoding at the log end offset
        lg._check_writable()
        now = lg.clock()
        ts = now if timestamps_ms is None else timestamps_ms
        append_time = lg._log_append_time(now)
        base = lg._state.log_end_offset

        def encode(lo: int, hi: int):
            return _core.encode_columns(
                _rows(values, lo, hi), _rows(keys, lo, hi),
                ts if isinstance(ts, (int, np.integer)) else ts[lo:hi],
                base_offset=base + lo, records_per_batch=records_per_batch,
                max_batch_bytes=max_batch, compression=codec, partition_leader_epoch=0,
                compression_level=lg.config.compression_level(codec),
                log_append_time_ms=append_time)

        if per >= n:
            enc = encode(0, n)
            return lg._append_encoded(enc.data, enc.batches, assigned=True)
        bounds = [(lo, min(lo + per, n)) for lo in range(0, n, per)]
        pool = _encoder_pool()
        pending = pool.submit(encode, *bounds[0])
        infos = []
        try:
            for i in range(len(bounds)):
                enc = pending.result()
                pending = pool.submit(encode, *bounds[i + 1]) if i + 1 < len(bounds) else None
                infos.append(lg._append_encoded(enc.data, enc.batches, assigned=True))
        finally:
            if pending is not None:
                pending.cancel() or pending.exception()  # never leave it running unobserved
    return AppendInfo(infos[0].first_offset, infos[-1].last_offset,
                      max(i.max_timestamp for i in infos), sum(i.num_records for i in infos),
                      sum(i.size_bytes for i in infos))
