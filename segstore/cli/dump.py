"""``segstore dump-log``: Kafka's ``kafka-dump-log.sh`` (DumpLogSegments) over segment files.

Kafka's flags, Kafka's line formats and field order (ECO §6.1), over ``.log``, ``.index``,
``.timeindex``, ``.txnindex`` and ``.snapshot`` files written by segstore or by a Kafka broker.
segstore adds ``--key-decoder/--value-decoder`` (string, hex, base64, int, long, none),
``--json`` (one object per line) and ``--fail-on-error`` (exit 1 on CRC, index, offset-order or
trailing-byte problems: Kafka always exits 0). A directory in ``--files`` stands for its ``.log``
files.

Differences from Kafka, each deliberate: an offset-index entry is a mismatch only when the batch
at its position does not hold its offset (Kafka's tool also flags an entry that names a non-last
offset of its batch, which Kafka's own multi-batch appends write); corrupt data ends that file's
dump with a message instead of a stack trace.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import mmap
import os
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import _core
from ..errors import CorruptRecordError
from ._common import CommandError, UsageError, print_json, progress

_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_TS_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}
_CONTROL_TYPES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER",
                  4: "SNAPSHOT_FOOTER", 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}
_INT32_MAX = 0x7FFFFFFF
_TXN_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, LSO (34 B)
# Producer snapshot (REF §2.5): version, CRC-32C of the bytes after byte 6, entry count; then per
# producer: id, epoch, last sequence, last offset, offset delta, timestamp, coordinator epoch,
# current transaction's first offset (46 B).
_SNAPSHOT_HEADER = struct.Struct(">hIi")
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
_SCAN_CHUNK = 4096  # batches per scan call: bounded memory on multi-GB segments


def _decode_int(b: bytes) -> str:
    return str(struct.unpack(">i", b)[0]) if len(b) == 4 else f"<{len(b)} bytes, not an int32>"


def _decode_long(b: bytes) -> str:
    return str(struct.unpack(">q", b)[0]) if len(b) == 8 else f"<{len(b)} bytes, not an int64>"


#: --key-decoder / --value-decoder choices. "string" is Kafka's StringDecoder (UTF-8; invalid
#: bytes replaced, as Java's String does); "none" leaves the field out.
DECODERS: dict[str, Optional[Callable[[bytes], str]]] = {
    "string": lambda b: b.decode("utf-8", "replace"),
    "hex": lambda b: b.hex(),
    "base64": lambda b: base64.b64encode(b).decode("ascii"),
    "int": _decode_int,
    "long": _decode_long,
    "none": None,
}
# Kafka's decoder classes, so copied command lines keep working.
_KAFKA_DECODER_CLASSES = {
    "org.apache.kafka.tools.api.StringDecoder": "string",
    "kafka.serializer.StringDecoder": "string",
    "org.apache.kafka.tools.api.IntegerDecoder": "int",
    "kafka.serializer.IntegerDecoder": "int",
    "org.apache.kafka.tools.api.LongDecoder": "long",
    "kafka.serializer.LongDecoder": "long",
    "org.apache.kafka.tools.api.DefaultDecoder": "hex",
    "kafka.serializer.DefaultDecoder": "hex",
}


def register(subparsers) -> None:
    """Add the ``dump-log`` subcommand."""
    p = subparsers.add_parser(
        "dump-log", help="print segment, index and transaction-index files (kafka-dump-log.sh)",
        description="Dump .log, .index, .timeindex and .txnindex files, written by segstore or "
                    "by Kafka, in kafka-dump-log.sh's format. Problems are summarised on stderr; "
                    "the exit status is 0 unless --fail-on-error is given.")
    p.add_argument("--files", required=True, metavar="FILE1,FILE2,...",
                   type=lambda s: [f for f in s.split(",") if f],
                   help="REQUIRED: comma-separated .log, .index, .timeindex, .txnindex and "
                        ".snapshot files to dump; a directory means its .log files")
    p.add_argument("--print-data-log", action="store_true",
                   help="print record keys and payloads (implied by a decoder option)")
    p.add_argument("--deep-iteration", action="store_true",
                   help="print every record, not only batch headers (implied by --print-data-log)")
    p.add_argument("--skip-record-metadata", action="store_true",
                   help="print only the key and payload of each record")
    p.add_argument("--index-sanity-check", action="store_true",
                   help="only check that .index/.timeindex entries are usable")
    p.add_argument("--verify-index-only", action="store_true",
                   help="check index entries against the log without printing them")
    p.add_argument("--max-message-size", type=int, default=5 * 1024 * 1024, metavar="SIZE",
                   help="largest batch an index entry may point at (default 5 MiB)")
    p.add_argument("--max-bytes", type=int, default=None, metavar="SIZE",
                   help="read only the batches inside the first SIZE bytes of each .log file")
    p.add_argument("--key-decoder", choices=sorted(DECODERS), default=None,
                   help="how to print keys (default string)")
    p.add_argument("--value-decoder", choices=sorted(DECODERS), default=None,
                   help="how to print payloads (default string)")
    p.add_argument("--key-decoder-class", default=None, metavar="CLASS",
                   help="Kafka's name for --key-decoder (StringDecoder, IntegerDecoder, ...)")
    p.add_argument("--value-decoder-class", default=None, metavar="CLASS",
                   help="Kafka's name for --value-decoder")
    for flag in ("--offsets-decoder", "--transaction-log-decoder", "--cluster-metadata-decoder",
                 "--remote-log-metadata-decoder"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)  # rejected in run()
    p.add_argument("--json", action="store_true",
                   help="one JSON object per file, batch, record, index entry and problem")
    p.add_argument("--fail-on-error", action="store_true",
                   help="exit 1 when a CRC, index, offset-order or trailing-byte problem is found")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=run)


@dataclass
class _Options:
    print_data: bool
    deep: bool
    skip_metadata: bool
    index_sanity: bool
    verify_only: bool
    max_message_size: int
    max_bytes: Optional[int]
    key_decoder: Optional[Callable]
    value_decoder: Optional[Callable]
    json: bool


@dataclass
class _Findings:
    """What a dump found, per file, printed on stderr at the end (Kafka's summary sections)."""

    index_mismatches: dict = field(default_factory=dict)     # path -> [(index offset, log offset)]
    time_mismatches: dict = field(default_factory=dict)      # path -> [(index ts, log ts)]
    time_out_of_order: dict = field(default_factory=dict)    # path -> [(ts, previous ts)]
    time_not_found: dict = field(default_factory=dict)       # path -> [(index offset, log offset)]
    non_consecutive: dict = field(default_factory=dict)      # path -> [(offset, next offset)]
    problems: dict = field(default_factory=dict)             # path -> [message] (segstore's own)

    def add(self, table: dict, path: str, item) -> None:
        table.setdefault(os.path.abspath(path), []).append(item)

    @property
    def failed(self) -> bool:
        """Anything --fail-on-error fails on (offset gaps alone are normal after compaction)."""
        return any((self.index_mismatches, self.time_mismatches, self.time_out_of_order,
                    self.time_not_found, self.problems))

    def print(self, stream) -> None:
        """Kafka's stderr sections, then segstore's problems."""
        for path, items in self.index_mismatches.items():
            print(f"Mismatches in :{path}", file=stream)
            for idx, off in items:
                print(f"  Index offset: {idx}, log offset: {off}", file=stream)
        for path, items in self.time_mismatches.items():
            print(f"Found timestamp mismatch in :{path}", file=stream)
            for idx, ts in items:
                print(f"  Index timestamp: {idx}, log timestamp: {ts}", file=stream)
        for path, items in self.time_out_of_order.items():
            print(f"Found out of order timestamp in :{path}", file=stream)
            for ts, prev in items:
                print(f"  Index timestamp: {ts}, Previously indexed timestamp: {prev}",
                      file=stream)
        for items in self.time_not_found.values():
            print("The following indexed offsets are not found in the log.", file=stream)
            for idx, off in items:
                print(f"Indexed offset: {idx}, found log offset: {off}", file=stream)
        for path, items in self.non_consecutive.items():
            print(f"Non-consecutive offsets in {path}", file=stream)
            for a, b in items:
                print(f"  {a} is followed by {b}", file=stream)
        for path, items in self.problems.items():
            print(f"Problems in {path}:", file=stream)
            for msg in items:
                print(f"  {msg}", file=stream)


def _decoder(name: Optional[str], cls: Optional[str], which: str):
    if cls is not None:
        if name is not None:
            raise UsageError(f"give --{which}-decoder or --{which}-decoder-class, not both")
        short = _KAFKA_DECODER_CLASSES.get(cls) or _KAFKA_DECODER_CLASSES.get(
            "org.apache.kafka.tools.api." + cls)
        if short is None:
            raise UsageError(
                f"decoder class {cls!r} is Java; use --{which}-decoder "
                f"{{{','.join(sorted(DECODERS))}}}")
        name = short
    return DECODERS[name or "string"]


def run(args) -> int:
    """Dump every file named by ``--files`` in order; returns the exit status."""
    for flag in ("offsets_decoder", "transaction_log_decoder", "cluster_metadata_decoder",
                 "remote_log_metadata_decoder"):
        if getattr(args, flag):
            raise UsageError(f"--{flag.replace('_', '-')} is not supported: segstore "
                             "stores no Kafka internal topics")
    if args.max_bytes is not None and args.max_bytes < 0:
        raise UsageError("--max-bytes must not be negative")
    if args.max_message_size <= 0:
        raise UsageError("--max-message-size must be positive")
    any_decoder = any(x is not None for x in (args.key_decoder, args.value_decoder,
                                              args.key_decoder_class, args.value_decoder_class))
    print_data = args.print_data_log or any_decoder
    opts = _Options(
        print_data=print_data, deep=args.deep_iteration or print_data,
        skip_metadata=args.skip_record_metadata, index_sanity=args.index_sanity_check,
        verify_only=args.verify_index_only, max_message_size=args.max_message_size,
        max_bytes=args.max_bytes,
        key_decoder=_decoder(args.key_decoder, args.key_decoder_class, "key"),
        value_decoder=_decoder(args.value_decoder, args.value_decoder_class, "value"),
        json=args.json)
    files = _expand(args.files)
    findings = _Findings()
    missing = 0
    total = sum(_size(f) for f in files if f.endswith(".log"))
    with progress(args, total, "dump-log", unit="B", quiet_if_stdout_tty=True) as bar:
        for path in files:
            if not os.path.exists(path):
                # Kafka stops with a stack trace; one line and the next file is more useful.
                print(f"segstore dump-log: {path}: no such file", file=sys.stderr)
                missing += 1
                continue
            _dump_file(path, opts, findings, bar)
    if opts.json:
        _json_findings(findings)
    else:
        sys.stdout.flush()
        findings.print(sys.stderr)
    if missing:
        return 1
    return 1 if (args.fail_on_error and findings.failed) else 0


def _expand(items: list) -> list:
    out = []
    for item in items:
        if os.path.isdir(item):
            logs = sorted(n for n in os.listdir(item) if n.endswith(".log"))
            if not logs:
                raise CommandError(f"{item}: no .log files in this directory")
            out.extend(os.path.join(item, n) for n in logs)
        else:
            out.append(item)
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _base_offset(path: str) -> Optional[int]:
    try:
        return int(os.path.basename(path).split(".", 1)[0])
    except ValueError:
        return None


def _dump_file(path: str, opts: _Options, findings: _Findings, bar) -> None:
    name = os.path.basename(path)
    suffix = name[name.rfind("."):] if "." in name else ""
    kind = {".log": "log", ".index": "index", ".timeindex": "timeindex",
            ".txnindex": "txnindex", ".snapshot": "snapshot"}.get(suffix)
    if opts.json:
        print_json({"type": "file", "file": path, "kind": kind})
    else:
        print(f"Dumping {path}")
    if kind is None:
        print(f"Ignoring unknown file {path}", file=sys.stderr)
        return
    if kind not in ("txnindex", "snapshot") and _base_offset(path) is None:
        findings.add(findings.problems, path,
                     "the file name does not start with a base offset (20 digits)")
        return
    if kind == "log":
        _dump_log(path, opts, findings, bar)
    elif kind == "index":
        _dump_index(path, opts, findings)
    elif kind == "timeindex":
        _dump_time_index(path, opts, findings)
    elif kind == "snapshot":
        _dump_snapshot(path, opts, findings)
    else:
        _dump_txn_index(path, opts, findings)


class _Mapped:
    """A read-only view of a whole file (mmap; ``b""`` for an empty file)."""

    def __init__(self, path: str):
        self._f = open(path, "rb")
        size = os.fstat(self._f.fileno()).st_size
        self.buf = mmap.mmap(self._f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
        self.size = size

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            self.buf.close()
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- .log ------------------------------------------------------------------------------------

def _crc_valid(buf, b) -> bool:
    pos, size = int(b["position"]), int(b["size"])
    if int(b["magic"]) >= 2:
        return _core.crc32c(memoryview(buf)[pos + 21:pos + size]) == int(b["crc"])
    return (zlib.crc32(memoryview(buf)[pos + 16:pos + size]) & 0xFFFFFFFF) == int(b["crc"])


def _increment_sequence(seq: int, inc: int) -> int:
    # Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from Int.MAX to 0.
    if seq > _INT32_MAX - inc:
        return inc - (_INT32_MAX - seq) - 1
    return seq + inc


def _batch_fields(b, position: int, crc_ok: bool) -> dict:
    magic = int(b["magic"])
    attrs = int(b["attributes"])
    ts_type = -1 if magic == 0 else (attrs >> 3) & 1
    out: dict = {}
    if magic >= 2:
        base_seq = int(b["base_sequence"])
        delta = int(b["last_offset_delta"])
        out.update(
            baseOffset=int(b["base_offset"]), lastOffset=int(b["last_offset"]),
            count=int(b["records_count"]), baseSequence=base_seq,
            lastSequence=-1 if base_seq < 0 else _increment_sequence(base_seq, delta),
            producerId=int(b["producer_id"]), producerEpoch=int(b["producer_epoch"]),
            partitionLeaderEpoch=int(b["partition_leader_epoch"]),
            isTransactional=bool(attrs & 0x10), isControl=bool(attrs & 0x20),
            deleteHorizonMs=int(b["base_timestamp"]) if attrs & 0x40 else None)
    else:
        out["offset"] = int(b["last_offset"])
    out.update(position=position, timestampType=_TS_TYPES[ts_type],
               maxTimestamp=int(b["max_timestamp"]), size=int(b["size"]), magic=magic,
               compresscodec=_CODECS[attrs & 7] if attrs & 7 < len(_CODECS) else str(attrs & 7),
               crc=int(b["crc"]), isvalid=crc_ok)
    return out


def _batch_text(f: dict) -> str:
    if "baseOffset" in f:
        horizon = ("OptionalLong.empty" if f["deleteHorizonMs"] is None
                   else f"OptionalLong[{f['deleteHorizonMs']}]")
        head = (f"baseOffset: {f['baseOffset']} lastOffset: {f['lastOffset']} count: {f['count']} "
                f"baseSequence: {f['baseSequence']} lastSequence: {f['lastSequence']} "
                f"producerId: {f['producerId']} producerEpoch: {f['producerEpoch']} "
                f"partitionLeaderEpoch: {f['partitionLeaderEpoch']} "
                f"isTransactional: {_b(f['isTransactional'])} isControl: {_b(f['isControl'])} "
                f"deleteHorizonMs: {horizon}")
    else:
        head = f"offset: {f['offset']}"
    return (f"{head} position: {f['position']} {f['timestampType']}: {f['maxTimestamp']} "
            f"size: {f['size']} magic: {f['magic']} compresscodec: {f['compresscodec']} "
            f"crc: {f['crc']} isvalid: {_b(f['isvalid'])}")


def _b(v: bool) -> str:
    return "true" if v else "false"


def _dump_log(path: str, opts: _Options, findings: _Findings, bar) -> None:
    base = _base_offset(path)
    if opts.json:
        print_json({"type": "log", "file": path, "logStartingOffset": base})
    else:
        print(f"Log starting offset: {base}")
    with _Mapped(path) as m:
        buf = m.buf
        end = m.size if opts.max_bytes is None else min(m.size, opts.max_bytes)
        pos = 0
        last_offset = -1           # the last record offset seen (deep iteration)
        prev_batch_last = None     # offsets must grow from batch to batch
        error = None
        while True:
            res = _core.scan_batches(buf, pos, end, raise_on_corrupt=False,
                                     max_batches=_SCAN_CHUNK, file=path)
            for b in res.batches:
                position = int(b["position"])
                crc_ok = _crc_valid(buf, b)
                fields = _batch_fields(b, position, crc_ok)
                if opts.json:
                    print_json({"type": "batch", **fields})
                else:
                    print(_batch_text(fields))
                if not crc_ok:
                    findings.add(findings.problems, path,
                                 f"CRC mismatch in the batch at position {position}")
                # A compressed legacy wrapper does not say its first offset (-1): use its last.
                first = int(b["base_offset"]) if b["base_offset"] >= 0 else int(b["last_offset"])
                if prev_batch_last is not None and first <= prev_batch_last:
                    findings.add(findings.problems, path,
                                 f"offsets do not increase: the batch at position {position} "
                                 f"starts at {first} after offset {prev_batch_last}")
                prev_batch_last = max(int(b["last_offset"]),
                                      -1 if prev_batch_last is None else prev_batch_last)
                if opts.deep:
                    last_offset = _dump_records(path, buf, b, fields, opts, findings, last_offset)
                bar.advance(int(b["size"]))
            pos = res.valid_end
            if res.error is not None:
                error = res.error
                break
            if len(res.batches) < _SCAN_CHUNK or res.torn:
                break
        trailing = m.size - pos if opts.max_bytes is None else 0
        if error is not None:
            findings.add(findings.problems, path,
                         f"corrupt batch at position {error.position}: {error.reason}")
        if trailing > 0:
            if opts.json:
                print_json({"type": "invalid_bytes", "file": path, "bytes": trailing})
            else:
                print(f"Found {trailing} invalid bytes at the end of {os.path.basename(path)}")
            if error is None:
                findings.add(findings.problems, path,
                             f"{trailing} bytes after the last complete batch (a torn write)")
        bar.advance(max(m.size - pos, 0))


def _records_of(path: str, buf, b):
    """(records, valid): the batch's records (control ones too), decoded without stopping at a
    bad CRC, and whether every checksum held (legacy records carry their own)."""
    pos, size = int(b["position"]), int(b["size"])
    try:
        return _core.decode_records(buf, pos, pos + size, validate_crc=True,
                                    include_control=True, file=path), True
    except CorruptRecordError as e:
        if "CRC" not in e.reason:
            raise
    return _core.decode_records(buf, pos, pos + size, validate_crc=False, include_control=True,
                                file=path), False


def _dump_records(path, buf, b, fields, opts: _Options, findings: _Findings,
                  last_offset: int) -> int:
    try:
        records, valid = _records_of(path, buf, b)
    except CorruptRecordError as e:
        findings.add(findings.problems, path,
                     f"records of the batch at position {int(b['position'])}: {e.reason}")
        return last_offset
    magic = int(b["magic"])
    control = bool(fields.get("isControl"))
    ts_type = fields["timestampType"]
    for r in records:
        if last_offset != -1 and r.offset != last_offset + 1:
            findings.add(findings.non_consecutive, path, (last_offset, r.offset))
            if r.offset <= last_offset:
                findings.add(findings.problems, path,
                             f"record offset {r.offset} follows offset {last_offset}")
        last_offset = r.offset
        rec: dict = {"offset": r.offset}
        if not opts.skip_metadata:
            rec.update(timestampType=ts_type, timestamp=r.timestamp,
                       keySize=r.serialized_key_size, valueSize=r.serialized_value_size)
            if magic >= 2:
                base_seq = int(b["base_sequence"])
                rec["sequence"] = (-1 if base_seq < 0 else
                                   _increment_sequence(base_seq, r.offset - int(b["base_offset"])))
                rec["headerKeys"] = [h[0] for h in r.headers]
            else:
                rec.update(isValid=valid, crc=r.checksum)
            if control:
                rec.update(_control_fields(r))
        if opts.print_data and not control:
            if r.key is not None and opts.key_decoder is not None:
                rec["key"] = opts.key_decoder(r.key)
            if r.value is not None and opts.value_decoder is not None:
                rec["payload"] = opts.value_decoder(r.value)
        if opts.json:
            print_json({"type": "record", **rec})
        else:
            print(_record_text(rec, opts.skip_metadata))
    return last_offset


def _control_fields(r) -> dict:
    key = r.key or b""
    type_id = struct.unpack_from(">h", key, 2)[0] if len(key) >= 4 else -1
    name = _CONTROL_TYPES.get(type_id, "UNKNOWN")
    if name in ("ABORT", "COMMIT") and r.value is not None and len(r.value) >= 6:
        return {"endTxnMarker": name, "coordinatorEpoch": struct.unpack_from(">i", r.value, 2)[0]}
    return {"controlType": f"{name}({type_id})"}


def _record_text(rec: dict, skip_metadata: bool) -> str:
    # Kafka's prefix dance: "| " opens whichever part comes first, later parts get one space;
    # "payload" always gets exactly one space (so a keyless record without metadata starts
    # with " payload:").
    line, prefix = "", "| "
    if not skip_metadata:
        line += (f"{prefix}offset: {rec['offset']} {rec['timestampType']}: {rec['timestamp']} "
                 f"keySize: {rec['keySize']} valueSize: {rec['valueSize']}")
        if "sequence" in rec:
            line += f" sequence: {rec['sequence']} headerKeys: [{','.join(rec['headerKeys'])}]"
        else:
            line += f" isValid: {_b(rec['isValid'])} crc: {rec['crc']}"
        if "endTxnMarker" in rec:
            line += (f" endTxnMarker: {rec['endTxnMarker']} "
                     f"coordinatorEpoch: {rec['coordinatorEpoch']}")
        elif "controlType" in rec:
            line += f" controlType: {rec['controlType']}"
        prefix = " "
    if "key" in rec:
        line += f"{prefix}key: {rec['key']}"
    if "payload" in rec:
        line += f" payload: {rec['payload']}"
    return line


# -- .index and .timeindex -------------------------------------------------------------------

def _index_entries(buf: bytes, entry: struct.Struct) -> list:
    """Entries up to the first zero entry after the first (the preallocated tail), as Kafka's
    tool reads them."""
    out = []
    for i in range(len(buf) // entry.size):
        fields = entry.unpack_from(buf, i * entry.size)
        rel = fields[0] if entry.size == 8 else fields[1]
        if i > 0 and rel == 0:
            break
        out.append(fields)
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _sibling(path: str, suffix: str) -> str:
    name = os.path.basename(path)
    return os.path.join(os.path.dirname(os.path.abspath(path)), name.split(".", 1)[0] + suffix)


def _sanity(data: bytes, entries: list, time_index: bool,
            log_size: Optional[int]) -> Optional[str]:
    """Why the index entries are unusable, or None. Stricter than Kafka's startup check, like
    segstore's own load-time check: entries must be in order and inside the log."""
    size = 12 if time_index else 8
    if len(data) % size:
        return f"length {len(data)} is not a multiple of {size}"
    keys = [e[0] for e in entries]   # relative offsets (offset index) or timestamps
    rels = [e[1] if time_index else e[0] for e in entries]
    for i in range(1, len(entries)):
        if keys[i] <= keys[i - 1] or rels[i] < rels[i - 1]:
            return f"entry {i} is out of order"
    if entries and min(rels) < 0:
        return "an entry names an offset below the base offset"
    if not time_index and log_size is not None and entries and entries[-1][1] > log_size:
        return "the last entry points past the end of the log"
    return None


def _dump_index(path: str, opts: _Options, findings: _Findings) -> None:
    base = _base_offset(path)
    data = _read(path)
    entries = _index_entries(data, struct.Struct(">ii"))
    if not entries:
        if opts.json:
            print_json({"type": "empty_index", "file": path})
        else:
            print(f"{path} is empty.")
        return
    log_path = _sibling(path, ".log")
    if opts.index_sanity:
        _report_sanity(path, _sanity(data, entries, False,
                                     _size(log_path) if os.path.exists(log_path) else None),
                       opts, findings)
        return
    if not os.path.exists(log_path):
        findings.add(findings.problems, path,
                     f"no log file {log_path} to check the entries against")
        log = None
    else:
        log = _Mapped(log_path)
    try:
        for rel, position in entries:
            offset = base + rel
            if log is not None:
                found = _batch_at(log, position, opts.max_message_size)
                if found is None or not found[0] <= offset <= found[1]:
                    findings.add(findings.index_mismatches, path,
                                 (offset, -1 if found is None else found[1]))
            if not opts.verify_only:
                if opts.json:
                    print_json({"type": "index_entry", "offset": offset, "position": position})
                else:
                    print(f"offset: {offset} position: {position}")
    finally:
        if log is not None:
            log.close()


def _batch_at(log: _Mapped, position: int, max_size: int):
    """(first offset, last offset) of the batch starting at ``position``, or None."""
    if position < 0 or position >= log.size:
        return None
    b = _core.scan_batches(log.buf, position, min(log.size, position + max_size),
                           max_batches=1, raise_on_corrupt=False).batches
    if not len(b):
        return None
    first = int(b["base_offset"][0]) if int(b["base_offset"][0]) >= 0 else int(b["last_offset"][0])
    return first, int(b["last_offset"][0])


def _report_sanity(path, reason, opts: _Options, findings: _Findings) -> None:
    if opts.json:
        print_json({"type": "sanity_check", "file": path, "passed": reason is None,
                    "reason": reason})
    elif reason is None:
        print(f"{path} passed sanity check.")
    else:
        print(f"{path} failed sanity check: {reason}")
    if reason is not None:
        findings.add(findings.problems, path, f"sanity check failed: {reason}")


def _dump_time_index(path: str, opts: _Options, findings: _Findings) -> None:
    base = _base_offset(path)
    data = _read(path)
    entries = _index_entries(data, struct.Struct(">qi"))
    if opts.index_sanity:
        _report_sanity(path, _sanity(data, entries, True, None), opts, findings)
        return
    log_path = _sibling(path, ".log")
    if not os.path.exists(log_path):
        findings.add(findings.problems, path,
                     f"no log file {log_path} to check the entries against")
        log = None
    else:
        log = _Mapped(log_path)
    index_path = _sibling(path, ".index")
    offset_entries = (_index_entries(_read(index_path), struct.Struct(">ii"))
                      if os.path.exists(index_path) else [])
    index_offsets = [base + rel for rel, _ in offset_entries]
    prev_ts = -1
    try:
        for ts, rel in entries:
            offset = base + rel
            if log is not None:
                # Kafka's check: the offset-index floor, then the first batch reaching the
                # offset must end exactly there and its records' largest timestamp must match.
                i = bisect.bisect_right(index_offsets, offset) - 1
                start = offset_entries[i][1] if i >= 0 else 0
                b = _first_batch_reaching(log, start, offset)
                if b is None:
                    findings.add(findings.time_not_found, path, (offset, -1))
                elif int(b["last_offset"]) != offset:
                    findings.add(findings.time_not_found, path, (offset, int(b["last_offset"])))
                else:
                    max_ts = _max_record_timestamp(log, b, log_path)
                    if max_ts != ts:
                        findings.add(findings.time_mismatches, path, (ts, max_ts))
                    if prev_ts >= ts:
                        findings.add(findings.time_out_of_order, path, (ts, prev_ts))
            if not opts.verify_only:
                if opts.json:
                    print_json({"type": "time_index_entry", "timestamp": ts, "offset": offset})
                else:
                    print(f"timestamp: {ts} offset: {offset}")
            prev_ts = ts
    finally:
        if log is not None:
            log.close()


def _first_batch_reaching(log: _Mapped, start: int, offset: int):
    pos = start if 0 <= start < log.size else 0
    while pos < log.size:
        res = _core.scan_batches(log.buf, pos, log.size, max_batches=256, raise_on_corrupt=False)
        for b in res.batches:
            if int(b["last_offset"]) >= offset:
                return b
        if not len(res.batches) or res.error is not None or res.torn:
            return None
        pos = res.valid_end
    return None


def _max_record_timestamp(log: _Mapped, b, log_path: str) -> int:
    pos, size = int(b["position"]), int(b["size"])
    try:
        recs = _core.decode_records(log.buf, pos, pos + size, validate_crc=False,
                                    include_control=True, file=log_path)
    except CorruptRecordError:
        return -1
    return max((r.timestamp for r in recs), default=-1)


# -- .txnindex -------------------------------------------------------------------------------

def _dump_txn_index(path: str, opts: _Options, findings: _Findings) -> None:
    data = _read(path)
    n, extra = divmod(len(data), _TXN_ENTRY.size)
    for i in range(n):
        version, pid, first, last, lso = _TXN_ENTRY.unpack_from(data, i * _TXN_ENTRY.size)
        if opts.json:
            print_json({"type": "aborted_txn", "version": version, "producerId": pid,
                        "firstOffset": first, "lastOffset": last, "lastStableOffset": lso})
        else:
            print(f"version: {version} producerId: {pid} firstOffset: {first} "
                  f"lastOffset: {last} lastStableOffset: {lso}")
    if extra:
        findings.add(findings.problems, path,
                     f"{extra} bytes after the last whole 34-byte entry")


# -- .snapshot (producer state) --------------------------------------------------------------

def _decrement_sequence(seq: int, dec: int) -> int:
    # Kafka's DefaultRecordBatch.decrementSequence, the inverse of _increment_sequence.
    if seq < dec:
        return _INT32_MAX - (dec - seq) + 1
    return seq - dec


def _dump_snapshot(path: str, opts: _Options, findings: _Findings) -> None:
    data = _read(path)
    problem = None
    if len(data) < _SNAPSHOT_HEADER.size:
        problem = f"Snapshot failed schema validation: {len(data)} bytes is too short"
    else:
        version, crc, count = _SNAPSHOT_HEADER.unpack_from(data, 0)
        computed = _core.crc32c(data[6:])
        if version != 1:
            problem = f"Snapshot contained an unknown file version {version}"
        elif crc != computed:
            problem = (f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
                       f"Computed crc: {computed}")
        elif count < 0 or len(data) != _SNAPSHOT_HEADER.size + count * _SNAPSHOT_ENTRY.size:
            problem = f"Snapshot failed schema validation: {count} entries in {len(data)} bytes"
    if problem is not None:
        # Kafka prints the CorruptSnapshotException's message on stderr and carries on.
        print(problem, file=sys.stderr)
        findings.add(findings.problems, path, problem)
        return
    for i in range(count):
        pid, epoch, last_seq, last_offset, delta, ts, coord, txn_first = \
            _SNAPSHOT_ENTRY.unpack_from(data, _SNAPSHOT_HEADER.size + i * _SNAPSHOT_ENTRY.size)
        entry = {"producerId": pid, "producerEpoch": epoch, "coordinatorEpoch": coord,
                 "currentTxnFirstOffset": txn_first if txn_first >= 0 else None,
                 "lastTimestamp": ts}
        if last_offset >= 0:  # a producer known only from a marker has no batch metadata
            entry.update(firstSequence=_decrement_sequence(last_seq, delta),
                         lastSequence=last_seq, lastOffset=last_offset, offsetDelta=delta,
                         timestamp=ts)
        if opts.json:
            print_json({"type": "producer_snapshot_entry", **entry})
            continue
        first = ("OptionalLong.empty" if entry["currentTxnFirstOffset"] is None
                 else f"OptionalLong[{txn_first}]")
        line = (f"producerId: {pid} producerEpoch: {epoch} coordinatorEpoch: {coord} "
                f"currentTxnFirstOffset: {first} lastTimestamp: {ts} ")
        if last_offset >= 0:
            line += (f"firstSequence: {entry['firstSequence']} lastSequence: {last_seq} "
                     f"lastOffset: {last_offset} offsetDelta: {delta} timestamp: {ts}")
        print(line)


def _json_findings(f: _Findings) -> None:
    for kind, table, names in (
            ("index_mismatch", f.index_mismatches, ("indexOffset", "logOffset")),
            ("time_index_mismatch", f.time_mismatches, ("indexTimestamp", "logTimestamp")),
            ("time_index_out_of_order", f.time_out_of_order,
             ("indexTimestamp", "previousTimestamp")),
            ("time_index_offset_not_found", f.time_not_found, ("indexOffset", "logOffset")),
            ("non_consecutive_offsets", f.non_consecutive, ("offset", "nextOffset"))):
        for path, items in table.items():
            for a, b in items:
                print_json({"type": "problem", "kind": kind, "file": path, names[0]: a,
                            names[1]: b})
    for path, items in f.problems.items():
        for msg in items:
            print_json({"type": "problem", "kind": "error", "file": path, "message": msg})
