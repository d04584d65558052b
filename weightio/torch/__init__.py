"""PyTorch integration: fill an ``nn.Module`` from any checkpoint weightio reads, without ``torch.load``.

Imported on first use as ``weightio.torch`` (it imports torch; ``import weightio`` does not).

    >>> import weightio as wio
    >>> missing, unexpected = wio.torch.load_into(model, "fixtures/tiny-bert")   # doctest: +SKIP

Every name of ``module.state_dict()`` is fetched through a `VarBuilder` (so renames, legacy
names, ``module.``/``_orig_mod.`` wrappers and the base-model prefix all apply), shape-checked,
and copied into the module's own tensor (``copy_`` converts dtype and device), or, with
``assign=True`` (a model built on ``meta``), put in its place. What ``from_pretrained`` does
around the values is done too (`weightio.torch.keys`): ties kept and restored, non-persistent and
stale buffers ignored, the model's part of a training checkpoint found, sizes that differ skipped
on request; `weightio.torch.placement` places parts of the model on devices.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..checkpoint import Checkpoint
from ..devices import is_floating
from ..dtypes import by_numpy, parse_dtype
from ..errors import ShapeMismatchError, TensorNotFoundError, UsageError, WeightioError
from ..varbuilder import RenameSpec, VarBuilder, _listing
from .keys import ModuleKeys, find_sub_mapping, module_keys, named_tensors, split_prefix
from .placement import DISK, device_of, empty_weights, normalize_map, plan_device_map, within
from .result import IncompatibleKeys, LoadResult

__all__ = ["IncompatibleKeys", "LoadResult", "empty_weights", "load_into", "plan_device_map"]


def load_into(
    module: torch.nn.Module,
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, Any] | VarBuilder,
    *,
    strict: bool = True,
    base_model_prefix: str | None = None,
    renames: RenameSpec | None = None,
    assign: bool = False,
    device: str = "torch",
    dtype: Any = None,
    ignore_mismatched_sizes: bool = False,
    device_map: str | Mapping[str, Any] | None = None,
    max_memory: Mapping[Any, Any] | None = None,
    report: bool = False,
) -> LoadResult:
    """Load `source` into `module`'s parameters and persistent buffers.

    Args:
        module: any ``torch.nn.Module``; built on ``meta`` (`empty_weights`, accelerate's
            ``init_empty_weights``, ``torch.device("meta")``) with `assign`.
        source: a path `VarBuilder.from_path` accepts, an open `Checkpoint` or dict of tensors,
            or a `VarBuilder` (a cursor: ``vb.pp("encoder")`` loads a sub-module from its part of
            the checkpoint). At the root, a training checkpoint's part holding the module
            (``state_dict``, ``model_state_dict``, ``ema``…, wrappers' ``module.``/``model.``) is found.
        strict: raise when a module tensor is missing from the checkpoint, or a stored tensor
            (under the part of the checkpoint used) is not used and not ignorable.
        base_model_prefix: the prefix model and checkpoint may disagree by; defaults to the
            module's own ``base_model_prefix`` attribute (transformers models have one), else inferred.
        renames: a rename applied before the automatic rules (see `VarBuilder.rename`).
        assign: replace the module's tensors by the loaded ones instead of copying into them.
            Loaded tensors whose dtype and device already match are zero-copy: private
            copy-on-write pages of the file (see `weightio.devices`).
        device: where tensors are read to before the copy (``"torch"``: zero-copy CPU views); for
            `assign`, the device of tensors that replace ``meta`` ones.
        dtype: None: the module's dtypes; ``"auto"``: each tensor's stored dtype (transformers'
            ``dtype="auto"``); a dtype (``torch.bfloat16``, ``"bf16"``): floating-point tensors in it.
        ignore_mismatched_sizes: skip stored tensors whose shape differs from the module's (a new
            head) and report them in ``mismatched_keys`` instead of raising.
        device_map: ``"auto"`` or ``{module prefix: device}`` (`weightio.torch.placement`;
            ``"disk"``: a zero-copy view of the file); implies `assign`.
        max_memory: per-device budgets for ``device_map="auto"`` (``{"cpu": "2GiB", "disk": None}``).
        report: print the load report (``str(result)``), the table ``from_pretrained`` prints.

    Returns:
        a `LoadResult`: ``(missing_keys, unexpected_keys)`` like ``load_state_dict``, with
        ``mismatched_keys``, ``tied_keys``, ``ignored_keys``, ``sub_mapping`` and more.

    Raises:
        ShapeMismatchError: a stored shape differs from the module's (every mismatch listed),
            without `ignore_mismatched_sizes`, whatever `strict`; nothing is loaded then.
        TensorNotFoundError: with `strict`, module tensors missing from the checkpoint.
        WeightioError: with `strict`, stored tensors left unused.
        UsageError: a tensor is still on ``meta`` after the load (each named), or a bad device map.
    """
    if device_map is not None:
        assign = True
    vb, owned, searched = _builder(source, module, base_model_prefix, renames, device)
    try:
        keys = module_keys(module)
        prefix, _ = find_sub_mapping(vb, list(keys.targets), search=searched)
        cursor = vb.pp(prefix) if prefix else vb
        load = _Load(module, keys, cursor, assign, dtype, ignore_mismatched_sizes)
        load.resolve()
        if load.refused and not ignore_mismatched_sizes:
            raise _mismatch_error(module, load.refused, cursor)
        plan = load.plan(device_map, max_memory) if device_map is not None else None
        load.read(plan)
        load.store()
        result = load.result(prefix, plan, vb._shared.store.path)
        if report:
            print(result.table())
        if strict and (result.missing_keys or result.unexpected_keys):
            raise _strict_error(module, result, cursor, keys)
    finally:
        if owned:
            vb.close()
    _check_no_meta(module, keys)
    return result


def _builder(source: Any, module: torch.nn.Module, prefix: str | None, renames: RenameSpec | None,
             device: str) -> tuple[VarBuilder, bool, bool]:
    """A VarBuilder over `source` reading torch tensors, whether this call owns its files, and
    whether to look for the module's part of a training checkpoint (not under a user's cursor)."""
    hint = prefix if prefix is not None else getattr(module, "base_model_prefix", None)
    hint = hint if isinstance(hint, str) and hint else None
    if isinstance(source, VarBuilder):
        vb = source if source.device.framework == "torch" else source.to_device(device)
        vb._shared.resolver.hint(hint)
        return (vb if renames is None else vb.rename(renames)), False, not vb.prefix
    if isinstance(source, Mapping):
        build = VarBuilder.from_checkpoint if isinstance(source, Checkpoint) else VarBuilder.from_dict
        return build(source, None, device, base_model_prefix=hint, renames=renames), False, True
    return VarBuilder.from_path(source, None, device, base_model_prefix=hint, renames=renames), True, True


class _Load:
    """One load's state: resolve names (no data read), plan devices, read, store."""

    def __init__(self, module: torch.nn.Module, keys: ModuleKeys, vb: VarBuilder, assign: bool, dtype: Any,
                 ignore_mismatched: bool) -> None:
        self.module, self.keys, self.vb, self.assign = module, keys, vb, assign
        auto = isinstance(dtype, str) and dtype == "auto"
        self.dtype = None if dtype is None else "auto" if auto else _torch_dtype(dtype)
        self.ignore_mismatched = ignore_mismatched
        self.found: dict[str, tuple[str, str, tuple[int, ...], Any]] = {}  # canonical -> (name, stored, shape, dtype)
        self.extra: set[str] = set()  # stored names of ties' other names: used, not unexpected
        self.missing: list[str] = []
        self.refused: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []  # (name, module shape, stored shape)
        self.refused_stored: set[str] = set()
        self.loaded: dict[str, Any] = {}  # canonical -> tensor

    def resolve(self) -> None:
        targets = self.keys.targets
        for group in self.keys.groups:
            hits = [(n, where) for n in group for where in (self.vb.locate(n),) if where is not None]
            shape = tuple(targets[group[0]].shape)
            fitting = [(n, w) for n, w in hits if w[1] == shape]
            for _, (stored, _, _) in hits:
                self.extra.add(stored)
            if fitting:
                name, (stored, found_shape, stored_dtype) = fitting[0]
                self.found[group[0]] = (name, stored, found_shape, stored_dtype)
            elif hits:
                name, (stored, found_shape, _) = hits[0]
                self.refused.append((name, shape, found_shape))
                self.refused_stored.update(w[0] for _, w in hits)
            else:
                self.missing.extend(n for n in group if not self.keys.missing_ignored(n))

    def wanted(self, canonical: str, stored_dtype: Any) -> Any:
        """The torch dtype the tensor is read as (None: as stored, `copy_` converts)."""
        target = self.keys.targets[canonical]
        if self.dtype == "auto":
            return None
        if self.dtype is not None and target.is_floating_point() and is_floating(stored_dtype):
            return self.dtype
        return target.dtype if self.assign else None

    def plan(self, device_map: str | Mapping[str, Any], max_memory: Mapping[Any, Any] | None) -> dict[str, str]:
        if not isinstance(device_map, str):
            return normalize_map(device_map, self.keys.groups)
        if device_map != "auto":
            raise UsageError(f"device_map is \"auto\" or a dict of module prefix -> device, got {device_map!r}")
        sizes = {}
        for group in self.keys.groups:
            target = self.keys.targets[group[0]]
            hit = self.found.get(group[0])
            itemsize = target.element_size()
            if hit is not None and self.wanted(group[0], hit[3]) is None:
                itemsize = hit[3].itemsize
            sizes[group[0]] = target.numel() * itemsize
        plan = plan_device_map(self.module, max_memory, sizes=sizes)
        return _with_ties(plan, self.keys)

    def read(self, plan: dict[str, str] | None) -> None:
        cursors: dict[str, VarBuilder] = {}
        bulk: dict[int, tuple[VarBuilder, list[tuple[str, tuple[int, ...], str, Any, str | None]]]] = {}
        groups = {group[0]: group for group in self.keys.groups}
        for canonical, (name, _stored, shape, stored_dtype) in self.found.items():
            wanted = self.wanted(canonical, stored_dtype)
            where = None if plan is None else _placed(plan, groups[canonical])
            vb = self.vb
            if where in ("cpu", DISK):  # views on the CPU first, whatever the builder's device
                if vb.device.target not in (None, "cpu"):
                    vb = cursors.setdefault("cpu", self.vb.to_device("torch"))
            elif where is not None:
                vb = cursors.setdefault(where, self.vb.to_device(f"torch:{where}"))
            if vb.device.target not in (None, "cpu"):  # a GPU: one bulk transfer per device, below
                bulk.setdefault(id(vb), (vb, []))[1].append((canonical, shape, name, wanted, where))
                continue
            self._keep(canonical, vb.get(shape, name, dtype=wanted), stored_dtype, where)
        for vb, items in bulk.values():
            values = vb._get_many([(shape, name, wanted) for _, shape, name, wanted, _ in items])
            for (canonical, _, _, _, where), value in zip(items, values, strict=True):
                self._keep(canonical, value, self.found[canonical][3], where)

    def _keep(self, canonical: str, value: Any, stored_dtype: Any, where: str | None) -> None:
        target = self.keys.targets[canonical]
        if where == "cpu" and _shares_file(value, stored_dtype):
            value = value.clone()  # owned memory, as the budget counted it
        elif where is None and self.assign and not target.is_meta and value.device != target.device:
            value = value.to(target.device)
        self.loaded[canonical] = value

    def store(self) -> None:
        owners = {}
        for name, sub in self.module.named_modules(remove_duplicate=False):
            owners[name] = sub
        for group in self.keys.groups:
            value = self.loaded.get(group[0])
            current = self.keys.targets[group[0]]
            if value is None:
                tensor = current
            elif self.assign:
                tensor = _as_kind(value, current)
            else:
                tensor = self._copied(group[0], current, value)
            for name in group:
                owner, _, leaf = name.rpartition(".")
                sub = owners[owner]
                table = sub._parameters if leaf in sub._parameters else sub._buffers
                if table[leaf] is not tensor:
                    table[leaf] = tensor

    def _copied(self, name: str, target: Any, value: Any) -> Any:
        if target.is_meta:
            raise UsageError(f"module tensor {name!r} is on the meta device; pass assign=True")
        with torch.no_grad():
            converts = self.dtype == "auto" or value.dtype == self.dtype
            if self.dtype is not None and value.dtype != target.dtype and converts:
                target.data = torch.empty_like(target, dtype=value.dtype)
            target.copy_(value)
        return target

    def result(self, prefix: str, plan: dict[str, str] | None, source: str) -> LoadResult:
        report = self.vb.report()
        head = prefix + "." if prefix else ""
        used = set(report.used) | self.extra | self.refused_stored
        ignored: dict[str, str] = {}
        transient = {t: self.vb.locate(t) for t in self.keys.transient}
        transient_stored = {w[0] for w in transient.values() if w is not None}
        sub_mapping, wrapper = split_prefix(prefix)
        if not wrapper and report.used:
            wrapper = _root_wrapper(report)
        head += wrapper if wrapper == "module." and not prefix else ""
        unexpected = []
        for stored in report.unused:
            if stored in used:
                continue
            relative = stored[len(head):] if stored.startswith(head) else stored
            why = "non-persistent buffer" if stored in transient_stored else self.keys.why_ignored(stored, relative)
            if why is None:
                unexpected.append(relative)
            else:
                ignored[relative] = why
        ignored.update({n: "_keys_to_ignore_on_load_missing" for g in self.keys.groups for n in g
                        if g[0] not in self.found and self.keys.missing_ignored(n)})
        mismatched = [(n, stored, shape) for n, shape, stored in self.refused]
        tied = {n: self.keys.tied[n] for g in self.keys.groups if g[0] in self.found for n in g[1:]}
        return LoadResult(self.missing, unexpected, mismatched_keys=mismatched, tied_keys=tied, ignored_keys=ignored,
                          sub_mapping=sub_mapping, wrapper_prefix=wrapper, base_model_prefix=report.base_model_prefix,
                          device_map=plan, source=source, module=type(self.module).__name__)


