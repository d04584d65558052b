"""Python 2 strings in pickles, decoded as ``torch.load`` decodes them.

Python 2 pickled its 8-bit ``str`` with ``STRING`` (protocol 0: a quoted, escaped line),
``BINSTRING`` (a 4-byte length) and ``SHORT_BINSTRING`` (a 1-byte length); Python 3 never writes
them. Unpickling turns them into text with the unpickler's ``encoding``: ``torch.load`` passes
``encoding="utf-8"`` (its default, in both its ``weights_only`` unpickler, which knows only
``SHORT_BINSTRING``, and ``pickle``), so a Python 2 checkpoint's names and metadata read as UTF-8.
Bytes that are not UTF-8 make ``torch.load`` fail (``UnicodeDecodeError``); here they stay
``bytes``, so such a file still opens.

`rewrite` does this before CPython's unpickler sees the pickle: each 8-bit string opcode the
lexer noted (`.lexer`, ``text8``) becomes ``BINUNICODE`` of the same bytes when they are UTF-8,
else ``BINBYTES`` — the same stack effect, the same memo — and ``FRAME`` opcodes, mere read-ahead
hints, are dropped. They are dropped from every pickle that has them, strings or not: CPython's C
unpickler loads a frame with one ``read()`` when it is not in the block it holds, and where an
opcode runs past the frame's end it drops the frame's rest and reads on from other bytes than the
lexer walked (a different value, or opcodes hidden in a string's bytes). A pickle with neither is
used as it is. A malformed ``STRING`` is left for CPython to refuse.

Array data pickled as text (numpy arrays of Python 2 pickles) comes back to its bytes with
`text_bytes`.
"""

from __future__ import annotations

import codecs
import re
import struct

from ...errors import CorruptFileError

__all__ = ["rewrite", "text_bytes"]

_STRING, _BINSTRING, _SHORT_BINSTRING, _FRAME = b"S"[0], b"T"[0], b"U"[0], b"\x95"[0]


def rewrite(data: bytes, text8: list[int]) -> bytes:
    """`data` with its 8-bit strings and FRAMEs at offsets `text8` rewritten (see module doc)."""
    if not text8:
        return data
    out: list[bytes] = []
    pos = 0
    for at in text8:
        end, replacement = _replace(data, at)
        out += (data[pos:at], replacement)
        pos = end
    out.append(data[pos:])
    return b"".join(out)


def _replace(data: bytes, at: int) -> tuple[int, bytes]:
    """(end of the opcode at `at`, what replaces it)."""
    op = data[at]
    if op == _FRAME:
        return at + 9, b""
    if op == _SHORT_BINSTRING:
        start = at + 2
        end = start + data[at + 1]
    elif op == _BINSTRING:
        start = at + 5
        end = start + struct.unpack_from("<i", data, at + 1)[0]
    else:
        end = data.index(b"\n", at) + 1
        raw = _unquote(data[at + 1 : end - 1])
        return end, data[at:end] if raw is None else _text(raw)
    return end, _text(data[start:end])


def _unquote(line: bytes) -> bytes | None:
    """A protocol-0 STRING argument's bytes, as CPython reads them; None if CPython would refuse it."""
    if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
        return None
    try:
        return codecs.escape_decode(_ESCAPE.sub(_keep_unknown, line[1:-1]))[0]
    except ValueError:
        return None


# A backslash before a character that starts no escape stays a backslash, as CPython keeps it, but
# spelled as an escaped backslash: CPython also warns (DeprecationWarning), an error under -W error.
_ESCAPE = re.compile(rb"\\(.)", re.S)
_ESCAPES = frozenset(b"\\'\"abfnrtvx01234567\n")


def _keep_unknown(match: re.Match[bytes]) -> bytes:
    return match.group() if match.group(1)[0] in _ESCAPES else b"\\" + match.group()


def _text(raw: bytes) -> bytes:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return b"B" + struct.pack("<I", len(raw)) + raw  # BINBYTES
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def text_bytes(text: str, length: int) -> bytes:
    """The `length` bytes of array data pickled as text: a Python 2 string decoded from UTF-8
    (`rewrite`) gives them back encoded as UTF-8, latin-1 text (how weightio read those strings
    before) as latin-1. The two encodings differ in length whenever they differ at all (a
    character past U+007F takes one byte in latin-1, two or more in UTF-8), so at most one gives
    `length` bytes.

    Raises:
        CorruptFileError: neither does.
    """
    for encoding in ("latin-1", "utf-8"):
        try:
            raw = text.encode(encoding, "surrogatepass")
        except UnicodeEncodeError:
            continue
        if len(raw) == length:
            return raw
    raise CorruptFileError(f"numpy data pickled as text of {len(text):,} characters is not {length:,} bytes "
                           "in UTF-8 or latin-1")
