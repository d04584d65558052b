"""Human-readable numbers and plain-text tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["human_bytes", "human_count", "table"]


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
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            return f"{n:,} ({n / div:.1f}{suffix})"
    return f"{n:,}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; columns listed in `right` are right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
