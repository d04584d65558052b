"""File access shared by every format: one read-only mapping per input, atomic outputs.

Inputs are mapped once (`mmap.ACCESS_READ`) and exposed as one `uint8` numpy array; every
tensor view is a slice of that array, so the mapping is exported to numpy exactly once and
stays mapped for as long as any view lives (closing never unmaps under a live view).

Outputs are written to a temporary file beside the target, fsynced, then renamed over it,
and the directory fsynced: a crash or error leaves either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from typing import IO, BinaryIO

import numpy as np

from .errors import CorruptFileError, InputError, WeightioError, WriteError

__all__ = ["MappedFile", "atomic_write", "check_destination", "describe_file_type", "write_all"]


def describe_file_type(mode: int) -> str:
    """A few words for a non-regular file type, for error messages."""
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def _open_regular(path: str) -> int:
    """Open `path` read-only without blocking (a FIFO would block a plain open) and check it is a file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", path=path, errno=e.errno) from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputError(f"is {describe_file_type(mode)}, not a checkpoint file", path=path)
    return fd


class MappedFile:
    """A whole input file mapped read-only.

    Attributes:
        path: the path as given (used in every error message).
        size: the file size in bytes at open time.
        data: the mapping as a read-only 1-D `uint8` array; slices of it are zero-copy views.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd = _open_regular(self.path)
        try:
            self.size = os.fstat(self._fd).st_size
            if self.size == 0:
                raise CorruptFileError("empty file (0 bytes)", path=self.path)
            self._mmap: mmap.mmap | None = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        except BaseException as e:
            os.close(self._fd)
            if isinstance(e, OSError):
                raise InputError(f"cannot map file: {e.strerror or e}", path=self.path, errno=e.errno) from e
            raise
        self._data: np.ndarray | None = np.frombuffer(self._mmap, dtype=np.uint8)

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            raise WeightioError("the checkpoint was closed; open it again to read tensors", path=self.path)
        return self._data

    @property
    def closed(self) -> bool:
        return self._data is None

    def read(self, offset: int, length: int, what: str) -> bytes:
        """`length` bytes at `offset`; `CorruptFileError` naming `what` if the file is shorter.

        Headers are read with ``pread`` rather than through the mapping: touching the mapping
        would fault in (and count in RSS) whole blocks of tensor data around each header.
        """
        if offset < 0 or length < 0 or offset + length > self.size:
            raise CorruptFileError(
                f"{what} needs bytes {offset}..{offset + length} but the file has {self.size}", path=self.path
            )
        if self._mmap is None:
            raise WeightioError("the checkpoint was closed; open it again to read tensors", path=self.path)
        chunks, done = [], 0
        while done < length:
            chunk = os.pread(self._fd, length - done, offset + done)
            if not chunk:
                raise CorruptFileError(f"file shrank while reading {what} (now ends at {offset + done})",
                                       path=self.path)
            chunks.append(chunk)
            done += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def unpack(self, fmt: struct.Struct, offset: int, what: str) -> tuple:
        """`fmt.unpack` of the bytes at `offset`, bounds-checked first."""
        if offset < 0 or offset + fmt.size > self.size:
            raise CorruptFileError(
                f"file ends inside {what} (needs {fmt.size} bytes at offset {offset}, file has {self.size})",
                path=self.path,
            )
        return fmt.unpack(self.read(offset, fmt.size, what))

    def close(self) -> None:
        """Drop this reader's hold on the mapping.

        The mapping is unmapped now when no numpy view of it is alive; otherwise it stays mapped
        until the last view is garbage-collected (unmapping under a live view would crash).
        """
        self._data = None
        mm, self._mmap = self._mmap, None
        if mm is not None:
            os.close(self._fd)
            with contextlib.suppress(BufferError):
                mm.close()


# ----------------------------------------------------------------------------- outputs


def _fsync_dir(directory: str) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems (e.g. certain FUSE mounts) refuse directory fsync
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_destination(path: str, overwrite: bool) -> None:
    """Refuse a destination that exists (unless `overwrite`) or is a directory."""
    if os.path.isdir(path):
        raise WriteError("is a directory; give a file name", path=path, errno=errno.EISDIR)
    if os.path.lexists(path) and not overwrite:
        raise WriteError("already exists; pass overwrite=True (CLI: --force) to replace it", path=path,
                         errno=errno.EEXIST)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[BinaryIO]:
    """Write `path` all at once or not at all.

    Yields a binary file open on a temporary file in the same directory. On normal exit the
    data is fsynced, the file renamed over `path` and the directory fsynced; on any exception
    (KeyboardInterrupt included) the temporary file is removed and `path` is left untouched.
    OS errors (disk full, file too large, read-only) become `WriteError` with the errno.

    Example:
        >>> with atomic_write(tmp / "x.bin") as f:   # doctest: +SKIP
        ...     f.write(b"payload")
    """
    import tempfile  # (with shutil, random, bz2, lzma…) only when writing: keeps `import weightio` cheap

    path = os.fspath(path)
    check_destination(path, overwrite)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                                   suffix=".weightio-tmp")
    except OSError as e:
        raise WriteError(f"cannot create a file in {directory}: {e.strerror}", path=path, errno=e.errno) from e
    try:
        os.fchmod(fd, 0o666 & ~_umask()) if hasattr(os, "fchmod") else None  # mkstemp makes 0600
        with os.fdopen(fd, "wb", buffering=0) as raw:
            yield raw  # type: ignore[misc]
            raw.flush()
            os.fsync(raw.fileno())
        if not overwrite and os.path.lexists(path):  # someone created it while we wrote
            raise WriteError("appeared while writing; not replaced", path=path, errno=errno.EEXIST)
        os.replace(tmp, path)
        _fsync_dir(directory)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, WeightioError):
            raise WriteError(f"write failed: {e.strerror or e}", path=path, errno=e.errno) from e
        raise


def write_all(out: IO[bytes], data: np.ndarray | bytes | memoryview, chunk: int = 64 << 20) -> int:
    """Write an array's (or buffer's) bytes in bounded chunks, looping on short writes.

    Arrays are written in C order; any dtype works, ml_dtypes ones included.
    """
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    view = memoryview(data).cast("B")
    total = len(view)
    pos = 0
    while pos < total:
        n = out.write(view[pos : pos + chunk])
        if not n:
            raise OSError(errno.EIO, "short write")
        pos += n
    return total
