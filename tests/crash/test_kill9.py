"""kill -9 harness: a writer process is SIGKILLed at random moments; every kill is checked.

The child (:mod:`child_workload`) appends, flushes, rolls, truncates, deletes records, runs
retention, writes checkpoints and closes/reopens, reporting each operation before and after it on a
pipe. The parent kills it -- after a random delay, or the child kills itself at its N-th mutating
file-system call (sometimes after doing only part of a write) -- then opens the store itself
(``segstore.open``, a writer: loading and recovery run), and checks, per partition:

* the open succeeds and ``verify()`` reports nothing (CRCs, offsets, indexes agree with the log);
* offsets run without a gap from the log start offset to the log end offset, and every record is
  exactly the record the child writes at that offset in that generation (key, value, timestamp,
  headers) -- a record the child never wrote, or a truncated one that came back, fails;
* every record the child reported flushed is there, unless the child truncated or deleted it;
* more: a SIGKILL loses no completed write (the page cache survives the process), so the log ends
  at the last reported append, or -- if an operation was in flight -- anywhere that operation
  allows (a torn append keeps a prefix of its batches, a truncation ends anywhere between its
  target and the old end);
* the log start offset lies between what was durably recorded (checkpoints, retention) and the
  highest start the child asked for;
* no stray files are left in a partition directory after loading.

Then the parent closes the store (a clean shutdown) and, now and then, removes the clean-shutdown
marker or resets the recovery-point checkpoint to 0, so the next child's own open has to recover
(and may be killed while it does). The same store is reused across all kills, so recovery compounds.

Scale: ``SEGSTORE_CRASH_KILLS`` (default 200) kill points; ``SEGSTORE_CRASH_SEED`` picks the run;
``SEGSTORE_CRASH_EXEC=1`` starts each child as a fresh interpreter instead of forking (slower).
"""

from __future__ import annotations

import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pytest

import segstore
from segstore.checkpoint import (CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT,
                                 OffsetCheckpointFile)
from segstore.columns import BinaryColumn
from segstore.config import TopicConfig
from segstore.log import PartitionLog
from segstore.records import TopicPartition
from segstore.topic import PARTITION_MARKER

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import child_workload as cw  # noqa: E402

KILLS = int(os.environ.get("SEGSTORE_CRASH_KILLS", "200"))
SEED = int(os.environ.get("SEGSTORE_CRASH_SEED", "20240604"))
EXEC = os.environ.get("SEGSTORE_CRASH_EXEC", "") not in ("", "0")
SEGMENT_FILE = re.compile(r"\d{20}\.(log|index|timeindex|txnindex|snapshot)")


# ------------------------------------------------------------------------------------------------
# the parent's model of one partition


@dataclass
class Pending:
    """The one operation the child announced but did not report finished."""

    op: str
    x: int = 0          # truncate / delete_records target, append first offset
    n: int = 0          # append: record count
    gen: int = 0        # append: generation
    columns: bool = False


