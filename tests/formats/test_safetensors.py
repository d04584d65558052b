"""safetensors reader and writer: golden files, differential tests, round trips, hostile headers."""

from __future__ import annotations

import gc
import json
import mmap
import os
import subprocess
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest

import weightio as wio
from weightio.errors import (
    CorruptFileError,
    FormatError,
    UnsupportedDTypeError,
    UsageError,
    WeightioWarning,
    WriteError,
)
from weightio.formats import safetensors as module
from weightio.formats.safetensors import SafetensorsReader
from weightio.view import TensorView

from ..conftest import FIXTURES, safetensors_bytes

safetensors_numpy = pytest.importorskip("safetensors.numpy")

F32_2x2 = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
DATA_2x2 = np.arange(4, dtype="<f4").tobytes()


def _mapping_of(arr: np.ndarray) -> object:
    """Follow an array's .base chain to the object that owns its memory."""
    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


# ----------------------------------------------------------------------------- reading


def test_numpy_is_a_read_only_view_of_the_file_mapping():
    with wio.open(FIXTURES / "numpy.safetensors") as ckpt:
        weight = ckpt["weight"].numpy()
        mapping = ckpt.readers[0].file.data
        assert np.shares_memory(weight, mapping)
        assert isinstance(_mapping_of(weight), mmap.mmap)
        assert weight.flags.writeable is False
        with pytest.raises(ValueError, match="read-only"):
            weight[0, 0] = 1.0
        np.testing.assert_array_equal(weight, np.arange(20, dtype=np.float32).reshape(4, 5))


