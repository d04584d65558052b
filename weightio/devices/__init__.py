"""Backends: where tensors go after `numpy()`. The only module that imports torch, jax or cupy.

Device strings:

| string                         | what you get                         | copies                                    |
|--------------------------------|--------------------------------------|-------------------------------------------|
| ``numpy`` (default)            | read-only numpy view of the mapping  | none                                      |
| ``torch``, ``torch:cpu``       | torch tensor sharing the mapping     | none (see "Writing" below)                |
| ``torch:cuda``, ``torch:cuda:N`` | CUDA tensor                        | one host-to-device copy, pinned, staged   |
| ``torch:mps`` (and other torch devices) | tensor on that device       | one copy per contiguous run of tensors    |
| ``jax``, ``jax:cpu``, ``jax:gpu:N`` | ``jax.Array`` (``device_put``)  | none on the CPU if 64-byte aligned; else one |
| ``cupy``, ``cupy:N``           | cupy array on GPU N                  | one host-to-device copy, pinned, staged   |

Each framework is imported inside the code that needs it; a missing one raises `FormatError`
saying how to install it.

**The protocol.** A backend (`Backend`) does three things: `transfer` a batch of host arrays to
its device with their dtypes unchanged, `cast` one of its tensors to another dtype *on its
device*, and `adopt` an object that already belongs to its framework. `place` (one tensor) and
`load_all` (a whole checkpoint) are written once on top of it. Casts run after the transfer,
where they are cheapest: a GPU converts bf16/fp8 to f32 at hundreds of GB/s, while the bus moves
the smaller stored type; on the CPU, torch's vectorised casts replace ml_dtypes' scalar loops.

**Staging (CUDA).** `load_all` to a GPU does not copy tensor by tensor. `plan_runs` groups the
tensors of each file into runs of nearby bytes (`Run`, at most 256 MiB); each run gets one device
allocation, filled through a ring of reusable pinned buffers (2 x 64 MiB): while the GPU copies one
buffer with a non-blocking DMA, host threads fill the other from the file mapping. Tensors are then
views of their run's allocation (cast on the device if asked). Tensors that cannot be viewed raw on
a device (big-endian, quantized, misaligned) are converted on the host first and staged the same
way. The pinned ring is allocated once per device and reused by every later transfer
(`release_staging` frees it).

**Writing to zero-copy tensors.** numpy views are read-only. A ``torch:cpu`` tensor shares the
same pages, and torch has no read-only tensors. Files are mapped privately (copy-on-write, see
`weightio._io`): an in-place write (``t.add_(1)``, an optimizer step, ``t.copy_(…)``) copies the
touched pages for this process — the file never changes and nothing crashes — but every view
of those bytes in this process sees the new values. Clone a tensor you want to modify
(``t.clone()``), or copy into your own parameters (`weightio.torch.load_into` does). torch's
"non-writable NumPy array" warning is silenced for this reason: the tensor is documented as
read-only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import threading
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import ml_dtypes
import numpy as np

from ..dtypes import TABLE, by_numpy, by_torch, dtype_name, parse_dtype
from ..errors import FormatError, UnsupportedDTypeError
from ..view import TensorView

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "Backend",
    "Device",
    "Extent",
    "Run",
    "StagedLoader",
    "as_numpy",
    "backend",
    "is_floating",
    "load_all",
    "parse_device",
    "place",
    "plan_runs",
    "release_staging",
    "torch_from_numpy",
]

# ----------------------------------------------------------------------------- device strings


@dataclass(frozen=True)
class Device:
    """A parsed device string: a framework and its own device name (``torch``, ``cuda:0``)."""

    framework: str
    target: str | None = None

    def __str__(self) -> str:
        return self.framework if self.target is None else f"{self.framework}:{self.target}"


# framework -> the targets it accepts (None: the framework's default device)
_TARGETS = {
    "numpy": re.compile(r"cpu"),
    "torch": re.compile(r"cpu|cuda(:\d+)?|mps(:0)?|[a-z][a-z_]*(:\d+)?"),
    "jax": re.compile(r"(cpu|gpu|cuda|rocm|tpu)(:\d+)?"),
    "cupy": re.compile(r"\d+"),
}
_USAGE = "numpy, torch[:cpu|:cuda:N|:mps], jax[:cpu|:gpu:N], cupy[:N]"


def parse_device(device: str | Device | Any) -> Device:
    """Parse a device string (or a ``torch.device``).

    Example:
        >>> parse_device("torch:cuda:1")
        Device(framework='torch', target='cuda:1')
    """
    if isinstance(device, Device):
        return device
    if type(device).__module__ == "torch" and type(device).__name__ == "device":
        return Device("torch", str(device))
    framework, _, target = str(device).partition(":")
    if framework not in _TARGETS:
        hint = f"; did you mean 'torch:{device}'?" if framework in ("cuda", "mps", "cpu") else ""
        raise FormatError(f"unknown device {device!r}; use one of: {_USAGE}{hint}")
    if target and not _TARGETS[framework].fullmatch(target):
        raise FormatError(f"{framework} has no device {target!r} (in {device!r}); use one of: {_USAGE}")
    return Device(framework, target or None)


# How to install each optional framework (cupy has no extra: its wheel depends on the CUDA version).
_INSTALL = {"torch": "pip install 'weightio[torch]'", "jax": "pip install 'weightio[jax]'",
            "cupy": "pip install cupy-cuda12x, or the cupy build for your CUDA version"}


def import_framework(name: str) -> Any:
    """Import an optional framework, or say how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        how = _INSTALL.get(name, f"pip install {name}")
        raise FormatError(f"{name} is not installed; install it ({how}) to use {name} devices") from None


