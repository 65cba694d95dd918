# Decoding v2 records into numpy columns.
# Included by _core.pyx; shares its namespace.

include "_decode_kernel.pxi"


cdef class _Regions:
    """The v2 record regions selected so far, with decompressed payloads kept alive."""
    cdef Region* items
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef list keep

    def __dealloc__(self):
        free(self.items)


cdef inline object _byte_view(object obj):
    return memoryview(obj).cast("B") if not isinstance(obj, memoryview) else obj.cast("B")


cdef inline bint _batch_crc_ok(const uint8_t* base, object mv, BatchHeader* h):
    # The compiled CRC-32C when it can run; the package's (or zlib's, for v0/v1) otherwise.
    return _crc_v2_at(base, h) == 1 or _crc_ok(mv, h)


cdef inline bint _skipped(const BatchHeader* h, int64_t min_offset, int64_t end_offset,
                          bint include_control) noexcept nogil:
    """Whether a v2 batch holds no record a decode of [min_offset, end_offset) returns."""
    return (h.last_offset < min_offset or h.base_offset >= end_offset
            or ((h.attributes & 0x20) != 0 and not include_control))


cdef object _region_at(Region* reg, const uint8_t[::1] view, object mv, BatchHeader* h,
                       Py_ssize_t i, object file):
    """Locate the records of v2 batch ``h`` (index ``i`` of its scan): in the buffer, or in its
    payload inflated now. Returns the payload (None when uncompressed) for the caller to keep
    alive while ``reg`` is used."""
    cdef int codec = h.attributes & 0x07
    cdef const uint8_t[::1] dview
    reg.batch = i
    reg.header = h
    reg.source = 0
    reg.release = False
    reg.position = h.position
    reg.crc_pending = False
    if codec == 0:
        reg.data = _ptr(view)
        reg.start = h.position + V2_HEADER_C
        reg.end = h.position + h.size
        return None
    if codec > 4:
        _raise_status(ST_BAD_CODEC, h.position, file, f"codec id {codec}")
    try:
        payload = _compression.decompress(codec, mv[h.position + V2_HEADER_C:h.position + h.size])
    except CorruptRecordError as e:
        raise CorruptRecordError(e.reason, file=file, position=h.position) from None
    dview = payload
    reg.data = _ptr(dview)
    reg.start = 0
    reg.end = dview.shape[0]
    return payload


cdef inline int64_t _opt_i64(object v, int64_t default, str name) except? -1:
    return default if v is None else _i64_arg(v, name, InvalidArgumentError)


cdef inline int64_t _max_records(object max_records) except? -1:
    """A decode's ``max_records``: None (no limit) or an int from 0 to 2**63 - 1."""
    if max_records is None:
        return INT64_MAX_C
    return _int_arg(max_records, "max_records", InvalidArgumentError, 0, INT64_MAX_C,
                    ">= 0 (an int, or None for no limit)", OffsetTypeError)


# Dropped in runs this long: each madvise interrupts the other core to flush its TLB. On the
# asv log (1M records, 2 threads), 4 MiB runs cut at pages took 15.9 - 16.0 ms (medians),
# cut at 2 MiB 15.3 - 15.5, 8 MiB cut at 2 MiB 15.2; 16 MiB gained 0.1 ms more but raised
# the peak resident set from 1.14x to 1.26x the columns.
cdef size_t RELEASE_BYTES = 8 << 20
# Runs are cut at this alignment: a segment's cached pages are mapped 2 MiB at a time (one PMD)
# where the file's folios are huge, and dropping part of such a mapping first splits it into
# 512 page entries, which the next run then drops one by one.
cdef size_t RELEASE_ALIGN = POOL_HUGE


def _set_release(pair):
    """Tests and measurements: drop decoded pages of a file mapping in runs of at least
    ``run_bytes``, cut at multiples of ``align`` (a power of two from the page size to
    ``run_bytes``; the page size cuts anywhere, as before huge-page cuts). Takes and returns
    ``(run_bytes, align)``."""
    global RELEASE_BYTES, RELEASE_ALIGN
    cdef size_t run_bytes = pair[0], align = pair[1]
    if align < PAGE or align & (align - 1) or run_bytes < align:
        raise ValueError(f"align must be a power of two from the page size to run_bytes, "
                         f"got run_bytes={run_bytes}, align={align}")
    old = (RELEASE_BYTES, RELEASE_ALIGN)
    RELEASE_BYTES, RELEASE_ALIGN = run_bytes, align
    return old


