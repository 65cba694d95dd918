"""Byte-level codec tests of ``segstore._core`` against independent oracles and golden vectors.

Oracles: kafka-python (pure Python; ships gzip only unless python-snappy/lz4/zstandard are
installed) and aiokafka (Cython; every codec through cramjam), ``crc32c`` and ``mmh3``. Golden
vectors: the kafka-python/aiokafka transactional batch with CRC 3950153926, the REF §9 batch and
COMMIT marker (verified against kafka-python and the crc32c package), Kafka's UtilsTest murmur2
values and the CRC-32C check value.
"""

from __future__ import annotations

import gc
import gzip
import mmap
import struct
import sys
import time
import tracemalloc
import weakref

import crc32c as crc32c_pkg
import kafka.codec as kp_codec
import mmh3
import numpy as np
import pytest
from aiokafka import codec as aio_codec
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.partitioner.default import murmur2 as kp_murmur2
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder as KpLegacyBuilder
from kafka.record.memory_records import MemoryRecords as KpMemoryRecords
from kafka.record.memory_records import MemoryRecordsBuilder as KpMemoryRecordsBuilder

from conftest import (batch_spans, check_columns, columns_tuples, fix_crc, guarded_copy,
                      legacy_message, legacy_wrapper, rec_tuple, run_in_child, v2_header)
from segstore import _core
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError, InvalidRecordError
from segstore.records import ConsumerRecord, ControlRecordType

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
_KP_HAS = {NONE: lambda: True, GZIP: kp_codec.has_gzip, SNAPPY: kp_codec.has_snappy,
           LZ4: kp_codec.has_lz4, ZSTD: kp_codec.has_zstd}
_AIO_HAS = {NONE: lambda: True, GZIP: aio_codec.has_gzip, SNAPPY: aio_codec.has_snappy,
            LZ4: aio_codec.has_lz4, ZSTD: aio_codec.has_zstd}
# Which codecs each oracle can build and read in this environment (kafka-python: none + gzip here).
ORACLE_CODECS = {"kafka-python": [c for c in ALL_CODECS if _KP_HAS[c]()],
                 "aiokafka": [c for c in ALL_CODECS if _AIO_HAS[c]()]}
ORACLE_CASES = [(lib, c) for lib, codecs in ORACLE_CODECS.items() for c in codecs]

T0 = 1_700_000_000_000
# (timestamp, key, value, headers): null keys and values, a tombstone, empty key/value, null and
# empty header values, repeated and non-ASCII header keys, a negative timestamp delta, and values
# that compress well (oracle builders fall back to no compression when it does not help).
SAMPLE = [
    (T0, b"key-0", b"value-0 " * 40, []),
    (T0 + 7, None, b"no key here", [("h", b"v")]),
    (T0 - 3, b"tombstone", None, []),
    (T0 + 2, b"empty-value", b"", [("null-header", None), ("empty-header", b"")]),
    (T0 + 1000, b"", b"empty key", [("\u00fcn\u00efc\u00f8d\u00e9-\u043a\u043b\u044e\u0447",
                                     b"\x00\xff")]),
    (T0 + 1, None, None, []),
    (T0 + 5, b"k" * 300, bytes(range(256)) * 4, [("a", b"1"), ("b", b"2"), ("a", b"3")]),
]

# REF §9 self-check vectors (re-verified with kafka-python's DefaultRecordBatch and crc32c).
REF_TWO_RECORDS = bytes.fromhex(
    "0000000000000000" "00000042" "ffffffff" "02" "0e1140d2" "0000" "00000001"
    "0000018bcfe56800" "0000018bcfe56805" "ffffffffffffffff" "ffff" "ffffffff" "00000002"
    "1000000002" "6b" "02" "76" "00" "0e000a02026b0100")
REF_COMMIT = bytes.fromhex(
    "0000000000000002" "00000042" "00000000" "02" "edd683a7" "0030" "00000000"
    "0000018bcfe56800" "0000018bcfe56800" "0000000000000007" "0000" "ffffffff" "00000001"
    "2000000008" "00000001" "0c" "000000000000" "00")


# ----------------------------------------------------------------------------------------------
# helpers


def model(records, base_offset=0, deltas=None, ts_type=0, lat=None):
    """Expected decode of ``(ts, key, value, headers)`` records as rec_tuple()s."""
    deltas = range(len(records)) if deltas is None else deltas
    return [(base_offset + d, ts if lat is None else lat, 1 if lat is not None else ts_type,
             k, v, list(h)) for d, (ts, k, v, h) in zip(deltas, records)]


def build_oracle_batch(lib, records, codec=NONE, *, transactional=False, producer_id=-1,
                       producer_epoch=-1, base_sequence=-1, first_delta=0) -> bytes:
    """One v2 batch written by kafka-python or aiokafka (base offset 0)."""
    cls = KpBuilder if lib == "kafka-python" else AioBuilder
    b = cls(magic=2, compression_type=codec, is_transactional=transactional,
            producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence, batch_size=1 << 24)
    for i, (ts, key, value, headers) in enumerate(records):
        assert b.append(first_delta + i, timestamp=ts, key=key, value=value,
                        headers=list(headers)) is not None
    buf = bytes(b.build())
    assert buf[22] & 0x07 == codec, "oracle fell back to no compression; use compressible data"
    return buf


def oracle_batch_cls(lib):
    return KpBatch if lib == "kafka-python" else AioBatch


def oracle_records(lib, buf) -> list[tuple]:
    """Records of one v2 batch as decoded by an oracle (CRC checked first)."""
    batch = oracle_batch_cls(lib)(bytes(buf))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, [tuple(h) for h in r.headers])
            for r in batch]


def oracle_log_records(buf, lib="aiokafka") -> list[tuple]:
    """Non-control records of a concatenation of v2 batches as read by an oracle MemoryRecords."""
    mr = (AioMemoryRecords if lib == "aiokafka" else KpMemoryRecords)(bytes(buf))
    out = []
    while mr.has_next():
        batch = mr.next_batch()
        assert batch.validate_crc()
        if not batch.is_control_batch:
            out += [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
                     [tuple(h) for h in r.headers]) for r in batch]
    return out


def encode(records, **kw) -> bytes:
    """segstore.encode_batch of ``(ts, key, value, headers)`` records."""
    ts, keys, values, headers = (list(x) for x in zip(*records))
    return _core.encode_batch(values, keys=keys, headers=headers, timestamps_ms=ts, **kw)


def decoded(buf, *args, **kw) -> list[tuple]:
    return [rec_tuple(r) for r in _core.decode_records(buf, *args, **kw)]


def decoded_columns(buf, *args, **kw) -> list[tuple]:
    cols = _core.decode_columns(buf, *args, include_headers=True, **kw)
    check_columns(cols)
    return columns_tuples(cols)


def row_dict(row) -> dict:
    return {name: int(row[name]) for name in _core.BATCH_DTYPE.names}


def oracle_header(buf, pos=0) -> dict:
    """Header fields of the v2 batch at ``pos`` as kafka-python's DefaultRecordBatch sees them."""
    size = 12 + struct.unpack_from(">i", buf, pos + 8)[0]
    b = KpBatch(bytes(buf[pos:pos + size]))
    return dict(position=pos, size=b.size_in_bytes, base_offset=b.base_offset,
                last_offset=b.last_offset, base_timestamp=b.first_timestamp,
                max_timestamp=b.max_timestamp, producer_id=b.producer_id,
                partition_leader_epoch=b.leader_epoch, last_offset_delta=b.last_offset_delta,
                base_sequence=b.base_sequence, records_count=b.records_count, crc=b.crc,
                attributes=b.attributes, producer_epoch=b.producer_epoch, magic=b.magic)


