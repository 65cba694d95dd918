# The cleaner's filter (Kafka's Cleaner.filterInto, REF §6.8): which records of a batch are
# retained, and the batch written verbatim, rebuilt, as an empty header or not at all; then the
# rebuilt batches' CRCs and compression.
# Included by _core.pyx; shares its namespace. Like the map build (_map_build.pxi), plain batches
# run here without the GIL and the rest come back to Python one at a time (ST_NEED_PYTHON).

cdef enum:
    RETAIN_EMPTY = 0           # keep the batch header even if no record survives
    DELETE = 1                 # drop the whole batch without looking at records
    DELETE_EMPTY = 2           # drop the batch only if no record survives


cdef struct FilterCore:
    int64_t now
    int64_t new_horizon        # now + delete.retention.ms
    int64_t upper_bound        # upperBoundOffsetOfCleaningRound
    int strategy
    uint8_t* keep              # per-record decisions of the current batch
    Py_ssize_t* starts         # record start positions (n + 1: the last is the records' end)
    Py_ssize_t* ts_ends        # where each record's timestamp delta ends
    int64_t* tss               # each record's timestamp
    Py_ssize_t keep_cap
    int64_t messages_read
    int64_t bytes_read
    int64_t messages_written
    int64_t bytes_written
    int64_t invalid
    int64_t max_offset
    int64_t rebuilt            # batches written with new contents (CRC to compute)
    const uint8_t* ahead       # the next batch's bytes, prefetched while this one is walked
    const uint8_t* ahead_end


cdef inline int64_t _room_needed(const BatchHeader* h, int64_t records_bytes) noexcept nogil:
    # Verbatim: the batch. Rebuilt: a header plus the (decompressed) records, each of which
    # grows by at most 10 bytes (longer length and timestamp varints).
    cdef int64_t rebuilt = (V2_HEADER_C + records_bytes
                            + 10 * <int64_t>(h.records_count if h.records_count > 0 else 0))
    return rebuilt if rebuilt > h.size else h.size


cdef int _grow_scratch(FilterCore* fc, Py_ssize_t n) noexcept nogil:
    cdef uint8_t* keep = <uint8_t*>realloc(fc.keep, n)
    if keep == NULL:
        return ST_NO_MEMORY
    fc.keep = keep
    cdef Py_ssize_t* starts = <Py_ssize_t*>realloc(fc.starts, n * sizeof(Py_ssize_t))
    if starts == NULL:
        return ST_NO_MEMORY
    fc.starts = starts
    cdef Py_ssize_t* ts_ends = <Py_ssize_t*>realloc(fc.ts_ends, n * sizeof(Py_ssize_t))
    if ts_ends == NULL:
        return ST_NO_MEMORY
    fc.ts_ends = ts_ends
    cdef int64_t* tss = <int64_t*>realloc(fc.tss, n * sizeof(int64_t))
    if tss == NULL:
        return ST_NO_MEMORY
    fc.tss = tss
    fc.keep_cap = n
    return ST_OK


cdef struct FilterGroup:
    # Up to MAP_GROUP consecutive records of one batch, parsed; keys to look up hashed.
    uint64_t h1[MAP_GROUP]
    uint64_t h2[MAP_GROUP]
    int64_t slot[MAP_GROUP]
    int64_t offset[MAP_GROUP]
    int32_t value_len[MAP_GROUP]
    int32_t key_len[MAP_GROUP]


