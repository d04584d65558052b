"""``weightio scan PATH``: which code a checkpoint's pickles would import and call, without running it."""

from __future__ import annotations

import contextlib
import sys

import click

import weightio

from ._format import json_text
from ._options import common_options, echo, limit_options, remote_options, style


@click.command("scan")
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@remote_options
@limit_options
@common_options
def scan_command(path: str, as_json: bool, storage_options: dict | None, download: bool) -> None:
    """Report every global the pickles of PATH reference, weightio's verdict and fickling's findings.

    Exit status 0 when every file is safe (weightio reads it and no pickle asks for anything
    outside its allowlist), 1 when not. Nothing in the file is run. PATH may be a file, a
    directory (every checkpoint under it), an hf:// path (downloaded into the Hugging Face cache
    first, --download or not) or another URL (https://, s3:// …: a file, or a folder whose every
    file is scanned; only the bytes the scan reads are fetched: a zip's directory and its
    pickles, not its tensor data); safetensors, GGUF, ggml, npy and npz files are reported as
    formats that cannot store code.

    \b
    Examples:
      weightio scan pytorch_model.bin
      weightio scan path/to/downloads/ -q || echo "do not torch.load these"
      weightio scan hf://org/model --json
      weightio scan s3://bucket/checkpoints/ --storage-option anon=true
    """
    # Whatever a library prints while scanning (fickling has printed warnings) goes to stderr, so
    # that --json writes one JSON document and nothing else to stdout.
    with contextlib.redirect_stdout(sys.stderr):
        if download and not path.startswith("hf://"):
            raise click.BadParameter("applies to hf:// paths only (they are always downloaded to be scanned)",
                                     param_hint="--download")
        report = weightio.scan(path, storage_options=storage_options)
    if as_json:
        echo(json_text(report.to_dict()), essential=True)
    else:
        echo(report.text(cli=True))
        echo("result: ", style("safe", fg="green") if report.safe else style("UNSAFE", fg="red", bold=True))
    sys.exit(0 if report.safe else 1)
