# The passes of a large column decode, split over two threads: per-batch sizes and start
# positions (BatchOut), the counting, copying and one-pass tail kernels, the second thread,
# and the job both threads share. Included by _decode.pxi; shares _core's namespace.

# The placed batches of a two-thread fill are taken from both ends: the first thread takes
# them from the front, the other (after the one-pass tail, when there is one) from the back,
# until the two meet. Both ends live in one 64-bit word (front << 32 | back) that each thread
# advances with a compare-and-swap, so every batch is taken exactly once.
cdef extern from *:
    """
    static inline int64_t seg_claim(uint64_t* word, int from_back) {
        uint64_t s = __atomic_load_n(word, __ATOMIC_ACQUIRE), t, f, b;
        for (;;) {
            f = s >> 32;
            b = s & 0xffffffffu;
            if (f >= b) return -1;
            t = from_back ? ((f << 32) | (b - 1)) : (((f + 1) << 32) | b);
            if (__atomic_compare_exchange_n(word, &s, t, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return from_back ? (int64_t)(b - 1) : (int64_t)f;
        }
    }
    /* Hand out no more batches (back = front): a decode that falls back needs no more. */
    static inline void seg_claim_close(uint64_t* word) {
        uint64_t s = __atomic_load_n(word, __ATOMIC_ACQUIRE), f;
        do {
            f = s >> 32;
        } while (!__atomic_compare_exchange_n(word, &s, (f << 32) | f, 1, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE));
    }
    """
    int64_t seg_claim(uint64_t* word, int from_back) nogil
    void seg_claim_close(uint64_t* word) nogil

cdef enum:
    CLAIM_MAX = 0x7fffffff   # most batches a claim word hands out (each end has 32 bits)


# Per-batch output sizes and start positions of a column decode.
cdef struct BatchOut:
    int status
    Py_ssize_t err_pos
    ColumnCounts size       # its selected records and their bytes
    ColumnCounts start      # where its output starts


cdef inline void _prefetch_next(ColumnSink* s, const Region* nxt) noexcept nogil:
    """Have the decode of a batch prefetch the bytes of the next one (``nxt``; NULL: none),
    which a pass that checks each batch's CRC before parsing it reads next: the CRC then runs
    over cached lines, while the parse of this batch, which waits on no memory, hides the
    fetch."""
    if nxt == NULL:
        s.next = s.next_end = NULL
    elif nxt.crc_pending:   # the whole batch, as its CRC reads it
        s.next = nxt.data + nxt.header.position
        s.next_end = s.next + nxt.header.size
    else:
        s.next = nxt.data + nxt.start
        s.next_end = nxt.data + nxt.end


cdef inline bint _crc_bad(const Region* reg) noexcept nogil:
    """Whether a batch whose CRC is still to check fails it (the compiled CRC-32C)."""
    return reg.crc_pending and crc32c_c(reg.data + reg.header.position + 21,
                                        reg.header.size - 21) != reg.header.crc


cdef inline bint _taken_whole(const Region* reg, int64_t lo, int64_t hi) noexcept nogil:
    """Whether a decode of [lo, hi) selects every record of the batch."""
    return reg.header.base_offset >= lo and reg.header.last_offset < hi


cdef inline bint _count_one(const Region* reg, const Region* nxt, int64_t lo, int64_t hi,
                            bint headers, BatchOut* out) noexcept nogil:
    """Count one batch whose CRC (if pending) passed: its sizes into ``out``, by its lengths
    alone when it is taken whole, prefetching the next batch (``nxt``; NULL: none). Returns
    False at damage, which ``out`` names."""
    cdef ColumnSink s
    cdef const BatchHeader* h = reg.header
    memset(&s, 0, sizeof(ColumnSink))
    _prefetch_next(&s, nxt)
    if headers or not _taken_whole(reg, lo, hi) or not count_region_sizes(reg, h, &s):
        memset(&s.at, 0, sizeof(ColumnCounts))
        out.status = decode_region_columns(reg, h, lo, hi, INT64_MAX_C, headers, &s, NULL,
                                           &out.err_pos)
    out.size = s.at
    return out.status == ST_OK


