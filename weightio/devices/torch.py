"""torch devices: everything weightio does with torch, in one class and its helpers.

`TorchBackend` is both the `weightio.devices.Backend` for a torch device and, on devices other
than the CPU, the `weightio.devices.staging.Engine` its `StagedLoader` drives:

- ``torch:cpu``: tensors share the host arrays' memory (`torch_from_numpy`, no copy; views of a
  file get private copy-on-write pages of it, so that an in-place write cannot crash);
- ``torch:cuda:N``: runs staged through a ring of pinned buffers, non-blocking copies ordered by
  CUDA events recorded on the target device's current stream;
- other devices (``torch:mps``, ``torch:xpu``): one copy per run, straight from the host memory
  (no pinned allocator; MPS memory is unified anyway).

torch itself is imported when the first backend is made (``import torch`` below is the real
torch: this module is ``weightio.devices.torch``, imports are absolute).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._io import writable_twin
from .._memory import writable_if_handed
from ..dtypes import by_numpy, by_torch, dtype_name
from ..errors import UnsupportedDTypeError, UsageError
from .base import ML_FLOATS, Device, import_framework
from .filling import fill, populate_all
from .staging import Extent, StagedLoader

__all__ = ["TorchBackend", "to_numpy", "torch_from_numpy"]


class TorchBackend:
    """torch tensors: zero-copy on the CPU; staged through pinned buffers to CUDA; runs to other devices.

    Args:
        device: the device (``Device("torch", "cuda:0")``).
        staged: copy through the ring of host buffers; default: on CUDA only.
        pin: page-lock those buffers so that copies from them are asynchronous DMAs; default: on CUDA only.

    Raises:
        UsageError: torch has no such device (unknown to torch, or absent on this machine).
        MissingDependencyError: torch is not installed.
    """

    def __init__(self, device: Device, *, staged: bool | None = None, pin: bool | None = None) -> None:
        self.device = device
        self.torch = import_framework("torch")
        self.target = device.target or "cpu"
        self.torch_device = _torch_device(self.torch, self.target)
        cuda = self.torch_device.type == "cuda"
        self.staged = cuda if staged is None else staged
        self.pin = cuda if pin is None else pin
        self.loader = None if self.target == "cpu" else StagedLoader(self)

    # ---------------------------------------------------------------- the backend protocol
    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if self.loader is None:
            return {k: torch_from_numpy(a) for k, a in arrays.items()}
        return self.loader.load(arrays)

    def owned(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Like `transfer`, but every CPU tensor in memory of its own (`torch.empty`), filled in
        parallel (`weightio.devices.filling`); other devices copy anyway."""
        if self.loader is not None:
            return self.loader.load(arrays, separate=True)
        out, pairs = {}, []
        for key, arr in arrays.items():
            if not arr.dtype.isnative or not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("="), copy=False))
            raw = self.torch.empty(arr.nbytes, dtype=self.torch.uint8)
            pairs.append((raw.numpy(), arr))
            out[key] = raw.view(_torch_dtype(self.torch, arr.dtype)).view(arr.shape)
        fill(pairs)
        return out

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
        return obj.detach().to(self.torch_device)

    def finish(self, tensor: Any, name: str | None = None) -> Any:
        return tensor

    # ---------------------------------------------------------------- the staging engine
    def active(self) -> Any:
        # Copies and event records go to the *current* device's stream: make it the target's, or
        # a ring event recorded on another GPU would not cover the copy it guards.
        if self.torch_device.type == "cuda":
            return self.torch.cuda.device(self.torch_device)
        return contextlib.nullcontext()

    def empty(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.torch_device)

    def host_buffer(self, nbytes: int) -> tuple[Any, np.ndarray]:
        if self.pin and self.torch_device.type == "cuda":
            registered = _registered_buffer(self.torch, nbytes)
            if registered is not None:
                return registered
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=self.pin)
        return t, t.numpy()

    def copy(self, dev: Any, pos: int, host: Any, n: int, at: int) -> None:
        dev[pos : pos + n].copy_(host[at : at + n], non_blocking=self.pin)

    def copy_direct(self, dev: Any, pos: int, src: np.ndarray) -> None:
        dev[pos : pos + len(src)].copy_(torch_from_numpy(src, writable=False))

    def event(self) -> Any:
        return self.torch.cuda.Event() if self.torch_device.type == "cuda" else None

    def view(self, dev: Any, rel: int, ext: Extent) -> Any:
        dtype = _torch_dtype(self.torch, ext.dtype)
        span = dev[rel : rel + ext.stop - ext.start].view(dtype)
        if ext.strides is None:
            return span.view(ext.shape)
        return span.as_strided(ext.shape, [s // ext.dtype.itemsize for s in ext.strides])

    def empty_tensor(self, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        return self.torch.empty(shape, dtype=_torch_dtype(self.torch, dtype), device=self.torch_device)


class _Registered:
    """Anonymous memory page-locked with ``cudaHostRegister``; unregistered when collected (the
    ring's buffers are dropped only after the copies reading them finished: `StagedLoader.release`)."""

    def __init__(self, torch: Any, nbytes: int) -> None:
        import mmap

        self.cudart = torch.cuda.cudart()
        self.memory = mmap.mmap(-1, nbytes)
        self.array = np.frombuffer(self.memory, np.uint8)
        populate_all(self.array)  # faulted in on the fill pool's threads, not page by page under the driver
        self.address = self.array.__array_interface__["data"][0]
        self.ok = int(self.cudart.cudaHostRegister(self.address, nbytes, 0)) == 0

    def __del__(self) -> None:
        if getattr(self, "ok", False):
            with contextlib.suppress(Exception):  # (at exit the CUDA context may be gone already)
                self.cudart.cudaHostUnregister(self.address)


def _registered_buffer(torch: Any, nbytes: int) -> tuple[Any, np.ndarray] | None:
    """A pinned staging buffer: anonymous memory registered with CUDA, or None where that fails.

    However a buffer is pinned, the cost is faulting its fresh pages in: on the H200 machines here torch's
    ``pin_memory=True`` (``cudaHostAlloc``) took 52 ms for 128 MiB, faulting in on one thread 49 ms
    and registering then 8 ms (2026-11-30; an earlier machine's ``cudaHostAlloc`` took ~100 ms).
    Memory of our own can be faulted in on the fill pool's threads (`populate_all`) before it is
    registered: the ring's four buffers 44-46 ms instead of 55-62 ms (docs/benchmarks.md "GPU").
    After one refusal the process stops asking (and the error the refusal left in the CUDA
    runtime is cleared, or torch's next kernel launch would report it as its own)."""
    global _REGISTER_REFUSED
    if _REGISTER_REFUSED:
        return None
    try:
        held = _Registered(torch, nbytes)
    except (OSError, RuntimeError, AttributeError, TypeError, ValueError):
        _REGISTER_REFUSED = True
        return None
    if not held.ok:
        _REGISTER_REFUSED = True
        _clear_cuda_error()
        return None
    tensor = torch.from_numpy(held.array)
    tensor._weightio_pinned = held  # the registration lives as long as the tensor
    return tensor, held.array


_REGISTER_REFUSED = False


def _clear_cuda_error() -> None:
    """``cudaGetLastError()`` in the CUDA runtime torch loaded (found in the process's mappings)."""
    import ctypes

    paths = set()
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode path
            if len(fields) == 6 and "libcudart" in fields[5] and fields[5].startswith("/"):
                paths.add(fields[5].strip().removesuffix(" (deleted)"))
    for path in paths:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).cudaGetLastError()


def _torch_device(torch: Any, target: str) -> Any:
    """``torch.device(target)``, checked: an unknown or absent device fails here, by name, not at the first copy."""
    try:
        found = torch.device(target)
        if found.type != "cpu":
            torch.empty(0, device=found)
    except (RuntimeError, NotImplementedError, AssertionError) as e:
        raise UsageError(f"torch has no device {target!r}: {e}") from None
    return found


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    found = _DTYPES.get(dtype)
    if found is None:
        row = by_numpy(dtype)
        if row.torch is None or row.packed:
            raise UnsupportedDTypeError(f"torch has no dtype for {row.safetensors}")
        found = _DTYPES[dtype] = getattr(torch, row.torch)
    return found


_DTYPES: dict[np.dtype, Any] = {}  # numpy dtype -> torch's, as met (a lookup in the table costs ~2 us a tensor)


def _torch() -> Any:
    """The torch module, imported on first use (``importlib`` asked again costs ~1.3 us a tensor)."""
    global _TORCH
    if _TORCH is None:
        _TORCH = import_framework("torch")
    return _TORCH


_TORCH: Any = None


# ----------------------------------------------------------------------------- numpy <-> torch


def torch_from_numpy(arr: np.ndarray, *, writable: bool = True) -> Any:
    """A torch CPU tensor sharing `arr`'s memory, for every dtype in the table (bf16, fp8 too).

    torch has no read-only tensors, and a write to a file's read-only mapping is SIGSEGV: a view
    of a file's mapping is first moved to private copy-on-write memory over the same file pages
    (`weightio._io.writable_twin`: no copy; the 64 MiB windows of the file it lies in), unless
    `writable` is False (the caller only reads the tensor, e.g. to copy it to a GPU). Memory made
    for one read inside the load (`weightio._memory.handed_over`: a dequantized tensor, a remote
    fetch) is taken as it is, once. Any other read-only array is copied: its memory may be
    anyone's (a reader's inflated buffer, which every view of that member shares; the immutable
    ``bytes`` a pickled array was read from, one-byte ones shared by the whole interpreter; a
    file's mapping behind a DLPack capsule, where no walk finds the file), and a write through
    the tensor must never reach it.

    torch cannot wrap ml_dtypes arrays directly: they are viewed as same-width integers, wrapped,
    then viewed back as the torch dtype. With `writable` False a read-only array is wrapped as it
    is, and torch's warning about that silenced (the caller never writes to the tensor).
    """
    torch = _torch()
    target = _torch_dtype(torch, arr.dtype)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.aligned or any(s < 0 for s in arr.strides):  # torch needs aligned, positive strides
        arr = arr.copy()
    if writable and not arr.flags.writeable:
        twin = writable_twin(arr)
        if twin is None:  # (memory made for one read is taken as it is, once; any other copied)
            twin = writable_if_handed(arr)
        arr = arr.copy() if twin is None else twin
    bridge = arr
    if arr.dtype in ML_FLOATS:  # torch.from_numpy knows numpy's own types only
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


def to_numpy(tensor: Any) -> np.ndarray:
    """A host numpy array of a torch tensor of any dtype (bf16, fp8, packed types too) on any device."""
    row = by_torch(str(tensor.dtype))
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    if row.numpy not in ML_FLOATS and not row.packed:
        return tensor.numpy()
    torch = import_framework("torch")
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    return raw.view(row.numpy).reshape(tuple(tensor.shape))
