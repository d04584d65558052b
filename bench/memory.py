"""Memory benchmark: a safetensors model into memory the caller owns, warm and cold; zero-copy
views from a cold cache; four processes serving one copy.

    python bench/memory.py [--reps 5] [--gib 4]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench) a ``model.safetensors`` of `--gib`
GiB shaped like a transformer (per layer four bf16 2048 x 2048 matrices and a float32 norm), and
the same tensors in tensorizer's format. Each run is a fresh process, timed after its imports;
peers are interleaved in balanced orders (``common.run_order``); medians of --reps runs.

1. **owned, warm**: every tensor as a torch CPU tensor that owns its memory, page cache warm.
   weightio ``VarBuilder.load_all(copy=True)`` and ``TensorView.to("torch", copy=True)`` (and,
   for "before", ``load_all()`` + ``clone()``; for "pages zeroed", ``load_all(copy=True)`` with
   the kernel's copies off: ``filling._COPIES``, weightio/_copies.h) vs tensorizer, the Run:ai
   streamer (``owned=True``), safetensors ``load_file`` + ``clone()``, fastsafetensors (CPU). The
   machine's limit: the same bytes by parallel ``pread`` into memory already faulted in (only the
   reads timed).
2. **owned, cold**: the same, each run after the files' pages were evicted (``fsync`` +
   ``posix_fadvise(DONTNEED)``, checked with ``mincore``: bench/coldcache.py). The disk's limit:
   parallel ``O_DIRECT`` reads of the file (8 threads, 16 MiB each); and the disk through the page
   cache with no destination to fill (16 threads each reading its stretch of the file into one
   reused 8 MiB buffer, as weightio's stripes read: the part of a cold load no owned copy avoids).
3. **views, cold**: zero-copy torch CPU views (weightio ``load_all()``, numpy views too) vs
   safetensors ``load_file`` (mmap-backed), one byte of every 4 KiB page touched.
4. **four processes, one copy**: 4 workers each load the model to torch CPU and touch every
   page; the sum of their PSS growth (``/proc/PID/smaps_rollup``) against the file size.
5. **GPU** (``torch:cuda``): bench/gpu.py (only where CUDA is available).

Writes the medians and ratios into docs/benchmarks.md (section "memory").
"""

from __future__ import annotations

import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coldcache import evict, free_page_reporting, pss_kib, resident  # noqa: E402
from common import (  # noqa: E402
    CACHE,
    Case,
    arguments,
    environment,
    measure,
    publish,
    rows,
    run_worker,
    settle,
    worker_env,
)

SCRIPT = Path(__file__).resolve()
_RUN_WORKER = run_worker
PAGE = 4096
WORKERS = 4


def paths(gib: float) -> dict[str, Path]:
    folder = CACHE / f"memory-{gib:g}g"
    return {"safetensors": folder / "model.safetensors", "tensorizer": folder / "model.tensors"}


