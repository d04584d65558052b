"""The placeholder mode (``unknown_globals="placeholder"``): any global off the allowlist becomes an
inert placeholder, so that the tensors of any pickle — a whole ``torch.save(model)`` — can be read.

A placeholder is never imported and never called. The global becomes a class of its own (NEWOBJ
needs a type), made here for this one file by `Placeholders.get`, of metaclass `PlaceholderClass`
(a `.inert.FrozenClass`: nothing changes it, BUILD on the class itself is refused). Whatever the
pickle then does to it is *recorded*, as plain data:

* REDUCE ``cls(*args)`` and NEWOBJ ``cls.__new__(cls, *args)`` make a `Placeholder` instance
  holding ``args``; calling an instance (REDUCE on it) makes another, of the class ``<call>``,
  whose arguments are the callee and the call's arguments;
* BUILD stores the state as it is (``__setstate__``-like dunder keys are data: nothing is set);
* SETITEM(S) record items, APPEND(S) / ADDITEMS record list items.

Hashing and equality are by identity (a placeholder as a dict key costs what any object does),
and descriptions are bounded. `.flatten` then lists a placeholder instance as:

* a **module** — a state dict whose ``_parameters``, ``_buffers`` and ``_modules`` are dicts
  (``torch.nn.Module`` and its subclasses, ``Sequential``, ``ModuleList``, ``ModuleDict``) — by
  exactly the names ``state_dict()`` gives: parameters and buffers that are not None, less the
  buffers named in ``_non_persistent_buffers_set``, then each submodule under its name;
* anything else as a record: ``__class__`` (the global's dotted name), ``__args__`` (when called
  with arguments), the state's attributes (a dict state whose keys are plain names not starting
  with ``__``; any other state under ``__state__``), ``__items__`` and ``__list__``.

A placeholder that refers back to one it is inside of (a ``_parent`` link) is a leaf there,
described, not a cycle. In placeholder mode ``torch._tensor._rebuild_from_type_v2`` also takes a
placeholder as the tensor's type (a tensor subclass): the tensor is read as a plain tensor; its
function must still be a torch rebuild function. The replaced globals are listed, in the order
they were first met, as ``metadata["weightio.placeholders"]`` (`KEY`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...errors import CorruptFileError
from ...text import printable
from ..base import PLACEHOLDERS_KEY as KEY
from .inert import FrozenClass, Function, Token
from .refs import short_repr

__all__ = ["KEY", "MAX_PLACEHOLDERS", "OVERRIDES", "SKIPPED", "Placeholder", "PlaceholderClass", "Placeholders",
           "children", "module_class", "module_state"]

MAX_PLACEHOLDERS = 10_000  # distinct replaced globals in one file (each is a class made for it)
MAX_NAME = 1_000  # characters of a replaced global's module and name (Python's are a few dozen)


class PlaceholderClass(FrozenClass):
    """The metaclass of placeholder classes: a class made per replaced global, unchangeable."""

    dotted: str  # each class's own (`Placeholders.get` sets it in the class body)


class Placeholder(metaclass=PlaceholderClass):
    """An instance of a replaced global: what the pickle passed, recorded, never interpreted."""

    __slots__ = ("args", "state", "items", "listitems")
    args: tuple[Any, ...]
    state: Any
    items: dict[Any, Any] | None
    listitems: list[Any] | None
    allowlisted_as = "a placeholder"  # the global's name as messages show it (`weightio.text.printable`)
    dotted = "a placeholder"  # the global's name as the pickle spells it: what metadata lists
    bounded_repr = True  # its repr is short whatever the file holds (`.refs.short_repr` uses it)

    def __new__(cls, *args: Any) -> Placeholder:
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items, obj.listitems = args, None, None, None
        return obj

    def __init__(self, *args: Any) -> None:
        """Nothing: REDUCE runs it after `__new__` has recorded the arguments."""

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.items is None:
            self.items = {}
        self.items[key] = value

    def append(self, value: Any) -> None:
        if self.listitems is None:
            self.listitems = []
        self.listitems.append(value)

    add = append

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)

    def __call__(self, *args: Any) -> Placeholder:
        return _Call(self, *args)

    def __repr__(self) -> str:
        return f"<{type(self).allowlisted_as} placeholder>"


_Call = PlaceholderClass("Placeholder", (Placeholder,), {"__slots__": (), "allowlisted_as": "<call>",
                                                          "dotted": "<call>", "__qualname__": "Placeholder[<call>]"})


class Placeholders:
    """The placeholder classes of one file, made on first use, and the globals they replace."""

    def __init__(self) -> None:
        self.classes: dict[tuple[str, str], PlaceholderClass] = {}

    def get(self, module: str, name: str) -> PlaceholderClass:
        cls = self.classes.get((module, name))
        if cls is None:
            if len(self.classes) >= MAX_PLACEHOLDERS:
                raise CorruptFileError(f"the pickle names more than {MAX_PLACEHOLDERS:,} distinct globals outside "
                                       "the allowlist")
            dotted = f"{module}.{name}"
            if len(dotted) > MAX_NAME:
                raise CorruptFileError(f"the pickle names a global of {len(dotted):,} characters (placeholders "
                                       f"take names of at most {MAX_NAME:,})")
            # a name can hold ESC or a lone surrogate (STACK_GLOBAL takes any string): messages show it
            # escaped, as they show any text from a file; metadata lists it as the pickle spells it
            cls = self.classes[(module, name)] = PlaceholderClass(
                "Placeholder", (Placeholder,), {"__slots__": (), "allowlisted_as": printable(dotted), "dotted": dotted,
                                                "__qualname__": "Placeholder", "__module__": __name__})
        return cls

    @property
    def replaced(self) -> list[str]:
        """The replaced globals' dotted names, in the order they were first met."""
        return [cls.dotted for cls in self.classes.values()]


