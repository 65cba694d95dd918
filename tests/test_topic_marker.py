"""A lost topic metadata file is told from a Kafka log dir by the ``segstore.topic`` marker in
each partition directory: a topic that had a metadata file never silently reopens with the
default config (cleanup.policy=delete would let retention remove a compacted topic's data)."""

from __future__ import annotations

import os
import shutil

import pytest

import segstore
from segstore.cli import main
from segstore.errors import CorruptMetadataError
from segstore.topic import PARTITION_MARKER, discover_topics

from test_topic_damage import meta_file, run, two_topic_store

MARKER = PARTITION_MARKER


@pytest.fixture
def root(tmp_path):
    return two_topic_store(str(tmp_path / "s"))


def marker(root: str, topic: str, p: int) -> str:
    return os.path.join(root, f"{topic}-{p}", MARKER)


def test_created_partitions_carry_the_marker(root):
    for topic, n in (("orders", 1), ("events", 2)):
        for p in range(n):
            with open(marker(root, topic, p)) as f:
                assert f"topic={topic}\n" in f.read()


def test_a_missing_file_stops_a_writer_and_sets_the_topic_aside_for_a_reader(root):
    path = meta_file(root, "orders")
    os.unlink(path)
    with pytest.raises(CorruptMetadataError) as e:
        segstore.open(root)
    assert e.value.file == path and e.value.topic == "orders"
    assert e.value.reason.startswith("missing: ")
    assert "segstore topics --repair --topic orders" in str(e.value)
    assert "do not delete it" not in str(e.value)  # it is gone already
    with segstore.open(root, readonly=True) as s:
        assert s.list_topics() == ["events"]
        assert list(s.damaged_topics()) == ["orders"]
        with pytest.raises(CorruptMetadataError):
            s.partition("orders", 0)
        assert s.partition("events", 1).log_end_offset == 4


def test_verify_reports_it_and_repair_restores_the_topic(capsys, root):
    os.unlink(meta_file(root, "orders"))
    rc, out, err = run(capsys, "verify", "--path", root)
    assert rc == 1 and "orders:" in out and "missing:" in out
    rc, out, err = run(capsys, "topics", "--path", root, "--repair", "--topic", "orders",
                       "--partitions", "1", "--config", "cleanup.policy=compact")
    assert rc == 0, err
    assert not os.path.exists(meta_file(root, "orders") + ".damaged")  # nothing to keep
    with segstore.open(root) as s:
        assert s.topic_config("orders").cleanup_policy == ("compact",)
        assert [r.value for r in s.partition("orders", 0).read(0)] == [b"a", b"b", b"c"]


def test_a_kafka_log_dir_without_markers_still_opens_with_the_defaults(root):
    # A broker's partition directories carry no marker and need no metadata file.
    os.unlink(meta_file(root, "events"))
    for p in range(2):
        os.unlink(marker(root, "events", p))
    with segstore.open(root) as s:
        assert s.topic_config("events").cleanup_policy == ("delete",)
        assert s.partition("events", 1).log_end_offset == 4
    # No metadata file was written, so no marker either: the topic stays a log dir's.
    assert not os.path.exists(marker(root, "events", 0))


def test_a_writable_open_marks_the_topics_of_an_older_store(root):
    for p in range(2):
        os.unlink(marker(root, "events", p))
    os.unlink(marker(root, "orders", 0))
    segstore.open(root).close()
    assert all(os.path.exists(marker(root, t, p)) for t, p in
               (("orders", 0), ("events", 0), ("events", 1)))
    # From now on the loss of a file is noticed.
    os.unlink(meta_file(root, "events"))
    with pytest.raises(CorruptMetadataError, match="events.json: topic metadata missing"):
        segstore.open(root)


def test_a_config_change_to_a_log_dir_topic_marks_its_partitions(root):
    os.unlink(meta_file(root, "events"))
    for p in range(2):
        os.unlink(marker(root, "events", p))
    with segstore.open(root) as s:
        s.alter_topic_config("events", {"cleanup.policy": "compact"})
    assert os.path.exists(marker(root, "events", 1))
    os.unlink(meta_file(root, "events"))
    with pytest.raises(CorruptMetadataError, match="events.json: topic metadata missing"):
        segstore.open(root)


def test_a_partition_copied_without_its_metadata_is_refused(tmp_path, root):
    other = str(tmp_path / "other")
    segstore.open(other).close()
    shutil.copytree(os.path.join(root, "orders-0"), os.path.join(other, "orders-0"))
    with pytest.raises(CorruptMetadataError, match="or from the store the partition"):
        segstore.open(other)
    shutil.copyfile(meta_file(root, "orders"), meta_file(other, "orders"))
    with segstore.open(other) as s:
        assert s.topic_config("orders").cleanup_policy == ("compact",)


def test_a_file_written_between_the_two_listings_is_read(root, monkeypatch):
    # A reader lists the metadata files, then the partition directories; a writer creating a
    # topic in between writes its file first, so the reader finds it on a second look.
    import segstore.topic as topic_mod

    path = meta_file(root, "orders")
    saved = open(path).read()
    os.unlink(path)
    real = topic_mod.partition_dirs

    def late_file(r):
        with open(path, "w") as f:
            f.write(saved)
        return real(r)

    monkeypatch.setattr(topic_mod, "partition_dirs", late_file)
    topics, damaged = discover_topics(root, lambda o: o)
    assert damaged == {} and topics["orders"]["config"] == {"cleanup.policy": "compact"}


def test_delete_topic_then_reopen_leaves_no_trace(root):
    with segstore.open(root) as s:
        s.delete_topic("orders")
    with segstore.open(root) as s:
        assert s.list_topics() == ["events"]
        s.create_topic("orders", 2)
        assert os.path.exists(marker(root, "orders", 1))


def test_the_marker_is_not_a_stray_file(capsys, root):
    rc, out, err = run(capsys, "verify", "--path", root)
    assert rc == 0 and "no problems found" in out, out + err
    assert main(["log-dirs", "--path", root, "--describe"]) == 0
    with segstore.open(root) as s:
        assert s.partition("orders", 0).log_end_offset == 3