def _layout(gib: float) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) in file order: per layer q/k/v/o bf16 matrices and a float32 norm."""
    dim = 2048 if gib >= 0.25 else 256
    layers = max(2, round(gib * (1 << 30) / (4 * dim * dim * 2)))
    out = []
    for i in range(layers):
        out += [(f"model.layers.{i}.self_attn.{k}_proj.weight", "BF16", [dim, dim]) for k in "qkvo"]
        out.append((f"model.layers.{i}.input_layernorm.weight", "F32", [dim]))
    return out


def generate(gib: float) -> dict[str, Path]:
    p = paths(gib)
    if all(path.exists() for path in p.values()):
        return p
    import numpy as np

    p["safetensors"].parent.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, dtype, shape in _layout(gib):
        n = (2 if dtype == "BF16" else 4) * int(np.prod(shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    tmp = p["safetensors"].with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for start in range(0, offset, 64 << 20):  # normal-ish values: bf16 of float32 noise
            count = min(64 << 20, offset - start) // 4
            f.write(rng.standard_normal(count, dtype=np.float32).view(np.uint16)[1::2].repeat(2).tobytes())
    os.replace(tmp, p["safetensors"])
    _write_tensorizer(p)
    return p


def _write_tensorizer(p: dict[str, Path]) -> None:
    try:
        from safetensors.torch import load_file
        from tensorizer import TensorSerializer
    except ImportError:
        return
    serializer = TensorSerializer(str(p["tensorizer"]))
    serializer.write_state_dict(load_file(str(p["safetensors"])))
    serializer.close()


# ----------------------------------------------------------------------------- worker side


def _touch(tensors: dict) -> int:
    """Read one byte of every 4 KiB page of every tensor (torch or numpy); returns a checksum."""
    total = 0
    for t in tensors.values():
        if hasattr(t, "numpy"):
            import torch

            flat = t.reshape(-1).view(torch.uint8)
            total += int(flat[::PAGE].sum()) if flat.numel() else 0
        else:
            total += int(t.reshape(-1).view("u1")[::PAGE].sum())
    return total


def _limit(path: str) -> dict:
    """The bytes of every tensor by parallel pread into memory already faulted in: only the reads timed."""
    import torch

    import weightio as wio
    from weightio.devices import filling

    with wio.open(path) as ckpt:
        pairs = []
        for name in ckpt:
            host = ckpt[name].numpy()
            dst = torch.empty(host.nbytes, dtype=torch.uint8)
            dst.fill_(1)
            pairs.append((dst.numpy(), host))
        start = time.perf_counter()
        filling.fill(pairs)
        return {"seconds": time.perf_counter() - start, "rss_mib": 0.0}


def _odirect(path: str) -> dict:
    """The disk's limit: the whole file by parallel O_DIRECT reads (8 threads, 16 MiB each)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    size, chunk = os.path.getsize(path), 16 << 20
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buffers = [mmap.mmap(-1, chunk) for _ in range(8)]

    def read(k: int) -> int:
        buf, got = buffers[k % 8], 0
        for start in range(k * chunk, size, 8 * chunk):
            got += os.preadv(fd, [buf], start)
        return got

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        got = sum(pool.map(read, range(8)))
    seconds = time.perf_counter() - start
    os.close(fd)
    assert got == size, (got, size)
    return {"seconds": seconds, "rss_mib": 0.0}


