"""Every ```python example in README.md and docs/ runs, so none can go stale."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from .conftest import FIXTURES

ROOT = FIXTURES.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(doc, i, code) for doc in DOCS for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(),
                                                                              re.S))]


@pytest.mark.parametrize("doc,index,code", BLOCKS, ids=[f"{d.name}#{i}" for d, i, _ in BLOCKS])
def test_doc_example_runs(tmp_path, monkeypatch, doc, index, code):
    (tmp_path / "fixtures").symlink_to(FIXTURES)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{doc.name}[{index}]", "exec"), {"__name__": "__doc_example__"})
    assert os.getcwd() == str(tmp_path)
