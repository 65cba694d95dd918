"""``segstore dump-log`` over ``.index`` and ``.timeindex`` files: their entries, each checked
against the segment's ``.log`` as Kafka's tool does, and ``--index-sanity-check``."""

from __future__ import annotations

import bisect
import os
import struct
from typing import Optional

from .. import _core
from ..errors import CorruptRecordError
from ._common import print_json
from .dump_common import (DumpOptions, Findings, MappedFile, base_offset, file_size, read_file,
                          sibling)


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


def dump_index(path: str, opts: DumpOptions, findings: Findings) -> None:
    """Print an ``.index`` file's entries, each checked against the batch at its position."""
    base = base_offset(path)
    data = read_file(path)
    entries = _index_entries(data, struct.Struct(">ii"))
    if not entries:
        if opts.json:
            print_json({"type": "empty_index", "file": path})
        else:
            print(f"{path} is empty.")
        # Kafka's tool stops here; bytes that are no whole entry are still damage.
        _partial_entry(path, data, 8, findings)
        return
    log_path = sibling(path, ".log")
    if opts.index_sanity:
        _report_sanity(path, _sanity(data, entries, False,
                                     file_size(log_path) if os.path.exists(log_path) else None),
                       opts, findings)
        return
    _partial_entry(path, data, 8, findings)
    log = _open_log(path, log_path, findings)
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


def _partial_entry(path: str, data: bytes, size: int, findings: Findings) -> None:
    """A problem when the file ends inside an entry (a torn write or a truncated file)."""
    extra = len(data) % size
    if extra:
        findings.add(findings.problems, path,
                     f"the file ends inside an entry: {extra} bytes after the last whole "
                     f"{size}-byte entry, at position {len(data) - extra}")


def _open_log(path: str, log_path: str, findings: Findings) -> Optional[MappedFile]:
    """The index's segment ``log_path``, or None (a problem of ``path``) when it is missing."""
    if not os.path.exists(log_path):
        findings.add(findings.problems, path,
                     f"no log file {log_path} to check the entries against")
        return None
    return MappedFile(log_path)


def _batch_at(log: MappedFile, position: int, max_size: int):
    """(first offset, last offset) of the batch starting at ``position``, or None."""
    if position < 0 or position >= log.size:
        return None
    b = _core.scan_batches(log.buf, position, min(log.size, position + max_size),
                           max_batches=1, raise_on_corrupt=False).batches
    if not len(b):
        return None
    first = int(b["base_offset"][0]) if int(b["base_offset"][0]) >= 0 else int(b["last_offset"][0])
    return first, int(b["last_offset"][0])


def _report_sanity(path, reason, opts: DumpOptions, findings: Findings) -> None:
    if opts.json:
        print_json({"type": "sanity_check", "file": path, "passed": reason is None,
                    "reason": reason})
    elif reason is None:
        print(f"{path} passed sanity check.")
    else:
        print(f"{path} failed sanity check: {reason}")
    if reason is not None:
        findings.add(findings.problems, path, f"sanity check failed: {reason}")


def dump_time_index(path: str, opts: DumpOptions, findings: Findings) -> None:
    """Print a ``.timeindex`` file's entries, each checked against the batch ending at its
    offset (found from the offset index) and that batch's largest timestamp."""
    base = base_offset(path)
    data = read_file(path)
    entries = _index_entries(data, struct.Struct(">qi"))
    if opts.index_sanity:
        _report_sanity(path, _sanity(data, entries, True, None), opts, findings)
        return
    _partial_entry(path, data, 12, findings)
    log_path = sibling(path, ".log")
    log = _open_log(path, log_path, findings)
    index_path = sibling(path, ".index")
    offset_entries = (_index_entries(read_file(index_path), struct.Struct(">ii"))
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


def _first_batch_reaching(log: MappedFile, start: int, offset: int):
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


def _max_record_timestamp(log: MappedFile, b, log_path: str) -> int:
    pos, size = int(b["position"]), int(b["size"])
    try:
        recs = _core.decode_records(log.buf, pos, pos + size, validate_crc=False,
                                    include_control=True, file=log_path)
    except CorruptRecordError:
        return -1
    return max((r.timestamp for r in recs), default=-1)
