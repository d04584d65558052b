"""safetensors: reader on one read-only mapping, and a streaming writer.

The format (https://github.com/huggingface/safetensors, ``safetensors/src/tensor.rs``)::

    u64 little-endian   N, the header length in bytes (at most 100 000 000)
    N bytes             UTF-8 JSON object:
                          "__metadata__": {str: str}             (optional)
                          "<name>": {"dtype": "F32",             (see weightio.dtypes)
                                     "shape": [int, ...],        (non-negative; [] is a scalar)
                                     "data_offsets": [begin, end]}  (relative to the data section)
    data section        the tensors' bytes, little-endian, C order, back to back

Rules enforced here, each a `CorruptFileError` (unknown dtype codes: `UnsupportedDTypeError`):

* the header length is at most 100 MB (``weightio.limits`` ``header_bytes``) and lies inside
  the file; at most ``tensors`` tensors, names and keys within ``name_bytes``;
* names and metadata are Unicode text (a ``\\ud800`` escape spells a lone surrogate: refused);
* the header is UTF-8, one JSON object, no duplicate keys at any level, no NaN/Infinity
  literals (the reference parser accepts duplicates, last wins: a parser differential);
* ``__metadata__`` maps str to str;
* names are non-empty and contain no NUL; dtype is a known code; shape is a list of at most 64
  non-negative integers (JSON booleans and floats are not integers); ``data_offsets`` is two
  non-negative integers with ``end >= begin``;
* ``end - begin == prod(shape) * bits / 8``, and packed sub-byte types end on a whole byte;
* a shape numpy can hold: its non-zero dimensions times the itemsize below 2^63 bytes (which
  only an empty tensor, one dimension 0, can break: the others are bounded by the file);
* sorted by offset, the tensors cover the data section exactly: the first starts at 0, each
  starts where the previous ended (no holes, no overlaps), the last ends at the end of the file
  (no trailing bytes, so no polyglot files).

Unknown per-tensor fields are ignored with a `WeightioWarning`, as the reference ignores them.

Writers (ours and the reference) pad the header with spaces to a multiple of 8 and order the
tensors by descending dtype alignment, then by name, so every tensor starts aligned to its
itemsize. `write` produces byte-for-byte what `safetensors.numpy.save_file` produces for the same
tensors (metadata keys aside, which the reference orders by a hash).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import struct
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, cast

from .._gc import collector_paused
from .._io import MappedFile
from .._json import decode_utf8, fast_json, parse_json_object
from .._native import speedups
from .._outputs import atomic_write, write_all
from ..dtypes import TABLE, DType, by_numpy, by_safetensors
from ..errors import CorruptFileError, FormatError, UnsupportedDTypeError, UsageError, WeightioWarning
from ..limits import Limits, exceeded
from ..limits import current as current_limits
from ..records import TensorSource, new_info
from ..text import describe, dims, number
from .base import MAX_NDIM, Reader, TensorInfo, stored_name
from .sniff import SAFETENSORS_VOUCH

# The header's fast path in C (weightio/_speedups.c: `weightio._native`), else None; and a whole
# plain file's, from the first bytes read at open (`read_plain`).
_c_header = speedups.safetensors_header if speedups is not None else None
_c_plain = speedups.plain_safetensors if speedups is not None else None

__all__ = ["SafetensorsReader", "write", "MAX_HEADER_SIZE"]

MAX_HEADER_SIZE = 100_000_000  # the reference reader's limit (HeaderTooLarge)
_LENGTH = struct.Struct("<Q")
_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
# code -> (row, stored numpy dtype): safetensors data is little-endian whatever the host
_CODES = {row.safetensors: (row, row.numpy.newbyteorder("<") if row.numpy.itemsize > 1 else row.numpy)
          for row in TABLE}
_PLAIN = {code: (row.bits, dtype) for code, (row, dtype) in _CODES.items()}

# The reference writer's dtype enum order, lowest alignment first; it sorts descending.
_WRITE_RANK = {
    code: rank
    for rank, code in enumerate(
        "BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ "
        "I16 U16 F16 BF16 I32 U32 F32 C64 F64 I64 U64".split()
    )
}


def read_plain(file: MappedFile) -> SafetensorsReader | None:
    """The reader of `file` (a local file just opened, its first bytes still held) in one C call,
    when those bytes hold the whole plain header of a safetensors file that `sniff` calls
    safetensors (`_speedups.plain_safetensors`) and its tensors cover the data section (`_covering`,
    as `_read_header` checks it); None for any other, which the caller sniffs and opens the usual
    way. A 191-shard model's shards are each such a file: sniffing and reading each the usual way
    was two thirds of its open."""
    head = file.head
    if _c_plain is None or head is None:
        return None
    limits = current_limits()
    found = _c_plain(head, file.size, *SAFETENSORS_VOUCH, _PLAIN, TensorInfo, MAX_NDIM,
                     min(limits.tensors, sys.maxsize), min(limits.name_bytes, sys.maxsize),
                     min(limits.header_bytes, sys.maxsize))
    if found is None:
        return None
    tensors, metadata, ordered, expected = found
    n = int.from_bytes(head[:8], "little")  # (the header's length, which the C call checked)
    covering = _covering(tensors, ordered, expected, 8 + n, file.size - 8 - n)
    return None if covering is None else SafetensorsReader._from_header(file, covering, metadata, limits)


class SafetensorsReader(Reader):
    """A validated safetensors file. See the module docstring for the rules."""

    format = "safetensors"

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self._validate(self._read_header)

    @classmethod
    def _from_header(cls, file: MappedFile, tensors: dict[str, TensorInfo], metadata: dict[str, str],
                     limits: Limits) -> SafetensorsReader:
        """What ``cls(file)`` makes, from a header read and checked already (`read_plain`: `tensors`
        and `metadata` as `_read_header` leaves them, under `limits`), without reading it again."""
        reader = cls.__new__(cls)
        reader.file, reader.path, reader.metadata, reader.tensors, reader.limits = (file, file.path, metadata, tensors,
                                                                                   limits)
        file.release_head()
        return reader

    def _fail(self, message: str, tensor: str | None = None) -> CorruptFileError:
        return CorruptFileError(message, path=self.path, tensor=tensor)

    def _read_header(self) -> None:
        size = self.file.size
        if size < 8:
            raise self._fail(f"file is {size} bytes; a safetensors file starts with an 8-byte header length")
        n = int.from_bytes(self.file.read(0, 8, "the header length"), "little")
        if n > self.limits.header_bytes:
            raise exceeded("header length", n, "header_bytes", self.limits.header_bytes, path=self.path)
        if n > size - 8:
            raise self._fail(f"header length {n} runs past the end of the file ({size} bytes)")
        raw = self.file.read(8, n, "the header")
        if _c_header is not None:  # (the C path makes nothing the collector tracks per tensor: no pause needed)
            limits = self.limits
            found = _c_header(raw, 8 + n, _PLAIN, TensorInfo, MAX_NDIM, min(limits.tensors, sys.maxsize),
                              min(limits.name_bytes, sys.maxsize))
            if found is not None:
                tensors, metadata, ordered, expected = found
                tensors = _covering(tensors, ordered, expected, 8 + n, size - 8 - n)
                if tensors is not None:
                    self.metadata, self.tensors = metadata, tensors
                    return
        with collector_paused():  # a large header is a few hundred thousand containers, none in a cycle
            text = decode_utf8(raw, path=self.path, what="header")
            tensors = self._plain(text, 8 + n, size - 8 - n)
            if tensors is None:
                entries = self._strict_entries(text, 8 + n)
                entries.sort()
                self._check_coverage(entries, size - 8 - n)
                tensors = {name: info for _, _, name, info in entries}
        self.tensors = tensors

    def _plain(self, text: str, data_start: int, data_size: int) -> dict[str, TensorInfo] | None:
        """Every tensor, in file order, when the header is plain and valid; else None.

        The fast path parses without the duplicate-key hook and accepts the header only when a
        handful of C-level checks pass: a large header (`weightio._json.fast_json`) is decoded by
        msgspec against the format's schema (`_typed`), any other by the standard parser, its
        entries checked by `_plain_entries`. Anything unusual (a float, a ``\\u`` escape, an extra
        field, an invalid entry, a hole) sends the caller to `_strict_entries`, which re-parses
        strictly and validates entry by entry with precise messages. All paths accept exactly the
        same headers, and refuse none themselves: every refusal (invalid JSON, a limit) is the
        exact path's, so a header with two faults gets the same message whatever its size.
        """
        if "\\u" in text:
            return None
        msgspec = fast_json(text)
        if msgspec is not None:
            return self._typed(msgspec, text, data_start, data_size)
        try:
            header = parse_json_object(text, path=self.path, what="header", check_duplicates=False)
        except CorruptFileError:
            return None
        keys = list(header)
        if self._over_limits(header, header.get("__metadata__")) is not None:
            return None
        metadata = header.pop("__metadata__", {})
        if type(metadata) is not dict or not all(type(v) is str for v in metadata.values()):
            return None  # (the exact path says what is wrong, or that the header nests too deeply)
        self.metadata = metadata
        tensors = _plain_entries(header, data_start, data_size)
        return tensors if tensors is not None and _no_duplicate_keys(text, keys, self.metadata) else None

    def _typed(self, msgspec: Any, text: str, data_start: int, data_size: int) -> dict[str, TensorInfo] | None:
        """`_plain` of a header msgspec decodes: its C decoder checks each entry's field types and
        signs as it parses (`_schema`), so the loop (`_typed_entries`) only checks sizes and order."""
        entries, strings, metadata_only = _schema(msgspec)
        try:
            header = entries.decode(text)
            metadata = _metadata(text, strings, metadata_only) if "__metadata__" in header else {}
        except (msgspec.DecodeError, RecursionError):  # (a ValidationError is a DecodeError)
            return None
        keys = list(header)
        if self._over_limits(header, metadata) is not None:
            return None
        header.pop("__metadata__", None)
        self.metadata = metadata = metadata if metadata is not None else {}
        tensors = _typed_entries(header, data_start, data_size)
        return tensors if tensors is not None and _no_duplicate_keys(text, keys, metadata) else None

    def _strict_entries(self, text: str, data_start: int) -> list[tuple[int, int, str, TensorInfo]]:
        header = parse_json_object(text, path=self.path, what="header")
        error = self._over_limits(header, header.get("__metadata__"))
        if error is not None:
            raise error
        _check_unicode(header, self._fail)
        self.metadata = self._read_metadata(header.pop("__metadata__", None))
        return [self._slow_entry(name, entry, data_start) for name, entry in header.items()]

    def _over_limits(self, header: dict[str, Any], metadata: Any) -> CorruptFileError | None:
        """The error for a tensor count or a name length beyond `limits`, else None (names measured
        exactly only when one may be long); `metadata`: the header's ``__metadata__`` value, whatever it is."""
        count = len(header) - ("__metadata__" in header)
        if count > self.limits.tensors:
            return exceeded("tensor count", count, "tensors", self.limits.tensors, path=self.path, unit="")
        limit = self.limits.name_bytes
        keys = metadata if isinstance(metadata, dict) else {}
        if max(max(map(len, header), default=0), max(map(len, keys), default=0)) * 4 <= limit:
            return None  # UTF-8 takes at most 4 bytes a character: no name can be too long
        for name in (*header, *keys):
            size = len(name.encode("utf-8", "surrogatepass"))
            if size > limit:
                return exceeded(f"the length of name {name[:20]!r}…:", size, "name_bytes", limit, path=self.path)
        return None

    def _slow_entry(self, name: str, entry: Any, data_start: int) -> tuple[int, int, str, TensorInfo]:
        begin, end, row, shape = self._read_entry(name, entry)
        return begin, end, name, TensorInfo(_CODES[row.safetensors][1], shape, data_start + begin, end - begin)

    def _read_metadata(self, raw: Any) -> dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self._fail(f"__metadata__ must be an object of strings, found {type(raw).__name__}")
        for key, value in raw.items():
            if not isinstance(value, str):
                raise self._fail(f"__metadata__[{key!r}] must be a string, found {type(value).__name__} "
                                 f"{describe(value)}")
        return raw

    def _read_entry(self, name: str, entry: Any) -> tuple[int, int, DType, tuple[int, ...]]:
        """Validate one header entry; each rule has its own message."""
        if not name or "\x00" in name:
            raise self._fail(f"invalid tensor name {name!r} (empty or containing NUL)")
        if not isinstance(entry, dict):
            raise self._fail(f"entry must be an object, found {type(entry).__name__}", name)
        missing = _FIELDS - entry.keys()
        if missing:
            raise self._fail(f"entry lacks {', '.join(sorted(missing))}", name)
        if len(entry) > len(_FIELDS):
            extra = ", ".join(sorted(entry.keys() - _FIELDS))
            warnings.warn(f"{self.path}: tensor {name!r}: ignoring unknown fields {extra}", WeightioWarning, 3)
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(code, str):
            raise self._fail(f"dtype must be a string, found {describe(code)}", name)
        try:
            row = by_safetensors(code)
        except UnsupportedDTypeError as e:
            raise UnsupportedDTypeError(e.message, path=self.path, tensor=name) from None
        if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_count(d) for d in shape):
            raise self._fail(f"shape must be a list of at most {MAX_NDIM} non-negative integers, found "
                             f"{describe(shape)}", name)
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
            raise self._fail(f"data_offsets must be two non-negative integers, found {describe(offsets)}", name)
        begin, end = offsets
        if end < begin:
            raise self._fail(f"data_offsets end {number(end)} is before begin {number(begin)}", name)
        bits = math.prod(shape) * row.bits
        if not bits and not _numpy_can_hold(shape, row.numpy.itemsize):
            raise self._fail(f"shape {dims(shape)} is too large for numpy (the non-zero dimensions times the itemsize "
                             "reach 2^63 bytes), though it holds no elements", name)
        if bits % 8:
            raise self._fail(f"{code} shape {dims(shape)} is {number(bits)} bits, not a whole number of bytes", name)
        if end - begin != bits // 8:
            raise self._fail(
                f"data_offsets [{number(begin)}, {number(end)}] span {number(end - begin)} bytes but {code} shape "
                f"{dims(shape)} needs {number(bits // 8)}", name)
        return begin, end, row, tuple(shape)

    def _check_coverage(self, entries: list[tuple[int, int, str, TensorInfo]], data_size: int) -> None:
        expected, previous = 0, None
        for begin, end, name, _ in entries:
            if begin != expected:
                where = f"after {previous!r}" if previous else "at the start of the data section"
                kind = ("overlaps the tensor before it" if begin < expected
                        else f"leaves a hole of {number(begin - expected)} bytes")
                raise self._fail(f"data_offsets begin {number(begin)} {kind} (expected {number(expected)}, {where})",
                                 name)
            expected, previous = end, name
        if expected != data_size:
            if expected > data_size:
                raise self._fail(f"tensors need {number(expected)} data bytes but the file holds {data_size} "
                                 "(truncated?)")
            raise self._fail(f"{data_size - expected} bytes after the last tensor belong to no tensor")


