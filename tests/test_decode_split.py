"""The two-thread column decode, forced onto small inputs: every split gives the same columns.

Large column decodes count the head of a range on two threads, then copy it on one while the
other checks and copies the tail in a single pass, into arrays sized by an upper bound; the
largest write their output through streams (_stream_out.pxi). Here the size thresholds are
lowered to 0 so these paths run on small, varied logs; the oracle is the
object decoder (``decode_records``), and damage must raise at the first damaged batch whatever
thread finds it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import batch_spans, check_columns, columns_tuples, rec_tuple
from segstore import _core
from segstore.errors import CorruptRecordError

# (share of bytes in the one-pass tail, label): 0 turns the tail off (two-pass split only).
SHARES = [0.0, 0.4, 0.9]


@pytest.fixture(params=["plain stores", "streamed", "predicted", "predicted streamed"])
def split_everything(request):
    """Two threads (and the tail share a test sets) on every log, writing the columns with
    plain stores or, as decodes larger than the caches do, through streams; counting every
    batch, or ("predicted") placing the logs' runs of like batches by predicted sizes."""
    old_min = _core._set_parallel_min_bytes(0)
    old_share = _core._set_tail_share(0.4)
    old_stream = _core._set_stream_min_bytes(0 if "streamed" in request.param else 1 << 62)
    old_predict = _core._set_predict_sizes("predicted" in request.param)
    yield
    _core._set_parallel_min_bytes(old_min)
    _core._set_tail_share(old_share)
    _core._set_stream_min_bytes(old_stream)
    _core._set_predict_sizes(old_predict)


def _log(seed: int, n_batches: int = 9) -> bytes:
    """Batches of varied shape: null keys and values, headers, gaps, codecs, a control batch."""
    rng = np.random.default_rng(seed)
    parts, base = [], 0
    for b in range(n_batches):
        if b == 4:
            parts.append(_core.encode_control_batch(0, producer_id=7, producer_epoch=0,
                                                    base_offset=base, timestamp_ms=1_000 + b))
            base += 1
            continue
        n = int(rng.integers(1, 40))
        keys = [None if rng.random() < 0.2 else rng.bytes(int(rng.integers(0, 30)))
                for _ in range(n)]
        values = [None if rng.random() < 0.2 else rng.bytes(int(rng.integers(0, 300)))
                  for _ in range(n)]
        headers = [[("h", rng.bytes(3))] if rng.random() < 0.3 else [] for _ in range(n)]
        deltas = np.cumsum(rng.integers(1, 3, n)) - 1
        codec = ["none", "gzip", "none", "lz4", "none"][b % 5]
        parts.append(_core.encode_batch(values, keys, headers,
                                        [1_000 + b * 100 + i for i in range(n)],
                                        base_offset=base, compression=codec,
                                        offset_deltas=deltas.tolist()))
        base += int(deltas[-1]) + 1
    return b"".join(parts)


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("seed", range(6))
def test_every_split_decodes_like_the_object_decoder(split_everything, share, seed):
    _core._set_tail_share(share)
    buf = _log(seed)
    expected = [rec_tuple(r)[:5] for r in _core.decode_records(buf)]
    cols = _core.decode_columns(buf)
    check_columns(cols)
    assert [t[:5] for t in columns_tuples(cols, with_headers=False)] == expected


@pytest.mark.parametrize("share", SHARES)
def test_offset_bounds_inside_batches(split_everything, share):
    _core._set_tail_share(share)
    buf = _log(11)
    everything = [rec_tuple(r)[:5] for r in _core.decode_records(buf)]
    last = everything[-1][0]
    for lo, hi in [(3, last), (0, 5), (last // 2, last + 1), (last - 2, last + 10)]:
        cols = _core.decode_columns(buf, min_offset=lo, end_offset=hi)
        check_columns(cols)
        assert [t[:5] for t in columns_tuples(cols, with_headers=False)] == [
            t for t in everything if lo <= t[0] < hi]


@pytest.mark.parametrize("share", SHARES)
def test_headers_and_max_records_take_the_two_pass_path(split_everything, share):
    _core._set_tail_share(share)
    buf = _log(12)
    expected = [rec_tuple(r) for r in _core.decode_records(buf)]
    cols = _core.decode_columns(buf, include_headers=True)
    assert columns_tuples(cols) == expected
    for m in (1, 7, len(expected) - 1):
        cols = _core.decode_columns(buf, max_records=m)
        assert [t[:5] for t in columns_tuples(cols, with_headers=False)] == [
            t[:5] for t in expected[:m]]


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("victim", [0, 2, 5, 7, 8])
def test_crc_damage_is_raised_at_the_first_damaged_batch(split_everything, share, victim):
    _core._set_tail_share(share)
    buf = bytearray(_log(13))
    spans = batch_spans(buf)
    pos, size = spans[victim]
    buf[pos + size - 1] ^= 0x40           # a value or header byte: only the CRC sees it
    with pytest.raises(CorruptRecordError) as err:
        _core.decode_columns(bytes(buf))
    assert err.value.position == pos
    # A second damaged batch later never hides the first.
    later = spans[-1][0] + spans[-1][1] - 1
    if victim != len(spans) - 1:
        buf[later] ^= 0x40
        with pytest.raises(CorruptRecordError) as err:
            _core.decode_columns(bytes(buf))
        assert err.value.position == pos


@pytest.mark.parametrize("share", SHARES)
def test_record_damage_without_crc_is_caught_by_the_parser(split_everything, share):
    """With CRCs off, a corrupt record count must fail cleanly (never write past the arrays)."""
    _core._set_tail_share(share)
    buf = bytearray(_log(14))
    for pos, size in batch_spans(buf):
        view = memoryview(buf)[pos:pos + size]
        if view[16] != 2 or (int.from_bytes(view[21:23], "big") & 0x27):
            continue                      # only uncompressed data batches
        damaged = bytearray(buf)
        damaged[pos + 57:pos + 61] = (0x7FFFFFFF).to_bytes(4, "big")  # records count
        with pytest.raises(CorruptRecordError):
            _core.decode_columns(bytes(damaged), validate_crc=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n_batches=st.integers(1, 14),
       share=st.sampled_from(SHARES + [0.05, 0.99]))
def test_random_logs_and_splits(split_everything, seed, n_batches, share):
    _core._set_tail_share(share)
    buf = _log(seed, n_batches)
    expected = [rec_tuple(r)[:5] for r in _core.decode_records(buf)]
    cols = _core.decode_columns(buf)
    check_columns(cols)
    assert [t[:5] for t in columns_tuples(cols, with_headers=False)] == expected
