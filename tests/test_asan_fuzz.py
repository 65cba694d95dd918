"""Every compiled entry point that parses bytes, fed valid batches mutated every which way.

Valid v2 batches (every codec, headers, control and transactional batches) and v0/v1 entries
are damaged -- bits flipped, bytes overwritten, the size field set to huge, negative and
too-small values, record counts and varint fields set to their extremes, the data cut or given
a random tail, CRCs optionally recomputed so the damage reaches the record parsers -- and go to
the scanners, both decoders (with the two-thread and streamed-output paths forced on), the
offset-map build, the cleaner's filter, the null-key check, the index kernels and the
checked-argument paths. Each call must return or raise an exception of ``segstore.errors``;
anything else fails, and a read out of bounds crashes the process.

That last part needs AddressSanitizer to be seen: ``make test-asan`` runs this module against
an ASan build of the core (``SEGSTORE_ASAN=1``), with every buffer and every Python object a
malloc block ASan guards. On the normal build it is an ordinary test of the error contract.
``SEGSTORE_ASAN_FUZZ_EXAMPLES=N`` sets the examples per test (default: a quick run).
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fix_crc, legacy_message, legacy_wrapper
from segstore import _core
from segstore import compression
from segstore.errors import SegstoreError

EXAMPLES = int(os.environ.get("SEGSTORE_ASAN_FUZZ_EXAMPLES", "0")) or 60
FUZZ = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                suppress_health_check=list(HealthCheck))

INT32 = [0, 1, 13, 14, 48, 49, 60, 61, 0x7FFF, 0x7FFFFFFF, -1, -2, -0x80000000]
INT64 = [0, 1, -1, 2**31, 2**62, 2**63 - 1, -(2**63), -(2**62)]

# ------------------------------------------------------------------------------------------------
# valid inputs

BLOB = st.one_of(st.none(), st.binary(max_size=40))
TS = st.integers(0, 2**41)


@st.composite
def v2_batch(draw, offset: int) -> bytes:
    kind = draw(st.sampled_from(["data", "data", "data", "txn", "control"]))
    if kind == "control":
        return _core.encode_control_batch(draw(st.sampled_from([0, 1])), producer_id=7,
                                          producer_epoch=1, base_offset=offset,
                                          timestamp_ms=draw(TS))
    n = draw(st.integers(1, 6))
    values = draw(st.lists(BLOB, min_size=n, max_size=n))
    keys = draw(st.lists(BLOB, min_size=n, max_size=n))
    headers = draw(st.one_of(st.none(), st.lists(
        st.lists(st.tuples(st.text(max_size=3), BLOB), max_size=2), min_size=n, max_size=n)))
    txn = kind == "txn"
    return _core.encode_batch(values, keys, headers, draw(st.lists(TS, min_size=n, max_size=n)),
                              base_offset=offset,
                              compression=draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4])),
                              producer_id=9 if txn else -1, producer_epoch=0 if txn else -1,
                              base_sequence=0 if txn else -1, is_transactional=txn)


@st.composite
def legacy_entry(draw, offset: int) -> bytes:
    magic = draw(st.sampled_from([0, 1]))
    if draw(st.booleans()):
        return legacy_message(magic, offset, draw(BLOB), draw(BLOB), draw(TS))
    recs = draw(st.lists(st.tuples(TS, BLOB, BLOB), min_size=1, max_size=3))
    inner = list(range(len(recs))) if magic == 1 else [offset + i for i in range(len(recs))]
    return legacy_wrapper(magic, inner, recs, offset + len(recs) - 1)


@st.composite
def log_bytes(draw) -> bytes:
    """A few whole batches, legacy ones only now and then (v2 data is what the log holds)."""
    out, offset = [], draw(st.integers(0, 2**40))
    legacy = draw(st.integers(0, 9)) == 0
    for _ in range(draw(st.integers(1, 4))):
        b = draw(legacy_entry(offset)) if legacy else draw(v2_batch(offset))
        out.append(b)
        offset += 10
    return b"".join(out)


# ------------------------------------------------------------------------------------------------
# damage


def _varint_bytes(value: int, width: int) -> bytes:
    """Zigzag varint of ``value`` (may be out of range for ``width`` bits: that is the point)."""
    z = (value << 1) ^ (value >> (width - 1))
    z &= (1 << 70) - 1
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@st.composite
def damaged(draw, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["flip", "byte", "size", "field", "varint", "cut", "tail",
                                     "insert", "delete"]))
        n = len(buf)
        if n == 0:
            buf += draw(st.binary(max_size=80))
            continue
        at = draw(st.integers(0, n - 1))
        if what == "flip":
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif what == "byte":
            buf[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x01, 0x02]))
        elif what == "size" and n >= 12:
            # The size field of the first batch, or of the batch at a random place.
            pos = draw(st.sampled_from([0, min(at, n - 12)]))
            struct.pack_into(">i", buf, pos + 8, draw(st.sampled_from(INT32)))
        elif what == "field" and n >= 61:
            # A v2 header field: attributes, lastOffsetDelta, record count, producer id.
            off, fmt = draw(st.sampled_from([(21, ">h"), (23, ">i"), (57, ">i"), (43, ">q"),
                                             (16, ">b")]))
            vals = {">h": [0, 1, 2, 3, 4, 5, 7, 0x20, 0x10, -1],
                    ">i": INT32, ">q": [-1, 0, 5], ">b": [0, 1, 2, 3, -1]}[fmt]
            struct.pack_into(fmt, buf, off, draw(st.sampled_from(vals)))
        elif what == "varint":
            # A record field rewritten as a varint of an extreme value (or an endless one).
            value = draw(st.sampled_from([-1, -2, 0, 1, 2**31 - 1, -(2**31), 2**40, -(2**63),
                                          2**63 - 1, 127, 64]))
            width = draw(st.sampled_from([32, 64]))
            enc = (b"\xff" * draw(st.integers(5, 11)) if draw(st.integers(0, 5)) == 0
                   else _varint_bytes(value, width))
            buf[at:at + draw(st.integers(0, 2))] = enc
        elif what == "cut":
            del buf[draw(st.integers(0, n)):]
        elif what == "tail":
            buf += draw(st.binary(min_size=1, max_size=80))
        elif what == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif what == "delete":
            del buf[at:at + draw(st.integers(1, 16))]
    if draw(st.booleans()):
        # Recompute the CRCs that still can be, so damage inside a batch reaches its records.
        pos = 0
        while len(buf) - pos >= 61:
            size = 12 + struct.unpack_from(">i", buf, pos + 8)[0]
            if size < 61 or pos + size > len(buf):
                break
            if buf[pos + 16] == 2:
                fix_crc(buf, pos)
            pos += size
    return bytes(buf)


@st.composite
def hostile(draw):
    """Damaged log bytes, as bytes or as a bytearray (its own malloc block, guarded on both
    sides under ASan)."""
    data = draw(damaged(draw(log_bytes())))
    return bytearray(data) if draw(st.booleans()) else data


POSITION = st.one_of(st.integers(-70, 200), st.sampled_from(INT64))


def _allowed(fn, *args, **kwargs):
    """fn's result, or None when it raised a segstore error; anything else propagates."""
    try:
        return fn(*args, **kwargs)
    except SegstoreError:
        return None


