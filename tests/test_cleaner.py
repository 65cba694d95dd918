"""The log cleaner: one round of Kafka's Cleaner (REF §6.4-§6.13), ported from REF §7 #31-33,
#37-46 and #48-50 (Kafka's LogCleanerTest), plus KIP-534 horizons, every codec, the summary text
and the dedupe-buffer advice.

Two ways in, as in Kafka's tests: ``store.compact`` (the whole round through the manager), and
``segstore.cleaner.Cleaner`` built directly around an ``OffsetMap`` so a test can hand the
filter a map of its own (keys mapped to a huge offset are removed wherever they are, as with
Kafka's FakeOffsetMap). Expectations come from what the test appended and from ``struct`` /
kafka-python / aiokafka parses of the ``.log`` files; time moves only through a FakeClock.

Where a Kafka test does not apply to segstore it says so next to the port.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import crc32c
import numpy as np
import pytest
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record.memory_records import MemoryRecords as KpMemoryRecords

import segstore
from conftest import FakeClock, batch_spans, legacy_message, legacy_wrapper, map_rss_kib, v2_header
from segstore import TopicPartition, _core
from segstore.cleaner import Cleaner, CleanerStats, PreCleanStats, Throttler, group_segments_by_size
from segstore.cleaner.transactions import CleanedTransactionMetadata
from segstore.errors import CleaningAbortedError, CorruptRecordError, InvalidTopicError
from segstore.producer_state import ProducerStateManager
from segstore.records import ControlRecordType
from segstore.transaction_index import collect_aborted_transactions
from keyless import append_batch_unvalidated

T0 = 1_700_000_000_000
INT_MAX = 2 ** 31 - 1
HUGE = 2 ** 62
MB = 1024 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TP = TopicPartition("t", 0)
ATTR_DELETE_HORIZON = 0x40


# -- fixtures and helpers ----------------------------------------------------------------------

@pytest.fixture
def clock():
    return FakeClock(T0)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


def open_store(root, clock, **cfg):
    """A store whose cleaner maps stay small (a 128 MiB map is zeroed every round)."""
    conf = {"log.cleaner.dedupe.buffer.size": 24 * 4096}
    conf.update({k.replace("_", "."): v for k, v in cfg.items()})
    return segstore.open(root, config=conf, clock=clock)


def compacted_topic(store, name="t", partitions=1, **cfg):
    conf = {"cleanup.policy": "compact", "segment.bytes": 1024, "min.cleanable.dirty.ratio": 0.0,
            "delete.retention.ms": 1000}
    conf.update({k.replace("_", "."): v for k, v in cfg.items()})
    store.create_topic(name, partitions, config=conf)
    return store.partition(name, 0)


def kv(i) -> bytes:
    return b"%d" % i


def records(lg) -> list[tuple]:
    """(offset, key, value) of every record from the log start."""
    return [(r.offset, r.key, r.value) for r in lg.iter_records()]


def offsets(lg) -> list[int]:
    return [r.offset for r in lg.iter_records()]


def keys_in_log(lg) -> list[bytes]:
    """Keys of records with a value (Kafka's keysInLog)."""
    return [r.key for r in lg.iter_records() if r.value is not None]


def live_keys(recs) -> set:
    """Keys whose last record in ``recs`` has a value (a plain replay)."""
    last = {}
    for _, k, v in recs:
        last[k] = v
    return {k for k, v in last.items() if v is not None}


def read_file(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def segment_batches(seg) -> list[dict]:
    """The v2 headers of a segment file, parsed with struct alone."""
    data = read_file(seg.log_path)
    out = []
    for pos, size in batch_spans(data):
        h = v2_header(data, pos)
        h["position"], h["size"] = pos, size
        h["bytes"] = data[pos:pos + size]
        out.append(h)
    return out


def all_batches(lg) -> list[dict]:
    return [b for seg in lg.segments for b in segment_batches(seg)]


def last_offsets(lg) -> list[int]:
    return [b["base_offset"] + b["last_offset_delta"] for b in all_batches(lg)]


def crc_ok(batch: bytes) -> bool:
    return struct.unpack_from(">I", batch, 17)[0] == crc32c.crc32c(batch[21:])


def kp_parse(data: bytes) -> list[tuple]:
    """Every batch of ``data`` through kafka-python: (base, last, crc ok, [(offset, ts, key,
    value, headers)])."""
    out, mr = [], KpMemoryRecords(data)
    while mr.has_next():
        b = mr.next_batch()
        out.append((b.base_offset, b.last_offset, b.validate_crc(),
                    [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
                     for r in b]))
    return out


def make_cleaner(clock, slots=4096, load_factor=0.9, check_done=None, strategy="offset",
                 io_buffer=1 << 20):
    omap = _core.OffsetMap(24 * slots if strategy == "offset" else 32 * slots, load_factor,
                           strategy)
    return Cleaner(0, omap, io_buffer, Throttler(float("inf")), clock, check_done=check_done)


def fake_map_cleaner(clock, keys, check_done=None):
    """A cleaner whose map says every key in ``keys`` was written at a huge offset (Kafka's
    FakeOffsetMap with Long.MaxValue): those keys go wherever they are, the rest stay."""
    cleaner = make_cleaner(clock, slots=max(2 * len(keys), 16), check_done=check_done)
    for k in keys:
        cleaner.offset_map.put(k, HUGE)
    return cleaner


def clean_group(cleaner, lg, group, now, upper, delete_retention_ms=None):
    """Kafka's cleanSegments: filter ``group`` with the cleaner's current map and swap it in.
    Returns the filter's counters."""
    dr = lg.config.delete_retention_ms if delete_retention_ms is None else delete_retention_ms
    filt = _core.BatchFilter(cleaner.offset_map, now, dr, upper)
    cleaner.clean_segments(lg, list(group), filt, CleanedTransactionMetadata(), now, -1, upper,
                           lg.truncations, CleanerStats())
    return filt.stats


def log_to_clean(store, lg, first_dirty, now):
    """The manager's LogToClean for ``lg`` with the given first dirty offset."""
    return store.cleaner_manager.log_to_clean(lg, first_dirty, now)


def fill_segments(lg, n, value=lambda off: kv(off), key=lambda off: kv(off), ts=None):
    """Append one record per batch (key and value from the offset) until ``n`` segments."""
    while len(lg.segments) < n:
        off = lg.log_end_offset
        lg.append_batch([value(off)], keys=[key(off)],
                        timestamps_ms=None if ts is None else [ts(off)])


def cleaned_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".cleaned" in n or ".swap" in n)


def write_partition(root, clock, segments, topic_cfg=None, indexes=True, **store_cfg):
    """Create topic ``t`` and replace its partition directory by hand-written segment files:
    ``segments`` maps base offset -> bytes of the .log file (empty index files are written so
    the loader keeps the data as is, unless ``indexes=False``). Returns the reopened store."""
    st = open_store(root, clock, **store_cfg)
    compacted_topic(st, **(topic_cfg or {}))
    pdir = st.partition("t", 0).directory
    st.close()
    for name in os.listdir(pdir):
        os.remove(os.path.join(pdir, name))
    for base, data in segments.items():
        with open(os.path.join(pdir, "%020d.log" % base), "wb") as f:
            f.write(data)
        for suffix in (".index", ".timeindex") if indexes else ():
            open(os.path.join(pdir, "%020d%s" % (base, suffix)), "wb").close()
    return open_store(root, clock, **store_cfg)


def v2(offset_keys_values, ts=T0, base=None, compression=0):
    """One v2 batch holding (offset, key, value) records (offsets may have gaps)."""
    offs = [o for o, _, _ in offset_keys_values]
    base = offs[0] if base is None else base
    return bytes(_core.encode_batch([v for _, _, v in offset_keys_values],
                                    [k for _, k, _ in offset_keys_values],
                                    timestamps_ms=[ts] * len(offs), base_offset=base,
                                    offset_deltas=[o - base for o in offs],
                                    compression=compression))


# -- #31 cleaning segments with a given map ----------------------------------------------------

def test_clean_segments_removes_exactly_the_mapped_keys(root, clock):
    """#31: keys mapped at a huge offset are removed from the three cleaned segments; bytes
    read = the three source segments' sizes; the fourth segment is not touched."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    fill_segments(lg, 4)
    assert keys_in_log(lg) == [kv(i) for i in range(lg.log_end_offset)]
    removed = [kv(k) for k in (1, 3, 5, 7, 9)]
    cleaner = fake_map_cleaner(clock, removed)
    group = lg.segments[:3]
    expected_read = sum(s.size for s in group)
    upper = group[-1].read_next_offset()
    kept_batches = [b["bytes"] for s in group for b in segment_batches(s)
                    if kv(b["base_offset"]) not in removed]
    fourth = read_file(lg.segments[3].log_path)
    should_remain = [k for k in keys_in_log(lg) if k not in removed]

    f = clean_group(cleaner, lg, group, T0, upper)

    assert keys_in_log(lg) == should_remain
    assert f["bytes_read"] == expected_read
    assert f["messages_read"] == upper
    assert f["messages_written"] == upper - len(removed)
    # One cleaned segment in place of three; its batches are the survivors' bytes, verbatim.
    assert len(lg.segments) == 2
    assert read_file(lg.segments[0].log_path) == b"".join(kept_batches)
    assert f["bytes_written"] == len(b"".join(kept_batches))
    assert read_file(lg.segments[1].log_path) == fourth
    assert cleaned_files(lg.directory) == []


# -- #32 retention racing with the swap ---------------------------------------------------------

def test_retention_deleting_segments_during_the_swap(root, clock):
    """#32: segments deleted by retention just before replace_segments are renamed .deleted
    exactly once, and the swap does not fail."""
    st = open_store(root, clock)
    lg = compacted_topic(st, cleanup_policy="compact,delete", file_delete_delay_ms=60_000)
    while len(lg.segments) < 3:
        lg.append_batch([kv(lg.log_end_offset)], keys=[b"0"])
        lg.roll()
    group = list(lg.segments[:-1])
    group_names = [os.path.basename(s.log_path) for s in group]
    active_base = lg.segments[-1].base_offset
    real_replace = lg.replace_segments

    def replace_with_retention_first(new, old, **kw):
        lg.delete_records(active_base)      # Kafka: maybeIncrementLogStartOffset + ...
        report = st.enforce_retention()     # ... deleteOldSegments
        assert len(report.partitions[TP].deleted) == len(group)
        return real_replace(new, old, **kw)
    lg.replace_segments = replace_with_retention_first

    cleaner = make_cleaner(clock)
    stats = CleanerStats()
    cleaner.build_offset_map(lg, 0, active_base, stats)
    clean_group(cleaner, lg, group, T0, group[-1].read_next_offset())

    names = os.listdir(lg.directory)
    assert not any(n.endswith(".deleted.deleted") for n in names)
    for name in group_names:
        assert names.count(name + ".deleted") == 1
    assert lg.log_start_offset == active_base
    assert records(lg) == []
    lg.append_batch([b"x"], keys=[b"0"])
    assert records(lg) == [(active_base, b"0", b"x")]


# -- #33 preallocated segments --------------------------------------------------------------------

def test_cleaned_segment_of_a_preallocated_topic_is_trimmed(root, clock):
    """#33."""
    st = open_store(root, clock)
    lg = compacted_topic(st, preallocate=True, segment_bytes=1 << 20)
    lg.append_batch([b"x"], keys=[b"x"])
    lg.roll()     # the store's first segment is not preallocated; rolled ones are
    for k in (0, 1, 0, 1, 0):
        lg.append_batch([kv(k)], keys=[kv(k)])
    assert os.path.getsize(lg.segments[-1].log_path) == 1 << 20   # preallocated
    lg.roll()
    st.compact("t", 0, force=True)
    cleaned = lg.segments[0]
    assert len(lg.segments) == 2 and cleaned.base_offset == 0
    assert os.path.getsize(cleaned.log_path) == cleaned.size < 1 << 20
    assert offsets(lg) == [0, 4, 5]


# -- #37 large batches, buffer growth and corrupt segments ----------------------------------------

def test_batches_larger_than_the_io_buffer_and_max_message_bytes(root, clock, caplog,
                                                                monkeypatch):
    """#37 (KAFKA-4019, KAFKA-6834): batches bigger than the cleaner's chunk (segstore's floor,
    set to 4 MiB here to keep the batches small) grow the buffers, and still clean after the
    topic's max.message.bytes is lowered below them."""
    from segstore.cleaner import cleaner as cleaner_mod
    monkeypatch.setattr(cleaner_mod, "MIN_CHUNK", 4 * MB)
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=64 * MB, max_message_bytes=16 * MB)
    big = 5 * MB
    lg.append_batch([b"a" * big], keys=[b"k0"])
    lg.append_batch([b"b" * big, b"c" * big], keys=[b"k1", b"k0"])
    lg.append_batch([b"d"], keys=[b"k2"])
    lg.roll()
    st.alter_topic_config("t", set={"max.message.bytes": 1000})
    with caplog.at_level(logging.INFO, logger="segstore.cleaner"):
        stats = st.compact("t", 0, force=True)
    assert [(o, k, len(v)) for o, k, v in records(lg)] == [(1, b"k1", big), (2, b"k0", big),
                                                          (3, b"k2", 1)]
    assert {v[:1] for _, _, v in records(lg)} == {b"b", b"c", b"d"}
    assert stats[0].messages_read == 4 and stats[0].messages_written == 3
    assert any(r.getMessage().startswith("Growing cleaner I/O buffers") for r in caplog.records)


