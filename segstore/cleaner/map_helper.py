"""A second core for a lone cleaner thread (beyond Kafka).

Kafka's cleaner thread builds its offset map and filters the segments alone. When a store
runs one cleaner thread (Kafka's default) on a machine with a core to spare, a helper thread
takes the later part of both phases (the compiled loops release the GIL, so both parts run at
once):

- the map: ``Cleaner.build_offset_map`` maps the later segments of the dirty section into a
  side map while it maps the earlier ones into its own, then merges the side map in
  (``OffsetMap.merge_from``: every later offset overwrites an earlier one, exactly as mapping
  the segments in order would), the merge's lookups also split between the two threads;
- the filter: ``Cleaner.clean_groups`` lets a sibling Cleaner filter groups into their
  ``.cleaned`` segments from the last one back while it cleans groups from the first on,
  each thread taking the next group as it finishes one, then swaps the helper's in, in
  order. Only groups whose batches are all plain (no producer id, control, codec or legacy
  format), which the filter kernel decides without the transaction state or the active
  producers.

The map is split only when the result cannot differ from one pass in order:

- the offset strategy (a KIP-280 strategy compares values, and its clean-section pass must
  follow the dirty one);
- a dirty section of fewer offsets than the map's ``max_desired_size``: it holds fewer
  records than that, so the map cannot fill, and Kafka's stopping point (the first key that
  would overfill it) is never reached;
- a later part whose offsets fit the side map the same way.

With more than one cleaner thread configured the threads themselves use the cores, and at most
one helper runs in a process at a time (a round that finds it busy maps in one pass).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from .. import _core
from ..errors import CleaningAbortedError

SIDE_MAP_BYTES = 16 << 20   # the side map's buffer: 699,050 slots, touched as it fills and
                            # kept between builds (zeroed by the merge that drains it)
MIN_BYTES = 16 << 20        # smaller dirty sections: a thread hand-off costs what it saves
LATER_SHARE = 0.55          # of the bytes, at most, for the helper: the merge follows the
                            # earlier part on the cleaner's own thread
MIN_LATER_SHARE = 0.2       # a smaller later part is not worth the merge
CHUNK_BYTES = 16 << 20      # mapped per call while both threads map (see map_build)

_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None


def spare_core() -> bool:
    """Whether this process may run on more than one CPU."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except AttributeError:  # not Linux
        return (os.cpu_count() or 1) > 1


def split_point(dirty: list, start: int, end: int, max_desired: int,
                side_max_desired: int) -> Optional[int]:
    """Index of the first dirty segment the helper maps, or None to map in one pass.

    ``max_desired`` / ``side_max_desired``: the entries at which the cleaner's map and the
    side map stop filling. The later part is the longest run of last segments holding at most
    LATER_SHARE of the bytes whose offsets [base, end) fit the side map.
    """
    if len(dirty) < 2 or end - start >= max_desired:
        return None
    sizes = [s.size for s in dirty]
    total = sum(sizes)
    if total < MIN_BYTES:
        return None
    later, k = 0, len(dirty)
    for i in range(len(dirty) - 1, 0, -1):
        if later + sizes[i] > total * LATER_SHARE or end - dirty[i].base_offset >= side_max_desired:
            break
        later += sizes[i]
        k = i
    if later < total * MIN_LATER_SHARE:
        return None
    return k


def filter_worth_splitting(group_bytes: list) -> bool:
    """Whether cleaning's groups (by their bytes) are worth sharing with the helper: two or
    more, of MIN_BYTES or more in all."""
    return len(group_bytes) >= 2 and sum(group_bytes) >= MIN_BYTES


_side_maps: dict = {}   # load factor -> the side map (one helper, so one in use, per process)


