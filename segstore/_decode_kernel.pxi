# The column decode's per-batch kernel: one v2 record parsed (every length checked against
# its record's end), and a batch's selected records counted or written into a ColumnSink,
# straight or through streams. Included by _decode.pxi; shares _core's namespace.

# The fill pass reads batches that the counting pass read a while ago, from memory: it asks
# for them this far ahead, up to PREFETCH_LINES lines per record. On the 1M-record log (2
# threads, runs back to back) 4 KiB ahead took 17.1 - 17.3 ms, 2 KiB 17.2 - 17.5, none
# 18.2 - 22.4.
cdef Py_ssize_t PREFETCH_DIST = 4096
cdef enum:
    PREFETCH_LINES = 4


def _set_prefetch(Py_ssize_t dist):
    """Tune (0: off) how far ahead the fill pass prefetches; returns the previous value."""
    global PREFETCH_DIST
    old = PREFETCH_DIST
    PREFETCH_DIST = dist
    return old


cdef inline const uint8_t* _prefetch_lines(const uint8_t* p, const uint8_t* end) noexcept nogil:
    """Ask for up to PREFETCH_LINES lines from ``p`` on, none at or past ``end``; returns where
    the next ask starts."""
    cdef int k = 0
    while p < end and k < PREFETCH_LINES:
        SEGSTORE_PREFETCH(p)
        p += 64
        k += 1
    return p


cdef inline int parse_record(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                      RecordView* r) noexcept nogil:
    """Parse one v2 record at pos[0] (REF §1.7); every length is checked against its record end."""
    cdef int32_t length, klen, vlen, i
    cdef int st
    cdef Py_ssize_t p, rec_end
    st = read_varint_fast(b, pos, end, &length)
    if st != ST_OK:
        return st
    if length < 0:
        return ST_NEGATIVE_LENGTH
    if length > end - pos[0]:
        return ST_TRUNCATED
    rec_end = pos[0] + length
    p = pos[0]
    if p >= rec_end:
        return ST_RECORD_LENGTH
    p += 1  # attributes: unused
    st = read_varlong_fast(b, &p, rec_end, &r.timestamp_delta)
    if st != ST_OK:
        return st
    st = read_varint_fast(b, &p, rec_end, &r.offset_delta)
    if st != ST_OK:
        return st
    st = read_varint_fast(b, &p, rec_end, &r.key_len)
    if st != ST_OK:
        return st
    if r.key_len < -1:
        return ST_NEGATIVE_LENGTH
    r.key_pos = p
    if r.key_len > 0:
        if r.key_len > rec_end - p:
            return ST_TRUNCATED
        p += r.key_len
    st = read_varint_fast(b, &p, rec_end, &r.value_len)
    if st != ST_OK:
        return st
    if r.value_len < -1:
        return ST_NEGATIVE_LENGTH
    r.value_pos = p
    if r.value_len > 0:
        if r.value_len > rec_end - p:
            return ST_TRUNCATED
        p += r.value_len
    st = read_varint_fast(b, &p, rec_end, &r.header_count)
    if st != ST_OK:
        return st
    if r.header_count < 0 or r.header_count > rec_end - p:
        return ST_HEADER_COUNT
    r.headers_pos = p
    r.header_key_bytes = 0
    r.header_value_bytes = 0
    for i in range(r.header_count):
        st = read_varint_fast(b, &p, rec_end, &klen)
        if st != ST_OK:
            return st
        if klen < 0:
            return ST_NEGATIVE_LENGTH
        if klen > rec_end - p:
            return ST_TRUNCATED
        p += klen
        r.header_key_bytes += klen
        st = read_varint_fast(b, &p, rec_end, &vlen)
        if st != ST_OK:
            return st
        if vlen < -1:
            return ST_NEGATIVE_LENGTH
        if vlen > 0:
            if vlen > rec_end - p:
                return ST_TRUNCATED
            p += vlen
            r.header_value_bytes += vlen
    if p != rec_end:
        return ST_RECORD_LENGTH
    pos[0] = rec_end
    return ST_OK


# The records of one v2 batch: a slice of the scanned buffer or of a decompressed payload.
cdef struct Region:
    const uint8_t* data
    Py_ssize_t start
    Py_ssize_t end
    Py_ssize_t batch      # index into the scanned headers
    const BatchHeader* header
    Py_ssize_t position   # batch position, for error reports
    bint crc_pending      # CRC still to check (done batch by batch, while the bytes are hot)
    int source            # which buffer of a multi-buffer decode the batch came from
    bint release          # the bytes lie in a shared file mapping whose pages may be dropped


# Record and byte counts of a column decode's output: a batch's sizes, where its output
# starts, a sink's running totals, or how far a sink may write.
cdef struct ColumnCounts:
    int64_t n               # records
    int64_t key_bytes
    int64_t value_bytes
    int64_t n_headers
    int64_t hk_bytes        # header keys
    int64_t hv_bytes        # header values