def _span(buf, data) -> tuple[int, int]:
    """A valid ``(start, end)`` window of ``buf``."""
    start = data.draw(st.integers(0, len(buf)))
    return start, data.draw(st.integers(start, len(buf)))


# ------------------------------------------------------------------------------------------------
# targets


@FUZZ
@given(hostile(), st.data())
def test_scanners(buf, data):
    start, end = _span(buf, data)
    sr = _allowed(_core.scan_batches, buf, start, end, validate_crc=data.draw(st.booleans()),
                  raise_on_corrupt=data.draw(st.booleans()), strict=data.draw(st.booleans()),
                  max_batches=data.draw(st.one_of(st.none(), st.integers(0, 3))), file="f")
    if sr is not None:
        assert start <= sr.valid_end <= end
        assert all(start <= p and p + s <= end
                   for p, s in zip(sr.batches["position"], sr.batches["size"]))
    _allowed(_core.find_batch, buf, start, end, data.draw(st.sampled_from(INT64 + [5, 2**40])),
             first_holds=data.draw(st.one_of(st.none(), st.integers(-1, 2**41))), file="f")
    _allowed(_core.plain_batches, buf, start, end)
    # Out-of-range arguments are refused, never followed.
    _allowed(_core.scan_batches, buf, data.draw(POSITION), data.draw(st.one_of(st.none(),
                                                                               POSITION)))
    _allowed(_core.find_batch, buf, data.draw(POSITION), data.draw(POSITION), 0)
    _allowed(_core.plain_batches, buf, data.draw(POSITION), data.draw(POSITION))


