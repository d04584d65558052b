"""weightio.limits and resource bounds: one table of limits, settable per call, per block and per
process, wired into every reader and the CLI; memory while opening bounded by the header bytes
actually present (never by counts a file claims); decompression bounded by the declared size."""

from __future__ import annotations

import os
import struct
import threading
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
import weightio.formats.ggml  # noqa: F401 - imported before any allocation is traced
import weightio.formats.pytorch  # noqa: F401
from weightio import limits
from weightio.errors import CorruptFileError, UsageError, WeightioError
from weightio.formats import gguf as gguf_format
from weightio.formats import numpy as numpy_format
from weightio.formats import open_file
from weightio.formats import safetensors as safetensors_format
from weightio.formats.pytorch import lexer
from weightio.limits import Limits

from .conftest import FIXTURES
from .hostile import (
    ARRAY,
    STRING,
    U8,
    U32,
    deflate_unfinished,
    deflated_zeros,
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
    safetensors,
    zip_member_raw,
    zip_of,
)
from .pytorch_files import (
    MARK,
    P2,
    SETITEMS,
    STOP,
    TUPLE,
    bounded,
    call,
    f32,
    legacy_file,
    legacy_pid,
    pid,
    s,
    state_dict,
    tensor,
    torch_zip,
)

MiB = 1 << 20


class traced:  # noqa: N801 - used as `with traced() as peak:`
    """Trace Python-heap allocations (numpy's included) in a block; ``peak()`` is the peak since entry."""

    def __enter__(self):
        tracemalloc.start()
        tracemalloc.reset_peak()
        return lambda: tracemalloc.get_traced_memory()[1]

    def __exit__(self, *exc):
        tracemalloc.stop()


# ----------------------------------------------------------------------------- the table


def test_defaults_are_the_limits_the_readers_had():
    d = limits.DEFAULTS
    assert d == Limits()
    assert d.header_bytes == safetensors_format.MAX_HEADER_SIZE == 100_000_000
    assert d.npy_header_bytes == numpy_format.MAX_HEADER_SIZE == 10_000
    assert d.name_bytes == gguf_format.MAX_KEY_LENGTH == 65_535
    assert d.array_depth == gguf_format.MAX_ARRAY_DEPTH == 8
    assert d.tensors == 1_000_000
    assert d.nesting_depth == lexer.MAX_MARKS == 1_000
    assert d.pickle_opcodes == lexer.MAX_OPCODES and d.pickle_stack == lexer.MAX_STACK
    assert d.inflated_bytes is None
    assert wio.Limits is Limits and wio.limits is limits


@pytest.mark.parametrize("text,value", [("1000000", 10**6), ("1_000_000", 10**6), ("100MB", 10**8), ("100 mb", 10**8),
                                        ("5k", 5000), ("2KiB", 2048), ("1GiB", 2**30), ("3gb", 3 * 10**9),
                                        ("0", 0), (" 7B ", 7)])
def test_parse_size(text, value):
    assert limits.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "-1", "1.5MB", "10 parsecs", "MB", "0x10"])
def test_parse_size_refuses(text):
    with pytest.raises(UsageError, match="is not a whole number with an optional unit"):
        limits.parse_size(text)


def test_limits_are_validated():
    for bad in (-1, 1.5, True, "10", None):
        with pytest.raises(UsageError, match="limit header_bytes must be a non-negative int"):
            Limits(header_bytes=bad)
    assert Limits(inflated_bytes=None).inflated_bytes is None
    with pytest.raises(TypeError):
        limits.DEFAULTS.replace(header_size=10)
    assert limits.DEFAULTS.replace(tensors=5).tensors == 5 and limits.DEFAULTS.tensors == 1_000_000
    assert Limits(header_bytes=100, npy_header_bytes=10_000).npy_header == 100


