"""Fresh memory faulted in one call: what a destination that is about to be written whole wants.

`populate` asks the kernel to fault in (for writing) every whole page under an array at once
(Linux 5.14+ ``madvise(MADV_POPULATE_WRITE)``), instead of one page fault per 4 KiB during the
writes that follow: measured here, about 2x less time than faulting during a copy. `fresh` is
``numpy.empty`` populated. Elsewhere, or where the kernel refuses, both are plain: the first
writes fault the pages.

`handed_over` marks new memory made for one read of a tensor (a dequantized tensor, a remote
fetch, a byte-swapped copy), read-only as every array weightio hands out, as that read's alone:
`writable_if_handed` then gives one zero-copy torch tensor made from that read a writable array
over it, where memory a reader shares between its views (an inflated member, a pickled array's
bytes) is copied instead. Only once, and only for a read made inside the load (`withhold` takes
back an array a caller passes in: it holds it, read-only, and must never see a tensor's writes).

`heap_for_temporaries` keeps the temporaries of a loop of numpy calls (a dequantization's
kernels, chunk after chunk) in glibc's heap, where they are reused, instead of fresh pages for
each chunk.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

import numpy as np

from ._native import libc

__all__ = ["fresh", "handed_over", "heap_for_temporaries", "populate", "withhold", "writable_if_handed"]

_PAGE = 4096
_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+)
_MADVISE: Any = None
TEMPORARIES = 16 << 20  # more than any temporary of a (de)quantization chunk (`heap_for_temporaries`)
_heap_set = False


# id -> an array whose memory was made for one caller alone, while it lives (`handed_over`)
_HANDED: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def handed_over(arr: np.ndarray) -> np.ndarray:
    """`arr`, its memory recorded as new and the caller's alone (see the module docstring): only
    for memory nothing else holds or will be given (never a reader's cache). Returns `arr`."""
    root = _owner(arr)
    if root.flags.owndata:  # (memory numpy allocated for it: made here, not lent by another object)
        _HANDED[id(root)] = root
    return arr


def writable_if_handed(arr: np.ndarray) -> np.ndarray | None:
    """A writable array of `arr`'s elements over the same memory when that memory was handed over
    (`handed_over`) and not yet taken: the read's own, so a write through it reaches nothing
    another holds. Taken by this call (a second asks in vain). None for any other memory."""
    root = _owner(arr)
    if _HANDED.pop(id(root), None) is not root:  # (an id is never reused while its array lives)
        return None
    root.flags.writeable = True  # (it owns its memory: allowed)
    offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    writable = np.ndarray(arr.shape, arr.dtype, buffer=root, offset=offset, strides=arr.strides)
    root.flags.writeable = False  # (the array handed out may be the root itself: read-only as it was)
    return writable


def withhold(arr: np.ndarray) -> None:
    """Take back the handover of `arr`'s memory (`handed_over`), if any: an array a caller passes
    in is theirs to keep reading, and no tensor of it may write to it."""
    root = _owner(arr)
    if _HANDED.get(id(root)) is root:
        del _HANDED[id(root)]


def _owner(arr: np.ndarray) -> np.ndarray:
    """The array at the end of `arr`'s chain of array bases (the one holding the memory, or
    lending another object's)."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def fresh(nbytes: int) -> np.ndarray:
    """A new ``uint8`` array of `nbytes`, its pages faulted in (`populate`)."""
    out = np.empty(nbytes, np.uint8)
    populate(out)
    return out


def populate(arr: np.ndarray) -> None:
    """Fault in the whole pages under `arr` for writing, in one call (Linux 5.14+
    ``MADV_POPULATE_WRITE``; a hint: elsewhere, or refused, the first writes fault them)."""
    if arr.nbytes < 16 * _PAGE or not sys.platform.startswith("linux"):
        return
    madvise = _madvise()
    if madvise is None:
        return
    start = arr.__array_interface__["data"][0]
    low, high = -(-start // _PAGE) * _PAGE, (start + arr.nbytes) // _PAGE * _PAGE
    if high > low:
        madvise(low, high - low, _MADV_POPULATE_WRITE)


def _madvise() -> Any:
    global _MADVISE
    if _MADVISE is None:
        import ctypes

        _MADVISE = libc("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int) or False
    return _MADVISE or None


def heap_for_temporaries() -> None:
    """Raise glibc's malloc thresholds past the temporaries of weightio's chunked numpy loops, once
    per process, by allocating and freeing one block of `TEMPORARIES` bytes (none of it touched).

    glibc maps each allocation at or over its mmap threshold (128 KiB at start) on its own, and
    unmaps it when freed; freeing such a block (of up to 32 MiB) raises the threshold to its size
    and the heap's trim threshold to twice that. A loop whose temporaries are about the size of the
    threshold so far lands on an edge that depends on what the process allocated before: either
    each chunk's temporaries are reused from the heap, or they are fresh pages every chunk (mapped
    anew, or the heap's top trimmed after a chunk and faulted in again by the next). Measured: the
    same single-threaded Q6_K dequantization of 16M elements took 2.4x as long, with 85k more page
    faults, in one of two processes that differed only in the folder weightio was imported from
    (IQ2_XS 1.3x, 43k). Past `TEMPORARIES`, both thresholds are beyond anything a chunk makes:
    what glibc does itself after freeing a temporary that large. The cost: up to twice
    `TEMPORARIES` of free heap may stay mapped per malloc arena (each worker thread has one; in
    practice each keeps about its peak temporaries, ~5 MiB). Nothing off Linux, under another C
    library, on 32-bit glibc (whose ceiling is 512 KiB), nor where the user fixed the thresholds
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``,
    their ``GLIBC_TUNABLES``, ``mallopt``: glibc then leaves them alone).
    """
    global _heap_set
    if _heap_set:
        return
    _heap_set = True
    if not sys.platform.startswith("linux"):
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        import ctypes
    except (ValueError, OSError, ImportError):  # (not glibc; or a Python built without ctypes)
        return
    malloc, free = libc("malloc", ctypes.c_size_t), libc("free", ctypes.c_void_p)
    if malloc is None or free is None:
        return
    malloc.restype = ctypes.c_void_p  # (the address whole: `libc`'s functions return an int by default)
    free.restype = None
    block = malloc(TEMPORARIES)
    if block:
        free(block)