# ----------------------------------------------------------------------------- the protocol


class Backend(Protocol):
    """What a device provides; `place` and `load_all` are built on these three methods."""

    device: Device

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Every host array on this device, dtype unchanged (one batch: the backend may group them)."""

    def cast(self, tensor: Any, dtype: np.dtype) -> Any:
        """`tensor` (one of this backend's) as `dtype`, converted on the device."""

    def adopt(self, obj: Any) -> Any:
        """`obj` on this device if it already belongs to this framework, else ``NotImplemented``."""


_BACKENDS: dict[Device, Backend] = {}
_BACKENDS_LOCK = threading.Lock()
_BY_ARGUMENT: dict[Any, Backend] = {}  # the device argument as given -> its backend (skips parsing)


def backend(device: str | Device | Any) -> Backend:
    """The backend for `device`, created on first use and shared afterwards (with its staging buffers)."""
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
    if dev.framework == "torch":
        return TorchBackend(dev)
    if dev.framework == "jax":
        return JaxBackend(dev)
    return CupyBackend(dev)


def release_staging() -> None:
    """Free every backend's pinned staging buffers (they are reallocated when next needed)."""
    with _BACKENDS_LOCK:
        for b in _BACKENDS.values():
            loader = getattr(b, "loader", None)
            if loader is not None:
                loader.release()


def is_floating(dtype: np.dtype) -> bool:
    """True for float, bfloat16 and float8/6/4 types: the ones a model-wide ``dtype=`` converts."""
    return dtype.kind == "f" or dtype in _ML_FLOATS


# ml_dtypes types (bfloat16, float8_*): frameworks that cannot wrap them get same-width integers.
# (Tested by membership: ml_dtypes gives most of them numpy kind "V" but float8_e5m2 kind "f".)
_ML_FLOATS = frozenset(row.numpy for row in TABLE if row.numpy.type.__module__.startswith("ml_dtypes"))

# ----------------------------------------------------------------------------- public entry points


def place(source: TensorView | np.ndarray | Any, device: str | Device = "numpy", dtype: np.dtype | None = None) -> Any:
    """`source` on `device`, cast to `dtype` when given.

    Args:
        source: a `TensorView`, a numpy array, or a tensor of the device's framework (moved, not
            round-tripped through numpy), or anything `as_numpy` accepts.
        device: a device string (see the module docstring).
        dtype: the dtype wanted, or None to keep the stored one.

    numpy: the zero-copy read-only view when no cast is needed, else a new array.
    torch CPU: a tensor sharing the view's memory (no copy) when no cast is needed; the memory is
    the file's private copy-on-write mapping: an in-place write to that tensor changes what this
    process reads (every view of those pages), never the file (see the module docstring) — clone
    first to keep the checkpoint's values.
    """
    b = backend(device)
    adopted = NotImplemented if isinstance(source, np.ndarray) else b.adopt(source)
    if adopted is NotImplemented:
        adopted = b.transfer({"": _host(source)})[""]
    return _checked(adopted if dtype is None else b.cast(adopted, np.dtype(dtype)))


def load_all(
    tensors: Mapping[str, Any] | str | os.PathLike[str],
    device: str | Device = "numpy",
    dtype: np.dtype | str | None = None,
) -> dict[str, Any]:
    """Every tensor of a checkpoint on `device`, in one bulk transfer.

    Args:
        tensors: a `Checkpoint` (or any mapping of names to `TensorView`s / arrays), or a path
            `weightio.open` accepts (opened and closed here; zero-copy results stay valid).
        device: a device string. GPUs receive large contiguous runs through pinned buffers.
        dtype: converts the floating-point tensors (integer and bool tensors keep their type),
            on the device.

    Example:
        >>> weights = load_all("model.safetensors", "torch:cuda:0", dtype="bf16")   # doctest: +SKIP
    """
    if isinstance(tensors, (str, os.PathLike)):
        from ..checkpoint import open_checkpoint

        with open_checkpoint(tensors) as ckpt:
            return load_all(ckpt, device, dtype)
    b = backend(device)
    wanted = None if dtype is None else parse_dtype(dtype)
    out = _on_device(b, tensors)
    if wanted is not None:
        out = {k: b.cast(v, wanted) if is_floating(_dtype_of(v)) else v for k, v in out.items()}
    return {k: _checked(v, k) for k, v in out.items()}


def _checked(obj: Any, name: str | None = None) -> Any:
    """`obj`, unless it is raw bits of a type its framework cannot represent (cupy and bf16/fp8)."""
    if isinstance(obj, _RawBits):
        raise UnsupportedDTypeError(f"cupy has no {dtype_name(obj.dtype)} type; pass dtype='float32' "
                                    "(or 'float16') to convert it on the GPU", tensor=name)
    return obj


def _on_device(b: Backend, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Every value on `b`'s device: its framework's own tensors adopted, the rest in one transfer."""
    adopted = {}
    for name, value in tensors.items():
        if not isinstance(value, (np.ndarray, TensorView)):
            found = b.adopt(value)
            if found is not NotImplemented:
                adopted[name] = found
    moved = b.transfer({name: _host(v) for name, v in tensors.items() if name not in adopted})
    return {name: adopted[name] if name in adopted else moved[name] for name in tensors}


def _host(source: Any) -> np.ndarray:
    """A host numpy array for a view (zero-copy when the bytes allow), an array, or a foreign tensor."""
    if isinstance(source, np.ndarray):
        return source
    if isinstance(source, TensorView):
        return source.numpy()
    return as_numpy(source)


def _dtype_of(obj: Any) -> np.dtype:
    """The numpy dtype of a numpy/torch/jax/cupy array."""
    dtype = obj.dtype
    if isinstance(dtype, np.dtype):
        return dtype
    return by_torch(str(dtype)).numpy if type(obj).__module__.startswith("torch") else np.dtype(dtype)


# ----------------------------------------------------------------------------- numpy


class NumpyBackend:
    """Host numpy arrays: the zero-copy views themselves; casts make new arrays."""

    device = Device("numpy")

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return dict(arrays)

    def cast(self, tensor: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return tensor if tensor.dtype == dtype else tensor.astype(dtype)

    def adopt(self, obj: Any) -> Any:
        return NotImplemented


# ----------------------------------------------------------------------------- torch


def torch_from_numpy(arr: np.ndarray) -> Any:
    """A torch CPU tensor sharing `arr`'s memory, for every dtype in the table (bf16, fp8 too).

    torch cannot wrap ml_dtypes arrays directly: they are viewed as same-width integers, wrapped,
    then viewed back as the torch dtype. torch warns about read-only arrays; the warning is
    silenced here because the tensor is documented as read-only.
    """
    torch = import_framework("torch")
    target = _torch_dtype(torch, arr.dtype)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.aligned or any(s < 0 for s in arr.strides):  # torch needs aligned, positive strides
        arr = arr.copy()
    bridge = arr
    if arr.dtype in _ML_FLOATS:  # torch.from_numpy knows numpy's own types only
        bridge = arr.view(np.dtype(f"u{arr.dtype.itemsize}"))
    if bridge.flags.writeable or _READ_ONLY_WARNED:
        tensor = torch.from_numpy(bridge)
    else:
        tensor = _from_read_only(torch, bridge)
    return tensor.view(target) if tensor.dtype != target else tensor


_READ_ONLY_WARNED = False


def _from_read_only(torch: Any, arr: np.ndarray) -> Any:
    """``torch.from_numpy`` of a read-only array, silencing torch's warning about it.

    torch issues that warning once per process (``TORCH_WARN_ONCE``): the first read-only array
    goes through a warning filter, later ones skip its cost.
    """
    global _READ_ONLY_WARNED
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(arr)
    _READ_ONLY_WARNED = True
    return tensor


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    row = by_numpy(dtype)
    if row.torch is None or row.packed:
        raise UnsupportedDTypeError(f"torch has no dtype for {row.safetensors}")
    return getattr(torch, row.torch)


class TorchBackend:
    """torch tensors: zero-copy on the CPU; staged through pinned buffers to CUDA; runs to other devices."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.torch = import_framework("torch")
        self.target = device.target or "cpu"
        self.loader: StagedLoader | None = None
        if self.target != "cpu":
            try:  # an unknown or absent device fails here, by name, not at the first copy
                self.torch.empty(0, device=self.torch.device(self.target))
            except (RuntimeError, NotImplementedError, AssertionError) as e:
                raise FormatError(f"torch has no device {self.target!r}: {e}") from None
            cuda = self.target.startswith("cuda")
            self.loader = StagedLoader(_TorchEngine(self.torch, self.target, staged=cuda, pin=cuda))

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if self.loader is None:
            return {k: torch_from_numpy(a) for k, a in arrays.items()}
        return self.loader.load(arrays)

    def cast(self, tensor: Any, dtype: np.dtype) -> Any:
        target = _torch_dtype(self.torch, dtype)
        if tensor.dtype == target:
            return tensor
        try:
            return tensor.to(target)
        except (RuntimeError, TypeError) as e:  # e.g. MPS has no float64
            raise UnsupportedDTypeError(f"cannot convert {tensor.dtype} to {dtype_name(dtype)} on "
                                        f"{self.device}: {e}") from None

    def adopt(self, obj: Any) -> Any:
        if not isinstance(obj, self.torch.Tensor):
            return NotImplemented
        return obj.detach().to(self.torch.device(self.target))


# ----------------------------------------------------------------------------- jax


class JaxBackend:
    """``jax.Array``s through ``jax.device_put`` (one batched call); on the CPU, XLA aliases
    64-byte-aligned host memory instead of copying it.

    With 64-bit types disabled (jax's default), jax would silently turn int64 into int32:
    integers are converted here only when every value fits, otherwise `UnsupportedDTypeError`
    says to enable ``jax_enable_x64``. float64 follows jax's own rule (float32).
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.jax = import_framework("jax")
        platform, _, index = (device.target or "").partition(":")
        platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
        try:
            devices = self.jax.devices(platform or None)
            self.target = devices[int(index or 0)]
        except (RuntimeError, IndexError) as e:
            raise FormatError(f"jax has no device {device.target!r}: {e}") from None

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        names = list(arrays)
        placed = self.jax.device_put([self._fit(n, arrays[n]) for n in names], self.target)
        return dict(zip(names, placed, strict=True))

    def _fit(self, name: str, arr: np.ndarray) -> np.ndarray:
        if arr.dtype.itemsize != 8 or arr.dtype.kind not in "iu" or self.jax.config.jax_enable_x64:
            return arr
        small = np.dtype(f"{arr.dtype.kind}4")
        info = np.iinfo(small)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise UnsupportedDTypeError(f"tensor {name!r}: {arr.dtype} values do not fit jax's 32-bit integers; "
                                        "enable 64-bit types (jax.config.update('jax_enable_x64', True))")
        return arr.astype(small)

    def cast(self, tensor: Any, dtype: np.dtype) -> Any:
        return tensor if tensor.dtype == dtype else tensor.astype(dtype)

    def adopt(self, obj: Any) -> Any:
        if not isinstance(obj, self.jax.Array):
            return NotImplemented
        return self.jax.device_put(obj, self.target)


# ----------------------------------------------------------------------------- cupy


class CupyBackend:
    """cupy arrays on one GPU, staged like torch CUDA.

    cupy has no bfloat16 or float8 types: such tensors are moved as their raw bits and must be
    converted to a float type cupy has (``dtype="float32"``/``"float16"``) — on the GPU: bf16 by
    a shift into the high half of a float32, fp8 through a 256-entry table.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.cp = import_framework("cupy")
        self.index = int(device.target or 0)
        self.loader = StagedLoader(_CupyEngine(self.cp, self.index))

    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        with self.cp.cuda.Device(self.index):
            return self.loader.load(arrays)

    def cast(self, tensor: Any, dtype: np.dtype) -> Any:
        with self.cp.cuda.Device(self.index):
            return _cupy_cast(self.cp, tensor, dtype)

    def adopt(self, obj: Any) -> Any:
        if not isinstance(obj, (self.cp.ndarray, _RawBits)):
            return NotImplemented
        with self.cp.cuda.Device(self.index):
            return self.cp.asarray(obj) if isinstance(obj, self.cp.ndarray) else obj


@dataclass(frozen=True)
class _RawBits:
    """A cupy array of a type cupy lacks (bf16, fp8), held as same-width unsigned integers.

    Attributes:
        bits: the cupy array of ``uint16``/``uint8`` bit patterns.
        dtype: the logical (ml_dtypes) dtype.
    """

    bits: Any
    dtype: np.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)


def _cupy_cast(cp: Any, tensor: Any, dtype: np.dtype) -> Any:
    if dtype in _ML_FLOATS:
        raise UnsupportedDTypeError(f"cupy has no {dtype_name(dtype)} type; ask for float32 or float16")
    if not isinstance(tensor, _RawBits):
        return tensor if tensor.dtype == dtype else tensor.astype(dtype)
    if tensor.dtype == ml_dtypes.bfloat16:  # bf16 is the high half of a float32
        wide = (tensor.bits.astype(cp.uint32) << 16).view(cp.float32)
    else:  # 256 possible fp8 codes: look each one up in a table built on the host
        table = np.arange(256, dtype=np.uint8).view(tensor.dtype).astype(np.float32)
        wide = cp.asarray(table)[tensor.bits]
    return wide if dtype == np.float32 else wide.astype(dtype)


# ----------------------------------------------------------------------------- staging: planning


@dataclass(frozen=True)
class Extent:
    """One tensor's bytes inside a host buffer.

    Attributes:
        key: the tensor's name.
        root: the contiguous array whose memory holds it (a file mapping, an inflated member, …).
        start, stop: the byte range ``[start, stop)`` of `root` its elements occupy.
        dtype, shape: the tensor's (native-order) dtype and shape.
        strides: byte strides (positive) for a non-contiguous tensor, else None.
    """

    key: str
    root: np.ndarray
    start: int
    stop: int
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None


@dataclass
class Run:
    """Neighbouring extents of one root buffer, copied to the device as one range.

    Attributes:
        root: the host buffer.
        start, stop: the byte range copied (`start` aligned down so that device offsets keep
            every member's alignment).
        members: the extents it holds.
    """

    root: np.ndarray
    start: int
    stop: int
    members: list[Extent] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


RUN_ALIGN = 64  # device offsets keep each tensor's offset modulo 64: aligned for every element type


def plan_runs(extents: Iterable[Extent], *, max_gap: int = 1 << 16, max_run: int = 256 << 20) -> list[Run]:
    """Group extents into runs of nearby bytes, per root buffer, in address order.

    An extent joins the current run when it starts at most `max_gap` bytes after the run ends
    (padding and small headers between tensors are copied along rather than splitting the copy)
    and the run stays within `max_run` bytes; an extent overlapping the run (tensors sharing
    storage) always joins it. A tensor larger than `max_run` gets a run of its own.

    Example:
        >>> buf = np.zeros(256, np.uint8)
        >>> ext = [Extent(k, buf, a, b, np.dtype("u1"), (b - a,)) for k, a, b in [("x", 0, 8), ("y", 8, 16)]]
        >>> [(r.start, r.stop, [m.key for m in r.members]) for r in plan_runs(ext)]
        [(0, 16, ['x', 'y'])]
    """
    by_root: dict[int, list[Extent]] = {}
    for ext in extents:
        by_root.setdefault(id(ext.root), []).append(ext)
    runs: list[Run] = []
    for group in by_root.values():
        runs.extend(_runs_of(sorted(group, key=lambda e: (e.start, e.stop)), max_gap, max_run))
    return runs


def _runs_of(group: list[Extent], max_gap: int, max_run: int) -> list[Run]:
    runs: list[Run] = []
    for ext in group:
        run = runs[-1] if runs else None
        overlaps = run is not None and ext.start < run.stop
        near = run is not None and ext.start - run.stop <= max_gap and max(ext.stop, run.stop) - run.start <= max_run
        if run is not None and (overlaps or near):
            run.stop = max(run.stop, ext.stop)
            run.members.append(ext)
        else:
            runs.append(Run(ext.root, ext.start - ext.start % RUN_ALIGN, ext.stop, [ext]))
    return runs


def extent_of(key: str, arr: np.ndarray) -> Extent | None:
    """Where `arr`'s elements lie in the contiguous buffer its memory belongs to, or None.

    None when the array cannot be copied raw and viewed on a device as it is: not native
    byte order, negative or non-element strides, misaligned, or memory of unknown extent.
    """
    if not arr.dtype.isnative or arr.size == 0:
        return None
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        return None
    itemsize = arr.dtype.itemsize
    offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    strides = None if arr.flags.c_contiguous else tuple(arr.strides)
    if strides is not None and any(s <= 0 or s % itemsize for s in strides):
        return None
    span = arr.nbytes
    if strides is not None:
        span = sum(s * (d - 1) for d, s in zip(arr.shape, strides, strict=True)) + itemsize
    if offset < 0 or offset % itemsize or offset + span > root.nbytes:
        return None
    return Extent(key, root, offset, offset + span, arr.dtype, tuple(arr.shape), strides)


# ----------------------------------------------------------------------------- staging: copying


class _Engine(Protocol):
    """The device primitives `StagedLoader` needs (torch or cupy)."""

    staged: bool  # copy through the ring of host buffers (else straight from the source memory)

    def active(self) -> Any: ...  # a context making the device current (copies and events on its stream)
    def empty(self, nbytes: int) -> Any: ...
    def host_buffer(self, nbytes: int) -> tuple[Any, np.ndarray]: ...
    def copy(self, dev: Any, pos: int, host: Any, n: int) -> None: ...
    def copy_direct(self, dev: Any, pos: int, src: np.ndarray) -> None: ...
    def event(self) -> Any: ...
    def view(self, dev: Any, rel: int, ext: Extent) -> Any: ...
    def empty_tensor(self, dtype: np.dtype, shape: tuple[int, ...]) -> Any: ...


class _Slot:
    """One staging buffer of the ring and the event marking the end of its last copy."""

    def __init__(self, engine: _Engine, nbytes: int) -> None:
        self.handle, self.host = engine.host_buffer(nbytes)
        self.done = engine.event()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def record(self) -> None:
        if self.done is not None:
            self.done.record()


_COPY_POOL: ThreadPoolExecutor | None = None
_COPY_THREADS = max(1, min(8, os.cpu_count() or 1))
_MIN_PIECE = 4 << 20  # below this a thread hand-off costs more than it saves


def _copy_pool() -> ThreadPoolExecutor:
    global _COPY_POOL
    if _COPY_POOL is None:
        from concurrent.futures import ThreadPoolExecutor  # (imports logging): only when copying

        _COPY_POOL = ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="weightio-copy")
    return _COPY_POOL


