"""Coverage-guided fuzzing of weightio's readers with atheris (libFuzzer). See README.md.

    python tests/fuzz/fuzz.py HARNESS [--skip-known] [libFuzzer flags] [CORPUS_DIR | INPUT_FILE ...]
    python tests/fuzz/fuzz.py HARNESS --replay [--skip-known] CORPUS_DIR_OR_FILE ...
    python tests/fuzz/fuzz.py --list

Each harness writes the fuzzer's bytes to one scratch file on tmpfs, sniffs it, opens it with
its format's reader, and then does what a user would: lists the tensors, reads every metadata
value (as ``weightio inspect`` prints it), and calls ``numpy()``, ``raw()`` and a few slices on
every tensor, checking what comes back (shape, dtype, read-only, slices equal to the same
slice of the whole). The only exception allowed out is a `WeightioError` with a non-empty
message; anything else, a hang (``-timeout``), or an allocation past the address-space cap
(a `MemoryError`) is a finding, and libFuzzer saves the input under ``crashes/``.

With no CORPUS_DIR the corpus is ``tests/fuzz/corpus/HARNESS`` (``$WEIGHTIO_FUZZ_CORPUS/HARNESS``
when that is set). The first corpus directory is seeded from ``fixtures/``: every fixture file
whose sniffed format is the harness's is copied in (once; libFuzzer adds what it finds).
Files instead of directories replay those inputs once (a crash, say) and seed nothing.

``--replay`` runs every input of the given files and directories through the harness once,
without libFuzzer or instrumentation (atheris need not be installed), and prints each finding:
a corpus as a regression run, or under coverage.py to see which lines a corpus reaches::

    coverage run --source=weightio tests/fuzz/fuzz.py gguf --replay tests/fuzz/corpus/gguf
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import resource
import shlex
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

try:
    import atheris
except ImportError:  # --replay and tests/test_fuzz.py's unit tests need no atheris
    atheris = None

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent.parent / "fixtures"
ADDRESS_SPACE_HEADROOM = 2 << 30  # bytes of address space an input may use beyond what start-up mapped
MATERIALIZE_LIMIT = 1 << 24  # bytes of a view the checks copy out (zero strides make views of any size)

# Every module the harnesses reach, imported under instrumentation (weightio imports some
# lazily; a module first imported later would run uninstrumented and give libFuzzer no coverage).
# Imported as a module (by tests/test_fuzz.py), or replaying, nothing is instrumented.
_INSTRUMENT = __name__ == "__main__" and atheris is not None and "--replay" not in sys.argv
with atheris.instrument_imports(include=["weightio"]) if _INSTRUMENT else contextlib.nullcontext():
    import numpy as np
    import weightio.cli
    import weightio.cli._format

    import weightio
    import weightio._json
    import weightio.checkpoint
    import weightio.convert
    import weightio.formats._zip
    import weightio.formats.ggml
    import weightio.formats.gguf
    import weightio.formats.numpy
    import weightio.formats.pytorch
    import weightio.formats.pytorch.flatten
    import weightio.formats.pytorch.tar
    import weightio.formats.pytorch.unpickler
    import weightio.formats.safetensors
    import weightio.formats.sniff
    import weightio.quant
    import weightio.quant.kernels
    import weightio.safety
    import weightio.view
    from weightio._io import MappedFile
    from weightio.errors import WeightioError, WeightioWarning


class Harness(NamedTuple):
    """One fuzz target.

    Attributes:
        open: builds the reader from a mapped file (the reader closes it if it fails).
        seeds: which fixtures seed it: a predicate on (sniffed format, first bytes).
        max_len: libFuzzer's -max_len (the largest input it generates).
        suffix: the scratch file's name (the npy reader names its tensor after the file; a
            split-GGUF name makes the GGUF reader work out its siblings).
        run: when set, what one input does instead of opening it with `open` and reading it.
        hole: bytes of hole (sparse zeros) appended to every input: the ``huge`` harness's files
            are larger than memory (see `huge_hole`).
    """

    open: Callable[[MappedFile], Any]
    seeds: Callable[[str, bytes], bool]
    max_len: int
    suffix: str
    run: Callable[[str], None] | None = None  # does the whole input itself (cli_convert), instead of `_exercise`
    hole: int = 0


def _ggml(file: MappedFile) -> Any:
    """The reader's own choice for 'ggml' files (llama.cpp's layout, then whisper.cpp's); the ggml
    examples' layout (gpt-2) when the file is neither."""
    try:
        return weightio.formats.ggml.GGMLReader(file)
    except WeightioError:
        again = MappedFile(file.path)  # the failed reader closed `file`
        names = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer", "ftype")
        return weightio.formats.ggml.GGMLReader(again, hparams=names, vocab_count=True)


