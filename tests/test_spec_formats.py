"""Spec conformance of the record formats and file layouts (REF §1, §2, §4.5), rule by rule.

Every expectation is built independently of segstore's own encoders and parsers: by hand with
``struct`` and the ``crc32c`` package (the zigzag varint writer below is itself checked against
the literal bytes REF §1.1 lists), with kafka-python's record classes, or with ``zlib``.
Where Kafka's Java code differs from kafka-python (a timestamp delta past int64 wraps in Java,
kafka-python writes an 11-byte varint), Java's behaviour is the oracle and is computed by hand.

Both record decoders are run on every batch: the object decoder (``decode_records``) and the
column decoder (``decode_columns``); a rule holds only if both agree.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import crc32c
import numpy as np
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

import segstore
from conftest import FakeClock, legacy_message, legacy_wrapper
from segstore import _core
from segstore.checkpoint import CheckpointError, OffsetCheckpointFile
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError
from segstore.producer_state import increment_sequence
from segstore.segment_files import filename_prefix, segment_paths

T0 = 1_700_000_000_000
I32_MIN, I32_MAX = -2**31, 2**31 - 1
I64_MIN, I64_MAX = -2**63, 2**63 - 1
V2_HEAD = struct.Struct(">qiibIhiqqqhii")   # the 61-byte header of REF §1.2


# ---------------------------------------------------------------------------------------------
# Hand-built bytes (REF §1.1, §1.2, §1.7)

def varint(value: int, bits: int = 32) -> bytes:
    """ZigZag then base-128 groups, low group first (REF §1.1)."""
    z = ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)
    out = []
    while True:
        out.append(z & 0x7F)
        z >>= 7
        if not z:
            break
    return bytes([g | 0x80 for g in out[:-1]] + [out[-1]])


def record(ts_delta=0, offset_delta=0, key=b"k", value=b"v", headers=(), *, key_len=None,
           value_len=None, header_count=None, raw_headers=None) -> bytes:
    """One v2 record (REF §1.7); ``*_len``/``header_count`` override the written field."""
    body = b"\x00" + varint(ts_delta, 64) + varint(offset_delta)
    if key_len is not None:
        body += varint(key_len)
    else:
        body += varint(-1) if key is None else varint(len(key)) + key
    if value_len is not None:
        body += varint(value_len)
    else:
        body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(len(headers) if header_count is None else header_count)
    if raw_headers is not None:
        body += raw_headers
    for hk, hv in headers:
        body += varint(len(hk)) + hk + (varint(-1) if hv is None else varint(len(hv)) + hv)
    return varint(len(body)) + body


def batch(records, *, base_offset=0, last_offset_delta=None, count=None, attributes=0,
          base_ts=T0, max_ts=T0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
          leader_epoch=-1) -> bytes:
    """A v2 batch around ``records`` (bytes each), its CRC-32C set over [21, end)."""
    body = b"".join(records)
    n = len(records) if count is None else count
    lod = len(records) - 1 if last_offset_delta is None else last_offset_delta
    head = V2_HEAD.pack(base_offset, 49 + len(body), leader_epoch, 2, 0, attributes, lod,
                        base_ts, max_ts, producer_id, producer_epoch, base_sequence, n)
    buf = bytearray(head + body)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def decoded(buf, **kw) -> list:
    """(offset, timestamp, type, key, value, headers) from both decoders, which must agree."""
    objs = [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
             [tuple(h) for h in r.headers]) for r in _core.decode_records(buf, **kw)]
    cols = _core.decode_columns(buf, include_headers=True, **kw)
    col_rows = list(zip(cols.offsets.tolist(), cols.timestamps_ms.tolist(),
                        cols.timestamp_types.tolist(), cols.keys.to_pylist(),
                        cols.values.to_pylist(),
                        [[tuple(h) for h in hs] for hs in cols.headers.to_pylist()]))
    assert objs == col_rows
    return objs


def corrupt_reasons(buf) -> set:
    """The CorruptRecordError reason each decoder raises (both must raise)."""
    reasons = set()
    for call in (lambda: _core.decode_records(buf),
                 lambda: _core.decode_columns(buf, include_headers=True)):
        with pytest.raises(CorruptRecordError) as ei:
            call()
        assert ei.value.position == 0
        reasons.add(ei.value.reason.split(":")[0])
    return reasons


def kafka_python_batch(rows, *, transactional=False, producer_id=-1, producer_epoch=-1,
                       base_sequence=-1) -> bytes:
    """kafka-python's uncompressed batch of ``(offset_delta, ts, key, value, headers)`` rows
    (partition leader epoch 0, REF ecosystem notes §4.7)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                  producer_id=producer_id, producer_epoch=producer_epoch,
                                  base_sequence=base_sequence, batch_size=1 << 30)
    for od, ts, k, v, h in rows:
        b.append(od, timestamp=ts, key=k, value=v, headers=h)
    return bytes(b.build())


