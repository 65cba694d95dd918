"""Tests for segstore.config: Kafka's defaults (REF §6.15), parsing, every rejection path,
store-wide defaults flowing into topic configs, alter-config updates and the properties format."""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segstore.config import (STORE_CONFIG_KEYS, TOPIC_CONFIG_KEYS, ConfigKey, OneOf, Range,
                             StoreConfig, TopicConfig, describe_keys, parse_properties)
from segstore.errors import InvalidConfigError, SegstoreError

LONG_MAX = 9_223_372_036_854_775_807
INT_MAX = 2_147_483_647
JAVA_WS = "".join(map(chr, range(33)))

# REF §6.15, written out by hand: topic key -> (Kafka default, broker property of its default).
KAFKA_TOPIC_DEFAULTS = {
    "cleanup.policy": (("delete",), "log.cleanup.policy"),
    "segment.bytes": (1_073_741_824, "log.segment.bytes"),
    "segment.ms": (604_800_000, "log.roll.ms"),
    "segment.jitter.ms": (0, "log.roll.jitter.ms"),
    "segment.index.bytes": (10_485_760, "log.index.size.max.bytes"),
    "index.interval.bytes": (4096, "log.index.interval.bytes"),
    "max.message.bytes": (1_048_588, "message.max.bytes"),
    "flush.messages": (LONG_MAX, "log.flush.interval.messages"),
    "flush.ms": (LONG_MAX, "log.flush.interval.ms"),
    "retention.ms": (604_800_000, "log.retention.ms"),
    "retention.bytes": (-1, "log.retention.bytes"),
    "file.delete.delay.ms": (60_000, "log.segment.delete.delay.ms"),
    "preallocate": (False, "log.preallocate"),
    "message.timestamp.type": ("CreateTime", "log.message.timestamp.type"),
    "min.cleanable.dirty.ratio": (0.5, "log.cleaner.min.cleanable.ratio"),
    "delete.retention.ms": (86_400_000, "log.cleaner.delete.retention.ms"),
    "min.compaction.lag.ms": (0, "log.cleaner.min.compaction.lag.ms"),
    "max.compaction.lag.ms": (LONG_MAX, "log.cleaner.max.compaction.lag.ms"),
    "compression.type": ("producer", "compression.type"),
    # KIP-390 levels (Kafka 3.8+), same names at broker and topic level.
    "compression.gzip.level": (-1, "compression.gzip.level"),
    "compression.lz4.level": (9, "compression.lz4.level"),
    "compression.zstd.level": (3, "compression.zstd.level"),
    # segstore extensions (KIP-280): no broker name.
    "compaction.strategy": ("offset", None),
    "compaction.strategy.header": ("", None),
}

KAFKA_STORE_DEFAULTS = {
    "log.cleaner.enable": True,
    "log.cleaner.threads": 1,
    "log.cleaner.dedupe.buffer.size": 134_217_728,
    "log.cleaner.io.buffer.size": 524_288,
    "log.cleaner.io.buffer.load.factor": 0.9,
    "log.cleaner.io.max.bytes.per.second": 1.7976931348623157e308,
    "log.cleaner.backoff.ms": 15_000,
    "log.retention.check.interval.ms": 300_000,
    "log.flush.scheduler.interval.ms": LONG_MAX,
    "log.flush.offset.checkpoint.interval.ms": 60_000,
    "log.flush.start.offset.checkpoint.interval.ms": 60_000,
    "num.recovery.threads.per.data.dir": 1,
    "producer.id.expiration.ms": 86_400_000,  # TransactionLogConfig / ProducerStateManagerConfig
    "producer.id.expiration.check.interval.ms": 600_000,
    "log.roll.ms": None, "log.roll.hours": 168,
    "log.roll.jitter.ms": None, "log.roll.jitter.hours": 0,
    "log.retention.ms": None, "log.retention.minutes": None, "log.retention.hours": 168,
    "log.flush.interval.ms": None,
    "log.cleanup.policy": ("delete",),
    "log.segment.bytes": 1_073_741_824,
    "log.index.size.max.bytes": 10_485_760,
    "log.index.interval.bytes": 4096,
    "message.max.bytes": 1_048_588,
    "log.flush.interval.messages": LONG_MAX,
    "log.retention.bytes": -1,
    "log.segment.delete.delay.ms": 60_000,
    "log.preallocate": False,
    "log.cleaner.min.cleanable.ratio": 0.5,
    "log.cleaner.delete.retention.ms": 86_400_000,
    "log.cleaner.min.compaction.lag.ms": 0,
    "log.cleaner.max.compaction.lag.ms": LONG_MAX,
    "log.message.timestamp.type": "CreateTime",
    "compression.type": "producer",
    "compression.gzip.level": -1, "compression.lz4.level": 9, "compression.zstd.level": 3,
}


