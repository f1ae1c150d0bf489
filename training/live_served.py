"""Strips of the served path with and without the live state: sessions as the server runs them.

    python -m training.live_served [--weights W] [--out docs/quality/live_served_64.png] [--clip docs/live.webp]

Per seed, a session opens on the world's start view of its seed and prompt (as the server
starts one) and runs ``--frames`` chunks under held keys on two runners: the committed
default on the canvas, and the live weights on the canvas with each session's live state
(``ModelRunner.from_pretrained(canvas_live=True)``). Nothing of the world but the start
frame reaches either: the ground is the canvas's prior, what moves the live state's. Rows:
the default, the live path, then the frame differences |f_t - f_(t-1)| (x4) of each. The
camera holds still for the first half, then moves (``--keys``). ``--weights`` defaults to the
committed weights with the committed live parts laid on them (``model/default/weights/live``).
``--clip`` also writes the first seed's live session as an animated WebP (24 fps, x4).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.protocol.vocab import ACTION_DIM
from worldserve.session.plan import Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.training.live_strip import row


def session(runner: ModelRunner, seed: int, scene: str, frames: int, key: int, bucket: int = 64) -> np.ndarray:
    """(frames, H, W, 3) uint8: a session's chunks, the camera still then ``key`` held."""
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", bucket, seed, scene)]))
    out = []
    for block in range(frames):
        a = np.zeros((1, ACTION_DIM), np.float32)
        if block >= frames // 2:
            a[0, key] = 1.0
        res = runner.execute(StepPlan(batches=[Batch(bucket, runner.max_steps, [ChunkWork("s", block, a)])]))
        assert not res.errors, res.errors
        out.append(res.results[0].frames[-1])
    runner.execute(StepPlan(freed=["s"]))
    return np.stack(out)


def write_clip(frames: np.ndarray, out: Path, scale: int = 4, fps: float = 24.0) -> None:
    """``frames`` (F, H, W, 3) uint8 as an animated WebP, each pixel ``scale`` x ``scale``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    imgs = [Image.fromarray(f.repeat(scale, 0).repeat(scale, 1)) for f in frames]
    imgs[0].save(out, save_all=True, append_images=imgs[1:], duration=round(1000 / fps), loop=0, quality=80)
    print(f"{out}: {len(imgs)} frames, {out.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Served sessions with and without the live state.")
    ap.add_argument("--weights", default=str(DEFAULT_WEIGHTS))
    ap.add_argument("--clip", type=Path, default=None, help="the first seed's live session, animated (.webp)")
    ap.add_argument("--out", type=Path, default=Path("docs/quality/live_served_64.png"))
    ap.add_argument("--seeds", default="901,913,927")
    ap.add_argument("--scene", default="a grassy village by a lake by day")
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--key", type=int, default=0, help="the key held in the second half (0: forward)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = ModelRunner.from_pretrained(DEFAULT_WEIGHTS, canvas=True)
    live = ModelRunner.from_pretrained(args.weights, canvas=True, canvas_live=True)
    blocks = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows = [session(r, seed, args.scene, args.frames, args.key) for r in (base, live)]
        cols = range(args.every, args.frames, args.every)
        if args.clip is not None and not blocks:
            write_clip(rows[1], args.clip)
        blocks += [row(rows[0], cols), row(rows[1], cols), row(rows[0], cols, True), row(rows[1], cols, True)]
        blocks.append(np.full((4, blocks[-1].shape[1], 3), 255, np.uint8))
        moving = [float(np.abs(np.diff(r[: args.frames // 2].astype(np.int16), axis=0)).mean()) for r in rows]
        print(f"seed {seed}: mean |frame difference| with the camera still: default {moving[0]:.2f}, "
              f"live {moving[1]:.2f}")
    img = np.concatenate(blocks, 0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img.repeat(3, 0).repeat(3, 1)).save(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
