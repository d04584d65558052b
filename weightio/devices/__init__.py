"""Backends: where tensors go after `numpy()`. The only package that imports torch, jax or cupy.

Device strings:

| string                         | what you get                         | copies                                    |
|--------------------------------|--------------------------------------|-------------------------------------------|
| ``numpy`` (default)            | read-only numpy view of the mapping  | none                                      |
| ``torch``, ``torch:cpu``       | torch tensor sharing the mapping     | none (see "Writing" below)                |
| ``torch:cuda``, ``torch:cuda:N`` | CUDA tensor                        | one host-to-device copy, pinned, staged   |
| ``torch:mps`` (and other torch devices) | tensor on that device       | one copy per contiguous run of tensors    |
| ``jax``, ``jax:cpu``, ``jax:gpu:N`` | ``jax.Array`` (``device_put``)  | none on the CPU if 64-byte aligned; else one |
| ``cupy``, ``cupy:N``           | cupy array on GPU N                  | one host-to-device copy, pinned, staged   |

Each framework lives in its own module (`weightio.devices.torch`, `.jax`, `.cupy`), imported
only when one of its devices is asked for; the framework itself is imported by its backend,
and a missing one raises `MissingDependencyError` saying how to install it. A device string
that names no device raises `UsageError`.

**The protocol.** A backend (`Backend`) does four things: `transfer` a batch of host arrays to
its device with their dtypes unchanged, `cast` one of its tensors to another dtype *on its
device*, `adopt` an object that already belongs to its framework, and `finish` a tensor before
it is handed out (refusing one its framework cannot represent). `place` (one tensor) and
`load_all` (a whole checkpoint) are written once on top of it. Casts run after the transfer,
where they are cheapest: a GPU converts bf16/fp8 to f32 at hundreds of GB/s, while the bus moves
the smaller stored type; on the CPU, torch's vectorised casts replace ml_dtypes' scalar loops.
This package takes arrays and tensor views, never paths: open a checkpoint first.

**Staging (GPUs).** `load_all` to a GPU does not copy tensor by tensor: the framework-free
`weightio.devices.staging` groups tensors into large runs and copies them through a ring of
reusable pinned buffers. A GPU backend is also the `staging.Engine` that ring drives, so one
class per framework holds all of that framework's code. `release_staging` frees the rings.

**Writing to zero-copy tensors.** numpy views are read-only, and so is the mapping under them
(shared, read-only: it commits no memory, so files larger than memory open). torch has no
read-only tensors, so a ``torch:cpu`` tensor of a file's bytes is built over a private
copy-on-write mapping of the stretch of the file that holds it (64 MiB windows, see
`weightio._io`): the same page-cache pages, no copy. An in-place write (``t.add_(1)``, an
optimizer step, ``t.copy_(…)``) copies the touched pages for that mapping alone — the file, the
numpy views and later opens never see it, and nothing crashes — but the zero-copy tensors of one
open checkpoint share their windows while any tensor over a window lives, so another tensor of the
same bytes made meanwhile (even after the written one is gone) may see the write; a window no
tensor uses is the file's bytes again. Clone a tensor you want to modify and compare
(``t.clone()``), load with ``copy=True``, or copy into your own parameters
(`weightio.torch.load_into` does). Bytes a reader holds in memory (an inflated ``.npz`` member or
zip record, a numpy array pickled in a PyTorch checkpoint) and any other read-only array are
copied for torch: a write must never reach memory the views share; memory made for one read of a
tensor inside the load (a dequantized GGUF tensor, a remote fetch) is taken as it is by that
read's tensor, and an array the caller passes in is copied. A writable
tensor larger than the kernel lets one process commit (more than RAM + swap, under the default
heuristic overcommit) is refused with `InputError`; read it as numpy or in slices.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from .._memory import withhold
from .._streaming import reading_ahead
from ..dtypes import by_torch, dtype_name, is_number, parse_dtype
from ..errors import UnsupportedDTypeError, UsageError
from .base import Device, import_framework, is_floating, parse_device
from .staging import RUN_ALIGN, Extent, Run, StagedLoader, extent_of, plan_runs

__all__ = [
    "RUN_ALIGN",
    "Backend",
    "Device",
    "Extent",
    "Run",
    "StagedLoader",
    "View",
    "as_numpy",
    "backend",
    "dtype_of",
    "extent_of",
    "import_framework",
    "is_floating",
    "is_view",
    "load_all",
    "parse_device",
    "place",
    "plan_runs",
    "release_staging",
]

# ----------------------------------------------------------------------------- what a source is


class View(Protocol):
    """What this package needs of a tensor view (`weightio.view.TensorView` is one).

    devices does not import the view module (layers point one way: views call devices for
    ``.to()``); anything with these members is treated as a view.
    """

    name: str
    info: Any  # a `weightio.records.TensorInfo`

    @property
    def dtype(self) -> np.dtype: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    def numpy(self) -> np.ndarray: ...  # the read-only host array (zero-copy when the bytes allow)
    def raw(self) -> np.ndarray: ...  # the stored bytes


_VIEW_MEMBERS = ("numpy", "raw", "info")
_VIEW_TYPES: dict[type, bool] = {}  # type -> whether it has a view's members (checked once per type)


def is_view(obj: Any) -> bool:
    """True when `obj` is a tensor view (has ``numpy()``, ``raw()`` and ``info``), by duck typing."""
    kind = type(obj)
    found = _VIEW_TYPES.get(kind)
    if found is None:
        found = _VIEW_TYPES[kind] = all(hasattr(obj, m) for m in _VIEW_MEMBERS)
    return found


# ----------------------------------------------------------------------------- the protocol


class Backend(Protocol):
    """What a device provides; `place` and `load_all` are built on these four methods."""

    device: Device

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Every host array on this device, dtype unchanged (one batch: the backend may group them)."""

    def cast(self, tensor: Any, dtype: np.dtype) -> Any:
        """`tensor` (one of this backend's) as `dtype`, converted on the device."""

    def adopt(self, obj: Any) -> Any:
        """`obj` on this device if it already belongs to this framework, else ``NotImplemented``."""

    def finish(self, tensor: Any, name: str | None = None) -> Any:
        """`tensor` as handed to the caller; raises if the framework cannot represent it."""


