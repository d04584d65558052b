"""Reading a zip archive's structure by byte ranges: what `weightio.formats._zip` does differently
for a remote file (`weightio._remote.RemoteFile`).

A local archive is mapped, so `_zip` reads every member's local header at open. Remotely that is
one request per member (a torch checkpoint has one member per storage), so the walk changes:

* **end records and central directory** are fetched as exact ranges (`TAIL` bytes of the end
  first, then the rest of the directory with `SLACK` bytes before it, where torch writes its last
  small records), not as 64 KiB cache blocks, and kept (`Held`) for the header reads that follow;
* **torch's layout**: torch's writer pads each local header's extra field (an ``FB`` record,
  after a ZIP64 record when an offset or size needs one) so that every member's data starts on a
  multiple of the archive's storage alignment (``.storage_alignment``, 64 when absent). When the
  first member's local header shows that layout, every member's data offset is *predicted* from
  the central directory (`torch_data_offset`) and the member is *pending*: its local header is
  fetched and checked (name, flags, method, data offset) before any of its bytes are served
  (`weightio.formats._zip.verify`), and a disagreement is a `CorruptFileError`;
* **any other writer** (numpy's ``savez``, weightio's ``write_npz``, Python's ``zipfile``): all
  local headers are fetched at open, concurrently, each with the bytes after its name that its
  extra field and ``.npy`` header take, judged from the first member (`prefixes`), and checked
  exactly as a local archive's.

The archive rules of `_zip` hold either way: for a pending member they are checked on the
predicted offsets at open, and the prediction is confirmed before its bytes are read.
"""

from __future__ import annotations

import bisect
import struct
import threading
import weakref
from typing import Any

from .._remote import BLOCK
from .base import is_remote

__all__ = ["AHEAD", "BLOCK", "DEFLATED", "Held", "SLACK", "TAIL", "Pending", "fetch", "first_extra", "held",
           "prefixes", "read", "tail",
           "torch_data_offset", "torch_padded"]

TAIL = 22 + 20 + 56  # bytes of a remote archive's end fetched first: its end records (ZIP64 ones included)
SLACK = 1024  # bytes before a torch archive's central directory fetched with it: its version, serialization_id
DEFLATED = 1024  # compressed bytes fetched after a deflated member's name (its .npy header's deflate blocks)
AHEAD = 15  # pending local headers fetched with the one a read needs (one batch: WORKERS in flight)
TORCH_ALIGNMENT = 64  # torch's storage alignment before it wrote a .storage_alignment record
_U32 = 0xFFFFFFFF


class Held:
    """Exact byte ranges of one remote file fetched for its headers (merged when they touch)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()

    def get(self, offset: int, length: int) -> bytes | None:
        """Bytes `offset`..`offset + length` when one held range holds them all, else None."""
        chunk, start = self._around(offset)
        if chunk is None or offset + length > start + len(chunk):
            return None
        return chunk[offset - start: offset - start + length]

    def prefix(self, offset: int, length: int) -> bytes:
        """As many of bytes `offset`..`offset + length` as are held from `offset` on (maybe none)."""
        chunk, start = self._around(offset)
        return b"" if chunk is None else chunk[offset - start: offset - start + length]

    def missing(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The ``(offset, length)`` runs of `start`..`stop` not held."""
        runs, pos = [], start
        with self._lock:
            regions = list(zip(self._starts, self._chunks, strict=True))
        for begin, chunk in regions:
            end = begin + len(chunk)
            if end <= pos or begin >= stop:
                continue
            if begin > pos:
                runs.append((pos, begin - pos))
            pos = max(pos, end)
        if pos < stop:
            runs.append((pos, stop - pos))
        return runs

    def add(self, offset: int, data: bytes) -> None:
        """Hold `data` (the bytes at `offset`), merged with the ranges it touches or overlaps."""
        with self._lock:
            end = offset + len(data)
            k = bisect.bisect_left(self._starts, offset)
            if k and self._starts[k - 1] + len(self._chunks[k - 1]) >= offset:
                k -= 1
            j, low, high = k, offset, end
            while j < len(self._starts) and self._starts[j] <= end:
                low, high = min(low, self._starts[j]), max(high, self._starts[j] + len(self._chunks[j]))
                j += 1
            merged = bytearray(high - low)
            for begin, chunk in zip(self._starts[k:j], self._chunks[k:j], strict=True):
                merged[begin - low: begin - low + len(chunk)] = chunk
            merged[offset - low: end - low] = data
            self._starts[k:j] = [low]
            self._chunks[k:j] = [bytes(merged)]

    def _around(self, offset: int) -> tuple[bytes | None, int]:
        with self._lock:
            k = bisect.bisect_right(self._starts, offset) - 1
            if k < 0 or offset >= self._starts[k] + len(self._chunks[k]):
                return None, 0
            return self._chunks[k], self._starts[k]


