"""PyTorch checkpoints (``torch.save``) without torch, through weightio's allowlist unpickler.

**Zip format** (torch >= 1.6, the default): a ZIP archive (rules in `weightio._zip`) whose
members share one prefix (the file's stem when it was saved, or ``archive``)::

    <prefix>/data.pkl          the pickled object. A tensor is a call of a torch rebuild function
                               on a storage, given by the persistent id
                               ("storage", <storage class>, key, location, numel)
    <prefix>/data/<key>        one STORED record per storage: numel * itemsize raw bytes, at a
                               64-byte aligned offset (torch pads the local header's extra field)
    <prefix>/byteorder         "little" or "big" (absent: little)
    <prefix>/version           the format version ("3\\n"); torch reads versions 1 to 10
    <prefix>/.format_version, .storage_alignment, .data/serialization_id: informational

**Legacy raw-pickle format** (``torch.save(..., _use_new_zipfile_serialization=False)``), five
pickles back to back, then the storages::

    pickle   the magic number 0x1950a86a20f9469cfc6c
    pickle   the protocol version 1001
    pickle   sys_info: {"protocol_version", "little_endian", "type_sizes"}
    pickle   the object; persistent ids ("storage", <storage class>, root key, location, numel,
             view) where view is None or (view key, element offset, numel)
    pickle   the storage keys, in the order their data follows
    per key  int64 element count (little-endian), then count * itemsize bytes (little-endian)

**Legacy tar format** (torch 0.1.x; archive rules in `weightio._tar`), four members::

    sys_info   pickle   as above (protocol_version 1000)
    pickle     pickle   the object; persistent ids: the key (str of an int) of a tensor
    tensors    pickle   count; per tensor: pickle (key, storage key, tensor class), then int32
                        ndim, 4 bytes of padding, ndim int64 sizes, ndim int64 strides, int64 offset
    storages   pickle   count; per storage: pickle (key, location, storage class), int64 element
                        count, the data; then pickle [(view key, root key, offset, numel), ...]

Any other pickle (``pickle.dump`` of a dict of numpy arrays, say) is read as one object.

Tensors are views of the one file mapping: a zip record, or a span of a legacy file. A view
with a storage offset or non-contiguous strides (transposed, sliced, step-sliced) keeps its
byte strides; names that share a storage share memory. A ``byteorder`` of "big" gives
big-endian dtypes (``numpy()`` converts; ``raw()`` is the stored bytes). Deflated records
(which torch never writes) are inflated on first use, bounded by the record's size.

Checked before any tensor is exposed, each failure a `CorruptFileError` naming the file and the
tensor: the storage record exists; it holds exactly numel * itemsize bytes (the numel a pickle
claims is never trusted, CVE-2026-24747); a storage key always has one dtype and size; offset,
sizes and strides are non-negative ints (at most 64 dims) and the view's last element lies
inside its storage; ``byteorder`` is "little" or "big"; legacy storages are laid out exactly as
listed, with nothing after them.

Quantized, sparse and meta tensors, and dtypes numpy has no type for (complex32, bits16, …),
are listed with their shape; reading them raises `UnsupportedDTypeError` naming the tensor.
TorchScript archives (a ``constants.pkl`` record, beside ``code/``) hold code and raise `FormatError`.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from typing import Any, NamedTuple

import numpy as np

from .. import _pickle, _standins, _tar, _zip
from .._io import MappedFile
from ..dtypes import TABLE
from ..errors import CorruptFileError, FormatError, UnsafePickleError, UnsupportedDTypeError, WeightioError
from ..limits import Limits, exceeded
from ..limits import current as current_limits
from .base import MAX_NDIM, Reader, TensorInfo

__all__ = ["PyTorchReader", "MAGIC_NUMBER", "PROTOCOL_VERSION", "open_container"]

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001  # the raw-pickle format's; the tar format wrote 1000 in sys_info
MAX_FORMAT_VERSION = 10  # torch's kMaxSupportedFileFormatVersion (caffe2/serialize/versions.h)
_NODE_BUDGET = 4  # flattening visits at most this many entries per byte of pickle (+ a floor)
_NODE_FLOOR = 100_000
_MAX_KEY = 256  # characters of a storage key or location (torch writes a few)
_I64 = struct.Struct("<q")
_MAX_VIEW_BYTES = (1 << 63) - 1  # numpy's (and torch's) bound on one array's size
_HUGE = 1 << 256  # past any real offset, size or stride (torch's are int64); such ints may not even print
_TENSOR_HEADER = struct.Struct("<ii")  # ndim, padding (the legacy tar's int64 ndim, read as two int32)


# ----------------------------------------------------------------------------- dtypes


# Quantized tensors store integers: they are listed with that integer type (reading them raises).
QUANTIZED_DTYPES = {"qint8": "int8", "quint8": "uint8", "qint32": "int32", "quint4x2": "uint8", "quint2x4": "uint8"}


def _numpy_dtypes() -> dict[str, np.dtype]:
    """torch dtype name -> the numpy dtype its elements are listed with (fp4 x2: one ml_dtypes
    float4 per stored byte pair, as safetensors' F4)."""
    table = {row.torch: row.numpy for row in TABLE if row.torch is not None}
    table["complex128"] = np.dtype(np.complex128)  # in numpy, not in safetensors (the table's key)
    table.update({name: table[stored] for name, stored in QUANTIZED_DTYPES.items()})
    return table


NUMPY_DTYPES = _numpy_dtypes()
# Element sizes of torch dtypes numpy has no type for (tensors of them are listed, not read).
_OPAQUE_SIZES = {"complex32": 4, "bits16": 2}
ITEMSIZES = {name: NUMPY_DTYPES[name].itemsize if name in NUMPY_DTYPES else _OPAQUE_SIZES.get(name, 1)
             for name in set(_standins.TORCH_DTYPES.values())}


def itemsize(torch_dtype: str) -> int:
    """Bytes per element of a torch dtype (fp4 x2: one byte per pair)."""
    return ITEMSIZES[torch_dtype]


# ----------------------------------------------------------------------------- containers


class Span(NamedTuple):
    """Where a storage's bytes are: ``[offset, offset + nbytes)`` of the file mapping, or of the
    inflated bytes of `record` when that zip record is deflated."""

    offset: int
    nbytes: int
    record: _zip.ZipMember | None = None


class Container:
    """One checkpoint file's structure: its unpickled root object and where storages live.

    Attributes:
        kind: ``"zip"``, ``"legacy"``, ``"tar"`` or ``"pickle"``.
        root: the unpickled object (stand-ins from `weightio._standins`).
        byteorder: ``"little"`` or ``"big"``.
        pickle_bytes: total size of the pickles read (bounds the flattening work).
        pickles: (label, bytes) of every pickle in the file, for `weightio.safety.scan`.
    """

    kind = "pickle"

    def __init__(self, file: MappedFile, limits: Limits) -> None:
        self.file = file
        self.path = file.path
        self.limits = limits
        self.root: Any = None
        self.byteorder = "little"
        self.pickle_bytes = 0
        self.pickles: list[tuple[str, bytes]] = []
        self.storages: dict[str, _standins.StorageRef] = {}

    def locate(self, storage: _standins.StorageRef) -> Span:
        """The bytes of `storage`; `CorruptFileError` (without tensor name) when they are missing."""
        raise CorruptFileError(f"refers to storage {storage.key!r}, but a plain pickle holds no storages")

    def _fail(self, message: str) -> CorruptFileError:
        return CorruptFileError(message, path=self.path)

    def _storage(self, key: Any, storage_class: Any, numel: Any, location: Any) -> _standins.StorageRef:
        """A storage reference from a persistent id, checked, and the same object for the same key."""
        if not isinstance(storage_class, _standins.Token) or storage_class.kind != "storage":
            raise self._fail(f"storage {_standins.short_repr(key)}: {_standins.short_repr(storage_class)} is not a "
                             "torch storage class")
        if not isinstance(key, str) or not 0 < len(key) <= _MAX_KEY or not key.isprintable():
            raise self._fail(f"storage key {_standins.short_repr(key)} is not a short printable string")
        if not isinstance(location, str) or len(location) > _MAX_KEY:
            raise self._fail(f"storage {key!r}: location {_standins.short_repr(location)} is not a short string")
        dtype = storage_class.value
        if type(numel) is not int or numel < 0 or numel * itemsize(dtype) > self.file.size:
            raise self._fail(f"storage {key!r}: {_standins.short_repr(numel)} elements of {dtype} cannot fit in a "
                             f"{self.file.size:,}-byte file")
        known = self.storages.get(key)
        if known is None:
            known = self.storages[key] = _standins.StorageRef(key, dtype, numel)
        elif (known.dtype, known.numel) != (dtype, numel):
            raise self._fail(f"storage {key!r} is declared twice: {known.numel:,} x {known.dtype}, then "
                             f"{numel:,} x {dtype}")
        return known

    def _count_pickle_bytes(self, n: int, what: str) -> None:
        """Pickles are the header of a PyTorch file: their total size is bounded by limits.header_bytes."""
        self.pickle_bytes += n
        if self.pickle_bytes > self.limits.header_bytes:
            raise exceeded(f"{what}: pickled bytes", self.pickle_bytes, "header_bytes", self.limits.header_bytes,
                           path=self.path)

    def _unpickle(self, data: bytes, what: str, *, checked: bool = False) -> Any:
        self._count_pickle_bytes(len(data), what)
        return _pickle.load(data, self._persistent_load, path=self.path, what=what, checked=checked,
                            limits=self.limits)

    def _check_sys_info(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise self._fail(f"legacy sys_info is {_standins.short_repr(value)}, not a dict")

    def _persistent_load(self, pid: Any) -> Any:
        raise self._fail("the pickle refers to a persistent object (a torch storage?), but this is not a torch "
                         "checkpoint that stores any")


class ZipContainer(Container):
    """``torch.save``'s zip format."""

    kind = "zip"

    def __init__(self, file: MappedFile, members: list[_zip.ZipMember], limits: Limits) -> None:
        super().__init__(file, limits)
        self.records = {m.name: m for m in members}
        self.prefix = _archive_prefix(file, members)
        self.byteorder = self._byteorder()
        self._check_version()
        pickle_record = self.records[self.prefix + "data.pkl"]
        self.pickles = [(pickle_record.name, self._read_record(pickle_record, limits.header_bytes))]
        self.root = self._unpickle(self.pickles[0][1], pickle_record.name)

    def _read_record(self, record: _zip.ZipMember, limit: int) -> bytes:
        return _zip.read_member(self.file, record, limit, what="record")

    def _small_record(self, name: str) -> bytes | None:
        record = self.records.get(self.prefix + name)
        if record is None:
            return None
        if record.size > 64:
            raise self._fail(f"record {record.name!r} is {record.size:,} bytes; torch writes a few")
        return self._read_record(record, 64)

    def _byteorder(self) -> str:
        raw = self._small_record("byteorder")
        if raw is None:
            return "little"
        if raw not in (b"little", b"big"):
            raise self._fail(f"byteorder record is {raw!r}; torch writes 'little' or 'big'")
        return raw.decode()

    def _check_version(self) -> None:
        raw = self._small_record("version")
        if raw is None:
            raw = self._small_record(".data/version")
        if raw is None:
            return
        text = raw.strip()
        if not text.isdigit() or not 1 <= int(text) <= MAX_FORMAT_VERSION:
            raise FormatError(f"PyTorch zip format version {raw!r} is not supported (1 to {MAX_FORMAT_VERSION} are)",
                              path=self.path)

    def _persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage":
            raise self._fail(f"persistent id {_standins.short_repr(pid)} is not ('storage', class, key, location, "
                             "numel)")
        _, storage_class, key, location, numel = pid
        return self._storage(key, storage_class, numel, location)

    def locate(self, storage: _standins.StorageRef) -> Span:
        name = f"{self.prefix}data/{storage.key}"
        record = self.records.get(name)
        if record is None:
            raise self._fail(f"its storage {storage.key!r} has no record {name!r} in the archive")
        nbytes = storage.numel * itemsize(storage.dtype)
        if record.size != nbytes:
            raise self._fail(f"its storage {storage.key!r} is declared as {storage.numel:,} x {storage.dtype} = "
                             f"{nbytes:,} bytes but record {name!r} holds {record.size:,}")
        if record.method == _zip.METHOD_STORED:
            return Span(record.data_offset, nbytes)
        return Span(0, nbytes, record)


def _archive_prefix(file: MappedFile, members: list[_zip.ZipMember]) -> str:
    """The prefix of the one ``<prefix>/data.pkl`` record; TorchScript archives are refused."""
    pickles = [m.name for m in members if m.name.endswith("data.pkl")
               and (m.name == "data.pkl" or (m.name.count("/") == 1 and m.name.endswith("/data.pkl")))]
    if len(pickles) != 1:
        found = ", ".join(repr(n) for n in pickles) or "none"
        raise CorruptFileError(f"a PyTorch zip checkpoint has one <prefix>/data.pkl record; found {found}",
                               path=file.path)
    prefix = pickles[0][: -len("data.pkl")]
    if any(m.name == prefix + "constants.pkl" for m in members):  # what torch.load calls TorchScript
        raise FormatError("is a TorchScript archive (torch.jit.save); TorchScript holds code and is not "
                          "loaded — save the module's state_dict() with torch.save instead", path=file.path)
    return prefix


class LegacyContainer(Container):
    """The raw-pickle format: five stacked pickles, then the storages."""

    kind = "legacy"

    def __init__(self, file: MappedFile, data: memoryview, first_end: int, limits: Limits) -> None:
        super().__init__(file, limits)
        self._views: dict[str, tuple[str, int, int]] = {}
        self.pickles = [("pickle 1 (magic number)", bytes(data[:first_end]))]
        pos = first_end
        for label, check in (("pickle 2 (protocol version)", self._check_protocol),
                             ("pickle 3 (sys_info)", self._check_sys_info)):
            value, pos = self._next(data, pos, label)
            check(value)
        self.root, pos = self._next(data, pos, "pickle 4 (the checkpoint)")
        keys, pos = self._next(data, pos, "pickle 5 (storage keys)")
        self._spans = self._layout(keys, pos)

    def _next(self, data: memoryview, pos: int, label: str) -> tuple[Any, int]:
        end = _pickle.prepass(data, pos, path=self.path, what=label, limits=self.limits)
        raw = bytes(data[pos:end])
        self.pickles.append((label, raw))
        return self._unpickle(raw, label, checked=True), end

    def _check_protocol(self, value: Any) -> None:
        if value != PROTOCOL_VERSION:
            raise FormatError(f"legacy torch.save protocol version {_standins.short_repr(value)} is not supported "
                              f"({PROTOCOL_VERSION} is)", path=self.path)

    def _persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "module":
            raise UnsafePickleError("the checkpoint pickles a whole torch.nn.Module (torch.save(model)), which is "
                                    "code; save model.state_dict() instead")
        if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
            raise self._fail(f"persistent id {_standins.short_repr(pid)} is not ('storage', class, key, location, "
                             "numel, view)")
        root = self._storage(pid[2], pid[1], pid[4], pid[3])
        view = pid[5] if len(pid) == 6 else None
        return root if view is None else self._view(root, view)

    def _view(self, root: _standins.StorageRef, view: Any) -> _standins.StorageRef:
        if (not isinstance(view, tuple) or len(view) != 3 or not isinstance(view[0], str)
                or not all(type(v) is int and v >= 0 for v in view[1:])):
            raise self._fail(f"storage view {_standins.short_repr(view)} is not (key, offset, numel)")
        key, offset, numel = view
        if offset + numel > root.numel:
            raise self._fail(f"storage view {key!r} (elements {offset:,}..{offset + numel:,}) lies outside storage "
                             f"{root.key!r} ({root.numel:,} elements)")
        return _standins.StorageRef(root.key, root.dtype, root.numel, offset, numel)

    def _layout(self, keys: Any, pos: int) -> dict[str, Span]:
        """Walk the storages after the pickles: each an int64 count then its data, nothing after."""
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
            raise self._fail("the legacy storage key list is not a list of distinct strings")
        spans = {}
        for key in keys:
            storage = self.storages.get(key)
            if storage is None:
                raise self._fail(f"storage {key!r} is listed but no tensor refers to it")
            (count,) = self.file.unpack(_I64, pos, f"the element count of storage {key!r}")
            nbytes = storage.numel * itemsize(storage.dtype)
            if count != storage.numel:
                raise self._fail(f"storage {key!r} is declared with {storage.numel:,} elements but its data holds "
                                 f"{count:,}")
            if pos + 8 + nbytes > self.file.size:
                raise self._fail(f"storage {key!r} ({nbytes:,} bytes at {pos + 8}) runs past the end of the file")
            spans[key] = Span(pos + 8, nbytes)
            pos += 8 + nbytes
        if pos != self.file.size:
            raise self._fail(f"{self.file.size - pos:,} bytes follow the last storage")
        return spans

    def locate(self, storage: _standins.StorageRef) -> Span:
        span = self._spans.get(storage.key)
        if span is None:
            raise self._fail(f"its storage {storage.key!r} is not in the file's storage list")
        return span


class TarContainer(Container):
    """The tar format of torch 0.1.x: storages, tensors and the object in separate members."""

    kind = "tar"
    _MEMBERS = ("sys_info", "pickle", "tensors", "storages")

    def __init__(self, file: MappedFile, limits: Limits) -> None:
        super().__init__(file, limits)
        members = {m.name: m for m in _tar.read_members(file)}
        if sorted(members) != sorted(self._MEMBERS):
            raise self._fail(f"a legacy torch tar checkpoint has members {', '.join(self._MEMBERS)}; found "
                             f"{', '.join(map(repr, members)) or 'none'}")
        self.pickles: list[tuple[str, bytes]] = []
        self._spans: dict[str, Span] = {}
        self._tensors: dict[int, _standins.TensorRef] = {}
        self._check_sys_info(self._member_pickle(members["sys_info"]))
        self._read_storages(members["storages"])
        self._read_tensors(members["tensors"])
        self.root = self._member_pickle(members["pickle"], self._tensor_by_id)

    def _stream(self, member: _tar.TarMember, pos: int, label: str) -> tuple[Any, int]:
        """The pickle at `pos` inside `member` (which interleaves pickles and raw data)."""
        data = memoryview(self.file.data)[: member.data_offset + member.size]
        end = _pickle.prepass(data, pos, path=self.path, what=label, limits=self.limits)
        raw = bytes(data[pos:end])
        self.pickles.append((label, raw))
        self._count_pickle_bytes(len(raw), label)
        return _pickle.load(raw, self._no_persistent, path=self.path, what=label, checked=True,
                            limits=self.limits), end

    def _member_pickle(self, member: _tar.TarMember, persistent: Any = None) -> Any:
        label = f"member {member.name!r}"
        self._count_pickle_bytes(member.size, label)
        raw = self.file.read(member.data_offset, member.size, label)
        self.pickles.append((label, raw))
        return _pickle.load(raw, persistent or self._no_persistent, path=self.path, what=label, limits=self.limits)

    def _no_persistent(self, pid: Any) -> Any:
        raise self._fail(f"unexpected persistent id {_standins.short_repr(pid)} in a tar member's pickle")

    def _count(self, value: Any, what: str, limit: int) -> int:
        if type(value) is not int or not 0 <= value <= limit:
            raise self._fail(f"{what} {_standins.short_repr(value)} is not a count that fits the member")
        return value

    def _read_storages(self, member: _tar.TarMember) -> None:
        end = member.data_offset + member.size
        count, pos = self._stream(member, member.data_offset, "member 'storages' (count)")
        for i in range(self._count(count, "storage count", member.size)):
            entry, pos = self._stream(member, pos, f"member 'storages' (storage {i})")
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise self._fail(f"tar storage entry {_standins.short_repr(entry)} is not (key, location, class)")
            key, location, storage_class = self._key(entry[0], "tar storage key"), entry[1], entry[2]
            (numel,) = self.file.unpack(_I64, pos, "a storage's element count") if pos + 8 <= end else (-1,)
            storage = self._storage(key, storage_class, numel, location)
            nbytes = numel * itemsize(storage.dtype)
            if pos + 8 + nbytes > end:
                raise self._fail(f"tar storage {entry[0]!r} ({nbytes:,} bytes) runs past the end of its member")
            self._spans[key] = Span(pos + 8, nbytes)
            pos += 8 + nbytes
        views, pos = self._stream(member, pos, "member 'storages' (views)")
        self._read_views(views)
        if pos != end:
            raise self._fail(f"{end - pos:,} bytes follow the storages in member 'storages'")

    def _key(self, value: Any, what: str) -> str:
        """A storage or tensor key of the tar format, as a string: torch writes small ints."""
        if (type(value) is int and value.bit_length() < 64) or (type(value) is str and 0 < len(value) <= _MAX_KEY):
            return str(value)
        raise self._fail(f"{what} {_standins.short_repr(value)} is not a small int or a short string")

    def _read_views(self, views: Any) -> None:
        if not isinstance(views, list):
            raise self._fail("tar storage views are not a list")
        for view in views:
            if not isinstance(view, tuple) or len(view) != 4 or not all(type(v) is int for v in view):
                raise self._fail(f"tar storage view {_standins.short_repr(view)} is not (key, root, offset, numel)")
            key, root_key = self._key(view[0], "tar storage view key"), self._key(view[1], "tar storage view root")
            offset, numel = view[2], view[3]
            root = self.storages.get(root_key)
            if root is None or offset < 0 or numel < 0 or offset + numel > root.numel:
                raise self._fail(f"tar storage view {key} of {root_key} lies outside its root storage")
            self.storages[key] = _standins.StorageRef(root.key, root.dtype, root.numel, offset, numel)

    def _read_tensors(self, member: _tar.TarMember) -> None:
        end = member.data_offset + member.size
        count, pos = self._stream(member, member.data_offset, "member 'tensors' (count)")
        for i in range(self._count(count, "tensor count", member.size)):
            entry, pos = self._stream(member, pos, f"member 'tensors' (tensor {i})")
            if not isinstance(entry, tuple) or len(entry) != 3 or type(entry[0]) is not int:
                raise self._fail(f"tar tensor entry {_standins.short_repr(entry)} is not (key, storage key, class)")
            self._key(entry[0], "tar tensor key")
            ref, pos = self._tensor_header(entry, pos, end)
            self._tensors[entry[0]] = ref
        if pos != end:
            raise self._fail(f"{end - pos:,} bytes follow the tensors in member 'tensors'")

    def _tensor_header(self, entry: tuple, pos: int, end: int) -> tuple[_standins.TensorRef, int]:
        key, storage_key, _ = entry
        if pos + 8 > end:
            raise self._fail(f"tar tensor {key}: its header runs past the end of member 'tensors'")
        ndim, _ = self.file.unpack(_TENSOR_HEADER, pos, "a tensor header")
        if not 0 <= ndim <= MAX_NDIM or pos + 8 + 16 * ndim + 8 > end:
            raise self._fail(f"tar tensor {key}: ndim {ndim} is out of range or runs past member 'tensors'")
        fields = struct.unpack(f"<{2 * ndim + 1}q", self.file.read(pos + 8, 16 * ndim + 8, "a tensor header"))
        storage = self.storages.get(self._key(storage_key, f"tar tensor {key}: storage key"))
        ref = _standins.TensorRef(storage if storage is not None else f"<missing storage {storage_key}>",
                                fields[-1], fields[:ndim], fields[ndim:2 * ndim])
        return ref, pos + 8 + 16 * ndim + 8

    def _tensor_by_id(self, pid: Any) -> Any:
        try:
            key = int(pid) if isinstance(pid, (str, int)) and len(str(pid)) <= 24 else None
        except ValueError:
            key = None
        if isinstance(pid, tuple):
            raise UnsafePickleError("the checkpoint pickles a whole torch.nn.Module (torch.save(model)), which is "
                                    "code; save model.state_dict() instead", path=self.path)
        if key is None or (key not in self._tensors and str(key) not in self.storages):
            raise self._fail(f"persistent id {_standins.short_repr(pid)} names no tensor or storage of the archive")
        return self._tensors[key] if key in self._tensors else self.storages[str(key)]

    def locate(self, storage: _standins.StorageRef) -> Span:
        span = self._spans.get(storage.key)
        if span is None:
            raise self._fail(f"its storage {storage.key!r} is not in member 'storages'")
        return span


def open_container(file: MappedFile, limits: Limits | None = None) -> Container:
    """Parse the structure of a PyTorch checkpoint file (any of the three formats, or a plain
    pickle) and unpickle its object, within `limits` (the current `weightio.limits` by default)."""
    limits = limits or current_limits()
    head = file.read(0, min(file.size, 512), "the first bytes")
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return ZipContainer(file, _zip.read_members(file, limits), limits)
    if _tar.looks_like_tar(head):
        return TarContainer(file, limits)
    data = memoryview(file.data)
    end = _pickle.prepass(data, 0, path=file.path, what="pickle 1", limits=limits)
    container = Container(file, limits)
    first = container._unpickle(bytes(data[:end]), "pickle 1", checked=True)
    if type(first) is int and first == MAGIC_NUMBER:
        return LegacyContainer(file, data, end, limits)
    if end != file.size:
        raise CorruptFileError(f"{file.size - end:,} bytes follow the pickle's STOP opcode (stacked pickles or a "
                               "polyglot file; a plain pickle holds one object)", path=file.path)
    container.root = first
    container.pickles = [("pickle 1", bytes(data[:end]))]
    return container


# ----------------------------------------------------------------------------- the reader


class PyTorchReader(Reader):
    """A PyTorch checkpoint: zip, legacy raw-pickle or legacy tar format (see the module docstring).

    Nested checkpoints are flattened to dotted names (``model_state_dict.conv1.weight``,
    ``optimizer.state.0.exp_avg``); their non-tensor leaves (epoch, loss, args …) are
    `metadata` under the same dotted names.

    Attributes:
        container: ``"zip"``, ``"legacy"``, ``"tar"`` or ``"pickle"``.
    """

    format = "pytorch"

    def __init__(self, source: Any) -> None:
        super().__init__(source)
        self._unreadable: dict[str, str] = {}  # name -> why numpy() cannot serve it
        self._own: dict[str, np.ndarray] = {}  # name -> its own bytes (numpy arrays pickled inline)
        self._deflated: dict[str, _zip.ZipMember] = {}  # name -> the deflated record holding it
        self._inflated: dict[str, np.ndarray] = {}  # record name -> inflated bytes
        self._lock = threading.Lock()
        self._validate(self._read)

    def _read(self) -> None:
        limits = self.limits
        container = open_container(self.file, limits)
        self.container = container.kind
        stem = os.path.splitext(os.path.basename(self.path))[0] or "tensor"
        budget = _NODE_BUDGET * container.pickle_bytes + _NODE_FLOOR
        try:
            tensors, self.metadata = _standins.flatten(container.root, budget=budget, root_name=stem,
                                                       max_depth=limits.nesting_depth,
                                                       max_name_bytes=limits.name_bytes)
        except WeightioError as e:
            raise type(e)(e.message, path=self.path) from None
        if len(tensors) > limits.tensors:
            raise exceeded("tensor count", len(tensors), "tensors", limits.tensors, path=self.path, unit="")
        builder = _Builder(container)
        for name, leaf in tensors.items():
            info, why, record = builder.build(name, leaf)
            self.tensors[name] = info
            if why:
                self._unreadable[name] = why
            if record is not None:
                self._deflated[name] = record
            if isinstance(leaf, _standins.NumpyArray):
                self._own[name] = _own_bytes(leaf.array)

    def buffer(self, name: str) -> np.ndarray:
        """The mapping; a numpy array's own pickled bytes; or a deflated record, inflated once.

        Raises:
            UnsupportedDTypeError: quantized, sparse and meta tensors, and dtypes numpy lacks.
        """
        why = self._unreadable.get(name)
        if why is not None:
            raise UnsupportedDTypeError(why, path=self.path, tensor=name)
        own = self._own.get(name)
        if own is not None:
            return own
        record = self._deflated.get(name)
        if record is None:
            return self.file.data
        limit = self.limits.inflated_bytes
        if limit is not None and record.size > limit:
            raise exceeded(f"deflated record {record.name!r} inflates to", record.size, "inflated_bytes", limit,
                           path=self.path, tensor=name)
        with self._lock:
            data = self._inflated.get(record.name)
            if data is None:
                data = self._inflated[record.name] = _zip.inflate(self.file, record)
        return data

    def close(self) -> None:
        self._inflated = {}
        self._own = {}
        super().close()


def _own_bytes(array: np.ndarray) -> np.ndarray:
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base.reshape(-1).view(np.uint8)


# ----------------------------------------------------------------------------- tensors


_new_info = functools.partial(tuple.__new__, TensorInfo)  # TensorInfo(...) minus its Python-level __new__
# torch dtypes numpy holds one element per item of: the common, fast case of `_Builder._dense`.
_PLAIN = frozenset(n for n, d in NUMPY_DTYPES.items() if n not in QUANTIZED_DTYPES
                   and n != "float4_e2m1fn_x2")


class _Builder:
    """Turns what the pickle describes into checked `TensorInfo`s (errors name the tensor)."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.path = container.path
        self.big = container.byteorder == "big"
        self._spans: dict[int, Span] = {}

    def fail(self, name: str, message: str) -> CorruptFileError:
        return CorruptFileError(message, path=self.path, tensor=name)

    def build(self, name: str, leaf: Any) -> tuple[TensorInfo, str | None, _zip.ZipMember | None]:
        """(info, why it cannot be read or None, the deflated record holding it or None)."""
        if type(leaf) is _standins.TensorRef and leaf.kind == "dense":
            return self._dense(name, leaf)
        if isinstance(leaf, _standins.NumpyArray):
            a = leaf.array
            strides = None if a.flags.c_contiguous else a.strides
            return TensorInfo(a.dtype, a.shape, 0, a.nbytes, strides), None, None
        if isinstance(leaf, _standins.StorageRef):  # a bare storage: a 1-D tensor of its elements
            return self._dense(name, _standins.TensorRef(leaf, 0, (leaf.view_numel,), (1,)))
        return self._listed_only(name, leaf), leaf.note, None

    def _dense(self, name: str, ref: _standins.TensorRef) -> tuple[TensorInfo, str | None, _zip.ZipMember | None]:
        """A tensor over a storage: its view checked against the storage's bytes."""
        storage = ref.storage
        if type(storage) is not _standins.StorageRef:
            raise self.fail(name, f"its storage is {_standins.short_repr(storage)}, not a torch storage")
        torch_dtype = storage.dtype if ref.dtype is None else self._dtype(name, ref)
        offset, size, stride = ref.offset, ref.size, ref.stride
        if type(offset) is not int or type(size) is not tuple or type(stride) is not tuple:
            offset, size, stride = self._geometry(name, ref)
        numel, last, contiguous = _extent(size, stride, offset)
        if numel < 0:  # a dimension that is not a non-negative int: say which
            self._geometry(name, ref)
            raise self.fail(name, f"malformed view (offset {_standins.short_repr(offset)}, size "
                                  f"{_standins.short_repr(size)}, stride {_standins.short_repr(stride)})")
        span = self._spans.get(id(storage)) or self._span(name, storage)
        size_of, storage_size = ITEMSIZES[torch_dtype], ITEMSIZES[storage.dtype]
        start = span.offset + storage.view_offset * storage_size
        if numel and (last + 1) * size_of > storage.view_numel * storage_size:
            raise self.fail(name, f"view (offset {offset:,}, size {size}, stride {stride}) reaches element {last:,} "
                                  f"of a {storage.view_numel * storage_size // size_of:,}-element storage "
                                  f"{storage.key!r}")
        if numel * size_of > _MAX_VIEW_BYTES:  # inside its storage, yet (stride 0: broadcast) of any size
            raise self.fail(name, f"view of {numel:,} elements (size {size}, stride {stride}) is too large for an "
                                  f"array ({_MAX_VIEW_BYTES:,} bytes at most)")
        if torch_dtype in _PLAIN and not ref.metadata and not self.big:  # the common case
            dtype = NUMPY_DTYPES[torch_dtype]
            strides = None if contiguous else tuple(s * size_of for s in stride)
            return _new_info((dtype, size, start + offset * size_of if numel else start, numel * size_of, strides,
                              None)), None, span.record
        info = self._info(torch_dtype, size, stride, start + offset * size_of if numel else start, numel * size_of)
        return info, self._unreadable_reason(torch_dtype, ref), span.record

    def _info(self, torch_dtype: str, size: tuple, stride: tuple, offset: int, nbytes: int) -> TensorInfo:
        dtype = NUMPY_DTYPES.get(torch_dtype) or np.dtype(f"V{itemsize(torch_dtype)}")
        if self.big and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">")
        if torch_dtype == "float4_e2m1fn_x2":  # listed as fp4 elements, as safetensors does
            return _new_info((dtype, size[:-1] + (2 * size[-1],) if size else (2,), offset, nbytes, None, None))
        if _contiguous(size, stride):
            return _new_info((dtype, size, offset, nbytes, None, None))
        return _new_info((dtype, size, offset, nbytes, tuple(s * dtype.itemsize for s in stride), None))

    def _unreadable_reason(self, torch_dtype: str, ref: _standins.TensorRef) -> str | None:
        if torch_dtype not in NUMPY_DTYPES:
            return f"torch dtype {torch_dtype} has no numpy equivalent; convert it in torch before saving"
        if torch_dtype in QUANTIZED_DTYPES:
            return f"quantized tensor ({torch_dtype}); dequantize it in torch (.dequantize()) before saving"
        if torch_dtype == "float4_e2m1fn_x2" and not _contiguous(_ints(ref.size) or (), _ints(ref.stride) or ()):
            return "non-contiguous float4_e2m1fn_x2 tensor; make it contiguous in torch before saving"
        flags = ref.metadata if isinstance(ref.metadata, dict) else {}
        if flags.get("conj") or flags.get("neg"):
            return "tensor has its conjugate/negative bit set; call .resolve_conj()/.resolve_neg() before saving"
        return None

    def _dtype(self, name: str, ref: _standins.TensorRef) -> str:
        if not isinstance(ref.dtype, _standins.Token) or ref.dtype.kind != "dtype":
            raise self.fail(name, f"dtype {_standins.short_repr(ref.dtype)} is not a torch dtype")
        return ref.dtype.value

    def _geometry(self, name: str, ref: _standins.TensorRef) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        offset, size, stride = ref.offset, _ints(ref.size), _ints(ref.stride)
        if type(offset) is not int or size is None or stride is None:
            raise self.fail(name, f"offset {_standins.short_repr(offset)}, size {_standins.short_repr(ref.size)} and "
                                  f"stride {_standins.short_repr(ref.stride)} must be an int and tuples of ints")
        if len(size) != len(stride) or len(size) > MAX_NDIM:
            raise self.fail(name, f"size {_standins.short_repr(size)} and stride {_standins.short_repr(stride)} must "
                                  f"have the same length, at most {MAX_NDIM}")
        if max(map(abs, (offset, *size, *stride))) >= _HUGE:  # not a tensor's; such a number may not print
            raise self.fail(name, f"offset, size or stride beyond 256 bits (offset {_standins.short_repr(offset)}, "
                                  f"size {_standins.short_repr(size)}, stride {_standins.short_repr(stride)})")
        if offset < 0 or min(size, default=0) < 0 or min(stride, default=0) < 0:
            raise self.fail(name, f"negative offset, size or stride (offset {offset}, size {size}, stride {stride})")
        return offset, size, stride

    def _span(self, name: str, storage: _standins.StorageRef) -> Span:
        try:
            span = self.container.locate(storage)
        except CorruptFileError as e:
            raise self.fail(name, e.message) from None
        self._spans[id(storage)] = span
        return span

    def _listed_only(self, name: str, ref: _standins.TensorRef) -> TensorInfo:
        """Quantized/sparse/meta/other tensors: shape and dtype, no readable bytes."""
        if ref.kind == "quantized":
            info, _, _ = self._dense(name, ref)
            return info
        size = _ints(ref.size)
        if size is None or len(size) > MAX_NDIM or min(size, default=0) < 0:
            raise self.fail(name, f"size {_standins.short_repr(ref.size)} is not a tuple of non-negative ints")
        torch_dtype = ref.dtype.value if isinstance(ref.dtype, _standins.Token) and ref.dtype.kind == "dtype" else (
            ref.dtype if isinstance(ref.dtype, str) else "uint8")
        if torch_dtype not in ITEMSIZES:
            raise self.fail(name, f"dtype {_standins.short_repr(ref.dtype)} is not a torch dtype")
        dtype = NUMPY_DTYPES.get(torch_dtype) or np.dtype(f"V{itemsize(torch_dtype)}")
        return TensorInfo(dtype, size, 0, 0)


def _ints(value: Any) -> tuple[int, ...] | None:
    """`value` as a tuple when it is a tuple or list of ints (bools and floats are not), else None."""
    if type(value) is not tuple:
        if not isinstance(value, (tuple, list)):
            return None
        value = tuple(value)
    for v in value:
        if type(v) is not int:
            return None
    return value


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """C-contiguous: each stride is the product of the later sizes (size-1 dims don't matter)."""
    expected = 1
    for d, s in zip(reversed(size), reversed(stride), strict=False):
        if d == 0:
            return True
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _extent(size: tuple, stride: tuple, offset: int) -> tuple[int, int, bool]:
    """(numel, index of the last element, C-contiguous) of a view — or numel -1 when a size or
    stride is not a non-negative int below `_HUGE`, or their lengths differ (the caller reports it)."""
    if len(size) != len(stride) or len(size) > MAX_NDIM or not 0 <= offset < _HUGE:
        return -1, 0, False
    numel, last, expected, contiguous = 1, offset, 1, True
    for d, s in zip(reversed(size), reversed(stride), strict=False):
        if type(d) is not int or type(s) is not int or not (0 <= d < _HUGE and 0 <= s < _HUGE):
            return -1, 0, False
        if d != 1 and s != expected:
            contiguous = False
        numel *= d
        expected *= d
        last += (d - 1) * s
    return numel, last, contiguous or numel == 0
