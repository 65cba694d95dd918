# Decoding v2 records into numpy columns.
# Included by _core.pyx; shares its namespace.

cdef int parse_record(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                      RecordView* r) noexcept nogil:
    """Parse one v2 record at pos[0] (REF §1.7); every length is checked against its record end."""
    cdef int32_t length, klen, vlen, i
    cdef int st
    cdef Py_ssize_t p, rec_end
    st = read_varint(b, pos, end, &length)
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
    st = read_varlong(b, &p, rec_end, &r.timestamp_delta)
    if st != ST_OK:
        return st
    st = read_varint(b, &p, rec_end, &r.offset_delta)
    if st != ST_OK:
        return st
    st = read_varint(b, &p, rec_end, &r.key_len)
    if st != ST_OK:
        return st
    if r.key_len < -1:
        return ST_NEGATIVE_LENGTH
    r.key_pos = p
    if r.key_len > 0:
        if r.key_len > rec_end - p:
            return ST_TRUNCATED
        p += r.key_len
    st = read_varint(b, &p, rec_end, &r.value_len)
    if st != ST_OK:
        return st
    if r.value_len < -1:
        return ST_NEGATIVE_LENGTH
    r.value_pos = p
    if r.value_len > 0:
        if r.value_len > rec_end - p:
            return ST_TRUNCATED
        p += r.value_len
    st = read_varint(b, &p, rec_end, &r.header_count)
    if st != ST_OK:
        return st
    if r.header_count < 0 or r.header_count > rec_end - p:
        return ST_HEADER_COUNT
    r.headers_pos = p
    r.header_key_bytes = 0
    r.header_value_bytes = 0
    for i in range(r.header_count):
        st = read_varint(b, &p, rec_end, &klen)
        if st != ST_OK:
            return st
        if klen < 0:
            return ST_NEGATIVE_LENGTH
        if klen > rec_end - p:
            return ST_TRUNCATED
        p += klen
        r.header_key_bytes += klen
        st = read_varint(b, &p, rec_end, &vlen)
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
    Py_ssize_t position   # batch position, for error reports


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
    # running totals
    Py_ssize_t n
    int64_t key_bytes
    int64_t value_bytes
    int64_t n_headers
    int64_t hk_bytes
    int64_t hv_bytes


cdef int decode_region_columns(const Region* reg, const BatchHeader* h, int64_t min_offset,
                               int64_t end_offset, Py_ssize_t max_records, bint headers,
                               ColumnSink* s, Py_ssize_t* err_pos) noexcept nogil:
    """Count (sink pointers NULL) or write the selected records of one batch into columns."""
    cdef const uint8_t* b = reg.data
    cdef Py_ssize_t pos = reg.start
    cdef RecordView r
    cdef int st
    cdef int32_t j, prev = -1
    cdef int32_t klen, vlen, k
    cdef int64_t offset, ts
    cdef bint log_append = (h.attributes & 0x08) != 0
    cdef bint fill = s.offsets != NULL
    cdef Py_ssize_t hp
    if h.records_count < 0:
        err_pos[0] = reg.position
        return ST_RECORD_COUNT
    for j in range(h.records_count):
        st = parse_record(b, &pos, reg.end, &r)
        if st != ST_OK:
            err_pos[0] = reg.position
            return st
        if r.offset_delta <= prev or r.offset_delta > h.last_offset_delta:
            err_pos[0] = reg.position
            return ST_OFFSET_DELTA
        prev = r.offset_delta
        offset = h.base_offset + r.offset_delta
        if offset < min_offset or offset >= end_offset or s.n >= max_records:
            continue
        if fill:
            ts = h.max_timestamp if log_append else h.base_timestamp + r.timestamp_delta
            s.offsets[s.n] = offset
            s.timestamps[s.n] = ts
            s.ts_types[s.n] = 1 if log_append else 0
            if r.key_len >= 0:
                memcpy(s.key_data + s.key_bytes, b + r.key_pos, r.key_len)
                s.key_valid[s.n] = 1
            else:
                s.key_valid[s.n] = 0
            if r.value_len >= 0:
                memcpy(s.value_data + s.value_bytes, b + r.value_pos, r.value_len)
                s.value_valid[s.n] = 1
            else:
                s.value_valid[s.n] = 0
        if r.key_len > 0:
            s.key_bytes += r.key_len
        if r.value_len > 0:
            s.value_bytes += r.value_len
        if headers:
            if fill:
                hp = r.headers_pos
                for k in range(r.header_count):
                    # Already validated by parse_record; read_varint cannot fail here.
                    read_varint(b, &hp, reg.end, &klen)
                    memcpy(s.hk_data + s.hk_bytes, b + hp, klen)
                    hp += klen
                    s.hk_bytes += klen
                    s.hk_offsets[s.n_headers + 1] = s.hk_bytes
                    read_varint(b, &hp, reg.end, &vlen)
                    if vlen >= 0:
                        memcpy(s.hv_data + s.hv_bytes, b + hp, vlen)
                        hp += vlen
                        s.hv_bytes += vlen
                        s.hv_valid[s.n_headers] = 1
                    else:
                        s.hv_valid[s.n_headers] = 0
                    s.hv_offsets[s.n_headers + 1] = s.hv_bytes
                    s.n_headers += 1
                s.hdr_offsets[s.n + 1] = s.n_headers
            else:
                s.n_headers += r.header_count
                s.hk_bytes += r.header_key_bytes
                s.hv_bytes += r.header_value_bytes
        if fill:
            s.key_offsets[s.n + 1] = s.key_bytes
            s.value_offsets[s.n + 1] = s.value_bytes
        s.n += 1
    if pos != reg.end:
        err_pos[0] = reg.position
        return ST_LEFTOVER
    return ST_OK


