"""Tests for segstore.compression: framing byte by byte, round trips, oracles, damaged input."""

from __future__ import annotations

import gzip
import math
import mmap
import os
import struct
import tempfile

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segstore import compression
from segstore.compression import codec_id, codec_name, compress, decompress
from segstore.errors import CorruptRecordError, InvalidConfigError, UnsupportedCompressionError
from segstore.records import CompressionType

CODECS = [0, 1, 2, 3, 4]
KIB = 1024
XERIAL_MAGIC = bytes.fromhex("82534e4150505900")
LZ4_MAGIC = bytes.fromhex("04224d18")


def examples(n: int) -> int:
    """At least ``n`` hypothesis examples (cheap here), more under a bigger profile (conftest)."""
    return max(n, settings.default.max_examples)


# --- an independent xxHash32 (reference: the xxHash spec), for hand-built LZ4 frames --------------

def xxh32(data: bytes, seed: int = 0) -> int:
    p1, p2, p3, p4, p5, m = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & m

    n, i = len(data), 0
    if n >= 16:
        v = [(seed + p1 + p2) & m, (seed + p2) & m, seed, (seed - p1) & m]
        while i + 16 <= n:
            for k in range(4):
                lane = int.from_bytes(data[i:i + 4], "little")
                v[k] = rotl((v[k] + lane * p2) & m, 13) * p1 & m
                i += 4
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
    else:
        h = (seed + p5) & m
    h = (h + n) & m
    while i + 4 <= n:
        h = rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & m, 17) * p4 & m
        i += 4
    while i < n:
        h = rotl((h + data[i] * p5) & m, 11) * p1 & m
        i += 1
    h = ((h ^ (h >> 15)) * p2) & m
    h = ((h ^ (h >> 13)) * p3) & m
    return h ^ (h >> 16)


def test_reference_xxh32_known_vectors():
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"abc") == 0x32D153FF
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


def test_reference_xxh32_agrees_with_liblz4_header_checksums():
    # cramjam's (liblz4's) own frame headers carry checksums we can recompute.
    comp = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
    comp.compress(b"x" * 100)
    header = bytes(comp.finish())[:7]
    assert header[6] == (xxh32(header[4:6]) >> 8) & 0xFF
    header = bytes(cramjam.lz4.compress(b"x" * 100))[:7]
    assert header[6] == (xxh32(header[4:6]) >> 8) & 0xFF


def test_kafka_lz4_header_checksum_constants():
    assert (xxh32(b"\x60\x40") >> 8) & 0xFF == 0x82  # what we write
    assert (xxh32(LZ4_MAGIC + b"\x60\x40") >> 8) & 0xFF == 0x1A  # magic 0 (KIP-57 bug)


@pytest.mark.parametrize("n", range(16))
def test_module_xxh32_matches_reference(n):
    data = os.urandom(n)
    assert compression._xxh32(data) == xxh32(data)
    assert compression._xxh32(memoryview(data)) == xxh32(data)


def lz4_frame(chunks, flg=0x60, bd=0x40, hc=None, content_size=None, end=True, raw_blocks=False):
    """Build an LZ4 frame by hand, honouring FLG's checksum and content-size bits."""
    desc = bytes([flg, bd]) + (struct.pack("<Q", content_size) if flg & 0x08 else b"")
    out = [LZ4_MAGIC, desc, bytes([(xxh32(desc) >> 8) & 0xFF if hc is None else hc])]
    for chunk in chunks:
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if raw_blocks or len(block) >= len(chunk):
            out += [struct.pack("<I", len(chunk) | 0x80000000), chunk]
            block = chunk
        else:
            out += [struct.pack("<I", len(block)), block]
        if flg & 0x10:
            out.append(struct.pack("<I", xxh32(block)))
    if end:
        out.append(b"\0\0\0\0")
    if flg & 0x04:
        out.append(struct.pack("<I", xxh32(b"".join(chunks))))
    return b"".join(out)


# --- codec ids and names --------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (None, 0), ("none", 0), ("NONE", 0), (0, 0), ("gzip", 1), ("GZip", 1), (1, 1),
    ("snappy", 2), (2, 2), ("lz4", 3), ("LZ4", 3), (3, 3), ("zstd", 4), ("ZSTD", 4), (4, 4),
    (CompressionType.NONE, 0), (CompressionType.GZIP, 1), (CompressionType.SNAPPY, 2),
    (CompressionType.LZ4, 3), (CompressionType.ZSTD, 4),
])
def test_codec_id(value, expected):
    result = codec_id(value)
    assert result == expected and type(result) is int


