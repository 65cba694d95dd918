"""Offset maps and output buffers kept for the next round, and the next store (beyond Kafka).

Kafka's cleaner threads allocate their dedupe buffer once and keep it. segstore's cleaner memory
lived with a store, and an on-demand round gave its map's pages back when it ended: a pipeline
that opens a store per task (a Spark worker) or compacts on demand made, and faulted in, new
ones every time. On this project's VMs a page the guest gave back a while ago is backed anew by
the hypervisor at its next touch (free page reporting): a map build whose 6 MiB table landed
on such pages spent 15 ms zeroing them instead of 1 (same process, same faults), and the
two-thread benchmark's slower thread waited on exactly that.

So a finished on-demand round keeps its map's pages, zeroed, while its table is at most
``KEPT_TABLE_BYTES``, and a closed store's maps and output buffers wait here (at most
``MAX_SPARE`` of each, their pages kept on the same rule) until a cleaner of the same sizes
takes them. A map or buffer taken from here behaves exactly as a new one.
"""

from __future__ import annotations

import mmap
import os
import threading

from .. import _core

KEPT_TABLE_BYTES = 16 << 20   # a larger table's pages go back to the OS between rounds
MAX_SPARE = 2                 # maps, and buffers, kept for later stores (two threads' worth)
MAX_BUFFER_BYTES = 32 << 20   # a larger output buffer (grown for one batch) is not kept

_lock = threading.Lock()
_maps: list = []      # (key, OffsetMap), most recently given last
_buffers: list = []   # mmap, most recently given last


def _map_key(memory: int, load_factor: float, strategy: str, header) -> tuple:
    return (memory, load_factor, strategy, header)


def clear_for_reuse(omap: "_core.OffsetMap") -> None:
    """Empty ``omap`` after its last round: its pages zeroed and kept when its table is at
    most KEPT_TABLE_BYTES, else given back to the OS."""
    omap.clear(keep_pages=omap.table_slots * omap.bytes_per_entry <= KEPT_TABLE_BYTES)


def new_map(memory: int, load_factor: float, strategy: str = "offset",
            header=None) -> "_core.OffsetMap":
    """An empty OffsetMap of these parameters: a spare one if there is one."""
    key = _map_key(memory, load_factor, strategy, header)
    with _lock:
        for i in range(len(_maps) - 1, -1, -1):
            if _maps[i][0] == key:
                return _maps.pop(i)[1]
    return _core.OffsetMap(memory, load_factor, strategy, header)


def give_map(omap: "_core.OffsetMap", header=None) -> None:
    """Keep ``omap`` (no longer used; made with strategy header ``header``) for a later
    :func:`new_map`."""
    clear_for_reuse(omap)
    key = _map_key(omap.memory, omap.load_factor, omap.strategy, header)
    with _lock:
        _maps.append((key, omap))
        del _maps[:-MAX_SPARE]


def new_buffer(size: int):
    """A round's output buffer of ``size`` bytes: anonymous memory whose pages the kernel
    supplies, zeroed, as the filter first writes them (a bytearray is zeroed whole at once:
    12.5 MiB took 5 ms of page faults), or a spare one of that size (its old bytes are never
    read: the filter reads back only what it wrote)."""
    with _lock:
        for i in range(len(_buffers) - 1, -1, -1):
            if len(_buffers[i]) == size:
                return _buffers.pop(i)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def give_buffer(buf) -> None:
    """Keep an output buffer (no longer used) for a later :func:`new_buffer`; one grown
    beyond MAX_BUFFER_BYTES (for an outsized batch) is let go."""
    if len(buf) > MAX_BUFFER_BYTES:
        return
    with _lock:
        _buffers.append(buf)
        del _buffers[:-MAX_SPARE]


def _forget_lock() -> None:
    # A forked child (a Spark worker) may have been forked while another thread held it.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lock)
