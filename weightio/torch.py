"""PyTorch integration: fill an ``nn.Module`` from any checkpoint weightio reads, without ``torch.load``.

Imported on first use as ``weightio.torch`` (it imports torch; ``import weightio`` does not).

    >>> import weightio as wio
    >>> missing, unexpected = wio.torch.load_into(model, "fixtures/tiny-bert")   # doctest: +SKIP

Every name of ``module.state_dict()`` is fetched through a `VarBuilder` (so renames, legacy
names, ``module.``/``_orig_mod.`` wrappers and the base-model prefix all apply), shape-checked,
and copied into the module's own tensor (``copy_`` converts dtype and device). Tied parameters
(one tensor under several names, as transformers ties embeddings and decoders) need only one of
their names in the checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from .checkpoint import Checkpoint
from .errors import ShapeMismatchError, TensorNotFoundError, UsageError, WeightioError
from .varbuilder import RenameSpec, VarBuilder, _listing

__all__ = ["IncompatibleKeys", "load_into"]


class IncompatibleKeys(NamedTuple):
    """What ``nn.Module.load_state_dict`` returns: names the module has that the checkpoint lacked,
    and stored names the load did not use."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def load_into(
    module: torch.nn.Module,
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, Any] | VarBuilder,
    *,
    strict: bool = True,
    base_model_prefix: str | None = None,
    renames: RenameSpec | None = None,
    assign: bool = False,
    device: str = "torch",
) -> IncompatibleKeys:
    """Load `source` into `module`'s parameters and persistent buffers.

    Args:
        module: any ``torch.nn.Module``.
        source: a path `VarBuilder.from_path` accepts, an open `Checkpoint` or dict of tensors,
            or a `VarBuilder` (a cursor: ``vb.pp("encoder")`` loads a sub-module from its part of
            the checkpoint).
        strict: raise when a module tensor is missing from the checkpoint, or a stored tensor
            (under the cursor's part of the checkpoint) is not used.
        base_model_prefix: the prefix model and checkpoint may disagree by; defaults to the
            module's own ``base_model_prefix`` attribute (transformers models have one), else inferred.
        renames: a rename applied before the automatic rules (see `VarBuilder.rename`).
        assign: replace the module's tensors by the loaded ones instead of copying into them
            (for modules built on the ``meta`` device). Loaded tensors whose dtype and device
            already match are zero-copy: private copy-on-write pages of the file, so training
            them changes neither the file nor a later open (see `weightio.devices`).
        device: where tensors are read to before the copy (``"torch"``: zero-copy CPU views); for
            `assign`, the device of tensors that replace ``meta`` ones.

    Returns:
        ``IncompatibleKeys(missing_keys, unexpected_keys)``, like ``load_state_dict``.

    Raises:
        ShapeMismatchError: a stored shape differs from the module's (every mismatch listed;
            raised whatever `strict`, as ``load_state_dict`` does).
        TensorNotFoundError: with `strict`, module tensors missing from the checkpoint.
        WeightioError: with `strict`, stored tensors left unused.
    """
    vb, owned = _builder(source, module, base_model_prefix, renames, device)
    try:
        targets = module.state_dict(keep_vars=True)
        loaded, missing, refused = _fetch(vb, targets, assign)
        report = vb.report()  # once: it walks every name used and stored
        mismatched = [m for m in report.mismatched if m[0] in refused]
        if mismatched:
            raise _mismatch_error(module, mismatched, vb)
        _store(module, targets, loaded, assign)
        unexpected = list(report.unused)
    finally:
        if owned:
            vb.close()
    if strict and (missing or unexpected):
        raise _strict_error(module, missing, unexpected, vb)
    return IncompatibleKeys(missing, unexpected)


def _builder(source: Any, module: torch.nn.Module, prefix: str | None, renames: RenameSpec | None,
             device: str) -> tuple[VarBuilder, bool]:
    """A VarBuilder over `source` reading torch tensors, and whether this call owns its files."""
    hint = prefix if prefix is not None else getattr(module, "base_model_prefix", None)
    hint = hint if isinstance(hint, str) and hint else None
    if isinstance(source, VarBuilder):
        vb = source if source.device.framework == "torch" else source.to_device(device)
        vb._shared.resolver.hint(hint)
        return (vb if renames is None else vb.rename(renames)), False
    if isinstance(source, Mapping):
        build = VarBuilder.from_checkpoint if isinstance(source, Checkpoint) else VarBuilder.from_dict
        return build(source, None, device, base_model_prefix=hint, renames=renames), False
    return VarBuilder.from_path(source, None, device, base_model_prefix=hint, renames=renames), True


def _fetch(vb: VarBuilder, targets: dict[str, Any], assign: bool) -> tuple[dict, list[str], set[str]]:
    """Resolve every state_dict name: loaded {name: tensor}, missing names, and the stored names
    refused for their shape (the load report says module and stored shapes)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in targets.items():  # tied parameters: one object under several names
        groups.setdefault(id(tensor), []).append(name)
    loaded: dict[str, Any] = {}
    missing: list[str] = []
    refused: set[str] = set()
    for names in groups.values():
        target = targets[names[0]]
        found = [n for n in names if vb.contains(n)] or names[:1]  # a failed get records the miss
        for name in found:
            try:
                value = vb.get(tuple(target.shape), name, dtype=target.dtype if assign else None)
            except TensorNotFoundError:
                missing.extend(names)
                break
            except ShapeMismatchError as e:
                refused.add(e.tensor)
                continue
            if assign and not target.is_meta:
                value = value.to(target.device)
            for tied in names:
                loaded.setdefault(tied, value)
    return loaded, missing, refused


def _store(module: torch.nn.Module, targets: dict[str, Any], loaded: dict[str, Any], assign: bool) -> None:
    if assign:
        module.load_state_dict(loaded, strict=False, assign=True)
        return
    with torch.no_grad():
        for name, value in loaded.items():
            target = targets[name]
            if target.is_meta:
                raise UsageError(f"module tensor {name!r} is on the meta device; pass assign=True")
            target.copy_(value)


def _mismatch_error(module: torch.nn.Module, mismatched: list, vb: VarBuilder) -> ShapeMismatchError:
    first = mismatched[0][0]
    details = "; ".join(f"{n}: module {e}, stored {f}" for n, e, f in mismatched[:10])
    return ShapeMismatchError(f"size mismatch loading {type(module).__name__}: {details}",
                              path=vb._shared.store.path, tensor=first)


def _strict_error(module: torch.nn.Module, missing: list[str], unexpected: list[str], vb: VarBuilder) -> WeightioError:
    store = vb._shared.store
    kind = type(module).__name__
    parts = ([f"missing: {_listing(missing)}"] if missing else []) + (
        [f"unexpected (stored, never used): {_listing(unexpected)}"] if unexpected else [])
    message = f"loading {kind}: " + "; ".join(parts) + "; pass strict=False to allow this"
    if missing:
        return TensorNotFoundError(missing[0], store.names, path=store.path, message=message)
    return WeightioError(message, path=store.path)
