"""Adopting files of encoded v2 batches as new segments (``PartitionLog.adopt_segment_files``).

An append copies, CRC-checks and writes every byte. A staged file that already holds whole v2
batches (a Spark task's output, design §1.9) can instead become a segment itself: only each
batch's 12-byte baseOffset/leader-epoch field is rewritten (outside the CRC), the file is
fdatasynced, it gets its indexes, and it is renamed into the partition directory. The cost is
O(batches) plus the writeback of the file's dirty pages, which an append pays too.

Steps for a run of files, under the log's lock (``adopt_hook(step)`` is called after each, for
crash tests):

1. ``checked``  - each file is scanned (sizes, magic 2, CRCs unless the caller vouches for the
   bytes, ``max.message.bytes``); before the lock, since it does not depend on the log.
2. ``offsets``  - each batch's baseOffset is set so that offsets continue from the log end
   offset, file after file (leader epoch 0, as appends write), with one pwrite per batch
   (``_core.write_base_offsets``: a store through a shared map would dirty whole page-cache
   folios, which the fdatasync would then write back whole), producer state validates the
   batches, and each file is fdatasynced (its length did not change, so fdatasync is enough).
3. ``sealed``   - the active segment is sealed (final time-index entry, trimmed indexes) and the
   log flushed up to its end, as a roll does; an empty active segment is replaced instead.
4. ``moved``    - each file is renamed ``<base offset>.log.cleaned`` in the partition directory.
5. ``indexed``  - each file's ``.index.cleaned`` and ``.timeindex.cleaned`` are written from
   the batch headers (what a sealed segment's hold: the sparse rule's entries and the final
   time-index entry; the last file's stay preallocated for appends) and fsynced.
6. ``renamed``  - the ``.cleaned`` suffixes are dropped, file by file (log first), then the
   directory is fsynced, once for the run.
7. ``published``- the segments join the log's snapshot state, producer state replays their
   headers, and the recovery point moves to the new log end (everything is on disk).

Crash safety comes from the loader: ``.cleaned`` files are deleted when a partition is opened
(they are what an unfinished cleaner round leaves, and nothing else at or above the log end
offset uses that suffix), so a crash before step 6 leaves no adopted segment; a log file that
carries its final name is whole and fsynced, and missing or stale index files are rebuilt by the
loader (a missing ``.index`` triggers recovery of the segment). With one file, a crash leaves no
adopted segment or a whole one. With several, the renames of step 6 share one directory fsync,
and POSIX does not order renames that are not yet durable: a crash before that fsync can keep any
of the run's segments, possibly with a gap where a lost one was. The Spark commit, which adopts
runs, rolls every partition of an interrupted commit back to its manifest offset, so only whole
commits survive either way (docs/spark.md); a caller that wants "a prefix or nothing" adopts
one file per call. A commit that crashed after step 6 is rolled back by its manifest like an
append (``truncate_to`` cuts adopted segments too).

Where adoption does not apply, the file is appended instead (copying, chunk by chunk): when it
is larger than ``segment.bytes`` or than a segment's 2^31 relative offsets, when the topic stamps
``LogAppendTime`` (the CRC must be recomputed), or when the file lives on another filesystem.
Either way the file is consumed (renamed or deleted) on success.
"""

from __future__ import annotations

import mmap
import os
from collections import abc
from typing import TYPE_CHECKING, Optional

import numpy as np

from . import _core, log_validator
from .checkpoint import fsync_dir
from .errors import (CorruptRecordError, InvalidArgumentError, InvalidRecordError,
                     RecordTooLargeError)
from .producer_snapshots import take_snapshot
from .producer_state import has_producer_batches
from .segment import (CLEANED_SUFFIX, LOG_SUFFIX, MAX_RELATIVE_OFFSET, LogSegment,
                      sealed_index_entries, segment_paths)
from .segment_files import read_map

