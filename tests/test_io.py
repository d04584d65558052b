"""Mapped inputs and atomic outputs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import weightio as wio
from weightio._io import MappedFile
from weightio._outputs import atomic_write, write_all
from weightio.errors import CorruptFileError, WriteError


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".weightio-tmp"))


def test_atomic_write_publishes_complete_files_with_normal_permissions(tmp_path):
    target = tmp_path / "out.bin"
    with atomic_write(target) as f:
        f.write(b"abc")
        assert not target.exists()  # nothing visible until the end
    assert target.read_bytes() == b"abc"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, exc):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(type(exc)):
        with atomic_write(target, overwrite=True) as f:
            f.write(b"half of the new")
            raise exc
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_os_errors_become_write_errors_with_errno(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(WriteError) as info:
        with atomic_write(target) as f:
            f.write(b"x")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == f"{target}: write failed: No space left on device"
    assert isinstance(info.value, OSError)
    assert not target.exists() and _leftovers(tmp_path) == []


def test_file_size_limit_in_a_real_process_gives_a_clean_error(tmp_path):
    script = textwrap.dedent(f"""
        import resource, sys, numpy as np, weightio as wio
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            wio.save({{"big": np.zeros(1_000_000, np.float32)}}, {str(tmp_path / "big.safetensors")!r})
        except wio.WriteError as e:
            print("WriteError", e.errno)
            sys.exit(0)
        sys.exit(3)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["WriteError", str(errno.EFBIG)]
    assert not (tmp_path / "big.safetensors").exists() and _leftovers(tmp_path) == []


def test_destination_checks(tmp_path):
    with pytest.raises(WriteError, match="is a directory; give a file name"):
        with atomic_write(tmp_path):
            pass
    target = tmp_path / "x"
    target.write_bytes(b"keep")
    with pytest.raises(WriteError, match=r"already exists \(pass overwrite=True to replace it\)"):
        with atomic_write(target):
            pass
    with pytest.raises(WriteError, match=r"cannot create a file in .*missing"):
        with atomic_write(tmp_path / "missing" / "x"):
            pass
    assert target.read_bytes() == b"keep"


def test_a_destination_created_during_the_write_is_not_clobbered(tmp_path):
    target = tmp_path / "x"
    with pytest.raises(WriteError, match="appeared while writing; not replaced"):
        with atomic_write(target) as f:
            f.write(b"ours")
            target.write_bytes(b"theirs")
    assert target.read_bytes() == b"theirs" and _leftovers(tmp_path) == []


def test_write_all_handles_any_dtype_and_short_writes(tmp_path):
    import ml_dtypes

    class Trickle:
        def __init__(self):
            self.data = b""

        def write(self, b):
            self.data += bytes(b[:3])  # a file that accepts 3 bytes at a time
            return min(3, len(b))

    sink = Trickle()
    arr = np.arange(5, dtype=ml_dtypes.bfloat16)
    assert write_all(sink, arr, chunk=4) == 10
    assert sink.data == arr.tobytes()


def test_mapped_file_reads_are_bounds_checked(write):
    f = MappedFile(write("x", b"0123456789"))
    try:
        assert f.read(2, 3, "a field") == b"234"
        with pytest.raises(CorruptFileError, match=r"the footer needs bytes 8..12 but the file has 10"):
            f.read(8, 4, "the footer")
    finally:
        f.close()
    with pytest.raises(wio.WeightioError, match="closed"):
        _ = f.data


def test_read_each_reads_every_span_checked_first_and_fails_cleanly_on_a_shrunk_file(write):
    path = write("x", bytes(range(100)))
    f = MappedFile(path)
    try:
        assert f.read_each([(90, 10), (2, 3), (50, 0)], "the local headers") == [bytes(range(90, 100)), b"\2\3\4", b""]
        with pytest.raises(CorruptFileError, match=r"the local headers needs bytes 95..101 but the file has 100"):
            f.read_each([(0, 4), (95, 6)], "the local headers")
        os.truncate(path, 60)
        with pytest.raises(CorruptFileError, match=r"file shrank while reading the local headers \(now ends at 60\)"):
            f.read_each([(10, 4), (55, 10)], "the local headers")
    finally:
        f.close()
    with pytest.raises(wio.WeightioError, match="closed"):
        f.read_each([(0, 1)], "the local headers")


def test_save_leaves_no_temporary_on_an_unsupported_tensor(tmp_path):
    with pytest.raises(wio.UnsupportedDTypeError):
        wio.save({"a": np.zeros(2), "b": np.array(["s"])}, tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


def _stamp_ways():
    from weightio import _io
    from weightio._native import speedups

    native = getattr(speedups, "file_stamp", None)
    if os.environ.get("WEIGHTIO_REQUIRE_SPEEDUPS") == "1" and sys.platform.startswith("linux"):
        assert native is not None and _io.file_stamp is native  # (CI builds the C module: it must be what runs)
    return [_io._fstat_stamp] + ([native] if native is not None else [])


@pytest.mark.parametrize("modified", [0, 1_700_000_000_123_456_789, -86_400_000_000_001, 8_999_999_999_999_999_999,
                                      9_000_000_000_000_000_000, 13_000_000_000_123_456_789, 2**63 - 1, 2**63 + 5])
def test_file_stamp_is_what_fstat_says(tmp_path, modified):
    # from 9e18 ns (year 2255) on: Python's own arithmetic in C, past what a 64-bit product holds
    from weightio import _io

    path = tmp_path / "x.bin"
    path.write_bytes(b"x" * 1234)
    os.utime(path, ns=(modified, modified))
    fd = os.open(path, os.O_RDONLY)
    try:
        found = os.fstat(fd)
        if found.st_mtime_ns != modified:
            pytest.skip(f"this filesystem keeps no modification time of {modified} ns")
        for way in _stamp_ways():
            assert way(fd) == (found.st_mode, 1234, modified)
        assert _io.file_stamp(fd) == (found.st_mode, 1234, modified)
    finally:
        os.close(fd)


def test_file_stamp_of_a_directory_and_a_closed_descriptor(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        found = os.fstat(fd)
        for way in _stamp_ways():
            assert way(fd) == (found.st_mode, found.st_size, found.st_mtime_ns)
    finally:
        os.close(fd)
    for way in _stamp_ways():
        with pytest.raises(OSError) as caught:
            way(-1)  # no such descriptor: EBADF, as os.fstat raises it
        assert caught.value.errno == errno.EBADF and caught.value.strerror == os.strerror(errno.EBADF)
        with pytest.raises(OverflowError):
            way(2**40)
        with pytest.raises(TypeError):
            way("3")
