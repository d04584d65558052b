"""weightio: model weights from every common checkpoint format, zero-copy and safely.

    >>> import weightio as wio
    >>> with wio.open("model.safetensors") as ckpt:           # doctest: +SKIP
    ...     print(ckpt.format, len(ckpt), ckpt["w"].shape)
"""

# Only the public API is an attribute of the package (tests/test_api.py): the names used in
# annotations are imported for type checkers alone, the helpers inside the functions using them,
# and the two names the imports below must bind are deleted at the end.
from __future__ import annotations

from typing import TYPE_CHECKING

from . import dtypes, limits
from .checkpoint import Checkpoint
from .errors import (
    CorruptFileError,
    FormatError,
    InputError,
    MissingDependencyError,
    ShapeMismatchError,
    TensorNotFoundError,
    UnsafePickleError,
    UnsupportedDTypeError,
    UsageError,
    WeightioError,
    WeightioWarning,
    WriteError,
)
from .limits import Limits
from .view import TensorView

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping
    from typing import Any, BinaryIO

    import numpy as np

    from .varbuilder import VarBuilder

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CorruptFileError",
    "FormatError",
    "InputError",
    "Limits",
    "MissingDependencyError",
    "ShapeMismatchError",
    "TensorNotFoundError",
    "TensorView",
    "UnsafePickleError",
    "UnsupportedDTypeError",
    "UsageError",
    "VarBuilder",
    "WeightioError",
    "WeightioWarning",
    "WriteError",
    "dtypes",
    "limits",
    "load",
    "open",
    "save",
    "scan",
]


def open(path: str | bytes | os.PathLike[str] | BinaryIO, *, limits: Limits | None = None,  # noqa: A001
         unknown_globals: str = "refuse", storage_options: Mapping[str, Any] | None = None,
         download: bool = False) -> Checkpoint:
    """Open a checkpoint: a file of any supported format, a model directory, or a URL.

    Formats: safetensors, PyTorch pickles (zip, legacy, tar; never executed), GGUF (split sets
    opened as one), legacy ggml/ggmf/ggjt, ``.npz`` and ``.npy``. Only headers are read;
    tensors are read when asked for. The format is sniffed from the file's bytes, never from its
    name. A directory may hold a sharded index (``model.safetensors.index.json``,
    ``pytorch_model.bin.index.json``), a single weight file (``model.safetensors``,
    ``pytorch_model.bin``, one ``.gguf``) or the parts of one split GGUF model; a sharded
    index file may also be opened by its own path. A path may be ``str``, ``bytes`` (decoded
    with `os.fsdecode`) or `os.PathLike`.

    A file object with a real file descriptor (``open(path, "rb")``, a `tempfile.TemporaryFile`)
    is mapped read-only through a duplicate of its descriptor: closing the checkpoint leaves the
    file object open, and its position is not moved. The checkpoint is named by the object's
    ``name`` when that is a str, else ``<fd N>``. Objects without one (`io.BytesIO`, a wrapper
    whose ``fileno()`` fails) raise `UsageError`: write the bytes to a file first.

    URLs — ``hf://org/repo[@revision][/file]``, ``https://…``, ``s3://bucket/key`` and any other
    scheme with an fsspec filesystem installed — name a file, a sharded index or a folder laid
    out like a model directory. Only headers are fetched to open (by HTTP Range requests), and
    each tensor's bytes when it is read: a slice fetches only the slice. ``hf://`` goes through
    huggingface_hub (its cache, ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` apply; files
    already in the cache are mapped from there); other schemes through fsspec, with
    `storage_options` passed to the filesystem (credentials, endpoint). `download` (``hf://``
    only) fetches the weights whole into the Hub cache with the repo's config and tokenizer
    files, then maps them. See docs/remote.md.

    `limits` (a `weightio.Limits`) bounds what the files may make weightio spend: header
    bytes, tensor count, name length, nesting, inflated bytes; by default the current limits
    (`weightio.limits.using` blocks, ``WEIGHTIO_MAX_*`` environment variables, else the
    defaults). A file beyond one raises `CorruptFileError` naming the limit.

    `unknown_globals` says what a pickle's global outside the allowlist does: ``"refuse"`` (the
    default) raises `UnsafePickleError`; ``"placeholder"`` makes it an inert placeholder — never
    imported, never called, what the pickle does with it recorded as plain data — so that the
    tensors of any pickle can be read (a whole ``torch.save(model)``: its ``state_dict()`` names).
    The replaced globals are listed in ``metadata["weightio.placeholders"]``. No code runs in
    either mode; `scan` still calls such a file unsafe.

    Returns:
        A `Checkpoint`: a read-only mapping of tensor names to `TensorView`s, usable as a
        context manager that closes its files.

    Raises:
        FormatError: not a format weightio reads (the message says what it looks like).
        CorruptFileError: the file is truncated, inconsistent or malformed.
        UnsafePickleError: a pickle names a global outside the allowlist (nothing was run).
        InputError: the path does not exist or cannot be read (or the file object is no regular file).
        UsageError: `path` is none of the above (an `io.BytesIO`, an int), or an option does not apply.

    Example:
        >>> with open("model.safetensors", "rb") as f, wio.open(f) as ckpt:   # doctest: +SKIP
        ...     weight = ckpt["weight"].numpy()
    """
    from .checkpoint import open_checkpoint

    return open_checkpoint(path, limits, unknown_globals=unknown_globals, storage_options=storage_options,
                           download=download)


