"""numpy ``.npy`` and ``.npz``: readers on one mapping, streaming writers.

``.npy`` (numpy ``lib/format.py``, format versions 1.0, 2.0, 3.0)::

    6 bytes   magic b"\\x93NUMPY"
    2 bytes   version major, minor: (1, 0), (2, 0) or (3, 0)
    u16 (1.0) or u32 (2.0, 3.0), little-endian: HEADER_LEN
    HEADER_LEN bytes: a Python dict literal, latin-1 (1.0, 2.0) or UTF-8 (3.0), padded with
              spaces and ended by '\\n' so the data starts on a 64-byte boundary:
              {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
    data      prod(shape) * itemsize bytes, C order (or Fortran order when fortran_order)

Rules enforced here (stricter than ``numpy.load``, which evaluates headers up to 10 000
characters, allocates whatever the shape claims, and accepts trailing bytes):

* the header is at most 10 000 bytes (numpy's own limit for untrusted files;
  ``weightio.limits`` ``npy_header_bytes``) and is parsed by `ast.literal_eval`, never `eval`;
  it is a dict with exactly the three keys, none repeated;
* ``fortran_order`` is a bool; ``shape`` a tuple of at most 64 non-negative ints (not bools)
  that numpy can hold: the non-zero ones times the itemsize below 2^63 bytes (which matters
  for empty arrays: numpy refuses ``(0, 2**62)`` of float32, and so does this reader);
* ``descr`` is parsed by `weightio.formats.npy_descr` (numpy's descriptor grammar, bounded):
  numbers (bool, int, uint, float, complex), fixed-size bytes and str (``|S3``, ``<U3``), void,
  datetime/timedelta (``<M8[s]``, ``<m8[ns]``) and records of them (nested, padded, with
  sub-arrays) are served, as ``numpy.load`` returns them; other descrs raise
  `UnsupportedDTypeError`;
* an object array (``'O'`` anywhere in its dtype, a record field included) is listed, but its
  data is a pickle, which weightio never loads: reading it raises `UnsafePickleError` (the other
  members of an ``.npz`` stay readable). Its ``nbytes`` is the pickle's length;
* headers of versions 1.0 and 2.0 written by Python 2 (``'shape': (2L, 3L)``) are read as numpy
  reads them (see `npy_descr.strip_long_suffixes`);
* the data is exactly ``prod(shape) * itemsize`` bytes: nothing missing, nothing after.

Numbers stored big-endian are converted to native order by `TensorView.numpy` (a copy); every
other dtype is served as stored, byte order included, as ``numpy.load`` serves it (zero-copy).

``.npz`` is a ZIP archive of ``<name>.npy`` members (see `weightio.formats._zip` for the archive rules).
STORED members are mapped in place: each tensor is a view of the archive's mapping at the
member's data offset (``numpy.load`` reads every member into memory, even with ``mmap_mode``).
DEFLATED members are inflated on first access, into a buffer of exactly the size the member's
npy header and zip entry agree on, and cached.

The writers produce what ``numpy.save`` produces for C-ordered arrays, byte for byte, and
``.npz`` archives whose members are STORED and whose array data starts on a 64-byte boundary in
the archive, so this reader maps every member zero-copy.
"""

from __future__ import annotations

import ast
import math
import os
import struct
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

import numpy as np

from .._outputs import atomic_write, write_all
from ..dtypes import dtype_name, is_number
from ..errors import Advice, CorruptFileError, FormatError, UnsafePickleError, UnsupportedDTypeError, UsageError
from ..limits import Limits, exceeded
from ..limits import current as current_limits
from ..records import TensorSource
from ..text import describe, dims
from . import _zip
from .base import MAX_NDIM, Reader, TensorInfo, is_remote, stored_name
from .npy_descr import descr_dtype, strip_long_suffixes

__all__ = ["NpyReader", "NpzReader", "write_npy", "write_npz", "npy_header", "MAX_HEADER_SIZE"]