def corrupt_setup(root, clock):
    st = open_store(root, clock)
    lg = compacted_topic(st)
    fill_segments(lg, 3, key=lambda off: kv(off % 3))
    return st, lg


@pytest.mark.parametrize("damage", ["magic", "size"])
def test_corrupt_segment_raises_corrupt_record_error(root, clock, damage):
    """#37: a corrupted magic byte, or a batch size running past the end of the segment, raises
    CorruptRecordError; no .cleaned file is left and the log is unchanged."""
    st, lg = corrupt_setup(root, clock)
    seg = lg.segments[0]
    spans = batch_spans(read_file(seg.log_path))
    pos, size = spans[-1]
    with open(seg.log_path, "r+b") as f:
        if damage == "magic":
            f.seek(pos + 16)
            f.write(b"\xff")
        else:
            f.seek(pos + 8)
            f.write(struct.pack(">i", size - 12 + 1000))
    before = [read_file(s.log_path) for s in lg.segments]
    cleaner = fake_map_cleaner(clock, [kv(0)])
    with pytest.raises(CorruptRecordError):
        clean_group(cleaner, lg, [seg], T0, seg.read_next_offset())
    assert cleaned_files(lg.directory) == []
    assert [read_file(s.log_path) for s in lg.segments] == before
    # Through the store: the round fails and the partition is quarantined, not the store.
    with pytest.raises(CorruptRecordError):
        st.compact("t", 0, force=True)
    assert TP in st.cleaner_manager.uncleanable
    assert cleaned_files(lg.directory) == []
    assert [read_file(s.log_path) for s in lg.segments] == before
    assert st.metrics()["uncleanable-partitions-count"] == 1


# -- #38 tombstones and the KIP-534 delete horizon ------------------------------------------------

def roll_with_filler(lg, clock, key=b"filler"):
    """New dirty data, so that the store has something to clean in the next round."""
    lg.append_batch([b"f%d" % lg.log_end_offset], keys=[key])
    lg.roll()


def test_tombstone_needs_two_passes(root, clock):
    """KIP-534: the first cleaning that keeps a tombstone stamps its batch (attribute bit 6,
    baseTimestamp = now + delete.retention.ms, record deltas re-encoded so absolute timestamps
    stay); cleanings before that horizon keep it; the first one at/after it drops it. The
    tombstone's own record timestamp, far older than any horizon, does not matter."""
    dr = 10_000
    st = open_store(root, clock)
    lg = compacted_topic(st, delete_retention_ms=dr)
    old_ts = T0 - 10 * 86_400_000
    lg.append_batch([b"v0"], keys=[b"k0"], timestamps_ms=[T0 - 5])
    lg.append_batch([b"v1"], keys=[b"k1"], timestamps_ms=[T0 - 4])
    lg.append_batch([None], keys=[b"k0"], timestamps_ms=[old_ts])
    lg.roll()
    k1_batch = all_batches(lg)[1]["bytes"]

    st.compact("t", 0, force=True)
    assert records(lg) == [(1, b"k1", b"v1"), (2, b"k0", None)]
    b = all_batches(lg)
    assert b[0]["bytes"] == k1_batch                       # untouched: copied verbatim
    tomb = b[1]
    assert tomb["attributes"] & ATTR_DELETE_HORIZON
    assert tomb["base_timestamp"] == T0 + dr
    assert tomb["max_timestamp"] == old_ts
    assert (tomb["base_offset"], tomb["last_offset_delta"], tomb["records_count"]) == (2, 0, 1)
    assert crc_ok(tomb["bytes"])
    parsed = kp_parse(read_file(lg.segments[0].log_path))
    assert parsed[1] == (2, 2, True, [(2, old_ts, b"k0", None, [])])

    clock.now = T0 + dr - 1
    roll_with_filler(lg, clock)
    st.compact("t", 0, force=True)
    assert (2, b"k0", None) in records(lg)
    assert all_batches(lg)[1]["bytes"] == tomb["bytes"]     # same horizon, not re-stamped

    clock.now = T0 + dr
    roll_with_filler(lg, clock)
    st.compact("t", 0, force=True)
    assert [k for _, k, _ in records(lg)] == [b"k1", b"filler"]


def test_tombstone_with_an_old_timestamp_is_retained_on_the_first_pass(root, clock):
    """#38, Kafka's testCleanTombstone: a record with a future timestamp, then a tombstone with
    a timestamp older than delete.retention.ms: the tombstone survives cleanings at the same
    time (its horizon is wall-clock based)."""
    st = open_store(root, clock)
    lg = compacted_topic(st, delete_retention_ms=86_400_000)
    lg.append_batch([b"0"], keys=[b"0"], timestamps_ms=[T0 + 86_400_000 + 10_000])
    lg.roll()
    st.compact("t", 0, force=True)
    lg.append_batch([None], keys=[b"0"], timestamps_ms=[T0 - 86_400_000 - 10_000])
    lg.roll()
    st.compact("t", 0, force=True)
    assert last_offsets(lg)[0] == 1 and records(lg) == [(1, b"0", None)]
    lg.append_batch([b"1"], keys=[b"1"])
    lg.roll()
    st.compact("t", 0, force=True)
    assert last_offsets(lg)[0] == 1 and records(lg)[0] == (1, b"0", None)


def test_cleaning_with_deletes(root, clock):
    """#38, Kafka's testCleaningWithDeletes (with KIP-534's two passes): after cleaning no
    deleted key has a value; after the horizon no tombstone is left either."""
    st = open_store(root, clock)
    lg = compacted_topic(st, delete_retention_ms=1000)
    fill_segments(lg, 2)
    leo = lg.log_end_offset
    for k in range(0, leo, 2):
        lg.append_batch([None], keys=[kv(k)])
    fill_segments(lg, 4)
    deleted = {kv(k) for k in range(0, leo, 2)}
    original = records(lg)
    st.compact("t", 0, force=True)
    recs = records(lg)
    assert not deleted & {k for _, k, v in recs if v is not None}
    assert {k for _, k, v in recs if v is None} == deleted
    clock.advance(1000)
    roll_with_filler(lg, clock)
    st.compact("t", 0, force=True)
    assert not deleted & {k for _, k, _ in records(lg)}
    assert sorted(keys_in_log(lg)) == sorted(live_keys(original) | {b"filler"})


def test_rebuilt_batch_keeps_offsets_timestamps_and_producer_fields(root, clock):
    """A batch with a removed record, a kept value and a kept tombstone is rebuilt: same base
    offset and lastOffsetDelta (even though its last record went), the horizon stamped, every
    absolute timestamp unchanged, maxTimestamp recomputed, a fresh valid CRC."""
    st = open_store(root, clock)
    lg = compacted_topic(st, delete_retention_ms=5000)
    lg.append_batch([b"a", None, b"c", b"d"], keys=[b"k0", b"k1", b"k2", b"k3"],
                    timestamps_ms=[T0 - 300, T0 - 100, T0 - 200, T0 - 50],
                    headers=[[("h", b"1")], [], [("h", b"3"), ("i", None)], []])
    lg.append_batch([b"d2"], keys=[b"k3"], timestamps_ms=[T0 - 400])
    lg.roll()
    st.compact("t", 0, force=True)
    b = all_batches(lg)[0]
    assert (b["base_offset"], b["last_offset_delta"], b["records_count"]) == (0, 3, 3)
    assert (b["producer_id"], b["producer_epoch"], b["base_sequence"]) == (-1, -1, -1)
    assert b["partition_leader_epoch"] == 0
    assert b["attributes"] == ATTR_DELETE_HORIZON and b["base_timestamp"] == T0 + 5000
    assert b["max_timestamp"] == T0 - 100          # k3's T0 - 50 went with its record
    assert crc_ok(b["bytes"])
    parsed = kp_parse(read_file(lg.segments[0].log_path))
    assert parsed[0][3] == [(0, T0 - 300, b"k0", b"a", [("h", b"1")]),
                            (1, T0 - 100, b"k1", None, []),
                            (2, T0 - 200, b"k2", b"c", [("h", b"3"), ("i", None)])]
    assert parsed[1][3] == [(4, T0 - 400, b"k3", b"d2", [])]


def test_log_append_time_batches_keep_their_append_time(root, clock):
    st = open_store(root, clock)
    lg = compacted_topic(st, message_timestamp_type="LogAppendTime")
    lg.append_batch([b"a", b"b", b"c"], keys=[b"k0", b"k1", b"k2"], timestamps_ms=[1, 2, 3])
    clock.advance(10)
    lg.append_batch([b"b2"], keys=[b"k1"])
    lg.roll()
    before = all_batches(lg)[0]
    st.compact("t", 0, force=True)
    b = all_batches(lg)[0]
    assert b["attributes"] & 0x08 and b["records_count"] == 2
    assert b["max_timestamp"] == before["max_timestamp"] == T0
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in lg.iter_records()] == \
        [(0, T0, 1), (2, T0, 1), (3, T0 + 10, 1)]


# -- #39 stats ----------------------------------------------------------------------------------

def test_cleaner_stats(root, clock):
    """#39, Kafka's testLogCleanerStats: a 4-slot map at load factor 0.75 holds 3 keys."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    for k in (0, 1, 0, 1, 0):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    initial = lg.size_bytes
    cleaner = make_cleaner(clock, slots=4, load_factor=0.75)
    end, stats = cleaner.clean(log_to_clean(st, lg, 2, T0), T0)
    assert end == 5 == stats.end_offset
    assert stats.first_dirty_offset == 2
    assert stats.messages_read == 5
    assert stats.bytes_read == initial
    assert stats.messages_written == 2
    assert stats.bytes_written == lg.size_bytes
    assert stats.invalid_messages_read == 0
    assert stats.end_time >= stats.map_complete_time >= stats.start_time
    assert stats.buffer_utilization == pytest.approx(2 / 4)
    assert not stats.map_full and stats.wanted_buffer_bytes is None
    assert (stats.segments_cleaned, stats.segments_written) == (1, 1)
    assert offsets(lg) == [3, 4]


def test_keyless_records_are_removed_and_counted(root, clock, caplog):
    """#39, Kafka's testCleaningWithUnkeyedMessages (the log gets keyless records while its
    policy is delete, then becomes compacted)."""
    st = open_store(root, clock)
    lg = compacted_topic(st, cleanup_policy="delete")
    while len(lg.segments) < 2:
        lg.append_batch([kv(lg.log_end_offset)], keys=None)
    n_keyless = lg.log_end_offset
    size_keyless = lg.size_bytes
    fill_segments(lg, 3)
    expected_size = lg.size_bytes - size_keyless
    st.alter_topic_config("t", set={"cleanup.policy": "compact"})
    with caplog.at_level(logging.INFO, logger="segstore.cleaner"):
        [stats] = st.compact("t", 0, force=True)
    assert all(k is not None for _, k, _ in records(lg))
    assert lg.size_bytes == expected_size
    assert stats.invalid_messages_read == n_keyless
    assert f"\tFound {n_keyless} invalid messages during compaction." in \
        [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_stats_of_a_store_round(root, clock):
    st = open_store(root, clock, log_cleaner_dedupe_buffer_size=24 * 100)
    lg = compacted_topic(st, segment_bytes=300)
    for i in range(30):
        lg.append_batch([b"v%d" % i], keys=[kv(i % 6)])
    lg.roll()
    sizes = [s.size for s in lg.segments]
    [stats] = st.compact("t", 0)
    assert (stats.topic, stats.partition, stats.thread_id) == ("t", 0, -1)
    assert (stats.first_dirty_offset, stats.end_offset) == (0, 30)
    assert stats.map_messages_read == 30 and stats.map_bytes_read == sum(sizes)
    assert stats.messages_read == 30 and stats.messages_written == 6
    assert stats.bytes_read == sum(sizes)
    assert stats.bytes_written == lg.size_bytes
    assert stats.buffer_utilization == pytest.approx(6 / 100)
    assert stats.segments_cleaned == len(sizes) - 1 and not stats.forced   # not the active one
    assert st.cleaner_manager.all_cleaner_checkpoints() == {TP: 30}
    d = stats.as_dict()
    assert d["messages_written"] == 6 and "elapsed_secs" in d


# -- #40 partial cleaning with a tiny map ---------------------------------------------------------

def test_partial_segment_clean_makes_progress(root, clock):
    """#40, Kafka's testPartialSegmentClean: a 2-slot map at load factor 0.75 maps one key per
    round, and every round still removes something."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    for k in (0, 1, 0, 1, 0):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    cleaner = make_cleaner(clock, slots=2, load_factor=0.75)
    assert cleaner.offset_map.max_desired_size == 1

    end, stats = cleaner.clean(log_to_clean(st, lg, 2, T0), T0)
    assert stats.map_full and end == 3
    assert keys_in_log(lg) == [b"1", b"0", b"1", b"0"] and offsets(lg) == [1, 2, 3, 4]
    end, _ = cleaner.clean(log_to_clean(st, lg, 3, T0), T0)
    assert end == 4
    assert keys_in_log(lg) == [b"0", b"1", b"0"] and offsets(lg) == [2, 3, 4]
    end, stats = cleaner.clean(log_to_clean(st, lg, 4, T0), T0)
    assert end == 5 and not stats.map_full
    assert keys_in_log(lg) == [b"1", b"0"] and offsets(lg) == [3, 4]


