"""VarBuilder: cursors, checked gets, sources, name resolution, the load report, shards.

Expected values come from the writing library (safetensors.numpy.load_file, the fixture
manifest) or from arrays built here, never from weightio itself. No torch needed.
"""

from __future__ import annotations

import gc
import json
import shutil

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import weightio as wio
from weightio.errors import CorruptFileError, ShapeMismatchError, TensorNotFoundError, UsageError, WeightioError
from weightio.names import LEGACY_SUFFIXES, LoadReport, renamer

from .conftest import FIXTURES, digest, manifest
from .memory import resident_bytes, same_file_bytes

BERT = FIXTURES / "tiny-bert"
SHARDED = FIXTURES / "tiny-bert-sharded"
CLS = FIXTURES / "models" / "bert-for-sequence-classification"
Q = "encoder.layer.0.attention.self.query.weight"


def _reference(path):
    """The tensors as the safetensors package reads them (a directory: its model.safetensors)."""
    path = path / "model.safetensors" if path.is_dir() else path
    return safetensors.numpy.load_file(str(path))


def _save(tmp_path, name, tensors, metadata=None):
    path = tmp_path / name
    safetensors.numpy.save_file(tensors, str(path), metadata=metadata)
    return path


# ----------------------------------------------------------------------------- cursors


def test_cursors_join_prefixes_and_share_one_backend():
    vb = wio.VarBuilder.from_path(BERT)
    layer = vb.pp("encoder").pp("layer").push_prefix(0)
    assert (vb.prefix, layer.prefix) == ("", "encoder.layer.0")
    assert vb.pp("encoder.layer").pp(0).prefix == "encoder.layer.0"  # dotted components
    assert vb.pp("encoder.layer").pp(np.int64(0)).prefix == "encoder.layer.0"
    assert layer.pp("").prefix == "encoder.layer.0"  # an empty component changes nothing
    assert layer.root().prefix == "" and layer.root()._shared is vb._shared
    assert vb.prefix == ""  # immutable: deriving changed nothing
    w = layer.get((32, 32), "attention.self.query.weight")
    np.testing.assert_array_equal(w, _reference(BERT)[Q])
    assert w.flags.writeable is False
    assert Q in vb.report().used  # the use through the cursor shows on the root
    assert repr(layer) == f"<VarBuilder 'encoder.layer.0' over {BERT}: device=numpy, dtype=stored>"
    vb.close()


@pytest.mark.parametrize("bad", [None, 1.5, True, b"x"])
def test_prefix_components_must_be_str_or_int(bad):
    vb = wio.VarBuilder.from_dict({"a": np.zeros(1)})
    with pytest.raises(TypeError, match="a prefix component is a str or int"):
        vb.pp(bad)


def test_get_checks_the_shape_with_the_full_dotted_name():
    with wio.VarBuilder.from_path(BERT) as vb:
        with pytest.raises(ShapeMismatchError) as info:
            vb.pp("encoder").pp("layer").pp(0).get((32, 31), "attention.self.query.weight")
        assert str(info.value) == (f"{BERT / 'model.safetensors'}: tensor '{Q}': expected shape (32, 31), "
                                   "found (32, 32)")
        assert vb.get(32, "encoder.layer.0.output.dense.bias").shape == (32,)  # an int is a 1-D shape
        assert vb.get([32], "encoder.layer.0.output.dense.bias").shape == (32,)
        with pytest.raises(TypeError, match="a shape is an int or a sequence of ints"):
            vb.get((32.0,), "encoder.layer.0.output.dense.bias")
        with pytest.raises(TypeError, match="a tensor name is a str"):
            vb.get(32, 7)
        assert vb.report().mismatched == ((Q, (32, 31), (32, 32)),)


def test_a_tensor_asked_every_way_is_the_same_and_reported_once_each():
    """A stored name asked through a prefix cursor, through a rename, with a dtype, with a numpy-int
    shape: the same bytes, and the report counts every request."""
    ref = _reference(BERT)
    bias = "encoder.layer.0.output.dense.bias"
    with wio.VarBuilder.from_path(BERT) as vb:
        direct = vb.pp("encoder").pp("layer.0").get((32, 32), "attention.self.query.weight")
        general = vb.rename({"q": Q}).get((32, 32), "q")
        assert direct.tobytes() == general.tobytes() == ref[Q].tobytes() and not direct.flags.writeable
        assert vb.to_dtype("float64").get(32, bias).tobytes() == ref[bias].astype(np.float64).tobytes()
        assert vb.get((np.int64(32),), bias).shape == (32,)
        for shape in (np.array([32, 32]), [32, 32], (np.int64(32), 32)):  # any sequence of ints: the general path
            assert vb.get(shape, Q).tobytes() == direct.tobytes()
        report = vb.report()
        assert report.used == (Q, bias) and report.renamed == {"q": Q}
        assert report.bytes_read == 5 * 32 * 32 * 4 + 2 * 32 * 4
        with pytest.raises(TypeError, match="a shape is an int or a sequence of ints"):
            vb.get((True, 32), Q)  # a bool equals 1 but is no dimension
        with pytest.raises(TypeError, match="a shape is an int or a sequence of ints"):
            vb.get((32, 32.0), Q)  # equal to the stored shape, a float past the first dimension
        with pytest.raises(ShapeMismatchError, match=r"expected shape \(32, 33\), found \(32, 32\)"):
            vb.get((32, 33), Q)
        with pytest.raises(TensorNotFoundError, match="did you mean"):
            vb.get((32, 32), Q + "s")


