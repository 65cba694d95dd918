"""LogStore.verify() / PartitionLog.verify(): every problem named by file and position."""

import os

import segstore
from segstore.segment import Problem


def _store(root):
    s = segstore.open(str(root), clock=lambda: 1_700_000_000_000)
    s.create_topic("a", 2, config={"segment.bytes": 4000, "index.interval.bytes": 100})
    for i in range(400):
        s.append("a", b"value-%04d" % i, key=b"k%d" % (i % 7))
    return s


def test_sound_store_has_no_problems(tmp_path):
    with _store(tmp_path) as s:
        assert s.verify() == []
    with segstore.open(str(tmp_path)) as s:
        assert s.verify() == []


def test_bit_flip_in_a_sealed_segment_is_reported_with_file_and_position(tmp_path):
    with _store(tmp_path) as s:
        seg = s.partition("a", 1).segments[0]
        path = seg.log_path
        sizes = [int(x) for x in seg.scan().batches["size"]]
    flip_at = sizes[0] + sizes[1] + 30  # inside the third batch, in CRC-covered bytes
    with open(path, "r+b") as f:
        f.seek(flip_at)
        byte = f.read(1)
        f.seek(flip_at)
        f.write(bytes([byte[0] ^ 0x10]))
    with segstore.open(str(tmp_path)) as s:
        problems = s.verify()
    assert problems and all(isinstance(p, Problem) for p in problems)
    first = problems[0]
    assert first.file == path and first.position == sizes[0] + sizes[1]
    assert "CRC" in first.message and str(first.position) in str(first)


def test_verify_changes_nothing(tmp_path):
    with _store(tmp_path):
        pass
    before = {n: os.path.getsize(os.path.join(tmp_path, "a-0", n))
              for n in os.listdir(tmp_path / "a-0")}
    with segstore.open(str(tmp_path), readonly=True) as ro:
        assert ro.verify() == []
    after = {n: os.path.getsize(os.path.join(tmp_path, "a-0", n))
             for n in os.listdir(tmp_path / "a-0")}
    assert before == after
