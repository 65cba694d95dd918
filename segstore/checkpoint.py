"""Kafka's offset checkpoint files (REF §4.5), written atomically.

Format: a version line (0), a count line, then ``<topic> <partition> <offset>`` lines. Files
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and
``cleaner-offset-checkpoint`` share it.
"""

from __future__ import annotations

import os
from typing import Mapping

from .errors import SegstoreError
from .records import TopicPartition

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


class CheckpointError(SegstoreError):
    """A checkpoint file that does not follow Kafka's format."""


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
        """The entries; {} when the file is missing or empty. Malformed files raise."""
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return {}
        if not lines:
            return {}
        try:
            version = int(lines[0].strip())
        except ValueError:
            raise CheckpointError(f"{self.path}: malformed version line {lines[0]!r}") from None
        if version != 0:
            raise CheckpointError(f"{self.path}: unrecognized version {version}")
        try:
            count = int(lines[1].strip())
        except (IndexError, ValueError):
            raise CheckpointError(f"{self.path}: missing or malformed count line") from None
        entries = [ln for ln in lines[2:] if ln.strip()]
        if len(entries) != count:
            raise CheckpointError(f"{self.path}: expected {count} entries but found {len(entries)}")
        out = {}
        for ln in entries:
            fields = ln.split()
            if len(fields) != 3:
                raise CheckpointError(f"{self.path}: malformed line {ln!r}")
            try:
                out[TopicPartition(fields[0], int(fields[1]))] = int(fields[2])
            except ValueError:
                raise CheckpointError(f"{self.path}: malformed line {ln!r}") from None
        return out
