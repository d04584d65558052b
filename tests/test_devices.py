"""Devices: parsing, the numpy/torch/jax/cupy backends, the staging planner and loader, load_all.

Reference values: the fixture manifest (hashes computed by torch when the fixtures were
written), ml_dtypes conversions, and arrays built here. torch, jax and cupy tests skip when the
framework is missing; GPU tests skip without a GPU. cupy's logic runs on the CPU through a stand-in
module built on numpy (cupy mirrors numpy's API).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weightio as wio
from weightio import devices
from weightio.devices import Device, Extent, parse_device, plan_runs
from weightio.errors import CorruptFileError, MissingDependencyError, UnsupportedDTypeError, UsageError

from .conftest import FIXTURES, digest, manifest
from .memory import handovers_taken, same_file_bytes

DTYPES = FIXTURES / "dtypes.safetensors"


# ----------------------------------------------------------------------------- device strings


@pytest.mark.parametrize("text,framework,target", [
    ("numpy", "numpy", None), ("numpy:cpu", "numpy", "cpu"), ("torch", "torch", None),
    ("torch:cpu", "torch", "cpu"), ("torch:cuda", "torch", "cuda"), ("torch:cuda:3", "torch", "cuda:3"),
    ("torch:mps", "torch", "mps"), ("torch:xpu:1", "torch", "xpu:1"), ("jax", "jax", None),
    ("jax:cpu", "jax", "cpu"), ("jax:gpu:1", "jax", "gpu:1"), ("jax:tpu", "jax", "tpu"),
    ("cupy", "cupy", None), ("cupy:2", "cupy", "2"),
])
def test_parse_device(text, framework, target):
    assert parse_device(text) == Device(framework, target)
    assert str(parse_device(text)) == text


@pytest.mark.parametrize("text,message", [
    ("tpu", "unknown device 'tpu'; use one of: numpy, torch[:cpu|:cuda:N|:mps], jax[:cpu|:gpu:N], cupy[:N]"),
    ("cuda:0", "unknown device 'cuda:0'; use one of: numpy, torch[:cpu|:cuda:N|:mps], jax[:cpu|:gpu:N], "
               "cupy[:N]; did you mean 'torch:cuda:0'?"),
    ("numpy:gpu", "numpy has no device 'gpu' (in 'numpy:gpu')"),
    ("torch:cuda:x", "torch has no device 'cuda:x'"),
    ("cupy:gpu", "cupy has no device 'gpu'"),
    ("jax:gpu:-1", "jax has no device 'gpu:-1'"),
])
def test_parse_device_errors(text, message):
    with pytest.raises(UsageError) as info:
        parse_device(text)
    assert str(info.value).startswith(message)


def test_torch_device_objects_and_one_backend_per_device():
    torch = pytest.importorskip("torch")
    assert parse_device(torch.device("cuda", 1)) == Device("torch", "cuda:1")
    assert devices.backend("torch") is devices.backend("torch:cpu") is devices.backend(torch.device("cpu"))
    assert devices.backend("numpy") is devices.backend("numpy:cpu")


def _fresh_backends(monkeypatch):
    """Backends made in this test (fake or failing frameworks) are forgotten after it."""
    monkeypatch.setattr(devices, "_BACKENDS", {})
    monkeypatch.setattr(devices, "_BY_ARGUMENT", {})


def test_missing_framework_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import fails
    _fresh_backends(monkeypatch)
    with pytest.raises(MissingDependencyError,
                       match=r"cupy is not installed; install it \(pip install cupy-cuda12x, or the "
                             r"cupy build for your CUDA version\) to use cupy devices"):
        devices.place(np.zeros(1), "cupy")
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(MissingDependencyError,
                       match=r"jax is not installed; install it \(pip install 'weightio\[jax\]'\)"):
        devices.place(np.zeros(1), "jax")


def test_is_floating():
    floats = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
    assert all(devices.is_floating(np.dtype(t)) for t in floats)
    assert not any(devices.is_floating(np.dtype(t)) for t in (np.int64, np.uint8, np.bool_, np.complex64))


# ----------------------------------------------------------------------------- numpy and torch CPU


def test_numpy_place_is_the_view_and_casts_copy():
    arr = np.arange(6, dtype=np.float32)
    assert devices.place(arr, "numpy") is arr
    cast = devices.place(arr, "numpy", np.dtype(ml_dtypes.bfloat16))
    assert cast.dtype == ml_dtypes.bfloat16 and cast.astype(np.float32).tolist() == arr.tolist()


def test_torch_cpu_tensors_share_the_mapping_without_warnings():
    torch = pytest.importorskip("torch")
    with wio.open(DTYPES) as ckpt, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ckpt:
            view = ckpt[name]
            t = devices.place(view, "torch")
            assert isinstance(t, torch.Tensor) and tuple(t.shape) == view.shape
            if view.nbytes:
                assert same_file_bytes(t.data_ptr(), view.numpy())
            assert digest(devices.as_numpy(t)) == manifest()["dtypes.safetensors"][name]["sha256"]
    assert caught == []


def test_a_torch_tensor_of_a_strided_view_of_the_file_takes_writes(tmp_path):
    # as_strided / broadcast_to views of a file's read-only mapping: their torch tensors were that
    # mapping itself (numpy's stride tricks hide the chain of bases), and a write killed the process
    # (SIGSEGV); run in a child so that a regression fails this test instead of the run
    pytest.importorskip("torch")
    import subprocess

    path = tmp_path / "m.safetensors"
    wio.save({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, path)
    script = f"""
