"""GPU benchmark: a safetensors model from a warm page cache into CUDA memory, weightio and its peers.

    python bench/gpu.py [--reps 5] [--gib 4] [--explore] [--peers A,B] [--seconds S] [--no-write]

Runs only where ``torch.cuda.is_available()``; elsewhere it says so and writes nothing. The file
is bench/memory.py's (`--gib` GiB shaped like a transformer: per layer four bf16 2048 x 2048
matrices and a float32 norm), read into the page cache first. Each run is a fresh process,
timed after its imports and after the CUDA context exists (``torch.zeros(1, device="cuda")``),
up to ``torch.cuda.synchronize()`` once every tensor is on the GPU; medians of --reps runs,
peers interleaved. Ratio = peer time / weightio ``load_all`` time (> 1: weightio is faster).

Peers: the limit, a pinned host-to-device copy of the same bytes (the host buffer pinned and
filled before the clock); weightio ``devices.load_all(ckpt, "torch:cuda:0")`` and
``torch.load_into`` of a model built on ``meta``; safetensors ``safe_open(device="cuda:0")``;
fastsafetensors (``nogds=True``); the Run:ai streamer (tensors moved with ``.to("cuda:0")``, as
vLLM does); InstantTensor. A peer that is not installed is listed as such. With
``WEIGHTIO_BEFORE=<folder holding an older weightio>``, that copy's ``load_all`` and ``load_into``
run too ("weightio before", "weightio load_into before"). ``--peers pinned,weightio`` runs only the
peers whose names start so.

``--explore`` also times, in one process, the staging ring's geometry (buffer size, buffers,
piece size, fill threads) and the host side alone, for tuning; and, as more peers in fresh
processes, ``load_all`` through rings of 3 x 128 MiB and 4 x 64 MiB and the default ring with
8 MiB pieces instead of 4 (`RINGS`), ``load_into`` through the 4 x 64 MiB one, and ``load_all``
with each 4 MiB piece of a buffer a task of the fill pool (`TASK_A_PIECE`: as before the buffer's
pieces were shared by the threads of one C call, `filling._SHARED`).

``--seconds S`` (a GPU machine lent for a while): no repetition is begun that the time left would
not hold, a minute kept for ``--explore``'s runs, which are skipped when too little is left; the
peers' table is published before them, and each run's time printed as it ends.

Writes the table into docs/benchmarks.md (section "gpu").
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import arguments, environment, publish, run_order, settle, warm, worker_env  # noqa: E402
from memory import generate  # noqa: E402

SCRIPT = Path(__file__).resolve()
DEVICE = "cuda:0"
# --explore: other geometries of the staging ring (buffer MiB, buffers, piece MiB), as peers in fresh processes
RINGS = {"weightio load_all, ring 3 x 128 MiB": (128, 3, 8), "weightio load_all, ring 4 x 64 MiB": (64, 4, 8),
         "weightio load_all, ring 4 x 32 MiB, pieces 8 MiB": (32, 4, 8)}
INTO_RING = "weightio load_into, ring 4 x 64 MiB"
EXPLORING = 60  # seconds kept for --explore's runs in one process, out of --seconds
TASK_A_PIECE = "weightio load_all, a pool task a piece"  # the ring's fills as before `filling._SHARED`
PEERS = ["pinned host-to-device copy", "weightio load_all", "weightio load_into (meta model)",
         "weightio before", "weightio load_into before", "safetensors safe_open", "fastsafetensors",
         "Run:ai streamer", "InstantTensor"]


# ----------------------------------------------------------------------------- worker side


def _model(torch, path: str):
    """A module on ``meta`` whose parameters have the file's names and shapes."""
    from safetensors import safe_open

    root = torch.nn.Module()
    with safe_open(path, "pt") as f, torch.device("meta"):
        for name in f.keys():
            owner = root
            *parents, leaf = name.split(".")
            for part in parents:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            shape = f.get_slice(name).get_shape()
            dtype = torch.bfloat16 if f.get_slice(name).get_dtype() == "BF16" else torch.float32
            owner.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False))
    return root


