"""numpy's other dtypes (bytes, str, void, datetime, records, objects) and Python 2 headers, against
numpy.load and scipy.sparse.load_npz on real files (fixtures/gen_numpy_dtypes.py). Hostile
descriptors are in tests/formats/test_numpy.py::HOSTILE_NPY (HOSTILE_DESCRS)."""

from __future__ import annotations

import io
import struct
import warnings
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio.convert import convert
from weightio.dtypes import dtype_name
from weightio.errors import CorruptFileError, UnsafePickleError, UnsupportedDTypeError
from weightio.formats.npy_descr import strip_long_suffixes
from weightio.stats import compare, first_values, tensor_stats

from ..conftest import FIXTURES

HERE = FIXTURES / "numpy_dtypes"
NPZ = ["dtypes.npz", "dtypes_compressed.npz", "goog_like.npz", "sparse_csr.npz", "sparse_coo_stored.npz"]
NPY = ["str_be.npy", "nested.npy", "datetime.npy"]


def _stored_members(path) -> dict[str, np.ndarray]:
    """Each member's data exactly as the file stores it (padding bytes included), by zipfile + np.lib.format."""
    out = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            f = io.BytesIO(zf.read(info))
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            out[info.filename[:-4]] = np.frombuffer(f.read(), dtype).reshape(shape, order="F" if fortran else "C")
    return out


def _same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype and got.dtype.descr == expected.dtype.descr  # byte order of every field
    assert got.shape == expected.shape and got.strides == expected.strides
    assert got.flags.writeable is False


@pytest.mark.parametrize("archive", NPZ)
def test_npz_members_are_what_numpy_load_returns(archive):
    stored = _stored_members(HERE / archive)
    with np.load(HERE / archive) as ref, wio.open(HERE / archive) as ckpt:
        assert list(ckpt) == ref.files
        for name in ref.files:
            got = ckpt[name].numpy()
            _same(got, ref[name])
            assert ckpt[name].dtype == ref[name].dtype
            assert got.tobytes(order="A") == stored[name].tobytes(order="A"), name  # the stored bytes, exactly
            if got.dtype.names:  # numpy.load leaves record padding unset: compare the fields
                assert all(np.array_equal(got[f], ref[name][f], equal_nan=got[f].dtype.kind == "f")
                           for f in got.dtype.names)
            else:
                assert got.tobytes(order="A") == ref[name].tobytes(order="A"), name


def test_stored_members_are_zero_copy_views():
    with wio.open(HERE / "dtypes.npz") as ckpt:
        mapping = ckpt.readers[0].file.data
        for name in ckpt:
            assert np.shares_memory(ckpt[name].numpy(), mapping), name
        assert ckpt["aligned"].dtype.isalignedstruct is False and ckpt["aligned"].dtype.itemsize == 24
        assert ckpt["nested"]["pos"]["y"].dtype == np.dtype(">i8")  # big-endian fields stay as stored
        assert ckpt["datetime_ns_be"][1:3].tolist() == np.array([1, -1], ">M8[ns]").tolist()


@pytest.mark.parametrize("name", NPY)
def test_npy_files_are_what_numpy_load_returns(name):
    ref = np.load(HERE / name)
    with wio.open(HERE / name) as ckpt:
        got = ckpt[name[:-4]].numpy()
        _same(got, ref)
        assert got.tobytes() == ref.tobytes() and np.shares_memory(got, ckpt.readers[0].file.data)


def test_scipy_sparse_files_rebuild_the_matrix():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    csr = wio.load(HERE / "sparse_csr.npz")
    assert csr["format"].dtype == np.dtype("|S3") and csr["format"].item() == b"csr"
    rebuilt = scipy_sparse.csr_matrix((csr["data"], csr["indices"], csr["indptr"]), shape=tuple(csr["shape"]))
    assert (rebuilt != scipy_sparse.load_npz(HERE / "sparse_csr.npz")).nnz == 0
    coo = wio.load(HERE / "sparse_coo_stored.npz")
    rebuilt = scipy_sparse.coo_array((coo["data"], (coo["row"], coo["col"])), shape=tuple(coo["shape"]))
    np.testing.assert_array_equal(rebuilt.toarray(), scipy_sparse.load_npz(HERE / "sparse_coo_stored.npz").toarray())


