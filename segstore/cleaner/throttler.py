"""The cleaners' shared I/O throttle (``log.cleaner.io.max.bytes.per.second``, REF §6.2).

Like Kafka's Throttler: bytes read and written by every cleaner thread are counted; every 300 ms
of wall time the observed rate is compared with the limit and the caller sleeps long enough to
bring it back. Wall time (not the store clock) is the right measure of an I/O rate; ``time``
and ``sleep`` are injectable so tests do not wait.
"""

from __future__ import annotations

import threading
import time as _time
from typing import Callable

CHECK_INTERVAL_S = 0.3


class Throttler:
    """Limits the combined byte rate of its callers to ``bytes_per_second``."""

    def __init__(self, bytes_per_second: float, *, time: Callable[[], float] = _time.monotonic,
                 sleep: Callable[[float], None] = _time.sleep):
        self.bytes_per_second = float(bytes_per_second)
        self._time = time
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start = time()
        self._observed = 0
        self.total_sleep_s = 0.0

    @property
    def unlimited(self) -> bool:
        return self.bytes_per_second >= 1.7e308

    def maybe_throttle(self, nbytes: int) -> None:
        """Count ``nbytes`` of I/O; sleep when the rate of this period exceeds the limit."""
        if self.unlimited or nbytes <= 0:
            return
        with self._lock:
            self._observed += nbytes
            now = self._time()
            elapsed = now - self._period_start
            if elapsed < CHECK_INTERVAL_S:
                return
            rate = self._observed / elapsed
            pause = 0.0
            if rate > self.bytes_per_second:
                pause = self._observed / self.bytes_per_second - elapsed
            self._period_start = now
            self._observed = 0
        if pause > 0:
            self.total_sleep_s += pause
            self._sleep(pause)
            with self._lock:
                self._period_start = self._time()
