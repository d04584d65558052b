"""Opening at scale (issue 16): the collector pause, one descriptor and one read per shard, headers
in any order, msgspec and the standard parser agreeing, and the fast paths keeping every check."""

from __future__ import annotations

import gc
import json
import os
import random
import re
import threading

import numpy as np
import pytest

import weightio as wio
from weightio import _io, _json
from weightio._gc import collector_paused
from weightio._io import MappedFile
from weightio.errors import CorruptFileError
from weightio.formats import safetensors as safetensors_module
from weightio.formats import sniff as sniff_module
from weightio.formats.safetensors import SafetensorsReader, read_plain
from weightio.formats.sniff import SAFETENSORS_VOUCH, sniff
from weightio.records import TensorInfo

from .conftest import FIXTURES, safetensors_bytes


def test_collector_paused_restores_the_collector_state():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_collector_paused_comes_back_after_an_error_and_across_threads():
    try:
        with collector_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def hold():
        with collector_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert gc.isenabled()


# ----------------------------------------------------------------------------- opening many files


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_opening_holds_one_descriptor_per_shard_and_maps_on_first_read():
    before = _descriptors()
    with wio.open(FIXTURES / "tiny-bert-sharded") as ckpt:
        assert len(ckpt.files) == 3
        assert _descriptors() == before + 3  # no mapping yet (CPython's mmap would hold a duplicate)
        first = ckpt["embeddings.word_embeddings.weight"].numpy()
        assert _descriptors() == before + 4  # the one shard read is mapped now
        assert first.shape == (99, 32) and not first.flags.writeable
    assert _descriptors() == before + 1  # the live array keeps its mapping (and the mapping's descriptor)
    del first


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_checkpoint_dropped_without_closing_gives_its_descriptors_back():
    before = _descriptors()
    for _ in range(3):  # (opened in a loop and never closed, a model of 200 shards would run out within five)
        ckpt = wio.open(FIXTURES / "tiny-bert-sharded")
        assert len(ckpt) == 39 and _descriptors() == before + 3
    kept = ckpt["embeddings.word_embeddings.weight"].numpy()
    expected = kept.copy()
    del ckpt
    assert _descriptors() == before + 1  # the array keeps its shard's mapping; the three descriptors are closed
    assert np.array_equal(kept, expected)  # and reads the same bytes
    del kept
    assert _descriptors() == before


def test_an_open_file_cannot_be_copied_or_pickled(tmp_path):
    import copy
    import pickle

    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    file = MappedFile(path)
    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="a MappedFile cannot be copied or pickled; open the file again"):
            attempt(file)
    file.close()


def test_an_empty_file_is_refused_with_its_descriptor_closed_once(tmp_path, monkeypatch):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    closed = []
    real = os.close
    monkeypatch.setattr(os, "close", lambda fd: closed.append(fd) or real(fd))
    with pytest.raises(CorruptFileError, match=r"empty\.safetensors: empty file \(0 bytes\)"):
        MappedFile(path)
    gc.collect()
    assert len(closed) == 1  # by __init__, and not again when the half-made object is collected


@pytest.mark.parametrize("way", ["C open_head", "Python"])
def test_a_small_header_is_read_with_one_pread(tmp_path, monkeypatch, way):
    if way == "Python":
        monkeypatch.setattr(_io, "_open_head", None)
    elif _io._open_head is None:
        pytest.skip("the C module is not built")
    path = tmp_path / "x.safetensors"
    big = tmp_path / "big.safetensors"
    from safetensors.numpy import save_file

    save_file({"a": np.arange(6, dtype=np.float32), "b": np.ones(2, np.int64)}, str(path))
    save_file({f"t.{i}": np.zeros(1, np.uint8) for i in range(200)}, str(big))  # a header over 4 KiB
    calls, heads = [], []
    real, real_head = os.pread, _io._open_head
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: calls.append((n, offset)) or real(fd, n, offset))
    if real_head is not None:  # (the C call reads the first bytes itself: count it as the read it makes)
        monkeypatch.setattr(_io, "_open_head", lambda p, f, n: heads.append(n) or real_head(p, f, n))
    first = [(min(path.stat().st_size, 4096), 0)]
    with wio.open(path) as ckpt:
        # sniffing and the whole header: one read, in C or in Python
        assert (heads, calls) == (([4096], []) if way == "C open_head" else ([], first))
        assert ckpt["a"].numpy().tolist() == [0, 1, 2, 3, 4, 5]
    calls.clear()
    heads.clear()
    with wio.open(big) as ckpt:
        n = int.from_bytes(big.read_bytes()[:8], "little")
        assert len(ckpt) == 200
        assert (heads, calls) == (([4096], [(n, 8)]) if way == "C open_head" else ([], [(4096, 0), (n, 8)]))


