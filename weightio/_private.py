"""Writable copy-on-write memory over a file's pages for zero-copy torch CPU tensors, in one mapping (Linux).

`weightio._io.writable_twin` gives a tensor of a file's read-only mapping writable memory that
shares the file's pages until written. Where this module works (Linux), that memory is a
`PrivateMapping`: one private mapping (``MAP_PRIVATE``) of the whole file, read-only, which
commits nothing; the `PRIVATE_WINDOW`-aligned windows a tensor's bytes fall in are made writable
(``mprotect``: the kernel commits their size then, as it would for a mapping of them) while a
tensor over them lives, and made as the file has them again once none does: their private pages
freed, read-only. (Their commitment stays until the file's mapping goes: the kernel returns a
file mapping's commitment only when it is unmapped. It is never charged twice, and only strict
overcommit, ``vm.overcommit_memory=2``, counts it against anything.)

A tensor that crosses a window's end is served by the windows themselves, at their place. With a
mapping per run of windows (what other platforms get, `weightio._io.MappedFile.private_window`),
such a tensor had a mapping of its own overlapping theirs, and the page-cache folios at the window
edges were mapped, and counted in the resident set, twice: 4,357 MiB of RSS for 4,098 MiB of
torch views touched (docs/benchmarks.md, "Memory"). Here each page of the file has one address.

The windows a tensor uses are held by a span (`_Span`, which every array and tensor over it keeps
alive); when the last array of a span is gone, a finalizer releases its windows. Spans of the
same windows are shared while alive, as the per-window mappings were.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import types
import weakref
from typing import Any

import numpy as np

from ._native import libc

__all__ = ["PrivateMapping", "available"]

_MADV_DONTNEED = 4


def _libc() -> Any:
    """libc's ``mprotect`` and ``madvise`` (attributes of one object), or None without either."""
    mprotect, madvise = (libc(name, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int) for name in ("mprotect", "madvise"))
    return None if mprotect is None or madvise is None else types.SimpleNamespace(mprotect=mprotect, madvise=madvise)


_LIBC: Any = None  # libc's mprotect and madvise, found on first use (`available`)


