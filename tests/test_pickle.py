"""The allowlist unpickler (weightio.formats.pytorch: lexer, unpickler, allowlist, flatten): real
payloads never run, hostile streams never allocate, hang or recurse, and what torch writes loads.
Payloads are built byte by byte (tests/pytorch_files.py) and every one `touch`es a marker file if it ever ran."""

from __future__ import annotations

import pickle
import struct
import sys

import fickling.analysis  # noqa: F401 - imported before sys.modules snapshots (scan imports them)
import fickling.fickle  # noqa: F401
import fickling.ml  # noqa: F401
import numpy as np
import numpy.testing  # noqa: F401
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weightio as wio
import weightio.formats.pytorch  # noqa: F401
import weightio.safety  # noqa: F401
from weightio.errors import CorruptFileError, FormatError, UnsafePickleError, UnsupportedDTypeError, WeightioError
from weightio.formats import sniff
from weightio.formats.pytorch import allowlist, lexer, refs
from weightio.formats.pytorch.flatten import flatten, plain_value

from .conftest import FIXTURES
from .pytorch_files import (
    BUILD,
    EMPTY_DICT,
    EMPTY_LIST,
    EMPTY_TUPLE,
    MARK,
    MEMOIZE,
    NEWFALSE,
    NONE,
    P2,
    P4,
    POP,
    REDUCE,
    SETITEM,
    SETITEMS,
    STACK_GLOBAL,
    STOP,
    TUPLE,
    bounded,
    call,
    g,
    i,
    ints,
    pid,
    s,
    short,
    state_dict,
    tensor,
    tup,
)

"x".encode("cp437")  # the zip reader decodes CP437 names: load the codec before any snapshot
sniff.tarfile_module()  # weightio imports tarfile itself for a first block tarfile might take: before any snapshot


@pytest.fixture
def marker(tmp_path):
    """A path payloads try to create; asserted absent, with no module imported meanwhile."""
    path = tmp_path / "PWNED"
    before = set(sys.modules)
    yield path
    assert not path.exists(), "a payload ran"
    assert set(sys.modules) - before == set(), "a module was imported"


def _refused(write, payload: bytes, error: type, message: str, name: str = "payload.pkl") -> WeightioError:
    path = write(name, payload)
    with bounded(), pytest.raises(error) as info:
        wio.open(path)
    assert message in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{path}: ")
    return info.value


def touch(marker) -> bytes:  # noqa: ANN001
    return s(f"touch {marker}")


# ----------------------------------------------------------------------------- A1-A3: named globals

CODE_GLOBALS = [
    ("posix", "system"), ("nt", "system"), ("os", "system"), ("subprocess", "Popen"), ("subprocess", "check_output"),
    ("builtins", "eval"), ("builtins", "exec"), ("builtins", "getattr"), ("builtins", "__import__"),
    ("builtins", "open"), ("__builtin__", "eval"), ("_operator", "methodcaller"), ("operator", "attrgetter"),
    ("functools", "partial"), ("cProfile", "run"), ("timeit", "timeit"), ("pydoc", "pipepager"),
    ("pkgutil", "resolve_name"), ("importlib", "import_module"), ("marshal", "loads"), ("mailcap", "findmatch"),
    ("_io", "FileIO"), ("shutil", "rmtree"), ("ensurepip", "_run_pip"), ("numpy.testing._private.utils", "runstring"),
    ("numpy.f2py", "compile"), ("torch.jit.unsupported_tensor_ops", "execWrapper"), ("torch.serialization", "load"),
    ("torch", "load"), ("torch.hub", "load"), ("torch.storage", "_load_from_bytes"), ("copyreg", "_reconstructor"),
    ("pickle", "loads"), ("runpy", "run_path"), ("webbrowser", "open"), ("ctypes", "CDLL"),
]


@pytest.mark.parametrize("module,name", CODE_GLOBALS, ids=[f"{m}.{n}" for m, n in CODE_GLOBALS])
def test_any_global_outside_the_allowlist_is_refused_by_name(write, marker, module, name):
    payload = P2 + call(module, name, touch(marker)) + STOP
    _refused(write, payload, UnsafePickleError,
             f"the pickle asks for global '{module}.{name}', which is not on weightio's allowlist; nothing was "
             "imported or run")


def test_the_classic_reduce_payload_in_a_torch_zip_names_the_archive_member(write, marker):
    from .pytorch_files import torch_zip

    data = P2 + call("posix", "system", touch(marker)) + STOP
    _refused(write, torch_zip(data, {}), UnsafePickleError,
             "archive/data.pkl: the pickle asks for global 'posix.system'", name="model.pt")


def test_getattr_import_chains_stop_at_the_first_global(write, marker):
    # builtins.getattr(builtins.__import__('os'), 'system')('touch …')
    inner = call("builtins", "__import__", s("os"))
    payload = P2 + g("builtins", "getattr") + tup(inner, s("system")) + REDUCE + tup(touch(marker)) + REDUCE + STOP
    _refused(write, payload, UnsafePickleError, "global 'builtins.getattr'")


def test_nested_pickle_through_load_from_bytes_is_never_parsed(write, marker):
    inner = P2 + call("posix", "system", touch(marker)) + STOP
    payload = P2 + g("torch.storage", "_load_from_bytes") + tup(b"C" + bytes([len(inner)]) + inner) + REDUCE + STOP
    err = _refused(write, payload, UnsafePickleError, "global 'torch.storage._load_from_bytes'")
    assert "posix" not in str(err)


@pytest.mark.parametrize("module,name", [("numpy", "__builtins__"), ("numpy", "core._internal.sys"),
                                         ("collections", "OrderedDict.__init__.__globals__"),
                                         ("torch", "_utils._rebuild_tensor_v2")])
def test_dotted_names_through_allowlisted_modules_are_refused(write, marker, module, name):
    payload = P4 + g(module, name) + STOP
    _refused(write, payload, UnsafePickleError, f"global '{module}.{name}'")


# ----------------------------------------------------------------------------- A6-A8: STACK_GLOBAL


def test_stack_global_from_constants(write, marker):
    payload = P4 + short("posix") + short("system") + STACK_GLOBAL + tup(touch(marker)) + REDUCE + STOP
    _refused(write, payload, UnsafePickleError, "global 'posix.system'")


def test_stack_global_from_the_memo(write, marker):
    payload = (P4 + short("posix") + MEMOIZE + POP + short("system") + MEMOIZE + POP
               + b"h\x00h\x01" + STACK_GLOBAL + tup(touch(marker)) + REDUCE + STOP)
    _refused(write, payload, UnsafePickleError, "global 'posix.system'")


def test_memo_slot_overwritten_by_mixed_put_and_memoize_resolves_as_cpython_does(write, marker):
    # A naive memo model sees slot 0 = 'torch._utils', slot 1 = '_rebuild_tensor_v2'. CPython:
    # MEMOIZE writes slot 0, BINPUT 0 overwrites it with 'posix', MEMOIZE then writes slot 1.
    payload = (P4 + short("torch._utils") + MEMOIZE + POP + short("posix") + b"q\x00" + POP
               + short("system") + MEMOIZE + POP + b"h\x00h\x01" + STACK_GLOBAL + tup(touch(marker)) + REDUCE + STOP)
    _refused(write, payload, UnsafePickleError, "global 'posix.system'")
    report = wio.scan(write("payload.pkl", payload))
    assert report.globals == ("posix.system",)  # the scan resolves the memo the same way


def test_stack_global_with_a_non_string_operand(write, marker):
    payload = P4 + short("posix") + call("collections", "OrderedDict") + STACK_GLOBAL + STOP
    _refused(write, payload, UnsafePickleError, "STACK_GLOBAL at offset 37 takes operands that are not strings")


# ----------------------------------------------------------------------------- A9-A12: other ways in

