"""A llama ggjt file converted to GGUF as llama.cpp's converter writes it (weightio.formats.ggml_to_gguf).

The output is read back with gguf-py's own GGUFReader (the reference reader): keys in order,
their types and values exactly, tensor names, types, shapes and bytes. llama.cpp itself loads
and runs these outputs in tests/test_llamacpp.py (opt-in).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio.convert import convert
from weightio.errors import UsageError
from weightio.formats.ggml_to_gguf import gguf_name, vocabulary

from .conftest import FIXTURES, digest, manifest

gguf = pytest.importorskip("gguf")

LLAMA_BYTES = b"\n .,'!?abcdefghijklmnopqrstuvwxyz"  # as fixtures/gen_ggml.py writes them, ids 3..35
PIECES = ["he", "ll", "llo", "hello", " hello", "or", "wor", "ld", "world", " world", "ing", "ed", "er", " a", "in",
          "on"]
# What the converter makes of them: bytes as <0xXX> byte tokens (type 6), spaces as U+2581
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in LLAMA_BYTES] + [p.replace(" ", "\u2581") for p in PIECES]
TYPES = [2, 3, 3] + [6] * len(LLAMA_BYTES) + [1] * len(PIECES)
SCORES = [0.0] * (3 + len(LLAMA_BYTES)) + [-float(i) for i in range(3 + len(LLAMA_BYTES), len(TOKENS))]
NAMES = ["token_embd.weight", "output_norm.weight", "output.weight"] + [
    f"blk.{i}.{n}.weight" for i in (0, 1) for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                   "ffn_down", "ffn_up", "attn_norm", "ffn_norm")]
V = gguf.GGUFValueType


def _expected(name: str, description: str, ftype: int, **over: object) -> list[tuple[str, list, object]]:
    """(key, GGUF types, value) in the converter's order."""
    rows = [("general.architecture", [V.STRING], "llama"), ("general.name", [V.STRING], name),
            ("general.description", [V.STRING], description), ("general.file_type", [V.UINT32], ftype),
            ("llama.context_length", [V.UINT32], 2048), ("llama.embedding_length", [V.UINT32], 32),
            ("llama.block_count", [V.UINT32], 2), ("llama.feed_forward_length", [V.UINT32], 96),
            ("llama.rope.dimension_count", [V.UINT32], 8), ("llama.attention.head_count", [V.UINT32], 4),
            ("llama.attention.head_count_kv", [V.UINT32], 4),
            ("llama.attention.layer_norm_rms_epsilon", [V.FLOAT32], float(np.float32(5e-6))),
            ("tokenizer.ggml.model", [V.STRING], "llama"), ("tokenizer.ggml.pre", [V.STRING], "default"),
            ("tokenizer.ggml.tokens", [V.ARRAY, V.STRING], TOKENS),
            ("tokenizer.ggml.scores", [V.ARRAY, V.FLOAT32], SCORES),
            ("tokenizer.ggml.token_type", [V.ARRAY, V.INT32], TYPES),
            ("tokenizer.ggml.unknown_token_id", [V.UINT32], 0), ("tokenizer.ggml.bos_token_id", [V.UINT32], 1),
            ("tokenizer.ggml.eos_token_id", [V.UINT32], 2)]
    return [(k, t, over.get(k, v)) for k, t, v in rows]


def _fields(path) -> list[tuple[str, list, object]]:
    reader = gguf.GGUFReader(path)
    return [(k, list(f.types), f.contents()) for k, f in reader.fields.items() if not k.startswith("GGUF.")]


@pytest.mark.parametrize("variant,ftype,description,types", [
    ("f32", 0, "ALL_F32", {"F32"}), ("f16", 1, "MOSTLY_F16", {"F32", "F16"}),
    ("q8_0", 7, "MOSTLY_Q8_0", {"F32", "Q8_0"})])
