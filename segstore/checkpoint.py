"""Kafka's offset checkpoint files (REF §4.5), written atomically.

Format: a version line (0), a count line, then ``<topic> <partition> <offset>`` lines. Files
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and
``cleaner-offset-checkpoint`` share it.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from .errors import SegstoreError
from .records import TopicPartition

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


class CheckpointError(SegstoreError):
    """A checkpoint file that does not follow Kafka's format."""


_LINE_END = re.compile(r"\r\n|\r|\n")           # BufferedReader.readLine's line ends
_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]+")    # Java's \s
# What Integer/Long.parseInt take: an ASCII sign, then digits read by Character.digit(char, 10),
# i.e. any Unicode decimal digit (category Nd, Python's \d) that is one UTF-16 char (BMP).
_INT = re.compile(r"[+-]?\d+")


def _parse_int(text: str, path: str, what: str, bits: int = 32) -> int:
    if (not _INT.fullmatch(text) or max(text) > "\uffff"
            or not -(1 << bits - 1) <= int(text) < 1 << bits - 1):
        raise CheckpointError(f"{path}: malformed {what}")
    return int(text)


def fsync_dir(path: str) -> None:
    """fsync a directory so renames and creations in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_path(path: str) -> str:
    tmp = path + ".tmp"
    if len(os.path.basename(tmp)) > 255:  # a long topic name: keep the temp name legal
        import hashlib
        tmp = os.path.join(os.path.dirname(path),
                           "." + hashlib.sha1(path.encode()).hexdigest() + ".tmp")
    return tmp


def write_atomic(path: str, text: str) -> None:
    """Write ``path`` via ``path.tmp``: write, fsync, rename over, fsync the directory."""
    write_atomic_many({path: text})


def write_atomic_many(files: Mapping[str, str]) -> None:
    """:func:`write_atomic` for files of one directory, with one directory fsync: each temp
    file is written and fsynced, then all are renamed over. After a crash each file is either
    its old or its new version (not necessarily the same for all)."""
    renames = []
    for path, text in files.items():
        tmp = _temp_path(path)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        renames.append((tmp, path))
    for tmp, path in renames:
        os.replace(tmp, path)
    for directory in {os.path.dirname(os.path.abspath(p)) for p in files}:
        fsync_dir(directory)


def create_marker(path: str) -> None:
    """Create an empty marker file durably: an empty file has no content to tear, so it is
    created in place and only its directory is fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.close(fd)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


class OffsetCheckpointFile:
    """One checkpoint file of per-partition offsets."""

    def __init__(self, path: str):
        self.path = path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file with these entries (atomic)."""
        write_atomic(self.path, self.text(offsets))

    @staticmethod
    def text(offsets: Mapping[TopicPartition, int]) -> str:
        """The file's contents for these entries."""
        lines = ["0", str(len(offsets))]
        lines += [f"{tp[0]} {tp[1]} {off}" for tp, off in sorted(offsets.items())]
        return "\n".join(lines) + "\n"

    def read(self) -> dict[TopicPartition, int]:
        """The entries; {} when the file is missing, empty or has no count line (as Kafka's
        CheckpointReadBuffer returns an empty list). Malformed files raise, by Kafka's
        reader's rules: lines end at ``\n``, ``\r`` or ``\r\n``; numbers take no padding; an
        entry splits on runs of whitespace into exactly three fields (a blank line or a
        leading blank does not), ignoring trailing blanks; the file is UTF-8."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.path}: not UTF-8 ({e.reason} at byte {e.start})") \
                from None
        lines = _LINE_END.split(text)
        if lines[-1] == "":
            lines.pop()  # the last line's end
        if not lines:
            return {}
        version = _parse_int(lines[0], self.path, "version line")
        if version != 0:
            raise CheckpointError(f"{self.path}: unrecognized version {version}")
        if len(lines) < 2:
            return {}  # CheckpointReadBuffer.read: no count line means no entries
        count = _parse_int(lines[1], self.path, "count line")
        entries = lines[2:]
        if len(entries) != count:
            raise CheckpointError(f"{self.path}: expected {count} entries but found {len(entries)}")
        out = {}
        for ln in entries:
            fields = _WHITESPACE.split(ln)
            while fields and fields[-1] == "":
                fields.pop()  # Java's String.split drops trailing empty fields
            if len(fields) != 3:
                raise CheckpointError(f"{self.path}: malformed line {ln!r}")
            out[TopicPartition(fields[0], _parse_int(fields[1], self.path, f"line {ln!r}"))] = \
                _parse_int(fields[2], self.path, f"line {ln!r}", bits=64)
        return out
