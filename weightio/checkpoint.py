"""`Checkpoint`: one or more validated readers seen as one read-only mapping of tensors.

`open_checkpoint` accepts a file (format sniffed from its bytes) or a directory laid out the
way Hugging Face writes models: a sharded index (``model.safetensors.index.json``, whose
``weight_map`` routes each tensor to a shard) or a single weight file (``model.safetensors``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import ItemsView, Iterator, Mapping, Sequence, ValuesView
from types import TracebackType
from typing import Any, BinaryIO

from . import layout
from ._failures import is_url
from ._gc import collector_paused
from ._io import MappedFile
from ._native import speedups
from .errors import (
    DOWNLOAD_ADVICE,
    STORAGE_OPTIONS_ADVICE,
    Advice,
    CorruptFileError,
    FormatError,
    InputError,
    TensorNotFoundError,
    UsageError,
)
from .formats import open_file
from .formats.base import Reader, TensorInfo, using_unknown_globals
from .limits import Limits, using
from .limits import current as current_limits
from .view import TensorView

__all__ = ["Checkpoint", "open_checkpoint", "open_readers", "open_sharded_set"]

_place_c = getattr(speedups, "place", None)


class Checkpoint(Mapping[str, TensorView]):
    """A read-only ``Mapping[str, TensorView]`` over one checkpoint (one file or a sharded set).

    Attributes:
        path: what was opened (file or directory).
        format: ``"safetensors"``, ``"pytorch"``, ``"gguf"``, ``"ggml"``, ``"npz"`` or ``"npy"``
            (for a sharded directory, the shards' format).
        metadata: the file's own metadata (safetensors ``__metadata__``, GGUF key/values, …);
            for a sharded directory, the shards' metadata merged, plus the index's ``metadata``.

    Example:
        >>> with weightio.open("model.safetensors") as ckpt:      # doctest: +SKIP
        ...     w = ckpt["encoder.weight"].numpy()
    """

    def __init__(self, readers: Sequence[Reader], *, path: str, metadata: dict[str, Any] | None = None) -> None:
        if not readers:
            raise FormatError("no weight files to open", path=path)
        self.path = path
        self._readers = list(readers)
        self.format = self._readers[0].format
        infos: dict[str, TensorInfo] = {}
        merged: dict[str, Any] = {}
        for i, reader in enumerate(self._readers):  # whole dicts at a time: 100k names cost a few C-level passes
            for key, value in reader.metadata.items():
                merged.setdefault(key, value)
            before = len(infos)
            infos.update(reader.tensors)
            if len(infos) != before + len(reader.tensors):
                earlier = self._readers[:i]
                name = next(n for n in reader.tensors if any(n in r.tensors for r in earlier))
                first = next(r for r in earlier if name in r.tensors)
                raise CorruptFileError(f"is stored in two files: {first.path} and {reader.path}", path=path,
                                       tensor=name)
        for key, value in (metadata or {}).items():
            merged.setdefault(key, value)
        self.metadata = merged
        self._infos = infos
        # name -> (info, index of its reader, serial: its place in this map), filled on the first
        # lookup by name of a sharded checkpoint or `VarBuilder.get` (`_placed_triple`)
        self._placed: dict[str, tuple[TensorInfo, int, int]] = {}
        self._only = self._readers[0] if len(self._readers) == 1 else None

    # ------------------------------------------------------------------ Mapping
    def __getitem__(self, name: str) -> TensorView:
        try:
            info = self._infos[name]
        except (KeyError, TypeError):
            raise TensorNotFoundError(name, self._infos, path=self.path) from None
        return self._view(name, info)

    def get(self, name: str, default: Any = None) -> Any:
        """The view of tensor `name`, or `default` (no error made, so no close names searched for)."""
        info = self._infos.get(name) if isinstance(name, str) else None
        return default if info is None else self._view(name, info)

    def _view(self, name: str, info: TensorInfo) -> TensorView:
        only = self._only
        if only is not None:
            return TensorView(only, name, info)
        placed = self._placed.get(name) or self._placed_triple(name)
        return TensorView(self._readers[placed[1]], name, info)

    def _placed_triple(self, name: str) -> tuple[TensorInfo, int, int]:
        """`_placed[name]`, the map filled first if it is empty (KeyError: no such tensor)."""
        return (self._placed or self._fill_placed())[name]  # (after the fill: another thread may have made it)

    def _fill_placed(self) -> dict[str, tuple[TensorInfo, int, int]]:
        """`_placed`, filled if it is empty.

        Opening and listing never need the map (`_views` walks the readers), and filling it is a
        pass over every name (~25 ms at 90k). It gives a name's info and reader in one lookup,
        where a request by name made two in tables of that size (`VarBuilder.get`'s short path:
        each a cache miss), and the name's serial (its place in the map, readers in order, each
        in its own order), by which `names.Usage` counts that path's requests in an array instead
        of a third table. Filled in one step (the C `place`, or one `dict.update`), so no thread
        sees it half-filled. The C `place` leaves its triples and the map untracked by the cyclic
        garbage collector, which would otherwise traverse 90k more objects at every full
        collection (measured: 16.5 -> 31.8 ms on DeepSeek-V3's layout)."""
        placed = self._placed
        if not placed and not (_place_c is not None and _place_c(placed, self._readers, TensorInfo)):
            built: dict[str, tuple[TensorInfo, int, int]] = {}
            serials = itertools.count()
            with collector_paused():  # (a triple a name, none in a cycle)
                for i, reader in enumerate(self._readers):
                    tensors = reader.tensors
                    built.update(zip(tensors, zip(tensors.values(), itertools.repeat(i), serials), strict=True))
                placed.update(built)
        return placed

    def items(self) -> ItemsView[str, TensorView]:
        """(name, view) of every tensor, in file order (the views made straight from the index)."""
        return CheckpointItems(self)

    def values(self) -> ValuesView[TensorView]:
        """The view of every tensor, in file order."""
        return CheckpointValues(self)

    def _views(self) -> Iterator[tuple[str, TensorView]]:
        # reader by reader: the order of `_infos`, which holds each reader's names in turn
        return itertools.chain.from_iterable(TensorView._each(r, r.tensors.items()) for r in self._readers)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def select(self, *patterns: str) -> list[str]:
        """The tensor names matching any of the glob `patterns`, in file order; every name when none.

        Patterns are `fnmatch` globs matched case-sensitively against the whole name
        (``"*.weight"``, ``"encoder.layer.[0-3].*"``).

        Example:
            >>> ckpt.select("*.weight", "lm_head.*")        # doctest: +SKIP
            ['encoder.weight', 'lm_head.weight', 'lm_head.bias']
        """
        if not patterns:
            return list(self._infos)
        from fnmatch import fnmatchcase  # (imports re, posixpath): only when filtering

        return [n for n in self._infos if any(fnmatchcase(n, p) for p in patterns)]

    # ------------------------------------------------------------------ facts
    @property
    def readers(self) -> tuple[Reader, ...]:
        """The per-file readers behind this checkpoint, in order (one per file)."""
        return tuple(self._readers)

    @property
    def files(self) -> list[str]:
        """The weight files behind this checkpoint, in order."""
        return [r.path for r in self._readers]

    @property
    def parameter_count(self) -> int:
        """Total number of elements over every tensor."""
        return sum(map(math.prod, (info.shape for info in self._infos.values())))

    @property
    def nbytes(self) -> int:
        """Total bytes of tensor data as stored."""
        return sum(info.nbytes for info in self._infos.values())

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} tensors"
        return f"<Checkpoint {self.path!r} {self.format}: {state}>"

    # ------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return all(r.file.closed for r in self._readers)

    def close(self) -> None:
        """Release the files. Arrays already returned stay valid; views read afterwards raise."""
        for reader in self._readers:
            reader.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class CheckpointItems(ItemsView[str, TensorView]):
    """`Checkpoint.items()`: the Mapping view, iterated without a lookup per name (~10% of listing)."""

    __slots__ = ()
    _mapping: Checkpoint

    def __iter__(self) -> Iterator[tuple[str, TensorView]]:
        return self._mapping._views()


