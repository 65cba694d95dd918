"""Logs loaded at their first use (segstore/log_map.py): what a load that fails, or one that
runs while another thread changes the store, must not break for the other logs."""

from __future__ import annotations

import os
import threading

import pytest

import segstore
from segstore import log as log_mod
from segstore.errors import CorruptMetadataError
from segstore.log_map import LogMap
from segstore.records import TopicPartition as TP
from segstore.topic import PARTITION_MARKER, meta_path

from conftest import FakeClock


def _store(tmp_path, parts=3, topic_config=None, clock=None):
    path = str(tmp_path / "s")
    with segstore.open(path, clock=clock or FakeClock()) as s:
        s.create_topic("t", parts, topic_config)
        for p in range(parts):
            for i in range(10):
                s.partition("t", p).append(b"v%d-%d" % (p, i), key=b"k%d" % (i % 2))
    return path


def _failing_load(monkeypatch, names):
    """PartitionLogs of the directories in ``names`` fail to load (an I/O error); returns the
    directories of those loaded."""
    made = []
    real = log_mod.PartitionLog.__init__

    def init(self, directory, *args, **kwargs):
        if os.path.basename(directory) in names:
            raise OSError(5, "Input/output error")
        made.append(os.path.basename(directory))
        real(self, directory, *args, **kwargs)

    monkeypatch.setattr(log_mod.PartitionLog, "__init__", init)
    return made


def test_retention_goes_on_past_a_log_that_fails_to_load(tmp_path, monkeypatch):
    clock = FakeClock()
    path = _store(tmp_path, topic_config={"segment.bytes": 200}, clock=clock)
    _failing_load(monkeypatch, {"t-1"})
    with segstore.open(path, {"log.retention.bytes": 0}, clock=clock) as s:
        report = s.enforce_retention()
        assert "Input/output error" in report.errors[TP("t", 1)]
        assert sorted(report.partitions) == [TP("t", 0), TP("t", 2)]
        assert [s.partition("t", p).log_start_offset for p in (0, 2)] == [10, 10]


def test_the_cleaner_goes_on_past_a_log_that_fails_to_load(tmp_path, monkeypatch):
    clock = FakeClock()
    path = _store(tmp_path, topic_config={"cleanup.policy": "compact", "segment.bytes": 200},
                  clock=clock)
    _failing_load(monkeypatch, {"t-0"})
    with segstore.open(path, clock=clock) as s:
        assert s.cleaner.try_clean_filthiest_log(0)
        assert s.cleaner_manager.deletable_logs()   # the compacted logs' retention pass


def test_a_config_change_while_a_log_loads_reaches_it(tmp_path, monkeypatch):
    path = _store(tmp_path)
    real = log_mod.PartitionLog.__init__
    with segstore.open(path, clock=FakeClock()) as s:
        def init(self, directory, *args, **kwargs):
            real(self, directory, *args, **kwargs)
            # Another thread's alter_topic_config, between the load's read of the topic's
            # config and the log's entry in the map.
            if directory.endswith("t-2"):
                s.alter_topic_config("t", {"cleanup.policy": "compact"})

        monkeypatch.setattr(log_mod.PartitionLog, "__init__", init)
        assert s.partition("t", 2).config.compact


def test_a_log_loading_meanwhile_is_never_missing_from_the_map():
    m = LogMap("/nowhere")
    tp = TP("t", 0)
    m.defer(tp, lambda: "log", 0, 0)

    class Loaded(dict):
        def __contains__(self, key):
            found = dict.__contains__(self, key)
            if key == tp and tp in m._deferred:
                m[tp]   # another thread's first lookup, between the two dict lookups
            return found

    m._loaded = Loaded()
    assert tp in m


def test_deleting_a_topic_loads_none_of_its_logs(tmp_path, monkeypatch):
    path = _store(tmp_path)
    made = _failing_load(monkeypatch, {"t-1"})
    with segstore.open(path, clock=FakeClock()) as s:
        s.delete_topic("t")
        assert s.list_topics() == [] and s.cleaner_manager.state(TP("t", 1)) is None
    assert made == []
    assert not [n for n in os.listdir(path) if n.startswith("t-")]


def test_a_clean_writable_open_marks_an_older_store_whose_logs_it_never_loads(tmp_path):
    path = _store(tmp_path, parts=2)
    for p in range(2):   # written before the markers existed
        os.unlink(os.path.join(path, f"t-{p}", PARTITION_MARKER))
    segstore.open(path, clock=FakeClock()).close()   # no log looked up
    assert all(os.path.exists(os.path.join(path, f"t-{p}", PARTITION_MARKER))
               for p in range(2))
    # So the loss of the metadata file is noticed, not taken for a Kafka log dir's topic.
    os.unlink(meta_path(path, "t"))
    with pytest.raises(CorruptMetadataError, match="topic metadata missing"):
        segstore.open(path, clock=FakeClock())


