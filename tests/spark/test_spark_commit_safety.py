"""The commit protocol's failure paths: what a failed, dead or raced commit leaves behind.

Each test drives the sink's pieces as ``write_task`` and ``commit`` do (BatchRouter, Stager,
publish) and injects the failure at the step in question; what lands is read back with
segstore's record reader and compared with what Spark's retry or replay must leave: every
committed record once, no record of a failed commit.
"""

from __future__ import annotations

import errno
import json
import os

import pyarrow as pa
import pytest

import segstore
from segstore import _core, checkpoint, flusher
from segstore.commit_ledger import CommitLedger
from segstore.errors import CorruptRecordError, KafkaStorageError, RecordTooLargeError
from segstore.spark import staging
from segstore.spark.encode import BatchRouter, InputLayout, TopicInfo
from .sparkcheck import end_offsets, records, stage


@pytest.fixture
def root(tmp_path):
    path = str(tmp_path / "store")
    with segstore.open(path) as store:
        store.create_topic("t", 2)
        store.create_topic("c", 1, config={"cleanup.policy": "compact"})
    return path


def manifest_path(root, job):
    return os.path.join(staging.job_dir(root, job), staging.MANIFEST)


def die_after_publishing(root, job, messages, monkeypatch, **kw):
    """Publish ``messages`` and leave the disk as a process that died right before removing
    the manifest would: records appended, manifest there."""
    written = {}
    real_unlink = os.unlink

    def keep_manifest(path, *a, **k):
        if path == manifest_path(root, job):
            with open(path, encoding="utf-8") as f:
                written["manifest"] = f.read()
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(staging.os, "unlink", keep_manifest)
    with segstore.open(root) as store:
        staging.publish(store, root, job, messages, **kw)
    monkeypatch.setattr(staging.os, "unlink", real_unlink)
    os.makedirs(staging.job_dir(root, job), exist_ok=True)
    with open(manifest_path(root, job), "w", encoding="utf-8") as f:
        f.write(written["manifest"])


# -- records with headers ----------------------------------------------------------------------

