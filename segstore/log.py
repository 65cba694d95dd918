"""PartitionLog: one partition's ordered, offset-addressed log of segments (Kafka's UnifiedLog).

Mutations (append, roll, truncate, delete, replace) hold the log's lock. Readers never take it:
they read ``self._state``, an immutable snapshot of (segments, log start offset, log end
offset) that a writer replaces in one assignment after each change (copy-on-write, REF §3.1).
"""

from __future__ import annotations

import os
import threading
from collections import abc
from typing import NamedTuple, Optional

import numpy as np

from . import _core, log_validator
from .checkpoint import fsync_dir
from .columns import BinaryColumn
from .compression import codec_id
from .errors import (CorruptIndexError, InvalidRecordError, ReadOnlyStoreError,
                     RecordTooLargeError, StoreClosedError, now_argument, offset_argument)
from .loader import load_segments
from .producer_snapshots import (delete_snapshots_before, list_snapshots, load_producer_state,
                                 read_snapshot, take_snapshot)
from .producer_state import (ProducerStateManager, check_marker_fields, check_producer_fields,
                             stamp_log_append_time)
from .records import RecordMetadata, TopicPartition
from .log_deletion import LogDeletion
from .log_dir_failure import LogDirFailure
from .log_follower import ReadOnlyFollower
from .log_isolation import readonly_first_unstable, readonly_producer_state, stable_bound
from .log_reads import LogReads
from .log_state import LogState as _State
from .segment import MAX_RELATIVE_OFFSET, LogSegment
from .segment_checks import Problem


_BATCH_FIELDS = _core.BATCH_DTYPE.names


