"""After a clean shutdown a writable open loads each log at its first use (segstore/log_map.py).

What must not change: checkpoints keep the offsets of logs never loaded, config changes and
topic deletion reach them, retention and compaction still cover them, a crash after such an
open recovers every log, a failed load is retried, and two threads loading one log get one.
"""

from __future__ import annotations

import os
import threading

import pytest

import segstore
from segstore import log as log_mod
from segstore.checkpoint import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT,
                                 RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile)
from segstore.errors import StoreClosedError
from segstore.log_map import LogMap
from segstore.records import TopicPartition as TP

from conftest import FakeClock


def _loads(monkeypatch):
    """Record the directories of the PartitionLogs created from now on."""
    made = []
    real = log_mod.PartitionLog.__init__

    def init(self, directory, *args, **kwargs):
        made.append(os.path.basename(directory))
        real(self, directory, *args, **kwargs)

    monkeypatch.setattr(log_mod.PartitionLog, "__init__", init)
    return made


def _checkpoints(path):
    return (OffsetCheckpointFile(os.path.join(path, RECOVERY_POINT_CHECKPOINT)).read(),
            OffsetCheckpointFile(os.path.join(path, LOG_START_OFFSET_CHECKPOINT)).read())


def _store(tmp_path, parts=4, topic_config=None, clock=None):
    path = str(tmp_path / "s")
    with segstore.open(path, clock=clock or FakeClock()) as s:
        s.create_topic("t", parts, topic_config)
        for p in range(parts):
            s.partition("t", p).append_batch([b"v%d-%d" % (p, i) for i in range(10)],
                                             keys=[b"k%d" % (i % 3) for i in range(10)])
        if parts > 1:
            s.partition("t", 1).delete_records(4)   # a log start above the first segment
    return path


def test_checkpoints_keep_the_offsets_of_logs_never_loaded(tmp_path, monkeypatch):
    path = _store(tmp_path)
    before = _checkpoints(path)
    assert before[1][TP("t", 1)] == 4
    made = _loads(monkeypatch)
    with segstore.open(path, clock=FakeClock()) as s:
        s.partition("t", 0).append_batch([b"more"])
        s.write_checkpoints()
        mid = _checkpoints(path)
    assert made == ["t-0"]
    after = _checkpoints(path)
    for cps in (mid, after):
        assert {tp: v for tp, v in cps[0].items() if tp != TP("t", 0)} == \
            {tp: v for tp, v in before[0].items() if tp != TP("t", 0)}
        assert cps[1] == before[1]
    assert after[0][TP("t", 0)] == 11
    assert os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    monkeypatch.undo()
    with segstore.open(path, clock=FakeClock()) as s:
        assert s.partition("t", 1).log_start_offset == 4
        assert [r.value for r in s.partition("t", 1).read(4)][:1] == [b"v1-4"]


def test_a_config_change_reaches_a_log_loaded_later(tmp_path):
    path = _store(tmp_path)
    with segstore.open(path, clock=FakeClock()) as s:
        s.alter_topic_config("t", {"segment.bytes": 100_000, "cleanup.policy": "compact"})
        lg = s.partition("t", 3)
        assert lg.config.segment_bytes == 100_000 and lg.config.compact


def test_deleting_a_topic_whose_logs_were_never_loaded(tmp_path):
    path = _store(tmp_path)
    with segstore.open(path, clock=FakeClock()) as s:
        s.delete_topic("t")
        assert s.list_topics() == []
    assert not [n for n in os.listdir(path) if n.startswith("t-")]
    with segstore.open(path, clock=FakeClock()) as s:
        assert s.list_topics() == []
        s.create_topic("t", 1)
        assert s.partition("t", 0).log_end_offset == 0


def test_retention_covers_logs_not_loaded_yet(tmp_path):
    clock = FakeClock()
    path = _store(tmp_path, topic_config={"segment.bytes": 200}, clock=clock)
    with segstore.open(path, {"log.retention.bytes": 0}, clock=clock) as s:
        report = s.enforce_retention()
        assert sorted(report.partitions) == [TP("t", p) for p in range(4)]
        assert all(s.partition("t", p).log_start_offset == 10 for p in range(4))