REFUSED_OPCODES = [
    ("INST", b"(" + s("x") + b"ios\nsystem\n" + STOP, UnsafePickleError, "opcode INST at offset 9"),
    ("OBJ", b"(" + g("os", "system") + s("x") + b"o" + STOP, UnsafePickleError, "opcode OBJ at offset"),
    ("EXT1", b"\x82\x01" + STOP, UnsafePickleError, "opcode EXT1 at offset 2"),
    ("EXT2", b"\x83\x01\x00" + STOP, UnsafePickleError, "opcode EXT2 at offset 2"),
    ("EXT4", b"\x84\x01\x00\x00\x00" + STOP, UnsafePickleError, "opcode EXT4 at offset 2"),
    ("NEWOBJ_EX", g("collections", "OrderedDict") + EMPTY_TUPLE + EMPTY_DICT + b"\x92" + STOP, UnsafePickleError,
     "opcode NEWOBJ_EX"),
    ("PERSID", b"P0\n" + STOP, CorruptFileError, "opcode PERSID at offset 2 is not used by checkpoints (text "
                                                  "persistent ids; torch writes BINPERSID"),
    ("NEXT_BUFFER", b"\x97" + STOP, CorruptFileError, "NEXT_BUFFER at offset 2 is not used by checkpoints "
                                                      "(protocol-5 out-of-band buffers)"),
    ("READONLY_BUFFER", b"C\x01x\x98" + STOP, CorruptFileError, "READONLY_BUFFER at offset 5"),
]


@pytest.mark.parametrize("body,error,message", [c[1:] for c in REFUSED_OPCODES], ids=[c[0] for c in REFUSED_OPCODES])
def test_opcodes_that_build_objects_behind_the_allowlist_are_refused(write, marker, body, error, message):
    _refused(write, P2 + body, error, message)


def test_rebuild_from_type_v2_only_calls_rebuild_functions(write, marker):
    evil = P2 + call("torch._tensor", "_rebuild_from_type_v2", g("posix", "system"), g("torch", "Tensor"),
                     tup(touch(marker)), EMPTY_DICT) + STOP
    _refused(write, evil, UnsafePickleError, "global 'posix.system'")
    wrong_function = P2 + call("torch._tensor", "_rebuild_from_type_v2", g("collections", "OrderedDict"),
                               g("torch", "Tensor"), EMPTY_TUPLE, EMPTY_DICT) + STOP
    _refused(write, wrong_function, UnsafePickleError,
             "_rebuild_from_type_v2 with function collections.OrderedDict, which is not a torch rebuild function")
    wrong_type = P2 + call("torch._tensor", "_rebuild_from_type_v2", g("torch._utils", "_rebuild_tensor"),
                           g("torch", "float32"), EMPTY_TUPLE, EMPTY_DICT) + STOP
    _refused(write, wrong_type, UnsafePickleError, "_rebuild_from_type_v2 with type torch.float32; only torch.Tensor")


@pytest.mark.parametrize("state", [b"}" + s("__class__") + NONE + SETITEM, b"}" + s("__dict__") + EMPTY_DICT + SETITEM])
def test_dunder_attribute_state_is_refused(write, marker, state):
    ordered = P2 + call("collections", "OrderedDict") + state + BUILD + STOP
    _refused(write, ordered, UnsafePickleError, "an OrderedDict's state sets attribute '__")
    namespace = P2 + g("argparse", "Namespace") + EMPTY_TUPLE + b"\x81" + state + BUILD + STOP
    _refused(write, namespace, UnsafePickleError, "an argparse.Namespace's state sets attribute '__")
    param = P2 + call("torch._utils", "_rebuild_parameter_with_state", NONE, NEWFALSE, EMPTY_DICT, state) + STOP
    _refused(write, param, UnsafePickleError, "a Parameter's state sets attribute '__")


def test_build_on_a_token_is_refused_and_on_a_builtin_is_malformed(write, marker):
    _refused(write, P2 + g("torch", "float32") + EMPTY_DICT + BUILD + STOP, UnsafePickleError,
             "BUILD on torch.float32 (an allowlisted global) is not allowed")
    _refused(write, P2 + EMPTY_LIST + EMPTY_DICT + BUILD + STOP, CorruptFileError,
             "pickle 1 is malformed (AttributeError: 'list' object has no attribute '__dict__')")


def test_container_opcodes_on_the_wrong_objects_are_malformed(write, marker):
    on_tuple = P2 + tup(i(1)) + i(0) + i(1) + SETITEM + STOP
    _refused(write, on_tuple, CorruptFileError, "does not support item assignment")
    appends_on_dict = P2 + EMPTY_DICT + MARK + i(1) + b"e" + STOP
    _refused(write, appends_on_dict, CorruptFileError, "pickle 1 is malformed (AttributeError: 'dict' object has no "
                                                       "attribute 'append')")


def test_codecs_other_than_latin1_are_refused_before_any_codec_module_is_imported(write, marker):
    payload = P2 + call("_codecs", "encode", s("x"), s("zlib_codec")) + STOP
    _refused(write, payload, UnsafePickleError, "_codecs.encode with encoding 'zlib_codec'")
    assert "encodings.zlib_codec" not in sys.modules


# ----------------------------------------------------------------------------- A25-A31: the stream itself

HOSTILE_STREAMS = [
    ("memo index bomb", P2 + NONE + b"r\xff\xff\xff\x7f" + STOP,
     "LONG_BINPUT at offset 3 writes memo slot 2,147,483,647 after only 0 memo writes (a memory bomb"),
    ("text PUT bomb", b"\x80\x02N" + b"p99999999999\n" + STOP, "PUT at offset 3 writes memo slot 99,999,999,999"),
    ("get of an unset slot", P2 + b"h\x05" + STOP, "BINGET at offset 2 reads memo slot 5, which was never written"),
    ("long get of an unset slot", P2 + b"j\x05\x00\x00\x01" + STOP, "LONG_BINGET at offset 2 reads memo slot "
                                                                     "16,777,221, which was never written"),
    ("BINUNICODE8 2**40", P2 + b"\x8d" + struct.pack("<Q", 2**40) + b"abc" + STOP,
     "BINUNICODE8 at offset 2 claims 1,099,511,627,776 bytes but only 4 remain"),
    ("BINBYTES8 2**40", P2 + b"\x8e" + struct.pack("<Q", 2**40) + STOP,
     "BINBYTES8 at offset 2 claims 1,099,511,627,776 bytes but only 1 remain"),
    ("BYTEARRAY8 2**40", P2 + b"\x96" + struct.pack("<Q", 2**40) + STOP, "BYTEARRAY8 at offset 2 claims"),
    ("BINUNICODE 2**32-1", P2 + b"X\xff\xff\xff\xff" + STOP,
     "BINUNICODE at offset 2 claims 4,294,967,295 bytes but only 1 remain"),
    ("BINBYTES 2**32-1", P2 + b"B\xff\xff\xff\xff" + STOP, "BINBYTES at offset 2 claims 4,294,967,295 bytes"),
    ("LONG4 4 GB", P2 + b"\x8b\xff\xff\xff\x7f" + STOP, "LONG4 at offset 2 claims 2,147,483,647 bytes"),
    ("LONG4 negative", P2 + b"\x8b\xff\xff\xff\xff" + STOP, "LONG4 at offset 2 has a negative length -1"),
    ("FRAME past the end", b"\x80\x04\x95" + struct.pack("<Q", 2**50) + NONE + STOP,
     "FRAME at offset 2 claims 1,125,899,906,842,624 bytes but only 2 remain"),
    ("invalid opcode", P2 + NONE + b"\xff" + STOP, "invalid opcode 0xff at offset 3"),
    ("no STOP", P2 + NONE, "the pickle ends at offset 3 without a STOP opcode (truncated?)"),
    ("truncated argument", P2 + b"J\x01\x02", "BININT at offset 2 runs past the end of the pickle"),
    ("STOP on an empty stack", P2 + STOP, "STOP at offset 2 leaves 0 objects on the stack, not 1"),
    ("STOP with two objects", P2 + NONE + NONE + STOP, "STOP at offset 4 leaves 2 objects on the stack, not 1"),
    ("STOP inside a MARK", P2 + NONE + MARK + STOP, "STOP at offset 4 with a MARK still open"),
    ("PROTO twice", P2 + P2 + NONE + STOP, "PROTO at offset 2 is not the first opcode"),
    ("underflow", P2 + b"\x85" + STOP, "pickle 1: TUPLE1 at offset 2 pops more than the stack holds"),
    ("pop below the mark", P2 + NONE + MARK + b"\x85" + STOP, "STOP at offset 5 with a MARK still open"),
    ("TUPLE without MARK", P2 + NONE + TUPLE + STOP, "TUPLE at offset 3 has no MARK to pop to"),
]


@pytest.mark.parametrize("payload,message", [c[1:] for c in HOSTILE_STREAMS], ids=[c[0] for c in HOSTILE_STREAMS])
def test_hostile_streams_are_refused_before_cpython_allocates(write, marker, payload, message):
    _refused(write, payload, CorruptFileError, message)


