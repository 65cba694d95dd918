"""Cleaning workloads for the kill -9 tests of tests/crash/test_clean_crash.py.

Two modes, each meant to die by SIGKILL:

* ``compact``: open an existing store, then -- with crash injection armed -- run
  ``store.compact(TOPIC)`` once and exit without closing. With ``crash_at=N`` the process
  SIGKILLs itself at the N-th mutating file-system call (before it, after it, or after writing
  only part of a ``pwrite``); with ``crash_at=None`` it reports ``C <calls>``, the number of
  such calls a whole compaction made, so the parent can try every kill point.
* ``workload``: open (or create) the store, start the services with one cleaner thread that
  cleans eagerly, and append deterministic records (:func:`record`) and roll segments until
  killed by the parent. Reports ``O <leo>`` after opening and ``A <leo>`` after every append.

Records are a pure function of their offset, so the parent can tell a genuine record from a
torn, misplaced or resurrected one. The store clock is constant (:data:`NOW`): no retention, no
roll by time, and tombstones keep their delete horizon in the future.

Run as a script (a fresh interpreter)::

    python tests/crash/child_cleaner.py MODE STORE_PATH SEED [--crash-at N]
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from keyless import append_batch_unvalidated  # noqa: E402

T0 = 1_700_000_000_000
NOW = T0 + 10_000_000
TOPIC = "t"
KEYS = 40
TOPIC_CONFIG = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01,
                "segment.bytes": 2500, "file.delete.delay.ms": 0,
                "index.interval.bytes": 200}
# A small offset map (at most 28 keys per round) so rounds often stop early: more swaps.
STORE_CONFIG = {"log.cleaner.threads": 1, "log.cleaner.backoff.ms": 1,
                "log.cleaner.dedupe.buffer.size": 24 * 32,
                "log.retention.check.interval.ms": 3_600_000,
                "log.flush.scheduler.interval.ms": 50}


def clock() -> int:
    return NOW


def record(offset: int):
    """(key, value, timestamp) written at ``offset``: keyless now and then, tombstones too."""
    h = (offset * 2654435761) % 2 ** 32
    if h % 29 == 0:
        key = None
    else:
        key = b"k%02d" % (h % KEYS if h % 3 else h % 7)       # skewed: k00..k06 are hot
    if key is not None and h % 17 == 0:
        value = None
    else:
        value = b"%d:" % offset + b"x" * (h % 37)
    return key, value, T0 + offset


# -- crash injection -----------------------------------------------------------------------------

# Not fsync: it changes nothing a SIGKILL can observe (the page cache outlives the process),
# and segstore/flusher.py runs it on threads of its own, whose order against this thread's
# calls varies from run to run (the N-th call would not be the same point twice).
_MUTATING = ("pwrite", "write", "open", "ftruncate", "replace", "rename", "unlink",
             "truncate", "posix_fallocate")


class Crasher:
    """Counts mutating file-system calls; SIGKILLs the process at the ``crash_at``-th."""

    def __init__(self, crash_at, rng: random.Random, report_fd: int):
        self.crash_at = crash_at
        self.calls = 0
        self.rng = rng
        self.report_fd = report_fd

    @staticmethod
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    def install(self) -> None:
        for name in _MUTATING:
            if hasattr(os, name):
                setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name, orig):
        me = self

        def wrapper(*args, **kw):
            if name == "write" and args and args[0] == me.report_fd:
                return orig(*args, **kw)
            if name == "open":
                flags = args[1] if len(args) > 1 else kw.get("flags", 0)
                if not flags & (os.O_CREAT | os.O_TRUNC):
                    return orig(*args, **kw)
            me.calls += 1
            if me.crash_at is None or me.calls != me.crash_at:
                return orig(*args, **kw)
            how = me.rng.choice(("before", "after", "partial"))
            if how == "before":
                me.die()
            if how == "partial" and name == "pwrite" and len(args[1]) > 1:
                fd, data, pos = args[:3]
                orig(fd, memoryview(data)[:me.rng.randrange(1, len(data))], pos)
                me.die()
            orig(*args, **kw)
            me.die()
        return wrapper


# -- the modes -----------------------------------------------------------------------------------


def say(fd: int, *fields) -> None:
    os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())


def run_compact(path: str, report_fd: int, seed: int, crash_at=None) -> None:
    import segstore
    store = segstore.open(path, config=STORE_CONFIG, clock=clock)
    crasher = Crasher(crash_at, random.Random(f"{seed}:{crash_at}"), report_fd)
    crasher.install()
    store.compact(TOPIC)
    say(report_fd, "C", crasher.calls)


def run_workload(path: str, report_fd: int, seed: int) -> None:
    import segstore
    rng = random.Random(seed)
    store = segstore.open(path, config=STORE_CONFIG, clock=clock)
    if TOPIC not in store.list_topics():
        store.create_topic(TOPIC, 1, TOPIC_CONFIG)
    lg = store.partition(TOPIC, 0)
    say(report_fd, "O", lg.log_end_offset)
    store.start_services()
    while True:
        n = rng.choice((1, 1, 2, 5))
        first = lg.log_end_offset
        recs = [record(first + i) for i in range(n)]
        append_batch_unvalidated(lg, [r[1] for r in recs], [r[0] for r in recs],
                                 timestamps_ms=[r[2] for r in recs])  # some keyless
        say(report_fd, "A", lg.log_end_offset)
        if rng.random() < 0.04:
            lg.roll()


def run(mode: str, path: str, report_fd: int, seed: int, crash_at=None) -> None:
    try:
        if mode == "compact":
            run_compact(path, report_fd, seed, crash_at)
        else:
            run_workload(path, report_fd, seed)
    except BaseException:
        say(report_fd, "E", traceback.format_exc().replace("\n", "\\n"))
        raise


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("compact", "workload"))
    ap.add_argument("path")
    ap.add_argument("seed", type=int)
    ap.add_argument("--crash-at", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        run(args.mode, args.path, sys.stdout.fileno(), args.seed, args.crash_at)
    except BaseException:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
