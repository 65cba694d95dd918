"""LogCleanerManager (REF §6.3): which logs need cleaning, how dirty they are, and their states.

The manager owns the ``cleaner-offset-checkpoint`` file (first dirty offset per partition), the
per-partition cleaning states (None / InProgress / Aborted / Paused(n)), the set of uncleanable
partitions, and the selection of the next log to clean. It never touches bytes.

Selection goes beyond Kafka (design §5): logs overdue by ``max.compaction.lag.ms`` come first,
most overdue first, so the lag holds as a deadline whenever the threads have capacity; then the
log with the highest dirty ratio above ``min.cleanable.dirty.ratio``.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

from ..checkpoint import CLEANER_OFFSET_CHECKPOINT, CheckpointError, OffsetCheckpointFile
from ..errors import CleaningAbortedError, InvalidOffsetError, now_argument
from ..records import TopicPartition
from .stats import PreCleanStats

log = logging.getLogger("segstore.cleaner")

IN_PROGRESS = "InProgress"
ABORTED = "Aborted"
PAUSED = "Paused"


def segments_in_range(segments, start: int, end: int) -> list:
    """Kafka's ``logSegments(from, to)``: the segment holding ``start`` (the floor by base
    offset, or the first) and every later one whose base offset is below ``end``; nothing
    when ``start == end``."""
    if start >= end:
        return []
    bases = [s.base_offset for s in segments]
    i = max(bisect.bisect_right(bases, start) - 1, 0)
    return [s for s in segments[i:] if s.base_offset < end]


def non_active_segments_from(segments, offset: int) -> list:
    """Segments from the one holding ``offset`` up to, not including, the active segment."""
    if len(segments) < 2:
        return []
    return segments_in_range(segments[:-1], offset, segments[-1].base_offset)


def first_batch_timestamp(seg) -> int:
    """Max timestamp of a segment's first batch (-1 when empty): Kafka's getFirstBatchTimestamp."""
    if seg.size == 0:
        return -1
    b = seg.scan(0, max_batches=1).batches
    return int(b["max_timestamp"][0]) if len(b) else -1


_HORIZONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _horizon_batches(seg) -> tuple:
    """(delete horizon, tombstones, is control, first removable offset) of each of the
    segment's batches that carries a KIP-534 delete horizon (the first removable offset: its
    first tombstone's, or a control batch's base offset; None when it has neither), cached per
    segment object and size (a sealed segment never changes; cleaning makes new objects), so
    selection passes and ``describe`` read a segment once."""
    from .. import _core
    cached = _HORIZONS.get(seg)
    if cached is not None and cached[0] == seg.size:
        return cached[1]
    rows = []
    if seg.size:
        b = seg.scan(0).batches
        marked = b[((b["attributes"] & 0x40) != 0) & (b["magic"] == 2)]
        buf = seg.buffer(seg.size) if len(marked) else None
        for pos, size, attrs, horizon, base in zip(marked["position"], marked["size"],
                                                   marked["attributes"],
                                                   marked["base_timestamp"],
                                                   marked["base_offset"]):
            cols = _core.decode_columns(buf, int(pos), int(pos + size), validate_crc=False)
            tomb = ~cols.values.valid
            control = bool(attrs & 0x20)
            first = (int(base) if control else
                     int(cols.offsets[tomb][0]) if tomb.any() else None)
            rows.append((int(horizon), int(tomb.sum()), control, first))
    _HORIZONS[seg] = (seg.size, tuple(rows))
    return _HORIZONS[seg][1]


def earliest_delete_horizon(segments, below: Optional[int] = None) -> Optional[int]:
    """Smallest KIP-534 delete horizon of a batch that still holds a tombstone or is a control
    batch, among the segments (None when there is none): when it passes, a cleaning would
    remove something. With ``below``, only batches with such a record below that offset
    count (a round cannot remove one it does not reach)."""
    found = [h for seg in segments for h, _, _, first in _horizon_batches(seg)
             if first is not None and (below is None or first < below)]
    return min(found) if found else None


def tombstones_awaiting_horizon(segments, now: int) -> tuple:
    """(tombstones, the latest delete horizon) of batches whose KIP-534 delete horizon is still
    ahead of ``now``: what the next cleaning after that horizon will remove."""
    waiting = [(h, tombstones) for seg in segments
               for h, tombstones, _, _ in _horizon_batches(seg) if h > now]
    return sum(t for _, t in waiting), max((h for h, _ in waiting), default=-1)


def purge_reach(first_dirty: int, first_uncleanable: int) -> int:
    """The offset below which a round can remove past-horizon tombstones and markers: the
    first dirty offset, or the first uncleanable one when the round maps up to it."""
    return max(first_dirty, first_uncleanable)


@dataclass
class LogToClean:
    """A candidate log with its cleanable range and dirty ratio (Kafka's LogToClean)."""

    log: object
    first_dirty_offset: int
    uncleanable_offset: int          # before rounding to a segment base
    first_uncleanable_offset: int    # rounded down to a segment base: the round's upper bound
    clean_bytes: int
    cleanable_bytes: int
    compaction_delay_ms: int = 0
    forced: bool = False
    purge_due: bool = False          # tombstones/markers in the clean section passed their horizon

    @property
    def topic_partition(self) -> TopicPartition:
        return self.log.topic_partition

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def need_compaction_now(self) -> bool:
        return self.compaction_delay_ms > 0

    @property
    def overdue(self) -> bool:
        """Past ``max.compaction.lag.ms`` with something to clean."""
        return self.need_compaction_now and self.cleanable_bytes > 0

    @property
    def eligible(self) -> bool:
        """Kafka's rule: overdue, or dirty ratio strictly above ``min.cleanable.dirty.ratio``."""
        return self.overdue or self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio


class LogCleanerManager:
    """Cleanable ranges, dirty ratios, selection, states and checkpoints for one store.

    ``logs`` returns the store's LogMap (``{TopicPartition: PartitionLog}``); ``path`` is the
    store root, where ``cleaner-offset-checkpoint`` lives (Kafka keeps one per log directory).
    """

    def __init__(self, path: str, logs: Callable[[], dict], clock: Callable[[], int]):
        self.path = path
        self._logs = logs
        self.clock = clock
        self.checkpoint_file = OffsetCheckpointFile(os.path.join(path, CLEANER_OFFSET_CHECKPOINT))
        self._lock = threading.Condition(threading.RLock())
        self._states: dict = {}           # tp -> IN_PROGRESS | ABORTED | (PAUSED, n)
        self.uncleanable: dict = {}       # tp -> reason (str)
        self.time_of_last_run = clock()
        self.dirtiest_ratio = 0.0         # max-dirty-percent source
        self.last_pre_clean_stats = PreCleanStats()

    # -- checkpoints ------------------------------------------------------------------------
    def all_cleaner_checkpoints(self) -> dict:
        """{TopicPartition: first dirty offset} from the checkpoint file ({} when absent or bad)."""
        try:
            return self.checkpoint_file.read()
        except FileNotFoundError:
            return {}
        except (CheckpointError, OSError, ValueError) as e:
            log.warning("ignoring unreadable %s: %s", self.checkpoint_file.path, e)
            return {}

    def update_checkpoints(self, update: Optional[tuple] = None,
                           remove: Optional[TopicPartition] = None) -> None:
        """Rewrite the checkpoint with ``update`` = (tp, offset) applied, ``remove`` dropped
        and entries of partitions that no longer exist left out."""
        with self._lock:
            live = set(self._logs())
            cps = {tp: off for tp, off in self.all_cleaner_checkpoints().items() if tp in live}
            if update is not None:
                cps[TopicPartition(*update[0])] = update[1]
            if remove is not None:
                cps.pop(TopicPartition(*remove), None)
            self.checkpoint_file.write(cps)

    def maybe_truncate_checkpoint(self, tp: TopicPartition, offset: int) -> None:
        """Lower a partition's checkpoint to ``offset`` after a truncation below it."""
        with self._lock:
            cp = self.all_cleaner_checkpoints().get(TopicPartition(*tp))
            if cp is not None and cp > offset:
                self.update_checkpoints(update=(tp, offset))

    def _each_log(self) -> list:
        """``(tp, log)`` of every partition, loading only compacted topics' logs; one whose
        load fails (out of descriptors, an I/O error) sits this pass out rather than stopping
        it for the others. Called without the manager's lock, which loads must not hold up."""
        def unloadable(tp, e):
            log.warning("leaving %s-%d out of this cleaner pass: its log cannot be loaded: %s",
                        tp.topic, tp.partition, e)
        return self._logs().items(on_error=unloadable, compacted_only=True)

    # -- ranges and ratios ------------------------------------------------------------------
    def cleanable_offsets(self, lg, checkpoint: Optional[int], now: int) -> tuple:
        """(first dirty offset, uncleanable offset, force checkpoint update) per REF §6.3."""
        start, leo = lg.log_start_offset, lg.log_end_offset
        force = False
        if checkpoint is None:
            first_dirty = start
        elif checkpoint < start or checkpoint > leo:
            if not (checkpoint < start and lg.config.delete):
                log.warning("resetting first dirty offset of %s to log start offset %d since "
                            "the checkpointed offset %d is invalid", lg.topic_partition, start,
                            checkpoint)
            first_dirty, force = start, True
        else:
            first_dirty = checkpoint
        segs = lg.segments
        bounds = [lg.last_stable_offset, segs[-1].base_offset]
        lag = lg.config.min_compaction_lag_ms
        if lag > 0:
            for s in non_active_segments_from(segs, first_dirty):
                if s.largest_timestamp > now - lag:
                    bounds.append(s.base_offset)
                    break
        return first_dirty, max(first_dirty, min(bounds)), force

    @staticmethod
    def cleanable_bytes(segs, first_dirty: int, uncleanable: int) -> tuple:
        """(first uncleanable offset rounded to a segment base, cleanable bytes)."""
        nas = non_active_segments_from(segs, uncleanable)
        first_uncleanable = nas[0].base_offset if nas else segs[-1].base_offset
        lo = min(first_dirty, first_uncleanable)
        size = sum(s.size for s in segments_in_range(segs, lo, first_uncleanable))
        return first_uncleanable, size

    @staticmethod
    def max_compaction_delay(lg, segs, first_dirty: int, now: int) -> int:
        """How long past ``max.compaction.lag.ms`` the oldest dirty record is (0 if not)."""
        stamps = [t for t in (first_batch_timestamp(s)
                              for s in non_active_segments_from(segs, first_dirty)) if t > 0]
        if not stamps:
            return 0
        clean_until = now - max(lg.config.max_compaction_lag_ms, 0)
        earliest = min(stamps)
        return clean_until - earliest if earliest < clean_until else 0

    def log_to_clean(self, lg, checkpoint: Optional[int], now: int,
                     update_checkpoint: bool = True) -> LogToClean:
        """Range, bytes, ratio and delay of one log (force-updating a bad checkpoint unless
        ``update_checkpoint`` is False)."""
        first_dirty, uncleanable, force = self.cleanable_offsets(lg, checkpoint, now)
        if force and update_checkpoint:
            self.update_checkpoints(update=(lg.topic_partition, first_dirty))
        segs = lg.segments
        clean = sum(s.size for s in segments_in_range(segs, -1, first_dirty)
                    if s.base_offset < first_dirty)
        first_uncleanable, cleanable = self.cleanable_bytes(segs, first_dirty, uncleanable)
        delay = self.max_compaction_delay(lg, segs, first_dirty, now)
        return LogToClean(lg, first_dirty, uncleanable, first_uncleanable, clean, cleanable,
                          delay)

    # -- selection --------------------------------------------------------------------------
    def grab_filthiest_compacted_log(self, now: Optional[int] = None,
                                     on_error: Optional[Callable] = None) -> Optional[LogToClean]:
        """Pick the next log to clean and mark it InProgress (None when nothing qualifies).

        Overdue logs (``max.compaction.lag.ms`` passed, with cleanable bytes) first, most
        overdue first; then the highest dirty ratio strictly above ``min.cleanable.dirty.ratio``.
        ``on_error(tp, exc)`` is told about a log whose range could not be computed.
        """
        now = self.clock() if now is None else now
        logs = self._each_log()   # loads outside the lock: a first pass may load thousands
        with self._lock:
            self.time_of_last_run = now
            cps = self.all_cleaner_checkpoints()
            pre = PreCleanStats()
            candidates = []
            for tp, lg in logs:
                if (not lg.config.compact or tp in self._states or tp in self.uncleanable
                        or lg.closed or lg.offline):
                    continue
                try:
                    ltc = self.log_to_clean(lg, cps.get(tp), now)
                except Exception as e:  # an unreadable log must not stop the others
                    if on_error is None:
                        raise
                    on_error(tp, e)
                    continue
                pre.record_delay(ltc.compaction_delay_ms)
                if ltc.total_bytes > 0:
                    candidates.append(ltc)
            self.dirtiest_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
            pre.max_dirty_ratio = self.dirtiest_ratio
            overdue = sorted((c for c in candidates if c.overdue),
                             key=lambda c: -c.compaction_delay_ms)
            dirty = sorted((c for c in candidates if c.eligible and not c.overdue),
                           key=lambda c: -c.cleanable_ratio)
            # Beyond Kafka: a quiet log whose tombstones passed their delete horizon is cleaned
            # too, so they do not linger until new data makes it dirty again (KAFKA-8522).
            chosen_ids = {id(c) for c in overdue + dirty}
            purge = [c for c in candidates if id(c) not in chosen_ids and self._purge_due(c, now)]
            pre.cleanable_partitions = len(overdue) + len(dirty)
            pre.overdue = [c.topic_partition for c in overdue]
            self.last_pre_clean_stats = pre
            chosen = (overdue + dirty + purge)[:1]
            if not chosen:
                return None
            self._states[chosen[0].topic_partition] = IN_PROGRESS
            return chosen[0]

    def grab_log(self, tp: TopicPartition, now: Optional[int] = None,
                 force: bool = False) -> Optional[LogToClean]:
        """Take one named log for an on-demand clean (``store.compact``): it must not be in
        any state; returns None when it has nothing to clean or is not eligible, or is
        quarantined as uncleanable (``force`` cleans whatever its dirty ratio and retries a
        quarantined log)."""
        now = self.clock() if now is None else now
        tp = TopicPartition(*tp)
        with self._lock:
            lg = self._logs().get(tp)
            if lg is None:
                return None
            lg._check_online()   # its swap would be refused: say so before the round's work
            while tp in self._states and self._states[tp] in (IN_PROGRESS, ABORTED):
                self._lock.wait(0.1)   # a cleaner thread has it: wait for its round
            if tp in self._states:     # paused
                return None
            if tp in self.uncleanable and not force:
                return None            # quarantined after an error: only force retries it
            ltc = self.log_to_clean(lg, self.all_cleaner_checkpoints().get(tp), now)
            if not self.wants_on_demand_clean(ltc, now, force):
                return None
            ltc.forced = force and not ltc.eligible
            self.uncleanable.pop(tp, None)   # a forced retry; a new error quarantines it again
            self._states[tp] = IN_PROGRESS
            return ltc

    def wants_on_demand_clean(self, ltc: LogToClean, now: int, force: bool) -> bool:
        """Whether an on-demand clean (``grab_log``) takes ``ltc``: eligible with cleanable
        bytes, tombstones or markers due for purging, or ``force`` with cleanable bytes.
        ``segstore compact --dry-run`` asks the same question."""
        return ((ltc.eligible and ltc.cleanable_bytes > 0) or self._purge_due(ltc, now)
                or (force and ltc.cleanable_bytes > 0))

    @staticmethod
    def _purge_due(ltc: LogToClean, now: int) -> bool:
        # A round removes a past-horizon tombstone or marker only below where its map ends:
        # below the first dirty offset, or further where the dirty section is cleanable. One
        # beyond that (stamped by a round whose map filled up, in a segment that has become
        # uncleanable since) would make every round a purge that removes nothing.
        clean = [s for s in segments_in_range(ltc.log.segments, 0, ltc.first_dirty_offset)
                 if s.base_offset < ltc.first_dirty_offset]
        h = earliest_delete_horizon(clean, purge_reach(ltc.first_dirty_offset,
                                                       ltc.first_uncleanable_offset))
        ltc.purge_due = h is not None and h <= now
        return ltc.purge_due

    def deletable_logs(self) -> list:
        """Compacted logs that are in no state and not uncleanable, marked InProgress for a
        retention pass (Kafka's deletableLogs); hand them back with ``done_deleting``."""
        logs = self._each_log()   # loads outside the lock, as grab_filthiest_compacted_log
        with self._lock:
            out = []
            for tp, lg in logs:
                # Closed: its topic was deleted since the listing (and its state cleared).
                if (lg.config.compact and tp not in self._states and tp not in self.uncleanable
                        and not lg.offline and not lg.closed):
                    self._states[tp] = IN_PROGRESS
                    out.append((tp, lg))
            return out

    # -- states -----------------------------------------------------------------------------
    def state(self, tp: TopicPartition):
        """None, 'InProgress', 'Aborted' or ('Paused', n)."""
        with self._lock:
            return self._states.get(TopicPartition(*tp))

    def check_cleaning_aborted(self, tp: TopicPartition) -> None:
        """Raise CleaningAbortedError when the round of ``tp`` has been aborted.

        Reads the state without the lock (one dict lookup, atomic): a round calls this once a
        chunk, and another thread's ``done_cleaning`` holds the lock through its checkpoint's
        fsyncs, which stalled this round for nothing. An abort set just after the read is seen
        at the next check, as it would be with the lock."""
        if self._states.get(tp) == ABORTED:
            raise CleaningAbortedError(f"cleaning of {tp.topic}-{tp.partition} was aborted")

    def done_cleaning(self, tp: TopicPartition, end_offset: Optional[int]) -> None:
        """End a round: checkpoint ``end_offset`` (when it completed) and leave InProgress;
        an aborted round becomes Paused(1) and wakes the thread waiting in abort_and_pause."""
        with self._lock:
            st = self._states.get(tp)
            if st == IN_PROGRESS:
                if end_offset is not None:
                    self.update_checkpoints(update=(tp, end_offset))
                del self._states[tp]
            elif st == ABORTED:
                self._states[tp] = (PAUSED, 1)
            self._lock.notify_all()

    def any_aborted(self, tps) -> bool:
        """Whether someone asked to pause one of ``tps`` (abort_and_pause_cleaning) and waits."""
        with self._lock:
            return any(self._states.get(tp) == ABORTED for tp in tps)

    def done_deleting(self, tps) -> None:
        """End a retention pass over compacted logs (see deletable_logs)."""
        with self._lock:
            for tp in tps:
                st = self._states.get(tp)
                if st == IN_PROGRESS:
                    del self._states[tp]
                elif st == ABORTED:
                    self._states[tp] = (PAUSED, 1)
            self._lock.notify_all()

    def abort_and_pause_cleaning(self, tp: TopicPartition, timeout_s: float = 60.0) -> None:
        """Abort a running round of ``tp`` (or pause an idle one) and wait until it is paused.

        Used before truncation and topic deletion; undo with resume_cleaning."""
        tp = TopicPartition(*tp)
        with self._lock:
            st = self._states.get(tp)
            if st is None:
                self._states[tp] = (PAUSED, 1)
            elif st == IN_PROGRESS:
                self._states[tp] = ABORTED
            elif isinstance(st, tuple):
                self._states[tp] = (PAUSED, st[1] + 1)
            if not self._lock.wait_for(lambda: isinstance(self._states.get(tp), tuple),
                                       timeout_s):
                raise TimeoutError(f"cleaning of {tp.topic}-{tp.partition} did not stop")

    def resume_cleaning(self, tp: TopicPartition) -> None:
        """Paused(n) -> Paused(n-1), or no state at n = 1; resuming an unpaused log is an error."""
        tp = TopicPartition(*tp)
        with self._lock:
            st = self._states.get(tp)
            if not isinstance(st, tuple):
                raise InvalidOffsetError(
                    f"cleaning of {tp.topic}-{tp.partition} is not paused (state {st})")
            if st[1] == 1:
                del self._states[tp]
            else:
                self._states[tp] = (PAUSED, st[1] - 1)
            self._lock.notify_all()

    def abort_cleaning(self, tp: TopicPartition) -> None:
        """Abort any running round and forget the state (abort_and_pause + resume)."""
        self.abort_and_pause_cleaning(tp)
        self.resume_cleaning(tp)

    def remove_partition(self, tp: TopicPartition) -> None:
        """Forget a deleted partition: its state, quarantine entry and checkpoint."""
        tp = TopicPartition(*tp)
        with self._lock:
            self._states.pop(tp, None)
            self.uncleanable.pop(tp, None)
            self.update_checkpoints(remove=tp)
            self._lock.notify_all()

    # -- uncleanable partitions -------------------------------------------------------------
    def mark_uncleanable(self, tp: TopicPartition, reason: str) -> None:
        """Quarantine a partition whose cleaning failed unexpectedly (until restart)."""
        with self._lock:
            self.uncleanable[TopicPartition(*tp)] = reason

    def forget_missing_uncleanable(self) -> None:
        """Drop quarantine entries of partitions that no longer exist."""
        with self._lock:
            live = set(self._logs())
            for tp in [tp for tp in self.uncleanable if tp not in live]:
                del self.uncleanable[tp]

    def uncleanable_bytes(self) -> int:
        """Cleanable bytes of the quarantined partitions (Kafka's uncleanable-bytes)."""
        total = 0
        logs = self._logs()
        cps = self.all_cleaner_checkpoints()
        for tp in list(self.uncleanable):
            lg = logs.get(tp)
            if lg is None or lg.closed:
                continue
            try:
                first_dirty, unc, _ = self.cleanable_offsets(lg, cps.get(tp), self.clock())
                total += self.cleanable_bytes(lg.segments, first_dirty, unc)[1]
            except Exception:  # a broken log counts nothing rather than failing the gauge
                continue
        return total

    # -- explanation ------------------------------------------------------------------------
    def describe(self, topic: str, partition: int, now_ms: Optional[int] = None) -> dict:
        """What an operator tunes by, for one partition (``segstore describe``)."""
        now = now_argument(now_ms, self.clock)
        tp = TopicPartition(topic, partition)
        lg = self._logs()[tp]
        cfg = lg.config
        # A description never rewrites the checkpoint (a bad one is reset when cleaning).
        ltc = self.log_to_clean(lg, self.all_cleaner_checkpoints().get(tp), now,
                                update_checkpoint=False)
        segs = ltc.log.segments
        first_dirty, clean = ltc.first_dirty_offset, ltc.clean_bytes
        cleanable, delay, ratio = ltc.cleanable_bytes, ltc.compaction_delay_ms, ltc.cleanable_ratio
        overdue = ltc.overdue
        with self._lock:
            state = self._states.get(tp)
            unclean = tp in self.uncleanable
            why_unclean = self.uncleanable.get(tp, "")
        eligible = cfg.compact and not unclean and state is None and ltc.eligible
        if not cfg.compact:
            reason = f"cleanup.policy is {','.join(cfg.cleanup_policy) or 'empty'}, not compact"
        elif unclean:
            reason = f"uncleanable after an error: {why_unclean}"
        elif state is not None:
            reason = f"cleaning state is {state}"
        elif overdue:
            reason = f"overdue: {delay} ms past max.compaction.lag.ms"
        elif cleanable == 0:
            reason = ("nothing cleanable: the dirty section is in the active segment or "
                      "younger than min.compaction.lag.ms")
        elif eligible:
            reason = (f"dirty ratio {ratio:.3f} > min.cleanable.dirty.ratio "
                      f"{cfg.min_cleanable_dirty_ratio}")
        else:
            reason = (f"dirty ratio {ratio:.3f} <= min.cleanable.dirty.ratio "
                      f"{cfg.min_cleanable_dirty_ratio}")
        tombstones, horizon = tombstones_awaiting_horizon(segs, now)
        return {
            "topic": topic, "partition": partition, "segments": len(segs),
            "size_bytes": sum(s.size for s in segs), "log_start_offset": lg.log_start_offset,
            "log_end_offset": lg.log_end_offset, "first_dirty_offset": first_dirty,
            "first_uncleanable_offset": ltc.first_uncleanable_offset, "clean_bytes": clean,
            "cleanable_bytes": cleanable, "dirty_ratio": ratio,
            "min_cleanable_ratio": cfg.min_cleanable_dirty_ratio,
            "compaction_delay_ms": delay, "max_compaction_lag_ms": cfg.max_compaction_lag_ms,
            "eligible": bool(eligible), "reason": reason, "uncleanable": unclean,
            "state": state, "tombstones_awaiting_horizon": tombstones,
            "latest_delete_horizon_ms": horizon,
        }
