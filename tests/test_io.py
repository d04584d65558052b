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

from .conftest import FIXTURES


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


# fstat of a regular file is not interrupted in practice: a preloaded shim makes it so, for one
# descriptor, a given number of times (raising a signal before each where asked). It replaces both
# names a C library may give the call (fstat64: glibc 2.33+ with 64-bit offsets; fstat), taking the
# stat buffer as untyped memory, so it needs no C library's stat headers.
_EINTR_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <unistd.h>
static int armed_fd = -1, left = 0, with_signal = 0, calls = 0;
void shim_arm(int fd, int times, int sig) { armed_fd = fd; left = times; with_signal = sig; calls = 0; }
int shim_calls(void) { return calls; }
static int interrupted(int fd) {
    if (fd != armed_fd)
        return 0;
    calls++;
    if (left <= 0)
        return 0;
    left--;
    if (with_signal)
        kill(getpid(), with_signal);
    errno = EINTR;
    return 1;
}
typedef int (*fstat_fn)(int, void *);
static int call(const char *name, fstat_fn *real, int fd, void *st) {
    if (*real == NULL)
        *real = (fstat_fn)dlsym(RTLD_NEXT, name);
    return *real == NULL ? (errno = ENOSYS, -1) : (*real)(fd, st);
}
int fstat64(int fd, void *st) {
    static fstat_fn real;
    return interrupted(fd) ? -1 : call("fstat64", &real, fd, st);
}
int fstat(int fd, void *st) {
    static fstat_fn real;
    return interrupted(fd) ? -1 : call("fstat", &real, fd, st);
}
"""

_EINTR_SCRIPT = r"""
import ctypes, os, signal, sys
import weightio as wio
from weightio import _io
from weightio._native import speedups
assert speedups is not None
shim, path = ctypes.CDLL(None), sys.argv[1]
fd = os.open(path, os.O_RDONLY)
found = os.fstat(fd)
shim.shim_arm(fd, 0, 0)
speedups.file_stamp(fd)
if shim.shim_calls() != 1:  # (a C library whose fstat goes by another name: __fxstat64, say)
    print("not shimmed")
    sys.exit(0)
shim.shim_arm(fd, 3, 0)
print("stamp", speedups.file_stamp(fd) == (found.st_mode, found.st_size, found.st_mtime_ns), shim.shim_calls())
handled = []
signal.signal(signal.SIGUSR1, lambda *_: handled.append(1))
shim.shim_arm(fd, 2, signal.SIGUSR1)
print("handled", speedups.file_stamp(fd)[1] == found.st_size, shim.shim_calls(), len(handled))
def interrupt(*_):
    raise KeyboardInterrupt("from the handler")
signal.signal(signal.SIGUSR1, interrupt)
shim.shim_arm(fd, 5, signal.SIGUSR1)
try:
    speedups.file_stamp(fd)
except KeyboardInterrupt as e:
    print("raised", e, shim.shim_calls())
ckpt = wio.open(path)
name = sorted(ckpt)[0]
expected = ckpt[name].numpy().copy()
def no_fallback(fd):  # the view's check must be the C one: its Python way would retry through os.fstat
    raise AssertionError("the changed-file check fell back to Python")
_io.file_stamp = no_fallback
mine = [int(n) for n in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{n}") == os.path.realpath(path)]
for n in mine:  # (the checkpoint's own descriptor: the view's changed-file check is its fstat)
    shim.shim_arm(n, 2, 0)
    ckpt[name].numpy()
    if shim.shim_calls():
        break
print("view retried", shim.shim_calls(), bool((ckpt[name].numpy() == expected).all()))
shim.shim_arm(n, 1, signal.SIGUSR1)
try:
    ckpt[name].numpy()
except KeyboardInterrupt as e:
    print("view raised", e, shim.shim_calls())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="an LD_PRELOAD shim of the C library's fstat")
