"""The format registry: which reader opens a sniffed file, which writer a suffix selects.

One module per format; each exposes a `Reader` subclass and, where the format allows, a
``write(tensors, path, metadata=None, *, overwrite=False)`` function.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from .._io import MappedFile
from ..errors import FormatError
from ..sniff import sniff
from . import numpy as _numpy
from . import safetensors as _safetensors
from .base import Reader, TensorInfo

__all__ = ["READERS", "WRITERS", "SUFFIXES", "Reader", "TensorInfo", "open_file", "format_for_path", "save"]

READERS: dict[str, Callable[[MappedFile], Reader]] = {
    "safetensors": _safetensors.SafetensorsReader,
    "npy": _numpy.NpyReader,
    "npz": _numpy.NpzReader,
}


def _no_metadata(writer: Callable[..., None], fmt: str) -> Callable[..., None]:
    def write(tensors: Mapping[str, Any], path: str, metadata: Mapping[str, Any] | None = None, *,
              overwrite: bool = False) -> None:
        if metadata:
            raise FormatError(f"{fmt} files cannot store metadata; drop metadata= or write .safetensors", path=path)
        writer(tensors, path, overwrite=overwrite)

    return write


WRITERS: dict[str, Callable[..., None]] = {
    "safetensors": _safetensors.write,
    "npz": _no_metadata(_numpy.write_npz, "npz"),
    "npy": _no_metadata(_numpy.write_npy, "npy"),
}

SUFFIXES = {".safetensors": "safetensors", ".npz": "npz", ".npy": "npy"}


def open_file(path: str | os.PathLike[str]) -> Reader:
    """Map `path`, sniff its format from its bytes and return the validated reader."""
    file = MappedFile(path)
    try:
        fmt = sniff(file)
        reader = READERS.get(fmt)
        if reader is None:
            raise FormatError(f"is a {fmt} file, which this version of weightio cannot read yet", path=file.path)
        return reader(file)
    except BaseException:
        file.close()
        raise


def format_for_path(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The output format: `format` when given, else from the suffix of `path`."""
    if format is not None:
        if format not in WRITERS:
            raise FormatError(f"cannot write format {format!r}; writable: {', '.join(WRITERS)}", path=os.fspath(path))
        return format
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in SUFFIXES:
        known = ", ".join(SUFFIXES)
        raise FormatError(f"cannot tell the format from suffix {suffix!r} ({known}); pass format=", path=os.fspath(path))
    return SUFFIXES[suffix]


def save(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any] | None = None,
    format: str | None = None,
    *,
    overwrite: bool = False,
) -> None:
    """Write `tensors` to `path`, atomically; see `weightio.save`."""
    fmt = format_for_path(path, format)
    WRITERS[fmt](tensors, os.fspath(path), metadata, overwrite=overwrite)
