"""Type stubs for the compiled core (segstore/_core.pyx).

Every byte-level loop lives there: varints, record batch v2 scan/decode/encode, legacy v0/v1
decode, column decode/encode, murmur2 and MurmurHash3. Parsers run without the GIL on explicit
bounds and return status codes; one function turns a bad status into CorruptRecordError naming the
file and position.

Bad arguments raise segstore.errors classes: a ``start``/``end`` outside the buffer, a negative
``max_records`` / ``max_batches`` or a non-positive ``records_per_batch`` / ``num_partitions``
InvalidArgumentError; a negative or overflowing ``base_offset`` InvalidOffsetError; a null key
given to ``murmur2`` / ``murmur3_128`` (which would otherwise hash like ``b""``) and malformed
records InvalidRecordError. An integer argument that is not an int (a float is refused, not
truncated; a bool or str too) raises OffsetTypeError, a TypeError, and one outside its range
the class of its kind; a batch header field (producer id, epoch, sequence, leader epoch, a
timestamp) InvalidRecordError for either. ``order`` and ``offset_deltas`` must hold ints. A
buffer argument that is not a one-dimensional, contiguous buffer of bytes (None, a str, a
strided or 2-d array, a read-only buffer where one is written) raises BufferTypeError, an
InvalidArgumentError and a TypeError.
"""

from typing import Any, Literal, NamedTuple, Optional, Sequence, Union

import numpy as np

from .columns import BinaryColumn, RecordColumns
from .errors import CorruptRecordError
from .records import ConsumerRecord

Buffer = Union[bytes, bytearray, memoryview, Any]  # anything exposing a contiguous byte buffer

# numpy structured dtype of one scanned batch header. Fields: position, base_offset, last_offset,
# base_timestamp, max_timestamp, producer_id (int64); size, partition_leader_epoch,
# last_offset_delta, base_sequence, records_count (int32); crc (uint32); attributes,
# producer_epoch (int16); magic (int8).  size includes the 12-byte log overhead.
BATCH_DTYPE: np.dtype

V2_HEADER_SIZE: int  # 61
LOG_OVERHEAD: int  # 12

class ScanResult(NamedTuple):
    batches: np.ndarray  # BATCH_DTYPE, one row per complete batch, in file order
    valid_end: int  # position just past the last complete (and, if checked, CRC-valid) batch
    torn: bool  # stopped at an incomplete trailing batch (declared size past the end)
    error: Optional[CorruptRecordError]  # the first corrupt batch, when raise_on_corrupt=False

class EncodedBatches(NamedTuple):
    data: memoryview  # concatenated v2 batches (read-only; pooled memory when large)
    batches: np.ndarray  # BATCH_DTYPE rows describing each batch in ``data``

def crc32c(data: Buffer) -> int: ...
def murmur2(data: Buffer) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int, like Java's Utils.murmur2."""

def murmur2_partition(key: Buffer, num_partitions: int) -> int:
    """Kafka's default partitioner for a non-null key: toPositive(murmur2(key)) % n."""

def murmur2_partitions(keys: BinaryColumn, num_partitions: int) -> np.ndarray:
    """Vectorized murmur2_partition over a column (int32; -1 for null keys)."""

def murmur3_128_digests(keys: BinaryColumn) -> np.ndarray:
    """MurmurHash3 x64-128 digests (h1, h2 as uint64) of every non-null key, shape (k, 2)."""

def distinct_digests(digests: np.ndarray) -> np.ndarray:
    """The distinct rows of a (n, 2) uint64 digest array, sorted."""

def murmur3_128(data: Buffer, seed: int = 0) -> bytes:
    """MurmurHash3 x64-128 digest (16 bytes), equal to ``mmh3.hash_bytes(data, seed)``."""

def scan_batches(
    buf: Buffer,
    start: int = 0,
    end: Optional[int] = None,
    *,
    validate_crc: bool = False,
    raise_on_corrupt: bool = True,
    max_batches: Optional[int] = None,
    file: Optional[str] = None,
) -> ScanResult:
    """Walk batch boundaries from ``start`` without decoding records (REF §1.11 file rules).

    Stops silently when fewer than 17 bytes remain or a declared size runs past ``end`` (a torn
    tail). A size field below 14, a v2 batch shorter than 61 bytes, a magic outside 0..2, or (with
    ``validate_crc``) a CRC mismatch is corrupt: raised as CorruptRecordError with the batch
    position, or returned in ``error`` with ``raise_on_corrupt=False``.
    """

