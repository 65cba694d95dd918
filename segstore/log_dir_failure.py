"""A partition log going offline after an I/O error: Kafka's log dir failure
(``LogDirFailureChannel``), for one log.

An I/O error in the middle of a write (an append's, a roll's, a flush's: ENOSPC, EIO, a failed
fsync) may leave the files and the in-memory state apart: a segment holding a batch the
producer state never saw, or a failed fsync whose pages the kernel has since marked clean (a
retried fsync would then succeed without them on disk). No later write may build on that. So
the log goes offline: its writes raise :class:`~segstore.errors.KafkaStorageError` while reads
go on serving what was appended before, and the store writes no clean-shutdown marker, so the
next open recovers the log from what is on disk, as after a crash. Kafka takes the whole log
dir offline; a store here loses only the failed partitions.

A mixin of :class:`segstore.log.PartitionLog`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Optional

from .errors import KafkaStorageError

log = logging.getLogger("segstore.log")


class LogDirFailure:
    """``offline``, and the guard that takes the log offline."""

    _failure: Optional[OSError] = None   # the I/O error that took the log offline

    @property
    def offline(self) -> bool:
        """Whether an I/O error in the middle of a write took the log offline."""
        return self._failure is not None

    def _check_online(self) -> None:
        if self._failure is not None:
            raise self._offline_error(
                f"log {self.topic}-{self.partition} is offline since an I/O error "
                f"({self._failure}); reopen the store to recover it")

    def _offline_error(self, message: str) -> KafkaStorageError:
        errno = self._failure.errno
        return KafkaStorageError(message) if errno is None else KafkaStorageError(errno, message)

    @contextlib.contextmanager
    def _going_offline_on_io_error(self):
        """Around a write: an OSError takes the log offline and is raised as a
        KafkaStorageError (with the same errno, the OSError as its cause)."""
        try:
            yield
        except KafkaStorageError:
            raise
        except OSError as e:
            self._failure = e
            raise self._offline_error(
                f"log {self.topic}-{self.partition} went offline after an I/O error ({e}); "
                f"reopen the store to recover it") from e

    def _close_segments(self) -> None:
        """Close every segment's files: an offline log's without writing to them (the next
        open recovers what they hold), a healthy one's as usual."""
        for s in self._state.segments:
            if self._failure is None:
                s.close()
                continue
            try:
                s.abandon()
            except OSError:
                log.warning("closing offline log %s-%d: %s", self.topic, self.partition,
                            s.log_path, exc_info=True)
