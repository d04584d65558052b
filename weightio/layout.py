"""The Hugging Face model-directory rules, in one place for local directories, the Hub and GGUF.

A model directory holds its weights in one of these layouts, most preferred first:

* a sharded set: an index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``)
  whose ``weight_map`` routes each tensor name to a shard file in the same directory;
* one weight file (``model.safetensors``, ``pytorch_model.bin``, ``*.gguf``, …);
* the parts of one split GGUF model, ``<stem>-00001-of-0000N.gguf`` … (llama.cpp's
  ``gguf-split`` names); part 1 brings the others.

`choose` applies these rules to a list of file names (a local listing or a Hub repo's),
`read_index` reads and checks an index file (`parse_index` its bytes), `split_part` parses a split-GGUF name. Callers
word their own errors; the rules live here only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from ._io import MappedFile
from ._json import parse_json_object
from ._native import speedups
from .errors import CorruptFileError

__all__ = ["LAYOUTS", "WEIGHT_SUFFIXES", "Ambiguous", "choose", "is_weights", "check_index", "parse_index",
           "read_index", "split_part", "split_parts"]

_c_index = speedups.index_json if speedups is not None else None  # plain indexes in C: `parse_index`

# (index suffix or None, preferred file, other weight suffixes), most preferred first.
# GGUF has no index file: a directory holds one .gguf, or the parts of one split set.
LAYOUTS: tuple[tuple[str | None, str, tuple[str, ...]], ...] = (
    (".safetensors.index.json", "model.safetensors", (".safetensors",)),
    (".bin.index.json", "pytorch_model.bin", (".bin", ".pt", ".pth", ".ckpt")),
    (None, "model.gguf", (".gguf",)),
)

# Names of weight files, of any framework: what `weightio convert` never copies beside its output
# (the converted weights replace them; see weightio.model_files). Each layout's suffixes, plus
# TensorFlow (tf_model.h5), Flax (flax_model.msgpack), ONNX and rust-bert (rust_model.ot) weights,
# and the index of any of them (``pytorch_model.bin.index.json``).
WEIGHT_SUFFIXES = tuple(s for _, _, suffixes in LAYOUTS for s in suffixes) + (".h5", ".msgpack", ".onnx", ".ot")

_SPLIT_GGUF = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")


class Ambiguous(Exception):  # noqa: N818 - a signal to callers, never raised out of weightio
    """Several candidate files where the rules do not choose; callers turn it into their error.

    Attributes:
        candidates: the candidate file names, sorted.
    """

    def __init__(self, candidates: list[str]) -> None:
        super().__init__(", ".join(candidates))
        self.candidates = candidates


def split_part(name: str) -> tuple[str, int, int] | None:
    """``(stem, number, count)`` for a split-GGUF part name (``m-00002-of-00003.gguf``), else None."""
    match = _SPLIT_GGUF.fullmatch(name)
    return None if match is None else (match["stem"], int(match["no"]), int(match["count"]))


def split_parts(stem: str, count: int) -> list[str]:
    """The names of every part of the split set `stem` of `count` parts, in order."""
    return [f"{stem}-{k:05d}-of-{count:05d}.gguf" for k in range(1, count + 1)]


def is_weights(name: str) -> bool:
    """Whether file `name` (a base name or a relative path) holds weights or a weight index.

    Example:
        >>> is_weights("pytorch_model.bin.index.json"), is_weights("tokenizer.json")
        (True, False)
    """
    base = name.rsplit("/", 1)[-1].lower()
    base = base.removesuffix(".index.json")
    return base.endswith(WEIGHT_SUFFIXES)


def choose(files: Iterable[str]) -> str | None:
    """The file a model directory holding `files` is opened by: an index, or a weight file.

    Args:
        files: the directory's file names (names with "/" are in sub-folders and ignored).

    Returns:
        A ``*.index.json`` name (a sharded set), a weight file name (for a split GGUF set, its
        first part), or None when no file has a weight suffix.

    Raises:
        Ambiguous: several candidates of the preferred layout present and none preferred.
    """
    top = sorted(f for f in files if "/" not in f)
    for index_suffix, preferred, suffixes in LAYOUTS:
        if index_suffix is not None:
            index = _pick([f for f in top if f.endswith(index_suffix)], preferred + ".index.json")
            if index is not None:
                return index
        single = _pick([f for f in top if f.endswith(suffixes)], preferred)
        if single is not None:
            return single
    return None


def _pick(candidates: list[str], preferred: str) -> str | None:
    if preferred in candidates:
        return preferred
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    parts = [split_part(c) for c in candidates]
    if all(parts) and len({(p[0], p[2]) for p in parts if p}) == 1:
        return min(candidates)  # the parts of one split GGUF set: part 1 brings the others
    raise Ambiguous(candidates)


def read_index(index_path: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The ``weight_map`` (tensor name -> shard file) and ``metadata`` of a sharded index file.

    Raises:
        CorruptFileError: not a JSON object of that shape, or a shard name that would leave the
            index's directory (`outside`: empty, absolute, with a ``..`` component or a drive).
    """
    file = MappedFile(index_path)
    try:
        raw = file.read(0, file.size, "the index")
    finally:
        file.close()
    return parse_index(raw, index_path)


