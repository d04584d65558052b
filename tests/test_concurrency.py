"""Concurrent readers and closing under live views.

8 threads (sharing one checkpoint, or each opening its own) and 4 processes read every tensor of
the same file at once and get the bytes a single reader gets, for every format. Closing a
checkpoint never unmaps memory a live array still points at: arrays handed out stay valid after
close and garbage collection, the mapping goes away with the last of them, and anything read
through the closed checkpoint raises a clear error, including from another thread mid-read.
"""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import weightio as wio
from weightio.errors import WeightioError
from weightio.formats.gguf import GGUFArray

from .conftest import FIXTURES

# One real file (or model directory) per format and container flavour.
SOURCES = ["numpy.safetensors", "dtypes.safetensors", "tiny-bert-sharded", "numpy/fortran.npy",
           "numpy/big_endian.npy", "numpy/arrays.npz", "numpy/compressed_big.npz", "pytorch/resnet18_like.pth",
           "pytorch/protocol2_legacy.pt", "pytorch/legacy_tar.pt", "pytorch/nested.pt", "gguf/all_types.gguf",
           "gguf/quantized.gguf", "gguf/big_endian.gguf", "ggml/ggjt_v3.bin"]
THREADS, PROCESSES, ROUNDS = 8, 4, 3


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)).hexdigest()


def _readable(ckpt: wio.Checkpoint) -> list[str]:
    """Names whose data can be read (PyTorch meta tensors and packed types have no numpy())."""
    names = []
    for name in ckpt:
        try:
            ckpt[name].numpy()
        except WeightioError:
            continue
        names.append(name)
    return names


def _digests(ckpt: wio.Checkpoint, names: list[str], order_seed: int | None = None) -> dict[str, str]:
    order = list(names)
    if order_seed is not None:
        random.Random(order_seed).shuffle(order)
    return {name: _digest(ckpt[name].numpy()) for name in order}


def _reference(source: str) -> tuple[list[str], dict[str, str]]:
    with wio.open(FIXTURES / source) as ckpt:
        names = _readable(ckpt)
        return names, _digests(ckpt, names)


def _in_threads(read) -> list:
    """``read(k)`` in THREADS threads started together; what they returned, after any exception is raised."""
    barrier, results, errors = threading.Barrier(THREADS), [], []

    def run(k: int) -> None:
        try:
            barrier.wait()
            results.append(read(k))
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("source", SOURCES)
def test_eight_threads_sharing_one_checkpoint_read_identical_bytes(source):
    names, expected = _reference(source)
    assert names
    with wio.open(FIXTURES / source) as ckpt:
        results = _in_threads(lambda k: [_digests(ckpt, names, order_seed=k * 100 + r) for r in range(ROUNDS)])
    assert results == [[expected] * ROUNDS] * THREADS


@pytest.mark.parametrize("source", SOURCES)
def test_eight_threads_each_opening_the_file_read_identical_bytes(source):
    names, expected = _reference(source)

    def read(k: int) -> dict[str, str]:
        with wio.open(FIXTURES / source) as ckpt:
            return _digests(ckpt, names, order_seed=k)

    assert _in_threads(read) == [expected] * THREADS


def _process_reader(source: str, names: list[str], seed: int, barrier) -> dict[str, str]:
    barrier.wait()
    with wio.open(FIXTURES / source) as ckpt:
        return _digests(ckpt, names, order_seed=seed)


def test_four_processes_read_identical_bytes_from_every_format():
    context = multiprocessing.get_context("fork")
    references = {source: _reference(source) for source in SOURCES}
    with context.Manager() as manager:
        barrier = manager.Barrier(PROCESSES)
        with context.Pool(PROCESSES) as pool:
            for source, (names, expected) in references.items():
                jobs = [pool.apply_async(_process_reader, (source, names, seed, barrier)) for seed in range(PROCESSES)]
                assert [job.get(timeout=60) for job in jobs] == [expected] * PROCESSES, source


# ----------------------------------------------------------------------------- closing under live views


