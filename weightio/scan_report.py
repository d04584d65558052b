"""What `weightio.scan` found, as records, as text and as JSON (schema ``weightio.scan/1``).

The report has one verdict, weightio's: a file is ``safe`` when weightio reads it and no pickle
in it needs a global outside weightio's allowlist. fickling's analysis is reported in the terms
of that verdict. fickling flags every import outside the standard library and every call of
one, so an ordinary ``torch.save`` state dict gets ``LIKELY_UNSAFE`` findings for
``torch._utils._rebuild_tensor_v2`` and ``torch.FloatStorage``. A finding is *explained* when its
pickle is one weightio accepts and the finding is about a global of that pickle (its trigger or
message names it): every such global is on weightio's allowlist, and weightio never imports or
calls it — it maps it to a stand-in that records (`role` says which kind, per global). So is a
finding on a BUILD opcode of such a pickle (fickling writes ``_var3.update(...)``): it sets the
state of a stand-in, which has no code of the file to run. Explained findings are summarised as
one line per global; any other finding is listed as fickling words it.
For a pickle weightio refuses, fickling's findings are listed in full, most severe first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import Advice
from .formats.pytorch import allowlist
from .formats.pytorch.inert import FrozenClass, Function, Token
from .text import printable

__all__ = ["SCHEMA", "BUILD", "Finding", "PickleScan", "FileScan", "ScanReport", "role", "findings_about"]

SCHEMA = "weightio.scan/1"
BUILD = "BUILD"  # what `Finding.about` names for fickling's rendering of a BUILD opcode (``_var3.update(...)``)
_BUILD_CALL = re.compile(r"_var\d+\.(?:update|__setstate__)\(")
MAX_LISTED = 8  # fickling findings listed per pickle in the text report (all are in the JSON)

_TOKEN_ROLES = {
    "storage": "a torch storage class: read as the dtype of the stored bytes, never constructed",
    "dtype": "a torch dtype: read as its name",
}


@dataclass(frozen=True)
class Finding:
    """One fickling finding.

    Attributes:
        severity: fickling's severity name (``LIKELY_SAFE`` … ``OVERTLY_MALICIOUS``).
        analysis: the fickling analysis that reported it (``UnsafeImports``, ``MLAllowlist`` …).
        message: fickling's message.
        trigger: the code fragment it points at, when fickling gives one.
        about: the globals of its pickle that the finding names (in its trigger or message).
    """

    severity: str
    analysis: str
    message: str
    trigger: str | None = None
    about: tuple[str, ...] = ()


@dataclass(frozen=True)
class PickleScan:
    """One pickle stream of a file.

    Attributes:
        location: where it is (``archive/data.pkl``, ``pickle 4 (the checkpoint)`` …).
        size: its length in bytes.
        globals: every global it references, ``module.name``, in order of first use.
        refused: those not on weightio's allowlist.
        problems: constructs weightio refuses or cannot read, as the loader words them.
        severity: fickling's default analyses, overall severity (None: not analysed, see `note`).
        ml_severity: fickling's ML-allowlist analysis, overall severity (None: not analysed).
        findings: fickling's findings (at most ``safety.MAX_FINDINGS``, most severe first).
        note: why fickling was skipped, or how many findings were left out.
        fickling_stopped: fickling was not run (or not to the end) on this pickle: it was over
            one of scan's budgets (size, expansion, work), or fickling failed; `note` says which.
    """

    location: str
    size: int
    globals: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    severity: str | None = None
    ml_severity: str | None = None
    findings: tuple[Finding, ...] = ()
    note: str = ""
    fickling_stopped: bool = False

    @property
    def allowed(self) -> bool:
        """True when weightio's allowlist accepts everything this pickle does."""
        return not self.refused and not self.problems

    def explained(self, finding: Finding) -> bool:
        """True when `finding` is about globals weightio accepts here, and so benign (module docstring)."""
        return self.allowed and bool(finding.about)

    @property
    def unexplained(self) -> tuple[Finding, ...]:
        """fickling's findings that weightio's verdict does not account for."""
        return tuple(f for f in self.findings if not self.explained(f))


