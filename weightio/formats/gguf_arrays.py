"""GGUF metadata arrays (and the legacy ggml vocabulary): located at open, decoded when asked for.

See `weightio.formats.gguf` for the layout. An array is validated completely when the file is
opened, but what it costs in memory then is bounded by its bytes, whatever its shape: numbers
are views of the file, strings a table of start offsets (8 bytes for each string's 8-byte
length), and an array of arrays is one object, whatever it holds: its items are built when it
is first read (`docs/security.md`: at most 16 bytes of heap per header byte while opening;
building an object per nested array cost up to 36).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from .._remote import BLOCK
from .base import is_remote
from .gguf_fields import SCALAR_DTYPES, Fields, GGUFValueType

__all__ = ["GGUFArray", "EAGER_ARRAY_ITEMS", "EAGER_NESTED_BYTES", "decode_value_string", "walk_strings",
           "skip_strings", "walk_fetching", "fetched_to"]

EAGER_ARRAY_ITEMS = 64  # arrays this short are decoded at open (and stay usable after close)
EAGER_NESTED_BYTES = 4096  # arrays of arrays this short are copied at open (and stay usable after close)


class GGUFArray(Sequence):
    """A GGUF metadata array: located at open, decoded when asked for.

    A read-only `Sequence`: ``len(a)``, ``a[i]``, ``a[i:j]`` (a list), iteration, and ``==``
    against lists and tuples. ``tolist()`` decodes everything (vectorized for numbers) and
    ``numpy()`` views numeric and BOOL arrays without copying (big-endian files: a native copy).

    Attributes:
        type: the element type name (``"STRING"``, ``"INT32"``, ``"ARRAY"``).

    Arrays longer than `EAGER_ARRAY_ITEMS` read the file when decoded, so decode them before
    closing the checkpoint; shorter ones are decoded at open.
    """

    __slots__ = ("type", "_file", "_count", "_dtype", "_offset", "_array", "_starts", "_end", "_gap",
                 "_strip_nul", "_items", "_layout")

    def __init__(self, vtype: GGUFValueType, file: Any, count: int) -> None:
        self.type = vtype.name
        self._file, self._count = file, count
        self._dtype: np.dtype | None = None
        self._array: np.ndarray | None = None
        self._offset = self._end = self._gap = 0
        self._starts: array | None = None
        self._strip_nul = False
        self._items: tuple | None = None
        self._layout: Fields | None = None  # set for an array of arrays, decoded when first read

    @classmethod
    def numbers(cls, vtype: GGUFValueType, file: Any, count: int, dtype: np.dtype, offset: int) -> GGUFArray:
        """`count` fixed-size values of `dtype` stored from `offset`."""
        arr = cls(vtype, file, count)
        arr._dtype, arr._offset = dtype, offset
        return arr

    @classmethod
    def from_array(cls, vtype: GGUFValueType, values: np.ndarray) -> GGUFArray:
        """Numbers already gathered in memory (a read-only 1-D array of `vtype`'s dtype)."""
        arr = cls(vtype, None, len(values))
        arr._dtype, arr._array = values.dtype, values
        values.flags.writeable = False
        return arr

    @classmethod
    def strings(cls, file: Any, starts: array, end: int, gap: int, strip_nul: bool = False) -> GGUFArray:
        """Strings whose bytes start at `starts`; each ends `gap` bytes before the next one starts
        (its successor's length prefix, and whatever else sits between), the last at `end`."""
        arr = cls(GGUFValueType.STRING, file, len(starts))
        arr._starts, arr._end, arr._gap, arr._strip_nul = starts, end, gap, strip_nul
        return arr

    @classmethod
    def nested(cls, file: Any, count: int, offset: int, end: int, layout: Fields, strip_nul: bool) -> GGUFArray:
        """`count` arrays stored (each with its element type and count) from `offset` to `end`,
        already validated. Spans up to `EAGER_NESTED_BYTES` are copied now (usable after close)."""
        arr = cls(GGUFValueType.ARRAY, file, count)
        if file is not None and end - offset <= EAGER_NESTED_BYTES and not isinstance(file, _Copy):
            arr._file, offset, end = _Copy(bytes(file.data[offset:end])), 0, end - offset
        arr._offset, arr._end, arr._layout, arr._strip_nul = offset, end, layout, strip_nul
        return arr

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        i = int(index)
        if not -self._count <= i < self._count:
            raise IndexError(f"GGUF array index {index} out of range ({self._count} items)")
        i %= self._count
        if self._items is not None or self._layout is not None:  # an array of arrays: built on first access
            return self._decoded()[i]
        if self._dtype is not None:
            return self.numpy()[i].item()
        return self._string(i)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFArray):
            other = other.tolist()
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return len(other) == self._count and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]  # compares equal to lists, which are unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        more = ", …" if self._count > 3 else ""
        return f"GGUFArray({self.type} × {self._count}: [{head}{more}])"

    def tolist(self) -> list:
        """Every item as Python values (nested arrays as nested lists)."""
        return [x.tolist() if isinstance(x, GGUFArray) else x for x in self._decoded()]

    def numpy(self) -> np.ndarray:
        """The items as a read-only numpy array: a zero-copy view for numbers and BOOL.

        Raises:
            TypeError: for arrays of strings or of arrays (use `tolist`).
        """
        if self._dtype is None:
            raise TypeError(f"a GGUF array of {self.type} has no numpy view; use tolist()")
        if self._array is not None:
            return self._array
        if is_remote(self._file):  # fetched at open unless skipped; else fetched now
            self._file.ensure(self._offset, self._count * self._dtype.itemsize, f"a metadata array of {self.type}")
        return self._numbers(self._file.data)

    def _numbers(self, data: Any) -> np.ndarray:
        view = np.frombuffer(data, self._dtype, self._count, self._offset)
        if not view.dtype.isnative:
            view = view.astype(view.dtype.newbyteorder("="))
            view.flags.writeable = False
        return view

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.numpy() if self._dtype is not None else np.array(self.tolist())
        return arr if dtype is None else arr.astype(dtype)

    def raw_strings(self) -> Iterator[bytes]:
        """The stored bytes of each item of a STRING array (what `write` copies back)."""
        if self._starts is None:
            raise TypeError(f"a GGUF array of {self.type} holds no stored strings")
        data = self._file.data
        for i, start in enumerate(self._starts):
            yield data[start:self._stop(self._starts, i)].tobytes()

    def _decoded(self, data: Any = None) -> tuple:
        """Every item, decoded once. `data`: the file's bytes when the caller already holds them
        (the reader at open), else one checked access to the mapping."""
        if self._items is None:
            if self._layout is not None:
                if data is None and is_remote(self._file):
                    self._file.ensure(self._offset, self._end - self._offset, "a metadata array of arrays")
                self._items = tuple(_arrays(self._file, self._file.data if data is None else data, self._offset,
                                            self._count, self._layout, self._strip_nul))
            elif self._dtype is not None:
                self._items = tuple(self.numpy().tolist() if data is None else self._numbers(data).tolist())
            elif self._count:  # one read of the mapping, then slices of it
                starts, gap = cast(array, self._starts), self._gap  # (set by `strings`: neither numbers nor arrays)
                base = starts[0]
                blob = bytes((self._file.data if data is None else data)[base:self._end])
                stops = [*(s - gap - base for s in starts[1:]), self._end - base]
                text = (blob[a - base:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, stops, strict=True))
                self._items = tuple(t.rstrip("\x00") for t in text) if self._strip_nul else tuple(text)
            else:
                self._items = ()
        return self._items

    def _stop(self, starts: array, i: int) -> int:  # (starts: `_starts`, which the caller knows is set)
        return starts[i + 1] - self._gap if i + 1 < self._count else self._end

    def _string(self, i: int) -> str:
        starts = cast(array, self._starts)  # (_string is asked of STRING arrays only: set by `strings`)
        return decode_value_string(self._file.data[starts[i]:self._stop(starts, i)], self._strip_nul)


