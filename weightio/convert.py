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
released (``madvise(MADV_DONTNEED)``) once the next tensor starts: the peak is about the largest
tensor (plus its cast copy), not the model (deflated ``.npz`` members stay until the source closes).

Atomicity: every output file is written to a temporary name beside its destination and fsynced
(`weightio._outputs.atomic_write`, staged by `weightio._staging`); only when all are complete (and
verified) are they renamed into place, the shards first and the index last, as the commit point.
Any failure, Ctrl-C included, removes the temporary files and leaves the destination as it was.
An existing destination is refused unless ``overwrite=True``; a destination that is one of the
source's files is always refused, so the source is never modified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np

from . import carry, model_files
from . import limits as _limits
from ._failures import is_url, redact
from ._io import bytes_equal, drop_array_pages
from ._outputs import atomic_write, check_parent, remove_stale_temporaries, write_all
from ._staging import Outputs, Staging, check_outputs
from .checkpoint import Checkpoint, open_checkpoint
from .dtypes import PACKED, TABLE, dtype_name, is_number, parse_dtype
from .errors import (
    OVERWRITE_ADVICE,
    Advice,
    CorruptFileError,
    UnsupportedDTypeError,
    UsageError,
    WeightioError,
    WriteError,
)
from .formats import SUFFIXES, format_for_path, is_remote, open_file
from .formats.ggml_to_gguf import LlamaOptions
from .layout import WEIGHT_SUFFIXES
from .records import TensorSource
from .view import TensorView
from .writing import RECORD_FORMATS, block_type, check_materializable, check_numbers, write_sources

__all__ = ["convert", "ConvertResult", "into_directory", "parse_size", "plan_shards", "target_dtype"]

Progress = Callable[[int, int], None]  # progress(advance_bytes, total_bytes)

