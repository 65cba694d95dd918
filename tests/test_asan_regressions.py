"""Regressions for reads and writes out of bounds that AddressSanitizer found in the compiled
core (``make test-asan``; found by tests/test_asan_fuzz.py and by reading the bounds checks).

Each is a check of a caller's position or count that let an out-of-range value through to a
kernel reading raw pointers: a negative position read before the buffer, and a sum or product
of two large ints that wrapped negative passed an ``a + b > length`` check. On the old code
these read (or wrote) outside the buffer: ASan stops the process with a heap-buffer-overflow
report, and the normal build read garbage or died with SIGSEGV. Now each raises a
``segstore.errors`` exception before a byte is touched.
"""

from __future__ import annotations

import numpy as np
import pytest

from segstore import _core
from segstore.errors import BufferTypeError, CorruptRecordError, InvalidArgumentError

# Positions and sizes whose sums with small ints or each other wrap an int64.
HUGE = [2**62, 2**63 - 1, 2**63 - 30]


def _batch(compression=0) -> bytearray:
    # A bytearray: its bytes are a malloc block of their own, which ASan guards on both sides.
    return bytearray(_core.encode_batch([b"value"], [b"key"], timestamps_ms=[1_000],
                                        base_offset=10, compression=compression))


def _filter() -> _core.BatchFilter:
    omap = _core.OffsetMap(1 << 16)
    return _core.BatchFilter(omap, 2_000, 1_000, 100)


@pytest.mark.parametrize("pos", [-1, -40, -4096, -(2**63)])
def test_room_needed_refuses_a_position_before_the_buffer(pos):
    """BatchFilter.room_needed scanned the header at any position: a negative one read the
    bytes before the buffer (ASan: heap-buffer-overflow in scan_one's rd_i32)."""
    with pytest.raises(InvalidArgumentError, match="outside the buffer"):
        _core.BatchFilter.room_needed(_batch(), pos)


@pytest.mark.parametrize("pos", [-1, -40, -4096, -(2**63)])
def test_filter_one_refuses_a_position_before_the_buffer(pos):
    """BatchFilter.filter_one: the same read before the buffer, before any output check."""
    with pytest.raises(InvalidArgumentError, match="outside the buffer"):
        _filter().filter_one(_batch(), pos, 2, False, False, bytearray(4096), 0)


def test_room_needed_and_filter_one_still_take_a_batch_and_name_damage():
    """The checks refuse only positions outside the buffer: a batch is measured and filtered
    as before, a position past its end is no batch, and a damaged header is corrupt data."""
    buf = _batch()
    assert _core.BatchFilter.room_needed(buf, 0) >= len(buf)
    out = bytearray(4096)
    op, rebuilt = _filter().filter_one(buf, 0, 2, False, False, out, 0)
    assert out[:op] == buf and not rebuilt
    for pos in (len(buf), len(buf) + 1):
        with pytest.raises(InvalidArgumentError):
            _core.BatchFilter.room_needed(buf, pos)
    buf[8:12] = (3).to_bytes(4, "big")   # size field below the 14-byte minimum
    with pytest.raises(CorruptRecordError) as e:
        _core.BatchFilter.room_needed(buf, 0)
    assert e.value.position == 0
    with pytest.raises(CorruptRecordError) as e:
        _filter().filter_one(buf, 0, 2, False, False, bytearray(4096), 0, file="x.log")
    assert (e.value.file, e.value.position) == ("x.log", 0)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("pos,size", [(2**62, 2**62), (2**63 - 1, 61), (61, 2**63 - 1),
                                      (1, 2**63 - 1)])
def test_compress_batch_at_refuses_a_range_whose_end_wraps(codec, pos, size):
    """compress_batch_at checked ``pos + size > len(out)``: with a sum past 2**63 - 1 it wrapped
    negative and passed; the Python slices of the range came out empty, the result bytearray
    lost its header, and the header fields were written and read past its end (ASan:
    heap-buffer-overflow in _compress_batch) while the CRC read beyond it."""
    with pytest.raises(InvalidArgumentError, match="no batch at"):
        _core.compress_batch_at(_batch(), pos, size, codec)


