"""Parser differentials (issue 12, class 1): weightio reads the bytes torch, numpy and `tarfile`
read from a file, or refuses it — never a third reading that `scan` would then call safe.

`DIFFERENTIAL` is the named catalogue: each file is built byte by byte (tests/hostile.py,
tests/pytorch_files.py) and either refused with the error and words given, or read (``None``)
to the values torch reads. Where a case claims what torch does, `test_torch_reads_as_claimed`
checks it in a subprocess (skipped without torch): with a marker-file payload, whether
``torch.load`` runs it with ``weights_only=False`` and refuses it with ``weights_only=True``.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import weightio as wio
from weightio.errors import CorruptFileError, FormatError, WeightioError

from .hostile import npy_of, pax_record, tar_header, tar_of, zip_of
from .pytorch_files import LEGACY_MAGIC, P2, STOP, call, f32, pid, s, state_dict, tensor, torch_zip

W = pid("FloatStorage", "0", 4)
SD = state_dict({"w": tensor(W, 0, (4,), (1,))})  # tensor 'w' = storage '0', 4 floats
VALUES = f32(0, 1, 2, 3)


def _payload(marker: Path) -> bytes:
    return P2 + call("posix", "system", s(f"touch {marker}")) + STOP


def _zip_after(extra: list[tuple[str, bytes]], *, before: bool = False) -> bytes:
    """A torch zip checkpoint (tensor w = 0..3) with `extra` members after (or before) its own."""
    own = list(zipfile.ZipFile(io.BytesIO(torch_zip(SD, {"0": VALUES}))).infolist())
    src = zipfile.ZipFile(io.BytesIO(torch_zip(SD, {"0": VALUES})))
    members = [(m.filename, src.read(m)) for m in own]
    return zip_of(extra + members if before else members + extra)


def _renamed(old: str, new: str) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(torch_zip(SD, {"0": VALUES})))
    return zip_of([(m.filename.replace(old, new), src.read(m)) for m in src.infolist()])


def _legacy_tail() -> bytes:
    """Pickles 2-5 of a benign legacy raw-pickle file whose root is {'w': 1}, no storages."""
    return (b"".join(__import__("pickle").dumps(v, protocol=2)
                     for v in (1001, {"protocol_version": 1001, "little_endian": True}, {"w": 1}, [])))


def pickle_tar_polyglot(marker: Path, *, magic: bytes = b"") -> bytes:
    """The issue's instance: a valid legacy raw pickle (root {'w': 1}) whose first block is also
    an old v7 tar header. Pickle 1 opens a BINBYTES string that swallows the whole tar archive
    (a member named by the pickle's first bytes, then ``storages`` = a payload pickle, then the
    end blocks) and goes on to push torch's magic number; pickles 2-5 follow the archive."""
    storages = tar_header(b"storages", len(_payload(marker)), magic=magic) + _payload(marker)
    storages += bytes(-len(storages) % 512) + bytes(1024)
    length = 512 - 7 + len(storages)
    head = b"\x80\x03B" + struct.pack("<I", length)
    first = tar_header(head, 0, magic=magic)
    magic_number = b"0" + b"\x8a" + bytes([10]) + LEGACY_MAGIC.to_bytes(10, "little") + STOP
    return first + storages + magic_number + _legacy_tail()


def _pax_tar(records: bytes, name: bytes = b"x", data: bytes = b"", kind: bytes = b"x") -> bytes:
    body = records + bytes(-len(records) % 512)
    return (tar_header(b"pax", len(records), kind=kind, magic=b"ustar\x0000") + body
            + tar_header(name, len(data), magic=b"ustar\x0000") + data + bytes(-len(data) % 512) + bytes(1024))


def _safetensors_tar() -> bytes:
    """A valid safetensors file (metadata only) whose first 512 bytes are a valid tar header: the
    tar fields sit, space-terminated, inside a metadata string."""
    text = '{"__metadata__":{"p":"' + " " * 560 + '"}}'
    raw = bytearray(struct.pack("<Q", len(text)) + text.encode())
    for at, field in ((100, b"0000644 "), (108, b"0000000 "), (116, b"0000000 "), (124, b"00000000000 "),
                      (136, b"00000000000 "), (156, b"0")):
        raw[at:at + len(field)] = field
    raw[148:156] = b" " * 8
    raw[148:156] = b"%07o " % sum(raw[:512])
    return bytes(raw)


def _gnu_long_name() -> bytes:
    name = b"storages"
    return (tar_header(b"././@LongLink", len(name) + 1, kind=b"L", magic=b"ustar  \0") + name + b"\0"
            + bytes(-(len(name) + 1) % 512) + tar_of([(b"short", b"x")], magic=b"ustar  \0"))


