"""Reads stop at what they return: damage past it does not fail them, damage inside it does.

One batch in the middle of a sealed segment is damaged (a sealed segment below the recovery point
of a clean shutdown is not recovered on open, so the damage stays). Reads of the intact batches
before it -- bounded by ``max_bytes``, by an end offset or by a timestamp -- return their records;
every read whose range reaches the damaged batch raises CorruptRecordError naming the segment's
file and the batch's position.

Oracles: the byte positions of the batches come from :func:`conftest.batch_spans` (``struct``
only); the records' offsets and timestamps are what the test appended.
"""

from __future__ import annotations

import os
import struct

import pytest

from conftest import batch_spans
from segstore.config import TopicConfig
from segstore.errors import CorruptRecordError
from segstore.log import PartitionLog

T0 = 1_700_000_000_000
BATCHES, PER = 10, 4   # batch i holds offsets 4i .. 4i+3, timestamps T0 + offset
DAMAGED = 3            # offsets 12..15


def _damage(data: bytearray, pos: int, size: int, kind: str) -> None:
    if kind == "crc":
        data[pos + size - 2] ^= 0x01  # inside the last record's value: only the CRC notices
    elif kind == "magic":
        data[pos + 16] = 7
    elif kind == "size_too_small":
        struct.pack_into(">i", data, pos + 8, 5)
    elif kind == "size_past_segment_end":
        struct.pack_into(">i", data, pos + 8, 1 << 20)
    elif kind == "negative_last_offset_delta":
        data[pos + 23] |= 0x80
    else:  # pragma: no cover
        raise ValueError(kind)


KINDS = ["crc", "magic", "size_too_small", "size_past_segment_end", "negative_last_offset_delta"]


@pytest.fixture(params=[(k, i) for k in KINDS for i in (0, 4096)],
                ids=lambda p: f"{p[0]}-interval{p[1]}")
def damaged(tmp_path, request):
    """(log, log file path, batch spans) with batch DAMAGED of the sealed first segment damaged;
    index.interval.bytes 0 indexes every batch, 4096 none."""
    kind, interval = request.param
    directory = str(tmp_path / "t-0")
    config = TopicConfig.from_dict({"index.interval.bytes": interval})
    lg = PartitionLog(directory, "t", 0, config, lambda: T0)
    for b in range(BATCHES):
        offsets = range(b * PER, (b + 1) * PER)
        lg.append_batch([b"value-%03d" % o for o in offsets],
                        timestamps_ms=[T0 + o for o in offsets])
    lg.roll()  # the first segment is sealed: a clean reopen leaves it as it is
    lg.append_batch([b"next"], timestamps_ms=[T0 + 100])
    lg.close()
    path = os.path.join(directory, f"{0:020d}.log")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    spans = batch_spans(bytes(data))
    assert len(spans) == BATCHES
    _damage(data, *spans[DAMAGED], kind)
    with open(path, "wb") as f:
        f.write(data)
    lg = PartitionLog(directory, "t", 0, config, lambda: T0)
    yield lg, path, spans
    lg.close()


def offsets(records) -> list[int]:
    return [r.offset for r in records]


@pytest.mark.parametrize("offset", [0, 5, 8, 11])
def test_small_read_before_the_damage(damaged, offset):
    """read(o, max_bytes=1) returns o's batch even when the damaged batch is the next one."""
    lg, _, _ = damaged
    batch_end = (offset // PER + 1) * PER
    assert offsets(lg.read(offset, max_bytes=1)) == list(range(offset, batch_end))


def test_bounded_reads_before_the_damage(damaged):
    """Reads bounded by bytes, offsets or a timestamp short of the damaged batch succeed."""
    lg, _, spans = damaged
    up_to_damage = spans[DAMAGED][0] - spans[1][0]  # the bytes of batches 1 and 2
    assert offsets(lg.read(4, max_bytes=up_to_damage)) == list(range(4, 12))
    assert offsets(lg.iter_records(0, DAMAGED * PER)) == list(range(12))
    assert list(lg.read_columns(4, DAMAGED * PER).offsets) == list(range(4, 12))
    found = lg.offset_for_time(T0 + 9)
    assert (found.offset, found.timestamp) == (9, T0 + 9)


def test_reads_reaching_the_damage_raise(damaged):
    """Every read whose range holds the damaged batch raises, naming the file and position."""
    lg, path, spans = damaged
    reaching = {
        "read to 1 MiB": lambda: lg.read(4),
        "read of the damaged batch": lambda: lg.read(DAMAGED * PER, max_bytes=1),
        "read ending with it": lambda: lg.read(8, max_bytes=sum(spans[DAMAGED]) - spans[2][0]),
        "iter_records into it": lambda: list(lg.iter_records(0, DAMAGED * PER + 1)),
        "read_columns into it": lambda: lg.read_columns(4, DAMAGED * PER + 1),
        "offset_for_time in it": lambda: lg.offset_for_time(T0 + DAMAGED * PER + 1),
    }
    for what, read in reaching.items():
        try:
            read()
        except CorruptRecordError as e:
            assert (e.file, e.position) == (path, spans[DAMAGED][0]), what
        else:
            pytest.fail(f"{what}: no CorruptRecordError")
