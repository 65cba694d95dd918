# cython: language_level=3
"""The compiled core of segstore: every loop that touches record bytes.

Layout of this module:
  * hashing: murmur2 (Kafka's partitioner) and MurmurHash3 x64-128 (offset-map digest);
  * scanning: batch boundaries and headers (REF §1.11), CRC checks;
  * decoding: v2 records into objects or numpy columns, legacy v0/v1 records into objects;
  * encoding: Python lists or numpy columns into v2 batches.
Parsers are `noexcept nogil` functions over explicit bounds that return a Status; `_raise_status`
is the one place a status becomes a CorruptRecordError naming file and position.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_CheckExact
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.ref cimport PyObject, Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset

import time
import zlib

import numpy as np
from crc32c import crc32c as _crc32c_pkg

from .columns import BinaryColumn, HeaderColumn, RecordColumns
from .errors import CorruptRecordError, InvalidRecordError, InvalidOffsetError
from .records import ConsumerRecord
from . import compression as _compression

cdef extern from *:
    """
    #ifndef SEGSTORE_DEBUG
    #define SEGSTORE_DEBUG 0
    #endif
    """
    int SEGSTORE_DEBUG

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        PyObject* (*tp_alloc)(PyTypeObject*, Py_ssize_t) except NULL

DEBUG_BUILD = bool(SEGSTORE_DEBUG)
V2_HEADER_SIZE = V2_HEADER_C
LOG_OVERHEAD = LOG_OVERHEAD_C

# Aligned like the C struct BatchHeader; checked against sizeof at import.
BATCH_DTYPE = np.dtype([
    ("position", np.int64), ("base_offset", np.int64), ("last_offset", np.int64),
    ("base_timestamp", np.int64), ("max_timestamp", np.int64), ("producer_id", np.int64),
    ("size", np.int32), ("partition_leader_epoch", np.int32), ("last_offset_delta", np.int32),
    ("base_sequence", np.int32), ("records_count", np.int32), ("crc", np.uint32),
    ("attributes", np.int16), ("producer_epoch", np.int16), ("magic", np.int8),
], align=True)
if BATCH_DTYPE.itemsize != sizeof(BatchHeader):
    raise ImportError("segstore._core: BATCH_DTYPE does not match the C BatchHeader layout")

from collections import namedtuple as _nt

ScanResult = _nt("ScanResult", ["batches", "valid_end", "torn", "error"])
EncodedBatches = _nt("EncodedBatches", ["data", "batches"])

cdef int64_t INT64_MAX_C = 0x7FFFFFFFFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Errors: the one place a status becomes an exception
# ---------------------------------------------------------------------------------------------

_STATUS_MESSAGES = {
    ST_SIZE_TOO_SMALL: "batch size field is smaller than the minimum of 14 bytes",
    ST_BAD_MAGIC: "unknown magic byte",
    ST_V2_TOO_SMALL: "record batch v2 is shorter than its 61-byte header",
    ST_CRC: "CRC mismatch",
    ST_TRUNCATED: "a length field runs past the end of its record or batch",
    ST_VARINT: "varint is too long",
    ST_RECORD_LENGTH: "record length does not match its contents",
    ST_NEGATIVE_LENGTH: "invalid negative length",
    ST_HEADER_COUNT: "invalid header count",
    ST_LEFTOVER: "bytes left over after the declared record count (incorrect declared batch size)",
    ST_RECORD_COUNT: "invalid record count",
    ST_OFFSET_DELTA: "record offset deltas are not increasing within [0, lastOffsetDelta]",
    ST_BAD_CODEC: "invalid compression codec",
    ST_LEGACY_SIZE: "legacy message is shorter than its header",
    ST_COUNT_OVERFLOW: "batch holds more records than fit its offsets",
}


cdef object _status_error(int status, Py_ssize_t position, object file, object detail=None):
    if status == ST_NO_MEMORY:
        return MemoryError("segstore: out of memory while parsing record batches")
    msg = _STATUS_MESSAGES.get(status, f"corrupt record batch (status {status})")
    if detail:
        msg = f"{msg}: {detail}"
    return CorruptRecordError(msg, file=file, position=position)


cdef int _raise_status(int status, Py_ssize_t position, object file, object detail=None) except -1:
    if status == ST_OK or status == ST_END:
        return 0
    raise _status_error(status, position, file, detail)


cdef inline Py_ssize_t _resolve_end(Py_ssize_t length, Py_ssize_t start, object end) except -1:
    cdef Py_ssize_t e = length if end is None else end
    if start < 0 or e < start or e > length:
        raise ValueError(f"range [{start}, {e}) is outside the buffer of {length} bytes")
    return e


cdef inline const uint8_t* _ptr(const uint8_t[::1] view) noexcept nogil:
    # An empty view has no first element; callers never dereference within an empty range.
    if view.shape[0] == 0:
        return NULL
    return &view[0]


# ---------------------------------------------------------------------------------------------
# Hashing
# ---------------------------------------------------------------------------------------------

cdef int32_t _murmur2(const uint8_t* data, Py_ssize_t length) noexcept nogil:
    # Kafka's Utils.murmur2 with its seed; arithmetic is on uint32 to mirror Java's wrapping ints.
    cdef uint32_t m = 0x5bd1e995
    cdef int r = 24
    cdef uint32_t h = (<uint32_t>0x9747b28cU) ^ <uint32_t>length
    cdef Py_ssize_t length4 = length // 4
    cdef Py_ssize_t i, i4
    cdef uint32_t k
    for i in range(length4):
        i4 = i * 4
        k = (<uint32_t>data[i4] | (<uint32_t>data[i4 + 1] << 8)
             | (<uint32_t>data[i4 + 2] << 16) | (<uint32_t>data[i4 + 3] << 24))
        k *= m
        k ^= k >> r
        k *= m
        h *= m
        h ^= k
    cdef Py_ssize_t tail = length & ~(<Py_ssize_t>3)
    cdef int rem = length % 4
    if rem == 3:
        h ^= <uint32_t>data[tail + 2] << 16
    if rem >= 2:
        h ^= <uint32_t>data[tail + 1] << 8
    if rem >= 1:
        h ^= <uint32_t>data[tail]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return <int32_t>h


cdef inline uint64_t _rotl64(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t _fmix64(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= 0xff51afd7ed558ccdULL
    k ^= k >> 33
    k *= 0xc4ceb9fe1a85ec53ULL
    k ^= k >> 33
    return k


cdef inline uint64_t _le64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef void murmur3_x64_128(const uint8_t* data, Py_ssize_t length, uint32_t seed,
                          uint64_t* out1, uint64_t* out2) noexcept nogil:
    """MurmurHash3 x64-128: the 16-byte key digest of the offset map (design §1.3)."""
    cdef uint64_t h1 = seed, h2 = seed
    cdef uint64_t c1 = 0x87c37b91114253d5ULL
    cdef uint64_t c2 = 0x4cf5ad432745937fULL
    cdef Py_ssize_t nblocks = length // 16
    cdef Py_ssize_t i
    cdef uint64_t k1, k2
    cdef const uint8_t* block
    for i in range(nblocks):
        block = data + i * 16
        k1 = _le64(block)
        k2 = _le64(block + 8)
        k1 *= c1; k1 = _rotl64(k1, 31); k1 *= c2; h1 ^= k1
        h1 = _rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729
        k2 *= c2; k2 = _rotl64(k2, 33); k2 *= c1; h2 ^= k2
        h2 = _rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5
    cdef const uint8_t* tail = data + nblocks * 16
    cdef int rem = length & 15
    k1 = 0
    k2 = 0
    if rem > 8:
        for i in range(rem - 1, 7, -1):
            k2 ^= (<uint64_t>tail[i]) << (8 * (i - 8))
        k2 *= c2; k2 = _rotl64(k2, 33); k2 *= c1; h2 ^= k2
    if rem > 0:
        for i in range((rem if rem < 8 else 8) - 1, -1, -1):
            k1 ^= (<uint64_t>tail[i]) << (8 * i)
        k1 *= c1; k1 = _rotl64(k1, 31); k1 *= c2; h1 ^= k1
    h1 ^= <uint64_t>length
    h2 ^= <uint64_t>length
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    out1[0] = h1
    out2[0] = h2


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of a buffer, computed by the crc32c package."""
    return _crc32c_pkg(data)


