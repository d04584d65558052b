"""GGUF's metadata value types and integer fields, as data: shared by the reader and the writer.

See `weightio.formats.gguf` for the layout they describe. A GGUF flavour is a byte order and a
version: v1 counts, lengths and dims are u32, later versions u64 (`fields_for`).
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Literal, NamedTuple

import numpy as np

__all__ = ["GGUFValueType", "SCALAR_DTYPES", "Fields", "fields_for"]


class GGUFValueType(IntEnum):
    """Metadata value types (``enum gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types -> little-endian numpy dtype (BOOL is a byte holding 0 or 1).
SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("u1"), GGUFValueType.INT8: np.dtype("i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
_STRUCT_CODES = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
                 GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
                 GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "B", GGUFValueType.UINT64: "Q",
                 GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


class Fields(NamedTuple):
    """The integer fields of one GGUF flavour (byte order x version)."""

    order: Literal["<", ">"]
    u32: struct.Struct  # version, value types, n_dims, ggml_type
    counts: struct.Struct  # tensor/kv counts, string lengths, array counts, dims: u32 in v1, u64 after
    u64: struct.Struct  # tensor offsets (u64 in every version)
    scalars: dict[int, struct.Struct]  # fixed-size metadata values


def fields_for(order: Literal["<", ">"], version: int) -> Fields:
    """The `Fields` of byte order `order` (``"<"`` or ``">"``) and GGUF `version`."""
    return Fields(order, struct.Struct(order + "I"), struct.Struct(order + ("I" if version == 1 else "Q")),
                   struct.Struct(order + "Q"), {t: struct.Struct(order + c) for t, c in _STRUCT_CODES.items()})
