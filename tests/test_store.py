"""LogStore: topics, configs, the partitioner, offsets lookups, the writer lock, clean and unclean
shutdown, checkpoints, background work driven by a fake clock, read-only stores and Kafka log dirs.

Expectations come from Kafka's rules (REF §4.1 marker, §4.5 checkpoint format) and kafka-python
(murmur2, DefaultPartitioner, MemoryRecordsBuilder); checkpoint files are parsed by hand here, not
with segstore's own reader. Time only moves through a fake clock; nothing sleeps.
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

import segstore
from conftest import FakeClock
from segstore import OffsetAndTimestamp, TopicPartition
from segstore.errors import (InvalidConfigError, InvalidTopicError, OffsetOutOfRangeError,
                             ReadOnlyStoreError, SegstoreError, StoreClosedError,
                             StoreLockedError, TopicAlreadyExistsError,
                             UnknownTopicOrPartitionError)
from segstore.topic import validate_topic_name

kafka_default = pytest.importorskip("kafka.partitioner.default")
from kafka.record.memory_records import MemoryRecordsBuilder  # noqa: E402

MARKER = ".kafka_cleanshutdown"
RP_CKPT = "recovery-point-offset-checkpoint"
LSO_CKPT = "log-start-offset-checkpoint"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "store")


def read_checkpoint(path) -> tuple[int, int, dict]:
    """Parse a Kafka checkpoint file by hand: (version, count, {TopicPartition: offset}).
    Also checks the exact line shape Kafka writes: single spaces, '\\n' line ends."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    version, count = int(lines[0]), int(lines[1])
    assert lines[0] == str(version) and lines[1] == str(count)
    entries = {}
    for ln in lines[2:]:
        m = re.fullmatch(r"(\S+) (\d+) (\d+)", ln)
        assert m, f"malformed checkpoint line {ln!r}"
        tp = TopicPartition(m.group(1), int(m.group(2)))
        assert tp not in entries
        entries[tp] = int(m.group(3))
    assert len(entries) == count
    return version, count, entries


def kafka_partition(key: bytes, n: int) -> int:
    return (kafka_default.murmur2(key) & 0x7FFFFFFF) % n


def run_py(code: str, *args, timeout=60, **kw):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout, **kw)


def values_of(log):
    return [r.value for r in log.iter_records()]


# ---------------------------------------------------------------------------------------------
# topics
# ---------------------------------------------------------------------------------------------

def test_create_list_describe_partition(root, clock):
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == []
        s.create_topic("zeta", num_partitions=3, config={"segment.bytes": 4096})
        s.create_topic("alpha")
        assert s.list_topics() == ["alpha", "zeta"]
        assert s.partitions_for("zeta") == [0, 1, 2]
        assert s.partitions_for("alpha") == [0]
        for p in range(3):
            assert os.path.isdir(os.path.join(root, f"zeta-{p}"))
            lg = s.partition("zeta", p)
            assert isinstance(lg, segstore.PartitionLog)
            assert (lg.topic, lg.partition) == ("zeta", p)
            assert lg.log_start_offset == 0 and lg.log_end_offset == 0
        assert os.path.isdir(os.path.join(root, "alpha-0"))
        assert not os.path.exists(os.path.join(root, "zeta-3"))
        assert s.partition("zeta", 1) is s.partition("zeta", 1)

        s.partition("zeta", 1).append_batch([b"a", b"b", b"c"])
        d = s.describe_topic("zeta")
        assert d["name"] == "zeta" and d["partitions"] == 3
        assert d["config"] == {"segment.bytes": 4096}
        info = {pi["partition"]: pi for pi in d["partition_info"]}
        assert sorted(info) == [0, 1, 2]
        assert info[1]["log_end_offset"] == 3 and info[1]["log_start_offset"] == 0
        assert info[0]["log_end_offset"] == 0
        assert info[1]["size_bytes"] > info[0]["size_bytes"] == 0
        assert info[1]["segments"] == 1
        assert s.describe_topic("alpha")["config"] == {}
        assert s.topic_config("zeta")["segment.bytes"] == 4096
        assert s.topic_config("alpha")["segment.bytes"] == 1_073_741_824


def test_topics_and_data_survive_reopen(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=2,
                       config={"cleanup.policy": "compact,delete", "segment.bytes": "2048",
                               "min.cleanable.dirty.ratio": 0.25, "preallocate": "false"})
        s.partition("t", 1).append_batch([b"x", b"y"], keys=[b"k1", b"k2"])
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["t"]
        assert s.partitions_for("t") == [0, 1]
        cfg = s.topic_config("t")
        assert cfg.overrides == {"cleanup.policy": ("compact", "delete"), "segment.bytes": 2048,
                                 "min.cleanable.dirty.ratio": 0.25, "preallocate": False}
        assert cfg.compact and cfg.delete
        assert s.partition("t", 1).config["segment.bytes"] == 2048
        assert [(r.key, r.value) for r in s.partition("t", 1).read(0)] == \
            [(b"k1", b"x"), (b"k2", b"y")]
        assert s.partition("t", 0).log_end_offset == 0


def test_persisted_configs_are_overrides_only(root, clock):
    # A store-wide default (broker name) is not frozen into the topic: only overrides persist.
    with segstore.open(root, clock=clock, config={"log.segment.bytes": 5000}) as s:
        s.create_topic("t", config={"retention.ms": 1234})
        assert s.topic_config("t")["segment.bytes"] == 5000
        assert s.partition("t", 0).config["segment.bytes"] == 5000
    with segstore.open(root, clock=clock, config={"log.segment.bytes": 7000}) as s:
        cfg = s.topic_config("t")
        assert cfg["segment.bytes"] == 7000 and cfg["retention.ms"] == 1234
        assert cfg.overrides == {"retention.ms": 1234}


def test_alter_topic_config_set_delete_persist_and_apply(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=2, config={"retention.ms": 1000})
        logs = [s.partition("t", p) for p in (0, 1)]
        cfg = s.alter_topic_config("t", set={"segment.bytes": 200, "cleanup.policy": "compact"})
        assert cfg.overrides == {"retention.ms": 1000, "segment.bytes": 200,
                                 "cleanup.policy": ("compact",)}
        for lg in logs:
            assert lg.config["segment.bytes"] == 200
            assert lg.config["cleanup.policy"] == ("compact",)
            assert lg.config["retention.ms"] == 1000
        assert s.topic_config("t")["segment.bytes"] == 200
        # takes effect: appends now roll at 200 bytes
        for i in range(20):
            logs[0].append(b"v" * 40, key=b"k%d" % i)
        assert len(logs[0].segments) > 1
        assert all(seg.size <= 200 for seg in logs[0].segments)

        cfg = s.alter_topic_config("t", delete=["retention.ms"])
        assert "retention.ms" not in cfg.overrides
        assert logs[1].config["retention.ms"] == 604_800_000
        assert logs[1].config["segment.bytes"] == 200
    with segstore.open(root, clock=clock) as s:
        cfg = s.topic_config("t")
        assert cfg.overrides == {"segment.bytes": 200, "cleanup.policy": ("compact",)}
        assert s.partition("t", 1).config["segment.bytes"] == 200
        assert s.partition("t", 1).config["retention.ms"] == 604_800_000
        assert s.describe_topic("t")["config"] == cfg.overrides


