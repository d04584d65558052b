"""TensorView: header facts without reading, zero-copy numpy(), slicing, conversions."""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest

import weightio as wio
from weightio.errors import UsageError

from .conftest import FIXTURES, manifest
from .memory import mapping_at


def test_header_facts_need_no_data():
    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        v = ckpt["i32"]
        assert (v.shape, v.dtype, v.nbytes, v.ndim, v.size, len(v), v.ggml_type) == (
            (2, 2, 3), np.dtype(np.int32), 48, 3, 12, 2, None)
        assert repr(v) == "TensorView('i32', shape=(2, 2, 3), dtype=int32)"
        assert v.path == str(FIXTURES / "dtypes.safetensors")
        with pytest.raises(TypeError, match="0-d"):
            len(ckpt["scalar"])


def test_indexing_forms():
    with wio.open(FIXTURES / "numpy.safetensors") as ckpt:
        v, full = ckpt["weight"], np.arange(20, dtype=np.float32).reshape(4, 5)
        for key in (1, slice(1, 3), (slice(None), slice(1, 4)), (Ellipsis, 2), (slice(None, None, 2),), (-1, -1)):
            np.testing.assert_array_equal(v[key], full[key])
        assert v[2, 3] == 13.0
        assert v[1:3].flags.writeable is False
    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        assert ckpt["scalar"][()] == 3.5


def test_array_protocol_and_casts():
    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        v = ckpt["bf16"]
        assert np.asarray(v).dtype == np.dtype(ml_dtypes.bfloat16)
        as_f32 = np.asarray(v, dtype=np.float32)
        assert as_f32.dtype == np.float32 and as_f32[0, 0] == -3.0
        assert v.to("numpy", dtype="float32").dtype == np.float32
        assert v.to("numpy") is not None and v.to().dtype == np.dtype(ml_dtypes.bfloat16)
        assert v.to(dtype="f16").dtype == np.float16
        with pytest.raises(UsageError, match="unknown device 'tpu'"):
            v.to("tpu")


def test_torch_cpu_shares_memory_when_torch_is_installed():
    """No copy: a zero-copy torch tensor lies in a private (copy-on-write) mapping of the file itself,
    at the same offset as the read-only numpy view in the shared read-only mapping."""
    torch = pytest.importorskip("torch")
    path = str(FIXTURES / "dtypes.safetensors")
    with wio.open(path) as ckpt:
        mapping = ckpt.readers[0].file
        base = mapping.data.__array_interface__["data"][0]
        for name in ("f32", "bf16", "f8_e4m3", "i64", "bool"):
            v = ckpt[name]
            t = v.to("torch")
            assert str(t.dtype) == "torch." + {"f32": "float32", "bf16": "bfloat16", "f8_e4m3": "float8_e4m3fn",
                                               "i64": "int64", "bool": "bool"}[name]
            assert tuple(t.shape) == v.shape and t.view(torch.uint8).numpy().tobytes() == v.raw().tobytes()
            offset = v.numpy().__array_interface__["data"][0] - base
            if sys.platform == "linux":  # the same bytes of the file, mapped twice: no copy
                assert mapping_at(base + offset) == ("r--s", os.path.realpath(path), offset)  # numpy: read-only
                assert mapping_at(t.data_ptr()) == ("rw-p", os.path.realpath(path), offset)  # torch: private
        assert ckpt["bf16"].to("torch", dtype="float32").dtype == torch.float32


def test_an_in_place_write_through_a_torch_tensor_never_reaches_the_file(tmp_path):
    """torch cannot refuse writes to a zero-copy tensor; its private copy-on-write pages keep them from
    the file, from numpy views and from later opens."""
    pytest.importorskip("torch")
    path = tmp_path / "w.safetensors"
    wio.save({"w": np.arange(4, dtype=np.float32), "v": np.arange(4, dtype=np.float32)}, path)
    before = path.read_bytes()
    with wio.open(path) as ckpt:
        t = ckpt["w"].to("torch")
        t.add_(10)  # would be SIGSEGV on the read-only mapping
        assert t.tolist() == [10, 11, 12, 13]
        assert ckpt["v"].to("torch").tolist() == [0, 1, 2, 3]  # a neighbour in the same page is untouched
        with pytest.raises(ValueError, match="read-only"):
            ckpt["w"].numpy()[0] = 1  # numpy still refuses
        forced = ckpt["w"].numpy()
        with pytest.raises(ValueError, match="WRITEABLE"):
            forced.flags.writeable = True  # the memory itself is read-only: no override
        assert ckpt["w"].numpy().tolist() == [0, 1, 2, 3]  # numpy views read the file's bytes
        with wio.open(path) as again:
            assert again["w"].to("torch").tolist() == [0, 1, 2, 3]  # a later open too
    assert path.read_bytes() == before
    assert wio.load(path)["w"].tolist() == [0, 1, 2, 3]


