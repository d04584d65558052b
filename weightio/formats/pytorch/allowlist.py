"""The allowlist and its stand-ins: what the allowlisted globals of a checkpoint pickle become.

`ALLOWLIST` maps exact ``(module, name)`` pairs to stand-ins, each an inert, immutable object of
`.inert` (a `Function`, a `Token` or a `FrozenClass` class), shared by every pickle the process
reads and unchangeable by any opcode. None imports or calls what the
pickle names: torch's rebuild functions return records (`TensorRef`) checked later, when the
reader can name the tensor; storage classes, dtypes, layouts are `Token`s; containers
(`OrderedDict`, `Namespace`, sets …) check the keys they are built from; numpy arrays and
scalars are rebuilt from their dtype, shape and raw bytes (`NumpyDType`, `NumpyArray`),
numpy's pickle support is never called, and object dtypes are refused. The objects training
checkpoints hold beside tensors (OmegaConf configs, ``TrainingArguments``, paths, dates, enums …)
have stand-ins of their own, in `.standins`.

No stand-in builds a tuple or frozenset from the items of a list, dict or set other than
plain scalars (`_size` takes ints only): the lexer's nesting bound for tuples, which keeps
hashing them off the C stack's limit, holds only for what it saw built (see `.lexer`).

`weightio.formats.pytorch.flatten` then walks the unpickled object into tensor names and metadata.
"""

from __future__ import annotations

import math
import re
from itertools import islice
from typing import Any, Literal

import numpy as np

from ...dtypes import TABLE
from ...errors import CorruptFileError, UnsafePickleError, UnsupportedDTypeError
from .inert import FrozenClass, Function, Token
from .legacy_tensors import legacy_tensor_classes
from .py2_strings import text_bytes
from .rebuilds import LAYOUTS, torch_functions
from .refs import StorageRef, TensorRef, check_state, short_repr
from .standins import training_objects

__all__ = [
    "ALLOWLIST", "Function", "Namespace", "NumpyArray", "NumpyDType", "STORAGE_CLASSES", "StorageRef",
    "TORCH_DTYPES", "TensorRef", "Token", "short_repr",
]

_WIDE = 2**61 - 1  # CPython hashes an int as int % (2**61 - 1): below this, distinct ints never collide


# ----------------------------------------------------------------------------- builtins and collections


def _strong(key: Any) -> bool:
    """True for keys whose hash the file cannot steer (str/bytes are randomized; small ints are distinct)."""
    return (key is None or isinstance(key, (str, bytes, bool))
            or (type(key) is int and -_WIDE < key < _WIDE))


def _plain_items(items: Any, what: str) -> list:
    """Items passed to a set/dict constructor stand-in: a list or tuple of strong keys."""
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise CorruptFileError(f"{what} takes a list, found {type(items).__name__}")
    if not all(_strong(k) for k in items):
        raise CorruptFileError(f"{what} holds keys other than strings and small integers")
    return list(items)