class AppendInfo(NamedTuple):
    """What one append wrote (Kafka's LogAppendInfo, trimmed)."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    num_records: int
    size_bytes: int




APPEND_ORIGINS = ("client", "coordinator", "replication")  # Kafka's AppendOrigin


class PartitionLog(LogReads, LogDeletion, LogDirFailure, ReadOnlyFollower):
    """The log of one topic partition in ``directory`` (``<topic>-<partition>``).

    Created by :class:`segstore.store.LogStore`; ``config`` is the topic's TopicConfig,
    ``clock`` returns milliseconds, ``delete_later`` schedules a renamed ``.deleted`` segment for
    physical deletion after ``file.delete.delay.ms``.
    """

    def __init__(self, directory: str, topic: str, partition: int, config, clock, *,
                 readonly: bool = False, recovery_point: int = 0, log_start_offset: int = 0,
                 had_clean_shutdown: bool = True, delete_later=None,
                 producer_id_expiration_ms: int = 86_400_000):
        self.directory = directory
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.topic = topic
        self.partition = partition
        self.topic_partition = TopicPartition(topic, partition)
        self.config = config
        self.clock = clock
        self.readonly = readonly
        self._lock = threading.RLock()
        self._closed = False
        # Bumped by every truncation: a cleaner round that saw another value aborts its swap.
        self.truncations = 0
        # Called as fn(topic_partition, offset) after a truncation (the cleaner lowers its
        # checkpoint, Kafka's maybeTruncateCheckpoint).
        self.truncation_listeners: list = []
        self._delete_later = delete_later or (lambda seg, delay_ms: seg.delete_files())
        self.last_flush_ms = clock()
        self.producer_state: Optional[ProducerStateManager] = None  # writable logs only
        if readonly:
            self.recovery_point = 0
            self._ro_start = log_start_offset
            # Nothing is listed until the log is first used (every accessor refreshes first):
            # a reader of one partition need not pay for listing a large store's others.
            self._state = _State((), log_start_offset, log_start_offset)
            return
        os.makedirs(directory, exist_ok=True)
        loaded = load_segments(directory, config, clock, recovery_point=recovery_point,
                               had_clean_shutdown=had_clean_shutdown,
                               log_start_offset=log_start_offset)
        self.load_result = loaded
        segs = tuple(loaded.segments)
        leo = loaded.log_end_offset
        start = max(log_start_offset, segs[0].base_offset)
        self.recovery_point = leo if had_clean_shutdown else min(recovery_point, leo)
        self._state = _State(segs, min(start, leo), leo)
        self.producer_state = load_producer_state(directory, segs, log_end_offset=leo,
                                                  had_clean_shutdown=had_clean_shutdown,
                                                  recovered=loaded.txn_rebuild,
                                                  listing=loaded.listing)
        self.producer_state.remove_expired(clock(), producer_id_expiration_ms)
        # As Kafka's rebuildProducerState ends: a snapshot at the log end unless one is there,
        # so that what the replay knew survives retention deleting the snapshot it started from.
        if take_snapshot(self.producer_state, directory, leo):
            fsync_dir(directory)

    # -- snapshot accessors -----------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (its topic deleted, or the store closed)."""
        return self._closed

    @property
    def segments(self) -> tuple:
        """The segments, oldest first (an immutable snapshot)."""
        self._refresh()
        return self._state.segments

    @property
    def active_segment(self) -> LogSegment:
        """The last segment, the one appends go to."""
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        """First offset exposed to readers."""
        self._refresh()
        return self._state.log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to be assigned."""
        self._refresh()
        return self._state.log_end_offset

    @property
    def high_watermark(self) -> int:
        """Equals the log end offset: a single-node log has no replicas to wait for."""
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """First offset of the oldest open transaction (at least the log start offset), or the
        log end offset when none is open (REF §3.1: HW = LEO on a single node)."""
        if self.producer_state is None:  # read-only: replay the headers of what is there now
            self._refresh()
            st = self._state
            first = readonly_first_unstable(self.directory, st)
        else:
            st = self._state  # read before the first unstable offset, never after
            first = self.producer_state.first_unstable_offset()
        return stable_bound(first, st)

    def active_producers(self) -> dict[int, tuple[int, int]]:
        """{producer id: (last data offset or -1, producer epoch)}: Kafka's
        lastRecordsOfActiveProducers, whose last batches the cleaner keeps."""
        if self.producer_state is None:  # the writer's snapshot knows producers retention removed
            self._refresh()
            return readonly_producer_state(self.directory, self._state).active_producers()
        with self._lock:
            return self.producer_state.active_producers()

    @property
    def size_bytes(self) -> int:
        """Bytes of every segment's log file."""
        return sum(s.size for s in self.segments)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"log {self.topic}-{self.partition} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyStoreError(f"log {self.topic}-{self.partition} is open read-only")
        self._check_online()

    # -- appending --------------------------------------------------------------------------
    def append(self, value, key=None, headers=None, timestamp_ms=None) -> RecordMetadata:
        """Append one record; returns where it landed (kafka-python's RecordMetadata)."""
        if isinstance(headers, abc.Iterator):
            headers = list(headers)  # read by the encoder, then for the header size below
        info = self.append_batch([value], None if key is None else [key],
                                 None if headers is None else [headers],
                                 None if timestamp_ms is None else [timestamp_ms])
        def size(b):
            return -1 if b is None else len(b.encode("utf-8") if isinstance(b, str) else b)
        # Header keys may be given as str or as UTF-8 bytes (the encoder takes both).
        hsize = sum(size(k) + max(size(v), 0) for k, v in headers) if headers else -1
        return RecordMetadata(self.topic, self.partition, self.topic_partition, info.first_offset,
                              info.max_timestamp, None, size(key), size(value), hsize,
                              self.log_start_offset)

    def append_batch(self, values, keys=None, headers=None, timestamps_ms=None, *,
                     compression=None, producer_id: int = -1, producer_epoch: int = -1,
                     base_sequence: int = -1, is_transactional: bool = False) -> AppendInfo:
        """Append records from Python lists as one batch (offsets assigned by the log).

        ``producer_id``, ``producer_epoch``, ``base_sequence`` and ``is_transactional`` are an
        idempotent or transactional producer's fields. The batch is checked as Kafka's leader
        checks it: an epoch older than the producer's (fenced) or a sequence that does not
        follow its last batch raises InvalidRecordError and writes nothing. A retry of the
        producer's last batch is not written again: its first append's offsets come back, with
        ``size_bytes`` 0."""
        self._check_writable()
        check_producer_fields(producer_id, producer_epoch, base_sequence, is_transactional)
        if isinstance(keys, abc.Iterator):
            keys = list(keys)  # read by the null-key check, then by the encoder
        log_validator.check_keys(self, keys)
        codec = self._codec(compression)
        with self._lock:  # encoding at the log end offset: nothing to patch afterwards
            now = self.clock()
            data = _core.encode_batch(
                values, keys, headers, now if timestamps_ms is None else timestamps_ms,
                base_offset=self._state.log_end_offset, compression=codec,
                compression_level=self.config.compression_level(codec),
                log_append_time_ms=self._log_append_time(now), producer_id=producer_id,
                producer_epoch=producer_epoch, base_sequence=base_sequence,
                is_transactional=is_transactional, partition_leader_epoch=0)
            return self._append_encoded(data, None, assigned=True)

    def append_columns(self, values: BinaryColumn, keys: Optional[BinaryColumn] = None,
                       timestamps_ms=None, *, records_per_batch: int = 4096,
                       compression=None) -> AppendInfo:
        """Append numpy columns, encoded by compiled code into batches of up to
        ``records_per_batch`` records and ``max.message.bytes`` bytes (a large append is
        encoded and written in overlapping chunks: see :mod:`segstore.column_append`)."""
        self._check_writable()
        if not isinstance(values, BinaryColumn) or (keys is not None and not isinstance(keys, BinaryColumn)):
            raise InvalidRecordError("append_columns takes BinaryColumn values and keys")
        if len(values) == 0:
            raise InvalidRecordError("append_columns needs at least one record")
        log_validator.check_key_column(self, keys)
        from .column_append import append_columns
        return append_columns(self, values, keys, timestamps_ms, records_per_batch,
                              self._codec(compression))

    def append_control(self, control_type: int, *, producer_id: int, producer_epoch: int,
                       coordinator_epoch: int = 0) -> AppendInfo:
        """Append a transaction marker (ControlRecordType.COMMIT or ABORT)."""
        self._check_writable()
        check_marker_fields(control_type, producer_id, producer_epoch, coordinator_epoch)
        with self._lock:  # encoded at the log end offset, stamped in place (not re-encoded)
            now = self.clock()
            data = bytearray(_core.encode_control_batch(
                control_type, producer_id=producer_id, producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch, base_offset=self._state.log_end_offset,
                timestamp_ms=now, partition_leader_epoch=0))
            if self._log_append_time(now) is not None:
                stamp_log_append_time(data, now)
            return self._append_encoded(data, None, assigned=True)

    def append_records(self, data, *, origin: str = "client") -> AppendInfo:
        """Append already-encoded v2 batches (e.g. staged by a Spark task).

        CRCs are validated; base offsets are rewritten to the log's next offsets (they are not
        covered by the CRC); anything else is rejected. ``origin`` is Kafka's AppendOrigin:
        ``"client"`` (a producer's batches: a compacted topic refuses records without a key,
        sequences are checked and a retried batch is written once), ``"coordinator"`` (keys
        checked, sequences not: Kafka's coordinators start every transaction at sequence 0) or
        ``"replication"`` (taken as a follower takes what its leader holds: data copied from a
        log that was not compacted when it was written; the cleaner removes keyless records).
        """
        if origin not in APPEND_ORIGINS:
            raise InvalidRecordError(f"origin must be one of {', '.join(APPEND_ORIGINS)}, got "
                                     f"{origin!r}")
        self._check_writable()
        try:
            # A buffer only: bytearray(n) of an int would append n zero bytes (2**62: an
            # allocation that fails or exhausts memory), of a str or float raise TypeError.
            buf = bytearray(memoryview(data))
        except (TypeError, ValueError, BufferError):
            raise InvalidRecordError(f"append_records takes bytes-like encoded batches, not "
                                     f"{type(data).__name__}") from None
        res = _core.scan_batches(buf, validate_crc=True)
        if res.torn or res.valid_end != len(buf):
            raise InvalidRecordError("appended data ends with an incomplete batch")
        if len(res.batches) and (res.batches["magic"] != 2).any():
            raise InvalidRecordError("only record batch v2 (magic 2) can be appended")
        if origin != "replication":
            log_validator.check_encoded_keys(self, buf, res.batches)
        return self._append_encoded(buf, res.batches, origin=origin)

    def adopt_segment_file(self, path: str) -> AppendInfo:
        """Make a file of whole v2 batches a new segment at the log end offset, without
        copying it (only each batch's baseOffset is rewritten; CRCs are checked).

        The file must be on the partition directory's filesystem; it is renamed into the log
        (or, where adoption does not apply, appended and deleted: see :mod:`segstore.adopt`).
        Bad data raises as an append would; a crash leaves no adopted segment or a whole one.
        """
        return self.adopt_segment_files([path])

    def adopt_segment_files(self, paths, *, validate_crc: bool = True) -> AppendInfo:
        """Adopt several files in order, as :meth:`adopt_segment_file` does one, with one
        contiguous range of offsets and one directory fsync for them all.

        Every file is checked before the log changes. A crash during the call can keep any of
        the files' segments (each whole); callers that need all or nothing keep a manifest, as
        the Spark commit does.
        ``validate_crc=False`` checks the batch headers but not the CRCs, for a caller that
        knows the bytes are the ones it wrote (the Spark commit, for staged files whose size,
        inode and change time are still what its task recorded).
        """
        self._check_writable()
        from .adopt import adopt_files, adoption_paths
        return adopt_files(self, adoption_paths(self, paths), validate_crc)

    def _log_append_time(self, now: int) -> Optional[int]:
        return now if self.config.message_timestamp_type == "LogAppendTime" else None

    def _codec(self, compression) -> int:
        if compression is None:
            ct = self.config.compression_type
            compression = 0 if ct in ("producer", "uncompressed") else ct
        return codec_id(compression)

    def _append_encoded(self, buf, batches: Optional[np.ndarray] = None,
                        assigned: bool = False, origin: str = "client") -> AppendInfo:
        """Write encoded batches; ``assigned`` means they were encoded at the log end offset
        (under the lock) with LogAppendTime already stamped, so nothing is rewritten."""
        if batches is None:
            batches = _core.scan_batches(buf).batches
        else:
            batches = batches.copy()
        if len(batches) == 0:
            raise InvalidRecordError("nothing to append")
        sizes = batches["size"].astype(np.int64)
        too_big = sizes > self.config.max_message_bytes
        if too_big.any():
            raise RecordTooLargeError(
                f"batch of {int(sizes[too_big][0])} bytes exceeds max.message.bytes="
                f"{self.config.max_message_bytes}")
        if (sizes > self.config.segment_bytes).any():
            raise RecordTooLargeError(
                f"batch larger than segment.bytes={self.config.segment_bytes}")
        log_append = self.config.message_timestamp_type == "LogAppendTime"
        with self._lock, self._going_offline_on_io_error():
            self._check_writable()
            dup = self.producer_state.find_duplicate(batches) if origin == "client" else None
            if dup is not None:  # a retried batch: its first append's offsets, nothing written
                return AppendInfo(dup[0], dup[1], dup[2], int(batches["records_count"][0]), 0)
            now = self.clock()
            leo = self._state.log_end_offset
            if assigned and int(batches["base_offset"][0]) != leo:
                raise AssertionError("batches were encoded at another offset than the log end")
            if assigned and len(batches) == 1:
                info = self._append_one_locked(buf, batches, now, origin)
                if info is not None:
                    return info
            if not assigned:
                # Assign offsets: rewrite each batch's baseOffset (outside the CRC).
                deltas = batches["last_offset"] - batches["base_offset"]
                counts = deltas + 1
                new_base = leo + np.concatenate(([0], np.cumsum(counts)[:-1]))
                for i in range(len(batches)):
                    _core.set_base_offset(buf, int(batches["position"][i]), int(new_base[i]), 0)
                batches["base_offset"] = new_base
                batches["last_offset"] = new_base + deltas
                if log_append:
                    buf, batches = self._stamp_log_append_time(buf, batches, now)
            self._validate_producers(buf, batches, origin)
            first = int(batches["base_offset"][0])
            last = int(batches["last_offset"][-1])
            i, n = 0, len(batches)
            ends = np.cumsum(batches["size"].astype(np.int64))
            while i < n:
                seg = self._state.segments[-1]
                start_byte = int(ends[i - 1]) if i else 0
                room = self.config.segment_bytes - seg.size
                fit = int(np.searchsorted(ends[i:] - start_byte, room, side="right"))
                # ... and whose offsets stay relative to the segment base (< 2^31).
                rel_fit = int(np.searchsorted(batches["last_offset"][i:] - seg.base_offset,
                                              MAX_RELATIVE_OFFSET, side="right"))
                if rel_fit == 0 and seg.size == 0 and int(batches["base_offset"][i]) > seg.base_offset:
                    self._roll_locked(int(batches["base_offset"][i]), force=True)
                    continue
                # ... and that cannot overflow the indexes (at most one entry of each per batch).
                oi, ti = seg.offset_index, seg.time_index
                idx_room = min(oi.max_entries - oi.entries, ti.max_entries - 1 - ti.entries)
                j = i + max(min(fit, rel_fit, idx_room), 0)
                if j == i and seg.size == 0:
                    j = i + 1
                group = batches[i:j] if j > i else batches[i:i + 1]
                incoming = int(ends[j - 1] - start_byte) if j > i else int(batches["size"][i])
                if j == i or seg.should_roll(incoming, int(group["max_timestamp"].max()),
                                             int(group["last_offset"][-1]),
                                             self._max_segment_ms(), now,
                                             self.config.segment_bytes):
                    self._roll_locked(int(batches["base_offset"][i]))
                    continue
                chunk = memoryview(buf)[start_byte:start_byte + incoming]
                group = group.copy()
                group["position"] -= start_byte
                seg.append(chunk, group)
                self.producer_state.update(chunk, group, seg)  # ABORTs go to seg's .txnindex
                self._state = _State(self._state.segments, self._state.log_start_offset,
                                     int(group["last_offset"][-1]) + 1)
                i = j
            self._maybe_flush_locked(now)
        return AppendInfo(first, last, int(batches["max_timestamp"].max()),
                          int(batches["records_count"].sum()), len(buf))

    def _validate_producers(self, buf, batches, origin: str) -> None:
        # Fenced epochs, transaction state, and for a client's batches their sequences; a
        # follower's batches are taken as they are.
        if origin != "replication":
            self.producer_state.validate(buf, batches, check_sequences=origin == "client")

    def _append_one_locked(self, buf, batches, now: int, origin: str) -> Optional[AppendInfo]:
        """The common case of one batch, encoded at the log end, that fits the active segment,
        with scalar arithmetic (the general loop's numpy calls cost more than the write).
        None when a roll is due: the caller's general path then handles it."""
        b = dict(zip(_BATCH_FIELDS, batches.tolist()[0]))
        size, last, max_ts = b["size"], b["last_offset"], b["max_timestamp"]
        seg = self._state.segments[-1]
        oi, ti = seg.offset_index, seg.time_index
        # The general loop's tests, with the log's (possibly just altered) config.
        if (b["position"] != 0 or size != len(buf) or size > self.config.max_message_bytes
                or seg.size + size > self.config.segment_bytes
                or last - seg.base_offset > MAX_RELATIVE_OFFSET
                or min(oi.max_entries - oi.entries, ti.max_entries - 1 - ti.entries) < 1
                or seg.should_roll(size, max_ts, last, self._max_segment_ms(), now,
                                   self.config.segment_bytes)):
            return None
        self._validate_producers(buf, batches, origin)
        seg.append(buf, batches)
        self.producer_state.update(buf, batches, seg)
        self._state = _State(self._state.segments, self._state.log_start_offset, last + 1)
        self._maybe_flush_locked(now)
        return AppendInfo(b["base_offset"], last, max_ts, b["records_count"], size)

    def _stamp_log_append_time(self, buf, batches, now):
        # LogAppendTime: set attribute bit 3 and maxTimestamp, then a fresh CRC (REF §3.2).
        out = bytearray()
        for b in batches:
            pos, size = int(b["position"]), int(b["size"])
            if b["attributes"] & 0x20:  # a control batch stays one: stamped in place
                out += stamp_log_append_time(bytearray(buf[pos:pos + size]), now)
                continue
            recs = _core.decode_records(memoryview(buf)[pos:pos + size], validate_crc=False,
                                        include_control=bool(b["attributes"] & 0x20))
            enc = _core.encode_batch(
                [r.value for r in recs], [r.key for r in recs], [r.headers for r in recs],
                [r.timestamp for r in recs], base_offset=int(b["base_offset"]),
                compression=int(b["attributes"]) & 7, log_append_time_ms=now,
                producer_id=int(b["producer_id"]), producer_epoch=int(b["producer_epoch"]),
                base_sequence=int(b["base_sequence"]),
                is_transactional=bool(b["attributes"] & 0x10), partition_leader_epoch=0,
                offset_deltas=[r.offset - int(b["base_offset"]) for r in recs])
            out += enc
        res = _core.scan_batches(out)
        return out, res.batches

    def _max_segment_ms(self) -> int:
        c = self.config
        if c.compact and 0 < c.max_compaction_lag_ms < c.segment_ms:
            return c.max_compaction_lag_ms
        return c.segment_ms

    # -- rolling and flushing ---------------------------------------------------------------
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (an empty active one is kept). The
        older segments are flushed, as Kafka's roll does, and a producer snapshot is written
        at the new base."""
        self._check_writable()
        with self._lock, self._going_offline_on_io_error():
            self._check_writable()
            return self._roll_locked(self._state.log_end_offset)

    def _roll_locked(self, expected_next_offset: int, force: bool = False) -> LogSegment:
        st = self._state
        active = st.segments[-1]
        new_base = max(expected_next_offset, st.log_end_offset)
        if active.size == 0 and active.base_offset == new_base:
            self._flush_locked(new_base)  # Kafka's roll flushes below the new base even here
            return active
        if active.base_offset == new_base or (force and active.size == 0):
            # An empty active segment is replaced rather than left behind (KAFKA-6388).
            segs = st.segments[:-1]
            active.delete_files()
        else:
            active.on_become_inactive()
            active.release_files()  # sealed: reopened lazily, so descriptors do not pile up
            segs = st.segments
        seg = LogSegment(self.directory, new_base, self.config, self.clock,
                         preallocate=self.config.preallocate)
        self._state = _State(segs + (seg,), st.log_start_offset, st.log_end_offset)
        # The producer state at the new base: an open or truncation replays from here.
        take_snapshot(self.producer_state, self.directory, new_base)
        fsync_dir(self.directory)
        self._flush_locked(new_base)  # Kafka flushes the old segments after a roll
        return seg

    def flush(self, offset: Optional[int] = None) -> None:
        """fsync every segment holding offsets below ``offset`` (default: the log end)."""
        self._check_writable()
        if offset is not None:
            offset = offset_argument(offset, "flush offset")
        with self._lock, self._going_offline_on_io_error():
            self._check_writable()
            self._flush_locked(self._state.log_end_offset if offset is None else offset)

    def _flush_locked(self, offset: int) -> None:
        if offset <= self.recovery_point:
            return
        segs = self._state.segments
        new_files = False
        for i, s in enumerate(segs):
            nxt = segs[i + 1].base_offset if i + 1 < len(segs) else None
            if nxt is not None and nxt <= self.recovery_point:
                continue
            if s.base_offset >= offset and s is not segs[-1]:
                break
            s.flush()
            new_files |= s.base_offset >= self.recovery_point
        if new_files:
            fsync_dir(self.directory)
        self.recovery_point = max(self.recovery_point, min(offset, self._state.log_end_offset))
        self.last_flush_ms = self.clock()

    def _maybe_flush_locked(self, now: int) -> None:
        c = self.config
        if (self._state.log_end_offset - self.recovery_point >= c.flush_messages
                or now - self.last_flush_ms >= c.flush_ms):
            self._flush_locked(self._state.log_end_offset)

    def maybe_flush(self, now_ms: Optional[int] = None) -> None:
        """Flush if ``flush.ms`` has passed since the last flush (the periodic flusher)."""
        if self.readonly or self._closed or self.offline:
            return
        with self._lock, self._going_offline_on_io_error():
            self._maybe_flush_locked(now_argument(now_ms, self.clock))

    def remove_expired_producers(self, now_ms: Optional[int] = None) -> list[int]:
        """Forget the producers without an open transaction whose last batch's timestamp is
        ``producer.id.expiration.ms`` or more before ``now_ms`` (default: the clock); returns
        their ids. The store runs this every ``producer.id.expiration.check.interval.ms`` in
        :meth:`LogStore.tick`, and a log runs it when it opens. Read-only logs keep no
        producer state: they return []."""
        if self.readonly or self._closed:
            return []
        with self._lock:
            now = now_argument(now_ms, self.clock)
            return self.producer_state.remove_expired(now, self.producer_id_expiration_ms)

    def delete_old_snapshots(self) -> None:
        """Kafka's deleteSnapshotsAfterRecoveryPointCheckpoint (the store calls it after writing
        the recovery-point checkpoint): keep the producer snapshots from the segment before the
        active one and from the segment holding the recovery point on."""
        if self.readonly or self._closed:
            return
        with self._lock:
            bases = [s.base_offset for s in self._state.segments]
            previous = bases[-2] if len(bases) > 1 else bases[-1]
            below = [b for b in bases if b < self.recovery_point]
            keep_from = min(previous, below[-1] if below else self.recovery_point)
            delete_snapshots_before(self.directory, keep_from)

    # -- verification -----------------------------------------------------------------------
    def verify(self) -> list:
        """A full CRC and index check of every segment, and a check of every producer snapshot:
        a list of ``Problem`` (file, position, message), empty when the log is sound. Reads
        never change anything."""
        self._check_open()
        segs = self.segments
        problems = []
        for i, seg in enumerate(segs):
            nxt = segs[i + 1].base_offset if i + 1 < len(segs) else None
            problems.extend(seg.verify(nxt))
        for path in list_snapshots(self.directory).values():
            try:
                read_snapshot(path)
            except FileNotFoundError:
                pass  # deleted meanwhile (a roll past it, retention, a truncation)
            except (CorruptIndexError, OSError) as e:
                problems.append(Problem(path, 0, str(e)))
        return problems

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Flush (writable logs), write a producer snapshot at the log end (writable logs),
        trim the active segment's indexes and close every file."""
        if self._closed:
            return
        with self._lock:
            try:
                if not self.readonly and not self.offline:
                    with self._going_offline_on_io_error():
                        self._flush_locked(self._state.log_end_offset)
                        # Read by the next open instead of replaying the log. An error
                        # propagates (like a failed flush): no clean-shutdown marker, so the
                        # next open replays.
                        if take_snapshot(self.producer_state, self.directory,
                                         self._state.log_end_offset):
                            fsync_dir(self.directory)
            finally:
                self._close_segments()
                self._closed = True
