"""Streaming conversion between checkpoint formats: one tensor in memory at a time, all or nothing.

`convert(src, dst)` reads any checkpoint `weightio.open` reads (a file, a model directory, an
``hf://`` path) and writes safetensors, ``.npz``, ``.npy`` (one tensor) or GGUF, chosen by the
destination's suffix. Along the way it can:

* cast floating-point tensors (``dtype="bf16"``, ``"fp16"``, ``"fp8"``, …; integers, booleans and
  complex tensors are left as they are, as ``torch_dtype`` leaves them), rounding to nearest
  even exactly as torch's ``.to(dtype)`` does (float8 e4m3 saturates, as in torch);
* dequantize GGUF/ggml block-quantized tensors (``dequantize=True``; without it they can only go
  to GGUF, where they are copied as blocks);
* shard a safetensors output (``max_shard_size="5GB"``) exactly as ``huggingface_hub``'s
  ``save_torch_state_dict`` does: tensors in checkpoint order, a new shard when the next tensor
  would overflow the current one, a tensor larger than the limit alone in its own shard, files
  ``model-00001-of-0000N.safetensors`` with ``{"format": "pt"}`` metadata, and
  ``model.safetensors.index.json`` (``{"metadata": {"total_size": …, …}, "weight_map": …}``,
  indented by 2); one shard is written as ``model.safetensors`` with no index;
* keep tied weights single: names of a PyTorch checkpoint that share one storage (the same
  bytes, dtype, shape and strides) are written once in safetensors, under the alphabetically
  first name, and every other name is recorded as ``metadata[other] = kept`` (the convention of
  safetensors' own ``convert.py`` and ``huggingface_hub``; transformers re-ties them on load);
* verify (``verify=True``): every output file is re-opened and each tensor's bytes compared
  with the source's (after the same cast), before anything is put in place.

Memory: each tensor's bytes are produced when its writer asks for them and the source pages are
released (``madvise(MADV_DONTNEED)`` on the mapping) once the next tensor starts, so the peak is
about the largest tensor (plus its cast copy), not the model. Deflated ``.npz`` members are the
exception: their reader keeps each inflated member until the source is closed.

Atomicity: every output file is written to a temporary name beside its destination and fsynced
(`weightio._io.atomic_write`); only when all are complete (and verified) are they renamed into
place, the shards first and the index last, as the commit point. Any failure, Ctrl-C included,
removes the temporary files and leaves the destination as it was. An existing destination is
refused unless ``overwrite=True``; a destination that is one of the source's files is always
refused, so the source is never modified.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from . import limits as _limits
from ._io import (
    TEMP_SUFFIX,
    atomic_write,
    bytes_equal,
    check_destination,
    drop_array_pages,
    fsync_directory,
    lock_temporary,
    remove_stale_temporaries,
    write_all,
)
from .checkpoint import Checkpoint, open_checkpoint
from .dtypes import TABLE, dtype_name, parse_dtype
from .errors import CorruptFileError, FormatError, UnsupportedDTypeError, WeightioError, WriteError
from .formats import SUFFIXES, format_for_path, open_file, save
from .formats.sources import check_materializable
from .records import TensorInfo, little_endian
from .view import TensorView

__all__ = ["convert", "ConvertResult", "parse_size", "plan_shards"]

Progress = Callable[[int, int], None]  # progress(advance_bytes, total_bytes)

_EXTENSIONS = {fmt: suffix for suffix, fmt in SUFFIXES.items()}
_PACKED = frozenset(row.numpy for row in TABLE if row.packed)
_FLOATS = frozenset(row.numpy for row in TABLE if not row.packed and row.safetensors.startswith(("F", "BF")))
_SATURATING = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz))
_SHARES_STORAGE = frozenset({"pytorch"})  # formats whose tensors may share one storage (tied weights)
_INDEX_KEYS = frozenset({"total_size", "total_parameters"})  # describe the source's index, not the tensors


@dataclass
class ConvertResult:
    """What a conversion wrote.

    Attributes:
        files: the files put in place, in commit order (shards, then the index).
        format: the output format.
        tensors: tensors written (aliases not counted).
        nbytes: tensor bytes written.
        aliases: ``removed name -> kept name`` for tied weights written once.
        notes: things a person should know (metadata that could not be kept, copies of tied weights…).
        verified: True when every tensor was read back and compared.
    """

    files: list[str]
    format: str
    tensors: int
    nbytes: int
    aliases: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verified: bool = False


def parse_size(text: str | int) -> int:
    """Bytes from ``"5GB"`` (10^9), ``"500MiB"`` (2^20), ``"1.5GB"`` or a plain number of bytes.

    Example:
        >>> parse_size("5GB"), parse_size("2KiB"), parse_size(100)
        (5000000000, 2048, 100)
    """
    if isinstance(text, int):
        value = text
    else:
        try:
            value = _limits.parse_size(text, fractions=True)
        except ValueError:
            raise FormatError(f"size {text!r} is not a number with an optional unit (B, kB, MB, GB, TB, KiB … TiB)"
                              ) from None
    if value <= 0:
        raise FormatError(f"size {text!r} must be positive")
    return value


def plan_shards(sizes: Mapping[str, int], max_shard_size: int) -> list[list[str]]:
    """Group tensor names into shards the way ``huggingface_hub`` does.

    Names are taken in order; a name that would take the current shard past `max_shard_size`
    starts a new shard; a tensor larger than the limit gets a shard of its own, placed where it
    was met (before the shard still being filled).
    """
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for name, size in sizes.items():
        if size > max_shard_size:
            shards.append([name])
            continue
        if current_size + size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current:
        shards.append(current)
    return shards


# ----------------------------------------------------------------------------- what to write


@dataclass
class _Tensor:
    """One output tensor: its source view and how its bytes are made."""

    name: str
    source: TensorView
    info: TensorInfo  # as written: native dtype, C order
    cast: np.dtype | None  # cast floating data (after dequantizing, if quantized) to this

    def make(self) -> np.ndarray:
        """The output data in native order (a view of the source when nothing changes), or the
        stored bytes of blocks and packed types copied as they are."""
        if self.info.ggml_type is not None or self.info.dtype in _PACKED:
            return self.source.raw()
        arr = self.source.numpy()
        return cast_array(arr, self.cast) if self.cast is not None and arr.dtype != self.cast else arr


def cast_array(arr: np.ndarray, target: np.dtype) -> np.ndarray:
    """`arr` as `target`, rounding to nearest even; as torch does, values beyond the range of a
    float8 type without infinities (e4m3fn, e4m3fnuz) become its largest finite value, NaN stays NaN."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the cast's defined result
        if target in _SATURATING:
            if arr.dtype.kind != "f":  # ml_dtypes sources: clip in float32, which holds them exactly
                arr = arr.astype(np.float32)
            limit = float(ml_dtypes.finfo(target).max)
            arr = np.clip(arr, -limit, limit)
        return arr.astype(target)