def test_environment_variables_set_limits(monkeypatch):
    assert set(limits.ENVIRONMENT.values()) == {"WEIGHTIO_MAX_HEADER_BYTES", "WEIGHTIO_MAX_NPY_HEADER_BYTES",
                                                "WEIGHTIO_MAX_TENSORS", "WEIGHTIO_MAX_NAME_BYTES",
                                                "WEIGHTIO_MAX_ARRAY_DEPTH", "WEIGHTIO_MAX_NESTING_DEPTH",
                                                "WEIGHTIO_MAX_PICKLE_OPCODES", "WEIGHTIO_MAX_PICKLE_STACK",
                                                "WEIGHTIO_MAX_INFLATED_BYTES"}
    monkeypatch.setenv("WEIGHTIO_MAX_HEADER_BYTES", "1MB")
    monkeypatch.setenv("WEIGHTIO_MAX_TENSORS", "12")
    monkeypatch.setenv("WEIGHTIO_MAX_INFLATED_BYTES", "")  # empty: unset
    assert limits.current() == Limits(header_bytes=10**6, tensors=12)
    monkeypatch.setenv("WEIGHTIO_MAX_NAME_BYTES", "lots")
    with pytest.raises(WeightioError, match="environment variable WEIGHTIO_MAX_NAME_BYTES: 'lots' is not a whole"):
        limits.current()


def test_the_environment_is_asked_only_for_the_variables_it_holds(monkeypatch):
    for variable in limits.ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    expected = [] if os.name == "posix" else list(limits.ENVIRONMENT.items())  # (elsewhere: every one, as before)
    assert list(limits._maybe_set(os.environ)) == expected and limits.current() is limits.DEFAULTS
    monkeypatch.setenv("WEIGHTIO_MAX_PICKLE_STACK", "7")
    assert ("pickle_stack", "WEIGHTIO_MAX_PICKLE_STACK") in limits._maybe_set(os.environ)
    assert limits.current() == Limits(pickle_stack=7)
    monkeypatch.delenv("WEIGHTIO_MAX_PICKLE_STACK")
    assert limits.current() is limits.DEFAULTS
    assert limits.from_environment({"WEIGHTIO_MAX_TENSORS": "3"}) == Limits(tensors=3)  # any mapping, read whole


def test_a_call_beats_a_block_which_beats_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors({"a": f32_entry(0), "b": f32_entry(4)}, bytes(8)))
    monkeypatch.setenv("WEIGHTIO_MAX_TENSORS", "1")
    with pytest.raises(CorruptFileError, match=r"tensor count 2 exceeds the 1 limit \(limits.tensors; raise it with "
                                               r"weightio.limits.using\(tensors=...\), or WEIGHTIO_MAX_TENSORS"):
        wio.open(path)
    chosen = Limits(tensors=2)
    with limits.using(chosen) as active:
        assert active is chosen and limits.current() is chosen  # no copy of a limits without changes
    with limits.using(tensors=2) as active:
        assert active.tensors == 2 and limits.current() is active
        wio.open(path).close()
        with pytest.raises(CorruptFileError, match="tensor count 2 exceeds the 1 limit"):
            wio.open(path, limits=Limits(tensors=1))
        assert sorted(wio.load(path, limits=Limits(tensors=2))) == ["a", "b"]
    assert limits.current().tensors == 1  # the block ended: the environment again


def test_limits_that_are_not_a_limits_object_are_refused_by_name(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors({"a": f32_entry(0)}, bytes(4)))
    message = r"limits must be a weightio.Limits \(Limits\(tensors=...\)\), got dict"
    with pytest.raises(UsageError, match=message):
        wio.open(path, limits={"tensors": 1})
    with pytest.raises(UsageError, match=message), limits.using({"tensors": 1}):
        pass


def test_a_block_applies_to_its_own_thread_only():
    seen = {}
    with limits.using(header_bytes=123):
        worker = threading.Thread(target=lambda: seen.setdefault("other", limits.current().header_bytes))
        worker.start()
        worker.join()
        seen["here"] = limits.current().header_bytes
    assert seen == {"here": 123, "other": limits.DEFAULTS.header_bytes}
    assert limits.current() == limits.DEFAULTS


def test_readers_keep_the_limits_they_were_opened_with(tmp_path):
    path = tmp_path / "d.npz"
    path.write_bytes(zip_of([("w.npy", npy_of(np.arange(1000.0)))], zipfile.ZIP_DEFLATED))
    with limits.using(inflated_bytes=1000):
        ckpt = wio.open(path)
    with ckpt, pytest.raises(CorruptFileError, match=r"tensor 'w': the deflated member inflates to 8128 exceeds "
                                                     r"the 1000-byte limit \(limits.inflated_bytes"):
        ckpt["w"].numpy()
    assert wio.load(path)["w"].tolist() == list(np.arange(1000.0))  # without the limit


# ----------------------------------------------------------------------------- every reader honours them