def test_varint_helper_writes_the_ref_examples():
    """REF §1.1: -1 is 0x01, 0 is 0x00, 1 is 0x02, -64 is 0x7F, 64 is 0x80 0x01; int32 and
    int64 extremes take 5 and 10 bytes (the oracle the other tests build with)."""
    assert [varint(v) for v in (-1, 0, 1, -64, 64)] == [
        b"\x01", b"\x00", b"\x02", b"\x7f", b"\x80\x01"]
    assert varint(I32_MAX) == b"\xfe\xff\xff\xff\x0f" and varint(I32_MIN) == b"\xff\xff\xff\xff\x0f"
    assert varint(I64_MAX, 64) == b"\xfe" + b"\xff" * 8 + b"\x01"
    assert varint(I64_MIN, 64) == b"\xff" * 9 + b"\x01"


# ---------------------------------------------------------------------------------------------
# REF §1.1 varints at their extremes, written and read


def test_zigzag_small_timestamp_deltas_encode_as_kafka_python():
    """REF §1.1: timestamp deltas 0, -1, 1, -64, 64, -65, 8191, -8192 (one, two and three
    byte varlongs) are written byte for byte as kafka-python writes them, and read back."""
    deltas = [0, -1, 1, -64, 64, -65, 8191, -8192]
    ts = [T0 + d for d in deltas]
    ours = _core.encode_batch([b"v"] * len(ts), keys=[b"k"] * len(ts), timestamps_ms=ts,
                              partition_leader_epoch=0)
    assert ours == kafka_python_batch([(i, t, b"k", b"v", []) for i, t in enumerate(ts)])
    assert ours == batch([record(d, i) for i, d in enumerate(deltas)], base_ts=T0,
                         max_ts=T0 + 8191, leader_epoch=0)
    assert [r[1] for r in decoded(ours)] == ts


@pytest.mark.parametrize("second", [I64_MAX, I64_MIN])
def test_int64_extreme_timestamp_delta_is_a_10_byte_varlong(second):
    """REF §1.1/§1.5: a timestamp delta of int64 max/min is a 10-byte varlong; written as
    hand-built bytes and read back to the same absolute timestamp."""
    ours = _core.encode_batch([b"v", b"v"], keys=[b"k", b"k"], timestamps_ms=[0, second],
                              partition_leader_epoch=0)
    want = batch([record(0, 0), record(second, 1)], base_ts=0, max_ts=max(0, second),
                 leader_epoch=0)
    assert ours == want
    assert len(varint(second, 64)) == 10
    assert [r[1] for r in decoded(ours)] == [0, second]


def test_timestamp_delta_past_int64_wraps_as_in_java():
    """REF §1.5: Java computes ``timestamp - baseTimestamp`` and ``baseTimestamp + delta`` in
    wrapping 64-bit arithmetic: base int64 min + 1 and a record at int64 max store delta -2
    (one byte, 0x03), which reads back as int64 max (kafka-python, with unbounded ints, would
    write an 11-byte varint Kafka rejects)."""
    ours = _core.encode_batch([b"v", b"v"], keys=[b"k", b"k"],
                              timestamps_ms=[I64_MIN + 1, I64_MAX], partition_leader_epoch=0)
    assert ours == batch([record(0, 0), record(-2, 1)], base_ts=I64_MIN + 1, max_ts=I64_MAX,
                         leader_epoch=0)
    assert [r[1] for r in decoded(ours)] == [I64_MIN + 1, I64_MAX]
    # Read side: a stored delta of int64 max from base 1 wraps to int64 min.
    assert decoded(batch([record(I64_MAX, 0)], base_ts=1, max_ts=1))[0][1] == I64_MIN


