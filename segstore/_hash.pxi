# MurmurHash2 (Kafka's partitioner) and MurmurHash3 x64-128 (the offset-map digest).
# Included by _core.pyx; shares its namespace.

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


cdef inline void murmur3_x64_128(const uint8_t* data, Py_ssize_t length, uint32_t seed,
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


# CRC-32C without the GIL: the crc32c package's own C routine (hardware or slicing-by-8, as the
# package chose at import), bound through its exported symbol and checked against the package's
# Python function at import. If the symbol is missing (another build of the package), every CRC
# goes through the Python function instead, with the GIL, one batch at a time.
ctypedef uint32_t (*CrcFn)(uint32_t, const uint8_t*, size_t) noexcept nogil
cdef CrcFn _crc_fn = NULL


cdef inline uint32_t crc32c_c(const uint8_t* p, size_t n) noexcept nogil:
    return _crc_fn(0xFFFFFFFFU, p, n) ^ 0xFFFFFFFFU


def _bind_crc32c() -> bool:
    """Bind the crc32c package's C routine for GIL-free CRCs; False when it cannot be found or
    disagrees with ``crc32c.crc32c`` on test vectors."""
    global _crc_fn
    _crc_fn = NULL
    try:
        import ctypes
        import crc32c as pkg
        import crc32c._crc32c as ext
        lib = ctypes.CDLL(ext.__file__)
        name = "_crc32c_hw_adler" if getattr(pkg, "hardware_based", False) else \
            "_crc32c_sw_slicing_by_8"
        addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except (ImportError, OSError, AttributeError):
        return False
    if not addr:
        return False
    cdef CrcFn fn = <CrcFn><size_t>addr
    cdef const uint8_t[::1] v
    import os as _os
    for sample in (b"123456789", b"", bytes(range(256)) * 37, _os.urandom(4099)):
        v = sample
        if len(sample) and (fn(0xFFFFFFFFU, &v[0], len(sample)) ^ 0xFFFFFFFFU) != _crc32c_pkg(sample):
            return False
    _crc_fn = fn
    return True


def _unbind_crc32c() -> None:
    """Tests: compute every CRC through the Python function (the fallback path)."""
    global _crc_fn
    _crc_fn = NULL


def crc32c_without_gil() -> bool:
    """Whether CRCs are computed by the crc32c package's C routine without the GIL."""
    return _crc_fn != NULL


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


def murmur3_128_digests(keys):
    """The MurmurHash3 x64-128 digest (the offset map's key digest) of every non-null key of a
    BinaryColumn, as a uint64 array of shape (non-null keys, 2): h1, h2 per row."""
    cdef const uint8_t[::1] data = keys.data
    cdef const int64_t[::1] offs = keys.offsets
    cdef const uint8_t[::1] valid = keys.valid.view(np.uint8)
    cdef Py_ssize_t n = valid.shape[0], i, j = 0, bad = -1
    if offs.shape[0] != n + 1:
        raise ValueError("keys.offsets must have one more entry than keys.valid")
    out = np.empty((int(np.count_nonzero(keys.valid)), 2), dtype=np.uint64)
    cdef uint64_t[:, ::1] o = out
    cdef const uint8_t* d = _ptr(data)
    cdef Py_ssize_t length = data.shape[0]
    with nogil:
        for i in range(n):
            if valid[i]:
                if offs[i] < 0 or offs[i + 1] < offs[i] or offs[i + 1] > length:
                    bad = i
                    break
                murmur3_x64_128(d + offs[i], offs[i + 1] - offs[i], 0, &o[j, 0], &o[j, 1])
                j += 1
    if bad >= 0:
        raise ValueError(f"key {bad}'s offsets lie outside keys.data")
    return out


def distinct_digests(digests) -> np.ndarray:
    """The distinct rows of a (n, 2) uint64 digest array (as returned by
    murmur3_128_digests), sorted."""
    d = np.ascontiguousarray(digests, dtype=np.uint64).reshape(-1, 2)
    return np.unique(d.view(np.dtype((np.void, 16))).ravel()).view(np.uint64).reshape(-1, 2)


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
