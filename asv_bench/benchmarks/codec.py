"""Record batch codec: segstore's compiled core against aiokafka 0.14's Cython codec and crc32c.

Data (the performance issue's): 1,000,000 records, 16-byte keys, 100-byte values, 1,000 records
per uncompressed v2 batch, built once by :func:`.common.codec_dataset_cache`. Targets, measured
against aiokafka in the same run:

* column decode with CRC validation >= 10x aiokafka's parse-and-iterate-with-CRC rate;
* column encode >= 10x aiokafka's ``DefaultRecordBatchBuilder`` rate;
* object decode >= aiokafka's rate;
* CRC validation alone at the ``crc32c`` package's speed on the same bytes.

The ``time_*`` benchmarks come in pairs (segstore / baseline) over identical inputs; the
``track_ratio_*`` benchmarks time both sides inside one call (best of a few interleaved repeats,
garbage collector off) and return ``baseline_time / segstore_time``, so one ``asv run`` prints
the ratios directly (unit "x": above 1 means segstore is faster). The ratio tracks use the full
1M-record data set.

Fairness notes: the aiokafka side gets its input already split into one ``bytes`` per batch (the
split happens in ``setup``, untimed), and its encoder output is left as a list of per-batch
``bytearray`` objects (never joined), while segstore returns one contiguous ``bytes``.
"""

from __future__ import annotations

import crc32c

from segstore import _core
from segstore.columns import BinaryColumn

from .common import (
    RECORDS_PER_BATCH,
    best_of_pair,
    buffer_pool_off,
    bytes_list,
    codec_dataset_cache,
    crc_slices,
    load_columns,
    load_log,
    require_aiokafka,
    split_batches,
)

# --------------------------------------------------------------------------------------------
# The workloads, shared by the time_ benchmarks and the ratio tracks so both measure the same code.


def _segstore_decode_columns(buf):
    return _core.decode_columns(buf, validate_crc=True)


def _segstore_decode_records(buf):
    """Every record of the log into one list (validate_crc=True is the default)."""
    return _core.decode_records(buf)


def _segstore_decode_records_stream(batches):
    """A consumer's loop: decode one batch at a time, touch every key and value, keep nothing."""
    decode = _core.decode_records
    for raw in batches:
        for rec in decode(raw):
            rec.key
            rec.value


def _aiokafka_decode(batch_cls, batches):
    """aiokafka's consumer path: parse each batch, validate its CRC, touch every key and value."""
    for raw in batches:
        batch = batch_cls(raw)
        if not batch.validate_crc():
            raise AssertionError("aiokafka: CRC mismatch")
        for rec in batch:
            rec.key
            rec.value


def _aiokafka_decode_list(batch_cls, batches):
    """aiokafka's records of the whole log collected into one list, CRCs validated."""
    out = []
    for raw in batches:
        batch = batch_cls(raw)
        if not batch.validate_crc():
            raise AssertionError("aiokafka: CRC mismatch")
        out.extend(batch)
    return out


def _segstore_encode_columns(values_col, keys_col, timestamps):
    return _core.encode_columns(values_col, keys_col, timestamps,
                                records_per_batch=RECORDS_PER_BATCH)


def _segstore_encode_batch(chunks):
    """One ``encode_batch`` call per 1,000-record slice of Python lists (pre-sliced in setup)."""
    return [_core.encode_batch(values, keys, timestamps_ms=timestamps, base_offset=base)
            for base, values, keys, timestamps in chunks]


def _aiokafka_encode(builder_cls, values, keys, timestamps):
    """aiokafka's producer path: one DefaultRecordBatchBuilder per 1,000 records, then build()."""
    out = []
    n = len(values)
    for lo in range(0, n, RECORDS_PER_BATCH):
        hi = min(lo + RECORDS_PER_BATCH, n)
        builder = builder_cls(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                              producer_epoch=-1, base_sequence=-1, batch_size=2**31 - 1)
        append = builder.append
        for i in range(lo, hi):
            # aiokafka's builder writes base offset 0, so `offset` is the offset within the batch.
            append(offset=i - lo, timestamp=timestamps[i], key=keys[i], value=values[i],
                   headers=[])
        out.append(builder.build())
    return out


