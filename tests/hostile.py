"""Byte-level builders for hostile files of every format but PyTorch (see tests/pytorch_files.py).

Each builder writes the layout of its format's module docstring with `struct.pack`, so a test
can forge any field: counts and lengths that lie, offsets past the end, names that are not
UTF-8. Nothing here uses weightio to build a file.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib

import numpy as np

# ----------------------------------------------------------------------------- safetensors


def safetensors(header: dict | bytes | str, data: bytes = b"", *, length: int | None = None) -> bytes:
    """u64 header length (forged when `length` is given), the header (JSON unless bytes/str), data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def f32_entry(begin: int, count: int = 1, shape: list | None = None) -> dict:
    return {"dtype": "F32", "shape": [count] if shape is None else shape, "data_offsets": [begin, begin + 4 * count]}


# ----------------------------------------------------------------------------- npy / npz


def npy(header: str | bytes, data: bytes = b"", *, version: tuple[int, int] = (1, 0), hlen: int | None = None) -> bytes:
    """Magic, version, header length (forged when `hlen` is given), header text, data."""
    body = header.encode("latin1") if isinstance(header, str) else header
    field = "<H" if version == (1, 0) else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(field, len(body) if hlen is None else hlen) + body + data


def npy_dict(descr: object = "<f4", fortran: object = False, shape: object = (2,)) -> str:
    return "{" + f"'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, " + "}\n"


def npy_of(arr: np.ndarray) -> bytes:
    """What numpy.save writes (numpy is the reference writer of the format)."""
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def zip_of(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    """A zip archive written by Python's zipfile (duplicates allowed: it only warns)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


_CENTRAL_FIELDS = {"flags": (8, "<H"), "method": (10, "<H"), "crc": (16, "<I"), "csize": (20, "<I"),
                   "usize": (24, "<I"), "nlen": (28, "<H"), "xlen": (30, "<H"), "offset": (42, "<I")}
_LOCAL_FIELDS = {"sig": (0, "<I"), "flags": (6, "<H"), "method": (8, "<H"), "csize": (18, "<I"), "usize": (22, "<I")}


def _nth(data: bytes, signature: bytes, index: int) -> int:
    pos = -1
    for _ in range(index + 1):
        pos = data.index(signature, pos + 1)
    return pos


def patch_central(data: bytes, index: int, field: str, value: int) -> bytes:
    """Change one field of the index-th central directory entry."""
    pos = _nth(data, b"PK\x01\x02", index)
    at, fmt = _CENTRAL_FIELDS[field]
    return data[: pos + at] + struct.pack(fmt, value) + data[pos + at + struct.calcsize(fmt):]


def patch_local(data: bytes, index: int, field: str, value: int) -> bytes:
    """Change one field of the index-th local file header."""
    pos = _nth(data, b"PK\x03\x04", index)
    at, fmt = _LOCAL_FIELDS[field]
    return data[: pos + at] + struct.pack(fmt, value) + data[pos + at + struct.calcsize(fmt):]


def rename_local(data: bytes, index: int, new: bytes) -> bytes:
    """Rename the index-th member in its local header only (same length)."""
    pos = _nth(data, b"PK\x03\x04", index)
    nlen = struct.unpack_from("<H", data, pos + 26)[0]
    assert len(new) == nlen
    return data[: pos + 30] + new + data[pos + 30 + nlen:]


def eocd_counts(data: bytes, count: int) -> bytes:
    """Change both entry counts of the end record (archives without a comment)."""
    return data[:-14] + struct.pack("<HH", count, count) + data[-10:]


def with_zip64_end(data: bytes, *, count: int | None = None, cd_size: int | None = None,
                   cd_offset: int | None = None) -> bytes:
    """Rewrite the end of a (small, comment-less) archive with ZIP64 end records whose fields may lie."""
    eocd = len(data) - 22
    _, _, _, n, real_n, size, offset, _ = struct.unpack_from("<IHHHHIIH", data, eocd)
    record = eocd
    z64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, real_n if count is None else count,
                      real_n if count is None else count, size if cd_size is None else cd_size,
                      offset if cd_offset is None else cd_offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, record, 1)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return data[:eocd] + z64 + locator + end


def deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def deflate_unfinished(data: bytes) -> bytes:
    """`data` as raw deflate blocks that do not end the stream (so that more can follow)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


def deflated_zeros(n: int, chunk: int = 1 << 20) -> bytes:
    """A raw deflate stream of `n` zero bytes, built without holding them (a bomb: ~1000:1)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = bytes(min(chunk, n))
    parts, left = [], n
    while left:
        parts.append(c.compress(block[: min(chunk, left)]))
        left -= min(chunk, left)
    return b"".join(parts) + c.flush()


def zip_member_raw(name: bytes, stream: bytes, *, method: int, crc: int, size: int) -> bytes:
    """A one-member archive whose member data is `stream` as given and whose entry declares `size`."""
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 33, crc, len(stream), size, len(name), 0)
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 33, crc, len(stream), size,
                          len(name), 0, 0, 0, 0, 0, 0)
    body = local + name + stream
    cd = central + name
    return body + cd + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(cd), len(body), 0)


# ----------------------------------------------------------------------------- GGUF

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)


def gstr(text: str | bytes, *, width: str = "Q") -> bytes:
    """A GGUF string: its length (u64; u32 in v1), then its bytes."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<" + width, len(raw)) + raw


