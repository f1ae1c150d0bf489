"""A chunk beside Python: what another thread's Python costs the model thread, eager and traced.

    python -m bench.gil_contention [--dtype float32] [--batches 1 2 4] [--burst-ms 1] [--gap-ms 3]

The real default model, one torch thread, steady-state chunks at bucket 64 and full steps.
For each batch size it times chunks (median ms) alone and beside a thread that runs pure
Python for ``--burst-ms`` then sleeps ``--gap-ms`` (an event loop scheduling, dispatching
events and encoding), with the chunks eager and as TorchScript traces (what the server runs
on the CPU, ``--cpu-trace``). An eager chunk takes the GIL back after each of its kernels,
so every burst of the other thread stalls it; a traced one runs its kernels with the GIL
released. Last line::

    gil_contention eager_slowdown=<x> traced_slowdown=<x>

each the mean over batch sizes of (chunk beside the thread) / (chunk alone).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import torch

from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES
from worldserve.session.plan import ChunkWork, SessionSpec, StepPlan


def chunk_ms(runner: ModelRunner, batch: int, chunks: int) -> float:
    """Median ms of a steady-state chunk of ``batch`` sessions (their caches full)."""
    bucket, cfg = runner.buckets[0], runner.cfg
    ids = [f"gil{batch}_{i}" for i in range(batch)]
    runner.execute(StepPlan(new_sessions=[SessionSpec(s, bucket, seed=i, scene="") for i, s in enumerate(ids)]))
    items = [ChunkWork(s, 0, np.zeros((cfg.frames_per_chunk, cfg.action_dim), np.float32)) for s in ids]
    times = []
    try:
        with torch.inference_mode():
            for _ in range(cfg.cache_frames + 2):
                runner._run_chunk(bucket, cfg.denoising_steps, items)
            for _ in range(chunks):
                t0 = time.perf_counter()
                runner._run_chunk(bucket, cfg.denoising_steps, items)
                times.append(time.perf_counter() - t0)
    finally:
        runner.execute(StepPlan(freed=ids))
    return 1e3 * float(np.median(times))


class PythonBursts:
    """A thread that runs Python for ``burst`` seconds, then sleeps ``gap`` seconds, until stopped."""

    def __init__(self, burst: float, gap: float):
        self.burst, self.gap = burst, gap
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < self.burst:
                pass
            time.sleep(self.gap)

    def __enter__(self) -> PythonBursts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--chunks", type=int, default=30, help="chunks timed per cell")
    ap.add_argument("--burst-ms", type=float, default=1.0)
    ap.add_argument("--gap-ms", type=float, default=3.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    slowdown: dict[str, list[float]] = {}
    print(f"ms a chunk, {args.dtype}, beside {args.burst_ms:g} ms of Python every {args.burst_ms + args.gap_ms:g} ms")
    print(f"{'path':>7} {'batch':>5} {'alone':>7} {'beside':>7} {'ratio':>6}")
    for path in ("eager", "traced"):
        runner = ModelRunner.from_pretrained(DEFAULT_WEIGHTS, max_sessions=max(args.batches), dtype=args.dtype,
                                             trace=path == "traced")
        for b in args.batches:
            alone = chunk_ms(runner, b, args.chunks)
            with PythonBursts(args.burst_ms / 1e3, args.gap_ms / 1e3):
                beside = chunk_ms(runner, b, args.chunks)
            slowdown.setdefault(path, []).append(beside / alone)
            print(f"{path:>7} {b:>5} {alone:>7.1f} {beside:>7.1f} {beside / alone:>6.2f}", flush=True)
    print(f"gil_contention eager_slowdown={np.mean(slowdown['eager']):.2f} "
          f"traced_slowdown={np.mean(slowdown['traced']):.2f}")


if __name__ == "__main__":
    main()
