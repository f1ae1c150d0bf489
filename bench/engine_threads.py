"""One engine on every core, or one single-thread engine per core?

    python -m bench.engine_threads [--batch 8] [--seconds 10] [--dtype auto] [--weights PATH]

Runs the real default model back to back at one batch size (the smallest bucket, full step
count) as (a) one process with 1 thread, (b) one process with all cores' threads, and (c) one
single-thread process per core at the same time, and prints total frames/s for each. The last
line: ``engine_threads one_1t=<fps> one_nt=<fps> per_core=<fps> best=<a|b|c>``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
from pathlib import Path

from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES


def _worker(weights: str, threads: int, batch: int, seconds: float, dtype: str, out: mp.Queue) -> None:
    import torch

    from worldserve.bench.serve_load import runner_alone_seconds
    from worldserve.model.default.runner import ModelRunner

    torch.set_num_threads(threads)
    runner = ModelRunner.from_pretrained(weights, max_sessions=batch, dtype=dtype)
    per_chunk = runner_alone_seconds(runner, batch, runner.max_steps, seconds)
    out.put(batch * runner.frames_per_chunk / per_chunk)


def run(procs: int, threads: int, weights: str, batch: int, seconds: float, dtype: str = "auto") -> float:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(weights, threads, batch, seconds, dtype, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    results: list[float] = []
    while len(results) < procs:
        try:
            results.append(q.get(timeout=1.0))
        except queue.Empty:
            failed = [p.exitcode for p in ps if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a worker process failed (exit codes {failed})") from None
    for p in ps:
        p.join()
    return sum(results)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--dtype", default="auto", choices=DTYPES, help="the model's float type (the server's --dtype)")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    w = str(args.weights)
    a = run(1, 1, w, args.batch, args.seconds, args.dtype)
    b = run(1, cores, w, args.batch, args.seconds, args.dtype)
    c = run(cores, 1, w, args.batch, args.seconds, args.dtype)
    print(f"{'layout':<34} {'frames/s':>9}")
    print(f"{'(a) 1 process x 1 thread':<34} {a:>9.1f}")
    print(f"{f'(b) 1 process x {cores} threads':<34} {b:>9.1f}")
    print(f"{f'(c) {cores} processes x 1 thread':<34} {c:>9.1f}")
    best = max((a, "a"), (b, "b"), (c, "c"))[1]
    print(f"engine_threads one_1t={a:.1f} one_nt={b:.1f} per_core={c:.1f} best={best}")


if __name__ == "__main__":
    main()
