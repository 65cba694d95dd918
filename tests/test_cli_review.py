"""The ``segstore`` command on bad input: exit codes, one-line errors and no tracebacks.

Each test is a problem found by running the command as a user would (a mistyped path, a corrupt
metadata file, an out-of-range option, a closed pipe). The command runs in a subprocess with
``sys.executable -m segstore`` where the traceback or the exit status of the interpreter itself is
what is being checked, and through ``main(argv)`` otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import segstore
from segstore.cli import main

TS = 1_700_000_000_000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(segstore.__file__)))


def run(capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of ``main(argv)``."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_process(*argv, stdout=subprocess.PIPE, cwd=None) -> subprocess.CompletedProcess:
    """``python -m segstore argv`` with this checkout's segstore and Python's default (block)
    buffering of a piped stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "segstore", *map(str, argv)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)


def files_under(root) -> set:
    return {os.path.relpath(os.path.join(d, f), root)
            for d, dirs, files in os.walk(root) for f in files + dirs}


@pytest.fixture
def store(tmp_path):
    """Topic ``t`` (delete, 2 partitions) with ten records in partition 0, topic ``c``
    (compacted) with 30 updates of 5 keys over small segments."""
    root = tmp_path / "store"
    with segstore.open(str(root)) as st:
        st.create_topic("t", 2, config={"segment.bytes": 300})
        for i in range(5):
            st.partition("t", 0).append_batch([b"v%d" % i, b"w"], keys=[b"k%d" % i, b"k"],
                                              timestamps_ms=TS + i)
        st.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 300})
        for i in range(30):
            st.partition("c", 0).append_batch([b"v%d" % i], keys=[b"k%d" % (i % 5)],
                                              timestamps_ms=TS + i)
    return root


@pytest.fixture
def not_a_store(tmp_path):
    """A directory that is neither a segstore store nor a Kafka log dir, though it has a
    ``<name>-<n>`` directory (as /etc has dbus-1)."""
    root = tmp_path / "home"
    (root / "notes-1").mkdir(parents=True)
    (root / "notes-1" / "todo.txt").write_text("buy milk\n")
    (root / "readme.txt").write_text("hello\n")
    return root


# -- a directory that is not a store ----------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["retention"], ["compact"], ["compact", "--force"], ["recover"], ["recover", "--full"],
    ["configs", "--alter", "--topic", "notes", "--add-config", "retention.ms=1"],
    ["topics", "--delete", "--topic", "notes"]])
def test_writing_commands_leave_a_non_store_directory_alone(capsys, not_a_store, argv):
    before = files_under(not_a_store)
    rc, out, err = run(capsys, *argv, "--path", not_a_store)
    assert files_under(not_a_store) == before  # no .segstore, .lock, checkpoints or notes-0
    assert rc == 1 and out == ""
    assert err == (f"segstore {argv[0]}: error: {not_a_store} is not a segstore store or a "
                   "Kafka log dir\n")


@pytest.mark.parametrize("argv", [
    ["verify"], ["topics", "--list"], ["describe"], ["log-dirs", "--describe"],
    ["retention", "--dry-run"], ["configs", "--describe"]])
def test_reading_commands_refuse_a_non_store_directory(capsys, not_a_store, argv):
    rc, out, err = run(capsys, *argv, "--path", not_a_store)
    assert (rc, out) == (1, "")
    assert err.endswith("is not a segstore store or a Kafka log dir\n")
    rc, out, err = run(capsys, "plan-cleaner", "--store", not_a_store, "--topic", "notes")
    assert (rc, out) == (1, "") and "is not a segstore store" in err


