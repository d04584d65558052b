"""Reading the local headers of a local zip archive: many small ``pread``s made few.

`weightio.formats._zip` checks every member's local header at open (its data offset comes from
there). A checkpoint of 100k small tensors has its headers a few hundred bytes apart, and one
``pread`` per header was most of the walk; headers close together are read in one run here.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np

from .._io import MappedFile

__all__ = ["RUN_GAP", "RUN_MOST", "local_headers", "located"]

_LOCAL = np.dtype([("sig", "<u4"), ("needed", "<u2"), ("flags", "<u2"), ("method", "<u2"), ("time", "<u2"),
                   ("date", "<u2"), ("crc", "<u4"), ("csize", "<u4"), ("usize", "<u4"), ("nlen", "<u2"),
                   ("xlen", "<u2")])  # 30 bytes, as _zip._LOCAL
_SIG_LOCAL, _ENCRYPTED, _UTF8 = 0x04034B50, 0x1, 0x800
_INT64_ROOM = 1 << 62  # a size past this (a ZIP64 field holds up to 2^64 - 1) is left to the loop: no int64 wraps

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


def located(file: MappedFile, members: list[tuple[Any, bytes, int]], cd_offset: int,
            member: Callable[[tuple], Any]) -> list[Any] | None:
    """`weightio.formats._zip`'s central entries ((member, raw name, flags)) as members with their data
    offsets, every local header read (in the same runs as `local_headers`) and checked at once with
    numpy — or None where any is not regular: past the end of the file, a wrong signature, name
    bytes, name-encoding flag or method that are not the central entry's, encryption, data running
    into the central directory, a stored member whose two sizes differ, members not laid out one
    after another from offset 0. Then ``_zip._locate`` checks each and says what is wrong. Headers
    far apart (large tensors) are read one by one, and still checked together."""
    count = len(members)
    if not count:
        return None
    entries, raws, flag_column = zip(*members, strict=True)  # columns, transposed in C (no Python per member)
    member_names, methods, crcs, csizes, sizes, offsets, _, _ = zip(*entries, strict=True)
    if max(offsets) >= cd_offset or max(csizes) > cd_offset or max(sizes) > _INT64_ROOM:
        return None  # past the directory, or (ZIP64 fields hold up to 2^64 - 1) past an int64: the loop says so
    offset = np.array(offsets, np.int64)
    nlen = np.fromiter(map(len, raws), np.int64, count)
    end = offset + 30 + nlen
    if end.max() > file.size:
        return None
    order = np.argsort(offset, kind="stable")
    at, reach = offset[order], np.maximum.accumulate(end[order])  # reach: the furthest end so far
    gaps = np.flatnonzero(at[1:] > reach[:-1] + RUN_GAP) + 1
    bounds, starts, reaches = [0, *gaps.tolist(), count], at.tolist(), reach.tolist()
    runs = []  # (first header, one past the last) of each read: within RUN_GAP of each other, RUN_MOST at most
    for first, last in zip(bounds[:-1], bounds[1:], strict=True):
        while first < last:
            stop = first + 1 if last == first + 1 else max(
                first + 1, bisect.bisect_right(reaches, starts[first] + RUN_MOST, first, last))
            runs.append((first, stop))
            first = stop
    reads = file.read_each([(starts[a], reaches[b - 1] - starts[a]) for a, b in runs], "the local headers")
    names = [raws[i] for i in order.tolist()]  # the central entries' names, in header order
    sorted_nlen = nlen[order]
    heads: list[bytes] = []  # each local header, in header order, cut from the reads (which span tensor data)
    for (first, stop), raw in zip(runs, reads, strict=True):
        if stop == first + 1:  # (one header and its name: the whole read)
            if raw[30:] != names[first]:
                return None
            heads.append(raw[:30])
            continue
        # a run of nearby headers: numpy, run by run (temporaries the size of one read: one array of
        # every run, ~25 MB at 100k members, freed, raises glibc's mmap threshold and leaves +26 MB RSS)
        run, within = np.frombuffer(raw, np.uint8), at[first:stop] - at[first]
        heads.append(np.lib.stride_tricks.sliding_window_view(run, 30)[within].tobytes())
        if not _names_match(run, within + 30, sorted_nlen[first:stop], names[first:stop]):
            return None
    rows = np.empty(count, _LOCAL)
    rows[order] = np.frombuffer(b"".join(heads), _LOCAL)
    method = np.array(methods, np.int64)
    flags = np.array(flag_column, np.int64)
    if ((rows["sig"] != _SIG_LOCAL).any() or not np.array_equal(rows["nlen"], nlen) or (rows["method"] != method).any()
            or (rows["flags"] & _ENCRYPTED).any() or ((rows["flags"] ^ flags) & _UTF8).any()):
        return None
    csize = np.array(csizes, np.int64)
    size = np.array(sizes, np.int64)
    data = end + rows["xlen"]
    if (data + csize > cd_offset).any() or ((method == 0) & (csize != size)).any():
        return None
    if offset[order[0]] != 0 or ((data + csize)[order[:-1]] > offset[order[1:]]).any():
        return None
    return list(map(member, zip(member_names, methods, crcs, csizes, sizes, offsets, data.tolist(), raws, strict=True)))


def _names_match(run: np.ndarray, starts: np.ndarray, lengths: np.ndarray, names: list[bytes]) -> bool:
    """Whether the bytes of `run` (one read of nearby local headers) at each of `starts` (`lengths`
    of them) are `names`, in order."""
    gather = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))
    return run[gather].tobytes() == b"".join(names)
