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

import contextvars
import posixpath
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import layout
from ._json import parse_json_object
from ._remote import RemoteFile, is_url, redact, retrying
from .errors import DOWNLOAD_ADVICE, STORAGE_OPTIONS_ADVICE, FormatError, InputError, MissingDependencyError, UsageError
from .formats import Reader, open_file

__all__ = ["Opened", "filesystem", "is_folder", "is_url", "open_url", "redact", "remote_file",
           "traffic"]

_OPENERS = 64  # files opened (their headers fetched) at once


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
    info = None if url.endswith("/") else _info(fs, path, url)
    if info is None or _names_folder(info):
        return _open_folder(fs, path, url)
    if path.endswith(".index.json"):
        return _open_index(fs, path, url)
    first = open_file(_fsspec_file(fs, path, url, info))
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
    files: list[Callable[[], Any]] = [
        (lambda s=s: s) if isinstance(s, str) else (lambda s=s: _hub_file(s)) for s in sources]
    if index is None:
        return Opened(url, _open_all(files))
    weight_map, metadata = layout.read_index(index)
    names = {(s if isinstance(s, str) else s.uri): _shard_name(s) for s in sources}
    return Opened(url, _open_all(files), (index, weight_map, metadata, names))


def _shard_name(source: Any) -> str:
    return posixpath.basename(source if isinstance(source, str) else source.filename)


def _hub_file(file: Any) -> RemoteFile:
    """A `weightio.hub.HubFile` read by range through huggingface_hub's HTTP session."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = file.url()
    session = get_session()
    headers = build_hf_headers()  # the token (HF_TOKEN, hf auth login) for the endpoint; never shown
    direct: list[str] = []  # where the Hub redirected the file (its CDN): later ranges go straight there

    def fetch(start: int, stop: int) -> bytes:
        target = direct[0] if direct else url
        ask = {"Range": f"bytes={start}-{stop - 1}"} | ({} if direct else headers)
        with session.stream("GET", target, headers=ask, follow_redirects=True) as response:
            if response.status_code in (401, 403) and direct:  # a signed CDN URL expired: back to the Hub
                direct.clear()
                return fetch(start, stop)
            if response.status_code == 200 and stop - start < file.size:
                raise ValueError("The HTTP server doesn't appear to support range requests")
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            if not direct and str(response.url) != url:
                direct.append(str(response.url))
            return response.read()

    return RemoteFile(file.uri, fetch, file.size)


# ----------------------------------------------------------------------------- fsspec


def _filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise MissingDependencyError("fsspec", purpose="read checkpoints by URL") from None
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
    return info.get("type") == "directory" or info.get("mimetype") == "text/html"


def _info(fs: Any, path: str, url: str) -> dict[str, Any]:
    return retrying(lambda: fs.info(path), url)


def _fsspec_file(fs: Any, path: str, url: str, info: dict[str, Any] | None = None) -> RemoteFile:
    """A file of an fsspec filesystem read by range through its own file object's range fetcher."""
    info = info if info is not None else _info(fs, path, url)
    if info.get("type") == "directory":
        raise InputError("is a folder, not a file", path=redact(url))
    size = info.get("size")
    if not isinstance(size, int):
        raise InputError("the server does not say how large the file is (no Content-Length): weightio reads "
                         "remote files by range only", path=redact(url))
    etag = info.get("ETag") or info.get("etag")
    options: dict[str, Any] = {}
    if "http" in _protocols(fs):
        # size given: no second HEAD; If-Match: a file replaced on the server answers 412, not new bytes
        headers = dict(fs.kwargs.get("headers") or {}) | ({"If-Match": etag} if etag else {})
        options = {"size": size, "headers": headers}
    handle = retrying(lambda: fs.open(path, "rb", cache_type="none", **options), url)
    fetch = getattr(handle, "_fetch_range", None)  # fsspec's buffered files all have one
    if fetch is None:  # a filesystem whose files do not: its cat_file takes a range
        handle.close()
        return RemoteFile(url, lambda start, stop: fs.cat_file(path, start=start, end=stop), size, etag=etag)
    return RemoteFile(url, fetch, size, etag=etag, close=handle.close)


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
        return _open_index(fs, entry["name"], child)
    first = open_file(_fsspec_file(fs, entry["name"], child, entry if isinstance(entry.get("size"), int) else None))
    siblings = _siblings(first, lambda u: _fsspec_file(fs, _fs_path(fs, u), u))
    return Opened(redact(url), [first, *siblings])


def _open_index(fs: Any, path: str, url: str) -> Opened:
    index = _fsspec_file(fs, path, url)
    try:
        raw = index.read(0, index.size, "the index")
    finally:
        index.close()
    weight_map, metadata = _parse_index(raw, redact(url))
    folder = url.rsplit("/", 1)[0]
    shards = layout.shards(weight_map)
    urls = {f"{folder}/{s}": s for s in shards}
    files = [(lambda u=u: _fsspec_file(fs, _fs_path(fs, u), u)) for u in urls]
    return Opened(redact(folder), _open_all(files),
                  (redact(url), weight_map, metadata, {redact(u): s for u, s in urls.items()}))


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
