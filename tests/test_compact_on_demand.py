"""store.compact called from several threads at once: each call cleans with its own offset map
and output buffer, and every partition ends up exactly as a plain-Python replay says."""

from __future__ import annotations

import random
import threading

import segstore
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
