"""Property tests: random records round-trip; damaged logs fail only with CorruptRecordError.

A damaged buffer must either decode to exactly what the rules of REF §1.11 allow (the original
records, the records of the complete batches before a torn tail, or CorruptRecordError) or, where
the damage is not detectable without a CRC (``validate_crc=False``), decode to *something* -- but
never raise anything other than CorruptRecordError, never crash, and never read out of bounds (the
debug build turns that into IndexError, which fails these tests).

baseOffset (bytes 0-7) and partitionLeaderEpoch (12-15) of a v2 batch are outside its CRC; damage
there is tested separately and changes offsets / leader epochs legitimately.
"""

from __future__ import annotations

import gzip
import operator
import struct
from collections import Counter
from dataclasses import dataclass, field

import crc32c as crc32c_pkg
import numpy as np
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from hypothesis import given, note
from hypothesis import strategies as st

from conftest import (batch_spans, check_columns, columns_tuples, fix_crc, legacy_message,
                      legacy_wrapper, rec_tuple, v2_header)
from segstore import _core
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError

CODECS = [0, 1, 2, 3, 4]
CORRUPT = "CorruptRecordError"
# EXACTLY_17: the contract stops silently when *fewer than* 17 bytes remain; Kafka's
# FileLogInputStream stops when at most 17 remain (``position >= end - 17``). With exactly 17
# trailing bytes either reading is accepted.

# ----------------------------------------------------------------------------------------------
# strategies

TIMESTAMPS = st.integers(0, 2**42)
BLOBS = st.one_of(st.none(), st.binary(max_size=300),
                  st.builds(operator.mul, st.binary(min_size=1, max_size=3), st.integers(1, 100)))
HEADERS = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))),
                   max_size=3)


@st.composite
def batch_specs(draw, max_records=12, codecs=CODECS):
    """Inputs of one encode_batch call: records with timestamp deltas of either sign, a codec,
    sometimes LogAppendTime and producer fields."""
    base_ts = draw(TIMESTAMPS)
    raw = draw(st.lists(st.tuples(st.integers(-10**6, 10**6), BLOBS, BLOBS, HEADERS),
                        min_size=1, max_size=max_records))
    producer = draw(st.one_of(st.none(), st.tuples(st.integers(0, 2**40), st.integers(0, 2**15 - 1),
                                                   st.integers(0, 2**31 - 1), st.booleans())))
    return dict(records=[(max(0, base_ts + d), k, v, h) for d, k, v, h in raw],
                codec=draw(st.sampled_from(codecs)),
                lat=draw(st.one_of(st.none(), st.none(), st.none(), TIMESTAMPS)),
                producer=producer)


def encode_spec(spec, base_offset=0) -> bytes:
    ts, keys, values, headers = (list(x) for x in zip(*spec["records"]))
    kw = dict(base_offset=base_offset, compression=spec["codec"],
              log_append_time_ms=spec["lat"])
    if spec["producer"]:
        pid, epoch, seq, txn = spec["producer"]
        kw.update(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=txn)
    return _core.encode_batch(values, keys=keys, headers=headers, timestamps_ms=ts, **kw)


def expected_spec(spec, base_offset=0) -> list[tuple]:
    lat = spec["lat"]
    return [(base_offset + i, ts if lat is None else lat, 0 if lat is None else 1, k, v, list(h))
            for i, (ts, k, v, h) in enumerate(spec["records"])]


@dataclass
class Batch:
    pos: int
    size: int
    kind: str  # "data" (v2), "control" (v2 marker) or "legacy" (v0/v1 entry)
    magic: int
    codec: int
    records: list = field(default_factory=list)


@dataclass
class Segment:
    buf: bytes
    batches: list

    def records(self, upto=None) -> list[tuple]:
        """Expected records of batches ``[0, upto)``."""
        return [r for b in self.batches[:upto] for r in b.records]