cdef bint _pages_droppable(object buf) except -1:
    """Whether MADV_DONTNEED over ``buf``'s pages keeps its bytes: only a read-only mmap.mmap,
    whose pages come back from the file (or shared memory) on the next touch and, never
    written through the map, hold no private copies. On other memory (a bytearray, a numpy
    array, a writable private or copy-on-write map) the dropped pages come back zeroed or as
    the file's old bytes: the caller's data is lost."""
    return isinstance(buf, _mmap.mmap) and memoryview(buf).readonly


cdef inline void _release_range(size_t a, size_t b) noexcept nogil:
    a = (a + PAGE - 1) & ~(PAGE - 1)
    b = b & ~(PAGE - 1)
    if b > a:
        madvise(<void*>a, b - a, MADV_DONTNEED)


cdef inline void _release_batch(const Region* reg, size_t* run_lo, size_t* run_hi,
                                bint last, bint downward=False) noexcept nogil:
    """Drop this process's page-table entries for the whole pages of copied batches read from
    a shared file mapping: the data stays in the page cache and a later touch maps it again,
    so the input pages leave the resident set as the output pages arrive (the peak is about
    max(input, output), not their sum). Adjacent batches are dropped in runs of
    RELEASE_BYTES: each madvise interrupts the other core to flush its TLB, and once per
    batch that cost a tenth of a 1M-record read. A run is cut at a RELEASE_ALIGN boundary
    so that no huge mapping is split. `last` flushes the run; `downward`: the batches come
    last first, so a run grows towards lower addresses."""
    cdef size_t a, b
    if reg != NULL and reg.release:
        a = <size_t>(reg.data + reg.header.position)
        b = a + <size_t>reg.header.size
        if (run_lo[0] != b) if downward else (run_hi[0] != a):
            # Not adjacent: drop the run so far, start a new one.
            _release_range(run_lo[0], run_hi[0])
            run_lo[0] = a
            run_hi[0] = b
        elif downward:
            run_lo[0] = a
        else:
            run_hi[0] = b
    if last:
        _release_range(run_lo[0], run_hi[0])  # the fill's end: the run is not used again
    elif run_hi[0] - run_lo[0] >= RELEASE_BYTES:
        # Cut at the last RELEASE_ALIGN boundary the run has grown past: the rest, with the
        # huge page it is in, goes with the next run, so no huge mapping is split.
        if downward:
            b = (run_lo[0] + RELEASE_ALIGN - 1) & ~(RELEASE_ALIGN - 1)
            _release_range(b, run_hi[0])
            run_hi[0] = b
        else:
            a = run_hi[0] & ~(RELEASE_ALIGN - 1)
            _release_range(run_lo[0], a)
            run_lo[0] = a


include "_decode_threads.pxi"
include "_decode_predict.pxi"


def decode_columns(buf, start=0, end=None, *, min_offset=None, end_offset=None,
                   max_records=None, bint validate_crc=True, bint include_headers=False,
                   topic=None, partition=None, file=None, bint strict=False):
    """Selected records of a buffer range straight into numpy columns (control batches skipped).

    Two passes over the batches: the first checks each batch's CRC and counts its records and
    bytes, the second copies every batch to its precomputed place. Each pass splits the batches
    between two threads when the range is large; then the last batches of a whole-range read
    are checked and copied in one pass, on the second thread, after the counted ones. A large
    whole-range read whose batches come in runs of like batches skips the first pass: one
    batch per run is counted, the others' sizes are predicted from it, and each batch's CRC is
    checked just before its copy (a wrong prediction, or damage, falls back to counting).
    """
    return decode_columns_multi([(buf, start, end, file)], min_offset=min_offset,
                                end_offset=end_offset, max_records=max_records,
                                validate_crc=validate_crc, include_headers=include_headers,
                                topic=topic, partition=partition, strict=strict)


