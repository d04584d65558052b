"""Strict JSON for headers and index files: one meaning per document.

Reference parsers disagree on duplicate keys (last wins, first wins, error) and on the
non-standard literals ``NaN``/``Infinity``; a file that parses differently in two tools is a
way to smuggle a tensor past a reviewer. Both are refused here.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import CorruptFileError

__all__ = ["IntegersOnly", "decode_utf8", "parse_json_object"]


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


def decode_utf8(data: bytes, *, path: str, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"{what} is not valid UTF-8 (byte {e.start})", path=path) from None


class IntegersOnly(Exception):
    """Raised by `parse_json_object(integers_only=True)` at the first non-integer number."""


def _reject_float(text: str) -> Any:
    raise IntegersOnly(text)


def parse_json_object(data: bytes | str, *, path: str, what: str, check_duplicates: bool = True,
                      integers_only: bool = False) -> dict[str, Any]:
    """Parse `data` as a UTF-8 JSON object with no NaN/Infinity literals and no duplicate keys.

    Args:
        check_duplicates: False skips the (costly) per-object duplicate check; a caller that
            passes False must prove the absence of duplicates another way (see
            `weightio.formats.safetensors` for the colon count), and parse again with True when
            it cannot.
        integers_only: raise `IntegersOnly` (not a `WeightioError`) at the first number with a
            fraction or exponent, for callers whose fast path needs every number to be an int.

    Raises:
        CorruptFileError: naming `what` (``"header"``, ``"index"``) and the problem.
    """
    text = data if isinstance(data, str) else decode_utf8(data, path=path, what=what)
    hook = _pairs_no_duplicates if check_duplicates else None
    try:
        obj = json.loads(text, object_pairs_hook=hook, parse_constant=_no_constants,
                         parse_float=_reject_float if integers_only else None)
    except _Duplicate as e:
        raise CorruptFileError(f"{what} has the key {e.key!r} twice", path=path) from None
    except RecursionError:
        raise CorruptFileError(f"{what} nests too deeply", path=path) from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise CorruptFileError(f"{what} is not valid JSON: {e}", path=path) from None
    if not isinstance(obj, dict):
        raise CorruptFileError(f"{what} must be a JSON object, found {type(obj).__name__}", path=path)
    return obj
