"""The segstore error hierarchy.

Every error segstore raises on purpose is a :class:`SegstoreError`. Errors about bad arguments also
derive from :class:`ValueError` (or :class:`TypeError`), so generic handlers keep working.
"""

from __future__ import annotations

import numbers


class SegstoreError(Exception):
    """Base class of every segstore error."""


class CorruptRecordError(SegstoreError):
    """Bytes that are not a valid record batch (bad size, CRC, varint, layout, codec).

    ``file`` and ``position`` name where the bad batch starts, when known.
    """

    def __init__(self, message: str, *, file: str | None = None, position: int | None = None):
        self.reason = message
        self.file = file
        self.position = position
        where = []
        if file is not None:
            where.append(f"file {file}")
        if position is not None:
            where.append(f"position {position}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class CorruptIndexError(SegstoreError):
    """An index file that fails its sanity check."""


class SegmentChangedError(SegstoreError):
    """A segment was truncated, deleted or closed while a read was using it (``file`` names
    it). Reads then retry on the log's new state, so this reaches a caller only when that keeps
    happening, or from lower-level calls on a :class:`~segstore.segment.LogSegment`."""

    def __init__(self, message: str, *, file: str | None = None):
        self.file = file
        super().__init__(message)


class InvalidRecordError(SegstoreError, ValueError):
    """A record the caller asked to write is not valid (wrong type, bad header, ...)."""


class RecordTooLargeError(SegstoreError, ValueError):
    """A batch larger than ``max.message.bytes`` (or ``segment.bytes``)."""


class UnsupportedCompressionError(SegstoreError, ValueError):
    """An unknown compression codec name or id."""


class InvalidConfigError(SegstoreError, ValueError):
    """An unknown, unsupported or out-of-range configuration key or value."""


class OffsetOutOfRangeError(SegstoreError, ValueError):
    """An offset below the log start offset or above the log end offset."""


class InvalidOffsetError(SegstoreError, ValueError):
    """An offset that cannot be used here (negative, not increasing, overflowing a segment)."""


class OffsetTypeError(InvalidOffsetError, TypeError):
    """An offset (or offset-like argument) that is not an int: a TypeError too."""


class InvalidArgumentError(SegstoreError, ValueError):
    """A count, limit or byte range outside what it may be (a negative ``max_records``, a
    ``start``/``end`` outside the buffer given to the codec)."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (None or another object where the compiled core needs
    an OffsetMap, say): a TypeError too."""


class BufferTypeError(ArgumentTypeError):
    """A buffer argument that is not a one-dimensional, contiguous buffer of bytes (bytes,
    bytearray, mmap, memoryview, a uint8 array): a TypeError too."""


class InvalidTopicError(SegstoreError, ValueError):
    """A topic name Kafka would reject."""


class UnknownTopicOrPartitionError(SegstoreError, KeyError):
    """A topic or partition that does not exist in the store."""


class TopicAlreadyExistsError(SegstoreError, ValueError):
    """Creating a topic that already exists."""


class StoreLockedError(SegstoreError):
    """Another process holds the store's writer lock."""


class CorruptMetadataError(SegstoreError):
    """A store's own metadata file (``.segstore/topics/<topic>.json``) cannot be read; the
    message names the file and what is wrong with it.

    ``file`` is the file, ``reason`` what is wrong with it and ``topic`` the topic it
    describes (from the file's name), when known. A writable open refuses such a store; a
    read-only one sets the topic aside and raises this error when it is used.
    """

    def __init__(self, message: str, *, file: str | None = None, reason: str | None = None,
                 topic: str | None = None):
        self.file = file
        self.reason = reason
        self.topic = topic
        super().__init__(message)


class InvalidTopicMetadataConfigError(CorruptMetadataError, InvalidConfigError):
    """A topic metadata file whose config overrides this store rejects (an unknown key, a
    value out of range): a CorruptMetadataError, and an InvalidConfigError as it was before
    damaged topics were set aside."""


class StoreClosedError(SegstoreError):
    """An operation on a closed store or log."""


class ReadOnlyStoreError(SegstoreError):
    """A mutation on a store opened with ``readonly=True``."""


class KafkaStorageError(SegstoreError, OSError):
    """A partition log is offline after an I/O error (ENOSPC, EIO, a failed fsync) in the
    middle of a write: Kafka's KafkaStorageException. The log refuses every later write
    until the store is reopened, which recovers it from what is on disk; reads go on serving
    what was appended before the failure. ``errno`` is the failed call's, and ``__cause__``
    the OSError itself."""


class CleaningAbortedError(SegstoreError):
    """A cleaning round was aborted (truncation, topic deletion, shutdown); nothing was swapped."""


def is_int(value) -> bool:
    """An int, numpy's included, but not a bool (which Python counts as one)."""
    if type(value) is int:  # the usual case, without the ABC's isinstance machinery
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def offset_argument(value, what: str = "offset") -> int:
    """``value`` as an int offset, or OffsetTypeError naming ``what``: a float, bool or string
    offset would be stored as given (and a float one written to a checkpoint file that a
    reopen then ignores)."""
    if not is_int(value):
        raise OffsetTypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def is_time_ms(value) -> bool:
    """Milliseconds since the epoch as the time rules take them: an int from 0 to 2**63 - 1."""
    return is_int(value) and 0 <= value < 1 << 63


def now_argument(now_ms, clock) -> int:
    """A time rule's "now": ``now_ms`` (milliseconds since the epoch, an int from 0 to
    2**63 - 1) or, when it is None, ``clock()``. InvalidArgumentError otherwise: a float would
    be compared and printed as given, and a bool is not a time."""
    if now_ms is None:
        return clock()
    if not is_time_ms(now_ms):
        raise InvalidArgumentError(f"now_ms must be an int from 0 to 2**63 - 1 (milliseconds "
                                   f"since the epoch), got {now_ms!r}")
    return int(now_ms)

