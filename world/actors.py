"""Things that move on their own: grazing animals on land, boats on water.

Each actor has a position (world units), a heading, a speed easing toward a target
speed, and a countdown to its next decision. Per frame, for all actors at once:

    timer -= 1; at 0 an actor decides: a new target speed (animals graze, speed 0, 45 %
    of the time, else walk at 0.2–0.5 units/frame; boats sail at 0.35–0.8) and a turn
    of N(0, 1.2) rad, then waits 15–75 frames (boats 40–160) for the next decision;
    otherwise the heading drifts by N(0, 0.06) rad;
    speed += 0.25 * (target - speed);
    the actor moves by speed * (sin heading, cos heading) unless the destination cell is
    not its ground (land for animals, water for boats), in which case it turns around.

Every step draws the same number of random numbers from the world's actor stream, so a
seed and an action sequence give the same motion. Actors ignore the camera.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

ANIMAL, BOAT = 0, 1
N_VARIANTS = 2  # colour/shape variants per kind
_HERD_SPACING = 90.0  # world units between herds, on average
_BOAT_WATER = 1800.0  # square world units of water per boat


@dataclass(slots=True)
class Actors:
    kind: np.ndarray  # (N,) int64: ANIMAL or BOAT
    variant: np.ndarray  # (N,) int64 in [0, N_VARIANTS)
    pos: np.ndarray  # (N, 2) float64 world units (y, x) on the torus
    heading: np.ndarray  # (N,) float64 radians; direction (sin, cos) = (dy, dx)
    speed: np.ndarray  # (N,) float64 world units per frame
    target: np.ndarray  # (N,) float64 speed the actor eases toward
    timer: np.ndarray  # (N,) int64 frames until the next decision

    def copy(self) -> Actors:
        return Actors(**{f.name: getattr(self, f.name).copy() for f in fields(self)})

    def __len__(self) -> int:
        return int(self.kind.shape[0])


def spawn_actors(rng: np.random.Generator, walk_land: np.ndarray, walk_water: np.ndarray) -> Actors:
    """Herds of 3–8 animals on land and lone boats on water, at rest or moving."""
    size = walk_land.shape[0]
    herds = rng.random((max(1, round(size * size / _HERD_SPACING**2)), 2)) * size
    herds = herds[walk_land[herds[:, 0].astype(int), herds[:, 1].astype(int)]]
    counts = rng.integers(3, 9, len(herds))
    animals = np.repeat(herds, counts, axis=0) + rng.normal(0, 5.0, (int(counts.sum()), 2))
    herd_variant = np.repeat(rng.integers(0, N_VARIANTS, len(herds)), counts)
    n_boats = round(float(walk_water.sum()) / _BOAT_WATER)
    water_cells = np.flatnonzero(walk_water.ravel())
    cells = rng.choice(water_cells, size=min(n_boats, len(water_cells)), replace=False)
    boats = np.stack([cells // size, cells % size], 1) + rng.random((len(cells), 2))
    pos = np.concatenate([animals, boats]) % size
    ok = np.concatenate(
        [
            walk_land[pos[: len(animals), 0].astype(int), pos[: len(animals), 1].astype(int)],
            np.ones(len(boats), dtype=bool),
        ]
    )
    kind = np.concatenate([np.full(len(animals), ANIMAL), np.full(len(boats), BOAT)])
    variant = np.concatenate([herd_variant, rng.integers(0, N_VARIANTS, len(boats))])
    n = len(kind)
    target = np.where(kind == BOAT, rng.uniform(0.35, 0.8, n), rng.uniform(0.0, 0.5, n))
    return Actors(
        kind=kind[ok].astype(np.int64),
        variant=variant[ok].astype(np.int64),
        pos=pos[ok],
        heading=rng.uniform(0, 2 * np.pi, n)[ok],
        speed=target[ok].copy(),
        target=target[ok],
        timer=rng.integers(1, 60, n)[ok],
    )


def step_actors(
    actors: Actors, rng: np.random.Generator, walk_land: np.ndarray, walk_water: np.ndarray
) -> None:
    """Advance every actor by one frame, in place (see the module docstring)."""
    n = len(actors)
    size = walk_land.shape[0]
    u = rng.random((3, n))
    g = rng.normal(size=n)
    boat = actors.kind == BOAT
    actors.timer -= 1
    decide = actors.timer <= 0
    walk_speed = np.where(u[0] < 0.45, 0.0, 0.2 + 0.3 * u[1])
    new_target = np.where(boat, 0.35 + 0.45 * u[1], walk_speed)
    actors.target = np.where(decide, new_target, actors.target)
    actors.heading = actors.heading + np.where(decide, 1.2 * g, 0.06 * g)
    wait = np.where(boat, 40 + np.floor(u[2] * 120), 15 + np.floor(u[2] * 60)).astype(np.int64)
    actors.timer = np.where(decide, wait, actors.timer)
    actors.speed += 0.25 * (actors.target - actors.speed)
    step = actors.speed[:, None] * np.stack([np.sin(actors.heading), np.cos(actors.heading)], 1)
    dest = (actors.pos + step) % size
    cy, cx = dest[:, 0].astype(np.int64) % size, dest[:, 1].astype(np.int64) % size
    ok = np.where(boat, walk_water[cy, cx], walk_land[cy, cx])
    actors.pos = np.where(ok[:, None], dest, actors.pos)
    actors.heading = np.where(ok, actors.heading, actors.heading + np.pi) % (2 * np.pi)
