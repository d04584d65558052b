"""``weightio diff A B``: are two checkpoints the same tensors, across formats?"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import click

import weightio
from weightio.checkpoint import Checkpoint

from ._format import number, plural, shape_text, table
from ._options import common_options, echo, limit_options, style
from ._stats import TensorDiff, compare


def aliases(ckpt: Checkpoint) -> dict[str, str]:
    """``alias -> stored name`` recorded in metadata for tied weights written once (safetensors'
    convention: ``metadata[removed] = kept``)."""
    return {k: v for k, v in ckpt.metadata.items() if isinstance(v, str) and k not in ckpt and v in ckpt}


def pair_names(a: Checkpoint, b: Checkpoint, names_a: list[str], names_b: list[str]
               ) -> tuple[dict[str, str], list[str], list[str]]:
    """``{name in A: name in B}`` for tensors both hold (through aliases too), and the names only
    in A and only in B. Two single-tensor files (``w.npy`` vs ``w2.npy``) are paired by position."""
    if len(names_a) == 1 and len(names_b) == 1:
        return {names_a[0]: names_b[0]}, [], []
    in_b, alias_b, alias_a = set(names_b), aliases(b), aliases(a)
    pairs: dict[str, str] = {}
    for name in names_a:
        if name in in_b:
            pairs[name] = name
        elif name in alias_b:
            pairs[name] = alias_b[name]
    covered = set(pairs.values())
    for name in names_b:
        if name not in covered and name in alias_a:
            pairs[alias_a[name]] = name
            covered.add(name)
    only_a = [n for n in names_a if n not in pairs]
    only_b = [n for n in names_b if n not in covered]  # every paired name of B is in covered
    return pairs, only_a, only_b


def _shown(d: TensorDiff) -> str:
    if d.max_abs is None:
        return "stored bytes differ"
    return f"{number(d.max_abs)}"


def _report(a_path: str, b_path: str, a: Checkpoint, b: Checkpoint, pairs: Mapping[str, str], only_a: list[str],
            only_b: list[str], diffs: list[TensorDiff], ignore_dtype: bool) -> None:
    echo(f"A: {a_path} ({a.format}, {plural(len(a), 'tensor')})")
    echo(f"B: {b_path} ({b.format}, {plural(len(b), 'tensor')})")
    renamed = {x: y for x, y in pairs.items() if x != y}
    if renamed:
        echo(f"paired by alias or position ({len(renamed)}):")
        for x, y in renamed.items():
            echo(f"  = {x} ~ {y}")
    for title, names, mark, colour in (("only in A", only_a, "-", "red"), ("only in B", only_b, "+", "green")):
        if names:
            echo(f"{title} ({len(names)}):")
            for name in names:
                echo("  " + style(f"{mark} {name}", fg=colour))
    changed = [d for d in diffs if d.type_changed]
    if changed:
        echo(f"changed dtype or shape ({len(changed)}):")
        for d in changed:
            echo("  " + style(f"~ {d.name}: {d.kinds[0]} {shape_text(d.shapes[0])} -> {d.kinds[1]} "
                              f"{shape_text(d.shapes[1])}", fg="yellow"))
    different = [d for d in diffs if d.compared and not d.equal]
    if different:
        echo(f"different values ({len(different)}):")
        rows = [(d.name, _shown(d), "-" if d.max_rel is None else number(d.max_rel), f"{d.mismatched:,} of {d.count:,}")
                for d in different]
        echo("\n".join("  " + line for line in table(("name", "max abs", "max rel", "differing"), rows,
                                                      right=(1, 2, 3)).splitlines()))
    equal = [d for d in diffs if d.equal and (ignore_dtype or not d.type_changed)]
    echo(f"equal: {len(equal):,} of {len(diffs):,} tensors present in both")


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Absolute tolerance: values within atol + rtol*|b| count as equal.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Relative tolerance.")
@click.option("--ignore-dtype", is_flag=True, help="Tensors of different dtypes are equal when their values are "
                                                   "(within the tolerances).")
@click.option("--filter", "patterns", multiple=True, metavar="GLOB", help="Only tensors matching GLOB (repeatable).")
@limit_options
@common_options
def diff_command(a: str, b: str, atol: float, rtol: float, ignore_dtype: bool, patterns: tuple[str, ...]) -> None:
    """Compare two checkpoints tensor by tensor, in any formats; exit 0 when equal, 1 when not.

    Lists names only in A or only in B, dtype or shape changes, and for tensors whose values
    differ the largest absolute and relative difference and how many elements differ. Names
    recorded as aliases of tied weights (as convert writes them) are compared with the tensor
    they alias, so a .bin and its converted .safetensors are equal. NaN equals NaN.

    \b
    Examples:
      weightio diff pytorch_model.bin model.safetensors
      weightio diff model.safetensors model-bf16.safetensors --ignore-dtype --rtol 1e-2
      weightio diff a.npz b.npz --filter 'encoder.*' -q && echo same
    """
    with weightio.open(a) as ca, weightio.open(b) as cb:
        names_a, names_b = ca.select(*patterns), cb.select(*patterns)
        pairs, only_a, only_b = pair_names(ca, cb, names_a, names_b)
        diffs = [compare(x, ca[x], cb[y], atol, rtol) for x, y in pairs.items()]
        _report(a, b, ca, cb, pairs, only_a, only_b, diffs, ignore_dtype)
    same = not only_a and not only_b and all(d.equal and (ignore_dtype or not d.type_changed) for d in diffs)
    echo("result: " + (style("equal", fg="green") if same else style("different", fg="red")))
    sys.exit(0 if same else 1)
