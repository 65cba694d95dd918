"""Cleaner (REF §6.4–§6.11): one cleaning round of one log.

``Cleaner.clean`` builds the offset map over the dirty section (:mod:`.map_build`), groups
the segments up to the map's end, filters every group into a ``.cleaned`` segment with the compiled kernel
(``_core.BatchFilter``), and swaps it in with the crash-safe protocol of REF §2.2. Plain batches
are filtered without the GIL; batches with producer ids, control batches, compressed and legacy
batches come back here one at a time, where transactions and active producers decide their
retention mode.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Optional


from .. import _core
from ..compression import decompress
from ..errors import CorruptRecordError
from ..flusher import PendingFlush
from ..records import ControlRecordType
from ..segment import CLEANED_SUFFIX, LogSegment, segment_paths
from . import map_helper as map_helper_mod
from . import spare_memory
from .manager import LogToClean, segments_in_range
from .map_build import OffsetMapBuild, _name, _release
from .stats import CleanerStats
from .swaps import InOrderSwaps, discard, discard_unsealed
from .transactions import CleanedTransactionMetadata
from ..transaction_index import collect_aborted_transactions

log = logging.getLogger("segstore.cleaner")

INT_MAX = 2 ** 31 - 1
ATTR_CODEC = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40
# The smallest I/O chunk: smaller ones cost more Python per byte, and each chunk's pages are
# dropped with an madvise whose TLB flush interrupts the other core (two cleaner threads
# against one: 1.59 at 4 MiB, 1.71 at 16 MiB, mean of four).
MIN_CHUNK = 16 << 20
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


class _GroupClaims:
    """The groups of a split round not taken yet, ``[front, back]``: the cleaner thread takes
    them from the front, the helper from the back."""

    def __init__(self, n: int):
        self._lock = threading.Lock()
        self.front, self.back = 0, n - 1

    def first(self) -> Optional[int]:
        with self._lock:
            if self.front > self.back:
                return None
            self.front += 1
            return self.front - 1

    def last(self) -> Optional[int]:
        with self._lock:
            if self.front > self.back:
                return None
            self.back -= 1
            return self.back + 1

    def give_back(self, i: int) -> None:
        """Return group ``i``, the last one taken from the back."""
        with self._lock:
            self.back = i


class Cleaner(OffsetMapBuild):
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
        self._init_map_build()
        self.chunk_size = max(int(io_buffer_size), MIN_CHUNK)
        self.throttler = throttler
        self.clock = clock
        self.check_done = check_done or (lambda tp: None)
        self._out = spare_memory.new_buffer(OUTPUT_GATHER + self.chunk_size
                                            + (self.chunk_size >> 3))

    def release_buffer(self) -> None:
        """This Cleaner is done: its output buffer goes to cleaner/spare_memory.py."""
        out, self._out = self._out, None
        if out is not None:
            spare_memory.give_buffer(out)

    # -- a round ----------------------------------------------------------------------------
    def clean(self, ltc: LogToClean, now: Optional[int] = None) -> tuple:
        """One round over ``ltc.log`` (REF §6.4): returns (next first dirty offset, stats)."""
        lg = ltc.log
        tp = lg.topic_partition
        now = self.clock() if now is None else now
        # The round takes a transaction as decided by its marker, which may lie above the
        # recovery point: a crash could take the marker and leave the compaction it allowed
        # (the cleaned segments are fsynced), reopening the transaction over data already
        # dropped. Kafka bounds its cleaner by the high watermark, replicated data; here what
        # the round relies on (everything up to the log end when ``ltc`` was taken) is made
        # durable first.
        lg.flush()
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
        end_offset = self.map_dirty_section(lg, first_dirty, upper, stats)
        stats.map_complete_time = _wall_ms()
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

    # -- filtering the groups (REF §6.7) -----------------------------------------------------
    def clean_groups(self, lg, groups: list, txn, now: int, legacy_horizon: int, upper: int,
                     truncations: int, stats: CleanerStats) -> list:
        """Clean and swap in every group, in order; the BatchFilters used (their stats add up).

        With the map helper (cleaner/map_helper.py) the two threads share the groups from both
        ends: this thread cleans and swaps in groups from the first on, while a sibling Cleaner
        (its own output buffer and filter) on the helper thread filters groups from the last
        one back into ``.cleaned`` segments, each thread taking the next group as it finishes
        one, until they meet. The helper takes only plain groups (no producer id, control,
        codec or legacy format: nothing the transaction state or active producers decide); at
        the first other one it stops and leaves it, and the groups before it, to this thread.
        This thread then swaps the helper's segments in, in order, as it would have. The
        cleaned bytes are the same either way."""
        def new_filter():
            return _core.BatchFilter(self.offset_map, now, lg.config.delete_retention_ms, upper)

        filt = new_filter()
        filters = [filt]
        swaps = InOrderSwaps(self, lg, truncations, stats)
        try:
            later = None
            if self._split_filter(groups) and map_helper_mod.try_acquire():
                try:
                    later_filt = new_filter()
                    later = self._clean_split(lg, groups, filt, later_filt, txn, now,
                                              legacy_horizon, upper, swaps)
                finally:
                    map_helper_mod.release()
            if later is None:
                for group in groups:
                    swaps.add(self.write_unsealed(lg, group, filt, txn, now, legacy_horizon,
                                                  upper), group)
            else:
                filters.append(later_filt)
                swaps.add_all(later)
            swaps.finish()
        except BaseException:
            swaps.discard()
            raise
        return filters

    def _clean_split(self, lg, groups: list, filt, later_filt, txn, now: int,
                     legacy_horizon: int, upper: int, swaps: InOrderSwaps) -> Optional[list]:
        """Groups cleaned and swapped in here from the first on while the helper writes the
        cleaned segments of groups from the last one back (see clean_groups). Returns the
        helper's ``(cleaned segment, its PendingFlush, group)`` in group order, neither sealed
        nor swapped in, once this thread has cleaned every other group (added to ``swaps``);
        None when the helper could not start (nothing done). On any error none of the
        helper's files is left. The sibling lasts only as long
        as this call; its output buffer goes back to cleaner/spare_memory.py.

        Sharing the groups as they come balances the threads whatever each group costs: the
        last groups keep (and write) most of a round's output, and what writing it costs here
        depends on whether its page-cache pages are new to the VM (the benchmark's last group
        took 11 - 26 ms to filter, the first ones 5 ms)."""
        sibling = Cleaner(self.thread_id, self.offset_map, self.chunk_size, self.throttler,
                          self.clock, map_helper=False)
        sibling._crc_checked = self._crc_checked
        claims = _GroupClaims(len(groups))

        def write_later(check):
            def check_done(tp):
                check()
                self.check_done(tp)
            sibling.check_done = check_done
            plain_txn = CleanedTransactionMetadata()   # plain batches never consult it
            done = []
            try:
                while True:
                    i = claims.last()
                    if i is None:
                        break
                    check_done(lg.topic_partition)
                    if not all(sibling._plain_segment(seg) for seg in groups[i]):
                        claims.give_back(i)   # it, and all before it, are this thread's
                        break
                    done.append(sibling.write_unsealed(lg, groups[i], later_filt, plain_txn,
                                                       now, legacy_horizon, upper) + (groups[i],))
            except BaseException:
                discard_unsealed(done)
                raise
            return done[::-1]

        def clean_earlier():
            while True:
                i = claims.first()
                if i is None:
                    return
                swaps.add(self.write_unsealed(lg, groups[i], filt, txn, now, legacy_horizon,
                                              upper), groups[i])

        job = map_helper_mod.start(write_later)
        if job is None:
            sibling.release_buffer()
            return None
        later, error = job.beside(clean_earlier)   # the helper never outlives the round
        sibling.release_buffer()
        if error is None:
            try:
                clean_earlier()   # a group the helper gave back after this thread's last look
            except BaseException as e:
                error = e
        if error is not None:
            discard_unsealed(later or ())
            raise error
        return later

    def _split_filter(self, groups: list) -> bool:
        """Whether the helper shares the filtering of ``groups``."""
        return self.map_helper and map_helper_mod.filter_worth_splitting(
            [sum(s.size for s in g) for g in groups])

    def _plain_segment(self, seg) -> bool:
        """Whether every batch of ``seg`` is plain (``_core.plain_batches``), walked a chunk at
        a time, each chunk's pages dropped after it (as the filter will read it)."""
        size = seg.size
        if size == 0:
            return True
        mm = seg.buffer(size)
        pos = 0
        while pos < size:
            stop, plain = _core.plain_batches(mm, pos, min(pos + self.chunk_size, size))
            if stop == pos and plain:   # a batch larger than the chunk
                stop, plain = _core.plain_batches(mm, pos, self._next_batch_end(seg, mm, pos,
                                                                                size))
            _release(mm, pos, stop)
            if not plain or stop == pos:
                return False
            pos = stop
        return True

    def clean_segments(self, lg, group, filt, txn, now: int, legacy_horizon: int, upper: int,
                       truncations: int, stats: CleanerStats) -> None:
        """Filter ``group`` into ``<base>.log.cleaned`` and swap it in for the group, durably;
        nothing is left of it on an error."""
        swaps = InOrderSwaps(self, lg, truncations, stats)
        try:
            swaps.add(self.write_unsealed(lg, group, filt, txn, now, legacy_horizon, upper),
                      group)
            swaps.finish()
        except BaseException:
            swaps.discard()
            raise

    def write_unsealed(self, lg, group, filt, txn, now: int, legacy_horizon: int,
                       upper: int) -> tuple:
        """Filter ``group`` into ``<base>.log.cleaned`` and start its files' fsyncs;
        ``(cleaned segment, PendingFlush)``, to be :meth:`seal`-ed before it is swapped in.
        Deleted again on an error."""
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
            syncs = cleaned.start_flush()
        except BaseException:
            discard((cleaned,))
            raise
        return cleaned, syncs

    def seal(self, cleaned: LogSegment, group, syncs) -> None:
        """Wait for ``cleaned``'s fsyncs (``syncs``), then date it like ``group``'s last
        segment (the retention of a cleaned segment goes by it). Deleted on an error."""
        try:
            syncs.wait()
            cleaned.set_last_modified(group[-1].last_modified_ms)
        except BaseException:
            discard((cleaned,))
            raise

    def swap_in(self, lg, cleaned: LogSegment, group, truncations: int,
                stats: CleanerStats) -> PendingFlush:
        """Swap ``cleaned`` in for ``group`` (REF §2.2); deleted again on an error before the
        swap committed it (renamed it ``.swap``; after that the loader completes it). The fsync
        of the partition directory that makes the renames durable is returned pending: wait for
        it (InOrderSwaps waits before the next swap, the group between filtered meanwhile)."""
        try:
            self.check_done(lg.topic_partition)
            log.info("Swapping in cleaned segment %s for segment(s) %s in log %s",
                     os.path.basename(cleaned.log_path),
                     ",".join(os.path.basename(s.log_path) for s in group), _name(lg))
            directory_sync = lg.replace_segments([cleaned], group,
                                                 expected_truncations=truncations,
                                                 sync_directory=False)
            stats.segments_cleaned += len(group)
            stats.segments_written += 1
        except BaseException:
            if cleaned.suffix == CLEANED_SUFFIX:   # once renamed .swap it is the log's
                discard((cleaned,))
            raise
        return directory_sync

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
        # A group's index bytes fit one segment's (Kafka's grouping), but Kafka's cleaned
        # segment takes one index entry per append call, segstore's one per batch by the
        # sparse rule: a segment's first batch, which had none, may need one here, so a
        # group whose indexes were full can overflow. The cleaned segment is sealed and
        # trimmed after this, so its files grow instead, as a recovery's rebuild does.
        for index, reserve in ((dest.offset_index, 0), (dest.time_index, 1)):
            need = index.entries + len(batches) + reserve
            if need > index.max_entries:
                index.resize((need + 1) * index.entry_size)
        dest.append(data, batches)
        self.throttler.maybe_throttle(n)

    def _room(self, dest, op: int, need: int) -> int:
        """Make ``need`` bytes of room at the end of the output (draining or growing it)."""
        if len(self._out) - op < need:
            if op:
                self._append(dest, self._out, op)
                op = 0
            if len(self._out) < need:
                spare_memory.give_buffer(self._out)
                self._out = spare_memory.new_buffer(need)
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
        elif codec:
            # DELETE drops the batch without reading its records (Kafka's filterTo neither), so
            # it is not decompressed; the kernel still wants records for a compressed batch,
            # and gets none (it only counts the batch's bytes). Passing no payload failed the
            # round on an aborted compressed batch that was not its producer's last.
            payload = b""
        op = self._room(dest, op, _core.BatchFilter.room_needed(
            mm, p, None if payload is None else len(payload)))
        out = self._out
        start = op
        op, rebuilt = filt.filter_one(mm, p, mode, discard_records, can_discard and control,
                                      out, op, payload, file=source.log_path)
        if rebuilt and codec and op - start > 61:
            batch = _core.compress_batch_at(out, start, op - start, codec)
            filt.recompressed(op - start, len(batch))
            # In place of the rebuilt batch (incompressible records can come out longer).
            op = self._room(dest, start, len(batch))
            self._out[op:op + len(batch)] = batch
            op += len(batch)
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


def _wall_ms() -> int:
    return int(time.monotonic() * 1000)