@dataclass(frozen=True)
class FileScan:
    """One file: its format, weightio's verdict on it, and its pickles.

    Attributes:
        path: the file.
        format: the sniffed format (``"pytorch"``, ``"safetensors"`` …), or None when it is not a
            checkpoint weightio knows (a pickle that is not a torch file still gets its pickles).
        verdict: ``"weightio reads it"``, or the error `weightio.open` raises for it (without its
            advice, which is `advice`).
        safe: weightio reads it and no pickle in it needs anything outside the allowlist.
        pickles: every pickle stream found in it.
        note: what kind of file it is (``no code can be stored in this format`` …).
        collisions: pairs of zip member names that are equal when case is ignored (torch.load
            could read either); such a file is never safe.
        advice: how to read the file anyway, when the error has a fix to pass (for Python and
            for the command line).
    """

    path: str
    format: str | None
    verdict: str
    safe: bool
    pickles: tuple[PickleScan, ...] = ()
    note: str = ""
    collisions: tuple[tuple[str, str], ...] = ()
    advice: Advice | None = None


@dataclass(frozen=True)
class ScanReport:
    """What `scan` found under a path. ``str(report)`` is the text for Python callers;
    ``report.text(cli=True)`` what `weightio scan` prints (advice in command-line words).

    Attributes:
        path: what was scanned (a file or a directory).
        files: one `FileScan` per checkpoint file.
        skipped: files under a directory that are no checkpoint (``config.json`` …).
    """

    path: str
    files: tuple[FileScan, ...]
    skipped: tuple[str, ...] = field(default=())

    @property
    def safe(self) -> bool:
        """True when every file is safe (and there is at least one)."""
        return bool(self.files) and all(f.safe for f in self.files)

    @property
    def globals(self) -> tuple[str, ...]:
        """Every global referenced by any pickle, in order of first appearance."""
        return tuple(dict.fromkeys(g for f in self.files for p in f.pickles for g in p.globals))

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready dicts and lists, schema ``weightio.scan/1`` (docs/scan.md)."""
        return {"schema": SCHEMA, "path": self.path, "safe": self.safe, "files": [_file_json(f) for f in self.files],
                "skipped": list(self.skipped)}

    def text(self, *, cli: bool = False) -> str:
        """The report, one line per item; advice spelled for the command line when `cli`."""
        lines = []
        for f in self.files:
            lines += _file_lines(f, cli)
        if self.skipped:
            shown = ", ".join(self.skipped[:5]) + (" …" if len(self.skipped) > 5 else "")
            lines.append(f"skipped {len(self.skipped)} file(s) that are no checkpoint: {shown}")
        if not self.files:
            lines.append(f"{self.path}: no checkpoint files found")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def role(name: str) -> str | None:
    """What weightio's loader makes of allowlisted global `name` (``module.name``, or `BUILD`), in
    words; None for a global off the allowlist."""
    if name == BUILD:
        return ("an opcode setting the state of an object the pickle built: it reaches weightio's stand-in, "
                "which has no code of the file to run")
    module, _, attr = name.rpartition(".")
    standin = allowlist.ALLOWLIST.get((module, attr))
    if standin is None:
        return None
    if isinstance(standin, Function) and (standin.kind == "rebuild" or attr.startswith("_rebuild")):
        return "a torch tensor rebuild function: weightio records its arguments instead of calling it"
    if isinstance(standin, Token):
        return _TOKEN_ROLES.get(standin.kind, "a constant: read as its name")
    if isinstance(standin, FrozenClass):
        return "a class: weightio builds its own inert stand-in from the stored fields"
    return "weightio's own stand-in rebuilds it from plain values; the real one is never imported or called"


def findings_about(findings: Iterable[Finding], globals_: tuple[str, ...]) -> tuple[Finding, ...]:
    """`findings` with `Finding.about` set: the globals each one names by their last component,
    as a word (``_rebuild_tensor_v2`` in ``Call to `_rebuild_tensor_v2(...)```), or `BUILD` for
    fickling's rendering of that opcode."""
    words = {g: re.compile(rf"(?<!\w){re.escape(g.rpartition('.')[2])}\b") for g in globals_}
    result = []
    for f in findings:
        text = f"{f.trigger or ''}\n{f.message}"
        about = tuple(g for g, word in words.items() if word.search(text))
        if not about and _BUILD_CALL.match(f.trigger or ""):
            about = (BUILD,)
        result.append(Finding(f.severity, f.analysis, f.message, f.trigger, about))
    return tuple(result)