def decode_columns_multi(sources, *, min_offset=None, end_offset=None, max_records=None,
                         bint validate_crc=True, bint include_headers=False, topic=None,
                         partition=None, bint strict=False):
    """decode_columns over several ``(buffer, start, end, file[, release[, checked]])`` ranges
    into one set of columns. ``release``: the pages of the buffer may be dropped once copied,
    which is done only for a read-only ``mmap.mmap`` (a log's segment map) and ignored for any
    other buffer, where it would lose data; ``checked``: a ``(lo, hi)`` byte range whose
    batches' CRCs the caller has just checked (they are not checked again).

    A log's segments decode straight into one allocation: no per-segment columns to concatenate.
    With ``max_records`` the batches are checked and decoded only up to the one holding the
    last record returned: damage after it does not fail the decode.
    """
    cdef int64_t limit = _max_records(max_records)
    cdef _DecodeJob job = _new_job(_opt_i64(min_offset, -INT64_MAX_C - 1, "min_offset"),
                                   _opt_i64(end_offset, INT64_MAX_C, "end_offset"),
                                   include_headers)
    cdef list files = []
    if _select_batches(job, sources, files, limit, validate_crc, strict, max_records is not None):
        return _legacy_columns(sources, min_offset, end_offset, max_records, validate_crc,
                               include_headers, topic, partition)
    cdef Py_ssize_t tail
    if _predict_sizes(job, limit, validate_crc):
        cols = _decode_predicted(job, include_headers, topic, partition)
        if cols is not None:
            return cols
    tail = _tail_start(job, limit, validate_crc)
    _count_regions(job, job.counted, tail, files)   # pass 1 over the rest of the head
    _place_outputs(job, tail, limit)
    _bound_sizes(job, tail)
    cdef _ColumnArrays arrays = _arrays_for_fill(job, include_headers)
    _fill_placed(job, tail)
    _raise_first(job, 0, job.regs.n, files)
    return arrays.columns(&job.tail.at if tail < job.regs.n else &job.total, include_headers,
                          topic, partition)


cdef _ColumnArrays _arrays_for_fill(_DecodeJob job, bint headers):
    """The arrays of ``job.cap``, the job's sink pointing into them, held by the job; whether
    to stream into them. Runs the test hook that may rewrite the buffer before the fill."""
    cdef int64_t fresh = _fresh
    cdef _ColumnArrays arrays = _allocate_columns(&job.sink, &job.cap, headers)
    # Streamed stores pay only over memory already written: the kernel zeroes a fresh page at
    # its first write, which leaves its lines cached for plain stores (1M records into fresh
    # memory: 34.8 ms with plain stores, 39 - 40 streamed).
    job.stream = (not headers and _fresh == fresh
                  and _region_bytes(job.regs, 0, job.regs.n) >= STREAM_MIN_BYTES)
    # The job holds the arrays its sink points into: if the wait for the other thread is
    # interrupted, they outlive this call until that thread is done.
    job.keep.append(arrays)
    if _between_passes is not None:
        _between_passes()
    return arrays


cdef _DecodeJob _new_job(int64_t lo, int64_t hi, bint headers):
    """A column decode of the records in [lo, hi), with or without their headers."""
    cdef _DecodeJob job = _DecodeJob.__new__(_DecodeJob)
    job.regs = _Regions.__new__(_Regions)
    job.regs.keep = []
    job.mvs = []
    job.keep = []
    job.lo = lo
    job.hi = hi
    job.headers = headers
    return job


cdef int _select_batches(_DecodeJob job, sources, list files, int64_t limit, bint validate_crc,
                         bint strict, bint chunked) except -1:
    """Take the v2 batches of the sources that hold records of [lo, hi) as regions, up to the
    one holding the last record wanted, and count them (pass 1) as soon as that one may be
    among them. Returns 1 at a v0/v1 batch (such data is decoded as records instead)."""
    # Pass 1 (CRC and sizes) has run over regions [0, counted); those after it hold at most
    # `bound` records (their headers' counts). A batch is taken only while the records before
    # it may be fewer than the `need` still wanted, so it is always needed: every kept batch
    # is checked, and no batch after the last one needed is looked at.
    job.need = limit
    job.bound = 0
    job.counted = 0
    for k, src in enumerate(sources):
        if job.need <= 0:
            break
        if _select_from_range(job, k, src, files, validate_crc, strict, chunked):
            return 1
    return 0


