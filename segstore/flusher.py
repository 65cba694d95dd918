"""The fsyncs of a segment's files, all at once and off the calling thread (beyond Kafka).

Kafka flushes a segment's files one after the other (the log, then each index). On this
project's VMs an fsync costs a device round trip (0.2 - 1 ms) whatever it writes, and the
device serves several at once: three new files of a few bytes took 1.1 ms synced together and
2.4 ms one after the other. So :class:`PendingFlush` syncs each file on a thread of a small
pool, the GIL released in the syscall, and a caller with other work (the cleaner filtering its
next group) can do it while they run and wait later.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Optional

MAX_THREADS = 8   # two cleaner threads, each with two segments' files in flight, fit

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS,
                                       thread_name_prefix="segstore-flusher")
        return _pool


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Sync:
    """One descriptor's fsync, run by whichever claims it first: the pool's thread, or the
    waiting thread when the pool could not start one (``submit`` queues the work before it
    starts a thread, so a refused start can still run it later, on a closed number)."""

    __slots__ = ("fd", "_claim")

    def __init__(self, fd: int):
        self.fd = fd
        self._claim = threading.Lock()

    def run(self) -> None:
        if self._claim.acquire(blocking=False):
            _fsync_and_close(self.fd)


class PendingFlush:
    """fsyncs of some descriptors (owned: each is closed once synced), started on the pool;
    :meth:`wait` for them. Not waiting leaves them to finish on their own.

    The first ``here`` descriptors are synced by :meth:`wait` itself, on the waiting thread:
    a caller that waits at once (``LogSegment.flush`` passes them all) saves a thread
    hand-off, which costs a sleeping thread's wake-up (0.5 ms on this project's VMs)."""

    def __init__(self, fds: Iterable[int], here: int = 0):
        syncs = [_Sync(fd) for fd in fds]
        self._here, syncs = syncs[:here], syncs[here:]
        self._futures = []
        try:
            pool = _executor() if syncs else None
            for sync in syncs:
                self._futures.append(pool.submit(sync.run))
        except RuntimeError:   # no new thread (or the interpreter is shutting down): sync here
            self._here += syncs[len(self._futures):]

    def wait(self) -> None:
        """Wait for every fsync, even after an interrupt or a failed one (none outlives its
        caller's wait), then raise the first error, if any."""
        error = None
        here, self._here = self._here, []
        for sync in here:
            try:
                sync.run()
            except BaseException as e:   # the rest are still closed, the pool still waited for
                error = error or e
        for f in self._futures:
            while True:
                try:
                    e = f.exception()
                    break
                except BaseException as interrupt:   # KeyboardInterrupt while waiting
                    error = error or interrupt
            error = error or e
        self._futures = []
        if error is not None:
            raise error


def _forget_pool() -> None:
    # A forked child (a Spark worker) has the executor but not its threads.
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
