"""``bench.quality``'s revisit: the path back undoes the path away exactly, so the renderer's
view at the return is the view it left wherever nothing moves on its own, and a model that
draws something else there scores below it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from tests.model.conftest import make_runner, tiny_config
from worldserve.bench._frame_measures import pooled_psnr
from worldserve.bench._revisit import AWAY_FRAMES, away_script, revisit, save_revisit_strip, undo
from worldserve.world import World, mixed_policy


def test_the_way_back_brings_the_camera_to_where_it_left() -> None:
    rng = np.random.default_rng(0)
    world = World(5, "grassland clear day", (64,), map_size=256, animate=False)
    for away in (away_script(rng), mixed_policy(40, rng).astype(np.float32)):
        start, view = world.position, world.render(64)
        for a in np.concatenate((away, undo(away))):
            world.step(a)
        assert np.allclose(world.position, start, atol=1e-9)
        assert np.array_equal(world.render(64), view)  # nothing animates: the same frame


def test_the_way_away_leaves_the_view_behind() -> None:
    away = away_script(np.random.default_rng(1))
    world = World(5, None, (64,), map_size=256, animate=False)
    start = np.array(world.position)
    for a in away:
        world.step(a)
    gone = np.abs((np.array(world.position) - start + 128) % 256 - 128)
    assert gone.max() >= 64 and len(away) == AWAY_FRAMES  # a whole view width


def test_a_revisit_compares_each_return_with_its_departure(tmp_path: Path) -> None:
    runner = make_runner(tiny_config(), max_sessions=2)
    rv = revisit(runner, 32, 2, np.random.default_rng(2))
    assert rv.left.shape == rv.back.shape == (2, 2, 32, 32, 3)
    world_db = pooled_psnr(rv.back[:, 0], rv.left[:, 0])
    assert world_db > 15  # the renderer's place: only animals, water and weather moved
    assert pooled_psnr(rv.back[:, 1], rv.left[:, 1]) < world_db  # a random model keeps nothing
    img = np.asarray(Image.open(save_revisit_strip(rv, tmp_path, 32)))
    assert img.shape == (2 * 32 * 4, 4 * 32 * 4, 3)
