"""Building a cleaning round's offset map (REF §6.5): Kafka's Cleaner.buildOffsetMap.

``OffsetMapBuild`` is the part of :class:`~.cleaner.Cleaner` that maps the dirty section's
keys to their latest offsets, segment by segment in I/O-buffer chunks, checking CRCs as it
goes (a segment mapped whole needs no second CRC pass when it is filtered), with the map
helper's split (:mod:`.map_helper`) when a lone cleaner thread has a core to spare; and
the dedupe-buffer sizing advice logged when a round stops on a full map.
"""

from __future__ import annotations

import logging
import mmap as _mmap
from typing import Optional

import numpy as np

from .. import _core
from ..errors import CorruptRecordError
from ..transaction_index import collect_aborted_transactions
from . import map_helper as map_helper_mod
from .manager import segments_in_range
from .stats import CleanerStats

log = logging.getLogger("segstore.cleaner")


def _aborted_array(txns) -> np.ndarray:
    return np.array([(t.producer_id, t.first_offset, t.last_offset) for t in txns],
                    dtype=np.int64).reshape(-1, 3)


def _release(mm, start: int, end: int) -> None:
    # Pages of a mapped segment that a round is done with leave this process's memory (the
    # page cache keeps them): a round's footprint stays at the map plus one chunk. Dropped
    # without the GIL (mmap.madvise keeps it through the TLB flush).
    if not isinstance(mm, _mmap.mmap) or end <= start:
        return
    try:
        _core.release_pages(mm, start, end)
    except (OSError, ValueError, TypeError):
        pass