def test_offset_delta_int32_max_is_a_5_byte_varint():
    """REF §1.1/§1.2: an offset delta (and lastOffsetDelta) of int32 max is a 5-byte varint;
    segstore writes the hand-built bytes and reads offset baseOffset + 2^31 - 1."""
    ours = _core.encode_batch([b"a", b"b"], keys=[b"k", b"k"], timestamps_ms=T0,
                              base_offset=5, offset_deltas=[0, I32_MAX], partition_leader_epoch=0)
    want = batch([record(0, 0, b"k", b"a"), record(0, I32_MAX, b"k", b"b")], base_offset=5,
                 last_offset_delta=I32_MAX, leader_epoch=0)
    assert ours == want
    assert [r[0] for r in decoded(ours)] == [5, 5 + I32_MAX]
    (row,) = _core.scan_batches(ours).batches
    assert int(row["last_offset"]) == 5 + I32_MAX


@pytest.mark.parametrize("field", ["key_len", "value_len", "header_count", "record_length",
                                   "header_key_len", "header_value_len"])
@pytest.mark.parametrize("value", [I32_MIN, -2, I32_MAX])
def test_out_of_range_length_varints_are_corrupt(field, value):
    """REF §1.7: a length of -1 means null (key, value, header value) and any other negative
    length, a negative header count, a negative header key length, and a length running past
    the record (int32 max, a 5-byte varint) are corrupt in both decoders, with no read past
    the buffer. (Kafka's own DefaultRecord reads a key or value length below -1 as null; a
    CRC-valid file never holds one.)"""
    if field == "record_length":
        body = record()[1:]
        rec = varint(value) + body
    elif field == "header_key_len":
        rec = record(header_count=1, raw_headers=varint(value) + b"h" + varint(1) + b"x")
    elif field == "header_value_len":
        if value == -2 or value == I32_MIN:
            rec = record(header_count=1, raw_headers=varint(1) + b"h" + varint(value))
        else:
            rec = record(header_count=1, raw_headers=varint(1) + b"h" + varint(value) + b"x")
    else:
        rec = record(**{field: value})
    reasons = corrupt_reasons(batch([rec]))
    assert len(reasons) == 1


def test_header_key_length_minus_one_is_corrupt():
    """REF §1.7: a header key is never null: length -1 is corrupt (Kafka: "Invalid negative
    header key size")."""
    rec = record(header_count=1, raw_headers=varint(-1) + varint(1) + b"x")
    assert corrupt_reasons(batch([rec])) == {"invalid negative length"}


# ---------------------------------------------------------------------------------------------
# REF §1.7 record layout: nulls, empties, headers


def test_null_key_value_and_header_value_are_length_minus_one():
    """REF §1.7: a null key, null value and null header value are written as length -1
    (0x01), an empty value as length 0 (0x00, not a tombstone); bytes equal kafka-python's,
    and both decoders return None vs b"" as written."""
    rows = [(0, T0, None, None, []), (1, T0, b"k", b"", [("h", None), ("", b"")]),
            (2, T0, b"", None, [])]
    ours = _core.encode_batch([r[3] for r in rows], keys=[r[2] for r in rows],
                              headers=[r[4] for r in rows], timestamps_ms=T0,
                              partition_leader_epoch=0)
    assert ours == kafka_python_batch(rows)
    assert ours[61:] == (record(0, 0, None, None) + record(0, 1, b"k", b"",
                                                           [(b"h", None), (b"", b"")])
                         + record(0, 2, b"", None))
    assert [r[3:] for r in decoded(ours)] == [
        (None, None, []), (b"k", b"", [("h", None), ("", b"")]), (b"", None, [])]


def test_header_count_zero_differs_from_a_header_with_null_value():
    """REF §1.7: header count 0 reads as no headers; one header with a null value reads as one
    (key, None) pair; kafka-python reads the same bytes the same way."""
    buf = batch([record(0, 0), record(0, 1, headers=[(b"a", None)])])
    assert [r[5] for r in decoded(buf)] == [[], [("a", None)]]
    oracle = [list(r.headers) for r in DefaultRecordBatch(bytearray(buf))]
    assert oracle == [[], [("a", None)]]


def test_tombstone_with_one_byte_key_is_8_bytes():
    """REF §1.7: a tombstone with a 1-byte key, zero deltas and no headers is 8 bytes (length
    byte 7 + body), so a batch of one is 69 bytes."""
    ours = _core.encode_batch([None], keys=[b"k"], timestamps_ms=T0)
    assert len(ours) == 61 + 8
    assert ours[61:] == b"\x0e\x00\x00\x00\x02k\x01\x00"
    assert decoded(ours)[0][3:5] == (b"k", None)