if TYPE_CHECKING:  # log.py imports this module
    from .log import AppendInfo

APPEND_CHUNK_BYTES = 64 << 20  # staged bytes handed to one append_records call (fallback)

# Tests set this to a callable(step) to crash an adoption after a step.
adopt_hook = None


def _step(name: str) -> None:
    if adopt_hook is not None:
        adopt_hook(name)


def _scan(buf, path: str, config, validate_crc: bool) -> np.ndarray:
    """Batch headers of a whole-batch v2 file, or a typed error."""
    res = _core.scan_batches(buf, validate_crc=validate_crc, strict=True, file=path)
    b = res.batches
    if res.torn or res.valid_end != len(buf):
        raise CorruptRecordError(f"{path} ends with an incomplete batch "
                                 f"({res.valid_end} of {len(buf)} bytes are whole batches)",
                                 file=path)
    if not len(b):
        raise InvalidRecordError(f"{path} holds no record batch")
    if (b["magic"] != 2).any():
        raise InvalidRecordError(f"{path}: only record batch v2 (magic 2) can be adopted")
    sizes = b["size"].astype(np.int64)
    too_big = sizes > config.max_message_bytes
    if too_big.any():
        raise RecordTooLargeError(
            f"batch of {int(sizes[too_big][0])} bytes in {path} exceeds max.message.bytes="
            f"{config.max_message_bytes}")
    return b


def rebase(batches: np.ndarray, base_offset: int) -> np.ndarray:
    """``batches`` (headers) with base and last offsets made consecutive from ``base_offset``,
    as adoption rewrites them (a copy)."""
    out = batches.copy()
    counts = (batches["last_offset"] - batches["base_offset"] + 1).astype(np.int64)
    new_base = base_offset + np.concatenate(([0], np.cumsum(counts)[:-1]))
    out["last_offset"] = new_base + counts - 1
    out["base_offset"] = new_base
    return out


class _Staged:
    """One file being adopted: descriptor, shared writable map, batch headers."""

    __slots__ = ("path", "fd", "mm", "size", "dev", "batches", "base")

    def __init__(self, lg, path: str, config, validate_crc: bool):
        self.path = path
        self.mm: Optional[mmap.mmap] = None
        self.fd = os.open(path, os.O_RDWR)
        try:
            st = os.fstat(self.fd)
            self.size, self.dev = st.st_size, st.st_dev
            if self.size == 0:
                raise InvalidRecordError(f"{path} is empty: nothing to adopt")
            # Read only: baseOffsets are rewritten through the descriptor (step 2). The file
            # becomes a segment: its pages, if read in from disk here, should be huge folios
            # like those of every segment's read map.
            self.mm = read_map(self.fd, self.size)
            self.batches = _scan(self.mm, path, config, validate_crc)
            if validate_crc:  # bytes the caller vouches for are not walked record by record
                log_validator.check_encoded_keys(lg, self.mm, self.batches, path)
        except BaseException:
            self.close()
            raise
        self.base = -1

    @property
    def span(self) -> int:
        """Offsets the file's batches take."""
        b = self.batches
        return int((b["last_offset"] - b["base_offset"] + 1).sum())

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def adoption_paths(lg, paths) -> list:
    """``paths`` as a list, checked before any file is opened: a non-empty list of distinct
    paths (str, bytes or os.PathLike), none of them inside a partition directory of the
    store (a segment of this log or another would be renamed into this one with its offsets
    rewritten, its own log losing it); InvalidArgumentError otherwise."""
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, abc.Iterable):
        raise InvalidArgumentError(f"paths must be a list of file paths, not "
                                   f"{type(paths).__name__} (adopt_segment_file takes one)")
    paths = list(paths)
    if not paths:
        raise InvalidArgumentError("adopt_segment_files needs at least one file")
    root = os.path.realpath(os.path.dirname(lg.directory))
    seen = set()
    for p in paths:
        if not isinstance(p, (str, bytes, os.PathLike)):
            raise InvalidArgumentError(f"a file to adopt is a str, bytes or os.PathLike path, "
                                       f"not {type(p).__name__}")
        real = os.path.realpath(p)
        if isinstance(real, bytes):
            real = os.fsdecode(real)
        if os.path.dirname(os.path.dirname(real)) == root:
            raise InvalidArgumentError(f"{os.fsdecode(p)} is in a partition directory of the "
                                       f"store: only staged files can be adopted")
        if real in seen:
            raise InvalidArgumentError(f"{os.fsdecode(p)} is given twice")
        seen.add(real)
    return paths


