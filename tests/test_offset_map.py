"""The cleaner's dedupe map, ``segstore._core.OffsetMap`` (REF §6.12, §7 #10-13).

Oracle: :class:`ModelMap`, a plain-Python SkimpyOffsetMap written from REF §6.12 alone: the key's
16-byte digest is ``mmh3.hash_bytes(key)`` (MurmurHash3 x64-128, as the issue specifies instead of
MD5); attempt ``i`` reads the big-endian int32 window at digest byte ``min(i, 12)``, adds
``max(0, i - 12)`` with Java int wrap-around, takes ``abs`` with ``abs(Integer.MIN_VALUE) = 0``
and reduces modulo the slot count. Every computed slot counts one probe; ``put`` fails on a map
with ``entries >= slots`` before counting anything; ``get`` gives up after ``slots + 12`` attempts.
The model's slot choices are compared with the compiled map through the ``probes`` counter, which
differs as soon as one probe lands elsewhere. That exactness holds for maps of at most 65,536
slots; a larger map probes a table that starts at 65,536 slots and doubles whenever it is half
full (our deliberate difference: few keys in a big buffer stay cache-resident), so for those the
tests compare contents, limits and counters with a dict instead.
"""

from __future__ import annotations

import math
import struct

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segstore import _core
from segstore._core import OffsetMap

INT_MIN = -(2 ** 31)


# -- the model --------------------------------------------------------------------------------

def window(digest: bytes, attempt: int) -> int:
    """The signed big-endian int32 at digest byte ``min(attempt, 12)``."""
    i = min(attempt, len(digest) - 4)
    return struct.unpack(">i", digest[i:i + 4])[0]


def probe_slot(digest: bytes, attempt: int, slots: int, min_is_zero: bool = True) -> int:
    """Kafka's positionOf / slots (REF §6.12). ``min_is_zero=False`` is the naive abs, used only
    to show that a test tells the two apart."""
    p = window(digest, attempt) + max(0, attempt - len(digest) + 4)
    p = (p + 2 ** 31) % 2 ** 32 - 2 ** 31            # Java int addition wraps
    if p == INT_MIN:
        a = 0 if min_is_zero else 2 ** 31
    else:
        a = abs(p)
    return a % slots


class ModelMap:
    """SkimpyOffsetMap in plain Python, with the KIP-280 value rule for strategy maps."""

    def __init__(self, slots: int, strategy: bool = False, min_is_zero: bool = True):
        self.slots = slots
        self.strategy = strategy
        self.min_is_zero = min_is_zero
        self.table: list = [None] * slots     # [digest, offset, value] or None
        self.entries = 0
        self.lookups = 0
        self.probes = 0
        self.latest = -1

    def put(self, key: bytes, offset: int, value: int = 0) -> int:
        """Returns the slot written (or the slot of the equal digest)."""
        if self.entries >= self.slots:
            raise OverflowError("full")
        d = mmh3.hash_bytes(key)
        self.lookups += 1
        attempt = 0
        while True:
            s = probe_slot(d, attempt, self.slots, self.min_is_zero)
            self.probes += 1
            e = self.table[s]
            if e is None:
                self.table[s] = [d, offset, value]
                self.entries += 1
                self.latest = offset
                return s
            if e[0] == d:
                if not self.strategy or value >= e[2]:
                    e[1], e[2] = offset, value
                self.latest = offset
                return s
            attempt += 1

    def get(self, key: bytes) -> int:
        d = mmh3.hash_bytes(key)
        self.lookups += 1
        for attempt in range(self.slots + 12):
            s = probe_slot(d, attempt, self.slots, self.min_is_zero)
            self.probes += 1
            e = self.table[s]
            if e is None:
                return -1
            if e[0] == d:
                return e[1]
        return -1


def assert_same(m: OffsetMap, model: ModelMap) -> None:
    assert (m.slots, m.size, m.lookups, m.probes, m.latest_offset) == \
        (model.slots, model.entries, model.lookups, model.probes, model.latest)


def keys(n: int, prefix: bytes = b"key-") -> list[bytes]:
    return [prefix + b"%d" % i for i in range(n)]


# -- digests and the probe sequence -----------------------------------------------------------