def raises(match: str):
    """pytest.raises(InvalidConfigError) matching ``match`` literally."""
    return pytest.raises(InvalidConfigError, match=re.escape(match))


# --- defaults ------------------------------------------------------------------------------------

def test_topic_defaults_are_kafkas():
    cfg = TopicConfig()
    assert set(cfg) == set(KAFKA_TOPIC_DEFAULTS) == set(TOPIC_CONFIG_KEYS)
    for name, (default, broker) in KAFKA_TOPIC_DEFAULTS.items():
        assert cfg[name] == default, name
        assert type(cfg[name]) is type(default), name
        assert TOPIC_CONFIG_KEYS[name].kafka_name == broker, name
    assert cfg.overrides == {}
    assert cfg.compact is False and cfg.delete is True


def test_store_defaults_are_kafkas():
    cfg = StoreConfig()
    assert cfg.to_dict() == KAFKA_STORE_DEFAULTS
    assert set(STORE_CONFIG_KEYS) == set(KAFKA_STORE_DEFAULTS)
    assert cfg.topic_defaults() == TopicConfig().to_dict()


def test_attribute_properties_match_keys():
    cfg = TopicConfig({"cleanup.policy": "compact", "segment.bytes": 1000})
    for name in KAFKA_TOPIC_DEFAULTS:
        if name.startswith("compression.") and name.endswith(".level"):
            continue
        assert getattr(cfg, name.replace(".", "_")) == cfg[name], name
    store = StoreConfig({"log.cleaner.threads": 3})
    assert store.cleaner_threads == 3
    assert store.cleaner_enable is True
    assert store.cleaner_dedupe_buffer_size == 134_217_728
    assert store.cleaner_io_buffer_size == 524_288
    assert store.cleaner_io_buffer_load_factor == 0.9
    assert store.cleaner_io_max_bytes_per_second == 1.7976931348623157e308
    assert store.cleaner_backoff_ms == 15_000
    assert store.retention_check_interval_ms == 300_000
    assert store.flush_scheduler_interval_ms == LONG_MAX
    assert store.flush_offset_checkpoint_interval_ms == 60_000
    assert store.flush_start_offset_checkpoint_interval_ms == 60_000
    assert store.num_recovery_threads_per_data_dir == 1
    assert store.producer_id_expiration_ms == 86_400_000
    assert store.producer_id_expiration_check_interval_ms == 600_000


def test_describe_keys():
    keys = describe_keys()
    assert [k.name for k in keys] == list(TOPIC_CONFIG_KEYS) + list(STORE_CONFIG_KEYS)
    assert describe_keys("topic") == list(TOPIC_CONFIG_KEYS.values())
    assert describe_keys("store") == list(STORE_CONFIG_KEYS.values())
    for key in keys:
        assert isinstance(key, ConfigKey)
        assert key.type in {"int", "long", "double", "boolean", "string", "list", "class"}
        assert key.scope in {"topic", "store"}
        assert key.doc and key.doc.endswith((".", ")")), key.name
        assert key.parse(key.default) == key.default  # every default passes its own rules
        assert key.validator is None or isinstance(key.validator, (Range, OneOf))
        if key.scope == "topic" and key.kafka_name:
            assert STORE_CONFIG_KEYS[key.kafka_name].topic_name == key.name
        if key.scope == "store" and key.topic_name:
            assert key.topic_name in TOPIC_CONFIG_KEYS
    assert str(TOPIC_CONFIG_KEYS["segment.bytes"].validator) == "[14,...]"
    assert str(TOPIC_CONFIG_KEYS["min.cleanable.dirty.ratio"].validator) == "[0,...,1]"
    assert str(TOPIC_CONFIG_KEYS["compression.gzip.level"].validator) == "[1,...,9] or -1"
    assert str(STORE_CONFIG_KEYS["log.cleaner.io.buffer.load.factor"].validator) == "(0,...,1]"
    assert str(TOPIC_CONFIG_KEYS["cleanup.policy"].validator) == "[compact, delete]"