def murmur2(data) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int, like Java's Utils.murmur2."""
    cdef const uint8_t[::1] v = data
    return _murmur2(_ptr(v), v.shape[0])


def murmur2_partition(key, int num_partitions) -> int:
    """Kafka's default partitioner for a non-null key: toPositive(murmur2(key)) % n."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    cdef const uint8_t[::1] v = key
    return (_murmur2(_ptr(v), v.shape[0]) & 0x7FFFFFFF) % num_partitions


def murmur2_partitions(keys, int num_partitions):
    """Vectorized murmur2_partition over a BinaryColumn (int32; -1 for null keys)."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    cdef const uint8_t[::1] data = keys.data
    cdef const int64_t[::1] offs = keys.offsets
    cdef const uint8_t[::1] valid = keys.valid.view(np.uint8)
    cdef Py_ssize_t n = valid.shape[0], i
    out = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] o = out
    cdef const uint8_t* d = _ptr(data)
    if n and offs[n] > data.shape[0]:
        raise ValueError("keys.offsets point past keys.data")
    with nogil:
        for i in range(n):
            if valid[i]:
                o[i] = (_murmur2(d + offs[i], offs[i + 1] - offs[i]) & 0x7FFFFFFF) % num_partitions
            else:
                o[i] = -1
    return out


