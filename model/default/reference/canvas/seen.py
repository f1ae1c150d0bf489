"""The pixels an observation showed, kept where they lie on a session's canvas (issue 38).

An observation (a client's ``observation``, or the first frame a session starts on) is encoded
into ground codes, which the prior goes on from; the codes' decode is softer than the frame
and loses what the tokenizer cannot spell (a canopy's colours, roofs, a village's lanes). So
the frame itself is kept too, per canvas tile, at the canvas's one pixel a world unit: colours
and a weight, 1 inside the observed square, falling to 0 over its outer ``FEATHER`` pixels so
that the frame fades into the decode of its own codes (the same place, softer) before the
prior's ground begins. ``compose`` lays them over the decoded raster the reference is sampled
from: where a session starts, its first frames are the frame it was given.

Stored as uint8 (4, TILE_UNITS, TILE_UNITS) a tile (colours, weight in 255ths): 16 KB; an
observation touches at most four tiles. A later observation lies over an earlier one. A
scene change drops them (they show the old look; the codes re-skin the place).
"""

from __future__ import annotations

import numpy as np
import torch

from worldserve.model.default.reference.canvas.canvas import TILE_UNITS

FEATHER = 8  # pixels at the observed square's edges over which its weight falls to 0

Seen = dict[tuple[int, int], np.ndarray]  # tile -> (4, TILE_UNITS, TILE_UNITS) uint8: colours, weight


def feathered(h: int, w: int, feather: int = FEATHER) -> np.ndarray:
    """(h, w) float32 weights: 1 inside, down to 1 / (feather + 1) at each edge's outer pixel."""
    def ramp(n: int) -> np.ndarray:
        i = np.arange(n, dtype=np.float32)
        return np.clip((np.minimum(i, n - 1 - i) + 1) / (feather + 1), 0, 1)
    return ramp(h)[:, None] * ramp(w)[None]


def paste(seen: Seen, first: tuple[int, int], rgb: np.ndarray, weight: np.ndarray, side: int) -> None:
    """Lay ``rgb`` (3, h, w) uint8 with ``weight`` (h, w) float in [0, 1] over ``seen`` from
    whole world unit ``first`` (y, x), tiles wrapping on a torus of ``side`` tiles."""
    _, h, w = rgb.shape
    n = side * TILE_UNITS
    ys, xs = (first[0] + np.arange(h)) % n, (first[1] + np.arange(w)) % n
    for ty in np.unique(ys // TILE_UNITS):
        for tx in np.unique(xs // TILE_UNITS):
            key = (int(ty), int(tx))
            rows, cols = np.nonzero(ys // TILE_UNITS == ty)[0], np.nonzero(xs // TILE_UNITS == tx)[0]
            held = seen.get(key)
            if held is None:
                held = seen[key] = np.zeros((4, TILE_UNITS, TILE_UNITS), np.uint8)
            at = np.ix_(ys[rows] % TILE_UNITS, xs[cols] % TILE_UNITS)
            old_c = held[:3][(slice(None), *at)].astype(np.float32)
            old_w = held[3][at].astype(np.float32) / 255
            new_c = rgb[:, rows][:, :, cols].astype(np.float32)
            new_w = weight[np.ix_(rows, cols)].astype(np.float32)
            total = new_w + old_w * (1 - new_w)
            colour = (new_c * new_w + old_c * old_w * (1 - new_w)) / np.maximum(total, 1e-6)
            held[:3][(slice(None), *at)] = np.clip(np.rint(colour), 0, 255).astype(np.uint8)
            held[3][at] = np.clip(np.rint(total * 255), 0, 255).astype(np.uint8)


def compose(raster: torch.Tensor, seen: Seen, ty: int, tx: int, side: int) -> torch.Tensor:
    """``raster`` (3, 2 TILE_UNITS, 2 TILE_UNITS) in [-1, 1], the decoded 2 x 2 tiles from tile
    (``ty``, ``tx``), with the seen pixels of those tiles laid over it by their weights."""
    keys = [[((ty + i) % side, (tx + j) % side) for j in (0, 1)] for i in (0, 1)]
    if not any(k in seen for row in keys for k in row):
        return raster
    blank = np.zeros((4, TILE_UNITS, TILE_UNITS), np.uint8)
    layer = np.concatenate([np.concatenate([seen.get(k, blank) for k in row], 2) for row in keys], 1)
    t = torch.from_numpy(layer).to(raster.device, torch.float32)
    colour, weight = t[:3] / 127.5 - 1, t[3:] / 255
    return raster + weight * (colour - raster)


def to_arrays(seen: Seen) -> tuple[np.ndarray, np.ndarray]:
    """(keys (M, 2) int32, pixels (M, 4, TILE_UNITS, TILE_UNITS) uint8), tiles in key order."""
    keys = sorted(seen)
    px = np.stack([seen[k] for k in keys]) if keys else np.zeros((0, 4, TILE_UNITS, TILE_UNITS), np.uint8)
    return np.asarray(keys, np.int32).reshape(-1, 2), px


def from_arrays(keys: np.ndarray, pixels: np.ndarray, side: int) -> Seen:
    if keys.shape != (len(pixels), 2) or pixels.shape[1:] != (4, TILE_UNITS, TILE_UNITS) or pixels.dtype != np.uint8:
        raise ValueError(f"seen pixels {pixels.shape} {pixels.dtype} do not match keys {keys.shape}: "
                         f"expected (M, 4, {TILE_UNITS}, {TILE_UNITS}) uint8 and (M, 2)")
    out: Seen = {}
    for k, px in zip(keys.tolist(), pixels, strict=True):
        key = (int(k[0]), int(k[1]))
        if not (0 <= key[0] < side and 0 <= key[1] < side) or key in out:
            raise ValueError(f"seen tile {key} lies off the {side}x{side} torus or is listed twice")
        out[key] = px.copy()
    return out