@st.composite
def segments(draw, max_batches=4, need=None):
    """A fake .log: v2 data batches, transaction markers and legacy v0/v1 entries (plain or gzip
    wrappers) at consecutive offsets. ``need`` guarantees one batch of a kind: "plain"
    (uncompressed data) or "v2" (data or control)."""
    n = draw(st.integers(1, max_batches))
    kinds = draw(st.lists(st.sampled_from(["data", "data", "data", "control", "legacy"]),
                          min_size=n, max_size=n))
    if need == "plain":
        kinds[draw(st.integers(0, n - 1))] = "plain"
    elif need == "v2" and "data" not in kinds and "control" not in kinds:
        kinds[draw(st.integers(0, n - 1))] = "data"
    offset = draw(st.integers(0, 2**40))
    parts, batches, pos = [], [], 0
    for kind in kinds:
        if kind in ("data", "plain"):
            spec = draw(batch_specs(max_records=6, codecs=[0] if kind == "plain" else CODECS))
            buf, recs = encode_spec(spec, offset), expected_spec(spec, offset)
            batch, used = Batch(pos, len(buf), "data", 2, spec["codec"], recs), len(recs)
        elif kind == "control":
            buf = _core.encode_control_batch(
                draw(st.sampled_from([0, 1])), producer_id=draw(st.integers(0, 2**40)),
                producer_epoch=draw(st.integers(0, 100)), coordinator_epoch=draw(st.integers(0, 9)),
                base_offset=offset, timestamp_ms=draw(TIMESTAMPS))
            batch, used = Batch(pos, len(buf), "control", 2, 0), 1
        else:
            magic, wrapped = draw(st.sampled_from([0, 1])), draw(st.booleans())
            lrecs = draw(st.lists(st.tuples(TIMESTAMPS, BLOBS, BLOBS), min_size=1,
                                  max_size=4 if wrapped else 1))
            offs = list(range(offset, offset + len(lrecs)))
            if not wrapped:
                ts, k, v = lrecs[0]
                buf = legacy_message(magic, offset, k, v, ts)
            else:
                inner = offs if magic == 0 else list(range(len(lrecs)))
                buf = legacy_wrapper(magic, inner, lrecs, offs[-1])
            recs = [(o, ts if magic else -1, 0 if magic else -1, k, v, [])
                    for o, (ts, k, v) in zip(offs, lrecs)]
            batch = Batch(pos, len(buf), "legacy", magic, 1 if wrapped else 0, recs)
            used = len(recs)
        parts.append(buf)
        batches.append(batch)
        pos += len(buf)
        offset += used
    seg = Segment(b"".join(parts), batches)
    note(f"batches: {[(b.pos, b.size, b.kind, b.magic, b.codec) for b in batches]}")
    return seg


# ----------------------------------------------------------------------------------------------
# helpers


def decode(buf, columns=False, **kw):
    """Decoded records (rec_tuple form), or CORRUPT. Any other exception fails the test."""
    try:
        if columns:
            cols = _core.decode_columns(buf, include_headers=True, **kw)
            check_columns(cols)
            return columns_tuples(cols)
        return [rec_tuple(r) for r in _core.decode_records(buf, **kw)]
    except CorruptRecordError:
        return CORRUPT


def loose(result):
    """A result without header keys (decode_records may decode bad UTF-8 differently)."""
    if result == CORRUPT:
        return result
    return [r[:5] + ([v for _, v in r[5]],) for r in result]


def assert_decodes_to(buf, expected, **kw):
    """decode_records and decode_columns (with and without CRC checks) give ``expected``."""
    for validate in (True, False):
        assert decode(buf, validate_crc=validate, **kw) == expected, validate
        assert decode(buf, columns=True, validate_crc=validate, **kw) == expected, validate


def assert_never_worse_than_corrupt(buf, **kw):
    """Without certainty about the outcome: only CorruptRecordError may escape, the results of
    both decoders agree whenever both succeed, and returned columns are well formed."""
    rows = decode(buf, **kw)
    cols = decode(buf, columns=True, **kw)
    if rows != CORRUPT and cols != CORRUPT:
        assert loose(rows) == loose(cols)
    with_ctl = decode(buf, include_control=True, **kw)
    if rows != CORRUPT and with_ctl != CORRUPT:  # control records come on top of the others
        assert not Counter(map(repr, rows)) - Counter(map(repr, with_ctl))
    try:
        _core.scan_batches(buf, validate_crc=kw.get("validate_crc", True), raise_on_corrupt=False)
    except CorruptRecordError:  # pragma: no cover - raise_on_corrupt=False must not raise
        raise AssertionError("scan_batches(raise_on_corrupt=False) raised")
    return rows


