"""Human-readable numbers, metadata values and plain-text tables for the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np

from weightio.text import dims, needs_escape, printable
from weightio.text import number as exact

__all__ = ["human_bytes", "human_count", "table", "column_table", "elide", "shape_text", "number", "json_value",
           "json_text", "kind", "kind_of", "plural"]

MAX_VALUE = 80  # characters of a metadata value shown before eliding
MAX_ITEMS = 3  # items of a long list shown before eliding


def human_bytes(n: int) -> str:
    """Bytes in decimal units, as model sizes are quoted: ``1.5 GB``, ``512 B``."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def human_count(n: int) -> str:
    """A parameter count with thousands separators and a short form: ``102,176 (102.2K)``."""
    if n >= 10**15:  # a count no real model has (a forged shape): exact digits, bounded, and no float overflow
        return exact(n, grouping=True)
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            return f"{n:,} ({n / div:.1f}{suffix})"
    return f"{n:,}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; columns listed in `right` are right-aligned. Every cell
    is made printable (a tensor name with a newline or ESC in it stays one harmless cell)."""
    if not isinstance(rows, (list, tuple)):
        rows = list(rows)  # (read twice below)
    return column_table(header, list(zip(*rows, strict=True)) if rows else [()] * len(header), right)


def column_table(header: Sequence[str], columns: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """`table` of the cells given column by column (each column as long as the others): a listing
    of 100k tensors is made and padded one column at a time, in C-level passes, with no row built."""
    if len(columns) != len(header):
        raise ValueError(f"{len(header)} columns needed (one per title), got {len(columns)}")
    if len(set(map(len, columns))) > 1:
        raise ValueError(f"columns of one length needed, got lengths {list(map(len, columns))}")
    if not set(map(type, chain.from_iterable(columns))) <= {str}:  # (plain strings are used as they are)
        columns = [[str(c) for c in column] for column in columns]
    if needs_escape(" ".join(chain.from_iterable(columns))):  # (one scan for the common case)
        columns = [list(map(printable, column)) for column in columns]
    padded = [map(str.rjust if i in right else str.ljust, chain((title,), column),
                  repeat(max(len(title), max(map(len, column), default=0))))
              for i, (title, column) in enumerate(zip(header, columns, strict=True))]
    return "\n".join(map(str.rstrip, map("  ".join, zip(*padded, strict=True))))


def plural(n: int, word: str) -> str:
    """``1 tensor``, ``39 tensors``, ``1,024 params``."""
    return f"{exact(n, grouping=True)} {word}{'' if n == 1 else 's'}"


def shape_text(shape: Sequence[int]) -> str:
    """``[32, 768]``; ``[]`` for a scalar."""
    return dims(shape)


def kind(view: Any) -> str:
    """What a tensor is stored as: its ggml block type, or its dtype name."""
    return view.ggml_type or kind_of(view.info.dtype)


_KINDS: dict[np.dtype, str] = {}


def kind_of(dtype: np.dtype) -> str:
    """`weightio.dtypes.dtype_name` of a stored dtype, remembered (a listing asks for a few dtypes 100k times)."""
    name = _KINDS.get(dtype)
    if name is None:
        from weightio.dtypes import dtype_name

        name = _KINDS[dtype] = dtype_name(dtype)
    return name


def number(x: float | int) -> str:
    """A statistic, short: ints exactly, floats to 6 significant digits."""
    if isinstance(x, (int, np.integer)):
        return exact(int(x), grouping=True)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.6g}"


def elide(value: Any, limit: int = MAX_VALUE, *, float32: bool = False) -> str:
    """A metadata value on one line: long strings cut, long lists shortened to their first items.

    Never formats a whole large container (a GGUF vocabulary has 100k+ entries). Nested lists
    (GGUF arrays of arrays) are shown the same way, inside. Floats stored as float32 (`float32`,
    or a GGUF array of FLOAT32) are shown by the shortest text that reads back as the same float32
    (``0.1``, not the float64 ``0.10000000149011612`` they are held as).
    """
    if _is_list(value):
        n = len(value)
        float32 = float32 or getattr(value, "type", None) == "FLOAT32"
        shown = ", ".join(_one_line(value[i], 24, float32) for i in range(min(n, MAX_ITEMS)))
        text = f"[{shown}{', …' if n > MAX_ITEMS else ''}]" + (f" ({n:,} items)" if n > MAX_ITEMS else "")
        return text if len(text) <= limit else text[: limit - 1] + "…"
    return _one_line(value, limit, float32)


def _is_list(value: Any) -> bool:
    """Lists, tuples, arrays and sequence types such as GGUF's lazily decoded arrays (not strings)."""
    return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes, bytearray))


def _one_line(value: Any, limit: int, float32: bool = False) -> str:
    if _is_list(value):
        return elide(value, limit, float32=float32)
    if float32 and isinstance(value, float):
        return str(np.float32(value))  # numpy's shortest round-tripping float32 text
    if isinstance(value, dict):
        text = json.dumps(json_value(value), ensure_ascii=False)
    elif isinstance(value, bool) or not isinstance(value, int):
        text = str(value)
    else:
        text = exact(value)
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def json_value(value: Any) -> Any:
    """A JSON-safe copy of a metadata value (numpy scalars and arrays to Python, floats finite)."""
    if isinstance(value, np.ndarray) or (hasattr(value, "tolist") and _is_list(value)):
        return [json_value(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return json_value(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return exact(value)  # json.dumps cannot write an int of more than 4300 digits; a forged one, as text
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def json_text(doc: Any) -> str:
    """`doc` as indented JSON for a terminal or a pipe: UTF-8 text as it is, but every character a
    terminal acts on or cannot encode (DEL, C1 controls, bidirectional overrides, lone surrogates;
    json.dumps already escapes C0 controls) written as a ``\\uXXXX`` escape: the same JSON value."""
    return printable(json.dumps(doc, indent=2, ensure_ascii=False), lines=True, json=True)
