"""GGUF (llama.cpp's model format), versions 1-3, little- and big-endian: reader and writer.

The format (ggml ``docs/gguf.md``; llama.cpp ``ggml/src/gguf.cpp``)::

    u8[4]    magic "GGUF"                      (bytes 47 47 55 46 in every byte order)
    u32      version                           1, 2 or 3
    count    tensor_count                      count = u32 in v1, u64 from v2
    count    metadata_kv_count
    kv[metadata_kv_count]:
      string   key                             count length + UTF-8 bytes, no NUL terminator
      u32      value_type                      GGUFValueType
      value                                    a scalar, a string, or an array:
                                                 u32 element type, count n, n elements
    tensor_info[tensor_count]:
      string   name
      u32      n_dims                          at most 4
      count    ne[n_dims]                      ne[0] varies fastest: numpy shape = reversed(ne)
      u32      ggml_type                       see weightio.quant.types
      u64      offset                          from the data section; a multiple of the alignment
    padding  zeros up to a multiple of the alignment (absolute file offset)
    data     each tensor's bytes at data_start + offset, padded to the alignment

The alignment is the ``general.alignment`` key (UINT32, a power of two) or 32. v1 (2023-08,
read-only here) has u32 counts, lengths and dims and no 64-bit value types. v2 and v3 are the
same layout; v3 announced that big-endian files exist. No field says which byte order a file
uses: like llama.cpp and gguf-py, a version whose low 16 bits are zero when read little-endian
marks a big-endian file (``FUGG`` magic, once proposed for them, is read the same way).

What this reader returns:

* ``metadata``: key -> int, float, bool or str (UINT32 and friends become int, FLOAT32/64
  float, BOOL bool); arrays become `GGUFArray`, a read-only sequence that is only *located*
  at open (string lengths are walked once, bounds-checked) and decoded when asked for, so
  a 150k-entry tokenizer vocabulary costs milliseconds to open. ``value_types`` keeps each
  key's GGUF type (``"UINT32"``, ``"ARRAY[STRING]"``) for faithful rewriting. Strings that are
  not valid UTF-8 decode with ``surrogateescape`` (``s.encode("utf-8", "surrogateescape")``
  gives the stored bytes back); v1 strings lose trailing NULs, which some v1 writers added.
* ``tensors``: numpy-order shapes. Plain types (F32, F16, BF16, F64, I8-I64) are zero-copy
  views (big-endian files: big-endian dtypes, converted by ``numpy()``). Block types report
  float32 (what ``numpy()`` returns, dequantized), ``ggml_type`` the block type, ``nbytes`` the
  stored bytes, and ``raw()`` gives the blocks themselves.

Rules enforced here (`CorruptFileError` unless stated; every count and length is checked
against the bytes left in the file before anything is allocated or looped over):

* magic, version 1-3 (else `FormatError`); counts that cannot fit in the file;
* `weightio.limits`: the header (key/values and tensor infos) within ``header_bytes``, at most
  ``tensors`` tensors, keys and names within ``name_bytes``, arrays nested within
  ``array_depth`` (the defaults are the spec's and llama.cpp's values below);
* keys: UTF-8, non-empty, at most 65535 bytes, unique; value types 0-12; BOOL values 0 or 1;
  arrays nested at most 8 deep; ``general.alignment`` a UINT32 power of two up to 1 MiB;
* tensor names: UTF-8, non-empty, unique; n_dims <= 4; the product of the non-zero ne below
  2^60 (numpy's limit for 8-byte elements: an empty tensor cannot claim absurd dims either);
  block types: ne[0] a whole number of blocks;
* offsets: multiples of the alignment, data inside the file, no two tensors overlapping, and
  nothing after the last tensor's padded end (no appended payloads);
* unknown ggml types do not make the file unreadable: the tensor is listed (``ggml_type``
  ``"GGML_TYPE_<id>"``) and reading it raises `UnsupportedDTypeError`; so do removed types,
  with the reason. Quantized blocks in big-endian files are refused when read (ambiguous: see
  `weightio.quant.decoding`).

Split models (``<stem>-00001-of-00003.gguf`` with ``split.count`` keys, as ``gguf-split`` and
gguf-py write them) open as one checkpoint from any part: `GGUFReader.siblings` names the
other parts.

The writer (`write`) produces GGUF v3, little-endian, the same bytes ``gguf.GGUFWriter`` writes
for the same keys, values and tensors: see `write`.
"""

from __future__ import annotations

