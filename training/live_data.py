"""Training batches for the live stage: the world's frames with everything in them, the
ground alone under each (the canvas reference is made from it, ``training/canvas_refs.py``)
and the live state's channels at each frame, made from the world's own actors and weather
(``model/default/reference/live/channels.py``: the same function serving uses on a session's
live state). Training may read the world's insides; serving never does.

A share of the sequences (``actor_share``) start with the camera over one of the world's
actors, so that the few pixels that move are in most batches.
"""

from __future__ import annotations

import numpy as np

from worldserve.model.default.reference.live.channels import (
    CLOUD,
    FOG,
    STATE_CHANNELS,
    VIEW_UNITS,
    actor_channels,
    field_view,
)
from worldserve.training.data import TRAIN_SEED_BASE, Batch
from worldserve.world import World, sample_scene
from worldserve.world.atmosphere import _CLOUDS
from worldserve.world.policy import ActionPolicy, resolve_policy

ACTOR_WEIGHT_REACH = 1.0  # footprint above which a pixel's loss weight is raised


def cloud_cover(world: World) -> np.ndarray | None:
    """The world's cloud cover field (P, P) in [0, 1], one texel per world unit, before its
    drift; None where its weather has no cloud shadows (``world/atmosphere.py``'s rule)."""
    thr = _CLOUDS.get(world.scene.weather)
    if thr is None:
        return None
    t = np.clip((world.layout.clouds - thr[0]) / 0.14, 0.0, 1.0)
    return (t * t * (3 - 2 * t)).astype(np.float32)


def fog_density(world: World) -> np.ndarray | None:
    """The world's fog field (P, P) as the blend's coverage, None where there is no fog."""
    if world.scene.weather != "fog":
        return None
    return np.clip(0.42 + 0.6 * (world.layout.fog - 0.5), 0.1, 0.85).astype(np.float32)


def world_state_channels(world: World, bucket: int) -> np.ndarray:
    """(STATE_CHANNELS, bucket, bucket) float32: the live state's channels of the world's
    current frame, from its own actors, clouds and fog."""
    out = np.zeros((STATE_CHANNELS, bucket, bucket), np.float32)
    st = world.state
    tl = (st.position[0] - VIEW_UNITS / 2, st.position[1] - VIEW_UNITS / 2)
    a = st.actors
    actor_channels(out, a.kind, a.variant, a.pos, a.heading, tl, world.map_size)
    period = world.layout.clouds.shape[0]
    drift = (tl[0] - world.layout.wind[0] * st.clock, tl[1] - world.layout.wind[1] * st.clock)
    cover, fog = cloud_cover(world), fog_density(world)
    if cover is not None:
        out[CLOUD] = field_view(cover, drift, bucket, period)
    if fog is not None:
        out[FOG] = field_view(fog, drift, bucket, period)
    return out


class LivePool:
    """A few live worlds to record short episodes from, with their state channels."""

    def __init__(self, n: int, rng: np.random.Generator, map_size: int, actor_share: float,
                 still_share: float, world_refresh: int):
        self.rng, self.map_size = rng, map_size
        self.actor_share, self.still_share, self.world_refresh = actor_share, still_share, world_refresh
        self.next_seed = TRAIN_SEED_BASE + int(rng.integers(0, 1_000_000))
        self.worlds = [self._new() for _ in range(n)]
        self.made = 0

    def _new(self) -> World:
        self.next_seed += 1
        return World(self.next_seed, sample_scene(self.rng), (64,), map_size=self.map_size)

    def _start(self, world: World) -> tuple[float, float]:
        actors = world.state.actors
        if len(actors) and self.rng.random() < self.actor_share:
            y, x = actors.pos[int(self.rng.integers(len(actors)))] + self.rng.normal(0, 12, 2)
            return float(y) % self.map_size, float(x) % self.map_size
        return world.random_position(self.rng)

    def batch(self, n: int, length: int, bucket: int = 64, policy: str | ActionPolicy | None = None) -> Batch:
        """``n`` sequences of ``length`` frames: frames, prevs, actions, scenes, grounds and
        states (B, N, STATE_CHANNELS, H, W) float16; ``policy`` names the actions' policy
        (default: the calm one for ``still_share`` of them, else the mixed one)."""
        if self.made and self.made % self.world_refresh == 0:
            self.worlds[int(self.rng.integers(len(self.worlds)))] = self._new()
        self.made += 1
        kinds = ("frames", "prevs", "actions", "scenes", "grounds", "states")
        rec: dict[str, list[np.ndarray]] = {k: [] for k in kinds}
        for _ in range(n):
            world = self.worlds[int(self.rng.integers(len(self.worlds)))]
            if self.rng.random() < 0.1:
                world.set_scene(sample_scene(self.rng))
            # let the world's actors run a while first: their start is not their life
            world.reset(self._start(world))
            for _ in range(int(self.rng.integers(0, 40))):
                world.step(np.zeros(6, np.float32))
            name = policy or ("calm" if self.rng.random() < self.still_share else "mixed")
            acts = np.asarray(resolve_policy(name)(length + 1, self.rng), np.float32).copy()
            acts[0] = 0.0
            frames, grounds, states = [], [], []
            for t in range(length + 1):
                if t:
                    world.step(acts[t])
                frames.append(world.render(bucket))
                grounds.append(world.render_ground(bucket))
                states.append(world_state_channels(world, bucket))
            f = np.stack(frames)
            rec["frames"].append(f[1:])
            rec["prevs"].append(np.concatenate([np.zeros_like(f[:1]), f[1:-1]]))
            rec["actions"].append(acts[1:])
            rec["scenes"].append(np.repeat(world.scene.to_vector()[None], length, 0))
            rec["grounds"].append(np.stack(grounds)[1:])
            rec["states"].append(np.stack(states)[1:].astype(np.float16))
        out = {k: np.stack(v) for k, v in rec.items()}
        out["far"] = np.array(False)
        return out


def pixel_weights(states: np.ndarray, actor_weight: float) -> np.ndarray:
    """(B, N, H, W) float32 loss weights: 1, and ``actor_weight`` under an actor's footprint."""
    from worldserve.model.default.reference.live.channels import AXES, KINDS

    foot = sum(states[:, :, k * AXES].astype(np.float32) for k in range(KINDS))
    return 1.0 + (actor_weight - 1.0) * np.clip(foot / ACTOR_WEIGHT_REACH, 0.0, 1.0)
