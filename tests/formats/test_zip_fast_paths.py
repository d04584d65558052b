"""The zip walk's numpy paths (issue 16, PyTorch open): the central directory
(weightio.formats._zip_central.entries) and the local headers (weightio.formats._zip_local.located).
On real archives and on mutated ones each gives exactly the members the entry-by-entry loop gives,
and wherever the loop refuses an archive it steps aside, so the loop's error is what is raised."""

from __future__ import annotations

import io
import re
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightio._io import MappedFile
from weightio.formats import _zip, _zip_central, _zip_local

from ..conftest import both_ways


def _directory(path):
    """(file, cd offset, cd size, count, the directory's bytes)."""
    file = MappedFile(path)
    offset, size, count = _zip._find_central_directory(file)
    return file, offset, size, count, file.read(offset, size, "cd")


def _both(monkeypatch, file, offset, size, count):
    """(members read by the numpy path, by the loop), or (error type, message) for each."""
    return both_ways(monkeypatch, _zip_central, "entries", lambda *args: None,
                     lambda: _zip._read_central_directory(file, offset, size, count))


def _counting(monkeypatch, module, name: str) -> list[bool]:
    """Record, per call of ``module.name``, whether the fast path took the input (a result, not None)."""
    used: list[bool] = []
    real = getattr(module, name)

    def counted(*args):
        result = real(*args)
        used.append(result is not None)
        return result

    monkeypatch.setattr(module, name, counted)
    return used


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """Real archives: torch.save (3000 tensors), np.savez, zipfile with CP437, UTF-8 and signature-
    bearing names, deflated members, ZIP64 end records."""
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("zips")
    torch.save({f"layers.{i}.weight": torch.zeros(2, 3) for i in range(3000)}, root / "model.pt")
    # headers in runs (small tensors) and alone (after tensors larger than RUN_GAP), mixed
    torch.save({f"w{i}": torch.zeros(64, 1024 if i % 7 == 3 else 2) for i in range(40)}, root / "mixed.pt")
    np.savez(root / "arrays.npz", **{f"a{i}": np.arange(i) for i in range(300)})
    with zipfile.ZipFile(root / "names.zip", "w") as z:
        z.writestr("plain.npy", b"x")
        z.writestr("caf\u00e9.npy", b"y")  # UTF-8 flagged
        z.writestr(zipfile.ZipInfo("PK\x01\x02inside.npy"), b"z")  # the signature inside a name
    with zipfile.ZipFile(root / "deflated.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(50):
            z.writestr(f"m{i}.npy", bytes(100 * i))
    with zipfile.ZipFile(root / "zip64.zip", "w", allowZip64=True) as z:
        for i in range(70_000):  # over 65535 entries: ZIP64 end records
            z.writestr(f"{i}", b"")
    return sorted(root.iterdir())


def test_real_archives_give_the_loops_members(archives, monkeypatch):
    used = _counting(monkeypatch, _zip_central, "entries")
    for path in archives:
        fast, loop = _both(monkeypatch, *_directory(path)[:4])
        assert fast == loop, path
        assert isinstance(fast, list) and len(fast) > 0
    by_name = dict(zip([p.name for p in archives], used, strict=True))
    assert by_name == {"arrays.npz": True, "deflated.zip": True, "mixed.pt": True, "model.pt": True,
                       "names.zip": False, "zip64.zip": True}  # the name holding the signature: the loop


def _replace(cd: bytes, at: int, new: bytes) -> bytes:
    return cd[:at] + new + cd[at + len(new):]


@pytest.mark.parametrize(("field", "value"), [
    (0, b"PK\x01\x03"),  # signature
    (8, b"\x01\x00"),  # encrypted
    (10, b"\x0c\x00"),  # method 12 (bzip2)
    (20, b"\xff\xff\xff\xff"),  # compressed size: ZIP64 sentinel without an extra field
    (24, b"\xff\xff\xff\xff"),  # size
    (42, b"\xff\xff\xff\xff"),  # offset
    (28, b"\x00\x01"),  # name length: the chain breaks
    (30, b"\x04\x00"),  # extra length
    (32, b"\x02\x00"),  # comment length
])
@pytest.mark.parametrize("entry", [0, 1, 1500])
def test_a_broken_entry_is_refused_as_the_loop_refuses_it(archives, monkeypatch, tmp_path, field, value, entry):
    file, offset, size, count, cd = _directory(next(p for p in archives if p.name == "model.pt"))
    at = [m.start() for m in re.finditer(rb"PK\x01\x02", cd)][entry]
    path = tmp_path / "broken.pt"
    raw = file.read(0, file.size, "all")
    path.write_bytes(raw[:offset] + _replace(cd, at + field, value) + raw[offset + size:])
    fast, loop = _both(monkeypatch, MappedFile(path), offset, size, count)
    assert fast == loop
    assert isinstance(fast, tuple) or field in (20, 24, 42)  # a refusal, or the loop's own ZIP64 reading


def test_duplicate_and_undecodable_names_and_wrong_counts_are_the_loops_to_report(monkeypatch, tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name in ("a.npy", "b.npy", "c\u00e9.npy"):  # the last flagged UTF-8
            z.writestr(name, b"1")
    raw = buffer.getvalue()
    cases = {"duplicate": raw.replace(b"b.npy", b"a.npy"), "undecodable": raw.replace(b"\xc3\xa9", b"\xff\xfe")}
    for kind, data in cases.items():
        path = tmp_path / f"{kind}.zip"
        path.write_bytes(data)
        file, offset, size, count, _ = _directory(path)
        for claimed in (count, count - 1, count + 1):
            fast, loop = _both(monkeypatch, file, offset, size, claimed)
            assert fast == loop, (kind, claimed)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_directories_read_alike(archives, monkeypatch, tmp_path, changes):
    file, offset, size, count, cd = _directory(next(p for p in archives if p.name == "arrays.npz"))
    cd = bytearray(cd)
    for at, byte in changes:
        cd[at % len(cd)] = byte
    path = tmp_path / "mutated.npz"
    raw = file.read(0, file.size, "all")
    path.write_bytes(raw[:offset] + bytes(cd) + raw[offset + size:])
    fast, loop = _both(monkeypatch, MappedFile(path), offset, size, count)
    assert fast == loop


# ----------------------------------------------------------------------------- local headers


def _walked(monkeypatch, path):
    """(members with the numpy check, members with the loop's), or (error type, message) for each."""
    return both_ways(monkeypatch, _zip_local, "located", lambda *args: None,
                     lambda: _zip._walk(MappedFile(path), _zip.current_limits()))


def test_real_archives_are_located_as_the_loop_locates_them(archives, monkeypatch):
    used = _counting(monkeypatch, _zip_local, "located")
    for path in archives:
        fast, loop = _walked(monkeypatch, path)
        assert fast == loop and isinstance(fast, list), path
    assert dict(zip([p.name for p in archives], used, strict=True)) == {
        "arrays.npz": True, "deflated.zip": True, "mixed.pt": True, "model.pt": True, "names.zip": True,
        "zip64.zip": True}


def _local_offsets(path) -> list[int]:
    with zipfile.ZipFile(path) as z:
        return [info.header_offset for info in z.infolist()]


@pytest.mark.parametrize(("field", "value"), [
    (0, b"PK\x03\x05"),  # signature
    (6, b"\x01\x00"),  # encrypted
    (6, b"\x00\x08"),  # the UTF-8 flag, not the central entry's
    (8, b"\x08\x00"),  # method
    (26, b"\x05\x00"),  # name length
    (28, b"\xff\xff"),  # extra length: data into the next member / the directory
    (30, b"X"),  # a name byte
    (31, b"\xc3"),
])
@pytest.mark.parametrize("entry", [0, 1, 2000, -1])
def test_a_broken_local_header_is_refused_as_the_loop_refuses_it(archives, monkeypatch, tmp_path, field, value,
                                                                 entry):
    source = next(p for p in archives if p.name == "model.pt")
    raw = source.read_bytes()
    at = _local_offsets(source)[entry] + field
    path = tmp_path / "broken.pt"
    path.write_bytes(raw[:at] + value + raw[at + len(value):])
    fast, loop = _walked(monkeypatch, path)
    assert fast == loop


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 40), st.integers(0, 255)),
                        min_size=1, max_size=3))
def test_mutated_local_headers_are_located_alike(archives, monkeypatch, tmp_path, changes):
    source = next(p for p in archives if p.name == "arrays.npz")
    raw = bytearray(source.read_bytes())
    offsets = _local_offsets(source)
    for which, field, byte in changes:
        raw[offsets[which % len(offsets)] + field] = byte
    path = tmp_path / "mutated.npz"
    path.write_bytes(bytes(raw))
    fast, loop = _walked(monkeypatch, path)
    assert fast == loop