@pytest.mark.parametrize("value", ["brotli", "", "gzip2", 5, -1, 1.0, True, False, b"gzip",
                                   object()])
def test_codec_id_rejects(value):
    with pytest.raises(UnsupportedCompressionError) as info:
        codec_id(value)
    assert repr(value) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_codec_name():
    assert [codec_name(i) for i in CODECS] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert codec_name(CompressionType.LZ4) == "lz4"
    for bad in (5, -1, True, "gzip", None):
        with pytest.raises(UnsupportedCompressionError):
            codec_name(bad)
    for bad in (5, "gzip"):
        with pytest.raises(UnsupportedCompressionError):
            compress(bad, b"x")
        with pytest.raises(UnsupportedCompressionError):
            decompress(bad, b"x")


# --- round trips ----------------------------------------------------------------------------------

def compressible(n: int) -> bytes:
    line = b'{"user": 12345, "name": "user-12345", "ok": true}\n'
    return (line * (n // len(line) + 1))[:n]


SIZES = [0, 1, 100, 32 * KIB - 1, 32 * KIB, 32 * KIB + 1, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1,
         300 * KIB]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["random", "compressible"])
def test_round_trip(codec, size, kind):
    data = os.urandom(size) if kind == "random" else compressible(size)
    packed = compress(codec, data)
    assert type(packed) is bytes
    result = decompress(codec, packed)
    assert type(result) is bytes and result == data
    assert decompress(codec, bytearray(packed)) == data
    assert decompress(codec, memoryview(b"??" + packed + b"??")[2:-2]) == data


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_from_mmap_slice(codec):
    data = compressible(100 * KIB)
    packed = compress(codec, memoryview(b"!" + data)[1:])
    with tempfile.TemporaryFile() as f:
        f.write(b"header" + packed + b"trailer")
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)[6:6 + len(packed)]
            assert decompress(codec, view) == data
            view.release()  # decompress keeps no export alive: the mmap closes


@pytest.mark.parametrize("codec, levels", [(1, [-1, 1, 5, 9]), (3, [1, 3, 9, 10, 17]),
                                           (4, [-131072, -5, 1, 3, 19, 22])])
def test_levels(codec, levels):
    data = compressible(200 * KIB)
    for level in levels:
        assert decompress(codec, compress(codec, data, level)) == data


@pytest.mark.parametrize("codec, bad", [(1, 0), (1, 10), (1, -2), (3, 0), (3, 18), (4, 23),
                                        (4, -131073), (1, 5.0), (4, True)])
def test_level_out_of_range(codec, bad):
    with pytest.raises(InvalidConfigError):
        compress(codec, b"data", bad)


def test_levels_ignored_without_levels():
    assert decompress(2, compress(2, b"abc", 99)) == b"abc"
    assert compress(0, b"abc", 99) == b"abc"


def test_higher_levels_compress_better():
    data = compressible(300 * KIB) + os.urandom(100) + compressible(300 * KIB)
    assert len(compress(1, data, 9)) <= len(compress(1, data, 1))
    assert len(compress(4, data, 19)) <= len(compress(4, data, 1))


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=150_000))
def test_round_trip_hypothesis(codec, data):
    assert decompress(codec, compress(codec, data)) == data


@settings(max_examples=examples(50), deadline=None)
@given(codec=st.sampled_from([1, 2, 3, 4]), unit=st.binary(min_size=1, max_size=50),
       repeat=st.integers(1, 5000))
def test_round_trip_repetitive_hypothesis(codec, unit, repeat):
    data = unit * repeat
    assert decompress(codec, compress(codec, data)) == data


def test_none_codec_is_identity():
    assert compress(0, memoryview(b"abc")) == b"abc"
    assert decompress(0, bytearray(b"abc")) == b"abc"


def test_non_buffer_input_is_a_type_error():
    with pytest.raises(TypeError):
        compress(1, "text")
    with pytest.raises(TypeError):
        decompress(1, "text")


# --- framing, byte by byte ------------------------------------------------------------------------

def xerial_blocks(packed: bytes) -> list[bytes]:
    assert packed[:16] == XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01"
    blocks, pos = [], 16
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        assert 0 < length <= len(packed) - pos - 4
        blocks.append(packed[pos + 4:pos + 4 + length])
        pos += 4 + length
    assert pos == len(packed)
    return blocks


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["random", "compressible"])
def test_snappy_xerial_framing(size, kind):
    data = os.urandom(size) if kind == "random" else compressible(size)
    blocks = xerial_blocks(compress(2, data))
    assert len(blocks) == math.ceil(size / (32 * KIB))
    pieces = [bytes(cramjam.snappy.decompress_raw(b)) for b in blocks]
    assert all(len(p) == 32 * KIB for p in pieces[:-1])
    assert b"".join(pieces) == data


