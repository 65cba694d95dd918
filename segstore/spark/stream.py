"""Streaming reads: Kafka's micro-batch source semantics over a segstore directory.

Offsets are Kafka's JSON, ``{"topic": {"0": 42}}`` (end-exclusive next offsets). The reader
lives in one long-lived driver-side process: ``latestOffset`` decides each micro-batch's end
(admission control: ``maxOffsetsPerTrigger`` split across partitions by backlog,
``minOffsetsPerTrigger`` held back until ``maxTriggerDelay``, the target fixed by
``Trigger.AvailableNow``), ``partitions`` turns a start/end pair into offset ranges and each
task's ``read`` decodes one range (:func:`~.reader.read_range`). Partitions that appear later
(a new topic matching the subscription) are read from their earliest offset.

pyspark 4.0/4.1 (no admission control, :mod:`.features`) call ``latestOffset()`` without
arguments and know no read limits; the reader then applies ``maxOffsetsPerTrigger`` itself from
the last end it saw. That is the end of the last ``latestOffset`` or ``partitions`` call: on a
restart from a checkpoint, those versions tell the reader where the query stands by calling
``partitions(offset, offset)`` (``setLatestSeenOffset``) before the first ``latestOffset()``.
Their ``Trigger.AvailableNow`` asks for ``latestOffset()`` once per run, so a run reads one
micro-batch: everything, or ``maxOffsetsPerTrigger`` records when that is set.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from pyspark.sql.datasource import DataSourceStreamReader

from . import stores
from .features import ADMISSION_CONTROL
from .offsets import (check_range, data_loss, from_json, latest_offset, prorate,
                      resolve_start, select_partitions, split_ranges, to_json)
from .options import ReadOptions
from .reader import OffsetRangePartition, read_range

if ADMISSION_CONTROL:  # pyspark 4.2+ (SPARK-55304)
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows, ReadMinRows,
                                                  SupportsTriggerAvailableNow)
else:  # pyspark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the class below has the same bases on every version."""

log = logging.getLogger("segstore.spark")


def now_ms() -> int:
    """Wall-clock milliseconds (the trigger-delay clock; tests replace it)."""
    return int(time.time() * 1000)


class SegstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with Kafka's offsets, read limits and failOnDataLoss rules."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self._target: Optional[dict] = None     # AvailableNow: {tp: end} fixed at the start
        self._last_end: Optional[dict] = None   # pyspark < 4.2: where the query stands
        self._last_trigger_ms = 0               # minOffsetsPerTrigger's delay clock

    # -- offsets ----------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingOffsets`` (default latest) or a timestamp."""
        with stores.readonly(self.opts.path) as store:
            tps = select_partitions(store, self.opts)
            start = resolve_start(store, tps, self.opts.starting, self.opts.starting_strategy,
                                  self.opts.read_committed)
        return to_json(start)

    def _latest(self, store) -> dict:
        return {tp: latest_offset(store.partition(*tp), self.opts.read_committed)
                for tp in select_partitions(store, self.opts)}

    def reportLatestOffset(self) -> dict:
        """The log end offsets now (Spark's progress metrics)."""
        with stores.readonly(self.opts.path) as store:
            return to_json(self._latest(store))

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an AvailableNow run: nothing appended later is read."""
        with stores.readonly(self.opts.path) as store:
            self._target = self._latest(store)

    def getDefaultReadLimit(self):
        """``maxOffsetsPerTrigger`` as ReadMaxRows, else ``minOffsetsPerTrigger`` as ReadMinRows."""
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Optional[dict] = None, limit=None) -> dict:
        """The end of the next micro-batch (equal to ``start`` when there is nothing to read
        or ``minOffsetsPerTrigger`` holds the batch back)."""
        legacy = start is None  # pyspark 4.0/4.1 call latestOffset() with no arguments
        if legacy:
            start = self._last_end if self._last_end is not None else self.initialOffset()
        begin = from_json(start)
        with stores.readonly(self.opts.path) as store:
            latest = self._latest(store)
            for tp in latest:
                if tp not in begin:  # a partition that appeared since: read it from earliest
                    begin[tp] = store.partition(*tp).log_start_offset
        wants_all = ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable)
        if (self._target is None and not wants_all
                and self.opts.min_offsets_per_trigger is not None
                and self._delay(begin, latest)):
            # Held back: Kafka's source returns the start itself, whatever partitions appeared
            # or vanished since; they count once the batch goes ahead.
            self._last_end = start
            return start
        gone = [tp for tp in begin if tp not in latest]
        if gone:
            if self.opts.fail_on_data_loss:
                raise data_loss("partitions " + ", ".join(f"{t}-{p}" for t, p in gone)
                                + " no longer exist")
            log.warning("partitions %s no longer exist; the stream goes on without them", gone)
        if self._target is not None:
            # AvailableNow: never past the target; partitions created since are not read.
            latest = {tp: min(end, self._target[tp]) for tp, end in latest.items()
                      if tp in self._target}
            begin = {tp: off for tp, off in begin.items() if tp in latest}
        max_rows = self.opts.max_offsets_per_trigger if legacy else None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        end = prorate(begin, latest, max_rows) if max_rows is not None else latest
        out = to_json(end)
        self._last_end = out
        return out

    def _delay(self, begin: dict, latest: dict) -> bool:
        """minOffsetsPerTrigger: hold the batch back until enough records or maxTriggerDelay."""
        now = now_ms()
        if now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        backlog = sum(max(end - begin[tp], 0) for tp, end in latest.items())
        if backlog < self.opts.min_offsets_per_trigger:
            return True
        self._last_trigger_ms = now
        return False

    # -- planning and reading ---------------------------------------------------------------
    def partitions(self, start: dict, end: dict) -> list:
        """Offset ranges between two offsets (empty when they are equal)."""
        # Before 4.2 this is also how Spark reports where a restarted query stands.
        self._last_end = end
        begin, stop = from_json(start), from_json(end)
        fail = self.opts.fail_on_data_loss
        ranges = []
        with stores.readonly(self.opts.path) as store:
            known = set(store.list_topics())
            damaged = store.damaged_topics()
            for tp, e in sorted(stop.items()):
                if tp.topic in damaged:
                    store.partitions_for(tp.topic)  # its CorruptMetadataError, not "data loss"
                if (tp.topic not in known
                        or tp.partition not in store.partitions_for(tp.topic)):
                    if fail:
                        raise data_loss(f"{tp.topic}-{tp.partition} no longer exists")
                    continue
                lg = store.partition(*tp)
                s = begin.get(tp, lg.log_start_offset)
                if tp not in begin and s != 0:
                    # A partition that appeared during the query is read from its earliest
                    # offset; Kafka reports data loss when that is not 0
                    # (ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO).
                    if fail:
                        raise data_loss(f"added partition {tp.topic}-{tp.partition} starts "
                                        f"from offset {s} instead of 0")
                    log.warning("added partition %s-%d starts from offset %d instead of 0; "
                                "reading from there", tp.topic, tp.partition, s)
                if s == e:
                    continue
                if e < s:
                    # The log was truncated below where the stream had read (Kafka: data loss).
                    if fail:
                        raise data_loss(f"{tp.topic}-{tp.partition}: offset went back from {s} "
                                        f"to {e}")
                    log.warning("%s-%d went back from offset %d to %d; skipping", tp.topic,
                                tp.partition, s, e)
                    continue
                rng = check_range(tp, s, e, lg.log_start_offset, lg.log_end_offset, fail)
                if rng is not None and rng[1] > rng[0]:
                    ranges.append((tp, *rng))
        pieces = split_ranges(ranges, self.opts.min_partitions,
                              self.opts.max_records_per_partition)
        return [OffsetRangePartition(tp.topic, tp.partition, s, e) for tp, s, e in pieces]

    def read(self, partition):
        """Arrow batches of one offset range (runs in a task)."""
        return read_range(self.opts.path, partition.topic, partition.partition, partition.start,
                          partition.end, include_headers=self.opts.include_headers,
                          fail_on_data_loss=self.opts.fail_on_data_loss,
                          isolation_level=self.opts.isolation_level)

    def commit(self, end: dict) -> None:
        """Nothing to release: like Kafka's source, reading commits nothing to the store."""

    def stop(self) -> None:
        """Nothing to close: stores are opened per call."""
