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


def mapping_at(address: int) -> tuple[str, str, int] | None:
    """What this process has mapped at `address`: (permissions, path, offset in that file), e.g.
    ("rw-p", "/x.safetensors", 4096) for a private writable mapping of the file; None if nothing."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                path = fields[5].strip() if len(fields) > 5 else ""
                return fields[1], path, int(fields[2], 16) + address - low
    return None


def same_file_bytes(address: int, array: object) -> bool:
    """Whether `address` (a torch tensor's ``data_ptr()``) maps the same byte of the same file as
    numpy `array`'s first element does: zero-copy, possibly through another mapping of the file
    (zero-copy torch tensors live in private copy-on-write mappings, numpy views in the shared
    read-only one)."""
    here = mapping_at(address)
    there = mapping_at(array.__array_interface__["data"][0])  # type: ignore[attr-defined]
    return here is not None and here[1].startswith("/") and here[1:] == (there or ())[1:]


def handovers_taken(monkeypatch) -> list[int]:
    """The addresses of the arrays a torch tensor takes as they are (`weightio._memory.writable_if_handed`
    as `weightio.devices.torch` calls it), in order, from now until the test ends."""
    from weightio import _memory
    from weightio.devices import torch as torch_devices

    taken: list[int] = []

    def spy(arr):
        found = _memory.writable_if_handed(arr)
        if found is not None:
            taken.append(found.__array_interface__["data"][0])
        return found

    monkeypatch.setattr(torch_devices, "writable_if_handed", spy)
    return taken
