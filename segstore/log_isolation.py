"""Read isolation: Kafka's FetchIsolation and the consumer's aborted-transaction filter
(REF §3.6; KafkaConsumer's ``isolation_level``).

``read_uncommitted`` (the default, as in Kafka's consumer) reads up to the log end and returns
every data record, those of open and aborted transactions included. ``read_committed`` reads
up to the last stable offset and leaves out the records of aborted transactions. Kafka's broker
bounds a fetch by the last stable offset and sends the aborted transactions overlapping it; its
consumer then skips the batches of those transactions. segstore does both in the read.

* A writable log reads the bound from its producer state and the aborted transactions from the
  segments' ``.txnindex`` files (Kafka's collectAbortedTransactions). The bound is read first:
  an ABORT marker writes its index entry before it completes its transaction, so every
  transaction aborted below the bound is in an index by then.
* A read-only log has no producer state. It replays the batch headers of its segment list,
  which gives the bound and the aborted transactions of exactly the data it reads (the
  writer's index entry may lag the marker a reader sees).

A batch is left out when it is a transactional data batch of an aborted transaction's producer
that starts within that transaction's [first offset, ABORT marker]. Markers are never returned
by either level.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _core
from .errors import InvalidArgumentError
from .producer_state import ProducerStateManager
from .transaction_index import AbortedTxn, collect_aborted_transactions

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
_NO_RANGES = np.empty((0, 2), dtype=np.int64)


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


def committed_view(producer_state, st, start_offset: int) -> CommittedView:
    """The bound and the aborted transactions overlapping [start_offset, bound) of a writable
    log (its ``producer_state``) as its state ``st`` (a LogState) holds it."""
    bound = _bound(producer_state.first_unstable_offset(), st)
    return CommittedView(bound, collect_aborted_transactions(st.segments, start_offset, bound))


def replayed_view(st) -> CommittedView:
    """The bound and every aborted transaction of a read-only log's state ``st``, from a
    replay of its batch headers (callers filter by their range)."""
    psm, aborted = ProducerStateManager(), []
    for seg in st.segments:
        buf, batches = seg.read_batch_headers()
        if len(batches):
            aborted.extend(psm.update(buf, batches))
    return CommittedView(_bound(psm.first_unstable_offset(), st), aborted)


def in_range(view: CommittedView, start_offset: int) -> CommittedView:
    """``view`` with only the aborted transactions overlapping [start_offset, bound)."""
    return CommittedView(view.bound, [t for t in view.aborted if t.last_offset >= start_offset
                                      and t.first_offset < view.bound])


def _bound(first_unstable, st) -> int:
    if first_unstable is None:
        return st.log_end_offset
    return min(max(first_unstable, st.log_start_offset), st.log_end_offset)


def aborted_batches(buf, start: int, end: int, aborted: list[AbortedTxn]) -> np.ndarray:
    """The headers (``_core.BATCH_DTYPE`` rows, in log order) of the batches in
    ``buf[start:end]`` that belong to an ``aborted`` transaction."""
    b = _core.scan_batches(buf, start, end, raise_on_corrupt=False).batches
    if not aborted or not len(b):
        return b[:0]
    attrs = b["attributes"].astype(np.int64)
    txn = ((attrs & _ATTR_TRANSACTIONAL) != 0) & ((attrs & _ATTR_CONTROL) == 0)
    drop = np.zeros(len(b), dtype=bool)
    for t in aborted:
        drop |= (txn & (b["producer_id"] == t.producer_id) & (b["base_offset"] >= t.first_offset)
                 & (b["base_offset"] <= t.last_offset))
    return b[drop]


def aborted_ranges(buf, start: int, end: int, aborted: list[AbortedTxn]) -> np.ndarray:
    """[first, last] offsets (an n x 2 int64 array, in log order) of the batches in
    ``buf[start:end]`` that belong to an ``aborted`` transaction."""
    if not aborted or end <= start:
        return _NO_RANGES
    b = aborted_batches(buf, start, end, aborted)
    return np.stack([b["base_offset"], b["last_offset"]], axis=1).astype(np.int64)


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


def keep_mask(offsets: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """False for each of ``offsets`` inside one of ``ranges`` (disjoint, ascending)."""
    if not len(ranges):
        return np.ones(len(offsets), dtype=bool)
    i = np.searchsorted(ranges[:, 0], offsets, side="right") - 1
    inside = (i >= 0) & (offsets <= ranges[np.maximum(i, 0), 1])
    return ~inside


__all__ = ["READ_UNCOMMITTED", "READ_COMMITTED", "ISOLATION_LEVELS", "read_committed",
           "CommittedView", "committed_view", "replayed_view", "in_range", "aborted_batches", "aborted_ranges",
           "committed_spans", "keep_mask"]
