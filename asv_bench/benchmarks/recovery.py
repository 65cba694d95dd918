"""Recovery after an unclean shutdown: segstore.open over unflushed segments vs the crc32c package.

Target (the crash-recovery issue): opening a store after an unclean shutdown with 1 GiB of
unflushed segments recovers at no less than half the ``crc32c`` package's throughput over the
same bytes (``track_ratio_recovery_vs_crc32c`` >= 0.5).

Data: one partition of 16-byte keys and 100-byte values (the codec data set's shape, seeded
random bytes), 1,000 records per uncompressed v2 batch, 64 MiB segments, built once per ``asv
run`` by :func:`recovery_store_cache` and closed cleanly. The size is 128 MiB by default, so CI's
``asv run --quick`` stays fast; ``SEGSTORE_BENCH_LARGE=1`` builds the issue's 1 GiB.

Before every timed open, ``setup`` deletes ``.kafka_cleanshutdown`` and the recovery-point
checkpoint, so the open is unclean and recovers every segment from offset 0: each batch's size
and CRC checked, both indexes rebuilt by the sparse rule, the files trimmed (REF §4.2, §4.3).
``time_open_unclean_recovery`` times ``segstore.open(path)`` plus ``close()`` (whose flush of
the recovered segments dominates); the ratio and MB/s tracks time the open alone, which is the
recovery. The segment files are in the page cache (they were just written), as
after a process crash; a cold cache after a power loss adds the disk's read time to both sides.

The baseline is ``crc32c.crc32c`` over every ``.log`` file's bytes, read into memory beforehand
(one call per file: the ideal, no batch walking at all). ``track_ratio_recovery_vs_crc32c`` times
both in one call (best of interleaved repeats, garbage collector off) and returns
``crc32c_time / recovery_time``; the two ``track_*_mb_per_s`` benchmarks give the throughputs.
"""

from __future__ import annotations

import gc
import os
import shutil
import time

import crc32c
import numpy as np

import segstore
from segstore.checkpoint import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT
from segstore.columns import BinaryColumn

from .common import BASE_TIMESTAMP_MS, KEY_SIZE, RECORDS_PER_BATCH, SEED, VALUE_SIZE

MIB = 1 << 20
LARGE = os.environ.get("SEGSTORE_BENCH_LARGE", "") not in ("", "0")
TARGET_BYTES = (1024 if LARGE else 128) * MIB
SEGMENT_BYTES = 64 * MIB
CHUNK_RECORDS = 200_000  # records encoded per append_columns call
_STORE = "recovery-store"
TOPIC = "bench"


def _log_files(path: str) -> list[str]:
    d = os.path.join(path, f"{TOPIC}-0")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".log"))


def recovery_store_cache(_bench=None) -> dict:
    """asv ``setup_cache``: write the store (128 MiB, or 1 GiB with SEGSTORE_BENCH_LARGE=1)."""
    path = os.path.abspath(_STORE)
    shutil.rmtree(path, ignore_errors=True)
    store = segstore.open(path)
    store.create_topic(TOPIC, 1, {"segment.bytes": SEGMENT_BYTES})
    lg = store.partition(TOPIC, 0)
    rng = np.random.default_rng(SEED)
    written = 0
    while written < TARGET_BYTES:
        n = CHUNK_RECORDS
        keys = np.frombuffer(rng.bytes(n * KEY_SIZE), dtype=np.uint8).reshape(n, KEY_SIZE)
        values = np.frombuffer(rng.bytes(n * VALUE_SIZE), dtype=np.uint8).reshape(n, VALUE_SIZE)
        stamps = BASE_TIMESTAMP_MS + lg.log_end_offset + np.arange(n, dtype=np.int64)
        info = lg.append_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys),
                                 stamps, records_per_batch=RECORDS_PER_BATCH)
        written += info.size_bytes
    records = lg.log_end_offset
    store.close()
    files = _log_files(path)
    return {"path": path, "records": records, "log_bytes": sum(os.path.getsize(f) for f in files),
            "segments": len(files)}


# asv reads setup_cache's timeout from the function itself.
recovery_store_cache.timeout = 1800


