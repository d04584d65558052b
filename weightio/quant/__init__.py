"""ggml block dequantization (vectorized numpy) and the two quantizers the GGUF writer offers.

    >>> from weightio.quant import dequantize, quantize
    >>> q = quantize(np.ones((2, 32), np.float32), "Q8_0")      # doctest: +SKIP
    >>> dequantize(q.blocks, "Q8_0", q.shape)                    # doctest: +SKIP

`dequantize` turns the stored bytes of any block type in `weightio.quant.types` (every type the
``gguf`` package can dequantize, plus Q8_1, Q8_K and Q1_0) into float32; the engine (chunks,
threads, row selections) is `weightio.quant.decoding`. `TensorView.numpy()` and ``view[...]``
on a quantized tensor come to `dequantize_stored` with the stored bytes and the `TensorInfo`.
`quantize` (`weightio.quant.quantize`) encodes the other way, for the GGUF writer.

This package imports only `weightio.errors`, `dtypes`, `limits`, `records` and its own modules.
"""

from __future__ import annotations

from .decoding import (
    CHUNK_ELEMENTS,
    THREADED_CHUNK_ELEMENTS,
    dequantize,
    dequantize_stored,
    set_threads,
    supported,
)
from .quantize import QUANTIZERS, QuantizedTensor, quantize
from .types import TYPES, GGMLType

__all__ = ["dequantize", "dequantize_stored", "quantize", "QuantizedTensor", "QUANTIZERS", "TYPES",
           "GGMLType", "supported", "set_threads", "CHUNK_ELEMENTS", "THREADED_CHUNK_ELEMENTS"]
