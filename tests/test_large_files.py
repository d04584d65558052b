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


def _huge() -> int:
    """At least 4x this machine's memory (and 64 GiB), in whole GiB."""
    return max(4 * _meminfo("MemTotal") // GiB + 1, 64) * GiB


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
        text = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % n
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


def _assert_small_footprint(out: dict, total: int) -> None:
    """Opened, listed and read with tens of MB: nothing sized by the file was committed or paged in."""
    assert out["rss1"] - out["rss0"] < 32 * MiB, out
    assert out["committed1"] - out["committed0"] < 16 * MiB, out  # this process's own commitment
    assert out["committed_as1"] - out["committed_as0"] < total // 4, out  # system-wide: others run too


@pytest.fixture
def scratch(tmp_path):
    """A directory whose (huge, sparse) files are removed after the test, not left to pytest's rotation."""
    yield tmp_path
    for p in sorted(tmp_path.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()


@pytest.mark.parametrize("make,suffix,name", [
    (safetensors_file, "safetensors", "far"), (gguf_file, "gguf", "far"), (npy_file, "npy", None)])
def test_a_file_several_times_larger_than_memory_opens_lists_and_reads_its_far_end(scratch, make, suffix, name):
    total = _huge()
    path = scratch / f"huge.{suffix}"
    make(path, total)
    out = _run(path)
    assert len(out["names"]) == 1 and (name is None or out["names"] == [name])
    assert out["sizes"][0] > total - 4096
    assert out["far"] == [MARK.decode()]  # the last bytes of the file, as written
    _assert_small_footprint(out, total)


def test_opening_commits_no_memory_for_the_mapping(scratch):
    """A file the kernel could map copy-on-write (a quarter of memory) shows the commitment itself:
    a private writable mapping would be charged its whole size; the read-only one is charged nothing."""
    total = _meminfo("MemTotal") // 4 // GiB * GiB + GiB
    path = scratch / "quarter.safetensors"
    safetensors_file(path, total)
    out = _run(path)
    assert out["far"] == [MARK.decode()]
    assert out["committed1"] - out["committed0"] < 16 * MiB, out  # not `total`
    assert out["rss1"] - out["rss0"] < 32 * MiB, out


def test_a_sharded_model_many_times_larger_than_memory_opens_as_a_directory(scratch):
    shards, each = 8, max(2 * _meminfo("MemTotal") // GiB + 1, 32) * GiB  # 16x memory in all
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        safetensors_file(scratch / file, each, name=f"model.layers.{i}.weight")
        weight_map[f"model.layers.{i}.weight"] = file
    index = {"metadata": {"total_size": sum(os.stat(scratch / f).st_size for f in weight_map.values())},
             "weight_map": weight_map}
    (scratch / "model.safetensors.index.json").write_text(json.dumps(index))
    out = _run(scratch)
    assert out["names"] == list(weight_map)
    assert out["far"] == [MARK.decode()] * shards
    _assert_small_footprint(out, shards * each)


def test_zero_copy_torch_tensors_commit_only_their_own_window(scratch):
    """A writable (torch) tensor of the far end maps one private window, not the file; a write to it
    stays in it. A writable tensor of the whole file is refused cleanly where the kernel refuses it."""
    pytest.importorskip("torch")
    total = _huge()
    path = scratch / "huge.safetensors"
    safetensors_file(path, total)
    out = _run(path, "--torch")
    _assert_small_footprint(out, total)
    assert out["torch_far"] == bytes(b + 1 for b in MARK).decode("latin-1")  # written in place
    assert out["numpy_far_after"] == MARK.decode()  # the read-only mapping (and the file) did not change
    assert 0 < out["torch_committed"] <= 2 * PRIVATE_WINDOW, out
    with open(path, "rb") as f:
        f.seek(total - len(MARK))
        assert f.read() == MARK
    with open("/proc/sys/vm/overcommit_memory") as f:
        mode = int(f.read())
    if mode == 1:  # "always overcommit": the kernel maps it, and the tensor reads
        assert out["whole"] == "ok: " + MARK.decode()
    else:  # heuristic (0) or strict (2): a writable mapping larger than RAM + swap is refused
        assert out["whole"].startswith("InputError: "), out["whole"]
        assert "copy-on-write for a writable (zero-copy torch) tensor: Cannot allocate memory" in out["whole"]
        assert "read it as numpy (read-only), or in slices" in out["whole"]
