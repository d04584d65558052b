"""Format detection from bytes, never from the file name."""

from __future__ import annotations

import io
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import pytest

import weightio as wio
from weightio._io import MappedFile
from weightio.errors import CorruptFileError, FormatError, InputError
from weightio.formats import sniff as sniff_module
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


def _tarfile_opens(head: bytes) -> bool:
    if len(head) < 512:
        return False
    try:
        tarfile.TarInfo.frombuf(head[:512], tarfile.ENCODING, "surrogateescape")
    except tarfile.EOFHeaderError:
        return True
    except tarfile.HeaderError:
        return False
    return True


def test_the_tar_test_agrees_with_tarfile_and_imports_it_only_for_plausible_headers():
    """`opens_as_tar` skips `tarfile` (a 1 ms import) when the checksum rules a header out: the
    answer must still be tarfile's, for real headers of every kind, mutated, re-checksummed
    (signed and unsigned sums) and random."""
    from weightio.formats.sniff import opens_as_tar

    rng = random.Random(12)
    bases = []
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
            info = tarfile.TarInfo("storages")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        bases.append(out.getvalue()[:512])
    seen = {True: 0, False: 0}
    for base in [*bases, bytes(512)]:
        for _ in range(3000):
            block = bytearray(base)
            for _ in range(rng.randint(0, 3)):
                block[rng.randrange(512)] = rng.randrange(256)
            if rng.random() < 0.5:
                rest = block[:148] + block[156:]
                unsigned = 256 + sum(rest)
                signed = unsigned - 256 * sum(b > 127 for b in rest)
                block[148:156] = b"%06o\0 " % ((unsigned if rng.random() < 0.5 else signed) % 8**6)
            head = bytes(block)
            assert opens_as_tar(head) == _tarfile_opens(head), head[:160]
            seen[_tarfile_opens(head)] += 1
    for _ in range(3000):
        head = rng.randbytes(512)
        assert opens_as_tar(head) == _tarfile_opens(head)
    assert min(seen.values()) > 1000, seen  # both answers exercised
    for base in bases:  # checksums spelt the odd ways int(text, 8) reads, and near misses
        rest = base[:148] + base[156:]
        value = 256 + sum(rest)
        octal = f"{value:o}"
        spellings = [octal, f"+{octal}", f"0o{octal}", f"0O{octal}", octal[:2] + "_" + octal[2:], f"\x1c{octal}\x0b",
                     f"-{octal}", f"{octal}8", f"{octal}a", f'"{octal}']
        spellings += [f"{space}{octal}" for space in " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"]  # whitespace str.strip() drops
        spellings += [f"{octal}{space}" for space in " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"]
        # every byte the pre-check lets by, and others
        alphabet = sniff_module._CHECKSUM_BYTES.decode("latin-1") + '"{:a\x80'
        spellings += ["".join(rng.choice(alphabet) for _ in range(8)) for _ in range(4000)]
        for spelling in spellings:
            field = (spelling.encode("latin-1") + b"\0" * 8)[:8]
            head = base[:148] + field + base[156:]
            assert opens_as_tar(head) == _tarfile_opens(head), field
            seen[_tarfile_opens(head)] += 1
    code = ("import sys, numpy as np, weightio as wio; np.save(sys.argv[1], np.arange(3.0)); "
            "wio.open(sys.argv[1]).close(); print('tarfile' in sys.modules)")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", code, f"{tmp}/a.npy"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr  # opening an .npy never imports tarfile


# ----------------------------------------------------------------------------- saved web pages (issue 13)

_HF_PAGE = """
<!doctype html>
<html class="">
\t<head>
\t\t<meta charset="utf-8" />
\t\t<meta name="viewport" content="width=device-width, initial-scale=1.0, user-scalable=no" />
\t\t<title>model.safetensors · org/model at main</title>
\t\t<link rel="stylesheet" href="/front/build/kube-3cd5d4d/style.css" />
\t</head>
\t<body class="flex flex-col min-h-dvh bg-white dark:bg-gray-950 text-black ViewerBlobPage">
"""
_GITHUB_PAGE = """\ufeff

  <!DOCTYPE html>
<html lang="en" data-color-mode="auto" data-light-theme="light" data-dark-theme="dark">
  <head>
    <meta charset="utf-8">
  <link rel="dns-prefetch" href="https://github.githubassets.com">
"""
_IE_PAGE = """<!-- saved from url=(0042)https://example.org/models/pytorch_model.bin -->
<HTML><HEAD><META http-equiv="Content-Type" content="text/html; charset=utf-8"><TITLE>404 Not Found</TITLE>
</HEAD><BODY><H1>Not Found</H1></BODY></HTML>
"""
_XHTML_PAGE = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" "http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd">
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Access denied</title></head>
"""
_S3_ERROR_PAGE = ("\r\n\r\n<html>\r\n<head><title>403 Forbidden</title></head>\r\n<body>\r\n"
                  "<center><h1>403 Forbidden</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
_SPA_PAGE = """   <head><script>window.location = "/login?next=/files/model.gguf"</script></head>"""

SAVED_PAGES = {
    "huggingface blob page, leading newline, lowercase doctype": _HF_PAGE.encode("utf-8"),
    "github page with a UTF-8 BOM and indentation": _GITHUB_PAGE.encode("utf-8"),
    "Internet Explorer 'saved from url' mark, upper case": _IE_PAGE.encode("utf-8"),
    "IE 'Save as Unicode' (UTF-16 LE with BOM)": _IE_PAGE.encode("utf-16"),
    "UTF-16 BE with BOM": ("\ufeff" + _HF_PAGE).encode("utf-16-be"),
    "UTF-16 LE without BOM": _S3_ERROR_PAGE.encode("utf-16-le"),
    "XHTML with an XML declaration": _XHTML_PAGE.encode("utf-8"),
    "nginx 403 page after CRLFs": _S3_ERROR_PAGE.encode("latin-1"),
    "page starting with <head>": _SPA_PAGE.encode("utf-8"),
}
# every suffix weightio opens or finds in a model directory
SUFFIXES = [".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".npz", ".npy"]


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("page", list(SAVED_PAGES.values()), ids=list(SAVED_PAGES))
def test_saved_web_pages_are_called_html_pages(write, page, suffix):
    path = write(f"model{suffix}", page)
    with pytest.raises(FormatError) as info:
        wio.open(path)
    assert str(info.value) == f"{path}: is an HTML page, not weights (a failed download?)"


@pytest.mark.parametrize("name", ["numpy.safetensors", "dtypes.safetensors", "numpy/c_order.npy", "numpy/arrays.npz",
                                  "numpy_dtypes/python2_v1.npy"])
def test_weight_files_are_not_pages(name):
    from weightio.formats.sniff import looks_like_html

    assert not looks_like_html((FIXTURES / name).read_bytes()[:512])


@pytest.mark.parametrize("head", [
    b"\x80\x02}q\x00(X\x06\x00\x00\x00<html>q\x01", b"\x93NUMPY\x01\x00v\x00{'descr': '<html'", b"GGUF\x03\x00\x00\x00",
    b"\x08\x00\x00\x00\x00\x00\x00\x00{\"<html\":1}", b"<htm", b"  <p>a paragraph</p>", b"<!DOCTYP",
    b"\xef\xbb\xbf{\"a\": 1}", b"", b"\xff\xfe",
])
def test_what_is_no_page_is_not_called_one(head):
    from weightio.formats.sniff import looks_like_html

    assert not looks_like_html(head)