def _with_ties(plan: dict[str, str], keys: ModuleKeys) -> dict[str, str]:
    """`plan` with parts that hold only tied names (``lm_head``) on their tensor's device."""
    groups = {group[0]: group for group in keys.groups}
    for name, canonical in keys.tied.items():
        covering = max((p for p in plan if within(name, p)), key=len, default=None)
        if covering is None:
            continue
        device = _placed(plan, [n for n in groups.get(canonical, [canonical]) if not within(n, covering)])
        if device is None or plan[covering] == device:
            continue
        if all(n in keys.tied for n in keys.targets if within(n, covering)):
            plan[covering] = device
    return plan


def _placed(plan: Mapping[str, str], names: list[str]) -> str | None:
    """The device of one tensor known by `names` (its tie group, canonical first): the first name's the plan
    places. Not always the canonical's: a child module registered twice (``self.b = self.c``) is named in a
    plan by its first path only, as ``named_children`` lists it, while the tie may name the other."""
    return next((d for n in names for d in [device_of(plan, n)] if d is not None), None)


def _torch_dtype(dtype: Any) -> Any:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = by_numpy(parse_dtype(dtype)).torch
    if name is None:
        raise UsageError(f"torch has no dtype {dtype!r}")
    return getattr(torch, name)


def _shares_file(value: Any, stored_dtype: Any) -> bool:
    """Whether `value` may be a view of the checkpoint (a CPU tensor of the stored dtype: no cast copied it)."""
    return value.device.type == "cpu" and str(value.dtype).removeprefix("torch.") == by_numpy(stored_dtype).torch


