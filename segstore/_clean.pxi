# The log cleaner's byte loops: the offset map (REF §6.12), building it over segments (REF §6.5)
# and filtering batches into a cleaned segment (REF §6.8).
# Included by _core.pyx; shares its namespace.
#
# Policy (which segments, transactions, producer state, horizons) is decided in
# segstore/cleaner/; these loops get plain numbers and run without the GIL over batches that need
# no policy (no producer id, not control, uncompressed, magic 2). Anything else is handed back to
# Python one batch at a time (ST_NEED_PYTHON), which decides and calls the same per-batch kernel.

from libc.string cimport memcmp

cdef enum:
    DIGEST_BYTES = 16
    ST_NEED_PYTHON = 100       # the batch at the returned position needs the Python path
    ST_OUTPUT_FULL = 101       # the output buffer cannot take the next batch
    ST_MAP_FULL = 102          # put() on a map with no free slot
    MAP_GROUP = 16             # records hashed ahead so their slots' cache lines load in parallel

    STRATEGY_OFFSET = 0
    STRATEGY_TIMESTAMP = 1
    STRATEGY_HEADER = 2

    RETAIN_EMPTY = 0           # keep the batch header even if no record survives
    DELETE = 1                 # drop the whole batch without looking at records
    DELETE_EMPTY = 2           # drop the batch only if no record survives

    ATTR_CODEC = 0x07
    ATTR_LOG_APPEND_TIME = 0x08
    ATTR_TRANSACTIONAL = 0x10
    ATTR_CONTROL = 0x20
    ATTR_DELETE_HORIZON = 0x40

cdef int64_t MISSING_VALUE = -0x7FFFFFFFFFFFFFFF - 1   # header strategy: record lacks the header


# The probed table starts this small and doubles whenever it is half full, up to `slots`: a map
# holding few keys in a large buffer stays cache-resident (and touches little memory), while
# the fill limit and utilization still count the configured slots. Maps of at most this many
# slots probe exactly as Kafka's SkimpyOffsetMap does.
cdef int64_t INITIAL_TABLE = 1 << 16   # 1.5 MiB at 24 bytes a slot
# Growing copies the old table aside: from a table this large the next step goes straight to
# `slots`, so the copy (and a round's memory beyond its buffer) stays under 32 MiB.
cdef size_t GROW_SCRATCH_MAX = 32 << 20

cdef struct MapCore:
    uint64_t* mem          # slots × (bpe / 8) words: digest h1, h2, offset[, value]
    int64_t slots          # the configured capacity: fill limit, utilization
    int64_t table          # slots probed (a prefix of mem): slots, or fewer after clear(max_keys)
    int64_t words          # words per entry: 3, or 4 when a strategy value is kept
    int64_t entries
    int64_t lookups
    int64_t probes
    int64_t latest_offset
    int strategy


cdef extern from *:
    """
    #define SEGSTORE_BSWAP32(x) __builtin_bswap32(x)
    #define SEGSTORE_PREFETCH(p) __builtin_prefetch(p)
    /* Kafka's Utils.abs of the int32 with bits w (abs(Integer.MIN_VALUE) is 0), without a
       branch: the sign of a digest window is a coin toss, and as if/else it cost a branch
       misprediction per slot computed (a third of the map-build kernel's time). */
    static inline uint32_t segstore_kafka_abs(uint32_t w) {
        uint32_t s = (uint32_t)((int32_t)w >> 31);
        return ((w ^ s) - s) & 0x7FFFFFFFu;
    }
    """
    uint32_t SEGSTORE_BSWAP32(uint32_t x) noexcept nogil
    void SEGSTORE_PREFETCH(const void* p) noexcept nogil
    uint32_t segstore_kafka_abs(uint32_t w) noexcept nogil


cdef inline int64_t _probe_slot(const MapCore* m, uint64_t h1, uint64_t h2,
                                int64_t attempt) noexcept nogil:
    return _probe_slot_t(m.table, h1, h2, attempt)


cdef inline int64_t _probe_slot_t(int64_t table, uint64_t h1, uint64_t h2,
                                  int64_t attempt) noexcept nogil:
    # Kafka's probe sequence over the 16 digest bytes (h1 then h2, little-endian as
    # mmh3.hash_bytes gives them): a big-endian int32 window at byte min(attempt, 12), plus
    # attempt - 12 beyond that (linear probing); abs(Integer.MIN_VALUE) taken as 0.
    cdef int64_t i = attempt if attempt < 12 else 12
    cdef uint64_t lo
    if i == 0:
        lo = h1
    elif i < 8:
        lo = (h1 >> (8 * i)) | (h2 << (64 - 8 * i))
    else:
        lo = h2 >> (8 * (i - 8))
    cdef uint32_t w = SEGSTORE_BSWAP32(<uint32_t>lo)
    if attempt > 12:
        w = w + <uint32_t>(attempt - 12)
    # slots < 2^32 (the map is at most 2 GiB): a 32-bit modulo is much cheaper, and a grown
    # table (65,536 slots doubled) is a power of two, where the modulo is a mask.
    if (table & (table - 1)) == 0:
        return segstore_kafka_abs(w) & <uint32_t>(table - 1)
    return segstore_kafka_abs(w) % <uint32_t>table


