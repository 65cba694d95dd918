# Decoding into ConsumerRecord objects (v2 and legacy v0/v1).
# Included by _core.pyx; shares its namespace.

ctypedef PyObject* (*_allocfunc)(void*, Py_ssize_t)
cdef extern from "Python.h":
    ctypedef struct _TypeObj "PyTypeObject":
        _allocfunc tp_alloc

cdef object _ConsumerRecord = ConsumerRecord
cdef Py_ssize_t _CR_FIELDS = len(ConsumerRecord._fields)
cdef tuple _NO_HEADERS = ()


cdef extern from "Python.h":
    # Raw constructors: each returns a new reference or NULL, so a record's slots can take
    # ownership directly (no incref/decref pairs and no per-call error checks in the loop).
    PyObject* _new_bytes "PyBytes_FromStringAndSize" (const char* s, Py_ssize_t n)
    PyObject* _new_i64 "PyLong_FromLongLong" (long long v)
    PyObject* _new_ssize "PyLong_FromSsize_t" (Py_ssize_t v)
    void _set_slot "PyTuple_SET_ITEM" (PyObject* t, Py_ssize_t i, PyObject* x)
    void _incref "Py_INCREF" (PyObject* o)
    void _decref "Py_DECREF" (PyObject* o)
    PyObject* _slot "PyTuple_GET_ITEM" (PyObject* t, Py_ssize_t i)
    void _gc_untrack "PyObject_GC_UnTrack" (void* o)
    void _gc_track "PyObject_GC_Track" (void* o)
    int _gc_capable "PyObject_IS_GC" (object o)
    # Allocates an *untracked* GC object of n items (slots uninitialised): what the tuple
    # type's own constructor uses.
    PyObject* _gc_new_var "(PyObject*)_PyObject_GC_NewVar" (void* tp, Py_ssize_t n)
    int _PY_VERSION_HEX "PY_VERSION_HEX"

# The direct allocation below fills every slot itself, so it is used only while a record is
# exactly a tuple's layout (no __dict__ or __weakref__ slot to zero) and a tuple has no other
# field to set (CPython 3.14 adds a cached hash to tuples).
cdef bint _CR_PLAIN_LAYOUT = (ConsumerRecord.__basicsize__ == tuple.__basicsize__
                              and ConsumerRecord.__dictoffset__ == 0
                              and ConsumerRecord.__weakrefoffset__ == 0
                              and _PY_VERSION_HEX < 0x030E0000)


cdef inline PyObject* _own(PyObject* o) noexcept:
    _incref(o)
    return o


cdef inline PyObject* _bytes_ref(const uint8_t* b, Py_ssize_t pos, int32_t length) noexcept:
    if length < 0:
        return _own(<PyObject*>None)
    return _new_bytes(<const char*>(b + pos), length)


cdef inline object _new_record(object topic, object partition, object leader_epoch,
                               int64_t offset, int64_t timestamp, object timestamp_type,
                               PyObject* key, PyObject* value, PyObject* headers, object checksum,
                               Py_ssize_t ksize, Py_ssize_t vsize, Py_ssize_t hsize, bint untrack):
    """A ConsumerRecord that takes ownership of key, value and headers (new references or
    NULL after a failed allocation, which raises MemoryError once the record is released).

    With ``untrack`` (topic and partition are of types the collector never tracks) the record
    is left out of the cyclic garbage collector: nothing it refers to can ever refer back to it.
    CPython would never untrack it itself (it does so only for exact tuples), so every batch of
    records would add thousands of objects each collection rescans."""
    # Allocate the namedtuple directly (a tuple subclass of 13 slots), skipping its Python
    # __new__: object decode is dominated by per-record allocation. Allocated untracked (every
    # slot is set just below), it is never tracked then untracked again.
    cdef PyObject* t
    if _CR_PLAIN_LAYOUT:
        t = _gc_new_var(<void*><PyObject*>_ConsumerRecord, _CR_FIELDS)
    else:
        t = (<_TypeObj*><PyObject*>_ConsumerRecord).tp_alloc(
            <void*><PyObject*>_ConsumerRecord, _CR_FIELDS)
    if t == NULL:
        if key != NULL:
            _decref(key)
        if value != NULL:
            _decref(value)
        if headers != NULL:
            _decref(headers)
        raise MemoryError()
    _set_slot(t, 0, _own(<PyObject*>topic))
    _set_slot(t, 1, _own(<PyObject*>partition))
    _set_slot(t, 2, _own(<PyObject*>leader_epoch))
    _set_slot(t, 3, _new_i64(offset))
    _set_slot(t, 4, _new_i64(timestamp))
    _set_slot(t, 5, _own(<PyObject*>timestamp_type))
    _set_slot(t, 6, key)
    _set_slot(t, 7, value)
    _set_slot(t, 8, headers)
    _set_slot(t, 9, _own(<PyObject*>checksum))
    _set_slot(t, 10, _new_ssize(ksize))
    _set_slot(t, 11, _new_ssize(vsize))
    _set_slot(t, 12, _new_ssize(hsize))
    if not _CR_PLAIN_LAYOUT:
        if untrack:
            _gc_untrack(t)
    elif not untrack:
        _gc_track(t)
    cdef object rec = <object>t  # takes a second reference; drop the one tp_alloc gave
    _decref(t)
    cdef Py_ssize_t i
    for i in range(_CR_FIELDS):
        if _slot(t, i) == NULL:  # tuple dealloc skips NULL slots, so dropping rec frees the rest
            raise MemoryError()
    return rec