def _zip64_disagrees() -> bytes:
    raw = bytearray(_renamed("x", "x"))
    eocd = raw.rfind(b"PK\x05\x06")
    if raw[eocd - 20: eocd - 16] != b"PK\x06\x07":  # zipfile writes no ZIP64 records here: add them
        cd_count, cd_size, cd_offset = struct.unpack_from("<HII", raw, eocd + 10)
        record = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, cd_count + 1, cd_count + 1, cd_size,
                             cd_offset)
        locator = struct.pack("<IIQI", 0x07064B50, 0, eocd, 1)
        raw[eocd:eocd] = record + locator
    return bytes(raw)


def _gap_before_end() -> bytes:
    raw = bytearray(_renamed("x", "x"))
    eocd = raw.rfind(b"PK\x05\x06")
    raw[eocd:eocd] = b"JUNK"
    return bytes(raw)


def _second_eocd_in_comment() -> bytes:
    raw = bytearray(_renamed("x", "x"))
    comment = b"PK\x05\x06" + bytes(8)
    raw[-2:] = struct.pack("<H", len(comment))
    return bytes(raw) + comment


def _npz_counting(this_disk: int, total: int) -> bytes:
    """An npz of two arrays whose end record counts `this_disk` and `total` entries (zipfile reads
    the central directory by its size and counts neither; miniz wants the two equal)."""
    raw = bytearray(zip_of([("a.npy", npy_of(np.zeros(1))), ("b.npy", npy_of(np.ones(1)))]))
    struct.pack_into("<HH", raw, len(raw) - 22 + 8, this_disk, total)
    return bytes(raw)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], bytes]
    error: type[WeightioError] | None  # None: weightio reads it, to tensor w = 0..3 when `values`
    message: str = ""
    torch: str = ""  # what torch.load does, checked with torch: "payload", "reads", "refuses", ""
    suffix: str = ".pt"


DIFFERENTIAL = [
    Case("zip: data.pkl and a DATA.PKL payload after it", lambda m: _zip_after([("archive/DATA.PKL", _payload(m))]),
         CorruptFileError, "members 'archive/data.pkl' and 'archive/DATA.PKL' have the same name when case is "
                           "ignored; torch.load looks records up without regard to case", torch="reads"),
    Case("zip: a DATA.PKL payload before data.pkl", lambda m: _zip_after([("archive/DATA.PKL", _payload(m))],
                                                                         before=True),
         CorruptFileError, "members 'archive/DATA.PKL' and 'archive/data.pkl' have the same name when case is ignored",
         torch="payload"),  # which of the two torch reads depends on where its binary search lands
    Case("zip: data.pkl spelled DATA.PKL only", lambda m: _renamed("data.pkl", "DATA.PKL"), None, torch="reads"),
    Case("zip: storage record spelled DATA/0", lambda m: _renamed("archive/data/0", "archive/DATA/0"), None,
         torch="reads"),
    Case("zip: prefix of data.pkl in another case", lambda m: _renamed("archive/data.pkl", "ARCHIVE/data.pkl"),
         CorruptFileError, "is not under the archive prefix 'ARCHIVE/' of the first member", torch="refuses"),
    Case("zip: data.pkl at the root, no prefix", lambda m: _renamed("archive/", ""), CorruptFileError,
         "the first zip member 'data.pkl' is not in a folder", torch="refuses"),
    Case("zip: storage key ending .debug_pkl", lambda m: torch_zip(
        state_dict({"w": tensor(pid("FloatStorage", "0.debug_pkl", 4), 0, (4,), (1,))}), {"0.debug_pkl": VALUES}),
         CorruptFileError, "its storage key '0.debug_pkl' ends in '.debug_pkl', which torch never reads"),
    Case("zip: ZIP64 end record disagrees with the end record", lambda m: _zip64_disagrees(), CorruptFileError,
         "the end record's entry count"),
    Case("zip: bytes between the central directory and the end records", lambda m: _gap_before_end(),
         CorruptFileError, "4 bytes lie between the central directory and the end records"),
    Case("zip: a second end signature in the comment", lambda m: _second_eocd_in_comment(), CorruptFileError,
         "no end-of-central-directory record ends the file"),  # zipfile takes the last signature, miniz the real one
    Case("npz: end record counts 2 here, 0 in all (found by pytorch_differential)", lambda m: _npz_counting(2, 0),
         CorruptFileError, "the end record counts 2 entries on this disk but 0 in all", suffix=".npz"),
    Case("npz: end record counts 1 entry of 2 (zipfile reads both)", lambda m: _npz_counting(1, 1),
         CorruptFileError, "bytes after its 1 entries", suffix=".npz"),
    Case("tar: legacy raw pickle that is also a v7 tar with a storages payload", pickle_tar_polyglot,
         CorruptFileError, "tar archive: non-zero bytes follow the end of the archive", torch="payload"),
    Case("tar: the same polyglot with GNU magic", lambda m: pickle_tar_polyglot(m, magic=b"ustar  \0"),
         CorruptFileError, "tar archive: non-zero bytes follow the end of the archive"),
    Case("tar: v7 archive whose storages member is a payload", lambda m: tar_of([(b"storages", _payload(m))]),
         CorruptFileError, "a legacy torch tar checkpoint has members sys_info, pickle, tensors, storages; "
                           "found 'storages'", torch="payload"),
    Case("tar: GNU long-name header", lambda m: _gnu_long_name(), CorruptFileError,
         "the member at offset 0 has type 'L'; only regular files (and a PAX header before one) are expected"),
    Case("tar: PAX global header", lambda m: _pax_tar(pax_record(b"path", b"storages"), kind=b"g"),
         CorruptFileError, "the member at offset 0 has type 'g'; only regular files (and a PAX header before one)"),
    Case("tar: two PAX headers in a row", lambda m: (
        tar_header(b"p1", 17, kind=b"x", magic=b"ustar\x0000") + pax_record(b"path", b"storages") + bytes(495)
        + _pax_tar(pax_record(b"path", b"pickle"))), CorruptFileError, "two PAX headers in a row at offset 1024"),
    Case("tar: PAX record with hdrcharset", lambda m: _pax_tar(pax_record(b"hdrcharset", b"BINARY")),
         CorruptFileError, "a PAX header sets hdrcharset"),
    Case("tar: a header tarfile cannot parse after the first", lambda m: tar_of([(b"sys_info", b"x")], end=False)
         + b"\x01" * 512 + bytes(1024), CorruptFileError, "tar archive: the header at offset 1024 is not one tarfile "
                                                           "reads"),
    Case("tar+safetensors polyglot", lambda m: _safetensors_tar(), FormatError,
         "is both a safetensors file and a tar archive, which torch.load reads as a legacy checkpoint; refused as a "
         "polyglot file", suffix=".bin"),
    Case("tar+GGUF polyglot", lambda m: tar_of([(b"GGUF\x03", b"")]), FormatError,
         "is both a gguf file and a tar archive", suffix=".bin"),
]


