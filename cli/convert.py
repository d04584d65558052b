"""``weightio convert SRC DST``: any readable checkpoint to safetensors, npz, npy or GGUF."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from weightio import UsageError, WeightioError
from weightio.formats import SUFFIXES, WRITERS, format_for_path
from weightio.remote import is_url
from weightio.text import printable

from ._format import human_bytes, json_text, plural
from ._options import common_options, echo, limit_options, progress_bar, remote_options, unknown_globals_option

if TYPE_CHECKING:
    from weightio.convert import ConvertResult

# weightio.convert (~20 ms of imports: the writers, the model files' copier) is imported when the
# command runs or checks an option, not by every command the program starts with.


def _target_dtype(text: str) -> object:
    from weightio.convert import target_dtype

    return target_dtype(text)


def _shard_size(text: str) -> object:
    from weightio.convert import parse_size

    return parse_size(text)


def _validated(parse: Callable[[str], object]) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """An option callback: a value `parse` refuses is a usage error (exit 2), found before any work."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse(value)
            except WeightioError as e:
                raise click.BadParameter(e.message) from None
        return value

    return check


def _check_destination(src: str, dst: str, fmt: str | None) -> None:
    """A destination whose format cannot be told is a usage error (exit 2), found before any work."""
    if is_url(dst):
        raise click.BadParameter("writing to the Hub is not supported (nor to any URL); convert to a local path",
                                 param_hint="DST")
    from weightio.convert import into_directory

    if fmt is not None or into_directory(src, dst):
        return
    try:
        format_for_path(dst)
    except UsageError:
        suffix = os.path.splitext(dst)[1] or "(none)"
        known = ", ".join(SUFFIXES)
        raise click.BadParameter(f"cannot tell the output format from suffix {suffix} (writable: {known}; "
                                 "or pass --format)", param_hint="DST") from None


def _report(result: ConvertResult) -> None:
    shown = result.files[0] if len(result.files) == 1 else f"{len(result.files) - 1} shards + {result.files[-1]}"
    echo(f"wrote {shown}: {plural(result.tensors, 'tensor')}, {human_bytes(result.nbytes)} ({result.format})")
    if result.verified:
        echo("  verified: every tensor read back and compared byte for byte")
    if result.aliases:
        echo(f"  tied: {plural(len(result.aliases), 'name')} of shared tensors written once, as aliases in the "
             "metadata:")
        for removed, kept in sorted(result.aliases.items()):
            echo(f"    {printable(removed)} -> {printable(kept)}")
    if result.copied:
        names = ", ".join(printable(os.path.basename(f)) for f in result.copied[:6])
        echo(f"  copied: {plural(len(result.copied), 'other file')} of the model directory ({names}"
             f"{' …' if len(result.copied) > 6 else ''})")
    for rel, why in result.skipped.items():
        echo(f"  not copied: {printable(rel)} ({why})")
    if result.fetched != (0, 0):
        echo(f"  fetched: {plural(result.fetched[0], 'request')}, {human_bytes(result.fetched[1])} from the source")
    for note in result.notes:
        echo(f"  note: {note}")


def _json(result: ConvertResult) -> str:
    """The ``--json`` document (schema ``weightio.convert/1``, documented in docs/convert.md)."""
    return json_text({"schema": "weightio.convert/1", "format": result.format, "files": result.files,
                      "tensors": result.tensors, "nbytes": result.nbytes, "verified": result.verified,
                      "aliases": result.aliases, "copied": result.copied, "skipped": result.skipped,
                      "notes": result.notes,
                      "fetched": {"requests": result.fetched[0], "bytes": result.fetched[1]}})


def progress_callback(bar: Any, verify: bool) -> Callable[[int, int], None]:
    """`convert`'s ``progress(advance, total)`` drawn on `bar` (a tqdm bar of bytes). With --verify
    the library's total counts every byte twice (written, then read back): the bar shows two passes
    over the output's size, "verifying" the second."""
    done = 0

    def progress(advance: int, total: int) -> None:
        nonlocal done
        size = total // 2 if verify else total
        if bar.total != size:
            bar.total = size
            bar.refresh()
        before, done = done, done + advance
        if verify and before < size <= done:  # this step finished the writing
            bar.update(size - before)
            bar.reset(total=size)
            bar.set_description("verifying")
            bar.update(done - size)
        else:
            bar.update(advance)

    return progress


@click.command("convert")
@click.argument("src")
@click.argument("dst")
@click.option("--dtype", callback=_validated(_target_dtype), metavar="TYPE",
              help="Cast floating-point tensors: bf16, fp16, fp32, fp64, fp8 (= float8_e4m3fn), fp8_e5m2, …")
@click.option("--dequantize", is_flag=True, help="Write block-quantized GGUF/ggml tensors as float32 (or --dtype).")
@click.option("--max-shard-size", callback=_validated(_shard_size), metavar="SIZE",
              help="Split a safetensors output into shards of at most SIZE (5GB, 500MiB) with an index, "
                   "as huggingface_hub writes them.")