@pytest.mark.parametrize("key", [b"", b"a", b"abc", b"x" * 15, b"x" * 16, b"x" * 17,
                                 bytes(range(256))])
def test_digest_is_murmur3_x64_128_of_the_key(key):
    assert _core.murmur3_128(key) == mmh3.hash_bytes(key)


def test_probe_counts_follow_the_model_while_a_small_map_fills():
    # 13 slots filled to the last one: later keys collide, walk windows 1..12 and then probe
    # linearly past attempt 12; the counters and every answer agree with the model.
    slots = 13
    m, model = OffsetMap(24 * slots), ModelMap(slots)
    ks = keys(slots, b"fill-")
    for i, k in enumerate(ks):
        m.put(k, 100 + i)
        model.put(k, 100 + i)
        assert_same(m, model)
    assert m.size == slots and m.utilization == 1.0
    for i, k in enumerate(ks):
        assert m.get(k) == model.get(k) == 100 + i
        assert_same(m, model)
    # Some key must have needed more than 13 attempts to fill the last free slot, otherwise this
    # test never exercised the linear phase.
    assert model.probes - model.lookups > 0


def test_linear_phase_is_exercised_and_matches():
    # A full map: an absent key is probed slots + 12 times (13 windows, then linear).
    slots = 29
    m, model = OffsetMap(24 * slots), ModelMap(slots)
    for i, k in enumerate(keys(slots)):
        m.put(k, i)
        model.put(k, i)
    for k in keys(40, b"absent-"):
        before = m.probes
        assert m.get(k) == model.get(k) == -1
        assert m.probes - before == slots + 12
    assert_same(m, model)


@given(slots=st.integers(1, 40),
       ops=st.lists(st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 60),
                              st.integers(0, 2 ** 40)), max_size=120))
def test_random_operations_agree_with_the_model(slots, ops):
    m, model = OffsetMap(24 * slots + 23), ModelMap(slots)   # spare bytes hold no extra slot
    for op, k, off in ops:
        key = b"k%d" % k
        if op == "put":
            try:
                model.put(key, off)
            except OverflowError:
                with pytest.raises(OverflowError):
                    m.put(key, off)
            else:
                m.put(key, off)
        else:
            assert m.get(key) == model.get(key)
        assert_same(m, model)
    if model.lookups:
        assert m.collision_rate == pytest.approx((model.probes - model.lookups) / model.lookups)
    assert m.utilization == pytest.approx(model.entries / slots)


# A key whose last digest window (attempt 12) is 2^31 - 513: attempt 12 + 513 computes
# Integer.MIN_VALUE, whose abs Kafka takes as 0 (found by a search over "min-probe-<i>").
MIN_KEY = b"min-probe-1876049"
MIN_K = 513


def test_abs_of_integer_min_value_probes_slot_zero():
    assert window(mmh3.hash_bytes(MIN_KEY), 12) == 2 ** 31 - MIN_K
    # A slot count with no multiple between the window and 2^31 (so linear probing cannot reach
    # slot 0 before the MIN_VALUE attempt) and with 2^31 mod slots != 0 (so the naive abs picks
    # another slot).
    slots = next(s for s in range(MIN_K + 2, 5000) if 2 ** 31 % s > MIN_K)
    digest = mmh3.hash_bytes(MIN_KEY)
    # Fill every slot except 0 with keys whose first probe is that slot: one probe each.
    by_first: dict[int, bytes] = {}
    i = 0
    while len(by_first) < slots - 1:
        k = b"filler-%d" % i
        s = probe_slot(mmh3.hash_bytes(k), 0, slots)
        if s != 0 and s not in by_first and mmh3.hash_bytes(k) != digest:
            by_first[s] = k
        i += 1
    m, model, naive = OffsetMap(24 * slots), ModelMap(slots), ModelMap(slots, min_is_zero=False)
    for s, k in sorted(by_first.items()):
        m.put(k, s)
        assert model.put(k, s) == s
        naive.put(k, s)
    assert_same(m, model)
    assert all(probe_slot(digest, a, slots) != 0 for a in range(12 + MIN_K))
    before = m.probes
    m.put(MIN_KEY, 7)
    assert model.put(MIN_KEY, 7) == 0
    naive.put(MIN_KEY, 7)
    assert model.probes - before == 12 + MIN_K + 1
    assert naive.probes != model.probes       # the scenario tells the two rules apart
    assert m.probes == model.probes
    assert m.get(MIN_KEY) == 7 and m.size == slots


