"""The procedural world the project's world model is trained on and judged against.

A deterministic, numpy-only, top-down toroidal world. The seed makes the place (terrain,
villages, roads, fields, tree sites, animals, boats); a scene (``SceneAttrs``, or a prompt
through ``parse_prompt``) makes the look; actions (session/plan.py's action vector) move
the camera. Modules, in reading order:

    noise, terrain, layers, objects, trees, layout   the place of a seed
    scene, palette, atmosphere, actors, sprites      the look and the things that move
    motion                                           camera dynamics, global-shift measurement
    render, world                                    frames, and the ``World`` object
    policy, episode                                  training data
    preview                                          ``python -m world.preview out.png``

Camera dynamics (details in ``motion``). Action ``[forward, back, left, right, mouse_dx,
mouse_dy]`` (keys clipped to [0, 1], mouse to [-1, 1]) moves the camera centre (y, x) by

    vy = 2 * (back - forward) + 2 * mouse_dy,    vx = 2 * (right - left) + 2 * mouse_dx

world units per frame (forward = up on screen; combos add; at most 4 per axis). The view
is 64 × 64 world units at every bucket (bucket / 64 px per unit), so the static scene
shifts by ``expected_shift(action, bucket) = -v * bucket / 64`` px: ≤ 4 px at 64, ≤ 8 at
128. Everything else moves less than the model's motion kernel reaches (±5 px at 64,
±10 at 128): animals ≤ 0.5 and boats ≤ 0.8 units/frame, clouds and fog ≤ 0.45 and the
water's slow glints, all on top of the camera's shift. Weather is a property of the world:
rain and snow lie on the land (wet or snow-covered ground, streaks and flakes fixed to it),
so they move exactly with the camera (``atmosphere``).

Scenes: biome, vegetation, time, weather, season; prompt vocabulary in ``scene`` (and
``VOCAB``). ``parse_prompt("a snowy forest at night")`` is biome=snow, vegetation=dense,
time=night, other attributes at their defaults.
"""

from .episode import Episode, generate_episode, record_episode
from .layout import Layout, build_layout
from .motion import (
    KEY_SPEED,
    MOUSE_SPEED,
    VIEW,
    camera_velocity,
    expected_shift,
    global_shift,
    median_filter,
)
from .policy import POLICIES, ActionPolicy, mixed_policy, random_policy, scripted_policy
from .scene import ATTRIBUTES, SCENE_DIM, VOCAB, SceneAttrs, parse_prompt, sample_scene
from .start import start_frame, start_ground, start_views
from .world import DEFAULT_MAP_SIZE, World, WorldState

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_MAP_SIZE",
    "KEY_SPEED",
    "MOUSE_SPEED",
    "POLICIES",
    "SCENE_DIM",
    "VIEW",
    "VOCAB",
    "ActionPolicy",
    "Episode",
    "Layout",
    "SceneAttrs",
    "World",
    "WorldState",
    "build_layout",
    "camera_velocity",
    "expected_shift",
    "generate_episode",
    "global_shift",
    "median_filter",
    "mixed_policy",
    "parse_prompt",
    "random_policy",
    "record_episode",
    "sample_scene",
    "scripted_policy",
    "start_frame",
    "start_ground",
    "start_views",
]
