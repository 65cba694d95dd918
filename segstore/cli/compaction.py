"""``segstore plan-cleaner``, ``describe`` and ``compact``: sizing, inspecting and running the
log cleaner (REF §6).

``plan-cleaner`` is the dedupe-buffer napkin math operators do by hand (REF §6.12): the offset
map costs 24 bytes a key (a 16-byte MurmurHash3 digest and an 8-byte offset), each cleaner thread
gets ``log.cleaner.dedupe.buffer.size / threads`` bytes, so ``floor(buffer / threads / 24)``
slots, of which ``floor(slots x load factor)`` may be filled in one round. Map building stops at
the first key past that fill limit, so a round finishes only with fewer dirty keys than the limit.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Optional

import numpy as np

from .. import _core
from ..cleaner.map_build import dedupe_buffer_for
from ..cleaner.service import MAX_MAP_BYTES  # one thread's map is a Java array in Kafka
from ..columns import BinaryColumn
from ..config import StoreConfig
from ._common import (CommandError, UsageError, add_store_options, iter_partitions, non_empty,
                      open_store, parse_key_values, print_json, progress, time_ms)

BYTES_PER_KEY = 24  # 16-byte MurmurHash3 x64-128 digest + 8-byte offset (REF §6.12)
_READ_CHUNK = 65_536  # records per column read when counting keys


def register(subparsers) -> None:
    """Add the ``plan-cleaner``, ``describe`` and ``compact`` subcommands."""
    p = subparsers.add_parser(
        "plan-cleaner", help="size the dedupe buffer (24 bytes a key) from key counts",
        description="Size log.cleaner.dedupe.buffer.size: from --unique-keys and --partitions, "
                    "or from the distinct keys really in a store (--store). Prints the napkin "
                    "math step by step.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--unique-keys", type=_count, metavar="N",
                     help="distinct keys of the topic (spread evenly over its partitions)")
    src.add_argument("--store", "--path", dest="path", metavar="DIR", type=non_empty,
                     help="count the distinct keys of each partition of this store")
    p.add_argument("--store-config", dest="store_config", action="append", default=[],
                   metavar="KEY=VALUE", help="store-wide settings (defaults for the options "
                   "below); repeatable")
    p.add_argument("--topic", action="append", default=None,
                   help="with --store: only this topic (default: every compacted topic); "
                        "repeatable")
    p.add_argument("--partitions", type=_count, default=None, metavar="P",
                   help="with --unique-keys: partitions of the topic (default 1)")
    p.add_argument("--threads", type=_count, default=None, metavar="T",
                   help="log.cleaner.threads (default 1, or the store's)")
    p.add_argument("--buffer-size", type=_size, default=None, metavar="BYTES",
                   help="log.cleaner.dedupe.buffer.size, e.g. 134217728 or 128m "
                        "(default 128 MiB, or the store's)")
    p.add_argument("--dirty-ratio", type=_ratio, default=None, metavar="R",
                   help="min.cleanable.dirty.ratio (default 0.5, or the topic's)")
    p.add_argument("--load-factor", type=_load_factor, default=None, metavar="F",
                   help="log.cleaner.io.buffer.load.factor (default 0.9, or the store's)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=run_plan)

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


# -- argument types ---------------------------------------------------------------------------

def _count(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise _arg_error(f"must be at least 1, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise _arg_error(f"not a whole number: {text!r}") from None


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def _size(text: str) -> int:
    """Bytes, with an optional binary unit: 134217728, 128m, 128MiB, 2g."""
    m = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise _arg_error(f"not a size in bytes (like 134217728 or 128m): {text!r}")
    value = int(float(m.group(1).replace(",", "").replace("_", "")) * _UNITS[m.group(2).lower()])
    if value < BYTES_PER_KEY:
        raise _arg_error(f"must hold at least one {BYTES_PER_KEY}-byte slot, got {text!r}")
    return value


def _ratio(text: str) -> float:
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise _arg_error(f"must be between 0 and 1, got {text!r}")
    return value


def _load_factor(text: str) -> float:
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise _arg_error(f"must be greater than 0 and at most 1, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _arg_error(f"not a number: {text!r}") from None
    if math.isnan(value):
        raise _arg_error("not a number: 'nan'")
    return value


def _arg_error(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


# -- plan-cleaner: the arithmetic -------------------------------------------------------------

@dataclass(frozen=True)
class CleanerPlan:
    """The dedupe buffer arithmetic for one cleaner configuration and one partition size.

    ``keys_per_partition`` is the largest partition's distinct keys (every one of them may be
    dirty after a backlog: the worst case); ``dirty_keys`` the distinct keys one cleaning has to
    map in the usual case (estimated from the dirty ratio, or counted in a store).
    """

    keys_per_partition: int
    dirty_keys: int
    threads: int
    buffer_size: int
    load_factor: float
    dirty_ratio: float
    buffer_per_thread: int
    slots_per_thread: int
    keys_per_round: int
    rounds_usual: int
    rounds_worst: int
    slots_needed: int
    buffer_needed: int

    @property
    def fits(self) -> bool:
        """One round maps every key even in the worst case."""
        return self.rounds_worst <= 1


def trigger_dirty_records(keys: int, dirty_ratio: float) -> Optional[int]:
    """About how many records a freshly cleaned partition of ``keys`` keys (one record each)
    takes in before its dirty ratio passes ``dirty_ratio``: dirty / (clean + dirty) > R means
    dirty > R / (1 - R) x clean. None when the ratio can never pass (R = 1)."""
    if dirty_ratio >= 1.0:
        return None
    r = Fraction(str(dirty_ratio))
    return math.floor(keys * r / (1 - r)) + 1  # strictly greater (REF §6.3)


def slots_for(keys: int, load_factor: float) -> int:
    """Slots whose fill limit ``floor(slots x load factor)`` exceeds ``keys``: the cleaner's own
    rule for mapping ``keys`` distinct keys in one round (``dedupe_buffer_for``)."""
    return dedupe_buffer_for(keys, load_factor, BYTES_PER_KEY) // BYTES_PER_KEY


def rounds_for(keys: int, keys_per_round: int) -> int:
    """Rounds a cleaning of ``keys`` dirty keys takes: every round but the last stops on a full
    map after ``keys_per_round`` keys, and the last must hold fewer than that."""
    return keys // keys_per_round + 1 if keys else 0


def plan_cleaner(keys_per_partition: int, *, threads: int = 1, buffer_size: int = 134_217_728,
                 load_factor: float = 0.9, dirty_ratio: float = 0.5,
                 dirty_keys: Optional[int] = None) -> CleanerPlan:
    """The napkin math: buffer per thread, slots, keys per round, rounds per cleaning and the
    buffer that cleans a partition in one round. ``dirty_keys`` defaults to the estimate at the
    dirty-ratio trigger point."""
    per_thread = min(buffer_size // threads, MAX_MAP_BYTES)
    slots = per_thread // BYTES_PER_KEY
    per_round = int(slots * load_factor)
    if per_round < 1:
        raise CommandError(f"a buffer of {buffer_size} bytes over {threads} threads leaves "
                           f"{slots} slots per thread: not one key fits a round")
    if dirty_keys is None:
        at_trigger = trigger_dirty_records(keys_per_partition, dirty_ratio)
        dirty_keys = keys_per_partition if at_trigger is None else min(keys_per_partition,
                                                                       at_trigger)
    needed = slots_for(keys_per_partition, load_factor)
    return CleanerPlan(
        keys_per_partition=keys_per_partition, dirty_keys=dirty_keys, threads=threads,
        buffer_size=buffer_size, load_factor=load_factor, dirty_ratio=dirty_ratio,
        buffer_per_thread=per_thread, slots_per_thread=slots, keys_per_round=per_round,
        rounds_usual=rounds_for(dirty_keys, per_round),
        rounds_worst=rounds_for(keys_per_partition, per_round),
        slots_needed=needed, buffer_needed=needed * BYTES_PER_KEY * threads)


def _n(x) -> str:
    return f"{x:,}"


def _mib(x: int) -> str:
    return f"{x / (1 << 20):,.1f} MiB"


def plan_text(plan: CleanerPlan, *, header_lines: list, measured: bool) -> str:
    """The plan as the napkin math, one step a line."""
    p = plan
    lines = ["Dedupe buffer plan: the cleaner maps each dirty key to its latest offset, "
             f"{BYTES_PER_KEY} bytes a key",
             "(a 16-byte MurmurHash3 digest and an 8-byte offset).", ""]
    lines += header_lines
    capped = p.buffer_size // p.threads > MAX_MAP_BYTES
    lines += [
        f"  buffer per thread   {_n(p.buffer_size)} bytes / {p.threads} thread"
        f"{'s' if p.threads != 1 else ''} = {_n(p.buffer_per_thread)} bytes"
        + (f" (capped at {_n(MAX_MAP_BYTES)}, as Kafka does)" if capped else ""),
        f"  slots per thread    floor({_n(p.buffer_per_thread)} / {BYTES_PER_KEY}) = "
        f"{_n(p.slots_per_thread)}",
        f"  keys per round      floor({_n(p.slots_per_thread)} x {p.load_factor} load factor) = "
        f"{_n(p.keys_per_round)}", ""]
    k = p.keys_per_partition
    if measured:
        lines += [f"  The largest partition holds {_n(k)} distinct keys; its dirty section "
                  f"(first dirty offset to the log end) holds {_n(p.dirty_keys)}."]
    else:
        trig = trigger_dirty_records(k, p.dirty_ratio)
        if trig is None:
            lines += ["  With min.cleanable.dirty.ratio 1 the ratio never triggers a cleaning "
                      "(max.compaction.lag.ms does),",
                      f"  and by then every key may be dirty: {_n(p.dirty_keys)} keys."]
        else:
            factor = Fraction(str(p.dirty_ratio)) / (1 - Fraction(str(p.dirty_ratio)))
            lines += [
                f"  A cleaned partition holds about one record per key: {_n(k)} records. With "
                f"min.cleanable.dirty.ratio {p.dirty_ratio}",
                f"  it becomes cleanable once its dirty bytes pass {p.dirty_ratio}/(1 - "
                f"{p.dirty_ratio}) = {float(factor):g} x its clean bytes: about {_n(trig)} "
                f"new records,",
                f"  holding at most min({_n(k)}, {_n(trig)}) = {_n(p.dirty_keys)} distinct "
                f"keys. A backlog can hold every key: {_n(k)}."]
    lines += [
        "",
        f"  rounds per cleaning  usual: {p.rounds_usual}   worst case (every key dirty): "
        f"{p.rounds_worst}",
        f"  buffer for one round in the worst case  fewest slots with floor(slots x "
        f"{p.load_factor}) > {_n(k)} = {_n(p.slots_needed)} slots x {BYTES_PER_KEY} bytes x "
        f"{p.threads} thread"
        f"{'s' if p.threads != 1 else ''} = {_n(p.buffer_needed)} bytes ({_mib(p.buffer_needed)})",
        ""]
    if p.fits:
        lines.append(f"Fits: log.cleaner.dedupe.buffer.size={p.buffer_size} maps every dirty key "
                     "of a partition in one round.")
    else:
        over_cap = p.slots_needed * BYTES_PER_KEY > MAX_MAP_BYTES
        lines.append(
            "Too small for one round: a cleaning stops when the map is full and resumes at "
            f"the next offset, and every round rewrites the whole log up to where it stopped. "
            + (f"A thread's map cannot pass {_n(MAX_MAP_BYTES)} bytes, so one round cannot "
               "hold this many keys: use more partitions." if over_cap else
               f"Set log.cleaner.dedupe.buffer.size={p.buffer_needed} (or more partitions)."))
    return "\n".join(lines)


def run_plan(args) -> int:
    """``segstore plan-cleaner``."""
    store_cfg = StoreConfig(parse_key_values(args.store_config, "--store-config") or None)
    threads = args.threads or store_cfg.cleaner_threads or 1
    buffer_size = args.buffer_size or store_cfg.cleaner_dedupe_buffer_size
    load_factor = args.load_factor or store_cfg.cleaner_io_buffer_load_factor
    if args.path is None:
        if args.topic:
            raise UsageError("--topic goes with --store")
        partitions = args.partitions or 1
        dirty_ratio = 0.5 if args.dirty_ratio is None else args.dirty_ratio
        keys = -(-args.unique_keys // partitions)
        plan = plan_cleaner(keys, threads=threads, buffer_size=buffer_size,
                            load_factor=load_factor, dirty_ratio=dirty_ratio)
        if args.json:
            print_json({"unique_keys": args.unique_keys, "partitions": partitions,
                        **asdict(plan), "fits": plan.fits})
            return 0
        header = [f"  keys per partition  ceil({_n(args.unique_keys)} keys / {partitions} "
                  f"partition{'s' if partitions != 1 else ''}) = {_n(keys)} "
                  "(the partitioner spreads keys evenly)"]
        print(plan_text(plan, header_lines=header, measured=False))
        return 0
    if args.partitions is not None:
        raise UsageError("--partitions goes with --unique-keys (a store knows its partitions)")
    return _plan_from_store(args, threads, buffer_size, load_factor)


def count_keys(log, start: Optional[int] = None, bar=None) -> tuple:
    """(records, distinct keys, distinct keys at or after ``start``) of a partition, keys
    compared by their MurmurHash3 digest, as the offset map compares them."""
    empty = np.empty((0, 2), dtype=np.uint64)
    seen, dirty = empty, empty
    offset, end = log.log_start_offset, log.log_end_offset
    records = 0
    while offset < end:
        cols = log.read_columns(offset, end, max_records=_READ_CHUNK)
        n = len(cols)
        if n == 0:
            break
        # keyless records never enter the map
        seen = _core.distinct_digests(np.concatenate(
            [seen, _core.murmur3_128_digests(cols.keys)]))
        if start is not None:
            later = cols.offsets >= start
            keys = cols.keys
            valid = keys.valid & later
            dirty = _core.distinct_digests(np.concatenate([dirty, _core.murmur3_128_digests(
                BinaryColumn(keys.data, keys.offsets, valid))]))
        records += n
        nxt = int(cols.offsets[-1]) + 1
        if bar is not None:
            bar.advance(nxt - offset)
        offset = nxt
    return records, len(seen), (len(seen) if start is None else len(dirty))


def _plan_from_store(args, threads, buffer_size, load_factor) -> int:
    rows = []
    with open_store(args) as store:
        if args.topic:
            topics = args.topic
        else:
            topics = [t for t in store.list_topics() if store.topic_config(t).compact]
            if not topics:
                raise CommandError(f"{store.path} has no compacted topic; name one with --topic")
        parts = iter_partitions(store, topics)
        total = sum(store.partition(t, p).log_end_offset - store.partition(t, p).log_start_offset
                    for t, p in parts)
        ratios = {t: store.topic_config(t).min_cleanable_dirty_ratio for t in topics}
        with progress(args, total, "counting keys", unit=" offsets") as bar:
            for t, p in parts:
                lg = store.partition(t, p)
                # Where the next cleaning starts (the log start offset before the first one).
                first_dirty = int(store.cleaner_manager.describe(t, p)["first_dirty_offset"])
                records, keys, dirty = count_keys(lg, first_dirty, bar)
                rows.append({"topic": t, "partition": p, "records": records, "keys": keys,
                             "first_dirty_offset": first_dirty, "dirty_keys": dirty})
    big = max(rows, key=lambda r: (r["keys"], r["dirty_keys"]))
    dirty_ratio = args.dirty_ratio if args.dirty_ratio is not None else ratios[big["topic"]]
    plan = plan_cleaner(big["keys"], threads=threads, buffer_size=buffer_size,
                        load_factor=load_factor, dirty_ratio=dirty_ratio,
                        dirty_keys=max(r["dirty_keys"] for r in rows))
    for r in rows:
        r["rounds"] = rounds_for(r["dirty_keys"], plan.keys_per_round)
    if args.json:
        print_json({"partitions": rows, **asdict(plan), "fits": plan.fits})
        return 0
    width = max(len(f"{r['topic']}-{r['partition']}") for r in rows)
    header = [f"  {'partition':<{width}}  {'records':>12}  {'keys':>12}  {'dirty keys':>12}  "
              f"{'rounds now':>10}"]
    for r in rows:
        header.append(f"  {r['topic'] + '-' + str(r['partition']):<{width}}  "
                      f"{_n(r['records']):>12}  {_n(r['keys']):>12}  {_n(r['dirty_keys']):>12}  "
                      f"{r['rounds']:>10}")
    header.append("")
    print(plan_text(plan, header_lines=header, measured=True))
    return 0


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

