"""Checkpoint: the mapping over one file or a sharded Hugging Face directory."""

from __future__ import annotations

import gc
import json
import ntpath
import posixpath
import random
import shutil

import numpy as np
import pytest

import weightio as wio
from weightio import checkpoint
from weightio.checkpoint import shard_paths
from weightio.errors import CorruptFileError, FormatError, TensorNotFoundError, WeightioError

from .conftest import FIXTURES, digest, manifest

BERT = FIXTURES / "tiny-bert"
SHARDED = FIXTURES / "tiny-bert-sharded"


def test_a_model_directory_opens_its_single_file():
    with wio.open(BERT) as ckpt:
        assert ckpt.format == "safetensors"
        assert ckpt.files == [str(BERT / "model.safetensors")]
        assert len(ckpt) == 39 and "encoder.layer.1.output.dense.bias" in ckpt
        assert ckpt.metadata == {"format": "pt"}


def test_a_sharded_directory_is_one_checkpoint_equal_to_the_single_file():
    with wio.open(SHARDED) as sharded, wio.open(BERT) as single:
        assert len(sharded.files) == 3
        assert sorted(sharded) == sorted(single)
        for name in single:
            assert digest(sharded[name].numpy()) == digest(single[name].numpy())
        index = json.loads((SHARDED / "model.safetensors.index.json").read_text())
        assert sharded.metadata["format"] == "pt"
        assert sharded.metadata["total_size"] == index["metadata"]["total_size"]
        for name, shard in index["weight_map"].items():
            assert sharded[name].path == str(SHARDED / shard)


@pytest.mark.parametrize("c", [True, False], ids=["C place", "Python"])
def test_a_sharded_checkpoint_finds_each_names_info_and_file_when_first_asked(c, monkeypatch):
    if c and checkpoint._place_c is None:
        pytest.skip("weightio._speedups is not built here")
    monkeypatch.setattr(checkpoint, "_place_c", checkpoint._place_c if c else None)
    index = json.loads((SHARDED / "model.safetensors.index.json").read_text())["weight_map"]
    with wio.open(SHARDED) as ckpt:
        assert [v.path for _, v in ckpt.items()] == [str(SHARDED / index[n]) for n in ckpt]
        assert ckpt._placed == {}  # (opening and listing never build the map)
        last = list(ckpt)[-1]
        assert ckpt[last].path == str(SHARDED / index[last])
        files = ckpt.files
        assert {n: (info, files[i], serial) for n, (info, i, serial) in ckpt._placed.items()} == \
            {n: (ckpt._infos[n], str(SHARDED / index[n]), serial) for serial, n in enumerate(ckpt)}
        assert list(ckpt._placed) == list(ckpt)  # (serials in the map's order: the checkpoint's)
        # C leaves the map and its triples to reference counting: the collector never walks them
        assert gc.is_tracked(ckpt._placed) is not c
        assert all(gc.is_tracked(triple) is not c for triple in ckpt._placed.values())
        # a thread that found the map empty just before another filled it: still found, not filled twice
        placed = dict(ckpt._placed)
        first = next(iter(ckpt))
        assert ckpt._placed_triple(first) == (ckpt._infos[first], 0, 0) and ckpt._placed == placed
        assert ckpt._fill_placed() is ckpt._placed and ckpt._placed == placed
        with pytest.raises(KeyError):
            ckpt._placed_triple("no such tensor")


