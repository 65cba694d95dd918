"""cleaner/spare_memory.py: offset maps and output buffers kept for later rounds and stores."""

from __future__ import annotations

import pytest

import segstore
from conftest import FakeClock
from segstore import _core
from segstore.cleaner import spare_memory

T0 = 1_700_000_000_000


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch):
    monkeypatch.setattr(spare_memory, "_maps", [])
    monkeypatch.setattr(spare_memory, "_buffers", [])


def _compacted_store(path, n=3000, keys=300):
    s = segstore.open(str(path), clock=FakeClock(T0))
    s.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": 20_000})
    lg = s.partition("t", 0)
    for i in range(0, n, 100):
        lg.append_batch([b"v%d" % j for j in range(i, i + 100)],
                        keys=[b"k%d" % (j % keys) for j in range(i, i + 100)])
    return s, lg


def _latest_per_key(end, keys):
    """Plain replay: the latest record of each key among offsets [0, end)."""
    last = {}
    for j in range(end):
        last[b"k%d" % (j % keys)] = j
    return sorted((o, b"k%d" % (o % keys), b"v%d" % o) for o in last.values())


def _records(lg):
    return sorted((r.offset, r.key, r.value) for r in lg.iter_records())


def test_a_closed_stores_map_and_buffer_serve_the_next_store(tmp_path):
    s1, lg1 = _compacted_store(tmp_path / "a")
    s1.compact("t", force=True)
    worker = next(iter(s1.cleaner._workers[-1].values()))
    omap, out = worker.offset_map, worker._out
    s1.close()
    assert [m for _, m in spare_memory._maps] == [omap]
    assert spare_memory._buffers == [out]

    s2, lg2 = _compacted_store(tmp_path / "b", n=2000, keys=150)
    s2.compact("t", force=True)
    worker2 = next(iter(s2.cleaner._workers[-1].values()))
    assert worker2.offset_map is omap and worker2._out is out   # reused, not made anew
    # What the reused map and buffer produce is what the records say (the map was empty).
    active = lg2.segments[-1].base_offset   # never cleaned: the map covers [0, active)
    assert 0 < active < 2000
    assert [r for r in _records(lg2) if r[0] < active] == _latest_per_key(active, 150)
    assert [r[0] for r in _records(lg2) if r[0] >= active] == list(range(active, 2000))
    s2.close()


def test_a_reused_map_is_empty():
    m = spare_memory.new_map(1 << 20, 0.9)
    for i in range(1000):
        m.put(b"key-%d" % i, i)
    spare_memory.give_map(m)
    again = spare_memory.new_map(1 << 20, 0.9)
    assert again is m
    assert len(again) == 0 and again.latest_offset == -1
    assert all(again.get(b"key-%d" % i) == -1 for i in range(0, 1000, 7))
    again.put(b"key-3", 5000)
    assert again.get(b"key-3") == 5000


def test_maps_are_reused_only_with_the_same_parameters():
    m = spare_memory.new_map(1 << 20, 0.9)
    spare_memory.give_map(m)
    assert spare_memory.new_map(2 << 20, 0.9) is not m
    assert spare_memory.new_map(1 << 20, 0.5) is not m
    assert spare_memory.new_map(1 << 20, 0.9, "header", "h") is not m
    assert spare_memory.new_map(1 << 20, 0.9) is m
    h = spare_memory.new_map(1 << 20, 0.9, "header", "h")
    spare_memory.give_map(h, "h")
    assert spare_memory.new_map(1 << 20, 0.9, "header", "other") is not h
    assert spare_memory.new_map(1 << 20, 0.9, "header", "h") is h


def test_at_most_max_spare_are_kept():
    maps = [_core.OffsetMap(1 << 16, 0.9) for _ in range(spare_memory.MAX_SPARE + 2)]
    buffers = [spare_memory.new_buffer(4096) for _ in maps]
    for m, b in zip(maps, buffers):
        spare_memory.give_map(m)
        spare_memory.give_buffer(b)
    assert [m for _, m in spare_memory._maps] == maps[-spare_memory.MAX_SPARE:]
    assert spare_memory._buffers == buffers[-spare_memory.MAX_SPARE:]


class _FakeMap:
    def __init__(self, table_slots, bytes_per_entry=24):
        self.table_slots, self.bytes_per_entry = table_slots, bytes_per_entry
        self.cleared = []

    def clear(self, keep_pages=False):
        self.cleared.append(keep_pages)


def test_a_large_tables_pages_go_back_to_the_os():
    small = _FakeMap(spare_memory.KEPT_TABLE_BYTES // 24)
    large = _FakeMap(spare_memory.KEPT_TABLE_BYTES // 24 + 1)
    spare_memory.clear_for_reuse(small)
    spare_memory.clear_for_reuse(large)
    assert small.cleared == [True] and large.cleared == [False]


def test_a_buffer_is_reused_only_at_its_size():
    b = spare_memory.new_buffer(1 << 16)
    spare_memory.give_buffer(b)
    assert spare_memory.new_buffer(1 << 17) is not b
    assert spare_memory.new_buffer(1 << 16) is b


def test_a_buffer_grown_for_an_outsized_batch_is_not_kept():
    big = spare_memory.new_buffer(spare_memory.MAX_BUFFER_BYTES + 4096)
    spare_memory.give_buffer(big)
    assert spare_memory._buffers == []
