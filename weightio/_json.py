"""Strict JSON for headers and index files: one meaning per document.

Reference parsers disagree on duplicate keys (last wins, first wins, error) and on the
non-standard literals ``NaN``/``Infinity``; a file that parses differently in two tools is a
way to smuggle a tensor past a reviewer. Both are refused here.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .errors import CorruptFileError

__all__ = ["FAST_FROM", "decode_utf8", "fast_json", "parse_json_object"]


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON literal {name}")


def _no_duplicates(text: str, parsed: dict[str, Any]) -> bool:
    """True when `text`, parsed keeping the last of equal keys into `parsed`, provably had no
    duplicate key: outside strings JSON has one ':' per object member, so the text's ':' count
    is (members written) + (':' inside strings); a repeated key drops a member (and maybe
    strings), so the counts differ. ``\\u`` escapes could spell a ':': not decided here. A text
    with exactly one ':' per member kept proves it alone (no string holds one, none was dropped),
    without joining every string to count them (the members first, the strings only when it differs)."""
    if "\\u" in text:
        return False
    try:
        colons = text.count(":")
        return colons == _colons(parsed, strings=False) or colons == _colons(parsed)
    except (RecursionError, _Undecided):
        return False


class _Undecided(Exception):
    """A float: the document goes to the standard parser (floats are rare in these files, and how
    two parsers read one, out of range say, is not compared here; integers both read exactly)."""


def _colons(value: Any, strings: bool = True) -> int:
    """Object members plus (with `strings`) the ':' inside strings, over a parsed JSON value
    (`_Undecided` at a float)."""
    kind = type(value)
    if kind is str:
        return value.count(":") if strings else 0
    if kind is dict:
        values = list(value.values())
        if set(map(type, values)) <= {str}:  # (a weight_map: in C)
            inside = "".join(values).count(":") if strings else 0
        else:
            inside = sum(_colons(v, strings) for v in values)
        return len(value) + ("".join(value).count(":") if strings else 0) + inside
    if kind is list:
        return sum(_colons(v, strings) for v in value)
    if kind is float:
        raise _Undecided
    return 0


# Made once: json.loads with hooks builds a decoder per call, a few µs of every small header's open.
# The standard library shares its own default decoder between threads the same way.
_PLAIN = json.JSONDecoder(parse_constant=_no_constants)
_CHECKING = json.JSONDecoder(object_pairs_hook=_pairs_no_duplicates, parse_constant=_no_constants)


def decode_utf8(data: bytes, *, path: str, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"{what} is not valid UTF-8 (byte {e.start})", path=path) from None


_msgspec: Any = None  # the msgspec module; False where it is not installed (looked up on first use)
# Text length from which msgspec is imported: its import (~16 ms on a 2-CPU VM, typing_extensions
# included) is repaid by ~10 µs a kB parsed (~20 with a typed safetensors header) only from about here.
# Once it is imported (by us or anyone), every text goes to it.
FAST_FROM = 1 << 20


def fast_json(text: str) -> Any:
    """The msgspec module when `text` is worth parsing with it (see `FAST_FROM`), else None (also
    where msgspec is not installed)."""
    global _msgspec
    if _msgspec is None:
        if len(text) < FAST_FROM and "msgspec" not in sys.modules:
            return None  # importing it would cost more than it saves on this text
        try:
            import msgspec
        except ImportError:
            _msgspec = False
        else:
            _msgspec = msgspec
    return _msgspec or None


def _fast_loads(text: str) -> Any:
    """`text` parsed by msgspec (about 1.5 times as fast as the standard library on safetensors
    headers and index files, integers of any size read exactly), or None where msgspec is not
    used for it or refuses the text: the standard parser then says exactly what is wrong.
    msgspec keeps the last of two equal keys: callers prove there were none (`_colons`)."""
    msgspec = fast_json(text)
    if msgspec is None:
        return None
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):  # (a ValidationError is a DecodeError)
        return None


def parse_json_object(data: bytes | str, *, path: str, what: str, check_duplicates: bool = True) -> dict[str, Any]:
    """Parse `data` as a UTF-8 JSON object with no NaN/Infinity literals and no duplicate keys.

    Args:
        check_duplicates: False skips the duplicate check; a caller that passes False must prove
            the absence of duplicates another way (see `weightio.formats.safetensors`), and parse
            again with True when it cannot. Either way a large text is parsed with msgspec where it
            is installed (duplicates then proved absent by counting colons), else (or when msgspec
            refuses it, or the count cannot decide) with the standard library's parser, whose
            per-object hook finds duplicates.

    Raises:
        CorruptFileError: naming `what` (``"header"``, ``"index"``) and the problem.
    """
    text = data if isinstance(data, str) else decode_utf8(data, path=path, what=what)
    obj = _fast_loads(text)
    if isinstance(obj, dict) and (not check_duplicates or _no_duplicates(text, obj)):
        return obj
    try:
        if text.startswith("\ufeff"):  # what json.loads says (its decoders do not look)
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        obj = (_CHECKING if check_duplicates else _PLAIN).decode(text)
    except _Duplicate as e:
        raise CorruptFileError(f"{what} has the key {e.key!r} twice", path=path) from None
    except RecursionError:
        raise CorruptFileError(f"{what} nests too deeply", path=path) from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise CorruptFileError(f"{what} is not valid JSON: {e}", path=path) from None
    if not isinstance(obj, dict):
        raise CorruptFileError(f"{what} must be a JSON object, found {type(obj).__name__}", path=path)
    return obj
