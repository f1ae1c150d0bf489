"""The texel encoding of a world raster, and how shapes are stamped into it.

A world raster is three uint8 planes of the same (N, N) torus: ``mat`` (what is there),
``val`` (a per-material parameter, < 64) and ``shade`` (lighting, < 16, 8 = flat). The
scene palette is a lookup table over ``(mat, val, shade)``, so re-colouring a world for
a new scene is one gather and the geometry never changes.

``val`` per material:
    TERRAIN, GLOW_*   height level (terrain.N_LEVELS), so lamp glow keeps the ground colour
    ROAD, BRIDGE, ROCK, LAMP  tone in [0, 16): 0 = edge / darkest
    FIELD, ROOF, TREE, FLOWER  variant << 4 | tone: 4 colour variants, tone in [0, 16)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .terrain import N_SHADE, SHADE_FLAT

TERRAIN, ROAD, BRIDGE, FIELD, ROOF, LAMP, GLOW_NEAR, GLOW_FAR, TREE, ROCK, FLOWER = range(11)
N_MAT = 16
N_VAL = 64
N_TONE = 16

# A shape: (dy, dx) in world units from its centre -> (inside mask, tone in [0, 1]).
ShapeFn = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def lut_index(mat: np.ndarray, val: np.ndarray, shade: np.ndarray) -> np.ndarray:
    """Flat palette index of each texel: (mat * N_VAL + val) * N_SHADE + shade, uint16."""
    return (mat.astype(np.uint16) * N_VAL + val) * N_SHADE + shade


def variant_val(variant: np.ndarray | int, tone: np.ndarray | int) -> np.ndarray:
    """``val`` of the variant-carrying materials."""
    return (np.asarray(variant, dtype=np.uint8) << 4) | np.asarray(tone, dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class Stamp:
    """A rasterised shape: texel offsets from its anchor and a tone per texel."""

    dy: np.ndarray  # (K,) int64
    dx: np.ndarray  # (K,) int64
    tone: np.ndarray  # (K,) uint8 in [0, N_TONE)


def rasterize(shape: ShapeFn, radius: float, density: int) -> Stamp:
    """Evaluate ``shape`` at the texel centres within ``radius`` world units of the anchor."""
    r = int(np.ceil(radius * density)) + 1
    grid = np.arange(-r, r + 1)
    ty, tx = np.meshgrid(grid, grid, indexing="ij")
    inside, tone = shape(ty / density, tx / density)
    inside = np.broadcast_to(inside, ty.shape)
    tone = np.broadcast_to(tone, ty.shape)
    tone_q = np.clip(np.rint(tone * (N_TONE - 1)), 0, N_TONE - 1).astype(np.uint8)
    return Stamp(
        dy=ty[inside].astype(np.int64), dx=tx[inside].astype(np.int64), tone=tone_q[inside]
    )


def disk(radius: float, density: int) -> Stamp:
    """Filled disk of ``radius`` world units (tone 0)."""
    return rasterize(lambda y, x: (np.hypot(y, x) <= radius, y * 0.0), radius, density)


@dataclass(frozen=True, slots=True, eq=False)
class Layers:
    """The three planes of a world raster (mutable contents, fixed shape)."""

    mat: np.ndarray
    val: np.ndarray
    shade: np.ndarray
    levels: np.ndarray  # terrain height levels, read-only reference for placement rules

    @property
    def size(self) -> int:
        return int(self.mat.shape[0])

    def copy(self) -> Layers:
        return Layers(self.mat.copy(), self.val.copy(), self.shade.copy(), self.levels)

    def index(self, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        """Flat indices of texel coordinates (any shape, unwrapped), raveled."""
        n = self.size
        return ((np.asarray(ys) % n) * n + (np.asarray(xs) % n)).ravel()

    def stamp_index(self, anchors: np.ndarray, stamp: Stamp) -> np.ndarray:
        """(A, K) flat indices of ``stamp`` placed at integer texel ``anchors`` (A, 2)."""
        ys = anchors[:, 0:1] + stamp.dy[None, :]
        xs = anchors[:, 1:2] + stamp.dx[None, :]
        return self.index(ys, xs).reshape(len(anchors), -1)

    def where(
        self, idx: np.ndarray, mats: tuple[int, ...], lo: int = 0, hi: int = 64
    ) -> np.ndarray:
        """Mask over ``idx``: texel material in ``mats`` and height level in [lo, hi)."""
        lv = self.levels.flat[idx]
        return np.isin(self.mat.flat[idx], mats) & (lv >= lo) & (lv < hi)

    def put(
        self,
        idx: np.ndarray,
        mat: int,
        val: np.ndarray | int | None = None,
        shade: np.ndarray | int | None = SHADE_FLAT,
        keep: np.ndarray | None = None,
    ) -> None:
        """Write a material at flat indices (later duplicates win). ``val=None`` keeps the
        texel's value (used by glow, which keeps the ground's height level)."""
        shape = np.shape(idx)
        idx = np.ravel(idx)
        val_a = None if val is None else np.broadcast_to(np.asarray(val, np.uint8), shape).ravel()
        shade_a = (
            None if shade is None else np.broadcast_to(np.asarray(shade, np.uint8), shape).ravel()
        )
        if keep is not None:
            keep = np.broadcast_to(keep, shape).ravel()
            idx = idx[keep]
            val_a = None if val_a is None else val_a[keep]
            shade_a = None if shade_a is None else shade_a[keep]
        self.mat.flat[idx] = mat
        if val_a is not None:
            self.val.flat[idx] = val_a
        if shade_a is not None:
            self.shade.flat[idx] = shade_a

    def darken(self, idx: np.ndarray, keep: np.ndarray | None = None) -> None:
        """Cast a shadow: shade drops to 5/8 (not cumulative under overlap)."""
        idx = idx.ravel() if keep is None else idx.ravel()[keep.ravel()]
        self.shade.flat[idx] = (self.shade.flat[idx].astype(np.uint16) * 5 // 8).astype(np.uint8)


def clamp_shade(shade: np.ndarray) -> np.ndarray:
    return np.clip(shade, 0, N_SHADE - 1).astype(np.uint8)
