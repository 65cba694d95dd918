"""A crash at every step of a segment swap (REF §2.2; ports of REF §7 #28 and #47).

A log of several segments gets "cleaned" segments, written as ``.cleaned`` the way the cleaner
writes them (a subset of the old segments' batches, copied verbatim, always keeping each group's
last batch so the new segments span the old offsets), or the way a split writes them (every batch,
cut into several segments). ``PartitionLog.replace_segments(new, old)`` then swaps them in with
``segstore.log_swap.swap_hook`` calling ``os._exit`` right after step k -- "swap" (a new segment
renamed ``.cleaned`` -> ``.swap``, highest first), "deleted" (an old segment renamed
``.deleted``), "renamed" (a new segment's ``.swap`` dropped) -- in a forked child, so no cleanup
runs. The parent reopens the directory (as after a clean and after an unclean shutdown) and checks
that the log holds exactly the records from before the swap or exactly those from after it, never
a mix and never a loss: before while any new segment is still ``.cleaned``, after from the moment
every new segment is ``.swap``.

File states the hook cannot stop in -- part of one segment's files renamed, a single index file
left as ``.swap`` -- are built by renaming files of a snapshot directly.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

from segstore import _core, log_swap as swap_module
from segstore.config import TopicConfig
from segstore.log import PartitionLog
from segstore.segment import CLEANED_SUFFIX, SWAP_SUFFIX, LogSegment

T0 = 1_700_000_000_000
CONFIG = {"segment.bytes": 1400, "index.interval.bytes": 120, "segment.index.bytes": 4096}

# Scenarios: (old segment indexes, how the new segments are made).
SCENARIOS = {
    "one-for-one": ([1], "clean"),
    "three-into-one": ([1, 2, 3], "clean"),
    "first-two-into-one": ([0, 1], "clean"),
    "each-of-three": ([2, 3, 4], "clean-each"),
    "split-in-three": ([2], "split"),
    "active-neighbour": ([4], "clean"),  # the last sealed segment, next to the active one
}


def clock():
    return T0


def config():
    return TopicConfig.from_dict(CONFIG)


def build_log(directory: str) -> list[tuple]:
    """A closed log of 6+ segments; returns every record as (offset, key, value)."""
    lg = PartitionLog(directory, "t", 0, config(), clock)
    rng = random.Random(1)
    for i in range(80):
        n = rng.choice((1, 2, 4))
        keys = [b"k%d" % rng.randrange(12) for _ in range(n)]
        lg.append_batch([b"v%d-%d" % (i, j) * 6 for j in range(n)], keys,
                        timestamps_ms=[T0 + i] * n)
    assert len(lg.segments) >= 6, len(lg.segments)
    recs = [(r.offset, r.key, r.value) for r in lg.iter_records()]
    lg.close()
    return recs


def batches_of(seg: LogSegment):
    data = bytes(seg.buffer(seg.size))
    return data, _core.scan_batches(data, validate_crc=True).batches


def write_cleaned(directory: str, base: int, parts: list[bytes]) -> LogSegment:
    """A ``.cleaned`` segment at ``base`` holding these whole batches, flushed and trimmed."""
    seg = LogSegment(directory, base, config(), clock, suffix=CLEANED_SUFFIX)
    data = b"".join(parts)
    seg.append(data, _core.scan_batches(data).batches)
    seg.on_become_inactive()
    seg.flush()
    return seg


def make_new_segments(lg: PartitionLog, old: list, how: str, rng: random.Random):
    """Cleaned (or split) segments replacing ``old``; returns (segments, kept batch bases)."""
    pieces = []  # (batch bytes, base offset) in offset order, over the whole group
    for seg in old:
        data, b = batches_of(seg)
        pieces += [(data[int(r["position"]):int(r["position"] + r["size"])], int(r["base_offset"]),
                    seg.base_offset) for r in b]
    if how == "split":
        keep = pieces
    else:
        # Drop about half the batches; always keep the last of each group (REF §7 #44), so the
        # new segments span every offset the old ones did.
        last_of = {}
        for i, (_, _, seg_base) in enumerate(pieces):
            last_of[seg_base] = i
        keep_last = set(last_of.values()) if how == "clean-each" else {len(pieces) - 1}
        keep = [p for i, p in enumerate(pieces) if i in keep_last or rng.random() < 0.5]
    new = []
    if how == "clean":
        new.append(write_cleaned(lg.directory, old[0].base_offset, [p[0] for p in keep]))
    elif how == "clean-each":
        for seg in old:
            new.append(write_cleaned(lg.directory, seg.base_offset,
                                     [p[0] for p in keep if p[2] == seg.base_offset]))
    else:  # split into three: new bases at batch boundaries inside the old segment
        cuts = [0, len(keep) // 3, 2 * len(keep) // 3, len(keep)]
        for a, b in zip(cuts, cuts[1:]):
            base = old[0].base_offset if a == 0 else keep[a][1]
            new.append(write_cleaned(lg.directory, base, [p[0] for p in keep[a:b]]))
    return new, {p[1] for p in keep}


def expected_after(pre: list[tuple], old_range: tuple[int, int], kept_bases: set,
                   directory_records) -> list[tuple]:
    lo, hi = old_range
    return [r for r in pre if not lo <= r[0] < hi or directory_records(r[0]) in kept_bases]


def run_swap(directory: str, scenario: str, crash_after, snapshot_dir=None):
    """Open the log, write the new segments, swap them in. ``crash_after``: None = finish;
    0 = os._exit before the swap starts; k = os._exit right after hook call k. With
    ``snapshot_dir``, copy the directory after every hook call instead of crashing."""
    olds, how = SCENARIOS[scenario]
    lg = PartitionLog(directory, "t", 0, config(), clock)
    old = [lg.segments[i] for i in olds]
    new, kept = make_new_segments(lg, old, how, random.Random(scenario))
    if crash_after == 0:
        os._exit(0)
    calls = []

    def hook(step, base):
        calls.append((step, base))
        if snapshot_dir is not None:
            shutil.copytree(directory, os.path.join(snapshot_dir, "%02d" % len(calls)))
        elif crash_after is not None and len(calls) == crash_after:
            os._exit(0)
    swap_module.swap_hook = hook
    try:
        lg.replace_segments(new, old)
    finally:
        swap_module.swap_hook = None
    return lg, calls


def batch_base_of(pre_dir_batches):
    def base(offset):
        for b, last in pre_dir_batches:
            if b <= offset <= last:
                return b
        raise KeyError(offset)
    return base


def group_info(pristine: str, scenario: str):
    """(old offset range, kept batch bases, number of hook calls, new segment count)."""
    d = pristine + "-probe"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(pristine, d)
    olds, how = SCENARIOS[scenario]
    lg = PartitionLog(d, "t", 0, config(), clock)
    old = [lg.segments[i] for i in olds]
    segs = lg.segments
    lo = old[0].base_offset
    nxt = segs.index(old[-1]) + 1
    hi = segs[nxt].base_offset if nxt < len(segs) else lg.log_end_offset
    all_batches = []
    for s in segs:
        _, b = batches_of(s)
        all_batches += [(int(r["base_offset"]), int(r["last_offset"])) for r in b]
    new, kept = make_new_segments(lg, old, how, random.Random(scenario))
    n_new = len(new)
    lg.close()
    for s in new:
        s.close()
    shutil.rmtree(d)
    return (lo, hi), kept, 2 * n_new + len(olds), n_new, batch_base_of(all_batches)


def reopen_records(directory: str, clean: bool):
    kw = {} if clean else dict(had_clean_shutdown=False, recovery_point=0)
    lg = PartitionLog(directory, "t", 0, config(), clock, **kw)
    try:
        recs = [(r.offset, r.key, r.value) for r in lg.iter_records()]
        problems = lg.verify()
        leftovers = [n for n in os.listdir(directory)
                     if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, ".deleted"))]
        offsets = [r[0] for r in recs]
        assert offsets == sorted(set(offsets))
        return recs, problems, leftovers
    finally:
        lg.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("swap") / "t-0")
    recs = build_log(d)
    return d, recs


def _fork(fn) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_crash_after_every_swap_step(tmp_path, pristine, scenario):
    src, pre = pristine
    old_range, kept, steps, n_new, base_of = group_info(src, scenario)
    post = expected_after(pre, old_range, kept, base_of)
    # The cleaning removed something; the split removes nothing.
    assert (post == pre) == (SCENARIOS[scenario][1] == "split")
    for k in range(0, steps + 2):  # steps + 1: the swap finished, then the crash
        for clean in (True, False):
            d = str(tmp_path / f"k{k}-{clean}" / "t-0")
            shutil.copytree(src, d)
            crash = None if k == steps + 1 else k

            def child():
                run_swap(d, scenario, crash)
                os._exit(0)  # finished: still no close, no cleanup
            _fork(child)
            recs, problems, leftovers = reopen_records(d, clean)
            want = pre if k < n_new else post
            assert recs == want, (scenario, k, clean, "pre" if want is pre else "post")
            assert problems == [], (scenario, k, problems)
            assert leftovers == [], (scenario, k, leftovers)
            # And again: the completed or rolled-back state is stable.
            assert reopen_records(d, True)[0] == want


def test_swap_without_crash_then_clean_close(tmp_path, pristine):
    src, pre = pristine
    for scenario in SCENARIOS:
        old_range, kept, steps, _, base_of = group_info(src, scenario)
        d = str(tmp_path / scenario / "t-0")
        shutil.copytree(src, d)
        lg, calls = run_swap(d, scenario, None)
        assert len(calls) == steps
        assert [(r.offset, r.key, r.value) for r in lg.iter_records()] == \
            expected_after(pre, old_range, kept, base_of)
        lg.close()
        recs, problems, leftovers = reopen_records(d, True)
        assert recs == expected_after(pre, old_range, kept, base_of)
        assert problems == [] and leftovers == []


# -- file states between the hook's steps -------------------------------------------------------


def _snapshots(tmp_path, src, scenario):
    d = str(tmp_path / "live" / "t-0")
    shutil.copytree(src, d)
    snaps = str(tmp_path / "snaps")
    os.makedirs(snaps)
    lg, calls = run_swap(d, scenario, None, snapshot_dir=snaps)
    lg.close()
    return [os.path.join(snaps, n) for n in sorted(os.listdir(snaps))], calls


def _state_from(snapshot: str, dest: str, renames: dict) -> str:
    shutil.copytree(snapshot, dest)
    for a, b in renames.items():
        os.replace(os.path.join(dest, a), os.path.join(dest, b))
    return dest


@pytest.mark.parametrize("scenario", ["one-for-one", "three-into-one", "each-of-three",
                                      "split-in-three"])
def test_partial_renames_inside_one_segment(tmp_path, pristine, scenario):
    """REF §7 #28/#47: a crash between the renames of one segment's files."""
    src, pre = pristine
    old_range, kept, steps, n_new, base_of = group_info(src, scenario)
    post = expected_after(pre, old_range, kept, base_of)
    snaps, calls = _snapshots(tmp_path, src, scenario)
    cases = []
    # 1. The last new segment to be swapped (the lowest base) half renamed .cleaned -> .swap:
    #    its log is .swap, its indexes still .cleaned => rolled back.
    before_last_swap = snaps[n_new - 2] if n_new > 1 else None
    lowest = min(b for s, b in calls if s == "swap")
    state = before_last_swap or _only_cleaned_state(tmp_path, src, scenario)
    cases.append(("log .swap, indexes .cleaned", state,
                  {f"{lowest:020d}.log.cleaned": f"{lowest:020d}.log.swap"}, pre))
    # 2. Every new segment .swap except one index file of the lowest => rolled back (a .cleaned
    #    file remains at the lowest base, so every .swap at or above it is incomplete).
    all_swapped = snaps[n_new - 1]
    cases.append(("one index still .cleaned", all_swapped,
                  {f"{lowest:020d}.index.swap": f"{lowest:020d}.index.cleaned"}, pre))
    # 3. All renamed but one index file left as .swap => completed.
    done = snaps[-1]
    renamed = [b for s, b in calls if s == "renamed"]
    for suffix in (".index", ".timeindex"):
        base = renamed[-1]
        cases.append((f"single {suffix} left as .swap", done,
                      {f"{base:020d}{suffix}": f"{base:020d}{suffix}.swap"}, post))
    # 4. A new segment's log renamed, its indexes still .swap (the middle of step 4).
    mid = snaps[n_new + len(SCENARIOS[scenario][0]) - 1]  # every old one .deleted, none renamed
    base = renamed[0]
    cases.append(("log renamed, indexes .swap", mid,
                  {f"{base:020d}.log.swap": f"{base:020d}.log"}, post))
    for i, (what, snap, renames, want) in enumerate(cases):
        for clean in (True, False):
            d = _state_from(snap, str(tmp_path / f"case{i}-{clean}" / "t-0"), renames)
            recs, problems, leftovers = reopen_records(d, clean)
            assert recs == want, (scenario, what, clean)
            assert problems == [] and leftovers == [], (scenario, what, problems, leftovers)


def _only_cleaned_state(tmp_path, src, scenario) -> str:
    d = str(tmp_path / "only-cleaned" / "t-0")
    shutil.copytree(src, d)
    _fork(lambda: run_swap(d, scenario, 0))
    return d


def test_swap_leftovers_of_an_old_crash_next_to_new_data(tmp_path, pristine):
    """A finished-swap state (some .swap files) is completed even after more appends followed
    in later sessions that never reopened the log (the files are all that matter)."""
    src, pre = pristine
    scenario = "three-into-one"
    old_range, kept, steps, n_new, base_of = group_info(src, scenario)
    post = expected_after(pre, old_range, kept, base_of)
    snaps, _ = _snapshots(tmp_path, src, scenario)
    d = _state_from(snaps[n_new], str(tmp_path / "s" / "t-0"), {})
    lg = PartitionLog(d, "t", 0, config(), clock, had_clean_shutdown=False, recovery_point=0)
    assert [(r.offset, r.key, r.value) for r in lg.iter_records()] == post
    lg.append_batch([b"after"], [b"k"], timestamps_ms=[T0])
    lg.close()
    assert reopen_records(d, True)[0] == post + [(post[-1][0] + 1, b"k", b"after")]
