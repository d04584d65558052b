"""jax devices: ``jax.Array``s through one batched ``jax.device_put``.

jax does its own host-to-device transfers (and on the CPU aliases 64-byte-aligned host memory
instead of copying it), so it needs no staging ring. jax itself is imported when the first
backend is made (``import jax`` in this module would be the real jax: imports are absolute).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import UnsupportedDTypeError, UsageError
from .base import Device, import_framework

__all__ = ["JaxBackend"]


class JaxBackend:
    """``jax.Array``s through ``jax.device_put`` (one batched call); on the CPU, XLA aliases
    64-byte-aligned host memory instead of copying it.

    With 64-bit types disabled (jax's default), jax would silently turn int64 into int32:
    integers are converted here only when every value fits, otherwise `UnsupportedDTypeError`
    says to enable ``jax_enable_x64``. float64 follows jax's own rule (float32).

    Raises:
        UsageError: jax has no such device on this machine.
        MissingDependencyError: jax is not installed.
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
            raise UsageError(f"jax has no device {device.target!r}: {e}") from None

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

    def finish(self, tensor: Any, name: str | None = None) -> Any:
        return tensor
