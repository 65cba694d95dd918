"""Places where the code does not do what the documentation says (docs review 14).

Each test states the documented behaviour and is marked ``xfail(strict=True)`` until the code
is fixed; the docs were left describing the intended behaviour.
"""

from __future__ import annotations

import os

import pytest

import segstore
from segstore import buffer_pool
from segstore.cli import main
from segstore.errors import OffsetTypeError, SegstoreError


@pytest.mark.xfail(strict=True, reason=(
    "truncate_fully_and_start_at does not check its offset's type: 1.5 renames every segment "
    "to .deleted, then fails formatting the new segment's name with a plain ValueError, and "
    "the partition is empty after the next open; getting-started.md: 'A bad argument changes "
    "nothing: a floating-point offset ... is refused'"))
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


@pytest.mark.xfail(strict=True, reason=(
    "buffer_pool.set_limit raises plain TypeError/ValueError (the same module's "
    "SEGSTORE_BUFFER_POOL_BYTES check raises InvalidConfigError); getting-started.md: 'Every "
    "error segstore raises on purpose is a segstore.errors.SegstoreError'"))
@pytest.mark.parametrize("bad", [-1, 1.5])
def test_buffer_pool_set_limit_errors_are_segstore_errors(bad):
    old = buffer_pool.limit()
    try:
        with pytest.raises(SegstoreError):
            buffer_pool.set_limit(bad)
    finally:
        buffer_pool.set_limit(old)


@pytest.mark.xfail(strict=True, reason=(
    "now_ms=1.5 is accepted (the retention report reads 'at 1.5 ms'); getting-started.md: "
    "'a floating-point offset or timestamp is refused, not rounded'"))
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


@pytest.mark.xfail(strict=True, reason=(
    "an unknown option is reported by the top-level parser, so the hint is "
    "\"(see 'segstore --help')\", which does not list the subcommand's options; "
    "getting-started.md's exit status table: a mistake on the command line prints one line "
    "ending in (see 'segstore COMMAND --help')"))
def test_an_unknown_option_points_at_the_subcommands_help(tmp_path, capsys):
    with segstore.open(str(tmp_path / "s")) as store:
        store.create_topic("t")
    assert main(["retention", "--path", str(tmp_path / "s"), "--bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("(see 'segstore retention --help')"), err
