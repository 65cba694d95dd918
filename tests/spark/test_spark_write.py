"""Batch writes through Spark: column combinations, Kafka's partitioner, all-or-nothing commits.

Partition choices are checked against kafka-python's murmur2 (an independent implementation of
Kafka's default partitioner); what lands is read back with segstore's record reader.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql import functions as F

import segstore
from segstore import _core, staged_commit
from segstore.errors import CorruptRecordError
from segstore.spark import staging
from segstore.spark.encode import BatchRouter, InputLayout, TopicInfo
from .sparkcheck import end_offsets, records, stage

PARTS = 4


def kafka_partition(key: bytes, n: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % n


def staged(root) -> list:
    """Every staged file left under the store's staging directory (abort markers aside)."""
    base = os.path.join(root, ".staging")
    return [os.path.join(d, n) for d, _, names in os.walk(base) for n in names
            if not n.endswith(staging.ABORTED)]


@pytest.fixture
def root(tmp_path):
    path = str(tmp_path / "store")
    with segstore.open(path) as store:
        store.create_topic("t", PARTS)
        store.create_topic("u", 2)
        store.create_topic("h", 1)
    return path


def frame(spark, n=200):
    return spark.range(n).select(
        F.concat(F.lit("user-"), F.col("id").cast("string")).alias("key"),
        F.concat(F.lit("value-"), F.col("id").cast("string")).cast("binary").alias("value"))


def save(df, root, **options):
    writer = df.write.format("segstore").mode("append")
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save(root)


def test_keyed_records_land_where_kafkas_partitioner_puts_them(spark, root):
    save(frame(spark), root, topic="t")
    got = records(root, "t")
    assert len(got) == 200
    assert sorted(v for _, _, v, _ in got) == sorted(b"value-%d" % i for i in range(200))
    for p, key, value, _ in got:
        assert p == kafka_partition(key, PARTS)
        assert value == b"value-" + key[len(b"user-"):]
    assert len({p for p, *_ in got}) == PARTS


def test_value_only_string_values_and_null_values(spark, root):
    df = spark.createDataFrame([("a",), (None,), ("c",)], "value string")
    save(df.coalesce(1), root, topic="h")
    assert [v for _, _, v, _ in records(root, "h")] == [b"a", None, b"c"]


def test_null_keys_stick_to_one_partition_per_batch(spark, root):
    df = spark.range(50).select(F.col("id").cast("string").alias("value"))
    save(df.coalesce(1), root, topic="t")
    got = records(root, "t")
    assert len(got) == 50
    assert len({p for p, *_ in got}) == 1  # one input batch: Kafka's sticky choice
    assert all(k is None for _, k, _, _ in got)


def test_topic_and_partition_columns_and_topic_option_override(spark, root):
    df = spark.createDataFrame(
        [("t", 3, "k1", "a"), ("u", None, "k2", "b"), ("t", None, "k3", "c"), ("u", 0, None, "d")],
        "topic string, partition int, key string, value string")
    save(df, root)
    assert sorted(records(root, "t")) == sorted([(3, b"k1", b"a", []),
                                                 (kafka_partition(b"k3", PARTS), b"k3", b"c", [])])
    assert sorted(records(root, "u")) == sorted([(kafka_partition(b"k2", 2), b"k2", b"b", []),
                                                 (0, None, b"d", [])])
    # The topic option wins over the column, as in Kafka's sink.
    save(df.where("partition IS NULL"), root, topic="h")
    assert sorted(v for _, _, v, _ in records(root, "h")) == [b"b", b"c"]


def test_headers_column(spark, root):
    df = spark.createDataFrame(
        [("k", "v1", [("a", b"1"), ("b", None)]), ("k", "v2", None)],
        "key string, value string, headers array<struct<key:string,value:binary>>")
    save(df.coalesce(1), root, topic="h")
    assert records(root, "h") == [(0, b"k", b"v1", [("a", b"1"), ("b", None)]),
                                  (0, b"k", b"v2", [])]


def test_extra_columns_are_ignored_and_binary_keys_work(spark, root):
    df = spark.createDataFrame([(b"\x00\xff", b"x", 42)], "key binary, value binary, extra int")
    save(df, root, topic="t")
    assert records(root, "t") == [(kafka_partition(b"\x00\xff", PARTS), b"\x00\xff", b"x", [])]


