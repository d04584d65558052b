"""Legacy ggml / ggmf / ggjt reader: spec-built fixtures of every version, era-specific block layouts,
the ggml-examples variant, and hostile files."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

import weightio as wio
from weightio.errors import CorruptFileError, FormatError, UnsupportedDTypeError
from weightio.formats.ggml import GGMLReader

from ..conftest import FIXTURES

GGML = FIXTURES / "ggml"
sys.path.insert(0, str(FIXTURES))
from gen_ggml import legacy_bytes, llama_hparams  # noqa: E402  (the spec-level packer the fixtures use)

VOCAB = ["<unk>", "▁the", "é", ""]
NORM = np.linspace(-1, 1, 64, dtype=np.float32)


def test_ggjt_v3_reads_every_tensor_and_the_vocabulary():
    with wio.open(GGML / "ggjt_v3.bin") as ckpt:
        assert ckpt.format == "ggml"
        md = ckpt.metadata
        assert (md["ggml.magic"], md["ggml.version"], md["ggml.n_vocab"], md["ggml.n_embd"], md["ggml.ftype"]) == (
            "ggjt", 3, 4, 64, 15)
        assert md["ggml.tokens"] == VOCAB and md["ggml.scores"] == [0.0, -1.5, -2.25, -3.0]
        assert [ckpt[n].ggml_type for n in ckpt] == [None, None, "Q4_0", "Q8_0", "Q4_K", "Q6_K"]
        assert ckpt["tok_embeddings.weight"].shape == (4, 64) and ckpt["output.weight"].shape == (2, 256)
        np.testing.assert_array_equal(ckpt["norm.weight"].numpy(), NORM)
        for name in ckpt:  # ggjt aligns every tensor's data to 32 bytes of the file
            assert ckpt[name].info.offset % 32 == 0
        norm = ckpt["norm.weight"].numpy()
        assert np.shares_memory(norm, ckpt.readers[0].file.data) and not norm.flags.writeable


def test_ggjt_v3_values_equal_gguf_py_dequantization():
    gguf = pytest.importorskip("gguf")
    with wio.open(GGML / "ggjt_v3.bin") as ckpt:
        for name in ckpt:
            v = ckpt[name]
            if v.ggml_type is not None:
                qtype = gguf.GGMLQuantizationType[v.ggml_type]
                expected = gguf.quants.dequantize(v.raw().reshape(v.shape[0], -1), qtype)
                assert v.numpy().tobytes() == expected.astype(np.float32).tobytes()


def test_older_versions_read_plain_tensors_and_explain_old_blocks():
    with wio.open(GGML / "ggjt_v2.bin") as ckpt:
        assert ckpt.readers[0].era == 2
        np.testing.assert_array_equal(ckpt["norm.weight"].numpy(), NORM)
        assert ckpt["layers.0.attention.wv.weight"].numpy().shape == (4, 64)  # v2's Q5_0 is today's layout
        q4 = ckpt["layers.0.attention.wq.weight"]
        assert q4.ggml_type == "Q4_0" and q4.nbytes == 4 * 2 * 20  # float32-scale blocks: 20 bytes
        with pytest.raises(UnsupportedDTypeError, match=r"ggjt v2 files store Q4_0 blocks with a float32 scale "
                                                        r"\(llama.cpp #1508 made it f16 in ggjt v3\)"):
            q4.numpy()
    with wio.open(GGML / "ggjt_v1.bin") as ckpt:
        assert ckpt["tok_embeddings.weight"].numpy().dtype == np.float16
        with pytest.raises(UnsupportedDTypeError, match="ggjt v1 files store Q4_0 blocks with interleaved nibbles"):
            ckpt["layers.0.attention.wq.weight"].numpy()


@pytest.mark.parametrize("name,scored", [("ggmf.bin", True), ("ggml.bin", False)])
def test_unaligned_versions_with_and_without_scores(name, scored):
    with wio.open(GGML / name) as ckpt:
        assert ckpt.metadata["ggml.tokens"] == VOCAB
        assert ("ggml.scores" in ckpt.metadata) is scored
        np.testing.assert_array_equal(ckpt["norm.weight"].numpy(), NORM)
        assert ckpt["tok_embeddings.weight"].shape == (4, 64)


def test_ggml_examples_variant_with_caller_supplied_hparams():
    names = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer", "ftype")
    reader = GGMLReader(str(GGML / "gpt2.bin"), hparams=names, vocab_count=True)
    try:
        assert reader.era == 3 and reader.metadata["ggml.ftype"] == 2007 and reader.metadata["ggml.n_ctx"] == 16
        assert reader.metadata["ggml.tokens"] == ["a", "b", "c"] and "ggml.scores" not in reader.metadata
        assert list(reader.tensors) == ["model/ln_f/g", "model/wte"] and reader.tensors["model/wte"].ggml_type == "Q8_0"
    finally:
        reader.close()


def test_vocabulary_is_lazy_and_survives_odd_bytes(write):
    vocab = [("a", 1.0), (b"\xff\xfe".decode("latin1"), 2.0)] + [(f"t{i}", float(i)) for i in range(200)]
    path = write("v.bin", legacy_bytes("ggjt", 3, llama_hparams(len(vocab), 0), vocab, []))
    with wio.open(path) as ckpt:
        tokens = ckpt.metadata["ggml.tokens"]
        assert len(tokens) == 202 and tokens[0] == "a" and tokens[-1] == "t199" and tokens[1] == "ÿþ"
        assert ckpt.metadata["ggml.scores"][5] == 3.0 and len(ckpt) == 0


def _tensor(name: bytes, ne: tuple[int, ...], ggml_type: int, n_dims: int | None = None) -> bytes:
    dims = len(ne) if n_dims is None else n_dims
    return struct.pack(f"<III{len(ne)}I", dims, len(name), ggml_type, *ne) + name


HEAD = b"fmgg" + struct.pack("<I", 1) + struct.pack("<7I", 0, 64, 256, 2, 1, 32, 0)

HOSTILE = [
    ("unknown version", b"tjgg" + struct.pack("<I", 4) + bytes(28), FormatError,
     "ggjt version 4 is not supported (1, 2, 3 are)"),
    ("vocab of 2^31", b"fmgg" + struct.pack("<I", 1) + struct.pack("<7I", 2**31, 1, 1, 1, 1, 1, 0),
     CorruptFileError,
     "a vocabulary of 2147483648 entries cannot fit in the 0 bytes left"),
    ("token past the end", b"lmgg" + struct.pack("<7I", 1, 1, 1, 1, 1, 1, 0) + struct.pack("<I", 1000) + b"ab",
     CorruptFileError, "the vocabulary runs past the end of the file"),
    ("cut hparams", b"lmgg" + bytes(10), CorruptFileError,
     "file ends inside hparam n_mult (needs 4 bytes at offset 12, file has 14)"),
    ("5 dims", HEAD + _tensor(b"t", (1, 1, 1, 1, 1), 0), CorruptFileError,
     "has 5 dimensions (1 to 4 allowed)"),
    ("0 dims", HEAD + _tensor(b"t", (), 0), CorruptFileError, "has 0 dimensions"),
    ("name past the end", HEAD + struct.pack("<IIII", 1, 2**31, 0, 4) + b"x", CorruptFileError,
     "a tensor name needs bytes"),
    ("data past the end", HEAD + _tensor(b"t", (8,), 0) + bytes(16), CorruptFileError,
     "tensor 't': data at 53..85 runs past the end of the file (69 bytes)"),
    ("duplicate name", HEAD + (_tensor(b"t", (1,), 0) + bytes(4)) * 2, CorruptFileError,
     "tensor 't': tensor name appears twice"),
    ("name not UTF-8", HEAD + _tensor(b"\xff", (1,), 0) + bytes(4), CorruptFileError,
     "is not valid UTF-8"),
    ("empty name", HEAD + _tensor(b"", (1,), 0) + bytes(4), CorruptFileError, "is empty"),
    ("ragged blocks", b"tjgg" + struct.pack("<I", 3) + HEAD[8:] + _tensor(b"t", (33,), 8), CorruptFileError,
     "tensor 't': rows of 33 elements are not whole Q8_0 blocks of 32"),
    ("K-quant in a ggmf file", HEAD + _tensor(b"t", (256,), 12) + bytes(144), UnsupportedDTypeError,
     "tensor 't': ggml type 12 is unknown in ggmf v1 files; its size is unknown"),
    ("unknown type", b"tjgg" + struct.pack("<I", 3) + HEAD[8:] + _tensor(b"t", (4,), 77) + bytes(64),
     UnsupportedDTypeError, "ggml type 77 is unknown in ggjt v3 files"),
    ("overflowing dims", b"tjgg" + struct.pack("<I", 3) + HEAD[8:] + _tensor(b"t", (2**32 - 1,) * 3, 0),
     CorruptFileError, "overflow a 64-bit element count"),
    # found by tests/fuzz in GGUF (same check here): an empty tensor with dims numpy cannot shape
    ("empty tensor, overflowing dims",
     b"tjgg" + struct.pack("<I", 3) + HEAD[8:] + _tensor(b"t", (0,) + (2**32 - 1,) * 3, 0), CorruptFileError,
     "tensor 't': dimensions [0, 4294967295, 4294967295, 4294967295] overflow a 64-bit element count"),
]



def _whisper_head(n_mels: int = 2, ftype: int = 0) -> bytes:
    """'lmgg' and whisper.cpp's 11 int32 hparams (n_vocab 6, widths 32, n_mels, ftype)."""
    return b"lmgg" + struct.pack("<11i", 6, 2, 32, 1, 1, 2, 32, 1, 1, n_mels, ftype)