@dataclass
class Model:
    """What the parent knows about one partition between two checks."""

    topic: str
    start: int = 0                                   # log start offset after the last check
    leo: int = 0                                     # log end offset as last reported
    gens: dict = field(default_factory=dict)         # offset -> (generation, columns?)
    flushed: int = 0                                 # every offset below this is durable
    start_lo: int = 0                                # the log start cannot fall below this
    start_hi: int = 0                                # ... nor rise above this
    pending: Optional[Pending] = None

    def reset(self, start: int, leo: int, gens: dict) -> None:
        """After the parent's clean close: exactly this state, all flushed, all checkpointed."""
        self.start, self.leo, self.gens = start, leo, gens
        self.flushed = leo
        self.start_lo = self.start_hi = start
        self.pending = None

    def expected(self, offset: int):
        """(generation, columns?) the record at ``offset`` must have, or None if none may exist."""
        if offset < self.leo:
            return self.gens.get(offset)
        p = self.pending
        if p is not None and p.op == "append" and p.x <= offset < p.x + p.n:
            return (p.gen, p.columns)
        return None

    def leo_bounds(self) -> tuple[int, int]:
        p = self.pending
        lo = p.x if p is not None and p.op == "truncate" else self.leo
        hi = p.x + p.n if p is not None and p.op == "append" else self.leo
        return lo, hi

    def check_state(self, start: int, leo: int, who: str) -> list[str]:
        """The log start / end offsets a reopen may legally show."""
        errors = []
        lo, hi = self.leo_bounds()
        # When the log ends below the checkpointed log start, every segment is dropped and the
        # log restarts, empty, at that log start (REF §4.2 step 8): past the old end.
        restarted = start == leo and leo <= self.start_hi
        if leo < self.flushed:
            errors.append(f"{who}: flushed records lost: log end offset {leo} < {self.flushed} "
                          f"reported flushed")
        elif not lo <= leo <= hi and not (restarted and leo >= lo):
            errors.append(f"{who}: log end offset {leo} outside [{lo}, {hi}] (a SIGKILL keeps "
                          f"every completed write; pending: {self.pending})")
        if not self.start_lo <= start <= self.start_hi:
            errors.append(f"{who}: log start offset {start} outside [{self.start_lo}, "
                          f"{self.start_hi}] (pending: {self.pending})")
        if start > leo:
            errors.append(f"{who}: log start offset {start} above log end offset {leo}")
        return errors

    # -- reports ------------------------------------------------------------------------------
    def apply(self, tag: str, args: list[int], extra: str = "") -> list[str]:
        p = self.pending
        errors = []
        if tag == "O":
            start, leo = args
            errors += self.check_state(start, leo, "child's open")
            if p is not None and p.op == "append":
                for o in range(self.leo, min(leo, p.x + p.n)):
                    self.gens[o] = (p.gen, p.columns)
            self.gens = {o: g for o, g in self.gens.items() if start <= o < leo}
            self.leo = leo
            self.start_hi = max(self.start_hi, start)
            self.pending = None
        elif tag == "a":
            first, n, gen = args
            if first != self.leo:
                errors.append(f"child appends at {first} but its log ended at {self.leo}")
            self.pending = Pending("append", first, n, gen, extra == "c")
        elif tag == "A":
            first, last = args
            for o in range(first, last + 1):
                self.gens[o] = (p.gen, p.columns)
            self.leo = last + 1
            self.pending = None
        elif tag == "f":
            self.pending = Pending("flush")
        elif tag == "F":
            self.flushed = max(self.flushed, args[0])
            self.pending = None
        elif tag == "l":
            self.pending = Pending("roll")
        elif tag == "L":
            self.pending = None
        elif tag == "t":
            x = args[0]
            self.pending = Pending("truncate", x)
            self.flushed = min(self.flushed, x)
            self.start_lo = min(self.start_lo, x)
        elif tag == "T":
            leo = args[0]
            if leo != p.x:
                errors.append(f"truncate_to({p.x}) at a batch start left log end offset {leo}")
            self.gens = {o: g for o, g in self.gens.items() if o < leo}
            self.leo = leo
            self.pending = None
        elif tag == "d":
            self.pending = Pending("delete", args[0])
            self.start_hi = max(self.start_hi, args[0])
        elif tag == "D":
            self.start_hi = max(self.start_hi, args[0])
            self.pending = None
        elif tag == "r":
            self.pending = Pending("retention")
            self.start_hi = max(self.start_hi, self.leo)
        elif tag == "R":
            start, first_base = args
            self.start_hi = max(self.start_hi, start)
            self.start_lo = max(self.start_lo, first_base)  # deleted segments never come back
            self.pending = None
        elif tag == "k":
            self.pending = Pending("checkpoint")
        elif tag == "K":
            self.start_lo = max(self.start_lo, args[0])
            self.pending = None
        elif tag == "i":
            self.pending = Pending("tick")
        elif tag == "I":
            self.pending = None
        elif tag == "c":
            self.pending = Pending("close")
        elif tag == "X":
            start, leo = args
            self.flushed = leo
            self.start_lo = max(self.start_lo, start)
            self.pending = None
        else:
            errors.append(f"unknown report {tag} {args}")
        return errors


def parse_reports(data: bytes) -> list[tuple]:
    """``(tag, topic, int args, extra)`` per complete report line; ``E`` lines raise."""
    out = []
    for line in data.decode().split("\n")[:-1]:  # the last piece is empty or a torn line
        if line.startswith("E "):
            pytest.fail("child raised:\n" + line[2:].replace("\\n", "\n"))
        parts = line.split()
        extra = parts[-1] if parts[0] == "a" else ""
        nums = [int(x) for x in (parts[2:-1] if parts[0] == "a" else parts[2:])]
        out.append((parts[0], parts[1], nums, extra))
    return out


