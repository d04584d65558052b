"""A strict, read-only ZIP walker over a mapped file (for `.npz` and PyTorch zip checkpoints).

Python's `zipfile` is not used: it takes sizes from the local headers that torch leaves empty,
accepts duplicate and (before 3.11.8/3.12.2, CVE-2024-0450) overlapping members, and reads
members into memory. Here every member's data offset comes from its *local* header (torch
pads the local and central extra fields differently), and the archive must be unambiguous.

Layout (APPNOTE.TXT 6.3)::

    [local file header + data (+ data descriptor)] ...   members, from offset 0
    [central directory file header] ...                   one per member
    [zip64 end of central directory record + locator]     only when a field overflows 32 bits
    end of central directory record (22 bytes + comment)  at the very end of the file

Structures (little-endian)::

    local header   <IHHHHHIIIHH   sig 0x04034b50, version, flags, method, time, date, crc32,
                                  compressed size, size, name length, extra length
    central entry  <IHHHHHHIIIHHHHHII  sig 0x02014b50, made by, version, flags, method, time,
                                  date, crc32, compressed size, size, name, extra and comment
                                  lengths, disk, internal attr, external attr, local header offset
    EOCD           <IHHHHIIH      sig 0x06054b50, disk, cd disk, entries here, entries,
                                  cd size, cd offset, comment length
    zip64 locator  <IIQI          sig 0x07064b50, disk, zip64 EOCD offset, disks
    zip64 EOCD     <IQHHIIQQQQ    sig 0x06064b50, record size, made by, version, disk, cd disk,
                                  entries here, entries, cd size, cd offset
    zip64 extra    id 0x0001: the 64-bit size, compressed size, offset — only those whose
                   32-bit field is 0xFFFFFFFF, in that order

Rules (each a `CorruptFileError`, or `FormatError` for unsupported features): the EOCD ends the
file and is the last ``PK\x05\x06`` in it; the central directory ends exactly where the end
records begin; entry counts fit in the central directory's bytes; each local header has the
right signature and the same name as its central entry; member names are unique, also when
ASCII letters are compared without regard to case; members start at offset 0 (nothing hidden
before them) and do not overlap; no encryption; compression is stored (0) or deflate (8).

Why each rule: the readers this archive is also meant for must find the same parts. torch
(miniz) takes the *last* EOCD signature with 22 bytes after it, and Python's `zipfile` (numpy's
npz) the last in the final 64 KiB; both take the ZIP64 end record whenever its locator precedes
the EOCD, sentinel fields or not (miniz at the locator's offset, `zipfile` 56 bytes before the
locator, so the two must coincide); `zipfile` shifts every offset by any gap between the central
directory and the end records (a "concatenated" archive), miniz does not; and miniz looks
records up by name with ASCII letters folded (``archive/DATA.PKL`` answers ``data.pkl``),
taking whichever its sorted index meets first when two fold equal.
"""

from __future__ import annotations

import functools
import struct
import weakref
import zlib
from typing import NamedTuple

import numpy as np

from .._gc import collector_paused
from ..errors import CorruptFileError, FormatError
from ..limits import Limits, exceeded
from ..limits import current as current_limits
from . import _zip_central as _zc
from . import _zip_local as _zl
from . import _zip_remote as _zr
from .base import AnyFile, is_remote

__all__ = ["ZipMember", "read_members", "case_collisions", "crc_omitted", "inflate", "inflate_prefix",
           "METHOD_STORED", "METHOD_DEFLATED", "largest_inflated", "verify", "verify_range"]

METHOD_STORED, METHOD_DEFLATED = 0, 8
_METHODS = (METHOD_STORED, METHOD_DEFLATED)
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD, _LOCATOR, _EOCD64 = struct.Struct("<IHHHHIIH"), struct.Struct("<IIQI"), struct.Struct("<IQHHIIQQQQ")
_SIG_LOCAL, _SIG_CENTRAL, _SIG_EOCD = 0x04034B50, 0x02014B50, 0x06054B50
_SIG_LOCATOR, _SIG_EOCD64 = 0x07064B50, 0x06064B50
_FLAG_ENCRYPTED, _FLAG_DESCRIPTOR, _FLAG_UTF8 = 0x1, 0x8, 0x800
_MAX_DEFLATE_RATIO = 1032  # deflate cannot expand more than this (258-byte matches in 2 bits)