# Output of a column decode; pointers are NULL on the counting pass.
cdef struct ColumnSink:
    int64_t* offsets
    int64_t* timestamps
    int8_t* ts_types
    int64_t* key_offsets
    uint8_t* key_valid
    uint8_t* key_data
    int64_t* value_offsets
    uint8_t* value_valid
    uint8_t* value_data
    int64_t* hdr_offsets
    int64_t* hk_offsets
    uint8_t* hk_data
    int64_t* hv_offsets
    uint8_t* hv_valid
    uint8_t* hv_data
    ColumnCounts at         # running totals: where the next record's output goes
    ColumnCounts cap        # filling: the ends no write may pass (unused when counting)
    Py_ssize_t prefetch     # filling from memory: how far ahead to prefetch (0: not)
    const uint8_t* next     # the next batch's bytes not yet prefetched, up to next_end
    const uint8_t* next_end #   (asked for a few lines per record while this batch is parsed)


cdef inline ColumnCounts _counts_sum(const ColumnCounts* a, const ColumnCounts* b) noexcept nogil:
    cdef ColumnCounts c
    c.n = a.n + b.n
    c.key_bytes = a.key_bytes + b.key_bytes
    c.value_bytes = a.value_bytes + b.value_bytes
    c.n_headers = a.n_headers + b.n_headers
    c.hk_bytes = a.hk_bytes + b.hk_bytes
    c.hv_bytes = a.hv_bytes + b.hv_bytes
    return c


cdef inline bint _counts_equal(const ColumnCounts* a, const ColumnCounts* b) noexcept nogil:
    return memcmp(a, b, sizeof(ColumnCounts)) == 0


include "_stream_out.pxi"


cdef inline int _copy_headers(const uint8_t* b, Py_ssize_t hp, Py_ssize_t end, int32_t count,
                              ColumnSink* s) noexcept nogil:
    """Copy one record's headers from hp into the header columns. The bytes were checked by
    parse_record, but are read again here: each length is checked anew against the buffer
    and the capacity (ST_CHANGED if they differ from what was counted)."""
    cdef int32_t k, klen, vlen
    for k in range(count):
        if (read_varint(b, &hp, end, &klen) != ST_OK or klen < 0 or klen > end - hp
                or klen > s.cap.hk_bytes - s.at.hk_bytes or s.at.n_headers >= s.cap.n_headers):
            return ST_CHANGED
        memcpy(s.hk_data + s.at.hk_bytes, b + hp, klen)
        hp += klen
        s.at.hk_bytes += klen
        s.hk_offsets[s.at.n_headers + 1] = s.at.hk_bytes
        if read_varint(b, &hp, end, &vlen) != ST_OK or vlen > end - hp:
            return ST_CHANGED
        if vlen >= 0:
            if vlen > s.cap.hv_bytes - s.at.hv_bytes:
                return ST_CHANGED
            memcpy(s.hv_data + s.at.hv_bytes, b + hp, vlen)
            hp += vlen
            s.at.hv_bytes += vlen
            s.hv_valid[s.at.n_headers] = 1
        else:
            s.hv_valid[s.at.n_headers] = 0
        s.hv_offsets[s.at.n_headers + 1] = s.at.hv_bytes
        s.at.n_headers += 1
    return ST_OK


cdef inline bint count_region_sizes(const Region* reg, const BatchHeader* h,
                                    ColumnSink* s) noexcept nogil:
    """Add to ``s.at`` the records and key and value bytes of a batch all of whose records the
    decode selects, without headers: all that placing its output needs. Returns False,
    leaving ``s.at`` as it was, at anything unusual; the caller then counts the batch in
    full, which names the damage.

    Only the lengths are read, each checked against its record's end, so the walk stays in
    the batch; the deltas and headers are checked by the fill, which parses every record in
    full and fails on a batch that does not fill its place exactly."""
    cdef const uint8_t* b = reg.data
    cdef Py_ssize_t pos = reg.start, end = reg.end, p, rec_end
    cdef int32_t j, length, klen, vlen
    cdef int64_t kb = 0, vb = 0
    if h.records_count < 0:
        return False
    for j in range(h.records_count):
        if s.next < s.next_end:
            s.next = _prefetch_lines(s.next, s.next_end)
        if read_varint_fast(b, &pos, end, &length) != ST_OK or length <= 0 or length > end - pos:
            return False
        rec_end = pos + length
        p = pos + 1                   # attributes
        while p < rec_end and b[p] >= 0x80:   # the timestamp delta: only its end matters
            p += 1
        p += 1
        while p < rec_end and b[p] >= 0x80:   # the offset delta
            p += 1
        p += 1                        # past rec_end only on damage: the next read fails
        if (read_varint_fast(b, &p, rec_end, &klen) != ST_OK or klen < -1
                or klen > rec_end - p):
            return False
        if klen > 0:
            p += klen
            kb += klen
        if (read_varint_fast(b, &p, rec_end, &vlen) != ST_OK or vlen < -1
                or vlen > rec_end - p):
            return False
        if vlen > 0:
            vb += vlen
        pos = rec_end
    if pos != end:
        return False
    s.at.n += h.records_count
    s.at.key_bytes += kb
    s.at.value_bytes += vb
    return True