@pytest.mark.parametrize("config, key", [
    ({"segment.bytes": 13}, "segment.bytes"),
    ({"segment.bytes": "lots"}, "segment.bytes"),
    ({"retention.ms": -2}, "retention.ms"),
    ({"cleanup.policy": "shred"}, "cleanup.policy"),
    ({"min.cleanable.dirty.ratio": 1.5}, "min.cleanable.dirty.ratio"),
    ({"segment.byte": 1024}, "segment.byte"),
    ({"min.insync.replicas": 2}, "min.insync.replicas"),
    ({"log.cleaner.threads": 2}, "log.cleaner.threads"),  # store-wide key on a topic
])
def test_invalid_topic_config_rejected(root, clock, config, key):
    with segstore.open(root, clock=clock) as s:
        with pytest.raises(InvalidConfigError, match=re.escape(key)):
            s.create_topic("bad", config=config)
        assert s.list_topics() == []
        assert not os.path.exists(os.path.join(root, "bad-0"))
        with pytest.raises(UnknownTopicOrPartitionError):
            s.partition("bad", 0)

        s.create_topic("good", config={"segment.bytes": 4096})
        with pytest.raises(InvalidConfigError, match=re.escape(key)):
            s.alter_topic_config("good", set=config)
        assert s.topic_config("good").overrides == {"segment.bytes": 4096}
        assert s.partition("good", 0).config["segment.bytes"] == 4096
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["good"]
        assert s.topic_config("good").overrides == {"segment.bytes": 4096}


def test_alter_delete_unknown_key_and_unknown_topic(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t")
        with pytest.raises(InvalidConfigError, match="retention.mss"):
            s.alter_topic_config("t", delete=["retention.mss"])
        with pytest.raises(UnknownTopicOrPartitionError):
            s.alter_topic_config("nope", set={"retention.ms": 5})


@pytest.mark.parametrize("config, key", [
    ({"log.cleaner.thread": 1}, "log.cleaner.thread"),
    ({"log.cleaner.threads": -1}, "log.cleaner.threads"),
    ({"log.segment.bytes": 3}, "log.segment.bytes"),
])
def test_invalid_store_config_rejected(root, config, key):
    with pytest.raises(InvalidConfigError, match=re.escape(key)):
        segstore.open(root, config=config)
    # nothing was left locked
    segstore.open(root).close()


def test_delete_topic(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("gone", num_partitions=2)
        s.create_topic("kept")
        lg = s.partition("gone", 0)
        lg.append_batch([b"1", b"2"])
        s.partition("kept", 0).append(b"k")
        s.delete_topic("gone")
        assert s.list_topics() == ["kept"]
        for p in (0, 1):
            assert not os.path.exists(os.path.join(root, f"gone-{p}"))
        assert not [n for n in os.listdir(root) if n.startswith("gone")]
        assert not os.path.exists(os.path.join(root, ".segstore", "topics", "gone.json"))
        with pytest.raises(UnknownTopicOrPartitionError):
            s.partition("gone", 0)
        with pytest.raises(UnknownTopicOrPartitionError):
            s.delete_topic("gone")
        with pytest.raises(StoreClosedError):
            lg.append(b"late")
        # the name can be reused, and the new topic starts empty
        s.create_topic("gone", num_partitions=1)
        assert s.partition("gone", 0).log_end_offset == 0
        s.delete_topic("gone")
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["kept"]
        _, _, entries = read_checkpoint(os.path.join(root, RP_CKPT))
        assert set(entries) == {TopicPartition("kept", 0)}


# ---------------------------------------------------------------------------------------------
# topic names
# ---------------------------------------------------------------------------------------------

GOOD_NAMES = ["a", "A-b_c.d", "0", "_", "-", "...", "a..b", "x" * 249, "__consumer_offsets"]
BAD_NAMES = ["", ".", "..", "../x", "a/b", "/abs", "a\\b", "a b", " a", "a\t", "ä", "topic✓",
             "a\nb", "abc\n", "\nabc", "a\x00b", "a:b", "a*", "x" * 250, "ｆｕｌｌ"]


@pytest.mark.parametrize("name", GOOD_NAMES, ids=lambda n: repr(n)[:20])
def test_valid_topic_names(name):
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n)[:20])
def test_invalid_topic_names(name):
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


@pytest.mark.parametrize("name", [None, 5, b"abc"])
def test_topic_name_must_be_str(name):
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


def test_create_topic_rejects_bad_names_without_touching_disk(tmp_path, clock):
    root = tmp_path / "store"
    with segstore.open(str(root), clock=clock) as s:
        before = sorted(os.listdir(tmp_path)), sorted(os.listdir(root))
        for name in BAD_NAMES:
            with pytest.raises(InvalidTopicError):
                s.create_topic(name)
        assert s.list_topics() == []
        assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(root))) == before
        assert not os.path.exists(tmp_path / "x-0")


def test_longest_topic_name_works_end_to_end(root, clock):
    name = "t" * 249
    with segstore.open(root, clock=clock) as s:
        s.create_topic(name, num_partitions=2)
        s.partition(name, 1).append(b"v")
        s.alter_topic_config(name, set={"retention.ms": 5000})
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == [name]
        assert s.partition(name, 1).log_end_offset == 1
        assert s.topic_config(name)["retention.ms"] == 5000
        s.delete_topic(name)
        assert s.list_topics() == []
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == []


def test_delete_topic_with_long_name(root, clock):
    # Kafka truncates the topic in "<topic>-<p>.<uuid>-delete" to stay within 255 bytes
    # (UnifiedLog.logDeleteDirName); any legal name must be deletable.
    name = "d" * 230
    with segstore.open(root, clock=clock) as s:
        s.create_topic(name)
        s.partition(name, 0).append(b"v")
        s.delete_topic(name)
        assert s.list_topics() == []
        assert not [n for n in os.listdir(root) if n.startswith("ddd")]
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == []


def test_topic_already_exists(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=2, config={"retention.ms": 10})
        with pytest.raises(TopicAlreadyExistsError):
            s.create_topic("t", num_partitions=5)
        assert s.partitions_for("t") == [0, 1]
        assert s.topic_config("t")["retention.ms"] == 10
    with segstore.open(root, clock=clock) as s:
        with pytest.raises(TopicAlreadyExistsError):
            s.create_topic("t")