def test_gets_of_stored_names_take_the_short_path_and_report_in_request_order(monkeypatch):
    """Names stored as asked, on numpy as stored (`get`'s short path), interleaved with the general
    path (a rename, a cast, an int shape): the same bytes as the writer's, one report in request
    order, whether the general path's queued hits are folded every 3 gets or only when the report is asked for."""
    from weightio.names import Usage

    ref = _reference(BERT)
    bias = "encoder.layer.0.output.dense.bias"
    asks = [((32, 32), Q, None), (32, bias, None), ((32, 32), "q", None), ((32,), bias, "float64"),
            ((32, 32), Q, None)]

    def run():
        with wio.VarBuilder.from_path(BERT) as vb:
            short = vb._plain is not None and vb.pp("encoder")._plain is not None and vb.to_dtype("f2")._plain is None
            got = [(vb.rename({"q": Q}) if name == "q" else vb).get(shape, name, dtype) for shape, name, dtype in asks]
            return short, [g.tobytes() for g in got], vb.report()

    short, got, report = run()
    monkeypatch.setattr(Usage, "FOLD_AT", 3)
    assert run() == (short, got, report) and short
    assert got == [ref[Q].tobytes(), ref[bias].tobytes(), ref[Q].tobytes(), ref[bias].astype(np.float64).tobytes(),
                   ref[Q].tobytes()]
    assert report.used == (Q, bias) and report.renamed == {"q": Q}
    assert report.bytes_read == 3 * 32 * 32 * 4 + 2 * 32 * 4 and len(report.unused) == len(ref) - 2


def test_the_short_path_checks_the_file_first(tmp_path):
    path = tmp_path / "model.safetensors"
    shutil.copy(BERT / "model.safetensors", path)
    with wio.VarBuilder.from_path(path) as vb:
        assert vb.get((32, 32), Q).shape == (32, 32)
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
        with pytest.raises(CorruptFileError, match="was truncated from .* since it was opened"):
            vb.get((32, 32), Q)


def test_checkpoint_get_answers_the_default():
    with wio.open(BERT / "model.safetensors") as ckpt:
        assert ckpt.get(Q).numpy().tobytes() == _reference(BERT)[Q].tobytes()
        assert ckpt.get(Q + "s") is None and ckpt.get(7, "none") == "none"
        assert ckpt.get("encoder", 0) == 0
        assert ckpt.get(np.str_(Q)).shape == (32, 32)  # a str subclass is a name as ckpt[...] takes it


def test_get_unchecked_and_contains():
    with wio.VarBuilder.from_path(BERT) as vb:
        enc = vb.pp("encoder")
        assert enc.get_unchecked("layer.1.output.dense.weight").shape == (32, 37)
        assert enc.contains("layer.1.output.dense.weight") and "layer.1.output.dense.weight" in enc
        assert not enc.contains("layer.1")  # exact names only, not prefixes of names
        assert not vb.contains("encoder.layer.9.output.dense.weight")
        report = vb.report()
        assert report.missing == () and report.used == ("encoder.layer.1.output.dense.weight",)


def test_unknown_names_raise_with_the_closest_names():
    with wio.VarBuilder.from_path(BERT) as vb:
        with pytest.raises(TensorNotFoundError) as info:
            vb.pp("encoder").get((32, 32), "layer.0.attention.self.querry.weight")
        err = info.value
        assert isinstance(err, KeyError) and err.tensor == "encoder.layer.0.attention.self.querry.weight"
        assert err.suggestions[0] == Q
        assert str(err) == (f"{BERT}: tensor 'encoder.layer.0.attention.self.querry.weight': no such tensor; "
                            f"did you mean {err.suggestions[0]!r}, {err.suggestions[1]!r}, {err.suggestions[2]!r}?")
        assert vb.report().missing == ("encoder.layer.0.attention.self.querry.weight",)


