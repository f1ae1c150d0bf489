"""Actor sprites: top-down animals and boats, pre-rasterised per heading and drawn onto
frames with premultiplied alpha.

A sprite is rasterised at a bucket's pixel density with 3 × 3 supersampling, for
N_HEADINGS headings, from layered shapes in the actor's frame (u forward, v to the
right, world units): a soft shadow offset to the lower right like every shadow in the
world, then body parts. Colours come from the biome and the scene light.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .actors import ANIMAL, BOAT, N_VARIANTS, Actors
from .palette import apply_light
from .scene import SceneAttrs

N_HEADINGS = 16
_SS = 3  # supersampling per axis
_SHADOW = (0.6, 0.6)  # world units (y, x)
_REACH = MappingProxyType(
    {ANIMAL: 3.6, BOAT: 8.5}
)  # world units from the anchor that a sprite may cover

# (body, head/detail) colours per biome and variant.
_ANIMALS: Mapping[str, tuple[tuple[tuple[int, int, int], tuple[int, int, int]], ...]] = (
    MappingProxyType(
        {
            "grassland": (((238, 236, 226), (46, 42, 38)), ((124, 84, 54), (234, 228, 216))),
            "desert": (((198, 156, 98), (166, 124, 76)), ((88, 78, 68), (58, 50, 44))),
            "snow": (((120, 92, 66), (232, 228, 220)), ((150, 154, 164), (64, 66, 74))),
            "tropical": (((82, 64, 50), (48, 38, 30)), ((240, 240, 234), (232, 172, 60))),
        }
    )
)
_HULL, _DECK, _SAIL, _WAKE = (118, 80, 46), (170, 130, 84), (246, 244, 238), (232, 242, 248)


@dataclass(frozen=True, slots=True)
class Sprite:
    rgb: np.ndarray  # (h, w, 3) float32, premultiplied by alpha
    alpha: np.ndarray  # (h, w, 1) float32
    reach: int  # pixels from the anchor to the sprite's edge; h = w = 2 * reach + 1


# Colour slots of the sprite shapes.
_BODY_SLOT, _HEAD_SLOT, _HULL_SLOT, _DECK_SLOT, _SAIL_SLOT, _WAKE_SLOT = range(6)
N_SLOTS = 6


def _layers(kind: int, u: np.ndarray, v: np.ndarray) -> list[tuple[np.ndarray, int, float]]:
    """Shapes of one actor as (coverage mask, colour slot, opacity), back to front."""
    if kind == ANIMAL:
        body = (u / 2.0) ** 2 + (v / 1.15) ** 2 <= 1.0
        head = (u - 2.15) ** 2 + v**2 <= 0.72**2
        return [(body, _BODY_SLOT, 1.0), (head, _HEAD_SLOT, 1.0)]
    half = np.where(u <= 1.0, 1.55, 1.55 * (1.0 - (u - 1.0) / 2.7))
    hull = (u >= -3.6) & (u <= 3.7) & (np.abs(v) <= half)
    deck = (u >= -3.1) & (u <= 3.0) & (np.abs(v) <= half - 0.45)
    sail = ((u + 0.3) / 2.3) ** 2 + ((v - 0.75) / 0.85) ** 2 <= 1.0
    behind = -3.6 - u
    wake = (behind > 0) & (behind < 4.5) & (np.abs(v) <= 0.5 + 0.35 * behind)
    return [
        (wake, _WAKE_SLOT, 0.35),
        (hull, _HULL_SLOT, 1.0),
        (deck, _DECK_SLOT, 1.0),
        (sail, _SAIL_SLOT, 1.0),
    ]


@dataclass(frozen=True, slots=True)
class SpriteShape:
    """Scene-independent geometry of one sprite: how much each colour slot contributes."""

    weights: np.ndarray  # (h, w, N_SLOTS) float32, premultiplied contribution per slot
    alpha: np.ndarray  # (h, w, 1) float32
    reach: int


def _rasterize(kind: int, heading: float, ppu: float) -> SpriteShape:
    reach = int(np.ceil(_REACH[kind] * ppu))
    side = 2 * reach + 1
    sub = (np.arange(side * _SS) + 0.5) / _SS - 0.5 - reach  # pixel units from the anchor
    yy, xx = np.meshgrid(sub / ppu, sub / ppu, indexing="ij")  # world units
    weights = np.zeros((side * _SS, side * _SS, N_SLOTS), dtype=np.float32)
    alpha = np.zeros((side * _SS, side * _SS), dtype=np.float32)
    s, c = np.sin(heading), np.cos(heading)
    for dy, dx, shadow in ((_SHADOW[0], _SHADOW[1], True), (0.0, 0.0, False)):
        y, x = yy - dy, xx - dx
        u, v = y * s + x * c, -y * c + x * s
        for mask, slot, opacity in _layers(kind, u, v):
            if shadow and slot == _WAKE_SLOT:
                continue
            a = mask * np.float32(0.35 if shadow else opacity)
            weights *= 1.0 - a[..., None]
            if not shadow:  # a shadow adds black: it only covers what is below
                weights[..., slot] += a
            alpha = alpha * (1 - a) + a
    pool = (side, _SS, side, _SS)
    return SpriteShape(
        weights=weights.reshape(*pool, N_SLOTS).mean(axis=(1, 3)).astype(np.float32),
        alpha=alpha.reshape(pool).mean(axis=(1, 3))[..., None].astype(np.float32),
        reach=reach,
    )


def build_shapes(ppu: float) -> tuple[tuple[SpriteShape, ...], ...]:
    """Sprite geometry [kind][heading bin] at ``ppu`` pixels per world unit."""
    return tuple(
        tuple(_rasterize(kind, 2 * np.pi * h / N_HEADINGS, ppu) for h in range(N_HEADINGS))
        for kind in (ANIMAL, BOAT)
    )


@dataclass(frozen=True, slots=True)
class SpriteSheet:
    """Sprites indexed [kind][variant][heading bin], at one pixel density."""

    ppu: float
    sprites: tuple[tuple[tuple[Sprite, ...], ...], ...]
    max_reach: int


def build_sprites(
    shapes: tuple[tuple[SpriteShape, ...], ...], attrs: SceneAttrs, ppu: float
) -> SpriteSheet:
    """Colour the sprite geometry for a scene."""
    sheet = []
    for kind in (ANIMAL, BOAT):
        per_variant = []
        for variant in range(N_VARIANTS):
            body, head = _ANIMALS[attrs.biome][variant]
            deck = _DECK if variant == 0 else (150, 70, 50)
            raw = np.array([body, head, _HULL, deck, _SAIL, _WAKE], dtype=np.float32)
            colors = np.clip(apply_light(raw, attrs), 0, 255).astype(np.float32)
            if kind == BOAT and variant == 1:  # rowing boat: no sail, a dark bench
                colors[_SAIL_SLOT] = colors[_HULL_SLOT] * 0.8
            per_variant.append(
                tuple(
                    Sprite(rgb=shape.weights @ colors, alpha=shape.alpha, reach=shape.reach)
                    for shape in shapes[kind]
                )
            )
        sheet.append(tuple(per_variant))
    reach = max(s.reach for k in shapes for s in k)
    return SpriteSheet(ppu=ppu, sprites=tuple(sheet), max_reach=reach)


def draw_actors(
    frame: np.ndarray,
    sheet: SpriteSheet,
    actors: Actors,
    top_left: tuple[float, float],
    map_size: int,
) -> None:
    """Composite every actor whose sprite reaches into ``frame`` (H, W, 3) float32."""
    if not len(actors):
        return
    h, w = frame.shape[:2]
    ppu = sheet.ppu
    rel = (actors.pos - np.asarray(top_left)) % map_size  # world units from the top left
    margin = sheet.max_reach / ppu + 1.0
    rel = np.where(rel > map_size - margin, rel - map_size, rel)
    anchor = np.rint(rel * ppu - 0.5).astype(np.int64)  # pixel of the actor's centre
    visible = (
        (anchor[:, 0] >= -sheet.max_reach)
        & (anchor[:, 0] < h + sheet.max_reach)
        & (anchor[:, 1] >= -sheet.max_reach)
        & (anchor[:, 1] < w + sheet.max_reach)
    )
    bins = np.rint(actors.heading / (2 * np.pi) * N_HEADINGS).astype(np.int64) % N_HEADINGS
    for i in np.flatnonzero(visible):
        sp = sheet.sprites[actors.kind[i]][actors.variant[i]][bins[i]]
        y0, x0 = anchor[i, 0] - sp.reach, anchor[i, 1] - sp.reach
        side = 2 * sp.reach + 1
        fy0, fx0 = max(y0, 0), max(x0, 0)
        fy1, fx1 = min(y0 + side, h), min(x0 + side, w)
        if fy0 >= fy1 or fx0 >= fx1:
            continue
        sy, sx = slice(fy0 - y0, fy1 - y0), slice(fx0 - x0, fx1 - x0)
        region = frame[fy0:fy1, fx0:fx1]
        region *= 1.0 - sp.alpha[sy, sx]
        region += sp.rgb[sy, sx]
