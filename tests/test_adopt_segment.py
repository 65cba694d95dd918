"""PartitionLog.adopt_segment_file: a staged file of v2 batches becomes a segment (no copy).

Oracle: the same bytes appended to another log with ``append_records`` (the copying path):
reads, column reads, offsets by time, producer state and aborted transactions must agree.
Crashes are simulated at every step of the adoption in two ways: the step raises (the live
log must stay consistent and usable), and the store directory is copied as it is on disk at
that step and opened after an unclean shutdown (no adopted segment, or a whole valid one).
"""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest

from conftest import HUGE_PAGE_ADVICE_SHOWS, fix_crc, map_vm_flags, rec_tuple
import segstore
from segstore import _core, adopt
from segstore.checkpoint import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT
from segstore.columns import BinaryColumn
from segstore.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError

T0 = 1_700_000_000_000
STEPS = ("checked", "offsets", "sealed", "moved", "indexed", "renamed", "published")


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


def encode(n, start=0, *, per_batch=100, value_size=50):
    """n records (keys k<i>, values of value_size bytes, timestamps T0 + i) as v2 batches at
    base offset 0; ``start`` shifts the record numbering."""
    idx = range(start, start + n)
    keys = BinaryColumn.from_pylist([b"k%d" % i for i in idx])
    values = BinaryColumn.from_pylist([(b"v%d-" % i).ljust(value_size, b"x") for i in idx])
    ts = np.arange(start, start + n, dtype=np.int64) + T0
    return bytes(_core.encode_columns(values, keys, ts, base_offset=0,
                                      records_per_batch=per_batch).data)


def stage(root, data, name="f.stage"):
    d = os.path.join(root, ".staging", "job")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def open_store(root, clock=None, **config):
    store = segstore.open(str(root), clock=clock or Clock())
    if "t" not in store.list_topics():
        store.create_topic("t", 1, config={k.replace("_", "."): v for k, v in config.items()})
    return store


def records(lg):
    return [rec_tuple(r) for r in lg.iter_records()]


def columns(lg):
    c = lg.read_columns()
    return (c.offsets.tolist(), c.timestamps_ms.tolist(), c.keys.to_pylist(), c.values.to_pylist())


def crash_reopen(root, clock=None):
    """Open ``root`` as after a crash: no clean-shutdown marker, no recovery checkpoint."""
    for name in (CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT):
        try:
            os.unlink(os.path.join(root, name))
        except FileNotFoundError:
            pass
    return segstore.open(str(root), clock=clock or Clock())


@pytest.fixture
def oracle(tmp_path):
    """A log that gets the same bytes by append_records."""
    store = open_store(tmp_path / "oracle")
    yield store.partition("t", 0)
    store.close()


def test_adopted_records_read_back_like_appended(tmp_path, oracle):
    root = str(tmp_path / "s")
    store = open_store(root, index_interval_bytes=1024)
    lg = store.partition("t", 0)
    for target in (lg, oracle):
        target.append_batch([b"first"], [b"k"], timestamps_ms=[T0 - 5])
    data = encode(1000)
    path = stage(root, data)
    info = lg.adopt_segment_file(path)
    oracle.append_records(data)
    assert not os.path.exists(path)
    assert (info.first_offset, info.last_offset, info.num_records, info.size_bytes) == \
        (1, 1000, 1000, len(data))
    assert info.max_timestamp == T0 + 999
    assert lg.log_end_offset == 1001
    assert [s.base_offset for s in lg.segments] == [0, 1]
    assert os.path.basename(lg.segments[-1].log_path) == f"{1:020d}.log"
    assert lg.segments[-1].offset_index.entries == 9  # sparse rule: 10 batches > 1024 bytes
    assert lg.verify() == []
    assert records(lg) == records(oracle)
    assert columns(lg) == columns(oracle)
    for ts in (T0 - 10, T0, T0 + 1, T0 + 500, T0 + 999, T0 + 1000, -1, -2, -3):
        assert lg.offset_for_time(ts) == oracle.offset_for_time(ts), ts
    assert lg.read(500, max_records=3) and \
        [rec_tuple(r) for r in lg.read(500, max_records=3)] == \
        [rec_tuple(r) for r in oracle.read(500, max_records=3)]
    # Appends continue after the adopted segment (it is the active one).
    for target in (lg, oracle):
        target.append_batch([b"after"], [b"k2"], timestamps_ms=[T0 + 2000])
    assert lg.log_end_offset == 1002 and lg.verify() == []
    assert lg.recovery_point >= 1001
    expected = records(oracle)
    store.close()

    store = segstore.open(root, clock=Clock())  # clean reopen
    lg = store.partition("t", 0)
    assert records(lg) == expected and lg.verify() == []
    store.close()
    store = crash_reopen(root)  # unclean reopen: recovery from scratch
    lg = store.partition("t", 0)
    assert records(lg) == expected and lg.verify() == []
    assert lg.offset_for_time(T0 + 500).offset == 501
    store.close()


