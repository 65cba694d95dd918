"""A sweep of bad arguments through the public API (docs/getting-started.md, "Errors"): every
error segstore raises on purpose is a SegstoreError naming what was wrong, and a bad argument
changes nothing - no file changed, no data lost, the store still opens and reads the same.

Each case runs against a copy of one small store (two topics, a compacted one, two segments in
``t-0``, headers, a transaction) and checks three things: the exception is the segstore error
the table names (or the call succeeds, for arguments that are valid, such as numpy ints); the
logs' in-process state (segments, log start and end offsets) is what it was; and after a close
every file of the store (names, sizes and bytes, the ``.lock`` file aside) is what a clean close
without the call leaves, and a reopen reads the same records. Calls that need no store (the
codec functions, columns, compression) only check the exception.

Findings of this sweep (all fixed) are noted at their cases; the create_topic descriptor case is
in test_bad_input_review.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time

import numpy as np
import pytest

import segstore
from segstore import _core, buffer_pool, compression
from segstore.columns import BinaryColumn
from segstore.errors import (BufferTypeError, CorruptRecordError, InvalidArgumentError, InvalidConfigError,
                             InvalidOffsetError, InvalidRecordError, InvalidTopicError,
                             OffsetOutOfRangeError, OffsetTypeError, RecordTooLargeError,
                             SegstoreError, UnknownTopicOrPartitionError,
                             UnsupportedCompressionError)
from segstore.records import ControlRecordType, TopicPartition

CLOCK_MS = 1_000_000
NUMPY_INT = np.int64(1)


# --- the store every case starts from ---------------------------------------------------------

def _build(root: str) -> None:
    s = segstore.open(root, clock=lambda: CLOCK_MS)
    s.create_topic("t", 2)
    s.create_topic("c", 1, config={"cleanup.policy": "compact"})
    lg = s.partition("t", 0)
    for i in range(5):
        lg.append(b"v%d" % i, key=b"k%d" % i, timestamp_ms=1000 + i, headers=[("h", b"x")])
    lg.roll()
    for i in range(5, 8):
        lg.append(b"v%d" % i, key=b"k%d" % i, timestamp_ms=1000 + i)
    lg.append_batch([b"tx"], [b"tk"], producer_id=7, producer_epoch=0, base_sequence=0,
                    is_transactional=True, timestamps_ms=1010)
    lg.append_control(ControlRecordType.COMMIT, producer_id=7, producer_epoch=0)
    s.partition("t", 1).append(b"p1", key=b"k", timestamp_ms=2000)
    s.partition("c", 0).append(b"cv", key=b"ck", timestamp_ms=5)
    s.close()


def _files(root: str) -> dict:
    """Every file of the store but the lock: relative path -> sha1 of its bytes."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if rel != ".lock":
                with open(p, "rb") as f:
                    out[rel] = hashlib.sha1(f.read()).hexdigest()
    return out


def _contents(store) -> dict:
    """What a reader sees: topics, configs, offsets and every record of every partition."""
    out = {}
    for t in store.list_topics():
        out[t] = dict(store.topic_config(t).overrides)
        for p in store.partitions_for(t):
            lg = store.partition(t, p)
            recs = lg.read(lg.log_start_offset, max_bytes=1 << 30) \
                if lg.log_end_offset > lg.log_start_offset else []
            out[(t, p)] = (lg.log_start_offset, lg.log_end_offset, lg.last_stable_offset,
                           [(r.offset, r.key, r.value, r.timestamp, tuple(r.headers))
                            for r in recs])
    return out