@FUZZ
@given(hostile(), st.data())
def test_record_decoders(buf, data):
    start, end = _span(buf, data)
    lo = data.draw(st.one_of(st.none(), st.integers(0, 2**41)))
    limit = data.draw(st.one_of(st.none(), st.integers(0, 5)))
    crc = data.draw(st.booleans())
    _allowed(_core.decode_records, buf, start, end, min_offset=lo, max_records=limit,
             validate_crc=crc, include_control=data.draw(st.booleans()), file="f",
             strict=data.draw(st.booleans()))
    _allowed(_core.decode_columns, buf, start, end, min_offset=lo, max_records=limit,
             validate_crc=crc, include_headers=data.draw(st.booleans()), file="f",
             strict=data.draw(st.booleans()))
    mid = data.draw(st.integers(start, end))
    _allowed(_core.decode_columns_multi, [(buf, start, mid, "a"), (buf, mid, end, "b")],
             max_records=limit, validate_crc=crc, include_headers=data.draw(st.booleans()))


@pytest.fixture
def every_decode_path():
    """Two threads, the one-pass tail and streamed stores for every column decode, however
    small: the paths a large read takes, over fuzzed bytes."""
    old = (_core._set_parallel_min_bytes(0), _core._set_stream_min_bytes(0),
           _core._set_tail_share(0.5))
    yield
    _core._set_parallel_min_bytes(old[0])
    _core._set_stream_min_bytes(old[1])
    _core._set_tail_share(old[2])


@FUZZ
@given(st.lists(hostile(), min_size=1, max_size=3), st.data())
def test_column_decode_parallel_paths(every_decode_path, bufs, data):
    sources = [(b, 0, None, f"f{i}") for i, b in enumerate(bufs)]
    limit = data.draw(st.one_of(st.none(), st.integers(0, 5)))
    _allowed(_core.decode_columns_multi, sources, max_records=limit,
             validate_crc=data.draw(st.booleans()))
    _allowed(_core.decode_columns, bufs[0], validate_crc=data.draw(st.booleans()))


STRATEGIES = [("offset", None), ("timestamp", None), ("header", "h")]


@FUZZ
@given(hostile(), st.data())
def test_offset_map_build(buf, data):
    strategy, key = data.draw(st.sampled_from(STRATEGIES))
    omap = _core.OffsetMap(data.draw(st.sampled_from([24 * 4, 32 * 64, 1 << 16])),
                           strategy=strategy, header_key=key)
    n = len(buf)
    start = data.draw(st.integers(0, n))
    aborted = np.array([[9, 0, 2**62]], dtype=np.int64) if data.draw(st.booleans()) else None
    _allowed(_core.build_offset_map, omap, buf, start, n, data.draw(st.integers(-1, 2**41)),
             aborted, update_only=data.draw(st.booleans()) and strategy != "offset",
             end_offset=data.draw(st.one_of(st.none(), st.integers(0, 2**42))),
             validate_crc=data.draw(st.booleans()), file="f")
    _allowed(_core.build_offset_map, omap, buf, data.draw(POSITION), data.draw(POSITION), 0)