def test_record_body_longer_than_its_fields_is_corrupt():
    """REF §1.7: after parsing, the bytes consumed must equal the record's length field."""
    good = record()
    padded = varint(len(good) - 1 + 1) + good[1:] + b"\x00"
    assert corrupt_reasons(batch([padded])) == {"record length does not match its contents"}


# ---------------------------------------------------------------------------------------------
# REF §1.2 / §1.7 counts and offset deltas


def test_records_count_above_the_records_present_is_corrupt():
    """REF §1.2/§1.7: recordsCount is the number of records present; one more than present
    runs past the batch."""
    buf = batch([record(0, 0)], count=2, last_offset_delta=1)
    assert corrupt_reasons(buf) == {"a length field runs past the end of its record or batch"}


def test_records_count_below_the_records_present_is_corrupt():
    """REF §1.7: bytes left after the declared recordsCount records are an "incorrect declared
    batch size"."""
    buf = batch([record(0, 0), record(0, 1)], count=1)
    assert corrupt_reasons(buf) == {
        "bytes left over after the declared record count (incorrect declared batch size)"}


def test_empty_batch_with_zero_records_reads_as_no_records():
    """REF §1.2: an "empty" retained batch (recordsCount 0, only the header) is legal: it
    yields no record but keeps lastOffsetDelta for the offsets it covers."""
    buf = batch([], count=0, last_offset_delta=4, base_offset=10)
    assert decoded(buf) == []
    (row,) = _core.scan_batches(buf, validate_crc=True).batches
    assert (int(row["records_count"]), int(row["last_offset"])) == (0, 14)


def test_offset_delta_gaps_below_last_offset_delta_are_legal():
    """REF §1.7: offset deltas are strictly increasing but may have gaps (compaction), and
    lastOffsetDelta may exceed the last record's delta."""
    buf = batch([record(0, 0), record(0, 3)], last_offset_delta=9, base_offset=100)
    assert [r[0] for r in decoded(buf)] == [100, 103]
    assert [r.offset for r in DefaultRecordBatch(bytearray(buf))] == [100, 103]


@pytest.mark.parametrize("deltas, lod", [([0, 2], 1), ([1, 1], 5), ([-1], 0), ([3, 2], 5)])
def test_offset_deltas_outside_last_offset_delta_or_not_increasing_are_corrupt(deltas, lod):
    """REF §1.2/§1.7: a record's offset delta beyond lastOffsetDelta, negative, repeated or
    decreasing cannot come from a Kafka writer (lastOffset = baseOffset + lastOffsetDelta)."""
    buf = batch([record(0, d) for d in deltas], last_offset_delta=lod)
    assert corrupt_reasons(buf) == {
        "record offset deltas are not increasing within [0, lastOffsetDelta]"}


@pytest.mark.parametrize("timestamps", [[0, I64_MAX], [0, I64_MIN], [I64_MIN + 1, I64_MAX],
                                        [T0 + 5, T0 - 3, T0 + 9]])
def test_column_encoder_writes_the_same_timestamp_varlongs(timestamps):
    """REF §1.1/§1.5: encode_columns (the numpy path) writes the same bytes as the hand-built
    batch at the int64 extremes and with a later record older than the first."""
    n = len(timestamps)
    enc = _core.encode_columns(BinaryColumn.from_pylist([b"v"] * n),
                               BinaryColumn.from_pylist([b"k"] * n),
                               np.array(timestamps, dtype=np.int64), partition_leader_epoch=0)
    base = timestamps[0]
    want = batch([record((t - base + 2**63) % 2**64 - 2**63, i) for i, t in enumerate(timestamps)],
                 base_ts=base, max_ts=max(timestamps), leader_epoch=0)
    assert bytes(enc.data) == want


# ---------------------------------------------------------------------------------------------
# REF §1.2 / §1.3 header and CRC


def test_batch_shorter_than_61_bytes_is_corrupt():
    """REF §1.2: the minimum legal v2 batch is 61 bytes (RECORD_BATCH_OVERHEAD)."""
    buf = batch([])[:60]
    buf = buf[:8] + struct.pack(">i", 48) + buf[12:]
    with pytest.raises(CorruptRecordError, match="shorter than its 61-byte header"):
        _core.scan_batches(buf)