def load(path: str | os.PathLike[str], *, limits: Limits | None = None,
         unknown_globals: str = "refuse") -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as numpy arrays, in file order.

    The arrays are read-only zero-copy views of the file whenever `TensorView.numpy` allows;
    they stay valid after this returns (the mapping lives as long as they do). Use
    ``.copy()`` for a writable array. `limits` and `unknown_globals` as for `open`.
    """
    from ._streaming import reading_ahead
    from .checkpoint import open_checkpoint

    with open_checkpoint(path, limits, unknown_globals=unknown_globals) as ckpt:
        return {view.name: view.numpy() for view in reading_ahead(ckpt[name] for name in ckpt)}


def save(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    format: str | None = None,  # noqa: A002 - the public name is the contract
    *,
    overwrite: bool = False,
    **options: Any,
) -> None:
    """Write tensors to `path` atomically: a temporary file beside it, fsynced, then renamed.

    Args:
        tensors: name -> numpy array, `TensorView` (streamed one at a time from its file) or
            torch tensor.
        path: destination; its suffix picks the format (``.safetensors``, ``.npz``, ``.npy``,
            ``.gguf``) unless `format` is given.
        metadata: string metadata (safetensors ``__metadata__``).
        format: ``"safetensors"``, ``"npz"``, ``"npy"`` or ``"gguf"``.
        overwrite: replace an existing file; by default an existing file is refused.
        **options: format-specific writer options, e.g. ``types="Q8_0"`` (or a name -> type
            mapping) to quantize while writing GGUF; see `weightio.formats.gguf_writer.write`.

    Raises:
        WriteError: the destination exists (without `overwrite`) or cannot be written.
        UnsupportedDTypeError: a tensor's dtype cannot be stored in the format.
        UsageError: no format can be told from `path` and `format`, `tensors` is not a mapping
            of str names, or metadata is given for a format without any.
    """
    from .writing import save as write

    write(tensors, path, metadata, format, overwrite=overwrite, **options)


def scan(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> Any:
    """Report every global a pickle-based checkpoint references and whether it is safe.

    Nothing in the file is executed. Formats that cannot hold code (safetensors, GGUF, npz,
    npy) report so. `path` may be a URL (``hf://``, ``https://``, ``s3://`` …; `storage_options`
    go to fsspec). See `weightio.safety.ScanReport`.
    """
    from .safety import scan as _scan

    return _scan(path, storage_options=storage_options)


def __getattr__(name: str) -> Any:
    # Imported on first use: `weightio.torch` (load_into & co.) imports torch; `VarBuilder` brings
    # the device backends and name resolution, which opening and listing a checkpoint never need.
    # Those submodules stay reachable as `weightio.<name>` (importing one makes it an attribute).
    import importlib

    if name in ("torch", "varbuilder", "devices", "names"):
        return importlib.import_module(f".{name}", __name__)
    if name == "VarBuilder":
        found = globals()["VarBuilder"] = importlib.import_module(".varbuilder", __name__).VarBuilder
        return found
    raise AttributeError(f"module 'weightio' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


del annotations, TYPE_CHECKING