@pytest.mark.parametrize("case", DIFFERENTIAL, ids=[c.name for c in DIFFERENTIAL])
def test_weightio_reads_what_torch_reads_or_refuses(tmp_path, case):
    path = tmp_path / f"model{case.suffix}"
    path.write_bytes(case.build(tmp_path / "marker"))
    if case.error is None:
        with wio.open(path) as ckpt:
            np.testing.assert_array_equal(ckpt["w"].numpy(), np.arange(4, dtype=np.float32))
        return
    with pytest.raises(case.error) as info:
        with wio.open(path) as ckpt:
            [v.numpy() for v in ckpt.values()]
    assert type(info.value) is case.error
    assert case.message in str(info.value), str(info.value)
    report = wio.scan(path)
    assert not report.safe  # scan never calls safe what weightio refuses
    assert not (tmp_path / "marker").exists()


def test_npz_members_that_differ_only_in_case_are_read_apart_as_numpy_reads_them(tmp_path):
    """numpy (zipfile) looks members up by exact name, so W and w are two arrays: no differential
    to refuse (only torch's reader folds case)."""
    path = tmp_path / "cased.npz"
    path.write_bytes(zip_of([("a.npy", npy_of(np.zeros(2, np.float32))), ("A.npy", npy_of(np.ones(3, np.int16)))]))
    with np.load(path) as theirs, wio.open(path) as ckpt:
        assert sorted(ckpt) == sorted(theirs.files) == ["A", "a"]
        for name in theirs.files:
            np.testing.assert_array_equal(ckpt[name].numpy(), theirs[name])
            assert ckpt[name].numpy().dtype == theirs[name].dtype


def test_the_tar_cases_are_what_tarfile_opens():
    """The sniffing claim, by `tarfile` itself: each file weightio counts as tar, tarfile opens."""
    for case in DIFFERENTIAL:
        if case.name.startswith("tar"):
            data = case.build(Path("/nonexistent/marker"))
            tarfile.open(fileobj=io.BytesIO(data), mode="r:").close()


def test_the_polyglot_is_a_valid_legacy_pickle_and_safetensors_file(tmp_path):
    """Before the fix weightio read the polyglot's raw-pickle side; safetensors reads the other one."""
    import pickle

    data = pickle_tar_polyglot(tmp_path / "m")
    f = io.BytesIO(data)
    assert [pickle.load(f) for _ in range(5)] == [LEGACY_MAGIC, 1001, {"protocol_version": 1001,
                                                                       "little_endian": True}, {"w": 1}, []]
    safetensors = pytest.importorskip("safetensors.numpy")
    assert safetensors.load(_safetensors_tar()) == {}


