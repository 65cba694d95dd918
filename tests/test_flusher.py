"""segstore/flusher.py: a segment's fsyncs at once on a pool, and the cleaner's use of them
(each group's files synced while the next group is filtered, never swapped in unsynced)."""

from __future__ import annotations

import os
import threading

import pytest

from segstore import flusher
from segstore.cleaner.cleaner import Cleaner
from segstore.log import PartitionLog
from test_cleaner_service import _grouped_store, records, stores, temp_files  # noqa: F401
from test_segment import enc, segment


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def synced(monkeypatch):
    """Every fsync the flusher makes: (path, thread name), in the order they end."""
    done = []
    real = os.fsync

    def fsync(fd):
        path = _fd_path(fd)
        real(fd)
        done.append((os.path.basename(path), threading.current_thread().name))
    monkeypatch.setattr(flusher.os, "fsync", fsync)
    return done


def test_pending_flush_syncs_and_closes_on_the_pool(tmp_path, synced):
    fds = []
    for i in range(3):
        fd = os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"x" * (i + 1))
        fds.append(fd)
    flusher.PendingFlush(fds).wait()
    assert sorted(name for name, _ in synced) == ["f0", "f1", "f2"]
    assert all(t.startswith("segstore-flusher") for _, t in synced)
    for fd in fds:   # owned: closed once synced
        with pytest.raises(OSError):
            os.fstat(fd)


def test_the_first_here_descriptors_are_synced_by_the_waiting_thread(tmp_path, synced):
    fds = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT) for i in range(3)]
    pending = flusher.PendingFlush(fds, here=1)
    pending.wait()
    threads = dict(synced)
    assert threads["f0"] == threading.current_thread().name
    assert threads["f1"].startswith("segstore-flusher")
    assert threads["f2"].startswith("segstore-flusher")


def test_pending_flush_waits_for_all_then_raises_the_error(tmp_path, monkeypatch):
    ended = []
    gate = threading.Event()

    def fsync(fd):
        if fd == bad:
            raise OSError(5, "injected EIO")
        gate.wait(5)
        ended.append(fd)
    monkeypatch.setattr(flusher.os, "fsync", fsync)
    good = os.open(tmp_path / "good", os.O_WRONLY | os.O_CREAT)
    bad = os.open(tmp_path / "bad", os.O_WRONLY | os.O_CREAT)
    pending = flusher.PendingFlush([bad, good])
    threading.Timer(0.05, gate.set).start()
    with pytest.raises(OSError, match="injected EIO"):
        pending.wait()
    assert ended == [good]   # the good one was waited for before the error was raised
    for fd in (good, bad):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_segment_flush_syncs_every_file_it_wrote(tmp_path, synced):
    seg = segment(tmp_path)
    seg.append(*enc(0, 3))
    seg.txn_index.append((1, 0, 2, 0))
    seg.flush()
    names = sorted(name for name, _ in synced)
    assert names == ["00000000000000000000.index", "00000000000000000000.log",
                     "00000000000000000000.timeindex", "00000000000000000000.txnindex"]
    seg.close()


def test_segment_flush_error_leaves_it_unsynced(tmp_path, monkeypatch):
    seg = segment(tmp_path)
    seg.append(*enc(0, 3))

    def failing(fd):
        raise OSError(5, "injected EIO")
    monkeypatch.setattr(flusher.os, "fsync", failing)
    with pytest.raises(OSError):
        seg.flush()
    assert seg._unsynced   # a later release_files syncs again
    monkeypatch.undo()
    seg.flush()
    assert not seg._unsynced
    seg.close()


def test_cleaned_groups_are_synced_before_their_swap(stores, synced, monkeypatch):
    """Each group's cleaned files are all synced (on the flusher's threads) before the swap
    that commits the group, and at most two cleaned segments exist at a time."""
    s, lg = _grouped_store(stores)
    events = []
    real_swap = PartitionLog.replace_segments
    real_into = Cleaner._clean_into

    def swap(self, new, old, **kw):
        events.append(("swap", new[0].base_offset, list(synced)))
        return real_swap(self, new, old, **kw)

    def clean_into(self, lg_, source, dest, *a, **kw):
        cleaned = [n for n in temp_files(lg_.directory) if n.endswith(".log.cleaned")]
        assert len(cleaned) <= 2, cleaned
        events.append(("filter", source.base_offset, len(cleaned)))
        return real_into(self, lg_, source, dest, *a, **kw)
    monkeypatch.setattr(PartitionLog, "replace_segments", swap)
    monkeypatch.setattr(Cleaner, "_clean_into", clean_into)
    s.compact("t", force=True)
    swaps = [(base, done) for kind, base, done in events if kind == "swap"]
    assert [b for b, _ in swaps] == [0, 10, 20, 30]
    for base, done in swaps:
        prefix = "%020d" % base
        names = {n for n, _ in done}
        for suffix in (".log.cleaned", ".index.cleaned", ".timeindex.cleaned"):
            assert prefix + suffix in names, (base, suffix, sorted(names))
    # The pipeline: group k + 1 was filtered before group k was swapped in.
    order = [(kind, base) for kind, base, _ in events]
    assert order.index(("filter", 10)) < order.index(("swap", 0))
    assert all(t.startswith("segstore-flusher") for n, t in synced if n.endswith(".cleaned"))


def test_a_failed_fsync_aborts_the_round_and_leaves_no_cleaned_files(stores, monkeypatch):
    s, lg = _grouped_store(stores)
    pre = records(lg)
    real = os.fsync

    def fsync(fd):
        if _fd_path(fd).endswith("00000000000000000020.log.cleaned"):
            raise OSError(5, "injected EIO")
        real(fd)
    monkeypatch.setattr(flusher.os, "fsync", fsync)
    with pytest.raises(OSError, match="injected EIO"):
        s.compact("t", force=True)
    assert temp_files(lg.directory) == []
    # Groups [0, 10) and [10, 20) were swapped in (their keys all recur later: empty now);
    # [20, 30) and everything after it are as they were.
    assert records(lg) == [r for r in pre if r[0] >= 20]
    assert lg.verify() == []
    monkeypatch.undo()
    assert len(s.compact("t", force=True)) == 1


def test_each_swap_is_durable_before_the_next_one_and_the_round_end(stores, monkeypatch):
    """The partition directory's fsync after a swap (REF §2.2 step 4) runs on the flusher's
    threads while the next group is filtered, and has ended before the next swap starts and
    before the round returns."""
    s, lg = _grouped_store(stores)
    events = []
    real_fsync = os.fsync
    directory = os.path.basename(lg.directory)

    def fsync(fd):
        path = _fd_path(fd)
        real_fsync(fd)
        if os.path.basename(path) == directory:
            events.append(("dir synced", threading.current_thread().name))
    monkeypatch.setattr(flusher.os, "fsync", fsync)
    real_swap = PartitionLog.replace_segments

    def swap(self, new, old, **kw):
        events.append(("swap", new[0].base_offset))
        return real_swap(self, new, old, **kw)
    monkeypatch.setattr(PartitionLog, "replace_segments", swap)
    s.compact("t", force=True)
    events.append(("returned", None))
    swaps = [i for i, e in enumerate(events) if e[0] == "swap"]
    assert [events[i][1] for i in swaps] == [0, 10, 20, 30]
    for i, j in zip(swaps, swaps[1:] + [events.index(("returned", None))]):
        synced_between = [e for e in events[i + 1:j] if e[0] == "dir synced"]
        assert synced_between, (events[i], events[j])
        assert synced_between[0][1].startswith("segstore-flusher")
