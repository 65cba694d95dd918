# Scanning batch boundaries and headers (REF §1.11) and CRC checks.
# Included by _core.pyx; shares its namespace.

cdef int _vec_push(HeaderVec* vec, BatchHeader* h) noexcept nogil:
    cdef Py_ssize_t cap
    cdef BatchHeader* items
    if vec.n == vec.cap:
        cap = 64 if vec.cap == 0 else vec.cap * 2
        items = <BatchHeader*>realloc(vec.items, cap * sizeof(BatchHeader))
        if items == NULL:
            return ST_NO_MEMORY
        vec.items = items
        vec.cap = cap
    vec.items[vec.n] = h[0]
    vec.n += 1
    return ST_OK


cdef int scan_one(const uint8_t* b, Py_ssize_t pos, Py_ssize_t end,
                  BatchHeader* h) noexcept nogil:
    """Read the batch header at `pos` (REF §1.11 file rules). ST_END for end or torn tail."""
    cdef int32_t size_field
    cdef int64_t total
    cdef int8_t magic
    cdef const uint8_t* p = b + pos
    if end - pos < HEADER_UP_TO_MAGIC:
        return ST_END
    size_field = rd_i32(p + 8)
    if size_field < MIN_SIZE_FIELD:
        return ST_SIZE_TOO_SMALL
    total = <int64_t>size_field + LOG_OVERHEAD_C
    if total > end - pos:
        return ST_END
    magic = <int8_t>p[16]
    h.position = pos
    h.size = <int32_t>total
    h.magic = magic
    if magic == 2:
        if total < V2_HEADER_C:
            return ST_V2_TOO_SMALL
        h.base_offset = rd_i64(p)
        h.partition_leader_epoch = rd_i32(p + 12)
        h.crc = rd_u32(p + 17)
        h.attributes = rd_i16(p + 21)
        h.last_offset_delta = rd_i32(p + 23)
        h.base_timestamp = rd_i64(p + 27)
        h.max_timestamp = rd_i64(p + 35)
        h.producer_id = rd_i64(p + 43)
        h.producer_epoch = rd_i16(p + 51)
        h.base_sequence = rd_i32(p + 53)
        h.records_count = rd_i32(p + 57)
        h.last_offset = h.base_offset + h.last_offset_delta
        # Impossible headers are corrupt at once: offsets are located from them before any CRC.
        if h.last_offset_delta < 0:
            return ST_OFFSET_DELTA
        if h.records_count < 0 or <int64_t>h.records_count > <int64_t>h.last_offset_delta + 1:
            return ST_RECORD_COUNT
        return ST_OK
    if magic == 0 or magic == 1:
        if size_field < (MIN_SIZE_FIELD if magic == 0 else V1_MIN_SIZE):
            return ST_LEGACY_SIZE
        h.last_offset = rd_i64(p)
        h.partition_leader_epoch = -1
        h.crc = rd_u32(p + 12)
        h.attributes = p[17]
        if magic == 1:
            h.base_timestamp = rd_i64(p + 18)
        else:
            h.base_timestamp = -1
        h.max_timestamp = h.base_timestamp
        h.producer_id = -1
        h.producer_epoch = -1
        h.base_sequence = -1
        if (p[17] & 0x07) == 0:
            h.base_offset = h.last_offset
            h.records_count = 1
        else:
            h.base_offset = -1  # first inner offset unknown without decompressing
            h.records_count = -1
        h.last_offset_delta = 0
        return ST_OK
    return ST_BAD_MAGIC


cdef int scan_into(const uint8_t* b, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_batches,
                   HeaderVec* vec, Py_ssize_t* stop) noexcept nogil:
    """Append every complete batch header in [start, end) to vec; `stop` = where scanning ended."""
    cdef Py_ssize_t pos = start
    cdef BatchHeader h
    cdef int st
    while max_batches < 0 or vec.n < max_batches:
        st = scan_one(b, pos, end, &h)
        if st != ST_OK:
            stop[0] = pos
            return st
        st = _vec_push(vec, &h)
        if st != ST_OK:
            stop[0] = pos
            return st
        pos += h.size
    stop[0] = pos
    return ST_OK