class OrderedDict(dict):
    """``collections.OrderedDict`` (and ``Counter``): a dict; its BUILD state (``_metadata``,
    the module versions torch attaches to a state dict) is checked and dropped."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        check_state(state, "an OrderedDict's state")


def _ordered_dict(items: Any = None) -> OrderedDict:
    """The stand-in ``collections.OrderedDict(...)``: torch calls it with no arguments, and fills
    it with SETITEMS (whose keys the prepass polices); arguments are checked here."""
    if items is None:
        return OrderedDict()
    pairs = list(items.items()) if isinstance(items, dict) else [_pair(p) for p in _sequence(items, "OrderedDict")]
    _plain_items([k for k, _ in pairs], "OrderedDict")
    return OrderedDict(pairs)


def _sequence(items: Any, what: str) -> list:
    if not isinstance(items, (list, tuple)):
        raise CorruptFileError(f"{what} takes a list, found {type(items).__name__}")
    return list(items)


def _pair(item: Any) -> tuple:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise CorruptFileError("OrderedDict takes (key, value) pairs")
    return tuple(item)


class Namespace(metaclass=FrozenClass):
    """``argparse.Namespace`` (training arguments saved in checkpoints): its attributes as a dict.

    Pickled with NEWOBJ (protocol 2+), which calls ``__new__`` only: it builds the whole object.
    """

    bounded_repr = True  # its repr is short whatever the file holds (`.refs.short_repr` uses it)

    __slots__ = ("fields",)
    allowlisted_as = "argparse.Namespace"

    def __new__(cls, *args: Any) -> Namespace:
        if args:
            raise CorruptFileError("argparse.Namespace takes no positional arguments")
        obj = object.__new__(cls)
        obj.fields = {}
        return obj

    def __setstate__(self, state: Any) -> None:
        check_state(state, "an argparse.Namespace's state")
        self.fields = dict(state) if isinstance(state, dict) else {}

    def __repr__(self) -> str:
        names = ", ".join(short_repr(k, 40) for k in islice(self.fields, 8))
        return f"Namespace({names}{', …' if len(self.fields) > 8 else ''})"


def _set(items: Any = ()) -> set:
    return set(_plain_items(items, "set"))


def _frozenset(items: Any = ()) -> frozenset:
    return frozenset(_plain_items(items, "frozenset"))


def _bytearray(data: Any = b"", encoding: Any = None) -> bytearray:
    if isinstance(data, (bytes, bytearray)):
        return bytearray(data)
    if isinstance(data, str) and encoding in ("latin1", "latin-1"):
        return bytearray(data.encode("latin1"))
    raise CorruptFileError(f"bytearray({short_repr(data)}) is not supported")


def _bytes(data: Any = b"") -> bytes:
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    raise CorruptFileError(f"bytes({short_repr(data)}) is not supported")


def _complex(real: Any = 0.0, imag: Any = 0.0) -> complex:
    if not all(type(x) in (int, float) for x in (real, imag)):
        raise CorruptFileError(f"complex({short_repr(real)}, {short_repr(imag)}) is not supported")
    return complex(real, imag)


def _codecs_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode``: how protocol 2 stores ``bytes``; only latin-1 of a str (no codec lookups)."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise UnsafePickleError(f"_codecs.encode with encoding {short_repr(encoding)} (only 'latin1' is "
                                "allowed: other codecs import modules)")
    try:
        return text.encode("latin1")
    except UnicodeEncodeError:
        raise CorruptFileError("_codecs.encode: text is not latin-1") from None


# ----------------------------------------------------------------------------- numpy stand-ins

# dtype codes numpy pickles (``numpy.dtype('f8', False, True)``): only these are turned into dtypes.
_NUMPY_CODE = re.compile(r"(?:[biufc]\d{1,2}|\?|[SUV]\d{1,9}|O\d?|[Mm]8(?:\[\w{1,8}\])?)")
_NUMERIC_CODES = frozenset("b1 ? i1 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8 c8 c16".split())
_TEXT_KINDS = "SU"


class NumpyDType:
    """``numpy.dtype(code, align, copy)`` plus its BUILD state; resolved by `resolve`."""

    bounded_repr = True  # its repr is short whatever the file holds (`.refs.short_repr` uses it)

    __slots__ = ("code", "byteorder", "structured")
    byteorder: Literal["<", ">", "|", "="]  # (`__setstate__` takes no other)

    def __init__(self, code: Any = None, align: Any = False, copy: Any = False) -> None:
        if not isinstance(code, str) or not _NUMPY_CODE.fullmatch(code):
            raise CorruptFileError(f"numpy dtype code {short_repr(code)} is not supported")
        self.code, self.byteorder, self.structured = code, "=", False

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (8, 9) or state[1] not in ("<", ">", "|", "="):
            raise CorruptFileError(f"numpy dtype state {short_repr(state)} is malformed")
        self.byteorder = state[1]
        self.structured = any(part is not None for part in state[2:5])  # subarray, names, fields

    def resolve(self, *, text: bool = False) -> np.dtype:
        """The numpy dtype: plain numeric codes (and with `text`, fixed-width strings).

        Raises:
            UnsafePickleError: the object dtype, whose values are arbitrary pickled objects.
            UnsupportedDTypeError: anything else (structured, datetime, void, platform-sized floats).
        """
        if self.code[0] == "O":
            raise UnsafePickleError("numpy object dtype ('O'): its values are arbitrary pickled objects; refused")
        if self.structured or not (self.code in _NUMERIC_CODES or (text and self.code[0] in _TEXT_KINDS)):
            raise UnsupportedDTypeError(f"numpy dtype {self.code!r} is not supported (plain numeric dtypes are)")
        dtype = np.dtype(self.code)
        return dtype.newbyteorder(self.byteorder) if self.byteorder in "<>" else dtype

    def __repr__(self) -> str:
        return f"dtype({self.code!r})"


class NumpyArray:
    """``numpy.core.multiarray._reconstruct(ndarray, shape, typecode)`` plus BUILD state, or
    ``numpy._core.numeric._frombuffer``: an ndarray rebuilt here from dtype, shape and raw bytes.

    Attributes:
        array: the rebuilt read-only array (a view of the pickled bytes), or None before BUILD.
        error: why the array cannot be served (unsupported dtype), or None.
    """

    bounded_repr = True  # its repr is short whatever the file holds (`.refs.short_repr` uses it)

    __slots__ = ("array", "error")

    def __init__(self) -> None:
        self.array: np.ndarray | None = None
        self.error: str | None = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise CorruptFileError(f"numpy array state {short_repr(state)} is malformed")
        shape, dtype, fortran, raw = state[-4:]
        self._fill(raw, dtype, shape, "F" if fortran is True else "C")

    def _fill(self, raw: Any, dtype: Any, shape: Any, order: Any) -> None:
        if not isinstance(dtype, NumpyDType):
            raise CorruptFileError(f"numpy array dtype {short_repr(dtype)} is not a numpy.dtype")
        if isinstance(raw, list) or dtype.code[0] == "O":
            raise UnsafePickleError("numpy object array: its items are arbitrary pickled objects; refused")
        if not isinstance(raw, (bytes, bytearray, str)):
            raise CorruptFileError(f"numpy array data must be bytes, found {type(raw).__name__}")
        shape = _shape(shape, "numpy array shape")
        try:
            resolved = dtype.resolve()
        except UnsupportedDTypeError:
            self.error = f"dtype {dtype.code!r}"  # listed in metadata as a description; the pickle is fine
            return
        if isinstance(raw, str):  # a Python 2 string (read as UTF-8), or latin-1 text
            raw = text_bytes(raw, math.prod(shape) * resolved.itemsize)
        if len(raw) != math.prod(shape) * resolved.itemsize:
            raise CorruptFileError(f"numpy array {resolved.str} {shape} needs {math.prod(shape) * resolved.itemsize:,} "
                                   f"bytes but {len(raw):,} are pickled")
        flat = np.frombuffer(bytes(raw), dtype=resolved)
        self.array = flat.reshape(shape, order="F" if order == "F" else "C")

    def __repr__(self) -> str:
        a = self.array
        if a is None:
            return f"<numpy array of {self.error}>" if self.error else "<numpy array>"
        return f"<numpy array {a.dtype} {a.shape}>"


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if (not isinstance(shape, (tuple, list)) or len(shape) > 64
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise CorruptFileError(f"{what} {short_repr(shape)} is not a tuple of at most 64 non-negative ints")
    return tuple(shape)


def _numpy_reconstruct(subtype: Any, shape: Any = (0,), typecode: Any = b"b") -> NumpyArray:
    if subtype is not _NDARRAY:
        raise UnsafePickleError(f"numpy _reconstruct of {short_repr(subtype)} (only numpy.ndarray is allowed)")
    return NumpyArray()


def _numpy_frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any = "C") -> NumpyArray:
    arr = NumpyArray()
    arr._fill(buffer, dtype, shape, order)
    return arr


def _numpy_scalar(dtype: Any, raw: Any = None) -> Any:
    """``numpy.core.multiarray.scalar(dtype, bytes)``: the value as a plain Python scalar.

    Scalars of dtypes weightio does not decode (datetime, void, …) become a short description.
    """
    if not isinstance(dtype, NumpyDType):
        raise CorruptFileError(f"numpy scalar dtype {short_repr(dtype)} is not a numpy.dtype")
    try:
        resolved = dtype.resolve(text=True)
    except UnsupportedDTypeError:
        return f"<numpy scalar of dtype {dtype.code!r}>"
    if isinstance(raw, str):
        raw = text_bytes(raw, resolved.itemsize)
    if not isinstance(raw, bytes) or len(raw) != resolved.itemsize:
        raise CorruptFileError(f"numpy scalar {resolved.str} needs {resolved.itemsize} bytes of data")
    return np.frombuffer(raw, dtype=resolved)[0].item()


_NDARRAY = Token("numpy", "ndarray", "numpy_type")


# ----------------------------------------------------------------------------- the allowlist

# torch's dtype globals (``torch.float32``, ``torch.long`` …) -> the canonical dtype name.
TORCH_DTYPES: dict[str, str] = {
    **{row.torch: row.torch for row in TABLE if row.torch is not None},
    **{name: name for name in ("complex128", "complex32", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
                               "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "bit")},
    **{f"{kind}{n}": f"{kind}{n}" for kind in ("int", "uint") for n in range(1, 8)},  # sub-byte ints
    "short": "int16", "int": "int32", "long": "int64", "half": "float16", "float": "float32", "double": "float64",
    "cfloat": "complex64", "cdouble": "complex128", "chalf": "complex32",
}

# torch.<X>Storage -> torch dtype name (the legacy typed storages; newer dtypes use UntypedStorage + dtype).
STORAGE_CLASSES: dict[str, str] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "LongStorage": "int64",
    "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "BFloat16Storage": "bfloat16", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}
_QSCHEMES = ("per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams",
             "per_tensor_symmetric", "per_channel_symmetric")


def _allowlist() -> dict[tuple[str, str], Any]:
    """Every global a checkpoint pickle may name, by exact ``(module, name)``, and its stand-in:
    a `Function` (one per spelling, so that messages name the global as the pickle did), a
    `Token`, or a `FrozenClass` class."""
    table: dict[tuple[str, str], Any] = {}

    def function(module: str, name: str, call: Any, kind: str = "function") -> None:
        table[(module, name)] = Function(module, name, call, kind)

    table.update(torch_functions())
    for module, name in (("torch.nn.parameter", "Parameter"), ("torch.nn", "Parameter")):
        table[(module, name)] = Token(module, name, "tensor_type")
    table.update(legacy_tensor_classes())  # torch.Tensor, torch.FloatTensor …: classes (legacy BUILD forms)
    for name, canonical in TORCH_DTYPES.items():
        table[("torch", name)] = Token("torch", name, "dtype", canonical)
    for name, torch_dtype in STORAGE_CLASSES.items():
        table[("torch", name)] = Token("torch", name, "storage", torch_dtype)
    for module in ("torch", "torch.storage"):
        table[(module, "UntypedStorage")] = Token(module, "UntypedStorage", "storage", "uint8")
    for token in LAYOUTS.values():
        table[("torch", token.name)] = token
    for name in _QSCHEMES:
        table[("torch", name)] = Token("torch", name, "qscheme")
    for name in ("OrderedDict", "Counter"):
        function("collections", name, _ordered_dict)
    table[("argparse", "Namespace")] = Namespace
    for module in ("builtins", "__builtin__"):
        for name, call in (("set", _set), ("frozenset", _frozenset), ("complex", _complex),
                           ("bytearray", _bytearray), ("bytes", _bytes)):
            function(module, name, call)
    function("_codecs", "encode", _codecs_encode)
    table[("numpy", "ndarray")] = _NDARRAY
    function("numpy", "dtype", NumpyDType)
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        function(module, "_reconstruct", _numpy_reconstruct)
        function(module, "scalar", _numpy_scalar)
    for module in ("numpy.core.numeric", "numpy._core.numeric"):
        function(module, "_frombuffer", _numpy_frombuffer)
    for key, standin in training_objects().items():  # OmegaConf, Lightning, Trainer objects: `.standins`
        table.setdefault(key, standin)
    return table


ALLOWLIST: dict[tuple[str, str], Any] = _allowlist()