def _pytorch_kind(head: bytes) -> str:
    if head.startswith(b"PK"):
        return "zip"
    return "tar" if head[257:262] == b"ustar" else "pickle"


# ----------------------------------------------------------------------------- parser differentials


def _pytorch_differential(file: MappedFile) -> Any:
    """The pytorch/npz readers, checked against the libraries torch and numpy use to split a file
    into parts (Python's `zipfile` and `tarfile`): wherever both read it, the parts must be the
    same bytes; a file `tarfile` opens is never read as a raw pickle; a pickle weightio refuses as
    unsafe is never called safe by `scan`. Any disagreement is an AssertionError (a finding)."""
    data = bytes(file.data)
    try:
        fmt = weightio.formats.sniff.sniff(file)
        reader = (weightio.formats.numpy.NpzReader if fmt == "npz" else weightio.formats.pytorch.PyTorchReader)(file)
    except weightio.errors.UnsafePickleError:
        _check_scan_refuses(file.path)
        raise
    except WeightioError:
        file.close()
        raise
    if data.startswith(b"PK\x03\x04"):
        _same_zip_members(reader, data)
    elif _tarfile_opens(data):
        assert getattr(reader, "container", "tar") == "tar", "tarfile opens this file but weightio read a raw pickle"
        _same_tar_members(reader, data)
    return reader


def _check_scan_refuses(path: str) -> None:
    report = weightio.safety.scan_file(path)
    assert not report.safe, "weightio.open refuses the file as unsafe but scan calls it safe"


def _same_zip_members(reader: Any, data: bytes) -> None:
    import io
    import zipfile

    members = weightio.formats._zip.read_members(reader.file)
    folded = [m.raw_name.lower() for m in members]
    assert len(set(folded)) == len(folded), "weightio read an archive whose names collide when case is ignored"
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, OSError):
        return  # zipfile refuses it (stricter or different checks): nothing to compare
    assert names == [m.name for m in members], ("zipfile lists other members", names)
    for m in members:
        if m.size >= 1 << 26:  # beyond what the harness reads (zipfile's read(n) overflows past 2^63 - 1)
            continue
        try:
            with archive.open(m.name) as f:
                theirs = f.read(m.size + 1)
        except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, OSError, zlib_error()):
            continue
        ours = weightio.formats._zip.read_member(reader.file, m, 1 << 26)
        assert theirs == ours, f"member {m.name!r}: zipfile reads other bytes than weightio"


def zlib_error() -> type:
    import zlib

    return zlib.error


def _tarfile_opens(data: bytes) -> bool:
    import io
    import tarfile

    try:
        tarfile.open(fileobj=io.BytesIO(data), mode="r:").close()
    except tarfile.TarError:
        return False
    except Exception:  # noqa: BLE001 - tarfile fails otherwise (torch.load fails too): weightio must refuse
        return True
    return True


def _same_tar_members(reader: Any, data: bytes) -> None:
    import io
    import tarfile

    ours = {m.name: data[m.data_offset: m.data_offset + m.size]
            for m in weightio.formats.pytorch.tar.read_members(reader.file)}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        theirs = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isreg()}
    assert ours == theirs, "tarfile reads other members than weightio"


def _safetensors_differential(file: MappedFile) -> Any:
    """The safetensors reader's header paths, checked against each other on every input: the C
    path (`weightio._speedups`, where built; what every plain header gets), msgspec's decode
    against the format's schema (what a header of 1 MiB or more gets), the standard parser's fast
    path (a smaller one) and the exact path (`_strict_entries`, which every refusal of the others
    falls back to) must give the same tensors and metadata, or the same refusal word for word. Any
    difference is an AssertionError (a finding); then the input is read as usual. Except where a
    path says the header "nests too deeply": how deep a parser gets before Python's recursion limit
    depends on the stack under it (a field ignored with a warning ~990 levels deep is read, or
    refused, by the same path at two stack depths)."""
    from weightio.formats import safetensors as module

    outcomes = {}
    for way in module.WAYS if module._c_header is not None else module.WAYS[1:]:
        try:
            with module._only_way(way):
                reader = module.SafetensorsReader(file.path)
            outcomes[way] = ({k: tuple(v) for k, v in reader.tensors.items()}, list(reader.tensors), reader.metadata)
            reader.close()
        except WeightioError as e:
            outcomes[way] = (type(e).__name__, str(e))
    if not any("nests too deeply" in str(outcome) for outcome in outcomes.values()):  # (see below)
        exact = outcomes["exact"]
        for way, outcome in outcomes.items():
            assert outcome == exact, (f"the {way} path and the exact path disagree", outcome, exact)
    return module.SafetensorsReader(file)