def _plain_entries(header: dict[str, Any], data_start: int, data_size: int) -> dict[str, TensorInfo] | None:
    """name -> TensorInfo in file order when every entry passes the quick checks and the tensors
    cover the data section exactly, else None.

    The caller guarantees that the text had no ``\\u`` escape (so no name holds a NUL: JSON
    strings hold no raw control character). ``min(shape) >= 0`` proves a shape holds
    non-negative numbers or JSON booleans (any other element type makes the comparison raise);
    an int product proves no number is a float; booleans equal 0 or 1, so only shapes holding
    a 0 or 1 need their element types checked. Entries come in data order (as every writer lays
    them out) or are sorted once; an empty tensor anywhere sends the file to the exact path,
    which orders ties by name. These are the rules of `_read_entry` and `_check_coverage`,
    minus the messages; a None sends the caller to them.
    """
    tensors: dict[str, TensorInfo] = {}
    codes, prod, new = _PLAIN, math.prod, new_info
    expected, ordered = 0, True
    try:
        for name, entry in header.items():
            code, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            bits, dtype = codes[code]
            if not (len(entry) == 3 and name and type(shape) is list and len(shape) <= MAX_NDIM
                    and (not shape or min(shape) >= 0)
                    and not ((1 in shape or 0 in shape) and bool in map(type, shape))
                    and type(begin) is int and type(end) is int and 0 <= begin < end
                    and type(count := prod(shape)) is int and count * bits == (end - begin) << 3):
                return None
            if begin != expected:
                ordered = False
            expected = end
            tensors[name] = new((dtype, tuple(shape), data_start + begin, end - begin, None, None))
    except (KeyError, TypeError, ValueError):
        return None
    return _covering(tensors, ordered, expected, data_start, data_size)


