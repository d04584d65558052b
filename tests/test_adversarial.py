"""The adversarial catalogue (docs/security.md): hostile inputs of every format, each with the error it must raise.

Each case is a file built byte by byte (tests/hostile.py, tests/pytorch_files.py) that lies:
counts and lengths of 2^31, 2^32, 2^63 (negative where signed), shapes whose product overflows,
offsets past the end, deep nesting, pickles that try to run code, zip archives that say two
things at once, polyglots. `test_hostile_input` opens it, lists it, reads every tensor and
decodes every metadata array, and requires exactly the expected `WeightioError` subclass with
the expected words, the file's path first. Every case runs under a wall-clock bound and an
address-space limit (`bounded`): a hang or an allocation sized by a forged number fails it.
Where a payload could run it would create a marker file, asserted absent, and no module may be
imported while the file is read.

The per-format modules hold more hostile tables (tests/formats/test_*.py HOSTILE…,
tests/test_pickle.py); cases here are the ones they lack. docs/security.md maps the 87 cases of
security-anchors §9 to the tests that cover them; `test_the_security_doc_names_only_real_tests`
keeps that map honest. Cases marked `gap` are findings in readers owned elsewhere, reported with
this file as the reproducer: they are strict xfails, so fixing the reader turns them into failures
until the mark is removed.
"""

from __future__ import annotations

import ast
import encodings.utf_16_be  # noqa: F401 - the codecs sniff describes BOM'd text with, before the snapshots
import encodings.utf_16_le  # noqa: F401
import functools
import re
import struct
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import weightio as wio
import weightio.quant  # noqa: F401 - imported before the sys.modules snapshots (the readers: below)
from weightio.errors import CorruptFileError, FormatError, UnsafePickleError, UnsupportedDTypeError, WeightioError
from weightio.formats import READERS, resolve, sniff
from weightio.formats.gguf import GGUFArray

from .conftest import FIXTURES
from .hostile import (
    ARRAY,
    BOOL,
    I32,
    STRING,
    U8,
    U32,
    U64,
    deflate_unfinished,
    deflated_zeros,
    eocd_counts,
    f32_entry,
    ggml_file,
    ggml_head,
    ggml_tensor,
    ggml_token,
    gguf,
    ginfo,
    gkv,
    gstr,
    npy,
    npy_dict,
    npy_of,
    patch_central,
    patch_local,
    rename_local,
    safetensors,
    with_zip64_end,
    zip_member_raw,
    zip_of,
)
from .pytorch_files import (
    MARK,
    P2,
    REDUCE,
    SETITEMS,
    STACK_GLOBAL,
    STOP,
    bounded,
    call,
    f32,
    legacy_file,
    legacy_pid,
    meta_tensor,
    pid,
    s,
    short,
    state_dict,
    tensor,
    torch_zip,
    tup,
)

"x".encode("cp437")  # the zip reader decodes CP437 names: load the codec before any snapshot
for _reader in READERS.values():  # every reader, some imported on first use, before any snapshot (a case run alone)
    resolve(_reader)
sniff.tarfile_module()  # weightio imports tarfile itself for a first block tarfile might take: before any snapshot


@dataclass(frozen=True)
class Case:
    """One hostile input: where it goes wrong and what weightio must say.

    Attributes:
        fmt: the format family it attacks (the catalogue is counted by it in docs/security.md).
        name: a short description, the test id.
        build: marker path -> the file's bytes (payloads that could run `touch` the marker).
        error: the exact `WeightioError` subclass expected.
        message: words the message must contain.
        stage: "open" (``wio.open`` refuses it) or "read" (it opens; reading the data refuses it).
        suffix: the file name's suffix (never what decides the format, sometimes a lie).
        gap: set for a finding in a reader owned by someone else: why it fails today.
    """

    fmt: str
    name: str
    build: Callable[[Path], bytes]
    error: type[WeightioError]
    message: str
    stage: str = "open"
    suffix: str = ".bin"
    gap: str | None = None


def _c(fmt: str, name: str, build: Callable[[Path], bytes], error: type[WeightioError], message: str,
       **kwargs) -> Case:
    return Case(fmt, name, build, error, message, **kwargs)


def _touch(marker: Path) -> bytes:
    return s(f"touch {marker}")


# ----------------------------------------------------------------------------- building blocks

E1 = {"a": f32_entry(0)}
D4 = bytes(4)
F32_4 = np.arange(4, dtype="<f4").tobytes()
GG_DATA = F32_4 + bytes(16)  # one F32[4] tensor padded to the alignment
TWO_NPZ = zip_of([("a.npy", npy_of(np.arange(4.0))), ("b.npy", npy_of(np.arange(2.0)))])
ONE_NPZ = zip_of([("a.npy", npy_of(np.zeros(2)))])
GG_ONE = gguf(infos=[ginfo("t", (4,), 0, 0)], data=GG_DATA)
GGJT = ggml_head(b"tjgg", 3, (0, 4, 1, 1, 1, 1, 0))
W3 = pid("FloatStorage", "0", 3)


def _st_entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"a": {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}}


def _pt(entry: bytes, numel: int = 3) -> bytes:
    """A zip checkpoint holding tensor 'w' = `entry` over a `numel`-element float32 storage '0'."""
    return torch_zip(state_dict({"w": entry}), {"0": f32(*range(numel))})


def _zip64_extra_member(size: int, offset: int | None = None) -> bytes:
    """One stored member whose ZIP64 extra field claims `size` bytes (compressed and not) and, when
    given, its local header at `offset` (the central entry's; the local header stays at 0)."""
    data, name = npy_of(np.zeros(2)), b"w.npy"
    extra = struct.pack("<HHQQ", 1, 16, size, size)
    crc = zipfile.crc32(data)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 33, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(name), len(extra))
    central_extra = extra if offset is None else struct.pack("<HHQQQ", 1, 24, size, size, offset)
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 33, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                          len(name), len(central_extra), 0, 0, 0, 0, 0 if offset is None else 0xFFFFFFFF)
    body = local + name + extra + data
    cd = central + name + central_extra
    return body + cd + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(cd), len(body), 0)


def _deflated_record_declaring(numel: int, stream_values: int) -> bytes:
    """A torch zip whose deflated record data/0 declares `numel` float32 but inflates to more."""
    data = torch_zip(state_dict({"w": tensor(pid("FloatStorage", "0", numel), 0, (numel,), (1,))}),
                     {"0": f32(*range(stream_values))}, compress={"data/0"})
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as z:
        index = [i.filename for i in z.infolist()].index("archive/data/0")
    return patch_central(data, index, "usize", 4 * numel)


# ----------------------------------------------------------------------------- the catalogue

