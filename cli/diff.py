"""``weightio diff A B``: are two checkpoints the same tensors, across formats?"""

from __future__ import annotations

import sys

import click

import weightio
from weightio.remote import is_url, redact
from weightio.stats import CheckpointDiff, TensorDiff, diff_checkpoints
from weightio.text import printable

from ._format import number, plural, shape_text, table
from ._options import common_options, echo, limit_options, open_options, remote_options, style, unknown_globals_option


def _shown(d: TensorDiff) -> str:
    if d.max_abs is None:
        return "stored bytes differ"
    return f"{number(d.max_abs)}"


def _report(a_path: str, b_path: str, a: weightio.Checkpoint, b: weightio.Checkpoint, result: CheckpointDiff
            ) -> None:
    echo(f"A: {a_path} ({a.format}, {plural(len(a), 'tensor')})")
    echo(f"B: {b_path} ({b.format}, {plural(len(b), 'tensor')})")
    renamed = result.renamed
    if renamed:
        echo(f"paired by alias or position ({len(renamed)}):")
        for x, y in renamed.items():
            echo(f"  = {printable(x)} ~ {printable(y)}")
    for title, names, mark, colour in (("only in A", result.only_a, "-", "red"),
                                       ("only in B", result.only_b, "+", "green")):
        if names:
            echo(f"{title} ({len(names)}):")
            for name in names:
                echo("  ", style(f"{mark} {printable(name)}", fg=colour))
    diffs = result.diffs
    changed = [d for d in diffs if d.type_changed]
    if changed:
        echo(f"changed dtype or shape ({len(changed)}):")
        for d in changed:
            echo("  ", style(f"~ {printable(d.name)}: {d.kinds[0]} {shape_text(d.shapes[0])} -> {d.kinds[1]} "
                             f"{shape_text(d.shapes[1])}", fg="yellow"), f"  ({_values(d)})")
    different = [d for d in diffs if d.compared and not d.equal]
    if different:
        echo(f"different values ({len(different)}):")
        rows = [(d.name, _shown(d), "-" if d.max_rel is None else number(d.max_rel), f"{d.mismatched:,} of {d.count:,}")
                for d in different]
        echo("\n".join("  " + line for line in table(("name", "max abs", "max rel", "differing"), rows,
                                                      right=(1, 2, 3)).splitlines()))
    equal = [d for d in diffs if result.same(d)]
    line = f"equal: {len(equal):,} of {len(diffs):,} tensors present in both"
    same_values = sum(d.equal for d in diffs)
    if same_values != len(equal):  # dtype changes that kept every value
        line += f"; equal values: {same_values:,} of {len(diffs):,}"
    echo(line)


def _values(d: TensorDiff) -> str:
    """What a dtype or shape change did to the values."""
    if not d.compared:
        return "values not compared: shapes differ"
    if d.equal:
        return "values equal"
    return "values differ: see below"


# The exit status of each verdict (docs/diff.md); errors exit 1 too, usage errors 2.
VERDICT_STATUS = {"equal": 0, "different": 1, "same values, dtypes differ": 3}


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Absolute tolerance: values within atol + rtol*|b| count as equal.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Relative tolerance.")
@click.option("--ignore-dtype", is_flag=True, help="Tensors of different dtypes are equal when their values are "
                                                   "(within the tolerances).")
@click.option("--filter", "patterns", multiple=True, metavar="GLOB", help="Only tensors matching GLOB (repeatable).")
@remote_options
@unknown_globals_option
@limit_options
@common_options
def diff_command(a: str, b: str, atol: float, rtol: float, ignore_dtype: bool, patterns: tuple[str, ...],
                 unknown_globals: str, storage_options: dict | None, download: bool) -> None:
    """Compare two checkpoints tensor by tensor, in any formats; exit 0 when equal, 1 when not,
    3 when every value is equal but some dtypes differ (unless --ignore-dtype: then 0).

    Lists names only in A or only in B, dtype or shape changes, and for tensors whose values
    differ the largest absolute and relative difference and how many elements differ. Names
    recorded as aliases of tied weights (as convert writes them) are compared with the tensor
    they alias, so a .bin and its converted .safetensors are equal. NaN equals NaN. A and B may
    be URLs (hf://, https://, s3:// …); --storage-option goes to the URLs that are not hf://,
    --download to the hf:// ones.

    \b
    Examples:
      weightio diff pytorch_model.bin model.safetensors
      weightio diff model.safetensors model-bf16.safetensors --ignore-dtype --rtol 1e-2
      weightio diff a.npz b.npz --filter 'encoder.*' -q && echo same
      weightio diff model.safetensors https://example.com/org/model/model.safetensors
    """
    options_a, options_b = open_options((a, b), storage_options, download)
    with (weightio.open(a, unknown_globals=unknown_globals, **options_a) as ca,
          weightio.open(b, unknown_globals=unknown_globals, **options_b) as cb):
        result = diff_checkpoints(ca, cb, atol=atol, rtol=rtol, patterns=patterns, ignore_dtype=ignore_dtype)
        name_a, name_b = (redact(p) if is_url(p) else p for p in (a, b))
        _report(name_a, name_b, ca, cb, result)
    verdict = result.verdict
    echo("result: ", style(verdict, fg="green" if verdict == "equal" else "yellow" if result.values_equal else "red"))
    sys.exit(VERDICT_STATUS[verdict])