def _header_in_reverse(tensors: dict[str, np.ndarray]) -> bytes:
    """A valid safetensors file whose header lists the tensors in the opposite order of their data."""
    header, offset, data = {}, 0, b""
    for name, array in tensors.items():
        raw = array.tobytes()
        header[name] = {"dtype": {"float32": "F32", "int16": "I16"}[array.dtype.name], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset, data = offset + len(raw), data + raw
    return safetensors_bytes(dict(reversed(header.items())), data)


def test_a_header_out_of_data_order_lists_in_file_order(tmp_path):
    tensors = {"z": np.arange(4, dtype=np.float32), "m": np.arange(3, dtype=np.int16), "a": np.ones((2, 2), np.float32)}
    path = tmp_path / "r.safetensors"
    path.write_bytes(_header_in_reverse(tensors))
    reader = SafetensorsReader(str(path))
    try:
        assert list(reader.tensors) == ["z", "m", "a"]  # the data's order, not the header's
        assert [reader.tensors[n].offset - reader.tensors["z"].offset for n in ("z", "m", "a")] == [0, 16, 22]
    finally:
        reader.close()
    with wio.open(path) as ckpt:
        for name, array in tensors.items():
            assert np.array_equal(ckpt[name].numpy(), array) and ckpt[name].dtype == array.dtype


def test_empty_tensors_at_one_offset_are_ordered_by_name(tmp_path):
    header = {"zz": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
              "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "aa": {"dtype": "F32", "shape": [2, 0], "data_offsets": [0, 0]}}
    path = tmp_path / "e.safetensors"
    path.write_bytes(safetensors_bytes(header, np.float32(7).tobytes()))
    with wio.open(path) as ckpt:
        assert list(ckpt) == ["aa", "zz", "w"]
        assert ckpt["aa"].shape == (2, 0) and ckpt["w"].numpy().tolist() == [7.0]


@pytest.mark.parametrize("fast", [True, False])
def test_index_json_duplicates_are_found_by_either_parser(tmp_path, monkeypatch, fast):
    monkeypatch.setattr(_json, "_msgspec", pytest.importorskip("msgspec") if fast else False)
    parse = _json.parse_json_object
    text = '{"metadata": {"total_size": 8, "note": "a:b"}, "weight_map": {"x:y": "s:1.safetensors", "w": "s"}}'
    assert parse(text, path="i", what="index") == json.loads(text)
    for doubled in ('{"weight_map": {"a": "x", "b": "y", "a": "z"}}',  # in the big object
                    '{"metadata": {"k": {"n": 1, "n": 2}}, "weight_map": {}}',  # nested
                    '{"weight_map": {"a": "x"}, "weight_map": {"a": "x"}}',  # whole members
                    '{"weight_map": {"a": "x:", "a": ":x"}}'):  # colons inside the dropped strings
        with pytest.raises(CorruptFileError, match="index has the key '(a|n|weight_map)' twice"):
            parse(doubled, path="i", what="index")
    escaped = '{"weight_map": {"a\\u003a": "x", "a:": "y"}}'  # \u escapes spell the same key: the exact parser
    with pytest.raises(CorruptFileError, match="twice"):
        parse(escaped, path="i", what="index")
    huge = '{"metadata": {"total_size": 1180591620717411303424}, "weight_map": {}}'  # 2^70, read exactly by both
    assert parse(huge, path="i", what="index")["metadata"]["total_size"] == 2**70
    floats = '{"metadata": {"x": 1e400, "y": 0.1}, "weight_map": {}}'  # (floats: the standard parser's reading)
    assert parse(floats, path="i", what="index")["metadata"] == {"x": float("inf"), "y": 0.1}
    deep = '{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(CorruptFileError, match="index nests too deeply"):
        parse(deep, path="i", what="index")


def test_counting_members_alone_decides_only_a_text_without_a_colon_in_its_strings(monkeypatch):
    counted = []
    real = _json._colons
    monkeypatch.setattr(_json, "_colons", lambda value, strings=True: counted.append(strings) or real(value, strings))
    plain = {"metadata": {"total_size": 8, "parts": [{"a": 1}, {"b": 2}]}, "weight_map": {"w": "m.safetensors"}}
    assert real(plain, strings=False) == 7 and _json._no_duplicates(json.dumps(plain), plain) and True not in counted
    coloned = {"metadata": {"note": "a:b"}, "weight_map": {"x:y": "s:1.safetensors"}}
    assert real(coloned, strings=False) == 4 and real(coloned) == 7
    assert _json._no_duplicates(json.dumps(coloned), coloned) and True in counted  # the strings counted too
    doubled = '{"weight_map": {"a": "x", "a": "y:z"}}'  # 4 ':' in the text; kept: 2 members, 1 in strings
    assert not _json._no_duplicates(doubled, json.loads(doubled))


def test_a_shape_of_floats_is_refused_by_either_parser(tmp_path, monkeypatch):
    header = {"w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}
    path = tmp_path / "f.safetensors"
    path.write_bytes(safetensors_bytes(header, bytes(8)))
    messages = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            m.setattr(_json, "_msgspec", pytest.importorskip("msgspec") if fast else False)
            with pytest.raises(CorruptFileError) as info:
                wio.open(path)
            messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert messages[0].endswith("tensor 'w': shape must be a list of at most 64 non-negative integers, found [2.0]")


def test_varbuilder_get_on_numpy_checks_the_file_and_reports_the_use(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file({"enc.w": np.arange(6, dtype=np.float32).reshape(2, 3), "enc.n": np.arange(3, dtype=np.int64)},
              str(path))
    with wio.VarBuilder.from_path(path, dtype="float16") as vb:
        w = vb.pp("enc").get((2, 3), "w")
        n = vb.pp("enc").get(3, "n")
        assert w.dtype == np.float16 and n.dtype == np.int64  # the cursor's dtype casts floats only
        report = vb.report()
        assert report.used == ("enc.w", "enc.n") and report.unused == ()
    with wio.VarBuilder.from_path(path) as vb:
        assert np.shares_memory(vb.get((3,), "enc.n"), vb.get((3,), "enc.n"))  # zero-copy views of one mapping
        os.truncate(path, 40)
        with pytest.raises(CorruptFileError, match="was truncated from .* since it was opened"):
            vb.get((2, 3), "enc.w")


@pytest.mark.parametrize("text, message", [
    ('\ufeff{"a": 1}', "index is not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 "
                       "(char 0)"),
    ('{"a": 1, "a": 2}', "index has the key 'a' twice"),
    ('{"a": NaN}', "index is not valid JSON: non-standard JSON literal NaN"),
    ('{"a": [1, 2}', "index is not valid JSON: Expecting ',' delimiter: line 1 column 12 (char 11)"),
])
def test_the_standard_parser_refuses_as_json_loads_did(monkeypatch, text, message):
    """Small texts go to the standard library's parser through decoders made once (json.loads
    with hooks made one per call): the same refusals, the byte-order mark's included."""
    monkeypatch.setattr(_json, "_msgspec", False)  # as where msgspec is not installed
    with pytest.raises(CorruptFileError) as e:
        _json.parse_json_object(text, path="i", what="index")
    assert e.value.message == message


def test_msgspec_is_imported_only_for_a_large_text_unless_already_there(monkeypatch):
    from types import SimpleNamespace

    msgspec = pytest.importorskip("msgspec")
    monkeypatch.setattr(_json, "_msgspec", None)
    monkeypatch.setattr(_json, "sys", SimpleNamespace(modules={}))  # as in a process that never imported it
    small = json.dumps({"weight_map": {"a": "x"}})
    assert _json.parse_json_object(small, path="i", what="index") == {"weight_map": {"a": "x"}}
    assert _json._msgspec is None  # the standard parser: msgspec is not imported for a small text
    large = json.dumps({"weight_map": {f"t.{i}": "model.safetensors" for i in range(40_000)}})
    assert len(large) >= _json.FAST_FROM
    assert len(_json.parse_json_object(large, path="i", what="index")["weight_map"]) == 40_000
    assert _json._msgspec is msgspec
    monkeypatch.setattr(_json, "_msgspec", None)
    monkeypatch.setattr(_json, "sys", SimpleNamespace(modules={"msgspec": msgspec}))  # imported by anyone
    assert _json.parse_json_object(small, path="i", what="index") == {"weight_map": {"a": "x"}}
    assert _json._msgspec is msgspec  # then small texts go to it too


def test_the_first_bytes_are_read_at_open_and_kept_only_while_a_reader_parses(tmp_path, monkeypatch):
    from weightio._io import MappedFile
    from weightio.errors import WeightioError

    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(64)))
    f = MappedFile(path, head=True)
    monkeypatch.setattr(os, "pread", None)  # every read below within the first bytes needs no pread
    assert f.read(0, 4, "x") == bytes(range(4))
    assert f.read(60, 4, "x") == bytes(range(60, 64))
    monkeypatch.undo()
    with pytest.raises(CorruptFileError, match="x needs bytes 60..68 but the file has 64"):
        f.read(60, 8, "x")  # (past the end: not from the copy, which ends with the file)
    for offset, length, span in ((-1, 2, "-1..1"), (-8, 4, "-8..-4"), (10, -20, "10..-10")):
        with pytest.raises(CorruptFileError, match=f"x needs bytes {span} but the file has 64"):
            f.read(offset, length, "x")  # (never a slice of the copy from its end)
    f.close()
    with pytest.raises(WeightioError, match="the checkpoint was closed"):
        f.read(0, 8, "x")  # no kept copy serves a read after close
    g = MappedFile(path, head=True)
    with open(path, "r+b") as out:
        out.write(b"XXXXXXXX")
    assert g.read(0, 8, "x") == bytes(range(8))  # the bytes as they were at open
    g.release_head()
    assert g.read(0, 8, "x") == b"XXXXXXXX"  # read again, not from a copy kept after its release
    g.close()


def test_a_file_whose_first_bytes_cannot_be_read_is_an_input_error(tmp_path, monkeypatch):
    import errno

    from weightio._io import MappedFile
    from weightio.errors import InputError

    path = tmp_path / "x.bin"
    path.write_bytes(bytes(8))
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None

    def broken(fd, n, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", broken)
    monkeypatch.setattr(_io, "_open_head", lambda *args: None)  # (as the C call declines a failed read)
    with pytest.raises(InputError, match="cannot read the first bytes: Input/output error") as caught:
        MappedFile(path, head=True)
    monkeypatch.undo()
    assert caught.value.errno == errno.EIO and caught.value.path == str(path)
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before  # the descriptor was closed


def _descriptors() -> int | None:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None


@pytest.mark.skipif(_io._open_head is None, reason="the C module is not built")
def test_open_head_opens_a_regular_file_and_declines_anything_else(tmp_path):
    """`open_head` is `MappedFile(head=True)`'s first calls in C: for a regular, non-empty file the
    descriptor, the size and mtime an fstat gives and the first bytes; for anything else None with
    no descriptor left open, so that the Python calls open it again and say what is wrong."""
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(256)) * 20)  # 5,120 bytes
    before = _descriptors()
    fd, size, modified, head = _io._open_head(str(path), _io._OPEN_FLAGS, 4096)
    try:
        found = os.fstat(fd)
        assert (size, modified, head) == (5120, found.st_mtime_ns, path.read_bytes()[:4096])
        assert os.get_inheritable(fd) is False and os.path.samestat(found, os.stat(path))
    finally:
        os.close(fd)
    small = tmp_path / "small.bin"
    small.write_bytes(b"abc")
    fd, size, _, head = _io._open_head(small, _io._OPEN_FLAGS, 4096)  # (a PathLike, as os.open takes)
    os.close(fd)
    assert (size, head) == (3, b"abc")
    (tmp_path / "empty.bin").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo")
    for declined in ("empty.bin", "fifo", ".", "missing.bin", "x\0.bin"):
        assert _io._open_head(str(tmp_path / declined), _io._OPEN_FLAGS, 4096) is None, declined
    assert _descriptors() == before
    with pytest.raises(TypeError):
        _io._open_head(str(path), str(_io._OPEN_FLAGS), 4096)
    with pytest.raises(ValueError):
        _io._open_head(str(path), _io._OPEN_FLAGS, -1)
    with pytest.raises(OverflowError):
        _io._open_head(str(path), 2**70, 4096)


@pytest.mark.parametrize("name, message", [("empty.bin", "empty file (0 bytes)"), ("fifo", "is a FIFO"),
                                           (".", "is a directory"), ("missing.bin", "cannot open: No such file")])
def test_what_open_head_declines_is_refused_as_before(tmp_path, name, message):
    (tmp_path / "empty.bin").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo")
    before = _descriptors()
    with pytest.raises(wio.WeightioError, match=re.escape(message)):
        _io.MappedFile(tmp_path / name, head=True)
    assert _descriptors() == before


_SHORT = "/sys/kernel/mm/transparent_hugepage/enabled"  # (sysfs: a size of 4096, far fewer bytes to read)


@pytest.mark.skipif(_io._open_head is None or not os.path.isfile(_SHORT), reason="needs the C module and sysfs")
def test_a_file_that_reads_shorter_than_its_size_is_declined_in_c_and_refused_in_python():
    with open(_SHORT, "rb") as f:
        assert os.fstat(f.fileno()).st_size > len(f.read())
    before = _descriptors()
    assert _io._open_head(_SHORT, _io._OPEN_FLAGS, 4096) is None
    with pytest.raises(CorruptFileError, match="file shrank while reading the first bytes"):
        _io.MappedFile(_SHORT, head=True)
    assert _descriptors() == before


def test_a_file_that_cannot_be_stat_ed_is_an_input_error(tmp_path, monkeypatch):
    import errno

    from weightio._io import MappedFile
    from weightio.errors import InputError

    path = tmp_path / "x.bin"
    path.write_bytes(bytes(8))
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_io, "file_stamp", broken)
    with pytest.raises(InputError, match="cannot stat file: Input/output error"):
        MappedFile(path)
    monkeypatch.undo()
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before  # the descriptor was closed


