"""PyTorch benchmark: weightio's allowlist reader against torch.load, on a real torch.save file.

    python bench/pytorch.py [--reps 7] [--gib 1] [--many 100000]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench) a ~1 GiB ``pytorch_model.bin``
of 500 float32 tensors written by ``torch.save`` (zip format), a ``torch.save`` file of `--many`
(100k) small tensors (4 x 8 float32, names like a transformer's) and an ``np.savez`` archive of as
many members, then measures, each run in a fresh process, warm page cache:

1. open + list names, shapes and    weightio vs torch.load(mmap=True, weights_only=True), both
   dtypes, 500 and 100k tensors     timed after their imports (weightio.formats.pytorch included)
   npz open + list, 100k members    weightio vs np.load (which reads each member to list it)
2. the whole process                ``python -c "open + list"``: weightio vs torch, imports included
                                    (bytecode cached for both: `common.worker_env`)
3. numpy() on every tensor          weightio: time and RSS growth (zero-copy views of the zip
                                    records), next to torch.load(mmap=True) + .numpy()
4. the same file in the legacy      weightio open + list (torch cannot mmap legacy files: it
   raw-pickle format                reads every storage; shown for scale)
5. open, step by step               zip walk, prepass, unpickling, index (where weightio's time goes)

and writes the medians and ratios into docs/benchmarks.md (section "pytorch").
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    CACHE,
    SETTLED,
    Case,
    arguments,
    environment,
    measure,
    publish,
    rows,
    settle,
    timed,
    warm,
    worker_env,
)

SCRIPT = Path(__file__).resolve()
N_TENSORS = 500


def paths(gib: float, many: int) -> dict[str, Path]:
    tag = f"{gib:g}g"
    return {"zip": CACHE / f"pytorch-{tag}" / "pytorch_model.bin",
            "legacy": CACHE / f"pytorch-{tag}-legacy" / "pytorch_model.bin",
            "many": CACHE / f"pytorch-{many}t" / "pytorch_model.bin",
            "npz": CACHE / f"npz-{many}m.npz"}


def generate(gib: float, many: int) -> dict[str, Path]:
    p = paths(gib, many)
    if all(path.exists() for path in p.values()):
        return p
    import numpy as np
    import torch

    if not p["many"].exists():  # small tensors: the cost is all per tensor (names, headers, pickle)
        generator = torch.Generator().manual_seed(0)
        state = {f"model.layers.{i // 10}.mlp.{i % 10}.weight": torch.randn(4, 8, generator=generator)
                 for i in range(many)}
        p["many"].parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, p["many"])
    if not p["npz"].exists():
        np.savez(p["npz"], **{f"layers.{i}.weight": np.full((4, 8), i, np.float32) for i in range(many)})
    if p["zip"].exists() and p["legacy"].exists():
        return p

    rows = int(gib * (1 << 30)) // 4 // N_TENSORS // 1024
    generator = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(rows, 1024, generator=generator) for i in range(N_TENSORS)}
    for kind, path in p.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            torch.save(state, path, _use_new_zipfile_serialization=(kind == "zip"))
    return p


# ----------------------------------------------------------------------------- worker side


def _worker(case: str, peer: str, path: str) -> dict:
    import numpy as np

    if peer == "weightio":
        import weightio as wio
        import weightio.formats.numpy
        import weightio.formats.pytorch  # noqa: F401 - the reader modules, imported lazily by open()
    elif peer == "torch":
        import torch

    def wio_open():
        c = wio.open(path)
        return c, [(k, v.shape, v.dtype) for k, v in c.items()]

    def torch_open():
        sd = torch.load(path, mmap=True, weights_only=True)
        return sd, [(k, tuple(v.shape), v.dtype) for k, v in sd.items()]

    def numpy_open():
        z = np.load(path)  # an NpzFile lists names only: each member's shape needs its read
        return z, [(k, (a := z[k]).shape, a.dtype) for k in z.files]

    def wio_numpy():
        c = wio.open(path)
        return c, [c[k].numpy() for k in c]

    def torch_numpy():
        sd = torch.load(path, mmap=True, weights_only=True)
        return sd, [v.numpy() for v in sd.values()]

    table = {("open", "weightio"): wio_open, ("open", "torch"): torch_open,
             ("many", "weightio"): wio_open, ("many", "torch"): torch_open,
             ("npz", "weightio"): wio_open, ("npz", "numpy"): numpy_open,
             ("numpy", "weightio"): wio_numpy, ("numpy", "torch"): torch_numpy,
             ("legacy", "weightio"): wio_open}
    if case.startswith("phases"):
        return _phases(path)
    return timed(table[(case, peer)])


def _phases(path: str) -> dict:
    """weightio's open of a zip checkpoint, step by step (fresh process, like the other cases)."""
    from weightio._gc import collector_paused
    from weightio.limits import current

    with collector_paused():  # as the reader does
        return _timed_phases(path, current())


