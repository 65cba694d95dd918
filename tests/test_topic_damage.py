"""A damaged topic metadata file (``.segstore/topics/<topic>.json``): a writer refuses the
store, naming the file, the reason and the fix; a reader and the commands that only read set
the topic aside and go on with the others; ``segstore topics --repair`` rewrites the file."""

from __future__ import annotations

import json
import os
import re

import pytest

import segstore
from segstore.cli import main
from segstore.errors import (CorruptMetadataError, InvalidConfigError,
                             InvalidTopicMetadataConfigError)

TS = 1_700_000_000_000


@pytest.fixture
def root(tmp_path):
    return two_topic_store(str(tmp_path / "s"))


def two_topic_store(path: str) -> str:
    """Topic ``orders`` (compacted, 1 partition, 3 records) and topic ``events`` (delete, 2
    partitions, 4 records in partition 1)."""
    with segstore.open(path, clock=lambda: TS) as s:
        s.create_topic("orders", 1, config={"cleanup.policy": "compact"})
        s.partition("orders", 0).append_batch([b"a", b"b", b"c"], keys=[b"1", b"2", b"1"])
        s.create_topic("events", 2)
        s.partition("events", 1).append_batch([b"e%d" % i for i in range(4)])
    return path


def meta_file(root: str, topic: str) -> str:
    return os.path.join(root, ".segstore", "topics", f"{topic}.json")


def damage(root: str, topic: str = "orders", text: str = '{"name": "orders", "partit') -> str:
    path = meta_file(root, topic)
    with open(path, "w") as f:
        f.write(text)
    return path


def run(capsys, *argv) -> tuple:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# -- the API -----------------------------------------------------------------------------------

def test_a_writable_open_names_the_file_the_reason_and_the_fix(root):
    path = damage(root)
    with pytest.raises(CorruptMetadataError) as e:
        segstore.open(root)
    text = str(e.value)
    assert text.startswith(f"{path}: corrupt topic metadata (not JSON: ")
    assert f"cannot open {root} for writing" in text
    assert "restore" in text and "segstore topics --repair --topic orders" in text
    assert "do not delete it" in text
    assert (e.value.file, e.value.topic) == (path, "orders")
    assert e.value.reason.startswith("not JSON")
    # The refused open changed nothing: the lock is free and the last shutdown still counts
    # as clean (no recovery of every log once the file is repaired).
    assert os.path.exists(os.path.join(root, ".kafka_cleanshutdown"))
    with pytest.raises(CorruptMetadataError):
        segstore.open(root)


def test_a_writable_open_names_every_damaged_file(root):
    first, second = damage(root, "events", "[]"), damage(root)
    with pytest.raises(CorruptMetadataError, match=re.escape(first)) as e:
        segstore.open(root)
    assert f"also damaged: {second}" in str(e.value)


def test_a_read_only_open_sets_the_damaged_topic_aside(root):
    path = damage(root)
    with segstore.open(root, readonly=True) as reader:
        assert reader.list_topics() == ["events"]
        assert [r.value for r in reader.partition("events", 1).read(0)] == \
            [b"e0", b"e1", b"e2", b"e3"]
        damaged = reader.damaged_topics()
        assert list(damaged) == ["orders"] and damaged["orders"].file == path
        # Every way in raises the typed error naming the file and the fix; none guesses the
        # config (a default would be cleanup.policy=delete) from the partition directory.
        for use in (lambda: reader.partition("orders", 0), lambda: reader.topic_config("orders"),
                    lambda: reader.describe_topic("orders"),
                    lambda: reader.partitions_for("orders"),
                    lambda: reader.end_offsets([("orders", 0)])):
            with pytest.raises(CorruptMetadataError, match=re.escape(path)) as e:
                use()
            assert "set aside" in str(e.value) and "--repair" in str(e.value)
        problems = reader.verify()
        assert [(p.file, p.position) for p in problems] == [(path, -1)]
        assert "not JSON" in problems[0].message


def test_a_reader_sees_damage_and_repair_after_it_opened(root):
    with segstore.open(root, readonly=True) as reader:
        assert reader.list_topics() == ["events", "orders"]
        with open(meta_file(root, "orders")) as f:
            good = f.read()
        damage(root)
        assert reader.list_topics() == ["events"]
        with pytest.raises(CorruptMetadataError):
            reader.partition("orders", 0)
        with open(meta_file(root, "orders"), "w") as f:
            f.write(good)
        assert reader.partition("orders", 0).log_end_offset == 3
        assert reader.damaged_topics() == {}


def test_config_overrides_the_store_rejects_are_damage_too(root):
    # Both error types: callers catching InvalidConfigError (as before) still do.
    meta = json.load(open(meta_file(root, "orders")))
    meta["config"]["segment.bytes"] = "many"
    path = damage(root, text=json.dumps(meta))
    with pytest.raises(InvalidTopicMetadataConfigError, match=re.escape(path) + ".*segment.bytes"):
        segstore.open(root)
    assert issubclass(InvalidTopicMetadataConfigError, InvalidConfigError)
    with segstore.open(root, readonly=True) as reader:
        assert reader.list_topics() == ["events"]
        with pytest.raises(CorruptMetadataError, match="segment.bytes"):
            reader.topic_config("orders")


def test_a_file_naming_another_topic_is_damaged(root):
    # orders.json claiming to be "events" would give events orders' partition count and config.
    meta = json.load(open(meta_file(root, "orders")))
    path = damage(root, text=json.dumps({**meta, "name": "events"}))
    with segstore.open(root, readonly=True) as reader:
        assert reader.list_topics() == ["events"]
        assert reader.num_partitions("events") == 2
        assert "named for topic \"orders\"" in str(reader.damaged_topics()["orders"])
        assert reader.damaged_topics()["orders"].file == path