def lz4_blocks(packed: bytes) -> list[bytes]:
    """Parse our frame strictly (fixed header, no checksums, end mark last); return the blocks."""
    assert packed[:7] == bytes.fromhex("04224d18604082")
    assert packed[-4:] == b"\0\0\0\0"
    pieces, pos = [], 7
    while True:
        (size,) = struct.unpack_from("<I", packed, pos)
        pos += 4
        if size == 0:
            break
        length = size & 0x7FFFFFFF
        block = packed[pos:pos + length]
        assert 0 < length and len(block) == length
        if size & 0x80000000:
            pieces.append(block)
        else:
            out = bytearray(64 * KIB)
            pieces.append(bytes(out[:cramjam.lz4.decompress_block_into(block, out)]))
            assert length < len(pieces[-1])  # compressed blocks are only kept if smaller
        pos += length
    assert pos == len(packed)
    return pieces


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["random", "compressible"])
def test_lz4_kafka_framing(size, kind):
    data = os.urandom(size) if kind == "random" else compressible(size)
    packed = compress(3, data)
    pieces = lz4_blocks(packed)
    assert len(pieces) == math.ceil(size / (64 * KIB))
    assert all(len(p) == 64 * KIB for p in pieces[:-1])
    assert b"".join(pieces) == data
    if kind == "random" and size:  # incompressible blocks are stored with the high bit
        assert struct.unpack_from("<I", packed, 7)[0] & 0x80000000


def test_lz4_empty_frame_is_header_plus_end_mark():
    assert compress(3, b"") == bytes.fromhex("04224d18604082") + b"\0\0\0\0"


def test_gzip_framing():
    packed = compress(1, b"hello")
    assert packed[:4] == b"\x1f\x8b\x08\x00" and packed[4:8] == b"\0\0\0\0"  # deflate, mtime 0
    assert gzip.decompress(packed) == b"hello"


def test_zstd_framing():
    assert compress(4, b"hello")[:4] == bytes.fromhex("28b52ffd")


# --- independent oracles --------------------------------------------------------------------------

ORACLE_DATA = [b"x", compressible(1000), os.urandom(5000), compressible(300 * KIB),
               os.urandom(200 * KIB) + compressible(100 * KIB)]


@pytest.mark.parametrize("data", ORACLE_DATA, ids=lambda d: str(len(d)))
def test_aiokafka_decodes_ours(data):
    codec = pytest.importorskip("aiokafka.codec")
    assert codec.gzip_decode(compress(1, data)) == data
    assert codec.snappy_decode(compress(2, data)) == data
    assert codec.lz4_decode(compress(3, data)) == data
    assert codec.zstd_decode(compress(4, data)) == data


@pytest.mark.parametrize("data", [b""] + ORACLE_DATA, ids=lambda d: str(len(d)))
def test_we_decode_aiokafka(data):
    codec = pytest.importorskip("aiokafka.codec")
    assert decompress(1, codec.gzip_encode(data)) == data
    assert decompress(2, codec.snappy_encode(data)) == data
    assert decompress(2, codec.snappy_encode(data, xerial_blocksize=1000)) == data
    assert decompress(2, codec.snappy_encode(data, xerial_compatible=False)) == data  # raw snappy
    assert decompress(3, codec.lz4_encode(data)) == data  # FLG 0x70: with block checksums
    assert decompress(4, codec.zstd_encode(data)) == data


@pytest.mark.parametrize("data", [b""] + ORACLE_DATA, ids=lambda d: str(len(d)))
def test_kafka_python_gzip(data):
    codec = pytest.importorskip("kafka.codec")
    assert codec.gzip_decode(compress(1, data)) == data
    assert decompress(1, codec.gzip_encode(data)) == data


def test_stdlib_gzip_interop():
    data = compressible(100 * KIB)
    for level in (1, 6, 9):
        assert gzip.decompress(compress(1, data, level)) == data
    two_members = gzip.compress(data[:10]) + gzip.compress(data[10:])
    assert decompress(1, two_members) == data


