"""What a module's names are, for a load: tie groups, non-persistent buffers, names to ignore, and
where in a training checkpoint the module's tensors sit.

**Ties.** Names that share one tensor object in the module form a group, and so do the pairs a
transformers model declares (``_tied_weights_keys``, expanded by ``get_expanded_tied_weights_keys``
when ``config.tie_word_embeddings`` is set): a model built under accelerate's
``init_empty_weights`` holds two meta parameters for ``lm_head.weight`` and
``transformer.wte.weight``, which `load_into` ties again. A group is loaded once, from whichever
of its names the checkpoint has, and every name of it ends up holding that one tensor. Its
*canonical* name is the declared source where there is one (``transformer.wte.weight``), else
its first name in ``state_dict`` order.

**Ignorable names.** A stored name is ignored (reported, never fatal) when it matches a
non-persistent buffer of the module (``embeddings.position_ids`` of a BERT saved before 2023,
``rotary_emb.inv_freq``), a pattern of ``_keys_to_ignore_on_load_unexpected``, or, for
transformers models, one of the buffers hub-era checkpoints carry (`HUB_ERA_BUFFERS`). A
missing name is ignored when it matches ``_keys_to_ignore_on_load_missing``.

**Nesting.** Training scripts save the model's state dict inside a larger dict, which weightio
reads as dotted names: ``{"epoch", "state_dict": {"module.conv1.weight": …}, "optimizer"}`` has
``state_dict.module.conv1.weight``. `find_sub_mapping` tries the cursors made of the usual keys
(`CHECKPOINT_KEYS`) followed by wrappers' attributes (`WRAPPERS`) and keeps the one under which
most of the module's names resolve.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..varbuilder import VarBuilder

__all__ = ["CHECKPOINT_KEYS", "HUB_ERA_BUFFERS", "WRAPPERS", "ModuleKeys", "find_sub_mapping", "module_keys",
           "split_prefix"]

# The keys training scripts keep a model's state dict under (PyTorch's ImageNet example and most
# research code: "state_dict"; the PyTorch tutorials: "model_state_dict"; timm/DeiT: "model",
# "model_ema"; others: "ema", "net", …), in order of preference when several match.
CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model", "module", "ema", "model_ema", "ema_state_dict",
                   "ema_model", "net", "network", "weights", "params")
# Attributes a wrapper keeps the model under: DDP/DataParallel, torch.compile, LightningModule.
WRAPPERS = ("module", "_orig_mod", "model")
# Buffers transformers models once saved and no longer have (GPT-2's causal mask and its masked
# bias, BERT's position ids, rotary frequencies): stored names ending so are ignored.
HUB_ERA_BUFFERS = ("attn.bias", "attn.masked_bias", "crossattention.bias", "crossattention.masked_bias",
                   "embeddings.position_ids", "rotary_emb.inv_freq")
_DEPTH = 3  # sub-mapping + up to two wrappers


@dataclass
class ModuleKeys:
    """A module's names as a load sees them.

    Attributes:
        targets: ``state_dict(keep_vars=True)``: every persistent name and its tensor.
        groups: names sharing one tensor (tied), canonical name first; one group per tensor.
        tied: tied name -> the canonical name it shares.
        transient: the non-persistent buffers' names (no checkpoint needs them).
        ignore_unexpected, ignore_missing: the ``_keys_to_ignore_on_load_*`` patterns.
        hub_era: whether `HUB_ERA_BUFFERS` apply (a transformers model).
    """

    targets: dict[str, Any]
    groups: list[list[str]]
    tied: dict[str, str]
    transient: list[str]
    ignore_unexpected: list[re.Pattern[str]] = field(default_factory=list)
    ignore_missing: list[re.Pattern[str]] = field(default_factory=list)
    hub_era: bool = False

    def why_ignored(self, stored: str, relative: str) -> str | None:
        """Why an unused stored name is ignored (`relative`: without the sub-mapping), or None."""
        for pattern in self.ignore_unexpected:
            if pattern.search(relative) or pattern.search(stored):
                return "_keys_to_ignore_on_load_unexpected"
        if self.hub_era and any(relative == b or relative.endswith("." + b) for b in HUB_ERA_BUFFERS):
            return "buffer of hub-era checkpoints"
        return None

    def missing_ignored(self, name: str) -> bool:
        return any(p.search(name) for p in self.ignore_missing)


def module_keys(module: torch.nn.Module) -> ModuleKeys:
    """The names of `module` a load needs (see the module docstring)."""
    targets = module.state_dict(keep_vars=True)
    order = {name: i for i, name in enumerate(targets)}
    parent = {name: name for name in targets}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def union(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb, key=order.__getitem__)] = min(ra, rb, key=order.__getitem__)

    first_of: dict[int, str] = {}
    for name, tensor in targets.items():
        union(first_of.setdefault(id(tensor), name), name)
    declared = {t: s for t, s in declared_ties(module).items() if t in targets and s in targets}
    for target, source in declared.items():
        union(target, source)
    members: dict[str, list[str]] = {}
    for name in targets:
        members.setdefault(root(name), []).append(name)
    sources = set(declared.values())
    groups, tied = [], {}
    for names in members.values():
        canonical = next((n for n in names if n in sources), names[0])
        group = [canonical] + [n for n in names if n != canonical]
        groups.append(group)
        tied.update({n: canonical for n in group[1:]})
    modules = list(module.named_modules(remove_duplicate=False))  # one walk of the tree for what follows
    transient = list(dict.fromkeys(n for n, _ in named_tensors(modules, "_buffers") if n not in targets))
    return ModuleKeys(targets, groups, tied, transient, _patterns(modules, "_keys_to_ignore_on_load_unexpected"),
                      _patterns(modules, "_keys_to_ignore_on_load_missing"), _is_transformers(module))


def declared_ties(module: torch.nn.Module) -> dict[str, str]:
    """transformers' tied-weights mapping, target -> source ({} for other modules and untied configs)."""
    expand = getattr(module, "get_expanded_tied_weights_keys", None)
    if callable(expand):  # transformers >= 5
        try:
            return dict(expand(all_submodels=True))
        except (ValueError, AttributeError, TypeError):  # a model whose own definition does not expand
            return {}
    config = getattr(module, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    model: Any = module  # a transformers model: torch types attributes it does not declare as Tensor | Module
    try:  # transformers 4: the output embeddings are tied to the input embeddings
        output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return {}
    names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
    if output is None or inputs is None or id(output) not in names or id(inputs) not in names:
        return {}
    return {_joined(names[id(output)], "weight"): _joined(names[id(inputs)], "weight")}


def named_tensors(modules: list[tuple[str, torch.nn.Module]], table: str) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every entry of each module's `table` (``"_parameters"`` or ``"_buffers"``),
    `modules` being ``named_modules(remove_duplicate=False)``'s pairs: what ``named_parameters`` or
    ``named_buffers(remove_duplicate=False)`` list, from a walk of the tree made once."""
    for prefix, sub in modules:
        for leaf, tensor in getattr(sub, table).items():
            if tensor is not None:
                yield _joined(prefix, leaf), tensor


def _joined(prefix: str, leaf: str) -> str:
    return f"{prefix}.{leaf}" if prefix else leaf


def _patterns(modules: list[tuple[str, torch.nn.Module]], attribute: str) -> list[re.Pattern[str]]:
    """The regular expressions the modules list under `attribute` (transformers' class attributes,
    or an instance's own), each once. Read past ``nn.Module.__getattr__``, which costs an
    exception for every module that lacks the attribute (most of them)."""
    found: dict[str, None] = {}
    for _, sub in modules:
        listed = sub.__dict__.get(attribute)
        if listed is None:
            listed = getattr(type(sub), attribute, None)
            if hasattr(listed, "__get__"):  # a property (or other descriptor): what the instance reads
                listed = getattr(sub, attribute, None)
        for pattern in listed or ():
            found.setdefault(pattern)
    return [re.compile(p) for p in found]


def _is_transformers(module: torch.nn.Module) -> bool:
    return any(cls.__module__.startswith("transformers.") and cls.__name__ == "PreTrainedModel"
               for cls in type(module).__mro__)


# ----------------------------------------------------------------------------- nesting


def find_sub_mapping(vb: VarBuilder, names: Sequence[str], *, search: bool = True) -> tuple[str, int]:
    """The cursor prefix under which most of `names` resolve, and how many do ("" is `vb` itself).

    With `search` False only `vb` itself is scored. A nested cursor wins only when more names
    resolve under it than under `vb`.
    """
    best, score = "", _score(vb, names)
    if not search or score == len(names):
        return best, score
    for prefix in candidates(vb):
        found = _score(vb.pp(prefix), names)
        if found > score:
            best, score = prefix, found
            if score == len(names):
                break
    return best, score


def candidates(vb: VarBuilder) -> list[str]:
    """Cursor prefixes made of `CHECKPOINT_KEYS` and `WRAPPERS` that stored names begin with, best first."""
    known = set(CHECKPOINT_KEYS) | set(WRAPPERS)
    head = vb.prefix + "." if vb.prefix else ""
    seen: dict[str, None] = {}
    for name in vb.stored_names():
        if not name.startswith(head):
            continue
        parts = name[len(head):].split(".")
        for depth in range(1, min(_DEPTH, len(parts) - 1) + 1):
            if parts[depth - 1] not in known:
                break
            seen.setdefault(".".join(parts[:depth]))
    rank = {k: i for i, k in enumerate(CHECKPOINT_KEYS)}
    return sorted(seen, key=lambda p: (rank.get(p.split(".")[0], len(rank)), p.count(".")))


def _score(vb: VarBuilder, names: Sequence[str]) -> int:
    return sum(1 for n in names if vb.contains(n))


def split_prefix(prefix: str) -> tuple[str, str]:
    """``"state_dict.module"`` -> (sub-mapping ``"state_dict"``, wrapper prefix ``"module."``)."""
    if not prefix:
        return "", ""
    first, _, rest = prefix.partition(".")
    if first in CHECKPOINT_KEYS and (rest or first not in WRAPPERS):
        return first, rest + "." if rest else ""
    return "", prefix + "."