def _st(names: list[str]) -> tuple[bytes, int]:
    data = safetensors({n: f32_entry(4 * k) for k, n in enumerate(names)}, bytes(4 * len(names)))
    return data, struct.unpack_from("<Q", data)[0]  # the header length N, as the reference limits it


def _npz(names: list[str]) -> tuple[bytes, int]:
    return zip_of([(n + ".npy", npy_of(np.zeros(1, np.float32))) for n in names]), 0


def _gguf(names: list[str]) -> tuple[bytes, int]:
    infos = [ginfo(n, (4,), 0, 32 * k) for k, n in enumerate(names)]
    kvs = [gkv("general.name", U8, b"\x01")]
    return gguf(kvs, infos, bytes(32 * len(names))), 24 + sum(map(len, kvs + infos))


def _gguf_keys(names: list[str]) -> tuple[bytes, int]:
    kvs = [gkv(n, U8, b"\x01") for n in names]
    return gguf(kvs), 24 + sum(map(len, kvs))


def _ggml(names: list[str]) -> tuple[bytes, int]:
    head = ggml_head(hparams=(3, 4, 1, 1, 1, 1, 0)) + b"".join(ggml_token(t) for t in (b"a", b"bc", b"def"))
    return ggml_file(head, [(ggml_tensor(n.encode(), (4,)), bytes(16)) for n in names]), len(head)


NAMES = ["w", "bias", "embed"]
TENSOR_FILES = {"safetensors": _st, "npz": _npz, "gguf": _gguf, "ggml": _ggml}
HEADER_FILES = {"safetensors": _st, "gguf": _gguf, "gguf keys": _gguf_keys, "ggml": _ggml}
NAME_FILES = {"safetensors": _st, "npz": _npz, "gguf": _gguf, "gguf keys": _gguf_keys, "ggml": _ggml}


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fmt", HEADER_FILES)
def test_header_bytes_bounds_every_reader(tmp_path, fmt):
    data, header = HEADER_FILES[fmt](NAMES)
    path = _write(tmp_path, data)
    wio.open(path, limits=Limits(header_bytes=header)).close()
    with pytest.raises(CorruptFileError) as info:
        wio.open(path, limits=Limits(header_bytes=header - 1))
    assert f"exceeds the {header - 1}-byte limit (limits.header_bytes; raise it with " in str(info.value)
    assert "limits.using(header_bytes=...), or WEIGHTIO_MAX_HEADER_BYTES if the file is trusted)" in str(info.value)


@pytest.mark.parametrize("archive", [False, True])
def test_npy_headers_have_their_own_limit_capped_by_header_bytes(tmp_path, archive):
    arr = np.arange(3.0)
    hlen = struct.unpack_from("<H", npy_of(arr), 8)[0]  # numpy pads the header to 118 bytes
    data = zip_of([("a.npy", npy_of(arr))]) if archive else npy_of(arr)
    path = tmp_path / ("a.npz" if archive else "a.npy")
    path.write_bytes(data)
    assert wio.load(path, limits=Limits(npy_header_bytes=hlen))["a"].tolist() == [0, 1, 2]
    with pytest.raises(CorruptFileError, match=f".npy header length {hlen} exceeds the {hlen - 1}-byte limit "
                                               r"\(limits.npy_header_bytes"):
        wio.open(path, limits=Limits(npy_header_bytes=hlen - 1))
    with pytest.raises(CorruptFileError, match=f"exceeds the {hlen - 1}-byte limit \\(limits.header_bytes"):
        wio.open(path, limits=Limits(header_bytes=hlen - 1))


def test_a_larger_npy_header_limit_reads_larger_headers(tmp_path):
    header = npy_dict("<f4", shape=(2,)).rstrip("\n") + " " * 20_000 + "\n"
    path = _write(tmp_path, npy(header, bytes(8), version=(2, 0)))
    with pytest.raises(CorruptFileError, match="exceeds the 10000-byte limit"):
        wio.open(path)
    assert list(wio.load(path, limits=Limits(npy_header_bytes=30_000)).values())[0].tolist() == [0, 0]


@pytest.mark.parametrize("fmt", TENSOR_FILES)
def test_tensor_count_bounds_every_reader(tmp_path, fmt):
    path = _write(tmp_path, TENSOR_FILES[fmt](NAMES)[0])
    with wio.open(path, limits=Limits(tensors=3)) as ckpt:
        assert sorted(ckpt) == sorted(NAMES)
    with pytest.raises(CorruptFileError, match=r" 3 exceeds the 2 limit \(limits.tensors; raise it with "):
        wio.open(path, limits=Limits(tensors=2))


