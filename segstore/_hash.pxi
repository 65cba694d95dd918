# MurmurHash2 (Kafka's partitioner) and MurmurHash3 x64-128 (the offset-map digest).
# Included by _core.pyx; shares its namespace.

cdef int32_t _murmur2(const uint8_t* data, Py_ssize_t length) noexcept nogil:
    # Kafka's Utils.murmur2 with its seed; arithmetic is on uint32 to mirror Java's wrapping ints.
    # Java assembles each 4-byte block little-endian, which is one unaligned load here.
    cdef uint32_t m = 0x5bd1e995
    cdef int r = 24
    cdef uint32_t h = (<uint32_t>0x9747b28cU) ^ <uint32_t>length
    cdef Py_ssize_t length4 = length // 4
    cdef Py_ssize_t i
    cdef uint32_t k
    for i in range(length4):
        k = segstore_le32(data + i * 4)
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


cdef extern from *:
    """
    #include <string.h>
    /* An unaligned little-endian 64-bit load (one instruction on x86-64). */
    static inline uint64_t segstore_le64(const uint8_t* p) {
        uint64_t v;
        memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }
    static inline uint32_t segstore_le32(const uint8_t* p) {
        uint32_t v;
        memcpy(&v, p, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    /* a % d for 32-bit a and 1 <= d < 2^32 by Lemire's exact "fastmod" (a multiply instead of
       a 20-40 cycle divide; m = segstore_fastmod_m(d), which is 0 for d == 1, giving 0). */
    static inline uint64_t segstore_fastmod_m(uint32_t d) {
        return UINT64_C(0xFFFFFFFFFFFFFFFF) / d + 1;
    }
    static inline uint32_t segstore_fastmod(uint32_t a, uint64_t m, uint32_t d) {
    #if defined(__SIZEOF_INT128__)
        return (uint32_t)(((unsigned __int128)(m * a) * d) >> 64);
    #else
        (void)m;
        return a % d;
    #endif
    }
    """
    uint64_t segstore_le64(const uint8_t* p) noexcept nogil
    uint32_t segstore_le32(const uint8_t* p) noexcept nogil
    uint64_t segstore_fastmod_m(uint32_t d) noexcept nogil
    uint32_t segstore_fastmod(uint32_t a, uint64_t m, uint32_t d) noexcept nogil


cdef inline uint64_t _le64(const uint8_t* p) noexcept nogil:
    return segstore_le64(p)


cdef inline void _murmur3_x64_128_16(const uint8_t* data, uint32_t seed, uint64_t* out1,
                                     uint64_t* out2) noexcept nogil:
    """murmur3_x64_128 of exactly 16 bytes: the one block, no tail, straight-line code (the
    general loop's block and tail bookkeeping cost about a tenth of a map build's key walk)."""
    cdef uint64_t c1 = 0x87c37b91114253d5ULL
    cdef uint64_t c2 = 0x4cf5ad432745937fULL
    cdef uint64_t k1 = _le64(data), k2 = _le64(data + 8)
    cdef uint64_t h1 = seed, h2 = seed
    k1 *= c1; k1 = _rotl64(k1, 31); k1 *= c2; h1 ^= k1
    h1 = _rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729
    k2 *= c2; k2 = _rotl64(k2, 33); k2 *= c1; h2 ^= k2
    h2 = _rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5
    h1 ^= 16
    h2 ^= 16
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    out1[0] = h1
    out2[0] = h2


cdef inline void murmur3_x64_128(const uint8_t* data, Py_ssize_t length, uint32_t seed,
                          uint64_t* out1, uint64_t* out2) noexcept nogil:
    """MurmurHash3 x64-128: the 16-byte key digest of the offset map (design §1.3)."""
    if length == 16:
        _murmur3_x64_128_16(data, seed, out1, out2)
        return
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


# CRC-32C without the GIL: on x86-64 CPUs with AVX-512 and VPCLMULQDQ, segstore's own folding
# routine below (about twice the package's speed: a map build's CRCs then run at memory speed);
# otherwise the crc32c package's own C routine (hardware or slicing-by-8, as the package chose at
# import), bound through its exported symbol. Either is checked against the package's Python
# function at import. If neither can be bound (another build of the package), every CRC goes
# through the Python function instead, with the GIL, one batch at a time.
ctypedef uint32_t (*CrcFn)(uint32_t, const uint8_t*, size_t) noexcept nogil
cdef CrcFn _crc_fn = NULL
cdef str _crc_routine = "python"