import math
import os
import re
import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from .. import layout
from ..errors import CorruptFileError, FormatError, UnsupportedDTypeError
from ..limits import exceeded
from ..quant.types import GGMLType, by_id, by_name
from .base import Reader, TensorInfo

__all__ = ["GGUFReader", "GGUFArray", "GGUFValueType", "write", "value_types", "DEFAULT_ALIGNMENT"]

MAGIC = b"GGUF"
MAGIC_BIG_ENDIAN = b"FUGG"  # proposed in llama.cpp#3957 for big-endian files; never written here
VERSIONS = (1, 2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # no real file uses more; bounds the padding a file can claim
MAX_KEY_LENGTH = 65535  # the spec's limit
MAX_ARRAY_DEPTH = 8  # nested arrays are legal but rare; llama.cpp rejects them outright
MAX_DIMS = 4  # GGML_MAX_DIMS
# numpy refuses a shape whose non-zero dims times the itemsize (8 at most here) reach 2^63 bytes,
# even when another dim is 0 and the tensor holds nothing: checked at open, not at numpy().
MAX_ELEMENTS = 1 << 60
EAGER_ARRAY_ITEMS = 64  # arrays this short are decoded at open (and stay usable after close)


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
_SCALAR_DTYPES = {
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


class _Layout(NamedTuple):
    """The integer fields of one GGUF flavour (byte order x version)."""

    order: str  # "<" or ">"
    u32: struct.Struct  # version, value types, n_dims, ggml_type
    count: struct.Struct  # tensor/kv counts, string lengths, array counts, dims: u32 in v1, u64 after
    u64: struct.Struct  # tensor offsets (u64 in every version)
    scalars: dict[int, struct.Struct]  # fixed-size metadata values


def _layout(order: str, version: int) -> _Layout:
    return _Layout(order, struct.Struct(order + "I"), struct.Struct(order + ("I" if version == 1 else "Q")),
                   struct.Struct(order + "Q"), {t: struct.Struct(order + c) for t, c in _STRUCT_CODES.items()})


# ----------------------------------------------------------------------------- metadata arrays


class GGUFArray(Sequence):
    """A GGUF metadata array: located at open, decoded when asked for.

    A read-only `Sequence`: ``len(a)``, ``a[i]``, ``a[i:j]`` (a list), iteration, and ``==``
    against lists and tuples. ``tolist()`` decodes everything (vectorized for numbers) and
    ``numpy()`` views numeric and BOOL arrays without copying (big-endian files: a native copy).

    Attributes:
        type: the element type name (``"STRING"``, ``"INT32"``, ``"ARRAY"``).

    Arrays longer than `EAGER_ARRAY_ITEMS` read the file when decoded, so decode them before
    closing the checkpoint; shorter ones are decoded at open.
    """

    __slots__ = ("type", "_file", "_count", "_dtype", "_offset", "_array", "_starts", "_end", "_gap",
                 "_strip_nul", "_items")

    def __init__(self, vtype: GGUFValueType, file: Any, count: int) -> None:
        self.type = vtype.name
        self._file, self._count = file, count
        self._dtype: np.dtype | None = None
        self._array: np.ndarray | None = None
        self._offset = self._end = self._gap = 0
        self._starts: array | None = None
        self._strip_nul = False
        self._items: tuple | None = None

    @classmethod
    def numbers(cls, vtype: GGUFValueType, file: Any, count: int, dtype: np.dtype, offset: int) -> GGUFArray:
        """`count` fixed-size values of `dtype` stored from `offset`."""
        arr = cls(vtype, file, count)
        arr._dtype, arr._offset = dtype, offset
        return arr

    @classmethod
    def from_array(cls, vtype: GGUFValueType, values: np.ndarray) -> GGUFArray:
        """Numbers already gathered in memory (a read-only 1-D array of `vtype`'s dtype)."""
        arr = cls(vtype, None, len(values))
        arr._dtype, arr._array = values.dtype, values
        values.flags.writeable = False
        return arr

    @classmethod
    def strings(cls, file: Any, starts: array, end: int, gap: int, strip_nul: bool = False) -> GGUFArray:
        """Strings whose bytes start at `starts`; each ends `gap` bytes before the next one starts
        (its successor's length prefix, and whatever else sits between), the last at `end`."""
        arr = cls(GGUFValueType.STRING, file, len(starts))
        arr._starts, arr._end, arr._gap, arr._strip_nul = starts, end, gap, strip_nul
        return arr

    @classmethod
    def of(cls, vtype: GGUFValueType, items: list) -> GGUFArray:
        """An array of already decoded items (nested arrays)."""
        arr = cls(vtype, None, len(items))
        arr._items = tuple(items)
        return arr

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        i = int(index)
        if not -self._count <= i < self._count:
            raise IndexError(f"GGUF array index {index} out of range ({self._count} items)")
        i %= self._count
        if self._items is not None:
            return self._items[i]
        if self._dtype is not None:
            return self.numpy()[i].item()
        return self._string(i)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFArray):
            other = other.tolist()
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return len(other) == self._count and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]  # compares equal to lists, which are unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        more = ", …" if self._count > 3 else ""
        return f"GGUFArray({self.type} × {self._count}: [{head}{more}])"

    def tolist(self) -> list:
        """Every item as Python values (nested arrays as nested lists)."""
        return [x.tolist() if isinstance(x, GGUFArray) else x for x in self._decoded()]

    def numpy(self) -> np.ndarray:
        """The items as a read-only numpy array: a zero-copy view for numbers and BOOL.

        Raises:
            TypeError: for arrays of strings or of arrays (use `tolist`).
        """
        if self._dtype is None:
            raise TypeError(f"a GGUF array of {self.type} has no numpy view; use tolist()")
        if self._array is not None:
            return self._array
        return self._numbers(self._file.data)

    def _numbers(self, data: Any) -> np.ndarray:
        view = np.frombuffer(data, self._dtype, self._count, self._offset)
        if not view.dtype.isnative:
            view = view.astype(view.dtype.newbyteorder("="))
            view.flags.writeable = False
        return view

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy() if self._dtype is not None else np.array(self.tolist())
        return arr if dtype is None else arr.astype(dtype)

    def raw_strings(self) -> Iterator[bytes]:
        """The stored bytes of each item of a STRING array (what `write` copies back)."""
        if self._starts is None:
            raise TypeError(f"a GGUF array of {self.type} holds no stored strings")
        data = self._file.data
        for i, start in enumerate(self._starts):
            yield data[start:self._stop(i)].tobytes()

    def _decoded(self, data: Any = None) -> tuple:
        """Every item, decoded once. `data`: the file's bytes when the caller already holds them
        (the reader at open), else one checked access to the mapping."""
        if self._items is None:
            if self._dtype is not None:
                self._items = tuple(self.numpy().tolist() if data is None else self._numbers(data).tolist())
            elif self._count:  # one read of the mapping, then slices of it
                starts, gap, base = self._starts, self._gap, self._starts[0]
                blob = bytes((self._file.data if data is None else data)[base:self._end])
                stops = [*(s - gap - base for s in starts[1:]), self._end - base]
                text = (blob[a - base:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, stops, strict=True))
                self._items = tuple(t.rstrip("\x00") for t in text) if self._strip_nul else tuple(text)
            else:
                self._items = ()
        return self._items

    def _stop(self, i: int) -> int:
        return self._starts[i + 1] - self._gap if i + 1 < self._count else self._end

    def _string(self, i: int) -> str:
        return _decode_value_string(self._file.data[self._starts[i]:self._stop(i)], self._strip_nul)


