"""GGUF writer: byte-identical to gguf.GGUFWriter, round trips, quantization on write, streaming, refusals."""

from __future__ import annotations

import weakref

import ml_dtypes
import numpy as np
import pytest

import weightio as wio
from weightio.errors import FormatError, UnsupportedDTypeError, UsageError, WriteError
from weightio.formats import gguf as G
from weightio.quant import quantize
from weightio.view import TensorView
from weightio.writing import write_gguf

from ..conftest import FIXTURES

GGUF = FIXTURES / "gguf"


def _x(shape=(8, 64), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _reference(path, arch, steps, tensors, alignment=None):
    """Write with gguf.GGUFWriter: `steps` are (method, key, value) calls after the architecture."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for method, key, value in steps:
        getattr(writer, method)(key, value)
    for name, (arr, raw_dtype) in tensors.items():
        if raw_dtype is None:
            writer.add_tensor(name, arr)
        else:
            writer.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType[raw_dtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


METADATA_STEPS = [
    ("add_uint8", "a.u8", 3), ("add_int8", "a.i8", -3), ("add_uint16", "a.u16", 300), ("add_int16", "a.i16", -300),
    ("add_uint32", "a.u32", 7), ("add_int32", "a.i32", -7), ("add_float32", "a.f32", 1.5), ("add_bool", "a.bool", True),
    ("add_string", "a.str", "héllo"), ("add_uint64", "a.u64", 2**40), ("add_int64", "a.i64", -(2**40)),
    ("add_float64", "a.f64", 0.1), ("add_array", "arr.int", [1, -2, 3]), ("add_array", "arr.float", [1.5, 2.5]),
    ("add_array", "arr.str", ["a", "bé"]), ("add_array", "arr.bool", [True, False]),
    ("add_array", "arr.nested", [[1, 2], [3]]),
]
# the same keys for weightio: numpy scalars fix the type where the default would differ
OURS = {"general.architecture": "llama", "general.alignment": 64, "a.u8": np.uint8(3), "a.i8": np.int8(-3),
        "a.u16": np.uint16(300), "a.i16": np.int16(-300), "a.u32": 7, "a.i32": -7, "a.f32": 1.5, "a.bool": True,
        "a.str": "héllo", "a.u64": np.uint64(2**40), "a.i64": np.int64(-(2**40)), "a.f64": np.float64(0.1),
        "arr.int": [1, -2, 3], "arr.float": [1.5, 2.5], "arr.str": ["a", "bé"], "arr.bool": [True, False],
        "arr.nested": [[1, 2], [3]]}


def test_byte_identical_to_gguf_writer_for_every_value_and_tensor_type(tmp_path):
    gguf = pytest.importorskip("gguf")
    x = _x()
    plain = {"f32": x, "f16": x.astype(np.float16), "f64": x[0].astype(np.float64),
             "i8": np.arange(-5, 5, dtype=np.int8),
             "i16": np.arange(12, dtype=np.int16).reshape(3, 4), "i32": np.arange(4, dtype=np.int32),
             "i64": np.arange(3, dtype=np.int64), "scalar": np.array(3.5, np.float32),
             "empty": np.zeros((0, 5), np.float32), "four_d": np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)}
    quantized = {name: gguf.quants.quantize(x, gguf.GGMLQuantizationType[name]) for name in ("Q8_0", "Q4_0", "BF16")}
    ref_tensors = {**{k: (v, None) for k, v in plain.items()}, **{k.lower(): (v, k) for k, v in quantized.items()}}
    steps = METADATA_STEPS + [("add_uint32", "general.quantization_version", 2)]
    expected = _reference(tmp_path / "ref.gguf", "llama", steps, ref_tensors, alignment=64)
    ours = tmp_path / "ours.gguf"
    tensors = {**plain, "q8_0": quantize(x, "Q8_0"), "q4_0": quantize(x, "Q4_0"), "bf16": quantize(x, "BF16")}
    write_gguf(tensors, str(ours), {**OURS, "general.quantization_version": 2})
    # gguf-py writes general.alignment where add_custom_alignment is called: first after the architecture
    assert ours.read_bytes() == expected


def test_types_option_quantizes_like_gguf_py(tmp_path):
    gguf = pytest.importorskip("gguf")
    x, norm = _x((4, 96)), np.linspace(0, 1, 96, dtype=np.float32)
    Q = gguf.GGMLQuantizationType
    expected = _reference(tmp_path / "ref.gguf", "llama", [("add_uint32", "general.quantization_version", 2)],
                          {"w": (gguf.quants.quantize(x, Q.Q8_0), "Q8_0"), "norm": (norm, None),
                           "h": (gguf.quants.quantize(x, Q.Q4_0), "Q4_0")})
    out = tmp_path / "ours.gguf"
    write_gguf({"w": x, "norm": norm, "h": x}, str(out), {"general.architecture": "llama"},
            types={"w": "Q8_0", "h": "q4_0"})
    assert out.read_bytes() == expected  # and general.quantization_version was added


def test_one_type_for_every_matrix_keeps_vectors_and_odd_rows(tmp_path):
    out = tmp_path / "q.gguf"
    tensors = {"w": _x((4, 64)), "odd": _x((4, 30)), "bias": _x((64,)),
               "ids": np.arange(64, dtype=np.int32).reshape(2, 32)}
    write_gguf(tensors, str(out), {"general.architecture": "llama"}, types="Q8_0")
    with wio.open(out) as ckpt:
        assert [ckpt[n].ggml_type for n in ckpt] == ["Q8_0", None, None, None]
        assert ckpt["odd"].dtype == np.float32 and ckpt["bias"].dtype == np.float32
        assert ckpt["ids"].dtype == np.int32  # integer tensors are never quantized by a blanket type
        assert ckpt.metadata["general.quantization_version"] == 2
        assert ckpt.readers[0].value_types["general.quantization_version"] == "UINT32"


def test_save_by_suffix_and_read_back_by_both_readers(tmp_path):
    gguf = pytest.importorskip("gguf")
    x = _x()
    path = tmp_path / "model.gguf"
    wio.save({"w": x, "b": x[0].astype(np.float16), "bf": x.astype(ml_dtypes.bfloat16)}, path,
             {"general.architecture": "llama", "llama.block_count": 2, "tokens": ["a", "b"]})
    ref = gguf.GGUFReader(str(path))
    assert [t.name for t in ref.tensors] == ["w", "b", "bf"]
    np.testing.assert_array_equal(ref.tensors[0].data, x)
    assert ref.fields["llama.block_count"].types == [gguf.GGUFValueType.UINT32]
    assert ref.fields["tokens"].contents() == ["a", "b"]
    loaded = wio.load(path)
    np.testing.assert_array_equal(loaded["w"], x)
    assert loaded["bf"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert loaded["bf"].tobytes() == x.astype(ml_dtypes.bfloat16).tobytes()


@pytest.mark.parametrize("name", ["all_types.gguf", "metadata.gguf", "quantized.gguf"])
def test_rewriting_a_gguf_file_from_its_views_reproduces_it(tmp_path, name):
    out = tmp_path / name
    with wio.open(GGUF / name) as ckpt:
        write_gguf(ckpt, str(out), ckpt.metadata, value_types=G.value_types(ckpt))
    assert out.read_bytes() == (GGUF / name).read_bytes()


def test_older_and_big_endian_files_convert_to_v3_little_endian(tmp_path):
    for name in ("v1.gguf", "big_endian.gguf"):
        out = tmp_path / name
        with wio.open(GGUF / name) as ckpt:
            write_gguf(ckpt, str(out), ckpt.metadata, value_types=G.value_types(ckpt))
            with wio.open(out) as back:
                assert back.readers[0].version == 3 and back.readers[0].byteorder == "<"
                added = {"general.quantization_version": 2} if name == "v1.gguf" else {}  # v1 holds a Q8_0 tensor
                assert back.metadata == {**ckpt.metadata, **added}
                for tensor in ckpt:
                    assert back[tensor].numpy().tobytes() == ckpt[tensor].numpy().tobytes()


def test_quantized_view_can_be_requantized(tmp_path):
    out = tmp_path / "re.gguf"
    with wio.open(GGUF / "all_types.gguf") as ckpt:
        write_gguf({"q4_k": ckpt["q4_k"]}, str(out), types={"q4_k": "Q8_0"})
        source = ckpt["q4_k"].numpy()
    with wio.open(out) as back:
        assert back["q4_k"].ggml_type == "Q8_0"
        np.testing.assert_array_equal(back["q4_k"].raw(), quantize(source, "Q8_0").blocks.reshape(-1))


def test_metadata_default_types(tmp_path):
    out = tmp_path / "m.gguf"
    md = {"u": 5, "neg": -5, "big": 2**40, "huge": 2**63, "f": 0.5, "b": False, "s": "x", "ints": [1, 2**40],
          "floats": np.array([1.0, 2.0]), "empty": [], "npbool": np.bool_(True)}
    write_gguf({}, str(out), md)
    with wio.open(out) as ckpt:
        types = ckpt.readers[0].value_types
        assert types == {"u": "UINT32", "neg": "INT32", "big": "INT64", "huge": "UINT64",
                         "f": "FLOAT32", "b": "BOOL", "s": "STRING", "ints": "ARRAY[INT64]", "floats": "ARRAY[FLOAT64]",
                         "empty": "ARRAY[INT32]", "npbool": "BOOL"}
        assert ckpt.metadata["huge"] == 2**63 and ckpt.metadata["ints"] == [1, 2**40]


def test_value_types_force_a_type_and_check_the_range(tmp_path):
    out = tmp_path / "v.gguf"
    write_gguf({}, str(out), {"n": 3, "a": [1, 2]}, value_types={"n": "UINT16", "a": "ARRAY[UINT8]"})
    with wio.open(out) as ckpt:
        assert ckpt.readers[0].value_types == {"n": "UINT16", "a": "ARRAY[UINT8]"}
        assert ckpt.metadata == {"n": 3, "a": [1, 2]}
    with pytest.raises(FormatError, match=r"metadata 'n': 70000 is out of the UINT16 range 0\.\.65535"):
        write_gguf({}, str(tmp_path / "x.gguf"), {"n": 70000}, value_types={"n": "UINT16"})


@pytest.mark.parametrize("metadata,message", [
    ({"x": None}, "metadata 'x': NoneType None has no GGUF metadata type"),
    ({"x": [1, "a"]}, "metadata 'x': array items must all have one type"),
    ({"": 1}, "keys must be non-empty str"),
    ({"x": np.float16(1)}, "metadata 'x': numpy float16 has no GGUF metadata type"),
    ({"general.alignment": 48}, "general.alignment must be a power of two up to 1048576, got 48"),
    ({"x": np.zeros((2, 2))}, "numpy metadata arrays must be 1-D"),
    ({"x": [1, 2.5]}, "array items must all have one type (bool, int, float, str or array), found FLOAT32, INT32"),
])
def test_metadata_that_cannot_be_stored(tmp_path, metadata, message):
    path = tmp_path / "x.gguf"
    with pytest.raises(FormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_gguf({}, str(path), metadata)
    assert not path.exists()


def test_tensors_that_cannot_be_stored(tmp_path):
    path = tmp_path / "x.gguf"
    with pytest.raises(UnsupportedDTypeError, match="tensor 'u': GGUF stores F32, F16, BF16, F64 and I8-I64"):
        write_gguf({"u": np.zeros(3, np.uint8)}, str(path))
    with pytest.raises(UnsupportedDTypeError, match="tensor 'w': rows of 30 elements are not whole Q8_0 blocks"):
        write_gguf({"w": np.zeros((2, 30), np.float32)}, str(path), types={"w": "Q8_0"})
    with pytest.raises(UnsupportedDTypeError, match="converts tensors to F32, F16, BF16, Q8_0, Q4_0, not 'Q4_K'"):
        write_gguf({"w": np.zeros((2, 32), np.float32)}, str(path), types="Q4_K")
    with pytest.raises(UsageError, match="types names tensors that are not written: 'nope'"):
        write_gguf({"w": np.zeros((2, 32), np.float32)}, str(path), types={"nope": "F16"})
    with pytest.raises(UsageError, match="tensor names must be non-empty str, got 3"):
        write_gguf({3: np.zeros(2, np.float32)}, str(path))
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_existing_output_is_kept_unless_overwrite(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"old")
    with pytest.raises(WriteError, match="already exists"):
        wio.save({"a": np.zeros(2, np.float32)}, path)
    assert path.read_bytes() == b"old"
    wio.save({"a": np.zeros(2, np.float32)}, path, overwrite=True)
    assert wio.load(path)["a"].tolist() == [0, 0]


def test_a_failing_tensor_leaves_no_file(tmp_path):
    class Exploding:
        shape, dtype, ndim = (2,), np.dtype(np.float32), 1

        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("source went away")

    path = tmp_path / "x.gguf"
    with pytest.raises(Exception, match="source went away"):
        write_gguf({"a": np.zeros(2, np.float32), "b": Exploding()}, str(path))
    assert list(tmp_path.iterdir()) == []


def test_writer_streams_one_tensor_at_a_time(tmp_path, monkeypatch):
    live: list[weakref.ref] = []
    real_numpy = TensorView.numpy

    def tracking_numpy(self):
        assert all(ref() is None for ref in live), "a previous tensor is still held by the writer"
        arr = real_numpy(self).copy()
        live.append(weakref.ref(arr))
        return arr

    monkeypatch.setattr(TensorView, "numpy", tracking_numpy)
    with wio.open(GGUF / "all_types.gguf") as ckpt:
        plain = {n: ckpt[n] for n in ckpt if ckpt[n].ggml_type is None}
        write_gguf(plain, str(tmp_path / "out.gguf"), types="F16")
        assert len(live) == len(plain)