_PT = lambda file: _pytorch_checked(file)  # noqa: E731 - defined below, with the checks it adds
HARNESSES: dict[str, Harness] = {
    "safetensors": Harness(weightio.formats.safetensors.SafetensorsReader, lambda f, h: f == "safetensors",
                           16384, "input.safetensors"),
    "npy": Harness(weightio.formats.numpy.NpyReader, lambda f, h: f == "npy", 4096, "input.npy"),
    "npz": Harness(weightio.formats.numpy.NpzReader, lambda f, h: f == "npz", 16384, "input.npz"),
    "pytorch_zip": Harness(_PT, lambda f, h: f == "pytorch" and _pytorch_kind(h) == "zip", 16384, "input.pt"),
    "pytorch_legacy": Harness(_PT, lambda f, h: f == "pytorch" and _pytorch_kind(h) == "pickle", 16384, "input.pt"),
    "pytorch_tar": Harness(_PT, lambda f, h: f == "pytorch" and _pytorch_kind(h) == "tar", 16384, "input.pt"),
    "gguf": Harness(lambda file: _within_heap_bound(weightio.formats.gguf.GGUFReader, file), lambda f, h: f == "gguf",
                    16384, "input-00001-of-00002.gguf"),
    "ggml": Harness(_ggml, lambda f, h: f == "ggml", 8192, "input.bin"),
    "cli_convert": Harness(MappedFile, lambda f, h: True, 16384, "input.bin",
                           run=lambda path: _convert_everywhere(path)),
    "pytorch_differential": Harness(_pytorch_differential, lambda f, h: f in ("pytorch", "npz"), 16384, "input.pt"),
    "safetensors_differential": Harness(_safetensors_differential, lambda f, h: f == "safetensors", 16384,
                                        "input.safetensors"),
    # every pickle of every container in placeholder mode: unknown globals become placeholders, and the same
    # isolation, work and memory checks hold (no allowlisted global changes, no code runs)
    "pytorch_placeholder": Harness(lambda file: _pytorch_checked(file, "placeholder"), lambda f, h: f == "pytorch",
                                   16384, "input.pt"),
}


# ----------------------------------------------------------------------------- one input


# Findings reported in findings/ (code this project's fuzz work does not own) and not fixed yet:
# (exception type, file, function) where it escapes. `--skip-known` lets a long run go on past
# them; without it (the default, and in tests/test_fuzz.py) they are findings like any other.
KNOWN: set[tuple[str, str, str]] = set()
skip_known = False


def run_one(harness: Harness, path: str) -> None:
    """Open `path` with `harness` and use everything it exposes; only a `WeightioError` may escape."""
    try:
        if harness.run is not None:
            harness.run(path)
        else:
            (_exercise_huge if harness.hole else _exercise)(harness, path)
    except WeightioError as e:
        _check_error(e)
    except Exception as e:
        if not (skip_known and _signature(e) in KNOWN):
            raise


def _signature(e: BaseException) -> tuple[str, str, str]:
    where = traceback.extract_tb(e.__traceback__)[-1]
    return type(e).__name__, os.path.basename(where.filename), where.name


def _check_error(e: WeightioError) -> None:
    if not e.message or not str(e).strip():
        raise AssertionError(f"{type(e).__name__} with an empty message") from e
    if "cannot map file" in e.message:  # a regular file on tmpfs: only a commitment sized by the file fails (class 7)
        raise AssertionError(f"a readable file could not be mapped: {e}") from e


def _exercise(harness: Harness, path: str) -> None:
    file = MappedFile(path)
    try:
        weightio.formats.sniff.sniff(file)  # its verdict may differ from the harness's format: only errors matter
    except WeightioError as e:
        _check_error(e)
    except BaseException:
        file.close()
        raise
    reader = harness.open(file)
    ckpt = weightio.checkpoint.Checkpoint([reader], path=path)
    try:
        reader.siblings()
        kept = _read_everything(ckpt)
    finally:
        ckpt.close()
    for arr in kept:  # arrays handed out before close() stay readable (the mapping outlives them)
        if arr.size:
            _touch(arr)
    if kept and ckpt.readers[0].file.closed:
        _expect_closed_error(ckpt)
    _render_cli(path)


