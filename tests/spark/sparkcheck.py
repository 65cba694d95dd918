"""Helpers for the Spark tests: expected rows straight from ``PartitionLog.read_columns``.

A Spark result is collected with ``DataFrame.toArrow()`` (no timezone conversion) and compared
column by column with what segstore's own column reader returns for the same offset ranges.
"""

from __future__ import annotations

import numpy as np

import segstore

COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def collect(df) -> dict:
    """Rows of ``df`` as Python lists per column, sorted by (topic, partition, offset);
    ``timestamp`` as microseconds since the epoch."""
    import pyarrow as pa

    table = df.toArrow()
    keys = [(c, "ascending") for c in ("topic", "partition", "offset") if c in table.column_names]
    if keys:
        table = table.sort_by(keys)
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if name == "timestamp":
            col = col.cast(pa.int64())
        out[name] = col.to_pylist()
    return out


def expected(root: str, ranges, headers: bool = False) -> dict:
    """What a read of ``[(topic, partition, start, end)]`` must return, via read_columns."""
    out = {name: [] for name in COLUMNS + (["headers"] if headers else [])}
    with segstore.open(root, readonly=True) as store:
        for topic, partition, start, end in sorted(ranges):
            lg = store.partition(topic, partition)
            if start >= end:
                continue
            cols = lg.read_columns(start, end, include_headers=headers)
            n = len(cols)
            out["key"] += cols.keys.to_pylist()
            out["value"] += cols.values.to_pylist()
            out["topic"] += [topic] * n
            out["partition"] += [partition] * n
            out["offset"] += cols.offsets.tolist()
            out["timestamp"] += (cols.timestamps_ms.astype(np.int64) * 1000).tolist()
            out["timestampType"] += cols.timestamp_types.astype(int).tolist()
            if headers:
                # Spark's Kafka source: a record without headers has a null headers cell.
                out["headers"] += [[{"key": k, "value": v} for k, v in h] if h else None
                                   for h in cols.headers.to_pylist()]
    return out


def whole(root: str, topic: str) -> list:
    """``[(topic, p, log start, log end)]`` for every partition of a topic."""
    with segstore.open(root, readonly=True) as store:
        return [(topic, p, store.partition(topic, p).log_start_offset,
                 store.partition(topic, p).log_end_offset) for p in store.partitions_for(topic)]


def end_offsets(root: str, topic: str) -> dict:
    """{partition: log end offset}."""
    with segstore.open(root, readonly=True) as store:
        return {p: store.partition(topic, p).log_end_offset for p in store.partitions_for(topic)}


def records(root: str, topic: str) -> list:
    """Every record of a topic as (partition, key, value, headers) in offset order."""
    out = []
    with segstore.open(root, readonly=True) as store:
        for p in store.partitions_for(topic):
            for r in store.partition(topic, p).iter_records():
                out.append((p, r.key, r.value, list(r.headers or [])))
    return out


def stage(root, job, topic, partition, values, keys=None):
    """Stage one file as a Spark write task would; its commit message."""
    from segstore import _core
    from segstore.spark import staging

    stager = staging.Stager(root, job, staging.task_tag())
    stager.add(topic, partition, _core.encode_batch(values, keys), len(values))
    return staging.StagedCommitMessage(job=job, task=stager.task, files=stager.finish())
