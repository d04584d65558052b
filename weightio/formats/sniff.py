"""Format detection from a file's first bytes, never from its name.

| first bytes                                   | format                                   |
|-----------------------------------------------|------------------------------------------|
| ``\\x93NUMPY``                                 | ``npy``                                  |
| ``PK\\x03\\x04`` / ``PK\\x05\\x06`` (zip)          | ``npz`` when every member is ``*.npy``;  |
|                                               | ``pytorch`` when it holds ``data.pkl``   |
| ``GGUF`` (or ``FUGG``, big-endian)            | ``gguf``                                 |
| ``lmgg`` ``fmgg`` ``tjgg`` (ggml/ggmf/ggjt)     | ``ggml``                                 |
| ``\\x80`` + protocol 2-5 (a pickle)             | ``pytorch`` (legacy torch.save, or a raw pickle) |
| ``L119547037146038801333356L\\n`` (protocol 0/1) | ``pytorch`` (legacy torch.save's magic number) |
| 8 bytes (u64 N), then ``{`` after whitespace  | ``safetensors``                          |

Two tests come first, in ``torch.load``'s order, because torch applies them to every file:
``PK\\x03\\x04`` (its zip format), then whether Python's ``tarfile`` opens the file (its legacy tar
format, see `opens_as_tar`: a valid first tar header, with or without ``ustar`` magic). A file
``tarfile`` opens is ``pytorch`` (read as a tar checkpoint or refused, never as a raw pickle); if
it also carries another format's magic it is refused as a polyglot.

Anything else raises `FormatError` saying what the file looks like (a Git LFS pointer, an HTML
page, HDF5, gzip …) and what to do. An HTML page (a browser's "Save link as" on a hosting site,
a failed download) is told by its first tag within the first 512 bytes, whatever comes before it:
whitespace, a UTF-8 or UTF-16 byte-order mark (UTF-16 without one too), any letter case, and
``<!DOCTYPE``, ``<html``, ``<head``, ``<body``, ``<!--`` (Internet Explorer's "saved from url"
mark), ``<meta``, ``<title``, ``<script``, ``<?xml`` (XHTML). Only files that no format matched get
this far, so no weight file can be taken for a page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import FormatError
from . import _zip

if TYPE_CHECKING:
    from .base import AnyFile

__all__ = ["sniff", "FORMATS", "looks_like_html", "opens_as_tar"]

FORMATS = ("safetensors", "pytorch", "gguf", "ggml", "npz", "npy")

_MAGICS = (
    (b"\x93NUMPY", "npy"),
    (b"GGUF", "gguf"),
    (b"FUGG", "gguf"),  # the byte-swapped magic once proposed for big-endian files (llama.cpp#3957)
    (b"lmgg", "ggml"),
    (b"fmgg", "ggml"),
    (b"tjgg", "ggml"),
)
_MAGIC_BYTES = tuple(magic for magic, _ in _MAGICS)

_TAR_BLOCK = 512  # a tar header

# torch's legacy magic number 0x1950a86a20f9469cfc6c as protocols 0 and 1 pickle it (a text LONG).
_LEGACY_MAGIC_TEXT = b"L119547037146038801333356L\n"

# Things people point weight loaders at by mistake, and what to tell them.
_NOT_CHECKPOINTS = (
    (b"version https://git-lfs", "a Git LFS pointer file, not the weights: run `git lfs pull` to fetch them"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5); weightio does not read HDF5"),
    (b"\x1f\x8b", "gzip-compressed; decompress it first"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive; extract it first"),
    (b"\x89PNG", "a PNG image, not weights"),
    (b"\xff\xd8\xff", "a JPEG image, not weights"),
)


def sniff(file: AnyFile) -> str:
    """The format of `file`, one of `FORMATS`.

    Raises:
        FormatError: the bytes are no checkpoint format weightio knows, or two at once (a file that
            ``tarfile`` opens and that also has another format's magic); says what they look like.
    """
    head = file.read(0, min(file.size, 512), "the first bytes")
    if head.startswith(b"PK\x03\x04"):  # torch.load's test for its zip format
        return _sniff_zip(file)
    if opens_as_tar(head):  # torch.load's next test: whatever tarfile opens is a legacy tar checkpoint to it
        other = _other_format(head, file.size)
        if other:
            raise FormatError(f"is both {other} and a tar archive, which torch.load reads as a legacy checkpoint; "
                              "refused as a polyglot file", path=file.path)
        return "pytorch"
    if head.startswith(_MAGIC_BYTES):
        return next(fmt for magic, fmt in _MAGICS if head.startswith(magic))
    if head.startswith(b"PK\x05\x06"):
        return _sniff_zip(file)
    # Before the pickle test: a safetensors header length such as 0x280 begins with the bytes
    # of a pickle PROTO opcode, while "{" is no pickle opcode.
    if _looks_like_safetensors(head, file.size):
        return "safetensors"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pytorch"
    if head.startswith(_LEGACY_MAGIC_TEXT):
        return "pytorch"
    for magic, words in _NOT_CHECKPOINTS:
        if head.startswith(magic):
            raise FormatError(f"is {words}", path=file.path)
    if looks_like_html(head):
        raise FormatError(f"is {_HTML}", path=file.path)
    raise FormatError(f"is not a checkpoint format weightio reads (safetensors, PyTorch, GGUF, ggml, npz, npy); "
                      f"it starts with {head[:16]!r}", path=file.path)


_HTML = "an HTML page, not weights (a failed download?)"
# How a saved page starts, after whitespace and any byte-order mark (compared in lower case).
_HTML_STARTS = ("<!doctype", "<html", "<head", "<body", "<!--", "<meta", "<title", "<script", "<?xml")
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def looks_like_html(head: bytes) -> bool:
    """Whether the first bytes `head` (at most 512 are looked at) begin an HTML page."""
    head = head[:512]
    encoding = "latin-1"
    for bom, name in _BOMS:
        if head.startswith(bom):
            head, encoding = head[len(bom):], name
            break
    else:
        if head[1:8:2] == b"\0\0\0\0":  # UTF-16 without a BOM: "<\0h\0t\0…" (or "\0<\0h…" big-endian)
            encoding = "utf-16-le"
        elif head[0:8:2] == b"\0\0\0\0":
            encoding = "utf-16-be"
    text = head.decode(encoding, errors="replace").lstrip(" \t\r\n\f\v\ufeff").lower()
    return text.startswith(_HTML_STARTS)


def opens_as_tar(head: bytes) -> bool:
    """Whether ``tarfile.open(fileobj, "r:")`` — what ``torch.load`` tries on every non-zip file —
    accepts a file that starts with `head` (at least its first 512 bytes, when it has them).

    tarfile accepts when its first header parses (checksum and number fields) or is all zeros, and
    refuses a shorter file. Headers of the extended kinds (GNU long names, sparse files, PAX) are
    accepted or not depending on the blocks after them: counted as tar here (they are then read
    as one or refused, which is the safe side either way).
    """
    if len(head) < _TAR_BLOCK:
        return False
    if not _tar_checksum_may_match(head[:_TAR_BLOCK]):
        return False  # tarfile would refuse it: no need to import tarfile (1 ms) for every file
    tarfile = tarfile_module()
    try:
        tarfile.TarInfo.frombuf(head[:_TAR_BLOCK], tarfile.ENCODING, "surrogateescape")
    except tarfile.EOFHeaderError:
        return True
    except tarfile.HeaderError:
        return False
    return True


_HIGH_BYTES = bytes(range(128, 256))
# Every byte that `int(text.strip(), 8)` can get past in the checksum field (digits, Python's ASCII
# whitespace, a sign, '_' and a "0o" prefix): a field holding any other byte before its first NUL
# (a safetensors header's JSON, say) is refused by tarfile without parsing it.
_CHECKSUM_BYTES = b"0123456789 \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f+-_oO"
_ZERO_BLOCK = bytes(_TAR_BLOCK)

# What the C `plain_safetensors` is given to be sure `sniff` calls a file safetensors: the prefixes
# tested before safetensors (the zip records and `_MAGICS`) and the bytes a tar checksum field may
# hold (see weightio/_speedups.c, `vouched`; tests/test_scale.py holds the two to agreeing on
# random first bytes)
SAFETENSORS_VOUCH = ((b"PK\x03\x04", b"PK\x05\x06", *_MAGIC_BYTES), _CHECKSUM_BYTES)


def _tar_checksum_may_match(block: bytes) -> bool:
    """False only where `tarfile` refuses the header `block` (a file's first 512 bytes) for its
    checksum, computed as it computes it (the checksum field read as octal text after cutting at
    NUL, compared with the unsigned and signed sums of the block with that field as spaces); True
    for an all-zero block, for a base-256 field and for a match, which `tarfile` itself then judges."""
    if block == _ZERO_BLOCK or block[148] in (0o200, 0o377):
        return True
    field = block[148:156].split(b"\0", 1)[0]
    if field.strip(_CHECKSUM_BYTES):  # (nothing left only when every byte is one of them)
        return False  # (the common case: no number there at all)
    try:
        stored = int(field.decode("ascii").strip() or "0", 8)
    except (UnicodeDecodeError, ValueError):
        return False
    rest = block[:148] + block[156:]
    unsigned = 256 + sum(rest)
    signed = unsigned - 256 * (len(rest) - len(rest.translate(None, _HIGH_BYTES)))
    return stored in (unsigned, signed)


def tarfile_module() -> Any:
    """Python's `tarfile`, imported when first needed (most files never get that far)."""
    import tarfile

    return tarfile


def _other_format(head: bytes, size: int) -> str:
    """What else a file that `tarfile` opens looks like ("" when nothing: a pickle is no other)."""
    for magic, fmt in _MAGICS:
        if head.startswith(magic):
            return f"a {fmt} file"
    if head.startswith(b"PK\x05\x06"):
        return "a zip archive"
    return "a safetensors file" if _looks_like_safetensors(head, size) else ""


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    # A JSON object after the 8-byte length is enough: a length that is absurd or runs past the
    # end is the reader's to report precisely, not a reason to call the file unknown. Other JSON
    # values (a malformed header) count only when the length is plausible.
    if head[8:9] == b"{":  # (every header a writer makes: no copy of the rest to strip)
        return True
    if len(head) < 9:
        return False
    first = head[8:].lstrip(b" \t\r\n")[:1]
    n = int.from_bytes(head[:8], "little")
    return first == b"{" or (first in (b"[", b'"') and 2 <= n <= size - 8)


def _sniff_zip(file: AnyFile) -> str:
    members = _zip.read_members(file)
    # torch finds records without regard to ASCII case. One search of all the names joined finds
    # every name that is or ends in /constants.pkl (and, rarely, a name holding a NUL before it):
    # only then are the names compared one by one.
    joined = b"\0" + b"\0".join([m.raw_name for m in members]).lower() + b"\0"
    if (b"/constants.pkl\0" in joined or b"\0constants.pkl\0" in joined) and any(
            n == b"constants.pkl" or n.endswith(b"/constants.pkl") for n in (m.raw_name.lower() for m in members)):
        raise FormatError("is a TorchScript archive (torch.jit.save); TorchScript holds code and is not "
                          "loaded — save the module's state_dict() with torch.save instead", path=file.path)
    if any(n == b"data.pkl" or n.endswith(b"/data.pkl") for n in (m.raw_name.lower() for m in members)):
        return "pytorch"  # (torch writes data.pkl first)
    names = [m.name for m in members]
    if all(n.endswith(".npy") for n in names):
        return "npz"
    shown = ", ".join(repr(n) for n in names[:5]) + (" …" if len(names) > 5 else "")
    raise FormatError(f"is a zip archive but neither an .npz nor a PyTorch checkpoint (members: {shown})",
                      path=file.path)
