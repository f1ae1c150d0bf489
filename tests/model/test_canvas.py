"""The world canvas: ground codes written once in world coordinates, read back where the camera
looks (wrapping on the torus), bounded however far the camera goes, and carried whole by a
snapshot's arrays."""

from __future__ import annotations

import numpy as np
import pytest

from worldserve.model.default.reference.canvas.canvas import MISSING, TILE, TILE_UNITS, Canvas


def _tile(value: int) -> np.ndarray:
    return (value * 1000 + np.arange(TILE * TILE)).reshape(TILE, TILE).astype(np.uint16)


def test_a_place_is_written_once_and_read_back_where_the_camera_looks() -> None:
    canvas = Canvas(map_size=256, radius=128)
    assert canvas.needed((0.0, 0.0), 64) == [(0, 0)]
    assert canvas.needed((10.0, 10.0), 64) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    canvas.write((0, 0), _tile(1))
    with pytest.raises(ValueError, match="already written"):
        canvas.write((0, 0), _tile(2))
    assert canvas.needed((10.0, 10.0), 64) == [(0, 1), (1, 0), (1, 1)]
    crop = canvas.crop((8.0, 4.0), 64)  # two codes down, one across into tile (0, 0)
    assert crop.shape == (16, 16)
    np.testing.assert_array_equal(crop[:14, :15], _tile(1)[2:, 1:])
    assert (crop[14:] == MISSING).all() and (crop[:, 15] == MISSING).all()


def test_the_canvas_wraps_with_the_world() -> None:
    canvas = Canvas(map_size=256, radius=128)
    canvas.write((3, 3), _tile(5))
    assert canvas.needed((250.0, 250.0), 64) == [(3, 0), (0, 3), (0, 0)]
    crop = canvas.crop((-8.0, -8.0), 64)  # the corner tile's last two code rows and columns
    np.testing.assert_array_equal(crop[:2, :2], _tile(5)[-2:, -2:])
    with pytest.raises(ValueError, match="outside"):
        canvas.write((4, 0), _tile(0))


def test_memory_stays_bounded_however_far_the_camera_goes_and_a_near_return_finds_the_same_ground() -> None:
    canvas = Canvas(map_size=1024, radius=160)
    rng = np.random.default_rng(0)
    y = x = 512.0
    seen: dict[tuple[int, int], np.ndarray] = {}
    for step in range(2000):  # twice around the torus, diagonally
        y, x = (y + 1.3) % 1024, (x + 1.0) % 1024
        for key in canvas.needed((y - 32, x - 32), 64):
            codes = rng.integers(0, 1024, (TILE, TILE)).astype(np.uint16)
            canvas.write(key, codes)
            seen[key] = codes
        canvas.evict((y, x))
        assert len(canvas.tiles) <= canvas.max_tiles
        if step == 1000:
            before = canvas.crop((y - 32, x - 32), 64)
            for back in range(60):  # back the way it came, less than the radius
                canvas.evict((y - 1.3 * back, x - 1.0 * back))
            assert np.array_equal(canvas.crop((y - 32, x - 32), 64), before)
    assert canvas.max_tiles == 7 * 7 and len(seen) > canvas.max_tiles


def test_a_snapshot_carries_every_tile() -> None:
    canvas = Canvas(map_size=512, radius=TILE_UNITS * 2)
    for i, key in enumerate([(0, 1), (7, 7), (3, 0)]):
        canvas.write(key, _tile(i))
    keys, codes = canvas.to_arrays()
    assert keys.dtype == np.int32 and codes.dtype == np.uint16 and codes.shape == (3, TILE, TILE)
    back = Canvas.from_arrays(512, TILE_UNITS * 2, keys, codes)
    assert back.tiles.keys() == canvas.tiles.keys()
    assert all(np.array_equal(back.tiles[k], canvas.tiles[k]) for k in canvas.tiles)
    assert Canvas.from_arrays(512, 64, *Canvas(512, 64).to_arrays()).tiles == {}