_HELD: weakref.WeakKeyDictionary[Any, Held] = weakref.WeakKeyDictionary()
_HELD_LOCK = threading.Lock()


def held(file: Any) -> Held:
    """The ranges held for `file` (created empty on first use)."""
    with _HELD_LOCK:
        found = _HELD.get(file)
        if found is None:
            found = _HELD[file] = Held()
            if getattr(file, "last", None) is not None:  # the end, fetched with the first bytes
                found.add(*file.last)
        return found


def read(file: Any, offset: int, length: int, what: str) -> bytes:
    """Header bytes: for a remote file from its held ranges when they hold them, else `file.read`
    (a remote file's block cache)."""
    if is_remote(file):
        found = _HELD.get(file)
        got = found.get(offset, length) if found is not None and length > 0 else None
        if got is not None:
            return got
    return file.read(offset, length, what)


def fetch(file: Any, ranges: list[tuple[int, int]], what: str) -> None:
    """Fetch the parts of `ranges` (``(offset, length)``) not yet held, exactly, in one batch (runs
    close together share a request, the others are in flight together), and hold them."""
    store = held(file)
    runs = sorted({run for offset, length in ranges for run in store.missing(offset, offset + length)})
    here = [run for run in runs if file.holds(*run)]  # in the first bytes sniffing read: no request
    for offset, length in here:
        store.add(offset, file.read(offset, length, what))
    runs = [run for run in runs if run not in here] if here else runs
    if not runs:
        return
    raw = file.gather(runs, what).tobytes()
    pos = 0
    for offset, length in runs:
        store.add(offset, raw[pos: pos + length])
        pos += length


def tail(file: Any, start: int) -> tuple[int, bytes]:
    """(offset, bytes) of the end of a remote archive: its last `TAIL` bytes, or the whole window
    `_find_eocd` searches when those hold no end record signature (a long comment)."""
    first = max(start, file.size - TAIL)
    fetch(file, [(first, file.size - first)], "the end of the archive")
    tail = read(file, first, file.size - first, "the end of the archive")
    if first > start and b"PK\x05\x06" not in tail:  # the last signature is the same in both windows if any
        fetch(file, [(start, first - start)], "the end of the archive")
        first, tail = start, read(file, start, file.size - start, "the end of the archive")
    return first, tail


def first_extra(file: Any) -> tuple[int, bytes]:
    """(where its data starts, its extra field) of the local header at offset 0, from the first
    block (which sniffing fetched); (0, b"") when there is none."""
    if file.size < 30 or read(file, 0, 4, "the first local header") != b"PK\x03\x04":
        return 0, b""
    name_length, extra_length = struct.unpack("<HH", read(file, 26, 4, "the first local header"))
    start = 30 + name_length
    extra = read(file, start, max(0, min(extra_length, file.size - start)), "the first local header")
    return start + len(extra), extra


