"""Spec conformance of the log and retention (REF §3.3-§3.8, §5): rules the other test files
leave unpinned at the PartitionLog level.

Each test is one rule, named after it; its docstring cites the REF section. Expectations come
from the rule's arithmetic over batch sizes measured here with conftest's struct-only helpers
(never from segstore's own accounting), and time moves only through a fake clock.
"""

from __future__ import annotations

import os

import pytest

from conftest import FakeClock, batch_spans
from segstore import _core
from segstore.config import TopicConfig
from segstore.errors import InvalidOffsetError
from segstore.log import PartitionLog
from segstore.retention import RETENTION_BYTES, enforce

T0 = 1_700_000_000_000


def cfg(**kw) -> TopicConfig:
    return TopicConfig.from_dict({k.replace("_", "."): v for k, v in kw.items()})


def open_log(tmp_path, clock=None, name="t-0", **kw) -> PartitionLog:
    return PartitionLog(str(tmp_path / name), "t", 0, cfg(**kw), clock or FakeClock(T0))


def one_batch_size() -> int:
    """Bytes of one single-record batch of VALUE at T0 (every such batch has this size)."""
    data = _core.encode_batch([VALUE], timestamps_ms=T0)
    (pos, size), = batch_spans(data)
    return size


VALUE = b"v" * 20


def file_bytes(seg) -> bytes:
    with open(seg.log_path, "rb") as f:
        return f.read()


def layout(lg) -> list[tuple[int, int]]:
    """(base offset, batches in the .log file) of every segment, counted from the files."""
    return [(s.base_offset, len(batch_spans(file_bytes(s)))) for s in lg.segments]


# ---------------------------------------------------------------------------------------------
# Roll conditions (REF §3.3)
# ---------------------------------------------------------------------------------------------

def test_roll_by_segment_bytes_fills_the_segment_exactly_and_rolls_one_byte_over(tmp_path):
    """REF §3.3 condition 1: roll iff ``size > segment.bytes - incoming``; an append that ends
    the file exactly at ``segment.bytes`` stays in the segment (the log's one-batch path and
    its general loop both decide it)."""
    n = one_batch_size()
    exact = open_log(tmp_path, name="exact-0", segment_bytes=3 * n)
    short = open_log(tmp_path, name="short-0", segment_bytes=3 * n - 1)
    for _ in range(7):
        exact.append_batch([VALUE], timestamps_ms=[T0])
        short.append_batch([VALUE], timestamps_ms=[T0])
    assert layout(exact) == [(0, 3), (3, 3), (6, 1)]
    assert [s.size for s in exact.segments[:-1]] == [3 * n, 3 * n]
    assert layout(short) == [(0, 2), (2, 2), (4, 2), (6, 1)]


def test_a_multi_batch_append_fills_the_active_segment_before_rolling(tmp_path):
    """REF §3.2 step 3 and §3.3 condition 1 take a whole append: Kafka rolls before an append
    of several batches that does not fit, and refuses one larger than ``segment.bytes``.
    segstore places batch by batch (a deliberate difference, docs/architecture.md "An append
    of several batches may span segments"): the batches that fit go to the active segment, the
    log rolls for the rest, and an append larger than a segment spans several."""
    n = one_batch_size()
    lg = open_log(tmp_path, segment_bytes=3 * n)
    lg.append_batch([VALUE], timestamps_ms=[T0])
    lg.append_batch([VALUE], timestamps_ms=[T0])
    two = b"".join(_core.encode_batch([VALUE], timestamps_ms=T0) for _ in range(2))
    info = lg.append_records(two)
    assert (info.first_offset, info.last_offset) == (2, 3)
    assert layout(lg) == [(0, 3), (3, 1)]   # Kafka: [(0, 2), (2, 2)]
    five = b"".join(_core.encode_batch([VALUE], timestamps_ms=T0) for _ in range(5))
    info = lg.append_records(five)          # Kafka: RecordBatchTooLargeException
    assert (info.first_offset, info.last_offset) == (4, 8)
    assert layout(lg) == [(0, 3), (3, 3), (6, 3)]
    assert [r.offset for r in lg.read(0, max_bytes=10**6)] == list(range(9))