# --- parsing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, given_value, expected", [
    ("segment.bytes", "1073741824", 1_073_741_824),
    ("segment.bytes", " 1000 ", 1000),
    ("segment.bytes", "+1000", 1000),
    ("segment.bytes", 1000.0, 1000),
    ("segment.bytes", np.int64(1000), 1000),
    ("segment.bytes", str(INT_MAX), INT_MAX),
    ("flush.messages", str(LONG_MAX), LONG_MAX),
    ("retention.ms", "-1", -1),
    ("retention.bytes", str(-2**63), -2**63),
    ("preallocate", "true", True),
    ("preallocate", "TRUE", True),
    ("preallocate", " False ", False),
    ("preallocate", True, True),
    ("min.cleanable.dirty.ratio", "0.5", 0.5),
    ("min.cleanable.dirty.ratio", "1", 1.0),
    ("min.cleanable.dirty.ratio", 0, 0.0),
    ("min.cleanable.dirty.ratio", np.float32(0.25), 0.25),
    ("cleanup.policy", "compact,delete", ("compact", "delete")),
    ("cleanup.policy", " compact , delete ", ("compact", "delete")),
    ("cleanup.policy", "delete,compact", ("delete", "compact")),
    ("cleanup.policy", ["compact"], ("compact",)),
    ("cleanup.policy", ("delete", "delete"), ("delete",)),
    ("cleanup.policy", "", ()),
    ("cleanup.policy", [], ()),
    ("message.timestamp.type", " LogAppendTime ", "LogAppendTime"),
    ("compression.type", "zstd", "zstd"),
    ("compression.gzip.level", "-1", -1),
    ("compression.zstd.level", "-131072", -131072),
    ("compaction.strategy", "timestamp", "timestamp"),
])
def test_parse_values(name, given_value, expected):
    cfg = TopicConfig({name: given_value})
    assert cfg[name] == expected
    assert type(cfg[name]) is type(expected)
    assert cfg.overrides == {name: expected}


def test_store_parse_values():
    cfg = StoreConfig({"log.cleaner.enable": "false", "log.cleaner.threads": "4",
                       "log.cleaner.io.max.bytes.per.second": "1e6",
                       "log.cleaner.io.buffer.load.factor": "1"})
    assert cfg["log.cleaner.enable"] is False
    assert cfg["log.cleaner.threads"] == 4
    assert cfg["log.cleaner.io.max.bytes.per.second"] == 1e6
    assert cfg["log.cleaner.io.buffer.load.factor"] == 1.0
    assert StoreConfig({"log.cleaner.io.max.bytes.per.second": "1.7976931348623157E308"}) \
        == StoreConfig()
    assert StoreConfig({"log.retention.ms": None})["log.retention.ms"] is None


def test_cleanup_policy_flags():
    assert (TopicConfig({"cleanup.policy": "compact"}).compact,
            TopicConfig({"cleanup.policy": "compact"}).delete) == (True, False)
    both = TopicConfig({"cleanup.policy": "compact,delete"})
    assert both.compact and both.delete and both.cleanup_policy == ("compact", "delete")
    empty = TopicConfig({"cleanup.policy": ""})
    assert not empty.compact and not empty.delete and empty.cleanup_policy == ()


# --- rejections ----------------------------------------------------------------------------------

def test_error_hierarchy():
    with pytest.raises(ValueError):
        TopicConfig({"segment.bytes": -5})
    with pytest.raises(SegstoreError):
        TopicConfig({"segment.bytes": -5})


def test_out_of_range_message_is_kafkas():
    with raises("Invalid value -5 for configuration segment.bytes: Value must be at least 14"):
        TopicConfig({"segment.bytes": -5})
    with raises("Invalid value -5 for configuration segment.bytes: Value must be at least 14"):
        TopicConfig({"segment.bytes": "-5"})


@pytest.mark.parametrize("name, bad, lowest_ok", [
    ("segment.bytes", 13, 14), ("segment.ms", 0, 1), ("segment.jitter.ms", -1, 0),
    ("segment.index.bytes", 3, 4), ("index.interval.bytes", -1, 0),
    ("max.message.bytes", -1, 0), ("flush.messages", 0, 1), ("flush.ms", -1, 0),
    ("retention.ms", -2, -1), ("file.delete.delay.ms", -1, 0),
    ("delete.retention.ms", -1, 0), ("min.compaction.lag.ms", -1, 0),
    ("max.compaction.lag.ms", 0, 1), ("min.cleanable.dirty.ratio", -0.1, 0.0),
    ("compression.lz4.level", 0, 1), ("compression.zstd.level", -131073, -131072),
])
def test_minimums(name, bad, lowest_ok):
    assert TopicConfig({name: lowest_ok})[name] == lowest_ok
    with raises(f"Invalid value {bad} for configuration {name}: Value must be at least"):
        TopicConfig({name: bad})


@pytest.mark.parametrize("name, bad, message", [
    ("min.cleanable.dirty.ratio", 1.5, "Value must be no more than 1"),
    ("compression.lz4.level", 18, "Value must be no more than 17"),
    ("compression.zstd.level", 23, "Value must be no more than 22"),
    ("compression.gzip.level", 0, "Value must be in [1,...,9] or -1"),
    ("compression.gzip.level", 10, "Value must be in [1,...,9] or -1"),
])
def test_maximums_and_gaps(name, bad, message):
    with raises(f"Invalid value {bad} for configuration {name}: {message}"):
        TopicConfig({name: bad})


