"""Conventions shared by every command: --quiet, --debug, colour, output helpers.

``--quiet`` and ``--debug`` are accepted before the command (``weightio -q convert …``) and
after it (``weightio convert … -q``). Colour is used only on a terminal and never when
``NO_COLOR`` is set (https://no-color.org). Commands that open checkpoints also take
``--max-header-bytes`` (`limit_options`), which applies `weightio.limits` to every file they open,
and ``--unknown-globals`` (`unknown_globals_option`), passed to `weightio.open`; those that read
URLs take ``--storage-option KEY=VALUE`` and ``--download`` (`remote_options`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from weightio.formats import UNKNOWN_GLOBALS
from weightio.text import printable

__all__ = ["common_options", "limit_options", "unknown_globals_option", "remote_options", "open_options", "settings",
           "quiet", "echo", "style", "Styled", "progress_bar", "apply_environment"]

F = TypeVar("F", bound=Callable[..., Any])


def settings() -> dict[str, Any]:
    """The options of this invocation (``quiet``, ``debug``), shared by the group and the command."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    root = ctx.find_root()
    if root.obj is None:
        root.obj = {}
    return root.obj


def quiet() -> bool:
    return bool(settings().get("quiet"))


def _remember(key: str) -> Callable[[click.Context, click.Parameter, bool], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            settings()[key] = True

    return callback


def common_options(f: F) -> F:
    """Add ``-q/--quiet`` and ``--debug`` to a command."""
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_remember("quiet"),
                     help="No progress bars, notes or summaries (diff, scan: exit status only).")(f)
    f = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_remember("debug"),
                     help="Show the full traceback of an error.")(f)
    return f


def _parse_header_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    from weightio.limits import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def limit_options(f: F) -> F:
    """Add ``--max-header-bytes`` to a command that opens checkpoints: every file the command
    opens is read under ``weightio.limits.using(header_bytes=SIZE)``, for as long as it runs."""

    @functools.wraps(f)
    def command(*args: Any, max_header_bytes: int | None = None, **kwargs: Any) -> Any:
        if max_header_bytes is None:
            return f(*args, **kwargs)
        from weightio import limits

        with limits.using(header_bytes=max_header_bytes):
            return f(*args, **kwargs)

    return click.option(
        "--max-header-bytes", metavar="SIZE", callback=_parse_header_limit,
        help="Refuse files whose header (safetensors JSON, GGUF key/values and tensor infos, ggml vocabulary, "
             ".npy dict) is larger than SIZE (e.g. 1MB; default 100MB, or WEIGHTIO_MAX_HEADER_BYTES). "
             "Other limits: WEIGHTIO_MAX_* environment variables (docs/security.md).")(command)  # type: ignore[return-value]


def unknown_globals_option(f: F) -> F:
    """Add ``--unknown-globals refuse|placeholder`` (passed to the command as ``unknown_globals``):
    what a pickle's global outside the allowlist becomes (`weightio.open`'s ``unknown_globals=``)."""
    return click.option(
        "--unknown-globals", "unknown_globals", type=click.Choice(UNKNOWN_GLOBALS), default="refuse",
        show_default=True,
        help="What a pickle's global outside the allowlist does: 'refuse' the file, or become an inert "
             "'placeholder' (never imported or run) so that its tensors can be read, a whole torch.save(model) "
             "included. The replaced globals are listed; scan still reports such a file unsafe.")(f)


def _parse_storage_options(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
                           ) -> dict[str, Any] | None:
    """``KEY=VALUE`` pairs as a dict, each VALUE parsed as JSON when it parses (true, 3, {"a": 1}),
    else kept as a string. Messages name keys only: a value may be a secret."""
    if not values:
        return None
    options: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter("expects KEY=VALUE (e.g. anon=true or "
                                     "client_kwargs='{\"endpoint_url\": \"http://…\"}')")
        if key in options:
            raise click.BadParameter(f"{printable(repr(key))} is given twice")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def remote_options(f: F) -> F:
    """Add ``--storage-option KEY=VALUE`` (repeatable; passed as ``storage_options``, a dict or
    None) and ``--download`` (passed as ``download``): how `weightio.open` reads a URL."""
    f = click.option("--download", is_flag=True,
                     help="hf:// only: download the weight files whole into the Hugging Face cache, with the "
                          "repo's config and tokenizer files (transformers then loads it offline), instead of "
                          "reading them by range.")(f)
    return click.option(
        "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE", callback=_parse_storage_options,
        help="An option of the URL's fsspec filesystem (s3://, https:// …), repeatable; VALUE is read as JSON when "
             "it is JSON (true, 3, {...}), else as text. E.g. --storage-option anon=true. Never printed.")(f)


def open_options(paths: Sequence[str], storage_options: dict[str, Any] | None, download: bool) -> list[dict[str, Any]]:
    """`weightio.open`'s keyword arguments for each of `paths`: storage options go to the URLs that
    are not hf:// (fsspec's), ``download`` to the hf:// ones. When none takes them, every path
    gets them, so that the library says why they do not apply (a usage error)."""
    from weightio.remote import is_url

    takes_options = [is_url(p) and not p.startswith("hf://") for p in paths]
    takes_download = [p.startswith("hf://") for p in paths]
    if storage_options and not any(takes_options):
        takes_options = [True] * len(paths)
    if download and not any(takes_download):
        takes_download = [True] * len(paths)
    return [{"storage_options": storage_options if o else None, "download": download and d}
            for o, d in zip(takes_options, takes_download, strict=True)]


def apply_environment(ctx: click.Context) -> None:
    """NO_COLOR (any non-empty value) turns colour off, even on a terminal."""
    if os.environ.get("NO_COLOR"):
        ctx.color = False


class Styled(str):
    """Text that `style` coloured: the one kind of text `echo` prints without escaping it."""


def style(text: str, **styles: Any) -> Styled:
    """`click.style` of `text` escaped (`weightio.text.printable`); pass the result to `echo` as a
    part of its own (``echo("result: ", style("safe", fg="green"))``): concatenated with other
    text it becomes plain text again, and its colour codes are shown escaped. The codes are
    stripped by click when colour is off."""
    return Styled(click.style(printable(text, lines=True), **styles))


def echo(*parts: str, essential: bool = False, err: bool = False, nl: bool = True) -> None:
    """Print `parts` joined; with --quiet only what is `essential` (the command's answer) is printed.

    This is the command line's one way out to the terminal, so it is where text read from files
    (tensor names, metadata, pickle globals, file names, error messages) is made harmless: every
    part but the `Styled` ones goes through `weightio.text.printable` (ESC, BEL, C1 controls,
    bidirectional overrides and lone surrogates escaped; newlines and tabs kept), piped or not.
    """
    if quiet() and not essential:
        return
    text = "".join(p if isinstance(p, Styled) else printable(p, lines=True) for p in parts)
    click.echo(text, err=err, nl=nl)


def progress_bar(total: int, description: str) -> Any:
    """A byte-counting tqdm bar on stderr, or None where none is shown: off a terminal and with
    --quiet (tqdm, ~80 ms to import, is then not imported)."""
    if quiet() or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
                leave=False, dynamic_ncols=True)
