"""Session 14's mends: a read-only log's producer view starts from the writer's snapshot, and
object decode allocates records untracked.

Expectations come from Kafka's rules (REF §2.5, §4.2): the producer state a writer holds knows
producers whose batches retention deleted (the roll snapshot carries them); a reader of the same
directory must see the same producers, or a dry-run cleaner plan would drop the last batch of a
producer the real cleaner keeps.
"""

from __future__ import annotations

import gc

from conftest import FakeClock
from segstore import _core
from segstore.config import TopicConfig
from segstore.log import PartitionLog

T0 = 1_700_000_000_000


def open_log(path, **kw):
    return PartitionLog(str(path), "t", 0, TopicConfig.from_dict({}), FakeClock(T0), **kw)


def test_read_only_active_producers_match_the_writers_after_retention(tmp_path):
    lg = open_log(tmp_path)
    lg.append_batch([b"a0", b"a1"], producer_id=7, producer_epoch=3, base_sequence=0)  # 0-1
    lg.append_batch([b"p2"])
    lg.roll()                                                                          # 3
    lg.append_batch([b"b3"], producer_id=9, producer_epoch=1, base_sequence=0)
    lg.append_batch([b"p4"])
    lg.delete_records(3)
    lg.delete_segments([lg.segments[0]])
    assert [s.base_offset for s in lg.segments] == [3]
    writer = lg.active_producers()
    assert writer == {7: (1, 3), 9: (3, 1)}  # producer 7 known from the roll's snapshot only
    ro = open_log(tmp_path, readonly=True, log_start_offset=3)
    assert ro.active_producers() == writer
    # A later batch of the writer shows up in the reader's view (its state is re-read).
    lg.append_batch([b"a5"], producer_id=7, producer_epoch=3, base_sequence=2)
    assert ro.active_producers() == lg.active_producers() == {7: (5, 3), 9: (3, 1)}
    ro.close()
    lg.close()


def test_read_only_active_producers_without_a_snapshot_replay_the_log(tmp_path):
    lg = open_log(tmp_path)
    lg.append_batch([b"a0"], producer_id=7, producer_epoch=0, base_sequence=0)
    ro = open_log(tmp_path, readonly=True)
    assert ro.active_producers() == lg.active_producers() == {7: (0, 0)}
    ro.close()
    lg.close()


def test_decoded_records_are_tracked_only_when_they_can_be_in_a_cycle():
    buf = _core.encode_batch([b"v0", b"v1"], [b"k0", None], base_offset=5)
    recs = _core.decode_records(buf, topic="t", partition=0)
    assert [(r.offset, r.key, r.value) for r in recs] == [(5, b"k0", b"v0"), (6, None, b"v1")]
    assert not any(gc.is_tracked(r) for r in recs)

    class Topic(str):  # a str subclass instance can hold a reference back to a record
        pass

    topic = Topic("t")
    recs = _core.decode_records(buf, topic=topic, partition=0)
    assert all(gc.is_tracked(r) for r in recs)
    topic.back = recs[0]  # the cycle topic -> record -> topic is collectable
    del recs, topic
    assert gc.collect() >= 0
    # Every slot was set: comparing, hashing and repr read each of them.
    again = _core.decode_records(buf)
    assert again == _core.decode_records(buf) and hash(again[0]) == hash(again[0])
    assert "value=b'v0'" in repr(again[0])