def _segstore_crc_validate(buf):
    return _core.scan_batches(buf, validate_crc=True)


def _crc32c_per_batch(slices):
    for view in slices:
        crc32c.crc32c(view)


def _crc32c_whole(buf):
    crc32c.crc32c(buf)


SMALL_BATCHES = 50   # a range read under the column decode's two-thread threshold (8 MiB)


def _ratio(t_baseline, t_segstore):
    return round(t_baseline / t_segstore, 3)


def _encode_batch_chunks(value_list, key_list, ts_list):
    return [(lo, value_list[lo:lo + RECORDS_PER_BATCH], key_list[lo:lo + RECORDS_PER_BATCH],
             ts_list[lo:lo + RECORDS_PER_BATCH])
            for lo in range(0, len(value_list), RECORDS_PER_BATCH)]


# --------------------------------------------------------------------------------------------
# Wall time, in pairs.


class Decode:
    """Decode the whole 1M-record log (about 127 MB), CRCs validated on both sides."""

    setup_cache = codec_dataset_cache
    number = 1
    repeat = (3, 10, 10.0)
    timeout = 300

    def setup(self, meta):
        self.batch_cls, _ = require_aiokafka()
        self.buf = load_log(meta)
        self.batches = split_batches(self.buf, meta)

    def time_decode_columns_segstore(self, meta):
        _segstore_decode_columns(self.buf)

    def time_decode_records_segstore(self, meta):
        _segstore_decode_records(self.buf)

    def time_decode_records_stream_segstore(self, meta):
        _segstore_decode_records_stream(self.batches)

    def time_decode_aiokafka(self, meta):
        _aiokafka_decode(self.batch_cls, self.batches)

    def time_decode_aiokafka_list(self, meta):
        _aiokafka_decode_list(self.batch_cls, self.batches)


class Encode:
    """Encode 1M records into 1,000-record batches."""

    setup_cache = codec_dataset_cache
    number = 1
    repeat = (3, 10, 10.0)
    timeout = 300

    def setup(self, meta):
        _, self.builder_cls = require_aiokafka()
        keys, values, timestamps = load_columns(meta)
        self.keys_col = BinaryColumn.from_fixed(keys)
        self.values_col = BinaryColumn.from_fixed(values)
        self.timestamps = timestamps
        self.key_list = bytes_list(keys)
        self.value_list = bytes_list(values)
        self.ts_list = timestamps.tolist()
        self.chunks = _encode_batch_chunks(self.value_list, self.key_list, self.ts_list)

    def time_encode_columns_segstore(self, meta):
        _segstore_encode_columns(self.values_col, self.keys_col, self.timestamps)

    def time_encode_batch_segstore(self, meta):
        _segstore_encode_batch(self.chunks)

    def time_encode_aiokafka(self, meta):
        _aiokafka_encode(self.builder_cls, self.value_list, self.key_list, self.ts_list)


class CRC:
    """CRC-32C validation of every batch of the log (bytes ``[position + 21, position + size)``)."""

    setup_cache = codec_dataset_cache
    timeout = 300

    def setup(self, meta):
        self.buf = load_log(meta)
        self.slices = crc_slices(self.buf, meta)

    def time_crc_validate_segstore(self, meta):
        _segstore_crc_validate(self.buf)

    def time_crc32c_package(self, meta):
        """One crc32c call per batch, over pre-made memoryview slices."""
        _crc32c_per_batch(self.slices)

    def time_crc32c_package_whole_buffer(self, meta):
        """The ideal: one crc32c call over the whole log (no batch walking at all)."""
        _crc32c_whole(self.buf)


