"""From what a user hands `weightio.save` to what the format writers consume.

The writers in `weightio.formats` take a sequence of `TensorSource`s (`weightio.records`): each
tensor described up front (headers come first), its bytes fetched when the writer reaches it,
so that no more than one tensor's data is held at once. `tensor_sources` builds them from the
user's mapping: numpy arrays, `TensorView`s of open checkpoints (read one at a time), torch
tensors and the like (through `weightio.devices.as_numpy`) and, for GGUF,
`weightio.quant.QuantizedTensor`s. `save` picks the writer and calls it.

This module sits above `formats/`: it is the one place that knows both views and writers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .dtypes import PACKED, dtype_name, is_number
from .errors import FormatError, UnsupportedDTypeError, UsageError
from .formats import WRITERS, format_for_path, resolve
from .records import TensorSource, byte_extent
from .view import TensorView

__all__ = ["save", "write_sources", "write_gguf", "tensor_sources", "block_type", "check_materializable",
           "check_numbers", "MAX_EXPANSION", "EXPANSION_ALLOWANCE", "RECORD_FORMATS"]

# The formats that store what only numpy has (bytes, str, datetime, records): exactly, as stored.
RECORD_FORMATS = frozenset({"npz", "npy"})

# A strided view may repeat its stored bytes (stride 0: torch's expand): writing it out stores
# every element. Up to this much beyond its stored extent is fine; more is refused, so that a
# 1 kB file cannot make a writer allocate terabytes.
MAX_EXPANSION, EXPANSION_ALLOWANCE = 16, 256 << 20


def save(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any] | None = None,
    format: str | None = None,  # noqa: A002 - matches weightio.save
    *,
    overwrite: bool = False,
    **options: Any,
) -> None:
    """Write `tensors` to `path`, atomically; see `weightio.save`. `options` go to the format's
    writer (e.g. ``types="Q8_0"`` for GGUF).

    Raises:
        UsageError: no format can be told from `path` and `format`, or `tensors` is not a
            mapping of str names.
    """
    path = os.fspath(path)
    fmt = format_for_path(path, format)
    if fmt == "gguf":
        sources = _gguf_sources(tensors, path)
    else:
        sources = tensor_sources(tensors, path=path, packed_ok=fmt == "safetensors", records_ok=fmt in RECORD_FORMATS)
    write_sources(sources, path, metadata, fmt, overwrite=overwrite, **options)


def write_sources(
    sources: Sequence[TensorSource],
    path: str,
    metadata: Mapping[str, Any] | None = None,
    format: str | None = None,  # noqa: A002 - matches weightio.save
    *,
    overwrite: bool = False,
    **options: Any,
) -> None:
    """Write `sources` with the writer of `format` (else the one `path`'s suffix names), atomically.

    Raises:
        UsageError: no format can be told from `path` and `format`.
        FormatError: the format's writer is not available in this version.
    """
    fmt = format_for_path(path, format)
    try:
        writer = resolve(WRITERS[fmt])
    except (ImportError, AttributeError):
        raise FormatError(f"writing {fmt} is not available in this version of weightio", path=path) from None
    writer(sources, path, metadata, overwrite=overwrite, **options)


def write_gguf(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
    types: str | Mapping[str, str] | None = None,
    value_types: Mapping[str, str] | None = None,
) -> None:
    """`save` to GGUF whatever the suffix: see `weightio.formats.gguf_writer.write` for the options.

    Example:
        >>> with wio.open("model.gguf") as ckpt:                                      # doctest: +SKIP
        ...     write_gguf(ckpt, "copy.gguf", ckpt.metadata, value_types=gguf.value_types(ckpt))
    """
    save(tensors, path, metadata, "gguf", overwrite=overwrite, types=types, value_types=value_types)


def tensor_sources(tensors: Mapping[str, Any], *, path: str, packed_ok: bool = False,
                   blocks_ok: bool = False, records_ok: bool = False) -> list[TensorSource]:
    """Describe every tensor of `tensors` without reading tensor data from checkpoint views.

    Args:
        tensors: name -> numpy array, `TensorView`, or anything `weightio.devices.as_numpy` accepts.
        path: the output path (for error messages).
        packed_ok: whether the output format stores packed sub-byte types (safetensors F4/F6).
        blocks_ok: whether the output format stores ggml blocks (GGUF): quantized views and
            `QuantizedTensor`s then fetch their blocks, not their decoded values.
        records_ok: whether the output format stores numpy's other dtypes (bytes, str, datetime,
            records: ``.npz``/``.npy``): they are then written as stored, byte order included.

    Raises:
        UsageError: `tensors` is not a mapping of str names.
        UnsupportedDTypeError: an object array, or a string, datetime or record one (unless
            `records_ok`).
        UnsafePickleError: an object array of an ``.npy``/``.npz`` (its data is a pickle).
    """
    if not isinstance(tensors, Mapping):
        raise UsageError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}", path=path)
    return [_source(name, value, path, packed_ok, blocks_ok, records_ok) for name, value in tensors.items()]


def _gguf_sources(tensors: Mapping[str, Any], path: str) -> list[TensorSource]:
    from .formats.gguf_writer import check_name

    if isinstance(tensors, Mapping):  # GGUF names must also be non-empty: say so before reading anything
        for name in tensors:
            check_name(name, path)
    return tensor_sources(tensors, path=path, blocks_ok=True)


def _source(name: Any, value: Any, path: str, packed_ok: bool, blocks_ok: bool, records_ok: bool) -> TensorSource:
    if not isinstance(name, str):
        raise UsageError(f"tensor names must be str, got {type(name).__name__} {name!r}", path=path)
    if blocks_ok:
        blocks = _block_source(name, value)
        if blocks is not None:
            return blocks
    if isinstance(value, TensorView):
        return _view_source(name, value, path, packed_ok, records_ok)
    if not isinstance(value, np.ndarray):
        from .devices import as_numpy

        value = as_numpy(value)
    if not is_number(value.dtype):
        check_numbers(value.dtype, records_ok, path, name)
        arr = value  # written as it is, byte order included (numpy.save's way)
        return TensorSource(name, arr.dtype, tuple(arr.shape), arr.size * arr.dtype.itemsize, lambda: arr)
    dtype = value.dtype.newbyteorder("=")
    if dtype in PACKED:
        raise UnsupportedDTypeError(
            f"{dtype_name(dtype)} arrays hold one element per byte; the packed {PACKED[dtype].safetensors} "
            "layout is only copied from checkpoints that store it", path=path, tensor=name)
    arr = value
    return TensorSource(name, dtype, tuple(arr.shape), arr.size * dtype.itemsize, lambda: arr)


def _block_source(name: str, value: Any) -> TensorSource | None:
    """ggml blocks to copy as they are: a `QuantizedTensor`, or a quantized view (`block_type`)."""
    from .formats.gguf_writer import stored_size
    from .quant import QuantizedTensor
    from .quant.types import by_name

    float32 = np.dtype(np.float32)
    if isinstance(value, QuantizedTensor):
        t = by_name(value.ggml_type)
        if t is None:
            return None
        return TensorSource(name, float32, value.shape, stored_size(t, value.shape), _blocks_of(value),
                            ggml_type=t.name)
    if not isinstance(value, TensorView):
        return None
    copied = block_type(value)
    return None if copied is None else TensorSource(name, float32, value.shape, value.nbytes, value.raw,
                                                    ggml_type=copied)


def block_type(view: TensorView) -> str | None:
    """The ggml block type of `view` when its stored blocks can be copied into a GGUF file as they
    are, else None: not quantized, a removed or unknown type, or blocks of a big-endian file
    (ambiguous: decoding them raises, with the reason)."""
    from .quant.types import by_name

    if view.ggml_type is None or view.info.dtype.byteorder == ">":
        return None
    t = by_name(view.ggml_type)
    if t is None or not t.quantized or t.removed is not None:
        return None
    return t.name


def _blocks_of(value: Any) -> Callable[[], np.ndarray]:
    return lambda: value.blocks


def check_numbers(dtype: np.dtype, records_ok: bool, path: str, name: str, view: TensorView | None = None) -> None:
    """Refuse what the output cannot store exactly: any dtype that is not numbers unless the
    format is ``.npz``/``.npy`` (`records_ok`), and object arrays everywhere (an ``.npy``
    member's object array raises its reader's `UnsafePickleError`)."""
    if dtype.hasobject:
        if view is not None:
            view.raw()  # the reader refuses it, saying why (its data is a pickle)
        raise UnsupportedDTypeError(f"dtype {dtype_name(dtype)} cannot be stored as a tensor: it holds Python "
                                    "objects", path=path, tensor=name)
    if not records_ok:
        raise UnsupportedDTypeError(f"{dtype_name(dtype)} elements are not numbers: only .npz and .npy store them "
                                    "(no exact conversion to a number type exists)", path=path, tensor=name)


def _view_source(name: str, view: TensorView, path: str, packed_ok: bool, records_ok: bool) -> TensorSource:
    info = view.info
    if not is_number(view.dtype):
        check_numbers(view.dtype, records_ok, path, name, view)
        return TensorSource(name, view.dtype, info.shape, info.nbytes, view.numpy)
    if info.ggml_type is None and info.dtype in PACKED:
        row = PACKED[info.dtype]
        if not packed_ok:
            raise UnsupportedDTypeError(f"{row.safetensors} (packed sub-byte) cannot be stored in this format",
                                        path=path, tensor=name)
        return TensorSource(name, view.dtype, info.shape, info.nbytes, view.raw, code=row.safetensors)
    nbytes = check_materializable(view, path)
    return TensorSource(name, view.dtype, info.shape, nbytes, view.numpy)


def check_materializable(view: TensorView, path: str) -> int:
    """The bytes `view` occupies once written out in C order (its logical size).

    Raises:
        FormatError: a broadcast view whose logical size exceeds `MAX_EXPANSION` times the bytes
            it is stored in, plus `EXPANSION_ALLOWANCE`.
    """
    info = view.info
    nbytes = math.prod(info.shape) * view.dtype.itemsize
    if info.strides is None or info.ggml_type is not None:
        return nbytes
    lo, hi = byte_extent(info.shape, info.strides, info.dtype.itemsize)
    if nbytes > MAX_EXPANSION * (hi - lo) + EXPANSION_ALLOWANCE:
        raise FormatError(
            f"is a broadcast view (strides {info.strides}) of {nbytes:,} bytes over {hi - lo:,} stored bytes; "
            "writing it stores every element. Save it materialized (.contiguous()) if that is really meant",
            path=path, tensor=view.name)
    return nbytes