# ----------------------------------------------------------------------------- rebuilds in placeholder mode


def _lenient_from_type(standin: Function) -> Function:
    """``_rebuild_from_type_v2`` that takes a placeholder type (a tensor subclass) as torch.Tensor."""
    tensor = Token("torch", "Tensor", "tensor_type")

    def rebuild(func: Any, new_type: Any, args: Any, state: Any) -> Any:
        return standin(func, tensor if isinstance(new_type, PlaceholderClass) else new_type, args, state)

    return Function(standin.module, standin.name, rebuild)


def overrides(allowlist: dict[tuple[str, str], Any]) -> dict[tuple[str, str], Any]:
    """The stand-ins placeholder mode uses instead of the allowlist's, by ``(module, name)``."""
    keys = [(m, n) for m in ("torch._tensor", "torch.tensor") for n in ("_rebuild_from_type_v2", "_rebuild_from_type")]
    return {key: _lenient_from_type(allowlist[key]) for key in keys if key in allowlist}


OVERRIDES: dict[tuple[str, str], Any] = {}  # filled by .unpickler (it holds the allowlist)


def module_class(pid: tuple, fail: Any) -> Any:
    """A legacy ``("module", class, source file, source)`` persistent id in placeholder mode: the
    class (its source, which torch would compare with the running code, is never looked at).
    `fail(message)` makes the container's error."""
    if len(pid) != 4 or not isinstance(pid[1], type):
        raise fail(f"persistent id {short_repr(pid)} is not ('module', class, source file, source)")
    return pid[1]


# ----------------------------------------------------------------------------- flattening


def module_state(obj: Placeholder) -> dict | None:
    """The state of a placeholder that is a torch module (see the module docstring), else None."""
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2:
        state = state[0]
    if (isinstance(state, dict) and isinstance(state.get("_parameters"), dict)
            and isinstance(state.get("_buffers"), dict) and isinstance(state.get("_modules"), dict)):
        return state
    return None


SKIPPED = Token("weightio", "SKIPPED", "skipped")  # what `children` yields for an entry it leaves out


def children(obj: Placeholder, component: Any) -> Iterator[tuple[str, Any]]:
    """The (name component, child) pairs `.flatten` walks into; `component` names a key. An entry
    left out (a None parameter, a non-persistent buffer) comes as ``("", SKIPPED)``: looking at it
    is work, which `.flatten` counts against its budget like any other step (a module of 10^5 None
    parameters reached 10^5 times would otherwise cost 10^10 steps for free)."""
    state = module_state(obj)
    if state is not None:
        return _module_children(state, component)
    return _record_children(obj, component)


def _module_children(state: dict, component: Any) -> Iterator[tuple[str, Any]]:
    skip = state.get("_non_persistent_buffers_set")
    if skip is None:
        skip = ()
    elif not isinstance(skip, (set, frozenset, dict)):  # `in` on a list would make this quadratic
        raise CorruptFileError("a module's _non_persistent_buffers_set is not a set")
    for key, value in state["_parameters"].items():
        yield ("", SKIPPED) if value is None else (component(key), value)
    for key, value in state["_buffers"].items():
        yield ("", SKIPPED) if value is None or key in skip else (component(key), value)
    for key, value in state["_modules"].items():
        yield ("", SKIPPED) if value is None else (component(key), value)


def _record_children(obj: Placeholder, component: Any) -> Iterator[tuple[str, Any]]:
    yield "__class__", type(obj).dotted
    if obj.args:
        yield "__args__", list(obj.args) if _plain_list(obj.args) else obj.args
    state = obj.state
    if isinstance(state, dict) and all(isinstance(k, str) and not k.startswith("__") for k in state):
        yield from state.items()
    elif state is not None:
        yield "__state__", state
    if obj.items is not None:
        yield "__items__", obj.items
    if obj.listitems is not None:
        yield "__list__", obj.listitems


def _plain_list(values: tuple) -> bool:
    return all(isinstance(v, (str, int, float, bool, type(None))) for v in values)