class CheckpointValues(ValuesView[TensorView]):
    """`Checkpoint.values()`: the Mapping view, iterated without a lookup per name."""

    __slots__ = ()
    _mapping: Checkpoint

    def __iter__(self) -> Iterator[TensorView]:
        return (view for _, view in self._mapping._views())


# ----------------------------------------------------------------------------- opening

def open_checkpoint(path: str | bytes | os.PathLike[str] | BinaryIO, limits: Limits | None = None, *,
                    unknown_globals: str | None = None, storage_options: Mapping[str, Any] | None = None,
                    download: bool = False) -> Checkpoint:
    """Open a checkpoint file or model directory; see `weightio.open`.

    Args:
        limits: the `weightio.limits.Limits` every file is opened (and later read) under;
            the current ones (`weightio.limits.current`) when None.
        unknown_globals: ``"refuse"`` or ``"placeholder"`` for every pickle opened; None: the
            mode in force (`weightio.formats.base.using_unknown_globals`, else "refuse").
    """
    if unknown_globals is not None:
        with using_unknown_globals(unknown_globals):
            return open_checkpoint(path, limits, storage_options=storage_options, download=download)
    if limits is not None:
        with using(limits):
            return open_checkpoint(path, storage_options=storage_options, download=download)
    if not isinstance(path, (str, bytes, os.PathLike)):
        _check_local("a file object", storage_options, download)
        return _open_file_object(path)
    path = os.fsdecode(path)  # bytes paths too
    if is_url(path):
        from .remote import open_url  # imports fsspec or huggingface_hub: only for URLs

        opened = open_url(path, storage_options=storage_options, download=download)
        if opened.local is not None:
            return open_checkpoint(opened.local)
        if opened.sharded is not None:
            return open_sharded_set(opened.path, *opened.sharded[:3], opened.readers, opened.sharded[3])
        return open_readers(opened.path, opened.readers)
    _check_local(path, storage_options, download)
    if os.path.isdir(path):
        return _open_directory(path)
    if path.endswith(".index.json") and os.path.isfile(path):  # a sharded set, named by its index
        return _open_sharded(os.path.dirname(os.path.abspath(path)), path)
    if not os.path.exists(path):
        raise InputError("no such file or directory", path=path, errno=2)
    return _open_with_siblings(path, path)


