# Building the cleaner's offset map over segments (REF §6.5): the records' keys, batch by batch.
# Included by _core.pyx; shares its namespace (the map itself is in _offset_map.pxi).
#
# Policy (which segments, transactions, producer state, horizons) is decided in
# segstore/cleaner/; these loops get plain numbers and run without the GIL over batches that need
# no policy (no producer id, not control, uncompressed, magic 2). Anything else is handed back to
# Python one batch at a time (ST_NEED_PYTHON), which decides and calls the same per-batch kernel.
# The filter (_clean_filter.pxi) works the same way.

from libc.string cimport memcmp

cdef int64_t MISSING_VALUE = -0x7FFFFFFFFFFFFFFF - 1   # header strategy: record lacks the header


cdef struct MapBuild:
    bint validate_crc          # check each batch's CRC just before mapping it (while hot)
    int64_t start_offset
    int64_t end_offset         # records at or beyond it are not mapped
    int64_t max_desired
    const int64_t* aborted     # n × 3: producer id, first offset, last offset
    Py_ssize_t n_aborted
    bint update_only           # strategy pass over already-clean records
    StrategyKey sk
    int64_t messages_read
    int64_t bytes_read
    bint full
    # The bytes after the batch being mapped, prefetched a little per keyed record while it is
    # walked: the next batch's CRC then reads them from cache instead of waiting for memory.
    const uint8_t* ahead
    const uint8_t* ahead_end


cdef inline bint _in_aborted(const int64_t* ab, Py_ssize_t n, const BatchHeader* h) noexcept nogil:
    # Transactions of one producer never overlap, so "inside an aborted range" is Kafka's
    # ongoing-aborted-transaction test.
    cdef Py_ssize_t i
    for i in range(n):
        if ab[3 * i] == h.producer_id and ab[3 * i + 1] <= h.base_offset <= ab[3 * i + 2]:
            return True
    return False


cdef inline int _record_fields(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                               RecordView* r, Py_ssize_t* ts_end,
                               bint need_value=True) noexcept nogil:
    """Deltas, key and value length of one record, jumping over the value and headers.

    Every read is bounded by the record's end and the record by ``end``; the cleaner trusts
    the rest of a record because the batch CRC was checked and a batch whose record lengths do
    not add up to its size is rejected (ST_LEFTOVER). ``ts_end`` = where the timestamp delta
    ends (a rebuilt record re-encodes only that delta)."""
    cdef int32_t length
    cdef int st = read_varint_fast(b, pos, end, &length)
    if st != ST_OK:
        return st
    if length < 0:
        return ST_NEGATIVE_LENGTH
    if length > end - pos[0]:
        return ST_TRUNCATED
    cdef Py_ssize_t rec_end = pos[0] + length
    cdef Py_ssize_t p = pos[0] + 1
    if p > rec_end:
        return ST_RECORD_LENGTH
    st = read_varlong_fast(b, &p, rec_end, &r.timestamp_delta)
    if st != ST_OK:
        return st
    ts_end[0] = p
    st = read_varint_fast(b, &p, rec_end, &r.offset_delta)
    if st != ST_OK:
        return st
    st = read_varint_fast(b, &p, rec_end, &r.key_len)
    if st != ST_OK:
        return st
    if r.key_len < -1:
        return ST_NEGATIVE_LENGTH
    if r.key_len > rec_end - p:
        return ST_TRUNCATED
    r.key_pos = p
    pos[0] = rec_end
    if not need_value:   # map building: the key is all it needs
        return ST_OK
    if r.key_len > 0:
        p += r.key_len
    st = read_varint_fast(b, &p, rec_end, &r.value_len)
    if st != ST_OK:
        return st
    if r.value_len < -1:
        return ST_NEGATIVE_LENGTH
    if r.value_len > rec_end - p:
        return ST_TRUNCATED
    pos[0] = rec_end
    return ST_OK


