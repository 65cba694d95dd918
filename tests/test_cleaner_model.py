"""Regressions found by a model-based test of the log cleaner (added in a later commit)."""

from __future__ import annotations

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
