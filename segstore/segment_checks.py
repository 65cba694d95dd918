"""Checking a segment against the rules its files keep (Kafka's LogSegment.sanityCheck and the
checks of recovery, REF §4.3, made stronger).

A segment's batches must have offsets it can hold, growing from batch to batch; an index entry
is trusted only when the batch at its position holds its offset. ``verify_segment`` reports every
breach of these rules, and of the CRCs, as a list of :class:`Problem`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from . import _core
from .errors import CorruptIndexError

MAX_RELATIVE_OFFSET = 0x7FFFFFFF


class Problem(NamedTuple):
    """One finding of ``verify()``: which file, where, and what is wrong."""

    file: str
    position: int
    message: str

    def __str__(self) -> str:
        return f"{self.file} at position {self.position}: {self.message}"


def first_offsets(batches: np.ndarray) -> np.ndarray:
    """Each batch's first offset; a legacy compressed wrapper does not tell its first inner
    offset (scanned as -1), so its last offset stands in for it."""
    return np.where((batches["magic"] < 2) & (batches["base_offset"] < 0),
                    batches["last_offset"], batches["base_offset"])


def consistent_prefix(batches: np.ndarray, base_offset: int) -> int:
    """How many leading batches have offsets a segment at ``base_offset`` can hold: inside its
    32-bit relative range and growing from batch to batch (baseOffset is outside the CRC)."""
    if not len(batches):
        return 0
    last = batches["last_offset"]
    first = first_offsets(batches)
    rel = last - base_offset
    bad = (rel < 0) | (rel > MAX_RELATIVE_OFFSET) | (first < base_offset)
    bad[1:] |= first[1:] <= last[:-1]
    return int(bad.argmax()) if bad.any() else len(batches)


def entry_points_at_batch(buf, size: int, offset: int, position: int) -> bool:
    """Whether the batch at ``position`` of ``buf[:size]`` holds ``offset``: the test an
    offset-index entry must pass before it is used."""
    b = _core.scan_batches(buf, position, size, max_batches=1, raise_on_corrupt=False).batches
    return bool(len(b)) and bool(b["base_offset"][0] <= offset <= b["last_offset"][0])


def sanity_check_indexes(segment, offset_index, time_index) -> None:
    """Raise CorruptIndexError unless both freshly loaded indexes of ``segment`` can be trusted.

    Stronger than Kafka's check (KAFKA-10207): untrimmed or zero-padded files, disorder and
    entries past the log all fail, so such an index is rebuilt from the log, never trusted.
    """
    oi, ti = offset_index, time_index
    if oi.entries * oi.entry_size != oi.file_size or ti.entries * 12 != ti.file_size:
        raise CorruptIndexError("index file not trimmed to its entries")
    oi.sanity_check(segment.size)
    ti.sanity_check()
    if oi.entries:
        off, pos = oi.entry(oi.entries - 1)
        if not entry_points_at_batch(segment.buffer(segment.size), segment.size, off, pos):
            raise CorruptIndexError(f"last entry ({off}, {pos}) does not point at its batch")


def verify_segment(segment, size: int, next_base_offset: Optional[int] = None) -> list:
    """The body of ``LogSegment.verify`` over the first ``size`` bytes of its log file."""
    problems = []
    log_path = segment.log_path
    res = _core.scan_batches(segment.buffer(size) if size else b"", 0, size, validate_crc=True,
                             raise_on_corrupt=False, file=log_path)
    if res.error is not None:
        problems.append(Problem(log_path, res.error.position, res.error.reason))
    elif res.torn:
        problems.append(Problem(log_path, res.valid_end, "incomplete batch at the end of the file"))
    b = res.batches
    if len(b):
        first = first_offsets(b)
        bad = np.nonzero(first[1:] <= b["last_offset"][:-1])[0]
        for i in bad[:10]:
            problems.append(Problem(log_path, int(b["position"][i + 1]),
                                    "offsets do not increase from the previous batch"))
        if int(first[0]) < segment.base_offset:
            problems.append(Problem(log_path, 0, "batch below the segment's base offset"))
        over = np.nonzero(b["last_offset"] - segment.base_offset > MAX_RELATIVE_OFFSET)[0]
        if len(over):  # a legacy segment a writable open would split (segment_split.py)
            problems.append(Problem(log_path, int(b["position"][over[0]]),
                                    "offsets past the segment's 32-bit relative range"))
        if next_base_offset is not None and int(b["last_offset"][-1]) >= next_base_offset:
            problems.append(Problem(log_path, int(b["position"][-1]),
                                    "batch reaches into the next segment's offsets"))
        problems += _offset_index_problems(segment, b, res.valid_end)
    for index in (segment.offset_index, segment.time_index):
        bad = _core.index_check(index._buffer(), index.entries, index._time)
        if bad >= 0:
            problems.append(Problem(index.path, bad * index.entry_size,
                                    "entry out of order (damage or zero padding)"))
        elif next_base_offset is not None:  # only the active segment's index may be in flux
            problem = _index_tail_problem(index)
            if problem is not None:
                problems.append(problem)
    try:  # whole version-0 entries, none below the base offset
        segment.txn_index.sanity_check()
    except CorruptIndexError as e:
        problems.append(Problem(segment.txn_index.path, 0, str(e)))
    times = segment.time_index.entries_array()
    if len(times) and len(b):
        offs = times["rel"].astype(np.int64) + segment.base_offset
        top = int(b["last_offset"][-1]) if res.error is None else np.iinfo(np.int64).max
        out = np.nonzero((offs < segment.base_offset) | (offs > top))[0]
        for i in out[:10]:
            problems.append(Problem(segment.time_index.path, int(i) * 12,
                                    f"entry names offset {int(offs[i])} outside the segment"))
    return problems


def _index_tail_problem(index) -> Optional[Problem]:
    """What follows a sealed index's valid entries, if it is damage. Zeros are not: they are
    preallocation or zero padding, where readers stop and which a writable open trims or
    rebuilds. A partial entry or other bytes are (a reader ignores them; a writable open
    rebuilds the index)."""
    used = index.entries * index.entry_size
    if index.file_size == used:
        return None
    try:
        with open(index.path, "rb") as f:
            f.seek(used)
            tail = f.read()
    except FileNotFoundError:  # replaced by a writer's swap meanwhile
        return None
    partial = len(tail) % index.entry_size
    if partial:
        return Problem(index.path, used + len(tail) - partial,
                       f"the file ends inside an entry ({used + len(tail)} bytes is not a "
                       f"multiple of {index.entry_size}); the writer rebuilds the index when it "
                       "first uses it, 'segstore recover' at once")
    if any(tail):
        return Problem(index.path, used,
                       f"the {len(tail)} bytes after the {index.entries} valid entries are "
                       "not ordered entries (damage); the writer rebuilds the index when it first "
                       "uses it, 'segstore recover' at once")
    return None


def _offset_index_problems(segment, b: np.ndarray, valid_end: int) -> list:
    # Every entry decoded with numpy: no per-entry Python work on large indexes.
    index = segment.offset_index
    entries = index.entries_array()
    # Only entries inside the readable prefix: past a corrupt batch nothing can be checked.
    entries = entries[entries["pos"].astype(np.int64) < valid_end]
    if not len(entries):
        return []
    offs = entries["rel"].astype(np.int64) + segment.base_offset
    pos = entries["pos"].astype(np.int64)
    at = np.searchsorted(b["position"], pos)
    ok = (at < len(b))
    ok[ok] &= b["position"][at[ok]] == pos[ok]
    ok[ok] &= (b["base_offset"][at[ok]] <= offs[ok]) & (offs[ok] <= b["last_offset"][at[ok]])
    return [Problem(index.path, int(i) * 8, f"entry ({int(offs[i])}, {int(pos[i])}) does not "
                    "point at the batch holding that offset") for i in np.nonzero(~ok)[0][:10]]
