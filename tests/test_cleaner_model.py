"""Regressions found by a model-based test of the log cleaner (added in a later commit)."""

from __future__ import annotations

import os
import shutil

import segstore
from conftest import FakeClock
from segstore.records import ControlRecordType

T0 = 1_700_000_000_000
TOPIC = "t"
COMMIT, ABORT = ControlRecordType.COMMIT, ControlRecordType.ABORT


# -- regressions the model found, reduced -------------------------------------------------------

def _store(tmp_path, clock, **topic):
    store = segstore.open(str(tmp_path / "s"), clock=clock)
    store.create_topic(TOPIC, 1, config={"cleanup.policy": "compact", "segment.bytes": 1 << 20,
                                         "min.cleanable.dirty.ratio": 0.0, **topic})
    return store, store.partition(TOPIC, 0)


def test_an_aborted_compressed_batch_that_is_not_its_producers_last_is_dropped(tmp_path):
    # An aborted batch is dropped whole (DELETE), so the cleaner did not decompress it, but the
    # filter kernel refused a compressed batch without its records: the round failed with
    # "a compressed batch needs its decompressed records" and the partition was quarantined.
    # Only when the producer wrote again later (else its last batch is kept as a header).
    store, lg = _store(tmp_path, FakeClock(T0))
    try:
        lg.append_batch([b"a", b"b"], keys=[b"k", b"k"], compression="gzip", producer_id=1,
                        producer_epoch=1, base_sequence=0, is_transactional=True)
        lg.append_control(ABORT, producer_id=1, producer_epoch=1)
        lg.roll()
        lg.append_batch([b"c"], keys=[b"k"], producer_id=1, producer_epoch=2,
                        base_sequence=0, is_transactional=True)
        lg.append_control(COMMIT, producer_id=1, producer_epoch=2)
        lg.roll()
        stats = store.compact(TOPIC, 0, force=True)
        assert len(stats) == 1 and stats[0].end_offset == 5
        assert [(r.offset, r.value) for r in lg.iter_records()] == [(3, b"c")]
        assert store.metrics()["uncleanable-partitions-count"] == 0
        assert lg.verify() == []
    finally:
        store.close()


def test_segments_recovered_after_a_crash_have_trimmed_indexes(tmp_path):
    # Recovery rebuilt a segment's indexes into files preallocated to segment.index.bytes and
    # left them so: after a crash every sealed segment at or above the recovery point had two
    # 10 MiB index files until a clean close (REF §4.3 step 4 trims them).
    clock = FakeClock(T0)
    root = tmp_path / "s"
    store, lg = _store(tmp_path, clock)
    for i in range(3):
        lg.append_batch([b"v%d" % i], keys=[b"k%d" % i])
        lg.roll()
    lg.append_batch([b"v3"], keys=[b"k3"])
    shutil.copytree(root, tmp_path / "crashed")    # no clean shutdown, no checkpoints
    store.close()
    store = segstore.open(str(tmp_path / "crashed"), clock=clock)
    try:
        lg = store.partition(TOPIC, 0)
        assert [s.base_offset for s in lg.segments] == [0, 1, 2, 3]
        for seg in lg.segments[:-1]:
            assert os.path.getsize(seg.offset_index.path) == 0
            assert os.path.getsize(seg.time_index.path) <= 12
        assert [r.value for r in lg.iter_records()] == [b"v0", b"v1", b"v2", b"v3"]
        assert lg.offset_for_time(T0)[:1] == (0,)
        lg.append_batch([b"v4"], keys=[b"k4"])        # the active segment's are preallocated
        assert lg.verify() == []
    finally:
        store.close()
