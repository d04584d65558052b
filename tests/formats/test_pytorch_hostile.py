"""Hostile PyTorch checkpoints: every structural lie gets the right WeightioError, worded for a
person, naming the file and the tensor — never a traceback from pickle/zipfile, never a hang."""

from __future__ import annotations

import io
import math
import pickle
import struct
import tarfile
import zipfile

import pytest

import weightio as wio
from weightio.errors import CorruptFileError, FormatError, UnsafePickleError

from ..conftest import FIXTURES
from ..pytorch_files import (
    BINPERSID,
    EMPTY_LIST,
    MARK,
    NEWFALSE,
    NONE,
    P2,
    STOP,
    bounded,
    call,
    f32,
    g,
    i,
    ints,
    legacy_file,
    legacy_pid,
    member,
    pid,
    rezip,
    s,
    stacked,
    state_dict,
    tensor,
    torch_zip,
    tup,
)

PT = FIXTURES / "pytorch"


def _fails(write, content: bytes, error: type, message: str, name: str = "model.pt") -> None:
    path = write(name, content)
    with bounded(), pytest.raises(error) as info:
        with wio.open(path) as ckpt:
            for view in ckpt.values():
                view.numpy()
    assert message in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{path}: ")


def one(entry: bytes, records: dict[str, bytes] | None = None, **kwargs) -> bytes:
    """A zip checkpoint holding tensor 'w' = `entry`."""
    return torch_zip(state_dict({"w": entry}), {"0": f32(*range(12))} if records is None else records, **kwargs)


W = pid("FloatStorage", "0", 12)

# ----------------------------------------------------------------------------- zip checkpoints

