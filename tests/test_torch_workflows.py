"""`weightio.torch.load_into` in the workflows of ``from_pretrained`` and accelerate (issue 15): real
models with tiny configs, compared against transformers' own loading (weights, logits, key reports).

One test per bullet: ties under meta and under accelerate's ``init_empty_weights``; meta leftovers
and `empty_weights`; a new head (``ignore_mismatched_sizes``); hub-era stale keys; training
checkpoints' nesting (ImageNet example, Lightning), read without ``torch.load``; ``dtype="auto"``;
device maps with CPU/disk budgets; the printed report.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import weightio as wio  # noqa: E402
from weightio.errors import ShapeMismatchError, TensorNotFoundError, UsageError  # noqa: E402

from .memory import same_file_bytes  # noqa: E402

IDS = torch.tensor([[3, 7, 31, 64, 5, 98, 1, 2], [1, 17, 4, 4, 9, 3, 11, 60]])


@pytest.fixture(autouse=True)
def _quiet_transformers():
    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()


def _gpt2_config():
    return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64,
                                   bos_token_id=0, eos_token_id=0)


def _llama_config():
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=100, bos_token_id=0, eos_token_id=0,
                                    pad_token_id=0)


def _bert_config(**extra):
    return transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                                   vocab_size=100, max_position_embeddings=64, **extra)


def _saved(cls, config, directory, seed=0):
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.save_pretrained(directory)
    return model


def _same_weights(a, b, skip=()):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        if name not in skip:
            assert torch.equal(sa[name], sb[name]), name


def _logits(model):
    with torch.no_grad():
        return model.eval()(IDS).logits


# ----------------------------------------------------------------------------- ties


def test_gpt2_built_on_the_meta_device_keeps_its_tie(tmp_path):
    _saved(transformers.GPT2LMHeadModel, _gpt2_config(), tmp_path)
    reference, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    result = wio.torch.load_into(model, tmp_path, assign=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert len(list(model.parameters())) == len(list(reference.parameters())) == 28
    assert result == ([], []) and (set(result.missing_keys), set(result.unexpected_keys)) == (
        info["missing_keys"], info["unexpected_keys"])
    assert result.tied_keys == {"lm_head.weight": "transformer.wte.weight"}
    _same_weights(model, reference)
    assert torch.equal(_logits(model), _logits(reference))
    model.to(torch.float64)  # a tie survives a later conversion
    assert model.lm_head.weight is model.transformer.wte.weight


def test_gpt2_built_under_accelerate_is_tied_again(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    _saved(transformers.GPT2LMHeadModel, _gpt2_config(), tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    with accelerate.init_empty_weights():
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    assert model.lm_head.weight is not model.transformer.wte.weight  # accelerate's rewrap unties them
    result = wio.torch.load_into(model, tmp_path / "model.safetensors", assign=True)  # no tie_weights() call
    assert result == ([], []) and "lm_head.weight" in result.tied_keys
    assert model.lm_head.weight is model.transformer.wte.weight
    assert len(list(model.parameters())) == 28
    assert torch.equal(_logits(model), _logits(reference))


# ----------------------------------------------------------------------------- meta leftovers


def test_meta_leftovers_are_an_error_and_empty_weights_builds_what_loads(tmp_path):
    _saved(transformers.LlamaForCausalLM, _llama_config(), tmp_path)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_llama_config())
    with pytest.raises(UsageError) as err:
        wio.torch.load_into(model, tmp_path, assign=True)
    message = str(err.value)
    assert "still on the meta device" in message and "model.rotary_emb.inv_freq" in message
    assert "weightio.torch.empty_weights()" in message
    with wio.torch.empty_weights():
        model = transformers.LlamaForCausalLM(_llama_config())
    assert all(p.is_meta for p in model.parameters())
    assert not model.model.rotary_emb.inv_freq.is_meta  # buffers are real
    result = wio.torch.load_into(model, tmp_path, assign=True)
    assert result == ([], []) and result.tied_keys == {}
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    _same_weights(model, reference)
    assert torch.equal(_logits(model), _logits(reference))
    with torch.device("meta"):  # strict=False and a missing parameter: named too
        partial = transformers.LlamaForCausalLM(_llama_config())
    with wio.VarBuilder.from_path(tmp_path, device="torch") as vb:
        renamed = vb.rename(lambda n: None if n == "model.norm.weight" else n)
        with pytest.raises(UsageError, match=r"not loaded \(missing or skipped for their size\): model.norm.weight"):
            wio.torch.load_into(partial, renamed, assign=True, strict=False)


# ----------------------------------------------------------------------------- a new head


def test_a_three_label_checkpoint_into_a_five_label_classifier(tmp_path):
    cls = transformers.BertForSequenceClassification
    _saved(cls, _bert_config(num_labels=3), tmp_path)
    reference, info = cls.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True,
                                          output_loading_info=True)
    torch.manual_seed(9)
    model = cls(_bert_config(num_labels=5)).eval()
    head = model.classifier.weight.detach().clone()
    with pytest.raises(ShapeMismatchError, match="pass ignore_mismatched_sizes=True"):
        wio.torch.load_into(model, tmp_path, strict=False)
    result = wio.torch.load_into(model, tmp_path, ignore_mismatched_sizes=True)
    assert result == ([], [])
    theirs = {(k, tuple(a), tuple(b)) for k, a, b in info["mismatched_keys"]}
    assert set(result.mismatched_keys) == theirs == {("classifier.weight", (3, 32), (5, 32)),
                                                    ("classifier.bias", (3,), (5,))}
    assert torch.equal(model.classifier.weight, head)  # the module keeps its own head
    _same_weights(model, reference, skip={"classifier.weight", "classifier.bias"})
    with torch.no_grad():
        assert torch.equal(model.bert(IDS).last_hidden_state, reference.bert(IDS).last_hidden_state)


# ----------------------------------------------------------------------------- stale keys


def test_hub_era_checkpoints_with_stale_buffers(tmp_path):
    bert_dir, gpt_dir = tmp_path / "bert", tmp_path / "gpt2"
    _saved(transformers.BertModel, _bert_config(), bert_dir)
    _saved(transformers.GPT2LMHeadModel, _gpt2_config(), gpt_dir)
    stored = safetensors_torch.load_file(bert_dir / "model.safetensors")
    stored["embeddings.position_ids"] = torch.arange(64).unsqueeze(0)  # a pre-2023 BERT
    safetensors_torch.save_file(stored, bert_dir / "model.safetensors", metadata={"format": "pt"})
    stored = safetensors_torch.load_file(gpt_dir / "model.safetensors")
    for i in range(2):  # a pre-2023 GPT-2
        stored[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64, dtype=torch.uint8)).view(1, 1, 64, 64)
        stored[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    safetensors_torch.save_file(stored, gpt_dir / "model.safetensors", metadata={"format": "pt"})

    reference, info = transformers.BertModel.from_pretrained(bert_dir, output_loading_info=True)
    model = transformers.BertModel(_bert_config()).eval()
    result = wio.torch.load_into(model, bert_dir)  # strict: reported, not fatal
    assert result == ([], []) and info["unexpected_keys"] == set()
    assert result.ignored_keys == {"embeddings.position_ids": "non-persistent buffer"}
    _same_weights(model, reference)

    reference, info = transformers.GPT2LMHeadModel.from_pretrained(gpt_dir, output_loading_info=True)
    model = transformers.GPT2LMHeadModel(_gpt2_config())
    result = wio.torch.load_into(model, gpt_dir)
    assert result == ([], [])
    assert result.ignored_keys == {
        "transformer.h.0.attn.bias": "_keys_to_ignore_on_load_unexpected",
        "transformer.h.0.attn.masked_bias": "buffer of hub-era checkpoints",
        "transformer.h.1.attn.bias": "_keys_to_ignore_on_load_unexpected",
        "transformer.h.1.attn.masked_bias": "buffer of hub-era checkpoints"}
    # transformers 5 reports the masked biases as unexpected; weightio knows them for stale
    assert info["unexpected_keys"] <= set(result.ignored_keys)
    assert torch.equal(_logits(model), _logits(reference))


# ----------------------------------------------------------------------------- training checkpoints


class _Block(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class _TinyResNet(torch.nn.Module):
    """ResNet-18's names at a tiny size: conv1, bn1, layer1.0.conv1 …, fc."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.layer1 = torch.nn.Sequential(_Block(8), _Block(8))
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        x = self.layer1(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


def _trained_resnet():
    torch.manual_seed(1)
    model = _TinyResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):  # running stats and momentum buffers are real
        optimizer.zero_grad()
        model(torch.randn(4, 3, 8, 8)).logsumexp(1).sum().backward()
        optimizer.step()
    return model.eval(), optimizer


