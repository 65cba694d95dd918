"""Topic and store configuration with Kafka's names, defaults and validation rules (REF §6.15).

Topic keys are Kafka's topic-level names verbatim (``segment.bytes``, ``cleanup.policy``, ...).
Store-wide settings use the broker names (``log.cleaner.threads``, ...); the broker names of topic
keys (``log.segment.bytes``, ``log.retention.hours``, ...) set the store-wide default of the
matching topic key. Values may be Python values or strings as Kafka's command-line tools pass them
(``"1073741824"``, ``"true"``, ``"compact,delete"``). Unknown keys, Kafka keys segstore does not
implement and bad values raise :class:`~segstore.errors.InvalidConfigError`.

Deliberate differences from Kafka: ``segment.bytes`` keeps Kafka 3.x's minimum of 14 bytes (4.x
requires 1 MiB) so tests and small deployments can roll small segments, and the dedupe buffer needs
one 24-byte slot per cleaner thread rather than more than 1 MiB. ``compaction.strategy`` and
``compaction.strategy.header`` are segstore extensions (KIP-280, never shipped by Kafka).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from segstore.errors import InvalidConfigError

__all__ = ["ConfigKey", "Range", "OneOf", "TOPIC_CONFIG_KEYS", "STORE_CONFIG_KEYS",
           "TopicConfig", "StoreConfig", "describe_keys", "parse_properties"]

LONG_MAX = 2**63 - 1
_BOUNDS = {"int": (-2**31, 2**31 - 1), "long": (-2**63, 2**63 - 1)}
_JAVA_WS = "".join(map(chr, range(33)))  # what Java's String.trim() removes
_INT_RE = re.compile(r"[+-]?[0-9]+")
_HOUR_MS, _MINUTE_MS = 3_600_000, 60_000


@dataclass(frozen=True)
class Range:
    """Numeric bounds (inclusive; ``None`` = open; ``min_exclusive`` makes ``min`` exclusive), plus
    ``also``: values accepted outside them (gzip's level -1)."""

    min: float | None = None
    max: float | None = None
    also: tuple = ()
    min_exclusive: bool = False

    def check(self, value) -> str | None:
        """Return why ``value`` is out of range, or ``None`` when it is valid."""
        if value is None or value in self.also:
            return None
        low = self.min is not None and (value <= self.min if self.min_exclusive else value < self.min)
        high = self.max is not None and value > self.max
        if not (low or high):
            return None
        if self.also:
            return f"Value must be in {self}"
        if low:
            return f"Value must be {'greater than' if self.min_exclusive else 'at least'} {self.min}"
        return f"Value must be no more than {self.max}"

    def __str__(self) -> str:
        start = "(" if self.min_exclusive else "["
        lo = "..." if self.min is None else f"{self.min},..."
        text = f"{start}{lo},{self.max}]" if self.max is not None else f"{start}{lo}]"
        return text + "".join(f" or {a}" for a in self.also)


@dataclass(frozen=True)
class OneOf:
    """Allowed strings (for a list: allowed items), compared case-sensitively like Kafka."""

    values: tuple[str, ...]

    def check(self, value) -> str | None:
        """Return why ``value`` (a string or a tuple of strings) is not allowed, or ``None``."""
        items = value if isinstance(value, tuple) else (value,)
        if all(item in self.values for item in items):
            return None
        return "String must be one of: " + ", ".join(self.values)

    def __str__(self) -> str:
        return "[" + ", ".join(self.values) + "]"


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key.

    ``type`` is Kafka's: int, long, double, boolean, string, list or class. ``default`` is ``None``
    for an optional key with no default. ``kafka_name``: for a topic key, the broker property that
    sets its store-wide default. ``topic_name``: for a store key, the topic key it is the default of.
    """

    name: str
    type: str
    default: Any
    doc: str
    validator: Range | OneOf | None = None
    kafka_name: str | None = None
    scope: str = "topic"
    topic_name: str | None = None

    def parse(self, value):
        """Convert ``value`` (a Python value or a string) and validate it; return the value.

        Lists become tuples. Raises :class:`InvalidConfigError` naming the key and the value.
        """
        if value is None:
            if self.default is None:
                return None
            raise _invalid(self.name, value, "Value must not be null")
        if self.type in _BOUNDS:
            parsed = _to_int(value)
            lo, hi = _BOUNDS[self.type]
            if parsed is None or not lo <= parsed <= hi:
                raise _invalid(self.name, value, f"Not a number of type {self.type.upper()}")
        elif self.type == "double":
            parsed = _to_float(value)
            if parsed is None:
                raise _invalid(self.name, value, "Not a number of type DOUBLE")
        elif self.type == "boolean":
            parsed = value if isinstance(value, bool) else None
            if isinstance(value, str) and value.strip(_JAVA_WS).lower() in ("true", "false"):
                parsed = value.strip(_JAVA_WS).lower() == "true"
            if parsed is None:
                raise _invalid(self.name, value, "Expected value to be either true or false")
        elif self.type == "list":
            if isinstance(value, str):
                value = value.strip(_JAVA_WS)
                value = value.split(",") if value else []
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise _invalid(self.name, value,
                               "Expected a comma-separated string or a list of strings")
            parsed = tuple(dict.fromkeys(v.strip(_JAVA_WS) for v in value))  # drop duplicates
        else:  # string, class
            if not isinstance(value, str):
                raise _invalid(self.name, value, "Expected value to be a string, but it was a "
                               + type(value).__name__)
            parsed = value.strip(_JAVA_WS)
        reason = self.validator.check(parsed) if self.validator else None
        if reason:
            raise _invalid(self.name, parsed, reason)
        return parsed


def _to_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip(_JAVA_WS)
        return int(text) if _INT_RE.fullmatch(text) else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= 2**53 else None
    try:
        return operator.index(value)  # int, numpy integers
    except TypeError:
        return None


def _to_float(value) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, str):
            parsed = float(value.strip(_JAVA_WS)) if "_" not in value else math.nan
        elif isinstance(value, numbers.Real):
            parsed = float(value)
        else:
            return None
    except (ValueError, OverflowError):
        return None
    return None if math.isnan(parsed) else parsed


def _show(value) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return value if isinstance(value, str) else repr(value)


def _invalid(name: str, value, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {_show(value)} for configuration {name}: {reason}")


def _key(name, type_, default, doc, validator=None, kafka_name=None):
    return ConfigKey(name, type_, default, doc, validator, kafka_name)


_AT_LEAST_0, _AT_LEAST_1 = Range(0), Range(1)
_TOPIC_KEYS = [
    _key("cleanup.policy", "list", ("delete",),
         "Clean-up of old segments: 'delete' removes them by retention.ms and retention.bytes, "
         "'compact' keeps only the latest record per key; both may be listed. An empty list (as "
         "Kafka 4.x allows) does neither: only segments below the log start offset are removed.",
         OneOf(("compact", "delete")), "log.cleanup.policy"),
    _key("segment.bytes", "int", 1_073_741_824,
         "Size limit of one segment file: the log rolls a new segment when an append would pass "
         "it. segstore keeps Kafka 3.x's minimum of 14 bytes (4.x requires 1 MiB) so tests and "
         "small deployments can roll small segments.", Range(14), "log.segment.bytes"),
    _key("segment.ms", "long", 604_800_000,
         "Roll the active segment once its records span this long, even if it is not full, so "
         "retention and compaction can act on it.", _AT_LEAST_1, "log.roll.ms"),
    _key("segment.jitter.ms", "long", 0,
         "Upper bound of a random time subtracted from segment.ms for each segment, to spread out "
         "the rolls of many partitions.", _AT_LEAST_0, "log.roll.jitter.ms"),
    _key("segment.index.bytes", "int", 10_485_760,
         "Preallocated size of each segment's offset and time index files; a full index forces a "
         "roll.", Range(4), "log.index.size.max.bytes"),
    _key("index.interval.bytes", "int", 4096,
         "Bytes of batches appended between two offset-index entries: smaller means a denser "
         "index and shorter scans.", _AT_LEAST_0, "log.index.interval.bytes"),
    _key("max.message.bytes", "int", 1_048_588,
         "Largest record batch (after compression) the log accepts; also caps how far the "
         "cleaner grows its I/O buffers.", _AT_LEAST_0, "message.max.bytes"),
    _key("flush.messages", "long", LONG_MAX,
         "Force an fsync after this many appended messages; the default leaves flushing to the "
         "OS.", _AT_LEAST_1, "log.flush.interval.messages"),
    _key("flush.ms", "long", LONG_MAX,
         "Force an fsync when data has been unflushed this long; the default leaves flushing to "
         "the OS.", _AT_LEAST_0, "log.flush.interval.ms"),
    _key("retention.ms", "long", 604_800_000,
         "With the delete policy, remove segments whose newest record is older than this; -1 "
         "keeps data forever.", Range(-1), "log.retention.ms"),
    _key("retention.bytes", "long", -1,
         "With the delete policy, remove the oldest segments while the partition is larger than "
         "this; -1 means no size limit.", None, "log.retention.bytes"),
    _key("file.delete.delay.ms", "long", 60_000,
         "How long a segment renamed to .deleted stays on disk before its files are removed, so "
         "open readers can finish.", _AT_LEAST_0, "log.segment.delete.delay.ms"),
    _key("preallocate", "boolean", False,
         "Preallocate the whole segment.bytes when a segment file is created.", None,
         "log.preallocate"),
    _key("message.timestamp.type", "string", "CreateTime",
         "Whether record timestamps are the producer's (CreateTime) or set by the log at append "
         "time (LogAppendTime).", OneOf(("CreateTime", "LogAppendTime")),
         "log.message.timestamp.type"),
    _key("min.cleanable.dirty.ratio", "double", 0.5,
         "The cleaner picks a log only when the not-yet-compacted (dirty) share of it is greater "
         "than this ratio.", Range(0, 1), "log.cleaner.min.cleanable.ratio"),
    _key("delete.retention.ms", "long", 86_400_000,
         "How long tombstones and transaction markers survive compaction after their segment was "
         "first cleaned, so readers get to see the deletion.", _AT_LEAST_0,
         "log.cleaner.delete.retention.ms"),
    _key("min.compaction.lag.ms", "long", 0,
         "Records younger than this are never compacted.", _AT_LEAST_0,
         "log.cleaner.min.compaction.lag.ms"),
    _key("max.compaction.lag.ms", "long", LONG_MAX,
         "Records older than this make the log eligible for compaction whatever its dirty ratio; "
         "also caps segment.ms for compacted topics.", _AT_LEAST_1,
         "log.cleaner.max.compaction.lag.ms"),
    _key("compression.type", "string", "producer",
         "Codec the log stores batches with: 'producer' keeps the producer's codec, the others "
         "recompress every appended batch.",
         OneOf(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")), "compression.type"),
    _key("compression.gzip.level", "int", -1,
         "gzip level used when compression.type is gzip; -1 is zlib's default (6).",
         Range(1, 9, (-1,)), "compression.gzip.level"),
    _key("compression.lz4.level", "int", 9,
         "lz4 level used when compression.type is lz4.", Range(1, 17), "compression.lz4.level"),
    _key("compression.zstd.level", "int", 3,
         "zstd level used when compression.type is zstd.", Range(-131072, 22),
         "compression.zstd.level"),
    _key("compaction.strategy", "string", "offset",
         "segstore extension (KIP-280, never shipped by Kafka): which record per key survives "
         "compaction: the highest offset (Kafka's rule), the highest timestamp, or the highest "
         "int64 value of the header named by compaction.strategy.header.",
         OneOf(("offset", "timestamp", "header"))),
    _key("compaction.strategy.header", "string", "",
         "segstore extension: the header key the 'header' compaction strategy compares; required "
         "when compaction.strategy is header."),
]
TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {k.name: k for k in _TOPIC_KEYS}
"""The topic-level keys segstore implements, by name, with Kafka's defaults."""


def _store(name, type_, default, doc, validator=None, topic_name=None):
    return ConfigKey(name, type_, default, doc, validator, None, "store", topic_name)


_STORE_KEYS = [
    _store("log.cleaner.enable", "boolean", True,
           "Run the background cleaner threads; when false, compacted topics are compacted only "
           "by explicit compaction calls. (Deprecated in Kafka 4.1.)"),
    _store("log.cleaner.threads", "int", 1, "Number of background cleaner threads.", _AT_LEAST_0),
    _store("log.cleaner.dedupe.buffer.size", "long", 134_217_728,
           "Memory for the cleaners' key-to-offset maps, split evenly across threads, 24 bytes "
           "per key. segstore requires one slot per thread (Kafka: more than 1 MiB) so tests can "
           "fill the map.", Range(24)),
    _store("log.cleaner.io.buffer.size", "int", 524_288,
           "Memory for the cleaners' read and write buffers, split across threads; each thread "
           "gets two halves.", _AT_LEAST_0),
    _store("log.cleaner.io.buffer.load.factor", "double", 0.9,
           "Despite its name, the fill limit of the dedupe map: a round stops mapping keys once "
           "this share of its slots is used.", Range(0, 1, min_exclusive=True)),
    _store("log.cleaner.io.max.bytes.per.second", "double", 1.7976931348623157e308,
           "Throttle on the bytes read plus written by all cleaner threads together.",
           Range(0, min_exclusive=True)),
    _store("log.cleaner.backoff.ms", "long", 15_000,
           "How long a cleaner thread sleeps when no log needs cleaning.", _AT_LEAST_0),
    _store("log.retention.check.interval.ms", "long", 300_000,
           "Period of the background retention task.", _AT_LEAST_1),
    _store("log.flush.scheduler.interval.ms", "long", LONG_MAX,
           "How often the background flusher checks logs against flush.ms; also the default of "
           "flush.ms when log.flush.interval.ms is unset.", _AT_LEAST_1),
    _store("log.flush.offset.checkpoint.interval.ms", "int", 60_000,
           "Period of writing the recovery-point checkpoint file.", _AT_LEAST_0),
    _store("log.flush.start.offset.checkpoint.interval.ms", "int", 60_000,
           "Period of writing the log-start-offset checkpoint file.", _AT_LEAST_0),
    _store("num.recovery.threads.per.data.dir", "int", 1,
           "Threads that load and recover logs when the store opens and flush them when it "
           "closes.", _AT_LEAST_1),
    _store("log.roll.ms", "long", None, "Store-wide default of segment.ms; overrides "
           "log.roll.hours when set.", _AT_LEAST_1, "segment.ms"),
    _store("log.roll.hours", "int", 168, "Store-wide default of segment.ms, in hours (used when "
           "log.roll.ms is unset).", _AT_LEAST_1, "segment.ms"),
    _store("log.roll.jitter.ms", "long", None, "Store-wide default of segment.jitter.ms; "
           "overrides log.roll.jitter.hours when set.", _AT_LEAST_0, "segment.jitter.ms"),
    _store("log.roll.jitter.hours", "int", 0, "Store-wide default of segment.jitter.ms, in hours "
           "(used when log.roll.jitter.ms is unset).", _AT_LEAST_0, "segment.jitter.ms"),
    _store("log.retention.ms", "long", None, "Store-wide default of retention.ms; overrides "
           "minutes and hours when set. Negative means forever; 0 is rejected.", None,
           "retention.ms"),
    _store("log.retention.minutes", "int", None, "Store-wide default of retention.ms, in minutes "
           "(used when log.retention.ms is unset).", None, "retention.ms"),
    _store("log.retention.hours", "int", 168, "Store-wide default of retention.ms, in hours (used "
           "when neither log.retention.ms nor log.retention.minutes is set).", None,
           "retention.ms"),
    _store("log.flush.interval.ms", "long", None, "Store-wide default of flush.ms; when unset, "
           "log.flush.scheduler.interval.ms is used.", _AT_LEAST_0, "flush.ms"),
]
_SYNONYM_KEYS = {k.name for k in _STORE_KEYS if k.topic_name}
# The other broker names of topic keys: the topic key's type, default and validator.
_STORE_KEYS += [
    dataclasses.replace(k, name=k.kafka_name, kafka_name=None, scope="store", topic_name=k.name,
                        doc=f"Store-wide default of topic configuration {k.name}. {k.doc}")
    for k in _TOPIC_KEYS if k.kafka_name and k.kafka_name not in _SYNONYM_KEYS]
STORE_CONFIG_KEYS: dict[str, ConfigKey] = {k.name: k for k in _STORE_KEYS}
"""Store-wide keys (Kafka broker names), by name, with Kafka's defaults."""

_REPLICATION = "segstore keeps one local copy of each partition; there is no replication"
_TIERED = "segstore has no tiered (remote) storage"
_TIMESTAMP_CHECK = "segstore does not check record timestamps against the clock"
_TOPIC_UNSUPPORTED = {
    "min.insync.replicas": _REPLICATION,
    "unclean.leader.election.enable": _REPLICATION,
    "leader.replication.throttled.replicas": _REPLICATION,
    "follower.replication.throttled.replicas": _REPLICATION,
    "message.downconversion.enable": "segstore serves no fetch protocol to old clients "
                                     "(removed in Kafka 4.0)",
    "message.format.version": "segstore always writes record batch v2 (removed in Kafka 4.0)",
    "remote.storage.enable": _TIERED, "local.retention.ms": _TIERED,
    "local.retention.bytes": _TIERED, "remote.log.copy.disable": _TIERED,
    "remote.log.delete.on.disable": _TIERED, "remote.copy.lag.ms": _TIERED,
    "remote.copy.lag.bytes": _TIERED,
    "message.timestamp.difference.max.ms": _TIMESTAMP_CHECK,
    "message.timestamp.before.max.ms": _TIMESTAMP_CHECK,
    "message.timestamp.after.max.ms": _TIMESTAMP_CHECK,
    "internal.segment.bytes": "it is Kafka's test-only override; segstore's segment.bytes "
                              "already accepts sizes down to 14 bytes",
}
_STORE_UNSUPPORTED = {
    "log.dirs": "a store has one root directory, given to segstore.open()",
    "log.dir": "a store has one root directory, given to segstore.open()",
    "num.partitions": "pass num_partitions to create_topic()",
    "auto.create.topics.enable": "segstore never creates topics implicitly",
    "default.replication.factor": _REPLICATION, "min.insync.replicas": _REPLICATION,
    "unclean.leader.election.enable": _REPLICATION,
    "log.message.downconversion.enable": _TOPIC_UNSUPPORTED["message.downconversion.enable"],
    "log.message.format.version": _TOPIC_UNSUPPORTED["message.format.version"],
    "log.message.timestamp.difference.max.ms": _TIMESTAMP_CHECK,
    "log.message.timestamp.before.max.ms": _TIMESTAMP_CHECK,
    "log.message.timestamp.after.max.ms": _TIMESTAMP_CHECK,
    "remote.log.storage.system.enable": _TIERED, "log.local.retention.ms": _TIERED,
    "log.local.retention.bytes": _TIERED,
    "log.dir.failure.timeout.ms": "a store has one directory; its I/O errors surface as errors",
}


def _check_name(name, scope: str) -> ConfigKey:
    """Return the ConfigKey of ``name`` in ``scope``, or raise a helpful InvalidConfigError."""
    keys, unsupported, other = ((TOPIC_CONFIG_KEYS, _TOPIC_UNSUPPORTED, STORE_CONFIG_KEYS)
                                if scope == "topic" else
                                (STORE_CONFIG_KEYS, _STORE_UNSUPPORTED, TOPIC_CONFIG_KEYS))
    if not isinstance(name, str):
        raise InvalidConfigError(f"Configuration names must be strings, got {name!r}")
    if name in keys:
        return keys[name]
    reason = unsupported.get(name)
    if reason is None and name.startswith("confluent."):
        reason = "it is a Confluent Platform extension"
    if reason:
        raise InvalidConfigError(
            f"'{name}' is a Kafka configuration segstore does not implement: {reason}")
    hint = None
    if name in other and scope == "topic":
        hint = "it is a store-wide setting" + (
            f"; the topic configuration is '{other[name].topic_name}'" if other[name].topic_name
            else "")
    elif name in other:
        hint = "it is a topic configuration" + (
            f"; its store-wide default is '{other[name].kafka_name}'" if other[name].kafka_name
            else "")
    else:
        close = difflib.get_close_matches(name, list(keys), n=1)
        hint = f"did you mean '{close[0]}'?" if close else None
    raise InvalidConfigError(f"Unknown configuration '{name}'" + (f"; {hint}" if hint else ""))


def _parse_all(config, scope: str) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise InvalidConfigError(f"Configuration must be a mapping, got {type(config).__name__}")
    return {name: _check_name(name, scope).parse(value) for name, value in config.items()}


def _check_lag(values, min_name: str, max_name: str) -> None:
    if values[min_name] > values[max_name]:
        raise InvalidConfigError(
            f"Invalid configuration: {min_name} ({values[min_name]}) must not be greater than "
            f"{max_name} ({values[max_name]})")


class _Config(Mapping):
    """Shared machinery: an immutable mapping of every key of one scope to its value."""

    __slots__ = ("_overrides", "_values", "_defaults")
    _SCOPE = "topic"

    def _init(self, overrides, defaults: dict[str, Any]) -> None:
        self._overrides = _parse_all(overrides, self._SCOPE)
        self._defaults = defaults
        self._values = {**defaults, **self._overrides}
        self._validate()

    def _validate(self) -> None:  # cross-key rules, per subclass
        pass

    def __getitem__(self, name: str):
        try:
            return self._values[name]
        except (KeyError, TypeError):
            try:
                _check_name(name, self._SCOPE)
            except InvalidConfigError as exc:
                raise KeyError(str(exc)) from None
            raise

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._values

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._overrides!r})"

    @property
    def overrides(self) -> dict[str, Any]:
        """The explicitly set keys and their parsed values (a copy)."""
        return dict(self._overrides)

    @property
    def defaults(self) -> dict[str, Any]:
        """The value every key takes when not overridden (a copy)."""
        return dict(self._defaults)

    def to_dict(self) -> dict[str, Any]:
        """Every key with its effective value (lists as tuples)."""
        return dict(self._values)

    def _updated_overrides(self, changes, deletions) -> dict[str, Any]:
        changes = dict(changes or {})
        deletions = [deletions] if isinstance(deletions, str) else list(deletions)
        for name in deletions:
            _check_name(name, self._SCOPE)
        both = sorted(set(changes) & set(deletions))
        if both:
            raise InvalidConfigError(f"Configuration {both[0]} is both set and deleted")
        kept = {k: v for k, v in self._overrides.items() if k not in deletions}
        return {**kept, **changes}

    def to_properties(self) -> str:
        """The overrides as Java-properties text, one ``key=value`` line each, sorted by key."""
        return "".join(f"{_escape(k)}={_escape(_format(v))}\n"
                       for k, v in sorted(self._overrides.items()))


