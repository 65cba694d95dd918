"""``segstore dump-log``: Kafka's ``kafka-dump-log.sh`` (DumpLogSegments) over segment files.

Kafka's flags, Kafka's line formats and field order (ECO §6.1), over ``.log``, ``.index``,
``.timeindex``, ``.txnindex`` and ``.snapshot`` files written by segstore or by a Kafka broker.
segstore adds ``--key-decoder/--value-decoder`` (string, hex, base64, int, long, none),
``--json`` (one object per line) and ``--fail-on-error`` (exit 1 on CRC, index, offset-order or
trailing-byte problems: Kafka always exits 0). A directory in ``--files`` stands for its ``.log``
files.

Differences from Kafka, each deliberate: an offset-index entry is a mismatch only when the batch
at its position does not hold its offset (Kafka's tool also flags an entry that names a non-last
offset of its batch, which Kafka's own multi-batch appends write); an index that ends inside an
entry is a problem (Kafka's tool ignores the partial entry); corrupt data ends that file's dump
with a message instead of a stack trace.

This module is the command (flags, decoders, dispatch by file kind); the dumpers are in
``dump_log``, ``dump_index`` and ``dump_state``, what they share in ``dump_common``.
"""

from __future__ import annotations

import argparse
import base64
import os
import struct
import sys
from typing import Callable, Optional

from ._common import CommandError, UsageError, print_json, progress
from .dump_common import DumpOptions, Findings, base_offset, file_size
from .dump_index import dump_index, dump_time_index
from .dump_log import dump_log
from .dump_state import dump_snapshot, dump_txn_index


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
        "dump-log", help="print segment, index, transaction-index and producer snapshot files "
                         "(kafka-dump-log.sh)",
        description="Dump .log, .index, .timeindex, .txnindex and .snapshot files, written by "
                    "segstore or by Kafka, in kafka-dump-log.sh's format. Problems are "
                    "summarised on stderr; the exit status is 0 unless a file does not exist "
                    "or --fail-on-error is given and a problem is found.")
    p.add_argument("--files", required=True, metavar="FILE1,FILE2,...",
                   type=_file_list,
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
                   help="exit 1 when a CRC, index, offset-order, trailing-byte or producer "
                        "snapshot problem is found")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=run)


def _file_list(text: str) -> list:
    files = [f for f in text.split(",") if f.strip()]
    if not files:
        raise argparse.ArgumentTypeError("names no file")
    return files


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
    opts = DumpOptions(
        print_data=print_data, deep=args.deep_iteration or print_data,
        skip_metadata=args.skip_record_metadata, index_sanity=args.index_sanity_check,
        verify_only=args.verify_index_only, max_message_size=args.max_message_size,
        max_bytes=args.max_bytes,
        key_decoder=_decoder(args.key_decoder, args.key_decoder_class, "key"),
        value_decoder=_decoder(args.value_decoder, args.value_decoder_class, "value"),
        json=args.json)
    files = _expand(args.files)
    findings = Findings()
    missing = 0
    total = sum(file_size(f) for f in files if f.endswith(".log"))
    with progress(args, total, "dump-log", unit="B", quiet_if_stdout_tty=True) as bar:
        for path in files:
            if not os.path.exists(path):
                # Kafka stops with a stack trace; one line and the next file is more useful.
                print(f"segstore dump-log: {path}: no such file", file=sys.stderr)
                missing += 1
                continue
            _dump_file(path, opts, findings, bar)
    if opts.json:
        findings.print_json()
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


def _dump_file(path: str, opts: DumpOptions, findings: Findings, bar) -> None:
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
    if kind not in ("txnindex", "snapshot") and base_offset(path) is None:
        findings.add(findings.problems, path,
                     "the file name does not start with a base offset (20 digits)")
        return
    if kind == "log":
        dump_log(path, opts, findings, bar)
    elif kind == "index":
        dump_index(path, opts, findings)
    elif kind == "timeindex":
        dump_time_index(path, opts, findings)
    elif kind == "snapshot":
        dump_snapshot(path, opts, findings)
    else:
        dump_txn_index(path, opts, findings)
