"""What Kafka's ``LogValidator`` refuses of the records a compacted topic is given: a record
without a key ("Compacted topic cannot accept message without key"). The log cleaner would
drop such a record at its next round (REF §6.8), so an append that Kafka's broker refuses is
refused here too, before anything is written.
"""

from __future__ import annotations

from collections import abc
from typing import Optional

from . import _core
from .errors import InvalidRecordError


def _refuse(log, offset_hint: str = "") -> None:
    raise InvalidRecordError(
        f"Compacted topic cannot accept message without key in topic partition "
        f"{log.topic}-{log.partition}{offset_hint} (cleanup.policy="
        f"{','.join(log.config.cleanup_policy)}: the cleaner would delete it)")


def check_keys(log, keys) -> None:
    """``append_batch``'s keys (a sequence, or None for none)."""
    if not log.config.compact:
        return
    if keys is None:
        _refuse(log)
    if isinstance(keys, (str, bytes, bytearray, memoryview)) or not isinstance(keys, abc.Iterable):
        # ``None in keys`` would raise TypeError (or look for a substring).
        raise InvalidRecordError(f"keys must be a sequence of keys, not {type(keys).__name__}")
    if None in keys:  # a compiled scan; only a refusal looks for which record
        _refuse(log, f" (record {next(i for i, k in enumerate(keys) if k is None)})")


def check_key_column(log, keys) -> None:
    """``append_columns``' keys (a BinaryColumn, or None)."""
    if not log.config.compact:
        return
    if keys is None:
        _refuse(log)
    if len(keys) and not bool(keys.valid.all()):
        _refuse(log, f" (record {int((~keys.valid).argmax())})")


def check_encoded_keys(log, buf, batches, file: Optional[str] = None) -> None:
    """Encoded v2 batches (``append_records``, adopted files): every data record's key."""
    if not log.config.compact:
        return
    index = _core.first_null_key(buf, batches, file)
    if index is not None:
        _refuse(log, f" (record {index} of the data given)")
