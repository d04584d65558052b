"""A loop over many tensors of remote files, streamed: the next ones fetched while one is read.

`reading_ahead` keeps up to `READ_AHEAD` bytes of the next tensors on their way, asked for in
batches through `weightio._remote.RemoteFile.read_ahead_many`, so that neighbours in a file share
one request: a model read in file order streams a request per `weightio._remote.PART`, not a
round trip per tensor. Local views pass through untouched.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["READ_AHEAD", "reading_ahead"]

READ_AHEAD = 32 << 20  # bytes of the next tensors a loop over many keeps on their way (`reading_ahead`): one or
# two requests of neighbouring tensors (`read_ahead_many`), enough to cover a round trip at a link's speed. On the
# 2-CPU loopback bench, budgets of 0 to 64 MiB and requests of 16 MiB to whole files streamed within noise of each
# other (medians of 9, a second idle between runs); what joining neighbours buys is a request per 32 MiB, not per tensor


def reading_ahead(views: Iterable[Any], budget: int | None = None) -> Iterator[Any]:
    """`views`, in order, for a loop that reads each whole: the next ones are fetched meanwhile
    while at most `budget` bytes (`READ_AHEAD`) beyond the one being read are on their way, so that
    a model streams at the link's speed instead of one tensor's round trip at a time. They are asked
    for in batches (`RemoteFile.read_ahead_many`: neighbours in a file share a request) whenever
    less than half the budget is on its way. A view takes part through its ``stored_remote()``
    (its remote file and byte range, or None: a local view passes through untouched)."""
    views = list(views)
    budget = READ_AHEAD if budget is None else budget
    asked: deque[int] = deque()  # bytes asked ahead, per view from the current one on
    ahead = 0  # the next view to ask ahead for
    for k, view in enumerate(views):
        if ahead < len(views) and (ahead == k or sum(asked) < budget // 2):
            ahead = _ask_ahead(views, k, ahead, budget, asked)
        yield view
        asked.popleft()


def _ask_ahead(views: list[Any], k: int, ahead: int, budget: int, asked: deque[int]) -> int:
    """Ask for views[ahead:] until `budget` bytes are on their way (views[k] at least), one
    `read_ahead_many` per file; their byte counts appended to `asked`. Returns the next to ask."""
    total = sum(asked)
    batch: list[Any] = []  # each a stored_remote(): (file, start, length), or None for a local view
    while ahead < len(views) and (ahead == k or total < budget):
        stored = getattr(views[ahead], "stored_remote", None)
        where = stored() if stored is not None else None
        batch.append(where)
        total += where[2] if where is not None else 0
        ahead += 1
    files: dict[int, tuple[Any, list[int]]] = {}
    for position, where in enumerate(batch):
        if where is not None:
            files.setdefault(id(where[0]), (where[0], []))[1].append(position)
    counts = [0] * len(batch)
    for file, positions in files.values():
        got = file.read_ahead_many([batch[p][1:] for p in positions])
        for position, n in zip(positions, got, strict=True):
            counts[position] = n
    asked.extend(counts)
    return ahead