def test_store_compact_runs_rounds_until_the_dirty_section_is_done(root, clock):
    """#40 through the store: with one key per round, compact() keeps cleaning; every round's
    end offset is beyond the previous one, and the result is the latest record per key."""
    st = open_store(root, clock, log_cleaner_dedupe_buffer_size=48,
                    log_cleaner_io_buffer_load_factor=0.75)
    lg = compacted_topic(st, segment_bytes=400)
    ks = [0, 1, 2, 0, 3, 1, 4, 4, 2, 0, 5, 3]
    for i, k in enumerate(ks):
        lg.append_batch([b"v%d" % i], keys=[kv(k)])
    lg.roll()
    original = records(lg)
    rounds = st.compact("t", 0)
    ends = [s.end_offset for s in rounds]
    assert len(rounds) > 3
    assert ends == sorted(set(ends)) and ends[-1] == len(ks)
    assert all(s.map_full for s in rounds[:-1]) and not rounds[-1].map_full
    assert all(s.buffer_utilization == 0.5 for s in rounds)
    last = {k: o for o, k, _ in original}
    assert records(lg) == [r for r in original if last[r[1]] == r[0]]
    assert st.cleaner_manager.all_cleaner_checkpoints() == {TP: len(ks)}


def test_build_partial_offset_map(root, clock):
    """#46, Kafka's testBuildPartialOffsetMap: a 3-slot map at 0.75 holds two keys; mapping
    from offset 2 stops when the third would go in (records read from the segment start
    count)."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    for k in range(5):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    cleaner = make_cleaner(clock, slots=3, load_factor=0.75)
    stats = CleanerStats()
    cleaner.build_offset_map(lg, 2, INT_MAX, stats)
    m = cleaner.offset_map
    assert m.size == 2 and stats.map_full
    assert [m.get(kv(k)) for k in range(5)] == [-1, -1, 2, 3, -1]
    assert m.latest_offset == 3
    assert stats.map_messages_read == 4


# -- #41 the uncleanable section ------------------------------------------------------------------

def test_segments_after_the_first_uncleanable_offset_are_untouched(root, clock):
    """#41: segments at or after the first uncleanable offset (here: newer than
    min.compaction.lag.ms) keep their files byte for byte; the older ones are cleaned."""
    st = open_store(root, clock)
    lg = compacted_topic(st, min_compaction_lag_ms=60_000, segment_bytes=1000)
    n = 10
    old = True
    while len(lg.segments) < 7:
        if len(lg.segments) == 4 and old:
            old = False
        off = lg.log_end_offset
        lg.append_batch([kv(off)], keys=[kv(off % n)],
                        timestamps_ms=[T0 - 3_600_000 if old else T0])
    segs = lg.segments
    young = [s for s in segs if s.largest_timestamp > T0 - 60_000]
    first_young = young[0].base_offset
    assert young[0] is segs[3]
    files = {s.base_offset: {sfx: read_file(s.log_path[:-4] + sfx)
                             for sfx in (".log", ".index", ".timeindex")}
             for s in segs[3:-1]}
    for s in segs[:3]:     # every old segment holds duplicate keys
        assert len(seg_records(s)) > len({r[1] for r in seg_records(s)})
    [stats] = st.compact("t", 0, force=True)
    assert stats.end_offset == first_young
    assert st.cleaner_manager.all_cleaner_checkpoints() == {TP: first_young}
    for s in lg.segments:
        if s.base_offset in files:
            assert {sfx: read_file(s.log_path[:-4] + sfx) for sfx in files[s.base_offset]} == \
                files[s.base_offset]
    assert sorted(files) == [s.base_offset for s in lg.segments
                             if first_young <= s.base_offset < lg.segments[-1].base_offset]
    cleaned = [r for s in lg.segments if s.base_offset < first_young for r in seg_records(s)]
    assert len({r[1] for r in cleaned}) == len(cleaned) <= n


def seg_records(seg) -> list[tuple]:
    """(offset, key, value) of one segment file, through kafka-python."""
    return [(o, k, v) for _, _, _, recs in kp_parse(read_file(seg.log_path))
            for o, _, k, v, _ in recs]


# -- #42 LogToClean -------------------------------------------------------------------------------

def one_record_segments(lg, n, ts=lambda i: T0):
    for i in range(n):
        lg.append_batch([bytes(25)], keys=[b"1"], timestamps_ms=[ts(i)])
        lg.roll()


def test_log_to_clean_total_bytes_exclude_the_active_segment(root, clock):
    """#42, Kafka's testLogToClean."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=100)
    one_record_segments(lg, 6)
    lg.append_batch([bytes(25)], keys=[b"1"])
    active = lg.segments[-1]
    ltc = log_to_clean(st, lg, active.base_offset, T0)
    assert ltc.total_bytes == lg.size_bytes - active.size
    assert ltc.cleanable_bytes == 0 and ltc.cleanable_ratio == 0.0


def test_log_to_clean_with_an_uncleanable_section(root, clock):
    """#42, Kafka's testLogToCleanWithUncleanableSection: segments 0-1 clean, 2-3 cleanable,
    4-5 uncleanable (younger than min.compaction.lag.ms)."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=100, min_compaction_lag_ms=60_000)
    one_record_segments(lg, 6, ts=lambda i: T0 - 3_600_000 if i < 4 else T0)
    segs = lg.segments
    ltc = log_to_clean(st, lg, segs[2].base_offset, T0)
    clean = segs[0].size + segs[1].size
    cleanable = segs[2].size + segs[3].size
    assert ltc.first_dirty_offset == segs[2].base_offset
    assert ltc.first_uncleanable_offset == segs[4].base_offset
    assert (ltc.clean_bytes, ltc.cleanable_bytes, ltc.total_bytes) == \
        (clean, cleanable, clean + cleanable)
    assert ltc.cleanable_ratio == pytest.approx(cleanable / (clean + cleanable))


# -- #43 aborts -----------------------------------------------------------------------------------

def abort_log(root, clock):
    st = open_store(root, clock)
    lg = compacted_topic(st)
    fill_segments(lg, 4, key=lambda off: kv(off % 7))
    return st, lg


def count_check_done_calls(root, clock) -> int:
    st, lg = abort_log(root, clock)
    calls = []
    cleaner = fake_map_cleaner(clock, [kv(k) for k in range(7)], check_done=calls.append)
    group = lg.segments[:3]
    clean_group(cleaner, lg, group, T0, group[-1].read_next_offset())
    st.close()
    return len(calls)


@pytest.mark.parametrize("abort_at", ["first", "second", "last"])
def test_abort_during_clean_segments_leaves_no_cleaned_files(tmp_path, clock, abort_at):
    """#43: an abort signalled through check_done while a group is filtered (or just before its
    swap) raises CleaningAbortedError, removes the .cleaned files and leaves the log as it
    was."""
    total = count_check_done_calls(str(tmp_path / "dry"), FakeClock(T0))
    target = {"first": 1, "second": 2, "last": total}[abort_at]
    assert total >= 3
    st, lg = abort_log(str(tmp_path / "store"), clock)
    calls = []

    def check_done(tp):
        calls.append(tp)
        if len(calls) == target:
            raise CleaningAbortedError("aborted by the test")
    cleaner = fake_map_cleaner(clock, [kv(k) for k in range(7)], check_done=check_done)
    before = records(lg)
    files = {n: read_file(os.path.join(lg.directory, n)) for n in os.listdir(lg.directory)
             if n.endswith(".log")}
    group = lg.segments[:3]
    with pytest.raises(CleaningAbortedError):
        clean_group(cleaner, lg, group, T0, group[-1].read_next_offset())
    assert calls == [TP] * target
    assert cleaned_files(lg.directory) == []
    assert records(lg) == before
    assert {n: read_file(os.path.join(lg.directory, n)) for n in os.listdir(lg.directory)
            if n.endswith(".log")} == files


def test_truncation_during_cleaning_aborts_the_swap(root, clock):
    """A truncation while a group is being filtered: the swap refuses (CleaningAbortedError),
    no .cleaned file is left and the log holds exactly the truncated contents."""
    st, lg = abort_log(root, clock)
    cut = lg.segments[1].base_offset + 1
    done = []

    def truncate_once(tp):
        if not done:
            done.append(1)
            lg.truncate_to(cut)
    cleaner = fake_map_cleaner(clock, [kv(k) for k in range(7)], check_done=truncate_once)
    group = lg.segments[:2]
    before = records(lg)
    with pytest.raises(CleaningAbortedError):
        clean_group(cleaner, lg, group, T0, group[-1].read_next_offset())
    assert cleaned_files(lg.directory) == []
    assert records(lg) == [r for r in before if r[0] < cut]


# -- #44 the round's last offset survives ---------------------------------------------------------

def test_last_batch_of_the_round_is_retained_empty(root, clock):
    """#44, Kafka's testCleanSegmentsRetainingLastEmptyBatch: when every record of the cleaned
    segments goes, the batch ending at the round's upper bound stays as a 61-byte header."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    fill_segments(lg, 4)
    keys = keys_in_log(lg)
    assert keys == [kv(i) for i in range(lg.log_end_offset)]
    group = lg.segments[:3]
    last_original = segment_batches(group[-1])[-1]
    upper = group[-1].read_next_offset()
    clean_group(fake_map_cleaner(clock, keys), lg, group, T0, upper)
    assert len(lg.segments) == 2
    [b] = segment_batches(lg.segments[0])
    assert b["base_offset"] + b["last_offset_delta"] == lg.segments[1].base_offset - 1
    assert (b["base_offset"], b["last_offset_delta"]) == \
        (last_original["base_offset"], last_original["last_offset_delta"])
    assert (b["size"], b["records_count"], b["base_timestamp"]) == (61, 0, -1)
    assert b["max_timestamp"] == last_original["max_timestamp"]
    assert b["attributes"] == 0 and crc_ok(b["bytes"])
    assert kp_parse(b["bytes"]) == [(b["base_offset"], b["base_offset"], True, [])]


def test_no_empty_batch_when_the_upper_bound_lies_beyond(root, clock):
    """#44's counterpart (testCleanSegmentsNotRetainingLastEmptyBatch)."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    fill_segments(lg, 4)
    keys = keys_in_log(lg)
    group = lg.segments[:3]
    clean_group(fake_map_cleaner(clock, keys), lg, group, T0, lg.log_end_offset)
    assert len(lg.segments) == 2
    assert lg.segments[0].size == 0


def test_store_round_keeps_the_last_offset_of_keyless_data(root, clock):
    """#44 through the store: the last batch before the active segment holds only keyless
    records; it stays as an empty header, so the offsets up to the log end are still there
    after a reopen."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    lg.append_batch([b"a", b"b"], keys=[b"k", b"k"])
    append_batch_unvalidated(lg, [b"x", b"y", b"z"], keys=None)
    lg.roll()
    st.compact("t", 0, force=True)
    b = all_batches(lg)
    assert [(x["base_offset"], x["last_offset_delta"], x["records_count"]) for x in b] == \
        [(0, 1, 1), (2, 2, 0)]
    assert records(lg) == [(1, b"k", b"b")]
    st.close()
    st = open_store(root, clock)
    lg = st.partition("t", 0)
    assert lg.log_end_offset == 5 and records(lg) == [(1, b"k", b"b")]


