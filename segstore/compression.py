"""Compression codecs with Kafka's exact framing (REF §1.9), over ``cramjam``.

Codec ids are the attribute bits 0-2 of a batch: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

* gzip: a plain RFC 1952 stream (written with stdlib ``zlib``, measured ~2x faster than
  ``cramjam.gzip`` at level 6; read with ``cramjam.gzip``, which also reads concatenated members).
* snappy: snappy-java's "xerial" stream framing, NOT raw snappy and NOT the official framing
  format (``cramjam.snappy.compress``). Raw snappy is still read, as snappy-java does.
* lz4: an LZ4 frame with independent 64 KiB blocks, built by hand because
  ``cramjam.lz4.compress`` writes linked blocks + content checksum (FLG 0x54), which Kafka rejects.
* zstd: standard zstd frames.

Both functions return ``bytes``: cramjam's ``Buffer`` does not compare equal to ``bytes``, and the
one copy out of it costs a few percent of the decode time.
"""

from __future__ import annotations

import operator
import struct
import zlib

import cramjam

from segstore.errors import (BufferTypeError, CorruptRecordError, InvalidConfigError,
                             UnsupportedCompressionError)

__all__ = ["codec_id", "codec_name", "compress", "decompress"]

_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
# Kafka's valid level ranges and defaults (KIP-390); none and snappy have no levels.
_LEVELS = {1: (1, 9, 6), 3: (1, 17, 9), 4: (-131072, 22, 3)}

_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)  # magic, version 1, min-compatible 1
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size (input bytes per block)
# A snappy element expands at most 64/3-fold (3-byte copy -> 64 bytes): any larger claimed length
# is corrupt. Checked before cramjam allocates it: a bogus 4 GiB claim aborts the process.
_SNAPPY_MAX_RATIO = 22

_LZ4_MAGIC = b"\x04\x22\x4d\x18"  # 0x184D2204 little-endian
# FLG 0x60 = version 01 + independent blocks; BD 0x40 = 64 KiB blocks; 0x82 = (xxh32(60 40) >> 8).
_LZ4_HEADER = _LZ4_MAGIC + b"\x60\x40\x82"
_LZ4_BLOCK = 64 * 1024
_LZ4_UNCOMPRESSED = 0x80000000  # block-size high bit: block stored as is
_LZ4_END_MARK = b"\x00\x00\x00\x00"


def codec_id(codec) -> int:
    """Return the codec id (0-4) of ``codec``.

    Accepts ``None``, a name (``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"``, ``"zstd"``, in any
    case), an id 0-4 or a :class:`segstore.records.CompressionType`. Anything else raises
    :class:`~segstore.errors.UnsupportedCompressionError`.
    """
    if codec is None:
        return 0
    if isinstance(codec, str):
        name = codec.strip().lower()
        if name in _NAMES:
            return _NAMES.index(name)
    elif not isinstance(codec, bool):  # True would otherwise pass as gzip
        try:
            value = operator.index(codec)  # int, CompressionType, numpy integers
        except TypeError:
            value = -1
        if 0 <= value < len(_NAMES):
            return value
    raise UnsupportedCompressionError(
        f"unsupported compression codec {codec!r}: expected none, gzip, snappy, lz4, zstd or 0-4")


def codec_name(codec_id: int) -> str:
    """Return the name (``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"``, ``"zstd"``) of a codec id.

    An unknown id raises :class:`~segstore.errors.UnsupportedCompressionError`.
    """
    if isinstance(codec_id, bool) or not isinstance(codec_id, int) or not 0 <= codec_id <= 4:
        raise UnsupportedCompressionError(f"unsupported compression codec id {codec_id!r}")
    return _NAMES[codec_id]


