# Encoding Python lists into v2 batches (encode_batch, control batches), and the record and batch
# header writers that _encode_columns.pxi (numpy columns) shares.
# Included by _core.pyx; shares its namespace.

cdef enum:
    MAX_RECORD_FIELD = 0x7FFFFFFF - 64   # a body must fit its int32 varint with room for overhead


cdef inline int64_t _record_body_size(int64_t ts_delta, int32_t offset_delta, int32_t klen,
                                      int32_t vlen, int32_t hcount, int64_t hbytes) noexcept nogil:
    return (1 + varlong_size(ts_delta) + varint_size(offset_delta)
            + varint_size(klen) + (klen if klen > 0 else 0)
            + varint_size(vlen) + (vlen if vlen > 0 else 0)
            + varint_size(hcount) + hbytes)


cdef inline uint8_t* _write_record_head(uint8_t* p, int32_t body, int64_t ts_delta,
                                        int32_t offset_delta, const uint8_t* k, int32_t klen,
                                        const uint8_t* v, int32_t vlen) noexcept nogil:
    # length, attributes, timestampDelta, offsetDelta, key, value; the caller writes headers.
    p += write_varint(p, body)
    p[0] = 0
    p += 1
    p += write_varlong(p, ts_delta)
    p += write_varint(p, offset_delta)
    p += write_varint(p, klen)
    if klen > 0:
        memcpy(p, k, klen)
        p += klen
    p += write_varint(p, vlen)
    if vlen > 0:
        memcpy(p, v, vlen)
        p += vlen
    return p


cdef inline void _write_batch_header(uint8_t* p, const BatchHeader* h) noexcept nogil:
    # Everything but the CRC, which is computed over the finished bytes [21, end).
    wr_i64(p, h.base_offset)
    wr_i32(p + 8, h.size - LOG_OVERHEAD_C)
    wr_i32(p + 12, h.partition_leader_epoch)
    p[16] = 2
    wr_u32(p + 17, 0)
    wr_i16(p + 21, h.attributes)
    wr_i32(p + 23, h.last_offset_delta)
    wr_i64(p + 27, h.base_timestamp)
    wr_i64(p + 35, h.max_timestamp)
    wr_i64(p + 43, h.producer_id)
    wr_i16(p + 51, h.producer_epoch)
    wr_i32(p + 53, h.base_sequence)
    wr_i32(p + 57, h.records_count)


cdef bytes _utf8(str s, str what, Py_ssize_t i):
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate
        raise InvalidRecordError(f"{what} {i} is not valid UTF-8 text: {e}") from None


cdef int _bytes_arg(object o, list keep, const uint8_t** p, int32_t* n, str what,
                    Py_ssize_t i) except -1:
    """Pointer and length of a key/value/header value (None -> length -1)."""
    cdef const uint8_t[::1] v
    cdef Py_ssize_t length
    if o is None:
        p[0] = NULL
        n[0] = -1
        return 0
    if PyBytes_CheckExact(o):
        p[0] = <const uint8_t*>PyBytes_AS_STRING(o)
        length = len(<bytes>o)
    else:
        if isinstance(o, str):
            o = _utf8(<str>o, what, i)
        try:
            v = o
        except (TypeError, ValueError, BufferError):
            raise InvalidRecordError(
                f"{what} {i} must be bytes-like, str or None, not {type(o).__name__}") from None
        # The export itself, not just the object: until the batch is written, a bytearray
        # cannot be resized (its bytes moved and freed under p[0]) by code that runs
        # meanwhile, such as a caller's headers iterable.
        keep.append(v)
        length = v.shape[0]
        p[0] = _ptr(v)
    if length > MAX_RECORD_FIELD:
        raise InvalidRecordError(f"{what} {i} is larger than 2 GiB")
    n[0] = <int32_t>length
    return 0


cdef _finish_batch(object out, Py_ssize_t pos, Py_ssize_t size):
    """Set the CRC of the batch at out[pos:pos+size] (a bytearray, or a bytes object this
    module just made and nothing else holds yet)."""
    cdef uint8_t* p = _writable_ptr(out) + pos
    if _crc_fn != NULL:
        wr_u32(p + 17, crc32c_c(p + 21, size - 21))
    else:
        wr_u32(p + 17, _crc32c_pkg(memoryview(out)[pos + 21:pos + size]))


