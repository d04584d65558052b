"""The GPU staging ring on the CPU: `StagedLoader` driving a simulated copy engine, for changes to the
ring's protocol where no GPU is at hand.

    python bench/ring_sim.py [--gib 1] [--ratio 1.47] [--reps 9] [--memcpy] [--task-a-piece]

The "device" is host memory and its copy engine a thread that takes each copy in order and spends
``bytes / rate`` seconds on it, sleeping (``--memcpy``: copying, which costs this machine's CPUs what a
GPU's DMA does not), where ``rate`` is `--ratio` times this machine's host-only fill rate (the pool
reading the file into one faulted buffer, measured first): 1.47 is the H200 machines' 55 GB/s link
over their 37.5 GB/s fills. Events fire once the copies recorded before them are done, as CUDA's do.
The file is bench/memory.py's, warm. Prints the host-only fill and the ring's load (medians of
`--reps`, in one process, the ring pinned by a first load), and what the fill's threads cost the
main thread: its mean time for a call that lets go of the interpreter's lock, alone and during fills
made as the ring makes them (`_main_thread_calls`). ``--task-a-piece``: each 4 MiB piece of a buffer
a task of the fill pool, as before a buffer's pieces were shared by the threads of one C call.
With ``WEIGHTIO_BEFORE=<folder holding an older weightio>`` that copy is imported instead: run both,
alternating, to compare.

Measures only: it writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import statistics
import sys
import threading
import time
import types
from pathlib import Path

if os.environ.get("WEIGHTIO_BEFORE"):
    sys.path.insert(0, os.environ["WEIGHTIO_BEFORE"])
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from common import warm  # noqa: E402
from memory import generate  # noqa: E402


class CopyEngine:
    """A `weightio.devices.staging.Engine` whose copies run in order on one thread at `rate` bytes/s."""

    staged = True

    def __init__(self, rate: float, memcpy: bool) -> None:
        self.rate, self.memcpy = rate, memcpy
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.issued = self.done = 0
        self.finished = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            dst, src = self.queue.get()
            start = time.perf_counter()
            if self.memcpy:
                np.copyto(dst, src)
            left = src.nbytes / self.rate - (time.perf_counter() - start)
            if left > 0:
                time.sleep(left)
            with self.finished:
                self.done += 1
                self.finished.notify_all()

    def active(self):
        return contextlib.nullcontext()

    def empty(self, nbytes: int):
        return np.empty(nbytes, np.uint8)

    def host_buffer(self, nbytes: int):
        host = np.zeros(nbytes, np.uint8)
        return host, host

    def copy(self, dev, pos: int, host, n: int, at: int) -> None:
        self.issued += 1
        self.queue.put((dev[pos : pos + n], host[at : at + n]))

    def copy_direct(self, dev, pos: int, src) -> None:
        raise AssertionError("the ring is staged")

    def event(self):
        mark = {"at": 0}

        def record() -> None:
            mark["at"] = self.issued

        def synchronize() -> None:
            with self.finished:
                while self.done < mark["at"]:
                    self.finished.wait()

        return types.SimpleNamespace(record=record, synchronize=synchronize)

    def view(self, dev, rel: int, ext):
        return dev[rel : rel + ext.stop - ext.start]

    def empty_tensor(self, dtype, shape):
        return np.empty(shape, dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--ratio", type=float, default=55 / 37.5, help="copy rate over the host-only fill rate")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--memcpy", action="store_true", help="the copy engine copies (else it only takes the time)")
    parser.add_argument("--task-a-piece", action="store_true",
                        help="each piece of a buffer a task of the fill pool, as before the C call shared them")
    args = parser.parse_args()

    import weightio as wio
    from weightio.devices import filling, staging

    if args.task_a_piece:
        filling._SHARED = False

    path = generate(args.gib)["safetensors"]
    warm(path)
    ckpt = wio.open(path)
    arrays = {name: ckpt[name].numpy() for name in ckpt}
    size = sum(a.nbytes for a in arrays.values())
    into = np.zeros(size, np.uint8)
    pairs, pos = [], 0
    for a in arrays.values():
        pairs.append((into[pos : pos + a.nbytes], a))
        pos += a.nbytes

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def host_only() -> None:
        with filling.Filler(4 << 20) as filler:
            filler.wait(filler.start(pairs))

    fill = timed(host_only)
    engine = CopyEngine(size / fill * args.ratio, args.memcpy)
    loader = staging.StagedLoader(engine)

    def ring() -> None:
        loader.load(arrays)
        for slot in loader._slots:
            slot.wait()

    print(f"weightio from {os.path.dirname(wio.__file__)}")
    print(f"host-only fill: {fill * 1e3:.0f} ms ({size / fill / 1e9:.2f} GB/s); copies at {args.ratio:g}x that")
    geometry = f"{loader.nslots} x {loader.chunk >> 20} MiB, pieces {loader.piece >> 20} MiB"
    print(f"ring {geometry}: {timed(ring) * 1e3:.0f} ms")
    alone, launch, start = _main_thread_calls(filling, pairs, loader.chunk, loader.nslots - 1, args.reps)
    print(f"main thread, during the ring's fills: a call that lets go of the interpreter's lock {launch:.1f} us "
          f"({alone:.1f} us alone), a buffer's start {start:.0f} us (means)")


def _main_thread_calls(filling, pairs, chunk: int, ahead: int, reps: int) -> tuple[float, float, float]:
    """What the fill's threads cost the main thread of a ring: its mean time for a call that lets go
    of the interpreter's lock and takes it back (numpy's copy of 4 KiB: no system call), alone and
    as each buffer's fill is done (five such calls then: on a GPU, the copy launches, and torch's
    bindings let go of the lock for each op), and for queueing a buffer's fill (`Filler.start`),
    while the pool fills buffers as the ring does (`chunk` bytes a start, `ahead` at once). On the
    H200 machines a launch took ~0.3 ms against ~15 us alone (docs/benchmarks.md "GPU")."""
    batches, batch, held = [], [], 0
    for pair in pairs:
        batch.append(pair)
        held += pair[0].nbytes
        if held >= chunk:
            batches.append(batch)
            batch, held = [], 0
    batches += [batch] if batch else []
    src, dst = np.ones(4096, np.uint8), np.zeros(4096, np.uint8)

    def call() -> float:
        begun = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - begun

    alone = statistics.mean(call() for _ in range(2000))
    launches, starts = [], []
    for _ in range(reps):
        calls: list[float] = []
        queueing: list[float] = []
        with filling.Filler(4 << 20) as filler:
            queued: list = []
            for batch in batches + [None] * ahead:
                if len(queued) >= ahead or (batch is None and queued):
                    filler.wait(queued.pop(0))
                    calls += [call() for _ in range(5)]
                if batch is not None:
                    begun = time.perf_counter()
                    queued.append(filler.start(batch))
                    queueing.append(time.perf_counter() - begun)
        launches.append(statistics.mean(calls))
        starts.append(statistics.mean(queueing))
    return alone * 1e6, statistics.median(launches) * 1e6, statistics.median(starts) * 1e6

if __name__ == "__main__":
    main()
