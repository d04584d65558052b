"""Name resolution for `weightio.VarBuilder`: which stored tensor a name the model asks for is.

A `Sources` is the union of one or more checkpoints (a name stored twice is a
`CorruptFileError`); a `Resolver` applies the automatic rules below to it; `Renamed` layers
a rename (`renamer`) over a resolver or another rename. `Usage` records every request, and
`LoadReport` is what the builder reports from it.

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

Example:
    >>> store = Sources([{"bert.encoder.w": 1, "bert.pooler.b": 2, "cls.b": 3}], ["<dict>"])
    >>> Resolver(store, None, True).resolve("encoder.w")   # base-model prefix "bert", inferred
    'bert.encoder.w'
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CorruptFileError

__all__ = [
    "COMPILE_WRAPPER", "DDP_WRAPPER", "LEGACY_SUFFIXES", "LoadReport", "RenameSpec", "Renamed", "Resolver", "Sources",
    "Usage", "listing", "renamer",
]

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
                lines.append(f"{label} ({len(names)}): {listing(names)}")
        for name, expected, found in self.mismatched:
            lines.append(f"shape mismatch: {name}: expected {expected}, stored {found}")
        return "\n".join(lines)


def listing(names: Sequence[str]) -> str:
    """Up to ten names joined with ``", "``, then ``"… and N more"``: for messages."""
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", … and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


class Usage:
    """Every request made through any cursor of one builder (shared, thread-safe).

    Each request takes a stamp, its place in the order of all requests (`stamps`, an
    ``itertools.count``: ``next`` is atomic under the GIL). A request `get`'s shortest path served
    (asked = stored, a name of the checkpoint's `placed` map) is counted in `plain`, an array of
    three int64 per name, at the name's serial (`Checkpoint._placed_triple`): times, first stamp,
    last stamp. No table is looked up for it: counting it in a 90k-name ``Counter`` (a miss in a
    table of that size, and an insert the first time) was a fifth of a ``get``. The C path
    (`_speedups.plain_get`) updates the three numbers with the GIL held, so no other thread sees
    them half done; `plain_hit`, the Python path's, holds `lock`. Any other request is queued
    without a lock as ``(asked, stored, bytes, stamp)`` (a ``list.append``) and counted into
    `counts`, `first` and `last` under `lock`, by `fold`, before any reader looks, and whenever
    `FOLD_AT` of them are queued (bounded memory however many times a process calls ``get``). A
    report merges both by stamp: a name's first request orders it, its last says what it resolved
    to (a rename, a wrapper rule, a legacy name or the base-model prefix: another stored name).
    """

    FOLD_AT = 4096

    def __init__(self, placed: Mapping[str, tuple[Any, int, int]] | None = None, count: int = 0) -> None:
        # `placed`: a checkpoint's name -> (info, reader, serial) map, filled before the first plain
        # hit (its keys in serial order); `count`: how many names it holds then
        self.placed = placed if placed is not None else {}
        self.plain = bytearray(24 * count)  # serial -> (times, first stamp, last stamp), int64s; 0: never
        self._slots = memoryview(self.plain).cast("q")  # (which also keeps `plain` from being resized)
        self.stamps = itertools.count(1)
        self.counts: Counter[tuple[str, str, int]] = Counter()  # (asked, stored, bytes handed out) -> times
        self.first: dict[str, int] = {}  # asked -> stamp of its first other request
        self.last: dict[str, tuple[int, str]] = {}  # asked -> (stamp, stored) of its last other request
        self.missing: dict[str, None] = {}
        self.mismatched: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.lock = threading.Lock()
        self.queued: list[tuple[str, str, int, int]] = []

    def hit(self, asked: str, stored: str, nbytes: int) -> None:
        queued = self.queued
        queued.append((asked, stored, nbytes, next(self.stamps)))
        if len(queued) >= self.FOLD_AT:
            self.fold_queued()

    def plain_hit(self, serial: int) -> None:
        """`hit(name, name, the tensor's bytes)` of the name at `serial` of `placed`, as `get`'s
        shortest path records it (the C one does the same with the GIL held)."""
        slots, at = self._slots, 3 * serial
        with self.lock:
            stamp = next(self.stamps)
            if not slots[at]:
                slots[at + 1] = stamp
            slots[at] += 1
            slots[at + 2] = stamp

    def fold_queued(self) -> None:
        """`fold` under `lock`."""
        with self.lock:
            self.fold()

    def fold(self) -> None:
        """Count the queued requests into `counts`, `first` and `last`; the caller holds `lock` (so
        one thread folds at a time, and only the folder takes from the queue: appends may go on
        meanwhile, and a stamp taken before another may be queued after it)."""
        queued = self.queued
        hits = queued[:]
        del queued[: len(hits)]  # (requests appended meanwhile stay queued)
        if not hits:
            return
        self.counts.update([hit[:3] for hit in hits])
        first, last = self.first, self.last
        for asked, stored, _, stamp in hits:
            if stamp < first.get(asked, stamp + 1):
                first[asked] = stamp
            if stamp > last.get(asked, (0,))[0]:
                last[asked] = (stamp, stored)

    def snapshot(self) -> bytes:
        """A copy of `plain`, for `hits` and `used` (the C path records without the lock: a report
        reads one copy, so a name first served between two reads is in both or neither)."""
        return bytes(self.plain)

    def _served(self, plain: bytes) -> tuple[list[str], list[int], np.ndarray]:
        """The names the shortest path served, in first-request order, their bytes handed out and
        their rows of `plain` (times, first stamp, last stamp)."""
        rows = np.frombuffer(plain, np.int64).reshape(-1, 3)
        served = np.flatnonzero(rows[:, 0])
        served = served[np.argsort(rows[served, 1], kind="stable")]
        if not len(served):
            return [], [], rows[:0]
        names, values, serials = list(self.placed), list(self.placed.values()), served.tolist()
        rows = rows[served]
        handed = [values[i][0].nbytes * times for i, times in zip(serials, rows[:, 0].tolist(), strict=True)]
        return [names[i] for i in serials], handed, rows

    def hits(self, plain: bytes | None = None) -> dict[str, tuple[str, int]]:
        """asked -> (the stored name of its last request, bytes handed out), in first-request order
        (the caller holds `lock`, after a `fold`; `plain`: a `snapshot`, by default one taken now)."""
        names, handed, rows = self._served(self.snapshot() if plain is None else plain)
        if not self.first:
            return dict(zip(names, zip(names, handed, strict=True), strict=True))
        other: dict[str, int] = {}  # asked -> bytes handed out by the other requests
        for (asked, _, nbytes), times in self.counts.items():
            other[asked] = other.get(asked, 0) + nbytes * times
        asked_names, stored = list(names), list(names)
        firsts, lasts = rows[:, 1].tolist(), rows[:, 2].tolist()
        where = {name: i for i, name in enumerate(names)}
        for asked, first in self.first.items():
            stamp, resolved = self.last[asked]
            i = where.get(asked)
            if i is None:
                asked_names.append(asked)
                stored.append(resolved)
                firsts.append(first)
                lasts.append(stamp)
                handed.append(0)
                i = len(handed) - 1
            else:
                firsts[i] = min(firsts[i], first)
                if stamp > lasts[i]:
                    lasts[i], stored[i] = stamp, resolved
            handed[i] += other[asked]
        order = np.argsort(np.array(firsts, np.int64), kind="stable").tolist()
        return {asked_names[i]: (stored[i], handed[i]) for i in order}

    def used(self, plain: bytes | None = None) -> set[str]:
        """Every stored name handed out (the caller holds `lock`, after a `fold`; `plain` as in `hits`)."""
        plain = self.snapshot() if plain is None else plain
        served = np.flatnonzero(np.frombuffer(plain, np.int64)[0::3]).tolist()
        names = list(self.placed) if served else []
        return {names[i] for i in served} | {key[1] for key in self.counts}

    def miss(self, asked: str) -> None:
        with self.lock:
            self.missing.setdefault(asked)

    def mismatch(self, asked: str, expected: tuple[int, ...], found: tuple[int, ...]) -> None:
        with self.lock:
            self.mismatched[asked] = (expected, found)


# ----------------------------------------------------------------------------- sources


class Sources:
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


class Resolver:
    """The automatic rules (steps 2-5 of the module docstring) over one store."""

    def __init__(self, store: Sources, base_model_prefix: str | None, auto_prefix: bool) -> None:
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


class Renamed:
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