def _live_state(store) -> dict:
    """The logs' in-process state: segments (base, suffix, size), start and end offsets."""
    return {tp: ([(s.base_offset, s.suffix, s.size) for s in lg.segments],
                 lg.log_start_offset, lg.log_end_offset)
            for tp, lg in sorted(store._logs.items())}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The template store, and what a plain open + close of it leaves (files, contents)."""
    base = tmp_path_factory.mktemp("sweep")
    root = str(base / "template")
    _build(root)
    ref = str(base / "reference")
    shutil.copytree(root, ref)
    s = segstore.open(ref, clock=lambda: CLOCK_MS)
    s.close()
    files = _files(ref)
    s = segstore.open(ref, clock=lambda: CLOCK_MS)
    contents = _contents(s)
    s.close()
    return root, files, contents


@pytest.fixture
def fresh(template, tmp_path):
    """The path of a fresh copy of the template store."""
    root, _, _ = template
    d = str(tmp_path / "store")
    shutil.copytree(root, d)
    return d


def check_refused(template, d, call, expected):
    """Run ``call(store)`` on the store at ``d``: it must raise ``expected`` (a SegstoreError)
    and change nothing, in process, on disk, or as a reopen reads it."""
    assert issubclass(expected, SegstoreError)
    _, files, contents = template
    s = segstore.open(d, clock=lambda: CLOCK_MS)
    try:
        live = _live_state(s)
        with pytest.raises(SegstoreError) as info:
            call(s)
        assert isinstance(info.value, expected), repr(info.value)
        assert _live_state(s) == live, "the call changed the logs before failing"
        assert _contents(s) == contents
    finally:
        s.close()
    assert _files(d) == files, "the call changed the store's files"
    s = segstore.open(d, clock=lambda: CLOCK_MS)
    try:
        assert _contents(s) == contents
    finally:
        s.close()


# --- helpers for the tables -------------------------------------------------------------------

def T0(s):
    return s.partition("t", 0)


def C0(s):
    return s.partition("c", 0)


def case(call, expected, id, *marks):
    return pytest.param(call, expected, id=id, marks=marks)


def _other_logs_segment(s):
    return C0(s).segments[:1]


def _segment_then_junk(s):
    return [T0(s).segments[0], "not a segment"]


def _stage(s, name="staged.bin"):
    """A file of one valid batch in the store root (not a partition directory)."""
    p = os.path.join(s.path, name)
    with open(p, "wb") as f:
        f.write(_core.encode_batch([b"a"], [b"k"], timestamps_ms=1))
    return p


def _adopt_and_keep(s, paths):
    try:
        return T0(s).adopt_segment_files(paths)
    finally:
        staged = os.path.join(s.path, "staged.bin")
        if os.path.exists(staged):
            os.unlink(staged)  # the template has no such file


LOG_CASES = [
    # delete_segments: segments of another log were renamed .deleted (c-0 lost its data); a
    # stray object after a segment failed after renaming that segment (the log still listed
    # it); a float new_log_start became the log start offset (6.5, written to the checkpoint
    # as "t 0 6.5", which the next open ignored), a str one failed after the renames.
    case(lambda s: T0(s).delete_segments(_other_logs_segment(s)), InvalidArgumentError,
         "delete_segments-other-logs-segment"),
    case(lambda s: T0(s).delete_segments(_segment_then_junk(s)), InvalidArgumentError,
         "delete_segments-segment-then-junk"),
    case(lambda s: T0(s).delete_segments(T0(s).segments[:1], 6.5), OffsetTypeError,
         "delete_segments-float-new_log_start"),
    case(lambda s: T0(s).delete_segments(T0(s).segments[:1], "5"), OffsetTypeError,
         "delete_segments-str-new_log_start"),
    case(lambda s: T0(s).delete_segments(T0(s).segments[:1], True), OffsetTypeError,
         "delete_segments-bool-new_log_start"),
    case(lambda s: T0(s).delete_segments(1.5), InvalidArgumentError, "delete_segments-float"),
    case(lambda s: T0(s).delete_segments(None), InvalidArgumentError, "delete_segments-None"),
    case(lambda s: T0(s).delete_segments("0"), InvalidArgumentError, "delete_segments-str"),
    # replace_segments (the cleaner's swap): anything but .cleaned LogSegments of this log
    # raised AttributeError/TypeError, or ValueError from a rename.
    case(lambda s: T0(s).replace_segments(1.5, 1.5), InvalidArgumentError,
         "replace_segments-float"),
    case(lambda s: T0(s).replace_segments(["x"], T0(s).segments[:1]), InvalidArgumentError,
         "replace_segments-str-segment"),
    case(lambda s: T0(s).replace_segments(T0(s).segments[1:], T0(s).segments[:1]),
         InvalidArgumentError, "replace_segments-segment-not-cleaned"),
    case(lambda s: T0(s).replace_segments([], ["x"]), InvalidArgumentError,
         "replace_segments-str-old-segment"),
    # adopt_segment_files: [] raised IndexError, a lone path was iterated character by
    # character (IsADirectoryError for "/"), non-paths raised TypeError/ValueError, the same
    # file twice FileNotFoundError half way, and a segment file of the store itself was
    # adopted: renamed into the log with its base offsets rewritten (that segment's records
    # lost from its own log).
    case(lambda s: T0(s).adopt_segment_files([]), InvalidArgumentError, "adopt-no-files"),
    case(lambda s: _adopt_and_keep(s, _stage(s)), InvalidArgumentError, "adopt-lone-path"),
    case(lambda s: T0(s).adopt_segment_files([1.5]), InvalidArgumentError, "adopt-float-path"),
    case(lambda s: T0(s).adopt_segment_files([None]), InvalidArgumentError, "adopt-None-path"),
    case(lambda s: T0(s).adopt_segment_files(NUMPY_INT), InvalidArgumentError,
         "adopt-numpy-int"),
    case(lambda s: T0(s).adopt_segment_file(3), InvalidArgumentError, "adopt-int-path"),
    case(lambda s: _adopt_and_keep(s, [_stage(s), os.path.join(s.path, "staged.bin")]),
         InvalidArgumentError, "adopt-same-file-twice"),
    case(lambda s: _adopt_and_keep(s, [_stage(s), os.path.join(s.path, ".", "staged.bin")]),
         InvalidArgumentError, "adopt-same-file-twice-other-spelling"),
    case(lambda s: T0(s).adopt_segment_file(T0(s).segments[0].log_path), InvalidArgumentError,
         "adopt-own-sealed-segment"),
    case(lambda s: T0(s).adopt_segment_file(T0(s).segments[-1].log_path), InvalidArgumentError,
         "adopt-own-active-segment"),
    case(lambda s: T0(s).adopt_segment_file(C0(s).segments[0].log_path), InvalidArgumentError,
         "adopt-other-logs-segment"),
    case(lambda s: T0(s).adopt_segment_file(T0(s).segments[0].offset_index.path),
         InvalidArgumentError, "adopt-own-index-file"),
    # append_records: data that is not bytes-like raised TypeError/ValueError/OverflowError;
    # an int n allocated n zero bytes (2**62: MemoryError).
    case(lambda s: T0(s).append_records(1.5), InvalidRecordError, "append_records-float"),
    case(lambda s: T0(s).append_records(None), InvalidRecordError, "append_records-None"),
    case(lambda s: T0(s).append_records("abc"), InvalidRecordError, "append_records-str"),
    case(lambda s: T0(s).append_records(-1), InvalidRecordError, "append_records-negative-int"),
    case(lambda s: T0(s).append_records(2 ** 62), InvalidRecordError, "append_records-huge-int"),
    case(lambda s: T0(s).append_records(2 ** 64), InvalidRecordError, "append_records-2**64"),
    case(lambda s: T0(s).append_records([0] * 80), InvalidRecordError,
         "append_records-list-of-ints"),
    # read_columns' max_records: 1.5, True and numpy floats were truncated, "1" / b"1" / [1]
    # raised TypeError, 2**63 OverflowError, NaN ValueError.
    case(lambda s: T0(s).read_columns(0, max_records=1.5), OffsetTypeError,
         "read_columns-max_records-float"),
    case(lambda s: T0(s).read_columns(0, max_records=True), OffsetTypeError,
         "read_columns-max_records-bool"),
    case(lambda s: T0(s).read_columns(0, max_records=np.float64(1)), OffsetTypeError,
         "read_columns-max_records-numpy-float"),
    case(lambda s: T0(s).read_columns(0, max_records="1"), OffsetTypeError,
         "read_columns-max_records-str"),
    case(lambda s: T0(s).read_columns(0, max_records=[1]), OffsetTypeError,
         "read_columns-max_records-list"),
    case(lambda s: T0(s).read_columns(0, max_records=float("nan")), OffsetTypeError,
         "read_columns-max_records-nan"),
    case(lambda s: T0(s).read_columns(0, max_records=2 ** 63), InvalidArgumentError,
         "read_columns-max_records-2**63"),
    case(lambda s: T0(s).read_columns(0, max_records=2 ** 64), InvalidArgumentError,
         "read_columns-max_records-2**64"),
    case(lambda s: T0(s).read_columns(0, max_records=-1), InvalidArgumentError,
         "read_columns-max_records-negative"),
    # iter_records' start_offset: a str, bytes or list raised TypeError from a comparison,
    # NaN read nothing.
    case(lambda s: list(T0(s).iter_records("1")), OffsetTypeError, "iter_records-str-start"),
    case(lambda s: list(T0(s).iter_records(b"1")), OffsetTypeError, "iter_records-bytes-start"),
    case(lambda s: list(T0(s).iter_records([1])), OffsetTypeError, "iter_records-list-start"),
    case(lambda s: list(T0(s).iter_records(float("nan"))), OffsetTypeError,
         "iter_records-nan-start"),
    # append_batch on a compacted topic: keys that are not a sequence raised TypeError from
    # the null-key check ("argument of type 'float' is not iterable", "'in <string>'
    # requires string as left operand").
    case(lambda s: C0(s).append_batch([b"a"], 1.5), InvalidRecordError,
         "compacted-append_batch-float-keys"),
    case(lambda s: C0(s).append_batch([b"a"], True), InvalidRecordError,
         "compacted-append_batch-bool-keys"),
    case(lambda s: C0(s).append_batch([b"a"], "k"), InvalidRecordError,
         "compacted-append_batch-str-keys"),
    case(lambda s: C0(s).append_batch([b"a"], b"k"), InvalidRecordError,
         "compacted-append_batch-bytes-keys"),
    case(lambda s: C0(s).append_batch([b"a", b"b"], (k for k in [b"k", None])),
         InvalidRecordError, "compacted-append_batch-generator-keys-with-a-null"),
    # headers that are not a list of (key, value) pairs raised TypeError ("'float' object is
    # not iterable", "object of type 'generator' has no len()"); a header key or value, or a
    # key or value, with a lone surrogate raised UnicodeEncodeError.
    case(lambda s: T0(s).append(b"x", headers=1.5), InvalidRecordError, "append-float-headers"),
    case(lambda s: T0(s).append(b"x", headers=7), InvalidRecordError, "append-int-headers"),
    case(lambda s: T0(s).append_batch([b"x"], None, 1.5), InvalidRecordError,
         "append_batch-float-headers"),
    case(lambda s: T0(s).append_batch([b"x"], None, b"1"), InvalidRecordError,
         "append_batch-bytes-headers"),
    case(lambda s: T0(s).append_batch([b"x"], None, [5]), InvalidRecordError,
         "append_batch-headers-of-an-int"),
    case(lambda s: T0(s).append(b"x", headers=[("k\udc80", b"")]), InvalidRecordError,
         "append-surrogate-header-key"),
    case(lambda s: T0(s).append(b"x", headers=[("k", "v\udc80")]), InvalidRecordError,
         "append-surrogate-header-value"),
    case(lambda s: T0(s).append("v\udc80"), InvalidRecordError, "append-surrogate-value"),
    case(lambda s: T0(s).append(b"x", key="k\udc80"), InvalidRecordError,
         "append-surrogate-key"),
    # a lone str of values or keys became one record per character ("abc": three records),
    # bytes timestamps one timestamp per byte.
    case(lambda s: T0(s).append_batch("abc"), InvalidRecordError, "append_batch-str-values"),
    case(lambda s: T0(s).append_batch([b"a", b"b"], "ab"), InvalidRecordError,
         "append_batch-str-keys"),
    case(lambda s: T0(s).append_batch(b"ab"), InvalidRecordError, "append_batch-bytes-values"),
    case(lambda s: T0(s).append_batch([b"a"], timestamps_ms=b"\x01"), InvalidRecordError,
         "append_batch-bytes-timestamps"),
    case(lambda s: T0(s).append_batch([b"a"], timestamps_ms="1"), InvalidRecordError,
         "append_batch-str-timestamps"),
    case(lambda s: T0(s).append_batch([b"a"], timestamps_ms=np.array([[1]])),
         InvalidRecordError, "append_batch-2d-timestamps"),
    case(lambda s: T0(s).append_batch([b"a"], timestamps_ms=np.array(1)), InvalidRecordError,
         "append_batch-0d-array-timestamp"),
    case(lambda s: T0(s).append_batch([b"a"], timestamps_ms=np.array([1.0])),
         InvalidRecordError, "append_batch-float-array-timestamps"),
    # is_transactional: any truthy value ("false", 1.5, [1]) wrote a transactional batch,
    # which opened a transaction (the last stable offset stopped there).
    case(lambda s: T0(s).append_batch([b"a"], producer_id=9, producer_epoch=0, base_sequence=0,
                                      is_transactional="false"),
         InvalidRecordError, "append_batch-str-is_transactional"),
    case(lambda s: T0(s).append_batch([b"a"], producer_id=9, producer_epoch=0, base_sequence=0,
                                      is_transactional=1.5),
         InvalidRecordError, "append_batch-float-is_transactional"),
    case(lambda s: T0(s).append_batch([b"a"], producer_id=9, producer_epoch=0, base_sequence=0,
                                      is_transactional=None),
         InvalidRecordError, "append_batch-None-is_transactional"),
    # append_columns: more keys than values were cut to the values' length (a key column of
    # 3 for 2 values appended 2 records); columns with non-contiguous or 2-d arrays raised
    # ValueError from the encoder.
    case(lambda s: T0(s).append_columns(BinaryColumn.from_pylist([b"a", b"b"]),
                                        BinaryColumn.from_pylist([b"a", b"b", b"c"])),
         InvalidRecordError, "append_columns-more-keys-than-values"),
    case(lambda s: T0(s).append_columns(BinaryColumn.from_pylist([b"a", b"b"]),
                                        BinaryColumn.from_pylist([b"a"])),
         InvalidRecordError, "append_columns-fewer-keys-than-values"),
    case(lambda s: T0(s).append_columns(BinaryColumn(np.frombuffer(b"abcd", np.uint8)[::2],
                                                     np.array([0, 1, 2]), np.ones(2, bool))),
         InvalidRecordError, "append_columns-non-contiguous-data"),
    case(lambda s: T0(s).append_columns(BinaryColumn(np.frombuffer(b"ab", np.uint8),
                                                     np.array([0, 9, 1, 9, 2])[::2],
                                                     np.ones(2, bool))),
         InvalidRecordError, "append_columns-non-contiguous-offsets"),
    case(lambda s: T0(s).append_columns(BinaryColumn(np.frombuffer(b"ab", np.uint8),
                                                     np.array([0, 1, 2]),
                                                     np.ones((2, 1), bool))),
         InvalidRecordError, "append_columns-2d-valid"),
    case(lambda s: T0(s).append_columns(BinaryColumn.from_pylist([b"a"]), None,
                                        np.array([[1]])),
         InvalidRecordError, "append_columns-2d-timestamps"),
    # writes Kafka refuses (already typed; swept for the no-change half of the promise)
    case(lambda s: T0(s).append(b"x" * 2_000_000), RecordTooLargeError,
         "append-over-max.message.bytes"),
    case(lambda s: T0(s).append_columns(BinaryColumn.from_pylist([b"x", b"y" * 2_000_000])),
         RecordTooLargeError, "append_columns-over-max.message.bytes"),
    case(lambda s: T0(s).append_records(_core.encode_batch([b"x" * 2_000_000])),
         RecordTooLargeError, "append_records-over-max.message.bytes"),
    case(lambda s: C0(s).append(b"x"), InvalidRecordError, "compacted-append-without-key"),
    case(lambda s: C0(s).append_columns(BinaryColumn.from_pylist([b"x"])), InvalidRecordError,
         "compacted-append_columns-without-keys"),
    case(lambda s: C0(s).append_records(_core.encode_batch([b"x"], [None])),
         InvalidRecordError, "compacted-append_records-null-key"),
    case(lambda s: T0(s).append(b"x", headers=[(1, b"v")]), InvalidRecordError,
         "append-int-header-key"),
    case(lambda s: T0(s).append_batch([b"a"], compression="brotli"),
         UnsupportedCompressionError, "append_batch-unknown-codec"),
    case(lambda s: T0(s).append_batch([b"a"], compression=True), UnsupportedCompressionError,
         "append_batch-bool-codec"),
    case(lambda s: T0(s).append_batch([b"a"], producer_id=1, producer_epoch=1.5,
                                      base_sequence=0), InvalidRecordError,
         "append_batch-float-epoch"),
    case(lambda s: T0(s).append_control(1.5, producer_id=1, producer_epoch=0),
         InvalidRecordError, "append_control-float-type"),
    case(lambda s: T0(s).append_records(b"", origin=1.5), InvalidRecordError,
         "append_records-float-origin"),
    case(lambda s: T0(s).flush(1.5), OffsetTypeError, "flush-float"),
    case(lambda s: T0(s).maybe_flush(1.5), InvalidArgumentError, "maybe_flush-float"),
    case(lambda s: T0(s).remove_expired_producers("1"), InvalidArgumentError,
         "remove_expired_producers-str"),
    case(lambda s: T0(s).truncate_to(-1), InvalidOffsetError, "truncate_to-negative"),
    case(lambda s: T0(s).truncate_fully_and_start_at(2 ** 64), InvalidOffsetError,
         "truncate_fully_and_start_at-2**64"),
    case(lambda s: T0(s).delete_records(2 ** 63), OffsetOutOfRangeError,
         "delete_records-2**63"),
    case(lambda s: T0(s).offset_for_time([1]), OffsetTypeError, "offset_for_time-list"),
    case(lambda s: T0(s).read(0, isolation_level=None), InvalidArgumentError,
         "read-None-isolation_level"),
]


@pytest.mark.parametrize("call, expected", LOG_CASES)
def test_log_refuses(template, fresh, call, expected):
    check_refused(template, fresh, call, expected)


STORE_CASES = [
    # compact(partition=...): a bool or float partition was taken as an int (False and 0.0
    # compacted partition 0), a list or array raised TypeError (unhashable).
    case(lambda s: s.compact("c", False, force=True), OffsetTypeError, "compact-bool-partition"),
    case(lambda s: s.compact("c", 0.0, force=True), OffsetTypeError, "compact-float-partition"),
    case(lambda s: s.compact("c", [0], force=True), OffsetTypeError, "compact-list-partition"),
    case(lambda s: s.compact("c", np.array([0]), force=True), OffsetTypeError,
         "compact-array-partition"),
    case(lambda s: s.compact("c", 5, force=True), UnknownTopicOrPartitionError,
         "compact-unknown-partition"),
    case(lambda s: s.compact(1.5), InvalidTopicError, "compact-float-topic"),
    case(lambda s: s.compact("t"), InvalidTopicError, "compact-not-compacted"),
    # alter_topic_config(delete=...): None, a float or an int raised TypeError, bytes were
    # taken as a list of ints (InvalidConfigError "names must be strings, got 114").
    case(lambda s: s.alter_topic_config("t", delete=1.5), InvalidConfigError,
         "alter_topic_config-float-delete"),
    case(lambda s: s.alter_topic_config("t", delete=7), InvalidConfigError,
         "alter_topic_config-int-delete"),
    case(lambda s: s.alter_topic_config("t", delete=None), InvalidConfigError,
         "alter_topic_config-None-delete"),
    case(lambda s: s.alter_topic_config("t", delete=b"retention.ms"), InvalidConfigError,
         "alter_topic_config-bytes-delete"),
    case(lambda s: s.alter_topic_config("t", delete=[1]), InvalidConfigError,
         "alter_topic_config-int-key-deleted"),
    case(lambda s: s.alter_topic_config("t", {"retention.ms": 1.5}), InvalidConfigError,
         "alter_topic_config-float-retention"),
    case(lambda s: s.alter_topic_config("t", {"segment.bytes": 2 ** 64}), InvalidConfigError,
         "alter_topic_config-segment.bytes-2**64"),
    case(lambda s: s.alter_topic_config("t", {"min.cleanable.dirty.ratio": float("nan")}),
         InvalidConfigError, "alter_topic_config-nan-ratio"),
    case(lambda s: s.alter_topic_config("t", {"cleanup.policy": ["compact", 1]}),
         InvalidConfigError, "alter_topic_config-policy-list-with-an-int"),
    case(lambda s: s.alter_topic_config("t", {"preallocate": 1}), InvalidConfigError,
         "alter_topic_config-int-boolean"),
    case(lambda s: s.create_topic("n", config={"retention.ms": "1e3"}), InvalidConfigError,
         "create_topic-config-1e3"),
    case(lambda s: s.create_topic("n", config=[("retention.ms", 1)]), InvalidConfigError,
         "create_topic-config-list"),
    case(lambda s: s.create_topic("n", 1.5), InvalidTopicError, "create_topic-float-count"),
    case(lambda s: s.create_topic("n", 2 ** 31), InvalidTopicError, "create_topic-2**31"),
    case(lambda s: s.create_topic(b"n"), InvalidTopicError, "create_topic-bytes-name"),
    case(lambda s: s.create_topic("a/b"), InvalidTopicError, "create_topic-slash"),
    case(lambda s: s.create_topic("t"), SegstoreError, "create_topic-existing"),
    # offsets_for_times: keys that are not (topic, partition) pairs raised TypeError
    # ("TopicPartition() argument after * must be an iterable", "unhashable type").
    case(lambda s: s.offsets_for_times({1.5: 0}), InvalidTopicError,
         "offsets_for_times-float-key"),
    case(lambda s: s.offsets_for_times({"t": 0}), InvalidTopicError,
         "offsets_for_times-str-key"),
    case(lambda s: s.offsets_for_times({None: 0}), InvalidTopicError,
         "offsets_for_times-None-key"),
    case(lambda s: s.offsets_for_times({("t", 0, 1): 0}), InvalidTopicError,
         "offsets_for_times-triple-key"),
    case(lambda s: s.offsets_for_times({("t", 1.5): 0}), OffsetTypeError,
         "offsets_for_times-float-partition"),
    case(lambda s: s.offsets_for_times({("t", 0): 1.5}), OffsetTypeError,
         "offsets_for_times-float-timestamp"),
    # partition_for / append(key=...): a numpy scalar or an int array as the key raised
    # ValueError from the hash's buffer conversion, a str with a lone surrogate
    # UnicodeEncodeError.
    case(lambda s: s.partition_for("t", np.int64(1)), InvalidRecordError,
         "partition_for-numpy-int-key"),
    case(lambda s: s.partition_for("t", np.array([1, 2])), InvalidRecordError,
         "partition_for-int-array-key"),
    case(lambda s: s.append("t", b"v", key=np.float64(1)), InvalidRecordError,
         "append-numpy-float-key"),
    case(lambda s: s.partition_for("t", 1.5), InvalidRecordError, "partition_for-float-key"),
    case(lambda s: s.partition_for("t", "k\udc80"), InvalidRecordError,
         "partition_for-surrogate-key"),
    case(lambda s: s.append("t", b"v", partition=1.5), OffsetTypeError, "append-float-partition"),
    case(lambda s: s.append("t", b"v", partition=2), UnknownTopicOrPartitionError,
         "append-unknown-partition"),
    case(lambda s: s.partition("t", True), OffsetTypeError, "partition-bool"),
    case(lambda s: s.partitions_for(1.5), InvalidTopicError, "partitions_for-float"),
    case(lambda s: s.describe_topic(None), InvalidTopicError, "describe_topic-None"),
    case(lambda s: s.delete_topic(b"t"), InvalidTopicError, "delete_topic-bytes"),
    case(lambda s: s.beginning_offsets("t"), InvalidTopicError, "beginning_offsets-str"),
    case(lambda s: s.beginning_offsets([("t", "0")]), OffsetTypeError,
         "beginning_offsets-str-partition"),
    case(lambda s: s.end_offsets([("t", 0)], "committed"), InvalidArgumentError,
         "end_offsets-bad-isolation_level"),
    case(lambda s: s.tick(1.5), InvalidArgumentError, "tick-float"),
    case(lambda s: s.enforce_retention(2 ** 63), InvalidArgumentError, "enforce_retention-2**63"),
    case(lambda s: s.compact(now_ms="1"), InvalidArgumentError, "compact-str-now"),
]


@pytest.mark.parametrize("call, expected", STORE_CASES)
def test_store_refuses(template, fresh, call, expected):
    check_refused(template, fresh, call, expected)


# --- segstore.open ------------------------------------------------------------------------------

OPEN_CASES = [
    # a clock of floats (time.time() * 1000) broke appends without a timestamp, tick() and
    # close(), which raised TypeError half way and left the store locked and not cleanly shut.
    case(dict(clock=lambda: time.time() * 1000), InvalidConfigError, "float-clock"),
    case(dict(clock=lambda: True), InvalidConfigError, "bool-clock"),
    case(dict(clock=lambda: None), InvalidConfigError, "None-clock"),
    case(dict(clock=lambda: "1"), InvalidConfigError, "str-clock"),
    case(dict(clock=lambda: -1), InvalidConfigError, "negative-clock"),
    case(dict(clock=lambda: 2 ** 63), InvalidConfigError, "clock-2**63"),
    case(dict(clock=5), InvalidConfigError, "clock-not-callable"),
    case(dict(config={"log.retention.ms": 1.5}), InvalidConfigError, "float-config"),
    case(dict(config={"log.cleaner.threads": "x"}), InvalidConfigError, "str-config"),
    case(dict(config={"nope": 1}), InvalidConfigError, "unknown-config"),
    case(dict(config=[("log.retention.ms", 1)]), InvalidConfigError, "config-list"),
    case(dict(config={"log.segment.bytes": 2 ** 64}), InvalidConfigError, "config-2**64"),
]


@pytest.mark.parametrize("kwargs, expected", OPEN_CASES)
def test_open_refuses(template, fresh, kwargs, expected):
    _, files, contents = template
    with pytest.raises(expected):
        segstore.open(fresh, **kwargs)
    assert _files(fresh) == files  # nothing made, nothing left locked
    s = segstore.open(fresh, clock=lambda: CLOCK_MS)
    try:
        assert _contents(s) == contents
    finally:
        s.close()


@pytest.mark.parametrize("path", ["", 3, None, b"bytes"], ids=["empty", "int", "None", "bytes"])
def test_open_refuses_a_path_that_is_not_one(tmp_path, monkeypatch, path):
    """open('') made a store in the current directory (abspath('') is the cwd)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidConfigError):
        segstore.open(path)
    assert os.listdir(tmp_path) == []