def test_adopt_into_empty_log_replaces_the_empty_segment(tmp_path, oracle):
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    data = encode(300)
    lg.adopt_segment_file(stage(root, data))
    oracle.append_records(data)
    assert [s.base_offset for s in lg.segments] == [0]
    assert sorted(os.listdir(lg.directory)) == sorted(
        n for n in os.listdir(lg.directory) if not n.endswith(".cleaned"))
    # Two more adoptions in a row, an append between: one segment per adoption.
    for i, d in enumerate((encode(200, 300), encode(5, 500))):
        lg.adopt_segment_file(stage(root, d, f"{i}.stage"))
        oracle.append_records(d)
        lg.append(b"x%d" % i, timestamp_ms=T0 + 10_000)
        oracle.append(b"x%d" % i, timestamp_ms=T0 + 10_000)
    assert [s.base_offset for s in lg.segments] == [0, 300, 501]
    assert lg.log_end_offset == 507 and lg.verify() == []
    assert records(lg) == records(oracle) and columns(lg) == columns(oracle)
    store.close()
    store = crash_reopen(root)
    assert records(store.partition("t", 0)) == records(oracle)
    store.close()


def test_truncating_an_adopted_segment(tmp_path):
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    lg.append(b"a")
    lg.adopt_segment_file(stage(root, encode(100)))
    lg.truncate_to(1)  # the Spark commit rollback
    assert lg.log_end_offset == 1 and lg.verify() == []
    lg.adopt_segment_file(stage(root, encode(100)))
    lg.truncate_to(50)
    assert lg.log_end_offset == 1 and lg.verify() == []  # the whole batch holding 50 goes
    lg.append(b"b")
    store.close()
    store = crash_reopen(root)
    assert [r[4] for r in records(store.partition("t", 0))] == [b"a", b"b"]
    store.close()


def test_bad_input_raises_typed_errors_and_changes_nothing(tmp_path):
    root = str(tmp_path / "s")
    store = open_store(root, max_message_bytes=20_000)
    lg = store.partition("t", 0)
    lg.append(b"a")
    before = records(lg)
    data = bytearray(encode(300))
    bad = bytearray(data)
    bad[200] ^= 0xFF  # inside the first batch's records
    with pytest.raises(CorruptRecordError):
        lg.adopt_segment_file(stage(root, bad))
    with pytest.raises(CorruptRecordError):  # cut in the middle of a batch
        lg.adopt_segment_file(stage(root, data[:-10]))
    with pytest.raises(InvalidRecordError):
        lg.adopt_segment_file(stage(root, b""))
    # A magic 1 message (legacy) is not v2.
    legacy = bytearray(struct.pack(">qiIbbqi", 0, 4 + 1 + 1 + 8 + 4 + 4, 0, 1, 0, T0, -1)
                       + struct.pack(">i", 1) + b"z")
    struct.pack_into(">i", legacy, 8, len(legacy) - 12)
    import zlib
    struct.pack_into(">I", legacy, 12, zlib.crc32(bytes(legacy[16:])))
    with pytest.raises(InvalidRecordError):
        lg.adopt_segment_file(stage(root, bytes(legacy)))
    # A batch larger than max.message.bytes.
    with pytest.raises(RecordTooLargeError):
        lg.adopt_segment_file(stage(root, encode(300, per_batch=300, value_size=100)))
    assert records(lg) == before and lg.log_end_offset == 1 and lg.verify() == []
    assert [s.base_offset for s in lg.segments] == [0]
    assert not [n for n in os.listdir(lg.directory) if n.endswith(".cleaned")]
    fix_crc(bad)  # a valid batch again: adoption works after the failures
    lg.adopt_segment_file(stage(root, bytes(bad)))
    assert lg.log_end_offset == 301 and lg.verify() == []
    store.close()


