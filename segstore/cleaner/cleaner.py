"""Cleaner (REF §6.4–§6.11): one cleaning round of one log.

``Cleaner.clean`` builds the offset map over the dirty section, groups the segments up to the
map's end, filters every group into a ``.cleaned`` segment with the compiled kernel
(``_core.BatchFilter``), and swaps it in with the crash-safe protocol of REF §2.2. Plain batches
are filtered without the GIL; batches with producer ids, control batches, compressed and legacy
batches come back here one at a time, where transactions and active producers decide their
retention mode.
"""

from __future__ import annotations

import logging
import mmap as _mmap
import os
import time
from typing import Callable, Optional

import numpy as np

from .. import _core
from ..compression import decompress
from ..errors import CorruptRecordError
from ..records import ControlRecordType
from ..segment import CLEANED_SUFFIX, LogSegment, segment_paths
from . import map_helper as map_helper_mod
from .manager import LogToClean, segments_in_range
from .stats import CleanerStats
from .transactions import CleanedTransactionMetadata
from ..transaction_index import collect_aborted_transactions

log = logging.getLogger("segstore.cleaner")

INT_MAX = 2 ** 31 - 1
ATTR_CODEC = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40
MIN_CHUNK = 4 << 20   # below this, per-chunk Python costs more than the I/O buffer saves
# Cleaned output is gathered to this much before each write: a chunk of mostly superseded
# records filters to a few hundred KiB, and written that small a cleaned segment sits in small
# page-cache folios, which every later map of it pays for in faults (docs/performance.md).
OUTPUT_GATHER = 8 << 20


def group_segments_by_size(segments, max_size: int, max_index_size: int,
                           first_uncleanable_offset: int) -> list:
    """Kafka's groupSegmentsBySize (REF §6.6): consecutive segments whose log bytes and index
    bytes fit one segment and whose offsets fit 2^31-1 of the group's base (empty segments
    always merge)."""
    segs = list(segments)
    groups = []
    while segs:
        group = [segs.pop(0)]
        log_size = group[0].size
        index_size = _offset_index_bytes(group[0])
        time_index_size = _time_index_bytes(group[0])
        while segs:
            nxt = segs[0]
            last = (segs[1].base_offset - 1) if len(segs) > 1 else first_uncleanable_offset - 1
            if not (log_size + nxt.size <= max_size
                    and index_size + _offset_index_bytes(nxt) <= max_index_size
                    and time_index_size + _time_index_bytes(nxt) <= max_index_size
                    and (nxt.size == 0 or last - group[0].base_offset <= INT_MAX)):
                break
            group.append(segs.pop(0))
            log_size += nxt.size
            index_size += _offset_index_bytes(nxt)
            time_index_size += _time_index_bytes(nxt)
        groups.append(group)
    return groups


def _offset_index_bytes(seg) -> int:
    return seg.offset_index.entries * 8


def _time_index_bytes(seg) -> int:
    return seg.time_index.entries * 12


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