SAFETENSORS = [
    _c("safetensors", "header length 2^31", lambda m: safetensors(E1, D4, length=2**31), CorruptFileError,
       "header length 2147483648 exceeds the 100000000-byte limit (limits.header_bytes"),
    _c("safetensors", "header length 2^32", lambda m: safetensors(E1, D4, length=2**32), CorruptFileError,
       "header length 4294967296 exceeds the 100000000-byte limit"),
    _c("safetensors", "header length 2^63", lambda m: safetensors(E1, D4, length=2**63), CorruptFileError,
       "header length 9223372036854775808 exceeds the 100000000-byte limit"),
    _c("safetensors", "header length one past the limit", lambda m: safetensors(E1, D4, length=100_000_001),
       CorruptFileError, "header length 100000001 exceeds the 100000000-byte limit"),
    _c("safetensors", "header length = file size - 7", lambda m: safetensors(b"{}", b"", length=3),
       CorruptFileError, "header length 3 runs past the end of the file (10 bytes)"),
    _c("safetensors", "dim 2^31 over 4 bytes", lambda m: safetensors(_st_entry("U8", [2**31], 0, 4), D4),
       CorruptFileError, "data_offsets [0, 4] span 4 bytes but U8 shape [2147483648] needs 2147483648"),
    _c("safetensors", "dim 2^32, offsets agreeing", lambda m: safetensors(_st_entry("U8", [2**32], 0, 2**32), D4),
       CorruptFileError, "tensors need 4294967296 data bytes but the file holds 4 (truncated?)"),
    _c("safetensors", "dim 2^63, offsets agreeing", lambda m: safetensors(_st_entry("U8", [2**63], 0, 2**63), D4),
       CorruptFileError, "tensors need 9223372036854775808 data bytes but the file holds 4"),
    _c("safetensors", "shape x itemsize = 2^64", lambda m: safetensors(_st_entry("F64", [2**61], 0, 2**64), D4),
       CorruptFileError, "tensors need 18446744073709551616 data bytes but the file holds 4"),
    _c("safetensors", "dims product 2^64 (wraps in u64)",
       lambda m: safetensors(_st_entry("F32", [2**32, 2**32], 0, 4), D4), CorruptFileError,
       "F32 shape [4294967296, 4294967296] needs 73786976294838206464"),
    _c("safetensors", "empty tensor with a 2^62 dim",
       lambda m: safetensors({**_st_entry("F32", [0, 2**62], 0, 0), "b": f32_entry(0)}, D4), CorruptFileError,
       "tensor 'a': shape [0, 4611686018427387904] is too large for numpy"),
    _c("safetensors", "offsets at 2^63", lambda m: safetensors(_st_entry("F32", [1], 2**63, 2**63 + 4), D4),
       CorruptFileError, "data_offsets begin 9223372036854775808 leaves a hole of 9223372036854775808 bytes"),
    _c("safetensors", "70 kB tensor name", lambda m: safetensors({"x" * 70_000: f32_entry(0)}, D4), CorruptFileError,
       "70000 exceeds the 65535-byte limit (limits.name_bytes"),
    _c("safetensors", "name of 20 000 4-byte characters", lambda m: safetensors({"\U0001F600" * 20_000: f32_entry(0)},
                                                                                 D4),
       CorruptFileError, "80000 exceeds the 65535-byte limit"),
    _c("safetensors", "lone surrogate in a name (\\ud800 escape)",
       lambda m: safetensors('{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', D4),
       CorruptFileError, "holds a lone surrogate ('\\ud800', from a \\u escape)"),
    _c("safetensors", "lone surrogate in metadata",
       lambda m: safetensors('{"__metadata__": {"k": "\\udfff"}, "a": {"dtype": "F32", "shape": [1], '
                             '"data_offsets": [0, 4]}}', D4), CorruptFileError, "holds a lone surrogate ('\\udfff'"),
    _c("safetensors", "NUL spelled as \\u0000 in a name",
       lambda m: safetensors('{"a\\u0000b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', D4),
       CorruptFileError, "invalid tensor name 'a\\x00b' (empty or containing NUL)"),
    _c("safetensors", "metadata nested 100 000 deep",
       lambda m: safetensors('{"__metadata__": ' + "[" * 100_000 + "]" * 100_000 + "}"), CorruptFileError,
       "header nests too deeply"),
    _c("safetensors", "UTF-8 BOM before the header", lambda m: safetensors(b"\xef\xbb\xbf" + b'{"a": 1}'),
       FormatError, "is not a checkpoint format weightio reads"),
    _c("safetensors", "NUL inside the JSON", lambda m: safetensors(b'{"a": \x00}'), CorruptFileError,
       "header is not valid JSON"),
    _c("safetensors", "Infinity literal", lambda m: safetensors('{"a": {"dtype": "F32", "shape": [1], '
                                                               '"data_offsets": [0, Infinity]}}', D4),
       CorruptFileError, "non-standard JSON literal Infinity"),
    _c("safetensors", "1e400 as a dimension", lambda m: safetensors('{"a": {"dtype": "F32", "shape": [1e400], '
                                                                   '"data_offsets": [0, 4]}}', D4),
       CorruptFileError, "shape must be a list of at most 64 non-negative integers, found [inf]"),
    _c("safetensors", "5000-digit integer", lambda m: safetensors('{"a": {"dtype": "F32", "shape": [' + "9" * 5000
                                                                 + '], "data_offsets": [0, 4]}}', D4),
       CorruptFileError, "header is not valid JSON: Exceeds the limit (4300"),
    _c("safetensors", "dtype an object", lambda m: safetensors(_st_entry({"x": 1}, [1], 0, 4), D4), CorruptFileError,
       "tensor 'a': dtype must be a string, found {'x': 1}"),
    _c("safetensors", "shape an object", lambda m: safetensors({"a": {"dtype": "F32", "shape": {"0": 1},
                                                                     "data_offsets": [0, 4]}}, D4),
       CorruptFileError, "found {'0': 1}"),
    _c("safetensors", "offsets a string", lambda m: safetensors({"a": {"dtype": "F32", "shape": [1],
                                                                       "data_offsets": "0,4"}}, D4),
       CorruptFileError, "data_offsets must be two non-negative integers, found '0,4'"),
    _c("safetensors", "header of spaces only", lambda m: safetensors(b" " * 16), FormatError,
       "is not a checkpoint format weightio reads"),
    _c("safetensors", "an npz appended (polyglot)", lambda m: safetensors(E1, D4 + ONE_NPZ), CorruptFileError,
       "bytes after the last tensor belong to no tensor"),
    _c("safetensors", "a pickle named .safetensors",
       lambda m: P2 + call("posix", "system", _touch(m)) + STOP, UnsafePickleError,
       "the pickle asks for global 'posix.system'", suffix=".safetensors"),
]