cdef int _select_from_range(_DecodeJob job, int k, object src, list files, bint validate_crc,
                            bint strict, bint chunked) except -1:
    """_select_batches over source ``k``; returns 1 at a v0/v1 batch."""
    buf, start, end, file = src[:4]
    start = _i64_arg(start, "start", InvalidArgumentError)
    cdef bint release = len(src) > 4 and bool(src[4])
    # Batches inside [checked_lo, checked_hi) had their CRCs checked by the caller moments ago
    # (a read-only log's refresh scans what the writer added): not checked a second time.
    cdef Py_ssize_t checked_lo = 0, checked_hi = -1
    if len(src) > 5 and src[5] is not None:
        checked_lo, checked_hi = src[5]
    cdef bint crc
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef const uint8_t* base = _ptr(view)
    cdef Py_ssize_t e = _resolve_end(view.shape[0], start, end), pos = start, i
    # A hint: ignored where dropping the pages would lose the caller's bytes (the decode's
    # result is the same either way).
    release = release and _pages_droppable(buf)
    cdef _Regions regs = job.regs
    mv = _byte_view(buf)
    job.mvs.append(mv)
    files.append(file)
    # With max_records the headers are scanned a few batches at a time (more each time), so
    # the scan stops soon after the batches needed; without, in one go.
    cdef Py_ssize_t chunk = 16 if chunked else -1
    cdef _Scan scan
    cdef HeaderVec* vec
    cdef BatchHeader* h
    cdef Region* reg
    cdef int codec
    cdef bint skip
    while job.need > 0:
        scan = _scan(buf, view, pos, e, False, chunk, strict)
        job.keep.append(scan)
        vec = &scan.headers.vec
        for i in range(vec.n):
            h = &vec.items[i]
            if h.magic < 2:
                return 1
            codec = h.attributes & 0x07
            skip = _skipped(h, job.lo, job.hi, False)
            crc = validate_crc and not (checked_lo <= h.position
                                        and h.position + h.size <= checked_hi)
            # Skipped and compressed batches are checked now; kept uncompressed ones in
            # pass 1, while their bytes are hot.
            if crc and (skip or codec != 0) and not _batch_crc_ok(base, mv, h):
                _raise_after(job, job.counted, files, ST_CRC, h.position, file)
            if skip:
                continue
            reg = _new_region(job)
            try:
                payload = _region_at(reg, view, mv, h, i, file)
            except CorruptRecordError:
                _count_regions(job, job.counted, regs.n, files)
                raise
            if payload is not None:
                regs.keep.append(payload)
            reg.source = k
            # Only uncompressed batches point into the mapping (compressed ones were inflated).
            reg.release = release and codec == 0
            reg.crc_pending = crc and codec == 0
            regs.n += 1
            job.bound += h.records_count
            if job.bound >= job.need:
                job.need -= _count_regions(job, job.counted, regs.n, files)
                job.counted = regs.n
                job.bound = 0
                if job.need <= 0:
                    return 0
        if scan.status != ST_OK:
            # The records wanted run on into the damaged batch.
            _raise_after(job, job.counted, files, scan.status, scan.error_pos, file)
        if chunk < 0 or vec.n < chunk:
            return 0  # the end of this range
        pos = scan.valid_end
        chunk = min(chunk * 2, 4096)
    return 0


cdef int _place_outputs(_DecodeJob job, Py_ssize_t tail, int64_t limit) except -1:
    """Give each counted batch (regions [0, tail)) its place in the columns: where its records
    and bytes start, after those of the batches before it; ``job.total`` is where they end.
    Batches past the ``limit``-th record get no place, the one holding it a place cut short."""
    cdef BatchOut* o
    cdef ColumnSink cut
    cdef Py_ssize_t i, err
    cdef ColumnCounts* total = &job.total
    memset(total, 0, sizeof(ColumnCounts))
    for i in range(tail):
        o = &job.outs[i]
        if total.n >= limit:
            memset(&o.size, 0, sizeof(ColumnCounts))
            continue
        if total.n + o.size.n > limit:
            # max_records cuts this batch short: count the bytes of the records it keeps (the
            # fill pass stops at `limit` records).
            memset(&cut, 0, sizeof(ColumnSink))
            decode_region_columns(&job.regs.items[i], job.regs.items[i].header, job.lo, job.hi,
                                  limit - total.n, job.headers, &cut, NULL, &err)
            o.size = cut.at
        o.start = total[0]
        total[0] = _counts_sum(total, &o.size)
    job.limit = total.n
    return 0