import numpy as np, weightio as wio
from weightio import devices
with wio.open({str(path)!r}) as ckpt:
    view = ckpt["w"].numpy()
    strided = devices.place(np.lib.stride_tricks.as_strided(view, (4, 8), (64, 4)), "torch")
    broadcast = devices.place(np.broadcast_to(view[0], (3, 8)), "torch")
    hidden = devices.place(np.from_dlpack(view), "torch")  # (behind a DLPack capsule: no walk finds the file)
    strided[1, 2] = -1.0
    broadcast[0, 3] = -2.0
    hidden[2, 0] = -3.0
    print(strided[:, 2].tolist(), broadcast[:, 3].tolist(), view[1, 2], view[0, 3], hidden[2, 0].item(), view[2, 0])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # each tensor's own private pages written; the file's view unchanged
    assert done.stdout.split("\n")[0] == "[2.0, -1.0, 34.0, 50.0] [-2.0, -2.0, -2.0] 10.0 3.0 -3.0 16.0"


def test_memory_made_for_one_read_is_given_to_its_tensor_as_it_is(tmp_path, monkeypatch):
    # a dequantized GGUF tensor (or a byte-swapped one, a remote fetch) is new memory of the read
    # that made it, read-only as every array handed out: the one torch tensor made from that read
    # takes it without a copy; an array the caller passes in is theirs (read-only, and it must never
    # see a tensor's writes): copied, however many tensors are made of it
    pytest.importorskip("torch")
    taken = handovers_taken(monkeypatch)
    with wio.open(FIXTURES / "gguf" / "quantized.gguf") as ckpt:
        expected = ckpt["w.q4_0"].numpy().copy()
        tensor = ckpt["w.q4_0"].to("torch")
        assert taken == [tensor.data_ptr()]  # (the decoded array itself)
        tensor.fill_(7.0)
        assert np.array_equal(ckpt["w.q4_0"].numpy(), expected)
        decoded = ckpt["w.q4_0"].numpy()  # (the caller's: handed over by the read, taken back by the load)
        both = devices.load_all({"x": decoded, "y": decoded}, "torch")
        both["x"].fill_(5.0)
        single = devices.place(decoded, "torch")
        single.fill_(6.0)
        assert len(taken) == 1 and np.array_equal(decoded, expected) and not decoded.flags.writeable
        assert np.array_equal(both["y"].numpy(), expected)
    np.save(tmp_path / "b.npy", np.arange(4, dtype=">f4"))  # (byte-swapped on read: the read's own copy)
    with wio.open(tmp_path / "b.npy") as ckpt:
        swapped = ckpt["b"].numpy()
        devices.place(swapped, "torch").fill_(1.0)
        assert not swapped.flags.writeable and swapped.tolist() == [0.0, 1.0, 2.0, 3.0]
        tensor = ckpt["b"].to("torch")
        assert len(taken) == 2 and taken[-1] == tensor.data_ptr() and tensor.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_torch_tensor_of_memory_a_reader_holds_is_a_copy(tmp_path):
    # Views of bytes a reader holds in memory (an inflated .npz member, shared by every view of it;
    # the immutable bytes a pickled numpy array was read from, one-byte ones shared by the whole
    # interpreter) are read-only: a zero-copy torch tensor over them let a write reach them
    torch = pytest.importorskip("torch")
    import weightio.torch as wt

    np.savez_compressed(tmp_path / "c.npz", weight=np.arange(4, dtype=np.float32).reshape(2, 2),
                        bias=np.zeros(2, np.float32))
    with wio.open(tmp_path / "c.npz") as ckpt:
        held = ckpt["weight"].numpy()
        devices.place(ckpt["weight"], "torch").add_(100)
        ckpt["bias"].to("torch").fill_(7)
        model = torch.nn.Linear(2, 2)
        wt.load_into(model, ckpt, assign=True)
        with torch.no_grad():
            model.weight.add_(5)
        assert held.tolist() == ckpt["weight"].numpy().tolist() == [[0.0, 1.0], [2.0, 3.0]]
        assert ckpt["bias"].numpy().tolist() == [0.0, 0.0]
        assert devices.load_all(ckpt, "numpy", copy=True)["weight"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    torch.save({"flag": np.array([5], dtype=np.uint8), "row": np.arange(3, dtype=np.int16)}, tmp_path / "p.bin")
    with wio.open(tmp_path / "p.bin") as ckpt:
        ckpt["flag"].to("torch").fill_(9)
        ckpt["row"].to("torch").fill_(-1)
        assert ckpt["flag"].numpy().tolist() == [5] and ckpt["row"].numpy().tolist() == [0, 1, 2]
    assert bytes([5]) == b"\x05" and list(b"\x05") == [5]  # (the interpreter's one-byte bytes untouched)


@pytest.mark.parametrize("make", [
    lambda: np.arange(6, dtype=">f4"),  # big-endian: converted
    lambda: np.frombuffer(b"\0" + np.arange(6, dtype=np.float32).tobytes(), np.float32, offset=1),  # misaligned
    lambda: np.arange(6, dtype=np.float32)[::-1],  # negative strides: torch has none
])
def test_torch_cpu_copies_only_what_it_cannot_wrap(make):
    torch = pytest.importorskip("torch")
    arr = make()
    t = devices.place(arr, "torch")
    assert t.tolist() == arr.astype(np.float32).tolist() and t.dtype == torch.float32


def test_each_dtype_is_given_its_torch_dtype_every_time(monkeypatch):
    # (the numpy -> torch dtypes are remembered as met: a byte order, a wider or narrower type met
    # first must not answer for another; a refusal is never remembered as an answer)
    torch = pytest.importorskip("torch")
    from weightio.devices import torch as torch_devices
    from weightio.dtypes import TABLE

    monkeypatch.setattr(torch_devices, "_DTYPES", {})
    wrapped = [row for row in TABLE if not row.packed]
    for _ in range(2):  # (the second pass answered from what the first remembered)
        for row in wrapped:
            orders = ("<", ">") if row.numpy.kind in "biufc" and row.numpy.itemsize > 1 else ("|",)
            for order in orders:
                arr = np.zeros(3, row.numpy.newbyteorder(order) if order != "|" else row.numpy)
                t = devices.place(arr, "torch")
                assert t.dtype == getattr(torch, row.torch) and tuple(t.shape) == (3,), (row.safetensors, order)
        for row in TABLE:
            if row.packed:
                with pytest.raises(UnsupportedDTypeError, match="torch has no dtype for " + row.safetensors):
                    torch_devices._torch_dtype(torch, row.numpy)
    assert len(torch_devices._DTYPES) == sum(2 if r.numpy.kind in "biufc" and r.numpy.itemsize > 1 else 1
                                             for r in wrapped)


def test_a_dtype_torch_lacks_names_the_file_and_tensor(tmp_path):
    pytest.importorskip("torch")
    np.save(tmp_path / "wide.npy", np.zeros(3, np.longdouble))
    with wio.open(tmp_path / "wide.npy") as ckpt, pytest.raises(UnsupportedDTypeError) as info:
        ckpt["wide"].to("torch")
    assert str(info.value) == (f"{tmp_path / 'wide.npy'}: tensor 'wide': dtype {np.dtype(np.longdouble).name} has no "
                               "safetensors/torch equivalent")


def test_torch_casts_match_ml_dtypes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal(4096) * 8).astype(np.float32)
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        narrow_t = devices.place(wide, "torch", np.dtype(getattr(ml_dtypes, name)))
        expected = wide.astype(getattr(ml_dtypes, name))  # round to nearest even, like torch
        assert narrow_t.dtype == getattr(torch, name)
        assert devices.as_numpy(narrow_t).view(np.uint8).tobytes() == expected.view(np.uint8).tobytes()
        for back in (np.float32, np.float16):
            up = devices.place(expected, "torch", np.dtype(back))
            np.testing.assert_array_equal(up.numpy(), expected.astype(back))


