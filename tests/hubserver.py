"""A loopback HTTP server that serves small repos the way the Hugging Face Hub's HTTP API does.

The tests point the real ``huggingface_hub`` client at it (``HF_ENDPOINT``), so no test touches
the internet. It implements the routes the client uses to find and fetch files:

``GET /api/{models,datasets,spaces}/{ns}/{name}[/revision/{rev}]``
    repo info: ``id``, ``sha`` (the commit the revision points to), ``siblings`` (file names).
``HEAD|GET /[{datasets,spaces}/]{ns}/{name}/resolve/{rev}/{path}``
    a regular (git) file: 200 with ``ETag`` (its git blob id), ``Content-Length`` and
    ``X-Repo-Commit``; an LFS file (weights): a 302 to a CDN host (here ``localhost`` instead of
    ``127.0.0.1``, so the client treats it as another host and drops the token), with
    ``X-Linked-Etag`` (the sha256), ``X-Linked-Size`` and ``X-Repo-Commit``.
``HEAD|GET /cdn/{sha256}``
    the LFS bytes; ``Range`` requests are honoured.

Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) and ``X-Error-Message`` headers. Private repos answer 401 ``RepoNotFound``
without the right ``Authorization: Bearer`` token, as the Hub does. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["Repo", "HubServer", "serve", "repo_from_folder"]

CLIENT_OWN = ("/api/agent-harnesses", "/api/telemetry")  # huggingface_hub's own requests, not about repos
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".npz", ".npy", ".pt", ".pth", ".ckpt")


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's content (what the Hub sends as the ETag of non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """One repo: its revisions (branch/tag name -> commit) and each commit's files."""

    commits: dict[str, dict[str, bytes]]  # commit sha -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit sha
    token: str | None = None  # private: only this bearer token may read it

    def commit_for(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


def repo_from_folder(folder: Path, commit: str = "0" * 39 + "1", extra: dict[str, bytes] | None = None,
                     token: str | None = None) -> Repo:
    """A repo whose ``main`` holds the files of a local folder (plus `extra`)."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    files.update(extra or {})
    return Repo({commit: files}, {"main": commit}, token)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # keep test output clean

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._route(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    # ------------------------------------------------------------------ routing
    def _route(self, head: bool) -> None:
        hub = self.server.hub
        hub.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if hub.fail_with is not None:
            status, message = hub.fail_with
            return self._error(status, "", message, head)
        path = urlsplit(self.path).path
        parts = path.strip("/").split("/")
        if parts[0] == "cdn":
            return self._cdn(parts[1] if len(parts) > 1 else "", head)
        if parts[0] == "api":
            return self._api(parts[1:], head)
        repo_type = "model"
        if parts[0] in ("datasets", "spaces"):
            repo_type, parts = parts[0][:-1], parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(repo_type, "/".join(parts[:2]), unquote(parts[3]),
                                 unquote("/".join(parts[4:])), head)
        self._error(404, "", "Not Found", head)

    def _repo(self, repo_type: str, repo_id: str, head: bool) -> Repo | None:
        repo = self.server.hub.repos.get((repo_type, repo_id))
        auth = self.headers.get("Authorization")
        if repo is None or (repo.token is not None and auth != f"Bearer {repo.token}"):
            status = 401 if repo is not None else 404
            self._error(status, "RepoNotFound", "Repository not found", head)
            return None
        return repo

    def _api(self, parts: list[str], head: bool) -> None:
        if len(parts) < 3 or parts[0] not in ("models", "datasets", "spaces"):
            return self._error(404, "", "Not Found", head)
        repo_type, repo_id = parts[0][:-1], "/".join(parts[1:3])
        repo = self._repo(repo_type, repo_id, head)
        if repo is None:
            return None
        revision = unquote(parts[4]) if len(parts) >= 5 and parts[3] == "revision" else "main"
        commit = repo.commit_for(revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        files = repo.commits[commit]
        body = json.dumps({"_id": "0" * 24, "id": repo_id, "modelId": repo_id, "sha": commit,
                           "private": repo.token is not None, "tags": [],
                           "siblings": [{"rfilename": name} for name in files]}).encode()
        self._send(200, {"Content-Type": "application/json"}, body, head)

    def _resolve(self, repo_type: str, repo_id: str, revision: str, filename: str, head: bool) -> None:
        repo = self._repo(repo_type, repo_id, head)
        if repo is None:
            return None
        commit = repo.commit_for(revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        data = repo.commits[commit].get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist on \"{revision}\"", head,
                               {"X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit}
        if filename.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            self.server.hub.blobs[sha256] = data
            port = self.server.server_address[1]
            headers.update({"Location": f"http://localhost:{port}/cdn/{sha256}", "X-Linked-Etag": f'"{sha256}"',
                            "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_id(data)}"'})
            return self._send(302, headers, b"", head)
        headers["ETag"] = f'"{git_blob_id(data)}"'
        self._send(200, headers, data, head)

    def _cdn(self, sha256: str, head: bool) -> None:
        data = self.server.hub.blobs.get(sha256)
        if data is None:
            return self._error(404, "", "NoSuchKey", head)
        self.server.hub.cdn_authorization.append(self.headers.get("Authorization"))
        start, status = 0, 200
        wanted = self.headers.get("Range", "")
        headers = {"ETag": f'"{sha256}"'}
        if wanted.startswith("bytes=") and wanted[6:].split("-")[0].isdigit():
            start, status = int(wanted[6:].split("-")[0]), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._send(status, headers, data[start:], head)

    # ------------------------------------------------------------------ responses
    def _error(self, status: int, code: str, message: str, head: bool, extra: dict[str, str] | None = None) -> None:
        headers = {"X-Error-Message": message, "Content-Type": "application/json", **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": message}).encode(), head)

    def _send(self, status: int, headers: dict[str, str], body: bytes, head: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubServer


class HubServer:
    """The running server: its `url` (what HF_ENDPOINT is set to), repos and request log.

    Attributes:
        repos: ``(repo_type, repo_id) -> Repo``; may be changed while the server runs.
        requests: ``(method, path, headers)`` of every request, in order (header names lower-cased).
        cdn_authorization: the ``Authorization`` header (or None) of every CDN request.
        fail_with: when set to ``(status, message)``, every request answers that error.
    """

    def __init__(self, repos: dict[tuple[str, str], Repo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.cdn_authorization: list[str | None] = []
        self.blobs: dict[str, bytes] = {}
        self.fail_with: tuple[int, str] | None = None
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._stopped = False

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent): later requests fail to connect, as with a Hub that is down."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def paths(self, method: str | None = None) -> list[str]:
        """The request paths seen so far (of one method when given), without query strings, leaving
        out what the client asks on its own behalf (its agent registry)."""
        return [urlsplit(p).path for m, p, _ in self.requests
                if (method is None or m == method) and not p.startswith(CLIENT_OWN)]


@contextmanager
def serve(repos: dict[tuple[str, str], Repo]) -> Iterator[HubServer]:
    """Run a `HubServer` for the duration of a ``with`` block."""
    server = HubServer(repos).start()
    try:
        yield server
    finally:
        server.stop()


def point_client_at(server: HubServer, monkeypatch, cache: Path) -> None:  # noqa: ANN001 - pytest's fixture
    """Send huggingface_hub to `server` with an empty cache and no token, for one test.

    ``HF_ENDPOINT`` is what weightio reads; the client's own copy of it (``constants.ENDPOINT``
    and the URL template built from it, read once at import) is patched to match, as if the
    variable had been set before the import, so that nothing the client does on its own (it
    fetches a small registry on first use) leaves the loopback interface.
    """
    import huggingface_hub.constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(cache.parent / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(cache.parent / "hf-home" / "token"))
