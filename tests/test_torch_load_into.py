"""`weightio.torch.load_into`: real models filled through the VarBuilder, checked against torch and
transformers' own loading (outputs bit-identical, the same missing/unexpected keys).

The ``pytorch_model.bin`` cases read the PyTorch zip format through weightio's pickle reader.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weightio as wio  # noqa: E402
from weightio.errors import ShapeMismatchError, TensorNotFoundError, WeightioError  # noqa: E402

from .conftest import FIXTURES  # noqa: E402
from .memory import same_file_bytes  # noqa: E402

MODELS = FIXTURES / "models"
BERT, DEBERTA, CLS = MODELS / "bert", MODELS / "deberta-v2", MODELS / "bert-for-sequence-classification"
IDS = torch.tensor([[2, 7, 31, 64, 5, 98, 0, 0], [1, 17, 4, 4, 9, 3, 11, 60]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8])


def _transformers():
    return pytest.importorskip("transformers")


def _fresh(cls, directory, seed=123):
    """A model of `cls` with the fixture's config and different (random) weights."""
    config = _transformers().AutoConfig.from_pretrained(directory)
    torch.manual_seed(seed)
    return cls(config).eval()


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def _differs(a, b):
    return any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


# ----------------------------------------------------------------------------- transformers models


@pytest.mark.parametrize("directory,model_class", [(BERT, "BertModel"), (DEBERTA, "DebertaV2Model")])
@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_outputs_equal_transformers_own_loading(directory, model_class, weights):
    transformers = _transformers()
    cls = getattr(transformers, model_class)
    reference = cls.from_pretrained(directory, use_safetensors=weights.endswith(".safetensors")).eval()
    model = _fresh(cls, directory)
    assert _differs(model, reference)
    result = wio.torch.load_into(model, directory / weights)
    assert result == ([], []) and result.missing_keys == [] and result.unexpected_keys == []
    _assert_same_weights(model, reference)
    with torch.no_grad():
        ours = model(input_ids=IDS, attention_mask=MASK).last_hidden_state
        theirs = reference(input_ids=IDS, attention_mask=MASK).last_hidden_state
    assert torch.equal(ours, theirs) and ours.std() > 0.1


def test_a_classification_checkpoint_into_the_base_model():
    # bert.… + classifier.… into BertModel: the prefix is stripped; the head is reported unexpected,
    # exactly as transformers reports it.
    transformers = _transformers()
    reference, info = transformers.BertModel.from_pretrained(CLS, output_loading_info=True)
    model = _fresh(transformers.BertModel, CLS)
    with pytest.raises(WeightioError) as err:
        wio.torch.load_into(model, CLS)
    assert str(err.value) == (f"{CLS}: loading BertModel: unexpected (stored, never used): classifier.bias, "
                              "classifier.weight; pass strict=False to allow this")  # file order
    missing, unexpected = wio.torch.load_into(model, CLS, strict=False)
    assert (set(missing), set(unexpected)) == (set(info["missing_keys"]), set(info["unexpected_keys"]))
    assert set(unexpected) == {"classifier.weight", "classifier.bias"}
    _assert_same_weights(model, reference.eval())
    with torch.no_grad():
        assert torch.equal(model(IDS, MASK).last_hidden_state, reference(IDS, MASK).last_hidden_state)


def test_a_base_checkpoint_into_a_model_with_a_head():
    transformers = _transformers()
    cls = transformers.BertForSequenceClassification
    _, info = cls.from_pretrained(BERT, output_loading_info=True)
    model = _fresh(cls, BERT)
    with pytest.raises(TensorNotFoundError) as err:
        wio.torch.load_into(model, BERT)
    assert "missing: classifier.weight, classifier.bias" in str(err.value)
    missing, unexpected = wio.torch.load_into(model, BERT / "model.safetensors", strict=False)
    assert (set(missing), set(unexpected)) == (set(info["missing_keys"]), set(info["unexpected_keys"]))
    _assert_same_weights(model.bert, transformers.BertModel.from_pretrained(BERT))


def test_tied_weights_need_one_name():
    # BertForMaskedLM ties cls.predictions.decoder.weight to the word embeddings.
    transformers = _transformers()
    cls = transformers.BertForMaskedLM
    _, info = cls.from_pretrained(BERT, output_loading_info=True)
    model = _fresh(cls, BERT)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    missing, unexpected = wio.torch.load_into(model, BERT, strict=False)
    assert "cls.predictions.decoder.weight" not in missing
    assert (set(missing), set(unexpected)) == (set(info["missing_keys"]), set(info["unexpected_keys"]))
    assert torch.equal(model.cls.predictions.decoder.weight,
                       transformers.BertModel.from_pretrained(BERT).embeddings.word_embeddings.weight)