class HeaderRow(NamedTuple):
    """One batch header as plain ints: BATCH_DTYPE's fields, in its order."""
    position: int
    base_offset: int
    last_offset: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    size: int
    partition_leader_epoch: int
    last_offset_delta: int
    base_sequence: int
    records_count: int
    crc: int
    attributes: int
    producer_epoch: int
    magic: int

def find_batch(
    buf: Buffer,
    start: int,
    end: Optional[int],
    offset: int,
    *,
    first_holds: Optional[int] = None,
    file: Optional[str] = None,
) -> Union[HeaderRow, None, Literal[False]]:
    """The header of the first batch in [start, end) whose last offset >= ``offset`` (None
    when there is none). [start, end) holds only whole batches: damage (or a torn batch) the
    walk reaches before finding it raises CorruptRecordError with ``file`` and its position.
    ``first_holds``: the batch at ``start`` must be whole and hold that offset (an offset
    index entry's), else False.
    """

def decode_records(
    buf: Buffer,
    start: int = 0,
    end: Optional[int] = None,
    *,
    min_offset: Optional[int] = None,
    end_offset: Optional[int] = None,
    max_records: Optional[int] = None,
    validate_crc: bool = True,
    include_control: bool = False,
    topic: Optional[str] = None,
    partition: Optional[int] = None,
    file: Optional[str] = None,
) -> list[ConsumerRecord]:
    """Every record with ``min_offset <= offset < end_offset`` as ConsumerRecord namedtuples.

    v2 and legacy v0/v1 batches (compressed or not) are decoded; control batches are skipped
    unless ``include_control``. A torn trailing batch is ignored; anything corrupt raises, but
    batches are checked in order, only as far as the records wanted reach: with ``max_records``
    damage after the batch holding the last record returned does not fail the decode. Within a
    batch (after its CRC), records are parsed only up to the first one not wanted (the one after
    the last returned, at ``max_records`` or ``end_offset``); the rest are neither parsed nor
    checked.
    """

def decode_columns(
    buf: Buffer,
    start: int = 0,
    end: Optional[int] = None,
    *,
    min_offset: Optional[int] = None,
    end_offset: Optional[int] = None,
    max_records: Optional[int] = None,
    validate_crc: bool = True,
    include_headers: bool = False,
    topic: Optional[str] = None,
    partition: Optional[int] = None,
    file: Optional[str] = None,
) -> RecordColumns:
    """Like decode_records, straight into numpy columns in Arrow layout (control batches skipped).

    Arrays of 1 MiB or more are taken from the buffer pool (segstore.buffer_pool). A buffer
    written to during the decode raises CorruptRecordError ("batch changed during decode")."""

def decode_columns_multi(
    sources: Sequence[tuple],
    *,
    min_offset: Optional[int] = None,
    end_offset: Optional[int] = None,
    max_records: Optional[int] = None,
    validate_crc: bool = True,
    include_headers: bool = False,
    topic: Optional[str] = None,
    partition: Optional[int] = None,
    strict: bool = False,
) -> RecordColumns:
    """decode_columns over ``(buffer, start, end, file[, release[, checked]])`` ranges into one
    set of columns (a log's segments); ``release`` acts on read-only ``mmap.mmap`` only."""

def index_lookup(buf: Buffer, entries: int, target: int, time_index: bool = False) -> int:
    """Slot of the floor entry for ``target`` (relative offset or timestamp), or -1."""

def index_check(buf: Buffer, entries: int, time_index: bool = False) -> int:
    """First slot that breaks the index's ordering, or -1 when the entries are sane."""

def sparse_index(batches: np.ndarray, base_offset: int, position_base: int, interval: int,
                 bytes_since_last_entry: int, max_timestamp: int, offset_of_max_ts: int,
                 last_time_entry_ts: int) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Offset and time index entries for batches by Kafka's sparse rule (REF §2.6)."""

def buffer_pool_set_limit(nbytes: int) -> int:
    """Keep at most nbytes of freed column buffers; returns the previous limit."""

def buffer_pool_release() -> int:
    """Unmap every kept free block; returns the bytes freed."""

def buffer_pool_stats() -> tuple[int, int, int, int, int, int]:
    """(limit, free_bytes, free_blocks, in_use_bytes, hits, misses)."""

