"""Remote checkpoint benchmark: bytes, requests and round trips of reading hf://, https:// and s3:// models.

    python bench/remote.py [--reps 3] [--gib 0.3] [--shards 100]

Serves generated checkpoints from the project's real loopback servers (tests/servers.py and
tests/hubserver.py): plain HTTP with Range (``https`` rows: fsspec's HTTP filesystem), moto's S3
through s3fs (``s3``), and the fake Hugging Face Hub (``hf``: tree/paths-info, /resolve redirecting
to /cdn). The servers run in this process and count every request and body byte they answer; each
measurement runs in a fresh client process (`common.run_worker`), which reports when each of its
phases began and ended (``time.monotonic``, the same clock in every process), so the servers' logs
are split by phase. Loopback makes bandwidth the servers' own, so the table reports what they count
(bytes, requests) and ratios; times are medians of --reps runs.

1. inspect: ``wio.open(url)`` + every name, shape and dtype, for one file per format —
   safetensors, GGUF, PyTorch zip, .npz, .npy, legacy ggml (ggjt) — of a llama-like layout
   (a few MB of float16) over each scheme, with 20 ms injected before every answer: bytes moved vs
   the format's header bytes (every byte of the file that is not tensor payload), requests, and
   round trips (wall time / 20 ms). Local open time as context. Peers (hf, safetensors):
   ``HfFileSystem`` reading the header (8 bytes, then the JSON), ``HfApi.get_safetensors_metadata``.
2. one tensor: after the inspect, ``view.numpy()`` of a middle tensor: bytes moved vs its nbytes.
3. sharded open: a 100-shard safetensors model (index + shards) vs one file, 20 ms per request:
   extra round trips of the sharded open, per scheme.
4. streaming load: every tensor's ``numpy()`` of a ~--gib GiB llama-like model (3 safetensors
   shards + index) on the hub server, no delay, vs ``hf_hub_download`` of the same files and
   ``HfFileSystem().cat()`` of each: MB/s (the hub server is Python's http.server: context only)
   and ratios.
5. tensor parallel: rank 1 of 4 of the same model through ``VarBuilder.get_sharded``, as vLLM
   splits a llama (q/k/v/gate/up and embed_tokens/lm_head along dim 0, o/down along dim 1, norms
   replicated): bytes moved / model bytes, and requests.

The table goes into docs/benchmarks.md (section "remote") unless --no-write.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(1, str(_HERE.parent))  # the tests package: the loopback servers

from common import CACHE, arguments, environment, median, publish  # noqa: E402

SCRIPT = Path(__file__).resolve()
LOAD = os.getloadavg()
DELAY = 0.02  # injected before every answer for the round-trip measurements
SLACK = 64 << 10  # what a header or tensor read may move beyond its bytes
STREAM_REPEAT = 3  # the streaming loads run this many times per repetition (interleaved): the noisiest rows
SETTLE = 1.0  # seconds idle before each job: a client process started right after another one ran, on this
# machine, alternately 1.7x faster and not (the same streaming load: 241 vs 430 ms by its place in the sequence;
# with a second between jobs, 457-471 ms wherever it runs), which made a job's time depend on its neighbour
REPO = "bench/llama-tiny"
BIG_REPO = "bench/llama-stream"
SHARD_REPO = "bench/llama-sharded"
SINGLE_REPO = "bench/llama-one-file"

# The inspect files: llama-like, float16, a few MB (75 tensors).
SMALL = {"layers": 8, "hidden": 128, "inter": 352, "vocab": 2048}
# The streaming / tensor-parallel model: llama-like, float16; layers from --gib.
BIG = {"hidden": 1024, "inter": 2816, "vocab": 32000}
LAYER = {  # HF name -> (shape, tensor-parallel dim: 0 column-parallel, 1 row-parallel, None replicated)
    "self_attn.q_proj.weight": (("hidden", "hidden"), 0), "self_attn.k_proj.weight": (("hidden", "hidden"), 0),
    "self_attn.v_proj.weight": (("hidden", "hidden"), 0), "self_attn.o_proj.weight": (("hidden", "hidden"), 1),
    "mlp.gate_proj.weight": (("inter", "hidden"), 0), "mlp.up_proj.weight": (("inter", "hidden"), 0),
    "mlp.down_proj.weight": (("hidden", "inter"), 1), "input_layernorm.weight": (("hidden",), None),
    "post_attention_layernorm.weight": (("hidden",), None),
}
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
GGML_NAMES = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
              "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
              "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
              "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
              "post_attention_layernorm": "ffn_norm"}
FORMATS = {  # format -> file name
    "safetensors": "model.safetensors", "gguf": "model.gguf", "pytorch-zip": "pytorch_model.bin",
    "npz": "weights.npz", "npy": "embed.npy", "ggml": "model-ggjt.bin",
}
SCHEMES = ("http", "s3", "hf")


# ----------------------------------------------------------------------------- the files


def llama(dims: dict[str, int], layers: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """HF name -> (shape, tensor-parallel dim) of a llama-like model, in model order."""
    out: dict[str, tuple[tuple[int, ...], int | None]] = {
        "model.embed_tokens.weight": ((dims["vocab"], dims["hidden"]), 0)}
    for i in range(layers):
        for name, (shape, dim) in LAYER.items():
            out[f"model.layers.{i}.{name}"] = (tuple(dims[s] for s in shape), dim)
    out["model.norm.weight"] = ((dims["hidden"],), None)
    out["lm_head.weight"] = ((dims["vocab"], dims["hidden"]), 0)
    return out


def _tensors(shapes: dict[str, tuple[tuple[int, ...], int | None]], seed: int = 0) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s, dtype=np.float32).astype(np.float16) for n, (s, _) in shapes.items()}


def _renamed(name: str, table: dict[str, str], embed: str, norm: str, head: str, layer: str) -> str:
    if name == "model.embed_tokens.weight":
        return embed
    if name == "model.norm.weight":
        return norm
    if name == "lm_head.weight":
        return head
    _, _, i, rest = name.split(".", 3)
    module, leaf = rest.rsplit(".", 1)
    return layer.format(i=i, name=table[module], leaf=leaf)


def write_formats(folder: Path) -> dict[str, tuple[Path, int]]:
    """One llama-like file per format in `folder` (once): format -> (path, tensor payload bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {f: folder / name for f, name in FORMATS.items()}
    done = folder / "payload.json"
    if done.exists():
        payload = json.loads(done.read_text())
        return {f: (p, payload[f]) for f, p in paths.items()}
    import numpy as np

    tensors = _tensors(llama(SMALL, SMALL["layers"]))
    total = sum(a.nbytes for a in tensors.values())
    payload = {f: total for f in FORMATS}

    from safetensors.numpy import save_file

    save_file(tensors, str(paths["safetensors"]))
    np.savez(paths["npz"], **tensors)
    embed = tensors["model.embed_tokens.weight"]
    np.save(paths["npy"], embed)
    payload["npy"] = embed.nbytes

    import torch

    torch.save({n: torch.from_numpy(a) for n, a in tensors.items()}, paths["pytorch-zip"])
    _write_gguf(paths["gguf"], tensors)
    _write_ggml(paths["ggml"], tensors)
    done.write_text(json.dumps(payload))
    return {f: (p, payload[f]) for f, p in paths.items()}


def _vocab(n: int) -> list[str]:
    return [f"tok{i}_{'x' * (i % 7)}" for i in range(n)]


def _write_gguf(path: Path, tensors: dict) -> None:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != str(_HERE)]  # not bench/gguf.py
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(SMALL["layers"])
    writer.add_embedding_length(SMALL["hidden"])
    writer.add_feed_forward_length(SMALL["inter"])
    writer.add_head_count(4)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(_vocab(SMALL["vocab"]))
    writer.add_token_scores([float(-i) for i in range(SMALL["vocab"])])
    writer.add_token_types([1] * SMALL["vocab"])
    for name, array in tensors.items():
        writer.add_tensor(_renamed(name, GGUF_NAMES, "token_embd.weight", "output_norm.weight", "output.weight",
                                   "blk.{i}.{name}.{leaf}"), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_ggml(path: Path, tensors: dict) -> None:
    sys.path.insert(0, str(_HERE.parent / "fixtures"))
    from gen_ggml import legacy_bytes

    hparams = [SMALL["vocab"], SMALL["hidden"], 256, 4, SMALL["layers"], SMALL["hidden"] // 4, 1]
    vocab = [(t, float(-i)) for i, t in enumerate(_vocab(SMALL["vocab"]))]
    entries = [(_renamed(n, GGML_NAMES, "tok_embeddings.weight", "norm.weight", "output.weight",
                         "layers.{i}.{name}.{leaf}"), tuple(reversed(a.shape)), 1, a.tobytes())
               for n, a in tensors.items()]
    path.write_bytes(legacy_bytes("ggjt", 3, hparams, vocab, entries))


def write_shards(folder: Path, shards: int) -> tuple[Path, Path]:
    """A llama-like safetensors model as `shards` shards + index in ``folder/sharded``, and the same
    tensors as one file in ``folder/single``; returns (index path, single file path)."""
    from safetensors.numpy import save_file

    index = folder / "sharded" / "model.safetensors.index.json"
    single = folder / "single" / "model.safetensors"
    if index.exists() and single.exists():
        return index, single
    index.parent.mkdir(parents=True, exist_ok=True)
    single.parent.mkdir(parents=True, exist_ok=True)
    layers = max(1, math.ceil((2 * shards - 3) / len(LAYER)))  # at least two tensors a shard
    tensors = _tensors(llama(SMALL, layers), seed=1)
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for k in range(shards):
        chunk = names[k * len(names) // shards:(k + 1) * len(names) // shards]
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in chunk}, str(index.parent / shard))
        weight_map.update(dict.fromkeys(chunk, shard))
    total = sum(a.nbytes for a in tensors.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    save_file(tensors, str(single))
    return index, single


def big_dims(gib: float) -> tuple[dict[str, int], int]:
    """(dims, layers) of the streaming model: about `gib` GiB of float16 (smaller dims for tiny runs)."""
    dims = BIG if gib >= 0.1 else {"hidden": 256, "inter": 704, "vocab": 4096}
    per_layer = sum(math.prod(dims[s] for s in shape) for shape, _ in LAYER.values()) * 2
    fixed = 2 * dims["vocab"] * dims["hidden"] * 2
    return dims, max(1, round((gib * (1 << 30) - fixed) / per_layer))


def write_big(folder: Path, gib: float, shards: int = 3) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """The streaming / tensor-parallel model in `folder` (index + `shards` shards); its tensors' layout."""
    from safetensors.numpy import save_file

    dims, layers = big_dims(gib)
    layout = llama(dims, layers)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return layout
    folder.mkdir(parents=True, exist_ok=True)
    import numpy as np

    rng = np.random.default_rng(2)
    names = list(layout)
    sizes = [math.prod(layout[n][0]) * 2 for n in names]
    target = sum(sizes) / shards
    weight_map, chunk, filled, k = {}, {}, 0, 0
    for name, size in zip(names, sizes, strict=True):
        chunk[name] = rng.standard_normal(layout[name][0], dtype=np.float32).astype(np.float16)
        filled += size
        if filled >= target * (k + 1) or name == names[-1]:
            shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            save_file(chunk, str(folder / shard))
            weight_map.update(dict.fromkeys(chunk, shard))
            chunk, k = {}, k + 1
    if k != shards:  # fewer shards filled than planned (tiny models): rename to the real count
        for old in sorted(set(weight_map.values())):
            new = old.replace(f"-of-{shards:05d}", f"-of-{k:05d}")
            (folder / old).rename(folder / new)
            weight_map = {n: (new if s == old else s) for n, s in weight_map.items()}
    index.write_text(json.dumps({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, indent=2))
    return layout


def one_tensor(fmt: str) -> str:
    """The tensor read in the one-tensor case: layer 3's down projection, in the format's naming."""
    name = "model.layers.3.mlp.down_proj.weight"
    if fmt == "npy":
        return "embed"
    if fmt == "gguf":
        return "blk.3.ffn_down.weight"
    if fmt == "ggml":
        return "layers.3.feed_forward.w2.weight"
    return name


# ----------------------------------------------------------------------------- worker side


def _phase(phases: list, label: str, start: float) -> None:
    phases.append([label, start, time.monotonic()])


def _list(ckpt) -> list:  # noqa: ANN001
    return [(n, ckpt[n].shape, str(ckpt[n].dtype)) for n in ckpt]


def _worker(job: dict) -> dict:
    """Run one job in this fresh process; returns its result and phases ``[label, start, end]``
    (``time.monotonic``, the clock the servers stamp their requests with)."""
    cache = tempfile.mkdtemp(prefix="hf-cache-", dir=job.get("tmp"))
    os.environ["HF_HUB_CACHE"] = cache  # empty for every run: nothing is read from an earlier download
    try:
        return _run_job(job)
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


def _warm_client(job: dict) -> None:
    """What a process pays once, before its first request, done before timing for every peer alike: the
    imports of the transports, the S3 client (botocore's service models), the Hub client's agent registry."""
    import weightio.remote

    if job["server"] == "http":
        import fsspec.implementations.http  # noqa: F401
    elif job["server"] == "s3":
        weightio.remote.filesystem("s3://bench/")[0].connect()  # the instance (cached) wio.open gets for s3://
    else:
        weightio.remote.http_filesystem()  # aiohttp's import and fsspec's event loop, which waves of hf:// go on
        import huggingface_hub
        from huggingface_hub.utils import build_hf_headers, get_session

        huggingface_hub.HfFileSystem  # noqa: B018 - its lazy import
        build_hf_headers()  # the client's once-a-day agent registry (GET /api/agent-harnesses, not counted)
        get_session()  # its HTTP client (~20 ms: the CA bundle), which every peer's first request would make
    # numpy's OpenBLAS threads spin for ~0.1 s after its import (measured: ~100 ms of CPU): on a 2-CPU machine
    # shared with the servers, that would be charged to whichever client imported numpy last (weightio's)
    time.sleep(0.3)


def _run_job(job: dict) -> dict:
    import weightio as wio

    kind, phases, out = job["kind"], [], {}
    if job.get("server"):
        _warm_client(job)
    if kind == "local":
        start = time.monotonic()
        with wio.open(job["url"]) as ckpt:
            out["tensors"] = len(_list(ckpt))
        _phase(phases, "open", start)
    elif kind == "inspect":
        start = time.monotonic()
        ckpt = wio.open(job["url"])
        out["tensors"] = len(_list(ckpt))
        _phase(phases, "open", start)
        start = time.monotonic()
        out["nbytes"] = int(ckpt[job["tensor"]].numpy().nbytes)
        _phase(phases, "tensor", start)
        ckpt.close()
    elif kind == "open":
        start = time.monotonic()
        with wio.open(job["url"]) as ckpt:
            out["tensors"] = len(_list(ckpt))
            _phase(phases, "open", start)
    elif kind == "hffs-header":
        from huggingface_hub import HfFileSystem

        start = time.monotonic()
        with HfFileSystem().open(job["path"], "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        out["tensors"] = len([(k, v["shape"], v["dtype"]) for k, v in header.items() if k != "__metadata__"])
        _phase(phases, "open", start)
    elif kind == "hf-metadata":
        from huggingface_hub import HfApi

        start = time.monotonic()
        meta = HfApi().get_safetensors_metadata(job["repo"])
        out["tensors"] = sum(len(f.tensors) for f in meta.files_metadata.values())
        _phase(phases, "open", start)
    elif kind == "stream":
        out |= _stream(job, phases)
    elif kind == "tp":
        out |= _tensor_parallel(job, phases)
    else:
        raise ValueError(kind)
    return {"phases": phases, **out}


def _stream(job: dict, phases: list) -> dict:
    import weightio as wio

    repo, files, peer = job["repo"], job["files"], job["peer"]
    start = time.monotonic()
    if peer == "weightio":
        tensors = wio.load(f"hf://{repo}")
        got = sum(a.nbytes for a in tensors.values())
    elif peer == "hf_hub_download":
        from huggingface_hub import hf_hub_download

        got = sum(os.path.getsize(hf_hub_download(repo, f)) for f in files)
    elif peer == "snapshot_download":
        from huggingface_hub import snapshot_download

        folder = snapshot_download(repo, allow_patterns=files)
        got = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    elif peer == "HfFileSystem.cat":
        from huggingface_hub import HfFileSystem

        fs = HfFileSystem()
        got = sum(len(fs.cat(f"{repo}/{f}")) for f in files)
    else:
        raise ValueError(peer)
    _phase(phases, "load", start)
    return {"bytes": got}


def _tensor_parallel(job: dict, phases: list) -> dict:
    """Rank `rank` of `world`, as vLLM splits a llama: each class of tensor in a phase of its own."""
    import weightio as wio

    layout = {n: (tuple(s), d) for n, (s, d) in job["layout"].items()}
    rank, world = job["rank"], job["world"]
    start = time.monotonic()
    vb = wio.VarBuilder.from_path(f"hf://{job['repo']}")
    _phase(phases, "open", start)
    got = {}
    for label, dims in (("column", (0,)), ("row", (1,)), ("replicated", (None,))):
        start = time.monotonic()
        total = 0
        for name, (shape, dim) in layout.items():
            if dim not in dims:
                continue
            if dim is None:
                total += vb.get(shape, name).nbytes
            else:
                total += vb.get_sharded(shape, name, dim, rank, world).nbytes
        got[label] = total
        _phase(phases, label, start)
    vb.close()
    return {"nbytes": got}


# ----------------------------------------------------------------------------- driver: servers and jobs


class Servers:
    """The three loopback servers, serving every generated file; `env` points a client process at them."""

    def __init__(self, formats: dict[str, tuple[Path, int]], index: Path, single: Path, big: Path, tmp: Path) -> None:
        from tests.hubserver import HubServer, Repo
        from tests.servers import S3_ENV, S3_UNSET, HTTPRangeServer, S3Server

        shared = {f"formats/{p.name}": p.read_bytes() for p, _ in formats.values()}
        shared |= {f"sharded/{p.name}": p.read_bytes() for p in sorted(index.parent.iterdir())}
        shared["single/model.safetensors"] = single.read_bytes()
        self.http = HTTPRangeServer(shared).start()
        self.s3 = S3Server().start()
        self.s3.put_files("bench", shared)

        def repo(files: dict[str, bytes]) -> Repo:
            return Repo({"0" * 39 + "1": files}, {"main": "0" * 39 + "1"})

        def under(prefix: str) -> dict[str, bytes]:
            return {k[len(prefix):]: v for k, v in shared.items() if k.startswith(prefix)}

        self.hub = HubServer({
            ("model", REPO): repo(under("formats/")),
            ("model", SHARD_REPO): repo(under("sharded/")),
            ("model", SINGLE_REPO): repo(under("single/")),
            ("model", BIG_REPO): repo({p.name: p.read_bytes() for p in sorted(big.iterdir())}),
        }).start()
        self.by_name = {"http": self.http, "s3": self.s3, "hf": self.hub}
        home = tmp / "hf-home"
        home.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in S3_UNSET and k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                                                        "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE")}
        self.env |= {**S3_ENV, "AWS_ENDPOINT_URL_S3": self.s3.url, "AWS_CONFIG_FILE": "/nonexistent/aws-config",
                     "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials", "HF_ENDPOINT": self.hub.url,
                     "HF_HOME": str(home), "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                     "HF_HUB_DISABLE_XET": "1"}

    def url(self, scheme: str, path: str) -> str:
        """The URL of a served file: `path` is ``formats/x``, ``sharded/`` (the index) or ``single/``."""
        top, _, name = path.partition("/")
        if scheme == "hf":
            repo = {"formats": REPO, "sharded": SHARD_REPO, "single": SINGLE_REPO}[top]
            return f"hf://{repo}/{name}" if name else f"hf://{repo}"
        name = name or {"sharded": "model.safetensors.index.json", "single": "model.safetensors"}[top]
        return f"{self.http.url}/{top}/{name}" if scheme == "http" else f"s3://bench/{top}/{name}"

    def stop(self) -> None:
        for server in self.by_name.values():
            server.stop()


def run_job(servers: Servers, job: dict) -> dict:
    """One job in a fresh process; the server's requests split by the job's phases."""
    import subprocess

    server = servers.by_name.get(job.get("server", ""))
    time.sleep(SETTLE)
    if server is not None:
        server.delay = job.get("delay", 0.0)
        server.idle()
        server.reset()
    done = subprocess.run([sys.executable, str(SCRIPT), "--worker", json.dumps(job)], capture_output=True,
                          text=True, env=servers.env, cwd=str(_HERE.parent))
    if server is not None:
        server.idle()
        server.delay = 0.0
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    seen = server.matching() if server is not None else []
    result["seconds"], result["requests"], result["moved"] = {}, {}, {}
    for label, start, end in result.pop("phases"):
        mine = [r for r in seen if start <= r.started <= end]
        result["seconds"][label] = end - start
        result["requests"][label] = len(mine)
        result["moved"][label] = sum(r.bytes for r in mine)
        result.setdefault("chain", {})[label] = _chain(mine)
        result.setdefault("api", {})[label] = sum(r.bytes for r in mine if r.path.startswith("/api/"))
    if server is not None:
        result["peak_in_flight"] = server.peak_in_flight
        result["all_requests"] = len(seen)
    return result


def _chain(requests: list) -> int:
    """The longest chain of requests answered one after another (each begun after the previous ended):
    with a delay before every answer, the requests on the critical path."""
    count, last = 0, -math.inf
    for r in sorted(requests, key=lambda r: r.finished or r.started):
        if r.started >= last:
            count, last = count + 1, r.finished or r.started
    return count


def jobs(servers: Servers, formats: dict[str, tuple[Path, int]], big_files: list[str], layout: dict,
         delay: float, tmp: Path) -> dict[str, dict]:
    """Every measurement: key -> job."""
    out: dict[str, dict] = {}
    for fmt, (path, _) in formats.items():
        out[f"local/{fmt}"] = {"kind": "local", "url": str(path)}
        for scheme in SCHEMES:
            for key, wait in (("inspect", delay), ("inspect-no-delay", 0.0)):
                out[f"{key}/{fmt}/{scheme}"] = {"kind": "inspect", "server": scheme, "delay": wait,
                                                "url": servers.url(scheme, f"formats/{path.name}"),
                                                "tensor": one_tensor(fmt)}
    out["peer/HfFileSystem"] = {"kind": "hffs-header", "server": "hf", "delay": delay,
                                "path": f"{REPO}/{FORMATS['safetensors']}"}
    out["peer/get_safetensors_metadata"] = {"kind": "hf-metadata", "server": "hf", "delay": delay, "repo": REPO}
    for scheme in SCHEMES:
        for which in ("single", "sharded"):
            for key, wait in (("shards", delay), ("shards-no-delay", 0.0)):
                out[f"{key}/{which}/{scheme}"] = {"kind": "open", "server": scheme, "delay": wait,
                                                  "url": servers.url(scheme, f"{which}/")}
    out["shards/sharded/get_safetensors_metadata"] = {"kind": "hf-metadata", "server": "hf", "delay": delay,
                                                      "repo": SHARD_REPO}
    for peer in ("weightio", "hf_hub_download", "snapshot_download", "HfFileSystem.cat"):
        out[f"stream/{peer}"] = {"kind": "stream", "server": "hf", "peer": peer, "repo": BIG_REPO,
                                 "files": big_files, "repeat": STREAM_REPEAT}
    out["tp/weightio"] = {"kind": "tp", "server": "hf", "repo": BIG_REPO, "rank": 1, "world": 4,
                          "layout": {n: [list(s), d] for n, (s, d) in layout.items()}}
    for job in out.values():
        job["tmp"] = str(tmp)
    return out


def measure_all(servers: Servers, todo: dict[str, dict], reps: int) -> dict[str, dict]:
    """key -> medians over `reps` runs (seconds per phase; requests and bytes per phase), or its error.

    Jobs run one after another; the order rotates from one repetition to the next. A job with
    ``"repeat": n`` runs n times per repetition, its group of peers interleaved (the streaming
    load: its wall time on this machine is the noisiest, and bimodal)."""
    samples: dict[str, list[dict]] = {k: [] for k in todo}
    once = [k for k in todo if todo[k].get("repeat", 1) == 1]
    again = [k for k in todo if k not in once]
    keys = once + again * max((todo[k]["repeat"] for k in again), default=1)
    for rep in range(reps):
        shift = (rep * len(keys)) // max(reps, 1)
        for key in keys[shift:] + keys[:shift]:
            samples[key].append(run_job(servers, todo[key]))
        print(f"  rep {rep + 1}/{reps} done", file=sys.stderr)
    results = {}
    for key, runs in samples.items():
        errors = [r["error"] for r in runs if "error" in r]
        if errors:
            results[key] = {"error": errors[0]}
            continue
        last = runs[-1]
        results[key] = {**{k: v for k, v in last.items() if k not in ("seconds", "requests", "moved", "chain", "api")},
                        "api": {p: median([r["api"][p] for r in runs]) for p in last["api"]},
                        "chain": {p: median([r["chain"][p] for r in runs]) for p in last["chain"]},
                        "seconds": {p: median([r["seconds"][p] for r in runs]) for p in last["seconds"]},
                        "requests": {p: median([r["requests"][p] for r in runs]) for p in last["requests"]},
                        "moved": {p: median([r["moved"][p] for r in runs]) for p in last["moved"]},
                        "moved_range": {p: [min(r["moved"][p] for r in runs), max(r["moved"][p] for r in runs)]
                                        for p in last["moved"]},
                        "seconds_range": {p: [min(r["seconds"][p] for r in runs), max(r["seconds"][p] for r in runs)]
                                          for p in last["seconds"]},
                        "runs": len(runs)}
    return results


# ----------------------------------------------------------------------------- report


def _kb(n: float) -> str:
    return f"{n / 1000:,.1f} kB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def _error(r: dict) -> str:
    return "fails: " + r["error"].replace("|", "\\|")[:160]


def _load_note() -> str:
    after = os.getloadavg()[0]
    busy = max(LOAD[0], after) > (os.cpu_count() or 1)
    return (f"load average {LOAD[0]:.1f} before the run, {after:.1f} after"
            + (" (above the CPU count: a busy machine, read bytes and ratios, not times)" if busy else ""))


class Report:
    """The tables and the target checks, from `measure_all`'s results."""

    def __init__(self, results: dict, formats: dict[str, tuple[Path, int]], big_bytes: int, args,  # noqa: ANN001
                 delay: float) -> None:
        self.r, self.formats, self.big_bytes, self.args, self.delay = results, formats, big_bytes, args, delay
        self.checks: list[tuple[str, bool]] = []
        self.summary: dict = {}

    def header_bytes(self, fmt: str) -> int:
        path, payload = self.formats[fmt]
        return path.stat().st_size - payload

    def inspect(self) -> list[str]:
        d = self.delay * 1e3
        lines = [
            f"### 1. inspect one remote file (open + every name, shape, dtype), {d:g} ms before every answer",
            "",
            "Header bytes: every byte of the file that is not tensor payload (the most an opening could need). "
            "Bytes moved: every body byte the server sent, the Hub's API answers (listing, paths-info) included; "
            "the target is checked on the file's bytes (moved − API). "
            f"Round trips: the latency on the critical path, (wall with {d:g} ms before every answer − wall with "
            f"none) / {d:g} ms: the CPU time of both ends (the client's parse, the loopback servers' work, on "
            "this machine's 2 CPUs) is in both walls and cancels; wall / delay shows it included. The client's "
            "one-time imports, S3 client, event loop and Hub agent registry are done before timing. Sequential: "
            "the longest chain of requests the server answered one after another (its own count of the critical "
            "path; a server slower to accept a wave of connections than to answer the first counts part of the "
            "wave again). Local: the same open of the local file, page cache warm.",
            "",
            "| format | file size | header bytes | scheme | bytes moved | of which Hub API | file bytes − header "
            "| requests | sequential | round trips | wall / delay | wall | no delay | local open |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for fmt in self.formats:
            header, size = self.header_bytes(fmt), self.formats[fmt][0].stat().st_size
            local = self.r[f"local/{fmt}"]
            local_s = _error(local) if "error" in local else _ms(local["seconds"]["open"])
            fits, trips, worst = True, True, 0.0
            for scheme in SCHEMES:
                r, r0 = self.r[f"inspect/{fmt}/{scheme}"], self.r[f"inspect-no-delay/{fmt}/{scheme}"]
                if "error" in r or "error" in r0:
                    lines.append(f"| {fmt} | {_kb(size)} | {_kb(header)} | {scheme} | "
                                 f"{_error(r if 'error' in r else r0)} | | | | | | | | | {local_s} |")
                    fits = trips = False
                    continue
                moved, reqs, secs = r["moved"]["open"], r["requests"]["open"], r["seconds"]["open"]
                api, secs0 = r["api"]["open"], r0["seconds"]["open"]
                rt = (secs - secs0) / self.delay
                fits &= moved - api <= header + SLACK
                trips &= rt <= 4
                worst = max(worst, rt)
                self.summary[f"inspect/{fmt}/{scheme}"] = {"moved": moved, "api": api, "header": header,
                                                           "requests": reqs, "round_trips": rt,
                                                           "wall_round_trips": secs / self.delay,
                                                           "sequential": r["chain"]["open"]}
                lines.append(f"| {fmt} | {_kb(size)} | {_kb(header)} | {scheme} | {_kb(moved)} | {_kb(api)} "
                             f"| {_kb(moved - api - header)} | {reqs:g} | {r['chain']['open']:g} | {rt:.1f} "
                             f"| {secs / self.delay:.1f} | {_ms(secs)} | {_ms(secs0)} | {local_s} |")
            self.checks.append((f"inspect {fmt}: bytes moved (less the Hub's API answers) <= header bytes + 64 KiB "
                                "on http, s3 and hf", fits))
            if fmt in ("safetensors", "gguf", "pytorch-zip", "npz"):
                self.checks.append((f"inspect {fmt}: <= 4 round trips on http, s3 and hf (latency on the critical "
                                    f"path: up to {worst:.1f})", trips))
        for peer, note in (("HfFileSystem", "`HfFileSystem().open(...)`: read 8 bytes, then the JSON header"),
                           ("get_safetensors_metadata", "`HfApi().get_safetensors_metadata(repo)`")):
            r = self.r[f"peer/{peer}"]
            header = self.header_bytes("safetensors")
            if "error" in r:
                lines.append(f"| safetensors | | {_kb(header)} | hf, peer: {note} | {_error(r)} | | | | | | | | | |")
                continue
            moved, reqs, secs = r["moved"]["open"], r["requests"]["open"], r["seconds"]["open"]
            api = r["api"]["open"]
            lines.append(f"| safetensors | | {_kb(header)} | hf, peer: {note} | {_kb(moved)} | {_kb(api)} "
                         f"| {_kb(moved - api - header)} | {reqs:g} | {r['chain']['open']:g} | | "
                         f"{secs / self.delay:.1f} | {_ms(secs)} | | |")
        return lines

    def tensor(self) -> list[str]:
        lines = [
            "### 2. read one tensor (`view.numpy()` after the open above)",
            "",
            "| format | tensor | nbytes | scheme | bytes moved | moved − nbytes | requests |",
            "|---|---|---:|---|---:|---:|---:|",
        ]
        for fmt in self.formats:
            fits = True
            for scheme in SCHEMES:
                r = self.r[f"inspect/{fmt}/{scheme}"]
                if "error" in r:
                    lines.append(f"| {fmt} | {one_tensor(fmt)} | | {scheme} | {_error(r)} | | |")
                    fits = False
                    continue
                moved, n = r["moved"]["tensor"], r["nbytes"]
                fits &= moved <= n + SLACK
                self.summary[f"tensor/{fmt}/{scheme}"] = {"moved": moved, "nbytes": n,
                                                          "requests": r["requests"]["tensor"]}
                lines.append(f"| {fmt} | {one_tensor(fmt)} | {_kb(n)} | {scheme} | {_kb(moved)} | {_kb(moved - n)} "
                             f"| {r['requests']['tensor']:g} |")
            self.checks.append((f"one {fmt} tensor: bytes moved <= its nbytes + 64 KiB on http, s3 and hf", fits))
        return lines

    def shards(self) -> list[str]:
        d = self.delay * 1e3
        n = self.args.shards
        lines = [
            f"### 3. open a {n}-shard model (index + {n} shards) vs the same tensors in one file, {d:g} ms per answer",
            "",
            "`wio.open` of the index URL (http, s3) or the repo (hf) + every name, shape, dtype, run twice: with "
            f"{d:g} ms before every answer and with none. Latency: wall with the delay − wall without, in round "
            f"trips of {d:g} ms: how much of the open waits on answers one after another (a wave of a hundred "
            "requests costs one round trip of latency, a hundred requests in turn a hundred). Extra: the sharded "
            "open's latency − the one file's, the target. The wall time with the delay, / the delay, is shown "
            "too: it adds the CPU time of both ends, which share this machine's 2 CPUs (a hundred connections "
            "cost the loopback servers, Python's http.server, moto and the fake Hub, as much CPU as the client). "
            "Sequential: as in 1 (a server that takes longer to accept a hundred connections than to answer "
            "the first counts some of one wave twice). Peak in flight: most requests the server answered at once.",
            "",
            "| scheme | one file: wall | no delay | latency | requests | sequential | sharded: wall | no delay "
            "| latency | requests | sequential | bytes moved | peak in flight | extra latency | extra wall / delay |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for scheme in SCHEMES:
            runs = [self.r[f"{key}/{which}/{scheme}"] for which in ("single", "sharded")
                    for key in ("shards", "shards-no-delay")]
            if any("error" in r for r in runs):
                shown = "; ".join(_error(r) for r in runs if "error" in r)
                lines.append(f"| {scheme} | {shown} | | | | | | | | | | | | | |")
                self.checks.append((f"{n}-shard open over {scheme}: <= 2 round trips beyond one file", False))
                continue
            one, one0, many, many0 = (r["seconds"]["open"] for r in runs)
            lat_one, lat_many = (one - one0) / self.delay, (many - many0) / self.delay
            extra, extra_wall = lat_many - lat_one, (many - one) / self.delay
            extra_chain = runs[2]["chain"]["open"] - runs[0]["chain"]["open"]
            self.summary[f"shards/{scheme}"] = {"one_file_s": one, "sharded_s": many, "one_file_no_delay_s": one0,
                                                "sharded_no_delay_s": many0, "extra_latency_round_trips": extra,
                                                "extra_wall_round_trips": extra_wall, "extra_sequential": extra_chain,
                                                "requests": runs[2]["requests"]["open"],
                                                "moved": runs[2]["moved"]["open"]}
            lines.append(f"| {scheme} | {_ms(one)} | {_ms(one0)} | {lat_one:.1f} | {runs[0]['requests']['open']:g} "
                         f"| {runs[0]['chain']['open']:g} | {_ms(many)} | {_ms(many0)} | {lat_many:.1f} "
                         f"| {runs[2]['requests']['open']:g} | {runs[2]['chain']['open']:g} "
                         f"| {_kb(runs[2]['moved']['open'])} | {runs[2]['peak_in_flight']} | {extra:+.1f} "
                         f"| {extra_wall:+.1f} |")
            self.checks.append((f"{n}-shard open over {scheme}: <= 2 round trips of latency beyond one file "
                                f"(measured {extra:+.1f}; wall / delay {extra_wall:+.1f}, sequential requests "
                                f"{extra_chain:+g})", extra <= 2))
        r = self.r["shards/sharded/get_safetensors_metadata"]
        if "error" not in r:
            s = r["seconds"]["open"]
            lines.append(f"| hf, peer: `HfApi().get_safetensors_metadata(repo)` | | | | | | {_ms(s)} | | "
                         f"| {r['requests']['open']:g} | {r['chain']['open']:g} | {_kb(r['moved']['open'])} "
                         f"| {r['peak_in_flight']} | | |")
        else:
            lines.append(f"| hf, peer: `HfApi().get_safetensors_metadata(repo)` | | | | | | {_error(r)} "
                         "| | | | | | | | |")
        return lines

    def stream(self) -> list[str]:
        lines = [
            f"### 4. whole-model streaming load from the hub server ({self.big_bytes / 1e6:,.0f} MB of safetensors "
            "shards + index), no delay",
            "",
            "weightio: `weightio.load(\"hf://…\")` (every tensor's `numpy()`, in memory). Peers, same files from the "
            "same server, each run with an empty Hub cache: `hf_hub_download` of each file in turn, "
            "`snapshot_download` of the same files (8 at once), `HfFileSystem().cat()` of each file. "
            "The server is Python's `http.server` on loopback sharing the CPUs with the client: MB/s are context, "
            "the ratio is the result. Ratio = weightio's throughput / the peer's (> 1: weightio is faster). These "
            f"loads run {STREAM_REPEAT} times per repetition, peers interleaved: on this machine one run can take "
            "twice another's time for the same work (see the fastest and slowest).",
            "",
            "| peer | median time | runs | fastest | slowest | MB/s | bytes moved | requests | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base = self.r["stream/weightio"]
        for peer in ("weightio", "hf_hub_download", "snapshot_download", "HfFileSystem.cat"):
            r = self.r[f"stream/{peer}"]
            if "error" in r:
                lines.append(f"| {peer} | {_error(r)} | | | | | | | |")
                continue
            s = r["seconds"]["load"]
            fastest, slowest = r.get("seconds_range", {}).get("load", [s, s])
            ratio = "1" if peer == "weightio" or "error" in base else f"{s / base['seconds']['load']:.2f}×"
            lines.append(f"| {peer} | {_ms(s)} | {r['runs']} | {_ms(fastest)} | {_ms(slowest)} "
                         f"| {self.big_bytes / 1e6 / s:,.0f} | {_kb(r['moved']['load'])} "
                         f"| {r['requests']['load']:g} | {ratio} |")
        ok = "error" not in base
        for peer, want, label in (("hf_hub_download", 0.9, ">= 0.9x"), ("HfFileSystem.cat", 1.0, "beats")):
            r = self.r[f"stream/{peer}"]
            ratio = r["seconds"]["load"] / base["seconds"]["load"] if ok and "error" not in r else 0.0
            self.summary[f"stream/{peer}"] = ratio
            met = ratio > want if want == 1.0 else ratio >= want
            self.checks.append((f"streaming load {label} the throughput of {peer} (measured {ratio:.2f}x)", met))
        return lines

    def tensor_parallel(self) -> list[str]:
        r = self.r["tp/weightio"]
        lines = [
            "### 5. tensor-parallel rank 1 of 4, same model, `VarBuilder.get_sharded`",
            "",
            "As vLLM splits a llama: q/k/v/gate/up and embed_tokens/lm_head along dim 0 (column-parallel, "
            "vocab-parallel), o/down along dim 1 (row-parallel), norms replicated.",
            "",
            "| tensors | rank's bytes | bytes moved | moved / rank's bytes | requests |",
            "|---|---:|---:|---:|---:|",
        ]
        if "error" in r:
            lines.append(f"| all | {_error(r)} | | | |")
            self.checks.append(("a tensor-parallel rank of 4 moves <= 0.3x the model's bytes", False))
            return lines
        moved = 0
        for label in ("open", "column", "row", "replicated"):
            m, q = r["moved"][label], r["requests"][label]
            n = r["nbytes"].get(label, 0)
            moved += m
            shown = f"{m / n:.2f}×" if n else ""
            lines.append(f"| {label} | {_kb(n) if n else ''} | {_kb(m)} | {shown} | {q:g} |")
        ratio = moved / self.big_bytes
        self.summary["tp"] = {"moved": moved, "model": self.big_bytes, "ratio": ratio,
                              "requests": sum(r["requests"].values())}
        lines.append(f"| **total** | {_kb(sum(r['nbytes'].values()))} | {_kb(moved)} | | "
                     f"{sum(r['requests'].values()):g} |")
        lines += ["", f"Bytes moved / model bytes: **{ratio:.3f}** ({_kb(moved)} of {_kb(self.big_bytes)})."]
        self.checks.append((f"a tensor-parallel rank of 4 moves <= 0.3x the model's bytes (measured {ratio:.3f})",
                            ratio <= 0.3))
        return lines

    def text(self) -> str:
        a = self.args
        command = "python bench/remote.py" + (f" --reps {a.reps}" if a.reps != 3 else "") + \
            (f" --gib {a.gib:g}" if a.gib != 0.3 else "") + (f" --shards {a.shards}" if a.shards != 100 else "") + \
            (f" --delay {a.delay:g}" if a.delay != DELAY else "")
        body = [
            "## Remote checkpoints (hf://, https://, s3://)",
            "",
            f"`{command}` on {environment()}; {_load_note()}. Servers: tests/servers.py `HTTPRangeServer` (http rows, "
            "fsspec's HTTP filesystem), `S3Server` (moto, through s3fs), tests/hubserver.py `HubServer` (hf rows, "
            "/resolve redirecting to /cdn), all on loopback in the bench's process; every client in a fresh process. "
            "Bytes moved and requests are what the servers counted (body bytes; API calls included); medians of "
            f"{a.reps} runs. Each job starts after {SETTLE:g} s idle: a process started right after another ran "
            "alternately much faster and not on this machine, by its place in the sequence.",
            "",
            *self.inspect(), "", *self.tensor(), "", *self.shards(), "", *self.stream(), "", *self.tensor_parallel(),
        ]
        return "\n".join(body)


# ----------------------------------------------------------------------------- main


def main() -> None:
    def extra(parser) -> None:  # noqa: ANN001
        parser.add_argument("--shards", type=int, default=100, help="shards of the sharded model")
        parser.add_argument("--delay", type=float, default=DELAY, help="seconds injected before every answer")

    args = arguments(__doc__, reps=3, extra=extra, gib=0.3)
    base = CACHE / "remote"
    formats = write_formats(base / "formats")
    index, single = write_shards(base / f"shards-{args.shards}", args.shards)
    big = base / f"stream-{args.gib:g}g"
    layout = write_big(big, args.gib)
    big_files = sorted(p.name for p in big.iterdir())
    big_bytes = sum((big / f).stat().st_size for f in big_files if f.endswith(".safetensors"))
    tmp = Path(tempfile.mkdtemp(prefix="remote-", dir=CACHE))
    servers = Servers(formats, index, single, big, tmp)
    try:
        results = measure_all(servers, jobs(servers, formats, big_files, layout, args.delay, tmp), args.reps)
    finally:
        servers.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    (CACHE / "remote-results.json").write_text(json.dumps({"results": results}, indent=1))
    report = Report(results, formats, big_bytes, args, args.delay)
    text = report.text()
    (CACHE / "remote-results.json").write_text(json.dumps({"summary": report.summary, "results": results,
                                                           "checks": report.checks}, indent=1))
    publish("remote", text, report.checks, not args.no_write,
            title="Remote checkpoints (hf://): weightio vs huggingface_hub",
            measured=chart_rows(results, big_bytes, args.shards))


def chart_rows(results: dict, big_bytes: int, shards: int) -> list[dict]:
    """The chart's rows, weightio against huggingface_hub's own ways on the loopback Hub: inspect one
    safetensors file, open a sharded model, load a whole model. Failed runs are left out."""
    cases = [
        ("inspect model.safetensors on the Hub (hf://)", "open",
         {"weightio": "inspect/safetensors/hf", "HfFileSystem.open": "peer/HfFileSystem",
          "get_safetensors_metadata": "peer/get_safetensors_metadata"}),
        (f"open a {shards}-shard model on the Hub (hf://)", "open",
         {"weightio": "shards/sharded/hf", "get_safetensors_metadata": "shards/sharded/get_safetensors_metadata"}),
        (f"load a {big_bytes / 1e6:,.0f} MB model from the Hub", "load",
         {peer: f"stream/{peer}" for peer in ("weightio", "hf_hub_download", "snapshot_download", "HfFileSystem.cat")}),
    ]
    return [{"case": case, "peer": peer, "seconds": results[key]["seconds"][step], "bytes": results[key]["moved"][step]}
            for case, step, keys in cases for peer, key in keys.items() if "error" not in results[key]]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(json.loads(sys.argv[2]))))
    else:
        main()
