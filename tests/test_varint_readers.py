"""The core's varint readers at their limits, through every reader of v2 records.

Kafka's ByteUtils reads a varint of up to 5 bytes and a varlong of up to 10, padded encodings
included (continuation bytes carrying zero bits), and rejects a longer one (REF §1.1). The
column decoder, the object decoder, the offset-map build and the cleaner's filter share one
inline varint reader with an out-of-line general path; these tests put each record field of a
batch at every legal width, one byte too long, and cut off after a continuation byte, and check
that each reader takes or rejects it the same way.
"""

from __future__ import annotations

import struct
import sys

import pytest

from conftest import fix_crc, guarded_copy, run_in_child
from segstore import _core
from segstore.errors import CorruptRecordError

T0 = 1_700_000_000_000
BASE = 500
# Field name, its width in bits (varint 32, varlong 64).
FIELDS = [("length", 32), ("timestamp_delta", 64), ("offset_delta", 32), ("key_length", 32),
          ("value_length", 32), ("header_count", 32)]
MAX_BYTES = {32: 5, 64: 10}
# The record fields the offset-map build reads (it jumps over the value and headers) and those
# the filter reads (it jumps over the headers).
MAP_BUILD_READS = {"length", "timestamp_delta", "offset_delta", "key_length"}
FILTER_READS = MAP_BUILD_READS | {"value_length"}
RECORDS = [(-3, 0, b"k-0", b"v-00"), (4, 1, b"k-1", b"v-11"), (9, 2, b"k-2", b"v-22")]


def varint(value: int, bits: int, width: int | None = None) -> bytes:
    """Zigzag ``value`` as a varint of ``width`` bytes (padded with zero groups if needed)."""
    z = ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)
    groups = []
    while True:
        groups.append(z & 0x7F)
        z >>= 7
        if z == 0 and (width is None or len(groups) >= width):
            break
    assert width is None or len(groups) == width, "value does not fit the width"
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def record(ts_delta, offset_delta, key, value, field=None, width=None, cut=False) -> bytes:
    """One v2 record (REF §1.7) with ``field`` written ``width`` bytes wide; ``cut`` ends the
    record right after a continuation byte of ``field`` instead."""
    parts = [("timestamp_delta", lambda w: varint(ts_delta, 64, w)),
             ("offset_delta", lambda w: varint(offset_delta, 32, w)),
             ("key_length", lambda w: varint(len(key), 32, w) + key),
             ("value_length", lambda w: varint(len(value), 32, w) + value),
             ("header_count", lambda w: varint(0, 32, w))]
    body = b"\x00"   # attributes
    for name, write in parts:
        if name == field and cut:
            body += b"\x80"
            break
        body += write(width if name == field else None)
    if field == "length" and cut:
        return b"\x80"
    return varint(len(body), 32, width if field == "length" else None) + body


def batch(records: list[bytes], base_offset: int) -> bytearray:
    """An uncompressed v2 batch (no producer, CreateTime) around ``records``, CRC set."""
    n = len(records)
    body = b"".join(records)
    head = struct.pack(">qiiBIhiqqqhii", base_offset, 49 + len(body), 0, 2, 0, 0, n - 1,
                       T0, T0 + 9, -1, -1, -1, n)
    buf = bytearray(head + body)
    fix_crc(buf)
    return buf


def log_with(field=None, width=None, cut=False) -> tuple[bytes, int]:
    """A good batch, then one whose first record has ``field`` at ``width`` (or cut off), then
    the position of that second batch."""
    first = batch([record(0, 0, b"lead", b"x")], BASE - 1)
    recs = [record(*RECORDS[0], field=field, width=width, cut=cut)]
    recs += [record(*r) for r in RECORDS[1:]]
    return bytes(first + batch(recs, BASE)), len(first)


def expected_rows():
    return [(BASE - 1, T0, b"lead", b"x")] + [
        (BASE + od, T0 + ts, k, v) for ts, od, k, v in RECORDS]


def assert_corrupt(call, reason: str, position: int):
    with pytest.raises(CorruptRecordError) as ei:
        call()
    assert ei.value.reason == reason
    assert ei.value.position == position


def assert_every_reader_rejects(buf, pos, field, reason):
    """Both decoders reject the batch at ``pos``, and so do the map build and the filter when
    they read ``field``."""
    assert_corrupt(lambda: _core.decode_columns(buf, validate_crc=True), reason, pos)
    assert_corrupt(lambda: _core.decode_records(buf), reason, pos)
    if field in MAP_BUILD_READS:
        assert_corrupt(lambda: build_map(buf), reason, pos)
    if field in FILTER_READS:
        assert_corrupt(lambda: filter_second_batch(buf, pos), reason, pos)


def build_map(buf):
    omap = _core.OffsetMap(24 * 1024)
    _core.build_offset_map(omap, buf, 0, len(buf), 0, validate_crc=True)
    return omap


def filter_second_batch(buf, pos):
    """Filter the second batch over a map of the whole log: every record is the latest of its
    key, so the batch is written back verbatim."""
    omap = build_map(log_with()[0])
    filt = _core.BatchFilter(omap, T0, 0, BASE + len(RECORDS))
    out = bytearray(len(buf) * 2)
    op, rebuilt = filt.filter_one(buf, pos, 0, False, False, out, 0)
    return bytes(out[:op]), rebuilt