@pytest.mark.parametrize("fmt", NAME_FILES)
def test_name_length_bounds_every_reader(tmp_path, fmt):
    long = "layer." + "é" * 47  # 100 bytes of UTF-8, 53 characters
    path = _write(tmp_path, NAME_FILES[fmt](["w", long])[0])
    with wio.open(path, limits=Limits(name_bytes=100)) as ckpt:
        assert long in ckpt or long in ckpt.metadata
    with pytest.raises(CorruptFileError, match=r": 100 exceeds the 99-byte limit \(limits.name_bytes"):
        wio.open(path, limits=Limits(name_bytes=99))


def test_gguf_array_depth(tmp_path):
    nested = struct.pack("<IQ", ARRAY, 1) * 3 + struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    path = _write(tmp_path, gguf([gkv("n", ARRAY, nested)]))
    with wio.open(path, limits=Limits(array_depth=4)) as ckpt:
        assert ckpt.metadata["n"].tolist() == [[[[7]]]]
    with pytest.raises(CorruptFileError, match=r"metadata 'n' nests arrays more than 3 deep \(limits.array_depth\)"):
        wio.open(path, limits=Limits(array_depth=3))


def test_inflated_bytes_is_checked_before_inflating(tmp_path):
    stored_and_deflated = zip_of([("s.npy", npy_of(np.zeros(4096)))]), zip_of(
        [("d.npy", npy_of(np.zeros(4096)))], zipfile.ZIP_DEFLATED)
    for data in stored_and_deflated:
        path = tmp_path / "x.npz"
        path.write_bytes(data)
        with wio.open(path, limits=Limits(inflated_bytes=1000)) as ckpt:
            (name,) = ckpt
            assert ckpt[name].shape == (4096,)  # listing never inflates
            if name == "s":  # stored members are mapped, not inflated: the limit does not apply
                assert not ckpt[name].numpy().any()
                continue
            with traced() as peak, pytest.raises(CorruptFileError, match="tensor 'd': the deflated member inflates "
                                                                         "to 32896 exceeds"):
                ckpt[name].numpy()
            assert peak() < 64 << 10


# ----------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("command", [["inspect", "{path}"], ["show", "{path}", "weight"], ["scan", "{path}"],
                                     ["diff", "{path}", "{path}"], ["convert", "{path}", "{out}"]])
def test_every_command_that_opens_files_takes_max_header_bytes(tmp_path, command):
    path = tmp_path / "m.safetensors"
    path.write_bytes((FIXTURES / "numpy.safetensors").read_bytes())
    args = [a.format(path=path, out=tmp_path / "o.safetensors") for a in command]
    result = CliRunner().invoke(main, [*args, "--max-header-bytes", "100"])
    if command[0] == "scan":  # scan reports what it cannot read instead of failing on it
        assert result.exit_code == 1 and "exceeds the 100-byte limit" in result.output
    else:
        assert result.exit_code == 1, result.output
        assert f"weightio: error: {path}: header length 128 exceeds the 100-byte limit" in result.output
    assert CliRunner().invoke(main, [*args, "--max-header-bytes", "1KB"]).exit_code == 0
    assert limits.current() == limits.DEFAULTS  # the option lasts as long as the command
    assert not (tmp_path / "o.safetensors").exists() or command[0] == "convert"


def test_max_header_bytes_must_be_a_size():
    result = CliRunner().invoke(main, ["inspect", str(FIXTURES / "numpy.safetensors"), "--max-header-bytes", "lots"])
    assert result.exit_code == 2
    assert "Invalid value for '--max-header-bytes': 'lots' is not a whole number" in result.output


def test_the_environment_reaches_the_cli(monkeypatch):
    monkeypatch.setenv("WEIGHTIO_MAX_TENSORS", "1")
    result = CliRunner().invoke(main, ["inspect", str(FIXTURES / "numpy.safetensors")])
    assert result.exit_code == 1 and "tensor count 2 exceeds the 1 limit" in result.output


# ----------------------------------------------------------------------------- memory while opening


def _peak_while_opening(path: Path) -> tuple[int, BaseException | None]:
    """Peak Python-heap bytes (numpy included) while opening `path`; the error, if any."""
    error = None
    with traced() as peak:
        try:
            open_file(path).close()
        except WeightioError as e:
            error = e
        return peak(), error