def test_an_empty_directory_is_not_a_store_but_topics_create_makes_one(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run(capsys, "verify", "--path", empty)
    assert rc == 1 and "is not a segstore store or a Kafka log dir" in err
    assert os.listdir(empty) == []
    rc, out, _ = run(capsys, "topics", "--create", "--path", empty, "--topic", "a")
    assert rc == 0 and out == "Created topic a.\n"
    assert run(capsys, "topics", "--list", "--path", empty)[:2] == (0, "a\n")


def test_kafka_log_dirs_still_open(capsys, tmp_path, store):
    # A broker's log dir has no .segstore: its <topic>-<n> directories hold .log files, or it
    # has Kafka's checkpoint files.
    kafka = tmp_path / "kafka-logs"
    (kafka / "orders-0").mkdir(parents=True)
    (kafka / "orders-0" / "00000000000000000000.log").write_bytes(b"")
    assert run(capsys, "topics", "--list", "--path", kafka)[:2] == (0, "orders\n")
    fresh = tmp_path / "fresh-broker"
    fresh.mkdir()
    (fresh / "meta.properties").write_text("version=1\n")
    assert run(capsys, "verify", "--path", fresh)[0] == 0


def test_a_file_as_path_says_not_a_directory(capsys, tmp_path):
    f = tmp_path / "data.txt"
    f.write_text("x")
    rc, _, err = run(capsys, "verify", "--path", f)
    assert rc == 1 and err == f"segstore verify: error: {f}: not a directory\n"


# -- empty arguments --------------------------------------------------------------------------

def test_empty_path_is_a_usage_error_and_creates_nothing(tmp_path):
    # --path "$UNSET_VARIABLE" used to make the working directory a store.
    p = run_process("topics", "--create", "--path", "", "--topic", "x", cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("segstore topics: error: argument --path/--store: "
                               "must not be empty")
    assert os.listdir(tmp_path) == []
    p = run_process("verify", "--path", "", cwd=tmp_path)
    assert p.returncode == 2 and "must not be empty" in p.stderr


@pytest.mark.parametrize("files", ["", ",", " , "])
def test_dump_log_with_no_file_is_a_usage_error(capsys, files):
    rc, out, err = run(capsys, "dump-log", "--files", files)
    assert (rc, out) == (2, "")
    assert "argument --files: names no file" in err and err.count("\n") == 1


# -- corrupt topic metadata -------------------------------------------------------------------

@pytest.mark.parametrize("damage, reason", [
    (lambda text: b"\x84" + text[1:], "not UTF-8"),
    (lambda text: text[:-5], "not JSON"),
    (lambda text: text.replace(b'"partitions"', b'"parts"'), "no 'partitions'"),
    (lambda text: text.replace(b'"partitions": 2', b'"partitions": "two"'), "partitions"),
])
@pytest.mark.parametrize("argv", [["retention"], ["compact"], ["recover"]])
def test_corrupt_topic_metadata_is_one_line_naming_the_file(store, damage, reason, argv):
    # Commands that write refuse the store in one line naming the file, the reason, the fix.
    meta = store / ".segstore" / "topics" / "t.json"
    meta.write_bytes(damage(meta.read_bytes()))
    p = run_process(*argv, "--path", store)
    assert "Traceback" not in p.stderr
    assert (p.returncode, p.stdout) == (1, "")
    assert p.stderr.count("\n") == 1
    assert p.stderr.startswith(f"segstore {argv[0]}: error: {meta}: corrupt topic metadata")
    assert reason in p.stderr and "topics --repair" in p.stderr


@pytest.mark.parametrize("damage, reason", [
    (lambda text: text[:-5], "not JSON"),
    (lambda text: text.replace(b'"partitions": 2', b'"partitions": "two"'), "partitions"),
])
@pytest.mark.parametrize("argv, healthy", [
    (["topics", "--list"], "c\n"), (["verify"], "verified 1 partition ("),
    (["retention", "--dry-run"], "of 1 partitions"), (["compact", "--dry-run"], " c-0: "),
    (["describe"], "c-0\n")])
def test_commands_that_read_go_on_past_corrupt_topic_metadata(store, damage, reason, argv,
                                                               healthy):
    # The other topic is read; the damaged one is named on stderr and the exit status is 1.
    meta = store / ".segstore" / "topics" / "t.json"
    meta.write_bytes(damage(meta.read_bytes()))
    p = run_process(*argv, "--path", store)
    assert "Traceback" not in p.stderr
    assert p.returncode == 1
    assert f"{meta}: corrupt topic metadata" in p.stderr and reason in p.stderr
    assert healthy in p.stdout


def test_an_unexpected_error_is_one_line_exit_1(capsys, store, monkeypatch):
    # Whatever slips past the typed errors still reaches the user as one line.
    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(segstore.store.LogStore, "list_topics", boom)
    rc, out, err = run(capsys, "topics", "--list", "--path", store)
    assert (rc, out) == (1, "")
    assert err == ("segstore topics: error: unexpected ZeroDivisionError: division by zero "
                   "(set SEGSTORE_DEBUG=1 for the traceback)\n")
    monkeypatch.setenv("SEGSTORE_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["topics", "--list", "--path", str(store)])


# -- --now-ms ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ("99999999999999999999999", "must be at most 9223372036854775807"),
    ("9223372036854775808", "must be at most 9223372036854775807"),
    ("-1", "must not be negative"),
    ("soon", "not a whole number"),
])
@pytest.mark.parametrize("argv", [["compact", "--force"], ["compact", "--dry-run"],
                                  ["describe"], ["retention"], ["retention", "--dry-run"]])
def test_now_ms_out_of_range_is_a_usage_error(store, argv, value, message):
    p = run_process(*argv, "--path", store, f"--now-ms={value}")
    assert "Traceback" not in p.stderr
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr.startswith(f"segstore {argv[0]}: error: argument --now-ms: {message}")
    assert p.stderr.count("\n") == 1


def test_now_ms_at_the_int64_limit_works(capsys, store):
    rc, out, err = run(capsys, "compact", "--path", store, "--force", "--now-ms",
                       2 ** 63 - 1, "--json")
    assert (rc, err) == (0, "")
    assert [c["topic"] for c in json.loads(out)["cleaned"]] == ["c"]


# -- a closed pipe ----------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["topics", "--list", "--path", "{store}"],
                                  ["verify", "--path", "{store}", "--json"],
                                  ["plan-cleaner", "--unique-keys", "10"],
                                  ["--version"], ["verify", "--help"]])
