"""Builders for pickles and PyTorch checkpoint containers, byte by byte, for hostile-input tests.

Nothing here unpickles anything or needs torch: payloads are assembled from opcodes (as in
security-anchors §8a), and containers from the layouts in `weightio.formats.pytorch`'s docstring.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import resource
import signal
import struct
import time
import zipfile
from pathlib import Path

P2 = b"\x80\x02"
P4 = b"\x80\x04"
MARK, STOP, TUPLE, REDUCE, BUILD, SETITEMS, SETITEM = b"(", b".", b"t", b"R", b"b", b"u", b"s"
EMPTY_TUPLE, EMPTY_DICT, EMPTY_LIST, NONE, NEWFALSE = b")", b"}", b"]", b"N", b"\x89"
BINPERSID, STACK_GLOBAL, MEMOIZE, POP = b"Q", b"\x93", b"\x94", b"0"
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def s(text: str) -> bytes:
    """BINUNICODE (lone surrogates as CPython's pickle writes them)."""
    raw = text.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def short(text: str) -> bytes:
    """SHORT_BINUNICODE (protocol 4)."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def g(module: str, name: str) -> bytes:
    """GLOBAL."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def i(n: int) -> bytes:
    """An int: BININT1, BININT, LONG1 or LONG4."""
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    if len(raw) > 255:
        return b"\x8b" + struct.pack("<I", len(raw)) + raw  # LONG4
    return b"\x8a" + bytes([len(raw)]) + raw


def tup(*items: bytes) -> bytes:
    return MARK + b"".join(items) + TUPLE


def call(module: str, name: str, *args: bytes) -> bytes:
    """GLOBAL module name, MARK args TUPLE, REDUCE."""
    return g(module, name) + tup(*args) + REDUCE


def pid(storage_class: str, key: str, numel: int, location: str = "cpu") -> bytes:
    """A zip-format storage persistent id: ('storage', torch.<class>, key, location, numel) BINPERSID."""
    return tup(s("storage"), g("torch", storage_class), s(key), s(location), i(numel)) + BINPERSID


def ints(values: tuple[int, ...]) -> bytes:
    return tup(*(i(v) for v in values))


def tensor(storage: bytes, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""
    return call("torch._utils", "_rebuild_tensor_v2", storage, i(offset), ints(size), ints(stride), NEWFALSE,
                call("collections", "OrderedDict"))


def state_dict(entries: dict[str, bytes], protocol: bytes = P2) -> bytes:
    """An OrderedDict of name -> pickled value, as torch pickles a state dict."""
    body = b"".join(s(name) + value for name, value in entries.items())
    return protocol + call("collections", "OrderedDict") + MARK + body + SETITEMS + STOP


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def torch_zip(data_pkl: bytes, records: dict[str, bytes], *, prefix: str = "archive",
              byteorder: bytes | None = b"little", version: bytes | None = b"3\n", compress: set[str] = frozenset(),
              extra: dict[str, bytes] | None = None) -> bytes:
    """A torch zip checkpoint: <prefix>/data.pkl, <prefix>/data/<key>, byteorder, version."""
    members = {"data.pkl": data_pkl, **{f"data/{k}": v for k, v in records.items()}}
    if byteorder is not None:
        members["byteorder"] = byteorder
    if version is not None:
        members["version"] = version
    members.update(extra or {})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            method = zipfile.ZIP_DEFLATED if name in compress else zipfile.ZIP_STORED
            z.writestr(f"{prefix}/{name}" if prefix else name, data, compress_type=method)
    return buf.getvalue()


def rezip(path: Path, replace: dict[str, bytes | None], compress: set[str] = frozenset()) -> bytes:
    """A copy of a zip archive with members replaced (None: removed), optionally deflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            data = replace.get(info.filename, src.read(info))
            if data is None:
                continue
            tail = info.filename.split("/", 1)[-1]
            method = zipfile.ZIP_DEFLATED if tail in compress or info.filename in compress else zipfile.ZIP_STORED
            dst.writestr(info.filename, data, compress_type=method)
    return buf.getvalue()


def member(path: Path, suffix: str) -> bytes:
    """The bytes of the zip member whose name ends with `suffix`."""
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith(suffix)]
        return z.read(name)


def legacy_pid(storage_class: str, key: str, numel: int, view: bytes = NONE) -> bytes:
    """A legacy-format persistent id: ('storage', class, root key, location, numel, view)."""
    return tup(s("storage"), g("torch", storage_class), s(key), s("cpu"), i(numel), view) + BINPERSID


def legacy_file(main: bytes, keys: list[str], storages: list[tuple[int, bytes]], *, protocol: int = 1001,
                sys_info: bytes | None = None) -> bytes:
    """The legacy raw-pickle format: magic, protocol, sys_info, `main`, key list, then (count, data)s."""
    head = pickle.dumps(LEGACY_MAGIC, protocol=2) + pickle.dumps(protocol, protocol=2)
    head += sys_info if sys_info is not None else pickle.dumps({"protocol_version": 1001, "little_endian": True},
                                                               protocol=2)
    head += main + pickle.dumps(keys, protocol=2)
    return head + b"".join(struct.pack("<q", count) + data for count, data in storages)


def stacked(path: Path) -> list[tuple[int, int]]:
    """(start, end) of each of the five stacked pickles of a legacy file (via pickletools, stdlib)."""
    import pickletools

    data = path.read_bytes()
    f = io.BytesIO(data)
    spans = []
    for _ in range(5):
        start = f.tell()
        for _op in pickletools.genops(f):
            pass
        spans.append((start, f.tell()))
    return spans


@contextlib.contextmanager
def bounded(seconds: float = 15.0, extra_mib: int = 512):
    """Fail on a hang (SIGALRM) or on an allocation beyond `extra_mib` more address space."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vm + (extra_mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))

    def timeout(*_):
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.perf_counter()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert time.perf_counter() - start < seconds


def meta_tensor(size: tuple[int, ...], dtype: str = "float32") -> bytes:
    """A tensor saved from ``device="meta"``: a shape and no storage (ints of any size, as a pickle may hold)."""
    return call("torch._utils", "_rebuild_meta_tensor_no_storage", g("torch", dtype), ints(size),
                ints((1,) * len(size)), NEWFALSE)