@pytest.mark.skipif(checkpoint._place_c is None, reason="weightio._speedups is not built here")
def test_the_c_map_declines_what_it_cannot_leave_untracked():
    from weightio.records import TensorInfo

    class Reader:
        def __init__(self, tensors):
            self.tensors = tensors

    info = TensorInfo(np.dtype("<f4"), (2,), 0, 8)
    place = checkpoint._place_c
    placed: dict = {}
    assert place(placed, [Reader({"a": info}), Reader({"b": info})], TensorInfo) is True
    assert placed == {"a": (info, 0, 0), "b": (info, 1, 1)} and not gc.is_tracked(placed)
    placed = {}
    # (serials past the ints Python caches)
    assert place(placed, [Reader({f"a{i}": info for i in range(300)}), Reader({"b": info})], TensorInfo) is True
    assert list(placed.values()) == [(info, 0, i) for i in range(300)] + [(info, 1, 300)]
    placed = {"a": (info, 0, 0), "b": (info, 1, 1)}
    assert place(placed, [Reader({"c": info})], TensorInfo) is True and list(placed) == ["a", "b"]  # filled already

    class Name(str):
        pass

    for readers in ([Reader({"a": info}), Reader({"b": (np.dtype("<f4"), (2,), 0, 8, None, None)})],  # not an info
                    [Reader({"a": info}), Reader({Name("b"): info})],  # a str subclass: its __eq__ could run code
                    [Reader({"a": info}), Reader(list({"b": info}.items()))]):  # not a dict
        placed = {}
        assert place(placed, readers, TensorInfo) is False and placed == {}
    for args in (({}, (Reader({"a": info}),), TensorInfo), ({}, [Reader({"a": info})], None)):  # a tuple; no type
        with pytest.raises(TypeError, match=r"place\(placed, readers, info_type\)"):
            place(*args)
    with pytest.raises(AttributeError):
        place({}, [object()], TensorInfo)

    class Racing:  # another thread fills the map while this one reads the readers' tables
        @property
        def tensors(self):
            placed["z"] = (info, 0, 0)
            return {"a": info}

    placed = {}
    assert place(placed, [Racing()], TensorInfo) is True and placed == {"z": (info, 0, 0)}


@pytest.mark.skipif(checkpoint._place_c is None, reason="weightio._speedups is not built here")
def test_no_finalizer_sees_the_c_map_half_filled():
    """A collection in the middle of the fill (Python 3.10 and 3.11 collect while C allocates)
    could run a finalizer, and any thread, while the map was part-filled: the triples are made with
    the collector off in a dict of place's own, and the map goes from empty to full in one step."""
    from weightio.records import TensorInfo

    class Reader:
        def __init__(self, tensors):
            self.tensors = tensors

    info = TensorInfo(np.dtype("<f4"), (2,), 0, 8)
    readers = [Reader({f"r{r}.t{i}": info for i in range(2000)}) for r in range(5)]
    placed: dict = {}
    seen: list[int] = []

    class Cycle:  # garbage whose finalizer records what it sees and leaves the next such garbage
        left = 5000

        def __init__(self):
            self.me = self

        def __del__(self):
            seen.append(len(placed))
            if Cycle.left > 0:
                Cycle.left -= 1
                Cycle()

    threshold = gc.get_threshold()
    gc.collect()
    try:
        gc.set_threshold(1)  # (a collection at nearly every allocation of a tracked object)
        Cycle()
        assert checkpoint._place_c(placed, readers, TensorInfo) is True
    finally:
        Cycle.left = 0
        gc.set_threshold(*threshold)
    gc.collect()
    assert len(placed) == 10_000 and seen and set(seen) <= {0, 10_000}


@pytest.mark.parametrize("path", [BERT, SHARDED], ids=["one file", "sharded"])
def test_items_and_values_are_the_mapping_s_views_in_file_order(path):
    with wio.open(path) as ckpt:
        looked_up = [(name, ckpt[name]) for name in ckpt]
        items, values = ckpt.items(), ckpt.values()
        assert len(items) == len(values) == len(ckpt) == 39
        assert [(n, v.name, v.path, v.info) for n, v in items] == [(n, v.name, v.path, v.info) for n, v in looked_up]
        assert [(v.name, v.path, v.info) for v in values] == [(v.name, v.path, v.info) for _, v in looked_up]
        name, view = looked_up[0]
        assert items.isdisjoint([("nope", view)]) and dict(items).keys() == set(ckpt)
        assert repr(items) == f"CheckpointItems({ckpt!r})"
        assert digest(dict(items)[name].numpy()) == digest(view.numpy())


def test_parameter_count_and_sizes():
    with wio.open(BERT) as ckpt:
        expected = sum(int(np.prod(s["shape"])) for s in manifest()["tiny-bert"].values())
        assert ckpt.parameter_count == expected
        assert ckpt.nbytes == expected * 4


