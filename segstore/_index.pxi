# Offset and time index kernels: Kafka's warm-section binary search (REF §2.8), the sparse
# indexing rule (REF §2.6) over scanned batches, and the sanity check of index entries.
# Included by _core.pyx; shares its namespace.

cdef enum:
    OFFSET_ENTRY = 8     # int32 relative offset, int32 position
    TIME_ENTRY = 12      # int64 timestamp, int32 relative offset


cdef inline int64_t _index_key(const uint8_t* b, Py_ssize_t slot, bint time_index) noexcept nogil:
    if time_index:
        return rd_i64(b + slot * TIME_ENTRY)
    return rd_i32(b + slot * OFFSET_ENTRY)


cdef Py_ssize_t _index_search(const uint8_t* b, Py_ssize_t lo, Py_ssize_t hi, int64_t target,
                              bint time_index) noexcept nogil:
    cdef Py_ssize_t mid
    cdef int64_t k
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        k = _index_key(b, mid, time_index)
        if k > target:
            hi = mid - 1
        elif k < target:
            lo = mid
        else:
            return mid
    return lo


cdef Py_ssize_t largest_lower_bound(const uint8_t* b, Py_ssize_t entries, int64_t target,
                                    bint time_index) noexcept nogil:
    """Slot of the largest entry whose key is <= target, or -1.

    Kafka searches the last 8 KiB of entries first: lookups mostly target recent data, and
    keeping them in a small hot section keeps those pages in memory.
    """
    if entries == 0:
        return -1
    cdef Py_ssize_t warm = 8192 // (TIME_ENTRY if time_index else OFFSET_ENTRY)
    cdef Py_ssize_t first_hot = entries - 1 - warm
    if first_hot < 0:
        first_hot = 0
    if _index_key(b, first_hot, time_index) < target:
        return _index_search(b, first_hot, entries - 1, target, time_index)
    if _index_key(b, 0, time_index) > target:
        return -1
    return _index_search(b, 0, first_hot, target, time_index)


def index_lookup(buf, entries, target, bint time_index=False):
    """Slot of the floor entry for ``target`` (a relative offset, or a timestamp), or -1."""
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t n = _i64_arg(entries, "entries", InvalidArgumentError)
    cdef int64_t key = _i64_arg(target, "target", InvalidArgumentError)
    cdef Py_ssize_t size = TIME_ENTRY if time_index else OFFSET_ENTRY
    if n < 0 or n > view.shape[0] // size:   # n * size could wrap
        raise InvalidArgumentError(f"{n} entries do not fit an index buffer of "
                                   f"{view.shape[0]} bytes")
    cdef const uint8_t* b = _ptr(view)
    cdef Py_ssize_t slot
    with nogil:
        slot = largest_lower_bound(b, n, key, time_index)
    return slot


def index_check(buf, entries, bint time_index=False):
    """First slot that breaks the index's ordering, or -1 when the entries are sane.

    Offset entries need strictly increasing relative offsets; time entries strictly increasing
    timestamps and non-decreasing offsets; relative offsets and positions are never negative.
    This catches the zero-padded, untrimmed files Kafka's own check misses (KAFKA-10207).
    """
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t n = _i64_arg(entries, "entries", InvalidArgumentError)
    cdef Py_ssize_t size = TIME_ENTRY if time_index else OFFSET_ENTRY
    if n < 0 or n > view.shape[0] // size:   # n * size could wrap
        raise InvalidArgumentError(f"{n} entries do not fit an index buffer of "
                                   f"{view.shape[0]} bytes")
    cdef const uint8_t* b = _ptr(view)
    cdef Py_ssize_t i, bad = -1
    cdef int32_t rel, prev_rel = -1
    cdef int64_t ts, prev_ts = 0
    with nogil:
        for i in range(n):
            if time_index:
                ts = rd_i64(b + i * TIME_ENTRY)
                rel = rd_i32(b + i * TIME_ENTRY + 8)
                if rel < 0 or rel < prev_rel or (i > 0 and ts <= prev_ts):
                    bad = i
                    break
                prev_ts = ts
            else:
                rel = rd_i32(b + i * OFFSET_ENTRY)
                if rel <= prev_rel or rd_i32(b + i * OFFSET_ENTRY + 4) < 0:
                    bad = i
                    break
            prev_rel = rel
    return bad


