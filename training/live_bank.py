"""Build the live state's bank from training worlds: ``model/default/weights/live_bank.npz``.

    python -m training.live_bank            # a few minutes on one thread

Serving's live state (``model/default/reference/live/``) samples what moves from this bank
as the ground's prior samples codes from the ground bank; nothing of it is written by hand:

- ``code_land``, ``code_water`` (1024,): for each ground code, the share of the world units
  under it where an animal may stand / a boat may float, over views of the ground alone of
  training worlds encoded as the canvas encodes them (64 px, one code per 4x4 units);
- ``herd_rate`` herds per unit² of walkable land, ``herd_sizes`` a sample of herd sizes and
  ``herd_spread`` the members' spread (world units) around their herd's centre, from the
  worlds' actors at their start (herds found as groups of animals within ``LINK`` units);
  ``boat_rate`` boats per unit² of navigable water;
- ``<kind>_speed``, ``<kind>_turn`` (S, SNIPPET): trajectory snippets of the worlds' actors,
  per frame the speed and the change of heading, a shore's turn-around cut out (the live
  state turns back at its own shores);
- ``clouds``, ``fog`` (F, P, P) uint8: the worlds' cloud and fog fields (one texel per
  ``FIELD_UNITS`` units, tiling ``FIELD_PERIOD`` units), ``winds`` (W, 2) their drift, units a
  frame; ``cloud_weathers`` with ``cloud_threshold`` and ``cloud_soft``: the cover each
  weather makes of the field; ``fog_map`` (4,): offset, gain, floor and ceiling of the fog's
  density from its field.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS as TOKENIZER
from worldserve.model.default.reference.canvas.tokenizer import load_tokenizer
from worldserve.model.default.reference.live.bank import BANK, FIELD_UNITS, SNIPPET
from worldserve.training.data import TRAIN_SEED_BASE
from worldserve.world import World, sample_scene
from worldserve.world.actors import ANIMAL, BOAT
from worldserve.world.atmosphere import _CLOUDS

SEED_BASE = TRAIN_SEED_BASE + 3_000_000  # apart from the seeds training and the ground bank draw
LINK = 12.0  # world units: animals nearer than this belong to one herd
CODES = 1024


def _herds(pos: np.ndarray, map_size: int) -> list[np.ndarray]:
    """Groups of animal positions linked within LINK units (single linkage)."""
    n = len(pos)
    parent = np.arange(n)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    d = np.abs(pos[:, None] - pos[None])
    d = np.minimum(d, map_size - d)
    close = np.hypot(d[..., 0], d[..., 1]) < LINK
    for i, j in zip(*np.nonzero(np.triu(close, 1)), strict=True):
        parent[root(int(i))] = root(int(j))
    roots = np.array([root(i) for i in range(n)])
    return [pos[roots == r] for r in np.unique(roots)]


def _snippets(world: World, frames: int) -> dict[int, tuple[list[np.ndarray], list[np.ndarray]]]:
    """Per kind, lists of speed and turn rows of SNIPPET frames from the world's actors."""
    world.reset()
    for _ in range(30):  # past the start's own state
        world.step(np.zeros(6, np.float32))
    kind = world.state.actors.kind
    speeds, heads = [], []
    for _ in range(frames):
        world.step(np.zeros(6, np.float32))
        a = world.state.actors
        speeds.append(a.speed.copy())
        heads.append(a.heading.copy())
    speed = np.stack(speeds, 1)  # (N, T)
    turn = np.diff(np.stack(heads, 1), axis=1, prepend=np.stack(heads, 1)[:, :1])
    turn = (turn + np.pi) % (2 * np.pi) - np.pi
    out: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {ANIMAL: ([], []), BOAT: ([], [])}
    for i in range(len(kind)):
        for s in range(0, frames - SNIPPET + 1, SNIPPET):
            sp, tu = speed[i, s : s + SNIPPET], turn[i, s : s + SNIPPET]
            if np.abs(tu).max() > 2.5:  # a shore's turn-around: not the actor's own choice
                continue
            out[int(kind[i])][0].append(sp)
            out[int(kind[i])][1].append(tu)
    return out


