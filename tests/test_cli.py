"""The ``segstore`` command, run through ``main(argv)`` on real stores built in tmp_path.

Expectations come from outside the code under test: batch and index fields are parsed here with
``struct`` (conftest's helpers) and CRCs computed with the ``crc32c`` package; Kafka-written data
comes from kafka-python's builders; the plan-cleaner numbers are worked out by hand in the test.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import struct
import subprocess
import sys
import zlib

import crc32c
import pytest

import segstore
from segstore.cli import main
from segstore.cli._common import Progress
from segstore.config import TOPIC_CONFIG_KEYS
from segstore.records import ControlRecordType

from kafka.record.default_records import DefaultRecordBatchBuilder
from keyless import append_batch_unvalidated


def _shared_helpers():
    # tests/spark/conftest.py is also imported as "conftest", and whichever pytest collected
    # last wins `from conftest import ...`; load this directory's helpers by path instead.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    spec = importlib.util.spec_from_file_location("_segstore_test_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_helpers = _shared_helpers()
batch_spans, fix_crc = _helpers.batch_spans, _helpers.fix_crc
legacy_message, v2_header = _helpers.legacy_message, _helpers.v2_header
HUGE_PAGE_ADVICE_SHOWS, map_vm_flags = _helpers.HUGE_PAGE_ADVICE_SHOWS, _helpers.map_vm_flags

TS = 1_700_000_000_000
KAFKA_BATCH_FIELDS = ["baseOffset", "lastOffset", "count", "baseSequence", "lastSequence",
                      "producerId", "producerEpoch", "partitionLeaderEpoch", "isTransactional",
                      "isControl", "deleteHorizonMs", "position"]


def run(capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of ``segstore argv``."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def seg_path(store, topic, partition, base=0, suffix=".log") -> str:
    return os.path.join(str(store), f"{topic}-{partition}", f"{base:020d}{suffix}")


def snapshot(root) -> dict:
    """Every file under ``root`` with its size, mtime and bytes (to prove nothing changed)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if f == ".lock":
                continue
            st = os.stat(p)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, fh.read())
    return out


@pytest.fixture
def store(tmp_path):
    """Topic ``t`` (2 partitions, small segments): partition 0 holds ten 2-record batches with
    fixed timestamps, keys, one header and one tombstone and one keyless record."""
    root = tmp_path / "store"
    with segstore.open(str(root)) as st:
        st.create_topic("t", 2, config={"segment.bytes": 300, "index.interval.bytes": 50})
        lg = st.partition("t", 0)
        for i in range(10):
            value = None if i == 7 else b"v%d" % i
            key = None if i == 8 else b"k%d" % i
            lg.append_batch([value, b"w"], keys=[key, b"k"], headers=[[("h", b"1")], None],
                            timestamps_ms=[TS + 2 * i, TS + 2 * i + 1])
    return root


# -- basics -----------------------------------------------------------------------------------

def test_help_and_version_exit_zero(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "dump-log" in out and "plan-cleaner" in out
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"segstore {segstore.__version__}"


@pytest.mark.parametrize("argv, fragment", [
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["dump-log"], "the following arguments are required: --files"),
    (["verify", "--path", "x", "--bogus"], "unrecognized arguments: --bogus"),
    (["plan-cleaner", "--unique-keys", "ten"], "not a whole number: 'ten'"),
    (["plan-cleaner", "--unique-keys", "10", "--load-factor", "0"], "greater than 0"),
    (["plan-cleaner", "--unique-keys", "10", "--dirty-ratio", "1.5"], "between 0 and 1"),
    (["dump-log", "--files", "a.log", "--key-decoder", "rot13"], "invalid choice: 'rot13'"),
    (["dump-log", "--files", "a.log", "--offsets-decoder"], "--offsets-decoder is not supported"),
    (["dump-log", "--files", "a.log", "--value-decoder-class", "com.acme.Avro"], "is Java"),
    (["topics", "--path", "x", "--create", "--topic", "a", "--replication-factor", "3"],
     "--replication-factor must be 1"),
    (["configs", "--path", "x", "--entity-type", "brokers", "--describe"], "not supported"),
    (["compact", "--path", "x", "--partition", "0"], "--partition needs --topic"),
    (["verify", "--files", "x"], "the following arguments are required: --path/--store"),
    (["dump-log", "--file", "x"], "the following arguments are required: --files"),  # no abbrev
])
def test_bad_arguments_are_one_line_exit_2(capsys, argv, fragment):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert fragment in err and ": error: " in err


def test_missing_store_is_one_line_exit_1(capsys, tmp_path):
    for argv in (["verify"], ["topics", "--list"], ["log-dirs", "--describe"], ["retention"],
                 ["describe"], ["recover"]):
        rc, out, err = run(capsys, *argv, "--path", tmp_path / "nope")
        assert rc == 1, argv
        assert err == f"segstore {argv[0]}: error: {tmp_path / 'nope'}: no such directory\n"
        assert not (tmp_path / "nope").exists()


def test_segstore_errors_are_one_line(capsys, store):
    rc, _, err = run(capsys, "configs", "--path", store, "--topic", "t", "--alter",
                     "--add-config", "segment.bytes=ten")
    assert rc == 1 and err.count("\n") == 1
    assert err.startswith("segstore configs: error: Invalid value ten for configuration "
                          "segment.bytes")
    rc, _, err = run(capsys, "configs", "--path", store, "--topic", "nosuch", "--describe")
    assert rc == 1 and err == "segstore configs: error: unknown topic 'nosuch'\n"


def test_locked_store_is_one_line(capsys, store):
    with segstore.open(str(store)):
        rc, _, err = run(capsys, "topics", "--path", store, "--create", "--topic", "u")
        assert rc == 1 and err.count("\n") == 1 and "locked by another writer" in err
        rc, _, err = run(capsys, "recover", "--path", store)
        assert rc == 1 and f"pid {os.getpid()}" in err and "stop it" in err
        # Read-only commands work beside the writer.
        assert run(capsys, "verify", "--path", store)[0] == 0