@pytest.mark.parametrize("name, bad, message", [
    ("segment.bytes", 1.5, "Invalid value 1.5 for configuration segment.bytes: "
                           "Not a number of type INT"),
    ("segment.bytes", True, "Invalid value True for configuration segment.bytes: "
                            "Not a number of type INT"),
    ("segment.bytes", "1.0", "Not a number of type INT"),
    ("segment.bytes", "1_000", "Not a number of type INT"),
    ("segment.bytes", "abc", "Invalid value abc for configuration segment.bytes"),
    ("segment.bytes", "", "Not a number of type INT"),
    ("segment.bytes", INT_MAX + 1, "Not a number of type INT"),
    ("segment.bytes", None, "Invalid value None for configuration segment.bytes"),
    ("segment.bytes", [1], "Not a number of type INT"),
    ("retention.ms", LONG_MAX + 1, "Not a number of type LONG"),
    ("retention.ms", str(LONG_MAX + 1), "Not a number of type LONG"),
    ("retention.ms", 1e300, "Not a number of type LONG"),
    ("preallocate", "yes", "Invalid value yes for configuration preallocate: "
                           "Expected value to be either true or false"),
    ("preallocate", 1, "Expected value to be either true or false"),
    ("preallocate", None, "Expected value to be either true or false"),
    ("min.cleanable.dirty.ratio", "half", "Not a number of type DOUBLE"),
    ("min.cleanable.dirty.ratio", math.nan, "Not a number of type DOUBLE"),
    ("min.cleanable.dirty.ratio", "NaN", "Not a number of type DOUBLE"),
    ("min.cleanable.dirty.ratio", False, "Not a number of type DOUBLE"),
    ("cleanup.policy", 5, "Expected a comma-separated string or a list of strings"),
    ("cleanup.policy", ["compact", 1], "Expected a comma-separated string or a list of strings"),
    ("cleanup.policy", "compact,foo", "Invalid value compact,foo for configuration "
                                      "cleanup.policy: String must be one of: compact, delete"),
    ("cleanup.policy", "compact,", "String must be one of: compact, delete"),
    ("cleanup.policy", "Compact", "String must be one of: compact, delete"),
    ("message.timestamp.type", "createtime", "Invalid value createtime for configuration "
     "message.timestamp.type: String must be one of: CreateTime, LogAppendTime"),
    ("compression.type", "none", "String must be one of: uncompressed, zstd, lz4, snappy, gzip, "
                                 "producer"),
    ("compaction.strategy", "latest", "String must be one of: offset, timestamp, header"),
    ("compaction.strategy.header", 5, "Invalid value 5 for configuration "
                                      "compaction.strategy.header: Expected value to be a string"),
])
def test_bad_values(name, bad, message):
    with raises(message):
        TopicConfig({name: bad})


@pytest.mark.parametrize("name, bad, message", [
    ("log.cleaner.enable", "on", "Expected value to be either true or false"),
    ("log.cleaner.threads", -1, "Value must be at least 0"),
    ("log.cleaner.dedupe.buffer.size", 23, "Value must be at least 24"),
    ("log.cleaner.io.buffer.load.factor", 0, "Value must be greater than 0"),
    ("log.cleaner.io.buffer.load.factor", 1.01, "Value must be no more than 1"),
    ("log.cleaner.io.max.bytes.per.second", 0, "Value must be greater than 0"),
    ("log.retention.check.interval.ms", 0, "Value must be at least 1"),
    ("num.recovery.threads.per.data.dir", 0, "Value must be at least 1"),
    ("log.roll.hours", 0, "Value must be at least 1"),
    ("log.roll.ms", 0, "Value must be at least 1"),
    ("log.segment.bytes", 13, "Invalid value 13 for configuration log.segment.bytes: "
                              "Value must be at least 14"),
    ("log.cleanup.policy", "purge", "String must be one of: compact, delete"),
    ("log.retention.hours", 1.5, "Not a number of type INT"),
])
def test_bad_store_values(name, bad, message):
    with raises(message):
        StoreConfig({name: bad})


def test_unknown_keys():
    with raises("Unknown configuration 'segment.byte'; did you mean 'segment.bytes'?"):
        TopicConfig({"segment.byte": 1})
    with raises("Unknown configuration 'retention.msec'; did you mean 'retention.ms'?"):
        TopicConfig({"retention.msec": 1})
    with raises("Unknown configuration 'log.cleaner.thread'; did you mean 'log.cleaner.threads'?"):
        StoreConfig({"log.cleaner.thread": 1})
    with pytest.raises(InvalidConfigError) as info:
        TopicConfig({"zzzzz": 1})
    assert str(info.value) == "Unknown configuration 'zzzzz'"
    with raises("Configuration names must be strings, got 5"):
        TopicConfig({5: 1})
    with raises("Configuration must be a mapping, got list"):
        TopicConfig([("segment.bytes", 1)])


