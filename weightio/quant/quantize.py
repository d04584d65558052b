"""Quantizers for the GGUF writer: float arrays to Q8_0 and Q4_0 blocks, and to F16 / BF16 / F32.

Each follows ggml's reference quantizer (``quantize_row_*_ref`` in ``ggml-quants.c``,
``ggml_compute_fp32_to_bf16`` in ``ggml-impl.h``) operation for operation in float32, so the
bytes equal what llama.cpp and ``gguf.quants.quantize`` produce:

* Q8_0: ``d = max|x| / 127``, ``q = roundf(x / d)`` (half away from zero), d stored as f16.
* Q4_0: ``m`` = the element of largest magnitude (the first one on ties), ``d = m / -8``,
  ``q = min(15, trunc(x / d + 8.5))``; element j in the low nibble of byte j, j + 16 in the high.
* BF16: round to nearest even; NaN kept NaN (made quiet).

Example:
    >>> q = quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "Q8_0")
    >>> q.ggml_type, q.shape, q.nbytes
    ('Q8_0', (2, 32), 68)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .._memory import heap_for_temporaries
from ..errors import UnsupportedDTypeError
from .decoding import dequantize
from .types import GGMLType, by_name

__all__ = ["QuantizedTensor", "quantize", "QUANTIZERS", "quantize_rows"]

_ROWS_PER_CHUNK_ELEMENTS = 1 << 20  # bound the float temporaries of one quantization step


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, halves away from zero (numpy's round goes to even)."""
    a = np.abs(v)
    f = np.floor(a)
    f += (a - f) >= 0.5  # a - floor(a) is exact, so no double rounding
    return np.copysign(f, v)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """(n, 32) float32 -> (n, 34) Q8_0 blocks."""
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = _round_half_away(x * inv).astype(np.int8)
    return np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    """(n, 32) float32 -> (n, 18) Q4_0 blocks."""
    first_max = np.abs(x).argmax(axis=1)[:, None]
    d = np.take_along_axis(x, first_max, axis=1) / np.float32(-8)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.trunc(x * inv + np.float32(8.5)), 15).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([d.astype("<f2").view(np.uint8), packed], axis=1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """(n, k) float32 -> (n, 2k) little-endian BF16 bytes, as ggml_compute_fp32_to_bf16."""
    u = np.ascontiguousarray(x, dtype="<f4").view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16  # cannot overflow: only NaNs come near 2^32
    h = np.where(nan, (u >> 16) | 64, rounded).astype("<u2")
    return h.view(np.uint8).reshape(x.shape[0], -1)


def _plain(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    def convert(x: np.ndarray) -> np.ndarray:
        return x.astype(dtype).view(np.uint8).reshape(x.shape[0], -1)

    return convert


# ggml type -> function from (n, block_size) float32 blocks (rows for plain types) to their bytes
QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "BF16": _bf16,
    "F16": _plain("<f2"),
    "F32": _plain("<f4"),
}


def quantize_rows(x: np.ndarray, ggml_type: str) -> np.ndarray:
    """The stored bytes of float array `x` as `ggml_type`, shape ``(rows, row_bytes)``.

    Works through bounded groups of rows, so a large tensor needs little more memory than its
    output. The last axis of `x` must be a whole number of blocks.
    """
    t = by_name(ggml_type)
    if t is None or t.name not in QUANTIZERS:
        raise UnsupportedDTypeError(f"cannot quantize to {ggml_type!r}; choose one of {', '.join(QUANTIZERS)}")
    x = np.asarray(x)
    row = x.shape[-1] if x.ndim else 1
    if row % t.block_size:
        raise UnsupportedDTypeError(f"rows of {row} elements are not whole {t.name} blocks of {t.block_size}")
    rows = x.reshape(-1, row) if x.size else x.reshape(-1, max(row, 1))
    out = np.empty((rows.shape[0], t.row_bytes(row)), np.uint8)
    step = max(1, _ROWS_PER_CHUNK_ELEMENTS // max(row, 1))
    heap_for_temporaries()  # each group's temporaries reused from the heap, not fresh pages every group
    with np.errstate(all="ignore"):  # NaN/inf inputs quantize as ggml's arithmetic makes them
        for start in range(0, rows.shape[0], step):
            chunk = rows[start:start + step].astype(np.float32)
            out[start:start + step] = QUANTIZERS[t.name](chunk.reshape(-1, t.block_size)).reshape(len(chunk), -1)
    return out


@dataclass(frozen=True)
class QuantizedTensor:
    """A tensor already encoded as ggml blocks: what `quantize` returns and the GGUF writer stores as is.

    Attributes:
        ggml_type: the block type name (``"Q8_0"``).
        shape: numpy-order shape of the values.
        blocks: the stored bytes, uint8 ``(rows, row_bytes)``.
    """

    ggml_type: str
    shape: tuple[int, ...]
    blocks: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes)

    def numpy(self) -> np.ndarray:
        """The values back as float32 (dequantized)."""
        return dequantize(self.blocks, self.ggml_type, self.shape)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)


def quantize(x: Any, ggml_type: str) -> QuantizedTensor:
    """Encode a float array (or anything `numpy.asarray` takes, a `TensorView` too) as `ggml_type`.

    Args:
        x: the values; its last axis must be a whole number of blocks (32 for Q8_0 and Q4_0).
        ggml_type: ``"Q8_0"``, ``"Q4_0"``, ``"BF16"``, ``"F16"`` or ``"F32"``.

    Raises:
        UnsupportedDTypeError: another type, a non-float array, or rows that are not whole blocks.
    """
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
        raise UnsupportedDTypeError(f"cannot quantize a {arr.dtype} array")
    shape = tuple(arr.shape)
    blocks = quantize_rows(arr, ggml_type)
    name = cast(GGMLType, by_name(ggml_type)).name  # a known type: quantize_rows refuses any other
    return QuantizedTensor(name, shape, blocks if math.prod(shape) else blocks[:0])
