"""Retention pass over a store where nothing expires, against listing its partition directories.

Target (retention issue): a retention pass over a store with 10,000 segments across 100 partitions
where nothing expires costs no more than a directory listing of those partitions measured in the
same run, times 2. ``track_ratio_retention_vs_listdir`` returns ``retention time / listing time``
(best of interleaved repeats, garbage collector off): the target is a value of 2 or less, so here,
unlike the codec ratios, lower is better.

The store (built once per ``asv run`` by :func:`retention_store_cache` in asv's cache directory):
100 partitions of one topic with ``cleanup.policy=delete``, ``retention.ms`` 7 days and
``retention.bytes`` 10x a partition's size, so all three rules are evaluated and none deletes.
Each segment holds 4 one-record batches with timestamps ``BASE_TIMESTAMP_MS``; the store's clock
is fixed at ``BASE_TIMESTAMP_MS + 1 hour``. Partition 0 is written through ``PartitionLog`` (small
``segment.bytes``, so appends roll), then its files are copied into the other 99 partitions
(building 10,000 segments through the log would take minutes: every roll fsyncs).

Parameter ``segments_per_partition``: 100 is the issue's 10,000 segments; 50 (5,000 segments) is
measured too. Segments open their files lazily (Kafka's LazyIndex idea), so an open store holds
descriptors only for the segments it touched; if the machine's ``RLIMIT_NOFILE`` were still too
low the case is skipped ("n/a") with the reason on stderr. A pass where nothing expires looks at one segment per
partition per rule and sums the segment sizes once, while a listing grows with the number of
files, so the smaller store is the harder case for the target.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys

import numpy as np

from .common import BASE_TIMESTAMP_MS, best_of_pair

PARTITIONS = 100
SEGMENTS_PER_PARTITION = (50, 100)
BATCHES_PER_SEGMENT = 4
RECORD_VALUE_SIZE = 20
NOW_MS = BASE_TIMESTAMP_MS + 3_600_000
# Measured: the .log fd, plus the fd CPython's mmap dups for the time index (a sealed segment has
# its final time-index entry; these small segments have empty offset indexes, which stay unmapped).
FDS_PER_SEGMENT = 2
FDS_PER_PARTITION = 2        # maps of the active segment's .log and of the first segment's
FD_MARGIN = 256
TOPIC = "t"


def _clock() -> int:
    return NOW_MS


def _raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def _fds_needed(segments_per_partition: int) -> int:
    # Segments open their files lazily: a pass touches only each partition's active segment.
    return PARTITIONS * (FDS_PER_SEGMENT + FDS_PER_PARTITION) + FD_MARGIN


def _store_dir(root: str, segments_per_partition: int) -> str:
    return os.path.join(root, f"retention-store-{segments_per_partition}")


def _build(path: str, segments_per_partition: int) -> None:
    """100 partitions of ``segments_per_partition`` segments of 4 one-record batches."""
    import segstore
    from segstore import _core
    from segstore.checkpoint import RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile
    from segstore.columns import BinaryColumn

    shutil.rmtree(path, ignore_errors=True)
    one = BinaryColumn.from_fixed(np.zeros((1, RECORD_VALUE_SIZE), np.uint8))
    batch_size = len(_core.encode_columns(one, None, BASE_TIMESTAMP_MS, records_per_batch=1).data)
    n = (segments_per_partition - 1) * BATCHES_PER_SEGMENT + 1  # the active segment: one batch
    values = BinaryColumn.from_fixed(np.zeros((n, RECORD_VALUE_SIZE), np.uint8))
    config = {
        "segment.bytes": BATCHES_PER_SEGMENT * batch_size,
        "segment.index.bytes": 4096,
        "retention.ms": 7 * 24 * 3_600_000,
    }
    with segstore.open(path, clock=_clock) as store:
        store.create_topic(TOPIC, num_partitions=PARTITIONS, config=config)
        log = store.partition(TOPIC, 0)
        log.append_columns(values, timestamps_ms=np.full(n, BASE_TIMESTAMP_MS, np.int64),
                           records_per_batch=1)
        if len(log.segments) != segments_per_partition:
            raise AssertionError(f"built {len(log.segments)} segments, not {segments_per_partition}")
        store.alter_topic_config(TOPIC, {"retention.bytes": 10 * log.size_bytes})
        leo = log.log_end_offset
    src = os.path.join(path, f"{TOPIC}-0")
    files = sorted(os.listdir(src))
    for p in range(1, PARTITIONS):
        dst = os.path.join(path, f"{TOPIC}-{p}")
        for name in os.listdir(dst):
            os.unlink(os.path.join(dst, name))
        for name in files:
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    # Every partition is now as flushed as partition 0: a clean open recovers nothing.
    OffsetCheckpointFile(os.path.join(path, RECOVERY_POINT_CHECKPOINT)).write(
        {segstore.TopicPartition(TOPIC, p): leo for p in range(PARTITIONS)})


def retention_store_cache(_bench=None) -> dict:
    """asv ``setup_cache``: build one store per ``segments_per_partition`` that this machine's
    file descriptor limit can open (the others are recorded as skipped, with the reason)."""
    root = os.getcwd()
    limit = _raise_fd_limit()
    built, skipped = {}, {}
    for spp in SEGMENTS_PER_PARTITION:
        need = _fds_needed(spp)
        if need > limit:
            skipped[spp] = (f"{PARTITIONS * spp} open segments need about {need} file "
                            f"descriptors; RLIMIT_NOFILE allows {limit}")
            continue
        path = _store_dir(root, spp)
        _build(path, spp)
        built[spp] = path
    return {"built": built, "skipped": skipped}


retention_store_cache.timeout = 600


class RetentionVsListdir:
    """``store.enforce_retention()`` (nothing expires) and ``os.listdir`` of every partition."""

    setup_cache = retention_store_cache
    params = list(SEGMENTS_PER_PARTITION)
    param_names = ["segments_per_partition"]
    timeout = 300
    repeats = 15

    def setup(self, cache, segments_per_partition):
        import segstore

        if segments_per_partition not in cache["built"]:
            reason = cache["skipped"].get(segments_per_partition, "not built")
            print(f"retention benchmark skipped: {reason}", file=sys.stderr)
            raise NotImplementedError(reason)
        _raise_fd_limit()
        path = cache["built"][segments_per_partition]
        self.store = segstore.open(path, clock=_clock)
        self.dirs = [self.store.partition(TOPIC, p).directory for p in range(PARTITIONS)]
        segments = sum(len(self.store.partition(TOPIC, p).segments) for p in range(PARTITIONS))
        if segments != PARTITIONS * segments_per_partition:
            raise AssertionError(f"the store has {segments} segments")
        # Sanity, and the steady state of a periodic task: every segment's largest timestamp
        # that a pass looks at is loaded by the first pass.
        report = self.store.enforce_retention()
        if report.segments_deleted or report.errors or len(report.partitions) != PARTITIONS:
            raise AssertionError(f"a pass over the benchmark store changed something:\n{report}")

    def teardown(self, cache, segments_per_partition):
        store = getattr(self, "store", None)
        if store is not None:
            store.close()

    def _retention(self):
        self.store.enforce_retention()

    def _listdir(self):
        for d in self.dirs:
            os.listdir(d)

    def time_retention_pass(self, cache, segments_per_partition):
        self._retention()

    def time_listdir_partitions(self, cache, segments_per_partition):
        self._listdir()

    def track_ratio_retention_vs_listdir(self, cache, segments_per_partition):
        t_retention, t_listdir = best_of_pair(self._retention, self._listdir, self.repeats)
        return t_retention / t_listdir

    track_ratio_retention_vs_listdir.unit = "x"