@pytest.mark.parametrize("style", ["imagenet", "lightning"])
def test_training_checkpoints_are_found_without_torch_load(tmp_path, monkeypatch, style):
    model, optimizer = _trained_resnet()
    state = model.state_dict()
    if style == "imagenet":  # pytorch/examples imagenet/main.py, a DDP model
        saved = {"epoch": 3, "arch": "resnet18", "state_dict": {"module." + k: v for k, v in state.items()},
                 "best_acc1": 61.5, "optimizer": optimizer.state_dict()}
        expected = ("state_dict", "module.")
    else:  # a LightningModule holding the network as self.model
        saved = {"epoch": 3, "global_step": 12, "pytorch-lightning_version": "2.4.0",
                 "state_dict": {"model." + k: v for k, v in state.items()},
                 "optimizer_states": [optimizer.state_dict()], "lr_schedulers": [],
                 "hparams_name": "kwargs", "hyper_parameters": {"lr": 0.1, "width": 8}}
        expected = ("state_dict", "model.")
    path = tmp_path / "checkpoint.pth.tar"
    torch.save(saved, path)

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", refuse)
    target = _TinyResNet().eval()
    result = wio.torch.load_into(target, path)
    assert result == ([], []) and (result.sub_mapping, result.wrapper_prefix) == expected
    _same_weights(target, model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(target(x), model(x))
    with wio.VarBuilder.from_path(path, device="torch") as vb:  # a cursor that misses suggests the one that fits
        with pytest.raises(TensorNotFoundError) as err:
            wio.torch.load_into(_TinyResNet(), vb.pp("state_dict"))
        right = "state_dict." + expected[1].rstrip(".")
        hint = f"the module's tensors are under {right!r}: pass VarBuilder.from_path(...).pp({right!r})"
        assert hint in str(err.value)
        assert wio.torch.load_into(_TinyResNet(), vb.pp(right)) == ([], [])


# ----------------------------------------------------------------------------- dtype="auto"


def test_dtype_auto_keeps_each_stored_dtype(tmp_path):
    config = _bert_config()
    torch.manual_seed(0)
    transformers.BertModel(config).to(torch.float16).save_pretrained(tmp_path)
    reference = transformers.BertModel.from_pretrained(tmp_path, dtype="auto")
    with wio.torch.empty_weights():
        model = transformers.BertModel(config)
    assert model.embeddings.word_embeddings.weight.dtype == torch.float32
    assert wio.torch.load_into(model, tmp_path, assign=True, dtype="auto") == ([], [])
    theirs = {k: v.dtype for k, v in reference.state_dict().items()}
    assert {k: v.dtype for k, v in model.state_dict().items()} == theirs
    assert theirs["embeddings.word_embeddings.weight"] == torch.float16
    _same_weights(model, reference)
    with wio.torch.empty_weights():
        model = transformers.BertModel(config)
    wio.torch.load_into(model, tmp_path, assign=True, dtype=torch.bfloat16)
    assert model.encoder.layer[0].output.dense.weight.dtype == torch.bfloat16
    initialised = transformers.BertModel(config)  # copying into a float32 module: its tensors follow the file
    wio.torch.load_into(initialised, tmp_path, dtype="auto")
    assert initialised.pooler.dense.weight.dtype == torch.float16
    with wio.VarBuilder.from_path(tmp_path, dtype="auto") as vb:  # the builder's spelling (numpy, JAX, CuPy)
        assert vb.dtype is None and vb.get_unchecked("pooler.dense.weight").dtype == np.float16
        assert vb.to_dtype("float32").get_unchecked("pooler.dense.weight", dtype="auto").dtype == np.float16
        assert vb.load_all(dtype="auto")["pooler.dense.weight"].dtype == np.float16


# ----------------------------------------------------------------------------- device maps


def test_device_map_with_cpu_and_disk_budgets(tmp_path):
    _saved(transformers.GPT2LMHeadModel, _gpt2_config(), tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    with wio.torch.empty_weights():
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    embeddings = (100 + 64) * 32 * 4  # wte (tied to lm_head: counted once) + wpe
    result = wio.torch.load_into(model, path, device_map="auto", max_memory={"cpu": embeddings + 100, "disk": None})
    assert result.device_map == {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                                 "transformer.h.0": "disk", "transformer.h.1": "disk", "transformer.ln_f": "disk",
                                 "lm_head": "cpu"}  # lm_head holds the tied wte only: with it
    assert model.lm_head.weight is model.transformer.wte.weight
    with wio.open(path) as ckpt:
        for name, tensor in model.state_dict().items():
            stored = "transformer.wte.weight" if name == "lm_head.weight" else name
            on_disk = name.startswith(("transformer.h.", "transformer.ln_f."))
            assert same_file_bytes(tensor.data_ptr(), ckpt[stored].numpy()) == on_disk, name
    assert torch.equal(_logits(model), _logits(reference))

    explicit = {"transformer": "disk", "transformer.h.1": "cpu", "lm_head": "cpu"}
    with wio.torch.empty_weights():
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    assert wio.torch.load_into(model, path, device_map=explicit).device_map == explicit
    with wio.open(path) as ckpt:
        assert same_file_bytes(model.transformer.h[0].mlp.c_fc.weight.data_ptr(),
                               ckpt["transformer.h.0.mlp.c_fc.weight"].numpy())
        assert not same_file_bytes(model.transformer.h[1].mlp.c_fc.weight.data_ptr(),
                                   ckpt["transformer.h.1.mlp.c_fc.weight"].numpy())
    # ("transformer.w" names no module; wte's tensor is placed through lm_head, its other name)
    with pytest.raises(UsageError, match="places no device for 3 tensor.s.: transformer.wpe.weight, "
                                         "transformer.ln_f.weight, transformer.ln_f.bias; add their modules"):
        wio.torch.load_into(model, path, device_map={"transformer.h": "cpu", "transformer.w": "cpu", "lm_head": "cpu"})


def test_a_tensor_named_by_two_paths_is_placed_through_either(tmp_path):
    # `b` is `c` registered twice (the plan names only `c`, as named_children does) and `a.weight` is tied to
    # `b.weight`: the tensor is read to `c`'s device, and `a`, holding only the tie, is placed there too (before,
    # the tensor was read to no device, a view of the file, and `a` was given None)
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Linear(4, 4)
            self.big = torch.nn.Linear(64, 64)
            self.b = self.c
            self.a = torch.nn.Linear(4, 4, bias=False)

        def get_expanded_tied_weights_keys(self, all_submodels=True):
            return {"a.weight": "b.weight"}

    stored = {"b.weight": torch.arange(16.0).reshape(4, 4), "c.bias": torch.arange(4.0),
              "big.weight": torch.ones(64, 64), "big.bias": torch.zeros(64)}
    safetensors_torch.save_file(stored, tmp_path / "m.safetensors")
    model = Twice()
    result = wio.torch.load_into(model, tmp_path / "m.safetensors", device_map="auto",
                                 max_memory={"cpu": 1000, "disk": None})
    assert result.device_map == {"c": "cpu", "big": "disk", "a": "cpu"}
    assert model.a.weight is model.c.weight and torch.equal(model.a.weight, stored["b.weight"])
    with wio.open(tmp_path / "m.safetensors") as ckpt:  # the tensor went to the CPU, as `c` did (memory of its
        assert not same_file_bytes(model.c.weight.data_ptr(), ckpt["b.weight"].numpy())  # own), not left a view
        assert not same_file_bytes(model.c.bias.data_ptr(), ckpt["c.bias"].numpy())
        assert same_file_bytes(model.big.weight.data_ptr(), ckpt["big.weight"].numpy())  # "disk": a view
    model = Twice()  # an explicit map naming the module by its first path only, as "auto" plans it
    wio.torch.load_into(model, tmp_path / "m.safetensors", device_map={"c": "cpu", "big": "disk", "a": "cpu"})
    with wio.open(tmp_path / "m.safetensors") as ckpt:  # (it was refused: "no device for b.weight, b.bias")
        assert not same_file_bytes(model.c.weight.data_ptr(), ckpt["b.weight"].numpy())
        assert torch.equal(model.b.bias, stored["c.bias"]) and model.a.weight is model.b.weight
    with pytest.raises(UsageError, match=r"places no device for 2 tensor.s.: big.weight, big.bias; add"):
        wio.torch.load_into(Twice(), tmp_path / "m.safetensors", device_map={"b": "cpu", "a": "cpu"})
    # tensors are counted, not names: c.weight is also b.weight and a.weight's tie, c.bias is b.bias
    with pytest.raises(UsageError, match=r"places no device for 2 tensor.s.: (.+\.(weight|bias), ){4}.+; add"):
        wio.torch.load_into(Twice(), tmp_path / "m.safetensors", device_map={"big": "disk"})


def test_device_map_planning_with_gpu_budgets_on_the_cpu():
    # the plan alone (no GPU here): layers kept whole (_no_split_modules), devices filled in order
    with wio.torch.empty_weights():
        model = transformers.LlamaForCausalLM(_llama_config())
    layer = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    embed = 100 * 32 * 4
    plan = wio.torch.plan_device_map(model, {0: embed + layer + 10, 1: layer + embed, "cpu": "1GiB"})
    assert plan == {"model.embed_tokens": "cuda:0", "model.layers.0": "cuda:0", "model.layers.1": "cuda:1",
                    "model.norm": "cuda:1", "model.rotary_emb": "cuda:1", "lm_head": "cpu"}
    with pytest.raises(UsageError, match="does not fit the budgets"):
        wio.torch.plan_device_map(model, {"cuda:0": layer // 2, "cpu": "1KiB"})
    assert wio.torch.plan_device_map(model, {"cpu": "1GiB"}) == {"": "cpu"}


# ----------------------------------------------------------------------------- the report


def test_report_prints_the_table_transformers_prints(tmp_path, capsys):
    cls = transformers.BertForSequenceClassification
    _saved(cls, _bert_config(num_labels=3), tmp_path)
    stored = safetensors_torch.load_file(tmp_path / "model.safetensors")
    stored["bert.embeddings.position_ids"] = torch.arange(64).unsqueeze(0)
    stored["extra.weight"] = torch.zeros(2)
    safetensors_torch.save_file({"module." + k: v for k, v in stored.items()}, tmp_path / "model.safetensors")
    model = cls(_bert_config(num_labels=5))
    result = wio.torch.load_into(model, tmp_path, ignore_mismatched_sizes=True, strict=False, report=True)
    out = capsys.readouterr().out
    assert out == result.table() + "\n"
    lines = out.splitlines()
    assert lines[0] == (f"BertForSequenceClassification LOAD REPORT from: {tmp_path}, "
                        "wrapper prefix: 'module.', base-model prefix: 'bert'")
    assert lines[1].split() == ["Key", "|", "Status", "|", "Details"]
    rows = {tuple(c.strip() for c in line.split("|")) for line in lines[3:] if "|" in line}
    assert rows == {("extra.weight", "UNEXPECTED", ""),
                    ("classifier.weight", "MISMATCH", "skipped for its size - ckpt: (3, 32) vs model: (5, 32)"),
                    ("classifier.bias", "MISMATCH", "skipped for its size - ckpt: (3,) vs model: (5,)"),
                    ("bert.embeddings.position_ids", "IGNORED", "non-persistent buffer")}
    assert "Notes:" in lines and any(line.startswith("- MISMATCH:") for line in lines)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    gpt = tmp_path / "gpt2"
    _saved(transformers.GPT2LMHeadModel, _gpt2_config(), gpt)
    wio.torch.load_into(model, gpt, assign=True, report=True)
    assert "lm_head.weight | TIED   | shares transformer.wte.weight" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the path to a GPU, on the CPU


@pytest.fixture
def staged_gpu(monkeypatch):
    """``torch:cuda:0`` served by a CPU torch backend that stages like CUDA (the ring, separate
    allocations, bulk transfers), counting the bytes of every device allocation it makes."""
    from weightio import devices
    from weightio.devices import Device
    from weightio.devices.torch import TorchBackend

    class Counted(TorchBackend):
        live: dict[int, int] = {}
        peak = 0

        def empty(self, nbytes):
            import weakref

            raw = np.empty(nbytes, np.uint8)
            Counted.live[id(raw)] = nbytes
            weakref.finalize(raw, Counted.live.pop, id(raw), None)
            Counted.peak = max(Counted.peak, sum(Counted.live.values()))
            return torch.from_numpy(raw)

    backend = Counted(Device("torch", "cpu"), staged=True, pin=False)
    backend.device = Device("torch", "cuda:0")
    backend.loader = devices.StagedLoader(backend, chunk=64 << 10, slots=3, piece=16 << 10)  # many buffers
    for key in ("torch:cuda:0", "torch:cuda", Device("torch", "cuda:0")):
        monkeypatch.setitem(devices._BY_ARGUMENT, key, backend)
    return Counted


def test_load_into_a_gpu_moves_in_bulk_into_tensors_of_their_own(tmp_path, staged_gpu):
    _saved(transformers.BertModel, _bert_config(), tmp_path)
    reference = transformers.BertModel.from_pretrained(tmp_path)
    with wio.torch.empty_weights():
        model = transformers.BertModel(_bert_config())
    vb = wio.VarBuilder.from_path(tmp_path, device="torch:cuda:0")
    assert vb.device.target == "cuda:0"
    result = wio.torch.load_into(model, vb, assign=True)
    assert result == ([], [])
    _same_weights(model, reference)
    storages = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(storages)) == len(storages) == 39  # one allocation each, not views of shared runs
    model.embeddings.word_embeddings.weight.data.add_(1)  # nothing else moves with it
    assert torch.equal(model.pooler.dense.weight, reference.pooler.dense.weight)


def test_load_into_a_gpu_with_a_cast_never_holds_the_stored_and_cast_model_together(tmp_path, staged_gpu,
                                                                                    monkeypatch):
    from weightio import varbuilder

    _saved(transformers.BertModel, _bert_config(), tmp_path)  # float32 on disk
    reference = transformers.BertModel.from_pretrained(tmp_path)
    stored = sum(p.numel() * 4 for p in reference.parameters())
    monkeypatch.setattr(varbuilder, "_CAST_BATCH", stored // 10)
    with wio.torch.empty_weights():
        model = transformers.BertModel(_bert_config())
    wio.torch.load_into(model, wio.VarBuilder.from_path(tmp_path, device="torch:cuda:0"), assign=True,
                        dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value.to(torch.bfloat16)), name
    largest = max(p.numel() * 4 for p in reference.parameters())
    assert staged_gpu.peak <= stored // 10 + 2 * largest  # a batch of stored bytes (and one leftover) at a time


def test_a_device_map_places_cpu_and_disk_entries_on_the_cpu_whatever_the_builders_device(tmp_path, staged_gpu):
    """``device="torch:cuda:0"`` with a device map: its "disk" entries are zero-copy views of the
    file and its "cpu" entries memory of their own, neither read through the GPU's builder."""
    _saved(transformers.GPT2LMHeadModel, _gpt2_config(), tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    plan = {"transformer": "disk", "transformer.h.1": "cuda:0", "lm_head": "cpu"}
    with wio.torch.empty_weights():
        model = transformers.GPT2LMHeadModel(_gpt2_config())
    assert wio.torch.load_into(model, path, device="torch:cuda:0", device_map=plan).device_map == plan
    _same_weights(model, reference)
    on_gpu = {n for n, _ in model.transformer.h[1].named_parameters(prefix="transformer.h.1")}
    assert staged_gpu.peak == sum(p.numel() * 4 for p in model.transformer.h[1].parameters())  # those alone
    with wio.open(path) as ckpt:
        for name, tensor in model.named_parameters():
            stored = "transformer.wte.weight" if name == "lm_head.weight" else name
            on_disk = name.startswith("transformer.") and name not in on_gpu  # lm_head: wte's, tied
            assert same_file_bytes(tensor.data_ptr(), ckpt[stored].numpy()) == on_disk, name