MAGIC = b"\x93NUMPY"
MAX_HEADER_SIZE = 10_000  # numpy's _MAX_HEADER_SIZE: literal_eval is not safe on larger inputs
ARRAY_ALIGN = 64
_PREAMBLE = {(1, 0): (struct.Struct("<H"), "latin1"), (2, 0): (struct.Struct("<I"), "latin1"),
             (3, 0): (struct.Struct("<I"), "utf8")}
_KEYS = {"descr", "fortran_order", "shape"}
_GROWTH_AXIS_MAX_DIGITS = 21  # numpy pads headers so the leading axis can grow in place


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """A parsed ``.npy`` header: stored dtype (with byte order), shape, order, data offset, and
    the data's length (``prod(shape) * itemsize``; for an object array, its pickle's length) and
    the ``descr`` as written."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    data_offset: int
    nbytes: int
    descr: Any

    def info(self, base_offset: int) -> TensorInfo:
        """The `TensorInfo` for this array when its npy bytes start at `base_offset`."""
        strides = None
        if self.fortran_order and len(self.shape) > 1:
            strides = tuple(self.dtype.itemsize * math.prod(self.shape[:i]) for i in range(len(self.shape)))
        return TensorInfo(self.dtype, self.shape, base_offset + self.data_offset, self.nbytes, strides)


def header_length(preamble: bytes) -> int | None:
    """The bytes an npy header takes (preamble included), from its first 12 bytes; None when they
    are no preamble weightio reads (`parse_header` then says what is wrong)."""
    version = tuple(preamble[6:8])
    if preamble[:6] != MAGIC or version not in _PREAMBLE:
        return None
    length_field = _PREAMBLE[version][0]
    start = 8 + length_field.size
    return start + length_field.unpack_from(preamble, 8)[0] if len(preamble) >= start else None


def parse_header(prefix: bytes, total: int, *, path: str, tensor: str | None = None,
                 limits: Limits | None = None) -> NpyHeader:
    """Parse and validate an npy header.

    Args:
        prefix: the first bytes of the npy data (at least the whole header, when it exists).
        total: the npy data's full length (file or member size), to check the data size against.
        limits: the header length limit (``limits.npy_header``); the current limits when None.
    """
    def fail(message: str) -> CorruptFileError:
        return CorruptFileError(message, path=path, tensor=tensor)

    if prefix[:6] != MAGIC:
        raise fail("not an .npy array (no \\x93NUMPY magic)")
    if len(prefix) < 10:
        raise fail(f"ends inside the .npy preamble ({len(prefix)} bytes)")
    version = (prefix[6], prefix[7])
    if version not in _PREAMBLE:
        raise FormatError(f".npy format version {version[0]}.{version[1]} is not supported (1.0, 2.0, 3.0 are)",
                          path=path, tensor=tensor)
    length_field, encoding = _PREAMBLE[version]
    start = 6 + 2 + length_field.size
    if len(prefix) < start:
        raise fail(f"ends inside the .npy preamble ({len(prefix)} bytes)")
    (hlen,) = length_field.unpack_from(prefix, 8)
    limits = limits or current_limits()
    if hlen > limits.npy_header:
        field = "npy_header_bytes" if limits.npy_header == limits.npy_header_bytes else "header_bytes"
        raise exceeded(".npy header length", hlen, field, limits.npy_header, path=path, tensor=tensor)
    if start + hlen > min(total, len(prefix)):
        raise fail(f".npy header ({hlen} bytes) runs past the end of the data ({total} bytes)")
    fields = _literal_header(prefix[start : start + hlen], encoding, fail, python2=version != (3, 0))
    dtype = _header_dtype(fields["descr"], path, tensor)
    shape = fields["shape"]
    if math.prod(d for d in shape if d) * dtype.itemsize >= 1 << 63:  # numpy's limit, even for 0 elements
        raise fail(f"shape {dims(shape, '()')} is too large for numpy (the non-zero dimensions times the "
                   f"itemsize reach 2^63 bytes)")
    available = total - start - hlen
    nbytes = available if dtype.hasobject else math.prod(shape) * dtype.itemsize  # objects: a pickle follows
    if nbytes != available:
        what = "missing" if nbytes > available else "trailing"
        raise fail(f"header declares {dtype_name(dtype)} {dims(shape, '()')} = {nbytes} data bytes but "
                   f"{available} follow ({abs(nbytes - available)} bytes {what})")
    return NpyHeader(dtype, shape, fields["fortran_order"], start + hlen, nbytes, fields["descr"])


def _literal_header(raw: bytes, encoding: str, fail: Any, *, python2: bool) -> dict[str, Any]:
    try:
        text = raw.decode(encoding).lstrip(" \t")
        try:
            tree = ast.parse(text, mode="eval")  # parsed once, evaluated as a literal
        except SyntaxError:
            # numpy's order: only a header that does not parse as it is may be a Python 2 one
            filtered = strip_long_suffixes(text) if python2 else None
            if filtered is None:
                raise
            tree = ast.parse(filtered, mode="eval")
        fields = ast.literal_eval(tree)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeDecodeError) as e:
        raise fail(f".npy header is not a Python literal ({type(e).__name__}: {e})") from None
    if isinstance(tree.body, ast.Dict) and isinstance(fields, dict) and len(tree.body.keys) != len(fields):
        # literal_eval keeps the last of repeated keys; a reader that keeps the first sees another array
        raise fail(".npy header repeats a key (readers disagree on which value wins)")
    if not isinstance(fields, dict) or set(fields) != _KEYS:
        keys = sorted(k if isinstance(k, str) else describe(k) for k in fields) if isinstance(fields, dict) else (
            type(fields).__name__)
        raise fail(f".npy header must be a dict with keys descr, fortran_order, shape; found {keys}")
    shape = fields["shape"]
    if type(fields["fortran_order"]) is not bool:
        raise fail(f"fortran_order must be True or False, found {describe(fields['fortran_order'])}")
    if (not isinstance(shape, tuple) or len(shape) > MAX_NDIM
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise fail(f"shape must be a tuple of at most {MAX_NDIM} non-negative ints, found {describe(shape)}")
    return fields


def _header_dtype(descr: Any, path: str, tensor: str | None) -> np.dtype:
    dtype = _PLAIN.get(descr) if type(descr) is str else None  # the common case: one dict lookup
    return dtype if dtype is not None else descr_dtype(descr, path, tensor)


# The numeric type strings numpy writes, parsed once (a record or any other descr goes through npy_descr).
_ORDERS: tuple[Literal["<", ">"], ...] = ("<", ">")  # (typed: newbyteorder takes these literals, not any str)
_PLAIN = {np.dtype(code).newbyteorder(order).str: np.dtype(code).newbyteorder(order)
          for code in "?bBhHiIlLqQefdgFDG" for order in _ORDERS}


def object_error(descr: Any, path: str, tensor: str | None) -> UnsafePickleError:
    """What reading an object array (descr `descr`, as written) raises."""
    return UnsafePickleError(f"object array ({describe(descr)}): its data is a pickle, which weightio never loads "
                             "(numpy.load(..., allow_pickle=True) runs it: only for a file you trust)",
                             path=path, tensor=tensor)


class NpyReader(Reader):
    """A validated ``.npy`` file: one tensor, named after the file (``w.npy`` -> ``"w"``)."""

    format = "npy"

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self._objects: dict[str, Any] = {}
        self._validate(self._read_header)

    def _read_header(self) -> None:
        most = min(self.file.size, 12 + self.limits.npy_header)  # its length is read first: a remote file's
        length = header_length(self.file.read(0, min(most, 12), "the .npy header"))  # first bytes hold it
        prefix = self.file.read(0, most if length is None else min(most, length), "the .npy header")
        header = parse_header(prefix, self.file.size, path=self.path, limits=self.limits)
        name = os.path.basename(self.path)
        name = name[:-4] if name.endswith(".npy") else name
        self.tensors[name] = header.info(0)
        if header.dtype.hasobject:
            self._objects[name] = header.descr

    def buffer(self, name: str) -> np.ndarray:
        """The file mapping; `UnsafePickleError` for an object array (its data is a pickle)."""
        if name in self._objects:
            raise object_error(self._objects[name], self.path, None)
        return self.file.data


class NpzReader(Reader):
    """A validated ``.npz`` archive; member ``w.npy`` is tensor ``"w"``."""

    format = "npz"

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self._deflated: dict[str, _zip.ZipMember] = {}
        self._inflated: dict[str, np.ndarray] = {}
        self._objects: dict[str, Any] = {}  # object arrays: name -> descr (their data is a pickle)
        self._lock = threading.Lock()
        self._validate(self._read_members)

    def _read_members(self) -> None:
        for member in _zip.read_members(self.file, self.limits):  # the member count is bounded there
            self._add(member)

    def _add(self, member: _zip.ZipMember) -> None:
        name = _tensor_name(member.name, self.path)
        if len(name.encode("utf-8")) > self.limits.name_bytes:
            raise exceeded(f"the length of member name {name[:20]!r}…:", len(name.encode("utf-8")), "name_bytes",
                           self.limits.name_bytes, path=self.path)
        prefix = self._npy_prefix(member)
        header = parse_header(prefix, member.size, path=self.path, tensor=name, limits=self.limits)
        if header.dtype.hasobject:
            self._objects[name] = header.descr
        if member.method == _zip.METHOD_STORED:
            self.tensors[name] = header.info(member.data_offset)
        else:
            self.tensors[name] = header.info(0)
            self._deflated[name] = member

    def _npy_prefix(self, member: _zip.ZipMember) -> bytes:
        """The member's first bytes, as many as its .npy header can take. A remote file's: its
        preamble's header length first, then that many (both most often fetched with the local
        header, `weightio.formats._zip_remote.prefixes`), rather than a 64 KiB block per member."""
        most = 12 + self.limits.npy_header
        if not is_remote(self.file):
            return _zip.inflate_prefix(self.file, member, most)
        head = _zip.inflate_prefix(self.file, member, 12)
        if head[:6] != MAGIC or len(head) < 12 or (head[6], head[7]) not in _PREAMBLE:
            return head  # parse_header says what is wrong
        field = _PREAMBLE[(head[6], head[7])][0]
        (hlen,) = field.unpack_from(head, 8)
        return _zip.inflate_prefix(self.file, member, min(most, 8 + field.size + hlen))

    def buffer(self, name: str) -> np.ndarray:
        """The archive mapping, or for a deflated member its inflated bytes (inflated once);
        `UnsafePickleError` for an object array (its data is a pickle, never inflated or read)."""
        if name in self._objects:
            raise object_error(self._objects[name], self.path, name)
        member = self._deflated.get(name)
        if member is None:
            if is_remote(self.file):  # (a member whose offset was predicted: checked first)
                _zip.verify_range(self.file, *self.tensors[name].stored_range())
            return self.file.data
        limit = self.limits.inflated_bytes
        if limit is not None and member.size > limit:
            raise exceeded("the deflated member inflates to", member.size, "inflated_bytes", limit, path=self.path,
                           tensor=name)
        with self._lock:
            data = self._inflated.get(name)
            if data is None:
                data = self._inflated[name] = _zip.inflate(self.file, member)
        return data

    def close(self) -> None:
        self._inflated = {}
        super().close()


def _tensor_name(member: str, path: str) -> str:
    if not member.endswith(".npy"):
        raise CorruptFileError(f"member {member!r} is not an .npy array", path=path)
    name = member[:-4]
    if _unsafe_member(name):
        raise CorruptFileError(f"member name {member!r} is not a safe tensor name", path=path)
    return name


def _unsafe_member(name: str) -> bool:
    """A tensor name that no npz reader should turn into a path: empty, NUL, absolute, or climbing
    out of the archive (``..``). The reader refuses such members; the writer refuses such names."""
    return not name or "\x00" in name or name.startswith("/") or ".." in name.split("/")


# ----------------------------------------------------------------------------- writers


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` preamble and header ``numpy.save`` writes for a C-ordered array."""
    descr = np.lib.format.dtype_to_descr(dtype)
    text = "{" + f"'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, " + "}"
    if shape:
        text += " " * (_GROWTH_AXIS_MAX_DIGITS - len(repr(shape[0])))
    for version, (field, encoding) in _PREAMBLE.items():
        body = text.encode(encoding)
        start = 6 + 2 + field.size
        padded = body + b" " * (-(start + len(body) + 1) % ARRAY_ALIGN) + b"\n"
        if len(padded) < 1 << (8 * field.size):
            return MAGIC + bytes(version) + field.pack(len(padded)) + padded
    raise FormatError(f"shape {shape} makes an .npy header too large")


