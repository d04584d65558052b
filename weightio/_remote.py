"""A remote file read by byte ranges: what a reader sees of a checkpoint on the Hub, in S3 or behind HTTPS.

`RemoteFile` has the interface every reader uses of a local `weightio._io.MappedFile` — ``path``,
``size``, ``read(offset, length, what)``, ``unpack``, ``data``, ``check``, ``close`` — so every
format's reader opens a remote file unchanged, and only the bytes it asks for cross the network:

* **headers** (``read``/``unpack``, and the few parsers that walk ``data`` after `ensure`-ing
  the bytes they walk) go through a bounded LRU cache of `BLOCK`-sized blocks: a first read of 512
  bytes fetches one 64 KiB block, which holds most safetensors headers, GGUF magic and zip tails
  whole; missing runs of blocks are fetched as one request each, several in flight at once;
* **tensors** (`fetch`, `gather`: what `weightio.view.TensorView` calls for a remote file) are
  fetched as their exact byte ranges into memory the caller owns — large ones in `PART`-sized
  requests in flight at once, a selection (``view[:, a:b]``, a tensor-parallel shard) as its
  runs, coalesced where they nearly touch — and never kept: reading a model tensor by tensor holds
  one tensor, not the model. Tensors asked ahead together (`read_ahead_many`, what
  `weightio._streaming.reading_ahead` calls) share a request with their neighbours in the file,
  its answer written into each tensor's memory as it arrives (`_Scatter`).

``data`` is an *image* of the file: an anonymous mapping of the file's size (``MAP_NORESERVE``:
address space only, no memory committed until written) in which the blocks `ensure` fetched are
filled in. Indexing it with a slice fills the slice first, so code that slices ``data`` gets the
file's bytes; parsers that take a ``memoryview`` of it call `ensure` for what they walk.

Transport is fsspec's: each file is opened once with its filesystem (``HfFileSystem`` for the
Hub, fsspec's HTTP filesystem, ``s3fs``, any other installed) and ranges are fetched with the
file object's own range fetcher, from a pool of threads. Failures go through
`weightio._failures.retrying` (transient ones retried with backoff, the others sorted into
weightio's errors, URLs shown without credentials). A server that ignores ``Range`` and answers
the whole body is refused (`InputError`), never read whole. A file whose size or ETag changed since
it was opened raises `CorruptFileError`.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ._failures import redact, retrying
from ._memory import fresh, handed_over, populate
from ._threads import shared_pool
from .errors import CorruptFileError, InputError, WeightioError

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["BLOCK", "PART", "RemoteFile", "RemoteImage", "Traffic", "pool"]

BLOCK = 64 << 10  # header cache granularity: a header read moves at most one block more than it needs
PART = 32 << 20  # a large range is fetched as parts of this size, several in flight
GAP = 1 << 10  # two runs of a selection closer than this are fetched as one range (the bytes between dropped)
CACHE_BYTES = 32 << 20  # the header block cache of one file (LRU)
WORKERS = 64  # ranges in flight at once (all files of the process together)
MANY = 4096  # at most this many ranges are asked in one wave (fetch_many): more go on threads


def pool() -> ThreadPoolExecutor:
    """The process's pool of range-fetching threads (created on first use)."""
    return shared_pool("fetch", WORKERS)