def test_nothing_is_read_until_a_get(tmp_path):
    # The file mapping's resident pages (this process's /proc/self/smaps) stay at zero while
    # cursors are made and names resolved; a get returns a view; touching it reads the pages.
    big = {"a.weight": np.arange(1 << 20, dtype=np.float32), "b.weight": np.ones((512, 512), np.float32)}
    path = _save(tmp_path, "big.safetensors", big)
    vb = wio.VarBuilder.from_path(path)
    assert vb.pp("a").contains("weight") and resident_bytes(path) == 0
    view = vb.pp("a").get(1 << 20, "weight")
    assert resident_bytes(path) == 0
    assert float(view.sum(dtype=np.float64)) == float(big["a.weight"].sum(dtype=np.float64))
    assert resident_bytes(path) >= 4 << 20
    del view
    vb.close()


# ----------------------------------------------------------------------------- dtypes and devices


def _raw_tensor(path, name):
    """One tensor of a safetensors file, parsed here from the spec with json and numpy (an
    independent reading: safetensors.numpy cannot read fp8)."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    entry = json.loads(blob[8 : 8 + n])[name]
    begin, end = entry["data_offsets"]
    codes = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E5M2": ml_dtypes.float8_e5m2, "F64": np.float64, "I64": np.int64, "U8": np.uint8,
             "BOOL": np.bool_, "F32": np.float32}
    return np.frombuffer(blob[8 + n + begin : 8 + n + end], codes[entry["dtype"]]).reshape(entry["shape"])


def test_dtype_applies_to_floating_tensors_only():
    path = FIXTURES / "dtypes.safetensors"
    with wio.VarBuilder.from_path(path, dtype="float32") as vb:
        for name in ("f16", "bf16", "f8_e4m3", "f8_e5m2", "f64"):
            stored = _raw_tensor(path, name)
            got = vb.get(stored.shape, name)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, stored.astype(np.float32))
        for name in ("i64", "u8", "bool", "num_batches_tracked"):  # kept: position ids must stay ints
            stored = _raw_tensor(path, name)
            assert vb.get(stored.shape, name).dtype == stored.dtype
        assert vb.get(12, "i64", dtype="float32").dtype == np.float32  # an explicit dtype applies to any
        f32 = vb.get_unchecked("f32")
        assert f32.flags.writeable is False  # no cast needed: still the zero-copy view


def test_casts_to_and_from_bf16_and_fp8():
    # Values exactly representable in each type: the casts are exact both ways.
    mantissas, scales = np.array([1, 1.25, 1.5, 1.75], np.float32), np.array([0.25, 0.5, 1, 2], np.float32)
    values = np.concatenate([np.outer(scales, mantissas), -np.outer(scales, mantissas)]).reshape(4, 8)
    vb = wio.VarBuilder.from_dict({"w": values})
    for narrow in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"):
        down = vb.get((4, 8), "w", dtype=narrow)
        assert down.dtype == np.dtype(getattr(ml_dtypes, narrow, narrow))
        back = wio.VarBuilder.from_dict({"w": down}).get((4, 8), "w", dtype="float32")
        np.testing.assert_array_equal(back, values)


def test_per_subtree_dtype_and_device():
    with wio.VarBuilder.from_path(BERT) as vb:
        half = vb.pp("encoder").to_dtype("f16")
        assert half.dtype == np.float16 and vb.dtype is None
        assert half.pp("layer.0").get((32, 32), "attention.self.query.weight").dtype == np.float16
        assert vb.get((32, 32), Q).dtype == np.float32  # the parent keeps its own
        assert half.to_dtype(None).get((32, 32), "layer.0.attention.self.query.weight").dtype == np.float32
        moved = vb.to_device("numpy:cpu")
        assert str(moved.device) == "numpy:cpu" and str(vb.device) == "numpy"
        with pytest.raises(UsageError, match="unknown device 'cuda:0'.*did you mean 'torch:cuda:0'"):
            vb.to_device("cuda:0")


def test_torch_device_gives_zero_copy_tensors():
    torch = pytest.importorskip("torch")
    with wio.VarBuilder.from_path(BERT, device="torch") as vb:
        t = vb.get((32, 32), Q)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
        assert torch.equal(t, torch.from_numpy(_reference(BERT)[Q]))
        assert same_file_bytes(t.data_ptr(), vb.to_device("numpy").get((32, 32), Q))
        assert vb.to_dtype("bf16").get((32, 32), Q).dtype == torch.bfloat16


# ----------------------------------------------------------------------------- sources


def test_from_path_file_directory_index_and_list(tmp_path):
    expected = manifest()["tiny-bert"]
    index = SHARDED / "model.safetensors.index.json"
    shards = sorted(SHARDED.glob("*.safetensors"))
    for source in (BERT / "model.safetensors", BERT, SHARDED, index, shards, [str(s) for s in shards]):
        with wio.VarBuilder.from_path(source) as vb:
            for name, spec in expected.items():
                assert digest(vb.get(tuple(spec["shape"]), name)) == spec["sha256"], (source, name)
    # an index that is not the directory's conventional one is opened by its own path
    other = tmp_path / "other"
    shutil.copytree(SHARDED, other)
    (other / "model.safetensors.index.json").rename(other / "custom.index.json")
    with wio.VarBuilder.from_path(other / "custom.index.json") as vb:
        assert vb.contains(Q)


def test_a_name_in_two_sources_is_corrupt(tmp_path):
    a = _save(tmp_path, "a.safetensors", {"x": np.zeros(2, np.float32), "shared": np.zeros(1, np.float32)})
    b = _save(tmp_path, "b.safetensors", {"y": np.zeros(2, np.float32), "shared": np.ones(1, np.float32)})
    with pytest.raises(CorruptFileError) as info:
        wio.VarBuilder.from_path([a, b])
    assert str(info.value) == f"{b}: tensor 'shared': is in two sources: {a} and {b}"
    with pytest.raises(CorruptFileError, match="tensor 'shared': is in two sources: <dict> and <dict>"):
        wio.VarBuilder.from_checkpoint([{"shared": np.zeros(1)}, {"shared": np.zeros(1)}])


def test_from_path_closes_what_it_opened_when_it_fails(tmp_path):
    a = _save(tmp_path, "a.safetensors", {"x": np.zeros(2, np.float32)})
    opened = []
    real = wio.varbuilder.open_checkpoint

    def spy(p, **options):
        ckpt = real(p, **options)
        opened.append(ckpt)
        return ckpt

    wio.varbuilder.open_checkpoint = spy
    try:
        with pytest.raises(CorruptFileError):
            wio.VarBuilder.from_path([a, a])
    finally:
        wio.varbuilder.open_checkpoint = real
    assert len(opened) == 2 and all(c.closed for c in opened)


def test_from_checkpoint_leaves_the_checkpoint_open_and_from_dict_takes_any_tensor():
    with wio.open(BERT) as ckpt:
        vb = wio.VarBuilder.from_checkpoint(ckpt)
        np.testing.assert_array_equal(vb.get((32, 32), Q), _reference(BERT)[Q])
        vb.close()
        assert not ckpt.closed
        mixed = wio.VarBuilder.from_dict({"view": ckpt[Q], "array": np.arange(3), "list": np.asarray([1.5, 2.5])})
        np.testing.assert_array_equal(mixed.get((32, 32), "view"), _reference(BERT)[Q])
        assert mixed.get(3, "array").tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="from_dict takes a mapping"):
        wio.VarBuilder.from_dict([("a", np.zeros(1))])
    with pytest.raises(TypeError, match="unexpected option"):
        wio.VarBuilder.from_dict({}, base_prefix="bert")


def test_returned_views_outlive_the_builder():
    vb = wio.VarBuilder.from_path(BERT)
    w = vb.get((32, 32), Q)
    vb.close()
    gc.collect()
    np.testing.assert_array_equal(w, _reference(BERT)[Q])
    with pytest.raises(WeightioError, match="the checkpoint was closed"):
        vb.get((32, 32), Q)


# ----------------------------------------------------------------------------- renames


def test_renames_callable_dict_and_regex():
    tensors = {"model.layers.0.mlp.w": np.arange(2.0), "model.norm.w": np.arange(3.0)}
    vb = wio.VarBuilder.from_dict(tensors)
    by_fn = vb.rename(lambda n: "model." + n)
    assert by_fn.pp("layers").pp(0).get(2, "mlp.w").tolist() == [0.0, 1.0]
    by_dict = vb.rename({"norm": "model.norm.w"})
    assert by_dict.get(3, "norm").tolist() == [0.0, 1.0, 2.0]
    assert not by_dict.contains("other")  # names not in the dict pass through unchanged
    by_rules = vb.rename([(r"^h\.(\d+)\.", r"model.layers.\1."), (r"\.mlp_w$", ".mlp.w")])
    assert by_rules.get(2, "h.0.mlp_w").tolist() == [0.0, 1.0]
    hidden = vb.rename(lambda n: None if n.startswith("model.norm") else n)
    assert not hidden.contains("model.norm.w") and hidden.contains("model.layers.0.mlp.w")
    assert vb.report().renamed == {"layers.0.mlp.w": "model.layers.0.mlp.w", "norm": "model.norm.w",
                                   "h.0.mlp_w": "model.layers.0.mlp.w"}


def test_renames_stack_newest_first_like_candle():
    vb = wio.VarBuilder.from_dict({"ckpt.x": np.zeros(1)})
    calls = []

    def f(n):
        calls.append(("f", n))
        return n.replace("model.", "ckpt.")

    def g(n):
        calls.append(("g", n))
        return "model." + n

    stacked = vb.rename(f).rename(g)
    assert stacked.get(1, "x").shape == (1,)
    assert calls == [("g", "x"), ("f", "model.x")]
    assert vb.rename(g).rename(f).contains("x") is False  # the other order looks up 'model.x'


def test_a_rename_must_return_a_name():
    vb = wio.VarBuilder.from_dict({"x": np.zeros(1)}).rename(lambda n: 3)
    with pytest.raises(TypeError, match="a rename must return a str or None, got int for 'x'"):
        vb.get(1, "x")


@given(st.lists(st.from_regex(r"[a-z_]{1,6}", fullmatch=True), min_size=1, max_size=4), st.integers(0, 99))
@settings(max_examples=50, deadline=None)
def test_regex_renames_match_re_sub_in_sequence(parts, layer):
    import re

    name = ".".join(parts) + f".{layer}.w"
    rules = [(r"\.(\d+)\.", r".layers.\1."), (r"^", "model.")]
    expected = re.sub(r"^", "model.", re.sub(r"\.(\d+)\.", r".layers.\1.", name))
    assert renamer(rules)(name) == expected


# ----------------------------------------------------------------------------- automatic resolution


def test_legacy_layernorm_and_weight_norm_names_both_ways():
    old = {"emb.LayerNorm.gamma": np.ones(4), "emb.LayerNorm.beta": np.zeros(4), "conv.weight_g": np.ones(2),
           "conv.weight_v": np.ones((2, 3))}
    vb = wio.VarBuilder.from_dict(old)
    assert vb.get(4, "emb.LayerNorm.weight").tolist() == [1.0] * 4
    assert vb.get(4, "emb.LayerNorm.bias").tolist() == [0.0] * 4
    assert vb.get(2, "conv.parametrizations.weight.original0").shape == (2,)
    assert vb.get((2, 3), "conv.parametrizations.weight.original1").shape == (2, 3)
    new = wio.VarBuilder.from_dict({"LayerNorm.weight": np.ones(4), "x.LayerNorm.bias": np.zeros(4)})
    assert new.get(4, "LayerNorm.gamma").shape == (4,) and new.get(4, "x.LayerNorm.beta").shape == (4,)
    assert not new.contains("xLayerNorm.beta")  # a whole component, not any suffix
    assert vb.report().renamed["emb.LayerNorm.weight"] == "emb.LayerNorm.gamma"
    assert ("LayerNorm.weight", "LayerNorm.gamma") in LEGACY_SUFFIXES


def test_strip_a_base_model_prefix_classification_checkpoint_into_the_base_model():
    # bert.* + classifier.*: a base model asks for encoder.… and gets bert.encoder.…
    reference = _reference(CLS / "model.safetensors")
    with wio.VarBuilder.from_path(CLS) as vb:
        w = vb.pp("encoder").pp("layer").pp(1).get((32, 32), "attention.self.key.weight")
        np.testing.assert_array_equal(w, reference["bert.encoder.layer.1.attention.self.key.weight"])
        assert vb.get(32, "embeddings.LayerNorm.weight").shape == (32,)
        assert not vb.contains("weight")  # classifier.weight is not under the prefix
        report = vb.report()
        assert report.base_model_prefix == "bert"
        assert report.renamed == {"encoder.layer.1.attention.self.key.weight":
                                  "bert.encoder.layer.1.attention.self.key.weight",
                                  "embeddings.LayerNorm.weight": "bert.embeddings.LayerNorm.weight"}


def test_add_a_base_model_prefix_base_checkpoint_into_a_model_with_a_head():
    reference = _reference(BERT)
    with wio.VarBuilder.from_path(BERT) as vb:
        w = vb.pp("bert").pp("encoder").get((32, 32), "layer.0.attention.self.query.weight")
        np.testing.assert_array_equal(w, reference[Q])
        assert vb.report().base_model_prefix == "bert"
        with pytest.raises(TensorNotFoundError, match=r"tensor 'classifier.weight': no such tensor \(base-model "
                                                      r"prefix 'bert'\)"):
            vb.get((3, 32), "classifier.weight")
        # P is fixed: another leading component is no longer stripped
        assert not vb.contains("roberta.encoder.layer.0.attention.self.query.weight")


def test_the_prefix_decision_is_made_once_and_contains_never_makes_it():
    tensors = {"model.layers.0.w": np.zeros(1), "model.layers.1.w": np.zeros(1), "model.norm.w": np.zeros(1),
               "lm_head.w": np.zeros(1)}
    vb = wio.VarBuilder.from_dict(tensors)
    assert vb.contains("layers.0.w") and vb.report().base_model_prefix is None
    assert vb.contains("decoder.lm_head.w")  # the add direction: 'decoder' is not in the checkpoint
    assert vb.report().base_model_prefix is None
    vb.get(1, "layers.1.w")
    assert vb.report().base_model_prefix == "model"
    assert not vb.contains("decoder.lm_head.w")  # one prefix per builder: 'decoder' is not tried now


def test_inference_needs_a_majority_and_no_ambiguity():
    # 'pooler' holds 1 of 3 tensors: asking for 'dense.w' must not silently return pooler.dense.w
    few = wio.VarBuilder.from_dict({"pooler.dense.w": np.zeros(1), "embeddings.w": np.zeros(1),
                                    "encoder.w": np.zeros(1)})
    with pytest.raises(TensorNotFoundError) as info:
        few.get(1, "dense.w")
    assert info.value.suggestions[0] == "pooler.dense.w"
    assert few.report().base_model_prefix is None


def test_given_base_model_prefix_and_auto_prefix_off():
    tensors = {"enc.a": np.zeros(1), "head.b": np.zeros(1)}  # no majority: inference cannot pick 'enc'
    assert not wio.VarBuilder.from_dict(tensors).contains("a")
    given_vb = wio.VarBuilder.from_dict(tensors, base_model_prefix="enc")
    assert given_vb.contains("a") and not given_vb.contains("b")
    off = wio.VarBuilder.from_path(CLS, auto_prefix=False)
    assert not off.contains("pooler.dense.weight") and off.contains("bert.pooler.dense.weight")
    off.close()


@pytest.mark.parametrize("wrap", ["module.{}", "_orig_mod.{}", "module._orig_mod.{}", "_orig_mod.module.{}"])
def test_ddp_and_torch_compile_wrappers(tmp_path, wrap):
    reference = _reference(BERT)
    path = _save(tmp_path, "wrapped.safetensors", {wrap.format(k): v for k, v in reference.items()})
    with wio.VarBuilder.from_path(path) as vb:
        np.testing.assert_array_equal(vb.pp("encoder").get((32, 32), "layer.0.attention.self.query.weight"),
                                      reference[Q])
        assert vb.report().renamed == {Q: wrap.format(Q)}
        assert vb.report().base_model_prefix is None


def test_compile_wrapper_inside_a_submodule_and_a_module_component_kept():
    tensors = {"encoder._orig_mod.layer.w": np.zeros(1), "fc.module.weight": np.zeros(2)}
    vb = wio.VarBuilder.from_dict(tensors)
    assert vb.contains("encoder.layer.w")
    assert vb.contains("fc.module.weight") and not vb.contains("fc.weight")  # 'module.' inside is a real name
    assert not wio.VarBuilder.from_dict({"module.a": np.zeros(1), "b": np.zeros(1)}).contains("a")  # not all


def test_wrappers_combine_with_the_base_model_prefix_and_legacy_names(tmp_path):
    tensors = {"module.bert.emb.LayerNorm.gamma": np.ones(2), "module.bert.enc.w": np.zeros(1),
               "module.bert.enc.v": np.zeros(1), "module.classifier.w": np.zeros(3)}
    vb = wio.VarBuilder.from_dict(tensors)
    assert vb.get(2, "emb.LayerNorm.weight").tolist() == [1.0, 1.0]
    assert vb.report().renamed == {"emb.LayerNorm.weight": "module.bert.emb.LayerNorm.gamma"}
    assert vb.report().base_model_prefix == "bert"


def test_renames_run_before_the_automatic_rules():
    vb = wio.VarBuilder.from_path(CLS).rename({"q": "encoder.layer.0.attention.self.query.weight"})
    assert vb.get((32, 32), "q").shape == (32, 32)
    assert vb.report().renamed == {"q": "bert.encoder.layer.0.attention.self.query.weight"}
    vb.close()


# ----------------------------------------------------------------------------- the report


def test_report_used_unused_missing_and_finish():
    tensors = {"a.w": np.zeros(2), "a.b": np.zeros(2), "c.w": np.zeros(3)}
    vb = wio.VarBuilder.from_dict(tensors)
    vb.get(2, "a.w")
    with pytest.raises(TensorNotFoundError):
        vb.get(2, "a.x")
    report = vb.report()
    assert isinstance(report, LoadReport)
    assert (report.used, report.unused, report.missing) == (("a.w",), ("a.b", "c.w"), ("a.x",))
    assert report.bytes_read == 16 and not report.ok
    assert str(report) == "used 1 of 3 tensors (16 bytes read)\nmissing (1): a.x\nunused (2): a.b, c.w"
    with pytest.raises(TensorNotFoundError) as info:
        vb.finish()
    assert str(info.value) == ("<dict>: tensor 'a.x': 1 tensor(s) asked for but not in the checkpoint: a.x; "
                               "unused: a.b, c.w")
    assert vb.finish(strict=False) == report


def test_finish_on_unused_only_and_on_a_caught_mismatch():
    vb = wio.VarBuilder.from_dict({"a": np.zeros(2), "b": np.zeros(2)})
    vb.get(2, "a")
    with pytest.raises(WeightioError, match=r"<dict>: 1 stored tensor\(s\) were never used: b; pass strict=False"):
        vb.finish()
    with pytest.raises(ShapeMismatchError):
        vb.get(3, "b")
    with pytest.raises(ShapeMismatchError, match=r"tensor 'b': expected shape \(3,\), found \(2,\) \(1 mismatch"):
        vb.finish()
    vb.get(2, "b")
    with pytest.raises(ShapeMismatchError):  # the refused request stays on record
        vb.finish()


def test_a_cursor_reports_on_its_part_of_the_checkpoint():
    # Partial loading: only the encoder is loaded; its cursor reports it complete while the
    # root still sees the embeddings and pooler as unused.
    reference = _reference(CLS / "model.safetensors")
    with wio.VarBuilder.from_path(CLS) as vb:
        encoder = vb.pp("encoder")
        names = [n[len("bert.encoder."):] for n in reference if n.startswith("bert.encoder.")]
        for name in names:
            encoder.get(reference["bert.encoder." + name].shape, name)
        scoped = encoder.finish()
        assert scoped.unused == () and len(scoped.used) == len(names)
        assert scoped.bytes_read == sum(reference["bert.encoder." + n].nbytes for n in names)
        root = vb.report()
        assert set(root.unused) == {n for n in reference if not n.startswith("bert.encoder.")}
        layer = encoder.pp("layer").pp(1)
        assert layer.report().unused == () and all(u.startswith("bert.encoder.layer.1.") for u in layer.report().used)
        untouched = vb.pp("pooler").report()  # nothing asked under it: its scope is its literal prefix
        assert untouched.used == () and untouched.unused == ()


def test_a_report_names_the_last_stored_tensor_asked_for_and_every_use_of_a_tensor():
    """One asked name resolved to two stored tensors (through a rename cursor): the report names
    the one its last request resolved to and counts the bytes of all; a tensor used by a request
    outside a cursor's prefix (a rename) is not unused in that cursor's report."""
    stored = {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32), "enc.w": np.zeros(4, np.float32),
              "enc.v": np.zeros(1, np.float32)}
    vb = wio.VarBuilder.from_dict(stored)
    vb.get(2, "a")
    vb.rename({"a": "b"}).get(3, "a")
    vb.get(2, "a")
    report = vb.report()
    assert (report.used, report.renamed, report.bytes_read) == (("a",), {}, (2 + 3 + 2) * 4)
    assert report.unused == ("enc.w", "enc.v")  # "b" was read too
    vb.rename({"a": "b"}).get(3, "a")
    assert (vb.report().used, vb.report().renamed) == (("b",), {"a": "b"})
    vb.rename({"x": "enc.w"}).get(4, "x")
    assert vb.pp("enc").report().unused == ("enc.v",)
    vb.get(2, "a")
    vb.rename({"a": "b"}).get(3, "a")  # (one fold: its last request, not its first, names the tensor)
    assert vb.report().used == ("b", "enc.w")


def test_a_bool_equal_to_a_stored_dimension_is_refused_on_the_short_path(tmp_path):
    path = _save(tmp_path, "one.safetensors", {"one": np.ones(1, np.float32), "two": np.ones((1, 1), np.float32)})
    with wio.VarBuilder.from_path(path) as vb:
        assert vb._plain is not None  # (the short path is taken for stored names)
        for shape, name in (((True,), "one"), ((1, True), "two"), ((1.0, 1), "two")):
            with pytest.raises(TypeError, match="a shape is an int or a sequence of ints"):
                vb.get(shape, name)
        assert vb.get((np.int64(1), 1), "two").tolist() == [[1.0]] and vb.get((1,), "one").tolist() == [1.0]


def test_long_listings_are_shortened():
    vb = wio.VarBuilder.from_dict({f"t{i}": np.zeros(1) for i in range(13)})
    assert str(vb.report()).endswith("unused (13): t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, … and 3 more")


# ----------------------------------------------------------------------------- load_all


def test_load_all_under_a_cursor_and_the_whole_checkpoint():
    reference = _reference(BERT)
    with wio.VarBuilder.from_path(BERT) as vb:
        layer = vb.pp("encoder.layer.0").load_all()
        assert sorted(layer) == sorted(n[len("encoder.layer.0."):] for n in reference
                                       if n.startswith("encoder.layer.0."))
        np.testing.assert_array_equal(layer["attention.self.query.weight"], reference[Q])
        everything = vb.load_all(dtype="float16")
        assert sorted(everything) == sorted(reference) and all(a.dtype == np.float16 for a in everything.values())
        assert vb.report().unused == ()


def test_many_gets_in_one_transfer_answer_as_get_does():
    # load_into's path to a GPU (tests/test_torch_workflows.py drives it through a staged stand-in)
    requests = [((32, 32), "query.weight", None), ((32,), "query.bias", "float16"), ((32, 32), "key.weight", "int32")]
    with wio.VarBuilder.from_path(BERT) as vb, wio.VarBuilder.from_path(BERT) as other:
        cursor = vb.pp("encoder.layer.0.attention.self")
        got = cursor._get_many(requests)
        want = [other.pp("encoder.layer.0.attention.self").get(*r) for r in requests]
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
        assert got[1].dtype == np.float16 and got[2].dtype == np.int32
        assert vb.report().used == other.report().used
    with wio.VarBuilder.from_path(BERT) as vb:  # every shape is checked before anything is read
        cursor = vb.pp("encoder.layer.0.attention.self")
        with pytest.raises(ShapeMismatchError, match=r"expected shape \(3, 32\), found \(32, 32\)"):
            cursor._get_many([((32,), "query.bias", None), ((3, 32), "value.weight", None)])
        with pytest.raises(TensorNotFoundError):
            cursor._get_many([((32,), "query.bias", None), ((32,), "nope", None)])
        assert vb.report().used == ()


# ----------------------------------------------------------------------------- tensor parallel


def test_get_sharded_along_each_dim():
    full = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    vb = wio.VarBuilder.from_dict({"w": full})
    for dim, ws in ((0, 2), (1, 3), (2, 4), (-1, 2), (0, 1)):
        parts = [vb.get_sharded((4, 6, 8), "w", dim, rank, ws) for rank in range(ws)]
        assert all(p.shape[dim] == full.shape[dim] // ws for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts, axis=dim), full)
    assert vb.report().bytes_read == 5 * full.nbytes  # each rank counted its own share


def test_get_sharded_reads_views_of_the_mapping(tmp_path):
    full = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    path = _save(tmp_path, "w.safetensors", {"w": full})
    with wio.VarBuilder.from_path(path) as vb:
        whole = vb.get((64, 32), "w")
        rows = vb.get_sharded((64, 32), "w", 0, 1, 2)
        cols = vb.get_sharded(None, "w", 1, 1, 4)
        base = whole.__array_interface__["data"][0]
        assert rows.flags.c_contiguous and rows.__array_interface__["data"][0] == base + 32 * 32 * 4
        assert not cols.flags.c_contiguous and cols.strides == (128, 4)  # strided rows: no copy
        assert cols.__array_interface__["data"][0] == base + 8 * 4
        np.testing.assert_array_equal(cols, full[:, 8:16])
        assert vb.report().bytes_read == full.nbytes + full.nbytes // 2 + full.nbytes // 4


@pytest.mark.parametrize("args,message", [
    (((4, 6), "w", 0, 0, 3), "dim 0 of shape (4, 6) has size 4, which does not split into 3 equal shards"),
    (((4, 6), "w", 2, 0, 2), "cannot shard a tensor of shape (4, 6) along dim 2"),
    (((4, 6), "w", 0, 2, 2), "rank 2 is outside world_size 2"),
    (((4, 6), "w", 0, 0, 0), "rank 0 is outside world_size 0"),
    (((6, 4), "w", 0, 0, 2), "expected shape (6, 4), found (4, 6)"),
])
def test_get_sharded_errors(args, message):
    vb = wio.VarBuilder.from_dict({"w": np.zeros((4, 6))})
    with pytest.raises(ShapeMismatchError) as info:
        vb.get_sharded(*args)
    assert str(info.value) == f"<dict>: tensor 'w': {message}"
    with pytest.raises(TypeError, match="dim, rank and world_size are ints"):
        vb.get_sharded(None, "w", 0, 0.0, 2)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
@settings(max_examples=60, deadline=None)
def test_shards_concatenate_to_the_whole_tensor(factors, data):
    ws = data.draw(st.integers(1, 4))
    dim = data.draw(st.integers(0, len(factors) - 1))
    shape = tuple(f * (ws if i == dim else 1) for i, f in enumerate(factors))
    full = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    vb = wio.VarBuilder.from_dict({"t": full})
    parts = [vb.get_sharded(shape, "t", dim, r, ws) for r in range(ws)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=dim), full)


def test_index_file_by_path_with_its_metadata(tmp_path):
    index = json.loads((SHARDED / "model.safetensors.index.json").read_text())
    with wio.VarBuilder.from_path(SHARDED / "model.safetensors.index.json") as vb:
        assert len(vb._shared.store.names) == len(index["weight_map"])


@pytest.mark.parametrize("path", sorted(manifest()))
def test_every_fixture_of_every_format_through_a_builder(path):
    # Any reader behind the Checkpoint mapping serves a builder: safetensors, PyTorch zip and
    # legacy pickles, GGUF (quantized tensors dequantized), ggml, npz/npy. Hashes are the writers'.
    with wio.VarBuilder.from_path(FIXTURES / path) as vb:
        for name, spec in manifest()[path].items():
            if spec["dtype"] == "F4":  # packed sub-byte: no numpy view (TensorView.raw() serves it)
                continue
            assert digest(vb.get(tuple(spec["shape"]), name)) == spec["sha256"], name
        assert vb.report().missing == ()