def adopt_files(lg, paths, validate_crc: bool = True) -> "AppendInfo":
    """Adopt ``paths`` in order into the writable log ``lg`` (see the module docstring); one
    AppendInfo for them all (their offsets are contiguous). ``validate_crc=False`` walks the
    batch headers only: for bytes the caller knows to be the ones it wrote."""
    config = lg.config
    staged = []
    try:
        for path in paths:  # every file is checked before the log changes
            staged.append(_Staged(lg, path, config, validate_crc))
        _step("checked")
        dev = os.stat(lg.directory).st_dev
        infos = []
        with lg._lock, lg._going_offline_on_io_error():  # one contiguous range of offsets
            lg._check_writable()
            run: list = []
            for s in staged:
                if (s.size > config.segment_bytes or s.span - 1 > MAX_RELATIVE_OFFSET
                        or config.message_timestamp_type == "LogAppendTime" or s.dev != dev):
                    if run:
                        infos.append(_adopt_run(lg, run))
                        run = []
                    infos.append(_append_instead(lg, s))
                    continue
                if run and has_producer_batches(s.batches):
                    # Producer state validates a file against the state the files before it
                    # leave, which exists only once they are published.
                    infos.append(_adopt_run(lg, run))
                    run = []
                run.append(s)
            if run:
                infos.append(_adopt_run(lg, run))
    finally:
        for s in staged:
            s.close()
    from .log import AppendInfo
    return AppendInfo(infos[0].first_offset, infos[-1].last_offset,
                      max(i.max_timestamp for i in infos), sum(i.num_records for i in infos),
                      sum(i.size_bytes for i in infos))


def _adopt_run(lg, run: list):
    """Steps 2-7 for files adopted together (under the lock)."""
    base = lg._state.log_end_offset
    for s in run:
        s.base = base
        rebased = rebase(s.batches, base)
        _core.write_base_offsets(s.fd, np.ascontiguousarray(rebased["position"]),
                                 np.ascontiguousarray(rebased["size"]),
                                 np.ascontiguousarray(rebased["base_offset"]), 0, file=s.path)
        s.batches = rebased
        lg.producer_state.validate(s.mm, s.batches)  # fenced epochs, transaction state
        base = int(rebased["last_offset"][-1]) + 1
    for s in run:
        os.fdatasync(s.fd)
    _step("offsets")
    return _install(lg, run)