def murmur3_128(data, uint32_t seed=0) -> bytes:
    """MurmurHash3 x64-128 digest (16 bytes), equal to ``mmh3.hash_bytes(data, seed)``."""
    cdef const uint8_t[::1] v = data
    cdef uint64_t h1, h2
    cdef uint8_t out[16]
    cdef int i
    murmur3_x64_128(_ptr(v), v.shape[0], seed, &h1, &h2)
    for i in range(8):
        out[i] = <uint8_t>(h1 >> (8 * i))
        out[8 + i] = <uint8_t>(h2 >> (8 * i))
    return PyBytes_FromStringAndSize(<char*>out, 16)


# ---------------------------------------------------------------------------------------------
# Scanning batch headers
# ---------------------------------------------------------------------------------------------

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


cdef class _Scan:
    """Headers of the batches in a buffer range, after the file-scan and (optional) CRC rules."""
    cdef _Headers headers
    cdef Py_ssize_t valid_end
    cdef bint torn
    cdef int status
    cdef Py_ssize_t error_pos


cdef _Scan _scan(object obj, const uint8_t[::1] view, Py_ssize_t start, Py_ssize_t end,
                 bint validate_crc, Py_ssize_t max_batches):
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
    if s.status == ST_NO_MEMORY:
        raise MemoryError("segstore: out of memory while scanning batches")
    cdef Py_ssize_t i
    cdef object mv
    if validate_crc and s.headers.vec.n:
        mv = memoryview(obj).cast("B") if not isinstance(obj, memoryview) else obj.cast("B")
        for i in range(s.headers.vec.n):
            if not _crc_ok(mv, &s.headers.vec.items[i]):
                s.status = ST_CRC
                s.error_pos = s.headers.vec.items[i].position
                s.valid_end = s.error_pos
                s.torn = False
                s.headers.vec.n = i
                break
    return s


def scan_batches(buf, Py_ssize_t start=0, end=None, *, bint validate_crc=False,
                 bint raise_on_corrupt=True, max_batches=None, file=None):
    """Walk batch boundaries from ``start`` without decoding records (REF §1.11 file rules).

    Returns ScanResult(batches, valid_end, torn, error); see _core.pyi.
    """
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t e = _resolve_end(view.shape[0], start, end)
    cdef Py_ssize_t mb = -1 if max_batches is None else max_batches
    cdef _Scan s = _scan(buf, view, start, e, validate_crc, mb)
    error = None
    if s.status != ST_OK:
        error = _status_error(s.status, s.error_pos, file)
        if raise_on_corrupt:
            raise error
    return ScanResult(s.headers.to_numpy(), s.valid_end, s.torn, error)


def set_base_offset(buf, Py_ssize_t position, int64_t base_offset, partition_leader_epoch=None):
    """Rewrite a v2 batch's baseOffset (and leader epoch) in place; the CRC covers neither."""
    cdef uint8_t[::1] view = buf
    if position < 0 or position + V2_HEADER_C > view.shape[0]:
        raise ValueError(f"no v2 batch header at position {position}")
    if view[position + 16] != 2:
        raise ValueError(f"batch at position {position} is not magic 2")
    wr_i64(&view[position], base_offset)
    if partition_leader_epoch is not None:
        wr_i32(&view[position + 12], <int32_t>partition_leader_epoch)


# ---------------------------------------------------------------------------------------------
# Decoding v2 records
# ---------------------------------------------------------------------------------------------

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
        np.array([max(r.timestamp_type, 0) for r in records], dtype=np.int8),
        BinaryColumn.from_pylist([r.key for r in records]),
        BinaryColumn.from_pylist([r.value for r in records]),
        headers, topic, partition)


# ---------------------------------------------------------------------------------------------
# Decoding into ConsumerRecord objects (v2 and legacy v0/v1)
# ---------------------------------------------------------------------------------------------

ctypedef PyObject* (*_allocfunc)(void*, Py_ssize_t)
cdef extern from "Python.h":
    ctypedef struct _TypeObj "PyTypeObject":
        _allocfunc tp_alloc

cdef object _ConsumerRecord = ConsumerRecord
cdef Py_ssize_t _CR_FIELDS = len(ConsumerRecord._fields)


cdef extern from "Python.h":
    void Py_DECREF_obj "Py_DECREF" (object o)


cdef inline void _put(object t, Py_ssize_t i, object x):
    Py_INCREF(x)  # PyTuple_SET_ITEM steals a reference
    PyTuple_SET_ITEM(t, i, x)