def make_unclean(path: str) -> None:
    """As after a crash: no clean-shutdown marker, no recovery point (recover from offset 0)."""
    for name in (CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass


def recover(path: str, expected_records: int) -> float:
    """Open the unclean store (the recovery) and check it; returns the open's wall time. The
    close that follows flushes the recovered segments (durability work, not recovery) and is
    left out of the returned time."""
    t0 = time.perf_counter()
    store = segstore.open(path)
    elapsed = time.perf_counter() - t0
    try:
        lg = store.partition(TOPIC, 0)
        if lg.log_end_offset != expected_records:
            raise AssertionError(f"recovered {lg.log_end_offset} records, wrote {expected_records}")
    finally:
        store.close()
    return elapsed


def read_logs(path: str) -> list[bytes]:
    out = []
    for f in _log_files(path):
        with open(f, "rb") as fh:
            out.append(fh.read())
    return out


def crc_all(buffers) -> None:
    for b in buffers:
        crc32c.crc32c(b)


class Recovery:
    """Wall time of an unclean open (recovery of every segment) and of crc32c over the bytes."""

    setup_cache = recovery_store_cache
    number = 1
    repeat = (2, 5, 60.0)
    warmup_time = 0
    timeout = 1800

    def setup(self, meta):
        make_unclean(meta["path"])  # runs before every timed call

    def time_open_unclean_recovery(self, meta):
        recover(meta["path"], meta["records"])


class CRC32C:
    """The baseline: crc32c over every .log file's bytes, already in memory."""

    setup_cache = recovery_store_cache
    timeout = 1800

    def setup(self, meta):
        self.buffers = read_logs(meta["path"])

    def time_crc32c_package(self, meta):
        crc_all(self.buffers)


class RatioRecovery:
    """Recovery throughput relative to crc32c's over the same bytes (target >= 0.5)."""

    setup_cache = recovery_store_cache
    timeout = 1800
    repeats = 3

    def setup(self, meta):
        self.buffers = read_logs(meta["path"])

    def _times(self, meta) -> tuple[float, float]:
        """Best (crc32c, recovery) wall times, interleaved, GC off; the store is made unclean
        before each recovery, outside the timing."""
        best_crc = best_rec = float("inf")
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                crc_all(self.buffers)
                t1 = time.perf_counter()
                make_unclean(meta["path"])
                rec = recover(meta["path"], meta["records"])
                best_crc = min(best_crc, t1 - t0)
                best_rec = min(best_rec, rec)
                gc.collect()
        finally:
            if gc_was_enabled:
                gc.enable()
        return best_crc, best_rec

    def track_ratio_recovery_vs_crc32c(self, meta):
        t_crc, t_rec = self._times(meta)
        return round(t_crc / t_rec, 3)

    track_ratio_recovery_vs_crc32c.unit = "x"

    def track_recovery_mb_per_s(self, meta):
        _, t_rec = self._times(meta)
        return round(meta["log_bytes"] / MIB / t_rec, 1)

    track_recovery_mb_per_s.unit = "MiB/s"

    def track_crc32c_mb_per_s(self, meta):
        t_crc, _ = self._times(meta)
        return round(meta["log_bytes"] / MIB / t_crc, 1)

    track_crc32c_mb_per_s.unit = "MiB/s"


# --------------------------------------------------------------------------------------------
# Read-only opens of a store of many partitions (what every Spark read task does).

MANY_TOPICS, MANY_PARTITIONS = 20, 50
_MANY_STORE = "many-partitions-store"


def many_partitions_cache(_bench=None) -> str:
    """asv ``setup_cache``: 20 topics of 50 partitions, ten 100-byte records in each."""
    path = os.path.abspath(_MANY_STORE)
    shutil.rmtree(path, ignore_errors=True)
    with segstore.open(path) as store:
        for t in range(MANY_TOPICS):
            store.create_topic(f"t{t}", MANY_PARTITIONS)
            for p in range(MANY_PARTITIONS):
                store.partition(f"t{t}", p).append_batch([b"x" * VALUE_SIZE] * 10)
    return path


class ReadOnlyOpenManyPartitions:
    """``segstore.open(path, readonly=True)`` of a 1,000-partition store, then one partition
    read, as a Spark task reading one offset range does. A read-only log lists its directory
    when first used, so the open costs the store's listing, not the partitions'. (No target;
    before the lazy listing the open took about 9x longer, see docs/performance.md.)"""

    setup_cache = many_partitions_cache
    timeout = 120

    def time_open_readonly_and_read_one_partition(self, path):
        with segstore.open(path, readonly=True) as store:
            store.partition("t7", 3).read(0)

    def time_list_every_partition_directory(self, path):
        """The floor of an eager open: one listing per partition directory."""
        for t in range(MANY_TOPICS):
            for p in range(MANY_PARTITIONS):
                os.listdir(os.path.join(path, f"t{t}-{p}"))


class WritableOpenManyPartitions:
    """A writable ``segstore.open(path)`` of the same 1,000-partition store after a clean
    shutdown, then ``close()``: what every Spark commit pays around publishing its files
    (with 4 recovery threads, as the Spark writer opens). Each log loads at its first use
    (log_map.py), so a commit pays for the partitions it writes; ``load_every_log`` is the
    cost of a pass over all of them (retention, ``metrics()``), which Kafka's LogManager pays
    at every startup. (No target; the figures before are in docs/performance.md.)"""

    params = [1, 4]
    param_names = ["threads"]
    setup_cache = many_partitions_cache
    timeout = 180

    def time_open_append_to_one_partition_and_close(self, path, threads):
        with segstore.open(path, {"num.recovery.threads.per.data.dir": threads}) as store:
            store.partition("t7", 3).append_batch([b"x" * VALUE_SIZE])

    def time_open_load_every_log_and_close(self, path, threads):
        with segstore.open(path, {"num.recovery.threads.per.data.dir": threads}) as store:
            store.metrics()


class CloseAfterAppends:
    """``close()`` of a writable store after 1,000 records were appended to each of its 8
    partitions: every log flushed (fsync) and closed, and a producer snapshot written (fsync),
    on ``num.recovery.threads.per.data.dir`` threads. Reported against one thread, same run."""

    params = [1, 4]
    param_names = ["threads"]
    number = 1          # each sample closes a store its setup opened and wrote
    repeat = (5, 15, 30.0)
    timeout = 120

    def setup(self, threads):
        self.path = os.path.abspath(f"close-store-{threads}")
        shutil.rmtree(self.path, ignore_errors=True)
        self.store = segstore.open(self.path, {"num.recovery.threads.per.data.dir": threads})
        self.store.create_topic(TOPIC, 8)
        values = [b"v" * VALUE_SIZE] * 1000
        for p in range(8):
            self.store.partition(TOPIC, p).append_batch(values)

    def teardown(self, threads):
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def time_close(self, threads):
        self.store.close()