_MAX_FOLDERS = 1000  # entries of a directory looked into for model folders


def _model_folders(path: str, names: list[str]) -> list[str]:
    """The folders directly under `path` that hold a model weightio would open (one level)."""
    found = []
    for name in sorted(names)[:_MAX_FOLDERS]:
        folder = os.path.join(path, name)
        if not os.path.isdir(folder):
            continue
        try:
            inside = [f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f))]
        except OSError:
            continue
        try:
            chosen = layout.choose(inside)
        except layout.Ambiguous:  # several candidate weight files: a model folder all the same
            chosen = name
        if chosen is not None:
            found.append(name)
    return found


def _check_local(path: str, storage_options: Mapping[str, Any] | None, download: bool) -> None:
    """Refuse the options that apply to URLs only."""
    if storage_options:
        raise UsageError("storage options apply to URLs only, such as https:// and s3://", path=path,
                         advice=STORAGE_OPTIONS_ADVICE)
    if download:
        raise UsageError("downloading into the Hugging Face cache applies to hf:// paths only", path=path,
                         advice=DOWNLOAD_ADVICE)


def _open_file_object(obj: Any) -> Checkpoint:
    """A file object with a real descriptor (``open(path, "rb")``, a temporary file): its file
    mapped through a duplicate of the descriptor, so closing the checkpoint leaves `obj` open.
    Named by ``obj.name`` when that is a str, else ``<fd N>``."""
    fileno = getattr(obj, "fileno", None)
    try:
        fd = fileno() if callable(fileno) else None
    except (OSError, ValueError):  # io.BytesIO: io.UnsupportedOperation, both; a closed file: ValueError
        fd = None
    if type(fd) is not int or fd < 0:
        what = "a closed file" if getattr(obj, "closed", False) is True else f"an object of type {type(obj).__name__}"
        raise UsageError(f"cannot open {what}: weightio.open takes a path (str, bytes or "
                         "os.PathLike), a URL, or a file object with a real file descriptor (fileno()), which it "
                         "maps; write in-memory bytes to a file first")
    name = getattr(obj, "name", None)
    path = name if isinstance(name, str) else f"<fd {fd}>"
    return open_readers(path, [open_file(MappedFile(path, fd=fd))])


