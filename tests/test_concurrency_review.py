"""Concurrency review: one store used by several threads at once.

The failing tests reproduce races deterministically: the "other thread" is run to completion
(in a real thread, joined) at the exact moment a reader is between two steps, by wrapping one
segstore function with a hook. Each hook fires once, only in the reading thread. The passing
tests pin behaviour under real concurrent use that was probed and found correct.
"""

from __future__ import annotations

import os
import threading

import pytest

import segstore
from test_cleaner_flush_failures import _open_fds_to
from segstore import index as index_mod
from segstore import log_reads
from segstore.errors import SegstoreError, StoreClosedError, StoreLockedError
from segstore.segment import LogSegment

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


def _run_in_other_thread(fn):
    """Run ``fn`` to completion in another thread (what a concurrent writer would do)."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # pragma: no cover - reported by the caller
            box["error"] = e
    t = threading.Thread(target=target)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the other thread hung"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _once_in_this_thread(action):
    """A guard: ``action`` runs the first time it is called from the creating thread only."""
    me = threading.get_ident()
    state = {"done": False}

    def maybe():
        if not state["done"] and threading.get_ident() == me:
            state["done"] = True
            _run_in_other_thread(action)
    return maybe


def _store_fds(root: str) -> list[str]:
    """Descriptors this process holds open on the store's files."""
    return _open_fds_to(str(root))


def _before_segments_from(monkeypatch, action) -> None:
    """Run ``action`` (once, in another thread) after a read's checks, just before it takes
    the segments of its snapshot."""
    real = log_reads.LogReads._segments_from

    def segments_from(self, state, offset):
        action()
        return real(self, state, offset)
    monkeypatch.setattr(log_reads.LogReads, "_segments_from", segments_from)


def _fill(log, n, start=0):
    for i in range(start, start + n):
        log.append(b"value-%d" % i, key=b"k%d" % (i % 7), timestamp_ms=T0 + i)


SMALL = {"segment.bytes": 4096, "segment.index.bytes": 4096, "index.interval.bytes": 128}


# ----------------------------------------------------------------------------------------------
# Findings (fail on the current code)
# ----------------------------------------------------------------------------------------------

def test_read_racing_a_roll_returns_records_not_valueerror(tmp_path, monkeypatch):
    """A reader that has taken the active segment's offset index when an append rolls the
    segment (roll -> release_files -> OffsetIndex.close sets its map to None while `entries`
    stays) fails with a bare ValueError ("N entries do not fit an index buffer of 0 bytes")
    or struct.error instead of returning the records. Seen in stress runs in 2 of 3 runs of
    3 appending + 2 reading threads with segment.bytes=4096."""
    clock = Clock()
    with segstore.open(str(tmp_path), clock=clock) as st:
        st.create_topic("t", 1, config=SMALL)
        lg = st.partition("t", 0)
        _fill(lg, 30)  # one segment, several offset-index entries
        assert len(lg.segments) == 1 and lg.segments[0].offset_index.entries > 0

        roll = _once_in_this_thread(lambda: lg.roll())
        real_lookup = index_mod.OffsetIndex.lookup

        def lookup(self, offset):
            roll()  # the writer rolls between the reader taking the index and using it
            return real_lookup(self, offset)
        monkeypatch.setattr(index_mod.OffsetIndex, "lookup", lookup)

        recs = lg.read(20)
        assert [r.offset for r in recs] == list(range(20, 30))
        assert [r.value for r in recs] == [b"value-%d" % i for i in range(20, 30)]


def test_read_columns_racing_a_roll_returns_records_not_struct_error(tmp_path, monkeypatch):
    """Same race as above through read_columns: the reader's lookup finds a slot in the old
    map, then `entry(slot)` unpacks from the closed (b"") buffer: struct.error."""
    clock = Clock()
    with segstore.open(str(tmp_path), clock=clock) as st:
        st.create_topic("t", 1, config=SMALL)
        lg = st.partition("t", 0)
        _fill(lg, 30)
        roll = _once_in_this_thread(lambda: lg.roll())
        real_entry = index_mod.OffsetIndex.entry

        def entry(self, slot, *buf):
            roll()
            return real_entry(self, slot, *buf)
        monkeypatch.setattr(index_mod.OffsetIndex, "entry", entry)

        cols = lg.read_columns(5)
        assert cols.offsets.tolist() == list(range(5, 30))


