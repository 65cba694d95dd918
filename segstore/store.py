"""LogStore: a directory of partition logs, Kafka's LogManager for one process.

Layout: ``<root>/<topic>-<partition>/`` per partition (Kafka's names), the root-level
checkpoint files and ``.kafka_cleanshutdown`` of a Kafka log dir, topic metadata (partition
count, config overrides) in ``<root>/.segstore/topics/<topic>.json``, and ``<root>/.lock``, the
exclusive writer lock. A directory without segstore metadata (a Kafka broker's log dir) opens too:
each ``<topic>-<n>`` directory becomes a partition with the store's default topic config.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time
from collections import abc
from functools import partial
from typing import Callable, Iterable, Mapping, Optional

from . import _core
from .checkpoint import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT,
                         RECOVERY_POINT_CHECKPOINT, CheckpointError, OffsetCheckpointFile,
                         create_marker, fsync_dir, write_atomic_many)
from .config import StoreConfig, TopicConfig
from .errors import (BufferTypeError, InvalidConfigError, InvalidRecordError, InvalidTopicError,
                     KafkaStorageError, OffsetTypeError, ReadOnlyStoreError, StoreClosedError,
                     UnknownTopicOrPartitionError, is_time_ms, now_argument, offset_argument)
from .file_lock import FileLock
from .log import PartitionLog
from .log_map import LogMap
from .log_isolation import read_committed
from .records import RecordMetadata, TopicPartition
from .recovery_threads import run_jobs
from .segment_checks import Problem
from .topic import (PARTITION_MARKER, damaged_topic_error, discover_topics, hosted_partitions,
                    mark_partitions, meta_path, topic_meta_dir, topic_partitions,
                    writable_open_error)
from .cleaner import LogCleaner
from .segment_delete_queue import SegmentDeleteQueue
from .staged_commit import settle as settle_staged_commits
from .store_retention import RetentionPasses
from .store_services import ScheduledTasks
from .store_topics import TopicAdmin

log = logging.getLogger("segstore.store")

# Kafka's log.initial.task.delay.ms: the first retention pass runs this long after startup (or
# after one log.retention.check.interval.ms, when that is shorter).
RETENTION_INITIAL_DELAY_MS = 30_000


def _system_clock() -> int:
    return int(time.time() * 1000)


class LogStore(TopicAdmin, ScheduledTasks, RetentionPasses):
    """Topics and partitions under one root directory. Use :func:`segstore.open`."""

    def __init__(self, path: str, config: Optional[Mapping] = None,
                 clock: Optional[Callable[[], int]] = None, readonly: bool = False):
        if not isinstance(path, (str, os.PathLike)) or (clock is not None and not callable(clock)):
            raise InvalidConfigError(f"a store needs a str or os.PathLike path and a callable "
                                     f"clock (milliseconds), not {path!r} and {clock!r}")
        if os.fspath(path) == "":
            # abspath("") is the current directory: the store would be made there.
            raise InvalidConfigError("a store needs a path, not ''")
        self.path = os.path.abspath(path)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise InvalidConfigError(f"{self.path} is not a directory: a store is one")
        self.config = StoreConfig.from_dict(config or {})
        self.clock = clock or _system_clock
        self.readonly = readonly
        self._lock = threading.RLock()
        self._closed = False
        self._file_lock = FileLock(self.path)
        self._topics: dict[str, dict] = {}        # name -> {"partitions": n, "config": TopicConfig}
        # Writable logs load at first use after a clean close.
        self._logs = LogMap(self.path, self._compacted_topic)
        self._damaged: dict = {}  # name -> CorruptMetadataError, see _discover
        self._deletes = SegmentDeleteQueue(self.clock)  # ``.deleted`` segments awaiting removal
        self._round_robin = itertools.count()
        self._services: list[threading.Thread] = []
        self._stop = threading.Event()
        self._last_checkpoint_ms = self.clock()
        if not is_time_ms(self._last_checkpoint_ms):
            # Checked once, before anything is made: a float clock (time.time() * 1000) broke
            # appends, tick() and close(), which then left the store locked.
            raise InvalidConfigError(f"clock() must return int milliseconds since the epoch "
                                     f"(0 to 2**63 - 1), got {self._last_checkpoint_ms!r}")
        self._last_checkpoint_ms = int(self._last_checkpoint_ms)
        self._next_retention_ms = self._last_checkpoint_ms + min(
            RETENTION_INITIAL_DELAY_MS, self.config.retention_check_interval_ms)
        self._next_expiration_ms = (self._last_checkpoint_ms
                                    + self.config.producer_id_expiration_check_interval_ms)
        # The map itself: the cleaner's lookups of one log (compact(topic)) load only that one.
        self.cleaner = LogCleaner(self.path, self.config, lambda: self._logs, self.clock,
                                  retention=self._retain_compacted)
        if readonly:
            if not os.path.isdir(self.path):
                raise FileNotFoundError(errno.ENOENT, "no segstore directory", self.path)
            self._load(clean_shutdown=True)
            return
        os.makedirs(topic_meta_dir(self.path), exist_ok=True)
        self._file_lock.acquire()
        try:
            topics = self._discover()  # before the marker goes: a refused open changes nothing
            marker = os.path.join(self.path, CLEAN_SHUTDOWN_FILE)
            clean = os.path.exists(marker)
            if clean:
                os.unlink(marker)  # a crash while loading must count as unclean (KAFKA-10471)
                fsync_dir(self.path)
            self._load(clean_shutdown=clean, topics=topics)
        except BaseException:
            self._file_lock.release()
            raise
        try:
            # A Spark commit that died left records no job committed: they go before anything
            # can append after them, expire them or compact older values away with them.
            settle_staged_commits(self)
        except BaseException:
            self.close()  # the manifest stays: the next writable open tries again
            raise

    # -- loading ----------------------------------------------------------------------------
    def _checkpoint(self, name: str, clean_shutdown: bool) -> dict:
        try:
            return OffsetCheckpointFile(os.path.join(self.path, name)).read()
        except CheckpointError as e:
            # What ignoring the file costs: after an unclean shutdown a recovery from each
            # log's start, or log start offsets back at each log's first segment (a
            # DeleteRecords above it is forgotten).
            instead = ("" if self.readonly else
                       " (each log starts at its first segment instead)"
                       if name != RECOVERY_POINT_CHECKPOINT else
                       " (the last shutdown was clean: nothing is recovered)" if clean_shutdown
                       else " (recovering every log from its start instead)")
            log.warning("ignoring %s%s", e, instead)
            return {}

    def _discover(self) -> dict:
        """The topics on disk. A topic whose metadata file cannot be read makes a writable
        store refuse to open (it cannot run without that topic, nor guess its config); a
        read-only one sets it aside."""
        defaults = self.config.topic_defaults()
        topics, damaged = discover_topics(
            self.path, lambda overrides: TopicConfig.from_dict(overrides, defaults=defaults))
        if damaged and not self.readonly:
            raise writable_open_error(self.path, damaged)
        for name in sorted(set(damaged) - set(self._damaged)):  # once, not at every reload
            log.warning("%s", damaged_topic_error(damaged[name]))
        self._damaged = damaged
        return topics

    def _mark_partition(self, lg: PartitionLog) -> None:
        # Stores written before the markers existed get them when a writable open loads their
        # logs. The loader listed the directory: most have their marker already.
        if PARTITION_MARKER in lg.load_result.listing or \
                not os.path.exists(meta_path(self.path, lg.topic)):
            return
        try:
            mark_partitions(self.path, lg.topic, [lg.partition])
        except OSError as e:  # only a safeguard: not worth refusing the open for
            log.warning("cannot mark the partition directory %s: %s", lg.directory, e)

    def _mark_topics(self) -> None:
        # Logs not loaded yet have no listing to check their markers against, and an older
        # store's topic whose logs no session loads would stay unmarked: a lost metadata file
        # would then reopen it as a Kafka log dir's, with the default config. One stat per
        # topic: a topic's partitions are marked together (create_topic, this, alter).
        for name, meta in self._topics.items():
            parts = hosted_partitions(meta)
            if not parts or os.path.exists(os.path.join(
                    self.path, f"{name}-{parts[0]}", PARTITION_MARKER)) or \
                    not os.path.exists(meta_path(self.path, name)):
                continue
            try:
                mark_partitions(self.path, name, parts)
            except OSError as e:  # only a safeguard: not worth refusing the open for
                log.warning("cannot mark the partition directories of topic %r: %s", name, e)

    def _load(self, clean_shutdown: bool, reuse: Optional[dict] = None,
              topics: Optional[dict] = None) -> None:
        topics = self._discover() if topics is None else topics
        recovery = self._checkpoint(RECOVERY_POINT_CHECKPOINT, clean_shutdown)
        starts = self._checkpoint(LOG_START_OFFSET_CHECKPOINT, clean_shutdown)
        self._topics.update(topics)
        todo = []
        for topic, meta in self._topics.items():
            for p in hosted_partitions(meta):
                tp = TopicPartition(topic, p)
                if reuse and tp in reuse:
                    self._logs.add(tp, reuse[tp])
                else:
                    todo.append((tp, meta["config"]))
        if clean_shutdown and not self.readonly:
            # Nothing to recover, and the lock keeps other writers out: each log loads at its
            # first use (log_map.py), so a commit to a few partitions of a large store does
            # not load them all.
            # A log the recovery-point checkpoint lacks (the file was unreadable, say) loads
            # now: its load sets its recovery point to its log end, which checkpoints then
            # record; deferred, they would write 0, and a later crash would recover it whole.
            eager = []
            for tp, cfg in todo:
                if tp not in recovery:
                    eager.append((tp, cfg))
                    continue
                rp, start = recovery[tp], starts.get(tp, 0)
                self._logs.defer(tp, partial(self._load_deferred, tp, rp, start), rp, start)
            self._mark_topics()
            todo = eager
        # A read-only log lists nothing until used: only writable opens have work to share.
        threads = 1 if self.readonly else self.config.num_recovery_threads_per_data_dir
        opened = run_jobs(threads, [
            partial(self._open_log, tp, cfg, recovery.get(tp, 0), starts.get(tp, 0),
                    clean_shutdown) for tp, cfg in todo], keep_going=False)
        for (tp, _), (lg, error) in zip(todo, opened):
            if error is not None:
                raise error  # the first failed partition, in order
            if lg is not None:
                self._logs.add(tp, lg)
                if not self.readonly:
                    self._mark_partition(lg)

    def _compacted_topic(self, name: str) -> bool:
        meta = self._topics.get(name)
        return meta is not None and meta["config"].compact

    def _load_deferred(self, tp: TopicPartition, recovery_point: int,
                       log_start: int) -> PartitionLog:
        # Run by LogMap at the log's first lookup, with the topic's config as it is now.
        lg = self._open_log(tp, self._topics[tp.topic]["config"], recovery_point, log_start,
                            True)
        # alter_topic_config may have run meanwhile and found no loaded log to update.
        lg.config = self._topics[tp.topic]["config"]
        self._mark_partition(lg)
        return lg

    def _open_log(self, tp: TopicPartition, config: TopicConfig, recovery_point: int,
                  log_start: int, clean: bool) -> PartitionLog:
        lg = PartitionLog(self._partition_dir(tp), tp.topic, tp.partition, config, self.clock,
                          readonly=self.readonly, recovery_point=recovery_point,
                          log_start_offset=log_start,
                          had_clean_shutdown=clean, delete_later=self._deletes.schedule,
                          producer_id_expiration_ms=self.config.producer_id_expiration_ms)
        if not self.readonly:
            lg.truncation_listeners.append(self._on_truncated)
        return lg

    def _partition_dir(self, tp: TopicPartition) -> str:
        return os.path.join(self.path, f"{tp.topic}-{tp.partition}")

    def _on_truncated(self, tp: TopicPartition, offset: int) -> None:
        self.cleaner.manager.maybe_truncate_checkpoint(tp, offset)

    # -- checks -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyStoreError(f"store {self.path} is open read-only")

    # -- topics (creating, deleting and altering them: store_topics.py) ----------------------
    def _topic(self, name: str) -> dict:
        self._check_open()
        if not isinstance(name, str):
            raise InvalidTopicError(f"a topic name is a str, not {type(name).__name__}")
        if self.readonly and name not in self._topics:
            self._reload_readonly()
        if name in self._damaged:
            raise damaged_topic_error(self._damaged[name])
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}") from None

    def _reload_readonly(self) -> None:
        # Pick up topics created since; logs already handed out stay open and usable.
        with self._lock:
            old_logs = self._logs.loaded()   # read-only logs are all loaded by the open
            self._topics, self._logs = {}, LogMap(self.path, self._compacted_topic)
            self._load(clean_shutdown=True, reuse=old_logs)
            for tp, lg in old_logs.items():
                if self._logs.get(tp) is not lg:
                    lg.close()

    def list_topics(self) -> list[str]:
        """Names of every topic, sorted (not those set aside, see :meth:`damaged_topics`)."""
        self._check_open()
        if self.readonly:
            self._reload_readonly()
        return sorted(self._topics)

    def damaged_topics(self) -> dict:
        """Topics set aside because their metadata file cannot be read, ``{name:
        CorruptMetadataError}`` (its ``file`` and ``reason``); :meth:`list_topics` leaves them
        out and using one raises the error. Only a read-only store has any: a writable open
        refuses a store with one."""
        self._check_open()
        if self.readonly:
            self._reload_readonly()
        return dict(self._damaged)

    def topic_config(self, name: str) -> TopicConfig:
        """A topic's effective configuration."""
        return self._topic(name)["config"]

    def describe_topic(self, name: str) -> dict:
        """Partition count, config overrides and per-partition offsets and sizes (of the
        partitions in this store: a Kafka broker's log dir lists only those it hosts)."""
        meta = self._topic(name)
        parts = []
        for p in hosted_partitions(meta):
            lg = self.partition(name, p)
            parts.append({"partition": p, "log_start_offset": lg.log_start_offset,
                          "log_end_offset": lg.log_end_offset, "segments": len(lg.segments),
                          "size_bytes": lg.size_bytes})
        return {"name": name, "partitions": meta["partitions"],
                "config": dict(meta["config"].overrides), "partition_info": parts}

    def partition(self, topic: str, partition: int) -> PartitionLog:
        """The log of one partition; UnknownTopicOrPartitionError for a partition the topic
        lacks, or one a Kafka broker's log dir does not host (see :meth:`partitions_for`)."""
        meta = self._topic(topic)
        partition = offset_argument(partition, "partition")
        if not 0 <= partition < meta["partitions"]:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {meta['partitions']})")
        if partition not in hosted_partitions(meta):
            raise UnknownTopicOrPartitionError(
                f"partition {topic}-{partition} is not in {self.path}: a Kafka broker's log dir "
                f"holds only the partitions it hosts ({list(hosted_partitions(meta))})")
        return self._logs[TopicPartition(topic, partition)]

    def partitions_for(self, topic: str) -> list[int]:
        """Partition numbers of a topic in this store: all of them, except in a Kafka broker's
        log dir, which holds only the partitions it hosts."""
        return list(hosted_partitions(self._topic(topic)))

    def num_partitions(self, topic: str) -> int:
        """A topic's partition count, the one its partitioner uses (for a topic found in a Kafka
        broker's log dir: one more than its highest partition there)."""
        return self._topic(topic)["partitions"]

    # -- records ----------------------------------------------------------------------------
    def partition_for(self, topic: str, key=None) -> int:
        """Where Kafka's default partitioner sends a key: murmur2 over :meth:`num_partitions`
        partitions; null keys round-robin over :meth:`partitions_for` (in a broker's log dir,
        the partitions it holds)."""
        meta = self._topic(topic)
        n = meta["partitions"]
        if key is None:
            # Kafka's partitioner spreads keyless records over the available partitions: in a
            # broker's log dir, the ones it holds.
            hosted = hosted_partitions(meta)
            return hosted[next(self._round_robin) % len(hosted)]
        try:
            if isinstance(key, str):
                key = key.encode("utf-8")
            return _core.murmur2_partition(key, n)
        except UnicodeEncodeError as e:  # a lone surrogate
            raise InvalidRecordError(f"key is not valid UTF-8 text: {e}") from None
        except BufferTypeError:  # not a contiguous byte buffer
            raise InvalidRecordError(f"a key must be bytes, str or None, not "
                                     f"{type(key).__name__}") from None

    def append(self, topic: str, value, key=None, headers=None, partition: Optional[int] = None,
               timestamp_ms: Optional[int] = None) -> RecordMetadata:
        """Append one record to a topic: to ``partition``, or where Kafka's default
        partitioner sends its key (murmur2; a record without a key goes to the next
        partition in turn, see :meth:`partition_for`)."""
        self._check_writable()
        if partition is None:
            partition = self.partition_for(topic, key)
        return self.partition(topic, partition).append(value, key=key, headers=headers,
                                                       timestamp_ms=timestamp_ms)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        """{TopicPartition: log start offset} (kafka-python's KafkaConsumer shape)."""
        return {tp: self.partition(*tp).log_start_offset for tp in topic_partitions(partitions)}

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    isolation_level: str = "read_uncommitted") -> dict:
        """{TopicPartition: log end offset}; with ``isolation_level="read_committed"`` the last
        stable offsets, as a read_committed consumer's ``end_offsets``."""
        committed = read_committed(isolation_level)
        return {tp: (lg.last_stable_offset if committed else lg.log_end_offset)
                for tp in topic_partitions(partitions) for lg in [self.partition(*tp)]}

    def offsets_for_times(self, timestamps: Mapping) -> dict:
        """{TopicPartition: OffsetAndTimestamp or None}: first offset with timestamp >= ts."""
        if not isinstance(timestamps, abc.Mapping):
            raise OffsetTypeError(f"timestamps must be a mapping of TopicPartition to timestamp, "
                                  f"not {type(timestamps).__name__}")
        # The keys checked as pairs first (TopicPartition(*key) raised TypeError for others).
        return {tp: self.partition(*tp).offset_for_time(ts)
                for tp, ts in zip(topic_partitions(timestamps.keys()), timestamps.values())}

    # -- compaction -------------------------------------------------------------------------
    @property
    def cleaner_manager(self):
        """The LogCleanerManager: cleanable ranges, dirty ratios, states (``describe``)."""
        return self.cleaner.manager

    def compact(self, topic: Optional[str] = None, partition: Optional[int] = None,
                force: bool = False, now_ms: Optional[int] = None) -> list:
        """Clean compacted partitions now, in this thread; returns each round's CleanerStats.

        Without arguments every compacted partition that is eligible (dirty ratio above
        ``min.cleanable.dirty.ratio`` or overdue by ``max.compaction.lag.ms``) is cleaned;
        ``topic``/``partition`` narrow it (a named topic must have ``compact`` in its
        ``cleanup.policy``). ``force=True`` cleans the chosen partitions whatever their dirty
        ratio. A partition is cleaned round after round until its cleanable section is done
        (a round ends early when the offset map fills up). ``now_ms`` defaults to the clock.
        """
        self._check_writable()
        if now_ms is not None:
            now_argument(now_ms, self.clock)  # refused before anything is cleaned
        if partition is not None and topic is None:
            raise InvalidTopicError("compact(partition=...) needs a topic")
        if partition is not None:
            # A bool or float would be taken as the int it equals, a list would be unhashable.
            partition = offset_argument(partition, "partition")
        if topic is not None:
            cfg = self._topic(topic)["config"]
            if not cfg.compact:
                raise InvalidTopicError(
                    f"topic {topic!r} has cleanup.policy={','.join(cfg.cleanup_policy)}; only "
                    f"topics with 'compact' can be compacted")
            parts = [partition] if partition is not None else hosted_partitions(self._topic(topic))
            tps = [TopicPartition(topic, p) for p in parts]
            for tp in tps:
                if tp not in self._logs:
                    raise UnknownTopicOrPartitionError(f"no partition {tp.topic}-{tp.partition}")
        else:
            # By the topics' configs: a log not loaded yet is loaded only if it is compacted.
            tps = sorted(tp for tp in self._logs if self._compacted_topic(tp.topic))
        return self.cleaner.clean_now(tps, force=force, now_ms=now_ms)

    def write_checkpoints(self) -> None:
        """Write the recovery-point and log-start-offset checkpoint files, then delete the
        producer snapshots recovery no longer needs (see
        :meth:`PartitionLog.delete_old_snapshots`)."""
        self._check_writable()
        # Logs not loaded yet keep the offsets the open read.
        logs, recovery, starts = self._logs.checkpoint_offsets()
        recovery.update((tp, lg.recovery_point) for tp, lg in logs.items())
        starts.update((tp, lg.log_start_offset) for tp, lg in logs.items())
        # Both files share one directory fsync. A crash can leave one old and one new, as it
        # could when they were written one after the other.
        write_atomic_many({
            os.path.join(self.path, RECOVERY_POINT_CHECKPOINT):
                OffsetCheckpointFile.text(recovery),
            os.path.join(self.path, LOG_START_OFFSET_CHECKPOINT):
                OffsetCheckpointFile.text(starts)})
        for lg in logs.values():  # recovery now starts at these points
            lg.delete_old_snapshots()

    def verify(self) -> list:
        """A full CRC, index and producer-snapshot check of every partition: a list of
        ``Problem`` (file, position, message), empty when the store is sound; a damaged
        topic metadata file is one (its topic is set aside, see :meth:`damaged_topics`), and
        so is a partition whose log cannot load (its directory, the error), after which the
        other partitions are still checked. Nothing is changed."""
        self._check_open()
        problems = [Problem(e.file, -1, str(damaged_topic_error(e)))
                    for _, e in sorted(self._damaged.items())]
        unloadable = {}   # a log that cannot load is a problem to report, not a reason to stop
        logs = dict(self._logs.items(on_error=unloadable.__setitem__))
        for tp in sorted(set(logs) | set(unloadable)):
            if tp in unloadable:
                e = unloadable[tp]
                problems.append(Problem(self._partition_dir(tp), -1,
                                        f"cannot load {tp.topic}-{tp.partition}: "
                                        f"{type(e).__name__}: {e}"))
            else:
                problems.extend(logs[tp].verify())
        return problems

    def metrics(self) -> dict:
        """Store-wide gauges (Kafka metric names where Kafka has one). ``OfflineReplicaCount``
        (Kafka's ReplicaManager gauge) counts the partitions whose log an I/O error took
        offline or cannot load; ``size-bytes`` and ``segments`` cover the logs that loaded."""
        self._check_open()
        unloadable: dict = {}   # counted offline, as Kafka counts the logs of a failed dir
        logs = [lg for _, lg in self._logs.items(on_error=unloadable.__setitem__)]
        return {
            "topics": len(self._topics),
            "partitions": len(self._logs),
            "size-bytes": sum(lg.size_bytes for lg in logs),
            "segments": sum(len(lg.segments) for lg in logs),
            "pending-deletes": len(self._deletes),
            "OfflineReplicaCount": len(unloadable) + sum(lg.offline for lg in logs),
            **self.cleaner.metrics(),
        }

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop services, flush and close every log (each writes a producer snapshot at its log
        end), delete the ``.deleted`` files still waiting, write checkpoints and the
        clean-shutdown marker, release the lock. Safe to call twice.

        A log an I/O error took offline is closed without a flush, and no clean-shutdown
        marker is written, so the next open recovers it. When a log goes offline while closing,
        everything is still closed, then its KafkaStorageError is raised."""
        if self._closed:
            return
        self._stop.set()
        for t in self._services:
            t.join()
        self.cleaner.shutdown()
        self.cleaner.release_memory()
        with self._lock:
            self._logs.freeze()   # the logs not loaded yet stay as the last close left them
            loaded = self._logs.loaded()
            if not self.readonly:
                failures = []
                try:
                    closed = run_jobs(self.config.num_recovery_threads_per_data_dir,
                                      [lg.close for lg in loaded.values()])
                    failures = [e for _, e in closed if e is not None]
                    for e in failures:
                        if not isinstance(e, KafkaStorageError):
                            raise e   # a bug, not an offline log: no checkpoints, no marker
                    self._deletes.delete_due(None)
                    self.write_checkpoints()
                    # An offline log's files may disagree with its recovery point: the next
                    # open must recover, as after a crash.
                    if not any(lg.offline for lg in loaded.values()):
                        create_marker(os.path.join(self.path, CLEAN_SHUTDOWN_FILE))
                finally:
                    # Whatever failed, the store must not stay locked until the process exits;
                    # without the marker the next open recovers, as after a crash.
                    self._file_lock.release()
                    self._closed = True
                if failures:
                    raise failures[0]
            else:
                for lg in loaded.values():
                    lg.close()
            self._closed = True

    def __enter__(self) -> "LogStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LogStore({self.path!r}, topics={len(self._topics)}, readonly={self.readonly})"


def open(path: str, config: Optional[Mapping] = None, clock: Optional[Callable[[], int]] = None,
         readonly: bool = False) -> LogStore:
    """Open (creating if needed) the store at ``path``.

    ``config`` holds store-wide settings under Kafka's broker names; ``clock`` returns
    milliseconds and drives every time rule; ``readonly=True`` takes no lock, creates nothing
    (FileNotFoundError when ``path`` does not exist) and reads safely while another process
    writes. A writable open takes ``<path>/.lock`` (StoreLockedError while another writer holds
    it) and recovers the logs if the last close was not clean. A topic metadata file that
    cannot be read makes a writable open raise CorruptMetadataError naming the file, what is
    wrong and the fix (InvalidTopicMetadataConfigError, an InvalidConfigError too, for invalid
    config overrides); a read-only open sets that topic aside (:meth:`LogStore.damaged_topics`).
    """
    return LogStore(path, config=config, clock=clock, readonly=readonly)
