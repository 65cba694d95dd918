# Streamed (non-temporal) output for column decodes larger than the caches.
# Included by _core.pyx; shares its namespace.
#
# A plain store to a cache line that is not cached first reads the line from memory (a read for
# ownership), then writes it back: a large decode moves every output byte over the memory bus
# twice. Non-temporal stores write whole lines without reading them, but only whole, aligned
# lines pay; so each output array is written through a small staging buffer that stays in L1,
# and only its full lines go out non-temporally. The partial lines at the ends of each stream
# are written with plain stores, so bytes beside the stream (another thread's part of the same
# array) are never touched. A C probe on the benchmark VM copied 128 MB in 17 - 19 ms with plain
# stores and in 10 - 13 ms streamed; glibc's memcpy streams only past a share of the last-level
# cache, and on a machine reporting 480 MB of L3 it never does.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif

    #define SEG_STAGE 1024   /* staged bytes that start a drain: a multiple of 64 */
    #define SEG_SHORT 256    /* puts this short are copied in 32-byte steps */
    #define SEG_SLACK 320    /* room past SEG_STAGE: a short put, rounded up, after fill < STAGE */

    typedef struct {
        uint8_t* line;     /* where stage[0] goes: a 64-byte aligned address */
        size_t skip;       /* bytes at the start of the first line that are not the stream's */
        size_t fill;       /* bytes staged, counted from stage[0]; < SEG_STAGE between puts */
        uint8_t stage[SEG_STAGE + SEG_SLACK] __attribute__((aligned(64)));
    } seg_stream;

    static inline void seg_stream_open(seg_stream* s, void* dst) {
        uintptr_t a = (uintptr_t)dst;
        s->line = (uint8_t*)(a & ~(uintptr_t)63);
        s->skip = a & 63;
        s->fill = s->skip;
    }

    /* Write n bytes of whole lines (n a multiple of 64) from src to s->line onwards. */
    static inline void seg_stream_lines(seg_stream* s, const uint8_t* src, size_t n) {
        size_t i = 0;
        if (n && s->skip) {  /* the first line is shared with what precedes the stream */
            memcpy(s->line + s->skip, src + s->skip, 64 - s->skip);
            s->skip = 0;
            i = 64;
        }
    #if defined(__SSE2__)
        for (; i < n; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i*)(src + i));
            __m128i b = _mm_loadu_si128((const __m128i*)(src + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i*)(src + i + 32));
            __m128i d = _mm_loadu_si128((const __m128i*)(src + i + 48));
            _mm_stream_si128((__m128i*)(s->line + i), a);
            _mm_stream_si128((__m128i*)(s->line + i + 16), b);
            _mm_stream_si128((__m128i*)(s->line + i + 32), c);
            _mm_stream_si128((__m128i*)(s->line + i + 48), d);
        }
    #else
        if (i < n) memcpy(s->line + i, src + i, n - i);
    #endif
        s->line += n;
    }

    /* Send the staged full lines; keep the partial last one. */
    static void seg_stream_drain(seg_stream* s) {
        size_t full = s->fill & ~(size_t)63;
        seg_stream_lines(s, s->stage, full);
        memcpy(s->stage, s->stage + full, s->fill - full);
        s->fill -= full;
    }

    static void seg_stream_put_long(seg_stream* s, const uint8_t* src, size_t n) {
        size_t k, whole;
        seg_stream_drain(s);
        k = 64 - s->fill;  /* complete the staged partial line, then send it */
        if (k > n) k = n;
        memcpy(s->stage + s->fill, src, k);
        s->fill += k;
        src += k;
        n -= k;
        if (s->fill < 64) return;
        seg_stream_lines(s, s->stage, 64);
        s->fill = 0;
        whole = n & ~(size_t)63;  /* the line-aligned bulk goes straight from src */
        seg_stream_lines(s, src, whole);
        memcpy(s->stage, src + whole, n - whole);
        s->fill = n - whole;
    }

    static inline void seg_stream_put(seg_stream* s, const void* src, size_t n) {
        if (n <= SEG_SLACK) {
            memcpy(s->stage + s->fill, src, n);
            s->fill += n;
            if (s->fill >= SEG_STAGE) seg_stream_drain(s);
        } else {
            seg_stream_put_long(s, (const uint8_t*)src, n);
        }
    }

    /* n bytes from src, where the bytes up to src_end may be read: a short put is copied in
       32-byte steps, reading and staging a little past its end (later puts overwrite it). */
    static inline void seg_stream_put_near(seg_stream* s, const uint8_t* src, size_t n,
                                           const uint8_t* src_end) {
        if (n <= SEG_SHORT && (size_t)(src_end - src) >= ((n + 31) & ~(size_t)31)) {
            uint8_t* d = s->stage + s->fill;
            size_t i;
            for (i = 0; i < n; i += 32) memcpy(d + i, src + i, 32);
            s->fill += n;
            if (s->fill >= SEG_STAGE) seg_stream_drain(s);
        } else {
            seg_stream_put(s, src, n);
        }
    }

    /* Write out what is staged: full lines streamed, the partial last line with plain stores
       (only the stream's own bytes of it). */
    static void seg_stream_close(seg_stream* s) {
        size_t full = s->fill & ~(size_t)63;
        if (full) seg_stream_lines(s, s->stage, full);
        if (s->fill > full) {
            size_t from = full ? 0 : s->skip;
            memcpy(s->line + from, s->stage + full + from, s->fill - full - from);
        }
        s->fill = s->skip = 0;
    #if defined(__SSE2__)
        _mm_sfence();  /* streamed stores are weakly ordered: drain them before anyone reads */
    #endif
    }
    """
    ctypedef struct seg_stream:
        pass
    void* aligned_alloc(size_t alignment, size_t size) noexcept nogil
    void seg_stream_open(seg_stream* s, void* dst) noexcept nogil
    void seg_stream_put(seg_stream* s, const void* src, size_t n) noexcept nogil
    void seg_stream_put_near(seg_stream* s, const uint8_t* src, size_t n,
                             const uint8_t* src_end) noexcept nogil
    void seg_stream_close(seg_stream* s) noexcept nogil


cdef enum:
    STREAM_CHUNK = 32   # records whose fixed-width fields are gathered before one put each


# The key and value columns of a decode, written as streams (decodes with headers never
# stream). Each record's fixed-width fields are gathered into the
# chunk arrays first, so a record costs plain stores and only every STREAM_CHUNK-th one a put
# per array.
cdef struct ColumnStreams:
    seg_stream offsets
    seg_stream timestamps
    seg_stream ts_types
    seg_stream key_offsets
    seg_stream key_valid
    seg_stream key_data
    seg_stream value_offsets
    seg_stream value_valid
    seg_stream value_data
    int n                               # records gathered in the chunk arrays
    int64_t c_offsets[STREAM_CHUNK]
    int64_t c_timestamps[STREAM_CHUNK]
    int64_t c_key_offsets[STREAM_CHUNK]
    int64_t c_value_offsets[STREAM_CHUNK]
    uint8_t c_ts_types[STREAM_CHUNK]
    uint8_t c_key_valid[STREAM_CHUNK]
    uint8_t c_value_valid[STREAM_CHUNK]


cdef ColumnStreams* _open_streams(const ColumnSink* s) noexcept nogil:
    """Streams writing ``s``'s arrays from its running totals on; NULL if out of memory."""
    cdef ColumnStreams* o = <ColumnStreams*>aligned_alloc(64, sizeof(ColumnStreams))
    if o == NULL:
        return NULL
    seg_stream_open(&o.offsets, s.offsets + s.at.n)
    seg_stream_open(&o.timestamps, s.timestamps + s.at.n)
    seg_stream_open(&o.ts_types, s.ts_types + s.at.n)
    seg_stream_open(&o.key_offsets, s.key_offsets + s.at.n + 1)
    seg_stream_open(&o.key_valid, s.key_valid + s.at.n)
    seg_stream_open(&o.key_data, s.key_data + s.at.key_bytes)
    seg_stream_open(&o.value_offsets, s.value_offsets + s.at.n + 1)
    seg_stream_open(&o.value_valid, s.value_valid + s.at.n)
    seg_stream_open(&o.value_data, s.value_data + s.at.value_bytes)
    o.n = 0
    return o