cdef inline bint _untrackable(object topic, object partition):
    """True when the fields a record shares with its caller are of types the collector never
    tracks (str, int, None): the record then cannot be part of a cycle. Whether an object is
    tracked right now is not enough: an empty dict is not, until a container is put in it."""
    return not _gc_capable(topic) and not _gc_capable(partition)


cdef inline object _bytes_or_none(const uint8_t* b, Py_ssize_t pos, int32_t length):
    if length < 0:
        return None
    return PyBytes_FromStringAndSize(<const char*>(b + pos), length)


cdef int _decode_region_records(list out, const Region* reg, const BatchHeader* h,
                                int64_t lo, int64_t hi, Py_ssize_t limit, object topic,
                                object partition, object file) except -1:
    cdef bint untrack = _untrackable(topic, partition)
    cdef const uint8_t* b = reg.data
    cdef Py_ssize_t pos = reg.start, hp
    cdef RecordView r
    cdef int st
    cdef int32_t j, k, prev = -1, klen, vlen
    cdef int64_t offset, ts
    cdef bint log_append = (h.attributes & 0x08) != 0
    cdef int ts_type = 1 if log_append else 0
    leader_epoch = h.partition_leader_epoch  # -1 when unknown, as kafka-python reports it
    ts_type_obj = ts_type
    cdef Py_ssize_t room = limit - len(out)
    cdef PyObject* hdrs
    if h.records_count < 0:
        _raise_status(ST_RECORD_COUNT, reg.position, file)
    for j in range(h.records_count):
        st = parse_record(b, &pos, reg.end, &r)
        if st != ST_OK:
            _raise_status(st, reg.position, file)
        if r.offset_delta <= prev or r.offset_delta > h.last_offset_delta:
            _raise_status(ST_OFFSET_DELTA, reg.position, file)
        prev = r.offset_delta
        offset = h.base_offset + r.offset_delta
        if offset >= hi or room <= 0:
            # Offsets only grow: nothing further is wanted, so the rest is neither parsed nor
            # checked (a read of one record from a large batch paid for parsing all of it),
            # as a consumer that stops iterating never reads the rest. A later read that wants
            # them checks them then.
            return 0
        if offset < lo:
            continue
        room -= 1
        ts = h.max_timestamp if log_append else h.base_timestamp + r.timestamp_delta
        if r.header_count:
            header_list = []
            hp = r.headers_pos
            for k in range(r.header_count):
                # Read again after parse_record checked them: a buffer written to meanwhile
                # (a shared mapping) can hold other lengths now, so each is checked anew.
                if (read_varint(b, &hp, reg.end, &klen) != ST_OK or klen < 0
                        or klen > reg.end - hp):
                    _raise_status(ST_CHANGED, reg.position, file)
                hkey = PyUnicode_DecodeUTF8(<const char*>(b + hp), klen, "replace")
                hp += klen
                if read_varint(b, &hp, reg.end, &vlen) != ST_OK or vlen > reg.end - hp:
                    _raise_status(ST_CHANGED, reg.position, file)
                hval = _bytes_or_none(b, hp, vlen)
                if vlen > 0:
                    hp += vlen
                header_list.append((hkey, hval))
            header_tuple = tuple(header_list)
            hdrs = _own(<PyObject*>header_tuple)
        else:
            hdrs = _own(<PyObject*>_NO_HEADERS)
        out.append(_new_record(
            topic, partition, leader_epoch, offset, ts, ts_type_obj,
            _bytes_ref(b, r.key_pos, r.key_len), _bytes_ref(b, r.value_pos, r.value_len),
            hdrs, None, r.key_len, r.value_len,
            (r.header_key_bytes + r.header_value_bytes) if r.header_count else -1, untrack))
    if pos != reg.end:
        _raise_status(ST_LEFTOVER, reg.position, file)
    return 0