def test_truncate_to_racing_a_read_is_not_reported_as_corruption(tmp_path, monkeypatch):
    """A reader that read a segment's size just before truncate_to rewrote the segment (the
    kept prefix goes to a new file renamed over the old one, and `_mm` is dropped) maps the
    new, shorter file and raises CorruptRecordError "segment shorter (N bytes) than expected
    (M)": a healthy log reported as damaged. Seen ~30 times per second of stress with one
    writer truncating every 200 appends and two readers."""
    clock = Clock()
    with segstore.open(str(tmp_path), clock=clock) as st:
        st.create_topic("t", 1, config={"segment.bytes": 1 << 20})
        lg = st.partition("t", 0)
        _fill(lg, 100)
        truncate = _once_in_this_thread(lambda: lg.truncate_to(60))
        real_buffer = LogSegment.buffer

        def buffer(self, need=None):
            if need:  # the reader has read the size it will ask for
                truncate()
            return real_buffer(self, need)
        monkeypatch.setattr(LogSegment, "buffer", buffer)

        recs = lg.read(0, max_bytes=1 << 20)  # must not raise CorruptRecordError
        offsets = [r.offset for r in recs]
        # Either the snapshot the read started from or the truncated log, both whole.
        assert offsets in (list(range(100)), list(range(60)))
        assert [r.value for r in recs] == [b"value-%d" % o for o in offsets]


def test_close_racing_a_read_raises_store_closed_and_leaks_no_descriptor(tmp_path, monkeypatch):
    """store.close() while another thread is inside read(): the reader has passed its
    `_check_open`, close() closes the segments, and the reader (1) reopens the sealed segment's
    .log file through the lazy `LogSegment._fd` property (a descriptor, plus the mmap's dup of
    it, that nothing ever closes) and (2) fails with a bare ValueError from the closed offset
    index. Stress: 2-18 descriptors of .log files left open after close(), 1 run in 3."""
    clock = Clock()
    root = str(tmp_path / "s")
    st = segstore.open(root, clock=clock)
    st.create_topic("t", 1, config=SMALL)
    lg = st.partition("t", 0)
    _fill(lg, 200)
    assert len(lg.segments) > 2
    # The store closes after the read's checks, before it touches a segment.
    _before_segments_from(monkeypatch, _once_in_this_thread(st.close))

    try:
        recs = lg.read(0, max_bytes=1 << 20)
    except StoreClosedError:
        pass
    else:
        assert [r.offset for r in recs] == list(range(len(recs)))
    assert _store_fds(root) == [], "descriptors of the closed store left open"


def test_close_racing_a_read_leaks_no_descriptor(tmp_path, monkeypatch):
    """The descriptor leak alone, with whatever error the read raises ignored: after close()
    has returned and the racing read has ended, no file of the store may stay open."""
    clock = Clock()
    root = str(tmp_path / "s")
    st = segstore.open(root, clock=clock)
    st.create_topic("t", 1, config=SMALL)
    lg = st.partition("t", 0)
    _fill(lg, 200)
    _before_segments_from(monkeypatch, _once_in_this_thread(st.close))
    try:
        lg.read_columns(0)
    except Exception:
        pass
    assert _store_fds(root) == []


def test_close_waits_for_an_on_demand_compact_in_another_thread(tmp_path, monkeypatch):
    """store.close() used to close the logs under an on-demand store.compact() running in
    another thread: the round failed with a bare ValueError from a closed offset index and
    marked the partition uncleanable. Now close() stops new rounds, waits for the running one
    (which aborts at its next check) and the compact() caller gets StoreClosedError."""
    clock = Clock()
    root = str(tmp_path / "s")
    st = segstore.open(root, clock=clock)
    st.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 8192,
                                    "min.cleanable.dirty.ratio": 0.01})
    lg = st.partition("c", 0)
    for i in range(40):
        lg.append_batch([b"v%d-%d" % (i, j) for j in range(20)],
                        keys=[b"k%d" % j for j in range(20)], timestamps_ms=[T0] * 20)
    latest = {r.key: r.value for r in lg.iter_records()}

    from segstore.cleaner import cleaner as cleaner_mod
    in_round, go = threading.Event(), threading.Event()
    real_groups = cleaner_mod.Cleaner.clean_groups

    def clean_groups(self, *a, **k):
        in_round.set()
        assert go.wait(30)
        return real_groups(self, *a, **k)
    monkeypatch.setattr(cleaner_mod.Cleaner, "clean_groups", clean_groups)

    box = {}

    def compact():
        try:
            box["stats"] = st.compact(force=True)
        except BaseException as e:
            box["error"] = e
    compacting = threading.Thread(target=compact)
    compacting.start()
    assert in_round.wait(30)
    closing = threading.Thread(target=st.close)
    closing.start()
    for _ in range(3000):  # until close() has stopped new rounds and waits for this one
        if st.cleaner.closing:
            break
        threading.Event().wait(0.01)
    assert st.cleaner.closing
    with pytest.raises(StoreClosedError):
        st.compact(force=True)  # no new round while closing
    assert closing.is_alive()  # waiting for the round
    go.set()
    compacting.join(30)
    closing.join(30)
    assert not compacting.is_alive() and not closing.is_alive()
    assert isinstance(box.get("error"), StoreClosedError), box
    monkeypatch.undo()
    assert st.cleaner.manager.uncleanable == {}  # aborted, not failed
    assert _store_fds(root) == []
    with segstore.open(root, clock=clock) as st2:
        assert {r.key: r.value for r in st2.partition("c", 0).iter_records()} == latest
        assert st2.verify() == []


