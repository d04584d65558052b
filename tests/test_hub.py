"""hf:// paths: parsing, choosing weights, and the real huggingface_hub client against a loopback Hub.

No test touches the internet: `tests/hubserver.py` serves the repos below on 127.0.0.1 the way
the Hub's HTTP API does, and the client is pointed at it through HF_ENDPOINT.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio import hub
from weightio.errors import FormatError, InputError

from .conftest import FIXTURES
from .hubserver import Repo, git_blob_id, point_client_at, repo_from_folder, serve

pytest.importorskip("huggingface_hub")

MAIN = "1" * 40
V1 = "2" * 40
PR = "3" * 40
TOKEN = "hf_" + "s3cr3t" * 6


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


def _repos() -> dict[tuple[str, str], Repo]:
    bert = FIXTURES / "tiny-bert" / "model.safetensors"
    config = (FIXTURES / "tiny-bert" / "config.json").read_bytes()
    sharded = repo_from_folder(FIXTURES / "tiny-bert-sharded", commit=MAIN)
    both = repo_from_folder(FIXTURES / "tiny-bert", commit=MAIN, extra={
        "pytorch_model.bin": b"\x80\x02not fetched", "tf_model.h5": b"not fetched", "README.md": b"# tiny",
        "tokenizer.json": b"{}", "onnx/model.onnx": b"not fetched"})
    numpy_st = (FIXTURES / "numpy.safetensors").read_bytes()
    return {
        ("model", "weightio/tiny-bert"): repo_from_folder(FIXTURES / "tiny-bert", commit=MAIN),
        ("model", "weightio/tiny-bert-sharded"): sharded,
        ("model", "weightio/both"): both,
        ("model", "weightio/revisions"): Repo({MAIN: {"model.safetensors": _bytes(bert)},
                                               V1: {"model.safetensors": numpy_st, "config.json": config},
                                               PR: {"model.safetensors": numpy_st}},
                                              {"main": MAIN, "v1.0": V1, "refs/pr/3": PR}),
        ("model", "weightio/folders"): Repo({MAIN: {"unet/diffusion_pytorch_model.safetensors": numpy_st,
                                                    "unet/config.json": b"{}", "text_encoder/model.safetensors":
                                                    _bytes(bert), "model_index.json": b"{}"}}, {"main": MAIN}),
        ("model", "weightio/ggufs"): Repo({MAIN: {"m-Q4_K_M.gguf": b"GGUF", "m-Q8_0.gguf": b"GGUF"}},
                                          {"main": MAIN}),
        ("model", "weightio/private"): repo_from_folder(FIXTURES / "tiny-bert", commit=MAIN, token=TOKEN),
        ("dataset", "weightio/arrays"): Repo({MAIN: {"data/arrays.npz": _bytes(FIXTURES / "numpy" / "arrays.npz")}},
                                             {"main": MAIN}),
    }


@pytest.fixture
def server(tmp_path, monkeypatch):
    with serve(_repos()) as running:
        point_client_at(running, monkeypatch, tmp_path / "cache")
        yield running


def _snapshot(tmp_path: Path, repo: str, commit: str = MAIN) -> Path:
    return tmp_path / "cache" / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("uri,expected", [
    ("hf://org/model", hub.HubPath("org/model")),
    ("hf://org/model/", hub.HubPath("org/model")),
    ("hf://org/model@v1.0", hub.HubPath("org/model", "model", "v1.0")),
    ("hf://org/model@v1.0/sub/model.safetensors", hub.HubPath("org/model", "model", "v1.0", "sub/model.safetensors")),
    ("hf://org/model/model.safetensors", hub.HubPath("org/model", "model", None, "model.safetensors")),
    ("hf://org/model@refs/pr/3", hub.HubPath("org/model", "model", "refs/pr/3")),
    ("hf://org/model@refs/pr/3/unet", hub.HubPath("org/model", "model", "refs/pr/3", "unet")),
    ("hf://org/model@refs/convert/parquet/x.npz", hub.HubPath("org/model", "model", "refs/convert/parquet", "x.npz")),
    ("hf://org/model@my%2Fbranch/f.gguf", hub.HubPath("org/model", "model", "my/branch", "f.gguf")),
    ("hf://datasets/org/data/arrays.npz", hub.HubPath("org/data", "dataset", None, "arrays.npz")),
    ("hf://spaces/org/app@abc", hub.HubPath("org/app", "space", "abc")),
    ("hf://models/org/model", hub.HubPath("org/model")),
    ("hf://datasets/x", hub.HubPath("datasets/x")),  # a user called "datasets"
])
def test_parse(uri, expected):
    assert hub.parse(uri) == expected


@pytest.mark.parametrize("uri,message", [
    ("hf://org", "expected hf://namespace/name"),
    ("hf://org/", "expected hf://namespace/name"),
    ("hf:///model", "expected hf://namespace/name"),
    ("hf://org/mo del", "expected hf://namespace/name"),
    ("hf://org/..", "expected hf://namespace/name"),
    ("hf://org/model@", "empty revision"),
    ("hf://org/model@..%2F..%2Ftmp%2Fx", "revision '../../tmp/x' is not a branch, tag or commit name"),
    ("hf://org/model@%2Fetc%2Fx", "revision '/etc/x' is not a branch, tag or commit name"),
    ("hf://org/model/a/../../etc/passwd", "not a plain relative path"),
    ("hf://org/model/a//b", "not a plain relative path"),
    ("org/model", "is not an hf:// path"),
])
def test_parse_rejects_malformed_paths(uri, message):
    with pytest.raises(InputError, match=message) as info:
        hub.parse(uri)
    assert info.value.path == uri


@pytest.mark.parametrize("path", ["hf://org/model", "hf://org/model@v1/x.gguf", "hf://org/model@refs/pr/3/unet",
                                  "hf://datasets/org/data@my%2Fbranch/a.npz"])
def test_str_round_trips(path):
    assert str(hub.parse(path)) == path


# ----------------------------------------------------------------------------- choosing the weights


def _shards(index):
    return [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]


@pytest.mark.parametrize("files,expected", [
    (["model.safetensors", "pytorch_model.bin", "config.json"], ["model.safetensors"]),
    (["pytorch_model.bin", "config.json"], ["pytorch_model.bin"]),
    (["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
      "pytorch_model.bin.index.json", "model.safetensors"],
     ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]),
    (["weights.safetensors", "pytorch_model.bin"], ["weights.safetensors"]),
    (["pytorch_model.bin", "pytorch_model-fp16.bin"], ["pytorch_model.bin"]),
    (["model.ckpt"], ["model.ckpt"]),
    (["m-Q4_K_M.gguf", "README.md"], ["m-Q4_K_M.gguf"]),
    (["big-00001-of-00003.gguf", "big-00003-of-00003.gguf", "big-00002-of-00003.gguf"],
     ["big-00001-of-00003.gguf", "big-00002-of-00003.gguf", "big-00003-of-00003.gguf"]),
    (["sub/model.safetensors", "pytorch_model.bin"], ["pytorch_model.bin"]),  # sub-folders are not the root's
])
def test_pick_weights_prefers_what_open_prefers(files, expected):
    assert hub.pick_weights(files, where="hf://o/m", read_index=_shards) == expected


@pytest.mark.parametrize("files,message", [
    (["a.safetensors", "b.safetensors"], "several candidate files (a.safetensors, b.safetensors); name one of them "
                                         "(hf://o/m/a.safetensors)"),
    (["m-Q4_K_M.gguf", "m-Q8_0.gguf"], "holds 2 GGUF files; name one: hf://o/m/m-Q4_K_M.gguf, hf://o/m/m-Q8_0.gguf"),
    (["README.md", "model.onnx"], "holds no weight files weightio reads (found: README.md, model.onnx)"),
    ([], "holds no weight files weightio reads (found: no files)"),
])
def test_pick_weights_explains_what_it_cannot_choose(files, message):
    with pytest.raises(FormatError) as info:
        hub.pick_weights(files, where="hf://o/m")
    assert info.value.message.endswith(message)


# ----------------------------------------------------------------------------- against the loopback Hub


def test_resolve_single_file_repo_downloads_the_weights_and_configs(server, tmp_path):
    path = hub.resolve("hf://weightio/tiny-bert")
    assert Path(path) == _snapshot(tmp_path, "weightio/tiny-bert") / "model.safetensors"
    assert Path(path).read_bytes() == (FIXTURES / "tiny-bert" / "model.safetensors").read_bytes()
    configs = ["config.json", "tokenizer.json", "tokenizer_config.json"]  # what transformers needs besides
    assert server.paths("GET") == ["/api/models/weightio/tiny-bert", f"/cdn/{_sha256(path)}",
                                   *(f"/weightio/tiny-bert/resolve/{MAIN}/{c}" for c in configs)]
    assert server.paths("HEAD") == [f"/weightio/tiny-bert/resolve/{MAIN}/{f}" for f in ["model.safetensors", *configs]]
    for name in configs:
        assert (Path(path).parent / name).read_bytes() == (FIXTURES / "tiny-bert" / name).read_bytes()


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_open_hf_path_reads_a_sharded_repo(server, tmp_path):
    shards = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    with wio.open("hf://weightio/tiny-bert-sharded") as ckpt, wio.open(FIXTURES / "tiny-bert-sharded") as local:
        assert ckpt.path == "hf://weightio/tiny-bert-sharded"
        assert ckpt.files == [f"hf://weightio/tiny-bert-sharded/{s}" for s in shards]
        assert list(ckpt) == list(local) and ckpt.metadata == local.metadata
        name = "encoder.layer.1.output.dense.weight"
        assert ckpt[name].numpy().tobytes() == local[name].numpy().tobytes()
    # nothing is downloaded: the (small) index is read by one GET, the shards by range, never whole
    assert server.paths("HEAD") == []
    assert [p.rsplit("/", 1)[-1] for p in server.paths("GET") if "index.json" in p] == ["model.safetensors.index.json"]
    snapshot = _snapshot(tmp_path, "weightio/tiny-bert-sharded")
    assert not snapshot.exists() or not any(p.is_file() for p in snapshot.rglob("*"))
    ranged = [r for r in server.requests if r[0] == "GET" and (r.range or "").startswith("bytes=") and r.status != 302]
    assert len(ranged) >= 3 and all(r.status == 206 and r.bytes <= 64 << 10 for r in ranged)


def test_prefers_safetensors_and_never_fetches_the_bin(server):
    with wio.open("hf://weightio/both") as ckpt:
        assert ckpt.format == "safetensors" and len(ckpt) == 39
    assert not any("pytorch_model.bin" in p or "tf_model" in p for p in server.paths())


def test_revisions_tags_and_pull_request_refs(server, tmp_path):
    assert Path(hub.resolve("hf://weightio/revisions@v1.0")).parent.name == V1
    with wio.open("hf://weightio/revisions@refs/pr/3") as ckpt:
        assert sorted(ckpt) == ["bias", "weight"] and ckpt.files == ["hf://weightio/revisions@refs/pr/3/model.safetensors"]
        read = ckpt["bias"].numpy().tobytes()
    with wio.open(hub.resolve("hf://weightio/revisions@refs/pr/3/model.safetensors")) as local:
        assert read == local["bias"].numpy().tobytes()
    assert f"/weightio/revisions/resolve/{PR}/model.safetensors" in server.paths("GET")  # pinned to the PR's commit
    assert Path(hub.resolve(f"hf://weightio/revisions@{MAIN}")).parent.name == MAIN
    assert "/api/models/weightio/revisions/revision/refs%2Fpr%2F3" in server.paths("GET")
    refs = tmp_path / "cache" / "models--weightio--revisions" / "refs"
    assert (refs / "v1.0").read_text() == V1 and (refs / "refs" / "pr" / "3").read_text() == PR


def test_named_file_and_sub_folder(server, tmp_path):
    config = hub.resolve("hf://weightio/revisions@v1.0/config.json")
    assert Path(config).read_bytes() == (FIXTURES / "tiny-bert" / "config.json").read_bytes()
    with wio.open("hf://weightio/folders/unet") as unet:
        assert sorted(unet) == ["bias", "weight"]
    with wio.open("hf://weightio/folders/text_encoder") as encoder:
        assert len(encoder) == 39
    assert not any("model_index.json" in p for p in server.paths())


def test_dataset_repos(server):
    with wio.open("hf://datasets/weightio/arrays/data/arrays.npz") as ckpt:
        assert ckpt.format == "npz" and "c_order" in ckpt
    assert "/api/datasets/weightio/arrays" in server.paths("GET")


@pytest.mark.parametrize("uri,message", [
    ("hf://weightio/nope", "repository not found on http://127.0.0.1:"),
    ("hf://weightio/revisions@v9", "revision not found on"),
    ("hf://weightio/tiny-bert/missing.safetensors",
     "has no file or folder 'missing.safetensors' at commit 111111111111"),
    ("hf://weightio/ggufs", "holds 2 GGUF files; name one: hf://weightio/ggufs/m-Q4_K_M.gguf, "
                            "hf://weightio/ggufs/m-Q8_0.gguf"),
    ("hf://weightio/private", "repository not found on"),
])
def test_hub_errors_are_weightio_errors_with_the_path(server, uri, message):
    with pytest.raises((InputError, FormatError)) as info:
        wio.open(uri)
    assert message in str(info.value) and str(info.value).startswith(uri + ": ")


def test_private_repo_with_a_token_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with wio.open("hf://weightio/private") as ckpt:
        assert len(ckpt) == 39
    sent = [h.get("authorization") for m, p, h in server.requests if not p.startswith("/cdn/")
            and "private" in p]
    assert sent and all(a == f"Bearer {TOKEN}" for a in sent)
    assert server.cdn_authorization == [None]  # the token stays with the Hub, not the CDN


def test_token_from_the_login_file(server, tmp_path):
    token_file = tmp_path / "hf-home" / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(TOKEN)
    assert Path(hub.resolve("hf://weightio/private")).name == "model.safetensors"


def test_tokens_never_appear_in_messages(server, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    server.fail_with = (500, f"internal error while checking token {TOKEN} and hf_abcdefghijklmnop")
    result = CliRunner().invoke(main, ["inspect", "hf://weightio/tiny-bert"])
    assert result.exit_code == 1
    assert TOKEN not in result.output and "hf_abcdefghijklmnop" not in result.output
    assert "answered HTTP 500 for the repository: internal error while checking token *** and hf_***" in result.stderr


def test_offline_from_a_populated_cache(server, tmp_path, monkeypatch):
    first = hub.resolve("hf://weightio/tiny-bert-sharded")
    single = hub.resolve("hf://weightio/revisions@v1.0")
    server.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.resolve("hf://weightio/tiny-bert-sharded") == first
    assert hub.resolve("hf://weightio/revisions@v1.0") == single
    with wio.open("hf://weightio/tiny-bert-sharded") as ckpt:
        assert len(ckpt) == 39
    with pytest.raises(InputError, match="is not in the cache .* and HF_HUB_OFFLINE is set"):
        hub.resolve("hf://weightio/tiny-bert")


def test_unreachable_hub_falls_back_to_the_cache(server, tmp_path):
    first = hub.resolve("hf://weightio/tiny-bert")
    server.fail_with = (503, "down for maintenance")
    assert hub.resolve("hf://weightio/tiny-bert") == first
    with pytest.raises(InputError, match=r"the Hub at http://127\.0\.0\.1:\d+ answered HTTP 503 for the repository: "
                                         "down for maintenance; it is not in the cache either"):
        hub.resolve("hf://weightio/tiny-bert-sharded")


def test_download_fetches_weights_and_configs_only(server, tmp_path):
    folder = Path(hub.download("weightio/both"))
    assert folder == _snapshot(tmp_path, "weightio/both")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                        "tokenizer_config.json"]


def test_download_to_a_local_dir_and_a_named_file(server, tmp_path):
    out = tmp_path / "local"
    assert Path(hub.download("hf://weightio/folders/unet", local_dir=str(out))) == out / "unet"
    assert sorted(p.name for p in (out / "unet").iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    gguf = hub.download("weightio/ggufs/m-Q8_0.gguf", revision=MAIN)
    assert Path(gguf).name == "m-Q8_0.gguf" and Path(gguf).read_bytes() == b"GGUF"


def test_cli_download_and_inspect(server, tmp_path):
    result = CliRunner().invoke(main, ["download", "weightio/tiny-bert"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{_snapshot(tmp_path, 'weightio/tiny-bert')}\n"
    result = CliRunner().invoke(main, ["inspect", "hf://weightio/tiny-bert-sharded"])
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:3] == ["hf://weightio/tiny-bert-sharded", "  format      safetensors",
                                              "  files       3"]
    bad = CliRunner().invoke(main, ["download", "weightio/nope"])
    assert bad.exit_code == 1 and bad.stderr.startswith("weightio: error: hf://weightio/nope: repository not found")


def test_etags_are_what_the_hub_sends():
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # `git hash-object /dev/null`


def test_import_weightio_does_not_import_huggingface_hub():
    code = "import sys, weightio; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_every_command_takes_hf_paths(server, tmp_path):
    out = tmp_path / "t.npz"
    converted = CliRunner().invoke(main, ["convert", "hf://weightio/tiny-bert-sharded", str(out), "--verify"])
    assert converted.exit_code == 0, converted.output
    assert CliRunner().invoke(main, ["diff", "hf://weightio/tiny-bert", str(out), "-q"]).exit_code == 0
    shown = CliRunner().invoke(main, ["show", "hf://weightio/tiny-bert", "pooler.dense.bias", "-n", "2"])
    assert shown.stdout.splitlines()[0] == "hf://weightio/tiny-bert: pooler.dense.bias"


# ----------------------------------------------------------------------------- downloads transformers loads offline

_LOAD_OFFLINE = """
import sys, numpy as np, transformers
model = transformers.AutoModel.from_pretrained(sys.argv[1])
np.savez(sys.argv[2], **{k: v.detach().numpy() for k, v in model.state_dict().items()})
print(type(model).__name__)
"""


def _tiny_transformers_repo(tmp_path: Path) -> Repo:
    """A BertModel of a few kB written by transformers' own save_pretrained, as a Hub repo."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path / "saved")
    return repo_from_folder(tmp_path / "saved", commit=MAIN, extra={"README.md": b"# tiny"})