def test_files_adoption_does_not_apply_to_are_appended(tmp_path, oracle):
    root = str(tmp_path / "s")
    # Larger than segment.bytes: appended (rolled as appends roll), and the file is consumed.
    store = open_store(root, segment_bytes=20_000)
    lg = store.partition("t", 0)
    data = encode(1000)
    assert len(data) > 20_000
    path = stage(root, data)
    info = lg.adopt_segment_file(path)
    oracle.append_records(data)
    assert not os.path.exists(path)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 999, 1000)
    assert len(lg.segments) > 2 and lg.verify() == []
    assert records(lg) == records(oracle)
    store.close()
    # LogAppendTime: the batches are stamped (new CRCs), so they are appended.
    clock = Clock(T0 + 77)
    store = segstore.open(str(tmp_path / "lat"), clock=clock)
    store.create_topic("t", 1, config={"message.timestamp.type": "LogAppendTime"})
    lg = store.partition("t", 0)
    lg.adopt_segment_file(stage(str(tmp_path / "lat"), encode(10)))
    assert {r.timestamp for r in lg.iter_records()} == {T0 + 77}
    assert {r.timestamp_type for r in lg.iter_records()} == {1}
    store.close()


def _txn_data():
    """A transaction of producer 7 (two batches) and its ABORT, then plain data."""
    out = bytearray()
    out += _core.encode_batch([b"t1", b"t2"], None, None, T0, base_offset=0, producer_id=7,
                              producer_epoch=1, base_sequence=0, is_transactional=True)
    out += _core.encode_batch([b"t3"], None, None, T0, base_offset=0, producer_id=7,
                              producer_epoch=1, base_sequence=2, is_transactional=True)
    out += _core.encode_control_batch(0, producer_id=7, producer_epoch=1, coordinator_epoch=3,
                                      base_offset=0, timestamp_ms=T0)  # 0 = ABORT
    out += _core.encode_batch([b"p"], None, None, T0, base_offset=0)
    return bytes(out)


def test_producer_state_and_aborted_transactions(tmp_path, oracle):
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    for target in (lg, oracle):
        target.append(b"a")
    data = _txn_data()
    lg.adopt_segment_file(stage(root, data))
    oracle.append_records(data)
    assert lg.log_end_offset == oracle.log_end_offset == 6
    assert lg.active_producers() == oracle.active_producers()
    assert lg.producer_state.snapshot_bytes() == oracle.producer_state.snapshot_bytes()
    assert lg.segments[-1].collect_aborted(0, 10) == oracle.segments[-1].collect_aborted(0, 10)
    assert lg.segments[-1].collect_aborted(0, 10)  # the abort was indexed in the new segment
    assert lg.last_stable_offset == 6 and lg.verify() == []
    # An older producer epoch is fenced: nothing is adopted.
    fenced = _core.encode_batch([b"old"], None, None, T0, base_offset=0, producer_id=7,
                                producer_epoch=0, base_sequence=0)
    with pytest.raises(InvalidRecordError):
        lg.adopt_segment_file(stage(root, bytes(fenced)))
    assert lg.log_end_offset == 6 and lg.verify() == []
    store.close()
    store = crash_reopen(root)
    lg = store.partition("t", 0)
    assert lg.active_producers() == oracle.active_producers()
    assert lg.segments[-1].collect_aborted(0, 10) == oracle.segments[-1].collect_aborted(0, 10)
    store.close()