def _touch(arr: np.ndarray) -> None:
    """Read the bytes of `arr`'s first and last elements: their bytes, not their values (numpy cannot
    make a str of a text element past U+10FFFF, which `numpy()` hands out as ``numpy.load`` does;
    weightio refuses it where it makes the str itself: `view[key]`, `show`)."""
    if arr.ndim == 0:
        arr.tobytes()
        return
    arr[(slice(0, 1),) * arr.ndim].tobytes()
    arr[(slice(-1, None),) * arr.ndim].tobytes()


def _read_everything(ckpt: Any) -> list[np.ndarray]:
    """Metadata as the CLI shows it, then every tensor; returns one array per tensor read."""
    assert len(list(ckpt)) == len(ckpt)
    for key, value in ckpt.metadata.items():
        _read_metadata(key, value)
    kept = []
    for name in ckpt:
        try:
            kept.append(_read_tensor(ckpt[name]))
        except WeightioError as e:  # one unreadable tensor (an unknown type, say) must not hide the rest
            _check_error(e)
    return kept


def _read_metadata(key: str, value: Any) -> None:
    weightio.cli._format.elide(value)
    weightio.cli._format.json_value(value)
    if isinstance(value, weightio.formats.gguf.GGUFArray):
        assert value.tolist() == list(value) and len(value.tolist()) == len(value), key
        if value.type not in ("STRING", "ARRAY"):
            assert value.numpy().shape == (len(value),), key


def _read_tensor(view: Any) -> np.ndarray:
    repr(view), repr(view.info)  # reprs format every number from the file (issue 12, class 4)
    whole = view.numpy()
    assert isinstance(whole, np.ndarray) and whole.shape == view.shape, (view.name, whole.shape, view.shape)
    assert whole.dtype == view.dtype and not whole.flags.writeable, (view.name, whole.dtype, view.dtype)
    raw = view.raw()
    assert raw.dtype == np.uint8 and raw.ndim == 1 and not raw.flags.writeable, view.name
    if view.info.strides is None:
        assert raw.size == view.nbytes, (view.name, raw.size, view.nbytes)
    if view.shape and view.shape[0]:
        for key in (slice(1, 3), slice(None, None, -2), -1, (0, Ellipsis)):
            assert _same(view[key], whole[key]), (view.name, key)
    return whole


def _same(part: Any, whole: Any) -> bool:
    """Equal values (NaN equal to NaN: a NaN's payload may depend on how many blocks were
    decoded at once). Views whose elements a zero stride repeats are compared by shape only:
    materializing one (a 1 KiB torch file can describe 2^40 elements) is the caller's choice."""
    part, whole = np.asarray(part), np.asarray(whole)
    if part.shape != whole.shape or part.dtype != whole.dtype:
        return False
    if part.dtype.names:  # a record's padding bytes are not copied by numpy: compare field by field
        return all(_same(part[name], whole[name]) for name in part.dtype.names)
    if part.nbytes > MATERIALIZE_LIMIT:
        return True
    if part.tobytes() == whole.tobytes():
        return True
    return part.dtype.kind in "fc" and np.array_equal(part, whole, equal_nan=True)


def _expect_closed_error(ckpt: Any) -> None:
    name = next(iter(ckpt))
    try:
        ckpt[name].numpy()
    except WeightioError as e:
        _check_error(e)
    else:
        raise AssertionError("a view read after close() returned data")


# ----------------------------------------------------------------------------- what a user sees (issue 12, classes 4-6)

# What a terminal acts on or cannot encode: human output may hold no such character but \n and \t
# (weightio's own colours are off: CliRunner is no terminal). JSON output must parse.
_UNSAFE_OUTPUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_CLI = None
HEAP_PER_BYTE, HEAP_SLACK = 16, 64 << 10  # docs/security.md: 16 bytes per header byte (+1 MiB; tighter here)


def _render_cli(path: str) -> None:
    """``weightio inspect`` and ``inspect --json`` of the input, in-process: the command must end
    with status 0 or a one-line error (1), print nothing a terminal acts on, and JSON must parse."""
    global _CLI
    if _CLI is None:
        from click.testing import CliRunner

        _CLI = CliRunner()
    for args in ([path], [path, "--json"]):
        result = _CLI.invoke(weightio.cli.main, ["inspect", *args])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception.with_traceback(result.exc_info[2])
        output = result.output
        if result.exit_code not in (0, 1) or (result.exit_code == 1 and not output.startswith("weightio: error: ")):
            raise AssertionError(f"inspect {args[1:]} exited {result.exit_code}: {output[:300]!r}")
        if _UNSAFE_OUTPUT.search(output):
            raise AssertionError(f"inspect {args[1:]} printed a control character: {output[:300]!r}")
        if result.exit_code == 0 and "--json" in args:
            __import__("json").loads(output)


