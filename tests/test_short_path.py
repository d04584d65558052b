"""`VarBuilder.get`'s shortest path, in C (`_speedups.plain_get`, `mapped_slice`) and in Python
(`view.plain_get_py`, `stored_array`'s own slice): the same arrays and the same report as the general
path, for every fixture tensor; the changed-file check on it; requests from many threads counted."""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest
import safetensors.numpy

import weightio as wio
import weightio.varbuilder as varbuilder
import weightio.view as view
from weightio._native import speedups
from weightio.errors import CorruptFileError, WeightioError
from weightio.names import Usage

from .conftest import FIXTURES, manifest, on_threads

NATIVE = getattr(speedups, "plain_get", None)
if os.environ.get("WEIGHTIO_REQUIRE_SPEEDUPS") == "1" and sys.platform.startswith("linux"):
    assert NATIVE is not None and varbuilder.plain_get is NATIVE  # (CI builds the C module: it must be what runs)
WAYS = ["python"] + (["c"] if NATIVE is not None else [])


@pytest.fixture(params=WAYS)
def way(request, monkeypatch):
    """The short path taken in C or in Python (`stored_array` slicing in Python too)."""
    if request.param == "python":
        monkeypatch.setattr(varbuilder, "plain_get", view.plain_get_py)
        monkeypatch.setattr(view, "_mapped_slice", None)
    return request.param


def _plain_hits(vb):
    """Requests the short path recorded (the sum of the times counted at each name's serial)."""
    return int(np.frombuffer(bytes(vb._shared.usage.plain), np.int64)[0::3].sum())


def _general(vb, shape, name):
    """`get` the general way (resolution, shape check, placement), without the short path."""
    full, stored, value = vb._find(name)
    vb._check_shape(full, stored, value, tuple(shape))
    return vb._place(full, stored, value, None)


def test_every_fixture_tensor_is_the_general_paths_array(way):
    """Each tensor of each fixture, asked twice by its stored name and shape (the first ask makes the
    cached element view the second slices): the general path's memory (address, dtype, shape,
    strides), read-only, and the same report; where the short path declines, the general path's array."""
    taken, served_by_short_path = set(), set()
    for entry in manifest():
        try:
            vb = wio.VarBuilder.from_path(FIXTURES / entry)
        except WeightioError:
            continue  # (a fixture that only the lower-level API reads)
        with vb:
            served, refused = [], []
            for name in vb.stored_names():
                shape = tuple(vb._shared.store.value(name).shape)
                try:
                    general = _general(vb, shape, name)
                except WeightioError as e:
                    with pytest.raises(type(e)):
                        vb.get(shape, name)
                    refused.append(name)
                    continue
                served.append(name)
                for _ in range(2):
                    before = _plain_hits(vb)
                    got = vb.get(shape, name)
                    assert (got.dtype, got.shape, got.strides) == (general.dtype, general.shape, general.strides)
                    assert not got.flags.writeable and got.tobytes() == general.tobytes(), (entry, name)
                    assert (got.flags.aligned, got.flags.c_contiguous, got.flags.f_contiguous) == (
                        general.flags.aligned, general.flags.c_contiguous, general.flags.f_contiguous)
                    if _plain_hits(vb) > before:  # served by the short path: the same memory
                        taken.add(vb._shared.store.sources[0].format)
                        served_by_short_path.add(entry)
                        with pytest.raises(ValueError):
                            got.flags.writeable = True  # (a view of the read-only mapping stays read-only)
                        if got.size:  # (an empty slice's address is numpy's choice)
                            assert got.__array_interface__["data"][0] == general.__array_interface__["data"][0]
            report = vb.report()
            assert (report.used, report.unused, report.missing) == (tuple(served), tuple(refused), ())
    # in C, readers whose `buffer` refuses names of their own (unpicklable, quantized, ...) go the general way
    assert taken == ({"safetensors"} if way == "c" else {"safetensors", "pytorch", "npy", "npz", "gguf", "ggml"})
    assert {"tiny-bert-sharded", "tiny-bert"} <= served_by_short_path, served_by_short_path  # (several files, one)


