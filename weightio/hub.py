"""``hf://`` paths: checkpoints on the Hugging Face Hub (or a mirror), through ``huggingface_hub``.

Grammar (the ``hf://`` URI form ``huggingface_hub`` itself uses, for model, dataset and space repos)::

    hf://[models/|datasets/|spaces/]<namespace>/<name>[@<revision>][/<path in the repo>]

    hf://google-bert/bert-base-uncased                   the model's weights, as `weightio.open` picks them
    hf://google-bert/bert-base-uncased@main/config.json  one file at a branch, tag or commit
    hf://org/model@refs/pr/3                             pull-request refs may be written as they are
    hf://org/model@my%2Fbranch/unet                      any other "/" in a revision is written %2F

A path that names a file resolves to that file (the other parts of a split GGUF set come with it).
A path that names a folder, or no path, resolves to the weights of that folder, chosen the way
`weightio.open` chooses in a local directory: a sharded safetensors index (the index and every
shard it lists), ``model.safetensors``, a single ``*.safetensors``; then the same for PyTorch
``.bin`` files; then a single GGUF file or split set. safetensors is preferred over ``.bin``.
Only the files needed are downloaded.

Where the files come from (read on every call, so a changed environment takes effect):

* ``HF_ENDPOINT``: the Hub or a mirror (default ``https://huggingface.co``);
* ``HF_HUB_CACHE`` / ``HF_HOME``: the standard ``huggingface_hub`` cache, shared with
  transformers and the ``hf`` command (downloads are pinned to one commit);
* ``HF_HUB_OFFLINE=1``: no network; files come from the cache, or the call fails saying so.
  When the Hub cannot be reached, the cache is used too;
* tokens: ``HF_TOKEN`` or the one saved by ``hf auth login``, as ``huggingface_hub`` finds
  them. A token is sent to the endpoint only and never appears in a message.

``huggingface_hub`` is imported here only, inside the functions that need it: ``import weightio``
does not load it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from . import layout, limits
from ._failures import scrub
from ._outputs import check_parent
from .errors import FormatError, InputError, WeightioError
from .hubpath import SCHEME, HubPath, check_revision, is_hub_path, parse

if TYPE_CHECKING:
    from huggingface_hub.hf_api import DatasetInfo, ModelInfo, SpaceInfo

__all__ = ["HubFile", "HubPath", "SCHEME", "is_hub_path", "named_file", "parse", "remote_sources", "resolve",
           "download", "model_files", "pick_weights", "CONFIG_PATTERNS"]

# Besides the weights, `download` fetches what loading a model needs: configs and tokenizers.
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.yaml", "*.yml")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's spelling of a true environment variable


# ----------------------------------------------------------------------------- environment


def _endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.upper() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def _cache_dir() -> str:
    from huggingface_hub import constants

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return constants.HF_HUB_CACHE


# ----------------------------------------------------------------------------- choosing files


def pick_weights(files: Iterable[str], *, where: str, read_index: Any = None) -> list[str]:
    """The weight files of one folder that `weightio.open` would read, preferred layout first.

    Args:
        files: file names relative to the folder (names with "/" are in sub-folders and ignored).
        where: the folder's hf:// path, for messages.
        read_index: ``read_index(name) -> list of shard names`` for a sharded index (fetches it).

    Returns:
        The files to fetch: an index first, then its shards; or one file (with the other parts
        of a split GGUF set).

    Raises:
        FormatError: no weights, or several candidates where `weightio.open` would not choose.
    """
    top = sorted(f for f in files if "/" not in f)
    try:
        chosen = layout.choose(top)
    except layout.Ambiguous as e:
        raise _ambiguous(e.candidates, where) from None
    if chosen is None:
        shown = ", ".join(top[:8]) + (" …" if len(top) > 8 else "") if top else "no files"
        raise FormatError(f"holds no weight files weightio reads (found: {shown})", path=where)
    if chosen.endswith(".index.json"):
        return [chosen, *(read_index(chosen) if read_index else [])]
    return [chosen, *_gguf_parts(chosen, top)]


def _ambiguous(candidates: list[str], where: str) -> FormatError:
    if all(c.endswith(".gguf") for c in candidates):
        firsts = [c for c in candidates if (layout.split_part(c) or (c, 1, 1))[1] == 1]
        shown = ", ".join(f"{where.rstrip('/')}/{f}" for f in firsts[:6]) + (" …" if len(firsts) > 6 else "")
        return FormatError(f"holds {len(firsts)} GGUF files; name one: {shown}", path=where)
    return FormatError(f"holds several candidate files ({', '.join(candidates)}); name one of them "
                       f"({where.rstrip('/')}/{candidates[0]})", path=where)


def _gguf_parts(first: str, files: Iterable[str]) -> list[str]:
    """The other parts of a split GGUF set whose first part is `first`."""
    part = layout.split_part(first)
    if part is None:
        return []
    present = set(files)
    return [f for f in layout.split_parts(part[0], part[2]) if f != first and f in present]


# ----------------------------------------------------------------------------- the repo


class _Repo:
    """One revision of one repo: its file list and its downloads, online or from the cache."""

    def __init__(self, hub: HubPath, uri: str, local_dir: str | None = None, *, sizes: bool = False) -> None:
        self.hub, self.uri, self.local_dir = hub, uri, local_dir
        self.endpoint, self.cache_dir, self.offline = _endpoint(), _cache_dir(), _offline()
        self.listed_sizes: dict[str, int] = {}  # with sizes=True, what the listing said (online only)
        self._with_sizes = sizes  # the by-range mode (remote_sources): indexes are read, not downloaded
        self._indexes: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
        self.commit, self.files = self._listing()

    def _listing(self) -> tuple[str, list[str]]:
        if not self.offline:
            try:
                return self._remote_listing()
            except Exception as e:  # noqa: BLE001 - every hub failure becomes one InputError below
                if not _is_unreachable(e):
                    raise _hub_error(e, self.uri, self.endpoint) from None
                cached = self._cached_listing()
                if cached is None:
                    raise _hub_error(e, self.uri, self.endpoint) from None
                return cached
        cached = self._cached_listing()
        if cached is None:
            raise InputError(f"is not in the cache ({self.cache_dir}) and HF_HUB_OFFLINE is set; download it "
                             "once online (weightio download) or unset HF_HUB_OFFLINE", path=self.uri)
        return cached

    def _remote_listing(self) -> tuple[str, list[str]]:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint)
        info = api.repo_info(self.hub.repo_id, repo_type=self.hub.repo_type, revision=self.hub.revision,
                             files_metadata=self._with_sizes)
        # a model's, dataset's or space's (what hubpath parses), never a kernel's (whose info lists no files)
        info = cast("ModelInfo | DatasetInfo | SpaceInfo", info)
        siblings = info.siblings or []
        self.listed_sizes = {s.rfilename: size for s in siblings if isinstance(size := getattr(s, "size", None), int)}
        return cast(str, info.sha), [s.rfilename for s in siblings]  # repo_info always has it (a listing's may not)

    def _storage(self) -> str:
        from huggingface_hub.file_download import repo_folder_name

        return os.path.join(self.cache_dir, repo_folder_name(repo_id=self.hub.repo_id, repo_type=self.hub.repo_type))

    def _cached_listing(self) -> tuple[str, list[str]] | None:
        """The commit the cache knows for this revision, and the files it holds of it."""
        revision = self.hub.revision or "main"
        commit = revision if _COMMIT.fullmatch(revision) else _read_text(os.path.join(self._storage(), "refs",
                                                                                       revision))
        if commit is None:
            return None
        snapshot = os.path.join(self._storage(), "snapshots", commit)
        if not os.path.isdir(snapshot):
            return None
        files = [os.path.relpath(os.path.join(d, f), snapshot).replace(os.sep, "/")
                 for d, _, names in os.walk(snapshot) for f in names]
        return commit, files

    def fetch(self, filename: str) -> str:
        """The local path of one repo file, downloaded (pinned to the listed commit) when not cached."""
        from huggingface_hub import hf_hub_download

        try:
            return hf_hub_download(self.hub.repo_id, filename, repo_type=self.hub.repo_type, revision=self.commit,
                                   cache_dir=self.cache_dir, local_dir=self.local_dir, endpoint=self.endpoint,
                                   local_files_only=self.offline)
        except Exception as e:  # noqa: BLE001 - see _hub_error
            raise _hub_error(e, self.uri, self.endpoint, filename) from None

    def index(self, filename: str) -> tuple[dict[str, str], dict[str, Any]]:
        """A sharded index's ``weight_map`` and ``metadata`` (read once): from the cache where it is
        there; in the by-range mode, by one GET (an index is small: it is parsed, not stored); else
        downloaded into the cache."""
        if filename not in self._indexes:
            local = self.cached(filename) if self._with_sizes and not self.offline else None
            if self._with_sizes and not self.offline and local is None:
                label = f"{HubPath(self.hub.repo_id, self.hub.repo_type, self.hub.revision, '')}/{filename}"
                raw = self._get(filename)
                self._indexes[filename] = layout.parse_index(raw, label)
            else:
                self._indexes[filename] = layout.read_index(local or self.fetch(filename))
        return self._indexes[filename]

    def _get(self, filename: str) -> bytes:
        """A small repo file's bytes at the listed commit, by one GET through huggingface_hub's session."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        size = self.listed_sizes.get(filename)
        limit = limits.current().header_bytes
        if size is not None and size > limit:
            raise limits.exceeded("index length", size, "header_bytes", limit, path=f"{self.uri}/{filename}")
        url = hf_hub_url(self.hub.repo_id, filename, repo_type=self.hub.repo_type, revision=self.commit,
                         endpoint=self.endpoint)
        try:
            response = get_session().get(url, headers=build_hf_headers(), follow_redirects=True)
            hf_raise_for_status(response)
        except Exception as e:  # noqa: BLE001 - see _hub_error
            raise _hub_error(e, self.uri, self.endpoint, filename) from None
        return response.content

    def cached(self, filename: str) -> str | None:
        """The local path of a repo file at the listed commit when the cache holds it, else None."""
        if self.local_dir is not None:
            return None
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(self.hub.repo_id, filename, cache_dir=self.cache_dir, revision=self.commit,
                                       repo_type=self.hub.repo_type)
        return found if isinstance(found, str) else None

    def sizes(self, filenames: list[str]) -> dict[str, int]:
        """Each file's size at the listed commit: from the listing where it gave them, else one
        paths-info request for them all."""
        from huggingface_hub import HfApi

        if all(name in self.listed_sizes for name in filenames):
            return {name: self.listed_sizes[name] for name in filenames}
        try:
            infos = HfApi(endpoint=self.endpoint).get_paths_info(self.hub.repo_id, filenames, revision=self.commit,
                                                                  repo_type=self.hub.repo_type)
        except Exception as e:  # noqa: BLE001 - see _hub_error
            raise _hub_error(e, self.uri, self.endpoint) from None
        sizes = {info.path: getattr(info, "size", None) for info in infos}
        for name in filenames:
            if not isinstance(sizes.get(name), int):
                raise InputError(f"the Hub at {self.endpoint} gave no size for file {name!r}", path=self.uri)
        return {name: int(sizes[name]) for name in filenames}  # type: ignore[arg-type]  # (each an int: checked above)

    def remember_revision(self) -> None:
        """Record branch/tag -> commit in the cache's ``refs/`` (as huggingface_hub does), so that
        later offline calls find this revision."""
        revision = self.hub.revision or "main"
        if self.offline or _COMMIT.fullmatch(revision) or self.local_dir is not None:
            return
        ref = os.path.join(self._storage(), "refs", revision)
        if _read_text(ref) == self.commit:
            return
        tmp = f"{ref}.{os.getpid()}.weightio-tmp"
        try:  # best effort, as a cache may be read-only or shared: the files are already here
            os.makedirs(os.path.dirname(ref), exist_ok=True)
            with open(tmp, "w") as f:
                f.write(self.commit)
            os.replace(tmp, ref)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _files_under(files: list[str], folder: str) -> list[str]:
    prefix = folder + "/" if folder else ""
    return [f[len(prefix):] for f in files if f.startswith(prefix)]


