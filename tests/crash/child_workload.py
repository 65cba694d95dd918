"""The workload of the kill -9 harness (tests/crash/test_kill9.py): a writer the parent kills.

The child opens the store, then loops over random operations on every topic of
:data:`TOPICS` -- appends (one batch, or several through ``append_columns``), ``flush()``,
``roll()``, ``truncate_to`` at a batch boundary, ``delete_records``, retention passes, checkpoint
writes and clean close-and-reopen -- until it is killed. Each operation announces itself on the
report pipe before it starts (lower-case tag) and reports its outcome after it returns (upper-case
tag), one line each, written with a single ``os.write`` so a line is never torn. At most one
operation is ever unreported, so the parent knows exactly which states the store may legally be in
after the kill:

- ``O <topic> <start> <leo>``: open finished (the state after any recovery);
- ``a <topic> <first> <n> <gen> <b|c>``: about to append ``n`` records at ``first``, generation
  ``gen``, by ``append_batch`` (b) or ``append_columns`` (c); ``A <topic> <first> <last>``: done;
- ``f <topic>`` / ``F <topic> <leo>``: flush() / done, everything below ``leo`` is durable;
- ``l <topic>`` / ``L <topic>``: roll() / done;
- ``t <topic> <x>`` / ``T <topic> <leo>``: truncate_to(x), ``x`` a batch start / done;
- ``d <topic> <x>`` / ``D <topic> <start>``: delete_records(x) / done;
- ``r <topic>`` / ``R <topic> <start> <first segment base>``: a retention pass / done;
- ``k <topic>`` / ``K <topic> <start>``: write_checkpoints() / done (log start checkpointed);
- ``i <topic>`` / ``I <topic>``: the store's tick() (the services' pass) / done;
- ``c <topic>`` / ``X <topic> <start> <leo>``: close() / done (flushed, marker written);
- ``E <traceback>``: the child hit an unexpected exception (fails the test).

Records are deterministic functions of ``(generation, offset)`` (:func:`record`), so the parent can
recognise every record the child could have written and reject anything else. The generation
changes with every child run and every truncation, so a truncated record that comes back is caught.

Crash injection: with ``crash_at=N`` the child wraps the file-system calls segstore makes (``os``
``pwrite``, ``write``, ``open`` with ``O_CREAT``/``O_TRUNC``, ``ftruncate``, ``fsync``,
``posix_fallocate``, ``copy_file_range``, ``replace``, ``rename``, ``unlink``) and SIGKILLs itself
at the N-th one: before it, after it, or -- for ``pwrite`` and ``copy_file_range`` -- after doing
only part of it (a torn write). Given a seed this is deterministic, so a failing kill point can be
replayed exactly. Without ``crash_at`` the parent kills the child after a random delay.

Run as a script (a fresh interpreter, the way the harness runs with ``SEGSTORE_CRASH_EXEC=1``)::

    python tests/crash/child_workload.py STORE_PATH SEED RUN [--crash-at N]

reports go to stdout. The harness normally forks instead and calls :func:`run_child`, which
avoids an interpreter start per kill point.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback

import numpy as np

T0 = 1_600_000_000_000
GENERATIONS_PER_RUN = 1_000  # generation = run * 1000 + truncations so far in that run

# Topic configs: tiny segments and indexes so rolls, index-full rolls, sparse entries and
# retention all happen within a few hundred records.
TOPICS = {
    "plain": {
        "segment.bytes": 6000,
        "segment.index.bytes": 160,  # 20 offset / 13 time entries: index-full rolls
        "index.interval.bytes": 90,
        "retention.bytes": 40000,
        "retention.ms": -1,
        "flush.messages": 97,
        "compression.type": "producer",
    },
    "prealloc": {
        "segment.bytes": 4096,
        "preallocate": True,
        "index.interval.bytes": 200,
        "retention.bytes": 30000,
        "retention.ms": -1,
        "compression.type": "lz4",
        "segment.index.bytes": 8192,
        "file.delete.delay.ms": 0,  # retired segments deleted at the next tick()
    },
}
# The child's tick() must not run retention behind the harness's back (first pass after 30 s).
STORE_CONFIG: dict = {"log.retention.check.interval.ms": 3_600_000}
CODECS = [None, None, None, "gzip", "lz4", "zstd", "snappy"]

# Operation weights (relative).
OPS = [("append", 50), ("append_columns", 8), ("flush", 12), ("roll", 4), ("truncate", 5),
       ("delete_records", 4), ("retention", 3), ("checkpoint", 3), ("tick", 2),
       ("close_reopen", 2)]


def record(gen: int, offset: int, columns: bool = False):
    """``(key, value, timestamp, headers)`` of the record generation ``gen`` writes at ``offset``
    (``columns``: written by ``append_columns``, which writes no headers)."""
    key = b"k%d.%d" % (gen, offset)
    value = (b"%d/%d;" % (gen, offset)) * ((offset * 7 + gen * 13) % 23)
    ts = T0 + gen * 10_000_000 + offset
    headers = [("g", b"%d" % gen)] if offset % 4 == 0 and not columns else []
    return key, value, ts, headers


def parse_key(key: bytes):
    """``(gen, offset)`` encoded in a key written by :func:`record`, or None."""
    try:
        g, o = key[1:].split(b".")
        if not key.startswith(b"k"):
            return None
        return int(g), int(o)
    except (ValueError, TypeError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------------
# crash injection

_MUTATING = ("pwrite", "write", "open", "ftruncate", "fsync", "posix_fallocate",
             "copy_file_range", "replace", "rename", "unlink")


class _Crasher:
    """Counts mutating file-system calls and SIGKILLs the process at the N-th one."""

    def __init__(self, crash_at: int, rng: random.Random, report_fd: int):
        self.left = crash_at
        self.rng = rng
        self.report_fd = report_fd

    def _die(self):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never reached

    def install(self):
        for name in _MUTATING:
            orig = getattr(os, name)
            setattr(os, name, self._wrap(name, orig))

    def _wrap(self, name, orig):
        crasher = self

        def wrapper(*args, **kw):
            if name == "write" and args and args[0] == crasher.report_fd:
                return orig(*args, **kw)
            if name == "open":
                flags = args[1] if len(args) > 1 else kw.get("flags", 0)
                if not flags & (os.O_CREAT | os.O_TRUNC):
                    return orig(*args, **kw)
            crasher.left -= 1
            if crasher.left > 0:
                return orig(*args, **kw)
            how = crasher.rng.choice(("before", "after", "partial"))
            if how == "before":
                crasher._die()
            if how == "partial" and name == "pwrite" and len(args[1]) > 1:
                fd, data, pos = args[:3]
                orig(fd, memoryview(data)[:crasher.rng.randrange(1, len(data))], pos)
                crasher._die()
            if how == "partial" and name == "copy_file_range" and args[2] > 1:
                src, dst, count = args[:3]
                orig(src, dst, crasher.rng.randrange(1, count), *args[3:], **kw)
                crasher._die()
            orig(*args, **kw)
            crasher._die()
        return wrapper


# ------------------------------------------------------------------------------------------------
# the workload


class _Child:
    def __init__(self, path: str, report_fd: int, seed: int, run: int):
        self.path = path
        self.fd = report_fd
        self.rng = random.Random(f"{seed}:{run}")
        self.gen = {t: run * GENERATIONS_PER_RUN for t in TOPICS}
        self.batch_starts = {t: [] for t in TOPICS}  # batch starts appended by this run
        self.store = None

    def say(self, *fields) -> None:
        os.write(self.fd, (" ".join(str(f) for f in fields) + "\n").encode())

    def open(self):
        import segstore
        self.store = segstore.open(self.path, config=STORE_CONFIG)
        for t in TOPICS:
            lg = self.store.partition(t, 0)
            self.say("O", t, lg.log_start_offset, lg.log_end_offset)
            self.batch_starts[t] = [b for b in self.batch_starts[t] if b < lg.log_end_offset]

    def step(self) -> None:
        rng = self.rng
        op = rng.choices([o for o, _ in OPS], [w for _, w in OPS])[0]
        t = rng.choice(list(TOPICS))
        lg = self.store.partition(t, 0)
        if op == "append":
            n = rng.choice((1, 1, 2, 3, 5, 8))
            first = lg.log_end_offset
            recs = [record(self.gen[t], first + i) for i in range(n)]
            self.say("a", t, first, n, self.gen[t], "b")
            codec = rng.choice(CODECS) if t == "plain" else None
            info = lg.append_batch([r[1] for r in recs], [r[0] for r in recs],
                                   [r[3] for r in recs], [r[2] for r in recs], compression=codec)
            assert info.first_offset == first and info.last_offset == first + n - 1, info
            self.batch_starts[t].append(first)
            self.say("A", t, info.first_offset, info.last_offset)
        elif op == "append_columns":
            from segstore.columns import BinaryColumn
            n = rng.randint(2, 25)
            per = rng.randint(1, 6)
            first = lg.log_end_offset
            recs = [record(self.gen[t], first + i, columns=True) for i in range(n)]
            self.say("a", t, first, n, self.gen[t], "c")
            info = lg.append_columns(BinaryColumn.from_pylist([r[1] for r in recs]),
                                     BinaryColumn.from_pylist([r[0] for r in recs]),
                                     np.array([r[2] for r in recs], dtype=np.int64),
                                     records_per_batch=per)
            assert info.first_offset == first and info.last_offset == first + n - 1, info
            self.batch_starts[t].extend(range(first, first + n, per))
            self.say("A", t, info.first_offset, info.last_offset)
        elif op == "flush":
            self.say("f", t)
            lg.flush()
            self.say("F", t, lg.log_end_offset)
        elif op == "roll":
            self.say("l", t)
            lg.roll()
            self.say("L", t)
        elif op == "truncate":
            leo = lg.log_end_offset
            cands = [b for b in self.batch_starts[t] if b < leo]
            if not cands:
                return
            # Mostly near the end (a few batches back), sometimes far back.
            x = rng.choice(cands[-4:] if rng.random() < 0.8 else cands)
            self.say("t", t, x)
            lg.truncate_to(x)
            self.batch_starts[t] = [b for b in self.batch_starts[t] if b < x]
            self.gen[t] += 1
            self.say("T", t, lg.log_end_offset)
        elif op == "delete_records":
            start, leo = lg.log_start_offset, lg.log_end_offset
            x = rng.randint(start, min(leo, start + 60))
            self.say("d", t, x)
            lg.delete_records(x)
            self.say("D", t, lg.log_start_offset)
        elif op == "retention":
            if not hasattr(self.store, "enforce_retention"):
                return
            for tt in TOPICS:
                self.say("r", tt)
            self.store.enforce_retention()
            for tt in TOPICS:
                lg = self.store.partition(tt, 0)
                self.say("R", tt, lg.log_start_offset, lg.segments[0].base_offset)
        elif op == "checkpoint":
            for tt in TOPICS:
                self.say("k", tt)
            self.store.write_checkpoints()
            for tt in TOPICS:
                self.say("K", tt, self.store.partition(tt, 0).log_start_offset)
        elif op == "tick":
            # The background services' pass: flush by flush.ms, checkpoints when due (not within
            # a child's life), delayed deletes of retired segments.
            self.say("i", t)
            self.store.tick()
            self.say("I", t)
        elif op == "close_reopen":
            for tt in TOPICS:
                self.say("c", tt)
            state = {tt: (self.store.partition(tt, 0).log_start_offset,
                          self.store.partition(tt, 0).log_end_offset) for tt in TOPICS}
            self.store.close()
            for tt in TOPICS:
                self.say("X", tt, *state[tt])
            for tt in TOPICS:
                self.gen[tt] += 1  # a new "run": offsets past a lost tail get new content
            self.open()


def run_child(path: str, report_fd: int, seed: int, run: int, crash_at=None,
              max_steps=None) -> None:
    """The child's whole life: open, then operations until killed (or ``max_steps`` done).

    Unexpected exceptions are reported as an ``E`` line; the caller exits the process.
    """
    child = _Child(path, report_fd, seed, run)
    if crash_at is not None:
        _Crasher(crash_at, random.Random(f"{seed}:{run}:crash"), report_fd).install()
    try:
        child.open()
        steps = 0
        while max_steps is None or steps < max_steps:
            child.step()
            steps += 1
        child.store.close()
    except BaseException:
        msg = traceback.format_exc().replace("\n", "\\n")
        os.write(report_fd, ("E " + msg + "\n").encode())
        raise


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("seed", type=int)
    ap.add_argument("run", type=int)
    ap.add_argument("--crash-at", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        run_child(args.path, sys.stdout.fileno(), args.seed, args.run, args.crash_at,
                  args.max_steps)
    except BaseException:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