def _byte_view(data) -> memoryview:
    """``data`` as a flat byte view; BufferTypeError (a TypeError) when it is not a contiguous
    bytes-like object."""
    try:
        view = memoryview(data)
    except TypeError:
        raise BufferTypeError(f"data must be a bytes-like object, not "
                              f"{type(data).__name__}") from None
    if not view.c_contiguous:
        raise BufferTypeError(f"data must be a contiguous buffer, got strides {view.strides}")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def compress(codec_id: int, data, level: int | None = None) -> bytes:
    """Compress ``data`` (any bytes-like object) the way Kafka frames codec ``codec_id``.

    ``level`` defaults to Kafka's default (gzip 6, lz4 9, zstd 3); Kafka's ranges apply (gzip 1-9,
    lz4 1-17, zstd -131072..22) and an out-of-range level raises
    :class:`~segstore.errors.InvalidConfigError`. none and snappy have no levels and ignore it.
    Returns ``bytes``.
    """
    codec_name(codec_id)  # rejects unknown ids
    level = _check_level(codec_id, level)
    with _byte_view(data) as view:
        if codec_id == 0:
            return bytes(view)
        if codec_id == 1:
            # wbits=31: gzip header (mtime 0) + deflate + CRC-32/size trailer.
            gz = zlib.compressobj(level, zlib.DEFLATED, 31)
            return gz.compress(view) + gz.flush()
        if codec_id == 2:
            parts = [_XERIAL_HEADER]
            for start in range(0, len(view), _XERIAL_BLOCK):
                block = cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK])
                parts += (struct.pack(">i", len(block)), block)
            return b"".join(parts)
        if codec_id == 3:
            return _lz4_compress(view, level)
        return bytes(cramjam.zstd.compress(view, level=level))


def decompress(codec_id: int, data, *, magic: int = 2) -> bytes:
    """Decompress one Kafka-framed payload of codec ``codec_id`` and return ``bytes``.

    ``data`` is any contiguous bytes-like object (bytes, bytearray, a memoryview slice of an mmap);
    it is not copied except to fix a magic-0 lz4 header. ``magic`` is the batch's magic: magic 0
    lz4 frames carry Kafka's historically wrong header checksum (KIP-57), which is accepted, and
    zstd is only legal with magic 2. Malformed or truncated input raises
    :class:`~segstore.errors.CorruptRecordError` and nothing else (an object that is not a
    contiguous bytes-like object is a :class:`~segstore.errors.BufferTypeError`, a ``TypeError``).
    """
    name = codec_name(codec_id)
    with _byte_view(data) as view:
        try:
            if codec_id == 0:
                return bytes(view)
            if codec_id == 1:
                return bytes(cramjam.gzip.decompress(view))
            if codec_id == 2:
                return _snappy_decompress(view)
            if codec_id == 3:
                return _lz4_decompress(view, magic)
            if magic < 2:
                raise CorruptRecordError(f"zstd compression is not allowed with magic {magic}")
            return bytes(cramjam.zstd.decompress(view))
        except CorruptRecordError:
            raise
        except BaseException as exc:  # cramjam.DecompressionError, or a Rust panic: pyo3's
            # PanicException derives from BaseException. Interrupts and exits pass through.
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            raise CorruptRecordError(f"{name} compressed data is corrupt: {exc}") from exc


def _check_level(codec_id: int, level):
    """Return the level to use: Kafka's default for ``codec_id``, or ``level`` once checked."""
    if codec_id not in _LEVELS:
        return None
    low, high, default = _LEVELS[codec_id]
    if level is None or (codec_id == 1 and level == -1):  # -1 = Deflater default, like Kafka
        return default
    if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= high:
        raise InvalidConfigError(
            f"{_NAMES[codec_id]} compression level must be in {low}..{high}, got {level!r}")
    return level


def _snappy_decompress(view: memoryview) -> bytes:
    """Read snappy-java's xerial stream framing, or, without its magic, one raw snappy block."""
    if view[:8] != _XERIAL_HEADER[:8]:
        return bytes(_snappy_raw(view))
    parts, pos, end = [], 0, len(view)
    while pos < end:
        # A stream header: the first one, or that of a concatenated stream (snappy-java skips it).
        if view[pos:pos + 8] == _XERIAL_HEADER[:8]:
            if end - pos < 16:
                raise CorruptRecordError(f"snappy xerial header at byte {pos} is truncated")
            pos += 16
            continue
        if end - pos < 4:
            raise CorruptRecordError(f"snappy block length at byte {pos} is truncated")
        (length,) = struct.unpack_from(">i", view, pos)
        pos += 4
        if not 0 < length <= end - pos:
            raise CorruptRecordError(
                f"snappy block at byte {pos - 4} has length {length}, {end - pos} bytes remain")
        parts.append(_snappy_raw(view[pos:pos + length]))
        pos += length
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)


def _snappy_raw(block: memoryview):
    """Decompress one raw snappy block after checking its length preamble is plausible."""
    claimed, shift = 0, 0
    for i in range(min(5, len(block))):  # little-endian base-128 varint, at most 5 bytes
        claimed |= (block[i] & 0x7F) << shift
        shift += 7
        if block[i] < 0x80:
            break
    else:
        raise CorruptRecordError("snappy block has a truncated or overlong length preamble")
    if claimed > _SNAPPY_MAX_RATIO * len(block):
        raise CorruptRecordError(
            f"snappy block of {len(block)} bytes claims {claimed} uncompressed bytes")
    return cramjam.snappy.decompress_raw(block)