def _typed_entries(header: dict[str, Any], data_start: int, data_size: int) -> dict[str, TensorInfo] | None:
    """`_plain_entries` of entries msgspec decoded against `_schema`: each field is None (absent) or
    of the type and sign the format says (a shape a tuple of at most `MAX_NDIM` non-negative ints,
    offsets two non-negative ints), so only the codes, the sizes and the order are left to check.
    The caller guarantees that the text had no ``\\u`` escape."""
    if "" in header:
        return None
    tensors: dict[str, TensorInfo] = {}
    codes, prod, new = _PLAIN, math.prod, new_info
    expected, ordered = 0, True
    try:
        for name, entry in header.items():
            bits, dtype = codes[entry.dtype]  # (None, absent: KeyError)
            shape, (begin, end) = entry.shape, entry.data_offsets  # (absent: TypeError)
            if not (begin < end and prod(shape) * bits == (end - begin) << 3):
                return None
            if begin != expected:
                ordered = False
            expected = end
            tensors[name] = new((dtype, shape, data_start + begin, end - begin, None, None))
    except (KeyError, TypeError):
        return None
    return _covering(tensors, ordered, expected, data_start, data_size)


def _covering(tensors: dict[str, TensorInfo], ordered: bool, expected: int, data_start: int,
              data_size: int) -> dict[str, TensorInfo] | None:
    """`tensors` in data order when they cover the data section exactly, else None (the entry
    loops' last step: `ordered` when each began where the one before ended, the last at `expected`)."""
    if ordered:
        return tensors if expected == data_size else None
    items = sorted(tensors.items(), key=lambda item: item[1].offset)
    expected = data_start
    for _, info in items:
        if info.offset != expected:
            return None
        expected += info.nbytes
    return dict(items) if expected == data_start + data_size else None