def _mapped(path: Path) -> bool:
    """Whether this process maps `path` (Linux: /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip("\n").endswith(str(path.resolve())) for line in maps)


@pytest.mark.parametrize("source", ["numpy.safetensors", "numpy/fortran.npy", "numpy/arrays.npz",
                                    "numpy/compressed.npz", "pytorch/resnet18_like.pth", "gguf/all_types.gguf",
                                    "gguf/quantized.gguf", "ggml/ggjt_v3.bin"])
def test_arrays_outlive_close_and_gc_and_the_mapping_goes_with_the_last(tmp_path, source):
    path = tmp_path / Path(source).name
    path.write_bytes((FIXTURES / source).read_bytes())
    ckpt = wio.open(path)
    names = _readable(ckpt)
    arrays = {name: ckpt[name].numpy() for name in names}
    copies = {name: arr.copy() for name, arr in arrays.items()}
    views = {name: ckpt[name] for name in names}
    ckpt.close()
    ckpt.close()  # twice is fine
    gc.collect()
    same = [n for n, a in arrays.items() if np.array_equal(a, copies[n], equal_nan=a.dtype.kind in "fc")]
    assert same == names  # still valid, still the same bytes (no loop variable keeps an array alive)
    zero_copy = any(_base_is_mapping(arr) for arr in arrays.values())
    assert _mapped(path) == zero_copy  # alive exactly as long as an array needs it
    for view in views.values():
        with pytest.raises(WeightioError, match="the checkpoint was closed; open it again"):
            view.numpy()
        with pytest.raises(WeightioError, match="closed"):
            view[:1] if view.shape else view.raw()
    del arrays, views
    gc.collect()
    assert not _mapped(path)


def _base_is_mapping(arr: np.ndarray) -> bool:
    import mmap

    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


def test_lazy_metadata_arrays_after_close():
    ckpt = wio.open(FIXTURES / "gguf" / "metadata.gguf")
    file = ckpt.readers[0].file  # (short arrays of arrays read a copy, not the file: usable after close)
    lazy = [v for v in ckpt.metadata.values() if isinstance(v, GGUFArray) and v._items is None and v._file is file]
    assert lazy
    ckpt.close()
    for value in lazy:
        with pytest.raises(WeightioError, match="the checkpoint was closed"):
            value.tolist()


CLOSE_WHILE_READING = textwrap.dedent("""
    import sys, threading, time, numpy as np, weightio as wio
    from weightio.errors import WeightioError
    path, rounds, reads_before_close = sys.argv[1], int(sys.argv[2]), 20
    outcomes = {"read": 0, "closed": 0}
    lock = threading.Lock()
    for r in range(rounds):
        ckpt = wio.open(path)
        names = list(ckpt)
        expected = {n: ckpt[n].numpy().copy() for n in names}
        start = threading.Barrier(9)

        def reader():
            start.wait()
            for _ in range(20):
                for n in names:
                    try:
                        arr = ckpt[n].numpy()
                    except WeightioError as e:
                        assert "closed" in str(e), e
                        with lock:
                            outcomes["closed"] += 1
                        continue
                    assert np.array_equal(arr, expected[n]), n
                    with lock:
                        outcomes["read"] += 1

        threads = [threading.Thread(target=reader) for _ in range(8)]
        for t in threads:
            t.start()
        start.wait()
        while outcomes["read"] < reads_before_close * (r + 1) and any(t.is_alive() for t in threads):
            time.sleep(0.0005)
        ckpt.close()  # while eight threads read
        for t in threads:
            t.join()
    print(outcomes["read"] > 0, outcomes["closed"] > 0)
""")


@pytest.mark.parametrize("source", ["tiny-bert/model.safetensors", "numpy/compressed.npz", "gguf/quantized.gguf",
                                    "pytorch/resnet18_like.pth"])
def test_closing_while_other_threads_read_never_crashes(source):
    """In a subprocess, so that a segfault would fail this test instead of killing the test run."""
    proc = subprocess.run([sys.executable, "-c", CLOSE_WHILE_READING, str(FIXTURES / source), "10"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True"]  # both outcomes happened: reads, then clear refusals
