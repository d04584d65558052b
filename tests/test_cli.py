"""The weightio command: every subcommand through CliRunner, a few through the installed entry point."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from weightio.cli import main

import weightio as wio

from .conftest import FIXTURES
from .hostile import STRING as _GSTRING
from .hostile import f32_entry as _f32_entry
from .hostile import gguf as _gguf
from .hostile import ginfo as _ginfo
from .hostile import gkv as _gkv
from .hostile import gstr as _gstr
from .hostile import safetensors as _safetensors
from .pytorch_files import MARK, P2, SETITEMS, STACK_GLOBAL, STOP, f32, meta_tensor, pid, short, state_dict
from .pytorch_files import call as _call
from .pytorch_files import tensor as _tensor
from .pytorch_files import torch_zip as _torch_zip
from .test_adversarial import HUGE_NUMBERS

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _run(*args: str, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)


def _save(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    safetensors_numpy.save_file(tensors, str(path), metadata=metadata)
    return path


# ----------------------------------------------------------------------------- inspect


def test_inspect_prints_summary_and_table():
    path = str(FIXTURES / "numpy.safetensors")
    result = _run("inspect", path)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        path,
        "  format      safetensors",
        "  tensors     2",
        "  parameters  25",
        "  size        120 B",
        "  dtypes      float32  1 tensor  20 params  80 B",
        "              float64  1 tensor   5 params  40 B",
        "",
        "name    dtype    shape   size",
        "bias    float64  [5]     40 B",
        "weight  float32  [4, 5]  80 B",
    ]


def test_inspect_sharded_directory_and_metadata():
    result = _run("inspect", FIXTURES / "tiny-bert-sharded")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1:4] == ["  format      safetensors", "  files       3", "  tensors     39"]
    assert "  metadata    format = pt" in lines
    assert "  metadata    total_size = 79912" in lines
    assert any(line.split() == ["embeddings.word_embeddings.weight", "float32", "[99,", "32]", "12.7", "kB"]
               for line in lines)


def test_inspect_npz_with_big_endian_and_packed_types():
    result = _run("inspect", FIXTURES / "numpy" / "arrays.npz")
    assert result.exit_code == 0
    assert any(line.split()[:3] == ["big_endian", ">int32", "[6]"] for line in result.output.splitlines())
    result = _run("inspect", FIXTURES / "packed_fp4.safetensors")
    assert any(line.split()[:3] == ["fp4", "float4_e2m1fn", "[8]"] for line in result.output.splitlines())
    assert "  dtypes      float32        1 tensor  4 params  16 B" in result.output.splitlines()
    assert "              float4_e2m1fn  1 tensor  8 params   4 B" in result.output.splitlines()


def test_inspect_counts_bytes_by_ggml_type():
    result = _run("inspect", FIXTURES / "gguf" / "quantized.gguf")
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.output.splitlines():
        if line.startswith(("  dtypes", " " * 14)):
            parts = line.split()[1:] if line.startswith("  dtypes") else line.split()
            rows[parts[0]] = parts[1:]
    # 1024 values each: Q8_0 in 32-value blocks of 34 bytes, Q4_0 in blocks of 18, F32 4 bytes a value
    assert rows["Q8_0"] == ["1", "tensor", "1,024", "params", "1.1", "kB"]  # 32 * 34 = 1088 B
    assert rows["Q4_0"] == ["1", "tensor", "1,024", "params", "576", "B"]  # 32 * 18
    assert rows["float32"] == ["1", "tensor", "1,024", "params", "4.1", "kB"]
    assert len(rows) == 9


def test_inspect_elides_long_metadata():
    result = _run("inspect", FIXTURES / "ggml" / "ggjt_v3.bin")
    assert result.exit_code == 0, result.output
    tokens = next(line for line in result.output.splitlines() if "ggml.tokens" in line)
    with wio.open(FIXTURES / "ggml" / "ggjt_v3.bin") as ckpt:
        first = [str(ckpt.metadata["ggml.tokens"][i]) for i in range(3)]
        n = len(ckpt.metadata["ggml.tokens"])
    assert tokens == f"  metadata    ggml.tokens = [{', '.join(first)}, …] ({n:,} items)"


def test_inspect_elides_long_strings(tmp_path):
    path = _save(tmp_path / "m.safetensors", {"w": np.zeros(2, np.float32)}, {"note": "x" * 200, "nl": "a\nb"})
    lines = _run("inspect", path).output.splitlines()
    assert f"  metadata    note = {'x' * 79}…" in lines
    assert "  metadata    nl = a\\nb" in lines


def test_inspect_filter():
    result = _run("inspect", FIXTURES / "tiny-bert", "--filter", "encoder.layer.1.*.weight", "--filter", "pooler.*")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert "  filter      encoder.layer.1.*.weight pooler.*  (10 of 39 tensors)" in lines
    assert "  tensors     10" in lines
    names = [line.split()[0] for line in lines[lines.index("") + 2:]]
    assert names == ["encoder.layer.1.attention.output.LayerNorm.weight",
                     "encoder.layer.1.attention.output.dense.weight",
                     "encoder.layer.1.attention.self.key.weight", "encoder.layer.1.attention.self.query.weight",
                     "encoder.layer.1.attention.self.value.weight", "encoder.layer.1.intermediate.dense.weight",
                     "encoder.layer.1.output.LayerNorm.weight", "encoder.layer.1.output.dense.weight",
                     "pooler.dense.bias", "pooler.dense.weight"]


def test_inspect_tree_collapses_repeated_layers():
    result = _run("inspect", FIXTURES / "tiny-bert", "--tree")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    body = lines[lines.index("") + 1:]
    assert body[:9] == [
        "module                             params  dtype    shape",
        "embeddings                          5,344",
        "  LayerNorm                            64",
        "    bias                               32  float32  [32]",
        "    weight                             32  float32  [32]",
        "  position_embeddings.weight        2,048  float32  [64, 32]",
        "  token_type_embeddings.weight         64  float32  [2, 32]",
        "  word_embeddings.weight            3,168  float32  [99, 32]",
        "encoder.layer.{0..1}            2 × 6,789",
    ]
    assert body[-3:] == ["pooler.dense                        1,056",
                         "  bias                                 32  float32  [32]",
                         "  weight                            1,024  float32  [32, 32]"]
    assert 5344 + 2 * 6789 + 1056 == 19978  # the module counts add up to the checkpoint's parameters


def test_inspect_tree_breaks_runs_where_layers_differ(tmp_path):
    tensors = {f"blocks.{i}.w": np.zeros((2, 2) if i != 2 else (3, 2), np.float32) for i in range(5)}
    tensors.update({f"blocks.{i}.b": np.zeros(2, np.float32) for i in range(5)})
    tensors["blocks.10.w"] = np.zeros((2, 2), np.float32)
    tensors["blocks.10.b"] = np.zeros(2, np.float32)
    result = _run("inspect", _save(tmp_path / "m.safetensors", tensors), "--tree", "--depth", "2")
    body = result.output.splitlines()
    body = body[body.index("") + 2:]
    assert [line.split() for line in body] == [["blocks", "38"], ["{0..1}", "2", "×", "6"], ["2", "8"],
                                               ["{3..4}", "2", "×", "6"], ["10", "6"]]
    assert [line[:3] for line in body] == ["blo", "  {", "  2", "  {", "  1"]


def test_inspect_json_schema_against_the_safetensors_library():
    from safetensors import safe_open

    path = FIXTURES / "tiny-bert-sharded"
    result = _run("inspect", path, "--json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert list(doc) == ["schema", "path", "format", "files", "fetched", "filter", "filter_hints", "tensor_count",
                         "parameter_count", "nbytes", "dtypes", "metadata", "placeholders", "tensors"]
    assert doc["schema"] == "weightio.inspect/1" and doc["format"] == "safetensors" and doc["filter"] is None
    assert doc["fetched"] == {"requests": 0, "bytes": 0}  # local files: nothing fetched
    expected = {}
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(shard, "np") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                expected[name] = (sl.get_dtype(), sl.get_shape(), shard.name)
    assert {t["name"]: (t["dtype"], t["shape"], Path(t["file"]).name) for t in doc["tensors"]} == {
        n: ({"F32": "float32"}[d], s, f) for n, (d, s, f) in expected.items()}
    assert doc["tensor_count"] == len(expected) == 39
    assert doc["parameter_count"] == sum(math.prod(s) for _, s, _ in expected.values())
    assert doc["nbytes"] == 4 * doc["parameter_count"]
    assert doc["dtypes"] == [{"dtype": "float32", "tensors": 39, "parameters": 19978, "nbytes": 79912}]
    assert doc["metadata"] == {"format": "pt", "total_parameters": 19978, "total_size": 79912}
    assert set(doc["tensors"][0]) == {"name", "dtype", "ggml_type", "shape", "parameters", "nbytes", "file"}


def test_inspect_json_tree_and_gguf_values():
    doc = json.loads(_run("inspect", FIXTURES / "tiny-bert", "--json", "--tree", "--depth", "2").output)
    encoder = next(n for n in doc["tree"] if n["name"] == "encoder.layer.{0..1}")
    assert (encoder["repeat"], encoder["parameters"], encoder["tensor"]) == (2, 6789, None)
    assert [c["name"] for c in encoder["children"]] == ["attention", "intermediate.dense", "output"]
    assert all(c["children"] == [] for c in encoder["children"])  # --depth 2
    doc = json.loads(_run("inspect", FIXTURES / "gguf" / "quantized.gguf", "--json").output)
    q8 = next(t for t in doc["tensors"] if t["name"] == "w.q8_0")
    assert (q8["dtype"], q8["ggml_type"], q8["nbytes"]) == ("float32", "Q8_0", 1088)
    doc = json.loads(_run("inspect", FIXTURES / "ggml" / "ggjt_v3.bin", "--json").output)
    with wio.open(FIXTURES / "ggml" / "ggjt_v3.bin") as ckpt:
        assert doc["metadata"]["ggml.tokens"] == list(ckpt.metadata["ggml.tokens"])


# ----------------------------------------------------------------------------- convert


def test_convert_reports_and_verifies(tmp_path):
    out = tmp_path / "out.safetensors"
    result = _run("convert", FIXTURES / "tiny-bert", out, "--verify")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"wrote {out}: 39 tensors, 79.9 kB (safetensors)",
                                          "  verified: every tensor read back and compared byte for byte"]
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    again = _run("convert", FIXTURES / "tiny-bert", out)
    assert again.exit_code == 1
    assert again.stderr == f"weightio: error: {out}: already exists (pass --force to replace it)\n"
    assert _run("convert", FIXTURES / "tiny-bert", out, "--force", "-q").stdout == ""


def test_convert_sharded_with_notes(tmp_path):
    result = _run("convert", FIXTURES / "dtypes.safetensors", tmp_path / "x.npz", "--filter", "f32", "--filter", "i8")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"wrote {tmp_path / 'x.npz'}: 2 tensors, 120 B (npz)",
                                          "  note: metadata not kept: npz files cannot store metadata (2 entries)"]
    result = _run("convert", FIXTURES / "tiny-bert", str(tmp_path / "sharded") + "/", "--max-shard-size", "30kB")
    assert result.stdout.splitlines() == [
        f"wrote 3 shards + {tmp_path / 'sharded' / 'model.safetensors.index.json'}: 39 tensors, 79.9 kB (safetensors)",
        "  copied: 3 other files of the model directory (config.json, tokenizer.json, tokenizer_config.json)"]


def test_convert_prints_aliases_of_tied_weights(tmp_path):
    torch = pytest.importorskip("torch")
    embed = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save({"lm_head.weight": embed, "model.embed.weight": embed}, tmp_path / "m.bin")
    result = _run("convert", tmp_path / "m.bin", tmp_path / "m.safetensors")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1:] == [
        "  tied: 1 name of shared tensors written once, as aliases in the metadata:",
        "    model.embed.weight -> lm_head.weight"]
    diff = _run("diff", tmp_path / "m.bin", tmp_path / "m.safetensors")
    assert diff.exit_code == 0, diff.output
    assert "  = model.embed.weight ~ lm_head.weight" in diff.stdout.splitlines()


@pytest.mark.parametrize("args,message", [
    (["x.bin"], "Invalid value for DST: cannot tell the output format from suffix .bin"),
    (["x.safetensors", "--dtype", "bf17"], "Invalid value for '--dtype': unknown dtype 'bf17'"),
    (["x.safetensors", "--dtype", "int8"], "Invalid value for '--dtype': --dtype must be a floating-point type"),
    (["x.safetensors", "--max-shard-size", "5 parsecs"], "Invalid value for '--max-shard-size': size '5 parsecs'"),
    (["hf://org/model"], "writing to the Hub is not supported"),
    (["x.safetensors", "--format", "pickle"], "Invalid value for '--format'"),
])
def test_convert_usage_errors_exit_2(tmp_path, args, message):
    result = _run("convert", FIXTURES / "tiny-bert", *[str(tmp_path / a) if a.startswith("x.") else a for a in args])
    assert result.exit_code == 2 and message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_convert_dequantize_is_explained(tmp_path):
    result = _run("convert", FIXTURES / "gguf" / "quantized.gguf", tmp_path / "x.safetensors")
    assert result.exit_code == 1
    assert result.stderr == (f"weightio: error: {FIXTURES / 'gguf' / 'quantized.gguf'}: tensor 'w.q4_0': is Q4_0 "
                             "block-quantized (pass --dequantize to write it as float32, or write .gguf)\n")
    result = _run("convert", FIXTURES / "gguf" / "quantized.gguf", tmp_path / "x.safetensors", "--dequantize",
                  "--dtype", "bf16", "--filter", "w.q8_0")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {tmp_path / 'x.safetensors'}: 1 tensor, 2.0 kB")


# ----------------------------------------------------------------------------- diff


def _pair(tmp_path: Path, a: dict, b: dict) -> tuple[Path, Path]:
    return _save(tmp_path / "a.safetensors", a), _save(tmp_path / "b.safetensors", b)


def test_diff_equal_across_layouts_and_formats(tmp_path):
    result = _run("diff", FIXTURES / "tiny-bert", FIXTURES / "tiny-bert-sharded")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [f"A: {FIXTURES / 'tiny-bert'} (safetensors, 39 tensors)",
                                          f"B: {FIXTURES / 'tiny-bert-sharded'} (safetensors, 39 tensors)",
                                          "equal: 39 of 39 tensors present in both", "result: equal"]
    _run("convert", FIXTURES / "tiny-bert", tmp_path / "t.npz")
    assert _run("diff", FIXTURES / "tiny-bert", tmp_path / "t.npz").exit_code == 0
    assert _run("diff", FIXTURES / "models" / "bert" / "pytorch_model.bin",
                FIXTURES / "models" / "bert" / "model.safetensors").exit_code == 0


def test_diff_values_with_tolerances(tmp_path):
    # |a - b| = [0, 0.5, 0, 0.25]; relative to |b|: [0, 0.2, 0, 0.0625]
    a, b = _pair(tmp_path, {"w": np.array([1, 2, 3, 4], np.float32), "same": np.ones(3, np.float32)},
                 {"w": np.array([1, 2.5, 3, 4.25], np.float32), "same": np.ones(3, np.float32)})
    result = _run("diff", a, b)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[2:] == ["different values (1):",
                                              "  name  max abs  max rel  differing",
                                              "  w         0.5      0.2     2 of 4",
                                              "equal: 1 of 2 tensors present in both", "result: different"]
    assert _run("diff", a, b, "--atol", "0.5").exit_code == 0
    assert _run("diff", a, b, "--rtol", "0.2").exit_code == 0
    loose = _run("diff", a, b, "--rtol", "0.1")
    assert loose.exit_code == 1 and "  w         0.5      0.2     1 of 4" in loose.stdout.splitlines()


def test_diff_nan_inf_and_exact_integers(tmp_path):
    a, b = _pair(tmp_path, {"f": np.array([np.nan, np.inf, 1], np.float32), "i": np.array([2**62, 1], np.int64),
                            "g": np.array([np.nan, 0], np.float32)},
                 {"f": np.array([np.nan, np.inf, 1], np.float32), "i": np.array([2**62 + 1, 1], np.int64),
                  "g": np.array([1, 0], np.float32)})
    result = _run("diff", a, b)
    lines = result.stdout.splitlines()
    assert result.exit_code == 1
    assert ["g", "inf", "inf", "1", "of", "2"] in [line.split() for line in lines]  # NaN against a number
    assert ["i", "1", "2.1684e-19", "1", "of", "2"] in [line.split() for line in lines]  # float64 would see 0
    assert not any(line.split()[:1] == ["f"] for line in lines)  # NaN == NaN, inf == inf


def test_diff_names_dtypes_and_shapes(tmp_path):
    a, b = _pair(tmp_path, {"only_a": np.zeros(1, np.float32), "t": np.zeros(2, np.float32),
                            "s": np.zeros(2, np.float32)},
                 {"only_b": np.zeros(1, np.float32), "t": np.zeros(2, np.float16), "s": np.zeros(3, np.float32)})
    result = _run("diff", a, b)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[2:] == ["only in A (1):", "  - only_a", "only in B (1):", "  + only_b",
                                              "changed dtype or shape (2):",
                                              "  ~ s: float32 [2] -> float32 [3]  (values not compared: shapes differ)",
                                              "  ~ t: float32 [2] -> float16 [2]  (values equal)",
                                              "equal: 0 of 2 tensors present in both; equal values: 1 of 2",
                                              "result: different"]


def test_diff_ignore_dtype_compares_values(tmp_path):
    values = np.linspace(-3, 3, 50, dtype=np.float32)
    a, b = _pair(tmp_path, {"w": values}, {"w": values.astype(np.float16)})
    assert _run("diff", a, b).exit_code == 1
    assert _run("diff", a, b, "--ignore-dtype").exit_code == 1  # float16 rounding is a difference…
    assert _run("diff", a, b, "--ignore-dtype", "--rtol", "1e-3").exit_code == 0  # …within 2^-11


def test_diff_pairs_single_tensor_files_and_quiet(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(4, dtype=np.int32))
    np.save(tmp_path / "y.npy", np.arange(4, dtype=np.int32))
    result = _run("diff", tmp_path / "x.npy", tmp_path / "y.npy")
    assert result.exit_code == 0 and "  = x ~ y" in result.stdout.splitlines()
    np.save(tmp_path / "z.npy", np.arange(1, 5, dtype=np.int32))
    quiet = _run("diff", "-q", tmp_path / "x.npy", tmp_path / "z.npy")
    assert quiet.exit_code == 1 and quiet.output == ""


def test_diff_resolves_alias_metadata(tmp_path):
    a = _save(tmp_path / "a.safetensors", {"embed": np.ones(3, np.float32), "head": np.ones(3, np.float32)})
    b = _save(tmp_path / "b.safetensors", {"embed": np.ones(3, np.float32)}, {"head": "embed", "format": "pt"})
    assert _run("diff", a, b).exit_code == 0
    assert _run("diff", b, a).exit_code == 0


def test_diff_quantized_against_dequantized(tmp_path):
    _run("convert", FIXTURES / "gguf" / "quantized.gguf", tmp_path / "d.safetensors", "--dequantize")
    result = _run("diff", FIXTURES / "gguf" / "quantized.gguf", tmp_path / "d.safetensors", "--ignore-dtype")
    assert result.exit_code == 0, result.output
    assert "changed dtype or shape (8):" in result.stdout  # Q4_0 -> float32, …


# ----------------------------------------------------------------------------- show


def _show(path, name, *more):
    result = _run("show", path, name, *more)
    assert result.exit_code == 0, result.output
    return dict((line[2:11].strip(), line[12:]) for line in result.stdout.splitlines()[1:])


def test_show_statistics_match_numpy(tmp_path):
    values = np.array([[1.5, -2.0, np.nan], [np.inf, 0.25, 3.0]], dtype=np.float32)
    path = _save(tmp_path / "a.safetensors", {"w": values})
    fields = _show(path, "w", "-n", "4")
    finite = values[np.isfinite(values)].astype(np.float64)
    assert fields["dtype"] == "float32" and fields["shape"] == "[2, 3]" and fields["size"] == "24 B (6 values)"
    assert (fields["min"], fields["max"]) == (f"{finite.min():.6g}", f"{finite.max():.6g}")
    assert (fields["mean"], fields["std"]) == (f"{finite.mean():.6g}", f"{finite.std():.6g}")
    assert (fields["nan"], fields["inf"]) == ("1", "1")
    assert fields["values"] == "[1.5, -2, nan, inf]  (first 4 of 6)"


def test_show_integers_are_exact(tmp_path):
    path = _save(tmp_path / "a.safetensors", {"i": np.array([2**62 + 1, -5, 7], np.int64)})
    fields = _show(path, "i")
    assert fields["min"] == "-5" and fields["max"] == f"{2**62 + 1:,}"
    assert "nan" not in fields and fields["values"] == f"[{2**62 + 1}, -5, 7]"


def test_show_quantized_tensor_against_gguf():
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(FIXTURES / "gguf" / "quantized.gguf")
    tensor = next(t for t in reader.tensors if t.name == "w.q4_0")
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
    fields = _show(FIXTURES / "gguf" / "quantized.gguf", "w.q4_0")
    assert fields["dtype"] == "Q4_0 (block-quantized; values dequantized to float32)"
    assert fields["min"] == f"{values.min():.6g}" and fields["max"] == f"{values.max():.6g}"
    assert fields["mean"] == f"{values.mean():.6g}"


def test_the_cli_uses_only_the_public_api():
    import ast
    import importlib

    allowed_modules = {"weightio", "weightio.stats", "weightio.convert", "weightio.formats", "weightio.dtypes",
                       "weightio.limits", "weightio.hub", "weightio.remote", "weightio.text"}
    for source in (FIXTURES.parent / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("weightio"):
                assert node.module in allowed_modules, (source.name, node.module)
                public = importlib.import_module(node.module).__all__
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}" in allowed_modules
                    assert alias.name in public or submodule, (source.name, node.module, alias.name)
            elif isinstance(node, ast.Import):
                assert all(a.name == "weightio" or not a.name.startswith("weightio") for a in node.names), source.name


def test_a_local_inspect_imports_no_event_loop_no_thread_pool_and_no_converter():
    # asyncio (~45 ms with ssl), weightio.convert (~20 ms) and concurrent.futures (logging) are
    # imported by the commands and paths that use them, not by every start of the program.
    code = ("import sys, json, io, contextlib; from weightio.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    main(['inspect', sys.argv[1]], standalone_mode=False)\n"
            "print(json.dumps([out.getvalue().count('\\n'), sorted(m for m in sys.modules if m in "
            "('asyncio', 'ssl', 'concurrent.futures', 'logging', 'weightio.convert', 'weightio.model_files', "
            "'fsspec', 'huggingface_hub', 'tqdm'))]))")
    found = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "tiny-bert")], capture_output=True, text=True,
                           check=True, timeout=60).stdout
    lines, heavy = json.loads(found.splitlines()[-1])
    assert lines > 39 and heavy == []  # (the listing of the 39 tensors was printed)


def test_the_exit_status_comes_from_one_table():
    from weightio.cli import exit_code

    assert [exit_code(e) for e in (wio.UsageError("x"), wio.CorruptFileError("x"), FileNotFoundError(),
                                   BrokenPipeError(), KeyboardInterrupt(), SystemExit(0), RuntimeError())] == [
        2, 1, 1, 141, 130, None, None]


def test_a_usage_error_found_by_the_library_exits_2():
    result = _run("diff", FIXTURES / "tiny-bert", FIXTURES / "tiny-bert", "--atol", "nan")
    assert result.exit_code == 2
    assert result.stderr == "weightio: error: atol must be a number >= 0, got nan\n"


def test_show_packed_and_unknown_names():
    fields = _show(FIXTURES / "packed_fp4.safetensors", "fp4")
    assert fields["bytes"] == "21 43 65 87  (packed sub-byte type: numpy cannot show its values)"
    result = _run("show", FIXTURES / "tiny-bert", "pooler.dense.weigth")
    assert result.exit_code == 1
    assert result.stderr == (f"weightio: error: {FIXTURES / 'tiny-bert'}: tensor 'pooler.dense.weigth': no such "
                             "tensor; did you mean 'pooler.dense.weight', 'pooler.dense.bias'?\n")


@settings(max_examples=60, deadline=None)
@given(arr=hnp.arrays(np.float32, st.integers(1, 300), elements=st.floats(-1e6, 1e6, width=32)),
       chunk=st.integers(1, 64))
def test_stats_over_slices_equal_numpy_over_the_whole(tmp_path_factory, arr, chunk):
    from weightio import stats as _stats

    path = tmp_path_factory.mktemp("s") / "a.safetensors"
    _save(path, {"w": arr.reshape(-1, 1)})
    with wio.open(path) as ckpt:
        stats = _stats.Stats()
        for part in _stats.chunks(ckpt["w"], chunk):
            stats.add(part)
    wide = arr.astype(np.float64)
    assert (stats.minimum, stats.maximum, stats.count) == (float(wide.min()), float(wide.max()), arr.size)
    assert math.isclose(stats.mean, wide.mean(), rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(stats.std, wide.std(), rel_tol=1e-9, abs_tol=1e-6)


# ----------------------------------------------------------------------------- scan


def _malicious_pickle(path: Path, marker: Path) -> Path:
    """A pickle that calls os.system("touch <marker>") when loaded with pickle.load."""
    command = f"touch {marker}".encode()
    path.write_bytes(b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(command)) + command + b"\x85R.")
    return path


def test_scan_refuses_code_and_runs_nothing(tmp_path):
    marker = tmp_path / "was-run"
    bad = _malicious_pickle(tmp_path / "pytorch_model.bin", marker)
    result = _run("scan", bad)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{bad}: UNSAFE (pytorch)"
    assert "    globals: os.system (refused)" in lines
    assert lines[-1] == "result: UNSAFE"
    assert not marker.exists()
    assert _run("scan", bad, "-q").output == ""


def test_scan_safe_checkpoints():
    result = _run("scan", FIXTURES / "models" / "bert" / "pytorch_model.bin")
    assert result.exit_code == 0, result.output
    assert "    globals: torch._utils._rebuild_tensor_v2, torch.FloatStorage, collections.OrderedDict" in \
        result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == "result: safe"
    result = _run("scan", FIXTURES / "tiny-bert")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"{FIXTURES / 'tiny-bert' / 'model.safetensors'}: safe (safetensors; no code can be stored in this format)",
        "  weightio: weightio reads it",
        "skipped 3 file(s) that are no checkpoint: config.json, tokenizer.json, tokenizer_config.json",
        "result: safe"]


def test_scan_json(tmp_path):
    doc = json.loads(_run("scan", FIXTURES / "pytorch" / "whole_module.pt", "--json").stdout)
    assert doc["safe"] is False and doc["files"][0]["format"] == "pytorch"
    assert "torch.nn.modules.container.Sequential" in doc["files"][0]["pickles"][0]["refused"]


# ----------------------------------------------------------------------------- conventions

COMMANDS = ["inspect", "convert", "scan", "diff", "show", "download"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_examples(command):
    result = _run(command, "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.output and f"  weightio {command} " in result.output
    assert "--quiet" in result.output and "--debug" in result.output


def test_errors_are_one_line_on_stderr_with_exit_code_1(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\0\0\0\0\0\0\0{}")
    result = _run("inspect", bad)
    assert result.exit_code == 1
    assert result.stderr == f"weightio: error: {bad}: header length 16 runs past the end of the file (10 bytes)\n"
    assert result.stdout == ""
    missing = _run("inspect", tmp_path / "nope")
    assert missing.exit_code == 1 and missing.stderr.endswith("nope: no such file or directory\n")


def test_debug_shows_the_traceback_before_or_after_the_command(tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x09\x09" + b"\0" * 8)
    for args in (["--debug", "inspect", bad], ["inspect", bad, "--debug"]):
        result = _run(*args)
        assert result.exit_code == 1 and type(result.exception).__name__ == "FormatError"


def test_usage_errors_exit_2():
    assert _run("inspect").exit_code == 2
    assert _run("frobnicate").exit_code == 2
    assert _run("diff", FIXTURES / "tiny-bert").exit_code == 2


def test_colour_only_when_allowed(tmp_path, monkeypatch):
    a, b = _pair(tmp_path, {"x": np.zeros(1, np.float32), "z": np.zeros(1, np.float32)},
                 {"y": np.zeros(1, np.float32), "z": np.zeros(1, np.float32)})
    coloured = CliRunner().invoke(main, ["diff", str(a), str(b)], color=True)
    assert "\x1b[31m  - x" not in coloured.output and "  \x1b[31m- x\x1b[0m" in coloured.output
    plain = CliRunner().invoke(main, ["diff", str(a), str(b)], color=True, env={"NO_COLOR": "1"})
    assert "\x1b[" not in plain.output and "  - x" in plain.output
    error = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope")], color=True, env={"NO_COLOR": "1"})
    assert error.stderr.startswith("weightio: error: ")


def test_interrupt_exits_130_with_one_line(monkeypatch):
    import weightio.cli.inspect as inspect_module

    def interrupted(path, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_module.weightio, "open", interrupted)
    result = _run("inspect", FIXTURES / "tiny-bert")
    assert result.exit_code == 130 and result.stderr == "\nweightio: interrupted\n"


def test_version():
    result = _run("--version")
    assert result.exit_code == 0 and result.output == f"weightio, version {wio.__version__}\n"


def _installed() -> str:
    """The console script of the environment running the tests (its scripts directory: a venv
    need not be activated), else the one on PATH."""
    exe = shutil.which("weightio", path=sysconfig.get_path("scripts")) or shutil.which("weightio")
    if exe is None:
        pytest.skip("no weightio console script in the interpreter's scripts directory or on PATH "
                    "(package not installed)")
    return exe


def test_installed_entry_point_runs(tmp_path):
    exe = _installed()
    out = subprocess.run([exe, "inspect", str(FIXTURES / "tiny-bert")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "  tensors     39" in out.stdout
    converted = tmp_path / "t.npz"
    out = subprocess.run([exe, "convert", str(FIXTURES / "tiny-bert"), str(converted), "--verify"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == ""
    same = subprocess.run([exe, "diff", "-q", str(FIXTURES / "tiny-bert"), str(converted)], capture_output=True,
                          timeout=60)
    assert same.returncode == 0 and same.stdout == b""


def test_python_dash_m_and_broken_pipe():
    module = subprocess.run([sys.executable, "-m", "weightio.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert module.returncode == 0 and module.stdout.startswith("weightio, version")
    proc = subprocess.Popen([_installed(), "inspect", str(FIXTURES / "tiny-bert")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline() == f"{FIXTURES / 'tiny-bert'}\n".encode()
    proc.stdout.close()  # like `| head -1`
    errors = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) in (0, 141) and errors == b""


def test_progress_bar_only_on_a_terminal_and_not_quiet(monkeypatch):
    import io

    import click
    from weightio.cli import _options

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with click.Context(main, obj={}):
        with _options.progress_bar(2000, "converting") as bar:
            assert not bar.disable
            bar.update(2000)
        assert "converting:   0%" in terminal.getvalue() and "0.00/2.00k" in terminal.getvalue()
    with click.Context(main, obj={"quiet": True}):
        assert _options.progress_bar(10, "x") is None
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with click.Context(main, obj={}):
        assert _options.progress_bar(10, "x") is None


def test_a_convert_off_a_terminal_imports_no_progress_bar(tmp_path):
    # tqdm takes ~80 ms to import: a convert in a script or a pipeline, which shows no bar, skips it
    code = ("import sys, json, io, contextlib; from weightio.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['convert', sys.argv[1], sys.argv[2]], standalone_mode=False)\n"
            "print(json.dumps('tqdm' in sys.modules))")
    out = tmp_path / "x.npz"
    found = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "tiny-bert" / "model.safetensors"), str(out)],
                           capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(found.splitlines()[-1]) is False
    with wio.open(FIXTURES / "tiny-bert" / "model.safetensors") as src, wio.open(out) as dst:
        assert sorted(dst) == sorted(src) and all(dst[k].numpy().tobytes() == src[k].numpy().tobytes() for k in src)


# ------------------------------------------------------------------------ hostile text and names (issue 12, class 6)

ESC_NAME = "w\x1b]0;owned\x07\x1b[2J\x1b[1;1Hresult: safe\x9b2K\u202e"  # OSC title, clear screen, C1 CSI, bidi
_UNSAFE_OUTPUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_F4 = np.arange(4, dtype="<f4").tobytes()


def _escapes_in_names() -> bytes:
    return _safetensors({"__metadata__": {"title\x1b]2;x\x07": "v\x1b[31m\u202e"}, ESC_NAME: _f32_entry(0)}, bytes(4))


def _zip_slip_names() -> bytes:
    return _safetensors({"../../../tmp/weightio-slip": _f32_entry(0), "/etc/abs": _f32_entry(4)}, bytes(8))


def _gguf_not_utf8() -> bytes:
    return _gguf([_gkv("general.name", _GSTRING, _gstr(b"caf\xe9 \xff")), _gkv("t\x1b[2J", _GSTRING, _gstr("x\x07"))],
                 [_ginfo("t", (4,))], _F4 + bytes(16))


def _pickle_surrogate_metadata() -> bytes:
    w = _tensor(pid("FloatStorage", "0", 3), 0, (3,), (1,))
    return _torch_zip(P2 + b"}" + MARK + short("w") + w + short("note") + b"X\x03\x00\x00\x00\xed\xa0\x80"
                      + SETITEMS + STOP, {"0": f32(1, 2, 3)})


def _giant_meta_shape() -> bytes:
    return _torch_zip(state_dict({"w": meta_tensor((10**5000, 2))}), {})


def _escape_in_a_pickle_global() -> bytes:
    return P2 + short("os\x1b[2J") + short("system\x07") + STACK_GLOBAL + _call("builtins", "tuple") + b"R" + STOP


# (name, file name, bytes, arguments ({path}, {out}), exit status, words the output must hold)
CLI_HOSTILE = [
    ("inspect: ESC, OSC, C1 and bidi in a name and metadata", "e.safetensors", _escapes_in_names,
     ["inspect", "{path}"], 0, ["w\\x1b]0;owned\\x07\\x1b[2J", "\\x9b2K\\u202e", "title\\x1b]2;x\\x07 = v\\x1b[31m"]),
    ("inspect --tree: the same name", "e.safetensors", _escapes_in_names, ["inspect", "{path}", "--tree"], 0,
     ["w\\x1b]0;owned"]),
    ("inspect --json: valid JSON, controls as \\u escapes", "e.safetensors", _escapes_in_names,
     ["inspect", "{path}", "--json"], 0, ['"w\\u001b]0;owned\\u0007\\u001b[2J', "\\u009b2K\\u202e"]),
    ("show: the name in the header line", "e.safetensors", _escapes_in_names, ["show", "{path}", ESC_NAME], 0,
     ["w\\x1b]0;owned"]),
    ("show: a missing name in the error message", "e.safetensors", _escapes_in_names,
     ["show", "{path}", "nope\x1b[2J"], 1, ["tensor 'nope\\x1b[2J': no such tensor"]),
    ("diff: names only in one file", "e.safetensors", _escapes_in_names,
     ["diff", "{path}", str(FIXTURES / "numpy.safetensors")], 1, ["- w\\x1b]0;owned", "result: different"]),
    ("scan: a pickle global holding ESC and BEL", "g.pkl", _escape_in_a_pickle_global, ["scan", "{path}"], 1,
     ["os\\x1b[2J", "result: UNSAFE"]),
    ("convert: a file name with ESC in the summary", "e.safetensors", _escapes_in_names,
     ["convert", "{path}", "{out}\x1b[2J.safetensors"], 0, ["wrote ", "\\x1b[2J.safetensors"]),
    ("convert to npz: a zip-slip name is refused before anything is written", "s.safetensors", _zip_slip_names,
     ["convert", "{path}", "{out}.npz"], 2, ["tensor '../../../tmp/weightio-slip': cannot be an .npz member name"]),
    ("convert to safetensors: GGUF metadata that is not UTF-8, escaped", "m.gguf", _gguf_not_utf8,
     ["convert", "{path}", "{out}.safetensors"], 0, ["written with backslash escapes"]),
    ("convert to GGUF: GGUF metadata that is not UTF-8, kept as its bytes", "m.gguf", _gguf_not_utf8,
     ["convert", "{path}", "{out}.gguf"], 0, ["wrote "]),
    ("convert to safetensors: a lone surrogate in pickle metadata", "p.pt", _pickle_surrogate_metadata,
     ["convert", "{path}", "{out}.safetensors"], 0, ["'note'", "written with backslash escapes"]),
    ("inspect: a meta tensor of a 16 610-bit dimension", "meta.pt", _giant_meta_shape, ["inspect", "{path}"], 1,
     ["size (~1.00e5000, 2) (a dimension of 2^63 or more of float32) is too large for any tensor"]),
    ("convert: a meta tensor of a 16 610-bit dimension", "meta.pt", _giant_meta_shape,
     ["convert", "{path}", "{out}.safetensors"], 1, ["is too large for any tensor"]),
]


@pytest.mark.parametrize("case", CLI_HOSTILE, ids=[c[0] for c in CLI_HOSTILE])
def test_hostile_text_and_names_reach_the_terminal_harmless(tmp_path, case):
    """Every human-readable output escapes what a terminal acts on (the escapes stay visible); JSON
    stays valid JSON holding the same strings; no traceback; writers refuse names their readers refuse."""
    _, file_name, build, args, code, words = case
    path = tmp_path / file_name
    path.write_bytes(build())
    argv = [a.format(path=path, out=tmp_path / "out") for a in args]
    result = CliRunner().invoke(main, argv, color=True)
    assert result.exit_code == code, (result.output, result.exception)
    assert not isinstance(result.exception, (ValueError, UnicodeError)) or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    output = result.output
    if "--json" in args:
        doc = json.loads(output)
        assert ESC_NAME in [t["name"] for t in doc["tensors"]]
    else:
        output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # weightio's own colours (click.style) are allowed
    assert _UNSAFE_OUTPUT.search(output) is None, repr(output)
    for word in words:
        assert word in output, (word, output)
    outputs = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out"))
    assert bool(outputs) == (args[0] == "convert" and code == 0), outputs
    for out in outputs:  # what convert wrote, its own reader reads back
        with wio.open(tmp_path / out) as ckpt:
            list(ckpt.metadata.items())


def test_convert_keeps_undecodable_gguf_bytes_for_gguf_and_escapes_them_for_safetensors(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_not_utf8())
    for suffix in (".gguf", ".safetensors"):
        assert _run("convert", path, tmp_path / f"o{suffix}").exit_code == 0
    with wio.open(tmp_path / "o.gguf") as ckpt:
        assert ckpt.metadata["general.name"].encode("utf-8", "surrogateescape") == b"caf\xe9 \xff"
    with wio.open(tmp_path / "o.safetensors") as ckpt:
        assert ckpt.metadata["general.name"] == "caf\\xe9 \\xff"


@pytest.mark.parametrize("suffix, name", [(".npz", "../x"), (".npz", "/abs"), (".npz", "a/../../b"), (".npz", ""),
                                          (".safetensors", "__metadata__"), (".safetensors", "a\x00b"),
                                          (".safetensors", "x\ud800"), (".gguf", "x\udcff"), (".npz", "x\ud800"),
                                          (".gguf", "n" * 70_000)])
def test_every_writer_refuses_names_its_reader_refuses_before_writing(tmp_path, suffix, name):
    out = tmp_path / f"x{suffix}"
    with pytest.raises(wio.UsageError) as info:
        wio.save({name: np.zeros(2, np.float32)}, out)
    assert info.value.tensor == name or "names must be non-empty" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_the_library_writers_refuse_metadata_they_cannot_store(tmp_path):
    with pytest.raises(wio.UsageError, match="metadata 'k': safetensors cannot store a lone surrogate"):
        wio.save({"a": np.zeros(1, np.float32)}, tmp_path / "x.safetensors", {"k": "a\ud800"})
    with pytest.raises(wio.UsageError, match="metadata key 'k\\\\ud800': GGUF cannot store a name holding a lone"):
        wio.save({"a": np.zeros(1, np.float32)}, tmp_path / "x.gguf", {"k\ud800": "v"})
    with pytest.raises(wio.FormatError, match="stands for no byte"):
        wio.save({"a": np.zeros(1, np.float32)}, tmp_path / "x.gguf", {"k": "a\ud800"})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", HUGE_NUMBERS, ids=lambda c: f"{c.fmt}: {c.name}")
def test_numbers_too_large_to_print_reach_the_cli_cleanly(tmp_path, case):
    path = tmp_path / f"hostile{case.suffix}"
    path.write_bytes(case.build(tmp_path / "marker"))
    for args in (["inspect", path], ["inspect", path, "--json"], ["convert", path, tmp_path / "o.safetensors"]):
        result = _run(*args)
        assert result.exit_code in (0, 1), (args, result.output, result.exception)
        assert "Traceback" not in result.output and not isinstance(result.exception, ValueError)
        if result.exit_code == 1:
            assert case.message in result.output, result.output


def test_describing_a_large_value_never_copies_it():
    """`text.describe` looks at 4 items of a container: a million-item header list is not copied."""
    import tracemalloc

    from weightio.text import describe

    big = list(range(1_000_000))
    tracemalloc.start()
    try:
        text = describe({"shape": big})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == "{'shape': [0, 1, 2, 3, …]}"
    assert peak < 64 * 1024, peak
