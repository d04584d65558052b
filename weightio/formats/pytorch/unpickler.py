"""The allowlist unpickler: CPython's C unpickler whose only source of globals is the allowlist
(`weightio.formats.pytorch.allowlist.ALLOWLIST`), run on a pickle the lexer (`.lexer.prepass`)
has already checked, its Python 2 strings rewritten as torch decodes them (`.py2_strings`).
See the lexer's module docstring for the whole pipeline.

In placeholder mode (`placeholders`, which the reader opens around a file's pickles) a global off
the allowlist becomes an inert placeholder class of that file (`.placeholders`) instead of an
`UnsafePickleError`.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import pickle
from collections.abc import Callable, Iterator
from typing import Any, cast

from ... import limits as _limits
from ...errors import Advice, CorruptFileError, UnsafePickleError, WeightioError
from ..base import check_unknown_globals
from .allowlist import ALLOWLIST
from .lexer import lex
from .placeholders import OVERRIDES, Placeholders, overrides
from .py2_strings import rewrite

__all__ = ["Unpickler", "load", "placeholder_mode", "placeholders", "stream"]

OVERRIDES.update(overrides(ALLOWLIST))
_placeholders: contextvars.ContextVar[Placeholders | None] = contextvars.ContextVar("weightio_placeholders",
                                                                                    default=None)


@contextlib.contextmanager
def placeholders(mode: str) -> Iterator[Placeholders | None]:
    """Within the block, pickles read in `mode`: ``"refuse"`` (unknown globals raise
    `UnsafePickleError`) or ``"placeholder"`` (they become the yielded file's `Placeholders`)."""
    registry = Placeholders() if check_unknown_globals(mode) == "placeholder" else None
    token = _placeholders.set(registry)
    try:
        yield registry
    finally:
        _placeholders.reset(token)


def placeholder_mode() -> bool:
    """Whether the pickles read here are in placeholder mode (see `placeholders`)."""
    return _placeholders.get() is not None


def stream(data: bytes) -> io.BufferedReader:
    """`data` (a checked pickle, its FRAMEs dropped by `.py2_strings.rewrite`) as the stream CPython's
    C unpickler reads fastest: one with ``peek()``, read in prefetched blocks as it reads a file.
    From a bare `BytesIO` it makes one ``read()`` call per opcode argument (twice as slow: 100k
    tensors, 650 against 343 ms)."""
    return io.BufferedReader(io.BytesIO(data))


class Unpickler(pickle.Unpickler):
    """CPython's unpickler with the allowlist as its only source of globals.

    Args:
        data: the pickle's bytes, checked by the lexer (`load` checks them).
        persistent_load: turns a persistent id into a stand-in (the container's storages).
        text8: the offsets of 8-bit strings and FRAMEs the lexer noted: the pickle is unpickled as
            `.py2_strings.rewrite` leaves it, its FRAMEs dropped (CPython could otherwise read other
            bytes than the lexer did).
    """

    def __init__(self, data: bytes, persistent_load: Callable[[Any], Any], text8: list[int]) -> None:
        super().__init__(stream(rewrite(data, text8)), encoding="latin1")
        # the C unpickler's slot: called directly per id (an instance attribute, where typeshed declares a method)
        self.persistent_load = persistent_load  # type: ignore[method-assign]
        self.placeholders = _placeholders.get()

    def find_class(self, module: str, name: str) -> Any:
        standin = ALLOWLIST.get((module, name))
        if self.placeholders is not None:
            return self._placeholder_mode(module, name, standin)
        if standin is None:
            raise UnsafePickleError(f"the pickle asks for global '{_printable(module)}.{_printable(name)}', which "
                                    "is not on weightio's allowlist; nothing was imported or run",
                                    advice=PLACEHOLDER_ADVICE)
        return standin

    def _placeholder_mode(self, module: str, name: str, standin: Any) -> Any:
        override = OVERRIDES.get((module, name))
        if override is not None:
            return override
        if standin is not None:
            return standin
        if not (isinstance(module, str) and isinstance(name, str)):
            raise UnsafePickleError("a global whose module or name is not a string; refused")
        return cast(Placeholders, self.placeholders).get(module, name)  # (placeholder mode: find_class checked)


def _printable(text: str) -> str:
    text = text if len(text) <= 200 else text[:200] + "…"
    return text if text.isprintable() else repr(text)[1:-1]


# CPython's words for an opcode applied to an object it cannot take, and what they mean here.
# (Prefixes: CPython versions word some of them differently.)
_EXPLAINED = {
    "NEWOBJ class argument isn't a type": "NEWOBJ on something that is not a class (of the allowlist, only "
                                          "argparse.Namespace is built by NEWOBJ)",
    "NEWOBJ class argument must be a type": "NEWOBJ on something that is not a class (of the allowlist, only "
                                            "argparse.Namespace is built by NEWOBJ)",
    "NEWOBJ expected an arg tuple": "NEWOBJ with arguments that are not a tuple",
    "state is not a dictionary": "BUILD with a state that is not a dict",
    "slot state is not a dictionary": "BUILD with a slot state that is not a dict",
}

PLACEHOLDER_ADVICE = Advice(python="to read its tensors without running it, pass unknown_globals='placeholder'",
                            cli="to read its tensors without running it, pass --unknown-globals placeholder")

_MALFORMED = (pickle.UnpicklingError, ValueError, TypeError, AttributeError, KeyError, IndexError, EOFError,
              OverflowError, UnicodeError, MemoryError, RecursionError)


def load(data: bytes, persistent_load: Callable[[Any], Any], *, path: str | None = None,
         what: str = "the pickle", checked: bool = False, limits: _limits.Limits | None = None,
         text8: list[int] | None = None) -> Any:
    """Check `data` with the lexer (unless `checked`: it already was, and `text8` is the ``text8``
    it noted), then unpickle it with the allowlist `Unpickler`, Python 2 strings decoded as torch
    decodes them (`.py2_strings`). `data` must hold exactly one pickle.

    Raises:
        UnsafePickleError: a global outside the allowlist, or a refused construct.
        CorruptFileError: anything malformed (CPython's own errors included).
    """
    if checked:
        if text8 is None:  # without it, FRAMEs would reach CPython: see `.py2_strings`
            raise TypeError("load(checked=True) needs the text8 its lexer noted")
        end = len(data)
    else:
        lexed = lex(data, path=path, what=what, limits=limits)
        end, text8 = lexed.pos, lexed.text8
    if end != len(data):
        raise CorruptFileError(f"{what}: {len(data) - end:,} bytes follow its STOP opcode", path=path)
    try:
        return Unpickler(data, persistent_load, text8).load()
    except WeightioError as e:
        raise type(e)(f"{what}: {e.problem}", path=path, tensor=e.tensor, advice=e.advice) from None
    except _MALFORMED as e:
        lex(data, path=path, what=what, limits=limits)  # the exact lexer names what is wrong, when it can
        why = next((v for k, v in _EXPLAINED.items() if str(e).startswith(k)), None)
        cause = f"{type(e).__name__}: {_printable(str(e))}"
        message = f"{what} is malformed: {why} ({cause})" if why else f"{what} is malformed ({cause})"
        raise CorruptFileError(message, path=path) from None
