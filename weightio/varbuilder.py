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

**Name resolution.** The cursor's prefix and the name are joined into the full name the model
asks for; `weightio.names` resolves it to a stored tensor: renames (`rename`), the exact name,
names saved through ``torch.compile``/DDP wrappers, legacy spellings (``LayerNorm.gamma``) and
a base-model prefix (``bert.``) that model and checkpoint disagree by. A name still not found
raises `TensorNotFoundError` listing the closest stored names.

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
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import numpy as np

from . import devices
from ._io import MappedFile
from .checkpoint import Checkpoint, open_checkpoint
from .dtypes import parse_dtype
from .errors import ShapeMismatchError, TensorNotFoundError, WeightioError, close_matches
from .names import LoadReport, Renamed, RenameSpec, Resolver, Sources, Usage, renamer
from .names import listing as _listing  # (weightio.torch imports it from here)
from .view import ELEMENT_SIZES, PLAIN_READERS, TensorView, _plain_buffer, plain_get, plain_get_py

__all__ = ["VarBuilder", "LoadReport", "RenameSpec"]


# ----------------------------------------------------------------------------- the builder


class _Shared:
    """What every cursor of one builder shares: store, resolver, report, owned checkpoints."""

    def __init__(self, store: Sources, resolver: Resolver, owned: Sequence[Checkpoint]) -> None:
        self.store, self.resolver, self.owned = store, resolver, list(owned)
        # `get`'s shortest path (`view.plain_get`) over the one checkpoint served (None: several
        # sources, not a Checkpoint, or none of its readers the C path serves: one whose `buffer`
        # is its own, a remote file)
        only = store.sources[0] if len(store.sources) == 1 else None
        if type(only) is not Checkpoint or not (plain_get is plain_get_py or any(
                _plain_buffer(type(r)) and type(getattr(r, "file", None)) is MappedFile for r in only._readers)):
            self.usage, self.fast, self.fill = Usage(), None, None
            return
        self.usage = usage = Usage(only._placed, len(only))
        self.fast = (only._placed, only._readers, usage.stamps, usage.plain, ELEMENT_SIZES, PLAIN_READERS, MappedFile,
                     usage)
        self.fill = only._fill_placed  # (the name -> (info, reader, serial) map the short path reads)


