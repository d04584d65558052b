"""Models larger than memory (issue 12, class 7): files several times this machine's memory open,
list and read their far end with a resident set and a memory commitment of megabytes.

Files are mapped read-only and shared: such a mapping commits no memory (the kernel's overcommit
accounting charges only private writable mappings), so its size is bounded by the address space,
not by RAM + swap. The files here are sparse (``truncate``): their apparent size is at least 4x
``MemTotal`` and they hold a few kB on disk. Each case runs in a fresh process, which reports its
own numbers:

* ``VmRSS`` from ``/proc/self/status`` before and after;
* the memory it has committed: the sizes of its mappings that the kernel accounts against the
  commit limit (``ac`` in their ``VmFlags`` in ``/proc/self/smaps``: private writable ones), and
  ``Committed_AS`` from ``/proc/meminfo`` (system-wide, so only a loose bound: other processes
  run beside the test).

Where the filesystem cannot hold a sparse file that large (or allocates it), the test skips.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from weightio._io import PRIVATE_WINDOW

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux)")

GiB, MiB = 1 << 30, 1 << 20
MARK = b"weightio-far-end"  # 16 bytes at the very end of every file


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _sparse(path: Path, head: bytes, total: int) -> None:
    """`head`, then a hole, then `MARK` as the last bytes of a `total`-byte file; skip where impossible."""
    try:
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(total)
            f.seek(total - len(MARK))
            f.write(MARK)
    except OSError as e:  # EFBIG, ENOSPC, EINVAL: this filesystem cannot hold it
        path.unlink(missing_ok=True)
        pytest.skip(f"cannot make a sparse file of {total >> 30} GiB here: {e}")
    if os.stat(path).st_blocks * 512 > 64 * MiB:  # not sparse: do not fill the disk
        path.unlink()
        pytest.skip("this filesystem does not keep files sparse")


def safetensors_file(path: Path, total: int, name: str = "far") -> None:
    """One uint8 tensor filling the file: its last bytes are `MARK`."""
    header = b""
    for _ in range(3):  # the header's length depends on the digits of the tensor's size
        n = total - 8 - len(header)
        meta = json.dumps({name: {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
        header = meta + b" " * (-(8 + len(meta)) % 8)
    assert 8 + len(header) + n == total
    _sparse(path, struct.pack("<Q", len(header)) + header, total)


def gguf_file(path: Path, total: int, name: str = "far") -> None:
    """GGUF v3, no metadata, one int8 (ggml type 24) tensor filling the file after 32-byte alignment."""
    def head(n: int) -> bytes:
        return (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name.encode()
                + struct.pack("<IQIQ", 1, n, 24, 0))
    start = len(head(0)) + (-len(head(0)) % 32)
    _sparse(path, head(total - start).ljust(start, b"\0"), total)


def npy_file(path: Path, total: int) -> None:
    """A 1-D uint8 ``.npy`` array filling the file (version 1 header padded to 64 bytes)."""
    def header(n: int) -> bytes:
        text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({n},), }}"
        text += " " * (-(10 + len(text) + 1) % 64) + "\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()
    size = len(header(total))
    assert len(header(total - size)) == size
    _sparse(path, header(total - size), total)


# What the fresh process does: open, list, read the far end of every tensor, report its numbers;
# with --torch also a zero-copy torch tensor of the far end (private copy-on-write: one window),
# written to in place, and the whole first tensor as a torch tensor (writable: needs a private
# mapping of all of it, which the kernel refuses under heuristic overcommit when it is larger than
# RAM + swap).
WORKER = r"""
import json, sys

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

def committed():
    total = size = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            if line.startswith("Size:"):
                size = int(line.split()[1]) * 1024
            elif line.startswith("VmFlags:") and "ac" in line.split()[1:]:
                total += size
    return total

def committed_as():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("Committed_AS:"))

path, use_torch = sys.argv[1], "--torch" in sys.argv
import weightio as wio
from weightio import devices
if use_torch:
    import torch
