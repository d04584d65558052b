"""The dequantization engine: stored ggml bytes to float32, whole tensors or a selection of rows.

`dequantize` works through the blocks in chunks of 256k elements, so the temporaries of each
step stay in the CPU cache, and splits tensors of 2M elements or more between a small pool of
threads, one contiguous run of 1M-element chunks each: numpy releases the GIL inside its loops,
so the chunks run in parallel on several cores.

`dequantize_stored` is what `TensorView.numpy()` and ``view[...]`` on a quantized tensor call,
with plain inputs (the stored bytes, the `TensorInfo`, the index key): a selection of rows
dequantizes only the blocks of those rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._memory import handed_over, heap_for_temporaries
from .._threads import cpus, shared_pool
from ..errors import UnsupportedDTypeError
from ..records import TensorInfo
from .types import GGMLType, by_name

__all__ = ["dequantize", "dequantize_stored", "supported", "set_threads", "CHUNK_ELEMENTS", "THREADED_CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 18  # per kernel call: 1 MiB of float32 out, so temporaries stay in the L2 cache
THREADED_CHUNK_ELEMENTS = 1 << 20  # per kernel call when several threads share a tensor (see _decode)
_threads: int | None = None


def set_threads(n: int | None) -> None:
    """How many threads dequantize large tensors: None (default) uses every CPU this process may run on
    (`weightio._threads.cpus`), 1 disables threading."""
    global _threads
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be a positive int or None, got {n!r}")
    _threads = n


def supported(ggml_type: str) -> bool:
    """True when `dequantize` can decode `ggml_type` (a block type or a plain F16/BF16/F32/… type)."""
    from .kernels import KERNELS

    t = by_name(ggml_type)
    return t is not None and t.removed is None and (not t.quantized or t.name in KERNELS)


def dequantize(data: np.ndarray, ggml_type: str, shape: tuple[int, ...] | None = None, *,
               threads: int | None = None) -> np.ndarray:
    """Decode the stored bytes of a ggml tensor to float32.

    Args:
        data: the stored bytes (any array; read as contiguous uint8): whole blocks of `ggml_type`,
            little-endian as in GGUF files.
        ggml_type: a name from `weightio.quant.types` (``"Q4_K"``; case-insensitive).
        shape: the numpy shape of the result (default: 1-D). Its last dimension runs along the
            blocks, as in GGUF.
        threads: threads to use (default: `set_threads`' setting, else every CPU this process may run on).

    Returns:
        A new, writable float32 array.

    Raises:
        UnsupportedDTypeError: a type weightio cannot decode.
        ValueError: `data` is not whole blocks, or does not match `shape`.
    """
    t = _decodable(ggml_type)
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size % t.type_size:
        raise ValueError(f"{raw.size} bytes are not whole {t.name} blocks of {t.type_size} bytes")
    n = raw.size // t.type_size * t.block_size
    if shape is not None and math.prod(shape) != n:
        raise ValueError(f"{raw.size} bytes of {t.name} hold {n} elements, not shape {tuple(shape)}")
    out = _decode(raw, t, threads)
    return out.reshape(shape if shape is not None else (n,))


def _decodable(ggml_type: str) -> GGMLType:
    t = by_name(ggml_type)
    if t is None:
        raise UnsupportedDTypeError(f"unknown ggml type {ggml_type!r}")
    if t.removed is not None:
        raise UnsupportedDTypeError(f"{t.name}: {t.removed}")
    if t.quantized:
        from .kernels import KERNELS

        if t.name not in KERNELS:
            raise UnsupportedDTypeError(f"dequantizing {t.name} is not supported")
    return t


def _decode(raw: np.ndarray, t: GGMLType, threads: int | None) -> np.ndarray:
    """float32 (n_blocks, block_size) of `raw` whole blocks."""
    if t.dtype is not None:  # a plain type (not t.quantized)
        return raw.view(t.dtype).astype(np.float32).reshape(-1, 1)
    from .kernels import KERNELS

    heap_for_temporaries()  # each chunk's temporaries reused from the heap, not fresh pages every chunk
    blocks = raw.reshape(-1, t.type_size)
    out = np.empty((blocks.shape[0], t.block_size), np.float32)
    workers = _worker_count(threads, blocks.shape[0] * t.block_size)
    # Threads take bigger chunks: fewer numpy calls per element means fewer GIL hand-offs
    per_chunk = max(1, (CHUNK_ELEMENTS if workers == 1 else THREADED_CHUNK_ELEMENTS) // t.block_size)
    starts = range(0, blocks.shape[0], per_chunk)
    kernel = KERNELS[t.name]

    def run(start: int) -> None:
        with np.errstate(all="ignore"):  # inf/NaN scales decode to inf/NaN, as in ggml
            kernel(blocks[start:start + per_chunk], out[start:start + per_chunk])

    def run_all(part: range) -> None:
        for start in part:
            run(start)

    if workers == 1:
        run_all(starts)
    else:  # one contiguous run of chunks per worker: threads never share (and race to fault in) a page
        bounds = [len(starts) * i // workers for i in range(workers + 1)]
        parts = [starts[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        list(shared_pool("dequant", workers, grow=True).map(run_all, parts))
    return out


def _worker_count(threads: int | None, elements: int) -> int:
    """Threads for a tensor of `elements`: each gets at least two threaded chunks, or none is used."""
    wanted = threads if threads is not None else (_threads or cpus())
    return max(1, min(wanted, elements // (2 * THREADED_CHUNK_ELEMENTS)))


# ----------------------------------------------------------------------------- selections


def dequantize_stored(raw: np.ndarray, info: TensorInfo, key: Any = None) -> np.ndarray:
    """The float32 values of a block-quantized tensor, or of the part `key` selects.

    Args:
        raw: the tensor's stored bytes (uint8), whole blocks of ``info.ggml_type``.
        info: where the bytes came from: ``ggml_type``, numpy-order ``shape``, and ``dtype``,
            whose byte order says whether the file was big-endian.
        key: an index (``None``: the whole tensor). A key whose first item is an int or a slice
            dequantizes only the blocks it needs: the selected rows of the first axis (or, for a
            1-D tensor, the blocks covering the selected elements). Other keys (arrays,
            Ellipsis, None) dequantize the whole tensor, then index.

    Returns:
        A read-only array (or a scalar), like every array a view returns.

    Raises:
        UnsupportedDTypeError: a type weightio cannot decode (no path or tensor named: the
            caller knows them).
    """
    t = _decodable(info.ggml_type or "")
    _check_byte_order(info, t)
    shape = info.shape
    result = _values(raw, t).reshape(shape) if key is None else _select(raw, t, shape, key)
    if isinstance(result, np.ndarray):
        result.flags.writeable = False
        handed_over(result)  # (decoded for this call alone: a torch tensor may take it as it is)
    return result


def _check_byte_order(info: TensorInfo, t: GGMLType) -> None:
    """Quantized blocks in big-endian GGUF files are refused unless they hold no multi-byte field."""
    if info.dtype.byteorder == ">" and t.quantized and t.name not in ("MXFP4", "NVFP4"):
        raise UnsupportedDTypeError(
            f"{t.name} blocks in a big-endian GGUF file are ambiguous (gguf-py writes them in the writing "
            "machine's byte order, llama.cpp's gguf_convert_endian swaps their scales), so weightio does "
            "not guess; .raw() gives the stored bytes")


def _values(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    """The elements of `raw` (whole blocks), 1-D: float32, or native BF16 for a plain BF16 tensor."""
    if t.dtype is None:  # t.quantized
        return _decode(raw, t, None).reshape(-1)
    # A plain type reaches here only as BF16 from a big-endian GGUF file: numpy has no
    # big-endian bfloat16 dtype to view it as, so the bytes are swapped into a native copy.
    width = t.type_size
    return raw.view(f">u{width}").astype(f"=u{width}").view(t.dtype)


def _select(raw: np.ndarray, t: GGMLType, shape: tuple[int, ...], key: Any) -> Any:
    """Decode what `key` needs (see `dequantize_stored`), then apply the rest of it."""
    first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
    if not shape or isinstance(first, bool) or not isinstance(first, (int, np.integer, slice)):
        return _values(raw, t).reshape(shape)[key]
    if len(shape) == 1:
        values = _select_elements(raw, t, shape[0], first)
        return values[rest] if rest else values
    stride = len(raw) // shape[0] if shape[0] else 0  # bytes per index of the first axis
    if isinstance(first, slice):
        start, stop, step = first.indices(shape[0])
        picked = range(start, stop, step)
        if step == 1 or not stride:  # rows of no bytes (an empty tensor): nothing to gather, however many
            part = raw[start * stride:max(start, stop) * stride]
        else:  # copy just the picked rows' bytes (stop of a negative-step slice.indices is not a slice bound)
            part = raw.reshape(shape[0], stride)[np.asarray(picked, dtype=np.intp)].reshape(-1)
        index = (slice(None), *rest)  # not inline: mypy takes x[(a, *b)] for x[a, *b], which needs Python 3.11
        return _values(part, t).reshape((len(picked), *shape[1:]))[index]
    i = _index(int(first), shape[0])
    row = _values(raw[i * stride:(i + 1) * stride], t).reshape(shape[1:])
    return row[rest] if rest else row


def _index(i: int, size: int) -> int:
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of bounds for axis 0 with size {size}")
    return i % size


def _select_elements(raw: np.ndarray, t: GGMLType, n: int, first: int | np.integer | slice) -> Any:
    """Elements of a 1-D quantized tensor: decode only the blocks that cover them."""
    if isinstance(first, slice):
        start, stop, step = first.indices(n)
        picked = range(start, stop, step)
        if not picked:
            return np.empty(0, np.float32 if t.quantized else t.dtype)
        lo, hi = min(picked[0], picked[-1]), max(picked[0], picked[-1]) + 1
    else:
        lo = _index(int(first), n)
        hi = lo + 1
    b0, b1 = lo // t.block_size, -(-hi // t.block_size)
    values = _values(raw[b0 * t.type_size:b1 * t.type_size], t)
    base = b0 * t.block_size
    if isinstance(first, slice):
        return values[picked[0] - base::step][:len(picked)]
    return values[lo - base]