cdef void _count_range(_Regions regs, Py_ssize_t i0, Py_ssize_t i1, int64_t lo, int64_t hi,
                       bint headers, BatchOut* outs) noexcept nogil:
    """Counting pass over regions [i0, i1) with the compiled CRC-32C, wholly without the GIL
    (one release per pass, where it was one per batch; measured no faster or slower)."""
    cdef Py_ssize_t i
    cdef const Region* reg
    for i in range(i0, i1):
        reg = &regs.items[i]
        if _crc_bad(reg):
            outs[i].status = ST_CRC
            outs[i].err_pos = reg.header.position
            return
        if not _count_one(reg, &regs.items[i + 1] if i + 1 < i1 else NULL, lo, hi, headers,
                          &outs[i]):
            return


cdef int _count_batches(list mvs, _Regions regs, Py_ssize_t i0, Py_ssize_t i1,
                        int64_t lo, int64_t hi, bint headers, BatchOut* outs) except -1:
    """Counting pass over regions [i0, i1): CRC then sizes, per batch (without the GIL unless
    the crc32c package's routine could not be bound, when each CRC is checked with it)."""
    cdef Py_ssize_t i
    cdef Region* reg
    if _crc_fn != NULL:
        with nogil:
            _count_range(regs, i0, i1, lo, hi, headers, outs)
        return 0
    for i in range(i0, i1):
        reg = &regs.items[i]
        if reg.crc_pending and not _crc_ok(mvs[reg.source], <BatchHeader*>reg.header):
            outs[i].status = ST_CRC
            outs[i].err_pos = reg.header.position
            return 0
        with nogil:
            if not _count_one(reg, &regs.items[i + 1] if i + 1 < i1 else NULL, lo, hi,
                              headers, &outs[i]):
                return 0
    return 0


cdef inline void _sink_at_place(ColumnSink* s, const ColumnSink* base, const BatchOut* o,
                                const Region* nxt, bint crc) noexcept nogil:
    """``s``: the fill's sink ``base`` bounded to batch ``o``'s place, prefetching as it
    copies, and asking for the first bytes of ``nxt``, the batch it copies next (NULL: none),
    since the prefetch runs only s.prefetch bytes ahead within a batch. With ``crc`` (the fill
    checks each batch's CRC first, which brings the batch into the caches) it prefetches only
    the next batch, whole, for its CRC."""
    s[0] = base[0]
    s.at = o.start
    s.cap = _counts_sum(&o.start, &o.size)
    if crc:
        s.prefetch = 0
        _prefetch_next(s, nxt)
        return
    s.prefetch = PREFETCH_DIST
    if nxt != NULL:
        s.next = nxt.data + nxt.start
        s.next_end = s.next + min(PREFETCH_DIST, nxt.end - nxt.start)


cdef inline bint _fill_crc_ok(const Region* reg, bint crc, BatchOut* o) noexcept nogil:
    """Whether a batch's CRC passed: checked here when the fill checks CRCs (``crc``: no
    counting pass checked them), else by the counting pass. False leaves ST_CRC in ``o``."""
    if crc and _crc_bad(reg):
        o.status = ST_CRC
        o.err_pos = reg.header.position
        return False
    return True


cdef inline void _stop_if_falling_back(bint failed, bint crc, uint64_t* claim) noexcept nogil:
    """A fill that checks CRCs (its sizes predicted) falls back to counting at any batch that
    fails: the other thread is then told to take no more batches, where in a counted fill it
    goes on up to the failed one (so that the first damage in order is found)."""
    if failed and crc and claim != NULL:
        seg_claim_close(claim)


