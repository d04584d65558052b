"""The ``hf://`` path grammar (see `weightio.hub`): `HubPath`, `parse`, `is_hub_path`.

Parsing needs neither the network nor ``huggingface_hub``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from .errors import InputError

__all__ = ["SCHEME", "HubPath", "check_revision", "is_hub_path", "parse"]

SCHEME = "hf://"
_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_SPECIAL_REFS = re.compile(r"refs/(?:pr/\d+|convert/[\w.-]+)")  # revisions that may hold "/"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one part of a repo id


@dataclass(frozen=True)
class HubPath:
    """A parsed ``hf://`` path.

    Attributes:
        repo_id: ``namespace/name``.
        repo_type: ``"model"``, ``"dataset"`` or ``"space"``.
        revision: branch, tag or commit; None for the default branch.
        path: the file or folder inside the repo; ``""`` for the repo's root.
    """

    repo_id: str
    repo_type: str = "model"
    revision: str | None = None
    path: str = ""

    def __str__(self) -> str:
        prefix = "" if self.repo_type == "model" else self.repo_type + "s/"
        revision = ""
        if self.revision is not None:
            special = _SPECIAL_REFS.fullmatch(self.revision)
            revision = "@" + (self.revision if special else self.revision.replace("/", "%2F"))
        return f"{SCHEME}{prefix}{self.repo_id}{revision}" + (f"/{self.path}" if self.path else "")


def is_hub_path(path: object) -> bool:
    """True for strings that start with ``hf://``."""
    return isinstance(path, str) and path.startswith(SCHEME)


def parse(uri: str) -> HubPath:
    """Parse ``hf://[type/]namespace/name[@revision][/path]``; `InputError` when malformed.

    Example:
        >>> parse("hf://org/model@v1/weights/model.safetensors")
        HubPath(repo_id='org/model', repo_type='model', revision='v1', path='weights/model.safetensors')
    """
    if not uri.startswith(SCHEME):
        raise InputError("is not an hf:// path", path=uri)
    rest = uri[len(SCHEME):]
    repo_type = "model"
    first = rest.split("/", 1)[0]
    if first in _REPO_TYPES and rest.count("/") >= 2:
        repo_type, rest = _REPO_TYPES[first], rest.split("/", 1)[1]
    namespace, _, rest = rest.partition("/")
    name_part, _, path = rest.partition("/")
    name, at, revision = name_part.partition("@")
    if at:
        revision, path = _split_revision(revision, path)
    for part in (namespace, name):
        if not _NAME.fullmatch(part) or ".." in part:
            raise InputError("is not a valid hf:// path; expected hf://namespace/name[@revision][/file]", path=uri)
    if at and not revision:
        raise InputError("has an empty revision after '@'", path=uri)
    path = path.strip("/")
    if "//" in path or ".." in path.split("/"):
        raise InputError(f"path {path!r} inside the repo is not a plain relative path", path=uri)
    return HubPath(f"{namespace}/{name}", repo_type, check_revision(unquote(revision), uri) if at else None, path)


def check_revision(revision: str, uri: str) -> str:
    """A revision names a file under the cache's ``refs/``: no absolute path, no ``..``."""
    if revision.startswith(("/", "\\")) or ".." in revision.replace("\\", "/").split("/"):
        raise InputError(f"revision {revision!r} is not a branch, tag or commit name", path=uri)
    return revision


def _split_revision(revision: str, path: str) -> tuple[str, str]:
    """``refs/pr/3`` holds slashes of its own: take them back from the path."""
    joined = revision + ("/" + path if path else "")
    special = _SPECIAL_REFS.match(joined)
    if special and (len(joined) == special.end() or joined[special.end()] == "/"):
        return special.group(0), joined[special.end() + 1:]
    return revision, path
