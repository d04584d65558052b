"""Sharded models opened by URL in one wave of requests, and models streamed with the next tensors in
flight: the requests each scheme makes, counted by the real servers (HTTP, moto's S3, the fake Hub)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save

import weightio as wio
from tests.hubserver import Repo
from tests.remote_fixtures import traffic
from weightio import _remote, _streaming

SHARDS = 6
COMMIT = "b" * 40


def _shards(rows: int = 64, count: int = SHARDS) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    """A model of `count` shards (two tensors each: ``w`` of `rows` x 96, ``b``) and its index:
    tensors, and files by name."""
    rng = np.random.default_rng(7)
    tensors, files, weight_map = {}, {}, {}
    for k in range(count):
        name = f"model-{k + 1:05d}-of-{count:05d}.safetensors"
        part = {f"layers.{k}.w": rng.standard_normal((rows, 96)).astype(np.float32),
                f"layers.{k}.b": np.arange(96, dtype=np.float32) + k}
        tensors |= part
        files[name] = save(part)
        weight_map |= {t: name for t in part}
    files["model.safetensors.index.json"] = json.dumps({"metadata": {"total_size": 1},
                                                        "weight_map": weight_map}).encode()
    files["config.json"] = b'{"model_type": "llama"}'
    return tensors, files


def _check(ckpt: wio.Checkpoint, tensors: dict[str, np.ndarray]) -> None:
    assert sorted(ckpt) == sorted(tensors)
    assert {n: (v.shape, v.dtype) for n, v in ckpt.items()} == {n: (a.shape, a.dtype) for n, a in tensors.items()}
    assert len(ckpt.files) == SHARDS


def test_http_shards_open_with_one_ranged_get_each_and_no_head(remote_files):
    tensors, files = _shards()
    for name, data in files.items():
        remote_files.put(f"m/{name}", data)
    remote_files.reset()
    with wio.open(remote_files.url("m/model.safetensors.index.json")) as ckpt:
        _check(ckpt, tensors)
        remote_files.server.idle()
        asked = remote_files.server.requests
        # the index, then every shard: one GET each, whose Content-Range told the size
        assert [r.method for r in asked] == ["GET"] * (1 + SHARDS)
        assert all(r.range == f"bytes=0-{_remote.BLOCK - 1}" and r.status == 206 for r in asked)
        assert sorted(r.path.rsplit("/", 1)[1] for r in asked[1:]) == sorted(f for f in files if f.startswith("model-"))
        assert traffic(ckpt) == (SHARDS, sum(len(d) for f, d in files.items() if f.startswith("model-")))


def test_http_shards_are_opened_at_once(remote_files):
    tensors, files = _shards()
    for name, data in files.items():
        remote_files.put(f"m/{name}", data)
    remote_files.reset()
    remote_files.server.delay = 0.1
    with wio.open(remote_files.url("m/model.safetensors.index.json")) as ckpt:
        _check(ckpt, tensors)
    assert remote_files.server.peak_in_flight == SHARDS  # one wave: every shard asked before any answered


def test_s3_shards_are_found_by_one_wave_of_ranged_gets_no_head_no_listing(s3_server):
    tensors, files = _shards(rows=512)  # each w 192 KiB: its read is a request after the open's
    for name, data in files.items():
        s3_server.put("models", f"m/{name}", data)
    s3_server.reset()
    s3_server.delay = 0.1
    with wio.open("s3://models/m/model.safetensors.index.json") as ckpt:
        _check(ckpt, tensors)
        s3_server.idle()
        assert s3_server.peak_in_flight == SHARDS  # one wave: every shard asked before any answered
        s3_server.delay = 0.0
        assert np.array_equal(ckpt["layers.3.w"].numpy(), tensors["layers.3.w"])
    s3_server.idle()
    assert s3_server.count(method="HEAD") == 0  # every object found by its first ranged GET: size and ETag
    assert s3_server.count(method="GET", contains="list-type=2") == 0
    index_gets = [r for r in s3_server.matching("GET") if r.path.endswith("/m/model.safetensors.index.json")]
    assert len(index_gets) == 1 and index_gets[0].range == "bytes=0-65535"
    shard_gets = [r for r in s3_server.requests if r.method == "GET" and "/m/model-" in r.path]
    assert len(shard_gets) == SHARDS + 1  # each shard's first block, then the tensor read
    assert [r.range for r in shard_gets[:SHARDS]] == ["bytes=0-65535"] * SHARDS
    assert shard_gets[-1].headers.get("if-match")  # the ETag its first GET brought guards later reads


def test_s3_shards_open_where_listing_is_denied(s3_server):
    tensors, files = _shards()
    for name, data in files.items():
        s3_server.put("models", f"m/{name}", data)
    s3_server.failures["list-type=2"] = 403  # a policy that lets objects be read but not listed
    with wio.open("s3://models/m/model.safetensors.index.json") as ckpt:
        _check(ckpt, tensors)
        assert np.array_equal(ckpt["layers.5.b"].numpy(), tensors["layers.5.b"])
    s3_server.idle()
    assert s3_server.count(method="HEAD") == 0
    assert s3_server.count(method="GET", contains="/m/model-") == SHARDS  # each found by its first ranged GET


def test_hf_sharded_open_lists_once_and_downloads_nothing(serve_hub, tmp_path):
    tensors, files = _shards()
    hub = serve_hub({("model", "org/sharded"): Repo({COMMIT: files}, {"main": COMMIT})})
    with wio.open("hf://org/sharded") as ckpt:
        _check(ckpt, tensors)
        hub.idle()
        api = [r.path for r in hub.matching(contains="/api/")]
        assert len(api) == 1 and api[0].startswith("/api/models/org/sharded?") and "blobs=true" in api[0]
        assert hub.count(method="HEAD") == 0  # one listing gave the commit and every size: no paths-info
        assert hub.count(contains="model.safetensors.index.json") == 1  # read by range, once
    snapshot = tmp_path / "hf-cache" / "models--org--sharded" / "snapshots"
    assert not snapshot.exists() or not any(p.is_file() for p in snapshot.rglob("*"))  # not even the index


@pytest.mark.parametrize(("count", "aiohttp"), [(3, True), (12, True), (12, False)])
def test_hf_shards_are_probed_together(serve_hub, monkeypatch, count, aiohttp):
    """A few Hub shards open on threads, many in one wave on an event loop (its client costs more to
    make), or on threads without aiohttp: every shard's first range is out before any is answered,
    and read once."""
    from weightio import remote

    assert 3 <= remote._WAVE < 12  # the two counts take the two ways
    if not aiohttp:
        monkeypatch.setattr(remote, "http_filesystem", lambda: None)
        monkeypatch.setattr(remote, "has_aiohttp", lambda: False)
    tensors, files = _shards(count=count)
    hub = serve_hub({("model", "org/many"): Repo({COMMIT: files}, {"main": COMMIT})})
    hub.delay = 0.05
    with wio.open("hf://org/many") as ckpt:
        hub.idle()
        assert sorted(ckpt) == sorted(tensors) and len(ckpt.files) == count
        firsts = hub.matching(contains="/cdn/")
        assert len(firsts) == count and {r.range for r in firsts} <= {f"bytes=0-{len(d) - 1}" for d in files.values()}
        assert hub.peak_in_flight >= count  # every shard's request out before any answered
        assert np.array_equal(ckpt[f"layers.{count - 1}.w"].numpy(), tensors[f"layers.{count - 1}.w"])


@pytest.mark.parametrize("scheme", ["http", "hf"])
def test_a_streamed_load_keeps_the_next_tensors_in_flight(remote_files, serve_hub, scheme):
    tensors, files = _shards(rows=512)  # each w 192 KiB: past its shard's first block
    if scheme == "http":
        for name, data in files.items():
            remote_files.put(f"m/{name}", data)
        server, url = remote_files.server, remote_files.url("m/")
    else:
        server = serve_hub({("model", "org/sharded"): Repo({COMMIT: files}, {"main": COMMIT})})
        url = "hf://org/sharded"
    with wio.open(url) as ckpt:
        server.idle()
        server.reset()
        server.delay = 0.1
        loaded = {name: view.numpy() for name, view in zip(ckpt, _streaming.reading_ahead(ckpt.values()), strict=True)}
        server.idle()
        assert server.peak_in_flight > 2  # the next tensors' requests were out while one was read
        fetched = sum(r.bytes for r in server.requests)
        assert fetched == sum(a.nbytes for n, a in tensors.items() if n.endswith(".w"))  # each once; b was in block 0
    assert loaded.keys() == tensors.keys()
    for name, array in tensors.items():
        assert np.array_equal(loaded[name], array) and not loaded[name].flags.writeable


def test_wio_load_of_a_url_reads_ahead(remote_files):
    tensors, files = _shards(rows=512)
    for name, data in files.items():
        remote_files.put(f"m/{name}", data)
    remote_files.server.delay = 0.05
    loaded = wio.load(remote_files.url("m/model.safetensors.index.json"))
    assert remote_files.server.peak_in_flight >= SHARDS  # the open's wave, then tensors several at once
    assert all(np.array_equal(loaded[n], a) for n, a in tensors.items()) and loaded.keys() == tensors.keys()


def test_prefetch_is_taken_by_the_next_read_and_local_views_ask_nothing(remote_files, tmp_path):
    big = np.random.default_rng(3).standard_normal((256, 512)).astype(np.float32)  # 512 KiB: past the first block
    tensors = {"big": big, "small": np.arange(10, dtype=np.int64)}
    (tmp_path / "one.safetensors").write_bytes(save(tensors))
    with wio.open(tmp_path / "one.safetensors") as local:
        assert local["big"].prefetch() == 0
    url = remote_files.put("m/one.safetensors", save(tensors))
    with wio.open(url) as ckpt:
        before = traffic(ckpt)
        assert ckpt["small"].prefetch() == 0  # in the header block already
        view = ckpt["big"]
        assert view.prefetch() == view.info.nbytes == big.nbytes
        assert view.prefetch() == 0  # on its way already
        assert np.array_equal(view.numpy(), big)
        assert traffic(ckpt) == (before[0] + 1, before[1] + big.nbytes)  # fetched once; numpy() took it
        assert np.array_equal(view.numpy(), big)  # taken once: a later read asks again
        assert traffic(ckpt) == (before[0] + 2, before[1] + 2 * big.nbytes)


def _many_tensors(count: int = 8, rows: int = 512) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {f"t{k}": rng.standard_normal((rows, 96)).astype(np.float32) for k in range(count)}  # 192 KiB each


def _gguf(tensors: dict[str, np.ndarray]) -> bytes:
    """A GGUF file of `tensors` (written by gguf-py: each tensor's data aligned to 32 bytes, padding between)."""
    gguf = pytest.importorskip("gguf")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        for name, array in tensors.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


@pytest.mark.parametrize("scheme", ["http", "hf"])  # hf: the answer streamed into the arrays; http: copied from it
@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])  # gguf: padding between tensors, dropped
def test_neighbouring_tensors_streamed_in_file_order_share_one_request(remote_files, serve_hub, scheme, fmt):
    tensors = _many_tensors()
    tensors["t3"] = np.ascontiguousarray(tensors["t3"][:511, :95])  # 194,180 bytes: gguf pads it to 32
    data = save(tensors) if fmt == "safetensors" else _gguf(tensors)
    name = f"m.{fmt}"
    if scheme == "http":
        server, url = remote_files.server, remote_files.put(f"m/{name}", data)
    else:
        server = serve_hub({("model", "org/one"): Repo({COMMIT: {name: data}}, {"main": COMMIT})})
        url = f"hf://org/one/{name}"
    with wio.open(url) as ckpt:
        server.idle()
        server.reset()
        views = list(ckpt.values())
        start, stop = min(v.stored_remote()[1] for v in views), max(sum(v.stored_remote()[1:]) for v in views)
        loaded = {view.name: view.numpy() for view in _streaming.reading_ahead(views)}
        server.idle()
        assert [r.range for r in server.requests] == [f"bytes={start}-{stop - 1}"]  # one request, all of them
        assert server.bytes_sent == stop - start
        padded = stop - start - sum(v.nbytes for v in views)
        assert padded == (28 if fmt == "gguf" else 0)
    assert loaded.keys() == tensors.keys()
    for key, array in tensors.items():
        assert np.array_equal(loaded[key], array) and not loaded[key].flags.writeable, key


