"""Strips of the live stage: what the causal model draws from the live state, beside the world.

    python -m training.live_strip --out docs/quality/live_oracle_64.png [--checkpoint checkpoints/live]

Per held-out world (seeds below 1000, which no training run draws), a short episode with the
camera over one of its actors; the model rolls out on its own frames (the cached inference
path, serving's trust), every frame's reference the ground through the ground tokenizer and
the state channels made from the world's own actors and weather (what a perfect live state
would hand it). The camera holds still unless ``--moving``, so the differences show what moves.
Rows: the world; the model with the state; the same model with the state's channels at zero (the
canvas alone); then the frame differences |f_t - f_(t-1)| (x4) of the world and of the model with
the state: what moves.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.reference.canvas.ground import TRUST
from worldserve.protocol.vocab import ACTION_DIM
from worldserve.training.canvas_refs import CanvasReferences
from worldserve.training.live import load_live
from worldserve.training.live_data import LivePool
from worldserve.training.train import self_rollout


@torch.no_grad()
def rollouts(
    model: WorldModel, seeds: list[int], frames: int, still: bool, rng_seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    canvas = CanvasReferences.load(torch.device("cpu"))
    out = []
    for seed in seeds:
        pool = LivePool(1, np.random.default_rng([rng_seed, seed]), 1024, actor_share=1.0, still_share=0.0,
                        world_refresh=10**9)
        pool.next_seed = seed - 1
        pool.worlds = [pool._new()]
        batch = pool.batch(1, frames, policy=_still if still else "mixed")
        enc = WorldModel.encode
        x, prev = enc(torch.from_numpy(batch["frames"])), enc(torch.from_numpy(batch["prevs"]))
        prev[:, 0] = 0.0
        acts, scenes = torch.from_numpy(batch["actions"]), torch.from_numpy(batch["scenes"])
        refs = canvas(batch["grounds"], batch["scenes"])
        states = torch.from_numpy(batch["states"].astype(np.float32))
        dummy = (0, torch.zeros(1, frames, 2), torch.zeros(1, frames, dtype=torch.bool))
        pos = list(range(frames))
        rows = {"world": batch["frames"][0]}
        for name, st in (("live", states), ("zeroed", torch.zeros_like(states))):
            g = torch.Generator().manual_seed(rng_seed)
            gen = self_rollout(model, x, prev, acts, scenes, pos, g, dummy, torch.cat((refs, st), 2))
            rows[name] = WorldModel.decode(gen)[0].numpy()
        rows["actors"] = batch["states"][0, :, 0] + batch["states"][0, :, 5]
        out.append(rows)
    return out


def _still(length: int, rng: np.random.Generator) -> np.ndarray:
    return np.zeros((length, ACTION_DIM), np.float32)


def row(frames: np.ndarray, cols: range, diff: bool = False) -> np.ndarray:
    """Frames ``cols`` side by side, or their differences from the frame before, x4."""
    tiles = []
    for t in cols:
        f = frames[t].astype(np.int16)
        if diff:
            f = np.clip(np.abs(f - frames[t - 1].astype(np.int16)) * 4, 0, 255)
        tiles.append(np.pad(f.astype(np.uint8), ((1, 1), (1, 1), (0, 0)), constant_values=255))
    return np.concatenate(tiles, 1)


def strip(runs: list[dict[str, np.ndarray]], every: int, scale: int = 3) -> np.ndarray:
    blocks = []
    for r in runs:
        cols = range(every, len(r["world"]), every)


        blocks += [row(r["world"], cols), row(r["live"], cols), row(r["zeroed"], cols), row(r["world"], cols, True),
                   row(r["live"], cols, True), np.full((4, row(r["world"], cols).shape[1], 3), 255, np.uint8)]
    img = np.concatenate(blocks, 0)
    return img.repeat(scale, 0).repeat(scale, 1)


def actor_error(runs: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Mean squared error (grey levels²) against the world under the actors' footprints and
    elsewhere, with the state and with it zeroed (frames 1..)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        foot = r["actors"][1:] > 0.2
        for name in ("live", "zeroed"):
            err = ((r[name][1:].astype(np.float64) - r["world"][1:]) ** 2).mean(-1)
            if foot.any():
                out.setdefault(f"{name}_actors", []).append(float(err[foot].mean()))
            out.setdefault(f"{name}_rest", []).append(float(err[~foot].mean()))
    return {k: float(np.mean(v)) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Strips of the live stage against the world.")
    ap.add_argument("--checkpoint", default="checkpoints/live")
    ap.add_argument("--out", type=Path, default=Path("docs/quality/live_oracle_64.png"))
    ap.add_argument("--seeds", default="901,913,927,940")
    ap.add_argument("--frames", type=int, default=33)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--moving", action="store_true",
                    help="the camera moves (default: still, so the differences show what moves)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_live(args.checkpoint)
    model.cfg = model.cfg.with_sampler({"reference_trust": TRUST})  # as served on a canvas
    runs = rollouts(model, [int(s) for s in args.seeds.split(",")], args.frames, not args.moving)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(strip(runs, args.every)).save(args.out)
    print(args.out, " ".join(f"{k}={v:.1f}" for k, v in actor_error(runs).items()))


if __name__ == "__main__":
    main()
