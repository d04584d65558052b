"""Opt-in: llama.cpp itself loads, tokenizes and runs the GGUF that `weightio convert` makes of a ggjt llama.

Skipped unless ``llama_cpp`` (llama-cpp-python, which builds llama.cpp from source) is importable,
so not part of CI's default run. Run it with an interpreter that has it, e.g.::

    /work/llama-venv/bin/python -m pytest -s -p no:cacheprovider tests/test_llamacpp.py

The fixtures (``fixtures/ggml/llama-{f32,f16,q8_0}.bin``, fixtures/gen_ggml.py) are a complete
2-layer LLaMA in llama.cpp's last legacy format. llama.cpp's logits for a short prompt are
compared with a plain numpy forward pass of the same weights as llama.cpp defines the llama
architecture (RMS norm, rotary embedding on adjacent pairs, causal softmax attention, SwiGLU).
"""

from __future__ import annotations

import numpy as np
import pytest

import weightio as wio
from weightio.convert import convert

from .conftest import FIXTURES

llama_cpp = pytest.importorskip("llama_cpp")

# (variant, tolerance on the largest logit difference, relative to the largest logit): llama.cpp
# multiplies F16 and Q8_0 weights with activations rounded to F16 / quantized to Q8_0 blocks.
VARIANTS = [("f32", 1e-5), ("f16", 5e-3), ("q8_0", 8e-2)]
PROMPT = b"hello world"


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, n_rot: int, base: float = 10000.0) -> np.ndarray:
    """llama.cpp's LLAMA rope ("normal" mode): adjacent pairs rotated by pos * base^(-2i/n_rot)."""
    n_tokens = x.shape[0]
    theta = np.arange(n_tokens)[:, None] * base ** (-np.arange(0, n_rot, 2) / n_rot)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out = x.copy()
    out[..., 0:n_rot:2], out[..., 1:n_rot:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def reference_logits(weights: dict[str, np.ndarray], meta: dict, tokens: list[int]) -> np.ndarray:
    """Logits of every position (float64), from the GGUF names and key/values."""
    n_head, eps = meta["llama.attention.head_count"], meta["llama.attention.layer_norm_rms_epsilon"]
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    x = w["token_embd.weight"][tokens]
    n, d = x.shape
    hd = d // n_head
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(meta["llama.block_count"]):
        b = f"blk.{i}."
        h = _rms_norm(x, w[b + "attn_norm.weight"], eps)
        q = _rope((h @ w[b + "attn_q.weight"].T).reshape(n, n_head, hd), meta["llama.rope.dimension_count"])
        k = _rope((h @ w[b + "attn_k.weight"].T).reshape(n, n_head, hd), meta["llama.rope.dimension_count"])
        v = (h @ w[b + "attn_v.weight"].T).reshape(n, n_head, hd)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", p, v).reshape(n, d) @ w[b + "attn_output.weight"].T
        h = _rms_norm(x, w[b + "ffn_norm.weight"], eps)
        gate, up = h @ w[b + "ffn_gate.weight"].T, h @ w[b + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[b + "ffn_down.weight"].T
    return _rms_norm(x, w["output_norm.weight"], eps) @ w["output.weight"].T


@pytest.mark.parametrize("variant,tolerance", VARIANTS)
def test_llama_cpp_runs_the_converted_model(tmp_path, variant, tolerance):
    out = tmp_path / f"llama-{variant}.gguf"
    result = convert(FIXTURES / "ggml" / f"llama-{variant}.bin", out, verify=True)
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=False, n_ctx=64, n_threads=1, logits_all=True,
                          type_k=0, type_v=0, verbose=False)  # an F32 KV cache (F16 by default)
    with wio.open(out) as ckpt:
        meta = dict(ckpt.metadata)
        tokens_table = list(meta["tokenizer.ggml.tokens"])
        weights = {name: ckpt[name].numpy() for name in ckpt}
    tokens = llm.tokenize(PROMPT, add_bos=True)
    assert tokens == [1, tokens_table.index("\u2581hello"), tokens_table.index("\u2581world")]
    assert llm.detokenize(tokens[1:]).strip() == PROMPT
    assert llm.n_vocab() == len(tokens_table) and llm.n_embd() == meta["llama.embedding_length"]
    llm.eval(tokens)
    got = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    want = reference_logits(weights, meta, tokens)
    error = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"\n{variant}: {result.notes[-1]}\n  llama.cpp {llama_cpp.__version__} loaded {out.name}: "
          f"n_vocab={llm.n_vocab()} n_embd={llm.n_embd()} n_ctx={llm.n_ctx()}\n"
          f"  tokenize({PROMPT!r}) = {tokens} ({[tokens_table[t] for t in tokens]})\n"
          f"  logits[-1][:6] llama.cpp {np.round(got[-1, :6], 5).tolist()}\n"
          f"  logits[-1][:6] numpy     {np.round(want[-1, :6], 5).tolist()}\n"
          f"  max |difference| / max |logit| = {error:.2e} (tolerance {tolerance:.0e}); "
          f"argmax equal at every position: {bool((got.argmax(-1) == want.argmax(-1)).all())}")
    assert error < tolerance
    assert (got.argmax(-1) == want.argmax(-1)).all()
    llm.close() if hasattr(llm, "close") else None