_BACKENDS: dict[Device, Backend] = {}
_BACKENDS_LOCK = threading.Lock()
_BY_ARGUMENT: dict[Any, Backend] = {}  # the device argument as given -> its backend (skips parsing)

# framework -> (module of this package, backend class): imported when the framework is first asked for
_FRAMEWORKS = {"torch": ("torch", "TorchBackend"), "jax": ("jax", "JaxBackend"), "cupy": ("cupy", "CupyBackend")}


def backend(device: str | Device | Any) -> Backend:
    """The backend for `device`, created on first use and shared afterwards (with its staging buffers).

    Raises:
        UsageError: a bad device string, or a device the framework does not have.
        MissingDependencyError: the framework is not installed.
    """
    try:
        return _BY_ARGUMENT[device]
    except (KeyError, TypeError):
        pass
    dev = _canonical(parse_device(device))
    with _BACKENDS_LOCK:
        found = _BACKENDS.get(dev)
        if found is None:
            found = _BACKENDS[dev] = _make_backend(dev)
        if isinstance(device, (str, Device)):
            _BY_ARGUMENT[device] = found
    return found


def _canonical(dev: Device) -> Device:
    if dev.framework == "numpy":
        return Device("numpy")
    if dev.framework == "torch":
        target = dev.target or "cpu"
        return Device("torch", "cuda:0" if target == "cuda" else "mps" if target == "mps:0" else target)
    if dev.framework == "cupy":
        return Device("cupy", dev.target or "0")
    return dev


def _make_backend(dev: Device) -> Backend:
    if dev.framework == "numpy":
        return NumpyBackend()
    module, cls = _FRAMEWORKS[dev.framework]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(dev)


def release_staging() -> None:
    """Free every backend's pinned staging buffers (they are reallocated when next needed)."""
    with _BACKENDS_LOCK:
        for b in _BACKENDS.values():
            loader = getattr(b, "loader", None)
            if loader is not None:
                loader.release()


# ----------------------------------------------------------------------------- public entry points