ZIP_CASES = [
    ("compressed sparse tensor of three parts (no size)",
     lambda: one(call("torch._utils", "_rebuild_sparse_tensor", g("torch", "sparse_csr"),
                      tup(tensor(W, 0, (3,), (1,)), tensor(W, 0, (3,), (1,)), ints((3, 3))))),
     CorruptFileError, "tensor 'w': size None is not a tuple of non-negative ints"),
    ("missing record", lambda: one(tensor(W, 0, (3, 4), (4, 1)), records={}), CorruptFileError,
     "tensor 'w': its storage '0' has no record 'archive/data/0' in the archive"),
    ("record smaller than declared", lambda: one(tensor(W, 0, (3, 4), (4, 1)), records={"0": f32(1, 2, 3)}),
     CorruptFileError, "tensor 'w': its storage '0' is declared as 12 x float32 = 48 bytes but record 'archive/data/0' "
                       "holds 12"),
    ("numel far beyond the file", lambda: one(tensor(pid("FloatStorage", "0", 10**12), 0, (1,), (1,))),
     CorruptFileError, "archive/data.pkl: storage '0': 1000000000000 elements of float32 cannot fit in a"),
    ("view past its storage", lambda: one(tensor(W, 10, (3, 4), (4, 1))), CorruptFileError,
     "tensor 'w': view (offset 10, size (3, 4), stride (4, 1)) reaches element 21 of a 12-element storage '0'"),
    ("absurd size", lambda: one(tensor(W, 0, (10**20, 10**20), (1, 1))), CorruptFileError,
     "tensor 'w': view (offset 0, size (100000000000000000000, 100000000000000000000), stride (1, 1)) reaches "
     "element 199,999,999,999,999,999,998"),
    # review findings: numbers Python refuses to print (over 4300 digits) and a dtype torch lacks
    ("a size of 2^16000 elements", lambda: one(tensor(W, 0, (2**2000,) * 8, (0,) * 8)), CorruptFileError,
     "tensor 'w': offset, size or stride beyond 256 bits (offset 0, size (<int of 2,001 bits>,"),
    ("meta tensor of an unknown dtype",
     lambda: one(call("torch._utils", "_rebuild_meta_tensor_no_storage", s("foo"), ints((2,)), ints((1,)), NEWFALSE)),
     CorruptFileError, "tensor 'w': dtype 'foo' is not a torch dtype"),
    ("absurd stride", lambda: one(tensor(W, 0, (2,), (2**62,))), CorruptFileError,
     "reaches element 4,611,686,018,427,387,904 of a 12-element storage"),
    ("negative stride", lambda: one(tensor(W, 0, (3, 4), (-4, 1))), CorruptFileError,
     "tensor 'w': negative offset, size or stride (offset 0, size (3, 4), stride (-4, 1))"),
    ("negative size", lambda: one(tensor(W, 0, (-3, 4), (4, 1))), CorruptFileError,
     "tensor 'w': negative offset, size or stride (offset 0, size (-3, 4), stride (4, 1))"),
    ("negative offset", lambda: one(tensor(W, 0, (3,), (1,)).replace(i(0) + ints((3,)), i(-1) + ints((3,)))),
     CorruptFileError, "tensor 'w': negative offset, size or stride (offset -1, size (3,), stride (1,))"),
    ("size and stride differ in length", lambda: one(tensor(W, 0, (3, 4), (1,))), CorruptFileError,
     "tensor 'w': size (3, 4) and stride (1,) must have the same length, at most 64"),
    ("65 dimensions", lambda: one(tensor(W, 0, (1,) * 65, (1,) * 65)), CorruptFileError,
     "must have the same length, at most 64"),
    ("float size", lambda: one(tensor(W, 0, (3,), (1,)).replace(ints((3,)), tup(b"G" + struct.pack(">d", 3.0)))),
     CorruptFileError, "tensor 'w': offset 0, size (3.0,) and stride (1,) must be an int and tuples of ints"),
    ("storage that is not a storage", lambda: one(tensor(NONE, 0, (3,), (1,))), CorruptFileError,
     "tensor 'w': its storage is None, not a torch storage"),
    ("storage class that is a dtype", lambda: one(tensor(tup(s("storage"), g("torch", "float32"), s("0"), s("cpu"),
                                                              i(12)) + BINPERSID, 0, (3,), (1,))),
     CorruptFileError, "storage '0': torch.float32 is not a torch storage class"),
    ("storage key declared twice", lambda: torch_zip(state_dict({
        "a": tensor(pid("FloatStorage", "0", 12), 0, (1,), (1,)),
        "b": tensor(pid("IntStorage", "0", 12), 0, (1,), (1,))}), {"0": f32(*range(12))}), CorruptFileError,
     "storage '0' is declared twice: 12 x float32, then 12 x int32"),
    ("persistent id not a tuple", lambda: one(tensor(i(7) + BINPERSID, 0, (1,), (1,))), CorruptFileError,
     "persistent id 7 is not ('storage', class, key, location, numel)"),
    ("module persistent id", lambda: one(tup(s("module"), NONE, NONE, NONE) + BINPERSID), CorruptFileError,
     "persistent id ('module', None, None, None) is not ('storage', class, key, location, numel)"),
    ("persistent id of the wrong arity", lambda: one(tup(s("storage"), g("torch", "FloatStorage"), s("0")) + BINPERSID),
     CorruptFileError, "is not ('storage', class, key, location, numel)"),
    ("10 MB location", lambda: one(tensor(tup(s("storage"), g("torch", "FloatStorage"), s("0"), s("x" * 10_000_000),
                                              i(12)) + BINPERSID, 0, (1,), (1,))),
     CorruptFileError, "storage '0': location 'xxxxxxxx"),
    ("non-string key", lambda: one(tensor(tup(s("storage"), g("torch", "FloatStorage"), i(0), s("cpu"), i(12))
                                          + BINPERSID, 0, (1,), (1,))),
     CorruptFileError, "storage key 0 is not a short printable string"),
    ("v3 with something that is not a dtype", lambda: one(call(
        "torch._utils", "_rebuild_tensor_v3", W, i(0), ints((1,)), ints((1,)), NEWFALSE, NONE, s("float32"))),
     CorruptFileError, "tensor 'w': dtype 'float32' is not a torch dtype"),
    ("byteorder 'middle'", lambda: one(tensor(W, 0, (1,), (1,)), byteorder=b"middle"), CorruptFileError,
     "byteorder record is b'middle'; torch writes 'little' or 'big'"),
    ("format version 99", lambda: one(tensor(W, 0, (1,), (1,)), version=b"99\n"), FormatError,
     "PyTorch zip format version b'99\\n' is not supported (1 to 10 are)"),
    ("data.pkl that is no pickle", lambda: torch_zip(b"\xff\xfe not a pickle", {}), CorruptFileError,
     "archive/data.pkl: invalid opcode 0xff at offset 0"),
    ("deeply nested data.pkl", lambda: torch_zip(P2 + (MARK + EMPTY_LIST) * 5000 + STOP, {}), CorruptFileError,
     "archive/data.pkl: more than 1,000 nested MARKs"),
    ("two data.pkl prefixes", lambda: _zip_of({"a/data.pkl": state_dict({}), "b/data.pkl": state_dict({})}),
     CorruptFileError, "member 'b/data.pkl' is not under the archive prefix 'a/' of the first member (torch.load "
                       "refuses such archives)"),
    ("no data.pkl at all", lambda: rezip(PT / "views.pt", {"views/data.pkl": None}), FormatError,
     "is a zip archive but neither an .npz nor a PyTorch checkpoint"),
    ("a bomb posing as a deflated data.pkl",
     lambda: _patch_central(torch_zip(state_dict({}), {}, compress={"data.pkl"}), "archive/data.pkl", usize=2**32 - 2),
     CorruptFileError, "record 'archive/data.pkl' size 4294967294 exceeds the 100000000-byte limit "
                       "(limits.header_bytes"),
    ("data.pkl CRC mismatch", lambda: _patch_central(torch_zip(state_dict({}), {}), "archive/data.pkl", crc=1234),
     CorruptFileError, "zip archive: record 'archive/data.pkl' fails its CRC-32 check"),
    ("truncated archive", lambda: one(tensor(W, 0, (1,), (1,)))[:-40], CorruptFileError,
     "zip archive: no end-of-central-directory record ends the file (truncated, or bytes appended)"),
    ("cut in half", lambda: (PT / "views.pt").read_bytes()[:3000], CorruptFileError,
     "zip archive: no end-of-central-directory record ends the file"),
    ("local header name differs", lambda: _rename_local(one(tensor(W, 0, (1,), (1,))), b"archive/data/0",
                                                        b"archive/data/X"), CorruptFileError,
     "zip archive: local header name b'archive/data/X' differs from the central directory's 'archive/data/0'"),
    ("duplicate members", lambda: _duplicate(), CorruptFileError,
     "zip archive: member 'archive/data.pkl' appears twice"),
]


