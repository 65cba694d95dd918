"""Columnar record data: numpy arrays in Arrow's layout, convertible to Arrow without copies.

A :class:`BinaryColumn` is Arrow's (large) binary layout: ``data`` holds every value back to
back, value ``i`` is ``data[offsets[i]:offsets[i + 1]]``, and ``valid[i]`` is False for a null
(Arrow's convention: True means present). :class:`RecordColumns` is what
``PartitionLog.read_columns`` returns and ``append_columns`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

from .errors import InvalidRecordError, is_int

_MAX_MS_AS_US = (2**63 - 1) // 1000  # the largest millisecond timestamp whose microseconds fit

_EMPTY_U8 = np.empty(0, dtype=np.uint8)


@dataclass(frozen=True, eq=False)
class BinaryColumn:
    """Nullable binary values: ``data uint8[m]``, ``offsets int64[n+1]``, ``valid bool[n]``."""

    data: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray

    def __post_init__(self):
        for name in ("data", "offsets", "valid"):
            a = getattr(self, name)
            # The encoders and hashes read the arrays as C-contiguous 1-d buffers: anything
            # else failed there with AttributeError or ValueError.
            if not isinstance(a, np.ndarray) or a.ndim != 1 or not a.flags.c_contiguous:
                raise InvalidRecordError(f"BinaryColumn.{name} must be a 1-d C-contiguous numpy "
                                         f"array, not {_describe(a)}")
        if self.offsets.dtype != np.int64 or self.offsets.ndim != 1:
            raise InvalidRecordError("BinaryColumn.offsets must be a 1-d int64 array")
        if self.data.dtype != np.uint8 or self.data.ndim != 1:
            raise InvalidRecordError("BinaryColumn.data must be a 1-d uint8 array")
        if self.valid.dtype != np.bool_ or len(self.valid) + 1 != len(self.offsets):
            raise InvalidRecordError("BinaryColumn.valid must be a bool array of len(offsets) - 1")

    def __len__(self) -> int:
        return len(self.valid)

    def __getitem__(self, i):
        """Value ``i`` as bytes (None for a null), or a slice of the column as a BinaryColumn
        sharing this one's data."""
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                raise InvalidRecordError("a BinaryColumn slice takes no step")
            stop = max(start, stop)
            return BinaryColumn(self.data, self.offsets[start:stop + 1], self.valid[start:stop])
        if not is_int(i):
            raise TypeError(f"BinaryColumn indices must be ints or slices, not "
                            f"{type(i).__name__}")
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} is outside the column of {n} values")
        if not self.valid[i]:
            return None
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()

    @property
    def lengths(self) -> np.ndarray:
        """Byte length of each value (0 for nulls)."""
        return np.diff(self.offsets)

    def filter(self, keep: np.ndarray) -> "BinaryColumn":
        """The values where the bool array ``keep`` is True, in a new column."""
        keep = _keep_argument(keep, len(self))
        lengths = self.lengths
        start, stop = int(self.offsets[0]), int(self.offsets[-1])
        # A BinaryColumn does not check its offsets (the encoders and hashes do, per value):
        # bad ones raised IndexError or ValueError from numpy here.
        if start < 0 or stop > len(self.data) or (len(lengths) and lengths.min() < 0):
            raise InvalidRecordError("BinaryColumn.offsets are not increasing or point outside "
                                     "its data")
        data = self.data[start:stop][np.repeat(keep, lengths)]
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        return BinaryColumn(data, offsets, self.valid[keep])

    @property
    def nbytes(self) -> int:
        """Bytes held by the three arrays."""
        return self.data.nbytes + self.offsets.nbytes + self.valid.nbytes

    def to_pylist(self) -> list:
        """The values as ``bytes`` objects, None for nulls."""
        data = self.data.tobytes()
        offs = self.offsets.tolist()
        return [data[offs[i]:offs[i + 1]] if v else None for i, v in enumerate(self.valid.tolist())]

    @classmethod
    def from_pylist(cls, values: Sequence[Optional[bytes]]) -> "BinaryColumn":
        """Build a column from bytes-like values (str is encoded as UTF-8) and Nones."""
        if isinstance(values, (str, bytes, bytearray, memoryview)):
            # Not a list: its characters or bytes would silently become one value each.
            raise InvalidRecordError(f"from_pylist takes a list of values, not one "
                                     f"{type(values).__name__}")
        if not hasattr(values, "__len__"):
            if not isinstance(values, Iterable):
                raise InvalidRecordError(f"from_pylist takes a list of values, not "
                                         f"{type(values).__name__}")
            values = list(values)  # a generator
        n = len(values)
        valid = np.ones(n, dtype=np.bool_)
        parts = []
        lengths = np.zeros(n + 1, dtype=np.int64)
        for i, v in enumerate(values):
            if v is None:
                valid[i] = False
                continue
            if isinstance(v, str):
                try:
                    v = v.encode("utf-8")
                except UnicodeEncodeError as e:  # a lone surrogate
                    raise InvalidRecordError(f"value {i} is not valid UTF-8 text: {e}") from None
            elif not isinstance(v, (bytes, bytearray, memoryview)):
                raise InvalidRecordError(
                    f"value {i} must be bytes, str or None, not {type(v).__name__}")
            parts.append(v)
            lengths[i + 1] = len(v)
        offsets = np.cumsum(lengths)
        data = np.frombuffer(b"".join(parts), dtype=np.uint8) if parts else _EMPTY_U8
        return cls(data, offsets, valid)

    @classmethod
    def from_fixed(cls, matrix: np.ndarray) -> "BinaryColumn":
        """Every row of a 2-d uint8 array (or 1-d ``S<n>`` array) as one value; no nulls."""
        arr = np.ascontiguousarray(matrix)
        if arr.dtype.kind == "S":
            if arr.ndim != 1:
                raise InvalidRecordError(f"from_fixed needs a 1-d S<n> array, not {arr.ndim}-d")
            width = arr.dtype.itemsize
            n = arr.shape[0]
            data = arr.view(np.uint8).reshape(-1)
        else:
            # Only bytes: casting wider ints to uint8 would keep each value's low byte.
            if arr.ndim != 2 or arr.dtype not in (np.uint8, np.int8):
                raise InvalidRecordError(f"from_fixed needs a 2-d uint8 array or an S<n> array, "
                                         f"not a {arr.ndim}-d {arr.dtype} array")
            n, width = arr.shape
            data = arr.view(np.uint8).reshape(-1)
        offsets = np.arange(n + 1, dtype=np.int64) * width
        return cls(data, offsets, np.ones(n, dtype=np.bool_))

    def to_arrow(self, large: bool = True):
        """A ``pyarrow`` (large_)binary array over the same memory (int32 offsets if not large)."""
        import pyarrow as pa

        n = len(self)
        if self.offsets[0] < 0 or self.offsets[-1] > len(self.data):
            # pyarrow raised ArrowInvalid ("Length spanned by binary offsets ... larger").
            raise InvalidRecordError("BinaryColumn.offsets point outside its data")
        validity = None
        if not bool(self.valid.all()):
            validity = pa.py_buffer(np.packbits(self.valid, bitorder="little"))
        if large:
            offsets = self.offsets
            typ = pa.large_binary()
        else:
            if n and self.offsets[-1] > np.iinfo(np.int32).max:
                raise InvalidRecordError("column exceeds 2 GiB; binary with 32-bit offsets cannot hold it")
            offsets = self.offsets.astype(np.int32)
            typ = pa.binary()
        return pa.Array.from_buffers(
            typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(self.data)])


