"""Filter pushdown (pyspark 4.1+, ECO §1.4): what the reader can cut before reading.

``topic`` and ``partition`` predicates prune whole partitions; ``offset`` comparisons clamp each
offset range; a lower bound on ``timestamp`` starts each partition at the first offset whose
timestamp reaches it (``offsets_for_times``). Pruning by topic, partition and offset is exact,
so those filters are consumed; timestamps inside a partition are not monotonic, so timestamp
filters (and everything else) go back to Spark, which evaluates them on every row. Spark requires
the returned filters to be the very objects it passed in.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Optional

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_NEVER_NULL = {"topic", "partition", "offset", "timestamp", "timestampType"}


@dataclass
class Pruning:
    """What pushed filters allow: partition predicates, offset bounds and a timestamp floor.

    ``topic_preds`` / ``partition_preds`` are ``(op, value)`` pairs, all of which must hold;
    offsets are kept in ``[offset_min, offset_end)``; ``timestamp_min_ms`` is the smallest
    record timestamp (ms) any row can have and still pass.
    """

    topic_preds: list = field(default_factory=list)
    partition_preds: list = field(default_factory=list)
    offset_min: Optional[int] = None
    offset_end: Optional[int] = None
    timestamp_min_ms: Optional[int] = None

    def keeps(self, tp) -> bool:
        """Whether a topic partition can hold a matching row."""
        return (all(_holds(op, tp.topic, v) for op, v in self.topic_preds)
                and all(_holds(op, tp.partition, v) for op, v in self.partition_preds))

    def clamp(self, start: int, end: int) -> tuple:
        """An offset range narrowed to the offset bounds (possibly empty)."""
        if self.offset_min is not None:
            start = max(start, self.offset_min)
        if self.offset_end is not None:
            end = min(end, self.offset_end)
        return start, max(start, end)

    def _lower_offset(self, v: int) -> None:
        self.offset_min = v if self.offset_min is None else max(self.offset_min, v)

    def _upper_offset(self, end: int) -> None:
        self.offset_end = end if self.offset_end is None else min(self.offset_end, end)

    def _lower_timestamp(self, ms: int) -> None:
        if ms <= 0:
            # Nothing to prune at or before the epoch, and offset_for_time reads -1, -2 and -3
            # as Kafka's LATEST, EARLIEST and MAX_TIMESTAMP markers.
            return
        self.timestamp_min_ms = ms if self.timestamp_min_ms is None else max(self.timestamp_min_ms, ms)


def _holds(op: str, x, v) -> bool:
    if op == "eq":
        return x == v
    if op == "in":
        return x in v
    if op == "gt":
        return x > v
    if op == "ge":
        return x >= v
    if op == "lt":
        return x < v
    if op == "le":
        return x <= v
    if op == "prefix":
        return x.startswith(v)
    raise AssertionError(op)


def _micros(value) -> Optional[int]:
    """A pushed timestamp value as microseconds since the epoch (naive values are UTC)."""
    if not isinstance(value, _dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return (value - _EPOCH) // _dt.timedelta(microseconds=1)


def push(filters: list, pruning: Pruning) -> list:
    """Record what ``filters`` allow in ``pruning``; return the filters Spark must still apply.

    The returned list holds the original objects (Spark matches them by identity).
    """
    from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual,
                                        In, IsNotNull, LessThan, LessThanOrEqual,
                                        StringStartsWith)

    ops = {EqualTo: "eq", EqualNullSafe: "eq", GreaterThan: "gt", GreaterThanOrEqual: "ge",
           LessThan: "lt", LessThanOrEqual: "le", In: "in", StringStartsWith: "prefix"}
    remaining = []
    for f in filters:
        attr = getattr(f, "attribute", None)
        col = attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None
        op = ops.get(type(f))
        consumed = False
        if isinstance(f, IsNotNull) and col in _NEVER_NULL:
            consumed = True  # these columns are never null
        elif col == "topic" and op in ("eq", "in", "prefix"):
            value = frozenset(f.value) if op == "in" else f.value
            pruning.topic_preds.append((op, value))
            consumed = True
        elif col == "partition" and op is not None and op != "prefix":
            value = frozenset(f.value) if op == "in" else f.value
            pruning.partition_preds.append((op, value))
            consumed = True
        elif col == "offset" and op is not None and op != "prefix":
            consumed = _push_offset(op, f.value, pruning)
        elif col == "timestamp" and op in ("eq", "gt", "ge"):
            us = _micros(f.value)
            if us is not None:
                # A record's timestamp is ms*1000 us: the smallest ms that can still pass.
                pruning._lower_timestamp(us // 1000 + 1 if op == "gt" else -(-us // 1000))
        if not consumed:
            remaining.append(f)
    return remaining


def _push_offset(op: str, value, pruning: Pruning) -> bool:
    """Offset comparisons become exact bounds; ``In`` only narrows (Spark still checks it)."""
    if op == "in":
        ints = [v for v in value if isinstance(v, int)]
        if len(ints) == len(value) and ints:
            pruning._lower_offset(min(ints))
            pruning._upper_offset(max(ints) + 1)
        return False
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    if op == "eq":
        pruning._lower_offset(value)
        pruning._upper_offset(value + 1)
    elif op == "gt":
        pruning._lower_offset(value + 1)
    elif op == "ge":
        pruning._lower_offset(value)
    elif op == "lt":
        pruning._upper_offset(value)
    elif op == "le":
        pruning._upper_offset(value + 1)
    return True