cdef object _compress_batch(object out, Py_ssize_t pos, Py_ssize_t size, int codec, level):
    """The batch at out[pos:pos+size] with its records compressed: a new bytearray, CRC set."""
    compressed = _compression.compress(codec, memoryview(out)[pos + V2_HEADER_C:pos + size], level)
    cdef Py_ssize_t clen = len(compressed)
    res = bytearray(V2_HEADER_C + clen)
    res[:V2_HEADER_C] = memoryview(out)[pos:pos + V2_HEADER_C]
    res[V2_HEADER_C:] = compressed
    cdef uint8_t* p = <uint8_t*>(<char*>res)
    wr_i32(p + 8, <int32_t>(V2_HEADER_C + clen - LOG_OVERHEAD_C))
    wr_i16(p + 21, rd_i16(p + 21) | <int16_t>codec)
    _finish_batch(res, 0, V2_HEADER_C + clen)
    return res


cdef int _check_offsets(int64_t base_offset, int64_t last_delta) except -1:
    # Kafka's offsets are >= 0, and the batch's last offset must fit in int64.
    if base_offset < 0:
        raise InvalidOffsetError(f"base_offset must be >= 0, got {base_offset}")
    if base_offset > INT64_MAX_C - last_delta:
        raise InvalidOffsetError(f"base_offset {base_offset} + {last_delta} overflows int64")
    return 0


def _now_ms():
    return int(time.time() * 1000)


# One record of an encode_batch call, and one of its headers: pointers into the caller's
# objects (kept alive by the caller's sequences or by `keep`) and the sizes the batch needs.
cdef struct _RecordIn:
    const uint8_t* k
    const uint8_t* v
    int64_t ts
    int64_t hbytes        # encoded bytes of its headers
    Py_ssize_t h0         # its first header in the flattened header array
    int32_t kl
    int32_t vl
    int32_t od
    int32_t hcount


cdef struct _HeaderIn:
    const uint8_t* k
    const uint8_t* v
    int32_t kl
    int32_t vl


cdef object _fast_sequence(object seq, str what):
    """``seq`` as a tuple or a list of our own (its items then read without a call per item).

    A caller's list is copied to a tuple: the encoder keeps pointers into the items' bytes
    while it runs code that can call back into Python (a headers iterable, a key's
    ``__class__``), and a callback that empties the list would free them under it."""
    if type(seq) is tuple:
        return seq
    if type(seq) is list:
        return tuple(<list>seq)
    if isinstance(seq, (str, bytes, bytearray, memoryview)):
        # One value, not a sequence: "abc" would be three records, b"ab" two timestamps.
        raise InvalidRecordError(f"{what} must be a sequence, not one {type(seq).__name__}")
    try:
        return PySequence_Fast(seq, "")
    except TypeError:
        raise InvalidRecordError(f"{what} must be a sequence, not {type(seq).__name__}") from None


cdef inline bint _is_int_timestamp(object t):
    # An int (a numpy one too), never a bool: a float or NaN would be truncated or refused
    # by the conversion, a str converted.
    return PyLong_CheckExact(t) or (isinstance(t, (int, np.integer)) and not isinstance(t, bool))


cdef int64_t _one_timestamp(object t) except? -1:
    """A single int timestamp as int64, or InvalidRecordError when it does not fit."""
    try:
        return t
    except OverflowError:
        raise InvalidRecordError(f"timestamp {t} does not fit in 64 signed bits") from None


