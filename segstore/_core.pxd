# Declarations and inline byte helpers of the compiled core (see _core.pyx).
# Everything here is `noexcept nogil` and takes explicit bounds: a helper never reads a byte
# that its caller has not proven to be inside the buffer.

from libc.stdint cimport (int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t,
                          uint64_t)

cdef enum:
    LOG_OVERHEAD_C = 12          # offset int64 + size int32 before every batch
    HEADER_UP_TO_MAGIC = 17      # bytes needed to read offset, size and magic
    MIN_SIZE_FIELD = 14          # LegacyRecord.RECORD_OVERHEAD_V0: smallest legal size field
    V2_HEADER_C = 61             # RECORD_BATCH_OVERHEAD
    V1_MIN_SIZE = 22

# Status codes returned by the nogil parsers; _core.pyx maps them to messages in one place.
cdef enum Status:
    ST_OK = 0
    ST_END = 1                   # end of data or a torn trailing batch: not an error
    ST_SIZE_TOO_SMALL = 2
    ST_BAD_MAGIC = 3
    ST_V2_TOO_SMALL = 4
    ST_CRC = 5
    ST_TRUNCATED = 6             # a length runs past its record or batch
    ST_VARINT = 7                # varint longer than 5 bytes / varlong longer than 10
    ST_RECORD_LENGTH = 8         # record body length disagrees with its fields
    ST_NEGATIVE_LENGTH = 9
    ST_HEADER_COUNT = 10
    ST_LEFTOVER = 11             # bytes left after the declared record count
    ST_RECORD_COUNT = 12
    ST_OFFSET_DELTA = 13         # offset deltas not increasing or beyond lastOffsetDelta
    ST_BAD_CODEC = 14
    ST_NO_MEMORY = 15
    ST_LEGACY_SIZE = 16
    ST_COUNT_OVERFLOW = 17
    ST_INCOMPLETE = 18           # strict scans: a batch runs past data that should be whole
    ST_ORDER = 19                # encode_columns: a row number in `order` is out of range
    ST_CHANGED = 20              # input bytes changed between a counting pass and its fill
    ST_WRAPPER_OFFSET = 21       # a v1 wrapper's offset is below its last inner offset

# What a cleaner kernel (_map_build.pxi, _clean_filter.pxi) stops for that is not corruption.
cdef enum:
    ST_NEED_PYTHON = 100         # the batch at the returned position needs the Python path
    ST_OUTPUT_FULL = 101         # the output buffer cannot take the next batch
    ST_MAP_FULL = 102            # an offset map put() found no free slot

# Record batch attribute bits (REF §1.4).
cdef enum:
    ATTR_CODEC = 0x07
    ATTR_LOG_APPEND_TIME = 0x08
    ATTR_TRANSACTIONAL = 0x10
    ATTR_CONTROL = 0x20
    ATTR_DELETE_HORIZON = 0x40

# One scanned batch header (numpy twin: BATCH_DTYPE, same field order, aligned).
cdef struct BatchHeader:
    int64_t position
    int64_t base_offset
    int64_t last_offset
    int64_t base_timestamp
    int64_t max_timestamp
    int64_t producer_id
    int32_t size
    int32_t partition_leader_epoch
    int32_t last_offset_delta
    int32_t base_sequence
    int32_t records_count
    uint32_t crc
    int16_t attributes
    int16_t producer_epoch
    int8_t magic

cdef struct HeaderVec:
    BatchHeader* items
    Py_ssize_t n
    Py_ssize_t cap

# Where one v2 record's fields lie (positions are into the records region's buffer).
cdef struct RecordView:
    int64_t timestamp_delta
    int32_t offset_delta
    Py_ssize_t key_pos
    int32_t key_len
    Py_ssize_t value_pos
    int32_t value_len
    Py_ssize_t headers_pos
    int32_t header_count
    int64_t header_key_bytes
    int64_t header_value_bytes


cdef inline int16_t rd_i16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<uint16_t>p[0] << 8) | <uint16_t>p[1])

cdef inline int32_t rd_i32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16)
                     | (<uint32_t>p[2] << 8) | <uint32_t>p[3])

cdef inline uint32_t rd_u32(const uint8_t* p) noexcept nogil:
    return ((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16)
            | (<uint32_t>p[2] << 8) | <uint32_t>p[3])

cdef inline int64_t rd_i64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t>rd_u32(p) << 32) | <uint64_t>rd_u32(p + 4))

cdef inline void wr_i16(uint8_t* p, int16_t v) noexcept nogil:
    p[0] = <uint8_t>(<uint16_t>v >> 8)
    p[1] = <uint8_t>v

cdef inline void wr_u32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v

cdef inline void wr_i32(uint8_t* p, int32_t v) noexcept nogil:
    wr_u32(p, <uint32_t>v)

