"""What the ``segstore dump-log`` dumpers share: the options, the findings summary and read-only
access to segment files by name."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..segment_files import read_map
from ._common import print_json


@dataclass
class DumpOptions:
    """The parsed ``dump-log`` flags every dumper reads (decoders None mean: leave it out)."""

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


# Kafka's stderr sections: (Findings attribute, header, entry line, JSON kind, JSON field names).
_SECTIONS = (
    ("index_mismatches", "Mismatches in :{path}", "  Index offset: {0}, log offset: {1}",
     "index_mismatch", ("indexOffset", "logOffset")),
    ("time_mismatches", "Found timestamp mismatch in :{path}",
     "  Index timestamp: {0}, log timestamp: {1}",
     "time_index_mismatch", ("indexTimestamp", "logTimestamp")),
    ("time_out_of_order", "Found out of order timestamp in :{path}",
     "  Index timestamp: {0}, Previously indexed timestamp: {1}",
     "time_index_out_of_order", ("indexTimestamp", "previousTimestamp")),
    ("time_not_found", "The following indexed offsets are not found in the log.",
     "Indexed offset: {0}, found log offset: {1}",
     "time_index_offset_not_found", ("indexOffset", "logOffset")),
    ("non_consecutive", "Non-consecutive offsets in {path}", "  {0} is followed by {1}",
     "non_consecutive_offsets", ("offset", "nextOffset")),
)


@dataclass
class Findings:
    """What a dump found, per file, printed on stderr at the end (Kafka's summary sections)."""

    index_mismatches: dict = field(default_factory=dict)     # path -> [(index offset, log offset)]
    time_mismatches: dict = field(default_factory=dict)      # path -> [(index ts, log ts)]
    time_out_of_order: dict = field(default_factory=dict)    # path -> [(ts, previous ts)]
    time_not_found: dict = field(default_factory=dict)       # path -> [(index offset, log offset)]
    non_consecutive: dict = field(default_factory=dict)      # path -> [(offset, next offset)]
    problems: dict = field(default_factory=dict)             # path -> [message] (segstore's own)

    def add(self, table: dict, path: str, item) -> None:
        """Record ``item`` for ``path`` in one of the tables above."""
        table.setdefault(os.path.abspath(path), []).append(item)

    @property
    def failed(self) -> bool:
        """Anything --fail-on-error fails on (offset gaps alone are normal after compaction)."""
        return any((self.index_mismatches, self.time_mismatches, self.time_out_of_order,
                    self.time_not_found, self.problems))

    def print(self, stream) -> None:
        """Kafka's stderr sections, then segstore's problems."""
        for name, header, line, _, _ in _SECTIONS:
            for path, items in getattr(self, name).items():
                print(header.format(path=path), file=stream)
                for a, b in items:
                    print(line.format(a, b), file=stream)
        for path, items in self.problems.items():
            print(f"Problems in {path}:", file=stream)
            for msg in items:
                print(f"  {msg}", file=stream)

    def print_json(self) -> None:
        """The same, one JSON ``problem`` object a finding on stdout."""
        for name, _, _, kind, (first, second) in _SECTIONS:
            for path, items in getattr(self, name).items():
                for a, b in items:
                    print_json({"type": "problem", "kind": kind, "file": path, first: a,
                                second: b})
        for path, items in self.problems.items():
            for msg in items:
                print_json({"type": "problem", "kind": "error", "file": path, "message": msg})


class MappedFile:
    """A read-only view of a whole file (mmap; ``b""`` for an empty file)."""

    def __init__(self, path: str):
        self._f = open(path, "rb")
        size = os.fstat(self._f.fileno()).st_size
        # read_map: a dump may be the first to read a cold segment in from disk (folio size).
        self.buf = read_map(self._f.fileno(), size) if size else b""
        self.size = size

    def close(self) -> None:
        """Unmap and close the file."""
        if isinstance(self.buf, mmap.mmap):
            self.buf.close()
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_file(path: str) -> bytes:
    """The whole file."""
    with open(path, "rb") as f:
        return f.read()


def file_size(path: str) -> int:
    """Bytes in ``path``; 0 when it cannot be read."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def base_offset(path: str) -> Optional[int]:
    """The base offset a segment file's name starts with, or None."""
    try:
        return int(os.path.basename(path).split(".", 1)[0])
    except ValueError:
        return None


def sibling(path: str, suffix: str) -> str:
    """The file of the same segment with another suffix (``.log`` beside an ``.index``)."""
    name = os.path.basename(path)
    return os.path.join(os.path.dirname(os.path.abspath(path)), name.split(".", 1)[0] + suffix)
