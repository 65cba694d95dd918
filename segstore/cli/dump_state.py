"""``segstore dump-log`` over the producer-state files: ``.txnindex`` (aborted transactions)
and ``.snapshot`` (producer state), in Kafka's tool's lines."""

from __future__ import annotations

import struct
import sys

from .. import _core
from ..producer_state import SNAPSHOT_ENTRY, SNAPSHOT_HEADER, SNAPSHOT_VERSION
from ..transaction_index import CURRENT_VERSION, entry_version
from ._common import print_json
from .dump_common import DumpOptions, Findings, read_file

_INT32_MAX = 0x7FFFFFFF
_TXN_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, LSO (34 B)


def dump_txn_index(path: str, opts: DumpOptions, findings: Findings) -> None:
    """Print each aborted transaction of a ``.txnindex`` file; trailing bytes are a problem."""
    data = read_file(path)
    n, extra = divmod(len(data), _TXN_ENTRY.size)
    for i in range(n):
        version, pid, first, last, lso = _TXN_ENTRY.unpack_from(data, i * _TXN_ENTRY.size)
        version = entry_version(version)  # Kafka prints AbortedTxn.version(): the first byte
        if version > CURRENT_VERSION:     # where Kafka's iterator throws
            problem = (f"Unexpected aborted transaction version {version} in transaction index "
                       f"{path}, current version is {CURRENT_VERSION}")
            print(problem, file=sys.stderr)
            findings.add(findings.problems, path, problem)
            return
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
    # Kafka's DefaultRecordBatch.decrementSequence, the inverse of increment_sequence.
    if seq < dec:
        return _INT32_MAX - (dec - seq) + 1
    return seq - dec


def dump_snapshot(path: str, opts: DumpOptions, findings: Findings) -> None:
    """Print each producer of a ``.snapshot`` file, or why the file is unreadable (stderr)."""
    data = read_file(path)
    problem = None
    if len(data) < SNAPSHOT_HEADER.size:
        problem = f"Snapshot failed schema validation: {len(data)} bytes is too short"
    else:
        # readSnapshot's order: the schema read (count whole entries; bytes after them are not
        # looked at), then the version, then the CRC of every byte after byte 6
        version, crc, count = SNAPSHOT_HEADER.unpack_from(data, 0)
        computed = _core.crc32c(data[6:])
        if count < 0 or len(data) < SNAPSHOT_HEADER.size + count * SNAPSHOT_ENTRY.size:
            problem = f"Snapshot failed schema validation: {count} entries in {len(data)} bytes"
        elif version != SNAPSHOT_VERSION:
            problem = f"Snapshot contained an unknown file version {version}"
        elif crc != computed:
            problem = (f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
                       f"Computed crc: {computed}")
    if problem is not None:
        # Kafka prints the CorruptSnapshotException's message on stderr and carries on.
        print(problem, file=sys.stderr)
        findings.add(findings.problems, path, problem)
        return
    for i in range(count):
        pid, epoch, last_seq, last_offset, delta, ts, coord, txn_first = \
            SNAPSHOT_ENTRY.unpack_from(data, SNAPSHOT_HEADER.size + i * SNAPSHOT_ENTRY.size)
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
