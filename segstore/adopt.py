"""Adopting a file of encoded v2 batches as a new segment (``PartitionLog.adopt_segment_file``).

An append copies, CRC-checks and writes every byte. A staged file that already holds whole v2
batches (a Spark task's output, design §1.9) can instead become a segment itself: only each
batch's 12-byte baseOffset/leader-epoch field is rewritten (outside the CRC), the file is fsynced,
its indexes are built from the batch headers, and it is renamed into the partition directory.
The cost is O(batches) plus the writeback of the file's dirty pages, which an append pays too.

Steps, under the log's lock (``adopt_hook(step)`` is called after each, for crash tests):

1. ``checked``  - the file is scanned (sizes, magic 2, CRCs, ``max.message.bytes``); before
   the lock, since it does not depend on the log.
2. ``offsets``  - each batch's baseOffset is set so offsets continue from the log end offset
   (leader epoch 0, as appends write), producer state validates the batches, and the file is
   fsynced.
3. ``sealed``   - the active segment is sealed (final time-index entry, trimmed indexes) and the
   log flushed up to its end, as a roll does; an empty active segment is replaced instead.
4. ``moved``    - the file is renamed ``<LEO>.log.cleaned`` in the partition directory.
5. ``indexed``  - ``<LEO>.index.cleaned`` and ``.timeindex.cleaned`` are built with the sparse
   rule (``LogSegment.rebuild_indexes``) and fsynced.
6. ``renamed``  - the ``.cleaned`` suffixes are dropped (log first) and the directory is fsynced.
7. ``published``- the segment joins the log's snapshot state, producer state replays its
   headers, and the recovery point moves to the new log end (everything is on disk).

Crash safety comes from the loader: ``.cleaned`` files are deleted when a partition is opened
(they are what an unfinished cleaner round leaves, and nothing else at or above the log end
offset uses that suffix), so a crash before step 6 leaves no adopted segment; after the log's
rename the segment is whole and fsynced, and missing or stale index files are rebuilt by the
loader (a missing ``.index`` triggers recovery of the segment). A commit that crashed after
step 6 is rolled back by its manifest like an append (``truncate_to`` cuts adopted segments too).

Where adoption does not apply, the file is appended instead (copying, chunk by chunk): when it
is larger than ``segment.bytes`` or than a segment's 2^31 relative offsets, when the topic stamps
``LogAppendTime`` (the CRC must be recomputed), or when the file lives on another filesystem.
Either way the file is consumed (renamed or deleted) on success.
"""

from __future__ import annotations

import mmap
import os
from typing import Optional

import numpy as np

from . import _core
from .checkpoint import fsync_dir
from .errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from .segment import CLEANED_SUFFIX, MAX_RELATIVE_OFFSET, LogSegment, segment_paths

APPEND_CHUNK_BYTES = 64 << 20  # staged bytes handed to one append_records call (fallback)

# Whether adoption checks CRCs. Spark tasks stage batches segstore's own encoder produced, but
# the files sat on disk between the tasks and the commit, and adopted bytes are never checked
# again. Measured on the project's machine: the header walk of a 17 MB file takes 0.25 ms,
# with CRC-32C 1.5 ms, against about 17 ms for the whole adoption (mostly the fsync), so the
# check stays.
VALIDATE_CRC = True

# Tests set this to a callable(step) to crash an adoption after a step.
adopt_hook = None


def _step(name: str) -> None:
    if adopt_hook is not None:
        adopt_hook(name)


def _scan(buf, path: str, config) -> np.ndarray:
    """Batch headers of a whole-batch v2 file, or a typed error."""
    res = _core.scan_batches(buf, validate_crc=VALIDATE_CRC, strict=True, file=path)
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


def adopt_file(lg, path: str):
    """Adopt ``path`` into the writable log ``lg`` (see the module docstring); an AppendInfo."""
    from .log import AppendInfo, _State

    config = lg.config
    fd = os.open(path, os.O_RDWR)
    mm: Optional[mmap.mmap] = None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size == 0:
            raise InvalidRecordError(f"{path} is empty: nothing to adopt")
        mm = mmap.mmap(fd, size)  # shared and writable: baseOffsets are rewritten through it
        batches = _scan(mm, path, config)
        _step("checked")
        counts = (batches["last_offset"] - batches["base_offset"] + 1).astype(np.int64)
        span = int(counts.sum())
        if (size > config.segment_bytes or span - 1 > MAX_RELATIVE_OFFSET
                or config.message_timestamp_type == "LogAppendTime"
                or st.st_dev != os.stat(lg.directory).st_dev):
            return _append_instead(lg, mm, batches, path)
        with lg._lock:
            lg._check_writable()
            leo = lg._state.log_end_offset
            new_base = leo + np.concatenate(([0], np.cumsum(counts)[:-1]))
            positions = batches["position"].tolist()
            for pos, base in zip(positions, new_base.tolist()):
                _core.set_base_offset(mm, pos, base, 0)
            batches["last_offset"] = new_base + (batches["last_offset"] - batches["base_offset"])
            batches["base_offset"] = new_base
            lg.producer_state.validate(mm, batches)  # fenced epochs, transaction state
            mm.flush()
            os.fsync(fd)
            _step("offsets")
            return _install(lg, path, mm, batches, leo, size, AppendInfo, _State)
    finally:
        if mm is not None:
            mm.close()
        os.close(fd)