def _patch_central(data: bytes, name: str, *, crc: int | None = None, usize: int | None = None) -> bytes:
    pos = data.index(b"PK\x01\x02")
    while True:
        n = struct.unpack_from("<H", data, pos + 28)[0]
        if data[pos + 46: pos + 46 + n] == name.encode():
            break
        pos = data.index(b"PK\x01\x02", pos + 1)
    if crc is not None:
        data = data[: pos + 16] + struct.pack("<I", crc) + data[pos + 20:]
    if usize is not None:
        data = data[: pos + 24] + struct.pack("<I", usize) + data[pos + 28:]
    return data


def _rename_local(data: bytes, old: bytes, new: bytes) -> bytes:
    at = data.index(old)  # the first occurrence is in the local header
    return data[:at] + new + data[at + len(new):]


def _zip_of(members: dict[str, bytes] | list[tuple[str, bytes]]) -> bytes:
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names some cases need
        with zipfile.ZipFile(buf, "w") as z:
            for name, data in (members.items() if isinstance(members, dict) else members):
                z.writestr(name, data)
    return buf.getvalue()


def _duplicate() -> bytes:
    return _zip_of([("archive/data.pkl", state_dict({})),
                    ("archive/data.pkl", P2 + call("posix", "system", s("touch x")) + STOP)])


def _size_holding_its_own_tensor() -> bytes:
    """{'w': T} where T's size is a dict D that, once T exists, is given T itself (through the memo):
    describing T in an error once recursed through T's repr without end (found by cli_convert)."""
    size = b"}q\x00"  # EMPTY_DICT, BINPUT 0
    t = g("torch._utils", "_rebuild_tensor_v2") + MARK + W + i(0) + size + ints((4,)) + NEWFALSE + \
        call("collections", "OrderedDict") + b"tR" + b"q\x01"  # TUPLE, REDUCE, BINPUT 1
    mutate = b"h\x00" + s("x") + b"h\x01" + b"s" + b"0"  # D['x'] = T; POP
    return torch_zip(P2 + b"}" + s("w") + t + b"s" + mutate + STOP, {"0": f32(1, 2, 3, 4)})


ZIP_CASES.append(("a size that holds its own tensor (cycle through the memo)", _size_holding_its_own_tensor,
                  CorruptFileError, "tensor 'w': offset 0, size {'x': <tensor dense size=<dict of 1>>} and stride "
                                    "(4,) must be an int and tuples of ints"))


@pytest.mark.parametrize("build,error,message", [c[1:] for c in ZIP_CASES], ids=[c[0] for c in ZIP_CASES])
def test_hostile_zip_checkpoints(write, build, error, message):
    _fails(write, build(), error, message)


def test_a_pickle_with_a_zip_appended_is_refused(write):
    polyglot = P2 + call("collections", "OrderedDict") + STOP + (PT / "views.pt").read_bytes()
    _fails(write, polyglot, CorruptFileError, "bytes follow the pickle's STOP opcode (stacked pickles or a polyglot "
                                              "file; a plain pickle holds one object)", name="model.npz")


def test_stacked_pickles_in_a_plain_pickle_file_are_refused(write):
    benign = pickle.dumps({"a": 1}, protocol=2)
    evil = P2 + call("posix", "system", s("touch x")) + STOP
    _fails(write, benign + evil, CorruptFileError, f"{len(evil):,} bytes follow the pickle's STOP opcode",
           name="two.pkl")


# ----------------------------------------------------------------------------- legacy raw-pickle files

LEGACY_W = state_dict({"w": tensor(legacy_pid("FloatStorage", "0", 3), 0, (3,), (1,))})
DATA3 = f32(1, 2, 3)

