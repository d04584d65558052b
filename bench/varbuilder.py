"""VarBuilder and device benchmark: weightio against safetensors and torch, side by side.

    python bench/varbuilder.py [--reps 5] [--gib 1]

Generates (once, in $WEIGHTIO_BENCH_DIR or /tmp/weightio-bench) a ~1 GiB llama-like checkpoint
of float32 tensors (16 layers of q/k/v/o/gate/up/down projections and norms, embeddings and
lm_head), written by ``safetensors.torch.save_file``, and the same state dict written by
``torch.save`` (zip format) for ``torch.load(mmap=True)``. Then, each run in a fresh process,
page cache warm:

1. resolve + materialize every tensor on torch CPU: ``VarBuilder.pp(...).get(shape, name)`` for
   every tensor, each summed (so every byte is read) and kept until the timer stops, as
   ``safetensors.torch.load_file``'s dict keeps its tensors — vs ``load_file`` and the same sums;
2. fill an ``nn.Module`` (parameters preallocated, untimed): ``weightio.torch.load_into`` vs
   ``torch.load(mmap=True, weights_only=True)`` + ``load_state_dict`` vs
   ``safetensors.torch.load_model``;
3. build a model and load it (timed together; ``transformers.LlamaForCausalLM``, whose names the
   checkpoint has): ``weightio.torch.empty_weights()`` + ``load_into(assign=True)`` (zero-copy) vs
   ``from_pretrained`` of the same model vs an initialised model + ``safetensors.torch.load_model``;
4. resolve only (numpy device, no data read): µs per ``get`` vs the bare ``Checkpoint`` lookup
   with a shape check (the floor);
5. torch CUDA (only where ``torch.cuda.is_available()``): GB/s of ``devices.load_all`` to
   ``torch:cuda:0`` vs ``safe_open(..., device="cuda:0")`` reading every tensor vs one pinned
   host-to-device copy of the same number of bytes (the physical limit).

The medians and ratios go into docs/benchmarks.md (section "varbuilder").
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CACHE, SETTLED, Case, arguments, environment, measure, publish, rows, timed, warm  # noqa: E402

SCRIPT = Path(__file__).resolve()
LOAD = os.getloadavg()  # recorded with the results: a shared machine's noise shows here
HIDDEN, INTER, VOCAB = 1024, 2816, 32000
LAYER = {  # name -> shape, per layer
    "self_attn.q_proj.weight": (HIDDEN, HIDDEN), "self_attn.k_proj.weight": (HIDDEN, HIDDEN),
    "self_attn.v_proj.weight": (HIDDEN, HIDDEN), "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
    "mlp.gate_proj.weight": (INTER, HIDDEN), "mlp.up_proj.weight": (INTER, HIDDEN),
    "mlp.down_proj.weight": (HIDDEN, INTER), "input_layernorm.weight": (HIDDEN,),
    "post_attention_layernorm.weight": (HIDDEN,),
}


def layers_for(gib: float) -> int:
    """Layers that bring the checkpoint to about `gib` GiB (embeddings and lm_head included)."""
    per_layer = sum(math.prod(s) for s in LAYER.values()) * 4
    return max(1, round((gib * (1 << 30) - 2 * VOCAB * HIDDEN * 4) / per_layer))


def shapes(gib: float) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, in model order."""
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers_for(gib)):
        out.update({f"model.layers.{i}.{k}": s for k, s in LAYER.items()})
    out["model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (VOCAB, HIDDEN)
    return out


def paths(gib: float) -> dict[str, Path]:
    tag = f"{gib:g}g"
    return {"st": CACHE / f"varbuilder-{tag}.safetensors", "pt": CACHE / f"varbuilder-{tag}.pt"}


def llama_config(gib: float):
    """The transformers config whose LlamaForCausalLM has exactly the checkpoint's names and shapes."""
    import transformers

    return transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=layers_for(gib),
                                    num_attention_heads=16, num_key_value_heads=16, vocab_size=VOCAB,
                                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def model_dir(gib: float) -> Path:
    """A transformers model directory (config.json + the checkpoint, linked) for from_pretrained."""
    folder = CACHE / f"varbuilder-{gib:g}g-llama"
    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        llama_config(gib).save_pretrained(folder)
        (folder / "model.safetensors").symlink_to(paths(gib)["st"])
    return folder


def generate(gib: float) -> dict[str, Path]:
    import torch

    CACHE.mkdir(parents=True, exist_ok=True)
    p = paths(gib)
    if p["st"].exists() and p["pt"].exists():
        return p
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(s, generator=gen) for k, s in shapes(gib).items()}
    save_file(tensors, str(p["st"]))
    torch.save(tensors, p["pt"])
    return p


