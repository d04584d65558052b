"""numpy ``.npz`` and ``.npy`` opened by URL (issue 14): the same arrays as the local open, for the
archive's headers and each member's ``.npy`` header only; deflated members inflated from their
own bytes; hostile archives refused as locally.

Served by the `remote_files` fixture (tests/remote_fixtures.py); the traffic is what the client
counted (`weightio.remote.traffic`), whatever serves the files.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import weightio as wio
from tests.conftest import FIXTURES
from tests.remote_fixtures import reads_the_same_by_url, same_as_local, traffic
from weightio.errors import CorruptFileError

KIB = 1 << 10
_FIXTURES = sorted(p for d in ("numpy", "numpy_dtypes") for p in (FIXTURES / d).iterdir() if p.is_file())
_ARRAYS = {f"layer{i}": np.arange(i, i + 128 * 1024, dtype=np.float32).reshape(256, 512) for i in range(8)}


@pytest.mark.parametrize("path", _FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_reads_the_same_by_url(remote_files, path):
    reads_the_same_by_url(remote_files, path)


def _header_bytes(data: bytes) -> int:
    """The end record, central directory, and each member's local header and .npy header."""
    eocd = data.rfind(b"PK\x05\x06")
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack_from("<IHHHHIIH", data, eocd)
    total, pos = len(data) - cd_offset, cd_offset
    for _ in range(count):
        f = struct.unpack_from("<IHHHHHHIIIHHHHHII", data, pos)
        at = f[16]
        name_length, extra = struct.unpack_from("<HH", data, at + 26)
        start = at + 30 + name_length + extra
        npy = 10 + struct.unpack_from("<H", data, start + 8)[0] if f[4] == 0 else 256  # deflated: a guess
        total += 30 + name_length + extra + npy
        pos += 46 + f[10] + f[11] + f[12]
    return total


@pytest.fixture(params=["savez", "weightio"])
def npz(request, tmp_path):
    path = tmp_path / "arrays.npz"
    if request.param == "savez":
        np.savez(path, **_ARRAYS)
    else:
        wio.save(dict(_ARRAYS), str(path))
    return path


def test_npz_opens_from_its_headers(remote_files, npz):
    data = npz.read_bytes()
    with wio.open(npz) as local, wio.open(remote_files.put("arrays.npz", data)) as remote:
        requests, moved = traffic(remote)
        assert moved <= _header_bytes(data) + 64 * KIB
        assert requests <= len(_ARRAYS) + 2  # the end, then every member's headers in flight together
        before = traffic(remote)[1]
        assert remote["layer3"].numpy().tobytes() == _ARRAYS["layer3"].tobytes()
        assert traffic(remote)[1] - before <= _ARRAYS["layer3"].nbytes + 64 * KIB
        before = traffic(remote)[1]
        assert remote["layer5"][10:12].tobytes() == _ARRAYS["layer5"][10:12].tobytes()
        assert traffic(remote)[1] - before <= 2 * 512 * 4 + 64 * KIB
        same_as_local(local, remote)


def test_compressed_npz_inflates_members_from_their_own_bytes(remote_files, tmp_path):
    path = tmp_path / "compressed.npz"
    np.savez_compressed(path, **_ARRAYS)
    data = path.read_bytes()
    with wio.open(path) as local, wio.open(remote_files.put("compressed.npz", data)) as remote:
        requests, moved = traffic(remote)
        assert moved <= _header_bytes(data) + 64 * KIB + len(_ARRAYS) * 1024
        before = traffic(remote)[1]
        assert remote["layer2"].numpy().tobytes() == _ARRAYS["layer2"].tobytes()
        assert traffic(remote)[1] - before <= len(data) // len(_ARRAYS) + 64 * KIB  # its compressed bytes
        same_as_local(local, remote)


def test_npy_opens_from_its_prefix(remote_files, tmp_path):
    path = tmp_path / "big.npy"
    array = np.arange(1 << 20, dtype=np.float64).reshape(1024, 1024)
    np.save(path, array)
    with wio.open(remote_files.put("big.npy", path.read_bytes())) as remote:
        assert traffic(remote) == (1, 4 * KIB)  # an .npy's first 4 KiB hold its header: no more is asked
        name = next(iter(remote.keys()))
        before = traffic(remote)[1]
        assert remote[name][100:102].tobytes() == array[100:102].tobytes()
        assert traffic(remote)[1] - before <= 2 * 1024 * 8 + 64 * KIB


def test_member_whose_local_header_disagrees_is_refused(remote_files, tmp_path):
    path = tmp_path / "renamed.npz"
    np.savez(path, **_ARRAYS)
    data = bytearray(path.read_bytes())
    at = data.find(b"layer4.npy")  # the local header's copy of the name (before the central directory's)
    data[at: at + 6] = b"LAYER4"
    url = remote_files.put("renamed.npz", bytes(data))
    with pytest.raises(CorruptFileError, match="local header name") as caught:
        wio.open(url)
    assert url in str(caught.value)