cdef int _map_grow(MapCore* m) noexcept nogil:
    """Double the probed table (at most to `slots`) and re-place every entry in it."""
    cdef int64_t old = m.table, i, attempt, slot
    cdef int64_t new = old * 2 if old * 2 < m.slots else m.slots
    cdef size_t old_bytes = <size_t>old * <size_t>m.words * 8
    if old_bytes * 2 > GROW_SCRATCH_MAX:
        new = m.slots
    cdef uint64_t* e
    cdef uint64_t* d
    if new <= old:
        return ST_OK
    cdef uint64_t* tmp = <uint64_t*>malloc(old_bytes)
    if tmp == NULL:
        return ST_NO_MEMORY
    memcpy(tmp, m.mem, old_bytes)
    memset(m.mem, 0, old_bytes)   # slots [old, new) were never used since the last clear: zero
    m.table = new
    # Re-place the entries in slot order, a group at a time: the new slots of a group are
    # computed and prefetched first (one at a time, every placement waited for memory).
    cdef int64_t gi[MAP_GROUP]
    cdef int64_t gs[MAP_GROUP]
    cdef int g, k
    i = 0
    while i < old:
        g = 0
        while i < old and g < MAP_GROUP:
            e = tmp + i * m.words
            if not (e[0] == 0 and e[1] == 0 and e[2] == 0):
                gi[g] = i
                gs[g] = _probe_slot(m, e[0], e[1], 0)
                SEGSTORE_PREFETCH(m.mem + gs[g] * m.words)
                g += 1
            i += 1
        for k in range(g):
            e = tmp + gi[k] * m.words
            attempt = 0
            slot = gs[k]
            while True:
                d = m.mem + slot * m.words
                if d[0] == 0 and d[1] == 0 and d[2] == 0:
                    memcpy(d, e, m.words * 8)
                    break
                attempt += 1
                slot = _probe_slot(m, e[0], e[1], attempt)
    free(tmp)
    return ST_OK


cdef inline int _map_reserve(MapCore* m, int64_t more) noexcept nogil:
    """Grow the table until `more` further inserts keep it at most half full (or it is whole)."""
    cdef int st
    while m.table < m.slots and m.entries + more > m.table // 2:
        st = _map_grow(m)
        if st != ST_OK:
            return st
    return ST_OK


cdef inline int _map_put(MapCore* m, uint64_t h1, uint64_t h2, int64_t offset, int64_t value,
                         bint update_only) noexcept nogil:
    cdef int st
    if not update_only:
        st = _map_reserve(m, 1)
        if st != ST_OK:
            return st
    return _map_put_from(m, h1, h2, _probe_slot(m, h1, h2, 0), offset, value, update_only)


cdef inline int _map_put_from(MapCore* m, uint64_t h1, uint64_t h2, int64_t slot0, int64_t offset,
                              int64_t value, bint update_only) noexcept nogil:
    """Kafka's put: overwrite the entry with an equal digest or fill the first empty slot.

    With a strategy (KIP-280) an equal digest is overwritten only when ``value`` is at least the
    stored one (ties go to the later offset). ``update_only`` never inserts and overwrites only
    on a strictly greater value: it lets already-clean records beat dirty ones.
    """
    cdef int64_t attempt = 0, slot
    cdef uint64_t* e
    if not update_only and m.entries >= m.table:
        return ST_MAP_FULL
    m.lookups += 1
    slot = slot0   # attempt 0's slot, computed by the caller (who prefetched it)
    while True:
        m.probes += 1
        e = m.mem + slot * m.words
        if e[0] == 0 and e[1] == 0 and e[2] == 0:
            if update_only:
                return ST_OK
            e[0] = h1
            e[1] = h2
            e[2] = <uint64_t>offset
            if m.words == 4:
                e[3] = <uint64_t>value
            m.entries += 1
            m.latest_offset = offset
            return ST_OK
        if e[0] == h1 and e[1] == h2:
            if update_only:
                if m.strategy != STRATEGY_OFFSET and value > <int64_t>e[3]:
                    e[2] = <uint64_t>offset
                    e[3] = <uint64_t>value
                return ST_OK
            if m.strategy == STRATEGY_OFFSET or value >= <int64_t>e[3]:
                e[2] = <uint64_t>offset
                if m.words == 4:
                    e[3] = <uint64_t>value
            m.latest_offset = offset
            return ST_OK
        attempt += 1
        if update_only and attempt >= m.table + 12:
            return ST_OK
        slot = _probe_slot(m, h1, h2, attempt)


cdef inline int64_t _map_get(MapCore* m, uint64_t h1, uint64_t h2) noexcept nogil:
    return _map_get_from(m, h1, h2, _probe_slot(m, h1, h2, 0))


cdef inline int64_t _map_get_from(MapCore* m, uint64_t h1, uint64_t h2,
                                  int64_t slot0) noexcept nogil:
    # Bounded probing: a completely full map answers -1 for an absent key (REF §7 #12).
    cdef int64_t attempt = 0, slot = slot0
    cdef int64_t limit = m.table + DIGEST_BYTES - 4
    cdef uint64_t* e
    m.lookups += 1
    while attempt < limit:
        m.probes += 1
        e = m.mem + slot * m.words
        if e[0] == 0 and e[1] == 0 and e[2] == 0:
            return -1
        if e[0] == h1 and e[1] == h2:
            return <int64_t>e[2]
        attempt += 1
        slot = _probe_slot(m, h1, h2, attempt)
    return -1


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


cdef struct StrategyKey:
    int strategy
    const uint8_t* header_key
    Py_ssize_t header_key_len


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