def test_llama_ggjt_to_gguf_read_by_gguf_py(tmp_path, variant, ftype, description, types):
    source = FIXTURES / "ggml" / f"llama-{variant}.bin"
    out = tmp_path / "llama.gguf"
    result = convert(source, out, verify=True)
    expected = _expected(f"llama-{variant}.bin", f"converted from legacy GGJTv3 {description} format", ftype)
    if variant == "q8_0":  # weightio's GGUF writer adds it to files with quantized tensors (llama.cpp's quantize does)
        expected.append(("general.quantization_version", [V.UINT32], 2))
    assert _fields(out) == expected
    reader = gguf.GGUFReader(out)
    assert [t.name for t in reader.tensors] == NAMES
    assert {t.tensor_type.name for t in reader.tensors} == types
    specs = manifest()[f"ggml/llama-{variant}.bin"]
    with wio.open(source) as src:
        for tensor, old in zip(reader.tensors, src, strict=True):
            assert tensor.name == gguf_name(old)
            assert list(tensor.shape) == list(src[old].shape[::-1])  # ne, as the ggml file had it
            assert tensor.data.tobytes() == src[old].raw().tobytes()
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(src[old].shape)
            assert digest(np.asarray(values, dtype=specs[old]["dtype"])) == specs[old]["sha256"], old
    assert result.notes == ["written as a llama GGUF model, as llama.cpp's convert_llama_ggml_to_gguf.py writes it: "
                            "52 tokens, 21 tensors renamed (tok_embeddings.weight -> token_embd.weight …)"]


def test_converter_options(tmp_path):
    out = tmp_path / "llama.gguf"
    convert(FIXTURES / "ggml" / "llama-f16.bin", out, ggml_options={
        "context_length": 4096, "eps": 1e-5, "gqa": 2, "name": "tiny", "description": "a test"})
    assert _fields(out) == _expected("tiny", "a test", 1, **{
        "llama.context_length": 4096, "llama.attention.head_count_kv": 2,
        "llama.attention.layer_norm_rms_epsilon": float(np.float32(1e-5))})
    with pytest.raises(UsageError, match="gqa 3 does not divide the 4 attention heads"):
        convert(FIXTURES / "ggml" / "llama-f16.bin", tmp_path / "b.gguf", ggml_options={"gqa": 3})
    with pytest.raises(UsageError, match="unknown ggml option"):
        convert(FIXTURES / "ggml" / "llama-f16.bin", tmp_path / "b.gguf", ggml_options={"ctx": 3})
    for options, message in (  # the caller's mistakes: UsageError before anything is opened, never ValueError
            ({"eps": "abc"}, "ggml option eps must be a positive finite number, not 'abc'"),
            ({"eps": float("nan")}, "ggml option eps must be a positive finite number, not nan"),
            ({"eps": 0.0}, "ggml option eps must be a positive finite number, not 0.0"),
            ({"gqa": 0}, "ggml option gqa must be an int from 1 to 255, not 0"),
            ({"gqa": "8"}, "ggml option gqa must be an int from 1 to 255, not '8'"),
            ({"gqa": True}, "ggml option gqa must be an int from 1 to 255, not True"),
            ({"context_length": -5}, "ggml option context_length must be an int from 1 to 4,294,967,295, not -5"),
            ({"context_length": 1.5}, "ggml option context_length must be an int from 1 to 4,294,967,295, not 1.5"),
            ({"name": 5}, "ggml option name must be a str, not 5")):
        with pytest.raises(UsageError) as e:
            convert(FIXTURES / "ggml" / "llama-f16.bin", tmp_path / "b.gguf", ggml_options=options)
        assert e.value.message == message
    with pytest.raises(UsageError, match="ggml options apply to a legacy ggml file converted to .gguf"):
        convert(FIXTURES / "ggml" / "llama-f16.bin", tmp_path / "b.safetensors", ggml_options={"gqa": 2})
    with pytest.raises(UsageError, match="ggml options apply"):
        convert(FIXTURES / "tiny-bert" / "model.safetensors", tmp_path / "b.gguf", ggml_options={"gqa": 2})
    assert not (tmp_path / "b.gguf").exists() and not (tmp_path / "b.safetensors").exists()