@dataclass(frozen=True)
class _Plan:
    """What to fetch for one hf:// path.

    Attributes:
        files: repo files to fetch (an index before its shards).
        file: the file that answers (a named file, a single weight file, the first GGUF part),
            or None when the answer is the folder (a sharded checkpoint).
        folder: the repo folder the path is about ("" for the root).
        named: True when the hf:// path named a file.
    """

    files: list[str]
    file: str | None
    folder: str
    named: bool


def _plan(repo: _Repo) -> _Plan:
    path = repo.hub.path
    if path in repo.files:
        folder, _, name = path.rpartition("/")
        parts = _gguf_parts(name, _files_under(repo.files, folder))
        return _Plan([path, *(_join(folder, p) for p in parts)], path, folder, True)
    if not _files_under(repo.files, path):
        what = f"file or folder {path!r}" if path else "any file"
        raise InputError(f"has no {what} at commit {repo.commit[:12]}", path=repo.uri)

    def shards(index: str) -> list[str]:
        weight_map, _ = repo.index(_join(path, index))
        return layout.shards(weight_map)

    chosen = [_join(path, f) for f in pick_weights(_files_under(repo.files, path), where=repo.uri, read_index=shards)]
    sharded = chosen[0].endswith(".index.json")
    return _Plan(chosen, None if sharded else chosen[0], path, False)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _local_folder(local_file: str, repo_file: str, folder: str) -> str:
    """The local directory of repo folder `folder`, given where `repo_file` landed."""
    root = local_file[: len(local_file) - len(os.path.join(*repo_file.split("/")))]
    return os.path.join(root, *folder.split("/")) if folder else root.rstrip(os.sep)


