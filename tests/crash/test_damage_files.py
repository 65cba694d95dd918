"""Damaged partition directories: recovery keeps exactly the valid prefix, damage is never served.

Each case starts from a pristine, cleanly closed partition directory (several segments, mixed
codecs, headers, a transaction and its marker), damages one file -- the last batch truncated at
every byte, random garbage or zeros appended, the tail zeroed, random bits flipped in a ``.log``,
``.index`` or ``.timeindex`` -- and opens it again:

* after an unclean shutdown (``PartitionLog(..., had_clean_shutdown=False, recovery_point=0)``,
  or through ``segstore.open`` without ``.kafka_cleanshutdown``), the log holds exactly the batches
  an independent oracle accepts (:func:`oracle_scan`: ``struct`` and the ``crc32c`` package, REF
  §1.11 and §4.3) -- every record, offset, timestamp, key, value and header -- the damaged file is
  cut at the oracle's valid end, later segments are gone, ``verify()`` is clean, kafka-python
  aiokafka parses every file, the log takes new appends and reopens cleanly;
* bit flips in sealed segments below the recovery point after a clean shutdown are reported by
  ``verify()`` at the damaged batch and raise ``CorruptRecordError`` (with file and position)
  from reads -- the records before the damage still read, and nothing wrong is ever returned.

CI runs about 600 cases (about 10 s); ``SEGSTORE_DAMAGE_CASES=N`` runs N random cases per
randomized test and truncates each variant's last three batches at every byte (N=1000: about
10,000 cases, three minutes).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import zlib
from dataclasses import dataclass

import crc32c
import numpy as np
import pytest
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords

import segstore
from segstore.checkpoint import CLEAN_SHUTDOWN_FILE
from segstore import _core
from segstore.config import TopicConfig
from segstore.errors import CorruptIndexError, CorruptRecordError
from segstore.log import PartitionLog
from segstore.records import ControlRecordType

_ENV_CASES = int(os.environ.get("SEGSTORE_DAMAGE_CASES", "0"))
CASES = _ENV_CASES or 40          # random cases per randomized test
LAST_BATCHES = 3 if _ENV_CASES else 1  # batches truncated at every byte, per variant
T0 = 1_700_000_000_000
COUNT = {"cases": 0}

# Variants of the pristine log: (name, topic config, codecs used, with a transaction).
VARIANTS = {
    "plain": ({"segment.bytes": 2400, "index.interval.bytes": 150, "segment.index.bytes": 4096},
              [None], True),
    "mixed": ({"segment.bytes": 3000, "index.interval.bytes": 100, "segment.index.bytes": 4096},
              [None, "gzip", "lz4", "zstd", "snappy"], True),
    "dense": ({"segment.bytes": 1500, "index.interval.bytes": 0, "segment.index.bytes": 2048},
              [None, "gzip"], False),
}


class Clock:
    def __init__(self):
        self.t = T0

    def __call__(self):
        return self.t


# ------------------------------------------------------------------------------------------------
# the oracle: batch walking with struct and crc32c only


def oracle_scan(data: bytes, seg_base: int, limit: int | None = None):
    """The batches recovery must keep: ``([(position, size, base, last)], valid_end)``.

    A batch is kept while at least 17 bytes remain, its size field is at least 14 and fits the
    file, it is a v2 batch (magic 2) of at least 61 bytes whose CRC-32C over bytes [21, size)
    matches, its offsets lie in [seg_base, seg_base + 2^31 - 1] and above the previous batch's,
    and (for a segment followed by another) below ``limit``.
    """
    out, pos, prev = [], 0, seg_base - 1
    n = len(data)
    while n - pos >= 17:
        size = 12 + struct.unpack_from(">i", data, pos + 8)[0]
        if size < 12 + 14 or pos + size > n:
            break
        magic = data[pos + 16]
        if magic != 2:
            # A damaged magic that happens to make a valid legacy entry would be ambiguous.
            assert magic not in (0, 1) or zlib.crc32(data[pos + 16:pos + size]) != \
                struct.unpack_from(">I", data, pos + 12)[0]
            break
        if size < 61 or crc32c.crc32c(data[pos + 21:pos + size]) != \
                struct.unpack_from(">I", data, pos + 17)[0]:
            break
        base = struct.unpack_from(">q", data, pos)[0]
        last = base + struct.unpack_from(">i", data, pos + 23)[0]
        if base <= prev or base < seg_base or last - seg_base > 0x7FFFFFFF or last < base:
            break
        if limit is not None and last >= limit:
            break
        out.append((pos, size, base, last))
        prev = last
        pos += size
    return out, pos


def independent_records(data: bytes, base: int) -> list[tuple]:
    """Every data record of a .log file as aiokafka parses it (control batches skipped); the
    file must be whole valid batches (the oracle walks it to the end)."""
    assert oracle_scan(data, base)[1] == len(data)
    out = []
    recs = AioMemoryRecords(data)
    while recs.has_next():
        batch = recs.next_batch()
        assert batch.validate_crc()
        if batch.is_control_batch:
            continue
        for r in batch:
            out.append((r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]))
    return out


# ------------------------------------------------------------------------------------------------
# pristine logs


@dataclass
class Pristine:
    name: str
    config: dict
    files: dict          # file name -> bytes, as left by a clean close
    segments: list       # base offsets, ascending
    batches: dict        # batch base offset -> [(offset, timestamp, key, value, headers)]
    leo: int

    @property
    def active(self) -> int:
        return self.segments[-1]

    def log_name(self, base: int) -> str:
        return f"{base:020d}.log"

    def expected(self, bases) -> list[tuple]:
        return [r for b in sorted(bases) for r in self.batches[b]]

    def write(self, directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        for name, data in self.files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)


def build(directory: str, name: str) -> Pristine:
    cfg, codecs, txn = VARIANTS[name]
    rng = random.Random(name)
    clock = Clock()
    lg = PartitionLog(directory, "t", 0, TopicConfig.from_dict(cfg), clock)
    batches = {}
    seq77 = 0
    for i in range(70):
        clock.t += 7
        n = rng.choice((1, 1, 2, 3, 5))
        keys = [None if rng.random() < 0.1 else b"key-%d" % rng.randrange(40) for _ in range(n)]
        values = [None if rng.random() < 0.05 else rng.randbytes(rng.randrange(0, 90))
                  for _ in range(n)]
        headers = [[("h", b"%d" % i)] if rng.random() < 0.3 else [] for _ in range(n)]
        stamps = [T0 + i * 10 + rng.randrange(-5, 5) for _ in range(n)]
        kw = {}
        if txn and i in (30, 31):
            kw = dict(producer_id=77, producer_epoch=1, base_sequence=seq77,
                      is_transactional=True)
            seq77 += n
        info = lg.append_batch(values, keys, headers, stamps,
                               compression=rng.choice(codecs), **kw)
        batches[info.first_offset] = [(info.first_offset + j, stamps[j], keys[j], values[j],
                                       [tuple(h) for h in headers[j]]) for j in range(n)]
        if txn and i == 31:
            info = lg.append_control(ControlRecordType.COMMIT, producer_id=77, producer_epoch=1)
            batches[info.first_offset] = []
    segments = [s.base_offset for s in lg.segments]
    leo = lg.log_end_offset
    lg.close()
    files = {}
    for n in sorted(os.listdir(directory)):
        with open(os.path.join(directory, n), "rb") as f:
            files[n] = f.read()
    assert len(segments) >= 4, segments
    return Pristine(name, cfg, files, segments, batches, leo)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    return {name: build(str(root / name / "t-0"), name) for name in VARIANTS}


# ------------------------------------------------------------------------------------------------
# opening and checking


def open_log(directory: str, p: Pristine, **kw) -> PartitionLog:
    return PartitionLog(directory, "t", 0, TopicConfig.from_dict(p.config), Clock(), **kw)


def all_records(lg) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
            for r in lg.iter_records()]


def expected_after_recovery(p: Pristine, files: dict, recovery_point: int = 0):
    """(kept batch bases, log end offset, {log file: valid end}) the oracle predicts for an
    unclean open of ``files`` that recovers every segment from the one holding the recovery
    point on."""
    kept, ends = [], {}
    start = max([i for i, b in enumerate(p.segments) if b <= recovery_point], default=0)
    leo = p.segments[0]
    for i, base in enumerate(p.segments):
        data = files[p.log_name(base)]
        if i < start:  # not recovered: trusted as is
            batches, end = oracle_scan(data, base)
            assert end == len(data), "damage below the recovery point of an unclean open"
        else:
            limit = p.segments[i + 1] if i + 1 < len(p.segments) else None
            batches, end = oracle_scan(data, base, limit)
        kept += [b[2] for b in batches]
        ends[p.log_name(base)] = end
        leo = batches[-1][3] + 1 if batches else base
        if i >= start and end < len(data):
            break  # later segments are deleted
    return kept, leo, ends


def check_recovered(directory: str, p: Pristine, files: dict, *, recovery_point: int = 0,
                    via_store: bool = False) -> None:
    """Open ``directory`` (holding ``files``) after an unclean shutdown and check the result
    against the oracle."""
    kept, leo, ends = expected_after_recovery(p, files, recovery_point)
    expected = p.expected(kept)
    if via_store:
        store = segstore.open(os.path.dirname(directory))
        lg = store.partition("t", 0)
    else:
        store = None
        lg = open_log(directory, p, had_clean_shutdown=False, recovery_point=recovery_point)
    try:
        assert lg.log_end_offset == leo
        assert all_records(lg) == expected
        assert lg.verify() == []
        names = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
        assert names == sorted(n for n in ends)
        on_disk = []
        for n in names:
            with open(os.path.join(directory, n), "rb") as f:
                data = f.read()
            assert len(data) == ends[n], n
            on_disk += independent_records(data, int(n[:20]))
        assert on_disk == expected
        # The recovered log takes appends at its end and survives a clean reopen.
        info = lg.append_batch([b"after"], [b"k"], timestamps_ms=[T0])
        assert info.first_offset == leo
    finally:
        (store or lg).close()
    if via_store:
        store = segstore.open(os.path.dirname(directory))
        lg = store.partition("t", 0)
    else:
        lg = open_log(directory, p)
    try:
        assert all_records(lg) == expected + [(leo, T0, b"k", b"after", [])]
        assert lg.verify() == []
    finally:
        (store or lg).close()
    COUNT["cases"] += 1


def damaged(p: Pristine, name: str, data: bytes) -> dict:
    files = dict(p.files)
    files[name] = bytes(data)
    return files


def run_case(directory: str, p: Pristine, files: dict, **kw) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    for n, d in files.items():
        with open(os.path.join(directory, n), "wb") as f:
            f.write(d)
    check_recovered(directory, p, files, **kw)


def batch_positions(data: bytes, base: int) -> list[tuple]:
    batches, end = oracle_scan(data, base)
    assert end == len(data)
    return batches


# ------------------------------------------------------------------------------------------------
# recovery of the active segment


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_last_batches_truncated_at_every_byte(tmp_path, pristine, variant):
    p = pristine[variant]
    name = p.log_name(p.active)
    data = p.files[name]
    batches = batch_positions(data, p.active)
    cut_from = batches[-min(LAST_BATCHES, len(batches))][0]
    # CI: every byte for one variant, every 7th for the others (SEGSTORE_DAMAGE_CASES: all).
    step = 1 if _ENV_CASES or variant == "mixed" else 7
    d = str(tmp_path / "t-0")
    for i, cut in enumerate(range(cut_from, len(data), step)):
        # Mostly recovering from the active segment (the checkpointed recovery point of a log
        # flushed at its last roll), every 4th case from offset 0.
        run_case(d, p, damaged(p, name, data[:cut]), recovery_point=0 if i % 4 == 0 else p.active)


def test_torn_tail_through_the_store(tmp_path, pristine):
    """The store path: no clean-shutdown marker, recovery from the checkpointed recovery point."""
    p = pristine["mixed"]
    root = tmp_path / "store"
    store = segstore.open(str(root))
    store.create_topic("t", 1, p.config)
    store.close()
    d = str(root / "t-0")
    name = p.log_name(p.active)
    data = p.files[name]
    rng = random.Random(1)
    for _ in range(max(10, CASES // 4)):
        os.unlink(str(root / CLEAN_SHUTDOWN_FILE))  # as after a crash
        cut = rng.randrange(batch_positions(data, p.active)[-3][0], len(data))
        files = damaged(p, name, data[:cut])
        run_case(d, p, files, via_store=True)


def _garbage(rng: random.Random, p: Pristine, data: bytes) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 400))
    if kind == 1:  # a plausible header: the next offset, a size that fits, junk after it
        size = rng.randrange(49, 300)
        return struct.pack(">qiib", p.leo, size, 0, 2) + rng.randbytes(size - 5)
    if kind == 2:  # a size running past the end
        return struct.pack(">qiib", p.leo, 10_000, 0, 2) + rng.randbytes(rng.randrange(0, 100))
    if kind == 3:  # a copy of an earlier batch with one byte changed (CRC mismatch)
        pos, size, _, _ = rng.choice(batch_positions(data, p.active))
        b = bytearray(data[pos:pos + size])
        struct.pack_into(">q", b, 0, p.leo)
        i = rng.randrange(21, size)
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 4:  # a size field below the minimum
        return struct.pack(">qi", p.leo, rng.randrange(-5, 14)) + rng.randbytes(rng.randrange(5, 60))
    return bytes(rng.randrange(1, 17))  # fewer than 17 bytes of anything


def test_garbage_appended_to_active_segment(tmp_path, pristine):
    rng = random.Random(2)
    d = str(tmp_path / "t-0")
    for _ in range(CASES):
        p = pristine[rng.choice(list(VARIANTS))]
        name = p.log_name(p.active)
        data = p.files[name]
        run_case(d, p, damaged(p, name, data + _garbage(rng, p, data)))


def test_zero_filled_tail(tmp_path, pristine):
    """Zeros after the data (a preallocated file after a crash), and zeros over the last bytes
    (blocks allocated but never written)."""
    rng = random.Random(3)
    d = str(tmp_path / "t-0")
    for i in range(CASES):
        p = pristine[rng.choice(list(VARIANTS))]
        name = p.log_name(p.active)
        data = p.files[name]
        if i % 2:
            damaged_data = data + bytes(rng.choice((1, 16, 17, 61, 4096, rng.randrange(1, 9000))))
        else:
            k = rng.randrange(1, 400)
            damaged_data = data[:-k] + bytes(k) + bytes(rng.randrange(0, 100))
        run_case(d, p, damaged(p, name, damaged_data))


def _flip_positions(data: bytes, base: int, include_base_offset: bool = False) -> list[int]:
    """Byte positions a flip may hit: everything but the (CRC-unprotected) base offsets."""
    skip = set()
    if not include_base_offset:
        for pos, _, _, _ in batch_positions(data, base):
            skip.update(range(pos, pos + 8))
    return [i for i in range(len(data)) if i not in skip]


def test_bit_flips_in_active_segment(tmp_path, pristine):
    rng = random.Random(4)
    d = str(tmp_path / "t-0")
    for _ in range(CASES):
        p = pristine[rng.choice(list(VARIANTS))]
        name = p.log_name(p.active)
        data = bytearray(p.files[name])
        positions = _flip_positions(p.files[name], p.active)
        for _ in range(rng.choice((1, 1, 1, 2, 5))):
            data[rng.choice(positions)] ^= 1 << rng.randrange(8)
        run_case(d, p, damaged(p, name, data), recovery_point=rng.choice((0, p.active)))


def test_bit_flips_in_any_segment_unclean(tmp_path, pristine):
    """Recovery from offset 0: a damaged segment is cut and every later one deleted."""
    rng = random.Random(5)
    d = str(tmp_path / "t-0")
    for _ in range(CASES):
        p = pristine[rng.choice(list(VARIANTS))]
        name = p.log_name(rng.choice(p.segments))
        data = bytearray(p.files[name])
        i = rng.choice(_flip_positions(bytes(data), int(name[:20])))
        data[i] ^= 1 << rng.randrange(8)
        run_case(d, p, damaged(p, name, data))


def test_bit_flips_in_index_files_unclean(tmp_path, pristine):
    """Damaged .index / .timeindex files of segments that are recovered (from offset 0, or from
    the active segment): every index is rebuilt, and nothing is lost."""
    rng = random.Random(6)
    d = str(tmp_path / "t-0")
    for _ in range(CASES):
        p = pristine[rng.choice(list(VARIANTS))]
        rp = rng.choice((0, 0, p.active, p.leo))
        first = max(i for i, b in enumerate(p.segments) if b <= rp or i == 0)
        files = dict(p.files)
        for _ in range(rng.choice((1, 1, 3))):
            name = rng.choice([n for n in files if n.endswith(("index", "timeindex"))
                               and files[n] and int(n[:20]) >= p.segments[first]])
            data = bytearray(files[name])
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
            files[name] = bytes(data)
        run_case(d, p, files, recovery_point=rp)


def test_index_files_overwritten_with_garbage(tmp_path, pristine):  # REF §7 #22, #26
    rng = random.Random(7)
    d = str(tmp_path / "t-0")
    for _ in range(max(10, CASES // 4)):
        p = pristine[rng.choice(list(VARIANTS))]
        files = dict(p.files)
        base = rng.choice(p.segments)
        for suffix in rng.choice(((".index",), (".timeindex",), (".index", ".timeindex"))):
            n = f"{base:020d}{suffix}"
            files[n] = rng.randbytes(rng.choice((len(files[n]), rng.randrange(0, 200))))
        # Garbage after the active segment's data too, with an old recovery point (#26).
        name = p.log_name(p.active)
        files[name] = files[name] + rng.randbytes(rng.randrange(0, 100))
        run_case(d, p, files, recovery_point=rng.choice((0, base)))


# ------------------------------------------------------------------------------------------------
# sealed segments after a clean shutdown: reported, never served


def _sealed_flip_case(rng, p, positions="crc"):
    """A sealed segment with bits flipped in one batch's CRC-protected bytes (or, with
    ``positions="size"``, in its size field); returns (files, base, log name, bad batch)."""
    base = rng.choice(p.segments[:-1])
    name = p.log_name(base)
    data = bytearray(p.files[name])
    batches = batch_positions(bytes(data), base)
    bad = rng.choice(batches)
    pos, size = bad[0], bad[1]
    if positions == "size":
        data[pos + 8 + rng.randrange(4)] ^= 1 << rng.randrange(8)
    else:
        where = list(range(16, size))
        for _ in range(rng.choice((1, 1, 2, 8))):
            data[pos + rng.choice(where)] ^= 1 << rng.randrange(8)
    if data[pos + 16] in (0, 1):  # a magic of 0/1 is read as a legacy entry: skip that case
        return None
    return damaged(p, name, data), base, name, bad


def test_bit_flips_in_sealed_segments_are_reported_not_served(tmp_path, pristine):
    rng = random.Random(8)
    d = str(tmp_path / "t-0")
    done = 0
    while done < CASES:
        p = pristine[rng.choice(list(VARIANTS))]
        case = _sealed_flip_case(rng, p, rng.choice(("crc", "crc", "crc", "size")))
        if case is None:
            continue
        files, base, name, bad = case
        assert oracle_scan(files[name], base)[1] == bad[0]  # the oracle agrees where it is
        p.write(d)
        with open(os.path.join(d, name), "wb") as f:
            f.write(files[name])
        lg = open_log(d, p)  # clean shutdown: recovery point = log end, nothing recovered
        try:
            path = os.path.join(d, name)
            problems = lg.verify()
            assert any(pr.file == path and pr.position == bad[0] for pr in problems), problems
            # Batches before the damaged one read (or fail at the damaged one: reads scan a few
            # batches ahead, see test_iter_records_stops_at_its_end); the damaged one raises,
            # naming file and place.
            good = [b for b in batch_positions(p.files[name], base) if b[0] < bad[0]]
            for b in good:
                try:
                    got = all_records_from(lg, b[2], 1)
                except CorruptRecordError as e:
                    assert e.file == path and in_batch(e.position, bad)
                else:
                    assert got == p.batches[b[2]] or not p.batches[b[2]]
            with pytest.raises(CorruptRecordError) as ei:
                lg.read(bad[2], max_bytes=1)
            assert ei.value.file == path and in_batch(ei.value.position, bad)
            with pytest.raises(CorruptRecordError):
                list(lg.iter_records())
            with pytest.raises(CorruptRecordError):
                lg.read_columns()
            # Segments before the damaged one read in full (bounded by the damaged one's base).
            before = p.expected([b for b in p.batches if b < base])
            cols = lg.read_columns(p.segments[0], base)
            assert cols.offsets.tolist() == [r[0] for r in before]
            assert cols.values.to_pylist() == [r[3] for r in before]
        finally:
            lg.close()
        done += 1
        COUNT["cases"] += 1


def in_batch(position, batch) -> bool:
    """Whether an error position is at or after the damaged batch (a damaged size field can
    make a scan without CRC checks fail where the damaged batch seems to end; only verify(),
    which checks every CRC, is expected to name the damaged batch itself)."""
    return position is not None and position >= batch[0]


def all_records_from(lg, offset: int, max_bytes: int) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
            for r in lg.read(offset, max_bytes=max_bytes)]


def first_at_or_after(expected: list[tuple], ts: int):
    """Oracle of offset_for_time: the first record (offset order) with timestamp >= ts."""
    return next(((r[0], r[1]) for r in expected if r[1] >= ts), None)


def _sealed_index_flip_case(tmp_path, p, rng, suffix):
    base = rng.choice(p.segments[:-1])
    name = f"{base:020d}{suffix}"
    data = bytearray(p.files[name])
    if not data:
        return None
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    return d, name


def _check_sealed_index_flip(lg, p, rng, name) -> None:
    """Reads from every offset return exactly the records from there on (nothing skipped), or
    raise CorruptRecordError/CorruptIndexError -- and then verify() reports a problem."""
    expected = p.expected(p.batches)
    try:
        for o in range(p.segments[0], p.leo):
            recs = all_records_from(lg, o, 1)
            want = [r for r in expected if r[0] >= o]
            assert recs == want[:len(recs)], (name, o)
            assert recs or not want or want[0][0] > o, (name, o)  # nothing skipped
        assert all_records(lg) == expected
        for _ in range(20):
            ts = rng.randrange(T0 - 10, T0 + 800)
            got = lg.offset_for_time(ts)
            assert (None if got is None else (got.offset, got.timestamp)) == \
                first_at_or_after(expected, ts), (name, ts)
    except (CorruptRecordError, CorruptIndexError):
        assert lg.verify() != []


@pytest.mark.parametrize("suffix, seed", [(".timeindex", 9), (".index", 11)])
def test_bit_flips_in_sealed_indexes_never_serve_wrong_data(tmp_path, pristine, suffix, seed):
    """Damaged sealed index files (clean shutdown): a .timeindex or .index entry that no
    longer agrees with the log is never trusted -- reads and offset_for_time answer exactly
    (they once returned the next segment's records after scanning from a bogus position into a
    'torn' size), or they raise and verify() reports it."""
    rng = random.Random(seed)
    done = 0
    while done < CASES:
        p = pristine[rng.choice(list(VARIANTS))]
        case = _sealed_index_flip_case(tmp_path, p, rng, suffix)
        if case is None:
            continue
        lg = open_log(case[0], p)
        try:
            _check_sealed_index_flip(lg, p, rng, case[1])
        finally:
            lg.close()
        done += 1
        COUNT["cases"] += 1


def _sealed_index_entry_changed(tmp_path, p, slot_change):
    base = p.segments[1]
    name = f"{base:020d}.index"
    entries = np.frombuffer(p.files[name], dtype=[("rel", ">i4"), ("pos", ">i4")]).copy()
    slot_change(entries, batch_positions(p.files[p.log_name(base)], base))
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(entries.tobytes())
    return open_log(d, p), base


def test_index_entry_inside_a_batch_is_not_served(tmp_path, pristine):
    """An ordered index entry pointing inside a batch: read() must not scan from there."""
    p = pristine["dense"]

    def inside(entries, batches):
        entries["pos"][0] += 64  # still ordered, still inside the file, but mid-batch
    lg, base = _sealed_index_entry_changed(tmp_path, p, inside)
    try:
        o = base + int(np.frombuffer(p.files[f"{base:020d}.index"],
                                     dtype=[("rel", ">i4"), ("pos", ">i4")])["rel"][0])
        want = [r for r in p.expected(p.batches) if r[0] >= o][:1]
        assert all_records_from(lg, o, 1)[:1] == want
    finally:
        lg.close()


def test_index_entry_past_the_segment_is_rebuilt(tmp_path, pristine):
    """A last entry whose offset lies past the segment fails the loading check (an entry past
    the log, KAFKA-10207): the index is rebuilt, verify() is clean right after the open."""
    p = pristine["plain"]

    def past(entries, batches):
        entries["rel"][-1] += 1 << 20
    lg, _ = _sealed_index_entry_changed(tmp_path, p, past)
    try:
        assert lg.verify() == []
    finally:
        lg.close()


# ------------------------------------------------------------------------------------------------
# unprotected header fields


def test_leader_epoch_flips_are_harmless(tmp_path, pristine):
    """partitionLeaderEpoch (bytes 12-15) is outside the CRC: recovery keeps the batch."""
    rng = random.Random(10)
    d = str(tmp_path / "t-0")
    for _ in range(max(10, CASES // 4)):
        p = pristine[rng.choice(list(VARIANTS))]
        name = p.log_name(p.active)
        data = bytearray(p.files[name])
        pos = rng.choice(batch_positions(bytes(data), p.active))[0]
        data[pos + 12 + rng.randrange(4)] ^= 1 << rng.randrange(8)
        run_case(d, p, damaged(p, name, data))


def test_base_offset_flipped_upwards_in_the_last_batch_is_kept(tmp_path, pristine):
    """baseOffset is outside the CRC too: raised in the last batch, it is indistinguishable from
    a valid batch after a gap (Kafka cannot tell either), so recovery keeps it."""
    p = pristine["plain"]
    name = p.log_name(p.active)
    data = bytearray(p.files[name])
    pos = batch_positions(bytes(data), p.active)[-1][0]
    struct.pack_into(">q", data, pos, struct.unpack_from(">q", data, pos)[0] + 1000)
    files = damaged(p, name, data)
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(files[name])
    lg = open_log(d, p, had_clean_shutdown=False, recovery_point=0)
    try:
        assert lg.log_end_offset == p.leo + 1000
        assert lg.verify() == []
    finally:
        lg.close()


def test_stale_copy_of_a_batch_after_the_data_is_cut(tmp_path, pristine):
    """A CRC-valid batch whose offsets do not increase (baseOffset is outside the CRC) ends
    the valid prefix, as a CRC mismatch does (it was once kept, and verify() then complained)."""
    p = pristine["plain"]
    name = p.log_name(p.active)
    data = p.files[name]
    pos, size, _, _ = batch_positions(data, p.active)[-1]
    run_case(str(tmp_path / "t-0"), p, damaged(p, name, data + data[pos:pos + size]))


def test_base_offset_flipped_downwards_is_cut(tmp_path, pristine):
    p = pristine["plain"]
    name = p.log_name(p.active)
    data = bytearray(p.files[name])
    pos = batch_positions(bytes(data), p.active)[2][0]
    struct.pack_into(">q", data, pos, struct.unpack_from(">q", data, pos)[0] - 1)
    run_case(str(tmp_path / "t-0"), p, damaged(p, name, data))


def test_size_field_damage_in_sealed_segment_is_not_served(tmp_path, pristine):
    """A sealed segment's batch size damaged to run past the file is corruption, not a torn
    tail: reads raise instead of silently going on with the next segment's records."""
    p = pristine["plain"]
    base = p.segments[1]
    name = p.log_name(base)
    data = bytearray(p.files[name])
    pos, _, first, _ = batch_positions(bytes(data), base)[1]
    struct.pack_into(">i", data, pos + 8, 100_000)
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    lg = open_log(d, p)
    try:
        with pytest.raises(CorruptRecordError):
            lg.read(first, max_bytes=1)
    finally:
        lg.close()