def _loaders(torch, path: str) -> dict:
    def pinned():
        size = os.path.getsize(path)
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        with open(path, "rb") as f:
            f.readinto(host.numpy())

        def run():
            return {"all": host.to(DEVICE, non_blocking=True)}

        return run

    def wio_all():
        import weightio as wio

        return wio.devices.load_all(wio.open(path), "torch:" + DEVICE)

    def use_ring(chunk: int, slots: int, piece: int) -> None:
        """The device's backend stages through a ring of this geometry (MiB, buffers, MiB)."""
        import weightio as wio

        engine = wio.devices.backend("torch:" + DEVICE)
        engine.loader = wio.devices.StagedLoader(engine, chunk=chunk << 20, slots=slots, piece=piece << 20)

    def wio_task_a_piece():
        from weightio.devices import filling

        filling._SHARED = False
        return wio_all()

    def wio_ring(geometry: tuple[int, int, int]):
        def run():
            use_ring(*geometry)
            return wio_all()

        return run

    def wio_into(ring: tuple[int, int, int] | None = None):
        import weightio as wio

        model = _model(torch, path)
        if ring is not None:
            use_ring(*ring)

        def run():
            wio.torch.load_into(model, path, device="torch:" + DEVICE, assign=True)
            return dict(model.named_parameters())

        return run

    def st():
        from safetensors import safe_open

        with safe_open(path, "pt", device=DEVICE) as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    def fastsafetensors():
        from fastsafetensors import fastsafe_open

        with fastsafe_open(filenames=[path], nogds=True, device=DEVICE) as f:
            return {k: f.get_tensor(k).clone() for k in f.keys()}  # its buffers are freed on close

    def runai():
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as s:
            s.stream_file(path)
            return {k: t.to(DEVICE) for k, t in s.get_tensors()}

    def instant():
        from instanttensor import safe_open

        with safe_open(path, framework="pt", device=0) as f:
            return dict(f.tensors())

    return {"pinned host-to-device copy": pinned, "weightio load_all": wio_all, "weightio before": wio_all,
            "weightio load_into (meta model)": wio_into, "weightio load_into before": wio_into,
            **{label: wio_ring(geometry) for label, geometry in RINGS.items()},
            INTO_RING: lambda: wio_into(RINGS["weightio load_all, ring 4 x 64 MiB"]), TASK_A_PIECE: wio_task_a_piece,
            "safetensors safe_open": st,
            "fastsafetensors": fastsafetensors, "Run:ai streamer": runai, "InstantTensor": instant}


# set up before the clock
_PREPARED = {"pinned host-to-device copy", "weightio load_into (meta model)", "weightio load_into before", INTO_RING}
_IMPORTS = {"weightio": "weightio.devices.torch", "safetensors": "safetensors", "fastsafetensors": "fastsafetensors",
            "Run:ai": "runai_model_streamer", "InstantTensor": "instanttensor", "pinned": "torch"}


def _worker(peer: str, path: str) -> dict:
    import importlib

    if peer.endswith("before"):
        sys.path.insert(0, os.environ["WEIGHTIO_BEFORE"])
    import torch

    module = next(m for prefix, m in _IMPORTS.items() if peer.startswith(prefix))
    importlib.import_module(module)
    if peer.startswith("weightio"):
        importlib.import_module("weightio.torch")
    torch.zeros(1, device=DEVICE)
    torch.cuda.synchronize()
    fn = _loaders(torch, path)[peer]
    if peer in _PREPARED:
        fn = fn()
    settle()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    return {"seconds": seconds, "bytes": nbytes, "check": _check(torch, out, path)}