def _decode_value_string(raw: Any, strip_nul: bool) -> str:
    """A metadata string; invalid UTF-8 is kept as lone surrogates (``surrogateescape``)."""
    text = str(memoryview(raw), "utf-8", "surrogateescape")
    return text.rstrip("\x00") if strip_nul else text


# ----------------------------------------------------------------------------- the reader


class _Cursor:
    """A position in the file with bounds-checked reads of GGUF fields."""

    def __init__(self, reader: GGUFReader, layout: _Layout, pos: int) -> None:
        self.reader, self.layout, self.pos = reader, layout, pos
        self.buf = memoryview(reader.file.data)
        self.size = reader.file.size
        self.limit = reader.limits.header_bytes  # no header field may end past this offset

    def fail(self, message: str, tensor: str | None = None) -> CorruptFileError:
        return CorruptFileError(message, path=self.reader.path, tensor=tensor)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos} but only {self.size - self.pos} remain")
        if self.pos + n > self.limit:
            raise exceeded(f"the header length (reading {what})", self.pos + n, "header_bytes", self.limit,
                           path=self.reader.path)

    def take(self, fmt: struct.Struct, what: str) -> int:
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def u32(self, what: str) -> int:
        return self.take(self.layout.u32, what)

    def count(self, what: str) -> int:
        return self.take(self.layout.count, what)

    def string(self, what: str) -> memoryview:
        n = self.count(f"the length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw

    def name(self, what: str, tensor: str | None = None) -> str:
        """A key or tensor name: strictly UTF-8, non-empty (v1: trailing NULs dropped), within the
        name length limit."""
        raw = self.string(what)
        if len(raw) > self.reader.limits.name_bytes:
            raise exceeded(f"the length of {what} {bytes(raw[:20])!r}…:", len(raw), "name_bytes",
                           self.reader.limits.name_bytes, path=self.reader.path, tensor=tensor)
        try:
            text = str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({bytes(raw[:40])!r}…: {e.reason})", tensor) from None
        if self.layout.count.size == 4:
            text = text.rstrip("\x00")
        if not text:
            raise self.fail(f"{what} is empty", tensor)
        return text


class GGUFReader(Reader):
    """A validated GGUF file. See the module docstring for the rules.

    Attributes:
        version: 1, 2 or 3.
        byteorder: ``"<"`` (little-endian) or ``">"``.
        alignment: the data alignment in bytes.
        data_offset: the absolute file offset of the data section.
        value_types: metadata key -> its GGUF type (``"UINT32"``, ``"ARRAY[STRING]"``, …).
    """

    format = "gguf"

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self.value_types: dict[str, str] = {}
        self._unreadable: dict[str, str] = {}  # tensor name -> why its data cannot be read
        self._validate(self._read)

    def _read(self) -> None:
        cur, n_tensors, n_kv = self._read_header()
        for _ in range(n_kv):
            self._read_kv(cur)
        self.alignment = self._alignment()
        infos = [self._read_tensor_info(cur) for _ in range(n_tensors)]
        self.data_offset = cur.pos + (-cur.pos % self.alignment)
        for name, shape, type_id, offset in infos:
            self.tensors[name] = self._tensor(name, shape, type_id, offset)
        self._check_layout()

    def _read_header(self) -> tuple[_Cursor, int, int]:
        if self.file.size < 8:
            raise CorruptFileError(f"file is {self.file.size} bytes, too short for the GGUF magic and version",
                                   path=self.path)
        head = self.file.read(0, 8, "the GGUF magic and version")
        magic, raw_version = head[:4], head[4:]
        if magic not in (MAGIC, MAGIC_BIG_ENDIAN):
            raise FormatError(f"not a GGUF file (magic {magic!r})", path=self.path)
        order = ">" if magic == MAGIC_BIG_ENDIAN or int.from_bytes(raw_version, "little") & 0xFFFF == 0 else "<"
        self.byteorder = order
        self.version = int.from_bytes(raw_version, "big" if order == ">" else "little")
        if self.version not in VERSIONS:
            raise FormatError(f"GGUF version {self.version} is not supported (1, 2 and 3 are)", path=self.path)
        cur = _Cursor(self, _layout(order, self.version), 8)
        n_tensors, n_kv = cur.count("tensor_count"), cur.count("metadata_kv_count")
        # Beyond its length prefix a kv takes at least 1 (key) + 4 (type) + 1 (value) bytes, a tensor
        # info 1 (name) + 4 (n_dims) + 4 (type) + 8 (offset): a count the rest of the file cannot
        # hold is refused before anything loops over it.
        width = cur.layout.count.size
        if n_kv * (width + 6) + n_tensors * (width + 17) > cur.left():
            raise cur.fail(f"claims {n_tensors} tensors and {n_kv} metadata keys, more than the "
                           f"{cur.left()} remaining bytes can hold")
        if n_tensors > self.limits.tensors:
            raise exceeded("tensor_count", n_tensors, "tensors", self.limits.tensors, path=self.path, unit="")
        return cur, n_tensors, n_kv

    # ------------------------------------------------------------------ metadata
    def _read_kv(self, cur: _Cursor) -> None:
        key = cur.name("a metadata key")  # at most limits.name_bytes (the spec's MAX_KEY_LENGTH by default)
        if key in self.metadata:
            raise cur.fail(f"metadata key {key!r} appears twice")
        vtype = self._value_type(cur, cur.u32(f"the value type of {key!r}"), key)
        value, type_name = self._read_value(cur, vtype, key, depth=0)
        self.metadata[key] = value
        self.value_types[key] = type_name

    def _value_type(self, cur: _Cursor, raw: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise cur.fail(f"metadata key {key!r} has unknown value type {raw} (known: 0-12)") from None

    def _read_value(self, cur: _Cursor, vtype: GGUFValueType, key: str, depth: int) -> tuple[Any, str]:
        if vtype == GGUFValueType.STRING:
            return _decode_value_string(cur.string(f"the value of {key!r}"), self.version == 1), "STRING"
        if vtype == GGUFValueType.ARRAY:
            return self._read_array(cur, key, depth)
        value = cur.take(cur.layout.scalars[vtype], f"the value of {key!r}")
        if vtype == GGUFValueType.BOOL:
            if value > 1:
                raise cur.fail(f"BOOL metadata {key!r} holds {value}, not 0 or 1")
            value = bool(value)
        return value, vtype.name

    def _read_array(self, cur: _Cursor, key: str, depth: int) -> tuple[GGUFArray, str]:
        if depth >= self.limits.array_depth:
            raise cur.fail(f"metadata {key!r} nests arrays more than {self.limits.array_depth} deep "
                           "(limits.array_depth)")
        etype = self._value_type(cur, cur.u32(f"the element type of {key!r}"), key)
        count = cur.count(f"the length of array {key!r}")
        if etype == GGUFValueType.STRING:
            arr = self._string_array(cur, key, count)
            return arr, "ARRAY[STRING]"
        if etype == GGUFValueType.ARRAY:
            return self._nested_array(cur, key, count, depth)
        dtype = _SCALAR_DTYPES[etype].newbyteorder(cur.layout.order)
        cur.need(count * dtype.itemsize, f"array {key!r} of {count} {etype.name}")
        if etype == GGUFValueType.BOOL and count:
            values = np.frombuffer(self.file.data, np.uint8, count, cur.pos)
            if values.max() > 1:
                raise cur.fail(f"BOOL array {key!r} holds a value other than 0 or 1")
        arr = GGUFArray.numbers(etype, self.file, count, dtype, cur.pos)
        cur.pos += count * dtype.itemsize
        if count <= EAGER_ARRAY_ITEMS:
            arr._decoded(cur.buf)
        return arr, f"ARRAY[{etype.name}]"

    def _string_array(self, cur: _Cursor, key: str, count: int) -> GGUFArray:
        width = cur.layout.count.size
        cur.need(count * width, f"array {key!r} of {count} strings")  # O(1) refusal of absurd counts
        starts, pos = _walk_strings(cur.buf, cur.pos, count, cur.layout.count)
        if pos > cur.size:
            raise cur.fail(f"array {key!r} of {count} strings runs past the end of the file")
        cur.need(pos - cur.pos, f"array {key!r} of {count} strings")  # the header limit, now the length is known
        arr = GGUFArray.strings(self.file, starts, pos, width, strip_nul=self.version == 1)
        cur.pos = pos
        if count <= EAGER_ARRAY_ITEMS:
            arr._decoded(cur.buf)
        return arr

    def _nested_array(self, cur: _Cursor, key: str, count: int, depth: int) -> tuple[GGUFArray, str]:
        cur.need(count * (4 + cur.layout.count.size), f"array {key!r} of {count} arrays")
        items, inner = [], None
        for _ in range(count):  # each item: its own element type, count and elements
            item, name = self._read_array(cur, key, depth + 1)
            items.append(item)
            inner = name if inner in (None, name) else "ARRAY"
        arr = GGUFArray.of(GGUFValueType.ARRAY, items)
        return arr, f"ARRAY[{inner or 'ARRAY'}]"

    def _alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        value, vtype = self.metadata["general.alignment"], self.value_types["general.alignment"]
        if vtype != "UINT32":
            raise CorruptFileError(f"general.alignment must be UINT32, found {vtype}", path=self.path)
        if value <= 0 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise CorruptFileError(f"general.alignment {value} is not a power of two up to {MAX_ALIGNMENT}",
                                   path=self.path)
        return value

    # ------------------------------------------------------------------ tensors
    def _read_tensor_info(self, cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
        name = cur.name("a tensor name")
        n_dims = cur.u32("n_dims")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}", name)
        ne = tuple(cur.count("a dimension") for _ in range(n_dims))
        type_id = cur.u32("ggml_type")
        offset = cur.take(cur.layout.u64, "the tensor offset")
        if math.prod(d for d in ne if d) >= MAX_ELEMENTS:
            raise cur.fail(f"dimensions {list(ne)} overflow a 64-bit element count (numpy needs the "
                           "product of the non-zero dimensions below 2^60)", name)
        return name, ne[::-1], type_id, offset

    def _tensor(self, name: str, shape: tuple[int, ...], type_id: int, offset: int) -> TensorInfo:
        if name in self.tensors:
            raise CorruptFileError("tensor name appears twice", path=self.path, tensor=name)
        t = by_id(type_id)
        if offset % self.alignment:
            raise CorruptFileError(f"offset {offset} is not a multiple of the alignment {self.alignment}",
                                   path=self.path, tensor=name)
        start = self.data_offset + offset
        if start > self.file.size:
            raise CorruptFileError(f"offset {offset} points past the end of the file", path=self.path, tensor=name)
        if t is None:
            self._unreadable[name] = (f"ggml type {type_id} is not one weightio knows (a newer llama.cpp type "
                                      "or a fork's); the file's metadata and other tensors are readable")
            return TensorInfo(np.dtype(np.float32), shape, start, 0, None, f"GGML_TYPE_{type_id}")
        return self._known_tensor(name, shape, t, start)

    def _known_tensor(self, name: str, shape: tuple[int, ...], t: GGMLType, start: int) -> TensorInfo:
        row = shape[-1] if shape else 1
        if row % t.block_size:
            raise CorruptFileError(f"rows of {row} elements are not whole {t.name} blocks of {t.block_size}",
                                   path=self.path, tensor=name)
        nbytes = math.prod(shape[:-1]) * t.row_bytes(row) if shape else t.type_size
        if start + nbytes > self.file.size:
            raise CorruptFileError(f"{t.name} data at {start}..{start + nbytes} runs past the end of the file "
                                   f"({self.file.size} bytes)", path=self.path, tensor=name)
        big = self.byteorder == ">"
        if t.quantized:
            return TensorInfo(np.dtype(">f4" if big else "<f4"), shape, start, nbytes, None, t.name)
        if big and t.name == "BF16":  # numpy has no big-endian bfloat16: decoded by weightio.quant
            return TensorInfo(t.dtype, shape, start, nbytes, None, "BF16")
        return TensorInfo(t.dtype.newbyteorder(">") if big else t.dtype, shape, start, nbytes)

    def _check_layout(self) -> None:
        """No two tensors overlap and nothing follows the last one's padded end."""
        extents = sorted((info.offset, info.offset + info.nbytes, name) for name, info in self.tensors.items()
                         if info.nbytes and name not in self._unreadable)
        end, previous = self.data_offset, None
        for start, stop, name in extents:
            if previous is not None and start < end:
                raise CorruptFileError(f"data at {start}..{stop} overlaps tensor {previous!r}", path=self.path,
                                       tensor=name)
            end, previous = max(end, stop), name
        if self._unreadable:
            return
        limit = end + (-end % self.alignment)
        if self.file.size > limit:
            raise CorruptFileError(f"{self.file.size - limit} bytes after the last tensor's data (which ends at "
                                   f"{limit}, padded) belong to no tensor", path=self.path)

    def buffer(self, name: str) -> np.ndarray:
        reason = self._unreadable.get(name)
        if reason is not None:
            raise UnsupportedDTypeError(reason, path=self.path, tensor=name)
        return self.file.data

    def siblings(self) -> list[str]:
        """The other parts of a split model (``-0000k-of-0000N.gguf`` with ``split.count`` = N)."""
        part = layout.split_part(os.path.basename(self.path))
        count = self.metadata.get("split.count")
        if part is None or not isinstance(count, int) or count < 2:
            return []
        stem, number, named_count = part
        if named_count != count or not 1 <= number <= count:
            raise CorruptFileError(f"is named part {number} of {named_count:05d} but split.count is {count}",
                                   path=self.path)
        if self.metadata.get("split.no", number - 1) != number - 1:
            raise CorruptFileError(f"is named part {number} but split.no is {self.metadata['split.no']} "
                                   "(counting from 0)", path=self.path)
        directory = os.path.dirname(self.path)
        return [os.path.join(directory, f) for k, f in enumerate(layout.split_parts(stem, count), 1) if k != number]


def value_types(checkpoint: Any) -> dict[str, str]:
    """The GGUF type of every metadata key of an open GGUF checkpoint (or reader), for `write`.

    Example:
        >>> with wio.open("model.gguf") as ckpt:                                   # doctest: +SKIP
        ...     write(ckpt, "copy.gguf", ckpt.metadata, value_types=value_types(ckpt))
    """
    types: dict[str, str] = {}
    for reader in getattr(checkpoint, "readers", [checkpoint]):
        for key, vtype in getattr(reader, "value_types", {}).items():
            types.setdefault(key, vtype)
    return types


def _walk_strings(buf: memoryview, pos: int, count: int, length: struct.Struct) -> tuple[array, int]:
    """Start offsets of `count` length-prefixed strings from `pos`, and the position after them.

    The loop is the one per-item cost of opening a GGUF file (a 150k-token vocabulary), so it
    does the minimum: a length that points past the file makes the next ``unpack_from`` fail
    (the buffer is the whole file), and the caller checks the final position.
    """
    starts = array("q")
    append, unpack, width = starts.append, length.unpack_from, length.size
    try:
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += width
            append(pos)
            pos += n
    except (struct.error, OverflowError):  # a length pointed past the file
        pos = len(buf) + 1
    return starts, pos


# ----------------------------------------------------------------------------- writer

_VERSION = 3
_LE = _layout("<", _VERSION)
_INT_RANGES = {  # value type -> (min, max)
    GGUFValueType.UINT8: (0, 2**8 - 1), GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1), GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1), GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1), GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)
