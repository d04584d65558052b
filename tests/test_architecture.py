"""The layering of docs/architecture.md, enforced: imports point one way, modules stay small.

The import graph is read from the source (``ast``), counting imports made inside functions
and lazy registry entries (``"weightio.formats.gguf:GGUFReader"``); imports under
``if TYPE_CHECKING:`` are left out, as they never run. Run this file as a script to print the
graph and any cycle: ``python tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from .conftest import pyproject

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"weightio": ROOT / "weightio", "weightio.cli": ROOT / "cli"}

# The layers, bottom first (docs/architecture.md). A module may import from its own layer
# group and from the groups listed for it; nothing else of weightio.
CORE = {"weightio.errors", "weightio.dtypes", "weightio.limits", "weightio.records", "weightio._io", "weightio._remote",
        "weightio._memory", "weightio._failures", "weightio._streaming",
        "weightio._json", "weightio._gc", "weightio._outputs", "weightio._threads", "weightio.layout",
        "weightio.text", "weightio._speedups", "weightio._native", "weightio._private"}
ALLOWED = {  # prefix -> what modules under it may import (besides themselves and their own package)
    "weightio.quant": CORE - {"weightio._io", "weightio._private", "weightio._outputs", "weightio._json",
                              "weightio._gc", "weightio.layout"},
    "weightio.formats": CORE | {"weightio.quant"},
    "weightio.devices": CORE,
    "weightio.hub": CORE | {"weightio.hubpath"},  # hubpath: the hf:// grammar, in the hub layer
}
CORE_ALLOWED = CORE  # core modules import only each other
# What the command line may import: the package and these public modules (their __all__ only).
CLI_PUBLIC = {"weightio", "weightio.convert", "weightio.dtypes", "weightio.formats", "weightio.hub",
              "weightio.limits", "weightio.remote", "weightio.stats", "weightio.text"}
MAX_LINES = 600
GENERATED = {"weightio/quant/grids.py"}  # tables written by weightio/quant/_gen_grids.py
_LAZY = re.compile(r"^(weightio(?:\.[a-z_][a-z0-9_]*)+):[A-Za-z_]\w*$")


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package); C extensions by their source (``weightio/_speedups.c``)."""
    found = {}
    for package, folder in PACKAGES.items():
        for file in sorted(folder.rglob("*.py")) + sorted(folder.rglob("*.c")):
            parts = list(file.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join([package, *parts[: -1 if is_package else None]])] = (file, is_package)
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.AST, base: str, known: dict) -> list[tuple[str, str | None]]:
    """(module, imported name or None) pairs that one node imports."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            parts = base.split(".")
            module = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        return [(f"{module}.{a.name}", None) if f"{module}.{a.name}" in known else (module, a.name)
                for a in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _LAZY.match(node.value):
        return [(node.value.partition(":")[0], None)]
    return []


def imports() -> dict[str, set[tuple[str, str | None]]]:
    """Module -> the (weightio module, name) pairs it imports, mapped to the modules that exist."""
    known = modules()
    graph: dict[str, set] = defaultdict(set)
    for name, (file, is_package) in known.items():
        if file.suffix != ".py":
            continue  # (a C extension imports nothing of weightio)
        base = name if is_package else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(file.read_text(), str(file))):
            for target, attr in _targets(node, base, known):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("weightio"):
                    graph[name].add((target, attr))
    return graph


def edges() -> dict[str, set[str]]:
    return {m: {t for t, _ in pairs} for m, pairs in imports().items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _allowed(module: str, target: str) -> bool:
    def inside(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    for prefix, allowed in ALLOWED.items():
        if inside(module, prefix):
            return inside(target, prefix) or any(inside(target, a) for a in allowed)
    if module in CORE:
        return target in CORE_ALLOWED
    return True


def test_cycles_helper_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_weightio_modules():
    assert cycles(edges()) == []


def test_layers_point_one_way():
    wrong = sorted(f"{m} -> {t}" for m, targets in edges().items() for t in targets
                   if m.startswith("weightio") and not m.startswith("weightio.cli") and not _allowed(m, t))
    assert wrong == []


def test_no_library_module_imports_the_package_itself():
    # `weightio/__init__` imports everything; a submodule importing it back is a cycle in waiting.
    wrong = sorted(m for m, targets in edges().items()
                   if "weightio" in targets and m != "weightio" and not m.startswith("weightio.cli"))
    assert wrong == []


def test_only_the_main_module_imports_the_command_line():
    # The library never depends on its click layer; `python -m weightio` (weightio/__main__.py) is
    # the one entry point inside the package that starts it.
    wrong = sorted(f"{m} -> {t}" for m, targets in edges().items() for t in targets
                   if t.startswith("weightio.cli") and not m.startswith("weightio.cli") and m != "weightio.__main__")
    assert wrong == []
    assert "weightio.cli" in edges()["weightio.__main__"]


def test_the_command_line_uses_only_the_public_api():
    wrong = []
    for module, pairs in imports().items():
        if not module.startswith("weightio.cli"):
            continue
        for target, name in pairs:
            if target.startswith("weightio.cli"):
                continue
            public = getattr(importlib.import_module(target), "__all__", ())
            if target not in CLI_PUBLIC or (name is not None and name not in public and name != "__version__"):
                wrong.append(f"{module} -> {target}" + (f".{name}" if name else ""))
    assert sorted(wrong) == []


def test_no_module_over_the_line_limit():
    long = {}
    for file in [file for file, _ in modules().values()] + sorted(PACKAGES["weightio"].glob("*.h")):
        relative = file.relative_to(ROOT).as_posix()
        lines = len(file.read_text().splitlines())
        if lines > MAX_LINES and relative not in GENERATED:
            long[relative] = lines
    assert long == {}


def test_every_package_is_listed_for_the_wheel():
    # setuptools installs only the packages pyproject.toml lists; a new sub-package left out of
    # the list works in an editable install and is missing from the wheel.
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    assert {name for name, (_, is_package) in modules().items() if is_package} == listed


@pytest.mark.parametrize("module", sorted(ALLOWED) + sorted(CORE))
def test_each_layer_rule_names_modules_that_exist(module):
    assert any(m == module or m.startswith(module + ".") for m in modules())


if __name__ == "__main__":
    graph = edges()
    for name in sorted(graph):
        print(name, "->", " ".join(sorted(graph[name])))
    for component in cycles(graph):
        print("CYCLE:", " ".join(component))
    sys.exit(1 if cycles(graph) else 0)