NPY = [
    _c("npy", "v1 header length 0xFFFF", lambda m: npy(b"", hlen=0xFFFF), CorruptFileError,
       ".npy header length 65535 exceeds the 10000-byte limit (limits.npy_header_bytes", suffix=".npy"),
    _c("npy", "v2 header length 2^31", lambda m: npy(b"", version=(2, 0), hlen=2**31), CorruptFileError,
       ".npy header length 2147483648 exceeds the 10000-byte limit", suffix=".npy"),
    _c("npy", "v3 header length 2^32-1", lambda m: npy(b"", version=(3, 0), hlen=2**32 - 1), CorruptFileError,
       ".npy header length 4294967295 exceeds the 10000-byte limit", suffix=".npy"),
    _c("npy", "shape (2^63,)", lambda m: npy(npy_dict("|u1", shape=(2**63,)), bytes(8)), CorruptFileError,
       "shape (9223372036854775808,) is too large for numpy", suffix=".npy"),
    _c("npy", "shape (2^64,)", lambda m: npy(npy_dict("|u1", shape=(2**64,)), bytes(8)), CorruptFileError,
       "shape (18446744073709551616,) is too large for numpy", suffix=".npy"),
    _c("npy", "shape (2^32, 2^32)", lambda m: npy(npy_dict("<f4", shape=(2**32, 2**32)), bytes(8)), CorruptFileError,
       "shape (4294967296, 4294967296) is too large for numpy", suffix=".npy"),
    _c("npy", "empty array with a 2^61 dim", lambda m: npy(npy_dict("<f8", shape=(0, 2**61))), CorruptFileError,
       "shape (0, 2305843009213693952) is too large for numpy", suffix=".npy"),
    _c("npy", "5000-digit integer literal",
       lambda m: npy("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "9" * 5000 + ",)}"), CorruptFileError,
       "is not a Python literal (SyntaxError: Exceeds the limit (4300", suffix=".npy"),
    _c("npy", "header padded with NULs", lambda m: npy(npy_dict().rstrip("\n") + "\x00" * 8 + "\n", bytes(8)),
       CorruptFileError, "source code string cannot contain null bytes", suffix=".npy"),
    _c("npy", "header is a lambda", lambda m: npy("(lambda: 0)"), CorruptFileError,
       "is not a Python literal (ValueError: malformed node or string", suffix=".npy"),
    _c("npy", "f-string descr", lambda m: npy("{'descr': f'<f{4}', 'fortran_order': False, 'shape': (2,)}"),
       CorruptFileError, "is not a Python literal", suffix=".npy"),
    _c("npy", "walrus in the header", lambda m: npy("{'descr': (x := '<f4'), 'fortran_order': False, 'shape': (2,)}"),
       CorruptFileError, "is not a Python literal", suffix=".npy"),
    _c("npy", "attribute access in the header",
       lambda m: npy("{'descr': np.float32, 'fortran_order': False, 'shape': (2,)}"), CorruptFileError,
       "is not a Python literal", suffix=".npy"),
    _c("npy", "dict unpacking in the header",
       lambda m: npy("{**{'descr': '<f4'}, 'fortran_order': False, 'shape': (2,)}"), CorruptFileError,
       "is not a Python literal", suffix=".npy"),
    _c("npy", "set literal instead of a dict", lambda m: npy("{'descr', 'fortran_order', 'shape'}"), CorruptFileError,
       "must be a dict with keys descr, fortran_order, shape; found set", suffix=".npy"),
    _c("npy", "repeated descr key (object dtype first, then <f4)",
       lambda m: npy("{'descr': '|O', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", bytes(8)),
       CorruptFileError, ".npy header repeats a key", suffix=".npy"),
    _c("npy", "bytes descr", lambda m: npy("{'descr': b'<f4', 'fortran_order': False, 'shape': (2,)}", bytes(8)),
       UnsupportedDTypeError, "descr b'<f4' is not a dtype descriptor", suffix=".npy"),
    _c("npy", "float dimension", lambda m: npy(npy_dict(shape=(2.0,)), bytes(8)), CorruptFileError,
       "shape must be a tuple of at most 64 non-negative ints, found (2.0,)", suffix=".npy"),
    _c("npy", "complex dimension", lambda m: npy(npy_dict(shape=(1j,)), bytes(8)), CorruptFileError,
       "found (1j,)", suffix=".npy"),
    _c("npy", "big-endian object dtype", lambda m: npy(npy_dict(">O"), P2 + call("posix", "system", _touch(m)) + STOP),
       UnsafePickleError, "object array ('>O'): its data is a pickle, which weightio never loads", stage="read",
       suffix=".npy"),
    _c("npy", "void of 10^11 bytes", lambda m: npy(npy_dict("|V99999999999")), UnsupportedDTypeError,
       "dtype '|V99999999999' is not a numpy dtype (or its itemsize does not fit numpy's C int)", suffix=".npy"),
    _c("npy", "sub-array descr", lambda m: npy(npy_dict(("<f4", (2,)))), UnsupportedDTypeError,
       "descr ('<f4', (2,)) is not a dtype descriptor", suffix=".npy"),
    _c("npy", "fortran_order the string 'True'", lambda m: npy(npy_dict(fortran="True"), bytes(8)), CorruptFileError,
       "fortran_order must be True or False, found 'True'", suffix=".npy"),
    _c("npy", "a pickle appended (polyglot)",
       lambda m: npy_of(np.zeros(2)) + P2 + call("posix", "system", _touch(m)) + STOP, CorruptFileError,
       "header declares float64 (2,) = 16 data bytes but", suffix=".npy"),
]

NPZ = [
    _c("npz", "local header name differs from the central directory's", lambda m: rename_local(TWO_NPZ, 1, b"c.npy"),
       CorruptFileError, "local header name b'c.npy' differs from the central directory's 'b.npy'", suffix=".npz"),
    _c("npz", "no local header where the central directory points",
       lambda m: patch_local(TWO_NPZ, 1, "sig", 0x04034B51), CorruptFileError,
       "zip archive: no local header for 'b.npy' at offset", suffix=".npz"),
    _c("npz", "central entry pointing inside another member", lambda m: patch_central(TWO_NPZ, 1, "offset", 10),
       CorruptFileError, "zip archive: no local header for 'b.npy' at offset 10", suffix=".npz"),
    _c("npz", "local header offset 2^32-2", lambda m: patch_central(TWO_NPZ, 1, "offset", 2**32 - 2),
       CorruptFileError, "file ends inside the local header of 'b.npy' (needs 30 bytes at offset 4294967294",
       suffix=".npz"),
    _c("npz", "ZIP64 entry count 2^63", lambda m: with_zip64_end(TWO_NPZ, count=2**63), CorruptFileError,
       "9223372036854775808 entries cannot fit in a 102-byte central directory", suffix=".npz"),
    _c("npz", "ZIP64 entry count 2^32", lambda m: with_zip64_end(TWO_NPZ, count=2**32), CorruptFileError,
       "4294967296 entries cannot fit in a 102-byte central directory", suffix=".npz"),
    _c("npz", "ZIP64 directory offset 2^63", lambda m: with_zip64_end(TWO_NPZ, cd_offset=2**63), CorruptFileError,
       "central directory (102 bytes at 9223372036854775808) overruns the end records", suffix=".npz"),
    _c("npz", "ZIP64 directory size 2^40", lambda m: with_zip64_end(TWO_NPZ, cd_size=2**40), CorruptFileError,
       "central directory (1099511627776 bytes at 374) overruns the end records", suffix=".npz"),
    _c("npz", "0xFFFFFFFF size without a ZIP64 extra field", lambda m: patch_central(TWO_NPZ, 0, "usize", 0xFFFFFFFF),
       CorruptFileError, "a 32-bit size or offset is 0xFFFFFFFF but there is no ZIP64 extra field", suffix=".npz"),
    _c("npz", "ZIP64 extra field claiming 2^62 bytes", lambda m: _zip64_extra_member(2**62), CorruptFileError,
       "member 'w.npy' (4611686018427387904 bytes at 55) runs into the central directory", suffix=".npz"),
    _c("npz", "ZIP64 extra field claiming 2^63 + 76 bytes (past an int64: found by fuzzing)",
       lambda m: _zip64_extra_member(2**63 + 76), CorruptFileError,
       "member 'w.npy' (9223372036854775884 bytes at 55) runs into the central directory", suffix=".npz"),
    _c("npz", "ZIP64 extra field claiming 2^64 - 1 bytes", lambda m: _zip64_extra_member(2**64 - 1), CorruptFileError,
       "member 'w.npy' (18446744073709551615 bytes at 55) runs into the central directory", suffix=".npz"),
    _c("npz", "ZIP64 local header offset 2^63 + 92 (past an int64: found by fuzzing)",
       lambda m: _zip64_extra_member(176, offset=2**63 + 92), CorruptFileError,
       "file ends inside the local header of 'w.npy' (needs 30 bytes at offset 9223372036854775900", suffix=".npz"),
    _c("npz", "entry count 65535 with no ZIP64 records", lambda m: eocd_counts(TWO_NPZ, 0xFFFF), CorruptFileError,
       "ZIP64 fields are set but there is no ZIP64 locator", suffix=".npz"),
    _c("npz", "deflate bomb lying about its size (declares 137, streams 64 MiB)",
       lambda m: zip_member_raw(b"w.npy", deflate_unfinished(npy_of(np.zeros(9, np.uint8)))
                                + deflated_zeros(64 << 20), method=8, crc=0, size=137),
       CorruptFileError, "member 'w.npy' inflates to more than the 137 bytes declared", stage="read", suffix=".npz"),
    _c("npz", "member whose .npy header claims 745 GiB over 8 bytes",
       lambda m: zip_of([("w.npy", npy(npy_dict("<f8", shape=(10**11,)), bytes(8)))]), CorruptFileError,
       "tensor 'w': header declares float64 (100000000000,) = 800000000000 data bytes but 8 follow", suffix=".npz"),
    _c("npz", "a pickle appended after the archive", lambda m: ONE_NPZ + P2 + call("posix", "system", _touch(m)) + STOP,
       CorruptFileError, "no end-of-central-directory record ends the file", suffix=".npz"),
    _c("npz", "a pickle before the archive (pickle/npz polyglot)",
       lambda m: P2 + call("posix", "system", _touch(m)) + STOP + ONE_NPZ, UnsafePickleError,
       "the pickle asks for global 'posix.system'", suffix=".npz"),
    _c("npz", "zip of data.pkl and .npy members", lambda m: zip_of([("archive/data.pkl", P2 + call("posix", "system",
                                                                                                   _touch(m)) + STOP),
                                                                     ("a.npy", npy_of(np.zeros(1)))]),
       UnsafePickleError, "archive/data.pkl: the pickle asks for global 'posix.system'", suffix=".npz"),
    _c("npz", "local header says deflate, central directory says stored",
       lambda m: patch_local(TWO_NPZ, 0, "method", 8), CorruptFileError, "differs from the central directory",
       suffix=".npz"),
    _c("npz", "encryption flag in the local header only", lambda m: patch_local(TWO_NPZ, 0, "flags", 1),
       CorruptFileError, "differs from the central directory", suffix=".npz"),
]

