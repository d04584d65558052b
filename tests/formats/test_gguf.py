"""GGUF reader: gguf-py-written fixtures, metadata typing and laziness, zero-copy, big-endian,
v1/v2, split sets, row-wise dequantization, and hostile files built with struct.pack."""

from __future__ import annotations

import math
import struct
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weightio as wio
from weightio.errors import CorruptFileError, FormatError, InputError, UnsupportedDTypeError, WeightioError
from weightio.formats import gguf as G
from weightio.formats import gguf_arrays as GA
from weightio.formats.gguf import GGUFArray, GGUFReader
from weightio.quant.types import by_name
from weightio.view import TensorView
from weightio.writing import write_gguf

from ..conftest import FIXTURES, manifest

GGUF = FIXTURES / "gguf"
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
NVFP4, Q8_0 = by_name("NVFP4").id, by_name("Q8_0").id


# ----------------------------------------------------------------------------- a GGUF builder


def s(text: str | bytes, *, width: str = "Q", order: str = "<") -> bytes:
    """A GGUF string: length (u64; u32 in v1) and bytes."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack(order + width, len(raw)) + raw


def kv(key: str | bytes, vtype: int, value: bytes, *, order: str = "<") -> bytes:
    return s(key, order=order) + struct.pack(order + "I", vtype) + value


def tinfo(name: str | bytes, ne: tuple[int, ...], ggml_type: int, offset: int, *, order: str = "<") -> bytes:
    return (s(name, order=order) + struct.pack(order + "I", len(ne)) + b"".join(struct.pack(order + "Q", d) for d in ne)
            + struct.pack(order + "IQ", ggml_type, offset))


def gguf_file(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", *, version: int = 3,
              order: str = "<", n_tensors: int | None = None, n_kv: int | None = None, align: int = 32) -> bytes:
    """Header, key/values, tensor infos, zero padding to `align`, then `data`."""
    head = b"GGUF" + struct.pack(order + "IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % align) + data


def f32_file(name: str = "w", values: np.ndarray | None = None, **kwargs) -> bytes:
    values = np.arange(4, dtype="<f4") if values is None else values
    return gguf_file(infos=[tinfo(name, values.shape[::-1], 0, 0)], data=values.tobytes(), **kwargs)


def _mapping(ckpt) -> np.ndarray:
    return ckpt.readers[0].file.data


# ----------------------------------------------------------------------------- fixtures


def test_every_fixture_tensor_matches_what_gguf_py_wrote():
    for path, tensors in manifest().items():
        if not path.startswith("gguf/"):
            continue
        with wio.open(FIXTURES / path) as ckpt:
            assert ckpt.format == "gguf" and sorted(ckpt) == sorted(tensors)


def test_all_types_shapes_types_and_raw_blocks():
    with wio.open(GGUF / "all_types.gguf") as ckpt:
        for name in ("q4_k", "iq2_xxs", "nvfp4", "q8_1", "q8_k", "q1_0"):
            v = ckpt[name]
            t = by_name(name)
            assert v.ggml_type == t.name and v.dtype == np.float32
            assert v.shape == (3, v.shape[1]) and v.nbytes == 3 * v.shape[1] // t.block_size * t.type_size
            raw = v.raw()
            assert raw.dtype == np.uint8 and raw.shape == (v.nbytes,) and not raw.flags.writeable
            assert np.shares_memory(raw, _mapping(ckpt))
            values = v.numpy()
            assert values.dtype == np.float32 and values.shape == v.shape and not values.flags.writeable
            assert not np.shares_memory(values, _mapping(ckpt))
        assert ckpt["q4_0"].shape == (3, 64) and ckpt["q8_1"].nbytes == 3 * 2 * 36
        assert ckpt["scalar"].shape == () and ckpt["scalar"].numpy() == 2.5
        assert ckpt["empty"].shape == (0, 4) and ckpt["empty"].numpy().shape == (0, 4)
        assert ckpt["four_d"].shape == (1, 2, 3, 4)
        np.testing.assert_array_equal(ckpt["four_d"].numpy(), np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4))


@pytest.mark.parametrize("name,dtype", [("f32", np.float32), ("f16", np.float16), ("bf16", ml_dtypes.bfloat16),
                                        ("f64", np.float64), ("i8", np.int8), ("i16", np.int16), ("i32", np.int32),
                                        ("i64", np.int64)])
def test_plain_types_are_zero_copy_views(name, dtype):
    with wio.open(GGUF / "all_types.gguf") as ckpt:
        v = ckpt[name]
        arr = v.numpy()
        assert v.ggml_type is None and arr.dtype == np.dtype(dtype) and v.dtype == np.dtype(dtype)
        assert np.shares_memory(arr, _mapping(ckpt)) and not arr.flags.writeable
        assert arr.ctypes.data - _mapping(ckpt).ctypes.data == v.info.offset


def test_reader_agrees_with_gguf_py_on_every_fixture():
    gguf = pytest.importorskip("gguf")
    for path in ("all_types.gguf", "quantized.gguf", "metadata.gguf", "big_endian.gguf", "v2.gguf"):
        ref = gguf.GGUFReader(GGUF / path)
        with wio.open(GGUF / path) as ckpt:
            assert list(ckpt) == [t.name for t in ref.tensors]
            for t in ref.tensors:
                v = ckpt[t.name]
                assert v.shape == tuple(int(d) for d in t.shape[::-1])
                assert v.info.offset == t.data_offset
                if t.tensor_type.name in ("Q8_1", "Q8_K", "Q1_0"):  # gguf-py cannot decode these
                    continue
                if v.ggml_type is not None:
                    expected = gguf.quants.dequantize(t.data, t.tensor_type)
                    assert v.numpy().tobytes() == np.ascontiguousarray(expected, np.float32).tobytes()
                else:
                    assert v.raw().tobytes() == np.ascontiguousarray(t.data).tobytes()


def test_quantized_fixture_is_real_quantization_of_floats():
    with wio.open(GGUF / "quantized.gguf") as ckpt:
        x = ckpt["w.f32"].numpy()
        q8 = ckpt["w.q8_0"].numpy()
        d = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
        # |q * f16(d) - x| <= d / 2 + 127 * |f16(d) - d| <= d / 2 + 127 * d * 2^-11
        assert (np.abs(q8.reshape(-1, 32) - x.reshape(-1, 32)) <= d * (0.5 + 127 / 2048) + 1e-7).all()
        assert np.abs(ckpt["w.q4_0"].numpy() - x).max() < 0.5


# ----------------------------------------------------------------------------- metadata


def test_every_value_type_decodes_to_typed_python_values():
    with wio.open(GGUF / "metadata.gguf") as ckpt:
        md = ckpt.metadata
        assert md["t.u8"] == 200 and md["t.i8"] == -100 and md["t.u16"] == 60000 and md["t.i16"] == -30000
        assert md["t.u32"] == 4_000_000_000 and md["t.i32"] == -2_000_000_000
        assert md["t.u64"] == 2**63 + 1 and md["t.i64"] == -(2**62)
        assert md["t.f32"] == float(np.float32(0.1)) and md["t.f64"] == 0.1
        assert md["t.bool"] is True and md["t.str"] == "naïve café ☕"
        assert all(type(md[k]) is int for k in ("t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32", "t.u64", "t.i64"))
        assert md["t.arr_int"] == [1, -2, 3] and md["t.arr_float"] == [0.5, -1.25]
        assert md["t.arr_bool"] == [True, False, True] and md["t.arr_str"] == ["α", "β", ""]
        assert md["t.nested"] == [[1, 2], [3]] and md["t.nested"].tolist() == [[1, 2], [3]]
        assert md["general.alignment"] == 64 and md["general.architecture"] == "llama"
        types = ckpt.readers[0].value_types
        assert types["t.u16"] == "UINT16" and types["t.arr_str"] == "ARRAY[STRING]"
        assert types["t.nested"] == "ARRAY[ARRAY[INT32]]" and types["t.bool"] == "BOOL"


def test_large_arrays_are_located_at_open_and_decoded_on_demand(monkeypatch):
    calls = []
    real = GA.decode_value_string
    for module in (G, GA):  # the reader (scalar strings) and the arrays
        monkeypatch.setattr(module, "decode_value_string", lambda raw, strip: calls.append(1) or real(raw, strip))
    with wio.open(GGUF / "metadata.gguf") as ckpt:
        assert calls == [] or len(calls) < 10  # only the short strings of the file, never the vocabulary
        opened = len(calls)
        tokens = ckpt.metadata["tokenizer.ggml.tokens"]
        assert isinstance(tokens, GGUFArray) and tokens.type == "STRING" and len(tokens) == 100
        assert len(calls) == opened
        assert tokens[42] == "tok42" and tokens[-1] == "tok99" and len(calls) == opened + 2
        assert tokens[1:4] == ["tok1", "tok2", "tok3"]
        assert tokens.tolist() == [f"tok{i}" for i in range(100)] and list(tokens)[:2] == ["tok0", "tok1"]
        scores = ckpt.metadata["tokenizer.ggml.scores"].numpy()
        assert scores.dtype == np.float32 and np.shares_memory(scores, _mapping(ckpt)) and not scores.flags.writeable
        np.testing.assert_array_equal(scores, np.arange(100, dtype=np.float32) / 4)
        assert repr(tokens) == "GGUFArray(STRING × 100: ['tok0', 'tok1', 'tok2', …])"
        with pytest.raises(IndexError, match="index 100 out of range"):
            tokens[100]
        with pytest.raises(TypeError, match="no numpy view"):
            tokens.numpy()


def test_short_arrays_stay_usable_after_close():
    with wio.open(GGUF / "metadata.gguf") as ckpt:
        arr = ckpt.metadata["t.arr_str"]
    assert arr == ["α", "β", ""] and arr != ["α"] and arr != "αβ"


def test_value_strings_that_are_not_utf8_keep_their_bytes(write):
    raw = b"caf\xe9"  # latin-1, not UTF-8
    kvs = [kv("t.s", STRING, s(raw)), kv("t.a", ARRAY, struct.pack("<IQ", STRING, 1) + s(raw))]
    path = write("bad.gguf", gguf_file(kvs))
    with wio.open(path) as ckpt:
        value = ckpt.metadata["t.s"]
        assert value.encode("utf-8", "surrogateescape") == raw
        assert list(ckpt.metadata["t.a"].raw_strings()) == [raw]
        write_gguf({}, str(path.with_suffix(".out.gguf")), ckpt.metadata, value_types=G.value_types(ckpt))
    assert path.with_suffix(".out.gguf").read_bytes() == path.read_bytes()


def test_empty_and_nested_arrays(write):
    nested = (struct.pack("<IQ", ARRAY, 2) + struct.pack("<IQ", U8, 2) + b"\x01\x02"
              + struct.pack("<IQ", STRING, 1) + s("x"))
    path = write("a.gguf", gguf_file([kv("empty", ARRAY, struct.pack("<IQ", F64, 0)), kv("nested", ARRAY, nested)]))
    with wio.open(path) as ckpt:
        assert ckpt.metadata["empty"] == [] and ckpt.metadata["empty"].type == "FLOAT64"
        assert ckpt.metadata["nested"] == [[1, 2], ["x"]]
        assert ckpt.readers[0].value_types["nested"] == "ARRAY[ARRAY]"


# ----------------------------------------------------------------------------- versions, byte order


def test_big_endian_file_from_gguf_py():
    with wio.open(GGUF / "big_endian.gguf") as ckpt:
        reader = ckpt.readers[0]
        assert reader.byteorder == ">" and reader.version == 3
        assert ckpt.metadata["t.u32"] == 0x01020304 and ckpt.metadata["t.arr_int"] == [1, 256, -2]
        assert ckpt.metadata["t.arr_float"].numpy().dtype == np.float32
        assert ckpt["f32"].info.dtype == np.dtype(">f4") and ckpt["f32"].dtype == np.dtype("float32")
        np.testing.assert_array_equal(ckpt["f32"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) / 8)
        np.testing.assert_array_equal(ckpt["i32"].numpy(), np.arange(-3, 3, dtype=np.int32))
        assert ckpt["f32"].raw()[:8].tobytes() == struct.pack(">2f", 0.0, 0.125)
        assert ckpt["f32"][1].tolist() == [0.5, 0.625, 0.75, 0.875]


def test_big_endian_quantized_blocks_are_refused_but_byte_only_ones_read(write):
    q8 = np.zeros(34, np.uint8)
    bf = np.array([1.5, -2.0], ">f4").view(">u4") >> 16
    mx = bytes([129]) + bytes([0x71] * 16)
    infos = [tinfo("q8", (32,), 8, 0, order=">"), tinfo("bf", (2,), 30, 64, order=">"),
             tinfo("mx", (32,), 39, 96, order=">")]
    data = q8.tobytes() + bytes(30) + bf.astype(">u2").tobytes() + bytes(28) + mx + bytes(15)
    path = write("be.gguf", gguf_file(infos=infos, data=data, order=">"))
    with wio.open(path) as ckpt:
        with pytest.raises(UnsupportedDTypeError, match="'q8': Q8_0 blocks in a big-endian GGUF file are ambiguous"):
            ckpt["q8"].numpy()
        assert ckpt["q8"].raw().tobytes() == q8.tobytes()
        assert ckpt["bf"].dtype == np.dtype(ml_dtypes.bfloat16)
        assert ckpt["bf"].numpy().astype(np.float32).tolist() == [1.5, -2.0]
        assert ckpt["mx"].numpy().tolist() == [2.0] * 16 + [24.0] * 16


def test_version_2_and_hand_packed_version_1():
    with wio.open(GGUF / "v2.gguf") as ckpt:
        assert ckpt.readers[0].version == 2 and ckpt["weight"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    with wio.open(GGUF / "v1.gguf") as ckpt:
        md = ckpt.metadata
        assert ckpt.readers[0].version == 1
        ints = (md["t.u8"], md["t.i8"], md["t.u16"], md["t.i16"], md["t.u32"], md["t.i32"])
        assert ints == (7, -7, 700, -700, 70000, -70000)
        assert md["t.f32"] == 0.5 and md["t.bool"] is True and md["t.str"] == "v1 text"  # trailing NUL dropped
        assert md["t.arr"] == ["a", "bc"]
        assert ckpt["weight"].numpy().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and ckpt["q8"].ggml_type == "Q8_0"


def test_fugg_magic_reads_as_big_endian(write):
    data = (GGUF / "big_endian.gguf").read_bytes()
    path = write("fugg.gguf", b"FUGG" + data[4:])
    reader = GGUFReader(str(path))
    try:
        assert reader.byteorder == ">" and list(reader.tensors) == ["f32", "f16", "i32", "f64"]
    finally:
        reader.close()


# ----------------------------------------------------------------------------- split sets, directories


@pytest.mark.parametrize("part", [1, 2, 3])
def test_any_part_of_a_split_set_opens_the_whole_model(part):
    path = GGUF / "split" / f"model-0000{part}-of-00003.gguf"
    with wio.open(path) as ckpt:
        assert sorted(ckpt) == [f"blk.{i}.weight" for i in range(5)] and len(ckpt.files) == 3
        assert ckpt.files[0] == str(path)
        assert ckpt["blk.4.weight"].numpy().tolist() == [[4.0] * 4] * 2
        assert ckpt.metadata["split.count"] == 3 and ckpt.metadata["t.u32"] == 5


def test_directory_of_a_split_set_opens_in_part_order():
    with wio.open(GGUF / "split") as ckpt:
        assert list(ckpt) == [f"blk.{i}.weight" for i in range(5)]
        assert ckpt.metadata["split.no"] == 0


def test_missing_or_inconsistent_split_parts(tmp_path):
    for part in (1, 3):
        name = f"model-0000{part}-of-00003.gguf"
        (tmp_path / name).write_bytes((GGUF / "split" / name).read_bytes())
    with pytest.raises(InputError, match=r"model-00002-of-00003\.gguf: cannot open"):
        wio.open(tmp_path / "model-00001-of-00003.gguf")
    renamed = tmp_path / "model-00002-of-00004.gguf"
    renamed.write_bytes((GGUF / "split" / "model-00002-of-00003.gguf").read_bytes())
    with pytest.raises(CorruptFileError, match="is named part 2 of 00004 but split.count is 3"):
        wio.open(renamed)
    moved = tmp_path / "other-00003-of-00003.gguf"
    moved.write_bytes((GGUF / "split" / "model-00001-of-00003.gguf").read_bytes())
    with pytest.raises(CorruptFileError, match=r"is named part 3 but split.no is 0 \(counting from 0\)"):
        wio.open(moved)


def test_directory_with_one_gguf_or_several(tmp_path):
    (tmp_path / "weights.gguf").write_bytes((GGUF / "v2.gguf").read_bytes())
    with wio.open(tmp_path) as ckpt:
        assert list(ckpt) == ["weight"]
    (tmp_path / "mmproj.gguf").write_bytes((GGUF / "v2.gguf").read_bytes())
    with pytest.raises(FormatError, match="holds several candidate files"):
        wio.open(tmp_path)


# ----------------------------------------------------------------------------- rows of quantized tensors


@pytest.fixture
def block_counter(monkeypatch):
    """Counts the blocks each dequantization kernel call decodes."""
    from weightio.quant import kernels

    seen: list[int] = []
    for name, kernel in list(kernels.KERNELS.items()):
        def counting(b, out, kernel=kernel):
            seen.append(b.shape[0])
            kernel(b, out)
        monkeypatch.setitem(kernels.KERNELS, name, counting)
    return seen


def test_row_selections_decode_only_their_blocks(block_counter):
    with wio.open(GGUF / "all_types.gguf") as ckpt:
        v = ckpt["q4_k"]  # (3, 512): two 256-element blocks per row
        full = v.numpy()
        assert sum(block_counter) == 6
        cases = [(1, 2), (-1, 2), (slice(1, 3), 4), (slice(None, None, 2), 4), ((1, slice(10, 20)), 2),
                 ((slice(0, 1), 5), 2), (slice(5, 9), 0), (slice(None, None, -1), 6), (slice(2, 0, -2), 2),
                 ((np.int64(2), Ellipsis), 2)]
        for key, blocks in cases:
            block_counter.clear()
            np.testing.assert_array_equal(v[key], full[key])
            assert sum(block_counter) == blocks, key
        block_counter.clear()
        np.testing.assert_array_equal(v[[0, 2]], full[[0, 2]])  # fancy keys decode everything, then index
        assert sum(block_counter) == 6


def test_one_dimensional_selections_decode_covering_blocks(write, block_counter):
    raw = np.concatenate([np.frombuffer(struct.pack("<e", float(i + 1)) + bytes(range(32)), np.uint8)
                          for i in range(4)])
    path = write("q8.gguf", gguf_file(infos=[tinfo("v", (128,), 8, 0)], data=raw.tobytes() + bytes(-raw.size % 32)))
    with wio.open(path) as ckpt:
        v = ckpt["v"]
        full = v.numpy()
        for key, blocks in ((slice(40, 70), 2), (33, 1), (-1, 1), (slice(100, 20, -7), 4), (slice(64, 64), 0)):
            block_counter.clear()
            np.testing.assert_array_equal(v[key], full[key])
            assert sum(block_counter) == blocks, key
        with pytest.raises(IndexError, match="index 128 is out of bounds for axis 0 with size 128"):
            v[128]


def test_dequantized_results_are_read_only_and_outlive_the_file():
    with wio.open(GGUF / "all_types.gguf") as ckpt:
        values = ckpt["q6_k"].numpy()
        row = ckpt["q6_k"][0]
    assert not values.flags.writeable and not row.flags.writeable
    np.testing.assert_array_equal(values[0], row)


# ----------------------------------------------------------------------------- unknown and removed types


def test_unknown_type_keeps_metadata_and_other_tensors_readable(write):
    data = np.arange(4, dtype="<f4").tobytes() + bytes(16) + bytes(64)
    infos = [tinfo("ok", (4,), 0, 0), tinfo("future", (64,), 99, 32)]
    path = write("u.gguf", gguf_file([kv("general.architecture", STRING, s("llama"))], infos, data))
    with wio.open(path) as ckpt:
        assert ckpt.metadata["general.architecture"] == "llama" and ckpt["ok"].numpy().tolist() == [0, 1, 2, 3]
        assert ckpt["future"].ggml_type == "GGML_TYPE_99" and ckpt["future"].shape == (64,)
        for read in (ckpt["future"].numpy, ckpt["future"].raw):
            with pytest.raises(UnsupportedDTypeError, match="tensor 'future': ggml type 99 is not one weightio knows"):
                read()


def test_removed_interleaved_type_is_listed_and_explained(write):
    path = write("r.gguf", gguf_file(infos=[tinfo("old", (32, 4), 31, 0)], data=bytes(72) + bytes(24)))
    with wio.open(path) as ckpt:
        v = ckpt["old"]
        assert v.ggml_type == "Q4_0_4_4" and v.raw().size == 72
        with pytest.raises(UnsupportedDTypeError, match="tensor 'old': Q4_0_4_4: row-interleaved Q4_0 repacking"):
            v.numpy()


# ----------------------------------------------------------------------------- hostile files


def _open(path):
    with wio.open(path) as ckpt:
        return list(ckpt)


HOSTILE = [
    ("version 4", b"GGUF" + struct.pack("<IQQ", 4, 0, 0), FormatError, "GGUF version 4 is not supported"),
    ("version 0", b"GGUF" + struct.pack("<IQQ", 0, 0, 0), FormatError, "GGUF version 0 is not supported"),
    ("cut after magic", b"GGUF", CorruptFileError, "too short for the GGUF magic and version"),
    ("cut in counts", b"GGUF" + struct.pack("<IQ", 3, 0), CorruptFileError,
     "metadata_kv_count needs 8 bytes at offset 16"),
    ("2^63 tensors", b"GGUF" + struct.pack("<IQQ", 3, 2**63, 0), CorruptFileError,
     "claims 9223372036854775808 tensors and 0 metadata keys, more than the 0 remaining bytes can hold"),
    ("2^64-1 keys", b"GGUF" + struct.pack("<IQQ", 3, 0, 2**64 - 1) + bytes(16), CorruptFileError,
     "more than the 16 remaining bytes"),
    ("byte-swapped v3 with LE counts", b"GGUF" + struct.pack(">I", 3) + struct.pack("<QQ", 1, 1) + bytes(40),
     CorruptFileError, "claims 72057594037927936 tensors"),
    ("key length 2^64-1", b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**64 - 1) + bytes(20), CorruptFileError,
     "a metadata key (18446744073709551615 bytes) needs 18446744073709551615 bytes"),
    ("empty key", gguf_file([kv("", U8, b"\x01")]), CorruptFileError, "a metadata key is empty"),
    ("key not UTF-8", gguf_file([kv(b"k\xff", U8, b"\x01")]), CorruptFileError, "a metadata key is not valid UTF-8"),
    ("duplicate key", gguf_file([kv("a", U8, b"\x01"), kv("a", U8, b"\x02")]), CorruptFileError,
     "metadata key 'a' appears twice"),
    ("value type 13", gguf_file([kv("a", 13, b"\x01" * 8)]), CorruptFileError,
     "metadata key 'a' has unknown value type 13 (known: 0-12)"),
    ("value type 99", gguf_file([kv("a", 99, b"\x01" * 8)]), CorruptFileError, "unknown value type 99"),
    ("BOOL 2", gguf_file([kv("b", BOOL, b"\x02")]), CorruptFileError, "BOOL metadata 'b' holds 2, not 0 or 1"),
    ("BOOL array 3", gguf_file([kv("b", ARRAY, struct.pack("<IQ", BOOL, 2) + b"\x01\x03")]), CorruptFileError,
     "BOOL array 'b' holds a value other than 0 or 1"),
    ("u32 array of 2^62", gguf_file([kv("a", ARRAY, struct.pack("<IQ", U32, 2**62))]), CorruptFileError,
     "array 'a' of 4611686018427387904 UINT32 needs 18446744073709551616 bytes"),
    ("string array of 2^61", gguf_file([kv("a", ARRAY, struct.pack("<IQ", STRING, 2**61))]), CorruptFileError,
     "array 'a' of 2305843009213693952 strings needs"),
    ("string past the end",
     gguf_file([kv("a", ARRAY, struct.pack("<IQ", STRING, 2) + s("x") + struct.pack("<Q", 10**6))]),
     CorruptFileError, "array 'a' of 2 strings runs past the end of the file"),
    ("string length 2^64-1 in an array",
     gguf_file([kv("a", ARRAY, struct.pack("<IQQ", STRING, 2, 2**64 - 1) + bytes(8))]),
     CorruptFileError, "runs past the end of the file"),
    ("nesting bomb", gguf_file([kv("n", ARRAY, struct.pack("<IQ", ARRAY, 1) * 5000 + struct.pack("<IQ", U8, 0))]),
     CorruptFileError, "metadata 'n' nests arrays more than 8 deep"),
    ("alignment 0", gguf_file([kv("general.alignment", U32, struct.pack("<I", 0))]), CorruptFileError,
     "general.alignment 0 is not a power of two up to 1048576"),
    ("alignment 3", gguf_file([kv("general.alignment", U32, struct.pack("<I", 3))]), CorruptFileError,
     "general.alignment 3 is not a power of two"),
    ("alignment 2^31", gguf_file([kv("general.alignment", U32, struct.pack("<I", 2**31))]), CorruptFileError,
     "general.alignment 2147483648 is not a power of two up to 1048576"),
    ("alignment as string", gguf_file([kv("general.alignment", STRING, s("32"))]), CorruptFileError,
     "general.alignment must be UINT32, found STRING"),
    ("alignment as u64", gguf_file([kv("general.alignment", U64, struct.pack("<Q", 32))]), CorruptFileError,
     "general.alignment must be UINT32, found UINT64"),
    ("5 dims", gguf_file(infos=[tinfo("t", (1, 1, 1, 1, 1), 0, 0)], data=bytes(32)), CorruptFileError,
     "tensor 't': has 5 dimensions; GGUF tensors have at most 4"),
    ("a million dims", gguf_file(infos=[s("t") + struct.pack("<I", 10**6) + bytes(30)]), CorruptFileError,
     "has 1000000 dimensions"),
    ("dim of 2^63", gguf_file(infos=[tinfo("t", (2**63,), 0, 0)]), CorruptFileError,
     "tensor 't': dimensions [9223372036854775808] overflow a 64-bit element count"),
    ("wrapping product", gguf_file(infos=[tinfo("t", (4194305, 4194305, 211106198978564), 0, 0)]), CorruptFileError,
     "overflow a 64-bit element count"),
    ("absurd dims", gguf_file(infos=[tinfo("t", (2**20, 2**20), 0, 0)], data=bytes(32)), CorruptFileError,
     "tensor 't': F32 data at 96..4398046511200 runs past the end of the file (128 bytes)"),
    ("Q4_0 row of 33", gguf_file(infos=[tinfo("t", (33,), 2, 0)], data=bytes(32)), CorruptFileError,
     "tensor 't': rows of 33 elements are not whole Q4_0 blocks of 32"),
    ("duplicate tensor", gguf_file(infos=[tinfo("t", (4,), 0, 0), tinfo("t", (4,), 0, 32)], data=bytes(64)),
     CorruptFileError, "tensor 't': tensor name appears twice"),
    ("tensor name not UTF-8", gguf_file(infos=[tinfo(b"\xc3(", (4,), 0, 0)], data=bytes(32)), CorruptFileError,
     "a tensor name is not valid UTF-8"),
    ("empty tensor name", gguf_file(infos=[tinfo("", (4,), 0, 0)], data=bytes(32)), CorruptFileError,
     "a tensor name is empty"),
    ("misaligned offset", gguf_file(infos=[tinfo("t", (4,), 0, 3)], data=bytes(32)), CorruptFileError,
     "tensor 't': offset 3 is not a multiple of the alignment 32"),
    ("overlapping tensors", gguf_file(infos=[tinfo("a", (8,), 0, 0), tinfo("b", (8,), 0, 0)], data=bytes(32)),
     CorruptFileError, "tensor 'b': data at 96..128 overlaps tensor 'a'"),
    ("offset 2^40", gguf_file(infos=[tinfo("t", (4,), 0, 2**40)], data=bytes(32)), CorruptFileError,
     "tensor 't': offset 1099511627776 points past the end of the file"),
    ("truncated data", gguf_file(infos=[tinfo("t", (8,), 0, 0)], data=bytes(31)), CorruptFileError,
     "tensor 't': F32 data at 64..96 runs past the end of the file (95 bytes)"),
    ("trailing bytes", gguf_file(infos=[tinfo("t", (8,), 0, 0)], data=bytes(32) + b"PK\x03\x04" + bytes(60)),
     CorruptFileError, "64 bytes after the last tensor's data (which ends at 96, padded) belong to no tensor"),
    # found by tests/fuzz: an empty tensor whose other dims numpy cannot shape (numpy() raised ValueError)
    ("empty NVFP4 with a 2.9e18 row", gguf_file(infos=[tinfo("t", (2882303761517117952, 0), NVFP4, 0)]),
     CorruptFileError, "tensor 't': dimensions [2882303761517117952, 0] overflow a 64-bit element count (numpy "
     "needs the product of the non-zero dimensions below 2^60)"),
    ("empty F32 with a 2^61 row", gguf_file(infos=[tinfo("t", (2**61, 0), 0, 0)]), CorruptFileError,
     "dimensions [2305843009213693952, 0] overflow a 64-bit element count"),
]


@pytest.mark.parametrize("content,error,message", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_files_fail_cleanly_without_allocating(write, content, error, message):
    path = write("hostile.gguf", content)
    tracemalloc.start()
    try:
        with pytest.raises(error) as caught:
            _open(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message in str(caught.value)
    assert str(caught.value).startswith(str(path))
    assert peak < 8 << 20  # nothing sized by a forged count


def test_an_empty_quantized_tensor_of_many_rows_slices_without_allocating(write):
    # found by tests/fuzz: v[::-2] gathered an index of every picked row (MemoryError past 2^30 rows)
    path = write("empty_rows.gguf", gguf_file(infos=[tinfo("q8", (0, 1342177280), Q8_0, 0)]))
    tracemalloc.start()
    try:
        with wio.open(path) as ckpt:
            v = ckpt["q8"]
            assert v.shape == (1342177280, 0) and v.nbytes == 0 and v.ggml_type == "Q8_0"
            assert v[::-2].shape == (671088640, 0) and v[::-1].dtype == np.float32
            assert v[1:3].shape == (2, 0) and v[-1].shape == (0,) and v.numpy().shape == (1342177280, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_bad_magic_is_a_format_error(write):
    path = write("x.gguf", b"GGUG" + bytes(20))
    with pytest.raises(FormatError, match="not a GGUF file"):
        GGUFReader(str(path))


def test_lenient_cases_are_accepted(write):
    # out-of-order offsets, gaps between tensors, a 70-byte name (llama.cpp caps names at 63),
    # no padding after the infos of a tensor-less file, zero-element tensors
    long = "n" * 70
    infos = [tinfo("second", (4,), 0, 64), tinfo(long, (4,), 0, 0), tinfo("empty", (0, 8), 2, 32)]
    data = np.arange(4, dtype="<f4").tobytes() + bytes(48) + np.arange(4, 8, dtype="<f4").tobytes() + bytes(16)
    with wio.open(write("ok.gguf", gguf_file(infos=infos, data=data))) as ckpt:
        assert list(ckpt) == ["second", long, "empty"] and ckpt[long].numpy().tolist() == [0, 1, 2, 3]
        assert ckpt["second"].numpy().tolist() == [4, 5, 6, 7]
        assert ckpt["empty"].shape == (8, 0) and ckpt["empty"].numpy().shape == (8, 0)
    bare = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv("a", U8, b"\x05")
    with wio.open(write("bare.gguf", bare)) as ckpt:
        assert ckpt.metadata == {"a": 5} and len(ckpt) == 0


def test_hostile_metadata_in_a_big_file_is_refused_before_reading_it(write):
    # a huge claimed string walk must stop at the first length that leaves the file
    strings = struct.pack("<IQ", STRING, 3) + s("ok") + struct.pack("<Q", 2**63) + bytes(64)
    content = gguf_file([kv("a", ARRAY, strings)])
    with pytest.raises(CorruptFileError, match="array 'a' of 3 strings runs past the end of the file"):
        _open(write("h.gguf", content))


def test_closing_keeps_arrays_valid_and_refuses_new_reads():
    ckpt = wio.open(GGUF / "all_types.gguf")
    view, values = ckpt["f32"], ckpt["f32"].numpy()
    ckpt.close()
    assert values.shape == (4, 6)
    with pytest.raises(Exception, match="the checkpoint was closed"):
        view.numpy()


def test_element_count_is_a_python_int(write):
    # 2^31 * 2^28 elements would wrap in int32 arithmetic; here it is refused against the file size
    content = gguf_file(infos=[tinfo("t", (2**31, 2**28), 24, 0)], data=bytes(32))
    with pytest.raises(CorruptFileError, match=f"I8 data at 96..{96 + 2**59} runs past the end"):
        _open(write("big.gguf", content))
    assert math.prod((2**31, 2**28)) == 2**59


def test_every_truncation_is_a_clean_error(tmp_path):
    source = (GGUF / "metadata.gguf").read_bytes()
    with wio.open(GGUF / "metadata.gguf") as ckpt:  # cutting only the final padding loses nothing
        data_end = max(ckpt[n].info.offset + ckpt[n].nbytes for n in ckpt)
    path = tmp_path / "cut.gguf"
    for length in range(1, data_end):
        path.write_bytes(source[:length])
        reader = None
        try:
            reader = GGUFReader(str(path))
        except (CorruptFileError, FormatError):
            continue
        finally:
            if reader is not None:
                reader.close()
        pytest.fail(f"a file cut to {length} bytes opened")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_bytes_give_weightio_errors_or_a_valid_file(tmp_path, flips):
    data = bytearray((GGUF / "metadata.gguf").read_bytes())
    for position, value in flips:
        data[position % len(data)] = value
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(data))
    try:
        reader = GGUFReader(str(path))
    except WeightioError:
        return
    try:  # whatever opened must also read without surprises
        for name in reader.tensors:
            TensorView(reader, name, reader.tensors[name]).numpy()
        for value in reader.metadata.values():
            if isinstance(value, GGUFArray):
                value.tolist()
    except WeightioError:
        pass
    finally:
        reader.close()


def test_metadata_a_gguf_value_cannot_hold_is_a_format_error(tmp_path):
    # a FLOAT64 read from a file is written back as FLOAT32 unless told otherwise: 1e300 overflows
    with pytest.raises(FormatError, match="metadata 'k': float too large to pack"):
        wio.save({"x": np.zeros(2, np.float32)}, tmp_path / "o.gguf", {"k": 1e300})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("copies", [1, 400])  # a short array of arrays (copied at open) and a long one (read lazily)
def test_arrays_of_arrays_are_validated_at_open_and_built_when_read(write, copies):
    item = (struct.pack("<IQ", ARRAY, 2) + struct.pack("<IQ", U8, 2) + b"\x01\x00"
            + struct.pack("<IQ", STRING, 2) + s("α") + s(b"\xff"))
    path = write("n.gguf", gguf_file([kv("n", ARRAY, struct.pack("<IQ", ARRAY, copies) + item * copies)]))
    expected = [[[1, 0], ["α", "\udcff"]]] * copies
    with wio.open(path) as ckpt:
        arr = ckpt.metadata["n"]
        assert arr._items is None and len(arr) == copies  # nothing built at open
        assert arr[0][0].tolist() == [1, 0] and repr(arr).startswith("GGUFArray(ARRAY × ")
        assert ckpt.readers[0].value_types["n"] == "ARRAY[ARRAY[ARRAY]]"
        if copies > 1:
            assert arr.tolist() == expected and arr[copies - 1].tolist() == [[1, 0], ["α", "\udcff"]]
            assert list(arr[0][1].raw_strings()) == ["α".encode(), b"\xff"]
    if copies == 1:  # its bytes were copied at open: readable after close
        assert arr.tolist() == expected and arr[0][0].numpy().tolist() == [1, 0]


def test_a_bool_deep_in_an_array_of_arrays_is_still_checked_at_open(write):
    value = struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", BOOL, 1) + b"\x02"
    path = write("b.gguf", gguf_file([kv("b", ARRAY, value)]))
    with pytest.raises(CorruptFileError, match="BOOL array 'b' holds a value other than 0 or 1"):
        wio.open(path)
