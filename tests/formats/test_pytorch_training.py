"""Training checkpoints (fixtures/gen_training.py): what Lightning, OmegaConf, transformers' Trainer
and ``torch.save(model)`` put beside the tensors, read as plain data without those libraries, and
the placeholder mode (``unknown_globals="placeholder"``) on whole pickled models.

Expected values are those the writing libraries hold (``fixtures/training/manifest.json``, written
by the generator after ``torch.load(weights_only=False)`` read the files back)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from weightio.cli import main

import weightio as wio
from weightio.errors import UnsafePickleError, UsageError
from weightio.formats.pytorch import PyTorchReader

from ..conftest import FIXTURES, digest

TR = FIXTURES / "training"
EXPECTED = json.loads((TR / "manifest.json").read_text())
WHOLE = ["whole_model.pt", "whole_model_legacy.pt"]
REPLACED = ["gen_training.TinyNet", "torch.nn.modules.sparse.Embedding", "torch.nn.modules.container.ModuleList",
            "gen_training.Block", "torch.nn.modules.linear.Linear", "torch.nn.modules.container.Sequential",
            "torch.nn.modules.activation.ReLU", "torch.nn.modules.container.ModuleDict"]


@pytest.mark.parametrize("name", ["lightning_omegaconf.ckpt", "training_args.bin", "objects.pt"])
def test_training_objects_surface_as_the_libraries_plain_values(name):
    with wio.open(TR / name) as ckpt:
        expected = EXPECTED[f"training/{name}"]["metadata"]
        assert {k: ckpt.metadata[k] for k in expected} == expected
        assert "weightio.placeholders" not in ckpt.metadata  # nothing needed a placeholder


def test_plain_data_is_plain_types():
    with wio.open(TR / "objects.pt") as ckpt:
        for key in ("torch_version", "paths.posix", "saved_at", "elapsed", "zone"):
            assert type(ckpt.metadata[key]) is str, key
    with wio.open(TR / "lightning_omegaconf.ckpt") as ckpt:
        assert type(ckpt.metadata["hyper_parameters.model.dims"]) is list
        np.testing.assert_array_equal(ckpt["state_dict.layer.weight"].numpy().shape, (1, 2))


def test_the_lightning_checkpoint_reads_every_tensor_and_value():
    with wio.open(TR / "lightning_omegaconf.ckpt") as ckpt:
        assert list(ckpt) == ["state_dict.layer.weight", "state_dict.layer.bias"]
        assert ckpt.metadata["hyper_parameters.lr_copy"] == "${lr}"  # interpolations are kept, not resolved
        assert ckpt.metadata["optimizer_states.0.param_groups.0.lr"] == 0.1


@pytest.mark.parametrize("name", WHOLE)
def test_whole_models_are_refused_by_default_naming_the_first_global(name):
    with pytest.raises(UnsafePickleError, match="asks for global 'gen_training.TinyNet', which is not on weightio's "
                                                "allowlist; nothing was imported or run"):
        wio.open(TR / name)


@pytest.mark.parametrize("name", WHOLE)
def test_whole_models_read_by_placeholder_are_their_state_dict(name):
    spec = EXPECTED[f"training/{name}"]
    with wio.open(TR / name, unknown_globals="placeholder") as ckpt:
        assert list(ckpt) == spec["names"]  # state_dict() order; the non-persistent buffers are left out
        for tensor, want in spec["tensors"].items():
            assert digest(ckpt[tensor].numpy()) == want["sha256"], tensor
        for group in spec["tied"]:
            first = ckpt[group[0]].numpy()
            assert all(np.shares_memory(first, ckpt[other].numpy()) for other in group[1:])
        assert ckpt.metadata == {"weightio.placeholders": REPLACED}


def test_the_reader_lists_replaced_globals_and_defaults_to_refuse():
    reader = PyTorchReader(TR / "whole_model.pt", unknown_globals="placeholder")
    assert reader.placeholders == REPLACED
    reader.close()
    with pytest.raises(UnsafePickleError):
        PyTorchReader(TR / "whole_model.pt")


def test_the_option_reaches_load_varbuilder_and_convert(tmp_path):
    spec = EXPECTED["training/whole_model.pt"]
    arrays = wio.load(TR / "whole_model.pt", unknown_globals="placeholder")
    assert list(arrays) == spec["names"]
    with wio.VarBuilder.from_path(TR / "whole_model.pt", unknown_globals="placeholder") as vb:
        assert vb.pp("blocks").pp(1).get((3, 3), "lin.weight").shape == (3, 3)
    from weightio.convert import convert

    out = tmp_path / "model.safetensors"
    convert(TR / "whole_model.pt", out, unknown_globals="placeholder", verify=True)
    with wio.open(out) as back:
        for tensor, want in spec["tensors"].items():
            if tensor in back:
                assert digest(back[tensor].numpy()) == want["sha256"]
    with pytest.raises(UnsafePickleError):
        convert(TR / "whole_model.pt", tmp_path / "refused.safetensors")


def test_an_unknown_mode_is_a_usage_error():
    from weightio.formats.pytorch import PyTorchReader

    message = "unknown_globals must be one of 'refuse', 'placeholder', not 'allow'"
    with pytest.raises(UsageError, match=message):
        wio.open(TR / "objects.pt", unknown_globals="allow")
    with pytest.raises(UsageError, match=message):  # the reader's own argument: the same check, the same words
        PyTorchReader(TR / "objects.pt", unknown_globals="allow")
    with pytest.raises(UsageError, match=r"not \['placeholder'\]"):
        wio.open(TR / "objects.pt", unknown_globals=["placeholder"])


def test_placeholder_mode_reads_ordinary_files_as_before():
    for name in ("lightning_omegaconf.ckpt", "objects.pt"):
        with wio.open(TR / name) as a, wio.open(TR / name, unknown_globals="placeholder") as b:
            assert list(a) == list(b) and a.metadata == b.metadata


def test_inspect_lists_the_replaced_globals_in_text_and_json():
    text = CliRunner().invoke(main, ["inspect", str(TR / "whole_model.pt"), "--unknown-globals", "placeholder"])
    assert text.exit_code == 0, text.output
    assert ("  replaced    8 globals by placeholders (never imported or run): gen_training.TinyNet, "
            "torch.nn.modules.sparse.Embedding, ") in text.output
    assert "lm_head.weight" in text.output
    doc = json.loads(CliRunner().invoke(main, ["inspect", str(TR / "whole_model.pt"), "--json",
                                               "--unknown-globals", "placeholder"]).output)
    assert doc["placeholders"] == REPLACED and doc["tensor_count"] == len(EXPECTED["training/whole_model.pt"]["names"])
    refused = CliRunner().invoke(main, ["inspect", str(TR / "whole_model.pt")])
    assert refused.exit_code == 1 and "gen_training.TinyNet" in refused.output
    plain = json.loads(CliRunner().invoke(main, ["inspect", str(TR / "objects.pt"), "--json"]).output)
    assert plain["placeholders"] == []


def test_show_diff_and_convert_take_the_option(tmp_path):
    show = CliRunner().invoke(main, ["show", str(TR / "whole_model.pt"), "lm_head.weight", "--unknown-globals",
                                     "placeholder"])
    assert show.exit_code == 0 and "[5, 3]" in show.output, show.output
    diff = CliRunner().invoke(main, ["diff", str(TR / "whole_model.pt"), str(TR / "whole_model_legacy.pt"),
                                     "--unknown-globals", "placeholder"])
    assert diff.exit_code == 0, diff.output
    out = tmp_path / "m.safetensors"
    conv = CliRunner().invoke(main, ["convert", str(TR / "whole_model.pt"), str(out), "--unknown-globals",
                                     "placeholder"])
    assert conv.exit_code == 0 and out.exists(), conv.output


def test_scan_still_reports_whole_models_unsafe():
    report = wio.scan(TR / "whole_model.pt")
    assert not report.safe


def test_against_torch_load_when_torch_is_installed(monkeypatch):
    torch = pytest.importorskip("torch")
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(FIXTURES))  # torch.load needs the model's classes; weightio never does
    monkeypatch.delitem(sys.modules, "gen_training", raising=False)
    real = importlib.import_module("gen_training")
    real.Block, real.TinyNet = real._module_classes()
    try:
        for name in WHOLE:
            with warnings.catch_warnings():  # (the classes' source as torch 2.13 saved it: a later torch's differs)
                warnings.simplefilter("ignore", torch.serialization.SourceChangeWarning)
                state = torch.load(TR / name, weights_only=False).state_dict()
            with wio.open(TR / name, unknown_globals="placeholder") as ckpt:
                assert list(ckpt) == list(state)
                for key, t in state.items():
                    np.testing.assert_array_equal(ckpt[key].numpy(), t.numpy())
    finally:
        sys.modules.pop("gen_training", None)
