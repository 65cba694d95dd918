"""A compacted topic refuses records without a key, as Kafka's broker does (LogValidator:
"Compacted topic cannot accept message without key"): the cleaner would delete them."""

import os

import pytest
from hypothesis import given, settings, strategies as st

import segstore
from segstore import _core
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError, InvalidRecordError

MESSAGE = "Compacted topic cannot accept message without key in topic partition t-0"


@pytest.fixture(params=["compact", "compact,delete"])
def log(request, tmp_path):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("t", config={"cleanup.policy": request.param})
        lg = store.partition("t", 0)
        lg.append(b"first", key=b"k")
        yield lg


def test_every_append_path_refuses_keyless_records_and_writes_nothing(log, tmp_path):
    with pytest.raises(InvalidRecordError, match=MESSAGE):
        log.append(b"v")
    with pytest.raises(InvalidRecordError, match=r"\(record 1\)"):
        log.append_batch([b"a", b"b", b"c"], keys=[b"k", None, b"k"])
    with pytest.raises(InvalidRecordError, match=MESSAGE):
        log.append_batch([b"a"])
    with pytest.raises(InvalidRecordError, match=r"\(record 2\)"):
        log.append_columns(BinaryColumn.from_pylist([b"a", b"b", b"c"]),
                           BinaryColumn.from_pylist([b"k", b"k", None]))
    with pytest.raises(InvalidRecordError, match=MESSAGE):
        log.append_columns(BinaryColumn.from_pylist([b"a"]))
    data = _core.encode_batch([b"a"], [b"k"]) + _core.encode_batch([b"b", b"c"], [b"k", None])
    with pytest.raises(InvalidRecordError, match=r"record 2 of the data given"):
        log.append_records(data)
    path = str(tmp_path / "staged")
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(InvalidRecordError, match=MESSAGE):
        log.adopt_segment_file(path)
    assert os.path.exists(path)  # not consumed
    assert log.log_end_offset == 1 and [r.value for r in log.iter_records()] == [b"first"]


def test_tombstones_and_keyed_records_are_taken(log):
    log.append(None, key=b"k")  # a tombstone has a key
    log.append_batch([b"a", None], keys=[b"x", b"y"])
    log.append_columns(BinaryColumn.from_pylist([b"a"]), BinaryColumn.from_pylist([b""]))
    log.append_records(_core.encode_batch([b"z"], [b"z"], compression="gzip"))
    assert log.log_end_offset == 6


def test_unvalidated_raw_appends_take_keyless_records_for_the_cleaner(log):
    """A follower's path (data copied from where the topic was not compacted): taken as is,
    and the cleaner removes the keyless records (counted as invalid)."""
    log.append_records(_core.encode_batch([b"a", b"b"], [None, b"k"]), origin="replication")
    assert [r.key for r in log.iter_records()] == [b"k", None, b"k"]


def test_a_delete_topic_takes_keyless_records(tmp_path):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("d")
        lg = store.partition("d", 0)
        lg.append(b"v")
        lg.append_columns(BinaryColumn.from_pylist([b"a"]))
        lg.append_records(_core.encode_batch([b"b"]))
        assert lg.log_end_offset == 3


def test_compressed_batches_are_looked_into(log):
    data = _core.encode_batch([b"a", b"b"], [b"k", None], compression="zstd")
    with pytest.raises(InvalidRecordError, match="record 1 of the data given"):
        log.append_records(data)


def test_control_batches_have_keys(log):
    marker = _core.encode_control_batch(1, producer_id=7, producer_epoch=0, timestamp_ms=5)
    assert _core.first_null_key(marker, _core.scan_batches(marker).batches) is None


keys_st = st.lists(st.one_of(st.none(), st.binary(max_size=200)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(keys_st, min_size=1, max_size=5),
       codec=st.sampled_from([0, "gzip", "lz4"]))
def test_first_null_key_matches_a_python_walk(batches, codec):
    data, nulls, seen = b"", [], 0
    for keys in batches:
        data += _core.encode_batch([b"v"] * len(keys), keys, compression=codec)
        nulls += [seen + i for i, k in enumerate(keys) if k is None]
        seen += len(keys)
    expected = nulls[0] if nulls else None
    assert _core.first_null_key(data, _core.scan_batches(data).batches) == expected


@settings(max_examples=200, deadline=None)
@given(keys=keys_st, cut=st.integers(min_value=0, max_value=400),
       flip=st.integers(min_value=0, max_value=255))
def test_damaged_records_raise_or_answer(keys, cut, flip):
    """Bytes inside a batch changed under its header (no CRC check here): an answer, or
    CorruptRecordError; never a crash or a read past the batch."""
    data = bytearray(_core.encode_batch([b"value"] * len(keys), keys))
    batches = _core.scan_batches(bytes(data)).batches
    pos = 61 + cut % max(len(data) - 61, 1)
    data[pos] ^= flip
    try:
        got = _core.first_null_key(bytes(data), batches)
    except CorruptRecordError:
        return
    assert got is None or 0 <= got < len(keys)
