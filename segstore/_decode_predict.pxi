# Placing a large column decode's batches by predicted sizes, with no counting pass.
# Included by _decode.pxi; shares _core's namespace.
#
# The counting pass exists to tell each batch where its output starts. A log written by one
# producer setting (fixed-size records, a fixed batch size) holds long runs of batches with the
# same record count and the same record bytes, whose outputs are almost always the same size
# too. Such a run is placed by one counted batch: the others are predicted to need what it
# needs. Then there is no counting pass: both threads check each batch's CRC and copy it in
# one pass, while its bytes are hot, and the input is read from memory once instead of twice.
# The fill already stops at any batch that does not fill its place exactly (ST_CHANGED); here
# that means a wrong prediction, and the decode falls back to counting every batch, as it
# does at any damage (so the first damage in batch order is the one named).

# At most one batch in PREDICT_RUN (plus two) may be counted to predict the others, at every
# point of the range: past that the batches vary too much for a one-thread count before the
# fill to beat the parallel counting pass, and a log of varied batches gives up after three.
cdef Py_ssize_t PREDICT_RUN = 16
cdef bint PREDICT_SIZES = True
cdef int64_t _predicted = 0      # decodes placed by prediction
cdef int64_t _fallbacks = 0      # ... that fell back to counting


def _set_predict_sizes(bint on):
    """Tune (off: always count) the placement of large decodes by predicted sizes; returns the
    previous setting."""
    global PREDICT_SIZES
    old = PREDICT_SIZES
    PREDICT_SIZES = on
    return old


def _prediction_stats():
    """(decodes placed by predicted sizes, of which fell back to counting), since the start."""
    return _predicted, _fallbacks


cdef bint _predict_sizes(_DecodeJob job, int64_t limit, bint validate_crc) noexcept:
    """Give every batch of a large whole-range decode (no max_records, no headers) its
    predicted size in ``job.outs``. False (``job.outs`` left clear for the counting pass) when
    the decode is not such a decode or its batches cannot be predicted."""
    if not PREDICT_SIZES or not _large_whole_read(job, limit, validate_crc):
        return False
    if _predict_each(job):
        return True
    _clear_outs(job)
    return False


cdef enum:
    PREDICT_SAMPLES = 4   # recent counted batches a batch is compared with


cdef bint _predict_each(_DecodeJob job) noexcept:
    """The sizes of _predict_sizes: a batch like one of the last few counted (the same record
    count and record bytes, all its records selected) needs what that one needed; any other
    is counted by its lengths (or in full, when only some of its records are selected).
    Several samples are kept so that a short batch where a producer's chunk ended does not
    start the run after it anew. False when too many batches would need counting, or a count
    meets anything unusual (the counting pass then names any damage)."""
    cdef _Regions regs = job.regs
    cdef Py_ssize_t i, counted = 0, err
    cdef Py_ssize_t samples[PREDICT_SAMPLES]
    cdef int k, n_samples = 0
    cdef Region* reg
    cdef const Region* like
    cdef ColumnSink s
    for i in range(regs.n):
        reg = &regs.items[i]
        memset(&s, 0, sizeof(ColumnSink))
        if not _taken_whole(reg, job.lo, job.hi):
            # One of the (at most two) batches holding lo and hi: counted in full.
            if decode_region_columns(reg, reg.header, job.lo, job.hi, INT64_MAX_C, False, &s,
                                     NULL, &err) != ST_OK:
                return False
            job.outs[i].size = s.at
            continue
        for k in range(n_samples):
            like = &regs.items[samples[k]]
            if (reg.header.records_count == like.header.records_count
                    and reg.end - reg.start == like.end - like.start):
                job.outs[i].size = job.outs[samples[k]].size
                break
        else:
            counted += 1
            if counted > i // PREDICT_RUN + 2 or not count_region_sizes(reg, reg.header, &s):
                return False
            job.outs[i].size = s.at
            # The newest sample first; the oldest drops out.
            n_samples = min(n_samples + 1, PREDICT_SAMPLES)
            for k in range(n_samples - 1, 0, -1):
                samples[k] = samples[k - 1]
            samples[0] = i
    return True


cdef object _decode_predicted(_DecodeJob job, bint headers, topic, partition):
    """Fill the batches _predict_sizes placed, each CRC checked just before its copy, on two
    threads. Returns the columns, or None (``job.outs`` cleared for the counting pass) when a
    prediction was wrong or a batch is damaged: the fill stops at the first damage each
    thread meets, and the counting pass names the first in batch order."""
    global _predicted, _fallbacks
    cdef Py_ssize_t i, n = job.regs.n
    _place_outputs(job, n, INT64_MAX_C)
    if job.total.n == 0:
        _clear_outs(job)
        return None
    job.cap = job.total
    arrays = _arrays_for_fill(job, headers)
    _predicted += 1
    job.crc_in_fill = True
    _fill_placed(job, n)
    job.crc_in_fill = False
    for i in range(n):
        if job.outs[i].status != ST_OK:
            _fallbacks += 1
            # Both threads are done with the arrays: they go back to the pool before the
            # counting pass sizes new ones.
            job.keep.remove(arrays)
            _clear_outs(job)
            return None
    return arrays.columns(&job.total, headers, topic, partition)