@dataclass(frozen=True, eq=False)
class HeaderColumn:
    """Record headers in Arrow's ``list<struct<key: string, value: binary>>`` layout.

    Record ``i`` owns header entries ``offsets[i]:offsets[i + 1]`` of ``keys`` / ``values``.
    """

    offsets: np.ndarray
    keys: BinaryColumn
    values: BinaryColumn

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def filter(self, keep: np.ndarray) -> "HeaderColumn":
        """The headers of the records where the bool array ``keep`` is True."""
        keep = _keep_argument(keep, len(self))
        counts = np.diff(self.offsets)
        entries = np.repeat(keep, counts)
        offsets = np.zeros(int(keep.sum()) + 1, dtype=self.offsets.dtype)
        np.cumsum(counts[keep], out=offsets[1:])
        return HeaderColumn(offsets, self.keys.filter(entries), self.values.filter(entries))

    def to_pylist(self) -> list:
        """Per record, a list of ``(str key, bytes-or-None value)`` tuples."""
        ks = [k.decode("utf-8", "replace") for k in self.keys.to_pylist()]
        vs = self.values.to_pylist()
        offs = self.offsets.tolist()
        return [list(zip(ks[offs[i]:offs[i + 1]], vs[offs[i]:offs[i + 1]])) for i in range(len(self))]

    def to_arrow(self, large: bool = True, null_when_empty: bool = False):
        """``list<struct<key: string, value: binary>>`` as Spark's Kafka source types it.

        ``null_when_empty`` gives a record without headers a null cell instead of an empty
        list, as Spark's Kafka source does."""
        import pyarrow as pa

        key_bin = self.keys.to_arrow(large=False)
        keys = pa.Array.from_buffers(pa.string(), len(key_bin), key_bin.buffers())
        values = self.values.to_arrow(large=False)
        structs = pa.StructArray.from_arrays([keys, values], names=["key", "value"])
        offsets = pa.array(self.offsets.astype(np.int32))
        if null_when_empty:
            empty = pa.array(np.diff(self.offsets) == 0)
            return pa.ListArray.from_arrays(offsets, structs, mask=empty)
        return pa.ListArray.from_arrays(offsets, structs)


