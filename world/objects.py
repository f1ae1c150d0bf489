"""Static objects of one seed: villages of houses with lamps, roads and bridges between
them, crop fields, boulders and flower specks, drawn into a world raster.

Sizes are in world units (the camera sees 64 × 64): a house is 6–12 units long, a road
3 wide, a field 12–28, a boulder 1.5–4 across. Trees are separate (``trees.py``) because
the scene's vegetation level decides which of the seed's tree sites grow.
"""

from __future__ import annotations

import numpy as np

from .layers import (
    BRIDGE,
    FIELD,
    FLOWER,
    GLOW_FAR,
    GLOW_NEAR,
    LAMP,
    ROAD,
    ROCK,
    ROOF,
    TERRAIN,
    Layers,
    ShapeFn,
    disk,
    rasterize,
    variant_val,
)
from .terrain import BEACH_END, LOW_END, N_LEVELS, ROCK_END, SEA_END, UP_END

_VILLAGE_SPACING = 170.0  # world units between village centres, on average
_HOUSE_SIZES = ((6.0, 8.0), (7.0, 10.0), (7.0, 7.0), (8.0, 12.0), (6.0, 9.0))
_ROAD_EDGE, _ROAD_CORE = 1.6, 1.1  # road half-widths (units): dark verge, packed core


def wrap_delta(d: np.ndarray, size: float) -> np.ndarray:
    """Shortest signed difference on a torus of period ``size``."""
    return (d + size / 2) % size - size / 2


def choose_villages(rng: np.random.Generator, height: np.ndarray) -> np.ndarray:
    """(V, 2) village centres (y, x) in world units, on lowland, spread apart."""
    size = height.shape[0]
    target = max(2, round(size * size / _VILLAGE_SPACING**2))
    cand = rng.random((target * 20, 2)) * size
    lv = np.floor(height[cand[:, 0].astype(int), cand[:, 1].astype(int)] * N_LEVELS)
    cand = cand[(lv >= BEACH_END + 3) & (lv < LOW_END - 4)]
    chosen: list[np.ndarray] = []
    min_gap = 0.6 * _VILLAGE_SPACING * min(1.0, size / 512)
    for c in cand:
        if all(np.hypot(*wrap_delta(c - o, size)) >= min_gap for o in chosen):
            chosen.append(c)
        if len(chosen) == target:
            break
    return np.array(chosen, dtype=np.float64).reshape(-1, 2)


def plan_houses(
    rng: np.random.Generator, height: np.ndarray, villages: np.ndarray
) -> list[tuple[float, float, float, float, int]]:
    """Houses as (centre y, centre x, height, width, roof variant), on dry flat ground."""
    size = height.shape[0]
    houses: list[tuple[float, float, float, float, int]] = []
    for vy, vx in villages:
        base_variant = int(rng.integers(4))
        placed: list[tuple[float, float, float]] = []
        target = int(rng.integers(4, 11))
        for _ in range(target * 6):
            if len(placed) >= target:
                break
            ang, rad = rng.uniform(0, 2 * np.pi), rng.uniform(8.0, 34.0)
            cy, cx = vy + rad * np.sin(ang), vx + rad * np.cos(ang)
            h, w = _HOUSE_SIZES[int(rng.integers(len(_HOUSE_SIZES)))]
            if rng.random() < 0.5:
                h, w = w, h
            ys = (np.array([cy - h / 2 - 2, cy, cy + h / 2 + 3]).astype(int)) % size
            xs = (np.array([cx - w / 2 - 2, cx, cx + w / 2 + 2]).astype(int)) % size
            lv = np.floor(height[np.ix_(ys, xs)] * N_LEVELS)
            if lv.min() < BEACH_END or lv.max() >= UP_END:
                continue
            reach = max(h, w) / 2 + 3.0
            if any(
                np.hypot(*wrap_delta(np.array([cy - py, cx - px]), size)) < reach + pr
                for py, px, pr in placed
            ):
                continue
            variant = base_variant if rng.random() < 0.7 else int(rng.integers(4))
            placed.append((cy, cx, max(h, w) / 2))
            houses.append((cy % size, cx % size, h, w, variant))
    return houses


def draw_fields(
    rng: np.random.Generator, layers: Layers, villages: np.ndarray, density: int
) -> None:
    """Crop fields around villages: rectangles of rows, only over dry lowland."""
    for vy, vx in villages:
        for _ in range(int(rng.integers(2, 7))):
            ang, rad = rng.uniform(0, 2 * np.pi), rng.uniform(28.0, 62.0)
            cy, cx = vy + rad * np.sin(ang), vx + rad * np.cos(ang)
            h, w = rng.uniform(12.0, 28.0, size=2)
            y0, x0 = int((cy - h / 2) * density), int((cx - w / 2) * density)
            ty, tx = np.meshgrid(
                np.arange(int(h * density)), np.arange(int(w * density)), indexing="ij"
            )
            along = (ty if rng.random() < 0.5 else tx) // density
            tone = np.where(along % 3 < 2, 11, 5)  # rows: 2 units of crop, 1 of furrow
            border = (ty == 0) | (tx == 0) | (ty == ty.max()) | (tx == tx.max())
            tone = np.where(border, 1, tone)
            idx = layers.index(y0 + ty, x0 + tx)
            keep = layers.where(idx, (TERRAIN,), BEACH_END + 1, LOW_END)
            layers.put(idx, FIELD, variant_val(int(rng.integers(4)), tone.ravel()), keep=keep)