def _parallel_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` for uint8 buffers, split over threads (numpy releases the GIL while copying).

    A single thread copying from a file mapping is limited by page faults to a few GB/s, well
    below what a PCIe 5 link takes; several threads fault and copy in parallel.
    """
    n = len(src)
    pieces = min(_COPY_THREADS, n // _MIN_PIECE)
    if pieces < 2:
        np.copyto(dst, src)
        return
    bounds = [n * i // pieces for i in range(pieces + 1)]
    jobs = [_copy_pool().submit(np.copyto, dst[a:b], src[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    for job in jobs:
        job.result()


class StagedLoader:
    """Moves host arrays to a device in large runs, through a reusable ring of staging buffers.

    Args:
        engine: the device primitives (torch or cupy).
        chunk: bytes per staging buffer.
        slots: staging buffers in the ring (2: fill one while the other is being copied).
        max_gap, max_run: see `plan_runs`.

    An engine that does not stage (``torch:mps``: unified memory, no pinned allocator) copies each
    run straight from the host buffer. The ring works the same with unpinned buffers, which is
    how the tests exercise it on machines without a GPU.
    """

    def __init__(self, engine: _Engine, *, chunk: int = 64 << 20, slots: int = 2,
                 max_gap: int = 1 << 16, max_run: int = 256 << 20) -> None:
        self.engine, self.chunk, self.nslots = engine, chunk, slots
        self.max_gap, self.max_run = max_gap, max_run
        self._slots: list[_Slot] = []
        self._turn = 0
        self._lock = threading.Lock()

    def release(self) -> None:
        """Free the staging buffers (after the copies using them have finished)."""
        with self._lock:
            for slot in self._slots:
                slot.wait()
            self._slots = []

    def load(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Every array on the device, dtype and shape unchanged, in `arrays`' order."""
        extents, out = [], {}
        for key, arr in arrays.items():
            ext = extent_of(key, arr)
            if ext is None and arr.size:  # converted on the host, then staged like the rest
                ext = extent_of(key, arr.astype(arr.dtype.newbyteorder("="), order="C", copy=True))
            if ext is None:
                out[key] = self.engine.empty_tensor(arr.dtype.newbyteorder("="), tuple(arr.shape))
            else:
                extents.append(ext)
        with self._lock, self.engine.active():
            for run in plan_runs(extents, max_gap=self.max_gap, max_run=self.max_run):
                dev = self._copy_run(run)
                for ext in run.members:
                    out[ext.key] = self.engine.view(dev, ext.start - run.start, ext)
        return {key: out[key] for key in arrays}

    def _copy_run(self, run: Run) -> Any:
        dev = self.engine.empty(run.nbytes)
        for pos in range(0, run.nbytes, self.chunk):
            n = min(self.chunk, run.nbytes - pos)
            src = _bytes(run.root)[run.start + pos : run.start + pos + n]
            if not self.engine.staged:
                self.engine.copy_direct(dev, pos, src)
                continue
            slot = self._next_slot()
            slot.wait()  # the DMA that last read this buffer has finished
            _parallel_copy(slot.host[:n], src)
            self.engine.copy(dev, pos, slot.handle, n)
            slot.record()
        return dev

    def _next_slot(self) -> _Slot:
        if not self._slots:
            self._slots = [_Slot(self.engine, self.chunk) for _ in range(self.nslots)]
        slot = self._slots[self._turn % len(self._slots)]
        self._turn += 1
        return slot


def _bytes(root: np.ndarray) -> np.ndarray:
    """A contiguous array's memory as a flat uint8 array (zero-copy)."""
    return root.reshape(-1).view(np.uint8) if root.dtype != np.uint8 or root.ndim != 1 else root


class _TorchEngine:
    """`StagedLoader` primitives on a torch device; pinned staging and events on CUDA.

    Args:
        torch: the torch module.
        target: the torch device (``"cuda:0"``).
        staged: copy through the ring of host buffers.
        pin: page-lock those buffers so that copies from them are asynchronous DMAs.
    """

    def __init__(self, torch: Any, target: str, *, staged: bool, pin: bool) -> None:
        self.torch, self.staged, self.pin = torch, staged, pin
        self.device = torch.device(target)

    def active(self) -> Any:
        # Copies and event records go to the *current* device's stream: make it the target's, or
        # a ring event recorded on another GPU would not cover the copy it guards.
        return self.torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def empty(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def host_buffer(self, nbytes: int) -> tuple[Any, np.ndarray]:
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=self.pin)
        return t, t.numpy()

    def copy(self, dev: Any, pos: int, host: Any, n: int) -> None:
        dev[pos : pos + n].copy_(host[:n], non_blocking=self.pin)

    def copy_direct(self, dev: Any, pos: int, src: np.ndarray) -> None:
        dev[pos : pos + len(src)].copy_(torch_from_numpy(src))

    def event(self) -> Any:
        return self.torch.cuda.Event() if self.device.type == "cuda" else None

    def view(self, dev: Any, rel: int, ext: Extent) -> Any:
        dtype = _torch_dtype(self.torch, ext.dtype)
        span = dev[rel : rel + ext.stop - ext.start].view(dtype)
        if ext.strides is None:
            return span.view(ext.shape)
        return span.as_strided(ext.shape, [s // ext.dtype.itemsize for s in ext.strides])

    def empty_tensor(self, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        return self.torch.empty(shape, dtype=_torch_dtype(self.torch, dtype), device=self.device)


class _CupyEngine:
    """`StagedLoader` primitives on one cupy GPU: pinned staging, copies on a dedicated stream."""

    staged = True

    def __init__(self, cp: Any, index: int) -> None:
        self.cp, self.index = cp, index
        with cp.cuda.Device(index):
            self.stream = cp.cuda.Stream(non_blocking=True)

    def active(self) -> Any:
        return self.cp.cuda.Device(self.index)

    def empty(self, nbytes: int) -> Any:
        return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def host_buffer(self, nbytes: int) -> tuple[Any, np.ndarray]:
        import cupyx

        host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
        return host, host

    def copy(self, dev: Any, pos: int, host: Any, n: int) -> None:
        dev[pos : pos + n].set(host[:n], stream=self.stream)

    def copy_direct(self, dev: Any, pos: int, src: np.ndarray) -> None:
        dev[pos : pos + len(src)].set(src)

    def event(self) -> Any:
        return _StreamEvent(self.cp.cuda.Event(), self.stream)

    def view(self, dev: Any, rel: int, ext: Extent) -> Any:
        self.stream.synchronize()  # later kernels run on other streams: the bytes must be there
        bits = np.dtype(f"u{ext.dtype.itemsize}") if ext.dtype in _ML_FLOATS else ext.dtype
        span = dev[rel : rel + ext.stop - ext.start].view(bits)
        arr = span.reshape(ext.shape) if ext.strides is None else self.cp.lib.stride_tricks.as_strided(
            span, ext.shape, ext.strides)
        return _RawBits(arr, ext.dtype) if ext.dtype in _ML_FLOATS else arr

    def empty_tensor(self, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        if dtype in _ML_FLOATS:
            return _RawBits(self.cp.empty(shape, dtype=f"u{dtype.itemsize}"), dtype)
        return self.cp.empty(shape, dtype=dtype)


@dataclass(frozen=True)
class _StreamEvent:
    event: Any
    stream: Any

    def record(self) -> None:
        self.event.record(self.stream)

    def synchronize(self) -> None:
        self.event.synchronize()


# ----------------------------------------------------------------------------- back to numpy


def as_numpy(obj: Any) -> np.ndarray:
    """A numpy array for a torch tensor (any dtype, any device), a TensorView, or an array-like."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, TensorView):
        return obj.numpy()
    if type(obj).__module__.split(".")[0] == "torch":
        return _torch_to_numpy(obj)
    try:
        return np.asarray(obj)
    except Exception as e:  # noqa: BLE001 - any conversion failure is a dtype/type problem
        raise UnsupportedDTypeError(f"cannot convert {type(obj).__name__} to an array: {e}") from None


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    row = by_torch(str(tensor.dtype))
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    if row.numpy not in _ML_FLOATS and not row.packed:
        return tensor.numpy()
    torch = import_framework("torch")
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    return raw.view(row.numpy).reshape(tuple(tensor.shape))