def place(source: View | np.ndarray | Any, device: str | Device = "numpy", dtype: np.dtype | None = None, *,
          copy: bool = False) -> Any:
    """`source` on `device`, cast to `dtype` when given.

    Args:
        source: a tensor view, a numpy array, or a tensor of the device's framework (moved, not
            round-tripped through numpy), or anything `as_numpy` accepts.
        device: a device string (see the module docstring).
        dtype: the dtype wanted, or None to keep the stored one.
        copy: the result in memory of its own (see `load_all`), never a view of the file.

    numpy: the zero-copy read-only view when no cast is needed, else a new array.
    torch CPU: a tensor sharing the view's file pages (no copy) when no cast is needed, through a
    private copy-on-write mapping: an in-place write to that tensor changes that tensor (and any
    zero-copy tensor of the same bytes made while a tensor over its 64 MiB window lives), never
    the file, the numpy views or a later open (see the module docstring) — clone first to keep the
    checkpoint's values. Bytes a reader holds in memory are copied (see the module docstring).
    """
    b = backend(device)
    _check_numbers(b, source, None if dtype is None else np.dtype(dtype))
    out = load_all({"": source}, b.device, dtype, copy=copy) if copy else None
    if out is not None:
        return out[""]
    if isinstance(source, np.ndarray):
        withhold(source)  # (the caller's array: a tensor of it never writes to it)
        adopted = NotImplemented
    else:
        adopted = b.adopt(source)
    if adopted is NotImplemented:
        adopted = b.transfer({"": _host(source)})[""]
    return b.finish(adopted if dtype is None else b.cast(adopted, np.dtype(dtype)))


def load_all(
    tensors: Mapping[str, Any],
    device: str | Device = "numpy",
    dtype: np.dtype | str | None = None,
    *,
    copy: bool = False,
) -> dict[str, Any]:
    """Every tensor of a checkpoint on `device`, in one bulk transfer.

    Args:
        tensors: a `Checkpoint`, or any mapping of names to tensor views / arrays / tensors.
            Paths are not opened here: open them with `weightio.open` (zero-copy results stay
            valid after it is closed).
        device: a device string. GPUs receive large contiguous runs through pinned buffers.
        dtype: converts the floating-point tensors (integer and bool tensors keep their type),
            on the device; None or ``"auto"`` keeps every stored dtype.
        copy: every result in memory of its own — writable, sharing nothing with the file or
            another result, alive after the checkpoint is closed — instead of zero-copy views
            (numpy, torch CPU, JAX CPU). Bytes of a local file are read with parallel ``pread``s
            straight into each result (`weightio.devices.filling`): several times faster than
            ``clone()`` of the views. GPU results are copies either way; with `copy`, each also
            gets a device allocation of its own instead of being a view of its run's.

    Raises:
        UsageError: `tensors` is not a mapping (a path, for instance), or a bad device.

    Example:
        >>> with weightio.open("model.safetensors") as ckpt:                     # doctest: +SKIP
        ...     weights = load_all(ckpt, "torch:cuda:0", dtype="bf16")
    """
    if not isinstance(tensors, Mapping):
        hint = "; open it first: load_all(weightio.open(path), …)" if isinstance(tensors, (str, os.PathLike)) else ""
        raise UsageError(f"load_all takes a mapping of name -> tensor, got {type(tensors).__name__}{hint}")
    b = backend(device)
    wanted = None if dtype is None or (isinstance(dtype, str) and dtype == "auto") else parse_dtype(dtype)
    tensors = dict(tensors.items())  # each value got once (a Checkpoint makes a new view on every access)
    # a cast makes new memory already: only the tensors it leaves as they are need a copy
    owned = copy and {k for k, v in tensors.items() if wanted is None or not _will_cast(v, wanted)}
    out = _on_device(b, tensors, owned or set())
    if wanted is not None:
        out = {k: b.cast(v, wanted) if is_floating(dtype_of(v)) else v for k, v in out.items()}
    return {k: b.finish(v, k) for k, v in out.items()}


def _will_cast(value: Any, wanted: np.dtype) -> bool:
    found = dtype_of(value)
    return is_floating(found) and found != wanted


def _on_device(b: Backend, tensors: Mapping[str, Any], owned: set[str]) -> dict[str, Any]:
    """Every value on `b`'s device: its framework's own tensors adopted, the rest in one transfer
    (the `owned` names into memory of their own, `_owned`)."""
    adopted = {}
    for name, value in tensors.items():
        _check_numbers(b, value, None)
        if isinstance(value, np.ndarray):
            withhold(value)  # (the caller's array: a tensor of it never writes to it)
        elif not is_view(value):
            found = b.adopt(value)
            if found is not NotImplemented:
                adopted[name] = _clone(found) if name in owned else found
    names = [name for name in tensors if name not in adopted]
    hosted = reading_ahead(tensors[name] for name in names)  # remote views: the next ones are fetched meanwhile
    arrays = {name: _host(value) for name, value in zip(names, hosted, strict=True)}
    moved = b.transfer({k: a for k, a in arrays.items() if k not in owned})
    if owned:
        moved.update(_owned(b, {k: a for k, a in arrays.items() if k in owned}))
    return {name: adopted[name] if name in adopted else moved[name] for name in tensors}


