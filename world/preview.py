"""Contact sheet of the procedural world: ``python -m world.preview [out.png]``.

Each row is one (seed, scene): frames along a random walk from a random dry spot at
128 px, then the same frames at 64 px (enlarged 2× with nearest neighbours, so pixels
are visible). Rows that share a seed share the place, so they show the re-colouring.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .policy import random_policy
from .scene import parse_prompt
from .world import World

ROWS: tuple[tuple[int, str], ...] = (
    (3, "grassland summer day"),
    (3, "snowy forest at night"),
    (7, "desert dunes at dusk"),
    (11, "tropical islands in the rain"),
    (5, "autumn woods in fog"),
    (5, "barren spring meadow, cloudy"),
    (13, "winter blizzard"),
    (3, "grassland village in snowfall, autumn"),
    (17, "jungle at sunset"),
)
FRAMES = 4
GAP = 24  # steps between shown frames


def contact_sheet(rows: tuple[tuple[int, str], ...] = ROWS, frames: int = FRAMES) -> Image.Image:
    pad, label_h = 4, 14
    width = pad + frames * (128 + pad) + 8 + frames * (128 + pad)
    sheet = Image.new("RGB", (width, len(rows) * (128 + label_h + pad) + pad), (24, 24, 28))
    draw = ImageDraw.Draw(sheet)
    worlds: dict[int, World] = {}
    for r, (seed, prompt) in enumerate(rows):
        world = worlds.get(seed)
        if world is None:
            world = worlds[seed] = World(seed, prompt, buckets=(64, 128))
        else:
            world.set_scene(prompt)
        rng = np.random.default_rng(seed)
        world.reset(world.random_position(rng, max_water=0.5))
        actions = random_policy(frames * GAP, rng)
        y = pad + r * (128 + label_h + pad)
        draw.text(
            (pad, y), f"seed {seed}: {prompt!r} -> {parse_prompt(prompt)}", fill=(220, 220, 220)
        )
        y += label_h
        for i in range(frames):
            for a in actions[i * GAP : (i + 1) * GAP]:
                world.step(a)
            big = Image.fromarray(world.render(128))
            small = Image.fromarray(world.render(64)).resize((128, 128), Image.Resampling.NEAREST)
            sheet.paste(big, (pad + i * (128 + pad), y))
            sheet.paste(small, (pad + frames * (128 + pad) + 8 + i * (128 + pad), y))
    return sheet


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="docs/world_preview.png", type=Path)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    contact_sheet().save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
