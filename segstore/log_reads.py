"""Reading a PartitionLog: by offset, into columns, by time (Kafka's UnifiedLog.read and
fetchOffsetByTimestamp, REF §3.6–§3.7).

A mixin of :class:`segstore.log.PartitionLog`: it works only on the log's immutable snapshot
(``self._state``, a LogState) and never takes the log's lock.
"""

from __future__ import annotations

import bisect
import functools
import mmap
import operator
from typing import Iterator, Optional


from . import _core, segment_reads
from .columns import RecordColumns
from .log_isolation import (READ_UNCOMMITTED, committed_spans, committed_view,
                            in_range, read_committed, replayed_view)
from .errors import (CorruptRecordError, InvalidArgumentError, InvalidOffsetError,
                     OffsetOutOfRangeError, SegmentChangedError, offset_argument)
from .log_state import LogState as _State
from .records import (EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP,
                      MAX_TIMESTAMP, ConsumerRecord, OffsetAndTimestamp)


READ_ATTEMPTS = 4  # a read racing truncations or deletions this often in a row gives up
_base_offset = operator.attrgetter("base_offset")


def _on_current_state(read):
    """Run ``read`` again on the log's new state when a segment of its snapshot changed under
    it: deleted or closed (SegmentChangedError), or truncated, which can also surface as damage
    or a range past the new end. A closed log then raises StoreClosedError, an offset that
    retention or truncation removed OffsetOutOfRangeError."""
    @functools.wraps(read)
    def wrapper(self, *args, **kwargs):
        for attempt in range(READ_ATTEMPTS):
            truncations = self.truncations
            try:
                return read(self, *args, **kwargs)
            except (SegmentChangedError, CorruptRecordError, InvalidArgumentError) as e:
                changed = isinstance(e, SegmentChangedError) or self.truncations != truncations
                if not changed or attempt == READ_ATTEMPTS - 1:
                    raise
    return wrapper


