"""Backends: where tensors go after `numpy()`. The only module that imports torch, jax or cupy.

Device strings: ``"numpy"`` (default: the zero-copy read-only view), ``"torch"`` /
``"torch:cpu"`` (a torch tensor sharing the mapping), ``"torch:cuda:N"``, ``"torch:mps"``.
Each framework is imported inside the function that needs it, with an error naming the extra
to install when it is missing.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import by_numpy, by_torch
from .errors import FormatError, UnsupportedDTypeError

if TYPE_CHECKING:
    from .view import TensorView

__all__ = ["Device", "parse_device", "place", "as_numpy"]


@dataclass(frozen=True)
class Device:
    """A parsed device string: a framework and its own device name (``torch``, ``cuda:0``)."""

    framework: str
    target: str | None = None

    def __str__(self) -> str:
        return self.framework if self.target is None else f"{self.framework}:{self.target}"


_FRAMEWORKS = ("numpy", "torch")


def parse_device(device: str | Device) -> Device:
    """Parse ``"numpy"``, ``"torch"``, ``"torch:cpu"``, ``"torch:cuda:1"``, ``"torch:mps"``.

    Example:
        >>> parse_device("torch:cuda:1")
        Device(framework='torch', target='cuda:1')
    """
    if isinstance(device, Device):
        return device
    framework, _, target = str(device).partition(":")
    if framework not in _FRAMEWORKS:
        raise FormatError(f"unknown device {device!r}; use one of: numpy, torch[:cpu|:cuda:N|:mps]")
    if framework == "numpy" and target not in ("", "cpu"):
        raise FormatError(f"numpy arrays live on the CPU; {device!r} is not a numpy device")
    return Device(framework, target or None)


def import_framework(name: str) -> Any:
    """Import an optional framework, or say which extra installs it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise FormatError(
            f"{name} is not installed; install it (pip install 'weightio[{name}]') to use {name} devices"
        ) from None


def place(source: TensorView | np.ndarray, device: str | Device, dtype: np.dtype | None = None) -> Any:
    """`source` on `device`, cast to `dtype` when given.

    numpy: the zero-copy read-only view when no cast is needed, else a new array.
    torch CPU: a tensor sharing the view's memory (no copy) when no cast is needed; the memory is
    the read-only file mapping, so writing to that tensor in place is undefined — clone first.
    """
    dev = parse_device(device)
    arr = source.numpy() if not isinstance(source, np.ndarray) else source
    if dev.framework == "numpy":
        return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)
    return _to_torch(arr, dev.target or "cpu", dtype)


def _to_torch(arr: np.ndarray, target: str, dtype: np.dtype | None) -> Any:
    torch = import_framework("torch")
    tensor = torch_from_numpy(arr)
    if dtype is not None:
        tensor = tensor.to(getattr(torch, by_numpy(dtype).torch))
    return tensor if target == "cpu" else tensor.to(target)


def torch_from_numpy(arr: np.ndarray) -> Any:
    """A torch CPU tensor sharing `arr`'s memory, for every dtype in the table (bf16, fp8 too).

    torch cannot wrap ml_dtypes arrays directly: they are viewed as same-width integers, wrapped,
    then viewed back as the torch dtype. torch warns about read-only arrays; the warning is
    silenced here because the tensor is documented as read-only.
    """
    torch = import_framework("torch")
    row = by_numpy(arr.dtype)
    if row.torch is None or row.packed:
        raise UnsupportedDTypeError(f"torch has no dtype for {row.safetensors}")
    target = getattr(torch, row.torch)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.aligned:  # torch kernels assume element-aligned storage
        arr = arr.copy()
    bridge = arr
    if arr.dtype.kind == "V":  # ml_dtypes: bfloat16, float8_*
        bridge = arr.view(np.dtype(f"u{arr.dtype.itemsize}"))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(bridge)
    return tensor.view(target) if tensor.dtype != target else tensor


def as_numpy(obj: Any) -> np.ndarray:
    """A numpy array for a torch tensor (any dtype, any device), a TensorView, or an array-like."""
    from .view import TensorView

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
    if row.numpy.kind != "V" and not row.packed:
        return tensor.numpy()
    torch = import_framework("torch")
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    return raw.view(row.numpy).reshape(tuple(tensor.shape))
