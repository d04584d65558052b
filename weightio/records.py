"""The core records: what a reader says about one stored tensor, and what a writer consumes.

Everything above the format modules speaks in these two records, and the format modules speak
in nothing else: a reader returns a `TensorInfo` per tensor; a writer takes a `TensorSource`
per tensor. Both are plain data with no reference to views, checkpoints or devices, so this
module sits at the bottom of the layering (see docs/architecture.md) beside `errors`,
`dtypes` and `limits`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .text import dims, number

__all__ = ["MAX_NDIM", "TensorInfo", "TensorSource", "byte_extent", "little_endian", "new_info"]

MAX_NDIM = 64  # numpy's own limit; a larger rank cannot be viewed


class TensorInfo(NamedTuple):
    """Where one tensor's bytes are and how to read them (an immutable record).

    A `NamedTuple` rather than a frozen dataclass: readers build one per tensor while opening,
    and a frozen dataclass costs three times as much to construct (it matters at 100k tensors).

    Attributes:
        dtype: the element type as stored, byte order included (``>f4`` for big-endian data);
            for block-quantized tensors, the type they dequantize to (float32).
        shape: numpy-order shape.
        offset: byte offset of the first element within the reader's ``buffer(name)``.
        nbytes: bytes the tensor's data occupies as stored (``prod(shape) * itemsize``; packed
            sub-byte types and quantized blocks: their real byte count).
        strides: byte strides for non-contiguous (e.g. transposed torch) tensors; None means C order.
        ggml_type: the ggml block type name (``"Q4_K"``) for quantized tensors, else None.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    strides: tuple[int, ...] | None = None
    ggml_type: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:  # every number bounded (weightio.text): a repr never fails
        strides = "None" if self.strides is None else dims(self.strides, "()")
        return (f"TensorInfo(dtype={self.dtype!r}, shape={dims(self.shape, '()')}, offset={number(self.offset)}, "
                f"nbytes={number(self.nbytes)}, strides={strides}, ggml_type={self.ggml_type!r})")

    def stored_range(self) -> tuple[int, int]:
        """The half-open byte range ``[start, stop)`` of the buffer this tensor's elements touch."""
        if self.strides is None:
            return self.offset, self.offset + self.nbytes
        lo, hi = byte_extent(self.shape, self.strides, self.dtype.itemsize)
        return self.offset + lo, self.offset + hi


# ``new_info((dtype, shape, offset, nbytes, strides, ggml_type))``: a `TensorInfo` built in C, for
# readers that make one per tensor while opening (the class call runs a Python-level ``__new__``);
# every field must be given.
new_info = functools.partial(tuple.__new__, TensorInfo)


def byte_extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The half-open byte range ``[lo, hi)`` a strided view touches, relative to its first element."""
    if any(d == 0 for d in shape):
        return (0, 0)
    lo = sum(s * (d - 1) for d, s in zip(shape, strides, strict=True) if s < 0)
    hi = sum(s * (d - 1) for d, s in zip(shape, strides, strict=True) if s > 0) + itemsize
    return (lo, hi)


@dataclass(frozen=True)
class TensorSource:
    """One tensor to write: described up front, its bytes fetched when the writer reaches it.

    Every writer needs each tensor's dtype, shape and size before it writes a byte (headers come
    first), but must never hold more than one tensor's data at once.

    Attributes:
        name: its name in the output.
        dtype: native-order numpy dtype of the elements (float32 for a quantized tensor).
        shape: numpy-order shape.
        nbytes: bytes it occupies in the output.
        fetch: returns the data: a C-contiguous array of `dtype`, or the stored bytes (``uint8``)
            when `code` or `ggml_type` says the bytes are packed.
        code: the safetensors dtype code when fixed by the source (packed sub-byte types), else
            None (the writer derives it from `dtype`).
        ggml_type: the ggml block type when `fetch` returns quantized blocks to copy as they are.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    fetch: Callable[[], np.ndarray]
    code: str | None = None
    ggml_type: str | None = None

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
