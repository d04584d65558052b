"""A checkpoint changed on disk while it is open (weightio/_io.py, docs/security.md "Files changed under us").

The policy: every access through an open checkpoint first compares the file's size and
modification time with those seen at open. Truncated, grown or rewritten in place: the next
access raises `CorruptFileError` ("… since it was opened"), instead of touching pages that no
longer exist (SIGBUS). Replaced by a rename: the open checkpoint keeps serving the original bytes
(its descriptor and mapping hold the old inode). An array handed out *before* the file was
truncated cannot be protected: touching its lost pages is SIGBUS; the CLI enables faulthandler,
so the process at least says so. Every case runs in a subprocess and asserts its exit status
and output: a SIGBUS must never take the test run down with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import weightio as wio
from weightio._io import MappedFile
from weightio.errors import CorruptFileError

from .conftest import FIXTURES

# (fixture, a tensor in it) for every format
SOURCES = [("tiny-bert/model.safetensors", "embeddings.word_embeddings.weight"),
           ("numpy/c_order.npy", "c_order"), ("numpy/arrays.npz", "c_order"),
           ("pytorch/legacy_tar.pt", "fc.weight"), ("pytorch/resnet18_like.pth", "conv1.weight"),
           ("pytorch/protocol2_legacy.pt", "w"), ("gguf/all_types.gguf", "f32"),
           ("gguf/quantized.gguf", "w.q4_0"), ("ggml/ggjt_v3.bin", "tok_embeddings.weight")]

SCRIPT = textwrap.dedent("""
    import os, sys, time, numpy as np, weightio as wio
    action = sys.argv[1]

    def change(path, size):
        if action == "truncate":
            os.truncate(path, size // 2)
        elif action == "grow":
            with open(path, "ab") as f:
                f.write(b"appended")
        elif action == "rewrite":  # same size, other bytes, in place (the inode stays)
            with open(path, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.write(bytes(255 - b for b in data))
        elif action == "touch":
            os.utime(path)
        elif action == "replace":  # a new file renamed over the path
            with open(path + ".new", "wb") as f:
                f.write(b"\\0" * size)
            os.replace(path + ".new", path)

    for job in sys.argv[2:]:
        path, name, then = (job.split("|") + [""])[:3]
        past = time.time() - 3600
        os.utime(path, (past, past))  # so that a rewrite changes the modification time whatever its granularity
        ckpt = wio.open(path)
        before = ckpt[name].numpy().copy()
        change(path, os.path.getsize(path))
        try:
            after = ckpt[then or name].numpy()
        except wio.WeightioError as e:
            print(type(e).__name__, str(e))
            continue
        print("served", np.array_equal(before, after, equal_nan=True))
""")


def _run(tmp_path: Path, action: str, jobs: list[tuple[str, ...]]) -> list[str]:
    """In one subprocess, for each (source, name[, other]): open a copy of `source`, read `name`,
    change the file by `action`, read `name` (or `other`) again. One output line per job."""
    args = []
    for k, (source, name, *then) in enumerate(jobs):
        path = tmp_path / str(k) / Path(source).name  # the file name is the tensor name of an .npy
        path.parent.mkdir(exist_ok=True)
        path.write_bytes((FIXTURES / source).read_bytes())
        args.append("|".join([str(path), name, *then]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, action, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(jobs), proc.stdout
    return lines


def test_a_truncated_file_is_refused_on_the_next_access(tmp_path):
    for (source, _), line in zip(SOURCES, _run(tmp_path, "truncate", SOURCES), strict=True):
        size = (FIXTURES / source).stat().st_size
        assert line.startswith("CorruptFileError ") and line.endswith(
            f": was truncated from {size} to {size // 2} bytes since it was opened; reading its lost pages would "
            "crash the process (SIGBUS): its bytes are no longer the ones that were validated. Open it again"), line


def test_a_file_rewritten_in_place_is_refused_on_the_next_access(tmp_path):
    for source, line in zip(SOURCES, _run(tmp_path, "rewrite", SOURCES), strict=True):
        assert line.endswith(": was rewritten in place since it was opened (same size, new modification time): "
                             "its bytes are no longer the ones that were validated. Open it again"), (source, line)


def test_a_file_replaced_by_a_rename_keeps_serving_the_original(tmp_path):
    assert _run(tmp_path, "replace", SOURCES) == ["served True"] * len(SOURCES)


@pytest.mark.parametrize("action", ["truncate", "rewrite"])
def test_inflated_members_are_private_copies_and_the_others_are_refused(tmp_path, action):
    served, refused = _run(tmp_path, action, [("numpy/compressed_big.npz", "ramp"),
                                              ("numpy/compressed_big.npz", "ramp", "zeros")])
    assert served == "served True"  # inflated before the change: a copy in memory, still the validated bytes
    assert refused.startswith("CorruptFileError ") and "since it was opened" in refused


def test_a_file_that_grew_or_was_touched_is_refused_on_the_next_access(tmp_path):
    """The modification time is all that says a same-size rewrite happened: a bare touch is refused too."""
    size = (FIXTURES / SOURCES[0][0]).stat().st_size
    (grown,) = _run(tmp_path, "grow", SOURCES[:1])
    assert f"grew from {size} to {size + 8} bytes since it was opened" in grown
    (touched,) = _run(tmp_path, "touch", SOURCES[:1])
    assert "was rewritten in place" in touched


def test_header_reads_past_a_truncation_fail_cleanly(tmp_path):
    """Header reads use pread, which cannot fault: bytes that are gone come back short, an error."""
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(1000))
    f = MappedFile(path)
    try:
        assert f.read(0, 10, "a field") == bytes(10)
        os.truncate(path, 100)
        with pytest.raises(CorruptFileError, match=r"file shrank while reading a field \(now ends at 100\)"):
            f.read(90, 20, "a field")
        with pytest.raises(CorruptFileError, match="was truncated from 1000 to 100 bytes since it was opened"):
            _ = f.data
    finally:
        f.close()


def test_a_replaced_file_opened_again_is_the_new_one(tmp_path):
    path = tmp_path / "m.safetensors"
    wio.save({"w": __import__("numpy").arange(4.0)}, path)
    with wio.open(path) as old:
        wio.save({"w": __import__("numpy").arange(4.0) * 2}, path, overwrite=True)  # atomic: a rename
        with wio.open(path) as new:
            assert old["w"].numpy().tolist() == [0, 1, 2, 3] and new["w"].numpy().tolist() == [0, 2, 4, 6]


# ----------------------------------------------------------------------------- arrays already handed out

HELD = textwrap.dedent("""
    import os, sys, weightio as wio
    path, name = sys.argv[1], sys.argv[2]
    if sys.argv[3] == "faulthandler":
        import faulthandler
        faulthandler.enable()
    arr = wio.open(path)[name].numpy()  # a zero-copy view of the mapping, handed out
    os.truncate(path, 0)
    print("touching", flush=True)
    print(float(arr.sum()))  # its pages are gone: SIGBUS
""")


@pytest.mark.parametrize("faulthandler", [False, True])
def test_an_array_handed_out_before_truncation_dies_of_sigbus(tmp_path, faulthandler):
    """What no mmap loader can prevent, documented: the process dies of SIGBUS (silently, unless
    faulthandler is on, as in the CLI)."""
    path = tmp_path / "model.safetensors"
    path.write_bytes((FIXTURES / SOURCES[0][0]).read_bytes())
    proc = subprocess.run([sys.executable, "-c", HELD, str(path), SOURCES[0][1],
                           "faulthandler" if faulthandler else "plain"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGBUS
    assert proc.stdout == "touching\n"
    assert ("Fatal Python error: Bus error" in proc.stderr) == faulthandler, proc.stderr


CLI = textwrap.dedent("""
    import os, sys
    import weightio.cli.show as show
    from weightio.cli import main
    path, name, when = sys.argv[1], sys.argv[2], sys.argv[3]
    real = show.tensor_stats

    def stats_after_truncation(view):
        if when == "before":  # truncated before the command reads the tensor: a clean refusal
            os.truncate(path, 0)
            return real(view)
        arr = view.numpy()  # truncated while the command holds the array: SIGBUS, with a message
        os.truncate(path, 0)
        return float(arr.sum())

    show.tensor_stats = stats_after_truncation
    main(["show", path, name], prog_name="weightio")
""")


def test_the_cli_refuses_a_file_truncated_before_it_reads(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes((FIXTURES / SOURCES[0][0]).read_bytes())
    proc = subprocess.run([sys.executable, "-c", CLI, str(path), SOURCES[0][1], "before"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"weightio: error: {path}: was truncated from ")
    assert "Traceback" not in proc.stderr


def test_the_cli_says_what_happened_when_sigbus_kills_it(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes((FIXTURES / SOURCES[0][0]).read_bytes())
    proc = subprocess.run([sys.executable, "-c", CLI, str(path), SOURCES[0][1], "while"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in proc.stderr
    assert "stats_after_truncation" in proc.stderr  # the traceback says where


@pytest.mark.parametrize("reused_by", ["the same file", "another file"])
@pytest.mark.parametrize("access", ["data", "check"])
def test_a_file_closed_during_its_check_says_closed_even_when_its_descriptor_is_reused(
        tmp_path, monkeypatch, reused_by, access):
    """`close` on another thread between the `fstat` and the test of `_closed`, and the descriptor
    number opened again meanwhile (on the same file, whose stamp then matches; or on another): the
    access says "closed", never hands out the mapping or calls the file changed."""
    from weightio import _io
    from weightio.errors import WeightioError

    path, other = tmp_path / "a.bin", tmp_path / "b.bin"
    path.write_bytes(b"x" * 100)
    other.write_bytes(b"y" * 200)
    file = MappedFile(str(path))
    mapping = file.data  # (mapped before the race: the property's own path, not the first map)
    real, opened = _io.file_stamp, []

    def closing_then_stamping(fd):
        monkeypatch.setattr(_io, "file_stamp", real)
        file.close()
        reopened = os.open(path if reused_by == "the same file" else other, os.O_RDONLY)
        if reopened != fd:  # (a collection during close may have freed a lower number)
            os.dup2(reopened, fd)
            os.close(reopened)
        opened.append(fd)
        return real(fd)

    monkeypatch.setattr(_io, "file_stamp", closing_then_stamping)
    try:
        with pytest.raises(wio.WeightioError) as info:
            file.data if access == "data" else file.check()  # noqa: B018 - the property is the access
        assert type(info.value) is WeightioError
        assert str(info.value) == f"{path}: the checkpoint was closed; open it again to read tensors"
    finally:
        for fd in opened:
            os.close(fd)
    assert mapping[0] == ord("x")
