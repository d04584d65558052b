"""Staging: moving many host arrays to a GPU in a few large copies. Framework-free.

A device transfer tensor by tensor pays a launch and a synchronisation per tensor and copies
from pageable memory at a fraction of the bus speed. Instead:

1. **Planning.** `extent_of` finds where each array's bytes lie in the contiguous buffer that
   holds them (a file mapping, an inflated member); `plan_runs` groups the extents of each
   buffer into runs of nearby bytes (`Run`, at most 256 MiB by default, small gaps copied
   along). Each run gets one device allocation; its tensors become views of it. The allocations
   are made as the copies reach them, while the fill pool reads the runs before them (a fresh
   process pays for each new device allocation).
2. **Copying.** `StagedLoader` sends each run through a ring of reusable staging buffers
   (4 x 32 MiB, pinned on CUDA): while the GPU copies from one buffer with a non-blocking DMA,
   the fill pool (`weightio.devices.filling.Filler`) fills the others, by ``pread`` from the
   file where the bytes are a view of its mapping (no page fault on the mapping; the file is
   checked for changes before and after, as every owned load is), by parallel ``memcpy`` else.
   The pieces of all buffers but one are queued at once, so the pool does not idle at a buffer's
   boundary, and the buffer refilled next is the one sent an iteration before, its copy done by
   then (not the one just sent, whose copy the refill would wait out). A buffer is refilled only
   after the event recorded behind its last copy has fired.
   The ring grows a buffer at a time on first use (a fresh process pays for pinning each one,
   the first fills meanwhile under way) and is kept for every later transfer to that device
   until `StagedLoader.release`.

Arrays that cannot be viewed raw on a device (big-endian, misaligned, negative strides) are
converted on the host first and staged the same way.

The device primitives come from an `Engine`: each GPU framework's backend (`weightio.devices.torch`,
`weightio.devices.cupy`) is one.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .filling import Filler

__all__ = ["RUN_ALIGN", "Engine", "Extent", "Run", "StagedLoader", "extent_of", "plan_runs"]

# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Extent:
    """One tensor's bytes inside a host buffer.

    Attributes:
        key: the tensor's name.
        root: the contiguous array whose memory holds it (a file mapping, an inflated member, …).
        start, stop: the byte range ``[start, stop)`` of `root` its elements occupy.
        dtype, shape: the tensor's (native-order) dtype and shape.
        strides: byte strides (positive) for a non-contiguous tensor, else None.
    """

    key: str
    root: np.ndarray
    start: int
    stop: int
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None


@dataclass
class Run:
    """Neighbouring extents of one root buffer, copied to the device as one range.

    Attributes:
        root: the host buffer.
        start, stop: the byte range copied (`start` aligned down so that device offsets keep
            every member's alignment).
        members: the extents it holds.
    """

    root: np.ndarray
    start: int
    stop: int
    members: list[Extent] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


RUN_ALIGN = 64  # device offsets keep each tensor's offset modulo 64: aligned for every element type


def plan_runs(extents: Iterable[Extent], *, max_gap: int = 1 << 16, max_run: int = 256 << 20) -> list[Run]:
    """Group extents into runs of nearby bytes, per root buffer, in address order.

    An extent joins the current run when it starts at most `max_gap` bytes after the run ends
    (padding and small headers between tensors are copied along rather than splitting the copy)
    and the run stays within `max_run` bytes; an extent overlapping the run (tensors sharing
    storage) always joins it. A tensor larger than `max_run` gets a run of its own.

    Example:
        >>> buf = np.zeros(256, np.uint8)
        >>> ext = [Extent(k, buf, a, b, np.dtype("u1"), (b - a,)) for k, a, b in [("x", 0, 8), ("y", 8, 16)]]
        >>> [(r.start, r.stop, [m.key for m in r.members]) for r in plan_runs(ext)]
        [(0, 16, ['x', 'y'])]
    """
    by_root: dict[int, list[Extent]] = {}
    for ext in extents:
        by_root.setdefault(id(ext.root), []).append(ext)
    runs: list[Run] = []
    for group in by_root.values():
        runs.extend(_runs_of(sorted(group, key=lambda e: (e.start, e.stop)), max_gap, max_run))
    return runs


def _runs_of(group: list[Extent], max_gap: int, max_run: int) -> list[Run]:
    runs: list[Run] = []
    for ext in group:
        run = runs[-1] if runs else None
        overlaps = run is not None and ext.start < run.stop
        near = run is not None and ext.start - run.stop <= max_gap and max(ext.stop, run.stop) - run.start <= max_run
        if run is not None and (overlaps or near):
            run.stop = max(run.stop, ext.stop)
            run.members.append(ext)
        else:
            runs.append(Run(ext.root, ext.start - ext.start % RUN_ALIGN, ext.stop, [ext]))
    return runs


def extent_of(key: str, arr: np.ndarray) -> Extent | None:
    """Where `arr`'s elements lie in the contiguous buffer its memory belongs to, or None.

    None when the array cannot be copied raw and viewed on a device as it is: not native
    byte order, negative or non-element strides, misaligned, or memory of unknown extent.
    """
    if not arr.dtype.isnative or arr.size == 0:
        return None
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        return None
    itemsize = arr.dtype.itemsize
    offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    strides = None if arr.flags.c_contiguous else tuple(arr.strides)
    if strides is not None and any(s <= 0 or s % itemsize for s in strides):
        return None
    span = arr.nbytes
    if strides is not None:
        span = sum(s * (d - 1) for d, s in zip(arr.shape, strides, strict=True)) + itemsize
    if offset < 0 or offset % itemsize or offset + span > root.nbytes:
        return None
    return Extent(key, root, offset, offset + span, arr.dtype, tuple(arr.shape), strides)


# ----------------------------------------------------------------------------- copying


class Engine(Protocol):
    """The device primitives `StagedLoader` needs; a GPU backend provides them itself."""

    staged: bool  # copy through the ring of host buffers (else straight from the source memory)

    def active(self) -> Any: ...  # a context making the device current (copies and events on its stream)
    def empty(self, nbytes: int) -> Any: ...  # a device byte buffer
    def host_buffer(self, nbytes: int) -> tuple[Any, np.ndarray]: ...  # (framework handle, numpy view)
    def copy(self, dev: Any, pos: int, host: Any, n: int, at: int) -> None: ...  # host[at:at+n] -> dev[pos:], async
    def copy_direct(self, dev: Any, pos: int, src: np.ndarray) -> None: ...
    def event(self) -> Any: ...  # has record() and synchronize(), or None where copies are synchronous
    def view(self, dev: Any, rel: int, ext: Extent) -> Any: ...  # the tensor at byte `rel` of `dev`
    def empty_tensor(self, dtype: np.dtype, shape: tuple[int, ...]) -> Any: ...


class _Slot:
    """One staging buffer of the ring and the event marking the end of its last copy."""

    def __init__(self, engine: Engine, nbytes: int) -> None:
        self.handle, self.host = engine.host_buffer(nbytes)
        self.done = engine.event()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def record(self) -> None:
        if self.done is not None:
            self.done.record()


class StagedLoader:
    """Moves host arrays to a device in large runs, through a reusable ring of staging buffers.

    Args:
        engine: the device primitives (a torch or cupy backend).
        chunk: bytes per staging buffer.
        slots: staging buffers in the ring: while the device copies from one, the others fill.
        max_gap, max_run: see `plan_runs`.

    Filling is pipelined: the pieces of up to `slots` - 1 buffers are queued on the fill pool at once
    (`weightio.devices.filling.Filler`: ``pread`` from the file for views of a file's mapping,
    parallel ``memcpy`` otherwise), so the pool never idles at a buffer's boundary; the oldest
    buffer is handed to the device as soon as its pieces are done. An engine that does not stage
    (``torch:mps``: unified memory, no pinned allocator) copies each run straight from the host
    buffer. The ring works the same with unpinned buffers, which is how the tests exercise it on
    machines without a GPU.
    """

    def __init__(self, engine: Engine, *, chunk: int = 32 << 20, slots: int = 4,
                 max_gap: int = 1 << 16, max_run: int = 256 << 20, piece: int = 4 << 20) -> None:
        self.engine, self.chunk, self.nslots, self.piece = engine, chunk, slots, piece
        self.max_gap, self.max_run = max_gap, max_run
        self._slots: list[_Slot] = []
        self._turn = 0
        self._lock = threading.Lock()

    def release(self) -> None:
        """Free the staging buffers (after the copies using them have finished)."""
        with self._lock:
            for slot in self._slots:
                slot.wait()
            self._slots, self._turn = [], 0

    def load(self, arrays: Mapping[str, np.ndarray], *, separate: bool = False) -> dict[str, Any]:
        """Every array on the device, dtype and shape unchanged, in `arrays`' order.

        By default each run gets one device allocation and its tensors are views of it (the
        fewest allocations). With `separate`, each tensor gets an allocation of its own, sharing
        memory with no other result (freed when that tensor is): what a model's parameters
        need. The copies still move whole runs through the ring; each buffer's bytes are handed
        to every tensor they belong to."""
        extents, out = [], {}
        for key, arr in arrays.items():
            ext = extent_of(key, arr)
            if ext is None and arr.size:  # converted on the host, then staged like the rest
                ext = extent_of(key, arr.astype(arr.dtype.newbyteorder("="), order="C", copy=True))
            if ext is None:
                out[key] = self.engine.empty_tensor(arr.dtype.newbyteorder("="), tuple(arr.shape))
            else:
                extents.append(ext)
        with self._lock, self.engine.active():
            runs = plan_runs(extents, max_gap=self.max_gap, max_run=self.max_run)
            chunks: list[tuple[list[_Target], int, np.ndarray]] = []
            placed: dict[str, tuple[_Target, int]] = {}  # name -> (its device allocation, its offset there)
            for run in runs:
                if separate:
                    targets = [_Target(e.start - run.start, e.stop - run.start) for e in run.members]
                    placed.update((e.key, (t, 0)) for e, t in zip(run.members, targets, strict=True))
                else:
                    whole = _Target(0, run.nbytes)
                    targets = [whole]
                    placed.update((e.key, (whole, e.start - run.start)) for e in run.members)
                raw = _bytes(run.root)
                chunks += [(targets, pos, raw[run.start + pos : run.start + min(pos + self.chunk, run.nbytes)])
                           for pos in range(0, run.nbytes, self.chunk)]
            if self.engine.staged:
                self._stage(chunks)
            else:
                for targets, pos, src in chunks:
                    for target, lo, hi in _spans(targets, pos, len(src)):
                        dev = target.allocated(self.engine)
                        self.engine.copy_direct(dev, lo - target.start, src[lo - pos : hi - pos])
            for ext in extents:
                target, rel = placed[ext.key]
                out[ext.key] = self.engine.view(target.allocated(self.engine), rel, ext)
        return {key: out[key] for key in arrays}

    def _stage(self, chunks: list[tuple[list[_Target], int, np.ndarray]]) -> None:
        """Each ``(targets, offset in the run, source)`` copied through the ring, fills pipelined."""
        filling: deque[tuple[_Slot, list[_Target], int, int, list]] = deque()  # queued on the pool, not yet sent

        def send_oldest() -> None:
            slot, targets, pos, n, futures = filling.popleft()
            filler.wait(futures)
            try:
                for target, lo, hi in _spans(targets, pos, n):
                    self.engine.copy(target.allocated(self.engine), lo - target.start, slot.handle, hi - lo, lo - pos)
            except BaseException:
                with contextlib.suppress(Exception):  # (the copies issued before the failure: waited for below)
                    slot.record()
                raise
            slot.record()

        # Buffers filling at once: all but one, so that the buffer reused next was sent an iteration
        # before, its copy (mostly) done. Filling all of them, the one reused would be the one just
        # sent, and every chunk would wait out its own copy: on an H200 machine ~0.4 ms of the main
        # thread's ~1 ms a chunk (docs/benchmarks.md "GPU").
        ahead = max(1, self.nslots - 1)
        try:
            # on an error, it cancels or waits for every fill: none writes after; the pool's threads divided
            # among the buffers filling at once (more threads than cores would keep this one from them)
            with Filler(self.piece, at_once=ahead) as filler:
                for targets, pos, src in chunks:
                    if len(filling) >= ahead:  # (so no buffer still filling, or not yet sent, is reused)
                        send_oldest()
                    slot = self._next_slot()
                    slot.wait()  # the copy that last read this buffer has finished
                    n = len(src)
                    filling.append((slot, targets, pos, n, filler.start([(slot.host[:n], src)])))
                    for target, _, _ in _spans(targets, pos, n):  # allocated while the pool fills
                        target.allocated(self.engine)
                while filling:
                    send_oldest()
        except BaseException:
            # Copies already sent may still be running (a fill failing while the last buffers are
            # sent, an interrupt): the device memory they write into is freed as the error unwinds,
            # and an engine whose copies run on a stream of their own (cupy) could see it reused
            # by other work before they land. Wait for every buffer's last copy first.
            for slot in self._slots:
                with contextlib.suppress(Exception):  # (a lost device: the error raised stands)
                    slot.wait()
            raise

    def _next_slot(self) -> _Slot:
        if len(self._slots) < self.nslots:  # the ring grows a buffer at a time, while the first ones fill
            self._slots.append(_Slot(self.engine, self.chunk))
            slot = self._slots[-1]
        else:
            slot = self._slots[self._turn % self.nslots]
        self._turn += 1
        return slot


class _Target:
    """A device allocation holding bytes ``[start, stop)`` of a run (the whole run, or one tensor's),
    made when the first bytes for it are on their way (`allocated`)."""

    __slots__ = ("start", "stop", "dev")

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.dev: Any = None

    def allocated(self, engine: Engine) -> Any:
        if self.dev is None:
            self.dev = engine.empty(self.stop - self.start)
        return self.dev


def _spans(targets: list[_Target], pos: int, n: int) -> list[tuple[_Target, int, int]]:
    """The targets that bytes ``[pos, pos + n)`` of a run belong to, each with the part it gets."""
    out = []
    for target in targets:
        lo, hi = max(target.start, pos), min(target.stop, pos + n)
        if lo < hi:
            out.append((target, lo, hi))
    return out


def _bytes(root: np.ndarray) -> np.ndarray:
    """A contiguous array's memory as a flat uint8 array (zero-copy)."""
    return root.reshape(-1).view(np.uint8) if root.dtype != np.uint8 or root.ndim != 1 else root

