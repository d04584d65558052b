"""Resource limits for reading untrusted files: one table, settable per call, per context or per process.

Readers check every count, length and offset a file claims against the bytes it actually has;
these limits bound what a *well-formed but huge* file may make weightio spend while opening it
(header bytes parsed, tensors indexed, name lengths) or while reading it (bytes inflated).
A file beyond a limit is refused with a `CorruptFileError` that names the limit and how to raise it.

| field              | default      | environment variable            | what it bounds                           |
|--------------------|--------------|---------------------------------|------------------------------------------|
| ``header_bytes``   | 100 000 000  | ``WEIGHTIO_MAX_HEADER_BYTES``   | bytes of header one file may have: the   |
|                    |              |                                 | safetensors JSON, GGUF key/values and    |
|                    |              |                                 | tensor infos, ggml hparams + vocabulary; |
|                    |              |                                 | also caps ``npy_header_bytes``           |
| ``npy_header_bytes`` | 10 000     | ``WEIGHTIO_MAX_NPY_HEADER_BYTES`` | the Python-literal header of an ``.npy`` |
|                    |              |                                 | file or ``.npz`` member (numpy's limit)  |
| ``tensors``        | 1 000 000    | ``WEIGHTIO_MAX_TENSORS``        | tensors (and zip members) in one file    |
| ``name_bytes``     | 65 535       | ``WEIGHTIO_MAX_NAME_BYTES``     | one tensor name or metadata key (UTF-8)  |
| ``array_depth``    | 8            | ``WEIGHTIO_MAX_ARRAY_DEPTH``    | GGUF metadata arrays nested in arrays    |
| ``nesting_depth``  | 1 000        | ``WEIGHTIO_MAX_NESTING_DEPTH``  | nested containers in a pickle            |
| ``pickle_opcodes`` | 16 777 216   | ``WEIGHTIO_MAX_PICKLE_OPCODES`` | opcodes in one pickle                    |
| ``pickle_stack``   | 100 000      | ``WEIGHTIO_MAX_PICKLE_STACK``   | objects on a pickle's stack at once      |
| ``inflated_bytes`` | none         | ``WEIGHTIO_MAX_INFLATED_BYTES`` | bytes one compressed member may inflate  |
|                    |              |                                 | to (deflated ``.npz`` members, PyTorch   |
|                    |              |                                 | records); always at most what the member |
|                    |              |                                 | declares and deflate can produce         |

The defaults are the limits each reader had before they were gathered here (safetensors'
reference limit on header length, numpy's on ``.npy`` headers, the GGUF spec's on key length,
…): no real checkpoint comes near them. Lower them to serve files from strangers with a small
memory budget; raise one only for a file you trust.

Where the limits in force come from, first match wins:

1. ``weightio.open(path, limits=Limits(...))`` for that call;
2. ``with weightio.limits.using(header_bytes=1 << 20): ...`` for the current thread or task
   (a `contextvars.ContextVar`: other threads keep their own);
3. the ``WEIGHTIO_MAX_*`` environment variables (``100MB``, ``1GiB``, ``1_000_000`` are all valid);
4. the defaults above.

The CLI takes ``--max-header-bytes`` on every command that opens files.

Example:
    >>> import weightio as wio
    >>> with wio.limits.using(header_bytes=1 << 20, tensors=10_000):   # doctest: +SKIP
    ...     ckpt = wio.open("upload.safetensors")
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

from .errors import Advice, CorruptFileError, UsageError, WeightioError

__all__ = [
    "Limits", "DEFAULTS", "ENVIRONMENT", "current", "using", "from_environment", "parse_size", "exceeded", "hint",
]


@dataclasses.dataclass(frozen=True)
class Limits:
    """The resource limits readers enforce (see the module docstring for each field).

    Every field is a non-negative int; ``inflated_bytes`` may be None (no limit beyond the
    member's declared size). Build one with keywords, or derive one with `replace`.

    Raises:
        UsageError: a field that is not a non-negative int (a `ValueError` too).
    """

    header_bytes: int = 100_000_000
    npy_header_bytes: int = 10_000
    tensors: int = 1_000_000
    name_bytes: int = 65_535
    array_depth: int = 8
    nesting_depth: int = 1_000
    pickle_opcodes: int = 1 << 24
    pickle_stack: int = 100_000
    inflated_bytes: int | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "inflated_bytes":
                continue
            if type(value) is not int or value < 0:  # bool is an int, and not a limit
                raise UsageError(f"limit {field.name} must be a non-negative int, got {value!r}")

    def replace(self, **changes: int | None) -> Limits:
        """A copy with some fields changed (unknown field names raise `TypeError`)."""
        # mypy checks each field's type against int | None (most are int); __post_init__ checks the values
        return dataclasses.replace(self, **cast("dict[str, Any]", changes))

    @property
    def npy_header(self) -> int:
        """The ``.npy`` header limit in force: `npy_header_bytes`, capped by `header_bytes`."""
        return min(self.npy_header_bytes, self.header_bytes)


DEFAULTS = Limits()
ENVIRONMENT = {field.name: "WEIGHTIO_MAX_" + field.name.upper() for field in dataclasses.fields(Limits)}
# os.environ's own dict holds the names encoded (POSIX): asking it first skips the ~2 us a miss costs
# through os.environ.get (a KeyError raised and caught), nine misses each time a file is opened
_ENCODED = {field: os.fsencode(variable) for field, variable in ENVIRONMENT.items()} if os.name == "posix" else {}

_override: contextvars.ContextVar[Limits | None] = contextvars.ContextVar("weightio_limits", default=None)
_SIZE = re.compile(r"\s*(\d[\d_]*(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str, *, fractions: bool = False) -> int:
    """A count from ``"1000000"``, ``"1_000_000"``, ``"100MB"`` (10^6) or ``"1GiB"`` (2^30); with
    `fractions`, also ``"1.5GB"`` (rounded down to a whole number). The one size parser of
    weightio: limits, the CLI's ``--max-header-bytes`` and ``convert --max-shard-size``.

    Raises:
        UsageError: the text is not a (whole, unless `fractions`) number with an optional unit
            (a `ValueError` too).
    """
    match = _SIZE.fullmatch(text)
    if match is None or ("." in match.group(1) and not fractions):
        raise UsageError(f"{text!r} is not a whole number with an optional unit (KB, MB, GB, KiB, MiB, GiB)")
    number, scale = match.group(1).replace("_", ""), _UNITS[(match.group(2) or "").lower().removesuffix("b")]
    whole, _, fraction = number.partition(".")  # integers only: exact ("2.01kB" is 2010), unlike a float
    return int(whole) * scale + int(fraction or "0") * scale // 10 ** len(fraction)


def from_environment(environ: Mapping[str, str] | None = None) -> Limits:
    """The defaults, changed by every ``WEIGHTIO_MAX_*`` variable that is set (and not empty).

    Raises:
        WeightioError: a variable that is not a size, naming it.
    """
    environ = os.environ if environ is None else environ
    changes: dict[str, int] = {}
    for field, variable in _maybe_set(environ):
        text = environ.get(variable)
        if text:
            try:
                changes[field] = parse_size(text)
            except ValueError as e:
                raise WeightioError(f"environment variable {variable}: {e}") from None
    return DEFAULTS.replace(**changes) if changes else DEFAULTS


def _maybe_set(environ: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    """The ``(field, variable)`` pairs of `ENVIRONMENT` that may be set in `environ`: every one, except in
    ``os.environ`` on POSIX, where only those its own dict of encoded names holds."""
    raw = getattr(environ, "_data", None) if environ is os.environ and _ENCODED else None
    if not isinstance(raw, dict):
        return ENVIRONMENT.items()
    return [(field, variable) for field, variable in ENVIRONMENT.items() if _ENCODED[field] in raw]


def current() -> Limits:
    """The limits in force here: a `using` block's, else the environment's, else the defaults."""
    override = _override.get()
    return override if override is not None else from_environment()


@contextlib.contextmanager
def using(limits: Limits | None = None, **changes: int | None) -> Iterator[Limits]:
    """Apply `limits` (or the current limits with `changes`) to every file opened in the block.

    Readers keep the limits they were opened with, so a checkpoint opened inside the block
    keeps them after it (for the bytes it inflates, say). Only this thread or asyncio task
    is affected.

    Raises:
        UsageError: `limits` is not a `Limits`, or a change is not a non-negative int.

    Example:
        >>> with using(tensors=1000) as active:       # doctest: +SKIP
        ...     wio.open("many.safetensors")          # CorruptFileError beyond 1000 tensors
    """
    if limits is not None and not isinstance(limits, Limits):
        raise UsageError(f"limits must be a weightio.Limits (Limits(tensors=...)), got {type(limits).__name__}")
    chosen = limits if limits is not None else current()
    if changes:  # (a Limits is frozen and checked when made: one without changes is used as it is)
        chosen = chosen.replace(**changes)
    token = _override.set(chosen)
    try:
        yield chosen
    finally:
        _override.reset(token)


def exceeded(what: str, value: int, field: str, limit: int, *, path: str | None = None,
             tensor: str | None = None, unit: str = "-byte") -> CorruptFileError:
    """The error for a file beyond a limit: says which limit, and how to raise it (`advice`).

    Example message: ``header length 200000000 exceeds the 100000000-byte limit (limits.header_bytes;
    raise it with weightio.limits.using(header_bytes=...), or WEIGHTIO_MAX_HEADER_BYTES if the file
    is trusted)``; the command line says ``(raise it with --max-header-bytes or
    WEIGHTIO_MAX_HEADER_BYTES if the file is trusted)``.
    """
    return CorruptFileError(f"{what} {value} exceeds the {limit}{unit} limit", path=path, tensor=tensor,
                            advice=advice(field))


def advice(field: str) -> Advice:
    """How to raise limit `field`, for Python callers and for the command line."""
    env = ENVIRONMENT[field]
    cli = f"--max-header-bytes or {env}" if field == "header_bytes" else env
    return Advice(python=f"limits.{field}; raise it with weightio.limits.using({field}=...), or {env} "
                         "if the file is trusted",
                  cli=f"raise it with {cli} if the file is trusted")


def hint(field: str) -> str:
    """``(limits.<field>; raise it with …)``: `advice` for Python, inline in a message of the
    lexers, whose errors are made deep inside them (the library's spelling; the environment
    variable it names works on the command line too)."""
    return f"({advice(field).python})"