def test_unknown_topic_or_partition(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=3)
        for call in (lambda: s.partition("nope", 0), lambda: s.describe_topic("nope"),
                     lambda: s.topic_config("nope"), lambda: s.partitions_for("nope"),
                     lambda: s.append("nope", b"v"), lambda: s.delete_topic("nope"),
                     lambda: s.partition("t", 3), lambda: s.partition("t", -1),
                     lambda: s.partition("t", 100), lambda: s.append("t", b"v", partition=3),
                     lambda: s.end_offsets([TopicPartition("t", 3)]),
                     lambda: s.beginning_offsets([TopicPartition("nope", 0)]),
                     lambda: s.offsets_for_times({TopicPartition("t", -1): 0})):
            with pytest.raises(UnknownTopicOrPartitionError):
                call()
        with pytest.raises(TypeError):
            s.partition("t", "0")
        assert s.partition("t", 2).log_end_offset == 0


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True, None])
def test_bad_num_partitions(root, clock, n):
    with segstore.open(root, clock=clock) as s:
        with pytest.raises(SegstoreError) as ei:
            s.create_topic("t", num_partitions=n)
        assert isinstance(ei.value, ValueError)
        assert s.list_topics() == []
        assert not os.path.exists(os.path.join(root, "t-0"))


# ---------------------------------------------------------------------------------------------
# partitioner
# ---------------------------------------------------------------------------------------------

class _FakeCluster:
    def __init__(self, topic, n):
        self._topic, self._n = topic, n

    def topics(self):
        return {self._topic}

    def partitions_for_topic(self, topic):
        return set(range(self._n))

    def available_partitions_for_topic(self, topic):
        return set(range(self._n))


def _default_partitioner():
    import kafka.partitioner as kp
    return getattr(kafka_default, "DefaultPartitioner", None) or kp.DefaultPartitioner


def test_murmur2_oracle_sanity():
    # kafka-python's murmur2 returns the unsigned 32-bit hash; Kafka's Java test vectors
    # (Utils.murmur2, signed) after toPositive agree with the masked value.
    assert kafka_default.murmur2(b"21") & 0x7FFFFFFF == (-973932308) & 0x7FFFFFFF
    assert kafka_default.murmur2(b"foobar") & 0x7FFFFFFF == (-790332482) & 0x7FFFFFFF
    assert 0 <= kafka_default.murmur2(b"a-little-bit-long-string") < 2**32


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 100])
def test_partition_for_matches_kafka(root, clock, n):
    rng = random.Random(n)
    partitioner = _default_partitioner()()
    cluster = _FakeCluster("t", n)
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=n, config={"segment.index.bytes": 4096})
        keys = [b"", b"\x00", b"\xff" * 4] + \
            [rng.randbytes(rng.randrange(0, 41)) for _ in range(3000)]
        for k in keys:
            want = kafka_partition(k, n)
            assert partitioner.partition("t", k, k, b"v", b"v", cluster) == want
            assert s.partition_for("t", k) == want, k
        # str keys are hashed as their UTF-8 bytes
        for k in ["", "user-1", "ключ", "ünïcødé"]:
            assert s.partition_for("t", k) == kafka_partition(k.encode(), n)


def test_append_lands_where_kafka_would(root, clock):
    n = 7
    rng = random.Random(42)
    keys = [rng.randbytes(rng.randrange(0, 24)) for _ in range(1500)]
    expected = {p: [] for p in range(n)}
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=n)
        for i, k in enumerate(keys):
            v = b"%d" % i
            md = s.append("t", v, key=k)
            p = kafka_partition(k, n)
            assert md.partition == p and md.topic == "t"
            assert md.topic_partition == TopicPartition("t", p)
            assert md.offset == len(expected[p])
            expected[p].append((k, v))
        for p in range(n):
            got = [(r.key, r.value) for r in s.partition("t", p).iter_records()]
            assert got == expected[p]
            assert all(r.partition == p and r.topic == "t"
                       for r in s.partition("t", p).read(0, max_records=5))
        # explicit partition wins over the key
        md = s.append("t", b"x", key=keys[0], partition=(kafka_partition(keys[0], n) + 1) % n)
        assert md.partition == (kafka_partition(keys[0], n) + 1) % n


def test_str_keys_are_utf8(root, clock):
    n = 5
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=n)
        for key in ["user-1", "ключ", "ünïcødé", "🙂"]:
            raw = key.encode("utf-8")
            md = s.append("t", b"v", key=key)
            assert md.partition == kafka_partition(raw, n)
            assert md.serialized_key_size == len(raw)
            rec = s.partition("t", md.partition).read(md.offset, max_records=1)[0]
            assert rec.key == raw and rec.serialized_key_size == len(raw)


def test_null_keys_round_robin(root, clock):
    n = 5
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=n)
        s.create_topic("one", num_partitions=1)
        parts = [s.append("t", b"v%d" % i).partition for i in range(10 * n)]
        # every window of n consecutive null-key appends covers all partitions once
        for i in range(0, len(parts), n):
            assert sorted(parts[i:i + n]) == list(range(n))
        assert s.end_offsets([TopicPartition("t", p) for p in range(n)]) == \
            {TopicPartition("t", p): 10 for p in range(n)}
        assert {s.append("one", b"x").partition for _ in range(5)} == {0}


# ---------------------------------------------------------------------------------------------
# offsets lookups
# ---------------------------------------------------------------------------------------------

def test_beginning_end_offsets_and_offsets_for_times(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=3)
        s.create_topic("u")
        t0, t1, t2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
        u0 = TopicPartition("u", 0)
        s.partition("t", 0).append_batch([b"a", b"b", b"c", b"d"],
                                         timestamps_ms=[1000, 2000, 3000, 4000])
        s.partition("t", 1).append_batch([b"x", b"y", b"z"], timestamps_ms=[5000, 1000, 3000])
        s.partition("t", 0).delete_records(1)

        beg = s.beginning_offsets([t0, t1, t2, u0])
        assert beg == {t0: 1, t1: 0, t2: 0, u0: 0}
        assert all(type(k) is TopicPartition for k in beg)
        end = s.end_offsets([t0, t1, t2, u0])
        assert end == {t0: 4, t1: 3, t2: 0, u0: 0}
        assert all(type(k) is TopicPartition for k in end)
        # plain tuples are accepted and normalized to TopicPartition keys
        assert s.end_offsets([("t", 1)]) == {t1: 3}
        assert type(next(iter(s.end_offsets([("t", 1)])))) is TopicPartition
        assert s.beginning_offsets([]) == {} and s.end_offsets([]) == {}

        res = s.offsets_for_times({t0: 1500, t1: 2000, t2: 0, u0: 10})
        assert set(res) == {t0, t1, t2, u0}
        assert all(type(k) is TopicPartition for k in res)
        assert res[t0] == OffsetAndTimestamp(1, 2000, None)
        assert isinstance(res[t0], OffsetAndTimestamp)
        assert (res[t0].offset, res[t0].timestamp) == (1, 2000)
        # first offset whose timestamp is >= the target, even when timestamps go backwards
        assert (res[t1].offset, res[t1].timestamp) == (0, 5000)
        assert res[t2] is None and res[u0] is None

        res = s.offsets_for_times({t0: 500, ("t", 1): 5000})
        assert set(res) == {t0, t1} and all(type(k) is TopicPartition for k in res)
        # below the log start offset nothing is returned: offset 0 was deleted
        assert (res[t0].offset, res[t0].timestamp) == (1, 2000)
        assert (res[t1].offset, res[t1].timestamp) == (0, 5000)
        res = s.offsets_for_times({t0: 4000, t1: 4000})
        assert (res[t0].offset, res[t0].timestamp) == (3, 4000)
        assert (res[t1].offset, res[t1].timestamp) == (0, 5000)
        res = s.offsets_for_times({t0: 4001, t1: 5001})
        assert res == {t0: None, t1: None}