def test_python_dash_m_and_console_script(store):
    for cmd in ([sys.executable, "-m", "segstore"],
                [os.path.join(os.path.dirname(sys.executable), "segstore")]):
        p = subprocess.run(cmd + ["topics", "--list", "--path", str(store)],
                           capture_output=True, text=True)
        assert (p.returncode, p.stdout, p.stderr) == (0, "t\n", "")
    p = subprocess.run([sys.executable, "-m", "segstore", "verify", "--path", str(store) + "x"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


# -- dump-log: .log ---------------------------------------------------------------------------

def expected_batch_line(buf, pos, size) -> str:
    """Kafka's batch line, built from struct-parsed fields and an independent CRC."""
    h = v2_header(buf, pos)
    attrs = h["attributes"]
    seq = h["base_sequence"]
    last_seq = -1 if seq < 0 else seq + h["last_offset_delta"]
    horizon = f"OptionalLong[{h['base_timestamp']}]" if attrs & 0x40 else "OptionalLong.empty"
    ok = crc32c.crc32c(bytes(buf[pos + 21:pos + size])) == h["crc"]
    b = lambda v: "true" if v else "false"  # noqa: E731
    return (f"baseOffset: {h['base_offset']} lastOffset: {h['base_offset'] + h['last_offset_delta']} "
            f"count: {h['records_count']} baseSequence: {seq} lastSequence: {last_seq} "
            f"producerId: {h['producer_id']} producerEpoch: {h['producer_epoch']} "
            f"partitionLeaderEpoch: {h['partition_leader_epoch']} "
            f"isTransactional: {b(attrs & 0x10)} isControl: {b(attrs & 0x20)} "
            f"deleteHorizonMs: {horizon} position: {pos} "
            f"{'LogAppendTime' if attrs & 0x08 else 'CreateTime'}: {h['max_timestamp']} "
            f"size: {size} magic: 2 compresscodec: {['none', 'gzip', 'snappy', 'lz4', 'zstd'][attrs & 7]} "
            f"crc: {h['crc']} isvalid: {b(ok)}")


def test_dump_log_batch_lines_match_kafka_format(capsys, store):
    path = seg_path(store, "t", 0)
    data = open(path, "rb").read()
    rc, out, err = run(capsys, "dump-log", "--files", path)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[:2] == [f"Dumping {path}", "Log starting offset: 0"]
    spans = batch_spans(data)
    assert len(spans) == 3
    assert lines[2:] == [expected_batch_line(data, p, s) for p, s in spans]
    # Field order is what people grep for: Kafka's order, exactly.
    names = [w[:-1] for w in lines[2].split() if w.endswith(":")]
    assert names[:12] == KAFKA_BATCH_FIELDS
    assert names[12:] == ["CreateTime", "size", "magic", "compresscodec", "crc", "isvalid"]


@pytest.mark.skipif(not HUGE_PAGE_ADVICE_SHOWS,
                    reason="Linux with transparent huge pages only: MADV_HUGEPAGE in smaps")
def test_dump_maps_a_log_asking_for_huge_folios(store):
    """A dump may be the first to read a cold segment in from disk, which fixes the size its
    pages keep in the page cache for the store's later maps: it maps like the store does."""
    from segstore.cli.dump_common import MappedFile

    path = seg_path(store, "t", 0)
    with MappedFile(path) as m:
        assert bytes(m.buf) == open(path, "rb").read()
        (flags,) = map_vm_flags(path)
    assert "hg" in flags and "rd" in flags and "wr" not in flags


def test_dump_log_deep_iteration_and_data(capsys, store):
    path = seg_path(store, "t", 0, 6)
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--print-data-log")
    assert rc == 0
    recs = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert recs == [
        f"| offset: 6 CreateTime: {TS + 6} keySize: 2 valueSize: 2 sequence: -1 headerKeys: [h] key: k3 payload: v3",
        f"| offset: 7 CreateTime: {TS + 7} keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] key: k payload: w",
        f"| offset: 8 CreateTime: {TS + 8} keySize: 2 valueSize: 2 sequence: -1 headerKeys: [h] key: k4 payload: v4",
        f"| offset: 9 CreateTime: {TS + 9} keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] key: k payload: w",
        f"| offset: 10 CreateTime: {TS + 10} keySize: 2 valueSize: 2 sequence: -1 headerKeys: [h] key: k5 payload: v5",
        f"| offset: 11 CreateTime: {TS + 11} keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] key: k payload: w",
    ]
    # --deep-iteration alone: metadata, no key or payload.
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--deep-iteration")
    assert [ln for ln in out.splitlines() if ln.startswith("|")][0] == \
        f"| offset: 6 CreateTime: {TS + 6} keySize: 2 valueSize: 2 sequence: -1 headerKeys: [h]"


def test_dump_log_tombstone_keyless_and_skip_metadata(capsys, store):
    path = seg_path(store, "t", 0, 12)
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--print-data-log")
    recs = [ln for ln in out.splitlines() if ln.startswith("|")]
    # offset 14: tombstone (no payload part); offset 16: keyless (no key part)
    assert recs[2] == f"| offset: 14 CreateTime: {TS + 14} keySize: 2 valueSize: -1 sequence: -1 headerKeys: [h] key: k7"
    assert recs[4] == f"| offset: 16 CreateTime: {TS + 16} keySize: -1 valueSize: 2 sequence: -1 headerKeys: [h] payload: v8"
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--print-data-log",
                     "--skip-record-metadata")
    lines = out.splitlines()
    # Kafka's prefix rules: "| key: .." when there is a key, " payload: .." when there is not.
    assert "| key: k6 payload: v6" in lines
    assert "| key: k7" in lines
    assert " payload: v8" in lines


@pytest.mark.parametrize("decoder, key, payload", [
    ("hex", b"k3".hex(), b"v3".hex()),
    ("base64", base64.b64encode(b"k3").decode(), base64.b64encode(b"v3").decode()),
    ("int", "<2 bytes, not an int32>", "<2 bytes, not an int32>"),
])
def test_dump_log_decoders(capsys, store, decoder, key, payload):
    path = seg_path(store, "t", 0, 6)
    # A decoder option implies --print-data-log (Kafka's rule).
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--key-decoder", decoder,
                     "--value-decoder", decoder)
    first = [ln for ln in out.splitlines() if ln.startswith("|")][0]
    assert first.endswith(f" key: {key} payload: {payload}")


def test_dump_log_int_long_and_kafka_decoder_classes(capsys, tmp_path):
    root = tmp_path / "s"
    with segstore.open(str(root)) as st:
        st.create_topic("n")
        st.partition("n", 0).append_batch([struct.pack(">q", -5)], keys=[struct.pack(">i", 42)],
                                          timestamps_ms=[TS])
    path = seg_path(root, "n", 0)
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--key-decoder-class",
                     "org.apache.kafka.tools.api.IntegerDecoder", "--value-decoder", "long")
    assert out.splitlines()[-1].endswith(" key: 42 payload: -5")
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--key-decoder", "none",
                     "--value-decoder", "string")
    line = out.splitlines()[-1]
    assert "key:" not in line and line.endswith("headerKeys: [] payload: " +
                                                struct.pack(">q", -5).decode("utf-8", "replace"))


def test_dump_log_kafka_written_batches(capsys, tmp_path):
    """Batches as a Kafka producer and broker write them (kafka-python's builder): idempotent
    producer fields, gzip, sequences per record."""
    d = tmp_path / "kafka-logs" / "orders-0"
    d.mkdir(parents=True)
    data = bytearray()
    for base, (seq, codec) in zip((0, 3), ((349, 0), (352, 1))):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                      producer_id=5002, producer_epoch=0, base_sequence=seq,
                                      batch_size=1 << 20)
        for i in range(3):
            b.append(i, timestamp=TS + base + i, key=b"key-%d" % (base + i),
                     value=b"value-%d" % (base + i), headers=[("trace", b"x")])
        buf = bytearray(b.build())
        struct.pack_into(">q", buf, 0, base)  # the broker assigns offsets (outside the CRC)
        struct.pack_into(">i", buf, 12, 7)    # and stamps the leader epoch
        data += buf
    path = str(d / "00000000000000000000.log")
    with open(path, "wb") as f:
        f.write(data)
    rc, out, err = run(capsys, "dump-log", "--files", path, "--print-data-log")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    spans = batch_spans(data)
    assert lines[2] == expected_batch_line(data, *spans[0])
    assert "compresscodec: gzip" in lines[6] and lines[6] == expected_batch_line(data, *spans[1])
    assert "lastSequence: 354" in lines[6] and "partitionLeaderEpoch: 7" in lines[6]
    assert lines[7] == (f"| offset: 3 CreateTime: {TS + 3} keySize: 5 valueSize: 7 sequence: 352 "
                        "headerKeys: [trace] key: key-3 payload: value-3")
    assert lines[9].startswith("| offset: 5 ") and " sequence: 354 " in lines[9]