def test_raw_snappy_without_xerial_header():
    data = compressible(100 * KIB)
    assert decompress(2, bytes(cramjam.snappy.compress_raw(data))) == data
    assert decompress(2, bytes(cramjam.snappy.compress_raw(b""))) == b""


def test_snappy_concatenated_xerial_streams():
    data = b"abc" * 20000
    assert decompress(2, compress(2, data) + compress(2, b"def")) == data + b"def"


def test_zstd_multiple_frames():
    assert decompress(4, compress(4, b"abc") + compress(4, b"def")) == b"abcdef"


def test_zstd_is_illegal_before_magic_2():
    packed = compress(4, b"abc")
    for magic in (0, 1):
        with pytest.raises(CorruptRecordError, match="magic"):
            decompress(4, packed, magic=magic)


# --- hand-built LZ4 frames ------------------------------------------------------------------------

CHUNKS = [compressible(64 * KIB), os.urandom(1000), compressible(5000)]
CHUNKS_DATA = b"".join(CHUNKS)


@pytest.mark.parametrize("flg", [0x60, 0x64, 0x68, 0x70, 0x7C])
@pytest.mark.parametrize("bd", [0x40, 0x50, 0x60, 0x70])
def test_lz4_frame_options_decode(flg, bd):
    frame = lz4_frame(CHUNKS, flg=flg, bd=bd, content_size=len(CHUNKS_DATA))
    assert decompress(3, frame) == CHUNKS_DATA
    assert decompress(3, frame, magic=0) == CHUNKS_DATA


def test_lz4_stored_blocks_and_concatenated_frames():
    frame = lz4_frame(CHUNKS, raw_blocks=True)
    assert decompress(3, frame + compress(3, b"tail")) == CHUNKS_DATA + b"tail"


def test_lz4_magic0_wrong_header_checksum():
    # Kafka 0.8/0.9 hashed magic+FLG+BD (KIP-57): accepted for magic 0 only, as Kafka does.
    old = lz4_frame(CHUNKS, hc=(xxh32(LZ4_MAGIC + b"\x60\x40") >> 8) & 0xFF)
    assert decompress(3, old, magic=0) == CHUNKS_DATA
    assert decompress(3, old + old, magic=0) == CHUNKS_DATA * 2
    for magic in (1, 2):
        with pytest.raises(CorruptRecordError, match="lz4"):
            decompress(3, old, magic=magic)


@pytest.mark.parametrize("frame, match", [
    (lz4_frame(CHUNKS, flg=0x40), "dependent blocks"),
    (lz4_frame(CHUNKS, flg=0x20), "version"),          # version bits 00
    (lz4_frame(CHUNKS, flg=0xA0), "version"),          # version bits 10
    (lz4_frame(CHUNKS, flg=0x61), "reserved"),         # dictionary id / reserved bit
    (lz4_frame(CHUNKS, flg=0x62), "reserved"),
    (lz4_frame(CHUNKS, bd=0x30), "reserved"),          # block max id 3
    (lz4_frame(CHUNKS, bd=0xC0), "reserved"),          # reserved high bit
    (lz4_frame(CHUNKS, bd=0x41), "reserved"),
    (lz4_frame([os.urandom(70000)], bd=0x40), "size"),  # block larger than BD allows
    (lz4_frame(CHUNKS, end=False), "end mark"),
    (lz4_frame(CHUNKS, flg=0x64)[:-1] + bytes([lz4_frame(CHUNKS, flg=0x64)[-1] ^ 1]), "lz4"),
    (lz4_frame(CHUNKS, flg=0x68, content_size=5), "lz4"),  # wrong content size
    (lz4_frame(CHUNKS, hc=0x00), "lz4"),               # bad header checksum, magic 2
    (b"\x50\x2a\x4d\x18\x02\x00\x00\x00ab" + lz4_frame(CHUNKS), "magic"),  # skippable frame
    (lz4_frame(CHUNKS) + b"x", "magic"),               # trailing garbage
    (LZ4_MAGIC + b"\x60\x40\x82\x00\x00\x00\x80\x00\x00\x00\x00", "size"),  # 0x80000000 block
    (b"", "empty"),
])
def test_lz4_bad_frames(frame, match):
    with pytest.raises(CorruptRecordError, match=match):
        decompress(3, frame)


# --- damaged input: CorruptRecordError or some output, never anything else ------------------------