def test_roll_ms_is_min_of_segment_ms_and_max_compaction_lag_less_jitter(tmp_path):
    """REF §3.3 condition 2: roll iff ``waited > maxSegmentMs - rollJitterMs``, where
    ``maxSegmentMs = min(segment.ms, max.compaction.lag.ms)`` for a compacted topic and
    ``segment.ms`` otherwise; the jitter (drawn per segment below min(segment.jitter.ms,
    segment.ms)) is taken off the capped limit too."""
    conf = dict(segment_ms=10_000, max_compaction_lag_ms=1_000, segment_jitter_ms=400)
    for policy, limit in (("compact", 1_000), ("compact,delete", 1_000), ("delete", 10_000)):
        lg = open_log(tmp_path, name=f"{policy.replace(',', '_')}-0", cleanup_policy=policy,
                      **conf)
        for round_ in range(3):
            start = T0 + round_ * 10**6
            lg.append(b"a", key=b"k", timestamp_ms=start)
            seg = lg.active_segment
            j = seg.roll_jitter_ms
            assert 0 <= j < 400
            lg.append(b"b", key=b"k", timestamp_ms=start + limit - j)  # waited == limit - j
            assert lg.active_segment is seg, (policy, j)
            lg.append(b"c", key=b"k", timestamp_ms=start + limit - j + 1)
            assert lg.active_segment is not seg, (policy, j)
            assert lg.active_segment.base_offset == lg.log_end_offset - 1
    # A lag above segment.ms caps nothing.
    lg = open_log(tmp_path, name="lag-0", cleanup_policy="compact", segment_ms=1_000,
                  max_compaction_lag_ms=5_000)
    lg.append(b"a", key=b"k", timestamp_ms=T0)
    lg.append(b"b", key=b"k", timestamp_ms=T0 + 1_000)
    assert len(lg.segments) == 1
    lg.append(b"c", key=b"k", timestamp_ms=T0 + 1_001)
    assert len(lg.segments) == 2


# ---------------------------------------------------------------------------------------------
# Flush policy and recovery point (REF §3.4), truncation (REF §3.8)
# ---------------------------------------------------------------------------------------------

def test_flush_to_an_offset_moves_the_recovery_point_there_and_never_back(tmp_path):
    """REF §3.4: ``flush(offset)`` syncs the segments overlapping [recoveryPoint, offset), then
    ``recoveryPoint := offset``, only ever forward (and never past the log end)."""
    lg = open_log(tmp_path, segment_bytes=3 * one_batch_size())
    for _ in range(8):
        lg.append_batch([VALUE], timestamps_ms=[T0])
    # Rolls flushed up to the active segment's base.
    assert lg.recovery_point == lg.active_segment.base_offset == 6
    lg.flush(7)
    assert lg.recovery_point == 7          # inside the active segment: exactly there
    lg.flush(4)
    assert lg.recovery_point == 7          # never back
    lg.flush(100)
    assert lg.recovery_point == 8          # capped at the log end
    lg.append_batch([VALUE], timestamps_ms=[T0])
    assert lg.recovery_point == 8          # flush.messages defaults to Long.MAX_VALUE


def test_flush_ms_counts_from_the_last_flush_and_an_append_checks_it_too(tmp_path):
    """REF §3.4: a log is flushed once ``now - lastFlushTime >= flush.ms``. Kafka's periodic
    flusher checks it; segstore also checks it at every append (as its flusher, ``tick``,
    does), so the append that comes ``flush.ms`` after the last flush makes itself durable."""
    clock = FakeClock(T0)
    lg = open_log(tmp_path, clock, flush_ms=1_000)
    lg.append(b"a")
    assert lg.recovery_point == 0            # 0 ms since the open
    clock.advance(999)
    lg.append(b"b")
    assert lg.recovery_point == 0            # 999 ms: not yet
    clock.advance(1)
    lg.append(b"c")
    assert lg.recovery_point == 3            # 1000 ms: the append flushed, itself included
    clock.advance(999)
    lg.append(b"d")
    assert lg.recovery_point == 3            # the clock restarted at that flush
    clock.advance(1)
    lg.maybe_flush()
    assert lg.recovery_point == 4


def test_truncation_lowers_recovery_point_and_log_start_offset_to_the_new_end(tmp_path):
    """REF §3.8: after ``truncateTo(target)`` the log end is the target (segstore: where the
    data ends, the same at a batch edge), the recovery point is at most the new end, and
    ``logStartOffset := min(target, logStartOffset)``."""
    lg = open_log(tmp_path, segment_bytes=3 * one_batch_size())
    for _ in range(10):
        lg.append_batch([VALUE], timestamps_ms=[T0])
    lg.flush()
    lg.delete_records(7)
    assert (lg.log_start_offset, lg.recovery_point, lg.log_end_offset) == (7, 10, 10)
    lg.truncate_to(8)                      # above the log start: it stays
    assert (lg.log_start_offset, lg.recovery_point, lg.log_end_offset) == (7, 8, 8)
    lg.truncate_to(4)                      # below it: the start follows the end down
    assert (lg.log_start_offset, lg.recovery_point, lg.log_end_offset) == (4, 4, 4)
    assert [s.base_offset for s in lg.segments] == [0, 3]
    assert lg.append_batch([VALUE], timestamps_ms=[T0]).first_offset == 4
    assert [r.offset for r in lg.read(4)] == [4]


# ---------------------------------------------------------------------------------------------
# Read (REF §3.6)
# ---------------------------------------------------------------------------------------------

