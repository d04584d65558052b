"""The process's thread pools, one per kind of work, each created on first use, and the count of
the CPUs it may run on (`cpus`), which sizes them.

``concurrent.futures`` (which imports logging) is imported only when a pool is first asked for,
so that ``import weightio`` stays cheap.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["cpus", "shared_pool"]

_pools: dict[str, tuple[ThreadPoolExecutor, int]] = {}  # kind -> (pool, its threads)
_lock = threading.Lock()


def cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the system has one (a container's
    or ``taskset``'s share of the machine), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def shared_pool(kind: str, workers: int, *, grow: bool = False) -> ThreadPoolExecutor:
    """The pool for `kind` of work (its threads are named ``weightio-<kind>``), with `workers` threads
    when this call creates it. With `grow`, a pool of fewer threads is replaced by one of `workers`,
    for work whose callers choose their thread count (``dequantize(threads=...)``). The old pool is
    not shut down, only forgotten: a caller still submitting to it on another thread carries on, and
    its threads end once no caller holds it (``concurrent.futures`` wakes them when it is collected)."""
    with _lock:
        pool, size = _pools.get(kind, (None, 0))
        if pool is None or (grow and size < workers):
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(workers, thread_name_prefix=f"weightio-{kind}")
            _pools[kind] = pool, workers
        return pool


def _forget_pools() -> None:
    """In a forked child the pools' threads do not exist: start afresh (else tasks would wait forever)."""
    global _lock
    _pools.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)