def test_pax_path_renames_the_member_as_tarfile_does(tmp_path):
    from weightio._io import MappedFile
    from weightio.formats.pytorch import tar

    data = _pax_tar(pax_record(b"path", b"storages/") + pax_record(b"mtime", b"1.5"), b"x", b"abc")
    path = tmp_path / "t.tar"
    path.write_bytes(data)
    file = MappedFile(path)
    try:
        ours = [(m.name, bytes(file.read(m.data_offset, m.size, "m"))) for m in tar.read_members(file)]
    finally:
        file.close()
    with tarfile.open(path, "r:") as t:
        theirs = [(m.name, t.extractfile(m).read()) for m in t.getmembers()]
    assert ours == theirs == [("storages", b"abc")]


# ----------------------------------------------------------------------------- scan


def test_scan_finds_a_pickle_member_by_its_bytes(tmp_path):
    path = tmp_path / "m.pt"
    path.write_bytes(_zip_after([("archive/extra", _payload(tmp_path / "marker")),
                                 ("archive/old", b"cposix\nsystem\n(S'true'\ntR.")]))
    report = wio.scan(path)
    (f,) = report.files
    assert f.verdict == "weightio reads it" and not f.safe and not report.safe
    by_location = {p.location: p for p in f.pickles}
    assert by_location["archive/extra"].refused == ("posix.system",)  # no .pkl suffix: found by PROTO
    assert by_location["archive/old"].refused == ("posix.system",)  # protocol 0: found by lexing it whole
    assert "archive/data/0" not in by_location
    assert "UNSAFE" in str(report)


def test_scan_reports_case_collisions(tmp_path):
    path = tmp_path / "m.pt"
    path.write_bytes(_zip_after([("archive/DATA.PKL", _payload(tmp_path / "marker"))]))
    (f,) = wio.scan(path).files
    assert f.collisions == (("archive/data.pkl", "archive/DATA.PKL"),)
    assert not f.safe
    assert {p.location for p in f.pickles} >= {"archive/data.pkl", "archive/DATA.PKL"}
    assert "case collision: 'archive/data.pkl' and 'archive/DATA.PKL' (torch.load could read either)" in str(
        wio.scan(path))


def test_scan_lists_the_tar_payload_and_the_raw_pickle_side(tmp_path):
    path = tmp_path / "m.pt"
    path.write_bytes(pickle_tar_polyglot(tmp_path / "marker"))
    (f,) = wio.scan(path).files
    assert not f.safe and f.format == "pytorch"
    refused = {p.location: p.refused for p in f.pickles if p.refused}
    assert refused == {"member 'storages'": ("posix.system",)}
    assert any(p.location.startswith("read as a raw pickle") for p in f.pickles)


# ----------------------------------------------------------------------------- torch, when installed

_TORCH_LOAD = """
import json, sys, torch
results = {}
for path in sys.argv[1:]:
    for weights_only in (True, False):
        try:
            obj = torch.load(path, weights_only=weights_only)
            out = {"ok": True, "w": obj["w"].tolist() if isinstance(obj, dict) and "w" in obj else None}
        except BaseException as e:
            out = {"ok": False, "error": type(e).__name__}
        results[f"{path} {weights_only}"] = out
print(json.dumps(results))
"""
_TORCH_CASES = [c for c in DIFFERENTIAL if c.torch]


@pytest.fixture(scope="module")
def torch_results(tmp_path_factory):
    """What torch.load does with each case, weights_only=True first (one subprocess for all)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("torch")
    paths = []
    for k, case in enumerate(_TORCH_CASES):
        (root / str(k)).mkdir()
        path = root / str(k) / f"model{case.suffix}"
        path.write_bytes(case.build(root / str(k) / "marker"))
        paths.append(str(path))
    out = subprocess.run([sys.executable, "-c", _TORCH_LOAD, *paths], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    results = json.loads(out.stdout.strip().splitlines()[-1])
    return {case.name: (results[f"{p} True"], results[f"{p} False"], (Path(p).parent / "marker").exists())
            for case, p in zip(_TORCH_CASES, paths, strict=True)}


@pytest.mark.parametrize("case", _TORCH_CASES, ids=[c.name for c in _TORCH_CASES])
def test_torch_reads_as_claimed(torch_results, case):
    """weights_only=True never runs a payload (it loads the same values, or refuses);
    weights_only=False runs the payload of the "payload" cases, which weightio refuses."""
    safe, full, payload_ran = torch_results[case.name]
    if case.torch == "reads":
        assert safe == full == {"ok": True, "w": [0.0, 1.0, 2.0, 3.0]} and not payload_ran
    elif case.torch == "refuses":
        assert not safe["ok"] and not full["ok"] and not payload_ran
    else:
        assert not safe["ok"] or safe["w"] is None
        assert payload_ran, "torch.load(weights_only=False) did not run the payload"
