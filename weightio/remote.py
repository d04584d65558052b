"""Opening checkpoints by URL: ``hf://``, ``https://``, ``s3://`` and any other fsspec filesystem.

A URL names a file, a sharded set (its ``*.index.json``) or a folder laid out like a model
directory (the same `weightio.layout` rules as a local one). Each weight file becomes a
`weightio._remote.RemoteFile` read by byte ranges; the headers of a sharded set's files are read
concurrently. Where the files come from:

* ``hf://org/repo[@rev][/path]``: listed through ``huggingface_hub`` (``HF_ENDPOINT``, tokens,
  ``HF_HUB_OFFLINE``: see `weightio.hub`); a file the local Hub cache already holds is mapped
  from there, the others are read by range from the commit the revision pointed to (so a file
  cannot change between two reads), through ``huggingface_hub``'s own HTTP session;
* any other URL: through fsspec (``url_to_fs``): its HTTP filesystem (needs ``aiohttp``),
  ``s3fs`` for ``s3://`` (the AWS credential chain applies), or whatever filesystem is installed
  for the scheme. ``storage_options`` go to the filesystem as they are.

``download=True`` (hf:// only) instead fetches the weights whole into the Hub cache, with the
repo's config and tokenizer files, and maps them: what transformers then finds offline.
"""

from __future__ import annotations

import asyncio
import contextvars
import posixpath
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import layout
from ._json import parse_json_object
from ._remote import BLOCK, Failure, RemoteFile, is_url, pool, redact, retrying
from .errors import DOWNLOAD_ADVICE, STORAGE_OPTIONS_ADVICE, FormatError, InputError, MissingDependencyError, UsageError
from .formats import Reader, open_file

__all__ = ["Opened", "filesystem", "is_folder", "is_url", "open_url", "redact", "remote_file",
           "traffic"]

_OPENERS = 128  # files opened (their headers fetched) at once
_WAVE = 8  # more Hub files than this are probed on an event loop (its client costs ~20 ms to make: worth it
# for many shards, not for a few, which threads open as fast on the HTTP session the listing already made)
_SHORT_HEAD = 4096  # the first bytes fetched of an .npy or .npz: its .npy header (numpy writes 128 bytes and
# more only for record dtypes) and an archive's first local header; the rest of the first block is data
_TAIL = 16 << 10  # the last bytes fetched with the first of a file named as a zip: its end records and, up
# to a few hundred members, its whole central directory (the rest of a larger one comes next, exactly)
_END = 22 + 20 + 56  # a zip's end records (the ZIP64 ones included): all a .bin gets (torch's, or ggml's)
_ZIP_NAMES = (".npz", ".pt", ".pth", ".ckpt", ".zip")  # what torch.save and numpy.savez are named
_SHORT_NAMES = (".npz", ".npy")


def first_reads(name: str, *, sized: bool = True) -> tuple[int, int]:
    """(first bytes, last bytes) to fetch of a remote file named `name` when it is found, in flight
    together: a whole `BLOCK` first (a safetensors or GGUF header, a torch archive's ``data.pkl``),
    only `_SHORT_HEAD` of numpy's files; the last `_TAIL` bytes too of a name a zip archive has (its
    end is read next), and the end records alone of a ``.bin`` (torch's zip, or a ggml file: few
    bytes wasted) where the size is known first (`sized`: the last bytes then never overlap the
    first). Only a guess from the name: a reader asks for anything else it needs."""
    name = name.lower().rsplit("?", 1)[0]
    head = _SHORT_HEAD if name.endswith(_SHORT_NAMES) else BLOCK
    return head, (_TAIL if name.endswith(_ZIP_NAMES) else _END if sized and name.endswith(".bin") else 0)


@dataclass
class Opened:
    """What a URL opened to, for `weightio.checkpoint` to make one `Checkpoint` of.

    Attributes:
        path: the URL as shown (credentials removed).
        readers: the files' readers, in order.
        sharded: for a sharded set, ``(index label, weight_map, index metadata, shard_of)``
            (`weightio.checkpoint.open_sharded_set`'s arguments); else None.
        local: with ``download=True``: the local path to open instead (nothing is open).
    """

    path: str
    readers: list[Reader]
    sharded: tuple[str, dict[str, str], dict[str, Any], dict[str, str]] | None = None
    local: str | None = None


