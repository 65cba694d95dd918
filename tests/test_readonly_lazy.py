"""A read-only store lists a partition's directory only when that partition is first used: a
reader of one partition (a Spark task) need not list every other partition of a large store."""

from __future__ import annotations

import os

import segstore


def _store(path: str) -> str:
    with segstore.open(path) as s:
        for t in range(3):
            s.create_topic(f"t{t}", 10)
            for p in range(10):
                s.partition(f"t{t}", p).append_batch([b"v%d" % p] * 3)
    return path


def _counting_listdir(monkeypatch) -> list:
    """The directories listed from now on (by os.listdir or os.scandir), by base name."""
    seen: list = []

    def counting(real):
        def listing(path="."):
            seen.append(os.path.basename(os.path.normpath(path)))
            return real(path)
        return listing

    monkeypatch.setattr(os, "listdir", counting(os.listdir))
    monkeypatch.setattr(os, "scandir", counting(os.scandir))
    return seen


def test_an_open_lists_no_partition_directory(tmp_path, monkeypatch):
    root = _store(str(tmp_path / "s"))
    seen = _counting_listdir(monkeypatch)
    with segstore.open(root, readonly=True) as s:
        assert sorted(seen) == ["s", "topics"]  # the root and the metadata directory
        assert [r.value for r in s.partition("t1", 4).read(0)] == [b"v4"] * 3
        assert {n for n in seen if n.startswith("t1-")} == {"t1-4"}
        assert s.partition("t2", 9).log_end_offset == 3


def test_a_partition_used_late_sees_what_the_writer_added_after_the_open(tmp_path):
    root = _store(str(tmp_path / "s"))
    with segstore.open(root, readonly=True) as reader:
        with segstore.open(root) as writer:
            writer.partition("t0", 0).append_batch([b"late"])
            writer.partition("t0", 0).roll()
            writer.partition("t0", 0).append_batch([b"later"])
        lg = reader.partition("t0", 0)
        assert [r.value for r in lg.read(0)] == [b"v0"] * 3 + [b"late", b"later"]
        assert lg.log_start_offset == 0 and lg.log_end_offset == 5


def test_every_partition_is_still_checked_by_verify(tmp_path):
    root = _store(str(tmp_path / "s"))
    seg = os.path.join(root, "t2-7", "00000000000000000000.log")
    with open(seg, "r+b") as f:
        f.seek(70)
        f.write(b"\xff")  # a record byte: the batch's CRC no longer matches
    with segstore.open(root, readonly=True) as s:
        problems = s.verify()
    assert [os.path.relpath(p.file, root) for p in problems] == [os.path.relpath(seg, root)]