_BY_NUMPY = {dtype.newbyteorder("="): vtype for vtype, dtype in _SCALAR_DTYPES.items()}
# numpy dtype of a tensor -> the plain ggml type it is stored as
_PLAIN_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64"}
_REQUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0")


def _string_bytes(text: str | bytes) -> bytes:
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    return _LE.count.pack(len(raw)) + raw


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
    head = _LE.u32.pack(etype) + _LE.count.pack(len(value))
    if etype in _SCALAR_DTYPES and isinstance(value, (np.ndarray, GGUFArray)) and (
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
    dtype = _SCALAR_DTYPES[etype]
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


def _stored_size(t: GGMLType, shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1]) * t.row_bytes(shape[-1]) if shape else t.type_size


def _target(name: str, shape: tuple[int, ...], floating: bool, types: Any) -> str | None:
    """The ggml type asked for tensor `name`, or None to keep its own (see `write`)."""
    if types is None:
        return None
    if isinstance(types, str):  # one type for every tensor it suits: floating, 2+ dims, whole blocks
        t = _convertible(types)
        return t.name if floating and len(shape) >= 2 and shape[-1] % t.block_size == 0 else None
    wanted = types.get(name)
    return None if wanted is None else _convertible(wanted).name


def _convertible(name: str) -> GGMLType:
    t = by_name(name)
    if t is None or t.name not in _REQUANTIZABLE:
        raise UnsupportedDTypeError(f"the GGUF writer converts tensors to {', '.join(_REQUANTIZABLE)}, not {name!r}")
    return t


