"""The files of a model directory besides its weights, which `weightio convert` copies beside its output.

A model directory is more than its weights: ``config.json``, the tokenizer (``tokenizer.json``,
``vocab.txt``, ``tokenizer.model``, ``special_tokens_map.json`` …), ``generation_config.json``,
a README, sentence-transformers' ``1_Pooling/config.json``. ``from_pretrained`` needs them, so a
conversion from a directory (or an ``hf://`` repo or folder) into a directory copies them. The rules:

* **Weights are never copied.** A file whose name has a weight suffix of any framework
  (`weightio.layout.WEIGHT_SUFFIXES`: ``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.ckpt``,
  ``.gguf``, ``.h5``, ``.msgpack``, ``.onnx``, ``.ot``) or is the index of such files
  (``*.safetensors.index.json`` …) is left out: the checkpoint's own files because the converted
  ones replace them (the index is written anew for a sharded output, never copied stale), and the
  same model's weights in other formats (``pytorch_model.bin`` beside ``model.safetensors``,
  ``tf_model.h5``, ``onnx/model.onnx``) because they would be copies of the old weights next to
  the new ones, often the bulk of the directory. They are listed as skipped, never dropped silently.
* **Sub-directories** are copied with the same rules; hidden entries (``.git``, ``.cache``,
  ``.gitattributes``, weightio's temporaries) are not, nor the destination itself when it lies
  inside the source.
* **Symbolic links are followed**: the file's content is copied (the Hugging Face cache is made
  of links into its blob store). A linked directory is entered once (links that loop are not
  followed twice). A link to nothing, and anything that is not a regular file (a FIFO, a
  device), is skipped and listed.
* The destination rules are convert's: an existing file is refused unless ``overwrite``; copies
  are staged, fsynced and renamed into place with the weights, before the index (the commit point).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import layout
from ._io import atomic_write, write_all
from ._staging import Staging
from .errors import InputError, WeightioError
from .layout import is_weights

__all__ = ["ModelFiles", "scan", "of_source", "stage_copies"]


@dataclass
class ModelFiles:
    """What a model directory holds besides the weights being converted.

    Attributes:
        root: the local directory the relative paths are under.
        files: files to copy, as ``/``-separated paths relative to `root`, sorted.
        skipped: ``relative path -> why`` for entries not copied (other weight files, links to
            nothing, special files).
    """

    root: str
    files: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def scan(root: str, *, exclude: Sequence[str] = (), avoid: str | None = None) -> ModelFiles:
    """The files of local directory `root` to copy beside a conversion of it.

    Args:
        root: the model directory.
        exclude: files never listed, not even as skipped (the checkpoint's own files).
        avoid: a directory not to enter (the destination, when it lies inside `root`).
    """
    found = ModelFiles(root)
    excluded = {os.path.realpath(p) for p in exclude}
    seen = {os.path.realpath(root)}
    avoided = os.path.realpath(avoid) if avoid is not None else None
    _walk(root, "", found, excluded, seen, avoided)
    found.files.sort()
    return found


def _walk(directory: str, prefix: str, found: ModelFiles, excluded: set[str], seen: set[str],
          avoided: str | None) -> None:
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        found.skipped[prefix or "."] = f"cannot be listed ({e.strerror})"
        return
    for name in names:
        if name.startswith("."):
            continue
        path, rel = os.path.join(directory, name), prefix + name
        real = os.path.realpath(path)
        if real in excluded:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            found.skipped[rel] = "a link to nothing" if os.path.islink(path) else "cannot be read"
            continue
        if stat.S_ISDIR(mode):
            if real not in seen and real != avoided:
                seen.add(real)
                _walk(path, rel + "/", found, excluded, seen, avoided)
        elif not stat.S_ISREG(mode):
            found.skipped[rel] = "not a regular file"
        elif is_weights(name):
            found.skipped[rel] = "weights"
        else:
            found.files.append(rel)


def of_source(src: str, checkpoint_files: list[str], out_dir: str) -> ModelFiles | None:
    """The files to copy beside a conversion of `src` written into directory `out_dir`.

    Returns:
        None when `src` is not a directory (a file, an ``hf://`` path naming a file), or when
        `out_dir` is `src` itself (its files are already there).
    """
    if src.startswith("hf://"):
        from .hub import model_files  # imports huggingface_hub: only for hf:// paths

        found = model_files(src)
        if found is None:
            return None
        root, files, weights = found
        return ModelFiles(root, sorted(files), {w: "weights" for w in sorted(weights)})
    if not os.path.isdir(src) or (os.path.isdir(out_dir) and os.path.samefile(src, out_dir)):
        return None
    return scan(src, exclude=[*checkpoint_files, *_index_of(src)], avoid=out_dir)


def _index_of(directory: str) -> list[str]:
    """The index a directory's checkpoint was opened by, if it was (convert writes its own)."""
    try:
        chosen = layout.choose(f for f in os.listdir(directory) if os.path.isfile(os.path.join(directory, f)))
    except (OSError, layout.Ambiguous):
        return []
    return [os.path.join(directory, chosen)] if chosen is not None and chosen.endswith(".index.json") else []


def stage_copies(staging: Staging, copies: list[tuple[str, str]]) -> None:
    """Copy each ``(source, destination)`` to a staged temporary of its destination (sub-folders
    created, and removed again if the conversion fails), fsynced and held for `Staging.commit`."""
    for source, final in copies:
        staging.make_dirs(os.path.dirname(os.path.abspath(final)))
        staged = staging.path_for(final)
        try:
            with open(source, "rb") as src, atomic_write(staged) as out:
                while chunk := src.read(1 << 20):
                    write_all(out, chunk)
        except OSError as e:
            if isinstance(e, WeightioError):
                raise
            raise InputError(f"cannot be copied: {e.strerror}", path=source, errno=e.errno) from None
        staging.hold(staged)
