"""Producer snapshots: Kafka's ``<20-digit offset>.snapshot`` files (REF §2.5, §3.3, §4.2 step 11).

A snapshot named ``N`` holds the producer state after every batch below offset ``N`` (the layout
is :meth:`ProducerStateManager.snapshot_bytes`). As Kafka does, a log takes one at every roll
(named after the new segment's base offset) and at a clean close (at the log end offset), and an
open or a truncation starts from the newest valid snapshot at or below the log end and replays
only the batch headers after it. That is how a producer whose batches retention deleted stays
known (its epoch still fences, its open transaction still holds the last stable offset back)
after a crash or a ``truncate_to``.

Which snapshots exist:

* a roll, a clean close and a Spark commit's adopted segments write one (an adopted run takes
  one at the base of its last segment); none is written twice for the same offset;
* retention and the cleaner's swap delete the snapshots of the segments they remove (a cleaned
  segment keeps its base offset's); a truncation deletes every snapshot above its new log end,
  and a full truncation every snapshot;
* after each recovery-point checkpoint, the snapshots below both the base of the segment
  before the active one and the base of the segment holding the recovery point go (Kafka's
  deleteSnapshotsAfterRecoveryPointCheckpoint): the newest holds every producer, the two kept
  serve a truncation into the previous segment and the recovery of unflushed segments;
* an open deletes strays: snapshots above the log end, and those not at a segment base except
  the newest if it lies beyond every base (the clean close's, inside the active segment).

Kafka also drops, on open, the snapshots at or below the log start offset (its
``truncateAndReload``), so after retention has left a single segment it forgets the producers
of deleted batches. segstore keeps the snapshot at the first segment's base for that reason.

A snapshot that fails its checks is deleted and the next older one tried; with none left the
whole log is replayed. Snapshots are fsynced when written: a torn or missing one would only
cost a longer replay, but a durable one is what keeps the state of deleted batches.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Optional

from .checkpoint import fsync_dir
from .errors import CorruptIndexError
from .producer_state import ProducerStateManager

log = logging.getLogger("segstore.producer_state")

SNAPSHOT_SUFFIX = ".snapshot"


def snapshot_path(directory: str, offset: int) -> str:
    """``<directory>/<20-digit offset>.snapshot``."""
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def list_snapshots(directory: str, names: Optional[list] = None) -> dict[int, str]:
    """Producer snapshot files of a partition directory (or among its listing ``names``), by
    offset (ascending)."""
    out = {}
    if names is None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
    for n in names:
        if n.endswith(SNAPSHOT_SUFFIX) and n[:-len(SNAPSHOT_SUFFIX)].isdigit():
            out[int(n[:-len(SNAPSHOT_SUFFIX)])] = os.path.join(directory, n)
    return dict(sorted(out.items()))


def delete_snapshots(directory: str, offsets: Optional[Iterable[int]] = None) -> int:
    """Remove the snapshots at ``offsets`` (default: every one); returns how many went."""
    paths = (list_snapshots(directory).values() if offsets is None
             else [snapshot_path(directory, o) for o in offsets])
    n = 0
    for path in paths:
        try:
            os.unlink(path)
            n += 1
        except FileNotFoundError:
            pass
    return n


def delete_snapshots_above(directory: str, offset: int) -> int:
    """Remove every snapshot above ``offset`` (a truncation's new log end) durably: a snapshot
    that came back after a crash could describe offsets the log has since written again."""
    n = delete_snapshots(directory, [o for o in list_snapshots(directory) if o > offset])
    if n:
        fsync_dir(directory)
    return n


def delete_snapshots_before(directory: str, offset: int) -> int:
    """Remove every snapshot below ``offset`` (Kafka's deleteSnapshotsBefore)."""
    return delete_snapshots(directory, [o for o in list_snapshots(directory) if o < offset])


def write_snapshot(psm: ProducerStateManager, directory: str, offset: int,
                   sync: bool = True) -> str:
    """Write ``psm`` as ``<offset>.snapshot`` (a temporary name, fsync unless ``sync`` is
    false, rename) and remember ``offset`` as its last snapshot. The caller syncs the
    directory (a roll does anyway)."""
    path = snapshot_path(directory, offset)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(psm.snapshot_bytes())
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    psm.last_snapshot_offset = offset
    return path


def take_snapshot(psm: ProducerStateManager, directory: str, offset: int,
                  sync: bool = True) -> Optional[str]:
    """Kafka's takeSnapshot: write one at ``offset`` unless the last one is not older."""
    if offset <= psm.last_snapshot_offset:
        return None
    return write_snapshot(psm, directory, offset, sync)


def read_snapshot(path: str) -> ProducerStateManager:
    """The state a snapshot file holds; CorruptIndexError (or OSError) when it cannot be used."""
    with open(path, "rb") as f:
        return ProducerStateManager.from_snapshot_bytes(f.read(), path)


def remove_stray_snapshots(directory: str, bases, log_end_offset: int,
                           names: Optional[list] = None) -> dict[int, str]:
    """Kafka's removeStraySnapshots plus the log-end bound of its truncateAndReload: delete the
    snapshots above the log end and those not at a segment base, except the newest such if it
    lies beyond every base. Returns what is left, by offset. ``names``: the directory's
    listing, when the caller has just made it."""
    names = os.listdir(directory) if names is None else names
    for n in names:
        if n.endswith(SNAPSHOT_SUFFIX + ".tmp"):  # a write a crash interrupted
            os.unlink(os.path.join(directory, n))
    snaps = list_snapshots(directory, names)
    bases = set(bases)
    top = max(bases) if bases else -1
    strays = [o for o in snaps if o not in bases]
    gone = [o for o in snaps if o > log_end_offset]
    gone += [o for o in strays[:-1] if o <= log_end_offset]
    if strays and strays[-1] < top:
        gone.append(strays[-1])
    if gone:
        delete_snapshots(directory, set(gone))
        fsync_dir(directory)
    return {o: p for o, p in snaps.items() if o not in gone}


def newest_valid_snapshot(directory: str, snaps: dict[int, str], limit: int,
                          ) -> tuple[int, Optional[ProducerStateManager]]:
    """The newest snapshot at or below ``limit`` that reads back, as (offset, state); a damaged
    one is deleted and the next older tried (REF §2.5). (-1, None) when none is left."""
    for offset in sorted((o for o in snaps if o <= limit), reverse=True):
        try:
            return offset, read_snapshot(snaps[offset])
        except (CorruptIndexError, OSError) as e:
            log.warning("ignoring producer snapshot %s: %s", snaps[offset], e)
            delete_snapshots(directory, [offset])
    return -1, None


def load_producer_state(directory: str, segments, *, had_clean_shutdown: bool,
                        recovered=(), log_end_offset: int,
                        listing: Optional[list] = None) -> ProducerStateManager:
    """The producer state of a log being opened (REF §4.2 step 11).

    After a clean shutdown that left no snapshot at all there were no producers (Kafka's rule,
    REF §7 #30): empty snapshots are written at the last two segment bases. Otherwise the
    state is the newest valid snapshot at or below the log end plus the batches after it (the
    whole log without one). Segments in ``recovered`` had their
    transaction indexes reset: a first replay from the newest snapshot at or below the oldest
    of them writes those again (Kafka recovers each segment with the state before it), and
    also the aborted transactions of a segment that lost its ``.txnindex``. ``listing``: the
    directory's names as the loader found them (it touches no snapshot file).
    """
    names = os.listdir(directory) if listing is None else listing
    snaps = list_snapshots(directory, names)
    if had_clean_shutdown and not recovered and not snaps:
        psm = ProducerStateManager()
        # Kafka's rebuildProducerState: empty snapshots at the last two segment bases (the
        # caller adds the log end), so a truncation into them reloads from a snapshot
        # instead of replaying the whole log.
        written = False
        for base in sorted({s.base_offset for s in segments})[-2:]:
            if base <= log_end_offset:
                written |= take_snapshot(psm, directory, base) is not None
        if written:
            fsync_dir(directory)
        psm.map_end_offset = log_end_offset
        return psm
    snaps = remove_stray_snapshots(directory, [s.base_offset for s in segments], log_end_offset,
                                   names)
    replayed = None
    if recovered:
        replayed = replay_from_snapshot(directory, segments, snaps, min(recovered),
                                        rewrite_txn_index=recovered,
                                        log_end_offset=log_end_offset)
        snaps = list_snapshots(directory)  # without the damaged ones it met
        if not snaps or max(snaps) <= replayed.last_snapshot_offset:
            return replayed  # it started from the newest snapshot already
    state = replay_from_snapshot(directory, segments, snaps, log_end_offset,
                                 fill_missing_txn_index=replayed is None,
                                 log_end_offset=log_end_offset)
    return state


def reload_producer_state(directory: str, segments, log_end_offset: int) -> ProducerStateManager:
    """The state after a truncation to ``log_end_offset`` (Kafka's truncateAndReload): snapshots
    above it are deleted, the newest one left is read and the segments after it replayed."""
    delete_snapshots_above(directory, log_end_offset)
    return replay_from_snapshot(directory, segments, list_snapshots(directory), log_end_offset)


def replay_from_snapshot(directory: str, segments, snaps: dict[int, str], limit: int, *,
                         rewrite_txn_index=(), fill_missing_txn_index: bool = True,
                         log_end_offset: Optional[int] = None) -> ProducerStateManager:
    """The newest valid snapshot at or below ``limit``, then every batch at or after it (the
    whole log without one); see :meth:`ProducerStateManager.rebuild` for the index options
    and ``log_end_offset``."""
    offset, psm = newest_valid_snapshot(directory, snaps, limit)
    if psm is None:
        return ProducerStateManager.rebuild(segments, rewrite_txn_index=rewrite_txn_index,
                                            fill_missing_txn_index=fill_missing_txn_index,
                                            log_end_offset=log_end_offset)
    psm.last_snapshot_offset = psm.map_end_offset = offset
    return ProducerStateManager.rebuild(segments, start=psm, from_offset=offset,
                                        rewrite_txn_index=rewrite_txn_index,
                                        fill_missing_txn_index=fill_missing_txn_index,
                                        log_end_offset=log_end_offset)


__all__ = ["SNAPSHOT_SUFFIX", "snapshot_path", "list_snapshots", "delete_snapshots",
           "delete_snapshots_above", "delete_snapshots_before", "write_snapshot", "take_snapshot", "read_snapshot",
           "remove_stray_snapshots", "newest_valid_snapshot", "load_producer_state",
           "reload_producer_state", "replay_from_snapshot"]