def crc_checked_outcome(seg, damaged):
    """The only correct result of decoding ``damaged`` (same length as ``seg.buf``) with CRC
    validation, when nothing changed in a v2 batch's bytes 0-7 / 12-15 or a legacy entry's 0-7.

    The first changed batch decides: if its size field now runs past the end of the buffer it is
    a torn tail (records of the batches before it), otherwise it is corrupt.
    """
    for i, b in enumerate(seg.batches):
        if damaged[b.pos:b.pos + b.size] == seg.buf[b.pos:b.pos + b.size]:
            continue
        new_size = 12 + struct.unpack_from(">i", damaged, b.pos + 8)[0]
        if new_size != b.size and b.pos + new_size > len(damaged):
            return i, seg.records(i)
        return i, CORRUPT
    return None, seg.records()


def assert_scan_outcome(seg, damaged, first_bad, result):
    """scan_batches(validate_crc=True, raise_on_corrupt=False) stops at the first bad batch."""
    res = _core.scan_batches(damaged, validate_crc=True, raise_on_corrupt=False)
    good = seg.batches if first_bad is None else seg.batches[:first_bad]
    assert res.batches["position"].tolist() == [b.pos for b in good]
    stop = len(damaged) if first_bad is None else seg.batches[first_bad].pos
    assert res.valid_end == stop
    if result == CORRUPT:
        assert isinstance(res.error, CorruptRecordError) and res.error.position == stop
        assert not res.torn
    else:
        assert res.error is None
        assert res.torn == (first_bad is not None)


def unprotected(b):
    """Batch-relative byte ranges outside the checksum that decoding legitimately reports."""
    return [range(0, 8), range(12, 16)] if b.magic == 2 else [range(0, 8)]


def protected_positions(seg):
    return [b.pos + r for b in seg.batches for r in range(b.size)
            if not any(r in u for u in unprotected(b))]


# ----------------------------------------------------------------------------------------------
# round trips


@given(spec=batch_specs(), base_offset=st.integers(0, 2**40))
def test_encode_batch_roundtrip(spec, base_offset):
    buf = encode_spec(spec, base_offset)
    expected = expected_spec(spec, base_offset)
    assert_decodes_to(buf, expected)
    oracle = AioBatch(buf)
    assert oracle.validate_crc()
    assert [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, [tuple(h) for h in r.headers])
            for r in oracle] == expected

    n, ts = len(expected), [r[0] for r in spec["records"]]
    pid, epoch, seq, txn = spec["producer"] or (-1, -1, -1, False)
    (row,) = _core.scan_batches(buf, validate_crc=True).batches
    row = {k: int(row[k]) for k in row.dtype.names}
    want = dict(position=0, size=len(buf), base_offset=base_offset, last_offset=base_offset + n - 1,
                max_timestamp=max(ts) if spec["lat"] is None else spec["lat"], producer_id=pid,
                partition_leader_epoch=-1, last_offset_delta=n - 1, base_sequence=seq,
                records_count=n, crc=crc32c_pkg.crc32c(buf[21:]), producer_epoch=epoch, magic=2,
                attributes=spec["codec"] | (0x08 if spec["lat"] is not None else 0)
                | (0x10 if txn else 0))
    if spec["lat"] is None:
        want["base_timestamp"] = ts[0]
    assert {k: row[k] for k in want} == want
    assert v2_header(buf)["crc"] == row["crc"]


@given(data=st.data(), codec=st.sampled_from(CODECS), base_offset=st.integers(0, 2**40),
       records_per_batch=st.integers(1, 8), max_batch_bytes=st.integers(64, 4096))