def test_partial_load_of_an_encoder_fed_precomputed_embeddings():
    transformers = _transformers()
    reference = transformers.DebertaV2Model.from_pretrained(DEBERTA).eval()
    with torch.no_grad():
        embeddings = reference.embeddings(input_ids=IDS, mask=MASK)
        expected = reference(input_ids=IDS, attention_mask=MASK).last_hidden_state
    torch.manual_seed(5)
    encoder = transformers.models.deberta_v2.modeling_deberta_v2.DebertaV2Encoder(reference.config).eval()
    with wio.VarBuilder.from_path(DEBERTA, device="torch") as vb:
        assert wio.torch.load_into(encoder, vb.pp("encoder")) == ([], [])  # strict: its part is complete
        assert set(vb.report().unused) == {n for n in reference.state_dict() if n.startswith("embeddings.")}
    with torch.no_grad():
        out = encoder(embeddings, MASK, output_hidden_states=True).last_hidden_state
    assert torch.equal(out, expected)


def test_the_issue_example_deberta_prefix_through_a_cursor():
    with wio.VarBuilder.from_path(DEBERTA, dtype="float32", device="torch") as vb:
        enc = vb.pp("deberta").pp("encoder")  # the checkpoint is a bare DebertaV2Model: prefix added
        w = enc.pp("layer").pp(0).pp("attention").pp("self").get((32, 32), "query_proj.weight")
        assert isinstance(w, torch.Tensor) and w.shape == (32, 32)
        report = vb.report()
        assert report.base_model_prefix == "deberta"
        assert report.renamed == {"deberta.encoder.layer.0.attention.self.query_proj.weight":
                                  "encoder.layer.0.attention.self.query_proj.weight"}


def test_the_module_keeps_its_dtype():
    transformers = _transformers()
    reference = transformers.BertModel.from_pretrained(BERT).eval()
    model = _fresh(transformers.BertModel, BERT).to(torch.bfloat16)
    wio.torch.load_into(model, BERT)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference.state_dict()[name].to(value.dtype)), name


# ----------------------------------------------------------------------------- plain torch modules


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)).eval()


def _save_torch(tmp_path, name, tensors):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / name
    safetensors_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def test_ddp_and_compiled_checkpoints_and_modules(tmp_path):
    source = _net()
    plain = _save_torch(tmp_path, "plain.safetensors", source.state_dict())
    ddp = _save_torch(tmp_path, "ddp.safetensors", {"module." + k: v for k, v in source.state_dict().items()})
    with warnings.catch_warnings():  # importing torch._dynamo warns about torch.jit internals
        warnings.simplefilter("ignore", DeprecationWarning)
        compiled = torch.compile(_net())
        compiled_other = torch.compile(_net_other())
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    saved_compiled = _save_torch(tmp_path, "compiled.safetensors", compiled.state_dict())
    x = torch.randn(3, 8)
    for target, path in ((_net_other(), ddp), (_net_other(), saved_compiled), (compiled_other, plain)):
        assert wio.torch.load_into(target, path) == ([], [])
        inner = getattr(target, "_orig_mod", target)
        assert torch.equal(inner(x), source(x) if path != saved_compiled else compiled._orig_mod(x))


def _net_other():
    net = _net()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1)
    return net


def test_shape_mismatch_leaves_the_module_untouched(tmp_path):
    source = _net()
    tensors = dict(source.state_dict())
    tensors["2.weight"] = torch.zeros(4, 15)
    tensors["0.bias"] = torch.zeros(17)
    path = _save_torch(tmp_path, "bad.safetensors", tensors)
    target = _net_other()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ShapeMismatchError) as err:
        wio.torch.load_into(target, path, strict=False)
    assert str(err.value) == (f"{path}: tensor '0.bias': size mismatch loading Sequential: 0.bias: module (16,), "
                              "stored (17,); 2.weight: module (4, 16), stored (4, 15); "
                              "pass ignore_mismatched_sizes=True to skip them")
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_sources_renames_and_a_given_prefix(tmp_path):
    source = _net()
    x = torch.randn(2, 8)
    for src in (dict(source.state_dict()), {k: v.numpy() for k, v in source.state_dict().items()}):
        target = _net_other()
        assert wio.torch.load_into(target, src) == ([], [])
        assert torch.equal(target(x), source(x))
    path = _save_torch(tmp_path, "net.safetensors", {"net." + k: v for k, v in source.state_dict().items()})
    with wio.open(path) as ckpt:
        target = _net_other()
        assert wio.torch.load_into(target, ckpt, renames=lambda n: "net." + n) == ([], [])
        assert not ckpt.closed  # an open checkpoint is the caller's
    target = _net_other()
    target.base_model_prefix = "net"  # as transformers models declare it
    assert wio.torch.load_into(target, path) == ([], [])
    assert torch.equal(target(x), source(x))
    assert wio.torch.load_into(_net_other(), path, base_model_prefix="net") == ([], [])


