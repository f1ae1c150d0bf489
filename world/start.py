"""A session's first frame from the world itself.

A session of the default model that starts without an observation would begin from nothing
(an all-zero previous frame), and its first seconds would be the model's blurry average of
every place it was trained on. Rendering the place and scene the session asks for (the
session seed picks the place, the prompt the look) gives it a sharp start that the model
then continues. A small map keeps this to about 0.1 s.
"""

from __future__ import annotations

import numpy as np

from .scene import parse_prompt
from .world import World

START_MAP_SIZE = 256  # world units; the view is 64, so the place still varies with the seed


def start_frame(scene: str, seed: int, bucket: int) -> np.ndarray:
    """The world's view for ``scene`` (a prompt) at a place drawn from ``seed``,
    (bucket, bucket, 3) uint8."""
    return _start_world(scene, seed, bucket).render(bucket)


def start_ground(scene: str, seed: int, bucket: int) -> np.ndarray:
    """The ground alone under ``start_frame``'s view (``World.render_ground``: no actors,
    glints, cloud shadows or fog), what a world canvas starts from."""
    return _start_world(scene, seed, bucket).render_ground(bucket)


def start_views(scene: str, seed: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """``start_frame`` and ``start_ground`` together, from one world."""
    world = _start_world(scene, seed, bucket)
    return world.render(bucket), world.render_ground(bucket)


def _start_world(scene: str, seed: int, bucket: int) -> World:
    world = World(seed, parse_prompt(scene), (bucket,), map_size=START_MAP_SIZE)
    world.reset(world.random_position(np.random.default_rng(seed)))
    return world
