"""The canvas prior's bank: code maps of whole training worlds, per look of the ground.

    python -m training.ground_bank [--maps 1] [--map-size 1024] [--tokenizer model/default/weights/tokenizer]
                                   [--out model/default/weights/ground_bank.npz] [--seasons SEASON ...]

For every biome, vegetation and weather (the attributes a ground code carries) and every
season, ``--maps`` training worlds of ``--map-size`` world units are rendered by day as ground
alone (``World.render_ground``: no actors, glints, cloud shadows or fog) and encoded by the
tokenizer into a torus of codes (the views wrap, so the code map does too).
``model/default/reference/canvas/quilt.py`` quilts unseen ground from these maps. Worlds of the size sessions
see (1,024 units) give the prior the land cover, villages and shores in the proportions the
world has them (``bench.prior``); about 15 minutes a season on one CPU thread. Each map is
encoded 64-pixel view by 64-pixel view, as an observation is (``code_map``). The bank depends on
the tokenizer's codes, so it is rebuilt whenever the tokenizer changes.

Why per season: the decoder re-skins a place under another time of day well, but a summer
canopy's codes decoded under spring or autumn lose the blossoms and the leaves' colours (a
grey-green or brown smear; 3.2 dB below the spring views' own codes by day, 1.1 dB autumn), so
unseen ground is drawn from maps of the session's own season. A look's three seasons are one
world (the same seed): the same land in each.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import torch

from worldserve.model.default.reference.canvas.canvas import CODE_UNITS
from worldserve.model.default.reference.canvas.quilt import BANK, GroundBank, bank_key
from worldserve.model.default.reference.canvas.tokenizer import (
    WEIGHTS,
    GroundTokenizer,
    load_tokenizer,
)
from worldserve.training.data import TRAIN_SEED_BASE
from worldserve.world import World
from worldserve.world.scene import ATTRIBUTES, SceneAttrs

VIEW = 64  # world units a 64-px view covers: one pixel per unit
BANK_SEED_BASE = TRAIN_SEED_BASE + 2_000_000  # training worlds, apart from those training draws
MARGIN = 32  # world units rendered around the map for the encoder's edges (a multiple of CODE_UNITS)
KEEP = 32  # pixels of each encoded view whose codes the map keeps: its middle (a multiple of CODE_UNITS)


def ground_raster(world: World, size: int) -> np.ndarray:
    """The ground of the square of world units [-MARGIN, size + MARGIN)² as one (N, N, 3) uint8
    image at one pixel per unit, from 64-unit views (wrapping on the world's torus)."""
    n = size + 2 * MARGIN
    views = -(-n // VIEW)
    out = np.zeros((views * VIEW, views * VIEW, 3), np.uint8)
    for i, j in itertools.product(range(views), range(views)):
        top = (-MARGIN + i * VIEW, -MARGIN + j * VIEW)
        world.reset((top[0] + VIEW / 2, top[1] + VIEW / 2))
        out[i * VIEW : (i + 1) * VIEW, j * VIEW : (j + 1) * VIEW] = world.render_ground(VIEW)
    return out[:n, :n]


@torch.inference_mode()
def code_map(tokenizer: GroundTokenizer, world: World, size: int, batch: int = 128) -> np.ndarray:
    """The world's ground as a (size / CODE_UNITS)² torus of codes, uint16, encoded as the
    tokenizer encodes a view: 64-pixel views a ``KEEP`` apart, each giving the codes of its
    middle ``KEEP`` x ``KEEP`` pixels, with (``VIEW`` - ``KEEP``) / 2 pixels of ground around them.

    The encoder's group norms take their statistics over the whole image it is given. It
    learnt on 64-pixel views, and an observation is one; a whole map encoded at once is
    normalised by the map's hills and seas instead, and comes out in other codes (15-32 % of
    them equal, three looks' maps), so the prior compared a session's observed codes with
    codes of another dialect."""
    img = ground_raster(world, size)
    x = torch.from_numpy(img).permute(2, 0, 1).float() / 127.5 - 1  # (3, N, N)
    pad = (VIEW - KEEP) // 2
    starts = range(MARGIN - pad, MARGIN - pad + size, KEEP)
    views = torch.stack([x[:, y : y + VIEW, x0 : x0 + VIEW] for y in starts for x0 in starts])
    ids = torch.cat([tokenizer.encode(views[i : i + batch]) for i in range(0, len(views), batch)])
    c, k, n = pad // CODE_UNITS, KEEP // CODE_UNITS, len(starts)
    mid = ids[:, c : c + k, c : c + k].reshape(n, n, k, k).permute(0, 2, 1, 3)
    return mid.reshape(n * k, n * k).numpy().astype(np.uint16)


LOOKS = tuple(itertools.product(ATTRIBUTES["biome"], ATTRIBUTES["vegetation"], ATTRIBUTES["weather"]))


def bank_seeds(scene: SceneAttrs, maps: int = 1) -> range:
    """The world seeds of ``scene``'s look's maps (its seasons share them)."""
    i = LOOKS.index((scene.biome, scene.vegetation, scene.weather))
    return range(BANK_SEED_BASE + i * maps, BANK_SEED_BASE + (i + 1) * maps)


def build(tokenizer: GroundTokenizer, maps: int, map_size: int, log: bool = True,
          seasons: tuple[str, ...] = ATTRIBUTES["season"]) -> GroundBank:
    """``maps`` code maps per look and season of ``seasons``; a look's seasons share its
    worlds (seeds counted per look, whichever seasons are built)."""
    out: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    for biome, vegetation, weather in LOOKS:
        for season in seasons:
            scene = SceneAttrs(biome=biome, vegetation=vegetation, weather=weather, season=season)  # by day
            seeds = bank_seeds(scene, maps)
            out[bank_key(scene)] = np.stack([code_map(tokenizer, World(s, scene, (VIEW,), map_size=map_size), map_size)
                                             for s in seeds])
            if log:
                print(f"{bank_key(scene)}: {maps} maps, {time.perf_counter() - t0:.0f} s", flush=True)
    return GroundBank(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--maps", type=int, default=1, help="training worlds per look")
    ap.add_argument("--map-size", type=int, default=1024, help="world units per side of each world (a multiple of 64)")
    ap.add_argument("--tokenizer", type=Path, default=WEIGHTS,
                    help="the tokenizer whose codes the bank holds (no suffix)")
    ap.add_argument("--out", type=Path, default=BANK)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seasons", nargs="+", default=list(ATTRIBUTES["season"]), choices=ATTRIBUTES["season"],
                    help="build these seasons' maps; the other seasons' are kept from --out where it holds them")
    args = ap.parse_args(argv)
    if args.map_size % VIEW or args.maps < 1:
        ap.error(f"--map-size {args.map_size} must be a multiple of {VIEW} and --maps at least 1")
    torch.set_num_threads(args.threads)
    bank = build(load_tokenizer(args.tokenizer), args.maps, args.map_size, seasons=tuple(args.seasons))
    if set(args.seasons) != set(ATTRIBUTES["season"]) and args.out.exists():
        kept = {k: v for k, v in GroundBank.load(args.out).maps.items() if k not in bank.maps}
        bank = GroundBank({**kept, **bank.maps})
    bank.save(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