class ZipMember(NamedTuple):
    """One archive member (an immutable record).

    A `NamedTuple` rather than a frozen dataclass: a torch checkpoint has a member per storage,
    and a frozen dataclass costs several times as much to build (it shows at 1000s of members).

    Attributes:
        name: the member name (UTF-8 or CP437 as its flag says).
        method: `METHOD_STORED` or `METHOD_DEFLATED`.
        crc32: the CRC-32 of the uncompressed data, from the central directory.
        compressed_size: bytes of (possibly compressed) data in the file.
        size: bytes once uncompressed.
        header_offset: offset of the local file header.
        data_offset: offset of the member's data (after the local header's name and extra).
        raw_name: the name's bytes as stored (torch looks records up by these, ASCII-folded).
    """

    name: str
    method: int
    crc32: int
    compressed_size: int
    size: int
    header_offset: int
    data_offset: int
    raw_name: bytes = b""


_member = functools.partial(tuple.__new__, ZipMember)  # ZipMember(...) without its Python-level __new__


def read_members(file: AnyFile, limits: Limits | None = None) -> list[ZipMember]:
    """Every member of the zip archive `file`, in central-directory order (`zipfile`'s ``namelist()``
    and miniz's index, whose first entry names torch's archive prefix), fully validated (module doc).

    The member count is bounded by ``limits.tensors`` and the central directory's size by ``limits.header_bytes``
    (the current `weightio.limits` unless `limits` is given). The result is remembered for the life of `file`:
    sniffing a file and then reading it walks the archive once. Names that are equal once case is folded are
    kept (numpy reads them apart, as `zipfile` does); the PyTorch reader, whose reference looks records up
    without regard to case, refuses them through `case_collisions`.
    """
    limits = limits or current_limits()
    cached = _CACHE.get(file)
    if cached is not None:
        if len(cached) > limits.tensors:
            raise exceeded("member count", len(cached), "tensors", limits.tensors, path=file.path, unit="")
        return list(cached)
    with collector_paused():  # 100k members are 100k tuples that all survive: see weightio._gc
        located = _walk(file, limits)
    _CACHE[file] = tuple(located)
    return located


def _walk(file: AnyFile, limits: Limits) -> list[ZipMember]:
    cd_offset, cd_size, count = _find_central_directory(file)
    if count > limits.tensors:
        raise exceeded("member count", count, "tensors", limits.tensors, path=file.path, unit="")
    if cd_size > limits.header_bytes:
        raise exceeded("central directory size", cd_size, "header_bytes", limits.header_bytes, path=file.path)
    members = _read_central_directory(file, cd_offset, cd_size, count)
    if is_remote(file):  # (narrows: below, a MappedFile, which _zl reads)
        return _walk_remote(file, members, cd_offset)
    if (located := _zl.located(file, members, cd_offset, _member)) is not None:  # numpy, when regular
        return located
    heads = _zl.local_headers(file, [(m.header_offset, _LOCAL.size + len(raw)) for m, raw, _ in members])
    located = [_locate(file, *entry, cd_offset, head) for entry, head in zip(members, heads, strict=True)]
    _check_layout(file, sorted(located, key=lambda m: m.header_offset))
    return located


def case_collisions(members: list[ZipMember]) -> list[tuple[str, str]]:
    """Every pair of member names that are equal once ASCII letters are folded (miniz's lookup)."""
    first: dict[bytes, str] = {}
    pairs = []
    for m in members:
        other = first.setdefault(m.raw_name.lower(), m.name)
        if other is not m.name:
            pairs.append((other, m.name))
    return pairs


