"""Owned copies of checkpoint bytes, filled in parallel. Framework-free.

What ``tensor.clone()`` of a zero-copy view costs, per 4 KiB page: a fault on the file mapping
(the source), a fault on fresh anonymous memory (the destination: the kernel zeroes the page
first), and a share of one single-threaded ``memcpy``. On a 4 GiB model the faults cost several
times the copy. `fill` does the same work another way:

1. **Destinations** are allocated by the caller (``np.empty``, ``torch.empty``), one per tensor,
   so that each result owns its memory. Each piece of a destination is populated in one call
   (`populate`: ``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+) by the thread that then reads
   into it, instead of faulting page by page: 4 GiB load 1.24 s -> 1.05-1.17 s here. Transparent
   huge pages (``MADV_HUGEPAGE``) were measured 2.5x *slower* (3.5-3.8 s), and again 2.2-3.5x on
   1 GiB (0.69-0.99 s against 0.29-0.39 s, fresh processes) with no compaction at all
   (``compact_stall`` unchanged, 384 huge-page faults): on these VMs a huge page comes from memory
   the host has not backed yet. In a process that had freed such memory, numpy's destinations
   (numpy asks for huge pages for arrays of 4 MiB or more) filled faster than 4 KiB pages (221
   against 271 ms), so the pages are left as each framework allocates them.
   **The kernel's copies** (Linux 5.11+, in C: `_COPIES`, weightio/_copies.h): a whole load's
   destinations are fresh memory, and a fresh page is zeroed before the read overwrites it. A piece
   with 256 KiB of whole pages or more has them made by userfaultfd's ``UFFDIO_COPY`` already
   holding their bytes, copied from a mapping of the piece's stretch of the file made (and unmapped)
   for it: no zeroing, no fault, no file page left mapped. 4 GiB to torch, warm, fresh processes:
   1.51-2.60 s (median 1.53) against 1.97-5.50 s (2.02), the kernel's time 2.56-4.36 s against
   3.34-8.05 s, 44.6k page faults against 1.05M; cold, 5.33-6.37 s against 5.85-6.54 s. To numpy
   (whose destinations ask for huge pages, which the copies do not make), another VM: 0.71-0.88 s
   (median 0.83) against 1.17-2.81 s (1.90), 5 alternations of fresh processes. Pages
   already there (memory used before) are found first (``mincore``) and read as before; so is
   everything where userfaultfd is refused.
2. **Sources** that are views of a file's read-only mapping are not touched through the mapping:
   their bytes are read with ``pread`` (``os.preadv``) from the file straight into the
   destination, page cache to memory in the kernel, with no fault on the source. Other sources
   (inflated members, converted arrays, closed checkpoints) are copied with ``np.copyto``.
3. **Pieces** of at most `PIECE` bytes run on a pool of threads (both calls release the GIL):
   destination faults, copies and, from a cold cache, disk reads overlap. Where weightio's C
   module is built, a thread's pieces are faulted and read in one call
   (`weightio._speedups.read_pieces`) that takes the interpreter's lock once, on return: in Python
   each piece took it back three times, ~27 µs of interpreter work a piece (on 64 KiB pieces, 16
   stretches: 105 -> 34 ms for 256 MiB; an owned load of 20,000 tensors of 64 KiB, 0.72 -> 0.36 s).
   A fill too small to give every CPU a `PIECE` (one tensor's ``to(copy=True)``) is cut into one
   piece a CPU, no more than one a `MIN_PIECE` (`_piece_for`): a 1 GiB model copied one
   ``to(copy=True)`` at a time took 0.92 s in 8 MiB pieces (each read whole on the caller's
   thread) and 0.60 s in 4 MiB pieces on 2 CPUs; a fill of one piece (a tensor under 2 MiB) is
   read on the caller's thread without a `Filler` (7 KiB: 53 -> 25 us a call). Where the pool
   takes no more work (interpreter shutdown), pieces are read on the caller's thread. A whole
   load (`fill`) gives each thread one
   stretch of each file, read in order through an open file description of its own
   (`_read_stripe`): the kernel reads ahead for each as for one sequential reader.
   Threads sharing one descriptor at scattered offsets defeat read-ahead: a cold 4 GiB load took
   5.3-6.2 s that way, 3.9-5.4 s in stretches (the Run:ai streamer: 2.3-6.1 s), and warm
   2.7-2.9 s -> 2.3-2.5 s, on a 2-CPU VM. The GPU ring (`Filler` without stripes) reads its
   buffers piece by piece, a buffer at a time: in C, a buffer's pieces are one pool task whose
   call shares them among threads of its own (`_SHARED`), which never take the interpreter's lock.
   A pool task a piece cost ~45 us of Python each under that lock, which the thread launching the
   GPU copies then waited for: on 2 CPUs, a main-thread ``torch.empty`` took 37-39 us during such a
   fill and 9-11 us with the pieces shared (1.3-2.6 us alone), and 256 MiB in 64 KiB pieces took
   114 -> 26 ms. The buffers filling at once divide the pool's threads among them (`at_once`).

Every check of the zero-copy path holds here: the file is checked before the reads (size and
modification time, `weightio._io.MappedFile.check`) and again after them, so bytes read while it
was rewritten are never returned; each piece is bounds-checked against the file's size; a short
read (a file truncated under us) raises `CorruptFileError`. Reads go through a duplicate of the
file's descriptor, so closing the checkpoint meanwhile does not break them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from .._io import mapped_source
from .._memory import populate
from .._native import speedups
from .._threads import cpus, shared_pool
from ..errors import CorruptFileError, InputError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from .._io import MappedFile

__all__ = ["PIECE", "fill", "populate", "populate_all"]

PIECE = 8 << 20  # bytes per task: small enough to spread a few large tensors over every thread
MIN_PIECE = 1 << 20  # a fill is cut into no more pieces than it has MiB: a hand-off would cost more than it saves
_PAGE = 4096
# Threads: as many as keep the disk busy from a cold cache (the disk, not the CPU, is then the
# limit: 16 reads in flight, as the Run:ai streamer's default), whatever the cores; warm, the extra
# threads wait on the memory bus. On 2 CPUs a cold 1 GiB load took 1.52 s with 4 threads, 1.18 s
# with 16 (medians of 6); warm, 0.45 s with 4, 8 and 16.
_THREADS = 16


def fill(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy each source's bytes into its destination, in parallel.

    Args:
        pairs: ``(destination, source)``: the destination a writable, C-contiguous ``uint8`` array
            (memory the caller owns), the source a C-contiguous array of the same byte count.

    Raises:
        CorruptFileError: a source's file changed since it was opened, or shrank during the reads.
        WeightioError: a source's checkpoint was closed before its descriptor could be duplicated.
        InputError: no descriptor left to read a source's file with (``ulimit -n``), or a read
            failed (EIO: a failing disk; its errno kept).
    """
    if len(pairs) == 1 and pairs[0][0].nbytes <= _piece_for(pairs[0][0].nbytes):  # one piece: a small tensor
        dst, src = pairs[0]
        located = mapped_source(src) if _PREAD and src.nbytes else None
        if located is not None:  # read here, as `Filler` would, without its bookkeeping: 53 -> 25 us a call
            file, offset = located
            with _descriptor(file) as fd:
                _read(fd, file, dst, offset, copies=True)
            return
    with Filler(stripes=_THREADS) as filler:
        filler.wait(filler.start(pairs, inline=True))