def _two(tmp_path):
    path = tmp_path / "two.safetensors"
    safetensors.numpy.save_file({"a": np.arange(2, dtype=np.float32), "b": np.arange(3, dtype=np.float32)}, path)
    return path


@pytest.mark.parametrize("fold_at", [1, 2, 4096])
def test_a_name_is_reported_as_its_last_request_resolved_it_whichever_path_served_it(tmp_path, way, monkeypatch,
                                                                                   fold_at):
    monkeypatch.setattr(Usage, "FOLD_AT", fold_at)
    with wio.VarBuilder.from_path(_two(tmp_path)) as vb:
        vb.get((3,), "b")
        vb.rename({"a": "b"}).get((3,), "a")  # (a rename: the general path)
        vb.get((2,), "a")  # stored as asked: the short path, after the rename
        report = vb.report()
        assert (report.used, report.renamed, report.bytes_read) == (("b", "a"), {}, (3 + 3 + 2) * 4)
        vb.rename({"a": "b"}).get((3,), "a")
        report = vb.report()
        assert (report.used, report.renamed, report.unused) == (("b",), {"a": "b"}, ())
        assert report.bytes_read == (3 + 3 + 2 + 3) * 4
        vb.get((2,), "a")
        vb.get((2,), "a", dtype="float64")  # (a cast: the general path)
        vb.get((2,), "a")
        report = vb.report()
        assert (report.used, report.renamed, report.bytes_read) == (("b", "a"), {}, (3 + 3 + 2 + 3 + 2 * 3) * 4)
    if way == "c":
        assert vb._shared.usage.queued == []  # (all folded by the reports)


def test_the_short_path_refuses_nothing_a_changed_or_closed_file_is_refused_the_general_way(tmp_path, way):
    path = tmp_path / "model.safetensors"
    shutil.copy(_two(tmp_path), path)
    opened = os.stat(path).st_mtime_ns
    vb = wio.VarBuilder.from_path(path)
    kept = [vb.get((2,), "a"), vb.get((2,), "a")]  # (the second from the cached element view)
    os.utime(path, ns=(opened, opened + 1))
    with pytest.raises(CorruptFileError, match="was rewritten in place since it was opened"):
        vb.get((2,), "a")
    os.utime(path, ns=(opened, opened))
    assert vb.get((2,), "a").tolist() == [0.0, 1.0]  # (the same stamp again: served)
    with open(path, "ab") as f:
        f.write(b" ")
    os.utime(path, ns=(opened, opened))
    with pytest.raises(CorruptFileError, match="grew from"):
        vb.get((2,), "a")
    vb.close()
    with pytest.raises(WeightioError, match="the checkpoint was closed"):
        vb.get((2,), "a")
    assert [k.tolist() for k in kept] == [[0.0, 1.0]] * 2


