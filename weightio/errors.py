"""The error hierarchy: every failure weightio reports is one of these.

```
WeightioError
├── FormatError            unknown or unsupported format / version
├── CorruptFileError       truncated, inconsistent or malformed file (offsets, sizes, counts)
├── UnsafePickleError      a pickle asks for a global outside the allowlist; nothing is run
├── TensorNotFoundError    also a KeyError; suggests close names
├── ShapeMismatchError     VarBuilder.get with the wrong shape; says expected vs found
├── UnsupportedDTypeError  a dtype weightio (or the target format) cannot represent
├── InputError             also an OSError: a path that cannot be opened (missing, no permission, a FIFO);
│                          with errno ENOENT/EACCES/EISDIR/ENOTDIR also FileNotFoundError … (Input*Error)
├── WriteError             also an OSError: an output could not be written (exists, is an input, disk full);
│                          with errno EEXIST/EACCES/EISDIR/ENOTDIR also FileExistsError … (Write*Error)
├── UsageError             also a ValueError: a caller's mistake (bad argument, conflicting options)
└── MissingDependencyError also an ImportError: an optional extra is needed; names the extra to install
```

`FormatError` and `CorruptFileError` are about a file; `UsageError` and `MissingDependencyError`
are about the call: ``except FormatError`` never catches "install torch".

Every error carries the file (`path`) and the tensor (`tensor`) it is about when there is one,
and renders them in its message: ``model.safetensors: tensor 'w': data_offsets …``.

An error whose fix is an argument to pass carries it as `Advice`, spelled twice: for Python
(``pass overwrite=True to replace it``) and for the command line (``pass --force to replace it``).
``str(error)`` and ``error.message`` say the Python spelling; the ``weightio`` command prints
``error.render(cli=True)``.
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Advice",
    "CorruptFileError",
    "FormatError",
    "ShapeMismatchError",
    "TensorNotFoundError",
    "UnsafePickleError",
    "UnsupportedDTypeError",
    "InputError",
    "InputFileNotFoundError",
    "InputIsADirectoryError",
    "InputNotADirectoryError",
    "InputPermissionError",
    "MissingDependencyError",
    "UsageError",
    "WeightioError",
    "WeightioWarning",
    "WriteError",
    "WriteFileExistsError",
    "WriteIsADirectoryError",
    "WriteNotADirectoryError",
    "WritePermissionError",
]


@dataclass(frozen=True)
class Advice:
    """How to fix an error by passing something, in the words of each interface.

    Attributes:
        python: for callers of the library (``pass overwrite=True to replace it``).
        cli: for users of the ``weightio`` command (``pass --force to replace it``).
    """

    python: str
    cli: str


class WeightioError(Exception):
    """Base class of every error weightio raises on purpose.

    Args:
        message: what is wrong (and how to fix it, when the fix is no argument to pass).
        path: the file (or directory) the error is about.
        tensor: the tensor name the error is about.
        advice: the argument (Python) or option (command line) that fixes it; rendered after
            `message` in parentheses.

    Attributes:
        problem: `message` as given, without the advice.
        message: what ``str()`` shows after the path and tensor: `problem` and the Python advice.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        tensor: str | None = None,
        advice: Advice | None = None,
    ) -> None:
        self.problem = message
        self.advice = advice
        self.message = message if advice is None else f"{message} ({advice.python})"
        self.path = None if path is None else os.fspath(path)
        self.tensor = tensor
        super().__init__(self._render())

    def _render(self) -> str:
        prefix = ""
        if self.path is not None:
            prefix += f"{self.path}: "
        if self.tensor is not None:
            prefix += f"tensor {self.tensor!r}: "
        return prefix + self.message

    def render(self, *, cli: bool = False) -> str:
        """The message, with the advice spelled for the command line when `cli` (else as ``str()``)."""
        if not cli or self.advice is None:
            return self._render()
        return self._render()[: -len(self.message)] + f"{self.problem} ({self.advice.cli})"

    def __str__(self) -> str:  # KeyError subclasses would otherwise repr() the message
        return self._render()

    def __reduce__(self) -> tuple[Any, ...]:  # keep path/tensor/advice across processes (multiprocessing, pytest-xdist)
        return (_rebuild, (type(self), self.problem, self.path, self.tensor, self.advice))


def _rebuild(cls: type[WeightioError], message: str, path: str | None, tensor: str | None,
             advice: Advice | None = None) -> WeightioError:
    return cls(message, path=path, tensor=tensor, advice=advice)


class WeightioWarning(UserWarning):
    """Something in a file is tolerated but suspicious (unknown header fields, odd padding)."""


class FormatError(WeightioError):
    """The input is not a format weightio reads, or a version or feature it does not support."""


class CorruptFileError(WeightioError):
    """The file claims something its bytes do not hold: truncated, inconsistent or malformed."""


