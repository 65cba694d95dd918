"""Reads capped by ``max_records`` stop at the batches holding their records.

``read(o, max_records=n, max_bytes=<large>)`` and ``read_columns(o, max_records=n)`` need only
the batches up to the one holding the n-th record at or after ``o``: damage in any batch after
it (a later batch of the same segment, or a later segment) must not fail them, while damage in a
batch they need still raises CorruptRecordError naming the file and the batch's position.

Every damage kind of test_log_damage is applied to one batch of a sealed segment (left as it is
by a clean reopen). The logs cover uncompressed and compressed batches, batches with offset gaps
(as compaction leaves them) and transaction markers (control batches, which hold no records a
read returns). Expected records: the offsets come from the layout the test appended; the
records themselves from the same read of an undamaged copy of the log.
"""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given, strategies as st

from conftest import batch_spans, columns_tuples, rec_tuple
from segstore import _core
from segstore.config import TopicConfig
from segstore.errors import CorruptRecordError
from segstore.log import PartitionLog
from segstore.records import ControlRecordType
from test_log_damage import KINDS, _damage

T0 = 1_700_000_000_000
BIG = 1 << 30
PID, EPOCH = 7, 0

# Each layout is a list of batches: ("data", offset deltas, codec) or ("control",). Batch i of
# "plain" holds offsets 4i..4i+3; "gaps" batches span 8 offsets each, with holes.
LAYOUTS = {
    "plain": [("data", (0, 1, 2, 3), 0)] * 10,
    "gzip": [("data", (0, 1, 2, 3), 1)] * 10,
    "lz4": [("data", (0, 1, 2, 3), 3)] * 10,
    "gaps": [("data", (0, 5, 6, 7), 0), ("data", (0, 1, 2, 7), 1), ("data", (2, 3, 4, 5), 0),
             ("data", (0, 6), 1), ("data", (1, 3, 5, 7), 0), ("data", (0, 4), 0),
             ("data", (0, 1, 2, 3, 4, 5, 6, 7), 1), ("data", (3,), 0)],
    "control": [("data", (0, 1, 2), 0), ("control",)] * 6,
}
# Which batch is damaged (by index in the segment), per layout.
DAMAGED = {"plain": [3], "gzip": [3], "lz4": [3], "gaps": [3], "control": [5, 6, 7]}


def _build(directory: str, layout, interval: int, split_at=None,
           seal=True) -> list[tuple[int, list[int]]]:
    """Append ``layout`` to a new log, sealing its segments (a roll after batch ``split_at``
    too; with ``seal`` False the last stays active), and close it cleanly. Returns each batch's
    (base offset, record offsets)."""
    config = TopicConfig.from_dict({"index.interval.bytes": interval})
    lg = PartitionLog(directory, "t", 0, config, lambda: T0)
    out, seq = [], 0
    for i, batch in enumerate(layout):
        base = lg.log_end_offset
        if batch[0] == "control":
            lg.append_control(ControlRecordType.COMMIT, producer_id=PID, producer_epoch=EPOCH)
            out.append((base, []))
        else:
            _, deltas, codec = batch
            offsets = [base + d for d in deltas]
            if layout[-1][0] == "control":  # transactional data, committed by the next batch
                lg.append_batch([b"value-%03d" % o for o in offsets],
                                timestamps_ms=[T0 + o for o in offsets], compression=codec,
                                producer_id=PID, producer_epoch=EPOCH, base_sequence=seq,
                                is_transactional=True)
                seq += len(offsets)
            else:
                data = _core.encode_batch([b"value-%03d" % o for o in offsets],
                                          timestamps_ms=[T0 + o for o in offsets],
                                          base_offset=base, offset_deltas=list(deltas),
                                          compression=codec)
                lg.append_records(data)
            assert lg.log_end_offset == base + deltas[-1] + 1
            out.append((base, offsets))
        if split_at is not None and i == split_at:
            lg.roll()
    if seal:
        lg.roll()  # sealed: a clean reopen leaves the damage in place
        lg.append_batch([b"next"], timestamps_ms=[T0 + 1000])
    lg.close()
    return out