cdef inline object _new_record(object topic, object partition, object leader_epoch,
                               int64_t offset, int64_t timestamp, int timestamp_type,
                               object key, object value, object headers, object checksum,
                               Py_ssize_t ksize, Py_ssize_t vsize, Py_ssize_t hsize):
    # Allocate the namedtuple directly (a tuple subclass of 13 slots), skipping its Python
    # __new__: object decode is dominated by per-record allocation.
    cdef PyObject* p = (<_TypeObj*><PyObject*>_ConsumerRecord).tp_alloc(
        <void*><PyObject*>_ConsumerRecord, _CR_FIELDS)
    if p == NULL:
        raise MemoryError()
    cdef object t = <object>p
    Py_DECREF_obj(t)  # the cast above took a second reference
    _put(t, 0, topic)
    _put(t, 1, partition)
    _put(t, 2, leader_epoch)
    _put(t, 3, offset)
    _put(t, 4, timestamp)
    _put(t, 5, timestamp_type)
    _put(t, 6, key)
    _put(t, 7, value)
    _put(t, 8, headers)
    _put(t, 9, checksum)
    _put(t, 10, ksize)
    _put(t, 11, vsize)
    _put(t, 12, hsize)
    return t




cdef inline object _bytes_or_none(const uint8_t* b, Py_ssize_t pos, int32_t length):
    if length < 0:
        return None
    return PyBytes_FromStringAndSize(<const char*>(b + pos), length)


cdef int _decode_region_records(list out, const Region* reg, const BatchHeader* h,
                                int64_t lo, int64_t hi, Py_ssize_t limit, object topic,
                                object partition, object file) except -1:
    cdef const uint8_t* b = reg.data
    cdef Py_ssize_t pos = reg.start, hp
    cdef RecordView r
    cdef int st
    cdef int32_t j, k, prev = -1, klen, vlen
    cdef int64_t offset, ts
    cdef bint log_append = (h.attributes & 0x08) != 0
    cdef int ts_type = 1 if log_append else 0
    leader_epoch = h.partition_leader_epoch if h.partition_leader_epoch >= 0 else None
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
        if offset < lo or offset >= hi or len(out) >= limit:
            continue
        ts = h.max_timestamp if log_append else h.base_timestamp + r.timestamp_delta
        hdrs = []
        hp = r.headers_pos
        for k in range(r.header_count):
            read_varint(b, &hp, reg.end, &klen)
            hkey = PyUnicode_DecodeUTF8(<const char*>(b + hp), klen, "replace")
            hp += klen
            read_varint(b, &hp, reg.end, &vlen)
            hval = _bytes_or_none(b, hp, vlen)
            if vlen > 0:
                hp += vlen
            hdrs.append((hkey, hval))
        out.append(_new_record(
            topic, partition, leader_epoch, offset, ts, ts_type,
            _bytes_or_none(b, r.key_pos, r.key_len), _bytes_or_none(b, r.value_pos, r.value_len),
            hdrs, None, r.key_len, r.value_len,
            (r.header_key_bytes + r.header_value_bytes) if r.header_count else -1))
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
            out.append(_new_record(topic, partition, None, wrapper_offset, ts, ts_type,
                                   _bytes_or_none(b, kpos, klen), _bytes_or_none(b, vpos, vlen),
                                   [], h.crc, klen, vlen, -1))
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
        return 0
    last_rel = entries[-1][0]
    for ioff_o, its_o, iattrs_o, key, value, icrc_o, kl, vl in entries:
        # v1 inner offsets are relative to the wrapper's last offset; v0 ones are absolute.
        offset = wrapper_offset - last_rel + ioff_o if magic == 1 else ioff_o
        if magic == 1 and (attrs & 0x08):
            rts, rtype = ts, 1
        elif magic == 1:
            rts, rtype = its_o, 0
        else:
            rts, rtype = -1, -1
        if lo <= offset < hi and len(out) < limit:
            out.append(_new_record(topic, partition, None, offset, rts, rtype, key, value, [],
                                   icrc_o, kl, vl, -1))
    return 0


def decode_records(buf, Py_ssize_t start=0, end=None, *, min_offset=None, end_offset=None,
                   max_records=None, bint validate_crc=True, bint include_control=False,
                   topic=None, partition=None, file=None):
    """Records with ``min_offset <= offset < end_offset`` as ConsumerRecord namedtuples."""
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t e = _resolve_end(view.shape[0], start, end)
    cdef int64_t lo = _opt_i64(min_offset, -INT64_MAX_C - 1)
    cdef int64_t hi = _opt_i64(end_offset, INT64_MAX_C)
    cdef Py_ssize_t limit = INT64_MAX_C if max_records is None else max_records
    if limit < 0:
        raise ValueError(f"max_records must be >= 0, got {max_records}")
    cdef _Scan scan = _scan(buf, view, start, e, validate_crc, -1)
    _raise_status(scan.status, scan.error_pos, file)
    cdef _Regions regs = _regions(buf, view, scan, lo, hi, include_control, file)
    cdef list out = []
    cdef Py_ssize_t i, r = 0
    cdef HeaderVec* vec = &scan.headers.vec
    mv = None
    for i in range(vec.n):
        if len(out) >= limit:
            break
        if r < regs.n and regs.items[r].batch == i:
            _decode_region_records(out, &regs.items[r], &vec.items[i], lo, hi, limit, topic,
                                   partition, file)
            r += 1
        elif vec.items[i].magic < 2 and vec.items[i].last_offset >= lo:
            if mv is None:
                mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
            _decode_legacy(out, mv, _ptr(view), &vec.items[i], lo, hi, limit, validate_crc,
                           topic, partition, file)
    return out


