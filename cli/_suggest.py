"""Hints for a ``--filter`` that matches nothing: the pattern the user probably meant."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["filter_hints"]

MAX_HINTS = 3


def filter_hints(names: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """Patterns that would match some of `names`, for `patterns` that match none.

    A pattern that matches the names after a prefix they share (``encoder.layer.0.*`` against
    ``bert.encoder.layer.0.…``) is suggested under that prefix, most common first, and with a
    leading ``*``; failing that, the names closest to the pattern's literal part (difflib).
    """
    from fnmatch import fnmatchcase  # only when a filter matched nothing

    hints: dict[str, None] = {}
    for pattern in patterns:
        prefixes: Counter[str] = Counter()
        for name in names:
            for i, char in enumerate(name):
                if char == "." and fnmatchcase(name[i + 1:], pattern):
                    prefixes[name[: i + 1]] += 1
                    break
        for prefix, _ in prefixes.most_common(MAX_HINTS - 1):
            hints[prefix + pattern] = None
        if prefixes and not pattern.startswith("*"):
            hints["*" + pattern] = None
    if hints:
        return list(hints)[:MAX_HINTS]
    return _close_names(names, patterns)


def _close_names(names: Sequence[str], patterns: Sequence[str]) -> list[str]:
    import difflib

    found: dict[str, None] = {}
    for pattern in patterns:
        literal = pattern.replace("*", "").replace("?", "")
        for name in difflib.get_close_matches(literal, names, n=MAX_HINTS, cutoff=0.5):
            found[name] = None
    return list(found)[:MAX_HINTS]
