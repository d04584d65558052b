"""The PyTorch reader's fast paths (issue 16, PyTorch open), each tested against the general path
it stands in for:

* the prepass's fast path for torch.save's state-dict entries (weightio.formats.pytorch.entries):
  on real torch.save pickles and on mutations of them, the lexer with the fast path ends in exactly
  the state the general loop alone ends in (memo, stack, marks, memo writes, globals), or raises
  the same error with the same message; and it does run, over nearly every opcode of a large
  state dict;
* `flatten`'s fast path for a flat state dict: the same tensors, in the same order, or the walk's
  own error."""

from __future__ import annotations

import functools
import io
import pickle
import pickletools
import struct
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightio import limits as _limits
from weightio.errors import WeightioError
from weightio.formats.pytorch import entries, flatten, lexer
from weightio.formats.pytorch.refs import StorageRef, TensorRef

from ..conftest import both_ways

torch = pytest.importorskip("torch")


def _data_pkl(state, **save) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer, **save)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


def _outcome(data: bytes, limits: _limits.Limits | None = None, collect: bool = False):
    """The lexer's final state, or (error type, message)."""
    try:
        lx = lexer.lex(data, limits=limits, collect=collect, path="f.pt", what="data.pkl")
    except WeightioError as e:
        return type(e), str(e)
    return (lx.pos, lx.stack, lx.memo, lx.puts, lx.marks, lx.fence, lx.weak_keys, lx.globals, lx.text8,
            [str(e) for e in lx.refusals or []])


def _general(monkeypatch):
    """Switch the fast path off (the lexer looks it up on every run)."""
    monkeypatch.setattr(entries, "run", lambda data, pos, budget, stack, memo, puts, *rest: (pos, 0, puts))


def _both(monkeypatch, data: bytes, limits=None, collect=False):
    fast = _outcome(data, limits, collect)
    with monkeypatch.context() as m:
        _general(m)
        general = _outcome(data, limits, collect)
    return fast, general


