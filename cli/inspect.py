"""``weightio inspect PATH``: what is in a checkpoint, from its headers alone."""

from __future__ import annotations

import click

import weightio
from weightio.dtypes import dtype_name

from ._format import human_bytes, human_count, table

_MAX_METADATA_VALUE = 80


def _elide(value: object) -> str:
    text = str(value)
    return text if len(text) <= _MAX_METADATA_VALUE else text[: _MAX_METADATA_VALUE - 1] + "…"


@click.command("inspect")
@click.argument("path", type=click.Path(exists=False))
def inspect_command(path: str) -> None:
    """Show format, tensor and parameter counts, metadata and a name/dtype/shape/size table.

    Reads headers only, so it is fast on files of any size.

    \b
    Examples:
      weightio inspect model.safetensors
      weightio inspect weights.npz
      weightio inspect path/to/hf-model-dir/      # sharded index or single file
    """
    with weightio.open(path) as ckpt:
        click.echo(path)
        click.echo(f"  format      {ckpt.format}")
        if len(ckpt.files) > 1:
            click.echo(f"  files       {len(ckpt.files)}")
        click.echo(f"  tensors     {len(ckpt):,}")
        click.echo(f"  parameters  {human_count(ckpt.parameter_count)}")
        click.echo(f"  size        {human_bytes(ckpt.nbytes)}")
        for key, value in ckpt.metadata.items():
            click.echo(f"  metadata    {key} = {_elide(value)}")
        rows = []
        for name in ckpt:
            info = ckpt[name].info
            kind = info.ggml_type or dtype_name(info.dtype)
            rows.append((name, kind, "[" + ", ".join(map(str, info.shape)) + "]", human_bytes(info.nbytes)))
        if rows:
            click.echo()
            click.echo(table(("name", "dtype", "shape", "size"), rows, right=(3,)))
