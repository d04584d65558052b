"""`Checkpoint`: one or more validated readers seen as one read-only mapping of tensors.

`open_checkpoint` accepts a file (format sniffed from its bytes) or a directory laid out the
way Hugging Face writes models: a sharded index (``model.safetensors.index.json``, whose
``weight_map`` routes each tensor to a shard) or a single weight file (``model.safetensors``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from ._io import MappedFile
from ._json import parse_json_object
from .errors import CorruptFileError, FormatError, InputError, TensorNotFoundError
from .formats import open_file
from .formats.base import Reader, TensorInfo
from .limits import Limits, using
from .view import TensorView

__all__ = ["Checkpoint", "open_checkpoint"]


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
        self._index: dict[str, tuple[Reader, TensorInfo]] = {}
        merged: dict[str, Any] = {}
        for reader in self._readers:
            for key, value in reader.metadata.items():
                merged.setdefault(key, value)
            for name, info in reader.tensors.items():
                if name in self._index:
                    other = self._index[name][0].path
                    raise CorruptFileError(f"is stored in two files: {other} and {reader.path}", path=path, tensor=name)
                self._index[name] = (reader, info)
        for key, value in (metadata or {}).items():
            merged.setdefault(key, value)
        self.metadata = merged

    # ------------------------------------------------------------------ Mapping
    def __getitem__(self, name: str) -> TensorView:
        try:
            reader, info = self._index[name]
        except (KeyError, TypeError):
            raise TensorNotFoundError(name, self._index, path=self.path) from None
        return TensorView(reader, name, info)

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

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
        return sum(math.prod(info.shape) for _, info in self._index.values())

    @property
    def nbytes(self) -> int:
        """Total bytes of tensor data as stored."""
        return sum(info.nbytes for _, info in self._index.values())

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


# ----------------------------------------------------------------------------- opening

# Directory layouts, most preferred first: (index suffix or None, preferred file, other weight suffixes).
# GGUF has no index file: a directory holds one .gguf, or the parts of one split set.
_LAYOUTS = (
    (".safetensors.index.json", "model.safetensors", (".safetensors",)),
    (".bin.index.json", "pytorch_model.bin", (".bin", ".pt", ".pth", ".ckpt")),
    (None, "model.gguf", (".gguf",)),
)
_SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def open_checkpoint(path: str | os.PathLike[str], limits: Limits | None = None) -> Checkpoint:
    """Open a checkpoint file or model directory; see `weightio.open`.

    Args:
        limits: the `weightio.limits.Limits` every file is opened (and later read) under;
            the current ones (`weightio.limits.current`) when None.
    """
    if limits is not None:
        with using(limits):
            return open_checkpoint(path)
    path = os.fspath(path)
    if path.startswith("hf://"):
        from .hub import resolve  # imports huggingface_hub: only for hf:// paths

        path = resolve(path)
    if os.path.isdir(path):
        return _open_directory(path)
    if path.endswith(".index.json") and os.path.isfile(path):  # a sharded set, named by its index
        return _open_sharded(os.path.dirname(os.path.abspath(path)), path)
    if not os.path.exists(path):
        raise InputError("no such file or directory", path=path, errno=2)
    return _open_with_siblings(path, path)


def _open_directory(path: str) -> Checkpoint:
    try:
        names = os.listdir(path)
    except OSError as e:
        raise InputError(f"cannot list the directory: {e.strerror}", path=path, errno=e.errno) from None
    files = sorted(f for f in names if os.path.isfile(os.path.join(path, f)))
    for index_suffix, preferred, suffixes in _LAYOUTS:
        index = _pick(path, [f for f in files if f.endswith(index_suffix)], preferred + ".index.json") \
            if index_suffix else None
        if index is not None:
            return _open_sharded(path, os.path.join(path, index))
        single = _pick(path, [f for f in files if f.endswith(suffixes)], preferred)
        if single is not None:
            return _open_with_siblings(path, os.path.join(path, single))
    shown = ", ".join(files[:8]) + (" …" if len(files) > 8 else "") if files else "nothing"
    raise FormatError(f"is a directory with no weight files weightio recognises (found: {shown})", path=path)


def _open_with_siblings(path: str, file: str) -> Checkpoint:
    """`file` and the other files of its set (the parts of a split GGUF model) as one checkpoint."""
    first = open_file(file)
    try:
        siblings = first.siblings()
    except BaseException:
        first.close()
        raise
    return _open_readers(path, siblings, opened=[first])


def _pick(directory: str, candidates: list[str], preferred: str) -> str | None:
    if preferred in candidates:
        return preferred
    parts = [_SPLIT_PART.match(c) for c in candidates]
    if len(candidates) > 1 and all(parts) and len({(m["stem"], m["count"]) for m in parts}) == 1:
        return min(candidates)  # the parts of one split GGUF set: part 1 brings the others
    if len(candidates) > 1:
        raise FormatError(f"holds several candidate files ({', '.join(candidates)}); open one of them by path",
                          path=directory)
    return candidates[0] if candidates else None


def _open_sharded(directory: str, index_path: str) -> Checkpoint:
    weight_map, index_metadata = _read_index(index_path)
    shard_names = list(dict.fromkeys(weight_map.values()))
    for shard in shard_names:
        if not os.path.isfile(os.path.join(directory, shard)):
            raise CorruptFileError(f"lists shard {shard!r}, which is missing", path=index_path)
    checkpoint = _open_readers(directory, [os.path.join(directory, s) for s in shard_names], index_metadata)
    by_path = {os.path.join(directory, s): s for s in shard_names}
    for name, shard in weight_map.items():
        holder = checkpoint._index.get(name)
        if holder is None or by_path[holder[0].path] != shard:
            found = f"; it is in {by_path[holder[0].path]!r}" if holder else ""
            checkpoint.close()
            raise CorruptFileError(f"maps tensor {name!r} to {shard!r}, which does not hold it{found}",
                                   path=index_path)
    return checkpoint


def _read_index(index_path: str) -> tuple[dict[str, str], dict[str, Any]]:
    file = MappedFile(index_path)
    try:
        index = parse_json_object(file.read(0, file.size, "the index"), path=index_path, what="index")
    finally:
        file.close()
    weight_map, metadata = index.get("weight_map"), index.get("metadata") or {}
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptFileError("weight_map must be an object mapping tensor names to file names", path=index_path)
    if not isinstance(metadata, dict):
        raise CorruptFileError("metadata must be an object", path=index_path)
    for shard in set(weight_map.values()):
        if not shard or os.path.isabs(shard) or ".." in shard.replace("\\", "/").split("/"):
            raise CorruptFileError(f"shard name {shard!r} points outside the model directory", path=index_path)
    return weight_map, metadata


def _open_readers(path: str, files: list[str], metadata: dict[str, Any] | None = None, *,
                  opened: list[Reader] | None = None) -> Checkpoint:
    """A checkpoint over `opened` readers plus `files`; every reader is closed if any step fails."""
    readers: list[Reader] = list(opened or [])
    try:
        for file in files:
            readers.append(open_file(file))
        return Checkpoint(readers, path=path, metadata=metadata)
    except BaseException:
        for reader in readers:
            reader.close()
        raise
