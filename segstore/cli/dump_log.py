"""``segstore dump-log`` over ``.log`` files: Kafka's batch lines and, with deep iteration,
its record lines, plus the CRC, offset-order and torn-tail checks."""

from __future__ import annotations

import os
import struct
import zlib

from .. import _core
from ..errors import CorruptRecordError
from ..producer_state import increment_sequence
from ._common import print_json
from .dump_common import DumpOptions, Findings, MappedFile, base_offset

_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_TS_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}
_CONTROL_TYPES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER",
                  4: "SNAPSHOT_FOOTER", 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}
_SCAN_CHUNK = 4096  # batches per scan call: bounded memory on multi-GB segments


def _crc_valid(buf, b) -> bool:
    pos, size = int(b["position"]), int(b["size"])
    if int(b["magic"]) >= 2:
        return _core.crc32c(memoryview(buf)[pos + 21:pos + size]) == int(b["crc"])
    return (zlib.crc32(memoryview(buf)[pos + 16:pos + size]) & 0xFFFFFFFF) == int(b["crc"])


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
            lastSequence=-1 if base_seq < 0 else increment_sequence(base_seq, delta),
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


def dump_log(path: str, opts: DumpOptions, findings: Findings, bar) -> None:
    """Print a ``.log`` file's batches (and records, with deep iteration); advance ``bar`` by
    the bytes read."""
    base = base_offset(path)
    if opts.json:
        print_json({"type": "log", "file": path, "logStartingOffset": base})
    else:
        print(f"Log starting offset: {base}")
    with MappedFile(path) as m:
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


def _dump_records(path, buf, b, fields, opts: DumpOptions, findings: Findings,
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
                                   increment_sequence(base_seq, r.offset - int(b["base_offset"])))
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
