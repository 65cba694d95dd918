# Merging one offset map into another (OffsetMap.merge_lookup / merge_insert): the cleaner's
# map build split over two threads ends with the helper's side map merged into the cleaner
# thread's map. _merge_group, the gathering of a table's next entries, also serves the growth
# of a table (_map_grow). Included by _core.pyx after _offset_map.pxi; shares its namespace.


cdef inline int64_t _merge_group(const MapCore* m, const MapCore* src, int64_t* i, int64_t stop,
                                 int64_t* gi, int64_t* gs) noexcept nogil:
    """The next entries (up to MERGE_GROUP) of src's slots [i[0], stop): their indexes in gi,
    their first slots in m in gs, whose cache lines are prefetched; how many."""
    cdef int64_t g = 0, j = i[0], k
    cdef const uint64_t* e
    while j < stop and g < MERGE_GROUP:
        # Without a branch on emptiness: at a table's load it is a coin toss, and as an if
        # it cost a misprediction per entry (a third of a merge's time).
        e = src.mem + j * src.words
        gi[g] = j
        g += (e[0] | e[1] | e[2]) != 0
        j += 1
    for k in range(g):
        e = src.mem + gi[k] * src.words
        gs[k] = _probe_slot(m, e[0], e[1], 0)
        SEGSTORE_PREFETCH(m.mem + gs[k] * m.words)
    i[0] = j
    return g


cdef int64_t _map_merge_lookup(MapCore* m, MapCore* src, int64_t start, int64_t stop,
                               bint drain, int64_t* misses, int64_t cap,
                               int64_t* drained) noexcept nogil:
    """A merge's first phase over src's slots [start, stop) (``src`` was built over records
    that all come after those of ``m``): an entry whose digest ``m`` holds overwrites its
    offset; the others are listed in ``misses`` as rows (h1, h2, offset, first empty slot of
    its probe sequence in m, or -1) and counted in the result (-1 when there are more than
    ``cap``: src changed meanwhile). ``drain`` zeroes each entry of src once read (counted in
    ``drained``): the merged map is then clean without a pass of its own.

    It writes nothing in ``m`` but the offsets of the entries found (no counter, no insert),
    and in ``src`` only the range's own slots, so two threads may run it at once over
    disjoint ranges. A group's slots load while the group before is probed: a merge runs when
    both maps have just left the cache."""
    cdef int64_t ga[MERGE_GROUP]
    cdef int64_t gb[MERGE_GROUP]
    cdef int64_t sa[MERGE_GROUP]
    cdef int64_t sb[MERGE_GROUP]
    cdef int64_t* ci = ga
    cdef int64_t* cs = sa
    cdef int64_t* ni = gb
    cdef int64_t* ns = sb
    cdef int64_t* t
    cdef int64_t i = start, n, nn, k, slot, found = 0, taken = 0
    cdef int64_t probes = 0   # _map_find's count, not kept: m's counters are not written here
    cdef uint64_t h1, h2, offset
    cdef uint64_t* s
    n = _merge_group(m, src, &i, stop, ci, cs)
    while n:
        nn = _merge_group(m, src, &i, stop, ni, ns)
        for k in range(n):
            s = src.mem + ci[k] * src.words
            h1 = s[0]
            h2 = s[1]
            offset = s[2]
            if drain:
                s[0] = 0
                s[1] = 0
                s[2] = 0
                taken += 1
            slot = _map_find(m, h1, h2, cs[k], &probes)
            if slot >= 0:
                m.mem[slot * m.words + 2] = offset
            else:
                if slot != FIND_FULL:
                    slot = -2 - slot   # where an insert of this entry starts
                if found == cap:
                    drained[0] = taken
                    return -1
                misses[4 * found] = <int64_t>h1
                misses[4 * found + 1] = <int64_t>h2
                misses[4 * found + 2] = <int64_t>offset
                misses[4 * found + 3] = slot
                found += 1
        t = ci
        ci = ni
        ni = t
        t = cs
        cs = ns
        ns = t
        n = nn
    drained[0] = taken
    return found


cdef int _map_merge_insert(MapCore* m, const int64_t* misses, int64_t n,
                           bint slots_valid) noexcept nogil:
    """A merge's second phase: insert the entries _map_merge_lookup listed, in order.

    A listed slot still empty is where the key goes, as long as no entry was re-placed since
    the lookup (``slots_valid``, and no growth here): slots only ever fill between clears and
    growths, so every slot before it in the key's probe sequence is still taken by another
    key. Otherwise Kafka's put probes again."""
    cdef int64_t k, slot, layout = m.layout
    cdef const int64_t* r
    cdef uint64_t* e
    cdef int st
    for k in range(n):
        if slots_valid and k + 8 < n and 0 <= misses[4 * (k + 8) + 3] < m.table:
            SEGSTORE_PREFETCH(m.mem + misses[4 * (k + 8) + 3] * m.words)
        r = misses + 4 * k
        st = _map_reserve(m, 1)
        if st != ST_OK:
            return st
        slot = r[3]
        if slots_valid and m.layout == layout and 0 <= slot < m.table and m.entries < m.table:
            e = m.mem + slot * m.words
            if e[0] == 0 and e[1] == 0 and e[2] == 0:
                e[0] = <uint64_t>r[0]
                e[1] = <uint64_t>r[1]
                e[2] = <uint64_t>r[2]
                m.entries += 1
                continue
        st = _map_put_from(m, <uint64_t>r[0], <uint64_t>r[1],
                           _probe_slot(m, <uint64_t>r[0], <uint64_t>r[1], 0), r[2], 0, False)
        if st != ST_OK:
            return st
    return ST_OK
