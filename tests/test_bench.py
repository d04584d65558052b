"""Every benchmark suite in bench/ still runs: tiny files, one repetition, nothing written.

The suites reach into weightio's internals (bench/pytorch.py times the open step by step) and
are run by hand, so an API change can break one unnoticed; this runs each end to end on files
of a few MB (all five at once, each in its own process and scratch directory) and checks that
it prints its side-by-side table and its target checklist. The figures mean nothing at this
size and are not looked at. Needs the peers the suites compare against (torch, safetensors, gguf).

Marked ``bench``: the default run leaves it out (it is half the suite's time); run it with
``python -m pytest -m bench`` (CI does, in a step of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITES = {  # suite -> its own options, kept small
    "foundation": [],
    "pytorch": ["--many", "2000"],
    "varbuilder": [],
    "cli": [],
    "gguf": ["--elements", "4096", "--types", "Q4_0,IQ2_XXS,Q8_K"],
    "remote": ["--shards", "8", "--delay", "0.005"],
    "scale": ["--counts", "500,2000"],  # both frontier layouts: sparse files, headers only
    "memory": [],  # its peers (tensorizer, Run:ai, fastsafetensors) are optional: missing ones are rows saying so
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """suite -> (exit status, output): every suite started at once, then awaited."""
    for module in ("torch", "safetensors", "gguf", "fsspec", "aiohttp", "s3fs", "moto.server", "huggingface_hub"):
        pytest.importorskip(module)
    root = tmp_path_factory.mktemp("bench")
    started = {}
    for suite, options in SUITES.items():
        log = open(root / f"{suite}.log", "w")  # a file, not a pipe: no child blocks on a full pipe
        env = dict(os.environ, WEIGHTIO_BENCH_DIR=str(root / suite))
        command = [sys.executable, str(ROOT / "bench" / f"{suite}.py"), *options, "--gib", "0.005", "--reps", "1",
                   "--no-write"]
        started[suite] = (subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    results = {}
    for suite, (process, log) in started.items():
        process.wait(timeout=600)
        log.close()
        results[suite] = (process.returncode, (root / f"{suite}.log").read_text(errors="replace"), root / suite)
    return results


@pytest.fixture(scope="module")
def published():
    """docs/benchmarks.md as it was before the suites ran."""
    return (ROOT / "docs" / "benchmarks.md").read_bytes()


@pytest.mark.bench
@pytest.mark.parametrize("suite", list(SUITES))
def test_the_suite_runs_and_reports_side_by_side(published, runs, suite):
    status, output, _ = runs[suite]
    assert status == 0, output[-6000:]
    table = [line for line in output.splitlines() if line.startswith("| ")]
    assert any("weightio" in line for line in table) and len(table) >= 5, output[-3000:]
    checks = output.split("Targets (from the issue):", 1)
    assert len(checks) == 2 and "- [" in checks[1], output[-3000:]
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == published  # --no-write: the docs are left alone


@pytest.mark.bench
def test_the_gpu_suite_says_where_it_cannot_run():
    # bench/gpu.py runs on a CUDA machine only (docs/benchmarks.md "GPU"); elsewhere it says so,
    # generates and writes nothing
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the suite would run for real")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--reps", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "no CUDA GPU here: the GPU rows stay unmeasured", out
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_profile.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "no CUDA GPU here: nothing to profile", out


@pytest.mark.bench
def test_remote_bench_moves_only_the_bytes_asked_for(runs):
    """bench/remote.py's byte targets that hold, from the server-side counts it saved (remote-results.json).

    The loopback servers counted every body byte: opening a safetensors or .npy file moves at most its
    header + 64 KiB of the file over every scheme (besides the Hub's small API answers for hf://), in
    at most 4 requests one after another; reading one tensor moves at most its bytes + 64 KiB for
    safetensors, PyTorch zip, npz and .npy; a 8-shard open fetches every shard's header; a
    tensor-parallel rank of 4 moves well under the whole model; the streaming load moves the model's
    bytes once.
    """
    import json

    status, output, folder = runs["remote"]
    assert status == 0, output[-6000:]
    saved = json.loads((folder / "remote-results.json").read_text())
    summary = saved["summary"]
    for scheme in ("http", "s3", "hf"):
        for fmt in ("safetensors", "npy"):
            got = summary[f"inspect/{fmt}/{scheme}"]
            assert 0 < got["moved"] - got["api"] <= got["header"] + (64 << 10), (fmt, scheme, got)  # API: hf listing
            assert got["sequential"] <= 4, (fmt, scheme, got)
        for fmt in ("safetensors", "pytorch-zip", "npz", "npy"):
            got = summary[f"tensor/{fmt}/{scheme}"]
            assert got["nbytes"] <= got["moved"] <= got["nbytes"] + (64 << 10), (fmt, scheme, got)
    for scheme in ("http", "s3", "hf"):
        assert summary[f"shards/{scheme}"]["requests"] >= 8, summary[f"shards/{scheme}"]  # every shard's header
    assert 0 < summary["tp"]["ratio"] < 0.5, summary["tp"]
    stream = saved["results"]["stream/weightio"]
    model = stream["bytes"]
    assert model <= stream["moved"]["load"] <= 1.1 * model, stream  # the model once (+ headers, index, listing)
    assert "- [x] inspect safetensors: bytes moved (less the Hub's API answers) <= header bytes + 64 KiB" in output


# ----------------------------------------------------------------------------- charts


def _bench_module(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import importlib

        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


TINY = {"suite": "tiny", "title": "tiny", "rows": [
    {"case": "open", "peer": "weightio", "seconds": 0.002, "rss_mib": 0.2},
    {"case": "open", "peer": "other", "seconds": 0.006, "rss_mib": 50.0},
    {"case": "open", "peer": "third", "seconds": 0.001, "rss_mib": None},
    {"case": "import", "peer": "weightio", "seconds": 0.07, "rss_mib": 0.0},  # no peer: not charted
    {"case": "dequantize Q4_0", "peer": "weightio (1 thread)", "seconds": 0.02},
    {"case": "dequantize Q4_0", "peer": "gguf-py", "seconds": 0.05},
]}


def test_chart_ratios_are_each_peer_over_weightio():
    common = _bench_module("common")
    assert common._ratios(TINY["rows"]) == [
        ("open", {"other": {"seconds": pytest.approx(3.0), "rss_mib": pytest.approx(50.0)},  # RSS floor: 1 MiB
                  "third": {"seconds": pytest.approx(0.5)}}),
        ("dequantize Q4_0 (vs weightio (1 thread))", {"gguf-py": {"seconds": pytest.approx(2.5)}}),
    ]


@pytest.mark.parametrize("n", range(1, 10))
def test_run_orders_balance_who_runs_first_and_who_follows_whom(n):
    """Over a full cycle of `run_order` (n repetitions, 2n for odd n) each repetition runs every
    peer once, every peer runs first equally often and follows every other peer equally often."""
    from collections import Counter

    run_order = _bench_module("common").run_order
    cycle = [run_order(n, rep) for rep in range(n if n % 2 == 0 else 2 * n)]
    assert all(sorted(order) == list(range(n)) for order in cycle)
    assert Counter(order[0] for order in cycle) == {peer: len(cycle) // n for peer in range(n)}
    follows = Counter((a, b) for order in cycle for a, b in zip(order[:-1], order[1:], strict=True))
    assert follows == {(a, b): len(cycle) // n for a in range(n) for b in range(n) if a != b}
    assert run_order(n, len(cycle)) == cycle[0]  # and the cycle repeats


def test_run_orders_vary_the_predecessor_from_the_first_repetitions():
    """Three peers (the memory suite's views case), three repetitions: no peer follows the same one
    every time, as it did when one order was rotated (weightio's views always after safetensors')."""
    run_order = _bench_module("common").run_order
    orders = [run_order(3, rep) for rep in range(3)]
    assert orders == [[0, 1, 2], [2, 1, 0], [1, 2, 0]]
    for peer in range(3):
        before = {order[order.index(peer) - 1] if order.index(peer) else None for order in orders}
        assert len(before) >= 2, (peer, before)
    assert run_order(0, 0) == [] and run_order(1, 5) == [0] and run_order(2, 1) == [1, 0]


def _cycle_in_the_oldest_generation():
    """A weak reference to garbage that only a full collection frees: a reference cycle moved to
    the oldest generation."""
    import gc
    import weakref

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect(1)  # (moved to the oldest generation, where only a full collection looks)
    del a, b
    gc.collect(1)
    return gone


def test_settle_runs_the_full_collection_before_the_clock():
    """A worker settles what its imports left for the cyclic collector (`common.settle`): garbage in a
    reference cycle, in the oldest generation, is gone after it, and the young counts start over."""
    import gc

    settle = _bench_module("common").settle
    gone = _cycle_in_the_oldest_generation()
    assert gone() is not None
    settle()
    assert gone() is None and gc.get_count()[0] < 50


def test_timed_settles_before_its_clock():
    """Every suite's in-process rows (`common.timed`) start their clock after `settle`: the cyclic
    garbage of the oldest generation is collected before the timed function runs, not during it."""
    timed = _bench_module("common").timed
    gone = _cycle_in_the_oldest_generation()
    seen = []
    result = timed(lambda: seen.append(gone()))
    assert seen == [None] and set(result) == {"seconds", "rss_mib"} and result["seconds"] >= 0


def test_measure_keeps_each_runs_time_under_the_peer_run_before_it(monkeypatch):
    """A cold run can be slowed by the run before it (docs/benchmarks.md, "Why a cold run depends on
    the run before it"): `measure` files every run's seconds under its predecessor, and the memory
    suite shows them as medians after a weightio run and after another peer's."""
    common = _bench_module("common")
    memory = _bench_module("memory")
    seconds = {"weightio views": 2.0, "safetensors load_file": 4.0, "weightio numpy views": 3.0}
    ran: list[str] = []

    def worker(script, args):  # a run's time: its own, +10 after load_file's (the VM's effect, made exact)
        slow = 10.0 if ran and ran[-1] == "safetensors load_file" else 0.0
        ran.append(args[0])
        return {"seconds": seconds[args[0]] + slow, "rss_mib": 1.0}

    monkeypatch.setattr(common, "run_worker", worker)
    monkeypatch.setattr(common.subprocess, "run", lambda *a, **k: None)  # (no bytecode to compile here)
    case = common.Case("views", {peer: [peer] for peer in seconds}, "views")
    result = common.measure(Path("unused"), [case], 3)["views"]
    assert ran == ["weightio views", "safetensors load_file", "weightio numpy views",   # run_order(3, 0..2)
                   "weightio numpy views", "safetensors load_file", "weightio views",
                   "safetensors load_file", "weightio numpy views", "weightio views"]
    assert result["weightio views"]["after"] == {"safetensors load_file": [12.0], "weightio numpy views": [2.0]}
    assert result["weightio numpy views"]["after"] == {"safetensors load_file": [13.0, 13.0],
                                                       "weightio numpy views": [3.0]}  # (a mirror: after itself)
    assert result["safetensors load_file"]["after"] == {"weightio views": [4.0, 4.0], "weightio numpy views": [4.0]}
    assert result["weightio views"]["seconds"] == 2.0 and result["weightio views"]["runs"] == 3
    assert memory.by_before(result["weightio numpy views"]["after"]) == ("3.00 s (1)", "13.00 s (2)")
    assert memory.by_before(result["safetensors load_file"]["after"]) == ("4.00 s (3)", "–")
    assert memory.by_before({}) == ("–", "–")
    assert common.after([{"seconds": 1.0, "after": None}, {"seconds": 2.0, "after": "a"}]) == {"a": [2.0]}


def test_the_gpu_suite_begins_no_repetition_the_time_left_would_not_hold(monkeypatch, capsys):
    # a GPU machine is lent for minutes: with --seconds, whole repetitions only, each run printed
    gpu = _bench_module("gpu")
    clock = [0.0]
    monkeypatch.setattr(gpu.time, "monotonic", lambda: clock[0])

    def run_one(peer, path):  # each run takes 10 "seconds"
        clock[0] += 10.0
        return {"seconds": {"a": 0.2, "b": 0.3}[peer], "bytes": 8, "check": "same"}

    monkeypatch.setattr(gpu, "run_one", run_one)
    results = gpu.measure("unused", ["a", "b"], 5, seconds=65)  # a repetition takes 20 s: three fit, not four
    assert results == {"a": {"seconds": 0.2, "runs": 3, "fastest": 0.2, "bytes": 8, "checks": ["same"]},
                       "b": {"seconds": 0.3, "runs": 3, "fastest": 0.3, "bytes": 8, "checks": ["same"]}}
    printed = capsys.readouterr().err
    assert "  a: 200.0 ms" in printed and "  b: 300.0 ms" in printed
    assert "stopped after 3 of 5 repetitions: the 65 s given would not hold another" in printed
    assert gpu.measure("unused", ["a"], 4)["a"]["runs"] == 4  # (no --seconds: every repetition)


@pytest.mark.bench
def test_plot_redraws_a_png_from_recorded_results(tmp_path, monkeypatch):
    """bench/plot.py draws docs/img/<suite>.png from bench/results/<suite>.json alone (no benchmark runs)."""
    pytest.importorskip("matplotlib")
    import json

    plot = _bench_module("plot")
    records, images = tmp_path / "results", tmp_path / "docs" / "img"
    records.mkdir()
    (records / "tiny.json").write_text(json.dumps(TINY))
    monkeypatch.setattr(plot, "RECORDS", records)
    monkeypatch.setattr(plot, "IMAGES", images)
    assert plot.main([]) == 0
    png = (images / "tiny.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert 400 < width < 1600 and 150 < height < 1200 and len(png) < 200_000  # two panels (time, RSS), small
    assert plot.main(["missing"]) == 1
    common = _bench_module("common")
    with pytest.raises(ValueError, match="no case has a peer"):
        common.chart({"suite": "alone", "title": "alone", "rows": TINY["rows"][3:4]}, tmp_path / "alone.png")


@pytest.mark.parametrize("suite", list(SUITES))
def test_each_suite_has_recorded_results_and_a_chart_in_the_docs(suite):
    import json

    record = json.loads((ROOT / "bench" / "results" / f"{suite}.json").read_text())
    assert record["suite"] == suite and any(row["peer"].startswith("weightio") for row in record["rows"])
    assert 0 < (ROOT / "docs" / "img" / f"{suite}.png").stat().st_size < 150_000
    section = (ROOT / "docs" / "benchmarks.md").read_text().split(f"<!-- suite:{suite} -->")[1]
    assert f"](img/{suite}.png)" in section.split(f"<!-- /suite:{suite} -->")[0]  # as publish() writes it
    assert f"](docs/img/{suite}.png)" in (ROOT / "README.md").read_text()


# ----------------------------------------------------------------------------- bench/coldcache.py


def test_free_page_reporting_reads_the_balloon_devices_feature_bits(tmp_path):
    """Bit 5 (VIRTIO_BALLOON_F_REPORTING) of any balloon device's ``features``, one character a bit;
    None without a balloon driver or device."""
    coldcache = _bench_module("coldcache")
    assert coldcache.free_page_reporting(str(tmp_path / "absent")) is None
    root = tmp_path / "virtio_balloon"
    root.mkdir()
    assert coldcache.free_page_reporting(str(root)) is None
    (root / "virtio0").mkdir()
    (root / "virtio0" / "features").write_text("0110010100000000\n")  # (this VM's: bits 1, 2, 5 and 7)
    assert coldcache.free_page_reporting(str(root)) is True
    (root / "virtio0" / "features").write_text("0110000100000000\n")
    assert coldcache.free_page_reporting(str(root)) is False
    (root / "virtio1").mkdir()
    (root / "virtio1" / "features").write_text("000001\n")
    assert coldcache.free_page_reporting(str(root)) is True
    (root / "virtio1" / "features").write_text("00000\n")  # (too short to have the bit)
    assert coldcache.free_page_reporting(str(root)) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise, mincore and /proc are Linux's")
def test_evict_empties_the_page_cache_of_a_file_as_mincore_sees_it(tmp_path):
    coldcache = _bench_module("coldcache")
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4 << 20))
    path.read_bytes()
    assert coldcache.resident(path) == 1.0
    coldcache.evict(path)
    assert coldcache.resident(path) < 0.05  # (a page the kernel is still writing back may stay)
    with open(path, "rb") as f:
        f.read(1 << 20)  # a quarter of the file back (readahead may bring a little more)
    assert 0.25 <= coldcache.resident(path) <= 1.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise, preadv and mincore")
def test_the_page_cache_row_reads_the_whole_file_cold_into_the_cache(tmp_path):
    """The cold case's "page cache" row (`memory._buffered`) reads every byte of the file, in 16
    stretches, from a cache the suite emptied: it says how much was cached before, and leaves it all cached."""
    coldcache, memory = _bench_module("coldcache"), _bench_module("memory")
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom((24 << 20) + 4099))  # (16 stretches of 1.5 MiB + 257 bytes: none a whole chunk)
    coldcache.evict(path)
    result = memory._buffered(str(path))
    assert result["extra"]["resident_before"] < 0.05 and result["seconds"] > 0 and result["rss_mib"] == 0.0
    assert coldcache.resident(path) == 1.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/smaps_rollup is Linux's")
def test_pss_counts_shared_file_pages_once_across_processes(tmp_path):
    """Two processes mapping the same 32 MiB file page: their PSS grows by ~16 MiB each (half the pages each)."""
    coldcache = _bench_module("coldcache")
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(32 << 20))
    code = ("import mmap, sys; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); "
            "print('ready', flush=True); sys.stdin.readline(); sum(m[i] for i in range(0, len(m), 4096)); "
            "print('touched', flush=True); sys.stdin.readline()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        before = [coldcache.pss_kib(p.pid) for p in procs]
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "touched"
        grown = [coldcache.pss_kib(p.pid) - b for p, b in zip(procs, before, strict=True)]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
            p.stdout.close()
    assert all(12 << 10 <= g <= 20 << 10 for g in grown), grown  # KiB: 16 MiB each, give or take
    assert 28 << 10 <= sum(grown) <= 36 << 10, grown  # the file once, not twice


def test_a_cases_extra_readings_are_the_median_of_its_runs():
    """`measure` used to publish the last run's `extra` (the scale suite's µs per `get` over a dict
    lookup was one process's, beside medians of nine): numbers are now the runs' median, key by key."""
    median_extra = _bench_module("common").median_extra
    runs = [{"us": 4.3, "names": 91991, "steps": {"parse": 2.0, "walk": 5.0}, "heavy": "none", "ok": True},
            {"us": 3.1, "names": 91991, "steps": {"parse": 1.0, "walk": 9.0}, "heavy": "torch", "ok": False},
            {"us": 3.4, "names": 91991, "steps": {"parse": 3.0, "walk": 7.0}, "heavy": "jax", "ok": True}]
    assert median_extra(runs) == {"us": 3.4, "names": 91991, "steps": {"parse": 2.0, "walk": 7.0}, "heavy": "jax",
                                  "ok": True}
    assert median_extra([None, None]) is None and median_extra([]) is None
    assert median_extra([{"cores": 1.0}, {"cores": 2.0}]) == {"cores": 1.5}
    assert median_extra([{"a": 1}, None, {"a": 3}]) == {"a": 2}
