"""A whole load's fresh destination pages made by the kernel already holding the file's bytes, never
zeroed (weightio/_copies.h: userfaultfd's UFFDIO_COPY, through `weightio._speedups.read_pieces`'
`copies`)."""

from __future__ import annotations

import mmap
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import weightio as wio
from weightio._native import speedups
from weightio.devices import filling

MIB = 1 << 20


@pytest.fixture
def read_pieces():
    if filling._READ_PIECES is None:
        pytest.skip("weightio's C module is not built")
    if not speedups.kernel_copies():
        pytest.skip("the kernel makes no such copies here (no userfaultfd, or refused)")
    return filling._READ_PIECES


@pytest.fixture
def data(tmp_path):
    """A 3 MiB file of random bytes: (path, its bytes)."""
    path = tmp_path / "data.bin"
    data = np.random.default_rng(7).integers(0, 256, 3 * MIB, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return path, data


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _fresh(nbytes: int) -> np.ndarray:
    """Fresh anonymous memory (its own mapping, unmapped once the array goes): no page of it there yet."""
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


def _rss_file() -> int:
    """The process's resident pages of mapped files, in kB (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_fresh_pages_are_the_kernels_copies_of_the_files_bytes(data, read_pieces):
    path, expected = data
    counts = []
    with open(path, "rb") as f:
        for copies in (True, False):
            dst, c = _fresh(4 * MIB), _fresh(MIB)  # (c: whole pages only)
            a, b = dst[100:100 + MIB], dst[2 * MIB + 7:4 * MIB - 9]  # (partial pages at both ends)
            before, mapped = _faults(), _rss_file()
            assert read_pieces(f.fileno(), [(a, 5), (b, 1000), (c, 2 * MIB)], None, 1, copies) == (3, -1)
            counts.append(_faults() - before)
            assert _rss_file() - mapped < 1024  # (kB: no mapping of the file's 3 MiB left behind)
            assert bytes(a) == expected[5:5 + MIB].tobytes()
            assert bytes(b) == expected[1000:1000 + b.nbytes].tobytes()
            assert bytes(c) == expected[2 * MIB:].tobytes()
            assert not dst[:100].any() and not dst[100 + MIB:2 * MIB + 7].any() and not dst[-9:].any()
    # 1,022 whole pages: each faulted in (populated) before its read, unless the kernel made it;
    # with the copies, the file's pages are mapped for them (a fault each at most where the
    # kernel cannot map them in one call)
    assert counts[0] < 200 and counts[1] > 1000, counts


def test_pages_already_there_are_read_as_before(data, read_pieces):
    path, expected = data
    dst = _fresh(2 * MIB)
    with open(path, "rb") as f:
        dst[MIB + 3 * 4096] = 1  # one page in the middle there already
        dst[:4096] = 2  # and the first: nothing is copied, all read
        assert read_pieces(f.fileno(), [(dst, 0)], None, 1, True) == (1, -1)
        assert bytes(dst) == expected[:2 * MIB].tobytes()
        dst[:] = 3  # every page there
        assert read_pieces(f.fileno(), [(dst[1:], 1)], None, 1, True) == (1, -1)
        assert bytes(dst[1:]) == expected[1:2 * MIB].tobytes() and dst[0] == 3
    # pages found there first (mincore): the file's stretch is not mapped for a copy that would stop at
    # once (mapping it faulted its pages in: 48 faults for 3 MiB cached in pages of 4 KiB, as 4 KiB
    # writes leave them)
    small = path.with_name("small-writes.bin")
    with open(small, "wb") as out:
        for at in range(0, expected.nbytes, 4096):
            out.write(expected[at:at + 4096].tobytes())
    with open(small, "rb") as f:
        there = _fresh(3 * MIB)
        there[:] = 4
        before = _faults()
        assert read_pieces(f.fileno(), [(there, 0)], None, 1, True) == (1, -1)
        assert _faults() - before < 16
        assert bytes(there) == expected.tobytes()
        # the missing pages before the first one there are copied, the rest read
        part = _fresh(3 * MIB)
        part[2 * MIB:] = 5
        before = _faults()
        assert read_pieces(f.fileno(), [(part, 0)], None, 1, True) == (1, -1)
        assert _faults() - before < 128  # (read, the 512 missing pages would each be faulted in)
        assert bytes(part) == expected.tobytes()


def test_a_destination_the_kernel_cannot_copy_into_is_read(data, read_pieces, tmp_path):
    path, expected = data
    out = tmp_path / "out.bin"
    out.write_bytes(bytes(MIB))
    with open(out, "r+b") as g:
        dst = np.frombuffer(mmap.mmap(g.fileno(), 0), np.uint8)  # a file's shared mapping: not anonymous memory
    with open(path, "rb") as f:
        assert read_pieces(f.fileno(), [(dst, 4096)], None, 1, True) == (1, -1)
    assert bytes(dst) == expected[4096:4096 + MIB].tobytes()
    assert out.read_bytes() == expected[4096:4096 + MIB].tobytes()


@pytest.mark.parametrize("size", [3 * MIB // 2, 3 * MIB // 2 + 100], ids=["at-a-page", "inside-a-page"])
def test_a_file_cut_short_says_where_it_ended_and_raises_no_signal(data, read_pieces, size):
    # In a child: were the kernel's read of the file's stretch a fault of this process's, SIGBUS would kill it.
    # Cut inside a page, the mapping reads that page as zeros past the end: the copy must not count them.
    path, _ = data
    script = textwrap.dedent(f"""
        import mmap, os, numpy as np
        from weightio.devices import filling
        with open({str(path)!r}, "r+b") as f:
            os.truncate(f.fileno(), {size})
            region = mmap.mmap(-1, {2 * MIB})
            dst = np.frombuffer(region, np.uint8)
            print(filling._READ_PIECES(f.fileno(), [(dst[:4096], 0), (dst[4096:], 4096)], None, 1, True))
            whole = np.frombuffer(mmap.mmap(-1, {2 * MIB}), np.uint8)  # (fresh: no page there yet)
            print(filling._READ_PIECES(f.fileno(), [(whole, 0)], None, 1, True))
            kept = open({str(path)!r}, "rb").read()
            print(bytes(dst[:{size}]) == kept == bytes(whole[:{size}]),
                  not dst[{size}:].any(), not whole[{size}:].any())
            del dst, whole
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    # piece 1 got the bytes up to the file's new end (and a single piece from 0 all of them), nothing past it
    assert done.stdout == f"(1, {size - 4096})\n(0, {size})\nTrue True True\n"


def test_the_stop_byte_and_the_arguments_checks_hold_with_copies(data, read_pieces):
    path, expected = data
    with open(path, "rb") as f:
        dst = _fresh(MIB)
        assert read_pieces(f.fileno(), [(dst, 0)], bytearray(b"\x01"), 1, True) == (0, -1)
        assert not dst.any()
        with pytest.raises(ValueError, match="^read_pieces: copies are made by one thread$"):
            read_pieces(f.fileno(), [(dst, 0)], None, 2, True)
        with pytest.raises(TypeError, match=r"^read_pieces\(fd, pieces, halt, threads=1, copies=False\)"):
            read_pieces(f.fileno(), [(dst, 0)], None, 1, True, 0)
        # shared among threads without copies, as before
        halves = [(dst[:MIB // 2], 0), (dst[MIB // 2:], MIB // 2)]
        assert read_pieces(f.fileno(), halves, None, 2, False) == (2, -1)
        assert bytes(dst) == expected[:MIB].tobytes()


@pytest.mark.parametrize("copies", [True, False])
def test_a_whole_loads_fresh_destinations_are_copied_by_the_kernel(tmp_path, monkeypatch, read_pieces, copies):
    monkeypatch.setattr(filling, "_COPIES", copies)
    arrays = {"big": np.random.default_rng(1).standard_normal((512, 1000)).astype(np.float32),  # 2 MB
              "small": np.arange(1000, dtype=np.int16)}
    path = tmp_path / "m.npz"
    np.savez(path, **arrays)
    with wio.open(path) as ckpt:
        views = {k: ckpt[k].numpy() for k in arrays}
        out = {k: _fresh(a.nbytes).view(a.dtype).reshape(a.shape) for k, a in arrays.items()}
        big = out["big"].reshape(-1).view(np.uint8)
        before = _faults()
        filling.fill([(out[k].reshape(-1).view(np.uint8), views[k]) for k in arrays])
        faults = _faults() - before
        del views
    for k, a in arrays.items():
        assert out[k].tobytes() == a.tobytes()
    pages = big.nbytes // 4096  # 488: with the kernel's copies, none faulted in
    assert (faults < pages // 4) if copies else (faults >= pages - 2), (faults, pages)


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"), reason="needs root, to drop it")
def test_the_kernels_copies_need_no_privilege(read_pieces):
    # UFFD_USER_MODE_ONLY: allowed to any user where vm.unprivileged_userfaultfd is 0 (the default)
    script = ("import os; from weightio._native import speedups; os.setgid(65534); os.setuid(65534); "
              "print(speedups.kernel_copies())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "True\n", "")
