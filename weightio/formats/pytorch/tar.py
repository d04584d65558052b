"""A strict, read-only walker for the tar archives of torch's oldest checkpoint format.

``torch.load`` hands every file that does not start with ``PK\\x03\\x04`` to Python's
``tarfile.open(mode="r:")`` first, and reads it as this format whenever that succeeds — which
depends on the first 512-byte header alone: a checksum that matches and number fields that parse
(no ``ustar`` magic needed: old v7 headers count), or a block of zeros (an empty archive).
`weightio.formats.sniff.opens_as_tar` is that rule, decided by ``tarfile.TarInfo.frombuf`` itself on the first block
(bounded work), so weightio and torch agree on which files are tar archives; such a file is read
here or refused, never as a raw pickle. A remote file's headers are fetched alone (`.ranged.read`),
never with the storage data around them.

Walking the archive, each header is parsed by ``tarfile.TarInfo.frombuf`` too (the member name
and size are the ones ``tarfile`` reads), and everything on which readers could differ is refused:
``tarfile`` silently ends the archive at a header it cannot parse, takes the *last* of two
members with one name, applies global (``g``) PAX headers and GNU long names, and parses PAX
records leniently. Data is located, never copied.

Layout (POSIX.1-1988 ustar, as Python's ``tarfile`` writes it in PAX format)::

    512-byte header, data padded to a multiple of 512 bytes ...   one per member
    two 512-byte blocks of zeros                                   end of archive
    zeros up to the record size (tarfile pads to 10240 bytes)

Header fields used (offset, length): name (0, 100), size (124, 12: octal, or base-256 when the
first byte is 0x80), checksum (148, 8), typeflag (156, 1), prefix (345, 155: joined to the name
with ``/``). A ``x`` (PAX extended) header's data holds ``"<len> <key>=<value>\\n"`` records
that override the next member's ``path`` and ``size``.

Rules (each a `CorruptFileError`): every header is one ``tarfile`` parses; members are regular
files (typeflag ``0`` or NUL) or a single PAX header before one; PAX records are well formed and
only ``path``, ``size`` and informational keys; names are unique; data lies inside the file;
after the end blocks nothing but zeros follows (no appended polyglot payload).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import CorruptFileError
from ..sniff import opens_as_tar, tarfile_module
from . import ranged

if TYPE_CHECKING:
    from ..base import AnyFile

__all__ = ["TarMember", "opens_as_tar", "read_members"]

BLOCK = 512
_MAX_MEMBERS = 10_000
_MAX_PAX = 1 << 20  # bytes of PAX records we parse for one member
_MAX_TAIL = 1 << 20  # zero padding after the end blocks we accept
# PAX keys that change nothing about where a member's bytes are or what it is called.
_INFORMATIONAL = frozenset((b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname", b"comment"))


@dataclass(frozen=True, slots=True)
class TarMember:
    """One regular-file member: its name and where its data is."""

    name: str
    data_offset: int
    size: int


def read_members(file: AnyFile, *, partial: bool = False) -> list[TarMember]:
    """Every member of the tar archive `file`, in order, validated (see the module docstring).

    With `partial` (for `weightio.scan`), the members read before any error are returned instead,
    and whatever follows the end blocks is not looked at.
    """
    members: list[TarMember] = []
    try:
        return _walk(file, members, partial)
    except CorruptFileError:
        if partial:
            return members
        raise


def _walk(file: AnyFile, members: list[TarMember], partial: bool) -> list[TarMember]:
    names: set[str] = set()
    pos, pax = 0, None
    while True:
        header = ranged.read(file, pos, BLOCK, "a tar header", exact=True) if pos + BLOCK <= file.size else b""
        if len(header) < BLOCK:
            raise _fail(file, f"the archive ends at offset {pos} without its end-of-archive blocks")
        if header == bytes(BLOCK):
            if pax is not None:
                raise _fail(file, f"the PAX header before offset {pos} describes no member")
            if not partial:
                _check_tail(file, pos)
            return members
        name, size, kind = _parse_header(file, header, pos)
        data = pos + BLOCK
        if data + size > file.size:
            raise _fail(file, f"member {name!r} ({size:,} bytes at {data}) runs past the end of the file")
        if kind == "x":
            if pax is not None:
                raise _fail(file, f"two PAX headers in a row at offset {pos} (tarfile would merge them)")
            pax = _parse_pax(file, data, size)
            pos = data + -(-size // BLOCK) * BLOCK
            continue
        if pax:  # a PAX path and size replace the header's (tarfile strips a trailing "/" from the path)
            name, size = pax.get("path", name), pax.get("size", size)
        pax = None
        if data + size > file.size:
            raise _fail(file, f"member {name!r} ({size:,} bytes at {data}) runs past the end of the file")
        pos = data + -(-size // BLOCK) * BLOCK  # the next header follows the data the PAX size says
        if name in names:
            raise _fail(file, f"member {name!r} appears twice (tarfile would read the last one)")
        if len(members) >= _MAX_MEMBERS:
            raise _fail(file, f"more than {_MAX_MEMBERS:,} members")
        names.add(name)
        members.append(TarMember(name, data, size))


def _fail(file: AnyFile, message: str) -> CorruptFileError:
    return CorruptFileError(f"tar archive: {message}", path=file.path)


def _parse_header(file: AnyFile, header: bytes, pos: int) -> tuple[str, int, str]:
    """(name, size, kind) as ``tarfile`` reads them; kind ``"0"`` (regular) or ``"x"`` (PAX)."""
    tarfile = tarfile_module()
    try:
        info = tarfile.TarInfo.frombuf(header, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError as e:  # tarfile would end the archive here without a word
        raise _fail(file, f"the header at offset {pos} is not one tarfile reads ({e})") from None
    if info.type == tarfile.XHDTYPE:
        kind = "x"
    elif info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and info.isreg():
        kind = "0"
    else:
        shown = info.type.decode("latin-1") if info.type else "NUL"
        raise _fail(file, f"the member at offset {pos} has type {shown!r}; only regular files (and a PAX header "
                          "before one) are expected")
    if info.size < 0:
        raise _fail(file, f"the header at offset {pos} has a negative size {info.size}")
    return info.name, info.size, kind


def _parse_pax(file: AnyFile, data: int, size: int) -> dict:
    """The ``path`` and ``size`` of a PAX extended header, from all the blocks tarfile reads."""
    if size > _MAX_PAX:
        raise _fail(file, f"a PAX header of {size:,} bytes (more than {_MAX_PAX:,})")
    raw = ranged.read(file, data, min(-(-size // BLOCK) * BLOCK, file.size - data), "a PAX header", exact=True)
    if b"hdrcharset=" in raw:  # tarfile looks for it anywhere, even inside another record
        raise _fail(file, "a PAX header sets hdrcharset (the encoding of names), which is not supported")
    found: dict = {}
    pos = 0
    while pos < len(raw) and raw[pos] != 0:
        key, value, pos = _pax_record(file, raw, pos)
        if key == b"path":
            try:
                found["path"] = value.decode("utf-8").rstrip("/")
            except UnicodeDecodeError:
                raise _fail(file, f"PAX path {value[:40]!r} is not UTF-8") from None
        elif key == b"size":
            if not value.isdigit() or len(value) > 20:
                raise _fail(file, f"PAX size {value[:24]!r} is not a number")
            found["size"] = int(value)
        elif key not in _INFORMATIONAL:
            raise _fail(file, f"PAX record {key[:40]!r} is not supported (only path, size and informational ones are)")
    if raw[pos:].strip(b"\0"):
        raise _fail(file, "bytes follow the PAX records")
    return found


def _pax_record(file: AnyFile, raw: bytes, pos: int) -> tuple[bytes, bytes, int]:
    """One ``"<len> <key>=<value>\\n"`` record at `pos`: (key, value, the next record's offset).

    Only records that ``tarfile``'s lenient parser (``(\\d+) ([^=]+)=`` then `len` bytes) reads the
    same way are accepted."""
    space = raw.find(b" ", pos, pos + 21)
    digits = raw[pos:space] if space > pos else b""
    if not digits.isdigit():
        raise _fail(file, "a PAX header record has no valid length")
    end = pos + int(digits)
    equals = raw.find(b"=", space + 1, end)
    if end > len(raw) or equals <= space + 1 or raw[end - 1] != 0x0A:
        raise _fail(file, "a PAX header record is malformed")
    return raw[space + 1: equals], raw[equals + 1: end - 1], end


def _check_tail(file: AnyFile, pos: int) -> None:
    rest = file.size - pos
    if rest > _MAX_TAIL:
        raise _fail(file, f"{rest:,} bytes follow the end of the archive")
    if ranged.read(file, pos, rest, "the end of the archive", exact=True).strip(b"\0"):
        raise _fail(file, "non-zero bytes follow the end of the archive (a polyglot file?)")
