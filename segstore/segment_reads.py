"""Reading a segment by offset: Kafka's ``LogSegment.translateOffset`` and ``read``.

Functions over a :class:`~segstore.segment.LogSegment`, using only its public surface (size,
``buffer``, ``scan``, ``offset_index``, ``log_path``): a read works on the size it read once,
since an append may grow the segment while it scans.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np


log = logging.getLogger("segstore.segment")
MAX_OFFSET = np.iinfo(np.int64).max


def _ignore_index(seg, entry_offset: int, pos: int) -> None:
    log.warning("ignoring the offset index of %s: entry (%d, %d) does not point at its batch",
                seg.log_path, entry_offset, pos)


def translate_offset(seg, offset: int, start_position: int = 0):
    """First batch at or after ``start_position`` whose last offset >= ``offset``.

    Returns a BATCH_DTYPE row (position is in the file) or None. The segment holds only
    whole batches, so a batch running past its size is reported as CorruptRecordError, but
    only when the scan reaches it before finding the batch: damage further on is left to the
    reads that need it (Kafka walks batch by batch and never looks past its target).

    The scan starts at the offset index's floor entry when the batch there really holds the
    entry's offset (the first batch the scan reads is that check); a damaged index is never
    trusted: the scan starts over from ``start_position``.
    """
    size = seg.size  # read once: an append may grow it while we scan
    entry_offset, entry_pos = seg.offset_index.lookup(offset)
    pos = start_position
    if start_position < entry_pos < size:
        pos = entry_pos
    while pos < size:
        res = _scan_ahead(seg, pos, size)
        b = res.batches
        if pos == entry_pos:
            entry_pos = -1
            if not (len(b) and b["base_offset"][0] <= entry_offset <= b["last_offset"][0]):
                _ignore_index(seg, entry_offset, pos)
                pos = start_position
                continue
        if len(b) and b["last_offset"][-1] >= offset:
            return b[int(np.argmax(b["last_offset"] >= offset))]
        if res.error is not None:
            raise res.error
        if len(b) == 0:
            return None
        pos = int(b["position"][-1] + b["size"][-1])
    return None


def _scan_ahead(seg, start: int, end: int):
    # Headers of up to 64 whole batches from ``start``; a damaged one ends the scan and is
    # returned, not raised: only the caller knows whether it needed that batch.
    return seg.scan(start, end, max_batches=64, strict=True, raise_on_corrupt=False)


def read_range(seg, start_offset: int, max_bytes: int, max_position: Optional[int] = None,
               min_one_message: bool = True, end_offset: Optional[int] = None,
               max_records: Optional[int] = None):
    """(buffer, start, end, damage) of whole batches from the one holding ``start_offset``,
    or None when no batch qualifies.

    Follows Kafka's LogSegment.read: batches up to ``max_bytes`` (at least the first when
    ``min_one_message``), never past ``max_position`` and (like the maxOffset Kafka's read
    once took) none starting at or after ``end_offset``; unlike Kafka the range ends on a
    batch boundary, so a reader never sees a cut batch. ``damage`` is the
    CorruptRecordError of a batch the range would have taken next (it ends before it), None
    when the range is whole: only the caller, once it has decoded the range, knows whether it
    needed more.

    With ``max_records`` the range also ends once its batches surely hold that many records
    from ``start_offset`` on (by their headers' counts): a read of a few records does not
    walk a whole ``max_bytes`` of batches.
    """
    first = translate_offset(seg, start_offset)
    if first is None:
        return None
    start = int(first["position"])
    size = seg.size
    limit = size if max_position is None else min(max_position, size)
    end = start + int(first["size"])
    if end > limit or (not min_one_message and end - start > max_bytes):
        return None
    stop = MAX_OFFSET if end_offset is None else end_offset
    last = int(first["last_offset"])
    buf = seg.buffer(size)
    held = None  # with max_records: how many records the range surely holds
    error = None
    while end < limit and end - start < max_bytes and last + 1 < stop:
        if max_records is not None:
            if held is None:
                held = _least_records_of(first, start_offset, stop)
            if held >= max_records:
                break
        if error is not None:
            return buf, start, end, error  # the damaged batch starts where the range wants more
        res = _scan_ahead(seg, end, limit)
        b = res.batches
        ends = b["position"] + b["size"]
        # A legacy compressed wrapper scans with base offset -1, so it is kept.
        wanted = (ends - start <= max_bytes) & (b["base_offset"] < stop)
        n = len(b) if wanted.all() else int(wanted.argmin())
        if max_records is not None and n:
            total = held + np.cumsum(_least_records(b[:n], start_offset, stop))
            n = min(n, int(np.searchsorted(total, max_records)) + 1)
            held = int(total[n - 1])
        if n:
            end, last = int(ends[n - 1]), int(b["last_offset"][n - 1])
        if n < len(b):
            break
        error = res.error
    return buf, start, end, None


def _least_records_of(batch, start_offset: int, stop: int) -> int:
    """:func:`_least_records` of one batch, in plain ints (numpy is slow on one row)."""
    if batch["magic"] >= 2 and batch["attributes"] & 0x20:
        return 0
    outside = (max(start_offset - int(batch["base_offset"]), 0)
               + max(int(batch["last_offset"]) - stop + 1, 0))
    return max(int(batch["records_count"]) - outside, 0)


def _least_records(batches, start_offset: int, stop: int):
    """How many records at or after ``start_offset`` and below ``stop`` each batch (scanned
    header rows) holds at least, by its header: its record count less the offsets it spans
    outside them (a compacted batch may hold fewer there); none in a control batch, or in a
    legacy compressed wrapper (its count is unknown, -1)."""
    count = batches["records_count"].astype(np.int64)
    outside = (np.maximum(start_offset - batches["base_offset"], 0)
               + np.maximum(batches["last_offset"] - stop + 1, 0))
    control = (batches["magic"] >= 2) & ((batches["attributes"] & 0x20) != 0)
    return np.where(control, 0, np.maximum(count - outside, 0))