def test_rows_with_headers_are_split_into_batches_within_max_message_bytes():
    info = TopicInfo(partitions=1, max_batch_bytes=1000, max_message_bytes=1000, codec=0)
    values = [bytes([65 + i]) * 458 for i in range(5)]
    headers = pa.array([[{"key": "k", "value": b"v"}]] * 5,
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    batch = pa.RecordBatch.from_arrays([pa.array(values), headers], names=["value", "headers"])
    router = BatchRouter(InputLayout(value="value", headers="headers"), "t", lambda t: info)
    [(_, _, data, count)] = list(router.route(batch))
    scan = _core.scan_batches(data, raise_on_corrupt=True)
    assert count == 5 and int(scan.batches["records_count"].sum()) == 5
    assert int(scan.batches["size"].max()) <= 1000  # each under the topic's max.message.bytes
    assert len(scan.batches) >= 3  # two of these records at most per batch
    assert [r.value for r in _core.decode_records(data)] == values


def test_a_record_with_headers_over_max_message_bytes_fails_in_the_task():
    info = TopicInfo(partitions=1, max_batch_bytes=1000, max_message_bytes=1000, codec=0)
    headers = pa.array([[{"key": "k", "value": b"v"}]],
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    batch = pa.RecordBatch.from_arrays([pa.array([b"x" * 990]), headers],
                                       names=["value", "headers"])
    router = BatchRouter(InputLayout(value="value", headers="headers"), "t", lambda t: info)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes=1000"):
        list(router.route(batch))


# -- damaged staging ---------------------------------------------------------------------------

def test_a_staged_file_emptied_before_the_commit_is_refused(root):
    good = stage(root, "j", "t", 0, [b"a", b"b"])
    emptied = stage(root, "j", "t", 1, [b"c", b"d", b"e"])
    os.truncate(os.path.join(staging.job_dir(root, "j"), emptied.files[0].name), 0)
    with segstore.open(root) as store:
        with pytest.raises(CorruptRecordError, match="is empty, but its task wrote 3 records"):
            staging.publish(store, root, "j", [good, emptied])
    assert end_offsets(root, "t") == {0: 0, 1: 0}


# -- rollback ----------------------------------------------------------------------------------

def test_a_rollback_that_cannot_truncate_one_partition_still_truncates_the_others(
        root, monkeypatch):
    """t-0's fsync fails mid-commit (the log goes offline, so its rollback fails too): t-1,
    published fine, is still rolled back at once, and the kept manifest lets the next open
    finish t-0's."""
    msgs = [stage(root, "io", "t", 0, [b"x1", b"x2"]), stage(root, "io", "t", 1, [b"y"])]
    real_sync = flusher._fsync_and_close
    t0 = os.path.join(root, "t-0") + os.sep

    def eio(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(t0):
            os.close(fd)
            raise OSError(errno.EIO, "EIO")
        real_sync(fd)

    monkeypatch.setattr(flusher, "_fsync_and_close", eio)
    with segstore.open(root) as store:
        with pytest.raises(KafkaStorageError):
            staging.publish(store, root, "io", msgs)
        assert store.partition("t", 0).offline
        assert store.partition("t", 1).log_end_offset == 0  # not left for a later commit
    monkeypatch.setattr(flusher, "_fsync_and_close", real_sync)
    assert os.path.exists(manifest_path(root, "io"))
    with segstore.open(root):
        pass  # a writable open settles what is left
    assert end_offsets(root, "t") == {0: 0, 1: 0}
    assert not os.path.exists(manifest_path(root, "io"))


# -- dead commits are settled by the next writable open ----------------------------------------

def test_a_writable_open_rolls_back_a_dead_commit_and_a_read_only_one_does_not(
        root, monkeypatch):
    die_after_publishing(root, "dead", [stage(root, "dead", "t", 0, [b"a", b"b"])], monkeypatch)
    with segstore.open(root, readonly=True) as store:
        assert store.partition("t", 0).log_end_offset == 2  # a reader changes nothing
    assert os.path.exists(manifest_path(root, "dead"))
    with segstore.open(root) as store:
        assert store.partition("t", 0).log_end_offset == 0
    assert not os.path.exists(staging.job_dir(root, "dead"))


def test_a_compaction_after_a_dead_commit_keeps_the_committed_values(root, monkeypatch):
    """Compaction on its own (no Spark commit in between) must never see a dead commit's
    records: they would replace the committed values of the same keys, and the rollback then
    remove both."""
    keys = [b"k%d" % i for i in range(10)]
    with segstore.open(root) as store:
        lg = store.partition("c", 0)
        for k in keys:
            lg.append(b"committed-" + k, key=k)
        lg.roll()
    dead = [stage(root, "dead", "c", 0, [b"dead-" + k for k in keys], keys),
            stage(root, "dead", "c", 0, [b"dead-z"], [b"z"])]
    monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)  # adopted: the first file is sealed
    die_after_publishing(root, "dead", dead, monkeypatch)
    with segstore.open(root) as store:
        store.compact("c", 0, force=True)
    got = {k: v for _, k, v, _ in records(root, "c")}
    assert got == {k: b"committed-" + k for k in keys}  # the plain replay of what committed


def test_a_dead_stream_commit_leaves_the_restarted_querys_staging_alone(root, monkeypatch):
    """A stream reuses one staging directory: after its commit of batch 7 died, the restarted
    query stages the replay there. Another job's commit settles the dead one, deleting only
    the files the dead commit named, and the replay then commits once."""
    loc = "/checkpoints/q"
    job = "stream-q"
    # It died before its ledger named the batch.
    monkeypatch.setattr(CommitLedger, "record", lambda *a: None)
    die_after_publishing(root, job, [stage(root, job, "t", 0, [b"r1", b"r2"])], monkeypatch,
                         ledger=CommitLedger(root, loc), batch_id=7)
    monkeypatch.undo()
    replay = stage(root, job, "t", 0, [b"r1", b"r2"])
    other = stage(root, "batch-job", "t", 1, [b"o"])
    with segstore.open(root) as store:
        staging.publish(store, root, "batch-job", [other])
    assert os.listdir(staging.job_dir(root, job)) == [replay.files[0].name]
    with segstore.open(root) as store:
        staging.publish(store, root, job, [replay], ledger=CommitLedger(root, loc), batch_id=7)
    assert [(p, v) for p, _, v, _ in records(root, "t")] == [(0, b"r1"), (0, b"r2"), (1, b"o")]


# -- the stream's ledger -----------------------------------------------------------------------

@pytest.mark.parametrize("step", ["before the rename", "after the rename"])
def test_a_failed_ledger_write_leaves_the_batch_committed_exactly_once(root, monkeypatch, step):
    """Before its rename the ledger does not name the batch: the records are rolled back and
    the replay appends them. After it (the directory fsync failed) the ledger may name it: the
    records and the manifest stay, and the replay is skipped. Once either way."""
    loc, job = "/checkpoints/ledger", "stream-l"
    real_fsync_dir, real_rename = checkpoint.fsync_dir, os.replace

    def fail_dir_fsync(path):
        if path.endswith("spark-commits"):
            raise OSError(errno.EIO, "EIO on the ledger's directory")
        return real_fsync_dir(path)

    def fail_rename(src, dst, *a, **k):
        if os.path.dirname(dst).endswith("spark-commits"):
            raise OSError(errno.ENOSPC, "no space for the ledger")
        return real_rename(src, dst, *a, **k)

    if step == "after the rename":
        monkeypatch.setattr(checkpoint, "fsync_dir", fail_dir_fsync)
    else:
        monkeypatch.setattr(checkpoint.os, "replace", fail_rename)
    first = stage(root, job, "t", 0, [b"a", b"b", b"c"])
    with segstore.open(root) as store:
        with pytest.raises(OSError):
            staging.publish(store, root, job, [first], ledger=CommitLedger(root, loc),
                            batch_id=0)
    monkeypatch.undo()
    held = CommitLedger(root, loc).is_committed(0)
    assert held == (step == "after the rename")
    assert end_offsets(root, "t")[0] == (3 if held else 0)
    assert os.path.exists(manifest_path(root, job)) == held
    staging.discard_job(root, job)  # Spark's abort of the micro-batch
    replay = stage(root, job, "t", 0, [b"a", b"b", b"c"])
    with segstore.open(root) as store:
        staging.publish(store, root, job, [replay], ledger=CommitLedger(root, loc), batch_id=0)
    assert [v for _, _, v, _ in records(root, "t")] == [b"a", b"b", b"c"]
    assert CommitLedger(root, loc).is_committed(0)


# -- many files, stragglers --------------------------------------------------------------------

def test_a_partitions_files_are_adopted_in_runs_of_bounded_length(root, monkeypatch):
    """Adoption holds every file of a run open: a partition with hundreds of large staged
    files is adopted ADOPT_RUN_FILES at a time, not all at once (EMFILE)."""
    monkeypatch.setattr(staging, "ADOPT_MIN_BYTES", 0)
    monkeypatch.setattr(staging, "ADOPT_RUN_FILES", 3)
    msgs = [stage(root, "many", "t", 0, [b"f%d-%d" % (i, k) for k in range(4)])
            for i in range(7)]
    runs = []
    with segstore.open(root) as store:
        lg = store.partition("t", 0)
        real = type(lg).adopt_segment_files

        def spy(self, paths, **kw):
            runs.append(len(paths))
            return real(self, paths, **kw)

        monkeypatch.setattr(type(lg), "adopt_segment_files", spy)
        staging.publish(store, root, "many", msgs)
    assert runs == [3, 3, 1]
    assert [v for _, _, v, _ in records(root, "t")] == [
        b"f%d-%d" % (i, k) for i in range(7) for k in range(4)]


def test_a_task_racing_the_abort_leaves_no_file(root, monkeypatch):
    """The abort lands between a task's check of the abort marker and its file's creation:
    the task's second check, after creating the file, refuses and deletes it."""
    stage(root, "raced", "t", 0, [b"first"])
    real = os.makedirs

    def abort_now(path, *a, **k):
        if path == staging.job_dir(root, "raced"):
            staging.discard_job(root, "raced", aborted=True)  # the driver's abort()
        return real(path, *a, **k)

    monkeypatch.setattr(staging.os, "makedirs", abort_now)
    with pytest.raises(staging.JobAbortedError, match="aborted"):
        stage(root, "raced", "t", 1, [b"late"])
    monkeypatch.setattr(staging.os, "makedirs", real)
    assert os.listdir(staging.job_dir(root, "raced")) == []


def test_a_dead_commit_into_a_topic_deleted_since_is_dropped(root, monkeypatch):
    die_after_publishing(root, "gone", [stage(root, "gone", "t", 0, [b"a"]),
                                        stage(root, "gone", "c", 0, [b"b"], [b"k"])], monkeypatch)
    manifest = json.load(open(manifest_path(root, "gone"), encoding="utf-8"))
    manifest["partitions"]["x-0"] = {"topic": "x", "partition": 0, "before": 0, "records": 1}
    with open(manifest_path(root, "gone"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)  # as if topic x had held part of the commit, then been deleted
    with segstore.open(root) as store:
        assert [store.partition(t, 0).log_end_offset for t in ("t", "c")] == [0, 0]
    assert not os.path.exists(staging.job_dir(root, "gone"))


# -- compressed batches, damaged ledgers, cleanup, the commit point ----------------------------

@pytest.mark.parametrize("with_headers", [False, True])
def test_incompressible_records_in_a_compressed_topic_stay_under_max_message_bytes(with_headers):
    """Batches are planned by uncompressed size; gzip makes random bytes a little larger, so a
    batch of two records that each fit came out over the limit and failed the task."""
    from segstore.compression import codec_id

    limit = 1 << 20
    info = TopicInfo(partitions=1, max_batch_bytes=limit, max_message_bytes=limit,
                     codec=codec_id("gzip"))
    values = [os.urandom(limit // 2 - 200) for _ in range(2)]
    columns, layout = [pa.array(values, pa.binary())], InputLayout(value="value")
    if with_headers:
        columns.append(pa.array([[{"key": "h", "value": b"v"}]] * 2, pa.list_(
            pa.struct([("key", pa.string()), ("value", pa.binary())]))))
        layout = InputLayout(value="value", headers="headers")
    batch = pa.RecordBatch.from_arrays(columns, names=["value", "headers"][:len(columns)])
    [(_, _, data, _)] = list(BatchRouter(layout, "t", lambda t: info).route(batch))
    scan = _core.scan_batches(data, raise_on_corrupt=True)
    assert int(scan.batches["size"].max()) <= limit
    assert [r.value for r in _core.decode_records(data)] == values


def test_a_damaged_ledger_is_a_typed_error_naming_it(root, monkeypatch):
    loc = "/checkpoints/damaged"
    monkeypatch.setattr(CommitLedger, "record", lambda *a: None)
    die_after_publishing(root, "stream-d", [stage(root, "stream-d", "t", 0, [b"a"])],
                         monkeypatch, ledger=CommitLedger(root, loc), batch_id=3)
    monkeypatch.undo()
    ledger = CommitLedger(root, loc)
    os.makedirs(os.path.dirname(ledger.path), exist_ok=True)
    with open(ledger.path, "w") as f:
        f.write("{not json")
    from segstore.errors import CorruptMetadataError
    with pytest.raises(CorruptMetadataError, match="unreadable commit ledger .*damaged"):
        segstore.open(root)
    assert end_offsets(root, "t")[0] == 1  # nothing was guessed


def test_a_dead_batch_jobs_whole_directory_goes(root, monkeypatch):
    """A batch job's directory is its own: what a discarded attempt staged there, which no
    commit message names, goes with the dead commit."""
    die_after_publishing(root, "dead-batch", [stage(root, "dead-batch", "t", 0, [b"a"])],
                         monkeypatch)
    discarded = stage(root, "dead-batch", "t", 1, [b"lost attempt"])  # left by the dead commit
    assert discarded.files[0].name in os.listdir(staging.job_dir(root, "dead-batch"))
    with segstore.open(root):
        pass
    assert not os.path.exists(staging.job_dir(root, "dead-batch"))


def test_stale_staging_that_cannot_be_removed_does_not_fail_the_open(root, monkeypatch):
    from segstore import staged_commit

    stage(root, "old", "t", 0, [b"x"])
    staging.discard_job(root, "old", aborted=True)
    old = os.path.getmtime(staging.job_dir(root, "old") + staging.ABORTED) - 2 * 86400
    os.utime(staging.job_dir(root, "old") + staging.ABORTED, (old, old))

    real_unlink = os.unlink

    def refuse(path, *a, **k):
        if str(path).endswith(staging.ABORTED):
            raise PermissionError(errno.EPERM, "not yours", path)
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(staged_commit.os, "unlink", refuse)  # (os itself: one module)
    with segstore.open(root) as store:  # the marker stays, the open goes on
        assert store.partition("t", 0).log_end_offset == 0
    monkeypatch.undo()
    assert os.path.exists(staging.job_dir(root, "old") + staging.ABORTED)


def test_the_manifests_removal_is_synced_before_the_commit_returns(root, monkeypatch):
    """Removing a batch job's manifest is its commit point: a manifest back after a power
    loss would roll the committed job back at the next open."""
    events = []
    real_unlink, real_fsync_dir = os.unlink, staging.fsync_dir
    jdir = staging.job_dir(root, "j")

    def unlink(path, *a, **k):
        events.append(("unlink", os.path.basename(path)))
        return real_unlink(path, *a, **k)

    def fsync_dir(path):
        events.append(("fsync", path))
        return real_fsync_dir(path)

    msg = stage(root, "j", "t", 0, [b"a"])
    monkeypatch.setattr(staging.os, "unlink", unlink)
    monkeypatch.setattr(staging, "fsync_dir", fsync_dir)
    with segstore.open(root) as store:
        staging.publish(store, root, "j", [msg])
    assert events.index(("fsync", jdir)) == events.index(("unlink", staging.MANIFEST)) + 1


def test_a_close_error_after_a_complete_commit_does_not_fail_the_commit(root, monkeypatch):
    """Spark would abort a commit that raised, and a rerun of the job append it twice."""
    from segstore.spark.options import WriteOptions
    from segstore.spark.writer import SegstoreWriter
    from segstore.store import LogStore

    opts = WriteOptions.parse({"path": root, "topic": "t"}, streaming=False)
    writer = SegstoreWriter(opts, InputLayout(value="value"))
    msg = stage(root, writer.job, "t", 0, [b"a", b"b"])
    real_close = LogStore.close

    def close_then_fail(self):
        real_close(self)
        if not self.readonly:
            raise KafkaStorageError(errno.EIO, "EIO writing a producer snapshot (injected)")

    monkeypatch.setattr(LogStore, "close", close_then_fail)
    writer.commit([msg])
    monkeypatch.undo()
    assert end_offsets(root, "t") == {0: 2, 1: 0}
    failing = stage(root, writer.job + "x", "t", 0, [b"c"])
    monkeypatch.setattr(staging, "_publish_files", lambda lg, files: 1 / 0)
    writer.job += "x"
    with pytest.raises(ZeroDivisionError):  # a commit that did not complete still raises
        writer.commit([failing])


def test_a_manifest_cannot_make_recovery_delete_outside_the_staging(root, monkeypatch):
    with segstore.open(root) as store:
        store.partition("t", 1).append(b"keep me")
        store.partition("t", 1).roll()
        victim = os.path.relpath(store.partition("t", 1).segments[0].log_path, root)
    die_after_publishing(root, "odd", [stage(root, "odd", "t", 0, [b"a"])], monkeypatch)
    manifest = json.load(open(manifest_path(root, "odd"), encoding="utf-8"))
    manifest["files"] += [["..", victim], ["../t-1", os.path.basename(victim)],
                          ["odd", "../../" + victim]]
    with open(manifest_path(root, "odd"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    with segstore.open(root) as store:
        assert store.partition("t", 0).log_end_offset == 0
    assert [v for p, _, v, _ in records(root, "t") if p == 1] == [b"keep me"]