cdef void _fill_batches(_Regions regs, Py_ssize_t i0, Py_ssize_t i1, int64_t lo,
                        int64_t hi, int64_t limit, bint headers, bint stream, bint crc,
                        const ColumnSink* base, BatchOut* outs,
                        uint64_t* claim) noexcept nogil:
    """Fill pass over regions [i0, i1) (or, given ``claim``, over those it hands out from the
    front): each batch writes at its precomputed positions, and only there (through streams
    when ``stream``: the batches' places follow each other), prefetching the bytes it reads
    (the counting pass read them long ago), after checking its CRC when ``crc``. A batch that
    does not fill its place exactly (its bytes changed since they were counted, or its sizes
    were predicted wrong) stops the pass with ST_CHANGED in its ``outs``."""
    cdef Py_ssize_t i = i0 - 1
    cdef ColumnSink s
    cdef BatchOut* o
    cdef ColumnStreams* out = NULL
    cdef ColumnCounts end
    cdef int st
    cdef bint failed = False
    cdef size_t run_lo = 0, run_hi = 0
    while True:
        i = seg_claim(claim, 0) if claim != NULL else i + 1
        if i < 0 or i >= i1:
            break
        o = &outs[i]
        if not _fill_crc_ok(&regs.items[i], crc, o):
            failed = True
            break
        if o.size.n == 0 or o.start.n >= limit:
            continue
        _sink_at_place(&s, base, o, &regs.items[i + 1] if i + 1 < i1 else NULL, crc)
        if out != NULL and not _counts_equal(&o.start, &end):
            _close_streams(out)   # not where the last batch ended: start the streams anew
            out = NULL
        if stream and out == NULL:
            out = _open_streams(&s)   # NULL (no memory): plain stores
        st = decode_region_columns(&regs.items[i], regs.items[i].header, lo, hi, limit, headers,
                                   &s, out, &o.err_pos)
        if st != ST_OK or not _counts_equal(&s.at, &s.cap):
            o.status = _recount(&regs.items[i], lo, hi, headers, &o.err_pos)
            failed = True
            break
        end = s.at
        _release_batch(&regs.items[i], &run_lo, &run_hi, False)
    _stop_if_falling_back(failed, crc, claim)
    if out != NULL:
        _close_streams(out)
    _release_batch(NULL, &run_lo, &run_hi, True)


cdef void _fill_from_back(_Regions regs, int64_t lo, int64_t hi, int64_t limit, bint headers,
                          bint stream, bint crc, const ColumnSink* base, BatchOut* outs,
                          uint64_t* claim) noexcept nogil:
    """The fill pass over the placed batches ``claim`` hands out from the back, last first,
    each written at its place (through its own streams when ``stream``: these places precede
    each other). Stops at the first batch that does not fill its place exactly, as
    _fill_batches does."""
    cdef int64_t i
    cdef ColumnSink s
    cdef BatchOut* o
    cdef ColumnStreams* out
    cdef int st
    cdef bint failed = False
    cdef size_t run_lo = 0, run_hi = 0
    while True:
        i = seg_claim(claim, 1)
        if i < 0:
            break
        o = &outs[i]
        if not _fill_crc_ok(&regs.items[i], crc, o):
            failed = True
            break
        if o.size.n == 0 or o.start.n >= limit:
            continue
        # The batch this end takes next (if still free) is the one before.
        _sink_at_place(&s, base, o, &regs.items[i - 1] if i > 0 else NULL, crc)
        out = _open_streams(&s) if stream else NULL
        st = decode_region_columns(&regs.items[i], regs.items[i].header, lo, hi, limit,
                                   headers, &s, out, &o.err_pos)
        if out != NULL:
            _close_streams(out)
        if st != ST_OK or not _counts_equal(&s.at, &s.cap):
            o.status = _recount(&regs.items[i], lo, hi, headers, &o.err_pos)
            failed = True
            break
        _release_batch(&regs.items[i], &run_lo, &run_hi, False, True)
    _stop_if_falling_back(failed, crc, claim)
    _release_batch(NULL, &run_lo, &run_hi, True, True)


cdef inline int _count_full(const Region* reg, int64_t lo, int64_t hi, bint headers,
                            Py_ssize_t* err_pos) noexcept nogil:
    """A full count of one batch (every field parsed), for its status alone: how damage met
    after a lengths-only count is named."""
    cdef ColumnSink s
    memset(&s, 0, sizeof(ColumnSink))
    return decode_region_columns(reg, reg.header, lo, hi, INT64_MAX_C, headers, &s, NULL,
                                 err_pos)


cdef int _recount(const Region* reg, int64_t lo, int64_t hi, bint headers,
                  Py_ssize_t* err_pos) noexcept nogil:
    """The status of a batch the fill found damaged: its damage, named by a full count (the
    counting pass may have read only its lengths), or ST_CHANGED when it counts cleanly now
    (its bytes changed between the passes)."""
    cdef int st = _count_full(reg, lo, hi, headers, err_pos)
    if st == ST_OK:
        err_pos[0] = reg.position
        return ST_CHANGED
    return st


