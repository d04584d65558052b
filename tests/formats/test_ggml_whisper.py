"""whisper.cpp models in the ggml reader: files written by whisper.cpp's own converter and quantizer
(fixtures/whisper, from fixtures/gen_whisper.py), spec-built ones of every quantization era
(fixtures/ggml/whisper*.bin), telling the 'ggml' layouts apart, and the command line on them.

Tensor values are checked against the transformers model the files were converted from by
tests/test_fixtures.py (manifest.json); the hyperparameters, the mel filters (openai/whisper's
``mel_filters.npz``) and the vocabulary against fixtures/whisper/expected.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio.errors import FormatError, UnsupportedDTypeError
from weightio.formats.ggml import GGMLReader

from ..conftest import FIXTURES

WHISPER = FIXTURES / "whisper"
EXPECTED = json.loads((WHISPER / "expected.json").read_text())
FILES = sorted(EXPECTED["files"])
sys.path.insert(0, str(FIXTURES))
from gen_ggml import WHISPER_VOCAB  # noqa: E402  (the spec-built files' vocabulary)


@pytest.mark.parametrize("name", FILES)
def test_converter_output_hyperparameters_as_whisper_cpp_reads_them(name):
    with wio.open(WHISPER / name) as ckpt:
        reader, md = ckpt.readers[0], ckpt.metadata
        assert (ckpt.format, reader.layout, md["ggml.magic"], md["ggml.version"], md["ggml.layout"]) == (
            "ggml", "whisper", "ggml", 0, "whisper")
        assert {k: md[f"whisper.{k}"] for k in EXPECTED["hparams"]} == EXPECTED["hparams"]
        ftype = EXPECTED["files"][name]["ftype"]  # as stored: type + 1000 * quantization version
        assert (md["whisper.ftype"], md["whisper.qnt_version"]) == (ftype % 1000, ftype // 1000)
        assert reader.era == ftype // 1000 + 1


@pytest.mark.parametrize("name", FILES)
def test_mel_filters_are_the_assets_and_a_view_of_the_file(name):
    with wio.open(WHISPER / name) as ckpt:
        md = ckpt.metadata
        filters = md["whisper.mel_filters"]
        assert filters.type == "FLOAT32" and [md["whisper.n_mel"], md["whisper.n_fft"]] == [80, 201]
        mel = filters.numpy().reshape(md["whisper.n_mel"], md["whisper.n_fft"])
        assert list(mel.shape) == EXPECTED["mel_filters"]["shape"]
        assert hashlib.sha256(mel.astype("<f4").tobytes()).hexdigest() == EXPECTED["mel_filters"]["sha256"]
        data = ckpt.readers[0].file.data  # not copied at open: the array is the mapping's bytes
        assert np.shares_memory(filters.numpy(), data) and not filters.numpy().flags.writeable


def test_mel_filters_equal_openai_whisper_assets_when_present():
    checkout = os.environ.get("OPENAI_WHISPER")
    if not checkout:
        pytest.skip("set OPENAI_WHISPER to a checkout of openai/whisper")
    with np.load(os.path.join(checkout, "whisper", "assets", "mel_filters.npz")) as assets:
        expected = assets["mel_80"]
    with wio.open(WHISPER / "tiny-f16.bin") as ckpt:
        np.testing.assert_array_equal(ckpt.metadata["whisper.mel_filters"].numpy().reshape(80, 201), expected)


@pytest.mark.parametrize("name", FILES)
def test_vocabulary_bytes_and_lazy_text(name):
    expected = [bytes.fromhex(h) for h in EXPECTED["vocab_hex"]]
    with wio.open(WHISPER / name) as ckpt:
        tokens = ckpt.metadata["whisper.tokens"]
        assert tokens.type == "STRING" and len(tokens) == len(expected) < ckpt.metadata["whisper.n_vocab"]
        assert list(tokens.raw_strings()) == expected
        assert tokens[4] == " the" and tokens[6] == "é" and tokens[10] == "" and tokens[-1] == "<|endoftext|>"
        assert tokens[7] == b"\xe2\x80".decode("utf-8", "surrogateescape")  # half a character, kept byte for byte
        assert "ggml.tokens" not in ckpt.metadata and "ggml.scores" not in ckpt.metadata


@pytest.mark.parametrize("name", FILES)
def test_tensor_types_as_written_and_plain_tensors_zero_copy(name):
    types = EXPECTED["files"][name]["types"]
    with wio.open(WHISPER / name) as ckpt:
        assert list(ckpt) == list(types)  # file order: the converter's (the model's state_dict order)
        data = ckpt.readers[0].file.data
        for tensor, ggml_type in types.items():
            view = ckpt[tensor]
            if ggml_type in ("F16", "F32"):
                assert view.ggml_type is None and view.dtype == np.dtype("<f2" if ggml_type == "F16" else "<f4")
                assert np.shares_memory(view.numpy(), data)
            else:
                assert view.ggml_type == ggml_type and view.numpy().dtype == np.float32


@pytest.mark.parametrize("name", [n for n in FILES if n != "tiny-f16.bin"])
def test_quantized_values_equal_gguf_py_and_stay_close_to_f16(name):
    with wio.open(WHISPER / "tiny-f16.bin") as f16, wio.open(WHISPER / name) as q:
        for tensor in q:
            view = q[tensor]
            if view.ggml_type is None:
                assert view.numpy().tobytes() == f16[tensor].numpy().tobytes()
                continue
            source = f16[tensor].numpy().astype(np.float32)
            step = np.abs(source).reshape(-1, 32).max(axis=1) / {"Q4_0": 8, "Q5_0": 16, "Q8_0": 127}[view.ggml_type]
            error = np.abs(view.numpy() - source).reshape(-1, 32).max(axis=1)
            assert (error <= step * 1.01 + 1e-6).all(), tensor
    gguf = pytest.importorskip("gguf")
    with wio.open(WHISPER / name) as q:
        for tensor in q:
            view = q[tensor]
            if view.ggml_type is not None:
                qtype = gguf.GGMLQuantizationType[view.ggml_type]
                expected = gguf.quants.dequantize(view.raw().reshape(view.shape[0], -1), qtype)
                assert view.numpy().tobytes() == expected.astype(np.float32).tobytes()


def test_spec_built_file_of_today_holds_a_0_d_tensor():
    with wio.open(FIXTURES / "ggml" / "whisper.bin") as ckpt:
        md = ckpt.metadata
        assert [md[f"whisper.{k}"] for k in ("ftype", "qnt_version", "n_mel", "n_fft")] == [7, 2, 4, 3]
        assert md["whisper.mel_filters"].numpy().tolist() == np.linspace(0, 0.5, 12, dtype=np.float32).tolist()
        assert list(md["whisper.tokens"].raw_strings()) == WHISPER_VOCAB
        assert ckpt["scale"].shape == () and ckpt["scale"].numpy() == 0.5
        assert [ckpt[n].ggml_type for n in ckpt] == [None, "Q4_0", "Q5_0", "Q8_0", None, None]
        assert ckpt["encoder.conv1.bias"].shape == (32, 1)


def test_quantization_version_1_reads_q5_0_and_explains_old_q4_0():
    with wio.open(FIXTURES / "ggml" / "whisper_qnt1.bin") as ckpt:
        assert ckpt.readers[0].era == 2 and ckpt.metadata["whisper.ftype"] == 8
        with wio.open(FIXTURES / "ggml" / "whisper.bin") as today:  # the same Q5_0 blocks
            key = "encoder.blocks.0.attn.key.weight"
            assert ckpt[key].numpy().tobytes() == today[key].numpy().tobytes()
        q4 = ckpt["encoder.blocks.0.attn.query.weight"]
        assert q4.ggml_type == "Q4_0" and q4.nbytes == 4 * 2 * 20  # float32 scales: 20-byte blocks
        with pytest.raises(UnsupportedDTypeError, match=r"whisper.cpp \(quantization version 1\) files store Q4_0 "
                                                        r"blocks with a float32 scale .* quantize the F16 model again "
                                                        r"with a current whisper.cpp \(whisper-quantize\)"):
            q4.numpy()


def test_quantization_version_0_reads_f16_and_explains_old_q4_0():
    with wio.open(FIXTURES / "ggml" / "whisper_qnt0.bin") as ckpt:
        assert ckpt.readers[0].era == 1 and (ckpt.metadata["whisper.ftype"], ckpt.metadata["whisper.qnt_version"]) == (
            2, 0)
        assert ckpt["encoder.blocks.0.attn.out.weight"].numpy().dtype == np.float16
        with pytest.raises(UnsupportedDTypeError, match=r"quantization version 0\) files store Q4_0 blocks with "
                                                        "interleaved nibbles and a float32 scale"):
            ckpt["encoder.blocks.0.attn.query.weight"].numpy()


def test_llama_files_keep_their_layout_and_metadata():
    with wio.open(FIXTURES / "ggml" / "ggml.bin") as ckpt:
        assert ckpt.readers[0].layout == "llama" and "ggml.layout" not in ckpt.metadata
        assert not any(k.startswith("whisper.") for k in ckpt.metadata)


def test_another_programs_layout_is_a_format_error_naming_the_layouts_weightio_knows():
    with pytest.raises(FormatError) as caught:
        wio.open(FIXTURES / "ggml" / "gpt2.bin")  # a ggml example (gpt-2): its hparams are the model's own
    message = str(caught.value)
    assert "unversioned 'ggml' file (magic 0x67676d6c, bytes 'lmgg') in a layout weightio does not know" in message
    assert "as llama.cpp's layout, tensor 'model/wte': data at 360..648 runs past the end" in message
    assert "as whisper.cpp's, whisper hparam ftype 23265280 names quantization version 23265" in message
    assert "reads llama.cpp's and whisper.cpp's layouts by themselves; the ggml examples' layout" in message
    assert 'GGMLReader(path, hparams=("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer", "ftype"), vocab_count=True)' \
        in message
    reader = GGMLReader(str(FIXTURES / "ggml" / "gpt2.bin"), hparams=("n_vocab", "n_ctx", "n_embd", "n_head",
                                                                       "n_layer", "ftype"), vocab_count=True)
    try:
        assert reader.layout == "examples"
    finally:
        reader.close()


def test_whisper_hparams_through_the_llama_reader_say_it_is_the_llama_layout(write):
    """Naming the layout (hparams=) turns the detection off: the caller's layout or its error."""
    from weightio.formats.ggml import LLAMA_HPARAMS

    with pytest.raises(wio.errors.CorruptFileError):
        GGMLReader(str(WHISPER / "tiny-f16.bin"), hparams=LLAMA_HPARAMS)


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_inspect_and_show():
    result = _run("inspect", WHISPER / "tiny-q5_0.bin")
    assert result.exit_code == 0, result.output
    for line in ("format      ggml", "tensors     50", "metadata    ggml.layout = whisper",
                 "metadata    whisper.n_mels = 80", "metadata    whisper.qnt_version = 2",
                 "whisper.mel_filters = [-0.0, 0.024862595, 0.0, …] (16,080 items)",  # float32s, shortest
                 "whisper.tokens = [!, a, b, …] (48 items)"):
        assert line in result.output
    assert "Q5_0" in result.output
    result = _run("show", WHISPER / "tiny-q5_0.bin", "decoder.token_embedding.weight")
    assert result.exit_code == 0 and "Q5_0 (block-quantized; values dequantized to float32)" in result.output


