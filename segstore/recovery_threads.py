"""Kafka's ``num.recovery.threads.per.data.dir``: the threads that open (and, after an unclean
shutdown, recover) a store's logs at startup and flush and close them at shutdown.

Kafka's LogManager runs its logs' loads and shutdowns on a pool of this many threads per log
dir. The work is mostly file I/O (fsync, reads) and CRC checks in compiled code that releases
the GIL, so a few threads overlap them: a Spark commit's close of four partitions waits for
its producer-snapshot fsyncs together instead of one after another.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence


def run_jobs(threads: int, jobs: Sequence[Callable[[], object]], *,
             keep_going: bool = True) -> list:
    """Run the jobs on up to ``threads`` threads (with 1, or one job, in this thread, in
    order). Returns ``(result, exception)`` per job, in the jobs' order; every job started has
    finished when it returns. Without ``keep_going`` no job starts once one has failed: those
    get ``(None, None)`` (and, run in this thread, no entry). A KeyboardInterrupt or SystemExit
    of a job in this thread is raised at once, as from any loop."""
    if threads <= 1 or len(jobs) <= 1:
        out = []
        for job in jobs:
            out.append(_call(job))
            if out[-1][1] is not None and not keep_going:
                break
        return out
    failed = threading.Event()

    def guarded(job):
        if failed.is_set():
            return None, None
        result = _call(job)
        if result[1] is not None and not keep_going:
            failed.set()
        return result

    with ThreadPoolExecutor(min(threads, len(jobs)),
                            thread_name_prefix="segstore-recovery") as pool:
        return list(pool.map(guarded, jobs))


def _call(job: Callable[[], object]) -> tuple:
    try:
        return job(), None
    except Exception as e:  # reported with the job's position; the other jobs go on
        return None, e