def test_compress_batch_at_still_compresses_the_batch_at_a_range():
    buf = bytearray(b"\0" * 7) + _batch()
    out = _core.compress_batch_at(buf, 7, len(buf) - 7, 1)
    recs = _core.decode_records(out)
    assert [(r.offset, r.key, r.value) for r in recs] == [(10, b"key", b"value")]
    with pytest.raises(InvalidArgumentError):
        _core.compress_batch_at(buf, 7, len(buf) - 6, 1)   # one byte past the end


@pytest.mark.parametrize("position,size", [(2**63 - 10, 100), (2**63 - 61, 61),
                                           (2**62, 2**31 - 1)])
def test_first_null_key_refuses_a_row_whose_end_wraps(position, size):
    """first_null_key checked a row's ``position + size`` against the buffer: wrapped
    negative, it passed, and the record walk read at ``buf + position`` (SIGSEGV; ASan: SEGV
    in read_varint)."""
    buf = _batch()
    rows = np.zeros(1, dtype=_core.BATCH_DTYPE)
    rows["position"] = position
    rows["size"] = min(size, 2**31 - 1)
    rows["records_count"] = 1
    with pytest.raises(CorruptRecordError, match="outside the buffer") as e:
        _core.first_null_key(buf, rows, "x.log")
    assert (e.value.file, e.value.position) == ("x.log", position)
    assert _core.first_null_key(buf, _core.scan_batches(buf).batches) is None


@pytest.mark.parametrize("time_index,entries", [(False, 2**61), (False, 2**61 + 1),
                                                (False, 2**63 - 1), (True, 2**62 + 1),
                                                (True, 6148914691236517206)])
