"""Retention: the segments Kafka's ``UnifiedLog.deleteOldSegments()`` removes (REF §5).

Three rules, each a predicate on a segment ``S`` (``next`` = the segment after it):

* ``retention.ms`` (>= 0; -1 = off): ``now - S.largest_timestamp > retention.ms``. The largest
  timestamp is the segment's largest record timestamp (its file's mtime when no record has one).
  A segment whose largest timestamp is in the future is never old enough; a warning says so.
* ``retention.bytes`` (>= 0; negative = off): only when the partition's size is at least
  ``retention.bytes``; ``diff = size - retention.bytes`` and ``S`` goes while ``diff - S.size >= 0``
  (then ``diff -= S.size``).
* log start offset: ``next`` exists and ``next.base_offset <= log_start_offset`` (the segment lies
  wholly below the log start offset, e.g. after ``delete_records``).

Which rules apply is the ``cleanup.policy``: ``delete`` (and ``compact,delete``) apply all three,
``compact`` alone and the empty policy apply only the log-start-offset rule. The rules run in
Kafka's order (log start offset, size, time), each pass over what the previous ones left. A pass
is Kafka's ``deletableSegments``: candidates oldest first, stopping at the first segment that
fails; a segment qualifies only if the high watermark (the log end offset: a single-node log has
no replicas) is at or above its upper bound (the next segment's base offset, or the log end offset
for the last one) and it is not the last segment while empty.

Deleting (:func:`enforce`): if every segment would go, the log rolls first, so an empty active
segment at the log end offset remains; the segments leave the log's segment list at once
(``PartitionLog.delete_segments``), their files are renamed ``.deleted`` and deleted after
``file.delete.delay.ms`` by the store's delayed-delete queue, and the log start offset rises to the
first surviving segment's base offset. A reader that already took a snapshot of the segment list
keeps reading the renamed files until the delayed delete closes them.

:func:`plan_retention` is pure (it reads segment sizes, base offsets and largest timestamps and
changes nothing); :func:`enforce` applies a plan to a :class:`~segstore.log.PartitionLog` under the
log's lock, so an append cannot grow a segment between the decision and the deletion.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from .checkpoint import fsync_dir
from .errors import ReadOnlyStoreError
from .records import TopicPartition

log = logging.getLogger("segstore.retention")

#: Reasons a segment is deleted: the rule (Kafka's config key, or the log start offset).
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
LOG_START_OFFSET = "log-start-offset"

Predicate = Callable[[object, Optional[object]], bool]


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeletedSegment:
    """One segment that retention deleted (or, in a dry run, would delete)."""

    base_offset: int
    end_offset: int           # exclusive upper bound: the next segment's base, or the log end
    size_bytes: int
    largest_timestamp: int    # -1 when not looked at (segments removed by the log start rule)
    reason: str               # RETENTION_MS, RETENTION_BYTES or LOG_START_OFFSET

    def describe(self, now_ms: Optional[int] = None) -> str:
        """One line: the segment, its offsets and size, and why it goes."""
        why = self.reason
        if self.reason == RETENTION_MS and now_ms is not None:
            why += f" (largest timestamp {self.largest_timestamp}, {now_ms - self.largest_timestamp} ms old)"
        elif self.reason == LOG_START_OFFSET:
            why = "below the log start offset"
        return (f"{self.base_offset:020d}: offsets [{self.base_offset}, {self.end_offset}), "
                f"{self.size_bytes} bytes, {why}")


@dataclass(frozen=True)
class PartitionRetention:
    """What one retention pass did to (or, in a dry run, would do to) one partition."""

    topic_partition: TopicPartition
    cleanup_policy: tuple
    old_log_start_offset: int
    log_start_offset: int       # after the pass (a dry run: what it would be)
    log_end_offset: int
    deleted: tuple = ()         # DeletedSegment, oldest first
    rolled: bool = False        # every segment went, so the log rolled first

    @property
    def segments_deleted(self) -> int:
        """How many segments went."""
        return len(self.deleted)

    @property
    def bytes_deleted(self) -> int:
        """Bytes of the ``.log`` files that went (index files not counted, as in Kafka)."""
        return sum(d.size_bytes for d in self.deleted)

    def __str__(self) -> str:
        tp = self.topic_partition
        if not self.deleted:
            return f"{tp.topic}-{tp.partition}: nothing to delete, log start offset {self.log_start_offset}"
        s = "s" if len(self.deleted) != 1 else ""
        text = (f"{tp.topic}-{tp.partition}: {len(self.deleted)} segment{s}, {self.bytes_deleted} "
                f"bytes; log start offset {self.old_log_start_offset} -> {self.log_start_offset}")
        if self.rolled:
            text += " (rolled first: every segment was deleted)"
        return text


@dataclass
class RetentionReport:
    """One retention pass over a store: per partition, what went and the new log start offset.

    ``partitions`` has an entry for every partition the pass looked at (most often with nothing
    deleted); ``errors`` maps a partition whose pass failed to the error's text (the pass goes on
    with the other partitions, the failure is also logged).
    """

    now_ms: int
    dry_run: bool = False
    partitions: dict = field(default_factory=dict)   # TopicPartition -> PartitionRetention
    errors: dict = field(default_factory=dict)       # TopicPartition -> str

    @property
    def segments_deleted(self) -> int:
        """Segments deleted across every partition."""
        return sum(len(p.deleted) for p in self.partitions.values())

    @property
    def bytes_deleted(self) -> int:
        """Bytes deleted across every partition."""
        return sum(p.bytes_deleted for p in self.partitions.values())

    @property
    def changed(self) -> dict:
        """Only the partitions that lost (or would lose) segments."""
        return {tp: p for tp, p in self.partitions.items() if p.deleted}

    def __getitem__(self, tp) -> PartitionRetention:
        return self.partitions[TopicPartition(*tp)]

    def __str__(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        kind = "retention dry run" if self.dry_run else "retention pass"
        changed = self.changed
        lines = [f"{kind} at {self.now_ms} ms: {verb} {self.segments_deleted} segment"
                 f"{'' if self.segments_deleted == 1 else 's'} ({self.bytes_deleted} bytes) from "
                 f"{len(changed)} of {len(self.partitions)} partitions"]
        for tp in sorted(changed):
            p = changed[tp]
            lines.append("  " + str(p))
            lines.extend("    " + d.describe(self.now_ms) for d in p.deleted)
        for tp in sorted(self.errors):
            lines.append(f"  {tp.topic}-{tp.partition}: failed: {self.errors[tp]}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The rules (pure)
# ---------------------------------------------------------------------------------------------

def deletable_segments(segments: Sequence, predicate: Predicate, log_end_offset: int,
                       high_watermark: Optional[int] = None) -> list:
    """Kafka's ``deletableSegments(predicate)``: the longest prefix of ``segments`` (oldest
    first) whose every segment is below the high watermark, satisfies ``predicate(segment,
    next_segment_or_None)`` and is not the last segment while empty."""
    hw = log_end_offset if high_watermark is None else high_watermark
    out = []
    n = len(segments)
    for i in range(n):
        seg = segments[i]
        nxt = segments[i + 1] if i + 1 < n else None
        if nxt is None and seg.size == 0:
            break  # (checked first: Kafka's order evaluates the predicate, to no effect)
        upper = nxt.base_offset if nxt is not None else log_end_offset
        if not (hw >= upper and predicate(seg, nxt)):
            break
        out.append(seg)
    return out


def log_start_offset_breached(log_start_offset: int) -> Predicate:
    """The segment lies wholly below the log start offset (the next one starts at or below it)."""
    def pred(seg, nxt) -> bool:
        return nxt is not None and nxt.base_offset <= log_start_offset
    return pred


def retention_size_breached(segments: Sequence, retention_bytes: int) -> Optional[Predicate]:
    """``retention.bytes``: None when off (negative) or when the partition is smaller than it.

    The returned predicate is stateful, like Kafka's: it spends ``size - retention.bytes`` on the
    segments it accepts, in order.
    """
    if retention_bytes < 0:
        return None
    size = 0
    for s in segments:
        size += s.size
    if size < retention_bytes:
        return None
    diff = size - retention_bytes

    def pred(seg, nxt) -> bool:
        nonlocal diff
        if diff - seg.size >= 0:
            diff -= seg.size
            return True
        return False
    return pred


def retention_time_breached(retention_ms: int, now_ms: int,
                            topic_partition=None) -> Optional[Predicate]:
    """``retention.ms``: None when off (negative). Future timestamps never expire (a warning)."""
    if retention_ms < 0:
        return None

    def pred(seg, nxt) -> bool:
        largest = seg.largest_timestamp
        if largest > now_ms:
            where = (f"{topic_partition.topic}-{topic_partition.partition}: "
                     if topic_partition is not None else "")
            log.warning(
                "%ssegment %d has largest timestamp %d, %d ms in the future (now %d): it cannot "
                "expire by retention.ms until then", where, seg.base_offset, largest,
                largest - now_ms, now_ms)
        return now_ms - largest > retention_ms
    return pred


def plan_retention(segments: Sequence, log_start_offset: int, log_end_offset: int, config,
                   now_ms: int, *, high_watermark: Optional[int] = None,
                   topic_partition=None) -> list:
    """Which segments a retention pass deletes, as ``[(segment, reason)]`` oldest first.

    ``segments`` is a log's segment list (oldest first; anything with ``base_offset``, ``size``
    and ``largest_timestamp``), ``config`` a TopicConfig (``cleanup_policy``, ``retention_ms``,
    ``retention_bytes``). Nothing is changed. When every segment is in the plan, the caller must
    roll first (:func:`enforce` does).
    """
    remaining = list(segments)
    plan: list = []
    start = log_start_offset
    policy = config.cleanup_policy
    delete = "delete" in policy

    def run(pred: Optional[Predicate], reason: str) -> None:
        nonlocal remaining, start
        if pred is None or not remaining:
            return
        found = deletable_segments(remaining, pred, log_end_offset, high_watermark)
        if not found:
            return
        plan.extend((s, reason) for s in found)
        remaining = remaining[len(found):]
        # Kafka raises the log start offset after each deletion; a full deletion leaves only the
        # empty segment the roll creates at the log end offset.
        start = max(start, remaining[0].base_offset if remaining else log_end_offset)

    run(log_start_offset_breached(start), LOG_START_OFFSET)
    if delete:
        run(retention_size_breached(remaining, config.retention_bytes), RETENTION_BYTES)
        run(retention_time_breached(config.retention_ms, now_ms, topic_partition), RETENTION_MS)
    return plan


# ---------------------------------------------------------------------------------------------
# Applying a plan to a PartitionLog
# ---------------------------------------------------------------------------------------------

def enforce(plog, now_ms: int, *, dry_run: bool = False) -> PartitionRetention:
    """Run one retention pass over ``plog`` (a PartitionLog) at ``now_ms``; returns what went.

    With ``dry_run=True`` nothing changes (this works on read-only logs too). Otherwise: roll if
    every segment goes, remove the segments (renamed ``.deleted``, deleted after
    ``file.delete.delay.ms``), raise the log start offset, fsync the partition directory so the
    renames survive a power loss.
    """
    if not dry_run and plog.readonly:
        raise ReadOnlyStoreError(f"log {plog.topic}-{plog.partition} is open read-only")
    tp = plog.topic_partition
    config = plog.config  # one read: a concurrent alter_topic_config applies at the next pass
    if plog.readonly:
        plog.log_start_offset  # read-only logs re-list their directory on access
    # The log's lock: appends (which may grow or roll the active segment) wait until the chosen
    # segments are gone, as in Kafka's deleteOldSegments. Readers never take it.
    with plog._lock:
        st = plog._state
        segments = st.segments
        old_start, leo = st.log_start_offset, st.log_end_offset
        plan = plan_retention(segments, old_start, leo, config, now_ms, topic_partition=tp)
        if not plan:
            return PartitionRetention(tp, config.cleanup_policy, old_start, old_start, leo)
        deleted = []
        for i, (seg, reason) in enumerate(plan):
            nxt = segments[i + 1].base_offset if i + 1 < len(segments) else leo
            largest = seg.largest_timestamp if reason == RETENTION_MS else -1
            deleted.append(DeletedSegment(seg.base_offset, nxt, seg.size, largest, reason))
        rolled = len(plan) == len(segments)
        if dry_run:
            new_start = max(old_start, leo if rolled else segments[len(plan)].base_offset)
            return PartitionRetention(tp, config.cleanup_policy, old_start, new_start, leo,
                                      tuple(deleted), rolled)
        doomed = [seg for seg, _ in plan]
        if rolled:
            active = plog.roll()
            # Kafka drops the last deletable segment if the roll handed it back (same base).
            keep = [i for i, s in enumerate(doomed)
                    if s is not active and s.base_offset != active.base_offset]
            doomed = [doomed[i] for i in keep]
            deleted = [deleted[i] for i in keep]
        if doomed:
            plog.delete_segments(doomed)
            fsync_dir(plog.directory)
        st = plog._state
        for d in deleted:
            log.info("deleted segment %d of %s-%d (%d bytes) by %s; log start offset now %d",
                     d.base_offset, tp.topic, tp.partition, d.size_bytes, d.reason,
                     st.log_start_offset)
        return PartitionRetention(tp, config.cleanup_policy, old_start, st.log_start_offset,
                                  st.log_end_offset, tuple(deleted), rolled)