def test_mapping_behaviour_and_suggestions():
    with wio.open(FIXTURES / "numpy.safetensors") as ckpt:
        assert list(ckpt) == ["weight", "bias"] or list(ckpt) == ["bias", "weight"]
        assert ckpt.get("nope") is None and "weight" in ckpt and 3 not in ckpt
        with pytest.raises(TensorNotFoundError) as info:
            ckpt["weigth"]
        assert isinstance(info.value, KeyError)
        assert info.value.suggestions == ["weight"]
        assert str(info.value).endswith("tensor 'weigth': no such tensor; did you mean 'weight'?")
    with wio.open(BERT) as ckpt:
        with pytest.raises(TensorNotFoundError) as info:
            ckpt["bert.encoder.layer.0.output.dense.weight"]
        assert info.value.suggestions[0] == "encoder.layer.0.output.dense.weight"


def test_close_keeps_returned_arrays_valid_and_refuses_new_reads():
    ckpt = wio.open(FIXTURES / "numpy.safetensors")
    arr = ckpt["weight"].numpy()
    view = ckpt["weight"]
    ckpt.close()
    assert ckpt.closed
    gc.collect()
    assert arr.sum() == 190.0  # still mapped: the mapping lives as long as the array
    with pytest.raises(WeightioError, match="the checkpoint was closed; open it again"):
        view.numpy()
    del arr
    gc.collect()


def test_context_manager_closes():
    with wio.open(FIXTURES / "numpy.safetensors") as ckpt:
        pass
    assert ckpt.closed and "closed" in repr(ckpt)


def _copy_sharded(tmp_path):
    target = tmp_path / "model"
    shutil.copytree(SHARDED, target)
    return target, json.loads((target / "model.safetensors.index.json").read_text())