def test_crc_covers_attributes_to_end_but_not_offset_epoch_or_length_prefix():
    """REF §1.3: CRC-32C over [21, end): baseOffset and partitionLeaderEpoch can change
    without a new CRC; a changed attributes byte (offset 22) or last record byte cannot."""
    buf = bytearray(batch([record(0, 0)]))
    struct.pack_into(">q", buf, 0, 77)
    struct.pack_into(">i", buf, 12, 12345)
    assert decoded(bytes(buf))[0][0] == 77
    for at in (22, len(buf) - 1):
        bad = bytearray(buf)
        bad[at] ^= 0x04
        assert corrupt_reasons(bytes(bad)) == {"CRC mismatch"}


@pytest.mark.parametrize("lod, count", [(-1, 0), (-5, 1), (0, 2), (2, 4)])
def test_header_with_negative_last_offset_delta_or_more_records_than_offsets_is_corrupt(lod,
                                                                                        count):
    """REF §1.2: lastOffset = baseOffset + lastOffsetDelta >= baseOffset, and recordsCount
    records have distinct offsets in [baseOffset, lastOffset]: a header breaking either is
    refused by the scan itself, before any record is read (offsets are located from it)."""
    buf = batch([], last_offset_delta=lod, count=count)
    with pytest.raises(CorruptRecordError):
        _core.scan_batches(buf)


def test_last_sequence_wraps_from_int32_max_to_zero():
    """REF §1.2: lastSequence = baseSequence + lastOffsetDelta, wrapping 2^31-1 -> 0 (Kafka's
    incrementSequence), as written in a producer snapshot's lastSequence."""
    assert increment_sequence(I32_MAX - 1, 1) == I32_MAX
    assert increment_sequence(I32_MAX - 1, 2) == 0
    assert increment_sequence(I32_MAX - 1, 3) == 1
    assert increment_sequence(I32_MAX, I32_MAX) == I32_MAX - 1
    assert increment_sequence(5, 0) == 5


# ---------------------------------------------------------------------------------------------
# REF §1.4 attributes, §1.5 timestamps and the delete horizon


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_compression_codec_ids_5_to_7_are_refused(codec):
    """REF §1.4: codec ids 5-7 are invalid (the reader throws)."""
    assert corrupt_reasons(batch([record()], attributes=codec)) == {"invalid compression codec"}


@pytest.mark.parametrize("bits", [0x0080, 0x0100, -0x8000, 0xFF80 - 0x10000])
def test_unused_attribute_bits_are_ignored_on_read(bits):
    """REF §1.4: bits 7-15 are unused; Kafka's reader looks only at the bits it knows, so a
    batch with them set reads as without."""
    assert decoded(batch([record(5, 0)], attributes=bits)) == [(0, T0 + 5, 0, b"k", b"v", [])]


def test_delete_horizon_flag_keeps_timestamps_base_plus_delta():
    """REF §1.5: with bit 6 set, baseTimestamp holds the delete horizon and the record deltas
    are relative to it: each record's timestamp is still baseTimestamp + delta (CreateTime)."""
    horizon = T0 + 86_400_000
    buf = batch([record(-86_400_000, 0), record(-86_399_990, 1, b"k", None)],
                attributes=0x40, base_ts=horizon, max_ts=T0 + 10)
    assert decoded(buf) == [(0, T0, 0, b"k", b"v", []), (1, T0 + 10, 0, b"k", None, [])]
    assert [r.timestamp for r in DefaultRecordBatch(bytearray(buf))] == [T0, T0 + 10]


def test_log_append_time_with_delete_horizon_reports_max_timestamp():
    """REF §1.5: a LogAppendTime batch reports maxTimestamp for every record, whatever the
    base (here a delete horizon) and the deltas."""
    buf = batch([record(-5, 0), record(7, 1)], attributes=0x48, base_ts=T0 + 999,
                max_ts=T0 + 3)
    assert [r[1:3] for r in decoded(buf)] == [(T0 + 3, 1), (T0 + 3, 1)]


# ---------------------------------------------------------------------------------------------
# REF §1.8 control batches


def marker(key: bytes, value: bytes, *, producer_id=7, base_offset=0) -> bytes:
    """A transactional control batch (bits 4 and 5) of one record, built by hand."""
    return batch([record(0, 0, key, value)], attributes=0x30, producer_id=producer_id,
                 producer_epoch=0, base_offset=base_offset)


