"""The fuzz harnesses of tests/fuzz/fuzz.py: what they let out, their seeds, and a short bounded run each.

The harness logic is tested in-process (no atheris needed). The bounded runs start every
harness at once, each in its own process (libFuzzer owns the process and exits when done),
seeded from the fixtures, for at most `RUNS` inputs or `SECONDS` each, with a fixed libFuzzer
seed so that a run is repeatable. A finding makes libFuzzer exit non-zero and save the input;
the failure shows the traceback and the saved file. They are skipped where atheris is not
installed. Long runs, corpus, minimizing, replaying: tests/fuzz/README.md.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import weightio as wio
from weightio.errors import CorruptFileError, WeightioError

FUZZ = Path(__file__).resolve().parent / "fuzz" / "fuzz.py"
HARNESSES = ("safetensors", "npy", "npz", "pytorch_zip", "pytorch_legacy", "pytorch_tar", "gguf", "ggml",
             "cli_convert", "pytorch_differential", "safetensors_differential", "pytorch_placeholder", "huge")
RUNS, SECONDS = 1500, 6


def _load_fuzz_module():
    spec = importlib.util.spec_from_file_location("weightio_fuzz_harnesses", FUZZ)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz():
    return _load_fuzz_module()


@pytest.fixture(scope="module")
def bounded_runs(tmp_path_factory):
    """name -> (exit status, output, artifact directory): every harness run at once, then awaited."""
    pytest.importorskip("atheris")
    root = tmp_path_factory.mktemp("fuzz")
    started = {}
    for name in HARNESSES:
        log = open(root / f"{name}.log", "w")  # a file, not a pipe: eight chatty processes never block on a full pipe
        command = [sys.executable, str(FUZZ), name, f"-runs={RUNS}", f"-max_total_time={SECONDS}", "-seed=1",
                   f"-artifact_prefix={root}/{name}-", str(root / "corpus" / name)]
        started[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    results = {}
    for name, (process, log) in started.items():
        process.wait(timeout=600)
        log.close()
        results[name] = (process.returncode, (root / f"{name}.log").read_text(errors="replace"), root)
    return results


def test_the_harness_list_is_the_one_tested_here(fuzz):
    assert tuple(fuzz.HARNESSES) == HARNESSES


@pytest.mark.parametrize("name", [h for h in HARNESSES if h != "huge"])  # huge: seeds built, see below
def test_every_harness_has_fixture_seeds_of_its_format(fuzz, name):
    seeds = fuzz.seed_files(fuzz.HARNESSES[name])
    assert seeds, f"no fixture seeds the {name} harness"
    for path in seeds:
        assert path.is_file() and fuzz.FIXTURES in path.parents


@pytest.mark.parametrize("fixture", ["numpy/arrays.npz", "numpy/compressed.npz", "pytorch/views.pt"])
def test_zip64_seeds_read_exactly_like_their_fixtures(fuzz, tmp_path, fixture):
    data = (fuzz.FIXTURES / fixture).read_bytes()
    variant = fuzz.zip64_variant(data)
    assert variant[-22:-10] == b"PK\x05\x06" + bytes(4) + b"\xff" * 4 and b"PK\x06\x06" in variant
    path = tmp_path / fixture.split("/")[1]
    path.write_bytes(variant)
    with wio.open(path) as seeded, wio.open(fuzz.FIXTURES / fixture) as original:
        assert list(seeded) == list(original)
        for name in original:
            assert seeded[name].numpy().tobytes() == original[name].numpy().tobytes()


def test_seeding_copies_fixtures_and_zip64_forms_once(fuzz, tmp_path):
    corpus = tmp_path / "corpus"
    assert fuzz.seed(fuzz.HARNESSES["npz"], corpus) == 10  # fixtures/numpy (4) and fixtures/numpy_dtypes (6)
    names = sorted(p.name for p in corpus.iterdir())
    assert "seed-numpy_arrays.npz" in names and "zip64-seed-numpy_arrays.npz" in names and len(names) == 20
    assert "seed-numpy_dtypes_sparse_csr.npz" in names
    (corpus / "seed-numpy_arrays.npz").write_bytes(b"left as it is")
    fuzz.seed(fuzz.HARNESSES["npz"], corpus)
    assert (corpus / "seed-numpy_arrays.npz").read_bytes() == b"left as it is"


def test_only_weightio_errors_with_a_message_pass_the_harness(fuzz, tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"anything")

    def harness(error):
        def open_reader(file):
            file.close()
            raise error

        return fuzz.Harness(open_reader, lambda fmt, head: False, 64, "x.bin")

    fuzz.run_one(harness(CorruptFileError("forged count", path=str(path))), str(path))  # allowed out: swallowed
    with pytest.raises(ValueError, match="bare"):
        fuzz.run_one(harness(ValueError("bare")), str(path))
    with pytest.raises(AssertionError, match="WeightioError with an empty message"):
        fuzz.run_one(harness(WeightioError("")), str(path))


def test_a_file_that_cannot_be_mapped_is_a_finding(fuzz, tmp_path):
    """Issue 12, class 7: a regular file refused for lack of memory (a mapping that commits memory)."""
    from weightio.errors import InputError

    path = tmp_path / "x.bin"
    path.write_bytes(b"anything")

    def refused(file):
        file.close()
        raise InputError("cannot map file: Cannot allocate memory", path=str(path))

    with pytest.raises(AssertionError, match="a readable file could not be mapped"):
        fuzz.run_one(fuzz.Harness(refused, lambda fmt, head: False, 64, "x.bin"), str(path))


@pytest.mark.skipif(sys.platform != "linux", reason="sparse files and /proc/self/smaps")
def test_the_huge_harness_seeds_open_as_files_larger_than_memory(fuzz, tmp_path):
    """Each seed plus the hole is one tensor of more than 4x this machine's memory whose first
    stored bytes are the seed's last 16; the harness opens, lists and reads it end to end."""
    harness = fuzz.HARNESSES["huge"]
    assert harness.hole >= 64 << 30
    assert fuzz.seed(harness, tmp_path / "corpus") == 3
    scratch = fuzz.Scratch(harness.suffix, harness.hole)
    try:
        for seed in sorted((tmp_path / "corpus").iterdir()):
            try:
                path = scratch.write(seed.read_bytes())
            except OSError as e:
                pytest.skip(f"no sparse file of {harness.hole >> 30} GiB here: {e}")
            with wio.open(path) as ckpt:
                (name,) = list(ckpt)
                view = ckpt[name]
                assert view.nbytes == 16 + harness.hole, seed.name
                assert bytes(view.raw()[:16]) == b"weightio-far-end" and view.raw()[-1] == 0, seed.name
            fuzz.run_one(harness, path)
    finally:
        shutil.rmtree(scratch.dir, ignore_errors=True)


