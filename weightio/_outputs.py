"""Outputs, written atomically: no reader ever sees half a file.

Outputs are written to a temporary file beside the target (``.<name>.<random>.weightio-tmp``),
locked (``flock``) while it is written, fsynced, then renamed over the target while still
locked, and the directory fsynced: a crash or error leaves either the old file or the new one,
plus at worst a temporary that `remove_stale_temporaries` can prove dead (no process holds its
lock) and delete.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ._native import libc
from ._threads import shared_pool
from .errors import OVERWRITE_ADVICE, PARENTS_ADVICE, WeightioError, WriteError

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["TEMP_SUFFIX", "atomic_write", "check_destination", "check_parent", "fsync_directory", "lock_temporary",
           "remove_stale_temporaries", "write_all"]

TEMP_SUFFIX = ".weightio-tmp"


def fsync_directory(directory: str) -> None:
    """Make renames in `directory` durable (a no-op where directories cannot be fsynced)."""
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
        raise WriteError("already exists", path=path, errno=errno.EEXIST, advice=OVERWRITE_ADVICE)


def check_parent(dst: str, *, is_directory: bool = False, parents: bool = False) -> None:
    """Unless `parents` (the caller will create missing parents: ``parents=True``, ``--parents``),
    refuse an output whose directory does not exist, naming it; a directory `dst` itself may be new."""
    directory = os.path.dirname(dst.rstrip("/" + os.sep) if is_directory else dst)
    if parents or not directory or os.path.isdir(directory):
        return
    if os.path.exists(directory):
        raise WriteError(f"cannot write into {directory}: not a directory", path=dst, errno=errno.ENOTDIR)
    raise WriteError(f"the directory {directory} does not exist", path=dst, errno=errno.ENOENT,
                     advice=PARENTS_ADVICE)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[BinaryIO]:
    """Write `path` all at once or not at all.

    Yields a binary file open on a temporary file in the same directory
    (``.<name>.<random>.weightio-tmp``), locked for as long as it exists under that name. On
    normal exit the data is fsynced, the file renamed over `path` and the directory fsynced; on
    any exception (KeyboardInterrupt included) the temporary file is removed and `path` is left
    untouched. OS errors (disk full, file too large, read-only) become `WriteError` with the
    errno. If the process is killed, the temporary stays behind, unlocked:
    `remove_stale_temporaries` deletes it.

    Example:
        >>> with atomic_write(tmp / "x.bin") as f:   # doctest: +SKIP
        ...     f.write(b"payload")
    """
    import tempfile  # (with shutil, random, bz2, lzma…) only when writing: keeps `import weightio` cheap

    path = os.fspath(path)
    check_destination(path, overwrite)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=TEMP_SUFFIX)
    except OSError as e:
        raise WriteError(f"cannot create a file in {directory}: {e.strerror}", path=path, errno=e.errno) from e
    try:
        os.fchmod(fd, 0o666 & ~_umask()) if hasattr(os, "fchmod") else None  # mkstemp makes 0600
        _hold(fd, tmp, path)
        # buffered: its write() writes everything or raises, where a raw file's may write part (a
        # full disk) and return the count, which every writer would have to check
        with _WritingBack(io.FileIO(fd, "wb")) as raw:
            yield raw
            raw.flush()
            os.fsync(raw.fileno())
            if not overwrite and os.path.lexists(path):  # someone created it while we wrote
                raise WriteError("appeared while writing; not replaced", path=path, errno=errno.EEXIST)
            if os.name != "nt":  # renamed while still open, so still locked: never a complete, unlocked temporary
                os.replace(tmp, path)
        if os.name == "nt":  # Windows cannot rename an open file (and has no flock to release)
            os.replace(tmp, path)
        fsync_directory(directory)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, WeightioError):
            raise WriteError(f"write failed: {e.strerror or e}", path=path, errno=e.errno) from e
        raise


WRITEBACK_STEP = 32 << 20  # bytes written between two starts of their writes to the disk
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h
_SYNC_FILE_RANGE: Any = None


class _WritingBack(io.BufferedWriter):
    """A buffered file that has the kernel start writing its bytes to the disk as they come, every
    `WRITEBACK_STEP` bytes (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, on a thread of its own:
    the writes are queued, nothing waits for them).

    Otherwise an output smaller than the kernel's dirty-memory threshold (a tenth of the free
    memory) stays in the page cache until the `fsync` that commits it, which then writes all of it
    while nothing else happens: converting a 1.1 GB file took 0.85 s of writes and 2.06 s of
    `fsync`, one after the other. Started early, the disk writes overlap the rest of the work and
    the `fsync` waits for the last step's. `weightio convert` of a safetensors file, alternating
    fresh processes on a 2-CPU VM whose disk wrote at 0.3-1.1 GB/s: 1.1 GB, 3.1-3.7 s (median 3.3,
    13 runs) before; 2.7-3.8 s (3.15, 13) with the starts on the writing thread, where each waited
    while the disk's queue was full (8 ms a start); 2.5-4.4 s (2.8, 6) on a thread of their own,
    against 3.0-3.7 s (3.2) on the writing thread in the same alternation. 3.2 GB: 8.3-9.3 s (8.5, 8)
    before, 5.4-26.5 s (6.1, 12) on their own thread against 5.8-9.8 s (7.2, 8) on the writing
    thread (one 26.5 s run, not seen again in 4 more). The three in turn, 1.1 GB, 6 alternations:
    none 3.77 s, on the writing thread 3.55 s, on their own 3.34 s.
    """

    def __init__(self, raw: io.FileIO) -> None:
        self._unsent = 0  # bytes written since the disk writes were last started
        self._sent = 0  # the offset up to which they were
        self._queued: list[tuple[Future, int]] = []  # starts sent to the writeback thread, their descriptors
        blksize = os.fstat(raw.fileno()).st_blksize  # (the buffer `open` would give the file)
        super().__init__(raw, blksize if blksize > 1 else io.DEFAULT_BUFFER_SIZE)

    def write(self, data: Any) -> int:
        n = super().write(data)
        self._unsent += n
        if self._unsent >= WRITEBACK_STEP and _sync_file_range() is not None:
            self._unsent = 0
            self.flush()
            end = self.tell()  # (less than `_sent` while a writer patches bytes behind it: nothing sent)
            if end > self._sent:
                self._send(self._sent, end - self._sent)
                self._sent = end
        return n

    def _send(self, offset: int, length: int) -> None:
        """`_start_writeback` of a stretch on a thread of its own, through a duplicate of the descriptor
        that the task closes: the call waits while the disk's queue is full (8 ms a call, 0.27 s of a
        1.1 GB convert), which the writes need not, and closing the file never waits for it."""
        self._queued = [(future, fd) for future, fd in self._queued if not future.done()]
        try:
            fd = os.dup(self.fileno())
        except OSError:  # (no descriptor left: the hint is skipped, the fsync writes the stretch)
            return
        try:
            self._queued.append((shared_pool("writeback", 1).submit(_write_back, fd, offset, length), fd))
        except RuntimeError:  # (the interpreter is shutting down: the pool takes no more work)
            _write_back(fd, offset, length)

    def close(self) -> None:
        """Close the file, and the descriptors of the starts of its disk writes not begun (dropped: the
        file is fsynced, or abandoned, by now); one running closes its own when it ends."""
        queued, self._queued = self._queued, []
        for future, fd in queued:
            if future.cancel():
                os.close(fd)
        super().close()


def _write_back(fd: int, offset: int, length: int) -> None:
    """`_start_writeback`, then close `fd` (a duplicate made for the call)."""
    try:
        _start_writeback(fd, offset, length)
    finally:
        os.close(fd)


def _start_writeback(fd: int, offset: int, length: int) -> bool:
    """Queue the disk writes of a stretch of `fd`'s dirty pages; False where it cannot be asked or
    the kernel refuses (a descriptor that is not a file's, a sandbox without the call)."""
    call = _sync_file_range()
    return call is not None and call(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0


def _sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), found on first use; None elsewhere."""
    global _SYNC_FILE_RANGE
    if _SYNC_FILE_RANGE is None:
        _SYNC_FILE_RANGE = False
        if sys.platform.startswith("linux"):
            import ctypes

            typed = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)  # fd, offset, length, flags
            _SYNC_FILE_RANGE = libc("sync_file_range", *typed) or False
    return _SYNC_FILE_RANGE or None


def _hold(fd: int, tmp: str, path: str) -> None:
    """Lock a new temporary (``flock``, exclusive) for as long as `fd` is open.

    The lock is how `remove_stale_temporaries` tells a temporary being written from one a
    killed writer left: the kernel releases it when its holder exits, however it exits. A
    cleaner may have taken the lock in the instant between creating the file and locking it:
    then the name no longer leads to our file, and the write is refused rather than lost.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock; temporaries there are never cleaned automatically
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        ours = os.stat(tmp).st_ino == os.fstat(fd).st_ino
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            return  # a filesystem without locks: its temporaries are never cleaned automatically
        ours = False
    if not ours:
        raise WriteError("a concurrent cleanup removed the temporary file; write again", path=path,
                         errno=errno.EAGAIN)


def lock_temporary(path: str) -> int | None:
    """Lock an existing weightio temporary (a complete staged output) for as long as the returned
    descriptor is open; None where the file cannot be opened (the caller's later rename will say)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        _hold(fd, path, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_stale_temporaries(destination: str | os.PathLike[str]) -> list[str]:
    """Delete the temporaries that killed writes of `destination` left behind; return their paths.

    Candidates are the files beside `destination` named like weightio's temporaries for it
    (``.<name>….weightio-tmp``, ``..<name>….weightio-tmp`` for the staged files of
    `weightio.convert`, where <name> starts with the destination's name without its suffix, so
    shards and the index count too), or for a directory destination every ``.*.weightio-tmp``
    in it. A candidate is deleted only when this process can take its lock: every weightio
    writer holds that lock until its temporary is renamed or removed, and the kernel releases it
    when a writer dies, so a lock that can be taken proves the file is garbage. Files on
    filesystems without ``flock`` (and on Windows) are never deleted. Nothing else is touched.
    """
    destination = os.fspath(destination)
    if os.path.isdir(destination) or destination.endswith(("/", os.sep)):
        directory, stem = destination, ""
    else:
        directory, name = os.path.split(os.path.abspath(destination))
        stem = os.path.splitext(name)[0]
    try:
        names = [n for n in os.listdir(directory) if _is_temporary_of(n, stem)]
    except OSError:
        return []
    return [path for path in (os.path.join(directory, n) for n in sorted(names)) if _remove_if_dead(path)]


def _is_temporary_of(name: str, stem: str) -> bool:
    """``.<stem>….weightio-tmp`` (atomic_write) or ``..<stem>….weightio-tmp`` (a staged file's)."""
    bare = name.lstrip(".")
    return name.endswith(TEMP_SUFFIX) and 1 <= len(name) - len(bare) <= 2 and bare.startswith(stem.lstrip("."))


def _remove_if_dead(path: str) -> bool:
    """Unlink `path` if its lock can be taken (its writer is gone) and it is still the file we locked."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or os.stat(path, follow_symlinks=False).st_ino != opened.st_ino:
            return False
        os.unlink(path)
        return True
    except OSError:  # locked by a live writer, already gone, or no locks on this filesystem
        return False
    finally:
        os.close(fd)


def write_all(out: IO[bytes], data: np.ndarray | bytes | memoryview, chunk: int = 64 << 20) -> int:
    """Write an array's (or buffer's) bytes in bounded chunks, looping on short writes.

    Arrays are written in C order; any dtype works, ml_dtypes ones included.
    """
    if isinstance(data, np.ndarray):
        # its buffer as a memoryview: numpy's stubs declare ndarray a Buffer only for Python >= 3.12
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    view = memoryview(data).cast("B")
    total = len(view)
    pos = 0
    while pos < total:
        n = out.write(view[pos : pos + chunk])
        if not n:
            raise OSError(errno.EIO, "short write")
        pos += n
    return total