cdef int _filter_parse_group(FilterCore* fc, const MapCore* m, const BatchHeader* h,
                             const uint8_t* rb, Py_ssize_t* pos, Py_ssize_t rend, int32_t j0,
                             int32_t g, bint look, FilterGroup* fg) noexcept nogil:
    """Parse records j0 .. j0+g-1 of a batch from pos[0] (their starts, timestamp ends and
    timestamps into ``fc``); hash the keys to look up, prefetching their first two slots."""
    cdef Py_ssize_t p = pos[0]
    cdef RecordView r
    cdef int st
    cdef int32_t k, j
    cdef int64_t offset, latest = m.latest_offset
    for k in range(g):
        j = j0 + k
        if fc.ahead < fc.ahead_end:   # two cache lines of the next batch per record
            SEGSTORE_PREFETCH(fc.ahead)
            SEGSTORE_PREFETCH(fc.ahead + 64)
            fc.ahead += 128
        fc.starts[j] = p
        st = _record_fields(rb, &p, rend, &r, &fc.ts_ends[j])
        if st != ST_OK:
            pos[0] = p
            return st
        offset = h.base_offset + r.offset_delta
        fg.offset[k] = offset
        fc.tss[j] = h.base_timestamp + r.timestamp_delta
        fg.value_len[k] = r.value_len
        fg.key_len[k] = r.key_len
        if look and offset <= latest and r.key_len >= 0:
            murmur3_x64_128(rb + r.key_pos, r.key_len, 0, &fg.h1[k], &fg.h2[k])
            fg.slot[k] = _probe_slot(m, fg.h1[k], fg.h2[k], 0)
            SEGSTORE_PREFETCH(m.mem + fg.slot[k] * m.words)
            # The entry's last byte: a 24-byte entry crosses a cache line in a quarter of the
            # slots, and a lookup reads its offset at the end.
            SEGSTORE_PREFETCH(<const char*>(m.mem + fg.slot[k] * m.words) + 8 * m.words - 1)
            # A quarter of the keys of a half-full table sit at their second slot.
            SEGSTORE_PREFETCH(m.mem + _probe_slot(m, fg.h1[k], fg.h2[k], 1) * m.words)
    pos[0] = p
    return ST_OK


