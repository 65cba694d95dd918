"""A writable open after a clean shutdown: what it must not do for the partitions nobody uses.

Every Spark commit opens the whole store writable, so its cost per partition matters: one
listing of each directory, no walk of batch headers a clean close's producer snapshot already
covers, and the active segment's indexes mapped and grown (Kafka's resizeIndexes) only when
first used. Behaviour must not change: appends after the open do not roll early, and a
damaged index of the active segment is still rebuilt.
"""

from __future__ import annotations

import os

import pytest

import segstore
from segstore import segment as segment_mod
from segstore.topic import PARTITION_MARKER

from conftest import FakeClock

INDEX_BYTES = 4096
CONFIG = {"log.index.size.max.bytes": INDEX_BYTES, "log.index.interval.bytes": 1}


def _store(tmp_path, parts=3):
    path = str(tmp_path / "s")
    with segstore.open(path, CONFIG, clock=FakeClock()) as s:
        s.create_topic("t", parts)
        for p in range(parts):
            for i in range(5):
                s.partition("t", p).append_batch([b"v%d" % i], keys=[b"k"])
    return path


def _index_sizes(path, p):
    d = os.path.join(path, f"t-{p}")
    return {n: os.path.getsize(os.path.join(d, n)) for n in sorted(os.listdir(d))
            if n.endswith((".index", ".timeindex"))}


def test_the_active_indexes_grow_at_the_first_append_not_at_the_open(tmp_path):
    path = _store(tmp_path)
    trimmed = {p: _index_sizes(path, p) for p in range(3)}
    assert all(size < INDEX_BYTES for sizes in trimmed.values() for size in sizes.values())
    with segstore.open(path, CONFIG, clock=FakeClock()) as s:
        assert {p: _index_sizes(path, p) for p in range(3)} == trimmed  # untouched by the open
        lg = s.partition("t", 0)
        lg.append_batch([b"after"])
        assert _index_sizes(path, 0) == {f"{0:020d}.index": INDEX_BYTES // 8 * 8,  # room
                                         f"{0:020d}.timeindex": INDEX_BYTES // 12 * 12}
        assert _index_sizes(path, 1) == trimmed[1]
        assert len(lg.segments) == 1
    assert _index_sizes(path, 0)[f"{0:020d}.index"] <= 6 * 8  # trimmed again at the close
    assert {p: _index_sizes(path, p) for p in (1, 2)} == {p: trimmed[p] for p in (1, 2)}


@pytest.mark.parametrize("first_use", ["read", "offset_for_time", "append"])
def test_appends_after_a_clean_open_fill_the_index_before_rolling(tmp_path, first_use):
    # Whatever maps the active segment's indexes first, they are grown before anyone sees
    # them: a trimmed index would look full and roll a segment at the first append.
    path = _store(tmp_path, parts=1)
    with segstore.open(path, CONFIG, clock=FakeClock()) as s:
        lg = s.partition("t", 0)
        if first_use == "read":
            assert [r.value for r in lg.read(2, max_records=1)] == [b"v2"]
        elif first_use == "offset_for_time":
            lg.offset_for_time(0)
        for i in range(INDEX_BYTES // 8 - 10):
            lg.append_batch([b"x%d" % i])
        assert len(lg.segments) == 1
        assert lg.read(5 + 100, max_records=1)[0].value == b"x100"


def test_a_clean_open_loads_a_log_at_its_first_use_with_one_listing(tmp_path, monkeypatch):
    path = _store(tmp_path, parts=4)
    listed, walked = [], []
    real_listdir = os.listdir
    real_headers = segment_mod.LogSegment.read_batch_headers

    def listdir(d="."):
        listed.append(os.path.basename(os.fspath(d)))
        return real_listdir(d)

    def read_batch_headers(self, *args, **kwargs):
        walked.append(self.log_path)
        return real_headers(self, *args, **kwargs)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(segment_mod.LogSegment, "read_batch_headers", read_batch_headers)
    s = segstore.open(path, CONFIG, clock=FakeClock())
    try:
        assert not [d for d in listed if d.startswith("t-")]   # no log loaded by the open
        lg = s.partition("t", 2)
        # One listing serves the segments and the producer snapshots; the close's snapshot
        # is at the log end, so no batch header is replayed.
        assert [d for d in listed if d.startswith("t-")] == ["t-2"]
        assert walked == []
        assert lg.log_end_offset == 5 and lg.producer_state.map_end_offset == 5
        assert s.partition("t", 2) is lg
        assert s.end_offsets([segstore.TopicPartition("t", 0)]) == \
            {segstore.TopicPartition("t", 0): 5}
        assert sorted(d for d in listed if d.startswith("t-")) == ["t-0", "t-2"]
    finally:
        monkeypatch.undo()
        s.close()


def test_leftovers_are_still_cleaned_and_listed_again(tmp_path):
    path = _store(tmp_path, parts=1)
    d = os.path.join(path, "t-0")
    for name in (f"{7:020d}.log.deleted", f"{7:020d}.index.deleted", "x.truncating"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"junk")
    with segstore.open(path, CONFIG, clock=FakeClock()) as s:
        assert [r.value for r in s.partition("t", 0).read(0)] == [b"v%d" % i for i in range(5)]
    left = sorted(n for n in os.listdir(d) if n != PARTITION_MARKER)
    assert not [n for n in left if n.endswith((".deleted", ".truncating"))], left


def test_a_damaged_active_index_is_rebuilt_at_its_first_use(tmp_path):
    path = _store(tmp_path, parts=1)
    index = os.path.join(path, "t-0", f"{0:020d}.index")
    with open(index, "r+b") as f:   # entries whose offsets go back: fails the sanity check
        f.write(bytes.fromhex("0000000300000000" "0000000100000040"))
    with segstore.open(path, CONFIG, clock=FakeClock()) as s:
        lg = s.partition("t", 0)
        assert [r.value for r in lg.read(3)] == [b"v3", b"v4"]
        lg.append_batch([b"after"])
        assert len(lg.segments) == 1
        assert os.path.getsize(index) == INDEX_BYTES
        assert [r.value for r in lg.read(4)] == [b"v4", b"after"]