def test_requests_from_eight_threads_are_all_counted(tmp_path, way, monkeypatch):
    """Short and general requests racing, with folds every 7 hits (queues drained while others append)."""
    monkeypatch.setattr(Usage, "FOLD_AT", 7)
    tensors = {f"t{i}": np.full((i % 5 + 1, 2), i, np.float32) for i in range(64)}
    path = tmp_path / "many.safetensors"
    safetensors.numpy.save_file(tensors, path)
    errors = []
    with wio.VarBuilder.from_path(path) as vb:
        def work(k):
            try:
                for _ in range(20):
                    for name, value in tensors.items():
                        got = vb.get(value.shape, name, "float64" if (k + int(name[1:])) % 9 == 0 else None)
                        assert got.tolist() == value.tolist()
            except BaseException as e:  # (reported by the main thread)
                errors.append(e)

        on_threads(work)
        assert errors == []
        report = vb.report()
        assert report.bytes_read == 8 * 20 * sum(v.nbytes for v in tensors.values())
        assert sorted(report.used) == sorted(tensors) and report.unused == () and report.renamed == {}


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
def test_mapped_slice_declines_what_it_does_not_serve(tmp_path):
    """None (the Python way then decides) for bounds outside the cached element view, negative or
    non-int bounds, a shape that is not a tuple, a view not cached, a closed file."""
    mapped_slice = speedups.mapped_slice
    with wio.open(_two(tmp_path)) as ckpt:
        ckpt["a"].numpy()  # (caches the float32 element view)
        file, f4 = ckpt._only.file, np.dtype("<f4")
        length = len(file._elements[f4])
        assert mapped_slice(file, f4, length - 1, length, (1,)).shape == (1,)
        assert mapped_slice(file, f4, 0, 0, (0,)).shape == (0,)
        for start, stop, shape in ((length - 1, length + 1, (2,)), (2, 1, (1,)), (-1, 1, (2,)), (0, 2**63, (2,)),
                                   (0, 2.0, (2,)), (True, 2, (1,)), (0, 2, [2])):
            assert mapped_slice(file, f4, start, stop, shape) is None
        assert mapped_slice(file, np.dtype("<i8"), 0, 1, (1,)) is None
        with pytest.raises(TypeError, match="takes 5 arguments"):
            mapped_slice(file, f4, 0, 1)
    assert mapped_slice(file, f4, 0, 2, (2,)) is None


def test_a_map_entry_that_names_no_reader_goes_the_general_way(way):
    """With several files, the short path takes a name's info and reader index from
    `Checkpoint._placed`; an index outside the readers (or not an int) is declined (None), and a
    name not in the map yet too, whichever way runs."""
    plain_get = varbuilder.plain_get
    with wio.VarBuilder.from_path(FIXTURES / "tiny-bert-sharded") as vb:
        ckpt = vb._shared.store.sources[0]
        name = next(iter(ckpt))
        shape = ckpt[name].shape  # (a first lookup by name: fills the map)
        vb.get(shape, name)  # (the general way: caches the element view the short path slices)
        placed, plain = ckpt._placed, vb._plain
        assert plain[0] is placed and plain[1] is ckpt._readers and plain[8] == ""
        assert plain_get(plain, name, shape).shape == shape
        info, at, serial = placed[name]
        assert list(placed)[serial] == name and len(vb._shared.usage.plain) == 24 * len(ckpt)
        for wrong in (len(ckpt._readers), -1, 2**64, 0.0, None):
            placed[name] = (info, wrong, serial)
            assert plain_get(plain, name, shape) is None
            placed[name] = (info, at, wrong if wrong is not len(ckpt._readers) else len(ckpt))
            assert plain_get(plain, name, shape) is None
        placed[name] = (info, at)
        assert plain_get(plain, name, shape) is None
        placed[name] = (info, at, serial)
        times = vb._shared.usage._slots[3 * serial]
        assert plain_get(plain, name, shape).shape == shape
        assert vb._shared.usage._slots[3 * serial] == times + 1 and times in (1, 2)  # (C: the first was general)
        del placed[name]
        assert plain_get(plain, name, shape) is None
        if way == "c":
            with pytest.raises(TypeError, match="plain a tuple of 9"):
                plain_get(plain[:8], name, shape)