_SCHEMA: Any = None  # msgspec decoders of a header: its entries, a metadata object, the whole header's metadata


def _schema(msgspec: Any) -> tuple[Any, Any, Any]:
    """msgspec decoders (made once) of: the header as name -> entry (each field None when absent, the
    others ignored: an extra field changes the ':' count, which `_no_duplicate_keys` then refuses;
    ``__metadata__`` decodes as an entry of Nones unless it has such fields of other types, and the
    decode then fails); a metadata object (str -> str); the header's ``__metadata__`` alone."""
    global _SCHEMA
    if _SCHEMA is None:
        count = Annotated[int, msgspec.Meta(ge=0)]
        shape = Annotated[tuple[count, ...], msgspec.Meta(max_length=MAX_NDIM)]
        entry = msgspec.defstruct("Entry", [("dtype", str | None, None), ("shape", shape | None, None),
                                            ("data_offsets", tuple[count, count] | None, None)], gc=False)
        metadata = dict[str, str] | None
        field = msgspec.field(default=None, name="__metadata__")
        whole = msgspec.defstruct("Metadata", [("metadata", metadata, field)], gc=False)
        # (the ignore: `entry` is a class made at run time, which mypy cannot take as a type argument)
        _SCHEMA = (msgspec.json.Decoder(dict[str, entry]), msgspec.json.Decoder(metadata), msgspec.json.Decoder(whole))  # type: ignore[valid-type]
    return _SCHEMA