class LogReads:
    """read, read_columns, iter_records and offset_for_time over the log's snapshot."""

    def _check_read_offset(self, offset: int, st: _State) -> None:
        offset_argument(offset)
        if offset < st.log_start_offset or offset > st.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic}-{self.partition}: log start "
                f"offset {st.log_start_offset}, log end offset {st.log_end_offset}")

    def _committed_view(self, st: _State, offset: int):
        """read_committed's bound and aborted transactions for a read from ``offset``. A
        read-only log replays its headers once per state it sees (a chunked reader, such as a
        Spark task, asks once per chunk)."""
        if self.producer_state is not None:
            return committed_view(self, st, offset)
        # A refresh makes a new state each time; the same segments (by serial: the cache must
        # not keep deleted segments' maps alive), sizes and offsets are the same data.
        key = (tuple(s.serial for s in st.segments), st.log_start_offset, st.log_end_offset,
               st.segments[-1].size if st.segments else 0)
        cached = getattr(self, "_replayed_view", None)
        if cached is None or cached[0] != key:
            cached = self._replayed_view = (key, replayed_view(self.directory, st))
        return in_range(cached[1], offset)

    def _segments_from(self, st: _State, offset: int):
        segs = st.segments
        i = max(bisect.bisect_right(segs, offset, key=_base_offset) - 1, 0)
        return segs[i:]

    def read(self, offset: int, max_records: Optional[int] = None,
             max_bytes: int = 1 << 20,
             isolation_level: str = READ_UNCOMMITTED) -> list[ConsumerRecord]:
        """Records from ``offset`` on, at most ``max_bytes`` of batches (at least one batch)
        and ``max_records`` records; [] at the log end. Kafka's out-of-range rules apply.
        ``isolation_level="read_committed"`` reads below the last stable offset only and
        leaves out aborted transactions' records ([] then means the last stable offset)."""
        committed = read_committed(isolation_level)
        return self._read(offset, max_records, max_bytes, None, committed)

    @_on_current_state
    def _read(self, offset: int, max_records: Optional[int], max_bytes: int,
              end_offset: Optional[int], committed: bool = False) -> list[ConsumerRecord]:
        # ``end_offset``: no segment starting at or after it is read (so damage there cannot
        # fail a read of what comes before).
        self._check_open()
        self._refresh()
        st = self._state
        self._take_fresh_crc()  # decode_records checks every CRC: later reads must too
        self._check_read_offset(offset, st)
        _check_limit("max_records", max_records, allow_none=True)
        _check_limit("max_bytes", max_bytes, allow_none=False)
        aborted = []
        if committed:  # Kafka's FetchTxnCommitted: the last stable offset bounds the read
            view = self._committed_view(st, offset)
            end_offset = view.bound if end_offset is None else min(end_offset, view.bound)
            aborted = view.aborted
            if offset >= end_offset:
                return []
        if offset == st.log_end_offset or max_records == 0:
            return []
        out: list = []
        budget = max_bytes
        segs = self._segments_from(st, offset)
        i = 0
        while i < len(segs):
            seg = segs[i]
            if end_offset is not None and seg.base_offset >= end_offset:
                break
            left = None if max_records is None else max_records - len(out)
            rng = segment_reads.read_range(seg, offset, budget, min_one_message=not out,
                                           end_offset=end_offset, max_records=left)
            if rng is None:
                if out and segment_reads.find_batch(seg, offset) is not None:
                    break  # its next batch does not fit what is left of max_bytes
                i += 1
                continue
            buf, start, end, damage = rng
            last = st.log_end_offset if end_offset is None else min(end_offset, st.log_end_offset)
            recs, cut = _decode_committed(
                buf, start, end, aborted, left, min_offset=offset, end_offset=last,
                topic=self.topic, partition=self.partition, file=seg.log_path, strict=True)
            out.extend(recs)
            if damage is not None and not cut:
                raise damage  # the range stopped short of a damaged batch it needs
            if not out:
                # Only markers or aborted records (or nothing at or past ``offset``) so far:
                # the read goes on past them, as a consumer moves its position past them, so
                # that [] still means the end (a small max_bytes spent on a marker returned []
                # before).
                if cut and recs:
                    past = recs[-1].offset + 1
                else:
                    batches = _core.scan_batches(buf, start, end).batches
                    past = int(batches["last_offset"][-1]) + 1 if len(batches) else offset
                if past > offset:
                    offset = past
                    continue  # the same segment, from the batch after them
                i += 1
                continue
            budget -= end - start
            if budget <= 0 or (max_records is not None and len(out) >= max_records):
                break
            if cut and recs:  # records were left out: the rest of the segment is still due
                offset = recs[-1].offset + 1
                continue
            if end < seg.size:
                # max_bytes ended the range inside this segment: the next segment's records
                # come after the ones left here (going on to them skipped these).
                break
            offset = recs[-1].offset + 1 if recs else offset
            i += 1
        return out

    def read_columns(self, offset: Optional[int] = None, end_offset: Optional[int] = None,
                     max_records: Optional[int] = None, include_headers: bool = False,
                     isolation_level: str = READ_UNCOMMITTED) -> RecordColumns:
        """Records in [offset, end_offset) as numpy columns, one compiled pass per segment.
        ``isolation_level="read_committed"`` ends the range at the last stable offset at the
        latest and leaves out aborted transactions' records (``max_records`` counts only the
        records returned)."""
        committed = read_committed(isolation_level)
        return self._read_columns(offset, end_offset, max_records, include_headers, committed)

    @_on_current_state
    def _read_columns(self, offset: Optional[int], end_offset: Optional[int],
                      max_records: Optional[int], include_headers: bool,
                      committed: bool) -> RecordColumns:
        self._check_open()
        self._refresh()
        st = self._state
        fresh = self._take_fresh_crc()
        offset = st.log_start_offset if offset is None else offset
        self._check_read_offset(offset, st)
        _check_limit("max_records", max_records, allow_none=True)
        end = (st.log_end_offset if end_offset is None
               else min(offset_argument(end_offset, "end_offset"), st.log_end_offset))
        aborted = []
        if committed:
            view = self._committed_view(st, offset)
            end, aborted = min(end, view.bound), view.aborted
        sources = []
        segs = self._segments_from(st, offset)
        for i, seg in enumerate(segs):
            if seg.base_offset >= end:
                break
            start = 0
            if not sources:
                first = seg.translate_offset(offset)
                if first is None:
                    continue
                start = int(first["position"])
            size = seg.size  # read once: appends may grow it meanwhile
            if i + 1 == len(segs) or segs[i + 1].base_offset >= end:
                # The range ends in this segment: decode (and so check) nothing after its end.
                try:
                    size = min(size, _end_position(seg, end, start))
                except CorruptRecordError:
                    if max_records is None:
                        raise
                    # Damage before the end: the decode stops short of it if the records
                    # wanted come first, and raises it otherwise.
            if size > start:
                buf = seg.buffer(size)
                # Pages of a shared file mapping can be dropped once decoded (see _core).
                checked = fresh[1:] if fresh is not None and fresh[0] is seg else None
                sources.append((buf, start, size, seg.log_path, isinstance(buf, mmap.mmap),
                                checked))
        # One compiled decode over every segment, straight into one set of arrays.
        if aborted:
            # Aborted transactions' batches are cut out of the byte ranges, so they are never
            # decoded and max_records counts only what is returned.
            sources = [(buf, s, e, path, shared, checked)
                       for buf, start, size, path, shared, checked in sources
                       for s, e in committed_spans(buf, start, size, aborted)]
        return _core.decode_columns_multi(sources, min_offset=offset, end_offset=end,
                                          max_records=max_records,
                                          include_headers=include_headers, topic=self.topic,
                                          partition=self.partition, strict=True)

    def iter_records(self, start_offset: Optional[int] = None, end_offset: Optional[int] = None,
                     isolation_level: str = READ_UNCOMMITTED) -> Iterator[ConsumerRecord]:
        """Every record in [start_offset, end_offset), batch by batch (``read_committed``:
        below the last stable offset, without aborted transactions' records)."""
        committed = read_committed(isolation_level)
        offset = (self.log_start_offset if start_offset is None
                  else offset_argument(start_offset, "start_offset"))
        end = (self.log_end_offset if end_offset is None
               else offset_argument(end_offset, "end_offset"))
        while offset < end:
            recs = self._read(offset, None, 1 << 20, end, committed)
            if not recs:
                return
            for r in recs:
                if r.offset >= end:
                    return
                yield r
            offset = recs[-1].offset + 1

    @_on_current_state
    def offset_for_time(self, timestamp_ms: int) -> Optional[OffsetAndTimestamp]:
        """Kafka's ListOffsets for one partition (REF §3.7), including -1 (latest), -2
        (earliest), -3 (max timestamp) and -4 (earliest local: the log start offset, as
        without tiered storage); the other tiered-storage targets raise InvalidOffsetError."""
        self._check_open()
        offset_argument(timestamp_ms, "offset_for_time's timestamp (milliseconds)")
        self._refresh()
        st = self._state
        if timestamp_ms in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            return OffsetAndTimestamp(st.log_start_offset, -1, None)
        if timestamp_ms == LATEST_TIMESTAMP:
            return OffsetAndTimestamp(st.log_end_offset, -1, None)
        if timestamp_ms == MAX_TIMESTAMP:
            return self._max_timestamp_offset(st)
        if timestamp_ms < 0:
            raise InvalidOffsetError(f"unsupported timestamp {timestamp_ms}")
        for seg in st.segments:
            if seg.size == 0 or not _may_hold_timestamp(seg, timestamp_ms):
                continue
            entry_ts, off = seg.time_index.lookup(timestamp_ms)
            if entry_ts >= 0:
                # An entry names the batch holding its max timestamp; if the log disagrees the
                # index is damaged: scan the segment from its start instead of trusting it.
                b = seg.translate_offset(off)
                if b is None or int(b["max_timestamp"]) != entry_ts:
                    off = seg.base_offset
            start = max(off, st.log_start_offset)
            first = seg.translate_offset(start)
            if first is None:
                continue
            res = seg.scan(int(first["position"]), strict=True, raise_on_corrupt=False)
            b = res.batches
            for row in b[b["max_timestamp"] >= timestamp_ms]:
                for r in _core.decode_records(seg.buffer(), int(row["position"]),
                                              int(row["position"] + row["size"]),
                                              min_offset=st.log_start_offset, file=seg.log_path):
                    if r.timestamp >= timestamp_ms:
                        return OffsetAndTimestamp(r.offset, r.timestamp, None)
            if res.error is not None:
                raise res.error  # the damaged batch may hold the answer
        return None

    def _max_timestamp_offset(self, st: _State) -> Optional[OffsetAndTimestamp]:
        best = None
        for seg in st.segments:
            if seg.size and (best is None or seg.max_timestamp_so_far > best.max_timestamp_so_far):
                best = seg
        if best is None:
            return None
        ts = best.max_timestamp_so_far
        b = best.scan().batches
        for row in b[b["max_timestamp"] == ts]:
            for r in _core.decode_records(best.buffer(), int(row["position"]),
                                          int(row["position"] + row["size"])):
                if r.timestamp == ts:
                    return OffsetAndTimestamp(r.offset, ts, None)
        return OffsetAndTimestamp(int(b[b["max_timestamp"] == ts]["last_offset"][0]), ts, None)


