# The log cleaner's offset map: Kafka's SkimpyOffsetMap (REF §6.12), key digest -> latest
# offset in one flat buffer, with Kafka's probing, a table that grows as it fills, and counters.
# Included by _core.pyx; shares its namespace. _map_build.pxi fills the map over segments and
# _clean_filter.pxi reads it.

cdef enum:
    DIGEST_BYTES = 16
    MAP_GROUP = 16             # records hashed ahead so their slots' cache lines load in parallel
    MERGE_GROUP = 48           # a merge's entries whose slots load while the last are probed

    STRATEGY_OFFSET = 0
    STRATEGY_TIMESTAMP = 1
    STRATEGY_HEADER = 2


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
    int64_t layout         # bumped when entries are re-placed (growth) or dropped (clear, drain)
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
    m.layout += 1
    # Re-place the entries in slot order, a group at a time: the new slots of a group are
    # computed and prefetched first (one at a time, every placement waited for memory).
    cdef MapCore before = m[0]
    before.mem = tmp
    before.table = old
    cdef int64_t gi[MERGE_GROUP]
    cdef int64_t gs[MERGE_GROUP]
    cdef int64_t g, k
    i = 0
    while i < old:
        g = _merge_group(m, &before, &i, old, gi, gs)
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


cdef enum:
    FIND_FULL = -1   # _map_find: every slot looked at was taken by another key


cdef inline int64_t _map_find(const MapCore* m, uint64_t h1, uint64_t h2, int64_t slot0,
                              int64_t* probes) noexcept nogil:
    """The slot holding digest (h1, h2), probing from ``slot0`` (its first slot); else
    ``-2 - s`` where ``s`` is the first empty slot of its probe sequence, or FIND_FULL. Bounded
    probing: a completely full map does not hold an absent key (REF §7 #12). Adds the slots
    looked at to ``probes`` and writes nothing else, so threads may look up at once."""
    cdef int64_t attempt = 0, slot = slot0
    cdef int64_t limit = m.table + DIGEST_BYTES - 4
    cdef const uint64_t* e
    while attempt < limit:
        probes[0] += 1
        e = m.mem + slot * m.words
        if e[0] == 0 and e[1] == 0 and e[2] == 0:
            return -2 - slot
        if e[0] == h1 and e[1] == h2:
            return slot
        attempt += 1
        slot = _probe_slot(m, h1, h2, attempt)
    return FIND_FULL


cdef inline int64_t _map_get_from(MapCore* m, uint64_t h1, uint64_t h2,
                                  int64_t slot0) noexcept nogil:
    # The offset stored for the digest, or -1.
    cdef int64_t slot = _map_find(m, h1, h2, slot0, &m.probes)
    m.lookups += 1
    return <int64_t>m.mem[slot * m.words + 2] if slot >= 0 else -1