def _filters(n_mel: int = 2, n_fft: int = 3, values: int | None = None) -> bytes:
    return struct.pack("<ii", n_mel, n_fft) + bytes(4 * (n_mel * n_fft if values is None else values))


W_VOCAB = struct.pack("<i", 1) + struct.pack("<I", 1) + b"a"
WHISPER = _whisper_head() + _filters() + W_VOCAB  # 89 bytes: the tensor records start here
WHISPER_Q2 = _whisper_head(ftype=2007) + _filters() + W_VOCAB

# whisper.cpp's layout behind the same 'lmgg' magic (the module docstring of weightio.formats.ggml)
HOSTILE += [
    ("whisper: n_mel x n_fft of (2^31-1)^2", _whisper_head(2**31 - 1) + struct.pack("<ii", 2**31 - 1, 2**31 - 1),
     CorruptFileError, "mel filters of 2147483647 x 2147483647 float32 (18446744056529682436 bytes from offset 56) "
     "run past the end of the file (56 bytes)"),
    ("whisper: negative n_fft", _whisper_head() + _filters(2, -1, 0) + W_VOCAB, CorruptFileError,
     "the mel filters at offset 48 have a negative size (n_mel 2, n_fft -1)"),
    ("whisper: truncated mel table", _whisper_head() + _filters(2, 3, 2), CorruptFileError,
     "mel filters of 2 x 3 float32 (24 bytes from offset 56) run past the end of the file (64 bytes)"),
    ("whisper: no vocabulary count", _whisper_head() + _filters(), CorruptFileError,
     "file ends inside whisper's vocabulary size (needs 4 bytes at offset 80, file has 80)"),
    ("whisper: vocabulary count 2^31-1", _whisper_head() + _filters() + struct.pack("<i", 2**31 - 1),
     CorruptFileError, "a vocabulary of 2147483647 entries cannot fit in the 0 bytes left"),
    ("whisper: negative vocabulary count", _whisper_head() + _filters() + struct.pack("<i", -1), CorruptFileError,
     "whisper's vocabulary size at offset 80 is negative (-1)"),
    ("whisper: token past the end", _whisper_head() + _filters() + struct.pack("<iI", 1, 1000) + b"ab",
     CorruptFileError, "the vocabulary runs past the end of the file"),
    ("whisper: 5 dims", WHISPER + _tensor(b"t", (1, 1, 1, 1, 1), 0) + bytes(4), CorruptFileError,
     "a tensor at offset 89 has 5 dimensions (0 to 4 allowed)"),
    ("whisper: n_dims -1", WHISPER + struct.pack("<iii", -1, 1, 0) + b"t", CorruptFileError,
     "has 4294967295 dimensions (0 to 4 allowed)"),
    ("whisper: name length -1", WHISPER + struct.pack("<iiii", 1, -1, 0, 1) + bytes(4), CorruptFileError,
     "a tensor name needs bytes 105..4294967400 but the file has 109"),
    ("whisper: 70 kB name", WHISPER + _tensor(b"n" * 70_000, (1,), 0) + bytes(4), CorruptFileError,
     "70000 exceeds the 65535-byte limit (limits.name_bytes"),
    ("whisper: 0-d quantized tensor", WHISPER_Q2 + _tensor(b"t", (), 8) + bytes(34), CorruptFileError,
     "tensor 't': rows of 1 elements are not whole Q8_0 blocks of 32"),
    ("whisper: overflowing dims", WHISPER + _tensor(b"t", (2**32 - 1,) * 4, 0), CorruptFileError,
     "tensor 't': dimensions [4294967295, 4294967295, 4294967295, 4294967295] overflow a 64-bit element count"),
    ("whisper: data past the end", WHISPER + _tensor(b"t", (8,), 0) + bytes(16), CorruptFileError,
     "tensor 't': data at 106..138 runs past the end of the file (122 bytes)"),
    ("whisper: duplicate name", WHISPER + (_tensor(b"t", (1,), 0) + bytes(4)) * 2, CorruptFileError,
     "tensor 't': tensor name appears twice"),
    ("whisper: unknown type", WHISPER_Q2 + _tensor(b"t", (4,), 77) + bytes(16), UnsupportedDTypeError,
     "tensor 't': ggml type 77 is unknown in whisper.cpp (quantization version 2) files"),
    ("whisper: K-quant at quantization version 0", WHISPER + _tensor(b"t", (256,), 12) + bytes(144),
     UnsupportedDTypeError, "ggml type 12 is unknown in whisper.cpp (quantization version 0) files"),
    ("whisper: quantization version 3", _whisper_head(ftype=3002) + _filters() + W_VOCAB, FormatError,
     "whisper hparam ftype 3002 names quantization version 3; weightio knows versions 0, 1, 2"),
    ("whisper: negative ftype", _whisper_head(ftype=-1) + _filters() + W_VOCAB, CorruptFileError,
     "whisper hparam ftype is negative (-1)"),
    ("whisper: header cut in the hparams", _whisper_head()[:40], FormatError,
     "as whisper.cpp's, file ends inside whisper's 11 hparams (needs 44 bytes at offset 4, file has 40)"),
    # parses as neither, and its filter bank is not n_mels rows: it does not claim to be whisper's
    ("cut whisper-like file, filters not n_mels rows", _whisper_head() + _filters(3, 3, 4), FormatError,
     "in a layout weightio does not know: as llama.cpp's layout, the vocabulary runs past the end of the file; as "
     "whisper.cpp's, mel filters of 3 x 3 float32 (36 bytes from offset 56) run past the end of the file (72 bytes)"),
    ("ggml examples' layout (gpt-2)", (GGML / "gpt2.bin").read_bytes(), FormatError,
     "weightio reads llama.cpp's and whisper.cpp's layouts by themselves; the ggml examples' layout"),
]


