"""CleanedTransactionMetadata (REF §6.8–§6.9): which transaction markers and data a cleaning
pass may drop.

Aborted data is known from the ``.txnindex`` entries collected for the cleaned range. An ABORT
marker stays (and its entry is written to the new segment's txn index) while data of its
transaction was seen in this pass; a COMMIT marker stays while data of its transaction was seen
since the transaction began. One instance is carried across all groups of a round (KAFKA-8351).
"""

from __future__ import annotations

import heapq
from typing import Callable, Optional

from ..records import ControlRecordType


class _AbortedTxnState:
    __slots__ = ("txn", "last_observed_batch_offset")

    def __init__(self, txn):
        self.txn = txn
        self.last_observed_batch_offset: Optional[int] = None


class CleanedTransactionMetadata:
    """Tracks ongoing committed and aborted transactions while batches are read in order."""

    def __init__(self):
        self._aborted: list = []             # heap of (first_offset, seq, AbortedTxn)
        self._seq = 0
        self.ongoing_committed: set = set()
        self.ongoing_aborted: dict = {}      # producer id -> _AbortedTxnState
        self.txn_index_sink: Optional[Callable] = None  # appends kept AbortedTxn entries

    def add_aborted_transactions(self, txns) -> None:
        """Queue aborted transactions (from ``.txnindex``) that the pass will meet."""
        for t in txns:
            heapq.heappush(self._aborted, (t.first_offset, self._seq, t))
            self._seq += 1

    def _consume_aborted_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0][0] <= offset:
            txn = heapq.heappop(self._aborted)[2]
            self.ongoing_aborted.setdefault(txn.producer_id, _AbortedTxnState(txn))

    def on_control_batch_read(self, producer_id: int, last_offset: int,
                              control_type: Optional[int]) -> bool:
        """Whether a control batch may be discarded (once its horizon has passed).

        ``control_type`` is None for an empty control batch (always discardable)."""
        self._consume_aborted_up_to(last_offset)
        if control_type is None:
            return True
        if control_type == ControlRecordType.ABORT:
            state = self.ongoing_aborted.pop(producer_id, None)
            if state is not None and state.last_observed_batch_offset is not None:
                if self.txn_index_sink is not None:
                    self.txn_index_sink(state.txn)
                return False
            return True
        if control_type == ControlRecordType.COMMIT:
            # Removable only if no batch of this transaction was traversed in this pass.
            if producer_id in self.ongoing_committed:
                self.ongoing_committed.discard(producer_id)
                return False
            return True
        return False

    def on_batch_read(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        """Whether a data batch belongs to an aborted transaction (and so is dropped)."""
        self._consume_aborted_up_to(last_offset)
        if not transactional:
            return False
        state = self.ongoing_aborted.get(producer_id)
        if state is not None:
            state.last_observed_batch_offset = last_offset
            return True
        self.ongoing_committed.add(producer_id)
        return False
