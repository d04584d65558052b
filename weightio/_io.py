"""Input files shared by every format: one read-only mapping per input.

Inputs are mapped once and exposed as one read-only `uint8` numpy array; every tensor view is
a slice of that array, so the mapping is exported to numpy exactly once and stays mapped for as
long as any view lives (closing never unmaps under a live view).

The mapping is shared and read-only (`mmap.ACCESS_READ`: ``MAP_SHARED``, ``PROT_READ``). A
read-only mapping commits no memory: a file of any size maps (a model many times larger than
memory opens, lists and reads), its pages are the page cache's, shared with every process that
reads the file. A writable private mapping of the whole file (``MAP_PRIVATE``, ``PROT_WRITE``)
would be charged in full to the kernel's overcommit accounting: a 64 GiB file on a 24 GiB
machine would not map at all.

Writable memory is given per tensor, on demand (`writable_twin`): frameworks that share the
memory (a zero-copy torch CPU tensor) cannot be told it is read-only, and an in-place write to a
read-only mapping is SIGSEGV. Such a tensor is built over private copy-on-write memory
(``MAP_PRIVATE``) of just the `PRIVATE_WINDOW`-aligned stretch of the file that holds it: a write
copies the touched pages for this process alone; the file, the read-only mapping (every numpy
view), other processes and later opens never see it, and only that stretch is committed. On
Linux the stretches are windows of one private mapping of the file (`weightio._private`), made
writable while a tensor over them lives; elsewhere, a mapping of each.

A file changed under us: the open file descriptor is kept (the mapping is made on first use,
after the same check), and every access to the mapping
(`MappedFile.data`, which every ``buffer()`` and so every ``numpy()`` goes through) first
compares the file's size and modification time (``fstat`` of that descriptor) with those seen
at open; header reads (``pread``) fail cleanly on bytes a truncation took. A file truncated,
grown or rewritten in place since then raises `CorruptFileError` ("changed since it was
opened") instead of handing out pages that may no longer exist (touching a mapped page past the
end of a truncated file is SIGBUS, which kills the process). A file *replaced* by a rename
keeps serving the original: the descriptor and the mapping still hold the old inode. Arrays
already handed out cannot be protected (no mmap-based loader can): the CLI enables
`faulthandler`, so a SIGBUS there at least prints what happened.

Outputs (atomic writes) live in `weightio._outputs`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, cast

import numpy as np

from . import _private
from ._native import speedups
from .errors import CorruptFileError, InputError, WeightioError

__all__ = ["MappedFile", "PRIVATE_WINDOW", "bytes_equal", "describe_file_type", "drop_array_pages", "mapped_source",
           "writable_twin"]

_CLOSED = "the checkpoint was closed; open it again to read tensors"

# Private (writable) mappings cover whole windows of this size, aligned in the file: tensors in one
# window share one mapping (so a model of 100k tensors does not need 100k mappings, and the
# kernel's map count stays far below its limit), and no mapping is larger than the tensors it
# serves plus two windows. A multiple of every platform's mapping granularity.
PRIVATE_WINDOW = 64 << 20
assert PRIVATE_WINDOW % mmap.ALLOCATIONGRANULARITY == 0


def describe_file_type(mode: int) -> str:
    """A few words for a non-regular file type, for error messages."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def _dup_regular(fd: int, path: str) -> tuple[int, tuple[int, int, int]]:
    """A duplicate of the caller's descriptor `fd` (closing ours leaves theirs open), checked to be
    a regular file, and its `file_stamp`."""
    try:
        dup = os.dup(fd)
    except OSError as e:
        raise InputError(f"cannot use file descriptor {fd}: {e.strerror}", path=path, errno=e.errno) from e
    return dup, _regular(dup, path)


