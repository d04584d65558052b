"""The flattener: an unpickled checkpoint walked into dotted tensor names and metadata values.

`flatten` walks the object the allowlist unpickler built — iteratively, with a budget of work
against memo-DAG "billion laughs", a check for cycles and bounds on depth and name lengths —
into dotted tensor names (``model.fc.weight``, ``optimizer.state.0.exp_avg``) and plain
metadata values.

The budget counts work, not nodes: a pickle can reference one object any number of times for
two bytes each (``BINGET``), and each reference is walked, and a list leaf copied, again. So
every entry visited costs 1 (a placeholder module's entries left out, None parameters, too) and
every item of a list or tuple leaf copied into the metadata costs 1 more: a 10 000-item list
referenced 10 000 times costs 10^8, not 10^4.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...errors import CorruptFileError, FormatError
from ...limits import DEFAULTS, exceeded
from ...limits import hint as limits_hint
from .allowlist import Namespace, NumpyArray
from .placeholders import SKIPPED, Placeholder
from .placeholders import children as placeholder_children
from .refs import StorageRef, TensorRef, short_repr
from .standins import plain_time

__all__ = ["flatten", "is_tensor", "plain_value"]

PLAIN_TYPES = (str, int, float, bool, type(None))
_MAX_INT_BITS = 4000  # str(int) refuses more than 4300 digits


def plain_value(value: Any) -> Any:
    """A metadata leaf as a plain Python value: str/int/float/bool/None, a list of those, or a short text."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if type(value) is int:
        return value if value.bit_length() <= _MAX_INT_BITS else f"<int of {value.bit_length():,} bits>"
    if isinstance(value, (list, tuple)) and all(isinstance(v, PLAIN_TYPES) for v in value):
        return [plain_value(v) for v in value]
    if isinstance(value, dict) and not value:
        return {}
    if isinstance(value, Namespace):
        return "Namespace()"
    return plain_time(value) or short_repr(value)


def is_tensor(obj: Any) -> bool:
    """True for what `flatten` lists as a tensor (numpy arrays of unsupported dtypes are metadata)."""
    return isinstance(obj, (TensorRef, StorageRef)) or (isinstance(obj, NumpyArray) and obj.array is not None)


