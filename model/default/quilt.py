"""The canvas's prior: ground codes for a place nobody has seen, quilted from a bank of code
maps of training worlds (issue 38, item 4).

The bank (``training/ground_bank.py`` builds it; ``model/default/weights/ground_bank.npz``)
holds, per look of the ground that codes carry (biome, vegetation, weather: time of day and
season are the decoder's), code maps of whole training worlds, each a torus of
``side`` x ``side`` codes. Filling a tile of the canvas (``Canvas.write``) copies a
``TILE`` x ``TILE`` window of one map: among ``candidates`` windows drawn at random, one of the
``keep`` whose surroundings agree best with what the canvas already holds around the tile (a
band of ``RING`` codes on each side, and any codes an observation wrote inside it), compared by
the codes' vectors (cosine). So a road or a shore that reaches the tile's edge goes on in it,
and unknown ground is one plausible ground of the scene, never the average of many.

Every draw comes from the session's canvas seed and the tile's key, so the same canvas, seed
and path give the same ground: a replay, a restored snapshot and a migrated session go on
with the ground they would have had.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from worldserve.model.default.canvas import CODE_UNITS, MISSING, TILE, Canvas
from worldserve.world.scene import SceneAttrs

BANK = Path(__file__).resolve().parent / "weights" / "ground_bank.npz"
RING = 2  # codes around a tile that a candidate must agree with
CANDIDATES = 512  # windows drawn per tile
KEEP = 32  # the drawn window is one of this many best (fewer: plain ground that agrees with anything wins)


def look_key(scene: SceneAttrs) -> str:
    """The bank's key for a scene: what the ground's codes depend on."""
    return f"{scene.biome}/{scene.vegetation}/{scene.weather}"


@dataclass(frozen=True)
class GroundBank:
    maps: dict[str, np.ndarray]  # look key -> (M, side, side) uint16 code maps, each a torus

    def __post_init__(self) -> None:
        if not self.maps:
            raise ValueError("a ground bank needs at least one look")
        for key, m in self.maps.items():
            if m.ndim != 3 or m.shape[1] != m.shape[2] or m.shape[1] < TILE + 2 * RING or m.dtype != np.uint16:
                raise ValueError(f"bank look {key!r} holds {m.shape} {m.dtype}, expected (M, side, side) uint16")

    def for_scene(self, scene: SceneAttrs) -> np.ndarray:
        """The maps of ``scene``'s look, or, where the bank lacks it, those of the same biome."""
        key = look_key(scene)
        if key in self.maps:
            return self.maps[key]
        near = sorted(k for k in self.maps if k.startswith(f"{scene.biome}/")) or sorted(self.maps)
        return self.maps[near[0]]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **{k.replace("/", "__"): v for k, v in self.maps.items()})

    @classmethod
    def load(cls, path: Path = BANK) -> GroundBank:
        with np.load(path) as z:
            return cls({k.replace("__", "/"): z[k].astype(np.uint16) for k in z.files})


def window_codes(maps: np.ndarray, picks: np.ndarray, size: int) -> np.ndarray:
    """(N, size, size) windows of ``maps`` (M, S, S) from ``picks`` (N, 3) = (map, y, x), wrapping."""
    s = maps.shape[1]
    r = np.arange(size)
    ys = (picks[:, 1, None] + r) % s  # (N, size)
    xs = (picks[:, 2, None] + r) % s
    return maps[picks[:, 0, None, None], ys[:, :, None], xs[:, None, :]]


def similarity(table: np.ndarray) -> np.ndarray:
    """(K, K) float32: the cosine between every two codes, from their unit vectors ``table``
    (K, D); ``fill_tile`` looks agreement up here instead of gathering vectors."""
    t = np.asarray(table, np.float32)
    return np.ascontiguousarray(t @ t.T)


def fill_tile(canvas: Canvas, key: tuple[int, int], maps: np.ndarray, sim: np.ndarray, seed: int) -> np.ndarray:
    """The codes the prior draws for tile ``key`` (TILE, TILE) uint16, agreeing with the
    canvas around it; ``sim`` (K, K) the codes' cosines (``similarity``), ``seed`` the canvas's."""
    size = TILE + 2 * RING
    top = ((key[0] * TILE - RING) * CODE_UNITS, (key[1] * TILE - RING) * CODE_UNITS)
    known_codes = canvas.crop(top, size * CODE_UNITS)  # (size, size), MISSING where unknown
    rng = np.random.default_rng([seed & 0xFFFFFFFF, key[0], key[1]])
    m, s = maps.shape[0], maps.shape[1]
    picks = np.stack([rng.integers(0, m, CANDIDATES), rng.integers(0, s, CANDIDATES), rng.integers(0, s, CANDIDATES)], 1)
    known = known_codes != MISSING
    if known.any():
        ki, kj = np.nonzero(known)
        cands = maps[picks[:, :1], (picks[:, 1:2] + ki) % s, (picks[:, 2:3] + kj) % s]  # (N, n_known)
        cost = -sim[cands, known_codes[known][None]].sum(1, dtype=np.float64)  # minus the summed cosine
        best = np.argsort(cost, kind="stable")[:KEEP]
        pick = picks[best[rng.integers(0, len(best))]]
    else:
        pick = picks[0]
    return window_codes(maps, pick[None], size)[0, RING : RING + TILE, RING : RING + TILE].astype(np.uint16)