def test_keys_of_the_other_scope_get_a_hint():
    with raises("Unknown configuration 'log.segment.bytes'; it is a store-wide setting; "
                "the topic name is 'segment.bytes'"):
        TopicConfig({"log.segment.bytes": 1000})
    with raises("Unknown configuration 'log.retention.hours'; it is a store-wide setting; "
                "the topic name is 'retention.ms'"):
        TopicConfig({"log.retention.hours": 1})
    with raises("Unknown configuration 'log.cleaner.threads'; it is a store-wide setting"):
        TopicConfig({"log.cleaner.threads": 1})
    with raises("Unknown configuration 'segment.bytes'; it is a topic setting; "
                "the store-wide name is 'log.segment.bytes'"):
        StoreConfig({"segment.bytes": 1000})
    with raises("Unknown configuration 'compaction.strategy'; it is a topic setting"):
        StoreConfig({"compaction.strategy": "offset"})


@pytest.mark.parametrize("name", [
    "min.insync.replicas", "unclean.leader.election.enable", "message.downconversion.enable",
    "follower.replication.throttled.replicas", "leader.replication.throttled.replicas",
    "remote.storage.enable", "local.retention.ms", "local.retention.bytes",
    "message.timestamp.difference.max.ms", "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms", "message.format.version", "internal.segment.bytes",
    "confluent.placement.constraints", "confluent.tier.enable",
])
def test_unsupported_topic_keys(name):
    with pytest.raises(InvalidConfigError) as info:
        TopicConfig({name: "1"})
    message = str(info.value)
    assert message.startswith(f"'{name}' is a Kafka configuration segstore does not implement: ")
    assert len(message.split(": ", 1)[1]) > 10  # says why


@pytest.mark.parametrize("name", [
    "log.dirs", "log.dir", "num.partitions", "default.replication.factor", "min.insync.replicas",
    "auto.create.topics.enable", "log.message.timestamp.difference.max.ms",
    "remote.log.storage.system.enable", "log.message.downconversion.enable",
    "confluent.balancer.enable",
])
def test_unsupported_store_keys(name):
    with raises(f"'{name}' is a Kafka configuration segstore does not implement: "):
        StoreConfig({name: "1"})


# --- cross-key rules -----------------------------------------------------------------------------

def test_compaction_lag_order():
    equal = TopicConfig({"min.compaction.lag.ms": 5, "max.compaction.lag.ms": 5})
    assert equal.min_compaction_lag_ms == equal.max_compaction_lag_ms == 5
    with raises("min.compaction.lag.ms (10) must not be greater than max.compaction.lag.ms (5)"):
        TopicConfig({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5})
    # Checked against the effective values, store defaults included.
    store = StoreConfig({"log.cleaner.max.compaction.lag.ms": 100})
    with raises("min.compaction.lag.ms (200) must not be greater than max.compaction.lag.ms (100)"):
        TopicConfig({"min.compaction.lag.ms": 200}, defaults=store)
    with raises("log.cleaner.min.compaction.lag.ms (200) must not be greater than "
                "log.cleaner.max.compaction.lag.ms (100)"):
        StoreConfig({"log.cleaner.min.compaction.lag.ms": 200,
                     "log.cleaner.max.compaction.lag.ms": 100})


def test_header_strategy_needs_a_header():
    with raises("compaction.strategy=header needs compaction.strategy.header"):
        TopicConfig({"compaction.strategy": "header"})
    with raises("compaction.strategy=header needs compaction.strategy.header"):
        TopicConfig({"compaction.strategy": "header", "compaction.strategy.header": "   "})
    cfg = TopicConfig({"compaction.strategy": "header", "compaction.strategy.header": " version "})
    assert (cfg.compaction_strategy, cfg.compaction_strategy_header) == ("header", "version")
    with raises("compaction.strategy=header needs compaction.strategy.header"):
        cfg.with_updates(deletions=["compaction.strategy.header"])
    assert cfg.with_updates(deletions=["compaction.strategy"]).compaction_strategy == "offset"


def test_store_cross_rules():
    assert StoreConfig({"log.cleaner.dedupe.buffer.size": 48, "log.cleaner.threads": 2})
    with raises("log.cleaner.dedupe.buffer.size must give each of the 2 cleaner threads at "
                "least 24 bytes"):
        StoreConfig({"log.cleaner.dedupe.buffer.size": 47, "log.cleaner.threads": 2})
    assert StoreConfig({"log.cleaner.dedupe.buffer.size": 24, "log.cleaner.threads": 0})
    for retention in ({"log.retention.ms": 0}, {"log.retention.minutes": 0},
                      {"log.retention.hours": 0}):
        with raises("must be unlimited (negative) or at least 1 ms, got 0"):
            StoreConfig(retention)


# --- store-wide defaults flowing into topics -----------------------------------------------------