def test_a_reader_that_went_away_gets_no_traceback(store, argv):
    # `segstore ... | true`: the reader is gone before the (buffered) output is flushed.
    r, w = os.pipe()
    os.close(r)
    try:
        p = run_process(*[a.format(store=store) for a in argv], stdout=w)
    finally:
        os.close(w)
    assert p.stderr == ""
    assert p.returncode == 1


# -- compact --dry-run ------------------------------------------------------------------------

def test_compact_dry_run_refuses_a_non_compacted_topic_like_compact(capsys, store):
    for extra in ([], ["--dry-run"], ["--dry-run", "--json"]):
        rc, out, err = run(capsys, "compact", "--path", store, "--topic", "t", *extra)
        assert (rc, out) == (1, ""), extra
        assert err == "segstore compact: error: topic 't' is not compacted (cleanup.policy " \
                      "delete)\n"


# -- a locked store ---------------------------------------------------------------------------

def test_locked_store_message_speaks_to_a_command_line_user(capsys, store):
    with segstore.open(str(store)):
        for argv in (["retention"], ["compact"], ["topics", "--delete", "--topic", "t"]):
            rc, out, err = run(capsys, *argv, "--path", store)
            assert (rc, out) == (1, "")
            assert err == (f"segstore {argv[0]}: error: {store} is locked by another writer "
                           f"(pid {os.getpid()}); stop it first (commands that only read work "
                           "beside it)\n")
            assert "readonly=True" not in err


# -- repeated warnings ------------------------------------------------------------------------

def test_a_warning_is_printed_once(capsys, store):
    # A damaged checkpoint is read at every reload of a read-only store: say so once.
    cp = store / "recovery-point-offset-checkpoint"
    cp.write_bytes(b"\xff" + cp.read_bytes()[1:])
    p = run_process("topics", "--describe", "--path", store)
    assert p.returncode == 0
    lines = p.stderr.splitlines()
    assert lines and all(line.startswith("segstore: warning: ") for line in lines)
    assert len(lines) == len(set(lines)) == 1