# ---------------------------------------------------------------------------------------------
# Encoding v2 batches
# ---------------------------------------------------------------------------------------------

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
            o = (<str>o).encode("utf-8")
        try:
            v = o
        except (TypeError, ValueError, BufferError):
            raise InvalidRecordError(
                f"{what} {i} must be bytes-like, str or None, not {type(o).__name__}") from None
        keep.append(o)
        length = v.shape[0]
        p[0] = _ptr(v)
    if length > MAX_RECORD_FIELD:
        raise InvalidRecordError(f"{what} {i} is larger than 2 GiB")
    n[0] = <int32_t>length
    return 0


cdef _finish_batch(bytearray out, Py_ssize_t pos, Py_ssize_t size):
    cdef uint8_t* p = <uint8_t*>(<char*>out) + pos
    wr_u32(p + 17, _crc32c_pkg(memoryview(out)[pos + 21:pos + size]))


cdef object _compress_batch(object out, Py_ssize_t pos, Py_ssize_t size, int codec, level):
    """The batch at out[pos:pos+size] with its records compressed: a new bytearray, CRC set."""
    compressed = _compression.compress(codec, memoryview(out)[pos + V2_HEADER_C:pos + size], level)
    cdef Py_ssize_t clen = len(compressed)
    res = bytearray(V2_HEADER_C + clen)
    res[:V2_HEADER_C] = out[pos:pos + V2_HEADER_C]
    res[V2_HEADER_C:] = compressed
    cdef uint8_t* p = <uint8_t*>(<char*>res)
    wr_i32(p + 8, <int32_t>(V2_HEADER_C + clen - LOG_OVERHEAD_C))
    wr_i16(p + 21, rd_i16(p + 21) | <int16_t>codec)
    _finish_batch(res, 0, V2_HEADER_C + clen)
    return res


def _now_ms():
    return int(time.time() * 1000)