cdef int _filter_batch(MapCore* m, FilterCore* fc, const BatchHeader* h, const uint8_t* src,
                       const uint8_t* rb, Py_ssize_t rpos, Py_ssize_t rend, int mode,
                       bint discard_records, bint marker_for_empty_txn, uint8_t* out,
                       Py_ssize_t* out_pos, Py_ssize_t out_cap, bint* rebuilt) noexcept nogil:
    """Decide and write one magic-2 batch (``src`` = its bytes; records in rb[rpos:rend]).

    Writes the batch verbatim, rebuilt (uncompressed, CRC left 0 for the caller), as an empty
    header, or not at all; ST_OUTPUT_FULL (nothing written) when out[out_pos:out_cap] is
    smaller than ``_room_needed``.
    """
    cdef int32_t n = h.records_count, j, retained = 0
    cdef RecordView r
    cdef int st
    cdef Py_ssize_t p, rec_start, ts_end, attr_pos
    cdef int32_t length
    cdef int64_t offset, got, ts, max_ts = -0x7FFFFFFFFFFFFFFF - 1, first_ts = 0, horizon
    cdef int64_t tsd
    cdef uint64_t h1, h2
    cdef bint tomb = False, keep, ok, has_horizon, retain_deletes, need_horizon, control
    cdef uint8_t* o
    cdef uint8_t* q
    cdef BatchHeader nh
    cdef uint8_t* grown
    cdef int32_t g, gn, k, jn
    cdef bint look
    cdef FilterGroup ga, gb
    cdef FilterGroup* cur = &ga
    cdef FilterGroup* nxt = &gb
    cdef FilterGroup* tmp
    rebuilt[0] = False
    if mode != DELETE and out_cap - out_pos[0] < _room_needed(h, rend - rpos):
        return ST_OUTPUT_FULL
    fc.bytes_read += h.size
    if mode == DELETE:
        return ST_OK  # dropped whole: its records are not read (Kafka's filterTo neither)
    fc.messages_read += n
    if n + 1 > fc.keep_cap:
        if _grow_scratch(fc, n + 1) != ST_OK:
            return ST_NO_MEMORY
    has_horizon = (h.attributes & ATTR_DELETE_HORIZON) != 0
    retain_deletes = not has_horizon or fc.now < h.base_timestamp
    control = (h.attributes & ATTR_CONTROL) != 0
    p = rpos
    look = not discard_records and not control
    # Records are parsed and hashed a group ahead of their decisions, the cache lines of their
    # keys' first two slots prefetched then, so the map's misses overlap the next group's walk.
    j = 0
    g = n if n < MAP_GROUP else MAP_GROUP
    st = _filter_parse_group(fc, m, h, rb, &p, rend, j, g, look, cur)
    if st != ST_OK:
        return st
    while j < n:
        jn = j + g
        gn = n - jn if n - jn < MAP_GROUP else MAP_GROUP
        if gn > 0:
            st = _filter_parse_group(fc, m, h, rb, &p, rend, jn, gn, look, nxt)
            if st != ST_OK:
                return st
        for k in range(g):
            offset = cur.offset[k]
            if discard_records:
                keep = False
            elif control:
                keep = True
            elif offset > m.latest_offset:
                keep = True            # beyond the mapped range: a later round decides
            elif cur.key_len[k] < 0:
                keep = False
                fc.invalid += 1
            else:
                got = _map_get_from(m, cur.h1[k], cur.h2[k], cur.slot[k])
                if fc.strategy == STRATEGY_OFFSET:
                    ok = offset >= got
                else:
                    ok = got == -1 or offset == got
                keep = ok and (cur.value_len[k] >= 0 or retain_deletes)
            fc.keep[j + k] = keep
            if keep:
                ts = fc.tss[j + k]
                if retained == 0:
                    first_ts = ts
                if ts > max_ts:
                    max_ts = ts
                if cur.value_len[k] < 0:
                    tomb = True
                retained += 1
        j = jn
        g = gn
        tmp = cur
        cur = nxt
        nxt = tmp
    fc.starts[n] = p
    if p != rend:
        return ST_LEFTOVER
    o = out + out_pos[0]
    need_horizon = (tomb or marker_for_empty_txn) and not has_horizon
    if retained == n and n > 0 and not need_horizon:
        memcpy(o, src, h.size)
        out_pos[0] += h.size
        fc.messages_written += n
        fc.bytes_written += h.size
        if h.last_offset > fc.max_offset:
            fc.max_offset = h.last_offset
        return ST_OK
    if retained == 0 and mode != RETAIN_EMPTY:
        return ST_OK
    nh = h[0]
    nh.records_count = retained
    if retained == 0:
        # An empty header keeps the offsets (and the producer's last sequence) of the batch.
        nh.attributes = h.attributes & (ATTR_LOG_APPEND_TIME | ATTR_TRANSACTIONAL | ATTR_CONTROL)
        nh.base_timestamp = -1
        nh.size = V2_HEADER_C
        _write_batch_header(o, &nh)
        out_pos[0] += V2_HEADER_C
    else:
        if need_horizon:
            horizon = fc.new_horizon
        elif has_horizon:
            horizon = h.base_timestamp
        else:
            horizon = -1
        nh.attributes = h.attributes & ~(ATTR_CODEC | ATTR_DELETE_HORIZON)
        if horizon >= 0:
            nh.attributes = nh.attributes | ATTR_DELETE_HORIZON
            nh.base_timestamp = horizon
        else:
            nh.base_timestamp = first_ts
        if not (h.attributes & ATTR_LOG_APPEND_TIME):
            nh.max_timestamp = max_ts
        q = o + V2_HEADER_C
        for j in range(n):
            if not fc.keep[j]:
                continue
            # Re-encode only the timestamp delta: everything after it is copied as is.
            rec_start = fc.starts[j]
            p = fc.starts[j + 1]
            attr_pos = rec_start
            read_varint(rb, &attr_pos, rend, &length)
            ts_end = fc.ts_ends[j]
            tsd = fc.tss[j] - nh.base_timestamp
            length = <int32_t>(1 + varlong_size(tsd) + (p - ts_end))
            q += write_varint(q, length)
            q[0] = rb[attr_pos]
            q += 1
            q += write_varlong(q, tsd)
            memcpy(q, rb + ts_end, p - ts_end)
            q += p - ts_end
        nh.size = <int32_t>(q - o)
        _write_batch_header(o, &nh)
        out_pos[0] += nh.size
    rebuilt[0] = True
    fc.rebuilt += 1
    fc.messages_written += retained
    fc.bytes_written += nh.size
    if h.last_offset > fc.max_offset:
        fc.max_offset = h.last_offset
    return ST_OK