def test_dump_log_sequence_wraps_like_kafka(capsys, tmp_path):
    d = tmp_path / "k" / "w-0"
    d.mkdir(parents=True)
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=1, producer_epoch=0, base_sequence=2**31 - 2,
                                  batch_size=1 << 20)
    for i in range(4):
        b.append(i, timestamp=TS, key=b"k", value=b"v", headers=[])
    path = str(d / "00000000000000000000.log")
    open(path, "wb").write(bytes(b.build()))
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--deep-iteration")
    assert "baseSequence: 2147483646 lastSequence: 1 " in out
    assert [ln.split("sequence: ")[1].split()[0] for ln in out.splitlines()
            if ln.startswith("|")] == ["2147483646", "2147483647", "0", "1"]


def test_dump_log_control_batch(capsys, tmp_path):
    root = tmp_path / "s"
    with segstore.open(str(root)) as st:
        st.create_topic("tx")
        lg = st.partition("tx", 0)
        # Timestamps "now", like the marker's, so no time-based roll separates them.
        lg.append_batch([b"a"], keys=[b"k"], producer_id=9, producer_epoch=2, base_sequence=0,
                        is_transactional=True)
        lg.append_control(ControlRecordType.COMMIT, producer_id=9, producer_epoch=2,
                          coordinator_epoch=5)
    path = seg_path(root, "tx", 0)
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--print-data-log")
    lines = out.splitlines()
    assert "isTransactional: true isControl: true" in lines[4]
    assert lines[5].startswith("| offset: 1 CreateTime: ")
    assert lines[5].endswith(" keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
                             "endTxnMarker: COMMIT coordinatorEpoch: 5")


def test_dump_log_delete_horizon(capsys, tmp_path):
    """A batch stamped with a delete horizon (attribute bit 6, KIP-534) prints it."""
    root = tmp_path / "s"
    with segstore.open(str(root)) as st:
        st.create_topic("c")
        st.partition("c", 0).append_batch([None], keys=[b"gone"], timestamps_ms=[TS])
    path = seg_path(root, "c", 0)
    buf = bytearray(open(path, "rb").read())
    horizon = TS + 86_400_000
    attrs = struct.unpack_from(">h", buf, 21)[0] | 0x40
    struct.pack_into(">h", buf, 21, attrs)
    struct.pack_into(">q", buf, 27, horizon)
    fix_crc(buf)
    open(path, "wb").write(buf)
    rc, out, _ = run(capsys, "dump-log", "--files", path)
    assert f"deleteHorizonMs: OptionalLong[{horizon}] position: 0 " in out
    assert "isvalid: true" in out


def test_dump_log_legacy_v0_v1(capsys, tmp_path):
    d = tmp_path / "old-0"
    d.mkdir()
    data = legacy_message(1, 50, b"k", b"v1", TS) + legacy_message(0, 51, None, b"v0")
    path = str(d / "00000000000000000050.log")
    open(path, "wb").write(data)
    rc, out, _ = run(capsys, "dump-log", "--files", path, "--print-data-log")
    crc1, crc0 = (struct.unpack_from(">I", data, p + 12)[0] for p, _ in batch_spans(data))
    assert out.splitlines()[1:] == [
        "Log starting offset: 50",
        f"offset: 50 position: 0 CreateTime: {TS} size: {len(data) - 28} magic: 1 "
        f"compresscodec: none crc: {crc1} isvalid: true",
        f"| offset: 50 CreateTime: {TS} keySize: 1 valueSize: 2 isValid: true crc: {crc1} "
        "key: k payload: v1",
        f"offset: 51 position: {len(data) - 28} NoTimestampType: -1 size: 28 magic: 0 "
        f"compresscodec: none crc: {crc0} isvalid: true",
        f"| offset: 51 NoTimestampType: -1 keySize: -1 valueSize: 2 isValid: true crc: {crc0} "
        "payload: v0",
    ]
    assert zlib.crc32(data[16:len(data) - 28]) == crc1  # the oracle agrees


def test_dump_log_crc_error_and_fail_on_error(capsys, store):
    path = seg_path(store, "t", 0)
    buf = bytearray(open(path, "rb").read())
    pos, size = batch_spans(buf)[1]
    buf[pos + size - 1] ^= 0xFF  # last byte of the second batch's records
    open(path, "wb").write(buf)
    rc, out, err = run(capsys, "dump-log", "--files", path)
    assert rc == 0  # Kafka's habit: problems are reported, the status stays 0
    batch_lines = out.splitlines()[2:]
    assert [ln.endswith("isvalid: false") for ln in batch_lines] == [False, True, False]
    assert err == (f"Problems in {os.path.abspath(path)}:\n"
                   f"  CRC mismatch in the batch at position {pos}\n")
    rc, _, _ = run(capsys, "dump-log", "--files", path, "--fail-on-error")
    assert rc == 1


def test_dump_log_torn_tail_and_max_bytes(capsys, store):
    path = seg_path(store, "t", 0)
    good = open(path, "rb").read()
    with open(path, "ab") as f:
        f.write(good[:30])  # the start of a batch whose declared size runs past the end
    rc, out, err = run(capsys, "dump-log", "--files", path, "--fail-on-error")
    assert rc == 1
    assert out.splitlines()[-1] == "Found 30 invalid bytes at the end of 00000000000000000000.log"
    assert "30 bytes after the last complete batch" in err
    # --max-bytes: only whole batches inside the limit, no trailing-bytes verdict (Kafka).
    first = batch_spans(good)[0][1]
    rc, out, err = run(capsys, "dump-log", "--files", path, "--max-bytes", first + 10,
                       "--fail-on-error")
    assert (rc, err) == (0, "")
    assert len(out.splitlines()) == 3


def test_dump_log_corrupt_batch_stops_that_file(capsys, store):
    path = seg_path(store, "t", 0)
    buf = bytearray(open(path, "rb").read())
    pos, _ = batch_spans(buf)[1]
    struct.pack_into(">i", buf, pos + 8, 3)  # a size field below Kafka's minimum of 14
    open(path, "wb").write(buf)
    other = seg_path(store, "t", 0, 6)
    rc, out, err = run(capsys, "dump-log", "--files", f"{path},{other}", "--fail-on-error")
    assert rc == 1 and "Traceback" not in err
    assert f"corrupt batch at position {pos}: batch size field is smaller" in err
    assert f"Dumping {other}" in out  # the next file is still dumped