def _install(lg, run: list):
    """Steps 3-7 (under the lock): seal, move, index, rename, publish."""
    from .log import AppendInfo, _State

    config = lg.config
    st = lg._state
    leo = st.log_end_offset
    active = st.segments[-1]
    replace_active = active.size == 0
    if not replace_active:
        active.on_become_inactive()
        active.release_files()  # sealed: reopened lazily
    lg._flush_locked(leo)  # what precedes the adopted data is on disk before it appears
    _step("sealed")
    segs: list = []
    try:
        for s in run:
            paths = segment_paths(lg.directory, s.base, CLEANED_SUFFIX)
            for p in paths.values():
                try:
                    os.unlink(p)  # leftovers of an earlier crash the loader has not seen yet
                except FileNotFoundError:
                    pass
            os.rename(s.path, paths[LOG_SUFFIX])
            segs.append(LogSegment(lg.directory, s.base, config, lg.clock, suffix=CLEANED_SUFFIX))
        _step("moved")
        for i, (s, seg) in enumerate(zip(run, segs)):
            built = sealed_index_entries(s.batches, s.base, config.index_interval_bytes)
            seg.adopt_indexes(s.batches, built, active=i == len(run) - 1)
        _step("indexed")
    except BaseException:
        for s, seg in zip(run, segs):
            seg.delete_files()
        for s in run[len(segs):]:
            for p in segment_paths(lg.directory, s.base, CLEANED_SUFFIX).values():
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        raise
    kept = st.segments
    if replace_active:
        kept = kept[:-1]
        active.delete_files()  # an empty segment at the log end: replaced (KAFKA-6388)
    try:
        for seg in segs:
            seg.change_file_suffixes(CLEANED_SUFFIX, "")
        fsync_dir(lg.directory)
        _step("renamed")
    except BaseException:
        # Keep the in-memory log what a reopen would find: the adopted segments whose log file
        # carries its final name (whole and fsynced; renamed in order, so a prefix), else what
        # was there before.
        done = [seg for seg in segs
                if seg.log_path == segment_paths(lg.directory, seg.base_offset)[LOG_SUFFIX]]
        for seg in segs[len(done):]:
            seg.delete_files()
        if done:
            _publish(lg, run[:len(done)], done, kept, _State)
        elif replace_active:
            fresh = LogSegment(lg.directory, leo, config, lg.clock,
                               preallocate=config.preallocate)
            lg._state = _State(kept + (fresh,), st.log_start_offset, st.log_end_offset)
        raise
    _publish(lg, run, segs, kept, _State)
    _step("published")
    first, last = run[0].batches, run[-1].batches
    return AppendInfo(int(first["base_offset"][0]), int(last["last_offset"][-1]),
                      max(int(s.batches["max_timestamp"].max()) for s in run),
                      sum(int(s.batches["records_count"].sum()) for s in run),
                      sum(s.size for s in run))


def _publish(lg, run: list, segs: list, kept: tuple, _State) -> None:
    st = lg._state
    new_leo = int(run[-1].batches["last_offset"][-1]) + 1
    lg._state = _State(kept + tuple(segs), st.log_start_offset, new_leo)
    txn_indexes = False
    for s, seg in zip(run, segs):
        if seg is segs[-1]:
            # As a roll would: the state at the new active segment's base. Not synced (a Spark
            # commit's cost); it is durable by the next roll, close or OS write-back, and a
            # snapshot lost to a crash only makes the next open replay more.
            take_snapshot(lg.producer_state, lg.directory, seg.base_offset, sync=False)
        lg.producer_state.update(s.mm, s.batches, seg)  # ABORT markers go to seg's .txnindex
        if seg._txn_index is not None and seg.txn_index.exists:  # aborted transactions in it
            seg.txn_index.flush()
            txn_indexes = True
    if txn_indexes:
        fsync_dir(lg.directory)
    # Everything up to the old end was flushed in step 3 and the segments are synced.
    lg.recovery_point = max(lg.recovery_point, new_leo)
    lg.last_flush_ms = lg.clock()


def _append_instead(lg, s: _Staged):
    """The copying path: append the file's batches in chunks, then delete the file."""
    from .log import AppendInfo

    ends = (s.batches["position"] + s.batches["size"]).tolist()
    start, first, last, records = 0, None, None, 0
    max_ts = -1
    for i, end in enumerate(ends):
        if end - start >= APPEND_CHUNK_BYTES or i == len(ends) - 1:
            view = memoryview(s.mm)[start:end]
            try:
                info = lg.append_records(view)
            finally:
                view.release()
            first = info.first_offset if first is None else first
            last = info.last_offset
            records += info.num_records
            max_ts = max(max_ts, info.max_timestamp)
            start = end
    os.unlink(s.path)
    return AppendInfo(first, last, max_ts, records, s.size)
