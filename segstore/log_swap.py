"""Kafka's segment swap (``LocalLog.replaceSegments``, REF §2.2): cleaned segments replace
old ones so that a crash at any step leaves files the loader completes or rolls back.

Runs under the log's lock and changes its snapshot state; ``PartitionLog.replace_segments``
is the entry point.
"""

from __future__ import annotations

import os
from typing import Optional

from .checkpoint import fsync_dir
from .errors import CleaningAbortedError
from .flusher import PendingFlush
from .log_state import LogState as _State
from .producer_snapshots import delete_snapshots
from .segment import CLEANED_SUFFIX, SWAP_SUFFIX

# Tests set this to a callable(step, base_offset) to crash a swap at each step.
swap_hook = None


def _swap_step(step: str, base_offset: int) -> None:
    if swap_hook is not None:
        swap_hook(step, base_offset)


def replace_segments(lg, new_segments, old_segments, *,
                     expected_truncations: Optional[int] = None,
                     sync_directory: bool = True) -> Optional[PendingFlush]:
    """Swap cleaned segments in for old ones with Kafka's crash-safe protocol (REF §2.2).

    ``new_segments`` are LogSegments written with the ``.cleaned`` suffix. In descending
    base-offset order each is renamed ``.swap`` (from then on it is committed); the old
    segments are renamed ``.deleted`` and queued for deletion; finally the ``.swap`` suffixes
    are dropped. A crash at any point leaves files the loader completes or rolls back.
    With ``expected_truncations`` (the cleaner's view of :attr:`truncations` when it started)
    a truncation since then raises ``CleaningAbortedError`` and nothing is swapped.
    With ``sync_directory=False`` the directory's fsync is started on the flusher's threads
    (segstore/flusher.py) and returned: the swap is durable once it has been waited for.
    """
    new = sorted(new_segments, key=lambda sg: sg.base_offset)
    # An I/O error between the renames leaves the files and the log's state apart: offline.
    with lg._lock, lg._going_offline_on_io_error():
        if expected_truncations is not None and expected_truncations != lg.truncations:
            raise CleaningAbortedError(
                f"{lg.topic}-{lg.partition} was truncated while it was being cleaned")
        # Opened before the first rename: once a segment is renamed .swap it is the
        # log's, and nothing after that may fail for want of a descriptor.
        dir_fd = None if sync_directory else os.open(lg.directory,
                                                     os.O_RDONLY | os.O_DIRECTORY)
        try:
            st = lg._state
            live = {id(sg) for sg in st.segments}
            old = sorted((sg for sg in old_segments if id(sg) in live),
                         key=lambda sg: sg.base_offset)
            for sg in reversed(new):
                sg.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
                _swap_step("swap", sg.base_offset)
            new_bases = {sg.base_offset for sg in new}
            gone = {id(sg) for sg in old}
            kept = [sg for sg in st.segments
                    if id(sg) not in gone and sg.base_offset not in new_bases]
            segs = tuple(sorted(kept + new, key=lambda sg: sg.base_offset))
            lg._state = _State(segs, st.log_start_offset, st.log_end_offset)
            for sg in old:
                lg._retire(sg)
                _swap_step("deleted", sg.base_offset)
            # Kafka deletes the producer snapshots of the replaced segments' bases.
            bases = {sg.base_offset for sg in segs}
            delete_snapshots(lg.directory, [sg.base_offset for sg in old
                                            if sg.base_offset not in bases])
            for sg in new:
                sg.change_file_suffixes(SWAP_SUFFIX, "")
                _swap_step("renamed", sg.base_offset)
        except BaseException:
            if dir_fd is not None:
                os.close(dir_fd)
            raise
        if dir_fd is not None:
            return PendingFlush([dir_fd])
        fsync_dir(lg.directory)
        return None
