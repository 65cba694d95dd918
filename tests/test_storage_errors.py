"""I/O errors in the middle of a write (ENOSPC, EIO, a failed fsync): Kafka's log dir failure.

A write that fails part way must never leave a log that later writes build on wrongly: before
this module's fix, an index page that could not be allocated (ENOSPC on the sparse, preallocated
index) failed an append after its batch was in the segment, and the next append wrote the same
offsets again after it; the reopen then cut the acknowledged records. Now a segment's append
is all or nothing in memory, and a log whose write failed goes offline (KafkaStorageError) until
the store is reopened, which recovers it from the files.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import segstore
from segstore import flusher, index as index_mod, segment_files
from segstore.checkpoint import CLEAN_SHUTDOWN_FILE
from segstore.columns import BinaryColumn
from segstore.errors import KafkaStorageError, SegstoreError

from conftest import FakeClock


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _values(prefix: bytes, n: int = 3) -> list:
    return [prefix + b"%04d" % i + b"." * 200 for i in range(n)]


def _open(path, **config):
    store = segstore.open(path, clock=FakeClock())
    if "t" not in store.list_topics():
        store.create_topic("t", 1, config={"index.interval.bytes": 100, **config})
    return store


def _records(lg) -> list:
    return [(r.offset, r.value) for r in lg.iter_records(0)]


def test_segment_append_is_all_or_nothing(tmp_path, monkeypatch):
    store = _open(str(tmp_path))
    lg = store.partition("t", 0)
    lg.append_batch(_values(b"a"), [b"k"] * 3)
    seg = lg.active_segment
    before = (seg.size, seg.offset_index.entries, seg.time_index.entries,
              seg.bytes_since_last_index_entry, seg.max_timestamp_so_far,
              seg.offset_of_max_timestamp, seg.rolling_based_timestamp)
    # The time index fails after the log write and the offset index's entry.
    monkeypatch.setattr(index_mod.TimeIndex, "append_entries", _enospc)
    with pytest.raises(KafkaStorageError):
        lg.append_batch(_values(b"b"), [b"k"] * 3, timestamps_ms=[2_000_000] * 3)
    assert (seg.size, seg.offset_index.entries, seg.time_index.entries,
            seg.bytes_since_last_index_entry, seg.max_timestamp_so_far,
            seg.offset_of_max_timestamp, seg.rolling_based_timestamp) == before
    assert lg.log_end_offset == 3
    store.close()


@pytest.mark.parametrize("failing", ["offset", "time"])
def test_failed_index_write_takes_the_log_offline_and_reopen_recovers(tmp_path, monkeypatch,
                                                                       failing):
    path = str(tmp_path)
    store = _open(path)
    lg = store.partition("t", 0)
    lg.append_batch(_values(b"a"), [b"k"] * 3)
    cls = index_mod.OffsetIndex if failing == "offset" else index_mod.TimeIndex
    with monkeypatch.context() as m:
        m.setattr(cls, "append_entries", _enospc)
        with pytest.raises(KafkaStorageError) as info:
            lg.append_batch(_values(b"b"), [b"k"] * 3)
    e = info.value
    assert isinstance(e, OSError) and isinstance(e, SegstoreError)
    assert e.errno == errno.ENOSPC and isinstance(e.__cause__, OSError)
    assert "t-0" in str(e) and "reopen the store" in str(e)
    assert lg.offline
    # Reads serve what was appended before the failure, and nothing of the failed batch.
    assert _records(lg) == list(enumerate(_values(b"a")))
    assert lg.read_columns(0).offsets.tolist() == [0, 1, 2]
    # Every later write is refused, the space being back or not.
    n = 2
    writes = [
        lambda: lg.append_batch(_values(b"c"), [b"k"] * 3),
        lambda: lg.append(b"v", b"k"),
        lambda: lg.append_columns(BinaryColumn.from_pylist([b"v"] * n),
                                  BinaryColumn.from_pylist([b"k"] * n)),
        lambda: lg.roll(),
        lambda: lg.flush(),
    ]
    for write in writes:
        with pytest.raises(KafkaStorageError, match="is offline since an I/O error"):
            write()
    assert lg.log_end_offset == 3
    store.close()
    assert not os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))

    store = _open(path)
    lg = store.partition("t", 0)
    assert not lg.offline
    # The failed append's batch reached the file whole before its index entry failed: the
    # reopen's recovery keeps it, as a Kafka producer's failed request may have been written.
    # What this store read before, and appends after, follow it without a gap or a repeat.
    kept = _values(b"a") + _values(b"b")
    assert _records(lg) == list(enumerate(kept))
    lg.append_batch(_values(b"c"), [b"k"] * 3)
    assert _records(lg) == list(enumerate(kept + _values(b"c")))
    store.close()
    store = _open(path)
    assert _records(store.partition("t", 0)) == list(enumerate(kept + _values(b"c")))
    assert store.verify() == []
    store.close()


def test_a_producer_retry_after_an_ambiguous_failure_is_not_written_twice(tmp_path,
                                                                          monkeypatch):
    """A failed append may have reached the file (then the reopen keeps it): a producer that
    retries with the same producer id and sequence gets the first write's offsets back."""
    path = str(tmp_path)
    store = _open(path)
    lg = store.partition("t", 0)
    lg.append_batch(_values(b"a"), [b"k"] * 3, producer_id=9, producer_epoch=0, base_sequence=0)
    monkeypatch.setattr(index_mod.TimeIndex, "append_entries", _enospc)
    with pytest.raises(KafkaStorageError):
        lg.append_batch(_values(b"b"), [b"k"] * 3, producer_id=9, producer_epoch=0,
                        base_sequence=3)
    monkeypatch.undo()
    store.close()
    store = _open(path)
    lg = store.partition("t", 0)
    info = lg.append_batch(_values(b"b"), [b"k"] * 3, producer_id=9, producer_epoch=0,
                           base_sequence=3)   # the retry
    assert (info.first_offset, info.last_offset) == (3, 5)
    assert _records(lg) == list(enumerate(_values(b"a") + _values(b"b")))
    store.close()