cdef object _encode(values, keys, headers, timestamps_ms, int64_t base_offset, int codec, level,
                    log_append_time_ms, int64_t producer_id, int producer_epoch,
                    int32_t base_sequence, bint transactional, bint control,
                    int32_t leader_epoch, offset_deltas):
    cdef Py_ssize_t n = len(values), i, j, nh = 0
    if n == 0:
        raise InvalidRecordError("a record batch needs at least one record")
    if keys is not None and len(keys) != n:
        raise InvalidRecordError(f"{len(keys)} keys for {n} values")
    if headers is not None and len(headers) != n:
        raise InvalidRecordError(f"{len(headers)} header lists for {n} values")
    if offset_deltas is not None and len(offset_deltas) != n:
        raise InvalidRecordError(f"{len(offset_deltas)} offset deltas for {n} values")
    if not -32768 <= producer_epoch <= 32767:
        raise InvalidRecordError(f"producer_epoch {producer_epoch} does not fit an int16")
    # numpy arrays of per-record fields: freed by refcounting whatever happens.
    kp_a = np.zeros(n, dtype=np.uintp)
    vp_a = np.zeros(n, dtype=np.uintp)
    kl_a = np.empty(n, dtype=np.int32)
    vl_a = np.empty(n, dtype=np.int32)
    ts_a = np.empty(n, dtype=np.int64)
    od_a = np.empty(n, dtype=np.int32)
    hs_a = np.zeros(n + 1, dtype=np.int64)    # first header index of each record
    hb_a = np.zeros(n, dtype=np.int64)        # encoded header bytes of each record
    cdef size_t[::1] kp = kp_a, vp = vp_a
    cdef int32_t[::1] kl = kl_a, vl = vl_a, od = od_a
    cdef int64_t[::1] ts = ts_a, hs = hs_a, hb = hb_a
    cdef list keep = []
    cdef const uint8_t* ptr
    cdef int32_t length
    # Timestamps: one for all, one per record, or now.
    if timestamps_ms is None:
        ts_a[:] = _now_ms()
    elif isinstance(timestamps_ms, int):
        ts_a[:] = timestamps_ms
    else:
        if len(timestamps_ms) != n:
            raise InvalidRecordError(f"{len(timestamps_ms)} timestamps for {n} values")
        ts_a[:] = np.asarray(timestamps_ms, dtype=np.int64)
    if offset_deltas is None:
        od_a[:] = np.arange(n, dtype=np.int32)
    else:
        od_a[:] = np.asarray(offset_deltas, dtype=np.int64)
        for i in range(n):
            if od[i] < 0 or (i and od[i] <= od[i - 1]):
                raise InvalidOffsetError("offset_deltas must be >= 0 and strictly increasing")
    for i in range(n):
        _bytes_arg(values[i], keep, &ptr, &length, "value", i)
        vp[i] = <size_t>ptr
        vl[i] = length
        if keys is None:
            kl[i] = -1
        else:
            _bytes_arg(keys[i], keep, &ptr, &length, "key", i)
            kp[i] = <size_t>ptr
            kl[i] = length
    # Headers: flatten to (key, value) pointer arrays.
    hkeys = []
    hvals = []
    if headers is not None:
        for i in range(n):
            hlist = headers[i]
            if hlist:
                for item in hlist:
                    try:
                        hk, hv = item
                    except (TypeError, ValueError):
                        raise InvalidRecordError(
                            f"header of record {i} must be a (str, bytes|None) pair, not {item!r}"
                        ) from None
                    if isinstance(hk, str):
                        hk = (<str>hk).encode("utf-8")
                    elif not isinstance(hk, (bytes, bytearray)):
                        raise InvalidRecordError(
                            f"header key of record {i} must be str, not {type(hk).__name__}")
                    hkeys.append(hk)
                    hvals.append(hv)
            hs[i + 1] = len(hkeys)
    nh = len(hkeys)
    hkp_a = np.zeros(max(nh, 1), dtype=np.uintp)
    hvp_a = np.zeros(max(nh, 1), dtype=np.uintp)
    hkl_a = np.empty(max(nh, 1), dtype=np.int32)
    hvl_a = np.empty(max(nh, 1), dtype=np.int32)
    cdef size_t[::1] hkp = hkp_a, hvp = hvp_a
    cdef int32_t[::1] hkl = hkl_a, hvl = hvl_a
    for j in range(nh):
        _bytes_arg(hkeys[j], keep, &ptr, &length, "header key", j)
        hkp[j] = <size_t>ptr
        hkl[j] = length
        _bytes_arg(hvals[j], keep, &ptr, &length, "header value", j)
        hvp[j] = <size_t>ptr
        hvl[j] = length
    cdef BatchHeader h
    memset(&h, 0, sizeof(BatchHeader))
    h.base_offset = base_offset
    h.partition_leader_epoch = leader_epoch
    h.magic = 2
    h.attributes = (0x10 if transactional else 0) | (0x20 if control else 0)
    h.last_offset_delta = od[n - 1]
    h.base_timestamp = ts[0]
    h.max_timestamp = ts[0]
    h.producer_id = producer_id
    h.producer_epoch = <int16_t>producer_epoch
    h.base_sequence = base_sequence
    h.records_count = <int32_t>n
    cdef int64_t total = V2_HEADER_C, body
    for i in range(n):
        if ts[i] > h.max_timestamp:
            h.max_timestamp = ts[i]
        for j in range(hs[i], hs[i + 1]):
            hb[i] += (varint_size(hkl[j]) + hkl[j] + varint_size(hvl[j])
                      + (hvl[j] if hvl[j] > 0 else 0))
        body = _record_body_size(ts[i] - h.base_timestamp, od[i], kl[i], vl[i],
                                 <int32_t>(hs[i + 1] - hs[i]), hb[i])
        if body > MAX_RECORD_FIELD:
            raise InvalidRecordError(f"record {i} is larger than 2 GiB")
        total += varint_size(<int32_t>body) + body
    if total > MAX_RECORD_FIELD:
        raise InvalidRecordError("record batch is larger than 2 GiB")
    if log_append_time_ms is not None:
        h.attributes |= 0x08
        h.max_timestamp = log_append_time_ms
    h.size = <int32_t>total
    out = bytearray(total)
    cdef uint8_t* base = <uint8_t*>(<char*>out)
    cdef uint8_t* p = base + V2_HEADER_C
    _write_batch_header(base, &h)
    for i in range(n):
        body = _record_body_size(ts[i] - h.base_timestamp, od[i], kl[i], vl[i],
                                 <int32_t>(hs[i + 1] - hs[i]), hb[i])
        p = _write_record_head(p, <int32_t>body, ts[i] - h.base_timestamp, od[i],
                               <const uint8_t*>kp[i], kl[i], <const uint8_t*>vp[i], vl[i])
        p += write_varint(p, <int32_t>(hs[i + 1] - hs[i]))
        for j in range(hs[i], hs[i + 1]):
            p += write_varint(p, hkl[j])
            if hkl[j] > 0:
                memcpy(p, <const uint8_t*>hkp[j], hkl[j])
                p += hkl[j]
            p += write_varint(p, hvl[j])
            if hvl[j] > 0:
                memcpy(p, <const uint8_t*>hvp[j], hvl[j])
                p += hvl[j]
    if p - base != total:
        raise AssertionError("segstore: encoded batch size mismatch")
    if codec:
        return bytes(_compress_batch(out, 0, total, codec, level))
    _finish_batch(out, 0, total)
    return bytes(out)


