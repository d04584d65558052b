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
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from . import layout, remote_s3
from ._failures import is_url, redact, retrying
from ._gc import collector_paused
from ._remote import BLOCK, RemoteFile, pool
from .errors import DOWNLOAD_ADVICE, STORAGE_OPTIONS_ADVICE, FormatError, InputError, MissingDependencyError, UsageError
from .formats import Reader, is_remote, open_file
from .remote_http import Found, first_reads, has_aiohttp, http_filesystem, probe, probe_all, total_size, wave

if TYPE_CHECKING:
    from ._remote import Into

__all__ = ["Opened", "filesystem", "first_reads", "is_folder", "is_url", "open_url", "redact", "remote_file",
           "traffic"]

_OPENERS = 128  # files opened (their headers fetched) at once
_WAVE = 8  # more Hub files than this are probed on an event loop (its client costs ~20 ms to make: worth it
# for many shards, not for a few, which threads open as fast on the HTTP session the listing already made)

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
    with collector_paused():  # a wave of a hundred requests and their answers' parses: no cycles, much garbage
        return _open_url(url, dict(storage_options or {}), download)


def _open_url(url: str, options: dict[str, Any], download: bool) -> Opened:
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
        if is_remote(file):
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
    named = hub.named_file(url)
    early = pool().submit(_hub_first_reads, named) if named is not None else None  # while the repo is listed
    sources, index = hub.remote_sources(url)
    remote = [s for s in sources if not isinstance(s, str)]
    found = dict(zip((s.filename for s in remote), _hub_probe_all(remote), strict=True)) \
        if len(remote) > _WAVE else {}  # a few files: each on a thread of its own, on the session the listing made
    if early is not None and len(remote) == 1 and index is None:
        found.update(_taken(early.result(), remote[0]))
    files = [  # (no annotation: mypy cannot infer these lambdas, with their defaults, against Callable[[], Any])
        (lambda s=s: s) if isinstance(s, str) else (lambda s=s: _hub_file(s, found.get(s.filename))) for s in sources]
    if index is None:
        return Opened(url, _open_all(files))
    names = {(s if isinstance(s, str) else s.uri): _shard_name(s) for s in sources}
    return Opened(url, _open_all(files), (*index, names))


def _shard_name(source: Any) -> str:
    return posixpath.basename(source if isinstance(source, str) else source.filename)


def _hub_first_reads(file: Any) -> tuple[bytes, str, bytes | None, str | None, int] | None:
    """A named file's first bytes (and its last, as `first_reads` says, by a suffix range), asked
    at its revision while the repo is listed: (first, the CDN address they came from, last, the
    commit the Hub answered for, the size). None where anything was not as asked: the file is then
    read as usual, at the listed commit."""
    from huggingface_hub.utils import build_hf_headers, get_session

    head, tail = first_reads(file.filename)
    session, headers, url = get_session(), build_hf_headers(), file.url()

    def get(asked: str, most: int) -> tuple[bytes, str, str | None, int] | None:
        with session.stream("GET", url, headers=headers | {"Range": asked}, follow_redirects=True) as answer:
            size = total_size(answer.headers.get("Content-Range", "")) if answer.status_code == 206 else None
            if size is None:
                return None  # not read: an error is reported by the usual read, an unranged answer never fetched
            hops = [*answer.history, answer]
            commit = next((h.headers["X-Repo-Commit"] for h in hops if "X-Repo-Commit" in h.headers), None)
            body = b""
            for chunk in answer.iter_bytes():
                body += chunk
                if len(body) > most:
                    return None
            return body, str(answer.url), commit, size

    try:
        asks = [pool().submit(get, f"bytes=0-{head - 1}", head)] + \
            ([pool().submit(get, f"bytes=-{tail}", tail)] if tail else [])
        first, last = asks[0].result(), (asks[1].result() if tail else None)
    except Exception:  # noqa: BLE001 - the usual read reports what is wrong
        return None
    if first is None or (tail and (last is None or last[2:] != first[2:])):
        return None
    return first[0], first[1], last[0] if last else None, first[2], first[3]


def _taken(early: tuple[bytes, str, bytes | None, str | None, int] | None,
           file: Any) -> dict[str, tuple[bytes, str, bytes | None]]:
    """`_hub_first_reads`'s answer as the listed file's first (and last) bytes, when it came from the
    listed commit and size (the revision may have moved between the two requests), else nothing."""
    if early is None:
        return {}
    first, where, last, commit, size = early
    head, tail = first_reads(file.filename)
    if commit != file.commit or size != file.size or len(first) != min(head, size) or \
            (last is not None and len(last) != min(tail, size)):
        return {}
    return {file.filename: (first, where, last)}