def _member_source(src: TensorSource, path: str) -> TensorSource:
    """`src` when its name makes an npz member that every npz reader reads back (checked as the
    reader checks members: a name that would be a zip-slip path is refused, never written)."""
    stored_name(src.name, path, "npz", extra=len(".npy"))
    if _unsafe_member(src.name):
        raise UsageError(f"cannot be an .npz member name: npz readers refuse member {src.name + '.npy'!r} (empty, "
                         "NUL, absolute or '..' path: it would unpack outside the directory); rename the tensor or "
                         "write safetensors", path=path, tensor=src.name)
    return _npy_source(src, path)


def _npy_source(src: TensorSource, path: str) -> TensorSource:
    if src.dtype.kind in "biufc":
        return src
    if is_number(src.dtype) or src.dtype.kind not in _EXACT_KINDS or src.dtype.hasobject or not src.dtype.itemsize:
        raise UnsupportedDTypeError(
            f"{dtype_name(src.dtype)} has no .npy descr that numpy can read back", path=path, tensor=src.name,
            advice=Advice(python="cast it with dtype='float32', or write safetensors",
                          cli="cast it with --dtype fp32, or write .safetensors"))
    try:
        npy_header(src.dtype, src.shape)
    except ValueError as e:  # overlapping or out-of-order record fields have no descr
        raise UnsupportedDTypeError(f"{dtype_name(src.dtype)} has no .npy descr ({e})", path=path,
                                    tensor=src.name) from None
    return src


