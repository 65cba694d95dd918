# Encoding numpy columns into v2 batches (encode_columns): a plan of the batches' sizes, then
# the records written straight into one output buffer, on two threads when large. Included by
# _encode.pxi, after the record and batch header writers it shares; shares _core's namespace.

cdef inline bint _span_ok(const int64_t* offsets, Py_ssize_t s, int64_t data_len) noexcept nogil:
    # Row s of a binary column lies inside its data (checked row by row: with `order`, rows
    # are visited out of turn, so the column's first and last offsets bound nothing).
    return 0 <= offsets[s] <= offsets[s + 1] <= data_len


cdef int _plan_columns(const int64_t* ko, const uint8_t* kv, int64_t kd_len, const int64_t* vo,
                       const uint8_t* vv, int64_t vd_len, const int64_t* ts, bint ts_scalar,
                       const int64_t* order, Py_ssize_t n_src, Py_ssize_t i0, Py_ssize_t i1,
                       Py_ssize_t per_batch, int64_t max_bytes, int64_t pos0, int64_t* starts,
                       int64_t* positions, Py_ssize_t* nbatches, int64_t* total) noexcept nogil:
    """Split records [i0, i1) into batches, the first starting at i0 and at byte ``pos0``:
    `starts` gets each batch's first record index and `positions` its first byte (one more
    each: the end), so batches can then be written independently; `total` is where the last
    one ends. Record i is row order[i] of the columns (row i when order is NULL)."""
    cdef Py_ssize_t i, s, count = 0
    cdef int64_t size = 0, rec, body, base_ts = 0, klen, vlen
    nbatches[0] = 0
    total[0] = pos0
    for i in range(i0, i1):
        s = i
        if order != NULL:
            s = order[i]
            if s < 0 or s >= n_src:
                return ST_ORDER
        if not _span_ok(vo, s, vd_len) or (ko != NULL and not _span_ok(ko, s, kd_len)):
            return ST_RECORD_LENGTH
        klen = (ko[s + 1] - ko[s]) if (ko != NULL and kv[s]) else -1
        vlen = (vo[s + 1] - vo[s]) if vv[s] else -1
        if klen > MAX_RECORD_FIELD or vlen > MAX_RECORD_FIELD:
            return ST_RECORD_LENGTH
        if count == 0:
            base_ts = ts[0] if ts_scalar else ts[s]
        body = _record_body_size((0 if ts_scalar else ts[s] - base_ts), <int32_t>count,
                                 <int32_t>klen, <int32_t>vlen, 0, 0)
        rec = varint_size(<int32_t>body) + body
        if count > 0 and (count >= per_batch or size + rec > max_bytes - V2_HEADER_C):
            total[0] += V2_HEADER_C + size
            count = 0
            size = 0
            base_ts = ts[0] if ts_scalar else ts[s]
            body = _record_body_size(0, 0, <int32_t>klen, <int32_t>vlen, 0, 0)
            rec = varint_size(<int32_t>body) + body
        if count == 0:
            starts[nbatches[0]] = i
            positions[nbatches[0]] = total[0]
            nbatches[0] += 1
        size += rec
        count += 1
    if count:
        total[0] += V2_HEADER_C + size
    starts[nbatches[0]] = i1
    positions[nbatches[0]] = total[0]
    return ST_OK


cdef enum:
    GATHER_AHEAD = 8   # rows: about the memory latency of one row's write