def _attr(name: str) -> property:
    return property(lambda self: self._values[name], doc=f"The value of ``{name}``.")


class TopicConfig(_Config):
    """The validated configuration of one topic: an immutable mapping of every topic key.

    ``defaults`` gives the store-wide defaults: a :class:`StoreConfig`, a mapping of topic keys
    (missing keys take Kafka's defaults), or ``None`` for Kafka's defaults.
    """

    __slots__ = ()
    _SCOPE = "topic"

    def __init__(self, overrides: Mapping[str, Any] | None = None, defaults=None):
        if isinstance(defaults, StoreConfig):
            base = defaults.topic_defaults()
        else:
            base = {k.name: k.default for k in _TOPIC_KEYS}
            base.update(_parse_all(defaults, "topic"))
        self._init(overrides, base)

    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any] | None = None, *, defaults=None) -> TopicConfig:
        """Build a config from explicitly set keys (``overrides``) over ``defaults``."""
        return cls(overrides, defaults)

    @classmethod
    def from_properties(cls, text: str, *, defaults=None) -> TopicConfig:
        """Build a config from Java-properties text (as written by :meth:`to_properties`)."""
        return cls(parse_properties(text), defaults)

    def with_updates(self, changes: Mapping[str, Any] | None = None,
                     deletions: Iterable[str] = ()) -> TopicConfig:
        """A new config with ``changes`` set and ``deletions`` reverted to their defaults."""
        return TopicConfig(self._updated_overrides(changes, deletions), self._defaults)

    def _validate(self) -> None:
        _check_lag(self._values, "min.compaction.lag.ms", "max.compaction.lag.ms")
        if self._values["compaction.strategy"] == "header" and \
                not self._values["compaction.strategy.header"]:
            raise InvalidConfigError("Invalid configuration: compaction.strategy=header needs "
                                     "compaction.strategy.header (the header key to compare)")

    cleanup_policy = _attr("cleanup.policy")
    segment_bytes = _attr("segment.bytes")
    segment_ms = _attr("segment.ms")
    segment_jitter_ms = _attr("segment.jitter.ms")
    segment_index_bytes = _attr("segment.index.bytes")
    index_interval_bytes = _attr("index.interval.bytes")
    max_message_bytes = _attr("max.message.bytes")
    flush_messages = _attr("flush.messages")
    flush_ms = _attr("flush.ms")
    retention_ms = _attr("retention.ms")
    retention_bytes = _attr("retention.bytes")
    file_delete_delay_ms = _attr("file.delete.delay.ms")
    preallocate = _attr("preallocate")
    message_timestamp_type = _attr("message.timestamp.type")
    min_cleanable_dirty_ratio = _attr("min.cleanable.dirty.ratio")
    delete_retention_ms = _attr("delete.retention.ms")
    min_compaction_lag_ms = _attr("min.compaction.lag.ms")
    max_compaction_lag_ms = _attr("max.compaction.lag.ms")
    compression_type = _attr("compression.type")
    compaction_strategy = _attr("compaction.strategy")
    compaction_strategy_header = _attr("compaction.strategy.header")

    @property
    def compact(self) -> bool:
        """True when ``cleanup.policy`` includes ``compact``."""
        return "compact" in self._values["cleanup.policy"]

    @property
    def delete(self) -> bool:
        """True when ``cleanup.policy`` includes ``delete`` (time and size retention apply)."""
        return "delete" in self._values["cleanup.policy"]