def _as_kind(value: Any, current: Any) -> Any:
    """`value` as the kind of tensor it replaces: a Parameter (keeping ``requires_grad``) or a buffer."""
    if isinstance(current, torch.nn.Parameter):
        return torch.nn.Parameter(value, requires_grad=current.requires_grad)
    return value


def _root_wrapper(report: Any) -> str:
    """A wrapper prefix the resolver removed at the root (``module.``, ``_orig_mod.``), or ""."""
    for asked, stored in report.renamed.items():
        if stored.startswith("module.") and not asked.startswith("module."):
            return "module."
        if "_orig_mod." in stored and "_orig_mod." not in asked:
            return "_orig_mod."
    return ""


def _check_no_meta(module: torch.nn.Module, keys: ModuleKeys) -> None:
    modules = list(module.named_modules(remove_duplicate=False))  # one walk for parameters and buffers
    left = [n for table in ("_parameters", "_buffers") for n, t in named_tensors(modules, table) if t.is_meta]
    if not left:
        return
    transient = [n for n in left if n in set(keys.transient)]
    other = [n for n in left if n not in set(transient)]
    parts = [f"{len(left)} tensor(s) of {type(module).__name__} are still on the meta device after the load"]
    if transient:
        parts.append(f"non-persistent buffers, which no checkpoint holds: {_listing(transient)}; build the model "
                     "under weightio.torch.empty_weights() (parameters on meta, buffers real) instead of "
                     "torch.device('meta')")
    if other:
        parts.append(f"not loaded (missing or skipped for their size): {_listing(other)}; give them values "
                     "(module.to_empty(device=...) then initialise them) or load a checkpoint that has them")
    raise UsageError("; ".join(parts))


