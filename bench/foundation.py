"""Foundation benchmark: safetensors and numpy readers against their reference libraries.

    python bench/foundation.py [--reps 7] [--gib 1]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench) a ~1 GiB safetensors file of
500 float32 tensors (written by the safetensors package), a 1 GiB .npy and a 512 MiB .npz of 200
STORED arrays (written by numpy), then measures, each run in a fresh process, warm cache, timed
after its imports (weightio's npy/npz reader included; bytecode cached, as for an installed package):

1. open + list names/shapes/dtypes          weightio vs safetensors.safe_open (numpy, torch)
2. numpy() on every tensor (no data read)   weightio vs safe_open(...).get_tensor (copies)
3. read every byte (sum)                    weightio vs one np.memmap over the data section, and vs
                                            the same 500 per-tensor sums over plain np.memmap views
4. .npy open + array                        weightio vs numpy.load(mmap_mode="r")
5. .npz open + every array                  weightio vs numpy.load + reading every member
6. import weightio                          (and which heavy modules it pulls in)

and writes the medians and ratios into docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CACHE, SETTLED, Case, arguments, environment, measure, publish, rows, timed, warm  # noqa: E402

SCRIPT = Path(__file__).resolve()
N_TENSORS, NPZ_ARRAYS = 500, 200


def paths(gib: float) -> dict[str, Path]:
    tag = f"{gib:g}g"
    return {"st": CACHE / f"foundation-{tag}.safetensors", "npy": CACHE / f"foundation-{tag}.npy",
            "npz": CACHE / f"foundation-{tag}-stored.npz"}


def generate(gib: float) -> dict[str, Path]:
    import numpy as np

    CACHE.mkdir(parents=True, exist_ok=True)
    p = paths(gib)
    total = int(gib * (1 << 30))
    if not p["st"].exists():
        import safetensors.numpy

        rows = total // 4 // N_TENSORS // 1024
        rng = np.random.default_rng(0)
        tensors = {f"layers.{i}.weight": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(N_TENSORS)}
        safetensors.numpy.save_file(tensors, str(p["st"]))
    if not p["npy"].exists():
        np.save(p["npy"], np.arange(total // 4 // 1024 * 1024, dtype=np.float32).reshape(-1, 1024))
    if not p["npz"].exists():
        rows = total // 2 // 4 // NPZ_ARRAYS // 1024
        np.savez(p["npz"], **{f"a{i}": np.full((rows, 1024), i, dtype=np.float32) for i in range(NPZ_ARRAYS)})
    return p


# ----------------------------------------------------------------------------- worker side


def _worker(case: str, peer: str, path: str) -> dict:
    import numpy as np

    import weightio as wio
    import weightio.formats.numpy  # noqa: F401 - the npy/npz reader, which open() imports on first use

    if peer.startswith("safetensors"):
        from safetensors import safe_open
        if peer == "safetensors-pt":
            import torch  # noqa: F401 - imported before timing, like every other peer's imports

    def wio_open():  # one handle per tensor on both sides
        c = wio.open(path)
        return c, [(k, v.shape, v.dtype) for k, v in c.items()]

    def st_open(framework):
        f = safe_open(path, framework)
        return f, [(k, s.get_shape(), s.get_dtype()) for k in f.keys() for s in (f.get_slice(k),)]

    def wio_numpy():
        c = wio.open(path)
        return c, [c[k].numpy() for k in c]

    def st_numpy(framework):
        f = safe_open(path, framework)
        return f, [f.get_tensor(k) for k in f.keys()]

    def wio_sum():
        c = wio.open(path)
        return sum(float(c[k].numpy().sum(dtype=np.float64)) for k in c)

    def memmap_sum():
        n = int.from_bytes(open(path, "rb").read(8), "little")
        return float(np.memmap(path, dtype=np.float32, mode="r", offset=8 + n).sum(dtype=np.float64))

    def memmap_views_sum():  # the same per-tensor reduction over plain numpy views: the loader-free cost
        c = wio.open(path)  # (used only to know the tensor extents; its mapping is not read)
        n = int.from_bytes(open(path, "rb").read(8), "little")
        mm = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        views = [mm[v.info.offset - 8 - n: v.info.offset - 8 - n + v.nbytes].view(np.float32) for v in c.values()]
        return sum(float(a.sum(dtype=np.float64)) for a in views)

    def st_sum():
        f = safe_open(path, "numpy")
        return sum(float(f.get_tensor(k).sum(dtype=np.float64)) for k in f.keys())

    def npz_numpy():
        z = np.load(path)
        return z, [z[k] for k in z.files]

    table = {
        ("open", "weightio"): wio_open, ("open", "safetensors-np"): lambda: st_open("numpy"),
        ("open", "safetensors-pt"): lambda: st_open("pt"),
        ("numpy", "weightio"): wio_numpy, ("numpy", "safetensors-np"): lambda: st_numpy("numpy"),
        ("numpy", "safetensors-pt"): lambda: st_numpy("pt"),
        ("sum", "weightio"): wio_sum, ("sum", "np.memmap"): memmap_sum, ("sum", "safetensors-np"): st_sum,
        ("sum", "np.memmap-views"): memmap_views_sum,
        ("npy", "weightio"): wio_numpy, ("npy", "np.load-mmap"): lambda: np.load(path, mmap_mode="r"),
        ("npz", "weightio"): wio_numpy, ("npz", "np.load"): npz_numpy,
    }
    return timed(table[(case, peer)])


def _import_worker() -> dict:
    start = time.perf_counter()
    import weightio  # noqa: F401

    seconds = time.perf_counter() - start
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "jax", "huggingface_hub", "fickling"))
    return {"seconds": seconds, "rss_mib": 0.0, "extra": {"heavy_modules": heavy}}


# ----------------------------------------------------------------------------- driver


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def cases(p: dict[str, Path]) -> list[Case]:
    st = str(p["st"])
    st_peers = ["weightio", "safetensors-np"] + (["safetensors-pt"] if _has("torch") else [])
    return [
        Case("open", {peer: ["open", peer, st] for peer in st_peers}, "open + list names, shapes, dtypes"),
        Case("numpy", {peer: ["numpy", peer, st] for peer in st_peers}, "an array for every tensor"),
        Case("sum", {peer: ["sum", peer, st]
                     for peer in ("weightio", "np.memmap", "np.memmap-views", "safetensors-np")},
             "read every byte (float64 sum of every tensor)"),
        Case("npy", {peer: ["npy", peer, str(p["npy"])] for peer in ("weightio", "np.load-mmap")},
             ".npy: open + the array"),
        Case("npz", {peer: ["npz", peer, str(p["npz"])] for peer in ("weightio", "np.load")},
             ".npz of 200 STORED arrays: open + every array"),
        Case("import", {"weightio": ["import", "weightio", "-"]}, "import weightio (fresh process)"),
    ]


def report(results: dict, p: dict[str, Path], reps: int) -> str:
    sizes = {k: v.stat().st_size / (1 << 30) for k, v in p.items()}
    lines = [
        "## Foundation: safetensors and numpy readers",
        "",
        f"`python bench/foundation.py --reps {reps}` on {environment()}.",
        f"Files: {sizes['st']:.2f} GiB safetensors ({N_TENSORS} float32 tensors, written by `safetensors`), "
        f"{sizes['npy']:.2f} GiB `.npy`, {sizes['npz']:.2f} GiB `.npz` ({NPZ_ARRAYS} STORED members, written by "
        "`numpy.savez`, so members are not aligned). Each run is a fresh process, page cache warm, "
        f"{SETTLED}; "
        f"medians of {reps} runs. Ratio = peer time / weightio time (> 1: weightio is faster).",
        "",
        "| case | peer | median time | RSS growth | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    notes = {c.name: c.note for c in cases(p)}
    for case, peers in results.items():
        base = peers.get("weightio", {}).get("seconds")
        for peer, r in peers.items():
            ratio = f"{r['seconds'] and base and r['seconds'] / base:.2f}×" if peer != "weightio" else "1"
            t = r["seconds"]
            shown = f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"
            lines.append(f"| {notes[case]} | {peer} | {shown} | {r['rss_mib']:.1f} MiB | {ratio} |")
    imp = results["import"]["weightio"]
    heavy = imp["extra"]["heavy_modules"] or "none of torch, jax, huggingface_hub, fickling"
    lines += ["", f"`import weightio` pulls in: {heavy}."]
    return "\n".join(lines)


def targets(results: dict) -> list[tuple[str, bool]]:
    """The issue's speed targets, checked against these medians."""
    def t(case, peer):
        return results[case][peer]["seconds"]
    return [
        ("open no slower than safe_open(numpy)", t("open", "weightio") <= t("open", "safetensors-np")),
        ("numpy() on all >= 20x faster than safe_open get_tensor",
         t("numpy", "safetensors-np") / t("numpy", "weightio") >= 20),
        ("numpy() on all: RSS growth < 16 MiB", results["numpy"]["weightio"]["rss_mib"] < 16),
        ("sum >= 0.9x the np.memmap throughput", t("sum", "np.memmap") / t("sum", "weightio") >= 0.9),
        ("npz >= 10x faster than np.load + read", t("npz", "np.load") / t("npz", "weightio") >= 10),
        ("npz RSS growth < 16 MiB", results["npz"]["weightio"]["rss_mib"] < 16),
        ("import weightio < 150 ms", t("import", "weightio") < 0.150),
    ]


def main() -> None:
    args = arguments(__doc__, reps=7)
    p = generate(args.gib)
    warm(*p.values())
    measured = cases(p)
    results = measure(SCRIPT, measured, args.reps)
    publish("foundation", report(results, p, args.reps), targets(results), not args.no_write,
            title="Foundation: safetensors and numpy readers", measured=rows(results, measured))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case, peer, path = sys.argv[2:5]
        print(json.dumps(_import_worker() if case == "import" else _worker(case, peer, path)))
    else:
        main()