@pytest.mark.parametrize("before", [0, 8150, 16300], ids=lambda n: f"frame after {n} bytes")
def test_the_unpickler_reads_on_across_a_frame_end_where_the_lexer_did(before):
    # An opcode whose argument runs past the end of its FRAME. CPython's C unpickler loads a frame
    # with one read() when the frame is not in the block it holds, and then drops the frame's rest
    # there, going on with other bytes than the lexer had checked: a different value here, and it
    # could run opcodes hidden in a string's bytes. With the FRAMEs dropped first, it reads on,
    # byte for byte what the lexer walked (and what torch.load reads from a file).
    from weightio.formats.pytorch import unpickler

    skipped = b"X" + struct.pack("<I", before) + b"b" * before + b"0" if before else b""  # a string, popped
    framed = b"X" + struct.pack("<I", 50) + b"a" * 50 + b"J\x70"  # one byte of the BININT inside the frame
    data = P4 + skipped + b"\x95" + struct.pack("<Q", len(framed)) + framed + b"\x11\x01\x00" + b"\x86" + STOP
    assert lexer.lex(data).pos == len(data)
    assert unpickler.load(data, lambda pid: None) == ("a" * 50, 70_000)


def test_opcodes_hidden_in_a_string_after_a_frame_never_run():
    # A frame past the unpickler's first block, its last opcode running past the frame's end: read
    # from other bytes than the lexer's, the unpickler went on inside the string that follows, and
    # there ran a LONG_BINPUT of slot 2**31 - 1 (CPython sizes its memo by it: 16 GiB).
    from weightio.formats.pytorch import unpickler

    before = b"X" + struct.pack("<I", 8150) + b"b" * 8150 + b"0"
    framed = b"X" + struct.pack("<I", 50) + b"a" * 50 + b"J\x70"
    hidden = struct.pack("<I", 2**31 - 1) + NONE * (0x72 - 4)  # read as a string's length, 0x72 is LONG_BINPUT
    data = (P4 + before + b"\x95" + struct.pack("<Q", len(framed)) + framed + b"\x11\x01\x00"
            + b"C" + bytes([len(hidden)]) + hidden + b"000" + NONE + STOP)
    assert lexer.lex(data).pos == len(data)
    with bounded(extra_mib=256):
        assert unpickler.load(data, lambda pid: None) is None


def test_a_global_hidden_in_a_string_after_a_long_frame_is_neither_looked_up_nor_reported():
    # the frame is longer than the unpickler's 8 KiB read-ahead; the straddling BININT made it read
    # "GLOBAL os.system" from inside a SHORT_BINBYTES, which the lexer (and torch.load) read as data
    from weightio import safety
    from weightio.formats.pytorch import unpickler

    inside = b"os\nsystem\n)R0"
    framed = b"X" + struct.pack("<I", 9000) + b"a" * 9000 + b"J\x70"
    data = (P4 + b"\x95" + struct.pack("<Q", len(framed)) + framed + b"\x11\x01\x00" + b"C" + bytes([99]) + inside
            + NONE * (99 - len(inside)) + b"000" + NONE + STOP)
    assert lexer.lex(data, collect=True).globals == []
    assert unpickler.load(data, lambda pid: None) is None
    scanned = safety._scan_pickle("x", data, "x")
    assert (scanned.globals, scanned.refused, scanned.problems) == ((), (), ())


def test_a_checked_pickle_comes_with_the_offsets_its_lexer_noted():
    from weightio.formats.pytorch import unpickler

    with pytest.raises(TypeError, match="needs the text8 its lexer noted"):
        unpickler.load(P2 + NONE + STOP, lambda pid: None, checked=True)  # its FRAMEs would reach CPython
    assert unpickler.load(P2 + NONE + STOP, lambda pid: None, checked=True, text8=[]) is None


def test_frames_are_checked_from_the_pickle_s_own_start(write):
    # a pickler's consecutive frames, in a pickle that starts inside a larger buffer (a legacy file's
    # pickles follow one another), and a FRAME begun inside another, refused at the same offset
    framed = pickle.dumps(list(range(200_000)), protocol=4)
    nested = P4 + b"\x95" + struct.pack("<Q", 3) + b"\x95" + struct.pack("<Q", 1) + NONE + STOP
    for start in (0, 10):
        assert lexer.lex(b"\0" * start + framed, start).pos == start + len(framed)
        with pytest.raises(CorruptFileError, match="FRAME at offset 11 begins inside the frame that ends at offset 14"):
            lexer.lex(b"\0" * start + nested, start)


def test_protocol_versions_beyond_5_are_refused_inside_archives(write, marker):
    from .pytorch_files import torch_zip

    _refused(write, torch_zip(b"\x80\x09" + NONE + STOP, {}), CorruptFileError,
             "archive/data.pkl: pickle protocol 9 is not supported (0-5 are)", name="m.pt")


def test_deep_nesting_is_refused_without_recursion(write, marker):
    _refused(write, P2 + (MARK + EMPTY_LIST) * 100_000 + STOP, CorruptFileError, "more than 1,000 nested MARKs")
    _refused(write, P2 + EMPTY_LIST * 101_000 + b"a" * 100_999 + STOP, CorruptFileError,
             "more than 100,000 items on the pickle stack")
    _refused(write, P2 + EMPTY_LIST * 90_000 + b"a" * 89_999 + STOP, CorruptFileError,
             "the pickled object nests deeper than 1,000 levels")


def test_long_names_are_bounded(write, marker):
    key = s("k" * 70_000)
    _refused(write, P2 + EMPTY_DICT + key + NONE + SETITEM + STOP, CorruptFileError,
             "a flattened name is longer than 65,535 characters")
    # a 60 000-character key reused (memo) at every level: names would grow quadratically
    nested = EMPTY_DICT + b"h\x00" + NONE + SETITEM
    for _ in range(50):
        nested = EMPTY_DICT + b"h\x00" + nested + SETITEM
    payload = P2 + s("k" * 60_000) + b"q\x00" + POP + nested + STOP
    _refused(write, payload, CorruptFileError, "a flattened name is longer than 65,535 characters")


@pytest.mark.slow
def test_the_opcode_budget_bounds_time(write, marker):
    path = write("ops.pkl", P2 + (NONE + POP) * 10_000_000 + NONE + STOP)  # 20 million opcodes
    with bounded(seconds=30), pytest.raises(CorruptFileError, match=f"more than {lexer.MAX_OPCODES:,} opcodes"):
        wio.open(path)


def test_hash_flooding_keys_are_refused(write, marker):
    p = 2**61 - 1  # CPython hashes ints modulo this: these keys all collide
    keys = b"".join(i(p * (k + 1)) + NONE for k in range(lexer.MAX_WEAK_KEYS + 1))
    payload = P2 + EMPTY_DICT + MARK + keys + SETITEMS + STOP
    _refused(write, payload, CorruptFileError, "more than 10,000 dict keys or set members whose hash the file can "
                                               "choose")
    tuples = b"".join(tup(i(k), i(0)) + NONE for k in range(lexer.MAX_WEAK_KEYS + 1))
    _refused(write, P2 + EMPTY_DICT + MARK + tuples + SETITEMS + STOP, CorruptFileError, "hash flooding")


def test_string_and_small_int_keys_are_unlimited(write, marker):
    batches = [MARK + b"".join(i(k) + NONE for k in range(start, start + 1000)) + SETITEMS
               for start in range(0, 30_000, 1000)]  # picklers batch 1000 items per SETITEMS
    batches += [MARK + b"".join(s(f"k{k}") + NONE for k in range(start, start + 1000)) + SETITEMS
                for start in range(0, 30_000, 1000)]
    with bounded():
        ckpt = wio.open(write("keys.pkl", P2 + EMPTY_DICT + b"".join(batches) + STOP))
    assert len(ckpt.metadata) == 60_000 and ckpt.metadata["29999"] is None


def test_memo_dag_billion_laughs_is_refused_in_bounded_time(write, marker):
    payload = P2 + EMPTY_LIST + b"q\x00"
    for level in range(1, 31):  # 30 levels of 10 references to the level below: 10**30 leaves
        payload += POP + MARK + (b"h" + bytes([level - 1])) * 10 + b"l" + b"q" + bytes([level])
    payload += STOP
    assert len(payload) < 1000
    with bounded(seconds=10):
        _refused(write, payload, CorruptFileError, "the flattened names add up to more than 1,648,384 characters "
                                                   "(deep nesting, long keys, or shared sub-objects")


