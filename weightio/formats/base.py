"""The one small interface between the format modules and everything else.

A reader opens one file (one mapping), validates its header completely, and exposes:

* ``tensors``: ``name -> TensorInfo`` in file order;
* ``metadata``: a dict of the file's own metadata;
* ``buffer(name)``: the read-only ``uint8`` array that ``TensorInfo.offset`` indexes (the
  file mapping, or a lazily inflated member for compressed containers);
* ``close()``.

Readers know nothing of `Checkpoint`, the VarBuilder, devices, the hub or the CLI.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import numpy as np

from .._io import MappedFile
from .._remote import RemoteFile
from ..errors import UsageError
from ..limits import Limits
from ..limits import current as current_limits
from ..records import MAX_NDIM, TensorInfo

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["AnyFile", "MAX_NDIM", "PLACEHOLDERS_KEY", "Reader", "TensorInfo", "UNKNOWN_GLOBALS",
           "check_unknown_globals", "is_remote", "stored_name", "unknown_globals", "using_unknown_globals"]

# The file a reader reads: a local mapping or a remote file, which has the same interface (`weightio._remote`)
AnyFile: TypeAlias = MappedFile | RemoteFile


def is_remote(file: AnyFile) -> TypeIs[RemoteFile]:
    """Whether `file` is read by range (its ``remote`` attribute: True for a `RemoteFile`, False for a
    `MappedFile`), as a check mypy narrows `file` by: a `RemoteFile` when true, a `MappedFile` when false."""
    return getattr(file, "remote", False)

# What a pickle reader does with a global off the allowlist: "refuse" (UnsafePickleError) or
# "placeholder" (an inert placeholder; weightio.formats.pytorch.placeholders).
UNKNOWN_GLOBALS = ("refuse", "placeholder")
PLACEHOLDERS_KEY = "weightio.placeholders"  # the metadata key listing the globals placeholders replaced
_unknown_globals: contextvars.ContextVar[str] = contextvars.ContextVar("weightio_unknown_globals", default="refuse")


def unknown_globals() -> str:
    """The unknown-globals mode of the files opened here (`using_unknown_globals`; default "refuse")."""
    return _unknown_globals.get()


def check_unknown_globals(mode: object) -> str:
    """`mode` if it is one of `UNKNOWN_GLOBALS`.

    Raises:
        UsageError: it is not.
    """
    if not (isinstance(mode, str) and mode in UNKNOWN_GLOBALS):
        raise UsageError(f"unknown_globals must be one of {', '.join(map(repr, UNKNOWN_GLOBALS))}, not {mode!r}")
    return mode


@contextlib.contextmanager
def using_unknown_globals(mode: str) -> Iterator[str]:
    """Open files in the block with unknown-globals `mode` (`UNKNOWN_GLOBALS`), as `weightio.open`'s
    ``unknown_globals=`` does for one call (a `contextvars.ContextVar`: other threads keep theirs).

    Raises:
        UsageError: `mode` is not one of `UNKNOWN_GLOBALS`.
    """
    token = _unknown_globals.set(check_unknown_globals(mode))
    try:
        yield mode
    finally:
        _unknown_globals.reset(token)


class Reader:
    """Base class of the per-format readers: one file, one mapping.

    Subclasses parse and validate the header in ``__init__`` (through `_validate`) and fill
    ``tensors`` and ``metadata``; nothing is exposed before validation is complete.
    """

    format: ClassVar[str]

    def __init__(self, source: str | os.PathLike[str] | MappedFile | RemoteFile) -> None:
        if isinstance(source, (MappedFile, RemoteFile)):  # (first: no ABC check of os.PathLike per shard)
            self.file = source
        else:
            self.file = MappedFile(source, head=True) if isinstance(source, (str, os.PathLike)) else source
        self.path = self.file.path
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.limits: Limits = current_limits()  # read once: they also bound what buffer() inflates later

    def _validate(self, parse: Callable[..., None], *args: Any) -> None:
        """Run the header parser `parse(*args)`; if it fails, the file is released before the error leaves."""
        try:
            parse(*args)
        except BaseException:
            self.close()
            raise
        self.file.release_head()

    def buffer(self, name: str) -> np.ndarray:
        """The read-only ``uint8`` array that tensor `name`'s offset indexes.

        Readers may raise here for tensors that are listed but hold no readable data
        (`UnsupportedDTypeError` for a PyTorch meta tensor, say).
        """
        return self.file.data

    def siblings(self) -> list[str]:
        """Other files that belong to the same checkpoint as this one (the other parts of a
        split GGUF set, say), in order, this file excluded. `open` opens them too and serves
        every part as one checkpoint."""
        return []

    def close(self) -> None:
        self.file.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r}: {len(self.tensors)} tensors>"


def stored_name(name: object, path: str, fmt: str, *, what: str = "tensor name", extra: int = 0) -> bytes:
    """`name` as the UTF-8 bytes a writer stores, when every reader of its format can read it back:
    a non-empty str, valid Unicode (no lone surrogates, which no UTF-8 file can hold), and within
    the ``name_bytes`` limit in force (`extra`: bytes the writer adds, ``.npy`` for npz members).
    Writers call it for every name before they write anything.

    Raises:
        UsageError: naming the tensor (or the metadata key) and why it cannot be stored.
    """
    if not isinstance(name, str) or not name:
        raise UsageError(f"{what}s must be non-empty str, got {name!r}", path=path)
    tensor = name if what == "tensor name" else None
    key = "" if tensor is not None else f"{what} {name[:40]!r}: "
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"{key}{fmt} cannot store a name holding a lone surrogate ({name[e.start]!r}, not valid "
                         "Unicode); rename it", path=path, tensor=tensor) from None
    limit = current_limits().name_bytes
    if len(raw) + extra > limit:
        raise UsageError(f"{key}{fmt} readers refuse names over {limit:,} bytes (limits.name_bytes); this one is "
                         f"{len(raw) + extra:,}", path=path, tensor=tensor)
    return raw
