"""Topic and store configuration: Kafka's key names, defaults and validation rules (REF §6.15).

Topic keys are Kafka's topic-level names verbatim (``segment.bytes``, ``cleanup.policy``, ...).
Store-wide settings use the broker names (``log.cleaner.threads``, ...); the broker names of topic
keys (``log.segment.bytes``, ``log.retention.hours``, ...) set the store-wide default of the topic
key. Values may be Python values or strings as Kafka's tools pass them (``"1073741824"``,
``"true"``, ``"compact,delete"``). Unknown keys, Kafka keys segstore does not implement, bad values
and conflicting values raise :class:`~segstore.errors.InvalidConfigError`.

Deliberate differences from Kafka: ``segment.bytes`` keeps Kafka 3.x's minimum of 14 bytes (4.x
requires 1 MiB) so tests and small deployments can roll small segments; the dedupe buffer needs one
24-byte slot per cleaner thread, not more than 1 MiB, so tests can fill the offset map; and
``compaction.strategy``/``compaction.strategy.header`` are extensions (KIP-280, never in Kafka).
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

from .properties import format_value as _format, escape as _escape, parse_properties  # noqa: F401

LONG_MAX = 2**63 - 1
_BOUNDS = {"int": (-2**31, 2**31 - 1), "long": (-2**63, 2**63 - 1)}
_JAVA_WS = "".join(map(chr, range(33)))  # what Java's String.trim() removes
_HOUR_MS, _MINUTE_MS = 3_600_000, 60_000


@dataclass(frozen=True)
class Range:
    """Numeric bounds, inclusive unless ``min_exclusive``; ``None`` leaves a side open. ``also``
    lists values accepted outside the bounds (gzip's level -1)."""

    min: float | None = None
    max: float | None = None
    also: tuple = ()
    min_exclusive: bool = False

    def check(self, value) -> str | None:
        """Return why ``value`` is out of range, or ``None`` when it is valid."""
        if value is None or value in self.also:
            return None
        lo, hi = self.min, self.max
        too_low = lo is not None and (value < lo or self.min_exclusive and value == lo)
        too_high = hi is not None and value > hi
        if self.also and (too_low or too_high):
            return f"Value must be in {self}"
        if too_low:
            return f"Value must be {'greater than' if self.min_exclusive else 'at least'} {lo}"
        return f"Value must be no more than {hi}" if too_high else None

    def __str__(self) -> str:  # Kafka's notation: [14,...], [0,...,1]
        text = "(" if self.min_exclusive else "["
        text += "..." if self.min is None else f"{self.min},..."
        text += "]" if self.max is None else f",{self.max}]"
        return text + "".join(f" or {a}" for a in self.also)


@dataclass(frozen=True)
class OneOf:
    """Allowed strings (for a list: allowed items), compared case-sensitively as Kafka does."""

    values: tuple[str, ...]

    def check(self, value) -> str | None:
        """Return why ``value`` (a string or a tuple of strings) is not allowed, or ``None``."""
        items = value if isinstance(value, tuple) else (value,)
        return None if all(v in self.values for v in items) else \
            "String must be one of: " + ", ".join(self.values)

    def __str__(self) -> str:
        return "[" + ", ".join(self.values) + "]"


def _to_int(value) -> int | None:
    if isinstance(value, str):
        text = value.strip(_JAVA_WS)
        return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= 2**53 else None
    try:
        return None if isinstance(value, bool) else operator.index(value)  # int, numpy ints
    except TypeError:
        return None


def _to_float(value) -> float | None:
    try:
        if isinstance(value, str) and "_" not in value:
            parsed = float(value.strip(_JAVA_WS))
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            parsed = float(value)
        else:
            return None
    except (ValueError, OverflowError):
        return None
    return None if math.isnan(parsed) else parsed


def _to_bool(value) -> bool | None:
    if isinstance(value, bool):
        return value
    text = value.strip(_JAVA_WS).lower() if isinstance(value, str) else None
    return {"true": True, "false": False}.get(text)


def _to_list(value) -> tuple[str, ...] | None:
    if isinstance(value, str):
        value = value.strip(_JAVA_WS)
        value = value.split(",") if value else []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(dict.fromkeys(v.strip(_JAVA_WS) for v in value))  # duplicates dropped


def _to_str(value) -> str | None:
    return value.strip(_JAVA_WS) if isinstance(value, str) else None


_CONVERT = {"int": _to_int, "long": _to_int, "double": _to_float, "boolean": _to_bool,
            "list": _to_list, "string": _to_str, "class": _to_str}
_TYPE_ERRORS = {"int": "Not a number of type INT", "long": "Not a number of type LONG",
                "double": "Not a number of type DOUBLE",
                "boolean": "Expected value to be either true or false",
                "list": "Expected a comma-separated string or a list of strings",
                "string": "Expected value to be a string", "class": "Expected a class name"}


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: Kafka's ``type`` (int, long, double, boolean, string, list, class),
    ``default`` (``None`` = optional, unset), ``validator``, ``doc`` and ``scope`` ("topic" or
    "store"). ``kafka_name``: for a topic key, the broker property that sets its store-wide
    default. ``topic_name``: for a store key, the topic key whose default it sets."""

    name: str
    type: str
    default: Any
    validator: Range | OneOf | None
    kafka_name: str | None
    doc: str
    scope: str = "topic"
    topic_name: str | None = None

    def parse(self, value):
        """Convert ``value`` (a Python value or a string), validate it and return it (lists as
        tuples); raise :class:`InvalidConfigError` naming the key, the value and the rule."""
        if value is None and self.default is None:
            return None
        parsed = None if value is None else _CONVERT[self.type](value)
        lo, hi = _BOUNDS.get(self.type, (None, None))
        if parsed is None or lo is not None and not lo <= parsed <= hi:
            raise _invalid(self.name, value, _TYPE_ERRORS[self.type])
        reason = self.validator.check(parsed) if self.validator else None
        if reason:
            raise _invalid(self.name, parsed, reason)
        return parsed


def _show(value) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return value if isinstance(value, str) else repr(value)


def _invalid(name: str, value, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {_show(value)} for configuration {name}: {reason}")


_MIN0, _MIN1 = Range(0), Range(1)
_TOPIC_KEYS = [ConfigKey(*row) for row in [
    ("cleanup.policy", "list", ("delete",), OneOf(("compact", "delete")), "log.cleanup.policy",
     "How old data goes: 'delete' drops segments past retention.ms/retention.bytes, 'compact' "
     "keeps the latest record per key; both may be listed. An empty list (Kafka 4.x) does neither: "
     "only segments below the log start offset are removed."),
    ("segment.bytes", "int", 1_073_741_824, Range(14), "log.segment.bytes",
     "Size limit of a segment file; the log rolls when an append would pass it. Minimum 14 bytes "
     "as in Kafka 3.x (4.x: 1 MiB), so tests and small deployments can roll small segments."),
    ("segment.ms", "long", 604_800_000, _MIN1, "log.roll.ms",
     "Roll the active segment once it spans this much time, even if not full, so retention and "
     "compaction can act on it."),
    ("segment.jitter.ms", "long", 0, _MIN0, "log.roll.jitter.ms",
     "Upper bound of a random time taken off segment.ms per segment, to spread out rolls."),
    ("segment.index.bytes", "int", 10_485_760, Range(4), "log.index.size.max.bytes",
     "Preallocated size of each offset and time index file; a full index forces a roll."),
    ("index.interval.bytes", "int", 4096, _MIN0, "log.index.interval.bytes",
     "Bytes appended between two offset-index entries: smaller means a denser index."),
    ("max.message.bytes", "int", 1_048_588, _MIN0, "message.max.bytes",
     "Largest record batch (after compression) the log accepts."),
    ("flush.messages", "long", LONG_MAX, _MIN1, "log.flush.interval.messages",
     "Fsync after this many unflushed messages; the default leaves flushing to the OS."),
    ("flush.ms", "long", LONG_MAX, _MIN0, "log.flush.interval.ms",
     "Fsync once data has been unflushed this long; the default leaves flushing to the OS."),
    ("retention.ms", "long", 604_800_000, Range(-1), "log.retention.ms",
     "With 'delete', drop segments whose newest record is older than this; -1 keeps all."),
    ("retention.bytes", "long", -1, None, "log.retention.bytes",
     "With 'delete', drop the oldest segments while the partition is larger; -1: no limit."),
    ("file.delete.delay.ms", "long", 60_000, _MIN0, "log.segment.delete.delay.ms",
     "How long files renamed to .deleted stay on disk, so open readers can finish."),
    ("preallocate", "boolean", False, None, "log.preallocate",
     "Preallocate the full segment.bytes when a segment file is created."),
    ("message.timestamp.type", "string", "CreateTime", OneOf(("CreateTime", "LogAppendTime")),
     "log.message.timestamp.type",
     "Keep the producer's record timestamps (CreateTime) or stamp append times (LogAppendTime)."),
    ("min.cleanable.dirty.ratio", "double", 0.5, Range(0, 1), "log.cleaner.min.cleanable.ratio",
     "The cleaner picks a log only when its uncompacted (dirty) share is greater than this."),
    ("delete.retention.ms", "long", 86_400_000, _MIN0, "log.cleaner.delete.retention.ms",
     "How long tombstones and transaction markers outlive the first cleaning of their segment."),
    ("min.compaction.lag.ms", "long", 0, _MIN0, "log.cleaner.min.compaction.lag.ms",
     "Records younger than this are never compacted."),
    ("max.compaction.lag.ms", "long", LONG_MAX, _MIN1, "log.cleaner.max.compaction.lag.ms",
     "A record older than this makes its log due for compaction whatever the dirty ratio; also "
     "caps segment.ms of compacted topics."),
    ("compression.type", "string", "producer",
     OneOf(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")), "compression.type",
     "Codec of appends that name none (compression=None, Spark writes): 'producer' and "
     "'uncompressed' write uncompressed, any other that codec. Unlike Kafka's broker, a codec "
     "the caller names and pre-encoded batches (append_records, adopted files) are kept."),
    ("compression.gzip.level", "int", -1, Range(1, 9, (-1,)), "compression.gzip.level",
     "Level of the batches this log compresses with gzip; -1 is zlib's default (6)."),
    ("compression.lz4.level", "int", 9, Range(1, 17), "compression.lz4.level",
     "Level of the batches this log compresses with lz4 (cramjam 2.14's block compressor "
     "writes the same bytes at every level)."),
    ("compression.zstd.level", "int", 3, Range(-131072, 22), "compression.zstd.level",
     "Level of the batches this log compresses with zstd."),
    ("compaction.strategy", "string", "offset", OneOf(("offset", "timestamp", "header")), None,
     "segstore extension (KIP-280): per key, compaction keeps the record with the highest offset "
     "(Kafka), the highest timestamp, or the highest int64 compaction.strategy.header value."),
    ("compaction.strategy.header", "string", "", None, None,
     "segstore extension: header key the 'header' compaction strategy compares; required then."),
]]
TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {k.name: k for k in _TOPIC_KEYS}
"""The topic-level keys segstore implements, by name, with Kafka's defaults."""

_STORE_KEYS = [ConfigKey(*row[:4], None, row[4], "store", *row[5:]) for row in [
    ("log.cleaner.enable", "boolean", True, None, "Run the background cleaner threads; when "
     "false, only explicit compaction calls compact. (Deprecated in Kafka 4.1.)"),
    ("log.cleaner.threads", "int", 1, _MIN0, "Number of background cleaner threads."),
    ("log.cleaner.dedupe.buffer.size", "long", 134_217_728, Range(24), "Memory of the cleaners' "
     "key-to-offset maps (24 bytes per key; 32 with compaction.strategy timestamp or header), "
     "split evenly across the threads."),
    ("log.cleaner.io.buffer.size", "int", 524_288, _MIN0, "Memory of the cleaners' I/O buffers, "
     "split across the threads; each thread gets a read and a write half. segstore reads at "
     "least 16 MiB at a time, so below 32 MiB per thread it changes nothing."),
    ("log.cleaner.io.buffer.load.factor", "double", 0.9, Range(0, 1, (), True), "Despite the "
     "name, the dedupe map's fill limit: a round stops mapping keys at this share of slots."),
    ("log.cleaner.io.max.bytes.per.second", "double", 1.7976931348623157e308,
     Range(0, None, (), True), "Throttle on bytes read plus written by all cleaner threads."),
    ("log.cleaner.backoff.ms", "long", 15_000, _MIN0,
     "How long a cleaner thread sleeps when no log needs cleaning."),
    ("log.retention.check.interval.ms", "long", 300_000, _MIN1,
     "Period of the background retention task."),
    ("log.flush.scheduler.interval.ms", "long", LONG_MAX, _MIN1, "How often the flusher checks "
     "logs against flush.ms; flush.ms's default when log.flush.interval.ms is unset."),
    ("log.flush.offset.checkpoint.interval.ms", "int", 60_000, _MIN0,
     "Period of writing the checkpoint files: segstore writes the recovery-point and "
     "log-start-offset checkpoints together, at the shorter of the two intervals."),
    ("log.flush.start.offset.checkpoint.interval.ms", "int", 60_000, _MIN0,
     "See log.flush.offset.checkpoint.interval.ms: both checkpoints go together."),
    ("producer.id.expiration.ms", "int", 86_400_000, _MIN1, "How long a partition keeps a "
     "producer's state (epoch, sequence, last batch) after that producer's last batch "
     "timestamp, unless it has an open transaction. It is checked every "
     "producer.id.expiration.check.interval.ms and when a log opens."),
    ("producer.id.expiration.check.interval.ms", "int", 600_000, _MIN1,
     "Period of removing expired producer ids from every partition's producer state, in "
     "LogStore.tick() (which start_services() runs in the background)."),
    ("num.recovery.threads.per.data.dir", "int", 1, _MIN1,
     "Threads that open and recover a writable store's logs after an unclean shutdown (after a "
     "clean one each log loads at its first use), and flush and close them when it closes, as "
     "Kafka's per-log-dir pool does (a store is one log dir). The work is file I/O and CRC "
     "checks that run outside the GIL, so a few threads overlap them."),
    ("log.roll.ms", "long", None, _MIN1, "Default segment.ms; wins over log.roll.hours.",
     "segment.ms"),
    ("log.roll.hours", "int", 168, _MIN1, "Default segment.ms in hours.", "segment.ms"),
    ("log.roll.jitter.ms", "long", None, _MIN0,
     "Default segment.jitter.ms; wins over log.roll.jitter.hours.", "segment.jitter.ms"),
    ("log.roll.jitter.hours", "int", 0, _MIN0, "Default segment.jitter.ms in hours.",
     "segment.jitter.ms"),
    ("log.retention.ms", "long", None, None, "Default retention.ms (negative: forever; 0 is "
     "rejected); wins over log.retention.minutes and log.retention.hours.", "retention.ms"),
    ("log.retention.minutes", "int", None, None,
     "Default retention.ms in minutes; wins over log.retention.hours.", "retention.ms"),
    ("log.retention.hours", "int", 168, None, "Default retention.ms in hours.", "retention.ms"),
    ("log.flush.interval.ms", "long", None, _MIN0,
     "Default flush.ms; when unset, log.flush.scheduler.interval.ms is used.", "flush.ms"),
]]
_SYNONYM_KEYS = {k.name for k in _STORE_KEYS if k.topic_name}
# The other broker names of topic keys share the topic key's type, default and validator.
_STORE_KEYS += [
    dataclasses.replace(k, name=k.kafka_name, kafka_name=None, scope="store", topic_name=k.name,
                        doc=f"Default {k.name}. {k.doc}")
    for k in _TOPIC_KEYS if k.kafka_name and k.kafka_name not in _SYNONYM_KEYS]
STORE_CONFIG_KEYS: dict[str, ConfigKey] = {k.name: k for k in _STORE_KEYS}
"""Store-wide keys (Kafka broker names), by name, with Kafka's defaults."""

_REPLICATION = "segstore keeps one local copy of each partition; there is no replication"
_TIERED = "segstore has no tiered (remote) storage"
_TIMESTAMPS = "segstore does not check record timestamps against the clock"
_DOWNCONVERSION = "segstore serves no fetch protocol to old clients (removed in Kafka 4.0)"
_FORMAT = "segstore always writes record batch v2 (removed in Kafka 4.0)"
_ONE_DIR = "a store has one root directory, given to segstore.open()"
_TOPIC_UNSUPPORTED = {
    **dict.fromkeys(("min.insync.replicas", "unclean.leader.election.enable",
                     "leader.replication.throttled.replicas",
                     "follower.replication.throttled.replicas"), _REPLICATION),
    **dict.fromkeys(("remote.storage.enable", "local.retention.ms", "local.retention.bytes",
                     "remote.log.copy.disable", "remote.log.delete.on.disable",
                     "remote.copy.lag.ms", "remote.copy.lag.bytes"), _TIERED),
    **dict.fromkeys(("message.timestamp.difference.max.ms", "message.timestamp.before.max.ms",
                     "message.timestamp.after.max.ms"), _TIMESTAMPS),
    "message.downconversion.enable": _DOWNCONVERSION, "message.format.version": _FORMAT,
    "internal.segment.bytes": "it is Kafka's test-only override; segment.bytes accepts 14 bytes",
}
_STORE_UNSUPPORTED = {
    **dict.fromkeys(("default.replication.factor", "min.insync.replicas",
                     "unclean.leader.election.enable"), _REPLICATION),
    **dict.fromkeys(("remote.log.storage.system.enable", "log.local.retention.ms",
                     "log.local.retention.bytes"), _TIERED),
    **dict.fromkeys(("log.message.timestamp.difference.max.ms",
                     "log.message.timestamp.before.max.ms",
                     "log.message.timestamp.after.max.ms"), _TIMESTAMPS),
    "log.message.downconversion.enable": _DOWNCONVERSION, "log.message.format.version": _FORMAT,
    "log.dirs": _ONE_DIR, "log.dir": _ONE_DIR, "log.dir.failure.timeout.ms": _ONE_DIR,
    "num.partitions": "pass num_partitions to create_topic()",
    "auto.create.topics.enable": "segstore never creates topics implicitly",
}


def _check_name(name, scope: str) -> ConfigKey:
    """Return the ConfigKey of ``name`` in ``scope``, or raise an InvalidConfigError that says
    why it is rejected and, when it can, what was meant."""
    keys, unsupported, other = ((TOPIC_CONFIG_KEYS, _TOPIC_UNSUPPORTED, STORE_CONFIG_KEYS)
                                if scope == "topic" else
                                (STORE_CONFIG_KEYS, _STORE_UNSUPPORTED, TOPIC_CONFIG_KEYS))
    if not isinstance(name, str):
        raise InvalidConfigError(f"Configuration names must be strings, got {name!r}")
    if name in keys:
        return keys[name]
    reason = unsupported.get(name) or (
        "it is a Confluent Platform extension" if name.startswith("confluent.") else None)
    if reason:
        raise InvalidConfigError(
            f"'{name}' is a Kafka configuration segstore does not implement: {reason}")
    if name in other:
        peer = other[name].topic_name if scope == "topic" else other[name].kafka_name
        kind, peer_kind = ("store-wide", "topic") if scope == "topic" else ("topic", "store-wide")
        hint = f"it is a {kind} setting" + (f"; the {peer_kind} name is '{peer}'" if peer else "")
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
        raise InvalidConfigError(f"Invalid configuration: {min_name} ({values[min_name]}) must "
                                 f"not be greater than {max_name} ({values[max_name]})")


class _Config(Mapping):
    """Shared machinery: an immutable, validated mapping of every key of one scope."""

    __slots__ = ("_overrides", "_values", "_defaults")
    _SCOPE = "topic"

    def _init(self, overrides, defaults: dict[str, Any]) -> None:
        self._overrides = _parse_all(overrides, self._SCOPE)
        self._defaults = defaults
        self._values = {**defaults, **self._overrides}
        self._validate()

    def _validate(self) -> None:
        """Cross-key rules (per subclass)."""

    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any] | None = None, **kwargs):
        """Build a config from explicitly set keys (``TopicConfig`` also takes ``defaults=``)."""
        return cls(overrides, **kwargs)

    @classmethod
    def from_properties(cls, text: str, **kwargs):
        """Build a config from Java-properties text, as written by :meth:`to_properties`."""
        return cls(parse_properties(text), **kwargs)

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
        """The explicitly set keys with their parsed values (a copy)."""
        return dict(self._overrides)

    @property
    def defaults(self) -> dict[str, Any]:
        """The value each key takes when not overridden (a copy)."""
        return dict(self._defaults)

    def to_dict(self) -> dict[str, Any]:
        """Every key with its effective value (lists as tuples)."""
        return dict(self._values)

    def with_updates(self, changes: Mapping[str, Any] | None = None,
                     deletions: Iterable[str] = ()):
        """A new, validated config with ``changes`` set and the ``deletions`` overrides removed
        (back to the default), like ``kafka-configs --alter --add-config/--delete-config``."""
        changes = dict(changes or {})
        deletions = [deletions] if isinstance(deletions, str) else list(deletions)
        for name in deletions:
            _check_name(name, self._SCOPE)
        both = sorted(set(changes) & set(deletions))
        if both:
            raise InvalidConfigError(f"Configuration {both[0]} is both set and deleted")
        new = object.__new__(type(self))
        new._init({**{k: v for k, v in self._overrides.items() if k not in deletions}, **changes},
                  self._defaults)
        return new

    def to_properties(self) -> str:
        """The overrides as Java-properties text: ``key=value`` lines sorted by key."""
        return "".join(f"{_escape(k)}={_escape(_format(v))}\n"
                       for k, v in sorted(self._overrides.items()))


