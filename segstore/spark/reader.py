"""Batch reads: offset ranges planned on the driver, Arrow batches decoded in the tasks.

``partitions()`` opens the store read-only once, resolves the options to one
``(topic, partition, start, end)`` range per partition (split by ``minPartitions`` /
``maxRecordsPerPartition``) and returns them as :class:`OffsetRangePartition`. Each task's
``read()`` opens the store read-only itself and yields ``pyarrow.RecordBatch`` objects built from
``PartitionLog.read_columns`` with exactly Spark's Arrow types. The streaming reader reuses
:func:`read_range`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..errors import OffsetOutOfRangeError, SegmentChangedError, UnknownTopicOrPartitionError
from ..records import TopicPartition
from . import stores
from .filters import Pruning, push
from .offsets import (check_range, data_loss, resolve_end, resolve_start, select_partitions,
                      split_ranges)
from .options import InvalidOptionError, ReadOptions

# Records decoded per step: the first step is small, later ones aim at TARGET_BATCH_BYTES.
FIRST_CHUNK_RECORDS = 4096
MAX_CHUNK_RECORDS = 1 << 17
TARGET_BATCH_BYTES = 32 << 20
# Spark's binary type has 32-bit offsets: a batch's key or value bytes must stay below 2 GiB.
MAX_COLUMN_BYTES = (1 << 31) - 1


@dataclass
class OffsetRangePartition(InputPartition):
    """Records ``[start, end)`` of one topic partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def topic_partition(self) -> TopicPartition:
        """The range's topic partition."""
        return TopicPartition(self.topic, self.partition)


def _too_big(cols) -> bool:
    return max(cols.values.data.nbytes, cols.keys.data.nbytes) > MAX_COLUMN_BYTES


def to_spark_batch(cols, include_headers: bool):
    """A RecordColumns chunk as a RecordBatch with exactly the source's Arrow schema.

    Records without headers get a null ``headers`` cell, not an empty list, as Spark's Kafka
    source returns them.
    """
    import pyarrow as pa

    from .schema import arrow_schema

    batch = cols.to_arrow(spark=True)    # headers already null where a record has none
    arrays = batch.columns[:8] if include_headers else batch.columns[:7]
    # from_arrays with the schema checks every type and sets Spark's exact field metadata.
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


