"""What a converted file keeps of its source's metadata (`weightio.convert`).

* GGUF to GGUF keeps every key with its value, but not the split-set keys of the source's parts
  nor a ``general.alignment`` that is not an int.
* A llama ggml/ggmf/ggjt file (read by the ggml reader: not a file of another format whose
  metadata holds ``ggml.*`` keys) written as GGUF becomes the llama GGUF model llama.cpp's own
  converter writes (`weightio.formats.ggml_to_gguf`): its keys, value types and tensor names.
* A whisper.cpp model written as GGUF keeps its mel filters and vocabulary as arrays.
* Otherwise GGUF keeps the scalars; safetensors keeps scalars as strings; ``.npz``/``.npy`` keep
  nothing. What is left out is said in the notes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from .checkpoint import Checkpoint
from .formats.ggml_to_gguf import LlamaOptions, as_llama, is_llama

__all__ = ["carried"]

_INDEX_KEYS = frozenset({"total_size", "total_parameters"})  # describe the source's index, not the tensors


def carried(ckpt: Checkpoint, shapes: Mapping[str, tuple[int, ...]], fmt: str, llama: LlamaOptions | None,
            notes: list[str]) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The metadata a `fmt` output of `ckpt`'s tensors (`shapes`) holds, GGUF value types for
    keys whose type is not the default one, and new tensor names (empty: names are kept)."""
    from_ggml = ckpt.format == "ggml"  # ggml.* keys of other files (a GGUF weightio wrote from one) are data
    if fmt == "gguf" and from_ggml and is_llama(ckpt.metadata):
        model = as_llama(ckpt.metadata, shapes, os.path.basename(ckpt.path), llama or LlamaOptions(), notes)
        if model is not None:
            return model
    arrays = _whisper_arrays(ckpt.metadata, fmt) if from_ggml else {}
    scalars = _carried_metadata({k: v for k, v in ckpt.metadata.items() if k not in arrays}, ckpt.format, fmt, notes)
    return scalars | arrays, {}, {}


def _carried_metadata(metadata: Mapping[str, Any], source: str, fmt: str, notes: list[str]) -> dict[str, Any]:
    """The source metadata the output can hold.

    GGUF to GGUF keeps every key with its value (but not the split-set keys of the source's
    parts, nor a ``general.alignment`` that is not an int); from other formats GGUF keeps the
    scalars. safetensors keeps scalars as strings. ``.npz``/``.npy`` keep nothing. What is left
    out is said in `notes`.
    """
    kept = {k: v for k, v in metadata.items() if k not in _INDEX_KEYS}
    if fmt in ("npz", "npy"):
        if any(k != "format" for k in kept):
            notes.append(f"metadata not kept: {fmt} files cannot store metadata ({len(kept)} entries)")
        return {}
    if fmt == "gguf":
        kept = {k: v for k, v in kept.items() if k != "format" and not k.startswith("split.")
                and (k != "general.alignment" or isinstance(v, int))}
        if source == "gguf":
            return kept
    scalars = {k: v for k, v in kept.items() if isinstance(k, str) and isinstance(v, (str, int, float, bool))}
    if len(scalars) < len(kept):
        dropped = [k for k in kept if k not in scalars]
        notes.append(f"metadata not kept: {len(dropped)} entries that are not scalars "
                     f"({', '.join(map(str, dropped[:3]))}{' …' if len(dropped) > 3 else ''})")
    carried = scalars if fmt == "gguf" else {k: v if isinstance(v, str) else str(v) for k, v in scalars.items()}
    return _escape_surrogates(carried, fmt, notes)


def _whisper_arrays(metadata: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """A whisper.cpp model's mel filters and vocabulary, for a GGUF output: arrays (FLOAT32, and
    STRING with each token's bytes as stored), which GGUF holds though they are not scalars."""
    if fmt != "gguf" or metadata.get("ggml.layout") != "whisper":
        return {}
    return {k: metadata[k] for k in ("whisper.mel_filters", "whisper.tokens") if k in metadata}


# Lone surrogates: U+DC80-U+DCFF stand for undecodable bytes (GGUF strings are read with
# surrogateescape), the others for nothing at all (a pickle may hold any str).
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_A_BYTE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def _escape_surrogates(metadata: dict[str, Any], fmt: str, notes: list[str]) -> dict[str, Any]:
    """String values that are not valid Unicode, made storable: GGUF writes undecodable bytes back
    as the bytes they were; JSON (safetensors) cannot hold them, so they become backslash
    escapes, ``\\x80`` for a byte, ``\\ud800`` for another lone surrogate (as Python writes them)."""
    pattern = _NOT_A_BYTE if fmt == "gguf" else _SURROGATE
    escaped = [k for k, v in metadata.items() if isinstance(v, str) and pattern.search(v)]
    if not escaped:
        return metadata
    notes.append(f"metadata: {len(escaped)} string(s) held text that is not valid Unicode ({escaped[0]!r}"
                 f"{' …' if len(escaped) > 1 else ''}); written with backslash escapes (\\x80 for an undecodable byte)")
    return {k: pattern.sub(_surrogate_escape, v) if isinstance(v, str) else v for k, v in metadata.items()}


def _surrogate_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"
