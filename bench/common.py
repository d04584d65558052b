"""Shared machinery for the side-by-side benchmarks (run on demand, never in CI).

Each measurement runs in a fresh Python process (`worker`), so import state, allocator state
and RSS are the same for every peer; peers are interleaved within each repetition, in an order
that changes which peer runs first and which peer each one follows (`run_order`); results are
medians, and every table row carries its ratio to the weightio row of the same case. Files are
read warm (the page cache is filled before timing).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("WEIGHTIO_BENCH_DIR", "/tmp/weightio-bench"))
RESULTS = ROOT / "docs" / "benchmarks.md"
RECORDS = ROOT / "bench" / "results"  # <suite>.json: the rows each suite's charts are drawn from
IMAGES = ROOT / "docs" / "img"  # <suite>.png: the charts

__all__ = ["CACHE", "Case", "arguments", "chart", "environment", "measure", "median", "median_extra", "publish", "rows",
           "rss_mib", "run_order", "run_worker", "warm", "worker_env", "write_section"]


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


SETTLED = ("timed after the worker's imports and the full garbage collection they are owed "
           "(`bench/common.py` `settle`)")


def settle() -> None:
    """Run the full garbage collection a worker's imports are owed, before its clock starts.

    ``import torch`` leaves ~170k objects that Python's cyclic collector has not yet traversed in
    a full collection; it runs one (150-220 ms here) once enough new containers have been
    allocated, during whatever code allocates them. Timed, it fell on the peer that made the most
    objects: a 50 MiB `load_all(copy=True)` took 265-317 ms with it and 65-106 ms without, and
    switching the collector off during the load only moved it to the caller's next allocations.
    It belongs to the imports, so every peer's worker settles it first."""
    gc.collect()


def timed(fn: Callable[[], object]) -> dict:
    """Run `fn` once in this (worker) process, after `settle`: wall seconds and RSS growth, keeping
    its result alive."""
    settle()
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