@cython.final
cdef class _Headers:
    """Owner of a C array of scanned batch headers."""
    cdef HeaderVec vec

    def __dealloc__(self):
        free(self.vec.items)

    cdef object to_numpy(self):
        arr = np.empty(self.vec.n, dtype=BATCH_DTYPE)
        cdef uint8_t[::1] dst
        if self.vec.n:
            dst = arr.view(np.uint8)
            memcpy(&dst[0], self.vec.items, self.vec.n * sizeof(BatchHeader))
        return arr


cdef inline bint _crc_ok(object mv, BatchHeader* h):
    # v2: CRC-32C over [attributes, end); v0/v1: CRC-32 (zlib) over [magic, end).
    if h.magic >= 2:
        return _crc32c_pkg(mv[h.position + 21:h.position + h.size]) == h.crc
    return (zlib.crc32(mv[h.position + 16:h.position + h.size]) & 0xFFFFFFFF) == h.crc


cdef inline int _crc_v2_at(const uint8_t* base, const BatchHeader* h) noexcept nogil:
    """1 good, 0 bad, -1 when this check needs the GIL (legacy batch, or no bound routine)."""
    if h.magic < 2 or _crc_fn == NULL:
        return -1
    return crc32c_c(base + h.position + 21, h.size - 21) == h.crc


cdef class _Scan:
    """Headers of the batches in a buffer range, after the file-scan and (optional) CRC rules."""
    cdef _Headers headers
    cdef Py_ssize_t valid_end
    cdef bint torn
    cdef int status
    cdef Py_ssize_t error_pos


cdef _Scan _scan(object obj, const uint8_t[::1] view, Py_ssize_t start, Py_ssize_t end,
                 bint validate_crc, Py_ssize_t max_batches, bint strict=False):
    cdef _Scan s = _Scan.__new__(_Scan)
    s.headers = _Headers.__new__(_Headers)
    cdef const uint8_t* b = _ptr(view)
    cdef Py_ssize_t stop = start
    cdef int st
    with nogil:
        st = scan_into(b, start, end, max_batches, &s.headers.vec, &stop)
    s.valid_end = stop
    s.torn = st == ST_END and stop < end
    s.status = ST_OK if st == ST_END else st
    s.error_pos = stop
    if strict and s.torn:
        # The caller knows [start, end) holds only whole batches (a sealed segment, the
        # writer's own log): a batch running past it is damage, not a torn write.
        s.status = ST_INCOMPLETE
        s.torn = False
    if s.status == ST_NO_MEMORY:
        raise MemoryError("segstore: out of memory while scanning batches")
    cdef Py_ssize_t i, bad = -1
    cdef int ok
    cdef object mv = None
    if validate_crc and s.headers.vec.n:
        with nogil:
            for i in range(s.headers.vec.n):
                ok = _crc_v2_at(b, &s.headers.vec.items[i])
                if ok <= 0:
                    bad = i      # a bad batch, or one whose check needs the GIL
                    break
        for i in range(bad if bad >= 0 else s.headers.vec.n, s.headers.vec.n):
            ok = _crc_v2_at(b, &s.headers.vec.items[i])
            if ok < 0:
                if mv is None:
                    mv = memoryview(obj).cast("B") if not isinstance(obj, memoryview) else obj.cast("B")
                ok = _crc_ok(mv, &s.headers.vec.items[i])
            if not ok:
                s.status = ST_CRC
                s.error_pos = s.headers.vec.items[i].position
                s.valid_end = s.error_pos
                s.torn = False
                s.headers.vec.n = i
                break
    return s


