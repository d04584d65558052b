"""A legacy llama ggml/ggmf/ggjt file as a llama GGUF model: what llama.cpp's own converter writes.

llama.cpp replaced its ggml-family files with GGUF in August 2023 and shipped a converter,
``convert_llama_ggml_to_gguf.py``; this module is that converter's output written down as data
(read from llama.cpp at 2793b86; no code of it is used). `weightio convert model.ggjt.bin
model.gguf` applies it to a file with llama's seven hyperparameters (``n_vocab, n_embd, n_mult,
n_head, n_layer, n_rot, ftype``) whose tensors all have llama names; the output is a model
llama.cpp loads (tested with llama.cpp itself: ``tests/test_llamacpp.py``). The key/values, in
the converter's order:

==========================================  ===========  ==================================================
key                                         GGUF type    value
==========================================  ===========  ==================================================
general.architecture                        STRING       ``"llama"``
general.name                                STRING       the input file's name (``name=``)
general.description                         STRING       ``"converted from legacy GGJTv3 MOSTLY_Q4_0 format"``
                                                         (unversioned ``ggml`` files are "GGMLv1")
general.file_type                           UINT32       the file's ``ftype``
llama.context_length                        UINT32       2048 (``context_length=``: the file does not say)
llama.embedding_length                      UINT32       ``n_embd``
llama.block_count                           UINT32       ``n_layer``
llama.feed_forward_length                   UINT32       rows of ``layers.0.feed_forward.w1.weight``; without
                                                         that tensor, llama.cpp's old rule
                                                         ``ceil(2 * 4 * n_embd / 3 / n_mult) * n_mult``
llama.rope.dimension_count                  UINT32       ``n_embd // n_head``
llama.attention.head_count                  UINT32       ``n_head``
llama.attention.head_count_kv               UINT32       ``n_head`` / ``gqa`` (``gqa=``, default 1; 8 for LLaMA-2 70B)
llama.attention.layer_norm_rms_epsilon      FLOAT32      5e-6 (``eps=``: 1e-6 for LLaMA-1, 1e-5 for LLaMA-2)
tokenizer.ggml.model                        STRING       ``"llama"``
tokenizer.ggml.pre                          STRING       ``"default"``
tokenizer.ggml.tokens                       ARRAY/STRING the vocabulary, as below
tokenizer.ggml.scores                       ARRAY/F32    the scores (0.0 for unversioned ``ggml`` files)
tokenizer.ggml.token_type                   ARRAY/INT32  as below
tokenizer.ggml.unknown/bos/eos_token_id     UINT32       0, 1, 2
==========================================  ===========  ==================================================

Tokens, by id: 0, 1 and 2 become ``<unk>`` (type 2, unknown), ``<s>`` and ``</s>`` (type 3,
control) whatever the file holds; an empty token is control (3); a one-byte token with id 3 to
258 is the byte token ``<0xXX>`` (type 6); any other token is normal (1), its spaces written as
U+2581 ``▁`` (SentencePiece's space). A file with fewer than 3 tokens, or with a tensor that has
no GGUF name (below), is written as weightio writes other ggml files (``ggml.*`` keys, names kept),
with a note: llama.cpp could not load it as a llama model.

Tensors keep their bytes, ggml type and dimensions; names become GGUF's (gguf-py's
``tensor_mapping`` for ``MODEL_ARCH.LLAMA``), a ``.weight``/``.bias`` suffix kept:

=========================================  ===========================
``tok_embeddings``                         ``token_embd``
``norm``                                   ``output_norm``
``output``                                 ``output``
``rope.freqs``                             ``rope_freqs``
``layers.N.attention.wq`` / ``wk`` / ``wv`` / ``wo``   ``blk.N.attn_q`` / ``attn_k`` / ``attn_v`` / ``attn_output``
``layers.N.attention_norm``                ``blk.N.attn_norm``
``layers.N.feed_forward.w1`` / ``w2`` / ``w3``         ``blk.N.ffn_gate`` / ``ffn_down`` / ``ffn_up``
``layers.N.ffn_norm``                      ``blk.N.ffn_norm``
``layers.N.attention.inner_attention.rope.freqs``      ``blk.N.attn_rot_embd``
=========================================  ===========================

The converter's ``--model-metadata-dir`` (vocabulary and parameters from a Hugging Face
directory) is not offered; its other options are the keyword arguments of `llama_gguf`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = ["LlamaOptions", "FTYPES", "as_llama", "is_llama", "gguf_name", "llama_gguf"]

# ftype -> its name in llama.cpp's GGMLFType (for the description)
FTYPES = {0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 4: "MOSTLY_Q4_1_SOME_F16",
          7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S",
          12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S",
          17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K"}
_FORMATS = {"ggml": "GGML", "ggmf": "GGMF", "ggjt": "GGJT"}
_GLOBAL = {"tok_embeddings": "token_embd", "norm": "output_norm", "output": "output", "rope.freqs": "rope_freqs"}
_BLOCK = {"attention.wq": "attn_q", "attention.wk": "attn_k", "attention.wv": "attn_v", "attention.wo": "attn_output",
          "attention_norm": "attn_norm", "feed_forward.w1": "ffn_gate", "feed_forward.w2": "ffn_down",
          "feed_forward.w3": "ffn_up", "ffn_norm": "ffn_norm", "attention.inner_attention.rope.freqs": "attn_rot_embd"}
_LAYER = re.compile(r"layers\.(0|[1-9][0-9]*)\.(.+)")  # a block number as llama writes it: ASCII, no leading 0
_TYPES = {"general.architecture": "STRING", "general.name": "STRING", "general.description": "STRING",
          "general.file_type": "UINT32", "llama.attention.layer_norm_rms_epsilon": "FLOAT32",
          "tokenizer.ggml.model": "STRING", "tokenizer.ggml.pre": "STRING", "tokenizer.ggml.tokens": "ARRAY[STRING]",
          "tokenizer.ggml.scores": "ARRAY[FLOAT32]", "tokenizer.ggml.token_type": "ARRAY[INT32]"}
_UNK, _NORMAL, _CONTROL, _BYTE = 2, 1, 3, 6  # llama.cpp's token types


@dataclass(frozen=True)
class LlamaOptions:
    """What a ggml file does not say, as llama.cpp's converter takes it (its defaults).

    Attributes:
        context_length: ``--context-length`` (2048; LLaMA-2: 4096).
        eps: ``--eps``, the RMS norm epsilon (5e-6; LLaMA-1: 1e-6, LLaMA-2: 1e-5).
        gqa: ``--gqa``, the grouped-query attention factor (1; LLaMA-2 70B: 8).
        name: ``--name`` (default: the input file's name).
        description: ``--desc`` (default: "converted from legacy GGJTv3 … format").
    """

    context_length: int = 2048
    eps: float = 5e-6
    gqa: int = 1
    name: str | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        for option, most in (("context_length", 2**32 - 1), ("gqa", 255)):  # a GGUF UINT32; the converter's range
            value = getattr(self, option)
            if type(value) is not int or not 1 <= value <= most:
                raise UsageError(f"ggml option {option} must be an int from 1 to {most:,}, not {value!r}")
        if type(self.eps) not in (int, float) or not 0 < self.eps < math.inf:
            raise UsageError(f"ggml option eps must be a positive finite number, not {self.eps!r}")
        for option in ("name", "description"):
            if not isinstance(getattr(self, option), (str, type(None))):
                raise UsageError(f"ggml option {option} must be a str, not {getattr(self, option)!r}")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> LlamaOptions:
        """The options of a ``ggml_options=`` mapping (`weightio.convert.convert`).

        Raises:
            UsageError: an unknown option, or a value of the wrong type or range.
        """
        unknown = sorted(map(repr, set(options or {}) - set(cls.__dataclass_fields__)))
        if unknown:
            raise UsageError(f"unknown ggml option(s) {', '.join(unknown)} (known: context_length, eps, gqa, name, "
                             "description)")
        return cls(**(options or {}))


def is_llama(metadata: Mapping[str, Any]) -> bool:
    """Whether a ggml reader's metadata is llama's (seven hyperparameters, a scored or plain vocabulary)."""
    return metadata.get("ggml.magic") in _FORMATS and "ggml.n_mult" in metadata and "ggml.n_vocab" in metadata


def gguf_name(name: str) -> str | None:
    """The GGUF name of a llama ggml tensor name, or None when it has none.

    Example:
        >>> gguf_name("layers.3.feed_forward.w1.weight"), gguf_name("tok_embeddings.weight")
        ('blk.3.ffn_gate.weight', 'token_embd.weight')
    """
    for suffix in ("", ".weight", ".bias"):
        if suffix and not name.endswith(suffix):
            continue
        base = name[: len(name) - len(suffix)]
        if base in _GLOBAL:
            return _GLOBAL[base] + suffix
        match = _LAYER.fullmatch(base)
        if match and match[2] in _BLOCK:
            return f"blk.{match[1]}.{_BLOCK[match[2]]}{suffix}"
    return None


def _n_kv_head(n_head: int, gqa: int) -> int:
    if gqa == 1:
        return n_head
    found = [x for x in range(1, 256) if n_head / x == gqa]
    if not found:
        raise UsageError(f"gqa {gqa} does not divide the {n_head} attention heads into a whole number of groups")
    return found[-1]


def _feed_forward_length(metadata: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]) -> int:
    shape = shapes.get("layers.0.feed_forward.w1.weight")
    if shape is not None and len(shape) >= 2:
        return int(shape[-2])  # ne[1]: the rows of w1 (numpy order)
    n_embd, n_mult = metadata["ggml.n_embd"], max(metadata["ggml.n_mult"], 1)
    return (2 * (4 * n_embd) // 3 + n_mult - 1) // n_mult * n_mult


def vocabulary(tokens: Sequence[bytes], scores: np.ndarray | None) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Tokens, scores (float32) and token types (int32) as the converter writes them (see the
    module docstring); numbers stay arrays, not a Python object per token."""
    out, types = [], []
    for i, raw in enumerate(tokens):
        if i <= 2:
            raw, kind = (b"<unk>", _UNK) if i == 0 else (b"<s>" if i == 1 else b"</s>", _CONTROL)
        elif not raw:
            kind = _CONTROL
        elif i <= 258 and len(raw) == 1:
            raw, kind = f"<0x{raw[0]:02X}>".encode(), _BYTE
        else:
            raw, kind = raw.replace(b" ", "\u2581".encode()), _NORMAL
        out.append(raw)
        types.append(kind)
    values = np.zeros(len(out), np.float32) if scores is None else np.array(scores, np.float32)
    return out, values, np.array(types, np.int32)


def _token_bytes(metadata: Mapping[str, Any]) -> list[bytes]:
    tokens: Any = metadata.get("ggml.tokens")  # a GGUFArray (what GGMLReader gives), or any sequence
    return list(tokens.raw_strings()) if hasattr(tokens, "raw_strings") else [str(t).encode() for t in tokens or ()]


def llama_gguf(metadata: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], source_name: str,
               options: LlamaOptions) -> tuple[dict[str, Any], dict[str, str]]:
    """The GGUF key/values (in the converter's order) and their GGUF types, for a llama ggml file.

    Args:
        metadata: the ggml reader's metadata (``ggml.*``).
        shapes: the tensors' numpy-order shapes by ggml name (for the feed-forward length).
        source_name: the input file's name (``general.name`` unless ``options.name``).

    Raises:
        UsageError: a vocabulary of fewer than 3 tokens, or a `gqa` that fits no head count.
    """
    raw = _token_bytes(metadata)
    if len(raw) < 3:
        raise UsageError(f"the vocabulary holds {len(raw)} tokens; a llama GGUF needs <unk>, <s> and </s> at least")
    scores = metadata.get("ggml.scores")
    words, values, kinds = vocabulary(raw, None if scores is None else np.asarray(scores))
    magic, version, ftype = metadata["ggml.magic"], metadata.get("ggml.version") or 1, metadata["ggml.ftype"]
    n_embd, n_head = metadata["ggml.n_embd"], metadata["ggml.n_head"]
    description = options.description or (f"converted from legacy {_FORMATS[magic]}v{version} "
                                           f"{FTYPES.get(ftype, f'ftype {ftype}')} format")
    out: dict[str, Any] = {
        "general.architecture": "llama", "general.name": options.name or source_name,
        "general.description": description, "general.file_type": ftype,
        "llama.context_length": options.context_length, "llama.embedding_length": n_embd,
        "llama.block_count": metadata["ggml.n_layer"],
        "llama.feed_forward_length": _feed_forward_length(metadata, shapes),
        "llama.rope.dimension_count": n_embd // n_head if n_head else 0, "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": _n_kv_head(n_head, options.gqa),
        "llama.attention.layer_norm_rms_epsilon": float(options.eps),
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": words,
        "tokenizer.ggml.scores": values, "tokenizer.ggml.token_type": kinds,
        "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    }
    return out, {k: _TYPES.get(k, "UINT32") for k in out}


def as_llama(metadata: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], source_name: str,
             options: LlamaOptions, notes: list[str]) -> tuple[dict[str, Any], dict[str, str], dict[str, str]] | None:
    """`convert`'s step for a llama ggml file written as GGUF: key/values, their types, and
    ``ggml name -> GGUF name`` for the tensors in `shapes`. None when a tensor has no GGUF name
    or the vocabulary lacks the three special tokens: the file is then written as weightio wrote
    such files before (``ggml.*`` keys, names unchanged), and `notes` says so."""
    renames = {name: gguf_name(name) for name in shapes}
    missing = [name for name, new in renames.items() if new is None]
    tokens = _token_bytes(metadata)
    if missing or len(tokens) < 3:
        why = (f"tensor {missing[0]!r} has no GGUF llama name" if missing else
               f"the vocabulary holds {len(tokens)} tokens (<unk>, <s> and </s> at least are needed)")
        notes.append(f"not written as a llama model (llama.cpp could not load it): {why}; the ggml hyperparameters "
                     "are kept as ggml.* keys")
        return None
    out, types = llama_gguf(metadata, shapes, source_name, options)
    notes.append(f"written as a llama GGUF model, as llama.cpp's convert_llama_ggml_to_gguf.py writes it: "
                 f"{len(out['tokenizer.ggml.tokens'])} tokens, {len(renames)} tensors renamed "
                 "(tok_embeddings.weight -> token_embd.weight …)")
    return out, types, {k: v for k, v in renames.items() if v is not None}
