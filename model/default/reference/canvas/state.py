"""A session's world canvas as it travels: ``CanvasState`` and its entries in the default
family's state (``ModelState.family_state``, session/family_state.py).

Entries: ``canvas_keys`` int32 (N, 2) tile keys, ``canvas_codes`` uint16 (N, TILE, TILE)
ground codes (``EMPTY`` where none is written yet), ``canvas_position`` float64 (2,) the view's
top-left in world units, ``canvas_seed`` the prior's; where observations were kept,
``canvas_seen_keys`` int32 (M, 2) and ``canvas_seen`` uint8 (M, 4, SEEN_SIDE, SEEN_SIDE), the
pixels they showed per tile (colours, then a weight in 255ths; ``seen.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from worldserve.model.default.reference.canvas.canvas import TILE, TILE_UNITS
from worldserve.session.family_state import entry, pack_scalar, scalar

MAX_TILES = 1024  # more than a canvas keeps (canvas.py: the torus's 256 tiles)
SEEN_SIDE = TILE_UNITS  # a seen tile's pixels per side: one a world unit
FAMILY = "default"
MAX_SEED = 2**63 - 1


@dataclass(slots=True)
class CanvasState:
    """A canvas's codes, the view's place, the prior's seed and the pixels observations showed."""

    keys: np.ndarray
    codes: np.ndarray
    position: np.ndarray
    seed: int
    seen_keys: np.ndarray | None = None
    seen: np.ndarray | None = None


def to_entries(st: CanvasState) -> dict[str, np.ndarray]:
    out = {
        "canvas_keys": np.asarray(st.keys, np.int32),
        "canvas_codes": np.asarray(st.codes, np.uint16),
        "canvas_position": np.asarray(st.position, np.float64),
        "canvas_seed": pack_scalar(st.seed),
    }
    if st.seen is not None and st.seen_keys is not None:
        out["canvas_seen_keys"] = np.asarray(st.seen_keys, np.int32)
        out["canvas_seen"] = np.asarray(st.seen, np.uint8)
    return out


def from_entries(state: Mapping[str, np.ndarray]) -> CanvasState | None:
    """The canvas a family state holds, None where it holds none; ValueError naming the entry
    where one is malformed."""
    if "canvas_codes" not in state:
        return None
    codes = entry(state, "canvas_codes", "uint16", (None, TILE, TILE), family=FAMILY)
    assert codes is not None
    n = codes.shape[0]
    keys = entry(state, "canvas_keys", "int32", (n, 2), family=FAMILY)
    assert keys is not None
    if n > MAX_TILES:
        raise ValueError(f"{FAMILY}.canvas_codes: {n} tiles, over {MAX_TILES}")
    if len({(int(a), int(b)) for a, b in keys}) != n:
        raise ValueError(f"{FAMILY}.canvas_keys: a tile is listed twice")
    position = entry(state, "canvas_position", "float64", (2,), family=FAMILY)
    assert position is not None
    seen_keys = entry(state, "canvas_seen_keys", "int32", (None, 2), optional=True, family=FAMILY)
    seen = None
    if seen_keys is not None:
        m = seen_keys.shape[0]
        seen = entry(state, "canvas_seen", "uint8", (m, 4, SEEN_SIDE, SEEN_SIDE), family=FAMILY)
        if m > MAX_TILES or len({(int(a), int(b)) for a, b in seen_keys}) != m:
            raise ValueError(f"{FAMILY}.canvas_seen_keys: {m} tiles, over {MAX_TILES} or one listed twice")
    return CanvasState(keys=keys, codes=codes, position=position,
                       seed=scalar(state, "canvas_seed", 0, MAX_SEED, family=FAMILY),
                       seen_keys=seen_keys, seen=seen)
