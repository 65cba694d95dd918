"""``segstore verify``, ``recover`` and ``retention``: checking, repairing and expiring a store."""

from __future__ import annotations

import fcntl
import logging
import os

from ..checkpoint import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT
from ..topic import PARTITION_DIR, fix_hint, is_legal_topic_name
from ._common import (CommandError, add_store_options, check_store_dir, damage_status,
                      iter_partitions, open_store, print_json, progress, time_ms)


def register(subparsers) -> None:
    """Add the ``verify``, ``recover`` and ``retention`` subcommands."""
    p = subparsers.add_parser(
        "verify", help="check every batch CRC, index entry and producer snapshot; exit 1 on "
                        "problems",
        description="Check every batch's CRC and layout, every index entry against its log "
                    "(and what follows a sealed segment's last index entry) and every producer "
                    "snapshot, and name directories that look like partitions but are none of "
                    "the store's and topic metadata files that cannot be read (their topics' "
                    "partitions are not checked, the others' are), without changing anything "
                    "(the store is opened read-only, so a live writer may keep running). Exit "
                    "status 1 when a problem is found.")
    add_store_options(p)
    p.add_argument("--topic", action="append", default=None,
                   help="only this topic; repeatable")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=run_verify)

    p = subparsers.add_parser(
        "recover", help="run crash recovery now and report what it repaired",
        description="Open the store for writing as after a crash: every segment above each "
                    "partition's recovery point is re-read, CRCs checked, indexes rebuilt and a "
                    "torn or corrupt tail truncated (with the segments after it, as Kafka does); "
                    "every index of every segment is then loaded and checked. Prints what was "
                    "repaired. Needs the writer lock: stop the writer first.")
    add_store_options(p)
    p.add_argument("--full", action="store_true",
                   help="recover every segment from the start of each log, not only those "
                        "above the recovery point (reads the whole store)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=run_recover)

    p = subparsers.add_parser(
        "retention", help="delete segments past retention.ms / retention.bytes (or --dry-run)",
        description="Run one retention pass (retention.ms, retention.bytes, log start offset; "
                    "REF §5) over every partition and print what it deleted. --dry-run prints "
                    "what a pass would delete and changes nothing.")
    add_store_options(p)
    p.add_argument("--dry-run", action="store_true", help="change nothing; print what would go")
    p.add_argument("--now-ms", type=time_ms, default=None, metavar="MS",
                   help="the time the rules compare with (default: now)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=run_retention)


# -- verify -----------------------------------------------------------------------------------

def run_verify(args) -> int:
    """``segstore verify``: every partition's ``verify()``; exit 1 on any problem."""
    results = []
    with open_store(args) as store:
        damaged = damaged_findings(store, args.topic)
        if args.topic is None:
            parts = iter_partitions(store)
        else:  # a named topic with damaged metadata is a finding, not an error
            named = [t for t in args.topic if t not in damaged]
            parts = iter_partitions(store, named) if named else []
        logs = [(t, p, store.partition(t, p)) for t, p in parts]
        total = sum(lg.size_bytes for _, _, lg in logs)
        with progress(args, total, "verify", unit="B") as bar:
            for t, p, lg in logs:
                size, segments = lg.size_bytes, len(lg.segments)
                try:
                    problems = [{"file": pr.file, "position": pr.position,
                                 "message": pr.message} for pr in lg.verify()]
                except Exception as e:  # one unreadable partition must not hide the others
                    problems = [{"file": lg.directory, "position": -1,
                                 "message": f"verify failed: {type(e).__name__}: {e}"}]
                results.append({"topic": t, "partition": p, "segments": segments,
                                "bytes": size, "problems": problems})
                bar.advance(size, f"{t}-{p}")
        strays = stray_partition_dirs(store)
    count = sum(len(r["problems"]) for r in results) + len(strays) + len(damaged)
    if args.json:
        print_json({"partitions": results, "damaged_topics": list(damaged.values()),
                    "stray_directories": strays, "problems": count})
    else:
        for d in damaged.values():
            print(f"{d['topic']}: {d['file']}: {d['message']}")
        for r in results:
            for pr in r["problems"]:
                print(f"{r['topic']}-{r['partition']}: {pr['file']} at position "
                      f"{pr['position']}: {pr['message']}")
        for pr in strays:
            print(f"{pr['file']}: {pr['message']}")
        segs = sum(r["segments"] for r in results)
        size = sum(r["bytes"] for r in results)
        verdict = "no problems found" if not count else \
            f"{count} problem{'s' if count != 1 else ''} found"
        unread = (f" ({len(damaged)} topic{'s' if len(damaged) != 1 else ''} not read: "
                  "damaged metadata)" if damaged else "")
        print(f"verified {len(results)} partition{'s' if len(results) != 1 else ''} "
              f"({segs} segments, {size} bytes){unread}: {verdict}")
    return 1 if count else 0


def damaged_findings(store, topics=None) -> dict:
    """``{topic: finding}`` for the topics (default: all) whose metadata file is damaged:
    the file, the reason and the fix. Their partitions are not read: without the topic's
    config nothing says which of them are the topic's."""
    return {t: {"topic": t, "file": e.file, "reason": e.reason,
                "message": f"damaged topic metadata ({e.reason}): the topic's partitions are "
                           f"not read; {fix_hint(e.file)}"}
            for t, e in sorted(store.damaged_topics().items()) if not topics or t in topics}


def stray_partition_dirs(store) -> list:
    """Directories of the store's root named like a partition (``<topic>-<n>``) that are no
    partition of the store (a partition past the topic's count, ``t-01``...): segstore reads
    none of their files, so their data is invisible to every command."""
    out = []
    damaged = store.damaged_topics()
    for name in sorted(os.listdir(store.path)):
        m = PARTITION_DIR.fullmatch(name)
        path = os.path.join(store.path, name)
        if not m or not os.path.isdir(path):
            continue
        topic, number = m.group(1), m.group(2)
        if topic in damaged:
            continue  # reported with its damaged metadata file
        if topic in store.list_topics() and number == str(int(number)) and \
                int(number) in store.partitions_for(topic):
            continue
        if not is_legal_topic_name(topic):
            why = f"{topic!r} is not a legal topic name"
        elif topic not in store.list_topics():
            why = f"no topic {topic!r} in this store"
        elif number != str(int(number)):
            why = f"{number!r} is not how a partition number is written"
        else:
            have = store.partitions_for(topic)
            why = (f"topic {topic!r} has {len(have)} partitions, numbered from 0"
                   if have == list(range(len(have))) else
                   f"topic {topic!r} has only partitions {have} here")
        out.append({"file": path, "position": -1,
                    "message": f"named like a partition directory, but {why}: its files are "
                               "not read"})
    return out


# -- recover ----------------------------------------------------------------------------------

class _Collect(logging.Handler):
    """Keeps segstore's warnings (what recovery repaired) for the report."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _check_unlocked(path: str) -> None:
    lock = os.path.join(path, ".lock")
    if not os.path.exists(lock):
        return
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        raise CommandError(f"{path} is locked by a running writer (pid {holder}); stop it "
                           "before recovering") from None
    finally:
        os.close(fd)


def run_recover(args) -> int:
    """``segstore recover``: the loader's crash recovery, forced, then every index checked."""
    from . import LOG_HANDLER
    path = args.path
    check_store_dir(path)  # before anything is unlinked below
    _check_unlocked(path)
    # Recovery runs when the last shutdown was not clean (Kafka's rule): removing the marker is
    # how Kafka operators force it too. Without the recovery-point checkpoint every segment is
    # recovered. A writer that takes the lock meanwhile has already removed the marker itself.
    for name in (CLEAN_SHUTDOWN_FILE,) + ((RECOVERY_POINT_CHECKPOINT,) if args.full else ()):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    collect = _Collect()
    logger = logging.getLogger("segstore")
    logger.addHandler(collect)
    LOG_HANDLER.muted = True
    try:
        report = []
        with open_store(args, writable=True) as store:
            parts = iter_partitions(store)
            total = sum(len(store.partition(t, p).segments) for t, p in parts)
            with progress(args, total, "recover", unit=" segments") as bar:
                for t, p in parts:
                    lg = store.partition(t, p)
                    loaded = lg.load_result  # what the loader did while the store opened
                    segs = lg.segments
                    for i, seg in enumerate(segs):
                        # Sealed segments check their indexes when first used: use them now,
                        # so a bad index is rebuilt (and reported) here, not on a later read.
                        seg.offset_index, seg.time_index
                        if i < len(segs) - 1:
                            seg.release_files()
                        bar.advance(1, f"{t}-{p}")
                    report.append({
                        "topic": t, "partition": p, "directory": lg.directory,
                        "recovered_segments": loaded.recovered_segments,
                        "truncated_bytes": loaded.truncated_bytes,
                        "deleted_segments": list(loaded.deleted_segments),
                        "log_start_offset": lg.log_start_offset,
                        "log_end_offset": lg.log_end_offset})
    finally:
        logger.removeHandler(collect)
        LOG_HANDLER.muted = False
    for r in report:
        prefix = r["directory"].rstrip(os.sep) + os.sep
        r["notes"] = [m for m in collect.messages if prefix in m]
    unattributed = [m for m in collect.messages
                    if not any(m in r["notes"] for r in report)]
    if args.json:
        print_json({"full": args.full, "partitions": report, "notes": unattributed})
        return 0
    repaired = 0
    for r in report:
        name = f"{r['topic']}-{r['partition']}"
        changed = r["truncated_bytes"] or r["deleted_segments"] or r["notes"]
        repaired += bool(changed)
        line = (f"{name}: recovered {r['recovered_segments']} segment"
                f"{'' if r['recovered_segments'] == 1 else 's'}, truncated "
                f"{r['truncated_bytes']} bytes")
        if r["deleted_segments"]:
            line += ", deleted segments " + ", ".join(f"{b:020d}" for b in r["deleted_segments"])
        line += f"; offsets [{r['log_start_offset']}, {r['log_end_offset']})"
        print(line)
        for m in r["notes"]:
            print(f"  {m}")
    for m in unattributed:
        print(f"note: {m}")
    scope = "every segment" if args.full else "segments above the recovery point"
    print(f"recovery of {len(report)} partition{'' if len(report) == 1 else 's'} ({scope}): "
          + (f"{repaired} repaired" if repaired else "nothing to repair"))
    return 0


# -- retention --------------------------------------------------------------------------------

def retention_json(report) -> dict:
    """A RetentionReport as plain JSON types."""
    parts = []
    for tp, pr in sorted(report.partitions.items()):
        parts.append({
            "topic": tp.topic, "partition": tp.partition,
            "cleanup_policy": list(pr.cleanup_policy),
            "old_log_start_offset": pr.old_log_start_offset,
            "log_start_offset": pr.log_start_offset, "log_end_offset": pr.log_end_offset,
            "rolled": pr.rolled,
            "deleted": [{"base_offset": d.base_offset, "end_offset": d.end_offset,
                         "size_bytes": d.size_bytes, "largest_timestamp": d.largest_timestamp,
                         "reason": d.reason} for d in pr.deleted]})
    return {"now_ms": report.now_ms, "dry_run": report.dry_run,
            "segments_deleted": report.segments_deleted, "bytes_deleted": report.bytes_deleted,
            "partitions": parts,
            "errors": {f"{tp.topic}-{tp.partition}": e for tp, e in sorted(report.errors.items())}}


def run_retention(args) -> int:
    """``segstore retention [--dry-run]``: one pass; exit 1 if a partition failed."""
    # A dry run opens read-only: it cannot change anything, and a live writer may keep going.
    with open_store(args, writable=not args.dry_run) as store:
        report = store.enforce_retention(now_ms=args.now_ms, dry_run=args.dry_run)
        damaged = damage_status(store)  # a dry run's partitions leave the damaged topics out
    if args.json:
        print_json(retention_json(report))
    else:
        print(report)
    return 1 if report.errors or damaged else 0

