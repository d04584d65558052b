"""The error hierarchy: messages name the file and tensor; pickling keeps them."""

from __future__ import annotations

import difflib
import errno
import pickle
from pathlib import Path

import pytest

import weightio as wio
from weightio import errors

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_hierarchy():
    for cls in (errors.FormatError, errors.CorruptFileError, errors.UnsafePickleError, errors.TensorNotFoundError,
                errors.ShapeMismatchError, errors.UnsupportedDTypeError, errors.InputError, errors.WriteError):
        assert issubclass(cls, errors.WeightioError)
    assert issubclass(errors.TensorNotFoundError, KeyError)
    assert issubclass(errors.InputError, OSError) and issubclass(errors.WriteError, OSError)


def test_messages_render_file_then_tensor():
    e = errors.CorruptFileError("offsets overlap", path="m.safetensors", tensor="w")
    assert str(e) == "m.safetensors: tensor 'w': offsets overlap"
    assert (e.path, e.tensor, e.message) == ("m.safetensors", "w", "offsets overlap")
    assert str(errors.FormatError("plain")) == "plain"


def test_not_found_is_a_key_error_with_a_readable_message():
    e = errors.TensorNotFoundError("encoder.wieght", ["encoder.weight", "decoder.weight", "x"], path="p")
    assert str(e) == "p: tensor 'encoder.wieght': no such tensor; did you mean 'encoder.weight', 'decoder.weight'?"
    with pytest.raises(KeyError):
        raise e


# expert names as DeepSeek-V3 spells them, 61 layers x 8 experts x 3 (1,464: more than close_matches compares)
MOE = [f"model.layers.{i}.mlp.experts.{e}.{p}.weight" for i in range(61) for e in range(8)
       for p in ("gate_proj", "up_proj", "down_proj")]


@pytest.mark.parametrize("asked, first", [
    ("model.layers.30.mlp.experts.7.up_proj.weigh", "model.layers.30.mlp.experts.7.up_proj.weight"),  # last part
    ("model.layers.30.mlp.expert.7.up_proj.weight", "model.layers.30.mlp.experts.7.up_proj.weight"),  # a middle one
    ("model.layer.30.mlp.experts.7.up_proj.weight", "model.layers.30.mlp.experts.7.up_proj.weight"),  # the first
    ("layers.30.mlp.experts.7.up_proj.weight", "model.layers.30.mlp.experts.7.up_proj.weight"),  # a prefix less
    ("bert.model.layers.30.mlp.experts.7.up_proj.weight", "model.layers.30.mlp.experts.7.up_proj.weight"),  # more
])
def test_a_large_pool_suggests_what_a_whole_search_would(asked, first):
    """Of a pool too large for difflib to compare whole (10 s at DeepSeek-V3's 92k names), the names
    sharing the most components with the asked one are compared: the best match is the same."""
    assert len(MOE) > errors._COMPARED
    found = errors.close_matches(asked, MOE)
    assert found[0] == first and len(found) == 3
    assert found[0] == difflib.get_close_matches(asked, MOE, n=1, cutoff=0.6)[0]  # what the whole search finds


def test_a_name_that_is_no_str_is_not_found_without_suggestions():
    e = errors.TensorNotFoundError(7, ["encoder.weight"], path="p")
    assert isinstance(e, KeyError) and e.suggestions == []
    assert str(e) == "p: tensor 7: no such tensor; its one tensor is 'encoder.weight'"
    with wio.open(FIXTURES / "tiny-bert" / "model.safetensors") as ckpt:
        with pytest.raises(KeyError):
            ckpt[7]
        assert ckpt.get(7, "none") == "none" and ckpt.get("encoder") is None


@pytest.mark.parametrize("err", [
    errors.CorruptFileError("bad", path="f", tensor="t"),
    errors.TensorNotFoundError("a", ["ab"], path="f"),
])
def test_errors_survive_pickling(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.path == "f"


@pytest.mark.parametrize("cls, code, std, made", [
    (errors.InputError, errno.ENOENT, FileNotFoundError, errors.InputFileNotFoundError),
    (errors.InputError, errno.EACCES, PermissionError, errors.InputPermissionError),
    (errors.InputError, errno.EPERM, PermissionError, errors.InputPermissionError),
    (errors.InputError, errno.EISDIR, IsADirectoryError, errors.InputIsADirectoryError),
    (errors.InputError, errno.ENOTDIR, NotADirectoryError, errors.InputNotADirectoryError),
    (errors.WriteError, errno.EEXIST, FileExistsError, errors.WriteFileExistsError),
    (errors.WriteError, errno.EACCES, PermissionError, errors.WritePermissionError),
    (errors.WriteError, errno.EISDIR, IsADirectoryError, errors.WriteIsADirectoryError),
    (errors.WriteError, errno.ENOTDIR, NotADirectoryError, errors.WriteNotADirectoryError),
])
def test_os_errors_are_the_standard_subclass_their_errno_names(cls, code, std, made):
    e = cls("cannot", path="f", errno=code)
    assert type(e) is made and isinstance(e, std) and isinstance(e, cls) and e.errno == code
    assert str(e) == "f: cannot"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is made and back.errno == code and str(back) == "f: cannot"


def test_other_errnos_and_none_stay_the_base_class():
    assert type(errors.InputError("x", errno=errno.ENOMEM)) is errors.InputError
    assert type(errors.WriteError("x", errno=errno.ENOSPC)) is errors.WriteError
    assert type(errors.InputError("x")) is errors.InputError and errors.InputError("x").errno is None
    e = errors.InputFileNotFoundError("x", path="f", errno=errno.EACCES)  # a subclass asked for by name stays it
    assert type(e) is errors.InputFileNotFoundError and e.errno == errno.EACCES and str(e) == "f: x"


def test_a_missing_checkpoint_is_caught_as_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        wio.open(tmp_path / "missing.safetensors")
    assert isinstance(info.value, errors.InputError) and info.value.errno == errno.ENOENT
    assert str(info.value) == f"{tmp_path / 'missing.safetensors'}: no such file or directory"
