"""The segstore data source's options: Spark's Kafka source names and meanings (ECO §2.2, §2.3).

Spark hands a data source its options as strings under lower-cased keys; this module turns them
into plain, picklable dataclasses (:class:`ReadOptions`, :class:`WriteOptions`) and rejects
anything malformed with :class:`InvalidOptionError`, whose message names the option as users
spell it. ``kafka.bootstrap.servers`` becomes the store path (``load(path)`` or ``path``);
Kafka consumer plumbing (group ids, fetch retries, poll timeouts) has no meaning for files and is
ignored with a warning; every other ``kafka.*`` option and any unknown option is an error, so a
typo never silently changes what a query reads.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from ..errors import InvalidConfigError, InvalidTopicError

log = logging.getLogger("segstore.spark")


class InvalidOptionError(InvalidConfigError):
    """A data source option is missing, unknown, malformed or not allowed in this query."""


# Canonical spellings, keyed by the lower-cased form Spark delivers.
_READ = ["path", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
         "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
         "endingTimestamp", "endingOffsetsByTimestamp", "failOnDataLoss", "minPartitions",
         "maxRecordsPerPartition", "includeHeaders", "pushFilters", "maxOffsetsPerTrigger",
         "minOffsetsPerTrigger", "maxTriggerDelay", "kafka.isolation.level"]
_BATCH_ONLY = {"endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"}
_STREAM_ONLY = {"maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"}
_WRITE = ["path", "topic", "checkpointLocation", "lockTimeoutMs", "freezeWorkerHeap"]
# Kafka consumer plumbing that a file-based source has no use for: accepted, ignored, logged.
_IGNORED = ["groupIdPrefix", "kafka.group.id", "fetchOffset.numRetries",
            "fetchOffset.retryIntervalMs", "kafkaConsumer.pollTimeoutMs"]
_CANONICAL = {name.lower(): name for name in _READ + _WRITE + _IGNORED}

DEFAULT_LOCK_TIMEOUT_MS = 120_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka's "15m"

# Spark's JavaUtils.timeStringAsMs: a signed number, then at once an optional unit.
_DURATION = re.compile(r"(-?[0-9]+)([a-z]+)?")
_UNIT_US = {"us": 1, "ms": 1000, "s": 1_000_000, "m": 60_000_000, "min": 60_000_000,
            "h": 3_600_000_000, "d": 86_400_000_000}
# Java's Long.parseLong / Integer.parseInt: an optional sign and ASCII digits, nothing else.
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def canonical(key: str) -> str:
    """The documented spelling of an option key (Spark lower-cases them)."""
    return _CANONICAL.get(key.lower(), key)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends, as an option said it.

    ``kind`` is ``earliest``, ``latest``, ``offsets`` (``values``: offset per (topic, partition),
    -2 earliest, -1 latest), ``timestamp`` (one ms timestamp for every partition) or
    ``timestamps`` (``values``: ms timestamp per (topic, partition)). ``option`` names the option
    it came from, for error messages.
    """

    kind: str
    option: str
    values: Optional[dict] = None
    timestamp: Optional[int] = None