def _mismatch_error(module: torch.nn.Module, mismatched: list, vb: VarBuilder) -> ShapeMismatchError:
    first = mismatched[0][0]
    details = "; ".join(f"{n}: module {e}, stored {f}" for n, e, f in mismatched[:10])
    return ShapeMismatchError(f"size mismatch loading {type(module).__name__}: {details}; pass "
                              "ignore_mismatched_sizes=True to skip them", path=vb._shared.store.path, tensor=first)


def _strict_error(module: torch.nn.Module, result: LoadResult, vb: VarBuilder, keys: ModuleKeys) -> WeightioError:
    store = vb._shared.store
    missing, unexpected = result.missing_keys, result.unexpected_keys
    parts = ([f"missing: {_listing(missing)}"] if missing else []) + (
        [f"unexpected (stored, never used): {_listing(unexpected)}"] if unexpected else [])
    message = f"loading {type(module).__name__}: " + "; ".join(parts) + "; pass strict=False to allow this"
    better = _better_cursor(vb, keys, result)
    if better:
        message += f"; the module's tensors are under {better!r}: pass VarBuilder.from_path(...).pp({better!r})"
    if missing:
        return TensorNotFoundError(missing[0], store.names, path=store.path, message=message)
    return WeightioError(message, path=store.path)


def _better_cursor(vb: VarBuilder, keys: ModuleKeys, result: LoadResult) -> str | None:
    """A cursor from the checkpoint's root under which more of the module's names resolve, or None."""
    names = list(keys.targets)
    root = vb.root()
    prefix, score = find_sub_mapping(root, names)
    used = len(names) - len(result.missing_keys)
    current = vb.prefix
    return prefix if prefix and prefix != current and score > used else None