cdef inline void _stream_record(ColumnStreams* o, int64_t offset, int64_t ts, bint log_append,
                                const uint8_t* b, const RecordView* r, const ColumnCounts* at,
                                const uint8_t* end) noexcept nogil:
    """One record into the streams (``at``: the running totals after it)."""
    cdef int k = o.n
    o.c_offsets[k] = offset
    o.c_timestamps[k] = ts
    o.c_ts_types[k] = log_append
    o.c_key_valid[k] = r.key_len >= 0
    o.c_value_valid[k] = r.value_len >= 0
    o.c_key_offsets[k] = at.key_bytes
    o.c_value_offsets[k] = at.value_bytes
    if r.key_len > 0:
        seg_stream_put_near(&o.key_data, b + r.key_pos, r.key_len, end)
    if r.value_len > 0:
        seg_stream_put_near(&o.value_data, b + r.value_pos, r.value_len, end)
    o.n = k + 1
    if o.n == STREAM_CHUNK:
        _stream_chunk(o)


cdef void _stream_chunk(ColumnStreams* o) noexcept nogil:
    """The gathered fixed-width fields into their streams."""
    cdef size_t k = o.n
    seg_stream_put(&o.offsets, o.c_offsets, k * 8)
    seg_stream_put(&o.timestamps, o.c_timestamps, k * 8)
    seg_stream_put(&o.ts_types, o.c_ts_types, k)
    seg_stream_put(&o.key_offsets, o.c_key_offsets, k * 8)
    seg_stream_put(&o.key_valid, o.c_key_valid, k)
    seg_stream_put(&o.value_offsets, o.c_value_offsets, k * 8)
    seg_stream_put(&o.value_valid, o.c_value_valid, k)
    o.n = 0


cdef void _close_streams(ColumnStreams* o) noexcept nogil:
    """Write out what is gathered and staged, and free the streams."""
    _stream_chunk(o)
    seg_stream_close(&o.offsets)
    seg_stream_close(&o.timestamps)
    seg_stream_close(&o.ts_types)
    seg_stream_close(&o.key_offsets)
    seg_stream_close(&o.key_valid)
    seg_stream_close(&o.key_data)
    seg_stream_close(&o.value_offsets)
    seg_stream_close(&o.value_valid)
    seg_stream_close(&o.value_data)
    free(o)