def test_commit_marker_is_78_bytes_with_kafkas_key_and_value_layout():
    """REF §1.8: key = int16 version 0 + int16 type, value = int16 version 0 + int32
    coordinatorEpoch; transactional + control, baseSequence -1, one 17-byte record: a 78-byte
    batch, equal to the hand-built one."""
    ours = _core.encode_control_batch(1, producer_id=7, producer_epoch=0, coordinator_epoch=3,
                                      timestamp_ms=T0)
    assert ours == marker(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 3))
    assert len(ours) == 78 and len(record(0, 0, b"1234", b"123456")) == 17
    (ctl,) = list(DefaultRecordBatch(bytearray(ours)))
    assert (ctl.type, ctl.version) == (1, 0)


@pytest.fixture
def txn_partition(tmp_path):
    s = segstore.open(str(tmp_path / "s"), clock=FakeClock(T0))
    s.create_topic("t")
    p = s.partition("t", 0)
    p.append_records(_core.encode_batch([b"a"], keys=[b"k"], timestamps_ms=T0, producer_id=7,
                                        producer_epoch=0, base_sequence=0,
                                        is_transactional=True), origin="replication")
    assert p.last_stable_offset == 0   # the transaction is open
    yield p
    s.close()


def test_control_key_and_value_of_a_newer_version_are_read_with_the_known_schema(txn_partition):
    """REF §1.8: a key or value version newer than known is parsed with the newest known
    schema (type at key bytes 2-3, coordinator epoch at value bytes 2-5; extra bytes after
    them ignored): a version-3 COMMIT with trailing bytes closes the transaction."""
    txn_partition.append_records(marker(struct.pack(">hh", 3, 1) + b"xx",
                                        struct.pack(">hi", 5, 3) + b"yyyy"),
                                 origin="replication")
    assert txn_partition.last_stable_offset == txn_partition.log_end_offset == 2


def test_control_record_of_unknown_type_is_ignored(txn_partition):
    """REF §1.8: an unknown control type parses as UNKNOWN and is ignored: it closes no
    transaction."""
    txn_partition.append_records(marker(struct.pack(">hh", 0, 17), struct.pack(">hi", 0, 3)),
                                 origin="replication")
    assert txn_partition.log_end_offset == 2
    assert txn_partition.last_stable_offset == 0


# ---------------------------------------------------------------------------------------------
# REF §1.10 legacy v0/v1


def test_legacy_message_crc_is_crc32_not_crc32c():
    """REF §1.10: a v0/v1 message's CRC is CRC-32 (IEEE, zlib) over magic..end; the same
    message carrying a CRC-32C is corrupt, and a v2 batch carrying CRC-32 is corrupt."""
    good = legacy_message(1, 0, b"k", b"v", T0)
    assert decoded(good) == [(0, T0, 0, b"k", b"v", [])]
    assert struct.unpack_from(">I", good, 12)[0] == zlib.crc32(good[16:])
    bad = bytearray(good)
    struct.pack_into(">I", bad, 12, crc32c.crc32c(bytes(good[16:])))
    assert corrupt_reasons(bytes(bad)) == {"CRC mismatch"}
    v2 = bytearray(batch([record()]))
    struct.pack_into(">I", v2, 17, zlib.crc32(bytes(v2[21:])))
    assert corrupt_reasons(bytes(v2)) == {"CRC mismatch"}


def test_legacy_inner_message_crc_is_checked():
    """REF §1.10: each inner message of a compressed wrapper carries its own CRC-32."""
    inner = bytearray(legacy_message(1, 0, b"a", b"x", T0))
    inner[-1] ^= 1
    entry = legacy_message(1, 0, None, gzip.compress(bytes(inner), mtime=0), T0, attributes=1)
    with pytest.raises(CorruptRecordError, match="CRC mismatch: inner message"):
        _core.decode_records(entry)


@pytest.mark.parametrize("codec", [4, 5, 7])
def test_legacy_zstd_and_unknown_codecs_are_refused(codec):
    """REF §1.9/§1.10: zstd is only legal with magic 2; v0/v1 codecs are 0-3."""
    assert corrupt_reasons(legacy_message(1, 0, None, b"xx", T0, attributes=codec)) == {
        "invalid compression codec"}


