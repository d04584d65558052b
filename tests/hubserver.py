"""A loopback HTTP server that serves small repos the way the Hugging Face Hub's HTTP API does.

The tests point the real ``huggingface_hub`` client (``hf_hub_download``, ``HfApi``, ``HfFileSystem``)
and transformers at it (``HF_ENDPOINT``), so no test touches the internet. It implements the routes
those clients use to find, list and fetch files (``{type}`` is ``models``, ``datasets`` or ``spaces``;
revisions in ``/api`` routes arrive quoted, ``refs%2Fpr%2F3``):

``GET /api/{type}/{ns}/{name}[/revision/{rev}]``
    repo info: ``id``, ``sha`` (the commit the revision points to), ``private``, ``siblings`` (file
    names; with ``?blobs=true``, what ``repo_info(files_metadata=True)`` asks, also ``size``,
    ``blobId`` and ``lfs {sha256, size, pointerSize}``).
``GET /api/{type}/{ns}/{name}/tree/{rev}[/{path}]``
    the entries directly under ``path`` (the root by default), or all below it with
    ``?recursive=true``: directories first, then files, each sorted. A file is
    ``{"type": "file", "oid", "size", "path"}`` plus ``"lfs": {"oid": sha256, "size", "pointerSize"}``
    for LFS files (``oid`` is then the git id of the LFS pointer, ``size`` the real size), a
    directory ``{"type": "directory", "oid", "size": 0, "path"}``; ``?expand=true`` adds
    ``lastCommit`` (and ``securityFileStatus`` to files). One page, no ``Link`` header. A path that
    is missing or names a file answers 404 ``EntryNotFound`` (``HfFileSystem.ls`` then lists the
    parent, as against the Hub).
``POST /api/{type}/{ns}/{name}/paths-info/{rev}``
    a form (``paths=a&paths=b&expand=false``, what ``HfApi.get_paths_info`` sends) or JSON
    (``{"paths": [...], "expand": bool}``) body: the tree entries of the paths that exist, in the
    order asked; missing paths are left out.
``HEAD|GET /[{datasets,spaces}/]{ns}/{name}/resolve/{rev}/{path}``
    a regular (git) file: its bytes with ``ETag`` (its git blob id), ``Content-Length`` and
    ``X-Repo-Commit``; an LFS file (by suffix, `LFS_SUFFIXES`): a 302 to a CDN host (here
    ``localhost`` instead of ``127.0.0.1``, so the client treats it as another host and drops the
    token), with ``X-Linked-Etag`` (the sha256), ``X-Linked-Size`` and ``X-Repo-Commit``.
``HEAD|GET /cdn/{sha256}``
    the LFS bytes, ``ETag`` the quoted sha256.

Both file routes (``/resolve`` of a regular file and ``/cdn``) implement the full Range and
conditional semantics of `tests.servers` (``bytes=a-b``, ``a-``, ``-n``, 206 + ``Content-Range``,
416 + ``Content-Range: bytes */size``, ``Accept-Ranges: bytes``, a multi-range request answered 200
whole; ``If-Match`` → 412, ``If-None-Match`` → 304, ``If-Range``).

Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) and ``X-Error-Message`` headers. Private repos answer 401 ``RepoNotFound``
without the right ``Authorization: Bearer`` token, as the Hub does.

Every request is logged, and the knobs work, as in `tests.servers.LoopbackServer`: ``requests``,
``bytes_sent``, ``sent()``, ``count()``, ``reset()``, ``delay``, ``ignore_range``, ``failures``;
``replace_file`` changes a file on the running server (new size, ETag and sha256). ``bytes_sent``,
``sent`` and ``count`` leave out what the client asks on its own behalf (`CLIENT_OWN`), ``requests``
keeps it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from .servers import LoopbackHandler, LoopbackServer, Request

__all__ = ["Repo", "HubServer", "serve", "repo_from_folder", "point_client_at", "git_blob_id", "lfs_pointer"]

CLIENT_OWN = ("/api/agent-harnesses", "/api/telemetry")  # huggingface_hub's own requests, not about repos
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".npz", ".npy", ".pt", ".pth", ".ckpt")
COMMIT_DATE = "2026-01-01T00:00:00.000Z"


@functools.lru_cache(maxsize=4096)
def git_blob_id(data: bytes) -> str:
    """The id git gives a file's content (what the Hub sends as the ETag of non-LFS files).

    Digests are remembered per content, as the Hub stores them: a request never hashes a file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@functools.lru_cache(maxsize=4096)