def test_index_kernels_refuse_entry_counts_whose_size_wraps(time_index, entries):
    """index_lookup and index_check checked ``entries * entry_size > len(buf)``: the product
    wrapped (2**61 offset entries are 2**64 bytes: 0), the check passed, and the binary search
    read entries far outside the buffer (ASan: heap-buffer-overflow in _index_key; the normal
    build returned a slot past the end, or crashed)."""
    buf = bytearray(96)
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        _core.index_lookup(buf, entries, 5, time_index)
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        _core.index_check(buf, entries, time_index)
    size = 12 if time_index else 8
    assert _core.index_check(buf, len(buf) // size, time_index) >= -1
    assert _core.index_lookup(buf, len(buf) // size, 5, time_index) >= -1


@pytest.mark.parametrize("position", HUGE + [-1])
def test_set_base_offset_refuses_a_position_whose_header_end_wraps(position):
    """set_base_offset checked ``position + 61 > len(buf)``: a position near 2**63 wrapped the
    sum negative, and the magic byte was read, then the base offset written, about 2**63 bytes
    away (SIGSEGV on the normal build)."""
    buf = _batch()
    before = bytes(buf)
    with pytest.raises(InvalidArgumentError, match="no v2 batch header"):
        _core.set_base_offset(buf, position, 5)
    assert buf == before
    _core.set_base_offset(buf, 0, 5)
    assert _core.decode_records(buf)[0].offset == 5


# ------------------------------------------------------------------------------------------------
# encode_batch: pointers into the caller's objects, kept across callbacks into Python


def test_encode_batch_holds_a_bytearray_value_a_headers_iterable_resizes():
    """encode_batch took a pointer into a bytearray value, released the buffer export, then
    iterated the headers, which run the caller's code: resizing the bytearray there moved its
    bytes, and the record was copied from the freed block (ASan: heap-use-after-free in
    memcpy <- _write_record_head <- _encode_records). The export is now held until the batch
    is written, so the resize fails in the caller's code instead."""
    value = bytearray(b"v" * 4096)
    seen = []

    class Resizing:
        def __iter__(self):
            try:
                value.extend(b"w" * (1 << 20))   # would move the bytes
                del value[:]
            except BufferError as e:
                seen.append(e)
            return iter([("h", b"x")])

    out = _core.encode_batch([value], [b"k"], headers=[Resizing()], timestamps_ms=[1])
    assert len(seen) == 1 and len(value) == 4096
    rec, = _core.decode_records(out)
    assert (rec.key, rec.value, rec.headers) == (b"k", b"v" * 4096, (("h", b"x"),))


def test_encode_batch_holds_values_a_headers_iterable_drops_from_their_list():
    """The same through the values list: encode_batch read the caller's list in place and
    kept pointers into its bytes objects; a headers iterable that empties the list freed
    them (the list held their only references) before they were copied (ASan:
    heap-use-after-free). The list is now copied to a tuple first."""
    values = [bytes(4096) + bytes([i]) for i in range(3)]
    keys = [b"k%d" % i for i in range(3)]

    class Emptying:
        def __iter__(self):
            values.clear()
            keys.clear()
            return iter([])

    out = _core.encode_batch(values, keys, headers=[Emptying(), None, None],
                             timestamps_ms=[1, 2, 3])
    recs = _core.decode_records(out)
    assert [(r.key, r.value) for r in recs] == [(b"k%d" % i, bytes(4096) + bytes([i]))
                                                for i in range(3)]


# ------------------------------------------------------------------------------------------------
# encode_columns interrupted while its second thread writes


def test_an_interrupted_encode_columns_keeps_its_header_array_until_its_thread_is_done(
        monkeypatch):
    """encode_columns' second thread writes each batch's header (BatchHeader) into the array
    the call returns. The job kept the inputs and the output buffer alive for a second thread
    still running after the caller's wait was interrupted (test_buffer_pool_review.py), but
    not that header array: the call unwound, numpy freed it, and the late writer wrote its
    batches' headers into the freed block (ASan: heap-use-after-free WRITE in _write_columns
    <- _EncodeJob.write, on the second thread). Same-sized arrays made meanwhile must come
    through the late writes untouched."""
    import threading

    import numpy as np
    from segstore.columns import BinaryColumn

    n, per_batch = 20_000, 500
    nbatches = n // per_batch
    gate, futures = threading.Event(), []
    real = _core._second_core

    class Interrupted:
        def result(self):
            raise KeyboardInterrupt

    def second_core(fn, *args):
        if getattr(fn, "__name__", "") != "write":
            return real(fn, *args)

        def late(*a):
            gate.wait(20)
            return fn(*a)
        futures.append(real(late, *args))
        return Interrupted()

    old_min = _core._set_parallel_min_bytes(0)        # always two threads
    monkeypatch.setattr(_core, "_second_core", second_core)
    try:
        with pytest.raises(KeyboardInterrupt):
            _core.encode_columns(BinaryColumn.from_fixed(np.full((n, 100), 5, dtype=np.uint8)),
                                 None, np.arange(n, dtype=np.int64), records_per_batch=per_batch)
    finally:
        monkeypatch.setattr(_core, "_second_core", real)
        _core._set_parallel_min_bytes(old_min)
    # Arrays the size of the header array, made after the call unwound: one may get its block.
    probes = [np.full(nbatches * _core.BATCH_DTYPE.itemsize, 0xAB, dtype=np.uint8)
              for _ in range(32)]
    gate.set()
    assert futures[0].result(timeout=20) == 0
    assert all((p == 0xAB).all() for p in probes), "a late header write landed in a new array"


# ------------------------------------------------------------------------------------------------
# Dropping the pages of a buffer that is not a read-only file map


def _batches_bytes() -> bytes:
    # About 3 MiB of uncompressed batches: hundreds of whole pages between batch boundaries.
    from segstore.columns import BinaryColumn
    n = 12_000
    values = BinaryColumn.from_fixed(np.arange(n * 256, dtype=np.uint32).view(np.uint8)
                                     .reshape(n, 1024)[:, :250].copy())
    return bytes(_core.encode_columns(values, None, np.arange(n, dtype=np.int64),
                                      records_per_batch=100).data)


def _private_map(data: bytes):
    import mmap
    mm = mmap.mmap(-1, len(data), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm[:] = data
    return mm


def _copy_on_write_map(data: bytes, tmp_path):
    # The file holds zeros; the bytes live only in the map's private copies of its pages.
    import mmap
    path = tmp_path / "cow.bin"
    path.write_bytes(bytes(len(data)))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    mm[:] = data
    return mm


WRITABLE_BUFFERS = {
    "bytearray": lambda data, tmp_path: bytearray(data),
    "numpy": lambda data, tmp_path: np.frombuffer(bytearray(data), dtype=np.uint8),
    "private map": lambda data, tmp_path: _private_map(data),
    "copy-on-write file map": _copy_on_write_map,
}


@pytest.mark.parametrize("kind", list(WRITABLE_BUFFERS))
def test_decode_release_leaves_a_writable_buffer_as_it_was(kind, tmp_path):
    """decode_columns_multi's ``release`` (drop the input's pages once copied) ran
    madvise(MADV_DONTNEED) on whatever buffer it was given: a bytearray's or numpy array's
    heap pages and a private map's pages came back zeroed, a copy-on-write map's as the file's
    old bytes. The flag now acts only on a read-only mmap.mmap and is ignored otherwise."""
    data = _batches_bytes()
    buf = WRITABLE_BUFFERS[kind](data, tmp_path)
    want = _core.decode_columns(data)
    got = _core.decode_columns_multi([(buf, 0, len(data), None, True)])
    assert bytes(memoryview(buf)) == data, "release dropped the pages of a writable buffer"
    assert np.array_equal(got.offsets, want.offsets)
    assert bytes(memoryview(got.values.data)) == bytes(memoryview(want.values.data))


@pytest.mark.parametrize("kind", ["private map", "copy-on-write file map"])
def test_release_pages_refuses_a_writable_map(kind, tmp_path):
    """release_pages took any mmap.mmap: a private or copy-on-write one lost its bytes."""
    from segstore.errors import BufferTypeError
    data = _batches_bytes()
    mm = WRITABLE_BUFFERS[kind](data, tmp_path)
    with pytest.raises(BufferTypeError, match="buf must be a read-only mmap"):
        _core.release_pages(mm, 0, len(data))
    assert mm[:] == data


def test_decode_release_still_reads_a_read_only_file_map(tmp_path):
    """The log's case: a read-only map of a segment file, its pages dropped as they are copied;
    the decode returns the same columns and the map still reads the file's bytes."""
    import mmap
    data = _batches_bytes()
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    got = _core.decode_columns_multi([(mm, 0, len(data), None, True)])
    assert np.array_equal(got.offsets, np.arange(12_000))
    assert mm[:] == data
    _core.release_pages(mm, 0, len(data))
    assert mm[:] == data
    mm.close()


# ------------------------------------------------------------------------------------------------
# Buffer arguments of the cleaner and index entry points


def _omap():
    return _core.OffsetMap(1 << 16)


def _one_batch() -> bytes:
    return bytes(_batch())


# Every _core entry point that takes a bytes-like buffer, with the argument's name, called with
# ``bad`` in its place (the other arguments valid).
BUFFER_CALLS = {
    "first_null_key.buf": lambda bad: _core.first_null_key(
        bad, _core.scan_batches(_one_batch()).batches),
    "index_lookup.buf": lambda bad: _core.index_lookup(bad, 0, 5),
    "index_check.buf": lambda bad: _core.index_check(bad, 0),
    "OffsetMap.put.key": lambda bad: _omap().put(bad, 1),
    "OffsetMap.get.key": lambda bad: _omap().get(bad),
    "OffsetMap.header_key": lambda bad: _core.OffsetMap(1 << 16, strategy="header",
                                                        header_key=bad),
    "build_offset_map.buf": lambda bad: _core.build_offset_map(_omap(), bad, 0, 0, 0),
    "BatchFilter.run.buf": lambda bad: _filter().run(bad, 0, 0, bytearray(64), 0),
    "BatchFilter.run.out": lambda bad: _filter().run(_one_batch(), 0, 0, bad, 0),
    "BatchFilter.room_needed.buf": lambda bad: _core.BatchFilter.room_needed(bad, 0),
    "BatchFilter.filter_one.buf": lambda bad: _filter().filter_one(
        bad, 0, 2, False, False, bytearray(4096), 0),
    "BatchFilter.filter_one.out": lambda bad: _filter().filter_one(
        _one_batch(), 0, 2, False, False, bad, 0),
    "BatchFilter.filter_one.payload": lambda bad: _filter().filter_one(
        bytes(_batch(compression=1)), 0, 2, False, False, bytearray(4096), 0, bad),
    "plain_batches.buf": lambda bad: _core.plain_batches(bad),
    "release_pages.buf": lambda bad: _core.release_pages(bad, 0, 0),
    "finish_crcs.out": lambda bad: _core.finish_crcs(bad, 0, 0),
    "compress_batch_at.out": lambda bad: _core.compress_batch_at(bad, 0, 61, 1),
}
WRITTEN = {"BatchFilter.run.out", "BatchFilter.filter_one.out", "finish_crcs.out"}
BAD_BUFFERS = {"None": None, "int": 5, "str": "abc", "list": [1, 2],
               "2-d array": np.zeros((2, 2), dtype=np.uint8)}


# Values that are valid for these arguments: None is the default of a filter's payload and
# of a header key, and a header key may be a str (UTF-8).
_VALID = {("BatchFilter.filter_one.payload", "None"), ("OffsetMap.header_key", "None"),
          ("OffsetMap.header_key", "str")}


@pytest.mark.parametrize("call,bad", [(c, b) for c in BUFFER_CALLS for b in BAD_BUFFERS
                                      if (c, b) not in _VALID])
def test_a_buffer_argument_that_is_no_byte_buffer_is_a_buffer_type_error(call, bad):
    """The cleaner's kernels (offset map, map build, filter) and the index kernels took their
    buffers as Cython typed memoryviews: None passed as an empty buffer (an OffsetMap key
    hashed like b"") and anything else raised a bare TypeError, ValueError or BufferError
    without the argument's name. They now go through the check the decoders use."""
    from segstore.errors import BufferTypeError
    with pytest.raises(BufferTypeError, match=rf"^{call.rsplit('.', 1)[1]} must"):
        BUFFER_CALLS[call](BAD_BUFFERS[bad])


@pytest.mark.parametrize("call", sorted(WRITTEN))
def test_a_read_only_output_buffer_is_a_buffer_type_error(call):
    from segstore.errors import BufferTypeError
    with pytest.raises(BufferTypeError, match="out must be a writable buffer"):
        BUFFER_CALLS[call](bytes(4096))


# ------------------------------------------------------------------------------------------------
# Integer arguments past int64


def _read_only_map():
    import mmap
    return mmap.mmap(-1, 4096, prot=mmap.PROT_READ)


def _fd(tmp_path):
    import os
    return os.open(tmp_path / "f.log", os.O_CREAT | os.O_RDWR)


_NO_ROWS = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64))

# "function.argument": a call with ``v`` as that argument (the others valid). Every entry point
# whose integers Cython converted to C types (int64_t, Py_ssize_t, int) is here.
INT_CALLS = {
    "BatchFilter.now": lambda v, tmp: _core.BatchFilter(_omap(), v, 1_000, 100),
    "BatchFilter.delete_retention_ms": lambda v, tmp: _core.BatchFilter(_omap(), 2_000, v, 100),
    "BatchFilter.upper_bound": lambda v, tmp: _core.BatchFilter(_omap(), 2_000, 1_000, v),
    "recompressed.rebuilt_size": lambda v, tmp: _filter().recompressed(v, 10),
    "recompressed.compressed_size": lambda v, tmp: _filter().recompressed(10, v),
    "run.start": lambda v, tmp: _filter().run(_one_batch(), v, 0, bytearray(64), 0),
    "run.end": lambda v, tmp: _filter().run(_one_batch(), 0, v, bytearray(64), 0),
    "run.out_pos": lambda v, tmp: _filter().run(_one_batch(), 0, 0, bytearray(64), v),
    "room_needed.pos": lambda v, tmp: _core.BatchFilter.room_needed(_one_batch(), v),
    "room_needed.payload_len": lambda v, tmp: _core.BatchFilter.room_needed(_one_batch(), 0, v),
    "filter_one.pos": lambda v, tmp: _filter().filter_one(_one_batch(), v, 2, False, False,
                                                          bytearray(4096), 0),
    "filter_one.mode": lambda v, tmp: _filter().filter_one(_one_batch(), 0, v, False, False,
                                                           bytearray(4096), 0),
    "filter_one.out_pos": lambda v, tmp: _filter().filter_one(_one_batch(), 0, 2, False, False,
                                                              bytearray(4096), v),
    **{f"count_legacy.{name}": (lambda i: lambda v, tmp: _filter().count_legacy(
        *[v if j == i else 1 for j in range(6)]))(i)
       for i, name in enumerate(["messages", "size", "written_messages", "written_bytes",
                                 "max_offset", "invalid"])},
    "plain_batches.start": lambda v, tmp: _core.plain_batches(_one_batch(), v),
    "plain_batches.end": lambda v, tmp: _core.plain_batches(_one_batch(), 0, v),
    "release_pages.start": lambda v, tmp: _core.release_pages(_read_only_map(), v, 0),
    "release_pages.end": lambda v, tmp: _core.release_pages(_read_only_map(), 0, v),
    "finish_crcs.start": lambda v, tmp: _core.finish_crcs(bytearray(64), v, 0),
    "finish_crcs.end": lambda v, tmp: _core.finish_crcs(bytearray(64), 0, v),
    "compress_batch_at.pos": lambda v, tmp: _core.compress_batch_at(_one_batch(), v, 61, 1),
    "compress_batch_at.size": lambda v, tmp: _core.compress_batch_at(_one_batch(), 0, v, 1),
    "compress_batch_at.codec": lambda v, tmp: _core.compress_batch_at(_one_batch(), 0, 61, v),
    "index_lookup.entries": lambda v, tmp: _core.index_lookup(bytes(64), v, 5),
    "index_lookup.target": lambda v, tmp: _core.index_lookup(bytes(64), 1, v),
    "index_check.entries": lambda v, tmp: _core.index_check(bytes(64), v),
    **{f"sparse_index.{name}": (lambda i: lambda v, tmp: _core.sparse_index(
        _core.scan_batches(_one_batch()).batches, *[v if j == i else 0 for j in range(7)]))(i)
       for i, name in enumerate(["base_offset", "position_base", "interval",
                                 "bytes_since_last_entry", "max_timestamp", "offset_of_max_ts",
                                 "last_time_entry_ts"])},
    "build_offset_map.start": lambda v, tmp: _core.build_offset_map(_omap(), _one_batch(), v,
                                                                    None, 0),
    "build_offset_map.end": lambda v, tmp: _core.build_offset_map(_omap(), _one_batch(), 0, v,
                                                                  0),
    "build_offset_map.start_offset": lambda v, tmp: _core.build_offset_map(
        _omap(), _one_batch(), 0, None, v),
    "build_offset_map.end_offset": lambda v, tmp: _core.build_offset_map(
        _omap(), _one_batch(), 0, None, 0, end_offset=v),
    "OffsetMap.memory": lambda v, tmp: _core.OffsetMap(v),
    "update_latest_offset.offset": lambda v, tmp: _omap().update_latest_offset(v),
    "put.offset": lambda v, tmp: _omap().put(b"k", v),
    "put.value": lambda v, tmp: _omap().put(b"k", 1, v),
    "merge_lookup.start": lambda v, tmp: _omap().merge_lookup(_omap(), v),
    "merge_lookup.stop": lambda v, tmp: _omap().merge_lookup(_omap(), 0, v),
    "clear.table_hint": lambda v, tmp: _omap().clear(v),
    "write_base_offsets.fd": lambda v, tmp: _core.write_base_offsets(v, *_NO_ROWS),
    "write_base_offsets.partition_leader_epoch": lambda v, tmp: _core.write_base_offsets(
        _fd(tmp), *_NO_ROWS, v),
    "spin_set.index": lambda v, tmp: _core.spin_set(np.zeros(2, dtype=np.int64), v, 1),
    "spin_set.value": lambda v, tmp: _core.spin_set(np.zeros(2, dtype=np.int64), 0, v),
    "spin_wait.index": lambda v, tmp: _core.spin_wait(np.zeros(2, dtype=np.int64), v, 0.0),
    "buffer_pool_set_limit.nbytes": lambda v, tmp: _core.buffer_pool_set_limit(v),
}


@pytest.mark.parametrize("value", [2**63, -2**63 - 1, 2**64 + 5])
@pytest.mark.parametrize("call", list(INT_CALLS))
def test_an_int_past_int64_is_a_typed_error_naming_the_argument(call, value, tmp_path):
    """These entry points took their integers as C parameters: an int outside int64 (or int32)
    raised Cython's bare OverflowError naming no argument. Each is now converted once per call
    by the helper the decoders use: InvalidArgumentError (InvalidOffsetError for an offset)."""
    from segstore.errors import InvalidOffsetError
    name = call.rsplit(".", 1)[1]
    with pytest.raises((InvalidArgumentError, InvalidOffsetError), match=rf"^{name} must"):
        INT_CALLS[call](value, tmp_path)


@pytest.mark.parametrize("call", list(INT_CALLS))
def test_a_float_integer_argument_is_an_offset_type_error(call, tmp_path):
    """A float was truncated or refused with a bare TypeError; now OffsetTypeError names it."""
    from segstore.errors import OffsetTypeError
    with pytest.raises(OffsetTypeError, match=rf"^{call.rsplit('.', 1)[1]} must be an int"):
        INT_CALLS[call](1.5, tmp_path)


_MAP_ARGUMENTS = {
    "BatchFilter": lambda bad: _core.BatchFilter(bad, 0, 0, 10),
    "build_offset_map": lambda bad: _core.build_offset_map(bad, b"", 0, 0, 0),
    "merge_from": lambda bad: _core.OffsetMap(1 << 16).merge_from(bad),
    "merge_lookup": lambda bad: _core.OffsetMap(1 << 16).merge_lookup(bad),
    "merge_insert": lambda bad: _core.OffsetMap(1 << 16).merge_insert(bad),
}


@pytest.mark.parametrize("bad", [None, 7, b"map", {}], ids=["None", "int", "bytes", "dict"])
@pytest.mark.parametrize("where", sorted(_MAP_ARGUMENTS))
def test_an_offset_map_argument_that_is_no_offset_map_is_an_argument_type_error(where, bad):
    # A typed OffsetMap parameter let None through, and its memory was read as a map's
    # (merge_from(None) asked for petabytes; BatchFilter(None) copied garbage).
    from segstore.errors import ArgumentTypeError
    with pytest.raises(ArgumentTypeError, match=r"(omap|later) must be an OffsetMap, not "):
        _MAP_ARGUMENTS[where](bad)


_I64, _I32 = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
_ARRAY_CALLS = {
    "positions": lambda bad, tmp: _core.write_base_offsets(_fd(tmp), bad, _I32, _I64),
    "sizes": lambda bad, tmp: _core.write_base_offsets(_fd(tmp), _I64, bad, _I64),
    "base_offsets": lambda bad, tmp: _core.write_base_offsets(_fd(tmp), _I64, _I32, bad),
    "flags": lambda bad, tmp: _core.spin_set(bad, 0, 1),
}


@pytest.mark.parametrize("bad", [None, [0, 0], np.zeros(2, dtype=np.float64),
                                 np.zeros((2, 2), dtype=np.int64),
                                 np.zeros(4, dtype=np.int64)[::2]],
                         ids=["None", "list", "float64", "2-d", "strided"])
@pytest.mark.parametrize("name", sorted(_ARRAY_CALLS))
def test_an_int_array_argument_of_the_wrong_kind_is_a_buffer_type_error(name, bad, tmp_path):
    # Typed memoryviews raised bare ValueError or TypeError, and took None as an empty array
    # (write_base_offsets(fd, None, None, None) did nothing).
    with pytest.raises(BufferTypeError, match=rf"{name} must be a one-dimensional"):
        _ARRAY_CALLS[name](bad, tmp_path)


def test_spin_flags_must_be_writable_and_the_index_inside_them():
    flags = np.zeros(2, dtype=np.int64)
    with pytest.raises(InvalidArgumentError, match="flag 2 is outside the 2 flags"):
        _core.spin_set(flags, 2, 1)
    with pytest.raises(InvalidArgumentError, match="flag -1 is outside"):
        _core.spin_wait(flags, -1, 0.0)
    flags.flags.writeable = False
    with pytest.raises(BufferTypeError, match="flags must be a one-dimensional, contiguous, "
                                              "writable"):
        _core.spin_set(flags, 0, 1)


@pytest.mark.parametrize("make", [
    lambda: _core.OffsetMap(1 << 16, strategy="newest"),
    lambda: _core.OffsetMap(1 << 16, load_factor=1.5),
    lambda: _core.OffsetMap(1),
    lambda: _core.OffsetMap(1 << 16).merge_from(_core.OffsetMap(1 << 16, strategy="timestamp")),
], ids=["strategy", "load_factor", "no_slot", "merge_strategy"])
def test_offset_map_argument_values_are_invalid_argument_errors(make):
    with pytest.raises(InvalidArgumentError):
        make()
