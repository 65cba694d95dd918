"""Compressed batches against the Java libraries Kafka itself compresses with (issue 2,
"Compression"; issue 3, "Kafka tools read ours").

``tests/java/KafkaCodecs.java`` runs on the JDK the README requires, with the jars pyspark ships:
snappy-java's ``SnappyOutputStream``/``SnappyInputStream`` (Kafka's snappy), zstd-jni's
streams (Kafka's zstd), lz4-java's frame streams set up as Kafka's ``Lz4BlockOutputStream``
(independent 64 KiB blocks, no checksums) plus the descriptor checks Kafka's
``Lz4BlockInputStream`` adds, and the JDK's gzip streams and ``java.util.zip.CRC32C``.

Both ways, on record sets from one tiny record to several codec blocks of incompressible and
repetitive bytes, with every codec level segstore accepts at its ends:

* every batch segstore encodes, and every segment file of a topic with ``compression.type``
  set, passes Java's CRC-32C and decompresses in Java to exactly the records section
  kafka-python builds uncompressed for the same records;
* every payload Java compresses, set into a batch (``struct`` and the crc32c package), decodes
  in segstore to exactly kafka-python's records, and decompresses to the same bytes.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import struct
import subprocess

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

import segstore
from conftest import FakeClock, fix_crc, rec_tuple
from segstore import _core, compression

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# Each codec's level range in segstore (config.py's compression.<codec>.level), both ends.
LEVELS = {"gzip": (1, 9), "snappy": (None,), "lz4": (1, 17), "zstd": (-5, 22)}
T0 = 1_700_000_000_000
JAVA_SOURCE = os.path.join(os.path.dirname(__file__), "java", "KafkaCodecs.java")


def _record_sets() -> dict:
    rnd = random.Random(20261127)
    big = bytes(rnd.getrandbits(8) for _ in range(8192))
    return {
        "tiny": [(b"k", b"v", [])],
        "mixed": [(None if i % 7 == 0 else b"key-%d" % (i % 13),
                   None if i % 11 == 0 else b"value-%d" % i * (i % 5 + 1),
                   [("h%d" % j, None if j == 1 else b"x" * j) for j in range(i % 3)])
                  for i in range(200)],
        # incompressible: many 64 KiB lz4 blocks and 32 KiB snappy blocks, stored raw
        "random": [(b"r%d" % i, big[i:] + big[:i], []) for i in range(40)],
        # repetitive, over 1 MiB before compression
        "repetitive": [(b"user-%d" % (i % 50), b"address line %d, " % (i % 9) * 60, [])
                       for i in range(2000)],
    }


def _kafka_python_batch(records) -> bytes:
    """The uncompressed batch kafka-python builds (the oracle for the records section)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 30)
    for i, (k, v, h) in enumerate(records):
        b.append(i, timestamp=T0 + i, key=k, value=v, headers=h)
    return bytes(b.build())


def _kafka_python_records(batch: bytes) -> list:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, [tuple(h) for h in r.headers])
            for r in DefaultRecordBatch(bytearray(batch))]


def _java_classpath() -> str:
    pyspark = pytest.importorskip("pyspark", reason="the Java codec jars come with pyspark "
                                                    "(pip install .[spark])")
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    found = [glob.glob(os.path.join(jars, p)) for p in
             ("lz4-java-*.jar", "snappy-java-*.jar", "zstd-jni-*.jar")]
    assert all(found), f"pyspark's jars in {jars} lack lz4-java, snappy-java or zstd-jni"
    return os.pathsep.join(sorted(f[0] for f in found))


def _segstore_batch(records, codec, level) -> bytes:
    keys, values, headers = zip(*records)
    return _core.encode_batch(list(values), keys=list(keys), headers=list(headers),
                              timestamps_ms=[T0 + i for i in range(len(records))],
                              compression=CODECS[codec], compression_level=level)


@pytest.fixture(scope="module")
def java_run(tmp_path_factory):
    """Every input written, one JVM run over them all; returns (directory, record sets)."""
    java = shutil.which("java")
    assert java, "the README's prerequisites include Java 17: no java on PATH"
    cp = _java_classpath()
    d = tmp_path_factory.mktemp("java-codecs")
    sets = _record_sets()
    for name, recs in sets.items():
        plain = _kafka_python_batch(recs)[61:]
        for codec in CODECS:
            (d / f"{name}.{codec}.plain").write_bytes(plain)
            for level in LEVELS[codec]:
                (d / f"{name}-{codec}-{level}.batches").write_bytes(
                    _segstore_batch(recs, codec, level))
    # Whole segment files of topics compressed by the log (compression.type), several batches.
    with segstore.open(str(d / "store"), clock=FakeClock(T0)) as store:
        for codec in CODECS:
            store.create_topic(codec, config={"compression.type": codec})
            lg = store.partition(codec, 0)
            for recs in sets.values():
                keys, values, headers = zip(*recs)
                lg.append_batch(list(values), keys=list(keys), headers=list(headers),
                                timestamps_ms=[T0 + i for i in range(len(recs))])
    for codec in CODECS:
        shutil.copy(d / "store" / f"{codec}-0" / "00000000000000000000.log",
                    d / f"segment-{codec}.batches")
    shutil.rmtree(d / "store")
    res = subprocess.run([java, "-cp", cp, JAVA_SOURCE, str(d)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return d, sets


def _java_records(path) -> list[bytes]:
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def _no_error(d, stem):
    err = d / f"{stem}.error"
    assert not err.exists(), f"{stem}: Java failed: {err.read_text()}"


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", ["tiny", "mixed", "random", "repetitive"])
def test_java_reads_segstore_batches(java_run, name, codec):
    d, sets = java_run
    plain = _kafka_python_batch(sets[name])[61:]
    for level in LEVELS[codec]:
        stem = f"{name}-{codec}-{level}"
        _no_error(d, stem)
        assert _java_records(d / f"{stem}.records") == [plain], stem


@pytest.mark.parametrize("codec", CODECS)
def test_java_reads_a_compressed_topics_segment_file(java_run, codec):
    d, sets = java_run
    _no_error(d, f"segment-{codec}")
    expected = [_kafka_python_batch(recs)[61:] for recs in sets.values()]
    assert _java_records(d / f"segment-{codec}.records") == expected


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("name", ["tiny", "mixed", "random", "repetitive"])
def test_segstore_reads_what_java_compressed(java_run, name, codec):
    d, sets = java_run
    _no_error(d, f"{name}.{codec}")
    oracle = _kafka_python_batch(sets[name])
    payload = (d / f"{name}.{codec}.java").read_bytes()
    assert compression.decompress(CODECS[codec], payload) == oracle[61:]
    # The same batch with Java's payload: length, codec bits and CRC set to match.
    batch = bytearray(oracle[:61] + payload)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, struct.unpack_from(">h", batch, 21)[0] | CODECS[codec])
    fix_crc(batch)
    got = [rec_tuple(r) for r in _core.decode_records(bytes(batch))]
    assert got == _kafka_python_records(oracle)