cdef extern from *:
    """
    /* CRC-32C by carry-less multiplication (the folding of Intel's "Fast CRC Computation for
       Generic Polynomials Using PCLMULQDQ", reflected): sixteen 128-bit lanes, four per ZMM
       register, each fold a lane 256 bytes forward with x^(2048+64) and x^2048 (mod P); the
       lanes are then folded into one 128-bit remainder, which the CRC32 instruction reduces
       (the remainder is congruent to the bytes folded so far, so its 16 bytes give their CRC);
       the last <16 bytes go through the CRC32 instruction too. State in and out as the crc32c
       package's routines: no inversion. Fold constants: reflect64(x^(63+D) mod P) for the lane's
       low qword and reflect64(x^(D-1) mod P) for its high qword, D the fold distance in bits. */
    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
        (defined(__clang__) || __GNUC__ >= 8)
    #include <immintrin.h>
    #define SEGSTORE_CRC_VECTOR 1
    #define SEGSTORE_CRC_TARGET \
        __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))

    SEGSTORE_CRC_TARGET static inline __m512i segstore_fold512(__m512i a, __m512i k, __m512i b) {
        return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                         _mm512_clmulepi64_epi128(a, k, 0x11), b, 0x96);
    }

    SEGSTORE_CRC_TARGET static inline __m128i segstore_fold128(__m128i a, __m128i k, __m128i b) {
        return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00),
                                           _mm_clmulepi64_si128(a, k, 0x11)), b);
    }

    SEGSTORE_CRC_TARGET static uint32_t segstore_crc32c_vector(uint32_t crc, const uint8_t* p,
                                                              size_t n) {
        uint64_t c;
        if (n >= 256) {
            const __m512i k2048 = _mm512_set4_epi64(
                0x1426a81500000000LL, (long long)0xe9a5d8be00000000ULL,
                0x1426a81500000000LL, (long long)0xe9a5d8be00000000ULL);
            const __m512i k512 = _mm512_set4_epi64(
                0x75bba45b00000000LL, 0x1c19243b00000000LL,
                0x75bba45b00000000LL, 0x1c19243b00000000LL);
            const __m128i k128 = _mm_set_epi64x(0x3171d43000000000LL, 0x3743f7bd00000000LL);
            __m512i x0 = _mm512_loadu_si512((const void*)p);
            __m512i x1 = _mm512_loadu_si512((const void*)(p + 64));
            __m512i x2 = _mm512_loadu_si512((const void*)(p + 128));
            __m512i x3 = _mm512_loadu_si512((const void*)(p + 192));
            __m128i a;
            /* The state enters as the first four message bytes xored with it. */
            x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
            p += 256;
            n -= 256;
            while (n >= 256) {
                x0 = segstore_fold512(x0, k2048, _mm512_loadu_si512((const void*)p));
                x1 = segstore_fold512(x1, k2048, _mm512_loadu_si512((const void*)(p + 64)));
                x2 = segstore_fold512(x2, k2048, _mm512_loadu_si512((const void*)(p + 128)));
                x3 = segstore_fold512(x3, k2048, _mm512_loadu_si512((const void*)(p + 192)));
                p += 256;
                n -= 256;
            }
            x1 = segstore_fold512(x0, k512, x1);
            x2 = segstore_fold512(x1, k512, x2);
            x3 = segstore_fold512(x2, k512, x3);
            while (n >= 64) {
                x3 = segstore_fold512(x3, k512, _mm512_loadu_si512((const void*)p));
                p += 64;
                n -= 64;
            }
            /* x3's four lanes lie 48, 32, 16 and 0 bytes before the end of what is folded. */
            a = _mm512_extracti32x4_epi32(x3, 3);
            a = segstore_fold128(_mm512_extracti32x4_epi32(x3, 0),
                                 _mm_set_epi64x(0x6051243f00000000LL,
                                                (long long)0xa46ef4aa00000000ULL), a);
            a = segstore_fold128(_mm512_extracti32x4_epi32(x3, 1),
                                 _mm_set_epi64x((long long)0xa2158b3400000000ULL,
                                                0x33ccbbbc00000000LL), a);
            a = segstore_fold128(_mm512_extracti32x4_epi32(x3, 2), k128, a);
            while (n >= 16) {
                a = segstore_fold128(a, k128, _mm_loadu_si128((const __m128i*)p));
                p += 16;
                n -= 16;
            }
            c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(a));
            c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(a, 1));
        } else {
            c = crc;
        }
        while (n >= 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            c = _mm_crc32_u64(c, v);
            p += 8;
            n -= 8;
        }
        while (n) {
            c = _mm_crc32_u8((uint32_t)c, *p);
            p++;
            n--;
        }
        return (uint32_t)c;
    }

    static int segstore_crc32c_vector_available(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
            && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul")
            && __builtin_cpu_supports("sse4.2");
    }
    #else
    #define SEGSTORE_CRC_VECTOR 0
    static uint32_t segstore_crc32c_vector(uint32_t crc, const uint8_t* p, size_t n) {
        (void)p; (void)n;
        return crc;
    }
    static int segstore_crc32c_vector_available(void) { return 0; }
    #endif
    """
    uint32_t segstore_crc32c_vector(uint32_t crc, const uint8_t* p, size_t n) noexcept nogil
    int segstore_crc32c_vector_available() noexcept nogil