def test_broker_names_set_topic_defaults():
    store = StoreConfig({
        "log.segment.bytes": "1000", "log.index.size.max.bytes": 4096,
        "log.index.interval.bytes": 100, "message.max.bytes": 500,
        "log.flush.interval.messages": 10, "log.retention.bytes": 1 << 20,
        "log.segment.delete.delay.ms": 0, "log.preallocate": "true",
        "log.cleanup.policy": "compact", "log.cleaner.min.cleanable.ratio": "0.1",
        "log.cleaner.delete.retention.ms": 5, "log.cleaner.min.compaction.lag.ms": 6,
        "log.cleaner.max.compaction.lag.ms": 7, "log.message.timestamp.type": "LogAppendTime",
        "compression.type": "lz4", "compression.lz4.level": 12,
    })
    expected = {
        "segment.bytes": 1000, "segment.index.bytes": 4096, "index.interval.bytes": 100,
        "max.message.bytes": 500, "flush.messages": 10, "retention.bytes": 1 << 20,
        "file.delete.delay.ms": 0, "preallocate": True, "cleanup.policy": ("compact",),
        "min.cleanable.dirty.ratio": 0.1, "delete.retention.ms": 5, "min.compaction.lag.ms": 6,
        "max.compaction.lag.ms": 7, "message.timestamp.type": "LogAppendTime",
        "compression.type": "lz4", "compression.lz4.level": 12,
    }
    defaults = store.topic_defaults()
    for name, value in expected.items():
        assert defaults[name] == value, name
    topic = TopicConfig({"segment.bytes": 2000}, defaults=store)
    assert topic.segment_bytes == 2000  # the override wins
    assert topic.overrides == {"segment.bytes": 2000}
    for name, value in expected.items():
        if name != "segment.bytes":
            assert topic[name] == value, name
    assert topic.compact and not topic.delete
    # A plain mapping of topic keys works as defaults too; missing keys keep Kafka's defaults.
    partial = TopicConfig(defaults={"retention.ms": "5"})
    assert partial.retention_ms == 5 and partial.segment_bytes == 1_073_741_824
    with raises("Unknown configuration 'log.retention.ms'"):
        TopicConfig(defaults={"log.retention.ms": 5})


@pytest.mark.parametrize("settings, retention_ms", [
    ({}, 604_800_000),
    ({"log.retention.hours": 1}, 3_600_000),
    ({"log.retention.minutes": 2}, 120_000),
    ({"log.retention.minutes": 2, "log.retention.hours": 1}, 120_000),
    ({"log.retention.ms": 5, "log.retention.minutes": 2, "log.retention.hours": 1}, 5),
    ({"log.retention.ms": -1}, -1),
    ({"log.retention.ms": -5}, -1),
    ({"log.retention.hours": -1}, -1),
])
def test_retention_unit_precedence(settings, retention_ms):
    assert StoreConfig(settings).topic_defaults()["retention.ms"] == retention_ms
    assert TopicConfig(defaults=StoreConfig(settings)).retention_ms == retention_ms


def test_roll_and_flush_synonyms():
    assert StoreConfig({"log.roll.hours": 1}).topic_defaults()["segment.ms"] == 3_600_000
    assert StoreConfig({"log.roll.hours": 1, "log.roll.ms": 7}).topic_defaults()["segment.ms"] == 7
    jitter = StoreConfig({"log.roll.jitter.hours": 2}).topic_defaults()["segment.jitter.ms"]
    assert jitter == 7_200_000
    assert StoreConfig({"log.roll.jitter.hours": 2, "log.roll.jitter.ms": 3}) \
        .topic_defaults()["segment.jitter.ms"] == 3
    # flush.ms: log.flush.interval.ms, else log.flush.scheduler.interval.ms.
    assert StoreConfig({"log.flush.scheduler.interval.ms": 1000}) \
        .topic_defaults()["flush.ms"] == 1000
    assert StoreConfig({"log.flush.scheduler.interval.ms": 1000, "log.flush.interval.ms": 50}) \
        .topic_defaults()["flush.ms"] == 50


# --- mapping behaviour, overrides, alter-config updates ------------------------------------------

def test_mapping_behaviour_and_immutability():
    cfg = TopicConfig({"segment.bytes": "1000"})
    assert cfg == TopicConfig({"segment.bytes": 1000})
    assert cfg != TopicConfig()
    assert len(cfg) == len(TOPIC_CONFIG_KEYS) and "segment.bytes" in cfg and "nope" not in cfg
    assert cfg.get("nope") is None and 5 not in cfg
    with pytest.raises(KeyError, match="did you mean 'segment.bytes'"):
        cfg["segment.byte"]
    with pytest.raises(TypeError):
        cfg["segment.bytes"] = 5
    with pytest.raises(AttributeError):
        cfg.segment_bytes = 5
    with pytest.raises(AttributeError):
        cfg.anything = 5
    cfg.overrides["segment.bytes"] = 5
    cfg.to_dict()["segment.bytes"] = 5
    assert cfg.segment_bytes == 1000
    assert repr(cfg) == "TopicConfig({'segment.bytes': 1000})"
    assert cfg.to_dict() == {**TopicConfig().to_dict(), "segment.bytes": 1000}


