"""Which bytes of a stored tensor a numpy index selects, so that a remote read fetches only those.

``view[2:4]``, ``view[:, a:b]`` (a tensor-parallel shard), ``view[..., 0]``: for basic indexing
(ints, slices, ``...``, ``None``) the selection is found by indexing a *probe* — an array with
the tensor's shape and strides whose data pointer stands for the tensor's first byte and is never
read — and reading the resulting view's offset, shape and strides. Its elements then lie in
runs of contiguous bytes, one per combination of the outer indices; `plan` returns them, or the
one covering range when fetching it whole is cheaper (few bytes skipped, or too many runs).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

__all__ = ["MAX_RUNS", "Selection", "plan"]

MAX_RUNS = 1 << 16  # more runs than this: fetch the covering range instead
_DENSE = 0.5  # a selection holding at least this share of its covering range fetches the range


class Selection:
    """A basic-indexing selection of a stored tensor.

    Attributes:
        runs: ``(offset, length)`` byte ranges relative to the tensor's first byte, in the
            selection's C order; fetched one after the other, they are its elements.
        shape: the selected shape after dropping integer-indexed axes.
        gathered: True when `runs` hold exactly the elements (view them as ``shape``); False
            when `runs` is one covering range to view with `strides` and `offset` then.
        strides: the selection's strides inside the covering range (when not gathered).
        offset: where the selection's first element lies in the covering range.
        probe_shape: the selection's shape before integer axes are dropped.
    """

    def __init__(self, runs: list[tuple[int, int]], shape: tuple[int, ...], probe_shape: tuple[int, ...],
                 gathered: bool, strides: tuple[int, ...] = (), offset: int = 0) -> None:
        self.runs, self.shape, self.probe_shape = runs, shape, probe_shape
        self.gathered, self.strides, self.offset = gathered, strides, offset

    def assemble(self, raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The selected elements from the fetched bytes (`raw`: the runs, one after the other)."""
        if self.gathered:
            arr = raw.view(dtype).reshape(self.probe_shape)
        else:
            arr = np.ndarray(self.probe_shape, dtype, buffer=raw, offset=self.offset, strides=self.strides)
        return arr.reshape(self.shape)


def plan(shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...] | None, key: Any) -> Selection | None:
    """The bytes `key` selects of a tensor stored with `shape`, `dtype` and `strides` (None: C order);
    None when `key` is not basic indexing (arrays, booleans: the caller reads the whole tensor).

    Raises:
        IndexError: an integer index out of range, or too many indices (numpy's own messages).
    """
    expanded = _expand(key, shape)
    if expanded is None:
        return None
    probe_key, dropped = expanded
    itemsize = dtype.itemsize
    if strides is None:
        strides = tuple(int(itemsize * math.prod(shape[k + 1:])) for k in range(len(shape)))
    anchor = np.zeros(1, np.uint8)
    # byte-typed probe: strides are in bytes, the element itself is `itemsize` bytes
    probe = np.lib.stride_tricks.as_strided(anchor, shape=shape, strides=strides, writeable=False)
    selected = probe[probe_key]  # a view: numpy computes its pointer and strides, reads nothing
    first = selected.__array_interface__["data"][0] - anchor.__array_interface__["data"][0]
    out_shape = tuple(n for k, n in enumerate(selected.shape) if k not in dropped)
    sel_shape, sel_strides = selected.shape, selected.strides
    if selected.size == 0:
        return Selection([], out_shape, sel_shape, True)
    if any(s < 0 for s in sel_strides):  # negative steps: fetch the covering range, index it locally
        return _covering(first, sel_shape, sel_strides, itemsize, out_shape)
    # the innermost block of axes that is contiguous in the file
    inner, k = itemsize, len(sel_shape)
    while k > 0 and (sel_shape[k - 1] == 1 or sel_strides[k - 1] == inner):
        inner *= sel_shape[k - 1]
        k -= 1
    outer_shape, outer_strides = sel_shape[:k], sel_strides[:k]
    count = math.prod(outer_shape)
    span = _span(sel_shape, sel_strides, itemsize)
    if count > MAX_RUNS or count * inner >= _DENSE * span:
        return _covering(first, sel_shape, sel_strides, itemsize, out_shape)
    starts = np.full(1, first, np.int64)
    for n, s in zip(outer_shape, outer_strides, strict=True):
        starts = (starts[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
    return Selection([(int(o), inner) for o in starts], out_shape, sel_shape, True)


def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    return sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s > 0) + itemsize


def _covering(first: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
              out_shape: tuple[int, ...]) -> Selection:
    low = first + sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s < 0)
    high = first + sum(s * (n - 1) for n, s in zip(shape, strides, strict=True) if s > 0) + itemsize
    return Selection([(low, high - low)], out_shape, shape, False, strides, first - low)


def _expand(key: Any, shape: tuple[int, ...]) -> tuple[tuple, set[int]] | None:
    """`key` with integers made length-1 slices (so that indexing the probe gives a view, never an
    element read at a bogus address), and the output axes those integers leave out."""
    ndim = len(shape)
    items = key if isinstance(key, tuple) else (key,)
    for item in items:
        if not (item is None or item is Ellipsis or isinstance(item, slice) or _is_int(item)):
            return None
    if sum(item is Ellipsis for item in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    if used > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but {used} were indexed")
    if Ellipsis in items:
        at = next(k for k, item in enumerate(items) if item is Ellipsis)
        items = items[:at] + (slice(None),) * (ndim - used) + items[at + 1:]
    else:
        items = items + (slice(None),) * (ndim - used)
    probe_key: list[Any] = []
    dropped: set[int] = set()
    axis = 0
    for position, item in enumerate(items):
        if _is_int(item):
            n = shape[axis]
            i = operator.index(item)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            i %= n
            probe_key.append(slice(i, i + 1))
            dropped.add(position)
        else:
            probe_key.append(item)
        if item is not None:
            axis += 1
    return tuple(probe_key), dropped


def _is_int(item: Any) -> bool:
    if isinstance(item, bool) or isinstance(item, np.bool_):
        return False
    try:
        operator.index(item)
    except TypeError:
        return False
    return True
