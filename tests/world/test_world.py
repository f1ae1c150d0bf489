from __future__ import annotations

import numpy as np
import pytest

from worldserve.session.plan import ACTION_DIM, encode_action
from worldserve.world import World, expected_shift, generate_episode, global_shift, random_policy
from worldserve.world.layout import Layout

from .conftest import SMALL_MAP, dry_start


def _rollout(world: World, actions: np.ndarray, bucket: int) -> np.ndarray:
    frames = [world.render(bucket)]
    for a in actions:
        world.step(a)
        frames.append(world.render(bucket))
    return np.stack(frames)


def test_same_seed_and_actions_give_identical_frames(layout: Layout) -> None:
    actions = random_policy(40, np.random.default_rng(3))
    runs = []
    for fresh_layout in (None, layout):
        w = World(
            7, "tropical islands in the rain", (64, 128), map_size=SMALL_MAP, layout=fresh_layout
        )
        runs.append((_rollout(w, actions, 64), w.render(128)))
    assert np.array_equal(runs[0][0], runs[1][0])
    assert np.array_equal(runs[0][1], runs[1][1])
    other = World(8, "tropical islands in the rain", (64,), map_size=SMALL_MAP)
    assert not np.array_equal(other.render(64), runs[0][0][0])


def test_actions_move_the_view_in_the_commanded_direction(world: World) -> None:
    actions = random_policy(120, np.random.default_rng(11))
    agree = total = 0
    for bucket in (64, 128):
        world.reset(dry_start(world))
        frames = _rollout(world, actions, bucket)
        for t, a in enumerate(actions):
            want = np.rint(expected_shift(a, bucket))
            got = np.array(global_shift(frames[t], frames[t + 1]))
            total += 1
            agree += bool(np.all(np.abs(got - want) <= 1))
    assert agree / total >= 0.9, f"global motion matched the action in {agree}/{total} steps"


def test_single_keys_shift_the_frame_by_exactly_the_key_speed(world: World) -> None:
    world.animate = False
    world.reset(dry_start(world))
    for key, want in (("forward", (2, 0)), ("back", (-2, 0)), ("left", (0, 2)), ("right", (0, -2))):
        prev = world.render(64)
        world.step(encode_action({key}, (0.0, 0.0)))
        cur = world.render(64)
        assert global_shift(prev, cur) == want
        # Integer pixel shifts are exact: the overlap is identical.
        dy, dx = want
        h = 64
        assert np.array_equal(
            cur[max(dy, 0) : h + min(dy, 0), max(dx, 0) : h + min(dx, 0)],
            prev[max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : h + min(-dx, 0)],
        )


def test_idle_keeps_the_static_scene_still(world: World) -> None:
    idle = np.zeros(ACTION_DIM, np.float32)
    world.reset(dry_start(world))
    first = world.render(128)
    for _ in range(10):
        world.step(idle)
    later = world.render(128)
    assert global_shift(first, later) == (0, 0)
    still = np.mean(np.abs(first.astype(int) - later.astype(int)).max(axis=2) <= 2)
    assert still >= 0.8, f"only {still:.0%} of pixels stayed still while idle"
    world.animate = False
    frozen = world.render(64)
    world.step(idle)
    assert np.array_equal(world.render(64), frozen)


def test_scene_change_recolors_the_same_place(world: World) -> None:
    world.reset(dry_start(world))
    world.step(encode_action({"forward"}, (0.0, 0.0)))
    position, actors = world.position, world.state.actors.pos.copy()
    day = world.render(128).astype(np.float64)
    stats = {}
    for prompt in ("night", "desert", "snow", "fog", "autumn"):
        world.set_scene(prompt)
        frame = world.render(128).astype(np.float64)
        stats[prompt] = frame.mean(axis=(0, 1))
        assert world.position == position
        assert np.array_equal(world.state.actors.pos, actors)
        # Same place: edges (houses, roads, trees, shores) stay where they were; a new
        # biome also changes tree shapes and ground texture, so it keeps fewer of them.
        floor = 0.25 if prompt in ("desert", "snow") else 0.5
        if prompt != "fog":
            assert _edge_correlation(day, frame) > floor, prompt
    base = day.mean(axis=(0, 1))
    assert stats["night"].sum() < 0.5 * base.sum()
    assert stats["desert"][0] > base[0] + 30  # sand is redder than grass
    assert stats["snow"].mean() > base.mean() + 40
    assert np.abs(stats["fog"] - base).sum() > 30
    assert np.abs(stats["autumn"] - base).sum() > 15


