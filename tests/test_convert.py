"""weightio.convert: round trips over every fixture and format, sharding, ties, casts, atomicity."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weightio as wio
import weightio.convert as convert_module
from weightio.convert import convert, parse_size, plan_shards
from weightio.dtypes import TABLE
from weightio.errors import CorruptFileError, FormatError, UnsupportedDTypeError, UsageError, WriteError
from weightio.formats.ggml_to_gguf import gguf_name

from .conftest import FIXTURES, digest, manifest

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _tree_digest(root: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file under `root` (or of `root` itself)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in files}


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if ".weightio-" in p.name)


# ----------------------------------------------------------------------------- round trips over the fixtures

# What each writable format stores (manifest dtype names; "F4" is packed fp4).
_NUMPY_NATIVE = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "float32", "float64", "complex64", "complex128"}
STORES = {
    "safetensors": {row.numpy.name for row in TABLE if not row.packed} | {"F4"},
    "npz": _NUMPY_NATIVE,
    "gguf": {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64"},
}
SUFFIX = {"safetensors": ".safetensors", "npz": ".npz", "gguf": ".gguf", "npy": ".npy"}
FIXTURE_PATHS = sorted(manifest())


def _readable(path: str) -> dict[str, dict]:
    """The manifest entries of `path` that weightio reads back exactly (test_fixtures checks the rest)."""
    out = {}
    with wio.open(FIXTURES / path) as ckpt:
        for name, spec in manifest()[path].items():
            try:
                ok = spec["dtype"] == "F4" or digest(ckpt[name].numpy()) == spec["sha256"]
            except wio.WeightioError:
                ok = False
            if ok:
                out[name] = {**spec, "quantized": ckpt[name].ggml_type is not None}
    return out


def _storable(specs: dict[str, dict], fmt: str) -> list[str]:
    """Names whose dtype `fmt` stores (quantized tensors: as float32 after dequantizing, or as blocks in GGUF)."""
    return sorted(n for n, s in specs.items() if s["dtype"] in STORES[fmt] or (s["quantized"] and fmt == "gguf"))


def _check_tensors(path: Path, specs: dict[str, dict], names: list[str]) -> None:
    with wio.open(path) as ckpt:
        assert sorted(ckpt) == names
        for name in names:
            spec, view = specs[name], ckpt[name]
            assert list(view.shape) == spec["shape"], name
            if spec["dtype"] == "F4":
                assert hashlib.sha256(view.raw().tobytes()).hexdigest() == spec["sha256"], name
            else:
                assert digest(view.numpy()) == spec["sha256"], name


def _exact(pattern_names: list[str]) -> list[str]:
    """Glob patterns that match exactly these names (escaping glob characters)."""
    return ["".join(f"[{c}]" if c in "*?[]" else c for c in n) for n in pattern_names]


# (fixture, format) pairs where the format can hold at least one of the fixture's tensors
# (quantized GGUF tensors are recorded as their float32 values, which every format holds).
PAIRS = [(path, fmt) for path in FIXTURE_PATHS for fmt in ("safetensors", "npz", "gguf")
         if any(spec["dtype"] in STORES[fmt] for spec in manifest()[path].values())]


@pytest.mark.parametrize("path,fmt", PAIRS, ids=[f"{p}->{f}" for p, f in PAIRS])
def test_round_trip_every_fixture_through_every_format(tmp_path, path, fmt):
    """Fixture (format X) -> fmt -> X again: every tensor's bytes equal what the writing library
    recorded (quantized GGUF tensors: their blocks, or their dequantized values)."""
    specs = _readable(path)
    names = _storable(specs, fmt)
    assert names
    before = _tree_digest(FIXTURES / path)
    with wio.open(FIXTURES / path) as ckpt:
        source_format = ckpt.format
    out = tmp_path / ("out" + SUFFIX[fmt])
    result = convert(FIXTURES / path, out, select=_exact(names), dequantize=fmt != "gguf", verify=True)
    if any("written as a llama GGUF model" in note for note in result.notes):  # ggml_to_gguf's names
        specs = {gguf_name(n): spec for n, spec in specs.items()}
        names = sorted(gguf_name(n) for n in names)
    _check_tensors(out, specs, names)
    if source_format in STORES and (source_format != "gguf" or fmt == "gguf" or not any(
            specs[n]["quantized"] for n in names)):
        back = tmp_path / ("back" + SUFFIX[source_format])
        convert(out, back, verify=True)
        _check_tensors(back, specs, names)
        if source_format == fmt:  # the writers are deterministic: a second pass gives the same bytes
            again = tmp_path / ("again" + SUFFIX[fmt])
            convert(back, again)
            assert again.read_bytes() == out.read_bytes()
    assert _tree_digest(FIXTURES / path) == before  # the source is never modified


@pytest.mark.parametrize("path", ["numpy/c_order.npy", "numpy/fortran.npy", "numpy/big_endian.npy",
                                  "numpy/scalar.npy", "numpy/empty.npy"])
def test_single_tensor_npy_round_trips_through_every_format(tmp_path, path):
    name, spec = next(iter(manifest()[path].items()))
    for fmt in ("safetensors", "npz", "gguf"):
        if spec["dtype"] not in STORES[fmt]:
            continue
        mid = tmp_path / f"{name}{SUFFIX[fmt]}"
        convert(FIXTURES / path, mid, verify=True, overwrite=True)
        back = tmp_path / f"{name}.npy"
        convert(mid, back, verify=True, overwrite=True)
        with wio.open(back) as ckpt:
            assert digest(ckpt[name].numpy()) == spec["sha256"]
            assert list(ckpt[name].shape) == spec["shape"]


def test_npy_output_matches_numpy_save_byte_for_byte(tmp_path):
    convert(FIXTURES / "numpy" / "fortran.npy", tmp_path / "f.npy")
    np.save(tmp_path / "ref.npy", np.ascontiguousarray(np.load(FIXTURES / "numpy" / "fortran.npy")))
    assert (tmp_path / "f.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()


def test_safetensors_output_matches_the_reference_writer(tmp_path):
    arrays = dict(np.load(FIXTURES / "numpy" / "arrays.npz"))
    del arrays["complex"]  # complex128: no safetensors dtype
    convert(FIXTURES / "numpy" / "arrays.npz", tmp_path / "a.safetensors", select=list(arrays))
    safetensors_numpy.save_file({k: v.astype(v.dtype.newbyteorder("<")).copy(order="C")
                                 for k, v in arrays.items()}, tmp_path / "ref.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


# ----------------------------------------------------------------------------- sharding


@pytest.mark.parametrize("text,expected", [("5GB", 5 * 10**9), ("5gb", 5 * 10**9), ("500MB", 500 * 10**6),
                                           ("1.5GB", 1_500_000_000), ("2KiB", 2048), ("3MiB", 3 << 20),
                                           ("1GiB", 1 << 30), ("1TB", 10**12), ("100", 100), (" 42 B ", 42), (7, 7),
                                           ("2.01kB", 2010), ("8.03kB", 8030),
                                           ("9" * 400 + ".5GB", int("9" * 400 + "5") * 10**8)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["5 parsecs", "", "GB", "-1GB", "0", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="size"):
        parse_size(text)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 100), max_size=30), limit=st.integers(1, 120))
def test_plan_shards_groups_as_huggingface_hub_does(sizes, limit):
    hub_serialization = pytest.importorskip("huggingface_hub.serialization")
    state = {f"t{i}": np.zeros(n, np.uint8) for i, n in enumerate(sizes)}
    split = hub_serialization.split_state_dict_into_shards_factory(
        state, get_storage_size=lambda a: a.nbytes, filename_pattern="model{suffix}.safetensors",
        max_shard_size=limit)
    expected = list(split.filename_to_tensors.values()) if state else []
    assert plan_shards({k: v.nbytes for k, v in state.items()}, limit) == expected


def test_sharded_output_layout_and_index(tmp_path):
    out = tmp_path / "out"
    result = convert(FIXTURES / "tiny-bert", str(out) + "/", max_shard_size="30kB", verify=True)
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", *shards, "model.safetensors.index.json",
                                                     "tokenizer.json", "tokenizer_config.json"]  # model_files
    assert result.files == [str(out / s) for s in shards] + [str(out / "model.safetensors.index.json")]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 79912}  # as huggingface_hub: "format" is in each shard
    with wio.open(FIXTURES / "tiny-bert") as src:
        assert list(index["weight_map"]) == list(src)  # checkpoint order, shard by shard
    for shard in shards:
        with wio.open(out / shard) as ckpt:
            assert ckpt.metadata == {"format": "pt"}
            assert sum(v.nbytes for v in ckpt.values()) <= 30_000
            assert all(index["weight_map"][n] == shard for n in ckpt)
    with wio.open(out) as ckpt, wio.open(FIXTURES / "tiny-bert") as src:
        assert all(ckpt[n].numpy().tobytes() == src[n].numpy().tobytes() for n in src)


def test_one_shard_is_written_as_a_single_file_without_index(tmp_path):
    convert(FIXTURES / "tiny-bert", tmp_path / "model.safetensors", max_shard_size="5GB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_sharded_files_equal_huggingface_hub_save_torch_state_dict(tmp_path):
    torch = pytest.importorskip("torch")
    from huggingface_hub import save_torch_state_dict

    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        state = {n: torch.from_numpy(ckpt[n].numpy().copy()) for n in ckpt}
    (tmp_path / "hub").mkdir()
    save_torch_state_dict(state, tmp_path / "hub", max_shard_size="20KB")
    convert(FIXTURES / "tiny-bert", tmp_path / "ours" / "model.safetensors", max_shard_size="20KB", parents=True)
    expected = sorted(p.name for p in (tmp_path / "hub").iterdir())
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == expected and len(expected) > 2
    for name in expected:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "hub" / name).read_bytes(), name


def test_sharding_needs_a_safetensors_destination(tmp_path):
    with pytest.raises(UsageError, match="sharding .* writes safetensors"):
        convert(FIXTURES / "tiny-bert", tmp_path / "x.npz", max_shard_size="1MB")


def test_overwrite_replaces_stale_shards_and_index(tmp_path):
    out = tmp_path / "m"
    convert(FIXTURES / "tiny-bert", str(out) + "/", max_shard_size="30kB")
    with pytest.raises(WriteError, match="model.safetensors.index.json: already exists and would shadow"):
        convert(FIXTURES / "tiny-bert", str(out) + "/")
    convert(FIXTURES / "tiny-bert", str(out) + "/", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]
    with wio.open(out) as ckpt:
        assert len(ckpt) == 39 and len(ckpt.files) == 1


# ----------------------------------------------------------------------------- tied weights


def _fake_torch_file(tmp_path: Path, data: bytes) -> Path:
    """A file that sniffs as a pickle (so the `fake_pytorch` reader opens it), `data` at offset 2."""
    path = tmp_path / "tied.bin"
    path.write_bytes(b"\x80\x02" + data)
    return path


@pytest.fixture
def fake_pytorch(monkeypatch):
    """A stand-in PyTorch reader: names at given offsets of the file, several possibly sharing bytes
    (how torch.save stores tied parameters: one storage, several names)."""
    from weightio import formats
    from weightio.formats.base import Reader, TensorInfo

    layout: dict[str, tuple[int, tuple[int, ...]]] = {}

    class Tied(Reader):
        format = "pytorch"

        def __init__(self, file):
            super().__init__(file)
            for name, (offset, shape) in layout.items():
                self.tensors[name] = TensorInfo(np.dtype("<f4"), shape, offset, 4 * int(np.prod(shape)))

    monkeypatch.setitem(formats.READERS, "pytorch", Tied)
    return layout


def test_tied_tensors_are_written_once_with_aliases(tmp_path, fake_pytorch):
    values = np.arange(12, dtype="<f4")
    fake_pytorch.update({"lm_head.weight": (2, (3, 4)), "embed.weight": (2, (3, 4)), "bias": (2, (4,)),
                         "decoder.weight": (2, (3, 4))})
    src = _fake_torch_file(tmp_path, values.tobytes())
    result = convert(src, tmp_path / "out.safetensors", verify=True)
    # the alphabetically first name is kept, as safetensors' convert.py and huggingface_hub choose
    assert result.aliases == {"embed.weight": "decoder.weight", "lm_head.weight": "decoder.weight"}
    with wio.open(tmp_path / "out.safetensors") as ckpt:
        assert sorted(ckpt) == ["bias", "decoder.weight"]
        assert ckpt.metadata == {"format": "pt", "embed.weight": "decoder.weight", "lm_head.weight": "decoder.weight"}
        assert ckpt["decoder.weight"].numpy().tobytes() == values.tobytes()
        assert ckpt["bias"].numpy().tobytes() == values[:4].tobytes()  # overlapping but not identical: copied
    npz = convert(src, tmp_path / "out.npz")
    assert npz.aliases == {} and npz.notes == ["2 tied tensors written as separate copies (npz has no aliases)"]
    with wio.open(tmp_path / "out.npz") as ckpt:
        assert sorted(ckpt) == ["bias", "decoder.weight", "embed.weight", "lm_head.weight"]


def test_tied_weights_of_a_real_torch_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    embed = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "norm.weight": torch.ones(4)}
    torch.save(state, tmp_path / "pytorch_model.bin")
    try:
        result = convert(tmp_path / "pytorch_model.bin", tmp_path / "model.safetensors", verify=True)
    except FormatError as e:
        pytest.skip(f"the PyTorch reader is not available: {e}")
    assert result.aliases == {"model.embed_tokens.weight": "lm_head.weight"}
    loaded = load_file(tmp_path / "model.safetensors")
    assert sorted(loaded) == ["lm_head.weight", "norm.weight"] and torch.equal(loaded["lm_head.weight"], embed)


# ----------------------------------------------------------------------------- dtype casts


def _bits(path: Path, name: str) -> bytes:
    with wio.open(path) as ckpt:
        return ckpt[name].raw().tobytes()


def test_cast_to_bf16_rounds_to_nearest_even(tmp_path):
    # float32 bit patterns and their bfloat16 by IEEE round-to-nearest-even (hand-computed)
    f32 = np.array([0x3F800000, 0x3DCCCCCD, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF800000], dtype="<u4")
    bf16 = np.array([0x3F80, 0x3DCD, 0x3F80, 0x3F82, 0x7F80, 0xFF80], dtype="<u2")
    safetensors_numpy.save_file({"w": f32.view("<f4"), "i": np.arange(3, dtype=np.int64)}, tmp_path / "a.safetensors")
    result = convert(tmp_path / "a.safetensors", tmp_path / "b.safetensors", dtype="bf16", verify=True)
    assert result.nbytes == 12 + 24
    assert _bits(tmp_path / "b.safetensors", "w") == bf16.tobytes()
    with wio.open(tmp_path / "b.safetensors") as ckpt:
        assert ckpt["w"].dtype == ml_dtypes.bfloat16 and ckpt["i"].dtype == np.int64  # integers keep their type


@pytest.mark.parametrize("dtype,torch_name", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp8", "float8_e4m3fn"),
                                              ("fp8_e5m2", "float8_e5m2"), ("float64", "float64")])
def test_casts_match_torch(tmp_path, dtype, torch_name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 50,
                             np.array([0, -0.0, 1e-8, 500, -70000, np.inf, -np.inf, np.nan], np.float32)])
    safetensors_numpy.save_file({"w": values}, tmp_path / "a.safetensors")
    convert(tmp_path / "a.safetensors", tmp_path / "b.safetensors", dtype=dtype)
    expected = torch.from_numpy(values).to(getattr(torch, torch_name))
    with wio.open(tmp_path / "b.safetensors") as ckpt:
        ours = ckpt["w"].numpy()
    nan = np.isnan(values)
    assert np.array_equal(np.isnan(ours.astype(np.float64)), nan)  # NaN stays NaN (payload bits may differ)
    bits = expected.view(torch.uint8).numpy().reshape(len(values), -1)
    assert ours.view(np.uint8).reshape(len(values), -1)[~nan].tobytes() == bits[~nan].tobytes()


def test_cast_refuses_non_float_targets(tmp_path):
    with pytest.raises(UnsupportedDTypeError, match="must be a floating-point type"):
        convert(FIXTURES / "tiny-bert", tmp_path / "x.safetensors", dtype="int8")
    with pytest.raises(UnsupportedDTypeError, match="unknown dtype"):
        convert(FIXTURES / "tiny-bert", tmp_path / "x.safetensors", dtype="bf17")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- GGUF sources


def test_quantized_tensors_need_dequantize_for_other_formats(tmp_path):
    with pytest.raises(UnsupportedDTypeError, match=r"'w.q8_0': is Q8_0 block-quantized \(pass dequantize=True"):
        convert(FIXTURES / "gguf" / "quantized.gguf", tmp_path / "x.safetensors", select=["w.q8_0"])
    assert not list(tmp_path.iterdir())


def test_dequantize_matches_gguf_and_casts(tmp_path):
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(FIXTURES / "gguf" / "quantized.gguf")
    tensor = next(t for t in reader.tensors if t.name == "w.q8_0")
    expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    convert(FIXTURES / "gguf" / "quantized.gguf", tmp_path / "x.safetensors", select=["w.q8_0"], dequantize=True)
    with wio.open(tmp_path / "x.safetensors") as ckpt:
        assert ckpt["w.q8_0"].numpy().tobytes() == expected.tobytes()
    convert(FIXTURES / "gguf" / "quantized.gguf", tmp_path / "y.safetensors", select=["w.q8_0"], dequantize=True,
            dtype="fp16")
    with wio.open(tmp_path / "y.safetensors") as ckpt:
        assert ckpt["w.q8_0"].numpy().tobytes() == expected.astype(np.float16).tobytes()


def test_gguf_to_gguf_copies_blocks_and_keeps_metadata_types(tmp_path):
    gguf = pytest.importorskip("gguf")
    convert(FIXTURES / "gguf" / "metadata.gguf", tmp_path / "m.gguf", verify=True)
    old, new = gguf.GGUFReader(FIXTURES / "gguf" / "metadata.gguf"), gguf.GGUFReader(tmp_path / "m.gguf")
    fields = {k: (f.types, f.contents()) for k, f in old.fields.items() if not k.startswith("GGUF.")}
    assert {k: (f.types, f.contents()) for k, f in new.fields.items() if not k.startswith("GGUF.")} == fields
    convert(FIXTURES / "gguf" / "quantized.gguf", tmp_path / "q.gguf")
    with wio.open(FIXTURES / "gguf" / "quantized.gguf") as a, wio.open(tmp_path / "q.gguf") as b:
        assert all(a[n].ggml_type == b[n].ggml_type and a[n].raw().tobytes() == b[n].raw().tobytes() for n in a)


def test_split_gguf_set_becomes_one_file_without_split_keys(tmp_path):
    convert(FIXTURES / "gguf" / "split", tmp_path / "one.gguf", verify=True)
    with wio.open(tmp_path / "one.gguf") as ckpt:
        assert len(ckpt.files) == 1 and len(ckpt) == 5
        assert not any(k.startswith("split.") for k in ckpt.metadata)


def test_gguf_metadata_to_safetensors_keeps_scalars_as_strings(tmp_path):
    result = convert(FIXTURES / "gguf" / "big_endian.gguf", tmp_path / "x.safetensors")
    with wio.open(FIXTURES / "gguf" / "big_endian.gguf") as src, wio.open(tmp_path / "x.safetensors") as out:
        assert out.metadata == {"format": "pt", "general.architecture": src.metadata["general.architecture"],
                                "t.u32": str(src.metadata["t.u32"]), "t.str": src.metadata["t.str"]}
    assert result.notes == ["metadata not kept: 2 entries that are not scalars (t.arr_int, t.arr_float)"]


# ----------------------------------------------------------------------------- selection, formats, notes


def test_select_names(tmp_path):
    names = ["a.weight", "a.bias", "b.weight"]
    wio.save({n: np.zeros(1, np.float32) for n in names}, tmp_path / "m.npz")
    with wio.open(tmp_path / "m.npz") as ckpt:
        assert ckpt.select() == names
        assert ckpt.select("*.weight") == ["a.weight", "b.weight"]
        assert ckpt.select("b.*", "a.bias") == ["a.bias", "b.weight"]


def test_npy_output_needs_exactly_one_tensor(tmp_path):
    with pytest.raises(UsageError, match=r"\.npy holds one tensor and 39 are selected"):
        convert(FIXTURES / "tiny-bert", tmp_path / "x.npy")
    convert(FIXTURES / "tiny-bert", tmp_path / "emb.npy", select=["embeddings.word_embeddings.weight"])
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        expected = ckpt["embeddings.word_embeddings.weight"].numpy()
    assert np.load(tmp_path / "emb.npy").tobytes() == expected.tobytes()
    with pytest.raises(UsageError, match="no tensor matches 'nothing.*'"):
        convert(FIXTURES / "tiny-bert", tmp_path / "y.npy", select=["nothing.*"])


def test_metadata_that_npz_cannot_hold_is_reported(tmp_path):
    result = convert(FIXTURES / "dtypes.safetensors", tmp_path / "x.npz", select=["f32", "i8"])
    assert result.notes == ["metadata not kept: npz files cannot store metadata (2 entries)"]
    assert convert(FIXTURES / "tiny-bert", tmp_path / "y.npz").notes == []  # {"format": "pt"} is not worth a note


def test_index_metadata_of_the_source_is_not_carried(tmp_path):
    convert(FIXTURES / "tiny-bert-sharded", tmp_path / "one.safetensors")
    with wio.open(tmp_path / "one.safetensors") as ckpt:
        assert ckpt.metadata == {"format": "pt"}  # no stale total_size / total_parameters


def test_directory_destination_and_format_option(tmp_path):
    convert(FIXTURES / "numpy.safetensors", str(tmp_path / "d") + "/", verify=True)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["model.safetensors"]
    convert(FIXTURES / "numpy.safetensors", tmp_path / "weights.bin", format="npz")
    with wio.open(tmp_path / "weights.bin") as ckpt:
        assert ckpt.format == "npz" and sorted(ckpt) == ["bias", "weight"]


def test_unknown_destination_format(tmp_path):
    with pytest.raises(UsageError, match="cannot tell the format from suffix '.bin'"):
        convert(FIXTURES / "tiny-bert", tmp_path / "x.bin")
    with pytest.raises(UsageError, match="writing to the Hub is not supported"):
        convert(FIXTURES / "tiny-bert", "hf://org/model")


def test_progress_reports_every_byte_once(tmp_path):
    calls = []
    convert(FIXTURES / "tiny-bert", tmp_path / "x.safetensors", progress=lambda n, total: calls.append((n, total)))
    assert sum(n for n, _ in calls) == 79912 and {t for _, t in calls} == {79912} and len(calls) == 39
    calls.clear()
    convert(FIXTURES / "tiny-bert", tmp_path / "y.safetensors", verify=True, progress=lambda n, t: calls.append((n, t)))
    assert sum(n for n, _ in calls) == 2 * 79912 and {t for _, t in calls} == {2 * 79912}


def test_source_pages_are_released_tensor_by_tensor(tmp_path, monkeypatch):
    released = []
    monkeypatch.setattr(convert_module, "release_pages", lambda view: released.append(view.name))
    convert(FIXTURES / "tiny-bert", tmp_path / "x.npz")
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        assert released == list(ckpt)  # each tensor once, as soon as the writer moves past it


def test_release_pages_drops_mapped_pages_from_the_resident_set(tmp_path):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("needs Linux /proc accounting")
    arr = np.random.default_rng(0).standard_normal(8 << 20 >> 2).astype(np.float32)  # 8 MiB
    safetensors_numpy.save_file({"w": arr}, tmp_path / "big.safetensors")
    with wio.open(tmp_path / "big.safetensors") as ckpt:
        view = ckpt["w"]
        float(view.numpy().sum())  # fault every page in
        resident = _resident_pages(view.numpy())
        convert_module.release_pages(view)
        assert resident > 1500 and _resident_pages(view.numpy()) < 50


def _resident_pages(arr: np.ndarray) -> int:
    """Pages of `arr` in this process's page tables, from /proc/self/smaps' Rss of its mapping."""
    start = arr.__array_interface__["data"][0]
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        bounds = line.split()[0]
        if "-" in bounds and all(c in "0123456789abcdef-" for c in bounds):
            lo, hi = (int(x, 16) for x in bounds.split("-"))
            if lo <= start < hi:
                rss = next(entry for entry in lines[i + 1:] if entry.startswith("Rss:"))
                return int(rss.split()[1]) // 4
    raise AssertionError("mapping not found")


# ----------------------------------------------------------------------------- atomicity and safety


def test_existing_destination_is_refused_then_replaced_with_overwrite(tmp_path):
    dst = tmp_path / "x.safetensors"
    dst.write_bytes(b"keep me")
    with pytest.raises(WriteError, match=r"already exists \(pass overwrite=True to replace it\)"):
        convert(FIXTURES / "numpy.safetensors", dst)
    assert dst.read_bytes() == b"keep me"
    convert(FIXTURES / "numpy.safetensors", dst, overwrite=True)
    with wio.open(dst) as out, wio.open(FIXTURES / "numpy.safetensors") as src:
        assert {n: v.numpy().tobytes() for n, v in out.items()} == {n: v.numpy().tobytes() for n, v in src.items()}
    assert _leftovers(tmp_path) == []


def test_a_source_file_is_never_a_destination(tmp_path):
    src = tmp_path / "model.safetensors"
    src.write_bytes((FIXTURES / "numpy.safetensors").read_bytes())
    before = _tree_digest(tmp_path)
    with pytest.raises(WriteError, match="is a file of the checkpoint being converted"):
        convert(src, src, overwrite=True)
    with pytest.raises(WriteError, match="is a file of the checkpoint being converted"):
        convert(src, str(tmp_path) + "/", overwrite=True)  # -> tmp_path/model.safetensors
    assert _tree_digest(tmp_path) == before


def test_interrupt_leaves_no_partial_output(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = convert_module.make

    def interrupted(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(convert_module, "make", interrupted)
    out = tmp_path / "new" / "deeper"
    with pytest.raises(KeyboardInterrupt):
        convert(FIXTURES / "tiny-bert", str(out) + "/", max_shard_size="20kB", parents=True)
    assert list(tmp_path.iterdir()) == []  # no shard, no temporary file, no directory we created
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        convert(FIXTURES / "tiny-bert", tmp_path / "x.npz")
    assert list(tmp_path.iterdir()) == []


def test_interrupt_while_committing_shards_rolls_back(tmp_path, monkeypatch):
    real = os.replace
    seen = []

    def flaky(a, b):
        seen.append(b)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(convert_module.os, "replace", flaky)
    with pytest.raises(KeyboardInterrupt):
        convert(FIXTURES / "tiny-bert", str(tmp_path) + "/", max_shard_size="30kB")
    assert list(tmp_path.iterdir()) == []


def test_verify_catches_corrupted_output_and_writes_nothing(tmp_path, monkeypatch):
    real = convert_module.write_sources

    def corrupting(tensors, path, metadata=None, format=None, **kw):
        real(tensors, path, metadata, format, **kw)
        data = bytearray(Path(path).read_bytes())
        data[-1] ^= 0xFF
        Path(path).write_bytes(bytes(data))

    monkeypatch.setattr(convert_module, "write_sources", corrupting)
    with pytest.raises(CorruptFileError, match="verification failed: the written bytes differ from the source's"):
        convert(FIXTURES / "numpy.safetensors", tmp_path / "x.safetensors", verify=True)
    assert list(tmp_path.iterdir()) == []


DISK_FULL = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # the kernel then fails the write with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (40000, 40000))
from weightio.cli import main
main(sys.argv[1:], prog_name="weightio")
"""