def test_assign_keeps_zero_copy_views_on_a_meta_module(tmp_path):
    source = _net()
    path = _save_torch(tmp_path, "net.safetensors", source.state_dict())
    with torch.device("meta"):
        target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    with pytest.raises(WeightioError, match="is on the meta device; pass assign=True"):
        wio.torch.load_into(target, path)
    with wio.VarBuilder.from_path(path, device="torch") as vb:
        assert wio.torch.load_into(target, vb, assign=True) == ([], [])
        mapped = vb.to_device("numpy").get_unchecked("0.weight")
        assert same_file_bytes(target[0].weight.data_ptr(), mapped)  # the file's own pages
    x = torch.randn(2, 8)
    assert torch.equal(target.eval()(x), source(x))
    assert isinstance(target[0].weight, torch.nn.Parameter)


def test_training_zero_copy_parameters_never_changes_the_file(tmp_path):
    """assign=True parameters are zero-copy pages of the file, private to this process: an optimizer
    step writes to its own copies of the touched pages, never to the file, nor to what numpy views
    or a later open in this process read."""
    source = _net()
    path = _save_torch(tmp_path, "net.safetensors", source.state_dict())
    before = path.read_bytes()
    with torch.device("meta"):
        target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    with wio.open(path) as ckpt:
        assert wio.torch.load_into(target, ckpt, assign=True) == ([], [])
        assert same_file_bytes(target[0].weight.data_ptr(), ckpt["0.weight"].numpy())
        optimizer = torch.optim.SGD(target.parameters(), lr=0.5)
        for _ in range(3):
            optimizer.zero_grad()
            target(torch.randn(4, 8)).square().sum().backward()
            optimizer.step()
        assert not torch.equal(target[0].weight, source[0].weight)  # trained, in place
        assert np.array_equal(ckpt["0.weight"].numpy(), source[0].weight.detach().numpy())  # numpy: the file
    assert path.read_bytes() == before
    with wio.open(path) as again:
        for name, value in source.state_dict().items():
            assert torch.equal(again[name].to("torch"), value), name


def test_strict_missing_and_unexpected_messages(tmp_path):
    tensors = dict(_net().state_dict())
    del tensors["1.bias"]
    tensors["extra.weight"] = torch.zeros(2)
    path = _save_torch(tmp_path, "net.safetensors", tensors)
    with pytest.raises(TensorNotFoundError) as err:
        wio.torch.load_into(_net_other(), path)
    assert str(err.value) == (f"{path}: tensor '1.bias': loading Sequential: missing: 1.bias; unexpected (stored, "
                              "never used): extra.weight; pass strict=False to allow this")
    assert wio.torch.load_into(_net_other(), path, strict=False) == (["1.bias"], ["extra.weight"])


def test_numpy_builder_is_read_as_torch():
    source = _net()
    vb = wio.VarBuilder.from_dict({k: v.numpy() for k, v in source.state_dict().items()})  # device numpy
    target = _net_other()
    assert wio.torch.load_into(target, vb) == ([], [])
    assert torch.equal(target[0].weight, source[0].weight)
    assert isinstance(np.zeros(1), np.ndarray)


def test_ignore_patterns_are_read_from_class_attributes_instances_and_properties(tmp_path):
    """``_keys_to_ignore_on_load_*`` as transformers declares them (class attributes), set on an
    instance, or computed by a property: every submodule's patterns apply, each way."""

    class ByClass(torch.nn.Linear):
        _keys_to_ignore_on_load_unexpected = [r"^a\.old_scale$"]

    class ByProperty(torch.nn.Linear):
        @property
        def _keys_to_ignore_on_load_unexpected(self):
            return [r"^b\.old_shift$"]

    model = torch.nn.Sequential()
    model.add_module("a", ByClass(2, 2))
    model.add_module("b", ByProperty(2, 2))
    model.add_module("c", torch.nn.Linear(2, 2))
    model.c._keys_to_ignore_on_load_missing = [r"^c\.bias$"]  # on the instance
    stored = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "c.bias"}
    stored.update({"a.old_scale": torch.ones(1), "b.old_shift": torch.ones(1), "c.stale": torch.ones(1)})
    wio.save({k: v.numpy() for k, v in stored.items()}, tmp_path / "m.safetensors")
    result = wio.torch.load_into(model, tmp_path / "m.safetensors", strict=False)
    assert result.unexpected_keys == ["c.stale"] and result.missing_keys == []
    assert result.ignored_keys == {"a.old_scale": "_keys_to_ignore_on_load_unexpected",
                                   "b.old_shift": "_keys_to_ignore_on_load_unexpected",
                                   "c.bias": "_keys_to_ignore_on_load_missing"}
