"""The command line's text: what `printable` escapes, the tables, and inspect's totals (fast paths
against their definitions)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from weightio.cli import inspect as cli_inspect
from weightio.cli._format import table

import weightio as wio
from weightio.text import CONTROL, needs_escape, printable

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
    assert (printable(text, lines=lines) != text) is needs_escape(text, lines=lines)


@pytest.mark.parametrize(("text", "lines", "expected"), [
    ("model.layers.0.weight", False, False),
    ("a\tb", False, True), ("a\tb", True, False), ("a\nb", True, False), ("a\rb", True, True),
    ("a\x1b[31mb", True, True), ("a\x7fb", False, True), ("naïve", False, False), ("a\x9bb", False, True),
    ("a\u202eb", True, True), ("a\u2028b", True, True), ("名前", False, False), ("a\ud800", False, True),
    ("", False, False),
])
def test_needs_escape_examples(text, lines, expected):
    assert needs_escape(text, lines=lines) is expected
    assert CONTROL.pattern == _ESCAPED[False].pattern  # (the definition above is weightio's)


def test_table_pads_aligns_converts_and_escapes():
    rows = [("a", 1, "[2, 3]", "8 B"), ("long.name\x1b", "BF16", "[]", "1.0 kB")]
    assert table(("name", "dtype", "shape", "size"), rows, right=(3,)).splitlines() == [
        "name           dtype  shape     size",
        "a              1      [2, 3]     8 B",
        "long.name\\x1b  BF16   []      1.0 kB",
    ]
    assert table(("x", "y"), []) == "x  y"
    assert table(("x", "y"), [("é", "")]).splitlines() == ["x  y", "é"]  # (trailing padding stripped)


def _by_kind_reference(facts):
    totals = {}
    for _, kind, shape, nbytes in facts:
        row = totals.setdefault(kind, {"tensors": 0, "parameters": 0, "nbytes": 0})
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
        by_name = [(name, view.ggml_type or cli_inspect.kind_of(view.info.dtype), view.info.shape, view.info.nbytes)
                   for name, view in ((n, ckpt[n]) for n in names)]
        assert every == by_name and [f[0] for f in every] == list(ckpt)
        assert cli_inspect._facts(ckpt, names[1:]) == every[1:]  # a selection: looked up name by name
        kinds = {f[1] for f in every}
        assert kinds == {"float32"} if path.startswith("tiny") else "Q4_0" in kinds


def test_inspect_leaves_the_collector_as_it_found_it():
    import gc

    assert gc.isenabled()
    with cli_inspect._collector_off():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with cli_inspect._collector_off():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