@pytest.mark.parametrize("ddl, row, fragment", [
    ("key string", ("k",), "required attribute 'value'"),
    ("value int", (1,), "value attribute type must be a string or binary"),
    ("value string, key int", ("v", 1), "key attribute type"),
    ("value string, partition long", ("v", 1), "partition attribute type must be an int"),
    ("value string, headers array<string>", ("v", ["x"]), "headers attribute type"),
])
def test_bad_input_columns(spark, root, ddl, row, fragment):
    with pytest.raises(Exception, match=fragment):
        save(spark.createDataFrame([row], ddl), root, topic="t")
    assert end_offsets(root, "t") == {p: 0 for p in range(PARTS)}


def test_topic_required_unknown_topic_and_bad_partition(spark, root):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="topic option required"):
        save(df, root)
    with pytest.raises(Exception, match="'nope' does not exist"):
        save(df, root, topic="nope")
    with pytest.raises(Exception, match="partition 9 does not exist"):
        save(spark.createDataFrame([("v", 9)], "value string, partition int"), root, topic="t")
    assert end_offsets(root, "t") == {p: 0 for p in range(PARTS)}
    assert staged(root) == []


def test_save_modes(spark, root):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("segstore").option("topic", "t").save(root)  # Spark's ErrorIfExists
    with pytest.raises(Exception, match="overwrite.*not supported"):
        df.write.format("segstore").mode("overwrite").option("topic", "t").save(root)
    assert end_offsets(root, "t") == {p: 0 for p in range(PARTS)}


def test_a_failed_task_leaves_every_partition_unchanged(spark, root):
    save(frame(spark, 40), root, topic="t")
    before = end_offsets(root, "t")

    @F.udf("string")
    def fail_on(key):
        if key == "user-150":
            raise ValueError("task failure on purpose")
        return key

    df = frame(spark, 200).repartition(4).withColumn("key", fail_on("key"))
    with pytest.raises(Exception, match="task failure on purpose"):
        save(df, root, topic="t")
    assert end_offsets(root, "t") == before
    assert staged(root) == []


def test_commit_waits_for_the_writer_lock_then_gives_up_cleanly(spark, root):
    df = spark.createDataFrame([("v",)], "value string")
    with segstore.open(root):  # this process holds the writer lock
        with pytest.raises(Exception, match="lockTimeoutMs"):
            save(df, root, topic="h", lockTimeoutMs="300")
    assert end_offsets(root, "h") == {0: 0}
    assert staged(root) == []
    save(df, root, topic="h")
    assert end_offsets(root, "h") == {0: 1}


def test_large_staged_files_are_adopted_as_segments(spark, root):
    """Files of at least ADOPT_MIN_BYTES become segments (renamed, not copied): each
    partition's records are in a segment of its own, read back like appended ones."""
    n = 40_000
    df = spark.range(n).select(
        F.concat(F.lit("user-"), F.col("id").cast("string")).alias("key"),
        F.concat(F.lit("value-"), F.col("id").cast("string"), F.lit("-" * 100)).alias("value"))
    save(df.coalesce(1), root, topic="u")
    save(df.coalesce(1), root, topic="u")  # a second commit: a second segment per partition
    got = records(root, "u")
    assert len(got) == 2 * n
    assert sorted(v for _, _, v, _ in got) == sorted(
        b"value-%d" % i + b"-" * 100 for i in range(n) for _ in range(2))
    with segstore.open(root) as store:
        for p in range(2):
            lg = store.partition("u", p)
            assert lg.verify() == []
            assert lg.log_end_offset == len([r for r in got if r[0] == p])
            assert len(lg.segments) == 2  # one adopted segment per commit
            assert lg.segments[1].base_offset == lg.log_end_offset // 2
    assert staged(root) == []


# -- the commit protocol without Spark --------------------------------------------------------

@pytest.fixture(params=["append", "adopt"])
def publish_path(request, monkeypatch):
    """Run a protocol test with tiny files appended (the default) or adopted."""
    if request.param == "adopt":
        monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)
    return request.param


def test_publish_appends_staged_files_and_cleans_up(root, publish_path):
    msgs = [stage(root, "j1", "t", 0, [b"a", b"b"]), stage(root, "j1", "t", 2, [b"c"]),
            stage(root, "j1", "t", 0, [b"d"])]
    with segstore.open(root) as store:
        store.partition("t", 0).append(b"existing")
        done = staging.publish(store, root, "j1", msgs)
    assert {(tp.partition, rng) for tp, rng in done.items()} == {(0, (1, 4)), (2, (0, 1))}
    assert [v for _, _, v, _ in records(root, "t")] == [b"existing", b"a", b"b", b"d", b"c"]
    assert not os.path.exists(staging.job_dir(root, "j1"))


