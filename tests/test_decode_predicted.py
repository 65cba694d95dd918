"""Column decodes placed by predicted sizes (``_decode_predict.pxi``).

A large whole-range decode whose batches come in runs of like batches (the same record count
and record bytes) counts one batch per run and predicts the others' output sizes; both threads
then check each batch's CRC and copy it in one pass. A wrong prediction, a damaged batch or a
buffer changed before the fill makes the decode count every batch and fill again. These tests
force the two-thread paths onto small logs and compare every result with the record decoder
and with the counting pass; ``_prediction_stats`` shows which path a decode took.
"""

from __future__ import annotations

import mmap
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import (batch_spans, check_columns, columns_tuples, core_settings, fix_crc,
                      rec_tuple, rewritten_between_passes)
from segstore import _core
from segstore.errors import CorruptRecordError


@pytest.fixture(params=["plain stores", "streamed", "from the back"])
def predicting(request):
    """Two threads on every log, sizes predicted; the tail share is set to show that a
    predicted decode has no one-pass tail. "from the back": one thread fills every batch,
    last first."""
    with core_settings(parallel_min_bytes=0, tail_share=0.4,
                       stream_min_bytes=0 if request.param == "streamed" else 1 << 62,
                       head_from_front=request.param != "from the back", predict_sizes=True):
        yield request.param


def _batch(base: int, n: int, klen: int, vlen: int, rng: random.Random) -> bytes:
    keys = [None if klen < 0 else rng.randbytes(klen) for _ in range(n)]
    values = [None if vlen < 0 else rng.randbytes(vlen) for _ in range(n)]
    return _core.encode_batch(values, keys, None, [1_000 + i for i in range(n)],
                              base_offset=base)


def _log(runs, seed: int = 0) -> bytes:
    """Batches in runs of ``(batches, records per batch, key length, value length)`` (a
    length of -1: nulls), offsets following on."""
    rng = random.Random(seed)
    out, base = [], 0
    for batches, n, klen, vlen in runs:
        for _ in range(batches):
            out.append(_batch(base, n, klen, vlen, rng))
            base += n
    return b"".join(out)


def _twin(buf: bytes, victim: int, n: int, klen: int, vlen: int, shift: int,
          seed: int = 7) -> bytes:
    """``buf`` with batch ``victim`` (of ``n`` records) rewritten with ``shift`` value bytes
    moved into each key: the same framing (size, count, offsets), other output sizes."""
    pos, size = batch_spans(buf)[victim]
    base = int.from_bytes(buf[pos:pos + 8], "big", signed=True)
    new = _batch(base, n, klen + shift, vlen - shift, random.Random(seed))
    assert len(new) == size
    return buf[:pos] + new + buf[pos + size:]


def _counted(buf, **kw):
    """The counting pass's columns of ``buf``: the oracle each prediction must match."""
    old = _core._set_predict_sizes(False)
    try:
        return _core.decode_columns(buf, **kw)
    finally:
        _core._set_predict_sizes(old)


def _decode(buf, **kw):
    """decode_columns, with how many decodes were predicted and fell back meanwhile."""
    before = _core._prediction_stats()
    cols = _core.decode_columns(buf, **kw)
    after = _core._prediction_stats()
    return cols, after[0] - before[0], after[1] - before[1]


