"""Owned-memory loads (weightio/devices/filling.py; ``copy=True`` of load_all, TensorView.to,
VarBuilder.load_all; `weightio.torch.load_into` into a CPU module): exact bytes, memory of their
own, and every check of the zero-copy path kept on the parallel-read path."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import weightio as wio
from weightio import _threads
from weightio.devices import filling
from weightio.errors import CorruptFileError, InputError

from .conftest import FIXTURES, child_exit_code

SOURCES = ["tiny-bert/model.safetensors", "numpy/arrays.npz", "numpy/compressed.npz", "numpy/big_endian.npy",
           "pytorch/resnet18_like.pth", "gguf/quantized.gguf", "dtypes.safetensors"]


def _bytes_of(value) -> bytes:
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tobytes()
    import torch

    return value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _torch_has(dtype) -> bool:
    try:
        return wio.dtypes.by_numpy(dtype).torch is not None
    except wio.WeightioError:
        return False


def _number_views(ckpt) -> dict:
    return {k: ckpt[k] for k in ckpt if ckpt[k].dtype.kind in "biufcV" and ckpt[k].dtype.itemsize}


@pytest.fixture(params=["c", "python"])
def reads(request, monkeypatch) -> str:
    """The test run twice: with the fill's reads in C (`weightio._speedups.read_pieces`) and in Python."""
    if request.param == "c" and filling._READ_PIECES is None:
        pytest.skip("weightio._speedups is not built here: the reads are Python's")
    if request.param == "python":
        monkeypatch.setattr(filling, "_READ_PIECES", None)
    return request.param


def _recording_reads(monkeypatch, log: list) -> None:
    """`filling._read_pieces` made to append ``(fd, offset, nbytes, on the main thread)`` to `log`
    for each piece before reading them all."""
    import threading

    real = filling._read_pieces

    def recorded(fd, file, pieces, stop=None, threads=1, **kw):
        main = threading.current_thread() is threading.main_thread()
        log.extend((fd, offset, dst.nbytes, main) for dst, offset in pieces)
        return real(fd, file, pieces, stop, threads, **kw)

    monkeypatch.setattr(filling, "_read_pieces", recorded)


@pytest.mark.parametrize("source", SOURCES)
def test_copies_hold_exactly_the_bytes_of_the_views(source, monkeypatch, reads):
    """Every format, numpy and torch CPU, tensors split into many pieces: the same bytes as the
    zero-copy views (which test_differential checks against the reference libraries)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(filling, "PIECE", 4096)
    with wio.open(FIXTURES / source) as ckpt:
        views = {k: v for k, v in _number_views(ckpt).items() if v.dtype.name != "object"}
        for device in ("numpy", "torch"):
            if device == "torch":  # the dtypes torch has (complex has no row in weightio's table)
                views = {k: v for k, v in views.items() if _torch_has(v.dtype)}
            copies = wio.devices.load_all(views, device, copy=True)
            for name, view in views.items():
                assert _bytes_of(copies[name]) == _bytes_of(view.numpy()), (source, device, name)
                assert tuple(copies[name].shape) == view.shape
                if device == "torch":
                    assert isinstance(copies[name], torch.Tensor)


def test_safetensors_copies_match_the_reference_library(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    monkeypatch.setattr(filling, "PIECE", 1 << 12)
    tensors = {"big": torch.randn(300, 257), "bf16": torch.randn(64, 33).to(torch.bfloat16),
               "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4), "ints": torch.arange(77, dtype=torch.int64),
               "flags": torch.tensor([True, False, True])}
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    reference = safetensors_torch.load_file(str(path))
    vb = wio.VarBuilder.from_path(path, device="torch")
    loaded = vb.load_all(copy=True)
    vb.close()
    for name, want in reference.items():
        assert loaded[name].dtype == want.dtype and torch.equal(loaded[name], want), name


def test_results_own_their_memory():
    """Writable, sharing nothing with the file's mapping or each other, alive after close."""
    torch = pytest.importorskip("torch")
    ckpt = wio.open(FIXTURES / "tiny-bert/model.safetensors")
    name = "embeddings.word_embeddings.weight"
    view = ckpt[name].numpy()
    mapping = ckpt[name]._reader.file.data
    low = mapping.__array_interface__["data"][0]
    tensors = wio.devices.load_all(ckpt, "torch", copy=True)
    arrays = wio.devices.load_all(ckpt, "numpy", copy=True)
    single = ckpt[name].to("torch", copy=True)
    ckpt.close()
    for t in (tensors[name], single):
        assert not low <= t.data_ptr() < low + mapping.nbytes
        t.add_(1)  # writable, no SIGSEGV
    assert arrays[name].flags.writeable and arrays[name].flags.owndata
    assert not np.shares_memory(arrays[name], view)
    arrays[name][...] = 0
    assert np.array_equal(tensors[name].numpy(), single.numpy())  # the same bytes + 1, each its own
    assert not np.array_equal(view, np.zeros_like(view))  # the file's bytes unchanged
    with wio.open(FIXTURES / "tiny-bert/model.safetensors") as again:
        assert torch.equal(torch.from_numpy(again[name].numpy().copy()) + 1, tensors[name])
    storages = {t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()}
    assert len(storages) == len([t for t in tensors.values() if t.numel()])  # one allocation per tensor


def test_a_cast_is_not_copied_twice_and_integers_keep_their_type():
    torch = pytest.importorskip("torch")
    with wio.open(FIXTURES / "tiny-bert/model.safetensors") as ckpt:
        out = wio.devices.load_all(ckpt, "torch", "float16", copy=True)
        for name in ckpt:
            want = torch.from_numpy(ckpt[name].numpy().copy())
            want = want.half() if want.is_floating_point() else want
            assert torch.equal(out[name], want), name