def _within_heap_bound(open_reader: Callable[[MappedFile], Any], file: MappedFile) -> Any:
    """Open with `open_reader` under tracemalloc: the Python heap opening takes stays within
    `HEAP_PER_BYTE` bytes per file byte (plus `HEAP_SLACK`) whatever the file claims."""
    tracemalloc.start()
    try:
        reader = open_reader(file)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if peak > HEAP_PER_BYTE * file.size + HEAP_SLACK:
        reader.close()
        raise AssertionError(f"opening took {peak} bytes of heap for a {file.size}-byte file")
    return reader


def _convert_everywhere(path: str) -> None:
    """The `cli_convert` harness: an input weightio opens is converted to every writable format,
    and each output must open again with its own reader (a writer that writes what its reader
    refuses — a zip-slip npz member, a name with a lone surrogate — is a finding)."""
    try:
        weightio.open(path).close()
    except WeightioError as e:
        _check_error(e)
        return
    out = tempfile.mkdtemp(prefix="weightio-fuzz-out-", dir=os.path.dirname(path))
    try:
        for suffix in (".safetensors", ".npz", ".gguf", ".npy"):
            target = os.path.join(out, "out" + suffix)
            try:
                weightio.convert.convert(path, target)
            except WeightioError as e:  # a tensor the format cannot hold, a name it refuses: said cleanly
                _check_error(e)
                continue
            with weightio.open(target) as ckpt:  # anything but success here is a finding
                for name in ckpt:
                    ckpt[name].raw()
    finally:
        shutil.rmtree(out, ignore_errors=True)


# ----------------------------------------------------------------------------- pytorch: isolation and work
# Two findings no exception shows (issue 12, classes 2 and 5): an input that changes an
# allowlisted global (module-level state: every later file would read differently), and one
# whose reading costs time or memory out of proportion to its size (flattening a list that
# the pickle references many times). The pytorch harnesses check both after every input.

WORK_PER_BYTE = 8  # metadata items + tensors emitted per input byte (the reader's own budget is 4, + a floor)
WORK_FLOOR = 200_000
SECONDS_PER_BYTE = 50e-6  # generous: instrumented code is slow, and the machine may be shared
SECONDS_FLOOR = 2.0
RSS_PER_BYTE = 4096  # peak resident growth allowed per input byte, + a floor
RSS_FLOOR = 256 << 20
BENIGN_EVERY = 256  # inputs between re-reads of a benign pickle


def _allowlist_state() -> tuple:
    """Everything a pickle could have changed in the allowlist: each stand-in's attributes, and
    the defaults, code and ``__dict__`` of the function each `Function` calls."""
    from weightio.formats.pytorch import allowlist, inert

    state = []
    for key, value in allowlist.ALLOWLIST.items():
        attrs: list[Any] = [type(value)]
        for name in ("module", "name", "kind", "value", "_call"):
            attrs.append(getattr(value, name, None))
        target = getattr(value, "_call", None) if isinstance(value, inert.Function) else None
        for name in ("__defaults__", "__kwdefaults__", "__code__"):
            attrs.append(getattr(target, name, None))
        attrs.append(tuple(getattr(target, "__dict__", {}).items()))
        if isinstance(value, type):
            attrs.append(tuple(vars(value).items()))
        state.append((key, tuple(attrs)))
    return tuple(state)


def _benign_digest() -> tuple:
    """What a benign pickle of every allowlisted kind of value reads as (compared over a run)."""
    import argparse
    import collections
    import pickle

    value = {"args": argparse.Namespace(lr=0.1), "od": collections.OrderedDict(a=(1, 2)), "s": {1},
             "arr": np.arange(3, dtype=">f4"), "dt": np.dtype("i2"), "c": collections.Counter(x=1)}
    root = weightio.formats.pytorch.unpickler.load(pickle.dumps(value, protocol=2), lambda pid: None)
    tensors, metadata = weightio.formats.pytorch.flatten.flatten(root, budget=10_000, root_name="x")
    return tuple(sorted((k, repr(v)) for k, v in metadata.items())), tuple(
        (k, t.array.dtype.str, t.array.tobytes()) for k, t in tensors.items())


_BASELINE: dict[str, Any] = {}


