"""What ``store.compact`` would do to one partition, found without changing anything: the answer
``compact --dry-run``, ``describe --check-crc`` and ``plan-cleaner --store`` give.

A cleaning reads every batch below the partition's first uncleanable offset (the offset map is
built over the dirty section, then every segment below it is rewritten) and checks each batch's
CRC first. A corrupt batch fails the cleaning, and the cleaner marks the partition uncleanable
(Kafka's LogCleanerManager does the same, REF §6.3). So the prediction reads the same bytes: the
dirty segments first, as the map build does, then the clean ones.

The prediction is exact but for one case: a round whose offset map fills up stops early, and
without ``--force`` a partition that is then no longer eligible is not cleaned further, so
damage past where that round stopped goes unread by the real run. Where each round's map
stops is foreseen by ``cleaner/map_preview.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..cleaner.manager import LogToClean, segments_in_range
from ..errors import CorruptIndexError, CorruptRecordError
from ..records import TopicPartition

_SCAN_CHUNK = 4096  # batch headers per scan: bounded memory on multi-GB segments

#: Errors about damaged files: one partition's, reported with it while the others carry on.
DAMAGE_ERRORS = (CorruptRecordError, CorruptIndexError)


@dataclass
class Outcome:
    """What a cleaning of one partition would do.

    ``action`` is "clean", "skip" or "fail"; ``details`` the cleaner manager's ``describe``
    of the partition (None when damage kept it from being computed); ``error`` the damage a
    cleaning would stop at (None unless ``action`` is "fail"); ``log_to_clean`` the range a
    cleaning would take (set when ``action`` is "clean")."""

    action: str
    details: Optional[dict]
    error: Optional[Exception] = None
    log_to_clean: Optional[LogToClean] = None

    @property
    def failure(self) -> Optional[str]:
        """One line naming the file, position and damage, or None."""
        return None if self.error is None else damage_text(self.error)

    def error_json(self) -> Optional[dict]:
        """The damage as plain JSON types, or None."""
        if self.error is None:
            return None
        return {"file": getattr(self.error, "file", None),
                "position": getattr(self.error, "position", None),
                "message": damage_text(self.error)}


def damage_text(e: Exception) -> str:
    """``corrupt batch in <file> at position <n>: <reason>`` when the error names both."""
    file, position = getattr(e, "file", None), getattr(e, "position", None)
    if isinstance(e, CorruptRecordError) and file is not None and position is not None:
        return f"corrupt batch in {file} at position {position}: {e.reason}"
    return " ".join(str(e).split())


def first_damage(log, ltc) -> Optional[CorruptRecordError]:
    """The first corrupt or incomplete batch a cleaning of ``ltc`` would read, or None."""
    segs = log.segments
    first_dirty, upper = ltc.first_dirty_offset, ltc.first_uncleanable_offset
    below = [s for s in segments_in_range(segs, 0, upper) if s.base_offset < upper]
    dirty = segments_in_range(below, first_dirty, upper)
    dirty_ids = {id(s) for s in dirty}
    for seg in dirty + [s for s in below if id(s) not in dirty_ids]:
        error = _segment_damage(seg)
        if error is not None:
            return error
    return None


def _segment_damage(seg) -> Optional[CorruptRecordError]:
    size, pos = seg.size, 0
    while pos < size:
        res = seg.scan(pos, size, validate_crc=True, raise_on_corrupt=False,
                       max_batches=_SCAN_CHUNK)
        if res.error is not None:
            return res.error
        if res.torn:  # a sealed segment holds whole batches: this one runs past its end
            end = res.valid_end
            head = bytes(seg.buffer(size)[end:end + 12])
            what = ("segment ends inside a batch header" if len(head) < 12 else
                    f"batch declares {int.from_bytes(head[8:], 'big', signed=True) + 12} bytes "
                    f"but only {size - end} remain in the segment")
            return CorruptRecordError(what, file=seg.log_path, position=end)
        if res.valid_end == pos:
            break
        pos = res.valid_end
    return None


def predict(store, topic: str, partition: int, now: int, *, force: bool,
            read_batches: bool = True) -> Outcome:
    """What ``store.compact(topic, partition, force=force, now_ms=now)`` would do.

    With ``read_batches`` every batch the cleaning would read is checked (CRCs included),
    otherwise only what the cleaner reads to choose a partition (batch headers)."""
    mgr = store.cleaner_manager
    lg = store.partition(topic, partition)
    try:
        details = mgr.describe(topic, partition, now_ms=now)
        # The same range and rule as grab_log, without its checkpoint repair.
        ltc = mgr.log_to_clean(lg, mgr.all_cleaner_checkpoints().get(
            TopicPartition(topic, partition)), now, update_checkpoint=False)
        wanted = mgr.wants_on_demand_clean(ltc, now, force)
    except DAMAGE_ERRORS as e:  # grab_log meets the same damage: the real run fails too
        return Outcome("fail", None, e)
    if details["state"] is not None or (details["uncleanable"] and not force) or not wanted:
        return Outcome("skip", details)
    if read_batches:
        error = first_damage(lg, ltc)
        if error is not None:
            return Outcome("fail", details, error)
    return Outcome("clean", details, log_to_clean=ltc)