def encode_batch(
    values: Sequence[Optional[Buffer]],
    keys: Optional[Sequence[Optional[Buffer]]] = None,
    headers: Optional[Sequence[Optional[Sequence[tuple[str, Optional[Buffer]]]]]] = None,
    timestamps_ms: Union[None, int, Sequence[int]] = None,
    *,
    base_offset: int = 0,
    compression: Union[int, str, None] = 0,
    compression_level: Optional[int] = None,
    log_append_time_ms: Optional[int] = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    partition_leader_epoch: int = -1,
    offset_deltas: Optional[Sequence[int]] = None,
) -> bytes:
    """One record batch v2 with a fresh CRC-32C. ``timestamps_ms`` None means now.

    ``log_append_time_ms`` stamps the batch LogAppendTime (attribute bit 3, maxTimestamp).
    ``offset_deltas`` (strictly increasing, default 0..n-1) writes a batch with offset gaps,
    as the cleaner does. ``values``, ``keys`` and ``timestamps_ms`` may be any sequences (or
    iterables); anything else, a timestamp that is not an int, or lengths that disagree raise
    InvalidRecordError naming the field.
    """

def encode_control_batch(
    control_type: int,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    base_offset: int = 0,
    timestamp_ms: int,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A 78-byte transaction marker batch (ControlRecordType.COMMIT or ABORT)."""

def timestamp_array(timestamps_ms: Any) -> np.ndarray:
    """Timestamps (an array or sequence of ints) as a contiguous int64 array; floats, strings,
    bools and values beyond int64 raise InvalidRecordError."""

def encode_columns(
    values: BinaryColumn,
    keys: Optional[BinaryColumn] = None,
    timestamps_ms: Union[None, int, np.ndarray] = None,
    *,
    base_offset: int = 0,
    records_per_batch: int = 4096,
    max_batch_bytes: int = 1 << 20,
    compression: Union[int, str, None] = 0,
    compression_level: Optional[int] = None,
    log_append_time_ms: Optional[int] = None,
    partition_leader_epoch: int = -1,
    order: Optional[np.ndarray] = None,
) -> EncodedBatches:
    """Columns into consecutive v2 batches (offsets base_offset, base_offset + 1, ...).

    A batch closes at ``records_per_batch`` records or before it would pass ``max_batch_bytes``
    (a single record larger than that still gets a batch of its own). ``order`` (integer row
    numbers) encodes rows ``order[0], order[1], ...`` of the columns instead of all rows in
    turn, so a caller that routes rows to partitions needs no reordered copy of its columns;
    a row number outside the columns raises InvalidArgumentError. Offsets outside a column's
    data, or columns written to during the encode, raise InvalidRecordError.

    ``data`` is a read-only memoryview. Outputs of 1 MiB or more live in the buffer pool (see
    ``segstore.buffer_pool``): the block is reused once the last view of it is gone. Use
    ``bytes(data)`` for a copy that can be pickled.
    """

def first_null_key(buf: Buffer, batches: np.ndarray, file: Optional[str] = None) -> Optional[int]:
    """Index (counting the records of ``batches`` from 0) of the first data record whose key
    is null, or None (a compacted topic refuses such records)."""

def set_base_offset(buf: bytearray, position: int, base_offset: int,
                    partition_leader_epoch: Optional[int] = None) -> None:
    """Rewrite a v2 batch's baseOffset (and leader epoch) in place; neither is covered by the CRC."""

def write_base_offsets(fd: int, positions: np.ndarray, sizes: np.ndarray,
                       base_offsets: np.ndarray, partition_leader_epoch: int = 0,
                       file: Optional[str] = None) -> None:
    """Rewrite the baseOffset and partitionLeaderEpoch of the v2 batches of the file open on
    ``fd`` (int64 positions, int32 sizes, int64 new base offsets), one 16-byte pwrite per batch;
    the CRC covers neither. Batches outside the file raise InvalidArgumentError before any
    write; a failed write raises OSError. Through the descriptor, not a map: a store through a
    shared map dirties whole page-cache folios, which the next fdatasync writes back whole."""

# -- the log cleaner (_clean.pxi) ----------------------------------------------------------

class OffsetMap:
    """Kafka's SkimpyOffsetMap (REF §6.12): key digest (MurmurHash3 x64-128) -> latest offset.

    ``memory // 24`` slots (``// 32`` with a KIP-280 ``strategy`` other than ``"offset"``);
    building stops at ``max_desired_size = int(slots * load_factor)`` entries.
    """

    memory: int
    load_factor: float
    strategy: str
    def __init__(self, memory: int, load_factor: float = 0.9, strategy: str = "offset",
                 header_key: Optional[Union[str, bytes]] = None) -> None: ...
    @property
    def slots(self) -> int: ...
    @property
    def bytes_per_entry(self) -> int: ...
    @property
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def max_desired_size(self) -> int: ...
    @property
    def latest_offset(self) -> int: ...
    def update_latest_offset(self, offset: int) -> None: ...
    @property
    def utilization(self) -> float: ...
    @property
    def lookups(self) -> int: ...
    @property
    def probes(self) -> int: ...
    @property
    def collision_rate(self) -> float: ...
    def put(self, key: Buffer, offset: int, value: int = 0) -> None:
        """Map key to offset; OverflowError when every slot is taken."""
    def merge_from(self, later: "OffsetMap", drain: bool = False) -> None:
        """Put every entry of ``later`` (an offset-strategy map built over records that all
        come after this map's) into this map; counters add up, the latest offset is the larger.
        OverflowError when the union does not fit. ``drain`` leaves ``later`` empty, its table
        zeroed and its pages kept."""
    def merge_lookup(self, later: "OffsetMap", start: int = 0, stop: Optional[int] = None, *,
                     drain: bool = False) -> tuple:
        """A merge's first phase over ``later``'s slots [start, stop): offsets of keys this map
        holds are overwritten; the rest are returned for merge_insert. Without the GIL; two
        threads may run it at once over disjoint slot ranges."""
    def merge_insert(self, later: "OffsetMap", *lookups: tuple) -> None:
        """A merge's second phase: insert what the lookups did not find, add up the counters."""
    def get(self, key: Buffer) -> int:
        """The mapped offset, or -1."""
    def clear(self, table_hint: int = 0, keep_pages: bool = False) -> None: ...
    @property
    def table_slots(self) -> int:
        """Slots probed now: 65,536 (or ``slots`` if fewer) after a clear, doubling whenever
        the table is half full, up to ``slots``."""

def build_offset_map(
    omap: OffsetMap,
    buf: Buffer,
    start: int,
    end: int,
    start_offset: int,
    aborted: Optional[np.ndarray] = None,
    *,
    update_only: bool = False,
    end_offset: Optional[int] = None,
    validate_crc: bool = False,
    file: Optional[str] = None,
) -> tuple[bool, int, int, int]:
    """Map the keys of buf[start:end] (REF §6.5); returns (full, stop position, messages, bytes)."""

FILTER_DONE: int
FILTER_NEED_PYTHON: int
FILTER_OUTPUT_FULL: int

class BatchFilter:
    """The cleaner's filter kernel over one map (REF §6.8)."""

    def __init__(self, omap: OffsetMap, now: int, delete_retention_ms: int,
                 upper_bound: int) -> None: ...
    def recompressed(self, rebuilt_size: int, compressed_size: int) -> None: ...
    @property
    def stats(self) -> dict: ...
    def reset_max_offset(self) -> None: ...
    def run(self, buf: Buffer, start: int, end: int, out: Buffer, out_pos: int,
            file: Optional[str] = None) -> tuple[int, int, int]:
        """Filter plain batches; returns (FILTER_* code, position, out_pos)."""
    @staticmethod
    def room_needed(buf: Buffer, pos: int, payload_len: Optional[int] = None) -> int: ...
    def filter_one(self, buf: Buffer, pos: int, mode: int, discard_records: bool,
                   marker_for_empty_txn: bool, out: Buffer, out_pos: int,
                   payload: Optional[Buffer] = None,
                   file: Optional[str] = None) -> tuple[int, bool]:
        """One batch with its retention mode (0 RETAIN_EMPTY, 1 DELETE, 2 DELETE_EMPTY)."""
    def count_legacy(self, messages: int, size: int, written_messages: int, written_bytes: int,
                     max_offset: int, invalid: int) -> None: ...

def plain_batches(buf: Buffer, start: int = 0, end: Optional[int] = None) -> tuple[int, bool]:
    """Walk batch headers while every batch is plain (one the cleaner's filter decides alone:
    no legacy format, codec, control batch or producer id); ``(position, plain)``: False at a batch that is not plain
    or is damaged, True at ``end`` or at a batch running past it."""

def release_pages(buf: Buffer, start: int, end: int) -> None:
    """Drop this process's page-table entries for the pages of the file mapping ``buf`` that
    hold ``buf[start:end]`` (without the GIL; ``buf`` must be a read-only ``mmap.mmap``)."""

def finish_crcs(out: Buffer, start: int, end: int) -> None:
    """Fill the CRC of every batch in out[start:end] whose CRC field is 0."""

def compress_batch_at(out: Buffer, pos: int, size: int, codec: int) -> bytearray:
    """The uncompressed batch at out[pos:pos+size] compressed with ``codec``, CRC set."""
def spin_wait(flags: Any, index: int, seconds: float) -> int:
    """Spin without the GIL until the int64 ``flags[index]`` is not 0, for at most
    ``seconds``; the value seen (0 when the time ran out)."""
def spin_set(flags: Any, index: int, value: int) -> None:
    """Set ``flags[index]`` for a thread in spin_wait (a release store)."""