class Traffic:
    """What one remote file cost: requests made and body bytes received (thread-safe counters)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes += nbytes


class RemoteImage(np.ndarray):
    """The image of a remote file (see the module docstring): slicing it fetches the slice first."""

    file: RemoteFile

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice) and getattr(self, "file", None) is not None:
            start, stop, _ = key.indices(len(self))
            if stop > start:
                self.file.ensure(start, stop - start, "the bytes asked for")
        return np.ndarray.__getitem__(self, key)

    def __array_finalize__(self, obj: Any) -> None:
        self.file = None  # type: ignore[assignment]  # slices are plain views once filled


class Into(Protocol):
    """What ``fetch_into`` writes a range into: a writable ``memoryview``, or a `_Scatter` over several arrays."""

    def __len__(self) -> int: ...

    def __setitem__(self, where: slice, chunk: bytes, /) -> None: ...


class RemoteFile:
    """One remote file, read by byte ranges (see the module docstring).

    Attributes:
        path: the URL as shown (credentials removed).
        size: the file's size in bytes, as the server reported it at open.
        etag: the server's ETag at open, when it sent one.
        traffic: requests made and bytes received so far (`Traffic`).

    ``fetch_into(start, stop, into)``, where the transport has one, receives a range straight
    into the caller's memory and returns the bytes it wrote (tensors are fetched with it: one copy
    from the socket, not two). ``first``, where given, is the file's first ``first_asked`` bytes (all
    of it when smaller), brought by the request that found the file and its size (an HTTP ranged
    GET: see `weightio.remote`): the first header reads are answered from it. ``last``, where given,
    is the file's last bytes, fetched alongside (a zip archive is read from its end); `prime`
    fetches both for a file found without them.
    """

    remote: Literal[True] = True  # (`MappedFile.remote` is False: a check of it tells the two apart)

    def __init__(self, url: str, fetcher: Callable[[int, int], bytes], size: int, *, etag: str | None = None,
                 close: Callable[[], None] | None = None, cache_bytes: int = CACHE_BYTES,
                 first: bytes | None = None, first_asked: int = BLOCK, last: bytes | None = None,
                 fetch_into: Callable[[int, int, Into], int] | None = None,
                 fetch_many: Callable[[list[tuple[int, int]]], list[bytes | None]] | None = None) -> None:
        self.path = redact(url)
        problem = ("empty file (0 bytes)" if size <= 0 else
                   f"changed since it was opened: its first bytes came back {len(first)} bytes long (the file is "
                   f"{size} bytes); open it again" if first is not None and len(first) != min(first_asked, size) else
                   f"changed since it was opened: its last bytes came back {len(last)} bytes long (the file is "
                   f"{size} bytes); open it again" if last is not None and not 0 < len(last) <= size else None)
        if problem is not None:
            if close is not None:
                close()
            raise CorruptFileError(problem, path=self.path)
        self.size = size
        self.etag = etag
        self.traffic = Traffic()
        self._fetcher = fetcher
        self._fetch_into = fetch_into
        self._fetch_many = fetch_many
        self._on_close = close
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._cache_blocks = max(2, cache_bytes // BLOCK)
        self._lock = threading.Lock()
        self._closed = False
        self._image: RemoteImage | None = None
        self._filled: set[int] = set()
        self._ahead: dict[tuple[int, int], tuple[np.ndarray, list[Future[None]]]] = {}  # see read_ahead
        self._head = b""  # the first bytes, when fewer than a block were asked (exact: not a cache block)
        self.last: tuple[int, bytes] | None = None  # (offset, bytes) of the end, when fetched with the first
        for given in (first, last):  # fetched with the size by the request that found the file
            if given is not None:
                self.traffic.add(len(given))
        self._keep(first, first_asked, last)

    def _keep(self, first: bytes | None, first_asked: int, last: bytes | None) -> None:
        if first is not None:  # a whole block is cached as one; fewer bytes asked are kept exactly
            if first_asked >= BLOCK or len(first) == self.size:
                self._blocks[0] = first
            else:
                self._head = first
        if last is not None:
            self.last = (self.size - len(last), last)

    def prime(self, first: int, last: int) -> None:
        """Fetch the first `first` bytes (a whole cache block when `first` is `BLOCK`) and the last
        `last` bytes now, the two requests in flight together: what a reader will ask for first, for
        a file found without them (its size known beforehand: S3, the Hub)."""
        first = min(first, self.size) if first and not self.holds(0, min(first, self.size)) else 0
        covered = max(first, len(self._head), BLOCK if 0 in self._blocks else 0)
        last = max(0, min(last, self.size - covered)) if self.last is None else 0  # never the first bytes again
        ranges = [r for r in ((0, first), (self.size - last, last)) if r[1]]
        if not ranges:
            return
        got = self._get_many(ranges)
        with self._lock:
            self._keep(got[0] if first else None, first, got[-1] if last else None)

    def holds(self, offset: int, length: int) -> bool:
        """Whether bytes `offset`..`offset + length` are here already (no request to read them)."""
        if offset + length <= len(self._head) or (self.last is not None and offset >= self.last[0]):
            return True
        return length > 0 and all(b in self._blocks for b in range(offset // BLOCK, (offset + length - 1) // BLOCK + 1))

    # ------------------------------------------------------------------ the MappedFile interface
    @property
    def closed(self) -> bool:
        return self._closed

    def check(self) -> None:
        """Raise if closed (a remote file's changes are caught per request: see `_get`)."""
        if self._closed:
            raise WeightioError("the checkpoint was closed; open it again to read tensors", path=self.path)

    def read(self, offset: int, length: int, what: str) -> bytes:
        """`length` bytes at `offset`, through the block cache; `CorruptFileError` naming `what` past the end."""
        self._bounds(offset, length, what)
        if length == 0:
            return b""
        if offset + length <= len(self._head):
            return self._head[offset: offset + length]
        if self.last is not None and offset >= self.last[0]:
            return self.last[1][offset - self.last[0]: offset - self.last[0] + length]
        first, last = offset // BLOCK, (offset + length - 1) // BLOCK
        blocks = self._blocks_of(range(first, last + 1))
        joined = blocks[0] if first == last else b"".join(blocks)
        start = offset - first * BLOCK
        return joined[start:start + length]

    def unpack(self, fmt: struct.Struct, offset: int, what: str) -> tuple:
        if offset < 0 or offset + fmt.size > self.size:
            raise CorruptFileError(f"file ends inside {what} (needs {fmt.size} bytes at offset {offset}, file has "
                                   f"{self.size})", path=self.path)
        return fmt.unpack(self.read(offset, fmt.size, what))

    def release_head(self) -> None:
        """(`MappedFile` keeps its first bytes while a reader parses; a remote file keeps what it fetched.)"""

    @property
    def data(self) -> np.ndarray:
        """The image of the file (module docstring): `ensure` a range before reading it through a memoryview."""
        self.check()
        with self._lock:
            if self._image is None:
                self._image = self._new_image()
            return self._image

    def ensure(self, offset: int, length: int, what: str) -> None:
        """Fill bytes `offset`..`offset + length` of `data` (fetching the blocks not yet there)."""
        self._bounds(offset, length, what)
        if length == 0:
            return
        image = self.data
        wanted = [b for b in range(offset // BLOCK, (offset + length - 1) // BLOCK + 1) if b not in self._filled]
        if not wanted:
            return
        writable = np.ndarray(image.shape, np.uint8, buffer=image.base, offset=0)  # the same mapping, writable
        for block, raw in zip(wanted, self._blocks_of(wanted), strict=True):
            writable[block * BLOCK: block * BLOCK + len(raw)] = np.frombuffer(raw, np.uint8)
            self._filled.add(block)

    def region(self, offset: int, length: int, what: str = "the bytes asked for") -> np.ndarray:
        """Bytes `offset`..`offset + length` as a read-only array (fetched now; the caller's own memory)."""
        return self.fetch(offset, length, what)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._blocks.clear()
            self._head, self.last = b"", None
            self._ahead.clear()
            self._image = None  # the mapping goes with the last view of it
        if self._on_close is not None:
            with contextlib.suppress(Exception):
                self._on_close()

    def __repr__(self) -> str:
        return f"<RemoteFile {self.path!r} {self.size} bytes>"

    # ------------------------------------------------------------------ tensor data
    def fetch(self, offset: int, length: int, what: str = "the bytes asked for") -> np.ndarray:
        """Bytes `offset`..`offset + length` as a new read-only ``uint8`` array.

        Small ranges come through the block cache (neighbouring small tensors share requests);
        larger ones are fetched exactly, in `PART`-sized requests in flight together.
        """
        self._bounds(offset, length, what)
        with self._lock:
            ahead = self._ahead.pop((offset, length), None)
        if ahead is not None:  # fetched (or being fetched) by read_ahead
            out, futures = ahead
            errors = [f.exception() for f in futures]
            for error in errors:
                if error is not None:
                    raise error
            out.flags.writeable = False
            return handed_over(out)
        out = fresh(length)  # the caller's own memory (torch may wrap it and write), faulted in one call
        if length <= BLOCK:
            out[:] = np.frombuffer(self.read(offset, length, what), np.uint8)
        else:
            self._fill(out, [(offset, length, 0)])
        out.flags.writeable = False
        return handed_over(out)

    def read_ahead(self, offset: int, length: int, what: str = "the bytes asked for") -> int:
        """Start fetching bytes `offset`..`offset + length` now, on the fetch pool: the next `fetch`
        of exactly this range takes them (waiting for what is still on its way) instead of asking.
        Returns the bytes asked for: 0 when they are on their way already or in the header block
        cache. `read_ahead_many` for several ranges at once."""
        return self.read_ahead_many([(offset, length)], what)[0]

    def read_ahead_many(self, ranges: Sequence[tuple[int, int]], what: str = "the bytes asked for") -> list[int]:
        """`read_ahead` of every ``(offset, length)``, ranges that follow each other in the file
        (closer than `GAP`) fetched together as one request of up to `PART` bytes whose answer is
        spread over their arrays as it arrives: a model streamed in file order costs a request per
        `PART`, not per tensor, and its bytes are copied once. What a loop over many tensors calls
        for the next ones (`reading_ahead`). Returns the bytes asked for, per range."""
        asked, todo, seen = [], [], set()
        for offset, length in ranges:
            self._bounds(offset, length, what)
            with self._lock:
                skip = length == 0 or (offset, length) in self._ahead or (offset, length) in seen or \
                    (length <= BLOCK and self.holds(offset, length))
            asked.append(0 if skip else length)
            if not skip:
                seen.add((offset, length))
                todo.append((offset, length, np.empty(length, np.uint8)))  # faulted in by the thread that fills it
        if not todo:
            return asked
        futures: dict[int, list[Future[None]]] = {id(out): [] for _, _, out in todo}
        for segment in _segments(todo):
            future = pool().submit(self._segment, segment)
            for out in {id(piece[2]): piece[2] for piece in segment}.values():
                futures[id(out)].append(future)
        with self._lock:
            for offset, length, out in todo:
                self._ahead[(offset, length)] = (out, futures[id(out)])
        return asked

    def gather(self, runs: Sequence[tuple[int, int]], what: str = "the bytes asked for") -> np.ndarray:
        """The bytes of `runs` (``(offset, length)`` pairs) one after the other, as a new ``uint8`` array.

        Runs closer than `GAP` to each other are fetched as one range (the bytes between are read
        and dropped); every range is fetched exactly, several in flight.
        """
        total = sum(length for _, length in runs)
        out = np.empty(total, np.uint8)
        spans: list[list[tuple[int, int, int]]] = []  # per merged range: its runs (offset, length, position)
        position = 0
        for offset, length in runs:
            self._bounds(offset, length, what)
            if spans and 0 <= offset - (spans[-1][-1][0] + spans[-1][-1][1]) <= GAP:
                spans[-1].append((offset, length, position))
            else:
                spans.append([(offset, length, position)])
            position += length
        ranges = [(span[0][0], span[-1][0] + span[-1][1] - span[0][0]) for span in spans]
        fetched = self._get_many(ranges)
        for span, (start, _), raw in zip(spans, ranges, fetched, strict=True):
            for offset, length, at in span:
                out[at: at + length] = np.frombuffer(raw, np.uint8, length, offset - start)
        out.flags.writeable = False
        return handed_over(out)

    # ------------------------------------------------------------------ internals
    def _bounds(self, offset: int, length: int, what: str) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise CorruptFileError(f"{what} needs bytes {offset}..{offset + length} but the file has {self.size}",
                                   path=self.path)
        self.check()

    def _new_image(self) -> RemoteImage:
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_NORESERVE", 0)
        try:
            mapping = mmap.mmap(-1, self.size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise InputError(f"cannot reserve {self.size:,} bytes of address space for the file's headers: "
                             f"{e.strerror or e}", path=self.path, errno=e.errno) from e
        image = np.frombuffer(mapping, np.uint8).view(RemoteImage)
        image.file = self
        image.flags.writeable = False
        return image

    def _blocks_of(self, wanted: Iterable[int]) -> list[bytes]:
        """The cached blocks `wanted` (in order), fetching missing runs of them as one request each."""
        wanted = list(wanted)
        with self._lock:
            have = {b: self._blocks[b] for b in wanted if b in self._blocks}
            for b in have:
                self._blocks.move_to_end(b)
        missing = [b for b in wanted if b not in have]
        if missing:
            runs: list[list[int]] = []
            for b in missing:
                if runs and runs[-1][-1] == b - 1:
                    runs[-1].append(b)
                else:
                    runs.append([b])
            ranges = [(run[0] * BLOCK, min((run[-1] + 1) * BLOCK, self.size) - run[0] * BLOCK) for run in runs]
            for run, raw in zip(runs, self._get_many(ranges), strict=True):
                for k, b in enumerate(run):
                    have[b] = raw[k * BLOCK: (k + 1) * BLOCK]
            with self._lock:
                for b in missing:
                    self._blocks[b] = have[b]
                while len(self._blocks) > self._cache_blocks:
                    self._blocks.popitem(last=False)
        return [have[b] for b in wanted]

    def _fill(self, out: np.ndarray, ranges: list[tuple[int, int, int]]) -> None:
        """Fetch each ``(offset, length, position)`` into ``out[position:]``, in `PART`s, several in flight."""
        self._run(lambda part: self._part(out, part), _parts(ranges))

    def _part(self, out: np.ndarray, part: tuple[int, int, int]) -> None:
        offset, length, at = part
        fetch_into = self._fetch_into
        if fetch_into is None:
            out[at: at + length] = np.frombuffer(self._get(offset, length), np.uint8)
            return
        self.check()
        into = memoryview(out)[at: at + length]  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
        got = retrying(lambda: fetch_into(offset, offset + length, into), self.path, offset, length)
        self.traffic.add(got)
        self._check_length(offset, length, got)

    def _segment(self, pieces: list[tuple[int, int, np.ndarray, int]]) -> None:
        """Fetch one range that covers `pieces` (``(offset, length, array, position)``, in file order)
        into their arrays: the arrays' pages faulted in first, then one request, its answer written
        into them as it arrives (bytes between pieces dropped)."""
        for _, length, out, at in pieces:
            populate(out[at: at + length])
        if len(pieces) == 1:
            offset, length, out, at = pieces[0]
            self._part(out, (offset, length, at))
            return
        start, stop = pieces[0][0], pieces[-1][0] + pieces[-1][1]
        fetch_into = self._fetch_into
        if fetch_into is None:
            raw = np.frombuffer(self._get(start, stop - start), np.uint8)
            for offset, length, out, at in pieces:
                out[at: at + length] = raw[offset - start: offset - start + length]
            return
        self.check()
        got = retrying(lambda: fetch_into(start, stop, _Scatter(start, stop, pieces)), self.path, start, stop - start)
        self.traffic.add(got)
        self._check_length(start, stop - start, got)

    def _get_many(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Each range, exactly: in one wave on an event loop where the transport has one
        (``fetch_many``), those it did not bring (any failure) asked again alone, with retries."""
        if len(ranges) == 1:
            return [self._get(*ranges[0])]
        results: list[bytes | None] = [None] * len(ranges)
        if self._fetch_many is not None and len(ranges) <= MANY:
            self.check()
            try:
                results = list(self._fetch_many(ranges))
            except Exception:  # noqa: BLE001 - every range is asked again alone below, its error reported there
                results = [None] * len(ranges)
            for (_, length), got in zip(ranges, results, strict=True):
                if got is not None and len(got) == length:
                    self.traffic.add(length)
        missing = [k for k, (got, (_, length)) in enumerate(zip(results, ranges, strict=True))
                   if got is None or len(got) != length]

        def one(k: int) -> None:
            results[k] = self._get(*ranges[k])

        self._run(one, missing)
        return results  # type: ignore[return-value]  # (every None was asked again by `one`, which raises or fills it)

    def _run(self, job: Callable[[Any], None], items: Iterable[Any]) -> None:
        """`job` on every item: here when one, else on the fetch pool (not from a pool thread: that could
        wait on itself); the first error is raised once all are done."""
        items = list(items)
        if len(items) == 1 or threading.current_thread().name.startswith("weightio-fetch"):
            for item in items:
                job(item)
            return
        futures = [pool().submit(job, item) for item in items]
        errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error

    def _get(self, offset: int, length: int) -> bytes:
        """One range, with retries of transient failures; exactly `length` bytes or an error."""
        self.check()
        raw = retrying(lambda: self._fetcher(offset, offset + length), self.path, offset, length)
        self.traffic.add(len(raw))
        self._check_length(offset, length, len(raw))
        return bytes(raw) if not isinstance(raw, bytes) else raw

    def _check_length(self, offset: int, length: int, got: int) -> None:
        if got > length:
            raise InputError(f"the server ignores Range requests: it answered {got:,} bytes for a range of "
                             f"{length:,}", path=self.path)
        if got < length:
            raise CorruptFileError(f"changed since it was opened: bytes {offset}..{offset + length} came back "
                                   f"{got} bytes long (the file was {self.size} bytes); open it again", path=self.path)


class _Scatter:
    """Where one request's answer goes when it covers several arrays: ``scatter[a:b] = chunk``
    writes the answer's bytes ``a..b`` into the arrays that hold them (bytes between them dropped);
    ``len()`` is the answer's length. Chunks arrive in order, so a cursor finds their arrays."""

    def __init__(self, start: int, stop: int, pieces: list[tuple[int, int, np.ndarray, int]]) -> None:
        self._length = stop - start
        self._pieces = [(offset - start, offset - start + length, memoryview(out)[at: at + length])  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
                        for offset, length, out, at in pieces]
        self._next = 0

    def __len__(self) -> int:
        return self._length

    def __setitem__(self, where: slice, chunk: bytes | memoryview) -> None:
        a, b = where.start, where.stop
        pieces = self._pieces
        k = self._next if self._next < len(pieces) and pieces[self._next][0] <= a else 0
        while k < len(pieces) and pieces[k][1] <= a:
            k += 1
        self._next = k
        source = memoryview(chunk)
        while k < len(pieces) and pieces[k][0] < b:
            low, high, target = pieces[k]
            x, y = max(a, low), min(b, high)
            target[x - low: y - low] = source[x - a: y - a]
            if high > b:
                break
            k += 1


def _segments(ranges: list[tuple[int, int, np.ndarray]]) -> list[list[tuple[int, int, np.ndarray, int]]]:
    """``(offset, length, array)`` ranges as requests: each cut into `PART`-sized pieces
    ``(offset, length, array, position)``, then pieces that follow each other in the file (closer
    than `GAP`) joined while the request stays within `PART` bytes."""
    segments: list[list[tuple[int, int, np.ndarray, int]]] = []
    for offset, length, out in ranges:
        for k in range(0, length, PART):
            piece = (offset + k, min(PART, length - k), out, k)
            if segments:
                first, last = segments[-1][0], segments[-1][-1]
                end = last[0] + last[1]
                if 0 <= piece[0] - end <= GAP and piece[0] + piece[1] - first[0] <= PART:
                    segments[-1].append(piece)
                    continue
            segments.append([piece])
    return segments


def _parts(ranges: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(offset, length, position)`` ranges cut into `PART`-sized pieces of the same shape."""
    return [(offset + k, min(PART, length - k), at + k)
            for offset, length, at in ranges for k in range(0, length, PART)]


