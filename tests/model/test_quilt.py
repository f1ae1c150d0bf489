"""The prior's continuation (model/default/reference/canvas/quilt.py): a tile the prior copied from the bank is
found there again, and the tile beside it goes on with the ground that lay beside it, so
roads and shores run on across tile edges instead of ending there."""

from __future__ import annotations

import numpy as np
import pytest

from tests.model.test_ground import _painter
from worldserve.model.default.reference.canvas.canvas import EMPTY, TILE, Canvas
from worldserve.model.default.reference.canvas.ground import MAP_SIZE, RADIUS
from worldserve.model.default.reference.canvas.quilt import (
    SourceIndex,
    continuations,
    fill_tile,
    window_codes,
)
from worldserve.world.scene import SceneAttrs


def _maps() -> np.ndarray:
    return _painter().bank.for_scene(SceneAttrs())


def test_a_window_of_the_bank_is_found_where_it_lies_and_other_ground_is_not() -> None:
    maps = _maps()
    index = SourceIndex.of(maps)
    rng = np.random.default_rng(3)
    for _ in range(8):
        place = np.array([rng.integers(maps.shape[0]), rng.integers(maps.shape[1]), rng.integers(maps.shape[2])])
        tile = window_codes(maps, place[None], TILE)[0]
        found = index.find(tile)
        assert any((f == place).all() for f in found)
        assert all(np.array_equal(window_codes(maps, f[None], TILE)[0], tile) for f in found)
    made_up = (np.arange(TILE * TILE).reshape(TILE, TILE) % 1000).astype(np.uint16)
    assert len(index.find(made_up)) == 0


@pytest.mark.parametrize("side", [(0, 1), (1, 0), (0, -1), (-1, 0)])
def test_the_tile_beside_a_copied_one_goes_on_with_the_bank_s_ground(side: tuple[int, int]) -> None:
    painter, maps = _painter(), _maps()
    index = SourceIndex.of(maps)
    # a varied place of the bank (a uniform one lies in many places, and goes on as anything)
    y, x = 40, 100
    while len(np.unique(window_codes(maps, np.array([[0, y, x]]), TILE))) < 12:
        y, x = (y + 7) % maps.shape[1], (x + 13) % maps.shape[2]
    canvas = Canvas(MAP_SIZE, RADIUS)
    canvas.write((4, 4), window_codes(maps, np.array([[0, y, x]]), TILE)[0])
    key = (4 + side[0], 4 + side[1])
    on = fill_tile(canvas, key, maps, painter.sim, seed=5, index=index)
    beside = window_codes(maps, np.array([[0, y + side[0] * TILE, x + side[1] * TILE]]), TILE)[0]
    assert np.array_equal(on, beside)
    # without the index the same draw is one of the kept windows: not the bank's own continuation
    assert not np.array_equal(fill_tile(canvas, key, maps, painter.sim, seed=5), beside)


def test_a_tile_an_observation_wrote_part_of_is_no_source() -> None:
    maps = _maps()
    canvas = Canvas(MAP_SIZE, RADIUS)
    tile = window_codes(maps, np.array([[0, 8, 8]]), TILE)[0].copy()
    tile[:4] = EMPTY
    canvas.write((2, 2), tile)
    assert len(continuations(canvas, (2, 3), SourceIndex.of(maps))) == 0
