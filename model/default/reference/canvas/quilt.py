"""The canvas's prior: ground codes for a place nobody has seen, quilted from a bank of code
maps of training worlds (issue 38, item 4).

The bank (``training/ground_bank.py`` builds it; ``model/default/weights/ground_bank.npz``)
holds, per look of the ground that codes carry (biome, vegetation, weather: time of day is the
decoder's) and per season (``bank_key``), code maps of whole training worlds, each a torus of
``side`` x ``side`` codes. Filling a tile of the canvas (``Canvas.write``) copies a
``TILE`` x ``TILE`` window of one map: among ``candidates`` windows drawn at random, one of the
``keep`` whose surroundings agree best with what the canvas already holds around the tile (a
band of ``RING`` codes on each side, and any codes an observation wrote inside it), compared by
the codes' vectors (cosine). Unknown ground is one plausible ground of the scene, never the
average of many. A tile the prior copied is found in the bank again (``SourceIndex``), and
the tile beside it goes on with the ground that lay beside it there wherever that agrees with
the canvas around it at least as well as every window drawn: a road or a shore that reaches
a tile's edge runs on into the next.

Every draw comes from the session's canvas seed and the tile's key, so the same canvas, seed
and path give the same ground: a replay, a restored snapshot and a migrated session go on
with the ground they would have had.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worldserve.model.default import WEIGHTS_DIR
from worldserve.model.default.reference.canvas.canvas import (
    CODE_UNITS,
    EMPTY,
    MISSING,
    TILE,
    Canvas,
)
from worldserve.world.scene import SceneAttrs

BANK = WEIGHTS_DIR / "ground_bank.npz"
RING = 2  # codes around a tile that a candidate must agree with
CANDIDATES = 512  # windows drawn per tile
KEEP = 32  # the drawn window is one of this many best (fewer: plain ground that agrees with anything wins)
SOURCES = 8  # places in the bank a written tile may continue from (uniform ground matches thousands)


def look_key(scene: SceneAttrs) -> str:
    """What a scene's ground codes carry: a prompt that changes it starts a canvas anew
    (``GroundPainter.rescene``); time of day and season the decoder re-skins."""
    return f"{scene.biome}/{scene.vegetation}/{scene.weather}"


def bank_key(scene: SceneAttrs) -> str:
    """The bank's key for a scene: its look and season. The decoder re-skins a summer
    canopy's codes poorly under spring or autumn (``training/ground_bank.py``), so new ground
    is drawn from maps of the season's own codes."""
    return f"{look_key(scene)}/{scene.season}"


@dataclass(frozen=True)
class GroundBank:
    maps: dict[str, np.ndarray]  # bank key (or look key alone) -> (M, side, side) uint16 code maps, each a torus
    _sources: dict[int, SourceIndex] = field(default_factory=dict, compare=False, repr=False)  # by id of maps

    def __post_init__(self) -> None:
        if not self.maps:
            raise ValueError("a ground bank needs at least one look")
        for key, m in self.maps.items():
            if m.ndim != 3 or m.shape[1] != m.shape[2] or m.shape[1] < TILE + 2 * RING or m.dtype != np.uint16:
                raise ValueError(f"bank look {key!r} holds {m.shape} {m.dtype}, expected (M, side, side) uint16")

    def for_scene(self, scene: SceneAttrs) -> np.ndarray:
        """The maps of ``scene``'s look and season; where the bank lacks them, of its look (a
        bank keyed by look alone), else of the same biome."""
        for key in (bank_key(scene), look_key(scene)):
            if key in self.maps:
                return self.maps[key]
        near = sorted(k for k in self.maps if k.startswith(f"{scene.biome}/")) or sorted(self.maps)
        return self.maps[near[0]]

    def sources(self, scene: SceneAttrs) -> SourceIndex:
        """Where in ``for_scene``'s maps each tile-sized window lies (made once per look)."""
        maps = self.for_scene(scene)
        if id(maps) not in self._sources:  # looks that share maps share their index
            self._sources[id(maps)] = SourceIndex.of(maps)
        return self._sources[id(maps)]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **{k.replace("/", "__"): v for k, v in self.maps.items()})

    @classmethod
    def load(cls, path: Path = BANK) -> GroundBank:
        with np.load(path) as z:
            return cls({k.replace("__", "/"): z[k].astype(np.uint16) for k in z.files})


_ROWS = np.random.default_rng(0x51).integers(1, 2**63, TILE, dtype=np.uint64) | np.uint64(1)
_COLS = np.random.default_rng(0x52).integers(1, 2**63, TILE, dtype=np.uint64) | np.uint64(1)


def _window_hashes(maps: np.ndarray) -> np.ndarray:
    """(M, S, S) uint64: a hash of the TILE x TILE window (wrapping) whose top-left is each
    place of ``maps``, the same as ``_tile_hash`` of its codes."""
    with np.errstate(over="ignore"):
        c = maps.astype(np.uint64)
        rows = sum((np.roll(c, -j, 2) * _COLS[j] for j in range(TILE)), np.zeros_like(c))
        return sum((np.roll(rows, -i, 1) * _ROWS[i] for i in range(TILE)), np.zeros_like(c))