def timestamp_array(timestamps_ms):
    """Timestamps (an array or sequence of ints) as a contiguous int64 array, or
    InvalidRecordError: integer dtypes only, within int64 (a float would be truncated, NaN
    stored as -2**63, a uint64 2**63 wrapped to a negative timestamp)."""
    if isinstance(timestamps_ms, (float, str, bytes, bytearray, memoryview, bool)):
        raise InvalidRecordError(f"timestamps_ms must be integer milliseconds, not "
                                 f"{timestamps_ms!r}")
    arr = np.asarray(timestamps_ms)
    if arr.dtype.kind not in "iu":
        raise InvalidRecordError(f"timestamps_ms must be integer milliseconds, got an array of "
                                 f"dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InvalidRecordError(f"timestamps_ms must be one-dimensional, got an array of "
                                 f"shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > INT64_MAX_C:
        raise InvalidRecordError(f"timestamp {int(arr.max())} does not fit in 64 signed bits")
    return np.ascontiguousarray(arr, dtype=np.int64)


cdef int _read_timestamps(object timestamps_ms, _RecordIn* recs, Py_ssize_t n) except -1:
    """Timestamps: one for all (an int), one per record (a sequence of ints), or now (None)."""
    cdef Py_ssize_t i
    cdef int64_t one
    cdef const int64_t[::1] tv
    if timestamps_ms is None or _is_int_timestamp(timestamps_ms):
        one = _now_ms() if timestamps_ms is None else _one_timestamp(timestamps_ms)
        for i in range(n):
            recs[i].ts = one
        return 0
    if isinstance(timestamps_ms, np.ndarray):
        arr = timestamp_array(timestamps_ms)
        if len(arr) != n:
            raise InvalidRecordError(f"{len(arr)} timestamps for {n} values")
        tv = arr
        for i in range(n):
            recs[i].ts = tv[i]
        return 0
    ts = _fast_sequence(timestamps_ms, "timestamps_ms")
    if PySequence_Fast_GET_SIZE(ts) != n:
        raise InvalidRecordError(f"{PySequence_Fast_GET_SIZE(ts)} timestamps for {n} values")
    for i in range(n):
        item = <object>PySequence_Fast_GET_ITEM(ts, i)
        try:
            if not _is_int_timestamp(item):
                raise TypeError
            recs[i].ts = item
        except (TypeError, OverflowError):
            raise InvalidRecordError(
                f"timestamp {i} must be an int of milliseconds, not {item!r}") from None
    return 0


cdef object _encode(values, keys, headers, timestamps_ms, int64_t base_offset, int codec, level,
                    log_append_time_ms, int64_t producer_id, int producer_epoch,
                    int32_t base_sequence, bint transactional, bint control,
                    int32_t leader_epoch, offset_deltas):
    values = _fast_sequence(values, "values")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(values)
    if n == 0:
        raise InvalidRecordError("a record batch needs at least one record")
    if keys is not None:
        keys = _fast_sequence(keys, "keys")
        if PySequence_Fast_GET_SIZE(keys) != n:
            raise InvalidRecordError(f"{PySequence_Fast_GET_SIZE(keys)} keys for {n} values")
    if headers is not None:
        headers = _fast_sequence(headers, "headers")
        if PySequence_Fast_GET_SIZE(headers) != n:
            raise InvalidRecordError(f"{PySequence_Fast_GET_SIZE(headers)} header lists for "
                                     f"{n} values")
    if offset_deltas is not None:
        offset_deltas = np.asarray(offset_deltas)
        # Integers only: numpy's conversion would truncate 0.9 to 0 and parse "1".
        if offset_deltas.ndim != 1 or (offset_deltas.dtype.kind not in "iu"
                                       and offset_deltas.size):
            raise InvalidOffsetError(f"offset_deltas must be a sequence of ints, got an array "
                                     f"of dtype {offset_deltas.dtype} and shape "
                                     f"{offset_deltas.shape}")
        if len(offset_deltas) != n:
            raise InvalidRecordError(f"{len(offset_deltas)} offset deltas for {n} values")
    if not -32768 <= producer_epoch <= 32767:
        raise InvalidRecordError(f"producer_epoch {producer_epoch} does not fit an int16")
    # One allocation for the per-record fields (a batch of 1,000 records used to take eight
    # numpy arrays); freed whatever happens.
    cdef _RecordIn* recs = <_RecordIn*>malloc(n * sizeof(_RecordIn))
    cdef _HeaderIn* hdrs = NULL
    if recs == NULL:
        raise MemoryError()
    try:
        return _encode_records(values, keys, headers, timestamps_ms, recs, &hdrs, n,
                               base_offset, codec, level, log_append_time_ms, producer_id,
                               producer_epoch, base_sequence, transactional, control,
                               leader_epoch, offset_deltas)
    finally:
        free(recs)
        free(hdrs)


cdef object _encode_records(values, keys, headers, timestamps_ms, _RecordIn* recs,
                            _HeaderIn** hdrs_out, Py_ssize_t n, int64_t base_offset, int codec,
                            level, log_append_time_ms, int64_t producer_id, int producer_epoch,
                            int32_t base_sequence, bint transactional, bint control,
                            int32_t leader_epoch, offset_deltas):
    cdef Py_ssize_t i, j, nh = 0
    cdef list keep = []
    cdef const uint8_t* ptr
    cdef int32_t length
    cdef const int64_t[::1] od_v
    _read_timestamps(timestamps_ms, recs, n)
    if offset_deltas is None:
        for i in range(n):
            recs[i].od = <int32_t>i
    else:
        od_v = np.ascontiguousarray(offset_deltas, dtype=np.int64)
        for i in range(n):
            if od_v[i] < 0 or od_v[i] > 0x7FFFFFFF or (i and od_v[i] <= recs[i - 1].od):
                raise InvalidOffsetError("offset_deltas must be >= 0 and strictly increasing")
            recs[i].od = <int32_t>od_v[i]
    _check_offsets(base_offset, recs[n - 1].od)
    for i in range(n):
        _bytes_arg(<object>PySequence_Fast_GET_ITEM(values, i), keep, &ptr, &length, "value", i)
        recs[i].v = ptr
        recs[i].vl = length
        if keys is None:
            recs[i].k = NULL
            recs[i].kl = -1
        else:
            _bytes_arg(<object>PySequence_Fast_GET_ITEM(keys, i), keep, &ptr, &length, "key", i)
            recs[i].k = ptr
            recs[i].kl = length
        recs[i].h0 = 0
        recs[i].hcount = 0
        recs[i].hbytes = 0
    # Headers: flattened into one array of (key, value) pointers.
    hkeys = []
    hvals = []
    if headers is not None:
        for i in range(n):
            recs[i].h0 = len(hkeys)
            hlist = <object>PySequence_Fast_GET_ITEM(headers, i)
            if hlist is not None:
                if isinstance(hlist, (str, bytes, bytearray, memoryview)):
                    hlist = None  # refused below, as any other non-iterable
                try:
                    items = iter(hlist)
                except TypeError:
                    raise InvalidRecordError(
                        f"headers of record {i} must be a list of (str, bytes|None) pairs, not "
                        f"{type(hlist).__name__}") from None
                for item in items:
                    try:
                        if isinstance(item, (str, bytes, bytearray, memoryview)):
                            raise TypeError  # a 2-character str would unpack into a pair
                        hk, hv = item
                    except (TypeError, ValueError):
                        raise InvalidRecordError(
                            f"header of record {i} must be a (str, bytes|None) pair, not {item!r}"
                        ) from None
                    if isinstance(hk, str):
                        hk = _utf8(<str>hk, "header key of record", i)
                    elif not isinstance(hk, (bytes, bytearray)):
                        raise InvalidRecordError(
                            f"header key of record {i} must be str, not {type(hk).__name__}")
                    hkeys.append(hk)
                    hvals.append(hv)
            recs[i].hcount = <int32_t>(len(hkeys) - recs[i].h0)
    nh = len(hkeys)
    cdef _HeaderIn* hdrs = NULL
    if nh:
        hdrs = <_HeaderIn*>malloc(nh * sizeof(_HeaderIn))
        if hdrs == NULL:
            raise MemoryError()
        hdrs_out[0] = hdrs   # freed by the caller
    for j in range(nh):
        _bytes_arg(hkeys[j], keep, &ptr, &length, "header key", j)
        hdrs[j].k = ptr
        hdrs[j].kl = length
        _bytes_arg(hvals[j], keep, &ptr, &length, "header value", j)
        hdrs[j].v = ptr
        hdrs[j].vl = length
    cdef BatchHeader h
    memset(&h, 0, sizeof(BatchHeader))
    h.base_offset = base_offset
    h.partition_leader_epoch = leader_epoch
    h.magic = 2
    h.attributes = (0x10 if transactional else 0) | (0x20 if control else 0)
    h.last_offset_delta = recs[n - 1].od
    h.base_timestamp = recs[0].ts
    h.max_timestamp = recs[0].ts
    h.producer_id = producer_id
    h.producer_epoch = <int16_t>producer_epoch
    h.base_sequence = base_sequence
    h.records_count = <int32_t>n
    cdef int64_t total = V2_HEADER_C, body
    cdef _RecordIn* r
    for i in range(n):
        r = &recs[i]
        if r.ts > h.max_timestamp:
            h.max_timestamp = r.ts
        for j in range(r.h0, r.h0 + r.hcount):
            r.hbytes += (varint_size(hdrs[j].kl) + hdrs[j].kl + varint_size(hdrs[j].vl)
                         + (hdrs[j].vl if hdrs[j].vl > 0 else 0))
        body = _record_body_size(r.ts - h.base_timestamp, r.od, r.kl, r.vl, r.hcount, r.hbytes)
        if body > MAX_RECORD_FIELD:
            raise InvalidRecordError(f"record {i} is larger than 2 GiB")
        total += varint_size(<int32_t>body) + body
    if total > MAX_RECORD_FIELD:
        raise InvalidRecordError("record batch is larger than 2 GiB")
    if log_append_time_ms is not None:
        h.attributes |= 0x08
        h.max_timestamp = log_append_time_ms
    h.size = <int32_t>total
    # Written straight into the bytes object returned: nothing else holds it yet.
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* base = <uint8_t*>PyBytes_AS_STRING(out)
    cdef uint8_t* p = base + V2_HEADER_C
    _write_batch_header(base, &h)
    for i in range(n):
        r = &recs[i]
        body = _record_body_size(r.ts - h.base_timestamp, r.od, r.kl, r.vl, r.hcount, r.hbytes)
        p = _write_record_head(p, <int32_t>body, r.ts - h.base_timestamp, r.od, r.k, r.kl,
                               r.v, r.vl)
        p += write_varint(p, r.hcount)
        for j in range(r.h0, r.h0 + r.hcount):
            p += write_varint(p, hdrs[j].kl)
            if hdrs[j].kl > 0:
                memcpy(p, hdrs[j].k, hdrs[j].kl)
                p += hdrs[j].kl
            p += write_varint(p, hdrs[j].vl)
            if hdrs[j].vl > 0:
                memcpy(p, hdrs[j].v, hdrs[j].vl)
                p += hdrs[j].vl
    if p - base != total:
        raise AssertionError("segstore: encoded batch size mismatch")
    if codec:
        return bytes(_compress_batch(out, 0, total, codec, level))
    _finish_batch(out, 0, total)
    return out


def encode_batch(values, keys=None, headers=None, timestamps_ms=None, *, base_offset=0,
                 compression=0, compression_level=None, log_append_time_ms=None,
                 producer_id=-1, producer_epoch=-1, base_sequence=-1,
                 bint is_transactional=False, partition_leader_epoch=-1,
                 offset_deltas=None):
    """One record batch v2 with a fresh CRC-32C (see _core.pyi)."""
    return _encode(values, keys, headers, timestamps_ms, _offset_arg(base_offset),
                   _compression.codec_id(compression), compression_level,
                   _opt_field(log_append_time_ms, "log_append_time_ms"),
                   _field(producer_id, "producer_id", 64), _field(producer_epoch,
                   "producer_epoch", 16), _field(base_sequence, "base_sequence", 32),
                   is_transactional, False, _field(partition_leader_epoch,
                   "partition_leader_epoch", 32), offset_deltas)


cdef inline int64_t _offset_arg(object base_offset) except? -1:
    # The range is _check_offsets' (its message names the batch's last offset too).
    return _i64_arg(base_offset, "base_offset", InvalidOffsetError)


cdef int64_t _field(object v, str name, int bits) except? -1:
    """A batch header field: an int of ``bits`` signed bits, or InvalidRecordError."""
    cdef int64_t hi = (<int64_t>1 << (bits - 1)) - 1 if bits < 64 else INT64_MAX_C
    return _int_arg(v, name, InvalidRecordError, -hi - 1, hi, None, InvalidRecordError)


cdef object _opt_field(object v, str name):
    return None if v is None else _field(v, name, 64)


def encode_control_batch(control_type, *, producer_id, producer_epoch,
                         coordinator_epoch=0, base_offset=0,
                         timestamp_ms, partition_leader_epoch=-1):
    """A 78-byte transaction marker batch (ControlRecordType.COMMIT or ABORT; REF §1.8)."""
    cdef int ct = _int_arg(control_type, "control_type", InvalidRecordError, 0, 1,
                           "0 (ABORT) or 1 (COMMIT)", InvalidRecordError)
    producer_id = _field(producer_id, "producer_id", 64)
    producer_epoch = _field(producer_epoch, "producer_epoch", 16)
    cdef int32_t coord = _field(coordinator_epoch, "coordinator_epoch", 32)
    base_offset = _offset_arg(base_offset)
    timestamp_ms = _field(timestamp_ms, "timestamp_ms", 64)
    partition_leader_epoch = _field(partition_leader_epoch, "partition_leader_epoch", 32)
    key = bytearray(4)
    value = bytearray(6)
    cdef uint8_t* kp = <uint8_t*>(<char*>key)
    cdef uint8_t* vp = <uint8_t*>(<char*>value)
    wr_i16(kp, 0)
    wr_i16(kp + 2, <int16_t>ct)
    wr_i16(vp, 0)
    wr_i32(vp + 2, coord)
    return _encode([bytes(value)], [bytes(key)], None, timestamp_ms, base_offset, 0, None, None,
                   producer_id, producer_epoch, -1, True, True, partition_leader_epoch, None)


include "_encode_columns.pxi"
