"""Read-only logs following a live writer in another process (design §1.7).

A mixin of :class:`segstore.log.PartitionLog`: a read-only log re-lists its directory before
each read, picks up new and vanished segments, notices a file the writer replaced (truncation
writes a new file under the old name, a cleaning round swaps in its cleaned copy), and ends at the last complete, CRC-valid batch of the
active segment, scanning only the bytes added since its last look.
"""

from __future__ import annotations

import os

from . import _core
from .log_state import LogState as _State
from .segment import LOG_SUFFIX, SWAP_SUFFIX, LogSegment

LISTING_ATTEMPTS = 5


class ReadOnlyFollower:
    """``_refresh``: the read-only log's view of the directory, brought up to date."""

    # (segment, lo, hi): tail bytes refreshes CRC-checked since the last read took them.
    _fresh_crc = None
    # (names, their segment files) of the last listing: names are parsed only when they change.
    _listing_memo = None
    # {segment log file name: inode number} of the last listing.
    _listed_inodes: dict = {}

    def _take_fresh_crc(self):
        """The tail range refreshes CRC-checked since the last read, for that read only (later
        reads check their bytes again)."""
        fresh, self._fresh_crc = self._fresh_crc, None
        return fresh

    def _open_listed(self, listing: list) -> list:
        """The listed segments, opened (those of the last state reused while their files are
        the same), ``.swap`` ones in place of the ``.log`` files they replace."""
        prev = self._state.segments
        old = {(s.base_offset, s.suffix): s for s in prev}
        segs = []
        for b, suffix in listing:
            s = old.get((b, suffix))
            # Every segment, also when the listing is the one of the last look: a cleaning
            # round swaps a sealed segment for its cleaned copy under the same name, as
            # truncation writes a new file under the old one's.
            if s is not None and self._listed_inodes.get(s._ro_name) != s._inode \
                    and _replaced(s):  # the listing's inode is free; stat only when it differs
                s.close()  # a new file took the old one's name: read that one
                s = None
            if s is None:
                try:
                    s = LogSegment(self.directory, b, self.config, self.clock, readonly=True,
                                   suffix=suffix)
                except FileNotFoundError:
                    continue  # deleted or renamed since the listing: listed again
                s._ro_scan = (0, 0, None)  # (file length seen, valid end, next offset)
                s._ro_name = os.path.basename(s.log_path)
            segs.append(s)
        swaps = [s for s in segs if s.suffix == SWAP_SUFFIX]
        if swaps:
            lo = min(s.base_offset for s in swaps)
            hi = max(s.read_next_offset() for s in swaps)
            segs = [s for s in segs if s.suffix == SWAP_SUFFIX or not lo <= s.base_offset < hi]
        return segs

    def _segment_files(self) -> list:
        """(base offset, suffix) of the directory's segment log files, sorted: a new listing
        each call, whose names are parsed again only when they differ from the last call's
        (the same names in the same order: the same segment files)."""
        try:
            with os.scandir(self.directory) as it:
                entries = list(it)
        except FileNotFoundError:
            self._listed_inodes = {}
            return []
        names = [e.name for e in entries]
        # The segment files' inode numbers come with the listing (no stat on Linux): a held
        # segment whose name now has another inode was replaced (a cleaning round's swap, a
        # truncation's new file). A file system whose listing reports other numbers than stat
        # (some overlay set-ups) only costs the stat that confirms each.
        kinds = _KINDS
        self._listed_inodes = {e.name: e.inode() for e in entries if e.name[20:] in kinds}
        memo = self._listing_memo
        if memo is not None and memo[0] == names:
            return memo[1]
        listing = _segment_files_in(names)
        self._listing_memo = (names, listing)
        return listing

    def _refresh(self) -> None:
        """Read-only logs re-list the directory: new segments, vanished ones, the tail."""
        if not self.readonly or self._closed:
            return
        with self._lock:
            # A listing taken while the writer renames files (a swap, a deletion) can miss
            # segments: the segments are opened, then the directory listed again, until both
            # listings agree.
            prev = self._state.segments
            listing = self._segment_files()
            for _ in range(LISTING_ATTEMPTS):
                segs = self._open_listed(listing)
                again = self._segment_files()
                if again == listing:
                    break
                _close_unless_in(segs, prev)  # opened by this attempt
                listing = again
            # Vanished segments are closed: a read still using one starts over on this state.
            _close_unless_in(prev, segs)
            same_listing = [s.base_offset for s in prev] == [s.base_offset for s in segs]
            if not segs:
                self._state = _State((), self._ro_start, self._ro_start)
                return
            # Sealed segments are whole files; the last one ends at its last CRC-valid batch.
            if not same_listing:
                for s in segs[:-1]:
                    size = os.fstat(s._fd).st_size  # held open: safe if deleted meanwhile
                    if size != s.size:
                        s.size = size
                        s._max_ts = None  # it grew since its largest timestamp was read
            tail = segs[-1]
            length = os.fstat(tail._fd).st_size
            seen, valid_end, next_offset = tail._ro_scan
            if length != seen:
                # Only the bytes added since the last look are scanned (CRC-checked).
                res = _core.scan_batches(tail.buffer(length), valid_end, length,
                                         validate_crc=True, raise_on_corrupt=False)
                b = res.batches
                if res.valid_end > valid_end:
                    # The batches just checked: the next read need not check them again.
                    fresh = self._fresh_crc
                    lo = fresh[1] if fresh and fresh[0] is tail and fresh[2] == valid_end \
                        else valid_end
                    self._fresh_crc = (tail, lo, res.valid_end)
                valid_end = res.valid_end
                if len(b):
                    next_offset = int(b["last_offset"][-1]) + 1
                    tail._max_ts = None  # read again with the new batches (offset_for_time)
                tail._ro_scan = (length, valid_end, next_offset)
            tail.size = valid_end
            leo = next_offset if next_offset is not None else tail.base_offset
            if len(segs) > 1 and next_offset is None:
                leo = max(leo, segs[-2].read_next_offset())
            start = max(self._ro_start, segs[0].base_offset)
            self._state = _State(tuple(segs), min(start, leo), leo)


def _segment_files_in(names: list) -> list:
    """(base offset, suffix) of the segment log files among ``names``, sorted. A ``.log.swap``
    is a committed cleaned segment that has not yet taken its name (REF §2.2): it replaces
    every ``.log`` whose base lies in its offset range, as the loader's phase 3 decides."""
    # Every read lists the directory twice: the suffix is tested first, so the other files
    # (indexes, snapshots) cost one slice each. A name ending in a kind's suffix after 20
    # characters is a segment file (is_segment_file) when those are digits.
    kinds = _KINDS
    return sorted([(int(n[:20]), kinds[n[20:]]) for n in names
                   if n[20:] in kinds and n[:20].isdigit()])


_KINDS = {LOG_SUFFIX: "", LOG_SUFFIX + SWAP_SUFFIX: SWAP_SUFFIX}


def _close_unless_in(segments, kept) -> None:
    ids = {id(s) for s in kept}
    for s in segments:
        if id(s) not in ids:
            s.close()


def _replaced(seg: LogSegment) -> bool:
    """True when the segment's path now names another file than the one held open."""
    try:
        return os.stat(seg.log_path).st_ino != seg._inode
    except (FileNotFoundError, OSError):
        return True