def test_pickles():  # Spark ships configs to executors
    cfg = TopicConfig({"segment.bytes": 100}, defaults=StoreConfig({"log.retention.hours": 2}))
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.overrides == cfg.overrides and back.retention_ms == 7_200_000
    store = StoreConfig({"log.cleaner.threads": 2})
    assert pickle.loads(pickle.dumps(store)).topic_defaults() == store.topic_defaults()


def test_from_dict():
    store = StoreConfig({"log.segment.bytes": 5000})
    cfg = TopicConfig.from_dict({"retention.ms": 10}, defaults=store)
    assert (cfg.retention_ms, cfg.segment_bytes) == (10, 5000)
    assert cfg.defaults == store.topic_defaults()
    assert StoreConfig.from_dict({"log.cleaner.threads": 2}).cleaner_threads == 2


def test_with_updates():
    store = StoreConfig({"log.retention.hours": 1})
    cfg = TopicConfig({"retention.ms": 10, "segment.bytes": 1000}, defaults=store)
    new = cfg.with_updates({"segment.ms": "20", "segment.bytes": 2000}, deletions=["retention.ms"])
    assert new.overrides == {"segment.bytes": 2000, "segment.ms": 20}
    assert new.retention_ms == 3_600_000  # back to the store default, not Kafka's
    assert cfg.overrides == {"retention.ms": 10, "segment.bytes": 1000}  # unchanged
    assert cfg.with_updates(deletions="retention.ms").overrides == {"segment.bytes": 1000}
    assert cfg.with_updates(deletions=["flush.ms"]) == cfg  # deleting an unset key: no-op
    with raises("Invalid value 5 for configuration segment.bytes"):
        cfg.with_updates({"segment.bytes": 5})
    with raises("Unknown configuration 'segment.byte'; did you mean 'segment.bytes'?"):
        cfg.with_updates(deletions=["segment.byte"])
    with raises("Unknown configuration 'segment.byte'"):
        cfg.with_updates({"segment.byte": 5})
    with raises("Configuration segment.bytes is both set and deleted"):
        cfg.with_updates({"segment.bytes": 100}, deletions=["segment.bytes"])
    with raises("min.compaction.lag.ms (9) must not be greater than max.compaction.lag.ms (8)"):
        cfg.with_updates({"max.compaction.lag.ms": 8, "min.compaction.lag.ms": 9})
    changed = StoreConfig({"log.cleaner.threads": 2}).with_updates(
        {"log.segment.bytes": 100}, deletions=["log.cleaner.threads"])
    assert isinstance(changed, StoreConfig)
    assert changed.overrides == {"log.segment.bytes": 100}
    assert changed.topic_defaults()["segment.bytes"] == 100


# --- properties text -----------------------------------------------------------------------------

def test_to_properties_format():
    cfg = TopicConfig({"segment.bytes": "1000", "cleanup.policy": ["compact", "delete"],
                       "preallocate": True, "min.cleanable.dirty.ratio": 0.25,
                       "compaction.strategy.header": "a=b: #c\x01\\d"})
    assert cfg.to_properties() == (
        "cleanup.policy=compact,delete\n"
        "compaction.strategy.header=a\\=b\\:\\ \\#c\\u0001\\\\d\n"
        "min.cleanable.dirty.ratio=0.25\n"
        "preallocate=true\n"
        "segment.bytes=1000\n")
    assert TopicConfig().to_properties() == ""
    assert TopicConfig({"cleanup.policy": ""}).to_properties() == "cleanup.policy=\n"
    back = TopicConfig.from_properties(cfg.to_properties())
    assert back.overrides == cfg.overrides and back == cfg
    assert TopicConfig.from_properties("cleanup.policy=\n").cleanup_policy == ()
    assert TopicConfig.from_properties("") == TopicConfig()


def test_from_properties_reads_java_syntax():
    text = ("# written by hand\r\n"
            "! also a comment \\\n"
            "   \n"
            "  segment.bytes = 1000\n"
            "retention.ms:5\r"
            "flush.ms\t\t7\n"
            "cleanup.policy=compact,\\\n"
            "    delete\n"
            "compaction.strategy.header=caf\\u00e9\\ \\tx\\\\ \\=\n"
            "compaction.strategy  =  header\n"
            "segment.ms=1\n"
            "segment.ms=2\n"
            "preallocate=TRUE\\")
    cfg = TopicConfig.from_properties(text)
    assert cfg.overrides == {
        "segment.bytes": 1000, "retention.ms": 5, "flush.ms": 7,
        "cleanup.policy": ("compact", "delete"), "compaction.strategy.header": "café \tx\\ =",
        "compaction.strategy": "header", "segment.ms": 2, "preallocate": True}
    assert parse_properties("a\\ b\\=c=d\\ud83d\\ude00") == {"a b=c": "d\U0001F600"}
    assert parse_properties("key") == {"key": ""}
    with raises("Malformed \\uxxxx encoding"):
        parse_properties("a=\\u12")
    with raises("Unknown configuration 'segment.byte'; did you mean 'segment.bytes'?"):
        TopicConfig.from_properties("segment.byte=5\n")
    with raises("Invalid value x for configuration segment.bytes"):
        TopicConfig.from_properties("segment.bytes=x\n")