def test_encode_columns_roundtrip(data, codec, base_offset, records_per_batch, max_batch_bytes):
    values = data.draw(st.lists(BLOBS, min_size=1, max_size=40))
    keys = data.draw(st.one_of(st.none(), st.lists(BLOBS, min_size=len(values),
                                                   max_size=len(values))))
    ts = np.array(data.draw(st.lists(TIMESTAMPS, min_size=len(values), max_size=len(values))),
                  dtype=np.int64)
    res = _core.encode_columns(
        BinaryColumn.from_pylist(values), None if keys is None else BinaryColumn.from_pylist(keys),
        ts, base_offset=base_offset, records_per_batch=records_per_batch,
        max_batch_bytes=max_batch_bytes, compression=codec)
    n = len(values)
    keys = keys or [None] * n
    expected = [(base_offset + i, int(ts[i]), 0, keys[i], values[i], []) for i in range(n)]
    assert_decodes_to(res.data, expected)

    scanned = _core.scan_batches(res.data, validate_crc=True)
    assert scanned.valid_end == len(res.data) and not scanned.torn
    assert res.batches.dtype == _core.BATCH_DTYPE
    assert res.batches.tolist() == scanned.batches.tolist()
    rows = [{k: int(r[k]) for k in r.dtype.names} for r in res.batches]
    assert [r["position"] for r in rows] == [p for p, _ in batch_spans(res.data)]
    assert sum(r["records_count"] for r in rows) == n
    assert [r["base_offset"] for r in rows] == list(
        np.cumsum([base_offset] + [r["records_count"] for r in rows[:-1]]))
    for r in rows:
        assert 1 <= r["records_count"] <= records_per_batch
        assert r["attributes"] == codec
        if codec == 0:
            assert r["size"] <= max_batch_bytes or r["records_count"] == 1


@given(seg=segments(), data=st.data())
def test_filters_property(seg, data):
    offsets = [r[0] for r in seg.records()] or [0]
    bound = st.one_of(st.none(), st.integers(min(offsets) - 2, max(offsets) + 2))
    lo, hi = data.draw(bound), data.draw(bound)
    limit = data.draw(st.one_of(st.none(), st.integers(1, 30)))
    want = [r for r in seg.records() if (lo is None or r[0] >= lo) and (hi is None or r[0] < hi)]
    want = want if limit is None else want[:limit]
    assert_decodes_to(seg.buf, want, min_offset=lo, end_offset=hi, max_records=limit)


# ----------------------------------------------------------------------------------------------
# damage


@given(seg=segments())
def test_undamaged_segment_decodes(seg):
    assert_decodes_to(seg.buf, seg.records())
    assert_scan_outcome(seg, seg.buf, None, seg.records())
    assert [p for p, _ in batch_spans(seg.buf)] == [b.pos for b in seg.batches]


@given(seg=segments(), data=st.data())
def test_bit_flips(seg, data):
    positions = protected_positions(seg)
    flips = data.draw(st.lists(st.tuples(st.sampled_from(positions), st.integers(0, 7)),
                               min_size=1, max_size=6))
    damaged = bytearray(seg.buf)
    for pos, bit in flips:
        damaged[pos] ^= 1 << bit
    first_bad, expected = crc_checked_outcome(seg, damaged)
    assert decode(damaged) == expected
    assert decode(damaged, columns=True) == expected
    assert_scan_outcome(seg, damaged, first_bad, expected)

    result = assert_never_worse_than_corrupt(damaged, validate_crc=False)
    changed = [i for i in range(len(damaged)) if damaged[i] != seg.buf[i]]
    in_crc_field = all(any(b.magic == 2 and b.pos + 17 <= i < b.pos + 21 for b in seg.batches)
                       for i in changed)
    if in_crc_field:  # a wrong CRC alone does not matter without CRC checks
        assert result == seg.records()
    elif expected != CORRUPT:  # a torn tail is still a torn tail
        assert result == expected


