"""Offset ranges: which partitions a query reads and from where to where (Kafka's rules).

Everything here works on a store opened read-only on the driver side and returns plain data:
``{TopicPartition: offset}`` maps, ``(TopicPartition, start, end)`` ranges (end exclusive) and
the Kafka source's JSON offset shape ``{"topic": {"0": 42}}`` (string partition keys, because
Spark's streaming runner round-trips offsets through JSON).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Optional

from ..errors import SegstoreError, UnknownTopicOrPartitionError
from ..records import TopicPartition
from .options import InvalidOptionError, OffsetSpec, ReadOptions

EARLIEST, LATEST = -2, -1

_LOSS_HINT = ("Some data may have been lost because it is no longer in the store: retention "
              "or DeleteRecords moved the log start offset, or the partition was truncated or "
              "deleted. If you want the query to continue past such gaps, set the source option "
              "'failOnDataLoss' to 'false'.")


class DataLossError(SegstoreError):
    """Offsets a query must read are gone (``failOnDataLoss=true``, Kafka's default)."""


def data_loss(message: str) -> DataLossError:
    """A DataLossError carrying Kafka's hint about ``failOnDataLoss``."""
    return DataLossError(f"{message}. {_LOSS_HINT}")


# -- partitions -----------------------------------------------------------------------------

def select_partitions(store, opts: ReadOptions) -> list:
    """The topic partitions ``subscribe`` / ``subscribePattern`` / ``assign`` name, sorted.

    A batch read of a subscribed topic that does not exist is an error; a stream waits for it
    (it is picked up from its earliest offset once created). A pattern matching nothing reads
    nothing, as with Kafka.
    """
    topics = set(store.list_topics())
    # A topic whose metadata file is damaged is set aside by the read-only store; reading on
    # without it would drop its records silently: its error (file, reason, fix) is raised.
    damaged = store.damaged_topics()
    if opts.subscribe is not None:
        named = opts.subscribe
    elif opts.subscribe_pattern is not None:
        named = [t for t in sorted(damaged) if re.fullmatch(opts.subscribe_pattern, t)]
    else:
        named = list(opts.assign)
    for t in named:
        if t in damaged:
            store.partitions_for(t)   # raises the topic's CorruptMetadataError
    out = []
    if opts.subscribe is not None:
        missing = [t for t in opts.subscribe if t not in topics]
        if missing and not opts.streaming:
            raise UnknownTopicOrPartitionError(
                f"option 'subscribe' names topics that do not exist in {store.path}: "
                + ", ".join(missing))
        for t in opts.subscribe:
            if t in topics:
                out.extend(TopicPartition(t, p) for p in store.partitions_for(t))
    elif opts.subscribe_pattern is not None:
        rx = re.compile(opts.subscribe_pattern)
        for t in sorted(topics):
            if rx.fullmatch(t):
                out.extend(TopicPartition(t, p) for p in store.partitions_for(t))
    else:
        for t, parts in opts.assign.items():
            if t not in topics:
                raise UnknownTopicOrPartitionError(
                    f"option 'assign' names topic {t!r}, which does not exist in {store.path}")
            have = store.partitions_for(t)
            bad = [p for p in parts if p not in have]
            if bad:
                raise UnknownTopicOrPartitionError(
                    f"option 'assign' names partitions {bad} of topic {t!r}, which has "
                    + (f"{len(have)}" if have == list(range(len(have))) else f"only {have}"))
            out.extend(TopicPartition(t, p) for p in parts)
    return sorted(set(out))


# -- offsets from options -------------------------------------------------------------------

def _check_coverage(spec: OffsetSpec, tps: Iterable) -> None:
    # Kafka's rule: specific offsets or timestamps must name exactly the selected partitions.
    wanted = {(tp.topic, tp.partition) for tp in tps}
    given = set(spec.values)
    if given != wanted:
        extra = sorted(given - wanted)
        missing = sorted(wanted - given)
        detail = []
        if missing:
            detail.append("missing " + ", ".join(f"{t}-{p}" for t, p in missing))
        if extra:
            detail.append("not selected " + ", ".join(f"{t}-{p}" for t, p in extra))
        raise InvalidOptionError(
            f"option {spec.option!r} must give a value for every selected topic partition and "
            f"no other ({'; '.join(detail)})")


def latest_offset(lg, read_committed: bool = False) -> int:
    """Where "latest" is: the log end, or the last stable offset for a read_committed read
    (Kafka's consumer: endOffsets at read_committed)."""
    return lg.last_stable_offset if read_committed else lg.log_end_offset


def offset_for_time(lg, ts: int, read_committed: bool = False) -> Optional[int]:
    """The first offset whose timestamp is >= ``ts``, or None (no match).

    As the broker answers ListOffsets at READ_COMMITTED, a read_committed lookup only counts
    offsets below the last stable offset: a match at or above it is no match.
    """
    found = lg.offset_for_time(ts)
    if found is None or (read_committed and found.offset >= lg.last_stable_offset):
        return None
    return found.offset


def resolve_start(store, tps: list, spec: OffsetSpec, strategy: str = "error",
                  read_committed: bool = False) -> dict:
    """Starting offset of each partition (``strategy``: no timestamp match -> error | latest)."""
    out = {}
    if spec.kind in ("offsets", "timestamps"):
        _check_coverage(spec, tps)
    for tp in tps:
        lg = store.partition(*tp)
        if spec.kind == "earliest":
            out[tp] = lg.log_start_offset
        elif spec.kind == "latest":
            out[tp] = latest_offset(lg, read_committed)
        elif spec.kind == "offsets":
            v = spec.values[(tp.topic, tp.partition)]
            out[tp] = (lg.log_start_offset if v == EARLIEST else
                       latest_offset(lg, read_committed) if v == LATEST else v)
        else:
            ts = spec.timestamp if spec.kind == "timestamp" else spec.values[(tp.topic, tp.partition)]
            found = offset_for_time(lg, ts, read_committed)
            if found is not None:
                out[tp] = found
            elif strategy == "latest":
                out[tp] = latest_offset(lg, read_committed)
            else:
                where = " below its last stable offset" if read_committed else ""
                raise InvalidOptionError(
                    f"option {spec.option!r}: no record of {tp.topic}-{tp.partition}{where} has "
                    f"a timestamp >= {ts}; set 'startingOffsetsByTimestampStrategy' to 'latest' "
                    "to start such partitions at their end")
    return out


def resolve_end(store, tps: list, spec: OffsetSpec, read_committed: bool = False) -> dict:
    """Ending (exclusive) offset of each partition; a timestamp with no match means latest."""
    out = {}
    if spec.kind in ("offsets", "timestamps"):
        _check_coverage(spec, tps)
    for tp in tps:
        lg = store.partition(*tp)
        if spec.kind == "latest":
            out[tp] = latest_offset(lg, read_committed)
        elif spec.kind == "offsets":
            v = spec.values[(tp.topic, tp.partition)]
            out[tp] = latest_offset(lg, read_committed) if v == LATEST else v
        else:
            ts = spec.timestamp if spec.kind == "timestamp" else spec.values[(tp.topic, tp.partition)]
            found = offset_for_time(lg, ts, read_committed)
            out[tp] = latest_offset(lg, read_committed) if found is None else found
    return out


def check_range(tp, start: int, end: int, log_start: int, log_end: int,
                fail_on_data_loss: bool) -> Optional[tuple]:
    """``(start, end)`` inside what the log holds, or DataLossError / None (nothing left).

    Below the log start offset the data is gone; past the log end it was truncated away.
    """
    name = f"{tp.topic}-{tp.partition}"
    if start < log_start:
        if fail_on_data_loss:
            raise data_loss(f"cannot read {name} from offset {start}: its log start offset is "
                            f"now {log_start}")
        start = log_start
    if end > log_end:
        if fail_on_data_loss:
            raise data_loss(f"cannot read {name} up to offset {end}: its log end offset is "
                            f"{log_end}")
        end = log_end
    if start > end:
        if fail_on_data_loss:
            raise data_loss(f"{name}: starting offset {start} is past ending offset {end}: the "
                            f"startingOffsets/endingOffsets (or timestamp) options give an empty "
                            f"range, or the log was truncated")
        return None
    return start, end


# -- splitting ranges into Spark partitions -------------------------------------------------

def _divide(tp, start: int, end: int, parts: int) -> list:
    # Kafka's getDividedPartition: each piece takes remaining // pieces left, so the later
    # pieces absorb the rounding; empty pieces are dropped.
    out, remaining = [], end - start
    for i in range(parts):
        size = remaining // (parts - i)
        remaining -= size
        if size:
            out.append((tp, start, start + size))
        start += size
    return out


def _round(x: float) -> int:
    # Java's Math.round: halves round up (Python's round() rounds them to even).
    r = math.floor(x)
    return r + 1 if x - r >= 0.5 else r


def split_ranges(ranges: list, min_partitions: Optional[int] = None,
                 max_records: Optional[int] = None) -> list:
    """Split ``(tp, start, end)`` ranges into Spark input partitions, as Spark's
    KafkaOffsetRangeCalculator does. Empty ranges are dropped.

    ``maxRecordsPerPartition`` first cuts each range into ``ceil(size / max)`` even pieces.
    Then, if fewer pieces than ``minPartitions`` remain, each piece whose share of
    ``minPartitions`` rounds to at most one stays whole; the others split the remaining
    ``minPartitions - #whole`` pieces in proportion to their sizes, each share rounded on its
    own (at least one). So the total is about ``minPartitions``: rounding can give a few more
    or fewer, exactly as Spark plans.
    """
    pieces = []
    for tp, s, e in ranges:
        if e > s:
            parts = -(-(e - s) // max_records) if max_records else 1
            pieces.extend(_divide(tp, s, e, parts))
    if not min_partitions or len(pieces) >= min_partitions:
        return pieces
    total = sum(e - s for _, s, e in pieces)
    # Spark keys the set-aside ranges by topic partition: once one piece of a partition stays
    # whole, all of its pieces do.
    whole = [(tp, e - s) for tp, s, e in pieces
             if max(_round((e - s) / total * min_partitions), 1) == 1]
    whole_tps = {tp for tp, _ in whole}
    split_total = total - sum(size for _, size in whole)
    split_min = max(min_partitions - len(whole), 1)
    out = []
    for tp, s, e in pieces:
        parts = 1 if tp in whole_tps else max(_round((e - s) / split_total * split_min), 1)
        out.extend(_divide(tp, s, e, parts))
    return out


def prorate(start: dict, latest: dict, max_rows: int) -> dict:
    """Ends after admitting at most about ``max_rows`` offsets, split by backlog.

    Each partition gets its share of the budget in proportion to its backlog, rounded down,
    except that a share below one is rounded up so a small partition is never starved (Kafka's
    rule; the total may pass ``max_rows`` by at most one per partition).
    """
    backlog = {tp: max(latest[tp] - start.get(tp, latest[tp]), 0) for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        size = backlog[tp]
        if size == 0:
            out[tp] = end
            continue
        share = max_rows * (size / total)
        admit = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(start[tp] + admit, end)
    return out


# -- JSON shape -----------------------------------------------------------------------------

def to_json(offsets: dict) -> dict:
    """``{TopicPartition: n}`` -> ``{"topic": {"0": n}}`` (Kafka's source offset JSON)."""
    out: dict = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_json(obj: dict) -> dict:
    """``{"topic": {"0": n}}`` -> ``{TopicPartition: n}``."""
    return {TopicPartition(t, int(p)): int(v) for t, parts in (obj or {}).items()
            for p, v in parts.items()}
