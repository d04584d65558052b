"""The GGUF writer: GGUF v3, little-endian, byte-identical to ``gguf.GGUFWriter``.

The layout is the reader's (`weightio.formats.gguf`): magic, version 3, u64 counts, the
metadata key/values, one tensor info per tensor (name, n_dims, ne in ggml order, ggml type,
offset), padding to the alignment, then each tensor's bytes padded to the alignment.

`write` takes `TensorSource`s (`weightio.records`): plain tensors are stored in their own type
(F32, F16, BF16, F64, I8-I64); sources with ``ggml_type`` set fetch ggml blocks, which are copied
as they are; the ``types`` option converts tensors to F32/F16/BF16/Q8_0/Q4_0 while writing, one
tensor in memory at a time. Turning a user's mapping into sources is `weightio.writing`'s job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np

from .._outputs import atomic_write, write_all
from ..errors import FormatError, UnsupportedDTypeError, UsageError
from ..quant import dequantize
from ..quant.quantize import quantize_rows
from ..quant.types import GGMLType, by_name
from ..records import TensorSource
from .base import stored_name
from .gguf import DEFAULT_ALIGNMENT, MAGIC, MAX_ALIGNMENT, MAX_KEY_LENGTH, GGUFArray
from .gguf_fields import SCALAR_DTYPES, GGUFValueType, fields_for

__all__ = ["write", "target_type", "check_name", "check_types", "stored_size", "REQUANTIZABLE"]

_VERSION = 3
_LE = fields_for("<", _VERSION)
_INT_RANGES = {  # value type -> (min, max)
    GGUFValueType.UINT8: (0, 2**8 - 1), GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1), GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1), GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1), GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)
_BY_NUMPY = {dtype.newbyteorder("="): vtype for vtype, dtype in SCALAR_DTYPES.items()}
# numpy dtype of a tensor -> the plain ggml type it is stored as
_PLAIN_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64"}
REQUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0")


def _string_bytes(text: str | bytes) -> bytes:
    """A GGUF string. Text the reader decoded from bytes that are not UTF-8 (``surrogateescape``)
    is written back as those bytes; any other lone surrogate has no bytes to stand for."""
    try:
        raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise TypeError(f"string holds a lone surrogate ({text[e.start]!r}) that stands for no byte; GGUF "
                        "strings are bytes: escape it") from None
    return _LE.counts.pack(len(raw)) + raw


def _auto_type(value: Any, in_array: bool) -> GGUFValueType:
    """The GGUF type a Python value is written as when none is given (see `write`)."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, np.generic):
        vtype = _BY_NUMPY.get(value.dtype)
        if vtype is None:
            raise TypeError(f"numpy {value.dtype} has no GGUF metadata type")
        return vtype
    if isinstance(value, int):
        if in_array:  # gguf-py's rule for list items, which llama.cpp's token_type arrays follow
            return GGUFValueType.INT32 if -(2**31) <= value < 2**31 else GGUFValueType.INT64
        return GGUFValueType.UINT32 if 0 <= value < 2**32 else (
            GGUFValueType.INT32 if -(2**31) <= value < 0 else
            GGUFValueType.INT64 if -(2**63) <= value < 2**63 else GGUFValueType.UINT64)
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, (str, bytes)):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple, GGUFArray, np.ndarray)):
        return GGUFValueType.ARRAY
    raise TypeError(f"{type(value).__name__} {value!r} has no GGUF metadata type")


def _parse_type(spec: str) -> tuple[GGUFValueType, str | None]:
    """``"UINT32"`` -> (UINT32, None); ``"ARRAY[INT32]"`` -> (ARRAY, "INT32")."""
    match = re.fullmatch(r"([A-Z0-9]+)(?:\[(.+)\])?", spec.strip().upper())
    if match is None or match[1] not in GGUFValueType.__members__:
        raise TypeError(f"unknown GGUF value type {spec!r}")
    vtype = GGUFValueType[match[1]]
    if match[2] is not None and vtype != GGUFValueType.ARRAY:
        raise TypeError(f"only ARRAY takes an element type, not {spec!r}")
    return vtype, match[2]


def _encode_value(value: Any, vtype: GGUFValueType, sub: str | None = None) -> bytes:
    """The bytes of `value` as `vtype` (without the leading type code)."""
    if vtype == GGUFValueType.STRING:
        if not isinstance(value, (str, bytes)):
            raise TypeError(f"STRING needs a str, got {type(value).__name__}")
        return _string_bytes(value)
    if vtype == GGUFValueType.ARRAY:
        return _encode_array(value, sub)
    return _encode_scalar(value, vtype)