def test_an_interrupted_fstat_is_made_again_unless_a_signal_handler_raises(tmp_path):
    # the C module's fstat calls (file_stamp, and the changed-file check of a view) retry EINTR as
    # os.fstat does, and let a signal handler's exception through
    import shutil

    from weightio._native import speedups

    if speedups is None or shutil.which("cc") is None:
        pytest.skip("needs the C module and a C compiler (for the shim)")
    (tmp_path / "shim.c").write_text(_EINTR_SHIM)
    command = ["cc", "-shared", "-fPIC", "-o", str(tmp_path / "shim.so"), str(tmp_path / "shim.c"), "-ldl"]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"the fstat shim does not build here: {built.stderr[-300:]}")
    env = {**os.environ, "LD_PRELOAD": str(tmp_path / "shim.so")}
    fixture = FIXTURES / "numpy.safetensors"
    ran = subprocess.run([sys.executable, "-c", _EINTR_SCRIPT, str(fixture)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    if ran.stdout == "not shimmed\n":
        pytest.skip("this C library's fstat is not called fstat64 or fstat: the shim cannot interrupt it")
    assert ran.stdout.splitlines() == [
        "stamp True 4",  # three interruptions, then the call (and the test's own fstat is not counted: it ran before)
        "handled True 3 2",  # a handler that returns: the call is made again
        "raised from the handler 1",  # a handler that raises: its exception, no more calls
        "view retried 3 True",
        "view raised from the handler 1",
    ]


def _recording_starts(monkeypatch, calls: list, before=None) -> None:
    """`_outputs._start_writeback` made to append ``(offset, length, its thread's name)`` to `calls`
    (after `before()`, where given) before the real call (its descriptor open meanwhile)."""
    import threading

    from weightio import _outputs

    real = _outputs._start_writeback

    def recorded(fd, offset, length):
        if before is not None:
            before()
        os.fstat(fd)  # (still open)
        calls.append((offset, length, threading.current_thread().name))
        return real(fd, offset, length)

    monkeypatch.setattr(_outputs, "_start_writeback", recorded)
    monkeypatch.setattr(_outputs, "_SYNC_FILE_RANGE", _outputs._sync_file_range() or (lambda *args: 0))


def test_atomic_write_starts_the_disk_writes_as_the_bytes_come(tmp_path, monkeypatch):
    """Every `WRITEBACK_STEP` bytes written, the kernel is asked (on the writeback thread) to start
    writing the stretch written since the last time to the disk: the stretches, one after another,
    end where the file's bytes end at that write."""
    from concurrent.futures import wait

    from weightio import _outputs

    calls: list = []
    _recording_starts(monkeypatch, calls)
    monkeypatch.setattr(_outputs, "WRITEBACK_STEP", 64 << 10)
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, np.uint8)
    with atomic_write(tmp_path / "out.bin") as f:
        for start in range(0, 200 << 10, 40 << 10):  # 40 KiB writes: a step is crossed every second one
            f.write(data[start:start + (40 << 10)].tobytes())
        write_all(f, data[200 << 10:], chunk=300 << 10)  # three large writes, each past a step
        wait([future for future, _ in f._queued])  # (else those not begun when the file closes are dropped)
    k, thread = 1 << 10, "weightio-writeback_0"
    assert calls == [(0, 80 * k, thread), (80 * k, 80 * k, thread), (160 * k, 340 * k, thread),
                     (500 * k, 300 * k, thread), (800 * k, 224 * k, thread)]
    assert (tmp_path / "out.bin").read_bytes() == data.tobytes()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_closing_never_waits_for_a_start_of_its_disk_writes(tmp_path, monkeypatch):
    """Each start runs through a duplicate of the descriptor that it closes itself: closing the file
    drops those queued (closing their duplicates) and leaves the one running to end on its own;
    no descriptor is left open, the bytes are exact."""
    import threading

    from weightio import _outputs

    running, release, calls = threading.Event(), threading.Event(), []

    def first_waits():  # until the file is closed
        if not running.is_set():
            running.set()
            assert release.wait(10)

    _recording_starts(monkeypatch, calls, first_waits)
    monkeypatch.setattr(_outputs, "WRITEBACK_STEP", 4096)
    before = len(os.listdir("/proc/self/fd"))
    with atomic_write(tmp_path / "out.bin") as f:
        for i in range(4):
            f.write(bytes([i]) * 4096)
        assert running.wait(10) and len(f._queued) == 4
        future = f._queued[0][0]
    assert not future.done()  # (closed, committed, the first start still running)
    release.set()
    future.result(timeout=10)
    assert [offset for offset, _, _ in calls] == [0]  # the three queued behind it dropped
    assert len(os.listdir("/proc/self/fd")) == before
    assert (tmp_path / "out.bin").read_bytes() == b"".join(bytes([i]) * 4096 for i in range(4))


def test_without_sync_file_range_outputs_are_written_as_before(tmp_path, monkeypatch):
    from weightio import _outputs

    monkeypatch.setattr(_outputs, "_SYNC_FILE_RANGE", False)  # (macOS, Windows: never found)
    monkeypatch.setattr(_outputs, "WRITEBACK_STEP", 4096)
    with atomic_write(tmp_path / "out.bin") as f:
        f.write(b"x" * 10_000)
        assert f._sent == 0 and f._unsent == 10_000  # (no flush, no tell: nothing to ask)
    assert (tmp_path / "out.bin").read_bytes() == b"x" * 10_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_starting_the_disk_writes_is_a_hint_that_never_raises(tmp_path):
    from weightio._outputs import _start_writeback

    with open(tmp_path / "f", "wb") as f:
        f.truncate(6 << 30)  # sparse
        f.seek((4 << 30) - 4096)
        f.write(b"x" * 10_000)
        f.flush()
        if not _start_writeback(f.fileno(), 0, 4096):
            pytest.skip("the kernel refuses sync_file_range here (a sandbox)")
        # the offset reaches the kernel whole (a 32-bit argument would make it -4096: EINVAL)
        assert _start_writeback(f.fileno(), (4 << 30) - 4096, 10_000) is True
        assert _start_writeback(f.fileno(), -1, 10) is False  # EINVAL: a negative offset
    read, write = os.pipe()
    try:
        assert _start_writeback(read, 0, 10) is False  # ESPIPE
    finally:
        os.close(read)
        os.close(write)
    assert _start_writeback(-1, 0, 10) is False  # EBADF


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the calls looked up are Linux's")
def test_a_libc_call_is_typed_by_its_caller_and_keeps_errno():
    """`_native.libc`: each lookup a function of its own (one caller's argument types never another's),
    errno readable after a failure; None for a function the C library lacks."""
    import ctypes
    import errno

    from weightio._native import libc

    wide = libc("mprotect", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    narrow = libc("mprotect", ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
    assert wide is not narrow and wide.argtypes == [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert narrow.argtypes[0] is ctypes.c_int and wide.restype is ctypes.c_int
    ctypes.set_errno(0)
    assert wide(1 << 40 | 1, 4096, 0) == -1 and ctypes.get_errno() == errno.EINVAL  # (an address off a page)
    assert libc("weightio_no_such_function") is None


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".gguf"])
def test_outputs_are_exact_when_the_disk_writes_start_every_page(tmp_path, monkeypatch, suffix):
    """The npz writer seeks back to patch each member's CRC after its bytes, whose disk writes may
    have started already: the file is still exactly what was written (numpy checks the CRCs)."""
    from weightio import _outputs

    monkeypatch.setattr(_outputs, "WRITEBACK_STEP", 4096)
    rng = np.random.default_rng(1)
    tensors = {f"t{i}": rng.standard_normal((37, 129 + i)).astype(np.float32) for i in range(5)}
    out = tmp_path / f"x{suffix}"
    wio.save(tensors, out)
    if suffix == ".npz":
        with np.load(out) as loaded:
            assert {k: loaded[k].tobytes() for k in loaded.files} == {k: v.tobytes() for k, v in tensors.items()}
    with wio.open(out) as ckpt:
        assert {k: ckpt[k].numpy().tobytes() for k in ckpt} == {k: v.tobytes() for k, v in tensors.items()}