LEGAL = [(f, w) for f, bits in FIELDS for w in range(1, MAX_BYTES[bits] + 1)]


@pytest.mark.parametrize("field,width", LEGAL)
def test_every_legal_width_reads_the_same_record(field, width):
    buf, pos = log_with(field, width)
    cols = _core.decode_columns(buf, validate_crc=True)
    assert [(int(o), int(t), bytes(k), bytes(v)) for o, t, k, v in zip(
        cols.offsets, cols.timestamps_ms, cols.keys.to_pylist(), cols.values.to_pylist())] \
        == expected_rows()
    assert [(r.offset, r.timestamp, r.key, r.value) for r in _core.decode_records(buf)] \
        == expected_rows()
    omap = build_map(buf)
    assert [omap.get(k) for _, _, k, _ in expected_rows()] == [o for o, _, _, _ in expected_rows()]
    out, rebuilt = filter_second_batch(buf, pos)
    assert out == buf[pos:] and not rebuilt


@pytest.mark.parametrize("field,bits", FIELDS)
def test_one_byte_too_long_is_corrupt_in_every_reader_that_reads_the_field(field, bits):
    buf, pos = log_with(field, MAX_BYTES[bits] + 1)
    assert_every_reader_rejects(buf, pos, field, "varint is too long")


@pytest.mark.parametrize("field,bits", FIELDS)
def test_a_varint_cut_off_at_its_record_end_is_corrupt(field, bits):
    buf, pos = log_with(field, cut=True)
    assert_every_reader_rejects(buf, pos, field,
                                "a length field runs past the end of its record or batch")


# -- no read past the buffer's end -------------------------------------------------------------
# The varint fast paths read the byte after a continuation byte only when it lies before `end`.
# Past a record's end that byte is still in the buffer, and a reader that took it would mostly
# fail with the same reason, so the outcomes above can hardly tell; at the end of the buffer
# itself it is a read of memory that may not be there. These cases put the field under test
# in the last byte(s) of the buffer, which ends where a PROT_NONE page begins, in a child
# process (a read past the end is a SIGSEGV there), and compare every reader's outcome with
# its outcome on a plain copy of the bytes.

def header_record(cut: bool) -> bytes:
    """One record with a header whose null value's length (one byte, -1) ends the record, or
    whose value length is cut off after a continuation byte."""
    ts_delta, offset_delta, key, value = RECORDS[-1]
    body = (b"\x00" + varint(ts_delta, 64) + varint(offset_delta, 32) + varint(len(key), 32) + key
            + varint(len(value), 32) + value)
    body += varint(1, 32) + varint(2, 32) + b"hk" + (b"\x80" if cut else varint(-1, 32))
    return varint(len(body), 32) + body


def logs_ending_in_each_field():
    """(name, log) pairs: two batches, the second's last record with each field at each legal
    width, one byte too wide, or cut off after a continuation byte, so that the field's last
    byte is the log's last byte whenever it is the record's last field."""
    first = bytes(batch([record(0, 0, b"lead", b"x")], BASE - 1))
    cases = [(None, None, False)] + [(f, w, False) for f, bits in FIELDS
                                     for w in range(1, MAX_BYTES[bits] + 2)]
    cases += [(f, None, True) for f, _ in FIELDS]
    for field, width, cut in cases:
        recs = [record(*r) for r in RECORDS[:-1]]
        recs.append(record(*RECORDS[-1], field=field, width=width, cut=cut))
        yield f"{field}-{width}-{cut}", first + bytes(batch(recs, BASE))
    for cut in (False, True):
        recs = [record(*r) for r in RECORDS[:-1]] + [header_record(cut)]
        yield f"header-{cut}", first + bytes(batch(recs, BASE))


def reader_outcomes(buf) -> dict:
    """What each reader makes of ``buf``: its result, or the CorruptRecordError's reason and
    position."""
    def outcome(call):
        try:
            return ("ok", call())
        except CorruptRecordError as e:
            return ("corrupt", e.reason, e.position)

    def columns():
        c = _core.decode_columns(buf, validate_crc=True)
        return (c.offsets.tolist(), c.keys.to_pylist(), c.values.to_pylist())

    def records():
        return [(r.offset, r.key, r.value, r.headers) for r in _core.decode_records(buf)]

    def offset_map():
        omap = build_map(buf)
        return [omap.get(k) for k in (b"lead", b"k-0", b"k-1", b"k-2")]

    def scan():
        return _core.scan_batches(buf, validate_crc=True).batches["size"].tolist()

    pos = len(batch([record(0, 0, b"lead", b"x")], BASE - 1))
    return {"columns": outcome(columns), "records": outcome(records),
            "map": outcome(offset_map), "scan": outcome(scan),
            "filter": outcome(lambda: filter_second_batch(buf, pos))}


def run_guarded_readers() -> None:
    """Child process: every reader on every log of logs_ending_in_each_field, guarded."""
    for name, data in logs_ending_in_each_field():
        expected = reader_outcomes(data)
        got = reader_outcomes(guarded_copy(data))
        assert got == expected, (name, got, expected)
        print(name, "ok", flush=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes: Linux")
def test_no_reader_reads_past_a_buffer_ending_in_any_varint():
    proc = run_in_child(__file__, "run_guarded_readers")
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert proc.stdout.count(" ok") == len(list(logs_ending_in_each_field()))