cdef int decode_region_columns(const Region* reg, const BatchHeader* h, int64_t min_offset,
                               int64_t end_offset, Py_ssize_t max_records, bint headers,
                               ColumnSink* s, ColumnStreams* out,
                               Py_ssize_t* err_pos) noexcept nogil:
    """Count (sink pointers NULL) or write the selected records of one batch into columns:
    through ``out``, streams positioned at the sink's running totals, when given (never with
    headers), else straight into the sink's arrays.

    Writing never passes ``s.cap``: the arrays were sized by a counting pass over the same
    bytes, but a buffer written to meanwhile (a bytearray, a shared mapping) can hold other
    lengths now, which return ST_CHANGED instead of writing past the arrays' ends."""
    cdef const uint8_t* b = reg.data
    cdef Py_ssize_t pos = reg.start
    cdef RecordView r
    cdef int st
    cdef int32_t j, prev = -1
    cdef int64_t offset, ts
    cdef bint log_append = (h.attributes & 0x08) != 0
    cdef bint fill = s.offsets != NULL
    if h.records_count < 0:
        err_pos[0] = reg.position
        return ST_RECORD_COUNT
    cdef Py_ssize_t ahead = 0, fetched = pos + s.prefetch
    for j in range(h.records_count):
        if s.prefetch:
            # Ask for the lines s.prefetch bytes ahead, a few per record: the hardware's own
            # prefetcher alone left the parser waiting on memory at each record.
            ahead = min(pos + s.prefetch, reg.end)
            if fetched < ahead:
                fetched = _prefetch_lines(b + fetched, b + ahead) - b
        if s.next < s.next_end:
            # The next batch's lines, while this one is parsed in the cache: its CRC then
            # reads them from the cache, not from memory.
            s.next = _prefetch_lines(s.next, s.next_end)
        st = parse_record(b, &pos, reg.end, &r)
        if st != ST_OK:
            err_pos[0] = reg.position
            return st
        if r.offset_delta <= prev or r.offset_delta > h.last_offset_delta:
            err_pos[0] = reg.position
            return ST_OFFSET_DELTA
        prev = r.offset_delta
        offset = h.base_offset + r.offset_delta
        if offset < min_offset or offset >= end_offset or s.at.n >= max_records:
            continue
        if fill:
            if (s.at.n >= s.cap.n or r.key_len > s.cap.key_bytes - s.at.key_bytes
                    or r.value_len > s.cap.value_bytes - s.at.value_bytes):
                err_pos[0] = reg.position
                return ST_CHANGED
            ts = h.max_timestamp if log_append else h.base_timestamp + r.timestamp_delta
            if out == NULL:
                s.offsets[s.at.n] = offset
                s.timestamps[s.at.n] = ts
                s.ts_types[s.at.n] = 1 if log_append else 0
                if r.key_len >= 0:
                    memcpy(s.key_data + s.at.key_bytes, b + r.key_pos, r.key_len)
                    s.key_valid[s.at.n] = 1
                else:
                    s.key_valid[s.at.n] = 0
                if r.value_len >= 0:
                    memcpy(s.value_data + s.at.value_bytes, b + r.value_pos, r.value_len)
                    s.value_valid[s.at.n] = 1
                else:
                    s.value_valid[s.at.n] = 0
        if r.key_len > 0:
            s.at.key_bytes += r.key_len
        if r.value_len > 0:
            s.at.value_bytes += r.value_len
        if headers:
            if fill:
                if _copy_headers(b, r.headers_pos, reg.end, r.header_count, s) != ST_OK:
                    err_pos[0] = reg.position
                    return ST_CHANGED
                s.hdr_offsets[s.at.n + 1] = s.at.n_headers
            else:
                s.at.n_headers += r.header_count
                s.at.hk_bytes += r.header_key_bytes
                s.at.hv_bytes += r.header_value_bytes
        if out != NULL:
            _stream_record(out, offset, ts, log_append, b, &r, &s.at, b + reg.end)
        elif fill:
            s.key_offsets[s.at.n + 1] = s.at.key_bytes
            s.value_offsets[s.at.n + 1] = s.at.value_bytes
        s.at.n += 1
    if pos != reg.end:
        err_pos[0] = reg.position
        return ST_LEFTOVER
    return ST_OK
