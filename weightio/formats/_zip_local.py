"""Reading the local headers of a local zip archive: many small ``pread``s made few.

`weightio.formats._zip` checks every member's local header at open (its data offset comes from
there). A checkpoint of 100k small tensors has its headers a few hundred bytes apart, and one
``pread`` per header was most of the walk; headers close together are read in one run here.
"""

from __future__ import annotations

from .._io import MappedFile

__all__ = ["RUN_GAP", "RUN_MOST", "local_headers"]

RUN_GAP = 16 << 10  # bytes between two local headers that one read spans (copied, not faulted in)
RUN_MOST = 1 << 20  # bytes of one such read, at most


def local_headers(file: MappedFile, wanted: list[tuple[int, int]]) -> list[bytes]:
    """The bytes of each (offset, length) in `wanted` — local headers and their names, for
    `weightio.formats._zip` to check — in order; fewer where the file ends first, none past it.

    Read with ``pread`` (never through the mapping, see `MappedFile.read`), headers that lie
    within `RUN_GAP` bytes of each other in one read of at most `RUN_MOST` bytes: a checkpoint
    of 100k small tensors has its headers a few hundred bytes apart, and one ``pread`` per header
    was most of the walk. Headers megabytes apart (large tensors) are read one by one, as before.
    """
    size = file.size
    spans = [(at, min(length, size - at)) for at, length in wanted]
    heads: list[bytes] = [b""] * len(spans)
    order = sorted((i for i in range(len(spans)) if spans[i][0] < size), key=lambda i: spans[i][0])
    k = 0
    while k < len(order):
        start = spans[order[k]][0]
        stop, last = start + spans[order[k]][1], k + 1
        while last < len(order):
            at, n = spans[order[last]]
            if at > stop + RUN_GAP or at + n - start > RUN_MOST:
                break
            stop = max(stop, at + n)
            last += 1
        raw = file.read(start, stop - start, "the local headers")
        for i in order[k:last]:
            at, n = spans[i]
            heads[i] = raw[at - start: at - start + n]
        k = last
    return heads
