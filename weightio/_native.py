"""weightio's optional C module, `weightio._speedups` (weightio/_speedups.c), or None; and the C
library's calls Python's own modules do not offer (`libc`).

None where it was not built (no C compiler at install: the Python paths do everything), where the
built module is not the interface this code calls (`VERSION`: a stale in-place build of an
editable install), where it cannot load (a free-threaded Python warns that it turns its GIL back
on, an error under ``-W error``), and where ``WEIGHTIO_NO_SPEEDUPS`` is set to anything but 0.
Its functions refuse nothing: each returns None for anything unusual, and the caller's Python path
then reads the input and says what is wrong.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["VERSION", "libc", "speedups"]

VERSION = 14  # the interface of weightio/_speedups.c this code calls (its module's VERSION)


def _load() -> Any:
    if os.environ.get("WEIGHTIO_NO_SPEEDUPS", "0") not in ("", "0"):
        return None
    try:
        from . import _speedups
    except (ImportError, RuntimeWarning):
        return None
    return _speedups if getattr(_speedups, "VERSION", None) == VERSION else None


speedups: Any = _load()


def libc(name: str, *argtypes: Any) -> Any:
    """The C library's function `name` (``madvise``, ``mprotect``, ``sync_file_range``), through
    ctypes: its arguments typed `argtypes`, its result an ``int``, errno kept after each call
    (``ctypes.get_errno()``); None where the platform has no such function. Each caller looks up
    once what it uses, and goes without where it is None: every call made this way is a hint or
    a speed-up, never needed. Each lookup is a function object of its own (its argument types
    are the caller's alone), and releases the interpreter's lock while it runs."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True)[name]
    except (OSError, AttributeError, TypeError):  # (TypeError: Windows has no handle to the process's own C library)
        return None
    function.argtypes = list(argtypes)
    return function
