"""The durable record of which streaming micro-batches a segstore sink has committed.

Spark replays a micro-batch (same batch id, same data) when it stopped after the sink committed
but before its own commit log said so. The sink therefore keeps, per streaming query, the highest
batch id it has published in ``<root>/.segstore/spark-commits/<hash>.json``, keyed by the query's
checkpoint location and written atomically (temp file, fsync, rename). A batch id at or below it
is skipped. Like Spark's file sink metadata, the record outlives the checkpoint: a new query that
reuses a deleted checkpoint's location must also use a new location for its batches to land.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Optional

from .checkpoint import write_atomic
from .errors import CorruptMetadataError

LEDGER_DIR = os.path.join(".segstore", "spark-commits")
KEEP_RECENT = 20  # recent batches kept in the file for inspection


class CommitLedger:
    """Committed batch ids of one streaming query (its checkpoint location) in one store."""

    def __init__(self, root: str, location: str):
        self.location = location
        digest = hashlib.sha1(location.encode("utf-8")).hexdigest()[:24]
        self.path = os.path.join(root, LEDGER_DIR, digest + ".json")

    def _load(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return {"checkpointLocation": self.location, "lastBatchId": None, "recent": []}
        except ValueError:
            # Written whole and renamed into place: only damage makes it unreadable, and
            # without it no replay can be told from a new batch.
            raise CorruptMetadataError(
                f"unreadable commit ledger {self.path} of the streaming query at "
                f"{self.location!r}") from None

    def last_batch_id(self) -> Optional[int]:
        """The highest committed batch id, or None before the first commit."""
        return self._load()["lastBatchId"]

    def is_committed(self, batch_id: int) -> bool:
        """True when ``batch_id`` (or a later batch) has been committed."""
        last = self.last_batch_id()
        return last is not None and batch_id <= last

    def record(self, batch_id: int, records: int) -> None:
        """Durably mark ``batch_id`` committed (call only after its records are flushed)."""
        state = self._load()
        recent = state.get("recent", [])[-(KEEP_RECENT - 1):]
        recent.append({"batchId": batch_id, "records": records,
                       "committedAtMs": int(time.time() * 1000)})
        state.update(lastBatchId=batch_id, recent=recent)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_atomic(self.path, json.dumps(state, indent=1))
