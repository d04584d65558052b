"""``weightio inspect PATH``: what is in a checkpoint, from its headers alone."""

from __future__ import annotations

import contextlib
import gc
import math
import shlex
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from operator import eq, itemgetter
from typing import Any

import click

import weightio
from weightio import Checkpoint
from weightio.formats import PLACEHOLDERS_KEY
from weightio.remote import is_url, redact, traffic
from weightio.text import printable

from . import _tree
from ._format import (
    column_table,
    elide,
    human_bytes,
    human_count,
    json_text,
    json_value,
    kind_of,
    plural,
    shape_text,
    table,
)
from ._options import common_options, echo, limit_options, remote_options, unknown_globals_option
from ._suggest import filter_hints

SCHEMA = "weightio.inspect/1"


Fact = tuple[str, str, tuple[int, ...], int]  # (name, kind, shape, nbytes) of one tensor


@contextlib.contextmanager
def _no_automatic_collection() -> Iterator[None]:
    """No automatic run of Python's cyclic collector in the block: the listing's objects all live
    until the command ends and none is in a cycle, so it would only traverse them again and again
    (~100 ms of DeepSeek-V3's 92k tensors). Done by the first threshold (0: never), which the
    readers' own pauses (``gc.disable()``/``enable()``, on any thread) leave alone, and restored after."""
    thresholds = gc.get_threshold()
    gc.set_threshold(0, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _facts(ckpt: Checkpoint, names: Sequence[str]) -> list[Fact]:
    """What every listing, total and table below needs of each tensor, gathered once (`names` are
    in file order: `select`'s). All of them: straight from the readers' indexes, whose tensors, in
    order, are the checkpoint's (no view made per tensor: a third of this on 92k tensors)."""
    if len(names) == len(ckpt):
        infos: Any = ((name, info) for reader in ckpt.readers for name, info in reader.tensors.items())
    else:
        infos = ((name, ckpt[name].info) for name in names)
    out = [(name, info.ggml_type or kind_of(info.dtype), info.shape, info.nbytes) for name, info in infos]
    if len(out) != len(names):  # (cannot be: a checkpoint's tensors are its readers')
        raise AssertionError(f"{len(out)} tensors listed, {len(names)} expected")
    return out


def _by_kind(facts: Sequence[Fact]) -> dict[str, dict[str, int]]:
    """Per dtype (or ggml block type): tensors, parameters and bytes, largest share first.

    Summed column by column in C, one pass per kind (a model has a few); many kinds (a file of
    record dtypes) are summed row by row instead, so the cost stays linear."""
    kinds = list(map(itemgetter(1), facts))
    params = list(map(math.prod, map(itemgetter(2), facts)))
    sizes = list(map(itemgetter(3), facts))
    distinct = dict.fromkeys(kinds)
    totals: dict[str, dict[str, int]] = {}
    if len(distinct) <= _FEW_KINDS:
        for stored_as in distinct:
            mine = list(map(eq, kinds, repeat(stored_as)))
            totals[stored_as] = {"tensors": kinds.count(stored_as), "parameters": sum(compress(params, mine)),
                                 "nbytes": sum(compress(sizes, mine))}
    else:
        for stored_as, n, nbytes in zip(kinds, params, sizes, strict=True):
            row = totals.get(stored_as)
            if row is None:
                row = totals[stored_as] = {"tensors": 0, "parameters": 0, "nbytes": 0}
            row["tensors"] += 1
            row["parameters"] += n
            row["nbytes"] += nbytes
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1]["nbytes"], kv[0])))


_FEW_KINDS = 16