def test_cycles_are_reported(write, marker):
    payload = P2 + EMPTY_LIST + b"q\x00" + b"h\x00" + b"a" + STOP  # a list that contains itself
    _refused(write, payload, CorruptFileError, "the pickled object contains itself at '0' (a cycle)")


# ----------------------------------------------------------------------------- numpy stand-ins (A32a)


def _numpy_array(dtype_code: str, shape: tuple[int, ...], raw: bytes, order: bool = False) -> bytes:
    dtype = call("numpy", "dtype", s(dtype_code), NEWFALSE, b"\x88") + tup(
        i(3), s("<"), NONE, NONE, NONE, i(-1), i(-1), i(0)) + BUILD
    return (call("numpy.core.multiarray", "_reconstruct", g("numpy", "ndarray"), ints((0,)), b"C\x01b")
            + tup(i(1), ints(shape), dtype, b"\x88" if order else NEWFALSE, b"C" + bytes([len(raw)]) + raw)
            + BUILD)


def test_numpy_arrays_and_scalars_are_rebuilt_without_numpy_pickle_support(write, marker):
    arr = _numpy_array("f4", (2, 2), np.arange(4, dtype="<f4").tobytes())
    scalar = call("numpy.core.multiarray", "scalar", call("numpy", "dtype", s("f8"), NEWFALSE, b"\x88")
                  + tup(i(3), s("<"), NONE, NONE, NONE, i(-1), i(-1), i(0)) + BUILD, b"C\x08" + struct.pack("<d", 0.75))
    ckpt = wio.open(write("np.pkl", P2 + EMPTY_DICT + MARK + s("w") + arr + s("acc") + scalar + SETITEMS + STOP))
    assert list(ckpt) == ["w"] and ckpt.metadata == {"acc": 0.75}
    np.testing.assert_array_equal(ckpt["w"].numpy(), np.arange(4, dtype=np.float32).reshape(2, 2))


@pytest.mark.parametrize("payload,error,message", [
    (call("numpy.core.multiarray", "scalar", call("numpy", "dtype", s("O8"), NEWFALSE, b"\x88"), NONE),
     UnsafePickleError, "numpy object dtype ('O')"),
    (call("numpy.core.multiarray", "_reconstruct", g("numpy", "ndarray"), ints((0,)), b"C\x01b")
     + tup(i(1), ints((1,)), call("numpy", "dtype", s("O8"), NEWFALSE, b"\x88"), NEWFALSE, EMPTY_LIST + NONE
           + b"a") + BUILD, UnsafePickleError, "numpy object array"),
    (_numpy_array("f4", (2, 2), b"\0" * 12), CorruptFileError,
     "numpy array <f4 (2, 2) needs 16 bytes but 12 are pickled"),
    (_numpy_array("f4", (2,), b"\0" * 12), CorruptFileError, "needs 8 bytes but 12 are pickled"),
    (call("numpy", "dtype", s("f4); import os"), NEWFALSE, b"\x88"), CorruptFileError,
     "numpy dtype code 'f4); import os' is not supported"),
    (call("numpy.core.multiarray", "_reconstruct", g("numpy", "dtype"), ints((0,)), b"C\x01b"), UnsafePickleError,
     "numpy _reconstruct of numpy.dtype (only numpy.ndarray is allowed)"),
])
def test_numpy_stand_ins_refuse_what_numpy_would_have_to_unpickle(write, marker, payload, error, message):
    _refused(write, P2 + payload + STOP, error, message)


def test_structured_numpy_dtypes_with_huge_field_tables_stay_metadata(write, marker):
    fields = EMPTY_DICT + b"".join(MARK + b"".join(s(f"f{k}") + NONE for k in range(j, j + 1000)) + SETITEMS
                                   for j in range(0, 100_000, 1000))
    dtype = call("numpy", "dtype", s("V8"), NEWFALSE, b"\x88") + tup(
        i(3), s("|"), NONE, tup(s("a")), fields, i(8), i(1), i(16)) + BUILD
    arr = (call("numpy.core.multiarray", "_reconstruct", g("numpy", "ndarray"), ints((0,)), b"C\x01b")
           + tup(i(1), ints((1,)), dtype, NEWFALSE, b"C\x08" + b"\0" * 8) + BUILD)
    with bounded(seconds=10):
        ckpt = wio.open(write("structured.pkl", P2 + arr + STOP))
    assert list(ckpt) == [] and ckpt.metadata == {"structured": "<numpy array of dtype 'V8'>"}


# ----------------------------------------------------------------------------- protocols and benign data


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_pickles_of_python_values_load_under_every_protocol(write, marker, protocol):
    value = {"epoch": 3, "lr": 1e-3, "name": "run", "flags": [True, None], "nested": {"k": (1, 2)},
             "blob": b"\x00\x01", "cfg": {1: "one"}, "empty": {}, "c": 1 + 2j, "s": {1, 2}}
    ckpt = wio.open(write("plain.pkl", pickle.dumps(value, protocol=protocol)))
    assert len(ckpt) == 0
    assert ckpt.metadata == {"epoch": 3, "lr": 1e-3, "name": "run", "flags": [True, None], "nested.k": [1, 2],
                             "blob": "b'\\x00\\x01'", "cfg.1": "one", "empty": {}, "c": "(1+2j)", "s": "set({1, 2})"}


def test_numpy_pickles_from_pickle_dump_load_under_protocols_2_to_5(write, marker):
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "f": np.asfortranarray(np.ones((2, 2))),
              "be": np.arange(3, dtype=">i2")}
    for protocol in (2, 3, 4, 5):
        ckpt = wio.open(write(f"np{protocol}.pkl", pickle.dumps(arrays, protocol=protocol)))
        for name, arr in arrays.items():
            np.testing.assert_array_equal(ckpt[name].numpy(), arr)
            assert ckpt[name].dtype == arr.dtype.newbyteorder("=")


def test_allowlist_is_exact_strings_and_every_entry_imports_nothing():
    before = set(sys.modules)
    assert ("torch._utils", "_rebuild_tensor_v2") in allowlist.ALLOWLIST
    assert ("torch.storage", "_load_from_bytes") not in allowlist.ALLOWLIST
    assert all("." not in name for _, name in allowlist.ALLOWLIST)
    assert all(not getattr(v, "__module__", "weightio").startswith(("torch", "numpy"))
               for v in allowlist.ALLOWLIST.values())
    assert set(sys.modules) == before


# ----------------------------------------------------------------------------- flatten


def test_flatten_names_nested_containers_and_keeps_plain_leaves():
    ref = refs.TensorRef(None, 0, (), ())
    root = {"model": {"fc.weight": ref}, "opt": {"state": {0: {"exp_avg": ref}}, "groups": [{"lr": 0.1}]},
            "epoch": 3, "betas": (0.9, 0.99), "layers": [ref, ref]}
    tensors, metadata = flatten(root, budget=1000, root_name="x")
    assert list(tensors) == ["model.fc.weight", "opt.state.0.exp_avg", "layers.0", "layers.1"]
    assert metadata == {"opt.groups.0.lr": 0.1, "epoch": 3, "betas": [0.9, 0.99]}


def test_flatten_names_a_bare_tensor_after_the_file_and_refuses_name_clashes(write):
    ref = refs.TensorRef(None, 0, (), ())
    assert flatten(ref, budget=10, root_name="weights") == ({"weights": ref}, {})
    with pytest.raises(FormatError, match="two entries flatten to the same name 'a.b'"):
        flatten({"a.b": ref, "a": {"b": 1}}, budget=100, root_name="x")


def test_short_repr_is_bounded_for_any_value():
    big = 10**5000
    assert refs.short_repr(big) == "<int of 16,610 bits>"
    assert plain_value(big) == "<int of 16,610 bits>"
    nested: list = []
    for _ in range(10_000):
        nested = [nested]
    assert len(refs.short_repr(nested)) <= 80


# ----------------------------------------------------------------------------- property tests