LEGACY_CASES = [
    ("protocol version 1000", lambda: legacy_file(LEGACY_W, ["0"], [(3, DATA3)], protocol=1000), FormatError,
     "legacy torch.save protocol version 1000 is not supported (1001 is)"),
    ("sys_info not a dict", lambda: legacy_file(LEGACY_W, ["0"], [(3, DATA3)], sys_info=pickle.dumps([1], 2)),
     CorruptFileError, "legacy sys_info is [1], not a dict"),
    ("a storage no tensor uses", lambda: legacy_file(LEGACY_W, ["0", "9"], [(3, DATA3)]), CorruptFileError,
     "storage '9' is listed but no tensor refers to it"),
    ("element count mismatch", lambda: legacy_file(LEGACY_W, ["0"], [(2, DATA3)]), CorruptFileError,
     "storage '0' is declared with 3 elements but its data holds 2"),
    ("storage data cut short", lambda: legacy_file(LEGACY_W, ["0"], [(3, DATA3[:8])]), CorruptFileError,
     "storage '0' (12 bytes at"),
    ("bytes after the last storage", lambda: legacy_file(LEGACY_W, ["0"], [(3, DATA3)]) + b"JUNK", CorruptFileError,
     "4 bytes follow the last storage"),
    ("key list with duplicates", lambda: legacy_file(LEGACY_W, ["0", "0"], [(3, DATA3)]), CorruptFileError,
     "the legacy storage key list is not a list of distinct strings"),
    ("storage not in the list", lambda: legacy_file(LEGACY_W, [], []), CorruptFileError,
     "tensor 'w': its storage '0' is not in the file's storage list"),
    ("view outside its root", lambda: legacy_file(state_dict({"w": tensor(legacy_pid(
        "FloatStorage", "0", 3, view=tup(s("v"), i(2), i(5))), 0, (1,), (1,))}), ["0"], [(3, DATA3)]),
     CorruptFileError, "storage view 'v' (elements 2..7) lies outside storage '0' (3 elements)"),
    ("whole-module persistent id",
     lambda: legacy_file(state_dict({"m": tup(s("module"), NONE, NONE, NONE) + BINPERSID}), [], []),
     UnsafePickleError, "the checkpoint pickles a whole torch.nn.Module (torch.save(model)), which is code"),
]


@pytest.mark.parametrize("build,error,message", [c[1:] for c in LEGACY_CASES], ids=[c[0] for c in LEGACY_CASES])
def test_hostile_legacy_files(write, build, error, message):
    _fails(write, build(), error, message)


def test_legacy_views_of_a_storage_read_their_slice(write):
    view = legacy_pid("FloatStorage", "0", 3, view=tup(s("v"), i(1), i(2)))
    data = legacy_file(state_dict({"w": tensor(view, 0, (2,), (1,))}), ["0"], [(3, DATA3)])
    with wio.open(write("view.pt", data)) as ckpt:
        assert ckpt["w"].numpy().tolist() == [2.0, 3.0]


@pytest.mark.parametrize("index,label", [(2, "pickle 3 (sys_info)"), (3, "pickle 4 (the checkpoint)"),
                                         (4, "pickle 5 (storage keys)")])
def test_a_payload_in_any_stacked_pickle_of_a_legacy_file_is_refused(write, tmp_path, index, label):
    source = PT / "views_legacy.pt"
    raw, spans = source.read_bytes(), stacked(source)
    marker = tmp_path / "PWNED"
    evil = P2 + call("posix", "system", s(f"touch {marker}")) + STOP
    start, end = spans[index]
    _fails(write, raw[:start] + evil + raw[end:], UnsafePickleError,
           f"{label}: the pickle asks for global 'posix.system'")
    assert not marker.exists()


# ----------------------------------------------------------------------------- legacy tar files


def _tar_members() -> dict[str, bytes]:
    with tarfile.open(PT / "legacy_tar.pt") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _tar(members: dict[str, bytes] | list[tuple[str, bytes]], kind: bytes = tarfile.REGTYPE) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (members.items() if isinstance(members, dict) else members):
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


