"""Serving test files remotely, for the tests of remote reading (issue 14).

`remote_files` gives a `Served`: put files in, get their URLs (``http://127.0.0.1:PORT/…``, served
by the real loopback `tests.servers.HTTPRangeServer`: Range, ETag, If-Match), and read what moved:
`moved` counts the requests and body bytes the server answered (HEAD included), `traffic` what a
checkpoint's remote files fetched (range requests only).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import weightio as wio


class Served:
    """Files served under one base URL by `server` (a `tests.servers.HTTPRangeServer`)."""

    def __init__(self, server) -> None:  # noqa: ANN001
        self.server = server

    def put(self, name: str, data: bytes) -> str:
        """Serve `data` as `name` (may hold "/"); its URL."""
        return self.server.add(name, data)

    def url(self, name: str = "") -> str:
        """The URL of `name`; of the root folder when empty."""
        return self.server.url_for(name) if name else self.server.url + "/"

    def moved(self) -> tuple[int, int]:
        """(requests, body bytes) the server answered since the last `reset` (waits for answers in flight)."""
        self.server.idle()
        return self.server.count(), self.server.bytes_sent

    def reset(self) -> None:
        self.server.idle()
        self.server.reset()


def traffic(checkpoint) -> tuple[int, int]:  # noqa: ANN001
    """(requests, bytes) a checkpoint's remote files fetched so far (range requests only)."""
    from weightio.remote import traffic as count

    return count(checkpoint)


def same_as_local(local, remote) -> None:  # noqa: ANN001
    """Names, shapes, dtypes, metadata, values and a slice of every tensor agree between a local
    checkpoint and the same file opened by URL (a tensor refused locally is refused remotely, the same way)."""
    from weightio.errors import WeightioError

    assert list(remote.keys()) == list(local.keys())
    assert remote.metadata == local.metadata
    for name in local.keys():
        a, b = local[name], remote[name]
        assert (b.shape, b.dtype, b.nbytes) == (a.shape, a.dtype, a.nbytes), name
        try:
            expected = a.numpy()
        except WeightioError as e:
            with pytest.raises(type(e)):
                b.numpy()
            continue
        got = b.numpy()
        assert got.tobytes() == expected.tobytes() and got.shape == expected.shape, name
        if expected.ndim and expected.shape[0] > 1:
            assert b[1:].tobytes() == expected[1:].tobytes(), name


def reads_the_same_by_url(remote_files: Served, path) -> None:  # noqa: ANN001
    """A fixture file opened by URL reads as it does locally (`same_as_local`), fetching no byte
    twice (but for the last bytes a zip-like name has fetched with its first, which overlap them in a
    file smaller than both); one refused locally is refused by URL with the same error type, naming the URL."""
    from weightio.errors import WeightioError
    from weightio.remote import first_reads

    data = path.read_bytes()
    url = remote_files.put(path.name, data)
    try:
        local = wio.open(path)
    except WeightioError as e:
        with pytest.raises(type(e)) as caught:
            wio.open(url)
        assert url in str(caught.value)
        return
    with local, wio.open(url) as remote:
        assert traffic(remote)[1] <= len(data) + first_reads(path.name)[1]
        same_as_local(local, remote)


@pytest.fixture
def remote_files(http_server) -> Iterator[Served]:  # noqa: ANN001
    yield Served(http_server)
