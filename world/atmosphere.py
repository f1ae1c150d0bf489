"""Weather and water effects applied to each frame after the ground and the actors.

Weather is a property of the world, not of the screen: everything here is anchored to the
world and moves with the ground (clouds and fog also drift slowly with the seed's wind), so
a place looks the same each time the camera comes back to it, and the only things that move
across the ground on their own are the actors, the water's slow shimmer and the drifting
clouds and fog. The ground itself is wet under rain and covered under snowfall
(``palette.build_lut``); the tint of the light is there too.

    cloud shadows   multiply brightness by 1 - strength * cover, cover from the seed's
                    cloud field thresholded per weather, drifting with the seed's wind
    fog             blend toward the fog colour by alpha = 0.42 + 0.6 * (fog field - 0.5),
                    drifting with the wind
    water shimmer   slow, faint glints on water: two travelling sine waves multiplied
    rain            slanted streaks of wet sheen lying on the land
    snowfall        flakes and drifts lying on the snowy land

(Until issue 38 rain and snow fell as screen-fixed particles, 3 and up to 1.6 units a frame,
and the water glittered at twice the strength and speed: per-frame change that no memory of
the place can hold.) Everything depends only on the seed, the scene, the camera and the
world clock, so it is deterministic, and predictable from past frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .layout import Layout, stream
from .motion import VIEW
from .noise import upsample
from .palette import apply_light
from .scene import SceneAttrs

# Cloud cover threshold and shadow strength per weather (no entry: no cloud shadows).
_CLOUDS = MappingProxyType(
    {"clear": (0.64, 0.3), "cloudy": (0.42, 0.34), "rain": (0.36, 0.22), "snowfall": (0.46, 0.22)}
)
_FOG_COLOR = MappingProxyType(
    {"day": (202, 206, 212), "dusk": (204, 176, 156), "night": (38, 44, 60)}
)
_SHIMMER = MappingProxyType(
    {
        "grassland": (7.0, 9.0),
        "desert": (7.0, 9.0),
        "snow": (0.0, 6.0),
        "tropical": (9.0, 10.0),
    }
)
_SHIMMER_SPEED = (0.09, 0.07)  # radians a frame of the two travelling waves: calm water
_TIME_DIM = MappingProxyType({"day": 1.0, "dusk": 0.75, "night": 0.3})


@dataclass(frozen=True, slots=True, eq=False)
class Blend:
    """``frame * keep + paint``: a layer of colour with coverage a, precomputed as
    keep = 1 - a (H, W, 1) and paint = a * colour (H, W, 3)."""

    keep: np.ndarray
    paint: np.ndarray

    @classmethod
    def of(cls, alpha: np.ndarray, color: np.ndarray) -> Blend:
        a = alpha.astype(np.float32)[..., None]
        return cls(keep=1.0 - a, paint=a * np.asarray(color, np.float32))

    def apply(self, frame: np.ndarray, y0: int, x0: int) -> None:
        h, w = frame.shape[:2]
        frame *= wrap_crop(self.keep, y0, x0, h, w)
        frame += wrap_crop(self.paint, y0, x0, h, w)


@dataclass(frozen=True, slots=True, eq=False)
class Atmosphere:
    """Per-scene, per-bucket weather fields, each tiling the world with period P pixels."""

    ppu: float
    clouds: np.ndarray | None  # (P, P, 1) float32 brightness multiplier, P = period * ppu
    fog: Blend | None  # (P, P) fog layer
    shimmer: tuple[float, float, float]  # glint brightness per water class (land, shallow, deep)
    marks: Blend | None  # (P, P) rain streaks or snow flakes, fixed to the ground
    wind: tuple[float, float]


def _smoothstep(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, 0.0, 1.0)
    return t * t * (3 - 2 * t)


def _streaks(
    rng: np.random.Generator,
    ppu: float,
    period: int,
    density: float,
    length: float,
    width: float,
    direction: tuple[float, float],
) -> np.ndarray:
    """(P, P) alpha, P = period * ppu, of soft line segments (world units), ``density`` of
    them per VIEW x VIEW units, on a tile of the world."""
    size = round(period * ppu)
    count = round(density * (period / VIEW) ** 2)
    alpha = np.zeros((size, size), dtype=np.float32)
    starts = rng.random((count, 2)) * period
    dy, dx = np.asarray(direction) / np.hypot(*direction)
    steps = np.linspace(0.0, length, max(2, int(length * ppu * 2)))
    pts = starts[:, None, :] + steps[None, :, None] * np.array([dy, dx])  # (count, S, 2)
    r = max(1, int(np.ceil(width * ppu)))
    for oy in range(-r + 1, r):
        for ox in range(-r + 1, r):
            weight = max(0.0, 1.0 - np.hypot(oy, ox) / r) if r > 1 else 1.0
            iy = (np.floor(pts[..., 0] * ppu).astype(int) + oy) % size
            ix = (np.floor(pts[..., 1] * ppu).astype(int) + ox) % size
            np.maximum.at(alpha, (iy.ravel(), ix.ravel()), weight)
    return alpha


def build_atmosphere(layout: Layout, attrs: SceneAttrs, bucket: int) -> Atmosphere:
    ppu = bucket / VIEW
    period_px = round(layout.clouds.shape[0] * ppu)
    dim = _TIME_DIM[attrs.time]
    clouds = None
    if attrs.weather in _CLOUDS:
        thr, strength = _CLOUDS[attrs.weather]
        cover = _smoothstep((upsample(layout.clouds, period_px) - thr) / 0.14)
        clouds = (1.0 - strength * dim * cover).astype(np.float32)[..., None]
    fog = None
    if attrs.weather == "fog":
        field = upsample(layout.fog, period_px)
        fog = Blend.of(np.clip(0.42 + 0.6 * (field - 0.5), 0.1, 0.85), _FOG_COLOR[attrs.time])
    shallow, deep = _SHIMMER[attrs.biome]
    rng = stream(layout.seed, "precipitation")
    period = layout.clouds.shape[0]
    marks = None
    if attrs.weather == "rain":  # sheen on the wet ground, slanted as the rain falls
        color = apply_light(np.array([196, 206, 222], np.float32), attrs)
        marks = Blend.of(0.3 * _streaks(rng, ppu, period, 40, 3.5, 0.4, (3.0, -1.0)), color)
    elif attrs.weather == "snowfall":  # flakes and small drifts lying on the ground
        color = np.minimum(apply_light(np.array([250, 250, 255], np.float32), attrs) * 1.15, 255)
        small = 0.7 * _streaks(rng, ppu, period, 60, 0.3, 0.5, (0.8, 0.3))
        large = 0.8 * _streaks(rng, ppu, period, 14, 0.6, 0.9, (1.6, -0.4))
        marks = Blend.of(np.maximum(small, large), color)
    return Atmosphere(
        ppu=ppu,
        clouds=clouds,
        fog=fog,
        shimmer=(0.0, shallow * dim, deep * dim),
        marks=marks,
        wind=layout.wind,
    )


def wrap_crop(tex: np.ndarray, y0: int, x0: int, h: int, w: int) -> np.ndarray:
    """(h, w, ...) window of a tiling texture starting at texel (y0, x0), wrapping.
    A view when the window does not cross the texture's edge, else a copy of <= 4 blocks."""
    ny, nx = tex.shape[:2]
    y0, x0 = y0 % ny, x0 % nx
    if y0 + h <= ny and x0 + w <= nx:
        return tex[y0 : y0 + h, x0 : x0 + w]
    if h > ny or w > nx:
        rows = (y0 + np.arange(h)) % ny
        cols = (x0 + np.arange(w)) % nx
        return tex[rows[:, None], cols[None, :]]
    out = np.empty((h, w, *tex.shape[2:]), dtype=tex.dtype)
    hy, wx = min(h, ny - y0), min(w, nx - x0)  # sizes of the blocks before the edge
    out[:hy, :wx] = tex[y0 : y0 + hy, x0 : x0 + wx]
    if wx < w:
        out[:hy, wx:] = tex[y0 : y0 + hy, : w - wx]
    if hy < h:
        out[hy:, :wx] = tex[: h - hy, x0 : x0 + wx]
        if wx < w:
            out[hy:, wx:] = tex[: h - hy, : w - wx]
    return out