def test_dump_log_non_consecutive_offsets_are_not_errors(capsys, tmp_path):
    root = tmp_path / "s"
    with segstore.open(str(root)) as st:
        st.create_topic("g")
    d = root / "g-0"
    # A batch with an offset gap, as compaction leaves (offset deltas 0 and 2).
    batch = segstore._core.encode_batch([b"a", b"b"], [b"x", b"y"], timestamps_ms=[TS, TS],
                                        offset_deltas=[0, 2])
    with open(d / "00000000000000000000.log", "wb") as f:
        f.write(batch)
    path = str(d / "00000000000000000000.log")
    rc, out, err = run(capsys, "dump-log", "--files", path, "--deep-iteration", "--fail-on-error")
    assert rc == 0
    assert err == f"Non-consecutive offsets in {os.path.abspath(path)}\n  0 is followed by 2\n"


def test_dump_log_directory_unknown_and_missing_files(capsys, store):
    d = os.path.join(str(store), "t-0")
    with open(os.path.join(d, "leader-epoch-checkpoint"), "w") as f:
        f.write("0\n0\n")  # Kafka keeps one in every partition directory
    rc, out, err = run(capsys, "dump-log", "--files", d)
    assert rc == 0
    assert [ln for ln in out.splitlines() if ln.startswith("Dumping")] == [
        f"Dumping {os.path.join(d, n)}" for n in sorted(os.listdir(d)) if n.endswith(".log")]
    rc, out, err = run(capsys, "dump-log", "--files",
                       f"{d}/leader-epoch-checkpoint,{d}/nope.log")
    assert rc == 1
    assert err == (f"Ignoring unknown file {d}/leader-epoch-checkpoint\n"
                   f"segstore dump-log: {d}/nope.log: no such file\n")


# -- dump-log: indexes ------------------------------------------------------------------------

def test_dump_index_and_time_index(capsys, store):
    idx = seg_path(store, "t", 0, 0, ".index")
    tix = seg_path(store, "t", 0, 0, ".timeindex")
    raw = open(idx, "rb").read()
    entries = [struct.unpack_from(">ii", raw, i) for i in range(0, len(raw), 8)]
    traw = open(tix, "rb").read()
    tentries = [struct.unpack_from(">qi", traw, i) for i in range(0, len(traw), 12)]
    assert entries and tentries
    rc, out, err = run(capsys, "dump-log", "--files", f"{idx},{tix}", "--fail-on-error")
    assert (rc, err) == (0, "")
    assert out.splitlines() == (
        [f"Dumping {idx}"] + [f"offset: {rel} position: {pos}" for rel, pos in entries]
        + [f"Dumping {tix}"] + [f"timestamp: {ts} offset: {rel}" for ts, rel in tentries])
    rc, out, _ = run(capsys, "dump-log", "--files", f"{idx},{tix}", "--verify-index-only")
    assert out.splitlines() == [f"Dumping {idx}", f"Dumping {tix}"]
    rc, out, _ = run(capsys, "dump-log", "--files", f"{idx},{tix}", "--index-sanity-check")
    assert out.splitlines() == [f"Dumping {idx}", f"{idx} passed sanity check.",
                                f"Dumping {tix}", f"{tix} passed sanity check."]


def test_dump_index_mismatch(capsys, store):
    idx = seg_path(store, "t", 0, 0, ".index")
    raw = bytearray(open(idx, "rb").read())
    rel, pos = struct.unpack_from(">ii", raw, 0)
    data = open(seg_path(store, "t", 0), "rb").read()
    spans = batch_spans(data)
    # Point the first entry at the first batch, which does not hold its offset.
    struct.pack_into(">ii", raw, 0, rel, 0)
    open(idx, "wb").write(raw)
    first_last = v2_header(data, 0)["last_offset_delta"]
    rc, out, err = run(capsys, "dump-log", "--files", idx, "--fail-on-error")
    assert rc == 1
    assert err == (f"Mismatches in :{os.path.abspath(idx)}\n"
                   f"  Index offset: {rel}, log offset: {first_last}\n")
    assert pos == spans[1][0]


def test_dump_time_index_problems(capsys, store):
    tix = seg_path(store, "t", 0, 0, ".timeindex")
    raw = bytearray(open(tix, "rb").read())
    ts, rel = struct.unpack_from(">qi", raw, 0)
    struct.pack_into(">q", raw, 0, ts - 1)  # the batch's records disagree now
    open(tix, "wb").write(raw)
    rc, out, err = run(capsys, "dump-log", "--files", tix, "--fail-on-error")
    assert rc == 1
    assert err == (f"Found timestamp mismatch in :{os.path.abspath(tix)}\n"
                   f"  Index timestamp: {ts - 1}, log timestamp: {ts}\n")
    struct.pack_into(">qi", raw, 0, ts, 0)  # offset 0 is not the last offset of its batch
    open(tix, "wb").write(raw)
    rc, out, err = run(capsys, "dump-log", "--files", tix)
    # An entry naming the base offset after the first entry ends the dump (preallocated
    # zeros); the first entry is read, though.
    assert "The following indexed offsets are not found in the log.\n" \
           "Indexed offset: 0, found log offset: 1\n" in err


def test_dump_index_sanity_check_fails_out_of_order(capsys, store):
    idx = seg_path(store, "t", 0, 0, ".index")
    raw = bytearray(open(idx, "rb").read())
    a, b = raw[:8], raw[8:16]
    raw[:8], raw[8:16] = b, a
    open(idx, "wb").write(raw)
    rc, out, err = run(capsys, "dump-log", "--files", idx, "--index-sanity-check",
                       "--fail-on-error")
    assert rc == 1
    assert out.splitlines()[1] == f"{idx} failed sanity check: entry 1 is out of order"


def test_dump_empty_index_and_txn_index(capsys, tmp_path):
    d = tmp_path / "x-0"
    d.mkdir()
    open(d / "00000000000000000000.index", "wb").close()
    txn = d / "00000000000000000000.txnindex"
    txn.write_bytes(struct.pack(">hqqqq", 0, 77, 3, 9, 3) + struct.pack(">hqqqq", 0, 78, 10, 12, 10))
    rc, out, _ = run(capsys, "dump-log", "--files",
                     f"{d}/00000000000000000000.index,{txn}")
    assert out.splitlines() == [
        f"Dumping {d}/00000000000000000000.index", f"{d}/00000000000000000000.index is empty.",
        f"Dumping {txn}",
        "version: 0 producerId: 77 firstOffset: 3 lastOffset: 9 lastStableOffset: 3",
        "version: 0 producerId: 78 firstOffset: 10 lastOffset: 12 lastStableOffset: 10"]


def _snapshot_file(entries, version=1) -> bytes:
    body = struct.pack(">i", len(entries)) + b"".join(struct.pack(">qhiqiqiq", *e)
                                                      for e in entries)
    return struct.pack(">hI", version, crc32c.crc32c(body)) + body


