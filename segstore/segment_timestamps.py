"""A segment's timestamps (Kafka's LogSegment maxTimestampSoFar, largestTimestamp,
lastModified): the largest batch timestamp, loaded from the time index's last entry and the
batches after it, and the files' dates, which retention falls back on when no record carries
a timestamp. A mixin of :class:`segstore.segment.LogSegment`.
"""

from __future__ import annotations

import os

import numpy as np


class SegmentTimestamps:
    """max_timestamp_so_far, largest_timestamp, last_modified_ms and set_last_modified."""

    def _load_max_timestamp(self) -> tuple[int, int]:
        ts, off = self.time_index.last_entry() if self.time_index.entries else (-1, self.base_offset)
        _, pos = self.offset_index.lookup(off)
        if self.size:
            b = self.scan(min(pos, self.size)).batches
            if len(b):
                i = int(np.argmax(b["max_timestamp"]))
                if b["max_timestamp"][i] > ts:
                    ts, off = int(b["max_timestamp"][i]), int(b["last_offset"][i])
        return ts, off

    @property
    def max_timestamp_so_far(self) -> int:
        """Largest batch max timestamp in the segment (-1 when none)."""
        if self._max_ts is None:
            self._max_ts = self._load_max_timestamp()
        return self._max_ts[0]

    @property
    def offset_of_max_timestamp(self) -> int:
        """Last offset of the batch that holds the max timestamp."""
        if self._max_ts is None:
            self._max_ts = self._load_max_timestamp()
        return self._max_ts[1]

    @property
    def largest_timestamp(self) -> int:
        """Max timestamp, or the file's mtime when no record has a timestamp (REF §3.7)."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        """When the segment was last written, by the store's clock if this session wrote it,
        else its log file's mtime (which a roll, a close and a cleaning set by that clock)."""
        if self._modified_ms is not None:
            return self._modified_ms
        fd = self._fd_value
        st = os.fstat(fd) if fd is not None else os.stat(self.log_path)
        return int(st.st_mtime * 1000)

    def set_last_modified(self, ms: int) -> None:
        """Date the segment (Kafka's ``lastModified_=``): its files' mtimes and
        :attr:`last_modified_ms`, which retention and the cleaner's legacy horizon read."""
        self._modified_ms = int(ms)
        self._date_files()

    def _date_files(self) -> None:
        # Retention falls back on the mtime when no record has a timestamp: files written by
        # this session carry the store's clock, so an injected clock governs them after a
        # reopen too.
        if self._modified_ms is None or self.readonly:
            return
        ns = self._modified_ms * 1_000_000
        for path in (self.log_path, *self._index_paths):
            try:
                os.utime(path, ns=(ns, ns))
            except FileNotFoundError:
                pass
