"""Format detection from bytes, never from the file name."""

from __future__ import annotations

import shutil
import struct
import tarfile

import numpy as np
import pytest

import weightio as wio
from weightio._io import MappedFile
from weightio.errors import CorruptFileError, FormatError, InputError
from weightio.formats.sniff import sniff

from .conftest import FIXTURES
from .hostile import tar_header


@pytest.mark.parametrize("fixture,fmt", [
    ("numpy.safetensors", "safetensors"),
    ("numpy/c_order.npy", "npy"),
    ("numpy/arrays.npz", "npz"),
    ("numpy/compressed.npz", "npz"),
])
def test_formats_are_sniffed_whatever_the_suffix(tmp_path, fixture, fmt):
    renamed = tmp_path / "weights.bin"
    shutil.copy(FIXTURES / fixture, renamed)
    file = MappedFile(renamed)
    try:
        assert sniff(file) == fmt
    finally:
        file.close()
    with wio.open(renamed) as ckpt:
        assert ckpt.format == fmt


@pytest.mark.parametrize("content,fmt", [
    (b"GGUF\x03\x00\x00\x00" + b"\0" * 16, "gguf"),
    (b"tjgg\x03\x00\x00\x00", "ggml"),
    (b"lmgg" + b"\0" * 8, "ggml"),
    (b"fmgg\x01\x00\x00\x00", "ggml"),
    (b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.", "pytorch"),
    (tarfile.TarInfo("x").tobuf(tarfile.USTAR_FORMAT) + bytes(1024), "pytorch"),  # what tarfile opens is torch's tar
    (tar_header(b"storages") + bytes(1024), "pytorch"),  # with or without the ustar magic
])
def test_other_formats_are_recognised(write, content, fmt):
    file = MappedFile(write("x.bin", content))
    try:
        assert sniff(file) == fmt
    finally:
        file.close()


@pytest.mark.parametrize("content,message", [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n",
     "is a Git LFS pointer file, not the weights: run `git lfs pull`"),
    (b"<!DOCTYPE html><html><body>404</body></html>", "is an HTML page, not weights (a failed download?)"),
    (b"\x89HDF\r\n\x1a\n" + b"\0" * 32, "is an HDF5 file (Keras .h5)"),
    (b"\x1f\x8b\x08\x00" + b"\0" * 20, "is gzip-compressed; decompress it first"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 20, "is a PNG image, not weights"),
    (b"hello world, not a model", "is not a checkpoint format weightio reads (safetensors, PyTorch, GGUF, ggml, "
                                  "npz, npy); it starts with b'hello world, not'"),
    (b"x", "is not a checkpoint format weightio reads"),
])
def test_unknown_content_says_what_it_looks_like(write, content, message):
    path = write("model.safetensors", content)
    with pytest.raises(FormatError) as info:
        wio.open(path)
    assert str(info.value) == f"{path}: {message}" or message in str(info.value)


def test_empty_file_and_non_files(tmp_path, write):
    with pytest.raises(CorruptFileError, match=r"empty file \(0 bytes\)"):
        wio.open(write("empty.safetensors", b""))
    with pytest.raises(InputError, match="no such file or directory"):
        wio.open(tmp_path / "missing.safetensors")
    fifo = tmp_path / "pipe"
    import os

    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"is a FIFO \(named pipe\), not a checkpoint file"):
        wio.open(fifo)  # must not block waiting for a writer
    with pytest.raises(InputError, match="is a character device"):
        wio.open("/dev/null")


def test_a_safetensors_header_that_decodes_as_pickle_opcodes_is_still_safetensors(write):
    # the 8-byte length 0x80 0x02 ... reads as PROTO 2 to a naive pickle sniffer
    header = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    header += b" " * (0x280 - len(header))
    path = write("x.safetensors", struct.pack("<Q", 0x280) + header + b"\x05")
    with wio.open(path) as ckpt:
        assert ckpt.format == "safetensors" and ckpt["a"].numpy().tolist() == [5]


def test_npy_with_a_zip_appended_is_rejected(write):
    arr = np.arange(3, dtype=np.int64)
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    path = write("poly.npy", buf.getvalue() + b"PK\x05\x06" + b"\0" * 18)
    with pytest.raises(CorruptFileError, match=r"24 data bytes but 46 follow \(22 bytes trailing\)"):
        wio.open(path)
