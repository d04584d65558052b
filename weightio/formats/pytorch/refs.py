"""What the stand-ins of `.allowlist` build, and how any unpickled value is described in messages.

`StorageRef` and `TensorRef` are records of what a pickle passed to torch's rebuild functions;
nothing in them is checked until the reader builds its index, so that errors can name the tensor.
`short_repr` describes any unpickled value in bounded time and length (it never walks shared
structure), for error messages.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from ...errors import CorruptFileError, UnsafePickleError
from .inert import FrozenClass, Function, Token

__all__ = ["NestedRef", "StorageRef", "TensorRef", "check_state", "short_repr"]


class StorageRef:
    """A torch storage as a persistent id describes it: where its bytes are is the container's business.

    Attributes:
        key: the storage key (zip: the ``data/<key>`` record; legacy: the key in the storage list).
        dtype: the torch dtype name of its elements (``"float32"``, ``"qint8"`` …).
        numel: elements the id claims the storage holds.
        view_offset, view_numel: a legacy storage *view*: its elements within the root storage.
    """

    __slots__ = ("key", "dtype", "numel", "view_offset", "view_numel")

    def __init__(self, key: str, dtype: Any, numel: int, view_offset: int = 0, view_numel: int | None = None) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel
        self.view_offset = view_offset
        self.view_numel = numel if view_numel is None else view_numel

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError("BUILD on a storage is not allowed")

    def __repr__(self) -> str:
        return _describe(self, 2)


class TensorRef:
    """A tensor as the pickle describes it. Nothing is checked until the reader builds its index
    (so that errors can name the tensor).

    Attributes:
        storage: what the pickle passed as storage (a `StorageRef` when well formed).
        offset, size, stride: in elements, as passed to ``_rebuild_tensor*``.
        dtype: an explicit dtype (``_rebuild_tensor_v3``, meta tensors), else None (the storage's).
        kind: ``"dense"``, ``"meta"``, ``"quantized"``, ``"sparse"``, or ``"unsupported"``.
        note: for non-dense kinds, what to tell the user.
        metadata: the tensor metadata dict of ``_rebuild_tensor_v2/v3`` (conj / neg bits).
    """

    __slots__ = ("storage", "offset", "size", "stride", "dtype", "kind", "note", "metadata")

    def __init__(self, storage: Any, offset: Any, size: Any, stride: Any, dtype: Any = None,
                 kind: str = "dense", note: str = "", metadata: Any = None) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.dtype, self.kind, self.note, self.metadata = dtype, kind, note, metadata

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError("BUILD on a tensor is not allowed (tensor state goes through _rebuild_from_type_v2)")

    def __repr__(self) -> str:
        return _describe(self, 2)

class NestedRef(TensorRef):
    """A strided nested tensor (``torch._utils._rebuild_nested_tensor``): its components are views
    of one flat `buffer` tensor, component i of size ``sizes[i]``, stride ``strides[i]`` at
    storage offset ``offsets[i]``, each given as an int64 tensor (rows of `sizes` and `strides`).
    The reader reads those three and lists the components (``name[0]``, ``name[1]`` …).
    """

    __slots__ = ("buffer", "sizes", "strides", "offsets")

    def __init__(self, buffer: Any, sizes: Any, strides: Any, offsets: Any) -> None:
        super().__init__(None, 0, None, None, kind="nested", note="nested tensor")
        self.buffer, self.sizes, self.strides, self.offsets = buffer, sizes, strides, offsets


def check_state(state: Any, what: str) -> None:
    """Object state set by BUILD-like calls: a dict (or (dict, slots dict)) of plain attribute names."""
    parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
    for part in parts:
        if part is None:
            continue
        if not isinstance(part, dict):
            raise CorruptFileError(f"{what} must be a dict, found {type(part).__name__}")
        for key in part:
            if not isinstance(key, str) or key.startswith("__"):
                raise UnsafePickleError(f"{what} sets attribute {short_repr(key)}; dunder or non-string "
                                        "attribute names are refused")


def short_repr(value: Any, limit: int = 80) -> str:
    """A bounded one-line description of any unpickled value (never expands shared structure)."""
    text = _describe(value, 2)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(value: Any, depth: int) -> str:
    if type(value) is int:
        return repr(value) if value.bit_length() <= 256 else f"<int of {value.bit_length():,} bits>"
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[:60]) + ("…" if len(value) > 60 else "")
    if isinstance(value, (float, bool, complex, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return _describe_container(value, depth)
    if isinstance(value, TensorRef):  # its parts are file values too: described within the same depth
        return f"<tensor {value.kind} size={_describe(value.size, max(depth - 1, 0))}>"
    if isinstance(value, StorageRef):
        parts = (value.key, value.dtype, value.view_numel)
        return "<storage {} {} x{}>".format(*(_describe(v, 0) for v in parts))
    if isinstance(value, (Function, Token)) or getattr(type(value), "bounded_repr", False):
        return repr(value)
    if isinstance(value, FrozenClass):
        return value.allowlisted_as
    return f"<{type(value).__name__}>"


def _describe_container(value: Any, depth: int) -> str:
    kind = type(value).__name__
    if depth == 0 and value:
        return f"<{kind} of {len(value):,}>"
    items = list(islice(value.items() if isinstance(value, dict) else value, 4))  # never a copy of all
    if isinstance(value, dict):
        body = ", ".join(f"{_describe(k, depth - 1)}: {_describe(v, depth - 1)}" for k, v in items)
    else:
        body = ", ".join(_describe(v, depth - 1) for v in items)
    body += ", …" if len(value) > 4 else ""
    if isinstance(value, dict):
        return "{" + body + "}"
    if isinstance(value, list):
        return "[" + body + "]"
    if isinstance(value, tuple):
        return "(" + body + ("," if len(value) == 1 else "") + ")"
    return f"{kind}({{{body}}})"