SD = FIXTURES / "pytorch" / "views.pt"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_checkpoint_pickles_only_ever_raise_weightio_errors(tmp_path_factory, data):
    from .pytorch_files import member, rezip

    pkl = bytearray(member(SD, "data.pkl"))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(pkl) - 1))
        pkl[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(len(pkl) // 2, len(pkl)))
    path = tmp_path_factory.mktemp("fuzz") / "m.pt"
    path.write_bytes(rezip(SD, {"views/data.pkl": bytes(pkl[:cut])}))
    before = set(sys.modules)
    with bounded(seconds=15):
        try:
            with wio.open(path) as ckpt:
                for name in ckpt:
                    try:
                        ckpt[name].numpy()
                    except UnsupportedDTypeError:
                        pass
        except WeightioError:
            pass
    assert set(sys.modules) == before


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64))
def test_random_pickle_streams_never_escape_as_other_errors(tmp_path_factory, body):
    path = tmp_path_factory.mktemp("fuzz") / "x.pkl"
    path.write_bytes(P2 + body)
    with bounded(seconds=15):
        try:
            wio.open(path)
        except WeightioError:
            pass


def test_a_torch_like_state_dict_built_by_hand_loads(write):
    data = state_dict({"w": tensor(pid("FloatStorage", "0", 4), 0, (2, 2), (2, 1)),
                       "t": tensor(pid("FloatStorage", "0", 4), 0, (2, 2), (1, 2))})
    from .pytorch_files import f32, torch_zip

    ckpt = wio.open(write("m.pt", torch_zip(data, {"0": f32(0, 1, 2, 3)})))
    np.testing.assert_array_equal(ckpt["t"].numpy(), ckpt["w"].numpy().T)
    assert np.shares_memory(ckpt["t"].numpy(), ckpt["w"].numpy())


# ----------------------------------------------------------------------------- more of the allowlist


def test_rebuild_v1_and_tensor_metadata(write):
    from .pytorch_files import f32, torch_zip

    w = pid("FloatStorage", "0", 4)
    v1 = call("torch._utils", "_rebuild_tensor", w, i(1), ints((3,)), ints((1,)))
    conj = call("torch._utils", "_rebuild_tensor_v2", w, i(0), ints((2,)), ints((1,)), NEWFALSE,
                call("collections", "OrderedDict"), EMPTY_DICT + s("conj") + b"\x88" + SETITEM)
    plain = call("torch._utils", "_rebuild_tensor_v2", w, i(0), ints((2,)), ints((1,)), NEWFALSE,
                 call("collections", "OrderedDict"), EMPTY_DICT)
    path = write("m.pt", torch_zip(state_dict({"v1": v1, "conj": conj, "plain": plain}), {"0": f32(0, 1, 2, 3)}))
    with wio.open(path) as ckpt:
        assert ckpt["v1"].numpy().tolist() == [1.0, 2.0, 3.0]
        assert ckpt["plain"].numpy().tolist() == [0.0, 1.0]
        with pytest.raises(UnsupportedDTypeError, match="tensor 'conj': tensor has its conjugate/negative bit set"):
            ckpt["conj"].numpy()


def test_torch_values_become_plain_metadata(write):
    from .pytorch_files import torch_zip

    values = {"device": call("torch", "device", s("cuda"), i(1)), "cpu": call("torch", "device", s("cpu")),
              "size": call("torch", "Size", ints((2, 3))), "dtype": g("torch", "float16"),
              "layout": call("torch.serialization", "_get_layout", s("torch.sparse_coo"))}
    with wio.open(write("m.pt", torch_zip(state_dict(values), {}))) as ckpt:
        assert ckpt.metadata == {"device": "cuda:1", "cpu": "cpu", "size": [2, 3], "dtype": "torch.float16",
                                 "layout": "torch.sparse_coo"}


def test_a_device_tensor_saved_through_its_cpu_copy_reads_as_that_copy(write):
    from .pytorch_files import f32, torch_zip

    cpu = tensor(pid("FloatStorage", "0", 2), 0, (2,), (1,))
    same = call("torch._utils", "_rebuild_device_tensor_from_cpu_tensor", cpu, g("torch", "float32"), s("xla:0"),
                NEWFALSE)
    cast = call("torch._utils", "_rebuild_device_tensor_from_cpu_tensor", cpu, g("torch", "float16"), s("xla:0"),
                NEWFALSE)
    with wio.open(write("m.pt", torch_zip(state_dict({"same": same, "cast": cast}), {"0": f32(1, 2)}))) as ckpt:
        assert ckpt["same"].numpy().tolist() == [1.0, 2.0]
        with pytest.raises(UnsupportedDTypeError, match="tensor 'cast': device tensor \\(xla:0\\) saved with a "
                                                        "dtype conversion"):
            ckpt["cast"].numpy()


def _payload(protocol: int, marker) -> bytes:  # noqa: ANN001
    """posix.system('touch …') as each protocol's own opcodes would spell it."""
    command = f"touch {marker}"
    if protocol == 0:
        return b"cposix\nsystem\n(V" + command.encode() + b"\ntR."
    if protocol == 1:
        return g("posix", "system") + tup(s(command)) + REDUCE + STOP
    if protocol in (2, 3):
        return bytes([0x80, protocol]) + g("posix", "system") + tup(s(command)) + REDUCE + STOP
    body = short("posix") + MEMOIZE + short("system") + MEMOIZE + STACK_GLOBAL + MEMOIZE + tup(s(command)) + REDUCE
    return bytes([0x80, protocol]) + b"\x95" + struct.pack("<Q", len(body) + 1) + body + STOP


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_payloads_are_refused_under_every_protocol(write, marker, protocol):
    from .pytorch_files import torch_zip

    _refused(write, torch_zip(_payload(protocol, marker), {}), UnsafePickleError,
             "archive/data.pkl: the pickle asks for global 'posix.system'", name="m.pt")


@pytest.mark.parametrize("payload,message", [
    (call("builtins", "set", EMPTY_LIST + MARK + tup(i(1), i(2)) + b"e"), "set holds keys other than strings"),
    (call("collections", "OrderedDict", EMPTY_LIST + MARK + tup(tup(i(1)), NONE) + b"e"),
     "OrderedDict holds keys other than strings"),
    (call("collections", "OrderedDict", s("x")), "OrderedDict takes a list, found str"),
    (call("builtins", "complex", s("1j")), "complex('1j', 0.0) is not supported"),
])
def test_constructor_arguments_are_checked_like_pickled_keys(write, marker, payload, message):
    _refused(write, P2 + payload + STOP, CorruptFileError, message)


def test_collections_and_builtins_stand_ins_build_plain_values(write, marker):
    values = {"counts": call("collections", "Counter", EMPTY_DICT + s("a") + i(2) + SETITEM),
              "pairs": call("collections", "OrderedDict", EMPTY_LIST + MARK + tup(s("k"), i(1)) + b"e"),
              "frozen": call("builtins", "frozenset", EMPTY_LIST + MARK + i(1) + i(2) + b"e"),
              "raw": call("builtins", "bytearray", s("ab"), s("latin1")), "z": call("builtins", "complex", i(1), i(2))}
    payload = P2 + EMPTY_DICT + MARK + b"".join(s(k) + v for k, v in values.items()) + SETITEMS + STOP
    ckpt = wio.open(write("v.pkl", payload))
    assert ckpt.metadata == {"counts.a": 2, "pairs.k": 1, "frozen": "frozenset({1, 2})", "raw": "bytearray(b'ab')",
                             "z": "(1+2j)"}


def test_the_opcode_table_is_the_pickle_protocols():
    import pickletools

    from weightio.formats.pytorch import opcodes

    assert {code[0]: name for code, name, *_ in opcodes.TABLE} == {
        ord(op.code): op.name for op in pickletools.opcodes}
    for name in ("MARK", "STOP", "POP", "TUPLE", "PROTO", "BINUNICODE", "SHORT_BINUNICODE", "BINGET", "LONG_BINGET",
                 "BINPUT", "LONG_BINPUT", "MEMOIZE"):
        assert getattr(opcodes, name) == getattr(pickle, name)[0] == opcodes.OP[name]


# ----------------------------------------------------------------------------- issue 12, class 2: inert globals
# Every allowlisted global is shared by every pickle the process reads: no opcode may change one
# (weightio.formats.pytorch.inert). Each case applies one generic opcode to one global.

NEWOBJ, ADDITEMS, APPENDS, TUPLE2 = b"\x81", b"\x90", b"e", b"\x86"