class StoreConfig(_Config):
    """The validated store-wide configuration (Kafka broker names): an immutable mapping."""

    __slots__ = ("_topic_defaults",)
    _SCOPE = "store"

    def __init__(self, overrides: Mapping[str, Any] | None = None):
        self._init(overrides, {k.name: k.default for k in _STORE_KEYS})

    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any] | None = None) -> StoreConfig:
        """Build a config from explicitly set keys."""
        return cls(overrides)

    @classmethod
    def from_properties(cls, text: str) -> StoreConfig:
        """Build a config from Java-properties text (as written by :meth:`to_properties`)."""
        return cls(parse_properties(text))

    def with_updates(self, changes: Mapping[str, Any] | None = None,
                     deletions: Iterable[str] = ()) -> StoreConfig:
        """A new config with ``changes`` set and ``deletions`` reverted to their defaults."""
        return StoreConfig(self._updated_overrides(changes, deletions))

    def topic_defaults(self) -> dict[str, Any]:
        """The default of every topic key under this store config (a copy)."""
        return dict(self._topic_defaults)

    def _validate(self) -> None:
        v = self._values
        _check_lag(v, "log.cleaner.min.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms")
        threads = v["log.cleaner.threads"]
        if threads and v["log.cleaner.dedupe.buffer.size"] // threads < 24:
            raise InvalidConfigError(
                "Invalid configuration: log.cleaner.dedupe.buffer.size must give each of the "
                f"{threads} cleaner threads at least 24 bytes (one offset map slot)")
        topic = {k.name: v[k.kafka_name] for k in _TOPIC_KEYS
                 if k.kafka_name and k.kafka_name not in _SYNONYM_KEYS}
        topic["segment.ms"] = _first(v["log.roll.ms"], _mul(v["log.roll.hours"], _HOUR_MS))
        topic["segment.jitter.ms"] = _first(v["log.roll.jitter.ms"],
                                            _mul(v["log.roll.jitter.hours"], _HOUR_MS))
        retention = _first(v["log.retention.ms"], _mul(v["log.retention.minutes"], _MINUTE_MS),
                           _mul(v["log.retention.hours"], _HOUR_MS))
        if retention == 0:
            raise InvalidConfigError(
                "Invalid configuration: the retention time set by log.retention.ms, "
                "log.retention.minutes or log.retention.hours must be unlimited (negative) or at "
                "least 1 ms, got 0")
        topic["retention.ms"] = max(retention, -1)
        topic["flush.ms"] = _first(v["log.flush.interval.ms"], v["log.flush.scheduler.interval.ms"])
        self._topic_defaults = dict(TopicConfig(None, topic))  # validates the derived defaults

    cleaner_enable = _attr("log.cleaner.enable")
    cleaner_threads = _attr("log.cleaner.threads")
    cleaner_dedupe_buffer_size = _attr("log.cleaner.dedupe.buffer.size")
    cleaner_io_buffer_size = _attr("log.cleaner.io.buffer.size")
    cleaner_io_buffer_load_factor = _attr("log.cleaner.io.buffer.load.factor")
    cleaner_io_max_bytes_per_second = _attr("log.cleaner.io.max.bytes.per.second")
    cleaner_backoff_ms = _attr("log.cleaner.backoff.ms")
    retention_check_interval_ms = _attr("log.retention.check.interval.ms")
    flush_scheduler_interval_ms = _attr("log.flush.scheduler.interval.ms")
    flush_offset_checkpoint_interval_ms = _attr("log.flush.offset.checkpoint.interval.ms")
    flush_start_offset_checkpoint_interval_ms = _attr("log.flush.start.offset.checkpoint.interval.ms")
    num_recovery_threads_per_data_dir = _attr("num.recovery.threads.per.data.dir")