def crc_omitted(members: list[ZipMember]) -> bool:
    """Whether the writer computed no CRC-32 at all: every member declares 0.

    ``torch.save`` under ``torch.serialization.set_crc32_options(False)`` writes 0 in every entry (one setting
    per writer, so never for some members only), and torch's reader checks no CRC (its miniz is built with
    ``MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS``). A CRC of 0 in an archive whose other members carry real CRCs
    is checked like any other (it matches only data whose CRC-32 is 0, an empty record among them).
    """
    return bool(members) and all(m.crc32 == 0 for m in members)


def largest_inflated(members: list[ZipMember]) -> int:
    """The most bytes any deflated member may inflate to: its declared size, when deflate could
    produce that much from its compressed bytes (`inflate` refuses the others)."""
    return max((m.size for m in members if m.method == METHOD_DEFLATED
                and m.size <= m.compressed_size * _MAX_DEFLATE_RATIO + 1024), default=0)


_CACHE: weakref.WeakKeyDictionary[AnyFile, tuple[ZipMember, ...]] = weakref.WeakKeyDictionary()


def _fail(file: AnyFile, message: str) -> CorruptFileError:
    return CorruptFileError(f"zip archive: {message}", path=file.path)


def _find_central_directory(file: AnyFile) -> tuple[int, int, int]:
    size = file.size
    if size < _EOCD.size:
        raise _fail(file, f"file is {size} bytes, shorter than an end-of-central-directory record")
    start = max(0, size - _EOCD.size - 0xFFFF)
    if is_remote(file):  # the last TAIL bytes first: the whole window only if they hold no EOCD
        start, tail = _zr.tail(file, start)
    else:
        tail = file.read(start, size - start, "the end of the archive")
    pos = _find_eocd(tail)
    if pos < 0:
        raise _fail(file, "no end-of-central-directory record ends the file (truncated, or bytes appended)"
                    if pos == -1 else "another end-of-central-directory signature follows the end record, which "
                                      "zipfile or torch would take instead")
    eocd = start + pos
    fields = _EOCD.unpack_from(tail, pos)
    _, disk, cd_disk, count_here, count, cd_size, cd_offset, _ = fields
    if count_here != count:  # miniz refuses such an archive; zipfile counts neither (it reads cd_size bytes)
        raise _fail(file, f"the end record counts {count_here} entries on this disk but {count} in all")
    cd_end = eocd
    if _has_zip64_locator(file, eocd) or 0xFFFF in (count, disk, cd_disk) or 0xFFFFFFFF in (cd_size, cd_offset):
        count, cd_size, cd_offset, cd_end = _read_zip64_end(file, eocd, fields)
    elif disk or cd_disk:
        raise FormatError("multi-disk (spanned) zip archives are not supported", path=file.path)
    if cd_offset + cd_size > cd_end:
        raise _fail(file, f"central directory ({cd_size} bytes at {cd_offset}) overruns the end records at {cd_end}")
    if cd_offset + cd_size < cd_end:  # zipfile would shift every offset by the gap; miniz would not
        raise _fail(file, f"{cd_end - cd_offset - cd_size} bytes lie between the central directory and the end "
                          "records (zipfile would read the archive as if shifted by them, torch would not)")
    if count * _CENTRAL.size > cd_size:  # (the member count's limit is weightio.limits.tensors)
        raise _fail(file, f"{count} entries cannot fit in a {cd_size}-byte central directory")
    return cd_offset, cd_size, count


def _find_eocd(tail: bytes) -> int:
    """Offset in `tail` of the EOCD record; -1 if there is none, -2 if the readers could disagree.

    `zipfile` takes the last 22 bytes when they are a comment-less EOCD, else the last signature;
    miniz the last signature with 22 bytes after it. Accepted only when both pick the same one
    and its comment ends exactly at the end of the file.
    """
    last = len(tail) - _EOCD.size
    if last >= 0 and tail.startswith(b"PK\x05\x06", last) and tail.endswith(b"\0\0"):
        pos = last
    else:
        pos = tail.rfind(b"PK\x05\x06")
        if pos < 0 or pos > last or pos + _EOCD.size + _EOCD.unpack_from(tail, pos)[7] != len(tail):
            return -1
    if tail.rfind(b"PK\x05\x06", pos + 1, last + 4) >= 0:
        return -2
    return pos


