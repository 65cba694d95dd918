"""Opening stores from Spark code: read-only inside tasks, writable (with a lock wait) to commit.

Nothing here is kept between calls: a store holds file descriptors, mmaps and a lock, none of
which may travel in a pickled reader or writer (ECO §1.1), so every task and every driver-side
step opens the store it needs and closes it when done.
"""

from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager
from typing import Iterator

from ..errors import StoreLockedError
from ..store import LogStore, open as open_store
from .options import InvalidOptionError

# A driver's commit or a compaction task opens the store for a moment and closes it: its logs
# are opened, and flushed and closed (a producer snapshot's fsync each), on this many threads.
WRITER_RECOVERY_THREADS = 4


def check_store_dir(path: str) -> None:
    """Fail early, naming the path, when a store directory does not exist."""
    if not os.path.isdir(path):
        raise InvalidOptionError(f"segstore store directory {path!r} does not exist")


@contextmanager
def readonly(path: str) -> Iterator[LogStore]:
    """The store at ``path`` opened read-only (no lock: safe beside a live writer)."""
    check_store_dir(path)
    store = open_store(path, readonly=True)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def writable(path: str, timeout_ms: int, purpose: str) -> Iterator[LogStore]:
    """The store opened writable, waiting up to ``timeout_ms`` for its writer lock.

    Only one process may hold ``<root>/.lock``; Spark commits, compaction tasks and other
    writers queue for it with jittered backoff instead of failing at once. ``purpose`` goes into
    the timeout error, which also says how to free the lock.
    """
    check_store_dir(path)
    deadline = time.monotonic() + timeout_ms / 1000.0
    delay = 0.02
    while True:
        try:
            store = open_store(path, {"num.recovery.threads.per.data.dir":
                                      WRITER_RECOVERY_THREADS})
            break
        except StoreLockedError as e:
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"{purpose}: waited {timeout_ms} ms for the writer lock of {path} and gave "
                    f"up ({e}). Close any writable segstore.open({path!r}) in the driver or "
                    "other processes first, or raise the option 'lockTimeoutMs'") from None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
    try:
        yield store
    finally:
        store.close()
