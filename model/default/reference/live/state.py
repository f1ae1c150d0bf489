"""A session's live state: what moves in its world, in world coordinates beside its ground codes.

    actors    kind, variant, place (y, x), heading; each plays a trajectory snippet of the
              bank (speed and turn per frame) and draws the next at its end (``SNIPPET``
              frames), the one of ``CHOICES`` draws whose first speed is nearest its own
    spawned   the tiles whose actors were sampled: a tile's are, once, when the canvas holds
              it whole (herds on land codes, boats on water codes, at the bank's rates)
    weather   a cloud field, a fog field and a wind of the bank, chosen by the seed; the
              fields drift with the wind, so the weather at a frame is the seed's and the
              frame count's alone

Every draw comes from a generator keyed by the seed and what is drawn for (a tile, an actor
and its count of snippets), never from a shared stream, so a restored, migrated or replayed
session goes on with the same draws. An actor moves only onto codes of its ground that the
canvas holds (else it turns back, as the world's do at a shore), and only within
``STEP_REACH`` world units of the view's centre; farther ones wait where they are. A session
holds at most ``MAX_ACTORS`` actors (48 bytes each): about a whole world's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from worldserve.model.default.reference.canvas.canvas import (
    CODE_UNITS,
    MISSING,
    TILE,
    TILE_UNITS,
    Canvas,
)
from worldserve.model.default.reference.live.bank import FIELD_PERIOD, SNIPPET, LiveBank
from worldserve.model.default.reference.live.channels import (
    BOAT,
    CLOUD,
    FOG,
    KINDS,
    STATE_CHANNELS,
    VARIANTS,
    VIEW_UNITS,
    actor_channels,
    field_view,
)
from worldserve.session.family_state import entry, pack_scalar, scalar

MAX_ACTORS = 2048
STEP_REACH = 160.0  # world units from the view's centre (per axis) within which actors move
CHOICES = 8  # snippet draws an actor picks its next from
WALKABLE = 0.5  # a code's share of an actor's ground at which the actor may stand on it
FAMILY = "default"
MAX_SEED = 2**63 - 1
_TILE_DRAW, _ACTOR_DRAW, _WEATHER_DRAW = 1, 2, 3  # what a generator is keyed for


@dataclass(slots=True)
class LiveState:
    seed: int
    frame: int = 0  # frames stepped since the session began
    next_uid: int = 0
    spawned: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int32))  # (M, 2) tile keys
    kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # (N,)
    variant: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    pos: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.float64))  # (N, 2) world (y, x)
    heading: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # radians, (sin, cos) = (dy, dx)
    snippet: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # its kind's snippet
    t: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # frame within it
    draws: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # snippets drawn so far
    uid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def copy(self) -> LiveState:
        return LiveState(**{f.name: (v.copy() if isinstance(v := getattr(self, f.name), np.ndarray) else v)
                            for f in fields(self)})

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for f in fields(self) if isinstance(v := getattr(self, f.name), np.ndarray))


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, *[k % 2**32 for k in key]])


# ---------------------------------------------------------------------------- ground


def _walkable(bank: LiveBank, kind: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per actor, whether the code under it (``MISSING``: not held) is its ground."""
    held = codes != MISSING
    c = np.where(held, codes, 0)
    share = np.where(kind == BOAT, bank.code_water[c], bank.code_land[c])
    return held & (share >= WALKABLE)