def test_verify_reports_a_log_that_fails_to_load_and_checks_the_others(tmp_path, monkeypatch):
    """verify() is a report: one partition that cannot load is a Problem naming its directory
    and the error, not an exception that hides what the other partitions hold."""
    path = _store(tmp_path)
    seg = os.path.join(path, "t-2", "00000000000000000000.log")
    with open(seg, "r+b") as f:   # a CRC the full check must still find in t-2
        f.seek(70)
        b = f.read(1)
        f.seek(70)
        f.write(bytes([b[0] ^ 0xFF]))
    _failing_load(monkeypatch, {"t-1"})
    with segstore.open(path) as s:
        problems = s.verify()
    dirs = [os.path.relpath(p.file, path).split(os.sep)[0] for p in problems]
    assert dirs[0] == "t-1" and len(problems) >= 2, problems
    assert problems[0].position == -1
    assert "cannot load t-1" in problems[0].message
    assert "OSError" in problems[0].message and "Input/output error" in problems[0].message
    assert set(dirs[1:]) == {"t-2"}


def test_metrics_count_a_log_that_fails_to_load_as_offline(tmp_path, monkeypatch):
    path = _store(tmp_path)
    with segstore.open(path) as s:
        sizes = {p: s.partition("t", p).size_bytes for p in range(3)}
        assert s.metrics()["OfflineReplicaCount"] == 0
    _failing_load(monkeypatch, {"t-0"})
    with segstore.open(path) as s:
        m = s.metrics()
        assert m["partitions"] == 3 and m["OfflineReplicaCount"] == 1
        assert m["size-bytes"] == sizes[1] + sizes[2] and m["segments"] == 2
        monkeypatch.undo()   # the disk is back: the next lookup loads it
        m = s.metrics()
        assert m["OfflineReplicaCount"] == 0 and m["size-bytes"] == sum(sizes.values())


@pytest.mark.parametrize("pass_name", ["grab_filthiest_compacted_log", "deletable_logs"])
def test_a_cleaner_pass_loads_logs_without_holding_the_managers_lock(tmp_path, monkeypatch,
                                                                     pass_name):
    """The first pass after an open loads every compacted log; pausing, aborting or asking a
    partition's state (the manager's lock) must not wait for all those loads."""
    path = _store(tmp_path, topic_config={"cleanup.policy": "compact"})
    entered, release = threading.Event(), threading.Event()
    real = log_mod.PartitionLog.__init__

    def slow_init(self, directory, *args, **kwargs):
        if os.path.basename(directory) == "t-1":
            entered.set()
            assert release.wait(30)
        real(self, directory, *args, **kwargs)

    with segstore.open(path) as s:
        monkeypatch.setattr(log_mod.PartitionLog, "__init__", slow_init)
        manager = s.cleaner_manager
        result = []
        cleaner_pass = threading.Thread(
            target=lambda: result.append(getattr(manager, pass_name)()))
        cleaner_pass.start()
        try:
            assert entered.wait(30)
            asked = threading.Thread(target=lambda: result.append(manager.state(TP("t", 0))))
            asked.start()
            asked.join(5)
            assert not asked.is_alive(), "the manager's lock was held during a log's load"
            assert result == [None]
        finally:
            release.set()
            cleaner_pass.join(30)
        assert not cleaner_pass.is_alive()
        if pass_name == "deletable_logs":
            assert sorted(tp for tp, _ in result[1]) == [TP("t", p) for p in range(3)]
            manager.done_deleting([tp for tp, _ in result[1]])


def test_a_retention_pass_leaves_out_logs_whose_topic_went_after_the_listing(tmp_path,
                                                                            monkeypatch):
    """deletable_logs lists (and loads) the logs before it takes the manager's lock; a topic
    deleted in between must not have its closed logs marked InProgress."""
    path = _store(tmp_path, topic_config={"cleanup.policy": "compact"})
    with segstore.open(path) as s:
        manager = s.cleaner_manager
        listed = manager._each_log()
        s.delete_topic("t")
        monkeypatch.setattr(manager, "_each_log", lambda: listed)
        assert manager.deletable_logs() == []
        assert [manager.state(TP("t", p)) for p in range(3)] == [None] * 3
