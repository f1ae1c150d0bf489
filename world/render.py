"""Frames: a sub-pixel crop of the scene's map texture with the rain or snow lying on it, then
water glints, actors, cloud shadows and fog on top.

For a bucket of B pixels the camera shows VIEW × VIEW world units at ppu = B / VIEW
pixels per unit. Frame pixel i (row or column) covers world coordinate
``top_left + (i + 0.5) / ppu``; texture texel k covers ``(k + 0.5) / ppu``; so pixel i
is the texture at continuous texel ``top_left * ppu + i``, read bilinearly (exact
texels when the camera sits on the pixel grid, as it does under keys alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .actors import Actors
from .atmosphere import Atmosphere, add_marks, add_shimmer, apply_weather, wrap_crop
from .sprites import SpriteSheet, draw_actors


@dataclass(frozen=True, slots=True, eq=False)
class BucketLook:
    """Everything one bucket needs to draw the current scene."""

    bucket: int
    ppu: float
    texture: np.ndarray  # (M, M, 3) uint8 map colours, M = map_size * ppu
    water: np.ndarray  # (M, M) uint8 water class per texel
    sprites: SpriteSheet
    atmosphere: Atmosphere


def downsample(img: np.ndarray, size: int) -> np.ndarray:
    """Area-average a square (N, N, ...) uint8 image to (size, size, ...)."""
    n = img.shape[0]
    if size == n:
        return img
    if n % size == 0:
        f = n // size
        acc = np.full((size, size, *img.shape[2:]), f * f // 2, dtype=np.uint32)
        for dy in range(f):
            for dx in range(f):
                acc += img[dy::f, dx::f]
        return (acc // (f * f)).astype(np.uint8)
    return np.asarray(Image.fromarray(img).resize((size, size), Image.Resampling.BOX))


def nearest(img: np.ndarray, size: int) -> np.ndarray:
    """Nearest-texel resize of a square (N, N) image, sampling at texel centres."""
    n = img.shape[0]
    idx = ((np.arange(size) + 0.5) * n / size).astype(np.int64)
    return img[np.ix_(idx, idx)]


def ground(look: BucketLook, top_left: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The ground under the camera whose view starts at ``top_left`` (world units): the map
    and the rain or snow lying on it, as (B, B, 3) float32 colours (owned, writable), and the
    (B, B) water class of each pixel."""
    b = look.bucket
    ty, tx = top_left[0] * look.ppu, top_left[1] * look.ppu
    ny, nx = int(np.floor(ty)), int(np.floor(tx))
    fy, fx = np.float32(ty - ny), np.float32(tx - nx)
    win = wrap_crop(look.texture, ny, nx, b + 1, b + 1).astype(np.float32)  # (B+1, B+1, 3)
    rows = win[:b] if fy == 0 else win[:b] * (1 - fy) + win[1:] * fy
    frame = rows[:, :b] if fx == 0 else rows[:, :b] * (1 - fx) + rows[:, 1:] * fx
    water = wrap_crop(look.water, ny + int(fy >= 0.5), nx + int(fx >= 0.5), b, b)
    frame = np.array(frame, dtype=np.float32)
    add_marks(frame, water, look.atmosphere, top_left)
    return frame, water


def render_frame(
    look: BucketLook, top_left: tuple[float, float], actors: Actors, clock: int, map_size: int
) -> np.ndarray:
    """(B, B, 3) uint8 frame of the camera whose view starts at ``top_left`` (world units)."""
    frame, water = ground(look, top_left)
    add_shimmer(frame, water, look.atmosphere, top_left, clock)
    draw_actors(frame, look.sprites, actors, top_left, map_size)
    apply_weather(frame, look.atmosphere, top_left, clock)
    return to_uint8(frame)


def to_uint8(frame: np.ndarray) -> np.ndarray:
    return np.clip(frame + 0.5, 0, 255).astype(np.uint8)