_LEADING_METADATA = '{"__metadata__":{'


def _metadata(text: str, strings: Any, whole: Any) -> dict[str, str] | None:
    """The header's ``__metadata__`` (None for a JSON null), decoded by msgspec.

    Writers put it first: then the object ends at the first ``}`` after it (its values are
    strings, and a ``}`` inside a string would leave that string open, which no decoder accepts),
    so only that slice is decoded; else the whole text is decoded again for it alone. A header
    that has the key twice is refused by `_no_duplicate_keys`, whichever one is read here."""
    if text.startswith(_LEADING_METADATA):
        end = text.find("}", len(_LEADING_METADATA))
        if end > 0:
            with contextlib.suppress(ValueError):  # (msgspec's DecodeError is a ValueError)
                return strings.decode(text[len(_LEADING_METADATA) - 1 : end + 1])
    return whole.decode(text).metadata


def _no_duplicate_keys(text: str, keys: list[str], metadata: dict[str, str]) -> bool:
    """True when the header, parsed last-key-wins, provably had no duplicate key.

    Outside string tokens, JSON has exactly one ':' per object member, so the header text's
    ':' count equals (members written) + (':' inside strings). Parsing keeps every member and
    every string unless a key repeats, so when each entry has been validated as exactly
    {dtype, shape, data_offsets} with plain values, the text's count must equal (members kept) +
    (':' in the strings kept). A repeated key drops a member, so the counts differ. ``\\u``
    escapes could spell a ':' the text does not contain; such headers are not decided here.
    This saves the per-object hook that costs a third of the parse on large headers. Where the
    text has exactly one ':' per member kept, no string can hold one and no member was dropped:
    the strings need not be counted (joining 100k names costs more than the rest of the check).
    """
    if "\\u" in text:
        return False
    members = len(keys) + 3 * (len(keys) - ("__metadata__" in keys)) + len(metadata)
    colons = text.count(":")
    if colons == members:
        return True
    in_strings = "".join(keys).count(":") + sum(k.count(":") + v.count(":") for k, v in metadata.items())
    return colons == members + in_strings