cdef int _legacy_message(const uint8_t* b, Py_ssize_t pos, Py_ssize_t end, int8_t* magic,
                         uint8_t* attrs, int64_t* ts, int32_t* klen, Py_ssize_t* kpos,
                         int32_t* vlen, Py_ssize_t* vpos) noexcept nogil:
    """Parse a v0/v1 message body at pos (crc, magic, attributes, [ts], key, value) up to end."""
    cdef Py_ssize_t p = pos + 4
    if end - pos < MIN_SIZE_FIELD:
        return ST_LEGACY_SIZE
    magic[0] = <int8_t>b[p]
    attrs[0] = b[p + 1]
    p += 2
    if magic[0] == 1:
        if end - pos < V1_MIN_SIZE:
            return ST_LEGACY_SIZE
        ts[0] = rd_i64(b + p)
        p += 8
    elif magic[0] == 0:
        ts[0] = -1
    else:
        return ST_BAD_MAGIC
    if end - p < 4:
        return ST_TRUNCATED
    klen[0] = rd_i32(b + p)
    p += 4
    if klen[0] < -1:
        return ST_NEGATIVE_LENGTH
    kpos[0] = p
    if klen[0] > 0:
        if klen[0] > end - p:
            return ST_TRUNCATED
        p += klen[0]
    if end - p < 4:
        return ST_TRUNCATED
    vlen[0] = rd_i32(b + p)
    p += 4
    if vlen[0] < -1:
        return ST_NEGATIVE_LENGTH
    vpos[0] = p
    if vlen[0] > 0:
        if vlen[0] > end - p:
            return ST_TRUNCATED
        p += vlen[0]
    if p != end:
        return ST_RECORD_LENGTH
    return ST_OK


cdef int _decode_legacy(list out, object mv, const uint8_t* b, const BatchHeader* h,
                        int64_t lo, int64_t hi, Py_ssize_t limit, bint validate_crc,
                        object topic, object partition, object file) except -1:
    """Records of one v0/v1 log entry; a compressed wrapper is opened one level deep."""
    cdef bint untrack = _untrackable(topic, partition)
    cdef int8_t magic, imagic
    cdef uint8_t attrs, iattrs
    cdef int64_t ts, its, ioff, wrapper_offset = h.last_offset
    cdef int32_t klen, vlen, isize
    cdef Py_ssize_t kpos, vpos, p, iend
    cdef int st = _legacy_message(b, h.position + 12, h.position + h.size, &magic, &attrs, &ts,
                                  &klen, &kpos, &vlen, &vpos)
    _raise_status(st, h.position, file)
    cdef int codec = attrs & 0x07
    cdef int ts_type = -1 if magic == 0 else (attrs >> 3) & 1
    if codec == 0:
        if lo <= wrapper_offset < hi and len(out) < limit:
            out.append(_new_record(topic, partition, -1, wrapper_offset, ts, ts_type,
                                   _bytes_ref(b, kpos, klen), _bytes_ref(b, vpos, vlen),
                                   _own(<PyObject*>_NO_HEADERS), h.crc, klen, vlen, -1,
                                   untrack))
        return 0
    if codec > 3 or vlen < 0:
        _raise_status(ST_BAD_CODEC, h.position, file, f"legacy codec id {codec}")
    try:
        inner = _compression.decompress(codec, mv[vpos:vpos + vlen], magic=magic)
    except CorruptRecordError as e:
        raise CorruptRecordError(e.reason, file=file, position=h.position) from None
    cdef const uint8_t[::1] iv = inner
    cdef const uint8_t* ib = _ptr(iv)
    cdef Py_ssize_t n = iv.shape[0]
    entries = []
    p = 0
    while p < n:
        if n - p < LOG_OVERHEAD_C:
            _raise_status(ST_TRUNCATED, h.position, file, "inside a compressed wrapper")
        ioff = rd_i64(ib + p)
        isize = rd_i32(ib + p + 8)
        if isize < MIN_SIZE_FIELD or isize > n - p - LOG_OVERHEAD_C:
            _raise_status(ST_TRUNCATED, h.position, file, "inner message size")
        iend = p + LOG_OVERHEAD_C + isize
        st = _legacy_message(ib, p + LOG_OVERHEAD_C, iend, &imagic, &iattrs, &its, &klen, &kpos,
                             &vlen, &vpos)
        _raise_status(st, h.position, file, "inside a compressed wrapper")
        icrc = rd_u32(ib + p + LOG_OVERHEAD_C)
        if validate_crc and (zlib.crc32(inner[p + 16:iend]) & 0xFFFFFFFF) != icrc:
            _raise_status(ST_CRC, h.position, file, "inner message")
        entries.append((ioff, its, iattrs, _bytes_or_none(ib, kpos, klen),
                        _bytes_or_none(ib, vpos, vlen), icrc, klen, vlen))
        p = iend
    if not entries:
        # Kafka's deep iterator: "Found invalid compressed record set with no inner records".
        _raise_status(ST_RECORD_COUNT, h.position, file, "a compressed wrapper holds no messages")
    # v1 inner offsets are relative to the wrapper's last offset (absolute ones are the wrapper
    # offset - the last relative offset + their own); v0 ones are absolute. As in Kafka's deep
    # iterator, a v1 wrapper at offset 0 (produce data of some librdkafka versions) numbers its
    # messages from 0, and one below its last relative offset is corrupt.
    last_rel = entries[len(entries) - 1][0]  # no negative indexing: wraparound is off
    base = 0
    if magic == 1 and wrapper_offset != 0:
        if wrapper_offset < last_rel:
            _raise_status(ST_WRAPPER_OFFSET, h.position, file, f"{wrapper_offset} < {last_rel}")
        base = wrapper_offset - last_rel
    for ioff_o, its_o, iattrs_o, key, value, icrc_o, kl, vl in entries:
        offset = base + ioff_o if magic == 1 else ioff_o
        if magic == 1 and (attrs & 0x08):
            rts, rtype = ts, 1
        elif magic == 1:
            rts, rtype = its_o, 0
        else:
            rts, rtype = -1, -1
        if lo <= offset < hi and len(out) < limit:
            out.append(_new_record(topic, partition, -1, offset, rts, rtype, _own(<PyObject*>key),
                                   _own(<PyObject*>value), _own(<PyObject*>_NO_HEADERS),
                                   icrc_o, kl, vl, -1, untrack))
    return 0