class UnsafePickleError(WeightioError):
    """A pickle asks for a global outside the allowlist. Nothing was imported or run."""


class UnsupportedDTypeError(WeightioError):
    """A dtype weightio, numpy or the target format cannot represent."""


class ShapeMismatchError(WeightioError):
    """A tensor was asked for with a shape it does not have."""


class _OSErrorByErrno(WeightioError, OSError):
    """An `OSError` that, like `OSError` itself, is made as the standard subclass its `errno` names
    (ENOENT: `FileNotFoundError`, EACCES/EPERM: `PermissionError` …): ``InputError(…, errno=ENOENT)``
    is an `InputFileNotFoundError`, so ``except FileNotFoundError`` catches a missing checkpoint."""

    _by_errno: dict[int, type] = {}

    def __new__(cls, message: str, *, path: str | os.PathLike[str] | None = None, tensor: str | None = None,
                errno: int | None = None, advice: Advice | None = None) -> _OSErrorByErrno:
        made = cls._by_errno.get(errno, cls) if errno is not None else cls
        return super().__new__(made if issubclass(made, cls) else cls, message)  # a subclass asked for stays it

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None, tensor: str | None = None,
                 errno: int | None = None, advice: Advice | None = None) -> None:
        super().__init__(message, path=path, tensor=tensor, advice=advice)
        self.errno = errno

    def __reduce__(self) -> tuple[Any, ...]:  # keeps errno too
        return (_rebuild_os, (type(self), self.problem, self.path, self.tensor, self.errno, self.advice))


def _rebuild_os(cls: type, message: str, path: str | None, tensor: str | None, errno: int | None,
                advice: Advice | None = None) -> WeightioError:
    return cls(message, path=path, tensor=tensor, errno=errno, advice=advice)


class InputError(_OSErrorByErrno):
    """A path cannot be read: missing, unreadable, or not a regular file. Also an `OSError`.

    `errno` is the operating system's code when there is one; with ENOENT, EACCES/EPERM, EISDIR or
    ENOTDIR the error is also the standard `FileNotFoundError`, `PermissionError`,
    `IsADirectoryError` or `NotADirectoryError` (`InputFileNotFoundError` …).
    """


class WriteError(_OSErrorByErrno):
    """An output could not be written; the destination is left as it was. Also an `OSError`.

    `errno` is the operating system's code (ENOSPC, EFBIG, EACCES, …) when there is one; with
    EEXIST, EACCES/EPERM, EISDIR or ENOTDIR the error is also the standard `FileExistsError`,
    `PermissionError`, `IsADirectoryError` or `NotADirectoryError` (`WriteFileExistsError` …).
    """


class InputFileNotFoundError(InputError, FileNotFoundError):
    """`InputError` with errno ENOENT: also a `FileNotFoundError`."""


class InputPermissionError(InputError, PermissionError):
    """`InputError` with errno EACCES or EPERM: also a `PermissionError`."""


class InputIsADirectoryError(InputError, IsADirectoryError):
    """`InputError` with errno EISDIR: also an `IsADirectoryError`."""


class InputNotADirectoryError(InputError, NotADirectoryError):
    """`InputError` with errno ENOTDIR: also a `NotADirectoryError`."""


class WriteFileExistsError(WriteError, FileExistsError):
    """`WriteError` with errno EEXIST: also a `FileExistsError`."""


class WritePermissionError(WriteError, PermissionError):
    """`WriteError` with errno EACCES or EPERM: also a `PermissionError`."""


class WriteIsADirectoryError(WriteError, IsADirectoryError):
    """`WriteError` with errno EISDIR: also an `IsADirectoryError`."""


class WriteNotADirectoryError(WriteError, NotADirectoryError):
    """`WriteError` with errno ENOTDIR: also a `NotADirectoryError`."""


InputError._by_errno = {_errno.ENOENT: InputFileNotFoundError, _errno.EACCES: InputPermissionError,
                        _errno.EPERM: InputPermissionError, _errno.EISDIR: InputIsADirectoryError,
                        _errno.ENOTDIR: InputNotADirectoryError}
WriteError._by_errno = {_errno.EEXIST: WriteFileExistsError, _errno.EACCES: WritePermissionError,
                        _errno.EPERM: WritePermissionError, _errno.EISDIR: WriteIsADirectoryError,
                        _errno.ENOTDIR: WriteNotADirectoryError}


# Advice more than one module gives
OVERWRITE_ADVICE = Advice(python="pass overwrite=True to replace it", cli="pass --force to replace it")
PARENTS_ADVICE = Advice(python="pass parents=True to create it", cli="pass --parents to create it")
DOWNLOAD_ADVICE = Advice(python="drop download=True", cli="drop --download")
STORAGE_OPTIONS_ADVICE = Advice(python="drop storage_options", cli="drop --storage-option")


