# A short spin before a thread sleeps, for the cleaner's two threads meeting between phases.
# Included by _core.pyx; shares its namespace.
#
# On the VMs this project is measured on, a thread woken from sleep started 0.5 - 0.7 ms after
# the wake-up call (its idle virtual CPU has to be scheduled again), a third of the offset
# map merge that follows the meeting. A spin keeps the CPU busy for at most a bounded time,
# then the caller falls back to sleeping.

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef extern from *:
    """
    #if defined(__x86_64__) || defined(__i386__)
    #include <immintrin.h>
    #define SEGSTORE_CPU_RELAX() _mm_pause()
    #elif defined(__aarch64__)
    #define SEGSTORE_CPU_RELAX() __asm__ __volatile__("yield")
    #else
    #define SEGSTORE_CPU_RELAX() ((void)0)
    #endif
    #define SEGSTORE_LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
    #define SEGSTORE_STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    """
    void SEGSTORE_CPU_RELAX() noexcept nogil
    int64_t SEGSTORE_LOAD_ACQUIRE(const int64_t* p) noexcept nogil
    void SEGSTORE_STORE_RELEASE(int64_t* p, int64_t v) noexcept nogil


cdef int64_t* _flag(object flags, object index) except NULL:
    cdef int64_t[::1] view = _int_array(flags, "flags", np.int64, True)
    cdef int64_t i = _i64_arg(index, "index", InvalidArgumentError)
    if not 0 <= i < view.shape[0]:
        raise InvalidArgumentError(f"flag {i} is outside the {view.shape[0]} flags")
    return &view[i]   # the caller holds ``flags``, whose buffer outlives this view


def spin_set(flags, index, value) -> None:
    """Set ``flags[index]`` for a thread in :func:`spin_wait`, after (in memory order) every
    write this thread made before."""
    cdef int64_t v = _i64_arg(value, "value", InvalidArgumentError)
    SEGSTORE_STORE_RELEASE(_flag(flags, index), v)


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


def spin_wait(flags, index, double seconds) -> int:
    """Spin without the GIL until ``flags[index]`` is not 0, for at most ``seconds``; the
    value seen (0 when the time ran out). Another thread sets the flag with
    :func:`spin_set`."""
    cdef const int64_t* p = _flag(flags, index)
    cdef int64_t v = 0, deadline
    cdef int n
    with nogil:
        deadline = _now_ns() + <int64_t>(seconds * 1e9)
        while True:
            for n in range(256):
                v = SEGSTORE_LOAD_ACQUIRE(p)
                if v != 0:
                    break
                SEGSTORE_CPU_RELAX()
            if v != 0 or _now_ns() >= deadline:
                break
    return v
