"""torch dtypes: the numpy dtype each is listed with, and its element size."""

from __future__ import annotations

import numpy as np

from ...dtypes import TABLE
from .allowlist import TORCH_DTYPES

__all__ = ["ITEMSIZES", "NUMPY_DTYPES", "PER_BYTE", "QUANTIZED_DTYPES", "itemsize"]


# Quantized tensors store integers: they are listed with that integer type (reading them raises).
QUANTIZED_DTYPES = {"qint8": "int8", "quint8": "uint8", "qint32": "int32", "quint4x2": "uint8", "quint2x4": "uint8"}


def _numpy_dtypes() -> dict[str, np.dtype]:
    """torch dtype name -> the numpy dtype its elements are listed with (fp4 x2: one ml_dtypes
    float4 per stored byte pair, as safetensors' F4)."""
    table = {row.torch: row.numpy for row in TABLE if row.torch is not None}
    table["complex128"] = np.dtype(np.complex128)  # in numpy, not in safetensors (the table's key)
    table.update({name: table[stored] for name, stored in QUANTIZED_DTYPES.items()})
    return table


NUMPY_DTYPES = _numpy_dtypes()
# Element sizes of torch dtypes numpy has no type for (tensors of them are listed, not read).
_OPAQUE_SIZES = {"complex32": 4, "bits16": 2}
ITEMSIZES = {name: NUMPY_DTYPES[name].itemsize if name in NUMPY_DTYPES else _OPAQUE_SIZES.get(name, 1)
             for name in set(TORCH_DTYPES.values())}


# Elements per byte of torch's sub-byte quantized dtypes. Their storages count bytes (a
# QUInt4x2Storage of 4 holds 4 bytes: torch's element_size is 1), their tensors count elements:
# a (2, 3) quint4x2 tensor needs 3 bytes (torch allocates each row rounded up to whole bytes: 4).
PER_BYTE = {"quint4x2": 2, "quint2x4": 4}


def itemsize(torch_dtype: str) -> int:
    """Bytes per element of a torch dtype (fp4 x2: one byte per pair)."""
    return ITEMSIZES[torch_dtype]
