"""What every framework module of `weightio.devices` needs: device strings and optional imports.

Kept apart from the package's ``__init__`` so that the framework modules (``torch.py``,
``jax.py``, ``cupy.py``), which ``__init__`` imports when a device of theirs is asked for,
never import ``__init__`` back: the package's modules form no import cycle.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import TABLE
from ..errors import MissingDependencyError, UsageError

__all__ = ["ML_FLOATS", "Device", "import_framework", "is_floating", "parse_device"]

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

    Raises:
        UsageError: an unknown framework, or a device the framework's syntax does not allow.

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
        raise UsageError(f"unknown device {device!r}; use one of: {_USAGE}{hint}")
    if target and not _TARGETS[framework].fullmatch(target):
        raise UsageError(f"{framework} has no device {target!r} (in {device!r}); use one of: {_USAGE}")
    return Device(framework, target or None)


# The pip extra of each optional framework; cupy has none: its wheel depends on the CUDA version.
_EXTRAS = {"torch": "torch", "jax": "jax"}
_CUPY_INSTALL = "pip install cupy-cuda12x, or the cupy build for your CUDA version"


def import_framework(name: str) -> Any:
    """Import an optional framework, or raise `MissingDependencyError` saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise _missing(name) from None


def _missing(name: str) -> MissingDependencyError:
    # cupy has no extra to name: say which wheel to pick instead
    return MissingDependencyError(name, extra=_EXTRAS.get(name), purpose=f"use {name} devices",
                                  install=_CUPY_INSTALL if name == "cupy" else None)


def is_floating(dtype: np.dtype) -> bool:
    """True for float, bfloat16 and float8/6/4 types: the ones a model-wide ``dtype=`` converts."""
    return dtype.kind == "f" or dtype in ML_FLOATS


# ml_dtypes types (bfloat16, float8_*): frameworks that cannot wrap them get same-width integers.
# (Tested by membership: ml_dtypes gives most of them numpy kind "V" but float8_e5m2 kind "f".)
ML_FLOATS = frozenset(row.numpy for row in TABLE if row.numpy.type.__module__.startswith("ml_dtypes"))
