"""HTTP(S) by ranges on fsspec's event loop (aiohttp): what `weightio.remote` asks of a file when it
finds it, and waves of ranges sent before any answer is parsed.

* `first_reads`: how many first and last bytes to ask of a file when it is found, by its name;
* `probe`, `probe_all`: find HTTP(S) files by their first ranged GET (its ``Content-Range`` gives
  the size: no ``HEAD``), the last bytes of a zip-like name asked at the same time by a suffix range;
* `wave`: many ranges of one URL (or of many) in flight at once on one event loop, each answer
  checked (``206``, the exact length) and None where it is not what was asked (the caller asks
  that one again alone, with its retries and error reporting: see `weightio._remote`).

aiohttp costs ~0.2 ms of CPU per request where httpx's async client costs ~0.8 (measured on
loopback), which is what decides whether a hundred requests leave within one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._failures import Failure, redact
from ._remote import BLOCK
from .errors import InputError, UsageError

__all__ = ["Found", "first_reads", "gather", "has_aiohttp", "http_filesystem", "probe", "probe_all", "probe_async",
           "read_up_to", "total_size", "wave"]

_SHORT_HEAD = 4096  # the first bytes fetched of an .npy or .npz: its .npy header (numpy writes 128 bytes and
# more only for record dtypes) and an archive's first local header; the rest of the first block is data
_TAIL = 16 << 10  # the last bytes fetched with the first of a file named as a zip: its end records and, up
# to a few hundred members, its whole central directory (the rest of a larger one comes next, exactly)
_ZIP_NAMES = (".npz", ".pt", ".pth", ".ckpt", ".zip", ".bin")  # what torch.save and numpy.savez are named (a
# .bin may be ggml's or a legacy pickle instead: 16 KiB wasted then, against two round trips saved for torch's)
_SHORT_NAMES = (".npz", ".npy")


def first_reads(name: str) -> tuple[int, int]:
    """(first bytes, last bytes) to fetch of a remote file named `name` when it is found, in flight
    together: a whole `BLOCK` first (a safetensors or GGUF header, a torch archive's ``data.pkl``),
    only `_SHORT_HEAD` of numpy's files; the last `_TAIL` bytes too of a name a zip archive has (its
    end is read next: ``pytorch_model.bin`` included). Only a guess from the name: a reader asks for
    anything else it needs. Where the size is known first, the caller asks only the last bytes that
    do not overlap the first."""
    name = name.lower().rsplit("?", 1)[0]
    head = _SHORT_HEAD if name.endswith(_SHORT_NAMES) else BLOCK
    return head, (_TAIL if name.endswith(_ZIP_NAMES) else 0)


@dataclass
class Found:
    """What finding a file told: its filesystem's info (``size``, ``ETag``, ``type``, ``mimetype``)
    and, where the requests that found it brought them, its first bytes (``asked``: how many were
    asked) and last bytes (see `probe`)."""

    info: dict[str, Any]
    first: bytes | None = None
    asked: int = BLOCK
    last: bytes | None = None


def probe(fs: Any, path: str, url: str) -> Found:
    """GET the first `BLOCK` of an HTTP file through fsspec's own session: its ``Content-Range``
    gives the size, so the file is found and its header block fetched in one round trip. A server
    that answers 200 with a body larger than the block ignores ``Range``: refused, body unread."""
    from fsspec.asyn import sync

    return sync(fs.loop, probe_async, fs, path, url)


def probe_all(fs: Any, items: list[tuple[str, str]]) -> list[Found | None]:
    """`probe` of every ``(path, url)`` at once, on fsspec's event loop: one wave of requests, sent
    before any answer is parsed. None where one failed (it is found again alone, with retries)."""
    from fsspec.asyn import sync

    async def every() -> list[Any]:
        return await gather(*(probe_async(fs, p, u) for p, u in items))

    return [r if isinstance(r, Found) else None for r in sync(fs.loop, every)]


async def probe_async(fs: Any, path: str, url: str) -> Found:
    """`probe`; for a name that may be a zip (`first_reads`), the file's last bytes are asked at
    the same time by a suffix range (``bytes=-n``, which needs no size), and kept when that answer
    agrees with the first's (the same size and ETag)."""
    head, tail = first_reads(path)
    if not tail:
        return await _probe_first(fs, path, url, head)
    found, last = await gather(_probe_first(fs, path, url, head), _probe_last(fs, path, tail))
    if isinstance(found, BaseException):
        raise found
    if isinstance(last, tuple) and last[1] == found.info.get("size") and last[2] == found.info.get("ETag") \
            and len(last[0]) == min(tail, last[1]):
        found.last = last[0]
    return found


