"""GGUF (llama.cpp's model format), versions 1-3, little- and big-endian: the reader.

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

The writer is `weightio.formats.gguf_writer`: GGUF v3, little-endian, the same bytes
``gguf.GGUFWriter`` writes for the same keys, values and tensors.
"""

from __future__ import annotations

import math
import os
import posixpath
import struct
from array import array
from typing import Any, Literal, cast

import numpy as np

from .. import layout
from .._failures import is_url
from .._remote import BLOCK
from ..errors import CorruptFileError, FormatError, UnsupportedDTypeError
from ..limits import DEFAULTS, exceeded
from ..quant.types import GGMLType, by_id
from .base import Reader, TensorInfo, is_remote
from .gguf_arrays import (
    EAGER_ARRAY_ITEMS,
    GGUFArray,
    decode_value_string,
    fetched_to,
    skip_strings,
    walk_fetching,
    walk_strings,
)
from .gguf_fields import SCALAR_DTYPES, Fields, GGUFValueType, fields_for

__all__ = ["GGUFReader", "GGUFArray", "GGUFValueType", "value_types", "DEFAULT_ALIGNMENT"]

MAGIC = b"GGUF"
MAGIC_BIG_ENDIAN = b"FUGG"  # proposed in llama.cpp#3957 for big-endian files; never written here
VERSIONS = (1, 2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # no real file uses more; bounds the padding a file can claim
MAX_KEY_LENGTH = 65535  # the spec's limit
MAX_ARRAY_DEPTH = DEFAULTS.array_depth  # nested arrays are legal but rare; llama.cpp rejects them outright
MAX_DIMS = 4  # GGML_MAX_DIMS
# numpy refuses a shape whose non-zero dims times the itemsize (8 at most here) reach 2^63 bytes,
# even when another dim is 0 and the tensor holds nothing: checked at open, not at numpy().
MAX_ELEMENTS = 1 << 60
VOCABULARY = "tokenizer.ggml.tokens"
# tokenizer.ggml.model values whose vocabularies llama.cpp's converters follow with FLOAT32 scores
# (SentencePiece and Unigram); every model's is followed by INT32 token types
_SCORED_VOCABULARIES = ("llama", "t5")
_ARRAY_TYPES = {t: f"ARRAY[{t.name}]" for t in GGUFValueType}  # one string per type, not one per key


# ----------------------------------------------------------------------------- the reader


class _Cursor:
    """A position in the file with bounds-checked reads of GGUF fields.

    Fields are read from ``buf``, a memoryview of ``file.data``, below ``hi``: for a local file the
    file's end (or the header limit), so one comparison per field checks both; for a remote one
    (`weightio._remote.RemoteFile`, whose ``data`` holds only the bytes fetched) the end of what
    has been fetched, first the 64 KiB block the magic came in. A field past ``hi`` that the file
    and the limit allow makes `fetch` get more in one request: what the field needs, the rest of a
    string array estimated from its count (`walk_fetching`), and the least the metadata keys and
    tensor infos still to come will take (`tail`), so a header with a large vocabulary arrives in a
    few round trips and the fetches end within a block of the data section.
    """

    def __init__(self, reader: GGUFReader, layout: Fields, pos: int) -> None:
        file = reader.file
        self.reader, self.layout, self.pos = reader, layout, pos
        self.buf = memoryview(file.data)  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
        self.size = file.size
        self.limit = reader.limits.header_bytes  # no header field may end past this offset
        self.bound = min(self.size, self.limit)
        self.remote = is_remote(file)
        self.hi = self.bound
        if self.remote:  # the block read() fetched for the magic: in the image at no cost
            file.ensure(0, min(self.size, BLOCK), "the GGUF header")
            self.hi = min(self.bound, fetched_to(file, min(self.size, BLOCK)))
        self.kvs_left = self.tensors_left = 0  # what follows, for the size of the next fetch
        self.n_tensors = 0
        self.infos_start: int | None = None

    def fail(self, message: str, tensor: str | None = None) -> CorruptFileError:
        return CorruptFileError(message, path=self.reader.path, tensor=tensor)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        """Make `n` bytes at the cursor readable: within the file and the limit, and fetched."""
        if self.pos + n > self.hi:
            self.room(n, what)
            self.fetch(self.pos + n, what)  # a remote file's bytes not fetched yet (a local hi is the bound)

    def room(self, n: int, what: str) -> None:
        """Refuse `n` bytes at the cursor that the file or the limit cannot hold (nothing is fetched)."""
        if n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos} but only {self.size - self.pos} remain")
        if self.pos + n > self.limit:
            raise exceeded(f"the header length (reading {what})", self.pos + n, "header_bytes", self.limit,
                           path=self.reader.path)

    def fetch(self, end: int, what: str) -> None:
        """Fetch (remote files) up to `end` and the least of what follows (`tail`), within the bound."""
        start = min(self.pos, self.hi)
        target = min(self.bound, end + self.tail())
        self.reader.file.ensure(start, target - start, what)
        self.hi = min(self.bound, fetched_to(self.reader.file, target))

    def tail(self) -> int:
        """Bytes the keys and tensor infos not read yet take, estimated: each key a typical short one's
        (a scalar under a 30-byte name), each tensor info the mean of those read, else a typical one's
        (a 2-d tensor with a 20-byte name)."""
        width = self.layout.counts.size
        done = self.n_tensors - self.tensors_left
        per_info = (self.pos - self.infos_start) / done if self.infos_start is not None and done else 3 * width + 36
        return self.kvs_left * (width + 40) + int(self.tensors_left * per_info)

    def walk(self, count: int, what: str, keep: bool, ahead: int = 0) -> tuple[array | None, int]:
        """The start offsets of `count` strings from the cursor (when `keep`) and the position after
        them (past the file or the bound when they cannot fit); fetched as walked for a remote file,
        with `ahead` bytes more than `tail` expected after them."""
        if not self.remote:
            if keep:
                return walk_strings(self.buf, self.pos, count, self.layout.counts)
            return None, skip_strings(self.buf, self.pos, count, self.layout.counts)
        starts = array("q") if keep else None
        pos, hi = walk_fetching(self.reader.file, self.pos, count, self.layout.counts, self.hi, self.bound,
                                tail=self.tail() + ahead, starts=starts, what=what)
        self.hi = min(self.bound, hi)
        return starts, pos

    def take(self, fmt: struct.Struct, what: str) -> int:
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def u32(self, what: str) -> int:
        return self.take(self.layout.u32, what)

    def count(self, what: str) -> int:
        return self.take(self.layout.counts, what)

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
        if self.layout.counts.size == 4:
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
        cur.kvs_left, cur.tensors_left = n_kv, n_tensors
        for _ in range(n_kv):
            self._read_kv(cur)
            cur.kvs_left -= 1
        self.alignment = self._alignment()
        cur.infos_start = cur.pos
        infos = []
        for _ in range(n_tensors):
            infos.append(self._read_tensor_info(cur))
            cur.tensors_left -= 1
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
        order: Literal["<", ">"] = (
            ">" if magic == MAGIC_BIG_ENDIAN or int.from_bytes(raw_version, "little") & 0xFFFF == 0 else "<")
        self.byteorder = order
        self.version = int.from_bytes(raw_version, "big" if order == ">" else "little")
        if self.version not in VERSIONS:
            raise FormatError(f"GGUF version {self.version} is not supported (1, 2 and 3 are)", path=self.path)
        cur = _Cursor(self, fields_for(order, self.version), 8)
        n_tensors, n_kv = cur.count("tensor_count"), cur.count("metadata_kv_count")
        cur.n_tensors = n_tensors
        # Beyond its length prefix a kv takes at least 1 (key) + 4 (type) + 1 (value) bytes, a tensor
        # info 1 (name) + 4 (n_dims) + 4 (type) + 8 (offset): a count the rest of the file cannot
        # hold is refused before anything loops over it.
        width = cur.layout.counts.size
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
            return decode_value_string(cur.string(f"the value of {key!r}"), self.version == 1), "STRING"
        if vtype == GGUFValueType.ARRAY:
            return self._read_array(cur, key, depth)
        value = cur.take(cur.layout.scalars[vtype], f"the value of {key!r}")
        if vtype == GGUFValueType.BOOL:
            if value > 1:
                raise cur.fail(f"BOOL metadata {key!r} holds {value}, not 0 or 1")
            value = bool(value)
        return value, vtype.name

    def _read_array(self, cur: _Cursor, key: str, depth: int) -> tuple[GGUFArray, str]:
        etype, count = self._array_head(cur, key, depth)
        if etype == GGUFValueType.STRING:
            return self._string_array(cur, key, count), "ARRAY[STRING]"
        if etype == GGUFValueType.ARRAY:
            return self._nested_array(cur, key, count, depth)
        start = self._skip_numbers(cur, key, etype, count)
        dtype = SCALAR_DTYPES[etype].newbyteorder(cur.layout.order)
        arr = GGUFArray.numbers(etype, self.file, count, dtype, start)
        if count <= EAGER_ARRAY_ITEMS:
            arr._decoded(cur.buf)
        return arr, _ARRAY_TYPES[etype]

    def _array_head(self, cur: _Cursor, key: str, depth: int) -> tuple[GGUFValueType, int]:
        if depth >= self.limits.array_depth:
            raise cur.fail(f"metadata {key!r} nests arrays more than {self.limits.array_depth} deep "
                           "(limits.array_depth)")
        etype = self._value_type(cur, cur.u32(f"the element type of {key!r}"), key)
        return etype, cur.count(f"the length of array {key!r}")

    def _skip_numbers(self, cur: _Cursor, key: str, etype: GGUFValueType, count: int) -> int:
        """Check `count` fixed-size values (BOOLs 0 or 1) and move past them; where they start."""
        itemsize = SCALAR_DTYPES[etype].itemsize
        cur.need(count * itemsize, f"array {key!r} of {count} {etype.name}")
        if etype == GGUFValueType.BOOL and count:
            values = np.frombuffer(self.file.data, np.uint8, count, cur.pos)
            if values.max() > 1:
                raise cur.fail(f"BOOL array {key!r} holds a value other than 0 or 1")
        start = cur.pos
        cur.pos += count * itemsize
        return start

    def _string_array(self, cur: _Cursor, key: str, count: int) -> GGUFArray:
        width = cur.layout.counts.size
        cur.room(count * width, f"array {key!r} of {count} strings")  # O(1) refusal of absurd counts
        ahead = _after_vocabulary(self.metadata, count) if key == VOCABULARY else 0
        starts, pos = cur.walk(count, f"array {key!r} of {count} strings", keep=True, ahead=ahead)
        self._end_strings(cur, key, count, pos)
        arr = GGUFArray.strings(self.file, cast(array, starts), pos, width, strip_nul=self.version == 1)  # keep=True
        if count <= EAGER_ARRAY_ITEMS:
            arr._decoded(cur.buf)
        return arr

    def _end_strings(self, cur: _Cursor, key: str, count: int, pos: int) -> None:
        if pos > cur.size:
            raise cur.fail(f"array {key!r} of {count} strings runs past the end of the file")
        cur.need(pos - cur.pos, f"array {key!r} of {count} strings")  # the header limit, now the length is known
        cur.pos = pos

    def _nested_array(self, cur: _Cursor, key: str, count: int, depth: int) -> tuple[GGUFArray, str]:
        """An array of arrays: every item validated now, none built (see `weightio.formats.gguf_arrays`)."""
        start = cur.pos
        inner = self._skip_arrays(cur, key, count, depth + 1)
        arr = GGUFArray.nested(self.file, count, start, cur.pos, cur.layout, self.version == 1)
        return arr, f"ARRAY[{inner or 'ARRAY'}]"

    def _skip_arrays(self, cur: _Cursor, key: str, count: int, depth: int) -> str | None:
        """Validate `count` arrays from the cursor and move past them, allocating nothing per item;
        their common type name (``ARRAY[INT32]``), ``ARRAY`` when they differ, None when there are none."""
        width = cur.layout.counts.size
        cur.need(count * (4 + width), f"array {key!r} of {count} arrays")
        common = None
        for _ in range(count):  # each item: its own element type, count and elements
            etype, n = self._array_head(cur, key, depth)
            if etype == GGUFValueType.STRING:
                cur.room(n * width, f"array {key!r} of {n} strings")
                self._end_strings(cur, key, n, cur.walk(n, f"array {key!r} of {n} strings", keep=False)[1])
                name = _ARRAY_TYPES[etype]
            elif etype == GGUFValueType.ARRAY:
                name = f"ARRAY[{self._skip_arrays(cur, key, n, depth + 1) or 'ARRAY'}]"
            else:
                self._skip_numbers(cur, key, etype, n)
                name = _ARRAY_TYPES[etype]
            common = name if common in (None, name) else "ARRAY"
        return common

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
        if t.dtype is None:  # quantized (what `t.quantized` says, which mypy cannot narrow `t.dtype` by)
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
        part = layout.split_part((posixpath if is_url(self.path) else os.path).basename(self.path))
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
        paths = posixpath if is_url(self.path) else os.path  # a remote part's siblings are URLs beside it
        directory = paths.dirname(self.path)
        return [paths.join(directory, f) for k, f in enumerate(layout.split_parts(stem, count), 1) if k != number]


def _after_vocabulary(metadata: dict[str, Any], count: int) -> int:
    """Bytes of the arrays llama.cpp's converters write right after a vocabulary of `count` tokens:
    one INT32 type per token, and one FLOAT32 score per token for SentencePiece-like models (a
    remote file fetches them with the vocabulary, saving one round trip each)."""
    return (8 if metadata.get("tokenizer.ggml.model") in _SCORED_VOCABULARIES else 4) * count


def value_types(checkpoint: Any) -> dict[str, str]:
    """The GGUF type of every metadata key of an open GGUF checkpoint (or reader), for the writer.

    Example:
        >>> with wio.open("model.gguf") as ckpt:                                   # doctest: +SKIP
        ...     wio.save(ckpt, "copy.gguf", ckpt.metadata, value_types=value_types(ckpt))
    """
    types: dict[str, str] = {}
    for reader in getattr(checkpoint, "readers", [checkpoint]):
        for key, vtype in getattr(reader, "value_types", {}).items():
            types.setdefault(key, vtype)
    return types