cdef inline void wr_i64(uint8_t* p, int64_t v) noexcept nogil:
    wr_u32(p, <uint32_t>(<uint64_t>v >> 32))
    wr_u32(p + 4, <uint32_t>(<uint64_t>v))


# Zigzag varints (REF §1.1). Reading stops at `end`; like Kafka's ByteUtils, more than 5 (varint)
# or 10 (varlong) bytes is malformed.
cdef inline int read_varint(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                            int32_t* out) noexcept nogil:
    cdef uint32_t value = 0
    cdef int shift = 0
    cdef uint32_t byte
    while True:
        if pos[0] >= end:
            return ST_TRUNCATED
        byte = b[pos[0]]
        pos[0] += 1
        if (byte & 0x80) == 0:
            break
        value |= (byte & 0x7F) << shift
        shift += 7
        if shift > 28:
            return ST_VARINT
    value |= byte << shift
    out[0] = <int32_t>((value >> 1) ^ (0 - (value & 1)))
    return ST_OK

cdef inline int read_varlong(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                             int64_t* out) noexcept nogil:
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint64_t byte
    while True:
        if pos[0] >= end:
            return ST_TRUNCATED
        byte = b[pos[0]]
        pos[0] += 1
        if (byte & 0x80) == 0:
            break
        value |= (byte & 0x7F) << shift
        shift += 7
        if shift > 63:
            return ST_VARINT
    value |= byte << shift
    out[0] = <int64_t>((value >> 1) ^ (0 - (value & 1)))
    return ST_OK

# The general readers, out of line (defined in _core.pyx) so the fast paths below stay small
# enough for the compiler to inline at each of a record's six varints.
cdef int read_varint_slow(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                          int32_t* out) noexcept nogil
cdef int read_varlong_slow(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                           int64_t* out) noexcept nogil

# One- and two-byte fast paths: most lengths, deltas and counts in a record are below 8192.
# The general reader gets copies of the position and the result: no address of the caller's
# variables escapes into a call, so a record walk can keep its position in a register around
# every varint. (With setup.py's inlining budget GCC also inlines the general readers into the
# record loops; the copies then cost nothing.) `out` is written only on success.
cdef inline int read_varint_fast(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                                 int32_t* out) noexcept nogil:
    cdef Py_ssize_t q = pos[0]
    cdef uint32_t byte
    cdef uint32_t v
    cdef int32_t value
    cdef int st
    if q < end:
        byte = b[q]
        if byte < 0x80:
            pos[0] = q + 1
            out[0] = <int32_t>((byte >> 1) ^ (0 - (byte & 1)))
            return ST_OK
        if q + 1 < end and b[q + 1] < 0x80:
            v = (byte & 0x7F) | (<uint32_t>b[q + 1] << 7)
            pos[0] = q + 2
            out[0] = <int32_t>((v >> 1) ^ (0 - (v & 1)))
            return ST_OK
    st = read_varint_slow(b, &q, end, &value)
    pos[0] = q
    if st == ST_OK:
        out[0] = value
    return st

cdef inline int read_varlong_fast(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                                  int64_t* out) noexcept nogil:
    cdef Py_ssize_t q = pos[0]
    cdef uint64_t byte
    cdef uint64_t v
    cdef int64_t value
    cdef int st
    if q < end:
        byte = b[q]
        if byte < 0x80:
            pos[0] = q + 1
            out[0] = <int64_t>((byte >> 1) ^ (0 - (byte & 1)))
            return ST_OK
        if q + 1 < end and b[q + 1] < 0x80:
            v = (byte & 0x7F) | (<uint64_t>b[q + 1] << 7)
            pos[0] = q + 2
            out[0] = <int64_t>((v >> 1) ^ (0 - (v & 1)))
            return ST_OK
    st = read_varlong_slow(b, &q, end, &value)
    pos[0] = q
    if st == ST_OK:
        out[0] = value
    return st

cdef inline int varint_size(int32_t v) noexcept nogil:
    cdef uint32_t z = (<uint32_t>v << 1) ^ <uint32_t>(v >> 31)
    cdef int n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n

cdef inline int varlong_size(int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef int n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n

cdef inline Py_ssize_t write_varint(uint8_t* p, int32_t v) noexcept nogil:
    cdef uint32_t z = (<uint32_t>v << 1) ^ <uint32_t>(v >> 31)
    cdef Py_ssize_t i = 0
    while z >= 0x80:
        p[i] = <uint8_t>(z | 0x80)
        z >>= 7
        i += 1
    p[i] = <uint8_t>z
    return i + 1

cdef inline Py_ssize_t write_varlong(uint8_t* p, int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef Py_ssize_t i = 0
    while z >= 0x80:
        p[i] = <uint8_t>(z | 0x80)
        z >>= 7
        i += 1
    p[i] = <uint8_t>z
    return i + 1