# -- REF §7 #10-13 -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [10, 100, 1000, 5000])
def test_put_get_round_trip(n):
    """#10: memory = keys x 48 bytes (half full)."""
    m = OffsetMap(n * 48)
    assert m.slots == n * 2
    ks = keys(n)
    for i, k in enumerate(ks):
        m.put(k, i)
    assert m.size == n
    assert all(m.get(k) == i for i, k in enumerate(ks))
    assert all(m.get(k) == -1 for k in keys(n, b"other-"))
    assert m.utilization == pytest.approx(0.5)


def test_clear_forgets_everything():
    """#11."""
    m = OffsetMap(24 * 100)
    ks = keys(60)
    for i, k in enumerate(ks):
        m.put(k, i + 1000)
    m.clear()
    assert (m.size, m.lookups, m.probes, m.latest_offset, m.utilization) == (0, 0, 0, -1, 0.0)
    assert m.collision_rate == 0.0
    assert all(m.get(k) == -1 for k in ks)
    assert m.lookups == 60
    # Reusable after a clear: the same probe counts as a fresh model.
    model = ModelMap(100)
    for k in ks:
        model.get(k)
    for i, k in enumerate(ks[:30]):
        m.put(k, i)
        model.put(k, i)
    assert_same(m, model)


def test_full_map():
    """#12: a completely full map answers -1 for absent keys after a bounded probe, resolves
    present ones, and refuses any put (Kafka requires entries < slots before looking)."""
    slots = 50
    m = OffsetMap(24 * slots)
    ks = keys(slots)
    for i, k in enumerate(ks):
        m.put(k, i)
    assert m.size == slots and m.utilization == 1.0
    assert all(m.get(k) == i for i, k in enumerate(ks))
    before = m.probes
    assert m.get(b"not-there") == -1
    assert m.probes - before == slots + 12
    state = (m.size, m.lookups, m.probes, m.latest_offset)
    with pytest.raises(OverflowError):
        m.put(b"new-key", 99)
    with pytest.raises(OverflowError):
        m.put(ks[0], 99)
    assert (m.size, m.lookups, m.probes, m.latest_offset) == state
    assert m.get(ks[0]) == 0


def test_latest_offset():
    """#13: the offset of the last put (even a smaller one, even an overwrite), overridable."""
    m = OffsetMap(24 * 10)
    assert m.latest_offset == -1
    m.put(b"a", 5)
    assert m.latest_offset == 5
    m.put(b"b", 3)
    assert m.latest_offset == 3
    m.put(b"a", 9)
    assert m.latest_offset == 9 and m.get(b"a") == 9 and m.size == 2
    m.update_latest_offset(1234)
    assert m.latest_offset == 1234
    m.put(b"c", 10)
    assert m.latest_offset == 10
    m.clear()
    assert m.latest_offset == -1


def test_counters_and_rates():
    m = OffsetMap(24 * 7)
    assert (m.slots, m.bytes_per_entry, m.max_desired_size) == (7, 24, int(7 * 0.9))
    model = ModelMap(7)
    for i, k in enumerate(keys(7)):
        m.put(k, i)
        model.put(k, i)
    for k in keys(9, b"q"):
        m.get(k)
        model.get(k)
    assert_same(m, model)
    assert m.collision_rate == pytest.approx((model.probes - model.lookups) / model.lookups)
    assert m.collision_rate > 0
    assert len(m) == m.size == 7


@pytest.mark.parametrize("memory,slots", [(24, 1), (47, 1), (48, 2), (24 * 1000 + 5, 1000)])
def test_slots_from_memory(memory, slots):
    m = OffsetMap(memory)
    assert m.slots == slots and m.memory == memory


@pytest.mark.parametrize("lf,desired", [(0.9, 90), (0.75, 75), (1.0, 100), (0.001, 0)])
def test_max_desired_size(lf, desired):
    assert OffsetMap(2400, load_factor=lf).max_desired_size == desired


