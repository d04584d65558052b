"""Crash-safe writes: `weightio convert` killed with SIGKILL at any point, disks that fill up, and
the stale temporaries a kill leaves (and who may remove them).

Kill points. A forked child runs ``weightio convert`` with its file operations counted (creating
a temporary, each write, split in two so a tensor can be half-written, each fsync, each rename
and its aftermath, each unlink and mkdir) and kills itself with SIGKILL at event k: exactly an
outside SIGKILL landing there, with no cleanup, no ``finally``, no atexit. A dry run counts the
events of each scenario; a seeded sample of them (always the first and the last few, where files
are created and renamed) runs in the normal suite, every one of them with
``WEIGHTIO_CRASH_POINTS=all`` (or a number: that many per scenario). Separately, a real
``weightio convert`` process is killed from outside after seeded random delays.

After every kill: the source is byte-identical; the destination is absent, or byte-identical to
what an uninterrupted run writes (the previous destination, for ``--force`` over an existing
file); a sharded output is committed by its index: without the index, only complete shards;
nothing else is left but recognisable temporaries (``.*.weightio-tmp``, convert's staged files
included), and `remove_stale_temporaries` (which the next convert runs) removes every one of
them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from weightio.cli import main

import weightio as wio
from weightio import _outputs
from weightio._outputs import TEMP_SUFFIX, atomic_write, remove_stale_temporaries
from weightio.errors import WriteError

from .conftest import FIXTURES

TEMPORARY = re.compile(r"^\.\.?.+\.weightio-(tmp|stage)$")
SAMPLE = 12  # kill points per scenario in the normal suite (besides the first 2 and the last 6)
TIMED_KILLS = 4  # outside SIGKILLs of a real `weightio convert` in the normal suite


def _points_wanted() -> int | None:
    """None: every event; else how many sampled kill points per scenario."""
    text = os.environ.get("WEIGHTIO_CRASH_POINTS", "")
    if text == "all":
        return None
    return int(text) if text else SAMPLE


# ----------------------------------------------------------------------------- the instrumented child


class _Events:
    """Counts file operations in a forked child and kills it (SIGKILL) at event `kill_at`."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at, self.count = kill_at, 0

    def __call__(self) -> None:
        self.count += 1
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class _Crashing:
    """A file whose writes are two events each (the first half, then the rest)."""

    def __init__(self, raw, events: _Events) -> None:
        self._raw, self._events = raw, events

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for part in (view[: len(view) // 2], view[len(view) // 2:]):
            self._events()
            while part:
                part = part[self._raw.write(part):]
        return len(view)

    def __getattr__(self, name: str):
        return getattr(self._raw, name)


def _instrument(events: _Events) -> None:
    """Route every file operation of the writers through `events` (in this forked child only)."""
    real_atomic = _outputs.atomic_write

    @contextlib.contextmanager
    def atomic(path, **kwargs) -> Iterator:
        with real_atomic(path, **kwargs) as raw:
            yield _Crashing(raw, events)

    import weightio.convert
    import weightio.formats.numpy
    import weightio.formats.safetensors

    for module in (_outputs, weightio.formats.safetensors, weightio.formats.numpy, weightio.convert):
        module.atomic_write = atomic
    for module, name in ((os, "replace"), (os, "fsync"), (os, "unlink"), (os, "mkdir"), (tempfile, "mkstemp")):
        real = getattr(module, name)

        def counted(*args, _real=real, **kwargs):
            events()
            result = _real(*args, **kwargs)
            events()  # and just after it: a rename done but not yet followed by the directory fsync
            return result

        setattr(module, name, counted)


def _forked(job: Callable[[], str]) -> tuple[int, str]:
    """Run `job` in a forked child that never returns into pytest; (signal that ended it or 0, what it returned).

    The child's exit status must be 0 unless a signal ended it (a traceback is printed otherwise).
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(read)
            os.write(write, job().encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status), ""
    assert os.WEXITSTATUS(status) == 0, f"the child failed (exit {os.WEXITSTATUS(status)})"
    return 0, out


def _run_child(kill_at: int, args: list[str]) -> tuple[int, int]:
    """Fork a child that runs ``weightio convert ARGS`` killing itself at event `kill_at` (0: never).

    Returns (signal that ended it or 0, events it counted when it finished).
    """

    def convert() -> str:
        events = _Events(kill_at)
        _instrument(events)
        main(["convert", *args, "-q"], prog_name="weightio", standalone_mode=False)
        return str(events.count)

    signum, out = _forked(convert)
    return signum, int(out) if not signum else 0


# ----------------------------------------------------------------------------- scenarios


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(directory: Path) -> dict[str, str]:
    return {p.name: _digest(p) for p in sorted(directory.iterdir()) if p.is_file()}


class Scenario:
    """One conversion: where it reads, what it writes, and what a finished run leaves."""

    def __init__(self, name: str, src: Path, dst: str, options: list[str] = (), previous: bytes | None = None):
        self.name, self.src, self.dst, self.options, self.previous = name, src, dst, list(options), previous

    def prepare(self, root: Path) -> tuple[Path, list[str]]:
        """A fresh output directory (holding the previous destination, if any) and the CLI arguments."""
        out = root / "out"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        if self.previous is not None:
            (out / self.dst).write_bytes(self.previous)
        dst = str(out / self.dst) + ("/" if self.dst.endswith("/") else "")
        return out, [str(self.src), dst, *self.options]


SCENARIOS = [
    Scenario("safetensors", FIXTURES / "tiny-bert", "model.safetensors"),
    Scenario("sharded", FIXTURES / "tiny-bert", "sharded/", ["--max-shard-size", "25kB"]),
    Scenario("npz", FIXTURES / "tiny-bert", "model.npz"),
    Scenario("gguf", FIXTURES / "tiny-bert", "model.gguf", ["--dtype", "fp16"]),
    Scenario("overwrite", FIXTURES / "numpy.safetensors", "model.safetensors", ["--force", "--verify"],
             previous=(FIXTURES / "dtypes.safetensors").read_bytes()),
]


def _finished(scenario: Scenario, root: Path) -> dict[str, str]:
    """The files an uninterrupted run writes (relative path -> sha256)."""
    out, args = scenario.prepare(root)
    assert _run_child(0, args)[0] == 0
    return {str(p.relative_to(out)): _digest(p) for p in sorted(out.rglob("*")) if p.is_file()}


def _check_after_kill(scenario: Scenario, out: Path, finished: dict[str, str], source: dict[str, str],
                      kill_at: int) -> None:
    where = f"{scenario.name}, killed at event {kill_at}"
    assert (_tree(scenario.src) if scenario.src.is_dir() else {scenario.src.name: _digest(scenario.src)}) == source
    found = {str(p.relative_to(out)): p for p in sorted(out.rglob("*")) if p.is_file()}
    for name, path in found.items():
        if TEMPORARY.match(path.name):
            continue
        assert name in finished, f"{where}: unexpected file {name}"
        if name == scenario.dst and scenario.previous is not None and _digest(path) != finished[name]:
            assert path.read_bytes() == scenario.previous, f"{where}: the previous destination changed"
        else:
            assert _digest(path) == finished[name], f"{where}: {name} differs from an uninterrupted run's"
    index = [n for n in finished if n.endswith(".index.json")]
    if index and index[0] in found:  # the index is the commit point: everything it names is there
        assert set(finished) <= set(found), f"{where}: the index exists but shards are missing"
    removed = remove_stale_temporaries(out / scenario.dst)
    assert all(p.endswith(TEMP_SUFFIX) for p in removed)
    left = [p.name for p in out.rglob("*") if p.name.endswith(TEMP_SUFFIX)]
    assert left == [], f"{where}: temporaries survived the cleanup: {left}"


def _kill_points(total: int, wanted: int | None, seed: str) -> list[int]:
    events = range(1, total + 1)
    if wanted is None or total <= wanted + 8:
        return list(events)
    rng = random.Random(seed)
    return sorted({1, 2, *range(total - 5, total + 1), *rng.sample(range(3, total - 5), wanted)})


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_sigkill_at_any_point_leaves_the_destination_absent_or_complete(tmp_path, scenario):
    source = _tree(scenario.src) if scenario.src.is_dir() else {scenario.src.name: _digest(scenario.src)}
    finished = _finished(scenario, tmp_path)
    _, args = scenario.prepare(tmp_path)
    total = _run_child(0, args)[1]
    assert total > 10
    tried = 0
    for kill_at in _kill_points(total, _points_wanted(), f"weightio-crash-{scenario.name}"):
        out, args = scenario.prepare(tmp_path)
        stopped, _ = _run_child(kill_at, args)
        assert stopped == signal.SIGKILL, f"event {kill_at} of {total} was never reached"
        _check_after_kill(scenario, out, finished, source, kill_at)
        tried += 1
    print(f"{scenario.name}: {tried} kill points of {total} file events")  # shown with -s


# ----------------------------------------------------------------------------- a real process, killed from outside


def _big_source(path: Path) -> Path:
    rng = np.random.default_rng(0)
    wio.save({f"layer.{i}.weight": rng.standard_normal((256, 1024), dtype=np.float32) for i in range(24)}, path)
    return path


def test_a_real_convert_process_killed_from_outside(tmp_path):
    src = _big_source(tmp_path / "src.safetensors")
    before = _digest(src)
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "weightio.cli", "convert", str(src), str(out / "dst.safetensors"), "--verify",
               "-q"]
    start = time.perf_counter()
    subprocess.run(command, check=True, timeout=120)
    duration = time.perf_counter() - start
    finished = _digest(out / "dst.safetensors")
    rng = random.Random("weightio-crash-timed")
    kills = int(os.environ.get("WEIGHTIO_CRASH_TIMED", TIMED_KILLS))
    for delay in sorted(rng.uniform(0.05, duration) for _ in range(kills)):
        shutil.rmtree(out)
        out.mkdir()
        proc = subprocess.Popen(command)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert _digest(src) == before
        for path in out.iterdir():
            assert path.name == "dst.safetensors" and _digest(path) == finished or TEMPORARY.match(path.name), path
        remove_stale_temporaries(out / "dst.safetensors")
        assert not [p for p in out.iterdir() if p.name.endswith(TEMP_SUFFIX)]
    print(f"timed: {kills} outside kills over {duration:.2f} s")  # shown with -s


# ----------------------------------------------------------------------------- disks that fill up


def _in_child(job: Callable[[], object], *, fsize: int | None = None) -> dict:
    """Run `job` in a forked child (optionally under RLIMIT_FSIZE); its WriteError or result as a dict."""
    import resource

    def limited() -> str:
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then the kernel fails the write with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        try:
            job()
            return json.dumps({"ok": True})
        except WriteError as e:
            return json.dumps({"errno": e.errno, "message": str(e)})

    signum, out = _forked(limited)
    assert signum == 0, f"the child was killed by signal {signum}"
    return json.loads(out)


BIG = {f"w{i}": np.full(50_000, i, np.float32) for i in range(4)}  # 200 kB each


def _writers(src: Path) -> dict[str, Callable[[Path], object]]:
    from weightio.convert import convert

    return {
        "safetensors": lambda out: wio.save(BIG, out / "x.safetensors"),
        "npz": lambda out: wio.save(BIG, out / "x.npz"),
        "npy": lambda out: wio.save({"w": BIG["w0"]}, out / "x.npy"),
        "gguf": lambda out: wio.save(BIG, out / "x.gguf"),
        "gguf Q8_0": lambda out: wio.save({"w": np.ones((5000, 64), np.float32)}, out / "x.gguf", types="Q8_0"),
        "convert, sharded": lambda out: convert(src, str(out / "sharded") + "/", max_shard_size="300kB"),
        "convert, npz": lambda out: convert(src, out / "x.npz", verify=True),
    }


@pytest.mark.parametrize("writer", ["safetensors", "npz", "npy", "gguf", "gguf Q8_0", "convert, sharded",
                                    "convert, npz"])
def test_file_size_limit_fails_every_writer_cleanly(tmp_path, writer):
    """RLIMIT_FSIZE (what a full disk looks like to a process, but EFBIG): a WriteError with the
    errno, and nothing left behind: no file, no temporary, no directory the writer created."""
    src = tmp_path / "src.safetensors"
    wio.save(BIG, src)
    out = tmp_path / "out"
    out.mkdir()
    report = _in_child(lambda: _writers(src)[writer](out), fsize=150_000)
    assert report.get("errno") == errno.EFBIG, report
    assert "write failed: File too large" in report["message"]
    assert list(out.iterdir()) == []


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 512 kB tmpfs (needs root, as in a container); skipped where mounting is not allowed."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.parametrize("writer", ["safetensors", "npz", "gguf", "convert, sharded", "convert, npz"])
def test_a_full_filesystem_fails_every_writer_cleanly(tmp_path, tiny_filesystem, writer):
    src = tmp_path / "src.safetensors"
    wio.save({**BIG, **{f"v{i}": np.zeros(50_000, np.float32) for i in range(4)}}, src)  # 1.6 MB: never fits
    ballast = tiny_filesystem / "ballast"
    ballast.write_bytes(bytes(128 << 10))  # someone else's file, which must survive
    with pytest.raises(WriteError) as info:
        writers = _writers(src)
        writers["safetensors"] = lambda out: wio.save({**BIG, "more": np.zeros(200_000, np.float32)},
                                                      out / "x.safetensors")
        writers["npz"] = lambda out: wio.save({**BIG, "more": np.zeros(200_000, np.float32)}, out / "x.npz")
        writers["gguf"] = lambda out: wio.save({**BIG, "more": np.zeros(200_000, np.float32)}, out / "x.gguf")
        writers[writer](tiny_filesystem)
    assert info.value.errno == errno.ENOSPC
    assert "No space left on device" in str(info.value)
    assert [p.name for p in tiny_filesystem.iterdir()] == ["ballast"] and ballast.stat().st_size == 128 << 10


@pytest.mark.parametrize("writer", ["safetensors", "convert, sharded"])
def test_a_read_only_destination_fails_before_any_tensor_is_read(tmp_path, writer):
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    src = tmp_path / "src.safetensors"
    wio.save(BIG, src)
    try:
        from weightio.view import TensorView

        read = []
        real = TensorView.numpy
        TensorView.numpy = lambda self: read.append(self.name) or real(self)
        try:
            with pytest.raises(WriteError) as info:
                _writers(src)[writer](mount)
        finally:
            TensorView.numpy = real
        assert info.value.errno == errno.EROFS and "Read-only file system" in str(info.value)
        assert read == [] and list(mount.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_link_to_the_source_is_never_a_destination(tmp_path):
    src = tmp_path / "model.safetensors"
    src.write_bytes((FIXTURES / "numpy.safetensors").read_bytes())
    (tmp_path / "hard.safetensors").hardlink_to(src)
    (tmp_path / "soft.safetensors").symlink_to(src)
    from weightio.convert import convert

    for alias in ("hard.safetensors", "soft.safetensors", "./model.safetensors"):
        with pytest.raises(WriteError, match="is a file of the checkpoint being converted"):
            convert(src, tmp_path / alias, overwrite=True)
    assert src.read_bytes() == (FIXTURES / "numpy.safetensors").read_bytes()


# ----------------------------------------------------------------------------- stale temporaries


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(TEMP_SUFFIX))


def test_a_temporary_being_written_is_never_removed(tmp_path):
    target = tmp_path / "model.safetensors"
    with atomic_write(target) as f:
        f.write(b"half")
        (live,) = _temporaries(tmp_path)
        assert live.startswith(".model.safetensors.")
        assert remove_stale_temporaries(target) == [] and remove_stale_temporaries(tmp_path) == []
    assert target.read_bytes() == b"half" and _temporaries(tmp_path) == []


def test_the_temporary_of_a_killed_writer_is_removed(tmp_path):
    target = tmp_path / "model.safetensors"

    def killed() -> None:
        with atomic_write(target) as f:
            f.write(b"half of it")
            os.kill(os.getpid(), signal.SIGKILL)

    pid = os.fork()
    if pid == 0:
        try:
            killed()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    (stale,) = _temporaries(tmp_path)
    assert not target.exists()
    assert remove_stale_temporaries(target) == [str(tmp_path / stale)]
    assert _temporaries(tmp_path) == []


def test_a_temporary_held_by_another_live_process_is_kept(tmp_path):
    target = tmp_path / "model.safetensors"
    ready, done = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with atomic_write(target) as f:
                f.write(b"slow")
                os.write(ready[1], b"x")
                os.read(done[0], 1)  # hold the temporary until the parent has tried to remove it
        finally:
            os._exit(0)
    os.read(ready[0], 1)
    try:
        assert len(_temporaries(tmp_path)) == 1
        assert remove_stale_temporaries(target) == []
        assert len(_temporaries(tmp_path)) == 1
    finally:
        os.write(done[1], b"x")
        os.waitpid(pid, 0)
    assert target.read_bytes() == b"slow" and _temporaries(tmp_path) == []


def test_only_the_destinations_own_dead_temporaries_are_candidates(tmp_path):
    dead = [".model.safetensors.k2j4x9aa.weightio-tmp", "..model.safetensors.1a2b3c4d.weightio-stage.x.weightio-tmp",
            ".model-00001-of-00002.safetensors.abc.weightio-tmp"]
    kept = [".other.safetensors.abc.weightio-tmp", "model.safetensors.abc.weightio-tmp",  # another name; no dot
            "...model.safetensors.abc.weightio-tmp", ".model.safetensors.abc.weightio-stage", "model.safetensors"]
    for name in dead + kept:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".model.safetensors.dir.weightio-tmp").mkdir()
    target = tmp_path / "victim"
    target.write_bytes(b"not ours")
    (tmp_path / ".model.safetensors.link.weightio-tmp").symlink_to(target)
    removed = remove_stale_temporaries(tmp_path / "model.safetensors")
    assert sorted(Path(p).name for p in removed) == sorted(dead)
    assert all((tmp_path / name).exists() for name in kept) and target.read_bytes() == b"not ours"
    assert (tmp_path / ".model.safetensors.link.weightio-tmp").is_symlink()
    assert [Path(p).name for p in remove_stale_temporaries(tmp_path)] == [".other.safetensors.abc.weightio-tmp"]


def test_convert_removes_the_temporaries_of_a_killed_convert_and_says_so(tmp_path):
    out = tmp_path / "model.safetensors"
    stale = tmp_path / ".model.safetensors.deadbeef.weightio-tmp"
    stale.write_bytes(b"half a file")
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["convert", str(FIXTURES / "numpy.safetensors"), str(out)])
    assert result.exit_code == 0, result.output
    assert "note: removed 1 temporary file(s) an interrupted write left: .model.safetensors.deadbeef.weightio-tmp" \
        in result.output
    assert not stale.exists() and wio.load(out)["weight"].shape == (4, 5)


def test_a_staged_output_stays_locked_until_it_is_committed(tmp_path, monkeypatch):
    """convert's complete-but-uncommitted files are never mistaken for a killed run's leftovers."""
    from weightio import _staging
    from weightio import convert as convert_module

    seen: list[list[str]] = []
    real_commit = _staging.Staging.commit

    def commit(self):
        seen.append(remove_stale_temporaries(tmp_path / "model.safetensors"))  # another convert's cleanup, now
        return real_commit(self)

    monkeypatch.setattr(_staging.Staging, "commit", commit)
    convert_module.convert(FIXTURES / "tiny-bert", tmp_path / "model.safetensors", max_shard_size="40KB")
    assert seen == [[]]  # every staged shard and the index were locked: nothing was removed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
         "model.safetensors.index.json"])