def assert_scan_matches_oracle(buf):
    res = _core.scan_batches(buf, validate_crc=True)
    spans = batch_spans(buf)
    assert [row_dict(r) for r in res.batches] == [oracle_header(buf, p) for p, _ in spans]
    assert res.valid_end == len(buf) and not res.torn and res.error is None


def set_offset_and_epoch(buf: bytearray, pos, base_offset, leader_epoch=None):
    """Patch bytes 0-8 (and 12-16) of a batch with struct: neither is covered by the CRC."""
    struct.pack_into(">q", buf, pos, base_offset)
    if leader_epoch is not None:
        struct.pack_into(">i", buf, pos + 12, leader_epoch)


def header_size(headers):
    """kafka-python's serialized_header_size: -1 without headers."""
    if not headers:
        return -1
    return sum(len(k.encode()) + (len(v) if v is not None else 0) for k, v in headers)


def random_keys(n, seed, max_len=64):
    """``n`` random byte strings: every length 0..max_len, the rest uniformly random lengths."""
    rng = np.random.default_rng(seed)
    lens = np.concatenate([np.arange(max_len + 1), rng.integers(0, max_len + 1, n - max_len - 1)])
    blob = rng.bytes(int(lens.sum()))
    ends = np.cumsum(lens)
    return [blob[s:e] for s, e in zip((ends - lens).tolist(), ends.tolist())]


def signed32(h):
    return h - (1 << 32) if h >= 1 << 31 else h


# ----------------------------------------------------------------------------------------------
# module surface and CRC-32C


def test_module_constants():
    assert _core.V2_HEADER_SIZE == 61
    assert _core.LOG_OVERHEAD == 12
    fields = {"position": "i8", "base_offset": "i8", "last_offset": "i8", "base_timestamp": "i8",
              "max_timestamp": "i8", "producer_id": "i8", "size": "i4",
              "partition_leader_epoch": "i4", "last_offset_delta": "i4", "base_sequence": "i4",
              "records_count": "i4", "crc": "u4", "attributes": "i2", "producer_epoch": "i2",
              "magic": "i1"}
    dt = _core.BATCH_DTYPE
    assert set(dt.names) == set(fields)
    for name, code in fields.items():
        assert dt.fields[name][0] == np.dtype(code), name


def test_crc32c_check_value():
    assert _core.crc32c(b"123456789") == 0xE3069283


def test_crc32c_matches_crc32c_package():
    rng = np.random.default_rng(7)
    for n in list(range(0, 70)) + [255, 256, 1000, 4096, 65537]:
        data = rng.bytes(n)
        want = crc32c_pkg.crc32c(data)
        assert _core.crc32c(data) == want
        assert _core.crc32c(bytearray(data)) == want
        assert _core.crc32c(memoryview(b"xx" + data)[2:]) == want
        assert _core.crc32c(np.frombuffer(data, dtype=np.uint8)) == want


# ----------------------------------------------------------------------------------------------
# golden vectors


def golden_inputs():
    n = 10
    return dict(values=[b"Super"] * n, keys=[b"test"] * n,
                headers=[[("header1", b"aaa"), ("header2", b"bbb")]] * n,
                timestamps_ms=[9999999 + i for i in range(n)])


def test_golden_kafka_python_transactional_batch():
    g = golden_inputs()
    records = list(zip(g["timestamps_ms"], g["keys"], g["values"], g["headers"]))
    oracle = build_oracle_batch("kafka-python", records, transactional=True,
                                producer_id=123456, producer_epoch=123, base_sequence=9999)
    assert KpBatch(oracle).crc == 3950153926 and len(oracle) == 461

    ours = _core.encode_batch(g["values"], keys=g["keys"], headers=g["headers"],
                              timestamps_ms=g["timestamps_ms"], is_transactional=True,
                              producer_id=123456, producer_epoch=123, base_sequence=9999,
                              partition_leader_epoch=0)
    assert v2_header(ours)["crc"] == 3950153926
    assert ours == oracle
    # The default leader epoch (-1) is what aiokafka writes; the CRC does not cover it.
    default_epoch = _core.encode_batch(g["values"], keys=g["keys"], headers=g["headers"],
                                       timestamps_ms=g["timestamps_ms"], is_transactional=True,
                                       producer_id=123456, producer_epoch=123,
                                       base_sequence=9999)
    assert default_epoch == build_oracle_batch("aiokafka", records, transactional=True,
                                               producer_id=123456, producer_epoch=123,
                                               base_sequence=9999)

    expected = model(records)
    assert decoded(oracle) == expected
    assert decoded_columns(oracle) == expected
    (row,) = _core.scan_batches(oracle, validate_crc=True).batches
    assert row_dict(row) == oracle_header(oracle)
    assert row["crc"] == 3950153926 and row["attributes"] == 0x10
    assert (row["producer_id"], row["producer_epoch"], row["base_sequence"]) == (123456, 123, 9999)


def test_golden_batch_moved_to_offset_1000_keeps_crc():
    g = golden_inputs()
    buf = bytearray(_core.encode_batch(g["values"], keys=g["keys"], headers=g["headers"],
                                       timestamps_ms=g["timestamps_ms"], is_transactional=True,
                                       producer_id=123456, producer_epoch=123,
                                       base_sequence=9999, partition_leader_epoch=0))
    patched = bytearray(buf)
    set_offset_and_epoch(patched, 0, 1000, 42)
    _core.set_base_offset(buf, 0, 1000, partition_leader_epoch=42)
    assert buf == patched
    assert KpBatch(bytes(buf)).validate_crc() and KpBatch(bytes(buf)).crc == 3950153926
    assert [r[0] for r in decoded(buf)] == list(range(1000, 1010))
    assert {r.leader_epoch for r in _core.decode_records(buf)} == {42}
    # Without the epoch argument only the base offset changes.
    _core.set_base_offset(buf, 0, 7)
    assert v2_header(buf)["base_offset"] == 7 and v2_header(buf)["partition_leader_epoch"] == 42


def test_ref_vectors_are_well_formed():
    for vector in (REF_TWO_RECORDS, REF_COMMIT):
        assert len(vector) == 78 and KpBatch(vector).validate_crc()


def test_ref_two_record_vector_decodes():
    recs = _core.decode_records(REF_TWO_RECORDS)
    assert [rec_tuple(r) for r in recs] == [(0, T0, 0, b"k", b"v", []),
                                            (1, T0 + 5, 0, b"k", None, [])]
    assert decoded_columns(REF_TWO_RECORDS) == [rec_tuple(r) for r in recs]
    assert_scan_matches_oracle(REF_TWO_RECORDS)


def test_ref_two_record_vector_encodes_byte_for_byte():
    ours = _core.encode_batch([b"v", None], keys=[b"k", b"k"], timestamps_ms=[T0, T0 + 5])
    assert len(ours) == 78
    assert ours == REF_TWO_RECORDS


def test_ref_commit_vector_encodes_byte_for_byte():
    ours = _core.encode_control_batch(ControlRecordType.COMMIT, producer_id=7, producer_epoch=0,
                                      coordinator_epoch=0, base_offset=2, timestamp_ms=T0,
                                      partition_leader_epoch=0)
    assert len(ours) == 78
    assert ours == REF_COMMIT


def test_murmur2_java_golden_values():
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    for key, want in cases.items():
        assert _core.murmur2(key) == want, key


# ----------------------------------------------------------------------------------------------
# oracle batches -> segstore


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "txn"])
@pytest.mark.parametrize("lib,codec", ORACLE_CASES)
def test_oracle_batch_decodes_identically(lib, codec, transactional):
    producer = dict(producer_id=4242, producer_epoch=3, base_sequence=17) if transactional else {}
    buf = build_oracle_batch(lib, SAMPLE, codec, transactional=transactional, **producer)
    expected = oracle_records(lib, buf)
    assert expected == model(SAMPLE)  # the oracle reads back what it was given

    assert decoded(buf) == expected
    assert decoded_columns(buf) == expected
    plain = _core.decode_columns(buf)
    assert plain.headers is None
    assert columns_tuples(plain, with_headers=False) == [e[:5] + (None,) for e in expected]
    assert_scan_matches_oracle(buf)
    row = row_dict(_core.scan_batches(buf).batches[0])
    assert row["attributes"] & 0x07 == codec
    assert bool(row["attributes"] & 0x10) == transactional


