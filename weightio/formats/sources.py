"""What writers consume: tensors described up front, their bytes fetched one at a time.

Every writer needs each tensor's dtype, shape and size before it writes a byte (headers come
first), but must never hold more than one tensor's data at once. `tensor_sources` turns the
user's mapping (numpy arrays, `TensorView`s, torch tensors, …) into `TensorSource`s that
describe each tensor and fetch its bytes on demand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..dtypes import TABLE, dtype_name
from ..errors import FormatError, UnsupportedDTypeError
from ..records import TensorSource, byte_extent
from ..view import TensorView

__all__ = ["TensorSource", "check_materializable", "tensor_sources"]

_PACKED = {row.numpy: row for row in TABLE if row.packed}
_ML_DTYPES = frozenset(row.numpy for row in TABLE if row.numpy.kind == "V")  # bfloat16, float8_*, …


def tensor_sources(tensors: Mapping[str, Any], *, path: str, packed_ok: bool = False) -> list[TensorSource]:
    """Describe every tensor of `tensors` without reading tensor data from checkpoint views.

    Args:
        tensors: name -> numpy array, `TensorView`, or anything `weightio.devices.as_numpy` accepts.
        path: the output path (for error messages).
        packed_ok: whether the output format stores packed sub-byte types (safetensors F4/F6).

    Raises:
        FormatError: `tensors` is not a mapping of str names.
        UnsupportedDTypeError: an object, string or other non-numeric array.
    """
    if not isinstance(tensors, Mapping):
        raise FormatError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}", path=path)
    return [_source(name, value, path, packed_ok) for name, value in tensors.items()]


def _source(name: Any, value: Any, path: str, packed_ok: bool) -> TensorSource:
    if not isinstance(name, str):
        raise FormatError(f"tensor names must be str, got {type(name).__name__} {name!r}", path=path)
    if isinstance(value, TensorView):
        return _view_source(name, value, path, packed_ok)
    if not isinstance(value, np.ndarray):
        from ..devices import as_numpy

        value = as_numpy(value)
    dtype = value.dtype.newbyteorder("=")
    if dtype.kind not in "biufc" and dtype not in _ML_DTYPES:
        raise UnsupportedDTypeError(f"dtype {value.dtype} cannot be stored as a tensor", path=path, tensor=name)
    if dtype in _PACKED:
        raise UnsupportedDTypeError(
            f"{dtype_name(dtype)} arrays hold one element per byte; the packed {_PACKED[dtype].safetensors} "
            "layout is only copied from checkpoints that store it", path=path, tensor=name)
    arr = value
    return TensorSource(name, dtype, tuple(arr.shape), arr.size * dtype.itemsize, lambda: arr)


def _view_source(name: str, view: TensorView, path: str, packed_ok: bool) -> TensorSource:
    info = view.info
    if info.ggml_type is None and info.dtype in _PACKED:
        row = _PACKED[info.dtype]
        if not packed_ok:
            raise UnsupportedDTypeError(f"{row.safetensors} (packed sub-byte) cannot be stored in this format",
                                        path=path, tensor=name)
        return TensorSource(name, view.dtype, info.shape, info.nbytes, view.raw, code=row.safetensors)
    nbytes = check_materializable(view, path)
    return TensorSource(name, view.dtype, info.shape, nbytes, view.numpy)


# A strided view may repeat its stored bytes (stride 0: torch's expand): writing it out stores
# every element. Up to this much beyond its stored extent is fine; more is refused, so that a
# 1 kB file cannot make a writer allocate terabytes.
MAX_EXPANSION, EXPANSION_ALLOWANCE = 16, 256 << 20


def check_materializable(view: TensorView, path: str) -> int:
    """The bytes `view` occupies once written out in C order (its logical size).

    Raises:
        FormatError: a broadcast view whose logical size exceeds `MAX_EXPANSION` times the bytes
            it is stored in, plus `EXPANSION_ALLOWANCE`.
    """
    info = view.info
    nbytes = math.prod(info.shape) * view.dtype.itemsize
    if info.strides is None or info.ggml_type is not None:
        return nbytes
    lo, hi = byte_extent(info.shape, info.strides, info.dtype.itemsize)
    if nbytes > MAX_EXPANSION * (hi - lo) + EXPANSION_ALLOWANCE:
        raise FormatError(
            f"is a broadcast view (strides {info.strides}) of {nbytes:,} bytes over {hi - lo:,} stored bytes; "
            "writing it stores every element. Save it materialized (.contiguous()) if that is really meant",
            path=path, tensor=view.name)
    return nbytes