# --- arguments that are valid: they work, with their documented meaning ----------------------

def test_valid_arguments_keep_their_meaning(template, fresh):
    """numpy ints count as ints; iterables are read once; bools and numpy bools are bools."""
    s = segstore.open(fresh, clock=lambda: CLOCK_MS)
    try:
        lg = T0(s)
        end = lg.log_end_offset
        assert [r.offset for r in lg.read(np.int64(1), max_records=np.int32(2))] == [1, 2]
        assert len(lg.read_columns(np.int64(0), np.int64(3), max_records=np.uint8(2))) == 2
        assert [r.offset for r in lg.iter_records(np.int64(5), np.int64(7))] == [5, 6]
        assert s.partition("t", np.int64(1)).log_end_offset == 1
        assert s.compact("c", np.int64(0), force=True) == []
        info = C0(s).append_batch([b"a", b"b"], (k for k in [b"ka", b"kb"]))
        assert [r.key for r in C0(s).read(info.first_offset)] == [b"ka", b"kb"]
        md = lg.append(b"h", headers=(h for h in [("k", b"vv")]))
        assert md.serialized_header_size == 3  # the generator was read once, for both
        info = lg.append_batch([b"x"], None, (h for h in [[("k", b"v")]]), np.int64(7))
        assert [(list(r.headers), r.timestamp) for r in lg.read(info.first_offset)] == \
            [([("k", b"v")], 7)]
        info = lg.append_batch([b"t"], producer_id=np.int64(11), producer_epoch=np.int16(0),
                               base_sequence=np.int32(0), is_transactional=np.bool_(False))
        assert info.num_records == 1
        assert lg.delete_records(np.int64(1)) == 1
        lg.delete_segments(lg.segments[:1], np.int64(4))
        assert lg.log_start_offset == 5
        assert s.offsets_for_times({TopicPartition("t", np.int64(0)): np.int64(1006)}) == \
            {TopicPartition("t", 0): (6, 1006, None)}
        assert isinstance(s.partition_for("t", bytearray(b"k")), int)
        assert lg.log_end_offset == end + 3
    finally:
        s.close()