@dataclass(frozen=True)
class ReadOptions:
    """Validated options of a batch or streaming read (plain data: it travels to executors)."""

    path: str
    streaming: bool
    subscribe: Optional[tuple] = None
    subscribe_pattern: Optional[str] = None
    assign: Optional[dict] = None  # topic -> tuple of partitions
    starting: OffsetSpec = OffsetSpec("earliest", "startingOffsets")
    ending: OffsetSpec = OffsetSpec("latest", "endingOffsets")
    starting_strategy: str = "error"
    fail_on_data_loss: bool = True
    min_partitions: Optional[int] = None
    max_records_per_partition: Optional[int] = None
    include_headers: bool = False
    push_filters: bool = False
    max_offsets_per_trigger: Optional[int] = None
    min_offsets_per_trigger: Optional[int] = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    read_committed: bool = False  # kafka.isolation.level=read_committed

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> "ReadOptions":
        """Validate a read's options; ``streaming`` selects Kafka's streaming defaults/rules."""
        opts = _normalize(options, _READ, "source")
        if not streaming and "minOffsetsPerTrigger" in opts and "maxOffsetsPerTrigger" in opts:
            # Kafka compares them in validateGeneralOptions, which batch queries run too.
            _check_min_max(_int("minOffsetsPerTrigger", opts["minOffsetsPerTrigger"]),
                           _int("maxOffsetsPerTrigger", opts["maxOffsetsPerTrigger"]))
        for name in list(opts):
            if name in _BATCH_ONLY and streaming:
                raise InvalidOptionError(
                    f"option {name!r} is not valid in streaming queries (Kafka's source allows it "
                    "in batch queries only); a stream reads until it is stopped")
            if name in _STREAM_ONLY and not streaming:
                log.warning("option %r applies to streaming queries only; ignored by this batch "
                            "read", name)
                del opts[name]
        path = _path(opts)
        kw: dict = {"path": path, "streaming": streaming}
        chosen = [n for n in ("subscribe", "subscribePattern", "assign") if n in opts]
        if len(chosen) != 1:
            raise InvalidOptionError(
                "exactly one of the options 'subscribe', 'subscribePattern' and 'assign' must be "
                "set" + (f"; got {', '.join(repr(c) for c in chosen)}" if chosen else
                         " (e.g. .option('subscribe', 'topic1,topic2'))"))
        if "subscribe" in opts:
            topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
            if not topics:
                raise InvalidOptionError("option 'subscribe' names no topic")
            for t in topics:
                _topic_name("subscribe", t)
            kw["subscribe"] = topics
        elif "subscribePattern" in opts:
            pattern = opts["subscribePattern"].strip()  # Kafka's source trims it too
            if not pattern:
                raise InvalidOptionError("option 'subscribePattern' is empty: give a regular "
                                         "expression of topic names")
            try:
                re.compile(pattern)
            except re.error as e:
                raise InvalidOptionError(
                    f"option 'subscribePattern' is not a valid regular expression ({e}); note "
                    f"that segstore uses Python's re dialect (full match), not Java's: "
                    f"{pattern!r}") from None
            kw["subscribe_pattern"] = pattern
        else:
            kw["assign"] = _assign(opts["assign"])
        kw["starting"] = _starting(opts, streaming)
        if not streaming:
            kw["ending"] = _ending(opts)
            _check_start_not_after_end(kw["starting"], kw["ending"])
        strategy = opts.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise InvalidOptionError(
                "option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got "
                f"{opts['startingOffsetsByTimestampStrategy']!r}")
        kw["starting_strategy"] = strategy
        kw["fail_on_data_loss"] = _bool(opts, "failOnDataLoss", True)
        kw["include_headers"] = _bool(opts, "includeHeaders", False)
        kw["push_filters"] = _bool(opts, "pushFilters", False)
        kw["min_partitions"] = _positive(opts, "minPartitions", bits=32)
        kw["max_records_per_partition"] = _positive(opts, "maxRecordsPerPartition")
        kw["max_offsets_per_trigger"] = _positive(opts, "maxOffsetsPerTrigger")
        kw["min_offsets_per_trigger"] = _positive(opts, "minOffsetsPerTrigger")
        lo, hi = kw["min_offsets_per_trigger"], kw["max_offsets_per_trigger"]
        if lo is not None and hi is not None:
            _check_min_max(lo, hi)
        if "maxTriggerDelay" in opts:
            kw["max_trigger_delay_ms"] = duration_ms("maxTriggerDelay", opts["maxTriggerDelay"])
        # The consumer setting Kafka's source passes through: read_committed reads up to the
        # last stable offset ("latest" means it) and leaves out aborted transactions.
        level = opts.get("kafka.isolation.level", "read_uncommitted").strip()
        if level not in ("read_uncommitted", "read_committed"):
            raise InvalidOptionError(
                "option 'kafka.isolation.level' must be 'read_uncommitted' or 'read_committed', "
                f"got {opts['kafka.isolation.level']!r}")
        kw["read_committed"] = level == "read_committed"
        return cls(**kw)

    @property
    def isolation_level(self) -> str:
        """The isolation level for ``PartitionLog`` reads."""
        return "read_committed" if self.read_committed else "read_uncommitted"


