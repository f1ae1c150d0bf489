"""Where the world canvas's work goes when the model is saturated, without the engine.

    python -m bench.canvas_work [--sessions 8] [--seconds 20] [--canvas-decode beside|between|auto] [--dtype D] [--live]

Opens ``--sessions`` canvas sessions of the default model, holds a key in all of them (the
camera moves, so the canvas fills and decodes as it serves) and runs batches of all of them
back to back on this thread for ``--seconds`` after five warm-up batches, as a saturated
server does. Prints the frames a second and where the canvas's fills and decodes were done
(``tile_decode.DecodeCounts``): ahead on the decoder's thread, waited for, or inline inside
the chunks. ``bench.serve_load --canvas`` prints the same counts per load level, where
sessions join during the level; this one measures the steady state alone. ``--live``: with
the live state of what moves (the server's ``--canvas-live``), for its cost against the canvas.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from worldserve.model.default.reference.canvas.tile_decode import DECODE_MODES
from worldserve.model.default.runner import ModelRunner
from worldserve.model.dtype import DTYPES
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan

WARM_BATCHES = 5


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The world canvas's work at saturation, without the engine.")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--canvas-decode", default="auto", choices=DECODE_MODES)
    ap.add_argument("--dtype", default="auto", choices=DTYPES)
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--live", action="store_true", help="with the live state of what moves (--canvas-live)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the server's model thread
    runner = ModelRunner.from_pretrained(dtype=args.dtype, canvas=True, canvas_decode=args.canvas_decode,
                                         max_sessions=args.sessions + 1, trace=True, canvas_live=args.live)
    assert runner.ground is not None
    decoder = runner.ground.decoder
    ids = [f"s{i}" for i in range(args.sessions)]
    runner.execute(StepPlan(new_sessions=[SessionSpec(s, args.bucket, seed=i, scene="") for i, s in enumerate(ids)]))
    held = np.zeros((1, ACTION_DIM), np.float32)
    held[0, 0] = 1.0  # a key held in every session
    plan = StepPlan(batches=[Batch(args.bucket, runner.max_steps, [ChunkWork(s, 0, held) for s in ids])])
    for _ in range(WARM_BATCHES):
        runner.execute(plan)
    before, t0, batches = decoder.counts.copy(), time.perf_counter(), 0
    while time.perf_counter() - t0 < args.seconds:
        out = runner.execute(plan)
        if out.errors:
            raise SystemExit(f"errors: {out.errors}")
        batches += 1
    elapsed = time.perf_counter() - t0
    c = decoder.counts.since(before)
    mode = "beside" if decoder.beside_chunks else "between"
    print(f"{args.sessions} sessions, {str(runner.dtype).removeprefix('torch.')}, bucket {args.bucket}, "
          f"tiles decode {mode} chunks, {batches} batches in {elapsed:.1f} s")
    each = c.inline_s * 1e3 / max(c.inline, 1)
    print(f"canvas_work frames_per_s={batches * args.sessions / elapsed:.1f} {c.line(elapsed)} "
          f"({each:.1f} ms a decode inline)")


if __name__ == "__main__":
    main()
