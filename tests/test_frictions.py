"""The frictions a new user hit (issue 17), each pinned by the exact words weightio now says."""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import struct
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio.convert import convert
from weightio.errors import Advice, UnsupportedDTypeError, UsageError, WriteError, WriteFileExistsError

from .conftest import FIXTURES

PT = FIXTURES / "pytorch"
BERT_BIN = FIXTURES / "models" / "bert" / "pytorch_model.bin"


def _run(*args: object, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)


def _os_system_pickle(path: Path, marker: Path) -> Path:
    """A pickle that runs ``touch <marker>`` when pickle.load reads it."""
    command = f"touch {marker}".encode()
    path.write_bytes(b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(command)) + command + b"\x85R.")
    return path


# ----------------------------------------------------------------------------- scan: one verdict


def test_scan_of_a_safe_torch_file_explains_fickling_in_the_terms_of_its_verdict():
    pytest.importorskip("fickling")
    result = _run("scan", BERT_BIN)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{BERT_BIN}: safe (pytorch)",
        "  weightio: weightio reads it",
        "  pytorch_model/data.pkl (4,093 bytes)",
        "    globals: torch._utils._rebuild_tensor_v2, torch.FloatStorage, collections.OrderedDict",
        "    fickling: 42 findings (LIKELY_UNSAFE by its default analyses, LIKELY_SAFE by its ML allowlist), "
        "benign here:",
        "      each is about one of these, which weightio accepts without importing or calling anything:",
        "      - torch._utils._rebuild_tensor_v2: a torch tensor rebuild function: weightio records its arguments "
        "instead of calling it",
        "      - torch.FloatStorage: a torch storage class: read as the dtype of the stored bytes, never constructed",
        "result: safe"]
    assert "[LIKELY_UNSAFE]" not in result.stdout


def test_scan_json_is_versioned_and_its_verdict_is_weightios():
    pytest.importorskip("fickling")
    doc = json.loads(_run("scan", BERT_BIN, "--json").stdout)
    assert doc["schema"] == "weightio.scan/1" and doc["safe"] is True
    (pickle_doc,) = doc["files"][0]["pickles"]
    assert "severity" not in pickle_doc and pickle_doc["allowed"] is True
    assert pickle_doc["roles"]["torch.FloatStorage"] == ("a torch storage class: read as the dtype of the stored "
                                                         "bytes, never constructed")
    fickling = pickle_doc["fickling"]
    assert (fickling["ran"], fickling["default_analyses"], fickling["ml_allowlist"], fickling["explained"]) == \
        (True, "LIKELY_UNSAFE", "LIKELY_SAFE", True)
    assert all(f["explained"] and f["about"] for f in fickling["findings"])


def test_scan_builds_on_torch_state_are_explained_as_build():
    pytest.importorskip("fickling")
    (p,) = wio.scan(PT / "resnet18_like.pth").files[0].pickles
    builds = [f for f in p.findings if f.trigger and ".update(" in f.trigger]
    assert builds and all(f.about == ("BUILD",) and p.explained(f) for f in builds)
    assert not p.unexplained


def test_scan_still_shows_fickling_on_a_malicious_pickle(tmp_path):
    pytest.importorskip("fickling")
    marker = tmp_path / "was-run"
    bad = _os_system_pickle(tmp_path / "evil.bin", marker)
    result = _run("scan", bad)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        f"{bad}: UNSAFE (pytorch)",
        "  weightio: UnsafePickleError: pickle 1: the pickle asks for global 'os.system', which is not on weightio's "
        "allowlist; nothing was imported or run (to read its tensors without running it, pass --unknown-globals "
        "placeholder)",
        f"  pickle 1 (bytes 0..{bad.stat().st_size}) ({bad.stat().st_size} bytes)"]
    assert "    fickling: LIKELY_OVERTLY_MALICIOUS (default analyses), LIKELY_UNSAFE (ML allowlist)" in lines
    assert ("      - [LIKELY_OVERTLY_MALICIOUS] UnsafeImports: `from os import system` is suspicious and indicative "
            "of an overtly malicious pickle file") in lines
    assert lines[-1] == "result: UNSAFE"
    doc = json.loads(_run("scan", bad, "--json").stdout)
    fickling = doc["files"][0]["pickles"][0]["fickling"]
    assert fickling["explained"] is False and not any(f["explained"] for f in fickling["findings"])
    assert doc["files"][0]["advice"] == {
        "python": "to read its tensors without running it, pass unknown_globals='placeholder'",
        "cli": "to read its tensors without running it, pass --unknown-globals placeholder"}
    assert not marker.exists()


