""".npy / .npz readers and writers: numpy-written fixtures, byte-identical writes, hostile files."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import ml_dtypes
import numpy as np
import pytest

import weightio as wio
from weightio.errors import CorruptFileError, FormatError, UnsafePickleError, UnsupportedDTypeError, UsageError
from weightio.formats import _zip
from weightio.formats import numpy as npformat
from weightio.formats.numpy import NpyReader, NpzReader

from ..conftest import FIXTURES

NUMPY = FIXTURES / "numpy"
NAMES = ["c_order", "fortran", "big_endian", "scalar", "empty", "flags", "complex", "unaligned_name_x"]


def _npy(header: str | bytes, data: bytes = b"", *, version: tuple[int, int] = (1, 0),
         hlen: int | None = None) -> bytes:
    body = header.encode("latin1") if isinstance(header, str) else header
    field = "<H" if version == (1, 0) else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(field, len(body) if hlen is None else hlen) + body + data


def _header(descr: str = "<f4", fortran: object = False, shape: object = (2,)) -> str:
    return "{" + f"'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, " + "}\n"


# ----------------------------------------------------------------------------- .npy reading


@pytest.mark.parametrize("name", NAMES)
def test_npy_fixtures_match_numpy(name):
    expected = np.load(NUMPY / f"{name}.npy")
    got = wio.load(NUMPY / f"{name}.npy")
    assert list(got) == [name]
    arr = got[name]
    assert arr.dtype == expected.dtype.newbyteorder("=") and arr.shape == expected.shape
    np.testing.assert_array_equal(arr, expected)
    assert arr.flags.writeable is False


def test_npy_is_mapped_zero_copy_and_fortran_keeps_its_layout():
    with wio.open(NUMPY / "fortran.npy") as ckpt:
        arr = ckpt["fortran"].numpy()
        assert np.shares_memory(arr, ckpt.readers[0].file.data)
        assert arr.flags.f_contiguous and not arr.flags.c_contiguous
        assert arr.strides == (8, 16, 48)
        np.testing.assert_array_equal(arr, np.arange(24.0).reshape(2, 3, 4))


def test_big_endian_is_converted_on_numpy_but_raw_is_the_stored_bytes():
    with wio.open(NUMPY / "big_endian.npy") as ckpt:
        v = ckpt["big_endian"]
        assert v.dtype == np.dtype("int32") and v.info.dtype == np.dtype(">i4")
        arr = v.numpy()
        assert arr.dtype.isnative and arr.tolist() == [-3, -2, -1, 0, 1, 2]
        assert not np.shares_memory(arr, ckpt.readers[0].file.data)  # documented copy
        assert v.raw().tobytes() == np.arange(-3, 3, dtype=">i4").tobytes()
        assert v[1:3].tolist() == [-2, -1]


# ----------------------------------------------------------------------------- .npz reading


@pytest.mark.parametrize("archive", ["arrays.npz", "compressed.npz", "compressed_big.npz", "positional.npz"])
def test_npz_fixtures_match_numpy(archive):
    with np.load(NUMPY / archive) as expected:
        got = wio.load(NUMPY / archive)
        assert list(got) == list(expected.files)
        for name in expected.files:
            np.testing.assert_array_equal(got[name], expected[name])
            assert got[name].dtype == expected[name].dtype.newbyteorder("=")


def test_stored_npz_members_are_views_of_the_archive_even_unaligned():
    with wio.open(NUMPY / "arrays.npz") as ckpt:
        mapping = ckpt.readers[0].file.data
        for name in ckpt:
            if name == "big_endian":
                continue
            arr = ckpt[name].numpy()
            assert arr.size == 0 or np.shares_memory(arr, mapping), name
        # np.savez does not align members: this float32 member sits at an odd offset and is still mapped
        c = ckpt["c_order"]
        assert c.info.offset % 4 != 0 and c.numpy().flags.aligned is False


def test_deflated_members_inflate_once_and_are_shared():
    with wio.open(NUMPY / "compressed.npz") as ckpt:
        reader = ckpt.readers[0]
        first = ckpt["c_order"].numpy()
        assert reader.buffer("c_order") is reader.buffer("c_order")
        assert np.shares_memory(first, ckpt["c_order"].numpy())
        assert "fortran" not in reader._inflated  # untouched members stay compressed


def test_inflate_works_in_small_chunks():
    with wio.open(NUMPY / "compressed_big.npz") as ckpt:
        reader = ckpt.readers[0]
        member = reader._deflated["ramp"]
        whole = _zip.inflate(reader.file, member, chunk=777)
        assert whole.tobytes() == _zip.inflate(reader.file, member).tobytes()
        np.testing.assert_array_equal(ckpt["ramp"].numpy(), np.arange(50_000, dtype=np.float32))


def test_zip64_archives_written_by_zipfile_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 16)
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
    path = tmp_path / "z64.npz"
    arrays = {"a": np.arange(10.0), "b": np.ones((2, 3), np.int16)}
    with zipfile.ZipFile(path, "w") as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.save(buf, arr)
            zf.writestr(name + ".npy", buf.getvalue())
    assert b"PK\x06\x06" in path.read_bytes()  # a ZIP64 end record is really there
    got = wio.load(path)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(got[name], arr)


def test_empty_npz_has_no_tensors(tmp_path):
    np.savez(tmp_path / "empty.npz")
    with wio.open(tmp_path / "empty.npz") as ckpt:
        assert ckpt.format == "npz" and len(ckpt) == 0


# ----------------------------------------------------------------------------- writers

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(7, dtype=np.int64),
    np.zeros((0, 5)),
    np.array([True, False]),
    np.arange(6, dtype=np.complex64),
    np.arange(100_000, dtype=np.uint16),
    np.ones((1,) * 30, dtype=np.int8),
    np.arange(4, dtype=">f8"),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_npy_writer_is_byte_identical_to_numpy_save(tmp_path, arr):
    ours, ref = tmp_path / "ours.npy", tmp_path / "ref.npy"
    wio.save({"x": arr}, ours)
    np.save(ref, arr.astype(arr.dtype.newbyteorder("<")))
    assert ours.read_bytes() == ref.read_bytes()


def test_npz_writer_output_is_read_by_numpy_and_mapped_aligned(tmp_path):
    arrays = {f"t{i}": a for i, a in enumerate(ARRAYS)} | {"nested/name": np.arange(3.0)}
    path = tmp_path / "out.npz"
    wio.save(arrays, path)
    with np.load(path) as z:
        assert z.files == list(arrays)
        for name, arr in arrays.items():
            np.testing.assert_array_equal(z[name], arr)
    with zipfile.ZipFile(path) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
        assert zf.testzip() is None  # CRCs are right
    with wio.open(path) as ckpt:
        for name in ckpt:
            assert ckpt[name].info.offset % 64 == 0, name
            arr = ckpt[name].numpy()
            assert arr.flags.aligned and (arr.size == 0 or np.shares_memory(arr, ckpt.readers[0].file.data))


def test_npz_writer_zip64_records_are_read_by_numpy_and_us(tmp_path, monkeypatch):
    monkeypatch.setattr(npformat, "_ZIP64_LIMIT", 0)  # force every ZIP64 record on a small archive
    arrays = {"a": np.arange(10.0), "b": np.ones((2, 3), np.int16)}
    path = tmp_path / "z64.npz"
    wio.save(arrays, path)
    raw = path.read_bytes()
    assert b"PK\x06\x06" in raw and b"PK\x06\x07" in raw
    with np.load(path) as z:
        for name, arr in arrays.items():
            np.testing.assert_array_equal(z[name], arr)
    got = wio.load(path)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(got[name], arr)


def test_npz_round_trip_from_views_and_determinism(tmp_path):
    with wio.open(NUMPY / "compressed.npz") as ckpt:
        wio.save({n: ckpt[n] for n in ckpt}, tmp_path / "a.npz")
        wio.save({n: ckpt[n] for n in ckpt}, tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()  # fixed timestamps
    with np.load(NUMPY / "compressed.npz") as expected:
        got = wio.load(tmp_path / "a.npz")
        for name in expected.files:
            np.testing.assert_array_equal(got[name], expected[name])


def test_writers_refuse_what_numpy_cannot_read_back(tmp_path):
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'b': bfloat16 has no .npy descr"):
        wio.save({"b": np.zeros(2, ml_dtypes.bfloat16)}, tmp_path / "b.npz")
    with pytest.raises(UsageError, match=r".npy holds exactly one array; got 2 tensors"):
        wio.save({"a": np.zeros(1), "b": np.zeros(1)}, tmp_path / "two.npy")
    with pytest.raises(UsageError, match="npz files cannot store metadata"):
        wio.save({"a": np.zeros(1)}, tmp_path / "m.npz", metadata={"k": "v"})
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- hostile .npy


def _nested(depth: int) -> list:
    descr: object = "<f4"
    for _ in range(depth):
        descr = [("f", descr)]
    return descr  # type: ignore[return-value]


_PICKLE = b"\x80\x04N."  # what follows an object array's header: a pickle (never loaded)
_DICT_DESCR = "{'names': ['a', 'b'], 'formats': ['<f4', '<f4'], 'offsets': [0, %s], 'itemsize': 8}"

HOSTILE_DESCRS = [
    ("string of 10^12 bytes", _npy(_header("|S999999999999")), UnsupportedDTypeError,
     "dtype '|S999999999999' is not a numpy dtype (or its itemsize does not fit numpy's C int)"),
    ("str of 2^31 characters", _npy(_header("<U2147483648")), UnsupportedDTypeError,
     "dtype '<U2147483648' is not a numpy dtype"),
    ("string of 0 bytes", _npy(_header("|S0")), UnsupportedDTypeError,
     "descr '|S0' has elements of 0 bytes (an array that holds no data), which weightio does not read"),
    ("empty record", _npy(_header([])), UnsupportedDTypeError, "descr [] has elements of 0 bytes"),
    ("record over 2^31 bytes", _npy(_header([("a", "|S2147483647"), ("b", "|S2147483647")])), UnsupportedDTypeError,
     "makes records of more than 2,147,483,647 bytes"),
    ("sub-array over 2^31 bytes", _npy(_header([("a", "<f8", (2**20, 2**20))])), UnsupportedDTypeError,
     "the sub-array shape (1048576, 1048576) makes fields of more than 2,147,483,647 bytes"),
    ("sub-array of 2^4000 elements", _npy(_header([("a", "|u1", (2**4000, 0))])), UnsupportedDTypeError,
     "makes fields of more than 2,147,483,647 bytes"),
    ("negative sub-array dimension", _npy(_header([("a", "<f4", (-1,))])), UnsupportedDTypeError,
     "field 0 of descr [('a', '<f4', <tuple of 1>)]: the sub-array shape (-1,) is not at most 32 non-negative ints"),
    ("bool sub-array dimension", _npy(_header([("a", "<f4", (True,))])), UnsupportedDTypeError,
     "the sub-array shape (True,) is not"),
    ("sub-array of 33 dimensions", _npy(_header([("a", "<f4", (1,) * 33)])), UnsupportedDTypeError,
     "is not at most 32 non-negative ints"),
    ("record shape times itemsize reaching 2^63", _npy(_header([("a", "|S2147483647")], shape=(2**33,))),
     CorruptFileError, "shape (8589934592,) is too large for numpy"),
    ("record data one byte short", _npy(_header([("a", "<i4"), ("b", "|S3")], shape=(2,)), b"\0" * 13),
     CorruptFileError, "= 14 data bytes but 13 follow (1 bytes missing)"),
    ("int field name", _npy(_header([(1, "<f4")])), UnsupportedDTypeError,
     "field 0 of descr [(1, '<f4')]: the name 1 is not a str (or a (title, name) pair of str)"),
    ("bytes field name", _npy(_header([(b"a", "<f4")])), UnsupportedDTypeError, "the name b'a' is not a str"),
    ("title that is not a str", _npy(_header([((1, "a"), "<f4")])), UnsupportedDTypeError,
     "the name (1, 'a') is not a str"),
    ("field name repeated (overlapping fields)", _npy(_header([("a", "<f4"), ("a", "<f4")])),
     UnsupportedDTypeError, "is not a valid record: name already used as a name or title"),
    ("title equal to a field name", _npy(_header([(("a", "x"), "<f4"), ("a", "<f4")])), UnsupportedDTypeError,
     "is not a valid record: name already used as a name or title"),
    ("field of four items", _npy(_header([("a", "<f4", (2,), 1)])), UnsupportedDTypeError,
     "is not (name, descr) or (name, descr, shape)"),
    ("field as a list", _npy(_header([["a", "<f4"]])), UnsupportedDTypeError,
     "['a', '<f4'] is not (name, descr) or (name, descr, shape)"),
    ("field type a number", _npy(_header([("a", 4)])), UnsupportedDTypeError,
     "4 is not a type string or a list of fields"),
    ("comma string inside a field", _npy(_header([("a", "f4,f4")])), UnsupportedDTypeError,
     "dtype 'f4,f4' (in descr [('a', 'f4,f4')]) is not a numpy type string"),
    ("sub-array string inside a field", _npy(_header([("a", "(2,)f4")])), UnsupportedDTypeError,
     "is not a numpy type string"),
    ("negative padding", _npy(_header([("a", "<f4"), ("", "|V-4")])), UnsupportedDTypeError,
     "dtype '|V-4' (in descr"),
    ("records nested 33 deep", _npy(_header(_nested(33))), UnsupportedDTypeError,
     "descr nests records more than 32 deep"),
    ("negative record offset (dict descr)", _npy("{'descr': " + _DICT_DESCR % -4 + ", 'fortran_order': False, "
                                                 "'shape': (1,), }"), UnsupportedDTypeError,
     "'offsets': [0, -4], 'itemsize'… is not a dtype descriptor (a type string such as '<f4' or a list of record "
     "fields)"),
    ("overlapping record offsets (dict descr)", _npy("{'descr': " + _DICT_DESCR % 2 + ", 'fortran_order': False, "
                                                     "'shape': (1,), }"), UnsupportedDTypeError,
     "is not a dtype descriptor"),
    ("record offset past the record (dict descr)", _npy("{'descr': " + _DICT_DESCR % 2**40
                                                        + ", 'fortran_order': False, 'shape': (1,), }"),
     UnsupportedDTypeError, "is not a dtype descriptor"),
    ("object hidden in a nested field", _npy(_header([("p", [("q", [("o", "|O")])])]), _PICKLE), UnsafePickleError,
     "object array ([('p', <list of 1>)]): its data is a pickle, which weightio never loads"),
    ("object hidden in a sub-array field", _npy(_header([("a", "<f4"), ("o", "|O", (2,))]), _PICKLE),
     UnsafePickleError, "its data is a pickle, which weightio never loads"),
    ("L suffixes in a version 3.0 header", _npy(_header(shape="(2L,)").replace("'(2L,)'", "(2L,)"), b"\0" * 8,
                                                version=(3, 0)),
     CorruptFileError, ".npy header is not a Python literal (SyntaxError"),
    ("L suffix after a name", _npy(_header(shape="(xL,)").replace("'(xL,)'", "(xL,)"), b"\0" * 8),
     CorruptFileError, ".npy header is not a Python literal"),
    ("lowercase l suffix (numpy strips only L)", _npy(_header(shape="(2l,)").replace("'(2l,)'", "(2l,)"), b"\0" * 8),
     CorruptFileError, ".npy header is not a Python literal (SyntaxError"),
]

HOSTILE_NPY = [
    ("object dtype", _npy(_header("|O"), b"\x80\x04N."), UnsafePickleError,
     "object array ('|O'): its data is a pickle, which weightio never loads"),
    ("structured with object field", _npy(_header([("a", "|O")]), b"\x80\x04N."), UnsafePickleError,
     "object array ([('a', '|O')]): its data is a pickle"),
    ("garbage descr", _npy(_header("zz")), UnsupportedDTypeError, "dtype 'zz' is not a numpy dtype"),
    ("v2 header length 2^32-1", _npy(b"", version=(2, 0), hlen=2**32 - 1), CorruptFileError,
     ".npy header length 4294967295 exceeds the 10000-byte limit"),
    ("header past EOF", _npy(_header(), hlen=5000), CorruptFileError,
     ".npy header (5000 bytes) runs past the end of the data"),
    ("header over the limit", _npy("{" + " " * 10_001 + "}", version=(2, 0)), CorruptFileError,
     ".npy header length 10003 exceeds the 10000-byte limit"),
    ("function call", _npy("__import__('os').system('touch MARKER')"), CorruptFileError,
     ".npy header is not a Python literal (ValueError"),
    ("arithmetic", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (10**12,)}"), CorruptFileError,
     "is not a Python literal"),
    ("3000-deep tuple", _npy("(" * 3000 + ")" * 3000, version=(2, 0)), CorruptFileError,
     "is not a Python literal"),
    ("not a dict", _npy("[1, 2, 3]"), CorruptFileError,
     "must be a dict with keys descr, fortran_order, shape; found list"),
    ("missing key", _npy("{'descr': '<f4', 'shape': (2,)}"), CorruptFileError,
     "found ['descr', 'shape']"),
    ("extra key", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"), CorruptFileError,
     "found ['descr', 'fortran_order', 'shape', 'x']"),
    ("fortran_order 1", _npy(_header(fortran=1)), CorruptFileError, "fortran_order must be True or False, found 1"),
    ("bool shape", _npy(_header(shape=(True, True))), CorruptFileError,
     "shape must be a tuple of at most 64 non-negative ints, found (True, True)"),
    ("negative shape", _npy(_header(shape=(-1,))), CorruptFileError, "found (-1,)"),
    ("list shape", _npy(_header(shape=[2])), CorruptFileError, "found [2]"),
    ("65 dims", _npy(_header(shape=(1,) * 65)), CorruptFileError, "shape must be a tuple of at most 64"),
    ("7 TiB claimed, 8 bytes present", _npy(_header("<f8", shape=(10**12,)), b"\0" * 8), CorruptFileError,
     "header declares float64 (1000000000000,) = 8000000000000 data bytes but 8 follow (7999999999992 bytes missing)"),
    ("trailing garbage", _npy(_header("<f4", shape=(2,)), b"\0" * 13), CorruptFileError,
     "= 8 data bytes but 13 follow (5 bytes trailing)"),
    ("unknown version", b"\x93NUMPY\x09\x09" + b"\0" * 8, FormatError, ".npy format version 9.9 is not supported"),
    ("cut in the preamble", b"\x93NUMPY\x01\x00", CorruptFileError, "ends inside the .npy preamble (8 bytes)"),
    ("v3 header not UTF-8", _npy(b"{'descr': '\xff'}", version=(3, 0)), CorruptFileError,
     "is not a Python literal (UnicodeDecodeError"),
    # found by tests/fuzz (npy and npz harnesses): numpy 2's DeprecationWarning escaped the reader
    ("deprecated 'a' code", _npy(_header("<a8", shape=(0, 3))), UnsupportedDTypeError,
     "dtype '<a8' is not a numpy type string"),
    ("'a' inside a comma string", _npy(_header("f4,a8")), UnsupportedDTypeError,
     "dtype 'f4,a8' is not a numpy type string"),
    # found by tests/fuzz (the GGUF harness; the same hole here): numpy() raised a bare ValueError
    ("empty array numpy cannot shape", _npy(_header("<f4", shape=(0, 2**62))), CorruptFileError,
     "shape (0, 4611686018427387904) is too large for numpy"),
    # the descriptor grammar of records, strings and datetimes (weightio.formats.npy_descr), issue 13
    *HOSTILE_DESCRS,
]


@pytest.mark.parametrize("content,error,message", [h[1:] for h in HOSTILE_NPY], ids=[h[0] for h in HOSTILE_NPY])
def test_hostile_npy_files_raise_clear_errors(write, content, error, message):
    path = write("bad.npy", content)
    with pytest.raises(error) as info, wio.open(path) as ckpt:
        for name in ckpt:  # object arrays are listed; reading one is refused
            ckpt[name].numpy()
    assert message in str(info.value)
    assert str(info.value).startswith(f"{path}: ")


# ----------------------------------------------------------------------------- hostile .npz


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _zip_bytes(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def _two_members() -> bytes:
    return _zip_bytes([("a.npy", _npy_bytes(np.arange(4.0))), ("b.npy", _npy_bytes(np.arange(2.0)))])


def _patch_central(data: bytes, index: int, field: str, value: int) -> bytes:
    """Change one field of the index-th central directory entry."""
    offsets = {"flags": (8, "<H"), "method": (10, "<H"), "crc": (16, "<I"), "csize": (20, "<I"),
               "usize": (24, "<I"), "offset": (42, "<I")}
    pos = -1
    for _ in range(index + 1):
        pos = data.index(b"PK\x01\x02", pos + 1)
    at, fmt = offsets[field]
    return data[: pos + at] + struct.pack(fmt, value) + data[pos + at + struct.calcsize(fmt):]


def _with_count(data: bytes, count: int) -> bytes:
    """Change the entry counts of the end-of-central-directory record (no comment)."""
    return data[:-14] + struct.pack("<HH", count, count) + data[-10:]


def _deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def _lying_deflate_member(declared_arr: np.ndarray, payload: bytes) -> bytes:
    """A deflated member whose zip entry and npy header declare `declared_arr`'s size but whose
    stream inflates to `payload`."""
    return _member_with_stream(declared_arr, _deflate_raw(payload))


def _bad_deflate_after_the_end(arr: np.ndarray) -> bytes:
    """A member whose stream inflates to exactly its npy bytes, then goes on (no final block) with
    a second stream whose first match reaches 1000+ bytes back: invalid only past the declared size."""
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = first.compress(_npy_bytes(arr)) + first.flush(zlib.Z_SYNC_FLUSH)
    second = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=b"Q" * 64 + b"\x01" * 1000)
    return _member_with_stream(arr, stream + second.compress(b"Q" * 64) + second.flush())


def _member_with_stream(declared_arr: np.ndarray, stream: bytes) -> bytes:
    """A deflated member 'w.npy' declaring `declared_arr` (size and CRC-32), holding `stream`."""
    real = _zip_bytes([("w.npy", _npy_bytes(declared_arr))], zipfile.ZIP_DEFLATED)
    local_end = 30 + len("w.npy")
    old_csize = struct.unpack_from("<I", real, 18)[0]
    body = real[:local_end] + stream
    cd = real[local_end + old_csize:]
    cd_pos = len(body)
    fixed_cd = cd[:20] + struct.pack("<I", len(stream)) + cd[24:]
    eocd = fixed_cd.index(b"PK\x05\x06")
    fixed_cd = fixed_cd[: eocd + 16] + struct.pack("<I", cd_pos) + fixed_cd[eocd + 20:]
    return body[:18] + struct.pack("<I", len(stream)) + body[22:] + fixed_cd


def _nul_name_archive() -> bytes:
    return _zip_bytes([("aXb.npy", _npy_bytes(np.zeros(1)))]).replace(b"aXb.npy", b"a\x00b.npy")


def _polyglot(tmp_path) -> bytes:
    path = tmp_path / "poly.npz"
    path.write_bytes(b"\x80\x02JUNK-BEFORE-THE-ARCHIVE")
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("a.npy", _npy_bytes(np.zeros(2)))
    return path.read_bytes()


HOSTILE_NPZ = [
    ("member not .npy", lambda t: _zip_bytes([("evil", b"\x80\x04N.")]), CorruptFileError,
     "member 'evil' is not an .npy array"),
    ("member is a pickle", lambda t: _zip_bytes([("x.npy", b"\x80\x04\x95N.")]), CorruptFileError,
     "tensor 'x': not an .npy array (no \\x93NUMPY magic)"),
    ("duplicate members", lambda t: _zip_bytes([("w.npy", _npy_bytes(np.zeros(1)))] * 2), CorruptFileError,
     "zip archive: member 'w.npy' appears twice"),
    ("NUL in a name", lambda t: _nul_name_archive(), CorruptFileError,
     "member name 'a\\x00b.npy' is not a safe tensor name"),
    ("path traversal", lambda t: _zip_bytes([("../../etc/evil.npy", _npy_bytes(np.zeros(1)))]), CorruptFileError,
     "member name '../../etc/evil.npy' is not a safe tensor name"),
    ("absolute name", lambda t: _zip_bytes([("/abs.npy", _npy_bytes(np.zeros(1)))]), CorruptFileError,
     "member name '/abs.npy' is not a safe tensor name"),
    ("overlapping members", lambda t: _patch_central(_patch_central(_two_members(), 0, "csize", 300), 0, "usize", 300),
     CorruptFileError, "zip archive: members 'a.npy' and 'b.npy' overlap"),
    ("entry count 65534", lambda t: _with_count(_two_members(), 0xFFFE), CorruptFileError,
     "65534 entries cannot fit in a 102-byte central directory"),
    ("encrypted member", lambda t: _patch_central(_two_members(), 0, "flags", 1), FormatError,
     "member 'a.npy' is encrypted"),
    ("bzip2 member", lambda t: _patch_central(_two_members(), 1, "method", 12), FormatError,
     "member 'b.npy' uses compression method 12"),
    ("ZIP64 count without a locator", lambda t: _with_count(_two_members(), 0xFFFF), CorruptFileError,
     "ZIP64 fields are set but there is no ZIP64 locator"),
    ("CRC mismatch", lambda t: _patch_central(_zip_bytes([("w.npy", _npy_bytes(np.arange(9.0)))],
                                                         zipfile.ZIP_DEFLATED), 0, "crc", 1234),
     CorruptFileError, "member 'w.npy' fails its CRC-32 check"),
    ("truncated archive", lambda t: _two_members()[:-30], CorruptFileError,
     "no end-of-central-directory record ends the file"),
    ("bytes appended", lambda t: _two_members() + b"TRAILER", CorruptFileError,
     "no end-of-central-directory record ends the file"),
    ("data before the first member", _polyglot, CorruptFileError,
     "25 bytes precede the first member (a polyglot file?)"),
    ("stream longer than declared", lambda t: _lying_deflate_member(np.zeros(109), _npy_bytes(np.zeros(109))
                                                                  + b"\0" * 10_000_000), CorruptFileError,
     "member 'w.npy' inflates to more than the 1000 bytes declared"),
    ("stream shorter than declared", lambda t: _lying_deflate_member(np.zeros(109), _npy_bytes(np.zeros(109))[:500]),
     CorruptFileError, "member 'w.npy' inflates to 500 bytes, not the 1000 declared"),
    ("size beyond deflate's ratio", lambda t: _patch_central(_zip_bytes([("w.npy", _npy_bytes(np.zeros(8)))],
                                                                        zipfile.ZIP_DEFLATED), 0, "usize", 2**32 - 2),
     CorruptFileError, "claims 4294967294 bytes from"),
    # found by tests/fuzz (npz harness): zlib.error escaped inflate() from the look past the declared size
    ("invalid deflate after the declared size", lambda t: _bad_deflate_after_the_end(np.arange(4, dtype="<f4")),
     CorruptFileError, "member 'w.npy' is not valid deflate data (Error -3 while decompressing data: invalid "
                       "distance too far back)"),
]


@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")  # zipfile, building the duplicate case
@pytest.mark.parametrize("build,error,message", [h[1:] for h in HOSTILE_NPZ], ids=[h[0] for h in HOSTILE_NPZ])
def test_hostile_npz_files_raise_clear_errors(tmp_path, build, error, message):
    path = tmp_path / "bad.npz"
    path.write_bytes(build(tmp_path))
    with pytest.raises(error) as info:
        ckpt = NpzReader(path)  # the reader itself, whatever sniffing would say about the archive
        for name in ckpt.tensors:  # deflate problems surface when a member is first read
            ckpt.buffer(name)
    assert message in str(info.value)
    assert str(info.value).startswith(f"{path}: ")


def test_sniffing_names_zip_archives_that_are_not_npz(write):
    path = write("odd.npz", _zip_bytes([("readme.txt", b"hello")]))
    with pytest.raises(FormatError, match=r"is a zip archive but neither an .npz nor a PyTorch checkpoint "
                                          r"\(members: 'readme.txt'\)"):
        wio.open(path)


def test_npy_reader_names_the_tensor_after_the_file(write):
    path = write("weights.npy", _npy(_header("<f4", shape=(2,)), b"\0" * 8))
    assert list(NpyReader(path).tensors) == ["weights"]
