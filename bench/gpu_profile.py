"""Where a fresh process's load to CUDA spends its time: the main thread's time in each step of the staging ring.

    python bench/gpu_profile.py [--gib 4] [--reps 2] [--modes load_all,load_into,load_all_twice]

Runs only where ``torch.cuda.is_available()``; elsewhere it says so. The file is bench/memory.py's,
read into the page cache first. Each mode runs in a fresh process, after its imports and the CUDA
context: the ring's steps (`weightio.devices.torch.TorchBackend` and `weightio.devices.staging`
methods) are wrapped with timers, so each row is the main thread's time inside that step, summed
over its calls, for one load; a step's time includes what it waits for (the interpreter's lock
among it). ``load_all_twice`` loads twice in one process: the second load finds the ring pinned and
torch's allocator holding the memory of the first. Modes: ``load_all``, ``load_into`` (a model built
on ``meta``, as bench/gpu.py builds it), ``load_all_twice``, and the steps alone: ``pin`` (32 and
128 MiB of fresh memory faulted in, registered, and by torch's ``pin_memory``), ``alloc`` (device
allocations: 16 x 256 MiB, 512 x 8 MiB).

Prints one line per mode (milliseconds); docs/benchmarks.md "GPU" quotes them. Measures only: it
writes nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import settle, warm  # noqa: E402
from memory import generate  # noqa: E402

DEVICE = "cuda:0"
MODES = ("load_all", "load_into", "load_all_twice", "pin", "alloc")
STEPS = {  # (module, owner, method) -> row
    ("weightio.devices.torch", "TorchBackend", "host_buffer"): "pinning a ring buffer",
    ("weightio.devices.torch", "TorchBackend", "empty"): "device allocations",
    ("weightio.devices.filling", "Filler", "start"): "queueing fills on the pool",
    ("weightio.devices.filling", "Filler", "wait"): "waiting for a buffer's fill",
    ("weightio.devices.torch", "TorchBackend", "copy"): "launching copies",
    ("weightio.devices.staging", "_Slot", "wait"): "waiting for a buffer's last copy",
}


def _timed_steps(spent: dict[str, float]) -> None:
    import importlib

    for (module, owner, method), row in STEPS.items():
        cls = getattr(importlib.import_module(module), owner)
        real = getattr(cls, method)

        def wrapper(*args, _real=real, _row=row, **kwargs):
            start = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                spent[_row] = spent.get(_row, 0.0) + time.perf_counter() - start
                spent[_row + " (calls)"] = spent.get(_row + " (calls)", 0) + 1

        setattr(cls, method, wrapper)


def _worker(mode: str, path: str) -> dict:
    import numpy as np
    import torch

    import weightio as wio
    import weightio.devices.torch  # noqa: F401
    import weightio.torch  # noqa: F401

    torch.zeros(1, device=DEVICE)
    torch.cuda.synchronize()
    clock = time.perf_counter
    if mode == "pin":
        import mmap

        from weightio._memory import populate

        out = {}
        cudart = torch.cuda.cudart()
        for mib in (32, 128):
            n = mib << 20
            fresh = np.frombuffer(mmap.mmap(-1, n), np.uint8)
            start = clock()
            populate(fresh)
            faulted = clock()
            ok = int(cudart.cudaHostRegister(fresh.__array_interface__["data"][0], n, 0)) == 0
            out[f"{mib} MiB: fault in (one thread)"] = faulted - start
            out[f"{mib} MiB: then cudaHostRegister" + ("" if ok else " (refused)")] = clock() - faulted
            start = clock()
            torch.empty(n, dtype=torch.uint8, pin_memory=True)
            out[f"{mib} MiB: torch pin_memory"] = clock() - start
        return out
    if mode == "alloc":
        out = {}
        for count, mib in ((16, 256), (512, 8)):
            start = clock()
            held = [torch.empty(mib << 20, dtype=torch.uint8, device=DEVICE) for _ in range(count)]
            torch.cuda.synchronize()
            out[f"{count} x {mib} MiB"] = clock() - start
            del held
        return out
    spent: dict[str, float] = {}
    _timed_steps(spent)
    model = None
    if mode == "load_into":
        from gpu import _model

        model = _model(torch, path)
    settle()
    out = {}
    for run in range(2 if mode == "load_all_twice" else 1):
        spent.clear()
        start = clock()
        ckpt = wio.open(path)
        if model is None:
            loaded = wio.devices.load_all(ckpt, "torch:" + DEVICE)
        else:
            wio.torch.load_into(model, ckpt, device="torch:" + DEVICE, assign=True)
            loaded = None
        torch.cuda.synchronize()
        out[f"load {run + 1}: the whole load"] = clock() - start
        out.update({f"load {run + 1}: {k}": v for k, v in spent.items()})
        del loaded
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=2, help="fresh processes per mode")
    parser.add_argument("--modes", default=",".join(MODES[:3]), help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(unknown)}; the modes: {', '.join(MODES)}")
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to profile")
        return
    p = generate(args.gib)
    warm(p["safetensors"])
    for mode in modes:
        for _ in range(args.reps):
            out = subprocess.run([sys.executable, __file__, "--worker", mode, str(p["safetensors"])],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{mode}: failed: {out.stderr.strip()[-600:]}", flush=True)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            shown = {k: (round(v * 1e3, 1) if isinstance(v, float) else v) for k, v in row.items()}
            print(f"{mode}: {json.dumps(shown)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(sys.argv[2], sys.argv[3])))
    else:
        main()
