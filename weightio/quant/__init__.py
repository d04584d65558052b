"""ggml block dequantization (vectorized numpy), one small function per type family."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UnsupportedDTypeError

if TYPE_CHECKING:
    from ..view import TensorView

__all__ = ["dequantize_view"]


def dequantize_view(view: TensorView, key: Any) -> np.ndarray:
    """The float32 values of a block-quantized tensor (or of the rows `key` selects)."""
    raise UnsupportedDTypeError(f"dequantizing {view.ggml_type} is not supported", path=view.path, tensor=view.name)