def _write_index(target, index):
    (target / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_missing_shard(tmp_path):
    target, _ = _copy_sharded(tmp_path)
    (target / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CorruptFileError, match=r"model.safetensors.index.json: lists shard "
                                               r"'model-00002-of-00003.safetensors', which is missing"):
        wio.open(target)


def test_sharded_weight_map_points_at_the_wrong_shard(tmp_path):
    target, index = _copy_sharded(tmp_path)
    name, shard = next(iter(index["weight_map"].items()))
    other = next(s for s in set(index["weight_map"].values()) if s != shard)
    index["weight_map"][name] = other
    _write_index(target, index)
    with pytest.raises(CorruptFileError) as info:
        wio.open(target)
    assert f"maps tensor {name!r} to {other!r}, which does not hold it; it is in {shard!r}" in str(info.value)


def test_sharded_weight_map_names_a_tensor_no_shard_holds(tmp_path):
    target, index = _copy_sharded(tmp_path)
    shard = sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"]["ghost.weight"] = shard
    _write_index(target, index)
    with pytest.raises(CorruptFileError) as info:
        wio.open(target)
    assert str(info.value) == (f"{target / 'model.safetensors.index.json'}: maps tensor 'ghost.weight' to "
                               f"{shard!r}, which does not hold it")


def test_sharded_name_in_two_shards(tmp_path):
    target, index = _copy_sharded(tmp_path)
    first = target / "model-00001-of-00003.safetensors"
    with wio.open(first) as ckpt:
        name = next(iter(ckpt))
        wio.save({name: ckpt[name], "extra": np.zeros(1, np.float32)}, target / "model-00004-of-00004.safetensors")
    index["weight_map"]["extra"] = "model-00004-of-00004.safetensors"
    _write_index(target, index)
    with pytest.raises(CorruptFileError) as info:
        wio.open(target)
    assert str(info.value) == (f"{target}: tensor {name!r}: is stored in two files: {first} and "
                               f"{target / 'model-00004-of-00004.safetensors'}")


@pytest.mark.parametrize("index,message", [
    ({"weight_map": {"a": "../outside.safetensors"}}, "shard name '../outside.safetensors' points outside"),
    ({"weight_map": {"a": "/abs.safetensors"}}, "shard name '/abs.safetensors' points outside"),
    ({"weight_map": {"a": ".."}}, "shard name '..' points outside"),
    ({"weight_map": {"a": ""}}, "shard name '' points outside"),
    ({"weight_map": ["a"]}, "weight_map must be an object mapping tensor names to file names"),
    ({"weight_map": {"a": 3}}, "weight_map must be an object mapping tensor names to file names"),
    ({"weight_map": {}, "metadata": [1]}, "metadata must be an object"),
])
def test_malformed_index(tmp_path, index, message):
    target, _ = _copy_sharded(tmp_path)
    _write_index(target, index)
    with pytest.raises(CorruptFileError, match=message.replace("(", r"\(")):
        wio.open(target)


@pytest.mark.parametrize("paths", [posixpath, ntpath], ids=["posix", "windows"])
def test_shard_paths_are_the_joins_of_the_directory_and_each_name(paths):
    directories = ["m", "m/", "m//", ".", "./", "../m", "/abs/m", "", r"\\server\share", "//server/share",
                   r"\\?\UNC\s\sh", "C:", "C:\\", r"C:\m", "m\\", r"\\server"]
    names = ["model-00001-of-00191.safetensors", "sub/x.safetensors", r"sub\x.safetensors", "a b", "é.bin", "x..y"]
    for directory in directories:
        assert shard_paths(directory, names, paths) == {paths.join(directory, n): n for n in names}, directory


@pytest.mark.parametrize("shard,posix,windows", [
    ("model-00001-of-00002.safetensors", False, False),
    ("sub/model.safetensors", False, False),
    ("sub\\model.safetensors", False, False),
    ("a..b.safetensors", False, False),
    ("", True, True),
    ("..", True, True),
    ("../x.safetensors", True, True),
    ("sub/../../x.safetensors", True, True),
    ("sub\\..\\..\\x.safetensors", True, True),
    ("/abs.safetensors", True, True),
    ("\\abs.safetensors", False, True),
    ("C:x.safetensors", False, True),  # another drive's current directory on Windows; a file name elsewhere
    ("C:\\x.safetensors", False, True),
    ("\\\\server\\share\\x.safetensors", False, True),
    ("%2e%2e/x.safetensors", True, True),  # a URL's server (or yarl) decodes it to ../x
    ("sub%2F..%2F..%2Fx.safetensors", True, True),
    ("50%25.safetensors", False, False),  # (decoded: "50%.safetensors", a file name)
])
def test_shard_names_that_leave_the_model_directory(shard, posix, windows):
    from weightio import layout

    assert layout.outside(shard, posixpath) is posix
    assert layout.outside(shard, ntpath) is windows  # (Windows' rules, whatever this Python's ntpath.isabs says)
    if layout.plain_name(shard):  # check_index's shortcut: only names no system's rules refuse
        assert not posix and not windows
    index = {"weight_map": {"a": shard}}
    if layout.outside(shard):  # (this system's rule is the one check_index applies)
        with pytest.raises(CorruptFileError, match="points outside the model directory"):
            layout.check_index(index, "index.json")
    else:
        assert layout.check_index(index, "index.json") == ({"a": shard}, {})


def test_index_that_is_not_json(tmp_path):
    target, _ = _copy_sharded(tmp_path)
    (target / "model.safetensors.index.json").write_text('{"weight_map": {"a": "x", "a": "y"}}')
    with pytest.raises(CorruptFileError, match="index has the key 'a' twice"):
        wio.open(target)


def test_directories_without_a_clear_weight_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="is a directory with no weight files weightio recognises "
                                          r"\(found: nothing\)"):
        wio.open(tmp_path / "empty")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        shutil.copy(FIXTURES / "numpy.safetensors", two / name)
    with pytest.raises(FormatError, match=r"holds several candidate files \(a.safetensors, b.safetensors\)"):
        wio.open(two)
    shutil.copy(FIXTURES / "numpy.safetensors", two / "model.safetensors")
    with wio.open(two) as ckpt:  # the conventional name wins
        assert ckpt.files == [str(two / "model.safetensors")]


