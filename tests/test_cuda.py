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


def _bert(tmp_path, hidden_size=32, num_hidden_layers=2, intermediate_size=37, vocab_size=100):
    """A BERT saved under `tmp_path`, and the reference transformers loads from it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                                     num_attention_heads=4, intermediate_size=intermediate_size,
                                     vocab_size=vocab_size, max_position_embeddings=64)
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


def _larger_bert(tmp_path):
    """A BERT of 13.5 MB of float32 on disk: the CUDA allocator's rounding is small beside it."""
    return _bert(tmp_path, hidden_size=256, num_hidden_layers=4, intermediate_size=1024, vocab_size=512)


def test_load_into_the_gpu_gives_every_parameter_an_allocation_of_its_own(tmp_path):
    transformers, config, reference = _larger_bert(tmp_path)
    with wio.torch.empty_weights():
        model = transformers.BertModel(config)
    assert wio.torch.load_into(model, tmp_path, device="torch:cuda:0", assign=True) == ([], [])
    params = list(model.parameters())
    assert all(p.device.type == "cuda" for p in params)
    assert all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in params)  # no shared runs
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params) == 71
    model.embeddings.word_embeddings.weight.data.add_(1)  # nothing else moves with it
    for name, value in reference.state_dict().items():
        if name != "embeddings.word_embeddings.weight":
            assert torch.equal(model.state_dict()[name].cpu(), value), name


def test_a_cast_load_into_the_gpu_holds_one_batch_of_stored_bytes_at_a_time(tmp_path, monkeypatch):
    from weightio import varbuilder

    transformers, config, reference = _larger_bert(tmp_path)
    stored = sum(p.numel() * 4 for p in reference.parameters())
    largest = max(p.numel() * 4 for p in reference.parameters())
    monkeypatch.setattr(varbuilder, "_CAST_BATCH", stored // 10)
    with wio.torch.empty_weights():
        model = transformers.BertModel(config)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    wio.torch.load_into(model, tmp_path, device="torch:cuda:0", assign=True, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    cast = stored // 2
    assert torch.cuda.memory_allocated() - before < cast + 512 * 71  # the cast model alone stays
    # the cast model, a batch of stored bytes (with one tensor over it) and the allocator's rounding
    assert peak <= cast + stored // 10 + 2 * largest + 512 * 71 < stored + cast
    for name, value in reference.state_dict().items():
        got = model.state_dict()[name]
        assert got.dtype == (torch.bfloat16 if value.is_floating_point() else value.dtype), name
        assert torch.equal(got.cpu(), value.to(got.dtype)), name


def test_a_refused_host_registration_leaves_no_cuda_error_behind(tmp_path):
    """The ring's buffers are registered with ``cudaHostRegister``; when that is refused, the
    error it leaves in the CUDA runtime is cleared (torch's next kernel launch would report it as
    its own) and the ring falls back to torch's pinned memory, loading the same bytes."""
    path = tmp_path / "m.safetensors"
    wio.save(_tensors(), path)
    code = f"""
        import mmap, numpy as np, torch, weightio as wio
        from weightio import devices
        from weightio.devices import torch as backend

        def refused():  # registering memory twice is refused with cudaErrorHostMemoryAlreadyRegistered
            memory = mmap.mmap(-1, 1 << 20)
            address = np.frombuffer(memory, np.uint8).__array_interface__["data"][0]
            cudart = torch.cuda.cudart()
            assert int(cudart.cudaHostRegister(address, 1 << 20, 0)) == 0
            assert int(cudart.cudaHostRegister(address, 1 << 20, 0)) != 0
            return memory

        torch.zeros(1, device="cuda")
        kept = [refused()]
        try:
            torch.ones(4, device="cuda").add_(1)
            torch.cuda.synchronize()
            print("uncleared: no error")
        except RuntimeError as e:
            print("uncleared:", str(e).splitlines()[0])
        kept.append(refused())
        backend._clear_cuda_error()
        assert torch.equal(torch.ones(4, device="cuda").add_(1).cpu(), torch.full((4,), 2.0))

        class Refused(backend._Registered):
            def __init__(self, torch, nbytes):
                super().__init__(torch, nbytes)
                self.ok = int(self.cudart.cudaHostRegister(self.address, nbytes, 0)) == 0  # a second time
                kept.append(self)  # registered once: its memory stays mapped, as refused()'s does

        backend._Registered = Refused
        with wio.open({str(path)!r}) as ckpt:
            out = devices.load_all(ckpt, "torch:cuda:0")
            slots = devices.backend("torch:cuda:0").loader._slots
            assert backend._REGISTER_REFUSED and slots and all(s.handle.is_pinned() for s in slots)
            assert not any(hasattr(s.handle, "_weightio_pinned") for s in slots)  # torch's own pinned memory
            assert all(np.array_equal(out[k].cpu().reshape(-1).view(torch.uint8).numpy(),
                                      ckpt[k].numpy().reshape(-1).view(np.uint8)) for k in ckpt)
        torch.ones(4, device="cuda").add_(1)
        torch.cuda.synchronize()
        print("ok")
    """
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=FIXTURES.parent, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == "ok" and lines[0].startswith("uncleared: CUDA error"), run.stdout  # the error was real


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
