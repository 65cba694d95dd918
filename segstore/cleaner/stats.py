"""CleanerStats and PreCleanStats (REF §6.13): what one cleaning round did, and Kafka's summary.

Start, map-complete and end times are wall-clock (monotonic) milliseconds: they measure how
long a round took, which the store's injectable clock (the time rules' clock) does not. The
summary's rates guard against a zero elapsed time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

MB = 1024 * 1024


def _mb(x: float) -> float:
    return x / MB


@dataclass
class CleanerStats:
    """Counters of one cleaning round, with Kafka's field names in snake case."""

    topic: str = ""
    partition: int = -1
    thread_id: int = 0
    first_dirty_offset: int = 0
    end_offset: int = 0              # the next dirty offset after this round
    bytes_read: int = 0              # log bytes the filter read (the whole cleaned range)
    bytes_written: int = 0
    map_bytes_read: int = 0          # bytes read while building the offset map
    map_messages_read: int = 0
    messages_read: int = 0
    invalid_messages_read: int = 0   # keyless records, all removed
    messages_written: int = 0
    buffer_utilization: float = 0.0  # offset map entries / slots at the end of the round
    map_full: bool = False           # the round stopped because the map filled up
    start_time: int = 0
    map_complete_time: int = 0
    end_time: int = 0
    segments_cleaned: int = 0        # source segments rewritten
    segments_written: int = 0        # cleaned segments swapped in
    wanted_buffer_bytes: Optional[int] = None  # dedupe buffer that would cover the dirty section
    dirty_keys: Optional[int] = None  # its distinct keys (counted when the map filled up)
    forced: bool = False

    @property
    def elapsed_secs(self) -> float:
        """Wall time of the round in seconds."""
        return max(self.end_time - self.start_time, 0) / 1000.0

    @property
    def elapsed_index_secs(self) -> float:
        """Time spent building the offset map, in seconds."""
        return max(self.map_complete_time - self.start_time, 0) / 1000.0

    @property
    def topic_partition(self) -> str:
        return f"{self.topic}-{self.partition}"

    def summary(self) -> str:
        """Kafka's per-round INFO message (LogCleaner.recordStats), starting with a newline."""
        elapsed = self.elapsed_secs
        index = self.elapsed_index_secs
        clean = max(elapsed - index, 0.0)

        def rate(x: float, secs: float) -> float:
            return x / secs if secs > 0 else 0.0

        def share(part: float) -> float:
            return 100.0 * part / elapsed if elapsed > 0 else 0.0

        lines = [
            f"\tLog cleaner thread {self.thread_id} cleaned log {self.topic_partition} "
            f"(dirty section = [{self.first_dirty_offset}, {self.end_offset}])",
            f"\t{_mb(self.bytes_read):,.1f} MB of log processed in {elapsed:,.1f} seconds "
            f"({_mb(rate(self.bytes_read, elapsed)):,.1f} MB/sec).",
            f"\tIndexed {_mb(self.map_bytes_read):,.1f} MB in {index:.1f} seconds "
            f"({_mb(rate(self.map_bytes_read, index)):,.1f} Mb/sec, {share(index):.1f}% of "
            f"total time)",
            f"\tBuffer utilization: {100.0 * self.buffer_utilization:.1f}%",
            f"\tCleaned {_mb(self.bytes_read):,.1f} MB in {clean:.1f} seconds "
            f"({_mb(rate(self.bytes_read, clean)):,.1f} Mb/sec, {share(clean):.1f}% of total "
            f"time)",
            f"\tStart size: {_mb(self.bytes_read):,.1f} MB ({self.messages_read:,d} messages)",
            f"\tEnd size: {_mb(self.bytes_written):,.1f} MB ({self.messages_written:,d} messages)",
            f"\t{self.size_reduction_percent:.1f}% size reduction "
            f"({self.message_reduction_percent:.1f}% fewer messages)",
        ]
        return "\n" + "\n".join(lines) + "\n"

    @property
    def size_reduction_percent(self) -> float:
        return 100.0 * (1.0 - self.bytes_written / self.bytes_read) if self.bytes_read else 0.0

    @property
    def message_reduction_percent(self) -> float:
        return (100.0 * (1.0 - self.messages_written / self.messages_read)
                if self.messages_read else 0.0)

    def as_dict(self) -> dict:
        """Every counter plus the derived times (for DataFrames and JSON)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["elapsed_secs"] = self.elapsed_secs
        d["elapsed_index_secs"] = self.elapsed_index_secs
        return d


@dataclass
class PreCleanStats:
    """What a selection pass saw (Kafka's PreCleanStats): max-lag delays among candidates."""

    max_compaction_delay_ms: int = 0
    delayed_partitions: int = 0
    cleanable_partitions: int = 0
    max_dirty_ratio: float = 0.0
    overdue: list = field(default_factory=list)

    def record_delay(self, delay_ms: int) -> None:
        if delay_ms > 0:
            self.delayed_partitions += 1
            self.max_compaction_delay_ms = max(self.max_compaction_delay_ms, delay_ms)
