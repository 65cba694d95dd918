"""Kafka's ``Topic``: what a topic name and a partition count may be.

Names follow Kafka's rules exactly, which also keeps every partition directory inside the
store's root.
"""

from __future__ import annotations

import re

from .errors import InvalidTopicError

_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_LENGTH = 249
MAX_PARTITIONS = 2 ** 31 - 1  # partition ids are Java ints


def validate_topic_name(name) -> str:
    """Kafka's topic name rules, so no name can reach outside the store's root."""
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is longer than {MAX_TOPIC_LENGTH} characters ({len(name)})")
    if not _LEGAL_TOPIC.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is illegal: it may contain only ASCII letters, digits, '.', "
            "'_' and '-'")
    return name


def is_legal_topic_name(name: str) -> bool:
    """Whether ``name`` passes :func:`validate_topic_name` (for names found on disk)."""
    return (bool(_LEGAL_TOPIC.fullmatch(name)) and name not in (".", "..")
            and len(name) <= MAX_TOPIC_LENGTH)


def validate_partition_count(num_partitions) -> int:
    """A topic's partition count: an int from 1 to MAX_PARTITIONS (not a bool)."""
    if not isinstance(num_partitions, int) or isinstance(num_partitions, bool) \
            or not 1 <= num_partitions <= MAX_PARTITIONS:
        raise InvalidTopicError(f"num_partitions must be an int from 1 to {MAX_PARTITIONS} "
                                f"(Kafka's int32 partition ids), got {num_partitions!r}")
    return num_partitions
