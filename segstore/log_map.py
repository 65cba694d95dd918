"""LogMap: a store's partition logs by TopicPartition, each loaded at its first use.

Kafka's LogManager loads every log at startup: a broker starts once and runs for months. A
segstore store is opened by every Spark commit and every writing CLI command, which then use
a few partitions of possibly thousands. After a clean shutdown nothing needs recovering and
the writer lock keeps other writers out, so a log's load can wait until the log is first
used: it then runs the same phases on the same files (see :mod:`segstore.loader`). After an
unclean shutdown every log is loaded, and recovered, by the open itself.

A log not loaded yet keeps the recovery point and log start offset the open read from the
checkpoints; :meth:`LogMap.checkpoint_offsets` reports them with the loaded logs' own, so
checkpoints written before it loads keep it. Iterating the map's values or items loads every
log (retention, metrics, the cleaner's choice of log); keys, ``in`` and ``len`` load nothing.
"""

from __future__ import annotations

import threading
from collections import abc
from typing import Callable, Optional

from .errors import StoreClosedError


class LogMap(abc.Mapping):
    """``{TopicPartition: PartitionLog}`` whose entries may be loaded on first lookup."""

    def __init__(self, path: str, compacted: Optional[Callable[[str], bool]] = None):
        self._path = path
        # Whether a topic's cleanup.policy has compact (the cleaner's passes load only those).
        self._compacted = compacted or (lambda topic: True)
        self._loaded: dict = {}
        # tp -> (load(), recovery point, log start offset) of logs not loaded yet.
        self._deferred: dict = {}
        self._frozen = False
        # Loads one log at a time: a lookup racing another for the same log waits for it
        # rather than loading it twice.
        self._lock = threading.RLock()

    # -- the mapping ------------------------------------------------------------------------
    def __getitem__(self, tp):
        lg = self._loaded.get(tp)
        if lg is not None:
            return lg
        with self._lock:
            lg = self._loaded.get(tp)
            if lg is not None:
                return lg
            entry = self._deferred.get(tp)
            if entry is None:
                raise KeyError(tp)
            if self._frozen:
                raise StoreClosedError(f"store {self._path} is closed")
            lg = entry[0]()   # a failure leaves it deferred: the next lookup tries again
            self._loaded[tp] = lg
            del self._deferred[tp]
            return lg

    def __contains__(self, tp) -> bool:
        # Deferred first: a load enters the log in _loaded before it leaves _deferred, so a
        # load finishing between the two lookups cannot make an existing partition look gone.
        return tp in self._deferred or tp in self._loaded

    def __iter__(self):
        with self._lock:
            return iter(list(self._loaded) + list(self._deferred))

    def __len__(self) -> int:
        with self._lock:
            return len(self._loaded) + len(self._deferred)

    def items(self, on_error: Optional[Callable] = None, compacted_only: bool = False) -> list:
        """``(tp, log)`` of every partition, loading those not loaded yet (a snapshot: a
        partition removed meanwhile is left out). With ``on_error(tp, exc)``, a log whose load
        fails is reported to it and left out: one log that cannot load must not stop a pass
        over the others (retention, the cleaner's choice); it is tried again next time.
        ``compacted_only`` loads no log of a topic without ``compact`` (loaded ones are listed
        all the same: the caller checks their config)."""
        out = []
        for tp in list(self):
            if compacted_only and tp not in self._loaded and not self._compacted(tp.topic):
                continue
            try:
                out.append((tp, self[tp]))
            except KeyError:
                continue
            except Exception as e:
                if on_error is None or isinstance(e, StoreClosedError):
                    raise
                on_error(tp, e)
        return out

    def values(self) -> list:
        """Every partition's log, loading those not loaded yet (see :meth:`items`)."""
        return [lg for _, lg in self.items()]

    # -- changes ----------------------------------------------------------------------------
    def add(self, tp, lg) -> None:
        """A log loaded by the caller (a new partition, or any log of an unclean open)."""
        with self._lock:
            self._loaded[tp] = lg
            self._deferred.pop(tp, None)

    def defer(self, tp, load: Callable[[], object], recovery_point: int,
              log_start_offset: int) -> None:
        """Register a log that ``load()`` opens at its first lookup; the offsets are its
        checkpointed ones, written back by checkpoints until it is loaded."""
        with self._lock:
            self._deferred[tp] = (load, recovery_point, log_start_offset)

    def pop(self, tp):
        """Remove a partition and return its log, or None if it was never loaded (a topic's
        deletion then has nothing of it to close, and need not load it: a log that cannot
        load must not stop the deletion halfway). KeyError for an unknown partition."""
        with self._lock:
            if self._deferred.pop(tp, None) is not None:
                return None
            return self._loaded.pop(tp)

    def freeze(self) -> None:
        """The store is closing: no log is loaded from now on (a lookup of one not loaded
        raises StoreClosedError); the deferred ones keep their checkpoint offsets."""
        with self._lock:
            self._frozen = True

    # -- what is loaded ---------------------------------------------------------------------
    def loaded(self) -> dict:
        """``{tp: log}`` of the logs loaded so far (closing and flushing need only these)."""
        with self._lock:
            return dict(self._loaded)

    def get_loaded(self, tp) -> Optional[object]:
        """The partition's log if it is loaded, else None. A load in progress is waited for:
        a caller that changed what the load reads (the topic's config) then sees the log."""
        with self._lock:
            return self._loaded.get(tp)

    def checkpoint_offsets(self) -> tuple[dict, dict, dict]:
        """``(loaded logs, recovery points, log start offsets)``, taken together so that a
        log loading meanwhile is in exactly one of them: the offsets are those of the logs
        not loaded yet, as the open read them."""
        with self._lock:
            return (dict(self._loaded),
                    {tp: e[1] for tp, e in self._deferred.items()},
                    {tp: e[2] for tp, e in self._deferred.items()})
