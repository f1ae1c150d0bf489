"""One long rollout of one held-out episode, frame by frame: where the model's view goes.

    python -m bench.rollout_probe [--episode 1] [--length 400] [--weights PATH] [--sampler JSON]
        [--scene PROMPT] [--snaps 5 10 20 ...] [--window 50] [--out probe.png]

``bench.quality`` scores many episodes at once; this looks at one, to find out why a number
moves. The episodes are the ones ``bench.quality``'s long rollout builds from the same
generator (held-out worlds, move 200 frames then idle 50), ``--seed`` picks the set and
``--episode`` one of its four. Prints:

- the episode's scene prompt;
- the mean contrast (``bench.quality``'s) of the model's frames and of the renderer's over
  each ``--window`` frames;
- at each snapshot, the PSNR over the ground the first frame showed (moved by the commanded
  camera shift; only while at least 200 of its pixels are in view), of the frames as they are
  and of both after a 3x3 median (``ground``): falling snow or rain is drawn in screen space
  and no model can place every flake, so the second number is the ground alone.

Writes ``--out``: the renderer's frames at the snapshots above the model's.

``--scene`` replaces the episode's scene (same place, same camera path), e.g. the same
snowfall episode under a clear sky; ``--sampler`` overrides the weights' sampler settings
(``ModelConfig.with_sampler``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from worldserve.bench._driver import Driver, make_worlds
from worldserve.bench._frame_measures import contrast, psnr
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.world import World, expected_shift, median_filter, mixed_policy

MIN_KNOWN = 200  # pixels of the first frame's ground in view for a known-region PSNR


def median3(frame: np.ndarray) -> np.ndarray:
    """3x3 median per channel, edges replicated: (H, W, 3) uint8 -> same."""
    return np.stack([median_filter(frame[..., c], 3) for c in range(frame.shape[-1])], -1).astype(np.uint8)


def known_mask(shift: np.ndarray, size: int) -> np.ndarray:
    """Pixels whose ground the first frame showed (one pixel in from its edge), after the
    static scene moved by the summed ``shift`` (dy, dx)."""
    yy, xx = np.mgrid[0:size, 0:size]
    sy, sx = yy - shift[0], xx - shift[1]
    inside: np.ndarray = (sy >= 1) & (sy <= size - 2) & (sx >= 1) & (sx <= size - 2)
    return inside


def probe(
    runner: ModelRunner, world: World, policy: np.ndarray, bucket: int, snaps: set[int], window: int,
) -> tuple[list[tuple[str, str]], list[np.ndarray], list[np.ndarray]]:
    """Roll ``world`` and the model out under ``policy`` (T, A); returns printable lines and
    the renderer's and the model's frames at ``snaps``."""
    drv = Driver(runner, bucket)
    drv.open(world.render(bucket)[None], [world.scene.to_prompt()], seed=3)
    shift = np.zeros(2)
    con_m, con_r, known, rows_r, rows_m = [], [], [], [], []
    for t in range(1, len(policy)):
        frame = drv.step(policy[t][None])[0]
        world.step(policy[t])
        truth = world.render(bucket)
        shift += expected_shift(policy[t], bucket)
        con_m.append(contrast(frame))
        con_r.append(contrast(truth))
        if t in snaps:
            rows_r.append(truth)
            rows_m.append(frame)
            m = known_mask(shift, bucket)
            if m.sum() >= MIN_KNOWN:
                known.append(f"{t}: {psnr(frame[m], truth[m]):.1f} / {psnr(median3(frame)[m], median3(truth)[m]):.1f}")
    drv.close()
    spans = range(0, len(con_m), window)
    return [
        ("contrast, model", " ".join(f"{np.mean(con_m[i:i + window]):5.1f}" for i in spans)),
        ("contrast, renderer", " ".join(f"{np.mean(con_r[i:i + window]):5.1f}" for i in spans)),
        ("known region PSNR, frames / ground", ", ".join(known) or "(none in view at the snapshots)"),
    ], rows_r, rows_m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="One held-out episode's long rollout, frame by frame.")
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--sampler", type=json.loads, default={},
                    help="sampler overrides (JSON), e.g. '{\"sampler_eta\": 1}'")
    ap.add_argument("--seed", type=int, default=11, help="generator of the episode set and the camera path")
    ap.add_argument("--episode", type=int, default=1, choices=range(4))
    ap.add_argument("--bucket", type=int, default=64)
    ap.add_argument("--length", type=int, default=400)
    ap.add_argument("--scene", default=None, help="replace the episode's scene prompt (same place and path)")
    ap.add_argument("--snaps", type=int, nargs="+", default=[5, 10, 20, 40, 80, 160, 240, 399])
    ap.add_argument("--window", type=int, default=50, help="frames per contrast mean")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", type=Path, default=Path("probe.png"))
    args = ap.parse_args(argv)
    if args.length < 2:
        ap.error("--length must be at least 2")
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    world = make_worlds(4, args.bucket, rng, 200)[args.episode]
    policy = mixed_policy(args.length, rng).astype(np.float32)
    policy[np.arange(args.length) % 250 >= 200] = 0.0  # bench.quality's long rollout: move 200, idle 50
    if args.scene:  # the same place and start, another look
        place = world
        world = World(place.seed, args.scene, (args.bucket,))
        world.reset(place.position)
    runner = ModelRunner.from_pretrained(args.weights, max_sessions=2, sampler=args.sampler)
    snaps = {t for t in args.snaps if 0 < t < args.length}
    print(f"episode {args.episode}: {world.scene.to_prompt()}, {args.length} frames, weights {args.weights}")
    lines, rows_r, rows_m = probe(runner, world, policy, args.bucket, snaps, args.window)
    for name, text in lines:
        print(f"  {name:<36} {text}")
    if rows_r:
        img = np.concatenate([np.concatenate(rows_r, 1), np.concatenate(rows_m, 1)], 0)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(args.out)
        print(f"  strip (renderer above model, frames {sorted(snaps)}): {args.out}")


if __name__ == "__main__":
    main()