def test_short_writes_are_continued(tmp_path, monkeypatch):
    """A pwrite that writes part of the data (allowed by POSIX) is continued, not an error."""
    real = os.pwrite
    calls = []

    def half(fd, data, position):
        data = memoryview(data)
        calls.append(len(data))
        return real(fd, data[:max(1, len(data) // 2)], position)

    store = _open(str(tmp_path))
    lg = store.partition("t", 0)
    monkeypatch.setattr(segment_files.os, "pwrite", half)
    lg.append_batch(_values(b"a", 50), [b"k"] * 50)
    monkeypatch.undo()
    assert len(calls) > 5
    assert _records(lg) == list(enumerate(_values(b"a", 50)))
    store.close()
    store = _open(str(tmp_path))
    assert _records(store.partition("t", 0)) == list(enumerate(_values(b"a", 50)))
    assert store.verify() == []
    store.close()


def test_a_full_disk_names_the_file_and_its_errno(tmp_path, monkeypatch):
    store = _open(str(tmp_path))
    lg = store.partition("t", 0)
    monkeypatch.setattr(segment_files.os, "pwrite", _enospc)
    with pytest.raises(KafkaStorageError) as info:
        lg.append_batch(_values(b"a"), [b"k"] * 3)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert lg.active_segment.log_path in str(info.value)
    assert lg.log_end_offset == 0 and lg.active_segment.size == 0
    store.close()
    store = _open(str(tmp_path))
    lg = store.partition("t", 0)
    assert lg.log_end_offset == 0
    lg.append_batch(_values(b"a"), [b"k"] * 3)
    assert _records(lg) == list(enumerate(_values(b"a")))
    store.close()


def test_failed_fsync_takes_the_log_offline_without_moving_the_recovery_point(tmp_path,
                                                                             monkeypatch):
    """After a failed fsync the kernel may have marked the pages clean: a retried fsync would
    succeed without them on disk (PostgreSQL's "fsyncgate"). So the recovery point stays and
    the log refuses writes until a reopen, which recovers above the recovery point."""
    path = str(tmp_path)
    store = _open(path)
    lg = store.partition("t", 0)
    lg.append_batch(_values(b"a"), [b"k"] * 3)
    lg.flush()
    lg.append_batch(_values(b"b"), [b"k"] * 3)
    assert lg.recovery_point == 3

    def eio(fd):
        os.close(fd)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as m:
        m.setattr(flusher, "_fsync_and_close", eio)
        with pytest.raises(KafkaStorageError) as info:
            lg.flush()
        assert info.value.errno == errno.EIO
        assert lg.offline and lg.recovery_point == 3
        with pytest.raises(KafkaStorageError):
            lg.flush()   # not retried: its success would mean nothing
    assert lg.recovery_point == 3
    store.close()
    assert not os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    store = _open(path)
    lg = store.partition("t", 0)
    assert _records(lg) == list(enumerate(_values(b"a") + _values(b"b")))
    store.close()


def _fail_fsyncs_under(monkeypatch, directory: str) -> None:
    """The flusher's fsyncs of files in ``directory`` fail with EIO; the others run."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.fail("these tests need /proc/self/fd to tell the partitions' descriptors apart")
    real = flusher._fsync_and_close

    def eio_under_directory(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(directory + os.sep):
            os.close(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(flusher, "_fsync_and_close", eio_under_directory)


def test_flush_failing_in_the_flush_ms_pass_does_not_stop_the_other_logs(tmp_path, monkeypatch):
    clock = FakeClock()
    store = segstore.open(str(tmp_path), clock=clock)
    store.create_topic("t", 2, config={"flush.ms": 1000})
    a, b = store.partition("t", 0), store.partition("t", 1)
    a.append_batch([b"x"], [b"k"])
    b.append_batch([b"y"], [b"k"])
    clock.advance(5000)
    _fail_fsyncs_under(monkeypatch, a.directory)
    store.tick()   # logged, not raised: a service error must not kill the others
    monkeypatch.undo()
    assert a.offline and not b.offline
    assert b.recovery_point == 1 and a.recovery_point == 0
    assert store.metrics()["OfflineReplicaCount"] == 1
    store.close()
    assert not os.path.exists(os.path.join(str(tmp_path), CLEAN_SHUTDOWN_FILE))


def test_a_log_going_offline_while_closing_still_closes_the_store(tmp_path, monkeypatch):
    path = str(tmp_path)
    store = segstore.open(path, clock=FakeClock())
    store.create_topic("t", 2)
    store.partition("t", 0).append_batch([b"x"], [b"k"])
    store.partition("t", 1).append_batch([b"y"], [b"k"])
    _fail_fsyncs_under(monkeypatch, store.partition("t", 0).directory)
    with pytest.raises(KafkaStorageError):
        store.close()
    monkeypatch.undo()
    assert store.partition  # the store object stays usable for introspection
    store.close()   # already closed: nothing to do
    assert not os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    # The lock is released: the store reopens in this process and recovers both logs.
    store = segstore.open(path, clock=FakeClock())
    assert [r.value for r in store.partition("t", 0).iter_records(0)] == [b"x"]
    assert [r.value for r in store.partition("t", 1).iter_records(0)] == [b"y"]
    store.close()


def test_a_failed_transaction_index_write_leaves_a_consistent_log_after_reopen(tmp_path,
                                                                            monkeypatch):
    """An ABORT marker lands in the segment, then its .txnindex entry fails: the log goes
    offline, and the reopen's recovery rebuilds the transaction index from the markers."""
    from segstore import transaction_index
    from segstore.records import ControlRecordType

    path = str(tmp_path)
    store = _open(path)
    lg = store.partition("t", 0)
    lg.append_batch([b"committed"], [b"k"])
    lg.append_batch([b"aborted"], [b"k"], producer_id=7, producer_epoch=0, base_sequence=0,
                    is_transactional=True)
    monkeypatch.setattr(transaction_index, "write_all", _enospc)
    with pytest.raises(KafkaStorageError):
        lg.append_control(ControlRecordType.ABORT, producer_id=7, producer_epoch=0)
    monkeypatch.undo()
    assert lg.offline
    store.close()
    store = _open(path)
    lg = store.partition("t", 0)
    assert lg.log_end_offset == 3   # the marker was written before the index failed
    committed = lg.read_columns(0, isolation_level="read_committed")
    assert [bytes(v) for v in committed.values.to_pylist()] == [b"committed"]
    assert store.verify() == []
    store.close()


def test_column_appends_and_adoption_go_offline_too(tmp_path, monkeypatch):
    path = str(tmp_path)
    store = _open(path)
    lg = store.partition("t", 0)
    n = 1000
    values = BinaryColumn(np.frombuffer(b"v" * (n * 10), dtype=np.uint8),
                          np.arange(0, n * 10 + 1, 10, dtype=np.int64), np.ones(n, dtype=bool))
    keys = BinaryColumn.from_pylist([b"k"] * n)
    monkeypatch.setattr(segment_files.os, "pwrite", _enospc)
    with pytest.raises(KafkaStorageError):
        lg.append_columns(values, keys)
    monkeypatch.undo()
    assert lg.offline and lg.log_end_offset == 0
    staged = os.path.join(str(tmp_path), "staged.log")
    from segstore import _core
    with open(staged, "wb") as f:
        f.write(_core.encode_batch([b"v"], [b"k"]))
    with pytest.raises(KafkaStorageError):
        lg.adopt_segment_file(staged)
    assert os.path.exists(staged)   # refused before anything was done with it
    store.close()


def _compacted_offline_store(path):
    clock = FakeClock()
    store = segstore.open(path, clock=clock)
    store.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 2000,
                                       "min.cleanable.dirty.ratio": 0.01})
    lg = store.partition("c", 0)
    for i in range(40):
        lg.append_batch([b"v%d" % i + b"." * 100], [b"k%d" % (i % 3)])
    return store, lg, clock


def test_a_failed_rename_in_the_cleaner_swap_takes_the_log_offline(tmp_path, monkeypatch):
    """The swap renames .cleaned -> .swap, the old segments -> .deleted, then drops .swap: an
    error between them leaves the files and the log's state apart."""
    from segstore.segment import LogSegment
    path = str(tmp_path)
    store, lg, _ = _compacted_offline_store(path)
    before = [(r.offset, r.key, r.value) for r in lg.iter_records(0)]
    real = LogSegment.change_file_suffixes
    calls = []

    def second_rename_fails(self, old, new):
        calls.append((old, new))
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(self, old, new)

    monkeypatch.setattr(LogSegment, "change_file_suffixes", second_rename_fails)
    with pytest.raises(KafkaStorageError):
        store.compact("c", force=True)
    monkeypatch.undo()
    assert lg.offline
    with pytest.raises(KafkaStorageError, match="offline"):
        store.compact("c", force=True)   # refused before a round's work
    store.close()
    store = segstore.open(path, clock=FakeClock())
    lg = store.partition("c", 0)
    after = {}
    for r in lg.iter_records(0):
        after[r.key] = r.value
    # Whatever the recovery kept or completed, the latest value of every key is there.
    latest = {}
    for _, k, v in before:
        latest[k] = v
    assert after == latest
    assert store.verify() == []
    store.compact("c", force=True)
    assert {r.key: r.value for r in lg.iter_records(0)} == latest
    store.close()


def test_offline_logs_are_left_alone_by_retention_and_the_cleaner_threads(tmp_path, monkeypatch):
    path = str(tmp_path)
    store, lg, clock = _compacted_offline_store(path)
    store.create_topic("d", 1, config={"retention.ms": 1000, "segment.bytes": 2000})
    d = store.partition("d", 0)
    for i in range(40):
        d.append_batch([b"." * 100], [b"k"])
    monkeypatch.setattr(segment_files.os, "pwrite", _enospc)
    for log_ in (lg, d):
        with pytest.raises(KafkaStorageError):
            log_.append_batch([b"x"], [b"k"])
    monkeypatch.undo()
    clock.advance(10_000_000)
    segments = len(d.segments)
    report = store.enforce_retention()
    assert "offline" in report.errors[d.topic_partition]
    assert len(d.segments) == segments   # nothing deleted
    assert store.cleaner_manager.grab_filthiest_compacted_log() is None
    assert store.cleaner_manager.deletable_logs() == []
    store.close()


def test_a_checkpoint_write_failing_at_close_still_releases_the_lock(tmp_path, monkeypatch):
    path = str(tmp_path)
    store = _open(path)
    store.partition("t", 0).append_batch(_values(b"a"), [b"k"] * 3)
    monkeypatch.setattr(type(store), "write_checkpoints", lambda self: _enospc())
    with pytest.raises(OSError):
        store.close()
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    store.close()   # closed: nothing more to do
    store = _open(path)   # the lock was released
    assert _records(store.partition("t", 0)) == list(enumerate(_values(b"a")))
    store.close()


def test_a_chunked_column_append_keeps_the_chunks_written_before_the_error(tmp_path,
                                                                          monkeypatch):
    """As concepts.md says: a several-step append may leave a prefix, which log_end_offset
    tells; the reopen keeps it (and maybe the failed step's batches)."""
    from segstore import column_append
    monkeypatch.setattr(column_append, "CHUNK_BYTES", 1 << 16)
    path = str(tmp_path)
    store = _open(path)
    lg = store.partition("t", 0)
    n = 5000
    values = BinaryColumn(np.frombuffer(bytes(range(100)) * n, dtype=np.uint8),
                          np.arange(0, n * 100 + 1, 100, dtype=np.int64), np.ones(n, bool))
    real, calls = os.pwrite, []

    def third_write_fails(fd, data, position):
        calls.append(position)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, position)

    monkeypatch.setattr(segment_files.os, "pwrite", third_write_fails)
    with pytest.raises(KafkaStorageError):
        lg.append_columns(values)
    monkeypatch.undo()
    kept = lg.log_end_offset
    assert 0 < kept < n
    assert lg.read_columns(0).offsets.tolist() == list(range(kept))
    store.close()
    store = _open(path)
    lg = store.partition("t", 0)
    # The reopen keeps at least that prefix, and the failed step's batches too when they
    # reached the file whole (here the index write failed after the log write): a prefix.
    assert kept <= lg.log_end_offset <= n
    assert lg.read_columns(0).values.to_pylist() == [bytes(range(100))] * lg.log_end_offset
    store.close()