def decode_value_string(raw: Any, strip_nul: bool) -> str:
    """A metadata string; invalid UTF-8 is kept as lone surrogates (``surrogateescape``)."""
    text = str(memoryview(raw), "utf-8", "surrogateescape")
    return text.rstrip("\x00") if strip_nul else text


def walk_strings(buf: memoryview, pos: int, count: int, length: struct.Struct) -> tuple[array, int]:
    """Start offsets of `count` length-prefixed strings from `pos`, and the position after them.

    The loop is the one per-item cost of opening a GGUF file (a 150k-token vocabulary), so it
    does the minimum: a length that points past the file makes the next ``unpack_from`` fail
    (the buffer is the whole file), and the caller checks the final position.
    """
    starts = array("q")
    append, unpack, width = starts.append, length.unpack_from, length.size
    try:
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += width
            append(pos)
            pos += n
    except (struct.error, OverflowError):  # a length pointed past the file
        pos = len(buf) + 1
    return starts, pos


def skip_strings(buf: memoryview, pos: int, count: int, length: struct.Struct) -> int:
    """The position after `count` length-prefixed strings from `pos` (past ``len(buf)`` when a
    length points past the end), allocating nothing per string."""
    unpack, width = length.unpack_from, length.size
    try:
        for _ in range(count):
            pos += width + unpack(buf, pos)[0]
    except (struct.error, OverflowError):
        return len(buf) + 1
    return pos


