"""Frozen against plain chunk traces, and recorded here against loaded from a child.

    python -m bench.trace_freeze [--dtype bfloat16 float32] [--batches 1 2 4 8] [--rounds 12]

The real default model, one torch thread, bucket 64, full steps. For each dtype and batch
size it records the steady-state chunk (``model/default/chunk_graph.py``) on the same
buffers plain and frozen (the weights constants of the recording, what depends on them alone
folded), and has a child process record the frozen one too and loads it (what a server's
warm-up runs, ``model/default/trace_recorder.py``). It times the three in alternation,
``--rounds`` rounds of 8 chunks each, so that the machine's drift falls on all alike, and
prints, per shape, the median ms a chunk of each, the ratios frozen / plain and loaded /
frozen (medians of the per-round ratios), the largest difference of the outputs from the
plain trace's (pixels in 8-bit levels, the rest as floats: 0 means the same frames bit for
bit), the seconds each recording here took and the process's resident memory growth over it.
Last line::

    trace_freeze ratio=<x> worst_ratio=<x> loaded_ratio=<x> identical=<0|1>

ratio the mean over shapes of frozen / plain, worst_ratio the largest, loaded_ratio the mean
of loaded / frozen, identical 1 when every output agreed exactly.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from worldserve.model.default.chunk_graph import ChunkGraph, _Traced, trace_body
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.trace_recorder import record_in_child
from worldserve.model.default.weights import DEFAULT_WEIGHTS


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def recorded(graph: ChunkGraph, freeze: bool) -> tuple[torch.jit.ScriptModule, float, float]:
    """The graph's chunk recorded (``freeze`` or not), seconds it took, MB of memory it grew."""
    m0, t0 = rss_mb(), time.perf_counter()
    traced = trace_body(_Traced(graph), graph._buffers(), freeze=freeze)
    return traced, time.perf_counter() - t0, rss_mb() - m0


def compare(runner: ModelRunner, batch: int, rounds: int) -> dict[str, float]:
    bucket, steps = runner.buckets[0], runner.max_steps
    graph = ChunkGraph(runner.model, bucket, steps, batch, runner.dtype, runner.device, "eager")
    gen = torch.Generator().manual_seed(batch)
    with torch.inference_mode():
        for buf in graph._buffers():
            if buf.is_floating_point():
                buf.copy_(torch.randn(buf.shape, generator=gen).clamp(-2, 2))
    plain, plain_s, plain_mb = recorded(graph, freeze=False)
    frozen, frozen_s, frozen_mb = recorded(graph, freeze=True)
    (loaded,) = record_in_child(runner.model, runner.dtype, [(bucket, steps, batch)])
    bufs = graph._buffers()
    times: dict[str, list[float]] = {"plain": [], "frozen": [], "loaded": []}
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        a = [t.clone() for t in plain(*bufs)]
        diff = 0.0
        for other in (frozen, loaded):
            b = other(*bufs)
            diff = max(diff, *((x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True)))
        for _ in range(rounds):
            for name, fn in (("plain", plain), ("frozen", frozen), ("loaded", loaded)):
                t0 = time.perf_counter()
                for _ in range(8):
                    fn(*bufs)
                times[name].append((time.perf_counter() - t0) / 8)
    ratios = np.array(times["frozen"]) / np.array(times["plain"])
    loaded_ratios = np.array(times["loaded"]) / np.array(times["frozen"])
    return {
        "plain_ms": 1e3 * float(np.median(times["plain"])), "frozen_ms": 1e3 * float(np.median(times["frozen"])),
        "loaded_ms": 1e3 * float(np.median(times["loaded"])), "loaded_ratio": float(np.median(loaded_ratios)),
        "ratio": float(np.median(ratios)), "diff": diff, "plain_s": plain_s, "frozen_s": frozen_s,
        "plain_mb": plain_mb, "frozen_mb": frozen_mb,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Frozen against plain chunk traces on the CPU.")
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("| dtype | batch | plain ms | frozen ms | loaded ms | frozen / plain | loaded / frozen | max output diff "
          "| record s plain / frozen | memory MB plain / frozen |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios, loaded, identical = [], [], True
    for dtype in args.dtype:
        runner = ModelRunner.from_pretrained(DEFAULT_WEIGHTS, max_sessions=max(args.batches), dtype=dtype)
        for batch in args.batches:
            r = compare(runner, batch, args.rounds)
            ratios.append(r["ratio"])
            loaded.append(r["loaded_ratio"])
            identical &= r["diff"] == 0.0
            print(f"| {dtype} | {batch} | {r['plain_ms']:.1f} | {r['frozen_ms']:.1f} | {r['loaded_ms']:.1f} | "
                  f"{r['ratio']:.3f} | {r['loaded_ratio']:.3f} | "
                  f"{r['diff']:.3g} | {r['plain_s']:.2f} / {r['frozen_s']:.2f} | "
                  f"{r['plain_mb']:.0f} / {r['frozen_mb']:.0f} |", flush=True)
    print(f"trace_freeze ratio={np.mean(ratios):.3f} worst_ratio={max(ratios):.3f} "
          f"loaded_ratio={np.mean(loaded):.3f} identical={int(identical)}")


if __name__ == "__main__":
    main()