# ----------------------------------------------------------------------------- a plain file in one C call

needs_plain = pytest.mark.skipif(safetensors_module._c_plain is None, reason="the C module is not built")


def _plain_or_none(path) -> SafetensorsReader | None:
    """`read_plain`'s reader of `path`, or None (its file closed)."""
    file = MappedFile(path, head=True)
    reader = read_plain(file)
    if reader is None:
        file.close()
    return reader


def _sniffed(path) -> str:
    file = MappedFile(path, head=True)
    try:
        return sniff(file)
    finally:
        file.close()


def _both_ways(path) -> tuple[SafetensorsReader | None, SafetensorsReader]:
    """`read_plain`'s reader of `path` (or None) and the usual way's."""
    return _plain_or_none(path), SafetensorsReader(MappedFile(path, head=True))


@needs_plain
def test_a_plain_file_is_read_from_its_first_bytes_as_the_usual_way_reads_it(tmp_path):
    from safetensors.numpy import save_file

    save_file({"b": np.arange(6, dtype=np.float32), "a": np.ones((2, 3), np.int64)}, str(tmp_path / "two.safetensors"),
              metadata={"format": "pt", "note": "é"})
    save_file({"x": np.zeros(3000, np.uint8)}, str(tmp_path / "big.safetensors"))  # past 512 bytes: the tar test
    (tmp_path / "none.safetensors").write_bytes(safetensors_bytes({}))
    # (a header out of data order: put in data order, as the usual way does)
    (tmp_path / "reversed.safetensors").write_bytes(_header_in_reverse({"z": np.arange(4, dtype=np.float32),
                                                                         "a": np.ones(2, np.int16)}))
    files = sorted(FIXTURES.rglob("*.safetensors")) + sorted(tmp_path.glob("*.safetensors"))
    read = 0
    for path in files:
        fast, usual = _both_ways(path)
        try:
            if fast is None:
                continue
            read += 1
            assert _sniffed(path) == "safetensors", path  # (as sniff calls it)
            assert type(fast) is SafetensorsReader and fast.file.head is None  # (its first bytes let go)
            assert (list(fast.tensors.items()), fast.metadata) == (list(usual.tensors.items()), usual.metadata), path
            assert (fast.path, fast.limits, fast.format) == (usual.path, usual.limits, "safetensors")
            assert set(vars(fast)) == set(vars(usual)) and fast.file.size == usual.file.size
            assert all(type(info) is TensorInfo for info in fast.tensors.values())
        finally:
            usual.close()
            if fast is not None:
                fast.close()
    assert read >= len(files) - 5, (read, len(files))  # (most are: the others, below, are left to the usual way)
    fast = _plain_or_none(tmp_path / "reversed.safetensors")  # (parsed once, in C, then put in data order)
    assert fast is not None and list(fast.tensors) == ["z", "a"]
    fast.close()
    with wio.open(tmp_path / "two.safetensors") as ckpt:  # (the open path takes it)
        assert ckpt.metadata == {"format": "pt", "note": "é"} and ckpt["a"].numpy().tolist() == [[1] * 3] * 2