def _state(n: int, seed: int = 0) -> dict:
    """A state dict with what real ones have: dtypes, 0-D to 5-D, numels needing BININT1/2/4, views
    of one storage (offsets, strides), empty tensors, a shared tensor."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 8), (300,), (), (2, 3, 4, 5), (1, 2, 1, 2, 1), (70000,), (0, 3), (257, 3)]
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8]
    base = torch.arange(64, dtype=torch.float32)
    state = {}
    for i in range(n):
        if i % 17 == 5:
            state[f"view.{i}"] = base[i % 40: i % 40 + 8].view(2, 4)  # offset into a shared storage
        elif i % 23 == 7:
            state[f"t.{i}"] = base.view(8, 8).t()  # strides (1, 8)
        else:
            shape = shapes[i % len(shapes)]
            state[f"model.layers.{i}.weight"] = torch.randn(shape, generator=g).to(dtypes[i % len(dtypes)])
    state["tied"] = state["model.layers.0.weight"]
    return state


@pytest.fixture(scope="module")
def big() -> bytes:
    return _data_pkl({f"model.layers.{i // 10}.mlp.{i % 10}.weight": torch.zeros(4, 8) for i in range(3000)})


@pytest.fixture(scope="module")
def mixed() -> bytes:
    return _data_pkl(_state(400))


def test_a_large_state_dict_lexes_to_the_same_state_and_nearly_every_opcode_takes_the_fast_path(big, monkeypatch):
    consumed = []
    run = entries.run

    def counted(*args):
        result = run(*args)
        consumed.append(result[1])
        return result

    monkeypatch.setattr(entries, "run", counted)
    fast = _outcome(big)
    ops = sum(1 for _ in pickletools.genops(big))
    assert sum(consumed) > 0.98 * ops  # all but the first entry, and the SETITEMS between batches of 1000
    monkeypatch.setattr(entries, "run", run)
    fast_again, general = _both(monkeypatch, big)
    assert fast == fast_again == general
    assert general[0] == len(big)


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_dtypes_shapes_views_and_protocols_lex_alike(monkeypatch, protocol, seed):
    data = _data_pkl(_state(300, seed), pickle_protocol=protocol)
    fast, general = _both(monkeypatch, data)
    assert fast == general
    assert fast[0] == len(data)


def test_a_model_state_dict_with_parameters_and_metadata_lexes_alike(monkeypatch):
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(200)], torch.nn.BatchNorm1d(3))
    for data in (_data_pkl(model.state_dict()), _data_pkl(dict(model.named_parameters()))):
        fast, general = _both(monkeypatch, data)
        assert fast == general and fast[0] == len(data)


@pytest.mark.parametrize(("change", "refused"), [
    ({"pickle_opcodes": 5_000}, "opcodes"), ({"pickle_opcodes": 5_003}, "opcodes"),
    ({"pickle_opcodes": 95_232}, "opcodes"), ({"pickle_opcodes": 95_233}, None),  # checked per 1024
    ({"pickle_stack": 150}, "items on the pickle stack"), ({"pickle_stack": 1_004}, "items on the pickle stack"),
    ({"pickle_stack": 1_988}, "items on the pickle stack"), ({"pickle_stack": 1_989}, None),
    ({"nesting_depth": 1}, "nested MARKs"), ({"nesting_depth": 2}, "nested MARKs"), ({"nesting_depth": 3}, None),
])
def test_limits_that_fall_inside_the_fast_path_raise_what_the_general_loop_raises(big, monkeypatch, change, refused):
    fast, general = _both(monkeypatch, big, _limits.current().replace(**change))
    assert fast == general
    if refused is None:
        assert fast[0] == len(big)
    else:
        assert refused in fast[1], fast[1]


@functools.cache
def _entry_offsets(data: bytes, name: str) -> list[int]:
    """Offsets of every `name` opcode in the pickle."""
    return [pos for op, _, pos in pickletools.genops(data) if op.name == name]


def test_hostile_memo_indices_and_unset_gets_inside_entries_are_refused_alike(big, monkeypatch):
    puts = _entry_offsets(big, "LONG_BINPUT")
    gets = _entry_offsets(big, "BINGET")
    cases = []
    for at in (puts[500], puts[1999], puts[-3]):
        cases.append(big[:at + 1] + struct.pack("<I", 0x7FFFFFFF) + big[at + 5:])  # a memo bomb
        cases.append(big[:at + 1] + struct.pack("<I", 0) + big[at + 5:])  # overwrites slot 0 (the dict)
    for at in (gets[300], gets[1500]):
        cases.append(big[:at + 1] + bytes([250]) + big[at + 2:])  # a slot never written
        cases.append(big[:at] + b"j" + struct.pack("<I", 10**6) + big[at + 2:])  # LONG_BINGET, unset
        cases.append(big[:at + 1] + bytes([0]) + big[at + 2:])  # the dict itself (a deeper item)
    for data in cases:
        fast, general = _both(monkeypatch, data)
        assert fast == general


_MUTATION = st.tuples(st.integers(0, 1 << 30), st.sampled_from(["set", "insert", "delete", "cut"]),
                      st.sampled_from(list(b"qrhjKMJ()t\x85\x86\x87QR\x88\x89X\x8c}u.")) | st.integers(0, 255))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(_MUTATION, min_size=1, max_size=3), collect=st.booleans())
def test_mutated_torch_pickles_lex_alike(mixed, monkeypatch, mutations, collect):
    """A byte changed, inserted or removed anywhere, or the pickle cut short: the same state or error."""
    data = bytearray(mixed)
    for at, kind, byte in mutations:
        at %= max(len(data), 1)
        if kind == "set" and data:
            data[at] = byte
        elif kind == "insert":
            data[at:at] = bytes([byte])
        elif kind == "delete":
            del data[at:at + 1]
        else:
            del data[at:]
    fast, general = _both(monkeypatch, bytes(data), collect=collect)
    assert fast == general


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 1 << 30), value=st.integers(0, 2**32 - 1))
def test_any_memo_index_or_length_in_an_entry_lexes_alike(big, monkeypatch, at, value):
    """Any 4-byte argument (LONG_BINPUT index, string length) rewritten to any value."""
    offsets = _entry_offsets(big, "LONG_BINPUT") + _entry_offsets(big, "BINUNICODE")
    at = offsets[at % len(offsets)]
    data = big[:at + 1] + struct.pack("<I", value) + big[at + 5:]
    fast, general = _both(monkeypatch, data)
    assert fast == general


def test_a_pickle_of_plain_strings_is_unaffected(monkeypatch):
    data = pickle.dumps({f"key{i}": [f"v{i}", i, (i, "x")] for i in range(2000)}, protocol=2)
    fast, general = _both(monkeypatch, data)
    assert fast == general and fast[0] == len(data)


# ----------------------------------------------------------------------------- flatten


def _flattened(monkeypatch, root, **limits):
    return both_ways(monkeypatch, flatten, "_state_dict", lambda *args: None,
                     lambda: flatten.flatten(root, root_name="model", **{"budget": 10**6, **limits}))


def _ref(i: int = 0) -> TensorRef:
    return TensorRef(StorageRef(str(i), "float32", 4), 0, (2, 2), (2, 1))


def test_a_flat_state_dict_flattens_as_the_walk_does(monkeypatch):
    refs = {f"layers.{i}.weight": _ref(i) for i in range(1000)}
    fast, walked = _flattened(monkeypatch, refs)
    assert fast == walked
    assert list(fast[0]) == list(refs) and fast[1] == {}
    assert all(fast[0][k] is v for k, v in refs.items())


@pytest.mark.parametrize(("root", "limits"), [
    ({"": _ref()}, {}),  # an empty key: named after the file
    ({"a": _ref(), 1: _ref()}, {}),  # an int key
    ({"a": _ref(), "b": [1, 2]}, {}),  # metadata
    ({"a": _ref(), "b": {"c": _ref()}}, {}),  # nested
    ({"a\ud800": _ref()}, {}),  # a lone surrogate
    ({"x" * 100: _ref()}, {"max_name_bytes": 99}),  # a name over the limit
    ({"\u00e9" * 40: _ref()}, {"max_name_bytes": 79}),  # over it in UTF-8 bytes only
    ({"\u00e9" * 40: _ref()}, {"max_name_bytes": 80}),
    ({f"k{i}": _ref() for i in range(10)}, {"budget": 9}),  # more entries than steps
    ({f"k{i}": _ref() for i in range(10)}, {"budget": 10}),
    ({"k" * 200: _ref()}, {"budget": 12}),  # names over 16 characters per step
    ({}, {}),
])
def test_what_is_not_a_plain_state_dict_or_breaks_a_limit_is_the_walks(monkeypatch, root, limits):
    fast, walked = _flattened(monkeypatch, root, **limits)
    assert fast == walked


def test_a_legacy_file_of_protocol_4_pickles_opens_with_every_tensor(tmp_path):
    # its pickles follow one another, each lexed from where it starts, the last in consecutive frames
    import numpy as np

    import weightio as wio

    state = {f"layer.{i}.weight": torch.full((2,), float(i)) for i in range(3000)}
    path = tmp_path / "legacy4.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False, pickle_protocol=4)
    with wio.open(path) as ckpt:
        assert list(ckpt) == list(state)
        for name in ("layer.0.weight", "layer.2999.weight"):
            np.testing.assert_array_equal(ckpt[name].numpy(), state[name].numpy())