@dataclass(frozen=True, eq=False)
class RecordColumns:
    """A range of records as columns (what ``read_columns`` returns).

    ``offsets`` and ``timestamps_ms`` are int64, ``timestamp_types`` int8 (0 CreateTime,
    1 LogAppendTime), ``keys`` and ``values`` are :class:`BinaryColumn`, ``headers`` is a
    :class:`HeaderColumn` when asked for, else None.
    """

    offsets: np.ndarray
    timestamps_ms: np.ndarray
    timestamp_types: np.ndarray
    keys: BinaryColumn
    values: BinaryColumn
    headers: Optional[HeaderColumn] = None
    topic: Optional[str] = None
    partition: Optional[int] = None

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        """Bytes held by every array of the result."""
        n = (self.offsets.nbytes + self.timestamps_ms.nbytes + self.timestamp_types.nbytes
             + self.keys.nbytes + self.values.nbytes)
        if self.headers is not None:
            n += self.headers.offsets.nbytes + self.headers.keys.nbytes + self.headers.values.nbytes
        return n

    def filter(self, keep: np.ndarray) -> "RecordColumns":
        """The records where the bool array ``keep`` is True (numpy's boolean indexing, applied
        to every column)."""
        keep = _keep_argument(keep, len(self))
        return RecordColumns(
            self.offsets[keep], self.timestamps_ms[keep], self.timestamp_types[keep],
            self.keys.filter(keep), self.values.filter(keep),
            None if self.headers is None else self.headers.filter(keep),
            self.topic, self.partition)

    def to_arrow(self, spark: bool = False):
        """A ``pyarrow.RecordBatch``.

        With ``spark=True`` the columns, names and types are exactly Spark's Kafka source schema:
        key/value binary (32-bit offsets), topic string, partition int32, offset int64,
        timestamp ``timestamp[us, UTC]``, timestampType int32, and headers when present (null
        for a record without headers, as in Spark).
        """
        import pyarrow as pa

        n = len(self)
        if not spark:
            arrays = [pa.array(self.offsets), pa.array(self.timestamps_ms), pa.array(self.timestamp_types),
                      self.keys.to_arrow(), self.values.to_arrow()]
            names = ["offset", "timestamp_ms", "timestamp_type", "key", "value"]
            if self.headers is not None:
                arrays.append(self.headers.to_arrow())
                names.append("headers")
            return pa.RecordBatch.from_arrays(arrays, names=names)
        topic = pa.repeat(pa.scalar(self.topic, pa.string()), n)  # one C loop, no Python list
        ts = self.timestamps_ms
        if n and (int(ts.max()) > _MAX_MS_AS_US or int(ts.min()) < -_MAX_MS_AS_US):
            # Microseconds would wrap around int64 (Spark's Kafka source fails here too).
            i = int(np.flatnonzero((ts > _MAX_MS_AS_US) | (ts < -_MAX_MS_AS_US))[0])
            raise InvalidRecordError(
                f"the record at offset {int(self.offsets[i])} of {self.topic}-{self.partition} "
                f"has timestamp {int(ts[i])} ms, beyond what Spark's microsecond timestamps "
                f"can hold")
        arrays = [
            self.keys.to_arrow(large=False),
            self.values.to_arrow(large=False),
            topic,
            pa.array(np.full(n, -1 if self.partition is None else self.partition, dtype=np.int32)),
            pa.array(self.offsets),
            pa.array(self.timestamps_ms * 1000, type=pa.timestamp("us", tz="UTC")),
            pa.array(self.timestamp_types.astype(np.int32)),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.headers is not None:
            arrays.append(self.headers.to_arrow(null_when_empty=True))
            names.append("headers")
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def to_records(self) -> Iterable[tuple]:
        """``(offset, timestamp_ms, key, value)`` tuples, for tests and small ranges."""
        return zip(self.offsets.tolist(), self.timestamps_ms.tolist(),
                   self.keys.to_pylist(), self.values.to_pylist())


def _describe(a) -> str:
    if isinstance(a, np.ndarray):
        return f"a {a.ndim}-d {'' if a.flags.c_contiguous else 'non-contiguous '}{a.dtype} array"
    return type(a).__name__


def _keep_argument(keep, n: int) -> np.ndarray:
    keep = np.asarray(keep)
    if keep.dtype != np.bool_ or keep.shape != (n,):
        raise InvalidRecordError(f"filter takes a bool array of {n} values, got "
                                 f"{keep.dtype} of shape {keep.shape}")
    return keep