def test_a_sharded_set_opens_by_its_index_file_too():
    # review finding: only VarBuilder.from_path accepted an index file's path; wio.open refused it
    with wio.open(SHARDED / "model.safetensors.index.json") as by_index, wio.open(SHARDED) as by_dir:
        assert list(by_index) == list(by_dir) and by_index.files == by_dir.files
        assert all(by_index[n].numpy().tobytes() == by_dir[n].numpy().tobytes() for n in by_dir)


# ----------------------------------------------------------------------------- index files parsed in C

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from weightio import layout  # noqa: E402

_C_INDEX = layout._c_index
needs_c_index = pytest.mark.skipif(_C_INDEX is None, reason="weightio._speedups is not built here")


def _index_outcome(raw: bytes, c: bool, monkeypatch) -> object:
    """`layout.parse_index` of `raw` with the C path on or off: the result, or the refusal's words."""
    with monkeypatch.context() as m:
        m.setattr(layout, "_c_index", _C_INDEX if c else None)
        try:
            return layout.parse_index(raw, "x/model.safetensors.index.json")
        except WeightioError as e:
            return f"{type(e).__name__}: {e}"


_SCALARS = st.one_of(st.text(alphabet='ab:"\\é\x01', max_size=3), st.integers(-2**70, 2**70), st.booleans(), st.none(),
                     st.floats(allow_nan=False, allow_infinity=False), st.just([1]), st.just({"k": "v"}))


@needs_c_index
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(alphabet='ab.:"\\é\x01', max_size=4), max_size=5),
       shards=st.lists(st.sampled_from(["s1.safetensors", "s2.safetensors", "é.safetensors", "../up", "", "a\\\"b", 3]),
                       min_size=5, max_size=5),
       metadata=st.one_of(st.none(), st.dictionaries(st.text(alphabet="ab\\", max_size=2), _SCALARS, max_size=3)),
       order=st.sampled_from(["metadata first", "weight_map first", "no metadata", "extra key", "twice"]),
       spaces=st.booleans(), duplicate=st.booleans())
def test_an_index_parsed_in_c_reads_as_the_python_path_reads_it(monkeypatch, names, shards, metadata, order, spaces,
                                                                 duplicate):
    sep = (", ", ": ") if spaces else (",", ":")
    pairs = [json.dumps(n) + sep[1] + json.dumps(s) for n, s in zip(names, shards, strict=False)]
    if duplicate and pairs:
        pairs.append(pairs[0])
    weight_map = '"weight_map"' + sep[1] + "{" + sep[0].join(pairs) + "}"
    members = {"metadata first": ["M", weight_map], "weight_map first": [weight_map, "M"], "no metadata": [weight_map],
               "extra key": ['"other"' + sep[1] + "1", weight_map], "twice": [weight_map, weight_map]}[order]
    meta = '"metadata"' + sep[1] + json.dumps(metadata, separators=sep)
    raw = ("{" + sep[0].join(meta if m == "M" else m for m in members) + "}").encode()
    # (repr: the values' types and every dict's order count too)
    assert repr(_index_outcome(raw, True, monkeypatch)) == repr(_index_outcome(raw, False, monkeypatch))


