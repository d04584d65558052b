"""`scan`: what a checkpoint's pickles would import and call — found without running any of it.

For a file (or every file under a directory), the report gives:

* the file's format and weightio's **verdict**: whether `weightio.open` reads it, or the exact
  error it raises (an `UnsafePickleError` names the refused global);
* for **every pickle** the file holds — every zip member holding one, found by its bytes or a
  ``.pkl`` name in any case (``data.pkl``, TorchScript's ``constants.pkl``, a payload under any
  other name), each of the five stacked pickles of a
  legacy ``torch.save`` file, the pickles of a legacy tar's members, a plain pickle and any
  pickles stacked after it:

  - every global it references (``module.name``), resolved by CPython's own unpickler driven
    by recording stand-ins (so ``STACK_GLOBAL`` operands and memo tricks resolve exactly as
    ``pickle.load`` resolves them), plus any named by opcodes the recording did not reach;
  - which of them are outside weightio's allowlist, and the constructs weightio refuses
    (``INST``, ``OBJ``, ``EXT*``, a misplaced ``PROTO`` …);
  - `fickling`'s analysis: the severity of its default analyses and of its ML allowlist, and
    the findings. Every stacked pickle is analysed (``fickling.is_likely_safe`` looks at the
    first only). fickling is only read for the report: weightio's allowlist decides.

* ``safe``: weightio reads the file and no pickle in it needs anything outside the allowlist.

Formats that cannot hold code (safetensors, GGUF, ggml, npy, npz — weightio never unpickles
``.npy`` data) are reported as such, with the reader's verdict.

Which pickles: every member of a zip archive or tar checkpoint that holds one, found by its bytes
(a PROTO opcode first, or a small member that lexes as a whole pickle) as well as by a
``.pkl``/``.pickle`` name in any case — torch finds ``data.pkl`` without regard to case, so an
``archive/DATA.PKL`` is as much a pickle as ``archive/data.pkl``. Member names of a zip archive
that are equal when case is ignored are reported (``collisions``); weightio refuses such files.

Scanning is bounded: pickles go through weightio's prepass first (length and memo bombs are
refused before CPython sees them); fickling is skipped, with a note, for pickles larger than
`MAX_FICKLING_BYTES`, for those whose shared references expand beyond `MAX_EXPANSION`
nodes (fickling's decompiler does not finish on such "billion laughs" pickles), and for those
whose opcodes exceed `MAX_FICKLING_WORK` (fickling spends ~150 µs per BUILD opcode and ~10 µs
per other opcode: an 880 kB pickle of BUILDs took it 65 s). A pickle fickling was not run on
says so in ``fickling_stopped`` and its note (weightio's own globals and refusals are still
complete). Anything fickling prints while it runs is captured, never mixed into the report.
fickling's hooks, ``also_allow``, its torch helpers and its JSON output are never used.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import pickletools
import posixpath
from collections.abc import Iterator, Mapping
from typing import Any, cast

from ._failures import describe_failure, is_url
from ._io import MappedFile
from .errors import STORAGE_OPTIONS_ADVICE, Advice, CorruptFileError, FormatError, InputError, UsageError, WeightioError
from .formats import _zip, is_remote, open_file
from .formats.pytorch import allowlist, lexer, refs, stored_pickles, unpickler
from .formats.pytorch.py2_strings import rewrite
from .formats.sniff import sniff
from .limits import current as current_limits
from .scan_report import FileScan, Finding, PickleScan, ScanReport, findings_about

__all__ = ["ScanReport", "FileScan", "PickleScan", "Finding", "scan", "MAX_FICKLING_BYTES", "MAX_EXPANSION",
           "MAX_FICKLING_WORK"]  # the records live in `.scan_report`, with the report's text and JSON

MAX_FICKLING_BYTES = 16 << 20  # fickling decompiles a pickle to a Python AST: ~2 s per MiB
MAX_EXPANSION = 1_000_000  # nodes a pickle's object graph may expand to before fickling is skipped
MAX_FICKLING_WORK = 400_000  # fickling's cost in opcodes (a BUILD counts _BUILD_COST): ~5 s of its time
_BUILD_COST = 10  # fickling spends ~150 µs on a BUILD, ~10 µs on most other opcodes
MAX_FILES = 10_000  # files scanned under one directory
MAX_FINDINGS = 50  # fickling findings kept per pickle (a 500-tensor state dict yields ~1000)
_NO_CODE = "no code can be stored in this format"
_NO_CODE_FORMATS = {"safetensors", "gguf", "ggml", "npy", "npz"}


# ----------------------------------------------------------------------------- scanning


def scan(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> ScanReport:
    """Report every global the pickles of a checkpoint (or of every checkpoint under a directory)
    reference, weightio's verdict, and fickling's analysis. Nothing in the files is run.

    `path` may be an ``hf://`` path (its weights and configs are downloaded into the Hub cache
    first) or another URL (``https://``, ``s3://`` …, with fsspec's `storage_options`): a file,
    or a folder whose every file is scanned; only the bytes the scan reads are fetched, by range
    (a zip's directory and its pickle members, not its tensor data; a file of pickles back to back,
    as legacy torch files are, from its start up to the header limit, `weightio.limits`).

    Example:
        >>> report = weightio.scan("pytorch_model.bin")        # doctest: +SKIP
        >>> report.safe, report.globals
        (True, ('collections.OrderedDict', 'torch._utils._rebuild_tensor_v2', 'torch.FloatStorage'))
    """
    path = os.fsdecode(path)  # bytes paths too
    if path.startswith("hf://"):
        from .hub import resolve

        path = resolve(path)
    elif is_url(path):
        return _scan_url(path, storage_options)
    if storage_options:
        raise UsageError("storage options apply to URLs only, such as https:// and s3://", path=path,
                         advice=STORAGE_OPTIONS_ADVICE)
    if not os.path.exists(path):  # nothing to judge: an error, as for open(), not an "unsafe" verdict
        raise InputError("no such file or directory", path=path, errno=errno.ENOENT)
    if not os.path.isdir(path):
        return ScanReport(path, (scan_file(path),))
    scans, skipped = [], []
    for file in _walk(path):
        result = scan_file(file)
        if result.format is None and not result.pickles:
            skipped.append(os.path.relpath(file, path))
        else:
            scans.append(result)
    return ScanReport(path, tuple(scans), tuple(skipped))


def _walk(directory: str) -> Iterator[str]:
    count = 0
    for root, dirs, files in os.walk(directory):  # symlinked directories are not followed
        dirs.sort()
        for name in sorted(files):
            count += 1
            if count > MAX_FILES:
                return
            yield os.path.join(root, name)


def _scan_url(url: str, storage_options: Mapping[str, Any] | None) -> ScanReport:
    """A file or a folder (every file under it) at a URL that is not ``hf://``, read by range."""
    from .remote import filesystem, is_folder, redact, remote_file

    fs, root = filesystem(url, storage_options=storage_options)
    folder = is_folder(fs, root, url)
    try:
        found = sorted(fs.find(root))[:MAX_FILES] if folder else []
    except Exception as e:  # noqa: BLE001 - every transport's errors are sorted by describe_failure
        raise describe_failure(e).error(redact(url)) from None

    def one(file_url: str) -> FileScan:
        try:
            file = remote_file(file_url, storage_options=storage_options)
        except WeightioError as e:
            return FileScan(redact(file_url), None, _error_text(e), False, advice=e.advice)
        return scan_file(file.path, file)

    if not folder:
        return ScanReport(redact(url), (one(url),))
    prefix = root.rstrip("/") + "/"
    scans, skipped = [], []
    for name in found:
        rel = name[len(prefix):] if name.startswith(prefix) else posixpath.basename(name)
        result = one(f"{url.rstrip('/')}/{rel}")
        if result.format is None and not result.pickles:
            skipped.append(rel)
        else:
            scans.append(result)
    return ScanReport(redact(url), tuple(scans), tuple(skipped))


def scan_file(path: str, file: Any = None) -> FileScan:
    """Scan one file (see `scan`): `file` when given (a remote file, open), else `path`, mapped."""
    try:
        file = MappedFile(path) if file is None else file
    except WeightioError as e:
        return FileScan(path, None, _error_text(e), False, advice=e.advice)
    remote = is_remote(file)
    try:
        if remote and not _is_zip(file):  # pickles back to back from the start: walked in the file's image
            file.ensure(0, min(file.size, current_limits().header_bytes), "the pickles")
        fmt, kind_note = _format(file)
        pickles = tuple(_scan_pickle(label, data, path) for label, data in _pickles(file, fmt))
        collisions = _collisions(file)
    except BaseException:
        file.close()
        raise
    if not remote:  # a local file is mapped again by its reader; a remote one keeps its fetched blocks
        file.close()
    try:
        verdict, readable, advice = _verdict(file if remote else path) if fmt is not None else (kind_note, False, None)
    finally:
        file.close()
    note = _NO_CODE if fmt in _NO_CODE_FORMATS else kind_note
    if fmt in ("npy", "npz") and verdict.startswith("UnsafePickleError"):
        note = _OBJECT_ARRAYS
    safe = readable and not collisions and all(p.allowed for p in pickles)
    return FileScan(path, fmt, verdict, safe, pickles, note, collisions, advice)


def _collisions(file: MappedFile) -> tuple[tuple[str, str], ...]:
    """Zip member names equal when case is ignored (empty for files that are no zip archive)."""
    if not _is_zip(file):
        return ()
    try:
        return tuple(_zip.case_collisions(_zip.read_members(file)))
    except WeightioError:
        return ()


def _is_zip(file: MappedFile) -> bool:
    return file.read(0, min(file.size, 4), "the first bytes") in (b"PK\x03\x04", b"PK\x05\x06")


def _error_text(error: WeightioError) -> str:
    where = f"tensor {error.tensor!r}: " if error.tensor else ""
    return f"{type(error).__name__}: {where}{error.problem}"


def _format(file: MappedFile) -> tuple[str | None, str]:
    """The sniffed format (None when weightio does not read it) and a note for the report."""
    try:
        return sniff(file), ""
    except FormatError as e:
        return None, e.message
    except CorruptFileError as e:  # a zip weightio refuses: still look for a pickle prefix
        return None, e.message


_OBJECT_ARRAYS = "an object array's data is a pickle (weightio never loads it; numpy runs it with allow_pickle)"


def _verdict(path: Any) -> tuple[str, bool, Advice | None]:
    """What `weightio.open` says of the file, whether it reads it, and the error's advice."""
    try:
        reader = open_file(path)
    except WeightioError as e:
        return _error_text(e), False, e.advice
    try:
        for name, info in reader.tensors.items():
            if info.dtype.hasobject:  # an .npy/.npz object array: listed, its pickle refused when read
                reader.buffer(name)
    except WeightioError as e:
        return _error_text(e), False, e.advice
    finally:
        reader.close()
    return "weightio reads it", True, None


# ----------------------------------------------------------------------------- finding the pickles


def _pickles(file: MappedFile, fmt: str | None) -> list[tuple[str, bytes]]:
    """(location, bytes) of every pickle stream in the file."""
    if fmt in _NO_CODE_FORMATS and fmt != "npz":
        return []
    return stored_pickles.pickles(file)


# ----------------------------------------------------------------------------- one pickle


def _scan_pickle(location: str, data: bytes, path: str) -> PickleScan:
    if not data:
        return PickleScan(location, 0, problems=(location,))
    try:
        lexed = lexer.lex(data, path=None, what=location, collect=True)
    except WeightioError as e:  # a resource or structure error: CPython never runs it
        return PickleScan(location, len(data), problems=(e.problem,),
                          note="not analysed further: weightio refuses it before unpickling")
    static = [f"{m}.{n}" for m, n in lexed.globals]
    recorded, objects, stopped = _record(rewrite(data, lexed.text8))  # (no FRAME: what the lexer walked)
    globals_ = tuple(dict.fromkeys(recorded + static))
    refused = tuple(g for g in globals_ if _split(g) not in allowlist.ALLOWLIST)
    problems = [e.problem for e in cast("list[WeightioError]", lexed.refusals)]  # (a list: collect=True)
    problems += [m for m in _loader_problems(data, location) if m not in problems]
    severity, ml_severity, findings, note = _fickling(data, objects)
    fickling_stopped = severity is None
    if stopped and not note:
        note = f"recording the globals stopped early ({stopped}); opcode arguments were read instead"
    return PickleScan(location, len(data), globals_, refused, tuple(problems), severity, ml_severity,
                      findings_about(findings, globals_), note, fickling_stopped)


def _split(name: str) -> tuple[str, str]:
    module, _, attr = name.rpartition(".")
    return (module, attr)


def _loader_problems(data: bytes, location: str) -> list[str]:
    """What weightio's loader (prepass, allowlist, stand-in checks) says about this pickle alone."""
    try:
        unpickler.load(data, _any_storage, what=location)
    except WeightioError as e:
        return [e.problem]
    return []


def _any_storage(pid: Any) -> Any:
    return refs.StorageRef("scan", "uint8", 0)


class _Absorber:
    """What every global becomes while recording: accepts any call, state, item or attribute
    write and keeps the arguments (so the object graph, for `_expansion`, is complete)."""

    created: list[Any] = []
    parts: list[Any]  # per instance: set by `__new__`

    def __new__(cls, *args: Any, **kwargs: Any) -> _Absorber:
        obj = object.__new__(cls)
        obj.parts = [args, kwargs]
        cls.created.append(obj)
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Absorber:
        return type(self)(*args, **kwargs)

    def __setstate__(*args: Any) -> None:
        _keep(args)

    def append(*args: Any) -> None:
        _keep(args)

    def extend(*args: Any) -> None:
        _keep(args)

    def add(*args: Any) -> None:
        _keep(args)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.parts.append((key, value))


def _keep(args: tuple) -> None:
    if args and isinstance(args[0], _Absorber):
        args[0].parts.append(args[1:])


class _Recorder(pickle.Unpickler):
    """CPython's unpickler where every global is an absorber class: records (module, name)."""

    def __init__(self, data: bytes, absorber: type) -> None:
        super().__init__(unpickler.stream(data), encoding="latin1")  # what the lexer walked
        self.seen: list[str] = []
        self.absorber = absorber
        self.persistent_load = absorber  # type: ignore[method-assign]  # the C unpickler's slot, per instance

    def find_class(self, module: str, name: str) -> Any:
        self.seen.append(f"{module}.{name}")
        return self.absorber


def _record(data: bytes) -> tuple[list[str], list[Any], str]:
    """(globals in the order CPython resolves them, the objects built, why recording stopped or "")."""
    absorber = cast("type[_Absorber]", type("Absorber", (_Absorber,), {"created": []}))  # (its own `created`)
    recorder = _Recorder(data, absorber)
    stopped = ""
    root: Any = None
    try:
        root = recorder.load()
    except Exception as e:  # a malformed pickle: keep what was recorded up to there
        stopped = f"{type(e).__name__}: {refs.short_repr(str(e))}"
    objects = [root, *recorder.memo.copy().values(), *absorber.created]
    return recorder.seen, objects, stopped


def _expansion(objects: list[Any], limit: int) -> int | None:
    """How many nodes the objects expand to when shared references are written out (as a
    decompiler does); None for a cycle. Iterative, memoized by identity, stops past `limit`."""
    sizes: dict[int, int] = {}
    total = 0
    for top in objects:
        stack: list[tuple[Any, bool]] = [(top, False)]
        on_path: set[int] = set()
        while stack:
            obj, done = stack.pop()
            key = id(obj)
            if done:
                on_path.discard(key)
                sizes[key] = min(limit + 1, 1 + sum(sizes.get(id(c), 1) for c in _parts(obj)))
                continue
            if key in sizes:
                continue
            if key in on_path:
                return None
            on_path.add(key)
            stack.append((obj, True))
            stack.extend((c, False) for c in _parts(obj) if id(c) not in sizes)
        total = max(total, sizes.get(id(top), 1))
        if total > limit:
            return total
    return total


def _parts(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, _Absorber):
        return list(obj.parts)
    return []


def _fickling(data: bytes, objects: list[Any]) -> tuple[str | None, str | None, tuple[Finding, ...], str]:
    """fickling's default and ML-allowlist severities and findings — when it is safe to ask."""
    if len(data) > MAX_FICKLING_BYTES:
        return None, None, (), f"not analysed by fickling: larger than {MAX_FICKLING_BYTES >> 20} MiB"
    size = _expansion(objects, MAX_EXPANSION)
    if size is None or size > MAX_EXPANSION:
        what = "contains a cycle" if size is None else f"expands to more than {MAX_EXPANSION:,} nodes"
        return None, None, (), (f"not analysed by fickling: its object graph {what} when shared references "
                                "are written out (a memo-sharing bomb?), on which fickling's decompiler does not "
                                "finish")
    work = _fickling_work(data)
    if work > MAX_FICKLING_WORK:
        return None, None, (), (f"not analysed by fickling: its opcodes cost more than scan's budget of "
                                f"{MAX_FICKLING_WORK:,} (a BUILD counts {_BUILD_COST}; fickling would take minutes)")
    try:
        from fickling.analysis import Analyzer, check_safety
        from fickling.fickle import Pickled
        from fickling.ml import MLAllowlist

        with contextlib.redirect_stdout(io.StringIO()):  # fickling's prints must not reach the report
            pickled = Pickled.load(data, fail_on_decode_error=False)
            default = check_safety(pickled)
            ml = check_safety(pickled, analyzer=Analyzer([MLAllowlist()]))
    except Exception as e:  # fickling failing on a hostile pickle is itself worth reporting
        return None, None, (), f"fickling could not analyse it ({type(e).__name__}: {refs.short_repr(str(e))})"
    return default.severity.name, ml.severity.name, *_findings([*ml.results, *default.results])


def _fickling_work(data: bytes) -> int:
    """fickling's cost of `data` in opcodes, a BUILD counting `_BUILD_COST`; counting stops past
    `MAX_FICKLING_WORK`. The prepass has already checked the pickle, so this walk is bounded."""
    work = 0
    try:
        for opcode, _, _ in pickletools.genops(data):
            work += _BUILD_COST if opcode.code == "b" else 1
            if work > MAX_FICKLING_WORK:
                break
    except Exception:  # noqa: BLE001 - a malformed tail: fickling reports it
        pass
    return work


def _findings(results: list[Any]) -> tuple[tuple[Finding, ...], str]:
    found = [Finding(r.severity.name, r.analysis_name or "", r.message or "", r.trigger)
             for r in results if r.message]
    found = list(dict.fromkeys(found))
    found.sort(key=lambda f: -_SEVERITY_ORDER.get(f.severity, 0))
    note = f"{len(found) - MAX_FINDINGS} more fickling findings not listed" if len(found) > MAX_FINDINGS else ""
    return tuple(found[:MAX_FINDINGS]), note


_SEVERITY_ORDER = {name: i for i, name in enumerate(
    ("LIKELY_SAFE", "POSSIBLY_UNSAFE", "SUSPICIOUS", "LIKELY_UNSAFE", "LIKELY_OVERTLY_MALICIOUS", "OVERTLY_MALICIOUS"))}