def _timed_phases(path: str, limits: Any) -> dict:
    from weightio._io import MappedFile
    from weightio.formats import _zip
    from weightio.formats.pytorch import containers, lexer, reader, unpickler
    from weightio.formats.pytorch.flatten import flatten

    settle()
    marks = [("start", time.perf_counter())]
    file = MappedFile(path)
    members = _zip.read_members(file, limits)
    marks.append(("zip walk", time.perf_counter()))
    container = containers.ZipContainer.__new__(containers.ZipContainer)  # its __init__, step by step
    containers.Container.__init__(container, file, limits)
    container._index(members)
    data = container.pickles[0][1]
    marks.append(("records + data.pkl read", time.perf_counter()))
    text8 = lexer.lex(data, limits=limits).text8
    marks.append(("prepass", time.perf_counter()))
    container.root = unpickler.Unpickler(data, container._persistent_load, text8).load()
    marks.append(("unpickling", time.perf_counter()))
    tensors, _ = flatten(container.root, budget=1 << 30, root_name="x")
    builder = reader._Builder(container)
    for name, leaf in tensors.items():
        builder.build(name, leaf)
    marks.append(("flatten + index", time.perf_counter()))
    steps = {name: round((t - marks[i][1]) * 1e3, 3) for i, (name, t) in enumerate(marks[1:])}
    return {"seconds": marks[-1][1] - marks[0][1], "rss_mib": 0.0, "extra": steps}


_PROCESS_CODE = {
    "weightio": "import weightio as wio; c = wio.open({path!r}); x = [(k, v.shape) for k, v in c.items()]",
    "torch": "import torch; sd = torch.load({path!r}, mmap=True, weights_only=True); "
             "x = [(k, tuple(v.shape)) for k, v in sd.items()]",
}


def _process_worker(peer: str, path: str) -> dict:
    """The whole `python -c` process, timed from outside (interpreter start and imports included)."""
    command = [sys.executable, "-c", _PROCESS_CODE[peer].format(path=path)]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=worker_env())
    return {"seconds": time.perf_counter() - start, "rss_mib": 0.0}


def _compile_once(p: dict[str, Path]) -> None:
    """Run each `python -c` once so both peers start from cached bytecode."""
    for peer in _PROCESS_CODE:
        subprocess.run([sys.executable, "-c", _PROCESS_CODE[peer].format(path=str(p["zip"]))], check=True,
                       env=worker_env())


# ----------------------------------------------------------------------------- driver


def cases(p: dict[str, Path]) -> list[Case]:
    z, legacy, many, npz = str(p["zip"]), str(p["legacy"]), str(p["many"]), str(p["npz"])
    count = _count(p["many"])
    return [
        Case("open", {peer: ["open", peer, z] for peer in ("weightio", "torch")},
             f"open + list names, shapes, dtypes: {N_TENSORS} tensors (after imports)"),
        Case("many", {peer: ["many", peer, many] for peer in ("weightio", "torch")},
             f"open + list names, shapes, dtypes: {count:,} tensors"),
        Case("npz", {peer: ["npz", peer, npz] for peer in ("weightio", "numpy")},
             f"npz open + list: {count:,} members"),
        Case("process", {peer: ["process", peer, z] for peer in ("weightio", "torch")},
             "whole process: python -c 'open + list'"),
        Case("numpy", {peer: ["numpy", peer, z] for peer in ("weightio", "torch")},
             "open + numpy() on every tensor"),
        Case("legacy", {"weightio": ["legacy", "weightio", legacy]}, "legacy raw-pickle file: open + list"),
        Case("phases", {"weightio": ["phases", "weightio", z]}, "open, step by step (see below)"),
        Case("phases_many", {"weightio": ["phases", "weightio", many]}, f"open of {count:,} tensors, step by step"),
    ]