@cython.final
cdef class OffsetMap:
    """Kafka's SkimpyOffsetMap (REF §6.12): key digest → latest offset in one flat buffer.

    ``memory`` bytes hold ``memory // 24`` slots of a 16-byte MurmurHash3 x64-128 digest and an
    int64 offset (32 bytes with a KIP-280 ``strategy`` other than ``"offset"``, which also keeps
    the compared value). ``load_factor`` is ``log.cleaner.io.buffer.load.factor``: cleaning
    stops filling the map at ``max_desired_size`` entries.
    """
    cdef MapCore m
    cdef object _array
    cdef readonly int64_t memory
    cdef readonly double load_factor
    cdef readonly str strategy
    cdef bytes _header_key
    cdef bint _dirty

    def __cinit__(self, int64_t memory, double load_factor=0.9, str strategy="offset",
                  header_key=None):
        if strategy not in ("offset", "timestamp", "header"):
            raise ValueError(f"unknown compaction strategy {strategy!r}")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor {load_factor} is outside (0, 1]")
        self.m.strategy = {"offset": STRATEGY_OFFSET, "timestamp": STRATEGY_TIMESTAMP,
                           "header": STRATEGY_HEADER}[strategy]
        self.m.words = 3 if self.m.strategy == STRATEGY_OFFSET else 4
        self.m.slots = memory // (self.m.words * 8)
        self.m.table = min(self.m.slots, INITIAL_TABLE)
        if self.m.slots < 1:
            raise ValueError(f"an offset map of {memory} bytes has no slot "
                             f"({self.m.words * 8} bytes each)")
        if strategy == "header":
            if not header_key:
                raise ValueError("the header strategy needs a header key")
            self._header_key = header_key.encode() if isinstance(header_key, str) else bytes(header_key)
        else:
            self._header_key = b""
        self.memory = memory
        self.load_factor = load_factor
        self.strategy = strategy
        # A private anonymous mapping: zeroed pages come from the OS as slots fill, and
        # clear() can give them back. Huge pages where the kernel allows them: the map is
        # probed at random, and 4 KiB pages make every probe a TLB miss (measured: a 1M-record
        # map build over 128 MiB takes 3x longer with 4 KiB pages).
        self._array = _mmap.mmap(-1, self.m.slots * self.m.words * 8,
                                 flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
        if hasattr(_mmap, "MADV_HUGEPAGE"):
            try:
                self._array.madvise(_mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        cdef uint64_t[::1] words = memoryview(self._array).cast("Q")
        self.m.mem = &words[0]
        self.m.entries = self.m.lookups = self.m.probes = 0
        self.m.latest_offset = -1
        self._dirty = False

    @property
    def slots(self) -> int:
        """Number of entries the buffer holds."""
        return self.m.slots

    @property
    def bytes_per_entry(self) -> int:
        """24 (digest + offset), or 32 with a strategy value."""
        return self.m.words * 8

    @property
    def size(self) -> int:
        """Entries in use."""
        return self.m.entries

    def __len__(self):
        return self.m.entries

    @property
    def max_desired_size(self) -> int:
        """Entries at which map building stops: ``int(slots * load_factor)``."""
        return <int64_t>(self.m.slots * self.load_factor)

    @property
    def latest_offset(self) -> int:
        """Offset of the last put (or as set by update_latest_offset); -1 when cleared."""
        return self.m.latest_offset

    def update_latest_offset(self, int64_t offset) -> None:
        """Set the latest offset directly (Kafka's updateLatestOffset)."""
        self.m.latest_offset = offset

    @property
    def utilization(self) -> float:
        """entries / slots."""
        return self.m.entries / <double>self.m.slots

    @property
    def lookups(self) -> int:
        return self.m.lookups

    @property
    def probes(self) -> int:
        return self.m.probes

    @property
    def collision_rate(self) -> float:
        """(probes - lookups) / lookups: extra slots looked at per lookup."""
        return (self.m.probes - self.m.lookups) / <double>self.m.lookups if self.m.lookups else 0.0

    cdef inline void _digest(self, key, uint64_t* h1, uint64_t* h2):
        cdef const uint8_t[::1] v = key
        murmur3_x64_128(_ptr(v), v.shape[0], 0, h1, h2)

    def put(self, key, int64_t offset, int64_t value=0) -> None:
        """Map ``key`` to ``offset`` (a strategy map keeps the entry with the larger value)."""
        cdef uint64_t h1, h2
        self._digest(key, &h1, &h2)
        self._dirty = True
        cdef int st = _map_put(&self.m, h1, h2, offset, value, False)
        if st == ST_MAP_FULL:
            raise OverflowError(f"the offset map is full ({self.m.slots} slots)")
        if st == ST_NO_MEMORY:
            raise MemoryError("growing the offset map's probed table")

    def get(self, key) -> int:
        """The offset mapped for ``key``, or -1."""
        cdef uint64_t h1, h2
        self._digest(key, &h1, &h2)
        return _map_get(&self.m, h1, h2)

    def clear(self, int64_t table_hint=0) -> None:
        """Zero the buffer and the counters; latest offset -1.

        The probed table starts again at 65,536 slots, or, with ``table_hint``, at the first
        size of its growth sequence that reaches ``table_hint`` slots (a cleaner passes the
        size a partition's last round grew to, so a round like the last one skips the growth
        steps and their re-placing of every entry)."""
        cdef int64_t new
        if self._dirty:
            # Dropping the pages zeroes them (private anonymous memory) at the cost of only
            # the pages the map touched, and gives the memory back between rounds.
            self._array.madvise(_mmap.MADV_DONTNEED)
        self._dirty = False
        self.m.entries = self.m.lookups = self.m.probes = 0
        self.m.latest_offset = -1
        self.m.table = min(self.m.slots, INITIAL_TABLE)
        while self.m.table < table_hint and self.m.table < self.m.slots:
            # _map_grow's steps, on an empty table: double, or jump to the whole buffer.
            new = self.m.table * 2 if self.m.table * 2 < self.m.slots else self.m.slots
            if <size_t>self.m.table * <size_t>self.m.words * 16 > GROW_SCRATCH_MAX:
                new = self.m.slots
            self.m.table = new

    @property
    def table_slots(self) -> int:
        """Slots probed now: the table doubles as it half fills, up to ``slots``."""
        return self.m.table

    cdef StrategyKey _skey(self):
        cdef StrategyKey sk
        sk.strategy = self.m.strategy
        sk.header_key = <const uint8_t*>PyBytes_AS_STRING(self._header_key)
        sk.header_key_len = len(self._header_key)
        return sk

    def __repr__(self):
        return (f"OffsetMap(slots={self.m.slots}, size={self.m.entries}, "
                f"latest_offset={self.m.latest_offset}, strategy={self.strategy!r})")


# ---------------------------------------------------------------------------------------------
# Building the map (REF §6.5)
# ---------------------------------------------------------------------------------------------

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


cdef inline int _varint(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                        int32_t* out) noexcept nogil:
    """read_varint_fast whose out-of-line slow path gets copies of the position and result: no
    address of the caller's variables escapes into a call, so after inlining the compiler can
    keep a record walk's position in a register instead of storing and reloading it around
    every varint (the map build's kernel, same-process best of 20: 25.3 -> 23.0 ms)."""
    cdef Py_ssize_t q = pos[0]
    cdef uint32_t byte, v
    cdef int32_t value
    cdef int st
    if q + 1 < end:
        byte = b[q]
        if byte < 0x80:
            pos[0] = q + 1
            out[0] = <int32_t>((byte >> 1) ^ (0 - (byte & 1)))
            return ST_OK
        if b[q + 1] < 0x80:
            v = (byte & 0x7F) | (<uint32_t>b[q + 1] << 7)
            pos[0] = q + 2
            out[0] = <int32_t>((v >> 1) ^ (0 - (v & 1)))
            return ST_OK
    st = read_varint_slow(b, &q, end, &value)
    pos[0] = q
    out[0] = value
    return st


cdef inline int _varlong(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                         int64_t* out) noexcept nogil:
    """read_varlong_fast in the manner of ``_varint``."""
    cdef Py_ssize_t q = pos[0]
    cdef uint64_t byte, v
    cdef int64_t value
    cdef int st
    if q + 1 < end:
        byte = b[q]
        if byte < 0x80:
            pos[0] = q + 1
            out[0] = <int64_t>((byte >> 1) ^ (0 - (byte & 1)))
            return ST_OK
        if b[q + 1] < 0x80:
            v = (byte & 0x7F) | (<uint64_t>b[q + 1] << 7)
            pos[0] = q + 2
            out[0] = <int64_t>((v >> 1) ^ (0 - (v & 1)))
            return ST_OK
    st = read_varlong_slow(b, &q, end, &value)
    pos[0] = q
    out[0] = value
    return st


cdef inline int _record_fields(const uint8_t* b, Py_ssize_t* pos, Py_ssize_t end,
                               RecordView* r, Py_ssize_t* ts_end,
                               bint need_value=True) noexcept nogil:
    """Deltas, key and value length of one record, jumping over the value and headers.

    Every read is bounded by the record's end and the record by ``end``; the cleaner trusts
    the rest of a record because the batch CRC was checked and a batch whose record lengths do
    not add up to its size is rejected (ST_LEFTOVER). ``ts_end`` = where the timestamp delta
    ends (a rebuilt record re-encodes only that delta)."""
    cdef int32_t length
    cdef int st = _varint(b, pos, end, &length)
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
    st = _varlong(b, &p, rec_end, &r.timestamp_delta)
    if st != ST_OK:
        return st
    ts_end[0] = p
    st = _varint(b, &p, rec_end, &r.offset_delta)
    if st != ST_OK:
        return st
    st = _varint(b, &p, rec_end, &r.key_len)
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
    st = _varint(b, &p, rec_end, &r.value_len)
    if st != ST_OK:
        return st
    if r.value_len < -1:
        return ST_NEGATIVE_LENGTH
    if r.value_len > rec_end - p:
        return ST_TRUNCATED
    pos[0] = rec_end
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


def build_offset_map(OffsetMap omap, buf, Py_ssize_t start, Py_ssize_t end, int64_t start_offset,
                     aborted=None, *, bint update_only=False, end_offset=None,
                     bint validate_crc=False, file=None):
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
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t e = _resolve_end(view.shape[0], start, end)
    cdef const uint8_t* b = _ptr(view)
    ab = np.ascontiguousarray(np.zeros((0, 3), dtype=np.int64) if aborted is None else aborted,
                              dtype=np.int64).reshape(-1, 3)
    cdef const int64_t[::1] abv = ab.reshape(-1)
    cdef MapBuild mb
    memset(&mb, 0, sizeof(MapBuild))
    mb.start_offset = start_offset
    mb.end_offset = INT64_MAX_C if end_offset is None else end_offset
    mb.max_desired = omap.max_desired_size
    mb.aborted = &abv[0] if abv.shape[0] else NULL
    mb.n_aborted = ab.shape[0]
    mb.update_only = update_only
    mb.validate_crc = validate_crc and _crc_fn != NULL
    mb.sk = omap._skey()
    omap._dirty = True
    cdef Py_ssize_t pos = start
    cdef int st
    cdef BatchHeader h
    cdef const uint8_t[::1] pview
    while True:
        with nogil:
            st = _map_run(&omap.m, &mb, b, &pos, e)
        if st == ST_END or (st == ST_OK and mb.full):
            break
        if st != ST_NEED_PYTHON:
            _raise_status(st, pos, file)
        scan_one(b, pos, e, &h)
        if h.magic < 2:
            _map_legacy(omap, &mb, buf, pos, h.size, file)
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
            st = _map_batch(&omap.m, &mb, &h, _ptr(pview), 0, pview.shape[0])
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


# ---------------------------------------------------------------------------------------------
# Filtering batches into a cleaned segment (REF §6.8)
# ---------------------------------------------------------------------------------------------

cdef struct FilterCore:
    int64_t now
    int64_t new_horizon        # now + delete.retention.ms
    int64_t upper_bound        # upperBoundOffsetOfCleaningRound
    int strategy
    uint8_t* keep              # per-record decisions of the current batch
    Py_ssize_t* starts         # record start positions (n + 1: the last is the records' end)
    Py_ssize_t* ts_ends        # where each record's timestamp delta ends
    int64_t* tss               # each record's timestamp
    Py_ssize_t keep_cap
    int64_t messages_read
    int64_t bytes_read
    int64_t messages_written
    int64_t bytes_written
    int64_t invalid
    int64_t max_offset
    int64_t rebuilt            # batches written with new contents (CRC to compute)
    const uint8_t* ahead       # the next batch's bytes, prefetched while this one is walked
    const uint8_t* ahead_end


cdef inline int64_t _room_needed(const BatchHeader* h, int64_t records_bytes) noexcept nogil:
    # Verbatim: the batch. Rebuilt: a header plus the (decompressed) records, each of which
    # grows by at most 10 bytes (longer length and timestamp varints).
    cdef int64_t rebuilt = (V2_HEADER_C + records_bytes
                            + 10 * <int64_t>(h.records_count if h.records_count > 0 else 0))
    return rebuilt if rebuilt > h.size else h.size


cdef int _grow_scratch(FilterCore* fc, Py_ssize_t n) noexcept nogil:
    cdef uint8_t* keep = <uint8_t*>realloc(fc.keep, n)
    if keep == NULL:
        return ST_NO_MEMORY
    fc.keep = keep
    cdef Py_ssize_t* starts = <Py_ssize_t*>realloc(fc.starts, n * sizeof(Py_ssize_t))
    if starts == NULL:
        return ST_NO_MEMORY
    fc.starts = starts
    cdef Py_ssize_t* ts_ends = <Py_ssize_t*>realloc(fc.ts_ends, n * sizeof(Py_ssize_t))
    if ts_ends == NULL:
        return ST_NO_MEMORY
    fc.ts_ends = ts_ends
    cdef int64_t* tss = <int64_t*>realloc(fc.tss, n * sizeof(int64_t))
    if tss == NULL:
        return ST_NO_MEMORY
    fc.tss = tss
    fc.keep_cap = n
    return ST_OK


cdef struct FilterGroup:
    # Up to MAP_GROUP consecutive records of one batch, parsed; keys to look up hashed.
    uint64_t h1[MAP_GROUP]
    uint64_t h2[MAP_GROUP]
    int64_t slot[MAP_GROUP]
    int64_t offset[MAP_GROUP]
    int32_t value_len[MAP_GROUP]
    int32_t key_len[MAP_GROUP]


cdef int _filter_parse_group(FilterCore* fc, const MapCore* m, const BatchHeader* h,
                             const uint8_t* rb, Py_ssize_t* pos, Py_ssize_t rend, int32_t j0,
                             int32_t g, bint look, FilterGroup* fg) noexcept nogil:
    """Parse records j0 .. j0+g-1 of a batch from pos[0] (their starts, timestamp ends and
    timestamps into ``fc``); hash the keys to look up, prefetching their first two slots."""
    cdef Py_ssize_t p = pos[0]
    cdef RecordView r
    cdef int st
    cdef int32_t k, j
    cdef int64_t offset, latest = m.latest_offset
    for k in range(g):
        j = j0 + k
        if fc.ahead < fc.ahead_end:   # two cache lines of the next batch per record
            SEGSTORE_PREFETCH(fc.ahead)
            SEGSTORE_PREFETCH(fc.ahead + 64)
            fc.ahead += 128
        fc.starts[j] = p
        st = _record_fields(rb, &p, rend, &r, &fc.ts_ends[j])
        if st != ST_OK:
            pos[0] = p
            return st
        offset = h.base_offset + r.offset_delta
        fg.offset[k] = offset
        fc.tss[j] = h.base_timestamp + r.timestamp_delta
        fg.value_len[k] = r.value_len
        fg.key_len[k] = r.key_len
        if look and offset <= latest and r.key_len >= 0:
            murmur3_x64_128(rb + r.key_pos, r.key_len, 0, &fg.h1[k], &fg.h2[k])
            fg.slot[k] = _probe_slot(m, fg.h1[k], fg.h2[k], 0)
            SEGSTORE_PREFETCH(m.mem + fg.slot[k] * m.words)
            # The entry's last byte: a 24-byte entry crosses a cache line in a quarter of the
            # slots, and a lookup reads its offset at the end.
            SEGSTORE_PREFETCH(<const char*>(m.mem + fg.slot[k] * m.words) + 8 * m.words - 1)
            # A quarter of the keys of a half-full table sit at their second slot.
            SEGSTORE_PREFETCH(m.mem + _probe_slot(m, fg.h1[k], fg.h2[k], 1) * m.words)
    pos[0] = p
    return ST_OK


cdef int _filter_batch(MapCore* m, FilterCore* fc, const BatchHeader* h, const uint8_t* src,
                       const uint8_t* rb, Py_ssize_t rpos, Py_ssize_t rend, int mode,
                       bint discard_records, bint marker_for_empty_txn, uint8_t* out,
                       Py_ssize_t* out_pos, Py_ssize_t out_cap, bint* rebuilt) noexcept nogil:
    """Decide and write one magic-2 batch (``src`` = its bytes; records in rb[rpos:rend]).

    Writes the batch verbatim, rebuilt (uncompressed, CRC left 0 for the caller), as an empty
    header, or not at all; ST_OUTPUT_FULL (nothing written) when out[out_pos:out_cap] is
    smaller than ``_room_needed``.
    """
    cdef int32_t n = h.records_count, j, retained = 0
    cdef RecordView r
    cdef int st
    cdef Py_ssize_t p, rec_start, ts_end, attr_pos
    cdef int32_t length
    cdef int64_t offset, got, ts, max_ts = -0x7FFFFFFFFFFFFFFF - 1, first_ts = 0, horizon
    cdef int64_t tsd
    cdef uint64_t h1, h2
    cdef bint tomb = False, keep, ok, has_horizon, retain_deletes, need_horizon, control
    cdef uint8_t* o
    cdef uint8_t* q
    cdef BatchHeader nh
    cdef uint8_t* grown
    cdef int32_t g, gn, k, jn
    cdef bint look
    cdef FilterGroup ga, gb
    cdef FilterGroup* cur = &ga
    cdef FilterGroup* nxt = &gb
    cdef FilterGroup* tmp
    rebuilt[0] = False
    if mode != DELETE and out_cap - out_pos[0] < _room_needed(h, rend - rpos):
        return ST_OUTPUT_FULL
    fc.messages_read += n
    fc.bytes_read += h.size
    if mode == DELETE:
        return ST_OK
    if n + 1 > fc.keep_cap:
        if _grow_scratch(fc, n + 1) != ST_OK:
            return ST_NO_MEMORY
    has_horizon = (h.attributes & ATTR_DELETE_HORIZON) != 0
    retain_deletes = not has_horizon or fc.now < h.base_timestamp
    control = (h.attributes & ATTR_CONTROL) != 0
    p = rpos
    look = not discard_records and not control
    # Records are parsed and hashed a group ahead of their decisions, the cache lines of their
    # keys' first two slots prefetched then, so the map's misses overlap the next group's walk.
    j = 0
    g = n if n < MAP_GROUP else MAP_GROUP
    st = _filter_parse_group(fc, m, h, rb, &p, rend, j, g, look, cur)
    if st != ST_OK:
        return st
    while j < n:
        jn = j + g
        gn = n - jn if n - jn < MAP_GROUP else MAP_GROUP
        if gn > 0:
            st = _filter_parse_group(fc, m, h, rb, &p, rend, jn, gn, look, nxt)
            if st != ST_OK:
                return st
        for k in range(g):
            offset = cur.offset[k]
            if discard_records:
                keep = False
            elif control:
                keep = True
            elif offset > m.latest_offset:
                keep = True            # beyond the mapped range: a later round decides
            elif cur.key_len[k] < 0:
                keep = False
                fc.invalid += 1
            else:
                got = _map_get_from(m, cur.h1[k], cur.h2[k], cur.slot[k])
                if fc.strategy == STRATEGY_OFFSET:
                    ok = offset >= got
                else:
                    ok = got == -1 or offset == got
                keep = ok and (cur.value_len[k] >= 0 or retain_deletes)
            fc.keep[j + k] = keep
            if keep:
                ts = fc.tss[j + k]
                if retained == 0:
                    first_ts = ts
                if ts > max_ts:
                    max_ts = ts
                if cur.value_len[k] < 0:
                    tomb = True
                retained += 1
        j = jn
        g = gn
        tmp = cur
        cur = nxt
        nxt = tmp
    fc.starts[n] = p
    if p != rend:
        return ST_LEFTOVER
    o = out + out_pos[0]
    need_horizon = (tomb or marker_for_empty_txn) and not has_horizon
    if retained == n and n > 0 and not need_horizon:
        memcpy(o, src, h.size)
        out_pos[0] += h.size
        fc.messages_written += n
        fc.bytes_written += h.size
        if h.last_offset > fc.max_offset:
            fc.max_offset = h.last_offset
        return ST_OK
    if retained == 0 and mode != RETAIN_EMPTY:
        return ST_OK
    nh = h[0]
    nh.records_count = retained
    if retained == 0:
        # An empty header keeps the offsets (and the producer's last sequence) of the batch.
        nh.attributes = h.attributes & (ATTR_LOG_APPEND_TIME | ATTR_TRANSACTIONAL | ATTR_CONTROL)
        nh.base_timestamp = -1
        nh.size = V2_HEADER_C
        _write_batch_header(o, &nh)
        out_pos[0] += V2_HEADER_C
    else:
        if need_horizon:
            horizon = fc.new_horizon
        elif has_horizon:
            horizon = h.base_timestamp
        else:
            horizon = -1
        nh.attributes = h.attributes & ~(ATTR_CODEC | ATTR_DELETE_HORIZON)
        if horizon >= 0:
            nh.attributes = nh.attributes | ATTR_DELETE_HORIZON
            nh.base_timestamp = horizon
        else:
            nh.base_timestamp = first_ts
        if not (h.attributes & ATTR_LOG_APPEND_TIME):
            nh.max_timestamp = max_ts
        q = o + V2_HEADER_C
        for j in range(n):
            if not fc.keep[j]:
                continue
            # Re-encode only the timestamp delta: everything after it is copied as is.
            rec_start = fc.starts[j]
            p = fc.starts[j + 1]
            attr_pos = rec_start
            read_varint(rb, &attr_pos, rend, &length)
            ts_end = fc.ts_ends[j]
            tsd = fc.tss[j] - nh.base_timestamp
            length = <int32_t>(1 + varlong_size(tsd) + (p - ts_end))
            q += write_varint(q, length)
            q[0] = rb[attr_pos]
            q += 1
            q += write_varlong(q, tsd)
            memcpy(q, rb + ts_end, p - ts_end)
            q += p - ts_end
        nh.size = <int32_t>(q - o)
        _write_batch_header(o, &nh)
        out_pos[0] += nh.size
    rebuilt[0] = True
    fc.rebuilt += 1
    fc.messages_written += retained
    fc.bytes_written += nh.size
    if h.last_offset > fc.max_offset:
        fc.max_offset = h.last_offset
    return ST_OK


cdef int _filter_run(MapCore* m, FilterCore* fc, const uint8_t* b, Py_ssize_t* pos,
                     Py_ssize_t end, uint8_t* out, Py_ssize_t* out_pos,
                     Py_ssize_t out_cap) noexcept nogil:
    """Filter plain batches (magic 2, uncompressed, no producer id, not control) from pos[0];
    stops at end, at a batch for the Python path, or when the output cannot take the next."""
    cdef BatchHeader h
    cdef int st
    cdef bint rebuilt
    cdef int mode
    while True:
        st = scan_one(b, pos[0], end, &h)
        if st != ST_OK:
            return st
        if (h.magic < 2 or (h.attributes & (ATTR_CODEC | ATTR_CONTROL)) != 0
                or h.producer_id >= 0):
            return ST_NEED_PYTHON
        if out_cap - out_pos[0] < _room_needed(&h, h.size - V2_HEADER_C):
            return ST_OUTPUT_FULL
        # Never lose the round's last offset, so the log end offset stays recoverable.
        mode = RETAIN_EMPTY if h.last_offset + 1 == fc.upper_bound else DELETE_EMPTY
        # Records come from memory (no CRC pass reads them first): the next batch's lines are
        # prefetched while this one is walked (about the same size; never past ``end``).
        fc.ahead = b + pos[0] + h.size
        fc.ahead_end = fc.ahead + (h.size if h.size < end - pos[0] - h.size
                                   else end - pos[0] - h.size)
        st = _filter_batch(m, fc, &h, b + pos[0], b, pos[0] + V2_HEADER_C, pos[0] + h.size,
                           mode, False, False, out, out_pos, out_cap, &rebuilt)
        if st != ST_OK:
            return st
        pos[0] += h.size


FILTER_DONE = 0
FILTER_NEED_PYTHON = 1
FILTER_OUTPUT_FULL = 2


@cython.final
cdef class BatchFilter:
    """The cleaner's per-round filter (REF §6.8) over one offset map.

    ``run`` handles runs of plain batches without the GIL; batches with producer ids, control
    batches, compressed and legacy batches come back to the caller, which decides their
    retention mode (transactions, active producers) and calls ``filter_one``. Rebuilt batches
    are left with CRC 0: the caller fills CRCs with ``finish_crcs``.
    """
    cdef FilterCore fc
    cdef OffsetMap omap

    def __cinit__(self, OffsetMap omap, int64_t now, int64_t delete_retention_ms,
                  int64_t upper_bound):
        memset(&self.fc, 0, sizeof(FilterCore))
        self.omap = omap
        self.fc.now = now
        self.fc.new_horizon = now + delete_retention_ms if delete_retention_ms < INT64_MAX_C - now \
            else INT64_MAX_C
        self.fc.upper_bound = upper_bound
        self.fc.strategy = omap.m.strategy
        self.fc.max_offset = -1

    def __dealloc__(self):
        free(self.fc.keep)
        free(self.fc.starts)
        free(self.fc.ts_ends)
        free(self.fc.tss)

    @property
    def stats(self) -> dict:
        """messages/bytes read and written, invalid (keyless) records, max offset written."""
        return {"messages_read": self.fc.messages_read, "bytes_read": self.fc.bytes_read,
                "messages_written": self.fc.messages_written,
                "bytes_written": self.fc.bytes_written, "invalid": self.fc.invalid,
                "max_offset": self.fc.max_offset, "rebuilt": self.fc.rebuilt}

    def reset_max_offset(self):
        self.fc.max_offset = -1

    def run(self, buf, Py_ssize_t start, Py_ssize_t end, bytearray out, Py_ssize_t out_pos,
            file=None):
        """Filter plain batches of ``buf[start:end]`` into ``out`` from ``out_pos``.

        Returns ``(code, position, out_pos)``: FILTER_DONE at ``end`` (or at an incomplete
        batch before it), FILTER_NEED_PYTHON at a
        batch for ``filter_one``, FILTER_OUTPUT_FULL when ``out`` needs draining or growing.
        """
        cdef const uint8_t[::1] view = buf
        cdef Py_ssize_t e = _resolve_end(view.shape[0], start, end)
        cdef uint8_t[::1] ov = out
        cdef Py_ssize_t pos = start, op = out_pos
        cdef int st
        if op < 0 or op > ov.shape[0]:
            raise ValueError("out_pos outside the output buffer")
        with nogil:
            st = _filter_run(&self.omap.m, &self.fc, _ptr(view), &pos, e, &ov[0], &op,
                             ov.shape[0])
        if st == ST_END:
            return (FILTER_DONE, pos, op)
        if st == ST_NEED_PYTHON:
            return (FILTER_NEED_PYTHON, pos, op)
        if st == ST_OUTPUT_FULL:
            return (FILTER_OUTPUT_FULL, pos, op)
        _raise_status(st, pos, file)

    @staticmethod
    def room_needed(buf, Py_ssize_t pos, payload_len=None) -> int:
        """Output bytes the batch at ``pos`` may need (``payload_len``: its decompressed
        records' size, for a compressed batch)."""
        cdef const uint8_t[::1] view = buf
        cdef BatchHeader h
        if scan_one(_ptr(view), pos, view.shape[0], &h) != ST_OK:
            raise ValueError(f"no complete batch at position {pos}")
        return _room_needed(&h, h.size - V2_HEADER_C if payload_len is None else payload_len)

    def filter_one(self, buf, Py_ssize_t pos, int mode, bint discard_records,
                   bint marker_for_empty_txn, bytearray out, Py_ssize_t out_pos, payload=None,
                   file=None):
        """Decide and write the magic-2 batch at ``buf[pos]`` (records from ``payload`` when
        the batch is compressed). Returns ``(out_pos, rebuilt)``; a rebuilt batch is written
        uncompressed with CRC 0 (the caller compresses it with its codec and sets the CRC)."""
        cdef const uint8_t[::1] view = buf
        cdef BatchHeader h
        cdef int st = scan_one(_ptr(view), pos, view.shape[0], &h)
        _raise_status(st, pos, file)
        if st != ST_OK or h.magic < 2:
            raise ValueError(f"no complete magic-2 batch at position {pos}")
        if out_pos < 0 or out_pos > len(out):
            raise ValueError("out_pos outside the output buffer")
        cdef uint8_t[::1] ov = out
        cdef const uint8_t[::1] pv
        cdef const uint8_t* rb
        cdef Py_ssize_t rstart, rend
        if (h.attributes & ATTR_CODEC) != 0:
            if payload is None:
                raise ValueError("a compressed batch needs its decompressed records")
            pv = payload
            rb = _ptr(pv)
            rstart = 0
            rend = pv.shape[0]
        else:
            rb = _ptr(view)
            rstart = pos + V2_HEADER_C
            rend = pos + h.size
        cdef Py_ssize_t op = out_pos
        cdef bint rebuilt
        self.fc.ahead = self.fc.ahead_end = NULL
        with nogil:
            st = _filter_batch(&self.omap.m, &self.fc, &h, _ptr(view) + pos, rb, rstart, rend,
                               mode, discard_records, marker_for_empty_txn, &ov[0], &op,
                               ov.shape[0], &rebuilt)
        if st == ST_OUTPUT_FULL:
            raise ValueError("output buffer has no room for the batch (see room_needed)")
        _raise_status(st, pos, file)
        return (op, bool(rebuilt))

    def count_legacy(self, int64_t messages, int64_t size, int64_t written_messages,
                     int64_t written_bytes, int64_t max_offset, int64_t invalid):
        """Account for a legacy (magic 0/1) batch the caller filtered in Python."""
        self.fc.messages_read += messages
        self.fc.bytes_read += size
        self.fc.messages_written += written_messages
        self.fc.bytes_written += written_bytes
        self.fc.invalid += invalid
        if max_offset > self.fc.max_offset:
            self.fc.max_offset = max_offset


cdef extern from "sys/mman.h" nogil:
    int _clean_madvise "madvise"(void* addr, size_t length, int advice)
    int _CLEAN_MADV_DONTNEED "MADV_DONTNEED"


def release_pages(buf, Py_ssize_t start, Py_ssize_t end) -> None:
    """Drop this process's page-table entries for the pages of the file mapping ``buf`` that
    hold ``buf[start:end]`` (the page cache keeps the data; a later touch maps it again).

    Like ``mmap.madvise(MADV_DONTNEED, ...)`` over the same pages, but without the GIL: the
    call flushes TLBs (interrupting the other core when another thread of the process runs
    there), and with the GIL held another cleaner thread could not return from its kernels
    meanwhile. ``buf`` must be an ``mmap.mmap``: on other memory the call would discard data."""
    if not isinstance(buf, _mmap.mmap):
        raise TypeError("release_pages needs an mmap.mmap")
    cdef const uint8_t[::1] view = buf
    if start < 0 or end > view.shape[0] or start > end:
        raise ValueError(f"range [{start}, {end}) is outside the mapping")
    if start == end:
        return
    cdef size_t page = _mmap.PAGESIZE
    cdef size_t lo = <size_t>&view[0] + <size_t>start
    cdef size_t hi = <size_t>&view[0] + <size_t>end
    lo = lo & ~(page - 1)
    with nogil:
        _clean_madvise(<void*>lo, hi - lo, _CLEAN_MADV_DONTNEED)   # advisory: failure is harmless


def finish_crcs(bytearray out, Py_ssize_t start, Py_ssize_t end):
    """Compute the CRC of every v2 batch in ``out[start:end]`` whose CRC field is 0."""
    cdef uint8_t[::1] ov = out
    cdef BatchHeader h
    cdef Py_ssize_t pos = start
    cdef bint bad = False
    if start < 0 or end > ov.shape[0] or start > end:
        raise ValueError(f"range [{start}, {end}) is outside the buffer")
    if start == end:
        return
    cdef uint8_t* b = &ov[0]
    if _crc_fn != NULL:
        # Without the GIL: a round's rebuilt batches are most of its output, and another
        # cleaner thread should not wait for their CRCs.
        with nogil:
            while pos < end:
                if scan_one(b, pos, end, &h) != ST_OK:
                    bad = True
                    break
                if h.magic == 2 and h.crc == 0:
                    wr_u32(b + pos + 17, crc32c_c(b + pos + 21, h.size - 21))
                pos += h.size
        if bad:
            raise ValueError(f"no complete batch at position {pos}")
        return
    mv = memoryview(out)
    while pos < end:
        if scan_one(b, pos, end, &h) != ST_OK:
            raise ValueError(f"no complete batch at position {pos}")
        if h.magic == 2 and h.crc == 0:
            wr_u32(b + pos + 17, _crc32c_pkg(mv[pos + 21:pos + h.size]))
        pos += h.size


def compress_batch_at(bytearray out, Py_ssize_t pos, Py_ssize_t size, int codec):
    """The uncompressed v2 batch at ``out[pos:pos+size]`` with its records compressed by
    ``codec`` at its default level, attributes and CRC updated: a new bytearray."""
    if pos < 0 or size < V2_HEADER_C or pos + size > len(out):
        raise ValueError("no batch at that range of the buffer")
    return _compress_batch(out, pos, size, codec, None)