GGUF = [
    _c("gguf", "tensor_count 2^31", lambda m: gguf(n_tensors=2**31), CorruptFileError,
       "claims 2147483648 tensors and 0 metadata keys, more than the 8 remaining bytes can hold", suffix=".gguf"),
    _c("gguf", "tensor_count 2^32", lambda m: gguf(n_tensors=2**32), CorruptFileError,
       "claims 4294967296 tensors", suffix=".gguf"),
    _c("gguf", "metadata_kv_count 2^32", lambda m: gguf(n_kv=2**32), CorruptFileError,
       "and 4294967296 metadata keys, more than the 8 remaining bytes can hold", suffix=".gguf"),
    _c("gguf", "metadata_kv_count 2^63", lambda m: gguf(n_kv=2**63), CorruptFileError,
       "and 9223372036854775808 metadata keys", suffix=".gguf"),
    _c("gguf", "v1 metadata_kv_count 2^32-1 (u32 counts)",
       lambda m: b"GGUF" + struct.pack("<III", 1, 0, 2**32 - 1) + bytes(64), CorruptFileError,
       "and 4294967295 metadata keys, more than the 64 remaining bytes can hold", suffix=".gguf"),
    _c("gguf", "big-endian (FUGG) counts 2^63", lambda m: b"FUGG" + struct.pack(">IQQ", 3, 2**63, 2**63),
       CorruptFileError, "claims 9223372036854775808 tensors and 9223372036854775808 metadata keys", suffix=".gguf"),
    _c("gguf", "key length 2^32", lambda m: gguf([struct.pack("<Q", 2**32) + b"k" + struct.pack("<I", U8) + b"\x01"]),
       CorruptFileError, "a metadata key (4294967296 bytes) needs 4294967296 bytes at offset 32 but only",
       suffix=".gguf"),
    _c("gguf", "key length 2^63", lambda m: gguf([struct.pack("<Q", 2**63) + b"k" + struct.pack("<I", U8) + b"\x01"]),
       CorruptFileError, "a metadata key (9223372036854775808 bytes) needs", suffix=".gguf"),
    _c("gguf", "70 kB key", lambda m: gguf([gkv("k" * 70_000, U8, b"\x01")]), CorruptFileError,
       "70000 exceeds the 65535-byte limit (limits.name_bytes", suffix=".gguf"),
    _c("gguf", "string value of 2^63 bytes",
       lambda m: gguf([gstr("k") + struct.pack("<I", STRING) + struct.pack("<Q", 2**63) + b"abc"]), CorruptFileError,
       "the value of 'k' (9223372036854775808 bytes) needs", suffix=".gguf"),
    _c("gguf", "string value of 2^32 bytes",
       lambda m: gguf([gstr("k") + struct.pack("<I", STRING) + struct.pack("<Q", 2**32) + b"abc"]), CorruptFileError,
       "the value of 'k' (4294967296 bytes) needs", suffix=".gguf"),
    _c("gguf", "UINT8 array of 2^32", lambda m: gguf([gkv("a", ARRAY, struct.pack("<IQ", U8, 2**32))]),
       CorruptFileError, "array 'a' of 4294967296 UINT8 needs 4294967296 bytes", suffix=".gguf"),
    _c("gguf", "UINT64 array of 2^61 (count x 8 = 2^64)", lambda m: gguf([gkv("a", ARRAY, struct.pack("<IQ", U64,
                                                                                                      2**61))]),
       CorruptFileError, "array 'a' of 2305843009213693952 UINT64 needs 18446744073709551616 bytes", suffix=".gguf"),
    _c("gguf", "STRING array of 2^63", lambda m: gguf([gkv("a", ARRAY, struct.pack("<IQ", STRING, 2**63))]),
       CorruptFileError, "array 'a' of 9223372036854775808 strings needs", suffix=".gguf"),
    _c("gguf", "array of 2^62 arrays", lambda m: gguf([gkv("a", ARRAY, struct.pack("<IQ", ARRAY, 2**62))]),
       CorruptFileError, "array 'a' of 4611686018427387904 arrays needs", suffix=".gguf"),
    _c("gguf", "arrays nested 9 deep", lambda m: gguf([gkv("n", ARRAY, struct.pack("<IQ", ARRAY, 1) * 9
                                                           + struct.pack("<IQ", U8, 0))]),
       CorruptFileError, "metadata 'n' nests arrays more than 8 deep (limits.array_depth)", suffix=".gguf"),
    _c("gguf", "value type 2^32-1 (-1 as i32)", lambda m: gguf([gkv("a", 2**32 - 1, b"\x01")]), CorruptFileError,
       "metadata key 'a' has unknown value type 4294967295 (known: 0-12)", suffix=".gguf"),
    _c("gguf", "array element type 9999", lambda m: gguf([gkv("a", ARRAY, struct.pack("<IQ", 9999, 1) + b"\x01")]),
       CorruptFileError, "has unknown value type 9999", suffix=".gguf"),
    _c("gguf", "BOOL array holding 2", lambda m: gguf([gkv("b", ARRAY, struct.pack("<IQ", BOOL, 3) + b"\x00\x01\x02")]),
       CorruptFileError, "BOOL array 'b' holds a value other than 0 or 1", suffix=".gguf"),
    _c("gguf", "key with an overlong UTF-8 NUL", lambda m: gguf([gkv(b"a\xc0\x80", U8, b"\x01")]), CorruptFileError,
       "a metadata key is not valid UTF-8", suffix=".gguf"),
    _c("gguf", "tensor name with an encoded surrogate", lambda m: gguf(infos=[ginfo(b"t\xed\xa0\x80", (4,))],
                                                                     data=GG_DATA),
       CorruptFileError, "a tensor name is not valid UTF-8", suffix=".gguf"),
    _c("gguf", "70 kB tensor name", lambda m: gguf(infos=[ginfo("n" * 70_000, (4,))], data=GG_DATA), CorruptFileError,
       "70000 exceeds the 65535-byte limit", suffix=".gguf"),
    _c("gguf", "general.alignment 2^31+1",
       lambda m: gguf([gkv("general.alignment", U32, struct.pack("<I", 2**31 + 1))]),
       CorruptFileError, "general.alignment 2147483649 is not a power of two", suffix=".gguf"),
    _c("gguf", "general.alignment -32 as INT32",
       lambda m: gguf([gkv("general.alignment", I32, struct.pack("<i", -32))]),
       CorruptFileError, "general.alignment must be UINT32, found INT32", suffix=".gguf"),
    _c("gguf", "n_dims 2^32-1", lambda m: gguf(infos=[gstr("t") + struct.pack("<I", 2**32 - 1) + bytes(40)]),
       CorruptFileError, "has 4294967295 dimensions; GGUF tensors have at most 4", suffix=".gguf"),
    _c("gguf", "dims 2^32 x 2^32", lambda m: gguf(infos=[ginfo("t", (2**32, 2**32))], data=GG_DATA), CorruptFileError,
       "dimensions [4294967296, 4294967296] overflow a 64-bit element count", suffix=".gguf"),
    _c("gguf", "dim 2^31 over 32 bytes", lambda m: gguf(infos=[ginfo("t", (2**31,))], data=GG_DATA), CorruptFileError,
       "F32 data at 64..8589934656 runs past the end of the file (96 bytes)", suffix=".gguf"),
    _c("gguf", "offset 2^64-32 (aligned, wraps a 64-bit sum)", lambda m: gguf(infos=[ginfo("t", (4,), 0, 2**64 - 32)],
                                                                             data=GG_DATA),
       CorruptFileError, "offset 18446744073709551584 points past the end of the file", suffix=".gguf"),
    _c("gguf", "offset 2^63", lambda m: gguf(infos=[ginfo("t", (4,), 0, 2**63)], data=GG_DATA), CorruptFileError,
       "offset 9223372036854775808 points past the end of the file", suffix=".gguf"),
    _c("gguf", "accumulated size past 2^63 (CVE-2025-53630 shape)",
       lambda m: gguf(infos=[ginfo("a", (4,)), ginfo("b", (2**62,), 24, 32)], data=GG_DATA), CorruptFileError,
       "tensor 'b': dimensions [4611686018427387904] overflow a 64-bit element count", suffix=".gguf"),
    _c("gguf", "two tensors at one offset, different sizes",
       lambda m: gguf(infos=[ginfo("a", (8,)), ginfo("b", (4,))], data=bytes(64)), CorruptFileError,
       "data at 96..128 overlaps tensor 'b'", suffix=".gguf"),
    _c("gguf", "tensor type 2^32-1 (-1 as i32)", lambda m: gguf(infos=[ginfo("t", (4,), 2**32 - 1)], data=GG_DATA),
       UnsupportedDTypeError, "ggml type 4294967295 is not one weightio knows", stage="read", suffix=".gguf"),
    _c("gguf", "removed type Q4_2", lambda m: gguf(infos=[ginfo("t", (32,), 4)], data=bytes(32)),
       UnsupportedDTypeError, "Q4_2 was removed from ggml in May 2023", stage="read", suffix=".gguf"),
    _c("gguf", "a zip appended (polyglot)", lambda m: GG_ONE + ONE_NPZ, CorruptFileError,
       "belong to no tensor", suffix=".gguf"),
]

