"""LogSegment: one ``.log`` file with its offset and time indexes (Kafka's LogSegment).

Files are named by the segment's base offset, 20 digits (REF §2.1). Appends write at the logical
end with ``pwrite``; reads go through a read-only ``mmap`` of the file, remapped as it grows. A file
that may be mapped is never shrunk in place (a reader touching a cut page would die of SIGBUS):
truncating a segment writes the kept prefix to a new file and renames it over the old one.

File naming lives in :mod:`segstore.segment_files`, the checks of a segment's offsets and indexes
(and ``verify()``) in :mod:`segstore.segment_checks`, reads by offset (``translate_offset``,
``read_range``) in :mod:`segstore.segment_reads`, writing whole indexes (rebuild, adoption) in
:mod:`segstore.segment_indexing`, truncation in :mod:`segstore.segment_truncation`, its
timestamps and file dates in :mod:`segstore.segment_timestamps`.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import random
import threading
from typing import Optional

import numpy as np

from . import _core, segment_reads
from .errors import (CorruptIndexError, CorruptRecordError, InvalidOffsetError,
                     RecordTooLargeError, SegmentChangedError)
from .flusher import PendingFlush
from .index import OffsetIndex, TimeIndex
# Names defined by the helper modules are re-exported: the package and its tests import them
# from here.
from .segment_checks import (MAX_RELATIVE_OFFSET, Problem, consistent_prefix, first_offsets,
                             sanity_check_indexes, verify_segment)
from .segment_indexing import SegmentIndexing, sealed_index_entries
from .segment_timestamps import SegmentTimestamps
from .segment_truncation import SegmentTruncation
from .segment_files import (CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX,
                            SWAP_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, filename_prefix,
                            read_map, replace_suffix, segment_paths, write_all)
from .transaction_index import AbortedTxn, TransactionIndex

MAX_SEGMENT_BYTES = 0x7FFFFFFF  # a segment's file positions are int32 in its index

__all__ = ["LogSegment", "sealed_index_entries", "Problem", "MAX_RELATIVE_OFFSET", "first_offsets", "consistent_prefix",
           "filename_prefix", "segment_paths", "LOG_SUFFIX", "INDEX_SUFFIX", "TIME_INDEX_SUFFIX",
           "TXN_INDEX_SUFFIX", "CLEANED_SUFFIX", "SWAP_SUFFIX", "DELETED_SUFFIX"]

log = logging.getLogger("segstore.segment")


_SERIALS = itertools.count()


class LogSegment(SegmentIndexing, SegmentTruncation, SegmentTimestamps):
    """A segment: its log file, indexes, size and timestamps. Mutations are the log's job.

    ``config`` is a TopicConfig-like object (segment_index_bytes, index_interval_bytes, ...);
    ``clock`` returns milliseconds.
    """

    def __init__(self, directory: str, base_offset: int, config, clock, *, suffix: str = "",
                 readonly: bool = False, preallocate: bool = False):
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.clock = clock
        self.readonly = readonly
        self.suffix = suffix
        self.serial = next(_SERIALS)  # unique in the process, unlike id() (caches key on it)
        paths = segment_paths(directory, base_offset, suffix)
        self.log_path = paths[LOG_SUFFIX]
        self._lock = threading.RLock()  # guards opening and remapping (re-entered by buffer())
        self._mm: Optional[mmap.mmap] = None
        # Like Kafka's LazyIndex, a segment holds no descriptor and maps no index until first
        # used: a store of 10,000 segments opens without 30,000 file descriptors.
        self._fd_value: Optional[int] = None
        # Closed or deleted: nothing is opened again (a reader of an old snapshot gets
        # SegmentChangedError and reads the log's new state instead).
        self._gone = False
        self._offset_index: Optional[OffsetIndex] = None
        self._time_index: Optional[TimeIndex] = None
        self._grow_indexes_on_load = False  # see prepare_for_appends
        self._index_paths = [paths[INDEX_SUFFIX], paths[TIME_INDEX_SUFFIX]]
        try:
            if readonly:
                # A reader holds the file from the moment it lists it: if the writer deletes
                # the segment meanwhile, the open descriptor keeps it readable.
                self._fd_value = os.open(self.log_path, os.O_RDONLY)
                st = os.fstat(self._fd_value)
            else:
                st = os.stat(self.log_path)
            self.size = st.st_size
            self._inode = st.st_ino
            self._check_indexes_on_load = not readonly  # files from before: check, don't trust
        except FileNotFoundError:
            if readonly:
                raise
            self._fd_value = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
            if preallocate:
                os.posix_fallocate(self._fd_value, 0, config.segment_bytes)
            self.size = 0
            self._inode = os.fstat(self._fd_value).st_ino
            self._check_indexes_on_load = False
        self.txn_index_path = paths[TXN_INDEX_SUFFIX]
        self._txn_index: Optional[TransactionIndex] = None  # like Kafka: no file until an entry
        self.created_ms = clock()
        self.rolling_based_timestamp: Optional[int] = None
        self.bytes_since_last_index_entry = 0
        self._max_ts: Optional[tuple[int, int]] = None  # (max timestamp, its batch's last offset)
        # When this session last wrote it, by the store's clock (the file's mtime otherwise).
        self._modified_ms: Optional[int] = None
        self._dirty = False  # written this session: its final time-index entry is due on close
        self._unsynced = False  # written since the last flush: released files are synced first
        jitter = min(config.segment_jitter_ms, config.segment_ms)
        self.roll_jitter_ms = random.randrange(jitter) if jitter > 0 else 0
        if self._fd_value is not None and not readonly:  # new: it is about to be appended to
            self._load_indexes()

    # -- lazily opened files ----------------------------------------------------------------
    def _check_not_gone(self) -> None:
        if self._gone:
            raise SegmentChangedError(f"segment {self.log_path} was closed or deleted",
                                      file=self.log_path)

    @property
    def _fd(self) -> int:
        fd = self._fd_value
        if fd is None:
            with self._lock:
                if self._fd_value is None:
                    self._check_not_gone()
                    flags = os.O_RDONLY if self.readonly else os.O_RDWR
                    self._fd_value = os.open(self.log_path, flags)
                fd = self._fd_value
        return fd

    @property
    def offset_index(self) -> OffsetIndex:
        """The ``.index`` file, mapped (and sanity-checked) on first use."""
        if self._offset_index is None:
            self._load_indexes()
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        """The ``.timeindex`` file, mapped (and sanity-checked) on first use."""
        if self._time_index is None:
            self._load_indexes()
        return self._time_index

    def _load_indexes(self) -> None:
        with self._lock:
            if self._offset_index is not None:
                return
            self._check_not_gone()
            writable = not self.readonly
            oi = OffsetIndex(self._index_paths[0], self.base_offset,
                             self.config.segment_index_bytes, writable=writable)
            ti = TimeIndex(self._index_paths[1], self.base_offset,
                           self.config.segment_index_bytes, writable=writable)
            problem = None
            if self._check_indexes_on_load:
                try:
                    sanity_check_indexes(self, oi, ti)
                except CorruptIndexError as e:
                    problem = e
            if self._grow_indexes_on_load and problem is None:
                # Before they are published: an append seeing them trimmed would roll.
                oi.resize(self.config.segment_index_bytes)
                ti.resize(self.config.segment_index_bytes)
            self._grow_indexes_on_load = False   # a rebuild preallocates them itself
            self._time_index = ti
            self._offset_index = oi
        if problem is not None:
            log.warning("rebuilding the indexes of %s: %s", self.log_path, problem)
            # Index what can be read; damage further on is reported by the reads that reach it.
            b = self.scan(0, raise_on_corrupt=False).batches
            self.rebuild_indexes(b[:consistent_prefix(b, self.base_offset)])

    def prepare_for_appends(self) -> None:
        """Room in both indexes for appends (``segment.index.bytes``), as Kafka's loader
        gives the active segment. Deferred to their first use when they are not mapped yet:
        opening a large store then touches no index of a partition nobody writes."""
        with self._lock:
            if self._offset_index is None:
                self._grow_indexes_on_load = True
                return
            self._offset_index.resize(self.config.segment_index_bytes)
            self._time_index.resize(self.config.segment_index_bytes)

    @property
    def txn_index(self) -> TransactionIndex:
        """The ``.txnindex`` (aborted transactions); the file appears with its first entry."""
        idx = self._txn_index
        if idx is None:
            with self._lock:
                if self._txn_index is None:
                    self._txn_index = TransactionIndex(self.txn_index_path, self.base_offset,
                                                       writable=not self.readonly)
                idx = self._txn_index
        return idx

    def collect_aborted(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Aborted transactions of this segment overlapping [start_offset, end_offset)."""
        return self.txn_index.collect_aborted(start_offset, end_offset)

    def read_batch_headers(self):
        """(buffer, batch headers) of the whole log file, CRCs unchecked and a corrupt tail
        left out; a segment not opened before is closed again afterwards (the buffer stays
        valid: a map outlives its descriptor)."""
        opened_here = self._fd_value is None and self._offset_index is None
        size = self.size
        if size == 0:
            return b"", _core.scan_batches(b"").batches
        buf = self.buffer(size)
        batches = _core.scan_batches(buf, 0, size, raise_on_corrupt=False,
                                     file=self.log_path).batches
        if opened_here and not self.readonly:
            self.release_files()
        return buf, batches

    @property
    def indexes_loaded(self) -> bool:
        """Whether the index files have been opened."""
        return self._offset_index is not None

    # -- reading ----------------------------------------------------------------------------
    def buffer(self, need: Optional[int] = None):
        """A read-only map covering at least ``need`` bytes (default: the logical size).

        Returns b"" for an empty segment. Callers bound every access by the size they asked for.
        """
        need = self.size if need is None else need
        mm = self._mm
        if need == 0:
            return b""
        if mm is None or len(mm) < need:
            with self._lock:
                mm = self._mm
                if mm is None or len(mm) < need:
                    length = os.fstat(self._fd).st_size
                    if length < need and need > self.size:
                        # Truncated since the caller read the size: not damage.
                        raise SegmentChangedError(
                            f"segment {self.log_path} was truncated to {self.size} bytes under "
                            f"a read of {need}", file=self.log_path)
                    if length < need:
                        raise CorruptRecordError(
                            f"segment shorter ({length} bytes) than expected ({need})",
                            file=self.log_path)
                    mm = self._mm = read_map(self._fd, length)
        return mm

    def scan(self, start: int = 0, end: Optional[int] = None, *, validate_crc: bool = False,
             max_batches: Optional[int] = None, raise_on_corrupt: bool = True,
             strict: bool = False):
        """Scan batch headers in [start, end) of the log file (end defaults to the size);
        ``strict``: a batch running past ``end`` is damage, not a torn tail."""
        end = self.size if end is None else end
        return _core.scan_batches(self.buffer(end), start, end, validate_crc=validate_crc,
                                  max_batches=max_batches, raise_on_corrupt=raise_on_corrupt,
                                  file=self.log_path, strict=strict)

    def translate_offset(self, offset: int, start_position: int = 0):
        """First batch at or after ``start_position`` whose last offset >= ``offset``: a
        BATCH_DTYPE row (position in the file) or None (see
        :func:`segstore.segment_reads.translate_offset`)."""
        return segment_reads.translate_offset(self, offset, start_position)

    def read_range(self, start_offset: int, max_bytes: int, max_position: Optional[int] = None,
                   min_one_message: bool = True, end_offset: Optional[int] = None):
        """(buffer, start, end) of whole batches from the one holding ``start_offset``, or
        None; Kafka's LogSegment.read (see :func:`segstore.segment_reads.read_range`). Damage
        is raised only where the range would take the damaged batch."""
        rng = segment_reads.read_range(self, start_offset, max_bytes, max_position,
                                       min_one_message, end_offset)
        if rng is not None and rng[3] is not None:
            raise rng[3]
        return None if rng is None else rng[:3]

    def read_next_offset(self) -> int:
        """Last batch's last offset + 1, or the base offset when empty."""
        if self.size == 0:
            return self.base_offset
        _, pos = self.offset_index.lookup(2 ** 62)
        b = self.scan(min(pos, self.size)).batches
        if len(b) == 0:
            b = self.scan(0).batches
        return int(b["last_offset"][-1]) + 1 if len(b) else self.base_offset

    # -- appending --------------------------------------------------------------------------
    def append(self, data, batches: np.ndarray) -> None:
        """Write encoded batches at the end; ``batches`` positions are relative to ``data``.

        Index entries follow Kafka's sparse rule per batch (REF §2.6).
        """
        if len(batches) == 0:
            return
        last = int(batches["last_offset"][-1])
        first = int(batches["base_offset"][0])
        if first < 0 and int(batches["magic"][0]) < 2:
            first = int(batches["last_offset"][0])  # a legacy wrapper tells only its last
        if first - self.base_offset < 0 or last - self.base_offset > MAX_RELATIVE_OFFSET:
            raise InvalidOffsetError(
                f"offsets {first}..{last} cannot be stored relative to segment base "
                f"{self.base_offset} (LogSegmentOffsetOverflow)")
        if len(data) > MAX_SEGMENT_BYTES - self.size:
            # Kafka's FileRecords.append check: index entries hold int32 positions, which
            # would wrap. Rolls keep appends below it; a cleaned group that grew could not.
            raise RecordTooLargeError(
                f"append of {len(data)} bytes is too large for segment {self.log_path} with "
                f"current file position at {self.size} (a segment holds at most 2**31 - 1 "
                f"bytes)")
        position = self.size
        max_ts, off_max = self.max_timestamp_so_far, self.offset_of_max_timestamp
        # What a failed append puts back: all or nothing in memory. The bytes it may have
        # written past ``size`` are overwritten by the next append, or cut by close or recovery.
        undo = (self.rolling_based_timestamp, self.bytes_since_last_index_entry, self._max_ts,
                self.offset_index.entries, self.time_index.entries)
        try:
            if self.size == 0:
                self.rolling_based_timestamp = int(batches["max_timestamp"][0])
            self._dirty = self._unsynced = True
            self._modified_ms = self.clock()
            write_all(self._fd, data, position, self.log_path)
            self.size = position + len(data)
            last_time_ts = self.time_index.last_entry()[0] if self.time_index.entries else -1
            offs, times, self.bytes_since_last_index_entry, max_ts, off_max = _core.sparse_index(
                batches, self.base_offset, position, self.config.index_interval_bytes,
                self.bytes_since_last_index_entry, max_ts, off_max, last_time_ts)
            self._max_ts = (max_ts, off_max)
            self.offset_index.append_entries(offs)
            self.time_index.append_entries(times)
        except BaseException:
            self._undo_append(position, *undo)
            raise

    def _undo_append(self, size: int, rolling_ts, since_index, max_ts, offset_entries: int,
                     time_entries: int) -> None:
        """Put the segment back as it was before a failed :meth:`append`."""
        self.size = size
        self.rolling_based_timestamp = rolling_ts
        self.bytes_since_last_index_entry = since_index
        self._max_ts = max_ts
        for index, entries in ((self.offset_index, offset_entries),
                               (self.time_index, time_entries)):
            if index.entries > entries:
                index.truncate_entries(entries)

    # -- rolling ----------------------------------------------------------------------------
    def should_roll(self, incoming_bytes: int, incoming_max_ts: int, incoming_last_offset: int,
                    max_segment_ms: int, now: int,
                    max_segment_bytes: Optional[int] = None) -> bool:
        """Kafka's roll conditions (REF §3.3), evaluated before an append.

        ``max_segment_ms`` and ``max_segment_bytes`` are the log's current limits (a topic
        config altered since the segment was made applies to it); ``max_segment_bytes``
        defaults to the segment.bytes the segment was made with."""
        if max_segment_bytes is None:
            max_segment_bytes = self.config.segment_bytes
        if self.size > max_segment_bytes - incoming_bytes:
            return True
        if self.size > 0:
            if self.rolling_based_timestamp is None:
                self._load_first_batch_timestamp()
            if self.rolling_based_timestamp is not None and self.rolling_based_timestamp >= 0:
                waited = incoming_max_ts - self.rolling_based_timestamp
            else:
                waited = now - self.created_ms
            if waited > max_segment_ms - self.roll_jitter_ms:
                return True
        if self.offset_index.is_full() or self.time_index.is_full():
            return True
        rel = incoming_last_offset - self.base_offset
        return rel < 0 or rel > MAX_RELATIVE_OFFSET

    def _load_first_batch_timestamp(self) -> None:
        # Kafka's loadFirstBatchTimestamp: a segment reopened with data rolls by the age of
        # its first batch, not by the time it was opened.
        try:
            b = self.scan(0, max_batches=1).batches
        except CorruptRecordError:
            return  # the open time, then; the damage is the reads' and recovery's to report
        if len(b):
            self.rolling_based_timestamp = int(b["max_timestamp"][0])

    def on_become_inactive(self) -> None:
        """On roll: final time-index entry, trim both indexes and a preallocated log file."""
        if self.readonly:
            return
        if self.max_timestamp_so_far >= 0:
            ti = self.time_index
            if ti.entries >= ti.max_entries and self.max_timestamp_so_far > ti.last_entry()[0]:
                ti.resize((ti.entries + 1) * ti.entry_size)  # room for the final entry
            ti.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp,
                            skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self._trim_log_file()
        self._unsynced = True  # the trims change the files' lengths
        self._date_files()

    def _trim_log_file(self) -> None:
        # A preallocated file is cut to its logical size (a reopen takes the length as size).
        # Only bytes past the data go, which no reader maps.
        if os.fstat(self._fd).st_size > self.size:
            os.ftruncate(self._fd, self.size)

    def release_files(self) -> None:
        """Close the descriptor and drop the index mappings of a sealed segment; they are
        opened again on first use (readers holding a mapping keep it).

        What was written is synced first: flush() can only sync files the segment holds open,
        and a roll moves the recovery point past this segment (the loader will not check it)."""
        with self._lock:
            if self._unsynced and not self.readonly:
                if self._offset_index is not None:  # close() would trim after the sync
                    self._offset_index.trim_to_valid_size()
                    self._time_index.trim_to_valid_size()
                self.flush()
            if self._offset_index is not None:
                self._offset_index.close()
                self._time_index.close()
                self._offset_index = self._time_index = None
            self._mm = None
            if self._fd_value is not None and not self.readonly:
                os.close(self._fd_value)
                self._fd_value = None
            if self._txn_index is not None:
                self._txn_index.close()

    # -- verification -----------------------------------------------------------------------
    def verify(self, next_base_offset: Optional[int] = None) -> list:
        """Check every batch's CRC and layout and every index entry against the log.

        Returns a list of :class:`Problem` (empty when the segment is sound). Offsets must grow
        from batch to batch and stay inside [base offset, next segment's base); offset-index
        entries must point at the start of the batch holding their offset; time-index entries
        must be ordered and name offsets of this segment. A sealed segment's index (one with a
        ``next_base_offset``) must end at a whole entry and hold only zeros after its entries.
        """
        # A reader checks the whole file: its size may lag behind a writer's appends.
        size = os.fstat(self._fd).st_size if self.readonly else self.size
        return verify_segment(self, size, next_base_offset)

    # -- durability and files ---------------------------------------------------------------
    def flush(self) -> None:
        """fsync the log and its indexes, on this thread: a hand-off to the flusher's pool
        costs a thread's wake-up (0.5 ms on this project's VMs), more than an append's files
        take to sync (300 appends with flush.messages=1 measured the same or slower)."""
        pending = self.start_flush(on_pool=False)
        try:
            pending.wait()
        except BaseException:
            self._unsynced = True
            raise

    def start_flush(self, on_pool: bool = True) -> PendingFlush:
        """:meth:`flush`'s fsyncs, started at once on the flusher's threads (or, without
        ``on_pool``, made by the wait on the waiting thread): the files are synced once
        ``wait()`` on the result returns without an error."""
        fds = []
        if self.readonly:
            return PendingFlush(fds)
        with self._lock:   # release_files may close the descriptors
            try:
                if self._fd_value is not None:  # never opened: nothing written through it
                    fds.append(os.dup(self._fd_value))
                indexes = (self._offset_index, self._time_index, self._txn_index)
                for index in indexes:
                    fd = index.open_for_sync() if index is not None else None
                    if fd is not None:
                        fds.append(fd)
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            self._unsynced = False   # before the syncs start: a later write marks it again
        return PendingFlush(fds, 0 if on_pool else len(fds))

    def close(self) -> None:
        """Final time-index entry, trim and close (a later open sees only valid entries)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self, write: bool = True) -> None:
        if write and not self.readonly and self._dirty:
            try:
                self.on_become_inactive()
            except InvalidOffsetError as e:  # damaged data must not stop a close
                log.warning("closing %s without its final time-index entry: %s",
                            self.log_path, e)
        elif write and not self.readonly and self._fd_value is not None:
            self._trim_log_file()
        if self._offset_index is not None:
            for index in (self._offset_index, self._time_index):
                if write:
                    index.close()
                else:
                    index.abandon()
            # Readers holding them keep their maps; the last one unmaps them.
            self._offset_index = self._time_index = None
        if self._txn_index is not None:
            self._txn_index.close()
        if write:
            self._date_files()  # after the trims, which set the real time
        self._gone = True
        self._mm = None
        if self._fd_value is not None:
            os.close(self._fd_value)
            self._fd_value = None

    def abandon(self) -> None:
        """Close without writing anything (no final time-index entry, no trims): an offline
        log's close, whose files the next open recovers as they are. A trim could also cut
        bytes a read-only reader in another process has mapped (a failed append's batch)."""
        with self._lock:
            self._close_locked(write=False)

    def change_file_suffixes(self, old: str, new: str) -> None:
        """Rename every file of the segment from suffix ``old`` to ``new`` (REF §2.2)."""
        def renamed(path):
            return replace_suffix(path, old, new)
        # Under the lock that opens the files: a reader opening a released segment's file
        # between a rename and the path's update would find no file (FileNotFoundError
        # instead of reading the renamed one).
        with self._lock:
            if os.path.exists(self.log_path):
                os.replace(self.log_path, renamed(self.log_path))
            self.log_path = renamed(self.log_path)
            for i, index in enumerate((self._offset_index, self._time_index)):
                new_path = renamed(self._index_paths[i])
                if index is not None:
                    index.rename(new_path)
                elif os.path.exists(self._index_paths[i]):
                    os.replace(self._index_paths[i], new_path)
                self._index_paths[i] = new_path
            if self._txn_index is not None:
                self._txn_index.rename(renamed(self.txn_index_path))
            elif os.path.exists(self.txn_index_path):
                os.replace(self.txn_index_path, renamed(self.txn_index_path))
            self.txn_index_path = renamed(self.txn_index_path)
            self.suffix = new

    def delete_files(self) -> None:
        """Drop the segment's descriptors and maps (no trimming: it is going) and unlink it."""
        with self._lock:
            self._gone = True
            self._offset_index = self._time_index = None
            if self._txn_index is not None:
                self._txn_index.close()
            self._mm = None
            if self._fd_value is not None:
                os.close(self._fd_value)
                self._fd_value = None
        for path in (self.log_path, *self._index_paths, self.txn_index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, path={self.log_path!r})"