@given(seg=segments(), data=st.data())
def test_single_byte_damage_is_located(seg, data):
    i = data.draw(st.integers(0, len(seg.batches) - 1))
    b = seg.batches[i]
    first = 21 if b.magic == 2 else 16  # in the CRC-covered range
    pos = b.pos + data.draw(st.integers(first, b.size - 1))
    damaged = bytearray(seg.buf)
    damaged[pos] ^= data.draw(st.integers(1, 255))
    assert_scan_outcome(seg, damaged, i, CORRUPT)
    try:
        _core.decode_records(damaged, file="s.log")
        raise AssertionError("damage inside a CRC-covered range went unnoticed")
    except CorruptRecordError as e:
        assert (e.position, e.file) == (b.pos, "s.log")
    try:
        _core.scan_batches(damaged, validate_crc=True)
        raise AssertionError("scan_batches(validate_crc=True) missed a CRC mismatch")
    except CorruptRecordError as e:
        assert e.position == b.pos
    # Without CRC checks the scanner looks at sizes, magic bytes and whether a v2 header is
    # possible at all (lastOffsetDelta >= 0, 0 <= recordsCount <= lastOffsetDelta + 1).
    if pos - b.pos != 16:
        res = _core.scan_batches(damaged, validate_crc=False, raise_on_corrupt=False)
        impossible = False
        if b.magic == 2:  # a legacy batch may be shorter than a v2 header
            delta, = struct.unpack_from(">i", damaged, b.pos + 23)
            count, = struct.unpack_from(">i", damaged, b.pos + 57)
            impossible = not (delta >= 0 and 0 <= count <= delta + 1)
        if impossible:
            assert res.error is not None and res.error.position == b.pos
        else:
            assert res.batches["position"].tolist() == [b.pos for b in seg.batches]
            assert res.valid_end == len(damaged) and res.error is None and not res.torn


@given(seg=segments(), data=st.data())
def test_unprotected_fields_change_offsets_and_epochs(seg, data):
    v2 = [b for b in seg.batches if b.magic == 2]
    if not v2:
        return
    b = data.draw(st.sampled_from(v2))
    new_base = data.draw(st.integers(-(2**62), 2**62))
    new_epoch = data.draw(st.integers(-(2**31), 2**31 - 1))
    damaged = bytearray(seg.buf)
    old_base = v2_header(seg.buf, b.pos)["base_offset"]
    struct.pack_into(">q", damaged, b.pos, new_base)
    struct.pack_into(">i", damaged, b.pos + 12, new_epoch)
    shift = new_base - old_base
    expected = [r if r not in b.records else (r[0] + shift,) + r[1:] for r in seg.records()]
    assert_decodes_to(damaged, expected)
    index = seg.batches.index(b)
    first = len(seg.records(index))
    moved = _core.decode_records(damaged)[first:first + len(b.records)]
    assert [r.leader_epoch for r in moved] == [new_epoch] * len(b.records)
    row = _core.scan_batches(damaged, validate_crc=True).batches[index]
    assert (int(row["base_offset"]), int(row["partition_leader_epoch"])) == (new_base, new_epoch)


@given(seg=segments(), data=st.data())
def test_truncation_leaves_a_torn_tail(seg, data):
    cut = data.draw(st.integers(0, len(seg.buf)))
    complete = [b for b in seg.batches if b.pos + b.size <= cut]
    expected = seg.records(len(complete))
    truncated = seg.buf[:cut]
    assert_decodes_to(truncated, expected)
    assert decode(seg.buf, end=cut) == expected
    assert decode(seg.buf, columns=True, end=cut) == expected
    for buf, end in ((truncated, None), (seg.buf, cut)):
        res = _core.scan_batches(buf, end=end, validate_crc=True, raise_on_corrupt=False)
        valid_end = complete[-1].pos + complete[-1].size if complete else 0
        assert res.batches["position"].tolist() == [b.pos for b in complete]
        assert res.valid_end == valid_end and res.error is None
        if cut == valid_end:
            assert not res.torn
        elif cut - valid_end >= 17:
            assert res.torn