def _codes_at(canvas: Canvas, pos: np.ndarray) -> np.ndarray:
    """The canvas's codes under ``pos`` (N, 2) world units, ``MISSING`` where not held."""
    n = canvas.side * TILE
    cy = np.floor(pos[:, 0] / CODE_UNITS).astype(np.int64) % n
    cx = np.floor(pos[:, 1] / CODE_UNITS).astype(np.int64) % n
    out = np.full(len(pos), MISSING, np.int64)
    for i in range(len(pos)):
        tile = canvas.tiles.get((int(cy[i] // TILE), int(cx[i] // TILE)))
        if tile is not None:
            out[i] = tile[cy[i] % TILE, cx[i] % TILE]
    out[out == 0xFFFF] = MISSING
    return out


# ---------------------------------------------------------------------------- sampling


def spawn_tile(st: LiveState, bank: LiveBank, key: tuple[int, int], codes: np.ndarray) -> None:
    """Sample tile ``key``'s actors from its ground ``codes`` (TILE, TILE), once."""
    st.spawned = np.concatenate([st.spawned, np.asarray([key], np.int32)])
    rng = _rng(st.seed, _TILE_DRAW, *key)
    corner = np.asarray(key, np.float64) * TILE_UNITS
    cells = TILE_UNITS / TILE
    land = bank.code_land[codes] >= WALKABLE
    water = bank.code_water[codes] >= WALKABLE
    kinds, variants, places = [], [], []
    for _ in range(rng.poisson(bank.herd_rate * land.sum() * cells**2)):
        cy, cx = np.argwhere(land)[rng.integers(land.sum())]
        centre = corner + (np.array([cy, cx]) + rng.random(2)) * cells
        size = int(bank.herd_sizes[rng.integers(len(bank.herd_sizes))])
        members = centre + rng.normal(0, bank.herd_spread, (size, 2))
        local = np.floor((members - corner) / cells).astype(np.int64)
        inside = np.all((local >= 0) & (local < TILE), 1)
        ok = inside.copy()
        ok[inside] = land[local[inside, 0], local[inside, 1]]
        places.append(members[ok])
        kinds.append(np.zeros(int(ok.sum()), np.int32))
        variants.append(np.full(int(ok.sum()), rng.integers(VARIANTS), np.int32))
    n_boats = min(int(water.sum()), rng.poisson(bank.boat_rate * water.sum() * cells**2))
    if n_boats:
        at = np.argwhere(water)[rng.choice(int(water.sum()), n_boats, replace=False)]
        places.append(corner + (at + rng.random((n_boats, 2))) * cells)
        kinds.append(np.full(n_boats, BOAT, np.int32))
        variants.append(rng.integers(0, VARIANTS, n_boats).astype(np.int32))
    n = sum(len(k) for k in kinds)
    if n == 0 or len(st) + n > MAX_ACTORS:
        return
    kind = np.concatenate(kinds)
    snippet = np.array([rng.integers(len(bank.speed[k])) for k in kind], np.int32)
    st.kind = np.concatenate([st.kind, kind])
    st.variant = np.concatenate([st.variant, np.concatenate(variants)])
    st.pos = np.concatenate([st.pos, np.concatenate(places)])
    st.heading = np.concatenate([st.heading, rng.uniform(0, 2 * np.pi, n)])
    st.snippet = np.concatenate([st.snippet, snippet])
    st.t = np.concatenate([st.t, rng.integers(0, SNIPPET, n).astype(np.int32)])
    st.draws = np.concatenate([st.draws, np.zeros(n, np.int32)])
    st.uid = np.concatenate([st.uid, st.next_uid + np.arange(n, dtype=np.int64)])
    st.next_uid += n


def spawn_ready(st: LiveState, bank: LiveBank, canvas: Canvas, top_left: tuple[float, float]) -> None:
    """Sample the actors of the tiles the view at ``top_left`` overlaps that the canvas holds
    whole and that have none sampled yet."""
    done = {(int(a), int(b)) for a, b in st.spawned}
    for ty in canvas._span(top_left[0], VIEW_UNITS):
        for tx in canvas._span(top_left[1], VIEW_UNITS):
            tile = canvas.tiles.get((ty, tx))
            if (ty, tx) in done or tile is None or (tile == 0xFFFF).any():
                continue
            spawn_tile(st, bank, (ty, tx), tile.astype(np.int64))


# ---------------------------------------------------------------------------- dynamics


def step(st: LiveState, bank: LiveBank, canvas: Canvas, centre: tuple[float, float]) -> None:
    """One frame: the actors near ``centre`` (the view's, world units) play their snippets."""
    st.frame += 1
    m = canvas.map_size
    d = (st.pos - np.asarray(centre) + m / 2) % m - m / 2
    idx = np.nonzero(np.all(np.abs(d) <= STEP_REACH, 1))[0]
    if len(idx) == 0:
        return
    kind, snip, t = st.kind[idx], st.snippet[idx], st.t[idx]
    speed, turn = np.empty(len(idx)), np.empty(len(idx))
    for k in range(KINDS):
        sel = kind == k
        speed[sel] = bank.speed[k][snip[sel], t[sel]]
        turn[sel] = bank.turn[k][snip[sel], t[sel]]
    heading = st.heading[idx] + turn
    dest = (st.pos[idx] + speed[:, None] * np.stack([np.sin(heading), np.cos(heading)], 1)) % m
    ok = _walkable(bank, kind, _codes_at(canvas, dest))
    st.pos[idx] = np.where(ok[:, None], dest, st.pos[idx])
    st.heading[idx] = np.where(ok, heading, heading + np.pi) % (2 * np.pi)
    st.t[idx] = t + 1
    for i in idx[st.t[idx] >= SNIPPET]:  # the next snippet: of a few draws, the one that goes on at its speed
        st.draws[i] += 1
        k = int(st.kind[i])
        now = bank.speed[k][st.snippet[i], SNIPPET - 1]
        cand = _rng(st.seed, _ACTOR_DRAW, int(st.uid[i]), int(st.draws[i])).integers(len(bank.speed[k]), size=CHOICES)
        st.snippet[i] = cand[np.argmin(np.abs(bank.speed[k][cand, 0] - now))]
        st.t[i] = 0


# ---------------------------------------------------------------------------- weather and channels


def weather_of(seed: int, bank: LiveBank) -> tuple[int, int, np.ndarray]:
    """The session's cloud field, fog field and wind (2,), units a frame: the seed's."""
    rng = _rng(seed, _WEATHER_DRAW)
    cloud, fog = int(rng.integers(len(bank.clouds))), int(rng.integers(len(bank.fog)))
    return cloud, fog, bank.winds[rng.integers(len(bank.winds))]


def channels(st: LiveState, bank: LiveBank, weather: str, top_left: tuple[float, float], bucket: int,
             map_size: int) -> np.ndarray:
    """The live state's channels (STATE_CHANNELS, bucket, bucket) float32 of the view whose
    top-left is ``top_left`` (world units), under ``weather`` (the scene's)."""
    out = np.zeros((STATE_CHANNELS, bucket, bucket), np.float32)
    actor_channels(out, st.kind, st.variant, st.pos, st.heading, top_left, map_size)
    ci, fi, wind = weather_of(st.seed, bank)
    drift = (top_left[0] - float(wind[0]) * st.frame, top_left[1] - float(wind[1]) * st.frame)
    thr = bank.cloud_threshold.get(weather)
    if thr is not None:
        x = np.clip((field_view(bank.clouds[ci], drift, bucket, FIELD_PERIOD) / 255.0 - thr) / bank.cloud_soft, 0, 1)
        out[CLOUD] = x * x * (3 - 2 * x)
    if weather == "fog":
        off, gain, lo, hi = bank.fog_map
        out[FOG] = np.clip(off + gain * (field_view(bank.fog[fi], drift, bucket, FIELD_PERIOD) / 255.0 - 0.5), lo, hi)
    return out


# ---------------------------------------------------------------------------- family state

_ARRAYS = {  # entry -> (field, dtype, trailing shape)
    "live_spawned": ("spawned", "int32", (2,)),
    "live_kind": ("kind", "int32", ()),
    "live_variant": ("variant", "int32", ()),
    "live_pos": ("pos", "float64", (2,)),
    "live_heading": ("heading", "float64", ()),
    "live_snippet": ("snippet", "int32", ()),
    "live_t": ("t", "int32", ()),
    "live_draws": ("draws", "int32", ()),
    "live_uid": ("uid", "int64", ()),
}


def to_entries(st: LiveState) -> dict[str, np.ndarray]:
    out = {name: np.ascontiguousarray(getattr(st, f), dtype) for name, (f, dtype, _) in _ARRAYS.items()}
    out["live_seed"], out["live_frame"] = pack_scalar(st.seed), pack_scalar(st.frame)
    out["live_next_uid"] = pack_scalar(st.next_uid)
    return out


def from_entries(state: Mapping[str, np.ndarray], bank: LiveBank) -> LiveState | None:
    """The live state a family state holds, None where it holds none; ValueError naming the
    entry where one is malformed or out of the bank's range."""
    if "live_kind" not in state:
        return None
    n = entry(state, "live_kind", "int32", (None,), family=FAMILY).shape[0]  # type: ignore[union-attr]
    if n > MAX_ACTORS:
        raise ValueError(f"{FAMILY}.live_kind: {n} actors, over {MAX_ACTORS}")
    kw: dict[str, object] = {}
    for name, (f, dtype, tail) in _ARRAYS.items():
        rows = None if name == "live_spawned" else n
        kw[f] = entry(state, name, dtype, (rows, *tail), family=FAMILY).copy()  # type: ignore[union-attr]
    kind, snippet, t = kw["kind"], kw["snippet"], kw["t"]
    assert isinstance(kind, np.ndarray) and isinstance(snippet, np.ndarray) and isinstance(t, np.ndarray)
    if n and (kind.min() < 0 or kind.max() >= KINDS or t.min() < 0 or t.max() >= SNIPPET
              or any(snippet[kind == k].max(initial=0) >= len(bank.speed[k]) for k in range(KINDS))):
        raise ValueError(f"{FAMILY}.live_kind/live_snippet/live_t: out of the bank's range")
    return LiveState(seed=scalar(state, "live_seed", 0, MAX_SEED, family=FAMILY),
                     frame=scalar(state, "live_frame", 0, MAX_SEED, family=FAMILY),
                     next_uid=scalar(state, "live_next_uid", 0, MAX_SEED, family=FAMILY),
                     **kw)  # type: ignore[arg-type]
