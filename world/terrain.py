"""Terrain of one seed: a height field on a torus, banded into water, beach, lowland,
upland, rock and peaks, with hill shading.

Heights are fractal value noise, histogram-equalised (so band areas are controlled)
and then bent by a per-seed power so the water share varies between seeds (12–36 %).
Everything is computed at one texel per world unit and bilinearly upsampled to the
raster density; the colour of each band is the scene's business (``palette.py``),
terrain only stores the quantised height level and a shade.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .noise import fractal_noise, upsample

# Height is quantised to N_LEVELS levels; a band is a half-open range of levels.
N_LEVELS = 64
DEEP_END = 9  # levels [0, 9): deep water
SEA_END = 15  # [9, 15): shallow water
BEACH_END = 17  # [15, 17): beach
LOW_END = 40  # [17, 40): lowland (grass, fields, villages)
UP_END = 49  # [40, 49): upland (hills, forest edge)
ROCK_END = 59  # [49, 59): bare rock; [59, 64): peaks
N_SHADE = 16  # shade levels; SHADE_FLAT is an unlit, flat texel
SHADE_FLAT = 8

# Water depth classes as stored in Terrain.water.
LAND, SHALLOW, DEEP = 0, 1, 2

_HEIGHT_PERIODS = (256, 128, 64, 32, 16, 8)  # world units per octave
_DETAIL_PERIODS = (8, 4)
_RELIEF = 520.0  # shade steps per unit of (squared) height change across 2 units
_DETAIL = 3.0  # shade amplitude of the fine detail noise


@dataclass(frozen=True, slots=True, eq=False)
class Terrain:
    """Height bands of one seed. ``height`` is per world unit (for placement); the
    ``levels``/``shade``/``water`` rasters are at ``density`` texels per unit."""

    height: np.ndarray  # (map, map) float32 in [0, 1), equalised
    levels: np.ndarray  # (N, N) uint8 height level in [0, N_LEVELS)
    shade: np.ndarray  # (N, N) uint8 in [0, N_SHADE), SHADE_FLAT = flat
    water: np.ndarray  # (N, N) uint8: LAND, SHALLOW or DEEP


def level_of(height: np.ndarray) -> np.ndarray:
    """Quantised height level for heights in [0, 1)."""
    return np.clip(np.floor(height * N_LEVELS), 0, N_LEVELS - 1).astype(np.uint8)


def build_terrain(rng: np.random.Generator, map_size: int, density: int) -> Terrain:
    """Heights, shade and water classes of a ``map_size``² world at ``density`` px/unit."""
    raw = fractal_noise(rng, map_size, _HEIGHT_PERIODS, persistence=0.5)
    knots = np.quantile(raw[::4, ::4], np.linspace(0.0, 1.0, 65))
    knots[-1] += 1e-6
    height = np.interp(raw, knots, np.linspace(0.0, 0.999, 65)).astype(np.float32)
    water_share = rng.uniform(0.12, 0.36)
    gamma = np.log(SEA_END / N_LEVELS) / np.log(water_share)
    height = (height ** np.float32(gamma)).astype(np.float32)

    # Hill shading, light from the top left: brighter where the ground rises toward it.
    elevation = np.maximum(height - SEA_END / N_LEVELS, 0.0) ** 2
    slope = np.roll(elevation, (1, 1), axis=(0, 1)) - np.roll(elevation, (-1, -1), axis=(0, 1))
    detail = fractal_noise(rng, map_size, _DETAIL_PERIODS, persistence=0.6) - 0.5
    shade = SHADE_FLAT + _RELIEF * slope + _DETAIL * detail

    size = map_size * density
    height_px = upsample(height, size)
    levels = level_of(height_px)
    shade_px = np.clip(np.rint(upsample(shade, size)), 0, N_SHADE - 1).astype(np.uint8)
    water = np.where(levels < DEEP_END, DEEP, np.where(levels < SEA_END, SHALLOW, LAND))
    return Terrain(height=height, levels=levels, shade=shade_px, water=water.astype(np.uint8))
