"""The prior's bank against the ground it was made from: its code maps drawn by the canvas at
the bank worlds' own places.

    python -m bench.bank_codes [--bank model/default/weights/ground_bank.npz] [--looks 12] [--views 40]

For ``--looks`` of the bank's looks and seasons (drawn at random, by day), the training world the
map came from (``training/ground_bank.py``'s seeds) is rendered as ground alone at ``--views``
random places (half of them between pixels), and beside each the canvas draws the same place
from the bank's codes (``GroundPainter.reference``: tiles decoded with their margins, faded,
sharpened, sampled). Printed per look and over all: ``psnr`` of the canvas against the ground,
and ``bias`` per terrain class (water, lowland, upland, rock: the world's levels under each
pixel), the ground's mean colour less the canvas's, in grey levels (R, G, B). A bank whose
codes the decoder reads as other ground shows here, before any prior draws from it: a bank
encoded from whole maps at once drew the deserts' rock 13-23 levels short in green and 15-22
in blue.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from worldserve.bench.tokenizer import to_frames
from worldserve.model.default.reference.canvas.ground import MAP_SIZE, GroundPainter
from worldserve.model.default.reference.canvas.quilt import BANK, GroundBank
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS, load_tokenizer
from worldserve.training.ground_bank import VIEW, bank_seeds
from worldserve.world import World
from worldserve.world.scene import SceneAttrs
from worldserve.world.terrain import LOW_END, SEA_END, UP_END

CLASSES = ("water", "lowland", "upland", "rock")


def terrain_classes(world: World, top: np.ndarray) -> np.ndarray:
    """(VIEW, VIEW) terrain class of each pixel of the view whose top-left is ``top`` (units)."""
    lay, d = world.layout, world.layout.density
    first = np.floor(top * d).astype(int)
    n = lay.terrain.levels.shape[0]
    rows, cols = ((first[i] + np.arange(0, VIEW * d, d)) % n for i in range(2))
    classes: np.ndarray = np.digitize(lay.terrain.levels[np.ix_(rows, cols)], (SEA_END, LOW_END, UP_END))
    return classes


def measure(painter: GroundPainter, key: str, views: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The ground, the canvas's views and the terrain classes of ``views`` places of ``key``'s world."""
    biome, vegetation, weather, season = key.split("/")
    scene = SceneAttrs(biome=biome, vegetation=vegetation, weather=weather, season=season)
    world = World(bank_seeds(scene)[0], scene, (VIEW,), map_size=MAP_SIZE)
    g = painter.start(1, scene)  # a canvas of the whole torus, nothing evicted
    g.canvas.paste((0.0, 0.0), painter.bank.maps[key][0].astype(np.int64))
    ground, drawn, classes = [], [], []
    for k in range(views):
        top = np.floor(rng.uniform(0, MAP_SIZE, 2)) + (rng.uniform(0, 1, 2) if k % 2 else 0.0)
        world.reset((float(top[0]) + VIEW / 2, float(top[1]) + VIEW / 2))
        ground.append(world.render_ground(VIEW))
        drawn.append(to_frames(painter.reference(g, top[None], VIEW)[:, :3])[0])
        classes.append(terrain_classes(world, top))
    return np.stack(ground), np.stack(drawn), np.stack(classes)


def summary(ground: np.ndarray, drawn: np.ndarray, classes: np.ndarray) -> str:
    mse = ((ground.astype(np.float64) - drawn) ** 2).mean()
    out = [f"psnr={10 * np.log10(255**2 / mse):.2f}"]
    for c, name in enumerate(CLASSES):
        m = classes == c
        if m.sum() >= 100:
            bias = (ground[m].astype(np.float64) - drawn[m]).mean(0)
            out.append(f"{name}=({bias[0]:+.1f} {bias[1]:+.1f} {bias[2]:+.1f})")
    return " ".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bank", type=Path, default=BANK)
    ap.add_argument("--tokenizer", type=Path, default=WEIGHTS, help="the tokenizer (no suffix)")
    ap.add_argument("--looks", type=int, default=12)
    ap.add_argument("--views", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    painter = GroundPainter(load_tokenizer(args.tokenizer), GroundBank.load(args.bank),
                            torch.device("cpu"), ahead=False)
    rng = np.random.default_rng(args.seed)
    keys = sorted(painter.bank.maps)
    keys = [keys[i] for i in sorted(rng.choice(len(keys), min(args.looks, len(keys)), replace=False))]
    every = []
    for key in keys:
        res = measure(painter, key, args.views, rng)
        every.append(res)
        print(f"{key:34s} {summary(*res)}", flush=True)
    print("bank " + summary(*(np.concatenate(parts) for parts in zip(*every, strict=True))))


if __name__ == "__main__":
    main()