def test_dump_producer_snapshot(capsys, tmp_path):
    d = tmp_path / "p-0"
    d.mkdir()
    snap = d / "00000000000000000042.snapshot"
    # (id, epoch, last seq, last offset, offset delta, timestamp, coordinator epoch, txn first)
    snap.write_bytes(_snapshot_file([(5002, 0, 1, 41, 3, TS, -1, -1),
                                     (7, 2, -1, -1, 0, TS + 5, 4, 30)]))
    rc, out, err = run(capsys, "dump-log", "--files", snap, "--fail-on-error")
    assert (rc, err) == (0, "")
    assert out.splitlines()[1:] == [
        # first sequence = 1 - 3 wraps below zero, as Kafka's decrementSequence does
        f"producerId: 5002 producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset: "
        f"OptionalLong.empty lastTimestamp: {TS} firstSequence: {2**31 - 2} lastSequence: 1 "
        f"lastOffset: 41 offsetDelta: 3 timestamp: {TS}",
        f"producerId: 7 producerEpoch: 2 coordinatorEpoch: 4 currentTxnFirstOffset: "
        f"OptionalLong[30] lastTimestamp: {TS + 5} "]
    bad = bytearray(snap.read_bytes())
    bad[-1] ^= 1
    snap.write_bytes(bad)
    rc, out, err = run(capsys, "dump-log", "--files", snap, "--fail-on-error")
    assert rc == 1
    assert err.splitlines()[0].startswith("Snapshot is corrupt (CRC is no longer valid). "
                                          "Stored crc: ")


def test_dump_log_json(capsys, store):
    path = seg_path(store, "t", 0)
    idx = seg_path(store, "t", 0, 0, ".index")
    rc, out, err = run(capsys, "dump-log", "--files", f"{path},{idx}", "--json",
                       "--print-data-log")
    assert (rc, err) == (0, "")
    docs = [json.loads(ln) for ln in out.splitlines()]
    kinds = [d["type"] for d in docs]
    assert kinds == ["file", "log", "batch", "record", "record", "batch", "record", "record",
                     "batch", "record", "record", "file", "index_entry", "index_entry"]
    batch = docs[2]
    assert list(batch)[1:13] == KAFKA_BATCH_FIELDS
    assert batch["deleteHorizonMs"] is None and batch["isvalid"] is True
    assert batch["crc"] == v2_header(open(path, "rb").read())["crc"]
    assert docs[3] == {"type": "record", "offset": 0, "timestampType": "CreateTime",
                       "timestamp": TS, "keySize": 2, "valueSize": 2, "sequence": -1,
                       "headerKeys": ["h"], "key": "k0", "payload": "v0"}
    # problems come as JSON too, on stdout
    buf = bytearray(open(path, "rb").read())
    buf[-1] ^= 1
    open(path, "wb").write(buf)
    rc, out, err = run(capsys, "dump-log", "--files", path, "--json", "--fail-on-error")
    assert rc == 1 and err == ""
    problems = [json.loads(ln) for ln in out.splitlines() if '"problem"' in ln]
    assert problems == [{"type": "problem", "kind": "error", "file": os.path.abspath(path),
                         "message": f"CRC mismatch in the batch at position {batch_spans(buf)[2][0]}"}]


# -- log-dirs, configs, topics ----------------------------------------------------------------

def test_log_dirs_and_topics_over_a_kafka_log_dir(capsys, tmp_path):
    """A Kafka broker's log dir (no segstore metadata) opens: every <topic>-<n> directory is a
    partition."""
    root = tmp_path / "kafka-logs"
    for p in (0, 1):
        d = root / f"orders-{p}"
        d.mkdir(parents=True)
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                      producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                      batch_size=1 << 20)
        b.append(0, timestamp=TS, key=b"k", value=b"v" * (p + 1), headers=[])
        (d / "00000000000000000000.log").write_bytes(bytes(b.build()))
        (d / "leader-epoch-checkpoint").write_text("0\n0\n")
    before = snapshot(root)
    rc, out, _ = run(capsys, "log-dirs", "--describe", "--path", root)
    parts = json.loads(out)["brokers"][0]["logDirs"][0]["partitions"]
    assert [(x["partition"], x["size"]) for x in parts] == [
        ("orders-0", os.path.getsize(root / "orders-0" / "00000000000000000000.log")),
        ("orders-1", os.path.getsize(root / "orders-1" / "00000000000000000000.log"))]
    rc, out, _ = run(capsys, "topics", "--list", "--path", root)
    assert out == "orders\n"
    assert run(capsys, "verify", "--path", root)[0] == 0
    assert snapshot(root) == before  # read-only commands leave a broker's files alone


def test_log_dirs_json_shape(capsys, store):
    rc, out, err = run(capsys, "log-dirs", "--describe", "--path", store)
    assert (rc, err) == (0, "")
    assert out.count("\n") == 1
    doc = json.loads(out)
    sizes = {f"t-{p}": sum(os.path.getsize(os.path.join(store, f"t-{p}", n))
                           for n in os.listdir(os.path.join(store, f"t-{p}")) if n.endswith(".log"))
             for p in (0, 1)}
    assert doc == {"version": 1, "brokers": [{"broker": 0, "logDirs": [{
        "logDir": str(store), "error": None, "partitions": [
            {"partition": "t-0", "size": sizes["t-0"], "offsetLag": 0, "isFuture": False},
            {"partition": "t-1", "size": 0, "offsetLag": 0, "isFuture": False}]}]}]}
    rc, out, err = run(capsys, "log-dirs", "--describe", "--path", store, "--topic-list", "x")
    assert rc == 1 and err == f"segstore log-dirs: error: unknown topic 'x' in {store}\n"


def test_configs_describe_and_alter(capsys, store):
    rc, out, _ = run(capsys, "configs", "--path", store, "--entity-type", "topics",
                     "--entity-name", "t", "--describe")
    assert out.splitlines() == [
        "Dynamic configs for topic t are:",
        "  index.interval.bytes=50 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "index.interval.bytes=50, DEFAULT_CONFIG:log.index.interval.bytes=4096}",
        "  segment.bytes=300 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:segment.bytes=300, "
        "DEFAULT_CONFIG:log.segment.bytes=1073741824}"]
    rc, out, _ = run(capsys, "configs", "--path", store, "--topic", "t", "--alter",
                     "--add-config", "cleanup.policy=[compact,delete],retention.ms=1000",
                     "--delete-config", "index.interval.bytes")
    assert (rc, out) == (0, "Completed updating config for topic t.\n")
    with segstore.open(str(store), readonly=True) as st:
        assert st.topic_config("t").overrides == {"cleanup.policy": ("compact", "delete"),
                                                  "retention.ms": 1000, "segment.bytes": 300}
    rc, out, _ = run(capsys, "configs", "--path", store, "--topic", "t", "--describe", "--all",
                     "--store-config", "log.retention.hours=1")
    lines = out.splitlines()
    assert lines[0] == "All configs for topic t are:"
    assert [ln.split("=")[0].strip() for ln in lines[1:]] == sorted(TOPIC_CONFIG_KEYS)
    assert ("  retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1000, "
            "STATIC_BROKER_CONFIG:log.retention.hours=1, DEFAULT_CONFIG:log.retention.hours=168}"
            ) in lines
    assert "  segment.ms=604800000 sensitive=false synonyms={DEFAULT_CONFIG:log.roll.hours=168}" \
        in lines
    rc, _, err = run(capsys, "configs", "--path", store, "--topic", "t", "--alter",
                     "--delete-config", "flush.ms")
    assert rc == 1 and "flush.ms (not set on topic t)" in err