_INDEX_EDGES = [
    (b'{"metadata":{"total_size":3},"weight_map":{"a":"s.safetensors","b":"s.safetensors"}}', True),
    (b' {\n "weight_map" : { "a" : "s" } ,\t"metadata" : { "x" : -5, "y": true, "z": null, "w": "v" } }\r\n', True),
    (b'{}', True),
    (b'{"weight_map":{}}', True),
    (b'{"metadata":{"total_size":-0}}', True),
    (b'{"metadata":{"total_size":1.5},"weight_map":{}}', False),
    (b'{"metadata":{"total_size":1e3},"weight_map":{}}', False),
    (b'{"metadata":{"total_size":1234567890123456789},"weight_map":{}}', False),
    (b'{"metadata":{"a":[1]},"weight_map":{}}', False),
    (b'{"metadata":{"a":{}},"weight_map":{}}', False),
    (b'{"metadata":null,"weight_map":{}}', False),
    (b'{"weight_map":{"a":3}}', False),
    (b'{"weight_map":{"a":"s","a":"s"}}', False),
    (b'{"weight_map":{},"weight_map":{}}', False),
    (b'{"weight_map":{"a\\u0062":"s"}}', False),
    (b'{"weight_map":{"a":"s"},"other":1}', False),
    (b'{"weight_map":{"\xff":"s"}}', False),
    (b'{"weight_map":{"a":"s"}', False),
    (b'{"weight_map":{"a":"s"},}', False),
    (b'{"weight_map":{"a":"s"}} x', False),
    (b'\xef\xbb\xbf{"weight_map":{}}', False),
    (b'{"metadata":{"a":tru},"weight_map":{}}', False),
    (b'{"weight_map":{"a":"\xc3\xa9.s","b":"\xc3\xa9.s"}}', True),  # (a non-ASCII shard name, made twice)
    (b'{"weight_map":{"a":"\xc3\xa9","b":"\xe9"}}', False),  # (the same character, then invalid UTF-8)
    (b'{"metadata":{"a":"\xc3\xa9","b":"\xe9"},"weight_map":{}}', False),
    (b'{"metadata":{"a":-\n1},"weight_map":{}}', False),  # (found by a mutation differential: no space after a sign)
    (b'{"metadata":{"a":- 1},"weight_map":{}}', False),
    (b'{"metadata":{"a":-},"weight_map":{}}', False),
    (b'[]', False),
    (b'', False),
]


@needs_c_index
@pytest.mark.parametrize("raw,plain", _INDEX_EDGES)
def test_the_c_path_reads_plain_indexes_and_leaves_the_rest_to_python(monkeypatch, raw, plain):
    found = _C_INDEX(raw)
    assert (found is not None) == plain
    if plain:
        assert repr(found) == repr(json.loads(raw))  # (the values' types and every dict's order too)
    assert repr(_index_outcome(raw, True, monkeypatch)) == repr(_index_outcome(raw, False, monkeypatch))


@needs_c_index
def test_a_model_s_index_is_read_in_c(monkeypatch):
    taken = []
    monkeypatch.setattr(layout, "_c_index", lambda raw: taken.append(1) or _C_INDEX(raw))
    monkeypatch.setattr(layout, "parse_json_object", lambda *a, **k: pytest.fail("the Python path was taken"))
    with wio.open(SHARDED) as ckpt:
        assert taken == [1] and len(ckpt) == 39 and ckpt.metadata["total_size"] > 0


@needs_c_index
def test_mutated_indexes_read_as_the_python_path_reads_them(monkeypatch):
    """A short run of the mutation differential that found the sign-and-space case: byte changes,
    JSON tokens inserted, deletions and cuts of a real index and a hand-made one."""
    seeds = [(SHARDED / "model.safetensors.index.json").read_bytes(),
             b'{"metadata":{"total_size":3,"format":"pt","n":-1,"t":true,"z":null},"weight_map":{"a":"s1","b":"s1"}}']
    tokens = [b'"', b"\\", b"{", b"}", b":", b",", b"-", b"0", b"1.5", b"true", b"null", b"\xff", b"\xc3\xa9",
              b"\xed\xa0\x80", b" ", b"\n", b'"weight_map"', b'"metadata"', b"\\u0041", b"\x00", b"1e3",
              b"1234567890123456789"]
    rng, read = random.Random(5), 0
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at, op = rng.randrange(len(data) + 1), rng.randrange(4)
            if op == 0 and data:
                data[min(at, len(data) - 1)] = rng.randrange(256)
            elif op == 1:
                data[at:at] = rng.choice(tokens)
            elif op == 2:
                del data[at : at + rng.randint(1, 8)]
            else:
                del data[at:]
        raw = bytes(data)
        read += _C_INDEX(raw) is not None
        assert repr(_index_outcome(raw, True, monkeypatch)) == repr(_index_outcome(raw, False, monkeypatch)), raw
    assert read > 100  # (the C path read some of them, not only handed them on)
