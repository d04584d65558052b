"""The format registry: which reader opens a sniffed file, which writer a suffix selects.

One module per format; each exposes a `Reader` subclass and, where the format allows, a
``write(sources, path, metadata=None, *, overwrite=False)`` function that takes a sequence of
`weightio.records.TensorSource`s (`weightio.writing` builds them from a user's mapping).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from .._io import MappedFile
from .._remote import RemoteFile
from ..errors import FormatError, UsageError
from . import safetensors as _safetensors
from . import sniff as _sniff
from .base import PLACEHOLDERS_KEY, UNKNOWN_GLOBALS, Reader, TensorInfo, is_remote

__all__ = ["READERS", "WRITERS", "SUFFIXES", "Reader", "TensorInfo", "open_file", "format_for_path", "resolve",
           "UNKNOWN_GLOBALS", "PLACEHOLDERS_KEY", "is_remote"]

# Readers by sniffed format: a class, or "module:attribute" imported on first use (so that
# `import weightio` stays cheap and a format's module loads only when such a file is opened).
READERS: dict[str, Callable[[MappedFile], Reader] | str] = {
    "safetensors": _safetensors.SafetensorsReader,
    "npy": "weightio.formats.numpy:NpyReader",
    "npz": "weightio.formats.numpy:NpzReader",
    "pytorch": "weightio.formats.pytorch:PyTorchReader",
    "gguf": "weightio.formats.gguf:GGUFReader",
    "ggml": "weightio.formats.ggml:GGMLReader",
}


def __getattr__(name: str) -> Any:
    if name == "numpy":  # imported on first use (`READERS`), yet reachable as `weightio.formats.numpy`
        return importlib.import_module(".numpy", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve(entry: Any) -> Any:
    """A `READERS` or `WRITERS` entry itself: "module:attribute" entries are imported now."""
    if not isinstance(entry, str):
        return entry
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


# Writers by format name: ``write(sources, path, metadata=None, *, overwrite=False, **options)``.
WRITERS: dict[str, Callable[..., None] | str] = {
    "safetensors": _safetensors.write,
    "npz": "weightio.formats.numpy:write_npz",
    "npy": "weightio.formats.numpy:write_npy",
    "gguf": "weightio.formats.gguf_writer:write",
}

SUFFIXES = {".safetensors": "safetensors", ".npz": "npz", ".npy": "npy", ".gguf": "gguf"}


def open_file(path: str | os.PathLike[str] | MappedFile | RemoteFile) -> Reader:
    """Map `path` (or take an opened file: a `RemoteFile`), sniff its format from its bytes and
    return the validated reader. A local safetensors file whose first bytes hold its whole plain
    header (a shard of a model cut in many, say) is read in one C call (`safetensors.read_plain`)."""
    file = MappedFile(path, head=True) if isinstance(path, (str, os.PathLike)) else path
    try:
        if isinstance(file, MappedFile) and READERS.get("safetensors") is _safetensors.SafetensorsReader:
            plain = _safetensors.read_plain(file)
            if plain is not None:
                return plain
        fmt = _sniff.sniff(file)
        try:
            reader = resolve(READERS[fmt])
        except (KeyError, ImportError, AttributeError):
            raise FormatError(f"is a {fmt} file, which this version of weightio cannot read yet",
                              path=file.path) from None
        return reader(file)
    except BaseException:
        file.close()
        raise


def format_for_path(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The output format: `format` when given, else from the suffix of `path`."""
    if format is not None:
        if format not in WRITERS:
            raise UsageError(f"cannot write format {format!r}; writable: {', '.join(WRITERS)}", path=os.fspath(path))
        return format
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in SUFFIXES:
        known = ", ".join(SUFFIXES)
        raise UsageError(f"cannot tell the format from suffix {suffix!r} ({known}); pass format=",
                         path=os.fspath(path))
    return SUFFIXES[suffix]

