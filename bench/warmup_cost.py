"""What a warm-up costs the CPU server: seconds and resident memory, eager against traced.

    python -m bench.warmup_cost [--dtype bfloat16] [--batch-sizes 1 2 4 8] [--buckets 64 128] [--steps 2 3 4]

Runs ``session.warmup.warm_up`` on the real default model, one torch thread, as
``worldserve serve`` does before it is ready (its buckets x the ladder's step counts x the
batch sizes), with eager chunks, with TorchScript traces as the server records them on a
first start (in child processes, ``model/default/trace_recorder.py``; ``--cpu-trace``, the
default), as it loads them on a restart (from the trace cache the first start filled,
``model/default/trace_cache.py``; a temporary directory here) and with traces recorded in
the serving process itself, each in a fresh process so that none inherits another's memory.
Prints, for each, the seconds the warm-up took, the process's resident memory before and
after it, and the recordings it left. Last line (a single line, wrapped here)::

    warmup_cost eager_s=<x> traced_s=<x> cached_s=<x> here_s=<x>
        eager_mb=<x> traced_mb=<x> cached_mb=<x> here_mb=<x> traces=<n>

the ``_mb`` figures the growth of resident memory over the warm-up, ``cached`` the restart,
``here`` the traces recorded in the serving process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# eager chunks; traces recorded in children; loaded from the cache; recorded in this process
MODES = ("eager", "traced", "cached", "here")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def measure(mode: str, dtype: str, sizes: tuple[int, ...], buckets: tuple[int, ...], steps: tuple[int, ...],
            cache: Path | None = None) -> dict[str, float]:
    import torch

    from worldserve.model.default.runner import ModelRunner
    from worldserve.model.default.weights import DEFAULT_WEIGHTS
    from worldserve.session.warmup import warm_up

    torch.set_num_threads(1)
    runner = ModelRunner.from_pretrained(DEFAULT_WEIGHTS, max_sessions=max(sizes) + 1, dtype=dtype,
                                         trace=mode != "eager", trace_cache=cache)
    if mode == "here":  # no child: each trace recorded when the warm-up first runs its shape
        runner.prepare_shapes = lambda shapes: None  # type: ignore[method-assign]
    before, t0 = rss_mb(), time.perf_counter()
    with torch.inference_mode():
        warm_up(runner, buckets, steps, sizes)
    seconds = time.perf_counter() - t0
    traces = sum(g._trace is not None for g in runner.graphs._graphs.values()) if runner.graphs else 0
    return {"seconds": seconds, "before": before, "after": rss_mb(), "traces": traces}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Seconds and memory of the CPU server's warm-up, eager and traced.")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--buckets", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--steps", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # the child process
    ap.add_argument("--cache", type=Path, help=argparse.SUPPRESS)  # its trace cache
    args = ap.parse_args(argv)
    shape = (args.dtype, tuple(args.batch_sizes), tuple(args.buckets), tuple(args.steps))
    if args.one:
        print(json.dumps(measure(args.one, *shape, cache=args.cache)))
        return
    res = {}

    def child(mode: str, cache: Path | None = None) -> dict[str, float]:
        cmd = [sys.executable, "-m", "worldserve.bench.warmup_cost", "--one", mode, "--dtype", args.dtype,
               "--batch-sizes", *map(str, args.batch_sizes), "--buckets", *map(str, args.buckets),
               "--steps", *map(str, args.steps), *(["--cache", str(cache)] if cache else [])]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))

    with tempfile.TemporaryDirectory() as cache:
        for mode in MODES:
            if mode == "cached":
                child("traced", Path(cache))  # a first start fills the cache
            res[mode] = r = child(mode, Path(cache) if mode == "cached" else None)
            print(f"{mode:6s} warm-up {r['seconds']:.1f} s, resident memory {r['before']:.0f} -> {r['after']:.0f} MB, "
                  f"{r['traces']} traces (buckets {args.buckets}, steps {args.steps}, batch sizes {args.batch_sizes}, "
                  f"{args.dtype})", flush=True)
    grow = {m: r["after"] - r["before"] for m, r in res.items()}
    print("warmup_cost " + " ".join(f"{m}_s={res[m]['seconds']:.1f}" for m in MODES) + " "
          + " ".join(f"{m}_mb={grow[m]:.0f}" for m in MODES) + f" traces={res['traced']['traces']}")


if __name__ == "__main__":
    main()