def _sync_files_without_gil(paths) -> None:
    """fsync the files a cleaning round wrote, releasing the GIL throughout.

    ``LogSegment.flush`` syncs the memory-mapped index files with ``mmap.flush``, whose msync
    keeps the GIL while the pages are written out (13 ms of a 190 ms round here), so another
    cleaner thread could not get back into Python meanwhile. An fsync of the same file writes
    the same dirty pages (mapped or not) and releases the GIL; the flush that follows finds
    them clean."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:       # a file the segment never created (a .txnindex without entries)
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Cleaner:
    """One cleaner thread's worker: its offset map and I/O chunk size (REF §6.2, §6.11).

    ``check_done(tp)`` raises CleaningAbortedError when the round must stop (abort,
    shutdown); ``throttler.maybe_throttle(n)`` is shared by all threads.
    """

    def __init__(self, thread_id: int, offset_map: "_core.OffsetMap", io_buffer_size: int,
                 throttler, clock: Callable[[], int],
                 check_done: Optional[Callable] = None, map_helper: bool = True):
        self.thread_id = thread_id
        self.offset_map = offset_map
        # May a helper thread map half of the dirty section (cleaner/map_helper.py)? The
        # service says no when it runs several cleaner threads.
        self.map_helper = map_helper and map_helper_mod.spare_core()
        self._side_map: Optional["_core.OffsetMap"] = None
        self.chunk_size = max(int(io_buffer_size), MIN_CHUNK)
        self.throttler = throttler
        self.clock = clock
        self.check_done = check_done or (lambda tp: None)
        self._out = bytearray(OUTPUT_GATHER + self.chunk_size + (self.chunk_size >> 3))
        self._crc_checked: set = set()
        self._table_hint: dict = {}   # TopicPartition -> table size its last map build grew to

    # -- a round ----------------------------------------------------------------------------
    def clean(self, ltc: LogToClean, now: Optional[int] = None) -> tuple:
        """One round over ``ltc.log`` (REF §6.4): returns (next first dirty offset, stats)."""
        lg = ltc.log
        tp = lg.topic_partition
        now = self.clock() if now is None else now
        truncations = lg.truncations
        segs = lg.segments
        first_dirty = ltc.first_dirty_offset
        upper = ltc.first_uncleanable_offset
        clean_section = [s for s in segments_in_range(segs, 0, first_dirty)
                         if s.base_offset < first_dirty]
        legacy_horizon = (clean_section[-1].last_modified_ms - lg.config.delete_retention_ms
                          if clean_section else 0)
        stats = CleanerStats(topic=tp.topic, partition=tp.partition, thread_id=self.thread_id,
                             first_dirty_offset=first_dirty, start_time=_wall_ms(),
                             forced=ltc.forced)
        log.info("Beginning cleaning of log %s", _name(lg))
        log.info("Building offset map for %s...", _name(lg))
        self.build_offset_map(lg, first_dirty, upper, stats)
        if self.offset_map.latest_offset < first_dirty:
            # Nothing dirty (a purge round): the clean section is rewritten with an empty map,
            # which keeps every record but drops tombstones and markers past their horizon.
            self.offset_map.update_latest_offset(first_dirty - 1)
        end_offset = self.offset_map.latest_offset + 1
        stats.map_complete_time = _wall_ms()
        stats.end_offset = end_offset
        log.info("Offset map for log %s complete.", _name(lg))
        log.info("Cleaning log %s (cleaning prior to %s, discarding tombstones prior to upper "
                 "bound deletion horizon %s)...", _name(lg), end_offset, legacy_horizon)
        txn = CleanedTransactionMetadata()
        groups = group_segments_by_size(segments_in_range(lg.segments, 0, end_offset),
                                        lg.config.segment_bytes, lg.config.segment_index_bytes,
                                        upper)
        filters = self.clean_groups(lg, groups, txn, now, legacy_horizon, upper, truncations,
                                    stats)
        for f in (filt.stats for filt in filters):
            stats.bytes_read += f["bytes_read"]
            stats.bytes_written += f["bytes_written"]
            stats.messages_read += f["messages_read"]
            stats.messages_written += f["messages_written"]
            stats.invalid_messages_read += f["invalid"]
        stats.buffer_utilization = self.offset_map.utilization
        stats.end_time = _wall_ms()
        return end_offset, stats

    # -- the offset map (REF §6.5) --------------------------------------------------------
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
        # Larger chunks while two threads map: each chunk's pages are dropped with a TLB
        # flush that interrupts the other thread (4 MiB chunks: 19 - 20 ms, 32 MiB: 16 - 17 ms
        # for the 1M-record benchmark section).
        chunk = max(self.chunk_size, map_helper_mod.CHUNK_BYTES)
        try:
            # Zeroed in place, its pages kept: a side map whose pages were dropped and are
            # faulted back in by the helper thread stalled the helper's first segment by
            # 10 - 15 ms in one build of three here (the cleaner's own map does not).
            side.clear(self._table_hint.get((tp, "later"), 0), keep_pages=True)
            later = CleanerStats()

            def map_later():
                for seg in dirty[k:]:
                    self.check_done(tp)
                    if self._map_segment(seg, start, aborted, later, omap=side, chunk=chunk):
                        raise AssertionError("the side map filled: its offsets were bounded")

            fut = map_helper_mod.submit(map_later)
            try:
                for seg in dirty[:k]:
                    self.check_done(tp)
                    if self._map_segment(seg, start, aborted, stats, chunk=chunk):
                        raise AssertionError("the offset map filled: its offsets were bounded")
            finally:
                error = fut.exception()   # waits: the helper never outlives the round's map
            if error is not None:
                raise error
            self._table_hint[(tp, "later")] = side.table_slots
            omap.merge_from(side)
            omap.update_latest_offset(end - 1)   # as the last segment of one pass leaves it
            stats.map_messages_read += later.map_messages_read
            stats.map_bytes_read += later.map_bytes_read
        finally:
            map_helper_mod.release()
        return True

    def release_side_map(self) -> None:
        """Give the helper's side map pages back to the OS (its next use faults them in)."""
        if self._side_map is not None:
            self._side_map.clear()

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

    # -- filtering the groups (REF §6.7) -----------------------------------------------------
    def clean_groups(self, lg, groups: list, txn, now: int, legacy_horizon: int, upper: int,
                     truncations: int, stats: CleanerStats) -> list:
        """Clean and swap in every group, in order; the BatchFilters used (their stats add up).

        With the map helper (cleaner/map_helper.py) the later groups, when every batch in them
        is plain (no producer id, control, codec or legacy format: nothing the transaction
        state or active producers decide), are filtered into ``.cleaned`` segments on the
        helper thread by a sibling Cleaner (its own output buffer and filter) while this
        thread cleans the earlier ones; this thread then swaps them in, in order, as it would
        have. The cleaned bytes are the same either way."""
        def new_filter():
            return _core.BatchFilter(self.offset_map, now, lg.config.delete_retention_ms, upper)

        filt = new_filter()
        k = self._filter_split(groups)
        if k is None or not map_helper_mod.try_acquire():
            for group in groups:
                self.clean_segments(lg, group, filt, txn, now, legacy_horizon, upper,
                                    truncations, stats)
            return [filt]
        sibling, later_filt = self._sibling(), new_filter()
        try:
            fut = map_helper_mod.submit(sibling.write_cleaned_groups, lg, groups[k:],
                                        later_filt, now, legacy_horizon, upper)
            try:
                for group in groups[:k]:
                    self.clean_segments(lg, group, filt, txn, now, legacy_horizon, upper,
                                        truncations, stats)
            except BaseException:
                _discard_cleaned(fut)
                raise
            later = fut.result()   # the helper's errors surface here
        finally:
            map_helper_mod.release()
        for i, (cleaned, group) in enumerate(zip(later, groups[k:])):
            try:
                self.swap_in(lg, cleaned, group, truncations, stats)
            except BaseException:
                for c in later[i + 1:]:
                    c.close()
                    c.delete_files()
                raise
        return [filt, later_filt]

    def _filter_split(self, groups: list) -> Optional[int]:
        """Index of the first group the helper filters, or None."""
        if not self.map_helper or len(groups) < 2:
            return None
        k = map_helper_mod.filter_split_point([sum(s.size for s in g) for g in groups])
        if k is None or not all(_plain_segment(seg) for g in groups[k:] for seg in g):
            return None
        return k

    def _sibling(self) -> "Cleaner":
        """A Cleaner sharing this one's map, throttle and checks, with its own output buffer."""
        sib = getattr(self, "_sibling_cleaner", None)
        if sib is None:
            sib = self._sibling_cleaner = Cleaner(self.thread_id, self.offset_map,
                                                  self.chunk_size, self.throttler, self.clock,
                                                  map_helper=False)
        sib.check_done = self.check_done
        sib._crc_checked = self._crc_checked
        return sib

    def write_cleaned_groups(self, lg, groups: list, filt, now: int, legacy_horizon: int,
                             upper: int) -> list:
        """Filter plain groups into their ``.cleaned`` segments (not swapped in); on an error
        none of them is left."""
        done = []
        txn = CleanedTransactionMetadata()   # plain batches never consult it
        try:
            for group in groups:
                done.append(self.write_cleaned(lg, group, filt, txn, now, legacy_horizon,
                                               upper))
        except BaseException:
            for cleaned in done:
                cleaned.close()
                cleaned.delete_files()
            raise
        return done

    def clean_segments(self, lg, group, filt, txn, now: int, legacy_horizon: int, upper: int,
                       truncations: int, stats: CleanerStats) -> None:
        """Filter ``group`` into ``<base>.log.cleaned`` and swap it in for the group."""
        cleaned = self.write_cleaned(lg, group, filt, txn, now, legacy_horizon, upper)
        self.swap_in(lg, cleaned, group, truncations, stats)

    def write_cleaned(self, lg, group, filt, txn, now: int, legacy_horizon: int,
                      upper: int) -> LogSegment:
        """Filter ``group`` into ``<base>.log.cleaned``, synced and dated like the group's last
        segment; deleted again on an error."""
        base = group[0].base_offset
        for path in segment_paths(lg.directory, base, CLEANED_SUFFIX).values():
            if os.path.exists(path):
                os.remove(path)
        cleaned = LogSegment(lg.directory, base, lg.config, lg.clock, suffix=CLEANED_SUFFIX,
                             preallocate=lg.config.preallocate)
        txn.txn_index_sink = cleaned.txn_index.append
        producers = lg.active_producers()
        try:
            for i, seg in enumerate(group):
                nxt = group[i + 1].base_offset if i + 1 < len(group) else seg.read_next_offset()
                txn.add_aborted_transactions(
                    collect_aborted_transactions(lg.segments, seg.base_offset, nxt))
                retain_legacy = seg.last_modified_ms > legacy_horizon
                log.info("Cleaning %s in log %s into %d with an upper bound deletion horizon %d "
                         "computed from the segment last modified time of %d,%s deletes.",
                         os.path.basename(seg.log_path), _name(lg), base, legacy_horizon,
                         seg.last_modified_ms, "retaining" if retain_legacy else "discarding")
                self._clean_into(lg, seg, cleaned, filt, txn, producers, retain_legacy, now,
                                 upper)
            cleaned.on_become_inactive()
            _sync_files_without_gil(segment_paths(lg.directory, base, CLEANED_SUFFIX).values())
            cleaned.flush()
            mtime = group[-1].last_modified_ms / 1000.0
            for path in segment_paths(lg.directory, base, CLEANED_SUFFIX).values():
                if os.path.exists(path):
                    os.utime(path, (mtime, mtime))
        except BaseException:
            cleaned.close()
            cleaned.delete_files()
            raise
        return cleaned

    def swap_in(self, lg, cleaned: LogSegment, group, truncations: int,
                stats: CleanerStats) -> None:
        """Swap ``cleaned`` in for ``group`` (REF §2.2); deleted again on an error."""
        try:
            self.check_done(lg.topic_partition)
            log.info("Swapping in cleaned segment %s for segment(s) %s in log %s",
                     os.path.basename(cleaned.log_path),
                     ",".join(os.path.basename(s.log_path) for s in group), _name(lg))
            lg.replace_segments([cleaned], group, expected_truncations=truncations)
            stats.segments_cleaned += len(group)
            stats.segments_written += 1
        except BaseException:
            cleaned.close()
            cleaned.delete_files()
            raise

    def _clean_into(self, lg, source, dest, filt, txn, producers: dict, retain_legacy: bool,
                    now: int, upper: int) -> None:
        """Filter every batch of ``source`` into ``dest`` chunk by chunk (REF §6.8)."""
        tp = lg.topic_partition
        size = source.size
        if size == 0:
            return
        mm = source.buffer(size)
        out = self._out
        pos = 0
        # Every batch's CRC is checked before any of its bytes is trusted or copied: here, or
        # already while the offset map was built over this segment.
        crc = id(source) not in self._crc_checked
        op = 0
        while pos < size:
            self.check_done(tp)
            end = min(pos + self.chunk_size, size)
            sr = _core.scan_batches(mm, pos, end, validate_crc=crc, file=source.log_path)
            if len(sr.batches) == 0:
                end = self._next_batch_end(source, mm, pos, size)
                sr = _core.scan_batches(mm, pos, end, validate_crc=crc, file=source.log_path)
            end = sr.valid_end
            self.throttler.maybe_throttle(end - pos)
            p = pos
            while p < end:
                code, p, op = filt.run(mm, p, end, out, op, file=source.log_path)
                if code == _core.FILTER_OUTPUT_FULL:
                    op = self._room(dest, op, _core.BatchFilter.room_needed(mm, p))
                    out = self._out
                elif code == _core.FILTER_NEED_PYTHON:
                    op, p = self._filter_special(lg, source, dest, mm, p, filt, txn, producers,
                                                 retain_legacy, now, upper, op)
                    out = self._out
            if op >= OUTPUT_GATHER:
                self._append(dest, out, op)
                op = 0
            _release(mm, pos, end)
            pos = end
        if op:
            self._append(dest, self._out, op)

    def _append(self, dest, out: bytearray, n: int) -> None:
        _core.finish_crcs(out, 0, n)
        data = memoryview(out)[:n]
        batches = _core.scan_batches(data).batches
        dest.append(data, batches)
        self.throttler.maybe_throttle(n)

    def _room(self, dest, op: int, need: int) -> int:
        """Make ``need`` bytes of room at the end of the output (draining or growing it)."""
        if len(self._out) - op < need:
            if op:
                self._append(dest, self._out, op)
                op = 0
            if len(self._out) < need:
                self._out = bytearray(need)
        return op

    def _filter_special(self, lg, source, dest, mm, p: int, filt, txn, producers: dict,
                        retain_legacy: bool, now: int, upper: int, op: int):
        """One batch that needs policy: producer ids, transactions, control, codecs, legacy."""
        h = _core.scan_batches(mm, p, max_batches=1, file=source.log_path).batches[0]
        size = int(h["size"])
        if h["magic"] < 2:
            return self._filter_legacy(source, dest, mm, p, size, filt, retain_legacy, op), \
                p + size
        attrs = int(h["attributes"])
        pid = int(h["producer_id"])
        last_offset = int(h["last_offset"])
        control = bool(attrs & ATTR_CONTROL)
        if control:
            ctype = None
            if h["records_count"] > 0:
                recs = _core.decode_records(mm, p, p + size, include_control=True,
                                            file=source.log_path)
                key = recs[0].key if recs else None
                ctype = (int.from_bytes(key[2:4], "big", signed=True)
                         if key is not None and len(key) >= 4 else ControlRecordType.UNKNOWN)
            can_discard = txn.on_control_batch_read(pid, last_offset, ctype)
            has_horizon = bool(attrs & ATTR_DELETE_HORIZON)
            discard_records = can_discard and has_horizon and int(h["base_timestamp"]) <= now
        else:
            can_discard = txn.on_batch_read(pid, last_offset, bool(attrs & ATTR_TRANSACTIONAL))
            discard_records = can_discard
        last_of_producer = False
        if pid >= 0 and pid in producers:
            last_data_offset, epoch = producers[pid]
            if last_data_offset is not None and last_data_offset >= 0:
                last_of_producer = last_data_offset == last_offset
            else:
                last_of_producer = control and epoch == int(h["producer_epoch"])
        if pid >= 0 and last_of_producer:
            mode = 0      # RETAIN_EMPTY: a live producer's last sequence must survive
        elif last_offset + 1 == upper:
            mode = 0      # RETAIN_EMPTY: keep the round's last offset
        elif discard_records:
            mode = 1      # DELETE
        else:
            mode = 2      # DELETE_EMPTY
        codec = attrs & ATTR_CODEC
        payload = None
        if codec and mode != 1:
            try:
                payload = decompress(codec, memoryview(mm)[p + 61:p + size])
            except CorruptRecordError as e:
                raise CorruptRecordError(e.reason, file=source.log_path, position=p) from None
        op = self._room(dest, op, _core.BatchFilter.room_needed(
            mm, p, None if payload is None else len(payload)))
        out = self._out
        start = op
        op, rebuilt = filt.filter_one(mm, p, mode, discard_records, can_discard and control,
                                      out, op, payload, file=source.log_path)
        if rebuilt and codec and op - start > 61:
            batch = _core.compress_batch_at(out, start, op - start, codec)
            capacity = len(out)
            out[start:op] = batch
            op = start + len(batch)
            if len(out) < capacity:  # keep the buffer's capacity for the next batches
                out.extend(bytes(capacity - len(out)))
        return op, p + size

    def _filter_legacy(self, source, dest, mm, p: int, size: int, filt, retain_legacy: bool,
                       op: int) -> int:
        # Magic 0/1 batches (a Kafka broker's old data) are rare: filtered in Python. An
        # uncompressed message kept whole is copied as is (Kafka does too); anything else that
        # is kept is rewritten as one v2 batch (segstore writes no legacy formats, and a
        # compressed legacy wrapper does not tell its first offset, so it cannot be indexed as
        # is). Tombstones rewritten that way follow the KIP-534 horizon from the next round.
        omap = self.offset_map
        recs = _core.decode_records(mm, p, p + size, validate_crc=True, file=source.log_path)
        latest = omap.latest_offset
        kept, invalid = [], 0
        for r in recs:
            if r.offset > latest:
                kept.append(r)
            elif r.key is None:
                invalid += 1
            elif r.offset >= omap.get(r.key) and (r.value is not None or retain_legacy):
                kept.append(r)
        data = b""
        if kept and len(kept) == len(recs) and not int(mm[p + 17]) & ATTR_CODEC:
            data = bytes(mm[p:p + size])
        elif kept:
            first = kept[0].offset
            data = _core.encode_batch(
                [r.value for r in kept], [r.key for r in kept],
                timestamps_ms=[r.timestamp for r in kept], base_offset=first,
                offset_deltas=[r.offset - first for r in kept],
                compression=int(mm[p + 17]) & ATTR_CODEC)
        if data:
            op = self._room(dest, op, len(data))
            self._out[op:op + len(data)] = data
        filt.count_legacy(len(recs), size, len(kept), len(data),
                          kept[-1].offset if kept else -1, invalid)
        return op + len(data)


