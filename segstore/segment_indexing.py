"""Writing a segment's indexes whole: the rebuild of recovery (REF §4.3) and the indexes of an
adopted file (``segstore.adopt``), as opposed to the entry-by-entry indexing of appends.

A mixin of :class:`segstore.segment.LogSegment`.
"""

from __future__ import annotations

import numpy as np

from . import _core


def sealed_index_entries(batches: np.ndarray, base_offset: int, index_interval_bytes: int):
    """The index entries of a sealed segment holding exactly ``batches`` from ``base_offset``:
    the sparse rule's (REF §2.6), then the final time-index entry a roll adds (REF §2.4).

    Returns ``(offset entries, time entries, bytes since the last entry, max timestamp, its
    offset)``, entries as the ``>i4,>i4`` and ``>i8,>i4`` arrays the files hold.
    """
    offs, times, since, max_ts, off_max = _core.sparse_index(
        batches, base_offset, 0, index_interval_bytes, 0, -1, base_offset, -1)
    if len(batches) and max_ts >= 0 and (not len(times) or max_ts > int(times["ts"][-1])):
        # Filled in place: np.concatenate would turn the big-endian fields native.
        with_final = np.empty(len(times) + 1, dtype=times.dtype)
        with_final[:-1] = times
        with_final[-1] = (max_ts, off_max - base_offset)
        times = with_final
    return offs, times, since, max_ts, off_max


class SegmentIndexing:
    """``rebuild_indexes`` and ``adopt_indexes``: both indexes written from batch headers."""

    def rebuild_indexes(self, batches: np.ndarray) -> None:
        """Reset both indexes and re-add entries for scanned batches (recovery, REF §4.3)."""
        self._check_indexes_on_load = False  # about to be rebuilt: no check on loading them
        self._dirty = self._unsynced = True
        built = _core.sparse_index(batches, self.base_offset, 0, self.config.index_interval_bytes,
                                   0, -1, self.base_offset, -1)
        self._write_index_entries(built[0], built[1])
        self._set_index_state(batches, built)

    def _write_index_entries(self, offs: np.ndarray, times: np.ndarray) -> None:
        self.offset_index.reset(self.config.segment_index_bytes)
        self.time_index.reset(self.config.segment_index_bytes)
        # A rebuild indexes batch by batch from the start, which can need more entries than
        # the appends made (e.g. after truncations): grow the files rather than fail.
        for index, entries, reserve in ((self.offset_index, offs, 0), (self.time_index, times, 1)):
            if len(entries) + reserve > index.max_entries:
                index.resize((len(entries) + reserve + 1) * index.entry_size)
        self.offset_index.append_entries(offs)
        self.time_index.append_entries(times)

    def _set_index_state(self, batches: np.ndarray, built: tuple) -> None:
        # What appending ``batches`` to an empty segment would have left in memory.
        self._dirty = True
        _, _, self.bytes_since_last_index_entry, max_ts, off_max = built
        self._max_ts = (max_ts, off_max) if len(batches) else (-1, self.base_offset)
        if len(batches):
            self.rolling_based_timestamp = int(batches["max_timestamp"][0])

    def adopt_indexes(self, batches: np.ndarray, built: tuple, active: bool) -> None:
        """Index a segment that holds exactly ``batches`` with ``built``
        (:func:`sealed_index_entries`: the entries of a sealed segment) and fsync the files.
        They end preallocated when the segment stays ``active`` (appends follow), trimmed
        otherwise, as a roll leaves them."""
        self._check_indexes_on_load = False  # written from ``built``
        self._write_index_entries(built[0], built[1])
        self._set_index_state(batches, built)
        if not active:
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()
        self.offset_index.flush()
        self.time_index.flush()
