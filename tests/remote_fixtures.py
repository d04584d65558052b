"""Serving test files remotely, for the tests of remote reading (issue 14).

`remote_files` gives a `Served`: put files in, get their URLs, read the traffic the client made.
Its backing server is swapped for the real loopback HTTP server of tests/servers.py once it
lands; until then it serves through fsspec's in-memory filesystem, so the client path (ranges,
cache, counting in `weightio._remote.RemoteFile.traffic`) is the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

_ids = itertools.count()


class Served:
    """Files served under one base URL."""

    def __init__(self) -> None:
        fsspec = pytest.importorskip("fsspec")
        self.fs = fsspec.filesystem("memory")
        self.root = f"/served{next(_ids)}"

    def put(self, name: str, data: bytes) -> str:
        """Serve `data` as `name` (may hold "/"); its URL."""
        self.fs.pipe(f"{self.root}/{name}", data)
        return self.url(name)

    def url(self, name: str = "") -> str:
        return f"memory://{self.root}/{name}" if name else f"memory://{self.root}"


def traffic(checkpoint) -> tuple[int, int]:  # noqa: ANN001
    """(requests, bytes) a checkpoint's remote files made so far."""
    from weightio.remote import traffic as count

    return count(checkpoint)


@pytest.fixture
def remote_files() -> Iterator[Served]:
    served = Served()
    yield served
    served.fs.rm(served.root, recursive=True)