def add_shimmer(
    frame: np.ndarray, water: np.ndarray, atm: Atmosphere, top_left: tuple[float, float], clock: int
) -> None:
    """Slow glints on water pixels; ``water`` is the (H, W) water class of each pixel."""
    if not any(atm.shimmer) or not water.any():
        return
    amp = np.asarray(atm.shimmer, np.float32)[water]
    h, w = water.shape
    wy = top_left[0] + (np.arange(h) + 0.5) / atm.ppu  # world coordinates of pixel centres
    wx = top_left[1] + (np.arange(w) + 0.5) / atm.ppu

    def wave(ky: float, kx: float, omega: float) -> np.ndarray:
        # sin(ky*y + kx*x - omega*t) as a sum of two outer products (separable).
        ay = ky * wy - omega * clock
        ax = kx * wx
        return np.outer(np.sin(ay), np.cos(ax)) + np.outer(np.cos(ay), np.sin(ax))

    s = wave(0.35, 0.9, _SHIMMER_SPEED[0]) * wave(0.8, -0.3, _SHIMMER_SPEED[1])
    frame += (amp * _smoothstep((s - 0.55) / 0.45))[..., None]


def add_marks(frame: np.ndarray, water: np.ndarray, atm: Atmosphere, top_left: tuple[float, float]) -> None:
    """Rain streaks or snow flakes lying on the land (``water``, the (B, B) water class of
    each pixel, is 0 there), on a (B, B, 3) float32 frame, in place."""
    if atm.marks is None:
        return
    marked = frame.copy()
    atm.marks.apply(marked, int(np.floor(top_left[0] * atm.ppu)), int(np.floor(top_left[1] * atm.ppu)))
    np.copyto(frame, marked, where=(water == 0)[..., None])


def apply_weather(
    frame: np.ndarray, atm: Atmosphere, top_left: tuple[float, float], clock: int
) -> None:
    """Cloud shadows and fog on a (B, B, 3) float32 frame, in place."""
    b = frame.shape[0]
    if atm.clouds is not None or atm.fog is not None:
        oy = int(np.floor((top_left[0] - atm.wind[0] * clock) * atm.ppu))
        ox = int(np.floor((top_left[1] - atm.wind[1] * clock) * atm.ppu))
        if atm.clouds is not None:
            frame *= wrap_crop(atm.clouds, oy, ox, b, b)
        if atm.fog is not None:
            atm.fog.apply(frame, oy, ox)