@dataclass(frozen=True)
class WriteOptions:
    """Validated options of a batch or streaming write (plain data: it travels to executors)."""

    path: str
    topic: Optional[str] = None
    checkpoint_location: Optional[str] = None
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    freeze_worker_heap: bool = True  # see segstore.spark.worker_heap

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> "WriteOptions":
        """Validate a write's options (``topic`` overrides a ``topic`` column, as Kafka's)."""
        opts = _normalize(options, _WRITE, "sink")
        topic = opts.get("topic")
        if topic is not None:
            topic = topic.strip()  # Kafka's sink: options.get("topic").map(_.trim)
            _topic_name("topic", topic)
        ckpt = opts.get("checkpointLocation")
        if streaming and not ckpt:
            raise InvalidOptionError(
                "segstore's streaming sink needs option 'checkpointLocation': it keys the record "
                "of committed micro-batches that makes each batch land exactly once")
        timeout = _positive(opts, "lockTimeoutMs")
        return cls(path=_path(opts), topic=topic,
                   checkpoint_location=normalize_location(ckpt) if ckpt else None,
                   lock_timeout_ms=DEFAULT_LOCK_TIMEOUT_MS if timeout is None else timeout,
                   freeze_worker_heap=_bool(opts, "freezeWorkerHeap", True))


def normalize_location(location: str) -> str:
    """A checkpoint location as one stable string (``file:`` URIs and relative paths resolved)."""
    loc = location.strip()
    if loc.startswith("file://"):
        loc = loc[len("file://"):]
    elif loc.startswith("file:"):
        loc = loc[len("file:"):]
    if "://" in loc:
        return loc  # another filesystem: use it verbatim
    return os.path.abspath(loc)


def duration_ms(option: str, text: str) -> int:
    """Spark's time strings in ms, parsed as ``JavaUtils.timeStringAsMs`` parses them.

    Trimmed and lower-cased; a number (negative allowed), then at once an optional unit
    ``us``, ``ms``, ``s``, ``m``, ``min``, ``h`` or ``d`` (none = ms): ``15m``, ``500ms``.
    """
    m = _DURATION.fullmatch(_java_trim(str(text)).lower())
    number = java_int(m.group(1)) if m else None
    unit = (m.group(2) or "ms") if m else None
    if number is None or unit not in _UNIT_US:
        raise InvalidOptionError(
            f"option {option!r} must be a duration such as '15m', '30s', '500ms' or '1h' (units "
            f"us, ms, s, m, min, h, d; no space before the unit), got {text!r}")
    us = number * _UNIT_US[unit]
    # TimeUnit.convert: microseconds truncate toward zero, overflow saturates.
    ms = abs(us) // 1000 * (-1 if us < 0 else 1)
    return min(max(ms, LONG_MIN), LONG_MAX)


# -- helpers --------------------------------------------------------------------------------

def _normalize(options: Mapping[str, str], allowed: list, kind: str) -> dict:
    """Canonical names -> values; unknown and Kafka-client options rejected or dropped."""
    known = {n.lower(): n for n in allowed}
    out = {}
    for key, value in dict(options).items():
        low = key.lower()
        if low in known:
            out[known[low]] = value
        elif low == "paths":
            # load([a, b]): Spark passes every path as one JSON list of strings.
            paths = _paths(value)
            if len(paths) > 1:
                raise InvalidOptionError(
                    f"the segstore {kind} takes one store directory; got {len(paths)} paths")
            if paths:
                out["path"] = paths[0]
        elif low in {n.lower() for n in _IGNORED}:
            log.warning("option %r configures Kafka's consumer; segstore reads files directly "
                        "and ignores it", canonical(low))
        elif low == "kafka.bootstrap.servers":
            raise InvalidOptionError(
                "option 'kafka.bootstrap.servers' has no meaning for segstore: pass the store "
                "directory instead, with load(path) / save(path) or .option('path', ...)")
        elif low in ("kafka.key.serializer", "kafka.value.serializer"):
            raise InvalidOptionError(
                f"option {key!r} is not supported: as with Kafka's sink, keys and values are "
                "written as bytes; serialize them in the DataFrame (cast to string or binary)")
        elif low.startswith("kafka."):
            raise InvalidOptionError(
                f"option {key!r} configures a Kafka client; segstore reads and writes the log "
                "files directly and has no client to configure")
        else:
            close = difflib.get_close_matches(low, list(known), n=1)
            hint = f" (did you mean {known[close[0]]!r}?)" if close else ""
            raise InvalidOptionError(
                f"unknown option {key!r} for the segstore {kind}{hint}; known options "
                "(case-insensitive): " + ", ".join(sorted(allowed)))
    return out


