"""Task-side encoding: Arrow rows of the sink's input into v2 record batches per partition.

Each input ``RecordBatch`` is routed as Kafka's producer would route it: the ``partition``
column when set, else murmur2 of the key (Kafka's default partitioner), else one sticky partition
per batch for null keys. Rows are grouped by target with one stable sort, then each group is
encoded in one compiled pass that gathers its rows straight from the Arrow buffers
(``_core.encode_columns`` with ``order``; records with headers take Arrow ``take`` and
``_core.encode_batch``). Base offsets stay 0: the driver's commit rewrites them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np

from .. import _core
from ..column_append import BATCH_OVERHEAD, RECORD_OVERHEAD_MAX
from ..columns import BinaryColumn
from ..errors import InvalidRecordError, RecordTooLargeError, UnknownTopicOrPartitionError

RECORDS_PER_BATCH = 4096  # what PartitionLog.append_columns uses
# A header count above 127 takes up to 4 more bytes than column_append's bound; each header
# adds its key and value lengths, 5 bytes at most each.
RECORD_WITH_HEADERS_OVERHEAD_MAX = RECORD_OVERHEAD_MAX + 4
HEADER_OVERHEAD_MAX = 10


@dataclass(frozen=True)
class InputLayout:
    """Where the sink's columns are in the input (names as the DataFrame spells them)."""

    value: str
    key: Optional[str] = None
    headers: Optional[str] = None
    topic: Optional[str] = None
    partition: Optional[str] = None


@dataclass(frozen=True)
class TopicInfo:
    """What encoding needs to know of a target topic."""

    partitions: int
    max_batch_bytes: int
    max_message_bytes: int
    codec: int
    compact: bool = False  # keyless records refused, as Kafka's broker does
    level: Optional[int] = None  # compression.<codec>.level
    hosted: Optional[tuple] = None  # a broker's log dir: the partitions it holds (None: all)


def topic_info(store, topic: str) -> TopicInfo:
    """A topic's partition count, batch size limit and codec, from a (read-only) store."""
    if topic not in store.list_topics():
        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} does not exist in {store.path}; create it first, e.g. "
            f"segstore.open(path).create_topic({topic!r}, num_partitions=...)")
    cfg = store.topic_config(topic)
    ct = cfg.compression_type
    codec = 0 if ct in ("producer", "uncompressed") else ct
    from ..compression import codec_id

    count, hosted = store.num_partitions(topic), store.partitions_for(topic)
    return TopicInfo(partitions=count,
                     max_batch_bytes=min(cfg.max_message_bytes, cfg.segment_bytes),
                     max_message_bytes=cfg.max_message_bytes, codec=codec_id(codec),
                     compact=cfg.compact, level=cfg.compression_level(codec_id(codec)),
                     hosted=None if len(hosted) == count else tuple(hosted))


def _check_keys(keys: Optional[BinaryColumn], rows, topic: str, partition: int) -> None:
    """A compacted topic's rows all have keys (Kafka's broker refuses the others)."""
    if keys is None or not bool((keys.valid if rows is None else keys.valid[rows]).all()):
        raise InvalidRecordError(
            f"Compacted topic cannot accept message without key in topic partition "
            f"{topic}-{partition}: write a non-null 'key' column (the log cleaner would delete "
            f"keyless records)")


