"""docs/configuration.md is generated from segstore/config.py: it must match what
tools/gen_config_docs.py writes now, and cover every key."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from segstore import config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, "tools", "gen_config_docs.py")


def _tool():
    spec = importlib.util.spec_from_file_location("gen_config_docs", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_configuration_md_is_current():
    with open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == _tool().render(), (
        "docs/configuration.md is stale: run .venv/bin/python tools/gen_config_docs.py")


def test_every_key_default_and_rejected_key_is_documented():
    text = _tool().render()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `")}
    for key in config.describe_keys():
        assert key.name in rows, key.name
        assert key.doc.replace("|", "\\|") in rows[key.name]
    assert "| `segment.bytes` | int | `1073741824` (1 GiB) | `[14,...]` |" in text
    assert "| `log.cleaner.dedupe.buffer.size` | long | `134217728` (128 MiB) |" in text
    assert "| `log.roll.ms` | long | unset |" in text
    assert "| `min.insync.replicas` | topic | segstore keeps one local copy" in text


def test_check_mode_exit_status(tmp_path, monkeypatch):
    tool = _tool()
    assert tool.main(["--check"]) == 0
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(tool, "OUTPUT", str(stale))
    assert tool.main(["--check"]) == 1
    assert subprocess.run([sys.executable, TOOL, "--check"], cwd=REPO).returncode == 0
