"""``weightio show PATH NAME``: one tensor's type, shape, statistics and first values."""

from __future__ import annotations

import math

import click
import numpy as np

import weightio
from weightio.dtypes import dtype_name, is_number
from weightio.remote import is_url, redact, traffic
from weightio.stats import first_values, is_packed, tensor_stats
from weightio.text import printable

from ._format import human_bytes, kind, number, plural, shape_text
from ._options import common_options, echo, limit_options, remote_options, unknown_globals_option


def _values_line(values: np.ndarray, total: int) -> str:
    shown = ", ".join(_value(v) for v in values.tolist())
    more = f"  (first {len(values)} of {total:,})" if len(values) < total else ""
    return f"[{shown}]{more}"


def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, complex):
        return f"{v.real:.6g}{v.imag:+.6g}j"
    if isinstance(v, str):  # as bytes show: quoted, a newline or escape in the data cannot fake output lines
        return repr(v)
    return str(v)


@click.command("show")
@click.argument("path")
@click.argument("name")
@click.option("-n", "--count", type=click.IntRange(min=0), default=8, show_default=True,
              help="How many leading values to print.")
@remote_options
@unknown_globals_option
@limit_options
@common_options
def show_command(path: str, name: str, count: int, unknown_globals: str, storage_options: dict | None,
                 download: bool) -> None:
    """Show one tensor: dtype, shape, size, min/max/mean/std, NaN/Inf counts and its first values.

    Statistics cover every element (floats: min/max/mean/std of the finite values); the tensor
    is read in slices, so memory stays small whatever its size. Quantized GGUF tensors are
    dequantized slice by slice. An unknown NAME suggests close names. PATH may be a URL
    (hf://, https://, s3:// …): only the tensor's bytes are fetched, and the requests and bytes
    it took are shown.

    \b
    Examples:
      weightio show model.safetensors embeddings.word_embeddings.weight
      weightio show model.gguf blk.0.attn_q.weight -n 16
      weightio show hf://org/model lm_head.weight
      weightio show https://example.com/model.safetensors lm_head.weight
    """
    shown = redact(path) if is_url(path) else path
    with weightio.open(path, unknown_globals=unknown_globals, storage_options=storage_options,
                       download=download) as ckpt:
        _show(shown, ckpt, name, count)
        requests, nbytes = traffic(ckpt)
        if requests:  # a URL read by range (not one mapped from the Hugging Face cache)
            echo(f"  fetched   {plural(requests, 'request')}, {human_bytes(nbytes)} (headers and values)")


def _show(path: str, ckpt: weightio.Checkpoint, name: str, count: int) -> None:
    """Print tensor `name`: type, shape, size, statistics and first values."""
    view = ckpt[name]
    lines = [f"{path}: {printable(name)}", f"  dtype     {kind(view)}"]
    if view.ggml_type is not None:
        lines[-1] += f" (block-quantized; values dequantized to {dtype_name(view.dtype)})"
    size = math.prod(view.shape)
    lines += [f"  shape     {shape_text(view.shape)}",
              f"  size      {human_bytes(view.nbytes)} ({plural(size, 'value')})"]
    if is_packed(view):
        raw = view.raw()
        lines.append(f"  bytes     {raw[:16].tobytes().hex(' ')}{' …' if raw.size > 16 else ''}  "
                     "(packed sub-byte type: numpy cannot show its values)")
        echo("\n".join(lines), essential=True)
        return
    if not is_number(view.dtype):  # bytes, str, datetime, records (.npy/.npz): values, no statistics
        lines.append("  (not numbers: no statistics)")
        if count and size:
            lines.append(f"  values    {_values_line(first_values(view, count), size)}")
        echo("\n".join(lines), essential=True)
        return
    stats = tensor_stats(view)
    label = "|x| " if stats.magnitude else ""
    for key, value in (("min", stats.minimum), ("max", stats.maximum), ("mean", stats.mean), ("std", stats.std)):
        lines.append(f"  {(label + key):<8}  {'-' if value is None else number(value)}")
    if view.dtype.kind not in "biu":
        lines += [f"  nan       {stats.nan:,}", f"  inf       {stats.inf:,}"]
    if count and size:
        lines.append(f"  values    {_values_line(first_values(view, count), size)}")
    echo("\n".join(lines), essential=True)