def test_central_directory_past_the_remote_size_is_refused(remote_files, tmp_path):
    path = tmp_path / "past.npz"
    np.savez(path, **_ARRAYS)
    data = bytearray(path.read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    struct.pack_into("<I", data, eocd + 16, len(data) * 2)
    url = remote_files.put("past.npz", bytes(data))
    with pytest.raises(CorruptFileError, match="central directory") as caught:
        wio.open(url)
    assert url in str(caught.value)


# ----------------------------------------------------------------------------- the opening plan by name


@pytest.mark.parametrize(("name", "expected"), [
    ("model.safetensors", (64 * KIB, 0)),
    ("model.gguf", (64 * KIB, 0)),
    ("weights.npz", (4 * KIB, 16 * KIB)),
    ("embed.NPY", (4 * KIB, 0)),
    ("model.pt", (64 * KIB, 16 * KIB)),
    ("last.ckpt?versionId=3", (64 * KIB, 16 * KIB)),
    ("pytorch_model.bin", (64 * KIB, 16 * KIB)),  # torch's zip, most often (ggml's or a pickle: 16 KiB wasted)
])
def test_first_reads_follow_the_name(name, expected):
    from weightio.remote import first_reads

    assert first_reads(name) == expected


def test_npz_brings_its_end_with_its_first_bytes(remote_files, tmp_path):
    """An .npz's first 4 KiB and last 16 KiB are asked together (its central directory is in them),
    then each member's local header: three members, two more requests, and no tensor data."""
    arrays = {k: v for k, v in list(_ARRAYS.items())[:3]}
    path = tmp_path / "three.npz"
    np.savez(path, **arrays)
    data = path.read_bytes()
    url = remote_files.put("three.npz", data)
    remote_files.reset()
    with wio.open(url) as remote:
        log = list(remote_files.server.matching())
        assert {r.range for r in log[:2]} == {"bytes=-16384", "bytes=0-4095"}
        assert len(log) == 2 + 2  # the first member's local header came with the first 4 KiB
        assert traffic(remote)[1] == 4 * KIB + 16 * KIB + sum(r.bytes for r in log[2:])
        assert traffic(remote)[1] <= 4 * KIB + 16 * KIB + 2 * 256
        assert {n: remote[n].shape for n in remote} == {n: a.shape for n, a in arrays.items()}
        assert remote["layer2"].numpy().tobytes() == arrays["layer2"].tobytes()


def test_s3_npz_asks_its_first_and_last_bytes_together(s3_server, tmp_path):
    arrays = {k: v for k, v in list(_ARRAYS.items())[:2]}
    path = tmp_path / "two.npz"
    np.savez(path, **arrays)
    data = path.read_bytes()
    url = s3_server.put("models", "two.npz", data)
    s3_server.reset()
    with wio.open(url, storage_options=s3_server.storage_options) as remote:
        assert s3_server.count(method="HEAD") == 0  # found by its first ranged GET: size and ETag come with it
        gets = [r.range for r in s3_server.matching("GET")]
        assert set(gets[:2]) == {"bytes=-16384", "bytes=0-4095"}  # together, the last by a suffix range
        assert len(gets) == 2 + 1
        assert remote["layer1"].numpy().tobytes() == arrays["layer1"].tobytes()


def test_local_headers_go_out_in_one_wave_and_a_failed_one_is_asked_again(remote_files, tmp_path):
    """The local headers of an .npz's members are asked in one wave (every request out before any
    is answered); one answered 503 in that wave is asked again alone, and the archive opens."""
    arrays = dict(list(_ARRAYS.items())[:6])
    path = tmp_path / "six.npz"
    np.savez(path, **arrays)
    url = remote_files.put("six.npz", path.read_bytes())
    remote_files.reset()
    remote_files.server.delay = 0.05
    with wio.open(url) as remote:
        remote_files.server.idle()
        assert remote_files.server.peak_in_flight >= 5  # the five local headers past the first 4 KiB, at once
    remote_files.reset()
    remote_files.server.failures["six.npz"] = [None, None, 503]  # the first and last bytes pass, a header fails
    with wio.open(url) as remote:
        remote_files.server.idle()
        statuses = [r.status for r in remote_files.server.matching()]
        assert statuses.count(503) == 1 and len(statuses) == 2 + 5 + 1  # the failed header asked again, once
        assert {n: remote[n].numpy().tobytes() for n in remote} == {n: a.tobytes() for n, a in arrays.items()}


def test_s3_local_headers_go_out_in_one_wave_and_a_failed_one_is_asked_again(s3_server, tmp_path):
    """The same over S3: one wave on s3fs's event loop, each range guarded by the object's ETag."""
    arrays = dict(list(_ARRAYS.items())[:6])
    path = tmp_path / "six.npz"
    np.savez(path, **arrays)
    url = s3_server.put("models", "six.npz", path.read_bytes())
    s3_server.reset()
    s3_server.delay = 0.05
    with wio.open(url, storage_options=s3_server.storage_options):
        s3_server.idle()
        assert s3_server.peak_in_flight >= 5  # the five local headers past the first 4 KiB, at once
        headers = s3_server.matching("GET")[2:]
        assert len(headers) == 5 and all(r.headers.get("if-match") for r in headers)
    s3_server.reset()
    s3_server.delay = 0.0
    s3_server.failures["six.npz"] = [None, None, 503]  # the first and last bytes pass, a header fails
    with wio.open(url, storage_options=s3_server.storage_options) as remote:
        s3_server.idle()
        statuses = [r.status for r in s3_server.matching("GET")]
        assert 503 in statuses and statuses.count(206) == 2 + 5  # the failed header asked again until answered
        assert {n: remote[n].numpy().tobytes() for n in remote} == {n: a.tobytes() for n, a in arrays.items()}
