"""Keyless records in a compacted log, for tests of how the cleaner treats them.

A compacted topic refuses records without a key (Kafka's LogValidator), so the tests write them
the way Kafka's own cleaner tests do, as a follower would: encoded, then appended without the
key check (``append_records(origin="replication")``).
"""

from segstore import _core


def append_batch_unvalidated(lg, values, keys=None, headers=None, timestamps_ms=None, *,
                             compression=None, **producer):
    """``lg.append_batch`` without the compacted topic's key check."""
    data = _core.encode_batch(values, keys, headers,
                              lg.clock() if timestamps_ms is None else timestamps_ms,
                              compression=compression or 0, partition_leader_epoch=0,
                              **producer)
    return lg.append_records(data, origin="replication")


def append_unvalidated(lg, value, key=None, headers=None, timestamp_ms=None):
    """``lg.append`` without the compacted topic's key check."""
    return append_batch_unvalidated(lg, [value], None if key is None else [key],
                                    None if headers is None else [headers],
                                    None if timestamp_ms is None else [timestamp_ms])
