"""``segstore plan-cleaner``'s arithmetic checked against the cleaner itself.

Oracle: a real ``segstore._core.OffsetMap`` of the bytes the plan names, fed a dirty section by
``_core.build_offset_map`` (the cleaner's own map building), and a real store cleaning with
``log.cleaner.dedupe.buffer.size`` set to the plan's ``buffer_needed``. The plan's "fits" must
be true exactly when the map does not fill up and the store cleans in one round.
"""

from __future__ import annotations

import pytest

import segstore
from segstore import _core
from segstore.cleaner.map_build import dedupe_buffer_for
from segstore.cli.plan_cleaner import BYTES_PER_KEY, plan_cleaner

TS = 1_700_000_000_000


def dirty_section(keys: int) -> bytes:
    """Every key written, then every key updated: ``keys`` distinct keys, each seen again after
    the last new one, as in a dirty section with updates."""
    names = [b"key-%d" % i for i in range(keys)]
    first = _core.encode_batch([b"v"] * keys, keys=names, timestamps_ms=TS)
    again = _core.encode_batch([b"w"] * keys, keys=names, timestamps_ms=TS, base_offset=keys)
    return first + again


def map_fills(memory: int, load_factor: float, keys: int) -> bool:
    """Whether building an offset map of ``memory`` bytes over ``dirty_section(keys)`` stops on
    a full map."""
    omap = _core.OffsetMap(memory, load_factor)
    buf = dirty_section(keys)
    full, _, _, _ = _core.build_offset_map(omap, buf, 0, len(buf), 0)
    return full


CASES = [(1, 0.9, 1), (7, 0.9, 1), (9, 0.9, 1), (90, 0.9, 2), (100, 0.75, 1), (1000, 0.5, 4),
         (999, 0.9, 3), (37, 1.0, 1), (250, 0.3, 2)]


@pytest.mark.parametrize("keys,load_factor,threads", CASES)
def test_buffer_needed_is_the_smallest_map_that_holds_the_keys(keys, load_factor, threads):
    """The plan's ``buffer_needed`` per thread maps ``keys`` keys without filling; one more key
    fills it; one slot less fills it with ``keys`` keys. The plan says so in each case."""
    need = plan_cleaner(keys, threads=threads, load_factor=load_factor).buffer_needed
    per_thread = need // threads
    assert per_thread * threads == need and per_thread % BYTES_PER_KEY == 0
    for n in (keys, keys + 1):
        plan = plan_cleaner(n, threads=threads, buffer_size=need, load_factor=load_factor)
        assert plan.fits == (n == keys)
        assert plan.fits == (not map_fills(per_thread, load_factor, n))
        assert plan.rounds_worst == (1 if plan.fits else 2)
    smaller = need - BYTES_PER_KEY * threads
    plan = plan_cleaner(keys, threads=threads, buffer_size=smaller, load_factor=load_factor)
    assert not plan.fits and map_fills(smaller // threads, load_factor, keys)


@pytest.mark.parametrize("slots,load_factor", [(10, 0.9), (1000, 0.5), (3, 0.75), (40, 1.0)])
def test_keys_per_round_is_where_the_map_fills(slots, load_factor):
    """For a given buffer, the plan fits one key fewer than its keys per round (the map's fill
    limit), and the map agrees: it fills with exactly keys-per-round keys."""
    buffer_size = slots * BYTES_PER_KEY
    limit = plan_cleaner(1, buffer_size=buffer_size, load_factor=load_factor).keys_per_round
    assert limit == _core.OffsetMap(buffer_size, load_factor).max_desired_size
    for n in (limit - 1, limit):
        if n < 1:
            continue
        plan = plan_cleaner(n, buffer_size=buffer_size, load_factor=load_factor)
        assert plan.fits == (n < limit) == (not map_fills(buffer_size, load_factor, n))


def test_buffer_needed_is_minimal_at_load_factor_0_7():
    # (20 + 1) / 0.7 is 30.000000000000004 in floating point: ceil() would advise 31 slots.
    need = plan_cleaner(20, load_factor=0.7).buffer_needed
    assert need == 30 * BYTES_PER_KEY
    assert map_fills(need - BYTES_PER_KEY, 0.7, 20)
    assert not map_fills(need, 0.7, 20)


@pytest.mark.parametrize("load_factor", [0.5, 0.7, 0.75, 0.9, 0.95, 0.99])
def test_dedupe_buffer_for_is_the_fewest_slots_that_hold_the_keys(load_factor):
    for keys in list(range(0, 300)) + [10**5 + 7, 987_654]:
        slots = dedupe_buffer_for(keys, load_factor) // BYTES_PER_KEY
        assert int(slots * load_factor) > keys
        assert slots == 1 or int((slots - 1) * load_factor) <= keys


def _store(root, buffer_size: int, threads: int, load_factor: float, keys: int):
    st = segstore.open(str(root), config={"log.cleaner.dedupe.buffer.size": buffer_size,
                                          "log.cleaner.threads": threads,
                                          "log.cleaner.io.buffer.load.factor": load_factor})
    st.create_topic("t", 1, config={"cleanup.policy": "compact", "segment.bytes": 1 << 20})
    lg = st.partition("t", 0)
    names = [b"key-%d" % i for i in range(keys)]
    for rep in range(2):
        lg.append_batch([b"v%d" % rep] * keys, keys=names, timestamps_ms=[TS] * keys)
    lg.roll()
    return st, lg


@pytest.mark.parametrize("keys,load_factor,threads", [(9, 0.9, 1), (100, 0.9, 2),
                                                      (1000, 0.5, 1)])
def test_store_with_buffer_needed_cleans_in_one_round(tmp_path, keys, load_factor, threads):
    """A compacted topic of ``keys`` distinct keys (each written twice) with the plan's
    ``buffer_needed`` cleans in one round; one slot a thread less stops the first round on a
    full map before the end of the dirty section."""
    need = plan_cleaner(keys, threads=threads, load_factor=load_factor).buffer_needed
    st, lg = _store(tmp_path / "enough", need, threads, load_factor, keys)
    with st:
        [one] = st.compact("t", 0, force=True)
        assert not one.map_full and one.end_offset == 2 * keys
        assert sorted(r.key for r in lg.iter_records()) == sorted(b"key-%d" % i
                                                                  for i in range(keys))
    st, lg = _store(tmp_path / "short", need - BYTES_PER_KEY * threads, threads, load_factor,
                    keys)
    with st:
        rounds = st.compact("t", 0, force=True)
        assert rounds[0].map_full and rounds[0].end_offset < 2 * keys and len(rounds) > 1