# --------------------------------------------------------------------------------------------
# Memory.


class DecodeMemory:
    """Peak RSS of the benchmark process: loaded log (about 127 MB) plus the decode.

    ``peakmem_decode_baseline`` does nothing after the same setup; subtract it to get the decode's
    own footprint.
    """

    setup_cache = codec_dataset_cache
    timeout = 300

    def setup(self, meta):
        self.buf = load_log(meta)

    def peakmem_decode_baseline(self, meta):
        pass

    def peakmem_decode_columns(self, meta):
        _segstore_decode_columns(self.buf)


# --------------------------------------------------------------------------------------------
# Ratios (baseline time / segstore time, best of interleaved repeats inside one call).


class RatioDecode:
    """Decode ratios on the full 1M-record data set; targets: columns >= 10x, records >= 1x."""

    setup_cache = codec_dataset_cache
    unit = "x"
    timeout = 300
    repeats = 7   # the pool needs a run or two to settle; both sides get the same runs

    def setup(self, meta):
        self.batch_cls, _ = require_aiokafka()
        self.buf = load_log(meta)
        self.batches = split_batches(self.buf, meta)

    def _columns_ratio(self):
        t_aiokafka, t_segstore = best_of_pair(
            lambda: _aiokafka_decode(self.batch_cls, self.batches),
            lambda: _segstore_decode_columns(self.buf), self.repeats)
        return _ratio(t_aiokafka, t_segstore)

    def track_ratio_decode_columns_vs_aiokafka(self, meta):
        return self._columns_ratio()

    def track_ratio_decode_columns_small_vs_aiokafka(self, meta):
        """The first SMALL_BATCHES batches (50,000 records, about 6.3 MB): a range read below
        the two-thread threshold, decoded on one thread (the size most range reads have)."""
        small = self.buf[:sum(meta["sizes"][:SMALL_BATCHES])]
        batches = self.batches[:SMALL_BATCHES]
        t_aiokafka, t_segstore = best_of_pair(
            lambda: _aiokafka_decode(self.batch_cls, batches),
            lambda: _segstore_decode_columns(small), 4 * self.repeats)
        return _ratio(t_aiokafka, t_segstore)

    def track_ratio_decode_columns_unpooled_vs_aiokafka(self, meta):
        """The same with segstore's buffer pool off: every output array in fresh memory (the
        first read of a process; the track above is the steady state of repeated reads)."""
        with buffer_pool_off():
            return self._columns_ratio()

    def track_ratio_decode_records_vs_aiokafka(self, meta):
        """Like for like, one batch at a time: both parse, check the CRC, build each record
        object, touch its key and value and drop it."""
        t_aiokafka, t_segstore = best_of_pair(
            lambda: _aiokafka_decode(self.batch_cls, self.batches),
            lambda: _segstore_decode_records_stream(self.batches), self.repeats)
        return _ratio(t_aiokafka, t_segstore)

    def track_ratio_decode_records_gc_vs_aiokafka(self, meta):
        """The batch-at-a-time loop with the garbage collector on, as in a consumer process:
        records the collector must track (and rescan while they live) cost more than their
        allocation."""
        t_aiokafka, t_segstore = best_of_pair(
            lambda: _aiokafka_decode(self.batch_cls, self.batches),
            lambda: _segstore_decode_records_stream(self.batches), self.repeats, collector=True)
        return _ratio(t_aiokafka, t_segstore)

    def track_ratio_decode_records_list_vs_aiokafka_list(self, meta):
        """Like for like, the whole log kept: one list of 1M record objects on each side."""
        t_aiokafka, t_segstore = best_of_pair(
            lambda: _aiokafka_decode_list(self.batch_cls, self.batches),
            lambda: _segstore_decode_records(self.buf), self.repeats)
        return _ratio(t_aiokafka, t_segstore)