@pytest.mark.parametrize("lib,codec", ORACLE_CASES)
def test_consumer_record_fields(lib, codec):
    buf = bytearray(build_oracle_batch(lib, SAMPLE, codec))
    set_offset_and_epoch(buf, 0, 300, leader_epoch=9)
    recs = _core.decode_records(buf, topic="orders", partition=3)
    assert len(recs) == len(SAMPLE)
    for r, (ts, key, value, headers) in zip(recs, SAMPLE):
        assert isinstance(r, ConsumerRecord)
        assert (r.topic, r.partition, r.leader_epoch, r.checksum) == ("orders", 3, 9, None)
        assert r.serialized_key_size == (-1 if key is None else len(key))
        assert r.serialized_value_size == (-1 if value is None else len(value))
        assert r.serialized_header_size == header_size(headers)
        assert all(type(k) is str for k, _ in r.headers)
        assert r.key is None or type(r.key) is bytes
        assert r.value is None or type(r.value) is bytes
    cols = _core.decode_columns(buf, topic="orders", partition=3)
    assert (cols.topic, cols.partition) == ("orders", 3)


def test_records_are_immutable_and_left_out_of_the_collector():
    buf = _core.encode_batch([b"a", b"b", None], keys=[b"k", None, b"k"],
                             headers=[[("h", b"1"), ("n", None)], [], []], base_offset=7)
    gc_was_enabled = gc.isenabled()
    recs = _core.decode_records(buf, topic="orders", partition=3)
    assert gc.isenabled() == gc_was_enabled   # the decode leaves the collector alone
    assert [r.headers for r in recs] == [(("h", b"1"), ("n", None)), (), ()]
    assert all(type(r.headers) is tuple for r in recs)
    # Every field is immutable, so no record can be part of a cycle and none is tracked.
    assert not any(gc.is_tracked(r) for r in recs)
    # A caller's topic object that is a container keeps the records tracked (it could close a
    # cycle through them), as do records decoded from legacy entries under the same rule.
    odd_topic = ["not", "a", "str"]
    assert all(gc.is_tracked(r) for r in _core.decode_records(buf, topic=odd_topic))
    legacy = bytes(legacy_message(1, 0, b"k", b"v", timestamp=5))
    assert [(r.headers, gc.is_tracked(r)) for r in _core.decode_records(legacy, topic="t")] == \
        [((), False)]


@pytest.mark.parametrize("legacy", [False, True])
def test_records_stay_collectable_when_the_topic_could_later_hold_them(legacy):
    """An empty dict is not tracked by the collector until a container goes into it: a record
    untracked because its topic was untracked then would hide the cycle topic -> record ->
    topic from the collector, and everything the dict holds would leak."""
    class Marker:
        pass

    buf = (bytes(legacy_message(1, 0, b"k", b"v", timestamp=5)) if legacy
           else _core.encode_batch([b"v"], keys=[b"k"]))
    topic, partition = {}, {}
    assert not gc.is_tracked(topic)
    recs = _core.decode_records(buf, topic=topic, partition=partition)
    assert len(recs) == 1
    marker = Marker()
    gone = weakref.ref(marker)
    topic["record"], topic["marker"] = recs[0], marker   # a cycle: topic -> record -> topic
    partition["record"] = recs[0]
    del recs, topic, partition, marker
    gc.collect()
    assert gone() is None


def test_dropped_records_are_freed_without_the_collector():
    buf = _core.encode_batch([b"v" * 50] * 1000, keys=[b"k"] * 1000,
                             headers=[[("h", b"x")]] * 1000)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    try:
        del _core.decode_records(buf, topic="t")[:]   # fills CPython's small-tuple free lists
        base, _ = tracemalloc.get_traced_memory()
        recs = _core.decode_records(buf, topic="t")
        held, _ = tracemalloc.get_traced_memory()
        del recs
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        if gc_was_enabled:
            gc.enable()
    assert held - base > 1000 * 100          # the records were really allocated...
    assert after - base < (held - base) / 100  # ...and reference counting alone freed them


def fake_log_parts():
    """Oracle batches of every available library and codec, placed at consecutive offsets."""
    parts, expected, offset = [], [], 0
    for i, (lib, codec) in enumerate(ORACLE_CASES):
        recs = SAMPLE[i % 3:]  # vary batch sizes
        buf = bytearray(build_oracle_batch(lib, recs, codec))
        set_offset_and_epoch(buf, 0, offset, leader_epoch=i)
        parts.append(bytes(buf))
        expected += model(recs, base_offset=offset)
        offset += len(recs)
    return parts, expected


def test_oracle_fake_log_file(tmp_path):
    parts, expected = fake_log_parts()
    log = b"".join(parts)
    assert oracle_log_records(log) == expected
    assert decoded(log) == expected
    assert decoded_columns(log) == expected
    assert_scan_matches_oracle(log)
    # The leader epoch of each record is that of its batch (kafka-python's ConsumerRecord).
    epochs = [r.leader_epoch for r in _core.decode_records(log)]
    assert epochs == [i for i, p in enumerate(parts) for _ in range(v2_header(p)["records_count"])]
    # The same bytes through every buffer flavour, including an mmap of a real .log file.
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(log)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert decoded(mm) == expected
        assert decoded_columns(mm) == expected
        assert _core.scan_batches(mm).valid_end == len(log)
    for flavour in (bytearray(log), memoryview(log), np.frombuffer(log, dtype=np.uint8)):
        assert decoded(flavour) == expected


def test_kafka_python_memory_records_builder_nonzero_first_delta():
    # MemoryRecordsBuilder(offset=1000) writes baseOffset 0 and offset deltas 1000, 1001, ...
    builder = KpMemoryRecordsBuilder(magic=2, compression_type=NONE, batch_size=1 << 20,
                                     offset=1000)
    for ts, key, value, headers in SAMPLE:
        assert builder.append(ts, key, value, list(headers)) is not None
    builder.close()
    buf = bytes(builder.buffer())
    expected = oracle_log_records(buf, lib="kafka-python")
    assert [e[0] for e in expected] == list(range(1000, 1000 + len(SAMPLE)))
    assert decoded(buf) == expected
    assert decoded_columns(buf) == expected
    assert_scan_matches_oracle(buf)
    row = row_dict(_core.scan_batches(buf).batches[0])
    assert row["last_offset"] == 1000 + len(SAMPLE) - 1


def test_set_base_offset_in_a_multi_batch_buffer():
    parts, expected = fake_log_parts()
    log = bytearray(b"".join(parts))
    pos = len(parts[0])
    _core.set_base_offset(log, pos, 10_000, partition_leader_epoch=77)
    hdr = v2_header(log, pos)
    assert (hdr["base_offset"], hdr["partition_leader_epoch"]) == (10_000, 77)
    assert bytes(log[:pos]) == parts[0] and bytes(log[pos + 16:]) == b"".join(parts)[pos + 16:]
    n1 = v2_header(parts[1])["records_count"]
    shifted = [(10_000 + i,) + e[1:] for i, e in enumerate(expected[len(SAMPLE):len(SAMPLE) + n1])]
    got = decoded(log)
    assert got[len(SAMPLE):len(SAMPLE) + n1] == shifted
    assert oracle_log_records(log)[len(SAMPLE):len(SAMPLE) + n1] == shifted


# ----------------------------------------------------------------------------------------------
# segstore batches -> oracles


