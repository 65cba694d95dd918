"""SegmentDeleteQueue: segments renamed ``.deleted`` that wait ``file.delete.delay.ms`` before
their files go (Kafka's "delete-file" task that LocalLog.deleteSegmentFiles schedules), so a
reader holding one of them can finish with it."""

from __future__ import annotations

import threading
from typing import Callable, Optional


class SegmentDeleteQueue:
    """The store's pending segment deletions. It has its own lock: logs queue segments while
    they hold theirs, and the store's lock is taken before a log's."""

    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self._lock = threading.Lock()
        self._queue: list = []  # (due_ms, segment)

    def schedule(self, segment, delay_ms: int) -> None:
        """Delete ``segment``'s files ``delay_ms`` from now (the ``delete_later`` callback
        every PartitionLog of the store is given)."""
        with self._lock:
            self._queue.append((self._clock() + delay_ms, segment))

    def forget(self, directory: str) -> None:
        """Drop the segments of a partition directory that goes as a whole (topic deletion)."""
        with self._lock:
            self._queue = [(d, s) for d, s in self._queue if s.directory != directory]

    def delete_due(self, now: Optional[int]) -> int:
        """Delete the files of every segment due at ``now`` (None: all of them, at close);
        returns how many segments went."""
        with self._lock:
            due = [s for d, s in self._queue if now is None or d <= now]
            self._queue = [(d, s) for d, s in self._queue if not (now is None or d <= now)]
        for seg in due:
            seg.delete_files()
        return len(due)

    def __len__(self) -> int:
        return len(self._queue)


__all__ = ["SegmentDeleteQueue"]