GGML = [
    _c("ggml", "vocabulary of 2^32-1 scored entries", lambda m: ggml_head(b"tjgg", 3, (2**32 - 1, 4, 1, 1, 1, 1, 0)),
       CorruptFileError, "a vocabulary of 4294967295 entries cannot fit in the 0 bytes left"),
    _c("ggml", "token length 2^32-1", lambda m: ggml_head(b"tjgg", 3, (1, 4, 1, 1, 1, 1, 0))
       + ggml_token(b"ab", length=2**32 - 1), CorruptFileError, "the vocabulary runs past the end of the file"),
    _c("ggml", "tensor name length 2^32-1",
       lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (4,), name_len=2**32 - 1), bytes(16))]), CorruptFileError,
       "a tensor name needs bytes 52..4294967347 but the file has 80"),
    _c("ggml", "n_dims 2^32-1", lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (4,), n_dims=2**32 - 1), bytes(16))]),
       CorruptFileError, "has 4294967295 dimensions (1 to 4 allowed)"),
    _c("ggml", "type 2^32-1", lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (4,), 2**32 - 1), bytes(16))]),
       UnsupportedDTypeError, "ggml type 4294967295 is unknown in ggjt v3 files"),
    _c("ggml", "dims 2^31 x 2^31", lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (2**31, 2**31)), bytes(16))]),
       CorruptFileError, "dimensions [2147483648, 2147483648] overflow a 64-bit element count"),
    _c("ggml", "four dims of 2^32-1", lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (2**32 - 1,) * 4), bytes(16))]),
       CorruptFileError, "overflow a 64-bit element count"),
    _c("ggml", "70 kB tensor name", lambda m: ggml_file(GGJT, [(ggml_tensor(b"n" * 70_000, (4,)), bytes(16))]),
       CorruptFileError, "70000 exceeds the 65535-byte limit (limits.name_bytes"),
    _c("ggml", "cut inside a tensor header", lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (4,))[:7], b"")],
                                                               aligned=False),
       CorruptFileError, "file ends inside a tensor header (needs 12 bytes at offset 36, file has 43)"),
    _c("ggml", "'lmgg' magic on a GGUF body", lambda m: b"lmgg" + GG_ONE[4:], FormatError,
       "in a layout weightio does not know: as llama.cpp's layout, the vocabulary runs past the end of the file"),
]