def open_url(url: str, *, storage_options: Mapping[str, Any] | None = None, download: bool = False) -> Opened:
    """Open the files of the checkpoint at `url` (see the module docstring).

    Raises:
        InputError: the URL cannot be read (not found, access denied, server errors after retries).
        MissingDependencyError: the scheme's fsspec filesystem is not installed.
        UsageError: an unknown scheme, or ``download=True`` for a URL that is not ``hf://``.
    """
    options = dict(storage_options or {})
    if url.startswith("hf://"):
        return _open_hub(url, options, download)
    if download:
        raise UsageError("downloading into the Hugging Face cache applies to hf:// paths only; other URLs are "
                         "read by range, or copied with `weightio convert URL model.safetensors`",
                         path=redact(url), advice=DOWNLOAD_ADVICE)
    fs, path = _filesystem(url, options)
    found = None if url.endswith("/") else _find(fs, path, url)
    if found is None or _names_folder(found.info):
        return _open_folder(fs, path, url)
    if path.endswith(".index.json"):
        return _open_index(fs, path, url, found)
    first = open_file(_fsspec_file(fs, path, url, found))
    siblings = _siblings(first, lambda u: _fsspec_file(fs, _fs_path(fs, u), u))
    return Opened(redact(url), [first, *siblings])


def traffic(checkpoint: Any) -> tuple[int, int]:
    """``(requests, bytes)`` the checkpoint's remote files have cost so far; (0, 0) for local files."""
    requests = nbytes = 0
    for reader in checkpoint.readers:
        file = reader.file
        if getattr(file, "remote", False):
            requests += file.traffic.requests
            nbytes += file.traffic.bytes
    return requests, nbytes