def build(worlds: int, views: int, snippet_frames: int, out: Path, seed: int = 0) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    tok = load_tokenizer(TOKENIZER).float().eval()
    land_sum, water_sum, count = np.zeros(CODES), np.zeros(CODES), np.zeros(CODES)
    herd_count = boat_count = 0
    land_area = water_area = 0.0
    sizes: list[int] = []
    spreads: list[float] = []
    snips: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {ANIMAL: ([], []), BOAT: ([], [])}
    clouds, fogs, winds = [], [], []
    for w in range(worlds):
        world = World(SEED_BASE + w, sample_scene(rng), (64,))
        lay, m = world.layout, world.map_size
        # ground codes against where animals may stand and boats may float
        grounds, places = [], []
        for _ in range(views):
            world.reset(world.random_position(rng, max_water=0.9))
            grounds.append(world.render_ground(64))
            places.append(world.position)
        x = torch.from_numpy(np.stack(grounds)).permute(0, 3, 1, 2).float() / 127.5 - 1
        with torch.no_grad():
            ids = tok.encode(x).numpy()  # (V, 16, 16)
        for v, (cy, cx) in enumerate(places):
            rows = (int(np.floor(cy - 32)) + np.arange(64)) % m
            cols = (int(np.floor(cx - 32)) + np.arange(64)) % m
            land = lay.walk_land[np.ix_(rows, cols)].reshape(16, 4, 16, 4).mean((1, 3))
            water = lay.walk_water[np.ix_(rows, cols)].reshape(16, 4, 16, 4).mean((1, 3))
            np.add.at(land_sum, ids[v].ravel(), land.ravel())
            np.add.at(water_sum, ids[v].ravel(), water.ravel())
            np.add.at(count, ids[v].ravel(), 1)
        # actors at the start: density and herds
        world.reset()
        a = world.state.actors
        herds = _herds(a.pos[a.kind == ANIMAL], m)
        herd_count += len(herds)
        boat_count += int((a.kind == BOAT).sum())
        land_area += float(lay.walk_land.sum())
        water_area += float(lay.walk_water.sum())
        for h in herds:
            sizes.append(len(h))
            if len(h) > 1:
                spreads.append(float(np.sqrt(((h - h.mean(0)) ** 2).sum(1).mean() / 2)))
        for k, (sp, tu) in _snippets(world, snippet_frames).items():
            snips[k][0].extend(sp)
            snips[k][1].extend(tu)
        step = FIELD_UNITS
        clouds.append(np.round(lay.clouds[::step, ::step] * 255).astype(np.uint8))
        fogs.append(np.round(lay.fog[::step, ::step] * 255).astype(np.uint8))
        winds.append(np.asarray(lay.wind, np.float32))
        print(f"world {w + 1}/{worlds}: {len(herds)} herds, {boat_count} boats so far, "
              f"{len(snips[ANIMAL][0])} / {len(snips[BOAT][0])} snippets", flush=True)
    cap = 512
    bank: dict[str, np.ndarray] = {
        "code_land": (land_sum / np.maximum(count, 1)).astype(np.float32),
        "code_water": (water_sum / np.maximum(count, 1)).astype(np.float32),
        "code_seen": count.astype(np.int32),
        "herd_rate": np.float64(herd_count / max(land_area, 1.0)),
        "boat_rate": np.float64(boat_count / max(water_area, 1.0)),
        "herd_sizes": np.asarray(sizes, np.int16),
        "herd_spread": np.float64(np.median(spreads) if spreads else 5.0),
        "clouds": np.stack(clouds),
        "fog": np.stack(fogs),
        "winds": np.stack(winds),
        "cloud_weathers": np.array(sorted(_CLOUDS)),
        "cloud_threshold": np.array([_CLOUDS[k][0] for k in sorted(_CLOUDS)], np.float32),
        "cloud_soft": np.float32(0.14),
        "fog_map": np.array([0.42, 0.6, 0.1, 0.85], np.float32),
    }
    for k, name in ((ANIMAL, "animal"), (BOAT, "boat")):
        sp, tu = np.asarray(snips[k][0], np.float32), np.asarray(snips[k][1], np.float32)
        pick = rng.permutation(len(sp))[:cap]
        bank[f"{name}_speed"], bank[f"{name}_turn"] = sp[pick], tu[pick]
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **bank)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB): herd_rate {bank['herd_rate']:.2e}, "
          f"boat_rate {bank['boat_rate']:.2e}, herds of {np.mean(sizes):.1f}, spread {bank['herd_spread']:.1f}",
          flush=True)
    return bank


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the live state's bank from training worlds.")
    ap.add_argument("--worlds", type=int, default=12)
    ap.add_argument("--views", type=int, default=48, help="ground views encoded per world")
    ap.add_argument("--snippet-frames", type=int, default=2 * SNIPPET, help="frames of actors recorded per world")
    ap.add_argument("--out", type=Path, default=BANK)
    args = ap.parse_args(argv)
    build(args.worlds, args.views, args.snippet_frames, args.out)


if __name__ == "__main__":
    main()