# ------------------------------------------------------------------------------------------------
# checking a store


def check_records(model: Model, recs, start: int, leo: int) -> list[str]:
    errors = []
    offsets = [r.offset for r in recs]
    if offsets != list(range(start, leo)):
        missing = sorted(set(range(start, leo)) - set(offsets))[:5]
        errors.append(f"offsets are not exactly [{start}, {leo}): missing {missing}, "
                      f"got {offsets[:3]}...{offsets[-3:]}")
    for r in recs:
        exp = model.expected(r.offset)
        parsed = cw.parse_key(r.key)
        if exp is None:
            errors.append(f"offset {r.offset}: record {r.key!r} was never written there")
        elif parsed != (exp[0], r.offset):
            errors.append(f"offset {r.offset}: key {r.key!r}, expected generation {exp[0]} "
                          "(a truncated or foreign record)")
        else:
            key, value, ts, headers = cw.record(exp[0], r.offset, exp[1])
            got = (r.key, r.value, r.timestamp, r.timestamp_type, [tuple(h) for h in r.headers])
            if got != (key, value, ts, 0, headers):
                errors.append(f"offset {r.offset}: record differs: {got!r:.200}")
        if len(errors) > 8:
            break
    return errors


def stray_files(path: str) -> list[str]:
    """Files in partition directories that are not segment files (after loading)."""
    out = []
    for t in cw.TOPICS:
        d = os.path.join(path, f"{t}-0")
        out += [f"{t}-0/{n}" for n in os.listdir(d)
                if not SEGMENT_FILE.fullmatch(n) and n != PARTITION_MARKER]
    return out


def check_store(path: str, models: dict, rng: random.Random, where: str) -> None:
    """Open (recover), check every partition against its model, close; then maybe make the next
    open unclean. Fails the test with every problem found."""
    errors = []
    store = segstore.open(path, config=cw.STORE_CONFIG)
    try:
        strays = stray_files(path)
        if strays:
            errors.append(f"stray files after loading: {strays}")
        for t, m in models.items():
            lg = store.partition(t, 0)
            problems = lg.verify()
            if problems:
                errors.append(f"{t}: verify(): {[str(p) for p in problems[:5]]}")
            start, leo = lg.log_start_offset, lg.log_end_offset
            errors += [f"{t}: {e}" for e in m.check_state(start, leo, "reopen")]
            recs = list(lg.iter_records())
            errors += [f"{t}: {e}" for e in check_records(m, recs, start, leo)]
            cols = lg.read_columns()
            if cols.offsets.tolist() != [r.offset for r in recs] or \
                    cols.keys.to_pylist() != [r.key for r in recs]:
                errors.append(f"{t}: read_columns() disagrees with read()")
            if errors:
                continue
            m.reset(start, leo, {r.offset: (cw.parse_key(r.key)[0], m.expected(r.offset)[1])
                                 for r in recs})
    finally:
        store.close()
    if errors:
        pytest.fail(f"{where}:\n  " + "\n  ".join(errors))
    # Now and then make the next child's open recover: no clean-shutdown marker, and sometimes
    # a recovery point of 0 (every segment is recovered).
    if rng.random() < 0.3:
        os.unlink(os.path.join(path, CLEAN_SHUTDOWN_FILE))
        if rng.random() < 0.3:
            OffsetCheckpointFile(os.path.join(path, RECOVERY_POINT_CHECKPOINT)).write(
                {TopicPartition(t, 0): 0 for t in cw.TOPICS})


def new_store(path: str) -> dict:
    store = segstore.open(path, config=cw.STORE_CONFIG)
    for t, cfg in cw.TOPICS.items():
        store.create_topic(t, 1, cfg)
    store.close()
    return {t: Model(t) for t in cw.TOPICS}


# ------------------------------------------------------------------------------------------------
# running children