def test_offsets_for_times_across_segments(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"segment.bytes": 300, "index.interval.bytes": 1,
                                     "segment.index.bytes": 4096})
        lg = s.partition("t", 0)
        for i in range(60):
            lg.append(b"v" * 20, timestamp_ms=10_000 + 100 * i)
        assert len(lg.segments) > 3
        tp = TopicPartition("t", 0)
        for i in range(60):
            r = s.offsets_for_times({tp: 10_000 + 100 * i - 50})[tp]
            assert (r.offset, r.timestamp) == (i, 10_000 + 100 * i)
            r = s.offsets_for_times({tp: 10_000 + 100 * i})[tp]
            assert (r.offset, r.timestamp) == (i, 10_000 + 100 * i)
        assert s.offsets_for_times({tp: 20_000})[tp] is None


# ---------------------------------------------------------------------------------------------
# the writer lock
# ---------------------------------------------------------------------------------------------

def _pid_in(msg: str) -> int:
    m = re.search(r"pid (\d+)", msg)
    assert m, msg
    return int(m.group(1))


def test_second_writer_in_same_process_is_locked_out(root, clock):
    s = segstore.open(root, clock=clock)
    try:
        s.create_topic("t")
        for _ in range(2):  # a failed attempt must not release the holder's lock
            with pytest.raises(StoreLockedError) as ei:
                segstore.open(root, clock=clock)
            assert _pid_in(str(ei.value)) == os.getpid()
        # the holder still works
        s.append("t", b"still mine")
        ro = segstore.open(root, readonly=True)
        try:
            assert values_of(ro.partition("t", 0)) == [b"still mine"]
        finally:
            ro.close()
    finally:
        s.close()
    with segstore.open(root, clock=clock) as s2:
        assert values_of(s2.partition("t", 0)) == [b"still mine"]


def test_writer_in_subprocess_is_locked_out_and_lock_released_on_close(root, clock):
    code = """
        import sys, segstore
        from segstore.errors import StoreLockedError
        try:
            s = segstore.open(sys.argv[1])
        except StoreLockedError as e:
            print("LOCKED", e)
            sys.exit(3)
        s.create_topic("from_child")
        s.close()
        print("OPENED")
    """
    s = segstore.open(root, clock=clock)
    try:
        r = run_py(code, root)
        assert r.returncode == 3, r.stderr
        assert r.stdout.startswith("LOCKED")
        assert _pid_in(r.stdout) == os.getpid()
    finally:
        s.close()
    r = run_py(code, root)
    assert r.returncode == 0 and "OPENED" in r.stdout, r.stderr
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["from_child"]


