"""The one small interface between the format modules and everything else.

A reader opens one file (one mapping), validates its header completely, and exposes:

* ``tensors``: ``name -> TensorInfo`` in file order;
* ``metadata``: a dict of the file's own metadata;
* ``buffer(name)``: the read-only ``uint8`` array that ``TensorInfo.offset`` indexes (the
  file mapping, or a lazily inflated member for compressed containers);
* ``close()``.

Readers know nothing of `Checkpoint`, the VarBuilder, devices, the hub or the CLI.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .._io import MappedFile
from ..errors import CorruptFileError
from ..limits import Limits
from ..limits import current as current_limits

__all__ = ["Reader", "TensorInfo", "check_extent", "byte_extent"]

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


def byte_extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The half-open byte range ``[lo, hi)`` a strided view touches, relative to its first element."""
    if any(d == 0 for d in shape):
        return (0, 0)
    lo = sum(s * (d - 1) for d, s in zip(shape, strides, strict=True) if s < 0)
    hi = sum(s * (d - 1) for d, s in zip(shape, strides, strict=True) if s > 0) + itemsize
    return (lo, hi)


def check_extent(info: TensorInfo, size: int, *, path: str, name: str, what: str = "the data") -> None:
    """`CorruptFileError` unless every byte `info` describes lies inside ``[0, size)``."""
    if info.strides is None:
        lo, hi = info.offset, info.offset + info.nbytes
    else:
        a, b = byte_extent(info.shape, info.strides, info.dtype.itemsize)
        lo, hi = info.offset + a, info.offset + b
    if lo < 0 or hi > size:
        raise CorruptFileError(f"bytes {lo}..{hi} lie outside {what} ({size} bytes)", path=path, tensor=name)


class Reader:
    """Base class of the per-format readers: one file, one mapping.

    Subclasses parse and validate the header in ``__init__`` (through `_validate`) and fill
    ``tensors`` and ``metadata``; nothing is exposed before validation is complete.
    """

    format: ClassVar[str]

    def __init__(self, source: str | os.PathLike[str] | MappedFile) -> None:
        self.file = source if isinstance(source, MappedFile) else MappedFile(source)
        self.path = self.file.path
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.limits: Limits = current_limits()  # read once: they also bound what buffer() inflates later

    def _validate(self, parse: Callable[..., None], *args: Any) -> None:
        """Run the header parser `parse(*args)`; if it fails, the file is released before the error leaves."""
        try:
            parse(*args)
        except BaseException:
            self.close()
            raise

    def buffer(self, name: str) -> np.ndarray:
        """The read-only ``uint8`` array that tensor `name`'s offset indexes.

        Readers may raise here for tensors that are listed but hold no readable data
        (`UnsupportedDTypeError` for a PyTorch meta tensor, say).
        """
        return self.file.data

    def siblings(self) -> list[str]:
        """Other files that belong to the same checkpoint as this one (the other parts of a
        split GGUF set, say), in order, this file excluded. `open` opens them too and serves
        every part as one checkpoint."""
        return []

    def close(self) -> None:
        self.file.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r}: {len(self.tensors)} tensors>"
