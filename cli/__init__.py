"""The ``weightio`` command: a thin click layer over the library.

Each command parses its arguments, calls the library and prints. Conventions:

* errors are one line on stderr, ``weightio: error: <file>: tensor '<name>': <problem>``; the
  exit status comes from one table, `EXIT_CODES`: 1 for data errors (a bad file, a missing
  tensor, a failed download), 2 for usage errors (a bad option or argument, caught by click or
  by the library: `weightio.UsageError`), 130 for Ctrl-C (leaving no partial output), 141 when
  the reader of the output went away;
* ``--debug`` shows the traceback instead; ``--quiet`` prints only the answer;
* ``diff`` exits 0 when equal, 1 when different and 3 when only dtypes differ (every value
  equal); ``scan`` 0 when safe and 1 when not;
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

from weightio import UsageError, WeightioError
from weightio.text import printable

from ._options import apply_environment, common_options, echo, settings, style
from .convert import convert_command
from .diff import diff_command
from .download import download_command
from .inspect import inspect_command
from .scan import scan_command
from .show import show_command

__all__ = ["EXIT_CODES", "exit_code", "main"]

EXIT_DATA, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141

# The exit status of every failure a command reports; the first matching class wins, so a
# subclass comes before its base. Exceptions not listed (SystemExit, bugs) pass through.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (BrokenPipeError, EXIT_BROKEN_PIPE),  # an OSError: before OSError
    (UsageError, EXIT_USAGE),  # a WeightioError: before WeightioError
    (click.UsageError, EXIT_USAGE),  # bad options and arguments, as click reports them
    (click.ClickException, EXIT_DATA),
    (WeightioError, EXIT_DATA),
    (OSError, EXIT_DATA),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
)


def exit_code(error: BaseException) -> int | None:
    """The exit status `EXIT_CODES` gives `error`, or None when it is not a reported failure."""
    return next((code for kind, code in EXIT_CODES if isinstance(error, kind)), None)


def _fail(message: str, code: int) -> None:
    echo(style("weightio: error:", fg="red", bold=True), " " + message, essential=True, err=True)
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
    """Reports every failure in `EXIT_CODES` in one line (click's own usage message for its
    errors) and exits with the table's status; ``--debug`` shows the traceback instead."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BaseException as e:
            code = exit_code(e)
            if code is None or (settings().get("debug") and not isinstance(e, (click.ClickException, BrokenPipeError))):
                raise
            _report(e, code)


def _report(error: BaseException, code: int) -> None:
    if isinstance(error, BrokenPipeError):
        _quiet_broken_pipe()
    if isinstance(error, click.ClickException):
        # it may quote an argument: a file name, a tensor name (click's stubs call the attribute final; it is
        # rewritten once, before the error is shown)
        error.message = printable(error.message, lines=True)  # type: ignore[misc]
        error.show()
        sys.exit(code)
    if isinstance(error, KeyboardInterrupt):
        click.echo("\nweightio: interrupted", err=True)  # convert leaves no partial output behind
        sys.exit(code)
    text = error.render(cli=True) if isinstance(error, WeightioError) else str(error)  # the advice in CLI words
    _fail(text or type(error).__name__, code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="weightio", prog_name="weightio")  # the installed distribution's metadata
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
