"""Device maps: which device each part of a module goes to, and building a model without memory.

A device map is ``{module prefix: device}``, as accelerate spells it: ``{"transformer.h.0":
"cuda:0", "transformer.h.1": "cpu", "lm_head": "disk"}``; ``""`` is the whole module. A name
goes to the device of the longest prefix that contains it. Devices are torch's (``"cuda:0"``,
``"cpu"``, ``"mps"``, an int for a CUDA index) and ``"disk"``: the tensor stays a zero-copy
view of the checkpoint file (its own offload: no folder is written), whereas ``"cpu"`` holds an
owned copy in memory.

`plan_device_map` computes one from budgets (``max_memory``, as accelerate's: ``{0: "10GiB",
"cpu": "30GiB", "disk": None}``), or, for ``"auto"`` without budgets, from each device's free
memory (``torch.cuda.mem_get_info``; ``MemAvailable`` for the CPU), with the disk taking the rest.
Sub-modules are placed whole, in order, on the first device with room left; one too large for
the room left is split into its children unless its class is listed in the model's
``_no_split_modules`` (a transformers decoder layer), in which case it moves to the next device.
Tied tensors count once.

`empty_weights` builds a model whose parameters are on ``meta`` and whose buffers are real
(accelerate's ``init_empty_weights(include_buffers=False)``, without accelerate): rotary
frequencies and other non-persistent buffers, which no checkpoint holds, keep their values.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import UsageError
from ..limits import parse_size
from ..names import listing

__all__ = ["DISK", "empty_weights", "device_of", "normalize_map", "plan_device_map", "within"]

DISK = "disk"


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Parameters registered inside this block go to the ``meta`` device; buffers stay real.

    Identity is kept: a parameter already on meta (a tie, ``lm_head.weight = wte.weight``) is
    registered as it is, so ties made while the model is built survive.

    Example:
        >>> with weightio.torch.empty_weights():                                 # doctest: +SKIP
        ...     model = transformers.LlamaForCausalLM(config)     # no memory for weights
        >>> weightio.torch.load_into(model, "llama/", assign=True)                 # doctest: +SKIP
    """
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            extra = dict(param.__dict__)
            param = type(param)(param.data.to("meta"), requires_grad=param.requires_grad)
            param.__dict__.update(extra)
        original(module, name, param)

    saved = {name: getattr(torch.Tensor, name) for name in _RANDOM_FILLS}
    # patching a method (method-assign); mypy also compares `register` with it as if bound, `self` twice (assignment);
    # without torch installed it is all Any (unused-ignore)
    torch.nn.Module.register_parameter = register  # type: ignore[method-assign, assignment, unused-ignore]
    for name, fill in saved.items():
        setattr(torch.Tensor, name, _skipping_meta(fill))
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign, unused-ignore]  # (as above)
        for name, fill in saved.items():
            setattr(torch.Tensor, name, fill)


# Random initialisation of a meta tensor does nothing, slowly (torch runs it through its Python
# reference kernels): inside `empty_weights` these in-place fills return meta tensors untouched.
_RANDOM_FILLS = ("normal_", "uniform_")


