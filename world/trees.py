"""Tree sites of a seed, and how a scene grows trees on them.

The seed fixes a jittered grid of candidate sites (every ~4.5 units) with a forest
density, a rank, a radius and a colour variant per site. The scene's vegetation level
turns density into a probability of growing: a site grows when ``rank < p(density)``,
and p rises with the level, so denser scenes are supersets of sparser ones and the
place stays recognisable. The biome picks the crown shape: round broadleaf crowns
(grassland), snowy pines (snow), shrubs and the odd palm (desert), palms and broadleaf
(tropical). Shadows fall to the lower right, like every shadow in the world.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .layers import FLOWER, TERRAIN, TREE, Layers, ShapeFn, Stamp, rasterize, variant_val
from .terrain import BEACH_END, ROCK_END

_SPACING = 4.5  # world units between candidate sites
_RADII = (1.8, 2.2, 2.6, 3.0, 3.4)  # crown radius buckets, world units
_N_ROT = 3  # outline variants per radius
ROUND, PINE, SHRUB, PALM = range(4)

# Growth probability per vegetation level: base + gain * smoothstep over [lo, lo + 0.2].
_GROWTH = MappingProxyType(
    {"sparse": (0.01, 0.45, 0.72), "moderate": (0.04, 0.9, 0.55), "dense": (0.12, 0.88, 0.36)}
)


@dataclass(frozen=True, slots=True, eq=False)
class TreeSites:
    pos: np.ndarray  # (S, 2) float64 world units (y, x)
    forest: np.ndarray  # (S,) float32 forest density in [0, 1]
    rank: np.ndarray  # (S,) float32 uniform in [0, 1)
    size: np.ndarray  # (S,) int radius bucket index into _RADII
    rot: np.ndarray  # (S,) int outline variant
    variant: np.ndarray  # (S,) int colour variant in [0, 4)


def plan_sites(
    rng: np.random.Generator, layers: Layers, forest: np.ndarray, density: int
) -> TreeSites:
    """Candidate sites on dry land whose crown would not cover houses, roads or fields."""
    size = forest.shape[0]
    n = int(size / _SPACING)
    gy, gx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    pos = (np.stack([gy.ravel(), gx.ravel()], 1) + rng.uniform(0.1, 0.9, (n * n, 2))) * (size / n)
    f = forest[pos[:, 0].astype(int), pos[:, 1].astype(int)]
    size_idx = np.clip((f * 4 + rng.uniform(-1.2, 1.2, len(f))).round(), 0, len(_RADII) - 1)
    radius = np.asarray(_RADII)[size_idx.astype(int)]
    ok = np.ones(len(pos), dtype=bool)
    for oy, ox in ((0, 0), (0.8, 0), (-0.8, 0), (0, 0.8), (0, -0.8)):
        probe = np.rint((pos + np.stack([oy * radius, ox * radius], 1)) * density).astype(int)
        idx = layers.index(probe[:, 0], probe[:, 1])
        ok &= layers.where(idx, (TERRAIN, FLOWER), BEACH_END, ROCK_END)
    keep = np.flatnonzero(ok)
    return TreeSites(
        pos=pos[keep],
        forest=f[keep].astype(np.float32),
        rank=rng.random(len(keep), dtype=np.float32),
        size=size_idx[keep].astype(np.int64),
        rot=rng.integers(0, _N_ROT, len(keep)),
        variant=rng.integers(0, 4, len(keep)),
    )


def growing(sites: TreeSites, vegetation: str) -> np.ndarray:
    """Indices of the sites that grow at this vegetation level."""
    base, gain, lo = _GROWTH[vegetation]
    t = np.clip((sites.forest - lo) / 0.2, 0.0, 1.0)
    p = base + gain * t * t * (3 - 2 * t)
    return np.flatnonzero(sites.rank < p)


def crown_kind(biome: str, variant: np.ndarray) -> np.ndarray:
    """Crown shape per tree for a biome (variants 0-3 pick within the biome's mix)."""
    table = {
        "grassland": (ROUND, ROUND, ROUND, ROUND),
        "snow": (PINE, PINE, PINE, PINE),
        "desert": (SHRUB, SHRUB, SHRUB, PALM),
        "tropical": (PALM, PALM, ROUND, ROUND),
    }[biome]
    return np.asarray(table)[variant]


def crown_shape(kind: int, radius: float, phase: float) -> ShapeFn:
    """Top-down crown outline and tone (highlight to the upper left, darker rim)."""

    def shape(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rho = np.hypot(y, x)
        ang = np.arctan2(y, x)
        light = np.clip(0.5 - 0.5 * (x + y) / (1.3 * radius), 0.0, 1.0)
        if kind == PINE:
            edge = radius * (0.78 + 0.22 * np.abs(np.cos(4 * ang + phase)))
            ring = (rho / radius * 3.0 + 0.3 * np.cos(8 * ang)) % 1.0
            tone = np.where((ring < 0.35) & (light > 0.3), 1.0, 0.15 + 0.45 * light)
        elif kind == PALM:
            sector = (ang - phase) % (2 * np.pi / 6) - np.pi / 6
            half_width = 0.32 * radius * np.sqrt(np.clip(1 - rho / radius, 0, 1)) + 0.15
            frond = np.abs(rho * np.sin(sector)) < half_width
            edge = np.where(frond | (rho < 0.3 * radius), radius, 0.0)
            tone = 0.25 + 0.55 * light + 0.2 * (np.abs(sector) < 0.12)
        elif kind == SHRUB:
            edge = 0.7 * radius * (0.85 + 0.15 * np.abs(np.sin(6 * ang + phase)))
            tone = 0.2 + 0.6 * light + 0.2 * ((rho / radius * 4) % 1.0 < 0.3)
        else:  # ROUND broadleaf: lumpy outline, lobes of sub-crowns
            edge = radius * (
                1.0 + 0.1 * np.sin(5 * ang + phase) + 0.05 * np.sin(9 * ang + 2 * phase)
            )
            lobes = 0.5 + 0.5 * np.cos(3.0 * x / radius * 2.2 + phase) * np.cos(
                3.0 * y / radius * 2.2
            )
            tone = (
                0.12
                + 0.6 * light * (0.55 + 0.45 * (1 - rho / np.maximum(edge, 1e-6)))
                + 0.2 * lobes
            )
        return rho <= edge, np.clip(tone, 0.0, 1.0)

    return shape


def grow_trees(layers: Layers, sites: TreeSites, biome: str, vegetation: str, density: int) -> None:
    """Stamp the growing trees (shadows first, then crowns, north to south) into layers."""
    chosen = growing(sites, vegetation)
    chosen = chosen[np.argsort(sites.pos[chosen, 0], kind="stable")]
    kinds = crown_kind(biome, sites.variant[chosen])
    groups: list[tuple[np.ndarray, np.ndarray, Stamp]] = []
    key = (kinds * len(_RADII) + sites.size[chosen]) * _N_ROT + sites.rot[chosen]
    for k in np.unique(key):
        members = chosen[key == k]
        kind, rest = divmod(int(k), len(_RADII) * _N_ROT)
        size_idx, rot = divmod(rest, _N_ROT)
        radius = _RADII[size_idx] * (0.8 if kind == SHRUB else 1.0)
        stamp = rasterize(crown_shape(kind, radius, 2.1 * rot + 0.4), radius * 1.4, density)
        anchors = np.rint(sites.pos[members] * density).astype(np.int64)
        groups.append((anchors, sites.variant[members], stamp))
        off = round((0.35 * radius + 0.8) * density)
        layers.darken(layers.stamp_index(anchors + off, stamp))
    for anchors, variant, stamp in groups:
        idx = layers.stamp_index(anchors, stamp)
        layers.put(idx, TREE, variant_val(variant[:, None], stamp.tone[None, :]))
