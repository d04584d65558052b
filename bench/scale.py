"""Speed at scale: opening safetensors checkpoints of many tensors and frontier-size layouts.

    python bench/scale.py [--reps 5] [--counts 500,1000,10000,30000,100000] [--layouts 405b,dsv3]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench):

* one safetensors file per count in ``--counts``, of that many small float32 tensors with
  MoE-style names, written by ``safetensors.numpy.save_file``;
* the **Llama-3.1-405B** layout: 191 shards, 1,137 bfloat16 tensors with the model's real names
  and shapes (126 layers, hidden 16,384, MLP 53,248, vocabulary 128,256) and its
  ``model.safetensors.index.json``;
* the **DeepSeek-V3** layout: 163 shards, 91,991 tensors (61 layers, the first 3 dense, then
  256 routed experts and one shared expert per layer, plus the multi-token-prediction layer;
  FP8 E4M3 weights with their float32 ``weight_scale_inv`` blocks, bfloat16 norms and
  embeddings).

The shards are sparse files (a real header, then a hole the size of the data: 810 GB and
688 GB apparent, a few MB on disk), split in model order the way ``save_pretrained`` does.
Each run is a fresh process, page cache warm; medians of ``--reps`` runs:

1. open + list (name, shape, dtype) of every tensor: ``weightio.open`` and ``items()`` vs ``safe_open`` with
   ``get_slice`` per tensor (for a directory: the index read, then every shard), per count and
   per layout — the growth curve is the per-count rows (µs per tensor);
2. DeepSeek-V3: resolve every name through a ``VarBuilder`` with its shape checked (numpy, no
   data read): µs per ``get`` over a bare ``dict`` lookup of the same names (the floor);
3. DeepSeek-V3: ``weightio inspect DIR`` as a whole process vs a Python script printing the
   same table with safetensors (imports and interpreter start included, output to /dev/null);
4. owned copies of many tensors (numpy arrays that own their memory, page cache warm): the largest
   count's file (16 bytes a tensor: the cost per tensor) and 20,000 float32 tensors of ``--gib`` GiB
   in all; weightio ``load_all(copy=True)``, the same with its reads in Python (as before
   ``_speedups.read_pieces``), and safetensors' numpy ``load_file``;
5. zero-copy torch CPU tensors of the same two files (what a framework's load of a cached model
   makes per tensor): weightio ``load_all(ckpt, "torch")`` vs safetensors' torch ``load_file``.

and writes the medians and ratios into docs/benchmarks.md (section "scale").
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

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
    worker_env,
)

SCRIPT = Path(__file__).resolve()
SIZES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
OWNED_TENSORS = 20_000  # the owned case's second file: this many tensors, --gib in all
OWNED_PEERS = ("weightio", "weightio, reads in Python", "safetensors")
VIEWS_PEERS = ("weightio", "safetensors")
# the reference writer's order within a file: widest alignment first, then by name
RANK = {"F32": 0, "BF16": 1, "F8_E4M3": 2}

# ----------------------------------------------------------------------------- layouts


def llama_405b() -> list[tuple[str, str, tuple[int, ...]]]:
    """Llama-3.1-405B's tensors, in model order: (name, dtype code, shape)."""
    hidden, mlp, vocab, kv = 16384, 53248, 128256, 8 * 128
    out = [("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    for i in range(126):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", "BF16", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", "BF16", (kv, hidden)),
                (p + "self_attn.v_proj.weight", "BF16", (kv, hidden)),
                (p + "self_attn.o_proj.weight", "BF16", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", "BF16", (mlp, hidden)),
                (p + "mlp.up_proj.weight", "BF16", (mlp, hidden)),
                (p + "mlp.down_proj.weight", "BF16", (hidden, mlp)),
                (p + "input_layernorm.weight", "BF16", (hidden,)),
                (p + "post_attention_layernorm.weight", "BF16", (hidden,))]
    return out + [("model.norm.weight", "BF16", (hidden,)), ("lm_head.weight", "BF16", (vocab, hidden))]


def deepseek_v3() -> list[tuple[str, str, tuple[int, ...]]]:
    """DeepSeek-V3's tensors (FP8 checkpoint), in model order: (name, dtype code, shape)."""
    hidden, vocab, dense, expert = 7168, 129280, 18432, 2048

    def fp8(name: str, rows: int, cols: int) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(name + ".weight", "F8_E4M3", (rows, cols)),
                (name + ".weight_scale_inv", "F32", (-(-rows // 128), -(-cols // 128)))]

    def mlp(p: str, inner: int) -> list:
        return (fp8(p + "gate_proj", inner, hidden) + fp8(p + "up_proj", inner, hidden)
                + fp8(p + "down_proj", hidden, inner))

    out = [("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    for i in range(62):  # layer 61: the multi-token-prediction module
        p = f"model.layers.{i}."
        layer = [(p + "input_layernorm.weight", "BF16", (hidden,)),
                 (p + "post_attention_layernorm.weight", "BF16", (hidden,)),
                 *fp8(p + "self_attn.q_a_proj", 1536, hidden),
                 (p + "self_attn.q_a_layernorm.weight", "BF16", (1536,)),
                 *fp8(p + "self_attn.q_b_proj", 128 * 192, 1536),
                 *fp8(p + "self_attn.kv_a_proj_with_mqa", 512 + 64, hidden),
                 (p + "self_attn.kv_a_layernorm.weight", "BF16", (512,)),
                 *fp8(p + "self_attn.kv_b_proj", 128 * 256, 512),
                 *fp8(p + "self_attn.o_proj", hidden, 128 * 128)]
        if i < 3:
            layer += mlp(p + "mlp.", dense)
        else:
            layer += [(p + "mlp.gate.weight", "BF16", (256, hidden)),
                      (p + "mlp.gate.e_score_correction_bias", "F32", (256,))]
            for e in range(256):
                layer += mlp(f"{p}mlp.experts.{e}.", expert)
            layer += mlp(p + "mlp.shared_experts.", expert)
        if i == 61:
            layer += [(p + "embed_tokens.weight", "BF16", (vocab, hidden)), (p + "enorm.weight", "BF16", (hidden,)),
                      (p + "hnorm.weight", "BF16", (hidden,)), (p + "eh_proj.weight", "BF16", (hidden, 2 * hidden)),
                      (p + "shared_head.norm.weight", "BF16", (hidden,)),
                      (p + "shared_head.head.weight", "BF16", (vocab, hidden))]
        out += layer
    return out + [("model.norm.weight", "BF16", (hidden,)), ("lm_head.weight", "BF16", (vocab, hidden))]


LAYOUTS = {"405b": (llama_405b, 191, "Llama-3.1-405B"), "dsv3": (deepseek_v3, 163, "DeepSeek-V3")}


def _nbytes(code: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * SIZES[code]


def split(tensors: list, count: int) -> list[list]:
    """`tensors` cut in model order into exactly `count` shards of at most the same byte budget
    (the smallest budget that needs no more than `count`), as ``save_pretrained`` cuts them."""
    sizes = [_nbytes(code, shape) for _, code, shape in tensors]

    def cut(budget: int) -> list[list]:
        shards, current, used = [], [], 0
        for tensor, size in zip(tensors, sizes, strict=True):
            if current and used + size > budget:
                shards.append(current)
                current, used = [], 0
            current.append(tensor)
            used += size
        return shards + [current]

    low, high = max(sizes), sum(sizes)
    while low < high:  # the smallest budget giving at most `count` shards
        mid = (low + high) // 2
        if len(cut(mid)) <= count:
            high = mid
        else:
            low = mid + 1
    shards = cut(low)
    if len(shards) != count:
        raise ValueError(f"cannot cut {len(tensors)} tensors into exactly {count} shards")
    return shards


def write_sparse_shard(path: Path, tensors: list) -> int:
    """One shard: its header as the reference writer lays it out, then a hole as long as the data."""
    ordered = sorted(tensors, key=lambda t: (RANK[t[1]], t[0]))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, code, shape in ordered:
        size = _nbytes(code, shape)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)
    return offset


def generate_layout(key: str) -> Path:
    build, count, _ = LAYOUTS[key]
    folder = CACHE / f"scale-{key}"
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    shards = split(build(), count)
    for i, tensors in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{count:05d}.safetensors"
        total += write_sparse_shard(folder / name, tensors)
        weight_map.update({t[0]: name for t in tensors})
    tmp = index.with_suffix(".tmp")
    tmp.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    tmp.rename(index)
    return folder


def generate_count(n: int, elements: int = 4, stem: str = "scale") -> Path:
    """A safetensors file (``<stem>-<n>``) of `n` float32 tensors of `elements` each, MoE-style names."""
    path = CACHE / f"{stem}-{n}.safetensors"
    if not path.exists():
        import numpy as np
        from safetensors.numpy import save_file

        CACHE.mkdir(parents=True, exist_ok=True)
        tensors = {f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.down_proj.weight":
                   np.full(elements, i, np.float32) for i in range(n)}
        save_file(tensors, str(path) + ".tmp")
        os.rename(str(path) + ".tmp", path)
    return path


def generate_owned(gib: float, n: int = OWNED_TENSORS) -> tuple[Path, int]:
    """`n` float32 tensors of about `gib` GiB in all (64 KiB each at 1.25 GiB), and their bytes each."""
    elements = max(4, int(gib * (1 << 30)) // (4 * n))
    return generate_count(n, elements, stem=f"owned-{elements * 4}b"), elements * 4


def _warm(path: Path, whole: bool = False) -> None:
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    for file in files:  # headers only: the sparse data reads as zeros but is never asked for
        with open(file, "rb") as f:
            if whole:
                while f.read(64 << 20):
                    pass
            else:
                f.read(8 + int.from_bytes(f.read(8), "little") if file.suffix == ".safetensors" else -1)


# ----------------------------------------------------------------------------- worker side


def _safetensors_listing(path: str) -> tuple[list, list]:
    """What a script does with safetensors: the index (for a directory), every shard's handle,
    and (name, shape, dtype) of every tensor."""
    from safetensors import safe_open

    if os.path.isdir(path):
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
    else:
        files = [path]
    handles, out = [], []
    for file in files:
        f = safe_open(file, "numpy")
        handles.append(f)
        out += [(k, s.get_shape(), s.get_dtype()) for k in f.keys() for s in (f.get_slice(k),)]
    return handles, out


def _worker(case: str, peer: str, path: str) -> dict:
    import numpy as np  # noqa: F401 - imported before timing by every peer

    import weightio as wio

    if peer == "safetensors":
        import safetensors  # noqa: F401
    else:  # imports done before timing, as for the peer (msgspec, for large headers, is part of the open)
        import weightio.formats.safetensors  # noqa: F401

    def wio_open():
        c = wio.open(path)
        return c, [(k, v.shape, v.dtype) for k, v in c.items()]

    if case == "open":
        return timed(wio_open if peer == "weightio" else lambda: _safetensors_listing(path))
    if case == "owned":
        return _owned(peer, path)
    if case == "views":
        return _views(peer, path)
    if case == "resolve":
        return _resolve(path)
    raise ValueError(case)


def _owned(peer: str, path: str) -> dict:
    """Every tensor copied into numpy arrays that own their memory: weightio's `load_all(copy=True)`
    (its reads in C, or in Python as before `_speedups.read_pieces`), safetensors' numpy `load_file`
    (the file read into memory, each tensor's bytes copied out of it)."""
    import weightio as wio

    if peer == "safetensors":
        from safetensors.numpy import load_file

        return timed(lambda: load_file(path))
    from weightio.devices import filling

    if peer == "weightio, reads in Python":
        filling._READ_PIECES = None
    elif filling._READ_PIECES is None:
        raise SystemExit("weightio._speedups is not built: the C reads cannot be measured")

    def load() -> dict:
        with wio.open(path) as ckpt:
            return wio.devices.load_all(ckpt, "numpy", copy=True)

    return timed(load)


def _views(peer: str, path: str) -> dict:
    """Every tensor as a zero-copy torch CPU tensor, page cache warm: weightio's `load_all(ckpt,
    "torch")` (each a tensor over private copy-on-write pages of the file), safetensors' torch
    `load_file` (each a tensor over its mapping of the file)."""
    import torch  # noqa: F401 - imported before timing by both

    import weightio as wio
    import weightio.devices.torch  # noqa: F401

    if peer == "safetensors":
        from safetensors.torch import load_file

        return timed(lambda: load_file(path))

    def load() -> dict:
        with wio.open(path) as ckpt:
            return wio.devices.load_all(ckpt, "torch")

    return timed(load)


def _resolve(path: str) -> dict:
    """µs per `VarBuilder.get` (shape checked, numpy, no data read) over a bare dict lookup: the
    first pass of a fresh builder (a model's load: one get a name, the first also filling the
    name map) and the best of 3 passes after it; and the report after them."""
    import weightio as wio

    vb = wio.VarBuilder.from_path(path)
    c = wio.open(path)
    shapes = [(k, v.shape) for k, v in c.items()]
    floor = {k: s for k, s in shapes}
    settle()
    start = time.perf_counter()
    kept = [floor[k] == s for k, s in shapes]
    middle = time.perf_counter()
    kept = [vb.get(s, k) for k, s in shapes]
    first = time.perf_counter() - 2 * middle + start
    del kept
    timings = {}
    for label, run in (("dict", lambda: [floor[k] == s for k, s in shapes]),
                       ("get", lambda: [vb.get(s, k) for k, s in shapes])):
        best = []
        for _ in range(3):
            start = time.perf_counter()
            kept = run()
            best.append(time.perf_counter() - start)
            del kept
        timings[label] = min(best)
    start = time.perf_counter()
    vb.report()
    report = time.perf_counter() - start
    extra = {"names": len(shapes), "us_per_get_over_dict": (timings["get"] - timings["dict"]) / len(shapes) * 1e6,
             "us_per_dict": timings["dict"] / len(shapes) * 1e6, "us_first_pass_over_dict": first / len(shapes) * 1e6,
             "report_ms": report * 1e3}
    return {"seconds": timings["get"], "rss_mib": 0.0, "extra": extra}


_PEER_SCRIPT = '''
import json, os, sys
from safetensors import safe_open
path = sys.argv[1]
with open(os.path.join(path, "model.safetensors.index.json")) as f:
    weight_map = json.load(f)["weight_map"]
rows, total = [], 0
for name in sorted(set(weight_map.values())):
    with safe_open(os.path.join(path, name), "numpy") as f:
        for k in f.keys():
            s = f.get_slice(k)
            rows.append((k, s.get_dtype(), s.get_shape()))
print(path, len(rows), "tensors")
width = max(len(k) for k, _, _ in rows)
for k, dtype, shape in sorted(rows):
    print(f"{k:<{width}}  {dtype:<8} {shape}")
'''


def _process_worker(peer: str, path: str) -> dict:
    """The whole process, timed from outside (interpreter start and imports included)."""
    if peer == "weightio":
        command = [sys.executable, "-m", "weightio", "inspect", path]
    else:
        command = [sys.executable, "-c", _PEER_SCRIPT, path]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=worker_env())
    return {"seconds": time.perf_counter() - start, "rss_mib": 0.0}


# ----------------------------------------------------------------------------- driver


def cases(counts: list[int], layouts: dict[str, Path], gib: float = 0.0) -> list[Case]:
    out = [Case(f"open-{n}", {peer: ["open", peer, str(generate_count(n))] for peer in ("weightio", "safetensors")},
                f"open + list, {n:,} tensors") for n in counts]
    if gib and counts:  # owned copies: many tiny tensors (the cost per tensor), and many of 64 KiB
        for (path, each), n in (((generate_count(max(counts)), 16), max(counts)), (generate_owned(gib), OWNED_TENSORS)):
            size = f"{each:,} bytes" if each < 1 << 10 else f"{each / 1024:.0f} KiB"
            out.append(Case(f"owned-{n}-{size}", {peer: ["owned", peer, str(path)] for peer in OWNED_PEERS},
                            f"owned numpy copies, {n:,} tensors of {size}"))
            out.append(Case(f"views-{n}-{size}", {peer: ["views", peer, str(path)] for peer in VIEWS_PEERS},
                            f"zero-copy torch CPU tensors, {n:,} tensors of {size}"))
    for key, folder in layouts.items():
        label = LAYOUTS[key][2]
        out.append(Case(f"open-{key}", {peer: ["open", peer, str(folder)] for peer in ("weightio", "safetensors")},
                        f"{label}: open the directory + list"))
    if "dsv3" in layouts:
        d = str(layouts["dsv3"])
        out.append(Case("resolve", {"weightio": ["resolve", "weightio", d]},
                        "DeepSeek-V3: VarBuilder.get every name (shape checked, no data read)"))
        out.append(Case("inspect", {peer: ["inspect", peer, d] for peer in ("weightio", "safetensors")},
                        "DeepSeek-V3: whole process, inspect / print every tensor"))
    return out


def report(results: dict, measured: list[Case], reps: int, argv: str) -> str:
    lines = [
        "## Speed at scale: opening many tensors and frontier-size layouts",
        "",
        f"`python bench/scale.py {argv}` on {environment()}, load average at the end of the run "
        f"{os.getloadavg()[0]:.2f}.",
        f"Each run is a fresh process, page cache warm (headers), {SETTLED} (the whole-process rows: from "
        "outside); medians of "
        f"{reps} runs. weightio runs `weightio.open` and `.items()` (name, `shape`, `dtype` of each view); "
        "safetensors runs `safe_open` and `get_slice(name).get_shape()/get_dtype()` per tensor "
        "(for a directory: `json.load` of the index, then every shard). The 405B and DeepSeek-V3 shards are "
        "sparse files with the real names, shapes and dtypes. Ratio = peer time / weightio time "
        "(> 1: weightio is faster).",
        "",
        "| case | peer | median time | µs per tensor | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    counts = {c.name: _count(c) for c in measured}
    for case in measured:
        peers = results[case.name]
        base = peers["weightio"]["seconds"]
        for peer, r in peers.items():
            t = r["seconds"]
            shown = f"{t * 1e3:.1f} ms" if t < 10 else f"{t:.2f} s"
            per = f"{t / counts[case.name] * 1e6:.2f}" if counts[case.name] else "–"
            ratio = "1" if peer == "weightio" else f"{t / base:.2f}×"
            lines.append(f"| {case.note} | {peer} | {shown} | {per} | {ratio} |")
    if any(name.startswith("owned") for name in results):
        lines += ["", "The owned rows copy every tensor into numpy arrays that own their memory: weightio "
                      "`load_all(ckpt, \"numpy\", copy=True)` (the fill pool's reads in C, `_speedups.read_pieces`, "
                      "or in Python as before it), safetensors `safetensors.numpy.load_file`; the file's pages warm."]
    if any(name.startswith("views") for name in results):
        lines += ["", "The zero-copy rows make every tensor a torch CPU tensor over the file's pages, none copied: "
                      "weightio `load_all(ckpt, \"torch\")` (private copy-on-write windows of the file), safetensors "
                      "`safetensors.torch.load_file` (its mapping of the file); the file's pages warm."]
    if "resolve" in results:
        extra = results["resolve"]["weightio"]["extra"]
        lines += ["", f"`VarBuilder.get` over DeepSeek-V3's {extra['names']:,} names: "
                      f"**{extra['us_per_get_over_dict']:.2f} µs** per get over a bare dict lookup "
                      f"({extra['us_per_dict']:.3f} µs): in each process the best of 3 passes, "
                      "the median of the processes. A fresh builder's first pass (one get a name, as a "
                      "model's load makes them, the first filling the name map): "
                      f"{extra['us_first_pass_over_dict']:.2f} µs a get over the dict lookup; the report after "
                      f"the 4 passes: {extra['report_ms']:.0f} ms."]
    return "\n".join(lines)


def _count(case: Case) -> int:
    args = next(iter(case.peers.values()))
    path = Path(args[2])
    if path.is_dir():
        with open(path / "model.safetensors.index.json") as f:
            return len(json.load(f)["weight_map"])
    return int(path.stem.split("-")[-1])


def targets(results: dict) -> list[tuple[str, bool]]:
    def ratio(case: str) -> float:
        r = results[case]
        return r["safetensors"]["seconds"] / r["weightio"]["seconds"]

    out = [(f"{case}: open + list >= 1.0x safe_open ({ratio(case):.2f}x)", ratio(case) >= 1.0)
           for case in results if case.startswith("open-")]
    if "inspect" in results:
        out.append((f"weightio inspect of DeepSeek-V3 >= 1.0x a safetensors script ({ratio('inspect'):.2f}x)",
                     ratio("inspect") >= 1.0))
    if "resolve" in results:
        over = results["resolve"]["weightio"]["extra"]["us_per_get_over_dict"]
        out.append((f"VarBuilder.get <= 3 us over a dict lookup at ~90k names ({over:.2f} us)", over <= 3.0))
    return out


def main() -> None:
    def extra(parser):
        parser.add_argument("--counts", default="500,1000,10000,30000,100000", help="tensors per file, comma-separated")
        parser.add_argument("--layouts", default="405b,dsv3", help="comma-separated: 405b, dsv3 (or none)")

    args = arguments(__doc__, reps=5, extra=extra)
    counts = [int(n) for n in args.counts.split(",") if n]
    layouts = {key: generate_layout(key) for key in args.layouts.split(",") if key in LAYOUTS}
    measured = cases(counts, layouts, args.gib)
    for case in measured:
        _warm(Path(next(iter(case.peers.values()))[2]), whole=case.name.startswith(("owned", "views")))
    results = measure(SCRIPT, measured, args.reps)
    argv = " ".join(sys.argv[1:])
    chart = [r | {"rss_mib": None} for r in rows(results, measured)]
    publish("scale", report(results, measured, args.reps, argv), targets(results), not args.no_write,
            title="Speed at scale: weightio vs safetensors", measured=chart)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case, peer, path = sys.argv[2:5]
        result = _process_worker(peer, path) if case == "inspect" else _worker(case, peer, path)
        print(json.dumps(result))
    else:
        main()