def test_a_full_disk_leaves_no_partial_output(tmp_path):
    """A file-size limit makes writes fail the way a full disk does (EFBIG instead of ENOSPC)."""
    out = tmp_path / "out.safetensors"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, "convert", str(FIXTURES / "tiny-bert"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"weightio: error: {out}: write failed: File too large")
    assert list(tmp_path.iterdir()) == []


def test_verify_reads_back_every_format(tmp_path):
    for fmt in ("safetensors", "npz", "gguf"):
        result = convert(FIXTURES / "numpy" / "c_order.npy", tmp_path / f"c{SUFFIX[fmt]}", verify=True)
        assert result.verified and result.files == [str(tmp_path / f"c{SUFFIX[fmt]}")]


def test_header_struct_of_written_safetensors(tmp_path):
    convert(FIXTURES / "numpy.safetensors", tmp_path / "x.safetensors")
    raw = (tmp_path / "x.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt"}
    assert header["bias"] == {"dtype": "F64", "shape": [5], "data_offsets": [0, 40]}  # wider types first
    assert header["weight"] == {"dtype": "F32", "shape": [4, 5], "data_offsets": [40, 120]}


def _ggjt(path: Path, tensor: str) -> Path:
    """A ggjt v3 file with llama's hyperparameters, a 4-token vocabulary and one F32 tensor."""
    import struct

    raw = b"tjgg" + struct.pack("<I7I", 3, 4, 8, 16, 2, 1, 4, 0)
    for i, token in enumerate([b"<unk>", b"<s>", b"</s>", b" x"]):
        raw += struct.pack("<I", len(token)) + token + struct.pack("<f", -i)
    raw += struct.pack("<IIII", 1, len(tensor), 0, 8) + tensor.encode()
    raw += bytes(-len(raw) % 32) + np.arange(8, dtype="<f4").tobytes()
    path.write_bytes(raw)
    return path


