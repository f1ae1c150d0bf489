"""``World``: one seed's place, seen through a moving camera under one scene."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from .actors import Actors, spawn_actors, step_actors
from .atmosphere import build_atmosphere
from .layers import lut_index
from .layout import Layout, build_layout, stream
from .motion import VIEW, camera_velocity
from .palette import build_lut
from .render import BucketLook, downsample, ground, nearest, render_frame, to_uint8
from .scene import SceneAttrs, parse_prompt
from .sprites import build_shapes, build_sprites
from .terrain import SEA_END, UP_END
from .trees import grow_trees

DEFAULT_MAP_SIZE = 1024
MIN_DENSITY = 2  # raster texels per world unit: 128 px buckets read the raster 1:1


@dataclass(frozen=True, slots=True, eq=False)
class WorldState:
    """A snapshot of everything that changes per frame (``World.restore`` takes it back)."""

    frame: int  # steps since reset
    clock: int  # animation clock (stays 0 when the world does not animate)
    position: tuple[float, float]  # camera centre (y, x), world units, in [0, map_size)
    actors: Actors
    rng_state: Mapping[str, Any]  # the actor stream's bit-generator state


class World:
    """A deterministic, toroidal, top-down world rendered at several resolution buckets.

    ``seed`` fixes the place; ``scene`` (``SceneAttrs`` or a prompt) fixes the look and can
    change at any time without moving anything. ``buckets`` are frame sides in pixels;
    every bucket shows the same VIEW × VIEW world units. ``animate=False`` freezes the
    actors, water and weather (only the camera moves). See ``motion.py`` for the camera
    dynamics. ``layout`` reuses a prebuilt place (it must match seed, size and density).
    """

    def __init__(
        self,
        seed: int,
        scene: SceneAttrs | str | None = None,
        buckets: tuple[int, ...] = (64, 128),
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        animate: bool = True,
        layout: Layout | None = None,
    ) -> None:
        if not buckets:
            raise ValueError("buckets is empty")
        for b in buckets:
            if b < 16 or (map_size * b) % VIEW:
                raise ValueError(
                    f"bucket {b} must be >= 16 with map_size * bucket divisible by {VIEW}"
                )
        self.seed = int(seed)
        self.buckets = tuple(sorted(set(buckets)))
        self.map_size = map_size
        self.animate = animate
        # The raster density does not depend on which buckets were asked for (up to 128
        # px), so a 64 px frame is the same whether or not the world also renders 128.
        density = max(MIN_DENSITY, -(-max(self.buckets) // VIEW))
        if layout is None:
            layout = build_layout(self.seed, map_size, density)
        elif (layout.seed, layout.map_size, layout.density) != (self.seed, map_size, density):
            raise ValueError(
                f"layout is (seed={layout.seed}, map_size={layout.map_size}, density={layout.density}),"
                f" expected ({self.seed}, {map_size}, {density})"
            )
        self.layout = layout
        self._shapes = {b: build_shapes(b / VIEW) for b in self.buckets}
        self._looks: dict[int, BucketLook] = {}
        self._grown_key: tuple[str, str] | None = None
        self._grown_codes: np.ndarray | None = None
        self._scene = SceneAttrs()
        self.set_scene(scene)
        self.reset()

    # -- scene -------------------------------------------------------------------------

    @property
    def scene(self) -> SceneAttrs:
        return self._scene

    def set_scene(self, scene: SceneAttrs | str | None) -> None:
        """Re-colour the same place for a new scene (trees regrow for a new vegetation)."""
        if scene is None:
            scene = SceneAttrs()
        elif isinstance(scene, str):
            scene = parse_prompt(scene)
        key = (scene.biome, scene.vegetation)
        if self._grown_codes is None or key != self._grown_key:
            layers = self.layout.base.copy()
            grow_trees(
                layers, self.layout.sites, scene.biome, scene.vegetation, self.layout.density
            )
            self._grown_codes = lut_index(layers.mat, layers.val, layers.shade)
            self._grown_key = key
        texture = build_lut(scene)[self._grown_codes]  # (N, N, 3) at the raster density
        for b in self.buckets:
            size = self.map_size * b // VIEW
            self._looks[b] = BucketLook(
                bucket=b,
                ppu=b / VIEW,
                texture=downsample(texture, size),
                water=nearest(self.layout.terrain.water, size),
                sprites=build_sprites(self._shapes[b], scene, b / VIEW),
                atmosphere=build_atmosphere(self.layout, scene, b),
            )
        self._scene = scene

    # -- dynamics ------------------------------------------------------------------------

    def reset(self, position: tuple[float, float] | np.ndarray | None = None) -> None:
        """Put the camera centre at ``position`` (y, x) in world units (default: the
        seed's first village), actors at their starting places, clocks at 0."""
        pos = self.layout.start if position is None else position
        pos_a = np.asarray(pos, dtype=np.float64).reshape(-1)
        if pos_a.shape != (2,) or not np.all(np.isfinite(pos_a)):
            raise ValueError(f"position {pos!r} must be two finite numbers (y, x)")
        self._center = pos_a % self.map_size
        self._rng = stream(self.seed, "actors")
        self._actors = spawn_actors(self._rng, self.layout.walk_land, self.layout.walk_water)
        self._frame = 0
        self._clock = 0

    def step(self, action: np.ndarray) -> None:
        """Advance one frame: move the camera by ``action`` and let the world move."""
        vy, vx = camera_velocity(action)
        self._center = (self._center + np.array([vy, vx])) % self.map_size
        if self.animate:
            step_actors(self._actors, self._rng, self.layout.walk_land, self.layout.walk_water)
            self._clock += 1
        self._frame += 1

    def render(self, bucket: int) -> np.ndarray:
        """The current frame at ``bucket``: (bucket, bucket, 3) uint8."""
        return render_frame(self._look(bucket), self._top_left(), self._actors, self._clock, self.map_size)

    def render_ground(self, bucket: int) -> np.ndarray:
        """The ground under the current camera at ``bucket``, (bucket, bucket, 3) uint8: the map
        and the rain or snow lying on it; no actors, water glints, cloud shadows or fog (what a
        perfect memory of the place holds)."""
        return to_uint8(ground(self._look(bucket), self._top_left())[0])

    def _look(self, bucket: int) -> BucketLook:
        look = self._looks.get(bucket)
        if look is None:
            raise ValueError(f"bucket {bucket} is not one of this world's buckets {self.buckets}")
        return look

    def _top_left(self) -> tuple[float, float]:
        return self._center[0] - VIEW / 2, self._center[1] - VIEW / 2

    # -- state -----------------------------------------------------------------------------

    @property
    def position(self) -> tuple[float, float]:
        """Camera centre (y, x) in world units, in [0, map_size)."""
        return float(self._center[0]), float(self._center[1])

    @property
    def frame(self) -> int:
        return self._frame

    @property
    def state(self) -> WorldState:
        return WorldState(
            frame=self._frame,
            clock=self._clock,
            position=self.position,
            actors=self._actors.copy(),
            rng_state=MappingProxyType(self._rng.bit_generator.state),
        )

    def restore(self, state: WorldState) -> None:
        self._frame, self._clock = state.frame, state.clock
        self._center = np.asarray(state.position, dtype=np.float64) % self.map_size
        self._actors = state.actors.copy()
        self._rng = stream(self.seed, "actors")
        self._rng.bit_generator.state = dict(state.rng_state)

    def random_position(
        self, rng: np.random.Generator, max_water: float = 0.7, max_rock: float = 0.4
    ) -> tuple[float, float]:
        """A camera centre whose view is at most ``max_water`` water and ``max_rock`` bare
        rock or peaks (the first of up to 8 draws that qualifies, else the least bad)."""
        best, best_score = (0.0, 0.0), np.inf
        half, d = VIEW // 2, self.layout.density
        for _ in range(8):
            y, x = rng.random(2) * self.map_size
            rows = ((int(y) - half + np.arange(0, VIEW, 4)) % self.map_size) * d
            cols = ((int(x) - half + np.arange(0, VIEW, 4)) % self.map_size) * d
            levels = self.layout.terrain.levels[np.ix_(rows, cols)]
            water = float((levels < SEA_END).mean())
            rock = float((levels >= UP_END).mean())
            score = max(water - max_water, 0.0) + max(rock - max_rock, 0.0)
            if score < best_score:
                best, best_score = (float(y), float(x)), score
            if score == 0.0:
                break
        return best