def test_slices_are_views_and_read_only_the_selection():
    with wio.open(FIXTURES / "numpy.safetensors") as ckpt:
        v = ckpt["weight"]
        rows, cols = v[1:3], v[:, 2:4]
        np.testing.assert_array_equal(rows, [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
        np.testing.assert_array_equal(cols, np.arange(20, dtype=np.float32).reshape(4, 5)[:, 2:4])
        mapping = ckpt.readers[0].file.data
        assert np.shares_memory(rows, mapping) and np.shares_memory(cols, mapping)
        start = rows.__array_interface__["data"][0] - mapping.__array_interface__["data"][0]
        assert start == v.info.offset + 5 * 4  # row 1 of a float32 [4, 5] tensor
        assert v[2, 3] == 13.0


def test_every_dtype_reads_as_torch_wrote_it():
    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        assert ckpt.metadata == {"format": "pt", "note": "fixture"}
        assert ckpt["bf16"].dtype == np.dtype(ml_dtypes.bfloat16)
        assert ckpt["f8_e4m3"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
        assert ckpt["f8_e8m0"].dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
        base = np.arange(-12, 12, dtype=np.float32) / 4
        np.testing.assert_array_equal(ckpt["bf16"].numpy().astype(np.float32), base.reshape(6, 4))
        e5m2 = base.astype(ml_dtypes.float8_e5m2)  # torch and ml_dtypes both round to nearest even
        assert ckpt["f8_e5m2"].numpy().tobytes() == e5m2.tobytes()
        np.testing.assert_array_equal(ckpt["f8_e8m0"].numpy().astype(np.float32), [0.25, 0.5, 1, 2, 4, 8])
        np.testing.assert_array_equal(ckpt["c64"].numpy(), base[:6] + 1j * base[6:12])
        np.testing.assert_array_equal(ckpt["u64"].numpy(), np.arange(12, dtype=np.uint64))
        assert ckpt["scalar"].shape == () and ckpt["scalar"].numpy() == 3.5
        assert ckpt["empty"].shape == (0, 5) and ckpt["empty"].numpy().shape == (0, 5)
        assert ckpt["num_batches_tracked"].numpy().dtype == np.int64


def test_packed_fp4_lists_its_shape_and_gives_raw_bytes():
    with wio.open(FIXTURES / "packed_fp4.safetensors") as ckpt:
        v = ckpt["fp4"]
        assert v.shape == (8,) and v.nbytes == 4 and v.dtype == np.dtype(ml_dtypes.float4_e2m1fn)
        assert v.raw().tobytes() == bytes([0x21, 0x43, 0x65, 0x87])
        with pytest.raises(UnsupportedDTypeError, match=r"tensor 'fp4': dtype F4 packs 2 elements per 1 byte"):
            v.numpy()


def test_reads_files_written_by_the_reference_for_every_dtype(tmp_path):
    arrays = _all_dtype_arrays()
    path = tmp_path / "ref.safetensors"
    safetensors_numpy.save_file(arrays, str(path))
    loaded = wio.load(path)
    assert list(loaded) == sorted(arrays, key=lambda k: (-_rank(arrays[k]), k))
    for name, arr in arrays.items():
        assert loaded[name].dtype == arr.dtype and loaded[name].shape == arr.shape
        assert loaded[name].tobytes() == arr.tobytes()


def test_leading_whitespace_and_misaligned_data_are_read(write):
    header = {"u8": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "f64": {"dtype": "F64", "shape": [1], "data_offsets": [1, 9]}}
    text = "  " + json.dumps(header)
    path = write("odd.safetensors", safetensors_bytes(text, b"\x07" + np.array([2.5]).tobytes()))
    with wio.open(path) as ckpt:
        f64 = ckpt["f64"].numpy()
        assert f64.tolist() == [2.5]
        assert f64.flags.aligned is False  # zero-copy even though misaligned; numpy reads it correctly
        assert np.shares_memory(f64, ckpt.readers[0].file.data)


# ----------------------------------------------------------------------------- writing


def _all_dtype_arrays() -> dict[str, np.ndarray]:
    """One array per dtype the reference numpy writer handles (it has no fp8: torch-written fp8 is in
    fixtures/dtypes.safetensors)."""
    r = np.arange(-6, 6)
    return {
        "bool": r % 3 == 0,
        "u8": (r + 6).astype(np.uint8), "i8": r.astype(np.int8),
        "u16": (r + 6).astype(np.uint16), "i16": r.astype(np.int16).reshape(3, 4),
        "u32": (r + 6).astype(np.uint32), "i32": r.astype(np.int32).reshape(2, 2, 3),
        "u64": (r + 6).astype(np.uint64), "i64": r.astype(np.int64),
        "f16": (r / 4).astype(np.float16), "bf16": (r / 4).astype(ml_dtypes.bfloat16),
        "f32": (r / 4).astype(np.float32).reshape(4, 3), "f64": r / 4,
        "c64": (r + 1j * r).astype(np.complex64),
        "scalar": np.array(1.5, dtype=np.float32), "empty": np.zeros((0, 3), dtype=np.float32),
        "odd_u8": np.arange(3, dtype=np.uint8),
    }


def _rank(arr: np.ndarray) -> int:
    from weightio.dtypes import by_numpy
    from weightio.formats.safetensors import _WRITE_RANK

    return _WRITE_RANK[by_numpy(arr.dtype).safetensors]


@pytest.mark.parametrize("metadata", [None, {"format": "np"}])
def test_writer_is_byte_identical_to_the_reference(tmp_path, metadata):
    arrays = _all_dtype_arrays()
    ours, ref = tmp_path / "ours.safetensors", tmp_path / "ref.safetensors"
    wio.save(arrays, ours, metadata=metadata)
    safetensors_numpy.save_file(arrays, str(ref), metadata=metadata)
    assert ours.read_bytes() == ref.read_bytes()
    back = safetensors_numpy.load_file(str(ours))
    for name, arr in arrays.items():
        assert back[name].tobytes() == arr.tobytes() and back[name].shape == arr.shape


def test_round_trip_through_views_reproduces_the_file(tmp_path):
    # dtypes.safetensors (written by safetensors.torch) holds every dtype, fp8 and C64 included:
    # reproducing it byte for byte checks our dtype order against the reference writer's.
    for source in (FIXTURES / "dtypes.safetensors", FIXTURES / "tiny-bert" / "model.safetensors",
                   FIXTURES / "packed_fp4.safetensors"):
        out = tmp_path / source.name
        with wio.open(source) as ckpt:
            wio.save({name: ckpt[name] for name in ckpt}, out, metadata=ckpt.metadata or None)
        assert out.read_bytes() == source.read_bytes()
        out.unlink()


def test_writer_streams_one_tensor_at_a_time(tmp_path, monkeypatch):
    live: list[weakref.ref] = []
    real_numpy = TensorView.numpy

    def tracking_numpy(self):
        assert all(ref() is None for ref in live), "a previous tensor is still held by the writer"
        arr = real_numpy(self).copy()  # a private copy, so its lifetime is the writer's doing
        live.append(weakref.ref(arr))
        return arr

    monkeypatch.setattr(TensorView, "numpy", tracking_numpy)
    with wio.open(FIXTURES / "tiny-bert" / "model.safetensors") as ckpt:
        wio.save({name: ckpt[name] for name in ckpt}, tmp_path / "out.safetensors")
        assert len(live) == len(ckpt)


def test_big_endian_arrays_are_written_little_endian(tmp_path):
    wio.save({"x": np.arange(3, dtype=">i4")}, tmp_path / "be.safetensors")
    assert safetensors_numpy.load_file(str(tmp_path / "be.safetensors"))["x"].tolist() == [0, 1, 2]


def test_writer_refuses_what_it_cannot_store(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(FormatError, match=r"metadata maps str to str; 'epoch': 3 is int"):
        wio.save({"a": np.zeros(1)}, path, metadata={"epoch": 3})
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'c': dtype complex128 has no safetensors"):
        wio.save({"c": np.zeros(2, np.complex128)}, path)
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'o': dtype object cannot be stored"):
        wio.save({"o": np.array([None])}, path)
    with pytest.raises(UsageError, match=r"tensor name .a\\x00b. cannot be stored"):
        wio.save({"a\x00b": np.zeros(1)}, path)
    with pytest.raises(UnsupportedDTypeError, match="hold one element per byte"):
        wio.save({"f": np.zeros(2, ml_dtypes.float4_e2m1fn)}, path)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_unless_overwrite(tmp_path):
    path = tmp_path / "x.safetensors"
    wio.save({"a": np.zeros(2, np.float32)}, path)
    before = path.read_bytes()
    with pytest.raises(WriteError, match=r"already exists \(pass overwrite=True to replace it\)"):
        wio.save({"a": np.ones(2, np.float32)}, path)
    assert path.read_bytes() == before
    wio.save({"a": np.ones(2, np.float32)}, path, overwrite=True)
    assert wio.load(path)["a"].tolist() == [1.0, 1.0]


def test_overwriting_a_mapped_file_keeps_live_views_valid(tmp_path):
    path = tmp_path / "x.safetensors"
    wio.save({"a": np.arange(4, dtype=np.float32)}, path)
    with wio.open(path) as ckpt:
        old = ckpt["a"].numpy()
        wio.save({"a": ckpt["a"].numpy() * 2}, path, overwrite=True)  # source is the mapped file itself
        assert old.tolist() == [0, 1, 2, 3]  # the old inode stays mapped, never truncated
    assert wio.load(path)["a"].tolist() == [0, 2, 4, 6]


# ----------------------------------------------------------------------------- hostile input

HOSTILE = [
    ("header length 2^62", safetensors_bytes(b"{}", length=2**62),
     CorruptFileError, "header length 4611686018427387904 exceeds the 100000000-byte limit"),
    ("header length 2^64-1", safetensors_bytes(b"{}", length=2**64 - 1),
     CorruptFileError, "exceeds the 100000000-byte limit"),
    ("header past EOF", safetensors_bytes(b"{}      ", length=1000),
     CorruptFileError, "header length 1000 runs past the end of the file (16 bytes)"),
    ("header not UTF-8", safetensors_bytes(b'{"\xff": 1}'), CorruptFileError, "header is not valid UTF-8"),
    ("header is a list", safetensors_bytes(b"[]"), CorruptFileError, "header must be a JSON object, found list"),
    ("header is a string", safetensors_bytes(b'"abc"'), CorruptFileError, "header must be a JSON object, found str"),
    ("truncated JSON", safetensors_bytes(b'{"a": '), CorruptFileError, "header is not valid JSON"),
    ("trailing NUL padding", safetensors_bytes(b"{}\0\0"), CorruptFileError, "header is not valid JSON: Extra data"),
    ("NaN literal", safetensors_bytes(b'{"__metadata__": {"a": NaN}}'), CorruptFileError,
     "non-standard JSON literal NaN"),
    ("duplicate tensor key, same extent, other dtype",
     safetensors_bytes('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                       '"a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4),
     CorruptFileError, "header has the key 'a' twice"),
    ("duplicate field inside an entry",
     safetensors_bytes('{"a": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4),
     CorruptFileError, "header has the key 'dtype' twice"),
    ("duplicate key whose dropped value holds colons",
     safetensors_bytes('{"__metadata__": {"k": "a:b:c", "k": "d"}}'), CorruptFileError, "header has the key 'k' twice"),
    ("bool dim equal to 1", safetensors_bytes({"a": {"dtype": "F32", "shape": [True, 1], "data_offsets": [0, 4]}},
                                              b"\0" * 4), CorruptFileError, "found [True, 1]"),
    ("duplicate metadata key", safetensors_bytes('{"__metadata__": {"k": "1", "k": "2"}}'),
     CorruptFileError, "header has the key 'k' twice"),
    ("metadata value int", safetensors_bytes({"__metadata__": {"k": 1}}), CorruptFileError,
     "__metadata__['k'] must be a string, found int 1"),
    ("metadata value null", safetensors_bytes({"__metadata__": {"k": None}}), CorruptFileError,
     "__metadata__['k'] must be a string, found NoneType"),
    ("metadata a list", safetensors_bytes({"__metadata__": ["k"]}), CorruptFileError,
     "__metadata__ must be an object of strings, found list"),
    ("unknown dtype", safetensors_bytes({"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16),
     UnsupportedDTypeError, "tensor 'a': unknown safetensors dtype 'F128'"),
    ("lowercase dtype", safetensors_bytes({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
     UnsupportedDTypeError, "unknown safetensors dtype 'f32'"),
    ("dtype not a string", safetensors_bytes({"a": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
     CorruptFileError, "tensor 'a': dtype must be a string, found 5"),
    ("negative dim", safetensors_bytes({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
     CorruptFileError, "shape must be a list of at most 64 non-negative integers, found [-1]"),
    ("float dim", safetensors_bytes({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}, b"\0" * 4),
     CorruptFileError, "found [1.5]"),
    ("bool dim", safetensors_bytes({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4),
     CorruptFileError, "found [True]"),
    ("string dim", safetensors_bytes({"a": {"dtype": "F32", "shape": ["3"], "data_offsets": [0, 4]}}, b"\0" * 4),
     CorruptFileError, "found ['3']"),
    ("65 dims", safetensors_bytes({"a": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}, b"\0" * 4),
     CorruptFileError, "shape must be a list of at most 64"),
    ("shape overflowing u64", safetensors_bytes({"a": {"dtype": "F32", "shape": [2**62, 8], "data_offsets": [0, 0]}}),
     CorruptFileError, "data_offsets [0, 0] span 0 bytes but F32 shape [4611686018427387904, 8] needs "
                       "147573952589676412928"),
    ("one offset", safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4),
     CorruptFileError, "data_offsets must be two non-negative integers, found [0]"),
    ("three offsets", safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, b"\0" * 4),
     CorruptFileError, "found [0, 4, 8]"),
    ("negative offset", safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, b"\0" * 4),
     CorruptFileError, "found [-4, 0]"),
    ("float offset", safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}}, b"\0" * 4),
     CorruptFileError, "found [0, 4.0]"),
    ("offset 2^64", safetensors_bytes({"a": {"dtype": "U8", "shape": [0], "data_offsets": [2**64, 2**64]}}),
     CorruptFileError, "data_offsets begin 18446744073709551616 leaves a hole"),
    ("end before begin", safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4),
     CorruptFileError, "data_offsets end 0 is before begin 4"),
    ("size mismatch", safetensors_bytes({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
     CorruptFileError, "data_offsets [0, 8] span 8 bytes but F32 shape [3] needs 12"),
    ("F4 odd count", safetensors_bytes({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0" * 2),
     CorruptFileError, "F4 shape [3] is 12 bits, not a whole number of bytes"),
    ("hole between tensors", safetensors_bytes(
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
         "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
     CorruptFileError, "tensor 'b': data_offsets begin 8 leaves a hole of 4 bytes (expected 4, after 'a')"),
    ("overlapping tensors", safetensors_bytes(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
     CorruptFileError, "tensor 'b': data_offsets begin 4 overlaps the tensor before it"),
    ("first tensor not at 0", safetensors_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
                                                b"\0" * 8),
     CorruptFileError, "leaves a hole of 4 bytes (expected 0, at the start of the data section)"),
    ("trailing bytes (polyglot)", safetensors_bytes({"a": F32_2x2}, DATA_2x2 + b"PK\x05\x06" + b"\0" * 4),
     CorruptFileError, "8 bytes after the last tensor belong to no tensor"),
    ("truncated data", safetensors_bytes({"a": F32_2x2}, DATA_2x2[:8]),
     CorruptFileError, "tensors need 16 data bytes but the file holds 8 (truncated?)"),
    ("empty name", safetensors_bytes({"": F32_2x2}, DATA_2x2), CorruptFileError, "invalid tensor name ''"),
    ("NUL in name", safetensors_bytes({"a\x00b": F32_2x2}, DATA_2x2), CorruptFileError,
     "invalid tensor name 'a\\x00b'"),
    ("entry not an object", safetensors_bytes({"a": [1, 2]}), CorruptFileError,
     "tensor 'a': entry must be an object, found list"),
    ("entry lacks offsets", safetensors_bytes({"a": {"dtype": "F32", "shape": [1]}}), CorruptFileError,
     "tensor 'a': entry lacks data_offsets"),
    # found by tests/fuzz (the GGUF harness; the same hole here): numpy() raised a bare ValueError
    ("empty tensor numpy cannot shape", safetensors_bytes({"a": {"dtype": "F32", "shape": [0, 2**62],
                                                                 "data_offsets": [0, 0]}}),
     CorruptFileError, "tensor 'a': shape [0, 4611686018427387904] is too large for numpy"),
    ("empty tensor with a 40-digit dim", safetensors_bytes({"a": {"dtype": "U8", "shape": [10**40, 0],
                                                                  "data_offsets": [0, 0]}}),
     CorruptFileError, "the non-zero dimensions times the itemsize reach 2^63 bytes"),
]


@pytest.mark.parametrize("content,error,message", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_headers_raise_clear_errors(write, content, error, message):
    path = write("bad.safetensors", content)
    with pytest.raises(error) as info:
        wio.open(path)
    assert message in str(info.value)
    assert str(info.value).startswith(str(path) + ": ")
    assert info.value.path == str(path)


def test_the_reader_alone_reports_a_file_too_short_for_the_length(write):
    path = write("short.safetensors", b"\x02\0\0\0\0")
    with pytest.raises(CorruptFileError, match="file is 5 bytes; a safetensors file starts with an 8-byte"):
        SafetensorsReader(path)


def test_unknown_tensor_fields_are_ignored_with_a_warning(write):
    header = {"a": {**F32_2x2, "evil": 1}}
    path = write("extra.safetensors", safetensors_bytes(header, DATA_2x2))
    with pytest.warns(WeightioWarning, match=r"tensor 'a': ignoring unknown fields evil"):
        ckpt = wio.open(path)
    with ckpt:
        assert ckpt["a"].numpy().tolist() == [[0, 1], [2, 3]]


def test_names_with_colons_and_escapes_are_not_mistaken_for_duplicates(write):
    header = ('{"__metadata__": {"time": "12:30:00", "a:b": "c"}, "x:y": {"dtype": "U8", "shape": [1], '
              '"data_offsets": [0, 1]}, "\\u0061": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}')
    path = write("colons.safetensors", safetensors_bytes(header, b"\x01\x02"))
    with wio.open(path) as ckpt:
        assert sorted(ckpt) == ["a", "x:y"] and ckpt.metadata == {"time": "12:30:00", "a:b": "c"}
        assert ckpt["a"].numpy().tolist() == [2]


def test_metadata_null_means_no_metadata(write):
    path = write("null.safetensors", safetensors_bytes({"__metadata__": None, "a": F32_2x2}, DATA_2x2))
    with wio.open(path) as ckpt:
        assert ckpt.metadata == {} and list(ckpt) == ["a"]


# ----------------------------------------------------------------------------- fast path == exact path

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_NAMES = st.text(alphabet=list('ab:."\\é\x00'), max_size=3)
_DIMS = st.lists(st.one_of(st.integers(0, 3), st.booleans(), st.just(1.0), st.just(-1)), max_size=3)
_ENTRY = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "U8", "BF16", "F4", "X9", 5]),
    "shape": st.one_of(_DIMS, st.just("3")),
    "data_offsets": st.one_of(st.tuples(st.integers(0, 40), st.integers(0, 40)).map(list), st.just([0])),
}, optional={"extra": st.just(1)})


# The ways a header can be read (`module._only_way`), every one available here: the C path where it
# was built, msgspec's typed decode, the standard library's parse, and the exact path.
WAYS = module.WAYS if module._c_header is not None else module.WAYS[1:]
_C_HEADER = module._c_header


def _outcome(path, way: str):
    """What reading `path` gives the `way` (one of `WAYS`): its tensors (with their shapes' element
    type) and metadata, or its refusal word for word."""
    import warnings

    from weightio.errors import WeightioError

    with module._only_way(way), warnings.catch_warnings():
        warnings.simplefilter("ignore", WeightioWarning)
        try:
            reader = SafetensorsReader(path)
        except WeightioError as e:
            return f"{type(e).__name__}: {e}"  # the same refusal, word for word
    try:
        return {k: (tuple(v), type(v.shape[0]).__name__ if v.shape else "") for k, v in reader.tensors.items()}, \
            list(reader.tensors), reader.metadata
    finally:
        reader.close()


def _agreed(path):
    """The one outcome every way of `WAYS` gives `path` (an AssertionError names the ways that differ)."""
    outcomes = {way: _outcome(path, way) for way in WAYS}
    for way, outcome in outcomes.items():
        assert outcome == outcomes["exact"], (way, outcome, "exact", outcomes["exact"])
    return outcomes["exact"]


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.tuples(_NAMES, _ENTRY), max_size=4),
       metadata=st.one_of(st.none(), st.dictionaries(_NAMES, st.one_of(_NAMES, st.integers()), max_size=2)),
       duplicate=st.booleans(), data_len=st.integers(0, 48), spaces=st.booleans())
def test_fast_and_exact_header_paths_agree(tmp_path_factory, entries, metadata, duplicate, data_len, spaces):
    sep = (", ", ": ") if spaces else (",", ":")
    members = [json.dumps(name) + sep[1] + json.dumps(entry, separators=sep) for name, entry in entries]
    if metadata is not None:
        members.insert(0, '"__metadata__"' + sep[1] + json.dumps(metadata, separators=sep))
    if duplicate and members:
        members.append(members[0])
    path = tmp_path_factory.mktemp("h") / "x.safetensors"
    path.write_bytes(safetensors_bytes("{" + sep[0].join(members) + "}", bytes(range(data_len))))
    _agreed(path)


_BITS = {"F32": 32, "U8": 8, "BF16": 16, "F4": 4}


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(st.tuples(_NAMES, st.sampled_from(sorted(_BITS)), st.lists(st.integers(0, 3), max_size=3)),
                      max_size=4, unique_by=lambda s: s[0]),
       mutation=st.sampled_from(["none", "bool", "float", "extra", "duplicate", "dtype", "offset", "escape"]),
       spaces=st.booleans())
def test_fast_and_exact_paths_agree_on_mostly_valid_headers(tmp_path_factory, specs, mutation, spaces):
    header, offset = {}, 0
    for name, code, shape in specs:
        size = (int(np.prod(shape)) * _BITS[code] + 7) // 8
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(", ", ": ") if spaces else (",", ":"))
    if specs and mutation != "none":
        first = json.dumps(specs[0][0])
        text = {
            "bool": text.replace('"shape": [', '"shape": [true, ', 1).replace('"shape":[', '"shape":[true,', 1),
            "float": text.replace('"data_offsets": [0', '"data_offsets": [0.0', 1).replace(
                '"data_offsets":[0', '"data_offsets":[0.0', 1),
            "extra": text.replace('"dtype"', '"x": 1, "dtype"', 1),
            "duplicate": text[:-1] + ", " + text[1:],
            "dtype": text.replace('"dtype": "', '"dtype": "Q', 1).replace('"dtype":"', '"dtype":"Q', 1),
            "offset": text.replace("[0,", "[1,", 1).replace("[0, ", "[1, ", 1),
            "escape": text.replace(first, '"\\u0078' + first[1:], 1),
        }[mutation]
    path = tmp_path_factory.mktemp("h") / "x.safetensors"
    path.write_bytes(safetensors_bytes(text, b"\x01" * offset))
    fast = _agreed(path)
    if mutation == "none" and not any("\x00" in n or not n for n, _, _ in specs) and not any(
            c == "F4" and int(np.prod(s)) % 2 for _, c, s in specs):
        assert isinstance(fast, tuple) and sorted(fast[0]) == sorted(n for n, _, _ in specs)


_META_KEYS = st.sampled_from(["format", "dtype", "shape", "data_offsets", "a}", "x:y", "__metadata__", ""])
_META_VALUES = st.one_of(st.text(alphabet=list('a}{:"\\,'), max_size=4), st.integers(-2, 2), st.none(),
                         st.just([1]), st.just({"k": "v"}))


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(st.tuples(_NAMES, st.sampled_from(sorted(_BITS)), st.lists(st.integers(0, 3), max_size=3)),
                      max_size=3, unique_by=lambda s: s[0]),
       metadata=st.one_of(st.none(), st.just("null"), st.dictionaries(_META_KEYS, _META_VALUES, max_size=3)),
       where=st.sampled_from(["first", "last", "twice"]), spaces=st.booleans(),
       number=st.sampled_from(["none", "huge", "negative", "rank", "missing", "nested"]))
def test_fast_and_exact_paths_agree_on_metadata_and_numbers(tmp_path_factory, specs, metadata, where, spaces,
                                                            number):
    """What the typed decoder (msgspec) sees differently from the standard parser: where the metadata
    is, which keys and values it has (entry field names, a '}' or ':' in its strings, non-strings,
    null), integers beyond 64 bits or negative, a rank over 64, a missing field, a nested object."""
    sep = (", ", ": ") if spaces else (",", ":")
    members, offset = [], 0
    for name, code, shape in specs:
        size = (int(np.prod(shape)) * _BITS[code] + 7) // 8
        entry = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
        members.append(json.dumps(name) + sep[1] + json.dumps(entry, separators=sep))
    if members and number != "none":
        members[0] = {
            "huge": members[0].replace("[0,", f"[{2**64},", 1).replace("[0, ", f"[{2**64}, ", 1),
            "negative": members[0].replace("[0,", "[-0,", 1).replace("[0, ", "[-1, ", 1),
            "rank": members[0].replace('"shape":[', '"shape":[' + "1," * 64, 1).replace(
                '"shape": [', '"shape": [' + "1, " * 64, 1),
            "missing": members[0].replace('"dtype"', '"type"', 1),
            "nested": members[0].replace('"shape"', '"x": {"shape": [1]}, "shape"', 1),
        }[number]
    if metadata is not None:
        meta = '"__metadata__"' + sep[1] + (metadata if metadata == "null" else json.dumps(metadata, separators=sep))
        members = [meta] + members if where == "first" else members + [meta] if where == "last" else \
            [meta] + members + [meta]
    path = tmp_path_factory.mktemp("h") / "x.safetensors"
    path.write_bytes(safetensors_bytes("{" + sep[0].join(members) + "}", b"\x01" * offset))
    _agreed(path)


def test_a_large_header_is_validated_by_msgspec_with_the_same_result(tmp_path, monkeypatch):
    msgspec = pytest.importorskip("msgspec")
    from weightio import _json
    from weightio.formats import safetensors as module

    tensors = {f"model.layers.{i}.mlp.w": np.full((3, 2), i, np.float32) for i in range(14_000)}
    path = tmp_path / "big.safetensors"
    wio.save(tensors, path, metadata={"format": "pt", "note": "a}b:c"})
    assert (path.stat().st_size - 14_000 * 24) >= _json.FAST_FROM  # a header of more than 1 MiB
    taken, real = [], module._typed_entries
    monkeypatch.setattr(module, "_c_header", None)  # (the C path, where built, would read it first: below)
    monkeypatch.setattr(_json, "_msgspec", None)
    monkeypatch.setattr(module, "_typed_entries", lambda *a: taken.append(1) or real(*a))
    monkeypatch.setattr(module.SafetensorsReader, "_strict_entries", lambda *a: pytest.fail("the exact path was taken"))
    with wio.open(path) as ckpt:
        assert taken == [1] and _json._msgspec is msgspec and len(ckpt) == 14_000
        assert ckpt.metadata == {"format": "pt", "note": "a}b:c"}
        last = ckpt["model.layers.13999.mlp.w"]
        assert last.shape == (3, 2) and last.numpy().tolist() == [[13999.0] * 2] * 3
        fast = {k: tuple(v) for k, v in ckpt.readers[0].tensors.items()}
    monkeypatch.undo()
    monkeypatch.setattr(module, "_c_header", None)
    monkeypatch.setattr(_json, "_msgspec", False)
    with wio.open(path) as ckpt:
        assert {k: tuple(v) for k, v in ckpt.readers[0].tensors.items()} == fast


needs_c_header = pytest.mark.skipif(_C_HEADER is None, reason="weightio._speedups is not built here")


@needs_c_header
def test_a_plain_header_is_read_in_c_with_the_same_result(tmp_path, monkeypatch):
    tensors = {f"model.layers.{i}.mlp.é": np.full((3, 2), i, np.float32) for i in range(3000)}
    tensors["scalar"] = np.array(7, np.int64)
    path = tmp_path / "big.safetensors"
    wio.save(tensors, path, metadata={"format": "pt", "note": "a}b:c"})
    monkeypatch.setattr(SafetensorsReader, "_plain", lambda *a: pytest.fail("the Python paths were taken"))
    with wio.open(path) as ckpt:
        infos = ckpt.readers[0].tensors
        assert len(ckpt) == 3001 and ckpt.metadata == {"format": "pt", "note": "a}b:c"}
        assert ckpt["model.layers.2999.mlp.é"].numpy().tolist() == [[2999.0] * 2] * 3
        assert ckpt["scalar"].shape == () and ckpt["scalar"].numpy() == 7
        first = infos["model.layers.0.mlp.é"]
        assert type(first) is module.TensorInfo and first.dtype is module._PLAIN["F32"][1]
        assert type(first.shape) is tuple and all(type(d) is int for d in first.shape)
        assert hash(first) == hash(tuple(first)) and first == tuple(first)  # (a tuple's hash, as Python builds it)
        assert not gc.is_tracked(first) and not gc.is_tracked(first.shape)  # (nothing in them refers back)
        native = {k: tuple(v) for k, v in infos.items()}, list(infos), dict(ckpt.metadata)
    monkeypatch.undo()
    monkeypatch.setattr(module, "_c_header", None)
    with wio.open(path) as ckpt:
        infos = ckpt.readers[0].tensors
        assert ({k: tuple(v) for k, v in infos.items()}, list(infos), dict(ckpt.metadata)) == native


# Headers at the edges of what the C path reads (True) or hands to the Python paths (False); every way
# must agree on each (`_agreed`), with 4 bytes of data. `@E`: a valid entry of 4 bytes.
_ENTRY_TEXT = '"dtype":"F32","shape":[1],"data_offsets":[0,4]'
_EDGES = [(text.replace("@E", _ENTRY_TEXT), plain) for text, plain in [
    ('{"a":{@E}}', True),
    (' \t\r\n{ "a" : { "shape" : [ 1 ] , "data_offsets" : [ 0 , 4 ] , "dtype" : "F32" } }        ', True),
    ('{"__metadata__":{},"a":{@E}}', True),
    ('{"a":{@E},"__metadata__":{"k":"v","é":"ü"}}', True),
    ('{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[3],"data_offsets":[1,4]}}', True),
    ('{"b":{"dtype":"U8","shape":[3],"data_offsets":[1,4]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', True),
    ('{"a":{"dtype":"U8","shape":[' + "1," * 63 + '4],"data_offsets":[0,4]}}', True),
    ('{"a":{"dtype":"U8","shape":[' + "1," * 64 + '4],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}', False),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4e0]}}', False),
    ('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0000000000000000000,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}}', False),
    ('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[1]}}', False),
    ('{"a":{}}', False),
    ('{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}}', False),
    ('{"":{@E}}', False),
    ('{"a\\u0062":{@E}}', False),
    ('{"a\\"":{@E}}', False),
    ('{"a\tb":{@E}}', False),
    ('{"a":{@E},"a":{@E}}', False),
    ('{"__metadata__":{},"__metadata__":{},"a":{@E}}', False),
    ('{"__metadata__":{"k":"v","k":"w"},"a":{@E}}', False),
    ('{"__metadata__":{"k":1},"a":{@E}}', False),
    ('{"__metadata__":null,"a":{@E}}', False),
    ('{"__metadata__":{"k":{"x":"y"}},"a":{@E}}', False),
    ('{"a":{@E},}', False),
    ('{"a":{@E}}}', False),
    ('{"a":{@E}} x', False),
    ('{"a":{@E}', False),
    ('\ufeff{"a":{@E}}', False),
    ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', False),
    ('{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{@E}}', False),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', False),
    ('{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,4]}}', False),
    ('{}', False),
]]


@needs_c_header
@pytest.mark.parametrize("text,plain", _EDGES)
def test_the_c_path_reads_plain_headers_and_leaves_the_rest_to_python(tmp_path, text, plain):
    raw = text.encode()
    found = _C_HEADER(raw, 8 + len(raw), module._PLAIN, module.TensorInfo, 64, 10**6, 65535)
    covered = None if found is None else module._covering(found[0], found[2], found[3], 8 + len(raw), 4)
    assert (covered is not None) == plain
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors_bytes(text, bytes(4)))
    outcome = _agreed(path)
    if plain:  # what it read is what every way reads
        assert {k: tuple(v) for k, v in covered.items()} == {k: t for k, (t, _) in outcome[0].items()}
        assert list(covered) == outcome[1] and found[1] == outcome[2]


_U8 = b'":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'


@needs_c_header  # (invalid UTF-8, an encoded surrogate, a raw NUL, nothing, cut short, é then its bad byte)
@pytest.mark.parametrize("raw", [b'{"\xff' + _U8, b'{"a\xed\xa0\x80' + _U8, b'{"a\x00' + _U8, b"", b"{", b'{"a',
                                 b"\x00", b'{"__metadata__":{"a":"\xc3\xa9","b":"\xe9"},"t' + _U8])
def test_the_c_path_leaves_invalid_text_to_python(raw):
    assert _C_HEADER(raw, 8, module._PLAIN, module.TensorInfo, 64, 10**6, 65535) is None


@needs_c_header
def test_the_c_path_checks_its_arguments():
    class WithDict(tuple):
        pass

    for bad in (dict, WithDict):
        with pytest.raises(ValueError, match="info_type must be a tuple subclass without a __dict__"):
            _C_HEADER(b"{}", 8, module._PLAIN, bad, 64, 1, 1)
    with pytest.raises(ValueError, match="data_start and the limits >= 0"):
        _C_HEADER(b"{}", -1, module._PLAIN, module.TensorInfo, 64, 1, 1)
    with pytest.raises(OverflowError):
        _C_HEADER(b"{}", 2**64 + 5, module._PLAIN, module.TensorInfo, 64, 1, 1)
    with pytest.raises(ValueError, match="max_ndim 0..64"):
        _C_HEADER(b"{}", 8, module._PLAIN, module.TensorInfo, 65, 1, 1)
    with pytest.raises(ValueError, match="the limits >= 0"):
        _C_HEADER(b"{}", 8, module._PLAIN, module.TensorInfo, 64, -1, 1)
    with pytest.raises(TypeError):
        _C_HEADER("{}", 8, module._PLAIN, module.TensorInfo, 64, 10**6, 65535)


def _read_by_c(path, monkeypatch) -> None:
    """`path` is read by the C path itself, not handed to the Python paths (where it is built)."""
    if _C_HEADER is None:
        return
    with module._only_way("native"), monkeypatch.context() as m:
        m.setattr(SafetensorsReader, "_plain", lambda *a: pytest.fail("the C path handed the header to Python"))
        SafetensorsReader(path).close()


_LONG = "ü" * 7 + "x"  # 15 bytes in UTF-8, 8 characters (and longer than "__metadata__", which counts too)
_U8_AT = [{"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(3)]
_NAME_OVER = "the length of name 'üüüüüüüx'…: 15 exceeds the 14-byte limit (limits.name_bytes"
_LIMIT_CASES = {  # header, limits, the refusal's words (None: read)
    "a tensor name at the limit": ({_LONG: _U8_AT[0]}, {"name_bytes": 15}, None),
    "a tensor name a byte over it": ({_LONG: _U8_AT[0]}, {"name_bytes": 14}, _NAME_OVER),
    "a metadata key at the limit": ({"a": _U8_AT[0], "__metadata__": {_LONG: "v"}}, {"name_bytes": 15}, None),
    "a metadata key a byte over it": ({"a": _U8_AT[0], "__metadata__": {_LONG: "v"}}, {"name_bytes": 14}, _NAME_OVER),
    "as many tensors as the limit": ({f"t{i}": e for i, e in enumerate(_U8_AT)} | {"__metadata__": {"f": "pt"}},
                                     {"tensors": 3}, None),
    "a tensor over it": ({f"t{i}": e for i, e in enumerate(_U8_AT)}, {"tensors": 2},
                         "tensor count 3 exceeds the 2 limit (limits.tensors"),
    "the key __metadata__ over it": ({"a": _U8_AT[0], "__metadata__": {"f": "pt"}}, {"name_bytes": 11},
                                     "the length of name '__metadata__'…: 12 exceeds the 11-byte limit"),
    "the key __metadata__ at it": ({"a": _U8_AT[0], "__metadata__": {"f": "pt"}}, {"name_bytes": 12}, None),
}


@pytest.mark.parametrize("header,limits,refusal", _LIMIT_CASES.values(), ids=_LIMIT_CASES)
def test_every_way_holds_a_header_to_the_limits_names_by_their_utf8_length(tmp_path, monkeypatch, header, limits,
                                                                         refusal):
    path = tmp_path / "x.safetensors"
    size = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
    path.write_bytes(safetensors_bytes(json.dumps(header, ensure_ascii=False), bytes(size)))
    with wio.limits.using(**limits):
        outcome = _agreed(path)
        if refusal is None:
            _read_by_c(path, monkeypatch)
    assert isinstance(outcome, tuple) == (refusal is None)
    if refusal is not None:
        assert refusal in outcome


def test_the_c_path_is_built_where_ci_says_it_must_be():
    if not os.environ.get("WEIGHTIO_REQUIRE_SPEEDUPS"):
        pytest.skip("WEIGHTIO_REQUIRE_SPEEDUPS is not set (.ci/run sets it)")
    from weightio import _native

    assert _C_HEADER is not None and _native.speedups.VERSION == _native.VERSION


@pytest.mark.parametrize("value,on", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_weightio_no_speedups_turns_the_c_path_off(value, on):
    code = "from weightio.formats import safetensors as m; print(m._c_header is not None)"
    env = dict(os.environ, WEIGHTIO_NO_SPEEDUPS=value)
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert found == f"{on and _C_HEADER is not None}\n"


@pytest.mark.parametrize("way", WAYS)
def test_a_header_with_two_faults_gets_the_exact_paths_message_whatever_its_size(tmp_path, way):
    # (found by the safetensors_differential fuzz harness: the standard parser's fast path, which
    # has no duplicate-key hook, reported the syntax error further on instead of the duplicate)
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors_bytes('{"w":{"shape":"I64","shape":[],"data_offsets":[0,8]},,}', bytes(8)))
    with module._only_way(way), pytest.raises(CorruptFileError, match=r"x\.safetensors: header has the key "
                                                                           "'shape' twice$"):
        SafetensorsReader(path)
    many = json.dumps({f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(3)})
    path.write_bytes(safetensors_bytes(many[:-1] + ', "t0": {}}', bytes(3)))  # over the limit, and a duplicate
    with module._only_way(way), wio.limits.using(tensors=2), \
            pytest.raises(CorruptFileError, match="header has the key 't0' twice$"):
        SafetensorsReader(path)
    path.write_bytes(safetensors_bytes(many, bytes(3)))  # over the limit only
    with module._only_way(way), wio.limits.using(tensors=2), \
            pytest.raises(CorruptFileError, match=r"x\.safetensors: tensor count 3 exceeds the 2 limit \(limits\."):
        SafetensorsReader(path)