@pytest.mark.skipif(not HUGE_PAGE_ADVICE_SHOWS,
                    reason="Linux with transparent huge pages only: MADV_HUGEPAGE in smaps")
def test_adoption_maps_the_files_asking_for_huge_folios(tmp_path, monkeypatch):
    """A file adopted through its map becomes a segment: pages the map reads in from disk stay
    in the page cache at the size they came in, for every later map of the segment, so the map
    asks for huge folios as the segments' read maps do (segment_files.read_map)."""
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    paths = [stage(root, encode(300, 300 * i), f"{i}.stage") for i in range(2)]
    seen = {}

    def hook(name):
        if name == "checked":  # every file is mapped and scanned, none renamed yet
            seen.update({p: map_vm_flags(p) for p in paths})
    monkeypatch.setattr(adopt, "adopt_hook", hook)
    lg.adopt_segment_files(paths)
    assert lg.log_end_offset == 600
    for p in paths:
        (flags,) = seen[p]
        # Read only: base offsets are written through the descriptor (see the next test).
        assert "hg" in flags and "sh" in flags and "wr" not in flags, (p, flags)
    store.close()


def test_write_base_offsets_rewrites_only_offset_and_epoch(tmp_path):
    """write_base_offsets: every batch gets its new baseOffset and leader epoch through the
    descriptor, every other byte stays as it was, and kafka-python still parses the batches
    (CRC valid) at the new offsets."""
    from kafka.record import MemoryRecords

    data = encode(250, per_batch=100)   # batches of 100, 100 and 50 records
    path = tmp_path / "f"
    path.write_bytes(data)
    scan = _core.scan_batches(data)
    b = scan.batches
    bases = np.array([1000, 5000, 5100], dtype=np.int64)
    fd = os.open(path, os.O_RDWR)
    try:
        _core.write_base_offsets(fd, np.ascontiguousarray(b["position"]),
                                 np.ascontiguousarray(b["size"]), bases, 7)
    finally:
        os.close(fd)
    out = path.read_bytes()
    assert len(out) == len(data)
    want = bytearray(data)
    for pos, base in zip(b["position"].tolist(), bases.tolist()):
        want[pos:pos + 8] = struct.pack(">q", base)
        want[pos + 12:pos + 16] = struct.pack(">i", 7)
    assert out == bytes(want)
    records = MemoryRecords(out)
    got = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        got += [r.offset for r in batch]
    assert got == [*range(1000, 1100), *range(5000, 5100), *range(5100, 5150)]


def test_write_base_offsets_refuses_batches_outside_the_file(tmp_path):
    """A position or size that would put a batch past the file's end (or before its start) is
    refused before anything is written; a descriptor that cannot be written raises OSError."""
    data = encode(20, per_batch=10)
    path = tmp_path / "f"
    path.write_bytes(data)
    b = _core.scan_batches(data).batches
    pos = np.ascontiguousarray(b["position"])
    size = np.ascontiguousarray(b["size"])
    fd = os.open(path, os.O_RDWR)
    try:
        past_end = pos.copy()
        past_end[1] = len(data) - size[1] + 1
        with pytest.raises(ValueError, match="no whole v2 batch"):
            _core.write_base_offsets(fd, past_end, size, np.array([5, 6], dtype=np.int64))
        negative = pos.copy()
        negative[0] = -1
        with pytest.raises(ValueError, match="no whole v2 batch"):
            _core.write_base_offsets(fd, negative, size, np.array([5, 6], dtype=np.int64))
        short = size.copy()
        short[0] = 60   # shorter than a v2 header
        with pytest.raises(ValueError, match="no whole v2 batch"):
            _core.write_base_offsets(fd, pos, short, np.array([5, 6], dtype=np.int64))
        with pytest.raises(ValueError, match="same length"):
            _core.write_base_offsets(fd, pos, size, np.array([5], dtype=np.int64))
    finally:
        os.close(fd)
    assert path.read_bytes() == data   # nothing was written
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            _core.write_base_offsets(fd, pos, size, np.array([5, 6], dtype=np.int64),
                                     file=str(path))
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def stage_files(root, n_files):
    """``n_files`` staged files of 100 records each (numbered on); their paths."""
    return [stage(root, encode(100, 100 * i), f"{i}.stage") for i in range(n_files)]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("active_empty", [False, True])