def _open_directory(path: str) -> Checkpoint:
    try:
        with os.scandir(path) as entries:  # file types from the listing itself: no stat per file
            found = [(entry.name, _is_file(entry)) for entry in entries]
    except OSError as e:
        raise InputError(f"cannot list the directory: {e.strerror}", path=path, errno=e.errno) from None
    names = [name for name, _ in found]
    files = sorted(name for name, is_file in found if is_file)
    try:
        chosen = layout.choose(files)
    except layout.Ambiguous as e:
        raise FormatError(f"holds several candidate files ({e}); open one of them by path", path=path) from None
    if chosen is None:
        models = _model_folders(path, names)
        if models:
            shown = ", ".join(models[:8]) + (" …" if len(models) > 8 else "")
            first = os.path.join(path, models[0])
            raise FormatError(f"is a directory of model folders, not a model: {shown}", path=path,
                              advice=Advice(python=f"open one of them, e.g. {first!r}",
                                            cli=f"inspect one of them, e.g. weightio inspect {first}"))
        shown = ", ".join(files[:8]) + (" …" if len(files) > 8 else "") if files else "nothing"
        raise FormatError(f"is a directory with no weight files weightio recognises (found: {shown})", path=path)
    if chosen.endswith(".index.json"):
        return _open_sharded(path, os.path.join(path, chosen), set(files))
    return _open_with_siblings(path, os.path.join(path, chosen))


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:  # a link that cannot be followed
        return False


def _open_with_siblings(path: str, file: str) -> Checkpoint:
    """`file` and the other files of its set (the parts of a split GGUF model) as one checkpoint."""
    first = open_file(file)
    try:
        siblings = first.siblings()
    except BaseException:
        first.close()
        raise
    return open_readers(path, _open_files(siblings, opened=[first]))


def _open_sharded(directory: str, index_path: str, files: set[str] | None = None) -> Checkpoint:
    """The shards `index_path` lists (`files`: the directory's files, when already listed: a shard
    found there needs no stat; one that is not, in a subdirectory or spelt in another case on a
    case-insensitive filesystem, is looked up)."""
    weight_map, index_metadata = layout.read_index(index_path)
    shard_names = layout.shards(weight_map)
    for shard in shard_names:
        if not (files is not None and shard in files) and not os.path.isfile(os.path.join(directory, shard)):
            raise CorruptFileError(f"lists shard {shard!r}, which is missing", path=index_path)
    shard_of = shard_paths(directory, shard_names)
    readers = _open_files(list(shard_of))
    return open_sharded_set(directory, index_path, weight_map, index_metadata, readers, shard_of)


def shard_paths(directory: str, shards: list[str], paths: Any = os.path) -> dict[str, str]:
    """``paths.join(directory, shard)`` -> `shard`, for shard names `layout.read_index` let through
    (none absolute or with a drive), at a fifth of the joins' cost (a 191-shard model's were 3% of
    its open): one join makes the prefix (with "x", cut off: a join with "" leaves a UNC share's
    root without its separator)."""
    within = paths.join(directory, "x")[:-1]
    return {within + shard: shard for shard in shards}


def open_sharded_set(path: str, index_path: str, weight_map: dict[str, str], metadata: dict[str, Any],
                     readers: list[Reader], shard_of: dict[str, str]) -> Checkpoint:
    """One checkpoint over the opened shards of a sharded set, checked against its index's `weight_map`.

    Args:
        shard_of: each reader's ``path`` -> the shard name the index uses for it.

    Raises:
        CorruptFileError: a tensor the index maps to a shard that does not hold it (every reader
            is closed first).
    """
    checkpoint = open_readers(path, readers, metadata)
    held: dict[str, str] = {}
    for reader in checkpoint.readers:
        held.update(dict.fromkeys(reader.tensors, shard_of[reader.path]))
    if not weight_map.items() <= held.items():  # (in C; the loop below only finds the first culprit)
        for name, shard in weight_map.items():
            if held.get(name) != shard:
                found = f"; it is in {held[name]!r}" if name in held else ""
                checkpoint.close()
                raise CorruptFileError(f"maps tensor {name!r} to {shard!r}, which does not hold it{found}",
                                       path=index_path)
    return checkpoint


def open_readers(path: str, readers: list[Reader], metadata: dict[str, Any] | None = None) -> Checkpoint:
    """A checkpoint over readers already open; every one is closed if it cannot be made."""
    with _closed_on_error(readers):
        return Checkpoint(readers, path=path, metadata=metadata)


def _open_files(files: list[str], *, opened: list[Reader] | None = None) -> list[Reader]:
    """`opened` readers plus one per file of `files`; every reader is closed if any file fails to open."""
    readers: list[Reader] = list(opened or [])
    if files:
        with _closed_on_error(readers), using(current_limits()):  # the environment read once, not per shard
            readers.extend(map(open_file, files))
    return readers


@contextlib.contextmanager
def _closed_on_error(readers: list[Reader]) -> Iterator[None]:
    """Close every reader of `readers` (as it is when the error comes) if the block raises."""
    try:
        yield
    except BaseException:
        for reader in readers:
            reader.close()
        raise