def test_goog_like_record_with_a_datetime_field():
    with wio.open(HERE / "goog_like.npz") as ckpt:
        v = ckpt["price_data"]
        assert dtype_name(v.dtype).startswith("[('date', '<M8[D]'), ('open', '<f8')")
        prices = v.numpy()
    assert prices["date"][0] == np.datetime64("2004-08-19") and prices["volume"].tolist()[-1] == 4_000_012


# ----------------------------------------------------------------------------- object members


def test_object_member_is_listed_and_refused_only_when_read():
    path = HERE / "with_object.npz"
    with wio.open(path) as ckpt, np.load(path, allow_pickle=False) as ref:
        assert list(ckpt) == ["before", "meta", "after"]
        assert ckpt["meta"].dtype == np.dtype("O") and ckpt["meta"].shape == (3,)
        np.testing.assert_array_equal(ckpt["before"].numpy(), ref["before"])
        np.testing.assert_array_equal(ckpt["after"].numpy(), ref["after"])
        for read in (lambda v: v.numpy(), lambda v: v.raw(), lambda v: v[:1], lambda v: v.to("numpy")):
            with pytest.raises(UnsafePickleError, match=r"tensor 'meta': object array \('\|O'\): its data is a "
                                                        r"pickle, which weightio never loads") as info:
                read(ckpt["meta"])
            assert str(info.value).startswith(f"{path}: ")
        with pytest.raises(ValueError, match="Object arrays cannot be loaded when allow_pickle=False"):
            ref["meta"]  # numpy refuses it the same way (without allow_pickle)


def test_scan_and_inspect_of_an_object_member():
    (f,) = wio.scan(HERE / "with_object.npz").files
    assert not f.safe and f.verdict.startswith("UnsafePickleError: tensor 'meta': object array ('|O')")
    assert f.note.startswith("an object array's data is a pickle")
    result = CliRunner().invoke(main, ["inspect", str(HERE / "with_object.npz")])
    assert result.exit_code == 0 and "meta" in result.output and "object" in result.output


# ----------------------------------------------------------------------------- Python 2 headers