@pytest.mark.parametrize("content,error,message", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_legacy_files(write, content, error, message):
    path = write("hostile.bin", content)
    with pytest.raises(error) as caught:
        wio.open(path)
    assert message in str(caught.value) and str(caught.value).startswith(str(path))


def test_removed_q4_2_in_an_old_file_is_listed_and_refused(write):
    path = write("q42.bin", HEAD + _tensor(b"t", (16,), 4) + bytes(10))
    with wio.open(path) as ckpt:
        assert ckpt["t"].ggml_type == "Q4_2" and ckpt["t"].nbytes == 10
        with pytest.raises(UnsupportedDTypeError, match="Q4_2 was removed from ggml in May 2023"):
            ckpt["t"].numpy()


def test_bad_magic(write):
    with pytest.raises(FormatError, match="not a legacy ggml file"):
        GGMLReader(str(write("x.bin", b"ggml" + bytes(40))))


def test_legacy_checkpoint_converts_to_gguf_with_its_vocabulary(tmp_path):
    from weightio.formats import gguf
    from weightio.writing import write_gguf

    out = tmp_path / "model.gguf"
    with wio.open(GGML / "ggjt_v3.bin") as ckpt:
        scores = ckpt.metadata["ggml.scores"].numpy()
        assert scores.dtype == np.float32 and scores.tolist() == [0.0, -1.5, -2.25, -3.0] and not scores.flags.writeable
        write_gguf(ckpt, str(out), ckpt.metadata)
        with wio.open(out) as back:
            assert back.metadata["ggml.tokens"] == VOCAB and back.metadata["ggml.scores"] == [0.0, -1.5, -2.25, -3.0]
            assert gguf.value_types(back)["ggml.scores"] == "ARRAY[FLOAT32]"
            for name in ckpt:  # quantized tensors are copied block for block
                assert back[name].ggml_type == ckpt[name].ggml_type
                assert back[name].raw().tobytes() == ckpt[name].raw().tobytes()
