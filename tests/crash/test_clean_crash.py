"""A crash while cleaning and swapping, at every step (REF §2.2, ports of REF §7 #47).

A compacted partition is cleaned by ``store.compact`` -- the real cleaner: offset map, filter into
``.cleaned`` segments, ``PartitionLog.replace_segments`` -- and stopped at every moment that
matters: at each ``_swap_step`` hook call (a new segment renamed ``.cleaned`` -> ``.swap``, an old
one renamed ``.deleted``, a new one's ``.swap`` dropped), before and after each chunk written into
a ``.cleaned`` segment, and (kill -9 variant) at every mutating file-system call, before it, after
it or after only part of a ``pwrite``. Each stop is taken three ways: a copy of the store directory
at that moment (as the files are after a crash), a forked child that ``os._exit``s there, and a
child that SIGKILLs itself there.

Then the store is reopened with ``segstore.open`` and must hold exactly one whole state: the
records from before the clean or those from after it -- per cleaning group, because every group
is swapped on its own: after ``g`` groups have been committed (their new segment renamed
``.swap``), the first ``g`` groups are cleaned and the rest are untouched, never anything else.
With one group (layout ``one-group``) that is strictly pre or post. The expected states are
computed here by plain Python from the records before the clean (for the cleaned range, a record
stays iff it has a key and is the latest record of that key in the dirty section). After
reopening, no ``.cleaned``/``.swap``/``.deleted`` file is left, ``verify()`` finds nothing, and
cleaning again converges on the post-clean records.

A separate kill -9 harness (``child_cleaner.py`` workload mode) appends and cleans with a real
cleaner thread and is SIGKILLed at random moments; every kill is checked against the records'
deterministic contents. ``SEGSTORE_CLEAN_KILLS`` (default 12) sets its number of kills and
``SEGSTORE_CRASH_SEED`` its seed; ``SEGSTORE_CLEAN_EVERY_CALL=1`` tries every file-system call of
the kill-at-call test instead of a sample.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

import segstore
from segstore import log_swap as swap_module
from segstore.cleaner.cleaner import Cleaner

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import child_cleaner as cc  # noqa: E402
from keyless import append_unvalidated  # noqa: E402

T0 = 1_700_000_000_000
NOW = T0 + 5_000
KILLS = int(os.environ.get("SEGSTORE_CLEAN_KILLS", "12"))
SEED = int(os.environ.get("SEGSTORE_CRASH_SEED", "20240604"))
EVERY_CALL = os.environ.get("SEGSTORE_CLEAN_EVERY_CALL", "") not in ("", "0")
TEMP_SUFFIXES = (".cleaned", ".swap", ".deleted")

# segment.bytes decides the cleaning groups: 1 MB puts every sealed segment into one group,
# 900 bytes keeps each ~830-byte segment in a group of its own.
LAYOUTS = {"one-group": 1_000_000, "groups": 900}


def clock() -> int:
    return NOW


def build(root: str, layout: str) -> None:
    """Six sealed segments of 10 records (8 keys, some keyless, some tombstones) + 3 active."""
    s = segstore.open(root, clock=clock)
    s.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": LAYOUTS[layout]})
    lg = s.partition("t", 0)
    rng = random.Random(7)
    for i in range(63):
        r = rng.random()
        key = None if r < 0.08 else b"k%d" % rng.randrange(8)
        value = None if (key is not None and r > 0.9) else b"v%03d" % i * rng.randint(1, 6)
        append_unvalidated(lg, value, key=key, timestamp_ms=T0 + i)
        if i % 10 == 9:
            lg.roll()
    assert [sg.base_offset for sg in lg.segments] == [0, 10, 20, 30, 40, 50, 60]
    s.close()


def reopen(root: str, clean_marker: bool = False):
    """Open a crashed store: (records, leftover temp files, verify problems); then close."""
    if clean_marker:
        open(os.path.join(root, ".kafka_cleanshutdown"), "w").close()
    s = segstore.open(root, clock=clock)
    try:
        lg = s.partition("t", 0)
        recs = [(r.offset, r.key, r.value, r.timestamp) for r in lg.iter_records()]
        leftovers = sorted(n for n in os.listdir(lg.directory) if n.endswith(TEMP_SUFFIXES))
        return recs, leftovers, lg.verify()
    finally:
        s.close()


def converge(root: str):
    """Clean the reopened store to the end: (records, checkpointed first dirty offset)."""
    with segstore.open(root, clock=clock) as s:
        s.compact("t", force=True)
        lg = s.partition("t", 0)
        recs = [(r.offset, r.key, r.value, r.timestamp) for r in lg.iter_records()]
        cp = s.cleaner_manager.all_cleaner_checkpoints().get(("t", 0))
        assert lg.verify() == []
        return recs, cp


def segment_bases(root: str) -> list:
    d = os.path.join(root, "t-0")
    return sorted(int(n[:20]) for n in os.listdir(d) if n.endswith(".log") and len(n) == 24)


def committed(calls) -> int:
    """Groups committed by these hook calls: each group swaps one new segment in."""
    return sum(1 for step, _ in calls if step == "swap")


class Scenario:
    """A pristine store, its records, a clean run's hook calls and the expected states."""

    def __init__(self, base, layout: str):
        self.layout = layout
        self.base = base
        self.pristine = str(base / "pristine")
        build(self.pristine, layout)
        self.pre = reopen(self.copy("pre-probe"))[0]
        self.bases = segment_bases(self.pristine)
        self.snaps = []   # (directory, committed groups, description)
        self.calls = []
        live = self.copy("live")
        s = segstore.open(live, clock=clock)
        lg = s.partition("t", 0)

        def snap(what):
            d = str(base / ("snap%03d" % len(self.snaps)))
            shutil.copytree(live, d)
            self.snaps.append((d, committed(self.calls), what))

        def hook(step, b):
            self.calls.append((step, b))
            snap(f"after {step} {b}")
        real_append, real_into = Cleaner._append, Cleaner._clean_into

        def append(self_, dest, out, n):
            real_append(self_, dest, out, n)
            snap(f"after writing {n} bytes into {dest.base_offset}.log.cleaned")

        def into(self_, lg_, source, dest, *a, **kw):
            snap(f"before filtering {source.base_offset} into {dest.base_offset}.log.cleaned")
            return real_into(self_, lg_, source, dest, *a, **kw)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Cleaner, "_append", append)
            mp.setattr(Cleaner, "_clean_into", into)
            mp.setattr(swap_module, "swap_hook", hook)
            self.stats = s.compact("t")
        self.post = [(r.offset, r.key, r.value, r.timestamp) for r in lg.iter_records()]
        s.close()
        assert len(self.stats) == 1 and not self.stats[0].map_full
        self.end = self.stats[0].end_offset
        assert self.end == 60
        self.states = self.expected_states()

    def copy(self, name: str) -> str:
        d = str(self.base / name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(self.pristine, d)
        return d

    def groups(self) -> list:
        """Offset ranges of the cleaning groups, in swap order, from the hook calls."""
        out, olds = [], []
        for step, b in self.calls + [("swap", None)]:
            if step == "swap" and olds:
                hi_i = self.bases.index(max(olds)) + 1
                out.append((min(olds), self.bases[hi_i]))
                olds = []
            elif step == "deleted":
                olds.append(b)
        return out

    def expected_states(self) -> list:
        latest = {}
        for o, k, _, _ in self.pre:
            if o < self.end and k is not None:
                latest[k] = o
        states = [self.pre]
        for lo, hi in self.groups():
            states.append([r for r in states[-1]
                           if not lo <= r[0] < hi or (r[1] is not None and latest[r[1]] == r[0])])
        return states


@pytest.fixture(scope="module", params=list(LAYOUTS))
def scenario(request, tmp_path_factory):
    return Scenario(tmp_path_factory.mktemp(request.param), request.param)


def test_the_clean_run_matches_the_replay(scenario):
    sc = scenario
    n_groups = {"one-group": 1, "groups": 6}[sc.layout]
    assert len(sc.groups()) == n_groups
    assert sc.groups()[0][0] == 0 and sc.groups()[-1][1] == 60
    assert len(sc.states) == n_groups + 1
    assert sc.states[-1] == sc.post
    assert sc.post != sc.pre and len(sc.post) < len(sc.pre)
    # Swap order: each group renames its new segment .swap, retires its old ones, renames back.
    steps = [s for s, _ in sc.calls]
    per_group = len(steps) // n_groups if sc.layout == "groups" else None
    if per_group:
        assert steps == ["swap", "deleted", "renamed"] * n_groups
    else:
        assert steps == ["swap"] + ["deleted"] * 6 + ["renamed"]


@pytest.mark.parametrize("clean_marker", [False, True])
def test_every_snapshot_reopens_to_one_whole_state(scenario, tmp_path, clean_marker):
    sc = scenario
    assert len(sc.snaps) >= len(sc.calls) + 2
    for i, (snap, c, what) in enumerate(sc.snaps):
        d = str(tmp_path / ("s%03d" % i))
        shutil.copytree(snap, d)
        recs, leftovers, problems = reopen(d, clean_marker)
        assert recs == sc.states[c], (sc.layout, what, c)
        assert leftovers == [] and problems == [], (sc.layout, what, leftovers, problems)
        assert reopen(d)[0] == sc.states[c]               # and the state is stable
        assert converge(d) == (sc.post, sc.end), (sc.layout, what)


def test_half_written_cleaned_files_are_discarded(scenario, tmp_path):
    """A .cleaned segment cut off in the middle of a batch, its index full of garbage: the
    group it belongs to was never committed, so its old segments stay. The group before it may
    wait beside it, written (its fsyncs running while the next group is filtered) and not yet
    swapped in: it was not committed either."""
    sc = scenario
    torn = 0
    for i, (snap, c, what) in enumerate(sc.snaps):
        if not what.startswith("after writing"):
            continue
        d = str(tmp_path / ("t%03d" % i))
        shutil.copytree(snap, d)
        pdir = os.path.join(d, "t-0")
        cleaned = sorted(n for n in os.listdir(pdir) if n.endswith(".log.cleaned"))
        assert 1 <= len(cleaned) <= 2, (what, cleaned)
        being_written = int(what.split(" into ")[1].split(".")[0])
        assert int(cleaned[-1].split(".")[0]) == being_written, (what, cleaned)
        path = os.path.join(pdir, cleaned[-1])
        size = os.path.getsize(path)
        assert size > 0
        os.truncate(path, size // 2 + 1)
        idx = path.replace(".log.cleaned", ".index.cleaned")
        with open(idx, "r+b" if os.path.exists(idx) else "wb") as f:
            f.write(os.urandom(16))
        recs, leftovers, problems = reopen(d)
        assert recs == sc.states[c], (sc.layout, what)
        assert leftovers == [] and problems == [], (sc.layout, what, leftovers, problems)
        torn += 1
    assert torn >= 1   # (a group whose records all go writes nothing to tear)


def _fork_and_wait(fn) -> int:
    """Run ``fn`` in a forked child that never returns into pytest; its wait status."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def test_crash_after_every_swap_step_in_a_child(scenario):
    """``os._exit`` right after hook call k (nothing closes, nothing is cleaned up)."""
    sc = scenario
    for k in range(0, len(sc.calls) + 1):
        d = sc.copy("exit-%d" % k)

        def child():
            s = segstore.open(d, clock=clock)
            seen = []

            def hook(step, b):
                seen.append(step)
                if len(seen) == k:
                    os._exit(0)
            if k == 0:    # before anything is swapped: after the first chunk is written
                real = Cleaner._append

                def append(self_, dest, out, n):
                    real(self_, dest, out, n)
                    os._exit(0)
                Cleaner._append = append
            swap_module.swap_hook = hook
            s.compact("t")
            os._exit(7)   # not reached for k <= len(calls)
        status = _fork_and_wait(child)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (k, status)
        if k == 0:  # groups whose records all go write nothing: they may be swapped already
            c = next(c for _, c, what in sc.snaps if what.startswith("after writing"))
        else:
            c = committed(sc.calls[:k])
        want = sc.states[c]
        recs, leftovers, problems = reopen(d)
        assert recs == want, (sc.layout, k, sc.calls[k - 1] if k else "first write")
        assert leftovers == [] and problems == []
        assert converge(d) == (sc.post, sc.end)
        shutil.rmtree(d)


def _count_calls(sc) -> int:
    d = sc.copy("count")
    r, w = os.pipe()
    status = _fork_and_wait(lambda: (os.close(r), cc.run("compact", d, w, SEED, None)))
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, data
    tag, n = data.split()[-2:]
    assert tag == b"C"
    # The whole run changed the store exactly as the in-process run did.
    assert reopen(d)[0] == sc.post
    return int(n)


def test_kill9_at_every_file_system_call_of_a_clean(scenario):
    """SIGKILL at the N-th mutating file-system call of ``store.compact`` (before, after, or in
    the middle of a pwrite), for every N (or an even sample): always one whole state, and the
    states only move forward with N."""
    sc = scenario
    total = _count_calls(sc)
    assert total > len(sc.calls)
    points = list(range(1, total + 1))
    if not EVERY_CALL and len(points) > 120:
        step = len(points) / 120
        points = sorted({points[int(i * step)] for i in range(120)} | {total})
    last_state = 0
    for n in points:
        d = sc.copy("kill")
        r, w = os.pipe()

        def child():
            os.close(r)
            cc.run("compact", d, w, SEED, crash_at=n)
        status = _fork_and_wait(child)
        os.close(w)
        out = b""
        while chunk := os.read(r, 65536):
            out += chunk
        os.close(r)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (n, out)
        recs, leftovers, problems = reopen(d)
        matches = [g for g, st in enumerate(sc.states) if st == recs]
        assert matches, (sc.layout, n, "the reopened log is not a whole state")
        g = matches[-1]
        assert g >= last_state, (sc.layout, n, g, last_state)
        last_state = g
        assert leftovers == [] and problems == [], (sc.layout, n, leftovers, problems)
        assert converge(d) == (sc.post, sc.end), (sc.layout, n)
    assert last_state == len(sc.states) - 1   # the last kill points come after every swap


def test_kill9_during_the_recovery_of_a_crashed_swap(scenario, tmp_path):
    """The open that completes (or rolls back) a crashed swap is itself SIGKILLed at each of its
    mutating file-system calls; the next open still finds the same whole state."""
    sc = scenario
    picked = [(d, c, w) for d, c, w in sc.snaps if w.startswith(("after swap", "after deleted"))]
    assert picked
    for i, (snap, c, what) in enumerate(picked[:4]):
        n, done = 0, False
        while not done:
            n += 1
            d = str(tmp_path / ("r%d-%d" % (i, n)))
            shutil.copytree(snap, d)
            r, w = os.pipe()

            def child():
                os.close(r)
                cc.Crasher(n, random.Random(n), w).install()
                segstore.open(d, clock=clock)
                os.write(w, b"opened\n")
                os._exit(0)
            status = _fork_and_wait(child)
            os.close(w)
            out = os.read(r, 100)
            os.close(r)
            done = os.WIFEXITED(status) and out == b"opened\n"
            if not done:
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            recs, leftovers, problems = reopen(d)
            assert recs == sc.states[c], (sc.layout, what, n)
            assert leftovers == [] and problems == [], (sc.layout, what, n, leftovers)
            shutil.rmtree(d)
        assert n > 2, (what, n)   # the recovery did write something


# -- kill -9 at random moments while a cleaner thread cleans and appends go on --------------------


def _gen_records(leo: int) -> list:
    return [(o, *cc.record(o)) for o in range(leo)]


def _check_killed_store(path: str, where: str) -> int:
    """Every record genuine, offsets increasing, each key's latest record present, no temp
    files, verify() clean; a full clean of a copy gives exactly the replay. Returns the LEO."""
    with segstore.open(path, config=cc.STORE_CONFIG, clock=cc.clock) as s:
        lg = s.partition(cc.TOPIC, 0)
        leo = lg.log_end_offset
        recs = [(r.offset, r.key, r.value, r.timestamp) for r in lg.iter_records()]
        assert lg.verify() == [], where
        assert not [n for n in os.listdir(lg.directory) if n.endswith(TEMP_SUFFIXES)], where
    offsets = [r[0] for r in recs]
    assert offsets == sorted(set(offsets)), where
    written = _gen_records(leo)
    for r in recs:
        assert r == written[r[0]], (where, r)
    latest = {}
    for o, k, _, _ in written:
        if k is not None:
            latest[k] = o
    present = set(offsets)
    missing = [o for o in latest.values() if o not in present]
    assert not missing, (where, "latest records lost", missing[:5])
    # Clean a copy to the end with a map big enough for one round: exactly the replay.
    probe = path + ".probe"
    shutil.rmtree(probe, ignore_errors=True)
    shutil.copytree(path, probe)
    big = dict(cc.STORE_CONFIG, **{"log.cleaner.dedupe.buffer.size": 1 << 20})
    with segstore.open(probe, config=big, clock=cc.clock) as s:
        lg = s.partition(cc.TOPIC, 0)
        lg.roll()
        s.compact(cc.TOPIC, force=True)
        cp = s.cleaner_manager.all_cleaner_checkpoints()[(cc.TOPIC, 0)]
        assert cp == lg.log_end_offset, where
        got = [(r.offset, r.key, r.value, r.timestamp) for r in lg.iter_records()]
    want = sorted(set(latest.values()))
    assert got == [written[o] for o in want], where
    shutil.rmtree(probe)
    return leo


def _start_workload(path: str, seed: int, exec_mode: bool):
    if exec_mode:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(segstore.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "child_cleaner.py"),
                                 "workload", path, str(seed)], stdout=subprocess.PIPE, env=env)
        return proc.pid, proc.stdout.fileno(), proc
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            cc.run("workload", path, w, seed)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(w)
    return pid, r, None


def _kill_after(pid: int, fd: int, proc, delay: float) -> bytes:
    """Read reports; SIGKILL ``delay`` seconds after the child reported its open."""
    chunks, deadline = [], None
    t_end = time.monotonic() + 60
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            os.kill(pid, signal.SIGKILL)
            break
        if now > t_end:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the workload child never opened its store")
        ready, _, _ = select.select([fd], [], [], 0.01)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
            if deadline is None and b"O " in b"".join(chunks):
                deadline = time.monotonic() + delay
    if proc is not None:
        status = proc.wait()
        assert status == -signal.SIGKILL, (status, b"".join(chunks)[-300:])
        proc.stdout.close()
    else:
        _, st = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGKILL, b"".join(chunks)[-300:]
        while data := os.read(fd, 65536):
            chunks.append(data)
        os.close(fd)
    out = b"".join(chunks)
    assert b"\nE " not in b"\n" + out, out[-2000:]
    return out


@pytest.mark.parametrize("exec_mode", [False, True])
def test_kill9_while_a_cleaner_thread_cleans(tmp_path, exec_mode):
    """Compounding kills on one store: each child reopens what the last one left (recovery),
    appends and rolls while its cleaner thread cleans, and dies by SIGKILL at a random time."""
    rng = random.Random(SEED + exec_mode)
    path = str(tmp_path / "store")
    kills = KILLS if not exec_mode else max(KILLS // 3, 2)
    last_leo = 0
    for run in range(kills):
        pid, fd, proc = _start_workload(path, SEED * 1000 + run, exec_mode)
        out = _kill_after(pid, fd, proc, rng.choice((0.05, 0.15, 0.3, 0.6)))
        reports = [ln.split() for ln in out.decode().splitlines() if ln]
        appended = [int(x[1]) for x in reports if x[0] == "A"]
        where = f"kill {run} (seed {SEED}, exec={exec_mode})"
        leo = _check_killed_store(path, where)
        # A SIGKILL loses no completed append (the page cache survives the process).
        if appended:
            assert leo >= appended[-1], (where, leo, appended[-1])
        assert leo >= last_leo, where
        last_leo = leo
    assert last_leo > 0
