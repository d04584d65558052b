"""What writers consume: tensors described up front, their bytes fetched one at a time.

Every writer needs each tensor's dtype, shape and size before it writes a byte (headers come
first), but must never hold more than one tensor's data at once. `tensor_sources` turns the
user's mapping (numpy arrays, `TensorView`s, torch tensors, …) into `TensorSource`s that
describe each tensor and fetch its bytes on demand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import TABLE, dtype_name
from ..errors import FormatError, UnsupportedDTypeError
from ..view import TensorView

__all__ = ["TensorSource", "check_materializable", "tensor_sources"]

_PACKED = {row.numpy: row for row in TABLE if row.packed}
_ML_DTYPES = frozenset(row.numpy for row in TABLE if row.numpy.kind == "V")  # bfloat16, float8_*, …


@dataclass
class TensorSource:
    """One tensor to write.

    Attributes:
        name: its name in the output.
        dtype: native-order numpy dtype of the elements.
        shape: numpy-order shape.
        nbytes: bytes it occupies in the output.
        code: the safetensors dtype code when fixed by the source (packed sub-byte types), else
            None (the writer derives it from `dtype`).
        fetch: returns the data: a C-contiguous array, or for packed types the packed bytes.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    code: str | None
    fetch: Callable[[], np.ndarray]

    def array(self) -> np.ndarray:
        """The data as a C-contiguous array in native byte order."""
        return np.ascontiguousarray(self.fetch())

    def little_endian_bytes(self) -> np.ndarray:
        """The data as C-ordered little-endian elements (what safetensors, GGUF and npz store)."""
        return little_endian(self.fetch())


def little_endian(arr: np.ndarray) -> np.ndarray:
    """`arr` as a C-contiguous array of little-endian elements (itself when it already is one)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


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
    return TensorSource(name, dtype, tuple(arr.shape), arr.size * dtype.itemsize, None, lambda: arr)


def _view_source(name: str, view: TensorView, path: str, packed_ok: bool) -> TensorSource:
    info = view.info
    if info.ggml_type is None and info.dtype in _PACKED:
        row = _PACKED[info.dtype]
        if not packed_ok:
            raise UnsupportedDTypeError(f"{row.safetensors} (packed sub-byte) cannot be stored in this format",
                                        path=path, tensor=name)
        return TensorSource(name, view.dtype, info.shape, info.nbytes, row.safetensors, view.raw)
    nbytes = check_materializable(view, path)
    return TensorSource(name, view.dtype, info.shape, nbytes, None, view.numpy)


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
    from .base import byte_extent

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