def test_segment_deleted_under_a_reader_raises_a_typed_error(tmp_path, monkeypatch):
    """With file.delete.delay.ms=0 a retention pass plus tick() deletes a segment's files
    while a reader that took the old snapshot is about to map it: the reader reopens the
    `.log.deleted` path through `LogSegment._fd` and gets a bare FileNotFoundError. A
    vanished segment should read as out of range (or a SegstoreError), not OSError."""
    clock = Clock()
    with segstore.open(str(tmp_path), clock=clock) as st:
        st.create_topic("t", 1, config={**SMALL, "retention.bytes": 4096,
                                        "file.delete.delay.ms": 0})
        lg = st.partition("t", 0)
        _fill(lg, 300)
        assert len(lg.segments) > 3

        def retention():
            clock.now += 1
            st.enforce_retention()
            st.tick()
        _before_segments_from(monkeypatch, _once_in_this_thread(retention))
        try:
            lg.read(0, max_bytes=1 << 20)
        except SegstoreError:
            pass


# ----------------------------------------------------------------------------------------------
# Behaviour checked and found correct (pass)
# ----------------------------------------------------------------------------------------------

def test_concurrent_appends_same_and_different_partitions_lose_nothing(tmp_path):
    """3 threads append (append, append_batch, append_columns) to two partitions while
    segments roll; every acknowledged offset holds exactly what was appended, offsets are
    dense, and a reopen sees the same."""
    from segstore.columns import BinaryColumn
    clock = Clock()
    root = str(tmp_path / "s")
    acked = {0: {}, 1: {}}
    errors = []
    lock = threading.Lock()
    with segstore.open(root, clock=clock) as st:
        st.create_topic("t", 2, config=SMALL)

        def writer(w):
            try:
                for i in range(150):
                    p = i % 2
                    lg = st.partition("t", p)
                    v = b"w%d-%d" % (w, i)
                    got = {}
                    if i % 3 == 0:
                        got[lg.append(v).offset] = v
                    elif i % 3 == 1:
                        info = lg.append_batch([v, v + b"b"])
                        got = {info.first_offset: v, info.first_offset + 1: v + b"b"}
                    else:
                        vals = [v, v + b"c", v + b"d"]
                        info = lg.append_columns(BinaryColumn.from_pylist(vals))
                        got = {info.first_offset + j: x for j, x in enumerate(vals)}
                    with lock:
                        assert not set(got) & set(acked[p]), "offset handed out twice"
                        acked[p].update(got)
            except BaseException as e:
                errors.append(e)
        ts = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors, errors
        for p in (0, 1):
            lg = st.partition("t", p)
            assert len(lg.segments) > 1
            got = {r.offset: r.value for r in lg.iter_records()}
            assert got == acked[p]
            assert sorted(got) == list(range(len(got)))
    with segstore.open(root, clock=clock) as st:
        for p in (0, 1):
            assert {r.offset: r.value for r in st.partition("t", p).iter_records()} == acked[p]


def test_second_writer_is_refused_and_readonly_open_reads_beside_it(tmp_path):
    clock = Clock()
    root = str(tmp_path / "s")
    with segstore.open(root, clock=clock) as st:
        st.create_topic("t", 1, config=SMALL)
        _fill(st.partition("t", 0), 50)
        with pytest.raises(StoreLockedError):
            segstore.open(root, clock=clock)
        ro = segstore.open(root, readonly=True)
        try:
            _fill(st.partition("t", 0), 10, start=50)
            recs = ro.partition("t", 0).read(0, max_bytes=1 << 20)
            assert [r.offset for r in recs] == list(range(60))
            assert [r.value for r in recs] == [b"value-%d" % i for i in range(60)]
        finally:
            ro.close()
    with segstore.open(root, clock=clock) as st:  # the lock was released
        assert st.partition("t", 0).log_end_offset == 60