out = {"rss0": rss(), "committed0": committed(), "committed_as0": committed_as()}
with wio.open(path) as ckpt:
    out["names"] = list(ckpt)
    out["sizes"] = [ckpt[n].nbytes for n in ckpt]
    out["far"] = [bytes(ckpt[n].raw()[-16:]).decode("latin-1") for n in ckpt]
    out.update(rss1=rss(), committed1=committed(), committed_as1=committed_as())
    if use_torch:
        name = out["names"][0]
        before = committed()
        t = devices.place(ckpt[name][-16:], "torch")
        t.add_(1)
        out["torch_far"] = bytes(t.numpy()).decode("latin-1")
        out["numpy_far_after"] = bytes(ckpt[name].raw()[-16:]).decode("latin-1")
        out["torch_committed"] = committed() - before
        del t
        try:
            whole = ckpt[name].to("torch")
            out["whole"] = "ok: " + bytes(whole[-16:].numpy()).decode("latin-1")
        except wio.WeightioError as e:
            out["whole"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _run(path: Path, *flags: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", WORKER, str(path), *flags], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@dataclass(frozen=True)
class Huge:
    """One case of the LARGER_THAN_MEMORY table: `build(directory, total)` writes sparse files of
    `total` bytes in all and returns what to open; `times` is the total as a multiple of MemTotal."""

    name: str
    times: float
    build: Callable[[Path, int], Path]
    names: list[str] | None = None  # the tensor names expected (None: the reader's own)
    torch: bool = False  # also a writable zero-copy torch tensor of the far end, and of the whole tensor


def _single(make: Callable[[Path, int], None], suffix: str) -> Callable[[Path, int], Path]:
    def build(directory: Path, total: int) -> Path:
        make(directory / f"huge.{suffix}", total)
        return directory / f"huge.{suffix}"
    return build


SHARDS = 8


def _sharded(directory: Path, total: int) -> Path:
    """`SHARDS` safetensors shards of one tensor each, and the index naming them: a directory to open."""
    weight_map = {}
    for i in range(SHARDS):
        file = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        safetensors_file(directory / file, total // SHARDS, name=f"model.layers.{i}.weight")
        weight_map[f"model.layers.{i}.weight"] = file
    size = sum(os.stat(directory / f).st_size for f in weight_map.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}))
    return directory


# Issue 12, class 7: files (and a sharded model) larger than memory, each opened, listed and read
# to its far end by a fresh process that commits and pages in megabytes, not the file.
LARGER_THAN_MEMORY = [
    Huge("safetensors: one U8 tensor of 4x memory", 4, _single(safetensors_file, "safetensors"), ["far"]),
    Huge("GGUF: one I8 tensor of 4x memory", 4, _single(gguf_file, "gguf"), ["far"]),
    Huge(".npy: one uint8 array of 4x memory", 4, _single(npy_file, "npy")),
    Huge("sharded safetensors directory: 8 shards + index, 16x memory", 16, _sharded,
         [f"model.layers.{i}.weight" for i in range(SHARDS)]),
    Huge("safetensors of a quarter of memory: a copy-on-write mapping would commit all of it", 0.25,
         _single(safetensors_file, "safetensors"), ["far"]),
    Huge("torch: a zero-copy tensor of the far end of a 4x-memory file, written in place", 4,
         _single(safetensors_file, "safetensors"), ["far"], torch=True),
]


def _total(times: float) -> int:
    """`times` x MemTotal (at least 16 GiB per 1x), rounded up to whole GiB."""
    memory = _meminfo("MemTotal")
    if times < 1:
        return int(memory * times) // GiB * GiB + GiB
    return max(int(times * memory) // GiB + 1, int(times * 16)) * GiB


@pytest.fixture
def scratch(tmp_path):
    """A directory whose (huge, sparse) files are removed after the test, not left to pytest's rotation."""
    yield tmp_path
    for p in sorted(tmp_path.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()


@pytest.mark.parametrize("case", LARGER_THAN_MEMORY, ids=[c.name for c in LARGER_THAN_MEMORY])
def test_larger_than_memory(scratch, case):
    if case.torch:
        pytest.importorskip("torch")
    total = _total(case.times)
    out = _run(case.build(scratch, total), *(["--torch"] if case.torch else []))
    count = SHARDS if case.build is _sharded else 1
    assert out["names"] == case.names if case.names else len(out["names"]) == 1
    assert sum(out["sizes"]) > total - 4096 * count
    assert out["far"] == [MARK.decode()] * count  # the last bytes of every file, as written
    # opened, listed and read with megabytes: nothing sized by the file was committed or paged in
    assert out["rss1"] - out["rss0"] < 32 * MiB, out
    assert out["committed1"] - out["committed0"] < 16 * MiB, out  # this process's own commitment
    if case.times >= 1:  # system-wide, so loose: other processes run beside the test
        assert out["committed_as1"] - out["committed_as0"] < total // 4, out
    if case.torch:
        _check_torch(out, scratch / "huge.safetensors", total)


def _check_torch(out: dict, path: Path, total: int) -> None:
    """A writable (torch) tensor of the far end maps one private window, not the file, and a write
    to it stays there; a writable tensor of the whole file is refused cleanly where the kernel
    refuses such a mapping (heuristic or strict overcommit: larger than RAM + swap)."""
    assert out["torch_far"] == bytes(b + 1 for b in MARK).decode("latin-1")  # written in place
    assert out["numpy_far_after"] == MARK.decode()  # the read-only mapping did not change
    assert 0 < out["torch_committed"] <= 2 * PRIVATE_WINDOW, out
    with open(path, "rb") as f:  # nor the file
        f.seek(total - len(MARK))
        assert f.read() == MARK
    with open("/proc/sys/vm/overcommit_memory") as f:
        mode = int(f.read())
    if mode == 1:  # "always overcommit": the kernel maps it, and the tensor reads
        assert out["whole"] == "ok: " + MARK.decode()
    else:
        assert out["whole"].startswith("InputError: "), out["whole"]
        assert "copy-on-write for a writable (zero-copy torch) tensor: Cannot allocate memory" in out["whole"]
        assert "read it as numpy (read-only), or in slices" in out["whole"]


def test_the_table_has_6_named_cases():
    assert len({c.name for c in LARGER_THAN_MEMORY}) == len(LARGER_THAN_MEMORY) == 6
