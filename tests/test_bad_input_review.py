"""Bad input to the public API raises a typed segstore.errors exception naming what was wrong,
and never corrupts a store or loses flushed data (from a helper agent's review: offsets given as
floats or bools, non-integer timestamps, impossible partition counts)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import segstore
from segstore import TopicPartition
from segstore.columns import BinaryColumn
from segstore.errors import (InvalidArgumentError, InvalidConfigError, InvalidOffsetError, InvalidRecordError,
                             InvalidTopicError, OffsetOutOfRangeError, ReadOnlyStoreError,
                             SegstoreError, StoreClosedError, UnknownTopicOrPartitionError,
                             UnsupportedCompressionError)


@pytest.fixture
def store(tmp_path):
    s = segstore.open(str(tmp_path / "data"))
    s.create_topic("t", num_partitions=2)
    yield s
    try:
        s.close()
    except SegstoreError:
        pass


def three_batches(log):
    for v, ts in ((b"a", 1000), (b"b", 2000), (b"c", 3000)):
        log.append(v, key=v, timestamp_ms=ts)
    return log


# --- already handled well ----------------------------------------------------------

def test_ok_closed_store_and_log(store):
    log = store.partition("t", 0)
    store.close()
    with pytest.raises(StoreClosedError):
        store.append("t", b"x")
    with pytest.raises(StoreClosedError):
        log.read(0)


def test_ok_readonly_mutations(store, tmp_path):
    store.partition("t", 0).append(b"x")
    store.close()
    ro = segstore.open(str(tmp_path / "data"), readonly=True)
    with pytest.raises(ReadOnlyStoreError):
        ro.partition("t", 0).truncate_to(0)
    with pytest.raises(ReadOnlyStoreError):
        ro.create_topic("u")
    ro.close()


def test_ok_record_and_config_validation(store):
    log = store.partition("t", 0)
    with pytest.raises(InvalidRecordError, match="1 keys for 2 values"):
        log.append_batch([b"a", b"b"], keys=[b"k"])
    with pytest.raises(InvalidRecordError, match="value 0"):
        log.append(5)
    with pytest.raises(UnsupportedCompressionError):
        log.append_batch([b"a"], compression="bogus")
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        store.create_topic("u", config={"segment.bytes": "abc"})
    with pytest.raises(InvalidTopicError):
        store.create_topic("a/b")
    with pytest.raises(UnknownTopicOrPartitionError):
        store.partition("t", 9)


def test_ok_out_of_range_offsets(store):
    log = three_batches(store.partition("t", 0))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read_columns(2**64)
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(-1)
    with pytest.raises(InvalidOffsetError):
        log.offset_for_time(-5)  # -4 (earliest local) is the log start offset
    assert log.log_end_offset == 3


# --- destructive calls given non-int offsets (used to store them: data came back) ------------

@pytest.mark.parametrize("bad", [1.5, True])
def test_delete_records_non_int_rejected(store, bad):
    log = three_batches(store.partition("t", 0))
    # today: accepted; log_start_offset becomes 1.5 / True and read(log_start_offset) fails
    with pytest.raises(InvalidOffsetError):
        log.delete_records(bad)
    assert log.log_start_offset == 0 and type(log.log_start_offset) is int


def test_delete_records_float_does_not_undo_other_partitions(store, tmp_path):
    # today: the float is written to log-start-offset-checkpoint as "t 0 1.5"; on reopen the
    # whole checkpoint is ignored as malformed, so t-1's deleted records come back.
    for p in (0, 1):
        three_batches(store.partition("t", p))
    store.partition("t", 1).delete_records(2)
    try:
        store.partition("t", 0).delete_records(1.5)
    except SegstoreError:
        pass
    store.close()
    s = segstore.open(str(tmp_path / "data"))
    try:
        assert s.partition("t", 1).log_start_offset == 2
    finally:
        s.close()


@pytest.mark.parametrize("bad", [1.5, True, np.float64(2.0), "1"])
def test_truncate_to_non_int_rejected(store, bad):
    log = three_batches(store.partition("t", 0))
    with pytest.raises(InvalidOffsetError):
        log.truncate_to(bad)  # today: silently truncates (1.5 -> keeps 2, True -> keeps 1);
        #                       "1" -> TypeError "'<' not supported"
    assert log.log_end_offset == 3


# --- timestamps -------------------------------------------------------------------------------

def test_append_nan_timestamp(store):
    with pytest.raises(InvalidRecordError, match="timestamp"):  # today: ValueError from int()
        store.partition("t", 0).append(b"v", timestamp_ms=float("nan"))


def test_append_fractional_timestamp(store):
    # _core.encode_batch documents "a timestamp that is not an int raises InvalidRecordError";
    # today 1.5 is silently written as 1.
    with pytest.raises(InvalidRecordError, match="timestamp"):
        store.partition("t", 0).append(b"v", timestamp_ms=1.5)


def test_append_batch_uint64_timestamp_wraps(store):
    log = store.partition("t", 0)
    with pytest.raises(InvalidRecordError, match="timestamp"):  # today: stored as -2**63
        log.append_batch([b"a"], timestamps_ms=np.array([2**63], dtype=np.uint64))


@pytest.mark.parametrize("ts", [np.array([np.nan]), np.array([2**63], dtype=np.uint64), "5",
                                np.array([1.5])])
def test_append_columns_bad_timestamps(store, ts):
    log = store.partition("t", 0)
    with pytest.raises(InvalidRecordError, match="timestamp"):  # today: silently written
        log.append_columns(BinaryColumn.from_pylist([b"a"]), timestamps_ms=ts)
    assert log.log_end_offset == 0


def test_append_columns_nan_scalar_timestamp(store):
    with pytest.raises(InvalidRecordError, match="timestamp"):  # today: bare ValueError
        store.partition("t", 0).append_columns(BinaryColumn.from_pylist([b"a"]),
                                               timestamps_ms=float("nan"))


def test_offset_for_time_nan_and_str(store):
    log = three_batches(store.partition("t", 0))
    with pytest.raises(InvalidOffsetError):  # used to return None
        log.offset_for_time(float("nan"))
    with pytest.raises(InvalidOffsetError):  # used to be a bare TypeError
        log.offset_for_time("1000")


# --- create_topic with an impossible partition count ---------------------------------------------

def test_create_topic_huge_partition_count_is_rejected_atomically(tmp_path):
    # There was no upper bound: it created partitions until EMFILE, left topic "big" registered
    # with 2**40 partitions (partitions_for -> MemoryError) and the store could not be reopened.
    # Run in a child with a small fd limit so the exhaustion stays out of this process.
    d = str(tmp_path / "data")
    child = textwrap.dedent(f"""
        import resource, segstore
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        s = segstore.open({d!r}); s.create_topic("t"); s.partition("t", 0).append(b"keep")
        try:
            s.create_topic("big", num_partitions=2**40)
        except BaseException as e:
            print(type(e).__name__)
        try:
            s.close()
        except BaseException as e:
            print("close", type(e).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["InvalidTopicError"], out.stdout + out.stderr
    s = segstore.open(d)
    try:
        assert s.list_topics() == ["t"]
        assert [r.value for r in s.partition("t", 0).read(0)] == [b"keep"]
    finally:
        s.close()


def test_header_keys_as_bytes_are_appended_and_reported(store):
    """The encoder takes UTF-8 bytes header keys; append used to write the record and then
    fail on the metadata's header size."""
    log = store.partition("t", 0)
    md = log.append(b"v", headers=[(b"k", b"vv")])
    assert md.offset == 0 and md.serialized_header_size == 3
    assert list(log.read(0)[0].headers) == [("k", b"vv")]


@pytest.mark.parametrize("limit, partitions, limit_after_open", [
    (128, 1000, False),
    # Limits set after the open, when the process holds the store's descriptors: every
    # partition's close needed a descriptor of its own and failed, none released theirs, the
    # rmtree of their directories failed silently and the next open made them a topic again.
    # Which limits hit that depends on the descriptors the process holds, hence three in a row.
    (100, 100_000, True), (101, 100_000, True), (102, 100_000, True)])
def test_create_topic_that_runs_out_of_descriptors_leaves_nothing(tmp_path, limit, partitions,
                                                                  limit_after_open):
    """A create_topic that fails half way (here: out of file descriptors) removes the
    partitions it made and its metadata; the store reopens without the topic."""
    d = str(tmp_path / "data")
    set_limit = f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))"
    child = textwrap.dedent(f"""
        import resource, segstore
        {"" if limit_after_open else set_limit}
        s = segstore.open({d!r}); s.create_topic("t"); s.partition("t", 0).append(b"keep")
        {set_limit if limit_after_open else ""}
        try:
            s.create_topic("big", num_partitions={partitions})
        except OSError as e:
            print("OSError", e.errno)
        print(sorted(s.list_topics()))
        s.close()
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split("\n")[:2] == ["OSError 24", "['t']"], out.stdout + out.stderr
    if limit_after_open:
        assert sorted(os.listdir(d)) == [".kafka_cleanshutdown", ".lock", ".segstore",
                                         "log-start-offset-checkpoint",
                                         "recovery-point-offset-checkpoint", "t-0"]
    s = segstore.open(d)
    try:
        assert s.list_topics() == ["t"]
        assert not [n for n in os.listdir(d) if n.startswith("big")]
        assert [r.value for r in s.partition("t", 0).read(0)] == [b"keep"]
    finally:
        s.close()


def test_wrong_type_offsets_are_typed_and_still_type_errors(store):
    """A non-int read offset raises OffsetTypeError: a segstore error and a TypeError."""
    from segstore.errors import OffsetTypeError

    log = three_batches(store.partition("t", 0))
    for bad in ("0", 1.0, None, True):
        with pytest.raises(OffsetTypeError) as info:
            log.read(bad)
        assert isinstance(info.value, TypeError) and isinstance(info.value, InvalidOffsetError)
    with pytest.raises(OffsetTypeError):
        log.truncate_to("1")
    assert log.log_end_offset == 3


def test_partition_numbers_may_be_numpy_ints(store):
    assert store.partition("t", np.int64(1)) is store.partition("t", 1)
    with pytest.raises(TypeError):
        store.partition("t", "0")


def test_store_append_rejects_a_key_of_the_wrong_type(store):
    with pytest.raises(InvalidRecordError, match="key"):
        store.append("t", b"v", key=5)
    assert store.end_offsets([TopicPartition("t", p) for p in (0, 1)]) == {
        TopicPartition("t", 0): 0, TopicPartition("t", 1): 0}


@pytest.mark.parametrize("kw", [{"producer_id": 2**64}, {"producer_id": "x"},
                                {"producer_epoch": 1 << 15}, {"base_sequence": 2**40}])
def test_producer_fields_out_of_range_name_the_field(store, kw):
    log = store.partition("t", 0)
    with pytest.raises(InvalidRecordError, match=next(iter(kw))):
        log.append_batch([b"v"], **kw)
    assert log.log_end_offset == 0


@pytest.mark.parametrize("rpb", [0, -1, 1.5, 2**64, "1", True])
def test_append_columns_records_per_batch_must_be_a_positive_int(store, rpb):
    log = store.partition("t", 0)
    with pytest.raises(InvalidRecordError, match="records_per_batch"):
        log.append_columns(BinaryColumn.from_pylist([b"a", b"b"]), records_per_batch=rpb)
    assert log.log_end_offset == 0


def test_alter_topic_config_arguments_must_be_a_mapping_and_a_list(store):
    with pytest.raises(InvalidConfigError, match="mapping"):
        store.alter_topic_config("t", "x")
    with pytest.raises(InvalidConfigError, match="list"):
        store.alter_topic_config("t", delete="segment.bytes")
    assert store.topic_config("t").overrides == {}


@pytest.mark.parametrize("kw", [{"max_records": -1}, {"max_records": "2"}, {"max_records": 2**64},
                                {"max_bytes": None}, {"max_bytes": "x"}, {"max_bytes": -5}])
def test_read_limits_are_checked(store, kw):
    log = three_batches(store.partition("t", 0))
    # A limit of the wrong type is an OffsetTypeError, one out of range InvalidArgumentError.
    with pytest.raises((InvalidOffsetError, InvalidArgumentError), match=next(iter(kw))):
        log.read(0, **kw)
    assert [r.value for r in log.read(0, max_records=2)] == [b"a", b"b"]


def test_offsets_for_times_needs_a_mapping(store):
    with pytest.raises(TypeError, match="mapping"):
        store.offsets_for_times([TopicPartition("t", 0)])


def test_from_pylist_refuses_a_lone_string():
    for one in ("ab", b"ab"):
        with pytest.raises(InvalidRecordError, match="list"):
            BinaryColumn.from_pylist(one)
    assert BinaryColumn.from_pylist(["ab"]).to_pylist() == [b"ab"]


def test_end_offsets_must_be_ints(store):
    log = three_batches(store.partition("t", 0))
    with pytest.raises(TypeError, match="end_offset"):
        log.read_columns(0, 2.5)
    with pytest.raises(TypeError, match="end_offset"):
        list(log.iter_records(0, 1.5))
    assert [r.offset for r in log.iter_records(0, np.int64(2))] == [0, 1]


def test_open_checks_its_arguments(tmp_path):
    a_file = tmp_path / "plain-file"
    a_file.write_bytes(b"x")
    for kw in ({"path": 5}, {"path": str(tmp_path / "d"), "clock": 5}, {"path": str(a_file)}):
        with pytest.raises(InvalidConfigError):
            segstore.open(**kw)
    assert not (tmp_path / "d").exists()


def test_topic_and_partition_arguments_are_checked(store):
    for call in (lambda: store.delete_topic(5), lambda: store.topic_config(None),
                 lambda: store.beginning_offsets("t"), lambda: store.end_offsets(None),
                 lambda: store.end_offsets([("t", 0, 1)])):
        with pytest.raises(InvalidTopicError):
            call()
    assert store.beginning_offsets([("t", 1)]) == {TopicPartition("t", 1): 0}
    assert store.list_topics() == ["t"]
