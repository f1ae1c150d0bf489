"""Scene palettes: the colour lookup table over (material, value, shade), and the light.

``build_lut(attrs)`` returns (N_MAT * N_VAL * N_SHADE, 3) uint8; a world raster becomes
an image with ``lut[lut_index(mat, val, shade)]``. Biome and season choose the base
colours; the weather lies on the land (``weather_ground``: wet under rain, snow-covered
under snowfall); the hill shade multiplies them (weakly on water); time of day and weather
then apply one light to everything (``apply_light``), except lamps, which glow at dusk
and night, and the ground around lamps, which gets their warm light added.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from .layers import (
    BRIDGE,
    FIELD,
    FLOWER,
    GLOW_FAR,
    GLOW_NEAR,
    LAMP,
    N_MAT,
    N_TONE,
    N_VAL,
    ROAD,
    ROCK,
    ROOF,
    TERRAIN,
    TREE,
)
from .scene import SceneAttrs
from .terrain import BEACH_END, DEEP_END, LOW_END, N_LEVELS, N_SHADE, ROCK_END, SEA_END, UP_END

RGB = tuple[int, int, int]
T = TypeVar("T")
_BAND_ENDS = (DEEP_END, SEA_END, BEACH_END, LOW_END, UP_END, ROCK_END, N_LEVELS)

# Terrain bands per biome: (start colour, end colour) for deep, shallow, beach, lowland,
# upland, rock, peak. Lowland and upland are replaced per season below.
_BANDS: Mapping[str, tuple[tuple[RGB, RGB], ...]] = MappingProxyType(
    {
        "grassland": (
            ((24, 56, 118), (38, 84, 150)),
            ((48, 108, 162), (88, 150, 180)),
            ((214, 198, 142), (198, 184, 128)),
            ((96, 150, 60), (80, 134, 52)),
            ((72, 120, 50), (98, 112, 68)),
            ((128, 122, 112), (104, 100, 94)),
            ((204, 206, 214), (236, 238, 242)),
        ),
        "desert": (
            ((22, 76, 116), (34, 104, 140)),
            ((56, 140, 150), (104, 176, 166)),
            ((232, 212, 162), (226, 202, 148)),
            ((224, 192, 130), (214, 176, 112)),
            ((206, 156, 96), (190, 132, 86)),
            ((168, 108, 78), (142, 92, 66)),
            ((150, 100, 80), (182, 140, 112)),
        ),
        "snow": (
            ((30, 58, 98), (48, 84, 124)),
            ((176, 204, 228), (192, 216, 236)),
            ((210, 216, 228), (220, 224, 234)),
            ((228, 232, 242), (218, 224, 236)),
            ((212, 218, 230), (198, 206, 220)),
            ((112, 114, 124), (92, 94, 104)),
            ((226, 230, 238), (240, 242, 248)),
        ),
        "tropical": (
            ((0, 70, 128), (0, 106, 160)),
            ((22, 166, 180), (64, 202, 200)),
            ((240, 224, 172), (230, 210, 150)),
            ((46, 160, 62), (36, 140, 52)),
            ((32, 120, 46), (52, 106, 52)),
            ((96, 96, 82), (80, 80, 70)),
            ((72, 102, 62), (112, 112, 100)),
        ),
    }
)
_SEASON_GROUND: Mapping[tuple[str, str], tuple[tuple[RGB, RGB], tuple[RGB, RGB]]] = (
    MappingProxyType(
        {
            ("grassland", "spring"): (
                ((124, 176, 74), (102, 160, 64)),
                ((92, 140, 60), (104, 122, 72)),
            ),
            ("grassland", "autumn"): (
                ((160, 150, 78), (140, 128, 68)),
                ((132, 114, 64), (120, 104, 70)),
            ),
            ("snow", "spring"): (  # thawing: grey-green snow
                ((208, 216, 206), (198, 208, 198)),
                ((204, 212, 214), (192, 200, 208)),
            ),
            ("snow", "autumn"): (  # first snow: thin, earthy
                ((216, 212, 204), (206, 200, 192)),
                ((206, 204, 204), (194, 192, 194)),
            ),
            ("desert", "spring"): (
                ((204, 192, 124), (200, 180, 112)),
                ((196, 156, 98), (186, 134, 88)),
            ),
            ("tropical", "spring"): (
                ((62, 176, 70), (46, 156, 58)),
                ((38, 132, 50), (56, 112, 56)),
            ),
            ("tropical", "autumn"): (
                ((124, 152, 62), (112, 136, 58)),
                ((96, 120, 56), (100, 104, 62)),
            ),
        }
    )
)
_TREES: Mapping[tuple[str, str], tuple[RGB, RGB, RGB, RGB]] = MappingProxyType(
    {
        ("grassland", "summer"): ((52, 110, 42), (64, 124, 46), (44, 96, 52), (78, 120, 40)),
        ("grassland", "spring"): ((86, 150, 60), (104, 162, 70), (232, 176, 196), (240, 236, 226)),
        ("grassland", "autumn"): ((206, 112, 40), (180, 58, 36), (216, 176, 56), (122, 106, 46)),
        ("snow", "summer"): ((34, 72, 52), (40, 80, 58), (30, 64, 50), (46, 82, 60)),
        ("desert", "summer"): ((122, 132, 72), (106, 122, 64), (150, 136, 82), (80, 130, 56)),
        ("desert", "autumn"): ((140, 128, 72), (126, 116, 66), (160, 134, 84), (96, 124, 58)),
        ("tropical", "summer"): ((40, 140, 56), (56, 160, 46), (30, 118, 62), (72, 150, 40)),
        ("tropical", "spring"): ((40, 140, 56), (56, 160, 46), (214, 70, 84), (72, 150, 40)),
    }
)
_FIELDS: Mapping[tuple[str, str], tuple[RGB, RGB, RGB, RGB]] = MappingProxyType(
    {
        ("grassland", "summer"): ((222, 192, 92), (108, 160, 58), (150, 116, 180), (70, 126, 46)),
        ("grassland", "spring"): ((120, 176, 70), (142, 186, 82), (110, 150, 66), (236, 214, 80)),
        ("grassland", "autumn"): ((164, 128, 80), (200, 170, 92), (140, 100, 70), (186, 150, 72)),
        ("desert", "summer"): ((120, 160, 70), (182, 170, 92), (150, 140, 80), (206, 182, 112)),
        ("snow", "summer"): ((236, 239, 246), (226, 231, 241), (241, 243, 248), (221, 226, 236)),
        ("tropical", "summer"): ((90, 170, 60), (172, 190, 72), (60, 140, 50), (202, 172, 72)),
    }
)
_FLOWERS: Mapping[tuple[str, str], tuple[RGB, ...]] = MappingProxyType(
    {
        ("grassland", "spring"): ((226, 62, 62), (246, 216, 62), (250, 250, 246), (152, 92, 202)),
        ("grassland", "autumn"): ((150, 120, 60), (170, 140, 70), (134, 120, 62), (130, 96, 56)),
        ("desert", "summer"): ((200, 170, 112), (186, 160, 104), (150, 140, 86), (212, 184, 124)),
        ("tropical", "summer"): ((232, 72, 92), (250, 142, 42), (250, 240, 240), (202, 62, 162)),
    }
)
_ROOFS: Mapping[str, tuple[RGB, RGB, RGB, RGB]] = MappingProxyType(
    {
        "grassland": ((172, 72, 52), (120, 84, 60), (92, 98, 110), (72, 112, 86)),
        "desert": ((206, 172, 130), (188, 142, 102), (216, 198, 166), (172, 122, 92)),
        "snow": ((150, 62, 48), (110, 78, 58), (82, 88, 100), (62, 100, 80)),
        "tropical": ((168, 128, 74), (176, 82, 56), (122, 92, 62), (70, 120, 142)),
    }
)
_ROADS: Mapping[str, RGB] = MappingProxyType(
    {
        "grassland": (162, 132, 90),
        "desert": (186, 160, 120),
        "snow": (186, 188, 198),
        "tropical": (182, 152, 106),
    }
)
_ROCKS: Mapping[str, RGB] = MappingProxyType(
    {
        "grassland": (138, 132, 124),
        "desert": (170, 112, 82),
        "snow": (116, 118, 128),
        "tropical": (106, 104, 94),
    }
)
_SNOW_WHITE: RGB = (240, 244, 250)

# Light: per time of day (multiplier, offset), per weather (multiplier, desaturation, offset).
_TIME_LIGHT: Mapping[str, tuple[RGB | tuple[float, float, float], RGB]] = MappingProxyType(
    {
        "day": ((1.0, 1.0, 1.0), (0, 0, 0)),
        "dusk": ((0.96, 0.8, 0.68), (14, 4, 0)),
        "night": ((0.3, 0.36, 0.56), (6, 8, 18)),
    }
)
_WEATHER_LIGHT: Mapping[str, tuple[float, float, RGB]] = MappingProxyType(
    {
        "clear": (1.0, 0.0, (0, 0, 0)),
        "cloudy": (0.86, 0.25, (0, 0, 0)),
        "rain": (0.84, 0.15, (0, 4, 10)),  # the wet ground is darker and deeper already
        "fog": (0.95, 0.3, (0, 0, 0)),
        "snowfall": (0.88, 0.35, (8, 10, 14)),
    }
)
# Weather on the land (not on water, lamps or bridges' shadows): under rain each material is
# darker and deeper in colour by (darken, saturate), under snowfall it is covered toward snow
# white by the share given.
_WET: Mapping[int, tuple[float, float]] = MappingProxyType(
    {TERRAIN: (0.82, 1.25), GLOW_NEAR: (0.82, 1.25), GLOW_FAR: (0.82, 1.25), ROAD: (0.7, 1.1),
     BRIDGE: (0.75, 1.1), FIELD: (0.8, 1.25), TREE: (0.85, 1.15), ROOF: (0.8, 1.1), ROCK: (0.72, 1.0),
     FLOWER: (0.85, 1.2)}
)
_SNOW_COVER: Mapping[int, float] = MappingProxyType(
    {TERRAIN: 0.6, GLOW_NEAR: 0.6, GLOW_FAR: 0.6, ROAD: 0.4, BRIDGE: 0.3, FIELD: 0.65, TREE: 0.3, ROOF: 0.7,
     ROCK: 0.35, FLOWER: 0.75}
)
_GLOW: Mapping[str, tuple[RGB, RGB]] = MappingProxyType(
    {
        "day": ((0, 0, 0), (0, 0, 0)),
        "dusk": ((70, 52, 18), (34, 26, 8)),
        "night": ((120, 92, 38), (56, 42, 16)),
    }
)
_LAMP: Mapping[str, RGB] = MappingProxyType(
    {"day": (72, 66, 56), "dusk": (255, 214, 120), "night": (255, 226, 140)}
)


def _pick(table: Mapping[tuple[str, str], T], biome: str, season: str) -> T:
    """Entry for (biome, season), else (biome, summer), else (grassland, season/summer)."""
    for key in ((biome, season), (biome, "summer"), ("grassland", season), ("grassland", "summer")):
        if key in table:
            return table[key]
    raise KeyError((biome, season))


def terrain_colors(biome: str, season: str) -> np.ndarray:
    """(N_LEVELS, 3) float32 base colour of each height level."""
    bands = list(_BANDS[biome])
    if (biome, season) in _SEASON_GROUND:
        bands[3], bands[4] = _SEASON_GROUND[(biome, season)]
    out = np.zeros((N_LEVELS, 3), dtype=np.float32)
    start = 0
    for (c0, c1), end in zip(bands, _BAND_ENDS, strict=True):
        t = np.linspace(0.0, 1.0, end - start, dtype=np.float32)[:, None]
        out[start:end] = np.asarray(c0) * (1 - t) + np.asarray(c1) * t
        start = end
    return out


def _ramp(color: RGB | np.ndarray, lo: float, hi: float) -> np.ndarray:
    """(N_TONE, 3): the colour scaled from ``lo`` (tone 0) to ``hi`` (top tone)."""
    t = np.linspace(lo, hi, N_TONE, dtype=np.float32)[:, None]
    return np.asarray(color, dtype=np.float32)[None, :] * t


def apply_light(rgb: np.ndarray, attrs: SceneAttrs) -> np.ndarray:
    """Time-of-day and weather light on float colours (..., 3) in 0..255."""
    t_mul, t_add = _TIME_LIGHT[attrs.time]
    w_mul, desat, w_add = _WEATHER_LIGHT[attrs.weather]
    rgb = np.asarray(rgb, dtype=np.float32)
    gray = rgb @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    rgb = rgb * (1 - desat) + gray[..., None] * desat
    return rgb * np.asarray(t_mul, np.float32) * w_mul + np.asarray(t_add) + np.asarray(w_add)


def base_colors(attrs: SceneAttrs) -> np.ndarray:
    """(N_MAT, N_VAL, 3) float32 unlit, unshaded colours."""
    biome, season = attrs.biome, attrs.season
    base = np.zeros((N_MAT, N_VAL, 3), dtype=np.float32)
    ground = terrain_colors(biome, season)
    base[TERRAIN] = base[GLOW_NEAR] = base[GLOW_FAR] = ground
    lowland = ground[(BEACH_END + LOW_END) // 2]
    road = np.asarray(_ROADS[biome], np.float32)
    base[ROAD, :N_TONE] = _ramp(road, 0.55, 1.1)
    base[BRIDGE, :N_TONE] = _ramp((140, 98, 58), 0.45, 1.15)
    base[ROCK, :N_TONE] = _ramp(_ROCKS[biome], 0.5, 1.2)
    if biome == "snow":
        base[ROCK, 11:N_TONE] = _SNOW_WHITE
    base[LAMP, :] = _LAMP["day"]
    fields = _pick(_FIELDS, biome, season)
    trees = _pick(_TREES, biome, season)
    soil = road * 0.78
    for v in range(4):
        rows = slice(v * N_TONE, (v + 1) * N_TONE)
        crop = np.asarray(fields[v], np.float32)
        hedge = 0.4 * np.asarray(trees[0], np.float32) + 0.4 * crop
        tone = np.arange(N_TONE)[:, None]
        base[FIELD, rows] = np.where(
            tone >= 8, crop, np.where(tone >= 2, 0.55 * crop + 0.45 * soil, hedge)
        )
        base[TREE, rows] = _ramp(trees[v], 0.5, 1.3)
        if biome == "snow":
            base[TREE, v * N_TONE + N_TONE - 1] = _SNOW_WHITE
        roof = np.asarray(_ROOFS[biome][v], np.float32)
        ramp = _ramp(roof, 0.45, 1.15)
        if biome == "snow":  # snow lies on both roof halves; ridge and eaves show the roof
            ramp[5:13] = np.linspace(0.78, 0.98, 8)[:, None] * np.asarray(_SNOW_WHITE)
        ramp[N_TONE - 1] = (96, 64, 54) if biome != "snow" else (80, 70, 66)  # chimney
        base[ROOF, rows] = ramp
        base[FLOWER, rows] = _flower(biome, season, v, lowland)
    return base


def _flower(biome: str, season: str, v: int, lowland: np.ndarray) -> np.ndarray:
    """Colour of flower variant v: blooms, dry tufts, or (on snow) barely-there bumps."""
    if biome == "snow":
        return lowland * (0.93 + 0.02 * v)
    key = (biome, season) if (biome, season) in _FLOWERS else (biome, "summer")
    if key in _FLOWERS:
        return np.asarray(_FLOWERS[key][v], np.float32)
    if v == 3:  # grassland summer: grass tufts and the odd buttercup
        return np.asarray((240, 214, 74), np.float32)
    return lowland * (0.82, 1.12, 0.9)[v]


def weather_ground(base: np.ndarray, attrs: SceneAttrs) -> np.ndarray:
    """The unlit colours (N_MAT, N_VAL, 3) with the weather lying on the land: wet under rain,
    snow-covered under snowfall; water keeps its colour."""
    if attrs.weather not in ("rain", "snowfall"):
        return base
    out = base.copy()
    for m in _WET if attrs.weather == "rain" else _SNOW_COVER:
        land = slice(SEA_END, None) if m in (TERRAIN, GLOW_NEAR, GLOW_FAR) else slice(None)
        rgb = out[m, land]
        if attrs.weather == "rain":
            darken, saturate = _WET[m]
            gray = rgb @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
            out[m, land] = np.clip((gray[:, None] + (rgb - gray[:, None]) * saturate) * darken, 0, 255)
        else:
            cover = _SNOW_COVER[m]
            out[m, land] = rgb * (1 - cover) + np.asarray(_SNOW_WHITE, np.float32) * cover
    return out


def build_lut(attrs: SceneAttrs) -> np.ndarray:
    """(N_MAT * N_VAL * N_SHADE, 3) uint8 colour of every texel code, for this scene."""
    base = weather_ground(base_colors(attrs), attrs)
    s = np.arange(N_SHADE, dtype=np.float32)
    land_mul = 0.62 + 0.0475 * s  # shade 8 -> 1.0
    water_mul = 0.93 + 0.00875 * s
    mul = np.broadcast_to(land_mul, (N_MAT, N_VAL, N_SHADE)).copy()
    for m in (TERRAIN, GLOW_NEAR, GLOW_FAR):
        mul[m, :SEA_END] = water_mul
    lit = apply_light(base[:, :, None, :] * mul[..., None], attrs)  # (M, V, S, 3)
    near, far = _GLOW[attrs.time]
    lit[GLOW_NEAR] += np.asarray(near, np.float32)
    lit[GLOW_FAR] += np.asarray(far, np.float32)
    if attrs.time != "day":
        lit[LAMP] = np.asarray(_LAMP[attrs.time], np.float32)
    return np.clip(np.rint(lit), 0, 255).astype(np.uint8).reshape(-1, 3)
