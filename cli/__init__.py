"""The ``weightio`` command: a thin click layer over the library.

Each command parses its arguments, calls the library and prints. Conventions:

* errors are one line on stderr, ``weightio: error: <file>: tensor '<name>': <problem>``, with
  exit status 1 (data: a bad file, a missing tensor, a failed download); usage errors (a bad
  option or argument) exit 2; Ctrl-C exits 130 leaving no partial output;
* ``--debug`` shows the traceback instead; ``--quiet`` prints only the answer;
* ``diff`` exits 0 when equal and 1 when different, ``scan`` 0 when safe and 1 when not;
* colour only on a terminal, never with ``NO_COLOR`` set;
* `faulthandler` is on: a checkpoint truncated by another process while one of its arrays is
  in use makes the process die of SIGBUS (no mmap-based reader can prevent that), and then it
  at least prints "Fatal Python error: Bus error" and where, instead of dying silently.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from typing import Any

import click

from weightio import WeightioError, __version__

from ._options import apply_environment, common_options, echo, settings, style
from .convert import convert_command
from .diff import diff_command
from .download import download_command
from .inspect import inspect_command
from .scan import scan_command
from .show import show_command

__all__ = ["main"]

EXIT_DATA, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141


def _fail(message: str, code: int) -> None:
    echo(style("weightio: error:", fg="red", bold=True) + " " + message, essential=True, err=True)
    sys.exit(code)


def _enable_faulthandler() -> None:
    """Print a traceback on SIGBUS/SIGSEGV (see the module docstring); keep a handler already set."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.__stderr__ or sys.stderr)
    except (AttributeError, ValueError, OSError):  # no real stderr (embedded, or a test runner's stream)
        pass


def _quiet_broken_pipe() -> None:
    """The reader of our output went away (``weightio inspect … | head``): stop silently with the
    status a shell gives a process killed by SIGPIPE, as other command-line tools do."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python would report the error again while flushing at exit
    except (OSError, ValueError):  # stdout is not a real file (tests)
        pass
    sys.exit(EXIT_BROKEN_PIPE)


class _Group(click.Group):
    """Turns library errors into one-line messages with exit status 1, Ctrl-C into 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except (WeightioError, OSError) as e:
            if settings().get("debug"):
                raise
            _fail(str(e) or type(e).__name__, EXIT_DATA)
        except KeyboardInterrupt:
            if settings().get("debug"):
                raise
            click.echo("\nweightio: interrupted", err=True)  # convert leaves no partial output behind
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="weightio")
@common_options
@click.pass_context
def main(ctx: click.Context) -> None:
    """Inspect, convert, compare and check model checkpoints of every common format, without torch.

    Formats: safetensors, PyTorch (.bin/.pt/.pth, read without running code), GGUF and legacy
    ggml, numpy .npz/.npy; files, Hugging Face model directories, and hf://org/repo paths.

    \b
    Examples:
      weightio inspect model.safetensors
      weightio inspect hf://google-bert/bert-base-uncased --tree
      weightio convert pytorch_model.bin model.safetensors --verify
      weightio scan pytorch_model.bin
      weightio diff pytorch_model.bin model.safetensors
      weightio show model.safetensors encoder.layer.0.output.dense.weight
      weightio download google-bert/bert-base-uncased
    """
    apply_environment(ctx)
    _enable_faulthandler()


for _command in (inspect_command, convert_command, scan_command, diff_command, show_command, download_command):
    main.add_command(_command)