def fetched_to(file: Any, end: int) -> int:
    """Where the bytes of a remote file that `ensure` filled up to `end` really end: it fetches whole
    blocks, so what follows `end` in its last block is there too (and costs nothing to read)."""
    return min(file.size, -(-end // BLOCK) * BLOCK)


def walk_fetching(file: Any, pos: int, count: int, length: struct.Struct, hi: int, bound: int, *, extra: int = 0,
                  tail: int = 0, starts: array | None = None, what: str = "a string array") -> tuple[int, int]:
    """`walk_strings` over a remote file's image, fetching the strings as it walks.

    Bytes ``pos``..`hi` of ``file.data`` are already there. Each string is a `length` prefix, its
    bytes and `extra` bytes more (the legacy vocabulary's scores); their start offsets are appended
    to `starts` (when given). When the walk reaches `hi`, the rest of the strings are fetched in one
    request whose size is estimated from the strings walked last (their mean length times the strings
    left, and a fifth more, since a vocabulary's later tokens are longer; a little more each further
    round), plus `tail` bytes the caller knows follow. Nothing past `bound`
    (the file's size or the header limit) is ever fetched: strings that cannot fit before it, from
    their count and the lengths already read, return ``bound + 1`` before any fetch (what
    `walk_strings` returns for strings past the file). Returns the position after the strings and
    the new `hi`.
    """
    buf, unpack, width = memoryview(file.data), length.unpack_from, length.size
    step, hi = width + extra, max(hi, pos)
    since, since_done = pos, 0  # where the strings walked since the last fetch began, and their count
    done = rounds = 0
    while True:
        while done < count and pos + width <= hi:  # walk the strings wholly here
            end = pos + step + unpack(buf, pos)[0]
            if end > hi:
                break
            if starts is not None:
                starts.append(pos + width)
            pos, done = end, done + 1
        if done == count:
            return pos, hi
        first = pos + step + (unpack(buf, pos)[0] if pos + width <= hi else 0)  # the string begun
        minimum = first + (count - done - 1) * step  # and the others' prefixes, at least
        if minimum > bound:
            return bound + 1, hi
        mean = (pos - since) / (done - since_done) if done > since_done else step + 8
        guess = pos + int((count - done) * mean * (6 + rounds) / 5)
        target = min(bound, max(minimum, guess) + tail)
        file.ensure(hi, target - hi, what)
        hi, rounds, since, since_done = fetched_to(file, target), rounds + 1, pos, done


class _Copy:
    """The bytes of a short array of arrays, copied at open: what its items read instead of the file."""

    __slots__ = ("_bytes",)

    def __init__(self, raw: bytes) -> None:
        self._bytes = raw

    @property
    def data(self) -> np.ndarray:
        return np.frombuffer(self._bytes, np.uint8)


def _arrays(source: Any, data: Any, pos: int, count: int, layout: Fields, strip_nul: bool) -> list[GGUFArray]:
    """The `count` arrays stored from `pos` of `data` (validated at open), each a `GGUFArray` over
    `source` (the file, or the copy of a short array of arrays)."""
    buf, width, items = memoryview(data), layout.counts.size, []
    for _ in range(count):
        etype = GGUFValueType(layout.u32.unpack_from(buf, pos)[0])
        (n,) = layout.counts.unpack_from(buf, pos + 4)
        pos += 4 + width
        if etype == GGUFValueType.STRING:
            starts, end = walk_strings(buf, pos, n, layout.counts)
            item = GGUFArray.strings(source, starts, end, width, strip_nul)
        elif etype == GGUFValueType.ARRAY:
            end = _skip_arrays(buf, pos, n, layout)
            item = GGUFArray.nested(source, n, pos, end, layout, strip_nul)
        else:
            dtype = SCALAR_DTYPES[etype].newbyteorder(layout.order)
            end = pos + n * dtype.itemsize
            item = GGUFArray.numbers(etype, source, n, dtype, pos)
        items.append(item)
        pos = end
    return items


def _skip_arrays(buf: memoryview, pos: int, count: int, layout: Fields) -> int:
    """The position after `count` arrays stored from `pos` (validated at open)."""
    width = layout.counts.size
    for _ in range(count):
        etype = layout.u32.unpack_from(buf, pos)[0]
        (n,) = layout.counts.unpack_from(buf, pos + 4)
        pos += 4 + width
        if etype == GGUFValueType.STRING:
            pos = skip_strings(buf, pos, n, layout.counts)
        elif etype == GGUFValueType.ARRAY:
            pos = _skip_arrays(buf, pos, n, layout)
        else:
            pos += n * SCALAR_DTYPES[GGUFValueType(etype)].itemsize
    return pos