def test_adopting_torch_tensors():
    torch = pytest.importorskip("torch")
    t = torch.arange(4.0, requires_grad=True)
    out = devices.place(t, "torch")
    assert out.data_ptr() == t.data_ptr() and not out.requires_grad
    assert devices.place(t, "torch", np.dtype(np.float16)).dtype == torch.float16
    assert devices.place(t, "numpy").tolist() == [0.0, 1.0, 2.0, 3.0]


def test_load_all_casts_floating_tensors_only():
    expected = manifest()["dtypes.safetensors"]
    with wio.open(DTYPES) as ckpt:
        out = devices.load_all(ckpt, "numpy", "float16")
    assert sorted(out) == sorted(expected)
    for name, arr in out.items():
        kind = np.dtype(expected[name]["dtype"]) if expected[name]["dtype"] in np.sctypeDict else None
        if name in ("i64", "u8", "bool", "num_batches_tracked", "c64"):
            assert arr.dtype == kind, name
        elif name != "empty" and not name.startswith("u") and not name.startswith("i"):
            assert arr.dtype == np.float16, name


def test_load_all_to_torch_cpu_is_zero_copy():
    pytest.importorskip("torch")
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        out = devices.load_all(ckpt, "torch")
        for name, t in out.items():
            assert same_file_bytes(t.data_ptr(), ckpt[name].numpy())
            assert digest(t.numpy()) == manifest()["tiny-bert"][name]["sha256"]


# ----------------------------------------------------------------------------- the staging planner