def test_cli_options(tmp_path):
    result = CliRunner().invoke(main, ["convert", str(FIXTURES / "ggml" / "llama-f32.bin"), str(tmp_path / "l.gguf"),
                                       "--ggml-context-length", "4096", "--ggml-eps", "1e-6", "--ggml-gqa", "4",
                                       "--ggml-name", "n", "--ggml-description", "d"])
    assert result.exit_code == 0, result.output
    assert _fields(tmp_path / "l.gguf") == _expected("n", "d", 0, **{
        "llama.context_length": 4096, "llama.attention.head_count_kv": 1,
        "llama.attention.layer_norm_rms_epsilon": float(np.float32(1e-6))})
    bad = CliRunner().invoke(main, ["convert", str(FIXTURES / "ggml" / "llama-f32.bin"), str(tmp_path / "m.gguf"),
                                    "--ggml-gqa", "0"])
    assert bad.exit_code == 2 and "--ggml-gqa" in bad.output


def test_older_legacy_files_and_the_small_fixtures(tmp_path):
    """ggmf and unversioned ggml files convert too ("GGMLv1" as the converter names them; no scores: 0.0)."""
    convert(FIXTURES / "ggml" / "ggml.bin", tmp_path / "a.gguf")
    fields = dict((k, v) for k, _, v in _fields(tmp_path / "a.gguf"))
    assert fields["general.description"] == "converted from legacy GGMLv1 MOSTLY_F16 format"
    assert fields["tokenizer.ggml.tokens"] == ["<unk>", "<s>", "</s>", ""]
    assert fields["tokenizer.ggml.scores"] == [0.0] * 4 and fields["tokenizer.ggml.token_type"] == [2, 3, 3, 3]
    # no feed_forward.w1 tensor: llama.cpp's old rule from n_mult, ((2 * 4 * 64 / 3 + 255) / 256) * 256
    assert fields["llama.feed_forward_length"] == 256
    convert(FIXTURES / "ggml" / "ggmf.bin", tmp_path / "b.gguf")
    fields = dict((k, v) for k, _, v in _fields(tmp_path / "b.gguf"))
    assert fields["general.description"] == "converted from legacy GGMFv1 MOSTLY_F16 format"
    assert fields["tokenizer.ggml.scores"] == [0.0, -1.5, -2.25, -3.0]
    convert(FIXTURES / "ggml" / "ggjt_v3.bin", tmp_path / "c.gguf", verify=True)
    fields = dict((k, v) for k, _, v in _fields(tmp_path / "c.gguf"))
    assert fields["llama.feed_forward_length"] == 4  # the rows of layers.0.feed_forward.w1.weight
    assert fields["general.description"] == "converted from legacy GGJTv3 MOSTLY_Q4_K_M format"
    with wio.open(tmp_path / "c.gguf") as ckpt:
        assert list(ckpt) == ["token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight",
                              "blk.0.ffn_gate.weight", "blk.0.attn_k.weight", "output.weight"]


@pytest.mark.parametrize("name,expected", [
    ("tok_embeddings.weight", "token_embd.weight"), ("norm.weight", "output_norm.weight"),
    ("output.weight", "output.weight"), ("rope.freqs", "rope_freqs"), ("rope.freqs.weight", "rope_freqs.weight"),
    ("layers.0.attention.wq.weight", "blk.0.attn_q.weight"), ("layers.12.attention.wk.weight", "blk.12.attn_k.weight"),
    ("layers.1.attention.wv.weight", "blk.1.attn_v.weight"),
    ("layers.1.attention.wo.weight", "blk.1.attn_output.weight"),
    ("layers.1.attention_norm.weight", "blk.1.attn_norm.weight"), ("layers.1.ffn_norm.weight", "blk.1.ffn_norm.weight"),
    ("layers.1.feed_forward.w1.weight", "blk.1.ffn_gate.weight"),
    ("layers.1.feed_forward.w2.weight", "blk.1.ffn_down.weight"),
    ("layers.1.feed_forward.w3.bias", "blk.1.ffn_up.bias"),
    ("layers.0.attention.inner_attention.rope.freqs", "blk.0.attn_rot_embd"),
    ("layers.01.attention.wq.weight", None), ("layers.x.attention.wq.weight", None), ("model/wte", None),
    ("tok_embeddings.scale", None), ("layers.\u0663.attention.wq.weight", None),
    pytest.param("layers." + "1" * 5000 + ".attention.wq.weight", "blk." + "1" * 5000 + ".attn_q.weight",
                 id="a 5000-digit block number (never int()'d: Python refuses over 4300 digits)"),
])
def test_names_as_gguf_py_maps_them(name, expected):
    assert gguf_name(name) == expected
    if expected is not None and len(name) < 100:  # gguf-py's own table agrees
        mapped = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 13).get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped == expected


