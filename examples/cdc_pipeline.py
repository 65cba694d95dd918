"""segstore CDC demo: a change stream of user addresses, compacted into a table, read back.

1. Spark generates change events (user id -> new address; some are deletions, written as
   tombstones: a null value) and writes them into a compacted segstore topic, exactly once.
2. Spark runs segstore's log cleaner over the topic (one task per partition), which keeps the
   latest record per key, like Kafka's log compaction.
3. Spark reads the compacted topic back (Kafka's source schema) and checks it: one record per
   user, the latest address or the deletion's tombstone, as computed from the events.
4. The same topic is read vectorized into numpy columns and must give the same table.

Run it with ``make demo`` or ``python examples/cdc_pipeline.py [events] [users]``; it needs
pyspark and Java 17 and takes a few minutes on two cores.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import numpy as np

import segstore
import segstore.spark

TOPIC = "user-addresses"
PARTITIONS = 4
EVENTS = 1_000_000
USERS = 100_000


def step(n: int, text: str) -> float:
    print(f"\n[{n}/6] {text}", flush=True)
    return time.perf_counter()


def done(t0: float, what: str = "") -> float:
    elapsed = time.perf_counter() - t0
    print(f"      done in {elapsed:.1f} s{(' - ' + what) if what else ''}", flush=True)
    return elapsed


def topic_size(root: str) -> tuple:
    """(bytes, segments, records) of the topic, summed over its partitions."""
    with segstore.open(root, readonly=True) as store:
        info = store.describe_topic(TOPIC)["partition_info"]
        records = sum(len(store.partition(TOPIC, p["partition"]).read_columns())
                      for p in info)
    return (sum(p["size_bytes"] for p in info), sum(p["segments"] for p in info), records)


def start_spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("segstore-cdc-demo")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    # An installed segstore is found by format("segstore") on its own; an editable install only
    # from the repository root, so register explicitly to run from anywhere.
    segstore.spark.register(spark)
    return spark


def change_events(spark, events: int, users: int):
    """``seq, user, key, value``: each event moves a user to a new address; every 23rd event
    (after the first round of users) deletes the user instead (value null: a tombstone)."""
    from pyspark.sql import functions as F

    seq = F.col("id")
    user = F.expr(f"(id * 7919 + id div 13) % {users}")
    deleted = (seq % 23 == 0) & (seq >= users)
    street = F.element_at(F.array(*[F.lit(s) for s in (
        "Elm", "Oak", "Main", "Maple", "Cedar", "Pine", "Lake")]), (seq % 7 + 1).cast("int"))
    address = F.format_string("%d %s Street, Springfield %05d", seq % 997 + 1, street,
                              seq % 99991)
    return spark.range(events).select(
        seq.alias("seq"), user.alias("user"),
        F.format_string("user-%07d", user).alias("key"),
        F.when(deleted, F.lit(None)).otherwise(address).alias("value"))


def latest_table_numpy(root: str) -> dict:
    """The compacted topic as {key: address}, decoded into numpy columns, no Spark."""
    table = {}
    total = 0
    with segstore.open(root, readonly=True) as store:
        for p in store.partitions_for(TOPIC):
            cols = store.partition(TOPIC, p).read_columns()
            total += len(cols)
            width = int(cols.keys.lengths[0]) if len(cols) else 0
            if not len(cols):
                continue
            # Keys are fixed width: one row per record, so numpy can find each key's last record.
            keys = cols.keys.data[cols.keys.offsets[0]:cols.keys.offsets[-1]].reshape(-1, width)
            as_void = np.ascontiguousarray(keys).view(np.dtype((np.void, width))).ravel()
            rev = as_void[::-1]
            _, first_in_rev = np.unique(rev, return_index=True)
            last = len(as_void) - 1 - first_in_rev
            live = last[cols.values.valid[last]]
            values = cols.values
            for i in live.tolist():
                table[keys[i].tobytes().decode()] = values[i].decode()
    return {"table": table, "records": total}


def main() -> int:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else EVENTS
    users = int(sys.argv[2]) if len(sys.argv) > 2 else USERS
    root = os.path.join(tempfile.gettempdir(), "segstore-cdc-demo")
    shutil.rmtree(root, ignore_errors=True)
    timings = {}

    t = step(1, f"starting Spark and creating the compacted topic {TOPIC!r} in {root}")
    spark = start_spark()
    with segstore.open(root) as store:
        store.create_topic(TOPIC, PARTITIONS, config={
            "cleanup.policy": "compact", "segment.bytes": 4 << 20,
            "min.cleanable.dirty.ratio": 0.5})
    timings["spark start"] = done(t)

    t = step(2, f"generating {events:,} address changes for {users:,} users and writing them")
    from pyspark.sql import Window, functions as F

    changes = change_events(spark, events, users)
    # All changes of one user go through one Spark task in order, as a CDC feed delivers them;
    # the sink then routes each key to its partition with Kafka's murmur2 partitioner.
    (changes.repartition(PARTITIONS, "key").sortWithinPartitions("seq").select("key", "value")
     .write.format("segstore").mode("append").option("topic", TOPIC).save(root))
    timings["write"] = done(t, f"{events / (time.perf_counter() - t):,.0f} records/s, "
                               "committed exactly once")
    with segstore.open(root) as store:
        for p in store.partitions_for(TOPIC):
            store.partition(TOPIC, p).roll()  # the active segment is never cleaned: seal it
    before = topic_size(root)
    print(f"      topic before compaction: {before[0] / 1e6:,.1f} MB in {before[1]} segments, "
          f"{before[2]:,} records")

    t = step(3, "compacting with Spark: one cleaner task per partition")
    stats = segstore.spark.compact(spark, root, topics=TOPIC).orderBy("partition").collect()
    timings["compact"] = done(t)
    after = topic_size(root)
    for r in stats:
        print(f"      {r.topic}-{r.partition}: read {r.messages_read:,} messages "
              f"({r.bytes_read / 1e6:,.1f} MB), wrote {r.messages_written:,} "
              f"({r.bytes_written / 1e6:,.1f} MB) in {r.elapsed_secs:.2f} s, buffer "
              f"utilization {100 * r.buffer_utilization:.1f}%")
    if stats:
        read_mb = sum(r.bytes_read for r in stats) / 1e6
        secs = sum(r.elapsed_secs for r in stats)
        print(f"      cleaner summary: {len(stats)} rounds, {read_mb:,.1f} MB processed in "
              f"{secs:.2f} s of cleaning ({read_mb / secs if secs else 0:,.1f} MB/s), "
              f"{sum(r.messages_read for r in stats):,} messages -> "
              f"{sum(r.messages_written for r in stats):,}")
    print(f"      topic after compaction: {after[0] / 1e6:,.1f} MB in {after[1]} segments, "
          f"{after[2]:,} records ({100 * (1 - after[0] / before[0]):.1f}% smaller)")

    t = step(4, "reading the compacted topic back with Spark and checking the table")
    # The rows as the log holds them, not deduplicated here: the cleaner must have left exactly
    # one record per user (the latest address, or the tombstone of a deletion, which stays for
    # delete.retention.ms), and the reader must return each of them once.
    log_df = (spark.read.format("segstore").option("subscribe", TOPIC).load(root)
              .select(F.col("key").cast("string").alias("key"),
                      F.col("value").cast("string").alias("value")))
    latest = Window.partitionBy("user").orderBy(F.col("seq").desc())
    expected = (change_events(spark, events, users)
                .withColumn("rn", F.row_number().over(latest)).where("rn = 1")
                .select("key", "value"))
    missing = expected.exceptAll(log_df).count()
    extra = log_df.exceptAll(expected).count()
    rows = log_df.count()
    actual = {r.key: r.value for r in log_df.where("value IS NOT NULL").collect()}
    live = len(actual)
    timings["spark read + check"] = done(t, f"{rows:,} rows, {live:,} live users")
    if missing or extra or rows != after[2]:
        print(f"      MISMATCH: {missing} expected rows missing, {extra} unexpected rows (a "
              f"key left twice, or a stale value), {rows:,} rows read of {after[2]:,} records")
        return 1
    print("      the compacted topic holds exactly one record per user, and its table equals "
          f"the latest address of every user ({rows - live:,} users deleted)")

    t = step(5, "reading the same topic vectorized into numpy columns")
    got = latest_table_numpy(root)
    elapsed = done(t, f"{got['records']:,} records decoded")
    timings["numpy read + check"] = elapsed
    if got["records"] != rows or got["table"] != actual:
        print("      MISMATCH between the numpy table and Spark's")
        return 1
    print(f"      numpy agrees: {len(got['table']):,} live users")

    step(6, "summary")
    for name, secs in timings.items():
        print(f"      {name:<20} {secs:7.1f} s")
    print(f"      size: {before[0] / 1e6:,.1f} MB -> {after[0] / 1e6:,.1f} MB, records: "
          f"{before[2]:,} -> {after[2]:,}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