def check_in_oracles(buf, codec, expected):
    """Every oracle that can read ``codec`` must see a CRC-valid batch with ``expected`` records."""
    hdr = oracle_header(buf)
    assert KpBatch(bytes(buf)).validate_crc() and AioBatch(bytes(buf)).validate_crc()
    assert hdr["attributes"] & 0x07 == codec
    for lib, codecs in ORACLE_CODECS.items():
        if codec in codecs:
            assert oracle_records(lib, buf) == expected, lib


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_segstore_batch_reads_in_oracles(codec):
    buf = encode(SAMPLE, base_offset=500, compression=codec, producer_id=99, producer_epoch=2,
                 base_sequence=1234, is_transactional=True, partition_leader_epoch=5)
    expected = model(SAMPLE, base_offset=500)
    check_in_oracles(buf, codec, expected)
    hdr = oracle_header(buf)
    assert hdr == dict(position=0, size=len(buf), base_offset=500,
                       last_offset=500 + len(SAMPLE) - 1, base_timestamp=T0,
                       max_timestamp=T0 + 1000, producer_id=99,
                       partition_leader_epoch=5, last_offset_delta=len(SAMPLE) - 1,
                       base_sequence=1234, records_count=len(SAMPLE), crc=hdr["crc"],
                       attributes=0x10 | codec, producer_epoch=2, magic=2)
    assert hdr["crc"] == crc32c_pkg.crc32c(buf[21:])
    assert decoded(buf) == expected
    assert decoded_columns(buf) == expected


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_segstore_batch_defaults(codec):
    values = [b"a" * 50, None, b""]
    buf = _core.encode_batch(values, timestamps_ms=T0, compression=codec)
    hdr = v2_header(buf)
    assert (hdr["producer_id"], hdr["producer_epoch"], hdr["base_sequence"]) == (-1, -1, -1)
    assert (hdr["base_offset"], hdr["partition_leader_epoch"], hdr["attributes"]) == (0, -1, codec)
    expected = [(i, T0, 0, None, v, []) for i, v in enumerate(values)]
    check_in_oracles(buf, codec, expected)
    assert decoded(buf) == expected


@pytest.mark.parametrize("name,codec", [("gzip", GZIP), ("snappy", SNAPPY), ("lz4", LZ4),
                                        ("zstd", ZSTD)])
def test_compression_by_name(name, codec):
    buf = encode(SAMPLE, compression=name)
    assert v2_header(buf)["attributes"] & 0x07 == codec
    assert decoded(buf) == model(SAMPLE)
    assert v2_header(encode(SAMPLE, compression=None))["attributes"] & 0x07 == NONE


@pytest.mark.parametrize("codec,level", [(GZIP, 1), (GZIP, 9), (ZSTD, 1), (ZSTD, 19), (LZ4, 1),
                                         (LZ4, 17)])
def test_compression_levels(codec, level):
    buf = encode(SAMPLE, compression=codec, compression_level=level)
    check_in_oracles(buf, codec, model(SAMPLE))


def test_bytes_like_inputs_and_default_timestamps():
    before = int(time.time() * 1000)
    values = [bytearray(b"v1"), memoryview(b"xv2")[1:], np.frombuffer(b"v3", np.uint8)]
    buf = _core.encode_batch(values,
                             keys=[memoryview(b"k1"), bytearray(b"k2"), None],
                             headers=[[("h", bytearray(b"x"))], None, [("m", memoryview(b"y"))]])
    after = int(time.time() * 1000)
    recs = decoded(buf)
    assert [r[3:] for r in recs] == [(b"k1", b"v1", [("h", b"x")]), (b"k2", b"v2", []),
                                     (None, b"v3", [("m", b"y")])]
    assert all(before <= r[1] <= after for r in recs)  # None means "now"


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_encode_with_offset_gaps(codec):
    deltas = [0, 3, 4, 10, 11, 40, 41]
    buf = encode(SAMPLE, base_offset=90, compression=codec, offset_deltas=deltas)
    expected = model(SAMPLE, base_offset=90, deltas=deltas)
    check_in_oracles(buf, codec, expected)
    assert v2_header(buf)["last_offset_delta"] == 41
    assert decoded(buf) == expected
    assert decoded_columns(buf) == expected


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_encode_columns_reads_in_oracles(codec):
    n = 23
    values = BinaryColumn.from_pylist([None if i % 5 == 3 else (b"v%d" % i) * (i % 4)
                                       for i in range(n)])
    keys = BinaryColumn.from_pylist([None if i % 3 == 0 else b"key-%d" % i for i in range(n)])
    ts = np.array([T0 + 10 * i - (i % 2) * 15 for i in range(n)], dtype=np.int64)
    res = _core.encode_columns(values, keys, ts, base_offset=1000, records_per_batch=5,
                               compression=codec, partition_leader_epoch=4)
    expected = [(1000 + i, int(ts[i]), 0, keys[i], values[i], []) for i in range(n)]
    assert oracle_log_records(res.data) == expected
    if codec in ORACLE_CODECS["kafka-python"]:
        assert oracle_log_records(res.data, lib="kafka-python") == expected
    assert_scan_matches_oracle(res.data)
    assert [row_dict(r) for r in res.batches] == [oracle_header(res.data, p)
                                                  for p, _ in batch_spans(res.data)]
    assert [int(r["records_count"]) for r in res.batches] == [5, 5, 5, 5, 3]
    assert [int(r["base_offset"]) for r in res.batches] == [1000, 1005, 1010, 1015, 1020]
    assert {int(r["attributes"]) for r in res.batches} == {codec}
    assert {int(r["partition_leader_epoch"]) for r in res.batches} == {4}
    assert decoded(res.data) == expected
    assert decoded_columns(res.data) == expected


def test_encode_columns_scalar_timestamp_and_byte_limit():
    values = BinaryColumn.from_pylist([b"x" * 1000, b"y" * 10, b"z" * 10, b"w" * 2000, b"q"])
    res = _core.encode_columns(values, None, T0, max_batch_bytes=600)
    rows = [row_dict(r) for r in res.batches]
    assert sum(r["records_count"] for r in rows) == 5
    for r in rows:
        assert r["size"] <= 600 or r["records_count"] == 1
    assert rows[0]["records_count"] == 1 and rows[-2]["records_count"] == 1
    assert oracle_log_records(res.data) == [(i, T0, 0, None, values[i], []) for i in range(5)]


@pytest.mark.parametrize("codec", [0, 1])
def test_encode_columns_order_gathers_rows(codec):
    """``order`` encodes exactly what the gathered columns would, checked in aiokafka."""
    rng = np.random.default_rng(7)
    n = 41
    vals = [None if i % 7 == 2 else bytes(rng.integers(0, 256, i % 9, dtype=np.uint8))
            for i in range(n)]
    ks = [None if i % 4 == 1 else b"key-%d" % i for i in range(n)]
    ts = T0 + rng.integers(-50, 50, n)
    order = np.concatenate([rng.permutation(n)[:30], [5, 5, 0]])  # repeats are allowed
    res = _core.encode_columns(BinaryColumn.from_pylist(vals), BinaryColumn.from_pylist(ks), ts,
                               order=order, base_offset=7, records_per_batch=6,
                               compression=codec)
    gathered = _core.encode_columns(
        BinaryColumn.from_pylist([vals[i] for i in order]),
        BinaryColumn.from_pylist([ks[i] for i in order]), ts[order], base_offset=7,
        records_per_batch=6, compression=codec)
    assert res.data == gathered.data
    assert oracle_log_records(res.data) == [
        (7 + j, int(ts[i]), 0, ks[i], vals[i], []) for j, i in enumerate(order)]