def _check_isolation() -> None:
    _BASELINE["inputs"] += 1
    if _allowlist_state() != _BASELINE["state"]:
        raise AssertionError("the input changed an allowlisted global (class 2: a stand-in is not inert)")
    if _BASELINE["inputs"] % BENIGN_EVERY == 0 and _benign_digest() != _BASELINE["digest"]:
        raise AssertionError("a benign pickle reads differently after this input (class 2: process state changed)")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _pytorch_checked(file: MappedFile, unknown_globals: str = "refuse") -> Any:
    """`PyTorchReader` (in `unknown_globals` mode), then the isolation and work checks (also when
    the input is refused)."""
    if not _BASELINE:  # taken before the first input is read
        _BASELINE.update(state=_allowlist_state(), digest=_benign_digest(), inputs=0)
    size, rss, start = file.size, _peak_rss(), time.perf_counter()
    try:
        reader = weightio.formats.pytorch.PyTorchReader(file, unknown_globals=unknown_globals)
    finally:
        _check_isolation()
        _check_cost(size, time.perf_counter() - start, _peak_rss() - rss)
    emitted = len(reader.tensors) + sum(len(v) if isinstance(v, (list, str)) else 1 for v in reader.metadata.values())
    if emitted > WORK_PER_BYTE * size + WORK_FLOOR:
        raise AssertionError(f"a {size:,}-byte input emitted {emitted:,} metadata items and tensors (class 5: work "
                             "not bounded by the file's size)")
    return reader


def _check_cost(size: int, seconds: float, rss_growth: int) -> None:
    if seconds > SECONDS_FLOOR + SECONDS_PER_BYTE * size:
        raise AssertionError(f"a {size:,}-byte input took {seconds:.1f} s to open (class 5: work not bounded)")
    if rss_growth > RSS_FLOOR + RSS_PER_BYTE * size:
        raise AssertionError(f"a {size:,}-byte input grew the peak RSS by {rss_growth >> 20:,} MiB (class 5: memory "
                             "not bounded by the file's size)")


# ----------------------------------------------------------------------------- scratch file and seeds


class Scratch:
    """The one file each input is written to: on tmpfs when there is one, replaced (new inode)
    per input so that no mapping of an earlier input ever sees its file shrink."""

    def __init__(self, suffix: str, hole: int = 0) -> None:
        root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="weightio-fuzz-", dir=root)
        self.path = os.path.join(self.dir, suffix)
        self.hole = hole  # sparse bytes appended after each input (the `huge` harness)

    def write(self, data: bytes) -> str:
        if os.path.lexists(self.path):
            os.unlink(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.hole:
                os.ftruncate(fd, len(data) + self.hole)
        finally:
            os.close(fd)
        return self.path


def seed_files(harness: Harness) -> list[Path]:
    """The fixtures whose sniffed format is `harness`'s."""
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".json"):
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(512)
            file = MappedFile(path)
            try:
                fmt = weightio.formats.sniff.sniff(file)
            finally:
                file.close()
        except WeightioError:
            continue
        if harness.seeds(fmt, head):
            found.append(path)
    return found


def seed(harness: Harness, corpus: Path) -> int:
    """Copy the harness's fixtures into `corpus` (kept as they are when already there), and the
    ZIP64 form of each zip archive among them (no fixture is big enough to need ZIP64 records)."""
    corpus.mkdir(parents=True, exist_ok=True)
    if harness.hole:
        return seed_huge(harness, corpus)
    files = seed_files(harness)
    for path in files:
        name = "seed-" + re.sub(r"[^A-Za-z0-9._-]", "_", str(path.relative_to(FIXTURES)))
        data = path.read_bytes()
        variants = {name: data, "zip64-" + name: zip64_variant(data) if data.startswith(b"PK") else None}
        for target, content in variants.items():
            if content is not None and not (corpus / target).exists():
                (corpus / target).write_bytes(content)
    return len(files)


_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # a zip central directory entry (see weightio.formats._zip)
_EOCD = struct.Struct("<IHHHHIIH")