def _owned(b: Backend, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """`arrays` on `b`'s device in memory of their own: the backend's `owned` where it has one,
    else through owned host copies (JAX CPU would otherwise share them)."""
    owned = getattr(b, "owned", None)
    if owned is not None:
        return owned(arrays)
    return b.transfer(NumpyBackend().owned(arrays))


def _clone(tensor: Any) -> Any:
    """A copy of a framework's tensor that `adopt` may have returned as it was given (JAX arrays
    are immutable: kept)."""
    clone = getattr(tensor, "clone", None) or getattr(tensor, "copy", None)
    return tensor if clone is None else clone()


def _check_numbers(b: Backend, source: Any, dtype: np.dtype | None) -> None:
    """Refuse, before anything is read, to cast or hand a framework elements that are not numbers
    (bytes, str, datetime, records of ``.npy``/``.npz`` files): numpy arrays and views keep them,
    as stored. Object arrays are left to their read, which says why it refuses them."""
    if not (isinstance(source, np.ndarray) or is_view(source)):
        return
    stored = source.dtype
    if is_number(stored) or stored.hasobject or (dtype is None and isinstance(b, NumpyBackend)):
        return
    target = f"cast to {dtype_name(dtype)}" if dtype is not None else f"placed on {b.device}"
    raise UnsupportedDTypeError(
        f"{dtype_name(stored)} elements are not numbers and cannot be {target}: no framework has such a type and "
        "no cast is exact; read them with .numpy() (as stored, as numpy.load returns them)",
        path=getattr(source, "path", None), tensor=getattr(source, "name", None))


def _host(source: Any) -> np.ndarray:
    """A host numpy array for a view (zero-copy when the bytes allow), an array, or a foreign tensor."""
    if isinstance(source, np.ndarray):
        return source
    if is_view(source):
        return source.numpy()
    return as_numpy(source)


def dtype_of(obj: Any) -> np.dtype:
    """The numpy dtype of a numpy/torch/jax/cupy array."""
    dtype = obj.dtype
    if isinstance(dtype, np.dtype):
        return dtype
    return by_torch(str(dtype)).numpy if type(obj).__module__.startswith("torch") else np.dtype(dtype)


def as_numpy(obj: Any) -> np.ndarray:
    """A numpy array for a torch tensor (any dtype, any device), a tensor view, or an array-like."""
    if isinstance(obj, np.ndarray):
        return obj
    if is_view(obj):
        return obj.numpy()
    if type(obj).__module__.split(".")[0] == "torch":
        from .torch import to_numpy

        return to_numpy(obj)
    try:
        return np.asarray(obj)
    except Exception as e:  # noqa: BLE001 - any conversion failure is a dtype/type problem
        raise UnsupportedDTypeError(f"cannot convert {type(obj).__name__} to an array: {e}") from None


# ----------------------------------------------------------------------------- numpy


class NumpyBackend:
    """Host numpy arrays: the zero-copy views themselves; casts make new arrays."""

    device = Device("numpy")

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return dict(arrays)

    def owned(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Writable copies in memory of their own, filled in parallel (`weightio.devices.filling`)."""
        from .filling import fill

        out, pairs = {}, []
        for k, a in arrays.items():
            a = _native(a)
            dst = out[k] = np.empty(a.shape, a.dtype)
            pairs.append((dst.reshape(-1).view(np.uint8), a))
        fill(pairs)
        return out

    def cast(self, tensor: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return tensor if tensor.dtype == dtype else tensor.astype(dtype)

    def adopt(self, obj: Any) -> Any:
        return NotImplemented

    def finish(self, tensor: Any, name: str | None = None) -> Any:
        return tensor


def _native(arr: np.ndarray) -> np.ndarray:
    """`arr` C-contiguous, numbers in native byte order (a copy only where it is not already)."""
    if not arr.dtype.isnative and is_number(arr.dtype):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
