# Records without a key, for a compacted topic's appends (Kafka's LogValidator.validateKey:
# "Compacted topic cannot accept message without key"). Included by _core.pyx.


cdef int _null_key_index(const uint8_t* b, Py_ssize_t p, Py_ssize_t end, int32_t n,
                         int32_t* at) noexcept nogil:
    """Index of the first of ``n`` records in [p, end) whose key is null (-1 if none): each
    record's length, attributes, deltas and key length are read, nothing else."""
    cdef int32_t i, length, od, kl
    cdef int64_t tsd
    cdef Py_ssize_t q, rec_end
    cdef int st
    at[0] = -1
    for i in range(n):
        st = read_varint(b, &p, end, &length)
        if st != ST_OK:
            return st
        if length < 1 or length > end - p:
            return ST_RECORD_LENGTH
        rec_end = p + length
        q = p + 1  # attributes
        st = read_varlong(b, &q, rec_end, &tsd)
        if st == ST_OK:
            st = read_varint(b, &q, rec_end, &od)
        if st == ST_OK:
            st = read_varint(b, &q, rec_end, &kl)
        if st != ST_OK:
            return ST_RECORD_LENGTH if st == ST_TRUNCATED else st
        if kl < 0:
            at[0] = i
            return ST_OK
        p = rec_end
    return ST_OK


def first_null_key(buf, batches, file=None):
    """Index (counting the records of ``batches`` from 0) of the first data record whose key
    is null, or None; ``batches`` are ``scan_batches`` rows over ``buf`` (v2). Compressed
    batches are decompressed; control batches have keys. Malformed records raise
    CorruptRecordError."""
    if not isinstance(batches, np.ndarray) or batches.dtype != BATCH_DTYPE:
        raise InvalidArgumentError(f"batches must be scan_batches rows (an array of "
                                   f"BATCH_DTYPE), not {type(batches).__name__}")
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef const uint8_t[::1] rec
    cdef Py_ssize_t pos, size
    cdef int32_t n, at
    cdef int st, codec
    cdef int64_t seen = 0
    mv = memoryview(buf)
    # The header columns as lists: a structured row costs a microsecond per field read.
    for pos, size, n, attributes in zip(batches["position"].tolist(), batches["size"].tolist(),
                                        batches["records_count"].tolist(),
                                        batches["attributes"].tolist()):
        if attributes & ATTR_CONTROL:
            seen += n
            continue
        if (pos < 0 or size < V2_HEADER_C or pos > view.shape[0]
                or size > view.shape[0] - pos or n < 0):
            raise CorruptRecordError("batch outside the buffer", file=file, position=pos)
        codec = attributes & ATTR_CODEC
        if codec:
            rec = _compression.decompress(codec, mv[pos + V2_HEADER_C:pos + size])
            with nogil:
                st = _null_key_index(_ptr(rec), 0, rec.shape[0], n, &at)
        else:
            with nogil:
                st = _null_key_index(_ptr(view), pos + V2_HEADER_C, pos + size, n, &at)
        if st != ST_OK:
            _raise_status(st, pos, file)
        if at >= 0:
            return seen + at
        seen += n
    return None
