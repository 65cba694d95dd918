"""Bad arguments to the codec (segstore._core) and to BinaryColumn raise segstore.errors classes
naming the argument; before, some were accepted and produced wrong bytes or hashes."""

import numpy as np
import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from segstore import _core
from segstore.columns import BinaryColumn
from segstore.errors import (InvalidArgumentError, InvalidOffsetError, InvalidRecordError,
                             SegstoreError)


def test_encode_batch_refuses_a_negative_base_offset():
    with pytest.raises(InvalidOffsetError, match="base_offset must be >= 0, got -1"):
        _core.encode_batch([b"v"], base_offset=-1)


def test_encode_batch_refuses_a_last_offset_past_int64():
    top = 2**63 - 1
    assert _core.scan_batches(_core.encode_batch([b"v"], base_offset=top)).batches[0][
        "last_offset"] == top
    with pytest.raises(InvalidOffsetError, match="overflows"):
        _core.encode_batch([b"v", b"w"], base_offset=top)


def test_encode_columns_checks_its_base_offset():
    col = BinaryColumn.from_pylist([b"a", b"b"])
    with pytest.raises(InvalidOffsetError, match="base_offset must be >= 0"):
        _core.encode_columns(col, base_offset=-5)
    with pytest.raises(InvalidOffsetError, match="overflows"):
        _core.encode_columns(col, base_offset=2**63 - 1)
    with pytest.raises(InvalidArgumentError, match="records_per_batch"):
        _core.encode_columns(col, records_per_batch=0)


@pytest.mark.parametrize("fn", [_core.murmur2, _core.murmur3_128,
                                lambda k: _core.murmur2_partition(k, 3)])
def test_a_null_key_has_no_hash(fn):
    # A typed memoryview takes None as an empty buffer: this hashed like b"".
    with pytest.raises(InvalidRecordError, match="null key"):
        fn(None)
    assert _core.murmur2(b"") == kafka_murmur2(b"")


def test_murmur2_partition_needs_partitions():
    with pytest.raises(InvalidArgumentError, match="num_partitions must be positive, got 0"):
        _core.murmur2_partition(b"k", 0)
    with pytest.raises(InvalidArgumentError):
        _core.murmur2_partitions(BinaryColumn.from_pylist([b"k"]), -1)


def test_scan_batches_refuses_a_negative_max_batches():
    buf = _core.encode_batch([b"a"]) + _core.encode_batch([b"b"], base_offset=1)
    assert len(_core.scan_batches(buf, max_batches=0).batches) == 0
    assert len(_core.scan_batches(buf, max_batches=1).batches) == 1
    with pytest.raises(InvalidArgumentError, match="max_batches must be >= 0"):
        _core.scan_batches(buf, max_batches=-1)


@pytest.mark.parametrize("start,end", [(-1, None), (0, 10**6), (5, 2)])
def test_a_byte_range_outside_the_buffer_is_typed(start, end):
    buf = _core.encode_batch([b"a"])
    for call in (_core.scan_batches, _core.decode_records, _core.decode_columns):
        with pytest.raises(InvalidArgumentError, match="outside the buffer"):
            call(buf, start, end)


def test_negative_max_records_is_typed():
    buf = _core.encode_batch([b"a"])
    for call in (_core.decode_records, _core.decode_columns):
        with pytest.raises(InvalidArgumentError, match="max_records must be >= 0"):
            call(buf, max_records=-1)


def test_errors_stay_value_errors():
    # Callers that caught ValueError before keep working.
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidArgumentError, SegstoreError)


def test_from_fixed_refuses_wider_ints():
    # astype(uint8) kept each value's low byte: 300 became 44.
    with pytest.raises(InvalidRecordError, match="int32"):
        BinaryColumn.from_fixed(np.array([[300, 1]], dtype=np.int32))
    with pytest.raises(InvalidRecordError, match="1-d S<n>"):
        BinaryColumn.from_fixed(np.array([[b"ab"], [b"cd"]], dtype="S2"))
    col = BinaryColumn.from_fixed(np.array([[1, 2], [3, 4]], dtype=np.uint8))
    assert col.to_pylist() == [b"\x01\x02", b"\x03\x04"]
    assert BinaryColumn.from_fixed(np.array([[-1]], dtype=np.int8)).to_pylist() == [b"\xff"]


def test_binary_column_indexing():
    col = BinaryColumn.from_pylist([b"a", None, b"ccc", b"dd"])
    assert col[0] == b"a" and col[1] is None and col[-1] == b"dd" and col[np.int64(2)] == b"ccc"
    with pytest.raises(IndexError, match="index 4 is outside the column of 4 values"):
        col[4]
    with pytest.raises(TypeError, match="ints or slices, not str"):
        col["a"]
    with pytest.raises(TypeError, match="not float"):
        col[1.0]
    assert list(col) == [b"a", None, b"ccc", b"dd"]


def test_binary_column_slices_share_data():
    col = BinaryColumn.from_pylist([b"a", None, b"ccc", b"dd"])
    part = col[1:3]
    assert isinstance(part, BinaryColumn) and part.to_pylist() == [None, b"ccc"]
    assert part.data is col.data
    assert col[3:1].to_pylist() == [] and col[:].to_pylist() == col.to_pylist()
    assert col[-2:].to_pylist() == [b"ccc", b"dd"]
    # A slice is a full column: it encodes and converts like any other.
    enc = _core.encode_columns(part, base_offset=7)
    rc = _core.decode_columns(enc.data)
    assert rc.values.to_pylist() == [None, b"ccc"] and rc.offsets.tolist() == [7, 8]
    pa = pytest.importorskip("pyarrow")
    assert part.to_arrow().to_pylist() == [None, b"ccc"]
    assert part.to_arrow(large=False).type == pa.binary()
    with pytest.raises(InvalidRecordError, match="step"):
        col[::2]