def test_publish_rolls_back_every_partition_when_one_append_fails(root, publish_path):
    good = stage(root, "j2", "t", 0, [b"a", b"b"])
    bad = stage(root, "j2", "t", 1, [b"c"])
    path = os.path.join(staging.job_dir(root, "j2"), bad.files[0].name)
    with open(path, "r+b") as f:  # flip a payload byte: the CRC check at append must fail
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    with segstore.open(root) as store:
        with pytest.raises(CorruptRecordError):
            staging.publish(store, root, "j2", [good, bad])
        assert [store.partition("t", p).log_end_offset for p in range(PARTS)] == [0] * PARTS
    assert not os.path.exists(os.path.join(staging.job_dir(root, "j2"), staging.MANIFEST))


def test_an_interrupted_commit_is_rolled_back_by_the_next_one(root, monkeypatch, publish_path):
    first = stage(root, "dead", "t", 0, [b"x1", b"x2"])
    second = stage(root, "dead", "t", 1, [b"y"])
    calls = []
    real = staging._publish_files

    def crash_on_second(lg, files):
        calls.append(files)
        if len(calls) == 2:
            raise SystemExit("the committing process died here")  # skips the rollback path
        return real(lg, files)

    monkeypatch.setattr(staging, "_publish_files", crash_on_second)
    real_roll_back = staging._roll_back
    monkeypatch.setattr(staging, "_roll_back", lambda store, manifest: [])  # died: no rollback
    with segstore.open(root) as store:
        with pytest.raises(SystemExit):
            staging.publish(store, root, "dead", [first, second])
    monkeypatch.setattr(staging, "_publish_files", real)
    monkeypatch.setattr(staging, "_roll_back", real_roll_back)
    with open(os.path.join(staging.job_dir(root, "dead"), staging.MANIFEST), "w") as f:
        # The crash also lost the manifest removal: recreate what publish had written.
        import json
        json.dump({"job": "dead", "partitions": {
            "t-0": {"topic": "t", "partition": 0, "before": 0, "records": 2},
            "t-1": {"topic": "t", "partition": 1, "before": 0, "records": 1}},
            "files": [["dead", m.files[0].name] for m in (first, second)]}, f)
    assert end_offsets(root, "t")[0] == 2  # half a commit is visible until recovery
    later = stage(root, "next", "t", 3, [b"z"])
    with segstore.open(root) as store:
        staging.publish(store, root, "next", [later])
    assert end_offsets(root, "t") == {0: 0, 1: 0, 2: 0, 3: 1}
    assert not os.path.exists(staging.job_dir(root, "dead"))