def _plan(name: str, value: Any, types: Any, path: str) -> _Plan:
    """How tensor `name` is written: as given, block for block, or converted (see `write`)."""
    from ..quant import QuantizedTensor
    from .sources import tensor_sources

    if isinstance(value, QuantizedTensor):
        t = by_name(value.ggml_type)
        return _Plan(name, t, value.shape, _stored_size(t, value.shape), lambda: value.blocks)
    copied = _copied_blocks(name, value, types)
    if copied is not None:
        return copied
    src = tensor_sources({name: value}, path=path)[0]
    floating = src.dtype.kind == "f" or src.dtype.name == "bfloat16"
    wanted = _target(name, src.shape, floating, types)
    if wanted is None:
        plain = _PLAIN_TYPES.get(src.dtype.name)
        if plain is None:
            raise UnsupportedDTypeError(f"GGUF stores F32, F16, BF16, F64 and I8-I64 tensors (and ggml blocks), not "
                                        f"{src.dtype.name}; convert it first", path=path, tensor=name)
        return _Plan(name, by_name(plain), src.shape, src.nbytes, src.little_endian_bytes)
    return _converted(src, by_name(wanted), path)


def _copied_blocks(name: str, value: Any, types: Any) -> _Plan | None:
    """A quantized tensor of an open checkpoint, kept in its type: its stored blocks, as they are."""
    from ..view import TensorView

    if not isinstance(value, TensorView) or value.ggml_type is None or value.info.dtype.byteorder == ">":
        return None  # big-endian blocks are ambiguous: decoding them raises, with the reason
    t = by_name(value.ggml_type)
    if t is None or not t.quantized or t.removed is not None:
        return None
    if _target(name, value.shape, True, types) not in (None, t.name):
        return None
    return _Plan(name, t, value.shape, value.nbytes, value.raw)