def scan_batches(buf, start=0, end=None, *, bint validate_crc=False,
                 bint raise_on_corrupt=True, max_batches=None, file=None, bint strict=False):
    """Walk batch boundaries from ``start`` without decoding records (REF §1.11 file rules).

    Returns ScanResult(batches, valid_end, torn, error); see _core.pyi.
    """
    cdef Py_ssize_t s0 = _i64_arg(start, "start", InvalidArgumentError)
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t e = _resolve_end(view.shape[0], s0, end)
    cdef Py_ssize_t mb = -1 if max_batches is None else _int_arg(
        max_batches, "max_batches", InvalidArgumentError, 0, INT64_MAX_C,
        ">= 0 (or None for all)", OffsetTypeError)
    cdef _Scan s = _scan(buf, view, s0, e, validate_crc, mb, strict)
    error = None
    if s.status != ST_OK:
        error = _status_error(s.status, s.error_pos, file)
        if raise_on_corrupt:
            raise error
    return ScanResult(s.headers.to_numpy(), s.valid_end, s.torn, error)


cdef int find_batch_from(const uint8_t* b, Py_ssize_t pos, Py_ssize_t end, int64_t offset,
                         BatchHeader* h, Py_ssize_t* error_pos) noexcept nogil:
    """Walk the batches in [pos, end), which holds only whole batches, to the first whose last
    offset >= ``offset``: ST_OK with its header in ``h``; ST_END when none is there; otherwise
    the status of the damaged batch the walk reached first, at ``error_pos``."""
    cdef int st
    while pos < end:
        st = scan_one(b, pos, end, h)
        if st == ST_END:
            st = ST_INCOMPLETE  # bytes left before ``end`` that are not a whole batch
        if st != ST_OK:
            error_pos[0] = pos
            return st
        if h.last_offset >= offset:
            return ST_OK
        pos += h.size
    return ST_END


def find_batch(buf, start, end, offset, *, first_holds=None, file=None):
    """The header (a HeaderRow) of the first batch in [start, end) whose last offset is at
    least ``offset``, or None when there is none; what one row of ``scan_batches(buf, start,
    end, strict=True)`` filtered on ``last_offset >= offset`` gives, without numpy.

    [start, end) holds only whole batches: a damaged batch (or bytes that are not a whole
    batch) reached before the one found raises CorruptRecordError with ``file`` and its
    position; damage after it is not looked at. With ``first_holds`` (an offset index entry's
    offset, the entry pointing at ``start``) the batch at ``start`` must be whole and hold
    that offset, else the result is False: the entry is not to be trusted.
    """
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t s0 = _i64_arg(start, "start", InvalidArgumentError)
    cdef Py_ssize_t e = _resolve_end(view.shape[0], s0, end)
    cdef int64_t target = _i64_arg(offset, "offset", InvalidOffsetError)
    cdef int64_t holds = 0
    cdef bint check_first = first_holds is not None
    if check_first:
        holds = _i64_arg(first_holds, "first_holds", InvalidOffsetError)
    cdef const uint8_t* b = _ptr(view)
    cdef BatchHeader h
    cdef Py_ssize_t error_pos = s0
    cdef int st = ST_OK
    cdef bint missed = False
    with nogil:
        if check_first:
            st = scan_one(b, s0, e, &h)
            missed = st != ST_OK or not (h.base_offset <= holds <= h.last_offset)
        if not missed:
            st = find_batch_from(b, s0, e, target, &h, &error_pos)
    if missed:
        return False
    if st == ST_END:
        return None
    _raise_status(st, error_pos, file)
    return HeaderRow(h.position, h.base_offset, h.last_offset, h.base_timestamp,
                     h.max_timestamp, h.producer_id, h.size, h.partition_leader_epoch,
                     h.last_offset_delta, h.base_sequence, h.records_count, h.crc,
                     h.attributes, h.producer_epoch, h.magic)