def _count(path: Path) -> int:
    """The tensor count of a generated scale file (its directory's name says it)."""
    return int(path.parent.name.split("-")[1].rstrip("t"))


def report(results: dict, p: dict[str, Path], reps: int) -> str:
    size = p["zip"].stat().st_size / (1 << 30)
    lines = [
        "## PyTorch checkpoints: weightio's allowlist reader vs torch.load",
        "",
        f"`python bench/pytorch.py --reps {reps}` on {environment()}.",
        f"File: {size:.2f} GiB `pytorch_model.bin` ({N_TENSORS} float32 tensors, written by `torch.save`, zip "
        "format; and the same state dict in the legacy format). Each run is a fresh process, page cache warm, "
        f"{SETTLED} (the whole-process rows: from outside). "
        f"The scale cases: {_count(p['many']):,} tensors of 4 x 8 float32 written by `torch.save`, and an "
        f"`np.savez` archive of as many members (`np.load` reads each member to give its shape). "
        f"Medians of {reps} runs. torch runs `torch.load(path, mmap=True, weights_only=True)`. "
        "Ratio = peer time / weightio time (> 1: weightio is faster).",
        "",
        "| case | peer | median time | RSS growth | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    notes = {c.name: c.note for c in cases(p)}
    for case, peers in results.items():
        base = peers["weightio"]["seconds"]
        for peer, r in peers.items():
            t = r["seconds"]
            shown = f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"
            ratio = "1" if peer == "weightio" else f"{t / base:.2f}×"
            rss = "–" if case in ("process", "phases", "phases_many") else f"{r['rss_mib']:.1f} MiB"
            lines.append(f"| {notes[case]} | {peer} | {shown} | {rss} | {ratio} |")
    for case, what in (("phases", f"{N_TENSORS} tensors"), ("phases_many", f"{_count(p['many']):,} tensors")):
        steps = results[case]["weightio"]["extra"]
        lines += ["", f"weightio's open of the zip file of {what}, step by step (medians of the runs): "
                  + ", ".join(f"{name} {ms:.2f} ms" for name, ms in steps.items()) + "."]
    lines += ["", "The zip walk reads the central directory (with numpy when it is regular) and then every local "
              "header (in runs of nearby headers); the prepass (opcode checks before CPython's unpickler runs) "
              "is Python, with a fast path for the entry torch.save repeats per tensor; the unpickling itself is "
              "CPython's C unpickler calling weightio's stand-ins."]
    return "\n".join(lines)


def targets(results: dict) -> list[tuple[str, bool]]:
    def t(case: str, peer: str) -> float:
        return results[case][peer]["seconds"]

    return [
        (f"open + list at {N_TENSORS} tensors >= 5x faster than torch.load(mmap=True, weights_only=True)",
         t("open", "torch") / t("open", "weightio") >= 5),
        ("open + list at 100k tensors >= 5x faster than torch.load(mmap=True, weights_only=True)",
         t("many", "torch") / t("many", "weightio") >= 5),
        ("whole process >= 10x faster than with torch", t("process", "torch") / t("process", "weightio") >= 10),
        ("numpy() on every tensor: RSS growth < 16 MiB", results["numpy"]["weightio"]["rss_mib"] < 16),
    ]


def main() -> None:
    args = arguments(__doc__, reps=7, extra=lambda parser: parser.add_argument(
        "--many", type=int, default=100_000, help="tensors (and npz members) of the scale cases"))
    p = generate(args.gib, args.many)
    warm(*p.values())
    _compile_once(p)
    measured = cases(p)
    results = measure(SCRIPT, measured, args.reps)
    publish("pytorch", report(results, p, args.reps), targets(results), not args.no_write,
            title="PyTorch checkpoints: weightio vs torch.load", measured=_chart_rows(results, measured))


def _chart_rows(results: dict, measured: list[Case]) -> list[dict]:
    """The chart's rows: no RSS for the cases that do not measure it (whole process, step by step)."""
    unmeasured = {c.note for c in measured if c.name in ("process", "phases", "phases_many")}
    return [r | {"rss_mib": None} if r["case"] in unmeasured else r for r in rows(results, measured)]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case, peer, path = sys.argv[2:5]
        result = _process_worker(peer, path) if case == "process" else _worker(case, peer, path)
        print(json.dumps(result))
    else:
        main()