def _decode_committed(buf, start: int, end: int, aborted, left: Optional[int], **kw):
    """The records of ``buf[start:end]`` outside aborted transactions' batches (which are
    skipped, not decoded), at most ``left`` of them; and whether ``left`` cut them short (the
    range may hold more)."""
    if not aborted:  # the whole range (committed_spans' answer), without building it
        recs = _core.decode_records(buf, start, end, max_records=left, **kw)
        return recs, left is not None and len(recs) == left
    out: list = []
    for s, e in committed_spans(buf, start, end, aborted):
        want = None if left is None else left - len(out)
        recs = _core.decode_records(buf, s, e, max_records=want, **kw)
        out = recs if not out else out + recs
        if want is not None and len(recs) == want:
            return out, True
    return out, False


def _end_position(seg, end_offset: int, start: int) -> int:
    """Where the batches of ``seg`` holding offsets below ``end_offset`` end (scanning from
    ``start``); the lookup is for ``end_offset - 1``, so it never needs the batch after them."""
    last = seg.translate_offset(end_offset - 1, start)
    if last is None:
        return seg.size
    # In a gap the batch found starts past the range; a legacy compressed wrapper (base
    # offset -1) may hold offsets below the end, so it is kept.
    kept = int(last["size"]) if last["base_offset"] < end_offset else 0
    return int(last["position"]) + kept


def _may_hold_timestamp(seg, timestamp_ms: int) -> bool:
    """Whether ``seg`` may hold a record at or after ``timestamp_ms``; a segment whose largest
    timestamp cannot be read for damage is searched, which raises only if it reaches it."""
    try:
        return seg.largest_timestamp >= timestamp_ms
    except CorruptRecordError:
        return True


def _check_limit(name: str, value, allow_none: bool) -> None:
    """A read's count or size limit: a non-negative int (None: no limit, where allowed)."""
    if value is None and allow_none:
        return
    if not 0 <= offset_argument(value, name) < 1 << 63:
        raise InvalidArgumentError(f"{name} must be from 0 to 2**63 - 1, got {value}")
