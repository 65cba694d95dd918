"""Review of the column decoder's max_records rework (6681f5e, 1727990): pinning tests.

decode_columns(max_records=k) must equal decode_records(max_records=k) record for record (keys,
values, nulls, headers, timestamps) whatever the batch layout: many batches (the header scan
grows its chunk 16, 32, 64, ...), compressed and control batches, offset gaps, a min_offset
inside a batch, several sources, and with the pass-1/pass-2 work split over two threads in
groups. With damage in one batch, a capped read succeeds exactly when its records all precede
the damaged batch (every batch holding a returned record, and every skipped batch before
them, is CRC-checked), and raises at the damaged batch otherwise.
"""

from __future__ import annotations

import random
import struct

import pytest

from segstore import _core
from segstore.errors import CorruptRecordError

PARALLEL_DEFAULT = 8 << 20


@pytest.fixture(params=["one thread", "two threads"])
def threads(request):
    _core._set_parallel_min_bytes(1 << 62 if request.param == "one thread" else 0)
    yield request.param
    _core._set_parallel_min_bytes(PARALLEL_DEFAULT)


def _batches(rng: random.Random, n: int) -> list[bytes]:
    parts, base = [], 0
    for _ in range(n):
        if rng.random() < 0.1:
            parts.append(_core.encode_control_batch(1, producer_id=1, producer_epoch=0,
                                                    base_offset=base, timestamp_ms=5))
            base += 1
            continue
        deltas = sorted(rng.sample(range(10), rng.randint(1, 6)))
        values = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 30))
                  for _ in deltas]
        keys = [None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 8)) for _ in deltas]
        headers = [[("h%d" % j, None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 5)))
                    for j in range(rng.randint(0, 3))] for _ in deltas]
        parts.append(_core.encode_batch(values, keys=keys, headers=headers, base_offset=base,
                                        offset_deltas=deltas,
                                        compression=rng.choice([0, 0, 1, 3])))
        base += deltas[-1] + 1
    return parts


def _col_rows(cols):
    return list(zip(cols.offsets.tolist(), cols.timestamps_ms.tolist(), cols.keys.to_pylist(),
                    cols.values.to_pylist(), cols.headers.to_pylist()))


def _rec_rows(records):
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


def test_capped_column_decodes_equal_the_record_decoder(threads):
    rng = random.Random(11)
    for _ in range(60):
        parts = _batches(rng, rng.randint(1, 140))
        buf = b"".join(parts)
        total = len(_core.decode_records(buf))
        lo = rng.choice([None, rng.randint(0, 300)])
        for k in {0, 1, rng.randint(0, total + 3), total, total + 1}:
            expected = _rec_rows(_core.decode_records(buf, min_offset=lo, max_records=k))
            got = _core.decode_columns(buf, min_offset=lo, max_records=k, include_headers=True)
            assert _col_rows(got) == expected, (k, lo)
            cut = rng.randint(0, len(parts))
            a, b = b"".join(parts[:cut]), b"".join(parts[cut:])
            multi = _core.decode_columns_multi([(a, 0, len(a), "a"), (b, 0, len(b), "b")],
                                               min_offset=lo, max_records=k,
                                               include_headers=True)
            assert _col_rows(multi) == expected, (k, lo, cut)


def _spans(parts):
    out, pos = [], 0
    for p in parts:
        out.append((pos, len(p)))
        pos += len(p)
    return out


def test_capped_decodes_need_only_the_batches_holding_their_records(threads):
    rng = random.Random(12)
    for _ in range(150):
        parts = _batches(rng, rng.randint(2, 150))
        buf = b"".join(parts)
        spans = _spans(parts)
        # Around the scan's chunk boundaries (16, 48, 112 batches) most of the time.
        damaged = min(len(parts) - 1, rng.choice([rng.randrange(len(parts)), 15, 16, 17, 47,
                                                  48, 49, 111, 112]))
        pos, size = spans[damaged]
        broken = bytearray(buf)
        if rng.random() < 0.5:
            broken[pos + size - 1] ^= 0xFF                      # CRC
        else:
            broken[pos + 8:pos + 12] = struct.pack(">i", 5)     # size field too small
        broken = bytes(broken)
        lo = rng.choice([None, rng.randint(0, 100)])
        k = rng.randint(1, 60)
        holding = [(r.offset, i) for i, (p, s) in enumerate(spans)
                   for r in _core.decode_records(buf, p, p + s, min_offset=lo)]
        wanted = holding[:k]
        ok = len(wanted) == k and wanted[-1][1] < damaged
        decoders = {
            "records": lambda b: [r.offset for r in _core.decode_records(
                b, min_offset=lo, max_records=k, strict=True, file="f")],
            "columns": lambda b: _core.decode_columns(
                b, min_offset=lo, max_records=k, strict=True, file="f",
                include_headers=True).offsets.tolist(),
        }
        for what, decode in decoders.items():
            if ok:
                assert decode(broken) == [o for o, _ in wanted], what
            else:
                with pytest.raises(CorruptRecordError) as e:
                    decode(broken)
                assert (e.value.file, e.value.position) == ("f", pos), what


def test_damage_in_a_later_source_is_not_needed(threads):
    rng = random.Random(13)
    first = _batches(rng, 40)
    second = _batches(rng, 40)
    a = b"".join(first)
    b = bytearray(b"".join(second))
    b[len(second[0]) - 1] ^= 0xFF   # the CRC of the second source's first batch
    b = bytes(b)
    n_first = len(_core.decode_records(a))
    sources = [(a, 0, len(a), "a"), (b, 0, len(b), "b")]
    got = _core.decode_columns_multi(sources, max_records=n_first)
    assert got.offsets.tolist() == [r.offset for r in _core.decode_records(a)]
    with pytest.raises(CorruptRecordError) as e:
        _core.decode_columns_multi(sources, max_records=n_first + 1)
    assert (e.value.file, e.value.position) == ("b", 0)


def test_a_scan_chunk_ending_exactly_at_the_range_end(threads):
    """16, 48 and 112 batches: the last header scan ends exactly at the range's end."""
    for n in (16, 48, 112):
        buf = b"".join(_core.encode_batch([b"v"], base_offset=i) for i in range(n))
        for k in (n - 1, n, n + 5):
            assert _core.decode_columns(buf, max_records=k, strict=True).offsets.tolist() == \
                list(range(min(k, n)))
            assert [r.offset for r in _core.decode_records(buf, max_records=k, strict=True)] \
                == list(range(min(k, n)))
