"""The central directory of a zip archive read with numpy, when it is regular.

`weightio.formats._zip` parses the central directory entry by entry (~1.5 µs each: 150 ms for a
checkpoint of 100k tensors). `entries` does the fixed-size part of that work for all entries at
once: it finds every central-directory signature, checks that they chain exactly (the first at
offset 0, each entry ending where the next signature is, the last where the directory ends, as
many as the end record counts) and that no entry needs what the loop handles specially (ZIP64
fields, encryption, a method other than stored or deflate). Anything else — a name holding the
signature's four bytes among them — answers None, and the loop parses the directory and reports
what is wrong, as before; so does a name that does not decode or comes twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["entries"]

_HEADER = np.dtype([("sig", "<u4"), ("made", "<u2"), ("needed", "<u2"), ("flags", "<u2"), ("method", "<u2"),
                    ("time", "<u2"), ("date", "<u2"), ("crc", "<u4"), ("csize", "<u4"), ("usize", "<u4"),
                    ("nlen", "<u2"), ("xlen", "<u2"), ("clen", "<u2"), ("disk", "<u2"), ("internal", "<u2"),
                    ("external", "<u4"), ("offset", "<u4")])  # 46 bytes, as _zip._CENTRAL
_SIZE = _HEADER.itemsize
_SIG = b"PK\x01\x02"
_ENCRYPTED, _UTF8 = 0x1, 0x800  # as _zip._FLAG_ENCRYPTED, _FLAG_UTF8


def entries(cd: bytes, count: int, member: Callable[[tuple], Any]) -> list[tuple[Any, bytes, int]] | None:
    """(member, raw name, flags) of each entry in directory order — `member` makes a
    `_zip.ZipMember` of (name, method, crc32, compressed size, size, local header offset, -1, raw
    name) — or None where the directory is not regular (see module doc) or a name does not decode
    or comes twice (the loop reports which)."""
    n = len(cd)
    if count < 1 or n < _SIZE:
        return None
    buf = np.frombuffer(cd, np.uint8)
    found = buf[:-3] == _SIG[0]
    for k in (1, 2, 3):
        found &= buf[k: n - 3 + k] == _SIG[k]
    hits = np.flatnonzero(found)
    if len(hits) != count or hits[0] != 0 or hits[-1] + _SIZE > n:
        return None
    rows = buf[hits[:, None] + np.arange(_SIZE)].view(_HEADER).ravel()
    ends = hits + _SIZE + rows["nlen"].astype(np.int64) + rows["xlen"] + rows["clen"]
    if ends[-1] != n or not np.array_equal(ends[:-1], hits[1:]):
        return None
    wide = np.uint32(0xFFFFFFFF)
    if ((rows["usize"] == wide) | (rows["csize"] == wide) | (rows["offset"] == wide)).any():
        return None  # ZIP64 fields: the loop reads them
    if (rows["flags"] & _ENCRYPTED).any() or not np.isin(rows["method"], (0, 8)).all():
        return None  # the loop refuses them, naming the member
    flags = rows["flags"].tolist()
    raws = [cd[start: start + length] for start, length in zip((hits + _SIZE).tolist(), rows["nlen"].tolist(),
                                                               strict=True)]
    try:
        names = [raw.decode("utf-8" if flag & _UTF8 else "cp437") for raw, flag in zip(raws, flags, strict=True)]
    except UnicodeDecodeError:
        return None
    if len(set(names)) != count:
        return None
    return [(member((name, method, crc, csize, usize, offset, -1, raw)), raw, flag)
            for name, raw, flag, method, crc, csize, usize, offset in zip(
                names, raws, flags, rows["method"].tolist(), rows["crc"].tolist(), rows["csize"].tolist(),
                rows["usize"].tolist(), rows["offset"].tolist(), strict=True)]