def _lz4_compress(view: memoryview, level: int) -> bytes:
    """Write Kafka's LZ4 frame: fixed header, independent blocks of <= 64 KiB input, end mark."""
    # Kafka uses lz4-java's fast compressor for the default level 9, the HC one otherwise.
    options = {} if level == 9 else {"mode": "high_compression", "compression": level}
    parts = [_LZ4_HEADER]
    for start in range(0, len(view), _LZ4_BLOCK):
        chunk = view[start:start + _LZ4_BLOCK]
        block = cramjam.lz4.compress_block(chunk, store_size=False, **options)
        if len(block) < len(chunk):
            parts += (struct.pack("<I", len(block)), block)
        else:  # compression did not help: store the chunk as is
            parts += (struct.pack("<I", len(chunk) | _LZ4_UNCOMPRESSED), chunk)
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)


def _lz4_decompress(view: memoryview, magic: int) -> bytes:
    """Check every frame's structure the way Kafka's reader does, then decode with cramjam.

    Kafka checks magic, version, reserved bits, independence and block sizes; liblz4 (inside
    cramjam) then verifies the header, block and content checksums and the content size. Magic 0
    frames get their header checksum rewritten first, since old Kafka computed it wrongly.
    """
    end, pos, fixes = len(view), 0, []
    if end == 0:
        raise CorruptRecordError("lz4 frame is empty")
    while pos < end:  # frame by frame: concatenated frames are accepted
        if end - pos < 7 or view[pos:pos + 4] != _LZ4_MAGIC:
            raise CorruptRecordError(f"lz4 frame at byte {pos}: bad or truncated magic/header")
        flg, bd = view[pos + 4], view[pos + 5]
        if flg >> 6 != 1 or flg & 0x03 or bd & 0x8F or not 4 <= bd >> 4 <= 7:
            raise CorruptRecordError(
                f"lz4 frame at byte {pos}: unsupported version or reserved bits "
                f"(FLG {flg:#04x}, BD {bd:#04x})")
        if not flg & 0x20:
            raise CorruptRecordError(f"lz4 frame at byte {pos}: dependent blocks are not supported")
        checksum_at = pos + 6 + (8 if flg & 0x08 else 0)  # optional 8-byte content size
        if checksum_at >= end:
            raise CorruptRecordError(f"lz4 frame at byte {pos}: truncated header")
        if magic == 0:
            fixes.append((checksum_at, (_xxh32(view[pos + 4:checksum_at]) >> 8) & 0xFF))
        pos, max_block = checksum_at + 1, 1 << (8 + 2 * (bd >> 4))
        block_checksum = 4 if flg & 0x10 else 0
        while True:
            if end - pos < 4:
                raise CorruptRecordError(f"lz4 block at byte {pos}: truncated (no end mark)")
            (size,) = struct.unpack_from("<I", view, pos)
            pos += 4
            if size == 0:  # end mark
                break
            size &= ~_LZ4_UNCOMPRESSED
            if not 0 < size <= max_block or end - pos < size + block_checksum:
                raise CorruptRecordError(
                    f"lz4 block at byte {pos - 4}: bad or truncated size {size}")
            pos += size + block_checksum
        pos += 4 if flg & 0x04 else 0  # content checksum
        if pos > end:
            raise CorruptRecordError("lz4 frame: truncated content checksum")
    if any(view[at] != value for at, value in fixes):
        fixed = bytearray(view)
        for at, value in fixes:
            fixed[at] = value
        view = memoryview(fixed)
    return bytes(cramjam.lz4.decompress(view))


def _xxh32(data) -> int:
    """xxHash32 with seed 0 of fewer than 16 bytes (enough for an LZ4 frame descriptor)."""
    p1, p2, p3, p4, p5, mask = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    h, i = (p5 + len(data)) & mask, 0
    while i + 4 <= len(data):
        h = rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & mask, 17) * p4 & mask
        i += 4
    for byte in data[i:]:
        h = rotl((h + byte * p5) & mask, 11) * p1 & mask
    h = ((h ^ (h >> 15)) * p2) & mask
    h = ((h ^ (h >> 13)) * p3) & mask
    return h ^ (h >> 16)
