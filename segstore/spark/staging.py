"""Exactly-once publishing of Spark writes (design §1.9): stage in tasks, adopt at commit.

Tasks write encoded v2 batches to ``<root>/.staging/<job>/`` (one file per task and target
partition), sync them, and report them (with each file's fingerprint) in a
:class:`StagedCommitMessage`. The driver-side commit, holding the store's writer lock, then:

1. (the store's writable open has already settled any commit a dead process left behind, see
   :mod:`segstore.staged_commit`);
2. writes ``_manifest.json`` naming every partition's log end offset before the commit and
   every staged file;
3. adopts each run of staged files of at least ``ADOPT_MIN_BYTES`` as new segments with one
   ``PartitionLog.adopt_segment_files`` call (which checks the batches, rewrites base offsets
   in place, outside the CRC, builds the indexes and renames the files into the partition: no
   byte is copied), appends smaller files with ``append_records``, and flushes the
   partitions;
4. for a stream, records the batch id in the query's :class:`~segstore.commit_ledger.CommitLedger`;
5. removes the manifest and the staging files.

An error in step 3 truncates every touched partition back to the manifest's offsets before it
is raised; a crash leaves the manifest, and the next writable open of the store rolls those
partitions back the same way (or, if the ledger shows the batch committed, just clears it).
Either way a failed job or micro-batch appends nothing, and Spark's retry or replay appends it
once. This is also what makes one directory fsync per adopted run safe: a crash before it can
keep a later file's segment without an earlier one's, and the rollback removes both.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Optional

from pyspark.sql.datasource import WriterCommitMessage

from .. import _core
from ..checkpoint import fsync_dir, write_atomic
from ..commit_ledger import CommitLedger
from ..errors import CorruptRecordError, SegstoreError
from ..records import TopicPartition
from ..staged_commit import (ABORTED, MANIFEST, STAGING_DIR, CommitRecoveryError,  # noqa: F401
                             discard_job, job_dir, roll_back as _roll_back)

log = logging.getLogger("segstore.spark")

APPEND_CHUNK_BYTES = 64 << 20  # staged bytes handed to one append_records call
MAX_APPEND_THREADS = 8
# Staged files at least this large become segments (adopted); smaller ones are appended. Below
# it a copy costs about what adoption's fixed work (fsyncs, index files) does, and adopting
# would leave one small segment per file (docs/spark.md, "Performance").
ADOPT_MIN_BYTES = 2 << 20
# Files adopted by one call: adoption holds each open and mapped (two descriptors) until the
# run is in, and partitions are published on up to MAX_APPEND_THREADS threads at once, so a
# job of hundreds of tasks stays far below the usual limit of 1024 open files.
ADOPT_RUN_FILES = 32


class JobAbortedError(SegstoreError):
    """A task tried to stage data for a write job that was already aborted."""


@dataclass(frozen=True)
class StagedFile:
    """Encoded batches for one partition, written by one task."""

    topic: str
    partition: int
    name: str  # file name inside the job's staging directory
    records: int
    size: int
    # The file's identity once written and synced (see fingerprint()); () = unknown.
    fingerprint: tuple = ()


def fingerprint(st: os.stat_result) -> tuple:
    """What changes whenever a file is written, truncated, replaced or renamed through the file
    system: device, inode, size and change time (the kernel sets ctime on every such change, and
    nobody can set it back; since Linux 6.13 a change right after a stat gets a new ctime even
    within one clock tick)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)


@dataclass
class StagedCommitMessage(WriterCommitMessage):
    """What a task staged: sent back to the driver's commit."""

    job: str
    task: str
    files: tuple