def test_metadata_of_other_formats_in_gguf_keeps_typed_scalars(tmp_path):
    source = _ggjt(tmp_path / "m.bin", "model/wte")  # llama hyperparameters, but no llama tensor name
    result = convert(source, tmp_path / "g.gguf", verify=True)
    assert result.notes == ["not written as a llama model (llama.cpp could not load it): tensor 'model/wte' has no "
                            "GGUF llama name; the ggml hyperparameters are kept as ggml.* keys",
                            "metadata not kept: 2 entries that are not scalars (ggml.tokens, ggml.scores)"]
    with wio.open(source) as src, wio.open(tmp_path / "g.gguf") as out:
        assert {k: out.metadata[k] for k in ("ggml.magic", "ggml.n_vocab", "ggml.n_embd")} == {
            k: src.metadata[k] for k in ("ggml.magic", "ggml.n_vocab", "ggml.n_embd")}
        assert isinstance(out.metadata["ggml.n_vocab"], int)
        assert list(out) == ["model/wte"]


def test_nested_pytorch_metadata_becomes_strings_in_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"model": {"w": torch.ones(2)}, "epoch": 3, "loss": 0.25, "name": "run-7", "betas": [0.9, 0.99],
                "nothing": None}, tmp_path / "ckpt.pt")
    result = convert(tmp_path / "ckpt.pt", tmp_path / "c.safetensors")
    assert result.notes == ["metadata not kept: 2 entries that are not scalars (betas, nothing)"]
    from safetensors import safe_open

    with safe_open(tmp_path / "c.safetensors", "np") as f:
        assert f.metadata() == {"format": "pt", "epoch": "3", "loss": "0.25", "name": "run-7"}
        assert list(f.keys()) == ["model.w"]
