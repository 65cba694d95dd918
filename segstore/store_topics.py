"""LogStore's topic administration (Kafka's CreateTopics, DeleteTopics and
IncrementalAlterConfigs on one store): a mixin of :class:`~segstore.store.LogStore`, kept apart
so the store's module stays about loading, lookups and services."""

from __future__ import annotations

import os
import shutil
import uuid
from collections import abc
from typing import Iterable, Mapping, Optional

from .checkpoint import fsync_dir
from .config import TopicConfig
from .errors import InvalidConfigError, TopicAlreadyExistsError
from .records import TopicPartition
from .topic import (hosted_partitions, mark_partitions, remove_topic_meta,
                    validate_partition_count, validate_topic_name, write_topic_meta)


class TopicAdmin:
    """create_topic, delete_topic and alter_topic_config of :class:`LogStore` (whose
    attributes they use: ``path``, ``config``, ``_lock``, ``_topics``, ``_logs``, ...)."""

    def create_topic(self, name: str, num_partitions: int = 1,
                     config: Optional[Mapping] = None) -> None:
        """Create a topic with ``num_partitions`` empty partitions and config overrides."""
        self._check_writable()
        validate_topic_name(name)
        validate_partition_count(num_partitions)
        cfg = TopicConfig.from_dict(config or {}, defaults=self.config.topic_defaults())
        with self._lock:
            if name in self._topics:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            write_topic_meta(self.path, name, num_partitions, cfg)
            self._topics[name] = {"partitions": num_partitions, "config": cfg, "hosted": None}
            created = []
            try:
                for p in range(num_partitions):
                    tp = TopicPartition(name, p)
                    self._logs.add(tp, self._open_log(tp, cfg, 0, 0, True))
                    created.append(tp)
                mark_partitions(self.path, name, range(num_partitions))
                fsync_dir(self.path)
            except BaseException:
                # All or nothing: a partition that could not be created (out of descriptors or
                # space, say) must not leave a topic that cannot be opened again.
                self._undo_create(name, created)
                raise

    def _undo_create(self, name: str, created: list) -> None:
        """Remove what a failed create_topic made: its partitions, then its metadata."""
        del self._topics[name]
        logs = [self._logs.pop(tp) for tp in created]
        for lg in logs:  # all closed first: removing a directory needs descriptors too
            try:
                lg.close()
            except Exception:  # closing what never held data; the directory goes anyway
                # Out of descriptors, say: a close needs one (the producer snapshot, the index
                # trims) and stopped before releasing the segments' own. They are dropped
                # without trimming instead, or every close fails alike, the rmtree below fails
                # for want of descriptors (silently) and the partitions left behind come back
                # at the next open as a topic.
                for seg in lg._state.segments:
                    seg.delete_files()
        # The partition that failed may have made its directory too.
        for p in range(len(created) + 1):
            shutil.rmtree(os.path.join(self.path, f"{name}-{p}"), ignore_errors=True)
        remove_topic_meta(self.path, name)
        fsync_dir(self.path)

    def delete_topic(self, name: str) -> None:
        """Close and remove every partition of a topic (renamed ``*-delete`` first, like Kafka)."""
        self._check_writable()
        with self._lock:
            meta = self._topic(name)
            for p in hosted_partitions(meta):
                tp = TopicPartition(name, p)
                if not self.readonly:  # stop a round in progress before the files go
                    self.cleaner.manager.abort_and_pause_cleaning(tp)
                lg = self._logs.pop(tp)   # None: never loaded, nothing to close
                if lg is not None:
                    lg.close()
                directory = os.path.join(self.path, f"{name}-{p}")
                self._deletes.forget(directory)
                # Kafka's <topic>-<p>.<uuid>-delete, the topic cut so the name fits 255 bytes.
                suffix = f"-{p}.{uuid.uuid4().hex}-delete"
                gone = os.path.join(self.path, name[:255 - len(suffix)] + suffix)
                os.replace(directory, gone)
                shutil.rmtree(gone, ignore_errors=True)
                self.cleaner.manager.remove_partition(tp)
            remove_topic_meta(self.path, name)  # none for a topic found in a Kafka log dir
            del self._topics[name]
            fsync_dir(self.path)

    def alter_topic_config(self, name: str, set: Optional[Mapping] = None,
                           delete: Iterable[str] = ()) -> TopicConfig:
        """Change a topic's overrides (Kafka's ``--alter --add-config/--delete-config``)."""
        self._check_writable()
        with self._lock:
            meta = self._topic(name)
            if set is not None and not isinstance(set, abc.Mapping):
                raise InvalidConfigError(f"set must be a mapping of config keys to values, not "
                                         f"{type(set).__name__}")
            if isinstance(delete, (str, bytes)) or not isinstance(delete, abc.Iterable):
                raise InvalidConfigError(f"delete must be a list of config keys, not "
                                         f"{delete!r}")
            cfg = meta["config"].with_updates(set or {}, tuple(delete))
            write_topic_meta(self.path, name, meta["partitions"], cfg, hosted=meta["hosted"])
            mark_partitions(self.path, name, hosted_partitions(meta))  # a Kafka log dir's topic
            meta["config"] = cfg
            for p in hosted_partitions(meta):
                # A log not loaded yet takes the topic's config when it loads.
                lg = self._logs.get_loaded(TopicPartition(name, p))
                if lg is not None:
                    lg.config = cfg
            return cfg