# Written as stored (numpy.save's way): bytes, str, void (and records), datetime, timedelta.
_EXACT_KINDS = frozenset("SUVMm")


def _stored_dtype(src: TensorSource) -> np.dtype:
    """The dtype the header declares: numbers little-endian (as every weightio writer stores
    them), other dtypes exactly as they are, byte order included (`_stored_data` matches)."""
    return src.dtype.newbyteorder("<") if src.dtype.kind in "biufc" else src.dtype


def _stored_data(src: TensorSource) -> np.ndarray:
    return src.little_endian_bytes() if src.dtype.kind in "biufc" else np.ascontiguousarray(src.fetch())


def _no_metadata(metadata: Mapping[str, Any] | None, fmt: str, path: str) -> None:
    if metadata:
        raise UsageError(f"{fmt} files cannot store metadata; drop metadata= or write .safetensors", path=path)


def write_npy(sources: Sequence[TensorSource], path: str, metadata: Mapping[str, Any] | None = None, *,
              overwrite: bool = False) -> None:
    """Write the single tensor of `sources` as an ``.npy`` file (C order, little-endian), atomically.

    Raises:
        UsageError: `sources` holds more or fewer than one tensor, or `metadata` is given (``.npy`` has none).
    """
    _no_metadata(metadata, "npy", path)
    if len(sources) != 1:
        raise UsageError(f".npy holds exactly one array; got {len(sources)} tensors (write .npz or "
                          ".safetensors for several)", path=path)
    src = _npy_source(sources[0], path)
    with atomic_write(path, overwrite=overwrite) as out:
        out.write(npy_header(_stored_dtype(src), src.shape))
        write_all(out, _stored_data(src))


