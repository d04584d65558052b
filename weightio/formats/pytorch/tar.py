"""A strict, read-only walker for the tar archives of torch's oldest checkpoint format.

``tarfile`` is not used: it accepts GNU/old-v7 variants, sparse and link members, and reads
members by extracting them. Here an archive is a sequence of regular-file members whose data
is located (never copied), then the end-of-archive zero blocks.

Layout (POSIX.1-1988 ustar, as Python's ``tarfile`` writes it in PAX format)::

    512-byte header, data padded to a multiple of 512 bytes ...   one per member
    two 512-byte blocks of zeros                                   end of archive
    zeros up to the record size (tarfile pads to 10240 bytes)

Header fields used (offset, length): name (0, 100), size (124, 12: octal, or base-256 when the
first byte has its high bit set), checksum (148, 8: octal sum of the header bytes with this
field read as spaces), typeflag (156, 1), magic (257, 6: ``ustar\\0`` or ``ustar ``), prefix
(345, 155: joined to the name with ``/``). A ``x`` (PAX extended) header's data holds
``"<len> <key>=<value>\\n"`` records that override the next member's ``path`` and ``size``;
``g`` (global) headers are skipped.

Rules (each a `CorruptFileError`): every header's checksum is right; members are regular files
(typeflag ``0`` or NUL); names are unique; data lies inside the file; after the end blocks
nothing but zeros follows (no appended polyglot payload).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..._io import MappedFile
from ...errors import CorruptFileError

__all__ = ["TarMember", "looks_like_tar", "read_members"]

BLOCK = 512
_MAX_MEMBERS = 10_000
_MAX_PAX = 1 << 20  # bytes of PAX records we parse for one member
_MAX_TAIL = 1 << 20  # zero padding after the end blocks we accept


@dataclass(frozen=True, slots=True)
class TarMember:
    """One regular-file member: its name and where its data is."""

    name: str
    data_offset: int
    size: int


def read_members(file: MappedFile) -> list[TarMember]:
    """Every member of the tar archive `file`, in order, validated (see the module docstring)."""
    members: list[TarMember] = []
    names: set[str] = set()
    pos, pax = 0, {}
    while True:
        header = file.read(pos, BLOCK, "a tar header") if pos + BLOCK <= file.size else b""
        if len(header) < BLOCK:
            raise _fail(file, f"the archive ends at offset {pos} without its end-of-archive blocks")
        if header == bytes(BLOCK):
            _check_tail(file, pos)
            return members
        name, size, kind = _parse_header(file, header, pos)
        data = pos + BLOCK
        if data + size > file.size:
            raise _fail(file, f"member {name!r} ({size:,} bytes at {data}) runs past the end of the file")
        if kind in "xg":
            if kind == "x":
                pax = _parse_pax(file, file.read(data, min(size, _MAX_PAX), "a PAX header"))
            pos = data + -(-size // BLOCK) * BLOCK
            continue
        name, size = pax.get("path", name), pax.get("size", size)  # a PAX size replaces the header's (>= 8 GiB)
        pax = {}
        if data + size > file.size:
            raise _fail(file, f"member {name!r} ({size:,} bytes at {data}) runs past the end of the file")
        pos = data + -(-size // BLOCK) * BLOCK  # the next header follows the data the PAX size says
        if name in names:
            raise _fail(file, f"member {name!r} appears twice")
        if len(members) >= _MAX_MEMBERS:
            raise _fail(file, f"more than {_MAX_MEMBERS:,} members")
        names.add(name)
        members.append(TarMember(name, data, size))


def looks_like_tar(head: bytes) -> bool:
    """True when `head` (the file's first bytes) has the ustar magic; `read_members` checks the rest."""
    return len(head) >= 262 and head[257:262] == b"ustar"


def _fail(file: MappedFile, message: str) -> CorruptFileError:
    return CorruptFileError(f"tar archive: {message}", path=file.path)


def _parse_header(file: MappedFile, header: bytes, pos: int) -> tuple[str, int, str]:
    if header[257:262] != b"ustar":
        raise _fail(file, f"no ustar header at offset {pos}")
    if not _checksum_ok(header):
        raise _fail(file, f"the header at offset {pos} fails its checksum")
    kind = chr(header[156]) if header[156] else "0"
    if kind not in "0xg":
        raise _fail(file, f"the member at offset {pos} has type {kind!r}; only regular files are expected")
    name = _text(header[0:100])
    prefix = _text(header[345:500])
    return (f"{prefix}/{name}" if prefix else name), _number(file, header[124:136], pos), kind


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = int(header[148:156].replace(b"\0", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    return stored == unsigned


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _number(file: MappedFile, raw: bytes, pos: int) -> int:
    if raw[0] & 0x80:  # base-256 (GNU), used by tarfile for sizes of 8 GiB and more
        return int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
    try:
        return int(raw.replace(b"\0", b" ").strip() or b"0", 8)
    except ValueError:
        raise _fail(file, f"the header at offset {pos} has a malformed size {raw!r}") from None


def _parse_pax(file: MappedFile, data: bytes) -> dict:
    """The ``path`` and ``size`` records of a PAX extended header (others are ignored)."""
    found: dict = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos, pos + 20)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise _fail(file, "a PAX header record has no valid length") from None
        if space < 0 or length <= space - pos or pos + length > len(data) or data[pos + length - 1] != 0x0A:
            raise _fail(file, "a PAX header record is malformed")
        key, _, value = data[space + 1: pos + length - 1].partition(b"=")
        if key == b"path":
            found["path"] = value.decode("utf-8", "replace")
        elif key == b"size":
            if not value.isdigit() or len(value) > 20:
                raise _fail(file, f"PAX size {value[:24]!r} is not a number")
            found["size"] = int(value)
        pos += length
    return found


def _check_tail(file: MappedFile, pos: int) -> None:
    rest = file.size - pos
    if rest > _MAX_TAIL:
        raise _fail(file, f"{rest:,} bytes follow the end of the archive")
    if file.read(pos, rest, "the end of the archive").strip(b"\0"):
        raise _fail(file, "non-zero bytes follow the end of the archive (a polyglot file?)")