cdef inline bint _needs_caller(const BatchHeader* h) noexcept nogil:
    """Whether the filter hands a batch back to the caller (``filter_one``): a legacy format,
    a codec, a control batch or a producer id. Every other batch is *plain*."""
    return (h.magic < 2 or (h.attributes & (ATTR_CODEC | ATTR_CONTROL)) != 0
            or h.producer_id >= 0)


cdef int _filter_run(MapCore* m, FilterCore* fc, const uint8_t* b, Py_ssize_t* pos,
                     Py_ssize_t end, uint8_t* out, Py_ssize_t* out_pos,
                     Py_ssize_t out_cap) noexcept nogil:
    """Filter plain batches (magic 2, uncompressed, no producer id, not control) from pos[0];
    stops at end, at a batch for the Python path, or when the output cannot take the next."""
    cdef BatchHeader h
    cdef int st
    cdef bint rebuilt
    cdef int mode
    while True:
        st = scan_one(b, pos[0], end, &h)
        if st != ST_OK:
            return st
        if _needs_caller(&h):
            return ST_NEED_PYTHON
        if out_cap - out_pos[0] < _room_needed(&h, h.size - V2_HEADER_C):
            return ST_OUTPUT_FULL
        # Never lose the round's last offset, so the log end offset stays recoverable.
        mode = RETAIN_EMPTY if h.last_offset + 1 == fc.upper_bound else DELETE_EMPTY
        # Records come from memory (no CRC pass reads them first): the next batch's lines are
        # prefetched while this one is walked (about the same size; never past ``end``).
        fc.ahead = b + pos[0] + h.size
        fc.ahead_end = fc.ahead + (h.size if h.size < end - pos[0] - h.size
                                   else end - pos[0] - h.size)
        st = _filter_batch(m, fc, &h, b + pos[0], b, pos[0] + V2_HEADER_C, pos[0] + h.size,
                           mode, False, False, out, out_pos, out_cap, &rebuilt)
        if st != ST_OK:
            return st
        pos[0] += h.size


FILTER_DONE = 0
FILTER_NEED_PYTHON = 1
FILTER_OUTPUT_FULL = 2