def test_a_commit_that_takes_a_partition_offline_is_undone_by_the_next_open(root, monkeypatch,
                                                                           publish_path):
    """A disk error in one partition's commit (its fsync fails: that log goes offline) rolls
    the other partitions back at once; an offline one that holds part of the commit cannot be
    truncated, so the manifest stays, and the next commit, in a store opened afresh, rolls it
    back too."""
    import errno

    from segstore import flusher
    from segstore.errors import KafkaStorageError

    first = stage(root, "io", "t", 0, [b"x1", b"x2"])
    second = stage(root, "io", "t", 1, [b"y"])
    # Partition 1's files: its directory's (appended), or its staged file (adopted).
    failing = (os.path.join(root, "t-1") + os.sep,
               os.path.join(staging.job_dir(root, "io"), second.files[0].name))
    real_sync, real_datasync = flusher._fsync_and_close, os.fdatasync

    def t1(fd):
        return os.readlink(f"/proc/self/fd/{fd}").startswith(failing)

    def eio_fsync(fd):
        if t1(fd):
            os.close(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_sync(fd)

    def eio_fdatasync(fd):
        if t1(fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_datasync(fd)

    monkeypatch.setattr(flusher, "_fsync_and_close", eio_fsync)
    monkeypatch.setattr(os, "fdatasync", eio_fdatasync)
    with segstore.open(root) as store:
        with pytest.raises(KafkaStorageError):
            staging.publish(store, root, "io", [first, second])
        assert store.partition("t", 1).offline
        assert store.partition("t", 0).log_end_offset == 0   # rolled back at once
        # Appended, partition 1 holds the batch it could not sync: its manifest stays.
        # Adopted, the failure came before the file joined the log: nothing to undo.
        kept = store.partition("t", 1).log_end_offset
    monkeypatch.undo()
    manifest = os.path.join(staging.job_dir(root, "io"), staging.MANIFEST)
    assert os.path.exists(manifest) == (kept > 0)
    assert (kept > 0) == (publish_path == "append")
    if not kept:
        staging.discard_job(root, "io", aborted=True)   # Spark's abort() after the failure
    later = stage(root, "next", "t", 3, [b"z"])
    with segstore.open(root) as store:
        staging.publish(store, root, "next", [later])
    assert end_offsets(root, "t") == {0: 0, 1: 0, 2: 0, 3: 1}
    assert not os.path.exists(staging.job_dir(root, "io"))


def stage_files(root, job, topic, files_per_partition, n=300):
    """Tasks staging ``files_per_partition`` {partition: count} files, each written by a
    Stager of its own (so a partition gets several files in one commit)."""
    msgs = []
    for partition, count in files_per_partition.items():
        for i in range(count):
            stager = staging.Stager(root, job, staging.task_tag())
            values = [(b"p%d-f%d-%d" % (partition, i, k)).ljust(100, b".") for k in range(n)]
            for start in range(0, n, 100):
                chunk = values[start:start + 100]
                stager.add(topic, partition, _core.encode_batch(chunk), len(chunk))
            msgs.append(staging.StagedCommitMessage(job=job, task=stager.task,
                                                    files=stager.finish()))
    return msgs


def damage(path, kind):
    """Alter a staged file between its task and the commit."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        if kind == "torn":
            f.truncate(len(data) - 100)
        elif kind == "flipped":  # one bit of a record in the middle of the file
            data[len(data) // 2] ^= 0x04
            f.seek(0)
            f.write(data)
        elif kind == "replaced":  # a valid file, but not what the task reported
            f.seek(0)
            f.truncate()
            f.write(_core.encode_batch([b"other"] * 3))


@pytest.mark.parametrize("kind", ["torn", "flipped", "replaced"])
def test_a_staged_file_altered_before_the_commit_is_refused(root, monkeypatch, kind):
    """Damage between task and commit to a file that would be adopted (the second of a run of
    two) raises a typed error; no partition changes, whichever were published first."""
    monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)
    msgs = stage_files(root, "dmg", "t", {0: 1, 1: 2, 2: 1})
    victim = [f for m in msgs for f in m.files if f.partition == 1][1]
    damage(os.path.join(staging.job_dir(root, "dmg"), victim.name), kind)
    with segstore.open(root) as store:
        store.partition("t", 3).append(b"before")
        with pytest.raises(CorruptRecordError):
            staging.publish(store, root, "dmg", msgs)
        assert [store.partition("t", p).log_end_offset for p in range(PARTS)] == [0, 0, 0, 1]
        assert all(store.partition("t", p).verify() == [] for p in range(PARTS))
    assert not os.path.exists(os.path.join(staging.job_dir(root, "dmg"), staging.MANIFEST))


@pytest.mark.parametrize("touched", [False, True])
def test_crcs_are_rechecked_only_for_files_changed_since_their_task(root, monkeypatch, touched):
    """A staged file with its task's fingerprint (inode, size, change time) is adopted after a
    header walk; one whose fingerprint changed (here only its mode) gets the full CRC check,
    and a sound file still goes in."""
    monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)
    from segstore.log import PartitionLog

    calls = []
    real = PartitionLog.adopt_segment_files

    def spy(self, paths, *, validate_crc=True):
        calls.append(validate_crc)
        return real(self, paths, validate_crc=validate_crc)

    monkeypatch.setattr(PartitionLog, "adopt_segment_files", spy)
    msgs = stage_files(root, "fp", "t", {0: 2, 1: 1})
    if touched:
        os.chmod(os.path.join(staging.job_dir(root, "fp"), msgs[1].files[0].name), 0o644)
    with segstore.open(root) as store:
        staging.publish(store, root, "fp", msgs)
        assert [store.partition("t", p).log_end_offset for p in range(2)] == [600, 300]
    assert sorted(calls) == ([False, True] if touched else [False, False])


def test_a_partitions_files_are_adopted_as_one_run(root, monkeypatch):
    """Two files of a partition are adopted in one call, one segment each, in message order."""
    monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)
    from segstore.log import PartitionLog

    calls = []
    real = PartitionLog.adopt_segment_files
    monkeypatch.setattr(PartitionLog, "adopt_segment_files",
                        lambda self, paths, **kw: calls.append(len(paths)) or
                        real(self, paths, **kw))
    msgs = stage_files(root, "run", "t", {0: 2, 1: 1})
    with segstore.open(root) as store:
        done = staging.publish(store, root, "run", msgs)
        assert {tp.partition: rng for tp, rng in done.items()} == {0: (0, 600), 1: (0, 300)}
        for p, n_segs in ((0, 2), (1, 1)):
            lg = store.partition("t", p)
            assert len(lg.segments) == n_segs and lg.verify() == []
            assert all(s.offset_index.entries > 0 for s in lg.segments)
    assert sorted(calls) == [1, 2]
    got = records(root, "t")
    assert [v for p, _, v, _ in got if p == 0] == \
        [(b"p0-f%d-%d" % (i, k)).ljust(100, b".") for i in range(2) for k in range(300)]
    assert not os.path.exists(staging.job_dir(root, "run"))


def test_a_commit_that_died_with_a_lost_rename_is_rolled_back(root, monkeypatch):
    """A crash before a run's directory fsync may keep the second file's segment but not the
    first's (renames are not ordered until then): the next commit still rolls the partition
    back to its manifest offset."""
    monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)
    msgs = stage_files(root, "dead", "t", {0: 2})
    with segstore.open(root) as store:
        staging.publish(store, root, "dead", msgs)
        lg = store.partition("t", 0)
        first = lg.segments[0]
        paths = [first.log_path, *first._index_paths]
    # The state on disk after the crash: the manifest still there, the first rename lost.
    os.makedirs(staging.job_dir(root, "dead"), exist_ok=True)
    with open(os.path.join(staging.job_dir(root, "dead"), staging.MANIFEST), "w") as f:
        import json
        json.dump({"job": "dead", "partitions": {
            "t-0": {"topic": "t", "partition": 0, "before": 0, "records": 600}}}, f)
    for p in paths:
        os.unlink(p)
    from segstore.checkpoint import CLEAN_SHUTDOWN_FILE
    os.unlink(os.path.join(root, CLEAN_SHUTDOWN_FILE))
    assert end_offsets(root, "t")[0] == 600  # the second segment alone, after a gap
    later = stage(root, "next", "t", 3, [b"z"])
    with segstore.open(root) as store:
        staging.publish(store, root, "next", [later])
        assert store.partition("t", 0).verify() == []
    assert end_offsets(root, "t") == {0: 0, 1: 0, 2: 0, 3: 1}
    assert records(root, "t") == [(3, None, b"z", [])]


def test_abort_stops_straggling_tasks_and_old_garbage_is_collected(root):
    msg = stage(root, "gone", "t", 0, [b"a"])
    staging.discard_job(root, "gone", aborted=True)
    assert staged(root) == []
    with pytest.raises(staging.JobAbortedError):
        stage(root, "gone", "t", 1, [b"late"])  # a task still running after the abort
    stage(root, "old", "t", 0, [b"x"])  # a killed driver's staging, never committed
    old = time.time() - staged_commit.STALE_SECONDS - 10
    for d, _, names in os.walk(os.path.join(root, ".staging")):
        for p in [d] + [os.path.join(d, n) for n in names]:
            os.utime(p, (old, old))
    fresh = stage(root, "fresh", "t", 2, [b"y"])
    with segstore.open(root) as store:
        staging.publish(store, root, "fresh", [fresh])
    assert os.listdir(os.path.join(root, ".staging")) == []
    assert end_offsets(root, "t") == {0: 0, 1: 0, 2: 1, 3: 0}
    assert msg.files  # the aborted job's message is simply never committed


def test_router_groups_rows_by_partition(root):
    import pyarrow as pa

    batch = pa.record_batch({"key": pa.array([b"a", b"b", None, b"a"]),
                             "value": pa.array(["1", "2", "3", "4"])})
    router = BatchRouter(InputLayout(value="value", key="key"), "t",
                         lambda t: TopicInfo(PARTS, 1 << 20, 1 << 20, 0))
    out = list(router.route(batch))
    assert sum(n for *_, n in out) == 4
    by_partition = {}
    for topic, p, data, n in out:
        recs = _core.decode_records(data)
        by_partition[p] = [(r.key, r.value) for r in recs]
    keyed = [(b"a", b"1"), (b"b", b"2"), (b"a", b"4")]
    for p, recs in by_partition.items():
        assert [r for r in recs if r[0] is not None] == [
            kv for kv in keyed if kafka_partition(kv[0], PARTS) == p]
    assert sum(r == (None, b"3") for recs in by_partition.values() for r in recs) == 1


@pytest.mark.parametrize("with_headers", [False, True])
def test_router_matches_a_plain_model_across_topics_and_partitions(root, with_headers):
    """Two topics with different partition counts, a partition column with gaps, keyed and
    null-keyed rows: every row lands, in input order, where a row-by-row model puts it."""
    import random

    import pyarrow as pa

    rnd = random.Random(5)
    n = 3000
    topics = [rnd.choice(["a", "bb"]) for _ in range(n)]
    counts = {"a": 3, "bb": 40}
    keys = [None if rnd.random() < 0.2 else b"k%d" % rnd.randrange(500) for _ in range(n)]
    parts = [rnd.randrange(counts[t]) if rnd.random() < 0.3 else None for t in topics]
    values = [b"v%d" % i for i in range(n)]
    cols = {"topic": pa.array(topics), "key": pa.array(keys, pa.binary()),
            "partition": pa.array(parts, pa.int32()), "value": pa.array(values, pa.binary())}
    if with_headers:
        cols["headers"] = pa.array([[{"key": "i", "value": b"%d" % i}] for i in range(n)])
    router = BatchRouter(
        InputLayout(value="value", key="key", topic="topic", partition="partition",
                    headers="headers" if with_headers else None), None,
        lambda t: TopicInfo(counts[t], 1 << 20, 1 << 20, 0), sticky_seed=0)
    got = {}
    for topic, p, data, count in router.route(pa.record_batch(cols)):
        recs = _core.decode_records(data)
        assert len(recs) == count and (topic, p) not in got
        got[(topic, p)] = [r.value for r in recs]
        if with_headers:
            assert all(r.headers == (("i", r.value[1:]),) for r in recs)
    want = {}
    for t, k, p, v in zip(topics, keys, parts, values):
        if p is None:
            p = kafka_partition(k, counts[t]) if k is not None else 1 % counts[t]
        want.setdefault((t, p), []).append(v)
    assert got == want


def test_router_single_topic_keys_and_sticky_null_keys_across_batches(root):
    """The one-topic, keyed path: murmur2 for keys; null keys share one partition per batch,
    which moves on with the next batch."""
    import pyarrow as pa

    router = BatchRouter(InputLayout(value="value", key="key"), "t",
                         lambda t: TopicInfo(PARTS, 1 << 20, 1 << 20, 0), sticky_seed=7)
    null_parts = []
    for b in range(3):
        keys = [None if i % 3 == 0 else b"k%d-%d" % (b, i) for i in range(60)]
        batch = pa.record_batch({"key": pa.array(keys, pa.binary()),
                                 "value": pa.array([b"v%d" % i for i in range(60)])})
        got = {p: [(r.key, r.value) for r in _core.decode_records(data)]
               for _, p, data, _ in router.route(batch)}
        want = {}
        for i, k in enumerate(keys):
            if k is not None:
                want.setdefault(kafka_partition(k, PARTS), []).append((k, b"v%d" % i))
        nulls = {p for p, recs in got.items() for k, _ in recs if k is None}
        assert len(nulls) == 1
        null_parts.append(nulls.pop())
        assert {p: [r for r in recs if r[0] is not None] for p, recs in got.items()
                if any(r[0] is not None for r in recs)} == want
    assert null_parts == [(7 + b + 1) % PARTS for b in range(3)]


# -- staging files ----------------------------------------------------------------------------

def test_stager_coalesces_writes_starts_writeback_and_syncs_every_file(root, monkeypatch):
    """A partition's batches go out COALESCE_BYTES at a time in one writev, each write starts
    its range's writeback at once, finish() writes the rest, starts every file's writeback and
    then fdatasyncs every file, and the files hold exactly the bytes staged, in order."""
    started, synced, writes = [], [], []
    monkeypatch.setattr(staging, "start_writeback",
                        lambda fd, off, n: started.append((fd, off, n)) or True)
    real_sync, real_writev = os.fdatasync, os.writev
    monkeypatch.setattr(staging.os, "fdatasync", lambda fd: synced.append(fd) or real_sync(fd))
    monkeypatch.setattr(staging.os, "writev",
                        lambda fd, bufs: writes.append((fd, len(bufs))) or real_writev(fd, bufs))
    stager = staging.Stager(root, "wb", staging.task_tag())
    chunks = [_core.encode_batch([bytes([65 + i]) * 1000] * 300) for i in range(16)]  # ~300 kB
    size = len(chunks[0])
    per_write = -(-staging.COALESCE_BYTES // size)  # chunks gathered before the first write
    assert all(len(c) == size for c in chunks) and per_write < 16
    for c in chunks:
        for p in (0, 1):
            stager.add("t", p, c, 300)
    small = _core.encode_batch([b"small"])
    stager.add("t", 3, small, 1)
    fds = {p: e.fd for (_, p), e in stager._open.items()}
    assert writes == [(fds[0], per_write), (fds[1], per_write)]  # nothing else written yet
    files = stager.finish()
    assert sorted(synced) == sorted(fds.values())  # every file, whatever its size
    assert writes[2:] == [(fds[0], 16 - per_write), (fds[1], 16 - per_write), (fds[3], 1)]
    first, rest = per_write * size, (16 - per_write) * size
    # One writeback per coalesced write, then finish() starts every file's rest before syncing.
    assert started == [(fds[0], 0, first), (fds[1], 0, first), (fds[0], first, rest),
                       (fds[1], first, rest), (fds[3], 0, len(small))]
    assert first >= staging.WRITEBACK_BYTES
    assert [(f.partition, f.records, f.size) for f in files] == [
        (0, 4800, 16 * size), (1, 4800, 16 * size), (3, 1, len(small))]
    for f in files[:2]:
        with open(os.path.join(stager.dir, f.name), "rb") as fh:
            assert fh.read() == b"".join(chunks)


def test_stager_survives_short_writes_and_caps_each_writev(root, monkeypatch):
    """Short writev returns are continued where they stopped, and no call gets more than
    MAX_IOVECS buffers (the kernel's IOV_MAX is 1024)."""
    counts = []

    def short_writev(fd, bufs):
        counts.append(len(bufs))
        data = b"".join(bytes(b) for b in bufs)
        return os.write(fd, data[:7777])  # at most 7,777 bytes per call

    monkeypatch.setattr(staging.os, "writev", short_writev)
    stager = staging.Stager(root, "short", staging.task_tag())
    batches = [_core.encode_batch([b"v%d" % i]) for i in range(1200)]
    for b in batches:
        stager.add("t", 0, b, 1)
    (f,) = stager.finish()
    assert max(counts) <= staging.MAX_IOVECS
    assert (f.records, f.size) == (1200, sum(len(b) for b in batches))
    with open(os.path.join(stager.dir, f.name), "rb") as fh:
        assert fh.read() == b"".join(batches)


def test_stager_bounds_what_it_gathers_over_many_partitions(root, monkeypatch):
    """Gathered bytes over all files stay under MAX_PENDING_BYTES: past it, the file holding
    the most is written first. Every file still ends with exactly its batches, in order."""
    monkeypatch.setattr(staging, "MAX_PENDING_BYTES", 50_000)
    written = []
    real_writev = os.writev
    monkeypatch.setattr(staging.os, "writev",
                        lambda fd, bufs: written.append(fd) or real_writev(fd, bufs))
    stager = staging.Stager(root, "many", staging.task_tag())
    sent = {p: [] for p in range(40)}
    rng = random.Random(7)
    for i in range(400):
        p = rng.randrange(40)
        b = _core.encode_batch([b"%d-%d" % (p, i) * rng.randrange(1, 300)])
        sent[p].append(b)
        stager.add("t", p, b, 1)
        assert stager._pending_bytes == sum(e.pending_bytes for e in stager._open.values())
        assert stager._pending_bytes <= staging.MAX_PENDING_BYTES
    assert written  # the cap forced writes long before any file reached COALESCE_BYTES
    files = {f.partition: f for f in stager.finish()}
    assert stager._pending_bytes == 0
    for p, batches in sent.items():
        if not batches:
            continue
        with open(os.path.join(stager.dir, files[p].name), "rb") as fh:
            assert fh.read() == b"".join(batches)
        assert files[p].records == len(batches)


@pytest.mark.usefixtures("fresh_buffer_pool")
@pytest.mark.parametrize("end", ["finish", "discard"])
def test_stager_holds_pooled_encoder_output_only_until_written(root, monkeypatch, end):
    """Gathered batches are the encoder's own output (read-only views of pooled blocks), kept
    without a copy: the blocks stay in use while gathered, are written whole through short
    writes, and go back to the pool once finish() or discard() is done with them."""
    from segstore import buffer_pool
    from segstore.columns import BinaryColumn

    def short_writev(fd, bufs):  # at most three views, and short of their end by 5 bytes
        data = b"".join(bytes(b) for b in bufs[:3])
        return os.write(fd, data[:len(data) - 5] if len(data) > 5 else data)

    monkeypatch.setattr(staging.os, "writev", short_writev)
    stager = staging.Stager(root, "pooled", staging.task_tag())
    before = buffer_pool.stats().in_use_bytes
    sent = {0: [], 1: []}
    for i in range(6):
        values = BinaryColumn.from_pylist([bytes([i]) * 1200] * 1000)  # 1.2 MB encoded
        enc = _core.encode_columns(values, None, 1_700_000_000_000 + i)
        assert isinstance(enc.data, memoryview) and enc.data.readonly
        sent[i % 2].append(bytes(enc.data))
        stager.add("t", i % 2, enc.data, 1000)
        del enc
    held = buffer_pool.stats().in_use_bytes - before
    gathered = sum(len(b) for bs in sent.values() for b in bs)
    assert stager._pending_bytes == gathered < staging.COALESCE_BYTES * 2  # nothing written
    assert gathered <= held <= 2 * gathered  # the views keep their blocks, and only them
    if end == "discard":
        stager.discard()
        assert staged(root) == []
    else:
        files = {f.partition: f for f in stager.finish()}
        for p, batches in sent.items():
            assert (files[p].records, files[p].size) == (3000, sum(map(len, batches)))
            with open(os.path.join(stager.dir, files[p].name), "rb") as fh:
                assert fh.read() == b"".join(batches)
    assert buffer_pool.stats().in_use_bytes == before


def test_start_writeback_on_a_real_file(tmp_path):
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b"x" * 5000)
        f.flush()
        ok = staging.start_writeback(f.fileno(), 0, 5000)
    assert ok == (staging._sync_file_range is not None)
    assert staging.start_writeback(-1, 0, 1) is False  # a bad descriptor is not an error


def test_stager_without_sync_file_range_syncs_files_in_parallel(root, monkeypatch):
    monkeypatch.setattr(staging, "_sync_file_range", None)
    synced = []
    real_sync = os.fdatasync
    monkeypatch.setattr(staging.os, "fdatasync", lambda fd: synced.append(fd) or real_sync(fd))
    msgs = []
    stager = staging.Stager(root, "nosfr", staging.task_tag())
    for p in range(PARTS):
        stager.add("t", p, _core.encode_batch([b"v%d" % p]), 1)
    assert staging.start_writeback(0, 0, 1) is False
    files = stager.finish()
    assert len(synced) == PARTS and len(files) == PARTS
    msgs.append(staging.StagedCommitMessage(job="nosfr", task=stager.task, files=files))
    with segstore.open(root) as store:
        staging.publish(store, root, "nosfr", msgs)
    assert end_offsets(root, "t") == {p: 1 for p in range(PARTS)}


def test_a_failed_finish_still_lets_discard_close_and_delete(root, monkeypatch):
    stager = staging.Stager(root, "ff", staging.task_tag())
    for p in range(2):
        stager.add("t", p, _core.encode_batch([b"v"]), 1)

    def fail(fd):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(staging.os, "fdatasync", fail)
    with pytest.raises(OSError):
        stager.finish()
    stager.discard()
    assert staged(root) == []


# -- the topic option's metadata comes from planning ------------------------------------------

def test_tasks_use_the_planning_topic_info_without_opening_the_store(root, monkeypatch):
    import pyarrow as pa

    from segstore.spark import writer
    from segstore.spark.options import WriteOptions

    opts = WriteOptions(path=root, topic="t")
    info = writer.check_topic(opts)
    assert info == TopicInfo(PARTS, info.max_batch_bytes, info.max_message_bytes, 0)
    w = writer.SegstoreWriter(opts, InputLayout(value="value", key="key"), info)

    def no_open(*a, **k):
        raise AssertionError("the task opened the store")

    monkeypatch.setattr(writer, "open_store", no_open)
    batch = pa.record_batch({"key": pa.array([b"a", b"b"]), "value": pa.array([b"1", b"2"])})
    msg = w.write(iter([batch]))
    assert sum(f.records for f in msg.files) == 2
    w.commit([msg])
    assert sum(end_offsets(root, "t").values()) == 2
    assert writer.check_topic(WriteOptions(path=root)) is None
    # A store removed after planning is still reported as missing, not recreated.
    import shutil

    shutil.rmtree(root)
    with pytest.raises(writer.InvalidOptionError, match="does not exist"):
        writer.SegstoreWriter(opts, InputLayout(value="value", key="key"), info).write(
            iter([batch]))
    assert not os.path.exists(root)


def test_a_compacted_topic_refuses_keyless_rows(spark, tmp_path):
    """Kafka's broker refuses records without a key for a compacted topic; so does the sink,
    in the task, and the failed job appends nothing."""
    root = str(tmp_path / "c")
    with segstore.open(root) as store:
        store.create_topic("c", 2, {"cleanup.policy": "compact"})
    rows = spark.createDataFrame([("a", "1"), (None, "2"), ("b", "3")], "key string, value string")
    with pytest.raises(Exception, match="Compacted topic cannot accept message without key"):
        save(rows, root, topic="c")
    with pytest.raises(Exception, match="Compacted topic cannot accept message without key"):
        save(spark.createDataFrame([("1",)], "value string"), root, topic="c")
    assert end_offsets(root, "c") == {0: 0, 1: 0}
    save(rows.where(F.col("key").isNotNull()), root, topic="c")
    assert sum(end_offsets(root, "c").values()) == 2