def encode_batch(values, keys=None, headers=None, timestamps_ms=None, *, int64_t base_offset=0,
                 compression=0, compression_level=None, log_append_time_ms=None,
                 int64_t producer_id=-1, int producer_epoch=-1, int32_t base_sequence=-1,
                 bint is_transactional=False, int32_t partition_leader_epoch=-1,
                 offset_deltas=None):
    """One record batch v2 with a fresh CRC-32C (see _core.pyi)."""
    return _encode(values, keys, headers, timestamps_ms, base_offset,
                   _compression.codec_id(compression), compression_level, log_append_time_ms,
                   producer_id, producer_epoch, base_sequence, is_transactional, False,
                   partition_leader_epoch, offset_deltas)


def encode_control_batch(int control_type, *, int64_t producer_id, int producer_epoch,
                         int32_t coordinator_epoch=0, int64_t base_offset=0,
                         int64_t timestamp_ms, int32_t partition_leader_epoch=-1):
    """A 78-byte transaction marker batch (ControlRecordType.COMMIT or ABORT; REF §1.8)."""
    if control_type not in (0, 1):
        raise InvalidRecordError(f"control_type must be 0 (ABORT) or 1 (COMMIT), not {control_type}")
    key = bytearray(4)
    value = bytearray(6)
    cdef uint8_t* kp = <uint8_t*>(<char*>key)
    cdef uint8_t* vp = <uint8_t*>(<char*>value)
    wr_i16(kp, 0)
    wr_i16(kp + 2, <int16_t>control_type)
    wr_i16(vp, 0)
    wr_i32(vp + 2, coordinator_epoch)
    return _encode([bytes(value)], [bytes(key)], None, timestamp_ms, base_offset, 0, None, None,
                   producer_id, producer_epoch, -1, True, True, partition_leader_epoch, None)


cdef int _plan_columns(const int64_t* ko, const uint8_t* kv, const int64_t* vo,
                       const uint8_t* vv, const int64_t* ts, bint ts_scalar, Py_ssize_t n,
                       Py_ssize_t per_batch, int64_t max_bytes, int64_t* starts,
                       Py_ssize_t* nbatches, int64_t* total) noexcept nogil:
    """Split records into batches; `starts` gets each batch's first record index."""
    cdef Py_ssize_t i, count = 0
    cdef int64_t size = 0, rec, body, base_ts = 0, klen, vlen
    nbatches[0] = 0
    total[0] = 0
    for i in range(n):
        klen = (ko[i + 1] - ko[i]) if (ko != NULL and kv[i]) else -1
        vlen = (vo[i + 1] - vo[i]) if vv[i] else -1
        if klen > MAX_RECORD_FIELD or vlen > MAX_RECORD_FIELD or (vo[i + 1] < vo[i]) or (
                ko != NULL and ko[i + 1] < ko[i]):
            return ST_RECORD_LENGTH
        if count == 0:
            base_ts = ts[0] if ts_scalar else ts[i]
        body = _record_body_size((0 if ts_scalar else ts[i] - base_ts), <int32_t>count,
                                 <int32_t>klen, <int32_t>vlen, 0, 0)
        rec = varint_size(<int32_t>body) + body
        if count > 0 and (count >= per_batch or size + rec > max_bytes - V2_HEADER_C):
            total[0] += V2_HEADER_C + size
            count = 0
            size = 0
            base_ts = ts[0] if ts_scalar else ts[i]
            body = _record_body_size(0, 0, <int32_t>klen, <int32_t>vlen, 0, 0)
            rec = varint_size(<int32_t>body) + body
        if count == 0:
            starts[nbatches[0]] = i
            nbatches[0] += 1
        size += rec
        count += 1
    if count:
        total[0] += V2_HEADER_C + size
    starts[nbatches[0]] = n
    return ST_OK


cdef void _write_columns(uint8_t* out, const uint8_t* kd, const int64_t* ko, const uint8_t* kv,
                         const uint8_t* vd, const int64_t* vo, const uint8_t* vv,
                         const int64_t* ts, bint ts_scalar, const int64_t* starts,
                         Py_ssize_t nbatches, int64_t base_offset, int32_t leader_epoch,
                         int16_t attributes, int64_t log_append_time,
                         BatchHeader* hdrs) noexcept nogil:
    cdef Py_ssize_t b, i
    cdef int64_t pos = 0, t, body, klen, vlen
    cdef uint8_t* p
    cdef BatchHeader* h
    for b in range(nbatches):
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
        h.base_timestamp = ts[0] if ts_scalar else ts[starts[b]]
        h.max_timestamp = h.base_timestamp
        p = out + pos + V2_HEADER_C
        for i in range(starts[b], starts[b + 1]):
            t = ts[0] if ts_scalar else ts[i]
            if t > h.max_timestamp:
                h.max_timestamp = t
            klen = (ko[i + 1] - ko[i]) if (ko != NULL and kv[i]) else -1
            vlen = (vo[i + 1] - vo[i]) if vv[i] else -1
            body = _record_body_size(t - h.base_timestamp, <int32_t>(i - starts[b]),
                                     <int32_t>klen, <int32_t>vlen, 0, 0)
            p = _write_record_head(p, <int32_t>body, t - h.base_timestamp,
                                   <int32_t>(i - starts[b]),
                                   (kd + ko[i]) if klen > 0 else NULL, <int32_t>klen,
                                   (vd + vo[i]) if vlen > 0 else NULL, <int32_t>vlen)
            p[0] = 0  # header count
            p += 1
        if log_append_time >= 0:
            h.max_timestamp = log_append_time
        h.size = <int32_t>(p - (out + pos))
        h.crc = 0
        _write_batch_header(out + pos, h)
        pos += h.size


