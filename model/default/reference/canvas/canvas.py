"""A session's world canvas: ground codes in world coordinates, written once (issue 38, item 4).

The canvas remembers the place: each code (``model/default/reference/canvas/tokenizer.py``) stands for
CODE_UNITS x CODE_UNITS world units, kept in square tiles of TILE x TILE codes keyed by tile
coordinates on the world's torus. A tile is written once, when the camera first needs it
(filled by the prior ahead of the camera, ``model/default/reference/canvas/quilt.py``, or by the tokenizer's
encoding of an observation, which may cover parts of tiles and replaces what it shows),
and never redrawn by the prior: ground cannot drift, and returning to a place shows the same place. Tiles
farther than ``radius`` world units from the camera are evicted, so a session's canvas holds at
most ``max_tiles`` tiles (``TILE``² codes of 2 bytes each, 512 bytes a tile) however far it
travels.

    world units   0        64       128      192  ...   (map_size, wrapping)
                  +--------+--------+--------+
    tile (0, 0)   | 16x16  | (0, 1) | (0, 2) |          one code per 4x4 units
                  | codes  |        |        |
                  +--------+--------+--------+
                  | (1, 0) |  ...

Snapshots carry it as two arrays (``to_arrays``): tile keys (N, 2) int32 and codes
(N, TILE, TILE) uint16, N tiles in key order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CODE_UNITS = 4  # world units a code covers, per side
TILE = 16  # codes per tile side: 64 world units, a view's width
TILE_UNITS = TILE * CODE_UNITS
MISSING = -1  # a code the canvas does not hold (``crop``)
EMPTY = 0xFFFF  # a code not written yet, inside a tile that holds others (an observation's edge)


@dataclass(slots=True)
class Canvas:
    map_size: int  # world units per side of the torus (a multiple of TILE_UNITS)
    radius: float  # tiles whose centre lies farther than this from the camera are evicted (world units)
    tiles: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (ty, tx) -> (TILE, TILE) uint16
    # counts the changes that can leave a tile not whole (one made by ``paste``, evictions):
    # a painter that found tiles whole need not look again until it moves
    changes: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.map_size <= 0 or self.map_size % TILE_UNITS:
            raise ValueError(f"map_size {self.map_size} must be a positive multiple of {TILE_UNITS}")
        if self.radius < TILE_UNITS:
            raise ValueError(f"radius {self.radius} must be at least a tile ({TILE_UNITS} units)")

    @property
    def side(self) -> int:
        """Tiles per side of the torus."""
        return self.map_size // TILE_UNITS

    @property
    def max_tiles(self) -> int:
        """The most tiles the canvas holds after an eviction: those whose centre lies within
        ``radius`` (on each axis) of a camera anywhere."""
        per_axis = min(self.side, 2 * math.ceil(self.radius / TILE_UNITS) + 1)
        return per_axis * per_axis

    def needed(self, top_left: tuple[float, float], size: float) -> list[tuple[int, int]]:
        """The tiles a square of ``size`` world units from ``top_left`` (y, x) overlaps that the
        canvas does not hold whole yet, row by row."""
        out = []
        for ty in self._span(top_left[0], size):
            for tx in self._span(top_left[1], size):
                tile = self.tiles.get((ty, tx))
                if tile is None or (tile == EMPTY).any():
                    out.append((ty, tx))
        return out

    def write(self, key: tuple[int, int], codes: np.ndarray) -> None:
        """Fill tile ``key``'s empty codes from ``codes`` (TILE, TILE); codes already written stay
        (the ground stays). Writing a tile that holds no empty code is refused."""
        if codes.shape != (TILE, TILE):
            raise ValueError(f"tile codes have shape {codes.shape}, expected {(TILE, TILE)}")
        ty, tx = key
        if not (0 <= ty < self.side and 0 <= tx < self.side):
            raise ValueError(f"tile {key} lies outside the {self.side}x{self.side} tiles of the torus")
        held = self.tiles.get(key)
        if held is None:
            self.tiles[key] = np.asarray(codes, np.uint16).copy()
            return
        empty = held == EMPTY
        if not empty.any():
            raise ValueError(f"tile {key} is already written")
        held[empty] = np.asarray(codes, np.uint16)[empty]

    def paste(self, top_left: tuple[float, float], codes: np.ndarray) -> None:
        """Write ``codes`` (h, w) from ``top_left`` (y, x) world units, snapped to the code grid,
        over what the canvas holds there: what an observation shows of a place replaces what
        the prior guessed. ``MISSING`` codes are skipped."""
        cy, cx = (math.floor(t / CODE_UNITS) for t in top_left)
        n = self.side * TILE
        for i, j in zip(*np.nonzero(codes != MISSING), strict=True):
            y, x = (cy + int(i)) % n, (cx + int(j)) % n
            tile = self.tiles.get((y // TILE, x // TILE))
            if tile is None:
                tile = self.tiles[(y // TILE, x // TILE)] = np.full((TILE, TILE), EMPTY, np.uint16)
                self.changes += 1
            tile[y % TILE, x % TILE] = codes[i, j]

    def crop(self, top_left: tuple[float, float], size: float) -> np.ndarray:
        """The codes covering a square of ``size`` world units from ``top_left`` (y, x), snapped
        to the code grid: (ceil(size / CODE_UNITS),)² int64, ``MISSING`` where no tile is held."""
        n = math.ceil(size / CODE_UNITS)
        cy, cx = (math.floor(t / CODE_UNITS) for t in top_left)
        ys = (cy + np.arange(n)) % (self.side * TILE)  # code rows on the torus
        xs = (cx + np.arange(n)) % (self.side * TILE)
        out = np.full((n, n), MISSING, np.int64)
        for ty in np.unique(ys // TILE):
            for tx in np.unique(xs // TILE):
                tile = self.tiles.get((int(ty), int(tx)))
                if tile is None:
                    continue
                rows, cols = np.nonzero(ys // TILE == ty)[0], np.nonzero(xs // TILE == tx)[0]
                out[np.ix_(rows, cols)] = tile[np.ix_(ys[rows] % TILE, xs[cols] % TILE)]
        out[out == EMPTY] = MISSING
        return out

    def evict(self, center: tuple[float, float]) -> int:
        """Drop the tiles whose centre lies farther than ``radius`` from ``center`` (y, x) on
        either axis (torus distance); returns how many. None can be, where ``radius`` reaches
        half the torus: then this costs nothing (it runs after every chunk)."""
        if self.radius >= self.map_size / 2:
            return 0
        far = [k for k in self.tiles if max(self._distance(k, center)) > self.radius]
        for k in far:
            del self.tiles[k]
        self.changes += len(far)
        return len(far)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys (N, 2) int32, codes (N, TILE, TILE) uint16), tiles in key order."""
        keys = sorted(self.tiles)
        codes = np.stack([self.tiles[k] for k in keys]) if keys else np.zeros((0, TILE, TILE), np.uint16)
        return np.asarray(keys, np.int32).reshape(-1, 2), codes

    @classmethod
    def from_arrays(cls, map_size: int, radius: float, keys: np.ndarray, codes: np.ndarray) -> Canvas:
        canvas = cls(map_size, radius)
        if keys.shape != (len(codes), 2):
            raise ValueError(f"canvas keys {keys.shape} do not match codes {codes.shape}")
        for k, c in zip(keys.tolist(), codes, strict=True):
            key = (int(k[0]), int(k[1]))
            if key in canvas.tiles:
                raise ValueError(f"canvas tile {key} is listed twice")
            canvas.write(key, c)
        return canvas

    def _span(self, start: float, size: float) -> list[int]:
        first = math.floor(start / TILE_UNITS)
        last = math.floor((start + size - 1e-9) / TILE_UNITS)
        return [t % self.side for t in range(first, last + 1)]

    def _distance(self, key: tuple[int, int], center: tuple[float, float]) -> tuple[float, float]:
        """Per axis, the torus distance from tile ``key``'s centre to ``center``."""
        out = []
        for t, c in zip(key, center, strict=True):
            d = abs((t + 0.5) * TILE_UNITS - c) % self.map_size
            out.append(min(d, self.map_size - d))
        return out[0], out[1]