def _summary_lines(path: str, ckpt: Checkpoint, names: list[str], patterns: Sequence[str],
                   facts: list[Fact]) -> list[str]:
    lines = [path, f"  format      {ckpt.format}"]
    if len(ckpt.files) > 1:
        lines.append(f"  files       {len(ckpt.files)}")
    requests, nbytes = traffic(ckpt)
    if requests:  # a URL read by range (not one mapped from the Hugging Face cache)
        lines.append(f"  fetched     {plural(requests, 'request')}, {human_bytes(nbytes)}")
    if patterns:
        lines.append(f"  filter      {printable(' '.join(patterns))}  ({len(names):,} of {len(ckpt):,} tensors)")
        hints = filter_hints(list(ckpt), patterns) if not names and len(ckpt) else []
        if hints:
            tries = " or ".join(f"--filter {shlex.quote(h)}" for h in hints)
            lines.append(f"  hint        no tensor name matches; try {printable(tries)}")
    kinds = _by_kind(facts)
    params = sum(v["parameters"] for v in kinds.values())
    lines += [f"  tensors     {len(names):,}", f"  parameters  {human_count(params)}",
              f"  size        {human_bytes(sum(v['nbytes'] for v in kinds.values()))}"]
    if kinds:
        rows = [(k, plural(v["tensors"], "tensor"), plural(v["parameters"], "param"), human_bytes(v["nbytes"]))
                for k, v in kinds.items()]
        for i, line in enumerate(table(("",) * 4, rows, right=(1, 2, 3)).splitlines()[1:]):
            lines.append(("  dtypes      " if i == 0 else " " * 14) + line)
    replaced = _placeholders(ckpt)
    if replaced:
        lines.append(f"  replaced    {plural(len(replaced), 'global')} by placeholders (never imported or run): "
                     f"{elide(', '.join(map(str, replaced)))}")
    float32 = _float32_keys(ckpt)
    for key, value in ckpt.metadata.items():
        if key != PLACEHOLDERS_KEY:
            lines.append(f"  metadata    {printable(str(key))} = {elide(value, float32=key in float32)}")
    return lines


def _float32_keys(ckpt: Checkpoint) -> set[str]:
    """The metadata keys a GGUF file stores as FLOAT32 (its reader's ``value_types``)."""
    return {key for reader in ckpt.readers for key, vtype in getattr(reader, "value_types", {}).items()
            if vtype == "FLOAT32"}


def _placeholders(ckpt: Checkpoint) -> list:
    """The globals `--unknown-globals placeholder` replaced, as the reader listed them."""
    replaced = ckpt.metadata.get(PLACEHOLDERS_KEY)
    return replaced if isinstance(replaced, list) else []


def _tensor_table(facts: list[Fact]) -> str:
    # a model repeats a few shapes and sizes many times: each written once, the columns mapped in C
    shapes, sizes = list(map(itemgetter(2), facts)), list(map(itemgetter(3), facts))
    shape_texts = {shape: shape_text(shape) for shape in set(shapes)}
    size_texts = {nbytes: human_bytes(nbytes) for nbytes in set(sizes)}
    columns = [list(map(itemgetter(0), facts)), list(map(itemgetter(1), facts)),
               list(map(shape_texts.__getitem__, shapes)), list(map(size_texts.__getitem__, sizes))]
    return column_table(("name", "dtype", "shape", "size"), columns, right=(3,))


def _tree_table(nodes: list[_tree.Node], depth: int | None) -> str:
    rows = []
    for label, node in _tree.rows(nodes, depth):
        count = f"{node.repeat} × {node.parameters:,}" if node.repeat > 1 else f"{node.parameters:,}"
        dtype, shape = (node.tensor[0], shape_text(node.tensor[1])) if node.tensor else ("", "")
        rows.append((label, count, dtype, shape))
    return table(("module", "params", "dtype", "shape"), rows, right=(1,))


def _entries(facts: list[Fact]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(name, dtype, shape) for name, dtype, shape, _ in facts]