# ZIP records for the npz writer (see weightio.formats._zip for the layouts)
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_EOCD64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR = struct.Struct("<IIQI")
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01: fixed, so the same tensors give the same bytes
_ALIGN_EXTRA_ID = 0xD935  # the "alignment" extra field id used by Android's zipalign
_U32 = 0xFFFFFFFF  # the value a 32-bit field holds when the real one is in a ZIP64 record
_ZIP64_LIMIT = 0xFFFFFFFF  # sizes/offsets/counts at or above this need ZIP64 records
_MADE_BY_UNIX = 3 << 8  # so the external attributes read as a Unix mode (0644)


@dataclass
class _Entry:
    name: bytes
    flags: int
    crc: int
    size: int
    offset: int


def write_npz(sources: Sequence[TensorSource], path: str, metadata: Mapping[str, Any] | None = None, *,
              overwrite: bool = False) -> None:
    """Write `sources` as an uncompressed ``.npz``, atomically, one tensor in memory at a time.

    Each member's array data starts on a 64-byte boundary of the archive (an alignment extra
    field pads the local header), so `NpzReader` maps every member zero-copy; ``numpy.load``
    reads the archive as usual. ZIP64 records are written only when a size or offset needs them.
    `metadata` must be empty: ``.npz`` has no place for it (`UsageError`).
    """
    _no_metadata(metadata, "npz", path)
    sources = [_member_source(s, path) for s in sources]
    entries: list[_Entry] = []
    with atomic_write(path, overwrite=overwrite) as out:
        for src in sources:
            entries.append(_write_member(out, src))
        _write_central_directory(out, entries)