def set_base_offset(buf, position, base_offset, partition_leader_epoch=None):
    """Rewrite a v2 batch's baseOffset (and leader epoch) in place; the CRC covers neither."""
    cdef Py_ssize_t pos = _i64_arg(position, "position", InvalidArgumentError)
    cdef int64_t bo = _int_arg(base_offset, "base_offset", InvalidOffsetError, 0, INT64_MAX_C,
                               "an offset from 0 to 2**63 - 1", OffsetTypeError)
    cdef int32_t epoch = 0
    if partition_leader_epoch is not None:
        epoch = <int32_t>_int_arg(partition_leader_epoch, "partition_leader_epoch",
                                  InvalidRecordError, -0x80000000, 0x7FFFFFFF,
                                  "an int of 32 signed bits", InvalidRecordError)
    cdef uint8_t[::1] view = _byte_buffer(buf, "buf", True)
    if pos < 0 or pos > view.shape[0] - V2_HEADER_C:   # pos + 61 could wrap
        raise InvalidArgumentError(f"no v2 batch header at position {position}")
    if view[pos + 16] != 2:
        raise InvalidArgumentError(f"batch at position {position} is not magic 2")
    wr_i64(&view[pos], bo)
    if partition_leader_epoch is not None:
        wr_i32(&view[pos + 12], epoch)


cdef extern from "<unistd.h>" nogil:
    ssize_t c_pwrite "pwrite"(int fd, const void* buf, size_t count, long long offset)
cdef extern from "<errno.h>" nogil:
    int c_errno "errno"
    int C_EINTR "EINTR"


cdef int _pwrite_all(int fd, const uint8_t* p, size_t n, int64_t at) noexcept nogil:
    """Write n bytes at ``at`` (continuing short writes, retrying EINTR); 0 or an errno."""
    cdef ssize_t done
    while n:
        done = c_pwrite(fd, p, n, at)
        if done < 0:
            if c_errno == C_EINTR:
                continue
            return c_errno
        p += done
        n -= <size_t>done
        at += done
    return 0


def write_base_offsets(fd, positions, sizes, base_offsets, partition_leader_epoch=0,
                       file=None):
    """Rewrite the baseOffset and partitionLeaderEpoch of v2 batches in the file open on ``fd``,
    with one 16-byte pwrite per batch at ``positions[i]``: baseOffset, the batch's unchanged
    batchLength (``sizes[i] - 12``), the epoch. The CRC covers none of them.

    Written through the descriptor rather than a shared map: a store through a map marks its
    whole page-cache folio (up to 2 MiB) dirty, so the next fdatasync writes back nearly the
    whole file again; pwrite dirties only the blocks it touches. Every batch must lie inside
    the file (InvalidArgumentError, a ValueError, otherwise, before anything is written); a
    failed write raises OSError naming ``file``, with the batches before it rewritten.
    """
    cdef const int64_t[::1] pos = _int_array(positions, "positions", np.int64)
    cdef const int32_t[::1] size = _int_array(sizes, "sizes", np.int32)
    cdef const int64_t[::1] base = _int_array(base_offsets, "base_offsets", np.int64)
    cdef int f = _i32_arg(fd, "fd", InvalidArgumentError)
    cdef int32_t epoch = _i32_arg(partition_leader_epoch, "partition_leader_epoch",
                                  InvalidArgumentError)
    cdef Py_ssize_t n = pos.shape[0], i
    if size.shape[0] != n or base.shape[0] != n:
        raise InvalidArgumentError("positions, sizes and base_offsets must have the same length")
    cdef int64_t file_size = _os.fstat(f).st_size
    for i in range(n):
        if (pos[i] < 0 or size[i] < V2_HEADER_C
                or pos[i] > file_size - size[i]):
            raise InvalidArgumentError(f"no whole v2 batch of {size[i]} bytes at position "
                             f"{pos[i]} of {file or 'the file'} ({file_size} bytes)")
    cdef uint8_t head[16]
    cdef int err = 0
    with nogil:
        for i in range(n):
            wr_i64(head, base[i])
            wr_i32(head + 8, size[i] - LOG_OVERHEAD_C)
            wr_i32(head + 12, epoch)
            err = _pwrite_all(f, head, 16, pos[i])
            if err:
                break
    if err:
        raise OSError(err, _os.strerror(err), file)
