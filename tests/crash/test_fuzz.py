"""Fuzzing the byte-level entry points and the loader with arbitrary and mutated bytes.

Arbitrary bytes, and valid segments mutated (bits flipped, bytes overwritten, inserted, deleted,
the file cut, two files spliced, CRCs recomputed afterwards so the record parser sees the damage
too), go to:

* the compiled scanner and decoders -- ``_core.scan_batches``, ``decode_records``,
  ``decode_columns``, ``decode_columns_multi`` -- and the index kernels ``index_lookup`` /
  ``index_check``: the only exception allowed is ``CorruptRecordError`` (``scan_batches`` with
  ``raise_on_corrupt=False`` raises nothing at all), and results keep their invariants;
* the loader: a partition directory built from those bytes as ``.log``, ``.index`` and
  ``.timeindex`` files, opened with ``segstore.open``. The open must succeed whatever the files
  hold -- recovering after an unclean shutdown (after which ``verify()`` is clean), trusting them
  after a clean one (after which ``verify()`` reports instead of raising) -- and reads may only
  raise ``CorruptRecordError`` / ``CorruptIndexError``; ``close()`` must succeed.

``make test`` runs this module a second time against the debug build of the core (bounds and
wraparound checks on), so an out-of-bounds access fails loudly instead of reading garbage.

Examples per test: hypothesis' profile count (CI: small); ``SEGSTORE_FUZZ_EXAMPLES=N`` sets every
test here to N examples (see docs/development.md for a million-input run).
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import tempfile
import traceback

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import segstore
from conftest import fix_crc, legacy_message, legacy_wrapper
from segstore import _core
from segstore.checkpoint import (CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT,
                                 OffsetCheckpointFile)
from segstore.errors import CorruptIndexError, CorruptRecordError
from segstore.index import OffsetIndex, TimeIndex
from segstore.records import TopicPartition

_ENV = int(os.environ.get("SEGSTORE_FUZZ_EXAMPLES", "0"))
ALLOWED = (CorruptRecordError, CorruptIndexError)


def fuzz(ci_examples: int):
    """Settings for one fuzz target: ``ci_examples`` by default, SEGSTORE_FUZZ_EXAMPLES if set."""
    return settings(max_examples=_ENV or ci_examples, deadline=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------------------------
# inputs


TS = st.integers(0, 2**42)
BLOB = st.one_of(st.none(), st.binary(max_size=64))


@st.composite
def v2_batch(draw, offset: int) -> tuple[bytes, int]:
    n = draw(st.integers(1, 5))
    values = draw(st.lists(BLOB, min_size=n, max_size=n))
    keys = draw(st.lists(BLOB, min_size=n, max_size=n))
    headers = draw(st.lists(st.lists(st.tuples(st.text(max_size=4), BLOB), max_size=2),
                            min_size=n, max_size=n))
    stamps = draw(st.lists(TS, min_size=n, max_size=n))
    data = _core.encode_batch(values, keys, headers, stamps, base_offset=offset,
                              compression=draw(st.sampled_from([0, 0, 1, 2, 3, 4])),
                              log_append_time_ms=draw(st.one_of(st.none(), TS)))
    return data, n


@st.composite
def segment_bytes(draw, base: int = 0) -> bytes:
    """A valid .log: v2 batches (any codec), transaction markers, legacy v0/v1 entries."""
    parts, offset = [], base
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["v2", "v2", "v2", "control", "legacy"]))
        if kind == "v2":
            data, n = draw(v2_batch(offset))
        elif kind == "control":
            data, n = _core.encode_control_batch(
                draw(st.sampled_from([0, 1])), producer_id=draw(st.integers(0, 2**40)),
                producer_epoch=1, base_offset=offset, timestamp_ms=draw(TS)), 1
        else:
            magic = draw(st.sampled_from([0, 1]))
            if draw(st.booleans()):
                data, n = legacy_message(magic, offset, b"k", draw(st.binary(max_size=20)),
                                         draw(TS)), 1
            else:
                recs = [(draw(TS), b"k%d" % i, b"v%d" % i) for i in range(3)]
                inner = list(range(offset, offset + 3)) if magic == 0 else [0, 1, 2]
                data, n = legacy_wrapper(magic, inner, recs, offset + 2), 3
        parts.append(data)
        offset += n
    return b"".join(parts)


MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**16), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 2**16), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 2**16), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 2**16), st.integers(1, 32)),
    st.tuples(st.just("cut"), st.integers(0, 2**16)),
    st.tuples(st.just("int32"), st.integers(0, 2**16),
              st.sampled_from([-1, 0, 1, 13, 14, 48, 49, 2**31 - 1, -2**31, 2**20])),
)


def mutate(data: bytes, mutations, fix_crcs: bool) -> bytes:
    b = bytearray(data)
    for m in mutations:
        if not b:
            break
        pos = m[1] % len(b)
        if m[0] == "flip":
            b[pos] ^= 1 << m[2]
        elif m[0] == "set":
            b[pos] = m[2]
        elif m[0] == "insert":
            b[pos:pos] = m[2]
        elif m[0] == "delete":
            del b[pos:pos + m[2]]
        elif m[0] == "cut":
            del b[pos:]
        elif m[0] == "int32" and pos + 4 <= len(b):
            struct.pack_into(">i", b, pos, m[2])
    if fix_crcs:  # make every v2 batch's CRC right again: the damage reaches the record parser
        pos = 0
        while len(b) - pos >= 17:
            size = 12 + struct.unpack_from(">i", b, pos + 8)[0]
            if size < 26 or pos + size > len(b):
                break
            if size >= 61 and b[pos + 16] == 2:
                fix_crc(b, pos)
            pos += size
    return bytes(b)


@st.composite
def log_bytes(draw) -> bytes:
    """Arbitrary bytes, or a valid segment mutated (sometimes with its CRCs fixed up)."""
    kind = draw(st.sampled_from(["random", "mutated", "mutated", "mutated", "spliced"]))
    if kind == "random":
        return draw(st.binary(max_size=2048))
    data = draw(segment_bytes())
    if kind == "spliced":
        other = draw(segment_bytes(base=draw(st.integers(0, 50))))
        a, b = draw(st.integers(0, len(data))), draw(st.integers(0, len(other)))
        data = data[:a] + other[b:]
    return mutate(data, draw(st.lists(MUTATION, max_size=4)), draw(st.booleans()))


def index_bytes(entry: int):
    """Index files: random bytes, or plausible entries (sorted or not), maybe zero padded."""
    entries = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1),
                                 st.integers(-2**31, 2**31 - 1)), max_size=40)

    def pack(es, sort, pad):
        es = sorted(es) if sort else es
        if entry == 8:
            body = b"".join(struct.pack(">ii", a, b) for a, b in es)
        else:
            body = b"".join(struct.pack(">qi", a * 1000, b) for a, b in es)
        return body + bytes(pad)
    return st.one_of(st.binary(max_size=400),
                     st.builds(pack, entries, st.booleans(), st.sampled_from([0, 0, 5, 8, 96])))


# ------------------------------------------------------------------------------------------------
# the compiled core


def _check_scan(res, start: int, end: int) -> None:
    b = res.batches
    assert start <= res.valid_end <= end
    if len(b):
        pos = b["position"].astype(np.int64)
        size = b["size"].astype(np.int64)
        assert pos[0] == start and (pos[1:] == pos[:-1] + size[:-1]).all()
        assert int(pos[-1] + size[-1]) <= end and (size >= 12 + 14).all()
        assert int(pos[-1] + size[-1]) == res.valid_end
    else:
        assert res.valid_end == start


@fuzz(400)
@given(data=log_bytes(), validate=st.booleans(), window=st.tuples(st.integers(0, 64),
                                                                   st.integers(0, 64)),
       max_batches=st.one_of(st.none(), st.integers(0, 3)))
def test_scan_batches(data, validate, window, max_batches):
    start = min(window[0], len(data))
    end = max(start, len(data) - window[1])
    res = _core.scan_batches(data, start, end, validate_crc=validate, raise_on_corrupt=False,
                             max_batches=max_batches)
    _check_scan(res, start, end)
    if res.error is not None:
        assert isinstance(res.error, CorruptRecordError) and res.error.position is not None
        assert res.error.position >= res.valid_end
    try:
        strict = _core.scan_batches(data, start, end, validate_crc=validate,
                                    max_batches=max_batches, file="x.log")
    except CorruptRecordError as e:
        assert res.error is not None and e.file == "x.log"
    else:
        assert res.error is None and strict.valid_end == res.valid_end


@fuzz(400)
@given(data=log_bytes(), validate=st.booleans(), control=st.booleans(),
       bounds=st.tuples(st.one_of(st.none(), st.integers(-5, 60)),
                        st.one_of(st.none(), st.integers(-5, 60))),
       max_records=st.one_of(st.none(), st.integers(0, 5)))
def test_decode_records(data, validate, control, bounds, max_records):
    try:
        recs = _core.decode_records(data, validate_crc=validate, include_control=control,
                                    min_offset=bounds[0], end_offset=bounds[1],
                                    max_records=max_records, file="x.log")
    except ALLOWED:
        return
    offsets = [r.offset for r in recs]
    if max_records is not None:
        assert len(recs) <= max_records
    if bounds[0] is not None:
        assert all(o >= bounds[0] for o in offsets)
    if bounds[1] is not None:
        assert all(o < bounds[1] for o in offsets)


@fuzz(400)
@given(data=log_bytes(), validate=st.booleans(), headers=st.booleans(),
       max_records=st.one_of(st.none(), st.integers(0, 5)))
def test_decode_columns(data, validate, headers, max_records):
    try:
        cols = _core.decode_columns(data, validate_crc=validate, include_headers=headers,
                                    max_records=max_records, file="x.log")
    except ALLOWED:
        return
    n = len(cols)
    assert cols.offsets.shape == (n,) and len(cols.keys) == n and len(cols.values) == n
    if max_records is not None:
        assert n <= max_records
    # Columns and objects agree whenever both decode.
    try:
        recs = _core.decode_records(data, validate_crc=validate, max_records=max_records)
    except ALLOWED:
        return
    assert cols.offsets.tolist() == [r.offset for r in recs]
    assert cols.values.to_pylist() == [r.value for r in recs]


@fuzz(200)
@given(parts=st.lists(log_bytes(), min_size=1, max_size=3), validate=st.booleans(),
       strict=st.booleans())
def test_decode_columns_multi(parts, validate, strict):
    sources = [(p, 0, len(p), f"{i}.log") for i, p in enumerate(parts)]
    try:
        cols = _core.decode_columns_multi(sources, validate_crc=validate, strict=strict)
    except ALLOWED:
        return
    assert len(cols.offsets) == len(cols.values)


@fuzz(300)
@given(offsets=index_bytes(8), times=index_bytes(12), target=st.integers(-2**63, 2**63 - 1),
       extra=st.integers(0, 3))
def test_index_kernels(offsets, times, target, extra):
    for buf, size, is_time in ((offsets, 8, False), (times, 12, True)):
        n = len(buf) // size
        slot = _core.index_lookup(buf, n, target if is_time else max(min(target, 2**31 - 1),
                                                                      -2**31), is_time)
        assert -1 <= slot < n
        bad = _core.index_check(buf, n, is_time)
        assert -1 <= bad < n
        with pytest.raises(ValueError):
            _core.index_check(buf, n + 1 + extra, is_time)


@fuzz(150)
@given(offsets=index_bytes(8), times=index_bytes(12), target=st.integers(0, 2**40))
def test_index_files(tmp_path_factory, offsets, times, target):
    d = tmp_path_factory.mktemp("idx")
    (d / "i").write_bytes(offsets)
    (d / "t").write_bytes(times)
    for cls, path, data in ((OffsetIndex, d / "i", offsets), (TimeIndex, d / "t", times)):
        for writable in (True, False):
            idx = cls(str(path), 1000, 4096, writable=writable)
            try:
                try:
                    idx.sanity_check(len(data))
                except ALLOWED:
                    pass
                idx.entries_array()
                idx.lookup(target)
                assert 0 <= idx.valid_prefix() <= idx.entries
            finally:
                if writable:
                    idx._mm = None  # drop the map without trimming the file
                else:
                    idx.close()


# ------------------------------------------------------------------------------------------------
# the loader


@st.composite
def partition_dir(draw):
    """Files of a partition directory: one to three segments from fuzzed bytes."""
    files = {}
    base = 0
    for _ in range(draw(st.integers(1, 3))):
        prefix = f"{base:020d}"
        files[prefix + ".log"] = draw(log_bytes())
        if draw(st.booleans()):
            files[prefix + ".index"] = draw(index_bytes(8))
        if draw(st.booleans()):
            files[prefix + ".timeindex"] = draw(index_bytes(12))
        base += draw(st.sampled_from([1, 3, 10, 2**31]))
    if draw(st.booleans()):  # leftovers of an interrupted swap or delete
        name = draw(st.sampled_from(sorted(files)))
        files[name + draw(st.sampled_from([".swap", ".cleaned", ".deleted"]))] = files[name]
    return files


def _load_and_read(files: dict, clean: bool, recovery_point: int) -> None:
    root = tempfile.mkdtemp(prefix="segstore-fuzz-")
    try:
        d = os.path.join(root, "t-0")
        os.makedirs(d)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        if clean:
            open(os.path.join(root, CLEAN_SHUTDOWN_FILE), "wb").close()
        OffsetCheckpointFile(os.path.join(root, RECOVERY_POINT_CHECKPOINT)).write(
            {TopicPartition("t", 0): recovery_point})
        store = segstore.open(root)  # must never fail
        recovered_all = not clean and recovery_point == 0
        try:
            lg = store.partition("t", 0)
            problems = lg.verify()  # reports, never raises
            if recovered_all:
                assert problems == [], problems  # everything was recovered
            try:
                recs = list(lg.iter_records())
                offsets = [r.offset for r in recs]
                if recovered_all:
                    assert offsets == sorted(set(offsets))
                lg.read_columns()
                lg.offset_for_time(0)
            except ALLOWED:
                pass  # e.g. a CRC-valid batch whose records are garbage
            # The log still takes appends at its end.
            info = lg.append_batch([b"x"], timestamps_ms=[1])
            assert info.first_offset == lg.log_end_offset - 1
        finally:
            store.close()  # never fails
        segstore.open(root).close()  # and reopens cleanly
    finally:
        shutil.rmtree(root, ignore_errors=True)


def in_child(fn, *args) -> None:
    """Run ``fn(*args)`` in a forked child, so a crash (SIGSEGV, SIGBUS from a mapped file
    shrinking underneath) fails the example -- and hypothesis shrinks it -- instead of killing
    the test run. Exceptions in the child fail the example with the child's traceback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            fn(*args)
        except BaseException:
            os.write(w, (traceback.format_exc()[-6000:] + f"\ninput: {args!r:.20000}").encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise AssertionError(f"crashed: {signal.Signals(os.WTERMSIG(status)).name}")
    if os.WEXITSTATUS(status) != 0:
        raise AssertionError("failed in the child:\n" + report)


@fuzz(120)
@given(files=partition_dir(), recovery_point=st.sampled_from([0, 0, 0, 1, 5, 2**31]))
def test_loader_recovers_anything_after_an_unclean_shutdown(files, recovery_point):
    in_child(_load_and_read, files, False, recovery_point)


@fuzz(80)
@given(files=partition_dir())
def test_loader_opens_anything_after_a_clean_shutdown(files):
    in_child(_load_and_read, files, True, 0)
