"""Writable zero-copy memory for torch CPU tensors on Linux: one private mapping of the file, its
windows made writable while a tensor over them lives (`weightio._private`)."""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

import weightio as wio
from weightio import _io, _private
from weightio._io import writable_twin
from weightio.errors import InputError

from .conftest import child_exit_code, on_threads
from .memory import mapping_at
from .test_large_files import _meminfo, safetensors_file

pytestmark = pytest.mark.skipif(not (sys.platform.startswith("linux") and _private.available()),
                                reason="Linux only (elsewhere, a mapping per run of windows)")
WINDOW = 64 << 10


@pytest.fixture
def small_windows(monkeypatch):
    monkeypatch.setattr(_io, "PRIVATE_WINDOW", WINDOW)


def _three(tmp_path):
    """a: inside window 0; b: across the end of window 0; c: inside window 1 (64 KiB windows)."""
    path = tmp_path / "m.safetensors"
    tensors = {"a": np.arange(12_000, dtype=np.float32), "b": np.arange(12_000, dtype=np.float32) + 0.5,
               "c": np.full(1000, 7, np.float32)}
    wio.save(tensors, path)
    return path, tensors


def _where(ckpt, name):
    return _io.mapped_source(ckpt[name].numpy())[1]  # the tensor's offset in the file


def test_a_tensor_across_windows_is_served_by_the_windows_at_their_place(tmp_path, small_windows):
    # every twin of one file lies in one mapping: each byte of the file has one address, so a tensor
    # across a window's end shares its pages with the windows' other tensors (counted once in RSS)
    path, tensors = _three(tmp_path)
    with wio.open(path) as ckpt:
        offsets = {n: _where(ckpt, n) for n in tensors}
        assert offsets["a"] // WINDOW == 0 and offsets["b"] // WINDOW == 0 and offsets["c"] // WINDOW == 1
        assert (offsets["b"] + 48_000 - 1) // WINDOW == 1  # (b crosses into window 1)
        twins = {n: writable_twin(ckpt[n].numpy()) for n in tensors}
        address = {n: t.__array_interface__["data"][0] for n, t in twins.items()}
        assert address["b"] - address["a"] == offsets["b"] - offsets["a"]
        assert address["c"] - address["a"] == offsets["c"] - offsets["a"]
        for n, t in twins.items():
            assert t.flags.writeable and np.array_equal(t, tensors[n])
            assert mapping_at(address[n]) == ("rw-p", os.path.realpath(path), offsets[n])
        twins["b"][-1] = -1.0  # (in window 1)
        assert ckpt["b"].numpy()[-1] == tensors["b"][-1]  # the read-only mapping, and so the file, unchanged
    assert wio.load(path)["b"][-1] == tensors["b"][-1]
    assert twins["b"][-1] == -1.0  # (the twins outlive the checkpoint)


def test_a_window_no_tensor_uses_is_given_back_to_the_files_bytes(tmp_path, small_windows):
    path, tensors = _three(tmp_path)
    with wio.open(path) as ckpt:
        at = _where(ckpt, "c")
        twin = writable_twin(ckpt["c"].numpy())
        address = twin.__array_interface__["data"][0]
        twin[0] = -1.0
        keep = writable_twin(ckpt["a"].numpy())  # window 0 stays in use
        del twin
        gc.collect()
        assert mapping_at(address) == ("r--p", os.path.realpath(path), at)  # its write dropped with it
        again = writable_twin(ckpt["c"].numpy())
        assert again.__array_interface__["data"][0] == address and again[0] == 7.0  # the file's bytes again
        assert mapping_at(keep.__array_interface__["data"][0])[0] == "rw-p"


def test_twins_of_the_same_windows_share_their_memory_while_alive(tmp_path, small_windows):
    path, tensors = _three(tmp_path)
    with wio.open(path) as ckpt:
        first, second = writable_twin(ckpt["a"].numpy()), writable_twin(ckpt["a"].numpy()[10:])
        first[10] = 99.0
        assert second[0] == 99.0 and first.base is second.base  # (one span of window 0, alive: one array over it)