def test_lock_held_by_subprocess_names_its_pid(root, clock):
    code = """
        import sys, segstore
        s = segstore.open(sys.argv[1])
        s.create_topic("child")
        print("READY", flush=True)
        sys.stdin.readline()
        s.close()
        print("CLOSED", flush=True)
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), root], cwd=REPO,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        with pytest.raises(StoreLockedError) as ei:
            segstore.open(root, clock=clock)
        assert _pid_in(str(ei.value)) == proc.pid
        # a reader may open alongside the writer
        with segstore.open(root, readonly=True) as ro:
            assert ro.list_topics() == ["child"]
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "CLOSED"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["child"]


def test_readonly_opens_alongside_writer_and_sees_appends(root, clock):
    with segstore.open(root, clock=clock) as w:
        w.create_topic("t", num_partitions=2)
        w.partition("t", 0).append_batch([b"a", b"b"])
        ro = segstore.open(root, readonly=True)
        try:
            assert ro.readonly
            assert ro.list_topics() == ["t"]
            rlog = ro.partition("t", 0)
            assert values_of(rlog) == [b"a", b"b"]
            assert ro.end_offsets([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 2}
            w.partition("t", 0).append(b"c")
            w.partition("t", 1).append(b"z")
            assert values_of(rlog) == [b"a", b"b", b"c"]
            assert ro.end_offsets([TopicPartition("t", 0), TopicPartition("t", 1)]) == \
                {TopicPartition("t", 0): 3, TopicPartition("t", 1): 1}
            assert [r.value for r in ro.partition("t", 1).read(0)] == [b"z"]
            # a second reader too
            with segstore.open(root, readonly=True) as ro2:
                assert values_of(ro2.partition("t", 0)) == [b"a", b"b", b"c"]
        finally:
            ro.close()
        # the readers' close wrote nothing: the writer is still open
        assert not os.path.exists(os.path.join(root, MARKER))
        w.partition("t", 0).append(b"d")
    assert os.path.exists(os.path.join(root, MARKER))


def test_readonly_needs_an_existing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        segstore.open(str(tmp_path / "missing"), readonly=True)
    assert not os.path.exists(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# clean shutdown, checkpoints, lifecycle
# ---------------------------------------------------------------------------------------------

def test_clean_close_writes_marker_and_checkpoints(root, clock):
    s = segstore.open(root, clock=clock)
    s.create_topic("b", num_partitions=2)
    s.create_topic("a")
    s.partition("b", 0).append_batch([b"1", b"2", b"3"])
    s.partition("b", 1).append_batch([b"x"] * 5)
    s.partition("b", 1).delete_records(2)
    assert not os.path.exists(os.path.join(root, MARKER))
    s.close()
    assert os.path.isfile(os.path.join(root, MARKER))
    version, count, rp = read_checkpoint(os.path.join(root, RP_CKPT))
    assert (version, count) == (0, 3)
    assert rp == {TopicPartition("a", 0): 0, TopicPartition("b", 0): 3, TopicPartition("b", 1): 5}
    version, count, ls = read_checkpoint(os.path.join(root, LSO_CKPT))
    assert (version, count) == (0, 3)
    assert ls == {TopicPartition("a", 0): 0, TopicPartition("b", 0): 0, TopicPartition("b", 1): 2}
    assert not [n for n in os.listdir(root) if n.endswith(".tmp")]

    # reopening deletes the marker at once (KAFKA-10471) and keeps it absent while open
    s = segstore.open(root, clock=clock)
    try:
        assert not os.path.exists(os.path.join(root, MARKER))
        s.partition("a", 0).append(b"new")
        assert not os.path.exists(os.path.join(root, MARKER))
    finally:
        s.close()
    assert os.path.exists(os.path.join(root, MARKER))
    _, _, rp = read_checkpoint(os.path.join(root, RP_CKPT))
    assert rp[TopicPartition("a", 0)] == 1


def test_close_makes_checkpoints_durable_before_the_marker(root, monkeypatch):
    """Both checkpoint files are renamed into place and their directory fsynced before the
    clean-shutdown marker appears (then its directory is fsynced): a crash in between leaves
    no marker, so the next open recovers instead of trusting half-written checkpoints."""
    from segstore import checkpoint

    s = segstore.open(root)
    s.create_topic("t")
    s.partition("t", 0).append(b"x")
    events = []
    real_replace, real_fsync_dir = os.replace, checkpoint.fsync_dir


    def replace(a, b):  # os's own: the partition's producer snapshot is not counted
        if not b.endswith(".snapshot"):
            events.append(("replace", os.path.basename(b)))
        real_replace(a, b)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    monkeypatch.setattr(checkpoint, "fsync_dir",
                        lambda d: events.append(("fsync_dir", os.path.exists(
                            os.path.join(root, MARKER)))) or real_fsync_dir(d))
    s.close()
    assert events == [("replace", RP_CKPT), ("replace", LSO_CKPT), ("fsync_dir", False),
                      ("fsync_dir", True)]
    with open(os.path.join(root, MARKER), "rb") as f:
        assert f.read() == b""


def test_empty_store_close_writes_empty_checkpoints(root):
    segstore.open(root).close()
    for name in (RP_CKPT, LSO_CKPT):
        with open(os.path.join(root, name)) as f:
            assert f.read() == "0\n0\n"
    assert os.path.exists(os.path.join(root, MARKER))


def test_close_idempotent_and_closed_store_rejects_operations(root, clock):
    s = segstore.open(root, clock=clock)
    s.create_topic("t")
    lg = s.partition("t", 0)
    lg.append(b"a")
    s.close()
    s.close()
    assert os.path.exists(os.path.join(root, MARKER))
    tp = TopicPartition("t", 0)
    for call in (s.list_topics, lambda: s.create_topic("u"), lambda: s.partition("t", 0),
                 lambda: s.append("t", b"v"), lambda: s.describe_topic("t"),
                 lambda: s.topic_config("t"), lambda: s.delete_topic("t"),
                 lambda: s.alter_topic_config("t", set={"retention.ms": 1}),
                 lambda: s.beginning_offsets([tp]), lambda: s.end_offsets([tp]),
                 lambda: s.offsets_for_times({tp: 0}), s.write_checkpoints, s.metrics,
                 s.start_services, lambda: s.partitions_for("t"),
                 lambda: s.partition_for("t", b"k"), lambda: lg.append(b"late"),
                 lambda: lg.read(0)):
        with pytest.raises(StoreClosedError):
            call()
    s.tick()  # a no-op after close, never an error
    # a third close after the failed calls changes nothing
    s.close()
    with segstore.open(root, clock=clock) as s2:
        assert values_of(s2.partition("t", 0)) == [b"a"]


def test_context_manager(root, clock):
    with segstore.open(root, clock=clock) as s:
        assert isinstance(s, segstore.LogStore)
        s.create_topic("t")
    with pytest.raises(StoreClosedError):
        s.list_topics()
    assert os.path.exists(os.path.join(root, MARKER))
    with pytest.raises(RuntimeError, match="boom"):
        with segstore.open(root, clock=clock) as s:
            s.append("t", b"v")
            raise RuntimeError("boom")
    with pytest.raises(StoreClosedError):
        s.list_topics()
    with segstore.open(root, clock=clock) as s:  # lock released even after the exception
        assert values_of(s.partition("t", 0)) == [b"v"]


def test_readonly_store_rejects_mutations(root, clock):
    with segstore.open(root, clock=clock) as w:
        w.create_topic("t")
        w.partition("t", 0).append(b"a")
    before = sorted(os.listdir(root))
    with segstore.open(root, readonly=True) as ro:
        lg = ro.partition("t", 0)
        for call in (lambda: ro.create_topic("u"), lambda: ro.delete_topic("t"),
                     lambda: ro.alter_topic_config("t", set={"retention.ms": 5}),
                     lambda: ro.append("t", b"v"), lambda: ro.append("t", b"v", partition=0),
                     ro.write_checkpoints, ro.start_services,
                     lambda: lg.append(b"v"), lambda: lg.append_batch([b"v"]), lg.flush,
                     lambda: lg.truncate_to(0), lambda: lg.delete_records(1), lg.roll):
            with pytest.raises(ReadOnlyStoreError):
                call()
        ro.tick(now_ms=10**12)
        assert values_of(lg) == [b"a"]
    # a read-only open and close leaves the directory as it was (marker stays, no checkpoint
    # rewrite, no lock taken)
    assert sorted(os.listdir(root)) == before
    assert os.path.exists(os.path.join(root, MARKER))
    with segstore.open(root, clock=clock) as w:
        assert w.list_topics() == ["t"]


# ---------------------------------------------------------------------------------------------
# unclean shutdown
# ---------------------------------------------------------------------------------------------

CRASHING_WRITER = """
    import os, sys, segstore
    s = segstore.open(sys.argv[1])
    if "t" not in s.list_topics():
        s.create_topic("t", num_partitions=2, config={"segment.bytes": 400, "segment.index.bytes": 4096})
    lg = s.partition("t", 0)
    for i in range(int(sys.argv[2]), int(sys.argv[3])):
        lg.append(b"value-%d" % i, key=b"k%d" % i)
    s.partition("t", 1).append(b"p1")
    s.partition("t", 0).flush()
    s.partition("t", 1).flush()
    os._exit(0)  # no close: no marker, no checkpoints, lock dropped by the kernel