def worker_env() -> dict[str, str]:
    """The environment of every process a suite starts: bytecode written and reused, as for any
    installed package. With PYTHONDONTWRITEBYTECODE (set on the machines these suites run on), an
    editable weightio would be compiled from source by every process — its imports, and every
    module it imports on first use inside a timed step — while the peers' wheels ship bytecode."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_worker(script: Path, args: list[str]) -> dict:
    out = subprocess.run([sys.executable, str(script), "--worker", *args], capture_output=True, text=True,
                         env=worker_env())
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return statistics.median(values)


def run_order(n: int, rep: int) -> list[int]:
    """The order in which `n` peers run in repetition `rep` (indices into the peers' list).

    A run can be slowed by the run before it, even with the file's pages evicted in between: on the
    2-CPU VM, a cold 4 GiB read of weightio's torch views took 6.79-8.39 s (median 8.05) right after
    a run of safetensors' `load_file` and 5.05-6.41 s (median 5.42) right after another weightio run
    (same code, 5 alternations), while `load_file` took 6.3 s whichever ran before it. Rotating one
    order keeps every peer behind the same neighbour in every repetition, so such an effect lands on
    one peer each time. (The cause, found later: weightio's sequential reads get large page-cache
    folios, made of whole free 2 MiB blocks, and after a `load_file` run, whose memory went back in
    4 KiB pages, the blocks it gets are ones this VM's host has taken back and must back again;
    docs/benchmarks.md, "Why a cold run depends on the run before it".) These orders are the rows of
    a Williams design (the balanced Latin square used for carry-over effects in crossover trials;
    for odd `n` each row is followed by its mirror): over `n` repetitions (``2n`` for odd `n`),
    every peer runs first equally often and follows every other peer equally often within a
    repetition, and in the first repetitions each peer already follows different ones. Across
    repetitions, a mirror starts with the peer that ended the order before it (which then follows
    itself): once per peer in a cycle. Fewer repetitions than a cycle balance only in part.
    """
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    if n % 2:  # an odd square balances only with its mirror
        rows = [row for pair in zip(rows, [r[::-1] for r in rows], strict=True) for row in pair]
    return rows[rep % len(rows)] if n else []


def measure(script: Path, cases: list[Case], reps: int) -> dict[str, dict[str, dict]]:
    """{case: {peer: {"seconds": median, "rss_mib": median, "runs": n, "after": {peer before: [seconds]}}}}.

    Peers are interleaved within each repetition, in the orders of `run_order`: no peer always
    runs first, nor always right after the same other peer (which may have warmed, dirtied or
    fragmented what the next run uses). "after" keeps each run's time under the peer that ran just
    before it (in any case of this call; the first run has none), for a suite to show that effect.
    """
    # weightio's bytecode written once, before any timing (what `pip install` does for a wheel)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "weightio"), str(ROOT / "cli")],
                   env=worker_env(), stdout=subprocess.DEVNULL, check=False)
    samples: dict[str, dict[str, list[dict]]] = {c.name: {p: [] for p in c.peers} for c in cases}
    previous = None
    for rep in range(reps):
        for case in cases:
            peers = list(case.peers.items())
            for index in run_order(len(peers), rep):
                peer, args = peers[index]
                samples[case.name][peer].append({**run_worker(script, args), "after": previous})
                previous = peer
        print(f"  rep {rep + 1}/{reps} done", file=sys.stderr)
    return {
        case: {peer: {"seconds": median([r["seconds"] for r in runs]),
                      "rss_mib": median([r["rss_mib"] for r in runs]),
                      "extra": median_extra([r.get("extra") for r in runs]), "runs": len(runs),
                      "after": after(runs)}
               for peer, runs in peers.items()}
        for case, peers in samples.items()
    }


def after(runs: list[dict]) -> dict[str, list[float]]:
    """Each run's seconds under the peer that ran just before it (runs that followed none are left out)."""
    found: dict[str, list[float]] = {}
    for r in runs:
        if r.get("after") is not None:
            found.setdefault(r["after"], []).append(r["seconds"])
    return found


def median_extra(extras: list) -> Any:
    """The runs' `extra` readings as one: a number (not a bool) the median of the runs', a dict
    key by key, anything else (a name, a list) the last run's; None where the last run had none."""
    last = extras[-1] if extras else None
    if isinstance(last, dict):
        return {key: median_extra([e.get(key) for e in extras if isinstance(e, dict) and key in e])
                for key in last}
    numbers = [e for e in extras if isinstance(e, (int, float)) and not isinstance(e, bool)]
    if last is None or len(numbers) != len(extras) or isinstance(last, bool):
        return last
    return numbers[0] if len(set(numbers)) == 1 else median(numbers)


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


def publish(suite: str, report: str, checks: list[tuple[str, bool]], write: bool, *, title: str = "",
            measured: list[dict] | None = None) -> None:
    """Print a suite's report and its target checks (name, met) as a checklist, and write them
    into docs/benchmarks.md; with `measured` rows (see `rows`), also record them in
    bench/results/<suite>.json and draw docs/img/<suite>.png from them (embedded in the section)."""
    listed = "\n".join(f"- [{'x' if met else ' '}] {name}" for name, met in checks)
    picture = f"\n\n![{title or suite}](img/{suite}.png)" if measured else ""
    text = report + picture + "\n\nTargets (from the issue):\n\n" + listed + "\n"
    print(text)
    if write:
        if measured:
            record = {"suite": suite, "title": title or suite, "environment": environment(), "rows": measured}
            RECORDS.mkdir(parents=True, exist_ok=True)
            (RECORDS / f"{suite}.json").write_text(json.dumps(record, indent=1) + "\n")
            chart(record, IMAGES / f"{suite}.png")
        write_section(suite, text)


# ----------------------------------------------------------------------------- charts

# What a row may hold, besides its case and peer: the measure, its axis label, what "> 1" means.
METRICS = {"seconds": ("time", "faster"), "rss_mib": ("RSS (at least 1 MiB each)", "smaller"),
           "bytes": ("bytes moved", "fewer")}


def rows(results: dict[str, dict[str, dict]], cases: list[Case]) -> list[dict]:
    """`measure`'s medians as chart rows: {"case": its note, "peer", "seconds", "rss_mib"}, in order."""
    notes = {c.name: c.note or c.name for c in cases}
    return [{"case": notes[case], "peer": peer, "seconds": r["seconds"], "rss_mib": r["rss_mib"]}
            for case, peers in results.items() for peer, r in peers.items()]


def _ratios(rows: list[dict]) -> list[tuple[str, dict[str, dict[str, float]]]]:
    """[(case, {peer: {metric: peer's value / weightio's}})]: the first row of a case whose peer
    starts with "weightio" is its baseline; cases with no other peer are left out."""
    cases: dict[str, list[dict]] = {}
    for row in rows:
        cases.setdefault(row["case"], []).append(row)
    out = []
    for case, members in cases.items():
        base = next((r for r in members if r["peer"].startswith("weightio")), None)
        if base is None:
            continue
        label = case if base["peer"] == "weightio" else f"{case} (vs {base['peer']})"
        peers = {}
        for row in members:
            if row is base:
                continue
            found = {}
            for metric in METRICS:
                a, b = row.get(metric), base.get(metric)
                if a is None or b is None:
                    continue
                if metric == "rss_mib":
                    a, b = max(a, 1.0), max(b, 1.0)  # growth below 1 MiB is noise, and 0 divides nothing
                if a > 0 and b > 0:
                    found[metric] = a / b
            if found:
                peers[row["peer"]] = found
        if peers:
            out.append((label, peers))
    return out


def chart(record: dict, path: Path) -> Path:
    """Draw one suite's rows as horizontal bars: each peer's value / weightio's for the same case,
    on a log axis centred on 1 (one panel per measure the rows have: time, RSS, bytes). Needs
    matplotlib (the bench extra), imported only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    table = _ratios(record["rows"])
    if not table:
        raise ValueError(f"{record['suite']}: no case has a peer to compare weightio with")
    metrics = [m for m in METRICS if any(m in r for _, peers in table for r in peers.values())]
    peers = list(dict.fromkeys(p for _, ps in table for p in ps))
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(peers)}
    band = max(len(ps) for _, ps in table)
    fig, axes = plt.subplots(1, len(metrics), sharey=True, squeeze=False,
                             figsize=(3.2 + 3.6 * len(metrics), 1.5 + 0.22 * band * len(table)))
    height = 0.8 / band
    for ax, metric in zip(axes[0], metrics, strict=True):
        values = []
        for y, (_, ps) in enumerate(table):
            for k, (peer, r) in enumerate(ps.items()):
                if metric not in r:
                    continue
                v = r[metric]
                values.append(v)
                yy = y + height * (k - (len(ps) - 1) / 2)  # the case's bars centred on its row
                ax.barh(yy, v - 1, left=1, height=height * 0.9, color=colours[peer])
                ax.text(v * (1.06 if v >= 1 else 1 / 1.06), yy, f"{v:.2g}×" if v < 10 else f"{v:,.0f}×",
                        va="center", fontsize=7, ha="left" if v >= 1 else "right")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        low, high = min(values + [1.0]), max(values + [1.0])
        ax.set_xlim(min(0.1, low / 2.5), max(10.0, high * 2.5))  # a decade each side at least
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.axvline(1, color="black", linewidth=0.8)
        label, better = METRICS[metric]
        ax.set_xlabel(f"{label}: peer / weightio\n(> 1: weightio {better})", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", which="major", alpha=0.3)
    axes[0][0].set_yticks(range(len(table)), [textwrap.shorten(case, 60) for case, _ in table])
    axes[0][0].set_ylim(len(table) - 0.5, -0.5)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in peers]
    fig.legend(handles, peers, loc="upper center", ncol=min(len(peers), 4), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(record["title"], fontsize=10, y=1.0 + 0.02 * ((len(peers) + 3) // 4), va="bottom")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    from PIL import Image  # Pillow: a dependency of matplotlib

    # 64 colours are plenty for flat bars and text, and make the file a third of the size
    Image.open(drawn).convert("RGB").quantize(colors=64).save(path, optimize=True)
    return path
