"""torch's legacy tensor classes, as pickles of torch before 0.4 (and plain ``pickle.dump`` of
such tensors) use them: the class called with no arguments, then BUILD with its state::

    GLOBAL 'torch FloatTensor'  EMPTY_TUPLE  REDUCE (or NEWOBJ)     an empty float32 tensor
    (storage, storage_offset, size, stride)  BUILD                 Tensor.set_(*state)

torch's ``weights_only`` unpickler (torch 2.13, ``torch/_weights_only_unpickler.py``) allows the
classes (``torch.Tensor`` and every class of ``torch._tensor_classes``), builds them by REDUCE or
NEWOBJ, and answers BUILD on a ``torch.Tensor`` with ``inst.set_(*state)``. Of what ``set_``
takes, a state here is a tuple or list of:

* ``(storage, offset, size, stride)`` — what those torch versions wrote (``Tensor.__getstate__``);
* ``(storage, offset, size)`` — contiguous strides; ``(storage,)`` — the whole storage, 1-D;
* ``()`` — ``set_()``, which leaves the tensor empty, as is a class never given a state.

The storage must have the class's dtype (``torch.Tensor``: float32), as ``set_`` requires;
the view is checked against it like any other (`.reader`). Everything else is refused with a
`CorruptFileError`: constructor arguments (``torch.FloatTensor(3)`` allocates uninitialized
memory), another state (a dict, a tensor as source, five items), another storage dtype.

Each class is a `FrozenClass` (NEWOBJ needs a class; the class itself cannot be changed); its
instances are per-pickle `TensorRef`s that BUILD fills in place (every reference sees it).
"""

from __future__ import annotations

from typing import Any

from ...errors import CorruptFileError
from .inert import FrozenClass
from .refs import StorageRef, TensorRef, short_repr

__all__ = ["LegacyTensor", "TENSOR", "legacy_tensor_classes"]

_MAX_NDIM = 64
# The dense legacy classes torch.<Name>Tensor (and torch.cuda.<Name>Tensor) -> their dtype.
_CLASSES = {"Double": "float64", "Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
            "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


class LegacyTensor(TensorRef):
    """An instance of a legacy tensor class: empty until BUILD gives it a storage and a view.

    Attributes (of each class): ``allowlisted_as`` (``"torch.FloatTensor"``) and ``torch_dtype``.
    """

    __slots__ = ()
    allowlisted_as = "torch.Tensor"
    torch_dtype = "float32"

    def __new__(cls, *args: Any) -> LegacyTensor:
        if args:
            shown = ", ".join(short_repr(a, 24) for a in args[:3]) + (", …" if len(args) > 3 else "")
            raise CorruptFileError(f"{cls.allowlisted_as}({shown}): a legacy tensor class called "
                                   "with arguments (checkpoints call it with none, then give its state)")
        obj = object.__new__(cls)
        TensorRef.__init__(obj, None, 0, (0,), (1,))
        return obj

    def __init__(self, *args: Any) -> None:  # REDUCE calls the class: all was done by __new__
        pass

    def __setstate__(self, state: Any) -> None:
        name = type(self).allowlisted_as
        if not isinstance(state, (tuple, list)) or len(state) not in (0, 1, 3, 4):
            raise CorruptFileError(f"{name} state {short_repr(state)} is not (storage[, offset, size[, stride]]), "
                                   "what Tensor.set_ takes")
        if not state:
            return
        storage = state[0]
        if type(storage) is not StorageRef:
            raise CorruptFileError(f"{name} state: {short_repr(storage)} is not a torch storage")
        if storage.dtype != self.torch_dtype:
            raise CorruptFileError(f"{name} state holds a {storage.dtype} storage; torch refuses any but "
                                   f"{self.torch_dtype} (Tensor.set_: 'Expected a Storage of type …')")
        if len(state) == 1:
            TensorRef.__init__(self, storage, 0, (storage.view_numel,), (1,))
            return
        size = state[2]
        stride = state[3] if len(state) == 4 else _contiguous_strides(size)
        TensorRef.__init__(self, storage, state[1], size, stride)


def _contiguous_strides(size: Any) -> tuple[int, ...] | None:
    """C-contiguous strides of `size`, or None when it is not a short sequence of small non-negative
    ints (the reader then refuses the view, naming the tensor)."""
    if not isinstance(size, (tuple, list)) or len(size) > _MAX_NDIM:
        return None
    if not all(type(d) is int and 0 <= d < 1 << 64 for d in size):
        return None
    strides, step = [], 1
    for d in reversed(size):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _tensor_class(allowlisted_as: str, torch_dtype: str) -> FrozenClass:
    body = {"__slots__": (), "allowlisted_as": allowlisted_as, "torch_dtype": torch_dtype,
            "__module__": __name__, "__doc__": f"``{allowlisted_as}``: a legacy {torch_dtype} tensor."}
    return FrozenClass(allowlisted_as.replace(".", "_"), (LegacyTensor,), body)


TENSOR = _tensor_class("torch.Tensor", "float32")  # torch.Tensor() has torch's default dtype


def legacy_tensor_classes() -> dict[tuple[str, str], FrozenClass]:
    """The allowlist entries: ``torch.Tensor`` and ``torch[.cuda].<Name>Tensor`` -> their class."""
    table = {("torch", "Tensor"): TENSOR}
    for prefix in ("torch", "torch.cuda"):
        for kind, dtype in _CLASSES.items():
            table[(prefix, f"{kind}Tensor")] = _tensor_class(f"{prefix}.{kind}Tensor", dtype)
    return table
