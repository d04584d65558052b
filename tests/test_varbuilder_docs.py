"""The torch examples of docs/varbuilder.md run (its ```py blocks; the ```python ones run in
tests/test_docs.py without torch). Blocks marked ``# requires: cuda`` run where CUDA is available;
``# requires: torchrun`` blocks need a launcher: tests/test_tensor_parallel.py runs a worker of the
same shape, tests/tp_worker.py, under torchrun."""

from __future__ import annotations

import re

import pytest

from .conftest import FIXTURES

DOC = FIXTURES.parent / "docs" / "varbuilder.md"
BLOCKS = re.findall(r"```py\n(.*?)```", DOC.read_text(), re.S)


def test_the_guide_has_torch_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_torch_example_runs(tmp_path, monkeypatch, index):
    code = BLOCKS[index]
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if "# requires: torchrun" in code:
        pytest.skip("needs torchrun and a model (tests/test_tensor_parallel.py runs tests/tp_worker.py under it)")
    if "# requires: cuda" in code and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    (tmp_path / "fixtures").symlink_to(FIXTURES)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"varbuilder.md[py {index}]", "exec"), {"__name__": "__doc_example__"})