def _hub_probe_all(files: list[Any]) -> list[tuple[bytes, str, bytes | None] | None]:
    """The first bytes of every `weightio.hub.HubFile` (and its last, as `first_reads` says), and
    where the Hub redirected each (its CDN), all asked at once on one event loop (`remote_http.wave`:
    one wave of requests, sent before any answer is parsed). None where one failed, and for all
    without aiohttp: those files are read alone, on threads, with retries."""
    fs = http_filesystem()
    if fs is None:
        return [None] * len(files)
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()  # the token, for the Hub; aiohttp drops it on the redirect to the CDN
    asks, tails = [], []
    for file in files:
        head, tail = first_reads(file.filename)
        tails.append(max(0, min(tail, file.size - head)))  # never the first bytes again
        asks.append((file.url(), headers, 0, min(head, file.size)))
        if tails[-1]:
            asks.append((file.url(), headers, file.size - tails[-1], file.size))
    got, found = iter(wave(fs, asks)), []
    for tail in tails:
        first, last = next(got), (next(got) if tail else (b"", ""))
        found.append(None if first is None or last is None else (first[0], first[1], last[0] if tail else None))
    return found


def _hub_file(file: Any, found: tuple[bytes, str, bytes | None] | None = None) -> RemoteFile:
    """A `weightio.hub.HubFile` read by range through huggingface_hub's HTTP session (`found`: its
    first block and CDN address, where `_hub_probe_all` fetched them)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = file.url()
    session = get_session()
    headers = build_hf_headers()  # the token (HF_TOKEN, hf auth login) for the endpoint; never shown
    # where the Hub redirected the file (its CDN): later ranges go straight there
    direct: list[str] = [found[1]] if found is not None and found[1] != url else []

    def stream(start: int, stop: int, into: Into | None) -> bytes | int:
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

    def many(ranges: list[tuple[int, int]]) -> list[bytes | None]:
        """Many ranges in one wave (see `RemoteFile`), to the CDN once known, else the Hub's URL."""
        target, ask = (direct[0], {}) if direct else (url, headers)
        got = wave(http_filesystem(), [(target, ask, a, a + n) for a, n in ranges])
        redirected = {r[1] for r in got if r is not None} - {url}
        if not direct and redirected:
            direct.append(redirected.pop())
        return [None if r is None else r[0] for r in got]

    head, tail = first_reads(file.filename)
    remote = RemoteFile(file.uri, lambda start, stop: cast(bytes, stream(start, stop, None)), file.size,
                        fetch_into=lambda start, stop, into: cast(int, stream(start, stop, into)),
                        first=None if found is None else found[0], first_asked=head,
                        last=None if found is None else found[2], fetch_many=many if has_aiohttp() else None)
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


def _find(fs: Any, path: str, url: str) -> Found:
    """Size and ETag of a file: over HTTP(S) and S3 by its first ranged GET (`remote_http.probe`,
    `remote_s3.probe`: one request instead of a HEAD and a GET), elsewhere by the filesystem's ``info``
    (on S3 too where that GET did not answer: a prefix, an error, which ``info`` then reports)."""
    if _is_http(fs):
        return retrying(lambda: probe(fs, path, url), url)
    found = remote_s3.probe(fs, path) if _is_s3(fs) else None
    return found or Found(_info(fs, path, url))


def _is_http(fs: Any) -> bool:
    return "http" in _protocols(fs)


def _is_s3(fs: Any) -> bool:
    return _protocols(fs)[0] in ("s3", "s3a")


def _fsspec_file(fs: Any, path: str, url: str, found: Found | None = None) -> RemoteFile:
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
    given: dict[str, Any] = {"etag": etag, "first": found.first, "first_asked": found.asked, "last": found.last}
    if _is_http(fs):
        # size given: no HEAD; If-Match: a file replaced on the server answers 412, not new bytes
        options: dict[str, Any] = {
            "size": size, "headers": dict(fs.kwargs.get("headers") or {}) | ({"If-Match": etag} if etag else {})}
        if set(fs.kwargs) <= {"headers"}:  # many ranges in one wave on fsspec's own session
            target, ask = fs.encode_url(path), options["headers"]
            given["fetch_many"] = lambda ranges: [None if r is None else r[0] for r in
                                                  wave(fs, [(target, ask, a, a + n) for a, n in ranges])]
        opened = _OnFirstUse(lambda: retrying(lambda: fs.open(path, "rb", cache_type="none", **options), url))
        file = RemoteFile(url, opened.fetch_range, size, close=opened.close, **given)
    elif _is_s3(fs):  # s3fs's files take the size, and the info, instead of a HEAD; many ranges go in one wave
        given["fetch_many"] = lambda ranges: remote_s3.wave(fs, path, etag, ranges)
        file = _fsspec_handle_file(fs, path, url, info, {"size": size}, given)
    else:
        file = _fsspec_handle_file(fs, path, url, info, {}, given)
    head, tail = first_reads(path)
    if found.first is None and (tail or head < BLOCK):  # found by a listing or HEAD: both asked now, together
        _primed(file, head, tail)
    return file


