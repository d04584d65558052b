"""CUDA GPUs: bulk loads through the pinned staging ring, `load_into` a model on the GPU (meta
models, ties, dtypes, device maps split between a GPU and the CPU), cupy and JAX on the GPU.

Every test skips without a CUDA GPU (CI has none: they run on a GPU machine, see
docs/benchmarks.md "GPU"). The staging logic itself is tested on the CPU in test_devices.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import weightio as wio  # noqa: E402
from weightio import devices  # noqa: E402
from weightio.errors import CorruptFileError  # noqa: E402

from .conftest import FIXTURES  # noqa: E402


def _tensors() -> dict[str, np.ndarray]:
    """~70 MB of odd-sized tensors of several dtypes: many ring buffers, several runs."""
    rng = np.random.default_rng(7)
    out: dict[str, np.ndarray] = {}
    for i in range(12):
        out[f"layers.{i}.w"] = rng.standard_normal((1024 + i, 1027), dtype=np.float32)
        out[f"layers.{i}.b"] = rng.standard_normal(1024 + i).astype(ml_dtypes.bfloat16)
        out[f"layers.{i}.ids"] = rng.integers(-(2**40), 2**40, 333 + i, dtype=np.int64)
    out["scalar"] = np.array(3.5, np.float16)
    return out


def _same(gpu, arr: np.ndarray) -> bool:
    host = gpu.detach().cpu()
    return tuple(host.shape) == arr.shape and np.array_equal(devices.as_numpy(host).reshape(-1).view(np.uint8),
                                                             np.ascontiguousarray(arr).reshape(-1).view(np.uint8))


def test_bulk_load_is_byte_exact_across_buffers_runs_and_dtypes(tmp_path):
    tensors = _tensors()
    wio.save(tensors, tmp_path / "m.safetensors")
    with wio.open(tmp_path / "m.safetensors") as ckpt:
        out = devices.load_all(ckpt, "torch:cuda:0")
        assert all(out[k].device.type == "cuda" and _same(out[k], tensors[k]) for k in tensors)
        engine = devices.backend("torch:cuda:0")
        small = devices.StagedLoader(engine, chunk=1 << 20, slots=3, max_run=8 << 20, piece=256 << 10)
        out = small.load({k: ckpt[k].numpy() for k in ckpt})
        assert all(_same(out[k], tensors[k]) for k in tensors)
        assert all(s.handle.is_pinned() for s in small._slots) and len(small._slots) == 3
        cast = devices.load_all(ckpt, "torch:cuda:0", "bf16")
        assert cast["layers.0.w"].dtype == torch.bfloat16 and cast["layers.0.ids"].dtype == torch.int64
        assert torch.equal(cast["layers.3.w"].cpu(), torch.from_numpy(tensors["layers.3.w"]).to(torch.bfloat16))
        small.release()


def test_a_file_rewritten_after_the_open_is_refused_on_the_way_to_the_gpu(tmp_path):
    path = tmp_path / "m.safetensors"
    wio.save({"w": np.ones((4096, 1024), np.float32)}, path)
    with wio.open(path) as ckpt:
        import os

        os.utime(path, ns=(1, 1))
        with pytest.raises(CorruptFileError, match="was rewritten in place since it was opened"):
            devices.load_all(ckpt, "torch:cuda:0")


def _bert(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, vocab_size=100, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path)
    return transformers, config, transformers.BertModel.from_pretrained(tmp_path).eval()


def test_load_into_a_meta_model_on_the_gpu(tmp_path):
    transformers, config, reference = _bert(tmp_path)
    with wio.torch.empty_weights():  # parameters on meta; buffers (position ids) real
        model = transformers.BertModel(config)
    result = wio.torch.load_into(model, tmp_path, device="torch:cuda:0", assign=True)
    assert result == ([], [])
    state = model.state_dict()
    for name, value in reference.state_dict().items():
        assert torch.equal(state[name].cpu(), value), name
    assert all(p.device.type == "cuda" for p in model.parameters())
    ids = torch.tensor([[3, 7, 31, 64, 5]])
    with torch.no_grad():
        got = model.cuda().eval()(ids.cuda()).last_hidden_state.cpu()
        want = reference(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_load_into_a_gpu_model_in_bf16_and_with_a_device_map(tmp_path):
    transformers, config, reference = _bert(tmp_path)
    model = transformers.BertModel(config).cuda()
    wio.torch.load_into(model, tmp_path, device="torch:cuda:0", dtype="bf16")
    assert model.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    assert torch.equal(model.embeddings.word_embeddings.weight.cpu(),
                       reference.embeddings.word_embeddings.weight.to(torch.bfloat16))
    with wio.torch.empty_weights():
        split = transformers.BertModel(config)
    result = wio.torch.load_into(split, tmp_path, device_map={"embeddings": "cuda:0", "encoder": "cpu",
                                                              "pooler": "cuda:0"})
    assert split.embeddings.word_embeddings.weight.device.type == "cuda"
    assert split.encoder.layer[0].attention.self.query.weight.device.type == "cpu"
    assert result.device_map["pooler"] == "cuda:0"
    for name, value in reference.state_dict().items():
        assert torch.equal(split.state_dict()[name].cpu(), value), name


def test_device_map_auto_fills_the_gpu_budget_first(tmp_path):
    transformers, config, reference = _bert(tmp_path)
    with wio.torch.empty_weights():
        model = transformers.BertModel(config)
    embeddings = sum(p.numel() * 4 for p in reference.embeddings.parameters())
    result = wio.torch.load_into(model, tmp_path, device_map="auto",
                                 max_memory={0: embeddings + 1000, "cpu": "1GiB"})
    assert model.embeddings.word_embeddings.weight.device.type == "cuda"
    assert model.pooler.dense.weight.device.type == "cpu" and "cpu" in result.device_map.values()
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name].cpu(), value), name


def test_cupy_load_all_is_exact_and_converts_bf16_on_the_gpu(tmp_path):
    cupy = pytest.importorskip("cupy")
    from weightio.errors import UnsupportedDTypeError

    tensors = _tensors()
    wio.save(tensors, tmp_path / "m.safetensors")
    with wio.open(tmp_path / "m.safetensors") as ckpt:
        with pytest.raises(UnsupportedDTypeError, match="cupy has no bfloat16 type; pass dtype='float32'"):
            devices.load_all(ckpt, "cupy:0")
        out = devices.load_all(ckpt, "cupy:0", dtype="float32")
    for k, arr in tensors.items():
        want = arr.astype(np.float32) if arr.dtype.kind == "f" or arr.dtype == ml_dtypes.bfloat16 else arr
        assert isinstance(out[k], cupy.ndarray) and out[k].dtype == want.dtype, k
        assert np.array_equal(cupy.asnumpy(out[k]), want), k


def test_jax_gpu_load_all_is_byte_exact(tmp_path):
    pytest.importorskip("jax")
    wio.save({"w": np.arange(4096, dtype=np.float32).reshape(64, 64)}, tmp_path / "m.safetensors")
    code = f"""
        import numpy as np, jax, weightio as wio
        from weightio import devices
        with wio.open({str(tmp_path / "m.safetensors")!r}) as ckpt:
            out = devices.load_all(ckpt, "jax:gpu")
        w = out["w"]
        assert w.devices().pop().platform == "gpu", w.devices()
        assert np.array_equal(np.asarray(w), np.arange(4096, dtype=np.float32).reshape(64, 64))
        print("ok")
    """
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=FIXTURES.parent, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
