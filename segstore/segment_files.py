"""A segment's file names and suffixes (Kafka's LogFileUtils and LocalLog file naming,
REF §2.1-§2.2).

A segment's four files share one name, its base offset in 20 digits, with the kind's suffix
(``.log``, ``.index``, ``.timeindex``, ``.txnindex``). A temporary suffix after that marks a
segment in flight: ``.cleaned`` (written by the cleaner), ``.swap`` (about to replace others),
``.deleted`` (retired, unlinked later).
"""

from __future__ import annotations

import mmap
import os

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"


def filename_prefix(offset: int) -> str:
    """The 20-digit, zero-padded base offset that names a segment's files."""
    return f"{offset:020d}"


def is_segment_file(name: str) -> bool:
    """A name Kafka (and segstore) gives a segment's files: 20 digits, a dot, the suffix."""
    return len(name) > 21 and name[:20].isdigit() and name[20] == "."


def segment_paths(directory: str, base_offset: int, suffix: str = "") -> dict[str, str]:
    """Paths of a segment's four files (with an optional temporary suffix)."""
    p = os.path.join(directory, filename_prefix(base_offset))
    return {kind: p + kind + suffix for kind in
            (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)}


def replace_suffix(path: str, old: str, new: str) -> str:
    """``path`` with its ending ``old`` replaced by ``new`` (Kafka's Utils.replaceSuffix)."""
    if not path.endswith(old):
        raise ValueError(f"{path} does not end in {old!r}")
    return path[:len(path) - len(old)] + new


def write_all(fd: int, data, position: int, path: str) -> None:
    """``pwrite`` all of ``data`` at ``position``, continuing after short writes; an OSError
    (with its errno, e.g. ENOSPC, and ``path``) when the file takes no more."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        try:
            done += os.pwrite(fd, view[done:], position + done)
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror} (writing {len(view) - done} bytes at "
                                   f"{position + done})", path) from None


def advise_huge_folios(mm: mmap.mmap) -> None:
    """Ask for huge folios under a shared map of a log file (``MADV_HUGEPAGE``).

    Pages the map faults in from disk then come into the page cache as 2 MiB folios where the
    filesystem supports them (ext4 and xfs on recent kernels), and they stay that way for every
    later map of the file: mapping a 64 MiB segment again costs a few hundred faults instead of
    thousands (measured 0.2 ms against 4.3 ms for a segment read back from disk without it).
    Pages already cached keep their size; the hint changes nothing else, and a kernel without
    it ignores it.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mm.madvise(advice)
        except OSError:
            pass  # advisory only


def read_map(fd: int, length: int) -> mmap.mmap:
    """A read-only shared map of a log file's first ``length`` bytes, asking for huge folios
    (:func:`advise_huge_folios`). Every map that reads a log file is made here or advised so:
    the first one to fault a page in from disk decides the page's folio size for all."""
    mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ)
    advise_huge_folios(mm)
    return mm