def _slot_state(**attrs: bytes) -> bytes:
    """A BUILD state (None, {attr: value}): CPython's default BUILD does setattr for each."""
    return NONE + EMPTY_DICT + MARK + b"".join(s(k) + v for k, v in attrs.items()) + SETITEMS + TUPLE2


def _dict_state(**attrs: bytes) -> bytes:
    return EMPTY_DICT + MARK + b"".join(s(k) + v for k, v in attrs.items()) + SETITEMS


INERT_GLOBALS = [
    ("BUILD slot state on collections.OrderedDict (__defaults__)",
     g("collections", "OrderedDict") + _slot_state(__defaults__=tup(EMPTY_DICT + s("evil") + i(1) + SETITEM)) + BUILD,
     UnsafePickleError, "BUILD on collections.OrderedDict (an allowlisted global) is not allowed"),
    ("BUILD dict state on torch._utils._rebuild_tensor_v2",
     g("torch._utils", "_rebuild_tensor_v2") + _dict_state(__kwdefaults__=EMPTY_DICT) + BUILD,
     UnsafePickleError, "BUILD on torch._utils._rebuild_tensor_v2 (an allowlisted global) is not allowed"),
    ("BUILD slot state on the argparse.Namespace class (__new__)",
     g("argparse", "Namespace") + _slot_state(__new__=g("builtins", "set")) + BUILD,
     UnsafePickleError, "BUILD on the class argparse.Namespace (not an instance of it) is not allowed"),
    ("BUILD dict state on the argparse.Namespace class",
     g("argparse", "Namespace") + _dict_state(allowlisted_as=s("x")) + BUILD,
     UnsafePickleError, "BUILD on the class argparse.Namespace (not an instance of it) is not allowed"),
    ("BUILD slot state on the torch.float32 token (value)",
     g("torch", "float32") + _slot_state(value=s("float16")) + BUILD,
     UnsafePickleError, "BUILD on torch.float32 (an allowlisted global) is not allowed"),
    ("BUILD on the layout token _get_layout returns",
     call("torch.serialization", "_get_layout", s("torch.strided")) + _slot_state(name=s("sparse_coo")) + BUILD,
     UnsafePickleError, "BUILD on torch.strided (an allowlisted global) is not allowed"),
    ("NEWOBJ on numpy.dtype (a function stand-in, not a class)",
     g("numpy", "dtype") + EMPTY_TUPLE + NEWOBJ,
     CorruptFileError, "is malformed: NEWOBJ on something that is not a class (of the allowlist, only "
                       "argparse.Namespace is built by NEWOBJ)"),
    ("NEWOBJ on collections.OrderedDict", g("collections", "OrderedDict") + EMPTY_TUPLE + NEWOBJ,
     CorruptFileError, "NEWOBJ on something that is not a class"),
    ("NEWOBJ on argparse.Namespace with an argument", g("argparse", "Namespace") + tup(i(1)) + NEWOBJ,
     CorruptFileError, "argparse.Namespace takes no positional arguments"),
    ("SETITEM on torch.Size", g("torch", "Size") + s("k") + i(1) + SETITEM,
     UnsafePickleError, "SETITEM on torch.Size (an allowlisted global) is not allowed"),
    ("APPENDS on collections.Counter", g("collections", "Counter") + MARK + i(1) + APPENDS,
     UnsafePickleError, "APPEND or ADDITEMS on collections.Counter (an allowlisted global) is not allowed"),
    ("ADDITEMS on builtins.set", g("builtins", "set") + MARK + i(1) + ADDITEMS,
     UnsafePickleError, "APPEND or ADDITEMS on builtins.set (an allowlisted global) is not allowed"),
    ("REDUCE on a dtype token", g("torch", "float32") + EMPTY_TUPLE + REDUCE,
     CorruptFileError, "TypeError: 'Token' object is not callable"),
    ("torch.Size of a list of lists (a tuple from a mutable container's items)",
     call("torch", "Size", EMPTY_LIST + EMPTY_LIST + b"a"), CorruptFileError, "torch.Size takes a tuple of ints"),
]


@pytest.mark.parametrize("payload,error,message", [c[1:] for c in INERT_GLOBALS], ids=[c[0] for c in INERT_GLOBALS])
def test_no_opcode_changes_an_allowlisted_global(write, marker, payload, error, message):
    before = _allowlist_snapshot()
    _refused(write, P2 + payload + STOP, error, message)
    assert _allowlist_snapshot() == before


def _allowlist_snapshot() -> list:
    """Every attribute of every allowlisted object (and of what a function stand-in calls)."""
    from weightio.formats.pytorch.inert import Function

    out = []
    for key, value in allowlist.ALLOWLIST.items():
        attrs = {a: getattr(value, a) for a in ("module", "name", "kind", "value", "allowlisted_as")
                 if hasattr(value, a)}
        if isinstance(value, Function):
            target = value._call
            attrs.update(call=target, defaults=getattr(target, "__defaults__", None),
                         kwdefaults=getattr(target, "__kwdefaults__", None), code=getattr(target, "__code__", None),
                         dict=dict(getattr(target, "__dict__", {})))
        elif isinstance(value, type):
            attrs.update(vars(value))
        out.append((key, type(value), attrs))
    return out


@pytest.mark.parametrize("key", list(allowlist.ALLOWLIST), ids=[f"{m}.{n}" for m, n in allowlist.ALLOWLIST])
def test_every_allowlisted_global_rejects_setattr_and_build(write, key):
    from weightio.formats.pytorch.inert import FrozenClass, Function, Token

    value = allowlist.ALLOWLIST[key]
    assert isinstance(value, (Function, Token, FrozenClass))
    assert not hasattr(value, "__dict__") or isinstance(value, type)  # classes: a read-only mappingproxy
    for attr in ("__defaults__", "__kwdefaults__", "__code__", "name", "value", "kind", "x"):
        with pytest.raises(UnsafePickleError, match="is an allowlisted global and cannot be changed"):
            setattr(value, attr, None)
    with pytest.raises(UnsafePickleError):
        delattr(value, "name")
    with pytest.raises(UnsafePickleError, match="BUILD on"):
        value.__setstate__({})
    module, name = key
    for state in (_dict_state(x=i(1)), _slot_state(__defaults__=EMPTY_TUPLE, x=i(1))):
        with pytest.raises(WeightioError, match="BUILD on"):
            wio.open(write("b.pkl", P2 + g(module, name) + state + BUILD + STOP))
    if not isinstance(value, type):
        with pytest.raises(CorruptFileError, match="NEWOBJ on something that is not a class"):
            wio.open(write("n.pkl", P2 + g(module, name) + EMPTY_TUPLE + NEWOBJ + STOP))


def _benign_checkpoints(folder) -> list:  # noqa: ANN001
    """Files whose reading depends on the stand-ins: torch-written checkpoints of each container,
    and pickles of Namespace, OrderedDict, Counter, sets, numpy dtypes/arrays/scalars, torch.Size."""
    import argparse
    import collections

    values = {"args": argparse.Namespace(lr=0.1, layers=[1, 2]), "od": collections.OrderedDict(a=1),
              "counts": collections.Counter(b=2), "s": {1, 2}, "f": frozenset({"x"}), "z": 1 + 2j,
              "arr": np.arange(6, dtype=">f4").reshape(2, 3), "scalar": np.float64(0.5), "dt": np.dtype("i2")}
    paths = [FIXTURES / "pytorch" / n for n in ("views.pt", "nested.pt", "special.pt", "protocol2_legacy.pt",
                                                 "legacy_tar.pt", "numpy_weights_p2.pkl")]
    for protocol in (2, 4):
        path = folder / f"values{protocol}.pkl"
        path.write_bytes(pickle.dumps(values, protocol=protocol))
        paths.append(path)
    return paths


_DIGEST = """
import hashlib, json, sys
import weightio as wio
from weightio.errors import WeightioError
out = []
for path in sys.argv[1:]:
    with wio.open(path) as ckpt:
        tensors = []
        for name in ckpt:
            view = ckpt[name]
            try:
                data = hashlib.sha256(view.numpy().tobytes()).hexdigest()
            except WeightioError as e:
                data = type(e).__name__
            tensors.append([name, str(view.dtype), list(view.shape), data])
        out.append([tensors, repr(sorted(ckpt.metadata.items()))])
print(json.dumps(out))
"""