@pytest.mark.parametrize("name", ["python2_v1.npy", "python2_v2.npy", "python2_record.npy"])
def test_python2_long_suffixes_are_read_as_numpy_reads_them(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numpy asks to save the file again
        ref = np.load(HERE / name)
    assert (HERE / name).read_bytes().count(b"L,") >= 1
    got = wio.load(HERE / name)[name[:-4]]
    assert got.dtype == ref.dtype and got.shape == ref.shape and got.tobytes() == ref.tobytes()


def test_python2_suffixes_in_a_version_3_header_are_refused_as_numpy_refuses_them():
    with pytest.raises(ValueError, match="Cannot parse header"):
        np.load(HERE / "python2_v3.npy")
    with pytest.raises(CorruptFileError, match=r"\.npy header is not a Python literal \(SyntaxError"):
        wio.open(HERE / "python2_v3.npy")


def test_a_python2_header_over_lines_with_other_line_breaks_reads_as_numpy_reads_it(tmp_path):
    header = "{'descr': [('a\x85b', '<i4')],\x0c\n 'fortran_order': False,\n 'shape': (2L,), }".encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    path = tmp_path / "x.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x01\0\0\0\x02\0\0\0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numpy asks to save the file again
        ref = np.load(path)
    got = wio.load(path)["x"]
    assert got.dtype == ref.dtype and got.tolist() == ref.tolist() == [(1,), (2,)]


@pytest.mark.parametrize("text,expected", [
    ("{'shape': (2L, 3L), }", "{'shape': (2, 3), }"),
    ("{'shape': (0x1FL,)}", "{'shape': (0x1F,)}"),
    ("{'descr': '2L', 'shape': (2L,)}", "{'descr': '2L', 'shape': (2,)}"),  # not inside strings
    ("{'shape': (2 L,)}", "{'shape': (2 ,)}"),  # numpy drops a separate L too
    ("{'shape': (2LL,)}", None), ("{'shape': (xL,)}", None), ("{'shape': (2l,)}", None), ("(", None),
    # lines are tokenize's (\n only): \x0c, \x85, \u2028 … before a later line's L move no cut
    ("{'descr': [('a\x85b', '<i4')],\n 'shape': (2L,)}", "{'descr': [('a\x85b', '<i4')],\n 'shape': (2,)}"),
    ("{'descr': '<i4',\x0c\n 'shape': (2L, 3L)}", "{'descr': '<i4',\x0c\n 'shape': (2, 3)}"),
])
def test_strip_long_suffixes_follows_numpys_rule(text, expected):
    assert strip_long_suffixes(text) == expected


# ----------------------------------------------------------------------------- downstream


def test_casts_and_frameworks_refuse_what_is_not_numbers():
    with wio.open(HERE / "dtypes.npz") as ckpt:
        assert ckpt["str"].to("numpy").dtype == np.dtype("<U3")  # numpy keeps them, as stored
        with pytest.raises(UnsupportedDTypeError, match=r"tensor 'bytes': S3 elements are not numbers and cannot be "
                                                        r"cast to float32"):
            ckpt["bytes"].to("numpy", dtype="float32")
        with pytest.raises(UnsupportedDTypeError, match="elements are not numbers: they have no statistics"):
            tensor_stats(ckpt["datetime"])
        diff = compare(ckpt["nested"], ckpt["nested"])
        assert diff.equal and diff.kinds[0].startswith("[('pos'")
        assert compare(ckpt["bytes"], ckpt["bytes"]).equal


def test_torch_refuses_records_with_a_weightio_error():
    pytest.importorskip("torch")
    with wio.open(HERE / "goog_like.npz") as ckpt, pytest.raises(
            UnsupportedDTypeError, match=r"tensor 'price_data': \[\('date', '<M8\[D\]'\).* elements are not numbers "
                                         r"and cannot be placed on torch:cpu"):
        ckpt["price_data"].to("torch")


@pytest.mark.parametrize("suffix", [".safetensors", ".gguf"])
def test_convert_to_tensor_formats_names_the_member(tmp_path, suffix):
    out = tmp_path / f"out{suffix}"
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'format': S3 elements are not numbers: only .npz and "
                                                    r".npy store them"):
        convert(HERE / "sparse_csr.npz", out)
    assert not out.exists()


def test_convert_npz_to_npz_carries_them_exactly(tmp_path):
    out = tmp_path / "copy.npz"
    convert(HERE / "dtypes.npz", out)
    source, copied = _stored_members(HERE / "dtypes.npz"), _stored_members(out)
    for name, arr in source.items():
        assert copied[name].dtype.descr == arr.dtype.descr and copied[name].shape == arr.shape, name
        assert copied[name].tobytes() == arr.tobytes(order="C"), name  # C order: fortran_record is rewritten
    for name in ("str_be", "nested"):  # each member's header is numpy.save's, byte for byte
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(source[name]))
        with zipfile.ZipFile(out) as zf:
            assert zf.read(f"{name}.npy") == buf.getvalue()


def test_save_of_numpy_records_and_refusals(tmp_path):
    prices = np.load(HERE / "goog_like.npz")["price_data"]
    wio.save({"price_data": prices}, tmp_path / "p.npy")
    assert (tmp_path / "p.npy").read_bytes() == _np_save(prices)
    with pytest.raises(UnsupportedDTypeError, match="tensor 'p': .* elements are not numbers"):
        wio.save({"p": prices}, tmp_path / "p.safetensors")
    with pytest.raises(UnsupportedDTypeError, match="tensor 'o': dtype object cannot be stored as a tensor: it "
                                                    "holds Python objects"):
        wio.save({"o": np.array([None], dtype=object)}, tmp_path / "o.npz")