def zip64_variant(data: bytes) -> bytes:
    """The same archive with every central entry's sizes and offset in a ZIP64 extra field
    and ZIP64 end records: the 32-bit fields all 0xFFFFFFFF (0xFFFF for counts)."""
    *_, count, cd_size, cd_offset, _ = _EOCD.unpack_from(data, len(data) - _EOCD.size)
    entries, pos = [], cd_offset
    for _ in range(count):
        f = list(_CENTRAL.unpack_from(data, pos))
        nlen, xlen, clen = f[10], f[11], f[12]
        name = data[pos + _CENTRAL.size: pos + _CENTRAL.size + nlen]
        rest = data[pos + _CENTRAL.size + nlen: pos + _CENTRAL.size + nlen + xlen + clen]
        extra = struct.pack("<HHQQQ", 1, 24, f[9], f[8], f[16])
        f[8] = f[9] = f[16] = 0xFFFFFFFF
        f[11] = xlen + len(extra)
        entries.append(_CENTRAL.pack(*f) + name + extra + rest)
        pos += _CENTRAL.size + nlen + xlen + clen
    directory = b"".join(entries)
    record = cd_offset + len(directory)
    end64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, len(directory), cd_offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, record, 1)
    eocd = _EOCD.pack(0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return data[:cd_offset] + directory + end64 + locator + eocd


# ----------------------------------------------------------------------------- larger than memory (issue 12, 7)
#
# The `huge` harness appends a hole of `huge_hole()` bytes (4x this machine's memory) to every
# input, so each file is far larger than memory, whatever its format (sniffed). Opening one must
# not fail for lack of memory ("cannot map file" is a finding in every harness) nor commit memory
# for its mapping (checked in /proc/self/smaps); every tensor's first and last stored bytes and its
# first and last rows are read (never the whole tensor: a conversion of a 100 GiB tensor allocates
# what it asks for, which is documented). Seeds: safetensors, GGUF and .npy headers built here,
# declaring one tensor that ends at the end of the hole; inputs of other formats are refused.


def huge_hole() -> int:
    """4x this machine's memory (at least 64 GiB), in whole GiB."""
    total = 16 << 30
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    return max(4 * total // (1 << 30) + 1, 64) << 30


# The formats whose readers' work is bounded by their headers, not by the file's size. Outside it:
# the PyTorch lexer searches a text opcode's argument for its newline through the whole file (a
# 13-byte pickle + the hole: minutes, and every page of the hole read; reported, not fixed here),
# and the ggml readers walk tensor records through the hole.
HUGE_FORMATS = ("safetensors", "gguf", "npy")


def _sniffed(file: MappedFile) -> Any:
    """What `weightio.formats.open_file` does with a mapped file: the file is closed on any failure
    (the campaign of 2026-11-23 ran out of descriptors after 57k inputs when a failed sniff left
    them to the garbage collector)."""
    try:
        fmt = weightio.formats.sniff.sniff(file)
        if fmt not in HUGE_FORMATS:
            raise weightio.errors.FormatError(f"{fmt}: not a format the huge harness reads", path=file.path)
        return weightio.formats.resolve(weightio.formats.READERS[fmt])(file)
    except BaseException:
        file.close()
        raise


def _committed(path: str) -> int:
    """Bytes of this process's mappings of `path` that the kernel charges to its commit limit
    (``ac`` in their smaps ``VmFlags``: private writable mappings)."""
    total = size = 0
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:
                current = fields[5] if len(fields) > 5 else None
            elif fields[:1] == ["Size:"]:
                size = int(fields[1]) * 1024
            elif fields[:1] == ["VmFlags:"] and current == path and "ac" in fields[1:]:
                total += size
    return total


def _exercise_huge(harness: Harness, path: str) -> None:
    try:
        file = MappedFile(path)
    except WeightioError:  # an earlier input's mapping, held by a reference cycle (an exception's
        gc.collect()  # traceback), not yet freed: the capped address space holds one hole, not two
        file = MappedFile(path)
    if sys.platform == "linux" and _committed(file.path):
        file.close()
        raise AssertionError(f"mapping {file.path} ({file.size} bytes) commits memory")
    reader = harness.open(file)
    ckpt = weightio.checkpoint.Checkpoint([reader], path=path)
    try:
        for name in ckpt:
            view = ckpt[name]
            try:
                raw = view.raw()
                if raw.size:
                    raw[0], raw[-1]  # noqa: B018 - the first and last stored bytes: the far end maps
                if view.shape and view.shape[0]:
                    assert view[:1].shape[0] == 1 and view[-1:].shape[0] == 1, name
            except WeightioError as e:
                _check_error(e)
    finally:
        ckpt.close()


def seed_huge(harness: Harness, corpus: Path) -> int:
    """Write the ``huge`` harness's seeds: safetensors, GGUF and .npy files whose one uint8/int8
    tensor is 16 bytes of the input followed by the whole hole (kept as they are when already there)."""
    n, far = 16 + harness.hole, b"weightio-far-end"
    meta = b'{"far":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (n, n)
    meta += b" " * (-(8 + len(meta)) % 8)
    gguf = b"GGUF" + struct.pack("<IQQQ", 3, 1, 0, 3) + b"far" + struct.pack("<IQIQ", 1, n, 24, 0)  # ggml I8
    npy = b"{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % n
    npy += b" " * (-(10 + len(npy) + 1) % 64) + b"\n"
    seeds = {
        "seed-huge.safetensors": struct.pack("<Q", len(meta)) + meta + far,
        "seed-huge.gguf": gguf.ljust(len(gguf) + -len(gguf) % 32, b"\0") + far,
        "seed-huge.npy": b"\x93NUMPY\x01\x00" + struct.pack("<H", len(npy)) + npy + far,
    }
    for target, content in seeds.items():
        if not (corpus / target).exists():
            (corpus / target).write_bytes(content)
    return len(seeds)


HARNESSES["huge"] = Harness(_sniffed, lambda f, h: False, 16384, "input.bin", hole=huge_hole())


# ----------------------------------------------------------------------------- driver


def _cap_address_space(extra: int = 0) -> None:
    """Make an allocation sized by a forged number fail fast (`MemoryError`, a finding) instead
    of swapping: the address space may grow by `ADDRESS_SPACE_HEADROOM` beyond start-up (and by
    `extra`, the hole of the ``huge`` harness, whose files are mapped whole)."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = vm + ADDRESS_SPACE_HEADROOM + extra
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _libfuzzer_args(name: str, harness: Harness, args: list[str]) -> list[str]:
    flags = [a for a in args if a.startswith("-")]
    paths = [a for a in args if not a.startswith("-")]
    given = {a.split("=", 1)[0] for a in flags}
    defaults = {
        "-max_len": str(harness.max_len),
        "-timeout": "10",
        "-rss_limit_mb": "2560",
        "-dict": str(HERE / "dicts" / f"{name}.dict"),
        "-artifact_prefix": str(HERE / "crashes" / f"{name}-"),
        "-print_final_stats": "1",
    }
    for flag, value in defaults.items():
        if flag not in given:
            flags.append(f"{flag}={value}")
    os.makedirs(HERE / "crashes", exist_ok=True)
    replay = paths and all(os.path.isfile(p) for p in paths)
    if not paths:
        root = Path(os.environ.get("WEIGHTIO_FUZZ_CORPUS", HERE / "corpus"))
        paths = [str(root / name)]
    if not replay and "-merge=1" not in flags:
        count = seed(harness, Path(paths[0]))
        print(f"INFO: weightio: {count} fixture seeds in {paths[0]}", file=sys.stderr)
    return flags + paths


def replay_inputs(harness: Harness, paths: list[str], timeout: float = 10) -> int:
    """Run every file under `paths` through `harness` once; print each finding (an input taking
    more than `timeout` seconds is one); 1 if any."""
    files = sorted(f for p in map(Path, paths) for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    scratch, failed = Scratch(harness.suffix, harness.hole), 0
    previous = signal.signal(signal.SIGALRM, _hung)
    try:
        for file in files:
            try:
                signal.setitimer(signal.ITIMER_REAL, timeout)
                run_one(harness, scratch.write(file.read_bytes()))
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Exception:
                signal.setitimer(signal.ITIMER_REAL, 0)
                failed += 1
                print(f"FINDING {file}:\n{traceback.format_exc()}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(scratch.dir, ignore_errors=True)
    print(f"replayed {len(files)} inputs: {failed} findings", file=sys.stderr)
    return 1 if failed else 0


def _hung(signum: int, frame: Any) -> None:
    raise TimeoutError("the input took longer than the replay timeout (a hang?)")


def main(argv: list[str]) -> None:
    global skip_known
    if len(argv) < 2 or argv[1] not in HARNESSES:
        print(__doc__.split("\n\n")[1] + "\nharnesses: " + ", ".join(HARNESSES), file=sys.stderr)
        raise SystemExit(0 if argv[1:2] == ["--list"] else 2)
    name, harness = argv[1], HARNESSES[argv[1]]
    skip_known = "--skip-known" in argv
    replay = "--replay" in argv
    argv = [a for a in argv if a not in ("--skip-known", "--replay")]
    warnings.simplefilter("error")  # as in the test suite: a stray warning is a finding
    warnings.simplefilter("ignore", WeightioWarning)  # documented, deliberate warnings
    if replay:
        _cap_address_space(harness.hole)
        raise SystemExit(replay_inputs(harness, argv[2:]))
    if atheris is None:
        raise SystemExit("atheris is not installed (pip install atheris; Linux x86-64); --replay works without it")
    scratch = Scratch(harness.suffix, harness.hole)

    def one_input(data: bytes) -> None:
        run_one(harness, scratch.write(data))

    args = _libfuzzer_args(name, harness, argv[2:])
    _cap_address_space(harness.hole)
    # libFuzzer runs argv[0] through the shell for -minimize_crash and -fork: make it the whole
    # command that reaches this harness again.
    program = " ".join(shlex.quote(part) for part in (sys.executable, os.path.abspath(argv[0]), name))
    atheris.Setup([program, *args], one_input)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(scratch.dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