cdef inline int _header_value(const uint8_t* b, Py_ssize_t p, Py_ssize_t end, int32_t count,
                              const uint8_t* hkey, Py_ssize_t hlen, int64_t* out) noexcept nogil:
    """The int64 (8 bytes, big-endian) value of the first header named ``hkey``, or
    MISSING_VALUE when there is none or it is not 8 bytes long."""
    cdef int32_t i, klen, vlen
    cdef int st
    cdef bint match
    out[0] = MISSING_VALUE
    for i in range(count):
        st = read_varint(b, &p, end, &klen)
        if st != ST_OK:
            return st
        if klen < 0 or klen > end - p:
            return ST_TRUNCATED
        match = klen == hlen and memcmp(b + p, hkey, hlen) == 0
        p += klen
        st = read_varint(b, &p, end, &vlen)
        if st != ST_OK:
            return st
        if vlen > end - p:
            return ST_TRUNCATED
        if match:
            if vlen == 8:
                out[0] = rd_i64(b + p)
            return ST_OK
        if vlen > 0:
            p += vlen
    return ST_OK


cdef inline int _strategy_value(const StrategyKey* sk, const BatchHeader* h, const uint8_t* b,
                                Py_ssize_t end, const RecordView* r, int64_t* out) noexcept nogil:
    if sk.strategy == STRATEGY_TIMESTAMP:
        out[0] = h.max_timestamp if (h.attributes & ATTR_LOG_APPEND_TIME) else \
            h.base_timestamp + r.timestamp_delta
        return ST_OK
    if sk.strategy == STRATEGY_HEADER:
        return _header_value(b, r.headers_pos, end, r.header_count, sk.header_key,
                             sk.header_key_len, out)
    out[0] = 0
    return ST_OK