@pytest.mark.parametrize("walk", ["c", "python"])
def test_a_twin_is_made_for_a_view_of_the_file_only(tmp_path, small_windows, monkeypatch, walk):
    """`writable_twin` finds the file of a view whatever its chain of bases (the walk in C,
    `_speedups.array_root`, or in Python; memoryviews, numpy's stride tricks): a twin over the
    file's private pages; None for memory of anything else; a copy of its own for a view of a
    closed checkpoint."""
    if walk == "c" and _io._array_root is None:
        pytest.skip("weightio._speedups is not built here: the walk is Python's")
    if walk == "python":
        monkeypatch.setattr(_io, "_array_root", None)
    path, tensors = _three(tmp_path)
    with wio.open(path) as ckpt:
        view = ckpt["b"].numpy().reshape(100, 120)[3:, ::2]
        through = np.frombuffer(memoryview(ckpt["c"].numpy()), np.float32)[10:]  # (a memoryview in the chain)
        # numpy's stride tricks lend an array interface over the view's memory (a DummyArray whose base it is)
        strided = np.lib.stride_tricks.as_strided(ckpt["c"].numpy(), (10, 4), (16, 4))
        broadcast = np.broadcast_to(ckpt["c"].numpy()[5:9], (3, 4))
        base, c = _io.mapped_source(ckpt["b"].numpy())[1], _io.mapped_source(ckpt["c"].numpy())[1]
        for arr, offset in ((view, base + 3 * 480), (through, c + 40), (strided, c), (broadcast, c + 20)):
            twin = writable_twin(arr)
            assert twin.flags.writeable and twin.strides == arr.strides and np.array_equal(twin, arr)
            assert mapping_at(twin.__array_interface__["data"][0]) == ("rw-p", os.path.realpath(path), offset)
        for other in (np.arange(4.0), np.frombuffer(bytearray(8), np.uint8), np.array(view)):
            assert writable_twin(other) is None
        held = ckpt["c"].numpy()
    copied = writable_twin(held)
    assert copied.flags.owndata and np.array_equal(copied, tensors["c"])
    assert (mapping_at(copied.__array_interface__["data"][0]) or ("", "", 0))[1] != os.path.realpath(path)


def test_a_window_the_kernel_refuses_leaves_none_writable_and_says_so(tmp_path, small_windows, monkeypatch):
    path, tensors = _three(tmp_path)
    libc = _private._LIBC
    refused = []

    class Refusing:  # mprotect refuses any writable range that reaches window 1 (ENOMEM: the commitment)
        def __getattr__(self, name):
            return getattr(libc, name)

        def mprotect(self, at, length, prot):
            if prot & 2 and at + length > refused[0]:
                import ctypes

                ctypes.set_errno(12)
                return -1
            return libc.mprotect(at, length, prot)

    with wio.open(path) as ckpt:
        keep = writable_twin(ckpt["c"].numpy()[:0])  # (no twin of an empty tensor: no window made writable)
        private_base = writable_twin(ckpt["a"].numpy()).__array_interface__["data"][0] - _where(ckpt, "a")
        gc.collect()
        refused.append(private_base + WINDOW)
        monkeypatch.setattr(_private, "_LIBC", Refusing())
        with pytest.raises(InputError) as raised:
            writable_twin(ckpt["b"].numpy())  # windows 0 and 1: one run, refused whole
        assert raised.value.errno == 12 and str(raised.value) == (
            f"{path}: cannot map bytes 0..{os.path.getsize(path)} copy-on-write for a writable (zero-copy torch) "
            "tensor: Cannot allocate memory; the kernel commits memory for writable mappings: read it as numpy "
            "(read-only), or in slices")
        assert mapping_at(private_base)[0] == "r--p" and mapping_at(private_base + WINDOW)[0] == "r--p"
        monkeypatch.setattr(_private, "_LIBC", libc)
        assert np.array_equal(writable_twin(ckpt["b"].numpy()), tensors["b"])  # (counts intact: it works after)
    assert keep.shape == (0,)


def test_a_refused_run_made_partly_writable_is_left_read_only(tmp_path, small_windows, monkeypatch):
    # mprotect goes mapping (VMA) by mapping: one refused part-way has made the run's first mappings
    # writable. None of the run's windows had a user, so all are made read-only again
    path, tensors = _three(tmp_path)
    libc = _private._LIBC

    class PartRefusing:  # makes the first window of a writable range writable, then refuses (ENOMEM)
        def __getattr__(self, name):
            return getattr(libc, name)

        def mprotect(self, at, length, prot):
            if prot & 2 and length > WINDOW:
                import ctypes

                libc.mprotect(at, WINDOW, prot)
                ctypes.set_errno(12)
                return -1
            return libc.mprotect(at, length, prot)

    with wio.open(path) as ckpt:
        base = _where(ckpt, "b")
        monkeypatch.setattr(_private, "_LIBC", PartRefusing())
        with pytest.raises(InputError) as raised:
            writable_twin(ckpt["b"].numpy())  # windows 0 and 1
        assert raised.value.errno == 12
        private = _io.mapped_source(ckpt["b"].numpy())[0]._private
        assert private._users == {} and private._pending == []
        assert mapping_at(private.address)[0] == "r--p" and mapping_at(private.address + WINDOW)[0] == "r--p"
        monkeypatch.setattr(_private, "_LIBC", libc)
        twin = writable_twin(ckpt["b"].numpy())
        assert np.array_equal(twin, tensors["b"]) and twin.__array_interface__["data"][0] == private.address + base