def binary_column(arr) -> BinaryColumn:
    """A string/binary (or large_*) Arrow array as a BinaryColumn sharing its data buffer."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    t = arr.type
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        off_type = np.int64
    elif pa.types.is_binary(t) or pa.types.is_string(t):
        off_type = np.int32
    else:
        raise InvalidRecordError(f"expected a string or binary column, got {t}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_type)[arr.offset:arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = (np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and bufs[2].size
            else np.empty(0, dtype=np.uint8))
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
    else:
        valid = np.ones(n, dtype=np.bool_)
    return BinaryColumn(data, offsets, valid)


def _headers_lists(arr) -> list:
    """Arrow ``list<struct<key,value>>`` cells as kafka-python style ``[(key, value)]`` lists."""
    out = []
    for cell in arr.to_pylist():
        if cell is None:
            out.append(None)
            continue
        pairs = []
        for h in cell:
            if h is None or h.get("key") is None:
                raise InvalidRecordError("a header has a null key; Kafka header keys are "
                                         "non-null strings")
            value = h.get("value")
            pairs.append((h["key"], value.encode("utf-8") if isinstance(value, str) else value))
        out.append(pairs)
    return out


def _taken(arr, idx):
    """``arr`` with rows ``idx`` (all rows when idx is None; None stays None)."""
    if arr is None or idx is None:
        return arr
    return arr.take(idx)


class BatchRouter:
    """Routes and encodes input batches; ``info(topic)`` supplies each target's TopicInfo."""

    def __init__(self, layout: InputLayout, topic_override: Optional[str],
                 info: Callable[[str], TopicInfo], sticky_seed: int = 0):
        self.layout = layout
        self.topic_override = topic_override
        self.info = info
        self._sticky = sticky_seed

    def _topics(self, batch, n: int):
        """(list of topic names, int32 topic index per row)."""
        import pyarrow.compute as pc

        if self.topic_override is not None:
            return [self.topic_override], np.zeros(n, dtype=np.int32)
        col = batch.column(self.layout.topic)
        if col.null_count:
            raise InvalidRecordError(
                "null topic present in the data; set the sink option 'topic' or give every "
                "row a topic")
        enc = pc.dictionary_encode(col)
        return (enc.dictionary.to_pylist(),
                enc.indices.to_numpy(zero_copy_only=False).astype(np.int32))

    def _partitions(self, batch, topics: list, topic_idx: np.ndarray, keys) -> np.ndarray:
        n = batch.num_rows
        infos = [self.info(t) for t in topics]
        if self.layout.partition is None and keys is not None and len(infos) == 1:
            # The common case, one topic and keys: murmur2 alone (-1 marks null keys).
            part = _core.murmur2_partitions(keys, infos[0].partitions)
            return self._sticky_nulls(part, np.array([infos[0].partitions]), topic_idx,
                                      topics, infos)
        part = np.full(n, -1, dtype=np.int32)
        given = None
        if self.layout.partition is not None:
            col = batch.column(self.layout.partition)
            given = col.is_valid().to_numpy(zero_copy_only=False)
            vals = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            part[given] = vals[given]
        counts = np.array([i.partitions for i in infos], dtype=np.int64)
        if given is not None and given.any():
            bad = given & ((vals < 0) | (vals >= counts[topic_idx]))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise UnknownTopicOrPartitionError(
                    f"partition {int(vals[i])} does not exist in topic {topics[topic_idx[i]]!r}, "
                    f"which has {int(counts[topic_idx[i]])} partitions")
        todo = part < 0
        if not todo.any():
            return part
        if keys is not None:
            # Kafka's default partitioner: murmur2 of the key (one pass per partition count).
            per_topic = set(counts.tolist())
            for count in per_topic:
                hashed = _core.murmur2_partitions(keys, int(count))
                rows = todo if len(per_topic) == 1 else todo & (counts[topic_idx] == count)
                part[rows] = hashed[rows]
        return self._sticky_nulls(part, counts, topic_idx, topics, infos)

    def _sticky_nulls(self, part: np.ndarray, counts: np.ndarray, topic_idx: np.ndarray,
                      topics: list, infos: list) -> np.ndarray:
        """Rows still at -1 (null keys): one sticky partition per input batch, moving on with
        each batch (in a broker's log dir, among the partitions it holds, as Kafka's
        partitioner picks among available ones)."""
        todo = part < 0
        if todo.any():
            self._sticky += 1
            part[todo] = (self._sticky % counts[topic_idx[todo]]).astype(np.int32)
        for t, info in enumerate(infos):
            if info.hosted is None:
                continue
            rows = topic_idx == t
            if todo.any():
                part[todo & rows] = info.hosted[self._sticky % len(info.hosted)]
            missing = rows & ~np.isin(part, info.hosted)
            if missing.any():
                raise UnknownTopicOrPartitionError(
                    f"partition {int(part[np.flatnonzero(missing)[0]])} of topic {topics[t]!r} "
                    f"is not in this store: a Kafka broker's log dir holds only the partitions "
                    f"it hosts ({list(info.hosted)})")
        return part

    def route(self, batch) -> Iterator[tuple]:
        """Yield ``(topic, partition, encoded batches, record count)`` for one input batch; the
        batches are bytes-like: bytes, or a read-only memoryview (of pooled memory when large)."""
        import pyarrow as pa

        n = batch.num_rows
        if n == 0:
            return
        lay = self.layout
        topics, topic_idx = self._topics(batch, n)
        keys_arr = batch.column(lay.key) if lay.key is not None else None
        keys = binary_column(keys_arr) if keys_arr is not None else None
        part = self._partitions(batch, topics, topic_idx, keys)
        values_arr = batch.column(lay.value)
        headers_arr = batch.column(lay.headers) if lay.headers is not None else None
        # Rows are grouped by (topic, partition) with a stable sort on one small integer per
        # row (numpy sorts 16-bit keys by radix), then encoded through `order`: no row copy.
        width = int(part.max()) + 1
        group = part if len(topics) == 1 else topic_idx.astype(np.int64) * width + part
        now = int(time.time() * 1000)
        if len(topics) * width <= 1 << 15:
            counts = np.bincount(group, minlength=len(topics) * width)
            groups = np.flatnonzero(counts)
            ends = np.cumsum(counts[groups])
            runs = list(zip(groups.tolist(), (ends - counts[groups]).tolist(), ends.tolist()))
            order = (None if len(runs) == 1
                     else np.argsort(group.astype(np.int16), kind="stable"))
        elif (group == group[0]).all():
            order, runs = None, [(int(group[0]), 0, n)]
        else:
            order = np.argsort(group, kind="stable")
            group = group[order]
            cuts = np.flatnonzero(np.diff(group)) + 1
            edges = [0, *cuts.tolist(), n]
            runs = [(int(group[a]), a, b) for a, b in zip(edges, edges[1:])]
        values = binary_column(values_arr)
        for g, a, b in runs:
            topic, partition = topics[g // width], g % width
            info = self.info(topic)
            rows = None if order is None else order[a:b]
            if info.compact:
                _check_keys(keys, rows, topic, partition)
            if headers_arr is None:
                data = self._encode_columns(values, keys, rows, now, info, topic)
            else:
                idx = None if rows is None else pa.array(rows)
                data = self._encode_with_headers(
                    _taken(values_arr, idx), _taken(keys_arr, idx), _taken(headers_arr, idx),
                    now, info)
            yield topic, partition, data, b - a

    @staticmethod
    def _encode_columns(values, keys, rows, now: int, info: TopicInfo,
                        topic: str) -> memoryview:
        limit = info.max_batch_bytes
        while True:
            enc = _core.encode_columns(values, keys, now, records_per_batch=RECORDS_PER_BATCH,
                                       max_batch_bytes=limit, compression=info.codec,
                                       compression_level=info.level, order=rows)
            sizes = enc.batches["size"]
            if not len(sizes) or int(sizes.max()) <= info.max_message_bytes:
                return enc.data
            worst = int(np.argmax(sizes))
            if int(enc.batches["records_count"][worst]) == 1:
                raise RecordTooLargeError(
                    f"a record for topic {topic!r} encodes to a {int(sizes[worst])}-byte batch, "
                    f"over its max.message.bytes={info.max_message_bytes}")
            # Batches are planned by their records' uncompressed size, and a codec can make
            # incompressible bytes a little larger: plan smaller batches and encode again.
            limit //= 2

    @staticmethod
    def _encode_with_headers(values_arr, keys_arr, headers_arr, now: int,
                             info: TopicInfo) -> bytes:
        values = binary_column(values_arr)
        keys = binary_column(keys_arr) if keys_arr is not None else None
        vals = values.to_pylist()
        ks = keys.to_pylist() if keys is not None else [None] * len(vals)
        hs = _headers_lists(headers_arr)
        # An upper bound of each record's encoded size (varints at their widest), so a batch of
        # them fits max.message.bytes with its header; a record too large alone is refused
        # below, as _encode_columns refuses it.
        sizes = (values.lengths + (keys.lengths if keys is not None else 0)
                 + RECORD_WITH_HEADERS_OVERHEAD_MAX).tolist()
        limit = info.max_batch_bytes - BATCH_OVERHEAD
        out, start, acc = [], 0, 0
        for i in range(len(vals) + 1):
            if i < len(vals):
                extra = sizes[i] + sum(len(k.encode("utf-8")) + len(v or b"")
                                       + HEADER_OVERHEAD_MAX for k, v in hs[i] or ())
            if i == len(vals) or (i > start and (acc + extra > limit
                                                 or i - start >= RECORDS_PER_BATCH)):
                pending = [(start, i)]
                while pending:  # a compressed batch over the limit is split in two (see above)
                    a, b = pending.pop()
                    batch = _core.encode_batch(vals[a:b], ks[a:b], hs[a:b], now,
                                               compression=info.codec,
                                               compression_level=info.level)
                    if len(batch) <= info.max_message_bytes:
                        out.append(batch)
                    elif b - a > 1:
                        pending += [((a + b) // 2, b), (a, (a + b) // 2)]
                    else:
                        raise RecordTooLargeError(
                            f"a record with headers encodes to a {len(batch)}-byte batch, over "
                            f"the topic's max.message.bytes={info.max_message_bytes}")
                start, acc = i, 0
            if i < len(vals):
                acc += extra
        return b"".join(out)