@pytest.mark.parametrize("memory,strategy", [(0, "offset"), (23, "offset"), (-24, "offset"),
                                             (31, "timestamp"), (24, "header")])
def test_memory_too_small(memory, strategy):
    with pytest.raises(ValueError):
        OffsetMap(memory, strategy=strategy, header_key="h" if strategy == "header" else None)


@pytest.mark.parametrize("kw", [dict(load_factor=0.0), dict(load_factor=1.01),
                                dict(load_factor=-0.5), dict(strategy="newest"),
                                dict(strategy="header"), dict(strategy="header", header_key="")])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        OffsetMap(2400, **kw)


# -- KIP-280 strategies ------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["timestamp", "header"])
def test_strategy_map_keeps_the_larger_value(strategy):
    m = OffsetMap(32 * 10, strategy=strategy, header_key="v" if strategy == "header" else None)
    assert (m.slots, m.bytes_per_entry, m.strategy) == (10, 32, strategy)
    m.put(b"k", 1, 100)
    m.put(b"k", 2, 50)             # smaller value: the entry stays
    assert m.get(b"k") == 1
    assert m.latest_offset == 2    # but the latest offset follows every put
    m.put(b"k", 3, 100)            # tie: the later put wins
    assert m.get(b"k") == 3
    m.put(b"k", 4, 101)
    assert m.get(b"k") == 4
    m.put(b"k", 5, -(2 ** 63))     # "no header" loses to any value
    assert m.get(b"k") == 4
    assert m.size == 1


@given(slots=st.integers(1, 12),
       puts=st.lists(st.tuples(st.integers(0, 15), st.integers(-3, 3)), max_size=60))
def test_strategy_map_agrees_with_the_model(slots, puts):
    m, model = OffsetMap(32 * slots, strategy="timestamp"), ModelMap(slots, strategy=True)
    for off, (k, value) in enumerate(puts):
        key = b"k%d" % k
        try:
            model.put(key, off, value)
        except OverflowError:
            with pytest.raises(OverflowError):
                m.put(key, off, value)
        else:
            m.put(key, off, value)
        assert_same(m, model)
    for k in range(16):
        assert m.get(b"k%d" % k) == model.get(b"k%d" % k)
    assert_same(m, model)


def test_offset_map_ignores_values():
    m = OffsetMap(24 * 4)
    m.put(b"k", 1, 100)
    m.put(b"k", 2, 5)
    assert m.get(b"k") == 2


def test_a_dedupe_buffer_holds_max_desired_keys():
    # The default capacity arithmetic of REF §6.12 with 24-byte entries.
    m = OffsetMap(134_217_728)
    assert m.slots == 5_592_405
    assert m.max_desired_size == math.floor(5_592_405 * 0.9) == 5_033_164


# -- large maps: the growing probed table -----------------------------------------------------

INITIAL_TABLE = 1 << 16


def test_a_large_map_grows_its_table_and_keeps_every_mapping():
    """Contents against a dict through several doublings; stats count the configured slots."""
    import random

    slots = 1_000_000
    m = OffsetMap(24 * slots)
    assert m.slots == slots and m.table_slots == INITIAL_TABLE
    rnd = random.Random(11)
    model = {}
    names = [b"key-%d" % i for i in range(150_000)]
    for offset in range(400_000):
        k = names[rnd.randrange(len(names))]
        m.put(k, offset)
        model[k] = offset
        if offset % 50_000 == 0:
            assert m.table_slots >= min(slots, 2 * m.size)  # never more than half full
    assert m.size == len(model)
    # Doubled from 65,536 just often enough to stay at most half full.
    assert m.table_slots == INITIAL_TABLE * 2 ** math.ceil(math.log2(2 * m.size / INITIAL_TABLE))
    assert m.table_slots // 4 < m.size <= m.table_slots // 2
    assert all(m.get(k) == v for k, v in model.items())
    assert m.get(b"absent") == -1
    assert m.utilization == m.size / slots
    assert m.latest_offset == 399_999
    m.clear()
    assert (m.size, m.table_slots, m.get(names[0])) == (0, INITIAL_TABLE, -1)