def test_the_record_of_a_request_is_its_stamp_and_the_report_merges_both_kinds_by_stamp():
    """A plain hit counts times, first and last stamp at the name's serial; any other request is
    queued with its stamp and folded into `counts`, `first` and `last` (by stamp, whatever order the
    queue holds them in); the report takes a name's first request for its order and its last for
    what it resolved to."""
    usage = Usage({"a": (Info(4), 0, 0), "b": (Info(8), 0, 1), "d": (Info(12), 0, 2)}, 3)
    usage.hit("a", "a", 4)  # stamp 1
    usage.plain_hit(1)  # "b", stamp 2
    usage.plain_hit(1)  # stamp 3
    assert np.frombuffer(bytes(usage.plain), np.int64).tolist() == [0, 0, 0, 2, 2, 3, 0, 0, 0]
    assert usage.queued == [("a", "a", 4, 1)]
    usage.queued.append(("c", "d", 12, 5))  # (a stamp taken later than the next, queued first)
    usage.queued.append(("c", "b", 8, 4))
    usage.fold()
    assert (usage.first, usage.last) == ({"a": 1, "c": 4}, {"a": (1, "a"), "c": (5, "d")})
    assert usage.counts == {("a", "a", 4): 1, ("c", "d", 12): 1, ("c", "b", 8): 1}
    assert next(usage.stamps) == 4  # (the two appended by hand took none)
    usage.hit("b", "d", 12)  # stamp 5: "b" asked, resolved elsewhere after its plain hits
    usage.fold()
    assert usage.hits() == {"a": ("a", 4), "b": ("d", 2 * 8 + 12), "c": ("d", 20)}
    usage.plain_hit(1)  # "b" as itself again
    usage.plain_hit(0)  # "a", first plain hit after its other request
    assert list(usage.hits().items()) == [("a", ("a", 8)), ("b", ("b", 3 * 8 + 12)), ("c", ("d", 20))]
    assert usage.used() == {"a", "b", "d"}