def _hostile_files(folder) -> list:  # noqa: ANN001
    """Every generic opcode on every allowlisted global, with states that would change it."""
    attrs = dict(__defaults__=tup(EMPTY_DICT + s("evil") + i(1) + SETITEM), __kwdefaults__=EMPTY_DICT,
                 value=s("float16"), kind=s("storage"), name=s("x"), module=s("x"), _call=g("builtins", "set"),
                 allowlisted_as=s("x"), __new__=g("builtins", "set"), fields=EMPTY_DICT, __setstate__=NONE)
    bodies = []
    for (module, name), value in allowlist.ALLOWLIST.items():
        glob = g(module, name)
        newobj = glob + EMPTY_TUPLE + NEWOBJ  # a class stand-in is built by it (argparse.Namespace): then SETITEM
        # dict- and list-like class stand-ins (OmegaConf, AttributeDict, TrainingArguments) take items, as their
        # pickles give them: their instances are the pickle's own; calling one is refused instead
        after = (EMPTY_TUPLE + REDUCE if getattr(value, "accepts_items", False) else s("k") + i(1) + SETITEM)
        bodies += [glob + _dict_state(**attrs) + BUILD, glob + _slot_state(**attrs) + BUILD,
                   newobj + (after if isinstance(value, type) else b""),
                   newobj + _slot_state(**attrs) + BUILD,
                   glob + s("k") + i(1) + SETITEM, glob + MARK + i(1) + APPENDS, glob + MARK + i(1) + ADDITEMS]
    paths = []
    for k, body in enumerate(bodies):
        path = folder / f"hostile{k}.pkl"
        path.write_bytes(P2 + body + STOP)
        paths.append(path)
    return paths


_HOSTILE_THEN_DIGEST = """
import sys
import weightio as wio
from weightio.errors import WeightioError
hostile = sys.argv[1:sys.argv.index("--")]
for path in hostile:
    try:
        wio.open(path)
    except WeightioError as e:
        assert e.message, path
    else:
        raise SystemExit(f"{path} was read")
    try:
        wio.scan(path)
    except WeightioError:
        pass
sys.argv = [sys.argv[0]] + sys.argv[sys.argv.index("--") + 1:]
"""


