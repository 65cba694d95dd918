"""LogCleaner (REF §6.2, §6.13–§6.14): cleaner threads, on-demand cleaning and the metrics.

Each of ``log.cleaner.threads`` threads loops: clean the log the manager picks, run retention
on compacted logs, back off ``log.cleaner.backoff.ms`` when there was nothing to clean. An
error in one log never kills a thread: the partition is quarantined as uncleanable. Every round
logs Kafka's summary on the ``segstore.cleaner`` logger.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from ..errors import CleaningAbortedError, StoreClosedError
from ..records import TopicPartition
from .cleaner import Cleaner
from . import spare_memory
from .manager import LogCleanerManager, LogToClean
from .stats import CleanerStats
from .throttler import Throttler

log = logging.getLogger("segstore.cleaner")

MAX_MAP_BYTES = 2 ** 31 - 1


class LogCleaner:
    """The store's cleaner: threads, the shared throttle, the manager and the last stats.

    ``logs`` returns ``{TopicPartition: PartitionLog}``; ``retention`` runs retention on a list
    of compacted logs (the store's pass); ``config`` is the StoreConfig.
    """

    def __init__(self, path: str, config, logs: Callable[[], dict], clock: Callable[[], int],
                 retention: Optional[Callable] = None):
        self.config = config
        self.clock = clock
        self._logs = logs
        self._retention = retention
        self.manager = LogCleanerManager(path, logs, clock)
        self.throttler = Throttler(config["log.cleaner.io.max.bytes.per.second"])
        self._stop = threading.Event()
        self._threads: list = []
        self.dead_threads = 0
        self.last_stats: dict = {}          # thread id -> CleanerStats of its last round
        self.last_pre_clean: dict = {}      # thread id -> PreCleanStats of its last selection
        self._workers: dict = {}            # thread id -> {strategy: Cleaner}
        self._workers_lock = threading.Lock()
        self._on_demand_ids: dict = {}      # negative ids of on-demand rounds -> thread ident
        self._rounds_ended = threading.Condition(self._workers_lock)
        self.closing = False                # shutdown() began: no new on-demand rounds
        self._memory_released = False       # the store closed: workers go to spare_memory

    # -- workers ----------------------------------------------------------------------------
    @property
    def num_threads(self) -> int:
        return max(int(self.config["log.cleaner.threads"]), 1)

    def map_bytes_per_thread(self) -> int:
        """``log.cleaner.dedupe.buffer.size / log.cleaner.threads``, capped at 2 GiB."""
        per = int(self.config["log.cleaner.dedupe.buffer.size"]) // self.num_threads
        if per > MAX_MAP_BYTES:
            log.warning("dedupe buffer of %d bytes per cleaner thread is capped at %d", per,
                        MAX_MAP_BYTES)
            per = MAX_MAP_BYTES
        return per

    def map_parameters(self, lg) -> tuple:
        """``(memory, load factor, strategy, header)`` of a cleaner thread's offset map for
        the log's compaction strategy: the arguments of ``OffsetMap`` (and of
        ``spare_memory.new_map``)."""
        cfg = lg.config
        strategy = cfg.compaction_strategy
        header = cfg.compaction_strategy_header if strategy == "header" else None
        return (self.map_bytes_per_thread(),
                float(self.config["log.cleaner.io.buffer.load.factor"]), strategy, header)

    def worker(self, thread_id: int, lg) -> Cleaner:
        """The Cleaner of ``thread_id`` for the log's compaction strategy (maps kept per
        thread, as Kafka keeps one per thread; a strategy map keeps 32-byte entries)."""
        params = self.map_parameters(lg)
        key = params[2:]   # (strategy, header)
        with self._workers_lock:
            mine = self._workers.setdefault(thread_id, {})
            worker = mine.get(key)
            if worker is None:
                omap = spare_memory.new_map(*params)
                io = int(self.config["log.cleaner.io.buffer.size"]) // self.num_threads // 2
                # One cleaner thread may borrow a second core for its map build; several
                # threads use the cores themselves (cleaner/map_helper.py).
                worker = Cleaner(thread_id, omap, io, self.throttler, self.clock,
                                 map_helper=self.num_threads == 1)
                _spare(mine)   # one map per thread: a strategy change replaces it
                mine.clear()
                mine[key] = worker
        worker.check_done = self._check_done
        return worker

    def _check_done(self, tp: TopicPartition) -> None:
        if self._stop.is_set():
            raise CleaningAbortedError("the cleaner is shutting down")
        self.manager.check_cleaning_aborted(tp)

    def acquire_on_demand_id(self) -> int:
        """A worker id (-1, -2, ...) for an on-demand round in the calling thread: concurrent
        ``store.compact`` calls never share an offset map or output buffer."""
        with self._workers_lock:
            if self.closing:
                raise StoreClosedError("the store is closing: no new cleaning round can start")
            i = -1
            while i in self._on_demand_ids:
                i -= 1
            self._on_demand_ids[i] = threading.get_ident()
            return i

    def release_on_demand_id(self, i: int) -> None:
        """End an on-demand round: its map is emptied, its pages kept for the next round
        while they are few (cleaner/spare_memory.py); after :meth:`release_memory` its map
        and buffer go to the spare list."""
        with self._workers_lock:
            self._on_demand_ids.pop(i, None)
            self._rounds_ended.notify_all()
            if self._memory_released:
                mine = self._workers.pop(i, {})
            else:
                mine = {}
                for worker in self._workers.get(i, {}).values():
                    spare_memory.clear_for_reuse(worker.offset_map)
        _spare(mine)

    def release_memory(self) -> None:
        """The store is closing (the threads have stopped): every idle worker's map and
        output buffer go to cleaner/spare_memory.py, for the process's next store; those of
        an on-demand round still running (another thread's ``store.compact``, aborting)
        go when it ends."""
        with self._workers_lock:
            self._memory_released = True
            idle = {i: mine for i, mine in self._workers.items()
                    if i not in self._on_demand_ids}
            for i in idle:
                del self._workers[i]
        for mine in idle.values():
            _spare(mine)

    def clean_now(self, tps: list, force: bool = False, now_ms: Optional[int] = None) -> list:
        """On-demand compaction (``store.compact``) in the calling thread: each partition of
        ``tps`` is cleaned round after round until its cleanable section is done (a round ends
        early when the offset map fills up), or a full map makes no progress. Returns each
        round's CleanerStats; errors raise (the partition is marked uncleanable first)."""
        results: list[CleanerStats] = []
        worker = self.acquire_on_demand_id()
        try:
            for tp in tps:
                last_end = None
                while True:
                    now = self.clock() if now_ms is None else now_ms
                    ltc = self.manager.grab_log(tp, now, force=force)
                    if ltc is None:
                        break
                    stats = self.clean_log(worker, ltc, now, raise_errors=True)
                    if stats is None:
                        if self.closing:  # aborted: close() waits for this round
                            raise StoreClosedError("the store was closed during compact()")
                        break
                    results.append(stats)
                    if not another_round(stats, last_end):
                        break
                    last_end = stats.end_offset
        finally:
            self.release_on_demand_id(worker)
        return results

    # -- one round --------------------------------------------------------------------------
    def clean_log(self, thread_id: int, ltc: LogToClean, now: Optional[int] = None,
                  raise_errors: bool = False) -> Optional[CleanerStats]:
        """Clean one grabbed log, checkpoint, log the summary; quarantine it on error."""
        tp = ltc.topic_partition
        lg = ltc.log
        end_offset = ltc.first_dirty_offset
        stats = None
        try:
            worker = self.worker(thread_id, lg)
            truncations = lg.truncations

            def check(tp_):
                self._check_done(tp_)
                if lg.truncations != truncations:
                    raise CleaningAbortedError(f"{tp_.topic}-{tp_.partition} was truncated")
            worker.check_done = check
            end_offset, stats = worker.clean(ltc, now)
            self.last_stats[thread_id] = stats
            log.info("%s", stats.summary())
            pre = self.manager.last_pre_clean_stats
            if pre.delayed_partitions:
                log.info("\tCleanable partitions: %d, Delayed partitions: %d, max delay: %d",
                         pre.cleanable_partitions, pre.delayed_partitions,
                         pre.max_compaction_delay_ms)
            if stats.invalid_messages_read:
                log.warning("\tFound %d invalid messages during compaction.",
                            stats.invalid_messages_read)
        except CleaningAbortedError:
            log.info("cleaning of %s-%d aborted", tp.topic, tp.partition)
            end_offset = ltc.first_dirty_offset
        except Exception as e:
            end_offset = ltc.first_dirty_offset
            self.manager.mark_uncleanable(tp, f"{type(e).__name__}: {e}")
            log.exception("cleaning of %s-%d failed; it is uncleanable until restart",
                          tp.topic, tp.partition)
            if raise_errors:
                raise
        finally:
            self.manager.done_cleaning(tp, end_offset if stats is not None else None)
        return stats

    def try_clean_filthiest_log(self, thread_id: int, now: Optional[int] = None) -> bool:
        """Pick and clean one log; run retention on compacted logs. True when a log was cleaned."""
        now = self.clock() if now is None else now

        def failed(tp, e):
            self.manager.mark_uncleanable(tp, f"{type(e).__name__}: {e}")
            log.error("cannot compute the cleanable range of %s-%d: %s", tp.topic,
                      tp.partition, e)
        ltc = self.manager.grab_filthiest_compacted_log(now, on_error=failed)
        self.last_pre_clean[thread_id] = self.manager.last_pre_clean_stats
        cleaned = False
        if ltc is not None:
            self.clean_log(thread_id, ltc, now)
            cleaned = True
        self.run_compacted_retention(now)
        return cleaned

    def run_compacted_retention(self, now: Optional[int] = None) -> None:
        """Retention (REF §5) on compacted logs that are not being cleaned (REF §6.2 step 2)."""
        if self._retention is None:
            return
        grabbed = self.manager.deletable_logs()
        try:
            if grabbed:
                self._retention([lg for _, lg in grabbed], now)
        except Exception:
            log.exception("retention of compacted logs failed")
        finally:
            self.manager.done_deleting([tp for tp, _ in grabbed])

    # -- threads ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> None:
        """Start ``log.cleaner.threads`` threads (none when disabled or 0)."""
        if self._threads or not self.config["log.cleaner.enable"]:
            return
        n = int(self.config["log.cleaner.threads"])
        self._stop.clear()
        for i in range(n):
            t = threading.Thread(target=self._run, args=(i,), daemon=True,
                                 name=f"segstore-log-cleaner-thread-{i}")
            t.start()
            self._threads.append(t)

    def _run(self, thread_id: int) -> None:
        backoff = self.config["log.cleaner.backoff.ms"] / 1000.0
        try:
            while not self._stop.is_set():
                cleaned = False
                try:
                    cleaned = self.try_clean_filthiest_log(thread_id)
                except Exception:  # never let one bad pass kill the thread
                    log.exception("log cleaner thread %d failed a pass", thread_id)
                self.manager.forget_missing_uncleanable()
                if not cleaned:
                    self._stop.wait(backoff)
        except BaseException:
            self.dead_threads += 1
            log.exception("log cleaner thread %d died", thread_id)
            raise

    def shutdown(self) -> None:
        """Stop the threads and wait for other threads' on-demand rounds, aborting rounds in
        progress (their .cleaned files are removed): the store closes its logs only after."""
        with self._workers_lock:
            self.closing = True
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []
        me = threading.get_ident()
        with self._rounds_ended:  # a round aborts at its next check (each chunk)
            while any(t != me for t in self._on_demand_ids.values()):
                self._rounds_ended.wait()

    # -- metrics (REF §6.14) ------------------------------------------------------------------
    def metrics(self, now: Optional[int] = None) -> dict:
        """Kafka's LogCleaner and LogCleanerManager gauges."""
        now = self.clock() if now is None else now
        stats = list(self.last_stats.values())
        pres = list(self.last_pre_clean.values()) or [self.manager.last_pre_clean_stats]
        read = sum(s.bytes_read for s in stats)
        written = sum(s.bytes_written for s in stats)
        return {
            "max-buffer-utilization-percent": int(max((100 * s.buffer_utilization
                                                       for s in stats), default=0)),
            "cleaner-recopy-percent": int(100 * written / max(read, 1)),
            "max-clean-time-secs": int(max((s.elapsed_secs for s in stats), default=0)),
            "max-compaction-delay-secs": int(max(p.max_compaction_delay_ms for p in pres) / 1000),
            "DeadThreadCount": self.dead_threads,
            "max-dirty-percent": int(100 * self.manager.dirtiest_ratio),
            "time-since-last-run-ms": now - self.manager.time_of_last_run,
            "uncleanable-partitions-count": len(self.manager.uncleanable),
            "uncleanable-bytes": self.manager.uncleanable_bytes(),
        }


def another_round(stats: CleanerStats, last_end: Optional[int]) -> bool:
    """Whether an on-demand clean (``clean_now``) tries another round of a partition after
    the round of ``stats`` (the round before it ended at ``last_end``): only when the map
    filled up, and made progress."""
    return stats.map_full and stats.end_offset != last_end


def _spare(workers: dict) -> None:
    """Give the maps and output buffers of ``workers`` (``{(strategy, header): Cleaner}``,
    no longer used) to cleaner/spare_memory.py."""
    for (_, header), worker in workers.items():
        spare_memory.give_map(worker.offset_map, header)
        worker.release_buffer()
