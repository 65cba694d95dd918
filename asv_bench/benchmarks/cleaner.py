"""The log cleaner: offset map build, a full cleaning round, two threads, peak memory.

Targets (the cleaner issue), all same-run ratios:
  * offset map build >= 10x a plain-Python dict mapping key -> last offset over the same records
    (``track_ratio_map_build_vs_dict``);
  * a full cleaning round end to end (map, filter, write, fsync, swap) >= 2x that dict replay
    alone (``track_ratio_round_vs_dict``);
  * two threads cleaning two such partitions >= 1.6x one thread (``track_ratio_two_threads``);
  * peak memory of a round <= the dedupe buffer + 64 MiB (``track_round_peak_overhead_mib``:
    peak RSS growth of a round minus the dedupe buffer, measured in a fresh process).

Data: 1,000,000 records in 10 sealed segments (plus the empty active segment), 16-byte keys drawn
uniformly from 100,000 distinct keys, 100-byte values (seeded random bytes), 1,000 records per
uncompressed batch; Kafka's default dedupe buffer (128 MiB, one thread). The dict replay's input
is the keys as Python ``bytes`` objects, already in memory, with their offsets: the dict does no
I/O and no decoding at all, so it is the cheapest plain-Python rendering of the map's job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np

import segstore
from segstore import _core
from segstore.cleaner import Cleaner, Throttler
from segstore.cleaner.manager import segments_in_range
from segstore.cleaner.stats import CleanerStats
from segstore.columns import BinaryColumn

from .common import (BASE_TIMESTAMP_MS, KEY_SIZE, RECORDS_PER_BATCH, SEED, VALUE_SIZE,
                     best_of_pair, best_of_pair_fresh)

MIB = 1 << 20
N_RECORDS = 1_000_000
N_KEYS = 100_000
N_SEGMENTS = 10
DEDUPE_BYTES = 128 * MIB
TOPIC = "cdc"
_STORE = "cleaner-store"
_KEYS = "cleaner-keys.npy"


def _write_partition(lg, keys_table, key_idx, rng) -> None:
    chunk = 100_000
    for lo in range(0, N_RECORDS, chunk):
        n = min(chunk, N_RECORDS - lo)
        keys = keys_table[key_idx[lo:lo + n]]
        values = np.frombuffer(rng.bytes(n * VALUE_SIZE), dtype=np.uint8).reshape(n, VALUE_SIZE)
        stamps = BASE_TIMESTAMP_MS + lo + np.arange(n, dtype=np.int64)
        lg.append_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys), stamps,
                          records_per_batch=RECORDS_PER_BATCH)
    lg.roll()


def cleaner_store_cache(_bench=None) -> dict:
    """asv ``setup_cache``: a store with two identical-shaped compacted partitions."""
    path = os.path.abspath(_STORE)
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(SEED)
    keys_table = np.frombuffer(rng.bytes(N_KEYS * KEY_SIZE), dtype=np.uint8).reshape(
        N_KEYS, KEY_SIZE)
    key_idx = rng.integers(0, N_KEYS, size=N_RECORDS)
    # ~127 bytes a record: segments of a tenth of the data each.
    seg_bytes = (N_RECORDS * 127) // N_SEGMENTS + 64 * 1024
    with segstore.open(path) as store:
        store.create_topic(TOPIC, 2, {"cleanup.policy": "compact", "segment.bytes": seg_bytes})
        for p in range(2):
            _write_partition(store.partition(TOPIC, p), keys_table, key_idx, rng)
        segs = len(store.partition(TOPIC, 0).segments)
    np.save(_KEYS, keys_table[key_idx])
    return {"path": path, "segments": segs, "dir": os.getcwd()}


cleaner_store_cache.timeout = 1800


def _fresh_copy(meta, name: str) -> str:
    dst = os.path.join(meta["dir"], name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(meta["path"], dst)
    # Untimed: write the copy's 254 MB back now, or the writeback runs during the timed round
    # (kernel flusher threads taking CPU from the cleaner threads, the round's fsyncs queued
    # behind it).
    os.sync()
    return dst


def dict_replay(keys: list) -> dict:
    """The peer: a plain-Python dict of key -> last offset over the records."""
    last = {}
    for offset, key in enumerate(keys):
        last[key] = offset
    return last


def _key_list(meta) -> list:
    arr = np.load(os.path.join(meta["dir"], _KEYS))
    flat = arr.tobytes()
    return [flat[i:i + KEY_SIZE] for i in range(0, len(flat), KEY_SIZE)]


class _Store:
    """Opens a fresh copy of the cached store for each timed round."""

    def _open(self, meta, threads: int = 1):
        self.copy = _fresh_copy(meta, "cleaner-run")
        self.store = segstore.open(self.copy, config={
            "log.cleaner.threads": threads, "log.cleaner.dedupe.buffer.size": DEDUPE_BYTES * threads})
        return self.store

    def _close(self):
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
            self.store = None


class MapBuild:
    """Offset map build over the 10 segments vs the dict replay (target >= 10x)."""

    setup_cache = cleaner_store_cache
    timeout = 1800
    repeats = 5

    def setup(self, meta):
        self.keys = _key_list(meta)
        self.store = segstore.open(meta["path"], readonly=True)
        self.log = self.store.partition(TOPIC, 0)
        self.cleaner = Cleaner(0, _core.OffsetMap(DEDUPE_BYTES), 1 << 20, Throttler(float("inf")),
                               lambda: 0)
        self.end = self.log.segments[-1].base_offset
        self.stats = CleanerStats()
        self.distinct = len(set(self.keys[:self.end]))

    def teardown(self, meta):
        self.store.close()

    def _map(self):
        self.cleaner.build_offset_map(self.log, 0, self.end, self.stats)
        if self.cleaner.offset_map.size != self.distinct:
            raise AssertionError("the map does not hold every distinct key")

    def time_map_build(self, meta):
        self._map()

    def time_dict_replay(self, meta):
        dict_replay(self.keys)

    def track_ratio_map_build_vs_dict(self, meta):
        t_dict, t_map = best_of_pair(lambda: dict_replay(self.keys), self._map, self.repeats)
        return round(t_dict / t_map, 3)

    track_ratio_map_build_vs_dict.unit = "x"


class Round(_Store):
    """A full cleaning round (map, filter, write, fsync, swap) vs the dict replay (>= 2x)."""

    setup_cache = cleaner_store_cache
    timeout = 1800
    repeats = 3

    def setup(self, meta):
        self.keys = _key_list(meta)
        self.distinct = len(set(self.keys[:_end_offset(meta)]))

    def teardown(self, meta):
        self._close()

    def _prepare(self, meta):
        self._close()
        self._open(meta)

    def _round(self):
        stats = self.store.compact(TOPIC, 0, force=True)
        if len(stats) != 1 or stats[0].messages_written != self.distinct:
            raise AssertionError(f"unexpected round: {stats}")

    def _fresh_round(self, meta):
        self._prepare(meta)
        return self._round, self._close

    def track_ratio_round_vs_dict(self, meta):
        t_dict, t_round = best_of_pair_fresh(lambda: (lambda: dict_replay(self.keys), None),
                                             lambda: self._fresh_round(meta), self.repeats)
        return round(t_dict / t_round, 3)

    track_ratio_round_vs_dict.unit = "x"

    def track_round_mb_per_s(self, meta):
        size = sum(s.size for s in _sealed(meta))
        _, t_round = best_of_pair_fresh(lambda: (lambda: None, None),
                                        lambda: self._fresh_round(meta), self.repeats)
        return round(size / MIB / t_round, 1)

    track_round_mb_per_s.unit = "MiB/s"


def _sealed(meta):
    with segstore.open(meta["path"], readonly=True) as store:
        segs = store.partition(TOPIC, 0).segments
        return [s for s in segs[:-1]]


def _end_offset(meta) -> int:
    with segstore.open(meta["path"], readonly=True) as store:
        return store.partition(TOPIC, 0).segments[-1].base_offset


class TwoThreads(_Store):
    """Two partitions cleaned by two threads at once vs one after the other (>= 1.6x)."""

    setup_cache = cleaner_store_cache
    timeout = 1800
    repeats = 3

    def teardown(self, meta):
        self._close()

    def _both(self, parallel: bool):
        store = self.store
        if parallel:
            out = []
            ts = [threading.Thread(target=lambda p=p: out.append(store.compact(TOPIC, p,
                                                                                force=True)))
                  for p in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if len(out) != 2:
                raise AssertionError("a cleaning thread failed")
        else:
            store.compact(TOPIC, 0, force=True)
            store.compact(TOPIC, 1, force=True)

    def track_ratio_two_threads(self, meta):
        def fresh(parallel):
            self._close()
            self._open(meta, threads=2)
            return (lambda: self._both(parallel)), self._close
        t_one, t_two = best_of_pair_fresh(lambda: fresh(False), lambda: fresh(True), self.repeats)
        return round(t_one / t_two, 3)

    track_ratio_two_threads.unit = "x"


_PEAK_CHILD = r"""
import json, resource, sys, segstore
path = sys.argv[1]
store = segstore.open(path, config={"log.cleaner.dedupe.buffer.size": int(sys.argv[2])})
lg = store.partition(sys.argv[3], 0)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store.compact(sys.argv[3], 0, force=True)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store.close()
print(json.dumps({"base_kib": base, "peak_kib": peak}))
"""


class Memory:
    """Peak RSS growth of one round beyond the dedupe buffer, in a fresh process (<= 64 MiB)."""

    setup_cache = cleaner_store_cache
    timeout = 1800

    def track_round_peak_overhead_mib(self, meta):
        copy = _fresh_copy(meta, "cleaner-mem")
        try:
            out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, copy, str(DEDUPE_BYTES),
                                  TOPIC], check=True, capture_output=True, text=True).stdout
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        r = json.loads(out.strip().splitlines()[-1])
        growth = (r["peak_kib"] - r["base_kib"]) / 1024.0
        return round(growth - DEDUPE_BYTES / MIB, 1)

    track_round_peak_overhead_mib.unit = "MiB"
