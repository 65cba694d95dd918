"""Every code example in the documentation runs.

For each of README.md and docs/*.md, in document order and in a fresh working directory:

* every ```` ```python ```` block is executed; the blocks of one document share one namespace,
  so a later block may use what an earlier one made, and ``segstore`` is imported beforehand;
* an ```` ```output ```` block right after a python block is what that block prints (compared
  with the same rules as console output below);
* every ```` ```console ```` block is a transcript: each ``$ segstore ...`` line is run through
  ``segstore.cli.main`` and what it prints (stdout, then stderr) must equal the lines that follow,
  up to the next ``$`` line. A line ``...`` matches any number of lines, and ``...`` inside a line
  matches any text (paths, timings).

Shell instructions that are not meant to run here (``make demo``, ``pip install``) go in
```` ```sh ```` blocks. Examples in docs/spark.md need Spark and carry the ``spark`` marker.
"""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest

import segstore
from segstore.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FENCE = re.compile(r"^```([\w+-]*)\s*$")


def doc_blocks(path: str) -> list:
    """(language, first line number, text) of every fenced block of a Markdown file."""
    blocks, lang, start, body = [], None, 0, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = _FENCE.match(line.rstrip("\n"))
            if lang is None and m:
                lang, start, body = m.group(1) or "", n + 1, []
            elif lang is not None and line.rstrip("\n") == "```":
                blocks.append((lang, start, "".join(body)))
                lang = None
            elif lang is not None:
                body.append(line)
    return blocks


def _docs() -> list:
    paths = [os.path.join(REPO, "README.md")]
    paths += sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    params = []
    for p in paths:
        if not any(lang in ("python", "console", "output") for lang, _, _ in doc_blocks(p)):
            continue
        marks = [pytest.mark.spark] if os.path.basename(p) == "spark.md" else []
        params.append(pytest.param(p, id=os.path.relpath(p, REPO), marks=marks))
    return params


def _matches(expected: list, actual: list) -> bool:
    """Line-by-line match with ``...`` wildcards (a whole line: any lines; in a line: any text)."""
    if not expected:
        return not actual
    head = expected[0]
    if head.strip() == "...":
        return any(_matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    if not actual:
        return False
    pattern = ".*".join(re.escape(part) for part in head.rstrip().split("..."))
    return bool(re.fullmatch(pattern, actual[0].rstrip())) and _matches(expected[1:], actual[1:])


def run_console(block: str, where: str, capsys) -> None:
    """Run the ``$ segstore`` commands of a console block and compare their output."""
    commands, current = [], None
    for line in block.splitlines():
        if line.startswith("$ "):
            current = (line[2:], [])
            commands.append(current)
        elif current is None:
            if line.strip():
                raise AssertionError(f"{where}: output before the first '$' line")
        else:
            current[1].append(line)
    for command, expected in commands:
        argv = shlex.split(command)
        assert argv and argv[0] == "segstore", (
            f"{where}: only 'segstore' commands run in a console block (use ```sh): {command}")
        capsys.readouterr()
        main(argv[1:])
        out, err = capsys.readouterr()
        actual = (out + err).splitlines()
        while expected and not expected[-1].strip():
            expected.pop()
        assert _matches(expected, actual), (
            f"{where}: `{command}` printed:\n" + "\n".join(actual)
            + "\n--- but the docs show:\n" + "\n".join(expected))


@pytest.mark.parametrize("path", _docs())
def test_doc_examples_run(path, tmp_path, monkeypatch, capsys, request):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__", "segstore": segstore}
    if os.path.basename(path) == "spark.md":
        namespace["spark"] = request.getfixturevalue("spark")
    name = os.path.relpath(path, REPO)
    printed = None  # what the last python block printed, while no other block came after it
    try:
        for lang, line, text in doc_blocks(path):
            where = f"{name}:{line}"
            if lang == "python":
                capsys.readouterr()
                exec(compile(text, where, "exec"), namespace)
                printed = capsys.readouterr().out.splitlines()
                continue
            if lang == "output":
                assert printed is not None, f"{where}: an output block must follow a python block"
                expected = text.splitlines()
                assert _matches(expected, printed), (
                    f"{where}: the python block printed:\n" + "\n".join(printed)
                    + "\n--- but the docs show:\n" + text)
            elif lang == "console":
                run_console(text, where, capsys)
            printed = None
    finally:
        # Examples may leave stores open (the writer lock, threads): close them.
        for value in list(namespace.values()):
            if isinstance(value, segstore.LogStore):
                value.close()


def test_console_matching_rules():
    assert _matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert _matches(["a", "...", "b"], ["a", "b"])
    assert _matches(["path: ...data"], ["path: /tmp/x/data"])
    assert not _matches(["a", "b"], ["a", "c"])
    assert not _matches(["a"], ["a", "extra"])
    assert not _matches(["x ... y"], ["x z"])


def test_blocks_are_found(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("text\n```python\nx = 1\n```\n\n```console\n$ segstore --version\n```\n"
                   "```sh\nmake demo\n```\n")
    assert doc_blocks(str(doc)) == [("python", 3, "x = 1\n"),
                                    ("console", 7, "$ segstore --version\n"),
                                    ("sh", 10, "make demo\n")]


def test_a_wrong_transcript_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match="but the docs show"):
        run_console("$ segstore --version\nsegstore 0.0.0-not-this\n", "x.md:1", capsys)
    run_console(f"$ segstore --version\nsegstore {segstore.__version__}\n", "x.md:1", capsys)