def _path(opts: dict) -> str:
    path = opts.get("path")
    if not path:
        raise InvalidOptionError(
            "the store directory is missing: use load(path) / save(path) or .option('path', ...)"
            " (segstore's replacement for 'kafka.bootstrap.servers')")
    return normalize_location(path)


def _topic_name(option: str, name: str) -> None:
    from ..topic import validate_topic_name

    try:
        validate_topic_name(name)
    except InvalidTopicError as e:
        raise InvalidOptionError(f"option {option!r}: {e}") from None


def _bool(opts: dict, name: str, default: bool) -> bool:
    if name not in opts:
        return default
    text = str(opts[name]).strip().lower()
    if text not in ("true", "false"):
        raise InvalidOptionError(f"option {name!r} must be 'true' or 'false', got {opts[name]!r}")
    return text == "true"


def _paths(value) -> list:
    try:
        paths = json.loads(value)
    except (TypeError, ValueError):
        paths = None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise InvalidOptionError(
            "option 'paths' must be a JSON list of strings, as load([path, ...]) sets it; got "
            f"{value!r} (pass one store directory with load(path) or .option('path', ...))")
    return paths


_JAVA_TRIMMED = "".join(map(chr, range(33)))  # what String.trim removes: every char <= U+0020


def _java_trim(text: str) -> str:
    return text.strip(_JAVA_TRIMMED)


def java_int(text, bits: int = 64) -> Optional[int]:
    """``text`` as Java's Long.parseLong (``bits=64``) or Integer.parseInt (32) reads it:
    an optional sign and ASCII digits within range, no spaces or underscores; else None."""
    text = str(text)
    if not _JAVA_INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << (bits - 1)) <= value < 1 << (bits - 1) else None


def _int(name: str, text, bits: int = 64) -> int:
    # Kafka's source reads numeric options with .toLong / .toInt (minPartitions).
    value = java_int(text, bits)
    if value is None:
        raise InvalidOptionError(
            f"option {name!r} must be an integer ({bits}-bit, digits with an optional sign), got "
            f"{text!r}")
    return value


def _check_min_max(lo: int, hi: int) -> None:
    if lo > hi:
        raise InvalidOptionError(
            f"option 'minOffsetsPerTrigger' ({lo}) is higher than 'maxOffsetsPerTrigger' ({hi})")


def _positive(opts: dict, name: str, bits: int = 64) -> Optional[int]:
    if name not in opts:
        return None
    value = _int(name, opts[name], bits)
    if value < 1:
        raise InvalidOptionError(f"option {name!r} must be a positive integer, got {value}")
    return value