cdef int _write_columns(uint8_t* out, const uint8_t* kd, const int64_t* ko, const uint8_t* kv,
                        int64_t kd_len, const uint8_t* vd, const int64_t* vo, const uint8_t* vv,
                        int64_t vd_len, const int64_t* ts, bint ts_scalar, const int64_t* order,
                        Py_ssize_t n_src, const int64_t* starts, const int64_t* positions,
                        Py_ssize_t b0, Py_ssize_t b1, int64_t base_offset, int32_t leader_epoch,
                        int16_t attributes, int64_t log_append_time,
                        BatchHeader* hdrs) noexcept nogil:
    """Write batches [b0, b1) at their planned positions (independent of each other); record i
    is row order[i] of the columns (row i when order is NULL).

    The columns are read again after the plan, and a caller's arrays can be written to
    meanwhile: every row and length is checked anew, and a batch must fill its planned bytes
    exactly, else ST_CHANGED (nothing is written past the batch's place)."""
    cdef Py_ssize_t b, i, s
    cdef int64_t pos, t, body, klen, vlen
    cdef uint8_t* p
    cdef uint8_t* batch_end
    cdef BatchHeader* h
    for b in range(b0, b1):
        pos = positions[b]
        h = &hdrs[b]
        h.position = pos
        h.base_offset = base_offset + starts[b]
        h.records_count = <int32_t>(starts[b + 1] - starts[b])
        h.last_offset_delta = h.records_count - 1
        h.last_offset = h.base_offset + h.last_offset_delta
        h.partition_leader_epoch = leader_epoch
        h.magic = 2
        h.attributes = attributes
        h.producer_id = -1
        h.producer_epoch = -1
        h.base_sequence = -1
        s = starts[b] if order == NULL else order[starts[b]]
        if s < 0 or s >= n_src:
            return ST_CHANGED
        h.base_timestamp = ts[0] if ts_scalar else ts[s]
        h.max_timestamp = h.base_timestamp
        p = out + pos + V2_HEADER_C
        batch_end = out + positions[b + 1]
        for i in range(starts[b], starts[b + 1]):
            if order != NULL and i + GATHER_AHEAD < starts[b1]:
                # A gather visits rows out of turn, which the hardware's stream prefetch
                # does not follow: fetch a later row's key and value while this one is written.
                s = order[i + GATHER_AHEAD]
                if 0 <= s < n_src and _span_ok(vo, s, vd_len):
                    SEGSTORE_PREFETCH(vd + vo[s])
                    if vo[s + 1] - vo[s] > 64:
                        SEGSTORE_PREFETCH(vd + vo[s] + 64)
                    if ko != NULL and _span_ok(ko, s, kd_len):
                        SEGSTORE_PREFETCH(kd + ko[s])
            s = i if order == NULL else order[i]
            if (s < 0 or s >= n_src or not _span_ok(vo, s, vd_len)
                    or (ko != NULL and not _span_ok(ko, s, kd_len))):
                return ST_CHANGED
            t = ts[0] if ts_scalar else ts[s]
            if t > h.max_timestamp:
                h.max_timestamp = t
            klen = (ko[s + 1] - ko[s]) if (ko != NULL and kv[s]) else -1
            vlen = (vo[s + 1] - vo[s]) if vv[s] else -1
            if klen > MAX_RECORD_FIELD or vlen > MAX_RECORD_FIELD:
                return ST_CHANGED
            body = _record_body_size(t - h.base_timestamp, <int32_t>(i - starts[b]),
                                     <int32_t>klen, <int32_t>vlen, 0, 0)
            if varint_size(<int32_t>body) + body > batch_end - p:
                return ST_CHANGED
            p = _write_record_head(p, <int32_t>body, t - h.base_timestamp,
                                   <int32_t>(i - starts[b]),
                                   (kd + ko[s]) if klen > 0 else NULL, <int32_t>klen,
                                   (vd + vo[s]) if vlen > 0 else NULL, <int32_t>vlen)
            p[0] = 0  # header count
            p += 1
        if p != batch_end:
            return ST_CHANGED
        if log_append_time >= 0:
            h.max_timestamp = log_append_time
        h.size = <int32_t>(p - (out + pos))
        h.crc = 0
        _write_batch_header(out + pos, h)
    return ST_OK


