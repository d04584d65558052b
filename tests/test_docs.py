"""Every example in README.md and docs/ runs, so none can go stale.

* ```` ```python ```` blocks are executed, each in a fresh directory holding ``fixtures/``.
* ```` ```console ```` blocks are shell sessions: each ``$ command`` line is run and its output
  must equal the lines that follow it (up to the next ``$`` line). A line ``...`` stands for
  any number of lines, and ``...`` inside a line for any text. The blocks of one page run in
  order, in one directory holding ``fixtures/``, so a page can convert a file and then inspect
  it. Commands: ``weightio …`` (through CliRunner: stdout and stderr as a terminal shows them),
  ``echo $?`` (the last command's exit status), ``ls DIR`` and ``cat FILE``.
* A page containing ``<!-- docs-test: hub -->`` runs against the loopback Hub of
  `tests/hubserver.py`, which serves ``fixtures/tiny-bert`` as ``weightio/tiny-bert`` and
  ``fixtures/tiny-bert-sharded`` as ``weightio/tiny-bert-sharded``.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from .conftest import FIXTURES

ROOT = FIXTURES.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(doc, i, code) for doc in DOCS for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(),
                                                                              re.S))]
SESSIONS = [doc for doc in DOCS if "```console\n" in doc.read_text()]
HUB_MARKER = "<!-- docs-test: hub -->"


@pytest.mark.parametrize("doc,index,code", BLOCKS, ids=[f"{d.name}#{i}" for d, i, _ in BLOCKS])
def test_doc_example_runs(tmp_path, monkeypatch, doc, index, code):
    (tmp_path / "fixtures").symlink_to(FIXTURES)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{doc.name}[{index}]", "exec"), {"__name__": "__doc_example__"})
    assert os.getcwd() == str(tmp_path)


# ----------------------------------------------------------------------------- console sessions


def parse_session(block: str) -> list[tuple[str, list[str]]]:
    """``[(command, expected output lines)]`` of one console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console block starts with output, not a $ command: {line!r}")
    return steps


def _line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.split("...")) + r"\Z")


def lines_match(expected: list[str], actual: list[str]) -> bool:
    """`actual` fits `expected`, where a line ``...`` matches any run of lines (even none)."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(lines_match(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and bool(_line_pattern(expected[0]).match(actual[0])) and lines_match(expected[1:], actual[1:])


class Shell:
    """Runs the commands a console block may hold, remembering the last exit status."""

    def __init__(self) -> None:
        self.status = 0

    def run(self, command: str) -> list[str]:
        argv = shlex.split(command)
        if argv[0] == "weightio":
            from weightio.cli import main

            result = CliRunner().invoke(main, argv[1:], prog_name="weightio")
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            self.status = result.exit_code
            return result.output.splitlines()
        if argv == ["echo", "$?"]:
            return [str(self.status)]
        if argv[0] == "ls" and len(argv) == 2:
            return sorted(os.listdir(argv[1]))
        if argv[0] == "cat" and len(argv) == 2:
            return Path(argv[1]).read_text().splitlines()
        raise AssertionError(f"docs may only run weightio, echo $?, ls DIR and cat FILE, not {command!r}")


@pytest.fixture
def hub_for_docs(tmp_path, monkeypatch):
    from .hubserver import point_client_at, repo_from_folder, serve

    repos = {("model", "weightio/tiny-bert"): repo_from_folder(FIXTURES / "tiny-bert", commit="a" * 40),
             ("model", "weightio/tiny-bert-sharded"): repo_from_folder(FIXTURES / "tiny-bert-sharded",
                                                                       commit="b" * 40)}
    with serve(repos) as server:
        point_client_at(server, monkeypatch, tmp_path / "hf-cache")
        yield server


@pytest.mark.parametrize("doc", SESSIONS, ids=[d.name for d in SESSIONS])
def test_doc_console_sessions_print_what_they_show(tmp_path, monkeypatch, request, doc):
    text = doc.read_text()
    if HUB_MARKER in text:
        request.getfixturevalue("hub_for_docs")
    work = tmp_path / "work"
    work.mkdir()
    (work / "fixtures").symlink_to(FIXTURES)
    monkeypatch.chdir(work)
    monkeypatch.delenv("NO_COLOR", raising=False)
    shell = Shell()
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for command, expected in parse_session(block):
            actual = shell.run(command)
            assert lines_match(expected, actual), (f"{doc.name}: `$ {command}` printed:\n" + "\n".join(actual) +
                                                    "\n\nbut the page shows:\n" + "\n".join(expected))


@pytest.mark.parametrize("expected,actual,ok", [
    (["a", "b"], ["a", "b"], True),
    (["a", "b"], ["a", "c"], False),
    (["a"], ["a", "b"], False),
    (["a", "...", "d"], ["a", "b", "c", "d"], True),
    (["a", "...", "d"], ["a", "d"], True),
    (["...", "x"], ["a", "b"], False),
    (["size ... kB"], ["size 79.9 kB"], True),
    (["size ... kB"], ["size 79.9 MB"], False),
    (["a.b"], ["aXb"], False),  # everything but "..." is literal
])
def test_lines_match(expected, actual, ok):
    assert lines_match(expected, actual) is ok


def test_parse_session():
    block = "$ weightio inspect x\nline 1\n\nline 2\n$ echo $?\n0\n"
    assert parse_session(block) == [("weightio inspect x", ["line 1", "", "line 2"]), ("echo $?", ["0"])]
    with pytest.raises(AssertionError, match="starts with output"):
        parse_session("oops\n$ weightio x\n")
