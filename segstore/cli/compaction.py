"""``segstore describe`` and ``compact``: inspecting and running the log cleaner (REF §6).
``plan-cleaner``, sizing its dedupe buffer, is in ``plan_cleaner``."""

from __future__ import annotations

from .. import _core
from ._common import (CommandError, UsageError, add_store_options, iter_partitions, open_store,
                      print_json, progress, time_ms)


def register(subparsers) -> None:
    """Add the ``describe`` and ``compact`` subcommands."""
    p = subparsers.add_parser(
        "describe", help="per partition: the numbers compaction is tuned by",
        description="Per partition: segments, bytes, log start and end, clean and dirty bytes, "
                    "the dirty ratio against min.cleanable.dirty.ratio, the first dirty offset, "
                    "the compaction delay against max.compaction.lag.ms, tombstones awaiting "
                    "their delete horizon, and why a partition is not (yet) cleaned.")
    add_store_options(p)
    p.add_argument("--topic", action="append", default=None, help="only this topic; repeatable")
    p.add_argument("--partition", type=int, default=None, help="only this partition")
    p.add_argument("--now-ms", type=time_ms, default=None, metavar="MS",
                   help="the time compaction delay and horizons are measured at (default: now)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=run_describe)

    p = subparsers.add_parser(
        "compact", help="clean compacted partitions now; prints Kafka's cleaner summary",
        description="Run the log cleaner now over eligible compacted partitions (or, with "
                    "--force, over every compacted partition with something to clean) and "
                    "print Kafka's per-round summary. --dry-run only says what would be cleaned.")
    add_store_options(p)
    p.add_argument("--topic", default=None, help="only this topic")
    p.add_argument("--partition", type=int, default=None, help="only this partition (needs "
                   "--topic)")
    p.add_argument("--force", action="store_true",
                   help="clean even when the dirty ratio and compaction lag do not call for it")
    p.add_argument("--dry-run", action="store_true", help="change nothing; print the plan")
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


def describe_partition(store, topic: str, partition: int, now_ms: int) -> dict:
    """Everything ``segstore describe`` prints about one partition, as plain JSON types."""
    lg = store.partition(topic, partition)
    cfg = store.topic_config(topic)
    out = {"topic": topic, "partition": partition, "cleanup_policy": list(cfg.cleanup_policy),
           "segments": len(lg.segments), "size_bytes": lg.size_bytes,
           "log_start_offset": lg.log_start_offset, "log_end_offset": lg.log_end_offset}
    if not cfg.compact:
        out["cleaner"] = None
        return out
    d = store.cleaner_manager.describe(topic, partition, now_ms=now_ms)
    out["cleaner"] = {k: _plain(d.get(k)) for k in _DESCRIBE_KEYS}
    out["tombstones"] = tombstones_awaiting(lg, now_ms)
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
    line = f"  tombstones awaiting their horizon {t['awaiting']}"
    if t["earliest_horizon_ms"] is not None:
        line += (f" (the first at {t['earliest_horizon_ms']}, in "
                 f"{_n(t['earliest_horizon_ms'] - now_ms)} ms)")
    line += f", past it (removed by the next cleaning) {t['removable']}"
    lines.append(line)
    if c["uncleanable"]:
        lines.append(f"  UNCLEANABLE: {c['reason']}")
    elif c["eligible"]:
        lines.append(f"  eligible: {c['reason']}")
    else:
        lines.append(f"  not eligible: {c['reason']}")
    return lines


def _fmt_ratio(r) -> str:
    return "n/a" if r is None else f"{r:.3f}"


def run_describe(args) -> int:
    """``segstore describe``."""
    if args.partition is not None and not args.topic:
        raise UsageError("--partition needs --topic")
    with open_store(args) as store:
        now = store.clock() if args.now_ms is None else args.now_ms
        infos = [describe_partition(store, t, p, now)
                 for t, p in iter_partitions(store, args.topic, args.partition)]
    if args.json:
        print_json({"now_ms": now, "partitions": infos})
    else:
        for info in infos:
            print("\n".join(describe_text(info, now)))
    return 0


# -- compact ----------------------------------------------------------------------------------

def run_compact(args) -> int:
    """``segstore compact``: clean now (per partition, so a terminal shows progress)."""
    if args.partition is not None and args.topic is None:
        raise UsageError("--partition needs --topic")
    if args.dry_run:
        return _compact_dry_run(args)
    results = []
    with open_store(args, writable=True) as store:
        parts = _compacted_partitions(store, args)
        with progress(args, len(parts), "compact", unit=" partitions") as bar:
            for t, p in parts:
                for stats in store.compact(topic=t, partition=p, force=args.force,
                                           now_ms=args.now_ms):
                    results.append((t, p, stats))
                bar.advance(1, f"{t}-{p}")
    if args.json:
        print_json({"cleaned": [{"topic": t, "partition": p, "summary": s.summary(),
                                 "stats": s.as_dict()} for t, p, s in results]})
        return 0
    for _, _, s in results:
        print(s.summary().rstrip("\n"))
        if s.map_full and s.wanted_buffer_bytes:
            print(f"\tThe offset map filled up: {_n(s.wanted_buffer_bytes)} bytes of dedupe buffer "
                  "per thread would have cleaned the whole dirty section in one round "
                  "(see 'segstore plan-cleaner').")
    if not results:
        print("nothing was cleaned: no compacted partition is due (see 'segstore describe', "
              "or use --force)")
    return 0


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


def _compact_dry_run(args) -> int:
    plan = []
    with open_store(args) as store:
        now = store.clock() if args.now_ms is None else args.now_ms
        manager = store.cleaner_manager
        for t, p in _compacted_partitions(store, args):
            d = manager.describe(t, p, now_ms=now)
            would = not d["uncleanable"] and (
                d["eligible"] or (args.force and d["cleanable_bytes"] > 0))
            plan.append({"topic": t, "partition": p, "would_clean": bool(would),
                         **{k: _plain(d.get(k)) for k in _DESCRIBE_KEYS}})
    if args.json:
        print_json({"dry_run": True, "now_ms": now, "partitions": plan})
        return 0
    for e in plan:
        name = f"{e['topic']}-{e['partition']}"
        if e["would_clean"]:
            why = e["reason"] if e["eligible"] else "--force"
            print(f"would clean {name}: dirty section [{e['first_dirty_offset']}, "
                  f"{e['first_uncleanable_offset']}), {_n(e['cleanable_bytes'])} dirty bytes "
                  f"({why})")
        else:
            print(f"would skip {name}: {e['reason']}")
    cleaned = sum(e["would_clean"] for e in plan)
    print(f"dry run: would clean {cleaned} of {len(plan)} compacted partitions; nothing changed")
    return 0