def _ext(key, root, start, stop, itemsize=1):
    return Extent(key, root, start, stop, np.dtype(f"u{itemsize}"), ((stop - start) // itemsize,))


def test_plan_runs_merges_neighbours_and_splits_at_gaps_and_size():
    buf, other = np.zeros(4096, np.uint8), np.zeros(64, np.uint8)
    extents = [_ext("c", buf, 200, 300), _ext("a", buf, 0, 100), _ext("b", buf, 100, 150),
               _ext("far", buf, 1500, 1600), _ext("o", other, 0, 8), _ext("big", buf, 1600, 3600)]
    runs = plan_runs(extents, max_gap=64, max_run=1000)
    assert [(r.start, r.stop, [m.key for m in r.members]) for r in runs] == [
        (0, 300, ["a", "b", "c"]),  # gap 150..200 (50 bytes) is copied along
        (1472, 1600, ["far"]),  # gap too large: a new run, its start aligned down to 64
        (1600, 3600, ["big"]),  # would exceed max_run: its own run
        (0, 8, ["o"]),  # another buffer: another run
    ]
    assert runs[0].nbytes == 300


def test_plan_runs_keeps_overlapping_tensors_together():
    buf = np.zeros(1024, np.uint8)
    runs = plan_runs([_ext("w", buf, 0, 512), _ext("tied", buf, 0, 512), _ext("half", buf, 256, 768)],
                     max_gap=0, max_run=600)
    assert [(r.start, r.stop, len(r.members)) for r in runs] == [(0, 768, 3)]


@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 700)), min_size=1, max_size=40),
       st.integers(0, 300), st.integers(1, 2000))
@settings(max_examples=200, deadline=None)
def test_every_extent_lies_in_exactly_one_run(spans, max_gap, max_run):
    buf = np.zeros(6000, np.uint8)
    extents = [_ext(str(i), buf, a, a + n) for i, (a, n) in enumerate(spans)]
    runs = plan_runs(extents, max_gap=max_gap, max_run=max_run)
    seen = [m.key for r in runs for m in r.members]
    assert sorted(seen) == sorted(e.key for e in extents)
    for r in runs:
        assert r.start % devices.RUN_ALIGN == 0
        assert all(r.start <= m.start and m.stop <= r.stop for m in r.members)
    for a, b in zip(runs, runs[1:], strict=False):  # in address order; only the alignment slack is copied twice
        assert all(m.start >= a.stop for m in b.members) and b.start > a.stop - devices.RUN_ALIGN


def test_extent_of_finds_the_root_buffer():
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        view = ckpt["encoder.layer.0.attention.self.query.weight"]
        ext = devices.extent_of("q", view.numpy())
        assert ext.root is view.raw().base or ext.root.base is view.raw().base
        assert (ext.start, ext.stop) == (view.info.offset, view.info.offset + view.nbytes)
        t = devices.extent_of("t", view.numpy().T)  # strided: the span from first to last element
        assert t.strides == (4, 128) and (t.start, t.stop) == (view.info.offset, view.info.offset + view.nbytes)
    arr = np.arange(10, dtype=np.float32)
    assert devices.extent_of("x", arr[2:]).start == 8
    assert devices.extent_of("x", arr[::-1]) is None
    assert devices.extent_of("x", arr.astype(">f4")) is None
    assert devices.extent_of("x", np.zeros(12, np.uint8)[1:9].view(np.float32)) is None  # misaligned in its buffer
    assert devices.extent_of("x", arr[:0]) is None


# ----------------------------------------------------------------------------- the staged loader


def _staged_cpu_loader(**kwargs):
    pytest.importorskip("torch")
    from weightio.devices.torch import TorchBackend

    return devices.StagedLoader(TorchBackend(Device("torch", "cpu"), staged=True, pin=False), **kwargs)


@pytest.mark.parametrize("chunk,max_run", [(100, 300), (4096, 1 << 20), (1 << 20, 1 << 20)])
def test_staged_loader_copies_every_byte_through_the_ring(chunk, max_run):
    loader = _staged_cpu_loader(chunk=chunk, max_run=max_run)
    for fixture, key in ((DTYPES, "dtypes.safetensors"), (FIXTURES / "tiny-bert", "tiny-bert")):
        with wio.open(fixture) as ckpt:
            arrays = {n: ckpt[n].numpy() for n in ckpt}
            out = loader.load(arrays)
            assert list(out) == list(arrays)
            for name, t in out.items():
                assert digest(devices.as_numpy(t)) == manifest()[key][name]["sha256"], name
                if t.numel():
                    assert t.data_ptr() != arrays[name].__array_interface__["data"][0]  # a copy
            runs = plan_runs([e for n, a in arrays.items() for e in [devices.extent_of(n, a)] if e],
                             max_run=max_run)
            storages = {t.untyped_storage().data_ptr() for t in out.values() if t.numel()}
            assert len(storages) == len(runs)  # one device allocation per run, tensors are views
    assert loader.nslots == 4 and len(loader._slots) == min(4, loader._turn)  # grown a buffer at a time
    assert all(s.host.nbytes == chunk for s in loader._slots)
    devices.release_staging()  # backends' rings; this loader's own:
    loader.release()
    assert loader._slots == []