def prefixes(file: Any) -> Any:
    """How many bytes to fetch after a member's name, with its local header: the extra field and
    ``.npy`` header an .npz writer writes alike for every member, judged from the first member
    (``prefix(header_offset, name_length, size, deflated)``). weightio's writer pads the extra
    field (an ``0xD935`` record) so the data starts on a multiple of 64: computed per member."""
    start, extra = first_extra(file)
    npy = 0
    if start and start + 12 <= file.size and file.holds(start, 12) \
            and read(file, start, 6, "an .npy header") == b"\x93NUMPY":
        wide = read(file, start + 6, 1, "an .npy header")[0] > 1  # versions 2.0, 3.0: a 4-byte length
        length = read(file, start + 8, 4 if wide else 2, "an .npy header")
        npy = min(8 + len(length) + int.from_bytes(length, "little"), 4096)
    aligned = _tags(extra)[-1:] == [0xD935]

    def prefix(header_offset: int, name_length: int, size: int, deflated: bool) -> int:
        if deflated:
            return len(extra) + DEFLATED
        if not aligned:
            return len(extra) + npy
        zip64 = 20 if size >= _U32 else 0
        pad = -(header_offset + 30 + name_length + zip64) % 64
        return zip64 + (pad + 64 if 0 < pad < 4 else pad) + npy

    return prefix


def _tags(extra: bytes) -> list[int]:
    """The tags of the records of an extra field ([] when it does not parse)."""
    pos, tags = 0, []
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        tags.append(tag)
        pos += 4 + length
    return tags if pos == len(extra) else []


def torch_padded(extra: bytes) -> bool:
    """Whether a local header's extra field is torch's: an ``FB`` padding record last, after at most
    a ZIP64 record."""
    tags = _tags(extra)
    return bool(tags) and tags[-1] == 0x4246 and not set(tags[:-1]) - {0x0001}


def torch_data_offset(header_offset: int, name_length: int, size: int, alignment: int) -> int:
    """Where torch's writer puts a member's data: after its local header and name, a ZIP64 extra
    record when the size or header offset needs 64 bits, and an ``FB`` padding record (4 bytes and
    the padding) that brings the data to the next multiple of `alignment`."""
    start = header_offset + 30 + name_length + 4
    if size >= _U32 or header_offset >= _U32:
        start += 4 + (16 if size >= _U32 else 0) + (8 if header_offset >= _U32 else 0)
    return -(-start // alignment) * alignment


class Pending:
    """The members of one remote archive whose data offsets were predicted, not yet read from their
    local headers; `take` hands each out once for checking."""

    def __init__(self, cd_offset: int, members: list[tuple[Any, int]]) -> None:
        self.cd_offset = cd_offset
        ordered = sorted(members, key=lambda entry: entry[0].data_offset)
        self._starts = [m.data_offset for m, _ in ordered]
        self._members = ordered
        self._open = {m.header_offset for m, _ in ordered}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def overlapping(self, start: int, stop: int) -> list[tuple[Any, int]]:
        """(member, flags) of the pending members whose data overlaps `start`..`stop` (or holds
        `start`, for an empty range)."""
        k = max(bisect.bisect_right(self._starts, start) - 1, 0)
        found = []
        while k < len(self._members) and (self._starts[k] < stop or self._starts[k] <= start):
            member, flags = self._members[k]
            if member.data_offset + member.compressed_size > start or member.data_offset == start:
                found.append((member, flags))
            k += 1
        return [(m, f) for m, f in found if m.header_offset in self._open]

    def after(self, offset: int, count: int) -> list[Any]:
        """Up to `count` pending members whose data starts at or after `offset`, in file order."""
        k = bisect.bisect_left(self._starts, offset)
        found: list[Any] = []
        while k < len(self._members) and len(found) < count:
            if self._members[k][0].header_offset in self._open:
                found.append(self._members[k][0])
            k += 1
        return found

    def of(self, member: Any) -> tuple[Any, int] | None:
        """(member, flags) when `member` is pending, else None."""
        if member.header_offset not in self._open:
            return None
        k = bisect.bisect_left(self._starts, member.data_offset)
        while k < len(self._members) and self._starts[k] == member.data_offset:
            if self._members[k][0].header_offset == member.header_offset:
                return self._members[k]
            k += 1
        return None

    def done(self, member: Any) -> None:
        with self._lock:
            self._open.discard(member.header_offset)