# ----------------------------------------------------------------------------- advice in the caller's words


def test_advice_is_python_in_python_and_cli_in_the_cli(tmp_path):
    out = tmp_path / "out.npz"
    wio.save({"w": wio.load(FIXTURES / "numpy.safetensors")["weight"]}, out)
    with pytest.raises(WriteFileExistsError) as info:
        wio.save({"w": wio.load(FIXTURES / "numpy.safetensors")["weight"]}, out)
    assert str(info.value) == f"{out}: already exists (pass overwrite=True to replace it)"
    assert info.value.render(cli=True) == f"{out}: already exists (pass --force to replace it)"
    result = _run("convert", FIXTURES / "numpy.safetensors", out)
    assert result.exit_code == 1
    assert result.stderr == f"weightio: error: {out}: already exists (pass --force to replace it)\n"


def test_every_known_advice_has_a_cli_spelling(tmp_path):
    whole = PT / "whole_module.pt"
    python = _run("inspect", whole)
    assert python.exit_code == 1
    assert python.stderr.endswith("nothing was imported or run (to read its tensors without running it, pass "
                                  "--unknown-globals placeholder)\n")
    assert "unknown_globals=" not in python.stderr
    quantized = FIXTURES / "gguf" / "quantized.gguf"
    with pytest.raises(UnsupportedDTypeError, match=r"block-quantized \(pass dequantize=True to write it as float32, "
                                                    r"or write \.gguf\)"):
        convert(quantized, tmp_path / "q.safetensors")
    header = _run("inspect", FIXTURES / "numpy.safetensors", "--max-header-bytes", "100")
    assert header.stderr.endswith("exceeds the 100-byte limit (raise it with --max-header-bytes or "
                                  "WEIGHTIO_MAX_HEADER_BYTES if the file is trusted)\n")
    with pytest.raises(UsageError) as where:
        wio.open(FIXTURES / "numpy.safetensors", download=True)
    assert str(where.value).endswith("applies to hf:// paths only (drop download=True)")
    assert where.value.render(cli=True).endswith("applies to hf:// paths only (drop --download)")


def test_advice_survives_pickling():
    error = WriteError("already exists", path="x", advice=Advice("pass overwrite=True", "pass --force"))
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and again.render(cli=True) == "x: already exists (pass --force)"
    assert str(again) == "x: already exists (pass overwrite=True)"


# ----------------------------------------------------------------------------- open: bytes paths and file objects


def test_open_takes_a_bytes_path():
    with wio.open(os.fsencode(FIXTURES / "numpy.safetensors")) as ckpt:
        assert ckpt.files == [str(FIXTURES / "numpy.safetensors")] and list(ckpt) == ["bias", "weight"]
    report = wio.scan(os.fsencode(FIXTURES / "numpy.safetensors"))
    assert report.safe


def test_open_maps_a_file_object_and_leaves_it_open():
    path = FIXTURES / "numpy.safetensors"
    expected = wio.load(path)
    with open(path, "rb") as f:
        f.seek(3)
        with wio.open(f) as ckpt:
            assert ckpt.files == [str(path)]
            weight = ckpt["weight"].numpy()
            assert (weight == expected["weight"]).all() and not weight.flags.writeable
        assert not f.closed and f.tell() == 3 and f.read(5) == path.read_bytes()[3:8]


def test_a_file_object_without_a_str_name_is_named_by_its_descriptor():
    with tempfile.TemporaryFile() as f:
        f.write((FIXTURES / "gguf" / "metadata.gguf").read_bytes())
        f.flush()
        with wio.open(f) as ckpt:
            assert ckpt.files == [f"<fd {f.fileno()}>"] and ckpt.format == "gguf"
            assert ckpt["bias"].numpy().tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("thing,what", [(io.BytesIO(b"PK"), "an object of type BytesIO"), (3, "an object of type int")])
def test_what_cannot_be_mapped_is_a_usage_error_saying_what_is_accepted(thing, what):
    with pytest.raises(UsageError) as info:
        wio.open(thing)
    assert str(info.value) == (f"cannot open {what}: weightio.open takes a path (str, bytes or os.PathLike), a URL, "
                               "or a file object with a real file descriptor (fileno()), which it maps; write "
                               "in-memory bytes to a file first")


