"""The weightio command: inspect (through CliRunner and the installed entry point)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from click.testing import CliRunner

from weightio.cli import main

from .conftest import FIXTURES


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


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
        "",
        "name    dtype    shape   size",
        "bias    float64  [5]     40 B",
        "weight  float32  [4, 5]  80 B",
    ]


def test_inspect_sharded_directory_and_metadata():
    result = _run("inspect", str(FIXTURES / "tiny-bert-sharded"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1:4] == ["  format      safetensors", "  files       3", "  tensors     39"]
    assert "  metadata    format = pt" in lines
    assert "  metadata    total_size = 79912" in lines
    assert any(line.split() == ["embeddings.word_embeddings.weight", "float32", "[99,", "32]", "12.7", "kB"]
               for line in lines)


def test_inspect_npz_with_big_endian_and_packed_types():
    result = _run("inspect", str(FIXTURES / "numpy" / "arrays.npz"))
    assert result.exit_code == 0
    assert any(line.split()[:3] == ["big_endian", ">int32", "[6]"] for line in result.output.splitlines())
    result = _run("inspect", str(FIXTURES / "packed_fp4.safetensors"))
    assert any(line.split()[:3] == ["fp4", "float4_e2m1fn", "[8]"] for line in result.output.splitlines())


def test_errors_are_one_line_on_stderr_with_exit_code_1(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\0\0\0\0\0\0\0{}")
    result = CliRunner().invoke(main, ["inspect", str(bad)])
    assert result.exit_code == 1
    assert result.stderr == f"weightio: error: {bad}: header length 16 runs past the end of the file (10 bytes)\n"
    assert result.stdout == ""
    missing = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and missing.stderr.endswith("nope: no such file or directory\n")


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x09\x09" + b"\0" * 8)
    result = CliRunner().invoke(main, ["--debug", "inspect", str(bad)])
    assert result.exit_code == 1 and type(result.exception).__name__ == "FormatError"


def test_usage_errors_exit_2():
    assert _run("inspect").exit_code == 2
    assert _run("frobnicate").exit_code == 2


def test_help_has_examples():
    result = _run("inspect", "--help")
    assert result.exit_code == 0 and "weightio inspect model.safetensors" in result.output


def test_installed_entry_point_runs():
    exe = shutil.which("weightio")
    if exe is None:
        pytest.skip("the weightio console script is not on PATH (package not installed)")
    out = subprocess.run([exe, "inspect", str(FIXTURES / "tiny-bert")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "  tensors     39" in out.stdout