# -- the command -------------------------------------------------------------------------------

def test_verify_reports_the_damaged_file_and_checks_the_rest(capsys, caplog, root):
    path = damage(root)
    rc, out, err = run(capsys, "verify", "--path", root)
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"orders: {path}: damaged topic metadata (not JSON: ")
    assert "topics --repair --topic orders" in lines[0]
    assert lines[-1].startswith("verified 2 partitions (")
    assert lines[-1].endswith("(1 topic not read: damaged metadata): 1 problem found")
    assert path in caplog.text  # the open's warning (on stderr when run as a command)
    rc, out, _ = run(capsys, "verify", "--path", root, "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["problems"] == 1 and len(doc["partitions"]) == 2
    [finding] = doc["damaged_topics"]
    assert (finding["topic"], finding["file"]) == ("orders", path)
    assert finding["reason"].startswith("not JSON")
    # Named, it is still a finding; the healthy topic alone verifies clean.
    assert run(capsys, "verify", "--path", root, "--topic", "orders")[0] == 1
    assert run(capsys, "verify", "--path", root, "--topic", "events")[0] == 0


def test_verify_does_not_call_the_damaged_topics_directories_strays(capsys, root):
    damage(root)
    rc, out, _ = run(capsys, "verify", "--path", root)
    assert "named like a partition directory" not in out and rc == 1


def test_describe_goes_on_with_the_healthy_topics(capsys, caplog, root):
    path = damage(root)
    rc, out, err = run(capsys, "describe", "--path", root)
    assert rc == 1
    assert "events-0" in out and "events-1" in out and "orders" not in out
    assert path in caplog.text and "not JSON" in caplog.text
    rc, out, err = run(capsys, "describe", "--path", root, "--topic", "orders")
    assert (rc, out) == (1, "")
    assert err.splitlines()[-1].startswith(
        f"segstore describe: error: topic 'orders' is set aside, its metadata is damaged: {path}")
    assert run(capsys, "describe", "--path", root, "--topic", "events")[0] == 0


def test_topics_list_and_describe(capsys, root):
    path = damage(root)
    assert run(capsys, "topics", "--list", "--path", root)[:2] == (1, "events\n")
    rc, out, err = run(capsys, "topics", "--describe", "--path", root, "--topic", "orders",
                       "--if-exists")
    assert rc == 1 and path in err  # it exists: --if-exists does not hide the damage
    assert run(capsys, "topics", "--describe", "--path", root, "--topic", "events")[0] == 0
    rc, out, _ = run(capsys, "log-dirs", "--describe", "--path", root)
    assert rc == 1 and "events-1" in out


def test_commands_that_write_refuse(capsys, root):
    path = damage(root)
    for argv in (["compact"], ["retention"], ["configs", "--alter", "--topic", "events",
                                              "--add-config", "retention.ms=1"]):
        rc, out, err = run(capsys, *argv, "--path", root)
        assert (rc, out) == (1, "")
        assert f"{path}: corrupt topic metadata (not JSON" in err and "--repair" in err


# -- topics --repair ---------------------------------------------------------------------------

def test_repair_rewrites_the_file_and_the_writer_opens_again(capsys, root):
    path = damage(root)
    rc, out, err = run(capsys, "topics", "--repair", "--topic", "orders", "--partitions", "1",
                       "--config", "cleanup.policy=compact", "--path", root)
    assert (rc, err) == (0, "")
    assert out == f"Rewrote {path}: topic orders, 1 partitions, config cleanup.policy=compact.\n"
    assert open(path + ".damaged").read() == '{"name": "orders", "partit'
    with segstore.open(root, clock=lambda: TS) as s:
        assert s.topic_config("orders").cleanup_policy == ("compact",)
        assert s.partition("orders", 0).log_end_offset == 3
    assert run(capsys, "verify", "--path", root)[0] == 0


@pytest.mark.parametrize("argv, message", [
    (["--partitions", "1"], "--repair needs --config cleanup.policy="),
    (["--config", "cleanup.policy=compact"], "--repair needs --partitions"),
])
def test_repair_guesses_nothing(capsys, root, argv, message):
    path = damage(root)
    rc, _, err = run(capsys, "topics", "--repair", "--topic", "orders", *argv, "--path", root)
    assert rc == 2 and message in err
    assert open(path).read() == '{"name": "orders", "partit'


def test_repair_refuses_a_sound_file_too_few_partitions_and_a_live_writer(capsys, root):
    rc, _, err = run(capsys, "topics", "--repair", "--topic", "events", "--partitions", "2",
                     "--config", "cleanup.policy=delete", "--path", root)
    assert rc == 1 and "is not damaged" in err and "configs --alter" in err
    damage(root, "events", "[]")
    rc, _, err = run(capsys, "topics", "--repair", "--topic", "events", "--partitions", "1",
                     "--config", "cleanup.policy=delete", "--path", root)
    assert rc == 1 and "holds partition events-1: --partitions must be at least 2" in err
    rc, _, err = run(capsys, "topics", "--repair", "--topic", "nope", "--partitions", "1",
                     "--config", "cleanup.policy=delete", "--path", root)
    assert rc == 1 and "no topic 'nope'" in err


def test_repair_waits_for_the_writer_lock(capsys, root):
    with segstore.open(root, clock=lambda: TS):  # opened before the damage
        damage(root)
        rc, _, err = run(capsys, "topics", "--repair", "--topic", "orders", "--partitions", "1",
                         "--config", "cleanup.policy=compact", "--path", root)
        assert rc == 1 and "locked by another writer" in err