# --- calls that need no store: the codec, columns, compression ----------------------------------

GOOD = _core.encode_batch([b"a", b"b"], [b"k", None], [[("h", b"v")], None], 5)
COL = BinaryColumn.from_pylist([b"a", b"b"])

def _bad_offsets(offsets, n=2):
    return BinaryColumn(np.zeros(3, np.uint8), np.array(offsets, np.int64), np.ones(n, bool))


CORE_CASES = [
    # Integer arguments: Cython truncated floats (1.5 -> 1), took True for 1, raised bare
    # TypeError for a str or None and OverflowError for 2**63.
    case(lambda: _core.encode_batch([b"a"], base_offset=1.5), OffsetTypeError,
         "encode_batch-float-base_offset"),
    case(lambda: _core.encode_batch([b"a"], base_offset=True), OffsetTypeError,
         "encode_batch-bool-base_offset"),
    case(lambda: _core.encode_batch([b"a"], base_offset="1"), OffsetTypeError,
         "encode_batch-str-base_offset"),
    case(lambda: _core.encode_batch([b"a"], base_offset=2 ** 63), InvalidOffsetError,
         "encode_batch-base_offset-2**63"),
    case(lambda: _core.encode_batch([b"a"], producer_id=1.5), InvalidRecordError,
         "encode_batch-float-producer_id"),
    case(lambda: _core.encode_batch([b"a"], producer_id=2 ** 63), InvalidRecordError,
         "encode_batch-producer_id-2**63"),
    case(lambda: _core.encode_batch([b"a"], producer_epoch=1.5), InvalidRecordError,
         "encode_batch-float-producer_epoch"),
    case(lambda: _core.encode_batch([b"a"], producer_epoch=2 ** 40), InvalidRecordError,
         "encode_batch-producer_epoch-2**40"),
    case(lambda: _core.encode_batch([b"a"], base_sequence=None), InvalidRecordError,
         "encode_batch-None-base_sequence"),
    case(lambda: _core.encode_batch([b"a"], base_sequence=2 ** 31), InvalidRecordError,
         "encode_batch-base_sequence-2**31"),
    case(lambda: _core.encode_batch([b"a"], partition_leader_epoch=1.5), InvalidRecordError,
         "encode_batch-float-leader-epoch"),
    case(lambda: _core.encode_batch([b"a"], log_append_time_ms=1.5), InvalidRecordError,
         "encode_batch-float-log_append_time"),
    case(lambda: _core.encode_batch([b"a"], log_append_time_ms=2 ** 64), InvalidRecordError,
         "encode_batch-log_append_time-2**64"),
    case(lambda: _core.encode_control_batch(1.5, producer_id=1, producer_epoch=0,
                                            timestamp_ms=0),
         InvalidRecordError, "encode_control_batch-float-type"),
    case(lambda: _core.encode_control_batch(True, producer_id=1, producer_epoch=0,
                                            timestamp_ms=0),
         InvalidRecordError, "encode_control_batch-bool-type"),
    case(lambda: _core.encode_control_batch(1, producer_id=1, producer_epoch=0,
                                            timestamp_ms=1.5),
         InvalidRecordError, "encode_control_batch-float-timestamp"),
    case(lambda: _core.encode_control_batch(1, producer_id=1, producer_epoch=0,
                                            timestamp_ms=0, coordinator_epoch=2 ** 31),
         InvalidRecordError, "encode_control_batch-coordinator_epoch-2**31"),
    case(lambda: _core.encode_control_batch(1, producer_id=1, producer_epoch=0,
                                            timestamp_ms=0, base_offset=-1),
         InvalidOffsetError, "encode_control_batch-negative-base_offset"),
    case(lambda: _core.encode_columns(COL, base_offset=1.5), OffsetTypeError,
         "encode_columns-float-base_offset"),
    case(lambda: _core.encode_columns(COL, records_per_batch=1.5), OffsetTypeError,
         "encode_columns-float-records_per_batch"),
    case(lambda: _core.encode_columns(COL, records_per_batch=2 ** 31), InvalidArgumentError,
         "encode_columns-records_per_batch-2**31"),
    case(lambda: _core.encode_columns(COL, max_batch_bytes=1.5), OffsetTypeError,
         "encode_columns-float-max_batch_bytes"),
    case(lambda: _core.encode_columns(COL, max_batch_bytes=-5), InvalidArgumentError,
         "encode_columns-negative-max_batch_bytes"),
    case(lambda: _core.encode_columns(COL, log_append_time_ms=1.5), InvalidRecordError,
         "encode_columns-float-log_append_time"),
    case(lambda: _core.encode_columns(COL, partition_leader_epoch=2 ** 31), InvalidRecordError,
         "encode_columns-leader-epoch-2**31"),
    case(lambda: _core.scan_batches(GOOD, 1.5), OffsetTypeError, "scan_batches-float-start"),
    case(lambda: _core.scan_batches(GOOD, None), OffsetTypeError, "scan_batches-None-start"),
    case(lambda: _core.scan_batches(GOOD, 0, 2 ** 63), InvalidArgumentError,
         "scan_batches-end-2**63"),
    case(lambda: _core.scan_batches(GOOD, True), OffsetTypeError, "scan_batches-bool-start"),
    case(lambda: _core.scan_batches(GOOD, max_batches=1.5), OffsetTypeError,
         "scan_batches-float-max_batches"),
    case(lambda: _core.scan_batches(GOOD, max_batches=2 ** 64), InvalidArgumentError,
         "scan_batches-max_batches-2**64"),
    case(lambda: _core.decode_records(GOOD, min_offset=1.5), OffsetTypeError,
         "decode_records-float-min_offset"),
    case(lambda: _core.decode_records(GOOD, end_offset="1"), OffsetTypeError,
         "decode_records-str-end_offset"),
    case(lambda: _core.decode_records(GOOD, end_offset=2 ** 63), InvalidArgumentError,
         "decode_records-end_offset-2**63"),
    case(lambda: _core.decode_records(GOOD, max_records=True), OffsetTypeError,
         "decode_records-bool-max_records"),
    case(lambda: _core.decode_records(GOOD, 0, 1.5), OffsetTypeError, "decode_records-float-end"),
    case(lambda: _core.decode_columns(GOOD, min_offset=1.5), OffsetTypeError,
         "decode_columns-float-min_offset"),
    case(lambda: _core.decode_columns(GOOD, max_records=1.5), OffsetTypeError,
         "decode_columns-float-max_records"),
    case(lambda: _core.decode_columns(GOOD, max_records=2 ** 63), InvalidArgumentError,
         "decode_columns-max_records-2**63"),
    case(lambda: _core.decode_columns(GOOD, 1.5), OffsetTypeError, "decode_columns-float-start"),
    case(lambda: _core.murmur2_partition(b"a", 1.5), OffsetTypeError,
         "murmur2_partition-float-count"),
    case(lambda: _core.murmur2_partition(b"a", 2 ** 31), InvalidArgumentError,
         "murmur2_partition-count-2**31"),
    case(lambda: _core.murmur2_partitions(COL, True), OffsetTypeError,
         "murmur2_partitions-bool-count"),
    case(lambda: _core.murmur2_partitions(COL, None), OffsetTypeError,
         "murmur2_partitions-None-count"),
    case(lambda: _core.murmur3_128(b"a", 1.5), OffsetTypeError, "murmur3_128-float-seed"),
    case(lambda: _core.murmur3_128(b"a", -1), InvalidArgumentError, "murmur3_128-negative-seed"),
    case(lambda: _core.murmur3_128(b"a", 2 ** 32), InvalidArgumentError,
         "murmur3_128-seed-2**32"),
    case(lambda: _core.set_base_offset(bytearray(GOOD), 0, 1.5), OffsetTypeError,
         "set_base_offset-float-offset"),
    case(lambda: _core.set_base_offset(bytearray(GOOD), 0, -1), InvalidOffsetError,
         "set_base_offset-negative-offset"),
    case(lambda: _core.set_base_offset(bytearray(GOOD), 1.5, 0), OffsetTypeError,
         "set_base_offset-float-position"),
    case(lambda: _core.set_base_offset(bytearray(GOOD), 1, 0), InvalidArgumentError,
         "set_base_offset-not-a-batch"),
    case(lambda: _core.set_base_offset(bytearray(GOOD), -1, 0), InvalidArgumentError,
         "set_base_offset-negative-position"),
    case(lambda: _core.set_base_offset(bytearray(GOOD), 0, 0, "1"), InvalidRecordError,
         "set_base_offset-str-leader-epoch"),
    # Other arguments of the codec: numpy converted floats and strings in order and
    # offset_deltas (0.7 -> row 0, "1" -> 1), reshaped any even count of digests; columns,
    # batches and digests of the wrong kind raised AttributeError, TypeError or IndexError.
    case(lambda: _core.encode_columns(COL, order=np.array([0.7])), InvalidArgumentError,
         "encode_columns-float-order"),
    case(lambda: _core.encode_columns(COL, order=["1"]), InvalidArgumentError,
         "encode_columns-str-order"),
    case(lambda: _core.encode_columns(COL, order=np.zeros((1, 1), np.int64)),
         InvalidArgumentError, "encode_columns-2d-order"),
    case(lambda: _core.encode_columns([b"a"]), InvalidRecordError, "encode_columns-list-values"),
    case(lambda: _core.encode_columns(COL, 1.5), InvalidRecordError, "encode_columns-float-keys"),
    case(lambda: _core.encode_columns(COL, None, np.array([[1], [2]])), InvalidRecordError,
         "encode_columns-2d-timestamps"),
    case(lambda: _core.encode_batch([b"a", b"b"], offset_deltas=[0.2, 1.9]), InvalidOffsetError,
         "encode_batch-float-offset_deltas"),
    case(lambda: _core.encode_batch([b"a"], offset_deltas=["0"]), InvalidOffsetError,
         "encode_batch-str-offset_deltas"),
    case(lambda: _core.encode_batch([b"a"], offset_deltas=1.5), InvalidOffsetError,
         "encode_batch-float-offset_deltas-argument"),
    case(lambda: _core.encode_batch([b"a"], offset_deltas=np.zeros((1, 1), np.int64)),
         InvalidOffsetError, "encode_batch-2d-offset_deltas"),
    case(lambda: _core.encode_batch([b"a"], None, [{"ab": b"v"}]), InvalidRecordError,
         "encode_batch-headers-as-a-dict"),
    case(lambda: _core.encode_batch([b"a"], None, ["kv"]), InvalidRecordError,
         "encode_batch-headers-as-a-str"),
    case(lambda: _core.encode_batch([b"a"], None, [[("k", 1)]]), InvalidRecordError,
         "encode_batch-int-header-value"),
    case(lambda: _core.timestamp_array([[1]]), InvalidRecordError, "timestamp_array-2d"),
    case(lambda: _core.timestamp_array(bytearray(b"\x01")), InvalidRecordError,
         "timestamp_array-bytearray"),
    case(lambda: _core.distinct_digests(np.zeros((3, 3), np.uint64)), InvalidArgumentError,
         "distinct_digests-3-columns"),
    case(lambda: _core.distinct_digests(np.zeros(4, np.uint64)), InvalidArgumentError,
         "distinct_digests-1d"),
    case(lambda: _core.distinct_digests(np.zeros((3, 2), float)), InvalidArgumentError,
         "distinct_digests-floats"),
    case(lambda: _core.distinct_digests(1.5), InvalidArgumentError, "distinct_digests-float"),
    case(lambda: _core.murmur2_partitions([b"a"], 3), InvalidRecordError,
         "murmur2_partitions-list"),
    case(lambda: _core.murmur3_128_digests(1.5), InvalidRecordError,
         "murmur3_128_digests-float"),
    case(lambda: _core.first_null_key(GOOD, "batches"), InvalidArgumentError,
         "first_null_key-str-batches"),
    case(lambda: _core.first_null_key(GOOD, np.zeros(2, np.int64)), InvalidArgumentError,
         "first_null_key-int-array-batches"),
    case(lambda: _core.murmur2_partitions(_bad_offsets([0, 2, 9]), 3), InvalidRecordError,
         "murmur2_partitions-offsets-past-the-data"),
    # Buffers that are not contiguous byte buffers: BufferTypeError (Python's TypeError,
    # ValueError or BufferError before, and None read as an empty buffer).
    case(lambda: _core.crc32c(1.5), BufferTypeError, "crc32c-float"),
    case(lambda: _core.murmur2(np.zeros(2, np.int32)), BufferTypeError,
         "murmur2-int32-array"),
    case(lambda: _core.scan_batches(None), BufferTypeError, "scan_batches-None"),
    case(lambda: _core.decode_records(np.zeros(200, np.uint8)[::2]), BufferTypeError,
         "decode_records-non-contiguous"),
    case(lambda: _core.decode_columns(np.zeros((4, 40), np.uint8)), BufferTypeError,
         "decode_columns-2d"),
    case(lambda: _core.set_base_offset(GOOD, 0, 0), BufferTypeError,
         "set_base_offset-read-only-bytes"),
    case(lambda: _core.first_null_key(1.5, _core.scan_batches(GOOD).batches),
         BufferTypeError, "first_null_key-float-buffer"),
    case(lambda: compression.compress(1, "text"), BufferTypeError, "compress-str"),
    case(lambda: compression.compress(3, np.zeros(8, np.uint8)[::2]), BufferTypeError,
         "compress-lz4-non-contiguous"),
    case(lambda: compression.decompress(1, None), BufferTypeError, "decompress-None"),
    # columns (BinaryColumn): anything but 1-d C-contiguous arrays raised AttributeError or,
    # later, ValueError; from_pylist TypeError for a non-sequence and UnicodeEncodeError for a
    # lone surrogate; filter and to_arrow IndexError, ValueError or ArrowInvalid for offsets
    # outside the data or decreasing.
    case(lambda: BinaryColumn([1], np.array([0, 1]), np.ones(1, bool)), InvalidRecordError,
         "BinaryColumn-list-data"),
    case(lambda: BinaryColumn(np.zeros(1, np.uint8), None, np.ones(1, bool)),
         InvalidRecordError, "BinaryColumn-None-offsets"),
    case(lambda: BinaryColumn(np.zeros(1, np.uint8), np.array([0, 1]), np.ones((1, 1), bool)),
         InvalidRecordError, "BinaryColumn-2d-valid"),
    case(lambda: BinaryColumn(np.zeros(4, np.uint8)[::2], np.array([0, 1]), np.ones(1, bool)),
         InvalidRecordError, "BinaryColumn-non-contiguous-data"),
    case(lambda: BinaryColumn.from_pylist(1.5), InvalidRecordError, "from_pylist-float"),
    case(lambda: BinaryColumn.from_pylist(None), InvalidRecordError, "from_pylist-None"),
    case(lambda: BinaryColumn.from_pylist(["\udc80"]), InvalidRecordError,
         "from_pylist-surrogate"),
    case(lambda: _bad_offsets([0, 2, 9]).filter(np.ones(2, bool)), InvalidRecordError,
         "filter-offsets-past-the-data"),
    case(lambda: _bad_offsets([0, 2, 1]).filter(np.ones(2, bool)), InvalidRecordError,
         "filter-decreasing-offsets"),
    case(lambda: _bad_offsets([0, 2, 9]).to_arrow(), InvalidRecordError,
         "to_arrow-offsets-past-the-data"),
    case(lambda: COL.filter([1, 0]), InvalidRecordError, "filter-int-mask"),
    case(lambda: BinaryColumn.from_fixed(np.zeros((2, 2), np.int32)), InvalidRecordError,
         "from_fixed-int32"),
    # compression and the buffer pool (already typed)
    case(lambda: compression.codec_id(1.0), UnsupportedCompressionError, "codec_id-float"),
    case(lambda: compression.codec_name(True), UnsupportedCompressionError, "codec_name-bool"),
    case(lambda: compression.compress(1, b"x", 1.5), InvalidConfigError, "compress-float-level"),
    case(lambda: compression.compress(4, b"x", 2 ** 64), InvalidConfigError,
         "compress-zstd-level-2**64"),
    case(lambda: compression.decompress(1, b"not gzip"), CorruptRecordError,
         "decompress-garbage"),
    case(lambda: buffer_pool.set_limit(np.float64(1)), InvalidArgumentError,
         "set_limit-numpy-float"),
]


@pytest.mark.parametrize("call, expected", CORE_CASES)
def test_codec_and_columns_refuse(call, expected):
    with pytest.raises(SegstoreError) as info:
        call()
    assert isinstance(info.value, expected), repr(info.value)
