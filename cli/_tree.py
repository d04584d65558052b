"""Tensor names as a module tree: grouped by dotted prefix, repeated layers collapsed.

``encoder.layer.0.attention.self.query.weight`` … ``encoder.layer.11.…`` become one node
``encoder.layer.{0..11}`` shown once with ``12 ×`` its per-layer parameter count, when the
layers hold the same tensors (names, dtypes and shapes); a layer that differs breaks the run
(``{0..5}``, ``6``, ``{7..11}``). A module with a single child is shown joined to it
(``attention.output.dense``), as a person would write it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Node", "build", "rows", "to_json"]


@dataclass
class Node:
    """One row of the tree.

    Attributes:
        name: the dotted label (``encoder.layer.{0..11}``).
        parameters: parameters of one instance (of one layer, for a collapsed run).
        repeat: how many identical instances the row stands for.
        tensor: ``(kind, shape)`` when a tensor has exactly this name, else None.
        children: the rows below, in checkpoint order (layer numbers in numeric order).
    """

    name: str
    parameters: int
    repeat: int = 1
    tensor: tuple[str, tuple[int, ...]] | None = None
    children: list[Node] = field(default_factory=list)


class _Trie:
    __slots__ = ("children", "leaf", "_signature")

    def __init__(self) -> None:
        self.children: dict[str, _Trie] = {}
        self.leaf: tuple[str, tuple[int, ...]] | None = None
        self._signature: Any = None

    def signature(self) -> Any:
        """What must match for two layers to be collapsed: every tensor's relative name, kind, shape."""
        if self._signature is None:
            self._signature = (self.leaf, tuple(sorted((k, c.signature()) for k, c in self.children.items())))
        return self._signature


def build(entries: Iterable[tuple[str, str, tuple[int, ...]]]) -> list[Node]:
    """The top-level rows for ``(name, kind, shape)`` entries."""
    root = _Trie()
    for name, kind, shape in entries:
        node = root
        for part in name.split("."):
            node = node.children.setdefault(part, _Trie())
        node.leaf = (kind, tuple(shape))
    return _rows_of(root)


def _rows_of(trie: _Trie) -> list[Node]:
    return [_merge(_node(label, child, repeat)) for label, child, repeat in _groups(trie)]


def _groups(trie: _Trie) -> list[tuple[str, _Trie, int]]:
    """Children as (label, subtree, repeat): runs of consecutive layer numbers with equal subtrees
    collapsed; numbered children in numeric order where the first of them appeared."""
    keys = list(trie.children)
    numbers = sorted((k for k in keys if k.isdigit() and (k == "0" or not k.startswith("0"))), key=int)
    groups: list[tuple[str, _Trie, int]] = []
    numbered_done = False
    for key in keys:
        if key not in numbers:
            groups.append((key, trie.children[key], 1))
        elif not numbered_done:
            groups.extend(_runs(trie, numbers))
            numbered_done = True
    return groups


def _runs(trie: _Trie, numbers: list[str]) -> list[tuple[str, _Trie, int]]:
    runs: list[list[str]] = []
    for key in numbers:
        last = runs[-1] if runs else None
        if (last and int(key) == int(last[-1]) + 1
                and trie.children[key].signature() == trie.children[last[0]].signature()):
            last.append(key)
        else:
            runs.append([key])
    return [(f"{{{run[0]}..{run[-1]}}}" if len(run) > 1 else run[0], trie.children[run[0]], len(run))
            for run in runs]


def _node(label: str, trie: _Trie, repeat: int) -> Node:
    children = _rows_of(trie)
    own = math.prod(trie.leaf[1]) if trie.leaf else 0
    return Node(label, own + sum(c.parameters * c.repeat for c in children), repeat, trie.leaf, children)


def _merge(node: Node) -> Node:
    """Join a module that holds nothing but one child to that child (``attention.output.dense``)."""
    while node.tensor is None and len(node.children) == 1:
        child = node.children[0]
        node = Node(f"{node.name}.{child.name}", child.parameters, node.repeat * child.repeat, child.tensor,
                    child.children)
    return node


def rows(nodes: list[Node], depth: int | None = None, indent: int = 0) -> list[tuple[str, Node]]:
    """``(indented label, node)`` for every row to print, down to `depth` levels (None: all)."""
    out: list[tuple[str, Node]] = []
    for node in nodes:
        out.append(("  " * indent + node.name, node))
        if depth is None or indent + 1 < depth:
            out.extend(rows(node.children, depth, indent + 1))
    return out


def to_json(nodes: list[Node], depth: int | None = None, level: int = 0) -> list[dict[str, Any]]:
    """The tree as JSON-ready dicts (see docs/inspect.md for the schema)."""
    return [{
        "name": n.name,
        "parameters": n.parameters,
        "repeat": n.repeat,
        "tensor": None if n.tensor is None else {"dtype": n.tensor[0], "shape": list(n.tensor[1])},
        "children": to_json(n.children, depth, level + 1) if depth is None or level + 1 < depth else [],
    } for n in nodes]
