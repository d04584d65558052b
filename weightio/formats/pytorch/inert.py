"""The three kinds of object an allowlisted global can be: inert, immutable, shared safely.

`Unpickler.find_class` returns the same object for a global every time, to every pickle the
process reads. A pickle can apply any generic opcode to an object on its stack, globals
included; CPython's C unpickler (``Modules/_pickle.c``) then does:

* ``BUILD`` (``load_build``): looks ``__setstate__`` up *on the object* (on a class: through
  its type first, so a metaclass's data descriptor wins) and calls it with the state; without
  one, updates ``obj.__dict__`` from a dict state and ``setattr(obj, key, value)`` for each
  key of a ``(dict, slotstate)`` pair's slot state — on a function that rewrites
  ``__defaults__``, ``__kwdefaults__`` or ``__code__``; on a class, its attributes;
* ``NEWOBJ`` (``load_newobj``): requires a type and calls ``cls.__new__(cls, *args)``, never
  ``__init__``;
* ``REDUCE`` (``load_reduce``): ``callable(*args)``;
* ``SETITEM(S)`` / ``APPEND(S)`` / ``ADDITEMS``: ``obj[key] = value``, ``obj.append`` /
  ``obj.extend``, ``obj.add`` (found by attribute lookup when ``obj`` is not a list or set).

Were any of these to change a global, one file (even one refused, even one only scanned)
would change how every later file in the process reads. So every allowlisted global is one of:

* `Function` — a callable stand-in: REDUCE calls its private function, and nothing else
  works (no ``__dict__``, no attribute writes, BUILD refused, not a type for NEWOBJ);
* `Token` — a value (a dtype, a storage class, a layout): not callable, frozen, BUILD refused;
* a class whose metaclass is `FrozenClass`, for the rare global that pickles build with
  ``NEWOBJ`` (``argparse.Namespace``, protocol 2+): its ``__new__`` validates its arguments and
  builds the whole object (NEWOBJ never runs ``__init__``); the class cannot be changed.

``tests/test_pickle.py`` checks every value of the allowlist against each opcode above.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ...errors import UnsafePickleError

__all__ = ["FrozenClass", "Function", "Token"]


def _unchangeable(what: str) -> UnsafePickleError:
    return UnsafePickleError(f"{what} is an allowlisted global and cannot be changed (BUILD, setattr); refused")


class _Inert:
    """What `Function` and `Token` share: no ``__dict__``, no attribute writes, and every opcode
    that would change them refused by name (CPython looks ``append``/``extend``/``add`` up by
    attribute on anything but a list or set)."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError(f"BUILD on {self} (an allowlisted global) is not allowed")

    def __setattr__(self, name: str, value: Any) -> None:
        raise _unchangeable(str(self))

    def __delattr__(self, name: str) -> None:
        raise _unchangeable(str(self))

    def __setitem__(self, key: Any, value: Any) -> None:
        raise UnsafePickleError(f"SETITEM on {self} (an allowlisted global) is not allowed")

    def _no_items(self, *items: Any) -> None:
        raise UnsafePickleError(f"APPEND or ADDITEMS on {self} (an allowlisted global) is not allowed")

    append = extend = add = _no_items


class Function(_Inert):
    """A callable global (``torch._utils._rebuild_tensor_v2``, ``collections.OrderedDict`` …).

    Attributes:
        module, name: the global it stands for, as the pickle spells it.
        kind: ``"rebuild"`` for torch's tensor rebuild functions, else ``"function"``.
    """

    __slots__ = ("module", "name", "kind", "_call")
    module: str  # (the slots, declared for type checkers: __init__ sets them past the refusing __setattr__)
    name: str
    kind: str
    _call: Callable[..., Any]

    def __init__(self, module: str, name: str, call: Callable[..., Any], kind: str = "function") -> None:
        for attr, value in (("module", module), ("name", name), ("kind", kind), ("_call", call)):
            object.__setattr__(self, attr, value)

    # REDUCE calls the stand-in: ``__call__`` hands over the private function itself (a C-level
    # getter), which the call then runs — no Python frame of its own between the unpickler and the
    # function, twice per tensor of a checkpoint. Read-only like every other attribute.
    __call__ = property(operator.attrgetter("_call"))

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


class Token(_Inert):
    """An allowlisted global that is a value, not a function: a dtype, a storage class, a layout.

    Tokens are not callable and take no state: a pickle that calls or BUILDs one is refused.

    Attributes:
        module, name: the global. kind: ``"dtype"``, ``"storage"``, ``"layout"`` …
        value: what it means (a dtype's canonical name, a storage's element dtype), or None.
    """

    __slots__ = ("module", "name", "kind", "value")
    module: str  # (the slots, declared for type checkers: __init__ sets them past the refusing __setattr__)
    name: str
    kind: str
    value: Any

    def __init__(self, module: str, name: str, kind: str, value: Any = None) -> None:
        for attr, v in (("module", module), ("name", name), ("kind", kind), ("value", value)):
            object.__setattr__(self, attr, v)

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


def _refuse_class_build(cls: FrozenClass) -> Callable[[Any], None]:
    def refuse(state: Any) -> None:
        raise UnsafePickleError(f"BUILD on the class {cls.allowlisted_as} (not an instance of it) is not allowed")

    return refuse


class FrozenClass(type):
    """The metaclass of class stand-ins: the class itself is immutable.

    Set ``allowlisted_as`` (the global's name, for messages) in the class body. Instances are
    per-pickle objects and may take state (through their own ``__setstate__``).
    """

    allowlisted_as: str

    # BUILD on the class looks ``__setstate__`` up through the metaclass first: this data
    # descriptor wins over the class's own (instance) method, which would otherwise be called
    # unbound with the state as ``self``.
    __setstate__ = property(_refuse_class_build)

    def __setattr__(cls, name: str, value: Any) -> None:
        raise _unchangeable(f"the class {cls.allowlisted_as}")

    def __delattr__(cls, name: str) -> None:
        raise _unchangeable(f"the class {cls.allowlisted_as}")