def resolve(uri: str) -> str:
    """The local path of an ``hf://`` path's weights, downloading what the cache lacks; for a repo
    or folder, its config and tokenizer files come too (as with `download`: transformers then loads
    the model offline).

    Returns:
        A file (a single weight file, or the first part of a split GGUF set) or a directory
        (a sharded checkpoint: the index and its shards) that `weightio.open` reads.

    Raises:
        InputError: malformed path, unknown repo/revision/file, no network and nothing cached.
        FormatError: no weights, or several candidates (the message lists them).

    Example:
        >>> weightio.open("hf://google-bert/bert-base-uncased")    # doctest: +SKIP
    """
    repo = _Repo(parse(uri), uri)
    plan = _plan(repo)
    configs = [] if plan.named else _configs(repo.files, plan.folder, plan.files)
    local = {f: repo.fetch(f) for f in [*plan.files, *configs]}
    repo.remember_revision()
    if plan.file is not None:
        return local[plan.file]
    return _local_folder(local[plan.files[0]], plan.files[0], plan.folder)


@dataclass(frozen=True)
class HubFile:
    """A repo file that is not in the local cache: `weightio.remote` reads it by byte ranges.

    Attributes:
        repo_id, repo_type: the repo.
        commit: the commit the revision pointed to when listed (files at a commit never change); the
            revision as written for a file not listed yet (`named_file`).
        filename: the file's path in the repo.
        endpoint: the Hub or mirror (``HF_ENDPOINT``).
        size: the file's size, from the Hub's paths-info.
        uri: the ``hf://`` path shown in messages (revision as the user wrote it).
    """

    repo_id: str
    repo_type: str
    commit: str
    filename: str
    endpoint: str
    size: int
    uri: str

    def url(self) -> str:
        """The file's download URL, pinned to `commit`."""
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo_id, self.filename, repo_type=self.repo_type, revision=self.commit,
                          endpoint=self.endpoint)


