"""The package as it is installed: ``python -m weightio``, one version, dependencies that are used.

Building and installing the wheel itself is checked by CI (`.ci/run`, with `.ci/check_dist.py`
on the built files), which then runs this suite against the installed wheel.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import weightio

from .conftest import FIXTURES, pyproject

ROOT = FIXTURES.parent
SOURCES = [ROOT / "weightio", ROOT / "cli"]

# Distribution name -> the module it installs, where they differ.
MODULE_OF = {"typing-extensions": "typing_extensions", "huggingface-hub": "huggingface_hub"}
# Runtime dependencies imported by another dependency, not by weightio itself: why each is listed.
INDIRECT = {"typing_extensions": "fickling"}
# Third-party modules weightio imports that are no dependency: each is optional, imported only when asked for.
OPTIONAL = {"torch": "extra torch", "jax": "extra jax", "cupy": "installed by hand (CUDA build)",
            "cupyx": "part of cupy", "gguf": "weightio/quant/_gen_grids.py, a generator run by hand"}


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_python_dash_m_weightio_is_the_command(tmp_path):
    done = _python("-m", "weightio", "inspect", str(FIXTURES / "tiny-bert-sharded"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(FIXTURES / "tiny-bert-sharded")
    assert [line.split() for line in lines[1:4]] == [["format", "safetensors"], ["files", "3"], ["tensors", "39"]]
    usage = _python("-m", "weightio", "--help", cwd=tmp_path)
    assert usage.returncode == 0 and usage.stdout.startswith("Usage: weightio ")  # its name, not __main__.py


def test_python_dash_m_weightio_exits_as_the_command_does(tmp_path):
    done = _python("-m", "weightio", "inspect", str(tmp_path / "missing.safetensors"), cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("weightio: error: ") and "missing.safetensors" in done.stderr


def test_the_version_has_one_source():
    project = pyproject()
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "weightio.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", weightio.__version__)
    # the installed metadata (what `weightio --version` prints) is that version: a stale install fails here
    assert metadata.version("weightio") == weightio.__version__


def test_weightio_version_prints_the_package_metadata(tmp_path):
    done = _python("-m", "weightio", "--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == f"weightio, version {metadata.version('weightio')}\n"


def test_every_runtime_dependency_is_used_at_runtime():
    imported = _third_party_imports()
    dists = [_dist(req) for req in pyproject()["project"]["dependencies"]]
    needed = {MODULE_OF.get(dist, dist.replace("-", "_")) for dist in dists}
    unused = sorted(module for module in needed if module not in imported and module not in INDIRECT)
    assert unused == []
    # and the other way: every third-party module the library imports is a dependency or optional
    undeclared = sorted(module for module in imported if module not in needed and module not in OPTIONAL)
    assert undeclared == []


def test_safetensors_is_a_test_dependency_only():
    project = pyproject()
    assert "safetensors" not in {_dist(req) for req in project["project"]["dependencies"]}
    assert "safetensors" in {_dist(req) for req in project["project"]["optional-dependencies"]["test"]}
    assert "safetensors" not in _third_party_imports()  # weightio/formats/safetensors.py is weightio's own


def _dist(requirement: str) -> str:
    """The normalized distribution name of a requirement string (``"numpy>=1.24"`` -> ``"numpy"``)."""
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _third_party_imports() -> set[str]:
    """Top-level modules outside the standard library imported anywhere in weightio/ and cli/."""
    found: set[str] = set()
    files = [file for folder in SOURCES for file in folder.rglob("*.py")]
    if not files:
        pytest.skip("no weightio sources beside the tests (the suite runs against an installed wheel)")
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("weightio", "cli")}
