"""The ``segstore`` command: Kafka's storage tools for segstore stores and Kafka log dirs.

``main(argv) -> int`` runs one subcommand and returns its exit status (0 success, 1 a problem or
failure, 2 a command-line mistake). Every subcommand speaks Kafka's tools' language where Kafka
has a tool (``dump-log``, ``log-dirs``, ``configs``, ``topics``); the rest wrap the store's own
operations (``verify``, ``recover``, ``retention``, ``describe``, ``compact``, ``plan-cleaner``).

Errors are one line on stderr, never a traceback: a mistake on the command line exits 2, a
segstore error (unknown topic, locked store, bad config...), an OS error or anything unexpected
exits 1 (``SEGSTORE_DEBUG=1`` shows the traceback of an unexpected error).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

from ..errors import SegstoreError
from ._common import ArgumentParser, CommandError, UsageError
from . import admin, compaction, dump, maintenance, plan_cleaner

__all__ = ["main", "build_parser"]


def build_parser() -> ArgumentParser:
    """The argument parser with every subcommand."""
    parser = ArgumentParser(
        prog="segstore",
        description="Kafka's partition-log storage tools over a segstore store or a Kafka log "
                    "dir. Commands that change nothing open the store read-only, so they are "
                    "safe beside a running writer.")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"segstore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    sub.required = True
    dump.register(sub)
    admin.register(sub)
    maintenance.register(sub)
    plan_cleaner.register(sub)
    compaction.register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``segstore`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    status instead of exiting, so tests and other programs can call it."""
    parser = build_parser()
    _install_log_handler()
    name = "segstore"
    try:
        try:
            args, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
            if extra:  # argparse would blame the top-level parser, whose help lacks the options
                raise UsageError(f"unrecognized arguments: {' '.join(extra)}",
                                 prog=f"segstore {args.command}")
        except SystemExit as e:  # --help and --version exit through argparse
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        else:
            name = f"segstore {args.command}"
            status = int(args.func(args) or 0)
        # Output still buffered must meet a closed pipe here, not in Python's exit-time flush
        # (which prints "Exception ignored ... BrokenPipeError" and exits 120).
        sys.stdout.flush()
        return status
    except UsageError as e:
        prog = e.prog or name
        print(f"{prog}: error: {e} (see '{prog} --help')", file=sys.stderr)
        return 2
    except CommandError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1
    except SegstoreError as e:
        print(f"{name}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit-time flush of
        # stdout from failing again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except OSError as e:
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"{name}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("segstore: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, or bad input that no typed error covers yet: still one line
        if os.environ.get("SEGSTORE_DEBUG"):
            raise
        print(f"{name}: error: unexpected {type(e).__name__}: {_one_line(e)} "
              "(set SEGSTORE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


class _StderrLogHandler(logging.Handler):
    """segstore's warnings (an index rebuilt, a tail recovered) as one line each on stderr,
    each distinct line once per command (a read-only store re-reads a damaged checkpoint, and
    warns, at every reload); ``muted`` while a command collects them itself (``recover``
    reports them)."""

    muted = False

    def __init__(self, level):
        super().__init__(level)
        self.printed: set = set()

    def emit(self, record: logging.LogRecord) -> None:
        if self.muted:
            return
        try:
            line = f"segstore: {record.levelname.lower()}: {record.getMessage().strip()}"
            if line not in self.printed:
                self.printed.add(line)
                print(line, file=sys.stderr)
        except Exception:  # logging must never break the command
            pass


LOG_HANDLER = _StderrLogHandler(logging.WARNING)


def _install_log_handler() -> None:
    # Without a handler Python's last-resort handler prints bare messages; with the root logger
    # configured (an embedding program), leave logging to it.
    logger = logging.getLogger("segstore")
    LOG_HANDLER.printed.clear()  # once per command, not per process (tests call main often)
    if LOG_HANDLER not in logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(LOG_HANDLER)


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, KeyError) and text.startswith(("'", '"')) and text.endswith(("'", '"')):
        text = text[1:-1]  # KeyError's str() quotes its message
    return " ".join(text.split())
