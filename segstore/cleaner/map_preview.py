"""Where an on-demand clean's offset maps would stop, found without cleaning (beyond Kafka):
what ``segstore compact --dry-run`` says about a dirty section too large for one round.

A round maps the dirty section's keys until the map holds ``max_desired_size`` of them, then
cleans only up to the last offset it mapped (REF §6.4, §6.5: mid-segment, even mid-batch), and
``store.compact`` starts another round there. :func:`preview_rounds` runs the real map build
(``OffsetMapBuild.map_dirty_section``, the compiled kernel) into a throwaway map sized by the
store's own ``LogCleaner.map_parameters``, round after round by the loop rule of
``LogCleaner.clean_now`` (``another_round``), so its answer cannot drift from the real run's.
It needs what one real round needs: one map of the same size (its pages touched as it fills)
and the same key count when it fills.

The first round is exact. A later round starts where the one before ended, and cleaning keeps
every record past a round's end offset, so its map sees the same keys in the same order (a
dropped aborted-transaction batch just before the point where a later map fills could move
that round's end by the batch: it never holds mapped keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import _core
from .cleaner import MIN_CHUNK
from .manager import LogToClean
from .map_build import OffsetMapBuild, dedupe_buffer_for
from .service import MAX_MAP_BYTES, LogCleaner, another_round
from .stats import CleanerStats
from .throttler import Throttler


@dataclass
class MapPreview:
    """The rounds an on-demand clean of one partition would take.

    ``rounds``: ``(first dirty offset, end offset)`` of each round, in order (one when the map
    does not fill); ``map_full``: the first round's map fills up; ``dirty_keys``: distinct keys
    of the whole dirty section; ``capacity``: keys one round's map holds (``max_desired_size``);
    ``buffer_size`` / ``threads``: the store's ``log.cleaner.dedupe.buffer.size`` and
    ``log.cleaner.threads``; ``wanted_buffer_size``: the smallest
    ``log.cleaner.dedupe.buffer.size`` that maps the dirty section in one round (None when a
    thread's map would pass its 2 GiB cap)."""

    rounds: list
    map_full: bool
    dirty_keys: int
    capacity: int
    buffer_size: int
    threads: int
    wanted_buffer_size: Optional[int]

    @property
    def clean_end_offset(self) -> int:
        """The offset up to which the first round cleans."""
        return self.rounds[0][1]


class _Rehearsal(OffsetMapBuild):
    """The map build of a Cleaner without its filter: no throttle, no abort checks, no map
    helper (it splits a build only when the map cannot fill, with the same result)."""

    def __init__(self, offset_map: "_core.OffsetMap"):
        self.offset_map = offset_map
        self.chunk_size = MIN_CHUNK   # where a chunk ends does not move where a map stops
        self.map_helper = False
        self.throttler = Throttler(float("inf"))
        self.check_done = lambda tp: None
        self._init_map_build()


class MapPreviewer:
    """Previews partitions one after another with one throwaway map at a time (made when a
    partition needs other map parameters than the last one, as ``LogCleaner.worker`` does).
    :meth:`close` gives its memory back."""

    def __init__(self, cleaner: LogCleaner):
        self.cleaner = cleaner
        self._params: Optional[tuple] = None
        self._rehearsal: Optional[_Rehearsal] = None

    def preview(self, ltc: LogToClean) -> MapPreview:
        """The rounds ``store.compact`` would take over ``ltc``'s dirty section, assuming it
        goes on while its map fills up (with ``force`` it does; without, only while the
        partition is still due after each round). Raises the map build's CorruptRecordError
        on damage in what it reads."""
        lg = ltc.log
        rehearsal = self._rehearsal_for(lg)
        omap = rehearsal.offset_map
        upper = ltc.first_uncleanable_offset
        start, last_end, rounds, dirty_keys, full = ltc.first_dirty_offset, None, [], None, False
        rehearsal.size_advice = True   # the first round that fills counts the keys
        while True:
            stats = CleanerStats()
            end = rehearsal.map_dirty_section(lg, start, upper, stats)
            rounds.append((start, end))
            if dirty_keys is None:
                # The first map holds every dirty key unless it filled; then the build counts them.
                dirty_keys = stats.dirty_keys if stats.map_full else omap.size
                full = stats.map_full
                rehearsal.size_advice = False
            if not another_round(stats, last_end):
                break
            start, last_end = end, end
        omap.clear()   # its pages go back between partitions: a dry run holds one map's worth
        per_thread = dedupe_buffer_for(dirty_keys, omap.load_factor, omap.bytes_per_entry)
        threads = self.cleaner.num_threads
        return MapPreview(
            rounds=rounds, map_full=full, dirty_keys=dirty_keys, capacity=omap.max_desired_size,
            buffer_size=int(self.cleaner.config["log.cleaner.dedupe.buffer.size"]),
            threads=threads,
            wanted_buffer_size=per_thread * threads if per_thread <= MAX_MAP_BYTES else None)

    def _rehearsal_for(self, lg) -> _Rehearsal:
        params = self.cleaner.map_parameters(lg)
        if params != self._params:
            self.close()
            self._rehearsal = _Rehearsal(_core.OffsetMap(*params))
            self._params = params
        return self._rehearsal

    def close(self) -> None:
        """Drop the throwaway map (its pages go back to the OS)."""
        if self._rehearsal is not None:
            self._rehearsal.offset_map.clear()
        self._rehearsal = self._params = None