def available() -> bool:
    """Whether this platform maps private windows here (Linux, 64-bit): elsewhere
    `MappedFile.private_window` makes a mapping per run of windows."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc() if sys.platform.startswith("linux") and ctypes.sizeof(ctypes.c_long) == 8 else None
        _LIBC = _LIBC or False
    return bool(_LIBC)


class PrivateMapping:
    """A whole file mapped ``MAP_PRIVATE``, read-only, whose windows are made writable on demand.

    Args:
        fd: the file's descriptor (the mapping holds a duplicate: it outlives the checkpoint's).
        size: the file's size.
        window: bytes a window (a multiple of the page size).

    Raises:
        OSError: the file could not be mapped.
    """

    def __init__(self, fd: int, size: int, window: int) -> None:
        self.size, self.window = size, window
        self._mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        self._anchor = np.frombuffer(self._mapped, np.uint8)  # (holds the mapping: it is never unmapped under a span)
        self.address = self._anchor.__array_interface__["data"][0]
        # A span can die while this thread is in `span` (a garbage collection there): its release is then
        # queued (`_pending`) and made before the lock is let go, never in the middle of a count
        self._lock = threading.RLock()
        self._busy = False
        self._pending: list[tuple[int, int]] = []
        self._users: dict[int, int] = {}  # window -> spans alive over it (writable while > 0)
        _LIVE.add(self)
        # (window, window) -> the array over that span, while alive (the array, made once: ~1.6 us a tensor)
        self._spans: weakref.WeakValueDictionary[tuple[int, int], np.ndarray] = weakref.WeakValueDictionary()

    def cached(self, first: int, last: int) -> np.ndarray | None:
        """The span of windows `first`..`last` if one is alive, else None."""
        return self._spans.get((first, last))

    def span(self, first: int, last: int) -> np.ndarray:
        """Writable memory over windows `first`..`last` (from byte ``first * window`` of the file): a
        ``uint8`` array whose base (a `_Span`) keeps them writable while it lives, shared with any
        span of them alive: the same array, every twin's base (internal: never reshaped or flagged).

        Raises:
            OSError: the kernel refused to make a window writable (the commitment: strict or
                heuristic overcommit), errno kept; no window is left writable by this call.
        """
        with self._lock:
            self._busy = True
            try:
                return self._span(first, last)
            finally:
                self._busy = False
                while self._pending:
                    low, high = self._pending.pop()
                    self._drop(range(low, high + 1))

    def _span(self, first: int, last: int) -> np.ndarray:
        found = self._spans.get((first, last))
        if found is not None:
            return found
        # Each run of windows no span uses yet is made writable in one call; the kernel checks each
        # mapping (VMA) a call makes writable on its own, so a span of several windows is first checked
        # whole (`_commit_check`), as one mapping of it was: larger than memory and swap, it is refused
        runs: list[list[int]] = []
        for k in range(first, last + 1):
            if not self._users.get(k):
                if runs and runs[-1][-1] == k - 1:
                    runs[-1].append(k)
                else:
                    runs.append([k])
        start = first * self.window
        length = min((last + 1) * self.window, self.size) - start
        if last > first:
            _commit_check(length)
        made: list[int] = []
        try:
            for run in runs:
                made += run  # (first: a refused mprotect may have made part of its run writable)
                self._protect(run[0], run[-1], mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            for k in made:  # (read-only again: no window is left writable by a refused call; none had a user)
                self._fresh(k)
            raise
        for k in range(first, last + 1):
            self._users[k] = self._users.get(k, 0) + 1
        made_span = _Span(self, self.address + start, length)
        # (not at exit: an exit handler may still write to a tensor over it; the process's end unmaps all)
        weakref.finalize(made_span, self._release, first, last).atexit = False
        span = self._spans[first, last] = np.asarray(made_span)
        return span

    def _release(self, first: int, last: int) -> None:
        """The span over windows `first`..`last` is gone: each window no span uses any more is made
        as the file has it again (`_fresh`)."""
        with self._lock:
            if self._busy:  # (this thread, inside `span`: made when it is done)
                self._pending.append((first, last))
            else:
                self._drop(range(first, last + 1))

    def _drop(self, windows: Any) -> None:
        """One span fewer over each of `windows` (the lock held); those none uses any more made fresh."""
        for k in windows:
            left = self._users.get(k, 0) - 1
            if left > 0:
                self._users[k] = left
            else:
                self._users.pop(k, None)
                self._fresh(k)

    def _protect(self, first: int, last: int, prot: int) -> None:
        at, _ = self._bounds(first)
        end = sum(self._bounds(last))
        if _LIBC.mprotect(at, end - at, prot) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    def _fresh(self, k: int) -> None:
        """Window `k` as the file has it again: its private pages dropped (``MADV_DONTNEED``: a later
        read maps the file's page), read-only. Not mapped anew over itself (``MAP_FIXED``), which
        would return its commitment too: a kernel that fails such a mapping may leave a hole in its
        place, which another mapping could then take, and this one's end would unmap."""
        at, length = self._bounds(k)
        _LIBC.madvise(at, length, _MADV_DONTNEED)
        _LIBC.mprotect(at, length, mmap.PROT_READ)  # (refused, where VMAs cannot be split: it stays writable, unused)

    def _bounds(self, k: int) -> tuple[int, int]:
        start = k * self.window
        return self.address + start, min(start + self.window, self.size) - start


def _commit_check(length: int) -> None:
    """Refuses (`OSError`, the kernel's errno) a span of `length` bytes that the kernel would not
    commit as one writable private mapping, as the mapping of it made elsewhere is refused.

    ``mprotect`` checks the commitment of each mapping (VMA) it makes writable on its own, and a
    span's windows are several: runs between windows other spans use, and windows made writable
    before (they keep their commitment, so stay apart from their neighbours). Under heuristic
    overcommit each piece may pass where the whole, larger than RAM + swap, would not. An anonymous
    private writable mapping of the whole length, unmapped at once (no page touched), asks the
    kernel's own question once."""
    probe = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    probe.close()


_LIVE: weakref.WeakSet[PrivateMapping] = weakref.WeakSet()  # (each given a lock of its own in a forked child)


def _after_fork() -> None:
    """In a forked child: each mapping's lock anew. The thread that held one at the fork does not exist
    here, and the child would wait for it forever at its first twin made or dropped. A count it left
    half updated errs high (a release half done, a span not yet made): a window left writable, never
    one made read-only under a twin; a release it had queued is lost the same way."""
    for mapping in list(_LIVE):
        mapping._lock, mapping._busy, mapping._pending = threading.RLock(), False, []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Span:
    """Writable bytes of a `PrivateMapping`'s windows, as numpy sees them (``__array_interface__``:
    ``numpy.asarray`` makes an array over them whose base is this, with no buffer object of a type
    made for its length, as ``ctypes`` would make, and collect for, each time)."""

    __slots__ = ("__array_interface__", "mapping", "__weakref__")

    def __init__(self, mapping: PrivateMapping, address: int, length: int) -> None:
        self.mapping = mapping  # (alive while any span is)
        self.__array_interface__ = {"data": (address, False), "shape": (length,), "typestr": "|u1", "version": 3}