def _write_member(out: IO[bytes], src: TensorSource) -> _Entry:
    name = (src.name + ".npy").encode("utf-8")
    flags = 0 if name.isascii() else 0x800
    header = npy_header(_stored_dtype(src), src.shape)
    size = len(header) + src.nbytes
    offset = out.tell()
    zip64 = struct.pack("<HHQQ", 0x0001, 16, size, size) if size >= _ZIP64_LIMIT else b""
    unaligned = offset + _LOCAL.size + len(name) + len(zip64) + len(header)
    pad = -unaligned % ARRAY_ALIGN
    if 0 < pad < 4:  # an extra field needs 4 bytes of its own header
        pad += ARRAY_ALIGN
    extra = zip64 + (struct.pack("<HH", _ALIGN_EXTRA_ID, pad - 4) + b"\0" * (pad - 4) if pad else b"")
    csize = _U32 if zip64 else size
    out.write(_LOCAL.pack(0x04034B50, 45 if zip64 else 20, flags, 0, 0, _DOS_DATE, 0, csize, csize,
                          len(name), len(extra)) + name + extra)
    crc = zlib.crc32(header)
    out.write(header)
    for chunk in _chunks(_stored_data(src)):
        crc = zlib.crc32(chunk, crc)
        write_all(out, chunk)
    end = out.tell()
    out.seek(offset + 14)
    out.write(struct.pack("<I", crc))
    out.seek(end)
    return _Entry(name, flags, crc, size, offset)


def _chunks(arr: np.ndarray, size: int = 64 << 20) -> Any:
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for start in range(0, len(flat), size):
        yield flat[start : start + size]


def _write_central_directory(out: IO[bytes], entries: list[_Entry]) -> None:
    cd_offset = out.tell()
    for e in entries:
        big_size, big_offset = e.size >= _ZIP64_LIMIT, e.offset >= _ZIP64_LIMIT
        extra = b""
        if big_size or big_offset:
            values = ([e.size, e.size] if big_size else []) + ([e.offset] if big_offset else [])
            extra = struct.pack("<HH", 0x0001, 8 * len(values)) + struct.pack(f"<{len(values)}Q", *values)
        size = _U32 if big_size else e.size
        version = 45 if extra else 20
        out.write(_CENTRAL.pack(0x02014B50, _MADE_BY_UNIX | version, version, e.flags, 0, 0, _DOS_DATE,
                                e.crc, size, size, len(e.name), len(extra), 0, 0, 0, 0o100644 << 16,
                                _U32 if big_offset else e.offset) + e.name + extra)
    cd_size = out.tell() - cd_offset
    count = len(entries)
    if count >= min(0xFFFF, _ZIP64_LIMIT) or cd_size >= _ZIP64_LIMIT or cd_offset >= _ZIP64_LIMIT:
        record = out.tell()
        out.write(_EOCD64.pack(0x06064B50, _EOCD64.size - 12, 45, 45, 0, 0, count, count, cd_size, cd_offset))
        out.write(_LOCATOR.pack(0x07064B50, 0, record, 1))
        out.write(_EOCD.pack(0x06054B50, 0, 0, 0xFFFF, 0xFFFF, _U32, _U32, 0))
    else:
        out.write(_EOCD.pack(0x06054B50, 0, 0, count, count, cd_size, cd_offset, 0))