def test_a_changed_file_is_refused_on_the_parallel_read_path(tmp_path):
    path = tmp_path / "model.safetensors"
    shutil.copy(FIXTURES / "tiny-bert/model.safetensors", path)
    past = os.stat(path).st_mtime - 3600
    os.utime(path, (past, past))
    with wio.open(path) as ckpt:
        views = {k: ckpt[k] for k in ckpt}
        hosts = {k: v.numpy() for k, v in views.items()}  # views made before the change
        os.utime(path)  # a rewrite in place, as far as size and modification time tell
        with pytest.raises(CorruptFileError, match="was rewritten in place since it was opened"):
            wio.devices.load_all(views, "numpy", copy=True)
        with pytest.raises(CorruptFileError, match="was rewritten in place since it was opened"):
            wio.devices.load_all(hosts, "numpy", copy=True)  # arrays of the mapping: checked too


def test_a_file_changed_during_the_reads_is_refused_after_them(tmp_path, monkeypatch, reads):
    path = tmp_path / "model.safetensors"
    shutil.copy(FIXTURES / "tiny-bert/model.safetensors", path)
    past = os.stat(path).st_mtime - 3600
    os.utime(path, (past, past))
    read = filling._read_pieces

    def read_then_touch(*args, **kw):
        read(*args, **kw)
        os.utime(path)

    monkeypatch.setattr(filling, "_read_pieces", read_then_touch)
    with wio.open(path) as ckpt, pytest.raises(CorruptFileError, match="since it was opened"):
        wio.devices.load_all(ckpt, "numpy", copy=True)


def test_a_read_past_the_end_or_a_short_read_is_corrupt(tmp_path, reads):
    path = tmp_path / "model.safetensors"
    shutil.copy(FIXTURES / "tiny-bert/model.safetensors", path)
    with wio.open(path) as ckpt:
        file = next(iter(ckpt.values()))._reader.file
        with file.descriptor() as fd:
            dst = np.empty(16, np.uint8)
            with pytest.raises(CorruptFileError, match="lie past the end of the file"):
                filling._read(fd, file, dst, file.size - 8)
            object.__setattr__(file, "size", file.size + 16)  # as if the file had shrunk under us
            with pytest.raises(CorruptFileError, match="file shrank while reading it"):
                filling._read(fd, file, dst, file.size - 16)


