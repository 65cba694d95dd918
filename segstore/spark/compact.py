"""Distributed compaction: the log cleaner as one Spark task per partition that needs it.

The driver opens the store read-only and asks the cleaner manager which compacted partitions
have something to clean (``describe``: eligible by dirty ratio or ``max.compaction.lag.ms``,
tombstones past their horizon, or anything cleanable with ``force``). Each task then opens the
store writable, runs ``store.compact(topic, partition, force, now_ms)`` for its partition and
returns the rounds' CleanerStats as rows.

A writable store holds the exclusive ``<root>/.lock``, so tasks take turns on one store: each
waits for the lock with backoff (``lock_timeout_ms``) instead of failing, which cannot deadlock
because no task waits while holding it. The gain from Spark is scheduling, retries and the
cleaning of many stores at once; parallel cleaning inside one store needs a partition-scoped
writer lock in the core (see ``docs/spark.md``).
"""

from __future__ import annotations

import functools
import logging
from typing import Iterable, Optional

from ..errors import InvalidTopicError, UnknownTopicOrPartitionError, now_argument
from . import stores
from .options import DEFAULT_LOCK_TIMEOUT_MS, normalize_location

log = logging.getLogger("segstore.spark")

# One row per cleaning round: Kafka's CleanerStats fields, in snake case.
STATS_DDL = ("topic string, partition int, first_dirty_offset bigint, end_offset bigint, "
             "bytes_read bigint, bytes_written bigint, map_bytes_read bigint, "
             "map_messages_read bigint, messages_read bigint, invalid_messages_read bigint, "
             "messages_written bigint, buffer_utilization double, map_full boolean, "
             "segments_cleaned int, segments_written int, elapsed_secs double, "
             "elapsed_index_secs double, start_time_ms bigint, end_time_ms bigint, "
             "forced boolean")
_FIELDS = [f.split()[0] for f in STATS_DDL.split(", ")]
_RENAMED = {"start_time_ms": "start_time", "end_time_ms": "end_time"}


def stats_row(stats) -> tuple:
    """A CleanerStats as a row of STATS_DDL (missing fields are null)."""
    return tuple(getattr(stats, _RENAMED.get(name, name), None) for name in _FIELDS)


def _needs_cleaning(store, topic: str, partition: int, force: bool,
                    now_ms: Optional[int]) -> bool:
    """Whether ``store.compact`` would clean this partition now (asked of a read-only store).

    The same three reasons as the cleaner manager's ``grab_log``: eligible (dirty ratio or
    ``max.compaction.lag.ms``), tombstones in the clean section whose delete horizon passed, or
    anything cleanable with ``force``.
    """
    manager = getattr(store, "cleaner_manager", None)
    if manager is None or not hasattr(manager, "describe"):
        return True  # cannot tell from here: let the task's store.compact decide
    d = manager.describe(topic, partition, now_ms=now_ms)
    if d["eligible"] or (force and d["cleanable_bytes"] > 0):
        return True
    from ..cleaner.manager import earliest_delete_horizon, purge_reach, segments_in_range

    first_dirty = d["first_dirty_offset"]
    clean = [s for s in segments_in_range(store.partition(topic, partition).segments, 0,
                                          first_dirty) if s.base_offset < first_dirty]
    horizon = earliest_delete_horizon(clean, purge_reach(first_dirty,
                                                         d["first_uncleanable_offset"]))
    now = now_argument(now_ms, store.clock)
    return horizon is not None and horizon <= now


def plan(path: str, topics: Optional[Iterable[str]] = None, force: bool = False,
         now_ms: Optional[int] = None) -> list:
    """``[(topic, partition)]`` the cleaner would work on, decided on a read-only store."""
    if now_ms is not None:
        now_argument(now_ms, None)  # refused before any store is opened
    with stores.readonly(path) as store:
        if not hasattr(store, "compact"):
            raise NotImplementedError(
                "this segstore has no log cleaner (LogStore.compact); upgrade segstore")
        compacted = [t for t in store.list_topics() if store.topic_config(t).compact]
        if topics is None:
            chosen = compacted
        else:
            chosen = [topics] if isinstance(topics, str) else list(topics)
            for t in chosen:
                if t not in store.list_topics():
                    raise UnknownTopicOrPartitionError(f"topic {t!r} does not exist in {path}")
                if t not in compacted:
                    raise InvalidTopicError(
                        f"topic {t!r} has cleanup.policy="
                        f"{','.join(store.topic_config(t).cleanup_policy)}; only topics with "
                        "'compact' can be compacted")
        return [(t, p) for t in chosen for p in store.partitions_for(t)
                if _needs_cleaning(store, t, p, force, now_ms)]


def _clean_partitions(path: str, force: bool, now_ms: Optional[int], lock_timeout_ms: int,
                      partitions) -> Iterable[tuple]:
    """Task body: clean each (topic, partition), holding the writer lock only meanwhile."""
    for topic, partition in partitions:
        with stores.writable(path, lock_timeout_ms, f"compacting {topic}-{partition}") as store:
            rounds = store.compact(topic=topic, partition=partition, force=force, now_ms=now_ms)
        for stats in rounds:
            yield stats_row(stats)


def compact(spark, path: str, topics=None, force: bool = False, *,
            now_ms: Optional[int] = None, lock_timeout_ms: int = 10 * DEFAULT_LOCK_TIMEOUT_MS):
    """Compact a store's partitions with Spark; a DataFrame with one row per cleaning round.

    ``topics`` (a name or a list; default every topic with ``cleanup.policy`` compact) must be
    compacted topics. ``force=True`` cleans whatever the dirty ratio, like
    ``store.compact(force=True)``; ``now_ms`` fixes the cleaner's clock (tombstone horizons,
    compaction lags). The store must not be open writable in the driver meanwhile: each task
    waits up to ``lock_timeout_ms`` for the writer lock.
    """
    path = normalize_location(path)
    todo = plan(path, topics, force, now_ms)
    schema = STATS_DDL
    if not todo:
        return spark.createDataFrame([], schema)
    task = functools.partial(_clean_partitions, path, force, now_ms, lock_timeout_ms)
    rows = spark.sparkContext.parallelize(todo, len(todo)).mapPartitions(task).collect()
    log.info("compacted %d partitions of %s in %d rounds", len(todo), path, len(rows))
    return spark.createDataFrame(rows, schema)