def test_staged_loader_converts_what_cannot_be_copied_raw():
    torch = pytest.importorskip("torch")
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    arrays = {
        "big_endian": base.astype(">f4"),
        "misaligned": np.frombuffer(b"\0" + base.tobytes(), np.float32, 24, offset=1).reshape(4, 6),
        "transposed": base.T,
        "reversed": base[::-1],
        "scalar": np.array(7, np.int64),
        "empty": np.zeros((0, 3), np.float16),
        "bf16": base.astype(ml_dtypes.bfloat16),
        "shared": base[1:3],
    }
    out = _staged_cpu_loader(chunk=64, max_run=128).load(arrays)
    for name, arr in arrays.items():
        t = out[name]
        assert tuple(t.shape) == arr.shape, name
        np.testing.assert_array_equal(devices.as_numpy(t).astype(np.float64), arr.astype(np.float64))
    assert out["transposed"].stride() == (1, 6)  # strided on the device too, not repacked
    assert out["empty"].dtype == torch.float16


def test_mps_style_direct_runs():
    pytest.importorskip("torch")
    from weightio.devices.torch import TorchBackend

    loader = devices.StagedLoader(TorchBackend(Device("torch", "cpu"), staged=False, pin=False), chunk=100)
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        out = loader.load({n: ckpt[n].numpy() for n in ckpt})
        assert all(digest(out[n].numpy()) == manifest()["tiny-bert"][n]["sha256"] for n in ckpt)
    assert loader._slots == []  # no ring without staging


