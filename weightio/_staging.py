"""Staged outputs: files written under temporary names, then put in place together or not at all.

`convert` writes every output file (shards, the index) to a weightio temporary beside its
destination (`stage_name`, the name `weightio._outputs.remove_stale_temporaries` recognises) and
renames them into place only when all are complete: `Staging` keeps that list, the locks that
mark each complete file as alive, and the directories it created, so that a failure (Ctrl-C
included) removes all of it. `Outputs` names the files of one single or sharded save.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from dataclasses import dataclass

from ._outputs import TEMP_SUFFIX, check_destination, fsync_directory, lock_temporary
from .errors import WriteError

__all__ = ["Outputs", "Staging", "check_outputs", "stage_name"]


@dataclass
class Outputs:
    """Output file names: `base` is the single-file name; shards and the index derive from it."""

    base: str  # e.g. out/model.safetensors
    fmt: str

    @property
    def index(self) -> str:
        return self.base + ".index.json"

    def shard(self, i: int, n: int) -> str:
        stem, ext = os.path.splitext(self.base)
        return f"{stem}-{i:05d}-of-{n:05d}{ext}"

    def stale(self) -> list[str]:
        """Files from an earlier sharded or single save of the same name (huggingface_hub's pattern)."""
        directory, name = os.path.split(os.path.abspath(self.base))
        stem, ext = os.path.splitext(name)
        pattern = re.compile(re.escape(stem) + r"(-\d{5}-of-\d{5})?" + re.escape(ext) + r"(\.index\.json)?")
        try:
            found = sorted(os.listdir(directory))
        except OSError:
            return []
        return [os.path.join(os.path.dirname(self.base), f) for f in found if pattern.fullmatch(f)]


def check_outputs(outputs: list[str], inputs: list[str], overwrite: bool) -> None:
    """Refuse an output that is one of the `inputs` (the source is never modified), or that
    exists when not `overwrite`."""
    for out in outputs:
        for src in inputs:
            if os.path.exists(out) and os.path.samefile(out, src):
                raise WriteError("is a file of the checkpoint being converted; write somewhere else "
                                 "(the source is never modified)", path=out, errno=errno.EINVAL)
        check_destination(out, overwrite)


def stage_name(final: str) -> str:
    """A staged output's name: a weightio temporary of `final` (see `remove_stale_temporaries`)."""
    directory, name = os.path.split(final)
    return os.path.join(directory, f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


class Staging:
    """Temporary output files, renamed into place together at `commit` or removed on failure.

    Each staged file stays locked (``flock``) from when it is complete until it is committed or
    discarded, as `atomic_write` locks a file being written: a convert killed before committing
    leaves temporaries whose lock is free, which `remove_stale_temporaries` can prove dead.
    """

    def __init__(self, overwrite: bool) -> None:
        self.overwrite = overwrite
        self.staged: list[tuple[str, str]] = []  # (temporary, final)
        self.created_dirs: list[str] = []
        self.locks: list[int] = []  # descriptors holding the staged files' locks

    def make_dirs(self, directory: str) -> None:
        missing = []
        while directory and not os.path.exists(directory):
            missing.append(directory)
            directory = os.path.dirname(directory.rstrip(os.sep))
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except OSError as e:
                raise WriteError(f"cannot create the directory: {e.strerror}", path=d, errno=e.errno) from e
            self.created_dirs.append(d)

    def path_for(self, final: str) -> str:
        temporary = stage_name(final)
        self.staged.append((temporary, final))
        return temporary

    def hold(self, temporary: str) -> None:
        """Lock a staged file now complete, until commit or discard (`lock_temporary`)."""
        fd = lock_temporary(temporary)
        if fd is not None:
            self.locks.append(fd)

    def _release(self) -> None:
        for fd in self.locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.locks = []

    def commit(self) -> list[str]:
        """Rename every staged file into place, in order (the index is staged last)."""
        done: list[str] = []
        try:
            for temporary, final in self.staged:
                if not self.overwrite and os.path.lexists(final):
                    raise WriteError("appeared while converting; not replaced", path=final, errno=errno.EEXIST)
                try:
                    os.replace(temporary, final)
                except OSError as e:  # named by the destination, like every other write failure
                    raise WriteError(f"cannot put the output in place: {e.strerror}", path=final,
                                     errno=e.errno) from None
                done.append(final)
        except BaseException:
            for final in done:  # a half-committed set is worse than none
                with contextlib.suppress(OSError):
                    os.unlink(final)
            raise
        finally:
            self._release()
        for directory in {os.path.dirname(os.path.abspath(f)) for f in done}:
            try:
                fsync_directory(directory)
            except OSError as e:  # the files are in place; only their durability is in doubt
                raise WriteError(f"the output is in place, but its directory could not be synced: {e.strerror}",
                                 path=directory, errno=e.errno) from None
        return done

    def discard(self) -> None:
        for temporary, _ in self.staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        self._release()
        for d in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                os.rmdir(d)