PYTORCH = [
    _c("pytorch", "text LONG of 100 000 digits", lambda m: P2 + b"L" + b"9" * 100_000 + b"L\n" + STOP,
       CorruptFileError, "Exceeds the limit (4300", suffix=".pt"),
    _c("pytorch", "protocol 0 payload (GLOBAL + REDUCE, text)",
       lambda m: b"cposix\nsystem\n(S'touch " + str(m).encode() + b"'\ntR.", FormatError,
       "is not a checkpoint format weightio reads", suffix=".pt"),
    _c("pytorch", "protocol 5 STACK_GLOBAL builtins.eval",
       lambda m: b"\x80\x05" + short("builtins") + short("eval") + STACK_GLOBAL + tup(short("1")) + REDUCE + STOP,
       UnsafePickleError, "the pickle asks for global 'builtins.eval'", suffix=".pt"),
    _c("pytorch", "getattr(__import__('os'), 'system') chain",
       lambda m: P2 + call("builtins", "getattr", call("builtins", "__import__", s("os")), s("system")) + STOP,
       UnsafePickleError, "the pickle asks for global 'builtins.getattr'", suffix=".pt"),
    _c("pytorch", "re-entrant torch.load inside a zip checkpoint",
       lambda m: torch_zip(P2 + call("torch", "load", s("other.pt")) + STOP, {}), UnsafePickleError,
       "archive/data.pkl: the pickle asks for global 'torch.load'", suffix=".pt"),
    _c("pytorch", "os.system inside a zip checkpoint",
       lambda m: torch_zip(P2 + call("os", "system", _touch(m)) + STOP, {}), UnsafePickleError,
       "archive/data.pkl: the pickle asks for global 'os.system'", suffix=".pt"),
    _c("pytorch", "storage numel 2^31", lambda m: torch_zip(state_dict({"w": tensor(pid("FloatStorage", "0", 2**31), 0,
                                                                                    (3,), (1,))}), {"0": f32(1, 2, 3)}),
       CorruptFileError, "storage '0': 2147483648 elements of float32 cannot fit in a", suffix=".pt"),
    _c("pytorch", "storage numel 2^63", lambda m: torch_zip(state_dict({"w": tensor(pid("FloatStorage", "0", 2**63), 0,
                                                                                    (3,), (1,))}), {"0": f32(1, 2, 3)}),
       CorruptFileError, "storage '0': 9223372036854775808 elements of float32 cannot fit", suffix=".pt"),
    _c("pytorch", "storage numel -1", lambda m: torch_zip(state_dict({"w": tensor(pid("FloatStorage", "0", -1), 0,
                                                                                  (3,), (1,))}), {"0": f32(1, 2, 3)}),
       CorruptFileError, "storage '0': -1 elements of float32 cannot fit", suffix=".pt"),
    _c("pytorch", "view of size 2^32 on 3 elements", lambda m: _pt(tensor(W3, 0, (2**32,), (1,))), CorruptFileError,
       "view (offset 0, size (4294967296,), stride (1,)) reaches element 4,294,967,295 of a 3-element storage",
       suffix=".pt"),
    _c("pytorch", "stride 2^63", lambda m: _pt(tensor(W3, 0, (2,), (2**63,))), CorruptFileError,
       "reaches element 9,223,372,036,854,775,808 of a 3-element storage", suffix=".pt"),
    _c("pytorch", "storage offset 2^63", lambda m: _pt(tensor(W3, 2**63, (1,), (1,))), CorruptFileError,
       "view (offset 9,223,372,036,854,775,808", suffix=".pt"),
    _c("pytorch", "70 kB tensor name", lambda m: torch_zip(state_dict({"n" * 70_000: tensor(W3, 0, (3,), (1,))}),
                                                         {"0": f32(1, 2, 3)}), CorruptFileError,
       "a flattened name is longer than 65,535 characters", suffix=".pt"),
    _c("pytorch", "LONG_BINGET of slot 2^32-1", lambda m: P2 + b"j\xff\xff\xff\xff" + STOP, CorruptFileError,
       "LONG_BINGET at offset 2 reads memo slot 4,294,967,295, which was never written", suffix=".pt"),
    _c("pytorch", "200 000 items added to one set", lambda m: P2 + b"\x8f" + MARK + b"K\x01" * 200_000 + b"\x90" + STOP,
       CorruptFileError, "more than 100,000 items on the pickle stack", suffix=".pt"),
    _c("pytorch", "200 000 DUPs", lambda m: P2 + b")" + b"2" * 200_000 + STOP, CorruptFileError,
       "more than 100,000 items on the pickle stack", suffix=".pt"),
    _c("pytorch", "FRAME inside a FRAME", lambda m: b"\x80\x04\x95" + struct.pack("<Q", 3) + b"\x95"
       + struct.pack("<Q", 1) + b"N.", CorruptFileError,
       "pickle 1: FRAME at offset 11 begins inside the frame that ends at offset 14", suffix=".pt"),
    _c("pytorch", "deflated record declaring 2 floats, inflating to 3",
       lambda m: _deflated_record_declaring(2, 3), CorruptFileError,
       "member 'archive/data/0' inflates to more than the 8 bytes declared", stage="read", suffix=".pt"),
    _c("pytorch", "legacy file: 2^62 elements claimed by a storage",
       lambda m: legacy_file(state_dict({"w": tensor(legacy_pid("FloatStorage", "0", 3), 0, (3,), (1,))}), ["0"],
                             [(2**62, f32(1, 2, 3))]), CorruptFileError,
       "storage '0' is declared with 3 elements but its data holds 4,611,686,018,427,387,904", suffix=".pt"),
    _c("pytorch", "view of 2^32 x 2^32 elements on zero strides", lambda m: _pt(tensor(W3, 0, (2**32, 2**32), (0, 0))),
       CorruptFileError, "too large", suffix=".pt"),
    _c("pytorch", "tensor name with a lone surrogate (BINUNICODE of ED A0 80)",
       lambda m: torch_zip(P2 + call("collections", "OrderedDict") + MARK + b"X\x03\x00\x00\x00\xed\xa0\x80"
                           + tensor(W3, 0, (3,), (1,)) + SETITEMS + STOP, {"0": f32(1, 2, 3)}),
       CorruptFileError, "surrogate", suffix=".pt"),
]

CONFUSION = [
    _c("confusion", "a PNG named .pt", lambda m: b"\x89PNG\r\n\x1a\n" + bytes(100), FormatError,
       "is a PNG image, not weights", suffix=".pt"),
    _c("confusion", "an HTML error page named .bin", lambda m: b"<!DOCTYPE html><html>", FormatError,
       "is an HTML page, not weights", suffix=".bin"),
    _c("confusion", "a Git LFS pointer named .safetensors",
       lambda m: b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", FormatError,
       "is a Git LFS pointer file", suffix=".safetensors"),
    _c("confusion", "a TorchScript archive", lambda m: zip_of([("m/constants.pkl", P2 + call("posix", "system",
                                                                                               _touch(m)) + STOP),
                                                               ("m/data.pkl", P2 + b"N."), ("m/code/m.py", b"x")]),
       FormatError, "is a TorchScript archive (torch.jit.save); TorchScript holds code and is not loaded",
       suffix=".pt"),
    _c("confusion", "an .npy magic on a safetensors body", lambda m: b"\x93NUMPY" + safetensors(E1, D4)[6:],
       FormatError, ".npy format version 0.0 is not supported", suffix=".npy"),
    _c("confusion", "one byte", lambda m: b"\x80", FormatError, "is not a checkpoint format weightio reads",
       suffix=".pt"),
    _c("confusion", "a pickle PROTO and nothing else", lambda m: b"\x80\x02", CorruptFileError,
       "the pickle ends at offset 2 without a STOP opcode", suffix=".pt"),
    _c("confusion", "an empty file", lambda m: b"", CorruptFileError, "empty file (0 bytes)", suffix=".safetensors"),
]

