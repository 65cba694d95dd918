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
        self._side_map: Optional["_core.OffsetMap"] = None
        self._crc_checked: set = set()
        self._table_hint: dict = {}   # TopicPartition -> table size its last map build grew to

    def build_offset_map(self, lg, start: int, end: int, stats: CleanerStats) -> None:
        """Map keys of [start, end) to their latest offsets, stopping when the map is full."""
        omap = self.offset_map
        tp = lg.topic_partition
        # Start the probed table at the size this partition's last build grew to: a round like
        # the last one then skips the growth steps (each re-places every entry).
        omap.clear(self._table_hint.get(tp, 0))
        self._crc_checked = set()   # ids of segments whose every batch CRC the map build checked
        dirty = segments_in_range(lg.segments, start, end)
        aborted = _aborted_array(collect_aborted_transactions(lg.segments, start, end))
        full = False
        if not self._map_with_helper(tp, dirty, start, end, aborted, stats):
            for i, seg in enumerate(dirty):
                self.check_done(tp)
                nxt = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
                full = self._map_segment(seg, start, aborted, stats)
                if full:
                    stats.map_full = True
                    break
                omap.update_latest_offset(nxt - 1)
        self._table_hint[tp] = omap.table_slots
        if full:
            stats.wanted_buffer_bytes = self._wanted_buffer(lg, dirty, start, end)
            log.info("Offset map of %s filled up at offset %d: a dedupe buffer of %d bytes "
                     "(log.cleaner.dedupe.buffer.size, per thread) would have covered the whole "
                     "dirty section [%d, %d)", _name(lg), omap.latest_offset,
                     stats.wanted_buffer_bytes, start, end)
        if omap.strategy != "offset":
            # A strategy compares values, not offsets: an already-clean record can still beat
            # a dirty one, so the clean section updates (never adds) the mapped keys.
            for seg in segments_in_range(lg.segments, 0, start):
                if seg.base_offset >= start:
                    break
                self._map_segment(seg, -1, aborted, stats, update_only=True, end_offset=start)
        log.info("Building offset map for log %s for %d segments in offset range [%d, %d).",
                 _name(lg), len(dirty), start, end)

    def _map_with_helper(self, tp, dirty: list, start: int, end: int, aborted,
                         stats: CleanerStats) -> bool:
        """Map ``dirty`` in two parts at once, the later one into a side map on the helper
        thread, then merge it in (cleaner/map_helper.py); False (nothing mapped) when the
        split does not apply or the helper is busy."""
        omap = self.offset_map
        if not self.map_helper or omap.strategy != "offset":
            return False
        if self._side_map is None or self._side_map.load_factor != omap.load_factor:
            self._side_map = _core.OffsetMap(map_helper_mod.SIDE_MAP_BYTES, omap.load_factor)
        side = self._side_map
        k = map_helper_mod.split_point(dirty, start, end, omap.max_desired_size,
                                       side.max_desired_size)
        if k is None or not map_helper_mod.try_acquire():
            return False
        try:
            return self._map_split(tp, dirty, k, start, end, aborted, stats, side)
        finally:
            side.clear()   # merged or not: its pages go back to the OS
            map_helper_mod.release()

    def _map_split(self, tp, dirty: list, k: int, start: int, end: int, aborted,
                   stats: CleanerStats, side) -> bool:
        omap = self.offset_map
        # Larger chunks while two threads map: each chunk's pages are dropped with a TLB
        # flush that interrupts the other thread (4 MiB chunks: 19 - 20 ms, 32 MiB: 16 - 17 ms
        # for the 1M-record benchmark section; 8 MiB keeps a round within its memory budget).
        chunk = max(self.chunk_size, map_helper_mod.CHUNK_BYTES)
        # Zeroed and faulted in here, on this thread: when the helper faulted the side map's
        # pages in itself, its first segment stalled 10 - 15 ms in one build of three.
        side.clear(self._table_hint.get((tp, "later"), 0), keep_pages=True)
        later = CleanerStats()

        def map_part(segs, into, part_stats, check=lambda: None):
            for seg in segs:
                check()
                self.check_done(tp)
                if self._map_segment(seg, start, aborted, part_stats, omap=into, chunk=chunk):
                    raise AssertionError("an offset map filled: its offsets were bounded")

        job = map_helper_mod.start(lambda check: map_part(dirty[k:], side, later, check))
        if job is None:
            return False
        # The helper never outlives the round's maps: beside() waits for it.
        _, error = job.beside(lambda: map_part(dirty[:k], omap, stats))
        if error is not None:
            raise error
        self._table_hint[(tp, "later")] = side.table_slots
        omap.merge_from(side)
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

    def _wanted_buffer(self, lg, dirty, start: int, end: int) -> int:
        """Bytes of dedupe buffer that would hold every distinct key of [start, end) at the
        load factor: the sizing advice logged when a round stops on a full map."""
        digests = [np.empty((0, 2), dtype=np.uint64)]
        for seg in dirty:
            if seg.size == 0:
                continue
            cols = _core.decode_columns(seg.buffer(seg.size), 0, seg.size, min_offset=start,
                                        end_offset=end, validate_crc=False)
            digests.append(_core.murmur3_128_digests(cols.keys))
        keys = len(_core.distinct_digests(np.concatenate(digests)))
        return dedupe_buffer_for(keys, self.offset_map.load_factor,
                                 self.offset_map.bytes_per_entry)

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
