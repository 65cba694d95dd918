"""Fifteenth session's smaller fixes, each with the behaviour it pins down."""

from __future__ import annotations

import logging
import os

import segstore
from conftest import FakeClock


def test_a_garbage_checkpoint_warning_says_what_ignoring_it_costs(tmp_path, caplog):
    """Ignoring a garbage recovery-point checkpoint means recovering every log from its start;
    ignoring a garbage log-start-offset checkpoint means each log starts at its first segment
    (the warning said "recovering from the start" for both)."""
    root = str(tmp_path / "s")
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        store.create_topic("t")
        lg = store.partition("t", 0)
        lg.append_batch([b"v%d" % i for i in range(10)])
        lg.delete_records(4)
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        with open(os.path.join(root, name), "w") as f:
            f.write("garbage\n")
    os.remove(os.path.join(root, ".kafka_cleanshutdown"))  # so the recovery point matters
    with caplog.at_level(logging.WARNING, logger="segstore.store"):
        with segstore.open(root, clock=FakeClock(1_000)) as store:
            lg = store.partition("t", 0)
            assert lg.log_start_offset == 0  # the DeleteRecords is forgotten with the file
            assert lg.log_end_offset == 10
    msgs = [r.getMessage() for r in caplog.records]
    rp = [m for m in msgs if "recovery-point-offset-checkpoint" in m]
    ls = [m for m in msgs if "log-start-offset-checkpoint" in m]
    assert rp and rp[0].endswith("(recovering every log from its start instead)"), msgs
    assert ls and ls[0].endswith("(each log starts at its first segment instead)"), msgs


def _broker_log_dir(root: str) -> None:
    """A Kafka broker's log dir holding partitions 0 and 2 of ``orders`` (not 1, which another
    broker hosts) and no segstore metadata."""
    import shutil
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        store.create_topic("orders", 3)
        for p in range(3):
            store.partition("orders", p).append_batch([b"o%d-%d" % (p, i) for i in range(5)],
                                                      keys=[b"k%d" % i for i in range(5)])
    shutil.rmtree(os.path.join(root, ".segstore"))
    shutil.rmtree(os.path.join(root, "orders-1"))
    for p in (0, 2):  # nor segstore's partition markers
        os.remove(os.path.join(root, f"orders-{p}", "segstore.topic"))


def test_a_broker_log_dir_opens_only_the_partitions_it_hosts(tmp_path):
    """A store over a Kafka broker's log dir opens the partitions there and never adds a
    directory for one it does not host (an open, a config change, retention, compaction and
    close made ``orders-1/`` in the broker's directory)."""
    import pytest
    from segstore.errors import UnknownTopicOrPartitionError
    root = str(tmp_path / "kafka-logs")
    _broker_log_dir(root)
    for readonly in (True, False, True):
        with segstore.open(root, clock=FakeClock(1_000), readonly=readonly) as store:
            assert store.list_topics() == ["orders"]
            assert store.partitions_for("orders") == [0, 2]
            assert store.num_partitions("orders") == 3
            for p in (0, 2):
                assert [r.value for r in store.partition("orders", p).read(0)] == \
                    [b"o%d-%d" % (p, i) for i in range(5)]
            with pytest.raises(UnknownTopicOrPartitionError, match=r"orders-1 .*\[0, 2\]"):
                store.partition("orders", 1)
            info = store.describe_topic("orders")
            assert [x["partition"] for x in info["partition_info"]] == [0, 2]
            if not readonly:
                store.alter_topic_config("orders", {"cleanup.policy": "compact,delete"})
                store.enforce_retention(now_ms=10_000_000)
                store.compact("orders", force=True)
                with pytest.raises(UnknownTopicOrPartitionError):
                    store.compact("orders", partition=1)
        assert not os.path.exists(os.path.join(root, "orders-1"))
    # the config change persisted, and with it which partitions the directory holds
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        assert store.topic_config("orders").cleanup_policy == ("compact", "delete")
        assert store.partitions_for("orders") == [0, 2]
    assert not os.path.exists(os.path.join(root, "orders-1"))


def test_a_metadata_files_hosted_list_is_checked(tmp_path):
    import json
    import pytest
    from segstore.errors import CorruptMetadataError
    root = str(tmp_path / "s")
    with segstore.open(root) as store:
        store.create_topic("t", 2)
    path = os.path.join(root, ".segstore", "topics", "t.json")
    meta = json.load(open(path))
    for bad in ([], [0, 0], [2], [True], "0", [-1]):
        with open(path, "w") as f:
            json.dump({**meta, "hosted": bad}, f)
        with pytest.raises(CorruptMetadataError, match="'hosted'"):
            segstore.open(root)


def test_a_decode_stops_at_the_records_it_wants(tmp_path):
    """decode_records parses a batch's records only as far as the last one it returns, as a
    consumer that stops iterating does (a one-record read of a 1,000-record batch parsed all
    1,000); what it never reaches it never checks, and a decode that reaches it raises."""
    import struct
    import pytest
    from conftest import fix_crc
    from segstore import _core
    from segstore.errors import CorruptRecordError
    batch = bytearray(_core.encode_batch([b"a", b"b", b"c"], keys=[b"1", b"2", b"3"],
                                         timestamps_ms=[5, 6, 7]))
    batch += b"\x00\x07"  # bytes after the last record: a CRC-valid batch that is malformed
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    fix_crc(batch)
    data = bytes(batch)
    assert [r.value for r in _core.decode_records(data, max_records=2)] == [b"a", b"b"]
    assert [r.value for r in _core.decode_records(data, end_offset=1)] == [b"a"]
    for wanting_the_end in ({}, {"max_records": 3}, {"min_offset": 2}):
        with pytest.raises(CorruptRecordError, match="position 0"):
            _core.decode_records(data, **wanting_the_end)
    # The column decoders size their arrays by counting whole batches first, so they check
    # every batch they reach in full.
    with pytest.raises(CorruptRecordError, match="position 0"):
        _core.decode_columns(data, max_records=2)