def parse_index(raw: bytes, where: str) -> tuple[dict[str, str], dict[str, Any]]:
    """`read_index` of an index's bytes (a file's, or a URL's named `where`). A plain index (only
    ``weight_map`` and ``metadata`` at the top, flat; strings without escapes, integers of at most
    18 digits, no floats, no key twice) is parsed in C where built (`weightio._native`), anything
    else by `parse_json_object`, which says what is wrong; either way `check_index` checks it."""
    index = _c_index(raw) if _c_index is not None else None
    if index is None:
        index = parse_json_object(raw, path=where, what="index")
    return check_index(index, where)


def check_index(index: dict[str, Any], index_path: str) -> tuple[dict[str, str], dict[str, Any]]:
    """`read_index`'s checks of a parsed index (from a file or a URL); the same errors."""
    weight_map, metadata = index.get("weight_map"), index.get("metadata") or {}
    if not isinstance(weight_map, dict) or not set(map(type, weight_map.values())) <= {str}:  # (parsed: exact types)
        raise CorruptFileError("weight_map must be an object mapping tensor names to file names", path=index_path)
    if not isinstance(metadata, dict):
        raise CorruptFileError("metadata must be an object", path=index_path)
    names = set(weight_map.values())
    if not _all_plain(names):  # (a few scans of all the names at once: 191 one by one were ~0.2 ms)
        for shard in names:
            if not plain_name(shard) and outside(shard):
                raise CorruptFileError(f"shard name {shard!r} points outside the model directory", path=index_path)
    return weight_map, metadata


def _all_plain(names: set[str]) -> bool:
    """`plain_name` of every name of `names`, told in four scans of them all joined (by a NUL, which
    is none of the characters looked for)."""
    joined = "\0".join(names)
    return "" not in names and ".." not in names and not any(c in joined for c in "/\\:%")


def plain_name(shard: str) -> bool:
    """A name `outside` passes on every system, told without it: non-empty, not "..", and with no
    separator, drive or escape (``/``, ``\\``, ``:``, ``%``)."""
    return bool(shard) and shard != ".." and not any(c in shard for c in "/\\:%")


def outside(shard: str, paths: Any = os.path) -> bool:
    """Whether joining shard name `shard` to a directory (with `paths`: this system's `os.path`)
    could name a file outside it: empty, absolute or starting with a separator (``\\x`` on a
    Windows drive's root, which Python 3.13 no longer calls absolute), with a ``..`` component, or
    with a drive (Windows: ``C:x`` joined to ``D:\\m`` is ``C:x``, another drive's current
    directory); so too when its percent escapes are decoded (a URL's ``%2e%2e/x`` is ``../x`` to
    the server, or to the library that normalises it)."""
    def leaves(name: str) -> bool:
        return (not name or paths.isabs(name) or name.startswith(paths.sep)
                or (paths.altsep is not None and name.startswith(paths.altsep))
                or bool(paths.splitdrive(name)[0]) or ".." in name.replace("\\", "/").split("/"))

    return leaves(shard) or ("%" in shard and leaves(unquote(shard)))


def shards(weight_map: dict[str, str]) -> list[str]:
    """The shard files of a ``weight_map``, each once, in first-use order."""
    return list(dict.fromkeys(weight_map.values()))