cdef enum:
    MIN_RECORD_BYTES = 7   # length, attributes, timestamp and offset deltas, key and value
                           # lengths, header count: one byte each at least


cdef void _fill_tail(_Regions regs, Py_ssize_t i0, Py_ssize_t i1, int64_t lo, int64_t hi,
                     bint stream, ColumnSink* s, BatchOut* outs) noexcept nogil:
    """Check and copy regions [i0, i1) in one pass, each batch while its bytes are hot, writing
    on from the sink's running totals up to its capacity (no counting pass: the arrays were
    sized by an upper bound), through streams when ``stream``. Stops at the first damaged
    batch, whose status it leaves in ``outs``."""
    cdef Py_ssize_t i
    cdef Region* reg
    cdef const BatchHeader* h
    cdef size_t run_lo = 0, run_hi = 0
    cdef ColumnStreams* out = _open_streams(s) if stream else NULL
    for i in range(i0, i1):
        reg = &regs.items[i]
        h = reg.header
        if _crc_bad(reg):
            outs[i].status = ST_CRC
            outs[i].err_pos = h.position
            break
        _prefetch_next(s, &regs.items[i + 1] if i + 1 < i1 else NULL)
        outs[i].status = decode_region_columns(reg, h, lo, hi, INT64_MAX_C, False, s, out,
                                               &outs[i].err_pos)
        if outs[i].status != ST_OK:
            break
        _release_batch(reg, &run_lo, &run_hi, False)
    if out != NULL:
        _close_streams(out)
    _release_batch(NULL, &run_lo, &run_hi, True)


# The share of a large range's bytes checked and copied in one pass (the tail). The head is
# counted on both threads, then copied on one (f, per whole range) while the other checks and
# copies the tail (o): the threads finish together when the tail holds f / (f + o) of the
# bytes. Both copy passes read their batches from memory, and the tail's pass also checks
# CRCs, so o is a little more than f: the balance is a little under half. Measured on the
# 1M-record log (2 threads, best of 7, three rounds): 0.4 took 25.6 - 27.2 ms, 0.45 23.7 -
# 24.5, 0.5 22.1 - 22.6, 0.55 23.2 - 23.9, and a share that adapted to the threads' finishing
# times settled at 0.47 - 0.48 (not kept: the arrays sized by it vary with it, which defeated
# the buffer pool). Since the head's copy prefetches and large outputs are streamed, the
# head's copy costs less per byte; measured with the log out of the caches before each run
# (as when a benchmark's peer runs in between): 0.38 took 21.4 ms, 0.41 20.4 - 20.7, 0.44
# 20.4 - 20.9, 0.47 21.0, 0.5 21.4 - 21.6. With the head counted by its lengths only, on
# the AMD VM (shares alternated in one process, the log out of the caches, best of 7, median
# of 8 rounds): 0.43 took 17.3 ms, 0.46 15.9, 0.48 15.5, 0.5 15.9, 0.58 17.5. Since the
# tail's thread goes on to fill head batches from the back, a share that leaves it done first
# costs only the larger count: builds alternated in separate processes (the log out of the
# caches, 21 runs each, 6 rounds) gave medians of 16.3 - 17.4 ms at 0.4 and 16.1 - 17.9 at
# 0.48, against 16.3 - 18.4 for the fixed split at 0.48, and upper quartiles of 17.0 - 18.1,
# 16.9 - 18.5 and 17.3 - 22.7: the shared head mostly trims the slow runs.
cdef double TAIL_SHARE = 0.40


def _set_tail_share(double share):
    """Tune (or with 0, turn off) the one-pass tail of large column decodes; returns the
    previous share."""
    global TAIL_SHARE
    old = TAIL_SHARE
    TAIL_SHARE = share
    return old


cdef bint _large_whole_read(_DecodeJob job, int64_t limit, bint validate_crc) noexcept:
    """Whether a decode may check and copy batches in one pass, on two threads sharing them
    through a claim word: a large range read whole (no max_records, no headers, nothing
    counted yet) whose CRCs can be checked without the GIL."""
    cdef _Regions regs = job.regs
    return (limit == INT64_MAX_C and not job.headers and job.counted == 0
            and not (_crc_fn == NULL and validate_crc) and 2 <= regs.n <= CLAIM_MAX
            and _region_bytes(regs, 0, regs.n) >= PARALLEL_MIN_BYTES)


