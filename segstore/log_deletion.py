"""Removing data from a PartitionLog: truncation (Kafka's UnifiedLog.truncateTo and
truncateFullyAndStartAt), DeleteRecords, retention's segment deletion and the cleaner's swap.

A mixin of :class:`segstore.log.PartitionLog`: every method holds the log's lock and replaces
its snapshot state (``self._state``) in one assignment, so readers see the log before or after.
An I/O error part way (a rename, an unlink) takes the log offline (segstore/log_dir_failure.py).
"""

from __future__ import annotations

from collections import abc
from typing import Optional

from . import log_swap
from .checkpoint import fsync_dir
from .errors import (InvalidArgumentError, InvalidOffsetError, OffsetOutOfRangeError,
                     offset_argument)
from .flusher import PendingFlush
from .log_state import LogState as _State
from .producer_snapshots import delete_snapshots, reload_producer_state, take_snapshot
from .segment import CLEANED_SUFFIX, DELETED_SUFFIX, LogSegment


class LogDeletion:
    """truncate_to, truncate_fully_and_start_at, delete_records, delete_segments and
    replace_segments."""

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or above ``offset`` (the whole batch holding it)."""
        self._check_writable()
        offset = offset_argument(offset, "truncate_to offset")
        if offset < 0:
            raise InvalidOffsetError(f"cannot truncate to a negative offset {offset}")
        with self._lock, self._going_offline_on_io_error():
            st = self._state
            if offset >= st.log_end_offset:
                return
            if st.segments[0].base_offset > offset:
                self._truncate_fully_locked(offset, offset)
                return
            keep = tuple(s for s in st.segments if s.base_offset <= offset)
            self.truncations += 1
            for s in reversed(st.segments[len(keep):]):  # highest first: a crash leaves a prefix
                self._retire(s)
            keep[-1].truncate_to(offset)
            # Kafka sets the log end offset to the target and expects callers to truncate at
            # batch edges; segstore ends the log where its data ends, so no offsets are skipped.
            leo = keep[-1].read_next_offset()
            self._state = _State(keep, min(st.log_start_offset, leo), leo)
            self.recovery_point = min(self.recovery_point, leo)
            self._truncated(leo)
            # Kafka's truncateAndReload: snapshots above the new end go, the newest one left
            # and the batches after it give the state.
            self.producer_state = reload_producer_state(self.directory, keep, leo)
            # As Kafka's rebuildProducerState ends: a snapshot at the new end, so that a later
            # truncation or open still starts from a state that knows the producers of
            # segments retention deletes meanwhile (none may be left at or below it here).
            if take_snapshot(self.producer_state, self.directory, leo):
                fsync_dir(self.directory)

    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start an empty log at ``new_offset``."""
        self._check_writable()
        # Checked before anything is retired: a bad argument must leave the log as it was.
        new_offset = offset_argument(new_offset, "new_offset")
        if not 0 <= new_offset < 1 << 63:
            raise InvalidOffsetError(f"cannot start a log at offset {new_offset}: offsets are "
                                     f"from 0 to 2**63 - 1")
        with self._lock, self._going_offline_on_io_error():
            self._truncate_fully_locked(new_offset, new_offset)

    def _truncate_fully_locked(self, new_offset: int, log_start: int) -> None:
        self.truncations += 1
        for s in self._state.segments:
            self._retire(s)
        seg = LogSegment(self.directory, new_offset, self.config, self.clock,
                         preallocate=self.config.preallocate)
        self._state = _State((seg,), log_start, new_offset)
        self.recovery_point = new_offset
        self.producer_state.clear(new_offset)
        delete_snapshots(self.directory)
        fsync_dir(self.directory)
        self._truncated(new_offset)

    def _truncated(self, offset: int) -> None:
        for fn in self.truncation_listeners:
            fn(self.topic_partition, offset)

    def delete_records(self, before_offset: int) -> int:
        """Raise the log start offset to ``before_offset`` (Kafka's DeleteRecords) and return
        the log start offset; OffsetOutOfRangeError past the log end. The space is freed by
        the next retention pass (segments wholly below the new start)."""
        self._check_writable()
        before_offset = offset_argument(before_offset, "delete_records offset")
        with self._lock, self._going_offline_on_io_error():
            st = self._state
            if before_offset > st.log_end_offset or before_offset < 0:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {before_offset}: log end offset is "
                    f"{st.log_end_offset}")
            if before_offset > st.log_start_offset:
                self._state = _State(st.segments, before_offset, st.log_end_offset)
            return self._state.log_start_offset

    def delete_segments(self, segments, new_log_start: Optional[int] = None) -> None:
        """Remove segments from the log (retention), renaming their files ``.deleted``.

        ``segments`` must be segments of this log and ``new_log_start`` an int offset (or
        None): anything else raises before a file is renamed (InvalidArgumentError,
        OffsetTypeError)."""
        self._check_writable()
        if new_log_start is not None:
            new_log_start = offset_argument(new_log_start, "new_log_start")
        segments = _segment_list(segments, "segments")
        with self._lock, self._going_offline_on_io_error():
            st = self._state
            live = {id(s) for s in st.segments}
            for s in segments:
                # Another log's segment would lose that log's data; a stray object would fail
                # half way, after renaming the segments before it.
                if id(s) not in live:
                    raise InvalidArgumentError(
                        f"{s!r} is not a segment of {self.topic}-{self.partition}")
            gone = {id(s) for s in segments}
            keep = tuple(s for s in st.segments if id(s) not in gone)
            if not keep:
                raise InvalidOffsetError("a log always keeps at least one segment")
            for s in segments:
                self._retire(s)
            kept = {s.base_offset for s in keep}
            delete_snapshots(self.directory, [s.base_offset for s in segments
                                              if s.base_offset not in kept])
            start = max(st.log_start_offset, keep[0].base_offset,
                        new_log_start if new_log_start is not None else -1)
            self._state = _State(keep, min(start, st.log_end_offset), st.log_end_offset)

    def replace_segments(self, new_segments, old_segments, *,
                         expected_truncations: Optional[int] = None,
                         sync_directory: bool = True) -> Optional[PendingFlush]:
        """Swap cleaned segments in for old ones with Kafka's crash-safe protocol (REF §2.2;
        :func:`segstore.log_swap.replace_segments`)."""
        self._check_writable()
        new_segments = _segment_list(new_segments, "new_segments")
        old_segments = _segment_list(old_segments, "old_segments")
        for s in new_segments:
            # The swap renames them .cleaned -> .swap one by one: one that is not a cleaned
            # segment of this directory would fail after the others were renamed.
            if s.suffix != CLEANED_SUFFIX or s.directory != self.directory:
                raise InvalidArgumentError(f"new_segments must be {CLEANED_SUFFIX} segments "
                                           f"of {self.directory}, not {s!r}")
        return log_swap.replace_segments(self, new_segments, old_segments,
                                         expected_truncations=expected_truncations,
                                         sync_directory=sync_directory)

    def _retire(self, seg: LogSegment) -> None:
        # Rename to .deleted now, delete after file.delete.delay.ms (readers may still hold it).
        if seg.suffix == "":
            seg.change_file_suffixes("", DELETED_SUFFIX)
        self._delete_later(seg, self.config.file_delete_delay_ms)  # the live config's delay


def _segment_list(segments, what: str) -> list:
    """``segments`` as a list of LogSegments, or InvalidArgumentError naming ``what``."""
    if isinstance(segments, (str, bytes)) or not isinstance(segments, abc.Iterable):
        raise InvalidArgumentError(f"{what} must be a list of segments, not "
                                   f"{type(segments).__name__}")
    segments = list(segments)
    for s in segments:
        if not isinstance(s, LogSegment):
            raise InvalidArgumentError(f"{what} must be a list of segments, not holding {s!r}")
    return segments
