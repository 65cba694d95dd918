"""Record-level value types, named as Kafka's Python clients name them (kafka-python)."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple, Optional


class TimestampType(IntEnum):
    """Attribute bit 3 of a v2 batch (``NO_TIMESTAMP_TYPE`` is -1 for magic 0 data)."""

    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class CompressionType(IntEnum):
    """Codec ids of attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class ControlRecordType(IntEnum):
    """Type field of a control record's key (REF §1.8); unknown types read as UNKNOWN."""

    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

# ListOffsets special timestamps (REF §3.7).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
# Tiered storage's earliest local offset; with no tiered storage it is the log start offset.
EARLIEST_LOCAL_TIMESTAMP = -4


class TopicPartition(NamedTuple):
    """A topic name and partition number (kafka-python's ``TopicPartition``)."""

    topic: str
    partition: int


class OffsetAndTimestamp(NamedTuple):
    """Result of an offsets-for-times lookup (kafka-python's ``OffsetAndTimestamp``)."""

    offset: int
    timestamp: int
    leader_epoch: Optional[int] = None


class ConsumerRecord(NamedTuple):
    """One record as read from the log, with kafka-python's field names and order.

    ``checksum`` is None for v2 batches (the CRC covers the batch, not the record) and the
    legacy message CRC for v0/v1 data. ``serialized_*_size`` are -1 for a null key, value or
    empty header list, as kafka-python reports them.

    ``headers`` is a tuple of ``(str, bytes | None)`` pairs, ``()`` when there are none (where
    kafka-python gives a list): a record is immutable all the way down, so decoding a million of
    them neither allocates a list per record nor gives the garbage collector work.
    """

    topic: Optional[str]
    partition: Optional[int]
    leader_epoch: Optional[int]
    offset: int
    timestamp: int
    timestamp_type: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: tuple
    checksum: Optional[int]
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


class RecordMetadata(NamedTuple):
    """Where an appended record landed (kafka-python's ``RecordMetadata`` plus log_start_offset)."""

    topic: Optional[str]
    partition: Optional[int]
    topic_partition: Optional[TopicPartition]
    offset: int
    timestamp: int
    checksum: Optional[int]
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int
    log_start_offset: int = 0


class BatchInfo(NamedTuple):
    """The header of one batch as found by the scanner (no records decoded).

    ``position`` and ``size`` are in bytes from the start of the scanned buffer and include the
    12-byte log overhead. For v0/v1 data ``base_offset`` equals ``last_offset`` unless the batch
    is a compressed wrapper, whose first offset is unknown without decompressing (-1).
    """

    position: int
    size: int
    base_offset: int
    last_offset: int
    magic: int
    attributes: int
    crc: int
    partition_leader_epoch: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        """Codec id (attribute bits 0-2)."""
        return self.attributes & 0x07

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime (-1 for magic 0)."""
        if self.magic == 0:
            return -1
        return (self.attributes >> 3) & 1

    @property
    def is_transactional(self) -> bool:
        """Attribute bit 4."""
        return self.magic >= 2 and bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        """Attribute bit 5: the batch holds control records (transaction markers)."""
        return self.magic >= 2 and bool(self.attributes & 0x20)

    @property
    def has_delete_horizon(self) -> bool:
        """Attribute bit 6 (KIP-534): ``base_timestamp`` holds the delete horizon."""
        return self.magic >= 2 and bool(self.attributes & 0x40)

    @property
    def delete_horizon_ms(self) -> int:
        """The delete horizon, or -1 when the batch carries none."""
        return self.base_timestamp if self.has_delete_horizon else NO_TIMESTAMP

    @property
    def next_offset(self) -> int:
        """``last_offset + 1``."""
        return self.last_offset + 1
