"""GGUF benchmark: opening a real-sized GGUF file, and dequantization throughput per block type.

    python bench/gguf.py [--reps 5] [--gib 1] [--elements 16777216] [--types Q4_K,IQ2_XS]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench) a ~1 GiB GGUF written by
``gguf.GGUFWriter``: 300 tensors of mixed types (Q4_K attention and FFN matrices, Q6_K down
projections, a Q8_0 embedding, F32 norms) and a 150k-entry tokenizer (tokens, scores, token
types), as real models carry. Then, each run in a fresh process, page cache warm:

1. open + metadata + tensor index       weightio vs gguf.GGUFReader (which builds a numpy view per
                                        array element up front), and weightio decoding the whole
                                        vocabulary on top (what the laziness defers)
2. dequantization, every block type     MB of float32 produced per second, on the same random valid
                                        blocks: weightio on one thread, on every core, and
                                        gguf.quants.dequantize (which has no Q8_1, Q8_K, Q1_0)

and writes the medians and ratios into docs/benchmarks.md (section "gguf").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
sys.path.insert(0, _HERE)

from common import CACHE, SETTLED, Case, arguments, environment, measure, publish, settle, timed, warm  # noqa: E402

# This file is itself named gguf.py: drop its folder from the path so `import gguf` finds the package.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

SCRIPT = Path(__file__).resolve()
VOCAB = 150_000
N_LAYERS = 32  # 9 tensors per layer + 12 others: 300 tensors
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
         "MXFP4", "NVFP4", "Q1_0"]
NO_GGUF_PY = {"Q8_1", "Q8_K", "Q1_0"}
CALLS = 5  # timed dequantization calls per process, after one warm-up call


def model_path(gib: float) -> Path:
    return CACHE / f"gguf-model-{gib:g}g.gguf"


def _random_blocks(rng, type_name: str, n_elements: int):
    """Valid random blocks (f16 fields kept finite, MXFP4 exponents moderate), uint8 (n_blocks, type_size)."""
    import numpy as np

    from weightio.quant.types import by_name

    t = by_name(type_name)
    raw = rng.integers(0, 256, (n_elements // t.block_size, t.type_size), dtype=np.uint8)
    raw[:, 1::2] &= 0xBF
    if type_name == "MXFP4":
        raw[:, 0] = rng.integers(100, 150, raw.shape[0])
    return raw


def generate(gib: float) -> Path:
    """A llama-shaped GGUF of about `gib` GiB, written by gguf.GGUFWriter."""
    import gguf
    import numpy as np

    path = model_path(gib)
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Q = gguf.GGMLQuantizationType
    # hidden size h, FFN size 3h: per layer 4 h*h + 3 * 3h*h weights; choose h for the size
    h = max(256, round(((gib * (1 << 30)) / (N_LAYERS * (4 * 144 + 6 * 144 + 3 * 210) / 256)) ** 0.5 / 256) * 256)
    writer = gguf.GGUFWriter(str(path) + ".tmp", "llama")
    writer.add_block_count(N_LAYERS)
    writer.add_embedding_length(h)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}_{'x' * (i % 7)}" for i in range(VOCAB)])
    writer.add_token_scores([float(-i) for i in range(VOCAB)])
    writer.add_token_types([1] * VOCAB)
    writer.add_quantization_version(2)

    def add(name: str, qtype: str, rows: int, cols: int) -> None:
        if qtype == "F32":  # norms: 1-D
            writer.add_tensor(name, rng.standard_normal(cols, dtype=np.float32))
        else:
            writer.add_tensor(name, _random_blocks(rng, qtype, rows * cols).reshape(rows, -1), raw_dtype=Q[qtype])

    add("token_embd.weight", "Q8_0", 2048, h)
    for i in range(N_LAYERS):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(f"blk.{i}.{part}.weight", "Q4_K", h, h)
        add(f"blk.{i}.ffn_gate.weight", "Q4_K", 3 * h, h)
        add(f"blk.{i}.ffn_up.weight", "Q4_K", 3 * h, h)
        add(f"blk.{i}.ffn_down.weight", "Q6_K", h, 3 * h)
        add(f"blk.{i}.attn_norm.weight", "F32", 1, h)
        add(f"blk.{i}.ffn_norm.weight", "F32", 1, h)
    for j in range(10):
        add(f"rope_freqs.{j}", "F32", 1, h)
    add("output_norm.weight", "F32", 1, h)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(path) + ".tmp", path)
    return path


# ----------------------------------------------------------------------------- worker side


def _open_worker(peer: str, path: str) -> dict:
    import weightio as wio

    if peer == "gguf.GGUFReader":
        import gguf

        def run():
            r = gguf.GGUFReader(path)
            return r, [(t.name, tuple(t.shape), t.tensor_type) for t in r.tensors], list(r.fields)
    else:
        def run():
            c = wio.open(path)
            index = [(k, v.shape, v.ggml_type) for k, v in c.items()]
            keys = list(c.metadata)
            if peer == "weightio+vocab":
                keys.append(c.metadata["tokenizer.ggml.tokens"].tolist())
            return c, index, keys

    result = timed(run)
    with wio.open(path) as c:
        result["extra"] = {"tensors": len(c), "vocab": len(c.metadata["tokenizer.ggml.tokens"])}
    return result


def _dequant_worker(type_name: str, peer: str, n_elements: int) -> dict:
    import numpy as np

    raw = _random_blocks(np.random.default_rng(1), type_name, n_elements)
    if peer == "gguf-py":
        import gguf

        qtype = gguf.GGMLQuantizationType[type_name]
        block_size = gguf.GGML_QUANT_SIZES[qtype][0]
        rows = raw.reshape(-1, raw.shape[1] * (4096 // block_size))  # rows of 4096 elements, as in real models

        def run():
            return gguf.quants.dequantize(rows, qtype)
    else:
        from weightio import quant

        threads = 1 if peer == "weightio-1" else None  # (None: the library's default, every CPU it may run on)

        def run():
            return quant.dequantize(raw, type_name, threads=threads)

    times, cpu = [], []
    settle()
    for _ in range(1 + CALLS):  # the first call faults in fresh memory for its output: not counted
        start, start_cpu = time.perf_counter(), time.process_time()
        out = run()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        del out
    # CPU seconds per wall second: how many cores the call really got (1.9 on two free cores)
    cores = statistics.median(c / t for c, t in zip(cpu[1:], times[1:], strict=True))
    return {"seconds": statistics.median(times[1:]), "rss_mib": 0.0, "extra": {"first": times[0], "cores": cores}}


# ----------------------------------------------------------------------------- driver


def cases(path: Path, n_elements: int, types: list[str]) -> list[Case]:
    out = [Case("open", {peer: ["open", peer, str(path)] for peer in ("weightio", "weightio+vocab", "gguf.GGUFReader")},
                "open + metadata + index")]
    for t in types:
        peers = ["weightio-1", "weightio-all"] + ([] if t in NO_GGUF_PY else ["gguf-py"])
        out.append(Case(f"dq:{t}", {p: ["dequant", p, t, str(n_elements)] for p in peers}, t))
    return out


def _shown(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def report(results: dict, path: Path, n_elements: int, reps: int) -> str:
    from weightio._threads import cpus  # (the CPUs the all-cores peer gets: the library's default)

    opened = results["open"]
    extra = opened["weightio"]["extra"] or {}
    lines = [
        "## GGUF: open and dequantize",
        "",
        f"`python bench/gguf.py --reps {reps}` on {environment()}.",
        f"File: {path.stat().st_size / (1 << 30):.2f} GiB GGUF written by `gguf.GGUFWriter`, {extra.get('tensors')} "
        f"tensors (Q4_K, Q6_K, Q8_0, F32), a {extra.get('vocab'):,}-entry tokenizer (tokens, scores, token types). "
        f"Each run is a fresh process, page cache warm, {SETTLED}; medians of {reps} runs.",
        "",
        "| open + metadata + tensor index | median time | RSS growth | gguf.GGUFReader / this |",
        "|---|---:|---:|---:|",
    ]
    ref = opened["gguf.GGUFReader"]["seconds"]
    for peer, r in opened.items():
        lines.append(f"| {peer} | {_shown(r['seconds'])} | {r['rss_mib']:.1f} MiB | {ref / r['seconds']:.1f}× |")
    lines += [
        "",
        f"Dequantization of {n_elements:,} elements ({n_elements * 4 / 1e6:.0f} MB of float32) from random valid "
        f"blocks (gguf-py gets them as rows of 4096 elements): median of {CALLS} calls per process after one "
        f"warm-up call, median over processes; {cpus()} cores. Ratios are against "
        "`gguf.quants.dequantize` (single-threaded numpy). *Cores obtained* is the CPU time of the "
        "all-cores run per second of wall time (last process): below the core count, other processes "
        "were using the machine.",
        "",
        "| type | gguf-py MB/s | weightio 1 thread MB/s | ratio | weightio all cores MB/s | ratio | cores obtained |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    mb = n_elements * 4 / 1e6
    for case, peers in results.items():
        if not case.startswith("dq:"):
            continue
        one, many = mb / peers["weightio-1"]["seconds"], mb / peers["weightio-all"]["seconds"]
        cores = f"{(peers['weightio-all']['extra'] or {}).get('cores', float('nan')):.2f}"
        if "gguf-py" in peers:
            ref = mb / peers["gguf-py"]["seconds"]
            lines.append(f"| {case[3:]} | {ref:.0f} | {one:.0f} | {one / ref:.2f}× | {many:.0f} | {many / ref:.2f}× "
                         f"| {cores} |")
        else:
            lines.append(f"| {case[3:]} | not supported | {one:.0f} | — | {many:.0f} | — | {cores} |")
    return "\n".join(lines)


def targets(results: dict) -> list[tuple[str, bool]]:
    opened = results["open"]
    speedup = opened["gguf.GGUFReader"]["seconds"] / opened["weightio"]["seconds"]
    ratios1, ratios_all = [], []
    for case, peers in results.items():
        if case.startswith("dq:") and "gguf-py" in peers:
            ratios1.append(peers["gguf-py"]["seconds"] / peers["weightio-1"]["seconds"])
            ratios_all.append(peers["gguf-py"]["seconds"] / peers["weightio-all"]["seconds"])
    return [
        (f"open >= 50x faster than gguf.GGUFReader (measured {speedup:.0f}x)", speedup >= 50),
        (f"dequantization >= 1.5x gguf-py single-threaded for every type (worst {min(ratios1):.2f}x)",
         min(ratios1) >= 1.5),
        (f"dequantization >= 3x gguf-py using every core for every type (worst {min(ratios_all):.2f}x)",
         min(ratios_all) >= 3),
    ]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated block types to measure")


def main() -> None:
    args = arguments(__doc__, reps=5, extra=_options)
    path = generate(args.gib)
    warm(path)
    results = measure(SCRIPT, cases(path, args.elements, args.types.split(",")), args.reps)
    publish("gguf", report(results, path, args.elements, args.reps), targets(results), not args.no_write,
            title="GGUF: open and dequantize", measured=chart_rows(results))


def chart_rows(results: dict) -> list[dict]:
    """The chart's rows: the open against gguf.GGUFReader, and each type's dequantization time
    (the same elements for every peer) against weightio on one thread."""
    out = [{"case": "open + metadata + tensor index", "peer": peer, "seconds": r["seconds"], "rss_mib": r["rss_mib"]}
           for peer, r in results["open"].items()]
    names = {"weightio-1": "weightio (1 thread)", "weightio-all": "weightio (all cores)", "gguf-py": "gguf-py"}
    for case, peers in results.items():
        if case.startswith("dq:"):
            out += [{"case": f"dequantize {case[3:]}", "peer": names[peer], "seconds": r["seconds"]}
                    for peer, r in peers.items()]
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, *rest = sys.argv[2:]
        if kind == "open":
            print(json.dumps(_open_worker(*rest)))
        else:
            print(json.dumps(_dequant_worker(rest[1], rest[0], int(rest[2]))))
    else:
        main()