# names of a file that opens alone (not an index, not a part of a split GGUF set)
_ONE_FILE = tuple(s for _, _, suffixes in layout.LAYOUTS for s in suffixes) + (".npz", ".npy")


def named_file(uri: str) -> HubFile | None:
    """The file an ``hf://`` path names, as far as it can be known before the repo is listed (its
    revision as written, size 0: unknown), when it is worth asking for its first bytes at once: online,
    a weight file's name, not in the cache at that revision. None otherwise (a repo, a folder, …)."""
    hub = parse(uri)
    base = hub.path.rsplit("/", 1)[-1].lower()
    if not base.endswith(_ONE_FILE) or layout.split_part(base) is not None or _offline():
        return None
    from huggingface_hub import try_to_load_from_cache

    cache_dir = _cache_dir()
    if isinstance(try_to_load_from_cache(hub.repo_id, hub.path, cache_dir=cache_dir, revision=hub.revision,
                                         repo_type=hub.repo_type), str):
        return None
    return HubFile(hub.repo_id, hub.repo_type, hub.revision or "main", hub.path, _endpoint(), 0, uri)


def remote_sources(uri: str) -> tuple[list[str | HubFile], tuple[str, dict[str, str], dict[str, Any]] | None]:
    """The weights of an ``hf://`` path without downloading them: each file's local path where the
    cache holds it, else a `HubFile` to read by range; and for a sharded set, its index (local path
    or ``hf://`` label, ``weight_map``, ``metadata``), else None. One listing gives the commit and
    every file's size, the index is read by one GET: nothing is downloaded. Offline
    (``HF_HUB_OFFLINE``), every file must be cached.

    Raises:
        InputError: malformed path, unknown repo/revision/file, nothing cached offline.
        FormatError: no weights, or several candidates.
    """
    repo = _Repo(parse(uri), uri, sizes=True)
    plan = _plan(repo)
    sharded = plan.files[0].endswith(".index.json")
    found: dict[str, str | None] = {f: repo.cached(f) for f in plan.files[sharded:]}
    if repo.offline:
        found = {f: path or repo.fetch(f) for f, path in found.items()}
    missing = [f for f, path in found.items() if path is None]
    sizes = repo.sizes(missing) if missing else {}
    label = str(HubPath(repo.hub.repo_id, repo.hub.repo_type, repo.hub.revision, ""))
    sources: list[str | HubFile] = [
        path if path is not None else HubFile(repo.hub.repo_id, repo.hub.repo_type, repo.commit, f, repo.endpoint,
                                              sizes[f], f"{label}/{f}")
        for f, path in found.items()]
    if not sharded:
        return sources, None
    index = repo.cached(plan.files[0]) or f"{label}/{plan.files[0]}"
    return sources, (index, *repo.index(plan.files[0]))


