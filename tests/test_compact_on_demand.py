"""store.compact called from several threads at once: each call cleans with its own offset map
and output buffer, and every partition ends up exactly as a plain-Python replay says."""

from __future__ import annotations

import random
import threading

import pytest

import segstore
from segstore.errors import CorruptRecordError
from conftest import FakeClock


def replay(batches):
    latest = {}
    for keys, values in batches:
        for k, v in zip(keys, values):
            latest[k] = v
    return latest


def test_concurrent_on_demand_compactions_do_not_share_a_map(tmp_path):
    clock = FakeClock(1_700_000_000_000)
    store = segstore.open(str(tmp_path / "s"), clock=clock,
                          config={"log.cleaner.dedupe.buffer.size": 1 << 20})
    store.create_topic("t", 4, {"cleanup.policy": "compact", "segment.bytes": 1 << 20})
    rnd = random.Random(7)
    written = {}
    for p in range(4):
        lg = store.partition("t", p)
        batches = []
        for b in range(120):   # about 4 segments a partition, keys differ per partition
            keys = [b"p%d-k%d" % (p, rnd.randrange(300)) for _ in range(40)]
            values = [b"v%d-%d-%d" % (p, b, i) + b"x" * 200 for i in range(40)]
            lg.append_batch(values, keys=keys)
            batches.append((keys, values))
        lg.roll()
        written[p] = replay(batches)
    errors, results = [], {}

    def run(p):
        try:
            results[p] = store.compact("t", p, force=True)
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for p in range(4):
        assert len(results[p]) == 1 and results[p][0].partition == p
        lg = store.partition("t", p)
        after = {r.key: r.value for r in lg.iter_records()}
        assert after == written[p]
        assert len(list(lg.iter_records())) == len(written[p])
        assert lg.verify() == []
    store.close()


def _corrupt_store(tmp_path, which):
    clock = FakeClock(1_700_000_000_000)
    store = segstore.open(str(tmp_path / "s"), clock=clock)
    store.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": 1 << 20})
    lg = store.partition("t", 0)
    for b in range(100):
        lg.append_batch([b"v%d" % b + b"x" * 300] * 30, keys=[b"k%d" % i for i in range(30)])
    lg.roll()
    if which == "clean":            # clean the first segments, then add dirty data after them
        store.compact("t", 0, force=True)
        for b in range(100):
            lg.append_batch([b"w%d" % b + b"y" * 300] * 30, keys=[b"k%d" % i for i in range(30)])
        lg.roll()
    seg = lg.segments[0]
    before = [s.base_offset for s in lg.segments]
    files = sorted(p.name for p in (tmp_path / "s" / "t-0").iterdir())
    with open(seg.log_path, "r+b") as f:   # a value byte of the first batch's last record
        f.seek(seg.scan(0).batches["size"][0] - 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x55]))
    return store, lg, seg, before, files


@pytest.mark.parametrize("which", ["dirty", "clean"])
def test_a_corrupt_batch_fails_the_round_and_changes_nothing(tmp_path, which):
    """A CRC mismatch in the dirty section (caught while mapping) or in the clean section
    (caught while filtering) raises CorruptRecordError naming the file and batch; nothing is
    swapped, no .cleaned file stays, and the partition is quarantined."""
    store, lg, seg, before, files = _corrupt_store(tmp_path, which)
    with pytest.raises(CorruptRecordError) as e:
        store.compact("t", 0, force=True)
    assert e.value.file == seg.log_path and e.value.position == 0
    assert sorted(p.name for p in (tmp_path / "s" / "t-0").iterdir()) == files
    assert [s.base_offset for s in lg.segments] == before
    assert store.metrics()["uncleanable-partitions-count"] == 1
    assert store.compact("t", 0) == []          # quarantined: skipped unless forced
    store.close()


def test_cleaned_output_is_gathered_before_each_write(tmp_path, monkeypatch):
    """The cleaner writes its output OUTPUT_GATHER bytes or more at a time (only a source
    segment's last piece is smaller), not once per input chunk, so cleaned segments come into
    the page cache in large folios; what it writes is still the latest value of every key."""
    import numpy as np

    from segstore.cleaner import cleaner as cleaner_mod
    from segstore.columns import BinaryColumn

    gather = 6 << 20   # more than what one 4 MiB input chunk filters to
    monkeypatch.setattr(cleaner_mod, "OUTPUT_GATHER", gather)
    monkeypatch.setattr(cleaner_mod, "MIN_CHUNK", 4 << 20)   # input chunks of 4 MiB
    pieces = []
    real_append = cleaner_mod.Cleaner._append

    def append(self, dest, out, n):
        pieces.append((dest.base_offset, n))
        return real_append(self, dest, out, n)

    monkeypatch.setattr(cleaner_mod.Cleaner, "_append", append)
    store = segstore.open(str(tmp_path / "s"), clock=FakeClock(1_700_000_000_000))
    store.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": 64 << 20})
    lg = store.partition("t", 0)
    n = 150_000   # about 18 MB: five 4 MiB input chunks, most records kept
    keys = np.zeros((n, 8), dtype=np.uint8)
    ids = np.arange(n, dtype=np.int64) % 140_000  # 10,000 keys written twice
    keys[:] = ids.view(np.uint8).reshape(n, 8)
    values = np.arange(n, dtype=np.int64).repeat(13).view(np.uint8).reshape(n, 104)
    lg.append_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys))
    lg.roll()
    assert store.compact("t", 0, force=True)
    assert len(pieces) >= 3
    assert all(size >= gather for _, size in pieces[:-1])
    latest = {bytes(keys[i]): bytes(values[i]) for i in range(n)}
    after = {r.key: r.value for r in lg.iter_records()}
    assert after == latest and lg.verify() == []
    store.close()