class Info:
    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_the_record_folds_to_what_a_replay_of_the_requests_gives():
    """`Usage` against a replay of every request in order, for random mixes of plain hits (names)
    and others (renames, casts) folded at random points: the same hits (order, last resolution,
    bytes) and the same stored names used."""
    import random

    placed = {name: (Info(4 * (i + 1)), 0, i) for i, name in enumerate("abcdef")}
    rng = random.Random(7)
    for _ in range(300):
        usage, requests = Usage(placed, len(placed)), []
        for _ in range(rng.randrange(1, 30)):
            asked = rng.choice("abcdef")
            if rng.random() < 0.5:
                usage.plain_hit(placed[asked][2])
                requests.append((asked, asked, placed[asked][0].nbytes))
            else:
                stored = rng.choice("abcdef")
                usage.hit(asked, stored, placed[stored][0].nbytes)
                requests.append((asked, stored, placed[stored][0].nbytes))
            if rng.random() < 0.2:
                usage.fold_queued()
        expected: dict[str, tuple[str, int]] = {}
        for asked, stored, nbytes in requests:
            expected[asked] = (stored, expected.get(asked, ("", 0))[1] + nbytes)
        usage.fold_queued()
        assert usage.hits() == expected and list(usage.hits()) == list(expected)
        assert usage.used() == {stored for _, stored, _ in requests}


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
def test_mapped_slice_declines_an_empty_shape_numpy_cannot_index():
    """No elements, but dimensions whose product of bytes is past numpy's index range: numpy
    refuses such an array (ValueError), so the C view declines it and raises nothing."""
    data = np.zeros(16, np.uint8)
    data.flags.writeable = False

    class File:  # (what `mapped_slice` reads of a MappedFile)
        pass

    path_fd = os.open(__file__, os.O_RDONLY)
    try:
        st = os.fstat(path_fd)
        file = File()
        file._closed, file._fast = False, (path_fd, st.st_size, st.st_mtime_ns, {np.dtype("<f4"): data.view("<f4")})
        assert speedups.mapped_slice(file, np.dtype("<f4"), 1, 3, (2,)).shape == (2,)
        for shape in ((0, 2**62, 2), (0, 2**40, 2**40), (2**62, 0)):
            with pytest.raises(ValueError):
                np.empty(shape, np.float32)
            assert speedups.mapped_slice(file, np.dtype("<f4"), 1, 1, shape) is None
        assert speedups.mapped_slice(file, np.dtype("<f4"), 1, 1, (0, 2**20, 2**20)).shape == (0, 2**20, 2**20)
    finally:
        os.close(path_fd)


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
def test_a_request_served_while_a_report_reads_the_record_is_in_its_used_or_unused(monkeypatch):
    """The C path records without the report's lock (the Python path waits for it): a report reads
    one copy of the record for both its hits and its used names, so a name first served between
    the two is in `unused` (as of the copy), never in neither list."""
    with wio.VarBuilder.from_path(FIXTURES / "tiny-bert") as vb:
        names = vb.stored_names()
        shapes = {n: tuple(vb._shared.store.value(n).shape) for n in names}
        for name in names[:2]:
            vb.get(shapes[name], name)
            vb.get(shapes[name], name)  # (the first fills the map, the second goes the short way)
        before = _plain_hits(vb)
        used = Usage.used

        def racing(usage, plain=None):  # what another thread's `get` may do in the middle of a report
            vb.get(shapes[names[5]], names[5])
            return used(usage, plain)

        monkeypatch.setattr(Usage, "used", racing)
        report = vb.report()
        assert _plain_hits(vb) == before + 1  # (served by the short path, during the report)
        assert report.used == tuple(names[:2]) and report.unused == tuple(names[2:])
        monkeypatch.setattr(Usage, "used", used)
        assert vb.report().used == (*names[:2], names[5])


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
def test_the_record_is_bounds_checked_after_the_stamp_is_taken():
    """A `stamps` that runs Python code (never the builder's `itertools.count`, but a hand-made
    `plain` can hold one) may shrink the record meanwhile: the serial is checked against its size
    after the stamp, and nothing is written past it."""
    with wio.VarBuilder.from_path(FIXTURES / "tiny-bert-sharded") as vb:
        name = vb.stored_names()[30]
        shape = tuple(vb._shared.store.value(name).shape)
        vb.get(shape, name)
        vb.get(shape, name)
        record = bytearray(len(vb._shared.usage.plain))  # (no memoryview on it: it can shrink)

        class Shrinking:
            def __iter__(self):
                return self

            def __next__(self):
                del record[24:]
                return 7

        plain = list(vb._plain)
        plain[2], plain[3] = Shrinking(), record
        assert NATIVE(tuple(plain), name, shape) is None and record == bytes(24)
        plain[2] = iter([7, 8])
        record[:] = bytes(len(vb._shared.usage.plain))
        serial = vb._shared.store.sources[0]._placed[name][2]
        assert NATIVE(tuple(plain), name, shape).shape == shape
        assert np.frombuffer(bytes(record), np.int64)[3 * serial : 3 * serial + 3].tolist() == [1, 7, 7]
        assert NATIVE(tuple(plain), name, shape).shape == shape
        assert np.frombuffer(bytes(record), np.int64)[3 * serial : 3 * serial + 3].tolist() == [2, 7, 8]
        assert NATIVE(tuple(plain), name, shape) is None  # (the stamps ran out: not recorded, not served)


def test_a_checkpoint_the_short_path_cannot_serve_gets_no_map_and_no_record(way):
    """In C the short path serves safetensors files on a local mapping only: a builder over a
    PyTorch file does not take it, and makes neither the name map nor the record (the Python way
    serves every reader)."""
    path = FIXTURES / "pytorch" / "resnet18_like.pth"
    with wio.VarBuilder.from_path(path) as vb:
        ckpt = vb._shared.store.sources[0]
        for name in vb.stored_names():
            shape = tuple(ckpt[name].shape)
            vb.get(shape, name)
            vb.get(shape, name)
        assert (ckpt._placed != {}) is (way == "python") and (vb._plain is None) is (way == "c")
        assert len(vb._shared.usage.plain) == (24 * len(ckpt) if way == "python" else 0)
        assert _plain_hits(vb) == (2 * len(ckpt) - 1 if way == "python" else 0)  # (the first: the general way)
        assert vb.report().unused == ()