def _unpack(file: AnyFile, fmt: struct.Struct, offset: int, what: str) -> tuple:
    if offset < 0 or offset + fmt.size > file.size:
        return file.unpack(fmt, offset, what)  # raises, naming what
    return fmt.unpack(_zr.read(file, offset, fmt.size, what))


def _has_zip64_locator(file: AnyFile, eocd: int) -> bool:
    return eocd >= _LOCATOR.size and _zr.read(file, eocd - _LOCATOR.size, 4, "the ZIP64 locator") == b"PK\x06\x07"


def _read_zip64_end(file: AnyFile, eocd: int, eocd_fields: tuple) -> tuple[int, int, int, int]:
    """The ZIP64 end record's count, central directory size and offset, and where it starts.

    Both miniz and `zipfile` use this record whenever its locator precedes the EOCD; miniz finds
    it at the locator's offset and `zipfile` right before the locator, so those must agree, and
    the EOCD's own fields must be the sentinel or the same value (or the readers could differ).
    """
    locator = eocd - _LOCATOR.size
    if locator < 0:
        raise _fail(file, "ZIP64 fields are set but there is no ZIP64 locator")
    sig, _, record, disks = _unpack(file, _LOCATOR, locator, "the ZIP64 locator")
    if sig != _SIG_LOCATOR:
        raise _fail(file, "ZIP64 fields are set but there is no ZIP64 locator")
    if record + _EOCD64.size != locator:
        raise _fail(file, f"ZIP64 end record offset {record} is not the {_EOCD64.size} bytes right before its "
                          f"locator at {locator}")
    fields = _unpack(file, _EOCD64, record, "the ZIP64 end record")
    if fields[0] != _SIG_EOCD64:
        raise _fail(file, f"no ZIP64 end record at offset {record}")
    if disks > 1 or fields[4] or fields[5]:
        raise FormatError("multi-disk (spanned) zip archives are not supported", path=file.path)
    _, _, _, _, _, _, count_here, count, cd_size, cd_offset = fields
    if count_here != count:
        raise _fail(file, f"the ZIP64 end record counts {count_here} entries on this disk but {count} in all")
    _, _, _, _, count32, size32, offset32, _ = eocd_fields
    for what, small, big, sentinel in (("entry count", count32, count, 0xFFFF),
                                       ("central directory size", size32, cd_size, 0xFFFFFFFF),
                                       ("central directory offset", offset32, cd_offset, 0xFFFFFFFF)):
        if small not in (sentinel, big):
            raise _fail(file, f"the end record's {what} ({small}) differs from the ZIP64 end record's ({big})")
    return count, cd_size, cd_offset, record


def _read_central_directory(file: AnyFile, cd_offset: int, cd_size: int,
                            count: int) -> list[tuple[ZipMember, bytes, int]]:
    """Parse the central directory from one read (its size is bounded by the file's).

    Returns (member, its raw name, its flags) per entry; the member's data offset is not known yet.
    """
    if is_remote(file):  # exact; for torch with SLACK bytes before it (its last small records)
        slack = min(cd_offset, _zr.SLACK if _zr.torch_padded(_zr.first_extra(file)[1]) else 0)
        _zr.fetch(file, [(cd_offset - slack, cd_size + slack)], "the central directory")
    cd = _zr.read(file, cd_offset, cd_size, "the central directory")
    if (regular := _zc.entries(cd, count, _member)) is not None:  # numpy, when regular; else the loop reports
        return regular
    members, names, pos = [], set(), 0
    unpack = _CENTRAL.unpack_from
    for _ in range(count):
        if pos + _CENTRAL.size > cd_size:
            raise _fail(file, "central directory ends inside an entry")
        f = unpack(cd, pos)
        if f[0] != _SIG_CENTRAL:
            raise _fail(file, f"bad central directory signature at offset {cd_offset + pos}")
        flags, method, crc, csize, usize = f[3], f[4], f[7], f[8], f[9]
        nlen, xlen, clen, offset = f[10], f[11], f[12], f[16]
        start = pos + _CENTRAL.size
        if start + nlen + xlen + clen > cd_size:
            raise _fail(file, "a central directory entry runs past the directory")
        if 0xFFFFFFFF in (usize, csize, offset):
            usize, csize, offset = _apply_zip64(file, cd[start + nlen: start + nlen + xlen], usize, csize, offset)
        raw_name = cd[start: start + nlen]
        name = _decode_name(file, raw_name, flags)
        if flags & _FLAG_ENCRYPTED or method not in _METHODS:
            _check_entry(file, name, flags, method)
        if name in names:
            raise _fail(file, f"member {name!r} appears twice")
        names.add(name)
        members.append((_member((name, method, crc, csize, usize, offset, -1, raw_name)), raw_name, flags))
        pos = start + nlen + xlen + clen
    if pos != cd_size:  # zipfile reads entries until cd_size bytes are used, whatever the count says
        raise _fail(file, f"the central directory holds {cd_size - pos} bytes after its {count} entries")
    return members


