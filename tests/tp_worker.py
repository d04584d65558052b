"""One rank of a tensor-parallel load (run by tests/test_tensor_parallel.py, or under torchrun).

    python -m tests.tp_worker CHECKPOINT CASES_JSON --rank R --world-size N --store FILE   # the test
    torchrun --nproc-per-node 2 -m tests.tp_worker CHECKPOINT CASES_JSON                   # torchrun

Each rank loads only its shard of every tensor in CASES_JSON (``{name: dim}``) with
`VarBuilder.get_sharded`, all-gathers the shards over gloo, and prints one JSON line: whether
the gathered tensors equal the whole tensors bit for bit, the bytes its load report counted, and
how many bytes of the checkpoint's mapping are resident in this process (from
``/proc/self/smaps``, measured before anything reads the whole tensors).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

import weightio as wio

from .memory import resident_bytes


def init(args: argparse.Namespace) -> tuple[int, int]:
    """Join the group: from torchrun's environment, or from the test's file store."""
    timeout = timedelta(seconds=60)
    if args.store is None:  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group("gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank,
                                world_size=args.world_size, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def gather_shards(path: str, cases: dict[str, int], rank: int, world: int) -> tuple[dict, int, int]:
    """Every case's whole tensor, rebuilt from the ranks' shards; the bytes this rank's report
    counted; the bytes of the mapping resident in this process (measured while it is mapped)."""
    with wio.VarBuilder.from_path(path, device="torch") as vb:
        gathered, shards = {}, []
        for name, dim in cases.items():
            shards.append(vb.get_sharded(None, name, dim, rank, world))  # kept: its pages are mapped while it lives
            local = shards[-1].contiguous()
            parts = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(parts, local)
            gathered[name] = torch.cat(parts, dim)
        return gathered, vb.report().bytes_read, resident_bytes(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("cases")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--store")
    args = parser.parse_args()
    path = os.path.abspath(args.checkpoint)
    rank, world = init(args)
    try:
        gathered, bytes_read, resident = gather_shards(path, json.loads(args.cases), rank, world)
        dist.barrier()
        from safetensors.torch import load_file  # the whole tensors, read by the reference library

        whole = load_file(path)
        same = {n: torch.equal(t.view(torch.uint8), whole[n].view(torch.uint8)) for n, t in gathered.items()}
        line = json.dumps({"rank": rank, "equal": same, "bytes_read": bytes_read, "resident": resident}) + "\n"
        os.write(1, line.encode())  # one write below PIPE_BUF: under torchrun the ranks share one stdout pipe
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
