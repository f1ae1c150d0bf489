"""Weather is a property of the world: rain and snow lie on the land and move with it, wet or
whiten the ground, water keeps its colour, and the water's glints change slowly."""

from __future__ import annotations

import numpy as np
import pytest

from worldserve.session.plan import encode_action
from worldserve.world import World
from worldserve.world.atmosphere import add_shimmer
from worldserve.world.layers import ROAD, TERRAIN
from worldserve.world.layout import Layout
from worldserve.world.palette import base_colors, weather_ground
from worldserve.world.scene import SceneAttrs
from worldserve.world.terrain import SEA_END

from .conftest import SMALL_MAP, dry_start


@pytest.mark.parametrize("weather", ["rain", "snowfall"])
def test_rain_and_snow_lie_on_the_land_and_move_with_it(layout: Layout, weather: str) -> None:
    world = World(7, f"grassland day {weather}", (64,), map_size=SMALL_MAP, layout=layout, animate=False)
    world.reset(dry_start(world))
    clear = World(7, "grassland day", (64,), map_size=SMALL_MAP, layout=layout, animate=False)
    clear.reset(world.position)
    assert np.abs(world.render_ground(64).astype(int) - clear.render_ground(64)).mean() > 5  # the weather shows
    for key, (dy, dx) in (("right", (0, -2)), ("back", (-2, 0)), ("forward", (2, 0))):
        prev = world.render(64)
        world.step(encode_action({key}, (0.0, 0.0)))
        cur = world.render(64)
        h = 64  # an integer shift moves every mark exactly with the ground: the overlap is identical
        assert np.array_equal(
            cur[max(dy, 0) : h + min(dy, 0), max(dx, 0) : h + min(dx, 0)],
            prev[max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : h + min(-dx, 0)],
        )


def test_rain_wets_the_land_snowfall_covers_it_and_water_keeps_its_colour() -> None:
    clear = base_colors(SceneAttrs(weather="clear"))
    wet = weather_ground(clear, SceneAttrs(weather="rain"))
    snowy = weather_ground(clear, SceneAttrs(weather="snowfall"))
    assert np.array_equal(weather_ground(clear, SceneAttrs(weather="fog")), clear)
    for out in (wet, snowy):
        assert np.array_equal(out[TERRAIN, :SEA_END], clear[TERRAIN, :SEA_END])  # the sea
    land = clear[TERRAIN, SEA_END:].mean(-1)
    assert np.all(wet[TERRAIN, SEA_END:].mean(-1) < land)  # darker
    assert np.all(snowy[TERRAIN, SEA_END:].mean(-1) > land)  # whiter
    assert wet[ROAD].mean() < clear[ROAD].mean() < snowy[ROAD].mean()


def test_water_glints_change_slowly() -> None:
    atm = World(17, "tropical day clear", (64,), map_size=SMALL_MAP)._looks[64].atmosphere
    deep = np.full((64, 64), 2, np.uint8)
    change = []
    for t in range(48):
        a, b = np.zeros((64, 64, 3), np.float32), np.zeros((64, 64, 3), np.float32)
        add_shimmer(a, deep, atm, (10.0, 20.0), t)
        add_shimmer(b, deep, atm, (10.0, 20.0), t + 1)
        change.append(float(np.abs(a - b).mean()))
    assert 0 < np.mean(change) < 0.3  # levels a frame (0.86 when the water glittered)
