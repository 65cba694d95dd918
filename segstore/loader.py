"""Opening a partition directory: Kafka's LogLoader phases (REF §4.2).

Temp files first (``.deleted`` removed, ``.swap`` at or above the lowest ``.cleaned`` discarded,
``.cleaned`` removed), then interrupted swaps completed, orphan indexes removed, segments opened,
and segments recovered: every segment after an unclean shutdown from the recovery point on, and
any segment whose index files are missing or fail the sanity check.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .errors import CorruptIndexError
from .segment_files import is_segment_file
from .segment_split import split_overflowed_segments
from .segment import (CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX,
                      TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LogSegment, consistent_prefix)

log = logging.getLogger("segstore.loader")
_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


@dataclass
class LoadResult:
    """What loading found: the open segments (sorted) and what recovery did."""

    segments: list
    recovered_segments: int = 0
    truncated_bytes: int = 0
    deleted_segments: list = field(default_factory=list)
    # Base offsets of recovered segments: their transaction index was reset and is rebuilt by
    # the producer-state replay of the log (REF §4.3 step 2).
    txn_rebuild: set = field(default_factory=set)
    # The log end offset: the last segment's headers are walked anyway, so the log and its
    # producer-state replay need not look it up again.
    log_end_offset: int = 0
    # The directory's names before loading: the producer-state load lists its snapshots from
    # them (the loader touches no ``.snapshot`` file).
    listing: list = field(default_factory=list)


def _base_offset(name: str) -> int:
    return int(name.split(".", 1)[0])


def _segment_names(directory: str, listing: list) -> list:
    """The segment file names of ``listing`` (the partition directory's, sorted); a stray
    file with a segment suffix (``foo.log``) is left alone, with a warning."""
    names = []
    for n in listing:
        if is_segment_file(n):
            names.append(n)
        elif n.endswith((LOG_SUFFIX, SWAP_SUFFIX, CLEANED_SUFFIX) + _INDEX_SUFFIXES):
            log.warning("ignoring %s in %s: not a segment file name (20 digits, then the "
                        "suffix)", n, directory)
    return names


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def clean_temp_files(directory: str, listing: list) -> list:
    """Phases 1-4: drop deleted/cleaned leftovers and finish interrupted swaps. ``listing``
    is the directory's, sorted; returns it as it is after them (listed again only when there
    was something to do: a large store opens thousands of directories)."""
    leftovers = [n for n in listing
                 if (n.endswith(DELETED_SUFFIX) and not n.endswith(".checkpoint.deleted"))
                 or n.endswith(".truncating")]  # a copy-on-write truncation that never finished
    for n in leftovers:
        _remove(os.path.join(directory, n))
    names = _segment_names(directory, listing)
    cleaned = [n for n in names if n.endswith(CLEANED_SUFFIX)]
    swaps = [n for n in names if n.endswith(SWAP_SUFFIX)]
    min_cleaned = min((_base_offset(n) for n in cleaned), default=None)
    if min_cleaned is not None:
        for n in list(swaps):
            if _base_offset(n) >= min_cleaned:  # part of a replace that never finished step 2
                _remove(os.path.join(directory, n))
                swaps.remove(n)
    if not leftovers and not cleaned and not swaps:
        return listing
    for n in cleaned:
        _remove(os.path.join(directory, n))
    log_swaps = [n for n in swaps if n.endswith(LOG_SUFFIX + SWAP_SUFFIX)]
    if log_swaps:
        from ._core import scan_batches
        lo = min(_base_offset(n) for n in log_swaps)
        hi = lo
        for n in log_swaps:
            with open(os.path.join(directory, n), "rb") as f:
                data = f.read()
            b = scan_batches(data, raise_on_corrupt=False).batches
            hi = max(hi, int(b["last_offset"][-1]) + 1 if len(b) else _base_offset(n))
        for n in os.listdir(directory):
            if not n.endswith(SWAP_SUFFIX) and is_segment_file(n) and lo <= _base_offset(n) < hi:
                _remove(os.path.join(directory, n))
    for n in swaps:
        p = os.path.join(directory, n)
        if os.path.exists(p):
            os.replace(p, p[:-len(SWAP_SUFFIX)])
    return sorted(os.listdir(directory))


def load_segments(directory: str, config, clock, *, recovery_point: int,
                  had_clean_shutdown: bool, log_start_offset: int) -> LoadResult:
    """Open (and where needed recover) every segment of a writable partition directory."""
    listing = sorted(os.listdir(directory))
    names = _segment_names(directory, clean_temp_files(directory, listing))
    logs = sorted(_base_offset(n) for n in names if n.endswith(LOG_SUFFIX))
    log_set = set(logs)
    for n in names:
        if n.endswith(_INDEX_SUFFIXES) and _base_offset(n) not in log_set:
            _remove(os.path.join(directory, n))  # orphaned index
    result = LoadResult(segments=[], listing=listing)
    early_lost: dict[int, int] = {}
    segments = [LogSegment(directory, base, config, clock) for base in logs]
    # The last segment's headers are walked once, for the split's check and for the header
    # check below (appends go there).
    walked = segments[-1] if segments else None
    walk = walked.scan(0, walked.size, raise_on_corrupt=False) if walked else None
    # Phase 6 first: a legacy segment whose offsets overflow is split, never cut (REF §4.4).
    segments = split_overflowed_segments(segments, config, clock,
                                         walk.batches if walk else None)
    if len(segments) != len(logs):
        names = _segment_names(directory, sorted(os.listdir(directory)))
    for seg in segments:
        base = seg.base_offset
        index_missing = not os.path.exists(os.path.join(directory, f"{base:020d}{INDEX_SUFFIX}"))
        # Index files that exist are checked when first used (LogSegment loads them lazily and
        # rebuilds any that fail the check), so opening a large store touches no index. The
        # transaction index is the one Kafka checks here (phase 5); most segments have none.
        bad_txn = f"{base:020d}{TXN_INDEX_SUFFIX}" in names and _txn_index_problem(seg)
        if index_missing or bad_txn:
            lost = recover_segment(seg, config)
            early_lost[base] = lost
            result.truncated_bytes += lost
            result.recovered_segments += 1
            result.txn_rebuild.add(base)
        result.segments.append(seg)
    if not had_clean_shutdown:
        segs = result.segments
        start = 0
        for i, s in enumerate(segs):
            if s.base_offset <= recovery_point:
                start = i
        for i in range(start, len(segs)):
            nxt = segs[i + 1].base_offset if i + 1 < len(segs) else None
            recovered = recover_segment(segs[i], config, nxt)
            result.recovered_segments += 1
            result.txn_rebuild.add(segs[i].base_offset)
            result.truncated_bytes += recovered
            lost = recovered + early_lost.get(segs[i].base_offset, 0)
            if lost > 0:
                for later in segs[i + 1:]:
                    log.warning("deleting %s after an unclean shutdown truncated %s",
                                later.log_path, segs[i].log_path)
                    later.delete_files()
                    result.deleted_segments.append(later.base_offset)
                del segs[i + 1:]
                break
    if result.segments:
        # Appends go to the last segment, so even after a clean shutdown its batch headers are
        # walked (no CRC: cheap) and it is recovered if sizes or offsets do not add up.
        last = result.segments[-1]
        same = last is walked and last.base_offset not in result.txn_rebuild  # not rewritten
        problem, end = _header_problem(last, walk if same else None)
        if problem:
            log.warning("recovering %s: %s", last.log_path, problem)
            result.truncated_bytes += recover_segment(last, config)
            result.recovered_segments += 1
            result.txn_rebuild.add(last.base_offset)
            end = last.read_next_offset()
        if end < log_start_offset:
            for s in result.segments:
                s.delete_files()
            result.segments = []
        result.log_end_offset = end
    if not result.segments:
        result.segments.append(LogSegment(directory, log_start_offset, config, clock,
                                          preallocate=config.preallocate))
        result.log_end_offset = log_start_offset
    result.segments[-1].prepare_for_appends()
    return result


def _txn_index_problem(seg: LogSegment) -> bool:
    try:
        seg.txn_index.sanity_check()
        return False
    except CorruptIndexError as e:
        log.warning("recovering %s: %s", seg.log_path, e)
        return True


def _header_problem(seg: LogSegment, res=None) -> tuple:
    """``(why the segment's batch headers are inconsistent or None, its next offset)``; the
    offset is only meaningful without a problem. ``res``: the walk of them, if made."""
    if res is None:
        res = seg.scan(0, seg.size, raise_on_corrupt=False)
    b = res.batches
    if res.error is not None:
        return res.error, -1
    if res.torn:
        return "incomplete batch at the end", -1
    if consistent_prefix(b, seg.base_offset) < len(b):
        return "offsets outside the segment's range or not increasing", -1
    return None, (int(b["last_offset"][-1]) + 1 if len(b) else seg.base_offset)


def recover_segment(seg: LogSegment, config, next_base: Optional[int] = None) -> int:
    """REF §4.3: keep the CRC-valid prefix, rebuild both indexes; returns bytes removed.

    Batches reaching the next segment's base offset are cut too (overlapping segments). The
    transaction index is emptied: the log's producer-state replay writes it again (it needs the
    transactions left open by earlier segments)."""
    size = os.fstat(seg._fd).st_size
    seg.size = size
    res = seg.scan(0, size, validate_crc=True, raise_on_corrupt=False)
    batches = res.batches
    valid_end = res.valid_end
    keep = consistent_prefix(batches, seg.base_offset)  # offsets are outside the CRC
    if next_base is not None and keep:
        keep = min(keep, int(np.searchsorted(batches["last_offset"][:keep], next_base)))
    if keep < len(batches):
        valid_end = int(batches["position"][keep])
        batches = batches[:keep]
    if res.error is not None:
        log.warning("recovering %s: %s; truncating to %d bytes", seg.log_path, res.error, valid_end)
    seg.rebuild_indexes(batches)
    seg.txn_index.reset()
    lost = seg.truncate_bytes(valid_end)
    # REF §4.3 step 4: recovery trims both indexes to their entries, as a roll does. Left
    # preallocated (the rebuild resets them to segment.index.bytes), every sealed segment
    # recovered after a crash kept two index files of 10 MiB until a clean close, and another
    # crash left them so for the next open (and for a Kafka broker, which reads a whole index
    # file as entries). The active segment's grow again (prepare_for_appends).
    # The final time-index entry goes in now, as Kafka's recover does, not at close: a crash
    # before the close would otherwise leave a sealed segment whose largest timestamp the
    # file does not give (Kafka reads it from that entry). The rebuild left room for it.
    if seg.max_timestamp_so_far >= 0:
        seg.time_index.maybe_append(seg.max_timestamp_so_far, seg.offset_of_max_timestamp,
                                    skip_full_check=True)
    seg.offset_index.trim_to_valid_size()
    seg.time_index.trim_to_valid_size()
    return lost
