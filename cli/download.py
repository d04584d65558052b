"""``weightio download REPO``: a model's weights (preferred layout only) and configs, into the cache."""

from __future__ import annotations

import os
import sys

import click

from weightio import hub

from ._options import common_options, echo, quiet


@click.command("download")
@click.argument("repo")
@click.option("--revision", metavar="REV", default=None, help="Branch, tag or commit (default: the main branch).")
@click.option("--local-dir", type=click.Path(file_okay=False), default=None,
              help="Also put the files in this directory, laid out as in the repo.")
@click.option("--parents", is_flag=True, help="Create --local-dir's missing parent directories.")
@common_options
def download_command(repo: str, revision: str | None, local_dir: str | None, parents: bool) -> None:
    """Download the weights a model needs, and its config and tokenizer files; print where they are.

    REPO is namespace/name or an hf:// path (hf://org/model@v1, hf://org/model/unet for one
    folder, hf://org/model/model-Q4_K_M.gguf for one file). Only the weights weightio would
    load are fetched: safetensors when the repo has them (never also the .bin copies), every
    shard of a sharded index, one GGUF file or split set. Files go to the standard Hugging Face
    cache (HF_HUB_CACHE / HF_HOME), shared with transformers; HF_ENDPOINT selects a mirror,
    HF_HUB_OFFLINE=1 uses only the cache, and a token from HF_TOKEN or `hf auth login` is used
    for private repos (never printed).

    \b
    Examples:
      weightio download google-bert/bert-base-uncased
      weightio download hf://org/model@v1.0 --local-dir ./model
      weightio inspect "$(weightio download -q org/model)"
    """
    if quiet() or not sys.stderr.isatty():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    path = hub.download(repo, revision=revision, local_dir=local_dir, parents=parents)
    if local_dir is not None:  # say it the way it was asked for: ./model/unet, not /home/…/model/unet
        inside = os.path.relpath(path, os.path.abspath(local_dir))
        path = local_dir if inside == "." else os.path.join(local_dir, inside)
    echo(path, essential=True)
