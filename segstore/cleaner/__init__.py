"""The log cleaner (compaction), mirroring Kafka's LogCleaner (REF §6).

``manager`` (LogCleanerManager: ranges, ratios, selection, states, checkpoints), ``cleaner``
(Cleaner: group, filter, swap), ``map_build`` (the offset map build of a round),
``map_helper`` (a second core for a lone cleaner thread), ``service`` (LogCleaner: threads and
metrics), ``stats`` (CleanerStats and Kafka's summary), ``transactions``
(CleanedTransactionMetadata), ``throttler``.
The offset map and the filter kernel are in ``segstore._core`` (OffsetMap, BatchFilter).
"""

from .._core import OffsetMap
from .cleaner import Cleaner, group_segments_by_size
from .manager import LogCleanerManager, LogToClean
from .service import LogCleaner
from .stats import CleanerStats, PreCleanStats
from .throttler import Throttler

__all__ = ["OffsetMap", "Cleaner", "group_segments_by_size", "LogCleanerManager", "LogToClean",
           "LogCleaner", "CleanerStats", "PreCleanStats", "Throttler"]