# read-only, without blocking (a FIFO would block a plain open), not inherited, binary on Windows
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _open_regular(path: str) -> tuple[int, tuple[int, int, int]]:
    """Open `path` read-only without blocking (a FIFO would block a plain open), check it is a file;
    the descriptor and its `file_stamp`."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", path=path, errno=e.errno) from e
    return fd, _regular(fd, path)


def _regular(fd: int, path: str) -> tuple[int, int, int]:
    """The `file_stamp` of `fd`, our own descriptor, when it is a regular file; else `fd` is closed
    and `InputError` says what it is (or why it could not be looked at)."""
    try:
        found = file_stamp(fd)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise InputError(f"cannot stat file: {e.strerror or e}", path=path, errno=e.errno) from e
        raise
    if not stat.S_ISREG(found[0]):
        os.close(fd)
        raise InputError(f"is {describe_file_type(found[0])}, not a checkpoint file", path=path)
    return found


def _fstat_stamp(fd: int) -> tuple[int, int, int]:
    found = os.fstat(fd)
    return found.st_mode, found.st_size, found.st_mtime_ns


# (st_mode, st_size, st_mtime_ns) of ``os.fstat(fd)``: in C where built (`weightio._speedups`), without
# the nineteen fields (three of them floats) os.fstat makes, which were most of the cost of a changed-file check.
file_stamp: Callable[[int], tuple[int, int, int]] = getattr(speedups, "file_stamp", None) or _fstat_stamp
# os.open, the file_stamp and the first bytes of a regular, non-empty file in one C call (None for
# anything else: `MappedFile` then makes those calls in Python, which say what is wrong)
_open_head: Callable[[str, int, int], tuple[int, int, int, bytes] | None] | None = getattr(speedups, "open_head", None)


class MappedFile:
    """A whole input file, mapped read-only when its bytes are first asked for.

    Attributes:
        path: the path as given (used in every error message).
        size: the file size in bytes at open time.
        data: the mapping as a read-only 1-D `uint8` array; slices of it are zero-copy views.
            Each access checks that the file has not changed since it was opened (see the
            module docstring), and raises once it is closed.
        remote: False (`weightio._remote.RemoteFile`, the same interface over byte ranges, says True).

    Opening holds the descriptor (it pins the inode) and maps nothing: the mapping is made on the
    first `data`. Listing 191 shards so holds 191 descriptors, not 382 (CPython's ``mmap`` keeps a
    duplicate): growing the descriptor table past 256 costs ~10 ms once a second thread exists.
    """

    remote = False
    HEAD = 4096  # the first bytes, read once while the header is parsed (`release_head` drops them)

    def __init__(self, path: str | os.PathLike[str], *, fd: int | None = None, head: bool = False) -> None:
        """Open `path`; or, given `fd` (an open descriptor of the caller's), use that file, `path`
        only naming it in messages: the descriptor is duplicated, so `close` leaves the caller's open.
        With `head`, the first `HEAD` bytes are read now, in one ``pread``, and reads within them
        come from that copy until `release_head`."""
        self.path = os.fspath(path)
        self._lock = threading.Lock()  # close() against a concurrent pread/fstat/map of the same descriptor
        self._closed = True  # (until a descriptor is held: `__del__` closes the one of a file dropped unclosed)
        self._head: bytes | None = None
        opened = _open_head(self.path, _OPEN_FLAGS, self.HEAD) if head and fd is None and _open_head else None
        if opened is not None:  # (the same calls as below, in C: a regular file, not empty, its first bytes read)
            self._fd, size, modified, self._head = opened
            self._closed = False
        else:
            self._fd, (_, size, modified) = _open_regular(self.path) if fd is None else _dup_regular(fd, self.path)
            self._closed = size == 0
        self.size = size
        self._stamp = (size, modified)
        if self._closed:
            os.close(self._fd)
            raise CorruptFileError("empty file (0 bytes)", path=self.path)
        if head and opened is None:  # read now, before another thread can see this file: no lock, no check per read
            try:
                self._head = self._pread_unlocked(0, min(self.size, self.HEAD), "the first bytes")
            except BaseException:
                self._closed = True
                os.close(self._fd)
                raise
        self._mmap: _FileMapping | None = None
        self._data: np.ndarray | None = None
        self._elements: dict[np.dtype, np.ndarray] = {}  # dtype -> the mapping as whole elements (`elements`)
        # what the C view (`_speedups.mapped_slice`) reads in one attribute: fixed from here on (the
        # element views' dict is the same object: changed in place only, as `close` empties it)
        self._fast = (self._fd, size, modified, self._elements)
        self._windows: weakref.WeakValueDictionary[tuple[int, int], np.ndarray] | None = None
        self._private: _private.PrivateMapping | None = None  # (Linux: `private_window`, made on first use)

    @property
    def data(self) -> np.ndarray:
        """The whole file, mapped read-only, after the changed-file check (`check`)."""
        data = self._data
        if data is None:
            data = self._map()
        self.check()
        return data

    def _map(self) -> np.ndarray:
        """Map the whole file read-only (once; after checking it has not changed since it was opened)."""
        with self._lock:
            if self._closed:
                raise WeightioError(_CLOSED, path=self.path)
            if self._data is None:
                self.check()  # mapping a truncated file would hand out pages that SIGBUS
                try:
                    mapped = _FileMapping(self._fd, 0, access=mmap.ACCESS_READ)
                except OSError as e:
                    raise InputError(f"cannot map file: {e.strerror or e}", path=self.path, errno=e.errno) from e
                # read-only memory: every view derived from it is read-only, and cannot be made writable
                data = np.frombuffer(mapped, dtype=np.uint8)
                mapped.owner = weakref.ref(self)
                mapped.address = data.__array_interface__["data"][0]
                self._mmap, self._data = mapped, data
            return self._data

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def head(self) -> bytes | None:
        """The first bytes read at open (`HEAD` of them, or the whole file), until `release_head`; else None."""
        return self._head

    def elements(self, data: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
        """`data`, when it is this file's mapping (as `data` returned it: checked), viewed as whole
        `dtype` elements from byte 0; None for any other array. Cached per dtype: a tensor at an
        offset that is a multiple of the itemsize is then one slice and one reshape of it, the
        cheapest zero-copy view numpy makes (a third of ``np.ndarray(buffer=...)``'s cost)."""
        if data is not self._data:
            return None
        typed = self._elements.get(dtype)
        if typed is None:
            typed = self._elements.setdefault(dtype, data[: len(data) - len(data) % dtype.itemsize].view(dtype))
            if self._closed:  # a `close` ran meanwhile (it sets `_closed`, then empties the cache): keep nothing
                self._elements.clear()
        return typed

    def check(self) -> None:
        """Raise `CorruptFileError` if the file changed (size or modification time) since it was opened.

        One ``fstat`` of the open descriptor (about half a microsecond): a file replaced by a
        rename is not "changed", since the descriptor still names the inode that was opened.
        Unlocked: a `close` racing with it makes it raise "closed", even when the descriptor
        number was reused meanwhile (`close` marks the file closed before closing it), and never
        return bytes of another file.
        """
        try:
            now = file_stamp(self._fd)
        except OSError:  # closed (EBADF) under us
            now = None
        if now is None or self._closed or now[1:] != self._stamp:
            self._refuse(now)

    def _refuse(self, now: tuple[int, int, int] | None) -> NoReturn:
        """The error of a failed `check`: "closed" when the file was closed (or `now` is None: the
        ``fstat`` failed), else the change."""
        if now is None or self._closed:
            raise WeightioError(_CLOSED, path=self.path)
        raise CorruptFileError(_changed(self._stamp, now[1:]), path=self.path)

    def _same(self, now: tuple[int, int, int]) -> None:
        """`CorruptFileError` unless `now` (a `file_stamp` of this file) has the size and mtime seen at open."""
        if now[1:] != self._stamp:
            raise CorruptFileError(_changed(self._stamp, now[1:]), path=self.path)

    def read(self, offset: int, length: int, what: str) -> bytes:
        """`length` bytes at `offset`; `CorruptFileError` naming `what` if the file is shorter.

        Headers are read with ``pread`` rather than through the mapping: touching the mapping
        would fault in (and count in RSS) whole blocks of tensor data around each header. A
        ``pread`` cannot crash on a truncated file (it comes back short, which is an error here),
        so unlike `data` it does not ``fstat`` first: opening a zip checkpoint reads one local
        header per tensor, and readers check the file again when they hand out the mapping.
        Opened with ``head=True``, reads within the first `HEAD` bytes come from the copy read at
        open until `release_head` (while a reader parses its header).
        """
        head = self._head
        if head is not None and 0 <= offset and 0 <= length and offset + length <= len(head):
            return head[offset : offset + length]  # (the first bytes of the file as opened: within it)
        self._within(offset, length, what)
        return self._pread(offset, length, what)

    def read_each(self, spans: list[tuple[int, int]], what: str) -> list[bytes]:
        """`read` of every ``(offset, length)`` in `spans`, each with its own ``pread`` (never from the
        first `HEAD` bytes kept while a header is parsed), under one lock: a zip checkpoint of large
        tensors has a local header every few megabytes, and the Python around each read was half its cost."""
        for offset, length in spans:
            self._within(offset, length, what)
        with self._lock:
            if self._closed:
                raise WeightioError(_CLOSED, path=self.path)
            return [self._pread_unlocked(offset, length, what) for offset, length in spans]

    def _pread(self, offset: int, length: int, what: str) -> bytes:
        if not length:
            return b""
        with self._lock:  # the descriptor stays open (and ours) until the bytes are in
            if self._closed:
                raise WeightioError(_CLOSED, path=self.path)
            return self._pread_unlocked(offset, length, what)

    def _pread_unlocked(self, offset: int, length: int, what: str) -> bytes:
        try:
            data = os.pread(self._fd, length, offset)
            while len(data) < length:  # (a pread may come back short: read on from there)
                more = os.pread(self._fd, length - len(data), offset + len(data))
                if not more:
                    raise CorruptFileError(f"file shrank while reading {what} (now ends at {offset + len(data)})",
                                           path=self.path)
                data += more
        except OSError as e:
            raise InputError(f"cannot read {what}: {e.strerror or e}", path=self.path, errno=e.errno) from e
        return data

    def release_head(self) -> None:
        """Forget the first bytes kept for header parsing (readers call this once they are open)."""
        self._head = None

    def ensure(self, offset: int, length: int, what: str) -> None:
        """Make bytes `offset`..`offset + length` of `data` readable: a mapped file's all are (a
        `weightio._remote.RemoteFile` fetches them); `CorruptFileError` naming `what` past the end."""
        self._within(offset, length, what)

    def _within(self, offset: int, length: int, what: str) -> None:
        """`CorruptFileError` naming `what` unless bytes `offset`..`offset + length` lie in the file."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise CorruptFileError(
                f"{what} needs bytes {offset}..{offset + length} but the file has {self.size}", path=self.path
            )

    def region(self, offset: int, length: int, what: str = "the bytes asked for") -> np.ndarray:
        """Bytes `offset`..`offset + length` as a read-only array: a zero-copy slice of `data` here
        (a remote file fetches them into memory of their own)."""
        self.ensure(offset, length, what)
        return self.data[offset : offset + length]

    def unpack(self, fmt: struct.Struct, offset: int, what: str) -> tuple:
        """`fmt.unpack` of the bytes at `offset`, bounds-checked first."""
        if offset < 0 or offset + fmt.size > self.size:
            raise CorruptFileError(
                f"file ends inside {what} (needs {fmt.size} bytes at offset {offset}, file has {self.size})",
                path=self.path,
            )
        return fmt.unpack(self.read(offset, fmt.size, what))

    def private_window(self, start: int, stop: int) -> tuple[np.ndarray, int]:
        """Writable private (copy-on-write) memory holding bytes `start`..`stop` of the file.

        Returns a writable ``uint8`` array over private (``MAP_PRIVATE``) memory of the
        `PRIVATE_WINDOW` windows those bytes fall in, and the file offset of its first byte: on
        Linux, those windows of the file's one private mapping, made writable while an array over
        them lives (`weightio._private`); elsewhere a mapping of them. Both are shared while alive
        (a second tensor in the same windows gets the same memory); writes go to this process's
        copies of the touched pages, never to the file or the read-only mapping.

        Raises:
            CorruptFileError: the file changed since it was opened (mapping it now could SIGBUS).
            WeightioError: closed.
            InputError: the kernel refused the mapping (strict overcommit, out of address space).
        """
        first, last = start // PRIVATE_WINDOW, max(start, stop - 1) // PRIVATE_WINDOW
        offset = first * PRIVATE_WINDOW
        with self._lock:  # the descriptor stays open (and ours) while it is mapped
            if self._closed:
                raise WeightioError(_CLOSED, path=self.path)
            if _private.available():  # (Linux: one private mapping of the file, its windows made writable)
                return self._span(first, last), offset
            if self._windows is None:
                self._windows = weakref.WeakValueDictionary()
            window = self._windows.get((first, last))
            if window is None:
                self.check()  # (a window already mapped was mapped after the same check)
                length = min((last + 1) * PRIVATE_WINDOW, self.size) - offset
                try:
                    mapped = mmap.mmap(self._fd, length, access=mmap.ACCESS_COPY, offset=offset)
                except OSError as e:
                    raise InputError(f"cannot map bytes {offset}..{offset + length} copy-on-write for a writable "
                                     f"(zero-copy torch) tensor: {e.strerror or e}; the kernel commits memory for "
                                     "writable mappings: read it as numpy (read-only), or in slices",
                                     path=self.path, errno=e.errno) from e
                window = self._windows[first, last] = np.frombuffer(mapped, dtype=np.uint8)
        return window, offset

    def _span(self, first: int, last: int) -> np.ndarray:
        """`private_window` on Linux (`weightio._private`; the lock held): windows `first`..`last` of
        the file's one private mapping, made writable."""
        private = self._private
        span = None if private is None else private.cached(first, last)
        if span is not None:
            return span
        self.check()  # (a span alive was made after the same check)
        low, high = first * PRIVATE_WINDOW, min((last + 1) * PRIVATE_WINDOW, self.size)
        try:
            if private is None:
                private = self._private = _private.PrivateMapping(self._fd, self.size, PRIVATE_WINDOW)
            return private.span(first, last)
        except OSError as e:
            raise InputError(f"cannot map bytes {low}..{high} copy-on-write for a writable (zero-copy torch) tensor: "
                             f"{e.strerror or e}; the kernel commits memory for writable mappings: read it as numpy "
                             "(read-only), or in slices", path=self.path, errno=e.errno) from e

    @contextlib.contextmanager
    def descriptor(self) -> Iterator[int]:
        """A duplicate of the open descriptor, for ``pread`` on several threads at once (`read` takes
        a lock per call): closing the checkpoint meanwhile leaves it open. The file is checked
        (`check`) before it is handed out and again when the block ends without error, so bytes read
        while the file was truncated or rewritten are never passed on as good."""
        with self._lock:
            self.check()
            fd = os.dup(self._fd)
        try:
            yield fd
            self._same(file_stamp(fd))  # (the checkpoint, and its own descriptor, may have been closed meanwhile)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop this reader's hold on the file and its mapping.

        The mapping is unmapped now when no numpy view of it is alive; otherwise it stays mapped
        until the last view is garbage-collected (unmapping under a live view would crash).
        Safe to call twice, and from another thread while one reads: that read either completes
        or raises "closed".
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._data, self._head = None, None
            self._elements.clear()  # (each holds the mapping: it unmaps once the views handed out are gone)
            if self._windows is not None:
                self._windows.clear()  # private windows live on with the tensors over them
            self._private = None  # (as does the private mapping, with its own descriptor)
            mm, self._mmap = self._mmap, None
            os.close(self._fd)
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def __del__(self, _close: Any = os.close) -> None:
        """A file dropped without `close` gives its descriptor back (as Python's own files do), so
        opening checkpoints in a loop without closing them cannot run out of descriptors. Its
        mapping, if any, lives on with the views over it and is unmapped by the last one."""
        if getattr(self, "_closed", True):  # (closed, or an `__init__` that failed before it held a descriptor)
            return
        with self._lock:  # (a weak reference may still hand this object to another thread while this runs)
            if not self._closed:
                self._closed = True
                _close(self._fd)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refused: a copy would share the descriptor, and closing one would close the other's
        (or, once the number is reused, another file's)."""
        raise TypeError(f"a {type(self).__name__} cannot be copied or pickled; open the file again")


class _FileMapping(mmap.mmap):
    """The read-only mapping of a whole file, which knows its `MappedFile` (weakly) and its address,
    so that an array found to be a view of it can be given private memory (`writable_twin`)."""

    owner: weakref.ref[MappedFile]
    address: int


def _mapping_of(arr: object) -> _FileMapping | None:
    """The read-only file mapping `arr`'s memory belongs to, or None: its chain of bases walked
    through arrays, memoryviews, and the objects that only lend an array interface over another's
    memory and keep that other as their ``base`` (numpy's ``as_strided`` and ``broadcast_to``
    make one: a view made through them must be known as the file's too, or a writable torch
    tensor over it would be the read-only mapping itself, and a write to it SIGSEGV)."""
    found: object = arr
    for _ in range(1_000_000):  # (a bound: a chain is never this long)
        if isinstance(found, np.ndarray):
            found = found.base
        elif isinstance(found, memoryview):
            found = found.obj
        elif isinstance(found, _FileMapping):
            return found
        elif found is not None and hasattr(found, "__array_interface__"):
            found = getattr(found, "base", None)
        else:
            return None
    return None


def mapped_source(arr: np.ndarray) -> tuple[MappedFile, int] | None:
    """The open file whose read-only mapping holds `arr`'s memory, and the file offset of its
    element 0; None for any other array, or a view of a file whose checkpoint was closed."""
    found = _file_root(arr)
    if found is None:
        return None
    mapping, address = found
    file = mapping.owner()
    return None if file is None or file.closed else (file, address - mapping.address)


def _file_root(arr: np.ndarray) -> tuple[_FileMapping, int] | None:
    """The read-only file mapping `arr`'s memory belongs to and the address of `arr`'s element 0;
    None for any other array."""
    if _array_root is not None:  # in C: what a fill asks of every source (~0.3 us a call against ~2.7)
        found = _array_root(arr)  # (root, address): the root may be anything
        if found is None:
            return None
        if isinstance(found[0], _FileMapping):
            return cast("tuple[_FileMapping, int]", found)
        if not hasattr(found[0], "__array_interface__"):  # (memory of anything else: None when an array owns it)
            return None
        mapping = _mapping_of(found[0])  # an array interface lent over another's memory: walked on in Python
        return None if mapping is None else (mapping, found[1])
    mapping = _mapping_of(arr)
    return None if mapping is None else (mapping, arr.__array_interface__["data"][0])


# (root of its chain of bases, address of element 0) of an array: `mapped_source`'s walk in C, where built
_array_root: Callable[[np.ndarray], tuple[object, int] | None] | None = getattr(speedups, "array_root", None)


def writable_twin(arr: np.ndarray) -> np.ndarray | None:
    """The same elements as `arr`, in writable memory, if `arr` is a view of a file's read-only mapping.

    The twin has `arr`'s dtype, shape and strides over a private copy-on-write mapping of the file
    (`MappedFile.private_window`): no bytes are copied until written, and writes never reach the
    file, the read-only mapping or anything else mapped from it. A view of a file whose checkpoint
    was closed gets a copy. None for any other array (whatever memory it has is the caller's own).

    Raises:
        CorruptFileError: the file changed since it was opened.
        InputError: the kernel refused the private mapping.
    """
    found = _file_root(arr)
    if found is None:
        return None
    mapping, address = found
    file = mapping.owner()
    if file is None or file.closed:
        return np.array(arr, copy=True)
    if arr.size == 0:
        return np.empty(arr.shape, arr.dtype)
    first = address - mapping.address  # the element at index 0
    if arr.flags.c_contiguous:
        low, high = first, first + arr.nbytes
    else:
        low = first + sum(s * (n - 1) for s, n in zip(arr.strides, arr.shape, strict=True) if s < 0)
        high = first + sum(s * (n - 1) for s, n in zip(arr.strides, arr.shape, strict=True) if s > 0) + arr.itemsize
    window, offset = file.private_window(low, high)
    return np.ndarray(arr.shape, arr.dtype, buffer=window, offset=first - offset, strides=arr.strides)


def _changed(opened: tuple[int, int], now: tuple[int, int]) -> str:
    """What happened to a file since it was opened, and what to do about it."""
    size, new_size = opened[0], now[0]
    if new_size < size:
        what = (f"was truncated from {size} to {new_size} bytes since it was opened; reading its lost pages would "
                "crash the process (SIGBUS)")
    elif new_size > size:
        what = f"grew from {size} to {new_size} bytes since it was opened"
    else:
        what = "was rewritten in place since it was opened (same size, new modification time)"
    return f"{what}: its bytes are no longer the ones that were validated. Open it again"


def drop_array_pages(data: np.ndarray) -> None:
    """Tell the kernel this process no longer needs the mapped pages under `data` (a no-op unless
    `data` is a view of a file's read-only mapping).

    The pages stay in the page cache (a later read is a cheap minor fault) but leave this
    process's resident set: what keeps a streaming conversion's peak RSS at one tensor.
    """
    root = data
    while isinstance(root.base, np.ndarray):
        root = root.base
    mapping = root.base.obj if isinstance(root.base, memoryview) else root.base  # np.frombuffer keeps a memoryview
    # only a file's read-only mapping: on a private one, dropping written pages would lose the writes
    if not isinstance(mapping, _FileMapping) or not hasattr(mapping, "madvise") or data.nbytes == 0:
        return
    start = data.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    lo = start - start % mmap.PAGESIZE
    hi = min(start + data.nbytes + (-(start + data.nbytes)) % mmap.PAGESIZE, len(mapping))
    with contextlib.suppress(ValueError, OSError):  # a closed mapping; madvise refused: only a hint
        mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


_COMPARE_CHUNK = 16 << 20


def bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte-for-byte equality, compared in bounded chunks (no temporary the size of the tensor)."""
    return a.nbytes == b.nbytes and all(np.array_equal(a[i:i + _COMPARE_CHUNK], b[i:i + _COMPARE_CHUNK])
                                        for i in range(0, a.nbytes, _COMPARE_CHUNK))
