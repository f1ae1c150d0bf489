"""The place a seed makes: terrain, objects, tree sites, weather fields and walkable
ground, at one raster density. Independent of the scene; built once per (seed, density).

Random streams are split by purpose (``_stream``) so that, for example, changing how
rocks are scattered does not move the villages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layers import BRIDGE, FIELD, FLOWER, GLOW_FAR, GLOW_NEAR, ROAD, TERRAIN, Layers
from .noise import fractal_noise, upsample
from .objects import (
    choose_villages,
    draw_fields,
    draw_flowers,
    draw_houses,
    draw_roads,
    draw_rocks,
    plan_houses,
)
from .terrain import BEACH_END, DEEP_END, ROCK_END, Terrain, build_terrain
from .trees import TreeSites, plan_sites

WEATHER_PERIOD = 256  # world units: cloud and fog fields tile with this period
_STREAMS = (
    "terrain",
    "villages",
    "fields",
    "roads",
    "houses",
    "rocks",
    "flowers",
    "trees",
    "weather",
    "actors",
    "precipitation",
)


def stream(seed: int, name: str) -> np.random.Generator:
    """The seed's random stream for one purpose."""
    return np.random.default_rng(
        [int(seed) & 0xFFFFFFFF, int(seed) >> 32 & 0xFFFFFFFF, _STREAMS.index(name)]
    )


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    seed: int
    map_size: int  # world units per side of the torus
    density: int  # raster texels per world unit
    terrain: Terrain
    base: Layers  # everything but trees
    sites: TreeSites
    walk_land: np.ndarray  # (map, map) bool: an animal may stand here
    walk_water: np.ndarray  # (map, map) bool: a boat may float here
    clouds: np.ndarray  # (P, P) float32 in [0, 1], P = weather period in world units
    fog: np.ndarray  # (P, P) float32 in [0, 1]
    wind: tuple[float, float]  # cloud and fog drift, world units per frame (y, x)
    start: tuple[float, float]  # default camera centre: the first village, or (0, 0)


def build_layout(seed: int, map_size: int = 1024, density: int = 2) -> Layout:
    """Generate the place of ``seed`` on a ``map_size``² torus at ``density`` px/unit."""
    if map_size < 64 or map_size % 64:
        raise ValueError(f"map_size={map_size} must be a positive multiple of 64")
    if density < 1:
        raise ValueError(f"density={density} must be >= 1")
    terrain = build_terrain(stream(seed, "terrain"), map_size, density)
    n = map_size * density
    layers = Layers(
        mat=np.full((n, n), TERRAIN, dtype=np.uint8),
        val=terrain.levels.copy(),
        shade=terrain.shade.copy(),
        levels=terrain.levels,
    )
    height = terrain.height
    villages = choose_villages(stream(seed, "villages"), height)
    houses = plan_houses(stream(seed, "houses"), height, villages)
    draw_fields(stream(seed, "fields"), layers, villages, density)
    draw_roads(stream(seed, "roads"), layers, villages, houses, height, density)
    draw_houses(stream(seed, "houses"), layers, houses, density)
    draw_rocks(stream(seed, "rocks"), layers, height, density)
    rng = stream(seed, "flowers")
    draw_flowers(rng, layers, fractal_noise(rng, map_size, (64, 32, 16)), density)
    rng = stream(seed, "trees")
    forest = fractal_noise(rng, map_size, (128, 64, 32, 16), persistence=0.55)
    sites = plan_sites(rng, layers, forest, density)

    centre = density // 2
    mat_u = layers.mat[centre::density, centre::density]
    lv_u = terrain.levels[centre::density, centre::density]
    walk_land = np.isin(mat_u, (TERRAIN, FLOWER, ROAD, FIELD, GLOW_NEAR, GLOW_FAR))
    walk_land &= (lv_u >= BEACH_END) & (lv_u < ROCK_END)
    walk_water = (lv_u < DEEP_END + 2) & (mat_u != BRIDGE)  # boats keep off shallows (ice on snow)

    rng = stream(seed, "weather")
    period = min(WEATHER_PERIOD, map_size)
    clouds = fractal_noise(rng, period // 2, (32, 16, 8, 4), persistence=0.5)
    fog = fractal_noise(rng, period // 2, (64, 32, 16), persistence=0.6)
    ang = rng.uniform(0, 2 * np.pi)
    speed = rng.uniform(0.15, 0.45)
    start = tuple(float(c) for c in villages[0]) if len(villages) else (0.0, 0.0)
    return Layout(
        seed=seed,
        map_size=map_size,
        density=density,
        terrain=terrain,
        base=layers,
        sites=sites,
        walk_land=walk_land,
        walk_water=walk_water,
        clouds=upsample(clouds, period),
        fog=upsample(fog, period),
        wind=(float(speed * np.sin(ang)), float(speed * np.cos(ang))),
        start=(start[0], start[1]),
    )