def _polyline(rng: np.random.Generator, a: np.ndarray, d: np.ndarray, step: float) -> np.ndarray:
    """Points (P, 2) from a along d with a smooth sideways wobble that vanishes at the ends."""
    length = float(np.hypot(*d))
    s = np.linspace(0.0, 1.0, max(2, int(length / step)))
    normal = np.array([d[1], -d[0]]) / max(length, 1e-9)
    k1, k2 = rng.uniform(0.5, 1.5), rng.uniform(1.5, 3.0)
    p1, p2 = rng.uniform(0, 2 * np.pi, size=2)
    wobble = (
        np.sin(np.pi * s)
        * length
        * (0.06 * np.sin(2 * np.pi * k1 * s + p1) + 0.02 * np.sin(2 * np.pi * k2 * s + p2))
    )
    return a[None, :] + s[:, None] * d[None, :] + wobble[:, None] * normal[None, :]


def _draw_roads(layers: Layers, roads: list[tuple[np.ndarray, float]], density: int) -> None:
    """Stamp all verges, then all cores, along polylines (points, width scale); over
    water a road is a bridge with planks across it. Houses and lamps are left alone."""
    for scale in sorted({s for _, s in roads}, reverse=True):
        for radius, is_core in ((_ROAD_EDGE * scale, False), (_ROAD_CORE * scale, True)):
            group = [pts for pts, s in roads if s == scale]
            anchors = np.rint(np.concatenate(group) * density).astype(np.int64)
            across_x = np.concatenate(
                [  # planks run across the road's main direction
                    np.full(len(p), abs(p[-1, 1] - p[0, 1]) >= abs(p[-1, 0] - p[0, 0]))
                    for p in group
                ]
            )
            idx = layers.stamp_index(anchors, disk(radius, density))
            along = np.broadcast_to(across_x[:, None], idx.shape).ravel()
            idx = idx.ravel()
            keep = ~np.isin(layers.mat.flat[idx], (ROOF, LAMP))
            idx, along = idx[keep], along[keep]
            n = layers.size
            ys, xs = idx // n, idx % n
            wet = layers.levels.flat[idx] < SEA_END
            if is_core:
                plank = (np.where(along, xs, ys) // max(1, density // 2)) % 2
                tone = np.where(wet, 6 + 5 * plank, 9 + (ys * 7 + xs * 13) % 3 - 1)
            else:
                tone = np.full(idx.shape, 2)
            layers.put(idx[~wet], ROAD, tone[~wet])
            layers.put(idx[wet], BRIDGE, tone[wet])


def draw_roads(
    rng: np.random.Generator,
    layers: Layers,
    villages: np.ndarray,
    houses: list[tuple[float, float, float, float, int]],
    height: np.ndarray,
    density: int,
) -> None:
    """Roads from each village to its two nearest neighbours, and paths to each door."""
    size = height.shape[0]
    edges: set[tuple[int, int]] = set()
    for i, v in enumerate(villages):
        dist = np.hypot(*wrap_delta(villages - v, size).T)
        dist[i] = np.inf
        for j in np.argsort(dist)[:2]:
            if np.isfinite(dist[j]):
                edges.add((min(i, int(j)), max(i, int(j))))
    roads: list[tuple[np.ndarray, float]] = []
    for i, j in sorted(edges):
        d = wrap_delta(villages[j] - villages[i], size)
        pts = _polyline(rng, villages[i], d, 0.25)
        cells = np.floor(pts).astype(int) % size
        if np.mean(height[cells[:, 0], cells[:, 1]] < SEA_END / N_LEVELS) <= 0.12:
            roads.append((pts, 1.0))  # no long causeways across the sea
    for cy, cx, h, _w, _v in houses:
        village = villages[np.argmin(np.hypot(*wrap_delta(villages - (cy, cx), size).T))]
        door = np.array([cy + h / 2 + 1.0, cx])
        roads.append((_polyline(rng, door, wrap_delta(village - door, size), 0.25), 0.7))
    if roads:
        _draw_roads(layers, roads, density)


def draw_houses(
    rng: np.random.Generator,
    layers: Layers,
    houses: list[tuple[float, float, float, float, int]],
    density: int,
) -> None:
    """Gabled roofs (lit and shaded halves, ridge, eaves, chimney), shadows, door lamps."""
    lamps = []
    for cy, cx, h, w, variant in houses:
        hh, ww = round(h * density), round(w * density)
        y0, x0 = round((cy - h / 2) * density), round((cx - w / 2) * density)
        ty, tx = np.meshgrid(np.arange(hh), np.arange(ww), indexing="ij")
        shadow_off = round(1.3 * density)
        sidx = layers.index(y0 + ty + shadow_off, x0 + tx + shadow_off)
        layers.darken(sidx, keep=~np.isin(layers.mat.flat[sidx], (ROOF, LAMP)))
        if ww >= hh:  # ridge runs along x: north half lit
            pos, mid = ty, hh / 2
        else:  # ridge runs along y: west half lit
            pos, mid = tx, ww / 2
        tone = np.where(pos < mid, 12, 5)
        tone = np.where(np.abs(pos + 0.5 - mid) < 0.6, 3, tone)
        cs = max(2, round(1.5 * density))
        chy, chx = (
            int(rng.integers(1, max(2, hh // 2 - cs))),
            int(rng.integers(1, max(2, ww - cs - 1))),
        )
        tone = np.where((ty >= chy) & (ty < chy + cs) & (tx >= chx) & (tx < chx + cs), 15, tone)
        edge = (ty == 0) | (tx == 0) | (ty == hh - 1) | (tx == ww - 1)
        tone = np.where(edge, 1, tone)
        layers.put(layers.index(y0 + ty, x0 + tx), ROOF, variant_val(variant, tone.ravel()))
        lamps.append((round((cy + h / 2 + 2.0) * density), round((cx + w / 4) * density)))
    if not lamps:
        return
    # A lamp beside each door, with a two-step glow on the bare ground around it.
    anchors = np.array(lamps, dtype=np.int64)
    for radius, mat in ((5.0, GLOW_FAR), (2.6, GLOW_NEAR)):
        idx = layers.stamp_index(anchors, disk(radius, density))
        layers.put(idx, mat, None, None, keep=layers.where(idx, (TERRAIN, GLOW_FAR)))
    lamp = rasterize(lambda y, x: ((np.abs(y) <= 0.8) & (np.abs(x) <= 0.8), y * 0), 1.0, density)
    layers.put(layers.stamp_index(anchors, lamp), LAMP, 8)


def _rock_shape(radius: float, phase: float) -> ShapeFn:
    def shape(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ang = np.arctan2(y, x)
        edge = radius * (1.0 + 0.18 * np.sin(3 * ang + phase) + 0.08 * np.sin(7 * ang + 2 * phase))
        rho = np.hypot(y, x)
        light = np.clip(0.5 - 0.5 * (x + y) / (1.4 * radius), 0.0, 1.0)
        return rho <= edge, 0.15 + 0.85 * light * (0.5 + 0.5 * (1 - rho / np.maximum(edge, 1e-6)))

    return shape


def draw_rocks(rng: np.random.Generator, layers: Layers, height: np.ndarray, density: int) -> None:
    """Boulders, most on uplands and bare rock, each with a small shadow."""
    size = height.shape[0]
    pos = rng.random((size * size // 150, 2)) * size
    lv = np.floor(height[pos[:, 0].astype(int), pos[:, 1].astype(int)] * N_LEVELS)
    accept = np.select(
        [lv < BEACH_END, lv < LOW_END, lv < UP_END, lv < ROCK_END], [0.0, 0.08, 0.5, 1.0], 0.35
    )
    pos = pos[rng.random(len(pos)) < accept]
    kinds = rng.integers(0, 6, size=len(pos))  # 3 sizes x 2 outlines
    for kind in range(6):
        radius = (0.8, 1.3, 1.9)[kind // 2]
        anchors = np.rint(pos[kinds == kind] * density).astype(np.int64)
        if not len(anchors):
            continue
        stamp = rasterize(_rock_shape(radius, 1.7 * kind), radius * 1.3, density)
        off = round((0.4 * radius + 0.4) * density)
        sidx = layers.stamp_index(anchors + off, stamp)
        layers.darken(sidx, keep=layers.where(sidx, (TERRAIN, FLOWER, ROAD)))
        idx = layers.stamp_index(anchors, stamp)
        keep = layers.where(idx, (TERRAIN, FLOWER), SEA_END)
        layers.put(idx, ROCK, np.broadcast_to(stamp.tone, idx.shape), keep=keep)


def draw_flowers(
    rng: np.random.Generator, layers: Layers, meadow: np.ndarray, density: int
) -> None:
    """One-unit specks in meadow patches (flowers in spring, tufts otherwise)."""
    size = meadow.shape[0]
    pos = rng.random((size * size // 10, 2)) * size
    m = meadow[pos[:, 0].astype(int), pos[:, 1].astype(int)]
    pos = pos[rng.random(len(pos)) < np.clip((m - 0.45) * 3.0, 0.0, 1.0)]
    anchors = np.floor(pos * density).astype(np.int64)
    dot = np.arange(density)
    dy, dx = np.meshgrid(dot, dot, indexing="ij")
    ys = anchors[:, 0:1] + dy.ravel()[None, :]
    xs = anchors[:, 1:2] + dx.ravel()[None, :]
    idx = layers.index(ys, xs).reshape(len(anchors), -1)
    variant = np.broadcast_to(rng.integers(0, 4, size=(len(anchors), 1)), idx.shape)
    keep = layers.where(idx, (TERRAIN,), BEACH_END, UP_END)
    layers.put(idx, FLOWER, variant_val(variant, 8), keep=keep)