def encode_columns(values, keys=None, timestamps_ms=None, *, int64_t base_offset=0,
                   Py_ssize_t records_per_batch=4096, int64_t max_batch_bytes=1 << 20,
                   compression=0, compression_level=None, log_append_time_ms=None,
                   int32_t partition_leader_epoch=-1):
    """Columns into consecutive v2 batches (see _core.pyi)."""
    cdef int codec = _compression.codec_id(compression)
    cdef Py_ssize_t n = len(values)
    if records_per_batch <= 0:
        raise ValueError(f"records_per_batch must be positive, got {records_per_batch}")
    if keys is not None and len(keys) != n:
        raise InvalidRecordError(f"{len(keys)} keys for {n} values")
    cdef const uint8_t[::1] vd = values.data
    cdef const int64_t[::1] vo = values.offsets
    cdef const uint8_t[::1] vv = values.valid.view(np.uint8)
    cdef const uint8_t[::1] kd, kv
    cdef const int64_t[::1] ko
    cdef const int64_t* kop = NULL
    cdef const uint8_t* kvp = NULL
    cdef const uint8_t* kdp = NULL
    if n == 0:
        return EncodedBatches(b"", np.empty(0, dtype=BATCH_DTYPE))
    if vo[0] < 0 or vo[n] > vd.shape[0]:
        raise InvalidRecordError("values.offsets point outside values.data")
    if keys is not None:
        kd = keys.data
        ko = keys.offsets
        kv = keys.valid.view(np.uint8)
        if ko[0] < 0 or ko[n] > kd.shape[0]:
            raise InvalidRecordError("keys.offsets point outside keys.data")
        kop = &ko[0]
        kvp = &kv[0]
        kdp = _ptr(kd)
    cdef bint ts_scalar
    if timestamps_ms is None or isinstance(timestamps_ms, int):
        ts_arr = np.array([_now_ms() if timestamps_ms is None else timestamps_ms], dtype=np.int64)
        ts_scalar = True
    else:
        ts_arr = np.ascontiguousarray(timestamps_ms, dtype=np.int64)
        if len(ts_arr) != n:
            raise InvalidRecordError(f"{len(ts_arr)} timestamps for {n} values")
        ts_scalar = False
    cdef const int64_t[::1] ts = ts_arr
    starts_arr = np.empty(n + 1, dtype=np.int64)
    cdef int64_t[::1] starts = starts_arr
    cdef Py_ssize_t nbatches = 0
    cdef int64_t total = 0
    cdef int st
    with nogil:
        st = _plan_columns(kop, kvp, &vo[0], &vv[0], &ts[0], ts_scalar, n, records_per_batch,
                           max_batch_bytes, &starts[0], &nbatches, &total)
    if st != ST_OK:
        raise InvalidRecordError("column offsets are not increasing or a value exceeds 2 GiB")
    out = PyBytes_FromStringAndSize(NULL, total)  # filled below before anyone sees it
    hdr_arr = np.zeros(nbatches, dtype=BATCH_DTYPE)
    cdef uint8_t[::1] hv = hdr_arr.view(np.uint8)
    cdef uint8_t* op = <uint8_t*>PyBytes_AS_STRING(out)
    cdef int16_t attrs = 0x08 if log_append_time_ms is not None else 0
    cdef int64_t lat = -1 if log_append_time_ms is None else log_append_time_ms
    with nogil:
        _write_columns(op, kdp, kop, kvp, _ptr(vd), &vo[0], &vv[0], &ts[0], ts_scalar,
                       &starts[0], nbatches, base_offset, partition_leader_epoch, attrs, lat,
                       <BatchHeader*>&hv[0])
    cdef BatchHeader* hp = <BatchHeader*>&hv[0]
    cdef Py_ssize_t b
    if codec == 0:
        mv = memoryview(out)
        for b in range(nbatches):
            hp[b].crc = _crc32c_pkg(mv[hp[b].position + 21:hp[b].position + hp[b].size])
            wr_u32(op + hp[b].position + 17, hp[b].crc)
        del mv
        return EncodedBatches(out, hdr_arr)
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
    return EncodedBatches(b"".join(parts), hdr_arr)