def flatten(root: Any, *, budget: int, root_name: str, max_depth: int = DEFAULTS.nesting_depth,
            max_name_bytes: int = DEFAULTS.name_bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors and metadata leaves of an unpickled checkpoint, by dotted name, in pickle order.

    Dicts (and OrderedDicts, Namespaces) contribute their keys, lists and tuples their indices:
    ``{"model": {"fc.weight": t}, "opt": {"state": {0: {"exp_avg": t2}}}}`` gives tensors
    ``model.fc.weight`` and ``opt.state.0.exp_avg``. A list or tuple of plain values is one
    metadata leaf (a list); other non-tensor leaves become plain values or a short description.
    A bare tensor (or value) at the root is named `root_name`.

    Raises:
        CorruptFileError: more than `budget` steps of work (entries visited plus list items
            copied: shared sub-objects are walked, and copied, each time they are reached, so a
            memo DAG could otherwise expand exponentially), a cycle, nesting
            deeper than `max_depth`, a name over `max_name_bytes` UTF-8 bytes or not valid
            Unicode (a lone surrogate, which pickles can carry and no output can hold).
        FormatError: two entries flatten to the same name.
    """
    flat = _state_dict(root, budget, max_name_bytes)
    if flat is not None:
        return flat, {}
    tensors: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    for name, leaf in _walk(root, budget, max_depth, max_name_bytes):
        name = name or root_name
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            message = f"name {short_repr(name)} is not valid Unicode (it holds a lone surrogate)"
            raise CorruptFileError(message) from None
        if size > max_name_bytes:
            raise exceeded("a flattened name of", size, "name_bytes", max_name_bytes, unit=" bytes")
        if name in tensors or name in metadata:
            raise FormatError(f"two entries flatten to the same name {name!r}; weightio cannot list both")
        if is_tensor(leaf):
            tensors[name] = leaf
        else:
            metadata[name] = plain_value(leaf)
    return tensors, metadata


def _state_dict(root: Any, budget: int, max_name_bytes: int) -> dict[str, Any] | None:
    """A state dict as torch.save writes one — a dict of non-empty str keys to tensors, nothing
    else — as `flatten` would list it (a copy, in order), with the same limits met; else None
    (then the walk lists it, or raises)."""
    if not isinstance(root, dict) or not 0 < len(root) <= budget or "" in root:
        return None
    for key, value in root.items():
        if type(key) is not str or type(value) is not TensorRef:
            return None
    lengths = list(map(len, root))
    if sum(lengths) > 16 * budget or 4 * max(lengths) > max_name_bytes:  # (4: UTF-8 bytes per character, at most)
        return None
    try:
        "".join(root).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the walk names it
        return None
    return dict(root)


def _children(obj: Any) -> Iterator[tuple[str, Any]] | None:
    """(component, child) pairs of a container to descend into, or None for a leaf."""
    if type(obj) is TensorRef:  # the common leaf, first
        return None
    if isinstance(obj, dict) and obj:
        return ((_component(k), v) for k, v in obj.items())
    if isinstance(obj, Namespace) and obj.fields:
        return ((_component(k), v) for k, v in obj.fields.items())
    if isinstance(obj, (list, tuple)) and obj and not all(isinstance(v, PLAIN_TYPES) for v in obj):
        return ((str(i), v) for i, v in enumerate(obj))
    if isinstance(obj, Placeholder):
        return placeholder_children(obj, _component)
    return None


def _component(key: Any) -> str:
    if isinstance(key, str):
        return key
    if type(key) is int and key.bit_length() < 64:
        return str(key)
    return short_repr(key)


def _copies(leaf: Any) -> int:
    """The work `plain_value` does on a leaf beyond visiting it: one per list or tuple item
    (it copies them, or checks them all before describing the container)."""
    return len(leaf) if isinstance(leaf, (list, tuple)) else 0


def _walk(root: Any, budget: int, max_depth: int, max_name: int) -> Iterator[tuple[str, Any]]:
    """Depth-first, iterative: (dotted name, leaf) in order; no recursion, bounded work.

    Bounded: at most `budget` steps (entries visited and leaf items copied), `max_depth`
    levels, names of `max_name` characters (a name's UTF-8 bytes, checked by `flatten`, are at
    least its characters) and ``16 * budget`` characters of names in all (each name is built
    from its parent's, so deep or long paths would otherwise cost quadratic memory).
    """
    visited, characters = 0, 0
    stack: list[tuple[str, Iterator[tuple[str, Any]]]] = []
    on_path: set[int] = set()
    kids = _children(root)
    if kids is None:
        if _copies(root) > budget:
            raise _walk_limit(budget + 1, budget, "", max_name)
        yield "", root
        return
    stack.append(("", kids))
    on_path.add(id(root))
    owners = [root]
    while stack:
        prefix, it = stack[-1]
        step = next(it, None)
        if step is None:
            stack.pop()
            on_path.discard(id(owners.pop()))
            continue
        visited += 1
        key, child = step
        if child is SKIPPED:  # an entry looked at and left out: its step counted, nothing listed
            if visited > budget:
                raise _walk_limit(visited, budget, prefix, max_name)
            continue
        name = f"{prefix}.{key}" if prefix else key
        characters += len(name)
        if visited > budget or characters > 16 * budget or len(name) > max_name:
            raise _walk_limit(visited, budget, name, max_name)
        grandkids = _children(child)
        if grandkids is not None and isinstance(child, Placeholder) and id(child) in on_path:
            grandkids = None  # a link back to an enclosing placeholder (a _parent): described, not walked
        if grandkids is None:
            visited += _copies(child)
            if visited > budget:
                raise _walk_limit(visited, budget, name, max_name)
            yield name, child
        elif id(child) in on_path:
            raise CorruptFileError(f"the pickled object contains itself at {short_repr(name)} (a cycle)")
        elif len(stack) >= max_depth:
            raise CorruptFileError(f"the pickled object nests deeper than {max_depth:,} levels "
                                   f"{limits_hint('nesting_depth')}")
        else:
            stack.append((name, grandkids))
            on_path.add(id(child))
            owners.append(child)


def _walk_limit(visited: int, budget: int, name: str, max_name: int) -> CorruptFileError:
    if len(name) > max_name:
        return CorruptFileError(f"a flattened name is longer than {max_name:,} characters ({short_repr(name)}) "
                                f"{limits_hint('name_bytes')}")
    if visited > budget:
        return CorruptFileError(f"flattening the pickled object takes more than {budget:,} steps (entries visited "
                                "and list items copied; shared sub-objects expand each time they are reached: a "
                                "memo-sharing bomb?)")
    return CorruptFileError(f"the flattened names add up to more than {16 * budget:,} characters (deep nesting, "
                            "long keys, or shared sub-objects written out each time they are reached: a memo-sharing "
                            "bomb?)")