def _skipping_meta(fill: Any) -> Any:
    def skip(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor if tensor.is_meta else fill(tensor, *args, **kwargs)

    return skip


# ----------------------------------------------------------------------------- device maps


def device_name(device: Any) -> str:
    """``0`` -> ``"cuda:0"``, ``"cuda"`` -> ``"cuda:0"``, ``torch.device("cpu")`` -> ``"cpu"``; ``"disk"`` stays."""
    if isinstance(device, bool):
        raise UsageError(f"{device!r} is not a device")
    if isinstance(device, int):
        return f"cuda:{device}"
    text = str(device)
    if text == DISK:
        return text
    try:
        found = torch.device(text)
    except (RuntimeError, TypeError):
        raise UsageError(f"{text!r} is not a device (torch's, such as 'cuda:0' or 'cpu', or 'disk')") from None
    return f"{found.type}:{found.index or 0}" if found.type == "cuda" else str(found)


def normalize_map(device_map: Mapping[str, Any], groups: Sequence[Sequence[str]]) -> dict[str, str]:
    """A user's device map with device names normalized, checked to place every tensor: each of `groups`
    (the names of one tensor: a child module registered twice, tied weights) through any of its names, as
    accelerate's check of ``named_parameters()``, which lists a shared tensor once, does."""
    mapped = {str(k): device_name(v) for k, v in device_map.items()}
    uncovered = [group for group in groups if all(device_of(mapped, n) is None for n in group)]
    if uncovered:
        names = [n for group in uncovered for n in group]  # (every name of each: any would do to place it)
        raise UsageError(f"the device map places no device for {len(uncovered)} tensor(s): {listing(names)}; "
                         "add their modules' prefixes (or \"\" for everything else)")
    return mapped


def device_of(device_map: Mapping[str, str], name: str) -> str | None:
    """The device of the longest prefix of `device_map` containing `name` (None: no prefix does)."""
    best, length = None, -1
    for prefix, device in device_map.items():
        if within(name, prefix) and len(prefix) > length:
            best, length = device, len(prefix)
    return best


def within(name: str, part: str) -> bool:
    """Whether `name` lies in the module `part` of a device map ("": the whole model)."""
    return not part or name == part or name.startswith(part + ".")


def budgets(max_memory: Mapping[Any, Any] | None) -> dict[str, int | None]:
    """Device -> bytes (None: unbounded), in placement order: CUDA devices by index, others, then the disk."""
    if max_memory is None:
        found: dict[str, int | None] = {}
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                found[f"cuda:{i}"] = int(torch.cuda.mem_get_info(i)[0])
        found["cpu"] = _available_host_memory()
        found[DISK] = None
        return found
    out = {device_name(k): (None if v is None else v if isinstance(v, int) else parse_size(str(v), fractions=True))
           for k, v in max_memory.items()}
    cuda = sorted((d for d in out if d.startswith("cuda:")), key=lambda d: int(d.partition(":")[2]))
    rest = [d for d in out if not d.startswith("cuda:") and d != DISK]
    return {d: out[d] for d in [*cuda, *rest, *([DISK] if DISK in out else [])]}


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def plan_device_map(module: torch.nn.Module, max_memory: Mapping[Any, Any] | None = None, *,
                    sizes: Mapping[str, int] | None = None) -> dict[str, str]:
    """A device map placing `module` within the budgets (see the module docstring).

    Args:
        module: the model (on meta or not: only shapes and dtypes are read).
        max_memory: device -> budget (bytes, ``"10GiB"``, None: unbounded); None: free memory,
            then the disk.
        sizes: name -> bytes, for the names that take memory (one name per tied group); default:
            every distinct parameter and persistent buffer at its own dtype.

    Raises:
        UsageError: the module does not fit the budgets.
    """
    if sizes is None:
        sizes = _own_sizes(module)
    room = budgets(max_memory)
    if not room:
        raise UsageError("max_memory names no device")
    no_split = {c for m in module.modules() for c in (getattr(m, "_no_split_modules", None) or ())}
    devices = list(room)
    plan: dict[str, str] = {}
    queue = _parts(module, "", sizes)
    index = 0
    while queue:
        prefix, part, size = queue.pop(0)
        while index < len(devices) and (budget := room[devices[index]]) is not None and size > budget:
            if part is not None and type(part).__name__ not in no_split and list(part.children()):
                break
            index += 1
        if index == len(devices):
            total = sum(sizes.values())
            raise UsageError(f"the module ({total:,} bytes) does not fit the budgets "
                             f"{', '.join(f'{d}: {b:,}' for d, b in room.items() if b is not None)}: "
                             f"{prefix or '(root)'} ({size:,} bytes) has no room; add \"disk\" or raise a budget")
        device = devices[index]
        budget = room[device]
        if budget is not None and size > budget:
            queue[:0] = _parts(part, prefix, sizes)
            continue
        plan[prefix] = device
        if budget is not None:
            room[device] = budget - size
    return _merged(plan)


def _parts(module: torch.nn.Module, prefix: str, sizes: Mapping[str, int]) -> list[tuple[str, Any, int]]:
    """(prefix, sub-module or None for a tensor, bytes) of `module`'s own tensors and children, in order."""
    head = prefix + "." if prefix else ""
    parts: list[tuple[str, Any, int]] = []
    for leaf, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        if head + leaf in sizes:
            parts.append((head + leaf, None, sizes[head + leaf]))
    for name, child in module.named_children():
        inner = head + name
        size = sum(v for k, v in sizes.items() if k.startswith(inner + "."))
        parts.append((inner, child, size))
    return parts


def _own_sizes(module: torch.nn.Module) -> dict[str, int]:
    seen: set[int] = set()
    sizes = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            sizes[name] = tensor.numel() * tensor.element_size()
    return sizes


def _merged(plan: dict[str, str]) -> dict[str, str]:
    """One entry ``""`` when everything is on one device; the plan as it is otherwise."""
    values = set(plan.values())
    return {"": values.pop()} if len(values) == 1 else plan