def download(repo_or_uri: str, *, revision: str | None = None, local_dir: str | None = None,
             parents: bool = False) -> str:
    """Fetch a model's weights (the preferred layout only) and its config/tokenizer files.

    Args:
        repo_or_uri: ``namespace/name`` or an ``hf://`` path (a folder inside the repo selects
            that folder's weights and configs; a file, just that file).
        revision: branch, tag or commit (overrides an ``@revision`` in the path).
        local_dir: put the files in this directory (mirroring the repo's layout) instead of
            only in the cache. It is created if missing; its parent must exist unless `parents`.
        parents: create `local_dir`'s missing parent directories (else `WriteError` naming the
            missing one, before anything is fetched).

    Returns:
        The local folder holding the files (in the cache's snapshot, or in `local_dir`), or the
        local file when a file was named.
    """
    uri = repo_or_uri if is_hub_path(repo_or_uri) else SCHEME + repo_or_uri
    hub = parse(uri)
    if local_dir is not None:
        check_parent(os.fspath(local_dir), is_directory=True, parents=parents)
    if revision is not None:
        hub = HubPath(hub.repo_id, hub.repo_type, check_revision(revision, uri), hub.path)
    repo = _Repo(hub, str(hub), local_dir)
    plan = _plan(repo)
    files = plan.files if plan.named else [*plan.files, *_configs(repo.files, plan.folder, plan.files)]
    local = {f: repo.fetch(f) for f in files}
    repo.remember_revision()
    if plan.named:
        return local[cast(str, plan.file)]  # a named file's plan answers with it (`_plan`)
    return _local_folder(local[files[0]], files[0], plan.folder)


