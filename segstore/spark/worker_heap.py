"""Once per Spark Python worker: take its long-lived objects out of the collector's full passes.

PySpark's daemon runs a full ``gc.collect()`` in a reused Python worker after every task
(``pyspark/daemon.py``). A full collection walks every tracked object: a worker that has imported
pyspark, pyarrow, pandas, numpy and segstore holds about 80,000 of them, and the walk takes
25 - 35 ms of CPU on the project's VMs, almost none of it garbage. After a write task, the two
workers of a ``local[2]`` session collect while the driver's ``commit()`` runs, on the same two
cores. ``gc.freeze()`` moves every object tracked at that moment into the permanent generation,
which collections skip; reference counting still frees them as before.

segstore's write tasks freeze the heap once per worker process, at the start of the first one.
Reused workers live as long as the executor, so what is frozen is everything the worker holds
then: its modules, broadcast values it has loaded, what earlier tasks' code left in module
globals, the first write task's own setup (and, in a freshly forked worker, the garbage made
since the fork, which the daemon has not collected yet). Reference counting still frees any of
it that is dropped; but a reference cycle among frozen objects that later becomes garbage, and
everything reachable only from it, is never collected, for the executor's lifetime. How much
that can be depends on the application (a broadcast object graph with cycles, later
unpersisted, is the case to watch). The ``freezeWorkerHeap`` write option (default true) turns
the freeze off. Without worker reuse (``spark.python.worker.reuse=false``) the daemon collects
nothing after a task and each task gets a new process: freezing then neither helps nor holds
anything past the task. Outside a Spark task (a driver, a test calling the task code directly)
nothing is frozen.
"""

from __future__ import annotations

import gc

from pyspark import TaskContext

_frozen = False


def in_spark_task() -> bool:
    """Whether this code runs inside a Spark task (a Python worker with a TaskContext)."""
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