def _encode_scalar(value: Any, vtype: GGUFValueType) -> bytes:
    if vtype == GGUFValueType.BOOL:
        if not isinstance(value, (bool, np.bool_, int)) or value not in (0, 1):
            raise TypeError(f"BOOL needs True or False, got {value!r}")
        return bytes([int(value)])
    if vtype in _FLOATS:
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{vtype.name} needs a number, got {value!r}")
        return _LE.scalars[vtype].pack(float(value))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{vtype.name} needs an int, got {value!r}")
    lo, hi = _INT_RANGES[vtype]
    if not lo <= int(value) <= hi:
        raise TypeError(f"{int(value)} is out of the {vtype.name} range {lo}..{hi}")
    return _LE.scalars[vtype].pack(int(value))


def _element_type(value: Any, sub: str | None) -> tuple[GGUFValueType, str | None]:
    """The element type (and its own element type) of an array value."""
    if sub is not None:
        etype, inner = _parse_type(sub)
        return etype, inner
    if isinstance(value, GGUFArray):
        return GGUFValueType[value.type], None
    if isinstance(value, np.ndarray):
        return _auto_type(value.dtype.type(0), True), None
    if not len(value):
        return GGUFValueType.INT32, None  # an empty list says nothing; INT32 is gguf-py's default
    kinds = {_auto_type(item, True) for item in value}
    if kinds == {GGUFValueType.INT32, GGUFValueType.INT64}:
        kinds = {GGUFValueType.INT64}
    if len(kinds) != 1:
        raise TypeError("array items must all have one type (bool, int, float, str or array), found "
                        + ", ".join(sorted(k.name for k in kinds)))
    return kinds.pop(), None


def _encode_array(value: Any, sub: str | None) -> bytes:
    if not isinstance(value, (list, tuple, GGUFArray, np.ndarray)):
        raise TypeError(f"ARRAY needs a list, tuple, numpy array or GGUFArray, got {type(value).__name__}")
    etype, inner = _element_type(value, sub)
    head = _LE.u32.pack(etype) + _LE.counts.pack(len(value))
    if etype in SCALAR_DTYPES and isinstance(value, (np.ndarray, GGUFArray)) and (
            sub is None or isinstance(value, GGUFArray)):
        items = np.asarray(value.numpy() if isinstance(value, GGUFArray) else value)
        if items.ndim != 1:
            raise TypeError(f"numpy metadata arrays must be 1-D, got shape {items.shape}")
        return head + _numbers(items, etype)
    if etype == GGUFValueType.STRING and isinstance(value, GGUFArray) and value.type == "STRING":
        return head + b"".join(_string_bytes(raw) for raw in value.raw_strings())
    return head + b"".join(_encode_value(item, etype, inner) for item in value)


def _numbers(items: np.ndarray, etype: GGUFValueType) -> bytes:
    """A 1-D array's values as `etype` elements, checked to survive the conversion."""
    dtype = SCALAR_DTYPES[etype]
    if etype == GGUFValueType.BOOL:
        return np.asarray(items, dtype=bool).astype(np.uint8).tobytes()
    converted = items.astype(dtype)
    if etype not in _FLOATS and not np.array_equal(converted, items):
        raise TypeError(f"values do not fit {etype.name}")
    return converted.tobytes()


def _metadata_bytes(metadata: Mapping[str, Any], value_types: Mapping[str, str], path: str) -> list[bytes]:
    """One encoded key/value per entry of `metadata`, in order."""
    encoded = []
    for key, value in metadata.items():
        try:
            if not isinstance(key, str) or not key:
                raise TypeError(f"keys must be non-empty str, got {key!r}")
            stored_name(key, path, "GGUF", what="metadata key")  # the reader wants keys in strict UTF-8
            if len(key.encode("utf-8")) > MAX_KEY_LENGTH:
                raise TypeError(f"key is longer than {MAX_KEY_LENGTH} bytes")
            spec = value_types.get(key)
            vtype, sub = _parse_type(spec) if spec is not None else (_auto_type(value, False), None)
            if key == "general.alignment":
                vtype, sub = GGUFValueType.UINT32, None
            encoded.append(_string_bytes(key) + _LE.u32.pack(vtype) + _encode_value(value, vtype, sub))
        except (TypeError, OverflowError) as e:  # OverflowError: a float or int FLOAT32/64 cannot hold
            raise FormatError(f"metadata {key!r}: {e}", path=path) from None
    return encoded


class _Plan(NamedTuple):
    """One tensor to write: its ggml type, numpy-order shape, stored size and a fetch of its bytes."""

    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]
    nbytes: int
    fetch: Any  # () -> uint8 array or bytes of exactly nbytes


