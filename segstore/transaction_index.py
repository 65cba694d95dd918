"""Kafka's transaction index (``.txnindex``): the aborted transactions of one segment (REF §2.5).

An append-only file of 34-byte big-endian entries, one per aborted transaction whose ABORT marker
lies in the segment: ``int16 version (0) | int64 producerId | int64 firstOffset | int64 lastOffset
| int64 lastStableOffset``. As in Kafka, a reader takes the version from the entry's first byte
and refuses only a version above 0 (:func:`entry_version`). ``lastOffset`` is the marker's
offset; ``lastStableOffset`` is the partition's LSO when the marker was written. Like Kafka's
``TransactionIndex`` the file is not preallocated and not mapped, and it is created by the first
append (most segments never hold an aborted transaction, so most have no file). Entries are read
back with ``pread``: the files are small and read rarely (the cleaner, read_committed reads,
recovery checks).

One lock per index serializes the writer's appends and truncations with readers, so a reader in
another thread (the cleaner) never reads through a descriptor that is being closed.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import NamedTuple, Optional

from .errors import CorruptIndexError, InvalidOffsetError
from .segment_files import write_all

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
CURRENT_VERSION = 0


def entry_version(version_field: int) -> int:
    """The version Kafka reads from an entry's int16 version field: its first byte, signed
    (AbortedTxn.version() is ``buffer.get(VERSION_OFFSET)``). Kafka refuses only a version
    above CURRENT_VERSION, so a field whose first byte is 0 or negative is read."""
    byte = (version_field >> 8) & 0xFF
    return byte - 0x100 if byte & 0x80 else byte


class AbortedTxn(NamedTuple):
    """One entry: an aborted transaction of ``producer_id`` over [first_offset, last_offset]
    (``last_offset`` is the ABORT marker), and the last stable offset when it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        """The 34-byte on-disk entry (version 0)."""
        return ENTRY.pack(CURRENT_VERSION, *self)


class TxnIndexSearchResult(NamedTuple):
    """Aborted transactions found, and whether no later segment can add any (Kafka's
    TxnIndexSearchResult: an entry's last stable offset reached the upper bound)."""

    aborted: list
    is_complete: bool