def filesystem(url: str, *, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of a URL that is not ``hf://``, and the path in it (errors as `open_url`'s)."""
    return _filesystem(url, dict(storage_options or {}))


def remote_file(url: str, *, storage_options: Mapping[str, Any] | None = None) -> RemoteFile:
    """One file at a URL that is not ``hf://``, read by range and not parsed (what `weightio.scan` reads)."""
    fs, path = _filesystem(url, dict(storage_options or {}))
    return _fsspec_file(fs, path, url)


# ----------------------------------------------------------------------------- the Hub


def _open_hub(url: str, options: dict[str, Any], download: bool) -> Opened:
    from . import hub

    if options:
        raise UsageError("fsspec storage options do not apply to hf:// paths: huggingface_hub reads HF_TOKEN, "
                         "HF_ENDPOINT and its own login", path=url, advice=STORAGE_OPTIONS_ADVICE)
    if download:
        return Opened(url, [], local=hub.download(url))
    sources, index = hub.remote_sources(url)
    remote = [s for s in sources if not isinstance(s, str)]
    found = dict(zip((s.filename for s in remote), _hub_probe_all(remote), strict=True)) \
        if len(remote) > _WAVE else {}  # a few files: each on a thread of its own, on the session the listing made
    files: list[Callable[[], Any]] = [
        (lambda s=s: s) if isinstance(s, str) else (lambda s=s: _hub_file(s, found.get(s.filename))) for s in sources]
    if index is None:
        return Opened(url, _open_all(files))
    names = {(s if isinstance(s, str) else s.uri): _shard_name(s) for s in sources}
    return Opened(url, _open_all(files), (*index, names))


def _shard_name(source: Any) -> str:
    return posixpath.basename(source if isinstance(source, str) else source.filename)


def _hub_probe_all(files: list[Any]) -> list[tuple[bytes, str, bytes | None] | None]:
    """The first bytes of every `weightio.hub.HubFile` (and its last, as `first_reads` says), and
    where the Hub redirected each (its CDN), all asked at once on one event loop (huggingface_hub's
    async client: one wave of requests, sent before any answer is parsed). None where one failed:
    that file is read alone, with retries."""
    try:
        from huggingface_hub.utils import build_hf_headers, get_async_session
    except ImportError:  # a huggingface_hub without an async client: each file is read alone
        return [None] * len(files)
    headers = build_hf_headers()

    async def part(client: Any, file: Any, start: int, stop: int) -> tuple[bytes, str] | None:
        ask = headers | {"Range": f"bytes={start}-{stop - 1}"}
        async with client.stream("GET", file.url(), headers=ask, follow_redirects=True) as response:
            if response.status_code != 206:
                return None
            got = await response.aread()
            return (got, str(response.url)) if len(got) == stop - start else None

    async def one(client: Any, file: Any) -> tuple[bytes, str, bytes | None] | None:
        head, tail = first_reads(file.filename)
        tail = max(0, min(tail, file.size - head))  # never the first bytes again
        asked = [part(client, file, 0, min(head, file.size))] + ([part(client, file, file.size - tail, file.size)]
                                                                 if tail else [])
        got = await asyncio.gather(*asked)
        if any(g is None for g in got):
            return None
        return got[0][0], got[0][1], got[1][0] if tail else None  # type: ignore[index]

    async def every() -> list[Any]:
        async with get_async_session() as client:
            return await asyncio.gather(*(one(client, f) for f in files), return_exceptions=True)

    with ThreadPoolExecutor(1, thread_name_prefix="weightio-open") as loop:  # a loop of its own: the
        results = loop.submit(asyncio.run, every()).result()  # caller may be inside one (a notebook)
    return [r if isinstance(r, tuple) else None for r in results]


def _hub_file(file: Any, found: tuple[bytes, str, bytes | None] | None = None) -> RemoteFile:
    """A `weightio.hub.HubFile` read by range through huggingface_hub's HTTP session (`found`: its
    first block and CDN address, where `_hub_probe_all` fetched them)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = file.url()
    session = get_session()
    headers = build_hf_headers()  # the token (HF_TOKEN, hf auth login) for the endpoint; never shown
    # where the Hub redirected the file (its CDN): later ranges go straight there
    direct: list[str] = [found[1]] if found is not None and found[1] != url else []

    def stream(start: int, stop: int, into: memoryview | None) -> bytes | int:
        """Bytes `start`..`stop`: returned, or written into `into` (their count returned)."""
        target = direct[0] if direct else url
        ask = {"Range": f"bytes={start}-{stop - 1}"} | ({} if direct else headers)
        with session.stream("GET", target, headers=ask, follow_redirects=True) as response:
            if response.status_code in (401, 403) and direct:  # a signed CDN URL expired: back to the Hub
                direct.clear()
                return stream(start, stop, into)
            if response.status_code == 200 and stop - start < file.size:
                raise ValueError("The HTTP server doesn't appear to support range requests")
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            if not direct and str(response.url) != url:
                direct.append(str(response.url))
            if into is None:
                return response.read()
            got = 0
            for chunk in response.iter_bytes():
                if got + len(chunk) > len(into):  # more than asked: counted, not written (the caller refuses)
                    return got + len(chunk)
                into[got: got + len(chunk)] = chunk
                got += len(chunk)
            return got

    head, tail = first_reads(file.filename)
    remote = RemoteFile(file.uri, lambda start, stop: stream(start, stop, None), file.size,  # type: ignore[arg-type,return-value]
                        fetch_into=lambda start, stop, into: stream(start, stop, into),  # type: ignore[arg-type,return-value]
                        first=None if found is None else found[0], first_asked=head,
                        last=None if found is None else found[2])
    if found is None and (tail or head < BLOCK):
        _primed(remote, head, tail)
    return remote


def _primed(file: RemoteFile, head: int, tail: int) -> None:
    """`RemoteFile.prime`, closing the file when it fails."""
    try:
        file.prime(head, tail)
    except BaseException:
        file.close()
        raise


# ----------------------------------------------------------------------------- fsspec


def _filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise MissingDependencyError("fsspec", purpose="read checkpoints by URL") from None
    if url.split("://", 1)[0].lower() in ("s3", "s3a"):  # botocore's pool (10) would queue a sharded open
        config = dict(options.get("config_kwargs") or {})
        options = options | {"config_kwargs": {"max_pool_connections": _OPENERS} | config}
    try:
        return url_to_fs(url, **options)
    except ImportError as e:
        package = {"s3": "s3fs", "s3a": "s3fs", "http": "aiohttp", "https": "aiohttp", "gs": "gcsfs",
                   "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(url.split("://", 1)[0].lower())
        extra = {"s3fs": "s3", "aiohttp": "http"}.get(package or "")
        raise MissingDependencyError(package or str(e), extra=extra, purpose="read this URL") from None
    except ValueError as e:
        raise UsageError(f"cannot read this URL: {e}", path=redact(url)) from None
    except TypeError as e:
        raise UsageError(f"storage options rejected by the filesystem: {e}", path=redact(url)) from None


def is_folder(fs: Any, path: str, url: str) -> bool:
    """Whether `url` (`path` in `fs`) names a folder: it ends in "/", its filesystem says it is a
    directory, or (HTTP, which has no directories) the server answers an HTML index page."""
    return url.endswith("/") or _names_folder(_info(fs, path, url))


def _names_folder(info: dict[str, Any]) -> bool:
    return info.get("type") == "directory" or str(info.get("mimetype", "")).startswith("text/html")


def _info(fs: Any, path: str, url: str) -> dict[str, Any]:
    return retrying(lambda: fs.info(path), url)


@dataclass
class _Found:
    """What finding a file told: its filesystem's info (``size``, ``ETag``, ``type``, ``mimetype``)
    and, where the requests that found it brought them, its first bytes (``asked``: how many were
    asked) and last bytes (see `_probe`)."""

    info: dict[str, Any]
    first: bytes | None = None
    asked: int = BLOCK
    last: bytes | None = None


def _find(fs: Any, path: str, url: str) -> _Found:
    """Size and ETag of a file: over HTTP by its first ranged GET (`_probe`: one request instead of
    a HEAD and a GET), elsewhere by the filesystem's ``info``."""
    if _is_http(fs):
        return retrying(lambda: _probe(fs, path, url), url)
    return _Found(_info(fs, path, url))


def _probe(fs: Any, path: str, url: str) -> _Found:
    """GET the first `BLOCK` of an HTTP file through fsspec's own session: its ``Content-Range``
    gives the size, so the file is found and its header block fetched in one round trip. A server
    that answers 200 with a body larger than the block ignores ``Range``: refused, body unread."""
    from fsspec.asyn import sync

    return sync(fs.loop, _probe_async, fs, path, url)


def _probe_all(fs: Any, items: list[tuple[str, str]]) -> list[_Found | None]:
    """`_probe` of every ``(path, url)`` at once, on fsspec's event loop: one wave of requests, sent
    before any answer is parsed. None where one failed (it is found again alone, with retries)."""
    from fsspec.asyn import sync

    async def every() -> list[Any]:
        return await asyncio.gather(*(_probe_async(fs, p, u) for p, u in items), return_exceptions=True)

    return [r if isinstance(r, _Found) else None for r in sync(fs.loop, every)]


async def _probe_async(fs: Any, path: str, url: str) -> _Found:
    """`_probe`; for a name that may be a zip (`first_reads`), the file's last bytes are asked at
    the same time by a suffix range (``bytes=-n``, which needs no size), and kept when that answer
    agrees with the first's (the same size and ETag)."""
    head, tail = first_reads(path, sized=False)
    if not tail:
        return await _probe_first(fs, path, url, head)
    found, last = await asyncio.gather(_probe_first(fs, path, url, head), _probe_last(fs, path, tail),
                                       return_exceptions=True)
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
        size = _total_size(response.headers.get("Content-Range", "")) if response.status == 206 else None
        if size is None:
            return None  # not read: an unranged answer is not fetched whole
        return await _body(response, min(tail, size) + 1), size, response.headers.get("ETag")


async def _body(response: Any, limit: int) -> bytes:
    """Up to `limit` bytes of an aiohttp answer's body (fewer when it ends first)."""
    got = b""
    while len(got) < limit:
        more = await response.content.read(limit - len(got))
        if not more:
            break
        got += more
    return got


async def _probe_first(fs: Any, path: str, url: str, first: int) -> _Found:
    session = await fs.set_session()
    kwargs = dict(fs.kwargs)
    headers = dict(kwargs.pop("headers", None) or {}) | {"Range": f"bytes=0-{first - 1}"}
    try:
        request = session.get(fs.encode_url(path), headers=headers, **kwargs)
    except TypeError as e:  # an option aiohttp does not take
        raise UsageError(f"storage_options rejected by the HTTP filesystem: {e}", path=redact(url)) from None
    async with request as response:
        if response.status == 416:  # nothing satisfies bytes=0-: an empty file
            return _Found({"size": 0, "type": "file"})
        response.raise_for_status()
        kind = response.headers.get("Content-Type", "")
        etag = response.headers.get("ETag")
        if response.status != 206 and kind.startswith("text/html"):  # an index page: a folder, not read
            return _Found({"type": "file", "mimetype": kind, "size": None})
        length = response.headers.get("Content-Length")
        if response.status == 206:
            size = _total_size(response.headers.get("Content-Range", ""))
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
        got = await _body(response, min(first, size))  # a short body is caught by RemoteFile (the file changed)
        return _Found({"size": size, "type": "file", "ETag": etag, "mimetype": kind}, got, first)


def _total_size(content_range: str) -> int | None:
    """The size after the slash of ``Content-Range: bytes a-b/size``; None when absent or ``*``."""
    unit, _, rest = content_range.partition(" ")
    total = rest.rpartition("/")[2]
    return int(total) if unit == "bytes" and total.isdigit() else None


def _is_http(fs: Any) -> bool:
    return "http" in _protocols(fs)


def _fsspec_file(fs: Any, path: str, url: str, found: _Found | None = None) -> RemoteFile:
    """A file of an fsspec filesystem read by range through its own file object's range fetcher."""
    found = found if found is not None else _find(fs, path, url)
    info = found.info
    if info.get("type") == "directory" or _names_folder(info):
        raise InputError("is a folder, not a file", path=redact(url))
    size = info.get("size")
    if not isinstance(size, int):
        raise InputError("the server does not say how large the file is (no Content-Length): weightio reads "
                         "remote files by range only", path=redact(url))
    etag = info.get("ETag") or info.get("etag")
    options: dict[str, Any] = {}
    if _is_http(fs):
        # size given: no HEAD; If-Match: a file replaced on the server answers 412, not new bytes
        headers = dict(fs.kwargs.get("headers") or {}) | ({"If-Match": etag} if etag else {})
        options = {"size": size, "headers": headers}
    elif _protocols(fs)[0] in ("s3", "s3a"):
        options = {"size": size}  # s3fs's files take the size, and (below) the info, instead of a HEAD
    handle = retrying(lambda: fs.open(path, "rb", cache_type="none", **options), url)
    if not _is_http(fs) and "name" in info and getattr(handle, "_details", False) is None:
        handle.details = info  # what the file would HEAD for on its first read
        if etag and isinstance(getattr(handle, "read_kw", None), dict) and not getattr(fs, "local_expiry_check", 1):
            handle.read_kw = handle.read_kw | {"IfMatch": etag}  # as s3fs does when it HEADs itself
    fetch = getattr(handle, "_fetch_range", None)  # fsspec's buffered files all have one
    given = {"etag": etag, "first": found.first, "first_asked": found.asked, "last": found.last}
    if fetch is None:  # a filesystem whose files do not: its cat_file takes a range
        handle.close()
        file = RemoteFile(url, lambda start, stop: fs.cat_file(path, start=start, end=stop), size, **given)
    else:
        file = RemoteFile(url, fetch, size, close=handle.close, **given)
    head, tail = first_reads(path)
    if found.first is None and (tail or head < BLOCK):  # found by a listing or HEAD: both asked now, together
        _primed(file, head, tail)
    return file


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _fs_path(fs: Any, url: str) -> str:
    return fs._strip_protocol(url)


def _url_of(fs: Any, path: str, like: str) -> str:
    """The URL of `path` in `fs`, in the scheme the user wrote (`like`)."""
    if "://" in path:
        return path
    return like.split("://", 1)[0] + "://" + path


def _sized(entry: dict[str, Any]) -> _Found | None:
    """A listing's entry as what finding its file would tell, when it gives the size (s3, gcs…; an
    HTTP index page does not)."""
    return _Found(entry) if entry.get("type") == "file" and isinstance(entry.get("size"), int) else None


def _open_folder(fs: Any, path: str, url: str) -> Opened:
    entries = retrying(lambda: fs.ls(path, detail=True), url)
    files = {posixpath.basename(e["name"].rstrip("/")): e for e in entries if e.get("type") == "file"}
    try:
        chosen = layout.choose(sorted(files))
    except layout.Ambiguous as e:
        raise FormatError(f"holds several candidate files ({e}); open one of them by URL", path=redact(url)) from None
    if chosen is None:
        shown = ", ".join(sorted(files)[:8]) or "nothing"
        raise FormatError(f"is a folder with no weight files weightio recognises (found: {shown})", path=redact(url))
    entry = files[chosen]
    child = _url_of(fs, entry["name"], url)
    if chosen.endswith(".index.json"):
        return _open_index(fs, entry["name"], child, _sized(entry), files)
    first = open_file(_fsspec_file(fs, entry["name"], child, _sized(entry)))
    siblings = _siblings(first, lambda u: _fsspec_file(fs, _fs_path(fs, u), u))
    return Opened(redact(url), [first, *siblings])


def _open_index(fs: Any, path: str, url: str, found: _Found | None = None,
                listing: dict[str, dict[str, Any]] | None = None) -> Opened:
    """A sharded set by its index: the index read while its folder is listed (sizes and ETags of
    every shard in one request, where the filesystem lists them), then every shard opened at once,
    each in one request (a listed size, or over HTTP a first ranged GET that brings it)."""
    folder = url.rsplit("/", 1)[0]
    listed = None
    if listing is None and not _is_http(fs):
        listed = pool().submit(_listing, fs, path.rsplit("/", 1)[0])
    index = _fsspec_file(fs, path, url, found)
    try:
        raw = index.read(0, index.size, "the index")
    finally:
        index.close()
    weight_map, metadata = _parse_index(raw, redact(url))
    if listed is not None:
        listing = listed.result()
    shards = layout.shards(weight_map)
    urls = {f"{folder}/{s}": s for s in shards}
    known = {u: _sized((listing or {}).get(s, {})) for u, s in urls.items()}
    if _is_http(fs) and len(urls) > 1:  # every shard's first GET out at once, then parsed
        known = dict(zip(urls, _probe_all(fs, [(_fs_path(fs, u), u) for u in urls]), strict=True))
    files = [(lambda u=u: _fsspec_file(fs, _fs_path(fs, u), u, known[u])) for u in urls]
    return Opened(redact(folder), _open_all(files),
                  (redact(url), weight_map, metadata, {redact(u): s for u, s in urls.items()}))


def _listing(fs: Any, folder: str) -> dict[str, dict[str, Any]]:
    """The files of `folder` by name, with what the filesystem lists of each; empty when it cannot be
    listed (a bucket policy may allow reading objects but not listing them: the shards are then found
    one by one)."""
    try:
        entries = fs.ls(folder, detail=True)
    except Exception:  # noqa: BLE001 - a listing is only a shortcut
        return {}
    return {posixpath.basename(e["name"].rstrip("/")): e for e in entries
            if isinstance(e, dict) and isinstance(e.get("name"), str)}


def _parse_index(raw: bytes, where: str) -> tuple[dict[str, str], dict[str, Any]]:
    return layout.check_index(parse_json_object(raw, path=where, what="index"), where)


def _siblings(first: Reader, make: Callable[[str], RemoteFile]) -> list[Reader]:
    """The readers of the other parts of `first`'s set (split GGUF), opened from the same place."""
    try:
        names = first.siblings()
    except BaseException:
        first.close()
        raise
    return _open_all([(lambda n=n: make(n)) for n in names], close_on_error=[first])


def _open_all(makers: list[Callable[[], Any]], close_on_error: list[Reader] | None = None) -> list[Reader]:
    """Open every file (a path, or a maker of a remote file) concurrently, in order; on any error, close all."""
    if len(makers) <= 1:
        results = [_attempt(m) for m in makers]
    else:
        contexts = [contextvars.copy_context() for _ in makers]  # limits and unknown_globals of the caller
        with ThreadPoolExecutor(min(_OPENERS, len(makers)), thread_name_prefix="weightio-open") as workers:
            results = list(workers.map(lambda c, m: c.run(_attempt, m), contexts, makers))
    readers = [r for r in results if isinstance(r, Reader)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for reader in readers + (close_on_error or []):
            reader.close()
        raise errors[0]
    return readers


def _attempt(make: Callable[[], Any]) -> Reader | BaseException:
    """The reader of the file `make()` gives, or the error opening it raised (the caller raises it, in order)."""
    try:
        return open_file(make())
    except Exception as e:  # noqa: BLE001 - raised by the caller
        return e