TAR_CASES = [
    ("bad header checksum", lambda: _flip((PT / "legacy_tar.pt").read_bytes(), 10), FormatError,  # tarfile refuses it:
     "is not a checkpoint format weightio reads"),  # to torch as to weightio no tar, and no pickle either
    ("a member too many", lambda: _tar({**_tar_members(), "extra": b""}), CorruptFileError,
     "a legacy torch tar checkpoint has members sys_info, pickle, tensors, storages; found 'sys_info', 'pickle', "
     "'tensors', 'storages', 'extra'"),
    ("a member missing", lambda: _tar({k: v for k, v in _tar_members().items() if k != "tensors"}), CorruptFileError,
     "found 'sys_info', 'pickle', 'storages'"),
    ("duplicate member", lambda: _tar([*_tar_members().items(), ("pickle", b"x")]), CorruptFileError,
     "member 'pickle' appears twice"),
    ("bytes after the archive", lambda: (PT / "legacy_tar.pt").read_bytes() + b"PK\x05\x06" + bytes(18),
     CorruptFileError, "tar archive: non-zero bytes follow the end of the archive (a polyglot file?)"),
    ("truncated", lambda: (PT / "legacy_tar.pt").read_bytes()[:2000], CorruptFileError,
     "tar archive: the archive ends at offset 2048 without its end-of-archive blocks"),
    ("a symlink member", lambda: _tar(_tar_members(), tarfile.SYMTYPE), CorruptFileError,
     "the member at offset 0 has type '2'; only regular files (and a PAX header before one) are expected"),
    ("payload in the main pickle", lambda: _tar({**_tar_members(), "pickle": P2 + call("posix", "system", s("x"))
                                                 + STOP}),
     UnsafePickleError, "member 'pickle': the pickle asks for global 'posix.system'"),
    ("tensor header with 100 dims", lambda: _tar({**_tar_members(), "tensors": pickle.dumps(1, 2) + pickle.dumps(
        (1000, 2000, None), 2) + struct.pack("<ii", 100, 0)}), CorruptFileError,
     "tar tensor 1000: ndim 100 is out of range or runs past member 'tensors'"),
    ("storage data past its member", lambda: _tar({**_tar_members(), "storages": _short_storages()}), CorruptFileError,
     "tar storage 2000 (48 bytes) runs past the end of its member"),
    ("a storage key Python cannot print", lambda: _tar({**_tar_members(), "storages": _short_storages(2**16000)}),
     CorruptFileError, "tar storage key <int of 16,001 bits> is not a small int or a short string"),
]


def _short_storages(key: int = 2000) -> bytes:
    entry = P2 + tup(pickle.dumps(key, 2)[2:-1], s("cpu"), g("torch", "FloatStorage")) + STOP
    return pickle.dumps(1, 2) + entry + struct.pack("<q", 12) + b"\0" * 8


@pytest.mark.parametrize("build,error,message", [c[1:] for c in TAR_CASES], ids=[c[0] for c in TAR_CASES])
def test_hostile_tar_files(write, build, error, message):
    _fails(write, build(), error, message)


# ----------------------------------------------------------------------------- what torch itself wrote


def test_hostile_edits_of_a_torch_written_archive(write):
    data_pkl = member(PT / "views.pt", "data.pkl")
    no_storage_0 = rezip(PT / "views.pt", {"views/data/0": None})
    _fails(write, no_storage_0, CorruptFileError, "tensor 'base': its storage '0' has no record 'views/data/0'")
    short = rezip(PT / "views.pt", {"views/data/0": member(PT / "views.pt", "data/0")[:-4]})
    _fails(write, short, CorruptFileError, "tensor 'base': its storage '0' is declared as 24 x float32 = 96 bytes "
                                           "but record 'views/data/0' holds 92")
    bad_order = rezip(PT / "views.pt", {"views/byteorder": b"LITTLE"})
    _fails(write, bad_order, CorruptFileError, "byteorder record is b'LITTLE'")
    truncated_pickle = rezip(PT / "views.pt", {"views/data.pkl": data_pkl[:-20]})
    _fails(write, truncated_pickle, CorruptFileError, "views/data.pkl: BINUNICODE at offset 1808 claims 14 bytes "
                                                      "but only 5 remain")


def test_a_pax_size_moves_the_walk_to_the_next_header(tmp_path):
    # review finding: the next header was found from the ustar size field (0 for members of 8 GiB
    # or more, which tarfile puts in a PAX record), not from the PAX size, unlike tarfile
    from weightio._io import MappedFile
    from weightio.formats.pytorch import tar as _tar

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("a", b"x" * 1024), ("b", b"abc")):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(data), {"size": str(len(data))} if name == "a" else {}
            tar.addfile(info, io.BytesIO(data))
    data = bytearray(buf.getvalue())
    header = data.index(b"a\0", 1024)  # member a's own header, after its PAX header
    data[header + 124: header + 136] = b"%011o\0" % 0
    data[header + 148: header + 156] = b" " * 8
    data[header + 148: header + 156] = b"%06o\0 " % sum(data[header: header + 512])
    (tmp_path / "pax.tar").write_bytes(bytes(data))
    with tarfile.open(tmp_path / "pax.tar") as reference:
        assert [(m.name, m.size) for m in reference.getmembers()] == [("a", 1024), ("b", 3)]
    file = MappedFile(tmp_path / "pax.tar")
    try:
        assert [(m.name, m.size) for m in _tar.read_members(file)] == [("a", 1024), ("b", 3)]
    finally:
        file.close()