def _segment_paths(directory: str) -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".log"))


def _damage_batch(path: str, index: int, kind: str) -> int:
    """Damage batch ``index`` of the segment file; returns its position."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    spans = batch_spans(bytes(data))
    _damage(data, *spans[index], kind)
    with open(path, "wb") as f:
        f.write(data)
    return spans[index][0]


class Case:
    """A damaged log and an undamaged copy of it, with the batches' offsets."""

    def __init__(self, lg, clean, batches, damaged, path, position):
        self.lg, self.clean, self.batches, self.damaged = lg, clean, batches, damaged
        self.path, self.position = path, position
        self.records = [(o, i) for i, (_, offs) in enumerate(batches) for o in offs]

    def outcome(self, start: int, n: int, end: int):
        """The offsets of the first ``n`` records in [start, end), or None when the read needs
        the damaged batch (it holds one of them, or fewer than ``n`` come before it)."""
        wanted = [(o, i) for o, i in self.records if start <= o < end][:n]
        if len(wanted) < n or wanted[-1][1] >= self.damaged:
            return None
        return [o for o, _ in wanted]


def _open_case(tmp_path, layout_name, damaged, kind, interval, split_at=None, segment=0,
               seal=True):
    layout = LAYOUTS[layout_name]
    directory = str(tmp_path / "t-0")
    batches = _build(directory, layout, interval, split_at, seal)
    shutil.copytree(directory, str(tmp_path / "clean" / "t-0"))
    path = _segment_paths(directory)[segment]
    first = 0 if segment == 0 else split_at + 1
    position = _damage_batch(path, damaged - first, kind)
    config = TopicConfig.from_dict({"index.interval.bytes": interval})
    lg = PartitionLog(directory, "t", 0, config, lambda: T0)
    clean = PartitionLog(str(tmp_path / "clean" / "t-0"), "t", 0, config, lambda: T0)
    return Case(lg, clean, batches, damaged, path, position)


@pytest.fixture(params=[(layout, d, k, i) for layout in LAYOUTS for d in DAMAGED[layout]
                        for k in KINDS for i in (0, 4096)],
                ids=lambda p: f"{p[0]}-batch{p[1]}-{p[2]}-interval{p[3]}")
def case(tmp_path, request):
    layout, damaged, kind, interval = request.param
    c = _open_case(tmp_path, layout, damaged, kind, interval)
    yield c
    c.lg.close()
    c.clean.close()


def _check_reads(c: Case, starts, ns) -> None:
    """read and read_columns (to the log end, and to an end offset in the damaged batch's
    segment but after the damaged batch) of n records from each start."""
    log_end = c.lg.log_end_offset
    # The first offset of the segment's last batch: the range ends inside the segment.
    segment_end = max(b for b, offs in c.batches) + 1
    for start in starts:
        for n in ns:
            def reads(lg):
                return {
                    "read": lambda: [rec_tuple(r) for r in
                                     lg.read(start, max_records=n, max_bytes=BIG)],
                    "read_columns": lambda: columns_tuples(
                        lg.read_columns(start, max_records=n, include_headers=True)),
                    "read_columns_to": lambda: columns_tuples(
                        lg.read_columns(start, segment_end, max_records=n,
                                        include_headers=True)),
                }
            clean = reads(c.clean)
            for what, read in reads(c.lg).items():
                expected = c.outcome(start, n, segment_end if what.endswith("_to") else log_end)
                where = f"{what}({start}, max_records={n})"
                if expected is not None:
                    got = read()
                    assert [t[0] for t in got] == expected, where
                    assert got == clean[what](), where
                else:
                    with pytest.raises(CorruptRecordError) as e:
                        read()
                    assert (e.value.file, e.value.position) == (c.path, c.position), where


def test_max_records_reads_stop_before_the_damage(case):
    """Every start before the damaged batch, every n up to two past the records before it:
    reads whose n records all precede the damaged batch return them, the others raise."""
    first_damaged = case.batches[case.damaged][0]
    before = sum(1 for o, i in case.records if i < case.damaged)
    _check_reads(case, range(first_damaged), range(1, before + 3))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["plain", "gzip", "control"])
