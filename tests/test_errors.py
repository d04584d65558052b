"""The error hierarchy: messages name the file and tensor; pickling keeps them."""

from __future__ import annotations

import pickle

import pytest

from weightio import errors


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


@pytest.mark.parametrize("err", [
    errors.CorruptFileError("bad", path="f", tensor="t"),
    errors.TensorNotFoundError("a", ["ab"], path="f"),
])
def test_errors_survive_pickling(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.path == "f"
