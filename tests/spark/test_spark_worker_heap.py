"""Write tasks freeze their Python worker's heap once (``freezeWorkerHeap``), never a driver's.

Freezing is process-wide, so everything that would freeze runs in a subprocess (or in Spark's
own workers), never in the pytest process.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

import segstore
from segstore.spark import worker_heap
from segstore.spark.options import InvalidOptionError, WriteOptions
from .sparkcheck import end_offsets


def run_child(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_option_default_true_false_and_bad_values():
    assert WriteOptions.parse({"path": "/x", "topic": "t"}, streaming=False).freeze_worker_heap
    off = WriteOptions.parse({"path": "/x", "topic": "t", "freezeworkerheap": " FALSE "},
                             streaming=False)
    assert off.freeze_worker_heap is False
    with pytest.raises(InvalidOptionError, match="freezeWorkerHeap.*'maybe'"):
        WriteOptions.parse({"path": "/x", "topic": "t", "freezeWorkerHeap": "maybe"},
                           streaming=False)


def test_outside_a_spark_task_nothing_is_frozen():
    before = gc.get_freeze_count()
    assert worker_heap.freeze_once() is False
    assert gc.get_freeze_count() == before
    assert run_child("""
        import gc
        from segstore.spark import worker_heap
        print(worker_heap.freeze_once(), gc.get_freeze_count())
    """) == "False 0"


CHILD_TASK = """
    import gc
    import pyspark
    import segstore
    from segstore.spark.encode import InputLayout
    from segstore.spark.options import WriteOptions
    from segstore.spark.writer import write_task

    class Ctx:  # as inside a Spark task
        def partitionId(self):
            return 0

        def attemptNumber(self):
            return 0

    pyspark.TaskContext.get = staticmethod(lambda: Ctx())
    root = {root!r}
    opts = WriteOptions.parse({{"path": root, "topic": "t", "freezeWorkerHeap": {flag!r}}},
                              streaming=False)
    counts = []
    for job in ("a", "b"):
        write_task(opts, InputLayout(value="value"), job, iter(()))
        counts.append(gc.get_freeze_count())
    print(*counts)
"""


@pytest.mark.parametrize("flag", ["true", "false"])
def test_write_tasks_freeze_once_per_process_unless_turned_off(tmp_path, flag):
    root = str(tmp_path / "store")
    with segstore.open(root) as store:
        store.create_topic("t", 2)
    first, second = map(int, run_child(CHILD_TASK.format(root=root, flag=flag)).split())
    if flag == "true":
        # Frozen by the first task; the second freezes nothing more (its objects stay collectable).
        assert first > 1000 and second == first
    else:
        assert first == second == 0


def test_inside_spark_workers_the_task_context_is_seen(spark):
    def probe(_rows):
        import gc

        from segstore.spark import worker_heap

        worker_heap.freeze_once()
        yield worker_heap.in_spark_task(), gc.get_freeze_count() > 0

    seen = spark.sparkContext.parallelize(range(4), 2).mapPartitions(probe).collect()
    assert seen == [(True, True)] * 2


@pytest.mark.parametrize("flag", ["true", "false"])
def test_writes_land_the_same_with_and_without_freezing(spark, tmp_path, flag):
    root = str(tmp_path / "store")
    with segstore.open(root) as store:
        store.create_topic("t", 3)
    df = spark.range(3000).selectExpr("cast(id as string) as key",
                                      "cast(cast(id as string) as binary) as value")
    (df.write.format("segstore").mode("append").option("topic", "t")
     .option("freezeWorkerHeap", flag).save(root))
    assert sum(end_offsets(root, "t").values()) == 3000
