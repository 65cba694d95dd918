"""Spark over a Kafka broker's log dir that holds only some of a topic's partitions (a broker
hosts 0 and 2 of three): reads see exactly those, assign of another names what is there, and a
streaming query plans only those, never adding a directory to the broker's log dir."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import segstore


@pytest.fixture(scope="module")
def broker_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("broker") / "kafka-logs")
    with segstore.open(root) as store:
        store.create_topic("orders", 3)
        for p in range(3):
            store.partition("orders", p).append_batch([b"o%d-%d" % (p, i) for i in range(4)])
    shutil.rmtree(os.path.join(root, ".segstore"))  # a broker's dir has no segstore metadata
    shutil.rmtree(os.path.join(root, "orders-1"))   # another broker hosts partition 1
    for p in (0, 2):                                # nor segstore's partition markers
        os.remove(os.path.join(root, f"orders-{p}", "segstore.topic"))
    return root


def test_batch_read_sees_the_hosted_partitions(spark, broker_dir):
    rows = (spark.read.format("segstore").option("subscribe", "orders").load(broker_dir)
            .select("partition", "offset", "value").collect())
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in rows) == \
        [(p, i, b"o%d-%d" % (p, i)) for p in (0, 2) for i in range(4)]
    assert not os.path.exists(os.path.join(broker_dir, "orders-1"))


def test_assign_of_a_partition_the_broker_does_not_host(spark, broker_dir):
    df = (spark.read.format("segstore").option("assign", json.dumps({"orders": [1]}))
          .load(broker_dir))
    with pytest.raises(Exception, match=r"partitions \[1\] of topic 'orders', which has only"):
        df.collect()


def test_a_stream_plans_only_the_hosted_partitions(spark, broker_dir, tmp_path):
    q = (spark.readStream.format("segstore").option("subscribe", "orders")
         .option("startingOffsets", "earliest").load(broker_dir)
         .selectExpr("partition", "offset").writeStream.format("memory")
         .queryName("broker_dir_stream").trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    q.awaitTermination(120)
    rows = spark.sql("select partition, offset from broker_dir_stream").collect()
    assert sorted((r.partition, r.offset) for r in rows) == \
        [(p, i) for p in (0, 2) for i in range(4)]
    assert not os.path.exists(os.path.join(broker_dir, "orders-1"))


def test_a_write_sends_keyless_rows_to_hosted_partitions_only(spark, broker_dir, tmp_path):
    target = str(tmp_path / "kafka-logs")
    shutil.copytree(broker_dir, target)
    df = spark.createDataFrame([(b"w%d" % i,) for i in range(40)], "value binary").repartition(4)
    df.write.format("segstore").mode("append").option("topic", "orders").save(target)
    with segstore.open(target, readonly=True) as store:
        assert store.partitions_for("orders") == [0, 2]
        added = sum(store.partition("orders", p).log_end_offset - 4 for p in (0, 2))
    assert added == 40
    assert not os.path.exists(os.path.join(target, "orders-1"))
    keyed = spark.createDataFrame([(b"k%d" % i, b"v") for i in range(40)], "key binary, value binary")
    with pytest.raises(Exception, match="holds only the partitions it hosts"):
        keyed.write.format("segstore").mode("append").option("topic", "orders").save(target)