def test_encode_columns_order_rejects_rows_outside_the_columns():
    values = BinaryColumn.from_pylist([b"a", b"b"])
    for bad in ([2], [-1], [0, 1, 99]):
        with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
            _core.encode_columns(values, None, T0, order=np.array(bad))
    with pytest.raises(ValueError, match="one-dimensional"):
        _core.encode_columns(values, None, T0, order=np.zeros((1, 1), dtype=np.int64))
    assert _core.encode_columns(values, None, T0, order=np.array([], dtype=np.int64)).data == b""
    assert _core.encode_columns(values, None, T0, order=[1]).data == \
        _core.encode_columns(BinaryColumn.from_pylist([b"b"]), None, T0).data



def _guarded_array(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(guarded_copy(a.tobytes()), dtype=a.dtype)


def encode_gathers_in_guarded_memory() -> None:
    """Child process: encode_columns with ``order`` (whose loop prefetches rows ahead of the
    one it writes) with every input array ending where an inaccessible page begins, on one
    thread and split over two; each output matches that of plain copies."""
    rng = np.random.default_rng(11)
    n = 3000
    vals = [None if i % 11 == 3 else bytes(rng.integers(0, 256, i % 150, dtype=np.uint8))
            for i in range(n)]
    values = BinaryColumn.from_pylist(vals)
    keys = BinaryColumn.from_pylist([None if i % 5 == 1 else b"key-%d" % i for i in range(n)])
    ts = T0 + rng.integers(0, 1000, n)
    guarded_values = BinaryColumn(*(_guarded_array(a) for a in
                                    (values.data, values.offsets, values.valid)))
    guarded_keys = BinaryColumn(*(_guarded_array(a) for a in
                                  (keys.data, keys.offsets, keys.valid)))
    for order in (rng.permutation(n), rng.permutation(n)[:n - 5], np.arange(n)[::-1].copy(),
                  np.array([n - 1, 0, n - 1]), rng.permutation(n)[:9]):
        for min_bytes in (1 << 62, 0):  # one thread; two threads whenever two batches
            old = _core._set_parallel_min_bytes(min_bytes)
            try:
                want = _core.encode_columns(values, keys, ts, order=order,
                                            records_per_batch=64).data
                got = _core.encode_columns(guarded_values, guarded_keys, _guarded_array(ts),
                                           order=_guarded_array(order.astype(np.int64)),
                                           records_per_batch=64).data
            finally:
                _core._set_parallel_min_bytes(old)
            assert bytes(got) == bytes(want), (len(order), min_bytes)
            print("ok", flush=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes: Linux")
def test_encode_columns_order_reads_nothing_past_its_arrays():
    proc = run_in_child(__file__, "encode_gathers_in_guarded_memory")
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert proc.stdout.split() == ["ok"] * 10

# ----------------------------------------------------------------------------------------------
# control batches


@pytest.mark.parametrize("ctype", [ControlRecordType.COMMIT, ControlRecordType.ABORT])
@pytest.mark.parametrize("lib", ["kafka-python", "aiokafka"])
def test_control_batch_in_oracles(lib, ctype):
    buf = _core.encode_control_batch(ctype, producer_id=31337, producer_epoch=12,
                                     coordinator_epoch=17, base_offset=41, timestamp_ms=T0 + 9)
    assert len(buf) == 78
    batch = oracle_batch_cls(lib)(buf)
    assert batch.validate_crc() and batch.is_control_batch and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (31337, 12, -1)
    (rec,) = list(batch)
    assert (rec.offset, rec.timestamp) == (41, T0 + 9)
    assert rec.key == struct.pack(">hh", 0, int(ctype))
    assert rec.value == struct.pack(">hi", 0, 17)
    hdr = oracle_header(buf)
    assert (hdr["attributes"], hdr["records_count"], hdr["last_offset_delta"]) == (0x30, 1, 0)
    assert (hdr["base_timestamp"], hdr["max_timestamp"], hdr["partition_leader_epoch"]) == (
        T0 + 9, T0 + 9, -1)
    assert_scan_matches_oracle(buf)


def test_abort_marker_differs_from_commit_only_in_type_and_crc():
    commit = _core.encode_control_batch(ControlRecordType.COMMIT, producer_id=7, producer_epoch=0,
                                        base_offset=2, timestamp_ms=T0, partition_leader_epoch=0)
    abort = _core.encode_control_batch(ControlRecordType.ABORT, producer_id=7, producer_epoch=0,
                                       base_offset=2, timestamp_ms=T0, partition_leader_epoch=0)
    assert commit == REF_COMMIT
    diff = [i for i in range(78) if commit[i] != abort[i]]
    assert set(diff) - set(range(17, 21)) == {69}  # the low byte of the key's type field
    assert KpBatch(abort).validate_crc() and list(KpBatch(abort))[0].abort


def test_decode_skips_control_batches_unless_asked():
    data1 = encode(SAMPLE[:3], base_offset=0)
    marker = _core.encode_control_batch(ControlRecordType.COMMIT, producer_id=5, producer_epoch=1,
                                        coordinator_epoch=3, base_offset=3, timestamp_ms=T0 + 50)
    data2 = encode(SAMPLE[3:5], base_offset=4, compression=GZIP)
    log = data1 + marker + data2
    expected = model(SAMPLE[:3]) + model(SAMPLE[3:5], base_offset=4)
    assert decoded(log) == expected
    assert decoded_columns(log) == expected
    with_ctl = decoded(log, include_control=True)
    control = (3, T0 + 50, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x03", [])
    assert with_ctl == expected[:3] + [control] + expected[3:]
    assert [r[0] for r in decoded(log, include_control=True, min_offset=3, end_offset=4)] == [3]
    assert_scan_matches_oracle(log)


# ----------------------------------------------------------------------------------------------
# LogAppendTime


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_log_append_time_encode(codec):
    lat = T0 + 123_456
    buf = encode(SAMPLE, compression=codec, log_append_time_ms=lat)
    hdr = v2_header(buf)
    assert hdr["attributes"] & 0x08 and hdr["max_timestamp"] == lat
    expected = model(SAMPLE, lat=lat)
    check_in_oracles(buf, codec, expected)
    assert decoded(buf) == expected
    assert decoded_columns(buf) == expected
    cols = _core.decode_columns(buf)
    assert cols.timestamp_types.tolist() == [1] * len(SAMPLE)

    res = _core.encode_columns(BinaryColumn.from_pylist([b"a", b"b"]), None, T0,
                               compression=codec, log_append_time_ms=lat)
    assert oracle_log_records(res.data) == [(0, lat, 1, None, b"a", []),
                                            (1, lat, 1, None, b"b", [])]
    assert decoded(res.data) == oracle_log_records(res.data)


def test_log_append_time_decode_of_oracle_batch():
    lat = T0 + 999
    buf = bytearray(build_oracle_batch("kafka-python", SAMPLE))
    struct.pack_into(">h", buf, 21, 0x08)
    struct.pack_into(">q", buf, 35, lat)  # maxTimestamp
    fix_crc(buf)
    expected = oracle_records("kafka-python", buf)
    assert expected == model(SAMPLE, lat=lat)
    assert decoded(buf) == expected
    assert decoded_columns(buf) == expected


# ----------------------------------------------------------------------------------------------
# murmur2 and MurmurHash3


@pytest.fixture(scope="module")
def keys100k():
    keys = random_keys(100_000, seed=2024)
    keys += random_keys(2_000, seed=99, max_len=600)
    return keys


@pytest.fixture(scope="module")
def kp_hashes(keys100k):
    return [kp_murmur2(k) for k in keys100k]  # kafka-python returns the unsigned 32-bit value


def test_murmur2_matches_kafka_python(keys100k, kp_hashes):
    ours = [_core.murmur2(k) for k in keys100k]
    want = [signed32(h) for h in kp_hashes]
    assert ours == want
    assert min(ours) < 0 < max(ours)  # really signed, like Java's Utils.murmur2
    assert _core.murmur2(b"") == 275646681
    for k in keys100k[:200]:
        want = signed32(kp_murmur2(k))
        assert _core.murmur2(bytearray(k)) == _core.murmur2(memoryview(b"?" + k)[1:]) == want


def test_murmur2_partition_matches_default_partitioner(keys100k, kp_hashes):
    rng = np.random.default_rng(5)
    choices = np.array([1, 2, 3, 7, 10, 12, 64, 100, 1000, 4099, 2**31 - 1])
    ns = rng.choice(choices, len(keys100k)).tolist()
    ours = [_core.murmur2_partition(k, n) for k, n in zip(keys100k, ns)]
    # kafka-python's DefaultPartitioner: (murmur2(key) & 0x7fffffff) % num_partitions.
    want = [(h & 0x7FFFFFFF) % n for h, n in zip(kp_hashes, ns)]
    assert ours == want


@pytest.mark.parametrize("n", [1, 3, 12, 1000, 2**31 - 1])
def test_murmur2_partitions_vectorized(keys100k, kp_hashes, n):
    keys = list(keys100k[:20_000])
    hashes = list(kp_hashes[:20_000])
    for i in range(0, len(keys), 97):
        keys[i] = None
    col = BinaryColumn.from_pylist(keys)
    got = _core.murmur2_partitions(col, n)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.shape == (len(keys),)
    want = [-1 if k is None else (h & 0x7FFFFFFF) % n for k, h in zip(keys, hashes)]
    assert got.tolist() == want
    assert got.tolist() == [-1 if k is None else _core.murmur2_partition(k, n) for k in keys]


def test_murmur2_partitions_division_is_exact_for_any_partition_count(keys100k, kp_hashes):
    """The vectorized modulo is a multiply (Lemire's fastmod), not a divide: it must equal
    Python's % for every count a topic can have, the edges of each power of two included."""
    keys, hashes = keys100k[:3000], kp_hashes[:3000]
    col = BinaryColumn.from_pylist(keys)
    rng = np.random.default_rng(11)
    counts = {1, 2, 3, 5, 6, 7, 9, 255, 641, 6700417, 2**31 - 1, 2**31 - 2, 2**30 + 1}
    for e in range(1, 31):
        counts |= {2**e - 1, 2**e, 2**e + 1}
    counts |= set(rng.integers(1, 2**31, 40).tolist())
    positive = [h & 0x7FFFFFFF for h in hashes]
    for n in sorted(counts):
        got = _core.murmur2_partitions(col, n).tolist()
        assert got == [h % n for h in positive], n


def test_murmur2_of_every_short_length():
    """Each key length 0-40 (every tail of the 4-byte block loop), at every alignment."""
    raw = np.random.default_rng(8).integers(0, 256, 64, dtype=np.uint8).tobytes()
    for length in range(41):
        for start in range(4):
            k = raw[start:start + length]
            assert _core.murmur2(memoryview(raw)[start:start + length]) == signed32(kp_murmur2(k))


def test_murmur2_partitions_of_fixed_width_keys():
    mat = np.random.default_rng(3).integers(0, 256, (500, 8), dtype=np.uint8)
    col = BinaryColumn.from_fixed(mat)
    want = [(kp_murmur2(row.tobytes()) & 0x7FFFFFFF) % 6 for row in mat]
    assert _core.murmur2_partitions(col, 6).tolist() == want


@pytest.mark.parametrize("offsets", [[0, 100, 5], [0, 6, 3], [-4, 2, 5], [0, 2, 11]])
def test_murmur2_partitions_refuses_offsets_outside_the_data(offsets):
    """A BinaryColumn does not check its offsets: the hash must not read past its data."""
    col = BinaryColumn(np.zeros(10, dtype=np.uint8), np.array(offsets, dtype=np.int64),
                       np.ones(2, dtype=np.bool_))
    with pytest.raises(ValueError, match="outside keys.data"):
        _core.murmur2_partitions(col, 4)
    nulls = BinaryColumn(col.data, col.offsets, np.zeros(2, dtype=np.bool_))
    assert _core.murmur2_partitions(nulls, 4).tolist() == [-1, -1]   # null keys read nothing


@pytest.mark.parametrize("seed", [0, 42, 0x9747B28C, 2**32 - 1])
def test_murmur3_128_matches_mmh3(keys100k, seed):
    if seed == 0:
        assert [_core.murmur3_128(k) for k in keys100k] == [mmh3.hash_bytes(k) for k in keys100k]
    got = [_core.murmur3_128(k, seed) for k in keys100k]
    assert got == [mmh3.hash_bytes(k, seed) for k in keys100k]
    assert all(type(d) is bytes and len(d) == 16 for d in got[:100])
    assert _core.murmur3_128(bytearray(b"foo"), seed) == mmh3.hash_bytes(b"foo", seed)


# ----------------------------------------------------------------------------------------------
# legacy v0/v1


def legacy_crc(entry, pos=0):
    return struct.unpack_from(">I", entry, pos + 12)[0]


LEGACY_RECS = [(T0, b"k0", b"v0"), (T0 + 4, None, b"no key"), (T0 - 2, b"tomb", None),
               (T0 + 1, b"", b"")]


def test_legacy_uncompressed_v0_v1_against_kafka_python_builder():
    for magic in (0, 1):
        ours = b"".join(legacy_message(magic, 50 + i, k, v, ts)
                        for i, (ts, k, v) in enumerate(LEGACY_RECS))
        builder = KpLegacyBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
        for i, (ts, k, v) in enumerate(LEGACY_RECS):
            builder.append(50 + i, timestamp=ts, key=k, value=v)
        assert bytes(builder.build()) == ours

        recs = _core.decode_records(ours)
        ts_type = -1 if magic == 0 else 0
        want = [(50 + i, -1 if magic == 0 else ts, ts_type, k, v, [])
                for i, (ts, k, v) in enumerate(LEGACY_RECS)]
        assert [rec_tuple(r) for r in recs] == want
        assert [r.checksum for r in recs] == [legacy_crc(ours, p) for p, _ in batch_spans(ours)]
        assert decoded_columns(ours) == want
        oracle = [(r.offset, r.key, r.value) for b in KpMemoryRecords(ours) for r in b]
        assert oracle == [w[0:1] + w[3:5] for w in want]


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_gzip_wrapper(magic):
    if magic == 0:
        inner_offsets, wrapper_offset = [100, 101, 102, 103], 103  # absolute
        absolute = inner_offsets
    else:
        inner_offsets, wrapper_offset = [0, 2, 3, 7], 107  # relative, with compaction gaps
        absolute = [100, 102, 103, 107]
    entry = legacy_wrapper(magic, inner_offsets, LEGACY_RECS, wrapper_offset, wrapper_ts=T0 + 4)
    recs = _core.decode_records(entry)
    want = [(o, -1 if magic == 0 else ts, -1 if magic == 0 else 0, k, v, [])
            for o, (ts, k, v) in zip(absolute, LEGACY_RECS)]
    assert [rec_tuple(r) for r in recs] == want
    inner = gzip.decompress(entry[12 + 4 + 2 + (8 if magic else 0) + 4 + 4:])
    assert [r.checksum for r in recs] == [legacy_crc(inner, p) for p, _ in batch_spans(inner)]
    assert decoded_columns(entry) == want
    assert [r[0] for r in decoded(entry, min_offset=102, end_offset=107)] == [
        o for o in absolute if 102 <= o < 107]
    # kafka-python agrees (it reads v0 inner offsets as absolute, v1 as relative to the wrapper).
    oracle = [(r.offset, r.key, r.value) for b in KpMemoryRecords(entry) for r in b]
    assert oracle == [w[0:1] + w[3:5] for w in want]
    (row,) = _core.scan_batches(entry, validate_crc=True).batches
    row = row_dict(row)
    assert (row["position"], row["size"], row["magic"]) == (0, len(entry), magic)
    assert (row["base_offset"], row["last_offset"]) == (-1, wrapper_offset)
    assert (row["crc"], row["attributes"]) == (legacy_crc(entry), GZIP)


def test_legacy_v1_log_append_time_wrapper_overrides_inner_timestamps():
    lat = T0 + 77_777
    entry = legacy_wrapper(1, [0, 1, 2, 3], LEGACY_RECS, 13, wrapper_ts=lat, lat=True)
    want = [(10 + i, lat, 1, k, v, []) for i, (_, k, v) in enumerate(LEGACY_RECS)]
    assert decoded(entry) == want
    assert decoded_columns(entry) == want
    oracle = [(r.offset, r.timestamp, r.timestamp_type) for b in KpMemoryRecords(entry) for r in b]
    assert oracle == [w[:3] for w in want]


def test_legacy_v1_uncompressed_log_append_time():
    entry = legacy_message(1, 8, b"k", b"v", T0 + 1, attributes=0x08)
    assert decoded(entry) == [(8, T0 + 1, 1, b"k", b"v", [])]


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_gzip_wrapper_from_kafka_python_builder(magic):
    builder = KpLegacyBuilder(magic=magic, compression_type=GZIP, batch_size=1 << 20)
    base = 500
    for i, (ts, k, v) in enumerate(LEGACY_RECS):
        builder.append(base + i if magic == 0 else i, timestamp=ts, key=k, value=v)
    entry = bytearray(builder.build())
    struct.pack_into(">q", entry, 0, base + len(LEGACY_RECS) - 1)  # wrapper offset = last inner
    oracle = [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, [])
              for b in KpMemoryRecords(bytes(entry)) for r in b]
    if magic == 0:  # kafka-python reports None where segstore reports -1 for v0
        oracle = [(o, -1, -1, k, v, h) for o, _, _, k, v, h in oracle]
    assert [o[0] for o in oracle] == list(range(base, base + len(LEGACY_RECS)))
    assert decoded(entry) == oracle
    assert decoded_columns(entry) == oracle


def test_legacy_crc_is_validated():
    entry = bytearray(legacy_message(1, 0, b"key", b"value", T0))
    entry[-1] ^= 0x01
    with pytest.raises(CorruptRecordError):
        _core.decode_records(entry)
    with pytest.raises(CorruptRecordError):
        _core.decode_columns(entry)
    assert decoded(entry, validate_crc=False) == [(0, T0, 0, b"key", b"valud", [])]


def test_mixed_magic_log():
    v0 = b"".join(legacy_message(0, i, b"a%d" % i, b"x") for i in range(3))
    v1 = legacy_wrapper(1, [0, 1, 2], [(T0, None, b"p"), (T0 + 1, None, b"q"),
                                       (T0 + 2, b"r", None)], 5)
    v2 = encode(SAMPLE, base_offset=6, compression=ZSTD)
    log = v0 + v1 + v2
    want = ([(i, -1, -1, b"a%d" % i, b"x", []) for i in range(3)]
            + [(3, T0, 0, None, b"p", []), (4, T0 + 1, 0, None, b"q", []),
               (5, T0 + 2, 0, b"r", None, [])]
            + model(SAMPLE, base_offset=6))
    assert decoded(log) == want
    assert decoded_columns(log) == want
    rows = [row_dict(r) for r in _core.scan_batches(log, validate_crc=True).batches]
    assert [r["magic"] for r in rows] == [0, 0, 0, 1, 2]
    assert [r["position"] for r in rows] == [p for p, _ in batch_spans(log)]
    assert [r["last_offset"] for r in rows] == [0, 1, 2, 5, 6 + len(SAMPLE) - 1]
    assert [r["base_offset"] for r in rows] == [0, 1, 2, -1, 6]


# ----------------------------------------------------------------------------------------------
# filtering, ranges and columns


def filter_log():
    """Legacy v1 wrapper 0..3, v2 4..8, a COMMIT marker at 9, gzip v2 with gaps 10..16, 17..19."""
    legacy = legacy_wrapper(1, [0, 1, 2, 3], [(T0 + i, b"L%d" % i, b"l") for i in range(4)], 3)
    b1 = encode(SAMPLE[:5], base_offset=4)
    marker = _core.encode_control_batch(ControlRecordType.COMMIT, producer_id=1, producer_epoch=0,
                                        base_offset=9, timestamp_ms=T0)
    b2 = encode(SAMPLE[:4], base_offset=10, compression=GZIP, offset_deltas=[0, 2, 3, 6])
    b3 = encode(SAMPLE[4:7], base_offset=17, compression=LZ4)
    log = legacy + b1 + marker + b2 + b3
    want = ([(i, T0 + i, 0, b"L%d" % i, b"l", []) for i in range(4)] + model(SAMPLE[:5], 4)
            + model(SAMPLE[:4], 10, deltas=[0, 2, 3, 6]) + model(SAMPLE[4:7], 17))
    return log, want


def test_filters_across_batch_boundaries():
    log, want = filter_log()
    bounds = [None, 0, 2, 3, 4, 8, 9, 10, 11, 12, 16, 17, 19, 20, 1000]
    for lo in bounds:
        for hi in bounds:
            for limit in (None, 1, 2, 5, 100):
                exp = [w for w in want if (lo is None or w[0] >= lo) and (hi is None or w[0] < hi)]
                exp = exp[:limit] if limit is not None else exp
                kw = dict(min_offset=lo, end_offset=hi, max_records=limit)
                assert decoded(log, **kw) == exp, kw
                assert decoded_columns(log, **kw) == exp, kw


def test_start_and_end_positions():
    log, want = filter_log()
    spans = batch_spans(log)
    (p1, s1), (p3, s3) = spans[1], spans[3]
    assert decoded(log, p1, p1 + s1) == want[4:9]
    assert decoded_columns(log, p1, p3 + s3) == want[4:13]
    assert decoded(log, p3) == want[9:]
    assert decoded(log, 0, p1) == want[:4]
    rows = _core.scan_batches(log, p1, p3 + s3).batches
    assert [int(r["position"]) for r in rows] == [p1, spans[2][0], p3]
    assert len(_core.scan_batches(log, max_batches=2).batches) == 2


def test_columns_nulls_empties_and_headers():
    values = [None, b"", b"x", None, b"yy"]
    keys = [None, b"", None, b"k", b"kk"]
    headers = [[], [("a", None)], [("b", b""), ("c", b"cc")], None, [("\u00e9", b"\x00")]]
    buf = _core.encode_batch(values, keys=keys, headers=headers, timestamps_ms=T0)
    cols = _core.decode_columns(buf, include_headers=True)
    check_columns(cols)
    assert cols.values.valid.tolist() == [False, True, True, False, True]
    assert cols.values.lengths.tolist() == [0, 0, 1, 0, 2]
    assert cols.keys.valid.tolist() == [False, True, False, True, True]
    assert cols.keys.lengths.tolist() == [0, 0, 0, 1, 2]
    assert cols.values.to_pylist() == values and cols.keys.to_pylist() == keys
    want_headers = [[], [("a", None)], [("b", b""), ("c", b"cc")], [], [("\u00e9", b"\x00")]]
    assert cols.headers.to_pylist() == want_headers
    assert cols.headers.offsets.tolist() == [0, 0, 1, 3, 3, 4]
    assert [list(map(tuple, r.headers)) for r in _core.decode_records(buf)] == want_headers
    assert _core.decode_columns(buf).headers is None
    batch = cols.to_arrow()  # Arrow layout holds
    assert batch.num_rows == 5 and batch.column("value").null_count == 2


def test_empty_inputs():
    for empty in (b"", bytearray(), memoryview(b"")):
        assert _core.decode_records(empty) == []
        cols = _core.decode_columns(empty, include_headers=True)
        check_columns(cols)
        assert len(cols) == 0
        res = _core.scan_batches(empty)
        assert len(res.batches) == 0 and res.valid_end == 0 and not res.torn and res.error is None
    cols = _core.decode_columns(encode(SAMPLE), min_offset=100)
    check_columns(cols)
    assert len(cols) == 0


def test_corrupt_error_names_file_and_position():
    log, _ = filter_log()
    bad = bytearray(log)
    pos = batch_spans(log)[3][0]  # the gzip batch
    bad[pos + 70] ^= 0x40
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_records(bad, file="00000000000000000000.log")
    assert ei.value.position == pos and ei.value.file == "00000000000000000000.log"
    with pytest.raises(CorruptRecordError) as ei:
        _core.scan_batches(bad, validate_crc=True, file="x.log")
    assert ei.value.position == pos and ei.value.file == "x.log"


def test_to_arrow_spark_schema_and_null_headers(tmp_path):
    """``to_arrow(spark=True)`` has exactly Spark's Kafka source types; a record without headers
    gets a null headers cell (Spark's KafkaRecordToRowConverter), one with headers its list."""
    import pyarrow as pa
    import segstore
    with segstore.open(str(tmp_path / "s")) as st:
        st.create_topic("t", 2)
        lg = st.partition("t", 1)
        lg.append_batch([b"a", b"b", None], keys=[b"k", None, b"k"],
                        headers=[[("h", b"1"), ("g", None)], [], None], timestamps_ms=5)
        batch = lg.read_columns(0, include_headers=True).to_arrow(spark=True)
    assert batch.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp",
                                  "timestampType", "headers"]
    assert batch.schema.field("key").type == pa.binary()
    assert batch.schema.field("partition").type == pa.int32()
    assert batch.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert batch.schema.field("timestampType").type == pa.int32()
    assert batch.column("headers").to_pylist() == [
        [{"key": "h", "value": b"1"}, {"key": "g", "value": None}], None, None]
    assert batch.column("key").to_pylist() == [b"k", None, b"k"]
    assert batch.column("topic").to_pylist() == ["t"] * 3
    assert batch.column("partition").to_pylist() == [1] * 3
    assert [t.value // 1000 for t in batch.column("timestamp")] == [5, 5, 5]


@pytest.fixture(params=["bound", "python"])
def crc_path(request):
    """Both CRC paths: the crc32c package's C routine without the GIL, and its Python function."""
    if request.param == "python":
        _core._unbind_crc32c()
    yield request.param
    assert _core._bind_crc32c()


def test_crc32c_routine_is_bound_and_agrees_with_the_package():
    import os
    assert _core.crc32c_without_gil()  # this environment's crc32c exports its routine
    data = os.urandom(300_000)
    enc = _core.encode_batch([data[i:i + 1000] for i in range(0, len(data), 1000)],
                             timestamps_ms=1)
    assert _core.scan_batches(enc, validate_crc=True).batches["crc"][0] == \
        crc32c_pkg.crc32c(bytes(enc)[21:])


def test_crc_checks_agree_on_both_paths(crc_path):
    import os
    batches = [_core.encode_batch([os.urandom(50) for _ in range(20)], keys=[b"k"] * 20,
                                  timestamps_ms=1, base_offset=20 * i) for i in range(5)]
    buf = bytearray(b"".join(batches))
    for b in _core.scan_batches(buf, validate_crc=True).batches:   # encoder's CRCs are right
        assert b["crc"] == crc32c_pkg.crc32c(bytes(buf[b["position"] + 21:b["position"] + b["size"]]))
    assert len(_core.decode_records(buf, validate_crc=True)) == 100
    assert len(_core.decode_columns(buf, validate_crc=True)) == 100
    pos = len(batches[0]) + len(batches[1]) + 70          # inside the third batch's records
    buf[pos] ^= 0xFF
    res = _core.scan_batches(buf, validate_crc=True, raise_on_corrupt=False)
    assert res.error is not None and res.error.position == len(batches[0]) + len(batches[1])
    assert len(res.batches) == 2
    with pytest.raises(CorruptRecordError) as e:
        _core.decode_records(buf, validate_crc=True)
    assert e.value.position == len(batches[0]) + len(batches[1])
    with pytest.raises(CorruptRecordError) as e:
        _core.decode_columns(buf, validate_crc=True)
    assert e.value.position == len(batches[0]) + len(batches[1])


def test_murmur3_digests_of_a_column_match_mmh3():
    """The vectorized key digests are mmh3's x64-128 of each non-null key, in order; the
    distinct rows are those of a set of the same digests."""
    import mmh3
    import random
    rnd = random.Random(3)
    keys = [None if rnd.random() < 0.2 else bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
            for _ in range(500)] + [b"same"] * 5
    col = BinaryColumn.from_pylist(keys)
    d = _core.murmur3_128_digests(col)
    want = [mmh3.hash_bytes(k) for k in keys if k is not None]
    assert [r.tobytes() for r in d] == want
    assert len(_core.distinct_digests(d)) == len(set(want))
    assert _core.murmur3_128_digests(BinaryColumn.from_pylist([None, None])).shape == (0, 2)


# --- encode_batch's inputs: any sequence, typed errors ------------------------------------


def _kp_records(data):
    """(offset, timestamp, key, value) of every record, parsed by kafka-python (CRC checked)."""
    records = KpMemoryRecords(bytes(data))
    out = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        out += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    return out


@pytest.mark.parametrize("kind", ["list", "tuple", "generator", "ndarray"])
def test_encode_batch_takes_any_sequence_of_values_keys_and_timestamps(kind):
    values = [b"v%d" % i for i in range(50)]
    keys = [None if i % 7 == 0 else b"k%d" % i for i in range(50)]
    stamps = [1_700_000_000_000 + 3 * i for i in range(50)]
    conv = {"list": list, "tuple": tuple, "generator": lambda xs: (x for x in xs),
            "ndarray": lambda xs: np.array(xs, dtype=object)}[kind]
    ts_in = np.array(stamps, dtype=np.int64) if kind == "ndarray" else conv(stamps)
    data = _core.encode_batch(conv(values), conv(keys), timestamps_ms=ts_in, base_offset=10)
    assert type(data) is bytes
    assert _kp_records(data) == [(10 + i, stamps[i], keys[i], values[i]) for i in range(50)]


def test_encode_batch_rejects_bad_inputs_with_typed_errors():
    with pytest.raises(InvalidRecordError, match="values must be a sequence"):
        _core.encode_batch(42)
    with pytest.raises(InvalidRecordError, match="keys must be a sequence"):
        _core.encode_batch([b"a"], 7)
    with pytest.raises(InvalidRecordError, match="2 keys for 1 values"):
        _core.encode_batch([b"a"], [b"k", b"j"])
    with pytest.raises(InvalidRecordError, match="3 timestamps for 2 values"):
        _core.encode_batch([b"a", b"b"], timestamps_ms=[1, 2, 3])
    with pytest.raises(InvalidRecordError, match="timestamp 1 must be an int"):
        _core.encode_batch([b"a", b"b"], timestamps_ms=[1, "2"])
    with pytest.raises(InvalidRecordError, match="timestamp 0 must be an int"):
        _core.encode_batch([b"a"], timestamps_ms=[1 << 70])
    with pytest.raises(InvalidRecordError, match="value 1 must be bytes-like"):
        _core.encode_batch([b"a", 5])
    with pytest.raises(InvalidRecordError, match="at least one record"):
        _core.encode_batch([])


def test_encode_batch_output_is_a_fresh_bytes_object_each_call():
    """The batch is written into the bytes object returned: two calls never share one, and
    neither changes after the other is made."""
    a = _core.encode_batch([b"x" * 100], [b"k"], timestamps_ms=5)
    snapshot = bytes(bytearray(a))
    b = _core.encode_batch([b"y" * 100], [b"k"], timestamps_ms=5)
    assert a is not b and a == snapshot and a != b
    assert _kp_records(b) == [(0, 5, b"k", b"y" * 100)]