cdef inline void _clear_outs(_DecodeJob job) noexcept:
    """Every region's BatchOut zeroed, for a counting pass to fill anew."""
    memset(job.outs, 0, job.regs.n * sizeof(BatchOut))


cdef Py_ssize_t _tail_start(_DecodeJob job, int64_t limit, bint validate_crc) noexcept:
    """Where the one-pass tail of a large decode starts (regs.n: no tail). The head is counted
    by both threads, then copied by one while the other checks and copies the tail, split by
    TAIL_SHARE so that both finish together. Only a large range read whole (no max_records,
    no headers, nothing counted yet) has a tail, and only when its CRCs can be checked
    without the GIL."""
    cdef _Regions regs = job.regs
    cdef int64_t total = 0, acc = 0
    cdef Py_ssize_t i
    if TAIL_SHARE <= 0 or not _large_whole_read(job, limit, validate_crc):
        return regs.n
    total = _region_bytes(regs, 0, regs.n)
    for i in range(regs.n):
        if acc >= total * (1.0 - TAIL_SHARE):
            return i
        acc += regs.items[i].end - regs.items[i].start
    return regs.n


_pool = None


def _second_core(fn, *args):
    """Run fn(*args) on a persistent worker thread; the kernels release the GIL."""
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="segstore-decode")
    return _pool.submit(fn, *args)


def _forget_second_core():
    # A forked child has the executor but not its thread: work submitted to it never runs.
    global _pool
    _pool = None


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_forget_second_core)


cdef int64_t PARALLEL_MIN_BYTES = 8 << 20   # below this a second thread costs more than it saves


def _set_parallel_min_bytes(int64_t n):
    """Tune (or with a huge value, disable) the two-thread split of column decodes; returns
    the previous value."""
    global PARALLEL_MIN_BYTES
    old = PARALLEL_MIN_BYTES
    PARALLEL_MIN_BYTES = n
    return old


cdef class _DecodeJob:
    """State of one column decode, shared by the two halves of its parallel passes."""
    cdef list mvs          # one byte memoryview per source buffer
    cdef list keep         # scans whose C header arrays the regions point into; the arrays
                           # the sinks point into
    cdef _Regions regs
    cdef int64_t lo, hi, limit
    cdef bint headers
    cdef BatchOut* outs    # one per region, grown with them
    cdef int64_t need      # selecting: records still wanted after the counted regions
    cdef int64_t bound     # selecting: most records the uncounted regions can hold
    cdef Py_ssize_t counted  # regions [0, counted) have been through pass 1
    cdef ColumnCounts total  # where the placed batches' output ends
    cdef ColumnCounts cap    # what the arrays hold
    cdef ColumnSink sink
    cdef ColumnSink tail   # the one-pass tail's sink, with its running totals
    cdef bint stream       # fill through streamed stores (the output outgrows the caches)
    cdef uint64_t claim    # the placed batches still free: front << 32 | back
    cdef bint crc_in_fill  # the fill checks the CRCs (sizes predicted: no counting pass)

    def __dealloc__(self):
        free(self.outs)

    def count(self, Py_ssize_t i0, Py_ssize_t i1):
        _count_batches(self.mvs, self.regs, i0, i1, self.lo, self.hi, self.headers, self.outs)

    def fill(self, Py_ssize_t i0, Py_ssize_t i1):
        with nogil:
            _fill_batches(self.regs, i0, i1, self.lo, self.hi, self.limit, self.headers,
                          self.stream, self.crc_in_fill, &self.sink, self.outs, NULL)

    def fill_head(self, Py_ssize_t n):
        """The fill from the front of batches [0, n), shared with the thread of fill_tail or
        fill_back."""
        with nogil:
            _fill_batches(self.regs, 0, n, self.lo, self.hi, self.limit, self.headers,
                          self.stream, self.crc_in_fill, &self.sink, self.outs, &self.claim)

    def fill_back(self):
        """The fill from the back, sharing the batches with fill_head's thread."""
        with nogil:
            _fill_from_back(self.regs, self.lo, self.hi, self.limit, self.headers,
                            self.stream, self.crc_in_fill, &self.sink, self.outs,
                            &self.claim)

    def fill_tail(self, Py_ssize_t i0, Py_ssize_t i1):
        """The one-pass tail, then whatever head batches fill_head has not taken yet."""
        with nogil:
            _fill_tail(self.regs, i0, i1, self.lo, self.hi, self.stream, &self.tail, self.outs)
            _fill_from_back(self.regs, self.lo, self.hi, self.limit, self.headers,
                            self.stream, self.crc_in_fill, &self.sink, self.outs,
                            &self.claim)


