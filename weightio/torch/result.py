"""What `weightio.torch.load_into` returns: ``load_state_dict``'s pair, and the rest of the story.

`LoadResult` is an `IncompatibleKeys` (a ``(missing_keys, unexpected_keys)`` named tuple, as
``nn.Module.load_state_dict`` returns: it unpacks and compares as that pair) with more fields:
what was skipped for its shape, tied, ignored, where in the checkpoint the module was found, and
the device map used. ``str(result)`` is the table transformers prints after ``from_pretrained``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from ..text import printable

__all__ = ["IncompatibleKeys", "LoadResult"]

_NOTES = {
    "MISSING": "not in the checkpoint: the module keeps its own values (on meta: an error).",
    "UNEXPECTED": "stored, never used: fine when loading from another task/architecture.",
    "MISMATCH": "skipped for its size (ignore_mismatched_sizes=True): the module keeps its own values.",
    "TIED": "shares another name's tensor: loaded once.",
    "IGNORED": "stored names the model does not need (non-persistent or hub-era buffers, "
               "_keys_to_ignore_on_load_*).",
}
_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


class IncompatibleKeys(NamedTuple):
    """What ``nn.Module.load_state_dict`` returns: names the module has that the checkpoint lacked,
    and stored names the load did not use."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class LoadResult(IncompatibleKeys):
    """`IncompatibleKeys` plus the rest of a load's report.

    Attributes:
        missing_keys: module names no stored tensor matched (tied names never: one name of a
            tie is enough), less those ``_keys_to_ignore_on_load_missing`` ignores.
        unexpected_keys: stored names (under the sub-mapping used) never used, less the ignored ones.
        mismatched_keys: ``(name, stored shape, module shape)`` skipped by ``ignore_mismatched_sizes``.
        tied_keys: tied name -> the name whose tensor it shares.
        ignored_keys: stored (or missing) name -> why it was ignored.
        sub_mapping: the key of a training checkpoint the module was found under (``"state_dict"``), or "".
        wrapper_prefix: a wrapper's prefix of the stored names (``"module."``, ``"_orig_mod."``), or "".
        base_model_prefix: the base-model prefix resolution used (``"bert"``), or None.
        device_map: module prefix -> device, as placed (None without a device map).
        source: the checkpoint's path(s); module: the module's class name.

    Example:
        >>> missing, unexpected = result                                         # doctest: +SKIP
        >>> result.mismatched_keys                                               # doctest: +SKIP
        [('classifier.weight', (3, 32), (5, 32)), ('classifier.bias', (3,), (5,))]
    """

    # Set in __new__ (a NamedTuple subclass keeps its tuple fields; these live in the instance's __dict__).
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    tied_keys: dict[str, str]
    ignored_keys: dict[str, str]
    sub_mapping: str
    wrapper_prefix: str
    base_model_prefix: str | None
    device_map: dict[str, str] | None
    source: str
    module: str

    def __new__(cls, missing_keys: list[str], unexpected_keys: list[str], **fields: Any) -> LoadResult:
        self = super().__new__(cls, missing_keys, unexpected_keys)
        self.mismatched_keys = list(fields.get("mismatched_keys", ()))
        self.tied_keys = dict(fields.get("tied_keys", {}))
        self.ignored_keys = dict(fields.get("ignored_keys", {}))
        self.sub_mapping = str(fields.get("sub_mapping", ""))
        self.wrapper_prefix = str(fields.get("wrapper_prefix", ""))
        self.base_model_prefix = fields.get("base_model_prefix")
        self.device_map = fields.get("device_map")
        self.source = str(fields.get("source", ""))
        self.module = str(fields.get("module", ""))
        return self

    def __repr__(self) -> str:
        return (f"LoadResult(missing_keys={self.missing_keys!r}, unexpected_keys={self.unexpected_keys!r}, "
                f"mismatched_keys={self.mismatched_keys!r}, tied_keys={self.tied_keys!r}, "
                f"ignored_keys={self.ignored_keys!r}, sub_mapping={self.sub_mapping!r}, "
                f"wrapper_prefix={self.wrapper_prefix!r})")

    def rows(self) -> list[tuple[str, str, str]]:
        """The table's rows: (key, status, details), names with one differing index folded (``h.{0, 1}.attn.bias``)."""
        rows = [(k, "MISSING", "") for k in self.missing_keys]
        rows += [(k, "UNEXPECTED", "") for k in self.unexpected_keys]
        rows += [(k, "MISMATCH", f"skipped for its size - ckpt: {s} vs model: {m}") for k, s, m in self.mismatched_keys]
        rows += [(k, "TIED", f"shares {v}") for k, v in self.tied_keys.items()]
        rows += [(k, "IGNORED", why) for k, why in self.ignored_keys.items()]
        return _folded(rows)

    def table(self) -> str:
        """The report a person reads, in the layout of transformers' ``LOAD REPORT``."""
        where = [f"from: {self.source}"]
        if self.sub_mapping:
            where.append(f"sub-mapping: {self.sub_mapping!r}")
        if self.wrapper_prefix:
            where.append(f"wrapper prefix: {self.wrapper_prefix!r}")
        if self.base_model_prefix:
            where.append(f"base-model prefix: {self.base_model_prefix!r}")
        lines = [f"{self.module} LOAD REPORT " + ", ".join(where)]
        rows = self.rows()
        if not rows:
            return lines[0] + "\nevery tensor loaded: nothing missing, unexpected, mismatched, tied or ignored"
        header = ("Key", "Status", "Details")
        widths = [max(len(r[i]) for r in [*rows, header]) for i in range(3)]
        lines.append(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        lines.append("-+-".join("-" * w for w in widths))
        lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines += ["", "Notes:"] + [f"- {s}: {_NOTES[s]}" for s in _NOTES if any(r[1] == s for r in rows)]
        if self.device_map:
            lines.append("device map: " + ", ".join(f"{k or '(root)'} -> {v}" for k, v in self.device_map.items()))
        return printable("\n".join(lines), lines=True)

    __str__ = table


def _folded(rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Rows alike but for the first layer index of their key, merged into ``prefix.{0, 1}.rest``."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for key, status, details in rows:
        match = _INDEX.search(key)
        if match is None:
            groups.setdefault((key, status, details), [])
            continue
        template = key[: match.start()] + "{}" + key[match.end():]
        groups.setdefault((template, status, details), []).append(match.group())
    out = []
    for (key, status, details), indices in groups.items():
        if indices:
            shown = indices[0] if len(indices) == 1 else "{" + ", ".join(indices) + "}"
            key = key.replace("{}", shown, 1)
        out.append((key, status, details))
    return out