def _edge_correlation(a: np.ndarray, b: np.ndarray) -> float:
    def edges(f: np.ndarray) -> np.ndarray:
        g = f.mean(axis=2)
        return (np.abs(np.diff(g, axis=0))[:, :-1] + np.abs(np.diff(g, axis=1))[:-1]).ravel()

    return float(np.corrcoef(edges(a), edges(b))[0, 1])


def test_buckets_show_the_same_view(world: World) -> None:
    world.animate = False
    world.reset(dry_start(world))
    for mouse in ((0.0, 0.0), (0.37, -0.61)):  # on the pixel grid, then sub-pixel
        world.step(encode_action({"right"}, mouse))
        small = world.render(64).astype(np.float64)
        big = world.render(128).astype(np.float64)
        pooled = big.reshape(64, 2, 64, 2, 3).mean(axis=(1, 3))
        err = np.abs(pooled - small).mean()
        assert err < 6.0, f"64 px and pooled 128 px differ by {err:.1f} on average"


def test_frames_do_not_depend_on_which_other_buckets_exist(world: World, layout: Layout) -> None:
    only_small = World(7, None, (64,), map_size=SMALL_MAP, layout=layout)
    actions = random_policy(10, np.random.default_rng(4))
    assert np.array_equal(_rollout(only_small, actions, 64), _rollout(world, actions, 64))


def test_wrapping_works_far_from_the_origin(world: World) -> None:
    world.animate = False
    far = (1e6 + 3.0, -1e6 + 5.0)
    world.reset(far)
    assert all(0 <= c < SMALL_MAP for c in world.position)
    at_far = world.render(64)
    world.reset((far[0] % SMALL_MAP, far[1] % SMALL_MAP))
    assert np.array_equal(world.render(64), at_far)
    # Walk across the seam of the torus: motion stays smooth.
    world.reset((SMALL_MAP - 6.0, 2.0))
    prev = world.render(64)
    for _ in range(6):
        world.step(encode_action({"back", "left"}, (0.0, 0.0)))
        cur = world.render(64)
        assert global_shift(prev, cur) == (-2, 2)
        prev = cur


def test_state_restore_replays_the_same_future(world: World) -> None:
    actions = random_policy(20, np.random.default_rng(5))
    for a in actions[:10]:
        world.step(a)
    snapshot = world.state
    first = _rollout(world, actions[10:], 64)
    world.restore(snapshot)
    assert np.array_equal(_rollout(world, actions[10:], 64), first)


def test_unknown_bucket_and_bad_position_are_rejected(world: World) -> None:
    with pytest.raises(ValueError, match="bucket 96"):
        world.render(96)
    with pytest.raises(ValueError, match="position"):
        world.reset((np.nan, 0.0))


def test_episode_layout_and_action_alignment() -> None:
    ep = generate_episode(7, 12, buckets=(64, 128), policy="scripted", rng=1, map_size=SMALL_MAP)
    assert ep.frames[64].shape == (12, 64, 64, 3) and ep.frames[64].dtype == np.uint8
    assert ep.frames[128].shape == (12, 128, 128, 3)
    assert ep.actions.shape == (12, ACTION_DIM) and ep.actions.dtype == np.float32
    assert not ep.actions[0].any()
    assert ep.scene.shape == (18,) and np.array_equal(ep.scene, ep.attrs.to_vector())
    again = generate_episode(7, 12, buckets=(64, 128), policy="scripted", rng=1, map_size=SMALL_MAP)
    assert np.array_equal(again.frames[128], ep.frames[128])
    assert np.array_equal(again.actions, ep.actions)


def test_the_ground_view_is_the_map_alone_and_holds_still_while_the_world_moves(world: World) -> None:
    world.set_scene("grassland day rain")
    still = np.zeros(ACTION_DIM, np.float32)
    first_ground, first = world.render_ground(64), world.render(64)
    for _ in range(5):
        world.step(still)
    assert np.array_equal(world.render_ground(64), first_ground)  # nothing of the map moves on its own
    assert not np.array_equal(world.render(64), first)  # rain, animals and water do
    world.step(encode_action(["right"], (0.0, 0.0)))
    assert np.array_equal(world.render_ground(64)[:, :-2], first_ground[:, 2:])  # the camera moves it
