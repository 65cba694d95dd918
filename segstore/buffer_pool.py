"""The buffer pool: freed column buffers are kept and reused by the next column read.

``read_columns`` and ``decode_columns`` write about 140 MB of columns for 1M records of 100-byte
values. Fresh memory costs the kernel a page fault and a zeroing pass before the first write,
which was a fifth of such a read. So the large output arrays (64 KiB or more) come from a pool of
anonymous mappings: when the last array viewing a block is freed, the block is kept, up to
:func:`limit` bytes, and the next read of a similar size writes into memory that is already
mapped. The idea is Kafka's producer ``BufferPool`` and Arrow's memory pool.

The pool is per process and shared by every store. Its limit starts at 256 MiB, or
``SEGSTORE_BUFFER_POOL_BYTES`` when that is set in the environment (``0`` turns pooling off).
Kept blocks count in the process's resident memory until :func:`release` unmaps them, a later
read reuses them, or a lower limit evicts them (oldest first). Arrays handed out are ordinary
writable numpy arrays; a block is reused only once nothing views it any more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import _core
from .errors import InvalidArgumentError, InvalidConfigError, is_int

ENV_LIMIT = "SEGSTORE_BUFFER_POOL_BYTES"
DEFAULT_LIMIT = 256 << 20
MAX_LIMIT = (1 << 63) - 1


@dataclass(frozen=True)
class BufferPoolStats:
    """A snapshot of the buffer pool."""

    limit_bytes: int    #: free bytes the pool may keep
    free_bytes: int     #: bytes kept for reuse now
    free_blocks: int    #: blocks kept for reuse now
    in_use_bytes: int   #: bytes of pooled blocks that live arrays view
    hits: int           #: allocations served by a kept block
    misses: int         #: allocations that mapped fresh memory


def set_limit(nbytes: int) -> int:
    """Keep at most ``nbytes`` of freed buffers (0 turns pooling off); returns the old limit.

    Lowering the limit unmaps kept blocks, oldest first, until the rest fit.
    """
    if not is_int(nbytes) or not 0 <= nbytes <= MAX_LIMIT:
        raise InvalidArgumentError(f"buffer pool limit must be an int from 0 to {MAX_LIMIT}, "
                                   f"got {nbytes!r}")
    nbytes = int(nbytes)
    return _core.buffer_pool_set_limit(nbytes)


def limit() -> int:
    """The number of freed bytes the pool may keep."""
    return stats().limit_bytes


def release() -> int:
    """Unmap every kept block (arrays in use are untouched); returns the bytes given back."""
    return _core.buffer_pool_release()


def stats() -> BufferPoolStats:
    """The pool's limit, what it keeps, what live arrays use, and its hit and miss counts."""
    return BufferPoolStats(*_core.buffer_pool_stats())


def _limit_from_env(environ=os.environ) -> int:
    raw = environ.get(ENV_LIMIT)
    if raw is None or raw.strip() == "":
        return DEFAULT_LIMIT
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_LIMIT:
        raise InvalidConfigError(
            f"{ENV_LIMIT} must be a whole number of bytes from 0 to {MAX_LIMIT}, got {raw!r}")
    return value


_core.buffer_pool_set_limit(_limit_from_env())