def _numpy_can_hold(shape: list[int], itemsize: int) -> bool:
    """numpy refuses a shape whose non-zero dimensions times the itemsize reach 2^63 bytes, even when
    another dimension is 0. Only empty tensors need the check: the others are bounded by the file."""
    return math.prod(d for d in shape if d) * itemsize < 1 << 63


def _check_unicode(header: dict[str, Any], fail: Any) -> None:
    """Names and metadata must be Unicode text: a JSON ``\\ud800`` escape spells a lone surrogate,
    which no UTF-8 output (a converted file, a terminal) can hold."""
    metadata = header.get("__metadata__")
    strings = [*header, *(x for kv in metadata.items() for x in kv if isinstance(x, str))] \
        if isinstance(metadata, dict) else list(header)
    for text in strings:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise fail(f"{text[:40]!r} holds a lone surrogate ({text[e.start]!r}, from a \\u escape); names "
                           "and metadata must be Unicode text") from None


WAYS = ("native", "typed", "standard", "exact")  # how a header can be read: see `_only_way`


@contextlib.contextmanager
def _only_way(way: str) -> Iterator[None]:
    """Read headers in the block one way only: ``"native"`` (the C path, then the standard
    library's where it returns None), ``"typed"`` (msgspec against the schema), ``"standard"``
    (the standard library's parse), ``"exact"`` (`_strict_entries`, which says what is wrong).
    For the differential tests and the fuzz harness, which compare them; it sets module state,
    so it is not for use while other threads open files."""
    from .. import _json

    saved = _c_header, _json._msgspec, SafetensorsReader._plain, _c_plain
    globals()["_c_header"] = saved[0] if way == "native" else None
    globals()["_c_plain"] = saved[3] if way == "native" else None
    if way == "typed":
        import msgspec

        _json._msgspec = msgspec
    else:
        _json._msgspec = False
    if way == "exact":  # (the ignores: a method replaced for the block, and put back)
        SafetensorsReader._plain = lambda *args: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        globals()["_c_header"], _json._msgspec, SafetensorsReader._plain, globals()["_c_plain"] = saved  # type: ignore[method-assign]


