"""What every ``segstore`` subcommand shares: errors, the argument parser, opening a store,
output helpers and the progress bar."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Optional, TextIO

import segstore
from ..checkpoint import (CLEANER_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT,
                          RECOVERY_POINT_CHECKPOINT)
from ..errors import StoreLockedError
from ..topic import META_DIR, PARTITION_DIR, damaged_topic_error

__all__ = ["UsageError", "CommandError", "ArgumentParser", "Progress", "add_store_options",
           "open_store", "parse_key_values", "print_json", "format_value", "topic_names",
           "check_damaged", "damage_status", "iter_partitions"]


class UsageError(Exception):
    """A mistake on the command line (unknown option, missing argument, bad value): exit 2.

    ``prog`` names the (sub)command when argparse found the mistake."""

    def __init__(self, message: str, prog: Optional[str] = None):
        super().__init__(message)
        self.prog = prog


class CommandError(Exception):
    """The command cannot do what was asked (no such store, topic, file...): exit 1."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing usage and exiting, so
    ``main`` reports a bad argument as one line (argparse's default prints the whole usage)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --files must never match --files-from etc.
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse's hook for every parsing error
        raise UsageError(message, prog=self.prog)


def add_store_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--path DIR`` (alias ``--store``) and repeatable ``--store-config KEY=VALUE``."""
    parser.add_argument("--path", "--store", dest="path", metavar="DIR", required=required,
                        type=non_empty,
                        help="the store's root directory (a segstore store or a Kafka log dir)")
    parser.add_argument("--store-config", dest="store_config", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="a store-wide setting under its Kafka broker name, as given to "
                             "segstore.open(config=...); repeatable")


def non_empty(text: str) -> str:
    """An argument that must not be empty (``--path "$UNSET"`` would mean the working
    directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


INT64_MAX = 2 ** 63 - 1


def time_ms(text: str) -> int:
    """``--now-ms``: milliseconds since the epoch, 0 to 2^63 - 1 (Kafka's timestamps are Java
    longs; a larger value overflowed in the cleaner)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    if value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT64_MAX}, got {text!r}")
    return value


def parse_key_values(items, what: str = "--config") -> dict:
    """``["k=v", "k2=[a,b]", "k3=v3,k4=v4"]`` into a dict. Kafka's tools separate pairs with
    commas and bracket a value that holds commas (``cleanup.policy=[compact,delete]``)."""
    out: dict = {}
    for item in items or ():
        for pair in _split_top_level(item):
            if not pair.strip():
                continue
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"{what} expects KEY=VALUE pairs, got {pair!r}")
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            out[key.strip()] = value
    return out


def _split_top_level(text: str) -> list:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def open_store(args, *, writable: bool = False, create: bool = False):
    """Open ``args.path``: read-only by default (safe beside a live writer, changes nothing),
    writable when the command changes the store. Only ``create`` may make a new directory or
    turn an existing one into a store, so a mistyped path is an error rather than a new store."""
    path = args.path
    if not create:
        check_store_dir(path)
    config = parse_key_values(getattr(args, "store_config", None), "--store-config")
    try:
        return segstore.open(path, config=config or None, readonly=not writable)
    except StoreLockedError:  # its message advises the API's readonly=True
        raise CommandError(f"{os.path.abspath(path)} is locked by another writer (pid "
                           f"{lock_holder(path)}); stop it first (commands that only read "
                           "work beside it)") from None


def lock_holder(path: str) -> str:
    """The pid the writer wrote into the store's ``.lock``, or "unknown"."""
    try:
        with open(os.path.join(path, ".lock"), "rb") as f:
            return f.read(64).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


# What only a store has: segstore's metadata, or the files a Kafka broker keeps in a log dir.
_STORE_FILES = (META_DIR, "meta.properties", RECOVERY_POINT_CHECKPOINT,
                LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT,
                "replication-offset-checkpoint")


def check_store_dir(path: str) -> None:
    """CommandError unless ``path`` is a segstore store or a Kafka log dir: a mistyped path
    must not become a store (a writable open creates the store's files there) nor have its
    ``<name>-<n>`` directories listed as partitions."""
    if not os.path.exists(path):
        raise CommandError(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise CommandError(f"{path}: not a directory")
    names = os.listdir(path)
    if any(n in names for n in _STORE_FILES):
        return
    for n in names:  # a broker's log dir without checkpoints yet: partitions with segments
        d = os.path.join(path, n)
        if PARTITION_DIR.fullmatch(n) and os.path.isdir(d) and \
                any(f.endswith(".log") for f in os.listdir(d)):
            return
    raise CommandError(f"{path} is not a segstore store or a Kafka log dir")


def print_json(obj, stream: Optional[TextIO] = None) -> None:
    """One JSON document on one line (tools read it line by line)."""
    print(json.dumps(obj, separators=(",", ":")), file=stream or sys.stdout)


def format_value(value) -> str:
    """A config value as Kafka's tools print it: lists comma-joined, booleans lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if value is None:
        return "null"
    return str(value)


def topic_names(store, topics=None) -> list:
    """The store's topic names, sorted, or those of ``topics``: CommandError for an unknown
    one, CorruptMetadataError (naming the file and the fix) for one whose metadata is
    damaged. Without ``topics`` damaged topics are left out: see :func:`damage_status`."""
    names = store.list_topics()
    if not topics:
        return names
    check_damaged(store, topics)
    for t in topics:
        if t not in names:
            raise CommandError(f"unknown topic {t!r} in {store.path}")
    return [t for t in names if t in topics]


def check_damaged(store, topics) -> None:
    """CorruptMetadataError, naming the file and the fix, when one of ``topics`` was set aside
    for damaged metadata (rather than calling it unknown)."""
    damaged = store.damaged_topics()
    for t in topics:
        if t in damaged:
            raise damaged_topic_error(damaged[t])


def damage_status(store, topics=None) -> int:
    """1 when a command over every topic (no ``topics``) had to leave out topics whose
    metadata is damaged, else 0. The store warned on stderr, naming each file, when it
    opened; the exit status keeps a script from taking the partial output for the whole."""
    return 1 if not topics and store.damaged_topics() else 0


def iter_partitions(store, topics=None, partition: Optional[int] = None):
    """(topic, partition) pairs of ``topics`` (default: all), sorted; errors name what is
    missing (see :func:`topic_names`)."""
    names = topic_names(store, topics)
    out = []
    for t in names:
        parts = store.partitions_for(t)
        if partition is not None:
            if partition not in parts:
                raise CommandError(f"topic {t!r} has no partition {partition} "
                                   f"(it has {len(parts)})")
            parts = [partition]
        out.extend((t, p) for p in parts)
    return out


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal.

    Piped or redirected stderr gets nothing, so logs and scripts stay clean. Redraws are
    limited to ten a second, so calling :meth:`advance` per batch costs little.
    """

    def __init__(self, total: int, label: str, *, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, unit: str = ""):
        self.stream = stream or sys.stderr
        self.total = max(int(total), 0)
        self.label = label
        self.unit = unit
        self.done = 0
        self.detail = ""
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._last_draw = 0.0
        self._drawn = False

    def advance(self, n: int = 1, detail: Optional[str] = None) -> None:
        """Count ``n`` more units done (``detail``: what is being worked on)."""
        self.done += n
        if detail is not None:
            self.detail = detail
        if self.enabled:
            now = time.monotonic()
            if now - self._last_draw >= 0.1 or self.done >= self.total:
                self._last_draw = now
                self._draw()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((80, 20)).columns
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        bar_width = 24
        filled = int(frac * bar_width)
        bar = "#" * filled + "." * (bar_width - filled)
        text = (f"{self.label} [{bar}] {int(frac * 100):3d}% "
                f"{_human(self.done, self.unit)}/{_human(self.total, self.unit)}")
        if self.detail:
            text += f" {self.detail}"
        self.stream.write("\r" + text[:max(width - 1, 10)] + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar, so the next output starts on a clean line."""
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _human(n: int, unit: str) -> str:
    if unit != "B":
        return f"{n}{unit}"
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or suffix == "GiB":
            return f"{n:.0f}{suffix}" if suffix == "B" else f"{n:.1f}{suffix}"
        n /= 1024
    return str(n)


def progress(args, total: int, label: str, *, unit: str = "",
             quiet_if_stdout_tty: bool = False) -> Progress:
    """A Progress for a command: off with ``--no-progress``; with ``quiet_if_stdout_tty`` also
    off when stdout is the same terminal (a dump's own lines would tear the bar apart)."""
    enabled = None
    if getattr(args, "no_progress", False):
        enabled = False
    elif quiet_if_stdout_tty and sys.stdout.isatty():
        enabled = False
    return Progress(total, label, enabled=enabled, unit=unit)