def test_compaction_of_every_topic_loads_only_compacted_logs(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    with segstore.open(path, clock=FakeClock()) as s:
        s.create_topic("plain", 3)
        s.create_topic("table", 2, {"cleanup.policy": "compact", "segment.bytes": 300})
        for p in range(2):
            for i in range(20):
                s.partition("table", p).append(b"v%d" % i, key=b"k%d" % (i % 2))
    made = _loads(monkeypatch)
    with segstore.open(path, clock=FakeClock()) as s:
        stats = s.compact(force=True)
        assert stats and sorted(made) == ["table-0", "table-1"]
        assert sorted({r.key: r.value for r in s.partition("table", 0).read(0)}.items()) == \
            [(b"k0", b"v18"), (b"k1", b"v19")]


def test_a_crash_after_a_lazy_open_recovers_every_log(tmp_path):
    path = _store(tmp_path)
    s = segstore.open(path, clock=FakeClock())
    s.partition("t", 2).append_batch([b"unflushed"])
    # No close: the process dies. The marker went at the open, so the next one recovers all.
    s._file_lock.release()
    assert not os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    with segstore.open(path, clock=FakeClock()) as s2:
        assert [s2.partition("t", p).log_end_offset for p in range(4)] in (
            [10, 10, 11, 10], [10, 10, 10, 10])
        assert s2.partition("t", 1).log_start_offset == 4
        assert [r.value for r in s2.partition("t", 3).read(0)] == \
            [b"v3-%d" % i for i in range(10)]


def test_a_failed_load_is_raised_at_the_lookup_and_retried(tmp_path, monkeypatch):
    path = _store(tmp_path)
    real = log_mod.PartitionLog.__init__
    failing = {"t-1"}

    def init(self, directory, *args, **kwargs):
        if os.path.basename(directory) in failing:
            raise OSError(24, "Too many open files")
        real(self, directory, *args, **kwargs)

    monkeypatch.setattr(log_mod.PartitionLog, "__init__", init)
    with segstore.open(path, clock=FakeClock()) as s:
        with pytest.raises(OSError, match="Too many open files"):
            s.partition("t", 1)
        assert s.partition("t", 0).log_end_offset == 10
        failing.clear()
        assert s.partition("t", 1).log_start_offset == 4
    assert _checkpoints(path)[1][TP("t", 1)] == 4


def test_a_failed_load_keeps_the_checkpointed_offsets_at_close(tmp_path, monkeypatch):
    path = _store(tmp_path)
    before = _checkpoints(path)
    real = log_mod.PartitionLog.__init__

    def init(self, directory, *args, **kwargs):
        if directory.endswith("t-1"):
            raise OSError(5, "Input/output error")
        real(self, directory, *args, **kwargs)

    monkeypatch.setattr(log_mod.PartitionLog, "__init__", init)
    with segstore.open(path, clock=FakeClock()) as s:
        with pytest.raises(OSError):
            s.partition("t", 1)
    assert _checkpoints(path) == before


def test_two_threads_looking_up_one_log_get_the_same_one(tmp_path, monkeypatch):
    path = _store(tmp_path, parts=1)
    made = _loads(monkeypatch)
    with segstore.open(path, clock=FakeClock()) as s:
        got, barrier = [], threading.Barrier(4)

        def lookup():
            barrier.wait()
            got.append(s.partition("t", 0))

        threads = [threading.Thread(target=lookup) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and all(lg is got[0] for lg in got)
        assert made == ["t-0"]


def test_the_map_loads_nothing_once_frozen():
    m = LogMap("/nowhere")
    m.defer(TP("t", 0), lambda: pytest.fail("loaded after the close"), 3, 1)
    m.add(TP("t", 1), "log")
    m.freeze()
    assert TP("t", 0) in m and len(m) == 2 and list(m) == [TP("t", 1), TP("t", 0)]
    with pytest.raises(StoreClosedError):
        m[TP("t", 0)]
    assert m.checkpoint_offsets() == ({TP("t", 1): "log"}, {TP("t", 0): 3}, {TP("t", 0): 1})
    with pytest.raises(KeyError):
        m[TP("t", 2)]


def test_a_log_missing_from_the_recovery_checkpoint_loads_at_the_open(tmp_path, monkeypatch):
    # Deferred, it would write recovery point 0 back, and a crash later in the session would
    # recover the whole log; loaded, its recovery point is its log end, as before.
    path = _store(tmp_path)
    ck = os.path.join(path, RECOVERY_POINT_CHECKPOINT)
    OffsetCheckpointFile(ck).write({tp: off for tp, off in OffsetCheckpointFile(ck).read().items()
                                    if tp != TP("t", 2)})
    made = _loads(monkeypatch)
    with segstore.open(path, clock=FakeClock()):
        assert made == ["t-2"]
    assert _checkpoints(path)[0] == {TP("t", p): 10 for p in range(4)}


def test_cleaner_threads_load_only_compacted_topics_logs(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    clock = FakeClock()
    with segstore.open(path, clock=clock) as s:
        s.create_topic("plain", 3)
        s.create_topic("table", 2, {"cleanup.policy": "compact"})
        for name in ("plain", "table"):
            for p in s.partitions_for(name):
                s.partition(name, p).append_batch([b"v"], keys=[b"k"])
    made = _loads(monkeypatch)
    with segstore.open(path, clock=clock) as s:
        s.cleaner.try_clean_filthiest_log(0)   # a cleaner thread's pass (and its retention)
        assert sorted(made) == ["table-0", "table-1"]