def inspect_json(path: str, ckpt: Checkpoint, names: list[str], patterns: Sequence[str], tree: bool,
                 depth: int | None) -> dict[str, Any]:
    """The ``--json`` document (schema ``weightio.inspect/1``, documented in docs/inspect.md)."""
    facts = _facts(ckpt, names)
    kinds = _by_kind(facts)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "path": path,
        "format": ckpt.format,
        "files": ckpt.files,
        "fetched": None,  # set last: what everything above cost
        "filter": list(patterns) or None,
        "filter_hints": filter_hints(list(ckpt), patterns) if patterns and not names else [],
        "tensor_count": len(names),
        "parameter_count": sum(v["parameters"] for v in kinds.values()),
        "nbytes": sum(v["nbytes"] for v in kinds.values()),
        "dtypes": [{"dtype": k, **v} for k, v in kinds.items()],
        "metadata": json_value(dict(ckpt.metadata)),
        "placeholders": json_value(_placeholders(ckpt)),
        "tensors": [_tensor_json(ckpt, n) for n in names],
    }
    if tree:
        doc["tree"] = _tree.to_json(_tree.build(_entries(facts)), depth)
    doc["fetched"] = fetched_json(ckpt)
    return doc


def fetched_json(ckpt: Checkpoint) -> dict[str, int]:
    """``{"requests", "bytes"}`` the checkpoint's remote files fetched by range so far (0 and 0 for local files)."""
    requests, nbytes = traffic(ckpt)
    return {"requests": requests, "bytes": nbytes}


def _tensor_json(ckpt: Checkpoint, name: str) -> dict[str, Any]:
    from weightio.dtypes import dtype_name

    view = ckpt[name]
    return {"name": name, "dtype": dtype_name(view.dtype), "ggml_type": view.ggml_type, "shape": list(view.shape),
            "parameters": math.prod(view.shape), "nbytes": view.nbytes, "file": view.path}


@click.command("inspect")
@click.argument("path")
@click.option("--tree", is_flag=True, help="Group tensors into modules by dotted prefix, with parameter counts; "
                                           "repeated layers are collapsed (layer.{0..11}).")
@click.option("--depth", type=click.IntRange(min=1), default=None,
              help="Show the --tree this many levels deep (implies --tree).")
@click.option("--filter", "patterns", multiple=True, metavar="GLOB",
              help="Only tensors whose names match GLOB (repeatable; e.g. 'encoder.*').")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema weightio.inspect/1).")
@remote_options
@unknown_globals_option
@limit_options
@common_options
def inspect_command(path: str, tree: bool, depth: int | None, patterns: tuple[str, ...], as_json: bool,
                    unknown_globals: str, storage_options: dict[str, Any] | None, download: bool) -> None:
    """Show format, tensor and parameter counts, bytes per dtype, metadata, and every tensor.

    Reads headers only, so it takes milliseconds on files of any size. PATH is a file of any
    format weightio reads, a model directory, or a URL: hf://org/model, https://…, s3://… (any
    fsspec filesystem installed), read by byte ranges; the summary (and --json's "fetched") says
    how many requests and bytes that took.

    \b
    Examples:
      weightio inspect model.safetensors
      weightio inspect path/to/hf-model-dir/         # sharded index or single file
      weightio inspect model.gguf --tree --depth 2
      weightio inspect pytorch_model.bin --filter 'encoder.layer.0.*'
      weightio inspect hf://google-bert/bert-base-uncased --json | jq .parameter_count
      weightio inspect s3://bucket/model/ --storage-option anon=true
      weightio inspect whole_model.pt --unknown-globals placeholder   # torch.save(model)
    """
    tree = tree or depth is not None  # a depth is only ever a depth of the tree: asking for one asks for it
    shown = redact(path) if is_url(path) else path
    with _no_automatic_collection(), weightio.open(path, unknown_globals=unknown_globals,
                                                   storage_options=storage_options, download=download) as ckpt:
        names = ckpt.select(*patterns)
        if as_json:
            doc = inspect_json(shown, ckpt, names, patterns, tree, depth)
            echo(json_text(doc), essential=True)
            return
        facts = _facts(ckpt, names)
        echo("\n".join(_summary_lines(shown, ckpt, names, patterns, facts)), essential=True)
        if names:
            echo("", essential=True)
            body = _tree_table(_tree.build(_entries(facts)), depth) if tree else _tensor_table(facts)
            echo(body, essential=True)