def _same(a, b) -> None:
    for name in ("offsets", "timestamps_ms", "timestamp_types"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for name in ("keys", "values"):
        x, y = getattr(a, name), getattr(b, name)
        np.testing.assert_array_equal(x.offsets, y.offsets)
        np.testing.assert_array_equal(x.data, y.data)
        np.testing.assert_array_equal(x.valid, y.valid)


def _like_records(cols, buf) -> None:
    check_columns(cols)
    assert columns_tuples(cols, False) == [rec_tuple(r)[:5] + (None,)
                                           for r in _core.decode_records(buf)]


@pytest.mark.parametrize("per_batch", [1, 7, 100])
def test_like_batches_are_predicted_and_decode_like_the_records(predicting, per_batch):
    buf = _log([(12, per_batch, 16, 40), (1, max(per_batch // 2, 1), 16, 40)], seed=per_batch)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 0)
    _like_records(cols, buf)
    _same(cols, _counted(buf))


def test_runs_of_different_batches_are_each_predicted_from_their_first(predicting):
    # Nulls, empty cells and four batch shapes, each counted once where its run starts.
    buf = _log([(12, 5, 16, 40), (12, 3, -1, 0), (12, 9, 0, -1), (4, 2, 3, 3)], seed=1)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 0)
    _like_records(cols, buf)


def test_a_short_batch_between_runs_does_not_restart_the_run(predicting):
    # Seven full batches, then a short one where a producer's chunk ended, five times over:
    # two batches counted (the first full one and the first short one), the rest predicted.
    # Comparing each batch with the last counted one only would count ten of 40.
    buf = _log([(7, 6, 8, 20), (1, 2, 8, 20)] * 5, seed=13)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 0)
    _like_records(cols, buf)


@pytest.mark.parametrize("shapes,expected", [(4, 1), (5, 0)])
def test_shapes_past_the_samples_kept_are_counted_again(predicting, shapes, expected):
    """A long run, then ``shapes`` batch shapes in turn. Four fit the samples kept: each is
    counted once (5 of 106 batches, within the budget of 106 // 16 + 2). A fifth evicts the
    oldest each time, so every later batch is counted and the budget runs out."""
    runs = [(96, 3, 8, 20)] + [(1, 3, 8, 21 + k % shapes) for k in range(10)]
    buf = _log(runs, seed=14)
    cols, predicted, _ = _decode(buf)
    assert predicted == expected
    _like_records(cols, buf)


@pytest.mark.parametrize("codec", [1, 3])
def test_compressed_batches_are_predicted_by_their_inflated_records(predicting, codec):
    rng = random.Random(15)
    buf = b"".join(_core.encode_batch([rng.randbytes(8) * 4 for _ in range(6)],
                                      [rng.randbytes(8) for _ in range(6)], None,
                                      [1_000 + i for i in range(6)], base_offset=6 * b,
                                      compression=codec) for b in range(12))
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 0)
    _like_records(cols, buf)


def test_a_log_that_starts_varied_gives_up_early(predicting):
    # Three unlike batches first: more than one in 16 (plus two) counted so far.
    buf = _log([(1, 3, 8, 20 + k) for k in range(3)] + [(30, 3, 8, 20)], seed=16)
    cols, predicted, _ = _decode(buf)
    assert predicted == 0
    _like_records(cols, buf)


def test_batches_too_varied_to_predict_are_counted(predicting):
    # Every batch of another size: counting them one by one before the fill would cost more
    # than the counting pass does on two threads.
    buf = _log([(1, 3, 4, 10 + i) for i in range(20)], seed=2)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (0, 0)
    _like_records(cols, buf)


@pytest.mark.parametrize("victim", [0, 1, 6, 11])
@pytest.mark.parametrize("shift", [-3, 2])
def test_a_wrong_prediction_falls_back_to_counting(predicting, victim, shift):
    """A batch framed like its run (same size, count and offsets) whose records split their
    bytes otherwise between keys and values fills no place exactly: the decode counts."""
    buf = _twin(_log([(12, 6, 8, 30)], seed=3), victim, 6, 8, 30, shift)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 1)
    _like_records(cols, buf)
    _same(cols, _counted(buf))


def test_the_counted_batch_of_a_run_is_its_sample(predicting):
    # Batch 0 differs from the rest of its run: batch 1 is predicted like it and falls back.
    buf = _twin(_log([(10, 4, 8, 20)], seed=4), 0, 4, 8, 20, 5)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 1)
    _like_records(cols, buf)


def _damage_record(buf: bytearray, batch: int) -> int:
    """Make record 1 of ``batch`` repeat record 0's offset delta, CRC fixed: only a parse of
    every field sees it. Records are 1 + 1 + 1 + 1 + 1 + 8 + 1 + 20 + 1 bytes."""
    pos = batch_spans(buf)[batch][0]
    rec = pos + 61 + 35
    assert buf[rec] == 2 * 34 and buf[rec + 3] == 2   # length 34, offset delta 1
    buf[rec + 3] = 0
    fix_crc(buf, pos)
    return pos


@pytest.mark.parametrize("victim", [0, 5, 11])
def test_crc_damage_is_named_as_the_counting_pass_names_it(predicting, victim):
    buf = bytearray(_log([(12, 6, 8, 20)], seed=5))
    pos, size = batch_spans(buf)[victim]
    buf[pos + size - 2] ^= 0x10                  # a value byte: only the CRC sees it
    with pytest.raises(CorruptRecordError) as counted:
        _counted(bytes(buf))
    before = _core._prediction_stats()
    with pytest.raises(CorruptRecordError) as err:
        _core.decode_columns(bytes(buf), file="seg.log")
    after = _core._prediction_stats()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    assert "CRC" in err.value.reason and err.value.position == pos == counted.value.position
    assert err.value.file == "seg.log"
    # Without CRC checks the changed byte is only a value byte.
    cols, predicted, _ = _decode(bytes(buf), validate_crc=False)
    assert predicted == 1
    check_columns(cols)
    _same(cols, _counted(bytes(buf), validate_crc=False))
    intact = _counted(_log([(12, 6, 8, 20)], seed=5))
    assert cols.values.data.tobytes() != intact.values.data.tobytes()


def test_the_first_damage_in_batch_order_is_named(predicting):
    """Parse damage in batch 1 and CRC damage in batch 10: whichever a thread meets first,
    the decode names batch 1, as the counting pass does."""
    buf = bytearray(_log([(12, 6, 8, 20)], seed=6))
    pos = _damage_record(buf, 1)
    later, size = batch_spans(buf)[10]
    buf[later + size - 2] ^= 0x40                # a value byte
    before = _core._prediction_stats()
    with pytest.raises(CorruptRecordError) as err:
        _core.decode_columns(bytes(buf))
    after = _core._prediction_stats()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    assert err.value.position == pos
    assert "offset deltas" in err.value.reason


