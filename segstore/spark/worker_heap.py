"""Once per Spark Python worker: take its long-lived objects out of the collector's full passes.

PySpark's daemon runs a full ``gc.collect()`` in a reused Python worker after every task
(``pyspark/daemon.py``). A full collection walks every tracked object: a worker that has imported
pyspark, pyarrow, pandas, numpy and segstore holds about 80,000 of them, and the walk takes
25 - 35 ms of CPU on the project's VMs, almost none of it garbage. After a write task, the two
workers of a ``local[2]`` session collect while the driver's ``commit()`` runs, on the same two
cores. ``gc.freeze()`` moves every object tracked at that moment into the permanent generation,
which collections skip; reference counting still frees them as before.

segstore's write tasks freeze the heap once per worker process, at the start of the first one:
the daemon has just collected (or the worker was just forked), so what is frozen is the
worker's modules and state, and the task's own setup. The cost is that a cycle among those
objects that later becomes garbage is never collected (bounded: it happens once per process).
The ``freezeWorkerHeap`` write option (default true) turns it off. Outside a Spark task (a driver,
a test calling the task code directly) nothing is frozen.
"""

from __future__ import annotations

import gc

_frozen = False


def in_spark_task() -> bool:
    """Whether this code runs inside a Spark task (a Python worker with a TaskContext)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the spark extra is installed wherever this runs
        return False
    return TaskContext.get() is not None


def freeze_once() -> bool:
    """Freeze the worker's tracked objects, once per process and only inside a Spark task.

    Returns whether this call froze them."""
    global _frozen
    if _frozen or not in_spark_task():
        return False
    gc.freeze()
    _frozen = True
    return True
