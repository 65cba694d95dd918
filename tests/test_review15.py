"""Fifteenth session's smaller fixes, each with the behaviour it pins down."""

from __future__ import annotations

import logging
import os

import segstore
from conftest import FakeClock


def test_a_garbage_checkpoint_warning_says_what_ignoring_it_costs(tmp_path, caplog):
    """Ignoring a garbage recovery-point checkpoint means recovering every log from its start;
    ignoring a garbage log-start-offset checkpoint means each log starts at its first segment
    (the warning said "recovering from the start" for both)."""
    root = str(tmp_path / "s")
    with segstore.open(root, clock=FakeClock(1_000)) as store:
        store.create_topic("t")
        lg = store.partition("t", 0)
        lg.append_batch([b"v%d" % i for i in range(10)])
        lg.delete_records(4)
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        with open(os.path.join(root, name), "w") as f:
            f.write("garbage\n")
    os.remove(os.path.join(root, ".kafka_cleanshutdown"))  # so the recovery point matters
    with caplog.at_level(logging.WARNING, logger="segstore.store"):
        with segstore.open(root, clock=FakeClock(1_000)) as store:
            lg = store.partition("t", 0)
            assert lg.log_start_offset == 0  # the DeleteRecords is forgotten with the file
            assert lg.log_end_offset == 10
    msgs = [r.getMessage() for r in caplog.records]
    rp = [m for m in msgs if "recovery-point-offset-checkpoint" in m]
    ls = [m for m in msgs if "log-start-offset-checkpoint" in m]
    assert rp and rp[0].endswith("(recovering every log from its start instead)"), msgs
    assert ls and ls[0].endswith("(each log starts at its first segment instead)"), msgs
