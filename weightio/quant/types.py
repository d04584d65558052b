"""The ggml tensor type table: id, name, block geometry, and what weightio can do with each.

Shared by the GGUF and legacy ggml readers, the GGUF writer and the dequantizers. Sizes are
ggml's ``type_traits`` (``ggml/src/ggml.c``) and the block structs of ``ggml-common.h``:

| id | name | block | bytes | | id | name | block | bytes |
|---:|---|---:|---:|---|---:|---|---:|---:|
| 0 | F32 | 1 | 4 | | 21 | IQ3_S | 256 | 110 |
| 1 | F16 | 1 | 2 | | 22 | IQ2_S | 256 | 82 |
| 2 | Q4_0 | 32 | 18 | | 23 | IQ4_XS | 256 | 136 |
| 3 | Q4_1 | 32 | 20 | | 24-27 | I8 I16 I32 I64 | 1 | 1-8 |
| 6 | Q5_0 | 32 | 22 | | 28 | F64 | 1 | 8 |
| 7 | Q5_1 | 32 | 24 | | 29 | IQ1_M | 256 | 56 |
| 8 | Q8_0 | 32 | 34 | | 30 | BF16 | 1 | 2 |
| 9 | Q8_1 | 32 | 36 | | 34 | TQ1_0 | 256 | 54 |
| 10-14 | Q2_K … Q6_K | 256 | 84 110 144 176 210 | | 35 | TQ2_0 | 256 | 66 |
| 15 | Q8_K | 256 | 292 | | 39 | MXFP4 | 32 | 17 |
| 16 | IQ2_XXS | 256 | 66 | | 40 | NVFP4 | 64 | 36 |
| 17 | IQ2_XS | 256 | 74 | | 41 | Q1_0 | 128 | 18 |
| 18 | IQ3_XXS | 256 | 98 | | | | | |
| 19 | IQ1_S | 256 | 50 | | | | | |
| 20 | IQ4_NL | 32 | 18 | | | | | |

Q8_1 is 36 bytes (``ggml_half d, s; int8_t qs[32]``) as in ggml since 2023; the ``gguf``
Python package still lists the older 40-byte layout with float scales.

Ids that no longer exist are kept, with the reason, so a file holding one is explained rather
than called corrupt: 4 and 5 (Q4_2, Q4_3: removed in May 2023, before GGUF existed), 31-33
(Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) and 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8): row-interleaved
repackings that llama.cpp wrote into GGUF files between July and December 2024 and then removed
(it now repacks at load time). Any other id is unknown: the tensor is listed, its data refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["GGMLType", "TYPES", "by_id", "by_name", "QK_K"]

QK_K = 256  # elements of a K-quant (and i-quant) super-block


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type.

    Attributes:
        id: the type code stored in GGUF tensor infos and ggml tensor records.
        name: ggml's name (``"Q4_K"``).
        block_size: elements per block (1 for plain types).
        type_size: bytes per block.
        dtype: for plain types, the little-endian numpy dtype of an element; None for blocks.
        removed: for ids llama.cpp no longer reads, why; None otherwise.
    """

    id: int
    name: str
    block_size: int
    type_size: int
    dtype: np.dtype | None = None
    removed: str | None = None

    @property
    def quantized(self) -> bool:
        """True for block types (whose `numpy()` is dequantized float32)."""
        return self.dtype is None

    def row_bytes(self, n: int) -> int:
        """Bytes of `n` elements (a multiple of `block_size`)."""
        return n // self.block_size * self.type_size


def _plain(id: int, name: str, dtype: type[np.generic]) -> GGMLType:
    dt = np.dtype(dtype)
    return GGMLType(id, name, 1, dt.itemsize, dt.newbyteorder("<") if dt.itemsize > 1 else dt)


def _block(id: int, name: str, block_size: int, type_size: int, removed: str | None = None) -> GGMLType:
    return GGMLType(id, name, block_size, type_size, None, removed)


_INTERLEAVED = ("row-interleaved {base} repacking, written into GGUF files by llama.cpp from July to December "
                "2024 and since removed (llama.cpp now repacks at load time); re-quantize the model with a "
                "current llama.cpp")

TYPES: tuple[GGMLType, ...] = (
    _plain(0, "F32", np.float32),
    _plain(1, "F16", np.float16),
    _block(2, "Q4_0", 32, 18),
    _block(3, "Q4_1", 32, 20),
    _block(4, "Q4_2", 16, 10, "Q4_2 was removed from ggml in May 2023, before GGUF existed"),
    _block(5, "Q4_3", 16, 12, "Q4_3 was removed from ggml in April 2023, before GGUF existed"),
    _block(6, "Q5_0", 32, 22),
    _block(7, "Q5_1", 32, 24),
    _block(8, "Q8_0", 32, 34),
    _block(9, "Q8_1", 32, 36),
    _block(10, "Q2_K", QK_K, 84),
    _block(11, "Q3_K", QK_K, 110),
    _block(12, "Q4_K", QK_K, 144),
    _block(13, "Q5_K", QK_K, 176),
    _block(14, "Q6_K", QK_K, 210),
    _block(15, "Q8_K", QK_K, 292),
    _block(16, "IQ2_XXS", QK_K, 66),
    _block(17, "IQ2_XS", QK_K, 74),
    _block(18, "IQ3_XXS", QK_K, 98),
    _block(19, "IQ1_S", QK_K, 50),
    _block(20, "IQ4_NL", 32, 18),
    _block(21, "IQ3_S", QK_K, 110),
    _block(22, "IQ2_S", QK_K, 82),
    _block(23, "IQ4_XS", QK_K, 136),
    _plain(24, "I8", np.int8),
    _plain(25, "I16", np.int16),
    _plain(26, "I32", np.int32),
    _plain(27, "I64", np.int64),
    _plain(28, "F64", np.float64),
    _block(29, "IQ1_M", QK_K, 56),
    _plain(30, "BF16", ml_dtypes.bfloat16),
    _block(31, "Q4_0_4_4", 32, 18, _INTERLEAVED.format(base="Q4_0")),
    _block(32, "Q4_0_4_8", 32, 18, _INTERLEAVED.format(base="Q4_0")),
    _block(33, "Q4_0_8_8", 32, 18, _INTERLEAVED.format(base="Q4_0")),
    _block(34, "TQ1_0", QK_K, 54),
    _block(35, "TQ2_0", QK_K, 66),
    _block(36, "IQ4_NL_4_4", 32, 18, _INTERLEAVED.format(base="IQ4_NL")),
    _block(37, "IQ4_NL_4_8", 32, 18, _INTERLEAVED.format(base="IQ4_NL")),
    _block(38, "IQ4_NL_8_8", 32, 18, _INTERLEAVED.format(base="IQ4_NL")),
    _block(39, "MXFP4", 32, 17),
    _block(40, "NVFP4", 64, 36),
    _block(41, "Q1_0", 128, 18),
)

_BY_ID = {t.id: t for t in TYPES}
_BY_NAME = {t.name: t for t in TYPES}


def by_id(type_id: int) -> GGMLType | None:
    """The type with code `type_id`, or None when weightio does not know it."""
    return _BY_ID.get(type_id)


def by_name(name: str) -> GGMLType | None:
    """The type called `name` (case-insensitive: ``"q8_0"`` works), or None."""
    return _BY_NAME.get(name.upper()) if isinstance(name, str) else None
