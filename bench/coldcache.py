"""Helpers of bench/memory.py that are checked by tests: a cold page cache, and memory shared between processes.

- `evict(path)`: the file's pages out of the page cache (``fsync``, then
  ``posix_fadvise(POSIX_FADV_DONTNEED)``: clean pages that no process maps are dropped);
  `resident(path)` says what fraction is still cached (``mincore`` on a read-only mapping, which
  itself reads nothing), so every cold run can prove it started cold.
- `free_page_reporting()`: whether this machine is a VM that hands its free memory back to its
  host (virtio-balloon free page reporting); there, memory given out again is backed anew, at the
  host's cost, and a cold run depends on what the run before it freed.
- `pss_kib(pid)`: a process's proportional set size (``Pss:`` of ``/proc/PID/smaps_rollup``):
  each page it maps counted divided by the number of processes mapping it, so the PSS of a group
  of processes sums to the memory they take together, shared page-cache pages counted once.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

__all__ = ["evict", "free_page_reporting", "pss_kib", "resident"]

_BALLOON = "/sys/bus/virtio/drivers/virtio_balloon"
_REPORTING = 5  # VIRTIO_BALLOON_F_REPORTING: the guest reports free memory, which the host takes back


def evict(path: str | os.PathLike[str]) -> None:
    """Drop `path`'s pages from the page cache (Linux; pages mapped by a live process may stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(path: str | os.PathLike[str]) -> float:
    """The fraction of `path`'s pages in the page cache now (0.0 to 1.0), by ``mincore``."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    pages = -(-size // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mapped:
        view = np.frombuffer(mapped, np.uint8)  # (ctypes gives no address of a read-only buffer)
        found = libc.mincore(view.__array_interface__["data"][0], size, vector)
        del view  # before the mapping closes
        if found != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
    return int(np.count_nonzero(np.frombuffer(vector, np.uint8) & 1)) / pages


def pss_kib(pid: int) -> int:
    """Proportional set size of process `pid`, in KiB (Linux ``/proc/PID/smaps_rollup``)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def free_page_reporting(root: str = _BALLOON) -> bool | None:
    """Whether a virtio balloon device here reports free memory to the host (its feature bit
    ``VIRTIO_BALLOON_F_REPORTING``, in ``features``: one character per bit, bit 0 first); None
    where there is no such device."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return None
    found = None
    for name in devices:
        try:
            with open(os.path.join(root, name, "features")) as f:
                bits = f.read().strip()
        except OSError:
            continue
        found = bool(found) or bits[_REPORTING:_REPORTING + 1] == "1"
    return found
