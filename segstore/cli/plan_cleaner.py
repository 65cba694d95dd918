"""``segstore plan-cleaner``: sizing the log cleaner's dedupe buffer (REF §6.12).

This is the napkin math operators do by hand: the offset map costs 24 bytes a key (a 16-byte
MurmurHash3 digest and an 8-byte offset), each cleaner thread gets
``log.cleaner.dedupe.buffer.size / threads`` bytes, so ``floor(buffer / threads / 24)`` slots, of
which ``floor(slots x load factor)`` may be filled in one round. Map building stops at the first
key past that fill limit, so a round finishes only with fewer dirty keys than the limit.
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
from ._common import (CommandError, UsageError, damage_status, iter_partitions, non_empty,
                      open_store, parse_key_values, print_json, progress)
from .clean_check import DAMAGE_ERRORS, Outcome, predict

BYTES_PER_KEY = 24  # 16-byte MurmurHash3 x64-128 digest + 8-byte offset (REF §6.12)
_READ_CHUNK = 65_536  # records per column read when counting keys


def register(subparsers) -> None:
    """Add the ``plan-cleaner`` subcommand."""
    p = subparsers.add_parser(
        "plan-cleaner", help="size the dedupe buffer (24 bytes a key) from key counts",
        description="Size log.cleaner.dedupe.buffer.size: from --unique-keys and --partitions, "
                    "or from the distinct keys really in a store (--store). Prints the napkin "
                    "math step by step. With --store, a partition a cleaning would fail on (a "
                    "corrupt batch, found as 'compact --dry-run' finds it) is named instead of "
                    "counted, the others are planned, and the exit status is 1.")
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
            "the next offset, and every round rewrites the whole log up to where it stopped. "
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
    """The plan from counted keys. A partition a cleaning would fail on (a corrupt batch: the
    same check as ``compact --dry-run``) is reported, not counted, and the others are still
    planned; the exit status is then 1."""
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
        damaged = damage_status(store, args.topic)
        now = store.clock()
        with progress(args, total, "counting keys", unit=" offsets") as bar:
            for t, p in parts:
                rows.append(_count_partition(store, t, p, now, bar))
    counted = [r for r in rows if r["would_fail"] is None]
    status = 0 if len(counted) == len(rows) and not damaged else 1
    if not counted:
        if args.json:
            print_json({"partitions": rows})
        else:
            print("\n".join(_table(rows)))
            print("No partition could be counted: no plan.")
        return status
    big = max(counted, key=lambda r: (r["keys"], r["dirty_keys"]))
    dirty_ratio = args.dirty_ratio if args.dirty_ratio is not None else ratios[big["topic"]]
    plan = plan_cleaner(big["keys"], threads=threads, buffer_size=buffer_size,
                        load_factor=load_factor, dirty_ratio=dirty_ratio,
                        dirty_keys=max(r["dirty_keys"] for r in counted))
    for r in counted:
        r["rounds"] = rounds_for(r["dirty_keys"], plan.keys_per_round)
    if args.json:
        print_json({"partitions": rows, **asdict(plan), "fits": plan.fits})
        return status
    print(plan_text(plan, header_lines=_table(rows) + [""], measured=True))
    return status


def _count_partition(store, topic: str, partition: int, now: int, bar) -> dict:
    """One row of the table: the partition's counts, or the damage that keeps it from being
    cleaned (or counted) in ``would_fail``."""
    lg = store.partition(topic, partition)
    row = {"topic": topic, "partition": partition, "records": None, "keys": None,
           "first_dirty_offset": None, "dirty_keys": None, "rounds": None, "would_fail": None}
    # force: what the next cleaning would meet, due or not.
    outcome = predict(store, topic, partition, now, force=True)
    if outcome.error is None:
        # Where the next cleaning starts (the log start offset before the first one).
        first_dirty = int(outcome.details["first_dirty_offset"])
        try:
            records, keys, dirty = count_keys(lg, first_dirty, bar)
        except DAMAGE_ERRORS as e:  # in the active segment, which no cleaning reads
            outcome = Outcome("fail", outcome.details, e)
        else:
            row.update(records=records, keys=keys, first_dirty_offset=first_dirty,
                       dirty_keys=dirty)
    row["would_fail"] = outcome.error_json()
    return row


def _table(rows: list) -> list:
    width = max([len("partition")] + [len(f"{r['topic']}-{r['partition']}") for r in rows])
    lines = [f"  {'partition':<{width}}  {'records':>12}  {'keys':>12}  {'dirty keys':>12}  "
             f"{'rounds now':>10}"]
    for r in rows:
        name = f"{r['topic']}-{r['partition']}"
        if r["would_fail"] is not None:
            lines.append(f"  {name:<{width}}  would fail: {r['would_fail']['message']}")
        else:
            lines.append(f"  {name:<{width}}  {_n(r['records']):>12}  {_n(r['keys']):>12}  "
                         f"{_n(r['dirty_keys']):>12}  {r['rounds']:>10}")
    return lines