@pytest.mark.parametrize("n_files", [1, 2])
def test_error_at_each_step_leaves_a_consistent_log(tmp_path, monkeypatch, step, active_empty,
                                                    n_files):
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    if not active_empty:
        lg.append(b"a")
    before = records(lg)
    n0 = lg.log_end_offset
    paths = stage_files(root, n_files)

    def hook(name):
        if name == step:
            raise RuntimeError(f"crash at {name}")
    monkeypatch.setattr(adopt, "adopt_hook", hook)
    with pytest.raises(RuntimeError):
        lg.adopt_segment_files(paths)
    monkeypatch.setattr(adopt, "adopt_hook", None)
    assert lg.verify() == []
    adopted = lg.log_end_offset == n0 + 100 * n_files
    assert adopted == (step in ("renamed", "published")), step
    assert lg.log_end_offset in (n0, n0 + 100 * n_files)
    assert records(lg)[:len(before)] == before
    assert not [n for n in os.listdir(lg.directory) if n.endswith(".cleaned")]
    lg.append(b"z")  # the log goes on
    lg.adopt_segment_file(stage(root, encode(10), "g.stage"))
    expected = records(lg)
    assert lg.verify() == []
    store.close()
    for reopen in (lambda: segstore.open(root, clock=Clock()), lambda: crash_reopen(root)):
        store = reopen()
        lg = store.partition("t", 0)
        assert records(lg) == expected and lg.verify() == []
        store.close()


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("active_empty", [False, True])
@pytest.mark.parametrize("n_files", [1, 2])
def test_crash_at_each_step_leaves_nothing_or_a_whole_segment(tmp_path, monkeypatch, step,
                                                              active_empty, n_files):
    """The store directory as it is on disk right after ``step`` (a copy taken then), opened
    after an unclean shutdown."""
    root = str(tmp_path / "s")
    copy = str(tmp_path / "crashed")
    store = open_store(root)
    lg = store.partition("t", 0)
    if not active_empty:
        lg.append_batch([b"a", b"b"])
    before = records(lg)
    n0 = lg.log_end_offset
    paths = stage_files(root, n_files)

    def hook(name):
        if name == step:
            shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".lock"))
    monkeypatch.setattr(adopt, "adopt_hook", hook)
    lg.adopt_segment_files(paths)
    full = records(lg)
    store.close()

    store = crash_reopen(copy)
    lg = store.partition("t", 0)
    assert lg.verify() == []
    got = records(lg)
    assert got in (before, full), (step, len(got))
    if step in ("renamed", "published"):
        assert got == full
    assert not [n for n in os.listdir(lg.directory) if n.endswith(".cleaned")]
    assert lg.log_end_offset == len(got)  # offsets from 0, no gap
    lg.append(b"more")
    assert lg.log_end_offset == len(got) + 1
    assert lg.verify() == []
    store.close()


def index_files(lg) -> dict:
    """{file name: bytes} of every index file of the partition."""
    out = {}
    for name in sorted(os.listdir(lg.directory)):
        if name.endswith((".index", ".timeindex")):
            with open(os.path.join(lg.directory, name), "rb") as f:
                out[name] = f.read()
    return out


