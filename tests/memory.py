"""What a process holds of a mapped file (Linux): shared by the tests and tests/tp_worker.py."""

from __future__ import annotations

import os


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of `path` mapped into this process and resident (the Rss of its mappings in smaps)."""
    total, current, target = 0, None, str(path)
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:
                current = fields[5] if len(fields) > 5 else None
            elif fields and fields[0] == "Rss:" and current == target:
                total += int(fields[1]) * 1024
    return total
