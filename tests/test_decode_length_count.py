"""Damage that only a full parse sees, in batches whose CRC was recomputed after the edit.

The counting pass of a column decode reads only the lengths of a batch whose records it all
selects (count_region_sizes); the deltas and headers are checked by the fill, which parses
every record. Damage that leaves the lengths intact (offset deltas out of order, an over-long
varint where the count only skips) must still raise CorruptRecordError naming the damage and
the first damaged batch, whichever pass, thread or split meets it; the oracle is the object
decoder, which parses every record.
"""

from __future__ import annotations

import pytest

from conftest import batch_spans, check_columns, columns_tuples, core_settings, fix_crc, rec_tuple
from segstore import _core
from segstore.errors import CorruptRecordError

N_BATCHES = 8
PER_BATCH = 6


@pytest.fixture(params=["one thread", "two threads", "one-pass tail", "two threads streamed",
                        "head filled from the back", "head from the back streamed",
                        "two threads from the back", "predicted", "predicted from the back"])
def split(request):
    # "predicted": the log's like batches are placed by predicted sizes; at any damage the
    # decode falls back to the counting pass, which must still name the first.
    min_bytes, share = {"one thread": (1 << 62, 0.0), "two threads": (0, 0.0),
                        "one-pass tail": (0, 0.4), "two threads streamed": (0, 0.0),
                        "head filled from the back": (0, 0.4),
                        "head from the back streamed": (0, 0.4),
                        "two threads from the back": (0, 0.0), "predicted": (0, 0.0),
                        "predicted from the back": (0, 0.0)}[request.param]
    with core_settings(parallel_min_bytes=min_bytes, tail_share=share,
                       stream_min_bytes=0 if "streamed" in request.param else 1 << 62,
                       head_from_front="back" not in request.param,
                       predict_sizes="predicted" in request.param):
        yield request.param


def _log() -> bytes:
    # Records of 1-byte lengths and deltas: record j of a batch starts at a known place.
    return b"".join(
        _core.encode_batch([b"v" * 20] * PER_BATCH, [b"k"] * PER_BATCH, None,
                           [1_000 + i for i in range(PER_BATCH)], base_offset=b * PER_BATCH)
        for b in range(N_BATCHES))


RECORD = 1 + 1 + 1 + 1 + 1 + 1 + 1 + 20 + 1   # length, attrs, ts, offset, klen, k, vlen, v, hc


def _damage(buf: bytearray, batch: int, how: str) -> int:
    """Edit record 1 of ``batch`` without changing any length; returns the batch position."""
    pos = batch_spans(buf)[batch][0]
    rec = pos + 61 + RECORD
    assert buf[rec] == 2 * (RECORD - 1)            # its length varint, as laid out above
    if how == "offset delta":                      # record 1's delta equals record 0's
        buf[rec + 3] = 0
    elif how == "header count":                    # a header count of -1
        buf[rec + RECORD - 1] = 1
    else:
        raise ValueError(how)
    fix_crc(buf, pos)
    return pos


REASONS = {"offset delta": "offset deltas", "header count": "header count"}


@pytest.mark.parametrize("how", sorted(REASONS))
@pytest.mark.parametrize("victim", [0, 3, N_BATCHES - 1])
def test_damage_inside_records_is_named(split, how, victim):
    buf = bytearray(_log())
    pos = _damage(buf, victim, how)
    with pytest.raises(CorruptRecordError) as oracle:
        _core.decode_records(bytes(buf))
    with pytest.raises(CorruptRecordError) as err:
        _core.decode_columns(bytes(buf), file="seg.log")
    assert REASONS[how] in err.value.reason
    assert "changed during decode" not in err.value.reason
    assert err.value.position == pos == oracle.value.position
    assert err.value.file == "seg.log"


@pytest.mark.parametrize("how", sorted(REASONS))
def test_parse_damage_before_crc_damage_is_the_one_named(split, how):
    """A batch whose lengths add up passes the length-only count; a CRC error after it must
    not hide it."""
    buf = bytearray(_log())
    pos = _damage(buf, 1, how)
    later, size = batch_spans(buf)[N_BATCHES - 2]
    buf[later + size - 1] ^= 0x40                  # a value byte: only the CRC sees it
    with pytest.raises(CorruptRecordError) as err:
        _core.decode_columns(bytes(buf))
    assert err.value.position == pos
    assert REASONS[how] in err.value.reason


def test_damage_outside_the_selected_offsets_still_counts_in_full(split):
    """A batch cut by min_offset is counted in full (only its selected records): damage in it
    is named by the count, as before."""
    buf = bytearray(_log())
    pos = _damage(buf, 2, "offset delta")
    with pytest.raises(CorruptRecordError) as err:
        _core.decode_columns(bytes(buf), min_offset=2 * PER_BATCH + 1)
    assert err.value.position == pos
    assert "offset deltas" in err.value.reason


def test_undamaged_log_decodes_like_the_object_decoder(split):
    buf = _log()
    cols = _core.decode_columns(buf)
    check_columns(cols)
    assert [t[:5] for t in columns_tuples(cols, with_headers=False)] == [
        rec_tuple(r)[:5] for r in _core.decode_records(buf)]
