"""The store's scheduled tasks, Kafka's LogManager scheduler: the log flusher (``flush.ms``),
the recovery-point and log-start-offset checkpoints, retention, producer-id expiration and the
deletion of ``.deleted`` segments, run once by :meth:`ScheduledTasks.tick` or on a background
thread by :meth:`ScheduledTasks.start_services`.

A mixin of :class:`segstore.store.LogStore`.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from .errors import KafkaStorageError, now_argument

log = logging.getLogger("segstore.store")


class ScheduledTasks:
    """tick and start_services."""

    def tick(self, now_ms: Optional[int] = None) -> None:
        """Run what the background services do, once: flush by ``flush.ms``, write
        checkpoints when due, run retention every ``log.retention.check.interval.ms`` (the
        first pass 30 s after opening, or one interval if shorter), expire idle producers every
        ``producer.id.expiration.check.interval.ms`` and delete ``.deleted`` segments whose
        delay has passed."""
        if self.readonly or self._closed:
            return
        now = now_argument(now_ms, self.clock)
        for lg in self._logs.loaded().values():   # the others have nothing unflushed
            try:
                lg.maybe_flush(now)
            except KafkaStorageError:  # offline now; the other logs are still flushed
                log.exception("flushing %s-%d failed", lg.topic, lg.partition)
        interval = min(self.config["log.flush.offset.checkpoint.interval.ms"],
                       self.config["log.flush.start.offset.checkpoint.interval.ms"])
        if now - self._last_checkpoint_ms >= interval:
            self.write_checkpoints()
            self._last_checkpoint_ms = now
        if now >= self._next_retention_ms:
            self._next_retention_ms = now + self.config.retention_check_interval_ms
            # Running cleaner threads do compacted logs' retention after each round (REF §6.2).
            self.enforce_retention(now_ms=now, include_compacted=not self.cleaner.running)
        if now >= self._next_expiration_ms:
            self._next_expiration_ms = now + self.config.producer_id_expiration_check_interval_ms
            # A log not loaded yet expires its producers when it loads.
            for lg in self._logs.loaded().values():
                lg.remove_expired_producers(now)
        self._deletes.delete_due(now)

    def start_services(self) -> None:
        """Start the background thread that runs :meth:`tick` (flusher, checkpoints, retention,
        producer expiration, deletes) and the ``log.cleaner.threads`` cleaner threads."""
        self._check_writable()
        if self._services:
            return
        self.cleaner.start()
        period = max(0.05, min(1.0, self.config["log.flush.scheduler.interval.ms"] / 1000.0))

        def run():
            while not self._stop.wait(period):
                try:
                    self.tick()
                except Exception:  # a service error must never kill the store
                    log.exception("segstore background service failed")
        t = threading.Thread(target=run, name="segstore-services", daemon=True)
        t.start()
        self._services.append(t)