def test_convert_to_gguf_carries_hparams_filters_and_vocabulary(tmp_path):
    out = tmp_path / "whisper.gguf"
    result = _run("convert", WHISPER / "tiny-q8_0.bin", out)
    assert result.exit_code == 0 and "not kept" not in result.output, result.output
    with wio.open(WHISPER / "tiny-q8_0.bin") as src, wio.open(out) as back:
        for key, value in src.metadata.items():
            if key in ("whisper.mel_filters", "whisper.tokens"):
                assert back.metadata[key].type == value.type
                assert back.metadata[key].tolist() == value.tolist()
            else:
                assert back.metadata[key] == value
        assert list(back.metadata["whisper.tokens"].raw_strings()) == list(src.metadata["whisper.tokens"].raw_strings())
        for name in src:  # quantized blocks copied as they are
            assert back[name].ggml_type == src[name].ggml_type
            assert back[name].raw().tobytes() == src[name].raw().tobytes()
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(out))
    field = reader.fields["whisper.tokens"]
    assert [bytes(field.parts[i]) for i in field.data] == [bytes.fromhex(h) for h in EXPECTED["vocab_hex"]]
    assert reader.fields["whisper.n_mels"].contents() == 80


def test_convert_to_safetensors_keeps_scalars_as_text(tmp_path):
    out = tmp_path / "whisper.safetensors"
    result = _run("convert", WHISPER / "tiny-f16.bin", out)
    assert result.exit_code == 0, result.output
    assert "metadata not kept: 2 entries that are not scalars (whisper.mel_filters, whisper.tokens)" in result.output
    with wio.open(out) as back, wio.open(WHISPER / "tiny-f16.bin") as src:
        assert back.metadata["whisper.n_audio_state"] == "32" and back.metadata["ggml.layout"] == "whisper"
        for name in src:
            assert back[name].numpy().tobytes() == src[name].numpy().tobytes()


def test_whisper_cpp_itself_loads_the_fixtures():
    """Opt-in: WHISPER_CLI=path/to/whisper-cli (built from the whisper.cpp checkout gen_whisper.py ran)."""
    cli = os.environ.get("WHISPER_CLI")
    if not cli:
        pytest.skip("set WHISPER_CLI to whisper.cpp's whisper-cli to check that whisper.cpp loads the fixtures")
    for name in FILES:
        run = subprocess.run([cli, "-m", str(WHISPER / name), "-f", os.devnull, "-t", "1"], capture_output=True,
                             text=True, timeout=120)
        log = run.stdout + run.stderr
        assert "whisper_model_load: model size" in log and "failed to load model" not in log, log[-2000:]