def decode_records(buf, start=0, end=None, *, min_offset=None, end_offset=None,
                   max_records=None, bint validate_crc=True, bint include_control=False,
                   topic=None, partition=None, file=None, bint strict=False):
    """Records with ``min_offset <= offset < end_offset`` as ConsumerRecord namedtuples."""
    cdef Py_ssize_t s0 = _i64_arg(start, "start", InvalidArgumentError)
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t e = _resolve_end(view.shape[0], s0, end)
    cdef int64_t lo = _opt_i64(min_offset, -INT64_MAX_C - 1, "min_offset")
    cdef int64_t hi = _opt_i64(end_offset, INT64_MAX_C, "end_offset")
    cdef Py_ssize_t limit = _max_records(max_records)
    cdef const uint8_t* base = _ptr(view)
    cdef list out = []
    cdef _Scan scan
    cdef HeaderVec* vec
    cdef BatchHeader* h
    cdef Region reg
    cdef Py_ssize_t i, pos = s0
    # Batch by batch: each is checked (CRC, header, records) only when the records wanted reach
    # it, so a read that stops after a few records neither checks nor fails on the rest of its
    # range. With max_records the headers are scanned a few at a time (more each time) too.
    cdef Py_ssize_t chunk = -1 if max_records is None else 8
    mv = _byte_view(buf)
    while len(out) < limit:
        scan = _scan(buf, view, pos, e, False, chunk, strict)
        vec = &scan.headers.vec
        for i in range(vec.n):
            if len(out) >= limit:
                break
            h = &vec.items[i]
            if h.magic < 2:
                if h.last_offset >= lo:
                    if validate_crc and not _crc_ok(mv, h):
                        _raise_status(ST_CRC, h.position, file)
                    _decode_legacy(out, mv, base, h, lo, hi, limit, validate_crc, topic,
                                   partition, file)
                continue
            if validate_crc and not _batch_crc_ok(base, mv, h):
                _raise_status(ST_CRC, h.position, file)
            if _skipped(h, lo, hi, include_control):
                continue
            payload = _region_at(&reg, view, mv, h, i, file)  # alive while decoded
            _decode_region_records(out, &reg, h, lo, hi, limit, topic, partition, file)
        if len(out) >= limit:
            break
        # The records wanted run on into a damaged batch, if the scan stopped at one.
        _raise_status(scan.status, scan.error_pos, file)
        if chunk < 0 or vec.n < chunk:
            break  # the end of the range (or a torn tail, when not strict)
        pos = scan.valid_end
        chunk = min(chunk * 2, 4096)
    return out