def _converted(src: Any, t: GGMLType, path: str) -> _Plan:
    """A tensor converted to `t` while it is written (one bounded group of rows at a time)."""
    row = src.shape[-1] if src.shape else 1
    if row % t.block_size:
        raise UnsupportedDTypeError(f"rows of {row} elements are not whole {t.name} blocks of {t.block_size}",
                                    path=path, tensor=src.name)
    if src.dtype.kind not in "fiu" and src.dtype.name != "bfloat16":
        raise UnsupportedDTypeError(f"cannot convert {src.dtype.name} to {t.name}", path=path, tensor=src.name)

    def fetch() -> np.ndarray:
        from ..quant.quantize import quantize_rows

        return quantize_rows(src.array(), t.name)

    return _Plan(src.name, t, src.shape, _stored_size(t, src.shape), fetch)


def _writer_alignment(metadata: Mapping[str, Any], path: str) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 < value <= MAX_ALIGNMENT and not value & (value - 1)):
        raise FormatError(f"general.alignment must be a power of two up to {MAX_ALIGNMENT}, got {value!r}", path=path)
    return int(value)


def _check_types(types: Any, tensors: Mapping[str, Any], path: str) -> None:
    if types is None or isinstance(types, str):
        return
    if not isinstance(types, Mapping):
        raise FormatError(f"types must be a ggml type name or a mapping of tensor name -> type, got {types!r}",
                          path=path)
    unknown = [name for name in types if name not in tensors]
    if unknown:
        raise FormatError(f"types names tensors that are not written: {', '.join(map(repr, unknown[:5]))}", path=path)