def _install(lg, path, mm, batches, leo, size, AppendInfo, _State):
    """Steps 3-7 (under the lock): seal, move, index, rename, publish."""
    config = lg.config
    st = lg._state
    active = st.segments[-1]
    replace_active = active.size == 0
    if not replace_active:
        active.on_become_inactive()
        active.release_files()  # sealed: reopened lazily
    lg._flush_locked(leo)  # what precedes the adopted data is on disk before it appears
    _step("sealed")
    paths = segment_paths(lg.directory, leo, CLEANED_SUFFIX)
    for p in paths.values():
        try:
            os.unlink(p)  # leftovers of an earlier crash the loader has not seen yet
        except FileNotFoundError:
            pass
    os.rename(path, paths[".log"])
    seg = None
    try:
        _step("moved")
        seg = LogSegment(lg.directory, leo, config, lg.clock, suffix=CLEANED_SUFFIX)
        seg.rebuild_indexes(batches)
        seg.flush()
        _step("indexed")
    except BaseException:
        if seg is not None:
            seg.delete_files()
        else:
            for p in paths.values():
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        raise
    segs = st.segments
    if replace_active:
        segs = segs[:-1]
        active.delete_files()  # an empty segment at the log end: replaced (KAFKA-6388)
    try:
        seg.change_file_suffixes(CLEANED_SUFFIX, "")
        fsync_dir(lg.directory)
        _step("renamed")
    except BaseException:
        # Keep the in-memory log what a reopen would find: the adopted segment once its log
        # file carries its final name (it is whole and fsynced), else what was there before.
        final = segment_paths(lg.directory, leo)[".log"]
        if seg.log_path == final:
            _publish(lg, seg, segs, mm, batches, _State)
        else:
            seg.delete_files()
            if replace_active:
                fresh = LogSegment(lg.directory, leo, config, lg.clock,
                                   preallocate=config.preallocate)
                lg._state = _State(segs + (fresh,), st.log_start_offset, st.log_end_offset)
        raise
    _publish(lg, seg, segs, mm, batches, _State)
    _step("published")
    return AppendInfo(int(batches["base_offset"][0]), int(batches["last_offset"][-1]),
                      int(batches["max_timestamp"].max()), int(batches["records_count"].sum()),
                      size)


def _publish(lg, seg, segs, mm, batches, _State) -> None:
    st = lg._state
    new_leo = int(batches["last_offset"][-1]) + 1
    lg._state = _State(segs + (seg,), st.log_start_offset, new_leo)
    lg.producer_state.update(mm, batches, seg)  # ABORT markers go to seg's .txnindex
    if seg._txn_index is not None and seg.txn_index.exists:  # aborted transactions in it
        seg.txn_index.flush()
        fsync_dir(lg.directory)
    # Everything up to the old end was flushed in step 3 and the segment is fsynced.
    lg.recovery_point = max(lg.recovery_point, new_leo)
    lg.last_flush_ms = lg.clock()


def _append_instead(lg, mm, batches, path):
    """The copying path: append the file's batches in chunks, then delete the file."""
    from .log import AppendInfo

    ends = (batches["position"] + batches["size"]).tolist()
    start, first, last, records = 0, None, None, 0
    max_ts = -1
    with lg._lock:  # one contiguous range of offsets
        for i, end in enumerate(ends):
            if end - start >= APPEND_CHUNK_BYTES or i == len(ends) - 1:
                view = memoryview(mm)[start:end]
                try:
                    info = lg.append_records(view)
                finally:
                    view.release()
                first = info.first_offset if first is None else first
                last = info.last_offset
                records += info.num_records
                max_ts = max(max_ts, info.max_timestamp)
                start = end
    os.unlink(path)
    return AppendInfo(first, last, max_ts, records, len(mm))