@given(seg=segments(), data=st.data())
def test_length_field_overwrite(seg, data):
    i = data.draw(st.integers(0, len(seg.batches) - 1))
    b = seg.batches[i]
    old = b.size - 12
    new = data.draw(st.one_of(st.sampled_from([-(2**31), -1, 0, 1, 13, 14, 48, 49, 2**31 - 1]),
                              st.integers(-(2**31), 2**31 - 1),
                              st.integers(max(-(2**31), old - 70), old + 70)))
    damaged = bytearray(seg.buf)
    struct.pack_into(">i", damaged, b.pos + 8, new)
    first_bad, expected = crc_checked_outcome(seg, damaged)
    assert decode(damaged) == expected
    assert decode(damaged, columns=True) == expected
    assert_scan_outcome(seg, damaged, first_bad, expected)

    result = assert_never_worse_than_corrupt(damaged, validate_crc=False)
    torn = b.pos + 12 + new > len(damaged)
    if new == old or torn:
        assert result == expected
    elif new < 14 or (b.magic == 2 and new < 49):
        assert result == CORRUPT
    elif b.kind == "data" and b.codec == 0:
        # Uncompressed records fill the batch exactly: fewer bytes cut the last record, more
        # leave bytes after the declared count.
        assert result == CORRUPT


@given(seg=segments(need="v2"), data=st.data())
def test_records_count_overwrite(seg, data):
    b = data.draw(st.sampled_from([b for b in seg.batches if b.magic == 2]))
    old = v2_header(seg.buf, b.pos)["records_count"]
    new = data.draw(st.one_of(st.integers(-(2**31), 2**31 - 1),
                              st.integers(max(-(2**31), old - 3), old + 3)))
    damaged = bytearray(seg.buf)
    struct.pack_into(">i", damaged, b.pos + 57, new)
    first_bad, expected = crc_checked_outcome(seg, damaged)
    assert decode(damaged) == expected
    assert decode(damaged, columns=True) == expected
    assert_scan_outcome(seg, damaged, first_bad, expected)

    # The records are intact, so a wrong count is always detectable while parsing them.
    result = assert_never_worse_than_corrupt(damaged, validate_crc=False)
    if new == old:
        assert result == seg.records()
    elif b.kind == "data":
        assert result == CORRUPT
        assert decode(damaged, columns=True, validate_crc=False) == CORRUPT
    else:
        assert decode(damaged, validate_crc=False, include_control=True) == CORRUPT


def record_varint_positions(records: bytes) -> list[int]:
    """Positions of every varint byte in an uncompressed v2 records section (REF §1.7)."""
    out, p = [], 0

    def varint(p):
        start, shift, z = p, 0, 0
        while True:
            byte = records[p]
            z |= (byte & 0x7F) << shift
            p += 1
            shift += 7
            if not byte & 0x80:
                break
        out.extend(range(start, p))
        return (z >> 1) ^ -(z & 1), p

    while p < len(records):
        length, p = varint(p)
        end = p + length
        p += 1  # attributes
        _, p = varint(p)  # timestamp delta
        _, p = varint(p)  # offset delta
        for _ in range(2):  # key, value
            n, p = varint(p)
            p += max(n, 0)
        count, p = varint(p)
        for _ in range(count):
            n, p = varint(p)
            p += n
            n, p = varint(p)
            p += max(n, 0)
        assert p == end
    return out


def rewrite_records(seg, b, mutate) -> bytearray:
    """``seg.buf`` with batch ``b``'s records section replaced by ``mutate(plain records)``,
    recompressed (gzip) when the batch is, with a fresh length and CRC."""
    body = seg.buf[b.pos + 61:b.pos + b.size]
    plain = gzip.decompress(body) if b.codec == 1 else body
    new_body = mutate(bytearray(plain))
    if b.codec == 1:
        new_body = gzip.compress(bytes(new_body), mtime=0)
    batch = bytearray(seg.buf[b.pos:b.pos + 61]) + new_body
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    fix_crc(batch)
    return bytearray(seg.buf[:b.pos]) + batch + seg.buf[b.pos + b.size:]


def data_batches(seg, codecs=(0, 1)):
    return [b for b in seg.batches if b.kind == "data" and b.codec in codecs]