def _buffered(path: str) -> dict:
    """The disk through the page cache, no destination: 16 threads, each reading its stretch of the
    file in order (a descriptor of its own, the sequential hint) into one reused 8 MiB buffer."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    size, threads, chunk = os.path.getsize(path), 16, 8 << 20
    stretch = -(-size // threads)
    buffers = [mmap.mmap(-1, chunk) for _ in range(threads)]
    for buf in buffers:  # (faulted in before the clock: only the reads are timed)
        buf.write(b"\1" * chunk)

    def read(k: int) -> int:
        fd, view, got = os.open(path, os.O_RDONLY), memoryview(buffers[k]), 0
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            end = min(size, (k + 1) * stretch)
            for start in range(k * stretch, end, chunk):
                got += os.preadv(fd, [view[:min(chunk, end - start)]], start)
        finally:
            os.close(fd)
        return got

    cached = resident(path)
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        got = sum(pool.map(read, range(threads)))
    seconds = time.perf_counter() - start
    assert got == size, (got, size)
    return {"seconds": seconds, "rss_mib": 0.0, "extra": {"resident_before": round(cached, 4)}}


def _loaders(path: str, tpath: str) -> dict:
    """peer -> a function loading every tensor of the model (in the worker, after its imports)."""

    def wio_copy():
        import weightio as wio

        with wio.VarBuilder.from_path(path, device="torch") as vb:
            return vb.load_all(copy=True)

    def wio_zeroed():
        from weightio.devices import filling

        filling._COPIES = False  # (a fresh process each run: nothing else sees it)
        return wio_copy()

    def wio_to():
        import weightio as wio

        with wio.open(path) as ckpt:
            return {k: v.to("torch", copy=True) for k, v in ckpt.items()}

    def wio_clone():
        import weightio as wio

        with wio.VarBuilder.from_path(path, device="torch") as vb:
            return {k: t.clone() for k, t in vb.load_all().items()}

    def wio_views():
        import weightio as wio

        ckpt = wio.open(path)
        return wio.devices.load_all(ckpt, "torch")

    def wio_numpy_views():
        import weightio as wio

        return wio.devices.load_all(wio.open(path), "numpy")

    def st_clone():
        from safetensors.torch import load_file

        return {k: t.clone() for k, t in load_file(path).items()}

    def st_views():
        from safetensors.torch import load_file

        return load_file(path)

    def tensorizer():
        from tensorizer import TensorDeserializer

        with TensorDeserializer(tpath, device="cpu") as d:
            return dict(d)

    def runai():
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as s:
            s.stream_file(path, device="cpu", owned=True)
            return dict(s.get_tensors())

    def fastsafetensors():
        from fastsafetensors import fastsafe_open

        with fastsafe_open(path, device="cpu", nogds=True) as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    return {"weightio load_all(copy=True)": wio_copy, ZEROED: wio_zeroed, "weightio to(copy=True)": wio_to,
            "weightio load_all()+clone (before)": wio_clone, "weightio views": wio_views,
            "weightio numpy views": wio_numpy_views, "safetensors load_file+clone": st_clone,
            "safetensors load_file": st_views, "tensorizer": tensorizer, "Run:ai streamer": runai,
            "fastsafetensors (cpu)": fastsafetensors}


_IMPORTS = {"weightio": "weightio.devices.torch", "safetensors": "safetensors.torch", "tensorizer": "tensorizer",
            "Run:ai": "runai_model_streamer", "fastsafetensors": "fastsafetensors"}


def _worker(case: str, peer: str, path: str, tpath: str) -> dict:
    import importlib

    import torch  # noqa: F401 - every peer pays it before the clock starts

    if peer in MACHINE_ROWS:  # (no loader: the machine's own reads)
        settle()
        if peer == PAGE_CACHE:
            return _buffered(path)
        return _limit(path) if case == "warm" else _odirect(path)
    module = next(m for prefix, m in _IMPORTS.items() if peer.startswith(prefix))
    importlib.import_module(module)
    if peer.startswith("weightio"):
        import weightio.devices.filling  # noqa: F401
    cached = resident(tpath if peer == "tensorizer" else path)
    settle()
    before = _rss()
    start = time.perf_counter()
    out = _loaders(path, tpath)[peer]()
    if case == "views":
        _touch(out)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_mib": _rss() - before, "extra": {"resident_before": round(cached, 4)}}


def _rss() -> float:
    from common import rss_mib

    return rss_mib()


def _cold_run(script: Path, args: list[str]) -> dict:
    """One cold run: the files evicted (and checked) first."""
    for path in args[2:4]:
        if os.path.exists(path):
            evict(path)
    return _RUN_WORKER(script, args)


# ----------------------------------------------------------------------------- four processes


def _serve_child(mode: str, path: str) -> None:
    """A serving worker: report ready, load and touch on request, then wait to be measured."""
    import torch  # noqa: F401

    import weightio as wio

    print("ready", flush=True)
    sys.stdin.readline()
    if mode == "weightio views":
        out = wio.devices.load_all(wio.open(path), "torch")
    elif mode == "weightio load_all(copy=True)":
        out = wio.devices.load_all(wio.open(path), "torch", copy=True)
    else:
        from safetensors.torch import load_file

        out = load_file(path)
    _touch(out)
    print("loaded", flush=True)
    sys.stdin.readline()


def pss_growth(mode: str, path: str, workers: int = WORKERS) -> dict:
    """Start `workers` processes, each loading the model: the sum of their PSS growth, in MiB."""
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "--serve", mode, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=worker_env()) for _ in range(workers)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        before = sum(pss_kib(p.pid) for p in procs)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "loaded"
        after = sum(pss_kib(p.pid) for p in procs)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=120)
            p.stdout.close()
    return {"seconds": 0.0, "rss_mib": (after - before) / 1024}


# ----------------------------------------------------------------------------- driver

PAGE_CACHE = "the disk through the page cache: parallel buffered reads, no destination"
MACHINE_ROWS = ("limit", PAGE_CACHE)  # rows of the machine's reads, not of a loader: no RSS of their own
ZEROED = "weightio load_all(copy=True), pages zeroed (before)"  # the kernel's copies off
WARM_PEERS = ["weightio load_all(copy=True)", ZEROED, "weightio to(copy=True)", "weightio load_all()+clone (before)",
              "tensorizer", "Run:ai streamer", "safetensors load_file+clone", "fastsafetensors (cpu)", "limit"]
COLD_PEERS = ["weightio load_all(copy=True)", ZEROED, "weightio load_all()+clone (before)", "Run:ai streamer",
              "tensorizer", "safetensors load_file+clone", "fastsafetensors (cpu)", "limit", PAGE_CACHE]
VIEW_PEERS = ["weightio views", "weightio numpy views", "safetensors load_file"]
NOTES = {"warm": "owned torch CPU tensors, warm cache", "cold": "owned torch CPU tensors, cold cache",
         "views": "zero-copy views, cold cache, every page touched"}
LIMITS = {"warm": "limit: parallel pread into faulted memory", "cold": "limit: parallel O_DIRECT reads"}


def cases(p: dict[str, Path]) -> list[Case]:
    args = [str(p["safetensors"]), str(p["tensorizer"])]
    return [Case(case, {peer: [case, peer, *args] for peer in peers}, NOTES[case])
            for case, peers in (("warm", WARM_PEERS), ("cold", COLD_PEERS), ("views", VIEW_PEERS))]


def run(measured: list[Case], reps: int) -> dict:
    """`common.measure`, with the cold cases' files evicted before each run; failures kept as rows."""
    import common

    results: dict[str, dict[str, dict]] = {}
    for case in measured:
        original = common.run_worker
        if case.name != "warm":
            common.run_worker = _cold_run
        try:
            safe = Case(case.name, {}, case.note)
            failed = {}
            for peer, args in case.peers.items():  # a peer that cannot run here is reported, not fatal
                try:
                    common.run_worker(SCRIPT, args)
                    safe.peers[peer] = args
                except RuntimeError as e:
                    failed[peer] = str(e).strip().splitlines()[-1][:160]
            if not safe.peers:
                raise RuntimeError(f"{case.name}: no peer could run: {failed}")
            results.update(measure(SCRIPT, [safe], reps))
            results[case.name].update({peer: {"failed": why} for peer, why in failed.items()})
        finally:
            common.run_worker = original
    return results


