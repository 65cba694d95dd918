"""Places where the code did not do what the documentation says (docs review 14), fixed.

- truncate_fully_and_start_at(1.5) renamed every segment to .deleted, then failed with a plain
  ValueError: the partition was empty after the next open (getting-started.md: "A bad argument
  changes nothing").
- buffer_pool.set_limit raised plain TypeError/ValueError, not a SegstoreError.
- now_ms=1.5 was accepted by tick, enforce_retention, compact and remove_expired_producers (the
  retention report read "at 1.5 ms").
- An unknown option's hint pointed at ``segstore --help``, which lists no subcommand's options.
"""

from __future__ import annotations

import os

import pytest

import segstore
from segstore import buffer_pool
from segstore.cli import main
from segstore.errors import InvalidArgumentError, InvalidOffsetError, OffsetTypeError, SegstoreError


@pytest.mark.parametrize("bad", [1.5, "5"])
def test_truncate_fully_and_start_at_refuses_a_non_int_offset_and_keeps_the_log(tmp_path, bad):
    path = str(tmp_path / "s")
    with segstore.open(path) as store:
        store.create_topic("t")
        log = store.partition("t", 0)
        log.append(b"x")
        with pytest.raises(OffsetTypeError):
            log.truncate_fully_and_start_at(bad)
        assert os.path.exists(os.path.join(path, "t-0", "00000000000000000000.log"))
    with segstore.open(path) as store:
        assert store.partition("t", 0).log_end_offset == 1


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_buffer_pool_set_limit_errors_are_segstore_errors(bad):
    old = buffer_pool.limit()
    try:
        with pytest.raises(SegstoreError):
            buffer_pool.set_limit(bad)
    finally:
        buffer_pool.set_limit(old)


@pytest.mark.parametrize("call", ["enforce_retention", "tick", "compact",
                                  "remove_expired_producers"])
def test_a_floating_point_now_ms_is_refused(tmp_path, call):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("t", config={"cleanup.policy": "compact"})
        log = store.partition("t", 0)
        log.append(b"v", key=b"k")
        target = {"enforce_retention": lambda: store.enforce_retention(now_ms=1.5, dry_run=True),
                  "tick": lambda: store.tick(now_ms=1.5),
                  "compact": lambda: store.compact(now_ms=1.5),
                  "remove_expired_producers": lambda: log.remove_expired_producers(now_ms=1.5),
                  }[call]
        with pytest.raises(SegstoreError):
            target()


def test_an_unknown_option_points_at_the_subcommands_help(tmp_path, capsys):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("t")
    assert main(["retention", "--path", str(tmp_path / "s"), "--bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("(see 'segstore retention --help')"), err


@pytest.mark.parametrize("bad", [-1, 1 << 63, True, "5", 2.0])
def test_now_ms_must_be_an_int_from_0_to_2_63(tmp_path, bad):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("t", config={"cleanup.policy": "compact"})
        log = store.partition("t", 0)
        log.append(b"v", key=b"k")
        for call in (lambda: store.tick(now_ms=bad), lambda: log.maybe_flush(now_ms=bad),
                     lambda: store.cleaner_manager.describe("t", 0, now_ms=bad),
                     lambda: store.enforce_retention(now_ms=bad)):
            with pytest.raises(InvalidArgumentError, match="now_ms"):
                call()
        # numpy's ints are ints; the limits themselves are times
        import numpy as np
        store.tick(now_ms=np.int64(0))
        assert store.enforce_retention(now_ms=(1 << 63) - 1, dry_run=True).now_ms == (1 << 63) - 1


def test_truncate_fully_and_start_at_refuses_an_offset_past_2_63(tmp_path):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("t")
        log = store.partition("t", 0)
        log.append(b"x")
        with pytest.raises(InvalidOffsetError):
            log.truncate_fully_and_start_at(1 << 63)
        assert log.log_end_offset == 1 and [r.value for r in log.read(0)] == [b"x"]
        log.truncate_fully_and_start_at((1 << 63) - 5)
        assert log.log_start_offset == log.log_end_offset == (1 << 63) - 5