class VarBuilder:
    """A cursor into a checkpoint: a prefix, a dtype and a device over one shared backend.

    Build one with `from_path`, `from_checkpoint` or `from_dict`; derive cursors with `pp`,
    `to_dtype`, `to_device` and `rename` (each returns a new cursor; the original is unchanged).

    Args are those of `from_path`; see `weightio.names` for how names are resolved.

    Example:
        >>> vb = VarBuilder.from_path("fixtures/tiny-bert", dtype="float16")
        >>> layer = vb.pp("encoder.layer").pp(1)
        >>> layer.prefix
        'encoder.layer.1'
        >>> layer.get(32, "output.dense.bias").dtype
        dtype('float16')
    """

    __slots__ = ("_shared", "_backend", "_path", "_dtype", "_device", "_head", "_plain")

    def __init__(self, shared: _Shared, backend: Any, path: tuple[str, ...], dtype: np.dtype | None,
                 device: devices.Device) -> None:
        self._shared, self._backend = shared, backend
        self._path, self._dtype, self._device = path, dtype, device
        self._head = ".".join(path) + "." if path else ""  # what a full name starts with
        # `get`'s shortest path: one checkpoint, names looked up as they are, numpy arrays as stored
        plain = backend is shared.resolver and dtype is None and device.framework == "numpy"
        self._plain = shared.fast + (self._head,) if plain and shared.fast is not None else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_path(cls, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], dtype: Any = None,
                  device: str | devices.Device = "numpy", *, base_model_prefix: str | None = None,
                  auto_prefix: bool = True, renames: RenameSpec | None = None,
                  unknown_globals: str = "refuse") -> VarBuilder:
        """A builder over a checkpoint file, a model directory, a sharded index file, or a list of these.

        Args:
            path: a file of any supported format, a directory (`weightio.open` layouts), a
                ``*.index.json`` file, or a list of any of these (served as one checkpoint; a
                name stored in two of them is a `CorruptFileError`).
            dtype: converts floating-point tensors on load (``"bf16"``, ``"float32"``, …);
                integer and bool tensors keep their type. None (or ``"auto"``) keeps every stored dtype.
            device: where tensors go (`weightio.devices`): ``"numpy"``, ``"torch"``, ``"torch:cuda:0"``, …
            base_model_prefix: the leading component model and checkpoint may disagree by
                (``"bert"``); None infers it when needed.
            auto_prefix: set False to never infer a base-model prefix.
            renames: a first rename (see `rename`).
            unknown_globals: ``"placeholder"`` reads pickles whose globals are off the allowlist
                (a whole ``torch.save(model)``) through inert placeholders; see `weightio.open`.

        The builder owns the files it opened: `close` it (or use it as a context manager);
        tensors already returned stay valid.
        """
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        opened: list[Checkpoint] = []
        try:
            for p in paths:
                opened.append(open_checkpoint(p, unknown_globals=unknown_globals))
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
        store = Sources(sources, paths)
        shared = _Shared(store, Resolver(store, base_model_prefix, auto_prefix), owned)
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
        """The same cursor looking names up through a rename (see `weightio.names.renamer` and `weightio.names`).

        The rename sees the full name the model asks for (prefix included) and returns the name
        to look up. Renames stack: the newest sees the name first.

        Example:
            >>> vb = VarBuilder.from_dict({"enc.w": np.zeros(2)})
            >>> vb.rename({"encoder.w": "enc.w"}).get(2, "encoder.w").shape
            (2,)
        """
        backend = Renamed(self._backend, renamer(spec))
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

    def stored_names(self) -> list[str]:
        """Every stored name of the checkpoint(s), in file order, whatever the cursor (do not modify it)."""
        return self._shared.store.names

    def locate(self, name: str) -> tuple[str, tuple[int, ...], np.dtype] | None:
        """Where ``prefix.name`` is stored: ``(stored name, shape, stored dtype)``, or None.

        Reads no data and is not a use (the report does not count it); like `get`, and unlike
        `contains`, it fixes an inferred base-model prefix.
        """
        stored = self._backend.resolve(self._full(name))
        if stored is None:
            return None
        value = self._shared.store.value(stored)
        return stored, _shape_of(value), devices.dtype_of(value)

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
        plain = self._plain
        if plain is not None and dtype is None:  # a stored name on numpy as stored (`view.plain_get`)
            out = plain_get(plain, name, shape)
            if out is not None:
                return out
            if not plain[0]:  # (the map it reads is made by the first request: this one goes the general way)
                cast("Callable[[], object]", self._shared.fill)()  # (set with `fast`, which `plain` is made from)
        full, stored, value = self._find(name)
        self._check_shape(full, stored, value, _shape_arg(shape))
        return self._place(full, stored, value, dtype)

    def _get_many(self, requests: Sequence[tuple[Sequence[int], str, Any]]) -> list[Any]:
        """`get` of every ``(shape, name, dtype)``, moved in bulk transfers (a GPU receives large
        runs through its staging ring instead of one copy per tensor). Every shape is checked
        before any byte moves. On a GPU each result has a device allocation of its own, as
        `get`'s do (not a view of a shared run); elsewhere results are what `get` gives.

        Tensors kept as stored move in one transfer; those to be cast move in batches of about
        `_CAST_BATCH` bytes, each cast before the next moves, so that the stored and the cast
        copies of a whole model are never on the device together."""
        found = []
        for shape, name, dtype in requests:
            full, stored, value = self._find(name)
            self._check_shape(full, stored, value, _shape_arg(shape))
            found.append((full, stored, value, None if dtype is None and self._dtype is None
                          else self._cast_to(value, dtype)))
        backend = devices.backend(self._device)
        batches: list[list[int]] = [[i for i, f in enumerate(found) if f[3] is None], []]
        size = 0
        for i in (i for i, f in enumerate(found) if f[3] is not None):
            if batches[-1] and size + _nbytes(found[i][2]) > _CAST_BATCH:
                batches.append([])
                size = 0
            batches[-1].append(i)
            size += _nbytes(found[i][2])
        out: list[Any] = [None] * len(found)
        gpu = self._device.target not in (None, "cpu")
        for batch in batches:
            # on a GPU, an allocation per tensor: no views of shared runs (which would also carry
            # the bytes between a batch's tensors along), and each stored tensor freed once cast
            keys = {str(i) for i in batch} if gpu else set()
            moved = devices._on_device(backend, {str(i): found[i][2] for i in batch}, keys)
            for i in batch:
                full, stored, value, wanted = found[i]
                tensor = moved.pop(str(i))  # (its memory goes once cast)
                out[i] = backend.finish(tensor if wanted is None else backend.cast(tensor, wanted), full)
                self._shared.usage.hit(full, stored, _nbytes(value))
        return out

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
            name: as in `get`.
            dtype: as in `get`.
            dim: the dimension to split (negative counts from the end).
            rank: which part (``torch.distributed.get_rank()`` under torchrun).
            world_size: of how many parts (``torch.distributed.get_world_size()``).

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

    def load_all(self, device: str | devices.Device | None = None, dtype: Any = None, *,
                 copy: bool = False) -> dict[str, Any]:
        """Every stored tensor under this cursor's prefix, moved in one bulk transfer.

        Keys are stored names relative to the prefix (no renames or resolution apply). GPUs
        receive large contiguous runs through pinned buffers (`weightio.devices.load_all`).

        Args:
            device: defaults to the cursor's device.
            dtype: converts floating-point tensors; defaults to the cursor's dtype.
            copy: every tensor in memory of its own (writable, not a view of the file, alive after
                `close`), read with parallel ``pread``s: what a serving stack that owns its
                weights wants, faster than ``clone()`` of the zero-copy views.
        """
        store, head = self._shared.store, self.prefix + "." if self._path else ""
        names = [n for n in store.names if n.startswith(head)]
        values = {n[len(head):]: store.value(n) for n in names}
        wanted = self._dtype if dtype is None else _dtype_arg(dtype)
        out = devices.load_all(values, self._device if device is None else device, wanted, copy=copy)
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
            usage.fold()
            plain = usage.snapshot()  # (one copy for both: the C path records meanwhile)
            hits = usage.hits(plain)
            if self._path:  # (at the root every request is covered)
                hits = {a: h for a, h in hits.items() if self._covers(a)}
            missing = tuple(a for a in usage.missing if self._covers(a))
            mismatched = tuple((a, e, f) for a, (e, f) in usage.mismatched.items() if self._covers(a))
            used_all = usage.used(plain)
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
        wanted = None if dtype is None and self._dtype is None else self._cast_to(value, dtype)
        if wanted is None and key is None and type(value) is TensorView and self._device.framework == "numpy":
            out = value.numpy()  # the common case, a stored tensor as it is on numpy: no generic placement
            self._shared.usage.hit(full, stored, value.info.nbytes // parts)
            return out
        source = value if key is None else _select(value, key)
        out = devices.place(source, self._device, wanted)
        self._shared.usage.hit(full, stored, _nbytes(value) // parts)
        return out

    def _cast_to(self, value: Any, dtype: Any) -> np.dtype | None:
        stored = devices.dtype_of(value)
        if dtype is not None:
            wanted = _dtype_arg(dtype)
            if wanted is None:  # "auto": as stored
                return None
        elif self._dtype is not None and devices.is_floating(stored):
            wanted = self._dtype
        else:
            return None
        return None if wanted == stored else wanted


_CAST_BATCH = 256 << 20  # bytes moved at once by `_get_many` for tensors it casts


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    known = {"base_model_prefix", "auto_prefix", "renames"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"unexpected option(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    return dict(options)


def _dtype_arg(dtype: Any) -> np.dtype | None:
    """None for None and ``"auto"`` (every tensor keeps its stored dtype, transformers' spelling)."""
    return None if dtype is None or (isinstance(dtype, str) and dtype == "auto") else parse_dtype(dtype)


_INT = frozenset((int,))


def _shape_arg(shape: Any) -> tuple[int, ...]:
    if type(shape) is tuple and _INT.issuperset(map(type, shape)):  # the common case
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
    return value.info.shape if type(value) is TensorView else tuple(int(d) for d in value.shape)


def _nbytes(value: Any) -> int:
    if isinstance(value, (TensorView, np.ndarray)):
        return int(value.nbytes)
    return math.prod(_shape_of(value)) * devices.dtype_of(value).itemsize


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
