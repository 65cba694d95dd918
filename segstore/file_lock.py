"""The store's exclusive writer lock: ``<root>/.lock`` (Kafka's FileLock on a log dir's lock
file). ``flock`` is released by the kernel when the process dies, so a crash never leaves a
store locked; the holder's pid is written into the file for the error a second writer gets.
"""

from __future__ import annotations

import fcntl
import os
from typing import Optional

from .errors import StoreLockedError

LOCK_FILE = ".lock"


class FileLock:
    """An exclusive, non-blocking lock on ``<directory>/.lock``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise StoreLockedError naming the holder's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"{self.directory} is locked by another writer (pid {holder}); open it with "
                "readonly=True to read alongside it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (a no-op when not held)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