def gkv(key: str | bytes, vtype: int, value: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + value


def ginfo(name: str | bytes, ne: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return (gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            + struct.pack("<IQ", ggml_type, offset))


def gguf(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", *, n_tensors: int | None = None,
         n_kv: int | None = None, version: int = 3, align: int = 32) -> bytes:
    """Magic, version, counts (forged when given), key/values, tensor infos, padding, data."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % align) + data


# ----------------------------------------------------------------------------- legacy ggml


def ggml_head(magic: bytes = b"tjgg", version: int | None = 3,
              hparams: tuple[int, ...] = (0, 4, 1, 1, 1, 1, 0)) -> bytes:
    """Magic, version (none for 'lmgg'), the seven llama hyperparameters (n_vocab first)."""
    head = magic + (b"" if version is None else struct.pack("<I", version))
    return head + struct.pack(f"<{len(hparams)}I", *hparams)


def ggml_token(text: bytes, score: float | None = 0.0, *, length: int | None = None) -> bytes:
    return struct.pack("<I", len(text) if length is None else length) + text + (
        b"" if score is None else struct.pack("<f", score))


def ggml_tensor(name: bytes, ne: tuple[int, ...], ggml_type: int = 0, *, n_dims: int | None = None,
                name_len: int | None = None) -> bytes:
    """A tensor header: n_dims, name length, type (each forgeable), ne, name; no padding, no data."""
    head = struct.pack("<III", len(ne) if n_dims is None else n_dims, len(name) if name_len is None else name_len,
                       ggml_type)
    return head + b"".join(struct.pack("<I", d) for d in ne) + name


def ggml_file(head: bytes, tensors: list[tuple[bytes, bytes]] = (), *, aligned: bool = True) -> bytes:
    """`head` then each (tensor header, data); ggjt (`aligned`) pads each header to 32 bytes."""
    out = head
    for header, data in tensors:
        out += header
        out += bytes(-len(out) % 32) if aligned else b""
        out += data
    return out


# ----------------------------------------------------------------------------- tar (parser differentials)


def tar_header(name: bytes, size: int = 0, *, kind: bytes = b"0", magic: bytes = b"",
               fields: dict[int, bytes] | None = None) -> bytes:
    """One 512-byte tar header, byte by byte: an old v7 header (no magic) unless `magic` is given
    (``b"ustar\\x0000"`` POSIX, ``b"ustar  \\x00"`` GNU). `fields` overwrites bytes at offsets before
    the checksum is computed (to make a header that is also something else). The checksum is the
    unsigned sum of the header with its own field read as spaces, written as tarfile writes it."""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[156:157] = kind
    block[257:257 + len(magic)] = magic
    for at, raw in (fields or {}).items():
        block[at:at + len(raw)] = raw
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def tar_of(members: list[tuple[bytes, bytes]], *, magic: bytes = b"", end: bool = True) -> bytes:
    """Headers from `tar_header` and their data padded to 512 bytes, then the two zero blocks."""
    out = b""
    for name, data in members:
        out += tar_header(name, len(data), magic=magic) + data + bytes(-len(data) % 512)
    return out + (bytes(1024) if end else b"")


def pax_record(key: bytes, value: bytes) -> bytes:
    """One ``"<len> <key>=<value>\\n"`` record (its length counts itself)."""
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n += 1
    return str(n).encode() + body