cdef class _Regions:
    """The v2 record regions of a scanned range, with decompressed payloads kept alive."""
    cdef Region* items
    cdef Py_ssize_t n
    cdef list keep
    cdef bint has_legacy

    def __dealloc__(self):
        free(self.items)


cdef _Regions _regions(object obj, const uint8_t[::1] view, _Scan scan, int64_t min_offset,
                       int64_t end_offset, bint include_control, object file):
    """Select the batches overlapping [min_offset, end_offset) and locate their records."""
    cdef _Regions regs = _Regions.__new__(_Regions)
    cdef HeaderVec* vec = &scan.headers.vec
    regs.items = <Region*>malloc((vec.n if vec.n else 1) * sizeof(Region))
    if regs.items == NULL:
        raise MemoryError()
    regs.n = 0
    regs.keep = []
    regs.has_legacy = False
    cdef Py_ssize_t i
    cdef BatchHeader* h
    cdef int codec
    cdef const uint8_t[::1] dview
    cdef Region* reg
    mv = None
    for i in range(vec.n):
        h = &vec.items[i]
        if h.magic < 2:
            regs.has_legacy = True
            continue
        if h.last_offset < min_offset or (h.base_offset >= end_offset):
            continue
        if (h.attributes & 0x20) and not include_control:
            continue
        codec = h.attributes & 0x07
        reg = &regs.items[regs.n]
        reg.batch = i
        reg.position = h.position
        if codec == 0:
            reg.data = _ptr(view)
            reg.start = h.position + V2_HEADER_C
            reg.end = h.position + h.size
        elif codec <= 4:
            if mv is None:
                mv = memoryview(obj).cast("B") if not isinstance(obj, memoryview) else obj.cast("B")
            try:
                payload = _compression.decompress(codec, mv[h.position + V2_HEADER_C:h.position + h.size])
            except CorruptRecordError as e:
                raise CorruptRecordError(e.reason, file=file, position=h.position) from None
            dview = payload
            regs.keep.append(payload)
            reg.data = _ptr(dview)
            reg.start = 0
            reg.end = dview.shape[0]
        else:
            _raise_status(ST_BAD_CODEC, h.position, file, f"codec id {codec}")
        regs.n += 1
    return regs


cdef inline int64_t _opt_i64(object v, int64_t default) except? -1:
    return default if v is None else v