# Numbers too large to print (issue 12, class 4): Python refuses int -> str beyond 4300 digits, so a
# message, a repr or the command line that formats such a number from a file raised ValueError.
# Every reader now bounds shapes where it parses them and formats file numbers through
# weightio.text.number (exact up to 2^256, ~1.00e5000 beyond). Each case also goes through
# `inspect` and `convert` in tests/test_cli.py::test_numbers_too_large_to_print_reach_the_cli_cleanly.
HEX_4000 = "0x" + "f" * 4000  # parses as a literal (no digit limit for hex), prints as 4817 digits
BIG = 10**5000
HUGE_NUMBERS = [
    _c("safetensors", "dims of 4000 digits each (their product has 8000)",
       lambda m: safetensors(b'{"a":{"dtype":"F32","shape":[' + b"9" * 4000 + b"," + b"9" * 4000
                             + b'],"data_offsets":[0,4]}}', D4), CorruptFileError,
       "F32 shape [~1.00e4000, ~1.00e4000] needs ~4.00e8000"),
    _c("safetensors", "data_offsets of 4000 digits", lambda m: safetensors(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[' + b"9" * 4000 + b"," + b"9" * 4001 + b']}}', D4),
       CorruptFileError, "data_offsets [~1.00e4000, ~1.00e4001] span ~9.00e4000 bytes"),
    _c("npy", "hexadecimal dimension of 16 000 bits",
       lambda m: npy("{'descr': '<f4', 'fortran_order': False, 'shape': (" + HEX_4000 + ",), }", D4),
       CorruptFileError, "shape (~3.02e4816,) is too large for numpy", suffix=".npy"),
    _c("npy", "hexadecimal fortran_order", lambda m: npy("{'descr': '<f4', 'fortran_order': " + HEX_4000
                                                          + ", 'shape': (1,), }", D4),
       CorruptFileError, "fortran_order must be True or False, found ~3.02e4816", suffix=".npy"),
    _c("npz", "member with a hexadecimal dimension beside a zero", lambda m: zip_of([(
        "w.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, " + HEX_4000 + "), }"))]),
       CorruptFileError, "tensor 'w': shape (0, ~3.02e4816) is too large for numpy", suffix=".npz"),
    _c("gguf", "four dims of 2^64-1", lambda m: gguf(infos=[ginfo("t", (2**64 - 1,) * 4)], data=GG_DATA),
       CorruptFileError, "dimensions [18446744073709551615, 18446744073709551615, 18446744073709551615, "
                         "18446744073709551615] overflow a 64-bit element count"),
    _c("ggml", "dims 2^31-1 x 2^31-1", lambda m: ggml_file(GGJT, [(ggml_tensor(b"t", (2**31 - 1, 2**31 - 1)),
                                                                   bytes(16))]),
       CorruptFileError, "2147483647"),
    _c("pytorch", "meta tensor with a dimension of 16 610 bits", lambda m: torch_zip(state_dict(
        {"w": meta_tensor((BIG,))}), {}), CorruptFileError,
       "tensor 'w': size (~1.00e5000,) (a dimension of 2^63 or more of float32) is too large for any tensor",
       suffix=".pt"),
    _c("pytorch", "meta tensor of 2^80 elements (torch: 'Storage size calculation overflowed')",
       lambda m: torch_zip(state_dict({"w": meta_tensor((2**40, 2**40))}), {}), CorruptFileError,
       "1,208,925,819,614,629,174,706,176 elements of float32) is too large for any tensor", suffix=".pt"),
    _c("pytorch", "60-dimension view of 2^255 per dim on zero strides",
       lambda m: _pt(tensor(W3, 0, (2**255,) * 60, (0,) * 60)), CorruptFileError,
       "view of ~5.74e4605 elements", suffix=".pt"),
    _c("pytorch", "empty view with a 2^255 dimension (numpy cannot shape it)",
       lambda m: _pt(tensor(W3, 0, (0, 2**255), (1, 1))), UnsupportedDTypeError,
       "numpy cannot shape an array whose non-zero dimensions reach 2^63 bytes", stage="read", suffix=".pt"),
]

CATALOGUE = SAFETENSORS + NPY + NPZ + GGUF + GGML + PYTORCH + CONFUSION + HUGE_NUMBERS


def _read_everything(ckpt: wio.Checkpoint) -> None:
    """What a harness does with a file: list it, read every tensor, decode every metadata array."""
    for name in ckpt:
        ckpt[name].numpy()
    for value in ckpt.metadata.values():
        if isinstance(value, GGUFArray):
            value.tolist()


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.gap)] if case.gap else []
    return pytest.param(case, id=f"{case.fmt}: {case.name}", marks=marks)


@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")
@pytest.mark.parametrize("case", [_param(c) for c in CATALOGUE])
def test_hostile_input(tmp_path, case):
    marker = tmp_path / "PWNED"
    path = tmp_path / f"hostile{case.suffix}"
    path.write_bytes(case.build(marker))
    before = set(sys.modules)
    with bounded(seconds=20, extra_mib=512), pytest.raises(case.error) as info:
        ckpt = wio.open(path)
        assert case.stage == "read", f"opened, but the catalogue says {case.stage!r} refuses it"
        with ckpt:
            _read_everything(ckpt)
    assert type(info.value) is case.error
    assert case.message in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{path}: ")
    assert not marker.exists(), "a payload ran"
    assert set(sys.modules) - before == set(), "a module was imported"


def test_the_catalogue_has_60_named_cases_with_unique_names():
    named = [c for c in CATALOGUE if c.gap is None]
    assert len(named) >= 60
    assert len({(c.fmt, c.name) for c in CATALOGUE}) == len(CATALOGUE)
    assert {c.fmt for c in CATALOGUE} == {"safetensors", "npy", "npz", "gguf", "ggml", "pytorch", "confusion"}


# ----------------------------------------------------------------------------- truncation at every boundary

# Real files of every format (written by the reference libraries; see fixtures/make_fixtures.py).
TRUNCATED = ["numpy.safetensors", "dtypes.safetensors", "packed_fp4.safetensors", "numpy/fortran.npy",
             "numpy/big_endian.npy", "numpy/arrays.npz", "numpy/compressed.npz", "pytorch/protocol2.pt",
             "pytorch/protocol4.pt", "pytorch/protocol2_legacy.pt", "pytorch/protocol5_legacy.pt",
             "pytorch/numpy_weights_p4.pkl", "pytorch/legacy_tar.pt", "gguf/metadata.gguf", "gguf/v1.gguf",
             "gguf/v2.gguf", "gguf/big_endian.gguf", "gguf/quantized.gguf", "ggml/ggjt_v3.bin", "ggml/ggmf.bin",
             "ggml/ggml.bin"]
# Formats that cannot always tell a cut: GGUF cut in its final padding, a tar without its end
# blocks (both hold every tensor), a legacy ggml file cut between tensors (it has no tensor count).
LENIENT = ("gguf/", "ggml/", "pytorch/legacy_tar.pt")


def _safetensors_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    (n,) = struct.unpack_from("<Q", data)
    return [0, 8, 8 + n] + [v.info.offset + v.nbytes for v in ckpt.values()]


def _npy_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    width = 2 if data[6] == 1 else 4
    return [0, 6, 8, 8 + width, 8 + width + int.from_bytes(data[8:8 + width], "little")]


def _zip_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    import io

    cuts = []
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            nlen, xlen = struct.unpack_from("<HH", data, info.header_offset + 26)
            start = info.header_offset + 30 + nlen + xlen
            cuts += [info.header_offset, info.header_offset + 30, info.header_offset + 30 + nlen, start,
                     start + info.compress_size]
        pos = z.start_dir
    while data[pos:pos + 4] == b"PK\x01\x02":  # central directory entries, then the end records
        cuts.append(pos)
        pos += 46 + sum(struct.unpack_from("<HHH", data, pos + 28))
    return cuts + [pos]