def test_close_while_appending_keeps_every_acknowledged_append(tmp_path):
    """Appends racing close() either succeed (and survive a reopen) or raise
    StoreClosedError; services and cleaner threads are gone after close."""
    clock = Clock()
    root = str(tmp_path / "s")
    acked = {}
    errors = []
    before = set(threading.enumerate())
    st = segstore.open(root, clock=clock, config={"log.cleaner.threads": 1})
    st.create_topic("t", 1, config=SMALL)
    st.start_services()
    started = threading.Event()

    def writer(w):
        lg = st.partition("t", 0)
        i = 0
        while True:
            i += 1
            v = b"%d-%d" % (w, i)
            try:
                md = lg.append(v)
            except StoreClosedError:
                return
            except BaseException as e:
                errors.append(e)
                return
            acked[md.offset] = v
            if i == 20:
                started.set()
    ts = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in ts:
        t.start()
    assert started.wait(30)
    st.close()
    for t in ts:
        t.join(30)
        assert not t.is_alive()
    assert not errors, errors
    assert set(threading.enumerate()) <= before
    with segstore.open(root, clock=clock) as st2:
        got = {r.offset: r.value for r in st2.partition("t", 0).iter_records()}
        assert got == acked


def test_compaction_concurrent_with_appends_keeps_latest_value_per_key(tmp_path):
    """On-demand compaction in one thread while two threads append; afterwards every key's
    latest acknowledged value is what the log holds, and the store verifies clean."""
    clock = Clock()
    root = str(tmp_path / "s")
    acked = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors = []
    with segstore.open(root, clock=clock) as st:
        st.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 2048,
                                        "min.cleanable.dirty.ratio": 0.01})
        lg = st.partition("c", 0)

        def writer(w):
            try:
                for i in range(400):
                    md = lg.append(b"%d-%d" % (w, i), key=b"k%d" % (i % 7))
                    with lock:
                        acked[md.offset] = (b"k%d" % (i % 7), b"%d-%d" % (w, i))
            except BaseException as e:
                errors.append(e)

        def compactor():
            while not stop.is_set():
                try:
                    st.compact(force=True)
                except BaseException as e:
                    errors.append(e)
                    return
        ws = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
        c = threading.Thread(target=compactor)
        for t in ws + [c]:
            t.start()
        for t in ws:
            t.join(60)
        stop.set()
        c.join(60)
        assert not errors, errors
        st.compact(force=True)
        latest = {}
        for o in sorted(acked):
            k, v = acked[o]
            latest[k] = (o, v)
        assert {r.key: (r.offset, r.value) for r in lg.iter_records()} == latest
        assert st.verify() == []


def test_readonly_index_load_racing_a_compaction_swap_is_not_filenotfound(tmp_path, monkeypatch):
    """A read-only reader loads an index lazily with `os.path.exists(path)` then
    `open(path)` (index.py, _AbstractIndex.__init__, read-only branch). When the writer's
    cleaner swap renames that segment's files to `.deleted` in between, the reader gets a bare
    FileNotFoundError (seen from a read-only open in 2 of 3 stress runs of a writer compacting
    beside read-only readers). The log file itself is held open, so the read could go on
    (an absent index just means scanning)."""
    clock = Clock()
    root = str(tmp_path / "s")
    with segstore.open(root, clock=clock) as st:
        st.create_topic("c", 1, config={"cleanup.policy": "compact", "segment.bytes": 2048,
                                        "min.cleanable.dirty.ratio": 0.01,
                                        "segment.index.bytes": 4096})
        lg = st.partition("c", 0)
        for i in range(300):
            lg.append(b"value-%d" % i, key=b"k%d" % (i % 5), timestamp_ms=T0 + i)
        st.compact(force=True)  # every segment now small: the next round merges them
        first_active = lg.segments[-1].base_offset
        for i in range(300, 400):
            lg.append(b"value-%d" % i, key=b"k%d" % (i % 5), timestamp_ms=T0 + i)
        segs = lg.segments
        assert len(segs) > 4
        # The next round merges the small cleaned segments into the first one: the files of
        # the others vanish (renamed .deleted).
        vanish = {"%020d.timeindex" % s.base_offset for s in segs
                  if 0 < s.base_offset < first_active}
        ro = segstore.open(root, readonly=True)
        try:
            rlg = ro.partition("c", 0)
            assert rlg.log_end_offset == 400
            compact = _once_in_this_thread(lambda: st.compact(force=True))
            real_exists = os.path.exists

            def exists(path):
                result = real_exists(path)
                if os.path.basename(str(path)) in vanish:
                    compact()  # the writer's swap renames the segment's files meanwhile
                return result
            monkeypatch.setattr(index_mod.os.path, "exists", exists)
            try:
                rlg.offset_for_time(T0 + 399)
            except SegstoreError:
                pass
        finally:
            monkeypatch.undo()
            ro.close()