# -- #45 grouping segments ------------------------------------------------------------------------

def check_order(groups, segs):
    assert [s for g in groups for s in g] == list(segs)


def test_segment_grouping(root, clock):
    """#45, Kafka's testSegmentGrouping."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=300, index_interval_bytes=1)
    while len(lg.segments) < 10:
        lg.append_batch([b"hello"], keys=[b"hello"])
    segs, leo = lg.segments, lg.log_end_offset

    groups = group_segments_by_size(segs, INT_MAX, INT_MAX, leo)
    assert len(groups) == 1 and len(groups[0]) == 10
    check_order(groups, segs)
    for max_size, max_index in ((1, INT_MAX), (INT_MAX, 1)):
        groups = group_segments_by_size(segs, max_size, max_index, leo)
        assert [len(g) for g in groups] == [1] * 10
        check_order(groups, segs)

    log_size = sum(s.size for s in segs[:3]) + 1
    groups = group_segments_by_size(segs, log_size, INT_MAX, leo)
    check_order(groups, segs)
    assert all(len(g) == 3 for g in groups[:-1]) and len(groups) > 2
    assert all(sum(s.size for s in g) < log_size for g in groups)

    # Sealed index files are trimmed to their entries: their sizes are what the rule adds up.
    index_size = sum(os.path.getsize(s.log_path[:-4] + ".index") for s in segs[:3]) + 1
    assert index_size > 1 + 3 * 8
    groups = group_segments_by_size(segs, INT_MAX, index_size, leo)
    check_order(groups, segs)
    assert all(len(g) == 3 for g in groups[:-1]) and len(groups) > 2


def fake_segment(base, size=100, index_entries=1, time_entries=1):
    return SimpleNamespace(base_offset=base, size=size,
                           offset_index=SimpleNamespace(entries=index_entries),
                           time_index=SimpleNamespace(entries=time_entries))


def bases(groups):
    return [[s.base_offset for s in g] for g in groups]


def test_segment_grouping_with_sparse_offsets():
    """#45, Kafka's testSegmentGroupingWithSparseOffsets and ...FollowingLoadOfZeroIndex: no
    group spans more than 2^31 - 1 offsets; a segment's last offset is estimated from the next
    segment's base (or the first uncleanable offset)."""
    s0, s1 = fake_segment(0), fake_segment(INT_MAX - 1)
    assert bases(group_segments_by_size([s0, s1], INT_MAX, INT_MAX, INT_MAX + 1)) == \
        [[0, INT_MAX - 1]]
    assert bases(group_segments_by_size([s0, s1], INT_MAX, INT_MAX, INT_MAX + 2)) == \
        [[0], [INT_MAX - 1]]
    more = [s0, s1, fake_segment(INT_MAX + 5), fake_segment(INT_MAX + 10)]
    assert bases(group_segments_by_size(more, INT_MAX, INT_MAX, INT_MAX + 20)) == \
        [[0], [INT_MAX - 1, INT_MAX + 5, INT_MAX + 10]]
    half = [fake_segment(0), fake_segment(INT_MAX // 2)]
    assert bases(group_segments_by_size(half, INT_MAX, INT_MAX, INT_MAX + 2)) == \
        [[0], [INT_MAX // 2]]


def test_empty_segments_merge_whatever_their_offset_range():
    """#45 (KAFKA-12889): an empty segment joins the group even when the range it would span
    passes 2^31 - 1."""
    segs = [fake_segment(0), fake_segment(10, size=0, index_entries=0, time_entries=0),
            fake_segment(3 * 2 ** 31, size=0, index_entries=0, time_entries=0),
            fake_segment(4 * 2 ** 31)]
    assert bases(group_segments_by_size(segs, INT_MAX, INT_MAX, 4 * 2 ** 31 + 5)) == \
        [[0, 10, 3 * 2 ** 31], [4 * 2 ** 31]]


def test_grouping_rules_on_random_segments():
    """Every group obeys REF §6.6 and is maximal (its successor could not have joined it);
    order is preserved."""
    import random
    rng = random.Random(45)
    for _ in range(300):
        n = rng.randint(1, 12)
        base, segs = 0, []
        for _ in range(n):
            base += rng.choice([1, 5, 100, 2 ** 30, 2 ** 31])
            empty = rng.random() < 0.2
            segs.append(fake_segment(base, 0 if empty else rng.randint(1, 400),
                                     0 if empty else rng.randint(1, 5),
                                     0 if empty else rng.randint(1, 3)))
        fu = segs[-1].base_offset + rng.choice([1, 10, 2 ** 31])
        max_size, max_index = rng.choice([50, 400, 1000, INT_MAX]), rng.choice([8, 40, INT_MAX])
        groups = group_segments_by_size(segs, max_size, max_index, fu)
        check_order(groups, segs)

        def last_of(i):
            return segs[i + 1].base_offset - 1 if i + 1 < len(segs) else fu - 1

        def fits(group_start, j):
            """Segment j may join the group of segs[group_start:j]."""
            g = segs[group_start:j]
            nxt = segs[j]
            return (sum(s.size for s in g) + nxt.size <= max_size
                    and 8 * sum(s.offset_index.entries for s in g + [nxt]) <= max_index
                    and 12 * sum(s.time_index.entries for s in g + [nxt]) <= max_index
                    and (nxt.size == 0 or last_of(j) - g[0].base_offset <= INT_MAX))
        i = 0
        for g in groups:
            for j in range(i + 1, i + len(g)):
                assert fits(i, j)
            if i + len(g) < len(segs):
                assert not fits(i, i + len(g))
            i += len(g)


def test_sparse_offsets_and_empty_segments_on_disk(root, clock):
    """#45, Kafka's testSegmentGroupingWithSparseOffsetsAndEmptySegments: three segments each
    spanning 2^31 offsets cannot group; cleaned empty, the first two merge."""
    g = 2 ** 31
    seg_data = {}
    for i in range(3):
        seg_data[i * g] = v2([(i * g, b"key", b"val")]) + v2([((i + 1) * g - 1, b"key", b"val")])
    seg_data[3 * g] = v2([(3 * g, b"key", b"val")])
    st = write_partition(root, clock, seg_data)
    lg = st.partition("t", 0)
    assert [s.base_offset for s in lg.segments] == [0, g, 2 * g, 3 * g]
    first_uncleanable = lg.segments[-1].base_offset
    groups = group_segments_by_size(lg.segments[:-1], INT_MAX, INT_MAX, first_uncleanable)
    assert bases(groups) == [[0], [g], [2 * g]]
    cleaner = make_cleaner(clock)
    end, _ = cleaner.clean(log_to_clean(st, lg, 0, T0), T0)
    assert end == first_uncleanable
    assert [s.size for s in lg.segments[:2]] == [0, 0] and len(lg.segments) == 4
    groups = group_segments_by_size(lg.segments[:-1], INT_MAX, INT_MAX, first_uncleanable)
    assert bases(groups) == [[0, g], [2 * g]]
    cleaner.clean(log_to_clean(st, lg, 0, T0), T0)
    assert [s.base_offset for s in lg.segments] == [0, 2 * g, 3 * g]
    assert records(lg) == [(3 * g - 1, b"key", b"val"), (3 * g, b"key", b"val")]


# -- #46 building the offset map ------------------------------------------------------------------

def test_build_offset_map_over_segment_aligned_ranges(root, clock):
    """#46, Kafka's testBuildOffsetMap."""
    st = open_store(root, clock)
    lg = compacted_topic(st)
    for i in range(500):
        lg.append_batch([kv(i)], keys=[kv(i)])
    segs = lg.segments
    assert len(segs) > 4
    cleaner = make_cleaner(clock, slots=1000)
    for start, end in ((0, segs[1].base_offset), (segs[1].base_offset, segs[3].base_offset),
                       (segs[3].base_offset, lg.log_end_offset)):
        stats = CleanerStats()
        cleaner.build_offset_map(lg, start, end, stats)
        m = cleaner.offset_map
        assert m.latest_offset + 1 == end
        assert m.size == end - start
        assert all(m.get(kv(i)) == i for i in range(start, end))
        assert m.get(kv(start - 1)) == -1 and m.get(kv(end)) == -1
        assert stats.map_messages_read == end - start
        assert not stats.map_full


def test_build_offset_map_with_sparse_huge_offsets(root, clock):
    """#46, Kafka's testBuildOffsetMapFakeLarge: records at offsets 0 and 7,206,178."""
    end = 7_206_178
    st = write_partition(root, clock, {0: v2([(0, b"0", b"0"), (end, b"1", b"1")]),
                                       end + 1: v2([(end + 1, b"2", b"2")])})
    lg = st.partition("t", 0)
    cleaner = make_cleaner(clock)
    cleaner.build_offset_map(lg, 0, end + 1, CleanerStats())
    m = cleaner.offset_map
    assert (m.latest_offset, m.size, m.get(b"0"), m.get(b"1")) == (end, 2, 0, end)


# -- #49 offset gaps (KAFKA-8764) -----------------------------------------------------------------

@pytest.mark.parametrize("layout", [
    {0: range(0, 10), 11: [11]},
    {0: range(0, 10), 15: range(15, 25), 30: [30]},
])
def test_cleaning_moves_past_offset_gaps(root, clock, layout):
    """#49, Kafka's testCleaningBeyondMissingOffsets{Single,Multiple}Segment(s): segments
    rolled past holes; the next dirty offset is the active segment's base, not the hole."""
    st = write_partition(root, clock, {
        base: b"".join(v2([(o, kv(o), kv(o))]) for o in offs) for base, offs in layout.items()})
    lg = st.partition("t", 0)
    active = max(layout)
    assert lg.segments[-1].base_offset == active
    [stats] = st.compact("t", 0, force=True)
    assert stats.end_offset == active
    assert st.cleaner_manager.all_cleaner_checkpoints() == {TP: active}
    assert st.compact("t", 0, force=True) == []       # nothing left: no endless loop
    assert offsets(lg) == [o for offs in layout.values() for o in offs]


# -- #50 metric gauges ----------------------------------------------------------------------------

def test_cleaner_gauges(root, clock):
    """#50, Kafka's testMaxBufferUtilizationPercentMetric / testMaxCleanTimeMetric /
    testMaxCompactionDelayMetrics: 0 without cleaner threads, otherwise the max over threads."""
    st = open_store(root, clock)
    m = st.metrics()
    for name in ("max-buffer-utilization-percent", "max-clean-time-secs",
                 "max-compaction-delay-secs", "cleaner-recopy-percent", "DeadThreadCount",
                 "max-dirty-percent", "uncleanable-partitions-count", "uncleanable-bytes"):
        assert m[name] == 0, name
    c = st.cleaner
    c.last_stats = {i: CleanerStats(buffer_utilization=u, start_time=0, end_time=e,
                                    bytes_read=r, bytes_written=w)
                    for i, (u, e, r, w) in enumerate([(0.75, 1000, 100, 50), (0.85, 2000, 300, 100),
                                                      (0.65, 3000, 0, 0)], 1)}
    c.last_pre_clean = {i: PreCleanStats(max_compaction_delay_ms=d)
                        for i, d in enumerate([1000, 2000, 3000], 1)}
    m = st.metrics()
    assert (m["max-buffer-utilization-percent"], m["max-clean-time-secs"],
            m["max-compaction-delay-secs"], m["cleaner-recopy-percent"]) == (85, 3, 3, 37)
    c.last_stats[1].buffer_utilization = 0.9
    c.last_stats[1].end_time = 4000
    c.last_pre_clean[1].max_compaction_delay_ms = 4000
    m = st.metrics()
    assert (m["max-buffer-utilization-percent"], m["max-clean-time-secs"],
            m["max-compaction-delay-secs"]) == (90, 4, 4)
    for s in c.last_stats.values():
        s.buffer_utilization, s.end_time = 0.5, 1500
    for p in c.last_pre_clean.values():
        p.max_compaction_delay_ms = 1500
    m = st.metrics()
    assert (m["max-buffer-utilization-percent"], m["max-clean-time-secs"],
            m["max-compaction-delay-secs"]) == (50, 1, 1)


def test_gauges_after_a_round(root, clock):
    st = open_store(root, clock, log_cleaner_dedupe_buffer_size=24 * 10)
    lg = compacted_topic(st)
    for k in (0, 1, 0, 1, 2):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    [stats] = st.compact("t", 0)
    m = st.metrics()
    assert m["max-buffer-utilization-percent"] == 30
    assert m["cleaner-recopy-percent"] == int(100 * stats.bytes_written / stats.bytes_read)
    # A cleaner thread's pass (run here in the test's thread) records the selection's ratio.
    lg.append_batch([b"x"], keys=[b"x"])
    lg.roll()
    ratio = log_to_clean(st, lg, stats.end_offset, T0).cleanable_ratio
    assert 0 < ratio < 1
    assert st.cleaner.try_clean_filthiest_log(0, T0)
    m = st.metrics()
    assert m["max-dirty-percent"] == int(100 * ratio)
    assert m["max-buffer-utilization-percent"] == 30      # max of 3/10 (thread -1) and 1/10


# -- #48 legacy (magic 0/1) message sets ----------------------------------------------------------
#
# segstore never writes v0/v1, but a Kafka broker's old segments may hold them (REF §1.10). The
# batches are packed by hand (conftest.legacy_message / legacy_wrapper: struct + zlib.crc32, as
# Kafka wrote them) into a partition directory, which the store then opens and cleans. REF
# §1.10/§6.8: fully retained legacy batches may stay; a legacy batch that loses records is
# rewritten as a v2 batch (baseOffset = first retained offset, same codec); legacy tombstones
# follow the pre-KIP-534 segment-mtime rule (§6.10).

def legacy_records(offsets_keys, magic=1, ts=T0):
    return b"".join(legacy_message(magic, o, k, None if v is None else v, ts + o)
                    for o, k, v in offsets_keys)


@pytest.mark.parametrize("magic", [0, 1])
def test_uncompressed_legacy_messages_are_cleaned(root, clock, magic):
    data = legacy_records([(o, kv(o % 3), kv(o)) for o in range(6)], magic=magic)
    st = write_partition(root, clock, {0: data, 6: v2([(6, b"9", b"6")])})
    lg = st.partition("t", 0)
    st.compact("t", 0, force=True)
    assert records(lg) == [(3, b"0", b"3"), (4, b"1", b"4"), (5, b"2", b"5"), (6, b"9", b"6")]
    kept = read_file(lg.segments[0].log_path)
    # Each kept legacy message is its own (fully retained) batch: copied byte for byte.
    assert kept == data[batch_spans(data)[3][0]:]
    if magic == 1:
        assert [r.timestamp for r in lg.iter_records()][:3] == [T0 + 3, T0 + 4, T0 + 5]


@pytest.mark.parametrize("magic", [0, 1])
def test_partly_retained_legacy_wrapper_is_rewritten_as_v2(root, clock, magic):
    wrapper = legacy_wrapper(magic, [0, 1, 2],
                             [(T0, b"a", b"0"), (T0 + 1, b"b", b"1"), (T0 + 2, b"a", b"2")], 2)
    st = write_partition(root, clock, {0: wrapper, 3: v2([(3, b"z", b"3")])})
    lg = st.partition("t", 0)
    st.compact("t", 0, force=True)
    assert records(lg) == [(1, b"b", b"1"), (2, b"a", b"2"), (3, b"z", b"3")]
    [b] = segment_batches(lg.segments[0])
    assert b["magic"] == 2 and b["attributes"] & 0x07 == 1           # v2, still gzip
    assert (b["base_offset"], b["base_offset"] + b["last_offset_delta"]) == (1, 2)
    assert crc_ok(b["bytes"])
    got = kp_parse(b["bytes"])[0][3]
    assert [(o, k, v) for o, _, k, v, _ in got] == [(1, b"b", b"1"), (2, b"a", b"2")]
    if magic == 1:
        assert [ts for _, ts, _, _, _ in got] == [T0 + 1, T0 + 2]


# Regression (found by these tests, fixed in the same session): a legacy compressed wrapper
# that kept all its records was copied verbatim (Cleaner._filter_legacy); the scan of the output
# reports baseOffset -1 for such a wrapper, LogSegment.append rejected it ("offsets -1..N cannot
# be stored relative to segment base"), the round failed and the partition became uncleanable.


def test_kafka_4298_broken_compressed_sets_are_rewritten(root, clock):
    """#48, Kafka's testCleanCorruptMessageSet: old cleaners wrote gzip sets with outer magic 1
    and inner magic 0 (absolute inner offsets). One set has duplicates, one does not; after
    cleaning every record's value is its offset and every inner message has its wrapper's
    magic."""
    def broken(first, ks):
        inner = b"".join(legacy_message(0, first + i, kv(k), kv(first + i))
                         for i, k in enumerate(ks))
        return legacy_message(1, first + len(ks) - 1, None, gzip.compress(inner, mtime=0), T0, 1)
    data = broken(25, [0, 1, 0, 1]) + broken(50, [3, 4])
    st = write_partition(root, clock, {0: data, 52: v2([(52, b"9", b"52")])})
    lg = st.partition("t", 0)
    assert [o for o, _, _ in records(lg)] == [25, 26, 27, 28, 50, 51, 52]
    st.compact("t", 0, force=True)
    assert records(lg) == [(27, b"0", b"27"), (28, b"1", b"28"), (50, b"3", b"50"),
                           (51, b"4", b"51"), (52, b"9", b"52")]
    out = read_file(lg.segments[0].log_path)
    for pos, size in batch_spans(out):
        outer = out[pos + 16]
        if outer < 2 and out[pos + 17] & 0x07:            # a legacy wrapper: check its inner magics
            value_len = struct.unpack_from(">i", out, pos + (34 if outer == 1 else 26))[0]
            inner = gzip.decompress(out[pos + size - value_len:pos + size])
            assert {inner[p + 16] for p, _ in batch_spans(inner)} == {outer}


def test_fully_retained_legacy_wrapper(root, clock):
    wrapper = legacy_wrapper(1, [0, 1, 2],
                             [(T0, b"a", b"0"), (T0, b"b", b"1"), (T0, b"c", b"2")], 2)
    st = write_partition(root, clock, {0: wrapper, 3: v2([(3, b"z", b"3")])})
    lg = st.partition("t", 0)
    [stats] = st.compact("t", 0, force=True)
    assert records(lg) == [(0, b"a", b"0"), (1, b"b", b"1"), (2, b"c", b"2"), (3, b"z", b"3")]
    assert stats.messages_written == stats.messages_read == 3
    assert [r.timestamp for r in lg.iter_records()][:3] == [T0] * 3
    assert TP not in st.cleaner_manager.uncleanable


def test_legacy_tombstones_follow_the_segment_mtime_rule(root, clock):
    """REF §6.10: a v0/v1 tombstone is kept while its source segment's mtime is after
    (mtime of the clean section's last segment - delete.retention.ms); a v2 tombstone in the
    same round follows its KIP-534 horizon instead."""
    dr = 1000
    data = legacy_records([(0, b"x", b"a"), (1, b"x", None), (2, b"y", b"b")])
    st = write_partition(root, clock, {0: data, 3: v2([(3, b"v", None)]),
                                       4: v2([(4, b"w", b"d")])},
                         topic_cfg={"segment.bytes": 150, "delete.retention.ms": dr})
    lg = st.partition("t", 0)
    st.compact("t", 0, force=True)       # no clean section yet: every tombstone stays
    assert records(lg) == [(1, b"x", None), (2, b"y", b"b"), (3, b"v", None), (4, b"w", b"d")]
    assert [s.base_offset for s in lg.segments] == [0, 3, 4]
    lg.roll()
    seg0, seg3 = lg.segments[:2]
    seg0.set_last_modified(seg3.last_modified_ms - dr - 5000)
    st.compact("t", 0, force=True)
    assert records(lg) == [(2, b"y", b"b"), (3, b"v", None), (4, b"w", b"d")]


# Regression (found by these tests, fixed in the same session): Loader, not cleaner:
# recover_segment keeps only consistent_prefix(batches, base) (segment_checks.py), and scan_batches
# reports baseOffset -1 for a legacy compressed wrapper, so `batches['base_offset'] < base_offset`
# marks the first wrapper bad and the segment is truncated to 0 bytes: a Kafka segment with v0/v1
# compressed sets loses all its data whenever it is recovered (missing index, unclean shutdown).
def test_legacy_compressed_segment_survives_recovery(root, clock):
    wrapper = legacy_wrapper(1, [0, 1, 2],
                             [(T0, b"a", b"0"), (T0, b"b", b"1"), (T0, b"a", b"2")], 2)
    st = write_partition(root, clock, {0: wrapper, 3: v2([(3, b"z", b"3")])}, indexes=False)
    lg = st.partition("t", 0)
    assert records(lg) == [(0, b"a", b"0"), (1, b"b", b"1"), (2, b"a", b"2"), (3, b"z", b"3")]


# -- every codec ---------------------------------------------------------------------------------

CODECS = ["gzip", "snappy", "lz4", "zstd"]
CODEC_ID = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def aio_parse(data: bytes) -> list[tuple]:
    out, mr = [], AioMemoryRecords(data)
    while mr.has_next():
        b = mr.next_batch()
        assert b.validate_crc()
        out += [(r.offset, r.timestamp, r.key, r.value) for r in b]
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_cleaning_every_codec(root, clock, codec):
    """REF §7 #57's "cleaning works for every codec": rebuilt batches keep their codec (at its
    default level), untouched ones stay byte-identical, aiokafka (cramjam) reads the result."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=1 << 20, delete_retention_ms=1000)
    payload = lambda i: (b"value-%d-" % i) * 40
    lg.append_batch([payload(0), payload(1), payload(2), payload(3)],
                    keys=[b"a", b"b", b"c", b"a"], compression=codec, timestamps_ms=[T0 - 4] * 4)
    lg.append_batch([None, payload(5)], keys=[b"b", b"d"], compression=codec,
                    timestamps_ms=[T0 - 3] * 2)
    lg.append_batch([payload(6), payload(7)], keys=[b"e", b"f"], compression=codec,
                    timestamps_ms=[T0 - 2] * 2)
    lg.roll()
    untouched = all_batches(lg)[2]["bytes"]
    st.compact("t", 0, force=True)
    expected = [(2, b"c", payload(2)), (3, b"a", payload(3)), (4, b"b", None),
                (5, b"d", payload(5)), (6, b"e", payload(6)), (7, b"f", payload(7))]
    assert records(lg) == expected
    b = all_batches(lg)
    assert [x["attributes"] & 0x07 for x in b] == [CODEC_ID[codec]] * 3
    assert [(x["base_offset"], x["last_offset_delta"], x["records_count"]) for x in b] == \
        [(0, 3, 2), (4, 1, 2), (6, 1, 2)]
    assert b[1]["attributes"] & ATTR_DELETE_HORIZON and not b[0]["attributes"] & ATTR_DELETE_HORIZON
    assert b[2]["bytes"] == untouched
    assert all(crc_ok(x["bytes"]) for x in b)
    assert [(o, k, v) for o, _, k, v in aio_parse(read_file(lg.segments[0].log_path))] == expected
    # Decompressed size would not fit: the payloads really are compressed.
    assert b[0]["size"] < len(payload(2)) + len(payload(3))

    clock.advance(1000)
    roll_with_filler(lg, clock)
    st.compact("t", 0, force=True)
    assert records(lg)[:5] == [r for r in expected if r[2] is not None]
    b = all_batches(lg)
    assert b[1]["attributes"] & 0x07 == CODEC_ID[codec] and b[1]["records_count"] == 1


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_rebuilt_incompressible_batches_through_a_small_output_buffer(root, clock, codec,
                                                                     monkeypatch):
    """A rebuilt batch is compressed again where it was written; random values come out a
    little longer than they went in (within the room reserved for the batch: the drain before
    placing one that would not fit is defensive). Through an output buffer written out after
    every 4 KiB chunk and grown for larger batches, every survivor is still written once, with
    its codec and a valid CRC."""
    from segstore.cleaner import cleaner as cleaner_mod
    monkeypatch.setattr(cleaner_mod, "OUTPUT_GATHER", 0)
    monkeypatch.setattr(cleaner_mod, "MIN_CHUNK", 4096)
    st = open_store(root, clock, log_cleaner_io_buffer_size=4096)
    lg = compacted_topic(st, segment_bytes=1 << 20)
    rng = np.random.default_rng(11)
    latest = {}
    for b in range(30):
        keys = [b"k%d" % rng.integers(0, 40) for _ in range(8)]
        values = [rng.bytes(int(rng.integers(200, 1500))) for _ in keys]
        first = lg.log_end_offset
        lg.append_batch(values, keys=keys, compression=codec, timestamps_ms=[T0 - 10] * 8)
        for i, (k, v) in enumerate(zip(keys, values)):
            latest[k] = (first + i, v)
    lg.roll()
    st.compact("t", 0, force=True)
    expected = sorted((o, k, v) for k, (o, v) in latest.items())
    assert records(lg) == expected
    b = all_batches(lg)
    assert all(x["attributes"] & 0x07 == CODEC_ID[codec] for x in b)
    assert all(crc_ok(x["bytes"]) for x in b)


# Regression (found by these tests, fixed in the same session): Heap overflow: the output room for
# a batch is _room_needed() = compressed batch size + 10/record + 61 (_clean.pxi:594), checked by
# filter_one (_clean.pxi:899) and reserved by Cleaner._clean_into (cleaner.py:352), but
# _filter_batch writes the rebuilt batch uncompressed from the decompressed payload
# (cleaner.py:419) without a bound: 6.4 MB of records written into a ~4.5 MB bytearray;
# compress_batch_at then raises 'no batch at that range of the buffer' and the process aborts on
# the corrupted heap.
def test_rebuilt_batch_larger_than_the_output_buffer(tmp_path):
    """KAFKA-5316: a compressed batch that loses a record is rebuilt from its decompressed
    records, which can be far larger than the compressed batch (and than the cleaner's output
    buffer). Run in a child process: a write past the buffer kills the interpreter."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(REPO, 'tests')!r})
        from conftest import FakeClock
        import segstore
        st = segstore.open({str(tmp_path / 'store')!r}, clock=FakeClock(),
                           config={{"log.cleaner.dedupe.buffer.size": 24000}})
        st.create_topic("t", 1, config={{"cleanup.policy": "compact",
                                         "segment.bytes": 64 << 20}})
        lg = st.partition("t", 0)
        n, size = 100, 64 * 1024           # 6.4 MB of zeros: a few KB once gzipped
        lg.append_batch([bytes(size)] * n, keys=[b"k%d" % i for i in range(n)],
                        compression="gzip")
        lg.append_batch([b"x"], keys=[b"k0"])
        lg.roll()
        st.compact("t", 0, force=True)
        recs = list(lg.iter_records())
        assert [r.offset for r in recs] == list(range(1, n + 1)), [r.offset for r in recs]
        assert all(r.value == bytes(size) for r in recs[:-1])
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])


# -- the summary (REF §6.13) ---------------------------------------------------------------------

def test_summary_lines():
    """Kafka's recordStats message, line by line, with hand-computed numbers."""
    s = CleanerStats(topic="t", partition=0, thread_id=3, first_dirty_offset=100,
                     end_offset=2000, bytes_read=2500 * MB, bytes_written=1250 * MB,
                     map_bytes_read=1000 * MB, messages_read=1_234_567, messages_written=617_284,
                     buffer_utilization=0.4567, start_time=5_000, map_complete_time=7_000,
                     end_time=15_000)
    text = s.summary()
    assert text.startswith("\n") and text.endswith("\n")
    assert text[1:-1].split("\n") == [
        "\tLog cleaner thread 3 cleaned log t-0 (dirty section = [100, 2000])",
        "\t2,500.0 MB of log processed in 10.0 seconds (250.0 MB/sec).",
        "\tIndexed 1,000.0 MB in 2.0 seconds (500.0 Mb/sec, 20.0% of total time)",
        "\tBuffer utilization: 45.7%",
        "\tCleaned 2,500.0 MB in 8.0 seconds (312.5 Mb/sec, 80.0% of total time)",
        "\tStart size: 2,500.0 MB (1,234,567 messages)",
        "\tEnd size: 1,250.0 MB (617,284 messages)",
        "\t50.0% size reduction (50.0% fewer messages)",
    ]


def test_summary_grouping_follows_kafkas_format_specifiers():
    """Only the %,.1f fields group thousands: the first line's seconds do, the Indexed and
    Cleaned seconds (%.1f) do not."""
    s = CleanerStats(topic="orders", partition=12, thread_id=0, first_dirty_offset=0,
                     end_offset=5, bytes_read=3 * MB // 2, bytes_written=MB // 2,
                     map_bytes_read=MB, messages_read=5, messages_written=2,
                     buffer_utilization=1.0, start_time=0, map_complete_time=1_500_000,
                     end_time=2_500_000)
    assert s.summary()[1:-1].split("\n") == [
        "\tLog cleaner thread 0 cleaned log orders-12 (dirty section = [0, 5])",
        "\t1.5 MB of log processed in 2,500.0 seconds (0.0 MB/sec).",
        "\tIndexed 1.0 MB in 1500.0 seconds (0.0 Mb/sec, 60.0% of total time)",
        "\tBuffer utilization: 100.0%",
        "\tCleaned 1.5 MB in 1000.0 seconds (0.0 Mb/sec, 40.0% of total time)",
        "\tStart size: 1.5 MB (5 messages)",
        "\tEnd size: 0.5 MB (2 messages)",
        "\t66.7% size reduction (60.0% fewer messages)",
    ]


def test_each_round_logs_its_summary(root, clock, caplog):
    st = open_store(root, clock)
    lg = compacted_topic(st)
    for k in (0, 1, 0, 1, 0):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    with caplog.at_level(logging.INFO, logger="segstore.cleaner"):
        [stats] = st.compact("t", 0, force=True)
    msgs = [r.getMessage() for r in caplog.records if r.name == "segstore.cleaner"]
    assert stats.summary() in msgs
    lines = stats.summary()[1:-1].split("\n")
    assert lines[0] == "\tLog cleaner thread -1 cleaned log t-0 (dirty section = [0, 5])"
    assert lines[5] == "\tStart size: 0.0 MB (5 messages)"
    assert lines[6] == "\tEnd size: 0.0 MB (2 messages)"
    assert lines[7].endswith("% size reduction (60.0% fewer messages)")
    assert "Beginning cleaning of log t-0" in msgs
    assert "Building offset map for log t-0 for 1 segments in offset range [0, 5)." in msgs


# -- the dedupe buffer advice ---------------------------------------------------------------------

def advice_workload(root, clock, buffer_bytes, n_keys, repeats=2):
    st = open_store(root, clock, log_cleaner_dedupe_buffer_size=buffer_bytes)
    lg = compacted_topic(st, segment_bytes=1 << 20)
    for _ in range(repeats):
        lg.append_batch([b"v"] * n_keys, keys=[b"key-%d" % i for i in range(n_keys)])
    lg.roll()
    return st, lg


def check_advice(tmp_path, clock, n_keys, caplog):
    small = max(48, 24 * (n_keys // 4))         # a few rounds, not one per key
    max_keys = int(small // 24 * 0.9)
    st, lg = advice_workload(str(tmp_path / "small"), clock, small, n_keys)
    with caplog.at_level(logging.INFO, logger="segstore.cleaner"):
        rounds = st.compact("t", 0, force=True)
    first = rounds[0]
    assert first.map_full and first.end_offset == max_keys
    wanted = first.wanted_buffer_bytes
    assert wanted is not None and wanted % 24 == 0
    line = (f"Offset map of t-0 filled up at offset {max_keys - 1}: a dedupe buffer of "
            f"{wanted} bytes "
            f"(log.cleaner.dedupe.buffer.size, per thread) would have covered the whole dirty "
            f"section [0, {2 * n_keys})")
    assert line in [r.getMessage() for r in caplog.records
                    if r.name == "segstore.cleaner" and r.levelno == logging.INFO]
    # The advice is enough: a store with that buffer cleans the same log in one round...
    st2, lg2 = advice_workload(str(tmp_path / "advised"), clock, wanted, n_keys)
    [one] = st2.compact("t", 0, force=True)
    assert not one.map_full and one.end_offset == 2 * n_keys
    assert records(lg2) == records(lg)
    return wanted


@pytest.mark.parametrize("n_keys", [10, 100, 1000])
def test_wanted_buffer_advice_covers_the_dirty_section(tmp_path, clock, caplog, n_keys):
    """When a round stops on a full map, its stats and an INFO line give the dedupe buffer that
    would have covered the whole dirty section; a store with that buffer does it in one round
    (and the advice is not wildly generous: at most two slots beyond n / load factor)."""
    wanted = check_advice(tmp_path, clock, n_keys, caplog)
    assert wanted <= 24 * (-(-n_keys * 10 // 9) + 2)


# Regression (found by these tests, fixed in the same session): Cleaner._wanted_buffer
# (cleaner.py:258) advises ceil(K / load_factor) + 1 slots for K distinct keys, but map building
# stops as soon as size >= int(slots * load_factor) before any further keyed record (Kafka's
# rule), so it needs int(slots * lf) > K: with K = 9 (any multiple of 9 at lf 0.9) the advised 264
# bytes give 11 slots, max 9 keys, and the advised store still stops on a full map at offset 8.
def test_wanted_buffer_advice_with_a_multiple_of_nine_keys(tmp_path, clock, caplog):
    check_advice(tmp_path, clock, 9, caplog)


def test_no_advice_when_the_map_does_not_fill(root, clock, caplog):
    st, lg = advice_workload(root, clock, 24 * 100, 10)
    with caplog.at_level(logging.INFO, logger="segstore.cleaner"):
        [stats] = st.compact("t", 0, force=True)
    assert not stats.map_full and stats.wanted_buffer_bytes is None
    assert not any("filled up" in r.getMessage() for r in caplog.records)


# -- store.compact --------------------------------------------------------------------------------

def test_compact_respects_eligibility_unless_forced(root, clock):
    st = open_store(root, clock)
    lg = compacted_topic(st, min_cleanable_dirty_ratio=0.9)
    for k in (0, 1, 0):
        lg.append_batch([kv(k)], keys=[kv(k)])
    lg.roll()
    st.compact("t", 0, force=True)          # everything clean now
    lg.append_batch([b"x"], keys=[kv(1)])
    lg.roll()
    assert log_to_clean(st, lg, 3, T0).cleanable_ratio < 0.9
    assert st.compact() == [] and st.compact("t") == []
    [stats] = st.compact("t", 0, force=True)
    assert stats.forced
    assert records(lg) == [(2, b"0", b"0"), (3, b"1", b"x")]
    assert st.compact("t", 0, force=True) == []          # nothing cleanable left


def test_compact_argument_errors(root, clock):
    st = open_store(root, clock)
    st.create_topic("plain", 1)
    compacted_topic(st)
    with pytest.raises(InvalidTopicError):
        st.compact("plain")
    with pytest.raises(InvalidTopicError):
        st.compact(partition=0)


# -- #34-36 producers and transactions ----------------------------------------------------------
#
# Ports of Kafka's LogCleanerTest transaction cases, written through the log's producer-field API
# (append_batch with producer id / epoch / sequence / is_transactional, append_control for
# markers). Kafka's "largeTimestamp" is LARGE here: later than every record, so a second pass at
# LARGE + delete.retention.ms + 1 is past every horizon stamped at LARGE (runTwoPassClean).


LARGE = T0 + 10 ** 10
TXN_DR = 86_400_000

# Regression note (found by these tests, fixed in the same session): the diagnosis as reported.
ABORT_MARKER_LATER_BUG = (
    "Aborted data was recognised only when its .txnindex entry is in the segment being "
    "mapped/filtered: Cleaner.build_offset_map passes collect_aborted(lg, dirty, ...) and "
    "clean_segments collect_aborted(lg, [seg], seg.base_offset, next base) (cleaner.py, "
    "collect_aborted reads only the given segments' indexes), but the entry lives in the "
    "segment of the ABORT marker, which can be a later segment, another group or the active "
    "segment. Kafka uses log.collectAbortedTransactions(start, upper), which walks on into "
    "later segments (segstore has it: transaction_index.collect_aborted_transactions). So the "
    "aborted data is kept and its keys are mapped: it can delete the committed value of the "
    "same key.")


class Producer:
    """Kafka's newProducerAppender: batches of int keys (key = value = str(k)) with sequences."""

    def __init__(self, lg, pid, epoch=0, transactional=True, sequence=0, origin="client"):
        self.lg, self.pid, self.epoch, self.txn, self.seq = lg, pid, epoch, transactional, sequence
        self.origin = origin  # Kafka's AppendOrigin: only a client's sequences are checked

    def __call__(self, keys):
        fields = dict(producer_id=self.pid, producer_epoch=self.epoch, base_sequence=self.seq,
                      is_transactional=self.txn)
        if self.origin == "client":
            info = self.lg.append_batch([kv(k) for k in keys], keys=[kv(k) for k in keys],
                                        **fields)
        else:
            data = _core.encode_batch([kv(k) for k in keys], [kv(k) for k in keys],
                                      timestamps_ms=self.lg.clock(), **fields)
            info = self.lg.append_records(data, origin=self.origin)
        self.seq += len(keys)
        return info


def commit(lg, pid, epoch=0):
    return lg.append_control(ControlRecordType.COMMIT, producer_id=pid, producer_epoch=epoch)


def abort(lg, pid, epoch=0):
    return lg.append_control(ControlRecordType.ABORT, producer_id=pid, producer_epoch=epoch)


def txn_store(root, clock, **cfg):
    st = open_store(root, clock, log_cleaner_dedupe_buffer_size=24 * 4096)
    conf = dict(segment_bytes=2048, delete_retention_ms=TXN_DR)
    conf.update(cfg)
    return st, compacted_topic(st, **conf)


def data_offsets(lg) -> list[int]:
    """Kafka's offsetsInLog: offsets of records with a key and a value, control records (COMMIT
    / ABORT markers) included."""
    data = [r.offset for r in lg.iter_records() if r.key is not None and r.value is not None]
    return sorted(data + marker_offsets(lg))


def int_keys(lg) -> list[int]:
    return [int(k) for k in keys_in_log(lg)]


def batch_bases(lg) -> list[int]:
    return [b["base_offset"] for b in all_batches(lg)]


def last_sequences(lg) -> dict:
    return {b["producer_id"]: b["base_sequence"] + b["last_offset_delta"] for b in all_batches(lg)
            if b["producer_id"] >= 0 and not b["attributes"] & 0x20}


def aborted_txns(lg) -> list[tuple]:
    return [(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
            for t in collect_aborted_transactions(lg.segments, 0, lg.log_end_offset)]


def do_clean(st, lg, first_dirty, now, cleaner=None):
    """Kafka's doClean(LogToClean(log, firstDirty, activeSegment.baseOffset), now)."""
    cleaner = cleaner or make_cleaner(st.clock)
    end, _ = cleaner.clean(log_to_clean(st, lg, first_dirty, now), now)
    return end


def two_pass_clean(st, lg, first_dirty, now, cleaner=None):
    do_clean(st, lg, first_dirty, now, cleaner)
    return do_clean(st, lg, first_dirty, now + TXN_DR + 1, cleaner)


def producer_view(lg) -> dict:
    """What a reload rebuilds from the log's batches: {pid: (last sequence, last data offset,
    epoch)}."""
    return {pid: (e.last_sequence, e.last_data_offset, e.producer_epoch)
            for pid, e in ProducerStateManager.rebuild(lg.segments).producers.items()}


def test_idempotent_producers_keep_their_last_batches(root, clock):
    """#34, Kafka's testDuplicateCheckAfterCleaning: each producer's last batch survives with
    its original last offset and last sequence, so the state a reload rebuilds is unchanged.
    (The re-send half of Kafka's test, duplicates answered with their original offsets after
    the reload, is test_kafka_parity_cleaner.py's test_duplicate_check_after_cleaning.)"""
    st, lg = txn_store(root, clock)
    p1, p2, p3 = (Producer(lg, pid, transactional=False) for pid in (1, 2, 3))
    p1([1, 2, 3])
    p2([3, 1, 4])
    p3([1, 4])
    lg.roll()
    before = producer_view(lg)
    do_clean(st, lg, 0, T0)
    assert last_offsets(lg) == [2, 5, 7]
    assert last_sequences(lg) == {1: 2, 2: 2, 3: 1}
    assert int_keys(lg) == [2, 3, 1, 4]
    assert data_offsets(lg) == [1, 3, 6, 7]
    assert producer_view(lg) == before
    st.close()
    st = open_store(root, clock)
    lg = st.partition("t", 0)
    assert lg.active_producers() == {pid: (last, 0) for pid, last in ((1, 2), (2, 5), (3, 7))}
    # One more producer and round: producer 1's batch loses its last record too, and keeps
    # its last offset and sequence as an empty header.
    Producer(lg, 4, transactional=False)([2])
    lg.roll()
    do_clean(st, lg, 0, T0)
    assert last_sequences(lg) == {1: 2, 2: 2, 3: 1, 4: 0}
    assert last_offsets(lg) == [2, 5, 7, 8]
    assert int_keys(lg) == [3, 1, 4, 2]
    assert data_offsets(lg) == [3, 6, 7, 8]


def test_last_sequence_of_each_producer_is_retained(root, clock):
    """#34, Kafka's testLogCleanerRetainsProducerLastSequence."""
    st, lg = txn_store(root, clock)
    lg.append_batch([b"0"], keys=[b"0"])
    for pid, (k, v, seq) in ((1, (0, 1, 0)), (2, (0, 2, 0)), (3, (0, 3, 0)), (2, (1, 1, 1))):
        lg.append_batch([kv(v)], keys=[kv(k)], producer_id=pid, producer_epoch=0,
                        base_sequence=seq)
    lg.roll()
    do_clean(st, lg, 0, T0, make_cleaner(clock, slots=10, load_factor=0.75))
    assert last_offsets(lg) == [1, 3, 4]
    assert last_sequences(lg) == {1: 0, 2: 1, 3: 0}
    assert int_keys(lg) == [0, 1]
    assert data_offsets(lg) == [3, 4]


def test_last_sequence_survives_an_aborted_transaction(root, clock):
    """#34/#35, Kafka's testLogCleanerRetainsLastSequenceEvenIfTransactionAborted."""
    st, lg = txn_store(root, clock)
    p = Producer(lg, 1)
    p([1])
    p([2, 3])
    abort(lg, 1)
    lg.roll()
    do_clean(st, lg, 0, T0)
    assert last_offsets(lg) == [2, 3]
    assert last_sequences(lg) == {1: 2}
    assert int_keys(lg) == [] and data_offsets(lg) == [3]
    p([1, 5])
    lg.roll()
    do_clean(st, lg, 0, T0)
    assert last_offsets(lg) == [3, 5]
    assert last_sequences(lg) == {1: 4}
    assert int_keys(lg) == [1, 5]
    assert data_offsets(lg) == [3, 4, 5]


def test_basic_transaction_aware_cleaning(root, clock):
    """#35, Kafka's testBasicTransactionAwareCleaning: aborted data goes on the first pass
    whatever its keys; the txn index still lists the aborted transaction."""
    st, lg = txn_store(root, clock)
    p1, p2 = Producer(lg, 1), Producer(lg, 2)
    p1([1, 2])
    p2([2, 3])
    p1([3, 4])
    abort(lg, 1)
    commit(lg, 2)
    p1([2])
    commit(lg, 1)
    aborted = aborted_txns(lg)
    assert aborted == [(1, 0, 6, 2)]
    lg.roll()
    do_clean(st, lg, 0, T0)
    assert int_keys(lg) == [3, 2]
    assert data_offsets(lg) == [3, 6, 7, 8, 9]
    assert aborted_txns(lg) == aborted


def test_multi_pass_cleaning_with_aborted_transactions(root, clock):
    """#35, Kafka's testMultiPassSegmentCleaningWithAbortedTransactions: with a 4-slot map the
    aborted data goes on the first pass, the txn index entries go once no data of their
    transaction is left, and the markers go after delete.retention.ms."""
    dr = 50_000
    st, lg = txn_store(root, clock, delete_retention_ms=dr)
    p1, p2 = Producer(lg, 1), Producer(lg, 2)
    p1([1, 2])          # [0, 1]
    p2([2, 3])          # [2, 3]
    p1([3, 4])          # [4, 5]
    commit(lg, 1)       # 6
    commit(lg, 2)       # 7
    p1([2, 3])          # [8, 9]
    abort(lg, 1)        # 10
    p2([4, 5])          # [11, 12]
    p1([5, 6])          # [13, 14]
    commit(lg, 1)       # 15
    abort(lg, 2)        # 16
    p2([6, 7])          # [17, 18]
    commit(lg, 2)       # 19
    lg.roll()
    assert lg.log_end_offset == 20
    expected_aborted = [(1, 8, 10, 11), (2, 11, 16, 17)]
    assert aborted_txns(lg) == expected_aborted
    assert lg.last_stable_offset == 20

    def one_pass(dirty, now):
        cleaner = make_cleaner(clock, slots=4, load_factor=0.75)
        group = lg.segments[:-1]
        stats = CleanerStats()
        cleaner.build_offset_map(lg, dirty, lg.segments[-1].base_offset, stats)
        filt = _core.BatchFilter(cleaner.offset_map, now, dr, group[-1].read_next_offset())
        cleaner.clean_segments(lg, group, filt, CleanedTransactionMetadata(), now, -1,
                               group[-1].read_next_offset(), lg.truncations, CleanerStats())
        return cleaner.offset_map.latest_offset + 1

    dirty = one_pass(0, T0)
    assert dirty == 4
    assert batch_bases(lg) == [0, 2, 4, 6, 7, 10, 13, 15, 16, 17, 19]
    assert data_offsets(lg) == [0, 2, 3, 4, 5, 6, 7, 10, 13, 14, 15, 16, 17, 18, 19]
    assert aborted_txns(lg) == expected_aborted

    dirty = one_pass(dirty, T0)
    assert dirty == 14
    assert batch_bases(lg) == [0, 2, 4, 6, 7, 10, 13, 15, 16, 17, 19]
    assert data_offsets(lg) == [0, 2, 4, 5, 6, 7, 10, 13, 14, 15, 16, 17, 18, 19]
    assert aborted_txns(lg) == []

    dirty = one_pass(dirty, T0 + dr)
    assert dirty == 20
    assert batch_bases(lg) == [0, 2, 4, 6, 7, 13, 15, 17, 19]
    assert data_offsets(lg) == [0, 2, 4, 5, 6, 7, 13, 15, 17, 18, 19]
    assert aborted_txns(lg) == []


def test_transactions_spanning_segments(root, clock):
    """#36, Kafka's testCleanWithTransactionsSpanningSegments."""
    st, lg = txn_store(root, clock, segment_bytes=1024)
    p1, p2, p3 = Producer(lg, 1), Producer(lg, 2), Producer(lg, 3)
    p1([1, 2])
    p3([2, 3])
    p2([3, 4])
    lg.roll()
    p2([5, 6])
    p3([6, 7])
    p1([7, 8])
    abort(lg, 2)
    p3([8, 9])
    commit(lg, 3)
    p1([9, 10])
    abort(lg, 1)
    dirty = do_clean(st, lg, 0, T0)
    assert int_keys(lg) == [2, 3, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10]
    lg.roll()
    p2([11])
    p1([12])
    do_clean(st, lg, dirty, T0)
    assert int_keys(lg) == [2, 3, 6, 7, 8, 9, 11, 12]


def test_commit_marker_removal(root, clock):
    """#35, Kafka's testCommitMarkerRemoval."""
    st, lg = txn_store(root, clock, segment_bytes=256)
    p = Producer(lg, 1)
    p([1])
    p([2, 3])
    commit(lg, 1)
    p([2])
    commit(lg, 1)
    lg.roll()
    dirty = do_clean(st, lg, 0, LARGE)
    assert int_keys(lg) == [1, 3, 2] and data_offsets(lg) == [0, 2, 3, 4, 5]
    p([1, 3])
    commit(lg, 1)
    lg.roll()
    dirty = do_clean(st, lg, dirty, LARGE)
    assert int_keys(lg) == [2, 1, 3] and data_offsets(lg) == [3, 4, 5, 6, 7, 8]
    dirty = do_clean(st, lg, dirty, LARGE)          # same time: the marker stays
    assert int_keys(lg) == [2, 1, 3] and data_offsets(lg) == [3, 4, 5, 6, 7, 8]
    do_clean(st, lg, dirty, LARGE + TXN_DR)          # past its horizon: gone
    assert int_keys(lg) == [2, 1, 3] and data_offsets(lg) == [4, 5, 6, 7, 8]


def marker_offsets(lg) -> list[int]:
    """Offsets of the control records still in the log (empty control batches hold none)."""
    return [b["base_offset"] for b in all_batches(lg)
            if b["attributes"] & 0x20 and b["records_count"] > 0]


def test_deleted_batches_with_no_messages_read(root, clock):
    """Kafka's testDeletedBatchesWithNoMessagesRead (KAFKA-6854): aborted batches dropped whole
    do not stall cleaning."""
    st, lg = txn_store(root, clock, segment_bytes=1000)
    p = Producer(lg, 1)
    p([1])
    abort(lg, 1)
    p([2])
    p([2])
    commit(lg, 1)
    lg.roll()
    do_clean(st, lg, 0, LARGE)
    assert int_keys(lg) == [2]
    assert data_offsets(lg) == [1, 3, 4]
    two_pass_clean(st, lg, 0, LARGE)
    assert int_keys(lg) == [2]
    assert data_offsets(lg) == [3, 4]


def test_commit_marker_retention_with_empty_batch(root, clock):
    """#36, Kafka's testCommitMarkerRetentionWithEmptyBatch."""
    st, lg = txn_store(root, clock, segment_bytes=256)
    p1, p2 = Producer(lg, 1), Producer(lg, 2)
    p1([2, 3])                               # 0, 1
    lg.roll()
    p2([2, 3])                               # 2, 3
    commit(lg, 2)                            # 4
    lg.roll()
    lg.append_batch([b"2"], keys=[b"2"])     # 5
    lg.append_batch([b"3"], keys=[b"3"])     # 6
    commit(lg, 1)                            # 7
    lg.roll()
    dirty = do_clean(st, lg, 0, LARGE)
    assert int_keys(lg) == [2, 3]
    assert data_offsets(lg) == [4, 5, 6, 7]
    assert last_offsets(lg) == [1, 3, 4, 5, 6, 7]
    dirty = do_clean(st, lg, dirty, LARGE)
    assert last_offsets(lg) == [1, 3, 4, 5, 6, 7]
    p2([1])                                  # 8
    commit(lg, 2)                            # 9
    lg.roll()
    dirty = do_clean(st, lg, dirty, LARGE)
    assert int_keys(lg) == [2, 3, 1]
    assert data_offsets(lg) == [4, 5, 6, 7, 8, 9]
    assert last_offsets(lg) == [1, 4, 5, 6, 7, 8, 9]
    two_pass_clean(st, lg, dirty, LARGE)
    assert int_keys(lg) == [2, 3, 1]
    assert data_offsets(lg) == [5, 6, 7, 8, 9]
    assert last_offsets(lg) == [1, 5, 6, 7, 8, 9]


def test_empty_control_batch_is_cleaned_again(root, clock):
    """#36, Kafka's testCleanEmptyControlBatch: a COMMIT without data is dropped to an empty
    batch (its producer's last), which a later cleaning handles without error."""
    st, lg = txn_store(root, clock, segment_bytes=256)
    commit(lg, 1)                            # 0
    lg.append_batch([b"2"], keys=[b"2"])     # 1
    lg.append_batch([b"3"], keys=[b"3"])     # 2
    lg.roll()
    dirty = two_pass_clean(st, lg, 0, LARGE)
    assert int_keys(lg) == [2, 3]
    assert data_offsets(lg) == [1, 2]
    assert last_offsets(lg) == [0, 1, 2]
    assert all_batches(lg)[0]["records_count"] == 0 and all_batches(lg)[0]["attributes"] & 0x20
    do_clean(st, lg, dirty, LARGE + 10 * TXN_DR)
    assert int_keys(lg) == [2, 3]
    assert last_offsets(lg) == [0, 1, 2]


def test_committed_transaction_spanning_segments(root, clock):
    """#36, Kafka's testCommittedTransactionSpanningSegments: the record and its COMMIT marker
    in the next segment both stay."""
    st, lg = txn_store(root, clock, segment_bytes=128)
    Producer(lg, 1)([1])
    lg.roll()
    commit(lg, 1)
    lg.roll()
    two_pass_clean(st, lg, 0, LARGE)
    assert data_offsets(lg) == [0, 1] and last_offsets(lg) == [0, 1]


def test_aborted_transaction_spanning_segments(root, clock):
    """#36, Kafka's testAbortedTransactionSpanningSegments: the aborted batch is removed (kept
    as an empty header: it is its producer's last batch) and the ABORT marker in the next
    segment stays, since data of its transaction was seen."""
    st, lg = txn_store(root, clock, segment_bytes=128)
    Producer(lg, 1)([1])
    lg.roll()
    abort(lg, 1)
    lg.roll()
    do_clean(st, lg, 0, LARGE)
    assert data_offsets(lg) == [1] and last_offsets(lg) == [0, 1]
    do_clean(st, lg, 0, LARGE + 10 * TXN_DR)
    assert data_offsets(lg) == [1] and last_offsets(lg) == [0, 1]


def test_aborted_data_never_replaces_a_committed_value(root, clock):
    """The committed value of a key survives an aborted write of the same key whose ABORT
    marker sits in the (uncleanable) active segment: the read-committed view (records outside
    every aborted transaction of the .txnindex) still has it."""
    st, lg = txn_store(root, clock)
    lg.append_batch([b"good"], keys=[b"K"])                         # 0
    Producer(lg, 1)([9])                                             # 1, aborted below
    lg.append_batch([b"bad"], keys=[b"K"], producer_id=1, producer_epoch=0, base_sequence=1,
                    is_transactional=True)                           # 2
    lg.roll()
    abort(lg, 1)                                                     # 3, in the active segment
    assert aborted_txns(lg) == [(1, 1, 3, 4)]
    assert lg.last_stable_offset == lg.log_end_offset
    st.compact("t", 0, force=True)
    aborted = aborted_txns(lg)
    committed = [(o, k, v) for o, k, v in records(lg)
                 if not any(a[1] <= o <= a[2] for a in aborted)]
    assert committed == [(0, b"K", b"good")]
    assert records(lg) == [(0, b"K", b"good")]       # aborted data goes on the first pass


def test_abort_marker_removal(root, clock):
    """#35, Kafka's testAbortMarkerRemoval."""
    st, lg = txn_store(root, clock, segment_bytes=256)
    p = Producer(lg, 1)
    p([1])
    p([2, 3])
    abort(lg, 1)
    p([3])
    commit(lg, 1)
    lg.roll()
    dirty = do_clean(st, lg, 0, LARGE)
    assert int_keys(lg) == [3]
    assert data_offsets(lg) == [3, 4, 5]
    two_pass_clean(st, lg, dirty, LARGE)
    assert int_keys(lg) == [3]
    assert data_offsets(lg) == [4, 5]


def test_empty_batch_removal_with_sequence_reuse(root, clock):
    """#34, Kafka's testEmptyBatchRemovalWithSequenceReuse: the group coordinator starts every
    transaction at sequence 0."""
    st, lg = txn_store(root, clock)
    Producer(lg, 1, sequence=0, origin="coordinator")([1])
    commit(lg, 1)
    Producer(lg, 1, sequence=0, origin="coordinator")([2])
    commit(lg, 1)
    lg.append_batch([b"1"], keys=[b"1"])
    lg.append_batch([b"1"], keys=[b"2"])
    lg.roll()
    do_clean(st, lg, 0, LARGE)
    assert data_offsets(lg) == [1, 3, 4, 5]
    assert last_offsets(lg) == [1, 2, 3, 4, 5]
    two_pass_clean(st, lg, 0, LARGE)
    assert data_offsets(lg) == [3, 4, 5]
    assert last_offsets(lg) == [2, 3, 4, 5]


def test_abort_marker_retention_with_empty_batch(root, clock):
    """#35, Kafka's testAbortMarkerRetentionWithEmptyBatch: while an empty batch of the aborted
    transaction remains, its marker and txn index entry stay."""
    st, lg = txn_store(root, clock, segment_bytes=256)
    p = Producer(lg, 1)
    p([2, 3])
    abort(lg, 1)
    lg.roll()
    assert aborted_txns(lg) == [(1, 0, 2, 3)]
    dirty = do_clean(st, lg, 0, LARGE)
    assert aborted_txns(lg) == [(1, 0, 2, 3)]
    assert int_keys(lg) == [] and data_offsets(lg) == [2]     # the marker is retained
    assert last_offsets(lg) == [1, 2]                          # and the empty batch
    dirty = two_pass_clean(st, lg, dirty, LARGE)
    assert aborted_txns(lg) == [(1, 0, 2, 3)]
    assert data_offsets(lg) == [2] and last_offsets(lg) == [1, 2]
    # Kafka appends a transactional batch here and cleans up to the active segment anyway (its
    # test builds LogToClean by hand); segstore's manager stops at the open transaction's first
    # offset (the LSO), so the batch that moves the last sequence on is idempotent instead.
    Producer(lg, 1, transactional=False, sequence=p.seq)([1])
    lg.roll()
    dirty = do_clean(st, lg, dirty, LARGE)
    assert aborted_txns(lg) == [(1, 0, 2, 3)]
    assert int_keys(lg) == [1]
    assert data_offsets(lg) == [2, 3] and last_offsets(lg) == [2, 3]
    two_pass_clean(st, lg, dirty, LARGE)
    assert int_keys(lg) == [1]
    assert data_offsets(lg) == [3] and last_offsets(lg) == [3]
    assert collect_aborted_transactions(lg.segments, 0, 100) == []


def test_data_key_equal_to_a_marker_key_keeps_the_marker(root, clock):
    """#36, Kafka's testCleaningWithKeysConflictingWithTxnMarkerKeys."""
    st, lg = txn_store(root, clock)
    Producer(lg, 1)([1])
    commit(lg, 1)
    commit_key = struct.pack(">hh", 0, ControlRecordType.COMMIT)
    lg.append_batch([b"foo"], keys=[commit_key], producer_id=2, producer_epoch=0,
                    base_sequence=0, is_transactional=True)
    commit(lg, 2)
    lg.roll()
    assert [r.offset for r in lg.iter_records()] == [0, 2]
    do_clean(st, lg, 0, T0, make_cleaner(clock, slots=10, load_factor=0.75))
    assert last_offsets(lg) == [0, 1, 2, 3]
    assert data_offsets(lg) == [0, 1, 2, 3]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_release_pages_drops_the_mapped_pages_and_keeps_the_data(tmp_path):
    """The cleaner drops a segment's mapped pages without the GIL (_core.release_pages): they
    leave the resident set, the data reads back the same, bad arguments are refused."""
    import mmap
    import numpy as np
    path = tmp_path / "f.bin"
    data = os.urandom(4 << 20)
    path.write_bytes(data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    arr = np.frombuffer(mm, dtype=np.uint8)
    arr[::4096].sum()                                  # map every page
    before = map_rss_kib(arr.ctypes.data)
    _core.release_pages(mm, 5, (3 << 20) + 5)           # pages 0 .. the one holding byte 3M+4
    after = map_rss_kib(arr.ctypes.data)
    assert before - after >= 3 << 10
    assert bytes(mm[:]) == data
    _core.release_pages(mm, 7, 7)                       # empty: nothing
    with pytest.raises(ValueError):
        _core.release_pages(mm, 0, len(mm) + 1)
    with pytest.raises(ValueError):
        _core.release_pages(mm, 10, 5)
    with pytest.raises(TypeError):
        _core.release_pages(bytearray(8192), 0, 4096)   # not a file mapping: would lose data
    del arr
    mm.close()


def test_a_partitions_next_map_build_starts_at_the_table_size_its_last_one_reached(root, clock):
    """The cleaner remembers, per partition, the table size a build grew to and starts that
    partition's next build there (the same map as growing again); another partition starts
    small."""
    st = open_store(root, clock)
    lg = compacted_topic(st, segment_bytes=1 << 20)
    n = 40_000
    for lo in range(0, n, 1000):
        lg.append_batch([b"v"] * 1000, keys=[b"k%d" % i for i in range(lo, lo + 1000)])
    lg.roll()
    other = compacted_topic(st, name="u", segment_bytes=1 << 20)
    other.append_batch([b"v"] * 10, keys=[b"k%d" % i for i in range(10)])
    other.roll()
    cleaner = make_cleaner(clock, slots=1_000_000)
    end = lg.segments[-1].base_offset
    cleaner.build_offset_map(lg, 0, end, CleanerStats())
    grown = cleaner.offset_map.table_slots
    assert grown > 65_536
    first = {i: cleaner.offset_map.get(b"k%d" % i) for i in range(0, n, 97)}
    cleaner.build_offset_map(other, 0, other.segments[-1].base_offset, CleanerStats())
    assert cleaner.offset_map.table_slots == 65_536
    cleaner.build_offset_map(lg, 0, end, CleanerStats())
    m = cleaner.offset_map
    assert m.table_slots == grown and m.size == n
    assert {i: m.get(b"k%d" % i) for i in range(0, n, 97)} == first