# The routine bound to _crc_fn is the crc32c package's (not built with AddressSanitizer) on
# CPUs without AVX-512: an ASan build (setup.py's SEGSTORE_ASAN=1) checks the range each CRC
# is about to read itself, so a length that runs past its buffer is reported here.
cdef extern from *:
    """
    #if defined(__SANITIZE_ADDRESS__)
    #include <sanitizer/asan_interface.h>
    #include <stdio.h>
    #include <stdlib.h>
    static void segstore_asan_check_read(const void* p, size_t n) {
        void* bad = __asan_region_is_poisoned((void*)p, n);
        if (bad != NULL) {
            fprintf(stderr, "segstore: a CRC of %zu bytes at %p would read poisoned byte %p\\n",
                    n, p, bad);
            __asan_describe_address(bad);
            abort();
        }
    }
    #else
    #define segstore_asan_check_read(p, n) ((void)0)
    #endif
    """
    void segstore_asan_check_read(const void* p, size_t n) noexcept nogil


cdef inline uint32_t crc32c_c(const uint8_t* p, size_t n) noexcept nogil:
    segstore_asan_check_read(p, n)
    return _crc_fn(0xFFFFFFFFU, p, n) ^ 0xFFFFFFFFU


cdef bint _crc_fn_agrees(CrcFn fn):
    """Whether ``fn`` gives the package's CRC on test vectors: every length below 600 bytes
    (each path of the vector routine) at two alignments, and a few long buffers."""
    cdef const uint8_t[::1] v
    import os as _os
    data = _os.urandom(1000)
    v = data
    cdef Py_ssize_t n, off
    for n in range(1, 600):
        for off in (0, 5):
            if (fn(0xFFFFFFFFU, &v[off], n) ^ 0xFFFFFFFFU) != _crc32c_pkg(data[off:off + n]):
                return False
    for sample in (b"123456789", bytes(range(256)) * 37, _os.urandom(130_001)):
        v = sample
        if (fn(0xFFFFFFFFU, &v[0], len(sample)) ^ 0xFFFFFFFFU) != _crc32c_pkg(sample):
            return False
    return True


def _bind_crc32c(bint vector=True) -> bool:
    """Bind a C routine for GIL-free CRCs: segstore's vector routine where the CPU has it (and
    ``vector``), else the crc32c package's; False when neither can be bound or agrees with
    ``crc32c.crc32c`` on test vectors."""
    global _crc_fn, _crc_routine
    _crc_fn = NULL
    _crc_routine = "python"
    if vector and segstore_crc32c_vector_available() and _crc_fn_agrees(segstore_crc32c_vector):
        _crc_fn = segstore_crc32c_vector
        _crc_routine = "vector"
        return True
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
    if not _crc_fn_agrees(fn):
        return False
    _crc_fn = fn
    _crc_routine = "package"
    return True


def crc32c_routine() -> str:
    """Which routine computes CRCs: ``"vector"`` (segstore's AVX-512 VPCLMULQDQ folding),
    ``"package"`` (the crc32c package's C routine) or ``"python"`` (its Python function)."""
    return _crc_routine


def _crc32c_vector(data, uint32_t state=0xFFFFFFFFU):
    """Tests: the vector routine's raw state update over ``data`` (None where the CPU lacks it)."""
    if not segstore_crc32c_vector_available():
        return None
    cdef const uint8_t[::1] v = data
    return segstore_crc32c_vector(state, _ptr(v), v.shape[0])


def _unbind_crc32c() -> None:
    """Tests: compute every CRC through the Python function (the fallback path)."""
    global _crc_fn, _crc_routine
    _crc_fn = NULL
    _crc_routine = "python"


def crc32c_without_gil() -> bool:
    """Whether CRCs are computed by a C routine without the GIL (see ``crc32c_routine``)."""
    return _crc_fn != NULL


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of a buffer, computed by the crc32c package."""
    return _crc32c_pkg(_byte_buffer(data, "data"))


cdef inline _not_null_key(key):
    # A typed memoryview takes None as an empty buffer: a null key would hash like b"".
    if key is None:
        raise InvalidRecordError("a null key has no hash (Kafka's partitioner and cleaner never "
                                 "hash null keys)")


def murmur2(data) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int, like Java's Utils.murmur2."""
    _not_null_key(data)
    cdef const uint8_t[::1] v = _byte_buffer(data, "data")
    return _murmur2(_ptr(v), v.shape[0])


