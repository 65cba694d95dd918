"""Kafka's sparse offset index (``.index``) and time index (``.timeindex``) over mmapped files.

Both are arrays of big-endian fixed-size entries (REF §2.3, §2.4). A new index file is
preallocated to ``segment.index.bytes`` (rounded down to whole entries) and mapped; the number of
valid entries is tracked in memory; the file is trimmed to its valid entries when its segment
rolls or closes. Lookups run in the compiled core (Kafka's warm-section binary search, REF §2.8).

Readers use the mapping without a lock: a trim or resize maps the file anew and swaps the
mapping, and a reader that still holds the old one only touches entries that stay inside the file.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from typing import Optional

import numpy as np

from . import _core
from .errors import CorruptIndexError, InvalidArgumentError, InvalidOffsetError
from .segment_files import write_all

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_PAGE = mmap.PAGESIZE


class _AbstractIndex:
    """What the offset and time indexes share: the file, the mapping, entry bookkeeping."""

    entry_size = 0
    _time = False

    def __init__(self, path: str, base_offset: int, max_index_size: int,
                 writable: bool = True, trusted_entries: Optional[int] = None):
        self.path = path
        self.base_offset = base_offset
        self.writable = writable
        self._lock = threading.Lock()  # serializes the writer's remaps, never taken by lookups
        self._mm: Optional[mmap.mmap] = None
        self._dropped = False  # closed or deleted: nothing left to flush
        self._allocated = 0  # file bytes known to have disk blocks (written by pwrite)
        if writable:
            exists = os.path.exists(path)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                length = os.fstat(fd).st_size
                if not exists:
                    length = self._rounded(max_index_size)
                    os.ftruncate(fd, length)
                    self.entries = 0
                else:
                    # An existing empty file is a trimmed index with no entries, not a new one.
                    self.entries = length // self.entry_size
                self._map(fd, length)
            finally:
                os.close(fd)
        else:
            # A read-only reader (often another process) copies the file instead of mapping it:
            # the writer trims indexes on roll, and touching a trimmed page of a map is SIGBUS.
            # Only the prefix of sane entries is used (the rest is zero padding or in flux).
            data = b""
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                pass  # none, or removed by the writer's swap meanwhile: reads scan the log
            self._mm = data
            self._length = len(data)
            self.entries = len(data) // self.entry_size
            self.entries = self.valid_prefix()
            self._mm = data[:self.entries * self.entry_size]  # drop preallocated padding
        if trusted_entries is not None:
            self.entries = min(trusted_entries, self.entries)
        self.max_entries = self._length // self.entry_size

    # -- file and mapping -------------------------------------------------------------------
    def _rounded(self, size: int) -> int:
        return max(size // self.entry_size, 1 if not self._time else 2) * self.entry_size

    def _map(self, fd: int, length: int) -> None:
        self._mm = mmap.mmap(fd, length) if length else None
        self._length = length
        # Shrinking frees the blocks past the new end (and growing adds holes).
        self._allocated = min(self._allocated, length // _PAGE * _PAGE)
        self.max_entries = length // self.entry_size

    def _remap(self, length: int) -> bool:
        """Resize the file to ``length`` bytes and map it anew; readers keep the old map."""
        length = (length // self.entry_size) * self.entry_size
        if length == self._length:
            return False
        with self._lock:
            fd = os.open(self.path, os.O_RDWR)
            try:
                # Entries stored through the shared map sit in the page cache like pwrite's:
                # nothing to msync before the length changes (durability is flush()'s job).
                os.ftruncate(fd, length)
                self._map(fd, length)
            finally:
                os.close(fd)
        return True

    @property
    def size_bytes(self) -> int:
        """Bytes of valid entries."""
        return self.entries * self.entry_size

    @property
    def file_size(self) -> int:
        """Current length of the file (preallocated or trimmed)."""
        return self._length

    def is_full(self) -> bool:
        """No room for another entry."""
        return self.entries >= self.max_entries

    def resize(self, max_index_size: int) -> bool:
        """Grow or shrink the file to ``max_index_size`` (rounded), keeping valid entries."""
        self._require_writable()
        return self._remap(max(self._rounded(max_index_size), self.size_bytes))

    def trim_to_valid_size(self) -> None:
        """Shrink the file to its valid entries (on roll and close)."""
        if self.writable:
            self._remap(self.size_bytes)

    def reset(self, max_index_size: int) -> None:
        """Drop every entry and preallocate again (before a segment is recovered)."""
        self._require_writable()
        self.entries = 0
        self._remap(0)
        self._remap(self._rounded(max_index_size))

    def flush(self) -> None:
        """Write the mapped pages to disk (fsync of the index file)."""
        fd = self.open_for_sync()
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def open_for_sync(self) -> Optional[int]:
        """A new descriptor of the file for the caller to fsync (and close), or None when
        there is nothing to flush.

        fsync rather than mmap.flush(): on Linux both write back the shared mapping's dirty
        pages (they are the file's page cache), but msync holds the GIL throughout. It also
        makes a trim durable, even one to no entries (which leaves no mapping)."""
        if self.writable and not self._dropped:
            return os.open(self.path, os.O_RDONLY)
        return None

    def close(self) -> None:
        """Trim; the (trimmed) mapping stays for readers that still hold this index, and is
        unmapped with the index object."""
        self.trim_to_valid_size()
        self._dropped = True

    def abandon(self) -> None:
        """Close without trimming (an offline log's close): the file stays as it is."""
        self._dropped = True

    def rename(self, new_path: str) -> None:
        """Rename the file; the mapping stays valid."""
        if os.path.exists(self.path):
            os.replace(self.path, new_path)
        self.path = new_path

    def delete(self) -> None:
        """Remove the file if present (a reader holding this index keeps reading its map)."""
        self._dropped = True
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _require_writable(self) -> None:
        if not self.writable:
            raise PermissionError(f"index {self.path} is open read-only")

    def _buffer(self):
        mm = self._mm
        return mm if mm is not None else b""

    def _check_slot(self, slot: int) -> None:
        # Kafka's "Attempt to fetch the nth entry from an index of size ...": past the entries
        # lies zero padding, not an entry.
        if not 0 <= slot < self.entries:
            raise InvalidArgumentError(f"no entry {slot} in {self.path}, which has "
                                       f"{self.entries} entries")

    def _view(self) -> tuple:
        """(buffer, entries) that agree: readers take no lock, and a remap, trim or reset
        between reading the two would pair a count with a map too short for it."""
        buf = self._buffer()
        return buf, min(self.entries, len(buf) // self.entry_size)

    def sanity_check(self, log_size: Optional[int] = None) -> None:
        """Raise CorruptIndexError unless entries are ordered, in range and not zero padding."""
        bad = _core.index_check(self._buffer(), self.entries, self._time)
        if bad >= 0:
            raise CorruptIndexError(
                f"index {self.path}: entry {bad} of {self.entries} is out of order "
                "(a zero-padded or untrimmed file, or damage)")
        if self._length % self.entry_size:
            raise CorruptIndexError(
                f"index {self.path}: length {self._length} is not a multiple of {self.entry_size}")
        if log_size is not None and not self._time and self.entries:
            if self.entry(self.entries - 1)[1] > log_size:
                raise CorruptIndexError(f"index {self.path}: last entry points past the log end")

    def valid_prefix(self) -> int:
        """How many leading entries pass the ordering check (for untrusted files)."""
        bad = _core.index_check(self._buffer(), self.entries, self._time)
        return self.entries if bad < 0 else bad

    def entries_array(self) -> np.ndarray:
        """The valid entries as a structured numpy array (a copy)."""
        dtype = ([("ts", ">i8"), ("rel", ">i4")] if self._time else [("rel", ">i4"), ("pos", ">i4")])
        buf = self._buffer()
        return np.frombuffer(buf, dtype=dtype, count=self.entries).copy() if self.entries else \
            np.empty(0, dtype=dtype)

    def _write_at(self, position: int, data: bytes) -> None:
        end = position + len(data)
        mm = self._mm
        if end <= self._allocated and mm is not None and end <= len(mm):
            # A page pwrite already gave blocks: a store through the shared mapping costs at
            # most a minor fault, and skips opening the file for each entry.
            mm[position:end] = data
            return
        # pwrite, not a store through the mapping, for the first entry of a page: the first
        # touch of a page of the sparse, preallocated file costs a fault and a block
        # allocation (milliseconds on some file systems), while the shared mapping sees
        # pwrite's bytes through the same page cache.
        fd = os.open(self.path, os.O_WRONLY)
        try:
            write_all(fd, data, position, self.path)
        finally:
            os.close(fd)
        self._allocated = max(self._allocated, -(-end // _PAGE) * _PAGE)

    def _append_array(self, entries: np.ndarray) -> None:
        n = len(entries)
        if n == 0:
            return
        if self.entries + n > self.max_entries:
            raise InvalidOffsetError(f"index {self.path} is full")
        self._write_at(self.entries * self.entry_size, entries.tobytes())
        self.entries += n

    def truncate_entries(self, entries: int) -> None:
        """Keep only the first ``entries`` entries."""
        dropped = self.entries - entries
        self.entries = entries
        if dropped > 0 and self.writable:
            # Zeroed, not just uncounted: a read-only reader (another process) takes the
            # file's leading run of ordered entries as the index, and the dropped ones still
            # ordered after the kept ones would point into the batches written after them.
            self._write_at(entries * self.entry_size, bytes(dropped * self.entry_size))


class OffsetIndex(_AbstractIndex):
    """``.index``: (relative offset int32, position int32) entries, strictly increasing."""

    entry_size = 8
    _time = False

    def entry(self, slot: int, buf=None) -> tuple[int, int]:
        """(absolute offset, position) of a slot (of ``buf``, a :meth:`_view`'s buffer)."""
        if buf is None:
            self._check_slot(slot)
        rel, pos = _OFFSET_ENTRY.unpack_from(self._buffer() if buf is None else buf, slot * 8)
        return self.base_offset + rel, pos

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when empty."""
        buf, n = self._view()
        return self.entry(n - 1, buf)[0] if n else self.base_offset

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry <= offset; (base_offset, 0) if none."""
        rel = offset - self.base_offset
        if rel < 0:
            return self.base_offset, 0
        buf, n = self._view()
        slot = _core.index_lookup(buf, n, min(rel, 0x7FFFFFFF), False)
        if slot < 0:
            return self.base_offset, 0
        return self.entry(slot, buf)

    def append(self, offset: int, position: int) -> None:
        """Add an entry; the offset must be above the last one and the index not full."""
        self._require_writable()
        if self.entries and offset <= self.last_offset:
            raise InvalidOffsetError(
                f"attempt to append offset {offset} to {self.path} whose last offset is "
                f"{self.last_offset}")
        if self.is_full():
            raise InvalidOffsetError(f"attempt to append to a full index {self.path}")
        self._write_at(self.entries * 8, _OFFSET_ENTRY.pack(offset - self.base_offset, position))
        self.entries += 1

    def append_entries(self, entries: np.ndarray) -> None:
        """Bulk-append a ``>i4,>i4`` structured array built by ``_core.sparse_index``."""
        self._require_writable()
        self._append_array(entries)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry with offset >= ``offset``."""
        rel = offset - self.base_offset
        slot = _core.index_lookup(self._buffer(), self.entries, max(min(rel, 0x7FFFFFFF), -1),
                                  False) if rel >= 0 else -1
        if slot < 0:
            keep = 0
        elif self.entry(slot)[0] == offset:
            keep = slot
        else:
            keep = slot + 1
        self.truncate_entries(keep)


class TimeIndex(_AbstractIndex):
    """``.timeindex``: (timestamp int64, relative offset int32), timestamps strictly increasing.

    One slot is kept free so the final entry can always be written on roll (REF §2.4).
    """

    entry_size = 12
    _time = True

    def entry(self, slot: int, buf=None) -> tuple[int, int]:
        """(timestamp, absolute offset) of a slot (of ``buf``, a :meth:`_view`'s buffer)."""
        if buf is None:
            self._check_slot(slot)
        ts, rel = _TIME_ENTRY.unpack_from(self._buffer() if buf is None else buf, slot * 12)
        return ts, self.base_offset + rel

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base_offset) when empty."""
        buf, n = self._view()
        return self.entry(n - 1, buf) if n else (-1, self.base_offset)

    def is_full(self) -> bool:
        """Full one entry early: the last slot is reserved for the roll-time entry."""
        return self.entries >= self.max_entries - 1

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry with timestamp <= target; (-1, base) if none."""
        buf, n = self._view()
        slot = _core.index_lookup(buf, n, timestamp, True)
        if slot < 0:
            return -1, self.base_offset
        return self.entry(slot, buf)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append unless the timestamp is not above the last entry's (equal ones are skipped)."""
        self._require_writable()
        if not skip_full_check and self.is_full():
            raise InvalidOffsetError(f"attempt to append to a full time index {self.path}")
        last_ts, last_off = self.last_entry()
        if self.entries and offset < last_off:
            raise InvalidOffsetError(
                f"attempt to append offset {offset} to {self.path} whose last offset is {last_off}")
        if self.entries and timestamp < last_ts:
            raise InvalidOffsetError(
                f"attempt to append timestamp {timestamp} to {self.path} whose last timestamp "
                f"is {last_ts}")
        if self.entries and timestamp <= last_ts:
            return
        if self.entries >= self.max_entries:
            raise InvalidOffsetError(f"time index {self.path} has no room left")
        if not 0 <= offset - self.base_offset <= 0x7FFFFFFF:
            raise InvalidOffsetError(
                f"offset {offset} cannot be stored relative to {self.path}'s base {self.base_offset}")
        self._write_at(self.entries * 12, _TIME_ENTRY.pack(timestamp, offset - self.base_offset))
        self.entries += 1

    def append_entries(self, entries: np.ndarray) -> None:
        """Bulk-append a ``>i8,>i4`` structured array built by ``_core.sparse_index``."""
        self._require_writable()
        if len(entries) and self.entries and int(entries["ts"][0]) <= self.last_entry()[0]:
            entries = entries[entries["ts"] > self.last_entry()[0]]
        self._append_array(entries)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry with offset >= ``offset``."""
        keep = self.entries
        while keep and self.entry(keep - 1)[1] >= offset:
            keep -= 1
        self.truncate_entries(keep)