cdef object _output_buffer(int64_t nbytes):
    """Memory for an encoder's output: a pooled block when large (like decode's columns: a
    pipeline encoding chunk after chunk reuses mapped memory instead of faulting and zeroing
    fresh pages, a quarter of a 1M-record encode), else a bytes object filled in place."""
    if nbytes >= POOL_MIN and <size_t>nbytes <= _pool_limit:
        return _pool_acquire(nbytes)
    out = PyBytes_FromStringAndSize(NULL, nbytes)
    _hint_huge_pages(PyBytes_AS_STRING(out), nbytes)
    return out


cdef uint8_t* _writable_ptr(object out):
    # An encoder's output: pooled, a bytearray, or a bytes object nothing else holds yet.
    if isinstance(out, PooledBuffer):
        return (<PooledBuffer>out).ptr
    if isinstance(out, bytearray):
        return <uint8_t*>(<char*>(<bytearray>out))
    return <uint8_t*>PyBytes_AS_STRING(out)


cdef class _EncodeJob:
    """State shared by the two halves of a parallel column encode."""
    cdef object out_obj
    cdef uint8_t* out
    cdef const uint8_t* kd
    cdef const int64_t* ko
    cdef const uint8_t* kv
    cdef int64_t kd_len
    cdef const uint8_t* vd
    cdef const int64_t* vo
    cdef const uint8_t* vv
    cdef int64_t vd_len
    cdef Py_ssize_t n_src
    cdef const int64_t* ts
    cdef bint ts_scalar
    cdef const int64_t* order
    cdef const int64_t* starts
    cdef const int64_t* positions
    cdef int64_t base_offset
    cdef int32_t leader_epoch
    cdef int16_t attributes
    cdef int64_t log_append_time
    cdef bint crc
    cdef object keep
    cdef BatchHeader* hdrs
    cdef Py_ssize_t per_batch
    cdef int64_t max_bytes
    # The second thread's share of a split plan: records from a row it starts a batch at.
    cdef int64_t* tail_starts
    cdef int64_t* tail_positions
    cdef Py_ssize_t tail_nbatches
    cdef int64_t tail_total
    cdef int tail_status

    cdef int plan(self, Py_ssize_t i0, Py_ssize_t i1, int64_t pos0, int64_t* starts,
                  int64_t* positions, Py_ssize_t* nbatches, int64_t* total) noexcept nogil:
        return _plan_columns(self.ko, self.kv, self.kd_len, self.vo, self.vv, self.vd_len,
                             self.ts, self.ts_scalar, self.order, self.n_src, i0, i1,
                             self.per_batch, self.max_bytes, pos0, starts, positions,
                             nbatches, total)

    def plan_tail(self, Py_ssize_t i0, Py_ssize_t i1):
        """Plan records [i0, i1) as if a batch started at i0, into the tail arrays (positions
        from 0): the second thread's share of a split plan."""
        with nogil:
            self.tail_status = self.plan(i0, i1, 0, self.tail_starts, self.tail_positions,
                                         &self.tail_nbatches, &self.tail_total)

    def write(self, Py_ssize_t b0, Py_ssize_t b1):
        """Write (and checksum) batches [b0, b1); returns the status of the writing."""
        cdef int st
        with nogil:
            st = _write_columns(self.out, self.kd, self.ko, self.kv, self.kd_len, self.vd,
                                self.vo, self.vv, self.vd_len, self.ts, self.ts_scalar,
                                self.order, self.n_src, self.starts, self.positions, b0, b1,
                                self.base_offset, self.leader_epoch, self.attributes,
                                self.log_append_time, self.hdrs)
        if st != ST_OK or not self.crc:
            return st
        cdef Py_ssize_t b
        cdef BatchHeader* h
        if _crc_fn != NULL:
            with nogil:
                for b in range(b0, b1):
                    h = &self.hdrs[b]
                    h.crc = crc32c_c(self.out + h.position + 21, h.size - 21)
                    wr_u32(self.out + h.position + 17, h.crc)
            return st
        mv = memoryview(self.out_obj)
        for b in range(b0, b1):
            h = &self.hdrs[b]
            h.crc = _crc32c_pkg(mv[h.position + 21:h.position + h.size])
            wr_u32(self.out + h.position + 17, h.crc)
        return st


