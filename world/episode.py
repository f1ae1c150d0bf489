"""Training episodes: a world, an action sequence from a policy, and the frames it gives.

``actions[t]`` is the action that moved frame t-1 to frame t, so ``actions[0]`` is all
zeros and frame 0 is the view at the start position. Building a world costs about a
second (terrain, objects); ``record_episode`` reuses one for many episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldserve.protocol.vocab import ACTION_DIM

from .policy import ActionPolicy, resolve_policy
from .scene import SceneAttrs, parse_prompt, sample_scene
from .world import DEFAULT_MAP_SIZE, World


@dataclass(frozen=True, slots=True, eq=False)
class Episode:
    seed: int
    frames: dict[int, np.ndarray]  # bucket -> (T, bucket, bucket, 3) uint8
    actions: np.ndarray  # (T, ACTION_DIM) float32; actions[t] moved frame t-1 -> t
    positions: np.ndarray  # (T, 2) float64 camera centre (y, x) per frame, world units
    scene: np.ndarray  # (SCENE_DIM,) float32 conditioning vector at frame 0
    attrs: SceneAttrs
    scenes: np.ndarray  # (T, SCENE_DIM) float32, the scene each frame was rendered in
    grounds: dict[int, np.ndarray] | None = None  # bucket -> (T, bucket, bucket, 3) uint8: the ground alone

    @property
    def prompt(self) -> str:
        return self.attrs.to_prompt()

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def record_episode(
    world: World,
    length: int,
    policy: str | ActionPolicy = "mixed",
    rng: np.random.Generator | None = None,
    *,
    start: tuple[float, float] | None = None,
    buckets: tuple[int, ...] | None = None,
    switch: tuple[int, SceneAttrs] | None = None,
    grounds: bool = False,
) -> Episode:
    """Reset ``world`` at ``start`` (default: a random mostly-dry spot) and roll it out.

    ``switch=(t, scene)`` re-colours the world for ``scene`` from frame ``t`` on, as a
    prompt change mid-session does (the world keeps that scene afterwards). ``grounds``: also
    keep every frame's ground alone (``World.render_ground``: what a world canvas holds)."""
    if length < 1:
        raise ValueError(f"length={length} must be >= 1")
    if switch is not None and not 0 < switch[0] < length:
        raise ValueError(f"switch frame {switch[0]} must lie in 1..{length - 1}")
    rng = np.random.default_rng() if rng is None else rng
    buckets = world.buckets if buckets is None else tuple(buckets)
    world.reset(world.random_position(rng) if start is None else start)
    actions = np.asarray(resolve_policy(policy)(length, rng), dtype=np.float32).copy()
    if actions.shape != (length, ACTION_DIM):
        raise ValueError(
            f"policy returned actions of shape {actions.shape}, expected {(length, ACTION_DIM)}"
        )
    actions[0] = 0.0
    frames = {b: np.empty((length, b, b, 3), dtype=np.uint8) for b in buckets}
    ground = {b: np.empty((length, b, b, 3), dtype=np.uint8) for b in buckets} if grounds else None
    positions = np.empty((length, 2), dtype=np.float64)
    first = world.scene
    scenes = np.empty((length, first.to_vector().shape[0]), dtype=np.float32)
    for t in range(length):
        if switch is not None and t == switch[0]:
            world.set_scene(switch[1])
        scenes[t] = world.scene.to_vector()
        if t:
            world.step(actions[t])
        positions[t] = world.position
        for b in buckets:
            frames[b][t] = world.render(b)
            if ground is not None:
                ground[b][t] = world.render_ground(b)
    return Episode(
        seed=world.seed,
        frames=frames,
        actions=actions,
        positions=positions,
        scene=scenes[0].copy(),
        attrs=first,
        scenes=scenes,
        grounds=ground,
    )


def generate_episode(
    seed: int,
    length: int,
    buckets: tuple[int, ...] = (64, 128),
    policy: str | ActionPolicy = "mixed",
    scene: SceneAttrs | str | None = None,
    rng: np.random.Generator | int | None = None,
    *,
    map_size: int = DEFAULT_MAP_SIZE,
    animate: bool = True,
) -> Episode:
    """One episode in a fresh world of ``seed``. ``rng`` (or an int seed for one; default:
    derived from ``seed``) draws the scene when none is given, the start and the actions."""
    if rng is None or isinstance(rng, int | np.integer):
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0 if rng is None else int(rng) + 1])
    if scene is None:
        scene = sample_scene(rng)
    elif isinstance(scene, str):
        scene = parse_prompt(scene)
    world = World(seed, scene, buckets, map_size=map_size, animate=animate)
    return record_episode(world, length, policy, rng)
