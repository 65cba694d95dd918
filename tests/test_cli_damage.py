"""The ``segstore`` command on damaged stores: what the cleaner commands say about a partition
whose cleaning would fail, and that each says what the real operation does.

Oracles: the damage is made here with ``struct`` at batch positions found by walking the size
fields (conftest's ``batch_spans``), and a dry run or plan is checked against the real
``compact`` run on a copy of the same store: the partitions it says would fail are the ones
the real run fails on, at the same file and position, and the others are cleaned or skipped as
it said.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

import segstore
from segstore.cli import main

TS = 1_700_000_000_000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(segstore.__file__)))


def _shared_helpers():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    spec = importlib.util.spec_from_file_location("_segstore_test_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


batch_spans = _shared_helpers().batch_spans


def run(capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of ``main(argv)``."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_process(*argv) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "segstore", *map(str, argv)],
                          capture_output=True, text=True, env=env)


def file_bytes(root) -> dict:
    """Every file under ``root`` with its bytes (the writer's .lock aside)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f != ".lock":
                with open(os.path.join(d, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def seg(root, tp: str, base: int) -> str:
    return os.path.join(str(root), tp, f"{base:020d}.log")


@pytest.fixture
def store(tmp_path):
    """Compacted topic ``c``: two partitions of 30 one-record batches over 5 keys, in
    segments of four batches (bases 0, 4, ..., 28); delete topic ``t``."""
    root = tmp_path / "store"
    with segstore.open(str(root)) as st:
        st.create_topic("t", 1)
        st.partition("t", 0).append_batch([b"x"], keys=[b"k"], timestamps_ms=TS)
        st.create_topic("c", 2, config={"cleanup.policy": "compact", "segment.bytes": 300})
        for p in range(2):
            for i in range(30):
                st.partition("c", p).append_batch([b"v%d" % i], keys=[b"k%d" % (i % 5)],
                                                  timestamps_ms=TS + i)
    return root


# Damage to the second segment (base 4) of c-0, which every cleaning reads. Each returns the
# position of the damaged batch.

def flip_bit(path) -> int:
    data = bytearray(open(path, "rb").read())
    pos, size = batch_spans(data)[1]
    data[pos + size - 3] ^= 0x10  # in the records: only the CRC notices
    open(path, "wb").write(data)
    return pos


def zero_fill(path) -> int:
    size = os.path.getsize(path)
    open(path, "wb").write(b"\0" * size)
    return 0


def oversize(path) -> int:
    data = bytearray(open(path, "rb").read())
    pos, _ = batch_spans(data)[2]
    struct.pack_into(">i", data, pos + 8, 1 << 30)  # a batch running past the segment
    open(path, "wb").write(data)
    return pos


DAMAGE = {"crc": (flip_bit, "CRC mismatch"), "zeros": (zero_fill, "batch size"),
          "oversize": (oversize, "bytes but only")}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_compact_dry_run_says_which_partition_would_fail(capsys, store, damage):
    make, reason = DAMAGE[damage]
    path = seg(store, "c-0", 4)
    position = make(path)
    before = file_bytes(store)
    rc, out, err = run(capsys, "compact", "--path", store, "--dry-run")
    assert file_bytes(store) == before
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"would fail c-0: corrupt batch in {path} at position "
                               f"{position}: ")
    assert reason in lines[0]
    assert lines[1].startswith("would clean c-1: ")
    assert lines[2] == ("dry run: would clean 1 of 2 compacted partitions, would fail on 1; "
                        "nothing changed")
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run", "--json")
    assert rc == 1 and file_bytes(store) == before
    parts = {e["partition"]: e for e in json.loads(out)["partitions"]}
    assert parts[0]["would_clean"] is False
    assert (parts[0]["would_fail"]["file"], parts[0]["would_fail"]["position"]) == (path, position)
    assert parts[1]["would_clean"] is True and parts[1]["would_fail"] is None


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("force", [False, True])
def test_the_dry_run_agrees_with_the_real_run(capsys, store, tmp_path, damage, force):
    """The real compact fails on the partition the dry run named, at the same file and
    position, and still cleans the other one."""
    make, _ = DAMAGE[damage]
    path = seg(store, "c-0", 4)
    make(path)
    flags = ["--force"] if force else []
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run", "--json", *flags)
    predicted = json.loads(out)["partitions"]
    damaged_c0 = file_bytes(store / "c-0")
    rc_real, out, err = run(capsys, "compact", "--path", store, "--json", *flags)
    assert rc_real == rc == 1
    real = json.loads(out)
    assert [(f["topic"], f["partition"], f["file"], f["position"]) for f in real["failed"]] == \
        [(e["topic"], e["partition"], e["would_fail"]["file"], e["would_fail"]["position"])
         for e in predicted if e["would_fail"]]
    assert {(c["topic"], c["partition"]) for c in real["cleaned"]} == \
        {(e["topic"], e["partition"]) for e in predicted if e["would_clean"]} == {("c", 1)}
    # Nothing of c-0 was rewritten (the map build met the damage first); c-1 was cleaned
    # below its active segment (base 28): one record a key there, the latest.
    assert file_bytes(store / "c-0") == damaged_c0
    with segstore.open(str(store), readonly=True) as st:
        cleaned = [(r.offset, r.key, r.value) for r in st.partition("c", 1).iter_records()
                   if r.offset < 28]
    assert cleaned == [(i, b"k%d" % (i % 5), b"v%d" % i) for i in range(23, 28)]


def test_compact_reports_a_failed_partition_in_one_line_and_cleans_the_rest(store):
    path = seg(store, "c-0", 4)
    position = flip_bit(path)
    p = run_process("compact", "--path", store, "--force")
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    assert p.stderr == (f"segstore compact: error: cleaning c-0 failed: corrupt batch in {path} "
                        f"at position {position}: CRC mismatch\n")
    assert "cleaned log c-1" in p.stdout


def test_compact_dry_run_does_not_read_a_partition_it_would_skip(capsys, store):
    # Not due and no --force: the real run reads nothing of c-0, so neither does the plan.
    flip_bit(seg(store, "c-0", 4))
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run",
                     "--store-config", "log.cleaner.min.cleanable.ratio=1")
    assert rc == 0
    assert out.splitlines()[0] == ("would skip c-0: dirty ratio 1.000 <= "
                                   "min.cleanable.dirty.ratio 1.0")


def test_plan_cleaner_names_the_failing_partition_and_plans_the_others(capsys, store):
    path = seg(store, "c-0", 4)
    position = flip_bit(path)
    before = file_bytes(store)
    rc, out, err = run(capsys, "plan-cleaner", "--store", store)
    assert file_bytes(store) == before
    assert rc == 1
    assert (f"  c-0        would fail: corrupt batch in {path} at position {position}: "
            "CRC mismatch") in out.splitlines()
    assert "  c-1                  30             5             5           1" in out.splitlines()
    assert "Fits: " in out
    rc, out, _ = run(capsys, "plan-cleaner", "--store", store, "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["fits"] is True and doc["keys_per_partition"] == 5
    rows = {r["partition"]: r for r in doc["partitions"]}
    assert rows[0]["keys"] is None and rows[0]["would_fail"]["position"] == position
    assert rows[1]["keys"] == 5 and rows[1]["would_fail"] is None


def test_plan_cleaner_with_every_partition_damaged_prints_no_plan(capsys, store):
    for p in (0, 1):
        flip_bit(seg(store, f"c-{p}", 4))
    rc, out, err = run(capsys, "plan-cleaner", "--store", store)
    assert rc == 1 and out.splitlines()[-1] == "No partition could be counted: no plan."
    rc, out, _ = run(capsys, "plan-cleaner", "--store", store, "--json")
    assert rc == 1 and [r["would_fail"] is not None for r in json.loads(out)["partitions"]] == \
        [True, True]


def test_describe_reports_damage_in_batch_headers_and_describes_the_rest(capsys, store):
    # A zeroed segment breaks the header read describe shares with the cleaner's choice.
    path = seg(store, "c-0", 4)
    zero_fill(path)
    before = file_bytes(store)
    rc, out, err = run(capsys, "describe", "--path", store)
    assert file_bytes(store) == before
    assert rc == 1
    assert (f"  UNCLEANABLE: a cleaning would fail: corrupt batch in {path} at position 0: "
            "batch size field is smaller than the minimum of 14 bytes") in out.splitlines()
    assert "c-1" in out.splitlines() and "t-0" in out.splitlines()
    rc, out, _ = run(capsys, "describe", "--path", store, "--json")
    parts = {(i["topic"], i["partition"]): i for i in json.loads(out)["partitions"]}
    assert rc == 1
    assert parts[("c", 0)]["cleaner"]["would_fail"]["position"] == 0
    assert parts[("c", 0)]["cleaner"]["clean_bytes"] is None
    assert parts[("c", 1)]["cleaner"]["would_fail"] is None
    assert parts[("c", 1)]["cleaner"]["eligible"] is True


def test_describe_checks_crcs_only_when_asked(capsys, store):
    path = seg(store, "c-0", 4)
    position = flip_bit(path)
    before = file_bytes(store)
    rc, out, _ = run(capsys, "describe", "--path", store, "--topic", "c")
    assert rc == 0 and "UNCLEANABLE" not in out  # headers only: the CRC is not read
    rc, out, _ = run(capsys, "describe", "--path", store, "--topic", "c", "--check-crc")
    assert rc == 1
    assert (f"  UNCLEANABLE: a cleaning would fail: corrupt batch in {path} at position "
            f"{position}: CRC mismatch") in out.splitlines()
    assert out.count("UNCLEANABLE") == 1
    assert file_bytes(store) == before


def test_undamaged_store_exits_0_everywhere(capsys, store):
    for argv in (["compact", "--dry-run"], ["describe", "--check-crc"]):
        assert run(capsys, *argv, "--path", store)[0] == 0
    assert run(capsys, "plan-cleaner", "--store", store)[0] == 0
    backup = shutil.copytree(store, str(store) + "-copy")
    assert run(capsys, "compact", "--path", backup)[0] == 0


# -- verify on damaged indexes ----------------------------------------------------------------

def index_path(root, tp: str, base: int, suffix: str = ".index") -> str:
    return os.path.join(str(root), tp, f"{base:020d}{suffix}")


def sealed_index(tmp_path, suffix: str):
    """A store whose t-0 has a sealed segment (base 0) with a trimmed index of whole entries;
    (root, that index's path, its bytes, its entry size)."""
    root = tmp_path / "store"
    with segstore.open(str(root)) as st:
        st.create_topic("t", 1, config={"segment.bytes": 2000, "index.interval.bytes": 1})
        for i in range(40):
            st.partition("t", 0).append_batch([b"v" * 30], keys=[b"k%d" % i],
                                              timestamps_ms=TS + i)
    path = index_path(root, "t-0", 0, suffix)
    data = open(path, "rb").read()
    entry = 8 if suffix == ".index" else 12
    logs = [n for n in os.listdir(root / "t-0") if n.endswith(".log")]
    assert data and len(data) % entry == 0 and len(logs) >= 2  # base 0 is sealed
    return root, path, data, entry


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", ["truncated entry", "garbage"])
def test_verify_reports_a_damaged_sealed_index_that_recovery_rebuilds(capsys, tmp_path, suffix,
                                                                      damage):
    root, path, data, entry = sealed_index(tmp_path, suffix)
    whole = len(data) // entry
    if damage == "truncated entry":
        open(path, "wb").write(data[:-3])
        expected = (f"t-0: {path} at position {(whole - 1) * entry}: the file ends inside an "
                    f"entry ({len(data) - 3} bytes is not a multiple of {entry}); the writer "
                    "rebuilds the index when it first uses it, 'segstore recover' at once")
    else:
        open(path, "wb").write(data + b"\xff" * (2 * entry))
        expected = (f"t-0: {path} at position {len(data)}: the {2 * entry} bytes after the "
                    f"{whole} valid entries are not ordered entries (damage); the writer "
                    "rebuilds the index when it first uses it, 'segstore recover' at once")
    before = file_bytes(root)
    rc, out, _ = run(capsys, "verify", "--path", root)
    assert file_bytes(root) == before
    assert (rc, out.splitlines()[0]) == (1, expected)
    rc, out, _ = run(capsys, "verify", "--path", root, "--json")
    [problem] = json.loads(out)["partitions"][0]["problems"]
    assert rc == 1 and problem["file"] == path
    # As promised: recovery rebuilds it, and verify is then content.
    assert run(capsys, "recover", "--path", root)[0] == 0
    assert os.path.getsize(path) % entry == 0
    rc, out, _ = run(capsys, "verify", "--path", root)
    assert rc == 0 and out.endswith(": no problems found\n")


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_verify_accepts_zero_padding_after_a_sealed_index(capsys, tmp_path, suffix):
    # Preallocation's zeros: readers stop at them, a writable open trims or rebuilds the file.
    root, path, data, entry = sealed_index(tmp_path, suffix)
    open(path, "wb").write(data + b"\0" * (5 * entry))
    rc, out, _ = run(capsys, "verify", "--path", root)
    assert rc == 0 and out.endswith(": no problems found\n")


def test_verify_beside_a_writer_ignores_the_preallocated_active_index(capsys, store):
    with segstore.open(str(store)) as st:
        st.partition("c", 0).append_batch([b"x"], keys=[b"k"], timestamps_ms=TS)
        active = st.partition("c", 0).segments[-1]
        assert os.path.getsize(active.offset_index.path) > 8  # preallocated, zero-filled
        rc, out, _ = run(capsys, "verify", "--path", store)
    assert rc == 0 and out.endswith("no problems found\n")


# -- dump-log on a truncated index ------------------------------------------------------------

@pytest.mark.parametrize("suffix, entry", [(".index", 8), (".timeindex", 12)])
@pytest.mark.parametrize("keep", [0, 1])  # whole entries left before the partial one
def test_dump_log_reports_an_index_that_ends_inside_an_entry(capsys, tmp_path, suffix, entry,
                                                             keep):
    root, path, data, _ = sealed_index(tmp_path, suffix)
    open(path, "wb").write(data[:keep * entry + 6])
    size = keep * entry + 6
    problem = (f"the file ends inside an entry: 6 bytes after the last whole {entry}-byte "
               f"entry, at position {keep * entry}")
    sanity = f"length {size} is not a multiple of {entry}"
    for flags in ([], ["--index-sanity-check"], ["--verify-index-only"]):
        # The sanity check names the length itself; an empty offset index is "empty" as in
        # Kafka's tool, with the partial entry a problem.
        by_sanity = flags == ["--index-sanity-check"] and (keep or suffix == ".timeindex")
        rc, out, err = run(capsys, "dump-log", "--files", path, "--fail-on-error", *flags)
        assert rc == 1, flags
        if by_sanity:
            assert f"{path} failed sanity check: {sanity}" in out.splitlines()
        else:
            assert f"Problems in {path}:\n  {problem}\n" in err, flags
        rc, out, _ = run(capsys, "dump-log", "--files", path, "--json", *flags)
        docs = [json.loads(line) for line in out.splitlines()]
        assert rc == 0
        if by_sanity:
            assert {"type": "sanity_check", "file": path, "passed": False,
                    "reason": sanity} in docs
        else:
            assert {"type": "problem", "kind": "error", "file": path,
                    "message": problem} in docs, flags


def test_compact_dry_run_says_when_the_real_run_would_recover_first(capsys, store):
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run", "--json")
    assert rc == 0 and json.loads(out)["clean_shutdown"] is True
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run")
    assert "note:" not in out
    os.unlink(store / ".kafka_cleanshutdown")  # as after a crash
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run", "--json")
    assert rc == 0 and json.loads(out)["clean_shutdown"] is False
    rc, out, _ = run(capsys, "compact", "--path", store, "--dry-run")
    assert out.startswith("note: the store was not shut down cleanly (or its writer is "
                          "running): the real run first recovers each partition")
    assert not os.path.exists(store / ".kafka_cleanshutdown")  # the dry run changed nothing


# -- verify on directories named like partitions ----------------------------------------------

@pytest.mark.parametrize("name, why", [
    ("c-2", "topic 'c' has 2 partitions, numbered from 0"),
    ("c-01", "'01' is not how a partition number is written"),
    ("bad topic-0", "'bad topic' is not a legal topic name"),
])
def test_verify_names_a_directory_whose_data_no_command_reads(capsys, store, name, why):
    d = store / name
    d.mkdir()
    shutil.copy(seg(store, "c-0", 0), d / "00000000000000000000.log")
    (store / "notes").mkdir()  # not named like a partition: not the store's business
    (store / "c-1.0123456789abcdef0123456789abcdef-delete").mkdir()  # Kafka's, being deleted
    before = file_bytes(store)
    rc, out, _ = run(capsys, "verify", "--path", store)
    assert file_bytes(store) == before
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == f"{d}: named like a partition directory, but {why}: its files are not read"
    assert lines[1].startswith("verified 3 partitions (17 segments, ")  # c-0, c-1, t-0 only
    assert lines[1].endswith("): 1 problem found") and len(lines) == 2
    rc, out, _ = run(capsys, "verify", "--path", store, "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["problems"] == 1
    assert [s["file"] for s in doc["stray_directories"]] == [str(d)]
