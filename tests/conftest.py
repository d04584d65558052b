"""Shared test helpers: fixture paths, the manifest written by the fixture script, file builders."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def outcome(run: Callable[[], Any]) -> Any:
    """What `run()` returns, or (type, message) of the `WeightioError` it raises: what a fast path
    and the general one it stands in for must agree on."""
    from weightio.errors import WeightioError

    try:
        return run()
    except WeightioError as e:
        return type(e), str(e)


def both_ways(monkeypatch, module: Any, name: str, replacement: Any, run: Callable[[], Any]) -> tuple[Any, Any]:
    """`outcome` of `run()` with ``module.name`` as it is (the fast path), then with it replaced
    by `replacement` (which sends the code to the general path)."""
    fast = outcome(run)
    with monkeypatch.context() as m:
        m.setattr(module, name, replacement)
        general = outcome(run)
    return fast, general


def on_threads(work: Callable[[int], Any], n: int = 8) -> None:
    """``work(k)`` on `n` threads at once, k = 0..n-1; returns once every one has ended."""
    import threading

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def child_exit_code(pid: int, seconds: float, hung: str) -> int:
    """The exit code of forked child `pid`; killed and the test failed with `hung` if it has not
    ended within `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(hung)


def manifest() -> dict[str, dict]:
    with open(FIXTURES / "manifest.json") as f:
        return json.load(f)


def pyproject() -> dict:
    """pyproject.toml beside the tests, parsed (``tomllib``; on Python 3.10 ``tomli``, the same
    parser from PyPI, which the test extra installs there); skips where neither or no file is found."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    path = FIXTURES.parent / "pyproject.toml"
    if not path.exists():
        pytest.skip("no pyproject.toml beside the tests")
    return tomllib.loads(path.read_text())


def digest(arr: np.ndarray) -> str:
    """SHA-256 of an array's C-ordered little-endian bytes (what fixtures/manifest.json records)."""
    arr = arr.copy(order="C")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(arr.reshape(-1).view(np.uint8).tobytes()).hexdigest()


def safetensors_bytes(header: dict | bytes | str, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file: u64 header length, header (JSON-encoded unless bytes/str), data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


@pytest.fixture
def write(tmp_path):
    """write(name, bytes) -> path of a new file in the test's temporary directory."""

    def _write(name: str, content: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(content)
        return path

    return _write


# ----------------------------------------------------------------------------- loopback protocol servers
# The real servers the remote tests run against (tests/servers.py, tests/hubserver.py): each counts the
# requests and body bytes it answers and has the delay / failures / ignore_range knobs.


@pytest.fixture
def http_server():
    """A started `tests.servers.HTTPRangeServer` with no files: ``http_server.add(path, bytes)`` -> URL."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from .servers import HTTPRangeServer

    with HTTPRangeServer() as server:
        yield server


@pytest.fixture(scope="session")
def _s3_session_server():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from .servers import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3_server(_s3_session_server, monkeypatch):
    """moto's S3 (`tests.servers.S3Server`, one per session), empty and with a fresh log for each test.

    The AWS variables (``server.env``: testing credentials, us-east-1, ``AWS_ENDPOINT_URL_S3``) are
    set for the test, so ``s3://bucket/key`` needs no storage_options; s3fs's instance cache is
    cleared before and after, so no test gets a filesystem made for another's settings.
    """
    import s3fs

    from .servers import S3_UNSET

    server = _s3_session_server
    for var in S3_UNSET:
        monkeypatch.delenv(var, raising=False)
    for var, value in server.env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    server.clear()
    server.delay, server.ignore_range = 0.0, False
    server.failures.clear()
    server.reset()
    s3fs.S3FileSystem.clear_instance_cache()
    yield server
    s3fs.S3FileSystem.clear_instance_cache()
    server.failures.clear()
    server.delay, server.ignore_range = 0.0, False


@pytest.fixture
def serve_hub(tmp_path, monkeypatch):
    """serve_hub(repos) -> a started `tests.hubserver.HubServer`, huggingface_hub pointed at it.

    ``repos`` is ``{(repo_type, repo_id): Repo}``; the client gets an empty cache under
    ``tmp_path / "hf-cache"`` and no token (see `tests.hubserver.point_client_at`); the client's
    cache default (``constants.HF_HUB_CACHE``, read at import) and the module-level functions
    (``huggingface_hub.list_repo_files`` … are bound to an ``HfApi`` made at import) follow. The
    servers stop, and HfFileSystem's instance cache is cleared, when the test ends.
    """
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants
    import huggingface_hub.hf_api

    from .hubserver import HubServer, point_client_at

    started = []

    def _serve(repos: dict) -> HubServer:
        server = HubServer(repos).start()
        started.append(server)
        point_client_at(server, monkeypatch, tmp_path / "hf-cache")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", server.url)
        return server

    yield _serve
    for server in started:
        server.stop()
    from huggingface_hub import HfFileSystem

    HfFileSystem.clear_instance_cache()

from tests.remote_fixtures import remote_files  # noqa: E402,F401 - a fixture for the remote tests