def _load_offline(repo_id: str, out: Path, server) -> tuple[str, dict]:  # noqa: ANN001
    """transformers in a fresh process, HF_HUB_OFFLINE=1 and the Hub down: (model class, its state_dict)."""
    import os

    server.stop()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _LOAD_OFFLINE, repo_id, str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    import numpy as np

    with np.load(out) as loaded:
        return done.stdout.strip().splitlines()[-1], {k: loaded[k] for k in loaded.files}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["open", "cli"])
def test_a_download_loads_in_transformers_offline(server, tmp_path, how):
    server.repos[("model", "weightio/transformers")] = _tiny_transformers_repo(tmp_path)
    if how == "open":
        with wio.open("hf://weightio/transformers", download=True) as ckpt:
            read = {n: ckpt[n].numpy().copy() for n in ckpt}
            assert wio.remote.traffic(ckpt) == (0, 0)  # mapped from the cache, nothing read by range
    else:
        result = CliRunner().invoke(main, ["download", "-q", "weightio/transformers"])
        assert result.exit_code == 0, result.output
        with wio.open(result.stdout.strip()) as ckpt:
            read = {n: ckpt[n].numpy().copy() for n in ckpt}
    snapshot = _snapshot(tmp_path, "weightio/transformers")
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors"]  # never the README
    kind, state = _load_offline("weightio/transformers", tmp_path / "state.npz", server)
    assert kind == "BertModel" and sorted(state) == sorted(read)
    for name, value in read.items():
        assert state[name].dtype == value.dtype and state[name].tobytes() == value.tobytes(), name


@pytest.mark.slow
def test_weightio_inspect_download_then_offline(server, tmp_path, monkeypatch):
    result = CliRunner().invoke(main, ["inspect", "hf://weightio/tiny-bert", "--download", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    snapshot = _snapshot(tmp_path, "weightio/tiny-bert")
    assert doc["files"] == [str(snapshot / "model.safetensors")] and doc["fetched"] == {"requests": 0, "bytes": 0}
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                          "tokenizer_config.json"]
    server.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = CliRunner().invoke(main, ["inspect", "hf://weightio/tiny-bert", "--download", "--json"])
    assert offline.exit_code == 0, offline.output
    assert json.loads(offline.stdout)["files"] == doc["files"]
    with wio.open("hf://weightio/tiny-bert") as ckpt:  # offline, from the cache, without --download too
        assert ckpt.files == doc["files"] and len(ckpt) == 39