def _check_entry(file: AnyFile, name: str, flags: int, method: int) -> None:
    if flags & _FLAG_ENCRYPTED:
        raise FormatError(f"member {name!r} is encrypted", path=file.path)
    if method not in _METHODS:
        raise FormatError(f"member {name!r} uses compression method {method}; only stored (0) and "
                          "deflate (8) are supported", path=file.path)


def _apply_zip64(file: AnyFile, extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            body, fields, used = extra[pos + 4 : pos + 4 + length], [usize, csize, offset], 0
            for k, field in enumerate(fields):
                if field == 0xFFFFFFFF:
                    if len(body) < used + 8:
                        raise _fail(file, "ZIP64 extra field is shorter than the fields it must hold")
                    (fields[k],) = struct.unpack_from("<Q", body, used)
                    used += 8
            return fields[0], fields[1], fields[2]
        pos += 4 + length
    raise _fail(file, "a 32-bit size or offset is 0xFFFFFFFF but there is no ZIP64 extra field")


def _decode_name(file: AnyFile, raw: bytes, flags: int) -> str:
    try:
        return raw.decode("utf-8" if flags & _FLAG_UTF8 else "cp437")
    except UnicodeDecodeError:
        raise _fail(file, f"member name {raw!r} is flagged UTF-8 but is not") from None


def _locate(file: AnyFile, member: ZipMember, raw_name: bytes, flags: int, cd_offset: int,
            raw: bytes | None = None) -> ZipMember:
    """Find the member's data from its local header (`raw`: its header and name, else read now)."""
    at = member.header_offset
    if raw is None:
        raw = file.read(at, min(_LOCAL.size + len(raw_name), file.size - at), "a local header") if at < file.size \
            else b""
    if len(raw) < _LOCAL.size:
        raise CorruptFileError(f"file ends inside the local header of {member.name!r} (needs {_LOCAL.size} bytes "
                               f"at offset {at}, file has {file.size})", path=file.path)
    f = _LOCAL.unpack_from(raw)
    nlen, xlen = f[9], f[10]
    if f[0] != _SIG_LOCAL:
        raise _fail(file, f"no local header for {member.name!r} at offset {at}")
    if raw[_LOCAL.size:] != raw_name or nlen != len(raw_name) or (f[2] ^ flags) & _FLAG_UTF8:
        _compare_local_name(file, member, f[2], nlen)
    if f[3] != member.method or f[2] & _FLAG_ENCRYPTED:  # readers that trust the local header would differ
        raise _fail(file, f"the local header of {member.name!r} (method {f[3]}, flags {f[2]:#06x}) differs from "
                          f"the central directory (method {member.method}, not encrypted)")
    data = at + _LOCAL.size + nlen + xlen
    if data + member.compressed_size > cd_offset:
        raise _fail(file, f"member {member.name!r} ({member.compressed_size} bytes at {data}) runs into the "
                          f"central directory at {cd_offset}")
    if member.method == METHOD_STORED and member.compressed_size != member.size:
        raise _fail(file, f"stored member {member.name!r} has size {member.size} but {member.compressed_size} "
                          "bytes of data")
    return _member((member.name, member.method, member.crc32, member.compressed_size, member.size, at, data,
                    raw_name))


def _compare_local_name(file: AnyFile, member: ZipMember, flags: int, nlen: int) -> None:
    """The local header's name as bytes differs from the central entry's: it must still decode equal."""
    local = _zr.read(file, member.header_offset + _LOCAL.size, nlen, "a local member name")
    if _decode_name(file, local, flags) != member.name:
        raise _fail(file, f"local header name {local!r} differs from the central directory's {member.name!r}")


# ----------------------------------------------------------------------------- remote archives (see _zip_remote)


def _walk_remote(file: AnyFile, members: list[tuple[ZipMember, bytes, int]], cd_offset: int) -> list[ZipMember]:
    """A remote archive's members: data offsets predicted for torch's layout (checked when read), else
    every local header fetched now, in one batch, with the start of its data (`_zr.prefixes`)."""
    alignment = _torch_alignment(file, members, cd_offset)
    if alignment is None:
        prefix = _zr.prefixes(file)
        _zr.fetch(file, [(m.header_offset, min(_LOCAL.size + len(raw) + prefix(m.header_offset, len(raw), m.size,
                                                                               m.method != METHOD_STORED),
                                               file.size - m.header_offset))
                         for m, raw, _ in members if m.header_offset < file.size], "the local headers")
        located = [_locate(file, m, raw_name, flags, cd_offset, _local_bytes(file, m.header_offset, raw_name))
                   for m, raw_name, flags in members]
        _check_layout(file, sorted(located, key=lambda m: m.header_offset))
        return located
    predicted = []
    for m, raw_name, flags in members:
        data = _zr.torch_data_offset(m.header_offset, len(raw_name), m.size, alignment)
        if data + m.compressed_size > cd_offset:
            raise _fail(file, f"member {m.name!r} ({m.compressed_size} bytes at {data}) runs into the central "
                              f"directory at {cd_offset}")
        if m.method == METHOD_STORED and m.compressed_size != m.size:
            raise _fail(file, f"stored member {m.name!r} has size {m.size} but {m.compressed_size} bytes of data")
        predicted.append((m._replace(data_offset=data), flags))
    _check_layout(file, sorted((m for m, _ in predicted), key=lambda m: m.header_offset))
    _PENDING[file] = _zr.Pending(cd_offset, predicted)
    held = _zr.held(file)  # the first member, and those whose local headers came with the end records: free
    verify(file, [m for m, _ in predicted if m.header_offset == 0
                  or held.get(m.header_offset, _LOCAL.size + len(m.raw_name))], exact=False)
    return [m for m, _ in predicted]


def _local_bytes(file: AnyFile, at: int, raw_name: bytes) -> bytes:
    return _zr.read(file, at, min(_LOCAL.size + len(raw_name), file.size - at), "a local header") \
        if at < file.size else b""


def _torch_alignment(file: AnyFile, members: list[tuple[ZipMember, bytes, int]], cd_offset: int) -> int | None:
    """The storage alignment when the archive has torch's layout (its first member's local header
    pads the data with an ``FB`` extra record to that alignment), else None."""
    first = next(((m, raw, flags) for m, raw, flags in members if m.header_offset == 0), None)
    if first is None or not members or b"/" not in members[0][1]:
        return None
    alignment = _zr.TORCH_ALIGNMENT
    record = members[0][1][: members[0][1].index(b"/") + 1] + b".storage_alignment"
    for m, raw_name, flags in members:
        if raw_name.lower() == record.lower() and m.method == METHOD_STORED and 0 < m.size <= 16:
            if m.header_offset < first[0].compressed_size + 8192:  # after data.pkl: fetch both in one request
                file.ensure(0, m.header_offset + _LOCAL.size + len(raw_name), "the first records")
            text = read_member(file, _locate(file, m, raw_name, flags, cd_offset, _local_bytes(
                file, m.header_offset, raw_name)), 16, check_crc=False).strip()
            alignment = int(text) if text.isdigit() and len(text) <= 7 else 0
    m, raw_name, flags = first
    try:
        local = _locate(file, m, raw_name, flags, cd_offset, _local_bytes(file, 0, raw_name))
        extra = _zr.read(file, _LOCAL.size + len(raw_name), local.data_offset - _LOCAL.size - len(raw_name), "extra")
    except CorruptFileError:
        return None  # the eager walk says what is wrong
    if (alignment <= 0 or not _zr.torch_padded(extra)
            or local.data_offset != _zr.torch_data_offset(0, len(raw_name), m.size, alignment)):
        return None
    return alignment


def verify(file: AnyFile, members: list[ZipMember], *, exact: bool = True) -> None:
    """Check the local headers of those of `members` whose data offsets were predicted (a remote
    torch archive, see `_zip_remote`) before their bytes are read: fetched exactly in one batch
    (`exact`) or through the file's block cache. A no-op for every other archive."""
    pending = _PENDING.get(file) if is_remote(file) else None
    if not pending:
        return
    todo = [entry for entry in map(pending.of, members) if entry is not None]
    if exact:
        _zr.fetch(file, [(m.header_offset, _LOCAL.size + len(m.raw_name)) for m, _ in todo], "the local headers")
    for member, flags in todo:
        located = _locate(file, member._replace(data_offset=-1), member.raw_name, flags, pending.cd_offset,
                          _local_bytes(file, member.header_offset, member.raw_name))
        if located.data_offset != member.data_offset:
            raise _fail(file, f"the local header of {member.name!r} puts its data at offset {located.data_offset}, "
                              f"not at {member.data_offset} where torch's layout and the central directory place "
                              "it (the archive was altered, or torch did not write it)")
        pending.done(member)


def verify_range(file: AnyFile, start: int, stop: int) -> None:
    """`verify` the members holding bytes `start`..`stop` of a remote archive (before a tensor's read).

    A small read whose member's local header lies in the cache block it starts in reads the header
    from that block (no request of its own); otherwise the header is fetched exactly, with those of
    the next `_zr.AHEAD` pending members (a model read tensor by tensor needs them next), in flight together.
    """
    pending = _PENDING.get(file) if is_remote(file) else None
    if not pending:
        return
    members = [m for m, _ in pending.overlapping(start, stop)]
    if stop - start <= _zr.BLOCK and all(m.header_offset // _zr.BLOCK == start // _zr.BLOCK for m in members):
        verify(file, members, exact=False)
    elif members:
        verify(file, members + pending.after(stop, _zr.AHEAD))


_PENDING: weakref.WeakKeyDictionary[AnyFile, _zr.Pending] = weakref.WeakKeyDictionary()


def _check_layout(file: AnyFile, ordered: list[ZipMember]) -> None:
    """`ordered` (by header offset) starts at offset 0 and no member overlaps the next."""
    if ordered and ordered[0].header_offset != 0:
        raise _fail(file, f"{ordered[0].header_offset} bytes precede the first member (a polyglot file?)")
    for before, after in zip(ordered, ordered[1:], strict=False):
        if before.data_offset + before.compressed_size > after.header_offset:
            raise _fail(file, f"members {before.name!r} and {after.name!r} overlap")


# ----------------------------------------------------------------------------- deflate


def inflate(file: AnyFile, member: ZipMember, *, chunk: int = 1 << 20, check_crc: bool = True) -> np.ndarray:
    """Decompress a deflated member into a new read-only array of exactly ``member.size`` bytes.

    The output size is checked against deflate's maximum ratio before anything is allocated,
    decompression never produces a byte past ``member.size``, and the CRC-32 is verified (unless
    `check_crc` is false: an archive written without CRCs, see `crc_omitted`).
    """
    _check_ratio(file, member)
    verify(file, [member])
    src = file.region(member.data_offset, member.compressed_size, f"member {member.name!r}")
    out = np.empty(member.size, dtype=np.uint8)
    d, filled, pos, crc = zlib.decompressobj(-zlib.MAX_WBITS), 0, 0, 0
    try:
        while filled < member.size:
            if d.unconsumed_tail:
                piece = d.decompress(d.unconsumed_tail, min(chunk, member.size - filled))
            elif pos < len(src):
                piece = d.decompress(src[pos : pos + chunk], min(chunk, member.size - filled))  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
                pos += chunk
            else:  # all input consumed: zlib may still hold output (the rest of a long match)
                piece = d.decompress(b"", min(chunk, member.size - filled))
                if not piece:
                    break
            out[filled : filled + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            crc = zlib.crc32(piece, crc)
            filled += len(piece)
        if filled != member.size:
            raise _fail(file, f"member {member.name!r} inflates to {filled} bytes, not the {member.size} declared")
        while not d.eof:  # past the declared size one byte of output tells; fed in chunks, never copied whole
            if d.unconsumed_tail:
                extra = d.decompress(d.unconsumed_tail, 1)
            elif pos < len(src):
                extra = d.decompress(src[pos : pos + chunk], 1)  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
                pos += chunk
            else:
                break
            if extra:
                raise _fail(file, f"member {member.name!r} inflates to more than the {member.size} bytes declared")
    except zlib.error as e:  # corrupt data before or after the declared size
        raise _fail(file, f"member {member.name!r} is not valid deflate data ({e})") from None
    if check_crc and crc != member.crc32:
        raise _fail(file, f"member {member.name!r} fails its CRC-32 check")
    out.flags.writeable = False
    return out


def read_member(file: AnyFile, member: ZipMember, limit: int, *, what: str = "member",
                check_crc: bool = True) -> bytes:
    """A whole member's bytes, for members parsed in memory (pickles): at most `limit` of them,
    checked before anything is read or inflated; stored ones CRC-checked here, deflated ones by
    `inflate` (neither when `check_crc` is false: an archive written without CRCs)."""
    if member.size > limit:
        raise exceeded(f"{what} {member.name!r} size", member.size, "header_bytes", limit, path=file.path)
    if member.method != METHOD_STORED:
        return inflate(file, member, check_crc=check_crc).tobytes()
    verify(file, [member], exact=False)
    data = _zr.read(file, member.data_offset, member.size, f"{what} {member.name!r}")
    if check_crc and zlib.crc32(data) != member.crc32:
        raise _fail(file, f"{what} {member.name!r} fails its CRC-32 check")
    return data


def inflate_prefix(file: AnyFile, member: ZipMember, length: int) -> bytes:
    """The first `length` uncompressed bytes of a member (fewer if it is shorter)."""
    verify(file, [member], exact=False)
    remote = is_remote(file)  # then these bytes alone, most often fetched with the local header
    if member.method == METHOD_STORED:
        if remote:
            _zr.fetch(file, [(member.data_offset, min(length, member.size))], f"member {member.name!r}")
        return _zr.read(file, member.data_offset, min(length, member.size), f"member {member.name!r}")
    _check_ratio(file, member)
    want = min(member.compressed_size, length + 1024)
    if not remote:
        return _inflate_start(file, member, file.data[member.data_offset: member.data_offset + want], length)
    out = _inflate_start(file, member, _zr.held(file).prefix(member.data_offset, want), length)
    if len(out) < min(length, member.size):
        _zr.fetch(file, [(member.data_offset, want)], f"member {member.name!r}")
        out = _inflate_start(file, member, _zr.read(file, member.data_offset, want, f"member {member.name!r}"), length)
    return out


def _inflate_start(file: AnyFile, member: ZipMember, src: bytes | np.ndarray, length: int) -> bytes:
    try:
        return zlib.decompressobj(-zlib.MAX_WBITS).decompress(src, min(length, member.size))  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
    except zlib.error as e:
        raise _fail(file, f"member {member.name!r} is not valid deflate data ({e})") from None


def _check_ratio(file: AnyFile, member: ZipMember) -> None:
    if member.size > member.compressed_size * _MAX_DEFLATE_RATIO + 1024:
        raise _fail(file, f"member {member.name!r} claims {member.size} bytes from {member.compressed_size} "
                          "compressed, beyond what deflate can produce")
