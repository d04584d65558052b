"""Opening a large header pauses Python's cyclic garbage collector.

Parsing a 100k-tensor safetensors header (or unpickling a 100k-tensor state dict) creates a few
hundred thousand dicts, lists and tuples that all survive until the parse ends. Each 700 new
containers start a young-generation collection, and the survivors are traversed again and again
as they age: measured, a third to a half of the open went into the collector, finding nothing,
since parsed headers hold no reference cycles. `collector_paused` switches the collector off for
the parse and back on after; it nests and is thread-safe (the collector comes back on when the
last pause ends, and only if it was on when the first began).
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

__all__ = ["collector_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


class _Paused:
    """The context manager `collector_paused` returns (a class, not a generator: opening a
    191-shard model enters it 191 times)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _was_enabled
        with _lock:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _depth += 1

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


_PAUSED = _Paused()


def collector_paused() -> _Paused:
    """Run the block with the cyclic garbage collector off (reference counting still frees)."""
    return _PAUSED
