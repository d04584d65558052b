"""Real protocol servers on 127.0.0.1 for the remote-checkpoint tests and bench: they count what they send.

Three servers share one set of knobs and one request log (`LoopbackServer`):

`HTTPRangeServer`
    a static HTTP/1.1 server (``http.server.ThreadingHTTPServer``) serving a dict ``{relative path:
    bytes}`` and/or a local folder. ``GET``/``HEAD`` of a file answer its bytes with a strong ``ETag``
    (``"<sha256 of the content>"``), ``Last-Modified`` and ``Accept-Ranges: bytes``, and implement:

    - ``Range: bytes=a-b`` (``b`` clamped to the last byte), ``bytes=a-`` and the suffix ``bytes=-n``
      (the last ``n`` bytes, the whole file when ``n`` is larger): ``206`` with
      ``Content-Range: bytes a-b/size``; an unsatisfiable range (``a`` at or past the end, ``-0``, any
      range of an empty file) answers ``416`` with ``Content-Range: bytes */size``; a malformed
      range, another unit or a multi-range request (``bytes=0-1,5-6``) is ignored: ``200`` and the
      whole body, as RFC 9110 allows;
    - ``If-Match`` (``412`` unless one of the listed tags, or ``*``, is the current ETag),
      ``If-None-Match`` (``304`` when it matches), ``If-Range`` (a stale tag answers the whole body);
    - a directory URL (``dir/``, ``dir`` or the root ``/``) answers a small HTML index of
      ``<a href="/dir/name">`` links, directories ending in ``/``: what ``fsspec``'s
      ``HTTPFileSystem.ls`` parses;
    - optional credentials: with ``auth=(user, password)`` and/or ``token=...`` set, a request without
      ``Authorization`` answers ``401`` (``WWW-Authenticate: Basic``), one with wrong credentials
      ``403``.

`S3Server`
    moto's S3 (``moto.server.DomainDispatcherApplication``) served by werkzeug's threaded WSGI server,
    behind a WSGI middleware that keeps the same log and knobs. The S3 semantics (Range, ETag,
    ``If-Match``, listings, errors) are moto's. Buckets and objects are created straight in moto's
    in-process backend (`create_bucket`, `put`, `put_folder`), so setting up never shows in the log.

`tests.hubserver.HubServer`
    the fake Hugging Face Hub, built on the same base.

Common to all three (attributes of the running server, changeable while it runs):

- ``requests``: a `Request` per request, in arrival order: ``method``, ``path`` (with the query),
  ``headers`` (names lower-cased), ``range`` (the ``Range`` header or None), ``status``, ``bytes`` (the
  body bytes handed to the socket: the exact payload, headers not counted; 0 for ``HEAD``, ``304``;
  counted before the client can see them), ``started``/``finished`` (``time.monotonic()``; ``finished``
  is None until the answer is written: call ``idle()`` first to read it); ``bytes_sent`` (their
  total), ``sent(...)``/``count(...)``/``matching(...)`` (bytes, number, records of the requests of one
  method, path substring, status), ``peak_in_flight`` (most requests being answered at once) and
  ``reset()`` (clears the log and the peak).
- ``delay``: seconds slept before answering each request (the bench injects 0.02 s of latency).
- ``ignore_range``: answer ``200`` and the whole body even when ``Range`` is asked.
- ``trickle``: seconds slept after each 1 KiB of a body, sent in 1 KiB pieces (a loaded or slow
  link, where a client's read answers part of a small body).
- ``failures``: ``{path substring: [status, ...]}`` answers those statuses to the next matching
  requests, one each (a None in the list serves that one), then serves normally again (transient
  errors); ``{substring: status}`` (an int)
  answers it to every matching request until removed. Matching is on the request path with its query.

Example::

    with HTTPRangeServer({"m/model.safetensors": data}) as server:
        server.delay = 0.02
        fsspec.filesystem("http").cat_file(server.url + "/m/model.safetensors", 0, 100)
        assert server.bytes_sent == 100 and server.requests[-1].status == 206
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

__all__ = ["Request", "Unsatisfiable", "byte_range", "LoopbackServer", "LoopbackHandler", "HTTPRangeServer",
           "S3Server", "S3_ENV"]

_DIGITS = re.compile(r"[0-9]+")
_CHUNK = 1 << 16
_TRICKLED = 1 << 10  # the pieces a body is sent in when `trickle` is set


# ----------------------------------------------------------------------------- the request log


@dataclass
class Request:
    """One request and what was answered. Unpacks as ``(method, path, headers)`` (the older log's shape)."""

    method: str
    path: str
    headers: dict[str, str]
    range: str | None = None
    status: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.method, self.path, self.headers))

    def __getitem__(self, index: int) -> Any:
        return (self.method, self.path, self.headers)[index]


