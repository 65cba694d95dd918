"""Truncating a segment (Kafka's LogSegment.truncateTo): what a log truncation and recovery
cut from a segment's end.

A file that may be mapped is never shrunk in place (a reader touching a cut page would die of
SIGBUS): the kept prefix is copied to a new file renamed over the old one, and readers holding
the old map keep reading the old file. A mixin of :class:`segstore.segment.LogSegment`.
"""

from __future__ import annotations

import os


class SegmentTruncation:
    """truncate_to and truncate_bytes."""

    def truncate_to(self, offset: int) -> int:
        """Drop the batch holding ``offset`` and everything after it; returns bytes removed."""
        first = self.translate_offset(offset)
        self.txn_index.truncate_to(offset)  # aborted txns whose marker goes
        if first is None:
            # Nothing to drop, but the segment may become active again: room in its indexes,
            # and an empty one waits for its roll from now (Kafka resets the create time
            # whenever the log is empty after a truncateTo).
            self.offset_index.resize(self.config.segment_index_bytes)
            self.time_index.resize(self.config.segment_index_bytes)
            if self.size == 0:
                self.created_ms = self.clock()
                self.rolling_based_timestamp = None
            return 0
        keep = int(first["position"])
        removed = self.size - keep
        self._dirty = self._unsynced = True
        self._rewrite_prefix(keep)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.offset_index.resize(self.config.segment_index_bytes)
        self.time_index.resize(self.config.segment_index_bytes)
        self.bytes_since_last_index_entry = 0
        self._max_ts = None
        self.rolling_based_timestamp = None  # read from the first batch when needed
        if self.size == 0:
            self.created_ms = self.clock()
        return removed

    def _rewrite_prefix(self, keep: int) -> None:
        """Keep [0, keep) of the log file without shrinking a file a reader may map.

        Readers in this or another (read-only) process may map the file, so it is always
        copied: the kept prefix goes to a new file renamed over the old one.
        """
        tmp = self.log_path + ".truncating"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < keep:
                done += os.copy_file_range(self._fd, fd, keep - done, done, done)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        with self._lock:  # buffer() sees the old file and size or the new ones
            os.replace(tmp, self.log_path)
            old = self._fd_value
            self._fd_value = fd
            self._inode = os.fstat(fd).st_ino
            self._mm = None  # readers holding the old map keep reading the old file
            self.size = keep
        if old is not None:
            os.close(old)

    def truncate_bytes(self, valid_bytes: int) -> int:
        """Cut the file at ``valid_bytes`` (recovery after a torn or corrupt tail)."""
        removed = self.size - valid_bytes
        if removed > 0:
            self._rewrite_prefix(valid_bytes)
        return max(removed, 0)