def test_a_read_never_trusts_an_index_entry_that_misses_its_batch(tmp_path, caplog):
    """translate_offset starts at the offset index's floor entry only when the batch there
    holds the entry's offset; an entry pointing inside a batch is ignored (with a warning
    naming the file) and the read still returns the right records."""
    import struct
    from segstore.config import TopicConfig
    from segstore.log import PartitionLog
    path = str(tmp_path / "t-0")
    cfg = TopicConfig.from_dict({"index.interval.bytes": 1})  # an entry per batch
    lg = PartitionLog(path, "t", 0, cfg, FakeClock(1_000))
    for i in range(6):
        lg.append_batch([b"v%d-%d" % (i, j) for j in range(3)])
    lg.roll()  # a sealed segment: its index is trusted after a clean shutdown
    lg.append_batch([b"after"])
    lg.close()
    index = os.path.join(path, "00000000000000000000.index")
    data = bytearray(open(index, "rb").read())
        # Entries name a batch's last offset: (5, p) for the second batch, the floor of offset 7.
    rel, pos = struct.unpack_from(">ii", data, 0)
    assert rel == 5
    struct.pack_into(">ii", data, 0, rel, pos + 7)  # now it points inside that batch
    open(index, "wb").write(bytes(data))
    lg = PartitionLog(path, "t", 0, cfg, FakeClock(1_000), recovery_point=19,
                      had_clean_shutdown=True)
    with caplog.at_level(logging.WARNING, logger="segstore.segment"):
        got = [r.value for r in lg.read(7, max_records=3)]
    assert got == [b"v2-1", b"v2-2", b"v3-0"]
    assert any("ignoring the offset index" in r.getMessage() and index.replace(".index", ".log")
               in r.getMessage() for r in caplog.records), caplog.records
    lg.close()


def test_keyless_appends_to_a_broker_log_dir_go_to_hosted_partitions(tmp_path):
    """Kafka's partitioner spreads keyless records over the available partitions: in a broker's
    log dir that holds 0 and 2, never 1 (one append in three failed)."""
    root = str(tmp_path / "kafka-logs")
    _broker_log_dir(root)
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        got = {store.append("orders", b"v").partition for _ in range(12)}
        assert got == {0, 2}


def test_a_partition_the_broker_takes_on_later_is_opened(tmp_path):
    """Once a config change wrote the hosted list [0, 2], a directory orders-1 that appears
    later (the broker took the partition over) is opened, and recorded at the next change."""
    import json
    import shutil
    root = str(tmp_path / "kafka-logs")
    _broker_log_dir(root)
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        store.alter_topic_config("orders", {"retention.ms": 86_400_000})
    other = str(tmp_path / "other")
    with segstore.open(other, clock=FakeClock(1_000)) as store:
        store.create_topic("orders", 3)
        store.partition("orders", 1).append_batch([b"x1", b"x2"])
    shutil.copytree(os.path.join(other, "orders-1"), os.path.join(root, "orders-1"))
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        assert store.partitions_for("orders") == [0, 1, 2]
        assert [r.value for r in store.partition("orders", 1).read(0)] == [b"x1", b"x2"]
        store.alter_topic_config("orders", {"retention.ms": 3_600_000})
    meta = json.load(open(os.path.join(root, ".segstore", "topics", "orders.json")))
    assert "hosted" not in meta  # every partition is here now


def test_a_garbage_recovery_point_after_a_clean_shutdown_recovers_nothing(tmp_path, caplog):
    root = str(tmp_path / "s")
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        store.create_topic("t")
        store.partition("t", 0).append_batch([b"a", b"b"])
    with open(os.path.join(root, "recovery-point-offset-checkpoint"), "w") as f:
        f.write("garbage\n")
    with caplog.at_level(logging.WARNING, logger="segstore.store"):
        with segstore.open(root, clock=FakeClock(1_000)) as store:
            assert store.partition("t", 0).log_end_offset == 2
    msgs = [r.getMessage() for r in caplog.records if "recovery-point" in r.getMessage()]
    assert msgs and msgs[0].endswith("(the last shutdown was clean: nothing is recovered)")


def test_roll_with_an_empty_active_segment_still_flushes_below_it(tmp_path):
    """Kafka's roll flushes everything below the new base, also when the active segment is
    empty and is kept; segstore's did nothing, leaving the recovery point behind."""
    from segstore.config import TopicConfig
    from segstore.log import PartitionLog
    path = str(tmp_path / "t-0")
    lg = PartitionLog(path, "t", 0, TopicConfig.from_dict({}), FakeClock(1_000))
    lg.append_batch([b"v%d" % i for i in range(10)])
    lg.roll()
    lg.close()
    # An unclean open recovers the segments above the recovery point without moving it.
    lg = PartitionLog(path, "t", 0, TopicConfig.from_dict({}), FakeClock(1_000),
                      recovery_point=4, had_clean_shutdown=False)
    assert lg.active_segment.size == 0 and lg.recovery_point < 10
    active = lg.active_segment
    assert lg.roll() is active  # the empty active segment is kept
    assert lg.recovery_point == 10
    lg.close()