cdef int64_t PLAN_SPLIT_MIN_RECORDS = 64 << 10   # fewer: the plan is too short to share


def _set_plan_split_min_records(int64_t n):
    """Tune (or with a huge value, disable) the two-thread split of encode_columns' plan;
    returns the previous value."""
    global PLAN_SPLIT_MIN_RECORDS
    old = PLAN_SPLIT_MIN_RECORDS
    PLAN_SPLIT_MIN_RECORDS = n
    return old


cdef int _plan_job(_EncodeJob job, Py_ssize_t n, int64_t* starts, int64_t* positions,
                   Py_ssize_t* nbatches, int64_t* total) except -2:
    """The plan of records [0, n) (see _plan_columns), on two threads when it is long.

    The second thread plans from k, a multiple of per_batch near the middle, as if a batch
    started there; the first plans [0, k). When every batch of the first part holds exactly
    per_batch records, one does start at k in the one-thread plan, so the second part's plan
    is that plan's rest. Otherwise (a batch was cut short by max_batch_bytes) the rest is
    planned again from the first part's last batch on: the result is always the one-thread
    plan's. Only plans whose batches will also be written on two threads are split.
    """
    cdef Py_ssize_t rpb = job.per_batch, k = (n // 2) // rpb * rpb, b, nb = 0, last
    cdef int64_t head_total = 0
    cdef int st
    # Key and value bytes (those of the rows taken, as a share of all rows under an order):
    # below the write's split threshold, the caller may be using the other core (as
    # append_columns does, encoding a chunk while the last one is written).
    cdef double kv_bytes = job.vo[job.n_src] - job.vo[0]
    if job.ko != NULL:
        kv_bytes += job.ko[job.n_src] - job.ko[0]
    if job.order != NULL and job.n_src > 0:
        kv_bytes = kv_bytes * n / job.n_src
    if k <= 0 or n < PLAN_SPLIT_MIN_RECORDS or kv_bytes < PARALLEL_MIN_BYTES:
        with nogil:
            st = job.plan(0, n, 0, starts, positions, nbatches, total)
        return st
    tail_starts = np.empty(n - k + 1, dtype=np.int64)
    tail_positions = np.empty(n - k + 1, dtype=np.int64)
    cdef int64_t[::1] ts_v = tail_starts, tp_v = tail_positions
    job.tail_starts, job.tail_positions = &ts_v[0], &tp_v[0]
    job.keep = (job.keep, tail_starts, tail_positions)   # the other thread writes them
    other = _second_core(job.plan_tail, k, n)
    with nogil:
        st = job.plan(0, k, 0, starts, positions, &nb, &head_total)
    other.result()
    if st != ST_OK:
        return st
    if nb == k // rpb:
        if job.tail_status != ST_OK:
            return job.tail_status
        with nogil:
            for b in range(job.tail_nbatches + 1):
                starts[nb + b] = ts_v[b]
                positions[nb + b] = head_total + tp_v[b]
        nbatches[0] = nb + job.tail_nbatches
        total[0] = head_total + job.tail_total
        return ST_OK
    last = nb - 1
    with nogil:
        st = job.plan(starts[last], n, positions[last], &starts[last], &positions[last], &nb,
                      total)
    nbatches[0] = last + nb
    return st


def encode_columns(values, keys=None, timestamps_ms=None, *, base_offset=0,
                   records_per_batch=4096, max_batch_bytes=1 << 20,
                   compression=0, compression_level=None, log_append_time_ms=None,
                   partition_leader_epoch=-1, order=None):
    """Columns into consecutive v2 batches (see _core.pyi)."""
    cdef int codec = _compression.codec_id(compression)
    # Records per batch fit the header's int32 count; the rest as encode_batch checks them.
    cdef Py_ssize_t rpb = _int_arg(records_per_batch, "records_per_batch", InvalidArgumentError,
                                   INT64_MIN_C, 0x7FFFFFFF, None, OffsetTypeError)
    if rpb <= 0:
        raise InvalidArgumentError(f"records_per_batch must be positive, got {records_per_batch}")
    cdef int64_t mbb = _int_arg(max_batch_bytes, "max_batch_bytes", InvalidArgumentError, 0,
                                INT64_MAX_C, "an int >= 0", OffsetTypeError)
    base_offset = _offset_arg(base_offset)
    log_append_time_ms = _opt_field(log_append_time_ms, "log_append_time_ms")
    cdef int32_t epoch = _field(partition_leader_epoch, "partition_leader_epoch", 32)
    if not isinstance(values, BinaryColumn) or (keys is not None
                                                and not isinstance(keys, BinaryColumn)):
        raise InvalidRecordError(f"encode_columns takes BinaryColumn values and keys, not "
                                 f"{type(values).__name__} and {type(keys).__name__}")
    cdef Py_ssize_t n_src = len(values)
    if keys is not None and len(keys) != n_src:
        raise InvalidRecordError(f"{len(keys)} keys for {n_src} values")
    # `order` picks and orders rows (a gather), so routed rows need no copy of the columns.
    order_arr = None
    if order is not None:
        order_arr = np.asarray(order)
        # Row numbers only: numpy's conversion would truncate 0.7 to 0 and parse "1".
        if order_arr.size and order_arr.dtype.kind not in "iu":
            raise InvalidArgumentError(f"order must hold integer row numbers, not "
                                       f"{order_arr.dtype}")
        order_arr = np.ascontiguousarray(order_arr, dtype=np.int64)
    if order_arr is not None and order_arr.ndim != 1:
        raise InvalidArgumentError("order must be a one-dimensional array of row numbers")
    cdef Py_ssize_t n = n_src if order_arr is None else len(order_arr)
    cdef const int64_t[::1] ordv
    cdef const int64_t* ordp = NULL
    if order_arr is not None and n:
        ordv = order_arr
        ordp = &ordv[0]
    cdef const uint8_t[::1] vd = values.data
    cdef const int64_t[::1] vo = values.offsets
    cdef const uint8_t[::1] vv = values.valid.view(np.uint8)
    cdef const uint8_t[::1] kd, kv
    cdef const int64_t[::1] ko
    cdef const int64_t* kop = NULL
    cdef const uint8_t* kvp = NULL
    cdef const uint8_t* kdp = NULL
    cdef int64_t kd_len = 0
    _check_offsets(base_offset, max(n - 1, 0))
    if n == 0:
        return EncodedBatches(memoryview(b""), np.empty(0, dtype=BATCH_DTYPE))
    if vo.shape[0] != n_src + 1 or vv.shape[0] != n_src:
        raise InvalidRecordError("values.offsets/valid do not match the number of values")
    if vo[0] < 0 or vo[n_src] > vd.shape[0]:
        raise InvalidRecordError("values.offsets point outside values.data")
    if keys is not None:
        kd = keys.data
        ko = keys.offsets
        kv = keys.valid.view(np.uint8)
        if ko.shape[0] != n_src + 1 or kv.shape[0] != n_src:
            raise InvalidRecordError("keys.offsets/valid do not match the number of keys")
        if ko[0] < 0 or ko[n_src] > kd.shape[0]:
            raise InvalidRecordError("keys.offsets point outside keys.data")
        kop = &ko[0]
        kvp = &kv[0]
        kdp = _ptr(kd)
        kd_len = kd.shape[0]
    cdef bint ts_scalar
    if timestamps_ms is None or _is_int_timestamp(timestamps_ms):
        ts_arr = np.array([_now_ms() if timestamps_ms is None else _one_timestamp(timestamps_ms)],
                          dtype=np.int64)
        ts_scalar = True
    else:
        ts_arr = timestamp_array(timestamps_ms)
        if len(ts_arr) != n_src:
            raise InvalidRecordError(f"{len(ts_arr)} timestamps for {n_src} values")
        ts_scalar = False
    cdef const int64_t[::1] ts = ts_arr
    starts_arr = np.empty(n + 1, dtype=np.int64)
    positions_arr = np.empty(n + 1, dtype=np.int64)
    cdef int64_t[::1] starts = starts_arr, positions = positions_arr
    cdef Py_ssize_t nbatches = 0
    cdef int64_t total = 0
    cdef int st
    cdef _EncodeJob job = _EncodeJob.__new__(_EncodeJob)
    job.kd, job.ko, job.kv, job.kd_len = kdp, kop, kvp, kd_len
    job.vd, job.vo, job.vv, job.vd_len = _ptr(vd), &vo[0], &vv[0], vd.shape[0]
    job.n_src = n_src
    job.ts, job.ts_scalar = &ts[0], ts_scalar
    job.order = ordp
    job.per_batch, job.max_bytes = rpb, mbb
    job.crc = codec == 0
    # The buffers themselves, not just the column objects (whose arrays a caller could swap):
    # if the wait for the other thread is interrupted, it still reads them (and, writing,
    # still writes its batches' headers into hdr_arr, added below).
    job.keep = (values, keys, ts_arr, starts_arr, positions_arr, order_arr, vd, vo, vv,
                (kd, ko, kv) if keys is not None else None)
    st = _plan_job(job, n, &starts[0], &positions[0], &nbatches, &total)
    if st == ST_ORDER:
        raise InvalidArgumentError(f"order holds a row number outside [0, {n_src})")
    if st != ST_OK:
        raise InvalidRecordError("column offsets are not increasing, point outside the data, "
                                 "or a value exceeds 2 GiB")
    out = _output_buffer(total)  # filled below before anyone sees it
    hdr_arr = np.zeros(nbatches, dtype=BATCH_DTYPE)
    job.out_obj = out
    job.out = _writable_ptr(out)
    job.starts, job.positions = &starts[0], &positions[0]
    job.base_offset = base_offset
    job.leader_epoch = epoch
    job.attributes = 0x08 if log_append_time_ms is not None else 0
    job.log_append_time = -1 if log_append_time_ms is None else log_append_time_ms
    job.keep = (job.keep, hdr_arr)
    cdef uint8_t[::1] hv = hdr_arr.view(np.uint8)
    job.hdrs = <BatchHeader*>&hv[0] if nbatches else NULL
    # Batches are independent once planned: two threads write (and checksum) halves.
    cdef Py_ssize_t split = nbatches // 2 if total >= PARALLEL_MIN_BYTES and nbatches >= 2 \
        else nbatches
    if _between_passes is not None:
        _between_passes()
    if split < nbatches:
        other = _second_core(job.write, split, nbatches)
        st = job.write(0, split)
        st2 = other.result()
        st = st if st != ST_OK else st2
    else:
        st = job.write(0, nbatches)
    if st != ST_OK:
        raise InvalidRecordError("the columns changed during encode_columns (written to while "
                                 "being encoded?)")
    cdef BatchHeader* hp = job.hdrs
    cdef Py_ssize_t b
    if codec == 0:
        return EncodedBatches(memoryview(out).toreadonly(), hdr_arr)
    parts = []
    cdef int64_t pos = 0
    for b in range(nbatches):
        c = _compress_batch(out, hp[b].position, hp[b].size, codec, compression_level)
        hp[b].position = pos
        hp[b].size = len(c)
        hp[b].attributes |= codec
        hp[b].crc = rd_u32(<uint8_t*>(<char*>c) + 17)
        pos += len(c)
        parts.append(c)
    return EncodedBatches(memoryview(b"".join(parts)), hdr_arr)