def serving(path: Path) -> dict[str, dict]:
    size = path.stat().st_size
    available = _available()
    out = {}
    for mode in ("weightio views", "safetensors load_file", "weightio load_all(copy=True)"):
        if mode.endswith("(copy=True)") and available < (WORKERS + 1) * size + (4 << 30):
            out[mode] = {"failed": f"skipped: {WORKERS} owned copies need more memory than is available"}
            continue
        out[mode] = pss_growth(mode, str(path))
    return out


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _time(r: dict) -> str:
    if "failed" in r:
        return f"cannot run here ({r['failed']})"
    t = r["seconds"]
    return f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.2f} s"


_GPU_ROWS = 'measured by bench/gpu.py: see "GPU" below'


_REPORTING_NOTE = {True: "This machine is a VM that gives its free memory back to its host (virtio-balloon free "
                         "page reporting): memory handed out again is backed anew, at a cost that depends on the run "
                         "before it.",
                   False: "This machine is a VM whose free memory stays its own (no free page reporting)."}


def report(results: dict, serve: dict, p: dict[str, Path], reps: int, gib: float, gpu: str | None) -> str:
    size = p["safetensors"].stat().st_size
    lines = [
        "## Memory: owned loads, cold reads, one copy for many processes",
        "",
        f"`python bench/memory.py --reps {reps} --gib {gib:g}` on {environment()}.",
        f"File: {size / (1 << 30):.2f} GiB `model.safetensors` ({len(_layout(size / (1 << 30)))} tensors, bf16 "
        "matrices and f32 norms), and the same tensors in tensorizer's format. Each run is a fresh process, timed "
        f"after its imports and the full garbage collection they are owed (`bench/common.py` `settle`); medians "
        f"of {reps} runs; peers interleaved in balanced orders (`bench/common.py` `run_order`). Cold runs start "
        "after `fsync` + "
        "`posix_fadvise(DONTNEED)` of the files, checked with `mincore` (resident fraction before the run in the "
        "last column). Ratio = peer time / weightio time (> 1: weightio is faster). "
        + _REPORTING_NOTE.get(free_page_reporting(), ""),
        "",
        "| case | peer | median time | RSS growth | ratio | cached at start |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case, peers in results.items():
        base = next(r for r in peers.values() if "failed" not in r)["seconds"]
        for peer, r in peers.items():
            label = LIMITS[case] if peer == "limit" else peer
            if "failed" in r:
                lines.append(f"| {NOTES[case]} | {label} | {_time(r)} | – | – | – |")
                continue
            ratio = f"{r['seconds'] / base:.2f}×"
            cached = (r.get("extra") or {}).get("resident_before")
            shown = "–" if cached is None else f"{cached:.1%}"
            rss = "–" if peer in MACHINE_ROWS else f"{r['rss_mib']:.0f} MiB"
            lines.append(f"| {NOTES[case]} | {label} | {_time(r)} | {rss} | {ratio} | {shown} |")
    lines += ["", "Cold runs by the run before: each peer's median after a run of any weightio peer and after a "
              "run of any other (a peer after itself included; runs in brackets; a case's first run is left out). "
              "weightio reads a file in order into large page-cache folios, made of whole free 2 MiB blocks; on a "
              "VM whose host takes back free memory, those blocks cost more after a run that gave its memory back "
              "in 4 KiB pages (see \"Why a cold run depends on the run before it\").", "",
              "| case | peer | after a weightio run | after any other run |", "|---|---|---:|---:|"]
    for case, peers in results.items():
        if case == "warm":
            continue
        for peer, r in peers.items():
            if "failed" not in r:
                ours, theirs = by_before(r.get("after") or {})
                lines.append(f"| {NOTES[case]} | {LIMITS[case] if peer == 'limit' else peer} | {ours} | {theirs} |")
    lines += ["", "Four processes each load the model to torch CPU and touch every page: the sum of their PSS "
              "growth (`/proc/PID/smaps_rollup`), against the file size.", "",
              "| mode | PSS growth, 4 processes | × file size |", "|---|---:|---:|"]
    for mode, r in serve.items():
        if "failed" in r:
            lines.append(f"| {mode} | {r['failed']} | – |")
        else:
            lines.append(f"| {mode} | {r['rss_mib']:.0f} MiB | {r['rss_mib'] * (1 << 20) / size:.2f}× |")
    lines += ["", "| GPU (`torch:cuda`) | result |", "|---|---|"]
    for row in ("load_all vs pinned host-to-device copy", "load_all vs safe_open(device='cuda')", "load_into"):
        lines.append(f"| {row} | {gpu or _GPU_ROWS} |")
    return "\n".join(lines)


def by_before(after: dict[str, list[float]]) -> tuple[str, str]:
    """A peer's runs (`common.measure`'s "after": seconds by the peer run just before) as two cells:
    the median after a weightio peer, and after any other ("–" where there was none)."""
    groups: tuple[list[float], list[float]] = ([], [])
    for before, seconds in after.items():
        groups[0 if before.startswith("weightio") else 1].extend(seconds)
    ours, theirs = (f"{statistics.median(g):.2f} s ({len(g)})" if g else "–" for g in groups)
    return ours, theirs


def _t(results: dict, case: str, peer: str) -> float | None:
    r = results[case].get(peer)
    return None if r is None or "failed" in r else r["seconds"]


def targets(results: dict, serve: dict, size: int) -> list[tuple[str, bool]]:
    def ratio(case: str, peer: str, ours: str = "weightio load_all(copy=True)") -> float:
        a, b = _t(results, case, peer), _t(results, case, ours)
        return 0.0 if a is None or b is None else a / b

    views = serve.get("weightio views", {})
    return [
        ("owned, warm: >= 2x tensorizer", ratio("warm", "tensorizer") >= 2),
        ("owned, warm: >= 2.5x safetensors load_file+clone", ratio("warm", "safetensors load_file+clone") >= 2.5),
        ("owned, warm: within 1.5x of parallel pread into faulted memory", ratio("warm", "limit") >= 1 / 1.5),
        ("owned, cold: >= 1.2x the Run:ai streamer", ratio("cold", "Run:ai streamer") >= 1.2),
        ("views, cold, every page touched: no slower than safetensors load_file",
         ratio("views", "safetensors load_file", "weightio views") >= 1.0),
        ("4 processes of zero-copy views: PSS growth <= 1.25x one copy",
         "rss_mib" in views and views["rss_mib"] * (1 << 20) <= 1.25 * size),
    ]


def chart_rows(results: dict, measured: list[Case], serve: dict) -> list[dict]:
    ok = {case: {peer: r for peer, r in peers.items() if "failed" not in r} for case, peers in results.items()}
    out = [r | {"rss_mib": None} for r in rows(ok, measured)]
    for row in out:
        if row["peer"] == "limit":
            row["peer"] = "limit (machine)"
        elif row["peer"] == PAGE_CACHE:
            row["peer"] = "page cache only"
    out += [{"case": "4 processes: sum of PSS growth", "peer": mode, "seconds": None, "rss_mib": r["rss_mib"]}
            for mode, r in serve.items() if "failed" not in r]
    return out


def main() -> None:
    args = arguments(__doc__, reps=5, gib=4.0)
    p = generate(args.gib)
    measured = cases(p)
    import common

    common.warm(*(path for path in p.values() if path.exists()))  # (no tensorizer file where it is not installed)
    results = run(measured, args.reps)
    serve = serving(p["safetensors"])
    gpu = None  # the GPU rows are bench/gpu.py's
    size = p["safetensors"].stat().st_size
    text = report(results, serve, p, args.reps, args.gib, gpu)
    publish("memory", text, targets(results, serve, size), not args.no_write,
            title="Memory: owned loads, cold reads, views", measured=chart_rows(results, measured, serve))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(*sys.argv[2:6])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve_child(sys.argv[2], sys.argv[3])
    else:
        main()