def test_legacy_wrapper_with_null_value_is_corrupt():
    """REF §1.10: a compressed wrapper's value holds the inner messages; Kafka refuses a null
    one ("Found invalid compressed record set with null value")."""
    assert len(corrupt_reasons(legacy_message(1, 5, None, None, T0, attributes=1))) == 1


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_wrapper_without_inner_messages_is_corrupt(magic):
    """REF §1.10: a compressed wrapper holds at least one inner message; Kafka's deep iterator
    throws "Found invalid compressed record set with no inner records"."""
    entry = legacy_message(magic, 5, None, gzip.compress(b"", mtime=0), T0, attributes=1)
    assert corrupt_reasons(entry) == {"invalid record count"}


def test_legacy_v1_wrapper_offset_below_its_last_inner_offset_is_corrupt():
    """REF §1.10: v1 absolute offsets are wrapperOffset - lastInnerRelative + innerRelative;
    a wrapper offset (not 0) below the last inner relative offset would make them negative,
    and Kafka throws ("wrapper offset ... is less than the last inner message offset")."""
    entry = legacy_wrapper(1, [0, 5], [(T0, b"a", b"x"), (T0, b"b", b"y")], 2)
    assert corrupt_reasons(entry) == {
        "a v1 compressed wrapper's offset is below its last inner message's relative offset"}
    # At the last inner offset itself the messages start at offset 0.
    entry = legacy_wrapper(1, [0, 5], [(T0, b"a", b"x"), (T0, b"b", b"y")], 5)
    assert [r[0] for r in decoded(entry)] == [0, 5]


def test_legacy_v1_wrapper_at_offset_zero_numbers_inner_messages_from_zero():
    """REF §1.10: Kafka's deep iterator takes a v1 wrapper offset of 0 as absolute base 0
    (produce data of some librdkafka versions): inner relative offsets 0 and 1 are offsets 0
    and 1, never negative."""
    entry = legacy_wrapper(1, [0, 1], [(T0, b"a", b"x"), (T0 + 1, b"b", b"y")], 0)
    assert [r[0] for r in decoded(entry)] == [0, 1]


# ---------------------------------------------------------------------------------------------
# REF §1.11 batch scanning


def test_file_scan_stops_quietly_at_a_short_or_torn_tail():
    """REF §1.11: fewer than 17 bytes left, or a declared size past the end, end the scan
    without error (a torn last write); the batches before are returned."""
    good = batch([record()])
    for tail in (good[:16], good[:-1]):
        res = _core.scan_batches(good + tail, validate_crc=True)
        assert len(res.batches) == 1 and res.valid_end == len(good) and res.error is None
        assert res.torn   # bytes left that are no whole batch


def test_file_scan_refuses_a_size_field_below_14():
    """REF §1.11: a declared size below 14 (RECORD_OVERHEAD_V0) is corrupt; 14 itself passes
    the scan's size check (and fails later as a too-short batch of its magic)."""
    good = batch([record()])
    small = struct.pack(">qi", 1, 13) + bytes(13)
    with pytest.raises(CorruptRecordError, match="smaller than the minimum of 14") as ei:
        _core.scan_batches(good + small)
    assert ei.value.position == len(good)
    at14 = bytearray(struct.pack(">qi", 1, 14) + bytes(14))
    at14[16] = 2
    with pytest.raises(CorruptRecordError, match="shorter than its 61-byte header"):
        _core.scan_batches(bytes(at14))


@pytest.mark.parametrize("magic", [3, -1])
def test_unknown_magic_is_corrupt(magic):
    """REF §1.11: magic outside 0..2 is refused (by the memory scan at once, by the file scan
    through the CRC check)."""
    buf = bytearray(batch([record()]))
    buf[16] = magic & 0xFF
    with pytest.raises(CorruptRecordError):
        _core.scan_batches(bytes(buf), validate_crc=True)
    assert len(corrupt_reasons(bytes(buf))) == 1


# ---------------------------------------------------------------------------------------------
# REF §2 file names and layouts


def test_segment_file_names_are_20_digit_offsets_with_temporary_suffixes_after():
    """REF §2.1/§2.2: exactly 20 zero-padded decimal digits (int64 max fits), then the kind's
    suffix, then any temporary suffix."""
    assert filename_prefix(0) == "00000000000000000000"
    assert filename_prefix(I64_MAX) == "09223372036854775807"
    paths = segment_paths("/d", 1234, ".cleaned")
    assert sorted(os.path.basename(p) for p in paths.values()) == [
        "00000000000000001234.index.cleaned", "00000000000000001234.log.cleaned",
        "00000000000000001234.timeindex.cleaned", "00000000000000001234.txnindex.cleaned"]


