"""The public API: open / load / save, and what `import weightio` costs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import weightio as wio

from .conftest import FIXTURES


def test_import_pulls_in_no_heavy_module():
    code = ("import sys, json, weightio; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'jax', 'huggingface_hub', 'fickling', 'click', 'safetensors', 'cupy', 'tqdm'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_public_names():
    for name in ("open", "load", "save", "Checkpoint", "TensorView", "WeightioError", "FormatError",
                 "CorruptFileError", "UnsafePickleError", "TensorNotFoundError", "ShapeMismatchError",
                 "UnsupportedDTypeError", "dtypes"):
        assert hasattr(wio, name), name


def test_load_returns_read_only_views_in_file_order():
    arrays = wio.load(FIXTURES / "tiny-bert")
    assert list(arrays)[0] == "embeddings.LayerNorm.bias"  # safetensors file order (dtype, then name)
    assert all(isinstance(a, np.ndarray) and not a.flags.writeable for a in arrays.values())


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_save_then_load_round_trips(tmp_path, suffix):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(5, dtype=np.int64)}
    path = tmp_path / f"out{suffix}"
    wio.save(tensors, path)
    back = wio.load(path)
    assert back.keys() == tensors.keys()
    for name, arr in tensors.items():
        assert back[name].dtype == arr.dtype and back[name].tolist() == arr.tolist()


def test_save_format_argument_and_unknown_suffix(tmp_path):
    wio.save({"a": np.zeros(2)}, tmp_path / "weights.bin", format="safetensors")
    assert wio.open(tmp_path / "weights.bin").format == "safetensors"
    with pytest.raises(wio.FormatError, match=r"cannot tell the format from suffix '.pt'"):
        wio.save({"a": np.zeros(2)}, tmp_path / "w.pt")
    with pytest.raises(wio.FormatError, match=r"cannot write format 'hdf5'"):
        wio.save({"a": np.zeros(2)}, tmp_path / "w.h5", format="hdf5")
    with pytest.raises(wio.FormatError, match="tensors must be a mapping of name -> array, got list"):
        wio.save([np.zeros(2)], tmp_path / "w.safetensors")


def test_save_accepts_torch_tensors_when_torch_is_installed(tmp_path):
    torch = pytest.importorskip("torch")
    tensors = {"bf16": torch.arange(4, dtype=torch.bfloat16), "scalar": torch.tensor(2.5),
               "t": torch.arange(6.0).reshape(2, 3).t()}  # non-contiguous
    wio.save(tensors, tmp_path / "t.safetensors")
    from safetensors.torch import load_file

    back = load_file(tmp_path / "t.safetensors")
    for name, tensor in tensors.items():
        assert torch.equal(back[name], tensor)


def test_save_passes_format_options_to_the_writer(tmp_path):
    weights = {"w": np.arange(64, dtype=np.float32).reshape(2, 32) / 8, "norm": np.ones(32, dtype=np.float32)}
    wio.save(weights, tmp_path / "q.gguf", types="Q8_0")
    with wio.open(tmp_path / "q.gguf") as ckpt:
        assert ckpt["w"].ggml_type == "Q8_0" and ckpt["norm"].ggml_type is None  # vectors keep F32
        # Q8_0 rounds each value to a multiple of its 32-block's scale max|x| / 127
        np.testing.assert_allclose(ckpt["w"].numpy(), weights["w"], atol=7.875 / 127 / 2)
    with pytest.raises(TypeError, match="types"):
        wio.save(weights, tmp_path / "x.safetensors", types="Q8_0")