def _np_save(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_cli_tables_and_show_name_the_dtypes():
    runner = CliRunner()
    out = runner.invoke(main, ["inspect", str(HERE / "dtypes.npz")]).output
    for shown in ("S3", "U3", ">U3", "datetime64[D]", ">datetime64[ns]", "timedelta64[ms]", "V5",
                  "[('flag', '|u1'), ('', '|V7'), ('value', '<f8')"):
        assert shown in out, shown
    result = runner.invoke(main, ["show", str(HERE / "dtypes.npz"), "str", "-n", "2"])
    assert result.exit_code == 0 and "(not numbers: no statistics)" in result.output
    assert "values    ['héé', 'x']  (first 2 of 6)" in result.output
    result = runner.invoke(main, ["diff", str(HERE / "dtypes.npz"), str(HERE / "dtypes_compressed.npz")])
    assert result.exit_code == 0 and "equal: 11 of 11" in result.output


def test_show_quotes_text_values_so_that_data_cannot_fake_output_lines(tmp_path):
    np.savez(tmp_path / "t.npz", s=np.array(["a\nweightio: fake line\x1b[2J", "b"]), b=np.array([b"x\ny"]))
    for name, values in (("s", "['a\\nweightio: fake line\\x1b[2J', 'b']"), ("b", "[b'x\\ny']")):
        result = CliRunner().invoke(main, ["show", str(tmp_path / "t.npz"), name])
        assert result.exit_code == 0 and result.output.endswith(f"  values    {values}\n"), result.output
        assert len(result.output.splitlines()) == 6


def test_varbuilder_keeps_them_and_refuses_casts():
    vb = wio.VarBuilder.from_path(HERE / "dtypes.npz", dtype="float16")
    assert vb.get((3,), "bytes").tolist() == [b"csr", b"co", b""]  # like integers, they keep their type
    assert vb.get((4,), "number").dtype == np.float16


def test_str_data_beyond_unicode_is_a_corrupt_file_error(write):
    # found by tests/fuzz (npy harness): numpy raises SystemError making a str of a code point past U+10FFFF
    path = write("bad.npy", _np_save(np.array(["abc", "d"], ">U3"))[:-12] + b"\x62\x00\x00\x64" + bytes(8))
    with wio.open(path) as ckpt:
        assert ckpt["bad"].numpy().dtype == np.dtype(">U3")  # the view itself is what numpy.load returns
        with pytest.raises(CorruptFileError, match=r"tensor 'bad': holds a character beyond U\+10FFFF"):
            ckpt["bad"][-1]
        with pytest.raises(CorruptFileError, match=r"tensor 'bad': holds a character beyond U\+10FFFF"):
            first_values(ckpt["bad"], 2)
    result = CliRunner().invoke(main, ["show", str(path), "bad"])
    assert result.exit_code == 1 and "holds a character beyond U+10FFFF" in result.output


@pytest.mark.parametrize("descr", [
    [("a", "<f4"), ("", "|V8", (2,))],  # padding given as a sub-array of void: 16 bytes, no field
    [("a", "<f4"), ("", "|V4", 1)],
    [("", [("x", "<f4")], (2,)), ("a", "<i2")],  # a sub-array of a record named '' is padding to numpy too
    [("", [("x", "<f4")]), ("a", "<i2")],  # a record named '' without a shape is a field
    [("a", "|u1"), ("", "|V7"), ("b", "<f8")],
])
def test_padding_is_what_numpy_load_makes_of_it(tmp_path, descr):
    expected = np.lib.format.descr_to_dtype(descr)
    path = tmp_path / "p.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": (3,)})
        f.write(bytes(range(3 * expected.itemsize)))
    got = wio.open(path)["p"].numpy()
    _same(got, np.load(path))
    assert got.tobytes() == np.load(path).tobytes()