@cython.final
cdef class BatchFilter:
    """The cleaner's per-round filter (REF §6.8) over one offset map.

    ``run`` handles runs of plain batches without the GIL; batches with producer ids, control
    batches, compressed and legacy batches come back to the caller, which decides their
    retention mode (transactions, active producers) and calls ``filter_one``. Rebuilt batches
    are left with CRC 0: the caller fills CRCs with ``finish_crcs``.

    The filter looks keys up in a copy of the map's header taken when it is made (the same
    entries, its own lookup counters), so filters over one map may run on several threads at
    once; the map must not change while they are in use (a round builds it first).
    """
    cdef FilterCore fc
    cdef OffsetMap omap
    cdef MapCore mc

    def __cinit__(self, omap, now, delete_retention_ms, upper_bound):
        cdef OffsetMap om = _offset_map_arg(omap, "omap")
        # now >= 0: the horizon's overflow check below subtracts it from INT64_MAX.
        cdef int64_t t = _int_arg(now, "now", InvalidArgumentError, 0, INT64_MAX_C,
                                  "an int from 0 to 2**63 - 1 (milliseconds since the epoch)",
                                  OffsetTypeError)
        cdef int64_t retention = _i64_arg(delete_retention_ms, "delete_retention_ms",
                                          InvalidArgumentError)
        memset(&self.fc, 0, sizeof(FilterCore))
        self.omap = om
        self.mc = om.m
        self.fc.now = t
        self.fc.new_horizon = t + retention if retention < INT64_MAX_C - t else INT64_MAX_C
        self.fc.upper_bound = _i64_arg(upper_bound, "upper_bound", InvalidOffsetError)
        self.fc.strategy = om.m.strategy
        self.fc.max_offset = -1

    def __dealloc__(self):
        free(self.fc.keep)
        free(self.fc.starts)
        free(self.fc.ts_ends)
        free(self.fc.tss)

    @property
    def stats(self) -> dict:
        """messages/bytes read and written, invalid (keyless) records, max offset written."""
        return {"messages_read": self.fc.messages_read, "bytes_read": self.fc.bytes_read,
                "messages_written": self.fc.messages_written,
                "bytes_written": self.fc.bytes_written, "invalid": self.fc.invalid,
                "max_offset": self.fc.max_offset, "rebuilt": self.fc.rebuilt}

    def reset_max_offset(self):
        self.fc.max_offset = -1

    def recompressed(self, rebuilt_size, compressed_size) -> None:
        """A batch ``filter_one`` rebuilt (``rebuilt_size`` bytes) was compressed by the caller
        into ``compressed_size`` bytes: ``bytes_written`` counts what was written."""
        self.fc.bytes_written += (_i64_arg(compressed_size, "compressed_size", InvalidArgumentError)
                                  - _i64_arg(rebuilt_size, "rebuilt_size", InvalidArgumentError))

    def run(self, buf, start, end, out, out_pos, file=None):
        """Filter plain batches of ``buf[start:end]`` into ``out`` (a writable buffer:
        bytearray, anonymous mmap) from ``out_pos``.

        Returns ``(code, position, out_pos)``: FILTER_DONE at ``end`` (or at an incomplete
        batch before it), FILTER_NEED_PYTHON at a
        batch for ``filter_one``, FILTER_OUTPUT_FULL when ``out`` needs draining or growing.
        """
        cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
        cdef Py_ssize_t pos = _i64_arg(start, "start", InvalidArgumentError)
        cdef Py_ssize_t e = _resolve_end(view.shape[0], pos, end)
        cdef uint8_t[::1] ov = _byte_buffer(out, "out", True)
        cdef Py_ssize_t op = _i64_arg(out_pos, "out_pos", InvalidArgumentError)
        cdef int st
        if op < 0 or op > ov.shape[0]:
            raise InvalidArgumentError("out_pos outside the output buffer")
        with nogil:
            st = _filter_run(&self.mc, &self.fc, _ptr(view), &pos, e, <uint8_t*>_ptr(ov), &op,
                             ov.shape[0])
        if st == ST_END:
            return (FILTER_DONE, pos, op)
        if st == ST_NEED_PYTHON:
            return (FILTER_NEED_PYTHON, pos, op)
        if st == ST_OUTPUT_FULL:
            return (FILTER_OUTPUT_FULL, pos, op)
        _raise_status(st, pos, file)

    @staticmethod
    def room_needed(buf, pos, payload_len=None) -> int:
        """Output bytes the batch at ``pos`` may need (``payload_len``: its decompressed
        records' size, for a compressed batch)."""
        cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
        cdef Py_ssize_t p = _i64_arg(pos, "pos", InvalidArgumentError)
        cdef int64_t records = _opt_i64(payload_len, -1, "payload_len")
        cdef BatchHeader h
        _resolve_end(view.shape[0], p, None)   # scan_one reads from p: never before 0
        cdef int st = scan_one(_ptr(view), p, view.shape[0], &h)
        _raise_status(st, p, None)
        if st != ST_OK:
            raise InvalidArgumentError(f"no complete batch at position {p}")
        return _room_needed(&h, h.size - V2_HEADER_C if payload_len is None else records)

    def filter_one(self, buf, pos, mode, bint discard_records, bint marker_for_empty_txn, out,
                   out_pos, payload=None, file=None):
        """Decide and write the magic-2 batch at ``buf[pos]`` (records from ``payload`` when
        the batch is compressed). Returns ``(out_pos, rebuilt)``; a rebuilt batch is written
        uncompressed with CRC 0 (the caller compresses it with its codec and sets the CRC)."""
        return self._filter_one(
            buf, _i64_arg(pos, "pos", InvalidArgumentError),
            _int_arg(mode, "mode", InvalidArgumentError, RETAIN_EMPTY, DELETE_EMPTY,
                     "0 (RETAIN_EMPTY), 1 (DELETE) or 2 (DELETE_EMPTY)", OffsetTypeError),
            discard_records, marker_for_empty_txn, out,
            _i64_arg(out_pos, "out_pos", InvalidArgumentError), payload, file)

    cdef _filter_one(self, buf, Py_ssize_t pos, int mode, bint discard_records,
                     bint marker_for_empty_txn, out, Py_ssize_t out_pos, payload, file):
        cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
        cdef BatchHeader h
        _resolve_end(view.shape[0], pos, None)   # scan_one reads from pos: never before 0
        cdef int st = scan_one(_ptr(view), pos, view.shape[0], &h)
        _raise_status(st, pos, file)
        if st != ST_OK or h.magic < 2:
            raise InvalidArgumentError(f"no complete magic-2 batch at position {pos}")
        cdef uint8_t[::1] ov = _byte_buffer(out, "out", True)
        if out_pos < 0 or out_pos > ov.shape[0]:
            raise InvalidArgumentError("out_pos outside the output buffer")
        cdef const uint8_t[::1] pv
        cdef const uint8_t* rb
        cdef Py_ssize_t rstart, rend
        if (h.attributes & ATTR_CODEC) != 0:
            if payload is None:
                raise InvalidArgumentError("a compressed batch needs its decompressed records")
            pv = _byte_buffer(payload, "payload")
            rb = _ptr(pv)
            rstart = 0
            rend = pv.shape[0]
        else:
            rb = _ptr(view)
            rstart = pos + V2_HEADER_C
            rend = pos + h.size
        cdef Py_ssize_t op = out_pos
        cdef bint rebuilt
        self.fc.ahead = self.fc.ahead_end = NULL
        with nogil:
            st = _filter_batch(&self.mc, &self.fc, &h, _ptr(view) + pos, rb, rstart, rend,
                               mode, discard_records, marker_for_empty_txn, &ov[0], &op,
                               ov.shape[0], &rebuilt)
        if st == ST_OUTPUT_FULL:
            raise InvalidArgumentError("output buffer has no room for the batch (see "
                                       "room_needed)")
        _raise_status(st, pos, file)
        return (op, bool(rebuilt))

    def count_legacy(self, messages, size, written_messages, written_bytes, max_offset,
                     invalid):
        """Account for a legacy (magic 0/1) batch the caller filtered in Python."""
        # Every argument converted before any counter changes.
        cdef int64_t counts[5]
        for i, (v, name) in enumerate(((messages, "messages"), (size, "size"),
                                       (written_messages, "written_messages"),
                                       (written_bytes, "written_bytes"), (invalid, "invalid"))):
            counts[i] = _i64_arg(v, name, InvalidArgumentError)
        cdef int64_t top = _i64_arg(max_offset, "max_offset", InvalidOffsetError)
        self.fc.messages_read += counts[0]
        self.fc.bytes_read += counts[1]
        self.fc.messages_written += counts[2]
        self.fc.bytes_written += counts[3]
        self.fc.invalid += counts[4]
        if top > self.fc.max_offset:
            self.fc.max_offset = top


