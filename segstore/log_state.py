"""The immutable snapshot a PartitionLog's readers work on (copy-on-write, REF §3.1)."""

from __future__ import annotations

from typing import NamedTuple


class LogState(NamedTuple):
    """Segments (oldest first), log start offset and log end offset, replaced as one value."""

    segments: tuple
    log_start_offset: int
    log_end_offset: int