def _json_object(name: str, text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidOptionError(f"option {name!r} is not valid JSON ({e}): {text!r}") from None
    if not isinstance(obj, dict):
        raise InvalidOptionError(f"option {name!r} must be a JSON object, got {text!r}")
    return obj


def _assign(text: str) -> dict:
    obj = _json_object("assign", text)
    out = {}
    for topic, parts in obj.items():
        _topic_name("assign", topic)
        if not isinstance(parts, list) or not parts or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
            raise InvalidOptionError(
                "option 'assign' must map each topic to a non-empty list of partition numbers, "
                f'e.g. {{"topicA":[0,1]}}; got {topic!r}: {parts!r}')
        out[topic] = tuple(sorted(set(parts)))
    if not out:
        raise InvalidOptionError("option 'assign' names no topic partition")
    return out


def _per_partition(name: str, text: str) -> dict:
    """``{"topic": {"0": n, ...}}`` -> {(topic, 0): n}."""
    obj = _json_object(name, text)
    out = {}
    for topic, parts in obj.items():
        _topic_name(name, topic)
        if not isinstance(parts, dict):
            raise InvalidOptionError(
                f"option {name!r} must map each topic to an object of partition -> value, e.g. "
                f'{{"{topic}":{{"0":23}}}}; got {parts!r}')
        for p, v in parts.items():
            # Kafka's JSON reader (Jackson) parses the keys with Integer.parseInt, values as Longs.
            part = java_int(p, 32)
            if part is None or part < 0:
                raise InvalidOptionError(
                    f"option {name!r}: topic {topic!r} has the key {p!r}, which is not a "
                    "partition number (digits only, e.g. \"0\")")
            if not isinstance(v, int) or isinstance(v, bool) or not LONG_MIN <= v <= LONG_MAX:
                raise InvalidOptionError(
                    f"option {name!r}: partition {p!r} of topic {topic!r} must be mapped to a "
                    f"64-bit integer, got {v!r}")
            out[(topic, part)] = v
    return out


def _starting(opts: dict, streaming: bool) -> OffsetSpec:
    # Kafka's precedence: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets.
    if "startingTimestamp" in opts:
        ts = _int("startingTimestamp", _java_trim(opts["startingTimestamp"]))  # Spark: .trim.toLong
        if ts < 0:
            raise InvalidOptionError(f"option 'startingTimestamp' must be >= 0, got {ts}")
        return OffsetSpec("timestamp", "startingTimestamp", timestamp=ts)
    if "startingOffsetsByTimestamp" in opts:
        return _timestamps("startingOffsetsByTimestamp", opts)
    text = opts.get("startingOffsets", "latest" if streaming else "earliest").strip()
    if text.lower() == "earliest":
        return OffsetSpec("earliest", "startingOffsets")
    if text.lower() == "latest":
        if not streaming:
            raise InvalidOptionError(
                "option 'startingOffsets' cannot be 'latest' in a batch query (the range would "
                "be empty); use 'earliest', JSON offsets or a timestamp option")
        return OffsetSpec("latest", "startingOffsets")
    values = _per_partition("startingOffsets", text)
    for (t, p), v in values.items():
        if v < -2 or (v == -1 and not streaming):
            raise InvalidOptionError(
                f"option 'startingOffsets': offset {v} for {t}-{p} is not allowed "
                + ("in a batch query (-1 = latest)" if v == -1 else
                   "(use an offset >= 0, -2 for earliest or -1 for latest)"))
    return OffsetSpec("offsets", "startingOffsets", values=values)


def _ending(opts: dict) -> OffsetSpec:
    if "endingTimestamp" in opts:
        ts = _int("endingTimestamp", _java_trim(opts["endingTimestamp"]))  # Spark: .trim.toLong
        if ts < 0:
            raise InvalidOptionError(f"option 'endingTimestamp' must be >= 0, got {ts}")
        return OffsetSpec("timestamp", "endingTimestamp", timestamp=ts)
    if "endingOffsetsByTimestamp" in opts:
        return _timestamps("endingOffsetsByTimestamp", opts)
    text = opts.get("endingOffsets", "latest").strip()
    if text.lower() == "latest":
        return OffsetSpec("latest", "endingOffsets")
    if text.lower() == "earliest":
        raise InvalidOptionError(
            "option 'endingOffsets' cannot be 'earliest' (the range would be empty); use "
            "'latest' or JSON offsets")
    values = _per_partition("endingOffsets", text)
    for (t, p), v in values.items():
        if v < -1:
            raise InvalidOptionError(
                f"option 'endingOffsets': offset {v} for {t}-{p} is not allowed (use an offset "
                ">= 0 or -1 for latest; -2 = earliest is not allowed as an end)")
    return OffsetSpec("offsets", "endingOffsets", values=values)


def _check_start_not_after_end(start: OffsetSpec, end: OffsetSpec) -> None:
    """Kafka's checkOffsetLimitValidity: per-partition starts above their ends are refused
    before anything is resolved, whatever failOnDataLoss says (markers -2/-1 are not compared).
    """
    if start.kind != end.kind or start.kind not in ("offsets", "timestamps"):
        return
    what = "offset" if start.kind == "offsets" else "timestamp"
    for (t, p), s in sorted(start.values.items()):
        e = end.values.get((t, p))
        if e is not None and s > e >= 0:
            raise InvalidOptionError(
                f"option {start.option!r} gives {t}-{p} the {what} {s}, above its "
                f"{end.option!r} {what} {e}: the range would end before it starts")


def _timestamps(name: str, opts: dict) -> OffsetSpec:
    values = _per_partition(name, opts[name])
    for (t, p), v in values.items():
        if v < 0:
            raise InvalidOptionError(f"option {name!r}: timestamp {v} for {t}-{p} must be >= 0")
    return OffsetSpec("timestamps", name, values=values)