cdef extern from "sys/mman.h" nogil:
    int _clean_madvise "madvise"(void* addr, size_t length, int advice)
    int _CLEAN_MADV_DONTNEED "MADV_DONTNEED"


def plain_batches(buf, start=0, end=None):
    """Walk the batch headers of ``buf[start:end]`` (no CRCs, nothing allocated) while every
    batch is *plain*: one ``BatchFilter.run`` decides without the caller (no legacy format,
    codec, control batch or producer id). Returns ``(position, plain)``: where the
    walk stopped, and False when it stopped at a batch that is not plain or damaged; True at
    ``end`` or at a batch running past it (``position`` = that batch's start)."""
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t pos = _i64_arg(start, "start", InvalidArgumentError)
    cdef Py_ssize_t e = _resolve_end(view.shape[0], pos, end)
    cdef const uint8_t* b = _ptr(view)
    cdef BatchHeader h
    cdef int st = ST_OK
    cdef bint plain = True
    with nogil:
        while True:
            st = scan_one(b, pos, e, &h)
            if st != ST_OK:
                plain = st == ST_END
                break
            if _needs_caller(&h):
                plain = False
                break
            pos += h.size
    return pos, plain


def release_pages(buf, start, end) -> None:
    """Drop this process's page-table entries for the pages of the file mapping ``buf`` that
    hold ``buf[start:end]`` (the page cache keeps the data; a later touch maps it again).

    Like ``mmap.madvise(MADV_DONTNEED, ...)`` over the same pages, but without the GIL: the
    call flushes TLBs (interrupting the other core when another thread of the process runs
    there), and with the GIL held another cleaner thread could not return from its kernels
    meanwhile. ``buf`` must be a read-only ``mmap.mmap``: on other memory the call would
    discard data."""
    if not _pages_droppable(buf):
        raise BufferTypeError(f"buf must be a read-only mmap.mmap (dropping the pages of a "
                              f"{'writable ' if isinstance(buf, _mmap.mmap) else ''}"
                              f"{type(buf).__name__} would lose its data)")
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t s = _i64_arg(start, "start", InvalidArgumentError)
    cdef Py_ssize_t e = _i64_arg(end, "end", InvalidArgumentError)
    if s < 0 or e > view.shape[0] or s > e:
        raise InvalidArgumentError(f"range [{s}, {e}) is outside the mapping")
    if s == e:
        return
    cdef size_t page = _mmap.PAGESIZE
    cdef size_t lo = <size_t>&view[0] + <size_t>s
    cdef size_t hi = <size_t>&view[0] + <size_t>e
    lo = lo & ~(page - 1)
    with nogil:
        _clean_madvise(<void*>lo, hi - lo, _CLEAN_MADV_DONTNEED)   # advisory: failure is harmless