cdef int _map_records(MapCore* m, MapBuild* mb, const BatchHeader* h, const uint8_t* b,
                      Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    cdef RecordView r
    cdef int32_t j = 0, g, k, n = h.records_count
    cdef int st
    cdef int64_t offset
    cdef uint64_t gh1[MAP_GROUP]
    cdef uint64_t gh2[MAP_GROUP]
    cdef int64_t gslot[MAP_GROUP]
    cdef int64_t goff[MAP_GROUP]
    cdef int64_t gval[MAP_GROUP]
    cdef bint gput[MAP_GROUP]
    cdef bint full_parse = mb.sk.strategy == STRATEGY_HEADER
    cdef bint plain = mb.sk.strategy == STRATEGY_OFFSET
    cdef Py_ssize_t ts_end
    cdef int64_t start_offset = mb.start_offset, end_offset = mb.end_offset
    cdef int64_t max_desired = mb.max_desired, base = h.base_offset, read = 0
    cdef bint update_only = mb.update_only
    while j < n:
        g = n - j if n - j < MAP_GROUP else MAP_GROUP
        if not update_only:
            # Grow before hashing the group: its slots are computed for the current table.
            st = _map_reserve(m, g)
            if st != ST_OK:
                mb.messages_read += read
                return st
        for k in range(g):
            if full_parse:
                st = parse_record(b, &pos, end, &r)
            else:
                st = _record_fields(b, &pos, end, &r, &ts_end, False)
            if st != ST_OK:
                mb.messages_read += read
                return st
            offset = base + r.offset_delta
            goff[k] = offset
            gput[k] = r.key_len >= 0 and start_offset <= offset < end_offset
            if gput[k]:
                if plain:
                    gval[k] = 0
                else:
                    st = _strategy_value(&mb.sk, h, b, end, &r, &gval[k])
                    if st != ST_OK:
                        mb.messages_read += read
                        return st
                murmur3_x64_128(b + r.key_pos, r.key_len if r.key_len > 0 else 0, 0,
                                &gh1[k], &gh2[k])
                gslot[k] = _probe_slot(m, gh1[k], gh2[k], 0)
                SEGSTORE_PREFETCH(m.mem + gslot[k] * m.words)
        for k in range(g):
            if gput[k]:
                if not update_only and m.entries >= max_desired:
                    mb.full = True
                    mb.messages_read += read
                    return ST_OK
                st = _map_put_from(m, gh1[k], gh2[k], gslot[k], goff[k], gval[k], update_only)
                if st != ST_OK:
                    mb.messages_read += read
                    return st
            read += 1
        j += g
    mb.messages_read += read
    if pos != end:
        return ST_LEFTOVER
    return ST_OK


cdef struct MapGroup:
    # Up to MAP_GROUP keyed records of one batch, hashed, their first slots prefetched.
    uint64_t h1[MAP_GROUP]
    uint64_t h2[MAP_GROUP]
    int64_t slot[MAP_GROUP]
    int64_t offset[MAP_GROUP]
    int32_t index[MAP_GROUP]   # the record's index in its batch
    int32_t n


cdef int _map_hash_group(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end, int32_t* j,
                         int32_t n, int64_t base, const MapCore* m, MapBuild* mb,
                         MapGroup* g) noexcept nogil:
    """Walk records j[0].. of a batch until MAP_GROUP of them are to be mapped (or the batch
    ends): hash their keys, compute their first slots and prefetch the cache lines of their
    first two slots (a quarter of the keys of a half-full table are found at the second)."""
    cdef Py_ssize_t p = pos[0]
    cdef int32_t jj = j[0]
    cdef int k = 0, st = ST_OK
    cdef RecordView r
    cdef Py_ssize_t ts_end
    cdef int64_t offset
    cdef int64_t table = m.table
    cdef uint64_t* mem = m.mem
    while jj < n and k < MAP_GROUP:
        if mb.ahead < mb.ahead_end:   # two cache lines of the next batch per record
            SEGSTORE_PREFETCH(mb.ahead)
            SEGSTORE_PREFETCH(mb.ahead + 64)
            mb.ahead += 128
        st = _record_fields(b, &p, end, &r, &ts_end, False)
        if st != ST_OK:
            break
        offset = base + r.offset_delta
        if r.key_len >= 0 and mb.start_offset <= offset < mb.end_offset:
            murmur3_x64_128(b + r.key_pos, r.key_len, 0, &g.h1[k], &g.h2[k])
            g.slot[k] = _probe_slot_t(table, g.h1[k], g.h2[k], 0)
            g.offset[k] = offset
            g.index[k] = jj
            SEGSTORE_PREFETCH(mem + g.slot[k] * 3)
            SEGSTORE_PREFETCH(mem + _probe_slot_t(table, g.h1[k], g.h2[k], 1) * 3)
            k += 1
        jj += 1
    g.n = k
    pos[0] = p
    j[0] = jj
    return st


cdef int _map_records_plain(MapCore* m, MapBuild* mb, const BatchHeader* h, const uint8_t* b,
                            Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    """_map_records for the offset strategy outside update_only (every build of a plain
    compacted topic), with the same puts, counters, growth and stopping point.

    Records are hashed a group ahead of their puts (``_map_hash_group``): the map is far larger
    than L2, so each put would otherwise wait for memory. Puts stay in record order. The walk
    and the puts are separate loops: in one loop their variables outnumbered the registers and
    the record position was kept on the stack, on the critical path of every varint (1.5x the
    time of the same code in two loops). The put loop counts in locals, written back before
    growing and on return; one comparison per put (``limit``) catches both a full map and a
    table to grow.
    """
    cdef MapGroup ga, gb
    cdef MapGroup* cur = &ga
    cdef MapGroup* nxt = &gb
    cdef MapGroup* tmp
    cdef int32_t n = h.records_count, j = 0
    cdef int k, i, st, st_next
    cdef int64_t offset, slot, attempt, limit, grow_at
    cdef uint64_t h1, h2
    cdef uint64_t* e
    cdef uint64_t* mem = m.mem
    cdef int64_t table = m.table, entries = m.entries, extra_probes = 0, puts = 0
    cdef int64_t base = h.base_offset
    st_next = _map_hash_group(b, &pos, end, &j, n, base, m, mb, cur)
    while cur.n:
        # Hash the next group (its slots' cache lines load meanwhile), then put this one.
        if st_next == ST_OK:
            st_next = _map_hash_group(b, &pos, end, &j, n, base, m, mb, nxt)
        else:
            nxt.n = 0
        grow_at = table // 2 if table < m.slots else INT64_MAX_C
        limit = mb.max_desired if mb.max_desired < grow_at else grow_at
        for k in range(cur.n):
            if entries >= limit:
                if entries >= mb.max_desired:
                    mb.full = True
                    mb.messages_read += cur.index[k]
                    m.entries = entries
                    m.lookups += puts
                    m.probes += puts + extra_probes
                    return ST_OK
                # Half full: grow, and recompute the pending slots for the larger table.
                m.entries = entries
                st = _map_reserve(m, 1)
                if st != ST_OK:
                    m.lookups += puts
                    m.probes += puts + extra_probes
                    mb.messages_read += cur.index[k]
                    return st
                table = m.table
                for i in range(k, cur.n):
                    cur.slot[i] = _probe_slot_t(table, cur.h1[i], cur.h2[i], 0)
                    SEGSTORE_PREFETCH(mem + cur.slot[i] * 3)
                for i in range(nxt.n):
                    nxt.slot[i] = _probe_slot_t(table, nxt.h1[i], nxt.h2[i], 0)
                    SEGSTORE_PREFETCH(mem + nxt.slot[i] * 3)
                grow_at = table // 2 if table < m.slots else INT64_MAX_C
                limit = mb.max_desired if mb.max_desired < grow_at else grow_at
            if entries >= table:   # unreachable: a whole table stops at max_desired first
                m.entries = entries
                m.lookups += puts
                m.probes += puts + extra_probes
                mb.messages_read += cur.index[k]
                return ST_MAP_FULL
            h1 = cur.h1[k]
            h2 = cur.h2[k]
            offset = cur.offset[k]
            slot = cur.slot[k]
            e = mem + slot * 3
            puts += 1
            if not (e[0] == h1 and e[1] == h2 and (h1 | h2) != 0):
                # Not the common case (an update at the first slot; a non-zero digest is
                # never empty): Kafka's probing.
                attempt = 0
                while True:
                    if e[0] == 0 and e[1] == 0 and e[2] == 0:
                        e[0] = h1
                        e[1] = h2
                        entries += 1
                        break
                    if e[0] == h1 and e[1] == h2:
                        break
                    attempt += 1
                    extra_probes += 1
                    slot = _probe_slot_t(table, h1, h2, attempt)
                    e = mem + slot * 3
            e[2] = <uint64_t>offset
            m.latest_offset = offset
        tmp = cur
        cur = nxt
        nxt = tmp
    m.entries = entries
    m.lookups += puts
    m.probes += puts + extra_probes
    if st_next != ST_OK:
        mb.messages_read += j
        return st_next
    mb.messages_read += n
    if pos != end:
        return ST_LEFTOVER
    return ST_OK


cdef bint _plain_map_kernel = True


def _use_plain_map_kernel(bint on) -> None:
    """Tests: build offset-strategy maps with ``_map_records_plain`` (the default) or with the
    general ``_map_records``, to compare the two."""
    global _plain_map_kernel
    _plain_map_kernel = on


cdef int _map_batch(MapCore* m, MapBuild* mb, const BatchHeader* h, const uint8_t* b,
                    Py_ssize_t rpos, Py_ssize_t rend) noexcept nogil:
    """One magic-2 batch whose records lie in b[rpos:rend]."""
    cdef int st
    if h.attributes & ATTR_CONTROL:
        mb.messages_read += 1
    elif (h.attributes & ATTR_TRANSACTIONAL) and _in_aborted(mb.aborted, mb.n_aborted, h):
        mb.messages_read += h.records_count
    else:
        if mb.sk.strategy == STRATEGY_OFFSET and not mb.update_only and _plain_map_kernel:
            st = _map_records_plain(m, mb, h, b, rpos, rend)
        else:
            st = _map_records(m, mb, h, b, rpos, rend)
        if st != ST_OK or mb.full:
            return st
    if h.last_offset >= mb.start_offset and not mb.update_only:
        m.latest_offset = h.last_offset
    return ST_OK


cdef int _map_run(MapCore* m, MapBuild* mb, const uint8_t* b, Py_ssize_t* pos,
                  Py_ssize_t end) noexcept nogil:
    """Map uncompressed v2 batches from pos[0]; stops at end, a full map, or a batch that
    needs Python (compressed or legacy)."""
    cdef BatchHeader h
    cdef int st
    while True:
        st = scan_one(b, pos[0], end, &h)
        if st != ST_OK:
            return st
        if h.magic < 2 or (h.attributes & ATTR_CODEC) != 0:
            return ST_NEED_PYTHON
        if mb.validate_crc and crc32c_c(b + pos[0] + 21, h.size - 21) != h.crc:
            return ST_CRC
        mb.ahead = b + pos[0] + h.size
        mb.ahead_end = mb.ahead + (h.size if h.size < end - pos[0] - h.size
                                   else end - pos[0] - h.size)
        st = _map_batch(m, mb, &h, b, pos[0] + V2_HEADER_C, pos[0] + h.size)
        if st != ST_OK:
            return st
        if mb.full:
            return ST_OK
        mb.bytes_read += h.size
        pos[0] += h.size


def build_offset_map(omap, buf, start, end, start_offset, aborted=None, *,
                     bint update_only=False, end_offset=None, bint validate_crc=False,
                     file=None):
    """Put the keys of the batches in ``buf[start:end]`` with offsets >= ``start_offset`` into
    the map (REF §6.5): control batches and aborted transactional data (``aborted``: int64
    array of rows producer id, first offset, last offset) are skipped; the map's latest offset
    follows each batch's last offset. Stops at the first key that would take the map past its
    ``max_desired_size`` (mid-batch, like Kafka).

    Returns ``(full, position, messages_read, bytes_read)``: ``position`` is where mapping
    stopped: the next batch to map (before ``end`` when the map filled or the last batch of
    the range is incomplete). ``update_only`` (strategies only) updates existing entries
    whose stored value is smaller and inserts nothing; ``end_offset`` leaves records at or
    beyond it unmapped. ``validate_crc`` checks each batch's CRC just before mapping it
    (CorruptRecordError naming the batch); a cleaner then needs no second CRC pass over what it
    mapped.
    """
    cdef OffsetMap om = _offset_map_arg(omap, "omap")
    cdef const uint8_t[::1] view = _byte_buffer(buf, "buf")
    cdef Py_ssize_t pos = _i64_arg(start, "start", InvalidArgumentError)
    cdef Py_ssize_t e = _resolve_end(view.shape[0], pos, end)
    cdef const uint8_t* b = _ptr(view)
    ab = np.ascontiguousarray(np.zeros((0, 3), dtype=np.int64) if aborted is None else aborted,
                              dtype=np.int64).reshape(-1, 3)
    cdef const int64_t[::1] abv = ab.reshape(-1)
    cdef MapBuild mb
    memset(&mb, 0, sizeof(MapBuild))
    mb.start_offset = _i64_arg(start_offset, "start_offset", InvalidOffsetError)
    mb.end_offset = _opt_i64(end_offset, INT64_MAX_C, "end_offset")
    mb.max_desired = om.max_desired_size
    mb.aborted = &abv[0] if abv.shape[0] else NULL
    mb.n_aborted = ab.shape[0]
    mb.update_only = update_only
    mb.validate_crc = validate_crc and _crc_fn != NULL
    mb.sk = om._skey()
    om._dirty = True
    om._clean_slots = 0
    cdef int st
    cdef BatchHeader h
    cdef const uint8_t[::1] pview
    while True:
        with nogil:
            st = _map_run(&om.m, &mb, b, &pos, e)
        if st == ST_END or (st == ST_OK and mb.full):
            break
        if st != ST_NEED_PYTHON:
            _raise_status(st, pos, file)
        scan_one(b, pos, e, &h)
        if h.magic < 2:
            _map_legacy(om, &mb, buf, pos, h.size, file)
        else:
            if validate_crc and not (_crc_v2_at(b, &h) == 1 or _crc_ok(memoryview(buf), &h)):
                _raise_status(ST_CRC, pos, file)
            try:
                payload = _compression.decompress(
                    h.attributes & ATTR_CODEC, memoryview(buf)[pos + V2_HEADER_C:pos + h.size])
            except CorruptRecordError as ex:
                raise CorruptRecordError(ex.reason, file=file, position=pos) from None
            pview = payload
            mb.ahead = mb.ahead_end = NULL
            st = _map_batch(&om.m, &mb, &h, _ptr(pview), 0, pview.shape[0])
            _raise_status(st, pos, file)
            if mb.full:
                break
        mb.bytes_read += h.size
        pos += h.size
    return (bool(mb.full), pos, mb.messages_read, mb.bytes_read)


cdef _map_legacy(OffsetMap omap, MapBuild* mb, buf, Py_ssize_t pos, Py_ssize_t size, file):
    # Magic 0/1 (a Kafka broker's old data): rare, so the object decoder is good enough.
    cdef int64_t latest = -1
    for rec in decode_records(buf, pos, pos + size, validate_crc=True, file=file):
        if rec.key is not None and mb.start_offset <= rec.offset < mb.end_offset:
            if not mb.update_only and omap.m.entries >= mb.max_desired:
                mb.full = True
                return
            value = rec.timestamp if mb.sk.strategy == STRATEGY_TIMESTAMP else MISSING_VALUE
            omap.put(rec.key, rec.offset, value)
        mb.messages_read += 1
        latest = rec.offset
    if latest >= mb.start_offset and not mb.update_only:
        omap.m.latest_offset = latest
