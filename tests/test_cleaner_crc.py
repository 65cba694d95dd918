"""The cleaner's CRC-32C routine (segstore._core, _hash.pxi): segstore's AVX-512 VPCLMULQDQ
folding where the CPU has it, else the crc32c package's C routine. Oracle: ``crc32c.crc32c``."""

from __future__ import annotations

import os
import random

import crc32c
import pytest

from segstore import _core

HAVE_VECTOR = _core._crc32c_vector(b"") is not None
vector_only = pytest.mark.skipif(not HAVE_VECTOR, reason="the CPU lacks AVX-512 VPCLMULQDQ")


def test_the_bound_routine_is_named():
    assert _core.crc32c_routine() in ("vector", "package")
    assert _core.crc32c_without_gil()
    if HAVE_VECTOR:
        assert _core.crc32c_routine() == "vector"


@vector_only
def test_vector_crc_of_every_length_and_alignment():
    """Every path of the folding (256-byte blocks, 64-byte and 16-byte tails, the CRC32
    instruction's last bytes) for every length up to 1,100 at four alignments."""
    data = os.urandom(1200)
    for n in range(0, 1101):
        for off in (0, 1, 7, 63):
            chunk = data[off:off + n]
            assert _core._crc32c_vector(chunk) ^ 0xFFFFFFFF == crc32c.crc32c(chunk), (n, off)


@vector_only
def test_vector_crc_chains_from_any_state():
    """The state in and out is raw (no inversion), like the package's routine: CRCs of pieces
    chain into the CRC of the whole."""
    rnd = random.Random(5)
    data = os.urandom(300_000)
    for _ in range(50):
        cut = rnd.randrange(len(data))
        state = _core._crc32c_vector(data[:cut])
        assert _core._crc32c_vector(data[cut:], state) ^ 0xFFFFFFFF == crc32c.crc32c(data)
    for state in (0, 1, 0xFFFFFFFF, 0x80000000, rnd.getrandbits(32)):
        n = rnd.randrange(2000)
        chunk = data[:n]
        want = crc32c.crc32c(chunk, state ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
        assert _core._crc32c_vector(chunk, state) == want


@vector_only
def test_vector_crc_of_large_buffers():
    for n in (256, 4096, 126_973, 1 << 20, (1 << 20) + 77):
        data = os.urandom(n)
        assert _core._crc32c_vector(data) ^ 0xFFFFFFFF == crc32c.crc32c(data)


@pytest.mark.parametrize("vector", [True, False])
def test_batches_validate_and_rebuilt_crcs_agree_on_both_c_routines(vector):
    """Binding the package's routine instead (``vector=False``) changes nothing visible:
    batch CRCs validate and ``finish_crcs`` writes the package's CRC."""
    try:
        assert _core._bind_crc32c(vector=vector)
        assert _core.crc32c_routine() == ("vector" if vector and HAVE_VECTOR else "package")
        batches = [bytes(_core.encode_batch([os.urandom(50 + i) for i in range(30)],
                                            keys=[b"k%d" % i for i in range(30)],
                                            timestamps_ms=1, base_offset=30 * j))
                   for j in range(4)]
        buf = bytearray(b"".join(batches))
        assert len(_core.scan_batches(buf, validate_crc=True).batches) == 4
        pos = 0
        for b in batches:                 # zero every CRC, let finish_crcs recompute them
            buf[pos + 17:pos + 21] = b"\0\0\0\0"
            pos += len(b)
        _core.finish_crcs(buf, 0, len(buf))
        assert bytes(buf) == b"".join(batches)
        with pytest.raises(ValueError):
            _core.finish_crcs(buf, 0, len(buf) + 1)
        with pytest.raises(ValueError):
            _core.finish_crcs(buf, 0, len(buf) - 1)     # ends inside the last batch
    finally:
        assert _core._bind_crc32c()


def test_finish_crcs_on_the_python_path():
    try:
        _core._unbind_crc32c()
        assert _core.crc32c_routine() == "python"
        b = bytes(_core.encode_batch([b"x" * 100], keys=[b"k"], timestamps_ms=1))
        buf = bytearray(b)
        buf[17:21] = b"\0\0\0\0"
        _core.finish_crcs(buf, 0, len(buf))
        assert bytes(buf) == b
    finally:
        assert _core._bind_crc32c()
