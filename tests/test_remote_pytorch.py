"""PyTorch checkpoints (zip, legacy raw pickle, legacy tar) opened by URL (issue 14): the same
tensors, metadata and values as the local open, for header bytes only, and hostile archives refused.

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
from weightio.formats.pytorch.containers import open_container

KIB = 1 << 10
_FIXTURES = sorted(p for d in ("pytorch", "training") for p in (FIXTURES / d).iterdir()
                   if p.is_file() and p.suffix != ".json")


@pytest.mark.parametrize("path", _FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_reads_the_same_by_url(remote_files, path):
    reads_the_same_by_url(remote_files, path)


# ----------------------------------------------------------------------------- a torch zip of many storages


def _zip_parts(data: bytes) -> dict:
    """The central directory's size and offset, and each member's (header offset, name, size)."""
    eocd = data.rfind(b"PK\x05\x06")
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack_from("<IHHHHIIH", data, eocd)
    members, pos = {}, cd_offset
    for _ in range(count):
        f = struct.unpack_from("<IHHHHHHIIIHHHHHII", data, pos)
        name = data[pos + 46: pos + 46 + f[10]].decode()
        members[name] = (f[16], f[9])
        pos += 46 + f[10] + f[11] + f[12]
    return {"cd_size": cd_size, "cd_offset": cd_offset, "members": members}


@pytest.fixture(scope="module")
def many_storages(tmp_path_factory):
    """A torch.save of 300 storages of 64 KiB each (skipped without torch)."""
    torch = pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("torch") / "many.pt"
    torch.save({f"w{i}": torch.full((16384,), float(i)) for i in range(300)}, path)
    return path.read_bytes()


def _pickle_size(parts: dict) -> int:
    return next(size for name, (_, size) in parts["members"].items() if name.endswith("/data.pkl"))


def test_torch_zip_opens_from_its_headers(remote_files, many_storages):
    parts = _zip_parts(many_storages)
    with wio.open(remote_files.put("many.pt", many_storages)) as ckpt:
        requests, moved = traffic(ckpt)
        assert len(ckpt) == 300 and ckpt["w299"].shape == (16384,)
    assert requests <= 4
    assert moved <= parts["cd_size"] + _pickle_size(parts) + 64 * KIB


def test_torch_zip_reads_one_tensor_for_its_bytes(remote_files, many_storages):
    with wio.open(remote_files.put("many.pt", many_storages)) as ckpt:
        before = traffic(ckpt)[1]
        values = ckpt["w123"].numpy()
        assert values.shape == (16384,) and (values == 123).all()
        assert traffic(ckpt)[1] - before <= ckpt["w123"].nbytes + 64 * KIB
        before = traffic(ckpt)[1]
        assert (ckpt["w7"][100:200] == 7).all()
        assert traffic(ckpt)[1] - before <= 100 * 4 + 64 * KIB


def test_torch_zip_whole_read_matches_local(remote_files, many_storages, tmp_path):
    path = tmp_path / "many.pt"
    path.write_bytes(many_storages)
    with wio.open(path) as local, wio.open(remote_files.put("many.pt", many_storages)) as remote:
        for name in remote.keys():
            assert remote[name].numpy().tobytes() == local[name].numpy().tobytes()
        requests, moved = traffic(remote)
        assert moved <= len(many_storages) + 64 * KIB
        assert requests <= 300 + 300 // 16 + 4  # a storage's local header comes with 15 others' in one batch
        same_as_local(local, remote)


def test_torch_zip_with_a_pickle_larger_than_a_block(remote_files, tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "long.pt"
    torch.save({f"layer.{i}.attention.output.dense.weight": torch.full((256,), float(i)) for i in range(2000)}, path)
    data = path.read_bytes()
    parts = _zip_parts(data)
    with wio.open(path) as local, wio.open(remote_files.put("long.pt", data)) as remote:
        requests, moved = traffic(remote)
        assert requests <= 4
        assert moved <= parts["cd_size"] + _pickle_size(parts) + 64 * KIB
        same_as_local(local, remote)


@pytest.mark.parametrize("alignment", [256, 4096])
def test_torch_zip_with_another_storage_alignment(remote_files, tmp_path, alignment):
    torch = pytest.importorskip("torch")
    config = pytest.importorskip("torch.utils.serialization").config.save
    path = tmp_path / "aligned.pt"
    old = config.storage_alignment
    config.storage_alignment = alignment
    try:
        torch.save({f"w{i}": torch.arange(1000 + i, dtype=torch.float32) for i in range(20)}, path)
    finally:
        config.storage_alignment = old
    with wio.open(path) as local, wio.open(remote_files.put("aligned.pt", path.read_bytes())) as remote:
        assert traffic(remote)[0] <= 4
        same_as_local(local, remote)


# ----------------------------------------------------------------------------- hostile archives


def test_central_directory_past_the_remote_size_is_refused(remote_files, many_storages):
    data = bytearray(many_storages)
    eocd = data.rfind(b"PK\x05\x06")
    struct.pack_into("<I", data, eocd + 16, len(data) + 1000)  # the central directory's offset
    url = remote_files.put("past.pt", bytes(data))
    with pytest.raises(CorruptFileError, match="central directory") as caught:
        wio.open(url)
    assert url in str(caught.value)


def _local_header_offset(data: bytes, name: str) -> int:
    parts = _zip_parts(data)
    return next(offset for member, (offset, _) in parts["members"].items() if member.endswith(name))


def _data_at(data: bytes, k: int) -> int:
    at = _local_header_offset(data, f"/data/{k}")
    name_length, extra = struct.unpack_from("<HH", data, at + 26)
    return at + 30 + name_length + extra


def test_local_header_that_moves_the_data_is_refused_when_read(remote_files, many_storages, tmp_path):
    data = bytearray(many_storages)
    at = _local_header_offset(data, "/data/5")
    (extra,) = struct.unpack_from("<H", data, at + 28)
    struct.pack_into("<H", data, at + 28, extra - 4)  # the data would start 4 bytes earlier
    url = remote_files.put("moved.pt", bytes(data))
    path = tmp_path / "moved.pt"
    path.write_bytes(data)
    with wio.open(path) as local:  # a local open follows every local header (torch.load would too)
        assert local["w5"].numpy().view(np.uint8)[4:].tobytes() == many_storages[_data_at(many_storages, 5):][:65532]
    with wio.open(url) as ckpt:  # remotely the local header is read with the storage's first read
        assert (ckpt["w4"].numpy() == 4).all()
        before = traffic(ckpt)[1]
        with pytest.raises(CorruptFileError, match="local header of .*data/5.* puts its data at offset") as caught:
            ckpt["w5"].numpy()
        assert url in str(caught.value) and "w5" in str(caught.value)
        assert traffic(ckpt)[1] - before < 64 * KIB  # refused before the tensor's bytes were fetched
        assert (ckpt["w6"].numpy() == 6).all()


def test_local_header_with_another_name_is_refused_when_read(remote_files, many_storages):
    data = bytearray(many_storages)
    at = _local_header_offset(data, "/data/17")
    name_length = struct.unpack_from("<H", data, at + 26)[0]
    data[at + 30 + name_length - 1: at + 30 + name_length] = b"9"  # .../data/17 -> .../data/19
    url = remote_files.put("renamed.pt", bytes(data))
    with wio.open(url) as ckpt:
        with pytest.raises(CorruptFileError, match="local header name") as caught:
            ckpt["w17"][:10]
        assert url in str(caught.value)


def test_local_header_with_another_method_is_refused_when_read(remote_files, many_storages):
    data = bytearray(many_storages)
    at = _local_header_offset(data, "/data/40")
    struct.pack_into("<H", data, at + 8, 8)  # deflate, where the central directory says stored
    with wio.open(remote_files.put("method.pt", bytes(data))) as ckpt:
        with pytest.raises(CorruptFileError, match="differs from the central directory"):
            ckpt["w40"].numpy()


def test_overlapping_members_are_refused_at_open(remote_files, many_storages):
    data = bytearray(many_storages)
    parts = _zip_parts(data)
    # point data/8's central entry at data/7's local header: a duplicate region
    pos = parts["cd_offset"]
    target = _local_header_offset(data, "/data/7")
    for _ in range(len(parts["members"])):
        f = struct.unpack_from("<IHHHHHHIIIHHHHHII", data, pos)
        if data[pos + 46: pos + 46 + f[10]].endswith(b"/data/8"):
            struct.pack_into("<I", data, pos + 42, target)
        pos += 46 + f[10] + f[11] + f[12]
    with pytest.raises(CorruptFileError, match="overlap"):
        wio.open(remote_files.put("overlap.pt", bytes(data)))


# ----------------------------------------------------------------------------- legacy formats


def test_legacy_checkpoint_fetches_storage_counts_not_data(remote_files, tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "legacy.pt"
    torch.save({f"w{i}": torch.full((65536,), float(i)) for i in range(12)}, path,
               _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    with wio.open(path) as local, wio.open(remote_files.put("legacy.pt", data)) as remote:
        requests, moved = traffic(remote)
        pickles = sum(len(raw) for _, raw in open_container(local.readers[0].file).pickles)
        # the pickles' cache block, the last 16 KiB a .pt name brings along (it may be a zip), each count alone
        assert moved <= pickles + 12 * 8 + 64 * KIB + 16 * KIB
        assert requests <= 1 + 1 + 12
        same_as_local(local, remote)


def _legacy_tar(path, arrays: dict) -> None:
    """torch 0.1.x's tar layout (fixtures/gen_pytorch.py's make_legacy_tar), 1-D float32 tensors."""
    import io
    import pickle
    import tarfile

    torch = pytest.importorskip("torch")
    main, tensors, blob = io.BytesIO(), io.BytesIO(), io.BytesIO()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):  # noqa: ANN001, ANN202
            return str(1000 + list(arrays).index(obj.name)) if isinstance(obj, _Named) else None

    Pickler(main, protocol=2).dump({name: _Named(name) for name in arrays})
    pickle.dump(len(arrays), tensors, protocol=2)
    pickle.dump(len(arrays), blob, protocol=2)
    for k, values in enumerate(arrays.values()):
        pickle.dump((1000 + k, 2000 + k, torch.FloatTensor), tensors, protocol=2)
        tensors.write(struct.pack("<ii", 1, 0) + struct.pack("<3q", len(values), 1, 0))
        pickle.dump((2000 + k, "cpu", torch.FloatStorage), blob, protocol=2)
        blob.write(struct.pack("<q", len(values)) + values.astype("<f4").tobytes())
    pickle.dump([], blob, protocol=2)
    sys_info = pickle.dumps({"protocol_version": 1000, "little_endian": True,
                             "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("sys_info", sys_info), ("pickle", main.getvalue()), ("tensors", tensors.getvalue()),
                           ("storages", blob.getvalue())):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_legacy_tar_walks_its_storages_without_their_data(remote_files, tmp_path):
    arrays = {f"w{k}": np.arange(65536, dtype=np.float32) + k for k in range(6)}  # 256 KiB each
    path = tmp_path / "old.pt"
    _legacy_tar(path, arrays)
    data = path.read_bytes()
    with wio.open(path) as local, wio.open(remote_files.put("old.pt", data)) as remote:
        requests, moved = traffic(remote)
        # the first block and the last 16 KiB (a .pt may be a zip), then headers, entry pickles and counts alone
        assert moved <= 64 * KIB + 16 * KIB + 16 * KIB
        assert moved < len(data) // 8
        same_as_local(local, remote)
        assert remote["w3"].numpy().tobytes() == arrays["w3"].tobytes()