@pytest.mark.parametrize("opcode", [b"F", b"I", b"L", b"S", b"V", b"c", b"p"], ids=lambda o: o.decode())
def test_a_text_argument_never_searches_past_the_header_limit(tmp_path, opcode):
    """A text opcode's argument ends at a newline: with none in sight, the search stops at
    limits.header_bytes (a pickle is header), not at the end of a file of any size — found by
    the `huge` fuzz harness, whose inputs are followed by a hole of several times memory."""
    path = tmp_path / "model.pt"
    with open(path, "wb") as f:
        f.write(b"\x80\x02" + opcode + b"1")
        f.truncate(64 << 30)  # a 64 GiB hole: no newline anywhere
    for scan in (False, True):
        with wio.limits.using(header_bytes=1 << 20):
            if scan:
                report = wio.scan(path)
                assert not report.safe
                assert "no STOP opcode within its first 1048576 bytes" in str(report)
                continue
            with pytest.raises(CorruptFileError) as info:
                wio.open(path)
    assert str(info.value) == (f"{path}: pickle 1: no STOP opcode within its first 1048576 bytes "
                               "(limits.header_bytes; raise it with weightio.limits.using(header_bytes=...), "
                               "or WEIGHTIO_MAX_HEADER_BYTES if the file is trusted)")


# ----------------------------------------------------------------------------- issue 13: the widened surface
# What issue 13 made readable (CRC-less zips, deflated storages larger than the file, sub-byte
# quantized views, nested tensors, legacy tensor classes + BUILD, empty storages under several
# dtypes, Python 2 strings), and the lies each could carry.

NEWOBJ, BUILD, SETITEM = b"\x81", b"b", b"s"
EMPTY_TUPLE, EMPTY_DICT = b")", b"}"


def _int64s(key: str, values: list[int]) -> tuple[bytes, bytes]:
    """A 1-D int64 tensor of `values` over storage `key`, and its record."""
    raw = struct.pack(f"<{len(values)}q", *values)
    return tensor(pid("LongStorage", key, len(values)), 0, (len(values),), (1,)), raw


def _nested(sizes: list[list[int]], strides: list[list[int]], offsets: list[int], *, buffer_offset: int = 0,
            sizes_class: str = "LongStorage", name: str = "nt", extra: dict[str, bytes] | None = None) -> bytes:
    """{'nt': a strided nested tensor over a 12-float buffer}, its int64 metadata in records 1-3."""
    def rows(key: str, values: list[list[int]], storage_class: str = "LongStorage") -> tuple[bytes, bytes]:
        flat, ndim = [v for row in values for v in row], len(values[0])
        t = tensor(pid(storage_class, key, len(flat)), 0, (len(values), ndim), (ndim, 1))
        return t, struct.pack(f"<{len(flat)}q", *flat)

    (size_t, size_raw), (stride_t, stride_raw) = rows("1", sizes, sizes_class), rows("2", strides)
    offset_t, offset_raw = _int64s("3", offsets)
    buffer = tensor(W, buffer_offset, (12 - buffer_offset,), (1,))
    nested = call("torch._utils", "_rebuild_nested_tensor", buffer, size_t, stride_t, offset_t)
    records = {"0": f32(*range(12)), "1": size_raw, "2": stride_raw, "3": offset_raw}
    return torch_zip(state_dict({name: nested, **(extra or {})}), records)


def _broadcast_nested(rows: int, broadcast: str) -> bytes:
    """A nested tensor of `rows` components whose `broadcast` metadata tensor ("sizes", "strides" or
    "offsets") is a stride-0 view of one int64: `rows` components from a file of a kilobyte."""
    def meta(key: str, shape: tuple[int, ...], value: int, what: str) -> tuple[bytes, bytes]:
        values = [value] * (1 if what == broadcast else math.prod(shape))
        stride = (0,) * len(shape) if what == broadcast else (*shape[1:], 1)
        return tensor(pid("LongStorage", key, len(values)), 0, shape, stride), struct.pack(f"<{len(values)}q", *values)

    (size_t, size_raw), (stride_t, stride_raw) = meta("1", (rows, 1), 1, "sizes"), meta("2", (rows, 1), 1, "strides")
    offset_t, offset_raw = meta("3", (rows,), 0, "offsets")
    nested = call("torch._utils", "_rebuild_nested_tensor", tensor(W, 0, (12,), (1,)), size_t, stride_t, offset_t)
    return torch_zip(state_dict({"nt": nested}), {"0": f32(*range(12)), "1": size_raw, "2": stride_raw,
                                                  "3": offset_raw})


