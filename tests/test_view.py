"""TensorView: header facts without reading, zero-copy numpy(), slicing, conversions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import weightio as wio
from weightio.errors import UsageError

from .conftest import FIXTURES


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
    torch = pytest.importorskip("torch")
    with wio.open(FIXTURES / "dtypes.safetensors") as ckpt:
        for name in ("f32", "bf16", "f8_e4m3", "i64", "bool"):
            v = ckpt[name]
            t = v.to("torch")
            assert str(t.dtype) == "torch." + {"f32": "float32", "bf16": "bfloat16", "f8_e4m3": "float8_e4m3fn",
                                               "i64": "int64", "bool": "bool"}[name]
            assert t.data_ptr() == v.numpy().__array_interface__["data"][0]  # no copy
            assert tuple(t.shape) == v.shape
        assert ckpt["bf16"].to("torch", dtype="float32").dtype == torch.float32


def test_an_in_place_write_through_a_torch_tensor_never_reaches_the_file(tmp_path):
    """torch cannot refuse writes to a zero-copy tensor; the private mapping keeps them from the file."""
    pytest.importorskip("torch")
    path = tmp_path / "w.safetensors"
    wio.save({"w": np.arange(4, dtype=np.float32)}, path)
    before = path.read_bytes()
    with wio.open(path) as ckpt:
        t = ckpt["w"].to("torch")
        t.add_(10)  # would be SIGSEGV on a read-only shared mapping
        assert t.tolist() == [10, 11, 12, 13]
        with pytest.raises(ValueError, match="read-only"):
            ckpt["w"].numpy()[0] = 1  # numpy still refuses
        forced = ckpt["w"].numpy()
        forced.flags.writeable = True  # a deliberate override is possible, and also stays private
        forced[0] = -1
        assert ckpt["w"].numpy()[0] == -1  # every view in this process shares the private pages
    assert path.read_bytes() == before
    assert wio.load(path)["w"].tolist() == [0, 1, 2, 3]