def _first(*values):
    return next(v for v in values if v is not None)


def _mul(value, factor):
    return None if value is None else max(min(value * factor, LONG_MAX), -2**63)


def describe_keys(scope: str | None = None) -> list[ConfigKey]:
    """Every ConfigKey (topic keys first), or those of ``scope`` ("topic" or "store")."""
    return [k for k in _TOPIC_KEYS + _STORE_KEYS if scope is None or k.scope == scope]


# --- Java-properties text -------------------------------------------------------------------------

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f",
            "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!", " ": "\\ "}
_UNESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LINE = re.compile(r"((?:[^\\=: \t\f]|\\.)*)[ \t\f]*[=:]?[ \t\f]*(.*)\Z", re.S)


def _format(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return repr(value) if isinstance(value, float) else str(value)


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ch == "\x7f"
                                        else ch) for ch in text)


def _unescape(text: str) -> str:
    def one(m: re.Match) -> str:
        code = m.group(1)
        if code[0] == "u":
            if not re.fullmatch(r"u[0-9a-fA-F]{4}", code):
                raise InvalidConfigError(f"Malformed \\uxxxx encoding in properties: {text!r}")
            return chr(int(code[1:], 16))
        return _UNESCAPES.get(code, code)
    out = re.sub(r"\\(u.{0,4}|.)", one, text, flags=re.S)
    return out.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java-properties text (comments, ``=``/``:``/space separators, escapes, continuation
    lines) into a dict of strings; a repeated key keeps its last value, as in Java."""
    lines, out, i = re.split(r"\r\n|\r|\n", text), {}, 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while (len(line) - len(line.rstrip("\\"))) % 2:
            line = line[:-1] + (lines[i].lstrip(" \t\f") if i < len(lines) else "")
            i += 1
        key, value = _LINE.match(line).groups()
        out[_unescape(key)] = _unescape(value)
    return out
