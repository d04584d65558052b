"""The ``weightio`` command: a thin click layer over the library.

Each command parses its arguments, calls one library function and prints. Library errors
(`weightio.WeightioError`) become one line on stderr and exit code 1; usage errors exit 2;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from weightio import WeightioError, __version__

from .inspect import inspect_command

__all__ = ["main"]


class _Group(click.Group):
    """Turns library errors into one-line messages with exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (WeightioError, OSError) as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"weightio: error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="weightio")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Inspect and convert model checkpoints of every common format, without torch.

    \b
    Examples:
      weightio inspect model.safetensors
      weightio inspect path/to/hf-model-dir/
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


main.add_command(inspect_command)