def test_a_budget_smaller_than_the_model_keeps_at_most_that_much_on_its_way(remote_files):
    tensors = _many_tensors(count=16)
    url = remote_files.put("m/big.safetensors", save(tensors))
    budget = 4 * tensors["t0"].nbytes
    with wio.open(url) as ckpt:
        remote_files.reset()
        loaded = {view.name: view.numpy() for view in _streaming.reading_ahead(ckpt.values(), budget=budget)}
        sizes = sorted(int(r.range.split("=")[1].split("-")[1]) + 1 - int(r.range.split("=")[1].split("-")[0])
                       for r in remote_files.server.requests)
    assert all(np.array_equal(loaded[k], a) for k, a in tensors.items())
    assert sum(sizes) == sum(a.nbytes for a in tensors.values())  # every byte once
    assert 3 <= len(sizes) < len(tensors) and max(sizes) <= budget  # batches of neighbours, within the budget


@pytest.mark.parametrize("seed", range(20))
def test_a_shared_answer_lands_in_each_array_whatever_its_chunks(seed):
    """`_Scatter` (what a shared request writes through): pieces with gaps between them, chunks cut anywhere."""
    rng = np.random.default_rng(seed)
    answer = rng.integers(0, 256, 5000, dtype=np.uint8)
    pieces, offset = [], 100  # the answer covers file bytes 100..5100
    while offset < 5100:
        length = int(rng.integers(1, 600))
        length = min(length, 5100 - offset)
        out = np.zeros(length + 7, np.uint8)  # written at position 7
        pieces.append((offset, length, out, 7))
        offset += length + int(rng.integers(0, 40))  # a gap (padding) dropped
    pieces = [p for p in pieces if p[0] + p[1] <= 5100]
    scatter = _remote._Scatter(100, pieces[-1][0] + pieces[-1][1], pieces)
    cuts = sorted({0, len(scatter), *rng.integers(0, len(scatter), 30).tolist()})
    for a, b in zip(cuts, cuts[1:], strict=False):
        scatter[a:b] = answer[a:b].tobytes()
    for offset, length, out, at in pieces:
        assert np.array_equal(out[at: at + length], answer[offset - 100: offset - 100 + length])
        assert not out[:at].any()