def test_read_max_bytes_takes_batches_while_their_total_fits_exactly(tmp_path):
    """REF §3.6 step 4: the range holds up to ``maxBytes`` bytes of batches from the first
    (segstore ends it on a batch edge, docs/architecture.md "Reads never trust what they
    cannot check"); ``minOneMessage`` makes the first batch whole whatever ``maxBytes`` is.
    Kafka's fetch stops at the segment's end; segstore's read goes on into the next segment
    (docs/architecture.md "A read goes on into the next segments"), taking its batches only
    while the total still fits."""
    n = one_batch_size()
    lg = open_log(tmp_path, segment_bytes=3 * n)
    for _ in range(7):
        lg.append_batch([VALUE], timestamps_ms=[T0])

    def offsets(start, max_bytes):
        return [r.offset for r in lg.read(start, max_bytes=max_bytes)]

    assert offsets(0, 0) == [0] and offsets(0, 1) == [0] and offsets(0, n) == [0]
    assert offsets(0, 2 * n - 1) == [0]
    assert offsets(0, 2 * n) == [0, 1]
    assert offsets(1, 2 * n) == [1, 2]               # the segment's last two
    assert offsets(1, 3 * n - 1) == [1, 2]           # one byte short of the next segment's first
    assert offsets(1, 3 * n) == [1, 2, 3]            # ... which then fits exactly
    assert offsets(2, 5 * n) == [2, 3, 4, 5, 6]


# ---------------------------------------------------------------------------------------------
# Offsets by timestamp (REF §3.7)
# ---------------------------------------------------------------------------------------------

def test_max_timestamp_takes_the_first_segment_on_ties_and_its_first_record_with_it(tmp_path):
    """REF §3.7 MAX_TIMESTAMP (-3): the segment with the largest max timestamp, the first one
    on ties; in it the first batch reaching that timestamp, and there the first record
    carrying it."""
    lg = open_log(tmp_path)
    lg.append_batch([b"a", b"b", b"c"], timestamps_ms=[T0 + 1, T0 + 9, T0 + 9])   # 0..2
    lg.append_batch([b"d"], timestamps_ms=[T0 + 9])                               # 3
    lg.roll()
    lg.append_batch([b"e", b"f"], timestamps_ms=[T0 + 9, T0 + 2])                 # 4, 5
    assert lg.offset_for_time(-3) == (1, T0 + 9, None)
    lg.append_batch([b"g"], timestamps_ms=[T0 + 10])                              # 6
    assert lg.offset_for_time(-3) == (6, T0 + 10, None)


def test_earliest_local_timestamp_is_the_log_start_offset_without_tiered_storage(tmp_path):
    """REF §3.7: -4 EARLIEST_LOCAL behaves like -2 EARLIEST when there is no tiered storage:
    the log start offset, timestamp -1. The other tiered-storage targets stay refused."""
    lg = open_log(tmp_path)
    assert lg.offset_for_time(-4) == (0, -1, None)
    for i in range(5):
        lg.append_batch([b"x"], timestamps_ms=[T0 + i])
    lg.delete_records(3)
    assert lg.offset_for_time(-4) == lg.offset_for_time(-2) == (3, -1, None)
    with pytest.raises(InvalidOffsetError):
        lg.offset_for_time(-5)


# ---------------------------------------------------------------------------------------------
# Retention (REF §5)
# ---------------------------------------------------------------------------------------------

def test_retention_bytes_counts_the_logical_size_of_preallocated_segments(tmp_path):
    """REF §5 with §2.7: retention.bytes compares the segments' ``.log`` sizes (their data), not
    the files' lengths: a preallocated active segment counts its bytes written, and index files
    count nothing."""
    n = one_batch_size()
    clock = FakeClock(T0)
    conf = dict(segment_bytes=4 * n, preallocate=True, retention_ms=-1)
    lg = open_log(tmp_path, clock, retention_bytes=7 * n, **conf)
    for _ in range(10):                    # segments of 4, 4 and 2 batches: 10n bytes
        lg.append_batch([VALUE], timestamps_ms=[T0])
    active = lg.active_segment
    assert os.path.getsize(active.log_path) == 4 * n > active.size == 2 * n
    # size 10n, limit 7n: diff 3n is less than the first segment (4n), so nothing goes.
    # Counting the preallocated file (12n: diff 5n) would delete the first segment.
    assert enforce(lg, clock()).deleted == ()
    # Limit 6n: diff 4n takes the first segment exactly; the 6n left stay.
    lg.config = cfg(retention_bytes=6 * n, **conf)
    res = enforce(lg, clock())
    assert [(d.base_offset, d.reason) for d in res.deleted] == [(0, RETENTION_BYTES)]
    assert [s.base_offset for s in lg.segments] == [4, 8] and lg.log_start_offset == 4
    assert enforce(lg, clock()).deleted == ()