@given(seg=segments(need="plain"), data=st.data())
def test_random_varint_bytes_with_valid_crc(seg, data):
    b = data.draw(st.sampled_from(data_batches(seg)))
    body = seg.buf[b.pos + 61:b.pos + b.size]
    positions = record_varint_positions(gzip.decompress(body) if b.codec else body)
    edits = data.draw(st.lists(st.tuples(st.sampled_from(positions), st.integers(0, 255)),
                               min_size=1, max_size=3))

    def mutate(plain):
        for p, v in edits:
            plain[p] = v
        return plain

    damaged = rewrite_records(seg, b, mutate)
    for validate in (True, False):
        assert_never_worse_than_corrupt(damaged, validate_crc=validate)


@given(seg=segments(need="plain"), data=st.data())
def test_overlong_varint_is_corrupt(seg, data):
    b = data.draw(st.sampled_from(data_batches(seg)))
    body = seg.buf[b.pos + 61:b.pos + b.size]
    plain = gzip.decompress(body) if b.codec else body
    p = data.draw(st.sampled_from(record_varint_positions(plain)))
    fill = data.draw(st.sampled_from([b"\xff", b"\x80", b"\xfe"]))

    def mutate(plain):
        end = min(len(plain), p + 11)  # longer than any varlong, or up to the end of the batch
        plain[p:end] = fill * (end - p)
        return plain

    damaged = rewrite_records(seg, b, mutate)
    assert_decodes_to(damaged, CORRUPT)


@given(seg=segments(), data=st.data())
def test_damaged_compressed_payload(seg, data):
    compressed = [b for b in seg.batches if b.kind == "data" and b.codec != 0]
    if not compressed:
        return
    b = data.draw(st.sampled_from(compressed))
    damaged = bytearray(seg.buf)
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[b.pos + data.draw(st.integers(61, b.size - 1))] = data.draw(st.integers(0, 255))
    fix_crc(damaged, b.pos)  # the CRC is fine: the codec and the record parser must cope
    for validate in (True, False):
        assert_never_worse_than_corrupt(damaged, validate_crc=validate)


@st.composite
def garbage(draw):
    """Random bytes, or bytes that look like the start of a batch header."""
    raw = st.binary(max_size=120)
    framed = st.builds(lambda off, size, epoch, magic, tail:
                       struct.pack(">qiib", off, size, epoch, magic) + tail,
                       st.integers(-(2**63), 2**63 - 1), st.integers(-20, 150),
                       st.integers(-(2**31), 2**31 - 1), st.integers(-2, 3),
                       st.binary(max_size=150))
    return draw(st.one_of(raw, framed))


@given(seg=segments(), tail=garbage())
def test_appended_garbage(seg, tail):
    damaged = seg.buf + tail
    n = len(tail)
    length = struct.unpack_from(">i", tail, 8)[0] if n >= 12 else None  # the size field
    # Kafka's FileLogInputStream order: too few bytes for a header, then size < 14, then torn.
    if n < 17:
        expected = seg.records()
    elif length < 14:
        expected = CORRUPT
    elif 12 + length > n:
        expected = seg.records()  # a torn tail
    else:
        expected = CORRUPT  # a complete garbage batch is never CRC-valid
    allowed = [expected] + ([seg.records()] if n == 17 else [])  # see EXACTLY_17
    assert decode(damaged) in allowed
    assert decode(damaged, columns=True) in allowed

    result = assert_never_worse_than_corrupt(damaged, validate_crc=False)
    if expected != CORRUPT:
        assert result == expected
    elif length < 14 or tail[16] not in (0, 1, 2) or (tail[16] == 2 and length < 49):
        assert result in allowed


@given(seg=segments(), zeros=st.integers(0, 300))
def test_zero_filled_tail(seg, zeros):
    damaged = seg.buf + bytes(zeros)
    expected = seg.records() if zeros < 17 else CORRUPT  # size 0 is below the 14-byte minimum
    if zeros == 17:  # see EXACTLY_17
        assert decode(damaged) in (expected, seg.records())
        return
    assert_decodes_to(damaged, expected)
    res = _core.scan_batches(damaged, raise_on_corrupt=False)
    assert res.valid_end == len(seg.buf)
    assert res.batches["position"].tolist() == [b.pos for b in seg.batches]
    if zeros >= 17:
        assert isinstance(res.error, CorruptRecordError) and res.error.position == len(seg.buf)
    else:
        assert res.error is None
