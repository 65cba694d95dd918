"""segstore quick start: append a few thousand records, read them back three ways.

Run with `make demo` (it sets up .venv first).
"""

import os
import shutil
import tempfile
import time

import numpy as np

import segstore
from segstore import BinaryColumn, TopicPartition


def main() -> None:
    root = os.path.join(tempfile.gettempdir(), "segstore-quickstart")
    shutil.rmtree(root, ignore_errors=True)
    with segstore.open(root) as store:
        store.create_topic("users", num_partitions=2,
                           config={"cleanup.policy": "compact", "segment.bytes": 256 << 10})

        # One record at a time, partitioned by key like Kafka's producer (murmur2).
        for i in range(2000):
            store.append("users", f"address-{i}".encode(), key=f"user-{i % 300}".encode(),
                         headers=[("source", b"quickstart")])

        # A batch from Python lists, then 5,000 records from numpy columns in one compiled pass.
        log = store.partition("users", 0)
        log.append_batch([b"bulk-%d" % i for i in range(1000)],
                         keys=[b"user-%d" % i for i in range(1000)])
        n = 5000
        values = BinaryColumn.from_fixed(np.random.default_rng(7).integers(
            0, 256, size=(n, 100), dtype=np.uint8))
        keys = BinaryColumn.from_pylist([b"user-%d" % (i % 300) for i in range(n)])
        t0 = time.perf_counter()
        log.append_columns(values, keys)
        t1 = time.perf_counter()

        tps = [TopicPartition("users", p) for p in store.partitions_for("users")]
        print("end offsets:", {f"{tp.topic}-{tp.partition}": off
                               for tp, off in store.end_offsets(tps).items()})
        print(f"partition 0 has {len(log.segments)} segments, {log.size_bytes} bytes; "
              f"append_columns of {n} records took {(t1 - t0) * 1000:.1f} ms")

        print("first records of partition 0:")
        for r in log.read(0, max_records=5):
            print(f"  offset={r.offset} key={r.key!r} value={r.value!r} headers={r.headers}")

        cols = log.read_columns()
        print(f"read_columns: {len(cols)} records, offsets {cols.offsets[0]}..{cols.offsets[-1]}, "
              f"{cols.values.data.nbytes} value bytes in one numpy array")
        assert (np.diff(cols.offsets) == 1).all()

        last = next(iter(log.iter_records(log.log_end_offset - 1)))
        print(f"last record: offset={last.offset} key={last.key!r} value[:8]={last.value[:8]!r}")
        ts = store.offsets_for_times({tps[1]: 0})
        print("first offset at or after timestamp 0 in users-1:", ts[tps[1]])
    print("store closed cleanly; files are Kafka's:", sorted(os.listdir(os.path.join(root, "users-0")))[:3])


if __name__ == "__main__":
    main()