def stored_size(t: GGMLType, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of numpy-order `shape` occupies as `t` (whole blocks along the last axis)."""
    return math.prod(shape[:-1]) * t.row_bytes(shape[-1]) if shape else t.type_size


def target_type(name: str, shape: tuple[int, ...], floating: bool, types: Any) -> str | None:
    """The ggml type `types` asks for tensor `name`, or None to keep its own (see `write`)."""
    if types is None:
        return None
    if isinstance(types, str):  # one type for every tensor it suits: floating, 2+ dims, whole blocks
        t = _convertible(types)
        return t.name if floating and len(shape) >= 2 and shape[-1] % t.block_size == 0 else None
    wanted = types.get(name)
    return None if wanted is None else _convertible(wanted).name


def _convertible(name: str) -> GGMLType:
    t = by_name(name)
    if t is None or t.name not in REQUANTIZABLE:
        raise UnsupportedDTypeError(f"the GGUF writer converts tensors to {', '.join(REQUANTIZABLE)}, not {name!r}")
    return t


def _plan(src: TensorSource, types: Any, path: str) -> _Plan:
    """How `src` is written: as given, block for block, or converted (see `write`)."""
    if src.ggml_type is not None:
        return _blocks(src, types, path)
    floating = src.dtype.kind == "f" or src.dtype.name == "bfloat16"
    wanted = target_type(src.name, src.shape, floating, types)
    if wanted is None:
        plain = _PLAIN_TYPES.get(src.dtype.name)
        if plain is None:
            raise UnsupportedDTypeError(f"GGUF stores F32, F16, BF16, F64 and I8-I64 tensors (and ggml blocks), not "
                                        f"{src.dtype.name}; convert it first", path=path, tensor=src.name)
        return _Plan(src.name, cast(GGMLType, by_name(plain)), src.shape, src.nbytes, src.little_endian_bytes)
    return _converted(src, cast(GGMLType, by_name(wanted)), path)  # (names of known types: by_name finds them)


def _blocks(src: TensorSource, types: Any, path: str) -> _Plan:
    """Stored ggml blocks: copied as they are, or decoded and converted when `types` asks."""
    t = by_name(src.ggml_type or "")
    if t is None:
        raise UnsupportedDTypeError(f"unknown ggml type {src.ggml_type!r}", path=path, tensor=src.name)
    wanted = target_type(src.name, src.shape, True, types)
    if wanted in (None, t.name):
        return _Plan(src.name, t, src.shape, src.nbytes, src.fetch)
    shape = src.shape

    def values() -> np.ndarray:
        return dequantize(src.fetch(), t.name, shape)

    decoded = TensorSource(src.name, np.dtype(np.float32), shape, math.prod(shape) * 4, values)
    return _converted(decoded, cast(GGMLType, by_name(wanted)), path)  # (`target_type` checked `wanted`)


def _converted(src: TensorSource, t: GGMLType, path: str) -> _Plan:
    """A tensor converted to `t` while it is written (one bounded group of rows at a time)."""
    row = src.shape[-1] if src.shape else 1
    if row % t.block_size:
        raise UnsupportedDTypeError(f"rows of {row} elements are not whole {t.name} blocks of {t.block_size}",
                                    path=path, tensor=src.name)
    if src.dtype.kind not in "fiu" and src.dtype.name != "bfloat16":
        raise UnsupportedDTypeError(f"cannot convert {src.dtype.name} to {t.name}", path=path, tensor=src.name)

    def fetch() -> np.ndarray:
        return quantize_rows(src.array(), t.name)

    return _Plan(src.name, t, src.shape, stored_size(t, src.shape), fetch)


def _writer_alignment(metadata: Mapping[str, Any], path: str) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 < value <= MAX_ALIGNMENT and not value & (value - 1)):
        raise FormatError(f"general.alignment must be a power of two up to {MAX_ALIGNMENT}, got {value!r}", path=path)
    return int(value)


def check_types(types: Any, names: Sequence[str], path: str) -> None:
    """`types` is None, a type name, or a mapping whose keys are among `names`.

    Raises:
        UsageError: anything else, or a mapping naming a tensor that is not written.
    """
    if types is None or isinstance(types, str):
        return
    if not isinstance(types, Mapping):
        raise UsageError(f"types must be a ggml type name or a mapping of tensor name -> type, got {types!r}",
                         path=path)
    written = set(names)
    unknown = [name for name in types if name not in written]
    if unknown:
        raise UsageError(f"types names tensors that are not written: {', '.join(map(repr, unknown[:5]))}", path=path)


def check_name(name: Any, path: str) -> str:
    """`name` if it can name a GGUF tensor that the reader reads back (a non-empty str in strict
    UTF-8 within ``limits.name_bytes``), else `UsageError`."""
    stored_name(name, path, "GGUF")
    return name


def _header(kvs: list[bytes], plans: list[_Plan], alignment: int) -> bytes:
    """Everything before the data section, padding included."""
    parts = [MAGIC, _LE.u32.pack(_VERSION), _LE.counts.pack(len(plans)), _LE.counts.pack(len(kvs)), *kvs]
    offset = 0
    for plan in plans:
        ne = plan.shape[::-1]
        parts += [_string_bytes(plan.name), _LE.u32.pack(len(ne)), *(_LE.counts.pack(d) for d in ne),
                  _LE.u32.pack(plan.ggml_type.id), _LE.u64.pack(offset)]
        offset += plan.nbytes + (-plan.nbytes % alignment)
    head = b"".join(parts)
    return head + bytes(-len(head) % alignment)


def write(
    sources: Sequence[TensorSource],
    path: str,
    metadata: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
    types: str | Mapping[str, str] | None = None,
    value_types: Mapping[str, str] | None = None,
) -> None:
    """Write a GGUF v3 file (little-endian), atomically, one tensor in memory at a time.

    Args:
        sources: the tensors, in order (`weightio.writing.tensor_sources` builds them from a
            mapping). float32/float16/bfloat16/float64/int8-int64 sources are stored as
            F32/F16/BF16/F64/I8-I64; sources with ``ggml_type`` set (blocks of a GGUF
            checkpoint, `weightio.quant.QuantizedTensor`s) are copied block for block.
        path: destination file.
        metadata: key -> value, written in order. Values: bool (BOOL), int (UINT32 when it fits,
            else INT32/INT64/UINT64), float (FLOAT32), str (STRING), numpy scalars (their own
            type), lists/tuples (ARRAY; int items INT32, as gguf-py writes them), 1-D numpy arrays
            and `GGUFArray`s (their own element type). ``general.alignment`` (UINT32, a power
            of two) sets the alignment, 32 by default.
        overwrite: replace an existing file (atomically) instead of refusing.
        types: convert tensors while writing: one of ``"F32"``, ``"F16"``, ``"BF16"``, ``"Q8_0"``,
            ``"Q4_0"`` for every tensor of two or more dimensions whose rows are whole blocks (the
            others keep their type, as llama.cpp keeps norms and biases in F32), or a mapping of
            tensor name -> type for exactly those tensors (an error if one cannot be converted).
        value_types: key -> GGUF type name (``"UINT16"``, ``"ARRAY[INT64]"``) for keys that must
            not get the default type; ``gguf.value_types(ckpt)`` reproduces a GGUF file's own types.

    When any tensor is block-quantized and ``general.quantization_version`` is not given, it is
    added (UINT32 2), as llama.cpp requires. For the same keys, types and tensors, the bytes
    equal those ``gguf.GGUFWriter`` writes.

    Raises:
        UsageError: a source name that is not a non-empty str, or `types` that is not a type
            name or a mapping of written tensor names.
        UnsupportedDTypeError: a tensor GGUF cannot store, or cannot convert as `types` asks.
        FormatError: metadata that cannot be stored.

    Example:
        >>> wio.save({"w": w}, "x.gguf", {"general.architecture": "llama"})            # doctest: +SKIP
        >>> wio.save(ckpt, "x-q8.gguf", ckpt.metadata, types="Q8_0")                   # doctest: +SKIP
    """
    metadata = dict(metadata or {})
    alignment = _writer_alignment(metadata, path)
    names = [check_name(src.name, path) for src in sources]
    check_types(types, names, path)
    plans = [_plan(src, types, path) for src in sources]
    if any(p.ggml_type.quantized for p in plans):
        metadata.setdefault("general.quantization_version", np.uint32(2))
    kvs = _metadata_bytes(metadata, dict(value_types or {}), path)
    with atomic_write(path, overwrite=overwrite) as out:
        out.write(_header(kvs, plans, alignment))
        for plan in plans:
            _write_tensor(out, plan, alignment, path)


def _write_tensor(out: Any, plan: _Plan, alignment: int, path: str) -> None:
    """One tensor's bytes and padding; its data is released when this returns (streaming)."""
    data = plan.fetch()
    size = data.nbytes if isinstance(data, np.ndarray) else len(data)
    if size != plan.nbytes:  # a source changed under us (or a bug): never write a wrong file
        raise FormatError(f"produced {size} bytes, {plan.nbytes} expected", path=path, tensor=plan.name)
    write_all(out, data)
    out.write(bytes(-plan.nbytes % alignment))
