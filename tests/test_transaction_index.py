"""TransactionIndex: Kafka's ``.txnindex`` (REF §2.5), ported from Kafka's TransactionIndexTest
plus the file-level rules segstore adds (lazy creation, renames with a segment's suffixes).

Oracle: entries packed by hand with ``struct.pack('>hqqqq', ...)`` and the expectations of
Kafka's test cases (collectAbortedTxns ranges, truncateTo, sanityCheck).
"""

from __future__ import annotations

import os
import struct

import pytest

from segstore.errors import CorruptIndexError, InvalidOffsetError
from segstore.transaction_index import AbortedTxn, TransactionIndex

ENTRY = ">hqqqq"


def packed(*txns) -> bytes:
    return b"".join(struct.pack(ENTRY, 0, *t) for t in txns)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "00000000000000000000.txnindex")


def test_entry_bytes_are_kafkas_layout(path):
    idx = TransactionIndex(path)
    txn = AbortedTxn(producer_id=2**40 + 3, first_offset=5, last_offset=2**33, last_stable_offset=7)
    idx.append(txn)
    idx.append(AbortedTxn(9, 2**33 + 1, 2**33 + 2, 2**33 + 3))
    idx.flush()
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == 68
    assert data == packed((2**40 + 3, 5, 2**33, 7), (9, 2**33 + 1, 2**33 + 2, 2**33 + 3))
    assert data[:2] == b"\x00\x00"  # version 0
    assert txn.to_bytes() == struct.pack(ENTRY, 0, 2**40 + 3, 5, 2**33, 7)


def test_file_is_created_by_the_first_append_only(path):
    idx = TransactionIndex(path)
    assert idx.all() == [] and idx.last_offset is None and not idx.exists
    idx.truncate_to(0)
    idx.reset()
    idx.flush()
    idx.sanity_check()
    assert idx.collect_aborted(0, 100) == []
    idx.close()
    assert not os.path.exists(path)
    idx.append(AbortedTxn(1, 0, 3, 4))
    assert os.path.getsize(path) == 34 and idx.exists and idx.size_bytes == 34


def test_position_set_correctly_when_opened(path):  # Kafka: testPositionSetCorrectlyWhenOpened
    txns = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25),
            AbortedTxn(3, 32, 50, 40)]
    idx = TransactionIndex(path)
    for t in txns:
        idx.append(t)
    idx.close()
    again = TransactionIndex(path)
    assert again.last_offset == 50
    with pytest.raises(InvalidOffsetError):  # the reopened index knows its last offset
        again.append(AbortedTxn(4, 40, 50, 51))
    again.append(AbortedTxn(4, 55, 60, 61))
    assert again.all() == txns + [AbortedTxn(4, 55, 60, 61)]
    with open(path, "rb") as f:
        assert f.read() == packed(*txns, (4, 55, 60, 61))


@pytest.mark.parametrize("second_last", [15, 10])  # equal, then lower: both rejected
def test_last_offset_must_increase(path, second_last):  # Kafka: testLastOffsetMustIncrease/Decrease
    idx = TransactionIndex(path)
    idx.append(AbortedTxn(1, 0, 15, 11))
    with pytest.raises(InvalidOffsetError):
        idx.append(AbortedTxn(1, 0, second_last, 11))
    assert idx.all() == [AbortedTxn(1, 0, 15, 11)]
    assert os.path.getsize(path) == 34


def test_collect_aborted_transactions(path):  # Kafka: testCollectAbortedTransactions
    txns = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25),
            AbortedTxn(3, 32, 50, 40)]
    idx = TransactionIndex(path)
    for t in txns:
        idx.append(t)
    assert idx.collect_aborted(0, 100) == txns
    assert idx.collect_aborted(0, 32) == txns[:3]
    assert idx.collect_aborted(0, 35) == txns
    assert idx.collect_aborted(10, 35) == txns
    assert idx.collect_aborted(11, 35) == txns[1:4]
    assert idx.collect_aborted(20, 41) == txns[2:4]
    assert idx.collect_aborted(51, 100) == []
    assert idx.collect_aborted(0, 0) == []  # the upper bound is exclusive


def test_truncate(path):  # Kafka: testTruncate
    txns = [AbortedTxn(0, 0, 10, 2), AbortedTxn(1, 5, 15, 16), AbortedTxn(2, 18, 35, 25),
            AbortedTxn(3, 32, 50, 40)]
    idx = TransactionIndex(path)
    for t in txns:
        idx.append(t)
    idx.truncate_to(51)
    assert idx.collect_aborted(0, 100) == txns
    idx.truncate_to(50)  # an entry whose last offset equals the target goes
    assert idx.collect_aborted(0, 100) == txns[:3]
    assert os.path.getsize(path) == 3 * 34 and idx.last_offset == 35
    idx.append(AbortedTxn(5, 40, 45, 46))  # below the dropped entry's last offset: fine now
    assert idx.all() == txns[:3] + [AbortedTxn(5, 40, 45, 46)]
    idx.truncate_to(0)
    assert idx.all() == [] and idx.last_offset is None and os.path.getsize(path) == 0
    idx.append(AbortedTxn(6, 1, 2, 3))
    idx.reset()
    assert idx.collect_aborted(0, 100) == [] and os.path.getsize(path) == 0