def _pickle_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    """Every opcode of every stacked pickle, then every 8 bytes of the storages after them."""
    import io
    import pickletools

    f, cuts = io.BytesIO(data), []
    while f.tell() < len(data) and data[f.tell()] == 0x80:
        cuts += [pos for _, _, pos in pickletools.genops(f)]
        cuts.append(f.tell())
    return cuts + list(range(f.tell(), len(data), 8))


def _tar_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    import io
    import tarfile

    cuts = list(range(0, len(data), 512))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            cuts += [m.offset, m.offset_data, m.offset_data + m.size]
    return cuts


def _gguf_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    """Each field of the header (GGUF v1-v3, either byte order), then each tensor's data."""
    order = ">" if data[4:6] == b"\0\0" else "<"
    version = struct.unpack_from(order + "I", data, 4)[0]
    count = order + ("I" if version == 1 else "Q")
    size = struct.calcsize(count)
    n_tensors, n_kv = struct.unpack_from(order + count[1] * 2, data, 8)
    cuts, pos = [0, 4, 8, 8 + size], 8 + 2 * size
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(vtype: int, record: bool = True) -> None:
        nonlocal pos
        if record:
            cuts.append(pos)
        if vtype == STRING:
            pos += size + struct.unpack_from(count, data, pos)[0]
        elif vtype == ARRAY:
            etype, n = struct.unpack_from(order + "I", data, pos)[0], struct.unpack_from(count, data, pos + 4)[0]
            cuts.append(pos + 4)
            pos += 4 + size
            for k in range(n if etype in (STRING, ARRAY) else 0):
                value(etype, record=k < 2 or k == n - 1)  # a long array: its first and last items
            pos += 0 if etype in (STRING, ARRAY) else n * fixed[etype]
        else:
            pos += fixed[vtype]

    for _ in range(n_kv):
        value(STRING)  # the key
        cuts.append(pos)
        vtype = struct.unpack_from(order + "I", data, pos)[0]
        pos += 4
        value(vtype)
    for _ in range(n_tensors):
        value(STRING)  # the name
        n_dims = struct.unpack_from(order + "I", data, pos)[0]
        cuts += [pos, pos + 4, pos + 4 + n_dims * size, pos + 8 + n_dims * size]
        pos += 16 + n_dims * size
    cuts.append(pos)
    return cuts + [x for v in ckpt.values() for x in (v.info.offset, v.info.offset + v.nbytes)]


def _ggml_sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    """Magic, version, hparams, each vocabulary entry, then each tensor's header and data."""
    scored = data[:4] != b"lmgg"
    pos = 4 + 4 * scored
    cuts = [0, 4, pos] + [pos + 4 * k for k in range(8)]
    n_vocab = struct.unpack_from("<I", data, pos)[0]
    pos += 28
    for _ in range(n_vocab):
        cuts.append(pos)
        pos += 4 + struct.unpack_from("<I", data, pos)[0] + 4 * scored
    ends = [pos] + sorted(v.info.offset + v.nbytes for v in ckpt.values())
    starts = sorted(v.info.offset for v in ckpt.values())
    return cuts + ends + starts + [x for a, b in zip(ends, starts, strict=False) for x in range(a, b, 4)]


def _sections(data: bytes, ckpt: wio.Checkpoint) -> list[int]:
    if ckpt.format == "pytorch":
        return (_zip_sections if data[:4] == b"PK\x03\x04" else
                _tar_sections if data[257:262] == b"ustar" else _pickle_sections)(data, ckpt)
    return {"safetensors": _safetensors_sections, "npy": _npy_sections, "npz": _zip_sections,
            "gguf": _gguf_sections, "ggml": _ggml_sections}[ckpt.format](data, ckpt)


def _contents(path: Path) -> dict[str, bytes]:
    with wio.open(path) as ckpt:
        return {name: ckpt[name].raw().tobytes() for name in ckpt}


@pytest.mark.parametrize("fixture", TRUNCATED)
def test_truncation_at_every_section_boundary(tmp_path, fixture):
    """The file cut at each boundary between two of its sections (and a byte either side) is
    refused with a WeightioError naming it, or, only where the format cannot tell (`LENIENT`),
    opens listing original tensors with exactly their original bytes. Never another exception."""
    source = FIXTURES / fixture
    data = source.read_bytes()
    original = _contents(source)
    with wio.open(source) as ckpt:
        sections = _sections(data, ckpt)
    near = (0,) if ckpt.format == "pytorch" and data[0] == 0x80 else (-1, 0, 1)  # opcodes are already dense
    cuts = sorted({c + d for c in sections for d in near} & set(range(len(data))))
    path = tmp_path / source.name
    opened = []
    with bounded(seconds=60):
        for length in cuts:
            path.write_bytes(data[:length])
            try:
                contents = _contents(path)
            except (CorruptFileError, FormatError) as e:
                assert str(e).startswith(f"{path}: "), (length, str(e))
                continue
            assert all(original.get(name) == raw for name, raw in contents.items()), length
            opened.append(length)
    assert len(cuts) >= 10
    assert not opened or fixture.startswith(LENIENT), f"cuts at {opened} of {len(data)} bytes opened"


# ----------------------------------------------------------------------------- docs/security.md stays true

ROOT = FIXTURES.parent
DOC = ROOT / "docs" / "security.md"
_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([^`]*)\])?`")


@functools.cache
def _module_facts(path: Path) -> tuple[set[str], set[str]]:
    """Top-level names a test module defines, and every string constant in it."""
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return names, strings


def test_the_security_doc_names_only_real_tests():
    """Every `tests/FILE::NAME[case]` in docs/security.md names a test or table that exists, and
    the case a string in that module (the case names of the hostile tables)."""
    references = _REFERENCE.findall(DOC.read_text())
    assert len(references) > 150
    for file, name, case in references:
        names, strings = _module_facts(ROOT / file)
        assert name in names, f"{file}::{name}"
        assert not case or case in strings, f"{file}::{name}[{case}]"
    section9 = re.findall(r"^\| (\d+a?) \|", DOC.read_text(), re.M)
    assert section9 == [str(n) for n in range(1, 33)] + ["32a"] + [str(n) for n in range(33, 88)]


def test_the_security_doc_counts_the_catalogue():
    """The catalogue table: this module's cases counted exactly, the other tables at least as stated."""
    import importlib

    rows = re.findall(r"^\| ([^|]+) \| (\d+) \| (.*) \| (\d+) \|$", DOC.read_text(), re.M)
    fmts = {"safetensors": "safetensors", "`.npy`": "npy", "`.npz` and zip": "npz", "GGUF": "gguf",
            "legacy ggml": "ggml", "PyTorch (zip, legacy, tar) and pickles": "pytorch",
            "unknown globals (training-object stand-ins, placeholder mode)": "placeholder",
            "format confusion and polyglots": "confusion",
            "parser differentials (torch, zipfile, tarfile)": "differential",
            "the command line and writers": "cli", "models larger than memory": "huge"}
    assert [r[0] for r in rows] == list(fmts)
    for label, here, others, total in rows:
        assert int(here) == sum(c.fmt == fmts[label] and c.gap is None for c in CATALOGUE), label
        stated = [(f, n, int(k)) for f, n, k in re.findall(r"`(tests/[\w/]+)\.py::(\w+)` \((\d+)\)", others)]
        for file, name, count in stated:
            table = getattr(importlib.import_module(file.replace("/", ".")), name)
            assert not callable(table) or count == len(table.pytestmark[0].args[1]), (file, name)
            assert callable(table) or len(table) >= count, (file, name, len(table))
        assert int(total) == int(here) + sum(k for _, _, k in stated), label