def test_the_rings_buffers_filling_at_once_share_the_fill_pools_threads(tmp_path, monkeypatch):
    # each buffer's pieces are one shared read (in C): the buffers filling at once (all but one of
    # the ring's) divide the pool's threads among them, so no more threads read than the pool has
    from weightio.devices import filling

    if filling._READ_PIECES is None:
        pytest.skip("weightio._speedups is not built here: a pool task a piece")
    calls = []
    real = filling._read_pieces
    monkeypatch.setattr(filling, "_read_pieces", lambda fd, file, pieces, stop=None, threads=1, **kw: calls.append(
        (len(pieces), threads)) or real(fd, file, pieces, stop, threads, **kw))
    path = tmp_path / "m.safetensors"
    tensors = {f"w{i}": np.full((1024,), i, np.float32) for i in range(8)}  # 32 KiB: eight buffers of 4 KiB
    wio.save(tensors, path)
    loader = _staged_cpu_loader(chunk=4096, slots=3, piece=256)  # 16 pieces a buffer, 2 buffers at once
    with wio.open(path) as ckpt:
        out = loader.load({n: ckpt[n].numpy() for n in ckpt})
    assert all(np.array_equal(out[n].numpy(), tensors[n]) for n in tensors)
    # (a buffer of one piece, the run's last bytes, is read by the pool task itself)
    assert [c for c in calls if c[0] > 1] == [(16, filling._THREADS // 2)] * 8 and set(calls[8:]) == {(1, 1)}


def test_staging_reads_a_files_bytes_and_checks_the_file(tmp_path, monkeypatch):
    # Views of a file's mapping are filled into the ring by pread (`filling._read_pieces`), not through
    # the mapping; the file is checked as every owned load checks it: rewritten since the open, refused.
    from weightio.devices import filling

    reads = []
    real = filling._read_pieces
    monkeypatch.setattr(filling, "_read_pieces", lambda fd, file, pieces, stop=None, threads=1, **kw: reads.extend(
        off for _, off in pieces) or real(fd, file, pieces, stop, threads, **kw))
    path = tmp_path / "m.safetensors"
    tensors = {f"w{i}": np.full((1000,), i, np.float32) for i in range(8)}
    wio.save(tensors, path)
    loader = _staged_cpu_loader(chunk=4096, slots=3, piece=1024)
    with wio.open(path) as ckpt:
        out = loader.load({n: ckpt[n].numpy() for n in ckpt})
        assert all(np.array_equal(out[n].numpy(), tensors[n]) for n in tensors)
        assert len(reads) == 32 and len(set(reads)) == 32  # 32,000 bytes of tensors (a run), 1,024 bytes a read
        os.utime(path, ns=(1, 1))  # the file "changed"
        with pytest.raises(CorruptFileError, match="m.safetensors: was rewritten in place since it was opened"):
            loader.load({n: ckpt[n].numpy() for n in ckpt})


# ----------------------------------------------------------------------------- GPUs (skip without one)


def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch


def test_cuda_load_all_through_pinned_staging():
    torch = _cuda()
    with wio.open(DTYPES) as ckpt:
        out = devices.load_all(ckpt, "torch:cuda:0")
        for name, t in out.items():
            assert t.device.type == "cuda"
            assert digest(devices.as_numpy(t)) == manifest()["dtypes.safetensors"][name]["sha256"]
        cast = devices.load_all(ckpt, "torch:cuda", "float32")
        assert cast["bf16"].dtype == torch.float32 and cast["i64"].dtype == torch.int64
    loader = devices.backend("torch:cuda:0").loader
    assert all(s.handle.is_pinned() for s in loader._slots)


def test_cuda_single_gets_reuse_the_pinned_ring():
    _cuda()
    vb = wio.VarBuilder.from_path(FIXTURES / "tiny-bert", device="torch:cuda:0", dtype="bf16")
    names = [f"encoder.layer.{i}.attention.self.{p}.weight" for i in (0, 1) for p in ("query", "key", "value")]
    loader = devices.backend("torch:cuda:0").loader
    loader.release()
    got = [vb.get((32, 32), name) for name in names[:4]]  # the ring grows a buffer a get, up to its size
    slots = list(loader._slots)
    assert len(slots) == loader.nslots == 4 and all(s.handle.is_pinned() for s in slots)
    got += [vb.get((32, 32), name) for name in names[4:]]
    assert loader._slots == slots  # then it is reused
    assert all(str(t.dtype) == "torch.bfloat16" for t in got)
    vb.close()


def test_mps_load_all():
    torch = pytest.importorskip("torch")
    if not torch.backends.mps.is_available():
        pytest.skip("needs Apple MPS")
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        out = devices.load_all(ckpt, "torch:mps")
    assert all(t.device.type == "mps" for t in out.values())


# ----------------------------------------------------------------------------- jax
# Each jax test runs in a fresh interpreter: importing jax here would register its fork warning
# in the test process, and other tests fork.


def _run_jax(code):
    import importlib.util
    import subprocess
    import textwrap

    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    prelude = "import numpy as np, ml_dtypes, jax, weightio as wio\nfrom weightio import devices\n"
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=FIXTURES.parent, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_jax_cpu_is_zero_copy_and_casts_on_device():
    _run_jax("""
        raw = np.zeros(64 + 64, np.uint8)
        start = -raw.__array_interface__["data"][0] % 64  # XLA's CPU client aliases 64-byte-aligned memory
        arr = raw[start : start + 64].view(np.float32)
        arr[:] = np.arange(16)
        x = devices.place(arr, "jax:cpu")
        assert isinstance(x, jax.Array) and x.unsafe_buffer_pointer() == arr.__array_interface__["data"][0]
        up = devices.place(arr.astype(ml_dtypes.bfloat16), "jax", np.dtype(np.float32))
        assert up.dtype == np.float32 and np.asarray(up).tolist() == arr.tolist()
        with wio.open("fixtures/tiny-bert") as ckpt:
            out = devices.load_all(ckpt, "jax", "bfloat16")
        assert len(out) == 39 and all(v.dtype == ml_dtypes.bfloat16 for v in out.values())
        assert devices.place(x, "jax:cpu").unsafe_buffer_pointer() == x.unsafe_buffer_pointer()  # adopted as is
    """)


def test_jax_refuses_to_truncate_64_bit_integers():
    _run_jax("""
        assert not jax.config.jax_enable_x64
        small = devices.place(np.array([1, -2, 3], np.int64), "jax")
        assert small.dtype == np.int32 and np.asarray(small).tolist() == [1, -2, 3]
        try:
            devices.place(np.array([1 << 40], np.int64), "jax")
        except wio.UnsupportedDTypeError as e:
            assert "int64 values do not fit jax's 32-bit integers; enable" in str(e), e
        else:
            raise AssertionError("no error")
    """)


def test_jax_unknown_device():
    _run_jax("""
        try:
            devices.place(np.zeros(1), "jax:tpu:7")
        except wio.errors.UsageError as e:
            assert "jax has no device 'tpu:7'" in str(e), e
        else:
            raise AssertionError("no error")
    """)


# ----------------------------------------------------------------------------- cupy (a numpy stand-in)


class _FakeCupyArray(np.ndarray):
    def set(self, arr, stream=None):
        self[...] = arr


def _fake_cupy(monkeypatch):
    events = []
    cp = types.ModuleType("cupy")
    cp.ndarray = _FakeCupyArray
    cp.uint8, cp.uint32, cp.float32 = np.uint8, np.uint32, np.float32
    cp.empty = lambda shape, dtype: np.empty(shape, dtype).view(_FakeCupyArray)
    cp.asarray = lambda a: np.asarray(a).view(_FakeCupyArray)
    stream = types.SimpleNamespace(synchronize=lambda: None)
    cp.cuda = types.SimpleNamespace(
        Device=lambda index: contextlib.nullcontext(), Stream=lambda non_blocking: stream,
        Event=lambda: types.SimpleNamespace(record=lambda s: events.append("record"),
                                            synchronize=lambda: events.append("wait")))
    cp.lib = types.SimpleNamespace(stride_tricks=np.lib.stride_tricks)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype: np.empty(shape, dtype)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    _fresh_backends(monkeypatch)
    return events


def test_cupy_backend_stages_and_converts_bf16_and_fp8_on_the_gpu(monkeypatch):
    events = _fake_cupy(monkeypatch)
    with wio.open(DTYPES) as ckpt:
        f32 = devices.place(ckpt["f32"], "cupy:0")
        np.testing.assert_array_equal(np.asarray(f32), ckpt["f32"].numpy())
        for name in ("bf16", "f8_e4m3", "f8_e5m2"):
            stored = ckpt[name].numpy()
            for wanted in (np.float32, np.float16):
                got = devices.place(ckpt[name], "cupy", np.dtype(wanted))
                assert got.dtype == wanted
                np.testing.assert_array_equal(np.asarray(got), stored.astype(np.float32).astype(wanted))
            with pytest.raises(UnsupportedDTypeError, match="cupy has no .* type; pass dtype='float32'"):
                devices.place(ckpt[name], "cupy")
        with pytest.raises(UnsupportedDTypeError, match="cupy has no bfloat16 type; ask for float32"):
            devices.place(ckpt["f32"], "cupy", np.dtype(ml_dtypes.bfloat16))
        out = devices.load_all(ckpt, "cupy", "float32")
        assert out["bf16"].dtype == np.float32 and out["i64"].dtype == np.int64
    assert "record" in events and "wait" in events  # the ring waits on the event of its last copy


# ----------------------------------------------------------------------------- the ring protocol


class _LoggingEngine:
    """A staging engine whose "device" is numpy memory and which logs every ring operation,
    naming the staging buffer each one concerns (an event belongs to the buffer made before it)."""

    staged = True

    def __init__(self):
        self.log, self._last = [], None

    def active(self):
        return contextlib.nullcontext()

    def empty(self, nbytes):
        return np.zeros(nbytes, np.uint8)

    def host_buffer(self, nbytes):
        host = np.zeros(nbytes, np.uint8)
        self._last = id(host)
        return host, host

    def copy(self, dev, pos, host, n, at):
        self.log.append(("copy", id(host)))
        dev[pos : pos + n] = host[at : at + n]

    def copy_direct(self, dev, pos, src):
        raise AssertionError("a staged engine never copies directly")

    def event(self):
        log, buffer = self.log, self._last
        return types.SimpleNamespace(record=lambda: log.append(("record", buffer)),
                                     synchronize=lambda: log.append(("wait", buffer)))

    def view(self, dev, rel, ext):
        span = dev[rel : rel + ext.stop - ext.start].view(ext.dtype)
        return span.reshape(ext.shape) if ext.strides is None else np.lib.stride_tricks.as_strided(
            span, ext.shape, ext.strides)

    def empty_tensor(self, dtype, shape):
        return np.empty(shape, dtype)


def test_the_ring_waits_for_a_buffers_last_copy_before_refilling_it():
    # The order CUDA needs: wait for the event of a buffer's previous copy, fill it, start the
    # copy, record the event — for every chunk, on every buffer of the ring.
    engine = _LoggingEngine()
    loader = devices.StagedLoader(engine, chunk=1000, slots=2, max_run=5000)
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        out = loader.load({n: ckpt[n].numpy() for n in ckpt})
        for name in ckpt:
            assert digest(out[name]) == manifest()["tiny-bert"][name]["sha256"]
    state = {}
    for op, buffer in engine.log:
        expected_before = {"wait": (None, "record"), "copy": ("wait",), "record": ("copy",)}[op]
        assert state.get(buffer) in expected_before, engine.log
        state[buffer] = op
    copies = [b for op, b in engine.log if op == "copy"]
    assert len(set(copies)) == 2 and len(copies) > 2  # both buffers, reused
    assert set(state.values()) == {"record"}
    loader.release()
    assert engine.log[-2:] == [("wait", b) for b in dict.fromkeys(copies)]  # release waits for both


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_the_ring_never_waits_for_the_copy_it_has_just_sent(slots):
    # Reusing the buffer whose copy was launched last would make every chunk wait out its own copy:
    # the buffer refilled next is one sent an iteration before (with one buffer there is no other).
    engine = _LoggingEngine()
    loader = devices.StagedLoader(engine, chunk=1000, slots=slots, max_run=5000)
    with wio.open(FIXTURES / "tiny-bert") as ckpt:
        out = loader.load({n: ckpt[n].numpy() for n in ckpt})
        assert all(digest(out[n]) == manifest()["tiny-bert"][n]["sha256"] for n in ckpt)
    copies = [b for op, b in engine.log if op == "copy"]
    assert len(copies) > 2 * slots and len(set(copies)) == slots  # every buffer, reused
    last_copied = None
    waits_on_the_last = 0
    for op, buffer in engine.log:
        if op == "copy":
            last_copied = buffer
        elif op == "wait":
            waits_on_the_last += buffer == last_copied
    assert waits_on_the_last == (0 if slots > 1 else len(copies) - 1)


def test_the_ring_and_the_device_memory_are_allocated_while_the_first_fills_run(monkeypatch):
    # A fresh process pays for pinning each ring buffer and for each device allocation: the ring
    # grows a buffer at a time and each run's device memory is made once the fill before it is
    # queued, so that both overlap the pool's reads instead of preceding them all.
    from weightio.devices import filling

    class AllocLoggingEngine(_LoggingEngine):
        def empty(self, nbytes):
            self.log.append(("alloc", nbytes))
            return super().empty(nbytes)

        def host_buffer(self, nbytes):
            self.log.append(("buffer", nbytes))
            return super().host_buffer(nbytes)

    engine = AllocLoggingEngine()
    real_start = filling.Filler.start
    monkeypatch.setattr(filling.Filler, "start",
                        lambda self, pairs: engine.log.append(("fill",)) or real_start(self, pairs))
    loader = devices.StagedLoader(engine, chunk=1000, slots=3, max_run=2000)
    arrays = {f"t{i}": np.full(1000, i, np.uint8) for i in range(4)}  # separate buffers: 4 runs of one chunk
    out = loader.load(arrays)
    assert all(np.array_equal(out[k], a) for k, a in arrays.items())
    steps = [e for e in engine.log if e[0] in ("alloc", "buffer", "fill")]
    assert steps == [("buffer", 1000), ("fill",), ("alloc", 1000),
                     ("buffer", 1000), ("fill",), ("alloc", 1000),
                     ("buffer", 1000), ("fill",), ("alloc", 1000),
                     ("fill",), ("alloc", 1000)]  # the fourth chunk reuses the first buffer
    loader.release()
    assert loader._slots == []
    loader.load({"t0": arrays["t0"]})  # a released ring grows again from its first buffer
    assert len(loader._slots) == 1 and engine.log.count(("buffer", 1000)) == 4


def test_a_ring_that_fails_leaves_no_fill_writing_into_its_buffers(monkeypatch):
    import time

    from weightio.devices import filling

    class FailingEngine(_LoggingEngine):
        def copy(self, dev, pos, host, n, at):
            if len([e for e in self.log if e[0] == "copy"]) == 1:
                raise RuntimeError("device lost")
            super().copy(dev, pos, host, n, at)

    real, begun, ended = filling._copy, [], []

    def slow_copy(dst, src):
        begun.append(dst)
        time.sleep(0.02)
        real(dst, src)
        ended.append(dst)

    monkeypatch.setattr(filling, "_copy", slow_copy)
    loader = devices.StagedLoader(FailingEngine(), chunk=1000, slots=4, max_run=5000)  # three filling at once
    arrays = {f"t{i}": np.full(1000, i, np.uint8) for i in range(12)}  # memory of their own: copied, not read
    with pytest.raises(RuntimeError, match="device lost"):
        loader.load(arrays)
    assert len(ended) == len(begun) >= 3  # every fill begun (one behind the failed copy) had ended
    loader.release()


def test_a_load_that_fails_leaves_no_copy_running_into_the_memory_it_frees(monkeypatch):
    # A fill failing while the last buffers are sent: the copies sent before it may still be
    # running (cupy copies on a stream of its own) into device memory freed as the error unwinds.
    # load waits for them before it raises.
    from weightio.devices import filling

    class StreamEngine(_LoggingEngine):
        """Copies run only once an event recorded after them is waited for."""

        def __init__(self):
            super().__init__()
            self.pending, self.done = [], 0

        def copy(self, dev, pos, host, n, at):
            self.pending.append(lambda: dev.__setitem__(slice(pos, pos + n), host[at : at + n]))

        def event(self):
            mark = {}

            def wait():
                while self.done < mark.get("at", 0):
                    self.pending.pop(0)()
                    self.done += 1

            return types.SimpleNamespace(record=lambda: mark.update(at=self.done + len(self.pending)),
                                         synchronize=wait)

        def view(self, dev, rel, ext):  # (as cupy's: the stream synchronized first)
            while self.pending:
                self.pending.pop(0)()
                self.done += 1
            return super().view(dev, rel, ext)

    real = filling._copy

    def failing(dst, src):
        if src[0] == 2:
            raise OSError("read failed")
        real(dst, src)

    monkeypatch.setattr(filling, "_copy", failing)
    engine = StreamEngine()
    loader = devices.StagedLoader(engine, chunk=1000, slots=3, max_run=1000)
    with pytest.raises(OSError, match="read failed"):
        loader.load({f"t{i}": np.full(1000, i, np.uint8) for i in range(3)})  # t0, t1 sent, t2's fill fails
    assert engine.done == 2 and engine.pending == []
    monkeypatch.setattr(filling, "_copy", real)
    arrays = {f"t{i}": np.full(1000, i, np.uint8) for i in range(5)}
    out = loader.load(arrays)  # the ring is usable again
    assert all(np.array_equal(out[k], a) for k, a in arrays.items())


def test_a_torch_device_torch_does_not_have_is_a_usage_error():
    pytest.importorskip("torch")
    from weightio.devices import place

    with pytest.raises(UsageError, match="torch has no device 'foo': "):
        place(np.zeros(3), "torch:foo")


def test_load_all_opens_no_paths():
    with pytest.raises(UsageError, match=r"load_all takes a mapping of name -> tensor, got PosixPath; open it first"):
        devices.load_all(DTYPES)


def test_views_are_recognised_by_their_members():
    with wio.open(DTYPES) as ckpt:
        view = ckpt["f32"]
        assert devices.is_view(view) and not devices.is_view(view.numpy())
        assert devices.as_numpy(view) is not None and devices.place(view, "numpy").dtype == np.float32
