"""Splitting a legacy segment whose offsets overflow its 32-bit relative range (Kafka's
``LocalLog.splitOverflowedSegment``, REF §4.4, KAFKA-6264).

Old Kafka versions could write a v0/v1 segment holding offsets more than 2^31 - 1 above its base
offset, which no index entry can express. Kafka splits such a segment when it loads it; so does
segstore: its batches are copied byte for byte into new segments, each based at the first offset
of its first batch and taking batches while their last offsets fit, and the new segments replace
the old one with the swap protocol (REF §2.2), so a crash leaves files the loader completes or
rolls back. Nothing is lost.

Only legacy batches are split: a v2 batch's base offset lies outside its CRC, and an offset that
overflows there is a damaged field (recovery truncates it), never something Kafka wrote.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from . import _core
from .checkpoint import fsync_dir
from .errors import CorruptRecordError, InvalidArgumentError, InvalidOffsetError
from .segment import (CLEANED_SUFFIX, DELETED_SUFFIX, MAX_RELATIVE_OFFSET, SWAP_SUFFIX,
                      LogSegment, first_offsets)

log = logging.getLogger("segstore.segment_split")


def may_overflow(base_offset: int, next_base: Optional[int]) -> bool:
    """Whether a segment followed by one at ``next_base`` (None: the last) has room for
    offsets past its relative range: only then are its batch headers read."""
    return next_base is None or next_base - 1 - base_offset > MAX_RELATIVE_OFFSET


def overflowed_legacy_batch(seg: LogSegment) -> Optional[int]:
    """Index of the first legacy batch of ``seg`` whose last offset does not fit relative to
    the base offset, or None; also None unless every batch is in offset order from the base
    (a file whose offsets go back is damage, which recovery truncates, not a file to split)."""
    if seg.size == 0:
        return None
    b = seg.scan(0, seg.size, raise_on_corrupt=False).batches
    if not len(b):
        return None
    first, last = first_offsets(b), b["last_offset"]
    ordered = np.ones(len(b), dtype=bool)
    ordered[1:] = first[1:] > last[:-1]
    over = (last - seg.base_offset > MAX_RELATIVE_OFFSET) & (b["magic"] < 2)
    i = int(over.argmax())
    if not over[i] or not ordered.all() or (first < seg.base_offset).any():
        return None
    return i


def _starts_legacy(seg: LogSegment, headers=None) -> bool:
    if seg.size == 0:
        return False
    b = (headers if headers is not None
         else seg.scan(0, seg.size, max_batches=1, raise_on_corrupt=False).batches)
    return bool(len(b)) and int(b["magic"][0]) < 2


def _first_offset(buf, batch) -> int:
    # A legacy compressed wrapper carries its last inner offset; its first is inside.
    if batch["base_offset"] >= 0:
        return int(batch["base_offset"])
    pos = int(batch["position"])
    return _core.decode_records(buf, pos, pos + int(batch["size"]))[0].offset


def split_overflowed_segment(seg: LogSegment, config, clock) -> list:
    """Replace ``seg`` (closed by this call) by segments whose offsets fit; returns them.

    Only a segment with an overflowed legacy batch is split (Kafka's require(hasOverflow)):
    anything else would be rewritten for nothing, and renamed if its first batch is past its
    base offset."""
    if seg.suffix or overflowed_legacy_batch(seg) is None:
        raise InvalidArgumentError(f"{seg.log_path} has no offset overflow to split")
    buf = seg.buffer(seg.size)
    res = seg.scan(0, seg.size, validate_crc=True, raise_on_corrupt=False)
    if res.error is not None or res.valid_end != seg.size:
        # Only whole, CRC-valid files are split; recovery deals with damage.
        raise res.error or CorruptRecordError(
            f"{seg.log_path} ends with an incomplete batch", file=seg.log_path,
            position=res.valid_end)
    b = res.batches
    valid_end = res.valid_end
    modified_ms = seg.last_modified_ms
    new: list = []
    try:
        i = 0
        while i < len(b):
            base = _first_offset(buf, b[i])
            beyond = np.flatnonzero(b["last_offset"][i + 1:] - base > MAX_RELATIVE_OFFSET)
            j = i + 1 + int(beyond[0]) if len(beyond) else len(b)
            part = b[i:j].copy()
            start = int(part["position"][0])
            end = int(part["position"][-1] + part["size"][-1])
            part["position"] -= start
            out = LogSegment(seg.directory, base, config, clock, suffix=CLEANED_SUFFIX)
            new.append(out)
            out.append(bytes(memoryview(buf)[start:end]), part)
            out.on_become_inactive()
            # Retention by time falls back on the file's age when batches carry no
            # timestamps (magic 0): the copies keep the original's.
            out.set_last_modified(modified_ms)
            out.flush()
            i = j
        log.warning("split %s, whose offsets overflow its relative range, into %d segments "
                    "(%d bytes)", seg.log_path, len(new), valid_end)
        # The swap protocol (REF §2.2): new files become .swap (committed), the old segment
        # .deleted and gone, then the new ones take their names.
        for out in reversed(new):
            out.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
        fsync_dir(seg.directory)
    except BaseException:
        # The old segment is untouched: every new one goes, .swap ones too. A .swap left
        # without the .cleaned ones below it would look committed to the next open, which
        # would complete half a split next to the old segment.
        for out in new:
            out.delete_files()
        raise
    seg.close()
    seg.change_file_suffixes("", DELETED_SUFFIX)
    seg.delete_files()
    for out in new:
        out.change_file_suffixes(SWAP_SUFFIX, "")
    fsync_dir(seg.directory)
    return new


def split_overflowed_segments(segments: list, config, clock, last_headers=None) -> list:
    """``segments`` (sorted) with every overflowed legacy segment split. ``last_headers``: the
    last segment's batch headers, when the caller has walked them already."""
    out = []
    for k, seg in enumerate(segments):
        nxt = segments[k + 1].base_offset if k + 1 < len(segments) else None
        if nxt is None and not _starts_legacy(seg, last_headers):
            # The last segment's end is unknown, but one that starts with v2 batches holds no
            # legacy ones (Kafka 3 cannot write them after v2): its headers are not walked twice.
            out.append(seg)
            continue
        if may_overflow(seg.base_offset, nxt) and overflowed_legacy_batch(seg) is not None:
            try:
                out.extend(split_overflowed_segment(seg, config, clock))
                continue
            except (CorruptRecordError, InvalidOffsetError) as e:
                log.warning("not splitting %s, whose offsets overflow: %s", seg.log_path, e)
        out.append(seg)
    return out