# ----------------------------------------------------------------------------- Range (RFC 9110 §14)


class Unsatisfiable(Exception):
    """The Range asks for no byte of the representation: answer 416."""


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The ``(start, stop)`` slice a ``Range`` header selects from `size` bytes, or None for the whole body.

    None when there is no header, another unit, several ranges or a malformed one (all ignored, as
    RFC 9110 allows); raises `Unsatisfiable` when the range selects nothing.
    """
    if not header:
        return None
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or "," in spec or not dash:
        return None
    if not first:  # suffix: the last n bytes
        if not _DIGITS.fullmatch(last):
            return None
        if int(last) == 0 or size == 0:
            raise Unsatisfiable
        return max(size - int(last), 0), size
    if not _DIGITS.fullmatch(first) or (last and not _DIGITS.fullmatch(last)):
        return None
    start = int(first)
    if last and int(last) < start:
        return None  # a-b with b < a is invalid, hence ignored
    if start >= size:
        raise Unsatisfiable
    return start, size if not last else min(int(last) + 1, size)


def _tags(header: str) -> list[str]:
    return [t.strip().removeprefix("W/") for t in header.split(",") if t.strip()]


# ----------------------------------------------------------------------------- the shared server base


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # http.server's 5 drops connections when a client opens dozens at once
    owner: LoopbackServer

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.owner.lock:
            self.owner._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.owner.lock:
            self.owner._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets a kept-alive connection (aiohttp, closing one whose 404 body it did
        # not read) is a normal end for a server, not an error: socketserver would print a
        # traceback to sys.stderr, which a CLI test running in-process (click's CliRunner) reads
        # as the command's own output. Any other error is printed as before.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """A server thread on a free port of 127.0.0.1, with the request log and knobs (see the module docstring).

    Subclasses provide `_serve` (the thread's loop) and `_close`, or use `_http_server` for an
    ``http.server`` handler.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.delay = 0.0
        self.ignore_range = False
        self.trickle = 0.0
        self.failures: dict[str, list[int | None] | int] = {}  # None in a list: that request is served
        self.peak_in_flight = 0
        self._in_flight = 0
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.url = ""

    # ------------------------------------------------------------------ lifecycle
    def _http_server(self, handler: type[BaseHTTPRequestHandler]) -> _ThreadingServer:
        server = _ThreadingServer(("127.0.0.1", 0), handler)
        server.owner = self
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        return server

    def start(self) -> LoopbackServer:
        assert self._thread is not None
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent); open keep-alive connections are cut, later requests fail to connect."""
        if self._stopped:
            return
        self._stopped = True
        self._close()
        with self.lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _close(self) -> None:
        raise NotImplementedError

    def __enter__(self):  # noqa: ANN204 - returns the subclass
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ accounting
    def _counted(self, request: Request) -> bool:
        """Whether `request` counts in `bytes_sent`, `sent` and `count` (all do here)."""
        return True

    def matching(self, method: str | None = None, contains: str = "", status: int | None = None) -> list[Request]:
        """The logged requests of one method, whose path contains `contains`, answered `status` (all by default)."""
        with self.lock:
            return [r for r in self.requests if self._counted(r) and (method is None or r.method == method)
                    and contains in r.path and (status is None or r.status == status)]

    @property
    def bytes_sent(self) -> int:
        """Body bytes sent so far, all requests together."""
        return self.sent()

    def sent(self, method: str | None = None, contains: str = "", status: int | None = None) -> int:
        """Body bytes sent to the requests `matching` these filters."""
        return sum(r.bytes for r in self.matching(method, contains, status))

    def count(self, method: str | None = None, contains: str = "", status: int | None = None) -> int:
        """How many requests `matching` these filters were seen."""
        return len(self.matching(method, contains, status))

    def idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is being answered (a client may hold the last byte of an answer before
        the server has closed its record: ``finished`` is set after it); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self._in_flight == 0:
                    return True
            time.sleep(0.002)
        return False

    def reset(self) -> None:
        """Forget the request log and the in-flight peak (the knobs and files stay)."""
        with self.lock:
            self.requests.clear()
            self.peak_in_flight = self._in_flight

    def _begin(self, method: str, path: str, headers: dict[str, str]) -> Request:
        request = Request(method, path, headers, headers.get("range"))
        with self.lock:
            self.requests.append(request)
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        return request

    def _end(self, request: Request) -> None:
        with self.lock:
            request.finished = time.monotonic()
            self._in_flight -= 1

    def _next_failure(self, path: str) -> int | None:
        """The status an injected failure answers to `path`, consuming one of a list (None: serve normally,
        whether nothing matches or the list's next entry is None)."""
        with self.lock:
            for pattern, statuses in self.failures.items():
                if pattern not in path:
                    continue
                if isinstance(statuses, int):
                    return statuses
                status = statuses.pop(0)
                if not statuses:
                    del self.failures[pattern]
                return status
        return None


class LoopbackHandler(BaseHTTPRequestHandler):
    """An ``http.server`` handler that logs, delays and fails as its `LoopbackServer` says, then calls `route`."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY, as production servers set it: with Nagle on, a small body
    # written after its headers waits for the client's delayed ACK (40 ms on Linux) and every small answer
    # takes ~44 ms instead of ~0.5, which no real server costs
    server: _ThreadingServer
    record: Request
    body_in: bytes

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # keep test output clean

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._handle(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._handle(head=False)

    def do_POST(self) -> None:  # noqa: N802
        self._handle(head=False)

    def _handle(self, head: bool) -> None:
        owner = self.server.owner
        self.record = owner._begin(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
        try:
            self.body_in = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if owner.delay:
                time.sleep(owner.delay)
            status = owner._next_failure(self.path)
            if status is not None:
                self.send_failure(status, head)
            else:
                self.route(head)
        finally:
            owner._end(self.record)

    # ------------------------------------------------------------------ for subclasses
    def route(self, head: bool) -> None:
        raise NotImplementedError

    def send_failure(self, status: int, head: bool) -> None:
        """An injected failure (subclasses answer it in their protocol's shape)."""
        self.send_body(status, {"Content-Type": "text/plain"}, f"injected failure {status}\n".encode(), head)

    def send_body(self, status: int, headers: dict[str, str], body: bytes | memoryview, head: bool) -> None:
        """Answer `status` with `headers` and `body` (not written for HEAD), counting the body bytes written."""
        self.record.status = status
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if status != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head or status == 304:
            return
        view, trickle = memoryview(body), self.server.owner.trickle
        step = _TRICKLED if trickle else _CHUNK
        for start in range(0, len(body), step):
            chunk = view[start:start + step]
            self.record.bytes += len(chunk)  # counted first: the client may look at the log once it has them
            try:
                self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                self.record.bytes -= len(chunk)  # the client went away: what it did not take is not counted
                self.close_connection = True
                return
            if trickle:
                time.sleep(trickle)

    def send_content(self, data: bytes, etag: str, head: bool, headers: dict[str, str] | None = None) -> None:
        """Answer a file's bytes honouring the conditional headers, ``Range`` and the ``ignore_range`` knob.

        `etag` is the quoted strong tag; `headers` go out with every answer (``Last-Modified`` …).
        """
        headers = {"ETag": etag, "Accept-Ranges": "bytes", **(headers or {})}
        if_match = self.headers.get("If-Match")
        if if_match is not None and "*" not in _tags(if_match) and etag not in _tags(if_match):
            return self.send_body(412, headers, b"", head)
        if_none_match = self.headers.get("If-None-Match")
        if if_none_match is not None and ("*" in _tags(if_none_match) or etag in _tags(if_none_match)):
            return self.send_body(304, headers, b"", head)
        wanted = None if self.server.owner.ignore_range else self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if if_range is not None and if_range.strip() != etag:
            wanted = None  # the client's copy is stale: it gets the whole new body
        try:
            span = byte_range(wanted, len(data))
        except Unsatisfiable:
            return self.send_body(416, {**headers, "Content-Range": f"bytes */{len(data)}"}, b"", head)
        if span is None:
            return self.send_body(200, headers, data, head)
        start, stop = span
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        self.send_body(206, headers, memoryview(data)[start:stop], head)  # no copy of the range


# ----------------------------------------------------------------------------- plain HTTP


@dataclass
class _File:
    data: bytes
    etag: str
    modified: float


def _etag(data: bytes) -> str:
    return f'"{hashlib.sha256(data).hexdigest()}"'


class _RangeHandler(LoopbackHandler):
    server: _ThreadingServer

    def route(self, head: bool) -> None:
        owner: HTTPRangeServer = self.server.owner  # type: ignore[assignment]
        refusal = owner._refuse(self.headers.get("Authorization"))
        if refusal:
            extra = {"WWW-Authenticate": 'Basic realm="loopback"'} if refusal == 401 else {}
            return self.send_body(refusal, {"Content-Type": "text/plain", **extra}, b"unauthorized\n", head)
        path = unquote(urlsplit(self.path).path).lstrip("/")
        found = owner._file(path)
        if found is not None:
            return self.send_content(found.data, found.etag, head, {
                "Last-Modified": formatdate(found.modified, usegmt=True), "Content-Type": "application/octet-stream"})
        entries = owner._listing(path.rstrip("/"))
        if entries is None:
            return self.send_body(404, {"Content-Type": "text/plain"}, b"not found\n", head)
        links = "".join(f'<li><a href="{html.escape(quote("/" + e))}">{html.escape(e)}</a></li>\n' for e in entries)
        page = f"<!DOCTYPE html>\n<html><body><ul>\n{links}</ul></body></html>\n".encode()
        self.send_body(200, {"Content-Type": "text/html; charset=utf-8"}, page, head)


class HTTPRangeServer(LoopbackServer):
    """A static file server with full Range semantics (see the module docstring).

    Args:
        files: ``{relative path: bytes}`` served first (``"dir/model.safetensors"``).
        root: a local folder served too (read at each request, so changes show at once).
        auth: ``(user, password)`` required as HTTP Basic credentials (or `token` as a Bearer).
        token: a Bearer token required.

    Attributes (besides `LoopbackServer`'s): ``url`` (``http://127.0.0.1:PORT``, no trailing slash),
    ``files`` (path -> `_File`), ``root``, ``auth``, ``token``.
    """

    def __init__(self, files: dict[str, bytes] | None = None, root: Path | str | None = None, *,
                 auth: tuple[str, str] | None = None, token: str | None = None) -> None:
        super().__init__()
        self.files: dict[str, _File] = {}
        self.root = Path(root) if root is not None else None
        self.auth = auth
        self.token = token
        for name, data in (files or {}).items():
            self.add(name, data)
        self._server = self._http_server(_RangeHandler)

    def _close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, path: str, data: bytes) -> str:
        """Serve `data` at `path` (replacing what was there: new ETag, size, Last-Modified); returns its URL."""
        path = path.lstrip("/")
        with self.lock:
            previous = self.files.get(path)
            modified = max(time.time(), previous.modified + 1) if previous else time.time()
            self.files[path] = _File(bytes(data), _etag(data), modified)
        return self.url_for(path)

    replace = add

    def remove(self, path: str) -> None:
        with self.lock:
            del self.files[path.lstrip("/")]

    def add_folder(self, folder: Path | str, prefix: str = "") -> None:
        """Serve every file under `folder` (copied now) below `prefix`."""
        for file in sorted(Path(folder).rglob("*")):
            if file.is_file():
                self.add(f"{prefix.strip('/')}/{file.relative_to(folder).as_posix()}".lstrip("/"), file.read_bytes())

    def url_for(self, path: str) -> str:
        """The URL of `path` (quoted)."""
        return f"{self.url}/{quote(path.lstrip('/'))}"

    def etag(self, path: str) -> str:
        """The quoted ETag `path` is served with now."""
        found = self._file(path.lstrip("/"))
        if found is None:
            raise KeyError(path)
        return found.etag

    def _refuse(self, authorization: str | None) -> int | None:
        if self.auth is None and self.token is None:
            return None
        if not authorization:
            return 401
        accepted = set()
        if self.auth is not None:
            accepted.add("Basic " + base64.b64encode(":".join(self.auth).encode()).decode())
        if self.token is not None:
            accepted.add(f"Bearer {self.token}")
        return None if authorization in accepted else 403

    def _file(self, path: str) -> _File | None:
        with self.lock:
            found = self.files.get(path)
        if found is not None or self.root is None or not path or path.endswith("/"):
            return found
        local = self.root / path
        if not local.resolve().is_relative_to(self.root.resolve()) or not local.is_file():
            return None
        data = local.read_bytes()
        return _File(data, _etag(data), local.stat().st_mtime)

    def _listing(self, folder: str) -> list[str] | None:
        """The entries directly under `folder` (``""``: the root), directories ending in ``/``; None if none."""
        prefix = folder + "/" if folder else ""
        names = set()
        with self.lock:
            paths = list(self.files)
        if self.root is not None:
            base = self.root / folder
            if base.resolve().is_relative_to(self.root.resolve()) and base.is_dir():
                paths += [p.relative_to(self.root).as_posix() + ("/" if p.is_dir() else "") for p in base.iterdir()]
        for path in paths:
            if path.startswith(prefix) and path != prefix:
                head, slash, _ = path[len(prefix):].partition("/")
                names.add(prefix + head + slash)
        return sorted(names) if names or not folder else None


# ----------------------------------------------------------------------------- S3 (moto)

S3_ENV = {
    # What botocore/aiobotocore (hence s3fs 2026.9) read at client creation, so that a bare
    # ``s3://bucket/key`` reaches the loopback server with no storage_options. AWS_ENDPOINT_URL_S3 is
    # botocore's service-specific endpoint variable (botocore >= 1.31). The FSSPEC_S3_ENDPOINT_URL /
    # FSSPEC_S3_KEY variables also work, but fsspec reads FSSPEC_* only when it is first imported.
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
S3_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
_S3_CODES = {400: "BadRequest", 403: "AccessDenied", 404: "NoSuchKey", 412: "PreconditionFailed",
             500: "InternalError", 503: "SlowDown"}


class S3Server(LoopbackServer):
    """moto's S3 on a free loopback port, logged and knobbed like the other servers (see the module docstring).

    Attributes (besides `LoopbackServer`'s): ``url`` (the endpoint, ``http://127.0.0.1:PORT``),
    ``storage_options`` (s3fs keyword arguments reaching it), ``env`` (the variables that make a bare
    ``s3://`` reach it; see `S3_ENV`). Credentials are ``testing``/``testing``, region ``us-east-1``.
    """

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class _Quiet(WSGIRequestHandler):
            disable_nagle_algorithm = True  # see LoopbackHandler

            def log(self, type: str, message: str, *args: Any) -> None:  # noqa: A002 - werkzeug's name
                pass

        super().__init__()
        self._app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._middleware, threaded=True, request_handler=_Quiet)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    def _close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def storage_options(self) -> dict[str, Any]:
        """``s3fs.S3FileSystem(**server.storage_options)`` talks to this server."""
        return {"key": "testing", "secret": "testing",
                "client_kwargs": {"endpoint_url": self.url, "region_name": "us-east-1"}}

    @property
    def env(self) -> dict[str, str]:
        """Environment variables under which ``s3fs.S3FileSystem()`` (no arguments) talks to this server."""
        return {**S3_ENV, "AWS_ENDPOINT_URL_S3": self.url}

    # ------------------------------------------------------------------ content (straight into moto)
    @staticmethod
    def _backend() -> Any:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        return s3_backends[DEFAULT_ACCOUNT_ID]["global"]

    def create_bucket(self, bucket: str) -> None:
        self._backend().create_bucket(bucket, "us-east-1")

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Store `data` at ``s3://bucket/key`` (creating the bucket); replacing an object changes its ETag.

        Returns the ``s3://`` URL.
        """
        if bucket not in self._backend().buckets:
            self.create_bucket(bucket)
        self._backend().put_object(bucket, key, bytes(data))
        return f"s3://{bucket}/{key}"

    def put_files(self, bucket: str, files: dict[str, bytes]) -> None:
        for key, data in files.items():
            self.put(bucket, key, data)

    def put_folder(self, bucket: str, folder: Path | str, prefix: str = "") -> None:
        """Store every file under `folder` as ``prefix/relative/path``."""
        for file in sorted(Path(folder).rglob("*")):
            if file.is_file():
                key = f"{prefix.strip('/')}/{file.relative_to(folder).as_posix()}".lstrip("/")
                self.put(bucket, key, file.read_bytes())

    def etag(self, bucket: str, key: str) -> str:
        """The quoted ETag moto serves ``s3://bucket/key`` with."""
        return self._backend().get_object(bucket, key).etag

    def clear(self) -> None:
        """Delete every bucket and object (moto's own reset of its S3 backend)."""
        self._backend().reset()

    # ------------------------------------------------------------------ the WSGI middleware
    def _middleware(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else "")
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(key):
                headers[key.replace("_", "-").lower()] = environ[key]
        request = self._begin(environ["REQUEST_METHOD"], path, headers)
        try:
            if self.delay:
                time.sleep(self.delay)
            if self.ignore_range:
                environ.pop("HTTP_RANGE", None)
            failure = self._next_failure(path)

            def recording_start(status: str, response_headers: list, exc_info: Any = None) -> Any:
                request.status = int(status.split()[0])
                return start_response(status, response_headers, exc_info)

            if failure is not None:
                code = _S3_CODES.get(failure, "InternalError")
                body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f"<Message>injected failure {failure}</Message></Error>").encode()
                recording_start(f"{failure} {code}", [("Content-Type", "application/xml"),
                                                      ("Content-Length", str(len(body)))])
                chunks: Iterable[bytes] = [body]
            else:
                chunks = self._app(environ, recording_start)
            yield from self._count(request, chunks)
        finally:
            self._end(request)

    def _count(self, request: Request, chunks: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for whole in chunks:
                trickle = self.trickle
                step = _TRICKLED if trickle else max(len(whole), 1)
                for start in range(0, len(whole), step):
                    chunk = whole[start:start + step]
                    if request.method != "HEAD" and request.status not in (204, 304):
                        request.bytes += len(chunk)
                    yield chunk
                    if trickle:
                        time.sleep(trickle)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