def _check(torch, out: dict, path: str) -> str:
    """A digest of three tensors' bytes as loaded (the first, a middle and the last in the file;
    for the pinned copy, the same bytes cut out of the whole file)."""
    import hashlib

    offsets = _offsets(path)
    order = list(offsets)
    names = [order[0], order[len(order) // 2], order[-1]]
    if "all" in out:
        parts = [out["all"][a:b] for a, b in (offsets[n] for n in names)]
    else:
        parts = [out[n].reshape(-1).view(torch.uint8) for n in names]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _offsets(path: str) -> dict[str, tuple[int, int]]:
    """name -> (start, stop) in the file, in file order."""
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    rows = sorted(((k, v["data_offsets"]) for k, v in header.items()), key=lambda r: r[1][0])
    return {k: (8 + n + a, 8 + n + b) for k, (a, b) in rows}


# ----------------------------------------------------------------------------- exploring the ring


def explore(path: str) -> list[dict]:
    """The staging ring's geometry and the host side alone, timed in this process (median of 3,
    after one warm-up run that allocates the ring)."""
    import torch

    import weightio as wio
    from weightio import _threads, devices
    from weightio.devices import filling

    torch.zeros(1, device=DEVICE)
    engine = devices.backend("torch:" + DEVICE)
    rows = []
    ckpt = wio.open(path)
    arrays = {k: ckpt[k].numpy() for k in ckpt}
    size = sum(a.nbytes for a in arrays.values())

    def timed(fn, n=3):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            del out
        return statistics.median(times)

    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    host.numpy()[:] = 1
    rows.append({"variant": "pinned h2d (limit)", "seconds": timed(lambda: host.to(DEVICE, non_blocking=True))})
    hosts = host.numpy()
    pairs, pos = [], 0
    for a in arrays.values():
        pairs.append((hosts[pos : pos + a.nbytes], a))
        pos += a.nbytes
    for threads in (8, 16, 24, 32):
        _threads._pools.pop("fill", None)
        filling._THREADS = threads
        rows.append({"variant": f"host only: pread into pinned memory, {threads} threads",
                     "seconds": timed(lambda: filling.fill(pairs))})
    _threads._pools.pop("fill", None)
    filling._THREADS = 16
    for chunk, slots, piece in ((32, 4, 4), *RINGS.values()):
        loader = devices.StagedLoader(engine, chunk=chunk << 20, slots=slots, piece=piece << 20)
        start = time.perf_counter()
        loader.load(arrays)
        torch.cuda.synchronize()
        rows.append({"variant": f"ring {slots} x {chunk} MiB: first load (ring allocated)",
                     "seconds": time.perf_counter() - start})
        rows.append({"variant": f"ring {slots} x {chunk} MiB, pieces {piece} MiB, 16 threads",
                     "seconds": timed(lambda loader=loader: loader.load(arrays))})
        loader.release()
    rows += _registered(torch, arrays, timed)
    for r in rows:
        r["GB/s"] = round(size / r["seconds"] / 1e9, 1)
        print(f"  {r['variant']:<60} {r['seconds'] * 1e3:8.1f} ms {r['GB/s']:6.1f} GB/s", file=sys.stderr)
    return rows


def _registered(torch, arrays: dict, timed) -> list[dict]:
    """cudaHostRegister of the file's mapping (read-only), then copies straight from it: whole,
    and pipelined (windows registered on several threads, each copied once registered)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    first = next(iter(arrays.values()))
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    ptr, n = root.__array_interface__["data"][0], root.nbytes
    cudart = torch.cuda.cudart()
    start = time.perf_counter()
    err = cudart.cudaHostRegister(ptr, n, 8)  # cudaHostRegisterReadOnly
    registered = time.perf_counter() - start
    if int(err) != 0:
        return [{"variant": f"cudaHostRegister of the mapping: error {err}", "seconds": registered}]
    view = torch.frombuffer(memoryview(root.view(np.uint8)), dtype=torch.uint8)
    dev = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    copy = timed(lambda: dev.copy_(view, non_blocking=True))
    start = time.perf_counter()
    cudart.cudaHostUnregister(ptr)
    unregistered = time.perf_counter() - start
    rows = [{"variant": "cudaHostRegister(read-only) of the mapping", "seconds": registered},
            {"variant": "copy from the registered mapping", "seconds": copy},
            {"variant": "cudaHostUnregister", "seconds": unregistered}]
    page = 4096
    base = ptr - ptr % page
    for threads, window in ((4, 64), (8, 64), (16, 32)):
        step = window << 20
        bounds = [(a, min(a + step, n + (ptr - base))) for a in range(0, n + (ptr - base), step)]
        pool = ThreadPoolExecutor(threads)
        list(pool.map(lambda _: None, range(threads)))  # threads started before the clock
        start = time.perf_counter()
        jobs = [pool.submit(cudart.cudaHostRegister, base + a, b - a, 8) for a, b in bounds]
        for (a, b), job in zip(bounds, jobs, strict=True):
            assert int(job.result()) == 0
            lo, hi = max(a - (ptr - base), 0), b - (ptr - base)
            dev[lo:hi].copy_(view[lo:hi], non_blocking=True)
        torch.cuda.synchronize()
        took = time.perf_counter() - start
        start = time.perf_counter()
        list(pool.map(lambda ab: cudart.cudaHostUnregister(base + ab[0]), bounds))
        rows.append({"variant": f"pipelined: register {window} MiB windows on {threads} threads + copy",
                     "seconds": took})
        rows.append({"variant": f"  its unregister on {threads} threads", "seconds": time.perf_counter() - start})
        pool.shutdown()
    return rows


# ----------------------------------------------------------------------------- driver


def run_one(peer: str, path: str) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--worker", peer, path], capture_output=True, text=True,
                         env=worker_env())
    if out.returncode != 0:
        lines = [x for x in out.stderr.strip().splitlines() if x.strip()]
        return {"failed": lines[-1][:200] if lines else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(path: str, peers: list[str], reps: int, seconds: float = 0) -> dict[str, dict]:
    """Each peer's runs, `reps` repetitions in balanced orders; with `seconds`, no repetition is begun
    that the time left would not hold (as long as the longest so far), so a machine lent for a while
    still reports whole repetitions. Each run's time is printed as it ends (a log cut short keeps them)."""
    samples: dict[str, list[dict]] = {p: [] for p in peers}
    failed: dict[str, str] = {}
    began, longest = time.monotonic(), 0.0
    for rep in range(reps):
        if seconds and rep and time.monotonic() - began + longest > seconds:
            print(f"  stopped after {rep} of {reps} repetitions: the {seconds:.0f} s given would not hold another",
                  file=sys.stderr)
            break
        start = time.monotonic()
        for peer in (peers[i] for i in run_order(len(peers), rep)):
            if peer in failed:
                continue
            r = run_one(peer, path)
            if "failed" in r:
                failed[peer] = r["failed"]
                print(f"  {peer}: {r['failed']}", file=sys.stderr)
            else:
                samples[peer].append(r)
                print(f"  {peer}: {r['seconds'] * 1e3:.1f} ms", file=sys.stderr)
        longest = max(longest, time.monotonic() - start)
        print(f"  rep {rep + 1}/{reps} done", file=sys.stderr)
    out = {}
    for peer in peers:
        if peer in failed:
            out[peer] = {"failed": failed[peer]}
            continue
        runs = samples[peer]
        out[peer] = {"seconds": statistics.median(r["seconds"] for r in runs), "runs": len(runs),
                     "fastest": min(r["seconds"] for r in runs), "bytes": runs[0]["bytes"],
                     "checks": sorted({r["check"] for r in runs})}
    return out


def report(results: dict, explored: list[dict], reps: int, command: str, size: int) -> str:
    import torch

    baseline = results.get("weightio load_all", {})  # (it may have failed: no ratios then)
    base, reference = baseline.get("seconds"), baseline.get("checks")
    lines = ["## GPU: a model into CUDA memory", "",
             f"`python bench/gpu.py {command}` on {environment()}; "
             f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}.",
             f"File: {size / (1 << 30):.2f} GiB `model.safetensors` (bench/memory.py's), warm page cache. Each run "
             "is a fresh process, timed after its imports, the CUDA context and the full garbage collection the "
             "imports are owed (`bench/common.py` `settle`), until `torch.cuda.synchronize()`; "
             f"medians of {reps} runs, peers interleaved. Ratio = peer time / weightio `load_all` time "
             "(> 1: weightio is faster). Bytes: what each loaded, checked the same (sha256 of three tensors).",
             "", "| peer | median | fastest | GB/s | ratio | same bytes |", "|---|---:|---:|---:|---:|---|"]
    for peer, r in results.items():
        if "failed" in r:
            lines.append(f"| {peer} | cannot run here: {r['failed']} | | | | |")
            continue
        same = "n/a" if reference is None else "yes" if r["checks"] == reference else f"no ({r['checks']})"
        ratio = f"{r['seconds'] / base:.2f}×" if base else "n/a"
        lines.append(f"| {peer} | {r['seconds'] * 1e3:.0f} ms | {r['fastest'] * 1e3:.0f} ms | "
                     f"{r['bytes'] / r['seconds'] / 1e9:.1f} | {ratio} | {same} |")
    if explored:
        lines += ["", "The staging ring's geometry, in one process (`--explore`, median of 3 after a warm-up):", "",
                  "| variant | time | GB/s |", "|---|---:|---:|"]
        lines += [f"| {r['variant']} | {r['seconds'] * 1e3:.1f} ms | {r['GB/s']} |" for r in explored]
    return "\n".join(lines)


def targets(results: dict) -> list[tuple[str, bool]]:
    def t(peer: str) -> float | None:
        r = results.get(peer, {})
        return r.get("seconds")

    ours, into = t("weightio load_all"), t("weightio load_into (meta model)")
    limit, st = t("pinned host-to-device copy"), t("safetensors safe_open")
    checks = []
    for label, value in (("load_all", ours), ("load_into", into)):
        checks.append((f"torch:cuda {label} >= 0.8x a pinned host-to-device copy",
                       bool(value and limit and limit / value >= 0.8)))
        checks.append((f"torch:cuda {label} >= 3x safe_open(device='cuda')", bool(value and st and st / value >= 3)))
    return checks


def main() -> None:
    def extra(parser):
        parser.add_argument("--explore", action="store_true", help="also time the staging ring's geometry")
        parser.add_argument("--peers", help="only the peers whose names start with one of these (comma-separated)")
        parser.add_argument("--seconds", type=float, default=0,
                            help="begin no repetition the time left would not hold (--explore keeps a minute)")

    args = arguments(__doc__, reps=5, extra=extra, gib=4.0)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: the GPU rows stay unmeasured")
        return
    p = generate(args.gib)
    path = str(p["safetensors"])
    warm(p["safetensors"])
    peers = [x for x in PEERS if not x.endswith("before") or os.environ.get("WEIGHTIO_BEFORE")]
    if args.peers:
        prefixes = [prefix.strip() for prefix in args.peers.split(",") if prefix.strip()]
        chosen = [x for x in peers if any(x.startswith(prefix) for prefix in prefixes)]
        if not chosen:
            raise SystemExit(f"no peer starts with {', '.join(prefixes) or '(nothing)'}; the peers: {', '.join(PEERS)}")
        peers = chosen if "weightio load_all" in chosen else ["weightio load_all", *chosen]  # the ratios' baseline
    if args.explore:
        at = peers.index("weightio load_all") + 1
        peers[at:at] = [*RINGS, TASK_A_PIECE]
        if "weightio load_into (meta model)" in peers:
            peers.insert(peers.index("weightio load_into (meta model)") + 1, INTO_RING)
    began = time.monotonic()
    results = measure(path, peers, args.reps, args.seconds and args.seconds - EXPLORING * args.explore)
    reps = max((r.get("runs", 0) for r in results.values()), default=0) or args.reps
    size = p["safetensors"].stat().st_size
    command = f"--reps {args.reps} --gib {args.gib:g}" + (" --explore" if args.explore else "") + (
        f" --peers {args.peers}" if args.peers else "")

    def done(explored: list[dict]) -> None:
        # a run of some peers prints its table but leaves the published one (all peers) as it is
        publish("gpu", report(results, explored, reps, command, size), targets(results),
                not args.no_write and not args.peers)
        out = os.environ.get("OUT")
        if out:
            Path(out, "gpu.json").write_text(json.dumps({"results": results, "explored": explored}, indent=1))

    done([])  # (published before the exploring: a run cut short there keeps the peers' table)
    if args.explore and not (args.seconds and args.seconds - (time.monotonic() - began) < EXPLORING / 2):
        done(explore(path))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(sys.argv[2], sys.argv[3])))
    else:
        main()