def test_a_span_larger_than_memory_is_refused_though_windows_inside_it_are_in_use(tmp_path):
    # the kernel checks the commitment of each VMA mprotect makes writable on its own: a window in
    # use (or used before) in the middle splits a span of 1.5x RAM + swap into two halves that pass
    # alone. The span is checked whole, as a mapping of it was, and refused (heuristic overcommit)
    with open("/proc/sys/vm/overcommit_memory") as f:
        if int(f.read()) == 1:
            pytest.skip("overcommit_memory=1: the kernel commits any span")
    total = int(1.5 * (_meminfo("MemTotal") + _meminfo("SwapTotal"))) // (1 << 30) * (1 << 30) + (1 << 30)
    path = tmp_path / "huge.safetensors"
    safetensors_file(path, total)
    try:
        with wio.open(path) as ckpt:
            view = ckpt["far"].numpy()
            middle = writable_twin(view[view.size // 2:][:16])
            at = _io.mapped_source(view)[1] + view.size // 2
            for _ in range(2):  # the middle window in use, then used before (read-only, apart from its neighbours)
                with pytest.raises(InputError) as raised:
                    writable_twin(view)
                assert raised.value.errno == 12 and "Cannot allocate memory" in str(raised.value)
                private = _io.mapped_source(view)[0]._private
                assert private._users == ({} if middle is None else {at // _io.PRIVATE_WINDOW: 1})
                assert mapping_at(private.address)[0] == "r--p"
                middle = None
                gc.collect()
    finally:
        path.unlink()


def test_twins_made_and_dropped_on_many_threads_keep_their_bytes(tmp_path, small_windows):
    # windows made writable and read-only again while other threads' twins over them live: a twin
    # never loses its window (a write to a read-only page would kill the process)
    path = tmp_path / "m.safetensors"
    tensors = {f"t{i}": np.full(3000 + 97 * i, i, np.float32) for i in range(40)}  # ~640 KiB: ten windows
    wio.save(tensors, path)
    errors: list[str] = []
    with wio.open(path) as ckpt:
        views = {n: ckpt[n].numpy() for n in tensors}

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(300):
                names = rng.choice(list(tensors), 3)
                twins = [writable_twin(views[n]) for n in names]
                for n, t in zip(names, twins, strict=True):
                    t[0] = -1.0  # (shared with other threads' twins of it: only the other bytes are checked)
                    if not np.array_equal(t[1:], tensors[n][1:]):
                        errors.append(n)
                del twins
                if rng.random() < 0.02:
                    gc.collect()

        on_threads(work)
    assert errors == []
    gc.collect()
    assert all(np.array_equal(views[n], tensors[n]) for n in tensors)  # the read-only views never saw a write


def test_elsewhere_each_run_of_windows_is_a_mapping_of_its_own(tmp_path, small_windows, monkeypatch):
    # (what other platforms get): the same bytes, writable, private; a tensor across windows has its own mapping
    monkeypatch.setattr(_private, "available", lambda: False)
    path, tensors = _three(tmp_path)
    with wio.open(path) as ckpt:
        twins = {n: writable_twin(ckpt[n].numpy()) for n in tensors}
        assert all(np.array_equal(twins[n], tensors[n]) and twins[n].flags.writeable for n in tensors)
        a, b = (twins[n].__array_interface__["data"][0] for n in "ab")
        assert b - a != _where(ckpt, "b") - _where(ckpt, "a")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_holds_the_lock_makes_and_drops_twins(tmp_path, small_windows):
    # the thread that held a mapping's lock at the fork does not exist in the child: the child's
    # first twin dropped or made would wait for it forever, had the lock not been made anew there
    import threading
    import warnings

    path, tensors = _three(tmp_path)
    with wio.open(path) as ckpt:
        twin = writable_twin(ckpt["c"].numpy())
        mapping = twin.base.base.mapping  # (the twin's array over its span, the span, its mapping)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with mapping._lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(10)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # (3.12+: fork of a process with threads)
                pid = os.fork()
            if pid == 0:
                try:
                    del twin
                    gc.collect()  # (its span released: the lock taken)
                    again = writable_twin(ckpt["a"].numpy())
                    os._exit(0 if np.array_equal(again, tensors["a"]) else 3)
                except BaseException:
                    os._exit(4)
        finally:
            release.set()
            holder.join()
        hung = "the forked child waited for a lock held by a thread it does not have"
        assert child_exit_code(pid, 30, hung) == 0