def model_files(uri: str) -> tuple[str, list[str], list[str]] | None:
    """The files of an ``hf://`` folder besides the weights `resolve` picks, for `weightio convert`
    to copy: every file under the folder (sub-folders included) except hidden ones and the weight
    files of any format (`weightio.layout.is_weights`), which are listed but not downloaded.

    Returns:
        ``(local folder, files fetched, other weight files)``, paths relative to the folder;
        None when `uri` names a file.
    """
    repo = _Repo(parse(uri), uri)
    plan = _plan(repo)
    if plan.named:
        return None
    weights = set(_files_under(plan.files, plan.folder))
    others = [f for f in _files_under(repo.files, plan.folder)
              if f not in weights and not any(part.startswith(".") for part in f.split("/"))]
    copied = sorted(f for f in others if not layout.is_weights(f))
    anchor = _join(plan.folder, (copied or sorted(weights))[0])
    local = {f: repo.fetch(_join(plan.folder, f)) for f in copied} or {"": repo.fetch(anchor)}
    repo.remember_revision()
    root = _local_folder(next(iter(local.values())), anchor, plan.folder)
    return root, copied, sorted(f for f in others if layout.is_weights(f))


def _configs(files: list[str], folder: str, weights: list[str]) -> list[str]:
    from fnmatch import fnmatchcase

    inside = [f for f in _files_under(files, folder) if "/" not in f]
    chosen = [f for f in inside if any(fnmatchcase(f, p) for p in CONFIG_PATTERNS)
              and not f.endswith(".index.json")]
    return [_join(folder, f) for f in chosen if _join(folder, f) not in weights]


# ----------------------------------------------------------------------------- errors


def _is_unreachable(error: BaseException) -> bool:
    """Network down, DNS failure, timeout or a 5xx: the cache may still answer."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        response = getattr(error, "response", None)
        return response is not None and getattr(response, "status_code", 0) >= 500
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"ConnectError", "ConnectionError", "TimeoutException", "Timeout", "OfflineModeIsEnabled",
                         "NetworkError", "ConnectTimeout", "ReadTimeout"})


def _hub_error(error: BaseException, uri: str, endpoint: str, filename: str | None = None) -> WeightioError:
    """One `InputError` with a message a person can act on; tokens scrubbed."""
    if isinstance(error, WeightioError):
        return error
    from huggingface_hub import errors as hf

    where = f"file {filename!r}" if filename else "repository"
    if isinstance(error, hf.GatedRepoError):
        message = "is a gated repository: accept its conditions on the Hub, then log in (hf auth login) or set HF_TOKEN"
    elif isinstance(error, hf.RepositoryNotFoundError):
        message = (f"repository not found on {endpoint} (if it is private or gated, log in with "
                   "`hf auth login` or set HF_TOKEN)")
    elif isinstance(error, hf.RevisionNotFoundError):
        message = f"revision not found on {endpoint}"
    elif isinstance(error, hf.LocalEntryNotFoundError):
        message = f"{where} is not in the cache and the Hub cannot be used (offline or unreachable)"
    elif isinstance(error, hf.EntryNotFoundError):
        message = f"{where} not found in the repository"
    elif isinstance(error, hf.HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", 0)
        detail = getattr(error, "server_message", None) or _first_line(error)
        message = f"the Hub at {endpoint} answered HTTP {status} for the {where}: {' '.join(detail.split())}"
        if status >= 500:
            message += "; it is not in the cache either"
    elif _is_unreachable(error):
        message = f"cannot reach {endpoint} ({_first_line(error)}) and the {where} is not cached"
    else:
        message = f"cannot fetch the {where}: {type(error).__name__}: {_first_line(error)}"
    return InputError(_scrub(message), path=uri)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _scrub(message: str) -> str:
    """Remove anything that looks like a token, and the token in use, from a message."""
    try:
        from huggingface_hub import get_token

        token = get_token()
    except Exception:  # noqa: BLE001 - no token store is not an error here
        token = None
    if token:
        message = message.replace(token, "***")
    return scrub(message)  # tokens, signatures and URL credentials of any shape
