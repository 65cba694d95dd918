"""Failures around a cleaned segment's fsyncs and swap, and cleaner memory shared between
stores (found in review of the flusher, the in-order swaps and spare_memory): no .cleaned file
or descriptor is left, no descriptor is closed twice, no live segment is deleted, and no map or
buffer serves two rounds at once."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from segstore import flusher
from segstore.cleaner import spare_memory
from segstore.cleaner.cleaner import Cleaner
from segstore.errors import StoreClosedError
from segstore.index import OffsetIndex
from test_cleaner_service import _grouped_store, stores, temp_files  # noqa: F401
from test_spare_memory import _compacted_store



def _open_fds_to(suffix: str) -> list:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if suffix in target:
            out.append(target)
    return out


# write_unsealed: a failure to start the fsyncs deletes the segment.
def test_start_flush_error_leaves_no_cleaned_files(stores, monkeypatch):
    s, lg = _grouped_store(stores)
    real = OffsetIndex.open_for_sync

    def emfile(self):
        if self.path.endswith(".cleaned"):
            raise OSError(errno.EMFILE, "Too many open files (injected)")
        return real(self)
    monkeypatch.setattr(OffsetIndex, "open_for_sync", emfile)
    with pytest.raises(OSError, match="injected"):
        s.compact("t", force=True)
    leaked = _open_fds_to(".cleaned")
    assert temp_files(lg.directory) == [], temp_files(lg.directory)
    assert leaked == [], leaked


# InOrderSwaps: an error from the previous swap's directory fsync deletes the segment that
# was to be swapped in next.
def test_failed_directory_sync_leaves_no_cleaned_files(stores, monkeypatch):
    s, lg = _grouped_store(stores)
    real = os.fsync
    directory = os.path.realpath(lg.directory)

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == directory:
            raise OSError(errno.EIO, "injected EIO on the directory")
        real(fd)
    monkeypatch.setattr(flusher.os, "fsync", fsync)
    with pytest.raises(OSError, match="injected"):
        s.compact("t", force=True)
    leaked = _open_fds_to(".cleaned")
    assert temp_files(lg.directory) == [], temp_files(lg.directory)
    assert leaked == [], leaked


# PendingFlush: when the pool cannot start a thread, submit() has already queued the work;
# the fsync runs here instead, and the queued item, run later, must not close the number
# again (by then it may belong to another file).
def test_thread_start_failure_does_not_close_a_descriptor_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(flusher, "_pool", None)
    real_start = threading.Thread.start

    def failing_start(self):
        if self.name.startswith("segstore-flusher"):
            raise RuntimeError("can't start new thread")
        return real_start(self)
    monkeypatch.setattr(threading.Thread, "start", failing_start)
    a = os.open(tmp_path / "a", os.O_WRONLY | os.O_CREAT)
    flusher.PendingFlush([a]).wait()           # synced and closed by the fallback
    victim = os.open(tmp_path / "victim", os.O_WRONLY | os.O_CREAT)
    assert victim == a                         # the number is reused at once
    monkeypatch.setattr(threading.Thread, "start", real_start)
    b = os.open(tmp_path / "b", os.O_WRONLY | os.O_CREAT)
    flusher.PendingFlush([b]).wait()           # the pool's first thread runs a's stale item too
    try:
        os.fstat(victim)                       # EBADF: closed by someone else
    finally:
        try:
            os.close(victim)
        except OSError:
            pass


# spare_memory: a store closed while another thread's compact() runs keeps that round's map
# and buffer out of the spare list until the round ends (close() waits for the round, which
# aborts; only then do its map and buffer become spare).
def test_close_during_compact_does_not_share_memory_with_the_next_store(tmp_path, monkeypatch):
    monkeypatch.setattr(spare_memory, "_maps", [])
    monkeypatch.setattr(spare_memory, "_buffers", [])
    s1, _ = _compacted_store(tmp_path / "a")
    built, resume = threading.Event(), threading.Event()
    real_build = Cleaner.build_offset_map
    in_round = {}

    def build(self, lg, *a, **k):
        real_build(self, lg, *a, **k)
        if lg.directory.startswith(str(tmp_path / "a")):
            in_round["map"], in_round["out"], in_round["worker"] = self.offset_map, self._out, self
            built.set()
            resume.wait(10)
    monkeypatch.setattr(Cleaner, "build_offset_map", build)
    errors = []

    def run():
        try:
            s1.compact("t", force=True)
        except BaseException as e:   # noqa: BLE001
            errors.append(e)
    t = threading.Thread(target=run)
    t.start()
    closer = threading.Thread(target=s1.close)
    try:
        assert built.wait(10)
        closer.start()                            # the round in `t` still holds its worker
        for _ in range(1000):
            if s1.cleaner.closing:
                break
            threading.Event().wait(0.01)
        assert s1.cleaner.closing and closer.is_alive()
        spare = [m for _, m in spare_memory._maps] + spare_memory._buffers
        assert not any(x is in_round["map"] or x is in_round["out"] for x in spare), \
            "a running round's map or buffer went to the spare list"
        assert in_round["worker"]._out is not None, "a running round's _out was released"
    finally:
        resume.set()
        t.join(10)
        closer.join(10)
    assert not closer.is_alive()
    assert [type(e) for e in errors] == [StoreClosedError]


# swap_in: an error after the swap committed the segment (renamed it .swap) never deletes
# it: it is the log's.
def test_error_after_the_swap_does_not_delete_the_live_segment(stores, monkeypatch):
    s, lg = _grouped_store(stores)
    import segstore.log_swap as log_mod  # where the swap makes its PendingFlush
    real_pf = log_mod.PendingFlush

    def failing(fds):
        raise OSError(errno.EMFILE, "Too many open files (injected)")
    monkeypatch.setattr(log_mod, "PendingFlush", failing)
    with pytest.raises(OSError, match="injected"):
        s.compact("t", force=True)
    monkeypatch.setattr(log_mod, "PendingFlush", real_pf)
    missing = [seg.log_path for seg in lg.segments if not os.path.exists(seg.log_path)]
    assert missing == [], missing