def _header(kvs: list[bytes], plans: list[_Plan], alignment: int) -> bytes:
    """Everything before the data section, padding included."""
    parts = [MAGIC, _LE.u32.pack(_VERSION), _LE.count.pack(len(plans)), _LE.count.pack(len(kvs)), *kvs]
    offset = 0
    for plan in plans:
        ne = plan.shape[::-1]
        parts += [_string_bytes(plan.name), _LE.u32.pack(len(ne)), *(_LE.count.pack(d) for d in ne),
                  _LE.u32.pack(plan.ggml_type.id), _LE.u64.pack(offset)]
        offset += plan.nbytes + (-plan.nbytes % alignment)
    head = b"".join(parts)
    return head + bytes(-len(head) % alignment)


def write(
    tensors: Mapping[str, Any],
    path: str,
    metadata: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
    types: str | Mapping[str, str] | None = None,
    value_types: Mapping[str, str] | None = None,
) -> None:
    """Write a GGUF v3 file (little-endian), atomically, one tensor in memory at a time.

    Args:
        tensors: name -> numpy array, `TensorView`, torch tensor or `weightio.quant.QuantizedTensor`.
            float32/float16/bfloat16/float64/int8-int64 arrays are stored as F32/F16/BF16/F64/I8-I64;
            quantized views of a GGUF checkpoint are copied block for block; `QuantizedTensor`s
            (from `weightio.quant.quantize`) are stored as they are.
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
            not get the default type; ``value_types(ckpt)`` reproduces a GGUF file's own types.

    When any tensor is block-quantized and ``general.quantization_version`` is not given, it is
    added (UINT32 2), as llama.cpp requires. For the same keys, types and tensors, the bytes
    equal those ``gguf.GGUFWriter`` writes.

    Example:
        >>> wio.save({"w": w}, "x.gguf", {"general.architecture": "llama"})            # doctest: +SKIP
        >>> gguf.write(ckpt, "x-q8.gguf", ckpt.metadata, types="Q8_0")                 # doctest: +SKIP
    """
    from .._io import atomic_write

    if not isinstance(tensors, Mapping):
        raise FormatError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}", path=path)
    metadata = dict(metadata or {})
    alignment = _writer_alignment(metadata, path)
    _check_types(types, tensors, path)
    plans = [_plan(_tensor_name(name, path), value, types, path) for name, value in tensors.items()]
    if any(p.ggml_type.quantized for p in plans):
        metadata.setdefault("general.quantization_version", np.uint32(2))
    kvs = _metadata_bytes(metadata, dict(value_types or {}), path)
    with atomic_write(path, overwrite=overwrite) as out:
        out.write(_header(kvs, plans, alignment))
        for plan in plans:
            _write_tensor(out, plan, alignment, path)


def _write_tensor(out: Any, plan: _Plan, alignment: int, path: str) -> None:
    """One tensor's bytes and padding; its data is released when this returns (streaming)."""
    from .._io import write_all

    data = plan.fetch()
    size = data.nbytes if isinstance(data, np.ndarray) else len(data)
    if size != plan.nbytes:  # a source changed under us (or a bug): never write a wrong file
        raise FormatError(f"produced {size} bytes, {plan.nbytes} expected", path=path, tensor=plan.name)
    write_all(out, data)
    out.write(bytes(-plan.nbytes % alignment))


def _tensor_name(name: Any, path: str) -> str:
    if not isinstance(name, str) or not name:
        raise FormatError(f"tensor names must be non-empty str, got {name!r}", path=path)
    return name
