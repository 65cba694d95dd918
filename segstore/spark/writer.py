"""The segstore sink: batch and streaming Arrow writers with exactly-once commits.

Input columns follow Kafka's sink (ECO §2.3): ``value`` (required, string or binary), ``key``
(string or binary), ``headers`` (``array<struct<key:string,value:binary>>``), ``topic``
(string; the ``topic`` option overrides it) and ``partition`` (int; when null or absent Kafka's
partitioner decides). Other columns are ignored, as Kafka's sink ignores them. Tasks stage
encoded batches (:mod:`.staging`); the driver's ``commit`` publishes them under the writer
lock, ``abort`` deletes them.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from contextlib import contextmanager
from typing import Iterator, Optional

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter

from ..commit_ledger import CommitLedger
from ..store import open as open_store
from . import stores
from .encode import BatchRouter, InputLayout, TopicInfo, topic_info
from .features import STREAM_ARROW_WRITER, to_arrow_schema
from .options import InvalidOptionError, WriteOptions
from .staging import Stager, StagedCommitMessage, discard_job, publish, task_tag
from .worker_heap import freeze_once

if STREAM_ARROW_WRITER:  # pyspark 4.1+: micro-batches arrive as Arrow; 4.0 hands over Rows.
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

_HEADERS_TYPE = "array<struct<key:string,value:binary>>"
log = logging.getLogger("segstore.spark")


def check_input_schema(schema, opts: WriteOptions) -> InputLayout:
    """Validate the input DataFrame's columns as Kafka's sink does; where each column is."""
    from pyspark.sql.types import BinaryType, IntegerType, StringType

    by_name = {f.name.lower(): f for f in schema.fields}

    def column(name: str, allowed: tuple, what: str):
        f = by_name.get(name)
        if f is None:
            return None
        if not isinstance(f.dataType, allowed):
            raise InvalidOptionError(
                f"{name} attribute type must be {what}, but the input has {name!r} of type "
                f"{f.dataType.simpleString()}")
        return f.name

    value = column("value", (StringType, BinaryType), "a string or binary")
    if value is None:
        raise InvalidOptionError(
            "required attribute 'value' not found: the segstore sink writes a 'value' column "
            "(string or binary); input columns: " + ", ".join(schema.fieldNames()))
    key = column("key", (StringType, BinaryType), "a string or binary")
    # With the topic option set, a topic column is ignored whatever its type (Kafka's sink).
    topic = column("topic", (StringType,), "a string") if opts.topic is None else None
    partition = column("partition", (IntegerType,), "an int")
    headers = by_name.get("headers")
    if headers is not None and headers.dataType.simpleString() != _HEADERS_TYPE:
        raise InvalidOptionError(
            f"headers attribute type must be {_HEADERS_TYPE}, but the input has "
            f"{headers.dataType.simpleString()}")
    if topic is None and opts.topic is None:
        raise InvalidOptionError(
            "topic option required when no 'topic' attribute is present: set "
            ".option('topic', ...) or add a string 'topic' column")
    return InputLayout(value=value, key=key, headers=headers.name if headers else None,
                       topic=topic, partition=partition)


def check_topic(opts: WriteOptions) -> Optional[TopicInfo]:
    """With the ``topic`` option, fail at planning (not in every task) if it does not exist;
    its TopicInfo (None without the option)."""
    if opts.topic is None:
        return None
    with stores.readonly(opts.path) as store:
        return topic_info(store, opts.topic)


def write_task(opts: WriteOptions, layout: InputLayout, job: str, batches,
               known: Optional[dict] = None) -> StagedCommitMessage:
    """One task's share of a write: route, encode and stage every input batch.

    ``known`` maps topics to the TopicInfo read at planning; the task opens the store
    (read-only, which reads every partition's metadata) only for other topics.
    """
    if opts.freeze_worker_heap:
        freeze_once()  # the daemon's collection after this task then skips the worker's heap
    tag = task_tag()
    stager = Stager(opts.path, job, tag)
    infos: dict = {}
    store = None

    def info(topic: str):
        nonlocal store
        if topic not in infos:
            if not infos:  # the first batch: the store must still be there
                stores.check_store_dir(opts.path)
            if known is not None and topic in known:
                infos[topic] = known[topic]
                return infos[topic]
            if store is None:
                store = open_store(opts.path, readonly=True)
            infos[topic] = topic_info(store, topic)
        return infos[topic]

    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        router = BatchRouter(layout, opts.topic, info,
                             sticky_seed=ctx.partitionId() if ctx is not None else 0)
        for batch in batches:
            for topic, partition, data, count in router.route(batch):
                stager.add(topic, partition, data, count)
        files = stager.finish()
    except BaseException:
        stager.discard()
        raise
    finally:
        if store is not None:
            store.close()
    return StagedCommitMessage(job=job, task=tag, files=files)


@contextmanager
def _published():
    """Once ``publish`` returned, the write is committed and durable: an error closing the
    store afterwards (a producer snapshot's fsync, say) must not make Spark abort it and a
    rerun of the job append it twice. It is logged instead."""
    done: list = []
    try:
        yield done
    except Exception as e:  # noqa: BLE001 - re-raised unless the commit had completed
        if not done:
            raise
        log.warning("the write was committed, but closing the store afterwards failed: %s", e)


class SegstoreWriter(DataSourceArrowWriter):
    """Batch writer: every task stages, the driver publishes all or nothing."""

    def __init__(self, opts: WriteOptions, layout: InputLayout,
                 info: Optional[TopicInfo] = None):
        self.opts = opts
        self.layout = layout
        self.job = uuid.uuid4().hex
        # The ``topic`` option's TopicInfo, read at planning: tasks need not open the store.
        # A batch job's tasks start moments later; like Kafka's producer, which routes by the
        # metadata it fetched, they route by the partition count read then (the commit checks
        # the batches against the topic's limits again).
        self.known = {opts.topic: info} if info is not None else None

    def write(self, iterator) -> StagedCommitMessage:
        """Stage this task's rows (runs in an executor)."""
        return write_task(self.opts, self.layout, self.job, iterator, self.known)

    def commit(self, messages) -> None:
        """Publish every staged file to its partition: adopted as a segment, or appended when
        small (runs on the driver side)."""
        if not any(m is not None and m.files for m in messages):
            discard_job(self.opts.path, self.job)
            return
        with _published() as done:
            with stores.writable(self.opts.path, self.opts.lock_timeout_ms,
                                 "committing a Spark write") as store:
                publish(store, self.opts.path, self.job, messages)
                done.append(True)

    def abort(self, messages) -> None:
        """A task failed: delete everything the job staged; no partition changes."""
        discard_job(self.opts.path, self.job, aborted=True)


class _StreamCommit:
    """Commit and abort of a micro-batch, shared by the Arrow and the Row stream writers."""

    opts: WriteOptions
    layout: InputLayout
    job: str

    def commit(self, messages, batchId: int) -> None:
        """Publish micro-batch ``batchId`` unless the ledger says it was already published."""
        if not any(m is not None and m.files for m in messages):
            discard_job(self.opts.path, self.job)
            return
        ledger = CommitLedger(self.opts.path, self.opts.checkpoint_location)
        with _published() as done:
            with stores.writable(self.opts.path, self.opts.lock_timeout_ms,
                                 f"committing micro-batch {batchId}") as store:
                publish(store, self.opts.path, self.job, messages, ledger=ledger,
                        batch_id=batchId)
                done.append(True)

    def abort(self, messages, batchId: int) -> None:
        """Drop what micro-batch ``batchId`` staged."""
        discard_job(self.opts.path, self.job)


def _layout_names(layout: InputLayout) -> list:
    return [n for n in (layout.value, layout.key, layout.headers, layout.topic,
                        layout.partition) if n is not None]


def rows_arrow_schema(schema, layout: InputLayout):
    """The Arrow schema of the input columns the sink uses, from the input's Spark schema.

    Rows are converted with it rather than by inference, which would give a column of nulls
    the null type and cannot tell a string ``value`` from a binary one.
    """
    from pyspark.sql.types import StructType

    by_name = {f.name: f for f in schema.fields}
    return to_arrow_schema(StructType([by_name[n] for n in _layout_names(layout)]))


def _rows_to_batches(rows: Iterator, layout: InputLayout, arrow_schema,
                     size: int = 8192) -> Iterator:
    """pyspark 4.0's Row iterator as Arrow batches of ``arrow_schema``."""
    import pyarrow as pa

    names = _layout_names(layout)
    chunk = []
    for row in rows:
        d = row.asDict(recursive=True)
        chunk.append({n: d[n] for n in names})
        if len(chunk) >= size:
            yield pa.RecordBatch.from_pylist(chunk, schema=arrow_schema)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk, schema=arrow_schema)


def stream_job(opts: WriteOptions) -> str:
    """The staging directory name of a streaming query.

    Spark builds one writer for the tasks and another, in another process, for each commit, so
    the name must come from the query itself: its checkpoint location.
    """
    return "stream-" + hashlib.sha1(opts.checkpoint_location.encode("utf-8")).hexdigest()[:24]


if STREAM_ARROW_WRITER:
    class SegstoreStreamWriter(_StreamCommit, DataSourceStreamArrowWriter):
        """Streaming writer (Arrow input): each micro-batch is published exactly once."""

        def __init__(self, opts: WriteOptions, layout: InputLayout):
            self.opts = opts
            self.layout = layout
            self.job = stream_job(opts)

        def write(self, iterator) -> StagedCommitMessage:
            """Stage this task's rows of the micro-batch."""
            return write_task(self.opts, self.layout, self.job, iterator)
else:  # pyspark 4.0
    SegstoreStreamWriter = None


class SegstoreRowStreamWriter(_StreamCommit, DataSourceStreamWriter):
    """Streaming writer for pyspark 4.0, whose stream writers receive Rows: they are turned
    into Arrow batches of the input's types and then staged like the Arrow writer's."""

    def __init__(self, opts: WriteOptions, layout: InputLayout, schema):
        self.opts = opts
        self.layout = layout
        self.arrow_schema = rows_arrow_schema(schema, layout)  # a pyarrow.Schema pickles
        self.job = stream_job(opts)

    def write(self, iterator) -> StagedCommitMessage:
        """Stage this task's rows of the micro-batch."""
        batches = _rows_to_batches(iterator, self.layout, self.arrow_schema)
        return write_task(self.opts, self.layout, self.job, batches)


def make_stream_writer(opts: WriteOptions, layout: InputLayout, schema):
    """The Arrow stream writer when pyspark has one (4.1+), else the Row writer."""
    if SegstoreStreamWriter is not None:
        return SegstoreStreamWriter(opts, layout)
    return SegstoreRowStreamWriter(opts, layout, schema)
