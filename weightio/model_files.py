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
* **Symbolic links are followed inside the model directory**: the file's content is copied. A
  link whose target lies outside the directory is skipped and listed, never followed: a cloned
  repository may hold ``tokenizer.json -> /home/you/.ssh/id_rsa`` or ``data -> /``, which would
  copy a private file into an output meant for sharing, or walk the whole file system. One
  outside place is allowed: a Hugging Face cache snapshot (``…/snapshots/<commit>``) is made of
  links into its repository's blob store (``…/blobs``). A linked directory is entered once
  (links that loop are not followed twice). A link to nothing, and anything that is not a
  regular file (a FIFO, a device), is skipped and listed; a file that became one after the scan
  is refused when copied, never opened in a way that could block.
* **A folder at a URL** (``https://``, ``s3://`` …, read through fsspec): its files are listed
  (sub-folders included, hidden ones not) and the non-weight ones fetched into a temporary
  directory, copied from there as from a local one and removed after the conversion.
* The destination rules are convert's: an existing file is refused unless ``overwrite``; copies
  are staged, fsynced and renamed into place with the weights, before the index (the commit point).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from . import layout
from ._failures import describe_failure, is_url, redact
from ._outputs import atomic_write, write_all
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
        cleanup: removes what was fetched to make `root` (a remote folder's files); call it when done.
    """

    root: str
    files: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    cleanup: Callable[[], None] = lambda: None


def scan(root: str, *, exclude: Sequence[str] = (), avoid: str | None = None) -> ModelFiles:
    """The files of local directory `root` to copy beside a conversion of it.

    Args:
        root: the model directory.
        exclude: files never listed, not even as skipped (the checkpoint's own files).
        avoid: a directory not to enter (the destination, when it lies inside `root`).
    """
    found = ModelFiles(root)
    excluded = {os.path.realpath(p) for p in exclude}
    real_root = os.path.realpath(root)
    seen = {real_root}
    avoided = os.path.realpath(avoid) if avoid is not None else None
    _walk(root, "", found, excluded, seen, avoided, _link_roots(real_root))
    found.files.sort()
    return found


def _link_roots(real_root: str) -> tuple[str, ...]:
    """Where the entries of model directory `real_root` may lead: inside it, and for a Hugging
    Face cache snapshot (``<repo>/snapshots/<commit>``) into that repository's ``blobs``."""
    parent = os.path.dirname(real_root)
    if os.path.basename(parent) == "snapshots":
        return real_root, os.path.join(os.path.dirname(parent), "blobs")
    return (real_root,)


def _inside(real: str, roots: tuple[str, ...]) -> bool:
    return any(os.path.commonpath([real, r]) == r for r in roots)


def _walk(directory: str, prefix: str, found: ModelFiles, excluded: set[str], seen: set[str],
          avoided: str | None, roots: tuple[str, ...]) -> None:
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        found.skipped[prefix or "."] = f"cannot be listed ({e.strerror})"
        return
    for name in names:
        if name.startswith("."):
            continue
        path, rel = os.path.join(directory, name), prefix + name
        try:
            real = os.path.realpath(path)
            mode = os.stat(path).st_mode
        except OSError:
            found.skipped[rel] = "a link to nothing" if os.path.islink(path) else "cannot be read"
            continue
        if real in excluded:
            continue
        if not _inside(real, roots):  # only a link leads out (a directory outside is never entered)
            found.skipped[rel] = "a link out of the model directory (not followed)"
            continue
        if stat.S_ISDIR(mode):
            if real not in seen and real != avoided:
                seen.add(real)
                _walk(path, rel + "/", found, excluded, seen, avoided, roots)
        elif not stat.S_ISREG(mode):
            found.skipped[rel] = "not a regular file"
        elif is_weights(name):
            found.skipped[rel] = "weights"
        else:
            found.files.append(rel)


def of_source(src: str, checkpoint_files: list[str], out_dir: str,
              storage_options: Mapping[str, Any] | None = None) -> ModelFiles | None:
    """The files to copy beside a conversion of `src` written into directory `out_dir`.

    Args:
        storage_options: for a URL `src` that is not ``hf://``: its fsspec filesystem's options.

    Returns:
        None when `src` is not a directory (a file, a URL naming a file), or when `out_dir` is
        `src` itself (its files are already there).
    """
    if src.startswith("hf://"):
        from .hub import model_files  # imports huggingface_hub: only for hf:// paths

        found = model_files(src)
        if found is None:
            return None
        root, files, weights = found
        return ModelFiles(root, sorted(files), {w: "weights" for w in sorted(weights)})
    if is_url(src):
        return _remote_folder(src, checkpoint_files, storage_options)
    if not os.path.isdir(src) or (os.path.isdir(out_dir) and os.path.samefile(src, out_dir)):
        return None
    return scan(src, exclude=[*checkpoint_files, *_index_of(src)], avoid=out_dir)


def _remote_folder(url: str, checkpoint_files: list[str], storage_options: Mapping[str, Any] | None
                   ) -> ModelFiles | None:
    """A folder at a URL: its non-weight files fetched into a temporary directory (see the module docstring)."""
    from .remote import filesystem, is_folder

    fs, root = filesystem(url, storage_options=storage_options)
    prefix = root.rstrip("/") + "/"
    if not is_folder(fs, root, url):
        return None
    try:
        found = sorted(n[len(prefix):] for n in fs.find(root) if n.startswith(prefix))
    except Exception as e:  # noqa: BLE001 - every transport's errors are sorted by describe_failure
        raise describe_failure(e).error(redact(url)) from None
    own = {posixpath.basename(f) for f in checkpoint_files}  # the checkpoint's files: at the top, with its index
    try:
        own.add(layout.choose(f for f in found if "/" not in f) or "")
    except layout.Ambiguous:
        pass
    listed = [f for f in found if f not in own and not any(p.startswith(".") for p in f.split("/"))]
    result = ModelFiles(tempfile.mkdtemp(prefix="weightio-model-files-"))
    result.cleanup = lambda: shutil.rmtree(result.root, ignore_errors=True)
    result.skipped = {f: "weights" for f in listed if is_weights(posixpath.basename(f))}
    try:
        for rel in (f for f in listed if f not in result.skipped):
            _fetch(fs, prefix + rel, os.path.join(result.root, *rel.split("/")), f"{url.rstrip('/')}/{rel}")
            result.files.append(rel)
    except BaseException:
        result.cleanup()
        raise
    return result


def _fetch(fs: Any, path: str, local: str, url: str) -> None:
    os.makedirs(os.path.dirname(local), exist_ok=True)
    try:
        fs.get_file(path, local)
    except Exception as e:  # noqa: BLE001
        raise describe_failure(e).error(redact(url)) from None


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
            with _open_regular(source) as src, atomic_write(staged) as out:
                while chunk := src.read(1 << 20):
                    write_all(out, chunk)
        except OSError as e:
            if isinstance(e, WeightioError):
                raise
            raise InputError(f"cannot be copied: {e.strerror}", path=source, errno=e.errno) from None
        staging.hold(staged)


def _open_regular(source: str) -> BinaryIO:
    """`source` opened for reading, refused unless it is a regular file now (it may have been
    replaced since the scan): opened without blocking, so a FIFO or a device never hangs the copy."""
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError("cannot be copied: it is no longer a regular file", path=source)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