# ----------------------------------------------------------------------------- text


def _file_lines(f: FileScan, cli: bool) -> list[str]:
    """The report of one file, one line per item: every text from the file (globals, messages,
    names) escaped by `printable`, so that a newline or a terminal control sequence in a pickle
    cannot fake a line of the report or repaint its verdict."""
    status = "safe" if f.safe else "UNSAFE" if any(p.refused or p.problems for p in f.pickles) else "not readable"
    one = printable
    advice = "" if f.advice is None else f" ({f.advice.cli if cli else f.advice.python})"
    lines = [f"{one(f.path)}: {status} ({f.format or 'unknown format'}{'; ' + one(f.note) if f.note else ''})",
             f"  weightio: {one(f.verdict)}{advice}"]
    lines += [f"  case collision: {one(repr(a))} and {one(repr(b))} (torch.load could read either)"
              for a, b in f.collisions]
    for p in f.pickles:
        lines += _pickle_lines(p)
    return lines


def _pickle_lines(p: PickleScan) -> list[str]:
    one = printable
    lines = [f"  {one(p.location)} ({p.size:,} bytes)"]
    marked = [f"{one(g)} (refused)" if g in p.refused else one(g) for g in p.globals]
    lines.append(f"    globals: {', '.join(marked) if marked else 'none'}")
    lines += [f"    refused: {one(problem)}" for problem in p.problems]
    if p.severity is not None:
        lines += _fickling_lines(p)
    if p.fickling_stopped:
        lines.append(f"    fickling: not run to the end — {one(p.note)}")
    elif p.note:
        lines.append(f"    note: {one(p.note)}")
    return lines


def _fickling_lines(p: PickleScan) -> list[str]:
    one = printable
    severities = f"{p.severity} by its default analyses, {p.ml_severity} by its ML allowlist"
    explained = [f for f in p.findings if p.explained(f)]
    unexplained = p.unexplained
    if not p.findings:
        return [f"    fickling: no findings ({severities})"]
    if not explained:
        lines = [f"    fickling: {p.severity} (default analyses), {p.ml_severity} (ML allowlist)"]
    else:
        named = {g for f in explained for g in f.about}
        lines = [f"    fickling: {_count(len(explained), 'finding')} ({severities}), benign here:",
                 "      each is about one of these, which weightio accepts without importing or calling anything:"]
        lines += [f"      - {one(g)}: {role(g)}" for g in (*p.globals, BUILD) if g in named]
        if unexplained:
            lines.append(f"    fickling also reports {_count(len(unexplained), 'finding')} about none of these:")
    lines += [f"      - [{x.severity}] {one(x.analysis)}: {one(x.message)}" for x in unexplained[:MAX_LISTED]]
    if len(unexplained) > MAX_LISTED:
        lines.append(f"      … {len(unexplained) - MAX_LISTED} more findings")
    return lines


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# ----------------------------------------------------------------------------- JSON


def _file_json(f: FileScan) -> dict[str, Any]:
    return {"path": f.path, "format": f.format, "safe": f.safe, "verdict": f.verdict,
            "advice": None if f.advice is None else {"python": f.advice.python, "cli": f.advice.cli},
            "note": f.note, "collisions": [list(pair) for pair in f.collisions],
            "pickles": [_pickle_json(p) for p in f.pickles]}


def _pickle_json(p: PickleScan) -> dict[str, Any]:
    return {
        "location": p.location, "size": p.size, "allowed": p.allowed, "globals": list(p.globals),
        "refused": list(p.refused), "problems": list(p.problems),
        "roles": {g: role(g) for g in p.globals if g not in p.refused},
        "fickling": {
            "ran": p.severity is not None, "default_analyses": p.severity, "ml_allowlist": p.ml_severity,
            "explained": bool(p.findings) and not p.unexplained,
            "findings": [{"severity": f.severity, "analysis": f.analysis, "message": f.message, "trigger": f.trigger,
                          "about": list(f.about), "explained": p.explained(f)} for f in p.findings],
        },
        "note": p.note,
    }