def test_a_large_map_fills_at_exactly_its_configured_limit():
    """Growth never changes when building stops: int(slots x load factor) keys, as Kafka."""
    slots = 200_003
    m = OffsetMap(24 * slots, load_factor=0.75)
    n = 200_000
    keys_col = _core.encode_columns(
        _binary([b"v"] * n), _binary([b"k%d" % i for i in range(n)]), 0,
        records_per_batch=1000).data
    full, position, read, _ = _core.build_offset_map(m, keys_col, 0, len(keys_col), 0)
    assert full and read == m.size == m.max_desired_size == int(slots * 0.75)
    assert m.table_slots == slots  # grown to the whole buffer before the limit
    assert 0 < position < len(keys_col)
    assert m.get(b"k0") == 0 and m.get(b"k%d" % (m.size - 1)) == m.size - 1
    assert m.get(b"k%d" % m.size) == -1


def test_a_large_strategy_map_grows_and_keeps_the_larger_values():
    slots = 300_000
    m = OffsetMap(32 * slots, strategy="timestamp")
    model = {}
    for offset in range(200_000):
        k = b"s%d" % (offset % 90_000)
        value = (offset * 7919) % 1000
        m.put(k, offset, value)
        if k not in model or value >= model[k][1]:
            model[k] = (offset, value)
    assert m.table_slots > INITIAL_TABLE and m.size == len(model)
    assert all(m.get(k) == off for k, (off, _) in model.items())


def _binary(values):
    from segstore.columns import BinaryColumn
    return BinaryColumn.from_pylist(values)


def test_growth_jumps_to_the_whole_buffer_before_the_scratch_copy_passes_32_mib():
    """Growing copies the old table aside; from 16 MiB on, the next step is the whole buffer,
    so a round never needs more than 32 MiB beyond its dedupe buffer."""
    slots = 4_000_000                       # 96 MB
    m = OffsetMap(24 * slots)
    seen = []
    for i in range(1_500_000):
        m.put(b"g%d" % i, i)
        if not seen or seen[-1] != m.table_slots:
            seen.append(m.table_slots)
    assert seen[0] == INITIAL_TABLE and seen[-1] == slots
    assert all(b == 2 * a for a, b in zip(seen, seen[1:-1]))    # doublings, then one jump
    assert seen[-2] * 24 * 2 > 32 << 20 >= seen[-2] * 24        # the jump started at <= 32 MiB
    assert m.get(b"g0") == 0 and m.get(b"g1499999") == 1_499_999


# -- the digest's short-key fast path and the offset-strategy build kernel --------------------

@pytest.mark.parametrize("length", range(65))
def test_digest_equals_mmh3_for_every_key_length_up_to_64(length):
    """The 16-byte straight-line digest and the general loop both give mmh3's digest; seeds too,
    and keys at every alignment (the digest loads 8 bytes at a time)."""
    import random
    rnd = random.Random(length)
    buf = bytes(rnd.getrandbits(8) for _ in range(length + 8))
    for off in range(8):
        key = buf[off:off + length]
        assert _core.murmur3_128(key) == mmh3.hash_bytes(key)
    for seed in (1, 0x9747b28c, 2 ** 32 - 1):
        assert _core.murmur3_128(buf[:length], seed) == mmh3.hash_bytes(buf[:length], seed)


@given(st.lists(st.binary(min_size=0, max_size=80), min_size=1, max_size=50))
def test_digests_of_random_keys_equal_mmh3(ks):
    for k in ks:
        assert _core.murmur3_128(k) == mmh3.hash_bytes(k)
    col = _binary(ks)
    got = _core.murmur3_128_digests(col)
    assert [g.tobytes() for g in got] == [mmh3.hash_bytes(k) for k in ks]


def _batches(spec):
    """Encoded v2 batches: spec = list of (base offset, [key or None]) (key lengths vary)."""
    return b"".join(bytes(_core.encode_batch([b"v%d" % i for i in range(len(ks))], keys=ks,
                                             timestamps_ms=1, base_offset=base))
                    for base, ks in spec)


def _build_both(data, slots, load_factor, start_offset, end_offset):
    out = []
    for plain in (True, False):
        _core._use_plain_map_kernel(plain)
        try:
            m = OffsetMap(24 * slots, load_factor=load_factor)
            res = _core.build_offset_map(m, data, 0, len(data), start_offset,
                                         end_offset=end_offset, validate_crc=True)
        finally:
            _core._use_plain_map_kernel(True)
        out.append((m, res))
    return out