cdef int _partitions_arg(object num_partitions) except -1:
    cdef int64_t n = _int_arg(num_partitions, "num_partitions", InvalidArgumentError,
                              INT64_MIN_C, 0x7FFFFFFF, None, OffsetTypeError)
    if n <= 0:
        raise InvalidArgumentError(f"num_partitions must be positive, got {num_partitions}")
    return <int>n


cdef _key_column(keys):
    if not isinstance(keys, BinaryColumn):
        raise InvalidRecordError(f"keys must be a BinaryColumn, not {type(keys).__name__}")


def murmur2_partition(key, num_partitions) -> int:
    """Kafka's default partitioner for a non-null key: toPositive(murmur2(key)) % n."""
    cdef int n = _partitions_arg(num_partitions)
    _not_null_key(key)
    cdef const uint8_t[::1] v = _byte_buffer(key, "key")
    return (_murmur2(_ptr(v), v.shape[0]) & 0x7FFFFFFF) % n


def murmur2_partitions(keys, num_partitions):
    """Vectorized murmur2_partition over a BinaryColumn (int32; -1 for null keys)."""
    cdef int parts = _partitions_arg(num_partitions)
    _key_column(keys)
    cdef const uint8_t[::1] data = keys.data
    cdef const int64_t[::1] offs = keys.offsets
    cdef const uint8_t[::1] valid = keys.valid.view(np.uint8)
    cdef Py_ssize_t n = valid.shape[0], i, bad = -1
    cdef Py_ssize_t length = data.shape[0]
    if offs.shape[0] != n + 1:
        raise InvalidRecordError("keys.offsets must have one more entry than keys.valid")
    out = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] o = out
    cdef const uint8_t* d = _ptr(data)
    cdef uint64_t fm = segstore_fastmod_m(<uint32_t>parts)
    with nogil:
        for i in range(n):
            if valid[i]:
                # Every key's range is checked: a BinaryColumn does not check its offsets.
                if offs[i] < 0 or offs[i + 1] < offs[i] or offs[i + 1] > length:
                    bad = i
                    break
                o[i] = <int32_t>segstore_fastmod(
                    <uint32_t>_murmur2(d + offs[i], offs[i + 1] - offs[i]) & 0x7FFFFFFFU,
                    fm, <uint32_t>parts)
            else:
                o[i] = -1
    if bad >= 0:
        raise InvalidRecordError(f"key {bad}'s offsets lie outside keys.data")
    return out


def murmur3_128_digests(keys):
    """The MurmurHash3 x64-128 digest (the offset map's key digest) of every non-null key of a
    BinaryColumn, as a uint64 array of shape (non-null keys, 2): h1, h2 per row."""
    _key_column(keys)
    cdef const uint8_t[::1] data = keys.data
    cdef const int64_t[::1] offs = keys.offsets
    cdef const uint8_t[::1] valid = keys.valid.view(np.uint8)
    cdef Py_ssize_t n = valid.shape[0], i, j = 0, bad = -1
    if offs.shape[0] != n + 1:
        raise InvalidRecordError("keys.offsets must have one more entry than keys.valid")
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
        raise InvalidRecordError(f"key {bad}'s offsets lie outside keys.data")
    return out


def distinct_digests(digests) -> np.ndarray:
    """The distinct rows of a (n, 2) uint64 digest array (as returned by
    murmur3_128_digests), sorted."""
    d = np.asarray(digests)
    if d.size and (d.ndim != 2 or d.shape[1] != 2 or d.dtype.kind not in "iu"):
        # numpy would reshape any even count of values, cast floats or raise ValueError.
        raise InvalidArgumentError(f"digests must be an (n, 2) array of uint64, got "
                                   f"{d.dtype} of shape {d.shape}")
    d = np.ascontiguousarray(d, dtype=np.uint64).reshape(-1, 2)
    return np.unique(d.view(np.dtype((np.void, 16))).ravel()).view(np.uint64).reshape(-1, 2)


def murmur3_128(data, seed=0) -> bytes:
    """MurmurHash3 x64-128 digest (16 bytes), equal to ``mmh3.hash_bytes(data, seed)``."""
    cdef uint32_t s32 = <uint32_t>_int_arg(seed, "seed", InvalidArgumentError, 0, 0xFFFFFFFF,
                                           None, OffsetTypeError)
    _not_null_key(data)
    cdef const uint8_t[::1] v = _byte_buffer(data, "data")
    cdef uint64_t h1, h2
    cdef uint8_t out[16]
    cdef int i
    murmur3_x64_128(_ptr(v), v.shape[0], s32, &h1, &h2)
    for i in range(8):
        out[i] = <uint8_t>(h1 >> (8 * i))
        out[8 + i] = <uint8_t>(h2 >> (8 * i))
    return PyBytes_FromStringAndSize(<char*>out, 16)