def test_a_range_inside_the_first_and_last_batches(predicting):
    # The first and last batches are counted in full (only some of their records are
    # selected); the batches between are predicted.
    buf = _log([(12, 6, 8, 20)], seed=8)
    cols, predicted, fallbacks = _decode(buf, min_offset=3, end_offset=12 * 6 - 2)
    assert (predicted, fallbacks) == (1, 0)
    assert cols.offsets.tolist() == list(range(3, 70))
    _same(cols, _counted(buf, min_offset=3, end_offset=70))


def test_capped_and_header_decodes_are_counted(predicting):
    buf = _log([(12, 6, 8, 20)], seed=9)
    for kw in ({"max_records": 50}, {"include_headers": True}):
        cols, predicted, _ = _decode(buf, **kw)
        assert predicted == 0
        _same(cols, _counted(buf, **kw))


@pytest.mark.parametrize("validate_crc", [True, False])
def test_a_buffer_changed_before_the_fill(predicting, validate_crc):
    """A caller's bytearray rewritten between the prediction and the fill: the batch's CRC no
    longer matches its scanned header, or, unchecked, it fills no place exactly and the
    decode counts the bytes as they are now. Never columns of both."""
    before = _log([(12, 6, 8, 30)], seed=10)
    after = _twin(before, 4, 6, 8, 30, 3)
    buf = bytearray(before)
    with rewritten_between_passes(buf, after) as done:
        if validate_crc:
            stats = _core._prediction_stats()
            with pytest.raises(CorruptRecordError) as err:
                _core.decode_columns(buf)
            assert _core._prediction_stats()[0] == stats[0] + 1
            assert "CRC" in err.value.reason
            assert err.value.position == batch_spans(after)[4][0]
        else:
            cols, predicted, fallbacks = _decode(buf, validate_crc=False)
            assert (predicted, fallbacks) == (1, 1)
            _like_records(cols, after)
    assert done


def test_several_sources_and_a_dropped_mapping(predicting, tmp_path):
    buf = _log([(12, 6, 8, 20)], seed=11)
    spans = batch_spans(buf)
    path = tmp_path / "seg.log"
    path.write_bytes(buf)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        cut = spans[5][0]
        sources = [(buf, 0, cut, "a"), (m, cut, len(buf), "b", True)]
        before = _core._prediction_stats()
        cols = _core.decode_columns_multi(sources)
        assert _core._prediction_stats()[0] == before[0] + 1
        _like_records(cols, buf)
        assert m[:] == buf                       # the dropped pages came back from the file


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 9), st.integers(-1, 12),
                               st.integers(-1, 40)), min_size=1, max_size=4),
       twins=st.lists(st.tuples(st.integers(0, 40), st.integers(-4, 4)), max_size=2),
       seed=st.integers(0, 2**16))
def test_random_runs_decode_like_the_counting_pass(predicting, runs, twins, seed):
    buf = _log(runs, seed)
    batches = [(n, k, v) for count, n, k, v in runs for _ in range(count)]
    for victim, shift in twins:
        victim %= len(batches)
        n, k, v = batches[victim]
        if shift and k >= 0 and v >= 0 and 0 <= k + shift and 0 <= v - shift:
            buf = _twin(buf, victim, n, k, v, shift, seed)
    cols = _core.decode_columns(buf)
    _like_records(cols, buf)
    _same(cols, _counted(buf))


def test_log_reads_are_predicted(tmp_path):
    """A partition's read_columns (several segments, mapped) takes the predicted path."""
    import segstore
    from segstore.columns import BinaryColumn

    n = 120_000
    keys = np.frombuffer(random.Random(12).randbytes(16 * n), np.uint8).reshape(n, 16)
    values = np.zeros((n, 100), np.uint8)
    values[:, 0] = np.arange(n) % 251
    with segstore.open(str(tmp_path), config={"log.segment.bytes": 4 << 20}) as store:
        store.create_topic("t", 1)
        log = store.partition("t", 0)
        log.append_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys),
                           np.arange(n, dtype=np.int64), records_per_batch=1000)
        assert len(log.segments) > 2
        before = _core._prediction_stats()
        cols = log.read_columns()
        assert _core._prediction_stats()[0] == before[0] + 1
        old = _core._set_predict_sizes(False)
        try:
            _same(cols, log.read_columns())
        finally:
            _core._set_predict_sizes(old)
    assert cols.values.data.reshape(n, 100)[:, 0].tolist() == values[:, 0].tolist()


@pytest.mark.parametrize("lib", ["kafka-python", "aiokafka"])
def test_predicted_decodes_match_an_independent_parser(predicting, lib):
    """Runs, a short batch between them, nulls and empty cells, against kafka-python's and
    aiokafka's record classes (not segstore's own decoders)."""
    from test_core_codec import oracle_log_records

    buf = _log([(20, 6, 8, 20), (1, 2, 8, 20), (7, 6, 8, 20), (5, 4, -1, 0)], seed=17)
    cols, predicted, fallbacks = _decode(buf)
    assert (predicted, fallbacks) == (1, 0)
    assert columns_tuples(cols, False) == [r[:5] + (None,)
                                           for r in oracle_log_records(buf, lib)]
