"""The command line's text: what `printable` escapes, the tables, and inspect's totals (fast paths
against their definitions)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from weightio.cli import inspect as cli_inspect
from weightio.cli._format import column_table, kind, table

import weightio as wio
from weightio.text import _CONTROL_KEEP_LINES, CONTROL, needs_escape, printable

from .conftest import FIXTURES

# The two patterns `printable` escapes, written here from their definition (weightio.text).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_ESCAPED = {False: re.compile(f"[\t\n{_UNSAFE}]"), True: re.compile(f"[{_UNSAFE}]")}

# text mixing plain ASCII, every ASCII control, the C1 range, bidi controls, separators, surrogates
# and ordinary non-ASCII letters
_CHARS = st.one_of(st.characters(max_codepoint=0x7F), st.sampled_from(
    ["\x85", "\x9b", "\xa0", "é", "\u061c", "\u200e", "\u2028", "\u202e", "\u2066", "\u2069", "\u206a", "\ud800",
     "\udfff", "名", "\U0001f600"]))


@settings(max_examples=3000, deadline=None)
@given(text=st.text(_CHARS, max_size=12), lines=st.booleans())
def test_needs_escape_is_exactly_what_the_patterns_find(text, lines):
    assert needs_escape(text, lines=lines) is (_ESCAPED[lines].search(text) is not None)


@pytest.mark.parametrize("lines", [False, True])
def test_needs_escape_agrees_with_the_patterns_on_every_code_point(lines):
    # alone, after ASCII (the translate test) and after a non-ASCII letter (isprintable, then the scan)
    pattern = _ESCAPED[lines]
    wrong = [c for c in range(0x110000) for ch in (chr(c),)
             if not needs_escape(ch, lines=lines) is needs_escape("a" + ch, lines=lines)
             is needs_escape("é" + ch, lines=lines) is (pattern.search(ch) is not None)]
    assert wrong == []


def test_every_escaped_character_is_one_isprintable_refuses():
    # the premise of the non-ASCII shortcut: isprintable() true means nothing to escape
    escaped = [chr(c) for c in range(0x110000) if _ESCAPED[False].match(chr(c))]
    assert len(escaped) == 0x20 + 1 + 0x20 + 1 + 2 + 7 + 4 + 0x800 and not any(ch.isprintable() for ch in escaped)
    assert (CONTROL.pattern, _CONTROL_KEEP_LINES.pattern) == (_ESCAPED[False].pattern, _ESCAPED[True].pattern)


def test_needs_escape_takes_only_text():
    with pytest.raises(TypeError, match="needs_escape takes a str, not bytes"):
        needs_escape(b"abc")


@pytest.mark.parametrize(("text", "lines", "expected"), [
    ("model.layers.0.weight", False, False),
    ("a\tb", False, True), ("a\tb", True, False), ("a\nb", True, False), ("a\rb", True, True),
    ("a\x1b[31mb", True, True), ("a\x7fb", False, True), ("naïve", False, False), ("a\x9bb", False, True),
    ("a\u202eb", True, True), ("a\u2028b", True, True), ("名前", False, False), ("a\ud800", False, True),
    ("", False, False),
])
def test_needs_escape_examples(text, lines, expected):
    assert needs_escape(text, lines=lines) is expected
    assert (printable(text, lines=lines) != text) is expected


def test_table_pads_aligns_converts_and_escapes():
    rows = [("a", 1, "[2, 3]", "8 B"), ("long.name\x1b", "BF16", "[]", "1.0 kB")]
    assert table(("name", "dtype", "shape", "size"), rows, right=(3,)).splitlines() == [
        "name           dtype  shape     size",
        "a              1      [2, 3]     8 B",
        "long.name\\x1b  BF16   []      1.0 kB",
    ]
    assert table(("x", "y"), []) == "x  y"
    assert table(("x", "y"), [("é", "")]).splitlines() == ["x  y", "é"]  # (trailing padding stripped)
    assert table(("x",), iter([("a",), ("b",)])) == "x\na\nb"  # (rows of any iterable)
    import enum

    class Code(str, enum.Enum):
        F32 = "F32"

    assert table(("x",), [(Code.F32,)]) == f"x\n{Code.F32!s}"  # (a str subclass: as str() writes it)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.text(max_size=4), st.one_of(st.text(max_size=3), st.integers(-5, 5)),
                               st.text(alphabet="[]0123456789, ", max_size=6)), max_size=6),
       right=st.sets(st.integers(0, 2)))
def test_a_table_given_by_columns_is_the_table_of_its_rows(rows, right):
    columns = [[row[i] for row in rows] for i in range(3)]
    header = ("name", "dtype", "shape")
    cells = [header] + [tuple(printable(str(c)) for c in row) for row in rows]  # row by row, as written out by hand
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    expected = "\n".join("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in
                                    enumerate(zip(row, widths, strict=True))).rstrip() for row in cells)
    assert column_table(header, columns, right) == table(header, rows, right) == expected


def test_a_table_given_by_columns_needs_one_column_per_title_all_of_one_length():
    assert column_table(("x", "y"), [[], []]) == "x  y"
    assert column_table(("x", "y"), [["a", "bb"], ["1", "\x07"]]).splitlines() == ["x   y", "a   1", "bb  \\x07"]
    with pytest.raises(ValueError, match=r"^columns of one length needed, got lengths \[2, 1\]$"):
        column_table(("x", "y"), [["a", "b"], ["c"]])
    with pytest.raises(ValueError, match=r"^2 columns needed \(one per title\), got 1$"):
        column_table(("x", "y"), [["a"]])
    with pytest.raises(ValueError, match=r"^3 columns needed \(one per title\), got 2$"):
        table(("x", "y", "z"), [("a", "b")] * 5)


def _by_kind_reference(facts):
    totals = {}
    for _, stored_as, shape, nbytes in facts:
        row = totals.setdefault(stored_as, {"tensors": 0, "parameters": 0, "nbytes": 0})
        row["tensors"] += 1
        row["parameters"] += math.prod(shape)
        row["nbytes"] += nbytes
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1]["nbytes"], kv[0])))


@settings(max_examples=300, deadline=None)
@given(facts=st.lists(st.tuples(st.just("n"), st.sampled_from(["F32", "BF16", "Q4_K", "I8"]),
                                st.lists(st.integers(0, 2**40), max_size=3).map(tuple), st.integers(0, 2**62))))
def test_totals_by_kind_are_the_row_by_row_sums(facts):
    assert list(cli_inspect._by_kind(facts).items()) == list(_by_kind_reference(facts).items())


def test_totals_by_kind_of_many_kinds_are_summed_row_by_row():
    facts = [(f"t{i}", f"K{i % 40}", (i, 2), 8 * i) for i in range(200)]  # more kinds than the column-wise pass takes
    assert len({f[1] for f in facts}) > cli_inspect._FEW_KINDS
    assert list(cli_inspect._by_kind(facts).items()) == list(_by_kind_reference(facts).items())


@pytest.mark.parametrize("path", ["tiny-bert-sharded", "gguf/quantized.gguf"])
def test_facts_of_every_tensor_come_from_the_readers_in_checkpoint_order(path):
    with wio.open(FIXTURES / path) as ckpt:
        names = ckpt.select()
        every = cli_inspect._facts(ckpt, names)
        by_name = [(name, kind(view), view.shape, view.nbytes) for name, view in ((n, ckpt[n]) for n in names)]
        assert every == by_name and [f[0] for f in every] == list(ckpt)
        assert cli_inspect._facts(ckpt, names[1:]) == every[1:]  # a selection: looked up name by name
        kinds = {f[1] for f in every}
        assert (kinds == {"float32"}) if path.startswith("tiny") else ("Q4_0" in kinds)


@pytest.mark.parametrize("corrupt", [False, True])
def test_inspect_lists_without_automatic_collections_and_restores_the_thresholds(tmp_path, monkeypatch, corrupt):
    import gc

    from click.testing import CliRunner
    from weightio.cli import main

    path = tmp_path / "m.safetensors"
    path.write_bytes((FIXTURES / "numpy.safetensors").read_bytes()[: 100 if corrupt else None])
    seen = []
    real = cli_inspect.weightio.open

    def opening(*args, **kwargs):
        seen.append(gc.get_threshold()[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_inspect.weightio, "open", opening)
    before = gc.get_threshold()
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == (1 if corrupt else 0), result.output
    assert seen == [0] and gc.get_threshold() == before and before[0] > 0 and gc.isenabled()


def test_a_pause_of_the_readers_on_another_thread_cannot_leave_the_collector_off():
    # the readers' pause switches gc.disable()/enable(); the command's, the first threshold: neither
    # can undo the other, in whatever order they begin and end
    import gc

    from weightio._gc import collector_paused

    before = gc.get_threshold()
    pause = collector_paused()
    pause.__enter__()  # another thread opening a checkpoint
    with cli_inspect._no_automatic_collection():
        pause.__exit__(None, None, None)  # it ends first
        assert gc.isenabled() and gc.get_threshold()[0] == 0
    assert gc.isenabled() and gc.get_threshold() == before