def sha256_of(data: bytes) -> str:
    """The sha256 of an LFS file's content (remembered, as `git_blob_id`)."""
    return hashlib.sha256(data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The git-lfs pointer file git stores in place of `data`."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256_of(data)}\nsize {len(data)}\n".encode()


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


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() in ("true", "1")


class _Handler(LoopbackHandler):
    server: object  # a tests.servers._ThreadingServer whose owner is the HubServer

    @property
    def hub(self) -> HubServer:
        return self.server.owner  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ routing
    def route(self, head: bool) -> None:
        hub = self.hub
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
        repo = self.hub.repos.get((repo_type, repo_id))
        auth = self.headers.get("Authorization")
        if repo is None or (repo.token is not None and auth != f"Bearer {repo.token}"):
            status = 401 if repo is not None else 404
            self._error(status, "RepoNotFound", "Repository not found", head)
            return None
        return repo

    def _commit(self, repo: Repo, revision: str, head: bool) -> str | None:
        commit = repo.commit_for(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        return commit

    def _api(self, parts: list[str], head: bool) -> None:
        if len(parts) < 3 or parts[0] not in ("models", "datasets", "spaces"):
            return self._error(404, "", "Not Found", head)
        repo_type, repo_id = parts[0][:-1], "/".join(parts[1:3])
        route = parts[3] if len(parts) >= 5 else "info"
        known = route in ("info", "revision", "tree", "paths-info")
        if not known or (route == "paths-info") != (self.command == "POST"):
            return self._error(404 if self.command != "POST" else 405, "", "Not Found", head)
        repo = self._repo(repo_type, repo_id, head)
        if repo is None:
            return None
        commit = self._commit(repo, unquote(parts[4]) if len(parts) >= 5 else "main", head)
        if commit is None:
            return None
        query = parse_qs(urlsplit(self.path).query)
        if route == "tree":
            return self._tree(repo.commits[commit], commit, unquote("/".join(parts[5:])).strip("/"),
                              _truthy(query.get("recursive")), _truthy(query.get("expand")), head)
        if route == "paths-info":
            return self._paths_info(repo.commits[commit], commit, head)
        self._info(repo, repo_id, commit, _truthy(query.get("blobs")), head)

    def _info(self, repo: Repo, repo_id: str, commit: str, blobs: bool, head: bool) -> None:
        files = repo.commits[commit]
        siblings = [self._sibling(name, data) if blobs else {"rfilename": name} for name, data in files.items()]
        body = json.dumps({"_id": "0" * 24, "id": repo_id, "modelId": repo_id, "sha": commit,
                           "private": repo.token is not None, "tags": [], "lastModified": COMMIT_DATE,
                           "siblings": siblings}).encode()
        self._send(200, {"Content-Type": "application/json"}, body, head)

    @staticmethod
    def _sibling(name: str, data: bytes) -> dict:
        sibling: dict = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            pointer = lfs_pointer(data)
            sibling.update(blobId=git_blob_id(pointer), lfs={"sha256": sha256_of(data),
                                                             "size": len(data), "pointerSize": len(pointer)})
        return sibling

    # ------------------------------------------------------------------ tree and paths-info
    @staticmethod
    def _entry(files: dict[str, bytes], path: str, commit: str, expand: bool) -> dict | None:
        """The tree entry of `path` (a file or a directory), or None when there is none."""
        last_commit = {"lastCommit": {"id": commit, "title": "weightio test commit", "date": COMMIT_DATE}}
        if path in files:
            data = files[path]
            entry: dict = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
            if path.endswith(LFS_SUFFIXES):
                pointer = lfs_pointer(data)
                entry.update(oid=git_blob_id(pointer), lfs={"oid": sha256_of(data),
                                                            "size": len(data), "pointerSize": len(pointer)})
            if expand:
                entry.update(last_commit, securityFileStatus={
                    "status": "safe", "avScan": {"virusFound": False, "virusNames": None}, "pickleImportScan": None})
            return entry
        if not any(name.startswith(path + "/") for name in files):
            return None
        tree_id = hashlib.sha1(f"tree {commit} {path}".encode()).hexdigest()
        return {"type": "directory", "oid": tree_id, "size": 0, "path": path, **(last_commit if expand else {})}

    def _tree(self, files: dict[str, bytes], commit: str, path: str, recursive: bool, expand: bool,
              head: bool) -> None:
        prefix = path + "/" if path else ""
        if path and (path in files or not any(name.startswith(prefix) for name in files)):
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{commit}\"", head)
        below = {name[len(prefix):] for name in files if name.startswith(prefix)}
        folders, names = set(), set()
        for rest in below:
            parts = rest.split("/")
            if recursive or len(parts) == 1:
                names.add(prefix + rest)
            for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
                folders.add(prefix + "/".join(parts[:depth]))
        entries = [self._entry(files, p, commit, expand) for p in sorted(folders) + sorted(names)]
        self._send(200, {"Content-Type": "application/json"}, json.dumps(entries).encode(), head)

    def _paths_info(self, files: dict[str, bytes], commit: str, head: bool) -> None:
        if self.headers.get("Content-Type", "").startswith("application/json"):
            asked = json.loads(self.body_in or b"{}")
            paths, expand = list(asked.get("paths", [])), bool(asked.get("expand", False))
        else:
            form = parse_qs(self.body_in.decode())
            paths, expand = form.get("paths", []), _truthy(form.get("expand"))
        entries = [self._entry(files, p.strip("/"), commit, expand) for p in paths]
        body = json.dumps([e for e in entries if e is not None]).encode()
        self._send(200, {"Content-Type": "application/json"}, body, head)

    # ------------------------------------------------------------------ files
    def _resolve(self, repo_type: str, repo_id: str, revision: str, filename: str, head: bool) -> None:
        repo = self._repo(repo_type, repo_id, head)
        if repo is None:
            return None
        commit = self._commit(repo, revision, head)
        if commit is None:
            return None
        data = repo.commits[commit].get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist on \"{revision}\"", head,
                               {"X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit}
        if filename.endswith(LFS_SUFFIXES):
            sha256 = sha256_of(data)
            with self.hub.lock:
                self.hub.blobs[sha256] = data
            port = self.server.server_address[1]  # type: ignore[attr-defined]
            headers.update({"Location": f"http://localhost:{port}/cdn/{sha256}", "X-Linked-Etag": f'"{sha256}"',
                            "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_id(data)}"'})
            return self._send(302, headers, b"", head)
        self.send_content(data, f'"{git_blob_id(data)}"', head, headers)

    def _cdn(self, sha256: str, head: bool) -> None:
        with self.hub.lock:
            data = self.hub.blobs.get(sha256)
        if data is None:
            return self._error(404, "", "NoSuchKey", head)
        with self.hub.lock:
            self.hub.cdn_authorization.append(self.headers.get("Authorization"))
        self.send_content(data, f'"{sha256}"', head)

    # ------------------------------------------------------------------ responses
    def send_failure(self, status: int, head: bool) -> None:
        self._error(status, "", f"injected failure {status}", head)

    def _error(self, status: int, code: str, message: str, head: bool, extra: dict[str, str] | None = None) -> None:
        headers = {"X-Error-Message": message, "Content-Type": "application/json", **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": message}).encode(), head)

    def _send(self, status: int, headers: dict[str, str], body: bytes, head: bool) -> None:
        self.send_body(status, headers, body, head)


class HubServer(LoopbackServer):
    """The running server: its `url` (what HF_ENDPOINT is set to), repos and request log.

    Attributes (besides `tests.servers.LoopbackServer`'s log and knobs):
        repos: ``(repo_type, repo_id) -> Repo``; may be changed while the server runs.
        requests: a `tests.servers.Request` per request, in order; each unpacks as
            ``(method, path, headers)`` (header names lower-cased).
        blobs: ``sha256 -> bytes`` the CDN serves (filled when ``/resolve`` redirects there).
        cdn_authorization: the ``Authorization`` header (or None) of every CDN request of a known blob.
        fail_with: when set to ``(status, message)``, every request answers that error.
    """

    def __init__(self, repos: dict[tuple[str, str], Repo]) -> None:
        super().__init__()
        self.repos = repos
        self.cdn_authorization: list[str | None] = []
        self.blobs: dict[str, bytes] = {}
        self.fail_with: tuple[int, str] | None = None
        self._server = self._http_server(_Handler)

    def _close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _counted(self, request: Request) -> bool:
        return not request.path.startswith(CLIENT_OWN)

    def paths(self, method: str | None = None) -> list[str]:
        """The request paths seen so far (of one method when given), without query strings, leaving
        out what the client asks on its own behalf (its agent registry)."""
        return [urlsplit(r.path).path for r in self.matching(method)]

    def replace_file(self, repo_id: str, path: str, data: bytes, *, repo_type: str = "model",
                     revision: str = "main", keep_old_blob: bool = True) -> None:
        """Change `path` in place at `revision`'s commit (same commit sha): its size, ETag and sha256 change.

        The old LFS bytes stay at their ``/cdn/{sha256}`` URL (content-addressed, as on the Hub's
        CDN) unless `keep_old_blob` is false, which makes that URL answer 404.
        """
        repo = self.repos[(repo_type, repo_id)]
        files = repo.commits[repo.commit_for(revision) or revision]
        with self.lock:
            old = files.get(path)
            files[path] = bytes(data)
            if old is not None and not keep_old_blob:
                self.blobs.pop(sha256_of(old), None)

    def file_url(self, repo_id: str, path: str, *, repo_type: str = "model", revision: str = "main") -> str:
        """The ``/resolve`` URL of a file (what ``hf_hub_url`` builds)."""
        prefix = {"model": "", "dataset": "datasets/", "space": "spaces/"}[repo_type]
        return f"{self.url}/{prefix}{repo_id}/resolve/{revision.replace('/', '%2F')}/{path}"


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
