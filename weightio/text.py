"""Bounded, printable text for every number and name that reaches a message or a display.

Two hazards come with text read from a file, and both are closed here, once:

* **Numbers of any size.** Python refuses to turn an int of more than 4300 digits into a string
  (``ValueError: Exceeds the limit``), and a pickle, an ``.npy`` header (hexadecimal literals) or
  a product of JSON dimensions can hold one. `number` gives the exact digits up to 2^256 and a
  short approximation beyond (``~1.23e4000``), computed from the bit length, never by ``str()``.
  `dims` formats a shape the same way. Every number from a file that goes into an error
  message, a ``repr`` or the command line's output goes through one of them.
* **Terminal control.** A tensor name, a metadata value, a pickle global or a file name can
  hold ESC, BEL, C1 controls, bidirectional overrides or lone surrogates: printed as they are,
  they repaint the screen (a verdict, a prompt) or make the output unencodable. `printable`
  escapes them (``\\x1b``, ``\\u202e``, ``\\udc80``) and is what the command line applies to
  everything it prints.

This is a core module (docs/architecture.md): it imports nothing of weightio.

Example:
    >>> number(10**5000)
    '~1.00e5000'
    >>> dims((2, 3)), dims((4,), "()")
    ('[2, 3]', '(4,)')
    >>> printable("w\\x1b]0;pwned\\x07")
    'w\\\\x1b]0;pwned\\\\x07'
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from itertools import islice

__all__ = ["EXACT_BITS", "number", "dims", "describe", "printable", "needs_escape", "CONTROL"]

EXACT_BITS = 256  # ints up to this many bits are written out exactly (78 digits); larger ones approximated
_LOG10_2 = math.log10(2)

# What a terminal may act on, or cannot encode: C0 controls (tab and newline are the caller's
# choice), DEL, C1 controls (0x9b is a one-byte CSI on some terminals), the bidirectional
# embeddings, overrides and isolates (they reorder what is shown: "Trojan Source"), the line and
# paragraph separators, and lone surrogates (from surrogateescape-decoded bytes, or \\ud800 escapes).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
CONTROL = re.compile(f"[\t\n{_UNSAFE}]")  # every character `printable` can escape
_CONTROL_KEEP_LINES = re.compile(f"[{_UNSAFE}]")
# The ASCII characters of each: the whole test for ASCII text, in one C pass (`bytes.translate`
# deletes them; `re` scans ~10x slower, ~90 ms for a 100k-tensor listing)
_ASCII_CONTROL = bytes([*range(0x20), 0x7F])
_ASCII_CONTROL_KEEP_LINES = bytes(c for c in _ASCII_CONTROL if c not in b"\t\n")


def number(n: int, *, grouping: bool = False) -> str:
    """`n` in decimal when it has at most `EXACT_BITS` bits, else ``~d.dde<exponent>``.

    Args:
        grouping: thousands separators (``4,294,967,296``), as ``f"{n:,}"``.
    """
    n = int(n)
    bits = n.bit_length()
    if bits <= EXACT_BITS:
        return f"{n:,}" if grouping else str(n)
    sign = "-" if n < 0 else ""
    top = abs(n) >> (bits - 64)  # the leading 64 bits carry all the precision a float has
    exponent10 = math.log10(top) + (bits - 64) * _LOG10_2
    whole = math.floor(exponent10)
    mantissa = 10 ** (exponent10 - whole)
    if mantissa >= 9.995:  # rounds up to 10.00
        mantissa, whole = 1.0, whole + 1
    return f"{sign}~{mantissa:.2f}e{whole}"


def dims(shape: Iterable[int], brackets: str = "[]") -> str:
    """A shape as ``[2, 3]`` (``brackets="()"``: as Python writes a tuple, ``(4,)``), each
    dimension through `number`."""
    items = [number(d) if isinstance(d, int) else repr(d) for d in shape]
    if brackets == "()" and len(items) == 1:
        return f"({items[0]},)"
    return brackets[0] + ", ".join(items) + brackets[1]


def describe(value: object, limit: int = 80) -> str:
    """A bounded one-line ``repr`` of a plain value read from a file (a parsed header literal, a JSON
    value): ints through `number`, at most 4 items of a container and 2 levels deep, cut to `limit`
    characters. Never formats a whole large container, never fails on a huge int."""
    text = _describe(value, 2)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(value: object, depth: int) -> str:
    if isinstance(value, (bool, float, complex)) or value is None or value is Ellipsis:
        return repr(value)
    if isinstance(value, int):
        return number(value)
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[:60]) + ("…" if len(value) > 60 else "")
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        if depth == 0 and value:
            return f"<{type(value).__name__} of {len(value):,}>"
        items = list(islice(value.items() if isinstance(value, dict) else value, 4))
        if isinstance(value, dict):
            body = ", ".join(f"{_describe(k, depth - 1)}: {_describe(v, depth - 1)}" for k, v in items)
        else:
            body = ", ".join(_describe(v, depth - 1) for v in items)
        body += ", …" if len(value) > 4 else ""
        if isinstance(value, tuple):
            return f"({body},)" if len(value) == 1 else f"({body})"
        if isinstance(value, (set, frozenset)):
            return "{" + body + "}" if value else f"{type(value).__name__}()"
        return f"[{body}]" if isinstance(value, list) else "{" + body + "}"
    return f"<{type(value).__name__}>"


def printable(text: str, *, lines: bool = False, json: bool = False) -> str:
    """`text` with every control character escaped as Python writes it (``\\x1b``, ``\\u202e``).

    Args:
        lines: keep newlines and tabs (for whole blocks of output); by default they are escaped
            too, so that one field (a tensor name) stays on one line.
        json: escape as JSON does (``\\u001b``), for text that is a JSON document: its strings
            then hold the same values.
    """
    if not needs_escape(text, lines=lines):  # the common case: nothing to do, no copy
        return text
    return (_CONTROL_KEEP_LINES if lines else CONTROL).sub(_escape_json if json else _escape, text)


def needs_escape(text: str, *, lines: bool = False) -> bool:
    """Whether `printable` would change `text` (`lines` as there).

    Every character it escapes is one ``str.isprintable`` refuses, and in ASCII text exactly a C0
    control or DEL: ASCII text is tested by deleting those (`bytes.translate`), other text is
    scanned only when ``isprintable`` finds something.
    """
    if not isinstance(text, str):
        raise TypeError(f"needs_escape takes a str, not {type(text).__name__}")
    if text.isascii():
        raw = text.encode("ascii")
        return len(raw.translate(None, _ASCII_CONTROL_KEEP_LINES if lines else _ASCII_CONTROL)) != len(raw)
    return not text.isprintable() and (_CONTROL_KEEP_LINES if lines else CONTROL).search(text) is not None


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x09:
        return "\\t"
    if code == 0x0A:
        return "\\n"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escape_json(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"