async def _probe_last(fs: Any, path: str, tail: int) -> tuple[bytes, int, str | None] | None:
    """(the last `tail` bytes, the file's size, its ETag) by a suffix range; None when not answered so."""
    session = await fs.set_session()
    kwargs = dict(fs.kwargs)
    headers = dict(kwargs.pop("headers", None) or {}) | {"Range": f"bytes=-{tail}"}
    async with session.get(fs.encode_url(path), headers=headers, **kwargs) as response:
        size = total_size(response.headers.get("Content-Range", "")) if response.status == 206 else None
        if size is None:
            return None  # not read: an unranged answer is not fetched whole
        return await read_up_to(response.content.read, min(tail, size) + 1), size, response.headers.get("ETag")


async def gather(*awaitables: Any) -> list[Any]:
    """``asyncio.gather(*awaitables, return_exceptions=True)``. asyncio is imported here, on fsspec's
    event loop (which has imported it already), not with the module: ``import weightio.remote``, which
    the command line makes for every command, would otherwise pay ~45 ms for it (ssl included)."""
    import asyncio

    return await asyncio.gather(*awaitables, return_exceptions=True)


async def read_up_to(read: Any, limit: int) -> bytes:
    """Up to `limit` bytes of a body by its ``await read(n)``, which answers what has arrived, at most
    n bytes (aiohttp's, aiobotocore's): one call may bring part of a small answer under load."""
    parts, got = [], 0
    while got < limit:
        more = await read(limit - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


async def _probe_first(fs: Any, path: str, url: str, first: int) -> Found:
    session = await fs.set_session()
    kwargs = dict(fs.kwargs)
    headers = dict(kwargs.pop("headers", None) or {}) | {"Range": f"bytes=0-{first - 1}"}
    try:
        request = session.get(fs.encode_url(path), headers=headers, **kwargs)
    except TypeError as e:  # an option aiohttp does not take
        raise UsageError(f"storage_options rejected by the HTTP filesystem: {e}", path=redact(url)) from None
    async with request as response:
        if response.status == 416:  # nothing satisfies bytes=0-: an empty file
            return Found({"size": 0, "type": "file"})
        response.raise_for_status()
        kind = response.headers.get("Content-Type", "")
        etag = response.headers.get("ETag")
        if response.status != 206 and kind.startswith("text/html"):  # an index page: a folder, not read
            return Found({"type": "file", "mimetype": kind, "size": None})
        length = response.headers.get("Content-Length")
        if response.status == 206:
            size = total_size(response.headers.get("Content-Range", ""))
            if size is None:
                raise InputError("the server answered a range without the file's size (Content-Range "
                                 f"{response.headers.get('Content-Range')!r})", path=redact(url))
        elif length is not None and length.isdigit() and int(length) <= first:
            size = int(length)  # the whole file is smaller than the range: that is its size
        else:
            raise Failure(None, "", transient=False, ignores_range=True).error(redact(url))
        if length is not None and length.isdigit() and int(length) > min(first, size):
            raise InputError(f"the server answered {int(length):,} bytes to a range of {min(first, size):,}",
                             path=redact(url))
        got = await read_up_to(response.content.read, min(first, size))  # short: RemoteFile says the file changed
        return Found({"size": size, "type": "file", "ETag": etag, "mimetype": kind}, got, first)


def total_size(content_range: str) -> int | None:
    """The size after the slash of ``Content-Range: bytes a-b/size``; None when absent or ``*``."""
    unit, _, rest = content_range.partition(" ")
    total = rest.rpartition("/")[2]
    return int(total) if unit == "bytes" and total.isdigit() else None


def has_aiohttp() -> bool:
    """Whether aiohttp is installed (found, not imported: its import costs ~80 ms, paid at first use)."""
    import importlib.util

    return importlib.util.find_spec("aiohttp") is not None


def http_filesystem() -> Any | None:
    """fsspec's HTTP filesystem (its event loop and aiohttp session), or None without aiohttp."""
    if not has_aiohttp():
        return None
    import fsspec

    return fsspec.filesystem("http")


def wave(fs: Any, asks: Sequence[tuple[str, dict[str, str], int, int]]) -> list[tuple[bytes, str] | None]:
    """Every ``(url, headers, start, stop)`` asked at once on `fs`'s event loop: per ask, the bytes
    and the URL that answered them (after redirects), or None where the answer was not exactly
    those bytes (any error, another status than ``206``, another length)."""
    from fsspec.asyn import sync

    async def every() -> list[Any]:
        session = await fs.set_session()
        return await gather(*(get_range(session, *ask) for ask in asks))

    return [r if isinstance(r, tuple) else None for r in sync(fs.loop, every)]


async def get_range(session: Any, url: str, headers: dict[str, str], start: int, stop: int) -> tuple[bytes, str] | None:
    """Bytes `start`..`stop` of `url` by one ranged GET (redirects followed; aiohttp drops the
    ``Authorization`` header for another host), and the URL that answered; None unless exactly those."""
    async with session.get(url, headers=headers | {"Range": f"bytes={start}-{stop - 1}"}) as response:
        if response.status != 206:
            return None
        got = await read_up_to(response.content.read, stop - start + 1)
        return (got, str(response.url)) if len(got) == stop - start else None