def sparse_index(batches, base_offset, position_base, interval, bytes_since_last_entry,
                 max_timestamp, offset_of_max_ts, last_time_entry_ts):
    """Index entries for appended or recovered batches by Kafka's sparse rule (REF §2.6).

    ``batches`` is a BATCH_DTYPE array in file order; a batch's file position is
    ``position_base + batches["position"]``. Before each batch, the running maximum timestamp
    is updated; if more than ``interval`` bytes went by since the last entry, an offset entry
    ``(batch last offset, batch position)`` and, when its timestamp is larger than the last time
    entry's, a time entry ``(max timestamp so far, its batch's last offset)`` are emitted.
    Returns ``(offset_entries, time_entries, bytes_since_last_entry, max_timestamp,
    offset_of_max_ts)`` with entries as ``>i4,>i4`` and ``>i8,>i4`` structured arrays ready to be
    copied into the files.
    """
    return _sparse_index(
        batches, _i64_arg(base_offset, "base_offset", InvalidOffsetError),
        _i64_arg(position_base, "position_base", InvalidArgumentError),
        _i64_arg(interval, "interval", InvalidArgumentError),
        _i64_arg(bytes_since_last_entry, "bytes_since_last_entry", InvalidArgumentError),
        _i64_arg(max_timestamp, "max_timestamp", InvalidArgumentError),
        _i64_arg(offset_of_max_ts, "offset_of_max_ts", InvalidOffsetError),
        _i64_arg(last_time_entry_ts, "last_time_entry_ts", InvalidArgumentError))


cdef _sparse_index(batches, int64_t base_offset, int64_t position_base, int64_t interval,
                   int64_t bytes_since_last_entry, int64_t max_timestamp,
                   int64_t offset_of_max_ts, int64_t last_time_entry_ts):
    cdef Py_ssize_t n = len(batches), i
    cdef const int64_t[::1] pos = np.ascontiguousarray(batches["position"])
    cdef const int32_t[::1] size = np.ascontiguousarray(batches["size"])
    cdef const int64_t[::1] last = np.ascontiguousarray(batches["last_offset"])
    cdef const int64_t[::1] maxts = np.ascontiguousarray(batches["max_timestamp"])
    off_rel = np.empty(n, dtype=np.int64)
    off_pos = np.empty(n, dtype=np.int64)
    t_ts = np.empty(n, dtype=np.int64)
    t_rel = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] o_rel = off_rel, o_pos = off_pos, tt = t_ts, t_r = t_rel
    cdef Py_ssize_t no = 0, nt = 0
    with nogil:
        for i in range(n):
            if maxts[i] > max_timestamp:
                max_timestamp = maxts[i]
                offset_of_max_ts = last[i]
            if bytes_since_last_entry > interval:
                o_rel[no] = last[i] - base_offset
                o_pos[no] = position_base + pos[i]
                no += 1
                if max_timestamp > last_time_entry_ts:
                    tt[nt] = max_timestamp
                    t_r[nt] = offset_of_max_ts - base_offset
                    last_time_entry_ts = max_timestamp
                    nt += 1
                bytes_since_last_entry = 0
            bytes_since_last_entry += size[i]
    offs = np.empty(no, dtype=[("rel", ">i4"), ("pos", ">i4")])
    offs["rel"] = off_rel[:no]
    offs["pos"] = off_pos[:no]
    times = np.empty(nt, dtype=[("ts", ">i8"), ("rel", ">i4")])
    times["ts"] = t_ts[:nt]
    times["rel"] = t_rel[:nt]
    return offs, times, bytes_since_last_entry, max_timestamp, offset_of_max_ts