_EXTENSIONS = {fmt: suffix for suffix, fmt in SUFFIXES.items()}
_FLOATS = frozenset(row.numpy for row in TABLE if not row.packed and row.safetensors.startswith(("F", "BF")))
_SATURATING = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz))
_SHARES_STORAGE = frozenset({"pytorch"})  # formats whose tensors may share one storage (tied weights)


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
        copied: the files of the source directory copied beside the weights (config, tokenizer
            …; see `weightio.model_files`), as destination paths.
        skipped: ``source file -> why`` for files of the source directory not copied (weights
            in another format, links to nothing), relative to the source directory.
        fetched: ``(requests, bytes)`` the source's weight files cost, for a URL read by range
            (headers and tensors; `weightio.remote.traffic`); ``(0, 0)`` for local files.
    """

    files: list[str]
    format: str
    tensors: int
    nbytes: int
    aliases: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verified: bool = False
    copied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    fetched: tuple[int, int] = (0, 0)


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
            raise UsageError(f"size {text!r} is not a number with an optional unit (B, kB, MB, GB, TB, KiB … TiB)"
                              ) from None
    if value <= 0:
        raise UsageError(f"size {text!r} must be positive")
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


def make(view: TensorView, cast: np.dtype | None, stored: bool) -> np.ndarray:
    """The output data of `view`: its stored bytes when `stored` (blocks and packed types are
    copied as they are), else its values in native order (a view of the source when nothing
    changes), cast to `cast` when given."""
    if stored:
        return view.raw()
    arr = view.numpy()
    return cast_array(arr, cast) if cast is not None and arr.dtype != cast else arr


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
    """Counts progress and releases each source tensor's pages once its writer moves on.

    Progress counts output bytes; from a remote source (`remote`), the bytes fetched (the tensors'
    stored bytes), and no pages are released: a remote tensor is fetched into memory of its own,
    and asking for its bytes again would fetch them again.
    """

    def __init__(self, total: int, progress: Progress | None, remote: bool = False) -> None:
        self.total, self.progress, self.remote = total, progress, remote
        self.current: tuple[TensorView, int] | None = None  # the source being written, its counted bytes

    def size(self, view: TensorView, source: TensorSource) -> int:
        """The bytes progress counts for one tensor."""
        return view.nbytes if self.remote else source.nbytes

    def release(self, view: TensorView) -> None:
        if not self.remote:
            release_pages(view)

    def metered(self, view: TensorView, source: TensorSource) -> TensorSource:
        """`source`, its fetch first marking `view` as the tensor now being written."""
        def fetch() -> np.ndarray:
            self.start(view, self.size(view, source))
            return source.fetch()

        return dataclasses.replace(source, fetch=fetch)

    def start(self, view: TensorView, nbytes: int) -> None:
        if self.current is None or self.current[0] is not view:
            self.finish()
            self.current = (view, nbytes)

    def finish(self) -> None:
        current, self.current = self.current, None
        if current is None:
            return
        self.release(current[0])
        if self.progress is not None:
            self.progress(current[1], self.total)


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


def _plan_tensor(view: TensorView, fmt: str, cast: np.dtype | None, dequantize: bool) -> TensorSource:
    """What is written for `view`: its stored blocks or packed bytes, or its values (cast)."""
    info = view.info
    if info.ggml_type is not None and not dequantize:
        if fmt != "gguf":
            to = f"to write it as {dtype_name(cast or np.dtype(np.float32))}, or write .gguf"
            advice = Advice(python=f"pass dequantize=True {to}", cli=f"pass --dequantize {to}")
            raise UnsupportedDTypeError(f"is {info.ggml_type} block-quantized", path=view.path, tensor=view.name,
                                        advice=advice)
        blocks = block_type(view)
        if blocks is not None:
            return TensorSource(view.name, view.dtype, info.shape, info.nbytes, partial(make, view, None, True),
                                ggml_type=blocks)
        cast = None  # blocks that cannot be copied are decoded when read, and say why they cannot be
    elif info.ggml_type is None and info.dtype in PACKED:
        return TensorSource(view.name, view.dtype, info.shape, info.nbytes, partial(make, view, None, True),
                            code=PACKED[info.dtype].safetensors)
    elif info.ggml_type is None and not is_number(info.dtype):  # bytes, str, datetime, records: as stored
        check_numbers(info.dtype, fmt in RECORD_FORMATS, view.path, view.name, view)
        return TensorSource(view.name, view.dtype, info.shape, info.nbytes, partial(make, view, None, False))
    dtype = view.dtype
    if cast is not None and (dtype in _FLOATS or info.ggml_type is not None):
        dtype = cast
    check_materializable(view, view.path)  # a broadcast view would be written out element by element
    return TensorSource(view.name, dtype, info.shape, math.prod(info.shape) * dtype.itemsize,
                        partial(make, view, dtype if dtype != view.dtype else None, False))


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
            same = [n for n in ordered[1:] if _same_buffer(ckpt, ordered[0], n)]
            if same:
                tied[ordered[0]] = same
    return tied


def _same_buffer(ckpt: Checkpoint, a: str, b: str) -> bool:
    """Two tensors at the same place: of the same buffer? (numpy arrays pickled inline each have their own)"""
    reader = next(r for r in ckpt.readers if r.path == ckpt[a].path)
    if is_remote(reader.file):  # raw() would fetch the bytes: compare the buffers themselves
        return reader.buffer(a) is reader.buffer(b)
    return bool(np.may_share_memory(ckpt[a].raw(), ckpt[b].raw()))


# ----------------------------------------------------------------------------- where to write


def into_directory(src: str, dst: str) -> bool:
    """Whether `dst` names a directory to write into: an existing one, one spelled with a trailing
    separator, or a new name without a suffix when `src` is a model directory (a local one, or a
    URL, ``hf://`` repo or other, with no weight-file or index suffix)."""
    if os.path.isdir(dst) or dst.endswith(("/", os.sep)):
        return True
    if os.path.splitext(os.path.basename(dst))[1]:
        return False
    if is_url(src):
        return not src.rstrip("/").endswith((*WEIGHT_SUFFIXES, *SUFFIXES, ".json"))
    return os.path.isdir(src)


def _layout(dst: str, fmt: str | None, into_dir: bool) -> Outputs:
    if into_dir:
        fmt = fmt or "safetensors"
        format_for_path("x" + _EXTENSIONS.get(fmt, ""), fmt)  # validates the format name
        return Outputs(os.path.join(dst, "model" + _EXTENSIONS[fmt]), fmt)
    return Outputs(dst, format_for_path(dst, fmt))


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
    copy_files: bool = True,
    ggml_options: Mapping[str, Any] | None = None,
    unknown_globals: str = "refuse",
    storage_options: Mapping[str, Any] | None = None,
    download: bool = False,
    parents: bool = False,
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
        progress: called as ``progress(bytes_done_now, total_bytes)`` per tensor (`verify`: twice).
        copy_files: when `src` is a model directory (or an ``hf://`` folder) and `dst` a
            directory, copy the directory's other files (config, tokenizer …) beside the
            weights, as `weightio.model_files` says; other weight files are listed, not copied.
        ggml_options: a llama ggml/ggjt file written as ``.gguf`` becomes the llama GGUF model
            llama.cpp's converter writes (`weightio.formats.ggml_to_gguf`); these set what the
            file does not say: ``context_length``, ``eps``, ``gqa``, ``name``, ``description``.
        unknown_globals: ``"placeholder"`` reads a pickle whose globals are off the allowlist (a
            whole ``torch.save(model)``) through inert placeholders; see `weightio.open`.
        storage_options: for a URL `src`, as `weightio.open` takes it. A remote source streams
            too: each tensor's bytes are fetched as its writer reaches it (`progress` counts them).
        download: for an ``hf://`` `src`, as `weightio.open` takes it.
        parents: create `dst`'s missing parent directories; else a missing one is a `WriteError`
            (a `dst` directory itself is created).

    Returns:
        A `ConvertResult` listing the files written, aliases and notes.

    Raises:
        WriteError: an output exists (without `overwrite`), is an input, cannot be written, or its
            directory is missing (without `parents`).
        UnsupportedDTypeError: a tensor the output format cannot store (quantized without
            `dequantize`, a dtype the format lacks).
        UsageError: an unknown output format, an option combination that cannot be written, or
            a `select` that matches no tensor.
        CorruptFileError: `verify` found written bytes that differ from the source.

    Example:
        >>> convert("pytorch_model.bin", "model.safetensors", dtype="bf16", verify=True)  # doctest: +SKIP
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if is_url(dst):
        raise UsageError("writing to the Hub is not supported (nor to any URL); convert to a local path and upload it",
                         path=redact(dst))
    into_dir = into_directory(src, dst)
    layout = _layout(dst, format, into_dir)
    check_parent(dst, is_directory=into_dir, parents=parents)
    copies_to = os.path.dirname(layout.base) if into_dir and copy_files else None
    limit = None if max_shard_size is None else parse_size(max_shard_size)
    if limit is not None and layout.fmt != "safetensors":
        raise UsageError("sharding (max_shard_size) writes safetensors; use a .safetensors destination", path=dst)
    cast = target_dtype(dtype)
    llama = LlamaOptions.from_mapping(ggml_options)
    stale = remove_stale_temporaries(dst)  # only files a killed writer provably left (their lock is free)
    with open_checkpoint(src, unknown_globals=unknown_globals, storage_options=storage_options,
                         download=download) as ckpt:
        if ggml_options and not (ckpt.format == "ggml" and layout.fmt == "gguf"):
            raise UsageError("ggml options apply to a legacy ggml file converted to .gguf", path=ckpt.path)
        extra = None if copies_to is None else model_files.of_source(src, ckpt.files, copies_to, storage_options)
        try:
            result = _convert(ckpt, layout, cast, dequantize, limit, select, verify, overwrite, progress, extra,
                              llama)
        finally:
            if extra is not None:
                extra.cleanup()
        if is_url(src):
            from .remote import traffic  # imports nothing more than opening the URL did

            result.fetched = traffic(ckpt)
    if stale:
        result.notes.insert(0, f"removed {len(stale)} temporary file(s) an interrupted write left: "
                               + ", ".join(os.path.basename(p) for p in stale))
    return result


def _convert(ckpt: Checkpoint, layout: Outputs, cast: np.dtype | None, dequantize: bool, limit: int | None,
             select: Sequence[str] | None, verify: bool, overwrite: bool, progress: Progress | None,
             extra: model_files.ModelFiles | None = None, llama: LlamaOptions | None = None) -> ConvertResult:
    names = ckpt.select(*(select or ()))
    if not names:
        raise UsageError("no tensor matches " + ", ".join(map(repr, select or ())), path=ckpt.path)
    notes: list[str] = []
    aliases: dict[str, str] = {}
    tied = _tied_groups(ckpt, names)
    if layout.fmt == "safetensors":
        aliases = {other: kept for kept, others in tied.items() for other in others}
    elif tied:
        notes.append(f"{sum(map(len, tied.values()))} tied tensors written as separate copies "
                     f"({layout.fmt} has no aliases)")
    views = {n: ckpt[n] for n in names if n not in aliases}
    sources = {n: _plan_tensor(view, layout.fmt, cast, dequantize) for n, view in views.items()}
    metadata, types, renames = carry.carried(ckpt, {n: v.shape for n, v in views.items()}, layout.fmt, llama, notes)
    if renames:
        sources = {n: dataclasses.replace(src, name=renames[n]) for n, src in sources.items()}
    sizes = {n: src.nbytes for n, src in sources.items()}
    shards = [list(sources)] if limit is None else plan_shards(sizes, limit)
    if layout.fmt == "npy" and len(sources) != 1:
        raise UsageError(f".npy holds one tensor and {len(sources)} are selected; select one (--filter NAME) "
                         "or write .npz / .safetensors", path=layout.base)
    meter = _Meter(0, progress, remote=any(is_remote(r.file) for r in ckpt.readers))
    meter.total = sum(meter.size(views[n], source) for n, source in sources.items()) * (2 if verify else 1)
    copies = [] if extra is None else [(os.path.join(extra.root, *rel.split("/")),
                                        os.path.join(os.path.dirname(layout.base), *rel.split("/")))
                                       for rel in extra.files]
    writer = _Writer(ckpt, layout, views, sources, meter, overwrite, copies, types)
    files = writer.run(shards, metadata, aliases, verify)
    copied = [final for _, final in copies]
    return ConvertResult([f for f in files if f not in copied], layout.fmt, len(sources), sum(sizes.values()),
                         aliases, notes, verify, copied, dict(extra.skipped) if extra else {})


class _Writer:
    """Writes the planned tensors as one file or a sharded set, staged then committed."""

    def __init__(self, ckpt: Checkpoint, layout: Outputs, views: dict[str, TensorView],
                 sources: dict[str, TensorSource], meter: _Meter, overwrite: bool,
                 copies: list[tuple[str, str]], value_types: dict[str, str]) -> None:
        self.ckpt, self.layout, self.views, self.sources, self.meter = ckpt, layout, views, sources, meter
        self.staging = Staging(overwrite)
        self.copies = copies  # (source file, destination) of the model directory's other files
        self.value_types = value_types  # GGUF types of keys that do not come from a GGUF source (carry)

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
        check_outputs(outputs, self.ckpt.files, self.staging.overwrite)
        if self.layout.fmt == "safetensors" and not self.staging.overwrite and os.path.lexists(self.layout.index):
            raise WriteError("already exists and would shadow the new file when the directory is opened",
                             path=self.layout.index, errno=errno.EEXIST, advice=OVERWRITE_ADVICE)
        check_outputs([final for _, final in self.copies], self.ckpt.files, self.staging.overwrite)

    def _write(self, shards: list[list[str]], outputs: list[str], metadata: dict[str, Any],
               aliases: dict[str, str]) -> list[tuple[str, list[str]]]:
        fmt = self.layout.fmt
        extra = {k: v for k, v in aliases.items() if k not in metadata}
        if len(shards) == 1:
            meta = {"format": "pt", **metadata, **extra} if fmt == "safetensors" else metadata
            written = [self._save(shards[0], outputs[0], meta or None)]
            model_files.stage_copies(self.staging, self.copies)
            return written
        written = [self._save(shard, final, {"format": "pt"})
                   for shard, final in zip(shards, outputs[:-1], strict=True)]
        model_files.stage_copies(self.staging, self.copies)  # before the index, which stays the commit point
        carried = {k: v for k, v in metadata.items() if k != "format"}  # "format" is per file, not the index's
        self._write_index(shards, outputs, {**carried, **extra})
        return written

    def _save(self, names: list[str], final: str, metadata: dict[str, Any] | None) -> tuple[str, list[str]]:
        staged = self.staging.path_for(final)
        sources = [self.meter.metered(self.views[n], self.sources[n]) for n in names]
        options: dict[str, Any] = {}
        if self.layout.fmt == "gguf":  # keep each key's GGUF type (UINT64 stays UINT64)
            from .formats.gguf import value_types

            options["value_types"] = {k: t for k, t in {**value_types(self.ckpt), **self.value_types}.items()
                                      if k in (metadata or {})}
        try:
            write_sources(sources, staged, metadata, self.layout.fmt, **options)
        except WeightioError as e:
            if e.path == staged:  # name the destination, not its temporary file
                e.path = final
            raise
        self.staging.hold(staged)
        return staged, names

    def _write_index(self, shards: list[list[str]], outputs: list[str], metadata: dict[str, Any]) -> None:
        total = sum(self.sources[n].nbytes for shard in shards for n in shard)
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
            written_as = {self.sources[n].name: n for n in names}  # output name -> source name (renames)
            found = dict(zip(names, stored, strict=False)) if self.layout.fmt == "npy" else \
                {written_as.get(s, s): s for s in stored}
            if sorted(found) != sorted(names):
                raise CorruptFileError(f"verification failed: the file holds {len(stored)} tensors, "
                                       f"{len(names)} were written", path=path)
            for name in names:
                out = TensorView(reader, found[name], reader.tensors[found[name]])
                self._verify_tensor(out, self.views[name], self.sources[name])
        finally:
            reader.close()

    def _verify_tensor(self, out: TensorView, view: TensorView, src: TensorSource) -> None:
        expected_kind = src.ggml_type or dtype_name(src.dtype)
        if out.shape != src.shape or (out.ggml_type or dtype_name(out.dtype)) != expected_kind:
            raise CorruptFileError(f"verification failed: written as {out.ggml_type or dtype_name(out.dtype)} "
                                   f"{list(out.shape)}, expected {expected_kind} {list(src.shape)}",
                                   path=out.path, tensor=src.name)
        written, wanted = out.raw(), src.little_endian_bytes().reshape(-1).view(np.uint8)
        equal = bytes_equal(written, wanted)
        self.meter.release(view)
        drop_array_pages(written)
        if not equal:
            raise CorruptFileError("verification failed: the written bytes differ from the source's",
                                   path=out.path, tensor=src.name)
        if self.meter.progress is not None:
            self.meter.progress(self.meter.size(view, src), self.meter.total)

    def _remove_stale(self, done: list[str]) -> None:
        """After an overwrite: shards or an index of an earlier save that the new files did not replace."""
        if self.layout.fmt != "safetensors":
            return
        keep = {os.path.abspath(f) for f in done}
        for stale in self.layout.stale():
            if os.path.abspath(stale) not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(stale)