class _Meter:
    """Counts progress and releases each source tensor's pages once its writer moves on."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.progress = total, progress
        self.current: _Tensor | None = None

    def start(self, tensor: _Tensor) -> None:
        if tensor is not self.current:
            self.finish()
            self.current = tensor

    def finish(self) -> None:
        tensor, self.current = self.current, None
        if tensor is None:
            return
        release_pages(tensor.source)
        if self.progress is not None:
            self.progress(tensor.info.nbytes, self.total)


class _Streamed(TensorView):
    """A source tensor as a writer sees it: the output's dtype and shape, bytes made on demand."""

    __slots__ = ("_tensor", "_meter")

    def __init__(self, tensor: _Tensor, meter: _Meter) -> None:
        super().__init__(tensor.source._reader, tensor.name, tensor.info)
        self._tensor, self._meter = tensor, meter

    @property
    def path(self) -> str:
        return self._tensor.source.path

    def numpy(self) -> np.ndarray:
        self._meter.start(self._tensor)
        return self._tensor.make()

    def raw(self) -> np.ndarray:
        self._meter.start(self._tensor)
        if self.info.ggml_type is not None or self.info.dtype in _PACKED:
            return self._tensor.source.raw()
        return np.ascontiguousarray(self._tensor.make()).reshape(-1).view(np.uint8)


