"""One table of element types: safetensors codes, torch names and numpy dtypes.

Every format module and every backend looks types up here, so a type is named once.
bfloat16 and the float8/float6/float4 types are `ml_dtypes` numpy dtypes.

| safetensors | torch              | numpy (`ml_dtypes` where marked) | bits |
|-------------|--------------------|----------------------------------|------|
| BOOL        | bool               | bool                             | 8    |
| U8 U16 U32 U64 | uint8 … uint64  | uint8 … uint64                   |      |
| I8 I16 I32 I64 | int8 … int64    | int8 … int64                     |      |
| F16 F32 F64 | float16 … float64  | float16 … float64                |      |
| BF16        | bfloat16           | bfloat16 (ml_dtypes)             | 16   |
| C64         | complex64          | complex64                        | 64   |
| F8_E4M3 F8_E5M2 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ | float8_e4m3fn … | ml_dtypes float8_* | 8 |
| F6_E2M3 F6_E3M2 F4 | float4_e2m1fn_x2 (F4) | float6_e2m3fn, float6_e3m2fn, float4_e2m1fn (ml_dtypes) | 6, 4 |

`F4`/`F6_*` elements are packed several per byte on disk, while the ml_dtypes types hold one
element per byte; numpy has no packed layout. Such a tensor is listed with its logical shape and
dtype, and read through `TensorView.raw()` (its packed bytes); `numpy()` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import UnsupportedDTypeError

__all__ = [
    "DType", "ML_DTYPES", "PACKED", "by_numpy", "by_safetensors", "by_torch", "dtype_name", "is_number",
    "parse_dtype",
]


@dataclass(frozen=True)
class DType:
    """One element type as each ecosystem names it.

    Attributes:
        safetensors: the safetensors header code (``"F32"``).
        torch: the torch attribute name (``"float32"``), None when torch has no such type.
        numpy: the numpy dtype (native byte order); for packed sub-byte types, the ml_dtypes
            type of one element (numpy cannot view the packed bytes as it).
        bits: bits per element on disk.
    """

    safetensors: str
    torch: str | None
    numpy: np.dtype
    bits: int

    @property
    def packed(self) -> bool:
        """True when elements are smaller than a byte and packed on disk."""
        return self.bits % 8 != 0


def _row(code: str, torch: str | None, numpy: type[np.generic], bits: int) -> DType:
    return DType(code, torch, np.dtype(numpy), bits)


TABLE: tuple[DType, ...] = (
    _row("BOOL", "bool", np.bool_, 8),
    _row("U8", "uint8", np.uint8, 8),
    _row("I8", "int8", np.int8, 8),
    _row("U16", "uint16", np.uint16, 16),
    _row("I16", "int16", np.int16, 16),
    _row("U32", "uint32", np.uint32, 32),
    _row("I32", "int32", np.int32, 32),
    _row("U64", "uint64", np.uint64, 64),
    _row("I64", "int64", np.int64, 64),
    _row("F16", "float16", np.float16, 16),
    _row("BF16", "bfloat16", ml_dtypes.bfloat16, 16),
    _row("F32", "float32", np.float32, 32),
    _row("F64", "float64", np.float64, 64),
    _row("C64", "complex64", np.complex64, 64),
    _row("F8_E4M3", "float8_e4m3fn", ml_dtypes.float8_e4m3fn, 8),
    _row("F8_E5M2", "float8_e5m2", ml_dtypes.float8_e5m2, 8),
    _row("F8_E8M0", "float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, 8),
    _row("F8_E4M3FNUZ", "float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 8),
    _row("F8_E5M2FNUZ", "float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz, 8),
    _row("F6_E2M3", None, ml_dtypes.float6_e2m3fn, 6),
    _row("F6_E3M2", None, ml_dtypes.float6_e3m2fn, 6),
    _row("F4", "float4_e2m1fn_x2", ml_dtypes.float4_e2m1fn, 4),
)

# Sub-byte types stored packed several per byte (numpy has no layout for them), by element dtype.
PACKED: dict[np.dtype, DType] = {row.numpy: row for row in TABLE if row.packed}
# The ml_dtypes element types (bfloat16, float8_*, …): numpy kind "V", but numbers all the same.
ML_DTYPES = frozenset(row.numpy for row in TABLE if row.numpy.kind == "V")

_BY_SAFETENSORS = {row.safetensors: row for row in TABLE}
_BY_NUMPY = {row.numpy: row for row in TABLE}
_BY_TORCH = {row.torch: row for row in TABLE if row.torch is not None}

# Spellings users type for a dtype argument, beyond the table's own names.
_ALIASES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "half": "float16",
    "fp16": "float16",
    "f32": "float32",
    "float": "float32",
    "fp32": "float32",
    "f64": "float64",
    "double": "float64",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "float8_e4m3": "float8_e4m3fn",
    "long": "int64",
}


def by_safetensors(code: str) -> DType:
    """The row for a safetensors dtype code; `UnsupportedDTypeError` for an unknown code."""
    try:
        return _BY_SAFETENSORS[code]
    except (KeyError, TypeError):
        known = ", ".join(_BY_SAFETENSORS)
        raise UnsupportedDTypeError(f"unknown safetensors dtype {code!r} (known: {known})") from None


def by_numpy(dtype: np.dtype) -> DType:
    """The row for a numpy dtype, whatever its byte order."""
    row = _BY_NUMPY.get(np.dtype(dtype).newbyteorder("="))
    if row is None:
        raise UnsupportedDTypeError(f"dtype {dtype_name(dtype)} has no safetensors/torch equivalent")
    return row


def by_torch(name: str) -> DType:
    """The row for a torch dtype name (``"float32"`` or ``"torch.float32"``)."""
    row = _BY_TORCH.get(name.removeprefix("torch."))
    if row is None:
        raise UnsupportedDTypeError(f"torch dtype {name!r} has no numpy equivalent")
    return row


def parse_dtype(dtype: object) -> np.dtype:
    """A numpy dtype from what a user passes as ``dtype=``.

    Accepts numpy dtypes and types, ml_dtypes types, torch dtypes, safetensors codes (``"BF16"``)
    and the usual spellings (``"bf16"``, ``"bfloat16"``, ``"fp16"``, ``"float32"``, ``"torch.bfloat16"``).

    Example:
        >>> parse_dtype("bf16")
        dtype(bfloat16)
    """
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        return np.dtype(dtype)
    text = str(dtype).removeprefix("torch.")  # torch.dtype objects print as "torch.float32"
    if text in _BY_SAFETENSORS:
        return _BY_SAFETENSORS[text].numpy
    text = _ALIASES.get(text.lower(), text.lower())
    row = _BY_TORCH.get(text)
    if row is not None:
        return row.numpy
    try:
        found = np.dtype(text)
    except (TypeError, ValueError, SyntaxError, UnicodeError):  # numpy's parser lets all of these out
        found = None
    if found is None or (found.kind not in "biufc" and found not in _BY_NUMPY):
        raise UnsupportedDTypeError(f"unknown dtype {dtype!r}")
    return found





def is_number(dtype: np.dtype) -> bool:
    """True for the element types of tensors: bool, int, uint, float, complex and the ml_dtypes
    types. False for what only ``.npy``/``.npz`` files hold (bytes, str, void, datetime,
    timedelta, records, objects), which no framework has and no cast reaches."""
    return dtype.kind in "biufc" or (dtype.fields is None and dtype.newbyteorder("=") in ML_DTYPES)  # any byte order


_NAME_LIMIT = 120  # a record's descr can run to the npy header limit: tables show its start


def dtype_name(dtype: np.dtype) -> str:
    """The short name weightio prints for a dtype: ``float32``, ``bfloat16``, ``>float32`` for big-endian.

    Other ``.npy`` dtypes: ``S3`` (bytes), ``U3`` / ``>U3`` (str), ``V8`` (void), ``datetime64[s]``,
    ``>timedelta64[ns]``, ``object``, and records as their ``descr`` (what the ``.npy`` header
    holds: ``[('date', '<M8[D]'), ('open', '<f8')]``), cut after 120 characters.
    """
    dtype = np.dtype(dtype)
    if dtype.fields is not None or dtype.subdtype is not None:
        try:
            text = str(dtype.descr)
        except ValueError:  # overlapping or out-of-order fields have no descr
            text = str(dtype)
        return text if len(text) <= _NAME_LIMIT else text[: _NAME_LIMIT - 1] + "…"
    name = f"{dtype.char}{dtype.itemsize // (4 if dtype.kind == 'U' else 1)}" if (
        dtype.kind in "SUV" and not is_number(dtype)) else dtype.name
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        return ">" + name
    return name
