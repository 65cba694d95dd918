"""The store's retention passes, Kafka's LogManager.cleanupLogs: :meth:`enforce_retention`
over every log (``tick`` runs it on schedule), and the pass over compacted logs that cleaner
threads run after each cleaning attempt (REF §6.2).

A mixin of :class:`segstore.store.LogStore`.
"""

from __future__ import annotations

import logging
from typing import Optional

from .errors import now_argument
from .retention import RetentionReport, enforce as _enforce_retention

log = logging.getLogger("segstore.store")


class RetentionPasses:
    """enforce_retention, and the compacted logs' pass the cleaner calls back."""

    def enforce_retention(self, now_ms: Optional[int] = None, dry_run: bool = False, *,
                          include_compacted: bool = True) -> RetentionReport:
        """Delete old segments by ``retention.ms``, ``retention.bytes`` and the log start offset
        (REF §5), in every partition; returns what went, per partition.

        The rules follow each topic's ``cleanup.policy`` as it is now (so altered configs apply
        at the next pass): ``delete`` and ``compact,delete`` apply all three, ``compact`` and the
        empty policy only the log-start-offset rule. Deleted segments are renamed ``.deleted``
        and removed ``file.delete.delay.ms`` later by :meth:`tick` (or at close). ``now_ms``
        defaults to the store clock; ``dry_run=True`` changes nothing (read-only stores allow
        it).

        Kafka runs retention of compacted logs from its cleaner threads, after each cleaning
        attempt; so does segstore when its cleaner threads run (:meth:`tick` then passes
        ``include_compacted=False``). Without them, this pass covers compacted logs too.
        """
        if dry_run:
            self._check_open()
        else:
            self._check_writable()
        now = now_argument(now_ms, self.clock)
        report = RetentionReport(now_ms=now, dry_run=dry_run)
        def unloadable(tp, e):
            log.error("retention of %s-%d: its log cannot be loaded: %s", tp.topic,
                      tp.partition, e)
            report.errors[tp] = f"{type(e).__name__}: {e}"
        with self._lock:
            logs = self._logs.items(on_error=unloadable)
        for tp, lg in logs:
            if not include_compacted and lg.config.compact:
                continue
            if lg.offline and not dry_run:  # said once when it went offline, not every pass
                report.errors[tp] = f"KafkaStorageError: log {tp.topic}-{tp.partition} is offline"
                continue
            try:
                # The store's lock before the log's, the order delete_topic and close take them:
                # deleting segments schedules them on the store's queue (the store's lock) while
                # holding the log's lock. Appends and reads take neither.
                with self._lock:
                    if lg.closed:
                        continue  # its topic was deleted during the pass
                    report.partitions[tp] = _enforce_retention(lg, now, dry_run=dry_run)
            except Exception as e:  # one failing partition must not stop the others
                log.exception("retention of %s-%d failed", tp.topic, tp.partition)
                report.errors[tp] = f"{type(e).__name__}: {e}"
        return report

    def _retain_compacted(self, logs, now: Optional[int]) -> None:
        # Called by cleaner threads with logs the manager marked in progress.
        now = self.clock() if now is None else now
        tps = [lg.topic_partition for lg in logs]
        for lg in logs:
            # delete_topic holds the store's lock while it waits for these logs to leave the
            # in-progress state: give them back rather than wait for the lock (both would
            # wait until the abort's timeout); retention runs at the next pass.
            while not self._lock.acquire(timeout=0.05):
                if self.cleaner.manager.any_aborted(tps):
                    return
            try:
                if lg.closed:
                    continue
                _enforce_retention(lg, now)
            except Exception:
                log.exception("retention of %s-%d failed", lg.topic, lg.partition)
            finally:
                self._lock.release()