"""


def test_unclean_shutdown_recovers_flushed_records(root, clock):
    r = run_py(CRASHING_WRITER, root, "0", "40")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(root, MARKER))
    assert not os.path.exists(os.path.join(root, RP_CKPT))
    with segstore.open(root, clock=clock) as s:
        lg = s.partition("t", 0)
        assert len(lg.segments) > 1
        assert [(r.offset, r.key, r.value) for r in lg.iter_records()] == \
            [(i, b"k%d" % i, b"value-%d" % i) for i in range(40)]
        assert values_of(s.partition("t", 1)) == [b"p1"]
        assert s.topic_config("t")["segment.bytes"] == 400
        # usable: appends continue at the right offset
        assert lg.append(b"after").offset == 40
        assert s.append("t", b"more", partition=1).offset == 1
    # a second crash after a clean reopen, then recovery again
    r = run_py(CRASHING_WRITER, root, "41", "60")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(root, MARKER))
    with segstore.open(root, clock=clock) as s:
        got = [r.value for r in s.partition("t", 0).iter_records()]
        assert got == [b"value-%d" % i for i in range(40)] + [b"after"] + \
            [b"value-%d" % i for i in range(41, 60)]
        assert values_of(s.partition("t", 1)) == [b"p1", b"more", b"p1"]
    with segstore.open(root, clock=clock) as s:
        assert s.partition("t", 0).log_end_offset == 60


def test_unclean_shutdown_with_torn_tail(root, clock):
    r = run_py(CRASHING_WRITER, root, "0", "10")
    assert r.returncode == 0, r.stderr
    d = os.path.join(root, "t-0")
    active = max(n for n in os.listdir(d) if n.endswith(".log"))
    with open(os.path.join(d, active), "ab") as f:
        # half of a batch header: base offset and a length that promises more than follows
        f.write((10).to_bytes(8, "big") + (200).to_bytes(4, "big") + b"\x00" * 20)
    with segstore.open(root, clock=clock) as s:
        lg = s.partition("t", 0)
        assert lg.log_end_offset == 10
        assert values_of(lg) == [b"value-%d" % i for i in range(10)]
        assert lg.append(b"fresh").offset == 10
        assert [r.value for r in lg.read(10)] == [b"fresh"]
    with segstore.open(root, clock=clock) as s:
        assert values_of(s.partition("t", 0))[-1] == b"fresh"


def test_delete_records_survives_reopen(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"segment.bytes": 200, "segment.index.bytes": 4096})
        lg = s.partition("t", 0)
        for i in range(30):
            lg.append(b"v%d" % i)
        assert lg.delete_records(17) == 17
        assert s.beginning_offsets([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 17}
    _, _, ls = read_checkpoint(os.path.join(root, LSO_CKPT))
    assert ls == {TopicPartition("t", 0): 17}
    with segstore.open(root, clock=clock) as s:
        lg = s.partition("t", 0)
        assert lg.log_start_offset == 17
        assert s.beginning_offsets([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 17}
        assert [r.offset for r in lg.iter_records()] == list(range(17, 30))
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(16)
        # a lower delete_records never moves it back
        assert lg.delete_records(5) == 17
    with segstore.open(root, readonly=True) as ro:
        assert ro.partition("t", 0).log_start_offset == 17
    with segstore.open(root, clock=clock) as s:
        assert s.partition("t", 0).log_start_offset == 17


# ---------------------------------------------------------------------------------------------
# tick(): flush, checkpoints, delayed deletes
# ---------------------------------------------------------------------------------------------

def test_tick_flushes_by_flush_ms(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"flush.ms": 100})
        s.create_topic("never", config={"retention.ms": -1})  # flush.ms default: the OS's job
        lg, other = s.partition("t", 0), s.partition("never", 0)
        lg.append_batch([b"a", b"b", b"c"])
        other.append_batch([b"a", b"b"])
        assert lg.recovery_point == 0
        clock.advance(99)
        s.tick()
        assert lg.recovery_point == 0
        clock.advance(1)
        s.tick()
        assert lg.recovery_point == 3
        assert other.recovery_point == 0
        lg.append(b"d")
        assert lg.recovery_point == 3
        s.tick()
        assert lg.recovery_point == 3  # flushed 0 ms ago
        clock.advance(100)
        s.tick()
        assert lg.recovery_point == 4
        clock.advance(10**9)
        s.tick()
        assert other.recovery_point == 0


def test_tick_with_now_ms_flushes_by_flush_ms(root, clock):
    # tick(now_ms=...) is "the time now" for every rule it runs, flush.ms included
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"flush.ms": 100})
        lg = s.partition("t", 0)
        lg.append(b"a")
        s.tick(now_ms=clock.now + 50)
        assert lg.recovery_point == 0
        s.tick(now_ms=clock.now + 100)
        assert lg.recovery_point == 1


def test_flush_messages(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", config={"flush.messages": 3})
        lg = s.partition("t", 0)
        lg.append(b"1")
        lg.append(b"2")
        assert lg.recovery_point == 0
        lg.append(b"3")
        assert lg.recovery_point == 3


def test_tick_writes_checkpoints_when_due(root, clock):
    cfg = {"log.flush.offset.checkpoint.interval.ms": 1000,
           "log.flush.start.offset.checkpoint.interval.ms": 5000}
    rp_path, ls_path = os.path.join(root, RP_CKPT), os.path.join(root, LSO_CKPT)
    with segstore.open(root, clock=clock, config=cfg) as s:
        s.create_topic("t", config={"flush.ms": 0})
        lg = s.partition("t", 0)
        lg.append_batch([b"a", b"b"])
        assert lg.recovery_point == 2
        s.tick()
        assert not os.path.exists(rp_path) and not os.path.exists(ls_path)
        clock.advance(999)
        s.tick()
        assert not os.path.exists(rp_path)
        clock.advance(1)
        s.tick()
        assert read_checkpoint(rp_path)[2] == {TopicPartition("t", 0): 2}
        assert read_checkpoint(ls_path)[2] == {TopicPartition("t", 0): 0}
        lg.append(b"c")
        lg.delete_records(1)
        clock.advance(500)
        s.tick()
        assert read_checkpoint(rp_path)[2] == {TopicPartition("t", 0): 2}  # not due yet
        clock.advance(500)
        s.tick()
        assert read_checkpoint(rp_path)[2] == {TopicPartition("t", 0): 3}
        # tick(now_ms=...) drives the schedule too
        lg.append(b"d")
        s.tick(now_ms=clock.now + 999)
        assert read_checkpoint(rp_path)[2] == {TopicPartition("t", 0): 3}
        s.tick(now_ms=clock.now + 1000)
        assert read_checkpoint(rp_path)[2] == {TopicPartition("t", 0): 4}
        assert read_checkpoint(ls_path)[2] == {TopicPartition("t", 0): 1}


def _retired_store(root, clock, delay):
    s = segstore.open(root, clock=clock)
    s.create_topic("t", config={"segment.bytes": 200, "file.delete.delay.ms": delay,
                             "segment.index.bytes": 4096})
    lg = s.partition("t", 0)
    for i in range(40):
        lg.append(b"x" * 30 + b"%02d" % i)
    segs = list(lg.segments)
    assert len(segs) >= 4
    return s, lg, segs


def test_truncate_to_retires_segments_with_delayed_delete(root, clock):
    s, lg, segs = _retired_store(root, clock, delay=5000)
    d = lg.directory
    try:
        cut = segs[1].base_offset + 1
        retired = [seg.base_offset for seg in segs[2:]]
        clock.advance(10)
        lg.truncate_to(cut)
        t_retire = clock.now
        assert lg.log_end_offset == cut
        assert [r.offset for r in lg.iter_records()] == list(range(cut))
        names = set(os.listdir(d))
        for b in retired:
            assert f"{b:020d}.log" not in names
            assert f"{b:020d}.log.deleted" in names
            assert f"{b:020d}.index.deleted" in names
            assert f"{b:020d}.timeindex.deleted" in names
        assert s.metrics()["pending-deletes"] == len(retired)
        clock.advance(10_000)  # the store clock is irrelevant: tick(now_ms) decides
        s.tick(now_ms=t_retire + 4999)
        assert all(f"{b:020d}.log.deleted" in os.listdir(d) for b in retired)
        s.tick(now_ms=t_retire + 5000)
        names = set(os.listdir(d))
        assert not [n for n in names if n.endswith(".deleted")]
        assert f"{segs[0].base_offset:020d}.log" in names
        assert f"{segs[1].base_offset:020d}.log" in names
        assert s.metrics()["pending-deletes"] == 0
        # the log goes on
        assert lg.append(b"next").offset == cut
    finally:
        s.close()


def test_tick_uses_store_clock_for_delayed_delete(root, clock):
    s, lg, segs = _retired_store(root, clock, delay=5000)
    try:
        lg.truncate_to(segs[0].base_offset + 2)
        d = lg.directory
        clock.advance(4999)
        s.tick()
        assert [n for n in os.listdir(d) if n.endswith(".log.deleted")]
        clock.advance(1)
        s.tick()
        assert not [n for n in os.listdir(d) if n.endswith(".deleted")]
    finally:
        s.close()


def test_close_removes_all_pending_deletes(root, clock):
    s, lg, segs = _retired_store(root, clock, delay=10**9)
    d = lg.directory
    lg.truncate_to(segs[0].base_offset + 2)
    assert [n for n in os.listdir(d) if n.endswith(".deleted")]
    s.close()
    assert not [n for n in os.listdir(d) if n.endswith(".deleted")]
    with segstore.open(root, clock=clock) as s:
        assert [r.offset for r in s.partition("t", 0).iter_records()] == [0, 1]


def test_delete_topic_with_pending_deletes(root, clock):
    s, lg, segs = _retired_store(root, clock, delay=10**9)
    try:
        lg.truncate_to(2)
        s.delete_topic("t")
        assert not os.path.exists(os.path.join(root, "t-0"))
        assert s.metrics()["pending-deletes"] == 0
        s.tick(now_ms=clock.now + 10**10)
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# read-only stores see new topics and data
# ---------------------------------------------------------------------------------------------

def test_readonly_sees_topics_created_later(root, clock):
    with segstore.open(root, clock=clock) as w:
        w.create_topic("old")
        w.partition("old", 0).append(b"o")
        ro = segstore.open(root, readonly=True)
        try:
            assert ro.list_topics() == ["old"]
            w.create_topic("new", num_partitions=3, config={"retention.ms": 777})
            w.append("new", b"n1", partition=2)
            lg = ro.partition("new", 2)
            assert values_of(lg) == [b"n1"]
            assert ro.partitions_for("new") == [0, 1, 2]
            assert ro.topic_config("new")["retention.ms"] == 777
            assert ro.list_topics() == ["new", "old"]
            w.append("new", b"n2", partition=2)
            assert values_of(lg) == [b"n1", b"n2"]
            with pytest.raises(UnknownTopicOrPartitionError):
                ro.partition("never", 0)
            with pytest.raises(UnknownTopicOrPartitionError):
                ro.partition("new", 3)
        finally:
            ro.close()


def test_readonly_reload_keeps_existing_handles_usable(root, clock):
    # Looking up a topic the reader does not know yet must not break logs it already handed out
    # (another thread may be reading them).
    with segstore.open(root, clock=clock) as w:
        w.create_topic("old")
        w.partition("old", 0).append_batch([b"a", b"b"])
        with segstore.open(root, readonly=True) as ro:
            lg = ro.partition("old", 0)
            assert values_of(lg) == [b"a", b"b"]
            w.create_topic("new")
            ro.partition("new", 0)
            assert values_of(lg) == [b"a", b"b"]
            with pytest.raises(UnknownTopicOrPartitionError):
                ro.partition("typo", 0)
            assert [r.value for r in lg.read(1)] == [b"b"]


def test_readonly_list_topics_sees_new_topics(root, clock):
    with segstore.open(root, clock=clock) as w:
        with segstore.open(root, readonly=True) as ro:
            assert ro.list_topics() == []
            w.create_topic("late")
            assert ro.list_topics() == ["late"]


# ---------------------------------------------------------------------------------------------
# a Kafka broker's log dir
# ---------------------------------------------------------------------------------------------

def _kafka_records(n_batches=4, per_batch=5):
    out, off = [], 0
    for b in range(n_batches):
        recs = []
        for i in range(per_batch):
            key = None if (off % 4 == 3) else b"key-%d" % off
            value = None if off == 7 else b"value-%d" % off * (1 + off % 3)
            headers = [("h", b"%d" % off)] if off % 2 else []
            recs.append((1_600_000_000_000 + off * 10, key, value, headers))
            off += 1
        out.append(recs)
    return out


def _write_kafka_dir(root, topic="orders", partition=0, batches=None, base=0):
    d = os.path.join(root, f"{topic}-{partition}")
    os.makedirs(d, exist_ok=True)
    data = bytearray()
    off = base
    expected = []
    for recs in batches:
        # As a producer builds it (offset deltas 0..n-1), then the broker's offset assignment:
        # baseOffset, the first 8 bytes, is outside the CRC.
        b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
        for ts, k, v, h in recs:
            b.append(ts, k, v, headers=h)
            expected.append((off, ts, k, v, h))
            off += 1
        b.close()
        buf = bytearray(b.buffer())
        struct.pack_into(">q", buf, 0, off - len(recs))
        data += buf
    with open(os.path.join(d, f"{base:020d}.log"), "wb") as f:
        f.write(data)
    return expected


@pytest.mark.parametrize("marker", [False, True], ids=["unclean", "with-marker"])
def test_opens_kafka_log_dir(tmp_path, clock, marker):
    root = str(tmp_path / "kafka-logs")
    expected = _write_kafka_dir(root, batches=_kafka_records())
    if marker:
        open(os.path.join(root, MARKER), "w").close()

    def check(store):
        assert store.list_topics() == ["orders"]
        assert store.partitions_for("orders") == [0]
        lg = store.partition("orders", 0)
        assert lg.log_start_offset == 0 and lg.log_end_offset == len(expected)
        got = [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
               for r in lg.iter_records()]
        assert got == expected
        assert [r.value for r in lg.read(13, max_records=2)] == [expected[13][3],
                                                                 expected[14][3]]
        tp = TopicPartition("orders", 0)
        r = store.offsets_for_times({tp: expected[11][1] - 1})[tp]
        assert (r.offset, r.timestamp) == (11, expected[11][1])

    with segstore.open(root, readonly=True) as ro:
        check(ro)
    with segstore.open(root, clock=clock) as s:
        check(s)
        assert s.topic_config("orders").overrides == {}
        assert s.append("orders", b"new", key=b"k").offset == len(expected)
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["orders"]
        assert s.partition("orders", 0).log_end_offset == len(expected) + 1


def test_kafka_log_dir_with_several_topics(tmp_path, clock):
    root = str(tmp_path / "kafka-logs")
    e0 = _write_kafka_dir(root, "pay.ments_v1", 0, _kafka_records(2, 3))
    e2 = _write_kafka_dir(root, "pay.ments_v1", 2, _kafka_records(1, 4), base=100)
    eo = _write_kafka_dir(root, "a-1", 0, _kafka_records(1, 2))  # a dash in the topic name
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == ["a-1", "pay.ments_v1"]
        # a broker's log dir holds only the partitions it hosts: 1 is elsewhere
        assert s.partitions_for("pay.ments_v1") == [0, 2]
        assert s.num_partitions("pay.ments_v1") == 3
        assert [r.offset for r in s.partition("pay.ments_v1", 0).iter_records()] == \
            [e[0] for e in e0]
        assert [r.value for r in s.partition("pay.ments_v1", 2).iter_records()] == \
            [e[3] for e in e2]
        assert s.partition("pay.ments_v1", 2).log_start_offset == 100
        with pytest.raises(UnknownTopicOrPartitionError, match="only the partitions it hosts"):
            s.partition("pay.ments_v1", 1)
        assert not os.path.exists(os.path.join(root, "pay.ments_v1-1"))
        assert [r.value for r in s.partition("a-1", 0).iter_records()] == [e[3] for e in eo]


def test_delete_topic_found_in_kafka_log_dir(tmp_path, clock):
    root = str(tmp_path / "kafka-logs")
    _write_kafka_dir(root, batches=_kafka_records(1, 2))
    with segstore.open(root, clock=clock) as s:
        s.delete_topic("orders")
        assert s.list_topics() == []
        assert not os.path.exists(os.path.join(root, "orders-0"))
    with segstore.open(root, clock=clock) as s:
        assert s.list_topics() == []


def test_alter_config_of_topic_found_in_kafka_log_dir(tmp_path, clock):
    root = str(tmp_path / "kafka-logs")
    _write_kafka_dir(root, batches=_kafka_records(1, 2))
    with segstore.open(root, clock=clock) as s:
        s.alter_topic_config("orders", set={"retention.ms": 99})
    with segstore.open(root, clock=clock) as s:
        assert s.topic_config("orders").overrides == {"retention.ms": 99}
        assert s.partitions_for("orders") == [0]
    with open(os.path.join(root, ".segstore", "topics", "orders.json")) as f:
        assert json.load(f)["partitions"] == 1


# ---------------------------------------------------------------------------------------------
# background services
# ---------------------------------------------------------------------------------------------

def _service_threads():
    return [t for t in threading.enumerate() if t.name == "segstore-services"]


def test_start_services_and_close_stops_them(root, clock):
    before = set(_service_threads())
    s = segstore.open(root, clock=clock)
    s.create_topic("t")
    s.start_services()
    s.start_services()  # idempotent: one thread
    mine = [t for t in _service_threads() if t not in before]
    assert len(mine) == 1 and mine[0].is_alive()
    s.close()
    assert not mine[0].is_alive()
    assert os.path.exists(os.path.join(root, MARKER))
    with segstore.open(root, clock=clock) as s2:
        assert s2.list_topics() == ["t"]


def test_metrics_shape(root, clock):
    with segstore.open(root, clock=clock) as s:
        s.create_topic("t", num_partitions=2)
        s.create_topic("u")
        s.partition("t", 1).append(b"abc")
        m = s.metrics()
        assert m["topics"] == 2 and m["partitions"] == 3
        assert m["segments"] == 3 and m["size-bytes"] == s.partition("t", 1).size_bytes > 0


@pytest.mark.parametrize("damage, reason", [
    (lambda text: b"\x84" + text[1:], "not UTF-8"),
    (lambda text: text[:-5], "not JSON"),
    (lambda text: b"[1, 2]", "not a JSON object"),
    (lambda text: text.replace(b'"partitions"', b'"parts"'), "no 'partitions' field"),
    (lambda text: text.replace(b'"partitions": 2', b'"partitions": true'), "'partitions' is true"),
    (lambda text: text.replace(b'"name": "t"', b'"name": "../x"'), "not a legal topic name"),
    (lambda text: text.replace(b'"config": {}', b'"config": []'), "'config' is []"),
])
def test_corrupt_topic_metadata_is_a_typed_error_naming_the_file(tmp_path, damage, reason):
    # A writer refuses the store; a reader sets the topic aside and raises when it is used.
    from segstore.errors import CorruptMetadataError
    root = str(tmp_path / "s")
    with segstore.open(root) as s:
        s.create_topic("t", 2)
    meta = os.path.join(root, ".segstore", "topics", "t.json")
    with open(meta, "rb") as f:
        text = f.read()
    with open(meta, "wb") as f:
        f.write(damage(text))
    with pytest.raises(CorruptMetadataError, match=re.escape(meta)) as e:
        segstore.open(root)
    assert reason in str(e.value) and e.value.file == meta
    with segstore.open(root, readonly=True) as reader:
        assert reader.list_topics() == []
        with pytest.raises(CorruptMetadataError, match=re.escape(meta)) as e:
            reader.partition("t", 0)
        assert reason in str(e.value)


def test_a_bad_config_value_in_topic_metadata_names_the_file(tmp_path):
    root = str(tmp_path / "s")
    with segstore.open(root) as s:
        s.create_topic("t", config={"segment.bytes": 1 << 20})
    meta = os.path.join(root, ".segstore", "topics", "t.json")
    with open(meta) as f:
        text = f.read()
    with open(meta, "w") as f:
        f.write(text.replace("1048576", '"abc"'))
    with pytest.raises(InvalidConfigError, match=re.escape(meta) + ".*segment.bytes"):
        segstore.open(root)