def test_log_directory_holds_kafkas_names_and_index_entry_layouts(tmp_path):
    """REF §2.1, §2.3, §2.4, §2.6, §2.7: a rolled segment's files and its snapshot are named
    by 20-digit offsets; the new active segment's indexes are preallocated to whole entries
    (floor(segment.index.bytes / size) * size); the rolled segment's are trimmed to their
    entries; each offset entry is (int32 BE relative offset = last offset of an indexed batch,
    int32 BE position of that batch's start), each time entry (int64 BE max timestamp so far,
    int32 BE relative offset of the batch holding it), as read with struct."""
    root = str(tmp_path / "s")
    s = segstore.open(root, clock=FakeClock(T0))
    s.create_topic("t", config={"segment.index.bytes": 1001, "index.interval.bytes": 100})
    p = s.partition("t", 0)
    for i in range(6):
        p.append_batch([b"x" * 120, b"y"], timestamps_ms=[T0 + 10 * i, T0 + 10 * i + 3])
    p.roll()
    d = os.path.join(root, "t-0")
    names = sorted(os.listdir(d))
    assert "00000000000000000000.log" in names and "00000000000000000012.log" in names
    assert "00000000000000000012.snapshot" in names
    assert os.path.getsize(os.path.join(d, "00000000000000000012.index")) == 1000
    assert os.path.getsize(os.path.join(d, "00000000000000000012.timeindex")) == 996
    log = open(os.path.join(d, "00000000000000000000.log"), "rb").read()
    starts = {}
    pos = 0
    while pos < len(log):
        base, size = struct.unpack_from(">qi", log, pos)
        lod = struct.unpack_from(">i", log, pos + 23)[0]
        starts[base + lod] = pos
        pos += 12 + size
    idx = open(os.path.join(d, "00000000000000000000.index"), "rb").read()
    tix = open(os.path.join(d, "00000000000000000000.timeindex"), "rb").read()
    assert idx and len(idx) % 8 == 0 and tix and len(tix) % 12 == 0
    for rel, position in struct.iter_unpack(">ii", idx):
        assert starts[rel] == position
    # Batch i holds offsets 2i, 2i+1 with max timestamp T0 + 10i + 3 (at offset 2i+1): the
    # shallow offset of the max timestamp is the batch's last offset.
    entries = list(struct.iter_unpack(">qi", tix))
    assert entries[-1] == (T0 + 53, 11)
    for ts, rel in entries:
        assert ts == T0 + 10 * (rel // 2) + 3 and rel % 2 == 1
    s.close()


def test_time_index_of_v0_data_stays_empty_and_v1_gets_its_final_entry(tmp_path):
    """REF §2.4/§2.7, §1.10: a recovered segment of v0 messages (no timestamps) keeps an empty
    time index; a v1 segment's time index gets, on close, the entry (max timestamp, relative
    offset of its message) and both indexes are trimmed to their entries."""
    part = tmp_path / "k" / "t-0"
    part.mkdir(parents=True)
    (part / "00000000000000000000.log").write_bytes(
        b"".join(legacy_message(0, i, b"k%d" % i, b"x" * 50) for i in range(5)))
    (part / "00000000000000000005.log").write_bytes(
        b"".join(legacy_message(1, 5 + i, b"k%d" % i, b"y" * 50, T0 + i) for i in range(3)))
    s = segstore.open(str(tmp_path / "k"), clock=FakeClock(T0 + 1000))
    assert s.partition("t", 0).log_end_offset == 8
    s.close()
    assert (part / "00000000000000000000.timeindex").read_bytes() == b""
    assert (part / "00000000000000000005.timeindex").read_bytes() == struct.pack(">qi", T0 + 2, 2)
    assert (part / "00000000000000000000.index").read_bytes() == b""
    assert (part / "00000000000000000005.index").read_bytes() == b""


# ---------------------------------------------------------------------------------------------
# REF §4.5 checkpoint files


@pytest.mark.parametrize("raw", ["0\n-1\n", "0\n-1\nt 0 5\n", "0\n2147483648\n"])
def test_checkpoint_with_a_negative_or_oversized_count_is_rejected(tmp_path, raw):
    """REF §4.5: the count line is an int and must equal the number of entry lines; Kafka
    fails on a negative count (ArrayList(-1)) and on one that overflows Integer.parseInt."""
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(raw.encode())
    with pytest.raises(CheckpointError):
        OffsetCheckpointFile(str(path)).read()