def test_damage_in_a_later_segment(tmp_path, layout, kind):
    """Records all in the first segment are read whatever the damage in the next one."""
    split_at = 5
    c = _open_case(tmp_path, layout, split_at + 2, kind, 4096, split_at=split_at, segment=1)
    try:
        end = c.batches[split_at + 1][0]
        before = sum(1 for o, i in c.records if i < c.damaged)
        _check_reads(c, [0, 2, end - 3, end - 1], range(1, before + 3))
    finally:
        c.lg.close()
        c.clean.close()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_crc_damage_in_the_active_segment(tmp_path, layout):
    """The active segment too (a clean reopen checks its batch headers, not their CRCs)."""
    damaged = DAMAGED[layout][0]
    c = _open_case(tmp_path, layout, damaged, "crc", 4096, seal=False)
    try:
        assert c.lg.log_end_offset == c.clean.log_end_offset  # the damage is still there
        before = sum(1 for o, i in c.records if i < c.damaged)
        _check_reads(c, range(c.batches[damaged][0]), range(1, before + 3))
    finally:
        c.lg.close()
        c.clean.close()


# -- the compiled decoders on their own ----------------------------------------------------------

def _segment_bytes(batches) -> tuple[bytes, list[tuple[int, list[int]]]]:
    """Batches ("data", deltas, codec) / ("control",) encoded back to back from offset 0."""
    parts, out, base = [], [], 0
    for b in batches:
        if b[0] == "control":
            parts.append(_core.encode_control_batch(
                ControlRecordType.COMMIT, producer_id=PID, producer_epoch=EPOCH,
                coordinator_epoch=0, base_offset=base, timestamp_ms=T0,
                partition_leader_epoch=0))
            out.append((base, []))
            base += 1
        else:
            _, deltas, codec = b
            offsets = [base + d for d in deltas]
            parts.append(_core.encode_batch([b"v%d" % o for o in offsets],
                                            timestamps_ms=[T0 + o for o in offsets],
                                            base_offset=base, offset_deltas=list(deltas),
                                            compression=codec))
            out.append((base, offsets))
            base += deltas[-1] + 1
    return b"".join(parts), out


_batch = st.one_of(
    st.tuples(st.just("data"),
              st.lists(st.integers(0, 9), min_size=1, max_size=6, unique=True).map(
                  lambda d: tuple(sorted(d))),
              st.sampled_from([0, 1, 2, 3, 4])),
    st.just(("control",)))


@given(batches=st.lists(_batch, min_size=2, max_size=8), data=st.data())
def test_decoders_stop_at_max_records(batches, data):
    """decode_records and decode_columns over a damaged range: the first n records from a start
    offset when they all precede the damaged batch, CorruptRecordError at it otherwise."""
    buf, layout = _segment_bytes(batches)
    damaged = data.draw(st.integers(0, len(layout) - 1), label="damaged")
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    spans = batch_spans(buf)
    broken = bytearray(buf)
    _damage(broken, *spans[damaged], kind)
    start = data.draw(st.integers(0, layout[damaged][0]), label="start")
    n = data.draw(st.integers(1, 12), label="n")
    records = [(o, i) for i, (_, offs) in enumerate(layout) for o in offs if o >= start]
    wanted = records[:n]
    ok = len(wanted) == n and wanted[-1][1] < damaged
    decoders = {
        "decode_records": lambda b: [r.offset for r in _core.decode_records(
            b, 0, len(b), min_offset=start, max_records=n, strict=True, file="f")],
        "decode_columns": lambda b: _core.decode_columns(
            b, 0, len(b), min_offset=start, max_records=n, strict=True,
            file="f").offsets.tolist(),
    }
    for what, decode in decoders.items():
        if ok:
            assert decode(bytes(broken)) == [o for o, _ in wanted], what
        else:
            assert decode(buf)[:len(wanted)] == [o for o, _ in wanted], what
            with pytest.raises(CorruptRecordError) as e:
                decode(bytes(broken))
            assert (e.value.file, e.value.position) == ("f", spans[damaged][0]), what
