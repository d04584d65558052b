"""Tensor parallel on a real distributed engine: two processes, torch.distributed over gloo on the
loopback interface, each loading only its shard with `VarBuilder.get_sharded`.

Bytes read are counted two ways, both deterministic:

* the load report's ``bytes_read``: the stored bytes each rank's ``get_sharded`` handed out,
  which must be exactly half of every tensor;
* the pages of the checkpoint's mapping resident in each rank's own address space (``Rss`` of
  the mapping in ``/proc/self/smaps``): a page is there only if that process touched it, or the
  kernel mapped it along with a touched neighbour (fault-around, and page-cache folios of up to
  2 MiB that are mapped whole): at most 2 MiB beyond each end of every contiguous range read,
  hence `SLACK` per range. The page cache is shared, so this counts what each process read,
  whatever the other did. The tensors are large enough (130 MiB in all) that half plus the
  slack stays far below the whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from .conftest import FIXTURES  # noqa: E402

ROOT = FIXTURES.parent
WORLD = 2
CASES = {"rows": 0, "cols": 1, "ids": 0}  # tensor -> the dim it is split along
SLACK = 4 << 20  # per contiguous range read: a 2 MiB folio mapped whole at each end


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(path, tensor bytes, contiguous ranges each rank reads) of a 130 MiB checkpoint."""
    from safetensors.torch import save_file

    tmp_path = tmp_path_factory.mktemp("tp")

    torch.manual_seed(0)
    tensors = {
        "rows": torch.randn(4096, 4096),  # float32, 64 MiB: split along dim 0 (one contiguous half)
        "cols": torch.randn(2, 1 << 24).to(torch.bfloat16),  # 64 MiB: along dim 1 (half of each row)
        "ids": torch.arange(1024 * 256, dtype=torch.int64).reshape(1024, 256),  # 2 MiB
    }
    path = tmp_path / "tp.safetensors"
    save_file(tensors, str(path))
    ranges = sum(1 if dim == 0 else tensors[n].shape[0] for n, dim in CASES.items())  # contiguous reads per rank
    return path, sum(t.numel() * t.element_size() for t in tensors.values()), ranges


_ENV = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
_WORKER = ["-m", "tests.tp_worker"]


def _launch(path, store):
    cmd = [sys.executable, *_WORKER, str(path), json.dumps(CASES), "--world-size", str(WORLD), "--store", str(store)]
    return [subprocess.Popen(cmd + ["--rank", str(r)], cwd=ROOT, env=_ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for r in range(WORLD)]


def _results(procs, timeout=120):
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, stderr[-3000:]
            out.extend(json.loads(line) for line in stdout.splitlines() if line.startswith("{"))
    finally:
        for p in procs:  # never leave a rank behind (a hung peer would wait for its timeout)
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


GLOO = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                          reason="torch.distributed without gloo")


@GLOO
def test_two_ranks_each_read_half_and_all_gather_the_whole_tensors(checkpoint, tmp_path):
    path, data_bytes, ranges = checkpoint
    results = _results(_launch(path, tmp_path / "store"))
    assert sorted(r["rank"] for r in results) == list(range(WORLD))
    for r in results:
        assert r["equal"] == {name: True for name in CASES}, r  # bit-exact after all_gather
        assert r["bytes_read"] == data_bytes // WORLD
        assert data_bytes // WORLD <= r["resident"] <= data_bytes // WORLD + ranges * SLACK, r
        assert r["resident"] < 0.65 * data_bytes  # about half, nowhere near the whole


@GLOO
def test_the_same_worker_runs_under_torchrun(checkpoint):
    # What docs/varbuilder.md shows: torchrun starts the ranks and provides the rendezvous.
    path, data_bytes, _ = checkpoint
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", *_WORKER,
           str(path), json.dumps(CASES)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = _results([proc], timeout=180)
    assert sorted(r["rank"] for r in results) == list(range(WORLD))
    assert all(r["equal"] == {name: True for name in CASES} and r["bytes_read"] == data_bytes // WORLD
               for r in results)
