# The buffer pool: large column buffers are kept when freed and handed to the next decode.
#
# A fresh anonymous page costs the kernel a fault and a zeroing pass before the first write;
# on a 1M-record column decode (about 140 MB of output) that was a fifth of the time. Like
# Kafka's producer BufferPool and Arrow's jemalloc pool, freed buffers are retained (up to a
# byte limit) and reused, so a pipeline that decodes range after range writes into memory
# that is already mapped. Everything here runs with the GIL held (allocation in the decoder's
# Python-level setup, release in a deallocator), which is the pool's only lock.

cdef extern from "sys/mman.h" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_DONTNEED
    int MADV_HUGEPAGE
    void* c_mmap "mmap"(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int c_munmap "munmap"(void* addr, size_t length)
    int PROT_READ
    int PROT_WRITE
    int MAP_PRIVATE
    int MAP_ANONYMOUS
    void* MAP_FAILED

cdef size_t PAGE = _mmap.PAGESIZE
cdef size_t HUGE_HINT_MIN = 4 << 20


cdef inline void _hint_huge_pages(void* p, size_t n) noexcept nogil:
    """Ask for transparent huge pages under a large, not yet touched output buffer (as numpy
    does for its own large arrays): faulting it in then costs 1/512 of the page faults."""
    if n < HUGE_HINT_MIN:
        return
    cdef size_t a = (<size_t>p + PAGE - 1) & ~(PAGE - 1)
    cdef size_t b = (<size_t>p + n) & ~(PAGE - 1)
    if b > a:
        madvise(<void*>a, b - a, MADV_HUGEPAGE)  # advisory: failure changes nothing


cdef size_t POOL_HUGE = 2 << 20      # blocks this large or more are whole huge pages
cdef Py_ssize_t POOL_MIN = 64 << 10   # smaller arrays come from numpy (malloc reuses them)
cdef enum:
    POOL_SLOTS = 64                  # at most this many free blocks are kept

cdef struct PoolBlock:
    uint8_t* ptr
    size_t size

cdef PoolBlock _free_blocks[POOL_SLOTS]   # oldest first
cdef int _n_free = 0
cdef size_t _free_bytes = 0
cdef size_t _pool_limit = 256 << 20
cdef size_t _in_use_bytes = 0
cdef int64_t _hits = 0, _misses = 0
cdef int64_t _fresh = 0   # large buffers handed out in memory not written before (not reused)


cdef inline size_t _block_size(size_t nbytes) noexcept nogil:
    cdef size_t unit = POOL_HUGE if nbytes >= 4 * POOL_HUGE else PAGE
    return (nbytes + unit - 1) & ~(unit - 1)


cdef void _evict_oldest() noexcept:
    global _n_free, _free_bytes
    c_munmap(_free_blocks[0].ptr, _free_blocks[0].size)
    _free_bytes -= _free_blocks[0].size
    _n_free -= 1
    memmove(&_free_blocks[0], &_free_blocks[1], _n_free * sizeof(PoolBlock))


cdef void _evict_down_to(size_t keep) noexcept:
    """Unmap kept blocks, oldest first, until at most ``keep`` bytes are kept."""
    while _n_free and _free_bytes > keep:
        _evict_oldest()


cdef void _pool_release(uint8_t* ptr, size_t size) noexcept:
    """A buffer died: keep its block for reuse, or unmap it when the pool is full."""
    global _n_free, _free_bytes, _in_use_bytes
    _in_use_bytes -= size
    if size > _pool_limit:
        c_munmap(ptr, size)
        return
    while _n_free and (_free_bytes + size > _pool_limit or _n_free == POOL_SLOTS):
        _evict_oldest()
    _free_blocks[_n_free].ptr = ptr
    _free_blocks[_n_free].size = size
    _n_free += 1
    _free_bytes += size


cdef class PooledBuffer:
    """Writable memory from segstore's buffer pool (a numpy array's base); the block goes back
    to the pool when the last array viewing it is freed."""
    cdef uint8_t* ptr
    cdef size_t size          # the mapped block
    cdef Py_ssize_t nbytes    # what the buffer exposes
    cdef Py_ssize_t shape[1]

    def __getbuffer__(self, Py_buffer* view, int flags):
        self.shape[0] = self.nbytes
        view.buf = self.ptr
        view.obj = self
        view.len = self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = b"B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __reduce__(self):
        # Cython would pickle (and copy.copy) the block pointer as a C string: a second owner
        # of a bogus block that its deallocator would put in the free list.
        raise TypeError("a PooledBuffer cannot be pickled or copied (copy the array viewing it)")

    def __dealloc__(self):
        if self.ptr != NULL:
            _pool_release(self.ptr, self.size)
            self.ptr = NULL


cdef PooledBuffer _pool_acquire(Py_ssize_t nbytes):
    """A block of at least nbytes: the smallest free one that is not wastefully large (at most
    twice the need), else a new mapping."""
    global _n_free, _free_bytes, _in_use_bytes, _hits, _misses, _fresh
    # Created first: nothing that could run other code (and free a buffer) comes between
    # choosing a free block and taking it off the list.
    cdef PooledBuffer out = PooledBuffer.__new__(PooledBuffer)
    cdef size_t need = _block_size(nbytes)
    cdef int i, best = -1
    for i in range(_n_free):
        if need <= _free_blocks[i].size <= 2 * need and (
                best < 0 or _free_blocks[i].size < _free_blocks[best].size):
            best = i
    cdef void* p
    if best >= 0:
        out.ptr = _free_blocks[best].ptr
        out.size = _free_blocks[best].size
        _free_bytes -= out.size
        _n_free -= 1
        memmove(&_free_blocks[best], &_free_blocks[best + 1], (_n_free - best) * sizeof(PoolBlock))
        _hits += 1
    else:
        p = c_mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if p == MAP_FAILED and _n_free:
            # Out of address space or memory: give back what the pool keeps, then try again.
            _evict_down_to(0)
            p = c_mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if p == MAP_FAILED:
            raise MemoryError(f"segstore: cannot map {need} bytes for a column buffer")
        _hint_huge_pages(p, need)
        out.ptr = <uint8_t*>p
        out.size = need
        _misses += 1
        _fresh += 1
    out.nbytes = nbytes
    _in_use_bytes += out.size
    return out


cdef object _pool_empty(Py_ssize_t count, object dtype, Py_ssize_t itemsize):
    """np.empty(count, dtype), in pooled memory when the array is large."""
    cdef Py_ssize_t nbytes = count * itemsize
    global _fresh
    if nbytes < POOL_MIN or <size_t>nbytes > _pool_limit:
        if nbytes >= POOL_MIN:
            _fresh += 1
        return np.empty(count, dtype=dtype)
    # The PooledBuffer itself is the array's base (np.frombuffer would put a memoryview there,
    # and memoryview.release() on it would free the block under the array).
    return np.ndarray(count, dtype=dtype, buffer=_pool_acquire(nbytes))


def buffer_pool_set_limit(nbytes):
    """Set how many bytes of freed column buffers are kept for reuse (0 turns pooling off and
    unmaps what is kept); returns the previous limit."""
    global _pool_limit
    cdef int64_t n = _int_arg(nbytes, "nbytes", InvalidArgumentError, 0, INT64_MAX_C, ">= 0",
                              OffsetTypeError)
    cdef size_t old = _pool_limit
    _pool_limit = n
    _evict_down_to(_pool_limit)
    return old


def buffer_pool_release():
    """Unmap every kept free block (buffers in use are untouched); returns the bytes freed."""
    cdef size_t freed = _free_bytes
    _evict_down_to(0)
    return freed


def buffer_pool_stats():
    """(limit, free_bytes, free_blocks, in_use_bytes, hits, misses) of the buffer pool."""
    return _pool_limit, _free_bytes, _n_free, _in_use_bytes, _hits, _misses
