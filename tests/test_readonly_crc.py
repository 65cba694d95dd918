"""A read-only log checks the CRCs of what a writer added once, not twice.

Its refresh CRC-checks the bytes appended since its last look (to find the last whole, valid
batch); the column read that triggered the refresh then skips the CRCs of exactly those batches,
and every later read checks its bytes again. A read-only store opened and then read (a Spark
task) checks each batch once. The core takes the caller's word for a checked
range, so the range must be exact: a batch outside it, or only partly inside, is checked.
"""

from __future__ import annotations

import pytest

from segstore import _core, log_reads
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError

from test_log import open_log


def _log_bytes(batches=3, per=10):
    enc = _core.encode_columns(
        BinaryColumn.from_pylist([b"value-%03d" % i for i in range(batches * per)]), None,
        1_700_000_000_000, records_per_batch=per)
    return bytearray(enc.data), enc.batches


def _spoil_crc_of(buf, batches, b):
    """Flip a value byte inside batch b: its stored CRC no longer matches."""
    pos, size = int(batches["position"][b]), int(batches["size"][b])
    buf[pos + size - 2] ^= 0x01
    return pos, pos + size


@pytest.mark.parametrize("validate", [True, False])
def test_a_checked_range_skips_exactly_its_batches(validate):
    buf, batches = _log_bytes()
    lo, hi = _spoil_crc_of(buf, batches, 1)
    src = (bytes(buf), 0, len(buf), "f.log")
    if validate:
        with pytest.raises(CorruptRecordError, match="f.log"):
            _core.decode_columns_multi([src])
        # Ranges that do not hold all of batch 1 leave it checked.
        for checked in [(0, lo), (lo + 1, len(buf)), (lo, hi - 1), (hi, len(buf))]:
            with pytest.raises(CorruptRecordError):
                _core.decode_columns_multi([src + (False, checked)])
    cols = _core.decode_columns_multi([src + (False, (lo, hi))])  # the caller checked it
    assert len(cols.offsets) == 30
    assert cols.values.to_pylist()[19] != b"value-019"   # what was there is returned as is
    cols = _core.decode_columns_multi([src + (False, (0, len(buf)))], validate_crc=validate)
    assert len(cols.offsets) == 30


def _capture(monkeypatch):
    seen = []
    real = log_reads._core.decode_columns_multi

    def spy(sources, **kw):
        seen.append([s[5] for s in sources])
        return real(sources, **kw)
    monkeypatch.setattr(log_reads._core, "decode_columns_multi", spy)
    return seen


def test_a_reader_skips_only_what_its_refresh_just_checked(tmp_path, monkeypatch):
    w = open_log(tmp_path / "t-0", segment_bytes=10**6)
    w.append_batch([b"a-%d" % i for i in range(5)])
    ro = open_log(tmp_path / "t-0", readonly=True)      # opening refreshes: checks [0, end)
    seen = _capture(monkeypatch)
    end = ro.segments[-1].size
    assert ro.read_columns().values.to_pylist() == [b"a-%d" % i for i in range(5)]
    assert seen[-1] == [(0, end)]
    ro.read_columns()                                   # nothing new: every CRC checked again
    assert seen[-1] == [None]
    w.append_batch([b"b-%d" % i for i in range(3)])
    ro.log_end_offset                                   # refreshes (a check) ...
    mid = ro.segments[-1].size
    w.append_batch([b"b-3"])
    cols = ro.read_columns()                            # ... and this one's refresh too:
    assert seen[-1] == [(end, ro.segments[-1].size)]    # only the new batches, both ranges
    assert mid < ro.segments[-1].size
    assert cols.values.to_pylist()[-4:] == [b"b-0", b"b-1", b"b-2", b"b-3"]
    w.append_batch([b"c"])
    ro.read(0)                                          # another read's refresh took it ...
    ro.read_columns()
    assert seen[-1] == [None]                           # ... so this one checks everything
    w.close()
    ro.close()


def test_a_writable_log_never_skips_a_check(tmp_path, monkeypatch):
    w = open_log(tmp_path / "t-0", segment_bytes=10**6)
    w.append_batch([b"a", b"b"])
    seen = _capture(monkeypatch)
    w.read_columns()
    assert seen == [[None]]
    w.close()
