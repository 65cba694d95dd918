"""segstore: Apache Kafka's partition-log storage engine, embeddable, with a Cython core."""

from . import buffer_pool, errors
from .log import AppendInfo, PartitionLog
from .store import LogStore, open
from .columns import BinaryColumn, HeaderColumn, RecordColumns
from .records import (BatchInfo, CompressionType, ConsumerRecord, ControlRecordType,
                      OffsetAndTimestamp, RecordMetadata, TimestampType, TopicPartition)

__version__ = "0.1.0"
__all__ = [
    "buffer_pool", "errors", "open", "LogStore", "PartitionLog", "AppendInfo", "BinaryColumn", "HeaderColumn", "RecordColumns", "BatchInfo", "CompressionType",
    "ConsumerRecord", "ControlRecordType", "OffsetAndTimestamp", "RecordMetadata",
    "TimestampType", "TopicPartition",
]
