"""A column decode over a read-only file mapping drops the pages it has copied (``release``).

The pages go in runs (``_core._set_release((run_bytes, align))``) cut at ``align``
boundaries, so a huge (2 MiB) mapping of a segment's cached folios is dropped whole instead of
split first. These tests check what the cuts must keep: the decoded columns, the file's bytes, and no
mapped input left resident after the decode, whichever way the two fill threads share the
batches. The peak resident set is asv's (``log.ReadColumnsMemory``): the batch headers' scan
maps a huge-folio file whole before the fill, so a test here could not tell the cuts apart.
"""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from conftest import columns_tuples, core_settings, map_rss_kib
from segstore import _core
from segstore.columns import BinaryColumn

MiB = 1 << 20


def _log_bytes(n: int = 260_000) -> bytes:
    """About 32 MB of 1,000-record batches of 16-byte keys and 100-byte values."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    values = rng.integers(0, 256, (n, 100), dtype=np.uint8)
    enc = _core.encode_columns(BinaryColumn.from_fixed(values), BinaryColumn.from_fixed(keys),
                               np.arange(n, dtype=np.int64), records_per_batch=1000)
    return bytes(enc.data)


@pytest.fixture(scope="module")
def log_file(tmp_path_factory):
    data = _log_bytes()
    path = tmp_path_factory.mktemp("release") / "00000000000000000000.log"
    path.write_bytes(data)
    return path, data


def _decode_mapped(path, release: bool):
    """Decode the file through a fresh read-only map: (columns, the map's resident kB after
    the decode)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = np.frombuffer(m, dtype=np.uint8, count=1)
        address = view.ctypes.data
        del view  # the map cannot close while an array exports it
        cols = _core.decode_columns_multi([(m, 0, len(m), str(path), release)])
        return cols, map_rss_kib(address)


SETTINGS = [
    pytest.param((MiB, 4096), id="page-cuts"),
    pytest.param((MiB, 256 << 10), id="quarter-run-cuts"),
    pytest.param((MiB, MiB), id="run-cuts"),
    pytest.param((8 * MiB, 2 * MiB), id="default"),
]


@pytest.mark.parametrize("predict", [True, False], ids=["predicted", "counted"])
@pytest.mark.parametrize("from_front", [True, False], ids=["head-front", "head-back"])
@pytest.mark.parametrize("release", SETTINGS)
def test_released_decode_keeps_columns_and_file(log_file, release, from_front, predict):
    path, data = log_file
    want = columns_tuples(_core.decode_columns(data), with_headers=False)
    with core_settings(release=release, head_from_front=from_front, predict_sizes=predict):
        cols, left = _decode_mapped(path, True)
    assert columns_tuples(cols, with_headers=False) == want
    # Every whole page of the input was dropped by the end: at most the pages at the two
    # threads' meeting point and the file's ends stay mapped.
    assert left <= 64, f"{left} kB of the input still mapped after the decode"
    with open(path, "rb") as f:
        assert f.read() == data


def test_release_setter_checks_and_restores():
    old = _core._set_release((16 * MiB, 2 * MiB))
    try:
        assert old == (8 * MiB, 2 * MiB)  # the shipped setting
        assert _core._set_release((4 * MiB, 4096)) == (16 * MiB, 2 * MiB)
        for bad in [(MiB, 3 << 12), (MiB, 2048), (MiB, 2 * MiB), (MiB, 0)]:
            with pytest.raises(ValueError, match="align must be a power of two"):
                _core._set_release(bad)
        assert _core._set_release((4 * MiB, 4096)) == (4 * MiB, 4096)  # refused: unchanged
    finally:
        _core._set_release(old)


def test_kept_pages_stay_mapped(log_file):
    # The control for the resident-set check above: without release the input stays mapped.
    path, data = log_file
    cols, left = _decode_mapped(path, False)
    assert left << 10 >= 0.9 * len(data)
    assert len(cols) == 260_000
