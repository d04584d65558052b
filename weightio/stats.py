"""Statistics of one tensor and the differences between two checkpoints, in bounded memory.

What ``weightio show`` and ``weightio diff`` print, for Python callers. Tensors are read in
slices of whole rows (at most `CHUNK` elements at a time, through `TensorView` indexing, so
quantized tensors are dequantized slice by slice too) and the mapped pages are released after
each slice: a 10 GB tensor is summarised in a few MB. Results are plain dataclasses.

    >>> import weightio as wio
    >>> from weightio.stats import diff_checkpoints, tensor_stats
    >>> with wio.open("fixtures/tiny-bert") as ckpt:
    ...     s = tensor_stats(ckpt["embeddings.LayerNorm.weight"])
    >>> s.count, s.minimum, s.maximum, s.nan
    (32, -0.3125, 0.6875, 0)
    >>> bert = "fixtures/models/bert/"
    >>> with wio.open(bert + "model.safetensors") as a, wio.open(bert + "pytorch_model.bin") as b:
    ...     diff = diff_checkpoints(a, b)
    >>> diff.equal, len(diff.pairs), diff.only_a, diff.only_b
    (True, 39, [], [])
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ._io import bytes_equal, drop_array_pages
from .checkpoint import Checkpoint
from .dtypes import TABLE, dtype_name, is_number
from .errors import CorruptFileError, UnsupportedDTypeError, UsageError
from .view import TensorView

__all__ = [
    "CHUNK", "CheckpointDiff", "Stats", "TensorDiff", "aliases", "chunks", "compare", "diff_checkpoints",
    "first_values", "is_packed", "pair_names", "tensor_stats",
]

CHUNK = 1 << 22  # elements per slice
_PACKED = frozenset(row.numpy for row in TABLE if row.packed)


def is_packed(view: TensorView) -> bool:
    """True for sub-byte types (F4, F6) that numpy cannot view: only their stored bytes can be read.

    Such a tensor has no `tensor_stats`; `compare` compares its stored bytes only.
    """
    return view.ggml_type is None and view.info.dtype in _PACKED


def chunks(view: TensorView, size: int = CHUNK) -> Iterator[np.ndarray]:
    """The tensor's elements, in C order, as flat arrays of about `size` elements or fewer.

    Each slice is whole rows of the first dimension (one row when a row alone is larger than
    `size`); the mapped pages of a slice are released once the next one is asked for.

    Raises:
        UnsupportedDTypeError: a packed sub-byte tensor (see `is_packed`).

    Examples:
        >>> with wio.open("fixtures/tiny-bert") as ckpt:
        ...     [part.size for part in chunks(ckpt["encoder.layer.0.attention.self.query.weight"], 300)]
        [288, 288, 288, 160]
    """
    if is_packed(view):
        raise UnsupportedDTypeError("packs several elements per byte; numpy cannot read its values",
                                    path=view.path, tensor=view.name)
    shape = view.shape
    if not shape:
        yield np.asarray(view.numpy()).reshape(1)
        return
    per_row = math.prod(shape[1:])
    if shape[0] == 0 or per_row == 0:
        return
    step = max(1, size // per_row)
    for start in range(0, shape[0], step):
        part = view[start:start + step]
        yield np.asarray(part).reshape(-1)
        drop_array_pages(part)


def first_values(view: TensorView, n: int) -> np.ndarray:
    """A copy of the first `n` elements in C order (fewer for small tensors).

    Example:
        >>> with wio.open("fixtures/tiny-bert") as ckpt:
        ...     first_values(ckpt["embeddings.LayerNorm.weight"], 3).tolist()
        [-0.3125, -0.25, -0.1875]
    """
    out: list[np.ndarray] = []
    have = 0
    for part in chunks(view, max(n, 1)):
        out.append(part[: n - have].copy())
        have += len(out[-1])
        if have >= n:
            break
    values = np.concatenate(out) if out else np.empty(0, dtype=view.dtype)
    if values.dtype.kind not in "biufc":
        try:
            values.tolist()  # what a caller prints; numpy cannot make a str of a code point past U+10FFFF
        except SystemError:
            raise CorruptFileError("holds a character beyond U+10FFFF (not Unicode), which Python cannot hold in "
                                   "a str", path=view.path, tensor=view.name) from None
    return values


@dataclass
class Stats:
    """Summary of a tensor's values. Floats: min/max/mean/std over finite values only.

    Built by `tensor_stats`, or fed slice by slice with `add` (the result does not depend on
    how the values are sliced, up to float rounding).

    Attributes:
        count: number of elements.
        nan, inf: how many are NaN / ±infinity (0 for integer types).
        minimum, maximum: exact for integers; None when there is no finite value.
        mean, std: population mean and standard deviation (float64), None when empty.
        magnitude: True for complex tensors, whose statistics are of ``|x|``.
    """

    count: int = 0
    nan: int = 0
    inf: int = 0
    minimum: float | int | None = None
    maximum: float | int | None = None
    mean: float | None = None
    std: float | None = None
    magnitude: bool = False
    _n: int = 0
    _m2: float = 0.0

    def add(self, values: np.ndarray) -> None:
        """Fold in one slice (Chan et al.'s pairwise update of mean and M2)."""
        self.count += values.size
        if values.dtype.kind == "c":
            values, self.magnitude = np.abs(values), True
        exact = values.dtype.kind in "biu"
        if not exact:
            values = values.astype(np.float64)
            nan, inf = np.isnan(values), np.isinf(values)
            self.nan, self.inf = self.nan + int(nan.sum()), self.inf + int(inf.sum())
            values = values[~(nan | inf)]
        if values.size:
            self._extremes(values, exact)
            self._moments(values.astype(np.float64) if exact else values)

    def _extremes(self, values: np.ndarray, exact: bool) -> None:
        lo, hi = values.min(), values.max()
        lo, hi = (int(lo), int(hi)) if exact else (float(lo), float(hi))
        self.minimum = lo if self.minimum is None else min(self.minimum, lo)
        self.maximum = hi if self.maximum is None else max(self.maximum, hi)

    def _moments(self, values: np.ndarray) -> None:
        n, mean = values.size, float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        if self._n == 0:
            self._n, self.mean, self._m2 = n, mean, m2
        else:
            total = self._n + n
            old = cast(float, self.mean)  # set by the first slice, with _n
            delta = mean - old
            self.mean = old + delta * n / total
            self._m2 += m2 + delta * delta * self._n * n / total
            self._n = total
        self.std = math.sqrt(self._m2 / self._n)


def tensor_stats(view: TensorView) -> Stats:
    """`Stats` of every element of `view`, read slice by slice in bounded memory.

    Raises:
        UnsupportedDTypeError: a packed sub-byte tensor (see `is_packed`), or one that holds no
            numbers (bytes, str, datetime, records of an ``.npy``/``.npz``).

    Example:
        >>> with wio.open("fixtures/tiny-bert") as ckpt:
        ...     s = tensor_stats(ckpt["embeddings.LayerNorm.bias"])
        >>> (s.count, s.minimum, s.maximum, s.mean, s.std, s.nan, s.inf)
        (32, -0.25, 0.75, 0.220703125, 0.2914740516799641, 0, 0)
    """
    if view.dtype.hasobject:
        view.raw()  # the reader refuses an object array, saying why (its data is a pickle)
    if not is_number(view.dtype):
        raise UnsupportedDTypeError(f"{dtype_name(view.dtype)} elements are not numbers: they have no statistics",
                                    path=view.path, tensor=view.name)
    stats = Stats()
    with np.errstate(all="ignore"):
        for part in chunks(view):
            stats.add(part if part.dtype.kind != "b" else part.astype(np.uint8))
    return stats


@dataclass
class TensorDiff:
    """How two tensors of the same name differ.

    Attributes:
        name: the name in A (and B, or B's name after an alias or single-tensor pairing).
        kinds, shapes: A's and B's dtype (or ggml type) and shape.
        compared: False when the values could not be compared (different shapes).
        max_abs, max_rel: the largest ``|a - b|`` and ``|a - b| / |b|`` (inf where b is 0);
            None when only the stored bytes could be compared (packed types).
        mismatched: elements outside ``atol + rtol * |b|`` (NaN matches NaN only).
        count: elements compared.
    """

    name: str
    kinds: tuple[str, str]
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    compared: bool = True
    max_abs: float | None = 0.0
    max_rel: float | None = 0.0
    mismatched: int = 0
    count: int = 0

    @property
    def equal(self) -> bool:
        """True when the values were compared and every element is within the tolerances."""
        return self.compared and self.mismatched == 0

    @property
    def type_changed(self) -> bool:
        """True when the dtype (or ggml type) or the shape differs."""
        return self.kinds[0] != self.kinds[1] or self.shapes[0] != self.shapes[1]


def compare(a: TensorView, b: TensorView, *, atol: float = 0.0, rtol: float = 0.0, name: str | None = None
            ) -> TensorDiff:
    """Compare two tensors: stored bytes first (equal bytes are equal values), then values slice by slice.

    Elements differ when ``|a - b| > atol + rtol * |b|`` (``numpy.isclose``'s rule); NaN equals
    NaN only. Tensors of different dtypes are compared by value (float64, or exactly for
    integers); tensors of different shapes are not compared (``compared`` is False). Tensors
    that hold no numbers (bytes, str, datetime, records of ``.npz`` files) are compared element by
    element by their stored bytes when their dtypes are the same, else count as all different
    (``max_abs`` None); an object array cannot be compared (reading it raises `UnsafePickleError`).

    Args:
        a: the tensor compared.
        b: the reference tensor (the one `rtol` is relative to).
        atol: absolute tolerance.
        rtol: relative tolerance.
        name: the name to report (default: `a`'s name).

    Raises:
        UsageError: a tolerance that is negative or NaN.

    Example:
        >>> with wio.open("fixtures/tiny-bert") as ckpt:
        ...     d = compare(ckpt["embeddings.LayerNorm.weight"], ckpt["embeddings.LayerNorm.bias"])
        >>> d.equal, d.max_abs, d.mismatched, d.count
        (False, 0.0625, 32, 32)
    """
    _check_tolerances(atol, rtol)
    kinds = (_kind(a), _kind(b))
    diff = TensorDiff(a.name if name is None else name, kinds, (a.shape, b.shape), count=math.prod(a.shape))
    if a.shape != b.shape:
        diff.compared, diff.max_abs, diff.max_rel = False, None, None
        return diff
    same_bytes = kinds[0] == kinds[1] and a.info.dtype.byteorder == b.info.dtype.byteorder and _raw_equal(a, b)
    if same_bytes:
        return diff
    if is_packed(a) or is_packed(b):
        diff.max_abs, diff.max_rel, diff.mismatched = None, None, diff.count
        return diff
    if not (is_number(a.dtype) and is_number(b.dtype)):
        diff.max_abs, diff.max_rel = None, None
        diff.mismatched = _elements_differing(a, b) if a.dtype == b.dtype else diff.count
        return diff
    max_abs = max_rel = 0.0  # diff's own starting values, kept as floats while folding in the slices
    with np.errstate(all="ignore"):
        for x, y in zip(chunks(a), chunks(b), strict=True):
            chunk_abs, chunk_rel, bad = _chunk_diff(x, y, atol, rtol)
            max_abs, max_rel = max(max_abs, chunk_abs), max(max_rel, chunk_rel)
            diff.mismatched += bad
    diff.max_abs, diff.max_rel = max_abs, max_rel
    return diff


def _kind(view: TensorView) -> str:
    if view.ggml_type:
        return view.ggml_type
    dtype = view.info.dtype
    return dtype.newbyteorder("=").name if is_number(dtype) else dtype_name(dtype)


def _elements_differing(a: TensorView, b: TensorView) -> int:
    """Elements of two same-dtype non-numeric tensors whose stored bytes differ."""
    bad = 0
    for x, y in zip(chunks(a), chunks(b), strict=True):
        whole = np.dtype((np.void, x.dtype.itemsize))
        bad += int((np.ascontiguousarray(x).view(whole) != np.ascontiguousarray(y).view(whole)).sum())
    return bad


def _check_tolerances(atol: float, rtol: float) -> None:
    for label, value in (("atol", atol), ("rtol", rtol)):
        if not value >= 0:  # also refuses NaN, which would make every element differ
            raise UsageError(f"{label} must be a number >= 0, got {value!r}")


def _raw_equal(a: TensorView, b: TensorView) -> bool:
    if a.info.strides is not None or b.info.strides is not None:  # same values may be laid out differently
        return False
    x, y = a.raw(), b.raw()
    try:
        return bytes_equal(x, y)
    finally:
        drop_array_pages(x)
        drop_array_pages(y)


def _widen(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _chunk_diff(x: np.ndarray, y: np.ndarray, atol: float, rtol: float) -> tuple[float, float, int]:
    """(max |x-y|, max |x-y|/|y|, elements outside atol + rtol*|y|) for one slice."""
    if x.dtype == y.dtype and x.dtype.kind in "biu":
        return _integer_diff(x, y, atol, rtol)
    x, y = _widen(x), _widen(y)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    d = np.abs(x - y)
    d[same] = 0.0
    d[np.isnan(d)] = np.inf  # NaN against a number, or opposite infinities
    return _summarise(d, np.abs(y), same, atol, rtol)


def _integer_diff(x: np.ndarray, y: np.ndarray, atol: float, rtol: float) -> tuple[float, float, int]:
    """Integers compare exactly (2**62 and 2**62 + 1 differ, though float64 cannot tell them apart);
    the differing elements' distances are computed with Python ints."""
    if x.dtype.kind == "b":
        x, y = x.view(np.uint8), y.view(np.uint8)
    same = x == y
    differing = ~same
    d = np.zeros(x.shape, np.float64)
    if differing.any():
        d[differing] = np.abs(x[differing].astype(object) - y[differing].astype(object)).astype(np.float64)
    return _summarise(d, np.abs(y.astype(np.float64)), same, atol, rtol)


def _summarise(d: np.ndarray, magnitude: np.ndarray, same: np.ndarray, atol: float, rtol: float
               ) -> tuple[float, float, int]:
    bad = int((~same & ~(d <= atol + rtol * magnitude)).sum())
    rel = np.where(d == 0, 0.0, d / magnitude)  # a difference where b is 0: inf
    rel[np.isnan(rel)] = np.inf  # an infinite difference relative to an infinite b
    return float(d.max(initial=0.0)), float(rel.max(initial=0.0)), bad


# ----------------------------------------------------------------------------- checkpoints


def aliases(ckpt: Checkpoint) -> dict[str, str]:
    """``alias -> stored name`` recorded in metadata for tied weights written once (safetensors'
    convention, as `weightio.convert` writes it: ``metadata[removed] = kept``)."""
    return {k: v for k, v in ckpt.metadata.items() if isinstance(v, str) and k not in ckpt and v in ckpt}


def pair_names(a: Checkpoint, b: Checkpoint, names_a: list[str] | None = None, names_b: list[str] | None = None
               ) -> tuple[dict[str, str], list[str], list[str]]:
    """Which tensors of A and B are the same tensor: ``({name in A: name in B}, only in A, only in B)``.

    Names pair when equal, or through the `aliases` either checkpoint records. Two single-tensor
    files (``w.npy`` vs ``w2.npy``) are paired by position.

    Args:
        a: the first checkpoint.
        b: the second checkpoint.
        names_a: the names of `a` to consider (default: all, in file order).
        names_b: the names of `b` to consider (default: all, in file order).
    """
    names_a = list(a) if names_a is None else names_a
    names_b = list(b) if names_b is None else names_b
    if len(names_a) == 1 and len(names_b) == 1:
        return {names_a[0]: names_b[0]}, [], []
    in_b, alias_b, alias_a = set(names_b), aliases(b), aliases(a)
    pairs: dict[str, str] = {}
    for name in names_a:
        if name in in_b:
            pairs[name] = name
        elif name in alias_b:
            pairs[name] = alias_b[name]
    covered = set(pairs.values())
    for name in names_b:
        if name not in covered and name in alias_a:
            pairs[alias_a[name]] = name
            covered.add(name)
    only_a = [n for n in names_a if n not in pairs]
    only_b = [n for n in names_b if n not in covered]  # every paired name of B is in covered
    return pairs, only_a, only_b


@dataclass
class CheckpointDiff:
    """How two checkpoints differ, tensor by tensor (what `diff_checkpoints` returns).

    Attributes:
        pairs: name in A -> name in B, for every tensor both hold (same name, alias or position).
        only_a, only_b: names held by one side only, in file order.
        diffs: one `TensorDiff` per pair, in A's order.
        ignore_dtype: whether a dtype change alone still counts as equal.
    """

    pairs: dict[str, str] = field(default_factory=dict)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    diffs: list[TensorDiff] = field(default_factory=list)
    ignore_dtype: bool = False

    def same(self, d: TensorDiff) -> bool:
        """Whether one pair counts as equal (its values, and its type unless `ignore_dtype`)."""
        return d.equal and (self.ignore_dtype or not d.type_changed)

    @property
    def renamed(self) -> dict[str, str]:
        """The pairs whose names differ (paired by alias or by position)."""
        return {x: y for x, y in self.pairs.items() if x != y}

    @property
    def equal(self) -> bool:
        """True when both hold the same names and every pair counts as equal."""
        return not self.only_a and not self.only_b and all(self.same(d) for d in self.diffs)

    @property
    def values_equal(self) -> bool:
        """True when both hold the same names and every pair's values are equal, whatever the dtypes."""
        return not self.only_a and not self.only_b and all(d.equal for d in self.diffs)

    @property
    def verdict(self) -> str:
        """``"equal"``; ``"same values, dtypes differ"`` (every value equal, some dtype or ggml type
        changed: a lossless cast or a dequantization); or ``"different"``."""
        if self.equal:
            return "equal"
        return "same values, dtypes differ" if self.values_equal else "different"


def diff_checkpoints(a: Checkpoint, b: Checkpoint, *, atol: float = 0.0, rtol: float = 0.0,
                     patterns: tuple[str, ...] | list[str] = (), ignore_dtype: bool = False) -> CheckpointDiff:
    """Compare two open checkpoints, of any formats, tensor by tensor (see `compare`).

    Args:
        a: the first checkpoint (`weightio.open`); it stays open.
        b: the second checkpoint, the reference for `rtol`; it stays open.
        atol: absolute tolerance for every pair.
        rtol: relative tolerance for every pair.
        patterns: only names matching one of these globs (`Checkpoint.select`); default all.
        ignore_dtype: count a pair whose dtypes differ as equal when its values are.

    Raises:
        UsageError: a tolerance that is negative or NaN.

    Example:
        >>> with wio.open("fixtures/tiny-bert") as a, wio.open("fixtures/tiny-bert") as b:
        ...     d = diff_checkpoints(a, b, patterns=["pooler.*"])
        >>> d.equal, sorted(d.pairs), d.only_a
        (True, ['pooler.dense.bias', 'pooler.dense.weight'], [])
    """
    _check_tolerances(atol, rtol)
    pairs, only_a, only_b = pair_names(a, b, a.select(*patterns), b.select(*patterns))
    diffs = [compare(a[x], b[y], atol=atol, rtol=rtol, name=x) for x, y in pairs.items()]
    return CheckpointDiff(pairs, only_a, only_b, diffs, ignore_dtype)