# ----------------------------------------------------------------------------- worker side


def build_module(gib: float):
    """An nn.Module whose state_dict names and shapes match the checkpoint, memory allocated and touched."""
    import torch

    with torch.device("meta"):
        root = torch.nn.Module()
        for name, shape in shapes(gib).items():
            *path, leaf = name.split(".")
            node = root
            for part in path:
                if not hasattr(node, part):
                    node.add_module(part, torch.nn.Module())
                node = getattr(node, part)
            node.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape)))
    root = root.to_empty(device="cpu")
    with torch.no_grad():
        for p in root.parameters():
            p.zero_()  # fault the pages in now, outside the timed part, for every peer alike
    return root


def _worker(case: str, peer: str, path: str, gib: float) -> dict:
    import safetensors.torch
    import torch

    import weightio as wio
    import weightio.devices.torch  # noqa: F401 - imported before timing (`import weightio` leaves them to first
    import weightio.torch  # noqa: F401 - use), as the other suites import their readers: the rows time the
    import weightio.varbuilder  # noqa: F401 - work, not an import
    from weightio import devices

    expected = shapes(gib)
    pt_path = str(paths(gib)["pt"])

    def wio_materialize():  # (keeps its tensors to the end, as load_file's dict does: neither times a release)
        vb = wio.VarBuilder.from_path(path, device="torch")
        model = vb.pp("model")
        kept = []
        for i in range(layers_for(gib)):
            layer = model.pp("layers").pp(i)
            kept += (layer.get(shape, name) for name, shape in LAYER.items())
        kept += (vb.get(expected[n], n) for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"))
        return vb, kept, sum(float(t.sum()) for t in kept)

    def st_materialize():
        tensors = safetensors.torch.load_file(path)
        total = 0.0
        for name, shape in expected.items():
            t = tensors[name]
            if tuple(t.shape) != shape:
                raise ValueError(name)
            total += float(t.sum())
        return tensors, total

    def resolve_wio():
        vb = wio.VarBuilder.from_path(path)
        return vb, [vb.get(shape, name) for name, shape in expected.items()]

    def resolve_floor():
        ckpt = wio.open(path)
        out = []
        for name, shape in expected.items():
            view = ckpt[name]
            if view.shape != shape:
                raise ValueError(name)
            out.append(view.numpy())
        return ckpt, out

    if case == "module":
        module = build_module(gib)
        fill = {
            "weightio": lambda: wio.torch.load_into(module, path),
            "torch.load-mmap": lambda: module.load_state_dict(torch.load(pt_path, mmap=True, weights_only=True)),
            "safetensors": lambda: safetensors.torch.load_model(module, path),
        }[peer]
        return timed(fill)
    if case == "meta":
        return _meta_worker(peer, path, gib)
    if case == "cuda":
        return _cuda_worker(peer, path, gib, torch, wio, devices)
    table = {
        ("materialize", "weightio"): wio_materialize, ("materialize", "safetensors"): st_materialize,
        ("resolve", "weightio"): resolve_wio, ("resolve", "checkpoint-lookup"): resolve_floor,
    }
    return timed(table[(case, peer)])


def _meta_worker(peer: str, path: str, gib: float) -> dict:
    import safetensors.torch
    import transformers

    import weightio as wio
    import weightio.torch  # noqa: F401 - imported before timing, as in `_worker`

    transformers.utils.logging.set_verbosity_error()
    config, folder = llama_config(gib), model_dir(gib)
    llama = transformers.LlamaForCausalLM  # imported now: transformers imports model classes on first use

    def weightio_meta():
        with wio.torch.empty_weights():
            model = llama(config)
        wio.torch.load_into(model, path, assign=True)
        return model

    def safetensors_initialised():
        model = llama(config)
        safetensors.torch.load_model(model, path)
        return model

    run = {"weightio": weightio_meta, "from_pretrained": lambda: llama.from_pretrained(folder),
           "safetensors-initialised": safetensors_initialised}[peer]
    return timed(run)


def _cuda_worker(peer: str, path: str, gib: float, torch, wio, devices) -> dict:
    torch.zeros(1).cuda()  # the CUDA context is a one-time cost: created before timing
    nbytes = sum(math.prod(s) * 4 for s in shapes(gib).values())
    if peer == "pinned-h2d":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.zero_()

        def run():
            out = host.to("cuda:0", non_blocking=True)
            torch.cuda.synchronize()
            return out
    elif peer == "weightio":
        def run():
            with wio.open(path) as ckpt:  # opening is part of the time, as safe_open's is
                out = devices.load_all(ckpt, "torch:cuda:0")
            torch.cuda.synchronize()
            return out
    else:
        from safetensors import safe_open

        def run():
            with safe_open(path, "pt", device="cuda:0") as f:
                out = {k: f.get_tensor(k) for k in f.keys()}
            torch.cuda.synchronize()
            return out
    result = timed(run)
    result["extra"] = {"gb": nbytes / 1e9}
    return result


# ----------------------------------------------------------------------------- driver


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def cases(p: dict[str, Path], gib: float) -> list[Case]:
    st, g = str(p["st"]), str(gib)
    out = [
        Case("materialize", {peer: ["materialize", peer, st, g] for peer in ("weightio", "safetensors")},
             "torch CPU: resolve + materialize (sum) every tensor"),
        Case("module", {peer: ["module", peer, st, g] for peer in ("weightio", "torch.load-mmap", "safetensors")},
             "torch CPU: fill an nn.Module (copy into its parameters)"),
        Case("resolve", {peer: ["resolve", peer, st, g] for peer in ("weightio", "checkpoint-lookup")},
             "resolve every name + shape check, no data (numpy)"),
    ]
    if _has_transformers():
        out.insert(2, Case("meta", {peer: ["meta", peer, st, g]
                                    for peer in ("weightio", "from_pretrained", "safetensors-initialised")},
                           "build LlamaForCausalLM + load (weightio: empty_weights + load_into(assign=True))"))
    if _has_cuda():
        out.append(Case("cuda", {peer: ["cuda", peer, st, g] for peer in ("weightio", "safetensors", "pinned-h2d")},
                        "torch:cuda:0: every tensor resident on the GPU"))
    return out


def _load_note() -> str:
    after = os.getloadavg()[0]
    busy = max(LOAD[0], after) > (os.cpu_count() or 1)
    return (f"load average {LOAD[0]:.1f} before the run, {after:.1f} after"
            + (" (above the CPU count: a busy machine, read the ratios, not the times)" if busy else ""))


def _shown(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def report(results: dict, p: dict[str, Path], gib: float, reps: int) -> str:
    size = p["st"].stat().st_size / (1 << 30)
    n = len(shapes(gib))
    lines = [
        "## VarBuilder and devices",
        "",
        f"`python bench/varbuilder.py --reps {reps}` on {environment()}; {_load_note()}.",
        f"Checkpoint: {size:.2f} GiB, {n} float32 tensors (llama-like, {layers_for(gib)} layers), written by "
        "`safetensors.torch.save_file` (and the same state dict by `torch.save` for the torch.load peer). "
        f"Each run is a fresh process, page cache warm, {SETTLED}; medians of {reps} runs. "
        "Ratio = peer time / weightio time (> 1: weightio is faster).",
        "",
        "| case | peer | median time | throughput | RSS growth | ratio |",
        "|---|---|---:|---:|---:|---:|",
    ]
    notes = {c.name: c.note for c in cases(p, gib)}
    gb = p["st"].stat().st_size / 1e9
    for case, peers in results.items():
        base = peers["weightio"]["seconds"]
        for peer, r in peers.items():
            ratio = "1" if peer == "weightio" else f"{r['seconds'] / base:.2f}×"
            rate = "—" if case == "resolve" else f"{gb / r['seconds']:.2f} GB/s"
            if case == "resolve":
                rate = f"{r['seconds'] / n * 1e6:.1f} µs/tensor"
            lines.append(f"| {notes[case]} | {peer} | {_shown(r['seconds'])} | {rate} | {r['rss_mib']:.1f} MiB "
                         f"| {ratio} |")
    if "cuda" not in results:
        lines += ["", "torch:cuda rows: `torch.cuda.is_available()` is False on this machine; they run here "
                  "wherever a CUDA GPU is present, and bench/gpu.py measures them side by side with the GPU "
                  "loaders (section \"GPU\")."]
    return "\n".join(lines)


def targets(results: dict, gib: float) -> list[tuple[str, bool]]:
    def t(case, peer):
        return results[case][peer]["seconds"]

    checks = [
        ("materialize on torch CPU no slower than safetensors.torch.load_file",
         t("materialize", "safetensors") / t("materialize", "weightio") >= 1.0),
        ("load_into no slower than torch.load(mmap=True) + load_state_dict",
         t("module", "torch.load-mmap") / t("module", "weightio") >= 1.0),
        ("load_into into an initialised model no slower than safetensors.torch.load_model",
         t("module", "safetensors") / t("module", "weightio") >= 1.0),
        ("resolution costs <= 10 µs per get over the bare checkpoint lookup",
         (t("resolve", "weightio") - t("resolve", "checkpoint-lookup")) / len(shapes(gib)) <= 10e-6),
    ]
    if "meta" in results:
        checks[2:2] = [
            ("meta model + load_into(assign=True) >= 3x from_pretrained",
             t("meta", "from_pretrained") / t("meta", "weightio") >= 3.0),
            ("meta model + load_into(assign=True) >= 1.5x initialised model + safetensors.torch.load_model",
             t("meta", "safetensors-initialised") / t("meta", "weightio") >= 1.5),
            ("meta model + load_into(assign=True): RSS growth <= 64 MiB (zero-copy: no page of the file touched)",
             results["meta"]["weightio"]["rss_mib"] <= 64),
        ]
    else:
        checks.append(("meta-model targets: not measured here (transformers is not installed)", False))
    if "cuda" in results:
        checks += [
            ("load_all to CUDA >= 0.8x the pinned host-to-device copy",
             t("cuda", "pinned-h2d") / t("cuda", "weightio") >= 0.8),
            ("load_all to CUDA >= 3x safe_open(device='cuda:0')",
             t("cuda", "safetensors") / t("cuda", "weightio") >= 3.0),
        ]
    else:
        checks.append(("CUDA targets (>= 0.8x pinned H2D, >= 3x safetensors): not measured here (no GPU); "
                       "see bench/gpu.py, section \"GPU\"", False))
    return checks


def main() -> None:
    args = arguments(__doc__, reps=5)
    p = generate(args.gib)
    if _has_transformers():
        model_dir(args.gib)
    warm(*p.values())
    measured = cases(p, args.gib)
    results = measure(SCRIPT, measured, args.reps)
    publish("varbuilder", report(results, p, args.gib, args.reps), targets(results, args.gib), not args.no_write,
            title="VarBuilder and devices", measured=rows(results, measured))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case, peer, path, gib = sys.argv[2:6]
        print(json.dumps(_worker(case, peer, path, float(gib))))
    else:
        main()