class OffsetMapBuild:
    """Mixin of Cleaner: the offset map build. Uses the Cleaner's ``offset_map``,
    ``chunk_size``, ``throttler``, ``check_done`` and ``map_helper``; keeps the map's state
    between rounds (table sizes, the helper's side map) and the ids of the segments whose
    CRCs the last build checked."""

    offset_map: "_core.OffsetMap"
    chunk_size: int
    map_helper: bool

    def _init_map_build(self) -> None:
        self._crc_checked: set = set()
        self._table_hint: dict = {}   # TopicPartition -> table size its last map build grew to
        # Whether a round that stops on a full map counts the dirty section's distinct keys
        # for the sizing advice (a decode of the rest of the section; a dry run needs it once).
        self.size_advice = True

    def map_dirty_section(self, lg, first_dirty: int, upper: int, stats: CleanerStats) -> int:
        """Build the round's offset map over [first_dirty, upper) and return the round's end
        offset (REF §6.4 step 3): where the next round's dirty section starts."""
        self.build_offset_map(lg, first_dirty, upper, stats)
        if self.offset_map.latest_offset < first_dirty:
            # Nothing dirty (a purge round): the clean section is rewritten with an empty map,
            # which keeps every record but drops tombstones and markers past their horizon.
            self.offset_map.update_latest_offset(first_dirty - 1)
        stats.end_offset = self.offset_map.latest_offset + 1
        return stats.end_offset

    def build_offset_map(self, lg, start: int, end: int, stats: CleanerStats) -> None:
        """Map keys of [start, end) to their latest offsets, stopping when the map is full."""
        omap = self.offset_map
        tp = lg.topic_partition
        self._crc_checked = set()   # ids of segments whose every batch CRC the map build checked
        segments = lg.segments   # one snapshot (a read-only log re-lists its directory)
        dirty = segments_in_range(segments, start, end)
        aborted = _aborted_array(collect_aborted_transactions(segments, start, end))
        full = False
        if not self._map_with_helper(tp, dirty, start, end, aborted, stats):
            self._clear_map(tp)
            for i, seg in enumerate(dirty):
                self.check_done(tp)
                nxt = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
                full = self._map_segment(seg, start, aborted, stats)
                if full:
                    stats.map_full = True
                    break
                omap.update_latest_offset(nxt - 1)
        self._table_hint[tp] = omap.table_slots
        if full and self.size_advice:
            stats.dirty_keys = distinct_keys(dirty, start, end)
            stats.wanted_buffer_bytes = dedupe_buffer_for(
                stats.dirty_keys, omap.load_factor, omap.bytes_per_entry)
            log.info("Offset map of %s filled up at offset %d: a dedupe buffer of %d bytes "
                     "(log.cleaner.dedupe.buffer.size, per thread) would have covered the whole "
                     "dirty section [%d, %d)", _name(lg), omap.latest_offset,
                     stats.wanted_buffer_bytes, start, end)
        if omap.strategy != "offset":
            # A strategy compares values, not offsets: an already-clean record can still beat
            # a dirty one, so the clean section updates (never adds) the mapped keys.
            for seg in segments_in_range(segments, 0, start):
                if seg.base_offset >= start:
                    break
                self._map_segment(seg, -1, aborted, stats, update_only=True, end_offset=start)
        log.info("Building offset map for log %s for %d segments in offset range [%d, %d).",
                 _name(lg), len(dirty), start, end)

    def _clear_map(self, tp) -> None:
        # Start the probed table at the size this partition's last build grew to: a round like
        # the last one then skips the growth steps (each re-places every entry). A table no
        # larger than that is zeroed in place: for the 1M-record benchmark's 6 MiB table,
        # 0.4 ms, against 1 ms for dropping its pages and faulting them back in as it fills.
        hint = self._table_hint.get(tp, 0)
        self.offset_map.clear(hint, keep_pages=self.offset_map.table_slots <= hint)

    def _map_with_helper(self, tp, dirty: list, start: int, end: int, aborted,
                         stats: CleanerStats) -> bool:
        """Map ``dirty`` in two parts at once, the later one into a side map on the helper
        thread, then merge it in (cleaner/map_helper.py); False (the map untouched) when the
        split does not apply or the helper is busy."""
        omap = self.offset_map
        if not self.map_helper or omap.strategy != "offset" or not map_helper_mod.try_acquire():
            return False
        side = None
        try:
            side = map_helper_mod.side_map(omap.load_factor)   # ours while we hold the helper
            k = map_helper_mod.split_point(dirty, start, end, omap.max_desired_size,
                                           side.max_desired_size)
            if k is None:
                return False
            return self._map_split(tp, dirty, k, start, end, aborted, stats, side)
        finally:
            if side is not None and side.size:
                side.clear()   # not merged: its pages go back to the OS (merged, it is drained)
            map_helper_mod.release()

    def _map_split(self, tp, dirty: list, k: int, start: int, end: int, aborted,
                   stats: CleanerStats, side) -> bool:
        omap = self.offset_map
        # Larger chunks while two threads map: each chunk's pages are dropped with a TLB
        # flush that interrupts the other thread. 16 MiB maps each 12.7 MB segment of the 1M-
        # record benchmark in one call (16.7 - 17.1 ms against 17.7 - 18.1 ms at 8 MiB, 19 - 20
        # at 4 MiB); a round's peak grows by about 6 MiB, far within its budget.
        chunk = max(self.chunk_size, map_helper_mod.CHUNK_BYTES)
        # Zeroed and faulted in here, on this thread: when the helper faulted the side map's
        # pages in itself, its first segment stalled 10 - 15 ms in one build of three. Without
        # a hint for this partition the table starts at the size it last grew to (growing
        # re-places every entry, and touches new pages on the helper).
        side.clear(self._table_hint.get((tp, "later"), side.table_slots), keep_pages=True)
        later = CleanerStats()

        def map_part(segs, into, part_stats, check=lambda: None):
            for seg in segs:
                check()
                self.check_done(tp)
                if self._map_segment(seg, start, aborted, part_stats, omap=into, chunk=chunk):
                    raise AssertionError("an offset map filled: its offsets were bounded")

        # After mapping, each thread looks up half of the side map's slots in the map
        # (OffsetMap.merge_lookup writes only the offsets of keys the map holds, so the halves
        # cannot collide); this thread then inserts the keys the map lacked, in order. On one
        # thread the merge was an eighth of the build (2.1 of 18 ms, 1M records). The threads
        # meet in between (each half reads the whole side map's table for its range, and
        # writes into the map) without the helper going to sleep: a new job for it started
        # 0.5 - 0.7 ms late. The lookups drain the side map as they read it: zeroing it at
        # the next build's start took 1 ms (its pages faulted in again), the helper waiting.
        meeting = map_helper_mod.Meeting()

        def later_part(check):
            ok = False
            try:
                map_part(dirty[k:], side, later, check)
                ok = True
            finally:
                meeting.arrive(1, ok)
            if meeting.wait_for(0, check):
                return omap.merge_lookup(side, side.table_slots // 2, drain=True)
            return None

        job = map_helper_mod.start(later_part)
        if job is None:
            return False
        earlier = []

        def earlier_part():
            ok = False
            try:
                self._clear_map(tp)   # while the helper maps already
                map_part(dirty[:k], omap, stats)
                ok = True
            finally:
                meeting.arrive(0, ok)
            if meeting.wait_for(1):
                earlier.append(omap.merge_lookup(side, 0, side.table_slots // 2, drain=True))

        # The helper never outlives the round's maps: beside() waits for it.
        looked_up, error = job.beside(earlier_part)
        if error is not None:
            raise error
        self._table_hint[(tp, "later")] = side.table_slots
        omap.merge_insert(side, earlier[0], looked_up)
        omap.update_latest_offset(end - 1)   # as the last segment of one pass leaves it
        stats.map_messages_read += later.map_messages_read
        stats.map_bytes_read += later.map_bytes_read
        return True

    def _map_segment(self, seg, start: int, aborted, stats: CleanerStats, *,
                     update_only: bool = False, end_offset: Optional[int] = None,
                     omap: Optional["_core.OffsetMap"] = None,
                     chunk: Optional[int] = None) -> bool:
        size = seg.size
        if size == 0:
            return False
        if omap is None:
            omap = self.offset_map
        mm = seg.buffer(size)
        pos = seg.offset_index.lookup(start)[1] if start > seg.base_offset else 0
        pos = min(pos, size)
        # CRCs are checked while mapping; a segment mapped whole needs no second CRC pass
        # when it is filtered (the bytes cannot change: sealed segments are immutable).
        whole = pos == 0 and not update_only
        end = None
        while pos < size:
            if end is None:
                end = min(pos + (chunk or self.chunk_size), size)
            full, stop, msgs, nbytes = _core.build_offset_map(
                omap, mm, pos, end, start, aborted, update_only=update_only,
                end_offset=end_offset, validate_crc=not update_only, file=seg.log_path)
            stats.map_messages_read += msgs
            stats.map_bytes_read += nbytes
            self.throttler.maybe_throttle(nbytes)
            if full:
                _release(mm, pos, stop)
                return True
            if stop == pos:  # not one whole batch in the chunk: read up to the next one's end
                end = self._next_batch_end(seg, mm, pos, size)
                continue
            _release(mm, pos, stop)
            pos, end = stop, None
        if whole and _core.crc32c_without_gil():
            self._crc_checked.add(id(seg))
        return False

    @staticmethod
    def _next_batch_end(seg, mm, pos: int, size: int) -> int:
        # A chunk without one complete batch: the next batch is larger than the chunk. Its
        # declared size may run past the segment only if the segment is corrupt (KAFKA-6834).
        if size - pos < 12:
            raise CorruptRecordError("segment ends inside a batch header; segment may be corrupt",
                                     file=seg.log_path, position=pos)
        declared = int.from_bytes(mm[pos + 8:pos + 12], "big", signed=True) + 12
        if declared <= 12 or pos + declared > size:
            raise CorruptRecordError(
                f"batch declares {declared} bytes but only {size - pos} remain in the segment; "
                f"segment may be corrupt", file=seg.log_path, position=pos)
        log.info("Growing cleaner I/O buffers from %d bytes to %d bytes.", size - pos,
                 declared)
        return pos + declared


def distinct_keys(dirty: list, start: int, end: int) -> int:
    """Distinct keys (by MurmurHash3 digest, as the map compares them) of the records of
    ``dirty`` (segments) in [start, end): what a map covering the section must hold. Counted a
    segment at a time, so memory stays at the distinct digests plus one segment's."""
    seen = np.empty((0, 2), dtype=np.uint64)
    for seg in dirty:
        if seg.size == 0:
            continue
        cols = _core.decode_columns(seg.buffer(seg.size), 0, seg.size, min_offset=start,
                                    end_offset=end, validate_crc=False)
        seen = _core.distinct_digests(np.concatenate(
            [seen, _core.murmur3_128_digests(cols.keys)]))
    return len(seen)


def dedupe_buffer_for(keys: int, load_factor: float, bytes_per_entry: int = 24) -> int:
    """Smallest offset-map memory that maps ``keys`` distinct keys in one round: map building
    stops once ``size >= int(slots * load_factor)``, so that must exceed ``keys``."""
    # Start just below the real answer (float rounding of (keys + 1) / lf can overshoot by a
    # slot) and step up to the first slot count whose fill limit exceeds keys.
    slots = max(int((keys + 1) / load_factor) - 2, 1)
    while int(slots * load_factor) <= keys:
        slots += 1
    return slots * bytes_per_entry


def _name(lg) -> str:
    return f"{lg.topic}-{lg.partition}"
