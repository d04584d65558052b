"""The container layer: the zip, legacy raw-pickle and tar layouts of a PyTorch checkpoint (the
reader's module docstring is their spec), each read into its unpickled root object and where its
storages' bytes lie. `.stored_pickles` finds the pickles a file holds (what `weightio scan` inspects).
"""

from __future__ import annotations

import functools
import struct
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._remote import BLOCK
from ...errors import CorruptFileError, FormatError, UnsafePickleError
from ...limits import Limits, exceeded
from ...limits import current as current_limits
from .. import _zip
from ..base import MAX_NDIM, is_remote
from . import ranged, tar, unpickler
from .inert import Token
from .placeholders import module_class
from .refs import StorageRef, TensorRef, short_repr
from .torch_dtypes import ITEMSIZES, itemsize

if TYPE_CHECKING:
    from ..base import AnyFile

__all__ = ["Container", "MAGIC_NUMBER", "PROTOCOL_VERSION", "Span", "container_kind", "open_container"]

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001  # the raw-pickle format's; the tar format wrote 1000 in sys_info
MAX_STACKED = 64  # pickles `pickles` looks for back to back in one plain pickle file
MAX_FORMAT_VERSION = 10  # torch's kMaxSupportedFileFormatVersion (caffe2/serialize/versions.h)
_MAX_KEY = 256  # characters of a storage key or location (torch writes a few)
_I64 = struct.Struct("<q")
_TENSOR_HEADER = struct.Struct("<ii")  # ndim, padding (the legacy tar's int64 ndim, read as two int32)
_TAR_WINDOW = 512  # a remote tar's entry pickles are a few dozen bytes, between storages' data


class Span(NamedTuple):
    """Where a storage's bytes are: ``[offset, offset + nbytes)`` of the file mapping, or of the
    inflated bytes of `record` when that zip record is deflated."""

    offset: int
    nbytes: int
    record: _zip.ZipMember | None = None


_new_span = functools.partial(tuple.__new__, Span)


