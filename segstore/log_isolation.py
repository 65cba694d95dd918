"""Read isolation: Kafka's FetchIsolation and the consumer's aborted-transaction filter
(REF §3.6; KafkaConsumer's ``isolation_level``).

``read_uncommitted`` (the default, as in Kafka's consumer) reads up to the log end and returns
every data record, those of open and aborted transactions included. ``read_committed`` reads
up to the last stable offset and leaves out the records of aborted transactions. Kafka's broker
bounds a fetch by the last stable offset and sends the aborted transactions overlapping it; its
consumer then skips the batches of those transactions. segstore does both in the read.

* A writable log reads the bound from its producer state and the aborted transactions from the
  segments' ``.txnindex`` files (Kafka's collectAbortedTransactions); see
  :func:`committed_view` for the order that keeps a racing roll and ABORT out.
* A read-only log has no producer state. A replay of its segment list's batch headers gives
  the aborted transactions of exactly the data it reads (the writer's index entry may lag the
  marker a reader sees); the bound starts from the writer's newest producer snapshot, which
  knows transactions opened in segments retention deleted.

A batch is left out when it is a transactional data batch of an aborted transaction's producer
that starts within that transaction's [first offset, ABORT marker]. Markers are never returned
by either level.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from . import _core
from .errors import CorruptIndexError, InvalidArgumentError
from .producer_snapshots import list_snapshots, read_snapshot
from .producer_state import ProducerStateManager
from .transaction_index import AbortedTxn, collect_aborted_transactions

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


def read_committed(isolation_level) -> bool:
    """Whether ``isolation_level`` (kafka-python's consumer names) is ``read_committed``;
    InvalidArgumentError for anything but the two levels."""
    if isinstance(isolation_level, str) and isolation_level in ISOLATION_LEVELS:
        return isolation_level == READ_COMMITTED
    raise InvalidArgumentError(f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                               f"got {isolation_level!r}")


class CommittedView(NamedTuple):
    """What a read_committed read may return: offsets below ``bound`` (the last stable offset),
    without the batches of the ``aborted`` transactions."""

    bound: int
    aborted: list[AbortedTxn]


def committed_view(lg, st, start_offset: int) -> CommittedView:
    """The bound and the aborted transactions overlapping [start_offset, bound) of the writable
    log ``lg`` for a read of its state ``st`` (a LogState, taken first).

    The order matters. The bound is read after ``st``: a transaction opened later has no data
    in ``st``. The indexes are walked on the segments the log has *after* the bound was read:
    an ABORT that completed a transaction before then wrote its entry first, into a segment a
    roll had already published, which ``st`` may not hold."""
    bound = stable_bound(lg.producer_state.first_unstable_offset(), st)
    segments = lg._state.segments
    return CommittedView(bound, collect_aborted_transactions(segments, start_offset, bound))


def replayed_view(directory: str, st) -> CommittedView:
    """The bound and every aborted transaction of a read-only log's state ``st`` (callers
    filter by their range): the aborts from a replay of its batch headers, the bound from
    :func:`readonly_first_unstable`."""
    psm, aborted = ProducerStateManager(), []
    for seg in st.segments:
        buf, batches = seg.read_batch_headers()
        if len(batches):
            aborted.extend(psm.update(buf, batches))
    return CommittedView(stable_bound(readonly_first_unstable(directory, st, psm), st), aborted)


def readonly_producer_state(directory: str, st,
                            replayed: Optional[ProducerStateManager] = None):
    """A read-only log's producer state at ``st``: the writer's newest readable producer
    snapshot within [first segment base, log end] plus a replay of the batches after it, which
    still knows the producers and open transactions of segments retention deleted; without
    one, ``replayed`` (a replay of ``st.segments`` from nothing) or a fresh replay. Nothing is
    deleted: the files are the writer's."""
    if st.segments:
        lo = st.segments[0].base_offset
        for offset, path in reversed(list(list_snapshots(directory).items())):
            if not lo <= offset <= st.log_end_offset:
                continue
            try:
                psm = read_snapshot(path)
            except (CorruptIndexError, OSError):
                continue  # damaged, or deleted meanwhile: an older one
            psm.last_snapshot_offset = psm.map_end_offset = offset
            return ProducerStateManager.rebuild(st.segments, start=psm, from_offset=offset)
    if replayed is None:
        replayed = ProducerStateManager.rebuild(st.segments)
    return replayed


def readonly_first_unstable(directory: str, st, replayed: Optional[ProducerStateManager] = None):
    """A read-only log's first unstable offset, from :func:`readonly_producer_state`."""
    return readonly_producer_state(directory, st, replayed).first_unstable_offset()


def in_range(view: CommittedView, start_offset: int) -> CommittedView:
    """``view`` with only the aborted transactions overlapping [start_offset, bound)."""
    return CommittedView(view.bound, [t for t in view.aborted if t.last_offset >= start_offset
                                      and t.first_offset < view.bound])


def stable_bound(first_unstable, st) -> int:
    """The last stable offset of ``st`` given its first unstable offset (None: none open):
    at least the log start offset, at most the log end offset."""
    if first_unstable is None:
        return st.log_end_offset
    return min(max(first_unstable, st.log_start_offset), st.log_end_offset)


def aborted_batches(buf, start: int, end: int, aborted: list[AbortedTxn]) -> np.ndarray:
    """The headers (``_core.BATCH_DTYPE`` rows, in log order) of the batches in
    ``buf[start:end]`` that belong to an ``aborted`` transaction and pass their CRC check.

    A batch whose CRC fails is left out: its header fields that make it look aborted may be
    the damage, so it stays in the bytes a read decodes, which raises when it reaches it."""
    b = _core.scan_batches(buf, start, end, raise_on_corrupt=False).batches
    if not aborted or not len(b):
        return b[:0]
    attrs = b["attributes"].astype(np.int64)
    txn = ((attrs & _ATTR_TRANSACTIONAL) != 0) & ((attrs & _ATTR_CONTROL) == 0)
    drop = np.zeros(len(b), dtype=bool)
    for t in aborted:
        drop |= (txn & (b["producer_id"] == t.producer_id) & (b["base_offset"] >= t.first_offset)
                 & (b["base_offset"] <= t.last_offset))
    b = b[drop]
    intact = [_core.scan_batches(buf, p, p + n, validate_crc=True,
                                 raise_on_corrupt=False).error is None
              for p, n in zip(b["position"].tolist(), b["size"].tolist())]
    return b[np.array(intact, dtype=bool)] if len(b) else b


def committed_spans(buf, start: int, end: int, aborted: list[AbortedTxn]) -> list:
    """``buf[start:end]`` as the (start, end) byte spans between aborted transactions'
    batches (the whole range when none is there)."""
    if not aborted or end <= start:
        return [(start, end)]
    b = aborted_batches(buf, start, end, aborted)
    spans, pos = [], start
    for p, n in zip(b["position"].tolist(), b["size"].tolist()):
        if p > pos:
            spans.append((pos, p))
        pos = p + n
    if end > pos:
        spans.append((pos, end))
    return spans


__all__ = ["READ_UNCOMMITTED", "READ_COMMITTED", "ISOLATION_LEVELS", "read_committed",
           "CommittedView", "committed_view", "replayed_view", "readonly_producer_state",
           "readonly_first_unstable", "stable_bound",
           "in_range", "aborted_batches", "committed_spans"]
