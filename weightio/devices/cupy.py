"""cupy devices: cupy arrays on one GPU, staged like torch CUDA.

`CupyBackend` is both the `weightio.devices.Backend` for a cupy GPU and the
`weightio.devices.staging.Engine` its `StagedLoader` drives: pinned staging buffers
(``cupyx.empty_pinned``), copies on a dedicated non-blocking stream, events recorded on it.

cupy has no bfloat16 or float8 types: such tensors are moved as their raw bits (`_RawBits`) and
must be converted to a float type cupy has (``dtype="float32"``/``"float16"``) — on the GPU: bf16
by a shift into the high half of a float32, fp8 through a 256-entry table. cupy itself is
imported when the first backend is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..dtypes import dtype_name
from ..errors import UnsupportedDTypeError
from .base import ML_FLOATS, Device, import_framework
from .staging import Extent, StagedLoader

__all__ = ["CupyBackend"]


class CupyBackend:
    """cupy arrays on one GPU (``Device("cupy", "0")``), staged through pinned buffers.

    Raises:
        MissingDependencyError: cupy is not installed.
    """

    staged = True

    def __init__(self, device: Device) -> None:
        self.device = device
        self.cp = import_framework("cupy")
        self.index = int(device.target or 0)
        with self.cp.cuda.Device(self.index):
            self.stream = self.cp.cuda.Stream(non_blocking=True)
        self.loader = StagedLoader(self)

    # ---------------------------------------------------------------- the backend protocol
    def transfer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        with self.cp.cuda.Device(self.index):
            return self.loader.load(arrays)

    def owned(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Like `transfer`, but each array in a device allocation of its own."""
        with self.cp.cuda.Device(self.index):
            return self.loader.load(arrays, separate=True)

    def cast(self, tensor: Any, dtype: np.dtype) -> Any:
        with self.cp.cuda.Device(self.index):
            return _cupy_cast(self.cp, tensor, dtype)

    def adopt(self, obj: Any) -> Any:
        if not isinstance(obj, (self.cp.ndarray, _RawBits)):
            return NotImplemented
        with self.cp.cuda.Device(self.index):
            return self.cp.asarray(obj) if isinstance(obj, self.cp.ndarray) else obj

    def finish(self, tensor: Any, name: str | None = None) -> Any:
        """`tensor`, unless it is raw bits of a type cupy cannot represent (bf16/fp8)."""
        if isinstance(tensor, _RawBits):
            raise UnsupportedDTypeError(f"cupy has no {dtype_name(tensor.dtype)} type; pass dtype='float32' "
                                        "(or 'float16') to convert it on the GPU", tensor=name)
        return tensor

    # ---------------------------------------------------------------- the staging engine
    def active(self) -> Any:
        return self.cp.cuda.Device(self.index)

    def empty(self, nbytes: int) -> Any:
        return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def host_buffer(self, nbytes: int) -> tuple[Any, np.ndarray]:
        import cupyx

        host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
        return host, host

    def copy(self, dev: Any, pos: int, host: Any, n: int, at: int) -> None:
        dev[pos : pos + n].set(host[at : at + n], stream=self.stream)

    def copy_direct(self, dev: Any, pos: int, src: np.ndarray) -> None:
        dev[pos : pos + len(src)].set(src)

    def event(self) -> Any:
        return _StreamEvent(self.cp.cuda.Event(), self.stream)

    def view(self, dev: Any, rel: int, ext: Extent) -> Any:
        self.stream.synchronize()  # later kernels run on other streams: the bytes must be there
        bits = np.dtype(f"u{ext.dtype.itemsize}") if ext.dtype in ML_FLOATS else ext.dtype
        span = dev[rel : rel + ext.stop - ext.start].view(bits)
        arr = span.reshape(ext.shape) if ext.strides is None else self.cp.lib.stride_tricks.as_strided(
            span, ext.shape, ext.strides)
        return _RawBits(arr, ext.dtype) if ext.dtype in ML_FLOATS else arr

    def empty_tensor(self, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        if dtype in ML_FLOATS:
            return _RawBits(self.cp.empty(shape, dtype=f"u{dtype.itemsize}"), dtype)
        return self.cp.empty(shape, dtype=dtype)


@dataclass(frozen=True)
class _StreamEvent:
    """A cupy event bound to the stream it is recorded on (the ring records without arguments)."""

    event: Any
    stream: Any

    def record(self) -> None:
        self.event.record(self.stream)

    def synchronize(self) -> None:
        self.event.synchronize()


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
    if dtype in ML_FLOATS:
        raise UnsupportedDTypeError(f"cupy has no {dtype_name(dtype)} type; ask for float32 or float16")
    if not isinstance(tensor, _RawBits):
        return tensor if tensor.dtype == dtype else tensor.astype(dtype)
    if tensor.dtype == ml_dtypes.bfloat16:  # bf16 is the high half of a float32
        wide = (tensor.bits.astype(cp.uint32) << 16).view(cp.float32)
    else:  # 256 possible fp8 codes: look each one up in a table built on the host
        table = np.arange(256, dtype=np.uint8).view(tensor.dtype).astype(np.float32)
        wide = cp.asarray(table)[tensor.bits]
    return wide if dtype == np.float32 else wide.astype(dtype)