def populate_all(arr: np.ndarray, piece: int = 4 << 20) -> None:
    """`populate` a C-contiguous array's pages in pieces on the fill pool's threads, for memory that
    must be resident before its first use (a staging buffer about to be pinned).

    Fresh memory is faulted in at a rate per thread, and slowly on a VM: on the H200 machines
    here one thread faulted 32 MiB in 10.8 ms, and pinning the GPU ring's four buffers one thread
    at a time took ~55 ms of a fresh process's 222 ms load of a 4 GiB model (docs/benchmarks.md
    "GPU"). Where the pool takes no more work (interpreter shutdown), this thread does it all.
    """
    flat = arr.reshape(-1).view(np.uint8)
    bounds = _pieces(flat.nbytes, piece)
    pool = _pool() if len(bounds) > 1 else None
    futures: list[Future] = []
    if pool is not None:
        try:
            futures = [pool.submit(populate, flat[a:b]) for a, b in bounds]
        except RuntimeError:  # (shutting down: a piece populated twice costs nothing)
            pool = None
    if pool is None:
        populate(flat)
    for future in futures:
        future.result()


class Filler:
    """`fill` in steps, for a caller that overlaps fills with other work (the GPU staging ring).

    `start` queues the copies of some pairs on the pool and returns at once; `wait` blocks until
    they are done. Each file read from is checked before its first read and, when the block
    ends without error, after the last, as in `fill`.

    Example:
        >>> dst, src = np.zeros(8, np.uint8), np.arange(8, dtype=np.uint8)
        >>> with Filler() as filler:
        ...     filler.wait(filler.start([(dst, src)]))
        >>> dst.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """

    def __init__(self, piece: int | None = None, *, stripes: int = 0, at_once: int = 1) -> None:
        """`piece`: bytes a piece (default: `_piece_for` the fill); `stripes`: the stretches a file is
        read in, each through a description of its own (0: pieces); `at_once`: the starts this filler
        keeps in flight together (the GPU ring's buffers), among which the pool's threads are divided
        for the reads a start shares (`_SHARED`), so that no more threads read at once than the pool has."""
        self.piece, self.stripes, self.at_once = piece, stripes, max(1, at_once)
        self._stop = _Stop()  # set on an error: stripes stop between pieces
        self._stack = contextlib.ExitStack()
        self._fds: dict[int, int] = {}
        self._queued: list[Future] = []  # every task this filler put on the pool and may not have seen end
        self._gate = threading.Condition()  # tasks running now (`_running`); none begins once `_closing`
        self._running, self._closing = 0, False

    def __enter__(self) -> Filler:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Settle every task queued (on an error: those not begun are cancelled, the others stop between
        pieces), then close the descriptors: no read runs on one after it is closed, and the file is
        checked after every read, whatever the caller waited for (a `start` cut short by an error,
        a second interrupt during `wait`'s clean-up)."""
        try:
            if exc[0] is not None:
                self._stop.set()
                for future in self._queued:
                    future.cancel()
        finally:  # (an interrupt during the cancels still waits for every task)
            try:
                _settle(self._queued)
            finally:
                try:
                    self._close_gate()  # (a task queued but not recorded, `start` interrupted, never begins)
                finally:
                    self._stack.__exit__(*exc)  # after an error the descriptors close unchecked: the error stands

    def _task(self, fn: Any, *args: Any) -> None:
        """What the pool runs: `fn(*args)`, unless the filler has closed (then nothing)."""
        with self._gate:
            if self._closing:
                return
            self._running += 1
        try:
            fn(*args)
        finally:
            with self._gate:
                self._running -= 1
                self._gate.notify_all()

    def _close_gate(self) -> None:
        """No task begins from now on; block until none runs (an interrupt meanwhile: raised after)."""
        interrupted: BaseException | None = None
        with self._gate:
            self._closing = True
            while self._running:
                try:
                    self._gate.wait()
                except BaseException as e:  # raised in this thread while it waited
                    interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted

    def start(self, pairs: Sequence[tuple[np.ndarray, np.ndarray]], *, inline: bool = False) -> list[Future]:
        """Queue the copies of `pairs` (see `fill`); the futures to `wait` for. With `inline`, a
        single piece of work is done now, on this thread (a hand-off would cost more)."""
        piece = self.piece or _piece_for(sum(dst.nbytes for dst, _ in pairs))
        tasks: list[tuple[Any, ...]] = []
        reads: dict[int, tuple[MappedFile, list[tuple[np.ndarray, int]]]] = {}
        for dst, src in pairs:
            if src.nbytes == 0:
                continue
            located = mapped_source(src) if _PREAD else None
            if located is None:
                flat = src.reshape(-1).view(np.uint8)
                tasks += [(_copy, dst[a:b], flat[a:b]) for a, b in _pieces(dst.nbytes, piece)]
            else:
                reads.setdefault(id(located[0]), (located[0], []))[1].append((dst, located[1]))
        for key, (file, jobs) in reads.items():  # in file order: from a cold cache, the disk reads ahead
            fd = self._fds.get(key)
            if fd is None:
                fd = self._fds[key] = self._stack.enter_context(_descriptor(file))
            pieces: list[tuple[np.ndarray, int]] = []
            for d, offset in sorted(jobs, key=_second):
                if d.nbytes <= piece:  # (most tensors: no slice made)
                    pieces.append((d, offset))
                else:
                    pieces += [(d[a:b], offset + a) for a, b in _pieces(d.nbytes, piece)]
            identity = _identity(fd) if self.stripes > 1 and len(pieces) > 1 else None
            probe = None if identity is None else _reopen(fd, identity)
            if probe is not None:  # descriptions of their own can be had: one per stretch, while it is read
                os.close(probe)
                tasks += [(_read_stripe, fd, identity, file, group, self._stop)
                          for group in _stripes(pieces, self.stripes)]
            elif _READ_PIECES is not None and _SHARED and len(pieces) > 1:  # (the GPU ring's buffers)
                threads = min(len(pieces), max(1, _THREADS // (len(reads) * self.at_once)))  # (_THREADS in all)
                tasks.append((_read_pieces, fd, file, pieces, self._stop, threads))
                inline = False  # (on the pool: the caller's wait stays interruptible, and stops the threads)
            else:  # (stretches sharing one description would defeat read-ahead: pieces are better)
                tasks += [(_read, fd, file, d, offset, self.stripes > 1) for d, offset in pieces]
        if inline and len(tasks) <= 1:
            for fn, *args in tasks:
                fn(*args)
            return []
        pool = _pool()
        self._queued = [future for future in self._queued if not future.done()]
        futures: list[Future] = []
        for fn, *args in tasks:  # (each tracked as it is queued: `__exit__` waits for it even if a later one fails)
            if pool is not None:
                try:
                    futures.append(pool.submit(self._task, fn, *args))
                except RuntimeError:  # the interpreter is shutting down: the pool takes no more work
                    pool = None
                else:
                    self._queued.append(futures[-1])
                    continue
            self._task(fn, *args)  # (so the rest is done here, in order, on this thread)
        return futures

    def wait(self, futures: list[Future]) -> None:
        """Block until every future is done; on the first error, cancel what has not started,
        stop the stretches between pieces, let what runs finish (nothing may write into the
        destinations after this returns), and raise."""
        try:
            for future in futures:
                future.result()
        except BaseException:
            self._stop.set()
            for future in futures:
                future.cancel()
            _settle(futures)
            raise


class _Stop:
    """Set on an error: the stretches stop between pieces. Its `flag` byte is what the reads in C
    (`_READ_PIECES`) look at before each piece, without the interpreter's lock."""

    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = bytearray(1)

    def set(self) -> None:
        self.flag[0] = 1

    def is_set(self) -> bool:
        return bool(self.flag[0])


def _settle(futures: list[Future]) -> None:
    """Block until each of `futures` has ended or was cancelled (their errors are another's to report).

    An exception raised in this thread while it waits (a second Ctrl-C) does not cut the wait
    short: it is raised once every task has settled, so nothing reads or writes after this returns.
    """
    from concurrent.futures import CancelledError  # (imported already: the futures come from a pool)

    interrupted: BaseException | None = None
    for future in futures:
        while True:
            try:
                if future.done():
                    break
                future.exception()  # returns once the task has ended
            except CancelledError:
                pass
            except BaseException as e:  # raised in this thread while it waited
                interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted


def _stripes(pieces: list[tuple[np.ndarray, int]], n: int) -> list[list[tuple[np.ndarray, int]]]:
    """`pieces` (in file order) cut into at most `n` runs of consecutive pieces of about equal bytes."""
    total = sum(d.nbytes for d, _ in pieces)
    groups: list[list[tuple[np.ndarray, int]]] = []
    current: list[tuple[np.ndarray, int]] = []
    filled, cut = 0, total / n  # a new run begins once the runs so far hold their share of the bytes
    for item in pieces:
        if current and filled >= cut:
            groups.append(current)
            current = []
            cut = total * (len(groups) + 1) / n
        current.append(item)
        filled += item[0].nbytes
    groups.append(current)
    return groups


def _read_stripe(fd: int, identity: tuple[int, int], file: MappedFile, group: list[tuple[np.ndarray, int]],
                 stop: _Stop) -> None:
    """Read a stretch of the file, piece after piece, through an open file description of its own.

    The kernel keeps read-ahead state per open file description: threads sharing one descriptor
    at scattered offsets look like one random reader, and from a cold cache each read waits for
    its own small disk reads. A thread reading its own stretch in order through its own
    description (``/proc/self/fd/N`` opened again, `_reopen`: the same file, whatever its path
    now names) is a sequential reader the kernel reads ahead for, as the Run:ai streamer's threads are.
    It is opened when the stretch starts and closed when it ends, so a load holds at most one per
    thread however many files it reads (a model of 163 shards, 16 stripes each, would otherwise
    need 2,600 descriptors); if none can be had then (no descriptor left), the stretch is read
    through `fd`, the file's shared one: slower from a cold cache (its read-ahead is shared), as
    correct (``pread`` names its offset). `identity`: the file's device and inode, taken when the
    load began, which the new description must have.
    """
    if stop.is_set():  # another piece failed before this stretch began
        return
    own = _reopen(fd, identity)
    try:
        through = fd if own is None else own
        if own is not None and hasattr(os, "posix_fadvise"):
            start, end = group[0][1], group[-1][1] + group[-1][0].nbytes
            with contextlib.suppress(OSError):  # a hint
                os.posix_fadvise(own, start, end - start, os.POSIX_FADV_SEQUENTIAL)
        _read_pieces(through, file, group, stop, copies=True)
    finally:
        if own is not None:
            os.close(own)


@contextlib.contextmanager
def _descriptor(file: MappedFile) -> Iterator[int]:
    """`file.descriptor()`, none left (``EMFILE``: a model of more shards than descriptors allowed)
    an `InputError` that says what to do."""
    stack = contextlib.ExitStack()
    try:
        fd = stack.enter_context(file.descriptor())
    except OSError as e:
        raise InputError(f"cannot open another descriptor of the file to read it: {e.strerror or e} "
                         "(raise the limit: ulimit -n)", path=file.path, errno=e.errno) from e
    with stack:
        yield fd


def _identity(fd: int) -> tuple[int, int] | None:
    """The device and inode of `fd`'s file, or None if it cannot be had."""
    try:
        found = os.fstat(fd)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _reopen(fd: int, identity: tuple[int, int]) -> int | None:
    """A new open file description of `fd`'s file (Linux), or None where there is none to be had;
    it must be the file of `identity` (device, inode), whatever its path or descriptor now names."""
    try:
        own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    if _identity(own) != identity:
        os.close(own)
        return None
    return own


def _pool() -> Any:
    """The fill pool, or None once the interpreter is shutting down (an ``atexit`` handler copying
    a tensor: no new pool can be made then, and the work is done on the caller's thread)."""
    try:
        return shared_pool("fill", _THREADS)
    except RuntimeError:
        return None


def _piece_for(total: int) -> int:
    """Bytes per piece for a fill of `total` bytes: `PIECE`, or less for a fill too small to give
    every CPU a piece of that size (one tensor's ``to(copy=True)``): as many pieces as CPUs, no
    more than one per `MIN_PIECE`, each a whole number of pages (the last is the only shorter one,
    by less than a page a piece)."""
    if PIECE <= MIN_PIECE:  # (the tests' tiny pieces)
        return PIECE
    count = max(1, min(_cpus(), total // MIN_PIECE))
    return max(_PAGE, min(PIECE, -(-total // (count * _PAGE)) * _PAGE))


def _cpus() -> int:
    """The CPUs this process may run on (`weightio._threads.cpus`), at most the pool's threads."""
    return min(cpus(), _THREADS)


def _pieces(n: int, piece: int = 0) -> list[tuple[int, int]]:
    piece = piece or PIECE
    return [(a, min(a + piece, n)) for a in range(0, n, piece)]


def _second(pair: tuple[Any, int]) -> int:
    return pair[1]


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    populate(dst)
    np.copyto(dst, src)


def _read(fd: int, file: MappedFile, dst: np.ndarray, offset: int, copies: bool = False) -> None:
    """``pread`` exactly ``len(dst)`` bytes at `offset` into `dst` (its pages faulted in first, or, with
    `copies`, made by the kernel holding them: `_read_pieces`)."""
    _read_pieces(fd, file, [(dst, offset)], copies=copies)


def _read_pieces(fd: int, file: MappedFile, pieces: list[tuple[np.ndarray, int]], stop: _Stop | None = None,
                 threads: int = 1, *, copies: bool = False) -> None:
    """`_read` each ``(destination, offset)`` of `pieces`, in order; none begun once `stop` is set.

    Every piece is bounds-checked against the file's size before the first read. In C where it was
    built (`_READ_PIECES`: the interpreter's lock taken once for all the pieces), else in Python.
    With `threads` (in C only), that many threads of the C call's own share the pieces. With
    `copies` (a whole load's fresh destinations: `_COPIES`; in C only, one thread), the kernel makes
    a destination's whole pages already holding their bytes.
    """
    size = file.size
    for dst, offset in pieces:
        if offset < 0 or offset + dst.nbytes > size:
            _bounded(file, offset, dst.nbytes)
    try:
        if _READ_PIECES is not None:
            flag = None if stop is None else stop.flag
            if threads > 1:
                read, got = _READ_PIECES(fd, pieces, flag, threads)
            else:
                read, got = _READ_PIECES(fd, pieces, flag, 1, copies and _COPIES)
            if got >= 0:
                _shrank(file, pieces[read][1] + got)
            return
        for dst, offset in pieces:
            if stop is not None and stop.is_set():  # another piece failed: the load is abandoned
                return
            populate(dst)
            # numpy's stubs give ndarray its buffer protocol (__buffer__) for Python >= 3.12 only; mypy checks 3.10
            view, done, n = memoryview(dst), 0, dst.nbytes  # type: ignore[arg-type]
            while done < n:
                got = os.preadv(fd, [view[done:]], offset + done)
                if got == 0:
                    _shrank(file, offset + done)
                done += got
    except OSError as e:  # (EIO from a failing disk, a stale network file): the file named, the errno kept
        raise InputError(f"cannot read the file: {e.strerror or e}", path=file.path, errno=e.errno) from e


def _bounded(file: MappedFile, offset: int, n: int) -> None:
    if offset < 0 or offset + n > file.size:
        raise CorruptFileError(f"bytes {offset}..{offset + n} lie past the end of the file ({file.size} bytes)",
                               path=file.path)


def _shrank(file: MappedFile, end: int) -> NoReturn:
    raise CorruptFileError(f"file shrank while reading it (now ends at {end})", path=file.path)


_PREAD = hasattr(os, "preadv")  # not on Windows: there every source is copied from the mapping
# `_read_pieces` in C (`weightio._speedups.read_pieces`, weightio/_reads.h), where it was built: the
# same system calls without the interpreter's lock between them. Else in Python.
_READ_PIECES = getattr(speedups, "read_pieces", None) if _PREAD else None
# A fill's pieces that are not read in stretches (the GPU ring's buffers) go to the pool as one task
# a file, whose C call shares them among threads of its own (`read_pieces`' `threads`), instead of
# one pool task a piece: ~45 us of Python (the pool's futures, under the interpreter's lock) a piece
# less. False: a task a piece, as before (bench/gpu.py --explore compares the two).
_SHARED = True
# A whole load's fresh destinations (`fill`'s stretches), in C on Linux: the kernel allocates each whole
# page of a destination already holding its bytes, copied from a mapping of the file (userfaultfd's
# UFFDIO_COPY, weightio/_copies.h), instead of zeroing it before the read overwrites it (pieces of
# 256 KiB of whole pages or more). False: populate and pread, as before.
_COPIES = True
