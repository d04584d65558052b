"""The strict zip walker's inflate: what a deflated member may and may not do."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
import pytest

import weightio as wio
from weightio.errors import CorruptFileError


def _npz_with_stream(npy: bytes, stream: bytes) -> bytes:
    """An .npz whose single member w.npy declares `npy`'s size and CRC but holds `stream`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("w.npy", npy)
    real = buf.getvalue()
    old_csize = struct.unpack_from("<I", real, 18)[0]
    head, tail = real[: 30 + len("w.npy")], real[30 + len("w.npy") + old_csize:]
    tail = tail[:20] + struct.pack("<I", len(stream)) + tail[24:]
    eocd = tail.index(b"PK\x05\x06")
    tail = tail[: eocd + 16] + struct.pack("<I", len(head) + len(stream)) + tail[eocd + 20:]
    return head[:18] + struct.pack("<I", len(stream)) + head[22:] + stream + tail


def test_corrupt_deflate_data_after_the_declared_size_is_a_corrupt_file(write):
    # Found by the npz fuzz harness: zlib.error escaped from the check that looks past the
    # declared size, which ran outside the guarded loop.
    buf = io.BytesIO()
    np.save(buf, np.arange(4.0))
    npy = buf.getvalue()
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = c.compress(npy) + c.flush(zlib.Z_FULL_FLUSH) + b"\xff\xff\xff\xff"  # then a reserved block type
    path = write("bad.npz", _npz_with_stream(npy, stream))
    with pytest.raises(CorruptFileError) as info:
        wio.load(path)  # the header check at open may meet the bad block first; the full inflate must too
    assert "zip archive: member 'w.npy' is not valid deflate data (Error -3 while decompressing data" in str(info.value)



def test_a_stream_that_ends_exactly_at_the_declared_size_is_fine(write):
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.int16))
    npy = buf.getvalue()
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    path = write("ok.npz", _npz_with_stream(npy, c.compress(npy) + c.flush()))
    assert wio.load(path)["w"].tolist() == list(range(6))


def test_the_look_past_the_declared_size_never_copies_the_rest_of_the_stream(write):
    # review finding: the bytes after the declared size were copied whole (up to the file's size)
    # just to see whether one more byte inflates; now they are fed in bounded chunks
    import tracemalloc

    buf = io.BytesIO()
    np.save(buf, np.arange(4.0))
    npy = buf.getvalue()
    c = zlib.compressobj(0, zlib.DEFLATED, -15)  # stored blocks: 16 MB of data is 16 MB of stream
    stream = c.compress(npy) + c.flush(zlib.Z_FULL_FLUSH) + c.compress(bytes(16 << 20)) + c.flush()
    path = write("long.npz", _npz_with_stream(npy, stream))
    with wio.open(path) as ckpt:
        tracemalloc.start()
        try:
            with pytest.raises(CorruptFileError, match="member 'w.npy' inflates to more than the 160 bytes declared"):
                ckpt["w"].numpy()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 4 << 20