def side_map(load_factor: float):
    """The helper's side map for maps of ``load_factor``; the caller holds the helper. One per
    process (per load factor), kept between rounds and stores: a merge drains it (leaves its
    table zeroed), and a new map's pages cost a round 10 ms or more to fault in on this
    project's VMs."""
    m = _side_maps.get(load_factor)
    if m is None:
        m = _side_maps[load_factor] = _core.OffsetMap(SIDE_MAP_BYTES, load_factor)
    return m


def try_acquire() -> bool:
    """Take the process's helper, if no other round has it."""
    return _lock.acquire(blocking=False)


def release() -> None:
    _lock.release()


def submit(fn, *args):
    """Run ``fn(*args)`` on the helper thread (taken with :func:`try_acquire`)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="segstore-map-helper")
    return _pool.submit(fn, *args)


class HelperCancelled(CleaningAbortedError):
    """The helper's part of a round stopped because the cleaner thread's part failed."""


class HelperJob:
    """One part of a round on the helper thread (taken with :func:`try_acquire`).

    ``fn(check)`` must call ``check()`` between pieces of work (segments, chunks): once the
    job is cancelled, ``check`` raises HelperCancelled there. :meth:`finish` waits for the job
    however this thread is interrupted meanwhile, so the helper never outlives the round that
    started it (it writes into the round's maps and files)."""

    def __init__(self, fn):
        self.cancelled = threading.Event()
        self.future = submit(fn, self.check)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise HelperCancelled("the cleaner thread's part of the round failed")

    def cancel(self) -> None:
        self.cancelled.set()

    def finish(self) -> tuple:
        """``(result, exception, interrupt)``: waits for the job to end; an exception raised
        in this thread while it waits (KeyboardInterrupt) cancels the job, is returned as
        ``interrupt`` once the job has ended, and is never raised here."""
        interrupt = None
        while True:
            try:
                error = self.future.exception()
                break
            except BaseException as e:  # an interrupt while waiting: stop the job, wait on
                interrupt = interrupt or e
                self.cancel()
        return (None if error is not None else self.future.result()), error, interrupt

    def beside(self, work) -> tuple:
        """Run ``work()`` on this thread while the job runs, then wait for the job (cancelled
        if ``work`` failed). ``(job result, first error)``: ``work``'s error, else an interrupt
        while waiting, else the job's; None when all went well."""
        failure = None
        try:
            work()
        except BaseException as e:
            failure = e
            self.cancel()
        result, error, interrupt = self.finish()
        return result, failure or interrupt or error


SPIN_SECONDS = 0.002   # a meeting's wait spins this long before it sleeps


class Meeting:
    """Where the cleaner thread (0) and the helper (1) wait for each other between two
    phases of a round. Each thread ``arrive``s, saying whether its part went well, then
    ``wait_for`` the other: the wait spins briefly without the GIL (``_core.spin_wait``)
    before it sleeps, since a thread woken from sleep on a VM started 0.5 - 0.7 ms late."""

    def __init__(self):
        self._flags = np.zeros(2, dtype=np.int64)   # 0: not yet, 1: arrived ok, 2: failed
        self._arrived = (threading.Event(), threading.Event())

    def arrive(self, who: int, ok: bool) -> None:
        _core.spin_set(self._flags, who, 1 if ok else 2)
        self._arrived[who].set()

    def wait_for(self, who: int, check=lambda: None) -> bool:
        """Wait until thread ``who`` arrives (``check()`` runs between sleeps: the helper's
        raises once the job is cancelled); whether its part went well."""
        if not _core.spin_wait(self._flags, who, SPIN_SECONDS):
            while not self._arrived[who].wait(0.005):
                check()
        return int(self._flags[who]) == 1


def start(fn) -> Optional[HelperJob]:
    """A HelperJob running ``fn``, or None when no thread can be started (the interpreter is
    shutting down): the caller does its work in one pass instead."""
    try:
        return HelperJob(fn)
    except RuntimeError:
        return None


def _forget_pool() -> None:
    # A forked child has the executor but not its thread, nor the lock's holder.
    global _pool, _lock
    _pool = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