def test_a_closed_file_object_and_a_socket_are_refused(tmp_path):
    with open(FIXTURES / "numpy.safetensors", "rb") as f:
        pass
    with pytest.raises(UsageError, match="^cannot open a closed file: weightio.open takes"):
        wio.open(f)
    a, b = socket.socketpair()
    with a, b, pytest.raises(wio.InputError, match=r"is a socket, not a checkpoint file$"):
        wio.open(a)


# ----------------------------------------------------------------------------- outputs: --parents


def test_convert_into_a_missing_directory_asks_for_parents(tmp_path):
    out = tmp_path / "missing" / "dir" / "out.safetensors"
    result = _run("convert", FIXTURES / "numpy.safetensors", out)
    assert result.exit_code == 1
    assert result.stderr == (f"weightio: error: {out}: the directory {out.parent} does not exist "
                             "(pass --parents to create it)\n")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(WriteError) as info:
        convert(FIXTURES / "numpy.safetensors", out)
    assert str(info.value).endswith("does not exist (pass parents=True to create it)")
    result = _run("convert", FIXTURES / "numpy.safetensors", out, "--parents")
    assert result.exit_code == 0 and result.stdout == f"wrote {out}: 2 tensors, 120 B (safetensors)\n"
    # a directory destination itself is created, as mkdir does; its parent must exist
    assert _run("convert", FIXTURES / "tiny-bert", tmp_path / "new-model", "-q").exit_code == 0
    deeper = _run("convert", FIXTURES / "tiny-bert", tmp_path / "a" / "b" / "model")
    assert deeper.stderr.endswith(f": the directory {tmp_path / 'a' / 'b'} does not exist (pass --parents to "
                                  "create it)\n")


def test_download_into_a_missing_directory_asks_for_parents(tmp_path):
    pytest.importorskip("huggingface_hub")
    local = tmp_path / "a" / "b"
    result = _run("download", "org/model", "--local-dir", local)
    assert result.exit_code == 1
    assert result.stderr == (f"weightio: error: {local}: the directory {tmp_path / 'a'} does not exist "
                             "(pass --parents to create it)\n")
    assert list(tmp_path.iterdir()) == []


def test_verify_progress_shows_two_passes_over_the_output_size():
    from tqdm import tqdm
    from weightio.cli.convert import progress_callback

    seen = []
    with tqdm(total=0, disable=False, file=io.StringIO()) as bar:
        progress = progress_callback(bar, verify=True)
        for _ in range(2):  # what convert reports for a 120-byte output: 2 tensors written, then read back
            for advance in (40, 80):
                progress(advance, 240)
                seen.append((bar.desc, bar.n, bar.total))
    assert seen == [("", 40, 120), ("verifying: ", 0, 120), ("verifying: ", 40, 120), ("verifying: ", 120, 120)]


def test_convert_verify_reports_each_byte_twice(tmp_path):
    calls = []
    convert(FIXTURES / "numpy.safetensors", tmp_path / "x.safetensors", verify=True,
            progress=lambda advance, total: calls.append((advance, total)))
    assert [c[1] for c in calls] == [240] * 4 and sum(c[0] for c in calls) == 240  # 120 bytes, twice


# ----------------------------------------------------------------------------- names: filters and missing tensors

SEQ_BERT = FIXTURES / "models" / "bert-for-sequence-classification"


def test_a_filter_matching_nothing_suggests_the_pattern_that_would_match():
    result = _run("inspect", SEQ_BERT, "--filter", "encoder.layer.0.*")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[2:4] == [
        "  filter      encoder.layer.0.*  (0 of 41 tensors)",
        "  hint        no tensor name matches; try --filter 'bert.encoder.layer.0.*' or --filter '*encoder.layer.0.*'"]
    doc = json.loads(_run("inspect", SEQ_BERT, "--filter", "encoder.layer.0.*", "--json").stdout)
    assert doc["tensor_count"] == 0 and doc["filter_hints"] == ["bert.encoder.layer.0.*", "*encoder.layer.0.*"]
    assert len(wio.open(SEQ_BERT).select("bert.encoder.layer.0.*")) == 16  # the hint is right
    typo = _run("inspect", SEQ_BERT, "--filter", "classifer.weight")
    assert ("  hint        no tensor name matches; try --filter classifier.weight or --filter classifier.bias"
            in typo.stdout.splitlines())