def test_replay_runs_a_corpus_without_libfuzzer_and_counts_findings(fuzz, tmp_path, capsys):
    assert fuzz.replay_inputs(fuzz.HARNESSES["gguf"], [str(fuzz.FIXTURES / "gguf")]) == 0
    (tmp_path / "one").write_bytes(b"GGUF")

    def broken(file):
        file.close()
        raise KeyError("bare")

    assert fuzz.replay_inputs(fuzz.Harness(broken, lambda f, h: False, 64, "x.gguf"), [str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"FINDING {tmp_path / 'one'}" in err and "KeyError: 'bare'" in err and "1 inputs: 1 findings" in err


def test_the_harness_reads_every_tensor_of_a_real_file(fuzz, tmp_path):
    source = fuzz.FIXTURES / "gguf" / "all_types.gguf"
    path = tmp_path / "all_types.gguf"
    path.write_bytes(source.read_bytes())
    fuzz.run_one(fuzz.HARNESSES["gguf"], str(path))  # numpy(), raw() and slices of 37 tensors agree


def test_the_scratch_file_is_replaced_not_rewritten(fuzz):
    scratch = fuzz.Scratch("input.npy")
    try:
        first = scratch.write(b"one")
        with open(first, "rb") as held:  # an earlier input still open (or mapped) keeps its bytes
            second = scratch.write(b"second input")
            assert held.read() == b"one"
        assert second == first and Path(second).read_bytes() == b"second input"
    finally:
        shutil.rmtree(scratch.dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", HARNESSES)
def test_a_short_bounded_run_finds_nothing(bounded_runs, name):
    status, output, root = bounded_runs[name]
    crashes = sorted(p.name for p in root.glob(f"{name}-*"))
    assert status == 0, f"{name} harness exited with {status}; saved: {crashes}\n{output[-6000:]}"
    assert "INITED" in output and "fixture seeds" in output
    assert not crashes
