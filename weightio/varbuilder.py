"""`VarBuilder`: model code asks for tensors by dotted name; weightio finds, checks and places them.

The shape of Candle's ``VarBuilder`` (``candle-nn/src/var_builder.rs``) in Python. A builder is a
cheap, immutable *cursor*: a prefix path, a dtype and a device over one shared backend (the
opened checkpoints, the name resolver and the load report). ``pp`` makes a deeper cursor;
``get(shape, name)`` joins the cursor's prefix and `name` with ``"."``, resolves the result to a
stored tensor, checks its shape and returns it on the cursor's device. Nothing is read until a
``get``; opening reads headers only.

    >>> vb = VarBuilder.from_path("fixtures/tiny-bert")
    >>> vb.pp("encoder").pp("layer").pp(0).get((32, 32), "attention.self.query.weight").shape
    (32, 32)

**Name resolution.** A name `n` the model asks for is looked up as follows; the first step that
finds a stored tensor wins.

1. *Renames* (`rename`): each rename maps the model's full name to the name to look up; a
   rename added later sees the name first (``vb.rename(f).rename(g)`` looks up ``f(g(n))``, like
   Candle's ``rename_f``). A rename returning None hides the tensor.
2. *Exact*: the name as it is.
3. *Wrappers*: a model saved or loaded through a wrapper has the wrapper's attribute in its
   names. In stored names, every ``_orig_mod.`` component (``torch.compile``) is ignored, and a
   leading ``module.`` (``DistributedDataParallel``/``DataParallel``) is ignored when every stored
   name has it. A name the model asks for is also tried without its ``_orig_mod.`` components and
   its leading ``module.`` (a compiled or DDP-wrapped model loading a plain checkpoint).
4. *Legacy names*: ``LayerNorm.weight``/``LayerNorm.bias`` are also looked up as
   ``LayerNorm.gamma``/``LayerNorm.beta`` (old TF-ported checkpoints), weight-norm
   ``parametrizations.weight.original0/1`` as ``weight_g``/``weight_v``, and each the other way.
5. *Base-model prefix*: model and checkpoint may disagree by one leading component ``P``, the
   attribute transformers calls ``base_model_prefix`` (``getattr(model, model.base_model_prefix,
   model)``). *Strip*: a checkpoint saved with a head (``bert.encoder…``, ``classifier…``) serves a
   bare base model asking for ``encoder…``: `n` is looked up as ``P.n``. *Add*: a base-model
   checkpoint (``encoder…``) serves a model with a head asking for ``bert.encoder…``: when the
   checkpoint has no name under ``P.``, ``P.rest`` is looked up as ``rest``. ``P`` is the
   ``base_model_prefix`` given to the builder (`weightio.torch.load_into` passes the module's own
   attribute); otherwise it is inferred from the first name that needs it: for *strip*, the one
   leading component of the checkpoint that holds more than half of its tensors and under which
   ``P.n`` exists; for *add*, the first component of `n` when the checkpoint has nothing under it.
   One ``P`` serves the whole builder, as transformers makes one decision per model: once chosen it
   is fixed, shown in the report, and no other prefix is tried. ``auto_prefix=False`` turns
   inference off.

A name still not found raises `TensorNotFoundError` listing the closest stored names.

**Load report.** Every ``get`` is recorded: `report` gives the stored names used, the stored
names never used, the names asked for but missing, shape mismatches and renames, for the whole
checkpoint or, on a cursor, for the part of the checkpoint under it; ``finish(strict=True)`` raises
when something is missing or unused (the ``load_state_dict(strict=True)`` contract).

**Tensor parallel.** ``get_sharded(shape, name, dim, rank, world_size)`` returns one rank's
equal slice along `dim` (Candle's ``Shard {dim, rank, world_size}``), reading only that slice's
bytes: one contiguous range for dim 0, a strided set of row segments for other dims.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from . import devices
from .checkpoint import Checkpoint, open_checkpoint
from .dtypes import parse_dtype
from .errors import CorruptFileError, ShapeMismatchError, TensorNotFoundError, WeightioError, close_matches
from .view import TensorView

__all__ = ["VarBuilder", "LoadReport", "RenameSpec"]

RenameSpec = Callable[[str], "str | None"] | Mapping[str, str] | Sequence[tuple[str, str]]

# (suffix the model asks for, suffix older checkpoints store): looked up in both directions.
LEGACY_SUFFIXES = (
    ("LayerNorm.weight", "LayerNorm.gamma"),
    ("LayerNorm.bias", "LayerNorm.beta"),
    ("parametrizations.weight.original0", "weight_g"),
    ("parametrizations.weight.original1", "weight_v"),
)
COMPILE_WRAPPER = "_orig_mod"  # torch.compile's OptimizedModule keeps the model under this attribute
DDP_WRAPPER = "module"  # DistributedDataParallel / DataParallel keep the model under this attribute
_SHOWN = 10  # names listed in a message before "… and N more"


# ----------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class LoadReport:
    """What a load used, left unused and missed.

    Attributes:
        used: stored names read, in the order first read.
        unused: stored names never read, in checkpoint order (within the cursor's scope).
        missing: names asked for that no stored tensor matched, in the order asked.
        mismatched: ``(name, expected shape, stored shape)`` for every rejected ``get``.
        renamed: name asked for -> stored name, where resolution changed the name.
        base_model_prefix: the base-model prefix resolution used (``"bert"``), or None.
        bytes_read: stored bytes handed to the device (a shard counts its own bytes only).
    """

    used: tuple[str, ...]
    unused: tuple[str, ...]
    missing: tuple[str, ...]
    mismatched: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    renamed: dict[str, str]
    base_model_prefix: str | None
    bytes_read: int

    @property
    def ok(self) -> bool:
        """True when nothing is missing, unused or mismatched."""
        return not (self.missing or self.unused or self.mismatched)

    def __str__(self) -> str:
        lines = [f"used {len(self.used)} of {len(self.used) + len(self.unused)} tensors "
                 f"({self.bytes_read:,} bytes read)"]
        if self.base_model_prefix is not None:
            lines.append(f"base-model prefix: {self.base_model_prefix!r}")
        for label, names in (("missing", self.missing), ("unused", self.unused)):
            if names:
                lines.append(f"{label} ({len(names)}): {_listing(names)}")
        for name, expected, found in self.mismatched:
            lines.append(f"shape mismatch: {name}: expected {expected}, stored {found}")
        return "\n".join(lines)


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", … and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


class _Usage:
    """Every request made through any cursor of one builder (shared, thread-safe)."""

    def __init__(self) -> None:
        self.hits: dict[str, tuple[str, int]] = {}  # asked -> (stored, bytes handed out)
        self.used: dict[str, None] = {}  # stored names, first-use order
        self.missing: dict[str, None] = {}
        self.mismatched: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.lock = threading.Lock()

    def hit(self, asked: str, stored: str, nbytes: int) -> None:
        with self.lock:
            previous = self.hits.get(asked, (stored, 0))[1]
            self.hits[asked] = (stored, previous + nbytes)
            self.used.setdefault(stored)

    def miss(self, asked: str) -> None:
        with self.lock:
            self.missing.setdefault(asked)

    def mismatch(self, asked: str, expected: tuple[int, ...], found: tuple[int, ...]) -> None:
        with self.lock:
            self.mismatched[asked] = (expected, found)


# ----------------------------------------------------------------------------- sources


class _Store:
    """The union of the sources: stored name -> value (`TensorView`, array or framework tensor)."""

    def __init__(self, sources: Sequence[Mapping[str, Any]], paths: Sequence[str]) -> None:
        self.sources, self.paths = list(sources), list(paths)
        self.path = self.paths[0] if len(self.paths) == 1 else ", ".join(self.paths)
        self._where: dict[str, int] | None = None
        if len(self.sources) > 1:
            self._where = self._merge()
        self._names: list[str] | None = None

    def _merge(self) -> dict[str, int]:
        where: dict[str, int] = {}
        for i, source in enumerate(self.sources):
            for name in source:
                if name in where:
                    raise CorruptFileError(f"is in two sources: {self.paths[where[name]]} and {self.paths[i]}",
                                           path=self.paths[i], tensor=name)
                where[name] = i
        return where

    def __contains__(self, name: str) -> bool:
        return name in self._where if self._where is not None else name in self.sources[0]

    def value(self, name: str) -> Any:
        return self.sources[0 if self._where is None else self._where[name]][name]

    def path_of(self, name: str) -> str:
        return self.paths[0 if self._where is None else self._where[name]]

    @property
    def names(self) -> list[str]:
        """Every stored name, in source order then each source's own (file) order."""
        if self._names is None:
            self._names = list(self._where) if self._where is not None else list(self.sources[0])
        return self._names


# ----------------------------------------------------------------------------- resolution


class _Resolver:
    """The automatic rules (steps 2-5 of the module docstring) over one store."""

    def __init__(self, store: _Store, base_model_prefix: str | None, auto_prefix: bool) -> None:
        self.store = store
        self.prefix = base_model_prefix
        self.auto = auto_prefix
        self._lock = threading.Lock()
        self._view: dict[str, str] | None = None
        self._tops: Counter[str] | None = None

    def resolve(self, name: str, commit: bool = True) -> str | None:
        """The stored name `name` resolves to, or None. `commit=False` never fixes an inferred prefix."""
        if name in self.store:  # the common case, first and cheapest
            return name
        for form in _forms(name):
            hit = self._lookup(form)
            if hit is not None:
                return hit
        return self._with_prefix(name, commit)

    def hint(self, prefix: str | None) -> None:
        """Use `prefix` as the base-model prefix unless one was given or already chosen."""
        with self._lock:
            if prefix and self.prefix is None and self.auto:
                self.prefix = prefix

    # -- exact and wrapper-stripped lookups
    def _lookup(self, name: str) -> str | None:
        if name in self.store:
            return name
        return self._unwrapped().get(name)

    def _unwrapped(self) -> dict[str, str]:
        """Wrapper-free name -> stored name, for checkpoints saved through DDP or torch.compile."""
        if self._view is None:
            names = self.store.names
            uncompiled = [_strip_wrappers(n, False) for n in names]
            ddp = bool(names) and all(n.startswith(DDP_WRAPPER + ".") for n in uncompiled)
            view: dict[str, str] = {}
            clashes = set()
            for stored, name in zip(names, uncompiled, strict=True):
                plain = name[len(DDP_WRAPPER) + 1:] if ddp else name
                if plain != stored:
                    if plain in view or plain in self.store:
                        clashes.add(plain)
                    view[plain] = stored
            self._view = {k: v for k, v in view.items() if k not in clashes}
        return self._view

    def _top_counts(self) -> Counter[str]:
        """How many tensors each leading component holds (of wrapper-free names)."""
        if self._tops is None:
            unwrapped = self._unwrapped()
            plain = {s: p for p, s in unwrapped.items()}
            self._tops = Counter(plain.get(n, n).split(".", 1)[0] for n in self.store.names)
        return self._tops

    # -- the base-model prefix
    def _with_prefix(self, name: str, commit: bool) -> str | None:
        prefix = self.prefix
        if prefix is not None:
            return self._apply(name, prefix)
        if not self.auto:
            return None
        found = [(p, hit) for p in self._candidates(name) for hit in (self._apply(name, p),) if hit is not None]
        if len(found) != 1:
            return None
        if commit:
            with self._lock:
                if self.prefix is None:
                    self.prefix = found[0][0]
                elif self.prefix != found[0][0]:  # another thread chose first: follow its choice
                    return self._apply(name, self.prefix)
        return found[0][1]

    def _candidates(self, name: str) -> list[str]:
        tops = self._top_counts()
        total = sum(tops.values())
        major = [p for p, n in tops.items() if 2 * n > total]
        first = name.split(".", 1)[0]
        return major + ([first] if "." in name and first not in tops else [])

    def _apply(self, name: str, prefix: str) -> str | None:
        tops = self._top_counts()
        if prefix in tops:  # the checkpoint has P: the model's names lack it
            if name.startswith(prefix + "."):
                return None
            return self._first(f"{prefix}.{form}" for form in _forms(name))
        if name.startswith(prefix + "."):  # the model has P: the checkpoint's names lack it
            return self._first(_forms(name[len(prefix) + 1:]))
        return None

    def _first(self, names: Iterable[str]) -> str | None:
        for form in names:
            hit = self._lookup(form)
            if hit is not None:
                return hit
        return None


def _strip_wrappers(name: str, ddp: bool) -> str:
    """`name` without its ``_orig_mod`` components, and without a leading ``module.`` if `ddp`."""
    if COMPILE_WRAPPER in name:
        name = ".".join(p for p in name.split(".") if p != COMPILE_WRAPPER)
    return name[len(DDP_WRAPPER) + 1:] if ddp and name.startswith(DDP_WRAPPER + ".") else name


def _forms(name: str) -> list[str]:
    """`name` and its legacy spellings, then the same without wrapper components (step 3)."""
    forms = _legacy_forms(name)
    plain = _strip_wrappers(name, True)
    return forms + _legacy_forms(plain) if plain != name and plain else forms


def _legacy_forms(name: str) -> list[str]:
    """`name`, then its legacy spellings (see `LEGACY_SUFFIXES`)."""
    forms = [name]
    for new, old in LEGACY_SUFFIXES:
        for a, b in ((new, old), (old, new)):
            if name == a or name.endswith("." + a):
                forms.append(name[: len(name) - len(a)] + b)
    return forms


class _Renamed:
    """A rename layered over a resolver (or over another rename)."""

    def __init__(self, inner: Any, renamer: Callable[[str], str | None]) -> None:
        self.inner, self.renamer = inner, renamer

    def resolve(self, name: str, commit: bool = True) -> str | None:
        renamed = self.renamer(name)
        if renamed is None:
            return None
        if not isinstance(renamed, str):
            raise TypeError(f"a rename must return a str or None, got {type(renamed).__name__} for {name!r}")
        return self.inner.resolve(renamed, commit)


def renamer(spec: RenameSpec) -> Callable[[str], str | None]:
    """A rename function from a callable, an exact ``{name: stored_name}`` dict, or regex rules.

    Regex rules are ``(pattern, replacement)`` pairs applied in order with `re.sub`, each to the
    previous one's result (like successive ``sed`` substitutions).

    Example:
        >>> renamer([(r"^layers\\.(\\d+)\\.", r"model.layers.\\1.")])("layers.3.mlp.weight")
        'model.layers.3.mlp.weight'
    """
    if callable(spec):
        return spec
    if isinstance(spec, Mapping):
        table = dict(spec)
        return lambda name: table.get(name, name)
    rules = [(re.compile(p), r) for p, r in spec]

    def apply(name: str) -> str:
        for pattern, replacement in rules:
            name = pattern.sub(replacement, name)
        return name

    return apply


# ----------------------------------------------------------------------------- the builder


class _Shared:
    """What every cursor of one builder shares: store, resolver, report, owned checkpoints."""

    def __init__(self, store: _Store, resolver: _Resolver, owned: Sequence[Checkpoint]) -> None:
        self.store, self.resolver, self.owned = store, resolver, list(owned)
        self.usage = _Usage()


class VarBuilder:
    """A cursor into a checkpoint: a prefix, a dtype and a device over one shared backend.

    Build one with `from_path`, `from_checkpoint` or `from_dict`; derive cursors with `pp`,
    `to_dtype`, `to_device` and `rename` (each returns a new cursor; the original is unchanged).

    Args are those of `from_path`; see the module docstring for how names are resolved.

    Example:
        >>> vb = VarBuilder.from_path("fixtures/tiny-bert", dtype="float16")
        >>> layer = vb.pp("encoder.layer").pp(1)
        >>> layer.prefix
        'encoder.layer.1'
        >>> layer.get(32, "output.dense.bias").dtype
        dtype('float16')
    """

    __slots__ = ("_shared", "_backend", "_path", "_dtype", "_device")

    def __init__(self, shared: _Shared, backend: Any, path: tuple[str, ...], dtype: np.dtype | None,
                 device: devices.Device) -> None:
        self._shared, self._backend = shared, backend
        self._path, self._dtype, self._device = path, dtype, device

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        dtype: Any = None,
        device: str | devices.Device = "numpy",
        *,
        base_model_prefix: str | None = None,
        auto_prefix: bool = True,
        renames: RenameSpec | None = None,
    ) -> VarBuilder:
        """A builder over a checkpoint file, a model directory, a sharded index file, or a list of these.

        Args:
            path: a file of any supported format, a directory (`weightio.open` layouts), a
                ``*.index.json`` file, or a list of any of these (served as one checkpoint; a
                name stored in two of them is a `CorruptFileError`).
            dtype: converts floating-point tensors on load (``"bf16"``, ``"float32"``, …);
                integer and bool tensors keep their type. None keeps every stored dtype.
            device: where tensors go (`weightio.devices`): ``"numpy"``, ``"torch"``, ``"torch:cuda:0"``, …
            base_model_prefix: the leading component model and checkpoint may disagree by
                (``"bert"``); None infers it when needed.
            auto_prefix: set False to never infer a base-model prefix.
            renames: a first rename (see `rename`).

        The builder owns the files it opened: `close` it (or use it as a context manager);
        tensors already returned stay valid.
        """
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        opened: list[Checkpoint] = []
        try:
            for p in paths:
                opened.append(open_checkpoint(p))
            return cls._build(opened, [c.path for c in opened], opened, dtype, device,
                              base_model_prefix, auto_prefix, renames)
        except BaseException:
            for ckpt in opened:
                ckpt.close()
            raise

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        dtype: Any = None,
        device: str | devices.Device = "numpy",
        **options: Any,
    ) -> VarBuilder:
        """A builder over open checkpoint(s) (any `Mapping` of names to tensors); the caller closes them.

        Options are `from_path`'s keyword arguments.
        """
        sources = [checkpoint] if isinstance(checkpoint, Mapping) else list(checkpoint)
        paths = [str(getattr(s, "path", f"<{type(s).__name__}>")) for s in sources]
        return cls._build(sources, paths, [], dtype, device, **_options(options))

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, Any],
        dtype: Any = None,
        device: str | devices.Device = "numpy",
        **options: Any,
    ) -> VarBuilder:
        """A builder over in-memory tensors: numpy arrays, `TensorView`s, torch/jax/cupy tensors.

        Tensors already on the builder's device are handed out as they are (no round trip
        through numpy). Options are `from_path`'s keyword arguments.
        """
        if not isinstance(tensors, Mapping):
            raise TypeError(f"from_dict takes a mapping of name -> tensor, got {type(tensors).__name__}")
        return cls._build([tensors], ["<dict>"], [], dtype, device, **_options(options))

    @classmethod
    def _build(cls, sources: Sequence[Mapping[str, Any]], paths: Sequence[str], owned: Sequence[Checkpoint],
               dtype: Any, device: Any, base_model_prefix: str | None = None, auto_prefix: bool = True,
               renames: RenameSpec | None = None) -> VarBuilder:
        store = _Store(sources, paths)
        shared = _Shared(store, _Resolver(store, base_model_prefix, auto_prefix), owned)
        vb = cls(shared, shared.resolver, (), _dtype_arg(dtype), devices.parse_device(device))
        return vb if renames is None else vb.rename(renames)

    # ------------------------------------------------------------------ cursors
    def pp(self, component: str | int) -> VarBuilder:
        """A cursor one level deeper: ``vb.pp("encoder").pp(0)`` has prefix ``encoder.0``.

        A component may itself contain dots (``vb.pp("encoder.layer")``); an empty one changes nothing.
        """
        if isinstance(component, bool) or not isinstance(component, (str, int, np.integer)):
            raise TypeError(f"a prefix component is a str or int, got {type(component).__name__}")
        text = str(component) if isinstance(component, str) else str(int(component))
        path = self._path + (text,) if text else self._path
        return VarBuilder(self._shared, self._backend, path, self._dtype, self._device)

    push_prefix = pp

    def root(self) -> VarBuilder:
        """A cursor with no prefix (same backend, renames, dtype and device)."""
        return VarBuilder(self._shared, self._backend, (), self._dtype, self._device)

    @property
    def prefix(self) -> str:
        """This cursor's prefix, its components joined with ``"."`` (``""`` at the root)."""
        return ".".join(self._path)

    @property
    def dtype(self) -> np.dtype | None:
        """The dtype floating-point tensors are converted to, or None to keep the stored one."""
        return self._dtype

    @property
    def device(self) -> devices.Device:
        return self._device

    def to_dtype(self, dtype: Any) -> VarBuilder:
        """The same cursor converting floating-point tensors to `dtype` (None: keep stored dtypes)."""
        return VarBuilder(self._shared, self._backend, self._path, _dtype_arg(dtype), self._device)

    def to_device(self, device: str | devices.Device) -> VarBuilder:
        """The same cursor placing tensors on `device`."""
        return VarBuilder(self._shared, self._backend, self._path, self._dtype, devices.parse_device(device))

    def rename(self, spec: RenameSpec) -> VarBuilder:
        """The same cursor looking names up through a rename (see `renamer` and the module docstring).

        The rename sees the full name the model asks for (prefix included) and returns the name
        to look up. Renames stack: the newest sees the name first.

        Example:
            >>> vb = VarBuilder.from_dict({"enc.w": np.zeros(2)})
            >>> vb.rename({"encoder.w": "enc.w"}).get(2, "encoder.w").shape
            (2,)
        """
        backend = _Renamed(self._backend, renamer(spec))
        return VarBuilder(self._shared, backend, self._path, self._dtype, self._device)

    def __repr__(self) -> str:
        dtype = "stored" if self._dtype is None else self._dtype.name
        return f"<VarBuilder {self.prefix!r} over {self._shared.store.path}: device={self._device}, dtype={dtype}>"

    # ------------------------------------------------------------------ lookups
    def contains(self, name: str) -> bool:
        """Whether ``prefix.name`` resolves to a stored tensor (exact name, not a prefix of names).

        Asking does not count as a use or a miss, and never fixes an inferred base-model prefix.
        """
        return self._backend.resolve(self._full(name), False) is not None

    __contains__ = contains

    def get(self, shape: int | Sequence[int], name: str, dtype: Any = None) -> Any:
        """The tensor ``prefix.name`` on this cursor's device, after checking its shape.

        Args:
            shape: the shape the model expects (an int for 1-D).
            name: the name below this cursor's prefix (may contain dots).
            dtype: overrides the cursor's dtype for this tensor (and applies to any tensor,
                integer ones too).

        Raises:
            TensorNotFoundError: no stored tensor resolves from the name (lists the closest).
            ShapeMismatchError: the stored shape differs (says the full name, expected and found).
        """
        full, stored, value = self._find(name)
        self._check_shape(full, stored, value, _shape_arg(shape))
        return self._place(full, stored, value, dtype)

    def get_unchecked(self, name: str, dtype: Any = None) -> Any:
        """The tensor ``prefix.name`` whatever its shape."""
        full, stored, value = self._find(name)
        return self._place(full, stored, value, dtype)

    def get_sharded(self, shape: int | Sequence[int] | None, name: str, dim: int, rank: int, world_size: int,
                    dtype: Any = None) -> Any:
        """Rank `rank`'s slice of ``prefix.name``: one of `world_size` equal parts along `dim`.

        Only the slice's bytes are read: along dim 0 one contiguous range; along another dim the
        slice's segment of every row (a strided view of the mapping; devices that need
        contiguous memory receive a packed copy of just those bytes).

        Args:
            shape: the whole (unsharded) tensor's expected shape, or None to skip the check.
            name, dtype: as in `get`.
            dim: the dimension to split (negative counts from the end).
            rank, world_size: which part, of how many (``torch.distributed.get_rank()`` /
                ``get_world_size()`` under torchrun).

        Raises:
            ShapeMismatchError: wrong shape, `dim` out of range, a size that does not divide by
                `world_size`, or `rank` outside ``[0, world_size)``.
        """
        full, stored, value = self._find(name)
        found = _shape_of(value)
        if shape is not None:
            self._check_shape(full, stored, value, _shape_arg(shape))
        key = _shard_key(found, dim, rank, world_size, path=_file_of(value, self._shared.store.path_of(stored)),
                         name=full)
        return self._place(full, stored, value, dtype, key, world_size)

    def load_all(self, device: str | devices.Device | None = None, dtype: Any = None) -> dict[str, Any]:
        """Every stored tensor under this cursor's prefix, moved in one bulk transfer.

        Keys are stored names relative to the prefix (no renames or resolution apply). GPUs
        receive large contiguous runs through pinned buffers (`weightio.devices.load_all`).

        Args:
            device: defaults to the cursor's device.
            dtype: converts floating-point tensors; defaults to the cursor's dtype.
        """
        store, head = self._shared.store, self.prefix + "." if self._path else ""
        names = [n for n in store.names if n.startswith(head)]
        values = {n[len(head):]: store.value(n) for n in names}
        wanted = self._dtype if dtype is None else parse_dtype(dtype)
        out = devices.load_all(values, self._device if device is None else device, wanted)
        for n in names:
            self._shared.usage.hit(n, n, _nbytes(store.value(n)))
        return out

    # ------------------------------------------------------------------ the report
    def report(self) -> LoadReport:
        """What was used, unused and missing — for the whole checkpoint at the root, or, on a
        cursor, for the requests made under its prefix and the stored tensors under the part of the
        checkpoint that prefix resolved to (so a partial load of one sub-module reports on it alone)."""
        usage, store = self._shared.usage, self._shared.store
        with usage.lock:
            hits = {a: h for a, h in usage.hits.items() if self._covers(a)}
            missing = tuple(a for a in usage.missing if self._covers(a))
            mismatched = tuple((a, e, f) for a, (e, f) in usage.mismatched.items() if self._covers(a))
            used_all = set(usage.used)
        used = tuple(dict.fromkeys(s for s, _ in hits.values()))
        scopes = self._scopes(hits)
        unused = tuple(n for n in store.names if n not in used_all and _under(n, scopes))
        renamed = {a: s for a, (s, _) in hits.items() if a != s}
        return LoadReport(used, unused, missing, mismatched, renamed, self._shared.resolver.prefix,
                          sum(n for _, n in hits.values()))

    def finish(self, strict: bool = True) -> LoadReport:
        """The report; with `strict`, an error if any tensor was missing, mismatched or unused.

        Raises:
            TensorNotFoundError: names were asked for and not found (all listed).
            ShapeMismatchError: a ``get`` was refused for its shape (and the error was caught).
            WeightioError: stored tensors were never used (all listed).
        """
        report = self.report()
        if strict and not report.ok:
            raise self._strict_error(report)
        return report

    def _strict_error(self, report: LoadReport) -> WeightioError:
        store = self._shared.store
        extra = f"; unused: {_listing(report.unused)}" if report.unused else ""
        if report.missing:
            first = report.missing[0]
            message = (f"{len(report.missing)} tensor(s) asked for but not in the checkpoint: "
                       f"{_listing(report.missing)}{extra}")
            return TensorNotFoundError(first, store.names, path=store.path, message=message)
        if report.mismatched:
            name, expected, found = report.mismatched[0]
            return ShapeMismatchError(f"expected shape {expected}, found {found} "
                                      f"({len(report.mismatched)} mismatch(es))", path=store.path, tensor=name)
        return WeightioError(f"{len(report.unused)} stored tensor(s) were never used: {_listing(report.unused)}; "
                             "pass strict=False to allow this", path=store.path)

    def _covers(self, asked: str) -> bool:
        head = self.prefix
        return not head or asked == head or asked.startswith(head + ".")

    def _scopes(self, hits: Mapping[str, tuple[str, int]]) -> list[str] | None:
        """The stored-name prefixes this cursor's requests resolved under (None: everything)."""
        if not self._path:
            return None
        head = self.prefix
        found = set()
        for asked, (stored, _) in hits.items():
            rest = asked[len(head) + 1:]
            if rest and (stored == rest or stored.endswith("." + rest)):
                found.add(stored[: len(stored) - len(rest)])
        return sorted(found) or [head + "."]

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the files this builder opened (`from_path`). Returned tensors stay valid."""
        for ckpt in self._shared.owned:
            ckpt.close()

    def __enter__(self) -> VarBuilder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _full(self, name: str) -> str:
        if not isinstance(name, str):
            raise TypeError(f"a tensor name is a str, got {type(name).__name__}")
        return ".".join(self._path + (name,)) if name else self.prefix

    def _find(self, name: str) -> tuple[str, str, Any]:
        full = self._full(name)
        stored = self._backend.resolve(full)
        if stored is None:
            self._shared.usage.miss(full)
            raise self._not_found(full)
        return full, stored, self._shared.store.value(stored)

    def _not_found(self, full: str) -> TensorNotFoundError:
        store = self._shared.store
        prefix = self._shared.resolver.prefix
        candidates = store.names
        suggestions = close_matches(full, candidates)
        if not suggestions and prefix:
            suggestions = close_matches(f"{prefix}.{full}", candidates)
        message = "no such tensor"
        if prefix is not None:
            message += f" (base-model prefix {prefix!r})"
        if suggestions:
            message += "; did you mean " + ", ".join(repr(s) for s in suggestions) + "?"
        err = TensorNotFoundError(full, (), path=store.path, message=message)
        err.suggestions = suggestions
        return err

    def _check_shape(self, full: str, stored: str, value: Any, expected: tuple[int, ...]) -> None:
        found = _shape_of(value)
        if found != expected:
            self._shared.usage.mismatch(full, expected, found)
            where = f" (stored as {stored!r})" if stored != full else ""
            raise ShapeMismatchError(f"expected shape {expected}, found {found}{where}",
                                     path=_file_of(value, self._shared.store.path_of(stored)), tensor=full)

    def _place(self, full: str, stored: str, value: Any, dtype: Any, key: tuple | None = None,
               parts: int = 1) -> Any:
        wanted = self._cast_to(value, dtype)
        source = value if key is None else _select(value, key)
        out = devices.place(source, self._device, wanted)
        self._shared.usage.hit(full, stored, _nbytes(value) // parts)
        return out

    def _cast_to(self, value: Any, dtype: Any) -> np.dtype | None:
        stored = devices._dtype_of(value)
        if dtype is not None:
            wanted = parse_dtype(dtype)
        elif self._dtype is not None and devices.is_floating(stored):
            wanted = self._dtype
        else:
            return None
        return None if wanted == stored else wanted


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    known = {"base_model_prefix", "auto_prefix", "renames"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"unexpected option(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    return dict(options)


def _dtype_arg(dtype: Any) -> np.dtype | None:
    return None if dtype is None else parse_dtype(dtype)


def _shape_arg(shape: Any) -> tuple[int, ...]:
    if type(shape) is tuple and all(type(d) is int for d in shape):  # the common case
        return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"a shape is an int or a sequence of ints, got {type(shape).__name__}") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"a shape is an int or a sequence of ints, got {shape!r}")
    return tuple(int(d) for d in dims)


def _file_of(value: Any, fallback: str) -> str:
    """The file a stored tensor comes from (a shard of a directory, say), for error messages."""
    return value.path if isinstance(value, TensorView) else fallback


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape)


def _nbytes(value: Any) -> int:
    if isinstance(value, (TensorView, np.ndarray)):
        return int(value.nbytes)
    return math.prod(_shape_of(value)) * devices._dtype_of(value).itemsize


def _select(value: Any, key: tuple) -> Any:
    """`value[key]` without reading anything outside the selection (views stay views)."""
    return value[key] if hasattr(value, "__getitem__") else devices.as_numpy(value)[key]


def _shard_key(shape: tuple[int, ...], dim: int, rank: int, world_size: int, *, path: str, name: str) -> tuple:
    """The index selecting rank `rank` of `world_size` equal parts of `shape` along `dim`."""
    def fail(message: str) -> ShapeMismatchError:
        return ShapeMismatchError(message, path=path, tensor=name)

    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (dim, rank, world_size)):
        raise TypeError("dim, rank and world_size are ints")
    if world_size < 1 or not 0 <= rank < world_size:
        raise fail(f"rank {rank} is outside world_size {world_size}")
    if not -len(shape) <= dim < len(shape):
        raise fail(f"cannot shard a tensor of shape {shape} along dim {dim}")
    dim %= len(shape)
    size = shape[dim]
    if size % world_size:
        raise fail(f"dim {dim} of shape {shape} has size {size}, which does not split into "
                   f"{world_size} equal shards")
    block = size // world_size
    return (slice(None),) * dim + (slice(rank * block, (rank + 1) * block),)


def _under(name: str, scopes: list[str] | None) -> bool:
    return scopes is None or any(name.startswith(s) for s in scopes)