key_or_none = st.one_of(st.none(), st.integers(0, 40).map(lambda i: b"k" * (i % 7) + b"%d" % i),
                        st.binary(max_size=33))


@given(st.lists(st.lists(key_or_none, min_size=1, max_size=40), min_size=1, max_size=6),
       st.integers(2, 300), st.sampled_from([0.5, 0.75, 0.9, 1.0]), st.integers(0, 60),
       st.one_of(st.none(), st.integers(0, 200)))
def test_plain_build_kernel_matches_the_general_one(batches, slots, load_factor, start, end):
    """The offset-strategy kernel (keys hashed a group ahead of their puts, counters in locals)
    answers exactly as the general per-record kernel: stopping point, counts, every counter
    and every key's offset, also when the map fills mid-batch or records lie outside
    [start, end)."""
    spec, base = [], 0
    for ks in batches:
        spec.append((base, ks))
        base += len(ks) + 3
    data = _batches(spec)
    (mp, rp), (mg, rg) = _build_both(data, slots, load_factor, start, end)
    assert rp == rg
    assert (mp.size, mp.lookups, mp.probes, mp.latest_offset) == \
        (mg.size, mg.lookups, mg.probes, mg.latest_offset)
    for _, ks in spec:
        for k in ks:
            if k is not None:
                assert mp.get(k) == mg.get(k)


def test_plain_build_kernel_matches_the_general_one_across_table_growth():
    """A large map grows while the plain kernel has keys hashed ahead: their slots are
    recomputed for the larger table and every mapping agrees with the general kernel."""
    n_keys = 150_000
    spec = [(b, [b"key-%d" % ((b + i) * 7919 % n_keys) for i in range(500)])
            for b in range(0, 400_000, 500)]
    data = _batches(spec)
    (mp, rp), (mg, rg) = _build_both(data, 1_000_000, 0.9, 0, None)
    assert rp == rg
    assert mp.table_slots > INITIAL_TABLE
    assert (mp.size, mp.lookups, mp.latest_offset) == (mg.size, mg.lookups, mg.latest_offset)
    want = {}
    for b, ks in spec:
        for i, k in enumerate(ks):
            want[k] = b + i
    assert mp.size == len(want)
    assert all(mp.get(k) == off for k, off in want.items())


def test_plain_build_kernel_stops_mid_batch_like_the_general_one_on_a_large_map():
    """The map fills in the middle of a batch after growing: same position, same count read."""
    slots = 70_000
    spec = [(b, [b"u%d" % (b + i) for i in range(1000)]) for b in range(0, 80_000, 1000)]
    data = _batches(spec)
    (mp, rp), (mg, rg) = _build_both(data, slots, 0.9, 0, None)
    assert rp == rg and rp[0] and rp[2] == int(slots * 0.9)
    assert (mp.size, mp.lookups, mp.latest_offset) == (mg.size, mg.lookups, mg.latest_offset)


def test_clear_with_a_table_hint_starts_at_a_size_growth_would_reach():
    """clear(table_hint) starts the probed table at the first size of the growth sequence that
    reaches the hint (the whole buffer at most), and the map answers as one that grew there."""
    slots = 1_000_003
    m = OffsetMap(24 * slots)
    sizes = [m.table_slots]
    for i in range(480_000):             # grow through the whole sequence
        m.put(b"h%d" % i, i)
        if m.table_slots != sizes[-1]:
            sizes.append(m.table_slots)
    assert sizes == [INITIAL_TABLE, 2 * INITIAL_TABLE, 4 * INITIAL_TABLE, 8 * INITIAL_TABLE, slots]
    for hint in (0, 1, INITIAL_TABLE, INITIAL_TABLE + 1, 200_000, 600_000, 10 ** 9):
        m.clear(hint)
        assert m.table_slots == next((t for t in sizes if t >= hint), slots) and m.size == 0
        for i in range(0, 150_000, 7):
            m.put(b"h%d" % i, i)
        assert all(m.get(b"h%d" % i) == i for i in range(0, 150_000, 7))
        assert m.get(b"h1") == -1
    m.clear()
    assert m.table_slots == INITIAL_TABLE