def test_hostile_files_leave_no_trace_in_the_process(tmp_path):
    """In one process: every hostile file (each refused with a WeightioError), then the benign
    files; the benign results equal those of a fresh process that read only them."""
    import subprocess

    benign = [str(p) for p in _benign_checkpoints(tmp_path)]
    hostile = [str(p) for p in _hostile_files(tmp_path)]
    fresh = subprocess.run([sys.executable, "-c", _DIGEST, *benign], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    after = subprocess.run([sys.executable, "-c", _HOSTILE_THEN_DIGEST + _DIGEST, *hostile, "--", *benign],
                           capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr[-3000:]
    assert after.stdout == fresh.stdout
    assert len(hostile) == 7 * len(allowlist.ALLOWLIST) and "float32" in fresh.stdout


def test_namespaces_still_arrive_by_newobj_and_validate_in_new(write):
    import argparse

    for protocol in (2, 3, 4, 5):
        ckpt = wio.open(write("ns.pkl", pickle.dumps({"args": argparse.Namespace(lr=0.5, name="run")}, protocol)))
        assert ckpt.metadata == {"args.lr": 0.5, "args.name": "run"}
    namespace = allowlist.ALLOWLIST[("argparse", "Namespace")]
    assert namespace.__new__(namespace).fields == {}  # what NEWOBJ calls: the whole object, no __init__


# ----------------------------------------------------------------------------- issue 12, class 3: nesting without MARK
# CPython hashes a tuple (a dict key, a set member) by recursing in C without a depth check: a
# 200 000-deep tuple crashed the process (SIGSEGV). Each case runs in a subprocess, which must
# exit with a clean CorruptFileError, not a signal.

DEEP = 200_000
TUPLE1, EMPTY_SET, FROZENSET = b"\x85", b"\x8f", b"\x91"


def _put(k: int) -> bytes:
    return b"r" + struct.pack("<I", k)


def _get(k: int) -> bytes:
    return b"j" + struct.pack("<I", k)


def _memo_mutation(levels: int) -> bytes:
    """Lists memoized empty (depth 0), then each appended to its predecessor through BINGET:
    every memo slot still says depth 0, the object is `levels` deep."""
    made = b"".join(EMPTY_LIST + _put(k) + POP for k in range(levels))
    linked = b"".join(_get(k) + _get(k - 1) + b"a" + POP for k in range(1, levels))
    return made + linked + _get(levels - 1)


CHAIN = NONE + TUPLE1 * DEEP
DEEP_NESTING = [
    ("200k TUPLE1 chain as the pickle's result", CHAIN, "(TUPLE1 at offset 1003)"),
    ("200k TUPLE1 chain as a dict key", EMPTY_DICT + CHAIN + NONE + SETITEM, "(TUPLE1 at offset 1004)"),
    ("200k TUPLE1 chain as a set member", EMPTY_SET + MARK + CHAIN + ADDITEMS, "(TUPLE1 at offset 1005)"),
    ("200k TUPLE1 chain in a FROZENSET", MARK + CHAIN + FROZENSET, "(TUPLE1 at offset 1004)"),
    ("200k TUPLE1 chain as a plain value", EMPTY_DICT + s("v") + CHAIN + SETITEM, "(TUPLE1 at offset 1010)"),
    ("200k EMPTY_TUPLE nested by TUPLE2", EMPTY_TUPLE + (EMPTY_TUPLE + TUPLE2) * DEEP, "(TUPLE2 at offset"),
    ("200k MARK/TUPLE levels through the memo, one MARK open at a time",
     EMPTY_TUPLE + b"q\x00" + POP + (MARK + b"h\x00" + TUPLE + b"q\x00" + POP) * DEEP + b"h\x00",
     "(TUPLE at offset"),
    ("200k lists nested by APPEND through the memo", EMPTY_LIST + b"q\x00" + POP
     + (EMPTY_LIST + b"h\x00" + b"a" + b"q\x00" + POP) * DEEP + b"h\x00", "(APPEND at offset"),
    ("200k dicts nested by SETITEM", EMPTY_DICT + b"q\x00" + POP
     + (EMPTY_DICT + i(0) + b"h\x00" + SETITEM + b"q\x00" + POP) * DEEP + b"h\x00", "(SETITEM at offset"),
    ("200k levels carried through REDUCE results (_rebuild_parameter returns its data)",
     EMPTY_TUPLE + b"q\x00" + POP + g("torch._utils", "_rebuild_parameter") + b"q\x01" + POP
     + (b"h\x01" + b"h\x00" + NEWFALSE + NONE + b"\x87" + REDUCE + TUPLE1 + b"q\x00" + POP) * DEEP + b"h\x00",
     "(TUPLE3 at offset"),
    ("200k Namespaces nested by BUILD", EMPTY_DICT + b"q\x00" + POP
     + (g("argparse", "Namespace") + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT + s("a") + b"h\x00" + SETITEM + BUILD
        + b"q\x00" + POP) * DEEP + b"h\x00", "(SETITEM at offset"),
    ("200k lists memoized empty, then appended to through BINGET (memo mutation)", _memo_mutation(DEEP),
     "the pickled object nests deeper than 1,000 levels"),
    ("memo mutation laundered into a tuple by torch.Size", _memo_mutation(3000)[:-5] + g("torch", "Size")
     + _get(2999) + TUPLE1 + REDUCE + TUPLE1, "torch.Size takes a tuple of ints"),
]

_OPEN_IN_SUBPROCESS = """
import sys
import weightio as wio
from weightio.errors import CorruptFileError
try:
    wio.open(sys.argv[1])
except CorruptFileError as e:
    print(e)
    raise SystemExit(3)
"""


@pytest.mark.parametrize("body,message", [c[1:] for c in DEEP_NESTING], ids=[c[0] for c in DEEP_NESTING])
def test_nesting_without_marks_is_refused_before_c_recursion(write, body, message):
    import subprocess

    path = write("deep.pkl", P2 + body + STOP)
    done = subprocess.run([sys.executable, "-c", _OPEN_IN_SUBPROCESS, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])  # not -11 (SIGSEGV), not a traceback
    assert message in done.stdout, done.stdout
    assert done.stdout.startswith(f"{path}: ") and not done.stderr


_OPEN_ON_A_SMALL_STACK = """
import sys, threading
import weightio as wio
from weightio.errors import CorruptFileError
threading.stack_size(512 * 1024)  # a macOS thread's default stack
out = []
def read():
    try:
        with wio.limits.using(nesting_depth=10**6):  # raised as far as a user can
            wio.open(sys.argv[1])
    except CorruptFileError as e:
        out.append(str(e))
t = threading.Thread(target=read)
t.start(); t.join()
print(out[0])
"""


def test_object_nesting_has_a_ceiling_the_limit_cannot_raise(write):
    """Raising limits.nesting_depth cannot make C recursion safe: objects stay within 5 000 levels,
    which a 512 KiB thread stack hashes without overflowing."""
    import subprocess

    path = write("deep.pkl", P2 + EMPTY_DICT + CHAIN + NONE + SETITEM + STOP)
    done = subprocess.run([sys.executable, "-c", _OPEN_ON_A_SMALL_STACK, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == (f"{path}: pickle 1: the pickled object nests deeper than 5,000 levels (TUPLE1 at "
                                   "offset 5004) (no pickle may nest deeper: CPython would hash or compare it by "
                                   "unchecked C recursion)")
    hashes = ("import sys, threading\nthreading.stack_size(512 * 1024)\nt = ()\n"
              "for _ in range(int(sys.argv[1])): t = (t,)\n"
              "th = threading.Thread(target=lambda: print(hash(t) is not None)); th.start(); th.join()")
    done = subprocess.run([sys.executable, "-c", hashes, str(lexer.MAX_OBJECT_DEPTH)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr[-500:]


def _depth(value) -> int:  # noqa: ANN001
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return 1 + max((_depth(v) for v in value), default=-1)
    return 0


_nested = st.recursive(st.none() | st.integers(-5, 5) | st.text(max_size=2)
                       | st.frozensets(st.integers(0, 3), max_size=2),  # a leaf here: its members never recurse
                       lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
                       | st.dictionaries(st.text(max_size=2), inner, max_size=3), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_nested, st.integers(0, 5))
def test_the_lexer_depth_bounds_the_real_depth(value, protocol):
    from weightio.formats.pytorch.opcodes import LEVEL

    item = lexer.lex(pickle.dumps(value, protocol=protocol)).stack[-1]
    assert item // LEVEL >= _depth(value)
    if _tuples_only(value):  # what hashing recurses through: exact
        assert item // LEVEL == _depth(value)


def _tuples_only(value) -> bool:  # noqa: ANN001
    return not isinstance(value, (list, dict, set, frozenset)) and (
        not isinstance(value, tuple) or all(_tuples_only(v) for v in value))


def test_a_file_nested_to_the_limit_still_reads(write):
    body = NONE + TUPLE1 * 999
    ckpt = wio.open(write("deep.pkl", P2 + EMPTY_DICT + s("t") + body + SETITEM + STOP))
    assert list(ckpt.metadata) == ["t" + ".0" * 998]


# ----------------------------------------------------------------------------- issue 12, class 5: flattening work
# A pickle references one object any number of times for two bytes each (BINGET). Flattening
# walks (and copies list leaves) at every reference: its budget counts that work, so a 100 kB
# file is refused, or read, in bounded time and memory — never expanded to gigabytes.

N_ITEMS = 10_000


def _shared(container: bytes, references: int = N_ITEMS, as_dict: bool = False) -> bytes:
    """`container` memoized in slot 0, then referenced `references` times from a list (or dict)."""
    refs = b"".join((i(k) if as_dict else b"") + b"h\x00" for k in range(references))
    outer = (EMPTY_DICT if as_dict else EMPTY_LIST) + MARK + refs + (SETITEMS if as_dict else APPENDS)
    return container + b"q\x00" + POP + outer


def _many(item: bytes, n: int = N_ITEMS) -> bytes:
    return b"".join(item for _ in range(n))


_INTS = _many(b"K\x07")
FLATTEN_WORK = [
    ("10k-item list referenced 10k times", _shared(EMPTY_LIST + MARK + _INTS + APPENDS), "takes more than"),
    ("10k-item tuple referenced 10k times", _shared(MARK + _INTS + TUPLE), "takes more than"),
    ("10k-item list referenced from 10k dict values", _shared(EMPTY_LIST + MARK + _INTS + APPENDS, as_dict=True),
     "takes more than"),
    ("10k-entry dict referenced 10k times", _shared(EMPTY_DICT + MARK + b"".join(i(k) + NONE for k in range(N_ITEMS))
                                                    + SETITEMS), "takes more than"),
    ("Namespace of 10k fields referenced 10k times",
     _shared(g("argparse", "Namespace") + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT + MARK
             + b"".join(s(f"f{k}") + NONE for k in range(N_ITEMS)) + SETITEMS + BUILD), "takes more than"),
    ("list of 100 lists of 10k items, each list referenced 100 times",
     EMPTY_LIST + MARK + _INTS + APPENDS + b"q\x00" + POP + EMPTY_LIST + MARK + _many(b"h\x00", 100) + APPENDS
     + b"q\x01" + POP + EMPTY_LIST + MARK + _many(b"h\x01", 100) + APPENDS, "takes more than"),
    ("10k-member set referenced 10k times (read: each reference is a short description)",
     _shared(EMPTY_SET + MARK + b"".join(i(k) for k in range(N_ITEMS)) + ADDITEMS), None),
    ("10k-member frozenset referenced 10k times (read)",
     _shared(MARK + b"".join(i(k) for k in range(N_ITEMS)) + FROZENSET), None),
]


@pytest.mark.parametrize("body,message", [c[1:] for c in FLATTEN_WORK], ids=[c[0] for c in FLATTEN_WORK])
def test_flattening_work_is_bounded_by_the_file_size(write, marker, body, message):
    payload = P2 + body + STOP
    assert len(payload) < 150_000
    path = write("shared.pkl", payload)
    with bounded(seconds=10, extra_mib=256):
        if message is None:
            ckpt = wio.open(path)
            assert len(ckpt.metadata) == N_ITEMS and all(len(v) <= 80 for v in ckpt.metadata.values())
        else:
            with pytest.raises(CorruptFileError, match=f"flattening the pickled object {message} [0-9,]+ steps "
                                                        r"\(entries visited and list items copied"):
                wio.open(path)


def test_a_list_shared_a_few_times_still_reads(write):
    payload = P2 + _shared(EMPTY_LIST + MARK + _INTS + APPENDS, references=3) + STOP
    ckpt = wio.open(write("few.pkl", payload))
    assert list(ckpt.metadata) == ["0", "1", "2"] and ckpt.metadata["2"] == [7] * N_ITEMS


def test_short_descriptions_never_copy_a_container():
    big = set(range(1_000_000))
    with bounded(seconds=5, extra_mib=16):
        for _ in range(1000):
            assert refs.short_repr(big).startswith("set({0, 1, 2, 3, …")


# ----------------------------------------------------------------------------- the fuzz harnesses find these classes


def test_the_pytorch_fuzz_harnesses_call_a_changed_global_a_finding(tmp_path):
    from .test_fuzz import _load_fuzz_module

    fuzz = _load_fuzz_module()
    harness = fuzz.HARNESSES["pytorch_legacy"]
    path = tmp_path / "input.pt"
    path.write_bytes(P2 + EMPTY_DICT + s("w") + g("torch", "float32") + SETITEM + STOP)
    fuzz.run_one(harness, str(path))  # baseline taken, input read
    token = allowlist.ALLOWLIST[("torch", "float32")]
    object.__setattr__(token, "value", "float16")  # what a BUILD on a live stand-in did
    try:
        with pytest.raises(AssertionError, match="changed an allowlisted global"):
            fuzz.run_one(harness, str(path))
    finally:
        object.__setattr__(token, "value", "float32")


def test_the_pytorch_fuzz_harnesses_call_a_flatten_blow_up_a_finding(tmp_path, monkeypatch):
    from weightio.formats.pytorch import reader

    from .test_fuzz import _load_fuzz_module

    fuzz = _load_fuzz_module()
    monkeypatch.setattr(reader, "_NODE_FLOOR", 10**9)  # the reader's budget off: the harness must notice
    path = tmp_path / "input.pt"
    path.write_bytes(P2 + _shared(EMPTY_LIST + MARK + _many(b"K\x07", 1000) + APPENDS, references=1000) + STOP)
    with pytest.raises(AssertionError, match="emitted 1,000,000 metadata items and tensors"):
        fuzz.run_one(fuzz.HARNESSES["pytorch_legacy"], str(path))