def _is_count(x: Any) -> bool:
    return type(x) is int and x >= 0  # noqa: E721 - bool is an int subclass and must not pass


# ----------------------------------------------------------------------------- writer


def header_bytes(sources: list[TensorSource], metadata: Mapping[str, str] | None) -> bytes:
    """The padded JSON header for `sources` (already in write order)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for src in sources:
        header[src.name] = {
            "dtype": src.code,
            "shape": list(src.shape),
            "data_offsets": [offset, offset + src.nbytes],
        }
        offset += src.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def _check_metadata(metadata: Mapping[str, str] | None, path: str) -> None:
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise FormatError(
                f"safetensors metadata maps str to str; {key!r}: {value!r} is {type(value).__name__} "
                "(convert values with str() or json.dumps())",
                path=path,
            )
        if _SURROGATE.search(key) or _SURROGATE.search(value):  # JSON in UTF-8 cannot hold one; readers refuse \ud800
            raise UsageError(f"metadata {key[:40]!r}: safetensors cannot store a lone surrogate (text that is not "
                             "valid Unicode, such as undecodable bytes); escape it (weightio convert writes "
                             "backslash escapes)", path=path)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _coded(src: TensorSource, path: str) -> TensorSource:
    """`src` with its safetensors dtype code set (derived from its dtype unless the source fixed it);
    its name one that the reader accepts back."""
    stored_name(src.name, path, "safetensors")
    if "\x00" in src.name or src.name == "__metadata__":
        raise UsageError(f"tensor name {src.name!r} cannot be stored (a NUL, or the header's metadata key)",
                         path=path, tensor=src.name)
    if src.code is not None:
        return src
    try:
        return dataclasses.replace(src, code=by_numpy(src.dtype).safetensors)
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(e.message, path=path, tensor=src.name) from None


def write(
    sources: Sequence[TensorSource],
    path: str,
    metadata: Mapping[str, str] | None = None,
    *,
    overwrite: bool = False,
) -> None:
    """Write `sources` as a safetensors file, atomically, one tensor in memory at a time.

    Args:
        sources: the tensors (`weightio.writing.tensor_sources` builds them from a mapping);
            each is fetched when its turn comes. They are stored in the reference writer's
            order: by dtype alignment, then name.
        path: destination file.
        metadata: the ``__metadata__`` strings.
        overwrite: replace an existing file (atomically) instead of refusing.
    """
    _check_metadata(metadata, path)
    sources = [_coded(src, path) for src in sources]
    sources.sort(key=lambda s: (-_WRITE_RANK[cast(str, s.code)], s.name))  # (every code set by _coded)
    head = header_bytes(sources, metadata)
    if len(head) > MAX_HEADER_SIZE:
        raise FormatError(f"the header would be {len(head)} bytes, over the {MAX_HEADER_SIZE}-byte limit", path=path)
    with atomic_write(path, overwrite=overwrite) as out:
        out.write(_LENGTH.pack(len(head)) + head)
        for src in sources:
            write_all(out, src.little_endian_bytes())