def _tile_hash(tile: np.ndarray) -> np.uint64:
    with np.errstate(over="ignore"):
        return np.uint64((_ROWS * (tile.astype(np.uint64) * _COLS[None]).sum(1, dtype=np.uint64)).sum(dtype=np.uint64))


@dataclass(frozen=True)
class SourceIndex:
    """Every tile-sized window of one look's maps by the hash of its codes: a tile the prior
    copied from the bank is found there again, so the tile beside it can go on with the
    ground that lay beside it in the bank (a road goes on past the tile's edge)."""

    maps: np.ndarray  # (M, S, S)
    hashes: np.ndarray  # (M*S*S,) sorted
    places: np.ndarray  # (M*S*S,) the flat place of each, in ``maps``

    @classmethod
    def of(cls, maps: np.ndarray) -> SourceIndex:
        h = _window_hashes(maps).ravel()
        order = np.argsort(h, kind="stable")
        return cls(maps, h[order], order)

    def find(self, tile: np.ndarray, limit: int = SOURCES) -> np.ndarray:
        """(N, 3) (map, y, x): up to ``limit`` places whose window holds exactly ``tile``
        (TILE, TILE), in the maps' order."""
        h = _tile_hash(tile)
        lo, hi = np.searchsorted(self.hashes, h, "left"), np.searchsorted(self.hashes, h, "right")
        flat = np.sort(self.places[lo:hi])
        m, s = self.maps.shape[0], self.maps.shape[1]
        picks = np.stack(np.unravel_index(flat, (m, s, s)), 1)
        if len(picks):
            same = (window_codes(self.maps, picks, TILE) == tile[None]).all((1, 2))
            picks = picks[same]
        return picks[:limit]


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


def continuations(canvas: Canvas, key: tuple[int, int], index: SourceIndex) -> np.ndarray:
    """(N, 3) window picks (``fill_tile``'s: the tile's top-left less ``RING``) that go on
    from where each whole tile beside ``key`` (above, left, below, right) lies in the bank."""
    s, out = index.maps.shape[1], []
    for dy, dx in ((-1, 0), (0, -1), (1, 0), (0, 1)):
        tile = canvas.tiles.get(((key[0] + dy) % canvas.side, (key[1] + dx) % canvas.side))
        if tile is None or (tile == EMPTY).any():
            continue
        for m, y, x in index.find(tile):
            out.append((m, (y - dy * TILE - RING) % s, (x - dx * TILE - RING) % s))
    return np.array(list(dict.fromkeys(out)), np.int64).reshape(-1, 3)


def fill_tile(canvas: Canvas, key: tuple[int, int], maps: np.ndarray, sim: np.ndarray, seed: int,
              index: SourceIndex | None = None) -> np.ndarray:
    """The codes the prior draws for tile ``key`` (TILE, TILE) uint16, agreeing with the
    canvas around it; ``sim`` (K, K) the codes' cosines (``similarity``), ``seed`` the canvas's.
    With ``index`` (``maps``'s ``SourceIndex``), a tile beside one the prior copied from the
    bank goes on with what lay beside that one there, where that agrees with the canvas at
    least as well as every window drawn (two neighbours that came from different places
    rarely both agree: there the tile is drawn as without ``index``)."""
    size = TILE + 2 * RING
    top = ((key[0] * TILE - RING) * CODE_UNITS, (key[1] * TILE - RING) * CODE_UNITS)
    known_codes = canvas.crop(top, size * CODE_UNITS)  # (size, size), MISSING where unknown
    rng = np.random.default_rng([seed & 0xFFFFFFFF, key[0], key[1]])
    m, s = maps.shape[0], maps.shape[1]
    picks = np.stack(
        [rng.integers(0, m, CANDIDATES), rng.integers(0, s, CANDIDATES), rng.integers(0, s, CANDIDATES)], 1)
    known = known_codes != MISSING
    if known.any():
        ongoing = continuations(canvas, key, index) if index is not None else picks[:0]
        ki, kj = np.nonzero(known)
        every = np.concatenate((picks, ongoing))
        cands = maps[every[:, :1], (every[:, 1:2] + ki) % s, (every[:, 2:3] + kj) % s]  # (N, n_known)
        cost = -sim[cands, known_codes[known][None]].sum(1, dtype=np.float64)  # minus the summed cosine
        best = np.argsort(cost, kind="stable")[:KEEP]
        pick = every[best[rng.integers(0, len(best))]]
        if len(ongoing):
            own = len(picks) + int(np.argmin(cost[len(picks):]))
            if cost[own] <= cost[best[0]]:
                pick = every[own]
    else:
        pick = picks[0]
    return window_codes(maps, pick[None], size)[0, RING : RING + TILE, RING : RING + TILE].astype(np.uint16)