def release_pages(view: TensorView) -> None:
    """Tell the kernel this process no longer needs the mapped pages of `view`'s stored bytes.

    The pages stay in the page cache (a later read is a cheap minor fault) but leave this
    process's resident set, which is what keeps a conversion's peak RSS at one tensor. Data that
    is not a file mapping (inflated members, dequantized copies) is left alone.
    """
    try:
        data = view.raw()
    except (WeightioError, ValueError):  # tensors with no readable bytes (meta tensors), closed files
        return
    drop_array_pages(data)


def target_dtype(dtype: Any) -> np.dtype | None:
    """The dtype `convert(dtype=...)` casts floating-point tensors to (None: no cast).

    Raises:
        UnsupportedDTypeError: not a dtype weightio knows, or not a floating-point one.
    """
    if dtype is None:
        return None
    target = parse_dtype(dtype)
    if target not in _FLOATS:
        raise UnsupportedDTypeError(f"--dtype must be a floating-point type (bf16, fp16, fp32, fp8 …), "
                                    f"not {dtype_name(target)}")
    return target


def _plan_tensor(view: TensorView, fmt: str, cast: np.dtype | None, dequantize: bool) -> _Tensor:
    info = view.info
    if info.ggml_type is not None and not dequantize:
        if fmt != "gguf":
            raise UnsupportedDTypeError(f"is {info.ggml_type} block-quantized; pass --dequantize (dequantize=True) "
                                        f"to write it as {dtype_name(cast or np.dtype(np.float32))}, or write .gguf",
                                        path=view.path, tensor=view.name)
        return _Tensor(view.name, view, info, None)
    if info.ggml_type is None and info.dtype in _PACKED:
        return _Tensor(view.name, view, info, None)
    dtype = view.dtype
    if cast is not None and (dtype in _FLOATS or info.ggml_type is not None):
        dtype = cast
    check_materializable(view, view.path)  # a broadcast view would be written out element by element
    out = TensorInfo(dtype, info.shape, info.offset, math.prod(info.shape) * dtype.itemsize)
    return _Tensor(view.name, view, out, dtype if dtype != view.dtype else None)


def _tied_groups(ckpt: Checkpoint, names: list[str]) -> dict[str, list[str]]:
    """kept name -> the other names stored in exactly the same bytes (PyTorch tied weights)."""
    if ckpt.format not in _SHARES_STORAGE:
        return {}
    groups: dict[tuple, list[str]] = {}
    for name in names:
        view = ckpt[name]
        info = view.info
        key = (view.path, info.offset, info.nbytes, info.dtype.str, info.shape, info.strides, info.ggml_type)
        groups.setdefault(key, []).append(name)
    tied = {}
    for group in groups.values():
        if len(group) > 1 and math.prod(ckpt[group[0]].shape) > 0:
            ordered = sorted(group)
            tied[ordered[0]] = ordered[1:]
    return tied