def read_range(path: str, topic: str, partition: int, start: int, end: int, *,
               include_headers: bool, fail_on_data_loss: bool,
               isolation_level: str = "read_uncommitted") -> Iterator:
    """Yield Spark Arrow batches of the records in ``[start, end)`` of one partition.

    Opens the store read-only for the duration of the generator. Offsets the log no longer holds
    (retention moved its start, truncation its end, the topic was deleted) raise
    :class:`~segstore.spark.offsets.DataLossError` or are skipped, by ``fail_on_data_loss``.
    """
    tp = TopicPartition(topic, partition)
    with stores.readonly(path) as store:
        try:
            lg = store.partition(topic, partition)
        except UnknownTopicOrPartitionError:
            if fail_on_data_loss:
                raise data_loss(f"{topic}-{partition} no longer exists in {path}") from None
            return
        rng = check_range(tp, start, end, lg.log_start_offset, lg.log_end_offset,
                          fail_on_data_loss)
        if rng is None:
            return
        pos, end = rng
        chunk = FIRST_CHUNK_RECORDS
        while pos < end:
            try:
                cols = lg.read_columns(pos, end, max_records=chunk,
                                       include_headers=include_headers,
                                       isolation_level=isolation_level)
            except (OffsetOutOfRangeError, SegmentChangedError):
                # Retention or DeleteRecords moved the log start past ``pos`` while this task
                # read (its segment may be gone under the read): data loss, judged as at the
                # start, from where the log is now.
                rng = check_range(tp, pos, end, lg.log_start_offset, lg.log_end_offset,
                                  fail_on_data_loss)
                if rng is None:
                    return
                if rng == (pos, end):
                    raise  # the log did not move: not data loss
                pos, end = rng
                continue
            if len(cols) > 1 and _too_big(cols):
                chunk = max(1, len(cols) // 2)
                continue
            if len(cols) == 0:
                break  # only compacted-away or aborted offsets remain below ``end``
            yield to_spark_batch(cols, include_headers)
            pos = int(cols.offsets[-1]) + 1
            per_record = max(1, cols.nbytes // len(cols))
            chunk = int(min(MAX_CHUNK_RECORDS, max(1, TARGET_BATCH_BYTES // per_record)))


def plan_ranges(store, opts: ReadOptions, pruning: Optional[Pruning] = None) -> list:
    """The ``(TopicPartition, start, end)`` ranges a batch read covers (before splitting)."""
    tps = select_partitions(store, opts)
    # Offsets are resolved for every selected partition first: Kafka's coverage rule for JSON
    # offsets refers to the selection, not to what pushed filters leave of it.
    starts = resolve_start(store, tps, opts.starting, opts.starting_strategy,
                           opts.read_committed)
    ends = resolve_end(store, tps, opts.ending, opts.read_committed)
    for tp in tps:
        # Kafka (RESOLVED_START_OFFSET_GREATER_THAN_END_OFFSET, an assertion before Spark 4.1):
        # an error whatever failOnDataLoss says, never an empty range.
        if starts[tp] > ends[tp]:
            raise InvalidOptionError(
                f"{tp.topic}-{tp.partition}: the start {opts.starting.option!r} resolves to, "
                f"offset {starts[tp]}, is above the end {opts.ending.option!r} resolves to, "
                f"offset {ends[tp]}: the start is set too high (past the log end for "
                "'latest'), or the partition was truncated")
    ranges = []
    for tp in tps:
        if pruning is not None and not pruning.keeps(tp):
            continue
        lg = store.partition(*tp)
        rng = check_range(tp, starts[tp], ends[tp], lg.log_start_offset, lg.log_end_offset,
                          opts.fail_on_data_loss)
        if rng is None:
            continue
        s, e = rng
        if pruning is not None:
            s, e = pruning.clamp(s, e)
            if pruning.timestamp_min_ms is not None and s < e:
                found = lg.offset_for_time(pruning.timestamp_min_ms)
                s = e if found is None else min(max(s, found.offset), e)
        ranges.append((tp, s, e))
    return ranges


class SegstoreReader(DataSourceReader):
    """Batch reader of a segstore directory (no filter pushdown; see the subclass)."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.pruning = Pruning()

    def _pruning(self) -> Optional[Pruning]:
        return None

    def partitions(self) -> list:
        """One input partition per offset range (split as the options ask)."""
        with stores.readonly(self.opts.path) as store:
            ranges = plan_ranges(store, self.opts, self._pruning())
        pieces = split_ranges(ranges, self.opts.min_partitions,
                              self.opts.max_records_per_partition)
        return [OffsetRangePartition(tp.topic, tp.partition, s, e) for tp, s, e in pieces]

    def read(self, partition) -> Iterator:
        """Arrow batches of one offset range (nothing for Spark's placeholder partition)."""
        if not isinstance(partition, OffsetRangePartition):
            return iter(())  # no ranges at all: Spark asks once with InputPartition(None)
        return read_range(self.opts.path, partition.topic, partition.partition, partition.start,
                          partition.end, include_headers=self.opts.include_headers,
                          fail_on_data_loss=self.opts.fail_on_data_loss,
                          isolation_level=self.opts.isolation_level)


class SegstorePushdownReader(SegstoreReader):
    """The batch reader with filter pushdown (``.option("pushFilters", "true")``).

    A separate class because Spark refuses a reader that overrides ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true (it is false by default).
    """

    def _pruning(self) -> Optional[Pruning]:
        return self.pruning

    def pushFilters(self, filters):
        """Prune partitions and offsets; return the filters Spark must still evaluate."""
        return push(list(filters), self.pruning)