def _attr(name: str) -> property:
    return property(lambda self: self._values[name], doc=f"The value of ``{name}``.")


class TopicConfig(_Config):
    """The validated configuration of one topic: an immutable mapping of every topic key.

    ``defaults`` are the store-wide defaults: a :class:`StoreConfig`, a mapping of topic keys
    (missing keys take Kafka's defaults) or ``None`` (Kafka's defaults).
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

    def _validate(self) -> None:
        _check_lag(self._values, "min.compaction.lag.ms", "max.compaction.lag.ms")
        if self.compaction_strategy == "header" and not self.compaction_strategy_header:
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

    def compression_level(self, codec: int):
        """The ``compression.<codec>.level`` for a codec id (None: the codec's default)."""
        key = {1: "compression.gzip.level", 3: "compression.lz4.level",
               4: "compression.zstd.level"}.get(codec)
        level = None if key is None else self._values[key]
        return None if level == -1 and codec == 1 else level
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

    def topic_defaults(self) -> dict[str, Any]:
        """Every topic key's default under this store config (a copy)."""
        return dict(self._topic_defaults)

    def _validate(self) -> None:
        v = self._values
        _check_lag(v, "log.cleaner.min.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms")
        threads = v["log.cleaner.threads"]
        if threads and v["log.cleaner.dedupe.buffer.size"] // threads < 24:
            raise InvalidConfigError(
                "Invalid configuration: log.cleaner.dedupe.buffer.size must give each of the "
                f"{threads} cleaner threads at least 24 bytes (one offset map slot)")
        topic = {k.topic_name: v[k.name] for k in _STORE_KEYS
                 if k.topic_name and k.name not in _SYNONYM_KEYS}
        # Kafka's precedence among unit synonyms: ms > minutes > hours.
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
        self._topic_defaults = TopicConfig(None, topic).to_dict()  # validates the derived values

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
    flush_start_offset_checkpoint_interval_ms = _attr(
        "log.flush.start.offset.checkpoint.interval.ms")
    num_recovery_threads_per_data_dir = _attr("num.recovery.threads.per.data.dir")
    producer_id_expiration_ms = _attr("producer.id.expiration.ms")
    producer_id_expiration_check_interval_ms = _attr("producer.id.expiration.check.interval.ms")


def _first(*values):
    return next(v for v in values if v is not None)


def _mul(value, factor):
    return None if value is None else value * factor


def describe_keys(scope: str | None = None) -> list[ConfigKey]:
    """Every ConfigKey, topic keys first, or only those of ``scope`` ("topic" or "store")."""
    return [k for k in _TOPIC_KEYS + _STORE_KEYS if scope is None or k.scope == scope]