def test_topics_create_list_describe_delete(capsys, tmp_path):
    root = tmp_path / "new"
    rc, out, _ = run(capsys, "topics", "--create", "--path", root, "--topic", "orders",
                     "--partitions", 3, "--config", "cleanup.policy=compact",
                     "--config", "segment.bytes=1000")
    assert (rc, out) == (0, f"Created store {root}.\nCreated topic orders.\n")
    assert sorted(os.listdir(root / ".segstore" / "topics")) == ["orders.json"]
    assert {"orders-0", "orders-1", "orders-2"} <= set(os.listdir(root))
    rc, _, err = run(capsys, "topics", "--create", "--path", root, "--topic", "orders")
    assert rc == 1 and "already exists" in err
    assert run(capsys, "topics", "--create", "--path", root, "--topic", "orders",
               "--if-not-exists")[0] == 0
    with segstore.open(str(root)) as st:
        st.partition("orders", 1).append_batch([b"a", b"b"], keys=[b"1", b"2"])
    run(capsys, "topics", "--create", "--path", root, "--topic", "audit")
    rc, out, _ = run(capsys, "topics", "--list", "--path", root)
    assert out == "audit\norders\n"
    rc, out, _ = run(capsys, "topics", "--describe", "--path", root, "--topic", "orders")
    size = os.path.getsize(seg_path(root, "orders", 1))
    assert out.splitlines() == [
        "Topic: orders\tPartitionCount: 3\tConfigs: cleanup.policy=compact,segment.bytes=1000",
        "\tTopic: orders\tPartition: 0\tLogStartOffset: 0\tLogEndOffset: 0\tSegments: 1\tSize: 0",
        f"\tTopic: orders\tPartition: 1\tLogStartOffset: 0\tLogEndOffset: 2\tSegments: 1\tSize: {size}",
        "\tTopic: orders\tPartition: 2\tLogStartOffset: 0\tLogEndOffset: 0\tSegments: 1\tSize: 0"]
    rc, out, _ = run(capsys, "topics", "--describe", "--path", root, "--json")
    docs = json.loads(out)
    assert [d["topic"] for d in docs] == ["audit", "orders"]
    assert docs[1]["partition_info"][1] == {"partition": 1, "log_start_offset": 0,
                                            "log_end_offset": 2, "segments": 1,
                                            "size_bytes": size}
    rc, out, _ = run(capsys, "topics", "--delete", "--path", root, "--topic", "orders")
    assert (rc, out) == (0, "Deleted topic orders.\n")
    assert not any(n.startswith("orders") for n in os.listdir(root))
    rc, _, err = run(capsys, "topics", "--delete", "--path", root, "--topic", "orders")
    assert rc == 1 and "does not exist" in err
    assert run(capsys, "topics", "--delete", "--path", root, "--topic", "orders",
               "--if-exists")[0] == 0


def test_topics_create_bad_config_leaves_no_store(capsys, tmp_path):
    rc, _, err = run(capsys, "topics", "--create", "--path", tmp_path / "s", "--topic", "a",
                     "--config", "segment.byte=10")
    assert rc == 1 and "did you mean 'segment.bytes'?" in err
    assert not (tmp_path / "s").exists()


# -- verify, recover, retention ---------------------------------------------------------------

def test_verify_clean_store_changes_nothing(capsys, store):
    before = snapshot(store)
    rc, out, err = run(capsys, "verify", "--path", store)
    assert (rc, err) == (0, "")
    size = sum(v[0] for k, v in before.items() if k.endswith(".log"))
    assert out == f"verified 2 partitions (5 segments, {size} bytes): no problems found\n"
    assert snapshot(store) == before


def test_verify_reports_crc_problem_with_file_and_position(capsys, store):
    path = seg_path(store, "t", 0, 6)
    buf = bytearray(open(path, "rb").read())
    pos, size = batch_spans(buf)[2]
    buf[pos + size - 2] ^= 0x10
    open(path, "wb").write(buf)
    rc, out, _ = run(capsys, "verify", "--path", store)
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == f"t-0: {path} at position {pos}: CRC mismatch"
    assert lines[-1].endswith(": 1 problem found")
    rc, out, _ = run(capsys, "verify", "--path", store, "--json", "--topic", "t")
    doc = json.loads(out)
    assert doc["problems"] == 1
    assert doc["partitions"][0]["problems"] == [{"file": path, "position": pos,
                                                 "message": "CRC mismatch"}]
    assert doc["partitions"][1] == {"topic": "t", "partition": 1, "segments": 1, "bytes": 0,
                                    "problems": []}


def test_recover_truncates_torn_tail(capsys, store):
    last = sorted(n for n in os.listdir(store / "t-0") if n.endswith(".log"))[-1]
    path = store / "t-0" / last
    good = path.read_bytes()
    path.write_bytes(good + good[:40])  # a torn write: half a batch at the end
    rc, out, _ = run(capsys, "verify", "--path", store)
    assert rc == 1 and "incomplete batch at the end of the file" in out
    rc, out, err = run(capsys, "recover", "--path", store)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("t-0: recovered ") and ", truncated 40 bytes;" in lines[0]
    assert lines[0].endswith("; offsets [0, 20)")
    assert lines[-1] == "recovery of 2 partitions (segments above the recovery point): 1 repaired"
    assert path.read_bytes() == good
    assert run(capsys, "verify", "--path", store)[0] == 0


def test_recover_rebuilds_a_damaged_sealed_index_and_says_so(capsys, store):
    idx = store / "t-0" / "00000000000000000000.index"
    raw = bytearray(idx.read_bytes())
    raw[0:8] = struct.pack(">ii", 99, 5)  # out of order: the load-time check rejects it
    idx.write_bytes(raw)
    rc, out, _ = run(capsys, "recover", "--path", store)
    assert rc == 0
    lines = out.splitlines()
    assert lines[1] == (f"  rebuilding the indexes of {store}/t-0/00000000000000000000.log: index "
                        f"{idx}: entry 1 of 2 is out of order (a zero-padded or untrimmed file, "
                        "or damage)")
    assert lines[-1].endswith(": 1 repaired")
    assert struct.unpack_from(">ii", idx.read_bytes(), 0) != (99, 5)
    assert run(capsys, "verify", "--path", store)[0] == 0


