"""Opening archives of thousands of small members (issue 16, PyTorch open): the zip walk reads
nearby local headers in runs and still checks every one of them; the parse runs with Python's
cyclic collector paused and leaves it as it found it."""

from __future__ import annotations

import gc
import zipfile

import numpy as np
import pytest

import weightio as wio
from weightio._io import MappedFile
from weightio.errors import CorruptFileError
from weightio.formats import _zip
from weightio.formats.pytorch import reader

COUNT = 3000


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """(path, state dict as numpy) of a torch.save file of COUNT small float32 tensors."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(1)
    state = {f"layers.{i}.weight": torch.randn(4, 8, generator=generator) for i in range(COUNT)}
    path = tmp_path_factory.mktemp("scale") / "many.pt"
    torch.save(state, path)
    return path, {k: v.numpy() for k, v in state.items()}


def _header_reads(monkeypatch) -> list[tuple[int, int, str]]:
    """Every (offset, length, what) that MappedFile.read or read_each is asked for from now on."""
    calls: list[tuple[int, int, str]] = []
    read, read_each = MappedFile.read, MappedFile.read_each

    def counted(self, offset, length, what):
        calls.append((offset, length, what))
        return read(self, offset, length, what)

    def counted_each(self, spans, what):
        calls.extend((offset, length, what) for offset, length in spans)
        return read_each(self, spans, what)

    monkeypatch.setattr(MappedFile, "read", counted)
    monkeypatch.setattr(MappedFile, "read_each", counted_each)
    return calls


def test_the_local_headers_of_small_members_are_read_in_a_few_runs(many, monkeypatch):
    path, state = many
    calls = _header_reads(monkeypatch)
    with wio.open(path) as ckpt:
        assert len([c for c in calls if c[2] == "the local headers"]) <= 3  # COUNT + 6 members, ~1 MB
        assert len(calls) < 20
        assert list(ckpt) == list(state)
        for name, expected in state.items():  # every data offset taken from its own local header
            np.testing.assert_array_equal(ckpt[name].numpy(), expected)


def test_local_headers_megabytes_apart_are_read_one_by_one(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    path = tmp_path / "large.pt"
    torch.save({f"w{i}": torch.full((64, 1024), float(i)) for i in range(4)}, path)  # 256 KiB each
    calls = _header_reads(monkeypatch)
    with wio.open(path) as ckpt:
        headers = [length for _, length, what in calls if what == "the local headers"]
        assert len(headers) >= 4 and max(headers) < 4096  # no run spans a tensor's data
        assert ckpt["w3"].numpy()[0, 0] == 3.0


def _patched(path, tmp_path, member: str, at: int, new: bytes):
    """A copy of `path` with `new` written `at` bytes into `member`'s local header."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(member))
    data = bytearray(path.read_bytes())
    data[info.header_offset + at: info.header_offset + at + len(new)] = new
    out = tmp_path / "patched.pt"
    out.write_bytes(bytes(data))
    return out, info


def test_a_broken_local_header_among_thousands_is_refused(many, tmp_path):
    path, _ = many
    broken, info = _patched(path, tmp_path, "/data/1500", 0, b"PX")  # its signature
    with pytest.raises(CorruptFileError, match=f"zip archive: no local header for '{info.filename}' at offset "
                                               f"{info.header_offset}"):
        wio.open(broken)


def test_a_renamed_local_header_among_thousands_is_refused(many, tmp_path):
    path, _ = many
    name_at = 30 + len(zipfile.ZipFile(path).namelist()[0].split("/")[0]) + len("/data/")
    broken, info = _patched(path, tmp_path, "/data/2222", name_at, b"3")  # .../data/2222 -> .../data/3222
    with pytest.raises(CorruptFileError, match="local header name b'.*/data/3222' differs from the central "
                                               f"directory's '{info.filename}'"):
        wio.open(broken)


def test_an_npz_of_thousands_of_members_reads_its_headers_in_runs(tmp_path, monkeypatch):
    arrays = {f"m{i}": np.full((3,), i, np.int32) for i in range(COUNT)}
    path = tmp_path / "many.npz"
    np.savez(path, **arrays)
    calls = _header_reads(monkeypatch)
    with wio.open(path) as ckpt:
        assert len([c for c in calls if c[2] == "the local headers"]) <= 3
        assert ckpt["m2999"].numpy().tolist() == [2999] * 3 and len(ckpt) == COUNT


def test_the_collector_is_paused_while_a_checkpoint_is_parsed_and_back_on_after(many, tmp_path, monkeypatch):
    path, _ = many
    seen = []
    flatten = reader.flatten

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return flatten(*args, **kwargs)

    monkeypatch.setattr(reader, "flatten", watched)
    assert gc.isenabled()
    wio.open(path).close()
    assert seen == [False] and gc.isenabled()
    broken, _ = _patched(path, tmp_path, "/data/7", 0, b"PX")
    with pytest.raises(CorruptFileError):
        wio.open(broken)
    assert gc.isenabled()  # a refused file leaves it on too
    gc.disable()
    try:
        wio.open(path).close()
        assert not gc.isenabled()  # and off when the caller had it off
    finally:
        gc.enable()


def test_the_zip_walk_pauses_the_collector(many, monkeypatch):
    path, _ = many
    seen = []
    walk = _zip._walk

    def watched(*args):
        seen.append(gc.isenabled())
        return walk(*args)

    monkeypatch.setattr(_zip, "_walk", watched)
    file = MappedFile(path)
    try:
        assert len(_zip.read_members(file)) == COUNT + 6
    finally:
        file.close()
    assert seen == [False] and gc.isenabled()
