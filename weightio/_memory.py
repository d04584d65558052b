"""Fresh memory faulted in one call: what a destination that is about to be written whole wants.

`populate` asks the kernel to fault in (for writing) every whole page under an array at once
(Linux 5.14+ ``madvise(MADV_POPULATE_WRITE)``), instead of one page fault per 4 KiB during the
writes that follow: measured here, about 2x less time than faulting during a copy. `fresh` is
``numpy.empty`` populated. Elsewhere, or where the kernel refuses, both are plain: the first
writes fault the pages.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._native import libc

__all__ = ["fresh", "populate"]

_PAGE = 4096
_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+)
_MADVISE: Any = None


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
