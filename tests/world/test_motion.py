from __future__ import annotations

import numpy as np
import pytest

from worldserve.session.plan import ACTION_DIM, encode_action
from worldserve.world import camera_velocity, expected_shift, global_shift


def test_each_key_moves_the_scene_opposite_to_the_camera() -> None:
    # forward = camera up (-y), so the scene moves down on screen.
    assert expected_shift(encode_action({"forward"}, (0, 0)), 64) == (2.0, 0.0)
    assert expected_shift(encode_action({"back"}, (0, 0)), 64) == (-2.0, 0.0)
    assert expected_shift(encode_action({"left"}, (0, 0)), 64) == (0.0, 2.0)
    assert expected_shift(encode_action({"right"}, (0, 0)), 128) == (0.0, -4.0)


def test_combos_add_and_opposite_keys_cancel() -> None:
    assert camera_velocity(encode_action({"forward", "right"}, (0, 0))) == (-2.0, 2.0)
    assert camera_velocity(encode_action({"forward", "back"}, (0, 0))) == (0.0, 0.0)
    assert camera_velocity(encode_action({"forward", "left"}, (-1.0, -1.0))) == (-4.0, -4.0)


def test_mouse_pans_continuously_and_is_clipped() -> None:
    assert camera_velocity(encode_action(set(), (0.25, -0.5))) == (-1.0, 0.5)
    raw = np.zeros(ACTION_DIM, np.float32)
    raw[4:] = (7.0, -3.0)
    assert camera_velocity(raw) == (-2.0, 2.0)
    assert expected_shift(raw, 128) == (4.0, -4.0)


def test_malformed_actions_are_rejected() -> None:
    with pytest.raises(ValueError, match="ACTION_DIM"):
        camera_velocity(np.zeros(3))
    bad = np.zeros(ACTION_DIM)
    bad[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        camera_velocity(bad)


def test_global_shift_recovers_a_roll_of_a_textured_image() -> None:
    rng = np.random.default_rng(0)
    img = rng.random((64, 64))
    img = (img + np.roll(img, 1, 0) + np.roll(img, 1, 1)) * 80  # a little spatial correlation
    for shift in ((3, -2), (-4, 4), (0, 0), (8, -7)):
        assert global_shift(img, np.roll(img, shift, axis=(0, 1))) == shift


def _snowy(ground: np.ndarray, flakes: np.ndarray) -> np.ndarray:
    frame = np.repeat(ground[..., None], 3, 2)
    frame[flakes] = 255.0
    return frame


def test_despeckled_shift_follows_the_ground_not_the_snow_falling_across_it() -> None:
    rng = np.random.default_rng(3)
    ground = np.kron(rng.random((16, 16)), np.ones((4, 4))) * 60 + 40
    for _ in range(2):  # soft edges, like the renderer's terrain
        ground = (ground + sum(np.roll(ground, s, a) for s in (1, -1) for a in (0, 1))) / 5
    flakes = rng.random((64, 64)) < 0.06
    prev = _snowy(ground, flakes)
    cur = _snowy(np.roll(ground, (2, -2), (0, 1)), np.roll(flakes, (3, 1), (0, 1)))
    assert global_shift(prev, cur) == (3, 1)  # plain phase correlation follows the flakes
    assert global_shift(prev, cur, despeckle=5) == (2, -2)
    assert global_shift(prev, cur, despeckle=5, band=0.15) == (2, -2)
