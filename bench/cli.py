"""CLI benchmark: whole-process `weightio inspect` and `weightio convert` against their peers.

    python bench/cli.py [--reps 5] [--gib 1]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench) a ~1 GiB model-shaped
checkpoint — an embedding of 30000 x 1024 (117 MiB, the largest tensor) and 20 layers of four
1024 x 1024 attention matrices, two 1024 x 4096 MLP matrices, biases and norms, float32 —
written by torch as ``pytorch_model.bin``, by safetensors as ``model.safetensors`` and by numpy
as a STORED ``.npz``. Then, each run a fresh process (page cache warm, output removed first),
measured from outside with ``wait4`` (wall time and the child's peak RSS, which counts mapped
file pages it touched), after a ``sync`` so that no run pays for the previous one's writeback:

1. inspect .bin        ``weightio inspect`` vs ``python -c "import torch; sd = torch.load(p,
                       mmap=True, weights_only=True); print(len(sd))"``
2. convert .bin        ``weightio convert`` (and with --verify) vs ``cp`` and ``cp`` + ``sync``
                       (an atomic convert fsyncs its output) vs ``torch.load`` (mmap and not) +
                       ``safetensors.torch.save_file``
3. convert .safetensors -> .safetensors, vs cp / cp + sync and safetensors.torch load + save
4. convert .npz -> .safetensors, vs cp / cp + sync and numpy.load + safetensors.numpy.save_file

and writes the medians and the issue's targets into docs/benchmarks.md (section "cli").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CACHE, Case, arguments, environment, measure, publish, rows, warm, worker_env  # noqa: E402

SCRIPT = Path(__file__).resolve()
LAYERS, HIDDEN, MLP, VOCAB = 20, 1024, 4096, 30000
OUT = CACHE / "cli-out"


def paths(gib: float) -> dict[str, Path]:
    tag = f"{gib:g}g"
    return {"bin": CACHE / f"cli-{tag}" / "pytorch_model.bin", "st": CACHE / f"cli-{tag}" / "model.safetensors",
            "npz": CACHE / f"cli-{tag}" / "model.npz"}


def _state(gib: float) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    layers = max(1, round(LAYERS * gib))

    def rand(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    state = {"embed_tokens.weight": rand(VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + f"self_attn.{name}.weight"] = rand(HIDDEN, HIDDEN)
            state[p + f"self_attn.{name}.bias"] = rand(HIDDEN)
        state[p + "mlp.up_proj.weight"] = rand(MLP, HIDDEN)
        state[p + "mlp.down_proj.weight"] = rand(HIDDEN, MLP)
        state[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        state[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    state["norm.weight"] = np.ones(HIDDEN, np.float32)
    return state


def generate(gib: float) -> dict[str, Path]:
    import numpy as np

    p = paths(gib)
    p["bin"].parent.mkdir(parents=True, exist_ok=True)
    if all(path.exists() for path in p.values()):
        return p
    state = _state(gib)
    if not p["bin"].exists():
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in state.items()}, p["bin"])
    if not p["st"].exists():
        import safetensors.numpy

        safetensors.numpy.save_file(state, str(p["st"]), metadata={"format": "pt"})
    if not p["npz"].exists():
        np.savez(p["npz"], **state)
    return p


# ----------------------------------------------------------------------------- worker side


def _weightio() -> list[str]:
    exe = shutil.which("weightio")
    return [exe] if exe else [sys.executable, "-m", "weightio.cli"]


TORCH_INSPECT = "import sys, torch; sd = torch.load(sys.argv[1], mmap=True, weights_only=True); print(len(sd))"
TORCH_CONVERT = ("import sys, torch, safetensors.torch as st; "
                 "sd = torch.load(sys.argv[1], mmap={mmap}, weights_only=True); st.save_file(sd, sys.argv[2])")
ST_CONVERT = "import sys, safetensors.torch as st; st.save_file(st.load_file(sys.argv[1]), sys.argv[2])"
NPZ_CONVERT = ("import sys, numpy as np, safetensors.numpy as sn; "
               "z = np.load(sys.argv[1]); sn.save_file({k: z[k] for k in z.files}, sys.argv[2])")


def command(case: str, peer: str, src: str, dst: str) -> list[str]:
    """The command line a (case, peer) runs."""
    py = [sys.executable, "-c"]
    table = {
        "weightio": _weightio() + (["inspect", src] if case == "inspect" else ["convert", src, dst, "-q"]),
        "weightio --verify": _weightio() + ["convert", src, dst, "-q", "--verify"],
        "torch.load(mmap)": py + [TORCH_INSPECT, src],
        "cp": ["cp", src, dst],
        "cp + sync": ["sh", "-c", 'cp "$0" "$1" && sync "$1"', src, dst],
        "torch.load(mmap) + save_file": py + [TORCH_CONVERT.format(mmap=True), src, dst],
        "torch.load + save_file": py + [TORCH_CONVERT.format(mmap=False), src, dst],
        "safetensors load_file + save_file": py + [ST_CONVERT, src, dst],
        "numpy.load + save_file": py + [NPZ_CONVERT, src, dst],
    }
    return table[peer]


def _worker(case: str, peer: str, src: str) -> dict:
    """Run one command as a child process: its wall time and peak RSS (from wait4)."""
    OUT.mkdir(parents=True, exist_ok=True)
    dst = OUT / "out.safetensors"
    dst.unlink(missing_ok=True)
    os.sync()  # no run pays for the writeback of the one before it
    argv = command(case, peer, src, str(dst))
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=worker_env())
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    errors = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}):\n{errors}")
    dst.unlink(missing_ok=True)
    return {"seconds": seconds, "rss_mib": usage.ru_maxrss / 1024}


# ----------------------------------------------------------------------------- driver


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def _pytorch_reader() -> bool:
    try:
        from weightio.formats import READERS, resolve

        resolve(READERS["pytorch"])
        return True
    except Exception:  # noqa: BLE001 - any failure means: not available in this checkout
        return False


def cases(p: dict[str, Path]) -> list[Case]:
    bin_, st, npz = str(p["bin"]), str(p["st"]), str(p["npz"])
    out = []
    torch = _has("torch")
    if _pytorch_reader():
        peers = ["weightio"] + (["torch.load(mmap)"] if torch else [])
        out.append(Case("inspect .bin", {peer: ["inspect", peer, bin_] for peer in peers},
                        "whole process: inspect a ~1 GiB pytorch_model.bin"))
        peers = ["weightio", "weightio --verify", "cp", "cp + sync"]
        peers += ["torch.load(mmap) + save_file", "torch.load + save_file"] if torch else []
        out.append(Case("convert .bin", {peer: ["convert", peer, bin_] for peer in peers},
                        "convert pytorch_model.bin -> .safetensors"))
    peers = ["weightio", "cp", "cp + sync"] + (["safetensors load_file + save_file"] if torch else [])
    out.append(Case("convert .safetensors", {peer: ["convert", peer, st] for peer in peers},
                    "convert .safetensors -> .safetensors"))
    out.append(Case("convert .npz", {peer: ["convert", peer, npz] for peer in
                                     ["weightio", "cp", "cp + sync", "numpy.load + save_file"]},
                    "convert STORED .npz -> .safetensors"))
    return out


def _largest_tensor_mib(p: dict[str, Path]) -> float:
    import weightio

    with weightio.open(p["st"]) as ckpt:
        return max(v.nbytes for v in ckpt.values()) / (1 << 20)


def report(results: dict, p: dict[str, Path], reps: int) -> str:
    sizes = {k: v.stat().st_size / (1 << 30) for k, v in p.items()}
    lines = [
        "## CLI: whole-process inspect and convert",
        "",
        f"`python bench/cli.py --reps {reps}` on {environment()}.",
        f"Files: a model-shaped checkpoint ({sizes['bin']:.2f} GiB `pytorch_model.bin` written by torch, "
        f"{sizes['st']:.2f} GiB safetensors, {sizes['npz']:.2f} GiB STORED `.npz`; largest tensor "
        f"{_largest_tensor_mib(p):.0f} MiB). Each run is a fresh process measured from outside (`wait4`): wall time "
        "and the child's peak RSS (which counts the mapped file pages it touched). Page cache warm; the "
        "output is written to the same disk, removed between runs, and dirty pages are flushed (`sync`) "
        f"before each run. Medians of {reps} runs. "
        "Ratio = peer time / weightio time (> 1: weightio is faster).",
        "",
        "| case | peer | median time | peak RSS | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    notes = {c.name: c.note for c in cases(p)}
    for case, peers in results.items():
        base = peers["weightio"]["seconds"]
        for peer, r in peers.items():
            ratio = "1" if peer == "weightio" else f"{r['seconds'] / base:.2f}×"
            lines.append(f"| {notes[case]} | {peer} | {r['seconds']:.2f} s | {r['rss_mib']:.0f} MiB | {ratio} |")
    return "\n".join(lines)


def targets(results: dict, p: dict[str, Path]) -> list[tuple[str, bool]]:
    """The issue's targets, checked against these medians."""
    checks = []
    if "inspect .bin" in results and "torch.load(mmap)" in results["inspect .bin"]:
        r = results["inspect .bin"]
        checks.append(("inspect .bin >= 5x faster than torch.load(mmap=True) (whole process)",
                       r["torch.load(mmap)"]["seconds"] / r["weightio"]["seconds"] >= 5))
    if "convert .bin" in results:
        r = results["convert .bin"]
        limit = _largest_tensor_mib(p) + 150
        checks += [("convert .bin -> .safetensors <= 1.5x the time of cp",
                    r["weightio"]["seconds"] <= 1.5 * r["cp"]["seconds"]),
                   ("convert .bin -> .safetensors <= 1.5x the time of cp + sync",
                    r["weightio"]["seconds"] <= 1.5 * r["cp + sync"]["seconds"]),
                   (f"convert .bin peak RSS <= largest tensor + 150 MiB ({limit:.0f} MiB)",
                    r["weightio"]["rss_mib"] <= limit)]
    return checks


def main() -> None:
    args = arguments(__doc__, reps=5)
    p = generate(args.gib)
    warm(*p.values())
    measured = cases(p)
    results = measure(SCRIPT, measured, args.reps)
    publish("cli", report(results, p, args.reps), targets(results, p), not args.no_write,
            title="CLI: whole-process inspect and convert", measured=rows(results, measured))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case, peer, src = sys.argv[2:5]
        print(json.dumps(_worker(case, peer, src)))
    else:
        main()