def _load_sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None: Python's ``os`` does not expose it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2
WRITEBACK_BYTES = 1 << 20  # unsynced bytes of a staging file that start its writeback


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` of ``fd`` to disk, without
    waiting (``sync_file_range(SYNC_FILE_RANGE_WRITE)``). Only a head start for the fdatasync that
    follows: it makes nothing durable. False where the call is unavailable or refused."""
    fn = _sync_file_range
    if fn is None:
        return False
    return fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0


COALESCE_BYTES = 4 << 20       # encoded batches gathered into one writev
MAX_PENDING_BYTES = 32 << 20   # gathered across a task's files: many partitions stay bounded
MAX_IOVECS = 512               # well under every kernel's IOV_MAX (1024 on Linux)


class _StagingFile:
    __slots__ = ("fd", "name", "records", "size", "synced", "pending", "pending_bytes")

    def __init__(self, fd: int, name: str):
        self.fd, self.name = fd, name
        self.records = self.size = self.synced = 0
        self.pending: list = []  # byte views not yet written, in order
        self.pending_bytes = 0

    def write_pending(self) -> None:
        """Write the gathered views (see :func:`writev_all`)."""
        views, self.pending, self.pending_bytes = self.pending, [], 0
        writev_all(self.fd, views)


def writev_all(fd: int, views: list) -> None:
    """Write every byte of ``views`` (byte memoryviews, consumed) at ``fd``'s position with
    writev calls of at most MAX_IOVECS buffers, continuing short writes."""
    while views:
        done = os.writev(fd, views[:MAX_IOVECS])
        while views and done >= views[0].nbytes:
            done -= views[0].nbytes
            views.pop(0)
        if done:
            views[0] = views[0][done:]


class Stager:
    """Task side: appends encoded batches to one staging file per target partition.

    A partition's batches are gathered and written COALESCE_BYTES at a time with one writev:
    a Spark batch routed over several partitions yields pieces of a few hundred KiB, and
    written one by one they cost 15% more CPU and leave the page cache in small folios, which
    every later map of the file (adoption, readers) pays for in page faults. What is gathered
    over all files stays under MAX_PENDING_BYTES (the fullest file is written first), so a
    write to hundreds of partitions holds no more memory than one to a few. Every MiB written
    starts that range's writeback at once, so the disk writes while the task encodes the next
    batches, and the fdatasync of :meth:`finish` has little left to wait for.
    """

    def __init__(self, root: str, job: str, task: str):
        self.root, self.job = root, job
        self.dir = job_dir(root, job)
        self.task = task
        self._open: dict = {}  # (topic, partition) -> _StagingFile
        self._pending_bytes = 0  # gathered, not yet written, over all files

    def add(self, topic: str, partition: int, data, records: int) -> None:
        """Stage ``data`` (whole v2 batches) for ``topic``-``partition``; ``data`` is kept, not
        copied, until it is written, so it must not change meanwhile (encoder output never
        does)."""
        key = (topic, partition)
        entry = self._open.get(key)
        if entry is None:
            # Spark may abort a job while other tasks still run: they must not leave files
            # behind the abort's cleanup (files already open were unlinked with the job dir).
            self._check_open()
            os.makedirs(self.dir, exist_ok=True)
            # Named by task and sequence, not topic: a 249-character topic name would not fit.
            name = f"{self.task}.{len(self._open)}.stage"
            fd = os.open(os.path.join(self.dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o666)
            entry = self._open[key] = _StagingFile(fd, name)
            # Again, now the file exists: an abort that began meanwhile wrote its marker
            # before it listed the directory, and may have missed this file.
            self._check_open()
        view = memoryview(data).cast("B")
        if view.nbytes:
            entry.pending.append(view)
            entry.pending_bytes += view.nbytes
            self._pending_bytes += view.nbytes
        entry.records += records
        if entry.pending_bytes >= COALESCE_BYTES or len(entry.pending) >= MAX_IOVECS:
            self._write(entry)
        while self._pending_bytes > MAX_PENDING_BYTES:  # a write spread over many partitions
            self._write(max(self._open.values(), key=lambda e: e.pending_bytes))

    def _check_open(self) -> None:
        if os.path.exists(self.dir + ABORTED):
            self.discard()
            raise JobAbortedError(f"write job {self.job} was aborted: this task attempt "
                                  f"stages nothing")

    def _write(self, entry: _StagingFile, writeback_from: int = WRITEBACK_BYTES) -> None:
        """Write ``entry``'s gathered batches, and start the writeback of what it has not yet
        started once that is ``writeback_from`` bytes or more."""
        self._pending_bytes -= entry.pending_bytes
        entry.size += entry.pending_bytes
        entry.write_pending()
        unsynced = entry.size - entry.synced
        if unsynced >= max(writeback_from, 1) and start_writeback(entry.fd, entry.synced,
                                                                  unsynced):
            entry.synced = entry.size

    def finish(self) -> tuple:
        """Write every file through to disk and close it; the StagedFile list for the commit
        message. The commit fsyncs again before publishing; syncing here moves the writeback
        out of the driver's serial commit into the tasks, which run in parallel."""
        entries = sorted(self._open.items())
        for _, e in entries:
            # Every file's last bytes start for the disk together; the syncs below then wait
            # for writes already under way instead of starting them one file at a time.
            self._write(e, writeback_from=1)
        fds = [e.fd for _, e in entries]
        if len(fds) > 1 and _sync_file_range is None:
            # No writeback was started: each fdatasync writes a whole file, so they overlap.
            with ThreadPoolExecutor(min(len(fds), MAX_APPEND_THREADS),
                                    thread_name_prefix="segstore-stage") as pool:
                list(pool.map(os.fdatasync, fds))  # fdatasync releases the GIL
        else:
            for fd in fds:  # mostly written back already: each call waits for a little
                os.fdatasync(fd)
        files = []
        for (topic, partition), e in entries:
            fd, e.fd = e.fd, -1
            try:
                identity = fingerprint(os.fstat(fd))  # after the last write and the sync
            finally:
                os.close(fd)
            files.append(StagedFile(topic, partition, e.name, e.records, e.size, identity))
        self._open.clear()
        return tuple(files)

    def discard(self) -> None:
        """Close and delete this task's files (a failed task leaves nothing behind)."""
        self._pending_bytes = 0
        for e in self._open.values():
            e.pending, e.pending_bytes = [], 0
            if e.fd >= 0:
                fd, e.fd = e.fd, -1
                os.close(fd)
            try:
                os.unlink(os.path.join(self.dir, e.name))
            except FileNotFoundError:
                pass
        self._open.clear()


def _files_by_partition(messages: Iterable) -> dict:
    """{TopicPartition: [(job, StagedFile)]}: a file lives in the job dir its task wrote to."""
    by_tp: dict = {}
    for m in messages:
        if m is None:
            continue
        for f in m.files:
            by_tp.setdefault(TopicPartition(f.topic, f.partition), []).append((m.job, f))
    return by_tp


def _append_file(lg, path: str, expected_records: int) -> None:
    """Append one staged file in chunks of whole batches (bounded memory)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            if expected_records:  # emptied since its task wrote it: never skip its records
                raise CorruptRecordError(f"staged file {path} is empty, but its task wrote "
                                         f"{expected_records} records to it")
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            scan = _core.scan_batches(mm, raise_on_corrupt=True, file=path)
            batches = scan.batches
            if scan.valid_end != size or int(batches["records_count"].sum()) != expected_records:
                raise CorruptRecordError(
                    f"staged file {path} is incomplete ({scan.valid_end} of {size} bytes, "
                    f"{int(batches['records_count'].sum())} of {expected_records} records)")
            ends = (batches["position"] + batches["size"]).tolist()
            start = 0
            for i, end in enumerate(ends):
                if end - start >= APPEND_CHUNK_BYTES or i == len(ends) - 1:
                    view = memoryview(mm)[start:end]
                    try:
                        lg.append_records(view)  # copies, validates CRCs, assigns offsets
                    finally:
                        view.release()
                    start = end
        finally:
            mm.close()


def _unchanged(path: str, staged: StagedFile) -> bool:
    """Whether the staged file is still what its task wrote and synced (same fingerprint)."""
    try:
        return bool(staged.fingerprint) and fingerprint(os.stat(path)) == staged.fingerprint
    except FileNotFoundError:
        return False


def _publish_files(lg, files: list) -> None:
    """Publish one partition's staged files in order: runs of large files are adopted together
    (one call, one directory fsync, up to ADOPT_RUN_FILES files), small ones appended. Record
    counts must match.

    A run whose files all kept their task's fingerprint is adopted without re-reading every
    byte for the CRC check (headers are still walked): nothing wrote to them since the task
    wrote them from its encoder's output, whose CRCs it computed. Any other file gets the full
    check (docs/spark.md, "Exactly once")."""
    run: list = []

    def adopt_run():
        trusted = all(_unchanged(path, f) for path, f in run)
        info = lg.adopt_segment_files([path for path, _ in run], validate_crc=not trusted)
        expected = sum(f.records for _, f in run)
        if info.num_records != expected:
            raise CorruptRecordError(  # rolled back by the caller
                f"staged files {', '.join(p for p, _ in run)} held {info.num_records} records, "
                f"not {expected}")
        run.clear()

    for path, staged in files:
        if staged.size >= ADOPT_MIN_BYTES:
            run.append((path, staged))
            if len(run) >= ADOPT_RUN_FILES:
                adopt_run()
            continue
        if run:
            adopt_run()
        _append_file(lg, path, staged.records)
    if run:
        adopt_run()


def publish(store, root: str, job: str, messages: list, *,
            ledger: Optional[CommitLedger] = None, batch_id: Optional[int] = None) -> dict:
    """Append every staged file of ``messages`` to its partition, exactly once.

    ``store`` must be open writable. Returns ``{TopicPartition: (first offset, end offset)}``
    of what was appended. With a ``ledger``, a ``batch_id`` it already holds appends nothing.
    """
    by_tp = _files_by_partition(messages)
    jobs = {job} | {j for files in by_tp.values() for j, _ in files}
    jdir = job_dir(root, job)  # dead commits: the writable open of ``store`` settled them
    if ledger is not None and ledger.is_committed(batch_id):
        log.info("micro-batch %s already committed to %s; skipping its replay", batch_id, root)
        for j in jobs:
            discard_job(root, j)
        return {}
    plan = {f"{tp.topic}-{tp.partition}": {
                "topic": tp.topic, "partition": tp.partition,
                "before": store.partition(*tp).log_end_offset,
                "records": sum(f.records for _, f in files)}
            for tp, files in sorted(by_tp.items())}
    # The files too: a dead commit's recovery deletes exactly these, not a stream's directory,
    # where the restarted query may already have staged its replay.
    manifest = {"job": job, "partitions": plan,
                "files": sorted([j, f.name] for files in by_tp.values() for j, f in files)}
    if ledger is not None:
        manifest.update(ledgerLocation=ledger.location, batchId=batch_id)
    os.makedirs(jdir, exist_ok=True)
    write_atomic(os.path.join(jdir, MANIFEST), json.dumps(manifest, indent=1))
    def append_partition(tp, files) -> tuple:
        lg = store.partition(*tp)
        first = lg.log_end_offset
        # In message order: Spark lists tasks by partition id.
        _publish_files(lg, [(os.path.join(job_dir(root, j), f.name), f) for j, f in files])
        lg.flush()
        return first, lg.log_end_offset

    done = {}
    try:
        # Partitions are independent logs (each with its own lock) and the CRC, copying and
        # fsync calls release the GIL, so partitions are published on parallel threads; more
        # threads than cores, as publishing mostly waits for fsync.
        workers = max(1, min(len(by_tp), MAX_APPEND_THREADS))
        with ThreadPoolExecutor(workers, thread_name_prefix="segstore-commit") as pool:
            futures = {tp: pool.submit(append_partition, tp, files)
                       for tp, files in sorted(by_tp.items())}
            for tp, fut in futures.items():
                done[tp] = fut.result()
        if ledger is not None:
            ledger.record(batch_id, sum(p["records"] for p in plan.values()))
    except BaseException:
        if ledger is not None and _may_hold(ledger, batch_id):
            # The ledger's write failed after its rename landed (it did not name the batch
            # before: see above), so the records stay and so does the manifest: the next
            # writable open settles them by what the ledger durably holds, as after a crash.
            raise
        _roll_back(store, manifest)
        os.unlink(os.path.join(jdir, MANIFEST))
        raise
    os.unlink(os.path.join(jdir, MANIFEST))
    # For a batch job the manifest's removal is the commit point: a manifest that came back
    # after a power loss would roll a committed job back.
    fsync_dir(jdir)
    for j in jobs:
        discard_job(root, j)
    return done


def _may_hold(ledger: CommitLedger, batch_id: int) -> bool:
    try:
        return ledger.is_committed(batch_id)
    except Exception:  # noqa: BLE001 - unreadable since the commit began: it may hold the batch
        return True


def task_tag() -> str:
    """A name for this task attempt's staging files, unique even across retries."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:
        ctx = None
    suffix = uuid.uuid4().hex[:12]
    if ctx is None:
        return f"local-{suffix}"
    return f"p{ctx.partitionId()}-a{ctx.attemptNumber()}-{suffix}"