def test_store_properties_round_trip():
    store = StoreConfig({"log.cleaner.threads": 2, "log.retention.minutes": 30,
                         "log.cleaner.io.max.bytes.per.second": 1.5e6,
                         "log.cleanup.policy": "compact,delete", "log.cleaner.enable": False})
    text = store.to_properties()
    assert "log.cleaner.enable=false\n" in text and "log.cleanup.policy=compact,delete\n" in text
    back = StoreConfig.from_properties(text)
    assert back.overrides == store.overrides and back.to_dict() == store.to_dict()
    assert back.topic_defaults() == store.topic_defaults()
    defaults = TopicConfig.from_properties("segment.bytes=100\n", defaults=back)
    assert defaults.retention_ms == 1_800_000 and defaults.segment_bytes == 100


# --- random valid configs through properties text ------------------------------------------------

I64 = (-2**63, LONG_MAX)
VALID_TOPIC_VALUES = {
    "cleanup.policy": st.lists(st.sampled_from(["compact", "delete"]), unique=True).map(tuple),
    "segment.bytes": st.integers(14, INT_MAX),
    "segment.ms": st.integers(1, LONG_MAX),
    "segment.jitter.ms": st.integers(0, LONG_MAX),
    "segment.index.bytes": st.integers(4, INT_MAX),
    "index.interval.bytes": st.integers(0, INT_MAX),
    "max.message.bytes": st.integers(0, INT_MAX),
    "flush.messages": st.integers(1, LONG_MAX),
    "flush.ms": st.integers(0, LONG_MAX),
    "retention.ms": st.integers(-1, LONG_MAX),
    "retention.bytes": st.integers(*I64),
    "file.delete.delay.ms": st.integers(0, LONG_MAX),
    "preallocate": st.booleans(),
    "message.timestamp.type": st.sampled_from(["CreateTime", "LogAppendTime"]),
    "min.cleanable.dirty.ratio": st.floats(0.0, 1.0),
    "delete.retention.ms": st.integers(0, LONG_MAX),
    "min.compaction.lag.ms": st.integers(0, LONG_MAX),
    "max.compaction.lag.ms": st.integers(1, LONG_MAX),
    "compression.type": st.sampled_from(["uncompressed", "zstd", "lz4", "snappy", "gzip",
                                         "producer"]),
    "compression.gzip.level": st.just(-1) | st.integers(1, 9),
    "compression.lz4.level": st.integers(1, 17),
    "compression.zstd.level": st.integers(-131072, 22),
    "compaction.strategy": st.sampled_from(["offset", "timestamp", "header"]),
    "compaction.strategy.header": st.text().map(lambda s: s.strip(JAVA_WS)),
}


def as_cli_text(value) -> str:
    """A value written the way kafka-configs would pass it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value)
    return repr(value) if isinstance(value, float) else str(value)


@st.composite
def valid_topic_overrides(draw):
    values = draw(st.fixed_dictionaries({}, optional=VALID_TOPIC_VALUES))
    low = values.get("min.compaction.lag.ms", 0)
    high = values.get("max.compaction.lag.ms", LONG_MAX)
    if low > high:  # only when both were drawn; swapped, both stay in range (high >= 1)
        values["min.compaction.lag.ms"], values["max.compaction.lag.ms"] = high, low
    if values.get("compaction.strategy") == "header" and not values.get(
            "compaction.strategy.header"):
        values["compaction.strategy.header"] = draw(st.sampled_from(["version", "ts", "é x"]))
    given_values = {k: as_cli_text(v) if draw(st.booleans()) else v for k, v in values.items()}
    return values, given_values


def test_hypothesis_strategy_covers_every_key():
    assert set(VALID_TOPIC_VALUES) == set(TOPIC_CONFIG_KEYS)


@given(valid_topic_overrides())
def test_properties_round_trip(case):
    expected, given_values = case
    cfg = TopicConfig(given_values)
    assert cfg.overrides == expected
    text = cfg.to_properties()
    back = TopicConfig.from_properties(text)
    assert back.overrides == expected
    assert back.to_dict() == cfg.to_dict()
    assert back.to_properties() == text
    assert TopicConfig(parse_properties(text)) == cfg