class RatioEncode:
    """Encode ratios on the full 1M-record data set; target: columns >= 10x."""

    setup_cache = codec_dataset_cache
    unit = "x"
    timeout = 300
    repeats = 3

    def setup(self, meta):
        _, self.builder_cls = require_aiokafka()
        keys, values, timestamps = load_columns(meta)
        self.keys_col = BinaryColumn.from_fixed(keys)
        self.values_col = BinaryColumn.from_fixed(values)
        self.timestamps = timestamps
        self.key_list = bytes_list(keys)
        self.value_list = bytes_list(values)
        self.ts_list = timestamps.tolist()

    def _aiokafka(self):
        _aiokafka_encode(self.builder_cls, self.value_list, self.key_list, self.ts_list)

    def track_ratio_encode_columns_vs_aiokafka(self, meta):
        t_aiokafka, t_segstore = best_of_pair(
            self._aiokafka,
            lambda: _segstore_encode_columns(self.values_col, self.keys_col, self.timestamps),
            self.repeats)
        return _ratio(t_aiokafka, t_segstore)

    def track_ratio_encode_batch_vs_aiokafka(self, meta):
        chunks = _encode_batch_chunks(self.value_list, self.key_list, self.ts_list)
        t_aiokafka, t_segstore = best_of_pair(
            self._aiokafka, lambda: _segstore_encode_batch(chunks), self.repeats)
        return _ratio(t_aiokafka, t_segstore)


class RatioCRC:
    """CRC validation speed relative to the crc32c package (target: about 1x, i.e. its speed)."""

    setup_cache = codec_dataset_cache
    unit = "x"
    timeout = 300
    repeats = 7

    def setup(self, meta):
        self.buf = load_log(meta)
        self.slices = crc_slices(self.buf, meta)

    def track_ratio_crc_validate_vs_crc32c(self, meta):
        """crc32c per batch (memoryview slices) / segstore scan_batches(validate_crc=True)."""
        t_crc32c, t_segstore = best_of_pair(
            lambda: _crc32c_per_batch(self.slices),
            lambda: _segstore_crc_validate(self.buf), self.repeats)
        return _ratio(t_crc32c, t_segstore)

    def track_ratio_crc_validate_vs_crc32c_whole_buffer(self, meta):
        """crc32c over the whole log in one call (the ideal) / segstore's validating scan."""
        t_crc32c, t_segstore = best_of_pair(
            lambda: _crc32c_whole(self.buf),
            lambda: _segstore_crc_validate(self.buf), self.repeats)
        return _ratio(t_crc32c, t_segstore)


class Partitioner:
    """Kafka's default partitioner over the data set's 16-byte keys into 4 partitions:
    ``murmur2_partitions`` over a key column (what a Spark write routes every input batch
    with) against kafka-python's ``murmur2`` called per key, the pure-Python way, on the
    first 100,000 keys (both sides the same keys). No target: it tracks the routing kernel."""

    setup_cache = codec_dataset_cache
    unit = "x"
    timeout = 300
    repeats = 3
    N_KEYS = 100_000

    def setup(self, meta):
        from kafka.partitioner.default import murmur2

        keys, _, _ = load_columns(meta)
        self.keys_col = BinaryColumn.from_fixed(keys)
        self.some_col = BinaryColumn.from_fixed(keys[:self.N_KEYS])
        self.some_list = bytes_list(keys[:self.N_KEYS])
        self.kafka_murmur2 = murmur2

    def _kafka_python(self):
        return [(self.kafka_murmur2(k) & 0x7FFFFFFF) % 4 for k in self.some_list]

    def time_murmur2_partitions_segstore(self, meta):
        """All 1M keys."""
        _core.murmur2_partitions(self.keys_col, 4)

    def track_ratio_murmur2_partitions_vs_kafka_python(self, meta):
        t_kafka, t_segstore = best_of_pair(
            self._kafka_python, lambda: _core.murmur2_partitions(self.some_col, 4),
            self.repeats)
        return _ratio(t_kafka, t_segstore)