def bad_snappy_inputs():
    valid = compress(2, compressible(50 * KIB))
    return [
        b"", XERIAL_MAGIC, XERIAL_MAGIC + b"\0\0\0\1\0\0\0\1\0\0",
        valid[:16] + struct.pack(">i", -5) + valid[20:],
        valid[:16] + struct.pack(">i", 10**6) + valid[20:],
        valid[:16] + struct.pack(">i", 0),
        b"\xff\xff\xff\xff\x0f\x00",  # raw block claiming 4 GiB: cramjam would abort the process
        b"\xff\xff\xff\xff\xff\xff",  # overlong varint
        valid[:16] + b"\0\0\0\6\xff\xff\xff\xff\x0f\x00",
    ]


@pytest.mark.parametrize("data", bad_snappy_inputs())
def test_snappy_bad_inputs(data):
    with pytest.raises(CorruptRecordError, match="snappy"):
        decompress(2, data)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_empty_and_garbage_inputs(codec):
    for data in (b"", b"\0", b"garbage" * 10, os.urandom(1000)):
        try:
            decompress(codec, data)
        except CorruptRecordError as exc:
            assert str(exc).startswith(codec_name(codec))
    for data in (b"", b"garbage" * 10):
        if codec != 2:  # a raw snappy block can be valid garbage
            with pytest.raises(CorruptRecordError):
                decompress(codec, data)


@pytest.mark.parametrize("codec", [1, 3, 4])
def test_truncations_raise(codec):
    packed = compress(codec, compressible(100 * KIB) + os.urandom(1000))
    for cut in range(0, len(packed), max(1, len(packed) // 300)):
        with pytest.raises(CorruptRecordError):
            decompress(codec, packed[:cut])


DAMAGE_SOURCES = [b"", b"a", compressible(3000), os.urandom(3000), compressible(70 * KIB)]


@settings(max_examples=examples(600), deadline=None)
@given(codec=st.sampled_from([1, 2, 3, 4]), source=st.sampled_from(DAMAGE_SOURCES),
       magic=st.sampled_from([0, 1, 2]), cut=st.integers(0, 10**6),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), max_size=4))
def test_damage_never_escapes(codec, source, magic, cut, flips):
    packed = bytearray(compress(codec, source))
    for pos, bit in flips:
        packed[pos % len(packed)] ^= 1 << bit
    del packed[cut % (len(packed) + 1):]
    try:
        result = decompress(codec, bytes(packed), magic=magic)
    except CorruptRecordError as exc:
        assert str(exc).startswith(codec_name(codec)), exc
    else:
        assert type(result) is bytes


@settings(max_examples=examples(300), deadline=None)
@given(codec=st.sampled_from([1, 2, 3, 4]), data=st.binary(max_size=300))
def test_random_bytes_never_escape(codec, data):
    header = {2: XERIAL_MAGIC + b"\0\0\0\1\0\0\0\1", 3: lz4_frame([])[:7]}.get(codec, b"")
    for candidate in (data, header + data):  # also past a valid xerial / lz4 header
        try:
            decompress(codec, candidate)
        except CorruptRecordError:
            pass


def test_rust_panics_become_corrupt_record_errors(monkeypatch):
    class PanicException(BaseException):  # what pyo3 raises when Rust code panics
        pass

    def panic(data):
        raise PanicException("index out of bounds")

    monkeypatch.setattr(cramjam.gzip, "decompress", panic)
    with pytest.raises(CorruptRecordError, match="gzip .*index out of bounds"):
        decompress(1, b"x")

    def interrupt(data):
        raise KeyboardInterrupt

    monkeypatch.setattr(cramjam.gzip, "decompress", interrupt)
    with pytest.raises(KeyboardInterrupt):
        decompress(1, b"x")


@pytest.mark.parametrize("codec,key,low,high", [("gzip", "compression.gzip.level", 1, 9),
                                                ("zstd", "compression.zstd.level", -5, 19)])
def test_a_topics_compression_level_is_used(tmp_path, codec, key, low, high):
    """compression.<codec>.level sets the level of the batches the log compresses (it was
    validated and never read); the batches still decode to the same records. (lz4's level is
    passed too, but cramjam 2.14's block compressor gives the same bytes at every level.)"""
    import segstore

    values = [(b"segstore %d " % i) * 20 for i in range(300)]
    sizes = {}
    with segstore.open(str(tmp_path / "s")) as store:
        for level in (low, high):
            name = f"t{level}".replace("-", "m")
            store.create_topic(name, config={"compression.type": codec, key: level})
            lg = store.partition(name, 0)
            lg.append_batch(values)
            sizes[level] = lg.size_bytes
            assert [r.value for r in lg.read(0)] == values
    assert sizes[low] != sizes[high]