def _carried_metadata(metadata: Mapping[str, Any], source: str, fmt: str, notes: list[str]) -> dict[str, Any]:
    """The source metadata the output can hold.

    GGUF to GGUF keeps every key with its value (but not the split-set keys of the source's
    parts, nor a ``general.alignment`` that is not an int); from other formats GGUF keeps the
    scalars. safetensors keeps scalars as strings. ``.npz``/``.npy`` keep nothing. What is left
    out is said in `notes`.
    """
    kept = {k: v for k, v in metadata.items() if k not in _INDEX_KEYS}
    if fmt in ("npz", "npy"):
        if any(k != "format" for k in kept):
            notes.append(f"metadata not kept: {fmt} files cannot store metadata ({len(kept)} entries)")
        return {}
    if fmt == "gguf":
        kept = {k: v for k, v in kept.items() if k != "format" and not k.startswith("split.")
                and (k != "general.alignment" or isinstance(v, int))}
        if source == "gguf":
            return kept
    scalars = {k: v for k, v in kept.items() if isinstance(k, str) and isinstance(v, (str, int, float, bool))}
    if len(scalars) < len(kept):
        dropped = [k for k in kept if k not in scalars]
        notes.append(f"metadata not kept: {len(dropped)} entries that are not scalars "
                     f"({', '.join(map(str, dropped[:3]))}{' …' if len(dropped) > 3 else ''})")
    return scalars if fmt == "gguf" else {k: v if isinstance(v, str) else str(v) for k, v in scalars.items()}


# ----------------------------------------------------------------------------- where to write


@dataclass
class _Layout:
    """Output file names: `base` is the single-file name; shards and the index derive from it."""

    base: str  # e.g. out/model.safetensors
    fmt: str

    @property
    def index(self) -> str:
        return self.base + ".index.json"

    def shard(self, i: int, n: int) -> str:
        stem, ext = os.path.splitext(self.base)
        return f"{stem}-{i:05d}-of-{n:05d}{ext}"

    def stale(self) -> list[str]:
        """Files from an earlier sharded or single save of the same name (huggingface_hub's pattern)."""
        directory, name = os.path.split(os.path.abspath(self.base))
        stem, ext = os.path.splitext(name)
        pattern = re.compile(re.escape(stem) + r"(-\d{5}-of-\d{5})?" + re.escape(ext) + r"(\.index\.json)?")
        try:
            found = sorted(os.listdir(directory))
        except OSError:
            return []
        return [os.path.join(os.path.dirname(self.base), f) for f in found if pattern.fullmatch(f)]


def _layout(dst: str, fmt: str | None) -> _Layout:
    if os.path.isdir(dst) or dst.endswith(("/", os.sep)):
        fmt = fmt or "safetensors"
        format_for_path("x" + _EXTENSIONS.get(fmt, ""), fmt)  # validates the format name
        return _Layout(os.path.join(dst, "model" + _EXTENSIONS[fmt]), fmt)
    return _Layout(dst, format_for_path(dst, fmt))


def _check_outputs(outputs: list[str], inputs: list[str], overwrite: bool) -> None:
    for out in outputs:
        for src in inputs:
            if os.path.exists(out) and os.path.samefile(out, src):
                raise WriteError("is a file of the checkpoint being converted; write somewhere else "
                                 "(the source is never modified)", path=out, errno=errno.EINVAL)
        check_destination(out, overwrite)


