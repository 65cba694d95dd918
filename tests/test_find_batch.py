"""_core.find_batch: the batch holding an offset, from a start position, as plain ints.

Expected answers come from walking the batches' size fields with ``struct`` (conftest's
``batch_spans`` and ``v2_header``), not from the code under test. Damaged and truncated inputs
must raise CorruptRecordError naming the file and the batch's position, and the answer for
``[start, end)`` must never depend on bytes past ``end`` (the debug build's rule that a parser
reads nothing outside its bounds: garbage after ``end`` changes nothing).
"""

from __future__ import annotations

import struct

import pytest

from conftest import batch_spans, v2_header
from segstore import _core
from segstore.errors import (BufferTypeError, CorruptRecordError, InvalidArgumentError,
                             OffsetTypeError)

FILE = "/data/t-0/00000000000000000000.log"


def log_bytes():
    """Five v2 batches: offsets 0-2, 3, 4-8 (a gap at 6-7), a control batch at 9, 10-11."""
    return b"".join([
        _core.encode_batch([b"a", b"b", b"c"], timestamps_ms=1, base_offset=0),
        _core.encode_batch([b"d"], timestamps_ms=2, base_offset=3),
        _core.encode_batch([b"e", b"f", b"g"], timestamps_ms=3, base_offset=4,
                           offset_deltas=[0, 1, 4]),
        _core.encode_control_batch(1, producer_id=7, producer_epoch=0, base_offset=9,
                                   timestamp_ms=4),
        _core.encode_batch([b"h", b"i"], timestamps_ms=5, base_offset=10),
    ])


def expected(buf, start, end, offset):
    """The header dict of the first whole batch in [start, end) whose last offset >= offset."""
    for pos, size in batch_spans(buf[:end]):
        if pos < start:
            continue
        h = v2_header(buf, pos)
        if h["base_offset"] + h["last_offset_delta"] >= offset:
            return pos, size, h
    return None


def test_every_offset_from_every_batch_start_matches_a_struct_walk():
    buf = log_bytes()
    spans = batch_spans(buf)
    assert len(spans) == 5
    for start, _ in spans:
        for offset in range(-1, 14):
            got = _core.find_batch(buf, start, len(buf), offset, file=FILE)
            want = expected(buf, start, len(buf), offset)
            if want is None:
                assert got is None
                continue
            pos, size, h = want
            assert isinstance(got, _core.HeaderRow)
            assert (got.position, got.size) == (pos, size)
            assert got.last_offset == h["base_offset"] + h["last_offset_delta"]
            for field in ("base_offset", "max_timestamp", "records_count", "attributes",
                          "magic", "crc", "producer_id"):
                assert getattr(got, field) == h[field], field
            # The same fields, in the same order, as a scan's row.
            row = _core.scan_batches(buf, pos, pos + size).batches[0]
            assert tuple(got) == tuple(row.tolist())


def test_first_holds_checks_the_batch_at_start():
    buf = log_bytes()
    (p0, _), (p1, _), (p2, _) = batch_spans(buf)[:3]
    # Offset 5 lies in the third batch (4-8); an index entry names a batch's offset.
    assert _core.find_batch(buf, p2, len(buf), 5, first_holds=4).position == p2
    assert _core.find_batch(buf, p2, len(buf), 11, first_holds=8).base_offset == 10
    assert _core.find_batch(buf, p2, len(buf), 99, first_holds=8) is None
    assert _core.find_batch(buf, p1, len(buf), 5, first_holds=4) is False  # batch 3-3
    assert _core.find_batch(buf, p2 + 7, len(buf), 5, first_holds=4) is False  # inside a batch
    # A whole first batch holding the entry: trusted, and a torn batch after it is damage
    # once the walk needs it.
    assert _core.find_batch(buf, p0, p2 - 1, 1, first_holds=0).position == p0
    with pytest.raises(CorruptRecordError) as e:
        _core.find_batch(buf, p0, p2 - 1, 5, first_holds=0, file=FILE)
    assert e.value.position == p1
    assert _core.find_batch(buf, p1, p2 - 1, 5, first_holds=3) is False  # torn first batch


@pytest.mark.parametrize("damage", ["size", "magic", "delta"])
def test_damage_raises_only_when_the_walk_reaches_it(damage):
    buf = bytearray(log_bytes())
    spans = batch_spans(buf)
    bad = spans[2][0]
    if damage == "size":
        struct.pack_into(">i", buf, bad + 8, 5)  # below the 14-byte minimum
    elif damage == "magic":
        buf[bad + 16] = 7
    else:
        struct.pack_into(">i", buf, bad + 23, -1)  # a negative last offset delta
    data = bytes(buf)
    assert _core.find_batch(data, 0, len(data), 3, file=FILE).position == spans[1][0]
    for offset in (4, 11, 99):
        with pytest.raises(CorruptRecordError) as e:
            _core.find_batch(data, 0, len(data), offset, file=FILE)
        assert (e.value.file, e.value.position) == (FILE, bad)
        assert f"position {bad}" in str(e.value) and FILE in str(e.value)
    # From an index entry at the damaged batch: not trusted, nothing raised.
    assert _core.find_batch(data, bad, len(data), 5, first_holds=4, file=FILE) is False


def test_truncated_input_never_reads_past_end():
    """Every cut of the log: the answer is a whole batch before the cut, None at a batch
    boundary, or CorruptRecordError at the torn batch; the bytes after ``end`` never matter."""
    buf = log_bytes()
    spans = batch_spans(buf)
    ends = {pos + size for pos, size in spans}
    for cut in range(len(buf) + 1):
        torn = max([p for p, _ in spans if p < cut] + [0])
        for offset in (0, 3, 5, 9, 11, 12):
            answers = []
            for data in (buf[:cut], buf[:cut] + b"\xff" * 80, buf[:cut] + b"\x00" * 80):
                try:
                    got = _core.find_batch(data, 0, cut, offset, file=FILE)
                    answers.append(got if got is None else tuple(got))
                except CorruptRecordError as e:
                    answers.append(("error", e.position))
            assert answers[0] == answers[1] == answers[2], (cut, offset)
            want = expected(buf, 0, cut, offset)
            if want is not None:
                assert answers[0][:1] == (want[0],)
            elif cut == 0 or cut in ends:
                assert answers[0] is None
            else:
                assert answers[0] == ("error", torn), (cut, offset)


def test_arguments_are_checked():
    buf = log_bytes()
    with pytest.raises(InvalidArgumentError):
        _core.find_batch(buf, 0, len(buf) + 1, 0)
    with pytest.raises(InvalidArgumentError):
        _core.find_batch(buf, -1, len(buf), 0)
    with pytest.raises(OffsetTypeError):
        _core.find_batch(buf, 0, len(buf), 1.5)
    with pytest.raises(BufferTypeError):
        _core.find_batch(None, 0, 0, 0)
    assert _core.find_batch(b"", 0, 0, 0) is None