def _plain_segment(seg) -> bool:
    """Whether every batch of ``seg`` is one the filter kernel decides alone: magic 2, no
    codec, not control or transactional, no producer id (a header walk, no CRCs)."""
    if seg.size == 0:
        return True
    b = seg.scan(validate_crc=False, raise_on_corrupt=False).batches
    return bool(((b["magic"] == 2) & ((b["attributes"] & (ATTR_CODEC | ATTR_TRANSACTIONAL
                                                           | ATTR_CONTROL)) == 0)
                 & (b["producer_id"] < 0)).all())


def _discard_cleaned(fut) -> None:
    """Wait for the helper's groups after an error here, and delete what it wrote."""
    try:
        cleaned = fut.result()
    except BaseException:
        return   # it deleted its own files; the error here is the one raised
    for c in cleaned:
        c.close()
        c.delete_files()


def dedupe_buffer_for(keys: int, load_factor: float, bytes_per_entry: int = 24) -> int:
    """Smallest offset-map memory that maps ``keys`` distinct keys in one round: map building
    stops once ``size >= int(slots * load_factor)``, so that must exceed ``keys``."""
    # Start just below the real answer (float rounding of (keys + 1) / lf can overshoot by a
    # slot) and step up to the first slot count whose fill limit exceeds keys.
    slots = max(int((keys + 1) / load_factor) - 2, 1)
    while int(slots * load_factor) <= keys:
        slots += 1
    return slots * bytes_per_entry


def _wall_ms() -> int:
    return int(time.monotonic() * 1000)


def _name(lg) -> str:
    return f"{lg.topic}-{lg.partition}"