cdef struct StrategyKey:
    int strategy
    const uint8_t* header_key
    Py_ssize_t header_key_len


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
    cdef int64_t _clean_slots   # leading slots known zero and in memory (a drained merge)

    def __cinit__(self, memory, double load_factor=0.9, str strategy="offset",
                  header_key=None):
        cdef int64_t nbytes = _i64_arg(memory, "memory", InvalidArgumentError)
        if strategy not in ("offset", "timestamp", "header"):
            raise InvalidArgumentError(f"unknown compaction strategy {strategy!r}")
        if not 0.0 < load_factor <= 1.0:
            raise InvalidArgumentError(f"load factor {load_factor} is outside (0, 1]")
        self.m.strategy = {"offset": STRATEGY_OFFSET, "timestamp": STRATEGY_TIMESTAMP,
                           "header": STRATEGY_HEADER}[strategy]
        self.m.words = 3 if self.m.strategy == STRATEGY_OFFSET else 4
        self.m.slots = nbytes // (self.m.words * 8)
        self.m.table = min(self.m.slots, INITIAL_TABLE)
        if self.m.slots < 1:
            raise InvalidArgumentError(f"an offset map of {nbytes} bytes has no slot "
                                       f"({self.m.words * 8} bytes each)")
        if strategy == "header":
            self._header_key = (b"" if header_key is None
                                else header_key.encode() if isinstance(header_key, str)
                                else bytes(_byte_buffer(header_key, "header_key")))
            if not self._header_key:
                raise InvalidArgumentError("the header strategy needs a header key")
        else:
            self._header_key = b""
        self.memory = nbytes
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

    def update_latest_offset(self, offset) -> None:
        """Set the latest offset directly (Kafka's updateLatestOffset)."""
        self.m.latest_offset = _i64_arg(offset, "offset", InvalidOffsetError)

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
        cdef const uint8_t[::1] v = _byte_buffer(key, "key")
        murmur3_x64_128(_ptr(v), v.shape[0], 0, h1, h2)

    def put(self, key, offset, value=0) -> None:
        """Map ``key`` to ``offset`` (a strategy map keeps the entry with the larger value)."""
        cdef int64_t o = _i64_arg(offset, "offset", InvalidOffsetError)
        cdef int64_t v = _i64_arg(value, "value", InvalidArgumentError)
        cdef uint64_t h1, h2
        self._digest(key, &h1, &h2)
        self._dirty = True
        self._clean_slots = 0
        cdef int st = _map_put(&self.m, h1, h2, o, v, False)
        if st == ST_MAP_FULL:
            raise OverflowError(f"the offset map is full ({self.m.slots} slots)")
        if st == ST_NO_MEMORY:
            raise MemoryError("growing the offset map's probed table")

    def merge_from(self, later, bint drain=False) -> None:
        """Put every entry of ``later`` into this map, as if its records had been mapped here
        after this map's own: ``later`` must be an offset-strategy map built over records that
        all come after this map's (a map build split in two halves, mapped at once). The
        lookup and probe counters add up ``later``'s, as if each key had been looked up where
        it was read; the latest offset becomes the larger of the two. OverflowError when this
        map cannot hold the union (nothing is undone: clear it).

        ``drain`` empties ``later`` on the way (its entries zeroed as they are read, its
        counters reset, its pages kept): a later ``clear(keep_pages=True)`` then has nothing to
        zero. The same as ``merge_insert(later, merge_lookup(later, drain=drain))``; a caller
        with two threads runs ``merge_lookup`` on both over halves of ``later``'s slots."""
        self.merge_insert(later, self.merge_lookup(later, drain=drain))

    cdef _check_merge(self, OffsetMap later):
        if self.m.strategy != STRATEGY_OFFSET or later.m.strategy != STRATEGY_OFFSET:
            raise InvalidArgumentError(
                "only offset-strategy maps merge (a strategy compares values)")
        if later is self:
            raise InvalidArgumentError("a map cannot merge into itself")

    def merge_lookup(self, later, start=0, stop=None, *,
                     bint drain=False) -> tuple:
        """A merge's first phase over ``later``'s slots ``[start, stop)`` (``stop`` defaults
        to ``later.table_slots``): the offsets of the keys this map holds are overwritten with
        ``later``'s; the others are returned for :meth:`merge_insert` (an opaque tuple).
        ``drain`` zeroes each entry of ``later`` once read.

        Runs without the GIL and writes only the offsets of keys found (and, draining,
        ``later``'s slots of the range), so two threads may look up disjoint slot ranges of the
        same two maps at once; nothing else may change either map meanwhile."""
        cdef OffsetMap lm = _offset_map_arg(later, "later")
        self._check_merge(lm)
        cdef int64_t lo = _i64_arg(start, "start", InvalidArgumentError)
        cdef int64_t end = _opt_i64(stop, lm.m.table, "stop")
        if not 0 <= lo <= end <= lm.m.table:
            raise InvalidArgumentError(f"slot range [{lo}, {end}) is outside the "
                                       f"{lm.m.table} slots of the merged map")
        rows = np.empty((min(end - lo, lm.m.entries), 4), dtype=np.int64)
        cdef int64_t[:, ::1] out = rows
        cdef int64_t found = 0, drained = 0
        self._dirty = True
        self._clean_slots = 0
        if out.shape[0]:
            with nogil:
                found = _map_merge_lookup(&self.m, &lm.m, lo, end, drain, &out[0, 0],
                                          out.shape[0], &drained)
        if drained:
            lm.m.layout += 1   # slots of later emptied: its pending lookups are stale
        if found < 0:
            raise RuntimeError("the merged map gained entries during merge_lookup (maps being "
                               "merged must not change meanwhile)")
        return (self, lm, self.m.layout, rows[:found], drained)

    def merge_insert(self, later, *lookups) -> None:
        """A merge's second phase: insert the keys of ``later`` that :meth:`merge_lookup`
        (one call, or several over consecutive slot ranges, in order) did not find, then add
        up the counters and keep the larger latest offset, as :meth:`merge_from` does. When
        the lookups drained every entry of ``later``, ``later`` is left empty: no entries,
        counters reset, its zeroed pages kept for its next ``clear(keep_pages=True)``."""
        cdef OffsetMap lm = _offset_map_arg(later, "later")
        self._check_merge(lm)
        cdef int64_t lookups_n = self.m.lookups, probes = self.m.probes
        cdef int64_t latest = max(self.m.latest_offset, lm.m.latest_offset)
        cdef int64_t[:, ::1] rows
        cdef int st = ST_OK
        cdef int64_t drained = 0
        cdef bint valid
        self._dirty = True
        self._clean_slots = 0
        for owner, source, layout, found, taken in lookups:
            if owner is not self or source is not lm:
                raise InvalidArgumentError("merge_insert takes what merge_lookup returned for "
                                           "the same two maps")
            drained += taken
            rows = np.ascontiguousarray(found, dtype=np.int64).reshape(-1, 4)
            if rows.shape[0] == 0:
                continue
            valid = layout == self.m.layout
            with nogil:
                st = _map_merge_insert(&self.m, &rows[0, 0], rows.shape[0], valid)
            if st != ST_OK:
                break
        self.m.lookups = lookups_n + lm.m.lookups
        self.m.probes = probes + lm.m.probes
        self.m.latest_offset = latest
        if drained and drained == lm.m.entries:
            lm.m.entries = lm.m.lookups = lm.m.probes = 0
            lm.m.latest_offset = -1
            lm._clean_slots = lm.m.table
        if st == ST_MAP_FULL:
            raise OverflowError(f"the offset map is full ({self.m.slots} slots)")
        if st == ST_NO_MEMORY:
            raise MemoryError("growing the offset map's probed table")

    def get(self, key) -> int:
        """The offset mapped for ``key``, or -1."""
        cdef uint64_t h1, h2
        self._digest(key, &h1, &h2)
        return _map_get(&self.m, h1, h2)

    def clear(self, table_hint=0, bint keep_pages=False) -> None:
        """Zero the buffer and the counters; latest offset -1. The touched pages are given
        back to the OS; or, with ``keep_pages``, zeroed in place and kept, and the table to be
        probed first is faulted in now, by the calling thread.

        The probed table starts again at 65,536 slots, or, with ``table_hint``, at the first
        size of its growth sequence that reaches ``table_hint`` slots (a cleaner passes the
        size a partition's last round grew to, so a round like the last one skips the growth
        steps and their re-placing of every entry)."""
        cdef int64_t hint = _i64_arg(table_hint, "table_hint", InvalidArgumentError)
        cdef int64_t new, old_table = self.m.table, zeroed, clean
        if self._dirty and not keep_pages:
            # Dropping the pages zeroes them (private anonymous memory) at the cost of only
            # the pages the map touched, and gives the memory back between rounds.
            self._array.madvise(_mmap.MADV_DONTNEED)
            self._dirty = False
            self._clean_slots = 0
        self.m.entries = self.m.lookups = self.m.probes = 0
        self.m.latest_offset = -1
        self.m.layout += 1
        self.m.table = min(self.m.slots, INITIAL_TABLE)
        while self.m.table < hint and self.m.table < self.m.slots:
            # _map_grow's steps, on an empty table: double, or jump to the whole buffer.
            new = self.m.table * 2 if self.m.table * 2 < self.m.slots else self.m.slots
            if <size_t>self.m.table * <size_t>self.m.words * 16 > GROW_SCRATCH_MAX:
                new = self.m.slots
            self.m.table = new
        if keep_pages:
            # Zero what was used and fault in the table about to be probed, on this thread;
            # a drained merge left its table zeroed already.
            zeroed = max(old_table, self.m.table) if self._dirty else self.m.table
            clean = min(self._clean_slots, zeroed)
            if clean < zeroed:
                memset(self.m.mem + clean * self.m.words, 0,
                       <size_t>(zeroed - clean) * <size_t>self.m.words * 8)
            self._clean_slots = zeroed
            self._dirty = True

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


cdef OffsetMap _offset_map_arg(object obj, str name):
    """``obj`` when it is an OffsetMap, else ArgumentTypeError naming ``name``: a typed
    OffsetMap parameter let None through, whose memory was then read as a map's."""
    if not isinstance(obj, OffsetMap):
        raise ArgumentTypeError(f"{name} must be an OffsetMap, not {type(obj).__name__}")
    return <OffsetMap>obj
