# cython: language_level=3
"""The compiled core of segstore: every loop that touches record bytes.

Layout of this module:
  * hashing: murmur2 (Kafka's partitioner) and MurmurHash3 x64-128 (offset-map digest);
  * scanning: batch boundaries and headers (REF §1.11), CRC checks;
  * decoding: v2 records into objects or numpy columns, legacy v0/v1 records into objects;
  * encoding: Python lists or numpy columns into v2 batches.
  * the log cleaner: the offset map, building it over batches, filtering batches (REF §6).
Parsers are `noexcept nogil` functions over explicit bounds that return a Status; `_raise_status`
is the one place a status becomes a CorruptRecordError naming file and position.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_CheckExact
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.ref cimport PyObject
from cpython.long cimport PyLong_CheckExact, PyLong_AsLongLongAndOverflow
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcmp, memcpy, memmove, memset
from cpython.buffer cimport PyBUF_FORMAT
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE

import mmap as _mmap
import os as _os
import time
import zlib

import numpy as np
from crc32c import crc32c as _crc32c_pkg

from .columns import BinaryColumn, HeaderColumn, RecordColumns
from .errors import (ArgumentTypeError, BufferTypeError, CorruptRecordError, InvalidArgumentError,
                     InvalidOffsetError, InvalidRecordError, OffsetTypeError)
from .records import ConsumerRecord
from . import compression as _compression

cdef extern from *:
    """
    #ifndef SEGSTORE_DEBUG
    #define SEGSTORE_DEBUG 0
    #endif
    #ifndef SEGSTORE_ASAN
    #define SEGSTORE_ASAN 0
    #endif
    """
    int SEGSTORE_DEBUG
    int SEGSTORE_ASAN

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        PyObject* (*tp_alloc)(PyTypeObject*, Py_ssize_t) except NULL

DEBUG_BUILD = bool(SEGSTORE_DEBUG)
ASAN_BUILD = bool(SEGSTORE_ASAN)     # setup.py's SEGSTORE_ASAN=1: compiled with AddressSanitizer
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
# One batch header as plain ints (find_batch), fields named and ordered as BATCH_DTYPE's.
HeaderRow = _nt("HeaderRow", BATCH_DTYPE.names)

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
    ST_INCOMPLETE: "batch runs past the end of data that holds only whole batches",
    ST_ORDER: "a row number in order is out of range",
    ST_CHANGED: "batch changed during decode (its bytes differ from when they were first "
                "read: was the buffer written to while being read?)",
    ST_WRAPPER_OFFSET: "a v1 compressed wrapper's offset is below its last inner message's "
                       "relative offset",
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


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------

cdef int64_t INT64_MIN_C = -0x7FFFFFFFFFFFFFFF - 1


cdef int64_t _int_arg(object v, str name, object exc, int64_t lo, int64_t hi, str what,
                      object type_exc) except? -1:
    """An integer argument (a numpy one too, never a bool) from ``lo`` to ``hi``:
    ``type_exc`` for anything but an int, ``exc`` for one out of range (``what`` describes
    the range). Cython's own conversion of a C integer parameter truncated floats
    (``base_offset=1.5`` wrote offset 1), took True for 1 and raised bare TypeError or
    OverflowError."""
    cdef int overflow = 0
    cdef long long x
    if not PyLong_CheckExact(v) and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
        raise type_exc(f"{name} must be an int, got {v!r} ({type(v).__name__})")
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or x < lo or x > hi:
        if what is None:
            what = f"an int from {lo} to {hi}"
        raise exc(f"{name} must be {what}, got {v!r}")
    return x


cdef object _byte_buffer(object obj, str name, bint writable=False):
    """``obj`` (or a byte-format view of it) when it is a one-dimensional, contiguous buffer
    of one-byte items, else BufferTypeError naming ``name``. Cython's typed memoryviews took
    None as an empty buffer and raised bare TypeError, ValueError or BufferError."""
    if PyBytes_CheckExact(obj) and not writable:
        return obj
    try:
        mv = memoryview(obj)
    except TypeError:
        raise BufferTypeError(f"{name} must be a bytes-like buffer, not "
                              f"{type(obj).__name__}") from None
    if writable and mv.readonly:
        raise BufferTypeError(f"{name} must be a writable buffer (a bytearray, a writable "
                              f"mmap), not a read-only {type(obj).__name__}")
    if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
        raise BufferTypeError(f"{name} must be a one-dimensional, contiguous buffer of bytes, "
                              f"got a {type(obj).__name__} of format {mv.format!r}, shape "
                              f"{mv.shape} and strides {mv.strides}")
    return obj if mv.format == "B" else mv.cast("B")


cdef object _int_array(object obj, str name, object dtype, bint writable=False):
    """``obj`` when it is a one-dimensional, contiguous numpy array of ``dtype`` (writable if
    asked), else BufferTypeError naming ``name``. Cython's typed memoryviews raised bare
    ValueError or TypeError, and took None as an empty array."""
    if (not isinstance(obj, np.ndarray) or obj.dtype != dtype or obj.ndim != 1
            or not obj.flags.c_contiguous or (writable and not obj.flags.writeable)):
        what = (f"a {obj.dtype} array of shape {obj.shape}" if isinstance(obj, np.ndarray)
                else type(obj).__name__)
        raise BufferTypeError(f"{name} must be a one-dimensional, contiguous"
                              f"{', writable' if writable else ''} numpy array of "
                              f"{np.dtype(dtype).name}, not {what}")
    return obj


cdef inline int64_t _i64_arg(object v, str name, object exc) except? -1:
    """An int of 64 signed bits (the caller checks its range), OffsetTypeError otherwise.
    Entry points take their integers as objects and convert them here, once per call: a C
    integer parameter raised a bare OverflowError (or TypeError) that named no argument."""
    return _int_arg(v, name, exc, INT64_MIN_C, INT64_MAX_C, None, OffsetTypeError)


cdef inline int32_t _i32_arg(object v, str name, object exc) except? -1:
    """_i64_arg for an argument the core keeps in 32 bits (a descriptor, a leader epoch)."""
    return <int32_t>_int_arg(v, name, exc, -0x80000000, 0x7FFFFFFF, None, OffsetTypeError)


cdef inline Py_ssize_t _resolve_end(Py_ssize_t length, Py_ssize_t start, object end) except -1:
    cdef Py_ssize_t e = length if end is None else _i64_arg(end, "end", InvalidArgumentError)
    if start < 0 or e < start or e > length:
        raise InvalidArgumentError(f"byte range [{start}, {e}) is outside the buffer of {length} "
                                   f"bytes")
    return e


cdef inline const uint8_t* _ptr(const uint8_t[::1] view) noexcept nogil:
    # An empty view has no first element; callers never dereference within an empty range.
    if view.shape[0] == 0:
        return NULL
    return &view[0]


cdef int read_varint_slow(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                          int32_t* out) noexcept nogil:
    return read_varint(b, pos, end, out)


cdef int read_varlong_slow(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                           int64_t* out) noexcept nogil:
    return read_varlong(b, pos, end, out)


include "_hash.pxi"
include "_scan.pxi"
include "_buffer_pool.pxi"
include "_decode.pxi"
include "_records.pxi"
include "_encode.pxi"
include "_index.pxi"
include "_offset_map.pxi"
include "_map_merge.pxi"
include "_map_build.pxi"
include "_clean_filter.pxi"
include "_keys.pxi"
include "_spin_wait.pxi"

_bind_crc32c()