def test_recover_full_reads_every_segment(capsys, store):
    rc, out, _ = run(capsys, "recover", "--path", store, "--full", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["full"] is True
    p0, p1 = doc["partitions"]
    assert (p0["topic"], p0["partition"], p0["recovered_segments"], p0["truncated_bytes"],
            p0["deleted_segments"], p0["log_end_offset"]) == ("t", 0, 4, 0, [], 20)
    assert p1["recovered_segments"] == 1
    assert not os.path.exists(store / "recovery-point-offset-checkpoint.tmp")
    # Without --full only the segments above the recovery point are read again.
    rc, out, _ = run(capsys, "recover", "--path", store, "--json")
    assert json.loads(out)["partitions"][0]["recovered_segments"] == 1


def test_retention_dry_run_changes_nothing_then_deletes(capsys, store):
    now = TS + 604_800_000 + 1_000  # one second past retention.ms for every segment
    before = snapshot(store)
    rc, out, _ = run(capsys, "retention", "--path", store, "--dry-run", "--now-ms", now)
    assert rc == 0
    assert out.startswith(f"retention dry run at {now} ms: would delete 4 segments")
    assert snapshot(store) == before
    rc, out, _ = run(capsys, "retention", "--path", store, "--now-ms", now, "--json")
    doc = json.loads(out)
    assert doc["dry_run"] is False and doc["segments_deleted"] == 4
    p0 = doc["partitions"][0]
    assert (p0["topic"], p0["log_start_offset"], p0["rolled"]) == ("t", 20, True)
    assert [d["reason"] for d in p0["deleted"]] == ["retention.ms"] * 4
    assert [d["base_offset"] for d in p0["deleted"]] == [0, 6, 12, 18]
    assert sorted(n for n in os.listdir(store / "t-0") if n.endswith(".log")) == \
        ["00000000000000000020.log"]


# -- plan-cleaner -----------------------------------------------------------------------------

def test_plan_cleaner_numbers_fit(capsys):
    # By hand: 10,000,000 keys / 8 partitions = 1,250,000 keys a partition. 134,217,728 bytes
    # / 2 threads = 67,108,864; / 24 = 2,796,202.67 -> 2,796,202 slots; x 0.9 = 2,516,581.8
    # -> 2,516,581 keys a round. Dirty ratio 0.5: dirty > 1 x clean, so up to 1,250,000 keys:
    # one round. One round in the worst case needs floor(slots x 0.9) > 1,250,000, so
    # slots >= 1,250,001 / 0.9 = 1,388,890 slots x 24 x 2 threads = 66,666,720 bytes.
    rc, out, _ = run(capsys, "plan-cleaner", "--unique-keys", "10,000,000", "--partitions", 8,
                     "--threads", 2, "--dirty-ratio", 0.5)
    assert rc == 0
    for fragment in ("ceil(10,000,000 keys / 8 partitions) = 1,250,000",
                     "134,217,728 bytes / 2 threads = 67,108,864 bytes",
                     "floor(67,108,864 / 24) = 2,796,202",
                     "floor(2,796,202 x 0.9 load factor) = 2,516,581",
                     "usual: 1   worst case (every key dirty): 1",
                     "= 1,388,890 slots x 24 bytes x 2 threads = 66,666,720 bytes",
                     "Fits: log.cleaner.dedupe.buffer.size=134217728"):
        assert fragment in out, fragment
    rc, out, _ = run(capsys, "plan-cleaner", "--unique-keys", 10_000_000, "--partitions", 8,
                     "--threads", 2, "--json")
    doc = json.loads(out)
    assert {k: doc[k] for k in ("keys_per_partition", "buffer_per_thread", "slots_per_thread",
                                "keys_per_round", "rounds_worst", "slots_needed",
                                "buffer_needed", "fits")} == {
        "keys_per_partition": 1_250_000, "buffer_per_thread": 67_108_864,
        "slots_per_thread": 2_796_202, "keys_per_round": 2_516_581, "rounds_worst": 1,
        "slots_needed": 1_388_890, "buffer_needed": 66_666_720, "fits": True}


def test_plan_cleaner_numbers_too_small(capsys):
    # By hand: 100,000,000 / 4 = 25,000,000 keys. 134,217,728 / 24 = 5,592,405 slots; x 0.9 =
    # 5,033,164.5 -> 5,033,164 keys a round. Ratio 0.2: dirty > 0.25 x 25,000,000 =
    # 6,250,000, so 6,250,001 records, as many keys: floor(6,250,001 / 5,033,164) + 1 = 2
    # rounds; every key dirty: floor(25,000,000 / 5,033,164) + 1 = 5 rounds. One round needs
    # floor(slots x 0.9) > 25,000,000: slots >= 25,000,001 / 0.9 = 27,777,778.9 -> 27,777,779
    # slots x 24 = 666,666,696 bytes.
    rc, out, _ = run(capsys, "plan-cleaner", "--unique-keys", 100_000_000, "--partitions", 4,
                     "--dirty-ratio", 0.2, "--buffer-size", "128m")
    assert rc == 0
    assert "about 6,250,001 new records" in out
    assert "usual: 2   worst case (every key dirty): 5" in out
    assert "27,777,779 slots x 24 bytes x 1 thread = 666,666,696 bytes" in out
    assert "Set log.cleaner.dedupe.buffer.size=666666696" in out


def test_plan_cleaner_caps_a_thread_at_2_gib(capsys):
    rc, out, _ = run(capsys, "plan-cleaner", "--unique-keys", 1000, "--buffer-size", "8g",
                     "--json")
    doc = json.loads(out)
    assert doc["buffer_per_thread"] == 2**31 - 1
    assert doc["slots_per_thread"] == (2**31 - 1) // 24


def test_plan_cleaner_takes_defaults_from_store_config(capsys):
    rc, out, _ = run(capsys, "plan-cleaner", "--unique-keys", 1000, "--json",
                     "--store-config", "log.cleaner.threads=4",
                     "--store-config", "log.cleaner.dedupe.buffer.size=96000,"
                                       "log.cleaner.io.buffer.load.factor=0.5")
    doc = json.loads(out)
    # 96,000 / 4 threads = 24,000 bytes = 1,000 slots; x 0.5 = 500 keys a round. 1,000 keys:
    # two rounds stop on a full map after 500 keys each, and a third finishes: 3 rounds.
    assert (doc["threads"], doc["buffer_per_thread"], doc["slots_per_thread"],
            doc["keys_per_round"], doc["rounds_worst"]) == (4, 24_000, 1_000, 500, 3)
    rc, _, err = run(capsys, "plan-cleaner", "--unique-keys", 10, "--store-config",
                     "log.cleaner.thread=2")
    assert rc == 1 and "Unknown configuration 'log.cleaner.thread'" in err


def test_plan_cleaner_from_store_counts_distinct_keys(capsys, tmp_path):
    root = tmp_path / "s"
    with segstore.open(str(root)) as st:
        st.create_topic("users", 2, config={"cleanup.policy": "compact"})
        st.create_topic("plain", 1)
        lg = st.partition("users", 0)
        for i in range(30):  # 7 distinct keys, plus keyless records that never enter the map
            append_batch_unvalidated(lg, [b"v", b"w"], keys=[b"key-%d" % (i % 7), None])
        st.partition("users", 1).append_batch([b"v"] * 3, keys=[b"a", b"b", b"a"])
    rc, out, _ = run(capsys, "plan-cleaner", "--store", root, "--json", "--threads", 1)
    doc = json.loads(out)
    rows = {(r["topic"], r["partition"]): (r["records"], r["keys"]) for r in doc["partitions"]}
    assert rows == {("users", 0): (60, 7), ("users", 1): (3, 2)}  # "plain" is not compacted
    assert doc["keys_per_partition"] == 7
    # floor(slots x 0.9) > 7: slots >= 8 / 0.9 = 8.9 -> 9
    assert doc["slots_needed"] == 9 and doc["buffer_needed"] == 9 * 24
    rc, out, _ = run(capsys, "plan-cleaner", "--store", root, "--topic", "plain")
    assert "plain-0" in out and rc == 0
    rc, _, err = run(capsys, "plan-cleaner", "--store", root, "--partitions", 3)
    assert rc == 2 and "--partitions goes with --unique-keys" in err


# -- describe and compact ---------------------------------------------------------------------

@pytest.fixture
def compacted(tmp_path):
    """Topic ``users`` (compact, 2 partitions): partition 0 holds 40 updates of 5 keys, a
    tombstone for k1 and an active segment; topic ``plain`` is not compacted."""
    root = tmp_path / "c"
    with segstore.open(str(root)) as st:
        st.create_topic("users", 2, config={"cleanup.policy": "compact", "segment.bytes": 400,
                                            "delete.retention.ms": 1000})
        st.create_topic("plain", 1)
        lg = st.partition("users", 0)
        for i in range(40):
            lg.append_batch([b"v%d" % i], keys=[b"k%d" % (i % 5)], timestamps_ms=[TS + i])
        lg.append_batch([None], keys=[b"k1"], timestamps_ms=[TS + 100])
        for i in range(10):
            lg.append_batch([b"x%d" % i], keys=[b"z%d" % (i % 5)], timestamps_ms=[TS + 200 + i])
    return root


def test_describe_reports_dirty_section(capsys, compacted):
    now = TS + 1_000
    rc, out, _ = run(capsys, "describe", "--path", compacted, "--now-ms", now, "--json")
    assert rc == 0
    doc = json.loads(out)
    parts = {(p["topic"], p["partition"]): p for p in doc["partitions"]}
    assert set(parts) == {("plain", 0), ("users", 0), ("users", 1)}
    assert parts[("plain", 0)]["cleaner"] is None
    p0 = parts[("users", 0)]
    c = p0["cleaner"]
    logs = sorted(n for n in os.listdir(compacted / "users-0") if n.endswith(".log"))
    sizes = [os.path.getsize(compacted / "users-0" / n) for n in logs]
    assert p0["segments"] == len(logs) and p0["size_bytes"] == sum(sizes)
    assert c["first_dirty_offset"] == 0 and c["clean_bytes"] == 0
    assert c["cleanable_bytes"] == sum(sizes[:-1])  # everything but the active segment
    assert c["first_uncleanable_offset"] == int(logs[-1][:20])
    assert c["dirty_ratio"] == 1.0 and c["eligible"] is True and c["uncleanable"] is False
    assert p0["tombstones"] == {"awaiting": 0, "removable": 0, "earliest_horizon_ms": None}
    rc, out, _ = run(capsys, "describe", "--path", compacted, "--topic", "users",
                     "--partition", 0, "--now-ms", now)
    lines = out.splitlines()
    assert lines[0] == "users-0"
    assert "dirty ratio 1.000 > min.cleanable.dirty.ratio 0.5" in lines[2]
    assert lines[-1].startswith("  eligible: ")
    rc, out, _ = run(capsys, "describe", "--path", compacted, "--topic", "plain")
    assert "not compacted" in out


def test_compact_dry_run_changes_nothing_then_compacts(capsys, compacted):
    now = TS + 1_000
    before = snapshot(compacted)
    rc, out, _ = run(capsys, "compact", "--path", compacted, "--dry-run", "--now-ms", now)
    assert rc == 0
    assert out.splitlines()[0].startswith("would clean users-0: dirty section [0, ")
    assert out.splitlines()[-1] == ("dry run: would clean 1 of 2 compacted partitions; "
                                    "nothing changed")
    assert snapshot(compacted) == before
    rc, out, _ = run(capsys, "describe", "--path", compacted, "--topic", "users", "--partition",
                     0, "--now-ms", now, "--json")
    end = json.loads(out)["partitions"][0]["cleaner"]["first_uncleanable_offset"]
    rc, out, _ = run(capsys, "compact", "--path", compacted, "--now-ms", now)
    assert rc == 0
    lines = out.splitlines()
    head = [ln for ln in lines if ln.startswith("\tLog cleaner thread")]
    assert len(head) == 1 and "cleaned log users-0 (dirty section = [0, " in head[0]
    assert any(ln.startswith("\tStart size: ") and ln.endswith("(50 messages)") for ln in lines)
    assert any(ln.startswith("\tEnd size: ") for ln in lines)
    with segstore.open(str(compacted), readonly=True) as st:
        latest = {}
        for r in st.partition("users", 0).iter_records(end_offset=end):
            latest.setdefault(r.key, []).append(r.value)
    # Below the active segment one record per key is left, the tombstone included (until its
    # horizon has passed).
    assert all(len(v) == 1 for v in latest.values())
    assert latest[b"k1"] == [None] and latest[b"k0"] == [b"v35"]
    # Now the tombstone waits for its horizon: now + delete.retention.ms.
    rc, out, _ = run(capsys, "describe", "--path", compacted, "--topic", "users",
                     "--partition", 0, "--now-ms", now + 10, "--json")
    t = json.loads(out)["partitions"][0]["tombstones"]
    assert t == {"awaiting": 1, "removable": 0, "earliest_horizon_ms": now + 1_000}
    rc, out, _ = run(capsys, "compact", "--path", compacted, "--now-ms", now)
    assert out.startswith("nothing was cleaned")


def test_compact_errors(capsys, compacted):
    rc, _, err = run(capsys, "compact", "--path", compacted, "--topic", "plain")
    assert rc == 1 and "is not compacted" in err
    rc, _, err = run(capsys, "compact", "--path", compacted, "--topic", "users",
                     "--partition", 9)
    assert rc == 1 and "has no partition 9" in err


def test_compact_force_and_json(capsys, compacted):
    rc, out, _ = run(capsys, "compact", "--path", compacted, "--topic", "users", "--json",
                     "--now-ms", TS + 1_000)
    doc = json.loads(out)
    assert [(c["topic"], c["partition"]) for c in doc["cleaned"]] == [("users", 0)]
    stats = doc["cleaned"][0]["stats"]
    assert stats["messages_read"] == 50 and stats["first_dirty_offset"] == 0
    assert doc["cleaned"][0]["summary"].startswith("\n\tLog cleaner thread")
    # Nothing dirty is left, but --force still cleans the partition's clean section again.
    rc, out, _ = run(capsys, "compact", "--path", compacted, "--topic", "users",
                     "--partition", 0, "--force", "--dry-run", "--now-ms", TS + 1_000)
    assert "would skip users-0" in out or "would clean users-0" in out


# -- progress ---------------------------------------------------------------------------------

class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_on_a_terminal_only():
    tty = _Tty()
    with Progress(200, "verify", stream=tty, unit="B") as bar:
        bar.advance(100, "t-0")
        bar.advance(100, "t-1")
    text = tty.getvalue()
    assert text.startswith("\rverify [") and "100% 200B/200B t-1" in text
    assert text.endswith("\r\x1b[K")  # the bar is erased at the end
    piped = io.StringIO()
    with Progress(200, "verify", stream=piped) as bar:
        bar.advance(200)
    assert piped.getvalue() == ""


def test_long_commands_draw_the_bar_on_a_terminal(store, monkeypatch):
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["verify", "--path", str(store)]) == 0
    assert "\rverify [" in tty.getvalue() and "100%" in tty.getvalue()
    tty.seek(0)
    tty.truncate()
    assert main(["verify", "--path", str(store), "--no-progress"]) == 0
    assert tty.getvalue() == ""


def test_commands_stay_quiet_when_piped(capsys, store):
    # capsys's stderr is not a terminal: no bar, so stderr stays empty.
    rc, _, err = run(capsys, "verify", "--path", store)
    assert (rc, err) == (0, "")
    rc, _, err = run(capsys, "dump-log", "--files", os.path.join(str(store), "t-0"))
    assert (rc, err) == (0, "")