@click.option("--format", "fmt", type=click.Choice(sorted(WRITERS)), default=None,
              help="Output format, when DST's suffix does not say it.")
@click.option("--filter", "patterns", multiple=True, metavar="GLOB", help="Only tensors matching GLOB (repeatable).")
@click.option("--verify", is_flag=True, help="Read every written tensor back and compare it before committing.")
@click.option("-f", "--force", is_flag=True, help="Replace an existing DST (atomically).")
@click.option("--parents", is_flag=True, help="Create DST's missing parent directories (without it, a missing "
                                              "one is an error).")
@click.option("--weights-only", is_flag=True,
              help="From a model directory into a directory: do not copy its other files (config, tokenizer …).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema weightio.convert/1).")
@click.option("--ggml-context-length", type=click.IntRange(1, 2**32 - 1), metavar="N",
              help="ggml llama -> .gguf: llama.context_length (default 2048; LLaMA-2: 4096).")
@click.option("--ggml-eps", type=float, metavar="EPS",
              help="ggml llama -> .gguf: the RMS norm epsilon (default 5e-6; LLaMA-1: 1e-6, LLaMA-2: 1e-5).")
@click.option("--ggml-gqa", type=click.IntRange(1, 255), metavar="N",
              help="ggml llama -> .gguf: grouped-query attention factor (default 1; LLaMA-2 70B: 8).")
@click.option("--ggml-name", metavar="TEXT", help="ggml llama -> .gguf: general.name (default: SRC's file name).")
@click.option("--ggml-description", metavar="TEXT", help="ggml llama -> .gguf: general.description.")
@remote_options
@unknown_globals_option
@limit_options
@common_options
def convert_command(src: str, dst: str, dtype: str | None, dequantize: bool, max_shard_size: str | None,
                    fmt: str | None, patterns: tuple[str, ...], verify: bool, force: bool, parents: bool,
                    weights_only: bool,
                    as_json: bool, unknown_globals: str, ggml_context_length: int | None, ggml_eps: float | None,
                    ggml_gqa: int | None, ggml_name: str | None, ggml_description: str | None,
                    storage_options: dict | None, download: bool) -> None:
    """Convert checkpoint SRC to DST, one tensor in memory at a time.

    SRC is anything weightio reads (a file, a model directory, a URL: hf://, https://, s3:// …;
    a remote SRC is streamed too, each tensor's bytes fetched when written, under a progress bar
    of the bytes fetched; --json's "fetched" says what it took). DST's suffix
    picks the format: .safetensors, .npz, .npy (one tensor) or .gguf; a directory gets
    DST/model.safetensors (with shards and an index under --max-shard-size). The output is
    written beside DST, fsynced and renamed into place only when complete: Ctrl-C or a full
    disk leave no partial DST, and SRC is never modified. Temporary files that a killed
    conversion left beside DST (``.*.weightio-tmp``) are removed first, when no running process
    holds them. Tied weights of PyTorch checkpoints are written once, with aliases in the metadata.
    From a model directory (or a URL's repo or folder) into a directory, its other files (config,
    tokenizer, generation config …) are copied beside the weights; weight files of other formats
    are listed, not copied. A legacy llama ggml/ggjt file written as .gguf becomes the llama
    GGUF model llama.cpp's own converter writes (vocabulary, hyper-parameters, GGUF names);
    --ggml-* set what the old file does not say.

    \b
    Examples:
      weightio convert pytorch_model.bin model.safetensors --verify
      weightio convert hf://org/model out/ --max-shard-size 5GB
      weightio convert s3://bucket/model/ out/ --storage-option anon=true
      weightio convert model.safetensors model-bf16.safetensors --dtype bf16
      weightio convert model-Q4_K_M.gguf model.safetensors --dequantize --dtype fp16
      weightio convert weights.npz weights.safetensors
      weightio convert model.safetensors embed.npy --filter 'embeddings.word_embeddings.weight'
      weightio convert llama-2-7b.ggmlv3.q4_0.bin llama.gguf --ggml-eps 1e-5 --ggml-context-length 4096
      weightio convert whole_model.pt model.safetensors --unknown-globals placeholder
    """
    from weightio.convert import convert

    _check_destination(src, dst, fmt)
    ggml = {k: v for k, v in {"context_length": ggml_context_length, "eps": ggml_eps, "gqa": ggml_gqa,
                              "name": ggml_name, "description": ggml_description}.items() if v is not None}
    bar = progress_bar(0, "fetching" if is_url(src) else "converting")
    with contextlib.nullcontext() if bar is None else bar:
        progress = None if bar is None else progress_callback(bar, verify)
        result = convert(src, dst, format=fmt, dtype=dtype, dequantize=dequantize, max_shard_size=max_shard_size,
                         select=patterns or None, verify=verify, overwrite=force, progress=progress,
                         copy_files=not weights_only, ggml_options=ggml or None,
                         unknown_globals=unknown_globals, storage_options=storage_options, download=download,
                         parents=parents)
    if as_json:
        click.echo(_json(result))
    else:
        _report(result)