def test_vocabulary_rules():
    tokens, scores, types = vocabulary([b"x", b"y", b"z", b"", b"a", b" b c", b"\xff", b"ab"] + [b"q"] * 252 + [b"r"],
                                       np.arange(261, dtype=np.float32))
    assert tokens[:8] == [b"<unk>", b"<s>", b"</s>", b"", b"<0x61>", "\u2581b\u2581c".encode(), b"<0xFF>", b"ab"]
    assert types.dtype == np.int32 and types[:8].tolist() == [2, 3, 3, 3, 6, 1, 6, 1]
    assert tokens[258] == b"<0x71>" and tokens[260] == b"r" and types[260] == 1  # id 259 on: no byte tokens
    assert scores.dtype == np.float32 and scores.tolist() == [float(i) for i in range(261)]


def test_short_vocabulary_and_zero_heads(tmp_path):
    def ggjt(n_vocab: int, n_head: int) -> bytes:
        raw = b"tjgg" + struct.pack("<I7I", 3, n_vocab, 8, 16, n_head, 1, 4, 0)
        for i in range(n_vocab):
            raw += struct.pack("<I", 1) + bytes([65 + i]) + struct.pack("<f", 0)
        raw += struct.pack("<IIII", 1, 11, 0, 8) + b"norm.weight"
        return raw + bytes(-len(raw) % 32) + np.ones(8, "<f4").tobytes()

    (tmp_path / "short.bin").write_bytes(ggjt(2, 1))  # converted as before llama conversion existed, as it was
    result = convert(tmp_path / "short.bin", tmp_path / "short.gguf")
    assert result.notes == ["not written as a llama model (llama.cpp could not load it): the vocabulary holds 2 "
                            "tokens (<unk>, <s> and </s> at least are needed); the ggml hyperparameters are kept as "
                            "ggml.* keys", "metadata not kept: 2 entries that are not scalars (ggml.tokens, "
                            "ggml.scores)"]
    with wio.open(tmp_path / "short.gguf") as ckpt:
        assert list(ckpt) == ["norm.weight"] and ckpt.metadata["ggml.n_vocab"] == 2
    (tmp_path / "zero.bin").write_bytes(ggjt(3, 0))  # no division by zero: written as the file says
    convert(tmp_path / "zero.bin", tmp_path / "zero.gguf")
    fields = dict((k, v) for k, _, v in _fields(tmp_path / "zero.gguf"))
    assert fields["llama.attention.head_count"] == 0 and fields["llama.rope.dimension_count"] == 0


@pytest.mark.parametrize("suffix", [".gguf", ".safetensors"])
def test_ggml_keys_of_other_formats_are_plain_metadata(tmp_path, suffix):
    """Only a file the ggml reader read becomes a llama model: a GGUF that weightio wrote from a ggjt
    file before llama conversion existed (its ggml.* hparams as keys, llama names, no vocabulary), or
    a safetensors file with such keys, converts to GGUF as any file of its format does."""
    keys = {"ggml.magic": "ggjt", "ggml.version": 3, "ggml.n_vocab": 32, "ggml.n_embd": 4, "ggml.n_mult": 1,
            "ggml.n_head": 1, "ggml.n_layer": 1, "ggml.n_rot": 4, "ggml.ftype": 0}
    if suffix == ".safetensors":
        keys = {k: str(v) for k, v in keys.items()}
    src = tmp_path / f"old{suffix}"
    wio.save({"tok_embeddings.weight": np.ones((3, 4), np.float32)}, src, metadata=keys)
    result = convert(src, tmp_path / "again.gguf")
    assert not any("llama" in note for note in result.notes)
    with wio.open(tmp_path / "again.gguf") as ckpt:
        assert list(ckpt) == ["tok_embeddings.weight"]
        assert {k: ckpt.metadata[k] for k in keys} == keys
