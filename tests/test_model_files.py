"""convert copies a model directory's other files (config, tokenizer …) beside the weights: weightio.model_files.

The file lists and bytes are checked without torch; the transformers tests (skipped without
torch/transformers) load the converted directory with ``from_pretrained`` and compare outputs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio import layout, model_files
from weightio.convert import convert, into_directory
from weightio.errors import WriteError

from .conftest import FIXTURES
from .hubserver import point_client_at, repo_from_folder, serve

TOKENIZER = ["tokenizer.json", "tokenizer_config.json"]
MODELS = ["tiny-bert", "tiny-bert-sharded", "models/bert", "models/deberta-v2",
          "models/bert-for-sequence-classification"]


def _listing(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if not p.is_dir())


def _same_bytes(a: Path, b: Path, names: list[str]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


# ----------------------------------------------------------------------------- the rules


@pytest.mark.parametrize("name,weights", [
    ("model.safetensors", True), ("model-00001-of-00002.safetensors", True), ("pytorch_model.bin", True),
    ("model.safetensors.index.json", True), ("pytorch_model.bin.index.json", True), ("tf_model.h5", True),
    ("flax_model.msgpack", True), ("onnx/model.onnx", True), ("rust_model.ot", True), ("model-Q4_K_M.gguf", True),
    ("consolidated.00.pth", True), ("training_args.bin", True), ("MODEL.SAFETENSORS", True),
    ("config.json", False), ("tokenizer.json", False), ("vocab.txt", False), ("tokenizer.model", False),
    ("generation_config.json", False), ("1_Pooling/config.json", False), ("mel_filters.npz", False),
    ("README.md", False), ("index.json", False), ("model.index.json", False),
])
def test_weight_names(name, weights):
    assert layout.is_weights(name) is weights


def test_tiny_bert_to_a_directory_copies_config_and_tokenizer(tmp_path):
    result = convert(FIXTURES / "tiny-bert", str(tmp_path / "out") + "/")
    out = tmp_path / "out"
    assert _listing(out) == ["config.json", "model.safetensors", *TOKENIZER]
    assert result.files == [str(out / "model.safetensors")]
    assert result.copied == [str(out / n) for n in ["config.json", *TOKENIZER]]
    assert result.skipped == {} and result.notes == []
    _same_bytes(FIXTURES / "tiny-bert", out, ["config.json", *TOKENIZER])


def test_sharded_source_index_is_rewritten_not_copied(tmp_path):
    out = tmp_path / "out"
    result = convert(FIXTURES / "tiny-bert-sharded", str(out) + "/", max_shard_size="30kB")
    assert _listing(out) == ["config.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                             "model-00003-of-00003.safetensors", "model.safetensors.index.json", *TOKENIZER]
    assert result.skipped == {}  # the source's own index is neither copied nor listed
    assert result.files[-1] == str(out / "model.safetensors.index.json")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert list(index) == ["metadata", "weight_map"]
    assert index["metadata"] == {"total_size": 79912}  # the source index's total_parameters is not carried
    with wio.open(FIXTURES / "tiny-bert-sharded") as src:
        assert list(index["weight_map"]) == list(src)
        assert sum(src[n].nbytes for n in src) == 79912
    assert set(index["weight_map"].values()) == {f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)}
    convert(FIXTURES / "tiny-bert-sharded", str(tmp_path / "single") + "/")  # one file: no index
    assert _listing(tmp_path / "single") == ["config.json", "model.safetensors", *TOKENIZER]


def test_other_weight_formats_are_listed_not_copied(tmp_path):
    result = convert(FIXTURES / "models" / "bert", str(tmp_path / "out") + "/")
    assert _listing(tmp_path / "out") == ["config.json", "model.safetensors", *TOKENIZER]
    assert result.skipped == {"pytorch_model.bin": "weights"}


def _model_dir(tmp_path: Path) -> Path:
    """tiny-bert plus what real repos hold: a sub-folder, hidden files, other formats, links."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "tiny-bert", src)
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (src / "onnx").mkdir()
    (src / "onnx" / "model.onnx").write_bytes(b"onnx weights")
    (src / "tf_model.h5").write_bytes(b"tf weights")
    (src / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("a private file")
    (src / "README.md").symlink_to(outside)  # leads out of the model directory: never followed
    (src / "system").symlink_to("/")  # would walk the whole file system
    (src / "notes.md").symlink_to(src / "1_Pooling" / "config.json")  # inside: its content is copied
    (src / "dangling.json").symlink_to(tmp_path / "missing")
    (src / "loop").symlink_to(src)  # a linked directory that leads back: entered never (already seen)
    os.mkfifo(src / "pipe")
    return src


def test_subfolders_links_hidden_and_special_files(tmp_path):
    src = _model_dir(tmp_path)
    out = tmp_path / "out"
    result = convert(src, str(out) + "/")
    assert _listing(out) == ["1_Pooling/config.json", "config.json", "model.safetensors", "notes.md", *TOKENIZER]
    assert not (out / "notes.md").is_symlink()
    assert (out / "notes.md").read_text() == '{"pooling_mode_mean_tokens": true}'
    out_of_dir = "a link out of the model directory (not followed)"
    assert result.skipped == {"README.md": out_of_dir, "dangling.json": "a link to nothing",
                              "onnx/model.onnx": "weights", "pipe": "not a regular file", "system": out_of_dir,
                              "tf_model.h5": "weights"}
    _same_bytes(src, out, ["1_Pooling/config.json", "config.json", *TOKENIZER])


def test_existing_files_refused_without_force_replaced_with(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("mine")
    with pytest.raises(WriteError, match="already exists") as e:
        convert(FIXTURES / "tiny-bert", out)
    assert e.value.path == str(out / "tokenizer.json")
    assert _listing(out) == ["tokenizer.json"]  # nothing written: the check comes before any write
    (out / "notes.txt").write_text("kept")
    convert(FIXTURES / "tiny-bert", out, overwrite=True)
    assert _listing(out) == ["config.json", "model.safetensors", "notes.txt", *TOKENIZER]
    _same_bytes(FIXTURES / "tiny-bert", out, TOKENIZER)


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    from weightio import convert as convert_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_module._Writer, "_write_index", interrupted)  # after shards and copies
    with pytest.raises(KeyboardInterrupt):
        convert(FIXTURES / "tiny-bert", str(tmp_path / "out" / "sub") + "/", max_shard_size="30kB", parents=True)
    assert os.listdir(tmp_path) == []  # no file, no temporary, no directory it created


def test_destination_inside_the_source_and_the_source_itself(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "tiny-bert", src)
    convert(src, str(src / "converted") + "/", dtype="bf16")
    again = convert(src, str(src / "converted") + "/", dtype="fp16", overwrite=True)
    assert _listing(src / "converted") == ["config.json", "model.safetensors", *TOKENIZER]  # not converted/converted
    assert again.skipped == {}
    (src / "model.safetensors").rename(src / "weights.safetensors")
    into_itself = convert(src / "weights.safetensors", src, format="safetensors")
    assert into_itself.copied == []  # a file source: nothing to bring
    same = convert(src, src, format="npz")
    assert same.copied == [] and same.skipped == {}  # its files are already there


def test_weights_only_and_file_destinations(tmp_path):
    result = convert(FIXTURES / "tiny-bert", str(tmp_path / "out") + "/", copy_files=False)
    assert _listing(tmp_path / "out") == ["model.safetensors"] and result.copied == []
    to_file = convert(FIXTURES / "tiny-bert", tmp_path / "t.npz")  # a file: just the weights
    assert to_file.copied == [] and to_file.notes == [] and sorted(os.listdir(tmp_path)) == ["out", "t.npz"]


def test_scan_lists_without_the_excluded(tmp_path):
    src = _model_dir(tmp_path)
    found = model_files.scan(str(src), exclude=[str(src / "config.json")], avoid=str(src / "1_Pooling"))
    assert found.files == ["notes.md", *TOKENIZER]


def test_a_hugging_face_cache_snapshot_links_into_its_blobs(tmp_path):
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    (snapshot / "1_Pooling").mkdir(parents=True)
    blobs.mkdir()
    (blobs / "c0ffee").write_text('{"model_type": "bert"}')
    (blobs / "beef").write_text("{}")
    (snapshot / "config.json").symlink_to("../../blobs/c0ffee")  # as huggingface_hub links them
    (snapshot / "1_Pooling" / "config.json").symlink_to("../../../blobs/beef")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    (snapshot / "escape.json").symlink_to("../../refs/main")  # in the repo's cache, not in its blobs
    found = model_files.scan(str(snapshot))
    assert found.files == ["1_Pooling/config.json", "config.json"]
    assert found.skipped == {"escape.json": "a link out of the model directory (not followed)"}


def test_a_file_replaced_by_a_fifo_after_the_scan_is_refused_not_opened(tmp_path):
    from weightio._staging import Staging
    from weightio.errors import InputError

    (tmp_path / "config.json").write_text("{}")
    found = model_files.scan(str(tmp_path))
    (tmp_path / "config.json").unlink()
    os.mkfifo(tmp_path / "config.json")  # no writer: a blocking open would hang forever
    staging = Staging(overwrite=False)
    with pytest.raises(InputError, match="no longer a regular file") as e:
        model_files.stage_copies(staging, [(str(tmp_path / found.files[0]), str(tmp_path / "out" / "config.json"))])
    assert e.value.path == str(tmp_path / "config.json")
    staging.discard()
    assert sorted(os.listdir(tmp_path)) == ["config.json"]  # the sub-folder it made is gone again


# ----------------------------------------------------------------------------- the command line


def test_cli_says_what_was_copied(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(FIXTURES / "models" / "bert"), str(tmp_path / "out") + "/"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"wrote {tmp_path / 'out' / 'model.safetensors'}: 39 tensors, 79.9 kB (safetensors)",
        "  copied: 3 other files of the model directory (config.json, tokenizer.json, tokenizer_config.json)",
        "  not copied: pytorch_model.bin (weights)"]
    doc = json.loads(runner.invoke(main, ["convert", str(FIXTURES / "models" / "bert"), str(tmp_path / "j") + "/",
                                          "--json"]).output)
    assert doc["schema"] == "weightio.convert/1"
    assert doc["copied"] == [str(tmp_path / "j" / n) for n in ["config.json", *TOKENIZER]]
    assert doc["skipped"] == {"pytorch_model.bin": "weights"}
    assert doc["files"] == [str(tmp_path / "j" / "model.safetensors")]
    result = runner.invoke(main, ["convert", str(FIXTURES / "tiny-bert"), str(tmp_path / "w") + "/", "--weights-only"])
    assert result.exit_code == 0 and _listing(tmp_path / "w") == ["model.safetensors"]


# ----------------------------------------------------------------------------- hf://


def test_hub_repo_files_come_along(tmp_path, monkeypatch):
    repo = repo_from_folder(FIXTURES / "tiny-bert-sharded", extra={
        "pytorch_model.bin": b"\x80\x02never fetched", "1_Pooling/config.json": b'{"pooling": 1}',
        ".gitattributes": b"*.bin lfs", "README.md": b"# tiny"})
    with serve({("model", "weightio/tiny"): repo}) as server:
        point_client_at(server, monkeypatch, tmp_path / "cache")
        result = convert("hf://weightio/tiny", str(tmp_path / "out") + "/")
        fetched = [r for r in server.requests if "pytorch_model.bin" in r[1]]
    out = tmp_path / "out"
    assert _listing(out) == ["1_Pooling/config.json", "README.md", "config.json", "model.safetensors", *TOKENIZER]
    assert result.skipped == {"pytorch_model.bin": "weights"} and fetched == []
    assert (out / "1_Pooling" / "config.json").read_bytes() == b'{"pooling": 1}'
    assert not (out / "config.json").is_symlink()  # the cache's links are followed: content copied
    _same_bytes(FIXTURES / "tiny-bert-sharded", out, ["config.json", *TOKENIZER])


# ----------------------------------------------------------------------------- transformers


def _transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers


def _pytorch_only(tmp_path: Path, name: str) -> Path:
    """A model directory as transformers 4 wrote it: pytorch_model.bin, config, tokenizer."""
    src = tmp_path / "bin-src"
    src.mkdir()
    for f in ["pytorch_model.bin", "config.json", *TOKENIZER]:
        shutil.copy(FIXTURES / name / f, src / f)
    return src


@pytest.mark.parametrize("name", [*MODELS, "bin:models/bert", "bin:models/deberta-v2"])
@pytest.mark.parametrize("shard", [None, "30kB"])
def test_from_pretrained_on_the_converted_directory(tmp_path, name, shard):
    torch, transformers = _transformers()
    src = _pytorch_only(tmp_path, name[4:]) if name.startswith("bin:") else FIXTURES / name
    out = tmp_path / "out"
    result = convert(src, str(out) + "/", max_shard_size=shard, verify=True)
    assert sorted(os.path.basename(f) for f in result.copied) == ["config.json", *TOKENIZER]
    text = ["hello world, the model reads weights", "convert it safely"]
    outputs = []
    for directory in (src, out):
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        model = transformers.AutoModel.from_pretrained(directory).eval()
        batch = tokenizer(text, padding=True, return_tensors="pt")
        with torch.no_grad():
            outputs.append((batch["input_ids"].numpy(), model(**batch).last_hidden_state.numpy()))
    assert (outputs[0][0] == outputs[1][0]).all() and not (outputs[0][0] == 1).all()  # [UNK] everywhere would pass
    np.testing.assert_array_equal(outputs[0][1], outputs[1][1])


def test_a_new_name_without_a_suffix_is_a_directory_when_the_source_is_one(tmp_path):
    # `weightio convert MODEL_DIR OUT_DIR`: OUT_DIR need not exist nor end in '/'
    result = CliRunner().invoke(main, ["convert", str(FIXTURES / "tiny-bert"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors", *TOKENIZER]
    # a file SRC keeps the rule it had: a DST without a suffix names no format
    result = CliRunner().invoke(main, ["convert", str(FIXTURES / "tiny-bert" / "model.safetensors"),
                                       str(tmp_path / "single")])
    assert result.exit_code == 2 and "cannot tell the output format from suffix (none)" in result.output
    assert not (tmp_path / "single").exists()
    assert into_directory("hf://org/Llama-3.1-8B", "out") and into_directory("hf://org/m@v1/sub", "out")
    assert not into_directory("hf://org/m/model.safetensors", "out")
    assert not into_directory("hf://org/m@v2/pytorch_model.bin", "out") and not into_directory("hf://o/m/w.npz", "o")
    assert not into_directory("hf://org/m/model.safetensors.index.json", "out")
    assert not into_directory(str(FIXTURES / "tiny-bert"), "out.v2")
