"""Stand-ins for torch's rebuild functions (``torch._utils._rebuild_tensor_v2`` …): each returns a
`TensorRef` record of what the pickle passed, checked later by the reader, never a tensor.
"""

from __future__ import annotations

from typing import Any

from ...errors import CorruptFileError, UnsafePickleError
from .inert import Function, Token
from .legacy_tensors import TENSOR
from .refs import NestedRef, StorageRef, TensorRef, check_state, short_repr

__all__ = ["LAYOUTS", "effective_dtype", "torch_functions"]

_LAYOUT_NAMES = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
LAYOUTS = {f"torch.{n}": Token("torch", n, "layout") for n in _LAYOUT_NAMES}


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> TensorRef:
    return TensorRef(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, metadata: Any = None) -> TensorRef:
    return TensorRef(storage, storage_offset, size, stride, None, "dense", "", metadata)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, dtype: Any, metadata: Any = None) -> TensorRef:
    return TensorRef(storage, storage_offset, size, stride, dtype=dtype, metadata=metadata)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any) -> Any:
    return data


def _rebuild_parameter_with_state(data: Any, requires_grad: Any, backward_hooks: Any, state: Any) -> Any:
    check_state(state, "a Parameter's state")
    return data


def _rebuild_qtensor(storage: Any, storage_offset: Any, size: Any, stride: Any, quantizer_params: Any,
                     requires_grad: Any, backward_hooks: Any) -> TensorRef:
    scheme = quantizer_params[0] if isinstance(quantizer_params, tuple) and quantizer_params else None
    note = (f"quantized tensor ({scheme}); weightio does not dequantize torch quantized tensors — call "
            ".dequantize() in torch before saving")
    return TensorRef(storage, storage_offset, size, stride, kind="quantized", note=note)


def _rebuild_sparse_tensor(layout: Any, data: Any) -> TensorRef:
    """COO: ``(indices, values, size[, is_coalesced])``; compressed: ``(compressed, plain, values, size)``."""
    coo = isinstance(layout, Token) and layout.name == "sparse_coo"
    parts = data if isinstance(data, tuple) else ()
    first = 1 if coo else 2  # where values and size are
    values, size = parts[first:first + 2] if len(parts) >= first + 2 else (None, None)
    dtype = values.dtype if isinstance(values, TensorRef) else None
    if dtype is None and isinstance(values, TensorRef) and isinstance(values.storage, StorageRef):
        dtype = values.storage.dtype
    note = f"sparse tensor ({layout}); numpy has no sparse layout — call .to_dense() in torch before saving"
    return TensorRef(None, 0, size, None, dtype=dtype, kind="sparse", note=note)


def _rebuild_nested_tensor(buffer: Any, sizes: Any, strides: Any, storage_offsets: Any) -> NestedRef:
    """A strided nested tensor: checked, and its components listed, by the reader."""
    return NestedRef(buffer, sizes, strides, storage_offsets)


def _rebuild_meta_tensor_no_storage(dtype: Any, size: Any, stride: Any, requires_grad: Any) -> TensorRef:
    return TensorRef(None, 0, size, stride, dtype=dtype, kind="meta",
                     note="meta tensor: it has a shape but no data (saved from device='meta')")


def _rebuild_device_tensor_from_cpu_tensor(data: Any, dtype: Any, device: Any, requires_grad: Any) -> Any:
    """An XLA/MTIA tensor saved through a CPU copy: that copy, when no dtype conversion was asked."""
    if isinstance(data, TensorRef) and isinstance(dtype, Token) and dtype.value == effective_dtype(data):
        return data
    return TensorRef(None, 0, getattr(data, "size", None), None, dtype=dtype, kind="unsupported",
                     note=f"device tensor ({device}) saved with a dtype conversion, which weightio does not apply")


def effective_dtype(ref: TensorRef) -> str | None:
    """The torch dtype name of a tensor: its explicit dtype, else its storage's."""
    if isinstance(ref.dtype, Token):
        return ref.dtype.value
    return ref.storage.dtype if isinstance(ref.storage, StorageRef) else None


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """``torch._tensor._rebuild_from_type_v2``: a tensor with Python attributes, or a subclass.

    Accepted only when `func` is one of the rebuild stand-ins, the type is ``torch.Tensor`` or
    ``torch.nn.Parameter``, and the state has no dunder keys; then it is ``func(*args)``.
    """
    if not (isinstance(func, Function) and func.kind == "rebuild"):
        raise UnsafePickleError(f"_rebuild_from_type_v2 with function {short_repr(func)}, which is not a torch "
                                "rebuild function; refused")
    if not (isinstance(new_type, Token) and new_type.kind == "tensor_type") and new_type is not TENSOR:
        raise UnsafePickleError(f"_rebuild_from_type_v2 with type {short_repr(new_type)}; only torch.Tensor and "
                                "torch.nn.Parameter are allowed")
    if not isinstance(args, tuple):
        raise CorruptFileError(f"_rebuild_from_type_v2 arguments must be a tuple, found {type(args).__name__}")
    check_state(state, "a tensor's state")
    return func(*args)


def _rebuild_from_type(func: Any, new_type: Any, args: Any, dict_: Any) -> Any:
    return _rebuild_from_type_v2(func, new_type, args, dict_)




def _size(sizes: Any = ()) -> tuple:
    """``torch.Size``: a tuple of ints (as in torch), so never a tuple of nested containers."""
    if not isinstance(sizes, (tuple, list)) or not all(type(d) is int for d in sizes):
        raise CorruptFileError(f"torch.Size takes a tuple of ints, found {short_repr(sizes)}")
    return tuple(sizes)


def _device(kind: Any, index: Any = None) -> str:
    if not isinstance(kind, str) or not (index is None or type(index) is int):
        raise CorruptFileError(f"torch.device({short_repr(kind)}, {short_repr(index)}) is malformed")
    return kind if index is None else f"{kind}:{index}"


def _get_layout(name: Any) -> Token:
    layout = LAYOUTS.get(name) if isinstance(name, str) else None
    if layout is None:
        raise CorruptFileError(f"unknown torch layout {short_repr(name)}")
    return layout


_REBUILDS = (_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter, _rebuild_parameter_with_state,
            _rebuild_qtensor, _rebuild_sparse_tensor, _rebuild_meta_tensor_no_storage,
             _rebuild_device_tensor_from_cpu_tensor, _rebuild_nested_tensor)


def torch_functions() -> dict[tuple[str, str], Function]:
    """The allowlist entries of torch's functions: ``(module, name)`` -> its stand-in, one per spelling."""
    table: dict[tuple[str, str], Function] = {}

    def function(module: str, name: str, call: Any, kind: str = "function") -> None:
        table[(module, name)] = Function(module, name, call, kind)

    for func in _REBUILDS:
        function("torch._utils", func.__name__, func, "rebuild")
    function("torch._utils", "_rebuild_xla_tensor", _rebuild_device_tensor_from_cpu_tensor, "rebuild")
    for module in ("torch._tensor", "torch.tensor"):  # torch.tensor: the module's name before torch 1.9
        function(module, "_rebuild_from_type_v2", _rebuild_from_type_v2)
        function(module, "_rebuild_from_type", _rebuild_from_type)
    function("torch.serialization", "_get_layout", _get_layout)
    function("torch", "Size", _size)
    function("torch", "device", _device)
    return table