def _filter_all(filt, buf, out_size, file="f"):
    """What the cleaner does with a segment, batch by batch, kept to the checked API."""
    pos, op, out, n = 0, 0, bytearray(out_size), len(buf)
    for _ in range(64):
        if pos >= n:
            break
        code, pos, op = filt.run(buf, pos, n, out, op, file=file)
        if code == _core.FILTER_DONE:
            break
        if code == _core.FILTER_OUTPUT_FULL:
            need = _core.BatchFilter.room_needed(buf, pos)
            out = out[:op] + bytearray(max(need, 64))
            continue
        h = _core.scan_batches(buf, pos, max_batches=1, file=file).batches[0]
        size = int(h["size"])
        if h["magic"] < 2:
            pos += size
            continue
        codec = int(h["attributes"]) & 7
        payload = (compression.decompress(codec, memoryview(buf)[pos + 61:pos + size])
                   if codec else None)
        need = _core.BatchFilter.room_needed(buf, pos, None if payload is None else len(payload))
        if len(out) - op < need:
            out = out[:op] + bytearray(need)
        start = op
        op, rebuilt = filt.filter_one(buf, pos, 2, False, False, out, op, payload, file=file)
        if rebuilt and codec and op - start > 61:
            _core.compress_batch_at(out, start, op - start, codec)
        pos += size
    _core.finish_crcs(out, 0, op)
    return out[:op]


@FUZZ
@given(log_bytes(), st.data())
def test_cleaner_filter(clean, data):
    omap = _core.OffsetMap(1 << 16)
    _core.build_offset_map(omap, clean, 0, len(clean), 0)
    buf = data.draw(damaged(clean))
    if data.draw(st.booleans()):
        buf = bytearray(buf)
    filt = _core.BatchFilter(omap, 2**41, 1000, 2**62)
    _allowed(_filter_all, filt, buf, data.draw(st.sampled_from([0, 61, 4096])))
    # Out-of-range positions are refused before a byte is read.
    pos = data.draw(POSITION)
    _allowed(_core.BatchFilter.room_needed, buf, pos)
    _allowed(filt.filter_one, buf, pos, 2, False, False, bytearray(4096), 0, None)
    _allowed(filt.run, buf, pos, len(buf), bytearray(4096), 0)


@FUZZ
@given(hostile(), st.data())
def test_output_helpers(buf, data):
    out = bytearray(buf)
    n = len(out)
    _allowed(_core.finish_crcs, out, data.draw(st.integers(0, n)), n)
    _allowed(_core.finish_crcs, out, data.draw(POSITION), data.draw(POSITION))
    pos, size = data.draw(POSITION), data.draw(POSITION)
    _allowed(_core.compress_batch_at, out, pos, size, data.draw(st.sampled_from([1, 2, 3, 4])))
    _allowed(_core.set_base_offset, out, data.draw(POSITION), 5)


@FUZZ
@given(hostile(), st.data())
def test_first_null_key(buf, data):
    sr = _allowed(_core.scan_batches, buf, raise_on_corrupt=False)
    if sr is not None:
        _allowed(_core.first_null_key, buf, sr.batches, "f")
    # Rows that do not describe the buffer (a caller's mistake) are refused, not followed.
    rows = np.zeros(1, dtype=_core.BATCH_DTYPE)
    rows["position"] = data.draw(POSITION)
    rows["size"] = data.draw(st.sampled_from(INT32 + [len(buf)]))
    rows["records_count"] = data.draw(st.sampled_from(INT32))
    rows["attributes"] = data.draw(st.sampled_from([0, 1, 2, 3, 4, 0x20]))
    _allowed(_core.first_null_key, buf, rows, "f")


@FUZZ
@given(st.binary(max_size=300), st.booleans(), st.data())
def test_index_kernels(raw, time_index, data):
    buf = bytearray(raw) if data.draw(st.booleans()) else raw
    size = 12 if time_index else 8
    entries = data.draw(st.integers(0, len(buf) // size))
    target = data.draw(st.sampled_from(INT64 + [5, 2**31]))
    slot = _allowed(_core.index_lookup, buf, entries, target, time_index)
    assert slot is None or -1 <= slot < entries
    bad = _allowed(_core.index_check, buf, entries, time_index)
    assert bad is None or -1 <= bad < entries
    # Entry counts that do not fit the buffer, however large, are refused.
    entries = data.draw(st.sampled_from([len(buf) // size + 1, 2**61, 2**62, 2**63 - 1,
                                         2**61 + 1, -1]))
    _allowed(_core.index_lookup, buf, entries, target, time_index)
    _allowed(_core.index_check, buf, entries, time_index)
