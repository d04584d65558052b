"""The public API: open / load / save, and what `import weightio` costs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import weightio as wio
from weightio.errors import UsageError

from .conftest import FIXTURES


def test_import_pulls_in_no_heavy_module():
    code = ("import sys, json, weightio; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'jax', 'huggingface_hub', 'fickling', 'click', 'safetensors', 'cupy', 'tqdm'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_import_leaves_the_varbuilder_and_the_numpy_formats_until_used():
    code = ("import sys, json, weightio; first = sorted(m for m in sys.modules if m.startswith('weightio')); "
            "found = weightio.VarBuilder; print(json.dumps([first, found.__module__, 'VarBuilder' in dir(weightio), "
            "'weightio.devices' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, module, listed, devices = json.loads(out)
    assert not {"weightio.varbuilder", "weightio.devices", "weightio.names", "weightio.formats.numpy"} & set(first)
    assert (module, listed, devices) == ("weightio.varbuilder", True, True)
    assert wio.VarBuilder is __import__("weightio.varbuilder").varbuilder.VarBuilder
    code = ("import weightio; print(weightio.devices.load_all.__module__, weightio.names.__name__, "
            "weightio.formats.numpy.__name__)")  # the submodules `import weightio` used to import, reachable
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["weightio.devices", "weightio.names", "weightio.formats.numpy"]


def test_public_names():
    for name in ("open", "load", "save", "Checkpoint", "TensorView", "WeightioError", "FormatError",
                 "CorruptFileError", "UnsafePickleError", "TensorNotFoundError", "ShapeMismatchError",
                 "UnsupportedDTypeError", "dtypes"):
        assert hasattr(wio, name), name


def test_the_package_holds_only_its_public_names():
    import types

    def submodule(value: object) -> bool:
        return isinstance(value, types.ModuleType) and value.__name__.startswith("weightio.")

    leaked = [name for name, value in vars(wio).items()
              if not (name.startswith("__") and name.endswith("__")) and not submodule(value)
              and name not in wio.__all__]
    assert leaked == []
    assert all(hasattr(wio, name) for name in wio.__all__)
    for name in ("np", "os", "Mapping", "Any", "annotations", "TYPE_CHECKING", "open_checkpoint"):
        assert not hasattr(wio, name), name
    assert issubclass(wio.UsageError, (wio.WeightioError, ValueError))
    assert issubclass(wio.MissingDependencyError, (wio.WeightioError, ImportError))


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
    with pytest.raises(UsageError, match=r"cannot tell the format from suffix '.pt'"):
        wio.save({"a": np.zeros(2)}, tmp_path / "w.pt")
    with pytest.raises(UsageError, match=r"cannot write format 'hdf5'"):
        wio.save({"a": np.zeros(2)}, tmp_path / "w.h5", format="hdf5")
    with pytest.raises(UsageError, match="tensors must be a mapping of name -> array, got list"):
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


def _broadcast_checkpoint(tmp_path, length: int):
    from .pytorch_files import f32, pid, state_dict, tensor, torch_zip

    path = tmp_path / f"expanded-{length}.pt"  # torch.save({"x": torch.full((1,), 2.5).expand(length)})
    path.write_bytes(torch_zip(state_dict({"x": tensor(pid("FloatStorage", "0", 1), 0, (length,), (0,))}),
                               {"0": f32(2.5)}))
    return path


def test_a_broadcast_view_reads_zero_copy_and_writes_out_when_modest(tmp_path):
    with wio.open(_broadcast_checkpoint(tmp_path, 1000)) as ckpt:
        x = ckpt["x"].numpy()
        assert x.shape == (1000,) and x.strides == (0,) and set(x.tolist()) == {2.5}
        wio.save({"x": ckpt["x"]}, tmp_path / "x.safetensors")
    assert wio.load(tmp_path / "x.safetensors")["x"].tolist() == [2.5] * 1000


def test_a_huge_broadcast_view_is_refused_before_anything_is_allocated(tmp_path):
    # fuzz finding: a 1.5 kB torch file with torch.zeros(1).expand(2**40) made writers allocate 4 TiB
    path = _broadcast_checkpoint(tmp_path, 2**40)
    with wio.open(path) as ckpt:
        assert ckpt["x"].numpy().strides == (0,)  # reading it is still a zero-copy view
        with pytest.raises(wio.FormatError, match=r"tensor 'x': is a broadcast view \(strides \(0,\)\) of "
                                                  r"4,398,046,511,104 bytes over 4 stored bytes"):
            wio.save({"x": ckpt["x"]}, tmp_path / "x.safetensors")
    from weightio.convert import convert

    with pytest.raises(wio.FormatError, match="is a broadcast view"):
        convert(path, tmp_path / "y.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
