"""Shared machinery for the side-by-side benchmarks (run on demand, never in CI).

Each measurement runs in a fresh Python process (`worker`), so import state, allocator state
and RSS are the same for every peer; peers are interleaved round-robin within each repetition
to spread machine noise; results are medians, and every table row carries its ratio to the
weightio row of the same case. Files are read warm (the page cache is filled before timing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("WEIGHTIO_BENCH_DIR", "/tmp/weightio-bench"))
RESULTS = ROOT / "docs" / "benchmarks.md"

__all__ = ["CACHE", "Case", "arguments", "environment", "measure", "median", "publish", "rss_mib", "run_worker",
           "warm", "write_section"]


def rss_mib() -> float:
    """Resident set size of this process now, in MiB (Linux /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def warm(*paths: Path) -> None:
    """Read files once so every peer starts from the same (warm) page cache."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def timed(fn: Callable[[], object]) -> dict:
    """Run `fn` once in this (worker) process: wall seconds and RSS growth, keeping its result alive."""
    before = rss_mib()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    grown = rss_mib() - before
    del result
    return {"seconds": seconds, "rss_mib": grown}


class Case:
    """One benchmark case: a name and, per peer, the worker arguments that run it."""

    def __init__(self, name: str, peers: dict[str, list[str]], note: str = "") -> None:
        self.name, self.peers, self.note = name, peers, note


def run_worker(script: Path, args: list[str]) -> dict:
    out = subprocess.run([sys.executable, str(script), "--worker", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return statistics.median(values)


def measure(script: Path, cases: list[Case], reps: int) -> dict[str, dict[str, dict]]:
    """{case: {peer: {"seconds": median, "rss_mib": median, "runs": n}}}.

    Peers are interleaved within each repetition, and the order rotates from one repetition to
    the next, so no peer always runs first (right after another peer warmed or dirtied caches).
    """
    samples: dict[str, dict[str, list[dict]]] = {c.name: {p: [] for p in c.peers} for c in cases}
    for rep in range(reps):
        for case in cases:
            peers = list(case.peers.items())
            shift = rep % len(peers)
            for peer, args in peers[shift:] + peers[:shift]:
                samples[case.name][peer].append(run_worker(script, args))
        print(f"  rep {rep + 1}/{reps} done", file=sys.stderr)
    return {
        case: {peer: {"seconds": median([r["seconds"] for r in runs]),
                      "rss_mib": median([r["rss_mib"] for r in runs]),
                      "extra": runs[-1].get("extra"), "runs": len(runs)}
               for peer, runs in peers.items()}
        for case, peers in samples.items()
    }


def environment() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from importlib.metadata import PackageNotFoundError, version

    versions = []
    for module in ("numpy", "safetensors", "torch", "gguf", "ml_dtypes"):
        try:
            versions.append(f"{module} {version(module)}")
        except PackageNotFoundError:
            pass
    return (f"{time.strftime('%Y-%m-%d')}, {platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} CPUs ({cpu}), {', '.join(versions)}")


def write_section(suite: str, markdown: str) -> None:
    """Replace this suite's section of docs/benchmarks.md (between its markers), or append it."""
    start, end = f"<!-- suite:{suite} -->", f"<!-- /suite:{suite} -->"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks\n\n"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)


def arguments(doc: str | None, reps: int, extra: Callable[[argparse.ArgumentParser], None] | None = None,
              gib: float = 1.0) -> argparse.Namespace:
    """The options every suite takes (--reps, --gib, --no-write), plus the suite's own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=reps, help="repetitions (fresh processes) per case")
    parser.add_argument("--gib", type=float, default=gib, help="size of the generated files")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def publish(suite: str, report: str, checks: list[tuple[str, bool]], write: bool) -> None:
    """Print a suite's report and its target checks (name, met) as a checklist, and write them
    into docs/benchmarks.md."""
    listed = "\n".join(f"- [{'x' if met else ' '}] {name}" for name, met in checks)
    text = report + "\n\nTargets (from the issue):\n\n" + listed + "\n"
    print(text)
    if write:
        write_section(suite, text)
