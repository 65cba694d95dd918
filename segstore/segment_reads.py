"""Reading a segment by offset: Kafka's ``LogSegment.translateOffset`` and ``read``.

Functions over a :class:`~segstore.segment.LogSegment`, using only its public surface (size,
``buffer``, ``scan``, ``offset_index``, ``log_path``): a read works on the size it read once,
since an append may grow the segment while it scans.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from . import _core


log = logging.getLogger("segstore.segment")
MAX_OFFSET = np.iinfo(np.int64).max


def _ignore_index(seg, entry_offset: int, pos: int) -> None:
    log.warning("ignoring the offset index of %s: entry (%d, %d) does not point at its batch",
                seg.log_path, entry_offset, pos)


def translate_offset(seg, offset: int, start_position: int = 0):
    """First batch at or after ``start_position`` whose last offset >= ``offset``, as a
    BATCH_DTYPE row (position is in the file), or None; :func:`find_batch` as a numpy row."""
    row = find_batch(seg, offset, start_position)
    return None if row is None else np.array(tuple(row), dtype=_core.BATCH_DTYPE)[()]


def find_batch(seg, offset: int, start_position: int = 0):
    """First batch at or after ``start_position`` whose last offset >= ``offset``: a
    ``_core.HeaderRow`` (plain ints, position in the file) or None.

    The segment holds only whole batches, so a batch running past its size is reported as
    CorruptRecordError, but only when the walk reaches it before finding the batch: damage
    further on is left to the reads that need it (Kafka walks batch by batch and never looks
    past its target).

    The walk starts at the offset index's floor entry when the batch there really holds the
    entry's offset (``first_holds`` checks it in the same call); a damaged index is never
    trusted: the walk starts over from ``start_position``.
    """
    size = seg.size  # read once: an append may grow it while we walk
    entry_offset, entry_pos = seg.offset_index.lookup(offset)
    if size == 0 or start_position >= size:
        return None
    buf = seg.buffer(size)
    if start_position < entry_pos < size:
        row = _core.find_batch(buf, entry_pos, size, offset, first_holds=entry_offset,
                               file=seg.log_path)
        if row is not False:
            return row
        _ignore_index(seg, entry_offset, entry_pos)
    return _core.find_batch(buf, start_position, size, offset, file=seg.log_path)


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
    first = find_batch(seg, start_offset)
    if first is None:
        return None
    start = first.position
    size = seg.size
    limit = size if max_position is None else min(max_position, size)
    end = start + first.size
    if end > limit or (not min_one_message and end - start > max_bytes):
        return None
    stop = MAX_OFFSET if end_offset is None else end_offset
    last = first.last_offset
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
    """:func:`_least_records` of one batch (a ``_core.HeaderRow``), in plain ints."""
    if batch.magic >= 2 and batch.attributes & 0x20:
        return 0
    outside = (max(start_offset - batch.base_offset, 0)
               + max(batch.last_offset - stop + 1, 0))
    return max(batch.records_count - outside, 0)


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