cdef void _bound_sizes(_DecodeJob job, Py_ssize_t tail) noexcept:
    """``job.cap``: what the columns must hold. The counted batches' totals, plus what the
    uncounted tail (regions [tail, n)) can hold at most: no more records than their counts
    (nor than fit their bytes, against corrupt counts), no more key or value bytes than theirs
    (the tail is decoded without headers)."""
    cdef Py_ssize_t i
    cdef int64_t tail_bytes
    cdef Region* reg
    job.cap = job.total
    for i in range(tail, job.regs.n):
        reg = &job.regs.items[i]
        tail_bytes = reg.end - reg.start
        job.cap.n += min(max(reg.header.records_count, 0), tail_bytes // MIN_RECORD_BYTES)
        job.cap.key_bytes += tail_bytes
        job.cap.value_bytes += tail_bytes


cdef class _ColumnArrays:
    """The arrays a column decode fills, sized before the fill pass."""
    cdef object offsets, timestamps, ts_types, key_offsets, key_valid, key_data
    cdef object value_offsets, value_valid, value_data
    cdef object hdr_offsets, hk_offsets, hk_data, hv_offsets, hv_valid, hv_data
    cdef object dummy      # where empty arrays point (never written: their capacity is 0)

    cdef object columns(self, const ColumnCounts* used, bint headers, topic, partition):
        """The RecordColumns of the ``used`` part of the arrays."""
        cdef int64_t n = used.n, kb = used.key_bytes, vb = used.value_bytes
        header_col = None
        if headers:
            header_col = HeaderColumn(
                self.hdr_offsets,
                BinaryColumn(self.hk_data, self.hk_offsets,
                             np.ones(used.n_headers, dtype=np.bool_)),
                BinaryColumn(self.hv_data, self.hv_offsets, self.hv_valid))
        return RecordColumns(
            _head(self.offsets, n), _head(self.timestamps, n), _head(self.ts_types, n),
            BinaryColumn(_head(self.key_data, kb), _head(self.key_offsets, n + 1),
                         _head(self.key_valid, n)),
            BinaryColumn(_head(self.value_data, vb), _head(self.value_offsets, n + 1),
                         _head(self.value_valid, n)),
            header_col, topic, partition)


cdef inline object _head(arr, int64_t n):
    # The first n items (arrays sized by an upper bound are cut to what was filled).
    return arr if len(arr) == n else arr[:n]


cdef _ColumnArrays _allocate_columns(ColumnSink* sink, const ColumnCounts* cap, bint headers):
    """Arrays for ``cap`` records and bytes (and headers, when asked), in pooled memory when
    large, with ``sink`` pointing into them."""
    cdef _ColumnArrays a = _ColumnArrays.__new__(_ColumnArrays)
    a.offsets = _pool_empty(cap.n, np.int64, 8)
    a.timestamps = _pool_empty(cap.n, np.int64, 8)
    a.ts_types = _pool_empty(cap.n, np.int8, 1)
    a.key_offsets = _pool_empty(cap.n + 1, np.int64, 8)
    a.key_valid = _pool_empty(cap.n, np.bool_, 1)
    a.key_data = _pool_empty(cap.key_bytes, np.uint8, 1)
    a.value_offsets = _pool_empty(cap.n + 1, np.int64, 8)
    a.value_valid = _pool_empty(cap.n, np.bool_, 1)
    a.value_data = _pool_empty(cap.value_bytes, np.uint8, 1)
    a.key_offsets[0] = 0
    a.value_offsets[0] = 0
    a.dummy = np.empty(8, dtype=np.uint8)
    memset(sink, 0, sizeof(ColumnSink))
    sink.offsets = <int64_t*>_addr(a.offsets, a.dummy)
    sink.timestamps = <int64_t*>_addr(a.timestamps, a.dummy)
    sink.ts_types = <int8_t*>_addr(a.ts_types, a.dummy)
    sink.key_offsets = <int64_t*>_addr(a.key_offsets, a.dummy)
    sink.key_valid = <uint8_t*>_addr(a.key_valid, a.dummy)
    sink.key_data = <uint8_t*>_addr(a.key_data, a.dummy)
    sink.value_offsets = <int64_t*>_addr(a.value_offsets, a.dummy)
    sink.value_valid = <uint8_t*>_addr(a.value_valid, a.dummy)
    sink.value_data = <uint8_t*>_addr(a.value_data, a.dummy)
    if headers:
        a.hdr_offsets = _pool_empty(cap.n + 1, np.int64, 8)
        a.hk_offsets = _pool_empty(cap.n_headers + 1, np.int64, 8)
        a.hk_data = _pool_empty(cap.hk_bytes, np.uint8, 1)
        a.hv_offsets = _pool_empty(cap.n_headers + 1, np.int64, 8)
        a.hv_valid = _pool_empty(cap.n_headers, np.bool_, 1)
        a.hv_data = _pool_empty(cap.hv_bytes, np.uint8, 1)
        a.hdr_offsets[0] = 0
        a.hk_offsets[0] = 0
        a.hv_offsets[0] = 0
        sink.hdr_offsets = <int64_t*>_addr(a.hdr_offsets, a.dummy)
        sink.hk_offsets = <int64_t*>_addr(a.hk_offsets, a.dummy)
        sink.hk_data = <uint8_t*>_addr(a.hk_data, a.dummy)
        sink.hv_offsets = <int64_t*>_addr(a.hv_offsets, a.dummy)
        sink.hv_valid = <uint8_t*>_addr(a.hv_valid, a.dummy)
        sink.hv_data = <uint8_t*>_addr(a.hv_data, a.dummy)
    return a


# Ranges this large (in record bytes, about their output's size) write their columns with
# streamed stores (_stream_out.pxi): the output outgrows the caches, so the reader finds it in
# memory either way. Smaller output stays in the caches for the caller, which plain stores
# leave it in. Measured on the 1M-record log's first batches (2 threads): plain stores were
# faster up to 32 MB (3.6 against 4.0 ms), streams from 49 MB (6.1 against 6.8 ms).
cdef int64_t STREAM_MIN_BYTES = 40 << 20


def _set_stream_min_bytes(int64_t n):
    """Tune (0: always, a huge value: never) when column decodes stream their output; returns
    the previous value."""
    global STREAM_MIN_BYTES
    old = STREAM_MIN_BYTES
    STREAM_MIN_BYTES = n
    return old


cdef int _fill_placed(_DecodeJob job, Py_ssize_t tail) except -1:
    """Pass 2: every placed batch copied to its place, on two threads when they are large:
    one copies them from the first on, the other from the last on, until the two meet. With
    a one-pass tail, the other thread first checks and copies the tail from where the placed
    batches end. Leaves any damage in ``job.outs``."""
    cdef _Regions regs = job.regs
    if tail < regs.n:
        job.tail = job.sink
        job.tail.at = job.total
        job.tail.cap = job.cap
        job.claim = <uint64_t>tail   # front 0, back tail
        other = _second_core(job.fill_tail, tail, regs.n)
        if _head_from_front:
            job.fill_head(tail)
        other.result()
    elif job.total.n:
        if _split_point(regs, 0, regs.n) < regs.n and regs.n <= CLAIM_MAX:
            # Every batch is placed: one thread takes them from the front, the other from
            # the back, so neither waits on a slower half.
            job.claim = <uint64_t>regs.n
            other = _second_core(job.fill_back)
            if _head_from_front:
                job.fill_head(regs.n)
            other.result()
        else:
            job.fill(0, regs.n)
    return 0


_between_passes = None
_head_from_front = True


def _set_head_from_front(bint on):
    """Tests: whether the first thread of a two-thread fill takes batches from the front (off:
    the other thread fills them all, from the back). Returns the previous setting."""
    global _head_from_front
    old = _head_from_front
    _head_from_front = on
    return old


def _set_between_passes(hook):
    """Tests: run ``hook()`` in every column decode just before its fill pass (after the
    counting pass or the prediction of sizes, once the arrays are allocated; a predicted
    decode that falls back runs it again before the counted fill), as another writer of the
    buffer could; None turns it off. Returns the previous hook."""
    global _between_passes
    old = _between_passes
    _between_passes = hook
    return old


cdef size_t _addr(arr, dummy):
    # Address of an array's first byte (a dummy for empty arrays, which are never written).
    if arr.nbytes == 0:
        arr = dummy
    cdef uint8_t[::1] v = arr.view(np.uint8)
    return <size_t>&v[0]


def _legacy_columns(sources, min_offset, end_offset, max_records, validate_crc, include_headers,
                    topic, partition):
    records = []
    for src in sources:
        buf, start, end, file = src[:4]
        left = None if max_records is None else max_records - len(records)
        if left is not None and left <= 0:
            break
        records += decode_records(buf, start, end, min_offset=min_offset, end_offset=end_offset,
                                  max_records=left, validate_crc=validate_crc, file=file)
    return _columns_from_records(records, include_headers, topic, partition)


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