def finish_crcs(out, start, end):
    """Compute the CRC of every v2 batch in ``out[start:end]`` whose CRC field is 0."""
    _finish_crcs(_byte_buffer(out, "out", True), _i64_arg(start, "start", InvalidArgumentError),
                 _i64_arg(end, "end", InvalidArgumentError))


cdef int _finish_crcs(out, Py_ssize_t start, Py_ssize_t end) except -1:
    cdef uint8_t[::1] ov = out
    cdef BatchHeader h
    cdef Py_ssize_t pos = start
    cdef bint bad = False
    if start < 0 or end > ov.shape[0] or start > end:
        raise InvalidArgumentError(f"range [{start}, {end}) is outside the buffer")
    if start == end:
        return 0
    cdef uint8_t* b = &ov[0]
    if _crc_fn != NULL:
        # Without the GIL: a round's rebuilt batches are most of its output, and another
        # cleaner thread should not wait for their CRCs.
        with nogil:
            while pos < end:
                if scan_one(b, pos, end, &h) != ST_OK:
                    bad = True
                    break
                if h.magic == 2 and h.crc == 0:
                    wr_u32(b + pos + 17, crc32c_c(b + pos + 21, h.size - 21))
                pos += h.size
        if bad:
            raise InvalidArgumentError(f"no complete batch at position {pos}")
        return 0
    mv = memoryview(out)
    while pos < end:
        if scan_one(b, pos, end, &h) != ST_OK:
            raise InvalidArgumentError(f"no complete batch at position {pos}")
        if h.magic == 2 and h.crc == 0:
            wr_u32(b + pos + 17, _crc32c_pkg(mv[pos + 21:pos + h.size]))
        pos += h.size
    return 0


def compress_batch_at(out, pos, size, codec):
    """The uncompressed v2 batch at ``out[pos:pos+size]`` with its records compressed by
    ``codec`` at its default level, attributes and CRC updated: a new bytearray."""
    out = _byte_buffer(out, "out")
    cdef Py_ssize_t p = _i64_arg(pos, "pos", InvalidArgumentError)
    cdef Py_ssize_t n = _i64_arg(size, "size", InvalidArgumentError)
    cdef int c = _i32_arg(codec, "codec", InvalidArgumentError)
    # n > len - p, not p + n > len: the sum of two huge ints wrapped negative.
    if p < 0 or n < V2_HEADER_C or p > len(out) or n > len(out) - p:
        raise InvalidArgumentError(f"no batch at [{p}, {p} + {n}) of the "
                                   f"{len(out)}-byte buffer")
    return _compress_batch(out, p, n, c, None)
