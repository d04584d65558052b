"""The error hierarchy: messages name the file and tensor; pickling keeps them."""

from __future__ import annotations

import errno
import pickle

import pytest

import weightio as wio
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
