"""Hostile pickles against the placeholder mode (``unknown_globals="placeholder"``) and the stand-ins
of training objects (weightio/formats/pytorch/placeholders.py, standins.py).

`PLACEHOLDER_HOSTILE` is run in placeholder mode: payloads that would run code through REDUCE,
NEWOBJ, INST/OBJ, EXT, BUILD with dunder keys, placeholders as dict keys, as arguments, as a
persistent id's answer, as a rebuild function or a tensor type, inside ``_parameters``; budgets
on depth, distinct globals and flattening work. Each either reads, with exactly the tensors and
metadata given (what was recorded, as plain data), or raises exactly the error given.
`STANDIN_HOSTILE` is run in the default mode: malformed OmegaConf, TorchVersion, datetime, enum,
path and record states. Every payload `touch`es a marker file if it ever ran: it must not exist,
and no module may be imported while the file is read.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import weightio as wio
import weightio.formats.pytorch  # noqa: F401 - imported before the sys.modules snapshots
from weightio.errors import CorruptFileError, UnsafePickleError, WeightioError

from .pytorch_files import (
    BUILD,
    EMPTY_DICT,
    EMPTY_LIST,
    EMPTY_TUPLE,
    MARK,
    NEWFALSE,
    NONE,
    P2,
    P4,
    REDUCE,
    SETITEM,
    SETITEMS,
    STACK_GLOBAL,
    STOP,
    bounded,
    call,
    f32,
    g,
    i,
    ints,
    legacy_file,
    pid,
    s,
    state_dict,
    tensor,
    torch_zip,
    tup,
)

"x".encode("cp437")  # the zip reader decodes CP437 names: load the codec before any snapshot

NEWOBJ, BINPUT0, BINGET0, APPENDS, DICT = b"\x81", b"q\x00", b"h\x00", b"e", b"d"
KEY = "weightio.placeholders"
W3 = pid("FloatStorage", "0", 3)


ODD_MODULE = "evil\x1b]0;pwned\x07\udc80"  # a terminal title escape and a lone surrogate


@dataclass(frozen=True)
class Hostile:
    """A hostile pickle and its exact outcome: `error` and `message`, or the tensors and metadata read."""

    name: str
    build: Callable[[Path], bytes]
    error: type[WeightioError] | None = None
    message: str = ""
    tensors: tuple[str, ...] = ()
    metadata: dict | None = None


def _touch(marker: Path) -> bytes:
    return s(f"touch {marker}")


def _new(module: str, name: str, *args: bytes) -> bytes:
    return g(module, name) + tup(*args) + NEWOBJ


def _dict(**items: bytes) -> bytes:
    return EMPTY_DICT + MARK + b"".join(s(k) + v for k, v in items.items()) + SETITEMS


def _zip(body: bytes) -> bytes:
    return torch_zip(P2 + body + STOP, {"0": f32(1, 2, 3)})


def _module(params: bytes = EMPTY_DICT, buffers: bytes = EMPTY_DICT, modules: bytes = EMPTY_DICT,
            cls: str = "Net", **more: bytes) -> bytes:
    state = _dict(_parameters=params, _buffers=buffers, _modules=modules, **more)
    return _new("evil", cls) + state + BUILD


def _nested_calls(depth: int) -> bytes:
    return g("evil", "f") * depth + EMPTY_TUPLE + (tup_one() + REDUCE) * depth


def tup_one() -> bytes:
    return b"\x85"  # TUPLE1: the item on the stack as a one-item tuple


def _distinct_globals(n: int) -> bytes:
    return EMPTY_LIST + MARK + b"".join(g("evil", f"g{k}") for k in range(n)) + APPENDS


def _shared_state(keys: int, refs: int) -> bytes:
    obj = _new("evil", "Big") + EMPTY_DICT + MARK + b"".join(s(f"k{k}") + i(k) for k in range(keys)) + SETITEMS + BUILD
    return obj + BINPUT0 + b"0" + EMPTY_LIST + MARK + BINGET0 * refs + APPENDS  # b"0": POP


def _rebuild_from_type(func: bytes, new_type: bytes) -> bytes:
    args = tup(W3, i(0), ints((3,)), ints((1,)), NEWFALSE, call("collections", "OrderedDict"))
    return call("torch._tensor", "_rebuild_from_type_v2", func, new_type, args, EMPTY_DICT)


PLACEHOLDER_HOSTILE = [
    Hostile("os.system via REDUCE", lambda m: P2 + call("os", "system", _touch(m)) + STOP,
            metadata={"__class__": "os.system", "__args__": ["touch {m}"], KEY: ["os.system"]}),
    Hostile("builtins.eval via REDUCE inside a zip beside a tensor",
            lambda m: _zip(_dict(w=tensor(W3, 0, (3,), (1,)), x=call("builtins", "eval", s("__import__('os')")))),
            tensors=("w",), metadata={"x.__class__": "builtins.eval", "x.__args__": ["__import__('os')"],
                                      KEY: ["builtins.eval"]}),
    Hostile("subprocess.Popen via NEWOBJ", lambda m: P2 + _new("subprocess", "Popen", _touch(m)) + STOP,
            metadata={"__class__": "subprocess.Popen", "__args__": ["touch {m}"], KEY: ["subprocess.Popen"]}),
    Hostile("INST os system", lambda m: P2 + MARK + b"ios\nsystem\n" + _touch(m) + STOP, UnsafePickleError,
            "opcode INST at offset 3 builds objects without naming an allowlisted global; refused"),
    Hostile("OBJ on os.system", lambda m: P2 + MARK + g("os", "system") + _touch(m) + b"o" + STOP, UnsafePickleError,
            "opcode OBJ at offset"),
    Hostile("EXT1 code 1", lambda m: P2 + b"\x82\x01" + EMPTY_TUPLE + REDUCE + STOP, UnsafePickleError,
            "opcode EXT1 at offset 2 builds objects without naming an allowlisted global; refused"),
    Hostile("BUILD with __setstate__ and __reduce__ keys is recorded, never set",
            lambda m: P2 + _new("evil", "Obj") + _dict(__setstate__=call("os", "system", _touch(m)),
                                                      __reduce__=s("eval")) + BUILD + STOP,
            metadata={"__class__": "evil.Obj", "__state__.__setstate__.__class__": "os.system",
                      "__state__.__setstate__.__args__": ["touch {m}"], "__state__.__reduce__": "eval",
                      KEY: ["evil.Obj", "os.system"]}),
    Hostile("BUILD with a (dict, slots) state naming __class__",
            lambda m: P2 + _new("evil", "Obj") + tup(NONE, _dict(__class__=g("os", "system"))) + BUILD + STOP,
            metadata={"__class__": "evil.Obj", "__state__.0": None, "__state__.1.__class__": "os.system",
                      KEY: ["evil.Obj", "os.system"]}),
    Hostile("BUILD on a placeholder class itself",
            lambda m: P2 + g("evil", "Cls") + _dict(x=i(1)) + BUILD + STOP, UnsafePickleError,
            "BUILD on the class evil.Cls (not an instance of it) is not allowed"),
    Hostile("a placeholder as a dict key (hashed by identity)",
            lambda m: P2 + EMPTY_DICT + call("evil", "Key") + i(1) + SETITEM + STOP,
            metadata={"<evil.Key placeholder>": 1, KEY: ["evil.Key"]}),
    Hostile("a placeholder in a set (weak keys refused)",
            lambda m: P2 + call("builtins", "set", EMPTY_LIST + MARK + call("evil", "K") + APPENDS) + STOP,
            CorruptFileError, "set holds keys other than strings and small integers"),
    Hostile("placeholders called with placeholders, then called",
            lambda m: P2 + call("evil", "f", call("evil", "g", _touch(m))) + EMPTY_TUPLE + REDUCE + STOP,
            metadata={"__class__": "<call>", "__args__.0.__class__": "evil.f", "__args__.0.__args__.0.__class__":
                      "evil.g", "__args__.0.__args__.0.__args__": ["touch {m}"], KEY: ["evil.f", "evil.g"]}),
    Hostile("NEWOBJ on a placeholder instance", lambda m: P2 + call("evil", "f") + EMPTY_TUPLE + NEWOBJ + STOP,
            CorruptFileError, "NEWOBJ on something that is not a class"),
    Hostile("SETITEMS and APPENDS on a placeholder are recorded",
            lambda m: P2 + _new("evil", "D") + MARK + s("a") + i(1) + SETITEMS + MARK + i(2) + APPENDS + STOP,
            metadata={"__class__": "evil.D", "__items__.a": 1, "__list__": [2], KEY: ["evil.D"]}),
    Hostile("a placeholder class as a persistent id's storage class",
            lambda m: torch_zip(P2 + tensor(tup(s("storage"), g("evil", "Storage"), s("0"), s("cpu"), i(3))
                                            + b"Q", 0, (3,), (1,)) + STOP, {"0": f32(1, 2, 3)}),
            CorruptFileError, "storage '0': evil.Storage is not a torch storage class"),
    Hostile("a legacy ('module', …) id answered by its placeholder class",
            lambda m: legacy_file(P2 + tup(s("module"), g("evil", "Net"), s("net.py"), _touch(m)) + b"Q"
                                  + EMPTY_TUPLE + NEWOBJ + STOP, [], []),
            metadata={"__class__": "evil.Net", KEY: ["evil.Net"]}),
    Hostile("a legacy ('module', …) id whose class is a string",
            lambda m: legacy_file(P2 + tup(s("module"), s("evil.Net"), s("net.py"), _touch(m)) + b"Q" + STOP, [], []),
            CorruptFileError, "is not ('module', class, source file, source)"),
    Hostile("a placeholder pretending to be a rebuild function",
            lambda m: _zip(_rebuild_from_type(g("evil", "rebuild"), g("torch", "Tensor"))), UnsafePickleError,
            "_rebuild_from_type_v2 with function evil.rebuild, which is not a torch rebuild function; refused"),
    Hostile("a placeholder as _rebuild_from_type_v2's type (a tensor subclass)",
            lambda m: _zip(_dict(w=_rebuild_from_type(g("torch._utils", "_rebuild_tensor_v2"), g("evil", "MyTensor")))),
            tensors=("w",), metadata={KEY: ["evil.MyTensor"]}),
    Hostile("a tensor subclass whose state has dunder keys",
            lambda m: _zip(call("torch._tensor", "_rebuild_from_type_v2", g("torch._utils", "_rebuild_tensor_v2"),
                                g("evil", "T"), tup(W3, i(0), ints((3,)), ints((1,)), NEWFALSE,
                                                    call("collections", "OrderedDict")), _dict(__class__=i(1)))),
            UnsafePickleError, "a tensor's state sets attribute '__class__'"),
    Hostile("a module whose _parameters hold placeholders and ints",
            lambda m: _zip(_module(params=_dict(w=tensor(W3, 0, (3,), (1,)), x=call("os", "system", _touch(m)),
                                                n=i(3), gone=NONE))),
            tensors=("w",), metadata={"x.__class__": "os.system", "x.__args__": ["touch {m}"], "n": 3,
                                      KEY: ["evil.Net", "os.system"]}),
    Hostile("a module that lists itself as a submodule",
            lambda m: P2 + _new("evil", "Net") + BINPUT0 + _dict(_parameters=EMPTY_DICT, _buffers=EMPTY_DICT,
                                                                  _modules=_dict(me=BINGET0)) + BUILD + STOP,
            metadata={"me": "<evil.Net placeholder>", KEY: ["evil.Net"]}),
    Hostile("a module's non-persistent buffer set given as a list",
            lambda m: _zip(_module(buffers=_dict(b=tensor(W3, 0, (3,), (1,))),
                                   _non_persistent_buffers_set=EMPTY_LIST + MARK + s("b") + APPENDS)),
            CorruptFileError, "a module's _non_persistent_buffers_set is not a set"),
    Hostile("a global named with ESC and a lone surrogate (STACK_GLOBAL): listed as spelled",
            lambda m: P4 + s(ODD_MODULE) + s("f") + STACK_GLOBAL + EMPTY_TUPLE + REDUCE + STOP,
            metadata={"__class__": f"{ODD_MODULE}.f", KEY: [f"{ODD_MODULE}.f"]}),
    Hostile("a global named with ESC and a lone surrogate, in an error message: escaped",
            lambda m: torch_zip(P4 + tensor(s(ODD_MODULE) + s("S") + STACK_GLOBAL + EMPTY_TUPLE + REDUCE, 0, (3,), (1,))
                                + STOP, {"0": f32(1, 2, 3)}),
            CorruptFileError, "tensor 'hostile': its storage is <evil\\x1b]0;pwned\\x07\\udc80.S placeholder>, not a "
                              "torch storage"),
    Hostile("BUILD on a placeholder class named with ESC: escaped",
            lambda m: P4 + s(ODD_MODULE) + s("C") + STACK_GLOBAL + EMPTY_DICT + BUILD + STOP, UnsafePickleError,
            "BUILD on the class evil\\x1b]0;pwned\\x07\\udc80.C (not an instance of it) is not allowed"),
    Hostile("5 000 nested placeholder calls", lambda m: P2 + _nested_calls(5_000) + STOP, CorruptFileError,
            "the pickled object nests deeper than 1,000 levels"),
    Hostile("10 001 distinct unknown globals", lambda m: P2 + _distinct_globals(10_001) + STOP, CorruptFileError,
            "the pickle names more than 10,000 distinct globals outside the allowlist"),
    Hostile("a global name of 5 000 characters", lambda m: P2 + call("evil", "x" * 5000) + STOP, CorruptFileError,
            "the pickle names a global of 5,005 characters"),
    Hostile("a module of 20 000 None parameters reached 20 000 times (skipped entries are work too)",
            lambda m: P2 + _module(params=EMPTY_DICT + MARK + b"".join(s(f"p{k}") + NONE for k in range(20_000))
                                   + SETITEMS) + BINPUT0 + b"0" + EMPTY_LIST + MARK + BINGET0 * 20_000 + APPENDS + STOP,
            CorruptFileError, "flattening the pickled object takes more than"),
    Hostile("one placeholder's 2 000 attributes reached 5 000 times", lambda m: P2 + _shared_state(2000, 5000) + STOP,
            CorruptFileError, "flattening the pickled object takes more than"),
]


def _expand(value, marker: Path):  # noqa: ANN001, ANN202
    if isinstance(value, str):
        return value.replace("{m}", str(marker))
    if isinstance(value, list):
        return [_expand(v, marker) for v in value]
    return value


def _hostile(tmp_path: Path, build: Callable[[Path], bytes], suffix: str = ".pt") -> tuple[Path, Path]:
    marker = tmp_path / "PWNED"
    path = tmp_path / f"hostile{suffix}"
    path.write_bytes(build(marker))
    return path, marker


@pytest.mark.parametrize("case", PLACEHOLDER_HOSTILE, ids=[c.name for c in PLACEHOLDER_HOSTILE])
def test_placeholder_mode_never_runs_anything(tmp_path, case):
    path, marker = _hostile(tmp_path, case.build)
    before = set(sys.modules)
    with bounded(seconds=20, extra_mib=512):
        if case.error is not None:
            with pytest.raises(case.error) as info:
                wio.open(path, unknown_globals="placeholder")
            assert type(info.value) is case.error
            assert case.message in str(info.value), str(info.value)
            assert str(info.value).startswith(f"{path}: ")
            str(info.value).encode("utf-8")  # printable: no lone surrogate (nor ESC) from the file
        else:
            with wio.open(path, unknown_globals="placeholder") as ckpt:
                assert list(ckpt) == list(case.tensors)
                for name in ckpt:
                    ckpt[name].numpy()
                assert ckpt.metadata == {k.replace("{m}", str(marker)): _expand(v, marker)
                                         for k, v in case.metadata.items()}
    assert not marker.exists(), "a payload ran"
    assert set(sys.modules) - before == set(), "a module was imported"
    if case.error is None:  # the default mode refuses what needed a placeholder; scan calls it unsafe
        with pytest.raises(UnsafePickleError, match="is not on weightio's allowlist"):
            wio.open(path)
        assert not wio.scan(path).safe


def _omega(content: bytes, cls: str = "DictConfig", module: str = "omegaconf.dictconfig") -> bytes:
    return _new(module, cls) + _dict(_content=content, _parent=NONE) + BUILD


STANDIN_HOSTILE = [
    Hostile("TorchVersion of a list", lambda m: P2 + _new("torch.torch_version", "TorchVersion", EMPTY_LIST) + STOP,
            CorruptFileError, "torch.torch_version.TorchVersion takes one string, found ([],)"),
    Hostile("TorchVersion without arguments, then SETITEM",
            lambda m: P2 + _new("torch.torch_version", "TorchVersion") + s("k") + i(1) + SETITEM + STOP,
            CorruptFileError, "TorchVersion takes one string"),
    Hostile("datetime of 9 bytes", lambda m: P2 + call("datetime", "datetime", b"C\x09" + b"\x07" * 9) + STOP,
            CorruptFileError, "datetime.datetime state must be 10 bytes"),
    Hostile("datetime in month 13",
            lambda m: P2 + call("datetime", "datetime", b"C\x0a" + bytes([7, 232, 13, 1, 0, 0, 0, 0, 0, 0])) + STOP,
            CorruptFileError, "is not a valid value (month must be in 1..12)"),
    Hostile("datetime whose time zone is os.system",
            lambda m: P2 + call("datetime", "datetime", b"C\x0a" + bytes([7, 232, 1, 1, 0, 0, 0, 0, 0, 0]),
                                g("os", "system")) + STOP, UnsafePickleError, "asks for global 'os.system'"),
    Hostile("timedelta of 10^20 days", lambda m: P2 + call("datetime", "timedelta", i(10**20)) + STOP,
            CorruptFileError, "datetime.timedelta(100000000000000000000, 0, 0) is not a valid value"),
    Hostile("timezone of a string", lambda m: P2 + call("datetime", "timezone", s("+05:00")) + STOP,
            CorruptFileError, "datetime.timezone takes a timedelta and a name"),
    Hostile("enum member of a list",
            lambda m: P2 + call("transformers.trainer_utils", "IntervalStrategy", EMPTY_LIST) + STOP,
            CorruptFileError, "enum transformers.trainer_utils.IntervalStrategy takes one plain value"),
    Hostile("path of an int", lambda m: P2 + call("pathlib", "PosixPath", s("/tmp"), i(3)) + STOP,
            CorruptFileError, "pathlib.PosixPath takes strings"),
    Hostile("defaultdict with two arguments",
            lambda m: P2 + call("collections", "defaultdict", g("builtins", "list"), i(1)) + STOP,
            CorruptFileError, "collections.defaultdict takes one argument"),
    Hostile("DictConfig state with a __class__ key",
            lambda m: P2 + _new("omegaconf.dictconfig", "DictConfig") + _dict(__class__=g("builtins", "dict"))
            + BUILD + STOP, UnsafePickleError,
            "the state of omegaconf.dictconfig.DictConfig sets attribute '__class__'"),
    Hostile("DictConfig with a positional argument",
            lambda m: P2 + _new("omegaconf.dictconfig", "DictConfig", i(1)) + STOP,
            CorruptFileError, "omegaconf.dictconfig.DictConfig takes no positional arguments"),
    Hostile("DictConfig that contains itself",
            lambda m: P2 + _new("omegaconf.dictconfig", "DictConfig") + BINPUT0
            + _dict(_content=_dict(me=BINGET0)) + BUILD + STOP, CorruptFileError, "contains itself"),
    Hostile("TrainingArguments with a __dict__ attribute",
            lambda m: P2 + _new("transformers.training_args", "TrainingArguments") + _dict(__dict__=EMPTY_DICT)
            + BUILD + STOP, UnsafePickleError, "sets attribute '__dict__'"),
    Hostile("BUILD on the DictConfig class",
            lambda m: P2 + g("omegaconf.dictconfig", "DictConfig") + _dict(x=i(1)) + BUILD + STOP,
            UnsafePickleError, "BUILD on the class omegaconf.dictconfig.DictConfig"),
    Hostile("calling builtins.dict (a type token)", lambda m: P2 + call("builtins", "dict", EMPTY_LIST) + STOP,
            CorruptFileError, "'Token' object is not callable"),
    Hostile("ListConfig whose content is itself (it would grow while read, forever)",
            lambda m: P2 + _new("omegaconf.listconfig", "ListConfig") + BINPUT0 + MARK + i(1) + i(2) + APPENDS
            + _dict(_content=BINGET0) + BUILD + STOP, metadata={"hostile": [1, 2, 1, 2]}),
    Hostile("DictConfig whose content is itself",
            lambda m: P2 + _new("omegaconf.dictconfig", "DictConfig") + BINPUT0 + MARK + s("a") + i(1) + SETITEMS
            + _dict(_content=BINGET0) + BUILD + STOP, metadata={"a": 1}),
    Hostile("ListConfig whose content is a DictConfig",
            lambda m: P2 + _omega(_omega(EMPTY_DICT), "ListConfig", "omegaconf.listconfig") + STOP,
            metadata={"hostile": []}),
    Hostile("an OmegaConf node with an os.system value",
            lambda m: P2 + _omega(_dict(x=_new("omegaconf.nodes", "AnyNode") + _dict(_val=call("os", "system",
                                                                                               _touch(m))) + BUILD))
            + STOP, UnsafePickleError, "asks for global 'os.system'"),
]


@pytest.mark.parametrize("case", STANDIN_HOSTILE, ids=[c.name for c in STANDIN_HOSTILE])
def test_training_object_stand_ins_refuse_malformed_states(tmp_path, case):
    path, marker = _hostile(tmp_path, case.build)
    before = set(sys.modules)
    with bounded(seconds=20, extra_mib=512):
        if case.error is not None:
            with pytest.raises(case.error) as info:
                wio.open(path)
            assert type(info.value) is case.error
            assert case.message in str(info.value), str(info.value)
        else:
            with wio.open(path) as ckpt:
                assert list(ckpt) == list(case.tensors) and ckpt.metadata == case.metadata
    assert not marker.exists(), "a payload ran"
    assert set(sys.modules) - before == set(), "a module was imported"


def test_placeholders_are_made_per_file_and_never_shared(tmp_path):
    """Two files naming the same unknown global get distinct placeholder classes; the allowlist is untouched."""
    from weightio.formats.pytorch import allowlist

    before = dict(allowlist.ALLOWLIST)
    path = tmp_path / "a.pt"
    path.write_bytes(P2 + call("evil", "f") + STOP)
    classes = []
    for _ in range(2):
        reader = weightio.formats.pytorch.PyTorchReader(path, unknown_globals="placeholder")
        assert reader.placeholders == ["evil.f"]
        reader.close()
    assert allowlist.ALLOWLIST == before and ("evil", "f") not in allowlist.ALLOWLIST
    del classes


def test_the_mode_is_the_callers_own(tmp_path):
    """A placeholder-mode open does not leak into a later default open, in this thread or another."""
    import threading

    from weightio.formats.base import using_unknown_globals
    from weightio.formats.pytorch import PyTorchReader

    path = tmp_path / "a.pt"
    path.write_bytes(P2 + call("evil", "f") + STOP)
    wio.open(path, unknown_globals="placeholder").close()
    with pytest.raises(UnsafePickleError):
        wio.open(path)
    errors = []

    def other() -> None:
        try:
            PyTorchReader(path)
        except UnsafePickleError as e:
            errors.append(e)

    with using_unknown_globals("placeholder"):
        PyTorchReader(path).close()  # the mode in force here
        with pytest.raises(UnsafePickleError):
            wio.open(path)  # an explicit argument wins: open's default is "refuse"
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(errors) == 1


def test_state_dict_pickles_read_the_same_in_both_modes():
    body = state_dict({"w": tensor(W3, 0, (3,), (1,))})
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sd.pt"
        path.write_bytes(torch_zip(body, {"0": f32(1, 2, 3)}))
        with wio.open(path) as a, wio.open(path, unknown_globals="placeholder") as b:
            assert list(a) == list(b) == ["w"] and a.metadata == b.metadata == {}
            assert (a["w"].numpy() == b["w"].numpy()).all()


def test_dict_opcode_builds_with_placeholder_values(tmp_path):
    path = tmp_path / "d.pt"
    path.write_bytes(P2 + MARK + s("a") + call("evil", "f") + DICT + STOP)
    with wio.open(path, unknown_globals="placeholder") as ckpt:
        assert ckpt.metadata == {"a.__class__": "evil.f", KEY: ["evil.f"]}
