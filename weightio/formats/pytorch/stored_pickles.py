"""The pickles a PyTorch checkpoint file holds, found without trusting the file to be well formed:
what `weightio scan` inspects (`pickles`). Built on the container layer (`.containers`).
"""

from __future__ import annotations

from typing import Any

from ..._io import MappedFile
from ...errors import CorruptFileError, WeightioError
from ...limits import current as current_limits
from .. import _zip
from . import lexer, ranged, tar, unpickler
from .containers import MAGIC_NUMBER, MAX_STACKED, TarContainer, container_kind
from .opcodes import OPCODE_NAMES, PROTO

__all__ = ["pickles"]


def pickles(file: MappedFile) -> list[tuple[str, bytes]]:
    """(location, bytes) of every pickle stream in `file`, found without trusting the file to be
    well formed: what `weightio scan` inspects. A pickle that cannot be read is listed with the
    reason in its location and empty (zip) or its first bytes (stacked pickles)."""
    head = file.read(0, min(file.size, 512), "the first bytes")
    kind = container_kind(head)
    if kind == "zip":
        return _zip_pickles(file)
    if kind == "tar":
        return _tar_pickles(file)
    return _stacked_pickles(file)


def _zip_pickles(file: MappedFile) -> list[tuple[str, bytes]]:
    """Every member that holds a pickle, found by its bytes (a PROTO opcode first, or a small member
    that lexes as one whole pickle) or its name (``*.pkl``/``*.pickle`` in any case), read within
    the limit the reader applies. Names that fold equal are listed too (the reader refuses them)."""
    try:
        members = _zip.read_members(file)
    except WeightioError:
        return _stacked_pickles(file)  # e.g. a pickle with a zip appended: look at the front
    limit = current_limits().header_bytes
    check_crc = not _zip.crc_omitted(members)  # as the reader: torch writes no CRCs when told not to
    found = []
    for m in members:
        try:
            if not _holds_pickle(file, m, check_crc):
                continue
            found.append((m.name, _zip.read_member(file, m, limit, check_crc=check_crc)))
        except WeightioError as e:
            found.append((f"{m.name} ({e.message})", b""))
    return found


_SMALL_MEMBER = 1 << 20  # members up to this size are lexed whole to find protocol 0/1 pickles


def _holds_pickle(file: MappedFile, member: _zip.ZipMember, check_crc: bool) -> bool:
    if member.raw_name.lower().endswith((b".pkl", b".pickle")):
        return True
    head = _zip.inflate_prefix(file, member, 2)
    if len(head) == 2 and head[0] == PROTO and 2 <= head[1] <= 5:
        return True
    if not head or head[0] not in OPCODE_NAMES or member.size > _SMALL_MEMBER:
        return False
    data = _zip.read_member(file, member, _SMALL_MEMBER, check_crc=check_crc)
    try:
        return lexer.lex(data, path=file.path, what=member.name, collect=True).pos == len(data)
    except WeightioError:
        return False


def _tar_pickles(file: MappedFile) -> list[tuple[str, bytes]]:
    """The pickles the tar reader walked (up to any error), the first pickle of every other member
    (found by its bytes, whatever the member is called), and — since torch falls back to reading
    the file as a raw pickle when ``tarfile`` fails past its first header — any pickles at offset 0."""
    found: list[tuple[str, bytes]] = []
    try:
        TarContainer(file, current_limits(), found)
    except WeightioError:
        pass  # the pickles read up to the failure are still listed
    walked = {loc.split(" (")[0] for loc, _ in found}
    for m in tar.read_members(file, partial=True):
        label = f"member {m.name!r}"
        if label not in walked and (raw := _first_pickle(file, m.data_offset, m.size, label)) is not None:
            found.append((label, raw))
    found += [(f"read as a raw pickle, {loc}", data) for loc, data in _stacked_pickles(file)]
    return found


def _first_pickle(file: MappedFile, offset: int, size: int, label: str) -> bytes | None:
    """The pickle at the start of a member, or its first bytes if it starts with PROTO but does not
    lex; None when the member does not start with a pickle."""
    if size == 0:
        return None
    try:
        return ranged.lex_pickle(file, offset, offset + size, what=label, limits=current_limits(), exact=True,
                                 window=512, collect=True)[1]
    except WeightioError:
        head = ranged.read(file, offset, min(size, 1 << 16), label, exact=True)
        return head if head[0] == PROTO else None


def _stacked_pickles(file: MappedFile) -> list[tuple[str, bytes]]:
    """Pickles back to back from offset 0 (a legacy torch file has five, then raw storages)."""
    found: list[tuple[str, bytes]] = []
    pos, limits = 0, current_limits()
    while pos < file.size and len(found) < MAX_STACKED:
        label = f"pickle {len(found) + 1} (bytes {pos:,}..)"
        try:
            end, raw, _ = ranged.lex_pickle(file, pos, file.size, what=label, limits=limits, collect=True)
        except WeightioError as e:
            head = file.read(pos, min(file.size - pos, 1 << 16), label)
            if head[0] == PROTO:  # it starts like a pickle but is broken: report it
                found.append((f"{label}: {e.message}", head))
            break
        found.append((label.replace("..)", f"..{end:,})"), raw))
        pos = end
        if len(found) == 5 and _is_legacy(found[0][1]):
            break  # the storages' raw bytes follow
    return found


def _is_legacy(first: bytes) -> bool:
    """Whether `first` is the legacy format's magic-number pickle."""
    try:
        value = unpickler.load(first, _no_persistent)
    except WeightioError:
        return False
    return type(value) is int and value == MAGIC_NUMBER


def _no_persistent(pid: Any) -> Any:
    raise CorruptFileError("unexpected persistent id")