class _OnFirstUse:
    """An fsspec HTTP file object made when a single range is first asked of it: making one asks
    fsspec's event loop for its session (a round trip between threads), which a shard whose header
    came with the request that found it never needs."""

    _handle: Any  # the fsspec file object, once made (None before)

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make, self._handle, self._lock = make, None, threading.Lock()

    def fetch_range(self, start: int, stop: int) -> bytes:
        with self._lock:
            if self._handle is None:
                self._handle = self._make()
            handle = self._handle
        return handle._fetch_range(start, stop)

    def close(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def _fsspec_handle_file(fs: Any, path: str, url: str, info: dict[str, Any], options: dict[str, Any],
                        given: dict[str, Any]) -> RemoteFile:
    """A file of a filesystem other than HTTP, read by its own file object's range fetcher (or,
    where its files have none, by ``cat_file`` with a range)."""
    etag = given["etag"]
    handle = retrying(lambda: fs.open(path, "rb", cache_type="none", **options), url)
    if "name" in info and getattr(handle, "_details", False) is None:
        handle.details = info  # what the file would HEAD for on its first read
        if etag and isinstance(getattr(handle, "read_kw", None), dict) and not getattr(fs, "local_expiry_check", 1):
            handle.read_kw = handle.read_kw | {"IfMatch": etag}  # as s3fs does when it HEADs itself
    fetch = getattr(handle, "_fetch_range", None)  # fsspec's buffered files all have one
    if fetch is None:  # a filesystem whose files do not: its cat_file takes a range
        handle.close()
        return RemoteFile(url, lambda start, stop: fs.cat_file(path, start=start, end=stop), info["size"], **given)
    return RemoteFile(url, fetch, info["size"], close=handle.close, **given)


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


def _sized(entry: dict[str, Any]) -> Found | None:
    """A listing's entry as what finding its file would tell, when it gives the size (s3, gcs…; an
    HTTP index page does not)."""
    return Found(entry) if entry.get("type") == "file" and isinstance(entry.get("size"), int) else None


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


def _open_index(fs: Any, path: str, url: str, found: Found | None = None,
                listing: dict[str, dict[str, Any]] | None = None) -> Opened:
    """A sharded set by its index: the index read (while its folder is listed, on a filesystem
    other than HTTP and S3: sizes and ETags of every shard in one request), then every shard opened
    at once, each in one request: over HTTP and S3 a wave of first ranged GETs, which bring each
    shard's size and ETag with its first bytes; elsewhere its listed size."""
    folder = url.rsplit("/", 1)[0]
    listed = None
    waves = _is_http(fs) or _is_s3(fs)
    if listing is None and not waves:
        listed = pool().submit(_listing, fs, path.rsplit("/", 1)[0])
    index = _fsspec_file(fs, path, url, found)
    try:
        raw = index.read(0, index.size, "the index")
    finally:
        index.close()
    weight_map, metadata = layout.parse_index(raw, redact(url))
    if listed is not None:
        listing = listed.result()
    shards = layout.shards(weight_map)
    urls = {f"{folder}/{s}": s for s in shards}
    known = {u: _sized((listing or {}).get(s, {})) for u, s in urls.items()}
    if waves and len(urls) > 1:  # every shard's first GET out at once, then parsed
        paths = [(_fs_path(fs, u), u) for u in urls]
        probed = probe_all(fs, paths) if _is_http(fs) else remote_s3.probe_all(fs, [p for p, _ in paths])
        known = {u: found or known[u] for u, found in zip(urls, probed, strict=True)}  # None: found alone
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


def _siblings(first: Reader, make: Callable[[str], RemoteFile]) -> list[Reader]:
    """The readers of the other parts of `first`'s set (split GGUF), opened from the same place."""
    try:
        names = first.siblings()
    except BaseException:
        first.close()
        raise
    makers = [(lambda n=n: make(n)) for n in names]  # (named: inline, mypy cannot infer them as Callable[[], Any])
    return _open_all(makers, close_on_error=[first])


def _open_all(makers: Sequence[Callable[[], Any]], close_on_error: list[Reader] | None = None) -> list[Reader]:
    """Open every file (a path, or a maker of a remote file) concurrently, in order; on any error, close all."""
    if len(makers) <= 1:
        results = [_attempt(m) for m in makers]
    else:
        contexts = [contextvars.copy_context() for _ in makers]  # limits and unknown_globals of the caller
        from concurrent.futures import ThreadPoolExecutor  # (imported when first needed: it imports logging)

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
