"""Staged commits as the store sees them: manifests, and the rollback of a commit that died.

The Spark sink (``segstore.spark.staging``, design §1.9) stages each write job's encoded batches
under ``<root>/.staging/<job>/``, and its driver-side commit, holding the writer lock, writes
``_manifest.json`` (every target partition's log end offset before the commit, and the staged
files) before it appends anything, and removes it when the commit is complete. A manifest found
by a process that holds the writer lock therefore belongs to a commit that died: whatever it
appended is rolled back (or, when the stream's :class:`~.commit_ledger.CommitLedger` shows the
micro-batch committed, kept). Every writable open settles such commits before anything else
can touch the partitions (an append, retention, or the cleaner, which would otherwise compact
a dead commit's records over the committed ones they replace); that is why this module lives
in the core and needs nothing of pyspark.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

from .commit_ledger import CommitLedger
from .errors import CorruptRecordError, SegstoreError, UnknownTopicOrPartitionError

log = logging.getLogger("segstore.spark")

STAGING_DIR = ".staging"
MANIFEST = "_manifest.json"
ABORTED = ".aborted"  # <job>.aborted beside the job dirs: a straggling task must not restage
STALE_SECONDS = 24 * 3600  # staging untouched this long, by a job without a manifest, is garbage


class CommitRecoveryError(SegstoreError):
    """An interrupted commit cannot be rolled back: other records followed it."""


def job_dir(root: str, job: str) -> str:
    """The staging directory of one write job (or one streaming writer)."""
    return os.path.join(root, STAGING_DIR, job)


def roll_back(store, manifest: dict) -> list:
    """Truncate each partition of a manifest back to its offset before the commit.

    Every partition is tried, even after one fails (an offline log, records written since):
    the others must not keep the failed commit's records. The first failure is then raised,
    and the caller keeps the manifest so that the next writable open finishes the rollback."""
    undone, failed = [], []
    for p in manifest["partitions"].values():
        try:
            try:
                lg = store.partition(p["topic"], p["partition"])
            except UnknownTopicOrPartitionError:
                continue  # deleted since: its records went with it
            before, leo = p["before"], lg.log_end_offset
            if leo == before:
                continue
            if not before < leo <= before + p["records"]:
                raise CommitRecoveryError(
                    f"cannot roll back the interrupted commit of job {manifest['job']} in "
                    f"{p['topic']}-{p['partition']}: its log end offset is {leo}, but the "
                    f"commit started at {before} with {p['records']} records (others wrote "
                    f"since). Inspect the partition, then delete {MANIFEST} of that job to "
                    f"continue")
            lg.truncate_to(before)
            lg.flush()
            undone.append((p["topic"], p["partition"], leo - before))
        except Exception as e:  # noqa: BLE001 - raised below, after the other partitions
            log.error("cannot roll back %s-%s of job %s: %s", p["topic"], p["partition"],
                      manifest["job"], e)
            failed.append(e)
    if failed:
        raise failed[0]
    return undone


def _plain(name) -> bool:
    # A manifest names files inside the staging directory: nothing it says may reach outside.
    return (isinstance(name, str) and name not in ("", ".", "..")
            and os.path.basename(name) == name and "\0" not in name)


def settle(store) -> list:
    """Settle commits that a dead process left half done; returns what was rolled back.

    Run by every writable open of ``store``, which holds the writer lock, so no commit is
    running: every manifest belongs to a dead one. A manifest whose stream batch id the ledger
    holds finished (only its cleanup was lost); any other manifest's partitions are truncated
    back to where the commit started. Then the manifest is removed,
    with a batch job's whole directory; of a stream's, which every micro-batch reuses, only
    the files the manifest names, so that a restarted query's staging of the replay stays (a
    stream manifest written before manifests named their files leaves them all to the garbage
    collection).
    """
    root = store.path
    base = os.path.join(root, STAGING_DIR)
    undone = []
    if not os.path.isdir(base):
        return undone
    for job in sorted(os.listdir(base)):
        if job.endswith(ABORTED):
            continue
        path = os.path.join(base, job, MANIFEST)
        try:
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except ValueError:
            # write_atomic renames a complete file into place: a torn manifest cannot exist.
            raise CorruptRecordError(f"unreadable commit manifest {path}") from None
        location = manifest.get("ledgerLocation")
        if location is not None and CommitLedger(root, location).is_committed(manifest["batchId"]):
            log.info("commit of job %s had finished; clearing its staging", job)
        else:
            rolled = roll_back(store, manifest)
            log.warning("rolled back the interrupted commit of job %s: %s", job, rolled)
            undone.extend(rolled)
        named = [(j, n) for j, n in manifest.get("files", ()) if _plain(j) and _plain(n)]
        for j, name in named:
            try:
                os.unlink(os.path.join(base, j, name))
            except FileNotFoundError:
                pass
        os.unlink(path)
        if location is None:
            # A batch job's directory is its own (a fresh id), and Spark never retries a failed
            # commit in it: what a discarded attempt staged there goes too.
            shutil.rmtree(os.path.join(base, job), ignore_errors=True)
        for j in {job, *(j for j, _ in named)}:
            try:
                os.rmdir(os.path.join(base, j))
            except OSError:
                pass  # not empty: staged by a later attempt
    _collect_garbage(base)
    return undone


def _collect_garbage(base: str) -> None:
    """Remove abort markers and manifest-less staging nobody touched for STALE_SECONDS (left
    by killed drivers: never appended, safe to drop). Best effort: what cannot be removed
    (another user's files, say) stays, and the open goes on."""
    now = time.time()
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if os.path.exists(os.path.join(path, MANIFEST)):
            continue
        try:
            paths = [path] + ([os.path.join(path, n) for n in os.listdir(path)]
                              if os.path.isdir(path) else [])
            newest = max(os.stat(p).st_mtime for p in paths)
            if now - newest > STALE_SECONDS:
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warning("cannot remove stale staging %s: %s", path, e)


def discard_job(root: str, job: str, aborted: bool = False) -> None:
    """Remove a job's staged files; a manifest (a commit in progress) is never removed.

    ``aborted`` (a failed batch job) first leaves ``<job>.aborted``, which tasks still running
    check before and after they create a file, so that none stages anything the listing below
    misses; :func:`settle` removes old markers. (A task attempt that outlives its job's commit,
    whose result Spark discards, leaves its files to the garbage collection.)
    """
    jdir = job_dir(root, job)
    if aborted:
        os.makedirs(os.path.dirname(jdir), exist_ok=True)
        with open(jdir + ABORTED, "w"):
            pass
    try:
        names = os.listdir(jdir)
    except FileNotFoundError:
        return
    for name in names:
        if name != MANIFEST:
            try:
                os.unlink(os.path.join(jdir, name))
            except (FileNotFoundError, IsADirectoryError):
                pass
    try:
        os.rmdir(jdir)
    except OSError:
        pass  # a manifest remains