def _stage_name(final: str) -> str:
    """A staged output's name: a weightio temporary of `final` (see `remove_stale_temporaries`)."""
    directory, name = os.path.split(final)
    return os.path.join(directory, f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


class _Staging:
    """Temporary output files, renamed into place together at `commit` or removed on failure.

    Each staged file stays locked (``flock``) from when it is complete until it is committed or
    discarded, as `atomic_write` locks a file being written: a convert killed before committing
    leaves temporaries whose lock is free, which `remove_stale_temporaries` can prove dead.
    """

    def __init__(self, overwrite: bool) -> None:
        self.overwrite = overwrite
        self.staged: list[tuple[str, str]] = []  # (temporary, final)
        self.created_dirs: list[str] = []
        self.locks: list[int] = []  # descriptors holding the staged files' locks

    def make_dirs(self, directory: str) -> None:
        missing = []
        while directory and not os.path.exists(directory):
            missing.append(directory)
            directory = os.path.dirname(directory.rstrip(os.sep))
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except OSError as e:
                raise WriteError(f"cannot create the directory: {e.strerror}", path=d, errno=e.errno) from e
            self.created_dirs.append(d)

    def path_for(self, final: str) -> str:
        temporary = _stage_name(final)
        self.staged.append((temporary, final))
        return temporary

    def hold(self, temporary: str) -> None:
        """Lock a staged file now complete, until commit or discard (`lock_temporary`)."""
        fd = lock_temporary(temporary)
        if fd is not None:
            self.locks.append(fd)

    def _release(self) -> None:
        for fd in self.locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.locks = []

    def commit(self) -> list[str]:
        """Rename every staged file into place, in order (the index is staged last)."""
        done: list[str] = []
        try:
            for temporary, final in self.staged:
                if not self.overwrite and os.path.lexists(final):
                    raise WriteError("appeared while converting; not replaced", path=final, errno=errno.EEXIST)
                try:
                    os.replace(temporary, final)
                except OSError as e:  # named by the destination, like every other write failure
                    raise WriteError(f"cannot put the output in place: {e.strerror}", path=final,
                                     errno=e.errno) from None
                done.append(final)
        except BaseException:
            for final in done:  # a half-committed set is worse than none
                with contextlib.suppress(OSError):
                    os.unlink(final)
            raise
        finally:
            self._release()
        for directory in {os.path.dirname(os.path.abspath(f)) for f in done}:
            try:
                fsync_directory(directory)
            except OSError as e:  # the files are in place; only their durability is in doubt
                raise WriteError(f"the output is in place, but its directory could not be synced: {e.strerror}",
                                 path=directory, errno=e.errno) from None
        return done

    def discard(self) -> None:
        for temporary, _ in self.staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        self._release()
        for d in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                os.rmdir(d)


# ----------------------------------------------------------------------------- the conversion


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str | None = None,  # noqa: A002 - matches weightio.save
    dtype: Any = None,
    dequantize: bool = False,
    max_shard_size: int | str | None = None,
    select: Sequence[str] | None = None,
    verify: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ConvertResult:
    """Convert checkpoint `src` to `dst`, streaming one tensor at a time, atomically.

    Args:
        src: anything `weightio.open` accepts (file, model directory, ``hf://`` path).
        dst: output file (its suffix picks the format: ``.safetensors``, ``.npz``, ``.npy``,
            ``.gguf``) or directory (``dst/model.safetensors``, shards and index beside it).
        format: the output format, when the suffix does not say it.
        dtype: cast floating-point tensors to this type (``"bf16"``, ``"fp16"``, ``"fp8"``, …).
        dequantize: write block-quantized GGUF/ggml tensors as float32 (or `dtype`).
        max_shard_size: split a safetensors output into shards of at most this many bytes
            (``"5GB"``, ``"500MiB"``, an int), with an index, as ``huggingface_hub`` writes them.
        select: glob patterns; only tensors whose names match one are written.
        verify: read every output tensor back and compare its bytes before committing.
        overwrite: replace existing outputs (atomically); by default they are refused.
        progress: called as ``progress(bytes_done_now, total_bytes)`` after each tensor.

    Returns:
        A `ConvertResult` listing the files written, aliases and notes.

    Raises:
        WriteError: an output exists (without `overwrite`), is a source file, or cannot be written.
        UnsupportedDTypeError: a tensor the output format cannot store (quantized without
            `dequantize`, a dtype the format lacks).
        FormatError: an unknown output format or option combination.
        CorruptFileError: `verify` found written bytes that differ from the source.

    Example:
        >>> convert("pytorch_model.bin", "model.safetensors", dtype="bf16", verify=True)  # doctest: +SKIP
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if dst.startswith("hf://"):
        raise FormatError("writing to the Hub is not supported; convert to a local path and upload it", path=dst)
    layout = _layout(dst, format)
    limit = None if max_shard_size is None else parse_size(max_shard_size)
    if limit is not None and layout.fmt != "safetensors":
        raise FormatError("sharding (max_shard_size) writes safetensors; use a .safetensors destination", path=dst)
    cast = target_dtype(dtype)
    stale = remove_stale_temporaries(dst)  # only files a killed writer provably left (their lock is free)
    with open_checkpoint(src) as ckpt:
        result = _convert(ckpt, layout, cast, dequantize, limit, select, verify, overwrite, progress)
    if stale:
        result.notes.insert(0, f"removed {len(stale)} temporary file(s) an interrupted write left: "
                               + ", ".join(os.path.basename(p) for p in stale))
    return result


def _convert(ckpt: Checkpoint, layout: _Layout, cast: np.dtype | None, dequantize: bool, limit: int | None,
             select: Sequence[str] | None, verify: bool, overwrite: bool, progress: Progress | None) -> ConvertResult:
    names = ckpt.select(*(select or ()))
    if not names:
        raise FormatError("no tensor matches " + ", ".join(map(repr, select or ())), path=ckpt.path)
    notes: list[str] = []
    aliases: dict[str, str] = {}
    tied = _tied_groups(ckpt, names)
    if layout.fmt == "safetensors":
        aliases = {other: kept for kept, others in tied.items() for other in others}
    elif tied:
        notes.append(f"{sum(map(len, tied.values()))} tied tensors written as separate copies "
                     f"({layout.fmt} has no aliases)")
    tensors = {n: _plan_tensor(ckpt[n], layout.fmt, cast, dequantize) for n in names if n not in aliases}
    metadata = _carried_metadata(ckpt.metadata, ckpt.format, layout.fmt, notes)
    shards = [list(tensors)] if limit is None else plan_shards({n: t.info.nbytes for n, t in tensors.items()}, limit)
    if layout.fmt == "npy" and len(tensors) != 1:
        raise FormatError(f".npy holds one tensor and {len(tensors)} are selected; select one (--filter NAME) "
                          "or write .npz / .safetensors", path=layout.base)
    total = sum(t.info.nbytes for t in tensors.values()) * (2 if verify else 1)
    writer = _Writer(ckpt, layout, tensors, _Meter(total, progress), overwrite)
    files = writer.run(shards, metadata, aliases, verify)
    return ConvertResult(files, layout.fmt, len(tensors), sum(t.info.nbytes for t in tensors.values()),
                         aliases, notes, verify)


class _Writer:
    """Writes the planned tensors as one file or a sharded set, staged then committed."""

    def __init__(self, ckpt: Checkpoint, layout: _Layout, tensors: dict[str, _Tensor], meter: _Meter,
                 overwrite: bool) -> None:
        self.ckpt, self.layout, self.tensors, self.meter = ckpt, layout, tensors, meter
        self.staging = _Staging(overwrite)

    def run(self, shards: list[list[str]], metadata: dict[str, Any], aliases: dict[str, str],
            verify: bool) -> list[str]:
        outputs = self._outputs(len(shards))
        self._check(outputs)
        try:
            self.staging.make_dirs(os.path.dirname(os.path.abspath(self.layout.base)))
            written = self._write(shards, outputs, metadata, aliases)
            self.meter.finish()
            if verify:
                for path, names in written:
                    self._verify(path, names)
            done = self.staging.commit()
        except BaseException:
            self.staging.discard()
            raise
        self._remove_stale(done)
        return done

    def _outputs(self, n: int) -> list[str]:
        if n == 1:
            return [self.layout.base]
        return [self.layout.shard(i + 1, n) for i in range(n)] + [self.layout.index]

    def _check(self, outputs: list[str]) -> None:
        _check_outputs(outputs, self.ckpt.files, self.staging.overwrite)
        if self.layout.fmt == "safetensors" and not self.staging.overwrite and os.path.lexists(self.layout.index):
            raise WriteError("already exists and would shadow the new file when the directory is opened; "
                             "pass overwrite=True (CLI: --force) to replace it", path=self.layout.index,
                             errno=errno.EEXIST)

    def _write(self, shards: list[list[str]], outputs: list[str], metadata: dict[str, Any],
               aliases: dict[str, str]) -> list[tuple[str, list[str]]]:
        fmt = self.layout.fmt
        extra = {k: v for k, v in aliases.items() if k not in metadata}
        if len(shards) == 1:
            meta = {"format": "pt", **metadata, **extra} if fmt == "safetensors" else metadata
            return [self._save(shards[0], outputs[0], meta or None)]
        written = [self._save(shard, final, {"format": "pt"})
                   for shard, final in zip(shards, outputs[:-1], strict=True)]
        carried = {k: v for k, v in metadata.items() if k != "format"}  # "format" is per file, not the index's
        self._write_index(shards, outputs, {**carried, **extra})
        return written

    def _save(self, names: list[str], final: str, metadata: dict[str, Any] | None) -> tuple[str, list[str]]:
        staged = self.staging.path_for(final)
        views = {n: _Streamed(self.tensors[n], self.meter) for n in names}
        try:
            if self.layout.fmt == "gguf":  # keep each key's GGUF type (UINT64 stays UINT64)
                from .formats import gguf
                from .formats.gguf import value_types

                types = {k: t for k, t in value_types(self.ckpt).items() if k in (metadata or {})}
                gguf.write(views, staged, metadata, value_types=types)
            else:
                save(views, staged, metadata, self.layout.fmt)
        except WeightioError as e:
            if e.path == staged:  # name the destination, not its temporary file
                e.path = final
            raise
        self.staging.hold(staged)
        return staged, names

    def _write_index(self, shards: list[list[str]], outputs: list[str], metadata: dict[str, Any]) -> None:
        total = sum(self.tensors[n].info.nbytes for shard in shards for n in shard)
        weight_map = {n: os.path.basename(out) for shard, out in zip(shards, outputs[:-1], strict=True) for n in shard}
        index = {"metadata": {"total_size": total, **metadata}, "weight_map": weight_map}
        staged = self.staging.path_for(outputs[-1])
        with atomic_write(staged) as f:
            write_all(f, json.dumps(index, indent=2).encode("utf-8"))
        self.staging.hold(staged)

    def _verify(self, path: str, names: list[str]) -> None:
        reader = open_file(path)
        try:
            stored = list(reader.tensors)
            found = dict(zip(names, stored, strict=False)) if self.layout.fmt == "npy" else {n: n for n in stored}
            if sorted(found) != sorted(names):
                raise CorruptFileError(f"verification failed: the file holds {len(stored)} tensors, "
                                       f"{len(names)} were written", path=path)
            for name in names:
                self._verify_tensor(TensorView(reader, found[name], reader.tensors[found[name]]), self.tensors[name])
        finally:
            reader.close()

    def _verify_tensor(self, out: TensorView, tensor: _Tensor) -> None:
        expected_kind = tensor.info.ggml_type or dtype_name(tensor.info.dtype)
        if out.shape != tensor.info.shape or (out.ggml_type or dtype_name(out.dtype)) != expected_kind:
            raise CorruptFileError(f"verification failed: written as {out.ggml_type or dtype_name(out.dtype)} "
                                   f"{list(out.shape)}, expected {expected_kind} {list(tensor.info.shape)}",
                                   path=out.path, tensor=tensor.name)
        written, wanted = out.raw(), little_endian(tensor.make()).reshape(-1).view(np.uint8)
        equal = bytes_equal(written, wanted)
        release_pages(tensor.source)
        drop_array_pages(written)
        if not equal:
            raise CorruptFileError("verification failed: the written bytes differ from the source's",
                                   path=out.path, tensor=tensor.name)
        if self.meter.progress is not None:
            self.meter.progress(tensor.info.nbytes, self.meter.total)

    def _remove_stale(self, done: list[str]) -> None:
        """After an overwrite: shards or an index of an earlier save that the new files did not replace."""
        if self.layout.fmt != "safetensors":
            return
        keep = {os.path.abspath(f) for f in done}
        for stale in self.layout.stale():
            if os.path.abspath(stale) not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(stale)