def test_truncate_of_a_closed_index_reads_the_file(path):
    idx = TransactionIndex(path)
    for t in (AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 12, 20, 21)):
        idx.append(t)
    idx.close()
    again = TransactionIndex(path)
    again.truncate_to(15)
    assert os.path.getsize(path) == 34 and again.last_offset == 10
    again.append(AbortedTxn(2, 12, 14, 15))
    assert TransactionIndex(path).all() == [AbortedTxn(0, 0, 10, 11), AbortedTxn(2, 12, 14, 15)]


def test_sanity_check_rejects_entries_below_the_start_offset(path):  # Kafka: testSanityCheck
    txns = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13)]
    idx = TransactionIndex(path)
    for t in txns:
        idx.append(t)
    idx.close()
    TransactionIndex(path, start_offset=10).sanity_check()
    with pytest.raises(CorruptIndexError, match="less than start offset 11"):
        TransactionIndex(path, start_offset=11).sanity_check()


def test_sanity_check_rejects_partial_entries_naming_the_file(path):
    with open(path, "wb") as f:
        f.write(packed((1, 0, 5, 6)) + b"\x00" * 10)
    idx = TransactionIndex(path)
    with pytest.raises(CorruptIndexError) as e:
        idx.sanity_check()
    assert path in str(e.value) and "44" in str(e.value)
    assert idx.all() == [AbortedTxn(1, 0, 5, 6)]  # readers see the whole entries
    with pytest.raises(CorruptIndexError, match="not a multiple"):
        idx.append(AbortedTxn(1, 7, 8, 9))  # never appends after a torn entry


def test_unknown_version_is_corrupt(path):
    # Kafka reads the version from the entry's first byte (AbortedTxn.version()): 0x0100 is 1
    with open(path, "wb") as f:
        f.write(struct.pack(ENTRY, 0x0100, 1, 0, 5, 6))
    idx = TransactionIndex(path)
    with pytest.raises(CorruptIndexError, match="version 1"):
        idx.sanity_check()
    with pytest.raises(CorruptIndexError, match=path):
        idx.all()


def test_rename_follows_the_file(tmp_path, path):  # Kafka: testRenameIndex
    idx = TransactionIndex(path)
    idx.append(AbortedTxn(0, 0, 10, 11))
    renamed = str(tmp_path / "00000000000000000000.txnindex.swap")
    idx.rename(renamed)
    assert not os.path.exists(path) and os.path.exists(renamed)
    idx.append(AbortedTxn(1, 5, 15, 16))
    assert TransactionIndex(renamed).all() == [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 16)]
    lazy = TransactionIndex(str(tmp_path / "x.txnindex"))
    lazy.rename(str(tmp_path / "y.txnindex"))  # renaming creates nothing
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000000.txnindex.swap"]
    lazy.append(AbortedTxn(0, 1, 2, 3))
    assert os.path.exists(tmp_path / "y.txnindex")


def test_delete_and_close(path):
    idx = TransactionIndex(path)
    assert idx.delete() is False
    idx.append(AbortedTxn(0, 0, 10, 11))
    idx.close()
    idx.close()  # twice is fine
    assert idx.all() == [AbortedTxn(0, 0, 10, 11)]  # read without the descriptor
    idx.append(AbortedTxn(0, 11, 12, 13))  # reopens for the append
    assert idx.delete() is True
    assert not os.path.exists(path) and idx.all() == [] and idx.last_offset is None
    idx.append(AbortedTxn(0, 0, 1, 2))
    assert idx.all() == [AbortedTxn(0, 0, 1, 2)]


def test_read_only_index_never_writes(path):
    TransactionIndex(path).append(AbortedTxn(3, 0, 1, 2))
    ro = TransactionIndex(path, writable=False)
    assert ro.all() == [AbortedTxn(3, 0, 1, 2)]
    for call in (lambda: ro.append(AbortedTxn(3, 4, 5, 6)), lambda: ro.truncate_to(0),
                 ro.reset):
        with pytest.raises(PermissionError):
            call()
    assert os.path.getsize(path) == 34


def test_search_reports_completeness_like_kafka(path):  # Kafka: testCollectAbortedTransactions
    txns = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25),
            AbortedTxn(3, 32, 50, 40)]
    idx = TransactionIndex(path)
    for t in txns:
        idx.append(t)
    assert idx.search(0, 100) == (txns, False)
    assert idx.search(0, 32) == (txns[:3], True)
    assert idx.search(0, 35) == (txns, True)
    assert idx.search(10, 35) == (txns, True)
    assert idx.search(11, 35) == (txns[1:4], True)
    assert idx.search(20, 41) == (txns[2:4], False)