@needs_plain
def test_what_is_not_a_plain_file_in_its_first_bytes_is_left_to_the_usual_way(tmp_path):
    from safetensors.numpy import save_file

    plain, c_plain = tmp_path / "plain.safetensors", safetensors_module._c_plain
    save_file({"a": np.arange(4, dtype=np.float32)}, str(plain))
    cases = {
        "header past the first 4 KiB": {f"t.{i}": np.zeros(1, np.uint8) for i in range(200)},
        "space before the object": safetensors_bytes(b' {"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                                     b"\0"),
        "an escape in a name": safetensors_bytes(b'{"\\u0061":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                                                 b"\0"),
        # a tar checksum field of digits (no tar header: tarfile refuses it, which only sniff tells)
        "digits where tar keeps its checksum": safetensors_bytes({"__metadata__": {"p": "7" * 600}}),
    }
    for name, content in cases.items():
        path = tmp_path / f"{len(os.listdir(tmp_path))}.safetensors"
        if isinstance(content, dict):
            save_file(content, str(path))
        else:
            path.write_bytes(content)
        fast, usual = _both_ways(path)
        usual.close()
        assert fast is None, name
        with wio.open(path) as ckpt:  # (read the usual way, as before)
            assert ckpt.format == "safetensors", name
    refused = {"trailing bytes": (plain.read_bytes() + b"\0", "1 bytes after the last tensor belong to no tensor"),
               "a hole": (safetensors_bytes({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0\0"),
                          "data_offsets begin 1 leaves a hole of 1 bytes")}
    for name, (content, message) in refused.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(content)
        assert _plain_or_none(path) is None, name
        with pytest.raises(CorruptFileError, match=message):
            wio.open(path)
    with wio.limits.using(header_bytes=20):  # over a limit: declined, and the usual way says so
        assert _plain_or_none(plain) is None
        with pytest.raises(CorruptFileError, match="header length 56 exceeds the 20-byte limit"):
            wio.open(plain)
    for limit, message in (("tensors", "limits.tensors"), ("name_bytes", "limits.name_bytes")):
        with wio.limits.using(**{limit: 0}):
            assert _plain_or_none(plain) is None, limit
            with pytest.raises(CorruptFileError, match=message):
                wio.open(plain)
    head, size = plain.read_bytes()[:4096], plain.stat().st_size
    arguments = (safetensors_module._PLAIN, TensorInfo, 64, 10, 100, 1000)
    assert c_plain(head, size, (), b"", *arguments) is not None
    assert c_plain(head, size, (head[:3],), b"", *arguments) is None  # one of sniff's magic numbers: not vouched
    assert c_plain(head, size - 1, (), b"", *arguments) is None  # (a size shorter than the bytes given)
    assert c_plain(head[:8], size, (), b"", *arguments) is None
    for bytes_ in (head, b""):  # (the arguments are checked whatever the bytes)
        with pytest.raises(ValueError, match="info_type"):
            c_plain(bytes_, size, (), b"", safetensors_module._PLAIN, dict, 64, 10, 100, 1000)
        with pytest.raises(ValueError, match="max_ndim"):
            c_plain(bytes_, size, (), b"", safetensors_module._PLAIN, TensorInfo, 65, 10, 100, 1000)


@needs_plain
def test_a_reader_registered_for_safetensors_in_place_of_ours_is_used(tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    from weightio import formats

    class Mine(SafetensorsReader):
        pass

    path = tmp_path / "x.safetensors"
    save_file({"a": np.arange(3, dtype=np.float32)}, str(path))
    monkeypatch.setitem(formats.READERS, "safetensors", Mine)
    with wio.open(path) as ckpt:
        assert type(ckpt.readers[0]) is Mine and ckpt["a"].numpy().tolist() == [0, 1, 2]
    monkeypatch.delitem(formats.READERS, "safetensors")
    with pytest.raises(wio.FormatError, match="is a safetensors file, which this version of weightio cannot read"):
        wio.open(path)


@needs_plain
def test_a_safetensors_tar_polyglot_is_not_vouched_for_and_is_refused(tmp_path):
    """A plain safetensors file whose first block tarfile opens (the metadata string holds the tar
    fields): `sniff` refuses it as a polyglot, so the C path must leave it to sniff."""
    from .test_differential import _safetensors_tar

    path = tmp_path / "x.bin"
    path.write_bytes(_safetensors_tar())
    assert _plain_or_none(path) is None
    with pytest.raises(wio.FormatError, match="is both a safetensors file and a tar archive"):
        wio.open(path)
    # a header short enough to lie in the first 300 bytes, and a tar header in the first block: handed
    # only those 300 bytes of a longer file, the C path cannot tell the block is tar-like, so declines
    header = json.dumps({"a": {"dtype": "U8", "shape": [600], "data_offsets": [0, 600]}}, separators=(",", ":"))
    raw = bytearray(safetensors_bytes(header, bytes(600)))
    raw[148:156] = b" " * 8
    raw[148:156] = f"{sum(raw[:512]):06o}\0 ".encode()
    assert sniff_module.opens_as_tar(bytes(raw[:512]))
    arguments = (*SAFETENSORS_VOUCH, safetensors_module._PLAIN, TensorInfo, 64, 10, 100, 10_000)
    assert safetensors_module._c_plain(bytes(raw), len(raw), *arguments) is None
    assert safetensors_module._c_plain(bytes(raw[:300]), len(raw), *arguments) is None  # (fewer than sniff reads)
    short = tmp_path / "short.bin"  # (300 bytes as the whole file: too short for its tensor's data)
    short.write_bytes(bytes(raw[:300]))
    assert _plain_or_none(short) is None
    raw[148:156] = b"xxxxxxxx"  # (not tar-like: vouched for, whole or with 512 bytes or more)
    assert safetensors_module._c_plain(bytes(raw[:512]), len(raw), *arguments) is not None
    assert safetensors_module._c_plain(bytes(raw[:300]), len(raw), *arguments) is None
    with safetensors_module._only_way("typed"):  # (another way than C: the C path is off too)
        assert safetensors_module._c_plain is None


@needs_plain
def test_the_c_path_vouches_only_for_first_bytes_sniff_calls_safetensors(tmp_path):
    """Random plain files whose tar checksum field (bytes 148..155, inside a metadata string of
    spaces, which tarfile reads as zeros in the fields before it) holds digits, signs, 'o's, spaces
    and now and then a letter, or the block's checksum spelt right: each read by `read_plain` only
    if `sniff` calls it safetensors and tarfile refuses it, and then as the usual way reads it."""
    rng = random.Random(16)
    path, seen = tmp_path / "x.safetensors", {True: 0, False: 0}
    for _ in range(1500):
        field = "".join(rng.choice("0123456789 +-_oO") if rng.random() > 0.1 else rng.choice("a{:x") for _ in range(8))
        text = json.dumps({"__metadata__": {"p": " " * (148 - 30) + "{}" + " " * 500},
                           "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, separators=(",", ":"))
        raw = bytearray(safetensors_bytes(text.replace("{}", " " * 8), b"ab"))
        assert raw[148:156] == b" " * 8
        if rng.random() < 0.2:  # the checksum tarfile computes, spelt right: a tar header (a polyglot)
            field = f"{256 + sum(raw[:148]) + sum(raw[156:512]):07o} "
        raw[148:156] = field.encode()
        path.write_bytes(raw)
        fast = _plain_or_none(path)
        seen[fast is not None] += 1
        if fast is None:
            continue
        usual = SafetensorsReader(str(path))
        try:
            assert _sniffed(path) == "safetensors" and not sniff_module.opens_as_tar(bytes(raw[:512])), field
            assert (fast.tensors, fast.metadata) == (usual.tensors, usual.metadata)
        finally:
            fast.close()
            usual.close()
    assert min(seen.values()) > 300, seen
    prefixes, checksum_bytes = SAFETENSORS_VOUCH  # (the C path's copy of what sniff tests before safetensors)
    assert set(prefixes) >= {b"PK\x03\x04", b"PK\x05\x06", *sniff_module._MAGIC_BYTES}
    assert checksum_bytes == sniff_module._CHECKSUM_BYTES
    # a header within the first 4 KiB has a length below 2**12: its bytes 2..7 are zeros, which no
    # prefix has, so a magic number is declined by the length as well as by the prefix test
    assert all(prefix[2] != 0 for prefix in prefixes)