def _qtensor(numel: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    params = tup(g("torch", "per_tensor_affine"), b"G" + struct.pack(">d", 0.5), i(0))
    return call("torch._utils", "_rebuild_qtensor", pid("QUInt4x2Storage", "0", numel), i(0), ints(size), ints(stride),
                params, NEWFALSE, call("collections", "OrderedDict"))


LW = legacy_pid("FloatStorage", "0", 3)


def _legacy(body: bytes) -> bytes:
    """A legacy file whose tensor 'w' is `body`, over a 3-float storage '0'."""
    return legacy_file(state_dict({"w": body}), ["0"], [(3, DATA3)])


def _cls(name: str, state: bytes, make: bytes = EMPTY_TUPLE + b"R") -> bytes:
    return g("torch", name) + make + state + BUILD


def _py2_str(raw: bytes) -> bytes:
    return b"U" + bytes([len(raw)]) + raw  # SHORT_BINSTRING


ISSUE13_CASES = [
    ("data.pkl CRC zeroed in an archive with CRCs",
     lambda: _patch_central(torch_zip(state_dict({}), {}), "archive/data.pkl", crc=0),
     CorruptFileError, "zip archive: record 'archive/data.pkl' fails its CRC-32 check"),
    ("deflated storage claiming more than deflate can make",
     lambda: _patch_central(one(tensor(pid("FloatStorage", "0", 2**29), 0, (1,), (1,)), compress={"data/0"}),
                            "archive/data/0", usize=2**31),
     CorruptFileError, "archive/data.pkl: storage '0': 536870912 elements of float32 cannot fit in a"),
    ("deflated storage inflating to fewer bytes than it declares",
     lambda: _patch_central(one(tensor(pid("FloatStorage", "0", 24), 0, (24,), (1,)), compress={"data/0"}),
                            "archive/data/0", usize=96),
     CorruptFileError, "tensor 'w': zip archive: member 'archive/data/0' inflates to 48 bytes, not the 96 declared"),
    ("quint4x2 view past its storage", lambda: one(_qtensor(4, (3, 4), (4, 1)), records={"0": bytes(4)}),
     CorruptFileError, "tensor 'w': view (offset 0, size (3, 4), stride (4, 1)) of quint4x2 (2 elements per byte) "
                       "needs 6 bytes of a 4-byte storage '0'"),
    ("quint4x2 strided view past its storage", lambda: one(_qtensor(4, (2,), (9,)), records={"0": bytes(4)}),
     CorruptFileError, "needs 5 bytes of a 4-byte storage '0'"),
    ("nested sizes that are floats", lambda: _nested([[2, 3]], [[3, 1]], [0], sizes_class="DoubleStorage"),
     CorruptFileError, "tensor 'nt': nested tensor sizes <tensor dense size=(1, 2)> is not a contiguous 2-D int64 "
                       "tensor (torch requires one)"),
    ("nested sizes broadcast from one int64 (100 000 components from a kilobyte)",
     lambda: _broadcast_nested(100_000, "sizes"), CorruptFileError,
     "tensor 'nt': nested tensor sizes <tensor dense size=(100000, 1)> is not a contiguous 2-D int64 tensor"),
    ("nested strides broadcast from one int64", lambda: _broadcast_nested(3, "strides"), CorruptFileError,
     "tensor 'nt': nested tensor strides <tensor dense size=(3, 1)> is not a contiguous 2-D int64 tensor"),
    ("nested storage offsets broadcast from one int64", lambda: _broadcast_nested(3, "offsets"), CorruptFileError,
     "tensor 'nt': nested tensor storage offsets <tensor dense size=(3,)> is not a contiguous 1-D int64 tensor"),
    ("nested component past its buffer", lambda: _nested([[2, 3], [2, 3]], [[3, 1], [3, 1]], [0, 9]),
     CorruptFileError, "tensor 'nt[1]': view (offset 9, size (2, 3), stride (3, 1)) reaches element 14 of a "
                       "12-element storage '0'"),
    ("nested negative stride", lambda: _nested([[2, 3]], [[-3, 1]], [6]),
     CorruptFileError, "tensor 'nt[0]': negative offset, size or stride (offset 6, size (2, 3), stride (-3, 1))"),
    ("nested buffer at a storage offset", lambda: _nested([[2, 3]], [[3, 1]], [0], buffer_offset=2),
     CorruptFileError, "tensor 'nt': nested tensor buffer <tensor dense size=(10,)> is not a flat tensor at storage "
                       "offset 0"),
    ("nested rows that disagree", lambda: _nested([[2, 3], [1, 1]], [[3, 1]], [0, 6]),
     CorruptFileError, "tensor 'nt': nested tensor sizes (2 rows), strides (1 rows) and storage offsets (2) do not "
                       "match"),
    ("nested component named like another tensor",
     lambda: _nested([[2, 3]], [[3, 1]], [0], extra={"nt[0]": tensor(W, 0, (1,), (1,))}),
     FormatError, "two entries flatten to the same name 'nt[0]'; weightio cannot list both"),
    ("legacy class called with arguments", lambda: _legacy(_cls("FloatTensor", tup(LW), tup(i(3)) + b"R")),
     CorruptFileError, "torch.FloatTensor(3): a legacy tensor class called with arguments"),
    ("legacy state that is a dict", lambda: _legacy(_cls("FloatTensor", EMPTY_DICT)),
     CorruptFileError, "torch.FloatTensor state {} is not (storage[, offset, size[, stride]]), what Tensor.set_ takes"),
    ("legacy state of five items (a Variable's)",
     lambda: _legacy(_cls("FloatTensor", tup(LW, i(0), ints((3,)), ints((1,)), NONE))),
     CorruptFileError, "is not (storage[, offset, size[, stride]]), what Tensor.set_ takes"),
    ("legacy state with a dunder slot state", lambda: _legacy(_cls("Tensor", tup(NONE, EMPTY_DICT + s("__class__")
                                                                                 + g("torch", "Size") + SETITEM))),
     CorruptFileError, "torch.Tensor state (None, {'__class__': torch.Size}) is not (storage[, offset, size["),
    ("legacy state from a tensor, not a storage",
     lambda: _legacy(_cls("FloatTensor", tup(call("torch._utils", "_rebuild_tensor", LW, i(0), ints((3,)),
                                                  ints((1,)))))),
     CorruptFileError, "torch.FloatTensor state: <tensor dense size=(3,)> is not a torch storage"),
    ("legacy class over another dtype's storage", lambda: _legacy(_cls("LongTensor", tup(LW), EMPTY_TUPLE + NEWOBJ)),
     CorruptFileError, "torch.LongTensor state holds a float32 storage; torch refuses any but int64"),
    ("legacy view past its storage", lambda: _legacy(_cls("FloatTensor", tup(LW, i(1), ints((3,))))),
     CorruptFileError, "tensor 'w': view (offset 1, size (3,), stride (1,)) reaches element 3 of a 3-element storage"),
    ("SETITEM on a legacy tensor", lambda: _legacy(g("torch", "FloatTensor") + EMPTY_TUPLE + NEWOBJ + s("k") + i(1)
                                                   + SETITEM),
     CorruptFileError, "is malformed (TypeError: 'torch_FloatTensor' object does not support item assignment)"),
    ("storage empty under one dtype, not under another", lambda: torch_zip(state_dict({
        "a": tensor(pid("FloatStorage", "0", 0), 0, (0,), (1,)),
        "b": tensor(pid("IntStorage", "0", 3), 0, (3,), (1,))}), {"0": b""}),
     CorruptFileError, "storage '0' is declared twice: 0 x float32, then 3 x int32"),
    ("Python 2 strings naming posix.system for STACK_GLOBAL",
     lambda: one(_py2_str(b"posix") + _py2_str(b"system") + b"\x93" + tup(_py2_str(b"ls")) + b"R"),
     UnsafePickleError, "the pickle asks for global 'posix.system', which is not on weightio's allowlist"),
    ("Python 2 strings that are not UTF-8 as STACK_GLOBAL operands",
     lambda: one(_py2_str(b"\xffposix") + _py2_str(b"system") + b"\x93"),
     CorruptFileError, "is malformed (UnpicklingError: STACK_GLOBAL requires str)"),
    ("unquoted protocol-0 STRING", lambda: one(b"Sabc\n"),
     CorruptFileError, "is malformed (UnpicklingError: the STRING opcode argument must be quoted)"),
]


@pytest.mark.parametrize("build,error,message", [c[1:] for c in ISSUE13_CASES], ids=[c[0] for c in ISSUE13_CASES])
def test_hostile_forms_of_what_issue_13_reads(write, build, error, message):
    _fails(write, build(), error, message)


def test_nested_components_count_against_the_tensor_limit(write):
    path = write("nt.pt", _nested([[1, 1]] * 8, [[1, 1]] * 8, list(range(8))))
    with wio.open(path) as ckpt:
        assert list(ckpt) == [f"nt[{k}]" for k in range(8)]
    with wio.limits.using(tensors=7), pytest.raises(CorruptFileError, match=r"tensor 'nt': nested tensor components "
                                                                           r"\(sizes \(8, 2\)\) .*limits.tensors"):
        wio.open(path)


def test_python2_strings_inside_frames_read(write):
    # a protocol-4 FRAME around Python 2 strings: the rewrite drops the frame, whose length would no longer hold
    body = EMPTY_DICT + _py2_str("clé".encode()) + _py2_str("été".encode()) + SETITEM + STOP
    framed = b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body
    with wio.open(write("framed.pkl", framed)) as ckpt:
        assert ckpt.metadata == {"clé": "été"}


def test_python2_string_escapes_read_as_cpython_reads_them_without_a_warning(write):
    # a Python 2 STRING: known escapes decoded, an unknown one ('\q') kept as backslash + q — CPython
    # keeps it too, with a DeprecationWarning that this suite (filterwarnings = error) would raise
    body = b"\x80\x02}S'note'\nS'a\\q\\x41\\n\\\\'\ns."
    with wio.open(write("escapes.pkl", body)) as ckpt:
        assert ckpt.metadata == {"note": "a\\qA\n\\"}
