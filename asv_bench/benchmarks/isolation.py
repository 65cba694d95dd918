"""read_committed reads: ``read_columns(isolation_level="read_committed")`` against the same
call at ``read_uncommitted`` on the same log, in the same run.

Data: 200,000 records of 16-byte keys and 100-byte values (the codec data set's first rows),
1,000 records per uncompressed batch. Every tenth batch is transactional (producer 1, one batch
per transaction, each followed by its marker), and every other transaction aborts: 10,000
records (5%) are aborted. The log has two sealed 16 MiB segments and the rest in the active one.

The store is opened read-only, as Spark's executors open it: the committed read finds the
bound and the aborted transactions by replaying the batch headers, scans the headers of the
range to cut the aborted batches out, and decodes the rest (5% fewer records). ``track_ratio_committed_vs_uncommitted`` is uncommitted time / committed time (unit
"x"): about 1 means the isolation costs nothing beyond what it saves. No issue sets a target;
this guards the filter's cost.
"""

from __future__ import annotations

import os
import shutil

import segstore
from segstore.columns import BinaryColumn

from .common import best_of_pair, make_record_arrays

N = 200_000
PER_BATCH = 1_000
TOPIC = "txn"


def isolation_cache(_bench=None) -> dict:
    """asv ``setup_cache``: build the transactional log once."""
    root = os.path.abspath("isolation-store")
    shutil.rmtree(root, ignore_errors=True)
    keys, values, timestamps = make_record_arrays(N)
    with segstore.open(root) as store:
        store.create_topic(TOPIC, 1, {"segment.bytes": 16 << 20})
        log = store.partition(TOPIC, 0)
        seq = 0
        for i in range(N // PER_BATCH):
            sl = slice(i * PER_BATCH, (i + 1) * PER_BATCH)
            k = BinaryColumn.from_fixed(keys[sl])
            v = BinaryColumn.from_fixed(values[sl])
            if i % 10 == 9:
                log.append_batch(v.to_pylist(), k.to_pylist(), timestamps_ms=timestamps[sl].tolist(),
                                 producer_id=1, producer_epoch=0, base_sequence=seq,
                                 is_transactional=True)
                seq += PER_BATCH
                kind = (segstore.ControlRecordType.ABORT if (i // 10) % 2 == 0
                        else segstore.ControlRecordType.COMMIT)
                log.append_control(kind, producer_id=1, producer_epoch=0)
            else:
                log.append_columns(v, keys=k, timestamps_ms=timestamps[sl])
        aborted = len(log.read_columns()) - len(log.read_columns(isolation_level="read_committed"))
        assert aborted == N // PER_BATCH // 20 * PER_BATCH, aborted
    return {"root": root}


class RatioReadCommitted:
    """Whole-log ``read_columns``: read_committed vs read_uncommitted."""

    setup_cache = isolation_cache
    unit = "x"
    timeout = 120

    def setup(self, meta):
        self.store = segstore.open(meta["root"], readonly=True)
        self.log = self.store.partition(TOPIC, 0)

    def teardown(self, meta):
        self.store.close()

    def time_read_columns_committed(self, meta):
        self.log.read_columns(isolation_level="read_committed")

    def time_read_columns_uncommitted(self, meta):
        self.log.read_columns()

    def track_ratio_committed_vs_uncommitted(self, meta):
        t_unc, t_com = best_of_pair(lambda: self.log.read_columns(),
                                    lambda: self.log.read_columns(isolation_level="read_committed"),
                                    repeat=7)
        return t_unc / t_com
