"""The placed batches of a large column decode, shared by its two threads.

The first thread fills the counted batches from the front, the other from the back, until
the two meet (a claim word both advance with compare-and-swap). With a one-pass tail, the
other thread first checks and copies the tail, then fills the head from the back. Whatever
the split, every record must land in its place exactly once: the oracle is the object
decoder. ``_set_head_from_front(False)`` makes the second thread fill every placed batch
from the back, so that path runs deterministically; with both on, the threads race for real.
"""

from __future__ import annotations

import mmap
import random

import pytest

from conftest import check_columns, columns_tuples, rec_tuple
from segstore import _core


@pytest.fixture
def two_threads():
    # The counting pass's paths: no placement by predicted sizes (test_decode_predicted.py).
    old = (_core._set_parallel_min_bytes(0), _core._set_tail_share(0.4),
           _core._set_stream_min_bytes(1 << 62), _core._set_head_from_front(True),
           _core._set_predict_sizes(False))
    yield
    _core._set_parallel_min_bytes(old[0])
    _core._set_tail_share(old[1])
    _core._set_stream_min_bytes(old[2])
    _core._set_head_from_front(old[3])
    _core._set_predict_sizes(old[4])


def _log(n_batches: int, seed: int, headers: bool = False) -> bytes:
    rng = random.Random(seed)
    out, base = [], 0
    for _ in range(n_batches):
        n = rng.randint(1, 30)
        keys = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 40))
                for _ in range(n)]
        values = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 300))
                  for _ in range(n)]
        hdrs = [[(f"h{j}", None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 9)))
                 for j in range(rng.randint(0, 3))] for _ in range(n)] if headers else None
        out.append(_core.encode_batch(values, keys, hdrs, [1_000 + base + i for i in range(n)],
                                      base_offset=base))
        base += n
    return b"".join(out)


def _oracle(buf, headers: bool = False) -> list:
    return [rec_tuple(r) if headers else rec_tuple(r)[:5] + (None,)
            for r in _core.decode_records(bytes(buf))]


@pytest.mark.parametrize("from_front", [True, False])
@pytest.mark.parametrize("share", [0.0, 0.2, 0.4, 0.6, 0.9])   # 0: no tail
@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_every_split_decodes_like_the_object_decoder(two_threads, from_front, share, streamed,
                                                     seed):
    buf = _log(3 + 7 * seed, seed)
    _core._set_head_from_front(from_front)
    _core._set_tail_share(share)
    _core._set_stream_min_bytes(0 if streamed else 1 << 62)
    cols = _core.decode_columns(buf)
    check_columns(cols)
    assert columns_tuples(cols, with_headers=False) == _oracle(buf)


def test_head_from_the_back_over_a_dropped_mapping_keeps_the_file(two_threads, tmp_path):
    # Batches copied last first drop their pages in runs that grow downwards; the file's bytes
    # must come back intact on the next touch.
    buf = _log(40, 7)
    path = tmp_path / "seg.log"
    path.write_bytes(buf)
    _core._set_head_from_front(False)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for _ in range(2):
            cols = _core.decode_columns_multi([(m, 0, len(m), "seg.log", True)])
            assert columns_tuples(cols, with_headers=False) == _oracle(buf)
        assert m[:] == buf


def test_offset_range_and_racing_threads(two_threads):
    buf = _log(60, 11)
    want = _oracle(buf)
    lo, hi = want[len(want) // 5][0], want[4 * len(want) // 5][0]
    for _ in range(30):   # both fillers on: which one takes each head batch varies by run
        cols = _core.decode_columns(buf)
        assert columns_tuples(cols, with_headers=False) == want
        part = _core.decode_columns(buf, min_offset=lo, end_offset=hi)
        assert columns_tuples(part, with_headers=False) == [r for r in want if lo <= r[0] < hi]


@pytest.mark.parametrize("from_front", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_headers_and_max_records_share_every_batch(two_threads, from_front, seed):
    # Headers and max_records rule out the one-pass tail: all batches are counted, then
    # shared by the two fillers.
    buf = _log(5 + 9 * seed, seed, headers=True)
    _core._set_head_from_front(from_front)
    want = _oracle(buf, headers=True)
    cols = _core.decode_columns(buf, include_headers=True)
    check_columns(cols)
    assert columns_tuples(cols) == want
    for cut in (1, len(want) // 3, len(want) - 1):
        part = _core.decode_columns(buf, max_records=cut)
        assert columns_tuples(part, with_headers=False) == [r[:5] + (None,) for r in want[:cut]]