def test_writable_twins_are_private_windows_and_survive_page_release(tmp_path):
    """`writable_twin`: the same elements in private copy-on-write memory; releasing pages (what convert
    and stats do on the read-only mapping) never discards a write made there; arrays that are not
    views of a file get None; a view whose checkpoint was closed gets a copy."""
    from weightio._io import drop_array_pages, writable_twin

    path = tmp_path / "w.safetensors"
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    wio.save({"w": values}, path)
    with wio.open(path) as ckpt:
        view = ckpt["w"].numpy()[::2, 1::2]  # strided: same strides in the twin
        twin = writable_twin(view)
        assert twin.flags.writeable and twin.strides == view.strides and np.array_equal(twin, view)
        twin[0, 0] = -1
        drop_array_pages(twin)
        drop_array_pages(view)
        assert twin[0, 0] == -1 and view[0, 0] == 1
        assert writable_twin(ckpt["w"].numpy()[:0]).shape == (0, 6)
        kept = ckpt["w"].numpy()
    assert writable_twin(values) is None and writable_twin(np.arange(3)[::-1]) is None
    closed = writable_twin(kept)  # the checkpoint is closed: its descriptor too
    assert closed.flags.writeable and closed.base is None and np.array_equal(closed, values)


def test_the_short_path_gives_the_general_paths_array_for_every_fixture_tensor():
    """`stored_array` (numpy() and VarBuilder.get's short path) against the general path it skips,
    for every tensor of every fixture: the same memory (address, dtype, shape, strides), read-only;
    or None, for the tensors the general path converts, dequantizes or refuses."""
    from weightio.view import _finish, stored_array

    taken, passed = {}, 0
    for entry in manifest():
        with wio.open(FIXTURES / entry) as ckpt:
            for name in ckpt:
                view = ckpt[name]
                try:
                    general = None if view.info.ggml_type else _finish(view._stored())
                except wio.WeightioError as e:  # refused: the same refusal, or None (the general path refuses)
                    try:
                        assert stored_array(view._reader, name, view.info) is None
                    except wio.WeightioError as again:
                        assert type(again) is type(e)
                    passed += 1
                    continue
                short = stored_array(view._reader, name, view.info)
                if short is None:
                    passed += 1
                    continue
                assert general is not None, (entry, name)
                assert (short.dtype, short.shape, short.strides) == (general.dtype, general.shape, general.strides)
                if short.size:  # (an empty slice's address is numpy's choice)
                    assert short.__array_interface__["data"][0] == general.__array_interface__["data"][0], (entry, name)
                assert not short.flags.writeable and short.tobytes() == general.tobytes()
                taken[ckpt.format] = taken.get(ckpt.format, 0) + 1
    assert set(taken) == {"safetensors", "pytorch", "npy", "npz", "gguf", "ggml"}, taken
    assert passed > 20  # big-endian numbers, quantized blocks, strided torch views, packed fp4


def test_the_short_path_views_aligned_tensors_through_one_cached_view_per_dtype_dropped_on_close():
    from weightio.view import _finish

    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        file = ckpt._only.file
        first = ckpt["i32"].numpy()
        typed = file._elements[np.dtype("<i4")]
        assert ckpt["i32"].numpy() is not first and file._elements[np.dtype("<i4")] is typed
        assert np.shares_memory(first, typed) and np.shares_memory(first, file.data)
        general = _finish(ckpt["i32"]._stored())
        assert first.tobytes() == general.tobytes() and first.shape == general.shape == (2, 2, 3)
        assert len(file._elements) == 1
    assert file._elements == {}  # each view of the mapping kept it mapped: close forgets them


def test_a_close_racing_the_short_path_leaves_no_view_of_the_mapping_cached():
    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        file = ckpt._only.file
        data = file.data

        class ClosingMeanwhile(dict):
            def get(self, key, default=None):
                file.close()  # between the check that `data` is the mapping and the caching
                return super().get(key, default)

        file._elements = ClosingMeanwhile()
        file._fast = (*file._fast[:3], file._elements)  # (the same dict object, as `MappedFile` keeps them)
        assert file.elements(data, np.dtype("<f4")) is not None  # (the caller's view, of bytes it had)
        assert file.closed and dict(file._elements) == {}


def test_listed_views_are_what_the_constructor_makes():
    # `Checkpoint.items()` makes its views without calling `__init__` (`TensorView._each`): they
    # must hold what a constructed view holds, slot for slot, and behave the same
    from weightio.view import TensorView

    with wio.open(FIXTURES / "tiny-bert-sharded") as ckpt:
        listed = list(ckpt.items())
        assert [n for n, _ in listed] == list(ckpt)
        for name, view in listed:
            made = TensorView(view._reader, name, view.info)
            assert all(getattr(view, slot) is getattr(made, slot) for slot in TensorView.__slots__)
            assert view.name == name and view.info is ckpt._infos[name]
            assert view.shape == made.shape == view.info.shape and view.dtype == made.dtype
            assert repr(view) == repr(made)
            np.testing.assert_array_equal(view.numpy(), ckpt[name].numpy())
        assert len({view.path for _, view in listed}) == len(ckpt.readers) > 1  # (each view its own file's)