def _tar_member_claiming(size: int) -> bytes:
    """The legacy tar checkpoint with its first member's size field (octal, checksummed) forged."""
    data = bytearray((FIXTURES / "pytorch" / "legacy_tar.pt").read_bytes())
    data[124:136] = b"%011o\0" % size
    data[148:156] = b" " * 8  # the checksum counts its own field as spaces
    data[148:156] = b"%06o\0 " % sum(data[:512])
    return bytes(data)


# Files that claim counts far beyond their bytes: each is refused (or read) with no allocation
# sized by the claim. (format, builder)
CLAIMS = [
    ("safetensors", lambda: safetensors({"a": {"dtype": "F64", "shape": [2**40], "data_offsets": [0, 2**43]}})),
    ("npy", lambda: npy(npy_dict("<f8", shape=(10**12,)), bytes(8))),
    ("npz", lambda: patch_central(zip_of([("w.npy", npy_of(np.zeros(2)))], zipfile.ZIP_DEFLATED), 0, "usize",
                                  2**32 - 2)),
    ("npz", lambda: zip_member_raw(b"w.npy", deflated_zeros(1 << 20), method=8, crc=0, size=2**31)),
    ("gguf", lambda: gguf(n_tensors=2**40, n_kv=2**40)),
    ("gguf", lambda: gguf([gkv("a", ARRAY, struct.pack("<IQ", U32, 2**62))])),
    ("gguf", lambda: gguf(infos=[ginfo("t", (2**31, 2**20))], data=bytes(32))),
    ("ggml", lambda: ggml_head(b"fmgg", 1, (2**31, 1, 1, 1, 1, 1, 0))),
    ("pytorch zip", lambda: torch_zip(state_dict({"w": tensor(pid("FloatStorage", "0", 10**12), 0, (10**12,),
                                                              (1,))}), {"0": f32(1.0)})),
    ("pytorch legacy", lambda: legacy_file(state_dict({"w": tensor(legacy_pid("FloatStorage", "0", 1), 0, (1,),
                                                                   (1,))}), ["0"], [(2**60, f32(1.0))])),
    ("pytorch tar", lambda: _tar_member_claiming(0o77777777777)),  # 8 GiB, the largest 11 octal digits hold
    ("pickle", lambda: P2 + b"\x8e" + struct.pack("<Q", 2**40) + STOP),
    ("pickle", lambda: P2 + b"r\xff\xff\xff\x7f" + STOP),
]


@pytest.mark.parametrize("build", [c[1] for c in CLAIMS], ids=[f"{c[0]}-{i}" for i, c in enumerate(CLAIMS)])
def test_counts_claimed_never_size_an_allocation(tmp_path, build):
    path = _write(tmp_path, build())
    with bounded(seconds=10, extra_mib=256):
        peak, error = _peak_while_opening(path)
    assert isinstance(error, CorruptFileError), error
    assert peak < 1 * MiB, peak


def _safetensors_header(n: int) -> bytes:
    return safetensors({f"model.layers.{i}.weight": f32_entry(4 * i) for i in range(n)}, bytes(4 * n))


def _gguf_header(n: int) -> bytes:
    tokens = struct.pack("<IQ", 8, n) + b"".join(struct.pack("<Q", 6) + f"t{i:05d}".encode() for i in range(n))
    kvs = [gkv(f"key.{i}", U32, struct.pack("<I", i)) for i in range(n)] + [gkv("tokens", ARRAY, tokens)]
    return gguf(kvs, [ginfo(f"blk.{i}.w", (8,), 0, 32 * i) for i in range(n)], bytes(32 * n))