def test_several_files_in_one_call_match_one_at_a_time(tmp_path, oracle):
    """One call adopts three files: the same segments, index bytes and records as three single
    adoptions; sealed segments' indexes are trimmed, the last (active) one's preallocated."""
    datas = [encode(300), encode(200, 300), encode(50, 500)]
    logs = {}
    for mode in ("one_call", "singles"):
        root = str(tmp_path / mode)
        store = open_store(root, index_interval_bytes=1024)
        lg = store.partition("t", 0)
        lg.append_batch([b"first"], [b"k"], timestamps_ms=[T0 - 5])
        paths = [stage(root, d, f"{i}.stage") for i, d in enumerate(datas)]
        if mode == "one_call":
            info = lg.adopt_segment_files(paths)
            assert (info.first_offset, info.last_offset, info.num_records, info.size_bytes) == \
                (1, 550, 550, sum(map(len, datas)))
            assert info.max_timestamp == T0 + 549
            assert [s.offset_index.file_size == s.offset_index.size_bytes
                    for s in lg.segments[1:]] == [True, True, False]
        else:
            for path in paths:
                lg.adopt_segment_file(path)
        assert not any(os.path.exists(path) for path in paths)
        assert [s.base_offset for s in lg.segments] == [0, 1, 301, 501]
        assert lg.log_end_offset == 551 and lg.verify() == []
        logs[mode] = (store, lg)
    oracle.append_batch([b"first"], [b"k"], timestamps_ms=[T0 - 5])
    for d in datas:
        oracle.append_records(d)
    for store, lg in logs.values():
        assert records(lg) == records(oracle) and columns(lg) == columns(oracle)
        for ts in (T0 - 10, T0, T0 + 299, T0 + 300, T0 + 549, T0 + 550, -1, -2):
            assert lg.offset_for_time(ts) == oracle.offset_for_time(ts), ts
        lg.append(b"after", timestamp_ms=T0 + 9000)  # appends go on in the last adopted segment
        assert len(lg.segments) == 4
        store.close()
    assert index_files(logs["one_call"][1]) == index_files(logs["singles"][1])
    store = crash_reopen(str(tmp_path / "one_call"))
    lg = store.partition("t", 0)
    assert lg.verify() == [] and lg.log_end_offset == 552
    store.close()


def test_a_file_with_producer_batches_is_checked_against_the_files_before_it(tmp_path, oracle):
    """Producer state validates each file against what the files before it in the call leave:
    a fenced batch after its producer's newer epoch is refused, the files before it stay."""
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    plain, txn = encode(20), _txn_data()
    fenced = bytes(_core.encode_batch([b"old"], None, None, T0, base_offset=0, producer_id=7,
                                      producer_epoch=0, base_sequence=0))
    with pytest.raises(InvalidRecordError, match="fenced"):
        lg.adopt_segment_files([stage(root, plain, "a.stage"), stage(root, txn, "b.stage"),
                                stage(root, fenced, "c.stage")])
    for d in (plain, txn):
        oracle.append_records(d)
    assert records(lg) == records(oracle) and lg.verify() == []
    assert lg.active_producers() == oracle.active_producers()
    assert lg.segments[-1].collect_aborted(0, 100) == oracle.segments[-1].collect_aborted(0, 100)
    store.close()


def test_a_bad_file_in_a_call_changes_nothing(tmp_path):
    """Every file is checked before the log changes: damage in the last file of a call
    leaves the earlier ones unadopted (and still staged)."""
    root = str(tmp_path / "s")
    store = open_store(root)
    lg = store.partition("t", 0)
    lg.append(b"a")
    bad = bytearray(encode(100, 100))
    bad[len(bad) // 2] ^= 0x10
    paths = [stage(root, encode(100), "a.stage"), stage(root, bytes(bad), "b.stage")]
    with pytest.raises(CorruptRecordError):
        lg.adopt_segment_files(paths)
    assert lg.log_end_offset == 1 and len(lg.segments) == 1 and lg.verify() == []
    assert os.path.exists(paths[0])
    store.close()
