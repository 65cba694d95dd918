"""``segstore describe`` and ``compact``: inspecting and running the log cleaner (REF §6).
``plan-cleaner``, sizing its dedupe buffer, is in ``plan_cleaner``."""

from __future__ import annotations

import logging
import os
import sys

from .. import _core
from ..checkpoint import CLEAN_SHUTDOWN_FILE
from ..cleaner.map_preview import MapPreviewer
from ._common import (CommandError, UsageError, add_store_options, damage_status,
                      iter_partitions, open_store, print_json, progress, time_ms)
from .clean_check import DAMAGE_ERRORS, Outcome, predict


def register(subparsers) -> None:
    """Add the ``describe`` and ``compact`` subcommands."""
    p = subparsers.add_parser(
        "describe", help="per partition: the numbers compaction is tuned by",
        description="Per partition: segments, bytes, log start and end, clean and dirty bytes, "
                    "the dirty ratio against min.cleanable.dirty.ratio, the first dirty offset, "
                    "the compaction delay against max.compaction.lag.ms, tombstones awaiting "
                    "their delete horizon, and why a partition is not (yet) cleaned. Exit status 1 "
                    "when a cleaning of a described partition would fail on damage (found in "
                    "batch headers, or with --check-crc in any batch a cleaning reads).")
    add_store_options(p)
    p.add_argument("--topic", action="append", default=None, help="only this topic; repeatable")
    p.add_argument("--partition", type=int, default=None, help="only this partition")
    p.add_argument("--now-ms", type=time_ms, default=None, metavar="MS",
                   help="the time compaction delay and horizons are measured at (default: now)")
    p.add_argument("--check-crc", action="store_true",
                   help="also read every batch a cleaning would read and check its CRC (reads "
                        "each partition's clean and dirty sections; default: headers only)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=run_describe)

    p = subparsers.add_parser(
        "compact", help="clean compacted partitions now; prints Kafka's cleaner summary",
        description="Run the log cleaner now over eligible compacted partitions (or, with "
                    "--force, over every compacted partition with something to clean) and "
                    "print Kafka's per-round summary. A partition whose cleaning fails on a "
                    "corrupt batch is reported and the others are still cleaned; the exit "
                    "status is then 1. --dry-run changes nothing and says what the real run "
                    "would do: clean, skip or fail (it reads every batch a cleaning would read "
                    "and checks its CRC), and, when the offset map would fill up, where each "
                    "round would stop and the dedupe buffer that needs one round.")
    add_store_options(p)
    p.add_argument("--topic", default=None, help="only this topic")
    p.add_argument("--partition", type=int, default=None, help="only this partition (needs "
                   "--topic)")
    p.add_argument("--force", action="store_true",
                   help="clean even when the dirty ratio and compaction lag do not call for it")
    p.add_argument("--dry-run", action="store_true",
                   help="change nothing; say what would be cleaned, skipped or fail")
    p.add_argument("--now-ms", type=time_ms, default=None, metavar="MS",
                   help="the cleaning time: lags and tombstone horizons (default: now)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=run_compact)


def _n(x) -> str:
    return f"{x:,}"


# -- describe ---------------------------------------------------------------------------------

def tombstones_awaiting(log, now_ms: int) -> dict:
    """Tombstones in batches a cleaning has stamped with a delete horizon (KIP-534): how many
    wait for their horizon, how many may go at the next cleaning, and the earliest horizon
    still ahead. Only stamped batches are decoded, so this stays cheap."""
    waiting = expired = 0
    earliest = None
    for seg in log.segments:
        if not seg.size:
            continue
        b = seg.scan(0, seg.size, raise_on_corrupt=False).batches
        attrs = b["attributes"]
        # Data batches (not transaction markers) stamped with a horizon (attribute bit 6).
        stamped = b[(b["magic"] == 2) & ((attrs & 0x40) != 0) & ((attrs & 0x20) == 0)]
        if not len(stamped):
            continue
        buf = seg.buffer(seg.size)
        for row in stamped:
            pos, size, horizon = int(row["position"]), int(row["size"]), int(row["base_timestamp"])
            recs = _core.decode_records(buf, pos, pos + size, validate_crc=False)
            n = sum(1 for r in recs if r.key is not None and r.value is None)
            if not n:
                continue
            if now_ms < horizon:
                waiting += n
                earliest = horizon if earliest is None else min(earliest, horizon)
            else:
                expired += n
    return {"awaiting": waiting, "removable": expired, "earliest_horizon_ms": earliest}


_DESCRIBE_KEYS = ("first_dirty_offset", "clean_bytes", "cleanable_bytes", "dirty_ratio",
                  "min_cleanable_ratio", "compaction_delay_ms", "max_compaction_lag_ms",
                  "eligible", "reason", "uncleanable", "first_uncleanable_offset")


def describe_partition(store, topic: str, partition: int, now_ms: int,
                       check_crc: bool = False) -> dict:
    """Everything ``segstore describe`` prints about one partition, as plain JSON types.

    A compacted partition's ``cleaner["would_fail"]`` names the damage a cleaning would stop at
    (found in batch headers, or with ``check_crc`` in any batch a cleaning reads), else None."""
    lg = store.partition(topic, partition)
    cfg = store.topic_config(topic)
    out = {"topic": topic, "partition": partition, "cleanup_policy": list(cfg.cleanup_policy),
           "segments": len(lg.segments), "size_bytes": lg.size_bytes,
           "log_start_offset": lg.log_start_offset, "log_end_offset": lg.log_end_offset}
    if not cfg.compact:
        out["cleaner"] = None
        return out
    # force: a partition that is not due is still read, as its next cleaning would read it.
    outcome = predict(store, topic, partition, now_ms, force=True, read_batches=check_crc)
    d = outcome.details or {}
    out["cleaner"] = {**{k: _plain(d.get(k)) for k in _DESCRIBE_KEYS},
                      "would_fail": outcome.error_json()}
    try:
        out["tombstones"] = tombstones_awaiting(lg, now_ms)
    except DAMAGE_ERRORS as e:
        out["tombstones"] = None
        if outcome.error is None:  # a tombstone batch the cleaner would decode is damaged
            out["cleaner"]["would_fail"] = Outcome("fail", None, e).error_json()
    return out


def _plain(v):
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return v


def describe_text(info: dict, now_ms: int) -> list:
    """The text lines of one partition."""
    name = f"{info['topic']}-{info['partition']}"
    lines = [name,
             f"  segments {info['segments']}, {_n(info['size_bytes'])} bytes, offsets "
             f"[{info['log_start_offset']}, {info['log_end_offset']}), cleanup.policy "
             f"{','.join(info['cleanup_policy'])}"]
    c = info.get("cleaner")
    if c is None:
        lines.append("  not compacted: cleanup.policy has no 'compact'")
        return lines
    if c["clean_bytes"] is not None:  # None: damage kept the numbers from being computed
        ratio, min_ratio = c["dirty_ratio"], c["min_cleanable_ratio"]
        cmp = ">" if ratio is not None and min_ratio is not None and ratio > min_ratio else "<="
        lines += [
            f"  clean bytes {_n(c['clean_bytes'])}, dirty (cleanable) bytes "
            f"{_n(c['cleanable_bytes'])}, "
            f"dirty ratio {_fmt_ratio(ratio)} {cmp} min.cleanable.dirty.ratio {min_ratio}",
            f"  first dirty offset {c['first_dirty_offset']}, first uncleanable offset "
            f"{c['first_uncleanable_offset']}",
            f"  compaction delay {_n(c['compaction_delay_ms'])} ms (max.compaction.lag.ms "
            f"{c['max_compaction_lag_ms']})"]
    t = info["tombstones"]
    if t is not None:
        line = f"  tombstones awaiting their horizon {t['awaiting']}"
        if t["earliest_horizon_ms"] is not None:
            line += (f" (the first at {t['earliest_horizon_ms']}, in "
                     f"{_n(t['earliest_horizon_ms'] - now_ms)} ms)")
        line += f", past it (removed by the next cleaning) {t['removable']}"
        lines.append(line)
    if c["would_fail"] is not None:
        lines.append(f"  UNCLEANABLE: a cleaning would fail: {c['would_fail']['message']}")
    elif c["uncleanable"]:
        lines.append(f"  UNCLEANABLE: {c['reason']}")
    elif c["eligible"]:
        lines.append(f"  eligible: {c['reason']}")
    else:
        lines.append(f"  not eligible: {c['reason']}")
    return lines


def _fmt_ratio(r) -> str:
    return "n/a" if r is None else f"{r:.3f}"


def run_describe(args) -> int:
    """``segstore describe``: exit 1 when a cleaning of a described partition would fail."""
    if args.partition is not None and not args.topic:
        raise UsageError("--partition needs --topic")
    with open_store(args) as store:
        now = store.clock() if args.now_ms is None else args.now_ms
        infos = [describe_partition(store, t, p, now, args.check_crc)
                 for t, p in iter_partitions(store, args.topic, args.partition)]
        damaged = damage_status(store, args.topic)
    if args.json:
        print_json({"now_ms": now, "partitions": infos})
    else:
        for info in infos:
            print("\n".join(describe_text(info, now)))
    return 1 if damaged or any(i["cleaner"] and i["cleaner"]["would_fail"] for i in infos) else 0


# -- compact ----------------------------------------------------------------------------------

class _CleanerFailures(logging.Filter):
    """Drops the cleaner's own report of a failed cleaning (a traceback, and "uncleanable
    until restart", which means the cleaner thread): ``compact`` reports it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "segstore.cleaner" and record.exc_info)


def run_compact(args) -> int:
    """``segstore compact``: clean now, partition by partition (so a terminal shows progress
    and a damaged partition does not stop the others); exit 1 when a cleaning failed."""
    from . import LOG_HANDLER
    if args.partition is not None and args.topic is None:
        raise UsageError("--partition needs --topic")
    if args.dry_run:
        return _compact_dry_run(args)
    results, failed = [], []
    quiet = _CleanerFailures()
    LOG_HANDLER.addFilter(quiet)
    try:
        with open_store(args, writable=True) as store:
            parts = _compacted_partitions(store, args)
            with progress(args, len(parts), "compact", unit=" partitions") as bar:
                for t, p in parts:
                    try:
                        for stats in store.compact(topic=t, partition=p, force=args.force,
                                                   now_ms=args.now_ms):
                            results.append((t, p, stats))
                    except DAMAGE_ERRORS as e:
                        # Kafka's cleaner marks such a partition uncleanable and goes on.
                        failed.append({"topic": t, "partition": p,
                                       **Outcome("fail", None, e).error_json()})
                    bar.advance(1, f"{t}-{p}")
    finally:
        LOG_HANDLER.removeFilter(quiet)
    status = 1 if failed else 0
    if args.json:
        print_json({"cleaned": [{"topic": t, "partition": p, "summary": s.summary(),
                                 "stats": s.as_dict()} for t, p, s in results],
                    "failed": failed})
        return status
    for _, _, s in results:
        print(s.summary().rstrip("\n"))
        if s.map_full and s.wanted_buffer_bytes:
            print(f"\tThe offset map filled up: {_n(s.wanted_buffer_bytes)} bytes of dedupe buffer "
                  "per thread would have cleaned the whole dirty section in one round "
                  "(see 'segstore plan-cleaner').")
    if not results and not failed:
        print("nothing was cleaned: no compacted partition is due (see 'segstore describe', "
              "or use --force)")
    sys.stdout.flush()  # the summaries first, then the failures (stderr is unbuffered)
    for f in failed:
        print(f"segstore compact: error: cleaning {f['topic']}-{f['partition']} failed: "
              f"{f['message']}", file=sys.stderr)
    return status


def _compacted_partitions(store, args) -> list:
    """The compacted partitions ``compact`` works on; CommandError for a named topic that is
    not compacted."""
    topics = [args.topic] if args.topic else None
    parts = [(t, p) for t, p in iter_partitions(store, topics, args.partition)
             if store.topic_config(t).compact]
    if args.topic and not parts:
        raise CommandError(f"topic {args.topic!r} is not compacted (cleanup.policy "
                           f"{','.join(store.topic_config(args.topic).cleanup_policy)})")
    return parts


_MAP_KEYS = ("map_full", "clean_end_offset", "round_ends", "later_rounds_if_still_due",
             "dirty_keys", "map_capacity", "dedupe_buffer_size", "wanted_dedupe_buffer_size")


def _map_fields(preview, force: bool) -> dict:
    """A dry-run entry's offset-map fields (all None for a partition that would not be
    cleaned): where each round's map stops, and the buffer that would need one round."""
    if preview is None:
        return dict.fromkeys(_MAP_KEYS)
    ends = [end for _, end in preview.rounds]
    return {"map_full": preview.map_full, "clean_end_offset": preview.clean_end_offset,
            "round_ends": ends,
            # Without --force, clean_now asks again after each round whether the partition
            # is due, on sizes only the filter's output decides.
            "later_rounds_if_still_due": not force and len(ends) > 1,
            "dirty_keys": preview.dirty_keys, "map_capacity": preview.capacity,
            "dedupe_buffer_size": preview.buffer_size,
            "wanted_dedupe_buffer_size": preview.wanted_buffer_size}


def _map_full_text(e: dict) -> list:
    """The dry run's lines about a partition whose first offset map fills up."""
    lines = [f"  the offset map fills up: the dirty section holds {_n(e['dirty_keys'])} "
             f"distinct keys, one round's map holds {_n(e['map_capacity'])} "
             f"(log.cleaner.dedupe.buffer.size {_n(e['dedupe_buffer_size'])}); the first round "
             f"cleans [{e['first_dirty_offset']}, {e['clean_end_offset']})"]
    later = e["round_ends"][1:]
    if later:
        lines.append(f"  then rounds ending at {', '.join(map(str, later))}"
                     + (" while the partition is still due after each (its dirty ratio is "
                        "recomputed)" if e["later_rounds_if_still_due"] else "")
                     + "; every round rewrites the log up to its end")
    wanted = e["wanted_dedupe_buffer_size"]
    lines.append(f"  log.cleaner.dedupe.buffer.size={wanted} would clean it in one round"
                 if wanted is not None else
                 "  no dedupe buffer cleans it in one round (a thread's map is capped at 2 GiB): "
                 "use more partitions")
    return lines


def _compact_dry_run(args) -> int:
    """What ``compact`` would do, per partition, reading every batch a cleaning would read;
    exit 1 when a cleaning would fail, as the real run does."""
    plan = []
    with open_store(args) as store:
        now = store.clock() if args.now_ms is None else args.now_ms
        parts = _compacted_partitions(store, args)
        previewer = MapPreviewer(store.cleaner)
        try:
            with progress(args, len(parts), "compact --dry-run", unit=" partitions") as bar:
                for t, p in parts:
                    o = predict(store, t, p, now, force=args.force)
                    preview = None
                    if o.action == "clean":
                        try:
                            preview = previewer.preview(o.log_to_clean)
                        except DAMAGE_ERRORS as e:  # read before: only if the files changed
                            o = Outcome("fail", o.details, e)
                    d = o.details or {}
                    plan.append({"topic": t, "partition": p, "would_clean": o.action == "clean",
                                 "would_fail": o.error_json(),
                                 **{k: _plain(d.get(k)) for k in _DESCRIBE_KEYS},
                                 **_map_fields(preview, args.force)})
                    bar.advance(1, f"{t}-{p}")
        finally:
            previewer.close()
        damaged = damage_status(store, args.topic)
    failing = sum(e["would_fail"] is not None for e in plan)
    status = 1 if failing or damaged else 0
    # Without the marker the real run's writable open first runs crash recovery, which this
    # read-only look does not: it may truncate damage named here (above a recovery point).
    clean = os.path.exists(os.path.join(args.path, CLEAN_SHUTDOWN_FILE))
    if args.json:
        print_json({"dry_run": True, "now_ms": now, "clean_shutdown": clean, "partitions": plan})
        return status
    if not clean:
        print("note: the store was not shut down cleanly (or its writer is running): the real "
              "run first recovers each partition above its recovery point, as 'segstore "
              "recover' does, which this dry run does not foresee")
    for e in plan:
        name = f"{e['topic']}-{e['partition']}"
        if e["would_fail"] is not None:
            print(f"would fail {name}: {e['would_fail']['message']}")
        elif e["would_clean"]:
            why = (e["reason"] if e["eligible"] else "--force" if args.force
                   else "tombstones or markers past their delete horizon")
            print(f"would clean {name}: dirty section [{e['first_dirty_offset']}, "
                  f"{e['first_uncleanable_offset']}), {_n(e['cleanable_bytes'])} dirty bytes "
                  f"({why})")
            if e["map_full"]:
                print("\n".join(_map_full_text(e)))
        else:
            print(f"would skip {name}: {e['reason']}")
    cleaned = sum(e["would_clean"] for e in plan)
    print(f"dry run: would clean {cleaned} of {len(plan)} compacted partitions"
          + (f", would fail on {failing}" if failing else "") + "; nothing changed")
    return status