class UsageError(WeightioError, ValueError):
    """A caller's mistake: a bad argument, an unknown device or option, conflicting options.

    Also a `ValueError`. The command line exits 2 for it, as for a bad option.
    """


class MissingDependencyError(WeightioError, ImportError):
    """An optional dependency is needed for what was asked and is not installed. Also an `ImportError`.

    Attributes:
        extra: the pip extra that installs it (``"torch"`` for ``pip install 'weightio[torch]'``),
            or None when the package is not one of weightio's extras.
    """

    def __init__(self, package: str, *, extra: str | None = None, purpose: str = "",
                 install: str | None = None) -> None:
        how = install or (f"pip install 'weightio[{extra}]'" if extra else f"pip install {package}")
        purpose = f" to {purpose}" if purpose else ""
        super().__init__(f"{package} is not installed; install it ({how}){purpose}")
        self.extra = extra
        self.name = package  # ImportError's attribute: the module that could not be imported

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_missing, (self.name, self.extra, self.message))


def _rebuild_missing(package: str, extra: str | None, message: str) -> MissingDependencyError:
    err = MissingDependencyError(package, extra=extra)
    err.message = err.problem = message
    err.args = (message,)
    return err


_LISTED_NAMES = 8  # a missing tensor's message lists every name of a checkpoint holding this many or fewer


def _few_names(names: list[str], path: str | os.PathLike[str] | None) -> str:
    if len(names) > 1:
        return "its tensors are " + ", ".join(repr(n) for n in names)
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0] if path is not None else None
    return f"its one tensor is {names[0]!r}" + (" (named after the file)" if names[0] == stem else "")


class TensorNotFoundError(WeightioError, KeyError):
    """No tensor of that name. Also a `KeyError`, so `Mapping` semantics hold.

    Attributes:
        suggestions: the closest existing names, best first.
    """

    def __init__(
        self,
        name: str,
        candidates: Iterable[str] = (),
        *,
        path: str | os.PathLike[str] | None = None,
        message: str | None = None,
    ) -> None:
        pool = candidates if isinstance(candidates, (list, tuple, dict)) else list(candidates)
        self.suggestions = close_matches(name, pool)
        advice = None
        if message is None:
            message = "no such tensor"
            if self.suggestions:
                message += "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
            elif 0 < len(pool) <= _LISTED_NAMES:  # nothing close, but few: name them all (an .npy's one tensor)
                message += "; " + _few_names(list(pool), path)
            elif pool:
                message += f"; none of its {len(pool):,} names is close"
                advice = Advice(python="list(ckpt) lists them", cli="weightio inspect lists them")
        super().__init__(message, path=path, tensor=name, advice=advice)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_not_found, (self.tensor, self.suggestions, self.path, self.message))


def _rebuild_not_found(name: str, suggestions: Any, path: str | None, message: str) -> TensorNotFoundError:
    err = TensorNotFoundError(name, (), path=path, message=message)
    err.suggestions = suggestions
    return err


def close_matches(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The `n` names in `candidates` most similar to `name`, best first.

    Matches on the whole dotted name first; when nothing is close, on the last component
    (so `encoder.layer.0.weight` suggests `bert.encoder.layer.0.weight`).
    """
    import difflib  # only on a miss: keeps `import weightio` cheap

    if not isinstance(name, str):
        return []
    pool = list(candidates)
    # difflib compares every candidate (~0.1 ms each: 10 s over DeepSeek-V3's 92k names); of a large
    # pool, only the names that share the most dotted components with `name` are compared
    near = _nearest_by_components(name, pool) if len(pool) > _COMPARED else pool
    found = difflib.get_close_matches(name, near, n=n, cutoff=0.6)
    if found:
        return found
    suffix_hits = [c for c in pool if c.endswith("." + name) or name.endswith("." + c)]
    return sorted(suffix_hits, key=len)[:n]


_COMPARED = 1000  # the most candidates difflib compares


def _nearest_by_components(name: str, pool: list[str]) -> list[str]:
    """The `_COMPARED` names of `pool` with the most dotted components equal to `name`'s, in the
    same places counted from the start or from the end (a typo changes one component and leaves
    the others: ``layers.3.mlp.expert.7.w`` keeps its layer, its expert and its weight; a missing
    or extra prefix shifts them all), less one for each component more or fewer."""
    import heapq

    parts = name.split(".")
    backwards = parts[::-1]

    def shared(candidate: str) -> int:
        other = candidate.split(".")
        return (max(sum(map(str.__eq__, parts, other)), sum(map(str.__eq__, backwards, reversed(other))))
                - abs(len(other) - len(parts)))

    return heapq.nlargest(_COMPARED, pool, key=shared)