class Container:
    """One checkpoint file's structure: its unpickled root object and where storages live.

    Attributes:
        kind: ``"zip"``, ``"legacy"``, ``"tar"`` or ``"pickle"``.
        root: the unpickled object (stand-ins from `.allowlist`).
        byteorder: ``"little"`` or ``"big"``.
        pickle_bytes: total size of the pickles read (bounds the flattening work).
        pickles: (label, bytes) of every pickle in the file, for `weightio.safety.scan`.
        check_crc: whether records' CRC-32s are checked (False: a zip written without any).
    """

    kind = "pickle"
    check_crc = True

    def __init__(self, file: AnyFile, limits: Limits, pickles: list[tuple[str, bytes]] | None = None) -> None:
        self.file = file
        self.path = file.path
        self.limits = limits
        self.root: Any = None
        self.byteorder = "little"
        self.pickle_bytes = 0
        self.pickles: list[tuple[str, bytes]] = [] if pickles is None else pickles
        self.storages: dict[str, StorageRef] = {}
        self._empty_as: dict[tuple[str, str], StorageRef] = {}  # an empty storage's other dtypes

    def locate(self, storage: StorageRef) -> Span:
        """The bytes of `storage`; `CorruptFileError` (without tensor name) when they are missing."""
        raise CorruptFileError(f"refers to storage {storage.key!r}, but a plain pickle holds no storages")

    def _fail(self, message: str) -> CorruptFileError:
        return CorruptFileError(message, path=self.path)

    def _storage(self, key: Any, storage_class: Any, numel: Any, location: Any) -> StorageRef:
        """A storage reference from a persistent id, checked, and the same object for the same key."""
        if not isinstance(storage_class, Token) or storage_class.kind != "storage":
            raise self._fail(f"storage {short_repr(key)}: {short_repr(storage_class)} is not a "
                             "torch storage class")
        if not isinstance(key, str) or not 0 < len(key) <= _MAX_KEY or not key.isprintable():
            raise self._fail(f"storage key {short_repr(key)} is not a short printable string")
        if not isinstance(location, str) or len(location) > _MAX_KEY:
            raise self._fail(f"storage {key!r}: location {short_repr(location)} is not a short string")
        dtype = storage_class.value
        if type(numel) is not int or numel < 0 or (numel * ITEMSIZES[dtype] > self.file.size
                                                   and numel * ITEMSIZES[dtype] > self.largest_storage()):
            raise self._fail(f"storage {key!r}: {short_repr(numel)} elements of {dtype} cannot fit in a "
                             f"{self.file.size:,}-byte file")
        known = self.storages.get(key)
        if known is None:
            known = self.storages[key] = StorageRef(key, dtype, numel)
        elif (known.dtype, known.numel) != (dtype, numel):
            if known.numel == numel == 0:  # torch gives each reference to an empty storage its own dtype
                return self._empty_as.setdefault((key, dtype), StorageRef(key, dtype, 0))
            raise self._fail(f"storage {key!r} is declared twice: {known.numel:,} x {known.dtype}, then "
                             f"{numel:,} x {dtype}")
        return known

    def largest_storage(self) -> int:
        """The most bytes a storage's data can hold beyond the file's own size (deflated records)."""
        return 0

    def _count_pickle_bytes(self, n: int, what: str) -> None:
        """Pickles are the header of a PyTorch file: their total size is bounded by limits.header_bytes."""
        self.pickle_bytes += n
        if self.pickle_bytes > self.limits.header_bytes:
            raise exceeded(f"{what}: pickled bytes", self.pickle_bytes, "header_bytes", self.limits.header_bytes,
                           path=self.path)

    def _unpickle(self, data: bytes, what: str, *, checked: bool = False, text8: list[int] | None = None) -> Any:
        self._count_pickle_bytes(len(data), what)
        return unpickler.load(data, self._persistent_load, path=self.path, what=what, checked=checked,
                              limits=self.limits, text8=text8)

    def _check_sys_info(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise self._fail(f"legacy sys_info is {short_repr(value)}, not a dict")

    def _persistent_load(self, pid: Any) -> Any:
        raise self._fail("the pickle refers to a persistent object (a torch storage?), but this is not a torch "
                         "checkpoint that stores any")


class ZipContainer(Container):
    """``torch.save``'s zip format, whose records are found the way torch finds them.

    torch's reader (miniz) takes the archive prefix from the *first* central-directory entry (up to
    its first ``/``), refuses an archive with any member outside that prefix (``torch.load`` lists
    every record), and looks each record up by ``prefix + name`` with ASCII letters folded. The
    same rule here, over the raw name bytes, with names that fold equal refused (torch would read
    whichever its sorted index meets first), reads the same record torch reads or refuses the file.
    """

    kind = "zip"

    def __init__(self, file: AnyFile, members: list[_zip.ZipMember], limits: Limits) -> None:
        super().__init__(file, limits)
        self._index(members)
        self.root = self._unpickle(self.pickles[0][1], self.pickles[0][0])
        self._check_prefix(members)

    def _index(self, members: list[_zip.ZipMember]) -> None:
        """Find the records as torch does, check the small ones, and read ``data.pkl`` (into `pickles`)."""
        file = self.file
        for first, other in _zip.case_collisions(members)[:1]:
            raise CorruptFileError(f"zip archive: members {first!r} and {other!r} have the same name when case is "
                                   "ignored; torch.load looks records up without regard to case, so it could read "
                                   "the other one", path=file.path)
        self.members = members
        self._largest: int | None = None
        self.check_crc = not _zip.crc_omitted(members)  # torch under set_crc32_options(False) writes none
        self.raw_prefix = _archive_prefix(file, members)
        self.prefix = self.raw_prefix.decode("utf-8", "replace")
        self.records = {m.raw_name.lower(): m for m in members}
        self._data_prefix = self.raw_prefix + b"data/"  # a storage's record: `record` of data/<key>
        pickle_record = self.record("data.pkl")
        if pickle_record is None:
            raise CorruptFileError(f"a PyTorch zip checkpoint has a {self.prefix}data.pkl record (torch looks it up "
                                   "without regard to case); there is none", path=file.path)
        self.byteorder = self._byteorder()
        self._check_version()
        self.pickles = [(pickle_record.name, self._read_record(pickle_record, self.limits.header_bytes))]

    def _check_prefix(self, members: list[_zip.ZipMember]) -> None:
        """Every member lies under the prefix (after the pickle, whose refusal says more)."""
        outside = next((m for m in members if not m.raw_name.startswith(self.raw_prefix)), None)
        if outside is not None:
            raise self._fail(f"member {outside.name!r} is not under the archive prefix {self.prefix!r} of the first "
                             "member (torch.load refuses such archives)")

    def record(self, name: str) -> _zip.ZipMember | None:
        """The member torch reads for record `name` (``data.pkl``, ``data/0`` …), or None."""
        return self.records.get((self.raw_prefix + name.encode("utf-8", "surrogatepass")).lower())

    def _read_record(self, record: _zip.ZipMember, limit: int) -> bytes:
        return _zip.read_member(self.file, record, limit, what="record", check_crc=self.check_crc)

    def largest_storage(self) -> int:
        """A deflated record may inflate beyond the file's size: as far as its declared size, when
        deflate could produce that much (the record's exact size is checked by `locate`)."""
        if self._largest is None:
            self._largest = _zip.largest_inflated(self.members)
        return self._largest

    def _small_record(self, name: str) -> bytes | None:
        record = self.record(name)
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
        raw = self._small_record(".data/version")  # torch's order: .data/version, then version
        if raw is None:
            raw = self._small_record("version")
        if raw is None:
            return
        text = raw.strip()
        if not text.isdigit() or not 1 <= int(text) <= MAX_FORMAT_VERSION:
            raise FormatError(f"PyTorch zip format version {raw!r} is not supported (1 to {MAX_FORMAT_VERSION} are)",
                              path=self.path)

    def _persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage":
            raise self._fail(f"persistent id {short_repr(pid)} is not ('storage', class, key, location, "
                             "numel)")
        _, storage_class, key, location, numel = pid
        return self._storage(key, storage_class, numel, location)

    def locate(self, storage: StorageRef) -> Span:
        key = storage.key
        if key.endswith(_DEBUG_SUFFIX):  # torch's reader answers such records with no bytes
            raise self._fail(f"its storage key {key!r} ends in {_DEBUG_SUFFIX!r}, which torch never reads")
        record = self.records.get((self._data_prefix + key.encode("utf-8", "surrogatepass")).lower())
        if record is None:
            raise self._fail(f"its storage {key!r} has no record {self.prefix + 'data/' + key!r} in the archive")
        nbytes = storage.numel * ITEMSIZES[storage.dtype]
        if record.size != nbytes:
            raise self._fail(f"its storage {storage.key!r} is declared as {storage.numel:,} x {storage.dtype} = "
                             f"{nbytes:,} bytes but record {record.name!r} holds {record.size:,}")
        if record.method == _zip.METHOD_STORED:
            return _new_span((record.data_offset, nbytes, None))  # (one per storage: no Python __new__)
        return Span(0, nbytes, record)


_DEBUG_SUFFIX = ".debug_pkl"  # records torch's reader skips unless asked for debug symbols


def _archive_prefix(file: AnyFile, members: list[_zip.ZipMember]) -> bytes:
    """torch's archive prefix (``archive/``): the first central-directory entry's name up to its
    first ``/``. TorchScript archives are refused."""
    first = members[0].raw_name if members else b""
    if b"/" not in first:
        raise CorruptFileError(f"the first zip member {members[0].name if members else None!r} is not in a folder; "
                               "torch names a checkpoint's records <prefix>/<record> after it", path=file.path)
    prefix = first[: first.index(b"/") + 1]
    if any(m.raw_name.lower() == (prefix + b"constants.pkl").lower() for m in members):  # torch.load: TorchScript
        raise FormatError("is a TorchScript archive (torch.jit.save); TorchScript holds code and is not "
                          "loaded — save the module's state_dict() with torch.save instead", path=file.path)
    return prefix


class LegacyContainer(Container):
    """The raw-pickle format: five stacked pickles, then the storages."""

    kind = "legacy"

    def __init__(self, file: AnyFile, first: bytes, limits: Limits) -> None:
        super().__init__(file, limits)
        self._views: dict[str, tuple[str, int, int]] = {}
        self.pickles = [("pickle 1 (magic number)", first)]
        pos = len(first)
        for label, check in (("pickle 2 (protocol version)", self._check_protocol),
                             ("pickle 3 (sys_info)", self._check_sys_info)):
            value, pos = self._next(pos, label)
            check(value)
        self.root, pos = self._next(pos, "pickle 4 (the checkpoint)")
        keys, pos = self._next(pos, "pickle 5 (storage keys)")
        self._spans = self._layout(keys, pos)

    def _next(self, pos: int, label: str) -> tuple[Any, int]:
        end, raw, lexed = ranged.lex_pickle(self.file, pos, self.file.size, what=label, limits=self.limits)
        self.pickles.append((label, raw))
        return self._unpickle(raw, label, checked=True, text8=lexed.text8), end

    def _check_protocol(self, value: Any) -> None:
        if value != PROTOCOL_VERSION:
            raise FormatError(f"legacy torch.save protocol version {short_repr(value)} is not supported "
                              f"({PROTOCOL_VERSION} is)", path=self.path)

    def _persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "module":
            if unpickler.placeholder_mode():  # ("module", class, source file, source): the class, a placeholder
                return module_class(pid, self._fail)
            raise UnsafePickleError("the checkpoint pickles a whole torch.nn.Module (torch.save(model)), which is "
                                    "code; save model.state_dict() instead")
        if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
            raise self._fail(f"persistent id {short_repr(pid)} is not ('storage', class, key, location, "
                             "numel, view)")
        root = self._storage(pid[2], pid[1], pid[4], pid[3])
        view = pid[5] if len(pid) == 6 else None
        return root if view is None else self._view(root, view)

    def _view(self, root: StorageRef, view: Any) -> StorageRef:
        if (not isinstance(view, tuple) or len(view) != 3 or not isinstance(view[0], str)
                or not all(type(v) is int and v >= 0 for v in view[1:])):
            raise self._fail(f"storage view {short_repr(view)} is not (key, offset, numel)")
        key, offset, numel = view
        if offset + numel > root.numel:
            raise self._fail(f"storage view {key!r} (elements {offset:,}..{offset + numel:,}) lies outside storage "
                             f"{root.key!r} ({root.numel:,} elements)")
        return StorageRef(root.key, root.dtype, root.numel, offset, numel)

    def _layout(self, keys: Any, pos: int) -> dict[str, Span]:
        """Walk the storages after the pickles: each an int64 count then its data, nothing after."""
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
            raise self._fail("the legacy storage key list is not a list of distinct strings")
        spans = {}
        counts = self._prefetch_counts(keys, pos)
        for key in keys:
            storage = self.storages.get(key)
            if storage is None:
                raise self._fail(f"storage {key!r} is listed but no tensor refers to it")
            (count,) = counts[pos] if pos in counts else self.file.unpack(_I64, pos,
                                                                            f"the element count of storage {key!r}")
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

    def _prefetch_counts(self, keys: list[str], pos: int) -> dict[int, tuple[int]]:
        """A remote file's storage element counts, where the declared sizes place them, fetched in one
        batch (exact ranges: no storage data); `_layout` checks each. Empty for a local file."""
        if not is_remote(self.file):
            return {}
        runs = []
        for key in keys:
            storage = self.storages.get(key)
            nbytes = storage.numel * itemsize(storage.dtype) if storage is not None else self.file.size
            if pos + 8 + nbytes > self.file.size:
                break
            runs.append((pos, 8))
            pos += 8 + nbytes
        first = {at: self.file.unpack(_I64, at, "a storage's element count") for at, _ in runs if at + 8 <= BLOCK}
        runs = [run for run in runs if run[0] not in first]  # (sniffing fetched the first block)
        raw = self.file.gather(runs, "the storages' element counts").tobytes() if runs else b""
        return first | {at: _I64.unpack_from(raw, 8 * k) for k, (at, _) in enumerate(runs)}

    def locate(self, storage: StorageRef) -> Span:
        span = self._spans.get(storage.key)
        if span is None:
            raise self._fail(f"its storage {storage.key!r} is not in the file's storage list")
        return span


class TarContainer(Container):
    """The tar format of torch 0.1.x: storages, tensors and the object in separate members."""

    kind = "tar"
    _MEMBERS = ("sys_info", "pickle", "tensors", "storages")

    def __init__(self, file: AnyFile, limits: Limits, pickles: list[tuple[str, bytes]] | None = None) -> None:
        super().__init__(file, limits, pickles)  # `pickles` keeps what was read when a later step fails
        members = {m.name: m for m in tar.read_members(file)}
        if sorted(members) != sorted(self._MEMBERS):
            raise self._fail(f"a legacy torch tar checkpoint has members {', '.join(self._MEMBERS)}; found "
                             f"{', '.join(map(repr, members)) or 'none'}")
        self._spans: dict[str, Span] = {}
        self._tensors: dict[int, TensorRef] = {}
        self._check_sys_info(self._member_pickle(members["sys_info"]))
        self._read_storages(members["storages"])
        self._read_tensors(members["tensors"])
        self.root = self._member_pickle(members["pickle"], self._tensor_by_id)

    def _stream(self, member: tar.TarMember, pos: int, label: str) -> tuple[Any, int]:
        """The pickle at `pos` inside `member` (which interleaves pickles and raw data: read exactly)."""
        end, raw, lexed = ranged.lex_pickle(self.file, pos, member.data_offset + member.size, what=label,
                                            limits=self.limits, exact=True, window=_TAR_WINDOW)
        self.pickles.append((label, raw))
        self._count_pickle_bytes(len(raw), label)
        return unpickler.load(raw, self._no_persistent, path=self.path, what=label, checked=True,
                              limits=self.limits, text8=lexed.text8), end

    def _member_pickle(self, member: tar.TarMember, persistent: Any = None) -> Any:
        label = f"member {member.name!r}"
        self._count_pickle_bytes(member.size, label)
        raw = ranged.read(self.file, member.data_offset, member.size, label, exact=True)
        self.pickles.append((label, raw))
        return unpickler.load(raw, persistent or self._no_persistent, path=self.path, what=label, limits=self.limits)

    def _no_persistent(self, pid: Any) -> Any:
        raise self._fail(f"unexpected persistent id {short_repr(pid)} in a tar member's pickle")

    def _count(self, value: Any, what: str, limit: int) -> int:
        if type(value) is not int or not 0 <= value <= limit:
            raise self._fail(f"{what} {short_repr(value)} is not a count that fits the member")
        return value

    def _read_storages(self, member: tar.TarMember) -> None:
        end = member.data_offset + member.size
        count, pos = self._stream(member, member.data_offset, "member 'storages' (count)")
        for i in range(self._count(count, "storage count", member.size)):
            entry, pos = self._stream(member, pos, f"member 'storages' (storage {i})")
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise self._fail(f"tar storage entry {short_repr(entry)} is not (key, location, class)")
            key, location, storage_class = self._key(entry[0], "tar storage key"), entry[1], entry[2]
            (numel,) = _I64.unpack(ranged.read(self.file, pos, 8, "a storage's element count", exact=True)) \
                if pos + 8 <= end else (-1,)
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
        raise self._fail(f"{what} {short_repr(value)} is not a small int or a short string")

    def _read_views(self, views: Any) -> None:
        if not isinstance(views, list):
            raise self._fail("tar storage views are not a list")
        for view in views:
            if not isinstance(view, tuple) or len(view) != 4 or not all(type(v) is int for v in view):
                raise self._fail(f"tar storage view {short_repr(view)} is not (key, root, offset, numel)")
            key, root_key = self._key(view[0], "tar storage view key"), self._key(view[1], "tar storage view root")
            offset, numel = view[2], view[3]
            root = self.storages.get(root_key)
            if root is None or offset < 0 or numel < 0 or offset + numel > root.numel:
                raise self._fail(f"tar storage view {key} of {root_key} lies outside its root storage")
            self.storages[key] = StorageRef(root.key, root.dtype, root.numel, offset, numel)

    def _read_tensors(self, member: tar.TarMember) -> None:
        end = member.data_offset + member.size
        count, pos = self._stream(member, member.data_offset, "member 'tensors' (count)")
        for i in range(self._count(count, "tensor count", member.size)):
            entry, pos = self._stream(member, pos, f"member 'tensors' (tensor {i})")
            if not isinstance(entry, tuple) or len(entry) != 3 or type(entry[0]) is not int:
                raise self._fail(f"tar tensor entry {short_repr(entry)} is not (key, storage key, class)")
            self._key(entry[0], "tar tensor key")
            ref, pos = self._tensor_header(entry, pos, end)
            self._tensors[entry[0]] = ref
        if pos != end:
            raise self._fail(f"{end - pos:,} bytes follow the tensors in member 'tensors'")

    def _tensor_header(self, entry: tuple, pos: int, end: int) -> tuple[TensorRef, int]:
        key, storage_key, _ = entry
        if pos + 8 > end:
            raise self._fail(f"tar tensor {key}: its header runs past the end of member 'tensors'")
        ndim, _ = _TENSOR_HEADER.unpack(ranged.read(self.file, pos, 8, "a tensor header", exact=True))
        if not 0 <= ndim <= MAX_NDIM or pos + 8 + 16 * ndim + 8 > end:
            raise self._fail(f"tar tensor {key}: ndim {ndim} is out of range or runs past member 'tensors'")
        fields = struct.unpack(f"<{2 * ndim + 1}q", ranged.read(self.file, pos + 8, 16 * ndim + 8, "a tensor header",
                                                               exact=True))
        storage = self.storages.get(self._key(storage_key, f"tar tensor {key}: storage key"))
        ref = TensorRef(storage if storage is not None else f"<missing storage {storage_key}>",
                                fields[-1], fields[:ndim], fields[ndim:2 * ndim])
        return ref, pos + 8 + 16 * ndim + 8

    def _tensor_by_id(self, pid: Any) -> Any:
        try:
            key = int(pid) if isinstance(pid, (str, int)) and len(str(pid)) <= 24 else None
        except ValueError:
            key = None
        if isinstance(pid, tuple):
            if unpickler.placeholder_mode() and pid and pid[0] == "module":
                return module_class(pid, self._fail)
            raise UnsafePickleError("the checkpoint pickles a whole torch.nn.Module (torch.save(model)), which is "
                                    "code; save model.state_dict() instead", path=self.path)
        if key is None or (key not in self._tensors and str(key) not in self.storages):
            raise self._fail(f"persistent id {short_repr(pid)} names no tensor or storage of the archive")
        return self._tensors[key] if key in self._tensors else self.storages[str(key)]

    def locate(self, storage: StorageRef) -> Span:
        span = self._spans.get(storage.key)
        if span is None:
            raise self._fail(f"its storage {storage.key!r} is not in member 'storages'")
        return span


def open_container(file: AnyFile, limits: Limits | None = None) -> Container:
    """Parse the structure of a PyTorch checkpoint file (any of the three formats, or a plain
    pickle) and unpickle its object, within `limits` (the current `weightio.limits` by default)."""
    limits = limits or current_limits()
    head = file.read(0, min(file.size, 512), "the first bytes")
    kind = container_kind(head)
    if kind == "zip":
        return ZipContainer(file, _zip.read_members(file, limits), limits)
    if kind == "tar":
        return TarContainer(file, limits)
    end, raw, lexed = ranged.lex_pickle(file, 0, file.size, what="pickle 1", limits=limits)
    container = Container(file, limits)
    first = container._unpickle(raw, "pickle 1", checked=True, text8=lexed.text8)
    if type(first) is int and first == MAGIC_NUMBER:
        return LegacyContainer(file, raw, limits)
    if end != file.size:
        raise CorruptFileError(f"{file.size - end:,} bytes follow the pickle's STOP opcode (stacked pickles or a "
                               "polyglot file; a plain pickle holds one object)", path=file.path)
    container.root = first
    container.pickles = [("pickle 1", raw)]
    return container


def container_kind(head: bytes) -> str:
    """``"zip"``, ``"tar"`` or ``"pickle"``, decided as ``torch.load`` decides: a zip only when the
    file starts with a local header, then whatever ``tarfile`` opens is a tar (never a raw pickle)."""
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if tar.opens_as_tar(head):
        return "tar"
    if head.startswith(b"PK\x05\x06"):  # an empty zip: refused as a checkpoint by the zip reader
        return "zip"
    return "pickle"