def test_show_of_a_missing_name_names_what_there_is():
    npy = FIXTURES / "numpy" / "c_order.npy"
    result = _run("show", npy, "x")
    assert result.exit_code == 1
    assert result.stderr == (f"weightio: error: {npy}: tensor 'x': no such tensor; its one tensor is 'c_order' "
                             "(named after the file)\n")
    close = _run("show", SEQ_BERT, "encoder.layer.0.output.dense.weight")
    assert close.stderr == (f"weightio: error: {SEQ_BERT}: tensor 'encoder.layer.0.output.dense.weight': no such "
                            "tensor; did you mean 'bert.encoder.layer.0.output.dense.weight', "
                            "'bert.encoder.layer.1.output.dense.weight', "
                            "'bert.encoder.layer.0.attention.output.dense.weight'?\n")
    far = _run("show", SEQ_BERT, "zzzzzzzz")
    assert far.stderr == (f"weightio: error: {SEQ_BERT}: tensor 'zzzzzzzz': no such tensor; none of its 41 names "
                          "is close (weightio inspect lists them)\n")
    with pytest.raises(KeyError) as info:
        wio.open(SEQ_BERT)["zzzzzzzz"]
    assert str(info.value).endswith("none of its 41 names is close (list(ckpt) lists them)")


# ----------------------------------------------------------------------------- diff: what differs


def test_diff_after_dequantize_says_same_values_dtypes_differ(tmp_path):
    quantized = FIXTURES / "gguf" / "quantized.gguf"
    out = tmp_path / "q.safetensors"
    assert _run("convert", quantized, out, "--dequantize", "--filter", "w.q8_0", "-q").exit_code == 0
    result = _run("diff", quantized, out, "--filter", "w.q8_0")
    assert result.exit_code == 3
    assert result.stdout.splitlines() == [
        f"A: {quantized} (gguf, 9 tensors)",
        f"B: {out} (safetensors, 1 tensor)",
        "changed dtype or shape (1):",
        "  ~ w.q8_0: Q8_0 [4, 256] -> float32 [4, 256]  (values equal)",
        "equal: 0 of 1 tensors present in both; equal values: 1 of 1",
        "result: same values, dtypes differ"]
    assert _run("diff", quantized, out, "--filter", "w.q8_0", "--ignore-dtype", "-q").exit_code == 0


def test_diff_of_a_lossy_cast_says_which_values_differ_and_by_how_much(tmp_path):
    src = FIXTURES / "models" / "bert" / "model.safetensors"
    half = tmp_path / "half.safetensors"
    assert _run("convert", src, half, "--dtype", "fp16", "-q").exit_code == 0
    result = _run("diff", src, half, "--filter", "pooler.*")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[2:5] == ["changed dtype or shape (2):",
                          "  ~ pooler.dense.bias: float32 [32] -> float16 [32]  (values equal)",
                          "  ~ pooler.dense.weight: float32 [32, 32] -> float16 [32, 32]  (values differ: see below)"]
    assert lines[-2:] == ["equal: 0 of 2 tensors present in both; equal values: 1 of 2", "result: different"]


# ----------------------------------------------------------------------------- GGUF display and inspect


def test_gguf_metadata_shows_nested_arrays_and_float32_values_as_written():
    lines = _run("inspect", FIXTURES / "gguf" / "metadata.gguf").stdout.splitlines()
    assert "  metadata    t.f32 = 0.1" in lines
    assert "  metadata    t.f64 = 0.1" in lines
    assert "  metadata    t.nested = [[1, 2], [3]]" in lines
    assert "  metadata    t.arr_float = [0.5, -1.25]" in lines
    assert wio.open(FIXTURES / "gguf" / "metadata.gguf").metadata["t.f32"] == 0.10000000149011612  # the value kept


def test_show_counts_one_value_in_the_singular():
    lines = _run("show", FIXTURES / "numpy" / "scalar.npy", "scalar").stdout.splitlines()
    assert lines[3] == "  size      2 B (1 value)"


def test_depth_implies_tree():
    path = FIXTURES / "tiny-bert"
    assert _run("inspect", path, "--depth", "1").stdout == _run("inspect", path, "--tree", "--depth", "1").stdout
    assert "encoder.layer.{0..1}  2 × 6,789" in _run("inspect", path, "--depth", "1").stdout.splitlines()


def test_inspect_of_a_folder_of_model_folders_lists_them():
    models = FIXTURES / "models"
    result = _run("inspect", models)
    assert result.exit_code == 1
    assert result.stderr == (f"weightio: error: {models}: is a directory of model folders, not a model: bert, "
                             f"bert-for-sequence-classification, deberta-v2 (inspect one of them, e.g. weightio "
                             f"inspect {models / 'bert'})\n")