def _ggml_header(n: int) -> bytes:
    head = ggml_head(hparams=(n, 4, 1, 1, 1, 1, 0)) + b"".join(ggml_token(f"tok{i}".encode()) for i in range(n))
    return ggml_file(head, [(ggml_tensor(f"t{i}".encode(), (4,)), bytes(16)) for i in range(n // 10)])


def _npz_header(n: int) -> bytes:
    return zip_of([(f"a{i}.npy", npy_of(np.zeros(1, np.float32))) for i in range(n)])


def _pytorch_header(n: int) -> bytes:
    entries = {f"layer.{i}.weight": tensor(pid("FloatStorage", str(i), 1), 0, (1,), (1,)) for i in range(n)}
    return torch_zip(state_dict(entries), {str(i): f32(1.0) for i in range(n)})


def _legacy_header(n: int) -> bytes:
    entries = {f"l.{i}": tensor(legacy_pid("FloatStorage", str(i), 1), 0, (1,), (1,)) for i in range(n)}
    return legacy_file(state_dict(entries), [str(i) for i in range(n)], [(1, f32(1.0))] * n)


def _gguf_arrays(version: int, inner: Callable[[str], bytes], depth: int = 1) -> Callable[[int], bytes]:
    """A GGUF file (`version` 1 or 3) of n keys, each an array of arrays (`depth` levels of 4 below the
    outer one) of the `inner` array, whose counts and lengths are u32 in v1 and u64 after."""
    width = "I" if version == 1 else "Q"

    def build(n: int) -> bytes:  # about 8n items per key, whatever the depth: files of about 0.5-3 MB
        body = inner(width)
        for _ in range(depth - 1):
            body = struct.pack(f"<I{width}", ARRAY, 4) + body * 4
        count = max(1, 8 * n // 4 ** (depth - 1))
        value = struct.pack(f"<I{width}", ARRAY, count) + body * count
        kvs = [gstr(f"k{i}", width=width) + struct.pack("<I", ARRAY) + value for i in range(4)]
        return b"GGUF" + struct.pack(f"<I{width}{width}", version, 0, len(kvs)) + b"".join(kvs)

    return build


def _u8s(count: int) -> Callable[[str], bytes]:
    return lambda width: struct.pack(f"<I{width}", U8, count) + bytes(count)


def _strings(count: int, text: bytes = b"") -> Callable[[str], bytes]:
    return lambda width: struct.pack(f"<I{width}", STRING, count) + gstr(text, width=width) * count


# Files that are nearly all GGUF metadata arrays of small arrays: what once cost 36 bytes of heap per
# byte (an object per nested array, built at open). (name, builder)
NESTED = [(f"v{v} {name}", _gguf_arrays(v, inner, depth)) for v in (1, 3) for name, inner, depth in [
    ("arrays of 0 u8", _u8s(0), 1), ("arrays of 1 u8", _u8s(1), 1), ("arrays of 0 strings", _strings(0), 1),
    ("arrays of 1 empty string", _strings(1), 1), ("arrays of 3 one-byte strings", _strings(3, b"x"), 1),
    ("arrays of arrays 7 deep (the depth limit)", _u8s(0), 7), ("arrays of 16 u8", _u8s(16), 1)]]


@pytest.mark.parametrize("build", [_safetensors_header, _gguf_header, _ggml_header, _npz_header, _pytorch_header,
                                   _legacy_header] + [b for _, b in NESTED],
                         ids=["safetensors", "gguf", "ggml", "npz", "pytorch", "legacy"] + [n for n, _ in NESTED])
def test_memory_while_opening_is_a_small_multiple_of_the_header(tmp_path, build):
    """Opening costs at most 16 bytes of Python heap per byte of header present (every byte of the
    file counts as header here, data included: the files are nearly all header)."""
    path = _write(tmp_path, build(3000))
    peak, error = _peak_while_opening(path)
    assert error is None
    assert peak < 16 * path.stat().st_size + MiB, (peak, path.stat().st_size)


def test_200_000_zero_size_tensors_open_in_bounded_time_and_memory(tmp_path):
    """The reference reader accepts them (security-anchors 4.2); so does weightio, under the tensor cap."""
    entry = '{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    path = _write(tmp_path, safetensors("{" + ",".join(f'"t{i}":{entry}' for i in range(200_000)) + "}"))
    assert path.stat().st_size > 10_000_000
    with bounded(seconds=30, extra_mib=512), wio.open(path) as ckpt:  # (memory per header byte: see above)
        assert len(ckpt) == 200_000 and ckpt["t199999"].numpy().shape == (0,)


# ----------------------------------------------------------------------------- decompression


def test_a_deflate_bomb_inflates_no_further_than_it_declares(tmp_path):
    """64 MiB of zeros deflated (~64 kB) in a member that declares 137 bytes: reading stops at 137."""
    head = npy_of(np.zeros(9, np.uint8))
    stream = deflate_unfinished(head) + deflated_zeros(64 << 20)
    path = tmp_path / "bomb.npz"
    path.write_bytes(zip_member_raw(b"w.npy", stream, method=8, crc=0, size=len(head)))
    with wio.open(path) as ckpt, traced() as peak:
        with pytest.raises(CorruptFileError, match="member 'w.npy' inflates to more than the 137 bytes declared"):
            ckpt["w"].numpy()
        assert peak() < 4 * MiB


@pytest.mark.parametrize("values", ["zeros", "ramp"])
def test_an_honest_bomb_inflates_to_exactly_its_declared_size(tmp_path, values):
    """A 32 MiB member from < 1 MiB: allowed by default (it says what it is), refused under a limit."""
    arr = np.zeros(32 << 20, np.uint8) if values == "zeros" else (np.arange(32 << 20) // 4096).astype(np.uint8)
    path = tmp_path / "honest.npz"
    path.write_bytes(zip_of([("z.npy", npy_of(arr))], zipfile.ZIP_DEFLATED))
    assert path.stat().st_size < MiB
    with bounded(seconds=30, extra_mib=256), wio.open(path) as ckpt:
        with traced() as peak:
            out = ckpt["z"].numpy()
            assert peak() < (32 << 20) + 4 * MiB  # the declared size, plus a few 1 MiB chunks
        assert np.array_equal(out, arr)
    with pytest.raises(CorruptFileError, match="exceeds the 16777216-byte limit"):
        wio.load(path, limits=Limits(inflated_bytes=16 << 20))


def test_torch_deflated_records_inflate_no_further_than_they_declare(tmp_path):
    data = torch_zip(state_dict({"w": tensor(pid("FloatStorage", "0", 2), 0, (2,), (1,))}), {"0": f32(1, 2) + bytes(
        8 << 20)}, compress={"data/0"})
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as z:
        index = [i.filename for i in z.infolist()].index("archive/data/0")
    path = _write(tmp_path, patch_central(data, index, "usize", 8))
    with bounded(seconds=10, extra_mib=256), wio.open(path) as ckpt, traced() as peak:
        with pytest.raises(CorruptFileError, match="'archive/data/0' inflates to more than the 8 bytes declared"):
            ckpt["w"].numpy()
        assert peak() < 4 * MiB


# ----------------------------------------------------------------------------- PyTorch


def _two_tensor_checkpoint() -> bytes:
    w = tensor(pid("FloatStorage", "0", 2), 0, (2,), (1,))
    return torch_zip(state_dict({"a": w, "b": w}), {"0": f32(1, 2)})


def _nested_checkpoint(depth: int) -> bytes:
    """A tensor `depth` OrderedDicts deep (flattened to 'a.a.….a')."""
    inner = tensor(pid("FloatStorage", "0", 1), 0, (1,), (1,))
    for _ in range(depth):
        inner = call("collections", "OrderedDict") + MARK + s("a") + inner + SETITEMS
    return torch_zip(P2 + inner + STOP, {"0": f32(1)})


@pytest.mark.parametrize("limit,build,field", [
    (Limits(tensors=1), _two_tensor_checkpoint, "tensors"),
    (Limits(header_bytes=100), _two_tensor_checkpoint, "header_bytes"),
    (Limits(name_bytes=10), lambda: torch_zip(
        state_dict({"x" * 11: tensor(pid("FloatStorage", "0", 1), 0, (1,), (1,))}), {"0": f32(1)}), "name_bytes"),
    (Limits(nesting_depth=5), lambda: torch_zip(P2 + MARK * 10 + TUPLE * 10 + STOP, {}), "nesting_depth"),
    (Limits(nesting_depth=5), lambda: _nested_checkpoint(10), "nesting_depth"),
    (Limits(pickle_opcodes=1000), lambda: torch_zip(P2 + b"N0" * 2000 + b"N" + STOP, {}), "pickle_opcodes"),
    (Limits(pickle_stack=100), lambda: torch_zip(P2 + b"]" + MARK + b"N" * 200 + b"e" + STOP, {}), "pickle_stack"),
], ids=["tensors", "header_bytes", "name_bytes", "marks", "nested dicts", "pickle_opcodes", "pickle_stack"])
def test_the_pytorch_reader_honours_the_limits(tmp_path, limit, build, field):
    path = _write(tmp_path, build())
    wio.open(path).close()  # a valid file under the defaults
    with pytest.raises(CorruptFileError, match=f"limits.{field}"):
        wio.open(path, limits=limit)