def test_load_into_copies_into_the_modules_own_memory(tmp_path):
    """An initialised module is filled in place by ``copy_`` from the zero-copy views: parallel
    preads into its (already faulted) memory measured 15% slower than one ``copy_`` here."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import weightio.torch as wt

    source = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 7))
    source[1].weight.data = source[1].weight.data.to(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(source.state_dict(), str(path))
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 7))
    model[1].weight.data = model[1].weight.data.to(torch.bfloat16)
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert wt.load_into(model, path) == ([], [])
    for name, value in model.state_dict().items():
        assert value.data_ptr() == before[name], name  # filled in place
        assert torch.equal(value, source.state_dict()[name]), name


def test_populate_is_a_hint_that_keeps_the_memory_as_it_was():
    big = np.full(8 << 20, 7, np.uint8)
    filling.populate(big[1:])  # unaligned: the whole pages inside
    filling.populate(big[:100])  # too small: nothing
    assert int(big.sum()) == 7 * (8 << 20)  # populating never changes what is written
    fresh = np.empty(1 << 20, np.uint8)
    filling.populate(fresh)
    fresh[:] = 1
    assert int(fresh.sum()) == 1 << 20


def _resident_pages(arr: np.ndarray) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = arr.nbytes // 4096
    vec = ctypes.create_string_buffer(pages)
    assert libc.mincore(arr.__array_interface__["data"][0], arr.nbytes, vec) == 0
    return sum(b & 1 for b in vec.raw)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and mincore are Linux's")
def test_populate_all_faults_the_pages_in_on_the_fill_pool(monkeypatch):
    import mmap
    import threading

    real, calls = filling.populate, []
    monkeypatch.setattr(filling, "populate",
                        lambda arr: calls.append((threading.current_thread().name, arr.nbytes)) or real(arr))
    from weightio import _memory

    probe = np.frombuffer(mmap.mmap(-1, 1 << 20), np.uint8)
    if _memory._madvise()(probe.__array_interface__["data"][0], 1 << 20, _memory._MADV_POPULATE_WRITE) != 0:
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    memory = mmap.mmap(-1, 8 << 20)
    fresh = np.frombuffer(memory, np.uint8)
    assert _resident_pages(fresh) == 0
    filling.populate_all(fresh, piece=1 << 20)
    assert _resident_pages(fresh) == 2048  # every page, before any write
    assert sorted(n for _, n in calls) == [1 << 20] * 8
    assert all(name.startswith("weightio-fill") for name, _ in calls)
    assert int(fresh.sum()) == 0
    calls.clear()
    filling.populate_all(np.frombuffer(mmap.mmap(-1, 1 << 20), np.uint8), piece=1 << 20)  # one piece: here
    assert calls == [(threading.current_thread().name, 1 << 20)]


def test_fresh_memory_is_a_new_writable_array_of_its_size():
    from weightio._memory import fresh

    for n in (0, 100, 3 << 20):
        out = fresh(n)
        assert out.dtype == np.uint8 and out.shape == (n,) and out.flags.writeable and out.flags.owndata
        out[:] = 5
        assert int(out.sum()) == 5 * n


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc (Linux): elsewhere pieces are read")
def test_each_thread_reads_its_own_stretch_in_order_through_its_own_description(tmp_path, monkeypatch, reads):
    # The kernel reads ahead per open file description: a whole-load fill gives each thread a
    # stretch of the file, read in order through a description opened for it alone
    monkeypatch.setattr(filling, "PIECE", 4096)
    monkeypatch.setattr(filling, "_THREADS", 4)
    path = tmp_path / "m.safetensors"
    tensors = {f"t{i:02d}": np.full(3000 + 17 * i, i, np.float32) for i in range(40)}
    wio.save(tensors, path)
    import itertools

    log, opened, advice = [], {}, []  # opened: descriptor -> which opening it is now (numbers are reused)
    real_open, openings = os.open, itertools.count()

    def opening(path, flags):
        fd = real_open(path, flags)
        if str(path).startswith("/proc/self/fd/"):
            opened[fd] = next(openings)
        return fd

    real_read = filling._read_pieces
    monkeypatch.setattr(filling, "_read_pieces", lambda fd, file, pieces, stop=None, **kw: log.extend(
        (opened.get(fd), off) for _, off in pieces) or real_read(fd, file, pieces, stop, **kw))
    monkeypatch.setattr(filling.os, "open", opening)
    monkeypatch.setattr(filling.os, "posix_fadvise", lambda fd, a, n, how: advice.append((fd, how)))
    with wio.open(path) as ckpt:
        copies = wio.devices.load_all(ckpt, "numpy", copy=True)
    assert all(np.array_equal(copies[k], v) for k, v in tensors.items())
    by_opening: dict[int, list[int]] = {}
    for which, off in log:
        by_opening.setdefault(which, []).append(off)
    assert None not in by_opening and len(by_opening) == 4  # no read through the shared descriptor
    assert all(offsets == sorted(offsets) for offsets in by_opening.values())  # each stretch in file order
    spans = sorted((min(o), max(o)) for o in by_opening.values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))  # stretches do not interleave
    assert {how for _, how in advice} == {os.POSIX_FADV_SEQUENTIAL} and len(advice) == 4


def _load_six_tensors_owned(tmp_path) -> None:
    """Six tensors of 20,000 bytes (five 4 KiB pieces each) saved, loaded with copy=True, compared."""
    path = tmp_path / "m.safetensors"
    tensors = {f"t{i}": np.full(5000, i, np.float32) for i in range(6)}
    wio.save(tensors, path)
    with wio.open(path) as ckpt:
        copies = wio.devices.load_all(ckpt, "numpy", copy=True)
    assert all(np.array_equal(copies[k], v) for k, v in tensors.items())


def test_without_descriptions_of_their_own_pieces_are_read_as_before(tmp_path, monkeypatch, reads):
    import threading

    # no /proc (macOS, some sandboxes): stretches would share one descriptor, so pieces are read: in
    # C, by the threads of one call sharing them; in Python, a pool task a piece
    monkeypatch.setattr(filling, "PIECE", 4096)
    monkeypatch.setattr(filling, "_reopen", lambda fd, identity: None)
    seen, calls = [], []
    real_pieces = filling._read_pieces  # (what `_read` calls, a piece at a time)

    def recorded(fd, file, pieces, stop=None, threads=1, **kw):
        calls.append((len(pieces), threads, threading.current_thread() is threading.main_thread()))
        seen.extend(off for _, off in pieces)
        return real_pieces(fd, file, pieces, stop, threads, **kw)

    monkeypatch.setattr(filling, "_read_pieces", recorded)
    _load_six_tensors_owned(tmp_path)
    assert len(seen) == 6 * 5 and len(set(seen)) == 30  # 20,000 bytes a tensor: five 4 KiB pieces each
    # (never on the caller's thread, even as the fill's one task: its wait stays interruptible)
    assert calls == ([(30, filling._THREADS, False)] if reads == "c" else [(1, 1, False)] * 30)


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc (Linux): elsewhere pieces are read")
def test_a_model_of_many_shards_loads_within_a_few_descriptors(tmp_path, monkeypatch):
    # each stretch opens its description when it starts and closes it when it ends: a load holds
    # one descriptor per file and at most one per thread, not one per stretch of every file
    import resource

    monkeypatch.setattr(filling, "PIECE", 4096)
    monkeypatch.setattr(filling, "_THREADS", 16)
    shards = 40
    tensors = {f"w{i:02d}": np.full(16 * 4096, i, np.uint8) for i in range(shards)}  # 16 pieces a shard
    weight_map = {}
    for i, (name, value) in enumerate(tensors.items()):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        wio.save({name: value}, tmp_path / shard)
        weight_map[name] = shard
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    real, reopened = filling._reopen, []
    monkeypatch.setattr(filling, "_reopen", lambda fd, identity: reopened.append(real(fd, identity)) or reopened[-1])
    with wio.open(tmp_path) as ckpt:
        in_use = len(os.listdir("/proc/self/fd"))
        # per file its mapping's descriptor (Python's mmap keeps a duplicate) and the load's own
        # duplicate; the 16 threads' descriptions; a little room
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 2 * shards + 16 + 8, hard))
        try:
            copies = wio.devices.load_all(ckpt, "numpy", copy=True)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert all(np.array_equal(copies[k], v) for k, v in tensors.items())
    assert len(reopened) == shards * (1 + 16) and None not in reopened  # (no stretch went without its own)


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc (Linux): elsewhere pieces are read")
def test_a_stretch_that_gets_no_description_of_its_own_reads_through_the_shared_one(tmp_path, monkeypatch, reads):
    monkeypatch.setattr(filling, "PIECE", 4096)
    monkeypatch.setattr(filling, "_THREADS", 4)
    real, calls, log, stretches = filling._reopen, [], [], []
    monkeypatch.setattr(filling, "_reopen",
                        lambda fd, identity: calls.append(fd) or (real(fd, identity) if len(calls) == 1 else None))
    _recording_reads(monkeypatch, log)
    real_stripe = filling._read_stripe
    monkeypatch.setattr(filling, "_read_stripe", lambda *a: stretches.append(len(a[3])) or real_stripe(*a))
    _load_six_tensors_owned(tmp_path)
    through = [fd for fd, *_ in log]
    assert len(calls) == 1 + 4 and set(through) == {calls[0]} and len(through) == 30  # the probe, then 4 stretches
    assert len(stretches) == 4 and sum(stretches) == 30  # read as stretches (in file order), not as pieces


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc (Linux)")
def test_a_description_of_another_file_is_never_handed_out(tmp_path):
    # a descriptor number closed and reused for another file: its identity (device, inode) differs
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"AAAA")
    b.write_bytes(b"BBBB")
    fd = os.open(a, os.O_RDONLY)
    identity = filling._identity(fd)
    own = filling._reopen(fd, identity)
    assert own is not None and os.pread(own, 4, 0) == b"AAAA"
    os.close(own)
    os.close(fd)
    reused = os.open(b, os.O_RDONLY)
    try:
        assert filling._reopen(reused, identity) is None
    finally:
        os.close(reused)


def test_a_failed_piece_stops_the_other_stretches(tmp_path, monkeypatch):
    # (the reads in Python, whose system calls can be slowed and failed; the C reads look at the
    # same flag: test_the_reads_in_c_stop_when_the_fillers_flag_is_set)
    import time

    monkeypatch.setattr(filling, "_READ_PIECES", None)
    monkeypatch.setattr(filling, "PIECE", 4096)
    monkeypatch.setattr(filling, "_THREADS", 2)
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.zeros(200_000, np.uint8), "b": np.ones(200_000, np.uint8)}, path)
    real, second = os.preadv, []
    with wio.open(path) as ckpt:
        base = filling.mapped_source(ckpt["a"].numpy())[1]

        def preadv(fd, buffers, offset):
            if 8_000 < offset - base < 20_000:  # early in the first stretch
                raise OSError(5, "injected")
            if offset - base >= 200_000:  # the second stretch: slow, 49 pieces
                second.append(offset)
                time.sleep(0.005)
            return real(fd, buffers, offset)

        monkeypatch.setattr(filling.os, "preadv", preadv)
        with pytest.raises(OSError, match="injected") as raised:
            wio.devices.load_all(ckpt, "numpy", copy=True)
    assert isinstance(raised.value, InputError) and raised.value.errno == 5  # the file named, not a bare OSError
    assert str(raised.value) == f"{path}: cannot read the file: injected"
    assert len(second) < 20  # it gave up between pieces (or never began) instead of reading all 49


class _PoolFailingAt:
    """The fill pool, except that its `fail_at`-th `submit` raises `error` once `ready` is set (an
    interrupt; a RuntimeError as at interpreter shutdown), and every later one too."""

    def __init__(self, pool, fail_at: int, ready, error: BaseException | None = None):
        self.pool, self.fail_at, self.ready, self.submitted = pool, fail_at, ready, 0
        self.error = error or KeyboardInterrupt("interrupted while queuing")

    def submit(self, fn, *args):
        self.submitted += 1
        if self.submitted >= self.fail_at:
            self.ready.wait(10)
            raise self.error
        return self.pool.submit(fn, *args)


def _slowed_reads(monkeypatch, seconds: float, begun) -> tuple[list, list]:
    """`filling._read` made `seconds` slower: the offsets of the reads begun (each sets `begun`) and
    the times the reads ended. The filler's pieces are made a pool task each, as the reads in Python
    make them (in C, they are shared by the threads of one call: `_SHARED`)."""
    import time

    monkeypatch.setattr(filling, "_SHARED", False)
    real, starts, ended = filling._read, [], []

    def slow_read(fd, file, dst, offset, copies=False):
        starts.append(offset)
        begun.set()
        time.sleep(seconds)
        real(fd, file, dst, offset, copies)
        ended.append(time.monotonic())

    monkeypatch.setattr(filling, "_read", slow_read)
    return starts, ended


def test_a_start_cut_short_leaves_no_read_running_once_the_filler_is_closed(tmp_path, monkeypatch):
    import threading
    import time

    from weightio._threads import shared_pool

    begun = threading.Event()
    monkeypatch.setattr(filling, "PIECE", 4096)
    monkeypatch.setattr(filling, "shared_pool", lambda kind, n: _PoolFailingAt(shared_pool(kind, n), 3, begun))
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(40_000, dtype=np.uint8)}, path)
    starts, ended = _slowed_reads(monkeypatch, 0.1, begun)
    with wio.open(path) as ckpt:
        src = ckpt["a"].numpy()
        base = filling.mapped_source(src)[1]  # the file offset of the first piece
        dst = np.zeros(src.nbytes, np.uint8)
        with pytest.raises(KeyboardInterrupt, match="while queuing"), filling.Filler() as filler:
            filler.start([(dst, src)])  # ten pieces: the third cannot be queued (one of the two may be cancelled)
        closed = time.monotonic()
    assert len(ended) == len(starts) >= 1 and max(ended) <= closed  # what had begun ended before the close
    # Either queued piece may begin first (Python 3.13's pool often starts the second): each piece
    # that began was read whole, the others never were.
    assert set(starts) <= {base, base + 4096}
    for k in range(0, src.nbytes, 4096):
        expected = src[k:k + 4096] if base + k in starts else np.zeros_like(src[k:k + 4096])
        assert np.array_equal(dst[k:k + 4096], expected), k


def test_leaving_a_filler_on_an_error_cancels_what_was_queued_and_waits_for_what_runs(tmp_path, monkeypatch):
    import threading
    import time

    monkeypatch.setattr(filling, "PIECE", 4096)
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(400_000, dtype=np.uint8)}, path)
    started = threading.Event()
    starts, ended = _slowed_reads(monkeypatch, 0.05, started)
    with wio.open(path) as ckpt:
        src = ckpt["a"].numpy()
        dst = np.zeros(src.nbytes, np.uint8)
        with pytest.raises(KeyboardInterrupt), filling.Filler() as filler:
            futures = filler.start([(dst, src)])  # 98 pieces, never waited for
            started.wait(10)
            raise KeyboardInterrupt
        closed = time.monotonic()
    assert len(ended) == len(starts) >= 1 and max(ended) <= closed  # what had begun ended before the close
    assert len(starts) < len(futures)  # (16 threads, 98 slowed pieces: most were still queued)
    assert sum(f.cancelled() for f in futures) == len(futures) - len(starts)  # the rest never began
    assert all(f.done() for f in futures)


def test_an_interrupt_while_settling_is_raised_only_once_every_task_has_ended():
    # a second Ctrl-C lands while the clean-up waits for a task: raised in the waiting thread, as
    # KeyboardInterrupt is, from the wait itself (made synchronous here: a timer thread's
    # _thread.interrupt_main was missed once in a while in full runs of the suite)
    import time

    from weightio._threads import shared_pool

    ended = []
    future = shared_pool("fill", filling._THREADS).submit(lambda: time.sleep(0.3) or ended.append(time.monotonic()))

    class Interrupted:
        waits = 0

        def done(self):
            return future.done()

        def exception(self):
            self.waits += 1
            if self.waits == 1:
                raise KeyboardInterrupt
            return future.exception()

    waited = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        filling._settle([waited])
    raised = time.monotonic()
    assert future.done() and ended and ended[0] <= raised and waited.waits >= 2


def test_a_task_queued_but_not_recorded_never_runs_once_the_filler_has_closed(tmp_path, monkeypatch):
    # An interrupt that lands after the pool queued a task but before `start` recorded it: the
    # filler cannot wait for that task, so it must never begin once the filler has closed.
    import threading

    from weightio._threads import shared_pool

    monkeypatch.setattr(filling, "PIECE", 4096)
    pool, release = shared_pool("fill", filling._THREADS), threading.Event()
    busy = [pool.submit(release.wait, 10) for _ in range(filling._THREADS)]  # every thread taken

    class Interrupted:
        def submit(self, fn, *args):
            pool.submit(fn, *args)  # queued behind the busy threads...
            raise KeyboardInterrupt  # ...and the interrupt lands before start() records it

    monkeypatch.setattr(filling, "shared_pool", lambda kind, n: Interrupted())
    reads = []
    monkeypatch.setattr(filling, "_read", lambda *a: reads.append(a))
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(20_000, dtype=np.uint8)}, path)
    with wio.open(path) as ckpt:
        src = ckpt["a"].numpy()
        dst = np.zeros(src.nbytes, np.uint8)
        with pytest.raises(KeyboardInterrupt), filling.Filler() as filler:
            filler.start([(dst, src)])
    release.set()
    for future in busy:
        future.result(10)
    pool.submit(lambda: None).result(10)  # the orphan, queued before this, has had its turn
    assert reads == [] and not dst.any()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_fills_with_pools_of_its_own(tmp_path, monkeypatch):
    import warnings

    monkeypatch.setattr(filling, "PIECE", 4096)  # (pieces on the pool, not one read inline)
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(300_000, dtype=np.uint8)}, path)
    with wio.open(path) as ckpt:
        first = wio.devices.load_all(ckpt, "numpy", copy=True)["a"]  # the parent's fill pool now has threads
        assert first.tolist()[:3] == [0, 1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (3.12+: fork of a process with threads)
        pid = os.fork()
    if pid == 0:  # the child: the parent's pool threads do not exist here
        try:
            from weightio import _threads

            if _threads._pools:  # (the parent's pool, whose threads are gone: a task queued there would wait forever)
                os._exit(5)
            with wio.open(path) as ckpt:
                again = wio.devices.load_all(ckpt, "numpy", copy=True)["a"]
            os._exit(0 if np.array_equal(again, np.arange(300_000, dtype=np.uint8)) else 3)
        except BaseException:
            os._exit(4)
    hung = "the forked child's fill never finished (the parent's pool threads do not exist in it)"
    assert child_exit_code(pid, 60, hung) == 0


def test_a_fill_smaller_than_a_piece_a_cpu_is_cut_smaller(monkeypatch):
    """One tensor's ``to(copy=True)`` (8 MiB: one `PIECE`) used to be one read on the caller's
    thread; a fill is now cut into one piece a CPU, no more than one a `MIN_PIECE` (1 MiB) and
    none larger than `PIECE`, each whole pages, the last shorter by less than a page a piece (no
    crumb). Measured: a 1 GiB model's tensors copied one ``to(copy=True)`` at a time, 0.92 ->
    0.60 s (medians of 8 alternating runs, 2 CPUs)."""
    def cut(total: int) -> list[int]:
        piece = filling._piece_for(total)
        return [b - a for a, b in filling._pieces(total, piece)]

    monkeypatch.setattr(filling, "_cpus", lambda: 2)
    assert cut(8 << 20) == [4 << 20] * 2
    assert cut((8 << 20) + 1) == [(4 << 20) + 4096, (4 << 20) - 4095]
    assert cut(3 << 20) == [1536 << 10] * 2
    assert cut((1 << 20) + 4096) == [(1 << 20) + 4096]  # (under two MIN_PIECEs: one piece, done inline)
    assert cut((2 << 20) - 1) == [(2 << 20) - 1]
    assert cut(1 << 20) == [1 << 20] and cut(5) == [5] and filling._piece_for(0) == 4096
    assert filling._piece_for(1 << 30) == filling.PIECE == 8 << 20
    monkeypatch.setattr(filling, "_cpus", lambda: 16)
    assert cut((8 << 20) + 4096) == [(1 << 20) + 4096] * 7 + [(1 << 20) - 6 * 4096]
    assert cut(64 << 20) == [4 << 20] * 16 and cut(1 << 30) == [8 << 20] * 128
    monkeypatch.setattr(filling, "PIECE", 4096)  # (the tests' tiny pieces stay tiny)
    assert filling._piece_for(8 << 20) == 4096


def test_the_cpus_a_fill_counts_are_the_processs_own_and_at_most_its_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 9}, raising=False)
    assert filling._cpus() == _threads.cpus() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(200)), raising=False)
    assert filling._cpus() == filling._THREADS == 16 and _threads.cpus() == 200
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # (macOS, Windows: the CPU count)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert filling._cpus() == _threads.cpus() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert filling._cpus() == 1


def test_pieces_the_pool_refuses_are_read_on_the_callers_thread(tmp_path, monkeypatch):
    """A pool that stops taking work part-way (a RuntimeError from `submit`: interpreter shutdown,
    no thread to be had): the pieces queued before run on it, the rest here, in order; every byte."""
    import threading

    from weightio._threads import shared_pool

    begun = threading.Event()
    begun.set()
    monkeypatch.setattr(filling, "PIECE", 4096)
    refusing = _PoolFailingAt(shared_pool("fill", 16), 3, begun, RuntimeError("cannot schedule new futures"))
    monkeypatch.setattr(filling, "shared_pool", lambda kind, n: refusing)
    log: list = []
    _recording_reads(monkeypatch, log)
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(40_000, dtype=np.uint8)}, path)
    with wio.open(path) as ckpt:
        copy = wio.devices.load_all(ckpt, "numpy", copy=True)["a"]
    assert np.array_equal(copy, np.arange(40_000, dtype=np.uint8))
    threads = [main for *_, main in log]
    assert refusing.submitted == 3 and sorted(threads) == [False] * 2 + [True] * 8  # 10 pieces of 4 KiB


def test_a_copy_made_while_the_interpreter_shuts_down_is_done_on_the_callers_thread(tmp_path):
    """In an ``atexit`` handler no thread pool can be made or fed: a copy of several pieces is read
    on the caller's thread instead (it raised "can't register atexit after shutdown")."""
    import subprocess
    import sys

    data = np.arange(6 << 20, dtype=np.uint8)
    path = tmp_path / "m.safetensors"
    wio.save({"w": data, "s": data[:1000]}, path)
    script = f"""
import atexit, numpy as np, weightio as wio
def late():
    with wio.open({str(path)!r}) as ckpt:
        for name in ("w", "s"):
            copy = ckpt[name].to("numpy", copy=True)
            print(name, copy.nbytes, int(copy[-1]), np.array_equal(copy, ckpt[name].numpy()))
atexit.register(late)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.split("\n") == [f"w {6 << 20} {((6 << 20) - 1) % 256} True", f"s 1000 {999 % 256} True", ""]


@pytest.mark.parametrize(("size", "reads"), [(8 << 20, [(4 << 20, False)] * 2), (300_000, [(300_000, True)])])
def test_one_tensors_copy_is_read_in_pieces_on_the_pool(tmp_path, monkeypatch, size, reads):
    """An 8 MiB tensor, 2 CPUs: two reads of 4 MiB, on the pool's threads, in two stretches. A copy
    of one piece (300 kB) is read where it is asked for, without a filler's pool hand-off (53 -> 25 us
    a call on a 7 KiB tensor). The bytes exact, each its own."""

    monkeypatch.setattr(filling, "_cpus", lambda: 2)
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "m.safetensors"
    wio.save({"w": data}, path)
    log: list = []
    _recording_reads(monkeypatch, log)
    with wio.open(path) as ckpt:
        copy = ckpt["w"].to("numpy", copy=True)
        assert not np.shares_memory(copy, ckpt["w"].numpy())
    assert np.array_equal(copy, data) and copy.flags.writeable and copy.flags.owndata
    assert sorted((n, main) for _, _, n, main in log) == reads


def _read_pieces_in_c():
    if filling._READ_PIECES is None:
        pytest.skip("weightio._speedups is not built here: the reads are Python's")
    return filling._READ_PIECES


def test_the_reads_in_c_fill_each_destination_with_its_bytes(tmp_path):
    read_pieces = _read_pieces_in_c()
    data = np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    big = np.zeros(2 << 20, np.uint8)  # its pages faulted in first (MADV_POPULATE_WRITE)
    small, empty = np.zeros(5, np.uint8), np.zeros(0, np.uint8)
    unaligned = np.zeros(300_001, np.uint8)[1:]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_pieces(fd, [(big, 1000), (small, 0), (empty, 7), (unaligned, (3 << 20) - 300_000)], None) == (4, -1)
        assert read_pieces(fd, [], None) == (0, -1)
    finally:
        os.close(fd)
    assert np.array_equal(big, data[1000 : 1000 + (2 << 20)]) and np.array_equal(small, data[:5])
    assert np.array_equal(unaligned, data[-300_000:])


def test_the_reads_in_c_say_where_the_file_ended_and_raise_what_the_system_says(tmp_path):
    read_pieces = _read_pieces_in_c()
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    a, b, c = np.zeros(10, np.uint8), np.zeros(40, np.uint8), np.full(4, 9, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_pieces(fd, [(a, 0), (b, 80), (c, 0)], None) == (1, 20)  # piece 1 got 20 of its 40 bytes
        assert b[:20].tolist() == list(range(80, 100)) and c.tolist() == [9] * 4  # nothing after it read
        with pytest.raises(ValueError, match="a negative offset"):
            read_pieces(fd, [(a, -1)], None)
        with pytest.raises(TypeError, match=r"a \(destination, offset\) tuple"):
            read_pieces(fd, [a], None)
        read_only = np.zeros(4, np.uint8)
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            read_pieces(fd, [(a, 0), (read_only, 0)], None)
        with pytest.raises(ValueError, match="not C-contiguous"):
            read_pieces(fd, [(np.zeros(8, np.uint8)[::2], 0)], None)
        with pytest.raises(BufferError, match="not writable"):
            read_pieces(fd, [(b"abcd", 0)], None)
        assert not read_only.any()
    finally:
        os.close(fd)
    with pytest.raises(OSError) as raised:
        read_pieces(fd, [(a, 0)], None)  # a closed descriptor
    assert raised.value.errno == errno.EBADF


def test_the_reads_in_c_stop_when_the_fillers_flag_is_set(tmp_path, monkeypatch):
    read_pieces = _read_pieces_in_c()
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    a = np.zeros(10, np.uint8)
    halt = filling._Stop()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_pieces(fd, [(a, 0)], halt.flag) == (1, -1) and a[9] == 9
        a[:] = 0
        halt.set()
        assert read_pieces(fd, [(a, 0), (a, 10)], halt.flag) == (0, -1) and not a.any()  # nothing begun
    finally:
        os.close(fd)
    # a filler hands its own flag to the reads, and sets it when a piece fails
    monkeypatch.setattr(filling, "PIECE", 4096)
    flags, real = [], filling._READ_PIECES

    def recording(fd, pieces, flag, *rest):
        flags.append(flag)
        if len(flags) == 1:
            raise OSError(5, "injected")
        return real(fd, pieces, flag, *rest)

    monkeypatch.setattr(filling, "_READ_PIECES", recording)
    model = tmp_path / "m.safetensors"
    wio.save({"a": np.zeros(200_000, np.uint8)}, model)
    with wio.open(model) as ckpt, pytest.raises(OSError, match="injected"):
        wio.devices.load_all(ckpt, "numpy", copy=True)
    assert flags and all(flag is flags[0] and flag == b"\x01" for flag in flags)


def test_the_reads_in_c_shared_by_threads_fill_each_destination_and_say_what_failed(tmp_path):
    # threads > 1: the call's own threads share the pieces (what the GPU ring's buffers get): every
    # byte lands where it belongs whichever thread read it; a piece the file ended in is named with
    # its bytes read; a refused read raises its errno; a set flag stops them before any piece
    read_pieces = _read_pieces_in_c()
    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    rng = np.random.default_rng(4)
    offsets = rng.integers(0, (1 << 20) - 70_000, 300).tolist()
    dsts = [np.zeros(n, np.uint8) for n in rng.integers(0, 70_000, 300).tolist()]
    halt, small = filling._Stop(), np.zeros(10, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_pieces(fd, list(zip(dsts, offsets, strict=True)), halt.flag, 8) == (300, -1)
        assert all(np.array_equal(d, data[o : o + d.size]) for d, o in zip(dsts, offsets, strict=True))
        ends = [np.zeros(n, np.uint8) for n in (10, 10, 40, 10)]
        assert read_pieces(fd, [(ends[0], 0), (ends[1], 100), (ends[2], (1 << 20) - 30), (ends[3], 200)],
                           None, 4) == (2, 30)
        assert np.array_equal(ends[2][:30], data[-30:]) and not ends[2][30:].any()
        halt.set()
        assert read_pieces(fd, [(small, 0), (small, 10)], halt.flag, 2) == (0, -1) and not small.any()
        for threads in (0, 65):
            with pytest.raises(ValueError, match="threads must be 1 to 64"):
                read_pieces(fd, [(small, 0)], None, threads)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as raised:
        read_pieces(fd, [(small, 0), (small, 10)], None, 2)  # a closed descriptor
    assert raised.value.errno == errno.EBADF


def test_the_files_of_one_start_share_the_fill_threads(tmp_path, monkeypatch):
    # three files in one start (a ring buffer across shards, or a load without /proc): a task each,
    # whose threads together are no more than the pool's
    _read_pieces_in_c()
    monkeypatch.setattr(filling, "PIECE", 4096)
    calls, real = [], filling._read_pieces
    monkeypatch.setattr(filling, "_read_pieces", lambda *a: calls.append((len(a[2]), a[4])) or real(*a))
    pairs, ckpts = [], []
    for k in range(3):
        wio.save({"a": np.full(40_960, k, np.uint8)}, tmp_path / f"{k}.safetensors")
        ckpts.append(wio.open(tmp_path / f"{k}.safetensors"))
        pairs.append((np.zeros(40_960, np.uint8), ckpts[-1]["a"].numpy()))
    with filling.Filler() as filler:
        filler.wait(filler.start(pairs))
    assert calls == [(10, filling._THREADS // 3)] * 3
    assert all(np.array_equal(dst, src) for dst, src in pairs)
    for ckpt in ckpts:
        ckpt.close()


def test_the_reads_shared_by_threads_say_what_the_lowest_failed_piece_says_as_one_thread_would(tmp_path):
    # The file ending in piece 0 (a long read) and piece 1 refused (EINVAL: an offset past the largest)
    # fail together: piece 0's end is said, as one thread would say it, whichever thread failed first
    # (the refusal, while piece 0 is read: it was raised); the other way round, the refusal is raised
    read_pieces = _read_pieces_in_c()
    path = tmp_path / "f"
    data = np.random.default_rng(5).integers(0, 256, 4 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    top = (1 << 63) - 1
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(20):
            long = np.zeros(4 << 20, np.uint8)
            fillers = [(np.zeros(10, np.uint8), 0) for _ in range(30)]
            ended = (0, (4 << 20) - 100)  # piece 0 got the file's last 4 MiB - 100 bytes
            assert read_pieces(fd, [(long, 100), (np.zeros(10, np.uint8), top - 5), *fillers], None, 4) == ended
            assert read_pieces(fd, [(long, 100), (np.zeros(10, np.uint8), top - 5)], None) == ended  # (one thread)
            assert np.array_equal(long[: ended[1]], data[100:]) and not long[ended[1] :].any()
            with pytest.raises(OSError) as raised:
                read_pieces(fd, [(np.zeros(10, np.uint8), top - 5), (long, 100), *fillers], None, 4)
            assert raised.value.errno == errno.EINVAL
    finally:
        os.close(fd)


def test_a_filler_left_on_an_error_stops_the_shared_reads_before_it_closes(tmp_path, monkeypatch):
    # the pieces of a filler without stretches go to one pool task whose C call shares them among
    # its own threads: an error in the caller sets the flag they look at before each piece, and the
    # filler does not close (its descriptors, then the caller's destinations freed) until they stopped
    _read_pieces_in_c()
    import threading

    monkeypatch.setattr(filling, "PIECE", 4096)
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(16 << 20, dtype=np.uint8)}, path)
    calls, real = [], filling._read_pieces
    started = threading.Event()
    monkeypatch.setattr(filling, "_read_pieces", lambda *a: calls.append(a[4]) or started.set() or real(*a))
    with wio.open(path) as ckpt:
        src = ckpt["a"].numpy()
        dst = np.zeros(src.nbytes, np.uint8)
        with pytest.raises(KeyboardInterrupt), filling.Filler() as filler:
            futures = filler.start([(dst, src)])  # 4,096 pieces, one task
            started.wait(10)
            raise KeyboardInterrupt
        assert len(futures) == 1 and futures[0].done() and calls == [filling._THREADS]
        snapshot = dst.copy()
        threading.Event().wait(0.05)
        assert np.array_equal(dst, snapshot)  # nothing written after the filler closed
        assert filler._stop.is_set()


@pytest.mark.parametrize("walk", ["c", "python"])
def test_a_source_is_found_in_its_file_whatever_its_chain_of_bases(tmp_path, monkeypatch, walk):
    """`mapped_source`: the file and offset of a view of a file's mapping, through slices, reshapes,
    dtype views and memoryviews; None for memory of anything else, or of a closed checkpoint. The
    walk in C (`_speedups.array_root`) and in Python answer alike."""
    from weightio import _io

    if walk == "c" and _io._array_root is None:
        pytest.skip("weightio._speedups is not built here: the walk is Python's")
    if walk == "python":
        monkeypatch.setattr(_io, "_array_root", None)
    path = tmp_path / "m.safetensors"
    wio.save({"a": np.arange(64, dtype=np.float32), "b": np.ones((4, 8), np.int16)}, path)
    ckpt = wio.open(path)
    a, b = ckpt["a"].numpy(), ckpt["b"].numpy()
    start = filling.mapped_source(a)[1]
    file = filling.mapped_source(a)[0]
    with open(path, "rb") as f:
        f.seek(start)
        assert file.size == os.path.getsize(path) and f.read(8) == a[:2].tobytes()
    assert filling.mapped_source(a[5:])[1] == start + 20
    assert filling.mapped_source(a.view(np.uint8)[3:])[1] == start + 3
    assert filling.mapped_source(a.reshape(8, 8)[2])[1] == start + 64
    assert filling.mapped_source(np.frombuffer(memoryview(a)[10:], np.float32))[1] == start + 40
    assert filling.mapped_source(np.lib.stride_tricks.as_strided(a[3:], (8,), (4,)))[1] == start + 12  # (a DummyArray)
    assert filling.mapped_source(np.broadcast_to(a[7:9], (5, 2)))[1] == start + 28
    assert filling.mapped_source(b)[0] is file and filling.mapped_source(b)[1] == start + 256
    for other in (np.arange(4), np.arange(8)[2:], np.frombuffer(bytearray(8), np.uint8), np.array(a)):
        assert filling.mapped_source(other) is None
    ckpt.close()
    assert filling.mapped_source(a) is None  # a closed checkpoint: copied from memory, not read


def test_the_reads_in_c_hold_their_own_list_of_the_pieces(tmp_path):
    # An offset's __index__ runs Python code in the middle of the call: a list it shrinks or
    # clears must not be read past its end (it was: a crash), the pieces read are those passed
    read_pieces = _read_pieces_in_c()
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    for change in (list.clear, lambda pieces: pieces.__delitem__(slice(1, None)),
                   lambda pieces: pieces.__setitem__(slice(None), [object()] * 3)):
        pieces: list = []

        class Offset:
            def __index__(self, change=change, pieces=pieces):
                change(pieces)
                return 3

        dsts = [np.zeros(4, np.uint8) for _ in range(40)]
        pieces += [(dsts[0], Offset())] + [(d, k) for k, d in enumerate(dsts[1:], 1)]
        fd = os.open(path, os.O_RDONLY)
        try:
            assert read_pieces(fd, pieces, None) == (40, -1)
        finally:
            os.close(fd)
        assert dsts[0].tolist() == [3, 4, 5, 6] and all(d.tolist() == list(range(k, k + 4))
                                                        for k, d in enumerate(dsts[1:], 1))


def test_a_run_of_pieces_read_together_ends_as_its_pieces_read_one_by_one_would(tmp_path):
    # Small file-contiguous pieces are read by one preadv a run: the file ending in piece 0 is what
    # is said even when a later piece of the run ends past the largest offset (alone, EINVAL), as a
    # pread a piece would say; that piece read first is refused as before
    read_pieces = _read_pieces_in_c()
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    top = (1 << 63) - 1
    fd = os.open(path, os.O_RDONLY)
    try:
        for offsets in ((top - 15, top - 5), (top - 25, top - 15, top - 5)):
            dsts = [np.zeros(10, np.uint8) for _ in offsets]
            assert read_pieces(fd, list(zip(dsts, offsets, strict=True)), None) == (0, 0)
        assert read_pieces(fd, [(np.zeros(10, np.uint8), top - 20), (np.zeros(10, np.uint8), top - 10)], None) == (0, 0)
        tail = [np.zeros(10, np.uint8) for _ in range(3)]
        assert read_pieces(fd, [(tail[0], 80), (tail[1], 90), (tail[2], 100)], None) == (2, 0)
        assert tail[0].tolist() == list(range(80, 90)) and tail[1].tolist() == list(range(90, 100))
        with pytest.raises(OSError) as raised:
            read_pieces(fd, [(np.zeros(10, np.uint8), top - 5), (np.zeros(10, np.uint8), 0)], None)
        assert raised.value.errno == errno.EINVAL
    finally:
        os.close(fd)


def test_the_reads_in_c_look_at_the_flag_before_each_piece(tmp_path):
    # The flag set between two pieces (here by the first piece's own read, into the flag) stops
    # the reads before the next: what is returned counts the pieces read
    read_pieces = _read_pieces_in_c()
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    flag, after = bytearray(1), np.zeros(4, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_pieces(fd, [(np.zeros(2, np.uint8), 0), (flag, 7), (after, 0)], flag) == (2, -1)
    finally:
        os.close(fd)
    assert flag == b"\x07" and not after.any()
    flag.append(0)  # (not left locked: every buffer is released)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE, as Linux counts descriptors")
def test_no_descriptor_left_to_read_with_is_an_input_error_that_says_what_to_do(tmp_path):
    """Every descriptor in use (``ulimit -n`` reached): one small tensor's copy (read on the caller's
    thread) and a whole load (through a filler) each raise `InputError` with EMFILE, the file named."""
    path = tmp_path / "m.safetensors"
    wio.save({"small": np.arange(100, dtype=np.float32), "big": np.ones((300, 1000), np.float32)}, path)
    script = textwrap.dedent("""
        import errno, json, os, resource, sys
        import weightio as wio
        ckpt = wio.open(sys.argv[1])
        small = ckpt["small"]
        small.to("numpy", copy=True), wio.devices.load_all(ckpt, "numpy", copy=True)  # (their imports done)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(f) for f in os.listdir("/proc/self/fd")) + 8, hard))
        held = []
        while True:  # every descriptor number left taken
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EMFILE
                break
        found = []
        for call in (lambda: small.to("numpy", copy=True), lambda: wio.devices.load_all(ckpt, "numpy", copy=True)):
            try:
                call()
                found.append(None)
            except wio.InputError as e:
                found.append([e.errno, str(e)])
        print(json.dumps(found))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    message = (f"{path}: cannot open another descriptor of the file to read it: Too many open files "
               "(raise the limit: ulimit -n)")
    assert json.loads(done.stdout) == [[errno.EMFILE, message]] * 2