def decode_columns(buf, Py_ssize_t start=0, end=None, *, min_offset=None, end_offset=None,
                   max_records=None, bint validate_crc=True, bint include_headers=False,
                   topic=None, partition=None, file=None):
    """Selected records of a buffer range straight into numpy columns (control batches skipped)."""
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t e = _resolve_end(view.shape[0], start, end)
    cdef int64_t lo = _opt_i64(min_offset, -INT64_MAX_C - 1)
    cdef int64_t hi = _opt_i64(end_offset, INT64_MAX_C)
    cdef Py_ssize_t limit = INT64_MAX_C if max_records is None else max_records
    if limit < 0:
        raise ValueError(f"max_records must be >= 0, got {max_records}")
    cdef _Scan scan = _scan(buf, view, start, e, validate_crc, -1)
    _raise_status(scan.status, scan.error_pos, file)
    cdef _Regions regs = _regions(buf, view, scan, lo, hi, False, file)
    if regs.has_legacy:
        return _columns_from_records(
            decode_records(buf, start, e, min_offset=min_offset, end_offset=end_offset,
                           max_records=max_records, validate_crc=validate_crc, file=file),
            include_headers, topic, partition)
    cdef ColumnSink s
    memset(&s, 0, sizeof(ColumnSink))
    cdef Py_ssize_t i, err_pos = 0
    cdef int st = ST_OK
    cdef HeaderVec* vec = &scan.headers.vec
    with nogil:
        for i in range(regs.n):
            st = decode_region_columns(&regs.items[i], &vec.items[regs.items[i].batch], lo, hi,
                                       limit, include_headers, &s, &err_pos)
            if st != ST_OK or s.n >= limit:
                break
    _raise_status(st, err_pos, file)
    cdef Py_ssize_t n = s.n
    offsets = np.empty(n, dtype=np.int64)
    timestamps = np.empty(n, dtype=np.int64)
    ts_types = np.empty(n, dtype=np.int8)
    key_offsets = np.empty(n + 1, dtype=np.int64)
    key_valid = np.empty(n, dtype=np.bool_)
    key_data = np.empty(s.key_bytes, dtype=np.uint8)
    value_offsets = np.empty(n + 1, dtype=np.int64)
    value_valid = np.empty(n, dtype=np.bool_)
    value_data = np.empty(s.value_bytes, dtype=np.uint8)
    cdef int64_t[::1] v_off = offsets, v_ts = timestamps, v_ko = key_offsets, v_vo = value_offsets
    cdef int8_t[::1] v_tt = ts_types
    cdef uint8_t[::1] v_kv = key_valid.view(np.uint8), v_vv = value_valid.view(np.uint8)
    cdef uint8_t[::1] v_kd = key_data, v_vd = value_data
    cdef int64_t[::1] v_ho, v_hko, v_hvo
    cdef uint8_t[::1] v_hkd, v_hvd, v_hvv
    cdef ColumnSink f
    memset(&f, 0, sizeof(ColumnSink))
    dummy = np.empty(1, dtype=np.uint8)
    cdef uint8_t[::1] v_dummy = dummy
    f.offsets = &v_off[0] if n else <int64_t*>&v_ko[0]
    f.timestamps = &v_ts[0] if n else <int64_t*>&v_ko[0]
    f.ts_types = &v_tt[0] if n else <int8_t*>&v_dummy[0]
    f.key_offsets = &v_ko[0]
    f.key_valid = &v_kv[0] if n else &v_dummy[0]
    f.key_data = &v_kd[0] if s.key_bytes else &v_dummy[0]
    f.value_offsets = &v_vo[0]
    f.value_valid = &v_vv[0] if n else &v_dummy[0]
    f.value_data = &v_vd[0] if s.value_bytes else &v_dummy[0]
    v_ko[0] = 0
    v_vo[0] = 0
    header_col = None
    if include_headers:
        hdr_offsets = np.empty(n + 1, dtype=np.int64)
        hk_offsets = np.empty(s.n_headers + 1, dtype=np.int64)
        hk_data = np.empty(s.hk_bytes, dtype=np.uint8)
        hv_offsets = np.empty(s.n_headers + 1, dtype=np.int64)
        hv_valid = np.empty(s.n_headers, dtype=np.bool_)
        hv_data = np.empty(s.hv_bytes, dtype=np.uint8)
        v_ho = hdr_offsets
        v_hko = hk_offsets
        v_hvo = hv_offsets
        v_hkd = hk_data
        v_hvd = hv_data
        v_hvv = hv_valid.view(np.uint8)
        v_ho[0] = 0
        v_hko[0] = 0
        v_hvo[0] = 0
        f.hdr_offsets = &v_ho[0]
        f.hk_offsets = &v_hko[0]
        f.hv_offsets = &v_hvo[0]
        f.hk_data = &v_hkd[0] if s.hk_bytes else &v_dummy[0]
        f.hv_data = &v_hvd[0] if s.hv_bytes else &v_dummy[0]
        f.hv_valid = &v_hvv[0] if s.n_headers else &v_dummy[0]
    if n:
        with nogil:
            for i in range(regs.n):
                st = decode_region_columns(&regs.items[i], &vec.items[regs.items[i].batch], lo,
                                           hi, limit, include_headers, &f, &err_pos)
                if st != ST_OK or f.n >= n:
                    break
        _raise_status(st, err_pos, file)
    if include_headers:
        header_col = HeaderColumn(
            hdr_offsets,
            BinaryColumn(hk_data, hk_offsets, np.ones(s.n_headers, dtype=np.bool_)),
            BinaryColumn(hv_data, hv_offsets, hv_valid))
    return RecordColumns(offsets, timestamps, ts_types,
                         BinaryColumn(key_data, key_offsets, key_valid),
                         BinaryColumn(value_data, value_offsets, value_valid),
                         header_col, topic, partition)


def _columns_from_records(records, bint include_headers, topic, partition):
    # Legacy (v0/v1) data is rare and read-only: build columns from decoded records.
    n = len(records)
    headers = None
    if include_headers:
        counts = np.zeros(n + 1, dtype=np.int64)
        hkeys, hvals = [], []
        for i, r in enumerate(records):
            counts[i + 1] = len(r.headers)
            for k, v in r.headers:
                hkeys.append(k.encode("utf-8"))
                hvals.append(v)
        hk = BinaryColumn.from_pylist(hkeys)
        headers = HeaderColumn(np.cumsum(counts), hk, BinaryColumn.from_pylist(hvals))
    return RecordColumns(
        np.array([r.offset for r in records], dtype=np.int64),
        np.array([r.timestamp for r in records], dtype=np.int64),
        np.array([r.timestamp_type for r in records], dtype=np.int8),  # -1 for magic 0
        BinaryColumn.from_pylist([r.key for r in records]),
        BinaryColumn.from_pylist([r.value for r in records]),
        headers, topic, partition)
