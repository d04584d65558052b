"""The weightio command over URLs: inspect, show, diff, convert and scan of files served remotely.

Files are served by the `remote_files` fixture (tests/remote_fixtures.py); the tests use only
its URLs and the client's own byte counts (`weightio.remote.traffic`, the ``fetched`` fields),
so they hold whatever server is behind it.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio import _remote
from weightio.convert import convert

from .conftest import FIXTURES
from .pytorch_files import P2, STOP, call, f32, pid, s, state_dict, torch_zip
from .pytorch_files import tensor as _tensor

BERT = FIXTURES / "tiny-bert"
MODEL = BERT / "model.safetensors"
BLOCK = _remote.BLOCK
OTHER_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json"]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def _header_bytes(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.fixture
def bert(remote_files):
    """tiny-bert served as a model folder (weights, config, tokenizer, and a .bin copy never fetched)."""
    for name in ["model.safetensors", *OTHER_FILES]:
        remote_files.put(f"bert/{name}", (BERT / name).read_bytes())
    remote_files.put("bert/pytorch_model.bin", b"\x80\x02not weights weightio would read")
    return remote_files.url("bert")


# ----------------------------------------------------------------------------- inspect


def test_inspect_a_remote_file_prints_what_local_prints_and_what_it_fetched(bert):
    url = f"{bert}/model.safetensors"
    remote, local = run("inspect", url), run("inspect", str(MODEL))
    assert remote.exit_code == 0, remote.output
    lines = remote.stdout.splitlines()
    assert lines[0] == url
    assert lines[2] == f"  fetched     1 request, {BLOCK / 1000:.1f} kB"  # the header fits in the first block
    assert lines[:2] + lines[3:] == [url] + local.stdout.splitlines()[1:]


def test_inspect_json_says_what_was_fetched(bert):
    url = f"{bert}/model.safetensors"
    doc = json.loads(run("inspect", url, "--json").stdout)
    size = MODEL.stat().st_size
    assert doc["fetched"] == {"requests": 1, "bytes": min(BLOCK, size)}
    assert _header_bytes(MODEL) <= doc["fetched"]["bytes"] <= _header_bytes(MODEL) + BLOCK
    assert doc["schema"] == "weightio.inspect/1" and doc["path"] == url and doc["files"] == [url]
    assert doc["tensor_count"] == 39 and doc["nbytes"] == 79912
    local = json.loads(run("inspect", str(MODEL), "--json").stdout)
    assert local["fetched"] == {"requests": 0, "bytes": 0}
    same = {k: v for k, v in local.items() if k not in ("path", "files", "fetched", "tensors")}
    assert {k: doc[k] for k in same} == same
    assert [{**t, "file": None} for t in doc["tensors"]] == [{**t, "file": None} for t in local["tensors"]]


def test_inspect_a_remote_folder_opens_its_weights(bert):
    doc = json.loads(run("inspect", bert, "--json", "--filter", "pooler.*").stdout)
    assert doc["files"] == [f"{bert}/model.safetensors"] and doc["tensor_count"] == 2
    assert doc["fetched"]["requests"] == 1 and doc["fetched"]["bytes"] <= _header_bytes(MODEL) + BLOCK


# ----------------------------------------------------------------------------- show, diff


def test_show_a_remote_tensor_fetches_its_bytes_only(remote_files):
    values = np.arange(256 * 1024, dtype=np.float32)  # 1 MiB: far more than one header block
    tail = np.linspace(-1, 1, 32, dtype=np.float32)
    from safetensors.numpy import save

    data = save({"big": values.reshape(512, 512), "small": tail})
    url = remote_files.put("two.safetensors", data)
    shown = run("show", url, "small", "-n", "3")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{url}: small" and lines[3] == "  size      128 B (32 values)"
    assert lines[-2] == "  values    [-1, -0.935484, -0.870968]  (first 3 of 32)"
    assert re.fullmatch(r"  fetched   \d requests, \d+\.\d kB \(headers and values\)", lines[-1])
    with wio.open(url) as ckpt:
        np.testing.assert_array_equal(ckpt["small"].numpy(), tail)
        requests, nbytes = wio.remote.traffic(ckpt)
    # the header's block, then the block holding "small" (the file's last, short one): never "big"'s 1 MiB
    assert requests == 2 and nbytes == BLOCK + (len(data) % BLOCK) < 2 * BLOCK


def test_diff_local_and_remote_are_equal(bert):
    result = run("diff", str(BERT), bert)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1:] == [f"B: {bert} (safetensors, 39 tensors)",
                                              "equal: 39 of 39 tensors present in both", "result: equal"]


def test_diff_sees_a_changed_remote_tensor(remote_files):
    from safetensors.numpy import load, save

    tensors = load(MODEL.read_bytes())
    tensors["pooler.dense.bias"] = tensors["pooler.dense.bias"] + 1
    url = remote_files.put("changed.safetensors", save(tensors))
    result = run("diff", str(MODEL), url, "-q")
    assert result.exit_code == 1 and result.stdout == ""


# ----------------------------------------------------------------------------- convert


def test_convert_a_remote_file_writes_the_bytes_a_local_conversion_writes(bert, tmp_path):
    ours, theirs = tmp_path / "remote.safetensors", tmp_path / "local.safetensors"
    result = run("convert", f"{bert}/model.safetensors", str(ours), "--json", "--verify")
    assert result.exit_code == 0, result.output
    assert run("convert", str(MODEL), str(theirs)).exit_code == 0
    assert ours.read_bytes() == theirs.read_bytes()
    doc = json.loads(result.stdout)
    assert doc["schema"] == "weightio.convert/1" and doc["files"] == [str(ours)] and doc["verified"] is True
    size = MODEL.stat().st_size
    # every tensor fetched once for writing and once more for --verify: never the header block twice
    assert doc["fetched"]["bytes"] <= size + (size - _header_bytes(MODEL))
    local = json.loads(run("convert", str(MODEL), str(tmp_path / "again.npz"), "--json").stdout)
    assert local["fetched"] == {"requests": 0, "bytes": 0}


def test_convert_streams_each_tensor_once_and_counts_fetched_bytes(bert, tmp_path):
    seen = []
    result = convert(f"{bert}/model.safetensors", tmp_path / "out.npz",
                     progress=lambda n, total: seen.append((n, total)))
    with wio.open(MODEL) as local:
        stored = [local[n].nbytes for n in local]
    assert [n for n, _ in seen] == stored and {t for _, t in seen} == {sum(stored)}
    assert result.fetched[1] == MODEL.stat().st_size  # the header block, then each tensor not in it, once
    with wio.open(tmp_path / "out.npz") as out, wio.open(MODEL) as local:
        for name in local:
            np.testing.assert_array_equal(out[name].numpy(), local[name].numpy())


def test_convert_a_remote_folder_into_a_directory_copies_its_other_files(bert, tmp_path):
    out = tmp_path / "out"
    result = run("convert", bert, str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(["model.safetensors", *OTHER_FILES])
    for name in OTHER_FILES:
        assert (out / name).read_bytes() == (BERT / name).read_bytes()
    assert "  copied: 3 other files of the model directory (config.json, tokenizer.json, tokenizer_config.json)" \
        in result.stdout.splitlines()
    assert "  not copied: pytorch_model.bin (weights)" in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1].startswith("  fetched: 2 requests, ")
    weights_only = run("convert", bert, str(tmp_path / "bare"), "--weights-only")
    assert weights_only.exit_code == 0 and [p.name for p in (tmp_path / "bare").iterdir()] == ["model.safetensors"]


def test_a_remote_sharded_folder_diffs_and_converts_like_the_local_one(remote_files, tmp_path):
    folder = FIXTURES / "tiny-bert-sharded"
    for file in folder.iterdir():
        remote_files.put(f"sharded/{file.name}", file.read_bytes())
    url = remote_files.url("sharded")
    assert run("diff", str(folder), url, "-q").exit_code == 0
    result = run("convert", url, str(tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [p.rsplit("/", 1)[-1] for p in doc["copied"]] == OTHER_FILES and doc["skipped"] == {}
    shards = sorted(folder.glob("*.safetensors"))
    assert doc["fetched"]["requests"] >= len(shards)
    assert doc["fetched"]["bytes"] == sum(p.stat().st_size for p in shards)  # every shard's bytes once
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["model.safetensors", *OTHER_FILES])


def test_convert_refuses_a_url_destination(bert):
    result = run("convert", bert, "s3://bucket/out.safetensors")
    assert result.exit_code == 2 and "writing to the Hub is not supported (nor to any URL)" in result.stderr


# ----------------------------------------------------------------------------- scan


def _torch_file(pickle: bytes) -> bytes:
    return torch_zip(pickle, {"0": f32(*range(1 << 18))})  # a 1 MiB storage the scan never needs


def _safe_pickle() -> bytes:
    return state_dict({"w": _tensor(pid("FloatStorage", "0", 1 << 18), 0, (1 << 18,), (1,))})


def test_scan_a_remote_file_fetches_its_pickles_not_its_tensors(remote_files, monkeypatch, tmp_path):
    fetched = []
    original = _remote.Traffic.add
    monkeypatch.setattr(_remote.Traffic, "add", lambda self, n: (fetched.append(n), original(self, n))[1])
    data = _torch_file(_safe_pickle())
    url = remote_files.put("ckpt/model.pt", data)
    remote = run("scan", url, "--json")
    assert remote.exit_code == 0, remote.output
    assert 0 < sum(fetched) <= 3 * BLOCK < len(data)
    local_path = tmp_path / "model.pt"
    local_path.write_bytes(data)
    local = json.loads(run("scan", str(local_path), "--json").stdout)
    doc = json.loads(remote.stdout)
    assert doc["path"] == url and doc["files"][0]["path"] == url and doc["safe"] is True
    assert doc["files"][0]["pickles"] == local["files"][0]["pickles"]


def test_scan_a_remote_folder_finds_the_unsafe_file(remote_files):
    remote_files.put("mixed/a.pt", _torch_file(_safe_pickle()))
    remote_files.put("mixed/b.pkl", P2 + call("posix", "system", s("echo never run")) + STOP)
    remote_files.put("mixed/config.json", b"{}")
    result = run("scan", remote_files.url("mixed"))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert f"{remote_files.url('mixed')}/a.pt: safe (pytorch)" in lines
    assert "    globals: posix.system (refused)" in lines
    assert lines[-2:] == ["skipped 1 file(s) that are no checkpoint: config.json", "result: UNSAFE"]


# ----------------------------------------------------------------------------- options and errors


@pytest.fixture
def recording(monkeypatch):
    """A filesystem (``wiorecord://``, the memory filesystem's files) that records its options."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    class Recording(MemoryFileSystem):
        protocol = ("wiorecord",)
        seen: list[dict] = []

        def __init__(self, *args, **options):
            Recording.seen.append(options)
            super().__init__()

        @classmethod
        def _strip_protocol(cls, path):
            return MemoryFileSystem._strip_protocol(path.replace("wiorecord://", "memory://", 1))

    fsspec.register_implementation("wiorecord", Recording, clobber=True)
    memory = fsspec.filesystem("memory")
    memory.pipe("/wiorecord-opts/model.safetensors", MODEL.read_bytes())
    yield "wiorecord://wiorecord-opts/model.safetensors", Recording.seen
    memory.rm("/wiorecord-opts", recursive=True)


def test_storage_options_are_parsed_as_json_or_kept_as_text(recording):
    url, seen = recording
    result = run("inspect", url, "--storage-option", "anon=true", "--storage-option", "retries=3",
                 "--storage-option", "profile=dev", "--storage-option", 'client_kwargs={"region_name": "eu"}',
                 "--storage-option", "empty=", "--storage-option", "eq=a=b")
    assert result.exit_code == 0, result.output
    assert {"anon": True, "retries": 3, "profile": "dev", "client_kwargs": {"region_name": "eu"}, "empty": "",
            "eq": "a=b"} in seen


@pytest.mark.parametrize("args,message", [
    (["--storage-option", "hunter2"], "Invalid value for '--storage-option': expects KEY=VALUE"),
    (["--storage-option", "=hunter2"], "Invalid value for '--storage-option': expects KEY=VALUE"),
    (["--storage-option", "key=hunter2", "--storage-option", "key=hunter3"],
     "Invalid value for '--storage-option': 'key' is given twice"),
])
def test_bad_storage_options_are_usage_errors_that_never_print_values(recording, args, message):
    url, _ = recording
    result = run("inspect", url, *args)
    assert result.exit_code == 2 and message in result.stderr
    assert "hunter" not in result.output


def test_options_that_do_not_apply_are_usage_errors(bert):
    local = run("inspect", str(MODEL), "--storage-option", "anon=true")
    assert local.exit_code == 2
    assert local.stderr.endswith(": storage options apply to URLs only, such as https:// and s3:// "
                                 "(drop --storage-option)\n")
    download = run("inspect", f"{bert}/model.safetensors", "--download")
    assert download.exit_code == 2
    assert download.stderr.endswith(": downloading into the Hugging Face cache applies to hf:// paths only; other "
                                    "URLs are read by range, or copied with `weightio convert URL model.safetensors` "
                                    "(drop --download)\n")
    # diff gives the options to the arguments they apply to: here the URL only
    assert run("diff", str(MODEL), f"{bert}/model.safetensors", "--storage-option", "skip_instance_cache=true",
               "-q").exit_code == 0
    assert run("scan", f"{bert}/model.safetensors", "--download").exit_code == 2
    scan_local = run("scan", str(MODEL), "--storage-option", "anon=true")
    assert scan_local.exit_code == 2 and "storage options apply to URLs only" in scan_local.stderr


@pytest.mark.parametrize("argv", [["inspect", "URL"], ["inspect", "URL", "--json"], ["show", "URL", "NAME"],
                                  ["convert", "URL", "x.npz"], ["scan", "URL"], ["diff", str(MODEL), "URL"]])
def test_a_missing_url_is_one_line_and_exit_1(remote_files, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    remote_files.put("here.safetensors", MODEL.read_bytes())
    url = remote_files.url("nope/model.safetensors")
    result = run(*[url if a == "URL" else a for a in argv], "--storage-option", 'headers={"X-Key": "TOPSECRET"}')
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr == f"weightio: error: {url}: not found (HTTP 404)\n"
    assert "TOPSECRET" not in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())  # convert left nothing behind


def test_an_option_the_http_filesystem_does_not_take_is_a_usage_error(remote_files):
    url = remote_files.put("here.safetensors", MODEL.read_bytes())
    result = run("inspect", url, "--storage-option", "secret=TOPSECRET")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"weightio: error: {url}: storage_options rejected by the HTTP filesystem: ")
    assert "'secret'" in result.stderr and "TOPSECRET" not in result.output


@pytest.mark.parametrize("command", ["inspect", "scan"])
def test_credentials_in_a_url_are_never_printed(command):
    pytest.importorskip("aiohttp")
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run(command, f"http://alice:pa55word@127.0.0.1:{port}/m.pt?X-Amz-Signature=f00d&token=hf_abcdefghij")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith(f"weightio: error: http://127.0.0.1:{port}/m.pt?…: ")
    assert len(result.stderr.splitlines()) == 1
    for secret in ("alice", "pa55word", "f00d", "hf_abcdefghij"):
        assert secret not in result.output