def test_damaged_max_timestamp_in_sealed_segment_does_not_break_close(tmp_path, pristine):
    """A sealed segment whose last batch's maxTimestamp was damaged (CRC-covered, but read
    without a CRC check): close() must not try to write a final time-index entry into its
    trimmed, full .timeindex (it once raised 'has no room left')."""
    p = pristine["plain"]
    base = p.segments[1]
    name = p.log_name(base)
    data = bytearray(p.files[name])
    pos = batch_positions(bytes(data), base)[-1][0]
    data[pos + 37] ^= 0x10  # maxTimestamp of the segment's last batch
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    lg = open_log(d, p)
    assert lg.verify() != []
    lg.close()


def test_iter_records_stops_at_its_end(tmp_path, pristine):
    """Damage in a segment after the iterated range does not fail the iteration."""
    p = pristine["plain"]
    name = p.log_name(p.segments[2])
    data = bytearray(p.files[name])
    data[30] ^= 1  # first batch of the third segment: CRC mismatch
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    lg = open_log(d, p)
    try:
        got = [r.offset for r in lg.iter_records(p.segments[0], p.segments[1])]
        assert got == list(range(p.segments[0], p.segments[1]))
    finally:
        lg.close()


def test_negative_last_offset_delta_in_sealed_segment_is_not_skipped(tmp_path, pristine):
    """A sealed segment's last batch with lastOffsetDelta damaged to a negative value (CRC-
    covered, but batches are located before any CRC check): read() from one of its offsets once
    returned the next segment's records; it must raise."""
    p = pristine["plain"]
    base = p.segments[1]
    name = p.log_name(base)
    data = bytearray(p.files[name])
    pos, _, first, _ = batch_positions(bytes(data), base)[-1]
    data[pos + 23] |= 0x80
    d = str(tmp_path / "t-0")
    p.write(d)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    lg = open_log(d, p)
    try:
        with pytest.raises(CorruptRecordError):
            lg.read(first, max_bytes=1)
    finally:
        lg.close()


def test_recovery_stops_at_the_next_segments_base(tmp_path):
    """Overlapping segments (a batch reaching into the next segment's offsets, e.g. a foreign
    or damaged directory): recovery from offset 0 leaves a log verify() accepts."""
    d = tmp_path / "t-0"
    d.mkdir()
    (d / f"{0:020d}.log").write_bytes(_core.encode_batch([b"a", b"b"], timestamps_ms=[1, 2]))
    (d / f"{1:020d}.log").write_bytes(_core.encode_batch([b"c"], timestamps_ms=[3],
                                                         base_offset=1))
    lg = PartitionLog(str(d), "t", 0, TopicConfig.from_dict({}), Clock(),
                      had_clean_shutdown=False, recovery_point=0)
    try:
        assert lg.verify() == []
        offsets = [r.offset for r in lg.iter_records()]
        assert offsets == list(range(lg.log_start_offset, lg.log_end_offset))
    finally:
        lg.close()


def test_damage_case_count():
    """Runs last: how many damage cases this module ran (CI: about 600)."""
    print(f"damage cases: {COUNT['cases']}")
    if COUNT["cases"]:
        assert COUNT["cases"] >= 300