class TransactionIndex:
    """The ``.txnindex`` file at ``path`` of a segment starting at ``start_offset``.

    ``writable=False`` (read-only stores) never creates, changes or deletes the file.
    """

    def __init__(self, path: str, start_offset: int = 0, *, writable: bool = True):
        self.path = path
        self.start_offset = start_offset
        self.writable = writable
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        self._size = 0  # bytes of whole entries in the file, known while _fd is open
        self._last: Optional[int] = None  # last entry's last offset, once known
        self._last_known = False

    # -- reading ----------------------------------------------------------------------------
    def _read_locked(self) -> bytes:
        if self._fd is not None:
            return os.pread(self._fd, self._size, 0) if self._size else b""
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def _parse(self, data: bytes, strict: bool) -> list[AbortedTxn]:
        if len(data) % ENTRY_SIZE:
            if strict:
                raise CorruptIndexError(
                    f"transaction index {self.path} has length {len(data)}, not a multiple of "
                    f"the {ENTRY_SIZE}-byte entry size")
            data = data[:len(data) - len(data) % ENTRY_SIZE]  # an entry being written
        out = []
        for version, pid, first, last, lso in ENTRY.iter_unpack(data):
            version = entry_version(version)
            if version > CURRENT_VERSION:
                raise CorruptIndexError(
                    f"unexpected aborted transaction version {version} in transaction index "
                    f"{self.path}, current version is {CURRENT_VERSION}")
            out.append(AbortedTxn(pid, first, last, lso))
        return out

    def all(self) -> list[AbortedTxn]:
        """Every entry, in file order (a torn trailing partial entry is not reported)."""
        with self._lock:
            return self._parse(self._read_locked(), strict=False)

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Entries whose [first_offset, last_offset] overlaps [fetch_offset, upper_bound_offset)
        (Kafka's ``collectAbortedTxns``)."""
        return self.search(fetch_offset, upper_bound_offset).aborted

    def search(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """:meth:`collect_aborted` plus Kafka's ``isComplete``: True once an entry's last stable
        offset is >= ``upper_bound_offset`` (no transaction aborted later can start below it)."""
        found, complete = [], False
        for t in self.all():
            if t.last_offset >= fetch_offset and t.first_offset < upper_bound_offset:
                found.append(t)
            if t.last_stable_offset >= upper_bound_offset:
                complete = True
                break
        return TxnIndexSearchResult(found, complete)

    @property
    def last_offset(self) -> Optional[int]:
        """The last entry's last offset (None when the index is empty)."""
        with self._lock:
            return self._last_offset_locked()

    def _last_offset_locked(self) -> Optional[int]:
        if not self._last_known:
            entries = self._parse(self._read_locked(), strict=False)
            self._last = entries[-1].last_offset if entries else None
            self._last_known = True
        return self._last

    @property
    def exists(self) -> bool:
        """Whether the file exists (it is created by the first append)."""
        return self._fd is not None or os.path.exists(self.path)

    @property
    def size_bytes(self) -> int:
        """Length of the file (0 when there is none)."""
        with self._lock:
            if self._fd is not None:
                return self._size
            try:
                return os.stat(self.path).st_size
            except FileNotFoundError:
                return 0

    def sanity_check(self) -> None:
        """CorruptIndexError unless the file holds whole version-0 entries, none of which ends
        below the segment's start offset (Kafka's ``sanityCheck``)."""
        with self._lock:
            entries = self._parse(self._read_locked(), strict=True)
        for t in entries:
            if t.last_offset < self.start_offset:
                raise CorruptIndexError(
                    f"last offset of aborted transaction {t} in transaction index {self.path} "
                    f"is less than start offset {self.start_offset}")

    # -- writing ----------------------------------------------------------------------------
    def _require_writable(self) -> None:
        if not self.writable:
            raise PermissionError(f"transaction index {self.path} is open read-only")

    def _open_locked(self) -> int:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            size = os.fstat(fd).st_size
            if size % ENTRY_SIZE:
                os.close(fd)
                raise CorruptIndexError(
                    f"transaction index {self.path} has length {size}, not a multiple of "
                    f"the {ENTRY_SIZE}-byte entry size")
            self._fd, self._size = fd, size
        return self._fd

    def append(self, txn: AbortedTxn) -> None:
        """Append one entry; last offsets must increase (else InvalidOffsetError)."""
        self._require_writable()
        txn = AbortedTxn(*txn)
        with self._lock:
            last = self._last_offset_locked()
            if last is not None and last >= txn.last_offset:
                raise InvalidOffsetError(
                    f"the last offset of appended transactions must increase sequentially, but "
                    f"{txn.last_offset} is not greater than current last offset {last} of index "
                    f"{self.path}")
            fd = self._open_locked()
            data = txn.to_bytes()
            write_all(fd, data, self._size, self.path)
            self._size += len(data)
            self._last, self._last_known = txn.last_offset, True

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose last offset is >= ``offset`` (never creates the file)."""
        self._require_writable()
        with self._lock:
            entries = self._parse(self._read_locked(), strict=False)
            keep = next((i for i, t in enumerate(entries) if t.last_offset >= offset), None)
            if keep is None:
                return
            self._truncate_locked(keep * ENTRY_SIZE)
            self._last = entries[keep - 1].last_offset if keep else None
            self._last_known = True

    def reset(self) -> None:
        """Remove every entry (recovery rebuilds them); an existing file stays, empty."""
        self._require_writable()
        with self._lock:
            if self._fd is not None or os.path.exists(self.path):
                self._truncate_locked(0)
            self._last, self._last_known = None, True

    def _truncate_locked(self, length: int) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, length)
            self._size = length
        else:
            try:
                os.truncate(self.path, length)
            except FileNotFoundError:
                pass

    # -- files ------------------------------------------------------------------------------
    def flush(self) -> None:
        """fsync the file if this object wrote to it."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def open_for_sync(self) -> Optional[int]:
        """A descriptor of the file for the caller to fsync (and close) if this object wrote
        to it, else None."""
        with self._lock:
            return os.dup(self._fd) if self._fd is not None else None

    def close(self) -> None:
        """Close the descriptor (the index reopens on the next append)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def rename(self, new_path: str) -> None:
        """Rename the file (if there is one) and follow it."""
        with self._lock:
            if self._fd is not None or os.path.exists(self.path):
                os.replace(self.path, new_path)
            self.path = new_path

    def delete(self) -> bool:
        """Close and unlink the file; True if there was one."""
        self.close()
        with self._lock:
            self._last, self._last_known = None, True
            try:
                os.unlink(self.path)
                return True
            except FileNotFoundError:
                return False

    def __repr__(self) -> str:
        return f"TransactionIndex(path={self.path!r}, start_offset={self.start_offset})"


def collect_aborted_transactions(segments, start_offset: int,
                                 upper_bound_offset: int) -> list[AbortedTxn]:
    """Aborted transactions overlapping [start_offset, upper_bound_offset) in a log's segments
    (oldest first): Kafka's ``LocalLog.collectAbortedTransactions``. An entry lives in the
    segment of its ABORT marker, which may come after the range, so the walk goes on from the
    segment holding ``start_offset`` until an index reports its search complete."""
    import bisect
    bases = [s.base_offset for s in segments]
    first = max(bisect.bisect_right(bases, start_offset) - 1, 0)
    out: list[AbortedTxn] = []
    for seg in segments[first:]:
        res = seg.txn_index.search(start_offset, upper_bound_offset)
        out.extend(res.aborted)
        if res.is_complete:
            break
    return out