def start_child(path: str, seed: int, run: int, crash_at, exec_mode: bool, max_steps=None):
    """Start the workload; returns (pid or Popen, read fd of its report pipe)."""
    if exec_mode:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(segstore.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
        cmd = [sys.executable, os.path.join(HERE, "child_workload.py"), path, str(seed), str(run)]
        if crash_at is not None:
            cmd += ["--crash-at", str(crash_at)]
        if max_steps is not None:
            cmd += ["--max-steps", str(max_steps)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
        return proc, proc.stdout.fileno()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(r)
            cw.run_child(path, w, seed, run, crash_at, max_steps)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(w)
    return pid, r


def wait_child(child, fd: int, kill_after: Optional[float], timeout: float = 30.0):
    """Read reports until the child dies, SIGKILLing it after ``kill_after`` seconds.

    Returns (report bytes, how it ended: "killed", or "exit <code>")."""
    chunks = []
    t0 = time.monotonic()
    deadline = t0 + (kill_after if kill_after is not None else timeout)
    killed = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pid = child.pid if hasattr(child, "pid") else child
            os.kill(pid, signal.SIGKILL)
            killed = True
            break
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break  # the child is gone
            chunks.append(data)
    if hasattr(child, "wait"):
        status = child.wait()
        sig = -status if status < 0 else None
        code = status if status >= 0 else None
    else:
        _, st = os.waitpid(child, 0)
        sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
        code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else None
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
    if hasattr(child, "stdout"):
        child.stdout.close()
    else:
        os.close(fd)
    if sig == signal.SIGKILL:
        how = "killed"
    elif sig is not None:
        how = f"signal {signal.Signals(sig).name}"
    else:
        how = f"exit {code}"
    if killed and kill_after is None:
        how = "hung"
    return b"".join(chunks), how


def kill_loop(path: str, kills: int, seed: int, exec_mode: bool = False) -> dict:
    """The harness: ``kills`` kill points on one store. Returns counters."""
    rng = random.Random(seed)
    models = new_store(path)
    stats = {"kills": 0, "timer": 0, "syscall": 0, "reports": 0, "exited": 0}
    saved = path + ".before-check"
    for run in range(1, kills + 1):
        syscall_mode = rng.random() < 0.5
        crash_at = int(2 ** rng.uniform(0, 9.5)) if syscall_mode else None
        kill_after = None if syscall_mode else rng.choice(
            (rng.uniform(0.002, 0.05), rng.uniform(0.002, 0.05), rng.uniform(0.05, 0.25)))
        child, fd = start_child(path, seed, run, crash_at, exec_mode)
        data, how = wait_child(child, fd, kill_after)
        where = (f"kill point {run} (seed {seed}, {'crash_at=%d' % crash_at if syscall_mode else 'timer'}"
                 f", child {how})")
        reports = parse_reports(data)
        if how != "killed":
            pytest.fail(f"{where}: the child did not die of SIGKILL; reports: {data[-500:]!r}")
        errors = []
        for tag, topic, nums, extra in reports:
            errors += [f"{topic}: {e}" for e in models[topic].apply(tag, nums, extra)]
        if errors:
            pytest.fail(f"{where}: inconsistent child reports:\n  " + "\n  ".join(errors[:10]))
        # Keep the crashed state until it is checked: on failure it is left for a replay.
        shutil.rmtree(saved, ignore_errors=True)
        shutil.copytree(path, saved)
        try:
            check_store(path, models, rng, where)
        except BaseException:
            print(f"crashed store state kept in {saved}")
            raise
        stats["kills"] += 1
        stats["syscall" if syscall_mode else "timer"] += 1
        stats["reports"] += len(reports)
    shutil.rmtree(saved, ignore_errors=True)
    return stats


# ------------------------------------------------------------------------------------------------
# tests


@pytest.mark.slow
def test_kill9_harness(tmp_path):
    """At least 200 kill points (``SEGSTORE_CRASH_KILLS`` raises it) on one compounding store."""
    stats = kill_loop(str(tmp_path / "store"), KILLS, SEED, exec_mode=EXEC)
    print(f"kill -9 harness: {stats}")
    assert stats["kills"] == KILLS
    assert stats["timer"] and stats["syscall"]


def test_kill9_exec_children(tmp_path):
    """The child script also works as a fresh interpreter (how a real process dies)."""
    stats = kill_loop(str(tmp_path / "store"), 6, SEED + 1, exec_mode=True)
    assert stats["kills"] == 6


def test_child_without_kill_closes_cleanly(tmp_path):
    """Sanity of the harness itself: a child that is not killed ends with a clean store the
    model accepts, and its reports cover every kind of operation."""
    path = str(tmp_path / "store")
    models = new_store(path)
    child, fd = start_child(path, 7, 1, None, False, max_steps=1500)
    data, how = wait_child(child, fd, None, timeout=120)
    assert how == "exit 0", data[-2000:]
    reports = parse_reports(data)
    for tag, topic, nums, extra in reports:
        assert models[topic].apply(tag, nums, extra) == []
    tags = {r[0] for r in reports}
    assert set("OaAfFlLtTdDrRkKiIcX") <= tags, tags
    assert os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    check_store(path, models, random.Random(0), "after a clean run")


# -- kills during recovery -------------------------------------------------------------------------


def _damaged_store(path: str) -> tuple[dict, dict]:
    """A store whose partitions end in a torn batch plus garbage, with no clean-shutdown marker
    and a recovery point of 0; returns (expected records per topic, models)."""
    models = new_store(path)
    store = segstore.open(path, config=cw.STORE_CONFIG)
    expected = {}
    for t in cw.TOPICS:
        lg = store.partition(t, 0)
        gen = 5
        for i in range(60):
            first = lg.log_end_offset
            recs = [cw.record(gen, first + j) for j in range(1 + i % 3)]
            lg.append_batch([r[1] for r in recs], [r[0] for r in recs], [r[3] for r in recs],
                            [r[2] for r in recs])
        expected[t] = [(r.offset, r.key, r.value) for r in lg.iter_records()]
    store.close()
    for t in cw.TOPICS:
        d = os.path.join(path, f"{t}-0")
        active = sorted(n for n in os.listdir(d) if n.endswith(".log"))[-1]
        with open(os.path.join(d, active), "r+b") as f:
            data = f.read()
            f.seek(len(data))
            torn = cw.record(6, 999)[1] * 3
            f.write(data[-min(len(data), 150):][:97] + torn)  # a torn copy of the tail + junk
    os.unlink(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    OffsetCheckpointFile(os.path.join(path, RECOVERY_POINT_CHECKPOINT)).write(
        {TopicPartition(t, 0): 0 for t in cw.TOPICS})
    return expected, models


def test_kill_at_every_step_of_recovery(tmp_path):
    """SIGKILL at the 1st, 2nd, ... file-system call of an unclean open (recovery, then close):
    every later open recovers exactly the valid records (KAFKA-10471: a crash while loading
    counts as unclean)."""
    pristine = str(tmp_path / "pristine")
    expected, _ = _damaged_store(pristine)
    path = str(tmp_path / "store")
    n = 1
    while True:
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(pristine, path)
        child, fd = start_child(path, 1, 1, n, False, max_steps=0)
        data, how = wait_child(child, fd, None)
        store = segstore.open(path, config=cw.STORE_CONFIG)
        try:
            for t in cw.TOPICS:
                lg = store.partition(t, 0)
                assert lg.verify() == [], (n, t)
                got = [(r.offset, r.key, r.value) for r in lg.iter_records()]
                assert got == expected[t], (n, t)
        finally:
            store.close()
        if how == "exit 0":
            break
        assert how == "killed", (n, how, data[-500:])
        n += 1
    assert n > 10  # the open and close made that many mutating calls


def test_compounding_kills_during_recovery(tmp_path):
    """Kill one recovering open after another on the same damaged store, then check."""
    path = str(tmp_path / "store")
    expected, _ = _damaged_store(path)
    rng = random.Random(3)
    for run in range(12):
        child, fd = start_child(path, 1, run, rng.randint(1, 40), False, max_steps=0)
        _, how = wait_child(child, fd, None)
        assert how in ("killed", "exit 0")
    store = segstore.open(path, config=cw.STORE_CONFIG)
    try:
        for t in cw.TOPICS:
            lg = store.partition(t, 0)
            assert lg.verify() == []
            assert [(r.offset, r.key, r.value) for r in lg.iter_records()] == expected[t]
    finally:
        store.close()


# -- regressions: bugs the harness found, each reduced to a deterministic case --------------------


def test_multi_batch_append_filling_the_index(tmp_path):
    """A multi-batch append that fills the index half-way once raised after writing its data,
    leaving the log end offset behind (the next append reused the offsets)."""
    cfg = TopicConfig.from_dict({"segment.index.bytes": 24, "index.interval.bytes": 0})
    lg = PartitionLog(str(tmp_path / "t-0"), "t", 0, cfg, lambda: 1000)
    values = BinaryColumn.from_pylist([b"v%d" % i for i in range(10)])
    lg.append_columns(values, timestamps_ms=np.arange(10, dtype=np.int64) + 1000,
                      records_per_batch=1)
    lg.append_batch([b"next"], timestamps_ms=[5000])
    assert [r.value for r in lg.iter_records()] == [b"v%d" % i for i in range(10)] + [b"next"]
    assert lg.verify() == []


def test_close_after_the_same_segment_base_was_retired_twice(tmp_path):
    """Two retired segments with the same base queued for deletion once made close() raise
    (store left locked, no checkpoints, no marker)."""
    path = str(tmp_path / "store")
    store = segstore.open(path)
    store.create_topic("t", 1)
    lg = store.partition("t", 0)
    for _ in range(2):
        lg.append(b"a")
        lg.roll()
        lg.append(b"b")
        lg.truncate_to(0)  # retires segment 1: 00000000000000000001.*.deleted
    store.close()
    assert os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    segstore.open(path).close()


def _crash_in_child(fn) -> None:
    """Run ``fn()`` in a forked child that dies without any cleanup when ``fn`` calls
    ``os._exit`` (or returns): the files are left exactly as a crash at that point leaves them."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _three_segment_log(path):
    cfg = TopicConfig.from_dict({"segment.bytes": 300})
    lg = PartitionLog(path, "t", 0, cfg, lambda: 1000)
    for i in range(24):
        lg.append(b"x%02d" % i * 10, timestamp_ms=1000 + i)
    assert len(lg.segments) >= 3
    lg.close()
    return cfg


def test_crash_inside_truncate_to_leaves_no_hole(tmp_path):
    """A crash after the first later segment is retired leaves a prefix, not a hole (segments
    were once retired lowest first)."""
    path = str(tmp_path / "t-0")
    cfg = _three_segment_log(path)

    def truncate_and_crash():
        from segstore import segment
        real = segment.LogSegment.change_file_suffixes

        def once(self, old, new):
            real(self, old, new)
            if new == segment.DELETED_SUFFIX:
                os._exit(0)
        segment.LogSegment.change_file_suffixes = once
        PartitionLog(path, "t", 0, cfg, lambda: 1000).truncate_to(3)
    _crash_in_child(truncate_and_crash)
    lg = PartitionLog(path, "t", 0, cfg, lambda: 1000, had_clean_shutdown=False,
                      recovery_point=0)
    offsets = [r.offset for r in lg.iter_records()]
    assert offsets == list(range(lg.log_start_offset, lg.log_end_offset))


def test_crash_inside_truncation_leaves_no_temp_file(tmp_path):
    """A crash inside the rewrite of a truncated segment leaves ``.log.truncating``; loading
    removes it (it once leaked)."""
    path = str(tmp_path / "t-0")
    cfg = _three_segment_log(path)

    def truncate_and_crash():
        real = os.replace

        def replace(src, dst, **kw):
            if str(src).endswith(".truncating"):
                os._exit(0)
            return real(src, dst, **kw)
        os.replace = replace
        lg = PartitionLog(path, "t", 0, cfg, lambda: 1000)
        lg.truncate_to(lg.log_end_offset - 1)
    _crash_in_child(truncate_and_crash)
    PartitionLog(path, "t", 0, cfg, lambda: 1000, had_clean_shutdown=False, recovery_point=0)
    assert [n for n in os.listdir(path) if n.endswith(".truncating")] == []


def test_recovery_after_truncations_fits_a_small_index(tmp_path):
    """Recovery re-indexes batch by batch from the start, which after truncations needs more
    entries than the appends made; it once overflowed segment.index.bytes and failed the open."""
    path = str(tmp_path / "t-0")
    cfg = TopicConfig.from_dict({"segment.index.bytes": 48, "index.interval.bytes": 0})
    lg = PartitionLog(path, "t", 0, cfg, lambda: 1000)
    ts = iter(range(1001, 2000))

    def append():
        lg.append_batch([b"x" * 50], timestamps_ms=[next(ts)])
    for _ in range(3):
        append()
    lg.truncate_to(2)
    append()  # offset 2 again, not indexed: the byte count restarted
    append()
    lg.truncate_to(3)
    for _ in range(5):
        append()
    expected = [r.offset for r in lg.iter_records()]
    lg.close()
    again = PartitionLog(path, "t", 0, cfg, lambda: 1000, had_clean_shutdown=False,
                         recovery_point=0)
    assert [r.offset for r in again.iter_records()] == expected
    assert again.verify() == []