cdef Region* _new_region(_DecodeJob job) except NULL:
    """The slot of one more region (with its zeroed BatchOut), growing both arrays as needed;
    the caller counts it in (``regs.n += 1``) once it is filled."""
    cdef _Regions regs = job.regs
    cdef Py_ssize_t cap
    cdef Region* items
    cdef BatchOut* outs
    if regs.n == regs.cap:
        cap = 64 if regs.cap == 0 else regs.cap * 2
        items = <Region*>realloc(regs.items, cap * sizeof(Region))
        if items == NULL:
            raise MemoryError()
        regs.items = items
        outs = <BatchOut*>realloc(job.outs, cap * sizeof(BatchOut))
        if outs == NULL:
            raise MemoryError()
        job.outs = outs
        memset(&outs[regs.cap], 0, (cap - regs.cap) * sizeof(BatchOut))
        regs.cap = cap
    return &regs.items[regs.n]


cdef int64_t _region_bytes(_Regions regs, Py_ssize_t i0, Py_ssize_t i1) noexcept:
    """Record bytes of regions [i0, i1)."""
    cdef int64_t total = 0
    cdef Py_ssize_t i
    for i in range(i0, i1):
        total += regs.items[i].end - regs.items[i].start
    return total


cdef Py_ssize_t _split_point(_Regions regs, Py_ssize_t i0, Py_ssize_t i1) noexcept:
    """Where regions [i0, i1) are split between two threads; i1 when they are too few bytes
    for a second thread to pay."""
    if _region_bytes(regs, i0, i1) >= PARALLEL_MIN_BYTES and i1 - i0 >= 2:
        return i0 + (i1 - i0) // 2
    return i1


cdef int64_t _count_regions(_DecodeJob job, Py_ssize_t i0, Py_ssize_t i1, list files) except -1:
    """Pass 1 over regions [i0, i1): CRC and sizes, raising the first damage in batch order.
    Returns how many selected records they hold."""
    cdef Py_ssize_t i, split = _split_point(job.regs, i0, i1)
    cdef int64_t n = 0
    if split < i1:
        other = _second_core(job.count, split, i1)
        job.count(i0, split)
        other.result()
    elif i0 < i1:
        job.count(i0, i1)
    for i in range(i0, i1):
        if job.outs[i].status != ST_OK:
            # Damage: the batches before it, maybe counted by their lengths only, are counted
            # in full, so the first damaged batch in order is the one named.
            _recount_before(job, i0, i)
            break
    _raise_first(job, i0, i1, files)
    for i in range(i0, i1):
        n += job.outs[i].size.n
    return n


cdef void _recount_before(_DecodeJob job, Py_ssize_t i0, Py_ssize_t i1) noexcept:
    """Count regions [i0, i1), whose CRCs passed, in full, recording the first damage."""
    cdef Py_ssize_t i
    for i in range(i0, i1):
        job.outs[i].status = _count_full(&job.regs.items[i], job.lo, job.hi, job.headers,
                                         &job.outs[i].err_pos)
        if job.outs[i].status != ST_OK:
            return


cdef int _raise_after(_DecodeJob job, Py_ssize_t counted, list files, int status,
                      Py_ssize_t position, object file) except -1:
    """Raise damage met while selecting batches, after checking the batches taken before it
    (so the first damaged batch in order is the one named)."""
    _count_regions(job, counted, job.regs.n, files)
    _raise_status(status, position, file)


cdef int _raise_first(_DecodeJob job, Py_ssize_t i0, Py_ssize_t i1, list files) except -1:
    """Raise the first damage that a pass over regions [i0, i1) left in their ``outs``."""
    cdef Py_ssize_t i
    for i in range(i0, i1):
        _raise_status(job.outs[i].status, job.outs[i].err_pos, files[job.regs.items[i].source])
